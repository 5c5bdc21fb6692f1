//! Bad input: each case gives the backend one broken collective and requires THE named
//! `bad_input:<kind>` error that the core rule table (`concord_core::call`, one precedence for
//! every backend and the oracle) gives it, on EVERY rank within the deadline — no hang, no
//! silent truncation — then checks the world still computes a correct all_reduce (and, after a
//! refused send / recv, that the pair still exchanges a message).

use super::util::{expect_eq, fail, full, supported_all_reduce, ArVehicle};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, BadInputKind as K, CollectiveError, DType, ReduceOp, Tensor, Work};
use std::time::Duration;

/// Issues the bad call (given the backend, its rank and world size) and waits for it.
type Issue<B> = fn(&B, usize, usize) -> Result<(), CollectiveError>;

fn wait<T>(w: Work<T>, t: Duration) -> Result<(), CollectiveError> {
    w.wait(t).map(|_| ())
}

fn f32s<B: Backend>(b: &B, shape: &[usize]) -> Result<B::Buffer, CollectiveError> {
    b.upload(&full(shape, 1.0f32))
}

const T: Duration = Duration::from_secs(10);

/// (name, world size, the one kind every rank must report, needs cross-rank validation, the bad call)
fn table<B: Backend>() -> Vec<(&'static str, usize, K, bool, Issue<B>)> {
    vec![
        ("all_reduce_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| wait(b.all_reduce(&f32s(b, &[4 + r])?, ReduceOp::Sum)?, T)),
        // An empty tensor against a non-empty one: a backend that returns at once on zero elements
        // (nothing to reduce) never compares the shapes, and the non-empty rank waits forever.
        ("all_reduce_shape_mismatch_one_empty", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.all_reduce(&f32s(b, &[4 * r])?, ReduceOp::Sum)?, T)
        }),
        ("all_reduce_dtype_mismatch", 2, K::DTypeMismatch, true, |b, r, _| {
            let x = if r == 0 { f32s(b, &[4])? } else { b.upload(&full(&[4], 1.0f64))? };
            wait(b.all_reduce(&x, ReduceOp::Sum)?, T)
        }),
        ("all_reduce_reduce_op_mismatch", 2, K::ReduceOpMismatch, true, |b, r, _| {
            wait(b.all_reduce(&f32s(b, &[4])?, if r == 0 { ReduceOp::Sum } else { ReduceOp::Max })?, T)
        }),
        // `avg` against `sum`: a backend that emulates avg as a sum and a local division (Gloo's
        // and MPI's c10d, intel/torch-xpu-ops PR #2691) tells its peers `sum`, so only a check
        // of the op each rank asked for refuses it; the max-against-sum row above does not tell.
        ("all_reduce_avg_against_sum", 2, K::ReduceOpMismatch, true, |b, r, _| {
            wait(b.all_reduce(&f32s(b, &[4])?, if r == 0 { ReduceOp::Avg } else { ReduceOp::Sum })?, T)
        }),
        ("reduce_scatter_avg_against_sum", 2, K::ReduceOpMismatch, true, |b, r, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[4])?, if r == 1 { ReduceOp::Avg } else { ReduceOp::Sum })?, T)
        }),
        ("all_reduce_premul_sum_factor_mismatch", 2, K::ReduceOpMismatch, true, |b, r, _| {
            // Rule 16: premul_sum's factor is part of the op (NCCL would sum each rank's own
            // f_r * x_r; the contract makes differing factors bad input).
            wait(b.all_reduce(&f32s(b, &[4])?, ReduceOp::PremulSum(if r == 0 { 2.0 } else { 0.5 }))?, T)
        }),
        // Rule 16 off all_reduce (review10 finding 1: FSDP2's gradient reduce-scatter with NCCL's
        // per-rank pre-multiplication): the middle rank of three names 0.5, the others 2.0.
        ("reduce_scatter_premul_sum_factor_mismatch", 3, K::ReduceOpMismatch, true, |b, r, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[6])?, ReduceOp::PremulSum(if r == 1 { 0.5 } else { 2.0 }))?, T)
        }),
        ("reduce_scatter_out_premul_sum_factor_mismatch", 3, K::ReduceOpMismatch, true, |b, r, _| {
            let out = b.alloc(DType::F32, &[2])?;
            wait(b.reduce_scatter_tensor_out(&f32s(b, &[6])?, ReduceOp::PremulSum(if r == 1 { 0.5 } else { 2.0 }), &out)?, T)
        }),
        ("reduce_scatter_coalesced_premul_sum_factor_mismatch", 3, K::ReduceOpMismatch, true, |b, r, _| {
            let xs = [f32s(b, &[6])?];
            wait(b.reduce_scatter_tensor_coalesced(&xs, ReduceOp::PremulSum(if r == 1 { 0.5 } else { 2.0 }))?, T)
        }),
        ("reduce_premul_sum_factor_mismatch", 3, K::ReduceOpMismatch, true, |b, r, _| {
            wait(b.reduce(&f32s(b, &[4])?, ReduceOp::PremulSum(if r == 1 { 0.5 } else { 2.0 }), 0)?, T)
        }),
        ("all_reduce_coalesced_premul_sum_factor_mismatch", 3, K::ReduceOpMismatch, true, |b, r, _| {
            let xs = [f32s(b, &[3])?, f32s(b, &[4])?];
            wait(b.all_reduce_coalesced(&xs, ReduceOp::PremulSum(if r == 1 { 0.5 } else { 2.0 }))?, T)
        }),
        ("op_mismatch_all_reduce_vs_broadcast", 2, K::OpMismatch, true, |b, r, _| {
            let x = f32s(b, &[4])?;
            if r == 0 {
                // Any reduce op will do (the row breaks the op, not the reduction): one the
                // backend supports, decided from the declaration alone, so every rank agrees.
                let op = supported_all_reduce(b, &[concord_core::Variant::Out], &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min])
                    .unwrap_or(ReduceOp::Sum);
                wait(b.all_reduce(&x, op)?, T)
            } else {
                wait(b.broadcast(&x, 0)?, T)
            }
        }),
        ("all_reduce_coalesced_count_mismatch", 2, K::CountMismatch, true, |b, r, _| {
            let xs: Vec<_> = (0..2 + r).map(|_| f32s(b, &[3])).collect::<Result<_, _>>()?;
            wait(b.all_reduce_coalesced(&xs, ReduceOp::Sum)?, T)
        }),
        // Shapes that differ tensor by tensor with the first tensor and the list's total equal: a
        // backend that validates one flat bucket (or `xs[0]` and the count) passes it.
        ("all_reduce_coalesced_one_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| {
            let xs = vec![f32s(b, &[2])?, f32s(b, &[3 + r])?, f32s(b, &[4 - r])?];
            wait(b.all_reduce_coalesced(&xs, ReduceOp::Sum)?, T)
        }),
        ("all_reduce_bitwise_on_float", 2, K::UnsupportedDType, false, |b, _, _| wait(b.all_reduce(&f32s(b, &[4])?, ReduceOp::BAnd)?, T)),
        ("all_reduce_premul_sum_on_int", 2, K::UnsupportedDType, false, |b, _, _| {
            wait(b.all_reduce(&b.upload(&full(&[4], 1i32))?, ReduceOp::PremulSum(2.0))?, T)
        }),
        // The same two rules off all_reduce: a reduce op is checked against the dtype by every
        // reducing call (a kernel picked by element width runs a bitwise op on float bits; a
        // premul_sum lowered to a local scale and a sum takes integers).
        ("reduce_scatter_bitwise_on_float", 2, K::UnsupportedDType, false, |b, _, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[4])?, ReduceOp::BOr)?, T)
        }),
        ("reduce_bitwise_on_float", 2, K::UnsupportedDType, false, |b, _, _| wait(b.reduce(&f32s(b, &[4])?, ReduceOp::BXor, 0)?, T)),
        ("reduce_scatter_premul_sum_on_int", 2, K::UnsupportedDType, false, |b, _, _| {
            wait(b.reduce_scatter_tensor(&b.upload(&full(&[4], 1i32))?, ReduceOp::PremulSum(2.0))?, T)
        }),
        ("all_reduce_coalesced_premul_sum_on_int", 2, K::UnsupportedDType, false, |b, _, _| {
            let xs = vec![b.upload(&full(&[3], 1i32))?, b.upload(&full(&[3], 2i32))?];
            wait(b.all_reduce_coalesced(&xs, ReduceOp::PremulSum(2.0))?, T)
        }),
        ("reduce_premul_sum_on_int", 2, K::UnsupportedDType, false, |b, _, _| {
            wait(b.reduce(&b.upload(&full(&[4], 1i32))?, ReduceOp::PremulSum(2.0), 0)?, T)
        }),
        ("all_gather_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| wait(b.all_gather_into_tensor(&f32s(b, &[4 + r])?)?, T)),
        // Empty tensors of different shapes (`[1, 0]` against `[2, 0]`): a same-size check by
        // element count passes them (pytorch/pytorch PR #84099: "numel() returns zero and
        // check_same_numel is always true"), so each rank gets a result shaped by its own input.
        ("all_gather_shape_mismatch_both_empty", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.all_gather_into_tensor(&f32s(b, &[1 + r, 0])?)?, T)
        }),
        ("reduce_scatter_shape_mismatch_both_empty", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[2 + 2 * r, 0])?, ReduceOp::Sum)?, T)
        }),
        ("all_gather_out_wrong_size", 2, K::OutBufferSize, false, |b, _, ws| {
            let out = b.alloc(DType::F32, &[ws * 4 + 1])?;
            wait(b.all_gather_into_tensor_out(&f32s(b, &[4])?, &out)?, T)
        }),
        ("all_gather_out_wrong_dtype", 2, K::DTypeMismatch, false, |b, _, ws| {
            let out = b.alloc(DType::F64, &[ws * 4])?;
            wait(b.all_gather_into_tensor_out(&f32s(b, &[4])?, &out)?, T)
        }),
        // One rank alone holds a wrong-sized output: only it can tell locally; its peers MUST
        // get the same named error (never a wait for a side that never comes).
        ("all_gather_out_wrong_size_on_one_rank", 2, K::OutBufferSize, true, |b, r, ws| {
            let out = b.alloc(DType::F32, &[ws * 4 + r])?;
            wait(b.all_gather_into_tensor_out(&f32s(b, &[4])?, &out)?, T)
        }),
        ("reduce_scatter_indivisible_ws2", 2, K::Indivisible, false, |b, _, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[5])?, ReduceOp::Sum)?, T)
        }),
        ("reduce_scatter_indivisible_ws3", 3, K::Indivisible, false, |b, _, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[4, 2])?, ReduceOp::Sum)?, T)
        }),
        ("reduce_scatter_zero_dim", 2, K::ZeroDim, false, |b, _, _| wait(b.reduce_scatter_tensor(&f32s(b, &[])?, ReduceOp::Sum)?, T)),
        ("reduce_scatter_out_wrong_size", 2, K::OutBufferSize, false, |b, _, _| {
            let out = b.alloc(DType::F32, &[3])?;
            wait(b.reduce_scatter_tensor_out(&f32s(b, &[4])?, ReduceOp::Sum, &out)?, T)
        }),
        // all_gather's `_out` dtype check has a sibling here: a backend that checks the size
        // only casts the result into the caller's buffer.
        ("reduce_scatter_out_wrong_dtype", 2, K::DTypeMismatch, false, |b, _, _| {
            let out = b.alloc(DType::F64, &[2])?;
            wait(b.reduce_scatter_tensor_out(&f32s(b, &[4])?, ReduceOp::Sum, &out)?, T)
        }),
        ("reduce_scatter_out_wrong_size_on_one_rank", 2, K::OutBufferSize, true, |b, r, _| {
            let out = b.alloc(DType::F32, &[2 + r])?;
            wait(b.reduce_scatter_tensor_out(&f32s(b, &[4])?, ReduceOp::Sum, &out)?, T)
        }),
        ("reduce_scatter_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.reduce_scatter_tensor(&f32s(b, &[4, 1 + r])?, ReduceOp::Sum)?, T)
        }),
        ("reduce_scatter_coalesced_indivisible", 2, K::Indivisible, false, |b, _, _| {
            let xs = vec![f32s(b, &[4])?, f32s(b, &[3])?];
            wait(b.reduce_scatter_tensor_coalesced(&xs, ReduceOp::Sum)?, T)
        }),
        ("all_to_all_splits_do_not_sum_to_dim0", 2, K::BadSplits, false, |b, _, _| {
            wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[2, 2]), Some(&[1, 2]))?, T)
        }),
        // Splits that agree across ranks but sum short of dim 0: a check of the sum as an upper
        // bound only (meta-pytorch/torchcomms PR #291: "Tensors are allowed to be larger than
        // the split sizes sum") sends the first rows and drops the rest, silently.
        ("all_to_all_splits_short_of_dim0", 2, K::BadSplits, false, |b, _, _| {
            wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[1, 1]), Some(&[1, 1]))?, T)
        }),
        ("all_to_all_splits_wrong_length", 2, K::BadSplits, false, |b, _, _| {
            wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[2, 2]), Some(&[2, 1, 1]))?, T)
        }),
        // The output list one entry too long (its extra entry 0): a plan that zips the peers
        // with the list cuts it silently.
        ("all_to_all_output_splits_wrong_length", 2, K::BadSplits, false, |b, _, _| {
            wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[2, 2, 0]), Some(&[2, 2]))?, T)
        }),
        ("all_to_all_output_split_disagrees_with_peer", 2, K::SplitMismatch, true, |b, r, _| {
            // Rank 0 sends 1 row to rank 1; rank 1 expects 3 rows from rank 0.
            if r == 0 {
                wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[3, 2]), Some(&[3, 1]))?, T)
            } else {
                wait(b.all_to_all_single(&f32s(b, &[4])?, Some(&[3, 1]), Some(&[2, 2]))?, T)
            }
        }),
        ("all_to_all_equal_split_indivisible", 2, K::Indivisible, false, |b, _, _| {
            wait(b.all_to_all_single(&f32s(b, &[5])?, None, None)?, T)
        }),
        ("all_to_all_equal_split_indivisible_rows", 2, K::Indivisible, false, |b, _, _| {
            // 6 elements split 3 per rank, but dim 0 (3 rows of 2) does not divide: rows, not
            // elements, are what an equal split splits.
            wait(b.all_to_all_single(&f32s(b, &[3, 2])?, None, None)?, T)
        }),
        ("all_to_all_zero_dim", 2, K::ZeroDim, false, |b, _, _| wait(b.all_to_all_single(&f32s(b, &[])?, None, None)?, T)),
        ("all_to_all_row_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.all_to_all_single(&f32s(b, &[4, 2 + r])?, None, None)?, T)
        }),
        ("broadcast_src_out_of_range", 2, K::BadRoot, false, |b, _, ws| wait(b.broadcast(&f32s(b, &[4])?, ws)?, T)),
        ("broadcast_src_differs_across_ranks", 2, K::BadRoot, true, |b, r, _| wait(b.broadcast(&f32s(b, &[4])?, r)?, T)),
        ("broadcast_src_differs_on_one_rank", 3, K::BadRoot, true, |b, r, _| wait(b.broadcast(&f32s(b, &[6])?, usize::from(r == 2))?, T)),
        // The in-place broadcast_ too (a backend may route it apart from the out-of-place one).
        ("broadcast_inplace_src_differs_on_one_rank", 3, K::BadRoot, true, |b, r, _| {
            wait(b.broadcast_(&f32s(b, &[6])?, usize::from(r == 2))?, T)
        }),
        ("broadcast_dtype_mismatch", 2, K::DTypeMismatch, true, |b, r, _| {
            // Same byte size on both ranks (f32[4] / i32[4]): a backend that moves bytes fills
            // the i32 buffer with the root's f32 bits (pytorch/pytorch#91535).
            let x = if r == 0 { f32s(b, &[4])? } else { b.upload(&full(&[4], 1i32))? };
            wait(b.broadcast(&x, 0)?, T)
        }),
        ("broadcast_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| wait(b.broadcast_(&f32s(b, &[4 + r])?, 0)?, T)),
        ("reduce_root_out_of_range", 2, K::BadRoot, false, |b, _, ws| wait(b.reduce(&f32s(b, &[4])?, ReduceOp::Sum, ws + 3)?, T)),
        ("gather_root_out_of_range", 2, K::BadRoot, false, |b, _, ws| wait(b.gather(&f32s(b, &[4])?, ws)?, T)),
        ("scatter_root_out_of_range", 2, K::BadRoot, false, |b, _, ws| wait(b.scatter(&f32s(b, &[4])?, ws)?, T)),
        ("reduce_root_differs_across_ranks", 2, K::BadRoot, true, |b, r, _| wait(b.reduce(&f32s(b, &[4])?, ReduceOp::Sum, r)?, T)),
        ("gather_root_differs_across_ranks", 2, K::BadRoot, true, |b, r, _| wait(b.gather(&f32s(b, &[4])?, r)?, T)),
        ("scatter_root_differs_across_ranks", 2, K::BadRoot, true, |b, r, _| wait(b.scatter(&f32s(b, &[4])?, r)?, T)),
        // One rank of three names another root than the other two (which agree), and no rank
        // names itself but the common root: a backend that compares the roots only on a rank
        // that names itself root lets the others run.
        ("reduce_root_differs_on_one_rank", 3, K::BadRoot, true, |b, r, _| {
            wait(b.reduce(&f32s(b, &[6])?, ReduceOp::Sum, usize::from(r == 2))?, T)
        }),
        ("gather_root_differs_on_one_rank", 3, K::BadRoot, true, |b, r, _| wait(b.gather(&f32s(b, &[6])?, usize::from(r == 2))?, T)),
        ("scatter_root_differs_on_one_rank", 3, K::BadRoot, true, |b, r, _| wait(b.scatter(&f32s(b, &[6])?, usize::from(r == 2))?, T)),
        ("scatter_indivisible", 3, K::Indivisible, false, |b, _, _| wait(b.scatter(&f32s(b, &[4])?, 0)?, T)),
        ("scatter_shape_mismatch", 2, K::ShapeMismatch, true, |b, r, _| wait(b.scatter(&f32s(b, &[4 + 2 * r])?, 0)?, T)),
        ("send_to_self", 2, K::BadPeer, false, |b, r, _| wait(b.send(&f32s(b, &[4])?, r)?, T)),
        ("send_peer_out_of_range", 2, K::BadPeer, false, |b, _, ws| wait(b.send(&f32s(b, &[4])?, ws)?, T)),
        ("recv_from_self", 2, K::BadPeer, false, |b, r, _| {
            let out = b.alloc(DType::F32, &[4])?;
            wait(b.recv(&out, r)?, T)
        }),
        ("recv_peer_out_of_range", 2, K::BadPeer, false, |b, _, ws| {
            let out = b.alloc(DType::F32, &[4])?;
            wait(b.recv(&out, ws + 1)?, T)
        }),
        ("recv_buffer_smaller_than_message", 2, K::OutBufferSize, true, |b, r, _| {
            if r == 0 {
                wait(b.send(&f32s(b, &[6])?, 1)?, T)
            } else {
                let out = b.alloc(DType::F32, &[4])?;
                wait(b.recv(&out, 0)?, T)
            }
        }),
        // A larger buffer is no padded copy (the contract's "never a truncated or padded copy"),
        // an empty message included (a zero-element send that skips its peer leaves the
        // receiver waiting and the sender unaware).
        ("recv_buffer_larger_than_message", 2, K::OutBufferSize, true, |b, r, _| {
            if r == 0 {
                wait(b.send(&f32s(b, &[4])?, 1)?, T)
            } else {
                let out = b.alloc(DType::F32, &[6])?;
                wait(b.recv(&out, 0)?, T)
            }
        }),
        ("recv_buffer_larger_than_empty_message", 2, K::OutBufferSize, true, |b, r, _| {
            if r == 0 {
                wait(b.send(&f32s(b, &[0])?, 1)?, T)
            } else {
                let out = b.alloc(DType::F32, &[4])?;
                wait(b.recv(&out, 0)?, T)
            }
        }),
        ("send_recv_dtype_mismatch", 2, K::DTypeMismatch, true, |b, r, _| {
            // f32[4] sent into an i32[4] buffer: same byte size, so only a dtype check tells
            // (NVIDIA/nccl#703, pytorch/pytorch#81545).
            if r == 0 {
                wait(b.send(&f32s(b, &[4])?, 1)?, T)
            } else {
                let out = b.alloc(DType::I32, &[4])?;
                wait(b.recv(&out, 0)?, T)
            }
        }),
        // A mismatch past 1 MiB (2^18 f32 against 2^18 + 4): a pipelined large-message path whose
        // header carries each chunk's count, not the call's, passes it.
        ("all_reduce_shape_mismatch_large", 2, K::ShapeMismatch, true, |b, r, _| {
            wait(b.all_reduce(&f32s(b, &[(1 << 18) + 4 * r])?, ReduceOp::Sum)?, T)
        }),
        ("permute_not_a_permutation", 2, K::BadPermutation, false, |b, _, _| wait(b.permute_tensor(&f32s(b, &[4])?, &[0, 0])?, T)),
        ("permute_wrong_length", 2, K::BadPermutation, false, |b, _, _| wait(b.permute_tensor(&f32s(b, &[4])?, &[1, 0, 2])?, T)),
        ("new_group_duplicate_ranks", 2, K::BadGroup, false, |b, _, _| b.new_group(&[0, 0]).map(|_| ())),
        ("new_group_rank_out_of_range", 2, K::BadGroup, false, |b, _, ws| b.new_group(&[0, ws]).map(|_| ())),
        ("new_group_empty", 2, K::BadGroup, false, |b, _, _| b.new_group(&[]).map(|_| ())),
    ]
}

