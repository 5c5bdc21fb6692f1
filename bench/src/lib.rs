//! Benchmark binaries live in `src/bin/`.
#![forbid(unsafe_code)]
