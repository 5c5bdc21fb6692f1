//! The twenty-fifth hunt: bugs from the wild in language bindings and thin wrappers over a
//! collective library — the layer a user writes when they "wrap NCCL" or "wrap MPI" (PyTorch's
//! `torch.cuda.nccl` binding and `ProcessGroupNCCL` maps, `torch.distributed`'s object
//! collectives and their callers, Horovod's NCCL path and MXNet binding, torch_xla's
//! `xm.all_reduce`, hidet's NCCL primitives, ByteIR's CCL runtime, MPI.NET's C# binding). Each ports a correctness bug that shipped there, found in the project's issue or
//! pull-request thread named on its type, with the original's trigger (op, reduce op, root,
//! group shape, buffer layout) as far as the `Backend` trait lets a wrapper over shm reproduce it.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Work};

// ---------------------------------------------------------------- pytorch/pytorch #179908

/// A binding that drops the root (pytorch/pytorch #179908 "torch.cuda.nccl.broadcast silently
/// ignores root argument — always broadcasts from index 0", fixed by PR #187216: the Python
/// binding `THCPModule_nccl_broadcast` parses and range-checks `root`, then calls
/// `torch::cuda::nccl::broadcast(inputs, streams, comms)` without it, and that helper hardcodes
/// `0` in its `ncclBcast`; "the binding has been wrong since v0.4.0"). Here `broadcast` and
/// `broadcast_` with a valid `src` broadcast from rank 0; an out-of-range `src` is still refused
/// (the binding's range check stands).
#[derive(Default)]
pub struct CudaNcclBcastRootDropped;

impl Bug for CudaNcclBcastRootDropped {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, if src < s.ws() { 0 } else { src })
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, if src < s.ws() { 0 } else { src })
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #39708

/// A reduce-op map read with `operator[]` (pytorch/pytorch #39708 "[distributed] [nccl] should
/// check whether reduceop is supported", labelled "topic: correctness (silent)":
/// `ncclOp[opts.reduceOp]` on a `std::map` that has no entry for the bitwise ops inserts a
/// default-constructed `ncclRedOp_t`, i.e. `ncclSum`; the report's `reduce(x, 0, BXOR)` of two
/// float tensors of 2.4 returns 4.8). Here every reduction (all_reduce in every form,
/// reduce_scatter in every form, reduce) given `band` / `bor` / `bxor` runs `sum` instead, in
/// every dtype: integers get the sum, and floats, which the rule table refuses for a bitwise op,
/// get the sum instead of the refusal.
#[derive(Default)]
pub struct UnmappedRedOpDefaultsToSum;

impl UnmappedRedOpDefaultsToSum {
    fn op(op: ReduceOp) -> ReduceOp {
        if op.is_bitwise() {
            ReduceOp::Sum
        } else {
            op
        }
    }
}

impl Bug for UnmappedRedOpDefaultsToSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, Self::op(op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, Self::op(op))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, Self::op(op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, Self::op(op), out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.reduce_scatter_tensor_coalesced(xs, Self::op(op))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, Self::op(op), root)
    }
}

// ------------------------------------------------- rank spaces of torch.distributed's object ops

/// On a subgroup, the member whose *world* rank is `r` (the group rank of a number read in the
/// wrong rank space), or torch's error when no member has that world rank. On the world, or for
/// an out-of-range `r` (the correct backend's refusal), `r` itself.
fn root_read_as_world_rank(s: &Shm, r: usize, api: &str) -> Result<usize> {
    if !s.in_subgroup() || r >= s.ws() {
        return Ok(r);
    }
    s.members
        .iter()
        .position(|&m| m == r)
        .ok_or_else(|| CollectiveError::Backend(format!("{api}: The global rank {r} is not part of the group (members {:?})", s.members)))
}

/// `scatter_object_list`'s source in the wrong rank space (pytorch/pytorch #74602 "My_rank in
/// the implementation of torch.distributed.scatter_object_list should be global": on a subgroup
/// whose source has different group and global ranks, the source test compares the two spaces,
/// "RuntimeError: The global rank 0 is not part of the group" or the wrong member acting as
/// source; fixed by PR #100552 "[c10d] Fix subprocess group handling in scatter_object_list",
/// "scatter_object_list assumed src was a group rank while all collectives use global ranks").
/// Here `scatter(x, root)` on a subgroup scatters from the member whose world rank is `root`,
/// and fails naming the rank when no member has it. The world is unchanged.
#[derive(Default)]
pub struct ScatterObjectSrcRankSpace;