/// The gate of every cross-rank bad-input case (a mismatch only the peers' calls together show:
/// shapes, dtypes, splits, roots): UNSUPPORTED unless the backend declares
/// `validates_across_ranks` (`core/src/caps.rs`: "If false, cross-rank bad-input cases are
/// UNSUPPORTED, not run"). One rule in one place: every such case calls this first.
pub(crate) fn cross_rank_validated<B: Backend>(b: &B) -> Result<(), CaseEnd> {
    if b.capabilities().validates_across_ranks {
        Ok(())
    } else {
        Err(CaseEnd::Unsupported("backend declares no cross-rank input validation".into()))
    }
}

/// Every reduce op a table row's call names on any rank, from its name (empty: no reduction).
/// The rows that mix two ops name both: `*_avg_against_sum` (avg, sum) and
/// `*_reduce_op_mismatch` (sum, max).
fn reduce_of(name: &str) -> Vec<ReduceOp> {
    if name.contains("premul_sum") {
        vec![ReduceOp::PremulSum(2.0)]
    } else if name.contains("bitwise") {
        vec![if name.starts_with("all_reduce") {
            ReduceOp::BAnd
        } else if name.starts_with("reduce_scatter") {
            ReduceOp::BOr
        } else {
            ReduceOp::BXor
        }]
    } else if name.contains("avg_against_sum") {
        vec![ReduceOp::Avg, ReduceOp::Sum]
    } else if name.contains("reduce_op_mismatch") {
        vec![ReduceOp::Sum, ReduceOp::Max]
    } else if name.starts_with("all_reduce") || name.starts_with("reduce") {
        vec![ReduceOp::Sum]
    } else {
        Vec::new()
    }
}

