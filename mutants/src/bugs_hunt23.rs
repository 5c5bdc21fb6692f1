//! The twenty-third hunt: bugs from the wild in the layer above the collective library, the
//! frameworks that issue collectives (DeepSpeed, torchft, Hugging Face Accelerate, MS-AMP,
//! MLX, UCC, InfiniCCL, torch-rbln). Each ports a correctness bug that shipped there, found in the
//! project's issue or pull-request thread named on its type, moved into a backend that receives
//! the same call, with the original's trigger (op, dtype, reduce op, size, world size, list
//! shape) as far as the `Backend` trait lets a wrapper over shm reproduce it.

use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;

/// Zeroes every element of `b`.
fn zero(be: &ShmBackend, b: &Buf) -> Result<()> {
    edit(be, b, |t| t.bytes_mut().fill(0))
}

// ---------------------------------------------------------------- InfiniTensor/InfiniCCL PR #37

/// InfiniCCL's host-side average over Open MPI (InfiniTensor/InfiniCCL PR #37 "fix(ompi):
/// correct integer `Avg` scaling in `AllReduce` and `ReduceScatter`", after the same fix to
/// `Reduce` in PR #28): the sum is scaled by `typed_buf[i] *= static_cast<T>(1 / world_size)`,
/// and for an integer `T` the cast truncates the reciprocal to 0, so every integer `avg` at more
/// than one rank comes back all zeros. Here all_reduce (out of place and in place),
/// reduce_scatter (and `_out`) and reduce (on the root) of an integer dtype with `avg` at
/// `ws > 1` give zeros.
#[derive(Default)]
pub struct IntAvgScaleTruncated;

impl IntAvgScaleTruncated {
    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Avg && !s.inner.buffer_dtype(x).is_float() && s.ws() > 1
    }
    fn zeroed(s: &Shm, w: Work<Buf>, x: &Buf, op: ReduceOp) -> Work<Buf> {
        if Self::applies(s, x, op) {
            s.then(w, zero)
        } else {
            w
        }
    }
}

impl Bug for IntAvgScaleTruncated {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::zeroed(s, s.inner.all_reduce(x, op)?, x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::zeroed(s, s.inner.all_reduce_(x, op)?, x, op))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::zeroed(s, s.inner.reduce_scatter_tensor(x, op)?, x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(Self::zeroed(s, s.inner.reduce_scatter_tensor_out(x, op, out)?, x, op))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        // Only the root's output is defined (and scaled).
        Ok(if s.rank() == root { Self::zeroed(s, w, x, op) } else { w })
    }
}

// ---------------------------------------------------------------- deepspeedai/DeepSpeed PR #8539

/// ZeRO-3's coalesced parameter gather (deepspeedai/DeepSpeed PR #8539 "Wait for all async
/// all-gathers in coalesced ZeRO-3 parameter gather"): `_allgather_params_coalesced()` launches
/// one async all_gather per parameter into `torch.empty` flat buffers and waits only on the
/// *last* handle. On CUDA one stream orders them; on gloo every handle runs on its own thread,
/// so the earlier parameters were read before their gathers landed: uninitialized memory
/// (denormal garbage, NaN). Here a coalesced all_gather of two or more tensors at `ws > 1`
/// completes with every output but the last holding the fresh buffer's garbage (bytes `0xA5`):
/// the race, always lost.
#[derive(Default)]
pub struct CoalescedGatherWaitsLast;

impl CoalescedGatherWaitsLast {
    const GARBAGE: u8 = 0xA5;
}