impl Bug for ScatterObjectSrcRankSpace {
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.scatter(x, root_read_as_world_rank(s, root, "scatter_object_list")?)
    }
}

/// `gather_object`'s destination passed as a group rank (pytorch/pytorch #141825 "Should
/// coordinator_rank in class _DistWrapper be the global_rank instead of local rank in its
/// process group?": DCP's `_DistWrapper.gather_object` passes its `coordinator_rank`, a rank of
/// its process group, as `dst`, which `dist.gather_object` reads as a global rank; the same fix
/// for hybrid sharding in PR #147675 "[DCP] fix dcp gather_object/scatter_object_list"). Here
/// `gather(x, root)` on a subgroup gathers to the member whose world rank is `root`, and fails
/// naming the rank when no member has it. The world is unchanged.
#[derive(Default)]
pub struct GatherObjectDstGroupAsGlobal;

impl Bug for GatherObjectDstGroupAsGlobal {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.gather(x, root_read_as_world_rank(s, root, "gather_object")?)
    }
}

// ---------------------------------------------------------------- bytedance/byteir PR #286

/// A root counted in the replica group's order on a communicator split in world order
/// (bytedance/byteir PR #286 "[CCL] Fix broadcast": `nccl.Broadcast` over `replica_group = [2,
/// 0, 3]` builds its communicator with `ncclCommSplit`, keyed by world rank, so "the new rank
/// will be 1, 0, 2" while the root was given in the group's listed order: "it will fail because
/// the wrong root is appointed"; the same shape in ngimel/nccl.torch PR #1, "`root` did not
/// select the correct tensor if the input was not in 1, 2, 3, etc. order"). Here, on a subgroup
/// whose members are not in ascending world order, `broadcast` / `broadcast_` with group root
/// `src` root at the member that is `src`-th in world order (`sorted(members)[src]`). Groups in
/// world order (the world included) are unchanged.
#[derive(Default)]
pub struct SplitCommRootInListOrder;

impl SplitCommRootInListOrder {
    fn root(s: &Shm, src: usize) -> usize {
        if src >= s.ws() {
            return src;
        }
        let mut sorted = s.members.clone();
        sorted.sort_unstable();
        s.members.iter().position(|&m| m == sorted[src]).unwrap_or(src)
    }
}

impl Bug for SplitCommRootInListOrder {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, Self::root(s, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, Self::root(s, src))
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #358

/// A single-tensor reduction that reduces its output buffer (horovod/horovod PR #358 "Critical
/// Bugfix: non-fused allreduce produces incorrect results", from the review of PR #329
/// "Hierarchical NCCL + MPI allreduce": "If (entries.size() == 1), you set output buffer
/// buffer_data to first_entry.output->data() and then call ncclReduce(buffer_data, buffer_data,
/// ...). You need to copy input data first_entry.tensor->data() to buffer_data before the
/// ncclReduce"). Here an out-of-place all_reduce, and a coalesced out-of-place all_reduce of one
/// tensor (a fusion of one entry), allocate the output and reduce it in place without copying
/// the input into it: every rank contributes the fresh buffer's contents, never its input. The
/// in-place forms (output = input) and fusions of two or more are right.
#[derive(Default)]
pub struct HorovodNonFusedReducesOutput;

impl HorovodNonFusedReducesOutput {
    fn unfilled(s: &Shm, x: &Buf) -> Result<Buf> {
        s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))
    }
}

impl Bug for HorovodNonFusedReducesOutput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let out = Self::unfilled(s, x)?;
        s.inner.all_reduce_(&out, op)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if xs.len() != 1 {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        let out = Self::unfilled(s, &xs[0])?;
        s.inner.all_reduce_coalesced_(&[out], op)
    }
}

// ---------------------------------------------------------------- hidet-org/hidet PR #301

/// A count passed in bytes (hidet-org/hidet PR #301 "[Fix] NCCL API mismatch and NCCL primitive
/// fix": "`count` in NCCL APIs refer to number of elements, not bytes"): the primitive hands
/// NCCL `numel * itemsize` as the element count of an element datatype, so NCCL reduces
/// `itemsize` times more elements than the tensor has, through the memory after it. What a
/// wrapper can show of that overrun is the memory a caller owns: here an in-place all_reduce of
/// a view reduces `numel * itemsize` elements of its parent from the view's offset on (as far
/// as the parent reaches), so the parent's elements after the view are reduced too. One-byte
/// dtypes, and buffers that are not views (whose overrun lands outside any buffer of the
/// caller), are unchanged.
#[derive(Default)]
pub struct HidetCountInBytes;

