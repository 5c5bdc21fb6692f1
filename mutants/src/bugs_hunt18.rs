//! The eighteenth hunt: bugs from the wild. Every earlier mutant is a bug we imagined; each of
//! these ports a correctness bug that shipped in a GPU collective library or its framework
//! layer (NCCL, RCCL, PyTorch c10d, Horovod, JAX / XLA), found in the project's issue or
//! pull-request thread named on its type. Each keeps the original's mechanism and its trigger
//! (the op, dtype, reduce op, size, world size or communicator shape where it went wrong), over
//! the correct shm backend, as far as the `Backend` trait lets a wrapper reproduce it.

use crate::campaign::Spec;
use crate::{lock, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, Completion, DType, ReduceOp, Result, Tensor, Work};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

// ---------------------------------------------------------------- NVIDIA/nccl #1950

/// NCCL's one-rank reduction (`ncclLaunchOneRank`, NVIDIA/nccl #1950 "One-rank avg reduction
/// missing elements", seen through pytorch/pytorch #168092; RCCL's port ROCm/rocm-systems #7711):
/// at one rank, `avg` on floats and `premul_sum` run a kernel over `grid = min(32, ⌈bytes /
/// 16 KiB⌉)` blocks, each taking `alignUp(⌊n / grid⌋, 16 / elt_size)` elements; when that floor
/// rounds down, the last `n - grid · chunk` elements are never written (the output keeps what it
/// held: a fresh output's zeros, an in-place input's unscaled values).
#[derive(Default)]
pub struct OneRankAvgDropsTail;

impl OneRankAvgDropsTail {
    /// The first element the kernel never writes, for `n` elements of `dtype` (`None`: all written).
    fn lost_from(dtype: DType, n: usize) -> Option<usize> {
        let es = dtype.size();
        let grid = (n * es).div_ceil(16 << 10).clamp(1, 32);
        let pack = 16 / es;
        let covered = grid * (n / grid).div_ceil(pack) * pack;
        (covered < n).then_some(covered)
    }

    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> Option<usize> {
        let dtype = s.inner.buffer_dtype(x);
        let pms = matches!(op, ReduceOp::PremulSum(_)) || (op == ReduceOp::Avg && is_float(dtype));
        if s.ws() != 1 || !pms {
            return None;
        }
        Self::lost_from(dtype, s.numel(x))
    }
}

impl Bug for OneRankAvgDropsTail {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let Some(from) = Self::applies(s, x, op) else { return Ok(w) };
        Ok(s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let es = t.dtype().size();
                t.bytes_mut()[from * es..].fill(0);
            })
        }))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let Some(from) = Self::applies(s, x, op) else { return s.inner.all_reduce_(x, op) };
        // In place: the tail keeps the input as it was before the reduction.
        let before = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let es = t.dtype().size();
                t.bytes_mut()[from * es..].copy_from_slice(&before.bytes()[from * es..]);
            })
        }))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #190745

/// ProcessGroupNCCL's bf16 `premul_sum` (pytorch/pytorch #190745 "bfloat16 NCCL PREMUL_SUM
/// silently zeroes the reduction for power-of-two factors", fixed by #190747): the factor is
/// stored as a 4-byte f32 but NCCL reads `sizeof(bf16)` = 2 bytes of it, so the factor it
/// applies is the bf16 whose bits are the f32's low half: zero for every factor whose low 16
/// mantissa bits are zero (every power of two, 3.0, 0.5, ...), a tiny wrong value otherwise.
#[derive(Default)]
pub struct Bf16PremulFactorLowHalf;

impl Bf16PremulFactorLowHalf {
    fn op(s: &Shm, x: &Buf, op: ReduceOp) -> ReduceOp {
        match op {
            ReduceOp::PremulSum(f) if s.inner.buffer_dtype(x) == DType::BF16 => {
                let low = ((f as f32).to_bits() & 0xffff) as u16;
                let t = Tensor::from_bytes(DType::BF16, &[1], &low.to_le_bytes());
                ReduceOp::PremulSum(t.get_f64(0))
            }
            op => op,
        }
    }
}