/// The declaration that makes table row `name`'s call unsupported (on any rank: every dtype it
/// carries is checked), if any.
fn row_gap(caps: &concord_core::Capabilities, name: &str) -> Option<String> {
    use concord_core::{OpKind, Variant};
    let (op, variant, dtypes) = call_of(name);
    let op = OpKind::from_name(op)?;
    let variant = Variant::from_name(variant);
    // Every (dtype, reduce op) the row calls with on any rank; `None`: no dtype / no reduction.
    let reduces: Vec<Option<ReduceOp>> = match reduce_of(name) {
        ops if op.reduces() && !ops.is_empty() => ops.into_iter().map(Some).collect(),
        _ => vec![None],
    };
    let dtypes = dtypes.split(|c: char| !c.is_ascii_alphanumeric()).filter_map(DType::from_name).map(Some).chain([None]);
    let mut calls = dtypes.flat_map(|d| reduces.iter().map(move |&r| (d, r)));
    calls.find_map(|(d, reduce)| caps.check_call(op, variant, d, reduce).err().map(|why| (reduce, why))).map(|(reduce, why)| {
        format!(
            "declared gap: the backend's capabilities declare the call of bad_input row `{name}` ({op}{}{}) unsupported ({why})",
            variant.map_or(String::new(), |v| format!(" variant={v}")),
            reduce.map_or(String::new(), |r| format!(" reduce={r}")),
        )
    })
}