impl Bug for CoalescedGatherWaitsLast {
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        if xs.len() < 2 || s.ws() < 2 {
            return Ok(w);
        }
        Ok(s.then(w, |be, outs| {
            for o in &outs[..outs.len().saturating_sub(1)] {
                edit(be, o, |t| t.bytes_mut().fill(Self::GARBAGE))?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- ml-explore/mlx PR #4443

/// MLX's jaccl ring all_gather (ml-explore/mlx PR #4443 "Fix jaccl ring all_gather: direction 1
/// slice was not mirrored"): each rank's block is split in two halves that travel the ring in
/// opposite directions; after a refactor the send side of direction 1 dropped its
/// `lr * n_wires * n_bytes_per_wire` offset, so "both sides were sending the lower half of the
/// slice" while the receiver still wrote direction 1 at the upper half. Every peer's block
/// therefore arrives with its upper half (bytes from `⌈n/2⌉`, one wire) holding a copy of its
/// lower half; the rank's own block is copied locally and stays right. Here all_gather (out of
/// place and `_out`) at `ws > 1`.
#[derive(Default)]
pub struct RingAllGatherLowerHalfTwice;

impl RingAllGatherLowerHalfTwice {
    fn mirror(be: &ShmBackend, out: &Buf, me: usize, ws: usize) -> Result<()> {
        edit(be, out, |t| {
            let nb = t.len_bytes() / ws;
            let half = nb.div_ceil(2);
            let src = t.clone();
            for p in (0..ws).filter(|&p| p != me) {
                copy_bytes(t, p * nb + half, &src, p * nb, nb - half);
            }
        })
    }
}

impl Bug for RingAllGatherLowerHalfTwice {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let (me, ws) = (s.rank(), s.ws());
        if ws < 2 {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| Self::mirror(be, out, me, ws)))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        let (me, ws) = (s.rank(), s.ws());
        if ws < 2 {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| Self::mirror(be, out, me, ws)))
    }
}

// ---------------------------------------------------------------- huggingface/accelerate #745

/// Accelerate's `reduce(tensor, reduction="mean")` (huggingface/accelerate #745 "Reduction on all
/// distributed system only return the sum, irrespective of the provided parameter. Only works as
/// intended on multi-cpu."): the division by the number of processes sat on the multi-CPU branch
/// only, so every other distributed type all-reduced with SUM and returned the sum. Here an
/// all_reduce (out of place and in place) with `avg` runs as `sum`.
#[derive(Default)]
pub struct MeanReturnsSum;

impl MeanReturnsSum {
    fn op(op: ReduceOp) -> ReduceOp {
        if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        }
    }
}

impl Bug for MeanReturnsSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(op))
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #490

/// UCC's CUDA transport (openucx/ucc PR #490 "TL/CUDA: fix zero size rs and ag": "Fixes integer
/// divide by zero exception in TL CUDA reduce scatter and allgather when count is 0"): the
/// per-step split divides by the element count, so a zero-element reduce_scatter or all_gather
/// kills the process with SIGFPE. Here (a named error standing in for the signal, as the
/// nineteenth hunt's gloo port does) reduce_scatter and all_gather, out of place and `_out`, of
/// zero elements at `ws > 1` fail at issue on every rank.
#[derive(Default)]
pub struct ZeroCountDivide;

impl ZeroCountDivide {
    fn check(s: &Shm, x: &Buf, op: &str) -> Result<()> {
        if s.ws() > 1 && s.numel(x) == 0 {
            return Err(CollectiveError::Backend(format!(
                "UCC TL/CUDA {op}: SIGFPE, integer divide by zero (count 0, team size {})",
                s.ws()
            )));
        }
        Ok(())
    }
}

impl Bug for ZeroCountDivide {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::check(s, x, "allgather")?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Self::check(s, x, "allgather")?;
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x, "reduce_scatter")?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Self::check(s, x, "reduce_scatter")?;
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

// ---------------------------------------------------------------- deepspeedai/DeepSpeed PR #4321

/// ZeRO-3's contiguous-gradient bucket (deepspeedai/DeepSpeed PR #4321 "Fix Zero3 contiguous
/// grads, reduce scatter false accuracy issue", and PR #3832 "Zero3 Fix allreduce optimization
/// for extra large tensor"): a gradient is copied into the flat bucket only if `elements +
/// numel < reduce_bucket_size` (strict), yet the bucket is all-reduced from the flat buffer
/// whatever it holds; a gradient that fills the bucket exactly (PR #4321: Hugging Face's "auto"
/// bucket is `hidden_size²`, the size of some weights) or overflows it (PR #3832) is left out
/// of the buffer and "not being reduced". The bucket is flushed first when a gradient would
/// overflow a non-empty one. Here an all_reduce_coalesced list is that bucket, with
/// `reduce_bucket_size` 4096 (`hidden_size` 64): a tensor that reaches the bucket size comes
/// back unreduced (its own input), out of place and in place.
#[derive(Default)]
pub struct BucketBoundaryNotCopied;

