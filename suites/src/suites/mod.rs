//! The suites. Each module is one concern and exposes `cases::<B>()`.
//!
//! * [`matrix`] — every op × variant × dtype × reduce op × world size, exact and random inputs;
//!   permutations other than the rotation, longer all_reduces in the narrow-shape dtypes, moves
//!   of arbitrary bit patterns.
//! * [`subgroup`] — the matrix's core ops, the rooted and p2p ops and every reduce op on reversed /
//!   halves / odd-even / partial subgroups.
//! * [`seed`] — PyTorch's `test_c10d_functional_native.py` and eager `test_inductor_collectives.py`.
//! * [`async_wait`] — completion (also without wait), wait semantics (`wait(0)` polls), registry,
//!   lag, un-waited exit, threads.
//! * [`async_ops`] — issue at once / pending / wait deadline on every op, each rank late in turn;
//!   the barrier synchronises.
//! * [`p2p`] — messages in flight in order, beyond a ring's size, receive before send.
//! * [`numerics`] — exact rounding: nearest-even ties, subnormals, premul_sum factors.
//! * [`reuse`] — guard bytes, persistent buffers, late writes, aliasing, results kept across calls.
//! * [`bad_input`] — 30+ bad inputs, each a named error on every rank, then a usable world.
//! * [`bad_input_grid`] — every (op, variant) × bad-input kind × carrier (every rank, rank 0, a
//!   middle rank, the last rank; the root first and last) at 1, 2, 3 and 16 ranks, each refusal
//!   followed by a valid call of the same (op, variant).
//! * [`caps`] — declared capabilities (NaN policy, integer avg, aliasing, gaps) vs observed behaviour.
//! * [`views`] — inputs and `_out` / recv outputs as views at non-zero offsets; parents untouched.
//! * [`sizes`] — a size ladder per op up to 64 MiB, every element checked.
//! * [`all_to_all_equal`] — equal-split (`None`) all_to_all on multi-dimensional tensors.
//! * [`device_faults`] — failure paths under injected faults (stalled stream, stuck enqueue, local
//!   failure after begin, a rank stalling / failing around its header): backends declaring hooks.
//! * [`faults`] — failure paths through the backend's fault-injection hooks: no buffer touched
//!   after a failed wait, named errors, no leaked file, usable after bad input.
//! * [`p2p_fail`] — point-to-point failure paths (cases named `faults::late_sender::*` and
//!   `faults::late_receiver::*`): a send or receive whose peer comes after the op deadline fails,
//!   is not left posted, and is never matched by the late peer.
//! * [`fused`] — fused communication + compute (seed 004): all-gather-matmul, matmul-reduce-scatter,
//!   scaled variants, low-contention all-gather / reduce-scatter; values, buffers, bad input.
//! * [`programs`] — seeded random programs: any declared op / variant / dtype / reduce op, random
//!   shapes, roots, permutations, views, up to three calls in flight on the world and subgroups.
//! * [`realloc`] — buffers freed and re-allocated between collectives (same address, new size / dtype).
//! * [`state`] — state over time: hundreds of ops on one communicator, refused and dropped
//!   ops by the hundred, views of one parent, reduce ops on one shape, a group remade.
//! * [`identical`] — every all_reduce variant × size class × world size from 3, on inputs whose
//!   sum depends on the order: every rank's result the same bits (compared through the store).
//! * [`wild_gpu`] — bugs that shipped in GPU collective libraries and passed the rest: a
//!   one-rank kernel's unwritten tail.
//! * [`wild_groups`] — cases for shipped bugs of splitting, subgroups and point-to-point that the
//!   rest let through (a group made from a subgroup).
//! * [`wild_layout`] — cases for shipped bugs of memory layout and sizes that the rest let
//!   through (an empty output at an empty input's address).
//! * [`wild_custom`] — cases for shipped bugs of custom collective kernels and symmetric-memory
//!   paths outside NCCL that the rest let through (a large message's tail past `16 * ws` bytes,
//!   one buffer all-reduced again and again as a graph replays it).
//! * [`wild_state`] — cases for shipped bugs of caches and state carried across calls that the
//!   rest let through (all_gathers of shapes equal once padded to four dims, of another rank).
//!
//! The matrix also runs at world sizes 6, 7 and 16 on a sparser slice ([`SPARSE_WORLD_SIZES`]), and
//! its exact inputs at 8 in f32 only, the other dtypes in its dtype grid ([`matrix::THINNED_WS`]);
//! [`subgroup`] runs every reduce op defined for f32 / i32 in every layout.

pub mod all_to_all_equal;
pub mod async_ops;
pub mod async_wait;
pub mod bad_input;
pub mod bad_input_grid;
pub mod caps;
pub mod device_faults;
pub mod faults;
pub mod fused;
pub mod identical;
pub mod matrix;
pub mod numerics;
pub mod p2p;
pub mod p2p_fail;
pub mod programs;
pub mod realloc;
pub mod reuse;
pub mod seed;
pub mod sizes;
pub mod state;
pub mod subgroup;
pub mod util;
pub mod views;
pub mod wild_custom;
pub mod wild_gpu;
pub mod wild_groups;
pub mod wild_layout;
pub mod wild_state;

/// World sizes of the matrix (whole catalogue; at [`matrix::THINNED_WS`] the exact inputs in f32
/// only, the other dtypes in the dtype grid) and of the subgroups.
pub const WORLD_SIZES: [usize; 6] = [1, 2, 3, 4, 5, 8];

/// World sizes the matrix runs on a sparser slice (see [`matrix::sparse_specs`]): f32, i32 and
/// bf16 (at 16: f32, and bf16 `sum` out-of-place), every (op, variant) and reduce op, the first
/// [`matrix::SPARSE_SHAPES`] shapes of the catalogue. 6 and 7 (not a power of two, even and prime) and 16, the larger world; a case above
/// the backend's declared `max_world_size` is UNSUPPORTED with the reason.
pub const SPARSE_WORLD_SIZES: [usize; 3] = [6, 7, 16];