impl Bug for Bf16PremulFactorLowHalf {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(s, x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(s, x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first() {
            Some(x) => s.inner.all_reduce_coalesced(xs, Self::op(s, x, op)),
            None => s.inner.all_reduce_coalesced(xs, op),
        }
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first() {
            Some(x) => s.inner.all_reduce_coalesced_(xs, Self::op(s, x, op)),
            None => s.inner.all_reduce_coalesced_(xs, op),
        }
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, Self::op(s, x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, Self::op(s, x, op), out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first() {
            Some(x) => s.inner.reduce_scatter_tensor_coalesced(xs, Self::op(s, x, op)),
            None => s.inner.reduce_scatter_tensor_coalesced(xs, op),
        }
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, Self::op(s, x, op), root)
    }
}

// ---------------------------------------------------------------- jax-ml/jax #21820

/// XLA:CPU's `pmax` (jax-ml/jax #21820 "pmax bug on negative numbers on CPU"): the max
/// reduction's accumulator starts at `numeric_limits<T>::min()`, which for a float type is the
/// smallest positive normal, not the lowest value: an element that is negative (or zero) on
/// every device comes back as 1.17e-38 (f32; 6.1e-5 in f16, 2.2e-308 in f64). Integer types
/// are right (their `min()` is the lowest). Two or more devices.
#[derive(Default)]
pub struct PmaxIdentityFltMin;

impl PmaxIdentityFltMin {
    fn floor(d: DType) -> f64 {
        match d {
            DType::F16 => 6.103515625e-5,
            DType::BF16 | DType::F32 => f32::MIN_POSITIVE as f64,
            _ => f64::MIN_POSITIVE,
        }
    }
    fn fix(be: &concord_shm::ShmBackend, b: &Buf) -> Result<()> {
        crate::edit(be, b, |t| {
            let floor = Self::floor(t.dtype());
            for i in 0..t.numel() {
                let v = t.get_f64(i);
                if !v.is_nan() && v < floor {
                    set_f64(t, i, floor);
                }
            }
        })
    }
    fn applies(s: &Shm, xs: &[Buf], op: ReduceOp) -> bool {
        op == ReduceOp::Max && s.ws() >= 2 && xs.first().is_some_and(|x| is_float(s.inner.buffer_dtype(x)))
    }
}

impl Bug for PmaxIdentityFltMin {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        if !Self::applies(s, std::slice::from_ref(x), op) {
            return Ok(w);
        }
        Ok(s.then(w, Self::fix))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        if !Self::applies(s, std::slice::from_ref(x), op) {
            return Ok(w);
        }
        Ok(s.then(w, Self::fix))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        if !Self::applies(s, xs, op) {
            return Ok(w);
        }
        Ok(s.then(w, |be, outs| outs.iter().try_for_each(|o| Self::fix(be, o))))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        if !Self::applies(s, xs, op) {
            return Ok(w);
        }
        Ok(s.then(w, |be, outs| outs.iter().try_for_each(|o| Self::fix(be, o))))
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #1906

/// NCCL's single-node NVLS all_gather and reduce_scatter (NVIDIA/nccl #1906 "`all_gather`
/// returns tensors in incorrect rank order for certain permutation of `CUDA_VISIBLE_DEVICES`",
/// root cause and fix in NVIDIA/nccl PR #2377): the peer loop indexes the output by the *dense
/// head* index (the order of the devices) instead of the user rank (`denseToUserRank` is
/// missing), so when the communicator's ranks are not in device order, all_gather's block `i`
/// holds the data of the rank on the `i`-th device, and reduce_scatter gives a rank the chunk
/// of its device position. Here the device order is the order of the members' world ranks: a
/// communicator whose members are not ascending (`new_group([2, 0, 1])`) is permuted.
#[derive(Default)]
pub struct NvlsDenseOrder;

impl NvlsDenseOrder {
    /// `dense[u]`: the device position of communicator rank `u` (`None`: the identity).
    fn dense(s: &Shm) -> Option<Vec<usize>> {
        let m = &s.members;
        if m.windows(2).all(|w| w[0] < w[1]) {
            return None;
        }
        Some(m.iter().map(|w| m.iter().filter(|o| *o < w).count()).collect())
    }
    /// The gathered blocks as the bug places them: block `i` holds the data of the rank on
    /// device `i`, so block `dense[u]` gets rank `u`'s block.
    fn permute_blocks(be: &concord_shm::ShmBackend, out: &Buf, dense: &[usize]) -> Result<()> {
        let right = be.download(out)?;
        let ws = dense.len();
        let block = right.len_bytes() / ws;
        let mut wrong = right.clone();
        for (u, &d) in dense.iter().enumerate() {
            crate::copy_bytes(&mut wrong, d * block, &right, u * block, block);
        }
        be.write(out, &wrong)
    }
    fn rs_valid(s: &Shm, x: &Buf) -> bool {
        let shape = s.inner.buffer_shape(x);
        !shape.is_empty() && shape[0] > 0 && shape[0].is_multiple_of(s.ws())
    }
    /// reduce_scatter as the bug runs it: the whole reduction, of which rank `u` keeps chunk
    /// `dense[u]`, written into `out`.
    fn reduce_scatter(s: &Shm, x: &Buf, op: ReduceOp, out: Buf, dense: Vec<usize>) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let me = dense[s.rank()];
        let ws = s.ws();
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, full| {
            let full = be.download(full)?;
            let chunk = full.len_bytes() / ws;
            let mut t = be.download(&o)?;
            crate::copy_bytes(&mut t, 0, &full, me * chunk, chunk);
            be.write(&o, &t)
        }))
    }
}