impl BucketBoundaryNotCopied {
    const BUCKET: usize = 4096;

    /// The tensors of the list that the bucket leaves out.
    fn left_out(s: &Shm, xs: &[Buf]) -> Vec<usize> {
        let mut elements = 0;
        let mut out = Vec::new();
        for (i, x) in xs.iter().enumerate() {
            let n = s.numel(x);
            if elements > 0 && elements + n > Self::BUCKET {
                elements = 0; // __reduce_and_partition_ipg_grads: the bucket is flushed first
            }
            if elements + n >= Self::BUCKET {
                out.push(i);
            }
            elements += n;
        }
        out
    }
}

impl Bug for BucketBoundaryNotCopied {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let left = Self::left_out(s, xs);
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        if left.is_empty() {
            return Ok(w);
        }
        let inputs: Vec<Buf> = left.iter().map(|&i| xs[i].clone()).collect();
        Ok(s.then(w, move |be, outs| {
            for (&i, x) in left.iter().zip(&inputs) {
                if let Some(o) = outs.get(i) {
                    be.write(o, &be.download(x)?)?;
                }
            }
            Ok(())
        }))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let left = Self::left_out(s, xs);
        if left.is_empty() {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        let before: Vec<Tensor> = left.iter().map(|&i| s.inner.download(&xs[i])).collect::<Result<_>>()?;
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        Ok(s.then(w, move |be, outs| {
            for (&i, t) in left.iter().zip(&before) {
                if let Some(o) = outs.get(i) {
                    be.write(o, t)?;
                }
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchft PR #286

/// torchft's `Manager.allreduce` (meta-pytorch/torchft PR #286 "manager: fix allreduce reduction
/// scaling": "We should only rescale tensors manually for `ReduceOp.AVG`"): after the managed
/// all_reduce the result was divided by the number of participating replicas for every reduce
/// op, so SUM, MAX, MIN and PRODUCT came back divided by the world size (AVG, run as SUM then
/// divided, was right). Here a float all_reduce (out of place and in place) with `sum`,
/// `product`, `min` or `max` at `ws > 1` is divided by the world size.
#[derive(Default)]
pub struct RescaleEveryOp;

impl RescaleEveryOp {
    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        matches!(op, ReduceOp::Sum | ReduceOp::Product | ReduceOp::Min | ReduceOp::Max) && s.inner.buffer_dtype(x).is_float() && s.ws() > 1
    }
    fn divided(s: &Shm, w: Work<Buf>, x: &Buf, op: ReduceOp) -> Work<Buf> {
        if !Self::applies(s, x, op) {
            return w;
        }
        let n = s.ws() as f64;
        s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = t.get_f64(i);
                    set_f64(t, i, v / n);
                }
            })
        })
    }
}

impl Bug for RescaleEveryOp {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::divided(s, s.inner.all_reduce(x, op)?, x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::divided(s, s.inner.all_reduce_(x, op)?, x, op))
    }
}

// ---------------------------------------------------------------- Azure/MS-AMP PR #38

/// MS-AMP's NCCL all_reduce (Azure/MS-AMP PR #38 "[Bug Fixed] Add the mapping between
/// torch.distributed.ReduceOp and ncclRedOp_t": "The order of torch.distributed.ReduceOp is
/// different from that of ncclRedOp_t. It leads wrong reduction."): the torch op's index was
/// passed to NCCL as it was. torch's SUM 0, AVG 1, PRODUCT 2, MIN 3, MAX 4 read as NCCL's Sum 0,
/// Prod 1, Max 2, Min 3, Avg 4: AVG runs as a product, PRODUCT as a max, MAX as an average; SUM
/// and MIN happen to agree. Here all_reduce, out of place and in place.
#[derive(Default)]
pub struct ReduceOpEnumOrder;

impl ReduceOpEnumOrder {
    fn op(op: ReduceOp) -> ReduceOp {
        match op {
            ReduceOp::Avg => ReduceOp::Product,
            ReduceOp::Product => ReduceOp::Max,
            ReduceOp::Max => ReduceOp::Avg,
            op => op,
        }
    }
}

impl Bug for ReduceOpEnumOrder {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(op))
    }
}

// ---------------------------------------------------------------- RBLN-SW/torch-rbln PR #250