impl Bug for HidetCountInBytes {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let Some((parent, offset)) = s.view_of(x) else {
            return s.inner.all_reduce_(x, op);
        };
        let n = s.numel(x);
        let count = (n * s.inner.buffer_dtype(x).size()).min(s.numel(&parent).saturating_sub(offset));
        if count <= n {
            return s.inner.all_reduce_(x, op);
        }
        let wide = s.inner.view(&parent, offset, &[count])?;
        let w = s.inner.all_reduce_(&wide, op)?;
        Ok(s.then_as(w, x.clone(), |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- pytorch/xla #9670

/// A one-device shortcut that skips the scale (pytorch/xla #9670 "`all_reduce` does not apply
/// `scale` when `xr.world_size == 1`": `torch_xla.core.xla_model.all_reduce(reduce_type, inputs,
/// scale)` begins with "No-op if there is only one device": `if runtime.world_size() == 1 ...:
/// return inputs.clone()` for a tensor, `return inputs` for a list, before `scale` is applied).
/// `xm.all_reduce`'s `scale` is premul_sum's factor; here, in a world of one rank (the runtime's
/// world, not a one-rank subgroup of a larger one), `all_reduce` / `all_reduce_` and their
/// coalesced forms with `premul_sum(s)` return the input unscaled (a copy out of place, the
/// buffer untouched in place). Every other op is unchanged (at one rank they are the identity).
#[derive(Default)]
pub struct XlaAllReduceScaleSkippedAtOneDevice;

impl XlaAllReduceScaleSkippedAtOneDevice {
    fn op(s: &Shm, op: ReduceOp) -> ReduceOp {
        match op {
            ReduceOp::PremulSum(_) if s.world_size == 1 => ReduceOp::Sum,
            op => op,
        }
    }
}

impl Bug for XlaAllReduceScaleSkippedAtOneDevice {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(s, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(s, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, Self::op(s, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, Self::op(s, op))
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #1740

/// The root's copy of an out-of-place broadcast racing the read (horovod/horovod PR #1740 "Fix
/// root rank output handling bug in MXNet out-of-place broadcast": on the root, the op copied
/// input to output with `TensorUtil::Copy`, an MXNet op scheduled by the engine, so
/// "`result` on the root rank can sometimes be `0` instead of the expected value `42`" when the
/// output is read right after `hvd.broadcast`). The race is always lost here: an out-of-place
/// broadcast returns, on the root only, an output of zeros; the other ranks get the root's
/// input. The in-place `broadcast_` (the tensor is its own output) is right.
#[derive(Default)]
pub struct MxnetBcastRootOutputUnset;

impl Bug for MxnetBcastRootOutputUnset {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        if s.rank() != src {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| crate::edit(be, out, |t| t.bytes_mut().fill(0))))
    }
}

// ---------------------------------------------------------------- mpidotnet/MPI.NET PR #4

/// A gathered result sized without rank 0's count (mpidotnet/MPI.NET PR #4 "AllgatherFlattened
/// fix (result size)": the C# binding sums the receive counts into the result's `size` in a loop
/// that "misses `counts[0]` term", and its own test passed "since the rank 0 process does not
/// ask to send any data (`counts[0]==0`)"). With equal counts `n` the result holds `(ws - 1) *
/// n` elements, so the last `n` gathered elements (the last rank's block) land past it and
/// never reach the caller. Here an all_gather (out, `_out`, coalesced) at two ranks or more
/// returns the last rank's block as zeros (out of place) or leaves it as it was (`_out`).
#[derive(Default)]
pub struct MpiNetAllgatherSizeMissesRank0;

impl MpiNetAllgatherSizeMissesRank0 {
    /// Zeros the last `1 / ws` of `out` (the block past the short result).
    fn drop_last_block(s: &Shm, w: Work<Buf>) -> Work<Buf> {
        let ws = s.ws();
        s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let n = t.bytes().len();
                if ws > 1 && n > 0 {
                    t.bytes_mut()[n - n / ws..].fill(0);
                }
            })
        })
    }
}