/// The (op, variant, dtype) a table row calls, from its name (the rows are named after the call).
pub(crate) fn call_of(name: &str) -> (&'static str, &'static str, &'static str) {
    const OPS: [(&str, &str); 15] = [
        ("all_reduce_coalesced", "all_reduce"),
        ("all_reduce", "all_reduce"),
        ("op_mismatch_all_reduce", "all_reduce"),
        ("all_gather", "all_gather_into_tensor"),
        ("reduce_scatter", "reduce_scatter_tensor"),
        ("all_to_all", "all_to_all_single"),
        ("broadcast", "broadcast"),
        ("reduce_root", "reduce"),
        ("reduce_", "reduce"),
        ("gather", "gather"),
        ("scatter", "scatter"),
        ("send", "send_recv"),
        ("recv", "send_recv"),
        ("permute", "permute_tensor"),
        ("new_group", "new_group"),
    ];
    let op = OPS.iter().find(|(p, _)| name.starts_with(p)).map_or("-", |&(_, op)| op);
    let variant = if name.contains("coalesced") {
        "coalesced"
    } else if (name.contains("_out_") && !name.contains("_out_of_range")) || op == "send_recv" {
        "outbuf"
    } else if name == "broadcast_shape_mismatch" || (op == "broadcast" && name.contains("inplace")) {
        "inplace"
    } else if op == "new_group" {
        "-"
    } else {
        "out"
    };
    let dtype = match name {
        "all_reduce_dtype_mismatch" => "f32/f64",
        "all_gather_out_wrong_dtype" | "reduce_scatter_out_wrong_dtype" => "f32 (out f64)",
        "all_reduce_premul_sum_on_int"
        | "reduce_scatter_premul_sum_on_int"
        | "all_reduce_coalesced_premul_sum_on_int"
        | "reduce_premul_sum_on_int" => "i32",
        "broadcast_dtype_mismatch" => "f32/i32",
        "send_recv_dtype_mismatch" => "f32 (recv i32)",
        _ if op == "new_group" => "-",
        _ => "f32",
    };
    (op, variant, dtype)
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    table::<B>()
        .into_iter()
        .map(|(name, ws, kind, cross_rank, issue)| {
            assert!(call_of(name).0 != "-", "bad_input row `{name}`: name it after its call (see call_of)");
            let meta =
                CaseMeta { suite: "bad_input".into(), op: name.into(), variant: "-".into(), dtype: String::new(), reduce: String::new() };
            Case::<B>::new(format!("bad_input::{name}::ws{ws}"), meta, ws, move |ctx| run_bad(ctx, name, kind, cross_rank, issue))
        })
        .chain([
            Case::<B>::new(
                "bad_input::shape_mismatch_behind_pending::ws2",
                CaseMeta {
                    suite: "bad_input".into(),
                    op: "all_reduce".into(),
                    variant: "out".into(),
                    dtype: "f32".into(),
                    reduce: "sum".into(),
                },
                2,
                shape_mismatch_behind_pending,
            ),
            Case::<B>::new(
                "bad_input::subgroup::rooted::ws4",
                CaseMeta {
                    suite: "bad_input".into(),
                    op: "broadcast,reduce,gather,scatter,all_reduce".into(),
                    variant: "out".into(),
                    dtype: "f32".into(),
                    reduce: "sum".into(),
                },
                4,
                subgroup_rooted,
            ),
        ])
        .chain(std::iter::once(Case::<B>::new(
            "bad_input::refused_buffer_reused_in_place::ws2",
            CaseMeta {
                suite: "bad_input".into(),
                op: "all_reduce".into(),
                variant: "inplace".into(),
                dtype: "f32".into(),
                reduce: "band,sum".into(),
            },
            2,
            refused_buffer_reused_in_place,
        )))
        .collect()
}