/// torch-rbln's ProcessGroupRBLN reduce_scatter (RBLN-SW/torch-rbln PR #250, its side fix:
/// "ReduceScatter registered the output with the reduce layout before checking the dtype, so a
/// tensor headed for the host path was still given a CustomFloat16 physical view"): only f16 is
/// reduced on the device; every other dtype is reduced on the host, but its output storage had
/// already been registered with the f16 physical layout, so the result is stored as f16 (bf16
/// values beyond f16's range become infinities, tiny ones flush, f32 / f64 keep 11 bits). Here
/// reduce_scatter (and `_out`) of bf16, f32 or f64 rounds its result through f16, as far as the
/// PR's text tells (integer outputs are left alone: the text says nothing of them).
#[derive(Default)]
pub struct RsOutputF16Layout;

impl RsOutputF16Layout {
    fn applies(s: &Shm, x: &Buf) -> bool {
        matches!(s.inner.buffer_dtype(x), DType::BF16 | DType::F32 | DType::F64)
    }
    fn through_f16(be: &ShmBackend, out: &Buf) -> Result<()> {
        edit(be, out, |t| {
            let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
            let h = Tensor::from_f64(DType::F16, &[vals.len()], &vals);
            for i in 0..vals.len() {
                set_f64(t, i, h.get_f64(i));
            }
        })
    }
}

impl Bug for RsOutputF16Layout {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        Ok(if Self::applies(s, x) { s.then(w, Self::through_f16) } else { w })
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(if Self::applies(s, x) { s.then(w, Self::through_f16) } else { w })
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #449

/// UCC's knomial reduce with `avg` as a pre-op (openucx/ucc PR #449 "TL/UCP: reduce_kn avg pre
/// op fix": "Adding pre op avg division, in the case where single process doesnt take part in
/// first iteration reduction"): each process scales its partial sum by `1 / team_size` in its
/// first-iteration reduction; a process with no children at distance 1 does no reduction there,
/// so its input joins the sum unscaled. With the default radix 4 that process is virtual rank
/// `team_size - 1` (virtual ranks counted from the root) whenever `(team_size - 1) % 4 == 0`:
/// the root's result is `Σ_{r≠u} x_r / n + x_u` for `u = root - 1 (mod n)` at 5, 9, 13, ...
/// ranks. Here a float reduce with `avg` at those world sizes, run as every rank's
/// pre-multiplied input (`u`'s scaled back up by `n`) reduced with `premul_sum(1/n)`.
#[derive(Default)]
pub struct ReduceKnAvgLeafUndivided;

impl ReduceKnAvgLeafUndivided {
    const RADIX: usize = 4;
}

impl Bug for ReduceKnAvgLeafUndivided {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let (n, dtype) = (s.ws(), s.inner.buffer_dtype(x));
        if op != ReduceOp::Avg || !dtype.is_float() || n < 2 || (n - 1) % Self::RADIX != 0 || root >= n {
            return s.inner.reduce(x, op, root);
        }
        let unscaled = (root + n - 1) % n;
        if s.rank() != unscaled {
            return s.inner.reduce(x, ReduceOp::PremulSum(1.0 / n as f64), root);
        }
        // The process whose input skips the pre-op: `n · x · (1/n)` = its input, unscaled.
        let mut t = s.inner.download(x)?;
        for i in 0..t.numel() {
            let v = t.get_f64(i);
            set_f64(&mut t, i, v * n as f64);
        }
        let staged = s.inner.upload(&t)?;
        s.inner.reduce(&staged, ReduceOp::PremulSum(1.0 / n as f64), root)
    }
}

// ---------------------------------------------------------------- deepspeedai/DeepSpeed #2071

/// DeepSpeed's gradient all_reduce with bf16 enabled (deepspeedai/DeepSpeed #2071 "FP16 used for
/// all reduce even if BFLOAT16 is enabled", fixed by PR #2145): unless `communication_data_type`
/// was set, the engine (and ZeRO's `allreduce_bucket`, whose default was fp16) cast the bf16
/// tensor to fp16, all-reduced it and copied the result back: bf16 values beyond fp16's range
/// become infinities, those below its subnormals flush to zero, and each result is rounded to
/// f16 before bf16. Here a bf16 all_reduce (out of place, in place, coalesced) runs on f16
/// copies of its inputs and converts the results back.
#[derive(Default)]
pub struct Bf16ReducedAsF16;

