//! The suites. Each module is one concern and exposes `cases::<B>()`.
//!
//! * [`matrix`] — every op × variant × dtype × reduce op × world size, exact and random inputs.
//! * [`subgroup`] — the matrix's core ops on reversed / halves / odd-even / partial subgroups.
//! * [`seed`] — PyTorch's `test_c10d_functional_native.py` and eager `test_inductor_collectives.py`.
//! * [`async_wait`] — completion, wait semantics, registry, lag, un-waited exit, threads.
//! * [`async_ops`] — issue at once / pending / wait deadline on every op, each rank late in turn;
//!   the barrier synchronises.
//! * [`p2p`] — messages in flight in order, beyond a ring's size, receive before send.
//! * [`numerics`] — exact rounding: nearest-even ties, subnormals, premul_sum factors.
//! * [`reuse`] — guard bytes, persistent buffers, late writes, aliasing.
//! * [`bad_input`] — 30+ bad inputs, each a named error on every rank, then a usable world.
//! * [`caps`] — declared capabilities (NaN policy, integer avg, aliasing, gaps) vs observed behaviour.

pub mod async_ops;
pub mod async_wait;
pub mod bad_input;
pub mod caps;
pub mod matrix;
pub mod numerics;
pub mod p2p;
pub mod reuse;
pub mod seed;
pub mod subgroup;
pub mod util;

/// World sizes of the matrix.
pub const WORLD_SIZES: [usize; 6] = [1, 2, 3, 4, 5, 8];