/// The buffer of a refused call is the caller's to reuse: `all_reduce(x, band)` on f32 is
/// refused (bad_input:unsupported_dtype on every rank, no cross-rank validation needed), then an
/// in-place `all_reduce_(x, sum)` on that same buffer must write the sum into it. A backend
/// that keeps a refused call's buffer marked busy (registration, staging) computes it elsewhere.
fn refused_buffer_reused_in_place<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let w = format!(
        "backend={} op=all_reduce variant=inplace dtype=f32 reduce=sum after a refused band on the same buffer world_size={ws} rank={}",
        crate::case::backend_label(b),
        b.rank()
    );
    let x = b.upload(&full(&[5], (b.rank() + 1) as f32))?;
    let want = K::UnsupportedDType.name();
    let caps = b.capabilities();
    let (ar, inplace) = (concord_core::OpKind::AllReduce, Some(concord_core::Variant::InPlace));
    if let Err(why) = caps.check_call(ar, inplace, Some(DType::F32), Some(ReduceOp::Sum)) {
        return Err(CaseEnd::Unsupported(format!("declared gap: all_reduce_ sum on f32 ({why})")));
    }
    let band_gap = caps.check_call(ar, Some(concord_core::Variant::Out), Some(DType::F32), Some(ReduceOp::BAnd)).err();
    match b.all_reduce(&x, ReduceOp::BAnd).and_then(|work| work.wait(T).map(|_| ())) {
        Ok(()) => return Err(fail(&w, format!("all_reduce(f32, band) was accepted; expected bad_input:{want}"))),
        Err(e) if e.bad_input_kind() == Some(K::UnsupportedDType) => {}
        // A backend that declares band unsupported on f32 may refuse it as unsupported: a refusal
        // all the same, whose buffer is the caller's to reuse.
        Err(CollectiveError::Unsupported(_)) if band_gap.is_some() => {}
        Err(e) => {
            let or = band_gap.map_or(String::new(), |why| format!(" or unsupported (declared: {why})"));
            return Err(fail(&w, format!("all_reduce(f32, band): expected bad_input:{want}{or}, got {e} [{}]", e.name())));
        }
    }
    let out = b
        .all_reduce_(&x, ReduceOp::Sum)
        .and_then(|work| work.into_value(ctx.timeout))
        .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
    let sum = Tensor::from_vec(&[5], vec![(ws * (ws + 1) / 2) as f32; 5]);
    expect_eq(b, &out, &sum, &format!("{w} (returned buffer)"))?;
    expect_eq(b, &x, &sum, &format!("{w} (the caller's buffer)"))
}