impl Bf16ReducedAsF16 {
    fn convert(t: &Tensor, to: DType) -> Tensor {
        let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
        Tensor::from_f64(to, t.shape(), &vals)
    }
    /// The f16 copy of `x` the engine all-reduces.
    fn staged(s: &Shm, x: &Buf) -> Result<Buf> {
        s.inner.upload(&Self::convert(&s.inner.download(x)?, DType::F16))
    }
    /// Copies the f16 result `from` back into the bf16 buffer `to`.
    fn back(be: &ShmBackend, from: &Buf, to: &Buf) -> Result<()> {
        be.write(to, &Self::convert(&be.download(from)?, DType::BF16))
    }
    fn is_bf16(s: &Shm, x: &Buf) -> bool {
        s.inner.buffer_dtype(x) == DType::BF16
    }
    fn one(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let out = if in_place { x.clone() } else { s.inner.alloc(DType::BF16, &s.inner.buffer_shape(x))? };
        let staged = Self::staged(s, x)?;
        let w = s.inner.all_reduce_(&staged, op)?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| Self::back(be, r, &o)))
    }
    fn many(s: &Shm, xs: &[Buf], op: ReduceOp, in_place: bool) -> Result<Work<Vec<Buf>>> {
        let mut outs = Vec::with_capacity(xs.len());
        let mut staged = Vec::with_capacity(xs.len());
        for x in xs {
            if Self::is_bf16(s, x) {
                outs.push(if in_place { x.clone() } else { s.inner.alloc(DType::BF16, &s.inner.buffer_shape(x))? });
                staged.push(Self::staged(s, x)?);
            } else {
                outs.push(if in_place { x.clone() } else { s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))? });
                staged.push(s.inner.upload(&s.inner.download(x)?)?);
            }
        }
        let bf16: Vec<bool> = xs.iter().map(|x| Self::is_bf16(s, x)).collect();
        let w = s.inner.all_reduce_coalesced_(&staged, op)?;
        let o = outs.clone();
        Ok(s.then_as(w, outs, move |be, rs| {
            for ((r, to), &b) in rs.iter().zip(&o).zip(&bf16) {
                if b {
                    Self::back(be, r, to)?;
                } else {
                    be.write(to, &be.download(r)?)?;
                }
            }
            Ok(())
        }))
    }
}

impl Bug for Bf16ReducedAsF16 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::is_bf16(s, x) {
            return s.inner.all_reduce(x, op);
        }
        Self::one(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::is_bf16(s, x) {
            return s.inner.all_reduce_(x, op);
        }
        Self::one(s, x, op, true)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if !xs.iter().any(|x| Self::is_bf16(s, x)) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        Self::many(s, xs, op, false)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if !xs.iter().any(|x| Self::is_bf16(s, x)) {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        Self::many(s, xs, op, true)
    }
}

// ---------------------------------------------------------------- deepspeedai/DeepSpeed PR #5391

/// DeepSpeed's `TorchBackend.inference_all_reduce` (deepspeedai/DeepSpeed PR #5391 "[CPU] Support
/// SHM based inference_all_reduce in TorchBackend", whose review notes that "inference_all_reduce
/// only works for sum" while the PR drops the kernel's `op == SUM` assert): when the SHM op is
/// built, the call becomes `torch.ops.deepspeed.inference_all_reduce_(tensor)`, the `op`
/// argument is not passed on, and the kernel sums whatever was asked (only the fallback path
/// honours `op`). Here an in-place all_reduce of f16, bf16 or f32 (the kernel's dtypes) at
/// `ws > 1` sums, whatever its reduce op.
#[derive(Default)]
pub struct InferenceAllReduceOpDropped;