impl Bug for NvlsDenseOrder {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let Some(dense) = Self::dense(s) else { return Ok(w) };
        Ok(s.then(w, move |be, out| Self::permute_blocks(be, out, &dense)))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        let Some(dense) = Self::dense(s) else { return Ok(w) };
        Ok(s.then(w, move |be, out| Self::permute_blocks(be, out, &dense)))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::dense(s) {
            Some(dense) if Self::rs_valid(s, x) => {
                let mut shape = s.inner.buffer_shape(x);
                shape[0] /= s.ws();
                let out = s.inner.alloc(s.inner.buffer_dtype(x), &shape)?;
                Self::reduce_scatter(s, x, op, out, dense)
            }
            _ => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        match Self::dense(s) {
            Some(dense)
                if Self::rs_valid(s, x) && {
                    shape[0] /= s.ws();
                    s.inner.buffer_shape(out) == shape && s.inner.buffer_dtype(out) == s.inner.buffer_dtype(x)
                } =>
            {
                Self::reduce_scatter(s, x, op, out.clone(), dense)
            }
            _ => s.inner.reduce_scatter_tensor_out(x, op, out),
        }
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #110408

/// NCCL's point-to-point matching (pytorch/pytorch PR #110408 "fix batch_isend_irecv example
/// incorrect usage": "mismatched dtypes silently leads to wrong outputs in nccl"): NCCL moves
/// bytes, so a send and a recv match whenever their byte counts do, and a receiver whose dtype
/// differs from the sender's reinterprets the sender's bytes (an i32 `2` read as an f32
/// 2.8e-45) instead of failing. Here every message travels as its bytes; a byte-count mismatch
/// is still refused (by the u8 transfer underneath).
#[derive(Default)]
pub struct P2pMatchesBytes;

impl Bug for P2pMatchesBytes {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let t = s.inner.download(x)?;
        let bytes = s.inner.upload(&Tensor::from_bytes(DType::U8, &[t.len_bytes()], t.bytes()))?;
        s.inner.send(&bytes, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let (dtype, shape) = (s.inner.buffer_dtype(out), s.inner.buffer_shape(out));
        let staging = s.inner.alloc(DType::U8, &[s.numel(out) * dtype.size()])?;
        let w = s.inner.recv(&staging, src)?;
        let o = out.clone();
        Ok(s.then_as(w, out.clone(), move |be, got| {
            let got = be.download(got)?;
            be.write(&o, &Tensor::from_bytes(dtype, &shape, got.bytes()))
        }))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #122807

/// c10d's `_coalescing_manager` with NCCL (pytorch/pytorch #122807 "_coalescing_manager does not
/// produce proper work handle"): the coalesced ops' work list is empty, so the manager's
/// `wait()` is a no-op and the caller reads the outputs while the coalesced collective is still
/// running. Here a coalesced op's work says it is complete at once and its wait returns at once;
/// the collective underneath goes on.
#[derive(Default)]
pub struct CoalescedWaitNoop;

/// A completion that never waits for the work it carries (polled once, so a finished one is
/// counted off).
struct NoWait<T> {
    inner: Work<T>,
}

impl<T: Send + Sync> Completion for NoWait<T> {
    fn is_completed(&self) -> bool {
        true
    }
    fn wait_for(&self, _timeout: Duration) -> Result<bool> {
        let _ = self.inner.wait(Duration::ZERO);
        Ok(true)
    }
}

impl CoalescedWaitNoop {
    fn wrap(s: &Shm, w: Work<Vec<Buf>>) -> Work<Vec<Buf>> {
        let value = w.peek().clone();
        let meta = w.meta().clone();
        Work::new(value, Arc::new(NoWait { inner: w }), meta, &s.own)
    }
}

impl Bug for CoalescedWaitNoop {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(Self::wrap(s, s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(Self::wrap(s, s.inner.all_reduce_coalesced_(xs, op)?))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        Ok(Self::wrap(s, s.inner.all_gather_into_tensor_coalesced(xs)?))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(Self::wrap(s, s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #2279

/// Horovod's average on its second path (horovod/horovod PR #2279 "Fix allreduce averaging for
/// TF IndexedSlices in ROCm path"): `Average` is rewritten to `Sum` (plus a post-scale of
/// 1/size) before the op is dispatched, and the path that does its own division tests `op ==
/// Average` after the rewrite, sees `Sum`, and never divides: it returns the sum. Here the
/// second path is the coalesced all_reduce (Horovod's fused buffer).
#[derive(Default)]
pub struct AvgRewrittenSkipsDivide;

impl Bug for AvgRewrittenSkipsDivide {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, if op == ReduceOp::Avg { ReduceOp::Sum } else { op })
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, if op == ReduceOp::Avg { ReduceOp::Sum } else { op })
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #501

/// Two receives from one peer in flight at once (NVIDIA/nccl #501 "Multiple ncclRecv within
/// ncclGroupStart/ncclGroupEnd seems to produce incorrect results", from pytorch/pytorch
/// #50092): the second receive completes but its buffer is never written (it stays zero). Here
/// a recv issued while an earlier recv from the same peer is not yet waited is that second one.
#[derive(Default)]
pub struct SecondRecvInFlightZero {
    in_flight: Arc<Mutex<HashMap<usize, usize>>>,
}

/// One receive from `src` counted in flight until its work is waited or dropped (a recv never
/// waited must not leave the count up: the original bug has no such history).
struct RecvInFlight {
    map: Arc<Mutex<HashMap<usize, usize>>>,
    src: usize,
}

impl Drop for RecvInFlight {
    fn drop(&mut self) {
        if let Some(n) = lock(&self.map).get_mut(&self.src) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Bug for SecondRecvInFlightZero {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        let lost = {
            let mut m = lock(&self.in_flight);
            let n = m.entry(src).or_insert(0);
            *n += 1;
            *n > 1
        };
        let guard = RecvInFlight { map: self.in_flight.clone(), src };
        Ok(s.then(w, move |be, r| {
            drop(guard);
            if lost {
                crate::edit(be, r, |t| t.bytes_mut().fill(0))?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- ROCm/rocm-systems PR #9902

/// RCCL's symmetric-memory reduce_scatter sum (ROCm/rocm-systems PR #9902 "fix(rccl): use float
/// accumulation for symmetric FP8 sum", which adds the bf16 / fp8 accumulator specialisations):
/// without them the sum accumulates in the data type, rounding after every addition, in rank
/// order, instead of in f32 rounded once. Here: bf16 `sum` reduce_scatter at three or more
/// ranks (at two there is one addition, rounded once either way).
#[derive(Default)]
pub struct Bf16SumNarrowAccumulator;

impl Bf16SumNarrowAccumulator {
    fn run(s: &Shm, x: &Buf, out: Buf) -> Result<Work<Buf>> {
        let (ws, rank) = (s.ws(), s.rank());
        let g = s.inner.all_gather_into_tensor(x)?;
        let o = out.clone();
        Ok(s.then_as(g, out, move |be, g| {
            let g = be.download(g)?;
            let mut t = be.download(&o)?;
            let n = t.numel();
            let per_rank = g.numel() / ws;
            for j in 0..n {
                let at = |r: usize| g.get_f64(r * per_rank + rank * n + j);
                let mut acc = Tensor::from_f64(DType::BF16, &[1], &[at(0)]);
                for r in 1..ws {
                    let sum = acc.get_f64(0) + at(r);
                    acc = Tensor::from_f64(DType::BF16, &[1], &[sum]);
                }
                set_f64(&mut t, j, acc.get_f64(0));
            }
            be.write(&o, &t)
        }))
    }
    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> Option<Vec<usize>> {
        let mut shape = s.inner.buffer_shape(x);
        let ok = op == ReduceOp::Sum
            && s.ws() >= 3
            && s.inner.buffer_dtype(x) == DType::BF16
            && !shape.is_empty()
            && shape[0] > 0
            && shape[0].is_multiple_of(s.ws());
        ok.then(|| {
            shape[0] /= s.ws();
            shape
        })
    }
}

impl Bug for Bf16SumNarrowAccumulator {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::applies(s, x, op) {
            Some(shape) => Self::run(s, x, s.inner.alloc(DType::BF16, &shape)?),
            None => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        match Self::applies(s, x, op) {
            Some(shape) if s.inner.buffer_shape(out) == shape && s.inner.buffer_dtype(out) == DType::BF16 => Self::run(s, x, out.clone()),
            _ => s.inner.reduce_scatter_tensor_out(x, op, out),
        }
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #130515

/// A root compared in the wrong rank space (pytorch/pytorch #130515 "inconsistent global src and
/// local rank in dist.nn.functional.broadcast", fixed by #190583): the step that keeps the
/// result on the root and zeroes it elsewhere compares the root (a group rank) with the
/// process's *world* rank, so in a subgroup where the root's world rank differs, the root's
/// result is zeroed. Here: reduce, whose result is defined on the root only.
#[derive(Default)]
pub struct RootComparedToWorldRank;

impl Bug for RootComparedToWorldRank {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        if !s.in_subgroup() || s.world_rank == root {
            return Ok(w);
        }
        Ok(s.then(w, |be, r| crate::edit(be, r, |t| t.bytes_mut().fill(0))))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #42283

/// NCCL 2.7.3's zero-byte receive (pytorch/pytorch PR #42283 "Fix NCCL 2.7.3 bug for zero byte
/// send/recv"): NCCL told a send from a recv by `recvbuff == NULL`, and an empty tensor's
/// pointer is NULL, so a zero-element recv was enqueued as a send to the same peer. Neither
/// side's message then has a match: both wait for a partner that never comes.
#[derive(Default)]
pub struct ZeroByteRecvAsSend;

impl Bug for ZeroByteRecvAsSend {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        if s.numel(out) != 0 {
            return s.inner.recv(out, src);
        }
        let w = s.inner.send(out, src)?;
        Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #129501

/// PyTorch's symmetric-memory one-shot all_reduce (pytorch/pytorch PR #129501 "Fix an issue in
/// oneShotAllReduce where different ranks perform reduction in different order"): each rank
/// reads its peers round-robin starting from itself, to spread the load over the links, and adds
/// them in that order, so the f32 sums of different ranks round differently and the ranks'
/// "identical" results differ in their last bits (a hang in data-dependent code such as
/// speculative decoding). Here: f32 `sum` all_reduce of at most 256 KiB (the one-shot sizes) at
/// three or more ranks (two ranks add the same two numbers either way).
#[derive(Default)]
pub struct OneShotRankOrder;

impl OneShotRankOrder {
    const MAX_BYTES: usize = 256 << 10;

    /// The one-shot path: f32 sum of at most 256 KiB at 3+ ranks, with nothing else in flight
    /// on the communicator (the wrapper's gather of the inputs, issued once the all_reduce has
    /// completed, must pair up with the peers' in the same order).
    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum
            && s.ws() >= 3
            && s.inner.buffer_dtype(x) == DType::F32
            && s.numel(x) * 4 <= Self::MAX_BYTES
            && s.inner.outstanding() == 0
    }

    /// `w` (the correct all_reduce, which also refuses bad input as shm does), whose result is
    /// then replaced by this rank's sum in its own order, from every rank's input (`snap`,
    /// gathered once the all_reduce has succeeded, so only on a call every rank agreed on).
    fn run(s: &Shm, w: Work<Buf>, snap: Buf) -> Result<Work<Buf>> {
        let (ws, rank, n) = (s.ws(), s.rank(), s.numel(&snap));
        Ok(s.then(w, move |be, out| {
            let g = be.all_gather_into_tensor(&snap)?;
            let g = be.download(g.wait(crate::BUG_WAIT)?)?;
            let all = g.as_slice::<f32>();
            let mut t = be.download(out)?;
            for (j, d) in t.as_mut_slice::<f32>().iter_mut().enumerate() {
                let mut acc = all[rank * n + j];
                for k in 1..ws {
                    acc += all[((rank + k) % ws) * n + j];
                }
                *d = acc;
            }
            be.write(out, &t)
        }))
    }
}

impl Bug for OneShotRankOrder {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.all_reduce(x, op);
        }
        let w = s.inner.all_reduce(x, op)?;
        Self::run(s, w, x.clone())
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.all_reduce_(x, op);
        }
        let snap = s.inner.upload(&s.inner.download(x)?)?;
        let w = s.inner.all_reduce_(x, op)?;
        Self::run(s, w, snap)
    }
}

// ---------------------------------------------------------------- jax-ml/jax #1703

/// JAX's `ppermute` given its permutation as a one-shot iterator (jax-ml/jax #1703 "ppermute is
/// returning 0s", fixed by PR #1704): the pairs were consumed by the first pass over them (the
/// check that sources and destinations are unique), so the collective was built from an empty
/// list and every device received nothing: its output is all zeros. A backend that walks its
/// `src_dst` once to check it and then again to move the data, from the same spent cursor.
#[derive(Default)]
pub struct PermutePairsConsumed;

impl Bug for PermutePairsConsumed {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let w = s.inner.permute_tensor(x, src_dst)?;
        Ok(s.then(w, |be, out| crate::edit(be, out, |t| t.bytes_mut().fill(0))))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    // Each hint is the case that caught the mutant first in a whole-catalogue run before the
    // `wild::` cases existed, or (the two survivors) the `wild::` case written for it.
    vec![
        spec::<OneRankAvgDropsTail>(
            "wild_onerank_avg_drops_tail",
            "values.world_sizes",
            "NVIDIA/nccl #1950: at one rank, float avg and premul_sum run a kernel whose blocks take alignUp(floor(n/grid), 16/elt) elements: the last elements are never written",
            &["wild::one_rank_block_tails::ws1"],
        ),
        spec::<Bf16PremulFactorLowHalf>(
            "wild_bf16_premul_factor_low_half",
            "numerics.premul_sum",
            "pytorch/pytorch #190745: bf16 premul_sum applies the bf16 whose bits are the low half of the f32 factor: zero for powers of two",
            &["all_reduce::out::bf16::premul_sum::ws1"],
        ),
        spec::<PmaxIdentityFltMin>(
            "wild_pmax_identity_flt_min",
            "values.reduce",
            "jax-ml/jax #21820: float max all_reduce starts from the smallest positive normal: an element negative on every rank comes back as 1.17e-38",
            &["all_reduce::out::f16::max::ws2"],
        ),
        spec::<NvlsDenseOrder>(
            "wild_nvls_dense_order",
            "subgroups",
            "NVIDIA/nccl #1906: all_gather / reduce_scatter index blocks by device order, not rank: a communicator whose members are not ascending gets its blocks permuted",
            &["subgroup::reversed::all_gather_into_tensor::out::f32::ws2"],
        ),
        spec::<P2pMatchesBytes>(
            "wild_p2p_matches_bytes",
            "p2p.matching",
            "pytorch/pytorch PR #110408: send / recv match by byte count: a receiver of another dtype with the same bytes reinterprets them instead of failing",
            &["bad_input::send_recv_dtype_mismatch::ws2"],
        ),
        spec::<CoalescedWaitNoop>(
            "wild_coalesced_wait_noop",
            "async.result_final_after_wait",
            "pytorch/pytorch #122807: a coalesced op's work is complete at once and its wait returns at once while the collective still runs",
            &["async::pending_until_peers_arrive::all_reduce::coalesced::ws2"],
        ),
        spec::<AvgRewrittenSkipsDivide>(
            "wild_avg_rewritten_skips_divide",
            "values.coalesced",
            "horovod/horovod PR #2279: avg is rewritten to sum before dispatch and the coalesced path never divides: it returns the sum",
            &["all_reduce::coalesced::i8::avg::ws2"],
        ),
        spec::<SecondRecvInFlightZero>(
            "wild_second_recv_in_flight_zero",
            "p2p.order",
            "NVIDIA/nccl #501: a second recv from the same peer issued before the first is waited completes with its buffer never written",
            &["p2p::in_flight_in_order::sizes::n4::ws2"],
        ),
        spec::<Bf16SumNarrowAccumulator>(
            "wild_bf16_sum_narrow_accumulator",
            "numerics.round_once",
            "ROCm/rocm-systems PR #9902: bf16 sum reduce_scatter at 3+ ranks accumulates in bf16, rounding after every addition, instead of rounding once",
            &["numerics::round_once::reduce_scatter::bf16::ws3"],
        ),
        spec::<RootComparedToWorldRank>(
            "wild_root_compared_to_world_rank",
            "subgroups",
            "pytorch/pytorch #130515: reduce keeps the result where the world rank equals the root (a group rank): a subgroup's root whose world rank differs gets zeros",
            &["subgroup::halves::reduce::out::f32::avg::ws4"],
        ),
        spec::<ZeroByteRecvAsSend>(
            "wild_zero_byte_recv_as_send",
            "p2p.matching",
            "pytorch/pytorch PR #42283 (NCCL 2.7.3): a zero-element recv is enqueued as a send to the same peer: neither message finds its match",
            &["send_recv::outbuf::i8::ws2"],
        ),
        spec::<OneShotRankOrder>(
            "wild_oneshot_rank_order",
            "values.identical_on_every_rank",
            "pytorch/pytorch PR #129501: f32 sum all_reduce (<= 256 KiB, 3+ ranks) adds the peers round-robin from each rank's own: the ranks' results differ in their last bits",
            &["identical::all_reduce::ws3"],
        ),
        spec::<PermutePairsConsumed>(
            "wild_permute_pairs_consumed",
            "values.move",
            "jax-ml/jax #1703: permute_tensor's pairs are consumed by the uniqueness check before the transfer is built from them: every output is zeros",
            &["permute_tensor::out::i8::ws1"],
        ),
    ]
}
