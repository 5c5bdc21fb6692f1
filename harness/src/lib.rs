//! concord-harness (placeholder until the harness lands)