/// A refusal names only the refused call (review10 finding 8: one error flag per communicator,
/// NCCL's async-error style, fails every earlier un-waited work with the refused call's error):
/// a valid all_reduce A (sum of `[r + 1; 5]`) is issued and not waited, then B with shape
/// `[4 + rank]`; B must end in `bad_input:shape_mismatch` on both ranks and A, waited after B,
/// must give the oracle's sum.
fn shape_mismatch_behind_pending<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    cross_rank_validated(b)?;
    let v = ArVehicle::pick(b, &[concord_core::Variant::Out])?;
    let w = format!(
        "backend={} op=all_reduce variant=out dtype=f32 reduce={} bad_input=shape_mismatch issued behind a pending valid all_reduce \
         world_size={ws} rank={me}",
        crate::case::backend_label(b),
        v.op.name()
    );
    let named = |what: &str, e: CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let a = b.all_reduce(&b.upload(&full(&[5], (me + 1) as f32))?, v.op).map_err(|e| named("issuing the valid all_reduce A", e))?;
    let want = K::ShapeMismatch;
    match b.all_reduce(&f32s(b, &[4 + me])?, v.op).and_then(|bw| bw.wait(ctx.timeout).map(|_| ())) {
        Ok(()) => return Err(fail(&w, format!("B (shape [{}]) was accepted; expected bad_input:{}", 4 + me, want.name()))),
        Err(e) if e.bad_input_kind() == Some(want) => {}
        Err(e) => return Err(named(&format!("B (shape [{}]): expected bad_input:{}, got", 4 + me, want.name()), e)),
    }
    let got = a.into_value(ctx.timeout).map_err(|e| {
        named("the valid all_reduce A, issued before the refused B and waited after it, failed (a refusal fails only the refused call)", e)
    })?;
    let exp = v.expected(ws, |r| vec![(r + 1) as f32; 5]);
    expect_eq(b, &got, &exp, &format!("{w} (A's result)"))
}