impl Bug for InferenceAllReduceOpDropped {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let shm_kernel = matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16 | DType::F32);
        if s.ws() > 1 && shm_kernel && op.defined_for(s.inner.buffer_dtype(x)) {
            return s.inner.all_reduce_(x, ReduceOp::Sum);
        }
        s.inner.all_reduce_(x, op)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<IntAvgScaleTruncated>(
            "wild_int_avg_scale_truncated",
            "values.reduce",
            "InfiniTensor/InfiniCCL PR #37 (and #28): integer avg scaled by static_cast<T>(1/ws) = 0: all_reduce, reduce_scatter, reduce give zeros at ws > 1",
            &["all_reduce::out::i8::avg::ws2"],
        ),
        spec::<CoalescedGatherWaitsLast>(
            "wild_coalesced_gather_waits_last",
            "async.result_final_after_wait",
            "deepspeedai/DeepSpeed PR #8539: a coalesced all_gather waits only its last piece; the earlier outputs are read uninitialized (ws > 1, 2+ tensors)",
            &["all_gather_into_tensor::coalesced::i8::ws2"],
        ),
        spec::<RingAllGatherLowerHalfTwice>(
            "wild_ring_allgather_lower_half_twice",
            "values.move",
            "ml-explore/mlx PR #4443: ring all_gather sends each block's lower half in both directions: every peer block's upper half is a copy of its lower half",
            &["all_gather_into_tensor::out::i8::ws2"],
        ),
        spec::<MeanReturnsSum>(
            "wild_mean_returns_sum",
            "values.reduce",
            "huggingface/accelerate #745: reduction=mean divides only on the multi-CPU path: all_reduce avg returns the sum",
            &["all_reduce::out::i8::avg::ws2"],
        ),
        spec::<ZeroCountDivide>(
            "wild_zero_count_divide",
            "values.sizes",
            "openucx/ucc PR #490: TL/CUDA reduce_scatter and all_gather of zero elements divide by the count (SIGFPE; here a named error at issue, ws > 1)",
            &["all_gather_into_tensor::out::i8::ws2"],
        ),
        spec::<BucketBoundaryNotCopied>(
            "wild_bucket_boundary_not_copied",
            "values.coalesced",
            "deepspeedai/DeepSpeed PR #4321 (and #3832): a coalesced all_reduce bucket of 4096 elements copies a tensor only if it stays strictly below the bucket size; one that fills or overflows it comes back unreduced",
            &["all_reduce::coalesced::f32::sum::ws2::large"],
        ),
        spec::<RescaleEveryOp>(
            "wild_rescale_every_op",
            "values.reduce",
            "meta-pytorch/torchft PR #286: the managed all_reduce divides by the participants for every op: float sum / product / min / max come back divided by ws",
            &["all_reduce::out::f16::sum::ws2"],
        ),
        spec::<ReduceOpEnumOrder>(
            "wild_reduce_op_enum_order",
            "values.reduce",
            "Azure/MS-AMP PR #38: torch.distributed.ReduceOp's index passed as ncclRedOp_t: avg runs as product, product as max, max as avg",
            &["all_reduce::out::i8::avg::ws2"],
        ),
        spec::<RsOutputF16Layout>(
            "wild_rs_output_f16_layout",
            "values.reduce",
            "RBLN-SW/torch-rbln PR #250: reduce_scatter's host-path output registered with the f16 physical layout: bf16 / f32 / f64 results rounded through f16",
            &["reduce_scatter_tensor::out::f32::min::ws1"],
        ),
        spec::<ReduceKnAvgLeafUndivided>(
            "wild_reduce_kn_avg_leaf_undivided",
            "values.reduce",
            "openucx/ucc PR #449: knomial reduce with the avg pre-op: the process with no first-iteration children (virtual rank n-1, n % 4 == 1) joins unscaled: root gets sum_{r!=u} x_r / n + x_u (float, ws 5, 9, 13, ...)",
            &["reduce::out::f16::avg::ws5"],
        ),
        spec::<Bf16ReducedAsF16>(
            "wild_bf16_reduced_as_f16",
            "values.reduce",
            "deepspeedai/DeepSpeed #2071: bf16 gradients all-reduced as fp16 copies (communication dtype defaulted to fp16): out-of-range values become inf, tiny ones flush, results rounded through f16",
            &["numerics::subnormal::bf16::ws2", "numerics::round_once::avg_near_max::bf16::ws2"],
        ),
        spec::<InferenceAllReduceOpDropped>(
            "wild_inference_all_reduce_op_dropped",
            "values.reduce",
            "deepspeedai/DeepSpeed PR #5391: inference_all_reduce calls the SHM kernel without its op: an in-place f16 / bf16 / f32 all_reduce sums whatever op was asked (ws > 1)",
            &["all_reduce::inplace::f16::avg::ws2"],
        ),
    ]
}