impl Bug for MpiNetAllgatherSizeMissesRank0 {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(Self::drop_last_block(s, s.inner.all_gather_into_tensor(x)?))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        // The short result is the caller's buffer minus its last block: that block keeps its
        // old contents.
        let before = s.inner.download(out)?;
        let ws = s.ws();
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        Ok(s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let n = t.bytes().len();
                if ws > 1 && n > 0 && n == before.bytes().len() {
                    t.bytes_mut()[n - n / ws..].copy_from_slice(&before.bytes()[n - n / ws..]);
                }
            })
        }))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let ws = s.ws();
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        Ok(s.then(w, move |be, outs| {
            for out in outs {
                crate::edit(be, out, |t| {
                    let n = t.bytes().len();
                    if ws > 1 && n > 0 {
                        t.bytes_mut()[n - n / ws..].fill(0);
                    }
                })?;
            }
            Ok(())
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<CudaNcclBcastRootDropped>(
            "wild_cuda_nccl_bcast_root_dropped",
            "values.move",
            "pytorch/pytorch#179908 (PR #187216): torch.cuda.nccl.broadcast drops its root: broadcast / broadcast_ always from rank 0",
            &["broadcast::out::i8::ws2"],
        ),
        spec::<UnmappedRedOpDefaultsToSum>(
            "wild_unmapped_redop_defaults_to_sum",
            "values.reduce",
            "pytorch/pytorch#39708: a reduce-op map read with operator[] turns band / bor / bxor into sum (integers summed, floats not refused)",
            &["all_reduce::out::i8::band::ws2"],
        ),
        spec::<ScatterObjectSrcRankSpace>(
            "wild_scatter_object_src_rank_space",
            "subgroups",
            "pytorch/pytorch#74602 (PR #100552): scatter_object_list's src in the wrong rank space: a subgroup scatter roots at the member whose world rank is src",
            &["subgroup::halves::scatter::out::f32::ws4"],
        ),
        spec::<GatherObjectDstGroupAsGlobal>(
            "wild_gather_object_dst_group_as_global",
            "subgroups",
            "pytorch/pytorch#141825 (PR #147675): DCP passes a group rank as gather_object's global dst: a subgroup gather goes to the member whose world rank is dst",
            &["subgroup::halves::gather::out::f32::ws4"],
        ),
        spec::<SplitCommRootInListOrder>(
            "wild_split_comm_root_in_list_order",
            "subgroups",
            "bytedance/byteir PR #286: a broadcast root given in the replica group's order on a communicator split in world order (unsorted groups)",
            &["subgroup::reversed::broadcast::out::f32::ws2"],
        ),
        spec::<HorovodNonFusedReducesOutput>(
            "wild_horovod_nonfused_reduces_output",
            "values.reduce",
            "horovod/horovod PR #358 (review of PR #329): a non-fused all_reduce reduces its fresh output buffer, the input never copied in",
            &["all_reduce::out::i8::sum::ws1"],
        ),
        spec::<HidetCountInBytes>(
            "wild_hidet_count_in_bytes",
            "views",
            "hidet-org/hidet PR #301: the NCCL count passed in bytes: an in-place all_reduce of a view reduces numel * itemsize elements of its parent",
            &["views::all_reduce::inplace::f32::sum::ws2"],
        ),
        spec::<XlaAllReduceScaleSkippedAtOneDevice>(
            "wild_xla_all_reduce_scale_skipped_ws1",
            "numerics.premul_sum",
            "pytorch/xla#9670: xm.all_reduce's one-device no-op returns the input before applying scale: premul_sum all_reduce unscaled in a world of one",
            &["all_reduce::out::f32::premul_sum::ws1"],
        ),
        spec::<MxnetBcastRootOutputUnset>(
            "wild_mxnet_bcast_root_output_unset",
            "values.move",
            "horovod/horovod PR #1740: MXNet out-of-place broadcast's root copy races the read: the root's output is zeros",
            &["broadcast::out::i8::ws2"],
        ),
        spec::<MpiNetAllgatherSizeMissesRank0>(
            "wild_mpinet_allgather_size_misses_rank0",
            "values.move",
            "mpidotnet/MPI.NET PR #4: AllgatherFlattened sizes its result without counts[0]: the last rank's gathered block never reaches the caller",
            &["all_gather_into_tensor::out::i8::ws2"],
        ),
    ]
}