/// A subgroup's roots (review10 finding 6: a sub-communicator's rooted ops run as a group
/// all_gather / all_reduce that never compares the roots and checks them against the world's
/// size). On the group `[3, 1]` of a 4-rank world: every member names root 2 (inside the world,
/// outside the group of 2) for broadcast, reduce, gather and scatter — `bad_input:bad_root` on
/// both members; then the members name different roots (member `m` names `m`) — `bad_root` on
/// both; then a shape mismatch on all_reduce — `shape_mismatch`; then a valid broadcast from
/// member 1 and an all_reduce give the oracle's values.
fn subgroup_rooted<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    const GROUP: [usize; 2] = [3, 1];
    let b = ctx.b;
    let caps = b.capabilities();
    if !caps.subgroups {
        return Err(CaseEnd::Unsupported("declared gap: subgroups = false (the case runs on a subgroup)".into()));
    }
    let Some(g) = super::util::member_group(b, &GROUP)? else { return Ok(()) };
    let (gs, m) = (g.world_size(), g.rank());
    let at = |op: &str, what: &str| {
        format!("{} bad_input={what} group={GROUP:?}", crate::case::axes(&crate::case::backend_label(b), op, "out", "f32", gs, m))
    };
    let expect_kind = |w: &str, r: Result<(), CollectiveError>, want: K| match r {
        Ok(()) => Err(fail(w, format!("accepted and completed; expected bad_input:{} on every member", want.name()))),
        Err(e) if e.bad_input_kind() == Some(want) => Ok(()),
        Err(e) => Err(fail(w, format!("expected bad_input:{}, got {e} [{}]", want.name(), e.name()))),
    };
    type Rooted<B> = fn(&B, usize) -> Result<(), CollectiveError>;
    let ops: [(&str, Rooted<B>); 4] = [
        ("broadcast", |g, root| wait(g.broadcast(&f32s(g, &[4])?, root)?, T)),
        ("reduce", |g, root| wait(g.reduce(&f32s(g, &[4])?, ReduceOp::Sum, root)?, T)),
        ("gather", |g, root| wait(g.gather(&f32s(g, &[4])?, root)?, T)),
        ("scatter", |g, root| wait(g.scatter(&f32s(g, &[4])?, root)?, T)),
    ];
    let gap = |op: &str| {
        let kind = concord_core::OpKind::from_name(op)?;
        let reduce = matches!(op, "reduce" | "all_reduce").then_some(ReduceOp::Sum);
        caps.check_call(kind, Some(concord_core::Variant::Out), Some(DType::F32), reduce).err()
    };
    let mut ran = 0;
    for (op, call) in ops {
        if gap(op).is_some() {
            continue;
        }
        ran += 1;
        // Root 2: inside the world's 4 ranks, outside the group's 2.
        expect_kind(&at(op, &format!("root_out_of_the_group root=2 (group size {gs})")), call(&g, 2), K::BadRoot)?;
        if caps.validates_across_ranks {
            expect_kind(&at(op, &format!("root_differs_across_members root={m}")), call(&g, m), K::BadRoot)?;
        }
    }
    let ar_gap = gap("all_reduce");
    if caps.validates_across_ranks && ar_gap.is_none() {
        let w = at("all_reduce", &format!("shape_mismatch shape=[{}]", 4 + m));
        expect_kind(&w, wait(g.all_reduce(&f32s(&g, &[4 + m])?, ReduceOp::Sum)?, T), K::ShapeMismatch)?;
    }
    if ran == 0 {
        return Err(CaseEnd::Unsupported("declared gap: broadcast, reduce, gather and scatter on f32 are all unsupported".into()));
    }
    // The group still works: a valid broadcast from member 1 (if supported), an all_reduce.
    if gap("broadcast").is_none() {
        let w = at("broadcast", "none (a valid broadcast from member 1 after the refusals)");
        let x = g.upload(&full(&[4], (10 * (m + 1)) as f32))?;
        let got = g.broadcast(&x, 1).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        expect_eq(&g, &got, &full(&[4], 20.0f32), &w)?;
    }
    let v = ArVehicle::pick(&g, &[concord_core::Variant::Out])?;
    let w = at("all_reduce", &format!("none (a valid all_reduce reduce={} after the refusals)", v.op.name()));
    let x = g.upload(&full(&[5], (m + 1) as f32))?;
    let got = g.all_reduce(&x, v.op).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
    expect_eq(&g, &got, &v.expected(gs, |r| vec![(r + 1) as f32; 5]), &w)
}

fn run_bad<B: Backend>(ctx: &mut Ctx<'_, B>, name: &str, kind: K, cross_rank: bool, issue: Issue<B>) -> CaseResult {
    let b = ctx.b;
    let caps = b.capabilities();
    if cross_rank {
        cross_rank_validated(b)?;
    }
    let (op, variant, dtype) = call_of(name);
    // A row whose call the backend declares unsupported (its op, variant, a dtype it carries on
    // any rank, its reduce op): the backend may refuse it as unsupported, whatever is wrong with
    // its inputs besides.
    if let Some(gap) = row_gap(&caps, name) {
        return Err(CaseEnd::Unsupported(gap));
    }
    if op == "new_group" && !caps.subgroups {
        return Err(CaseEnd::Unsupported(format!(
            "declared gap: bad_input row `{name}` calls new_group, and the backend declares subgroups = false"
        )));
    }
    let w = format!(
        "backend={} op={op} variant={variant} dtype={dtype} bad_input={name} world_size={} rank={}",
        crate::case::backend_label(b),
        b.world_size(),
        b.rank()
    );
    let want = kind.name();
    match issue(b, b.rank(), b.world_size()) {
        Ok(()) => {
            return Err(fail(&w, format!("the bad input was accepted and the op completed; expected a named bad_input:{want} error")))
        }
        Err(e) => match e.bad_input_kind() {
            Some(k) if k == kind => {}
            _ => return Err(fail(&w, format!("expected bad_input:{want}, got {e} [{}]", e.name()))),
        },
    }
    // The world is still usable: an f32 all_reduce of a reduce op the backend supports (the row
    // does not ask for one call: a declared gap on f32 sum excuses that call, not the row).
    let ws = b.world_size();
    let v = ArVehicle::pick(b, &[concord_core::Variant::Out])?;
    let x = b.upload(&full(&[5], (b.rank() + 1) as f32))?;
    let out = b
        .all_reduce(&x, v.op)
        .and_then(|work| work.into_value(ctx.timeout))
        .map_err(|e| fail(&w, format!("the world is not usable after the bad input: {e} [{}] (reduce={})", e.name(), v.op.name())))?;
    let want = v.expected(ws, |r| vec![(r + 1) as f32; 5]);
    expect_eq(b, &out, &want, &format!("{w} (all_reduce reduce={} after the bad input)", v.op.name()))?;
    // After a refused all_to_all, an all_to_all runs (a backend that leaves the refused call's
    // error in its split-exchange state fails the next one with it): row `j` of rank `r`'s input
    // is `10 r + j`, so row `j` of this rank's result is `10 j + rank`.
    if op == "all_to_all_single" {
        let me = b.rank();
        let w = format!("{w} (an equal-split all_to_all after the bad input)");
        let x = b.upload(&Tensor::from_vec(&[ws], (0..ws).map(|j| (10 * me + j) as f32).collect()))?;
        let got = b
            .all_to_all_single(&x, None, None)
            .and_then(|work| work.into_value(ctx.timeout))
            .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        expect_eq(b, &got, &Tensor::from_vec(&[ws], (0..ws).map(|j| (10 * j + me) as f32).collect()), &w)?;
    }
    // After a refused send / recv, the pair still exchanges messages (a backend that leaves the
    // error in the peer's connection fails the next send or recv with it).
    match crate::values::partner(b.rank(), ws) {
        Some(peer) if op == "send_recv" => {
            let w = format!("{w} (a send / recv with rank {peer} after the bad input)");
            let named = |e: CollectiveError| fail(&w, format!("{e} [{}]", e.name()));
            let msg = |r: usize| Tensor::from_vec(&[3], vec![(10 * r + 1) as f32, (10 * r + 2) as f32, (10 * r + 3) as f32]);
            let x = b.upload(&msg(b.rank()))?;
            let out = b.alloc(DType::F32, &[3])?;
            let s = b.send(&x, peer).map_err(named)?;
            let r = b.recv(&out, peer).map_err(named)?;
            let got = r.into_value(ctx.timeout).map_err(named)?;
            s.wait(ctx.timeout).map_err(named)?;
            expect_eq(b, &got, &msg(peer), &w)
        }
        _ => Ok(()),
    }
}
