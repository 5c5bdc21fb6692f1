//! The nineteenth hunt: bugs from the wild. Every earlier hunt ported bugs we imagined; each of
//! these was shipped by a CPU collective library (Open MPI, MPICH, Gloo and torch.distributed's
//! Gloo process group, torchcomms' Gloo backend, libfabric's shm provider under oneCCL, Horovod) and is
//! documented in that project's issue or pull-request thread, named on each type. Each is ported
//! over the correct shm backend with the original's trigger (world size, size, dtype, op, variant)
//! as far as the trait has it; where the trait lacks the original's trigger (Concord has no
//! in-place reduce or all_to_all, no `_v` reduce_scatter) the doc says which path stands in.
//!
//! A bug whose wrong value depends on every rank's input issues a raw all_gather of the input
//! first (every rank, same order), then the real op, and computes the buggy value from the
//! gathered inputs when the op is waited, so validation, ordering and completion stay shm's.

use crate::campaign::{spec, Spec};
use crate::{edit, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, DType, Element, ReduceOp, Result, Tensor, Work};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// `a op b` in f64 for the ops MPI and Gloo have (`None`: an op the original library lacks, so
/// the bug does not fire: avg and premul_sum are torch's).
fn combine(op: ReduceOp, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Product => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
        ReduceOp::BAnd => ((a as i64) & (b as i64)) as f64,
        ReduceOp::BOr => ((a as i64) | (b as i64)) as f64,
        ReduceOp::BXor => ((a as i64) ^ (b as i64)) as f64,
        ReduceOp::Avg | ReduceOp::PremulSum(_) => return None,
    })
}

/// Issues a raw all_gather of `x`, then the real op (`issue`); when the op is waited, `f` edits
/// its result from every rank's input ([`crate::then_gathered`]).
fn with_gathered(
    s: &Shm,
    x: &Buf,
    issue: impl FnOnce() -> Result<Work<Buf>>,
    f: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<Buf>> {
    crate::then_gathered(s, s.inner.all_gather_into_tensor(x)?, |g| g, issue, |b: &Buf| Some(b), f)
}

/// `b` itself, or the same shape at offset 0 of its parent if it is a view at an offset.
fn at_storage_start(s: &Shm, b: &Buf) -> Result<Buf> {
    match s.view_of(b) {
        Some((parent, off)) if off > 0 => s.inner.view(&parent, 0, &s.inner.buffer_shape(b)),
        _ => Ok(b.clone()),
    }
}

// ---------------------------------------------------------------- Gloo: storage pointer

/// pytorch/pytorch#20421 "The result of gloo all_gather error", fixed by pytorch/pytorch#21490
/// "Fix ProcessGroupGloo allgather for tensors with shared storage": ProcessGroupGloo handed Gloo
/// `tensor.storage().data()` instead of `tensor.data_ptr()`, so a contiguous input that does not
/// start at its storage's start (`chunk(..., dim=0)[1]`) was read from the storage's start: rank 1
/// gathered rank 0's chunk. Here: every all_gather reads a view input from its parent's start.
#[derive(Default)]
pub struct GlooAllgatherStoragePtr;
impl Bug for GlooAllgatherStoragePtr {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor(&at_storage_start(s, x)?)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor_out(&at_storage_start(s, x)?, out)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let xs = xs.iter().map(|x| at_storage_start(s, x)).collect::<Result<Vec<_>>>()?;
        s.inner.all_gather_into_tensor_coalesced(&xs)
    }
}

// ---------------------------------------------------------------- Gloo: empty all_gather

/// pytorch/gloo#356 "fix allgather for empty buffers" (pytorch/pytorch#85234 "c10d all_gather
/// aborts with Signal 8 (SIGFPE) when tensor.numel() == 0"): Gloo's ring all_gather took a
/// modulo by the element count, so an empty tensor at more than one rank killed every rank (one
/// rank short-circuited). Here: an empty all_gather at world size > 1 fails on every rank.
#[derive(Default)]
pub struct GlooAllgatherEmptySigfpe;
fn sigfpe(s: &Shm, numels: impl IntoIterator<Item = usize>) -> Result<()> {
    if s.ws() > 1 && numels.into_iter().any(|n| n == 0) {
        return Err(CollectiveError::Backend("allgather_ring: SIGFPE (integer division by zero: count 0)".into()));
    }
    Ok(())
}
impl Bug for GlooAllgatherEmptySigfpe {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        sigfpe(s, [s.numel(x)])?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        sigfpe(s, [s.numel(x)])?;
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        sigfpe(s, xs.iter().map(|x| s.numel(x)))?;
        s.inner.all_gather_into_tensor_coalesced(xs)
    }
}

// ---------------------------------------------------------------- Open MPI libnbc: in-place ring

/// open-mpi/ompi#9385 "Iallreduce gives an incorrect result for algorithms 1 and 3", fixed by
/// open-mpi/ompi#9497 "Fix the libnbc MPI_Allreduce ring algorithm" ("The ring version did not
/// support MPI_IN_PLACE ... delivering wrong results"), from 4 processes on. With the send buffer
/// the receive buffer, each ring step receives a block's partial sum over the rank's own block
/// before adding the own block in, so it adds the partial to itself: block `b` (of `ws` ring
/// blocks) ends as `p op p op ...` of the rank that started it, `(b + 1) % ws`. Here: in-place
/// all_reduce at world size >= 4, MPI's ops.
#[derive(Default)]
pub struct LibnbcRingInPlace;
impl Bug for LibnbcRingInPlace {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (ws, n) = (s.ws(), s.numel(x));
        if ws < 4 || n == 0 || combine(op, 0.0, 0.0).is_none() {
            return s.inner.all_reduce_(x, op);
        }
        let block = n.div_ceil(ws);
        with_gathered(
            s,
            x,
            || s.inner.all_reduce_(x, op),
            move |all, t| {
                for i in 0..n {
                    let start = (i / block + 1) % ws;
                    let mut acc = all.get_f64(start * n + i);
                    for _ in 1..ws {
                        acc = combine(op, acc, acc).unwrap_or(acc);
                    }
                    set_f64(t, i, acc);
                }
            },
        )
    }
}

// ---------------------------------------------------------------- Open MPI libnbc: Ireduce chain

/// open-mpi/ompi#2824 "Fix for Ireduce + MPI_IN_PLACE": libnbc's chain reduce (taken for np <= 4
/// and messages >= 64 KiB) ends at the root with "recv into rbuf from the right neighbour, then
/// add our sbuf into rbuf"; with sbuf == rbuf the receive overwrote the root's own contribution,
/// which the add then counted as the partial a second time: the root got `P op P`, `P` the
/// reduction of every other rank. Concord's reduce has no in-place form; the out-of-place reduce
/// stands in (a root that reduces into its output and hands that as its own input aliases them
/// the same way). Here: reduce at world size 2..=4 of >= 64 KiB, MPI's ops, on the root.
#[derive(Default)]
pub struct LibnbcIreduceChainAlias;
impl Bug for LibnbcIreduceChainAlias {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let (ws, n) = (s.ws(), s.numel(x));
        let bytes = n * s.inner.buffer_dtype(x).size();
        if !(2..=4).contains(&ws) || bytes < 64 * 1024 || combine(op, 0.0, 0.0).is_none() || root >= ws {
            return s.inner.reduce(x, op, root);
        }
        let me = s.rank();
        with_gathered(
            s,
            x,
            || s.inner.reduce(x, op, root),
            move |all, t| {
                if me != root {
                    return;
                }
                for i in 0..n {
                    let others: Vec<f64> = (0..ws).filter(|&q| q != root).map(|q| all.get_f64(q * n + i)).collect();
                    let p = others[1..].iter().fold(others[0], |a, &b| combine(op, a, b).unwrap_or(a));
                    set_f64(t, i, combine(op, p, p).unwrap_or(p));
                }
            },
        )
    }
}

// ---------------------------------------------------------------- HCOLL: long as unsigned

/// open-mpi/ompi#10521 "HCOLL: Broken allreduce with MPI_MIN": Open MPI's hcoll component mapped
/// the signed `long` to HCOLL's unsigned integer type (the maintainers: "we incorrectly map
/// OPAL_DATATYPE_LONG to DTE_UNT32 ... -1 in the test must get casted to UNT32_MAX"). Here: i64
/// min / max compare as unsigned (the sign half of the bug; the width stays 64 bits), in
/// all_reduce, in- and out-of-place.
#[derive(Default)]
pub struct HcollLongAsUnsigned;
impl Bug for HcollLongAsUnsigned {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        minmax_other_sign(s, x, op, false, DType::I64, |v: i64| v as u64, |v: u64| v as i64)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        minmax_other_sign(s, x, op, true, DType::I64, |v: i64| v as u64, |v: u64| v as i64)
    }
}

/// The all_reduce (`in_place`: `all_reduce_`) of `x`, whose `min` / `max` of `dtype` (64-bit, so
/// no wider type can hold both readings) is taken over every rank's input read in the other
/// signedness (`as_other`, then `back`): the two bugs that follow. Other calls are left right.
fn minmax_other_sign<T: Element + Copy, U: Ord + 'static>(
    s: &Shm,
    x: &Buf,
    op: ReduceOp,
    in_place: bool,
    dtype: DType,
    as_other: fn(T) -> U,
    back: fn(U) -> T,
) -> Result<Work<Buf>> {
    let issue = || if in_place { s.inner.all_reduce_(x, op) } else { s.inner.all_reduce(x, op) };
    if s.inner.buffer_dtype(x) != dtype || !matches!(op, ReduceOp::Min | ReduceOp::Max) || s.numel(x) == 0 {
        return issue();
    }
    let (ws, max) = (s.ws(), op == ReduceOp::Max);
    with_gathered(s, x, issue, move |all, t| {
        let v: &[T] = all.as_slice();
        let n = t.numel();
        let out: &mut [T] = t.as_mut_slice();
        for (i, o) in out.iter_mut().enumerate() {
            let it = (0..ws).map(|q| as_other(v[q * n + i]));
            if let Some(m) = if max { it.max() } else { it.min() } {
                *o = back(m);
            }
        }
    })
}

// ---------------------------------------------------------------- MPICH: unsigned as signed

/// pmodels/mpich#6083 "bug: MPI_MIN and unsigned integer types" (also open-mpi/ompi#10648
/// "Incorrect result of unsigned integer MPI_MIN reductions"): MPI_MIN of MPI_UNSIGNED_LONG over
/// `[u64::MAX, 0]` returned `u64::MAX`, the unsigned values compared as signed. Here: u64 min /
/// max compare as i64, in all_reduce, in- and out-of-place.
#[derive(Default)]
pub struct UnsignedMinAsSigned;
impl Bug for UnsignedMinAsSigned {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        minmax_other_sign(s, x, op, false, DType::U64, |v: u64| v as i64, |v: i64| v as u64)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        minmax_other_sign(s, x, op, true, DType::U64, |v: u64| v as i64, |v: i64| v as u64)
    }
}

// ---------------------------------------------------------------- torchcomms Gloo: root zeros

/// meta-pytorch/torchcomms#477 "Fix reduce_scatter_v root rank not contributing input data": the
/// Gloo backend's reduce_scatter_v is one `gloo::reduce` per chunk, rooted at the chunk's owner,
/// and the root passed its output buffer as the reduce buffer without copying its input in, so it
/// contributed zeros. Concord has no `_v` reduce_scatter; reduce_scatter_tensor (out-of-place and
/// `_out`) stands in. Here: each rank's chunk is reduced over the other ranks and a zero, for
/// Gloo's ops (sum, product, min, max), at world size > 1.
#[derive(Default)]
pub struct GlooRsvRootZeros;
fn root_zeros(all: &Tensor, t: &mut Tensor, ws: usize, me: usize, op: ReduceOp) {
    let m = t.numel();
    let n = m * ws;
    for i in 0..m {
        let acc = (0..ws).filter(|&q| q != me).fold(0.0, |a, q| combine(op, a, all.get_f64(q * n + me * m + i)).unwrap_or(a));
        // The fold starts from the root's zero: product and min / max over a zero, as Gloo's was.
        set_f64(t, i, acc);
    }
}
impl GlooRsvRootZeros {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        s.ws() > 1 && s.numel(x) > 0 && matches!(op, ReduceOp::Sum | ReduceOp::Product | ReduceOp::Min | ReduceOp::Max)
    }
}
impl Bug for GlooRsvRootZeros {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let (ws, me) = (s.ws(), s.rank());
        with_gathered(s, x, || s.inner.reduce_scatter_tensor(x, op), move |all, t| root_zeros(all, t, ws, me, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let (ws, me) = (s.ws(), s.rank());
        with_gathered(s, x, || s.inner.reduce_scatter_tensor_out(x, op, out), move |all, t| root_zeros(all, t, ws, me, op))
    }
}

// ---------------------------------------------------------------- Open MPI: alltoallv displacements

/// open-mpi/ompi#9668 "Alltoall{,v,w} IN_PLACE fixes": the in-place alltoallv used alltoallw's
/// reading of `rdispls` (bytes) instead of alltoallv's (elements times the type's extent), so for
/// any type wider than a byte each source's block landed at `rdispls[j]` bytes, overwriting the
/// blocks before it. Concord has no in-place all_to_all; the path with explicit `output_splits`
/// (alltoallv) stands in. Here: with explicit output splits, an element type wider than a byte and
/// more than one rank, block `j` is written at byte offset `sum(output_splits[..j]) * row`
/// (elements, not bytes), in source order over the correct result.
#[derive(Default)]
pub struct AlltoallvDisplsAsBytes;
impl Bug for AlltoallvDisplsAsBytes {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let es = s.inner.buffer_dtype(x).size();
        let Some(o) = o.map(<[usize]>::to_vec) else { return Ok(w) };
        if s.ws() < 2 || es < 2 {
            return Ok(w);
        }
        let shape = s.inner.buffer_shape(x);
        let row: usize = shape.iter().skip(1).product();
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let right = t.bytes().to_vec();
                let mut from = 0;
                let mut disp = 0;
                for &rows in &o {
                    let len = rows * row * es;
                    let to = disp * row;
                    if len > 0 && to + len <= right.len() {
                        t.bytes_mut()[to..to + len].copy_from_slice(&right[from..from + len]);
                    }
                    from += len;
                    disp += rows;
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- Open MPI: allgather-reduce order

/// open-mpi/ompi#12258 "coll/base: correctly handle non-commutative ops in allgather-reduce
/// allreduce": the allgather-then-reduce allreduce reduced on each rank starting from its own
/// input ("Rank 1: 2 + 1 + 3 + 4"), so float sums differed between ranks ("This caused failures
/// in application benchmarks such as LAMMPS"). Here: float sum all_reduce (f32 in f32, f64 in
/// f64) at world size >= 3, each rank adding its own input first, then the others in rank order.
#[derive(Default)]
pub struct AllgatherReduceOwnFirst;
impl AllgatherReduceOwnFirst {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum && matches!(s.inner.buffer_dtype(x), DType::F32 | DType::F64) && s.ws() >= 3 && s.numel(x) > 0
    }
}
fn own_first(all: &Tensor, t: &mut Tensor, ws: usize, me: usize) {
    let n = t.numel();
    let order: Vec<usize> = std::iter::once(me).chain((0..ws).filter(|&q| q != me)).collect();
    match t.dtype() {
        DType::F32 => {
            let v: &[f32] = all.as_slice();
            let out: &mut [f32] = t.as_mut_slice();
            for (i, o) in out.iter_mut().enumerate() {
                *o = order[1..].iter().fold(v[me * n + i], |a, &q| a + v[q * n + i]);
            }
        }
        _ => {
            let v: &[f64] = all.as_slice();
            let out: &mut [f64] = t.as_mut_slice();
            for (i, o) in out.iter_mut().enumerate() {
                *o = order[1..].iter().fold(v[me * n + i], |a, &q| a + v[q * n + i]);
            }
        }
    }
}
// The gather is issued for every all_reduce at world size >= 3 (the one condition every rank
// shares in a bad-input case: one rank's other op or dtype must not leave it out of the gather,
// a wrapper artefact); the own-first sum is applied only where the bug fires.
impl Bug for AllgatherReduceOwnFirst {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.ws() < 3 {
            return s.inner.all_reduce(x, op);
        }
        let (ws, me, fires) = (s.ws(), s.rank(), Self::fires(s, x, op));
        with_gathered(
            s,
            x,
            || s.inner.all_reduce(x, op),
            move |all, t| {
                if fires {
                    own_first(all, t, ws, me)
                }
            },
        )
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.ws() < 3 {
            return s.inner.all_reduce_(x, op);
        }
        let (ws, me, fires) = (s.ws(), s.rank(), Self::fires(s, x, op));
        with_gathered(
            s,
            x,
            || s.inner.all_reduce_(x, op),
            move |all, t| {
                if fires {
                    own_first(all, t, ws, me)
                }
            },
        )
    }
}

// ---------------------------------------------------------------- MPICH: ibcast from a non-zero root

/// pmodels/mpich#4413 "coll: ibcast fails with root !=0 for sched_scatter_ring_allgather
/// pattern": MPI_Ibcast from a root other than 0 failed in MPI_Waitall when the scatter + ring
/// allgather schedule was chosen (MPICH picks it for long messages, >= 512 KiB, and for medium
/// ones, >= 12 KiB, at a world size that is not a power of two). Here: broadcast (both variants)
/// from a root other than 0 on that path completes, then its wait fails on every rank.
#[derive(Default)]
pub struct MpichIbcastNonzeroRoot;
impl MpichIbcastNonzeroRoot {
    fn fires(s: &Shm, x: &Buf, src: usize) -> bool {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        let ws = s.ws();
        src != 0 && src < ws && ws > 1 && (bytes >= 512 * 1024 || (bytes >= 12 * 1024 && !ws.is_power_of_two()))
    }
    fn failed(s: &Shm, w: Work<Buf>) -> Work<Buf> {
        s.then(w, |_, _| {
            Err(CollectiveError::Backend("MPI_Waitall: ibcast sched_scatter_ring_allgather from a non-zero root failed".into()))
        })
    }
}
impl Bug for MpichIbcastNonzeroRoot {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        Ok(if Self::fires(s, x, src) { Self::failed(s, w) } else { w })
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(x, src)?;
        Ok(if Self::fires(s, x, src) { Self::failed(s, w) } else { w })
    }
}

// ---------------------------------------------------------------- Gloo: first output only

/// pytorch/gloo#152 "New allreduce doesn't broadcast result in case of multiple outputs": "Only
/// the first output gets the result, the others remain unchanged." Gloo's several outputs are one
/// tensor's copies on several local buffers; Concord's nearest call with several outputs is the
/// coalesced all_reduce. Here: a coalesced all_reduce of more than one tensor writes the result
/// to the first only; the others keep their input.
#[derive(Default)]
pub struct GlooFirstOutputOnly;
fn first_only(s: &Shm, w: Work<Vec<Buf>>, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
    if xs.len() < 2 {
        return Ok(w);
    }
    let inputs = xs[1..].iter().map(|x| s.inner.download(x)).collect::<Result<Vec<_>>>()?;
    Ok(s.then(w, move |be, outs| {
        for (o, t) in outs[1..].iter().zip(&inputs) {
            be.write(o, t)?;
        }
        Ok(())
    }))
}
impl Bug for GlooFirstOutputOnly {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        first_only(s, w, xs)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        // Snapshot the inputs before the in-place op can write them.
        let inputs = if xs.len() < 2 { Vec::new() } else { xs[1..].iter().map(|x| s.inner.download(x)).collect::<Result<Vec<_>>>()? };
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        if xs.len() < 2 {
            return Ok(w);
        }
        Ok(s.then(w, move |be, outs| {
            for (o, t) in outs[1..].iter().zip(&inputs) {
                be.write(o, t)?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- Open MPI HAN: in-place segments

/// open-mpi/ompi#11488 "coll/han,base: correctly handle MPI_IN_PLACE": HAN's allreduce pipelines
/// segments through tasks t0..t3; t0 handled MPI_IN_PLACE, but "t1, t2 and t3 task did not follow
/// t0's example", so with MPI_IN_PLACE every segment after the first went wrong. Here: in-place
/// all_reduce longer than one HAN segment (65,536 bytes): elements after the first segment are
/// never reduced (they keep this rank's input), at world size > 1.
#[derive(Default)]
pub struct HanInPlaceLaterSegments;
const HAN_SEGMENT: usize = 64 * 1024;
impl Bug for HanInPlaceLaterSegments {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let es = s.inner.buffer_dtype(x).size();
        let n = s.numel(x);
        let seg = HAN_SEGMENT / es;
        if s.ws() < 2 || n <= seg {
            return s.inner.all_reduce_(x, op);
        }
        let input = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let from = seg * es;
                let end = t.len_bytes();
                t.bytes_mut()[from..end].copy_from_slice(&input.bytes()[from..end]);
            })
        }))
    }
}

// ---------------------------------------------------------------- libfabric shm: ops in flight

/// ofiwg/libfabric#5508 "prov/shm: functional issue with oneCCL test": oneCCL's benchmark starts a
/// bunch of allreduces, then completes them all; with the shm provider and a bunch of more than
/// one, results were wrong ("expected 6.000000, got 1.000000": a rank's own value), with one at a
/// time or another provider right. Here: an all_reduce issued while another all_reduce of the
/// communicator is still un-waited returns this rank's input (never reduced).
#[derive(Default)]
pub struct OfiShmConcurrentAllreduce {
    in_flight: Arc<AtomicUsize>,
}
/// One all_reduce in flight: counted until its work is waited or dropped.
struct InFlight(Arc<AtomicUsize>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
impl OfiShmConcurrentAllreduce {
    fn issue(&self, s: &Shm, x: &Buf, w: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let busy = self.in_flight.fetch_add(1, Ordering::SeqCst) > 0;
        let guard = InFlight(self.in_flight.clone());
        let input = if busy && s.ws() > 1 { Some(s.inner.download(x)?) } else { None };
        let w = w()?;
        Ok(s.then(w, move |be, out| {
            let _guard = guard;
            match input {
                Some(t) => be.write(out, &t),
                None => Ok(()),
            }
        }))
    }
}
impl Bug for OfiShmConcurrentAllreduce {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, || s.inner.all_reduce_(x, op))
    }
}

// ---------------------------------------------------------------- Horovod: allgather offsets

/// horovod/horovod#2204 "Fixed computation of the offset when using allgather_object": "When
/// running with `np > 2` this becomes an issue as the `size[2]` does not correspond to the
/// `offset[2]`": the variable-size gather (each rank's part a different length) placed part `i`
/// at an offset taken from one entry of the sizes instead of the running sum of the sizes before
/// it, right at two ranks only. Concord's variable-size receive is all_to_all_single with
/// `output_splits`. Here: at world size >= 3 with explicit output splits, source `j`'s block is
/// placed at `output_splits[j - 1]` rows (0 for the first), in source order over the result.
#[derive(Default)]
pub struct HorovodAllgatherOffset;
impl Bug for HorovodAllgatherOffset {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let Some(o) = o.map(<[usize]>::to_vec) else { return Ok(w) };
        if s.ws() < 3 {
            return Ok(w);
        }
        let es = s.inner.buffer_dtype(x).size();
        let row: usize = s.inner.buffer_shape(x).iter().skip(1).product::<usize>() * es;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let right = t.bytes().to_vec();
                let mut from = 0;
                for (j, &rows) in o.iter().enumerate() {
                    let len = rows * row;
                    let to = if j == 0 { 0 } else { o[j - 1] * row };
                    if len > 0 && to + len <= right.len() {
                        t.bytes_mut()[to..to + len].copy_from_slice(&right[from..from + len]);
                    }
                    from += len;
                }
            })
        }))
    }
}

/// The nineteenth hunt's mutants. Each catcher hint is the case that caught the mutant first in
/// its whole-catalogue run (docs/RESULTS.md, "A nineteenth hunt"); `wild_allgather_reduce_own_first`'s
/// is the case written for it.
pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<GlooAllgatherStoragePtr>(
            "wild_gloo_allgather_storage_ptr",
            "views",
            "pytorch/pytorch#20421 (fix #21490): ProcessGroupGloo all_gather reads a view input from its storage's start",
            &["views::all_gather_into_tensor::out::f32::ws2"],
        ),
        spec::<GlooAllgatherEmptySigfpe>(
            "wild_gloo_allgather_empty_sigfpe",
            "values.sizes",
            "pytorch/gloo#356, pytorch/pytorch#85234: all_gather of an empty tensor at ws > 1 dies (modulo by a zero count)",
            &["all_gather_into_tensor::out::i8::ws2"],
        ),
        spec::<LibnbcRingInPlace>(
            "wild_libnbc_ring_inplace",
            "values.reduce",
            "open-mpi/ompi#9385 (fix #9497): in-place ring all_reduce at ws >= 4 adds each received partial to itself",
            &["all_reduce::inplace::i8::sum::ws4"],
        ),
        spec::<LibnbcIreduceChainAlias>(
            "wild_libnbc_ireduce_chain_alias",
            "values.reduce",
            "open-mpi/ompi#2824: chain reduce (ws <= 4, >= 64 KiB) receives over the root's own contribution: root gets P op P",
            &["reduce::out::f32::sum::ws2::large_root0"],
        ),
        spec::<HcollLongAsUnsigned>(
            "wild_hcoll_long_as_unsigned",
            "values.reduce",
            "open-mpi/ompi#10521: hcoll maps signed long to an unsigned type: i64 min / max compare as unsigned",
            &["all_reduce::out::i64::min::ws2"],
        ),
        spec::<UnsignedMinAsSigned>(
            "wild_unsigned_min_as_signed",
            "values.reduce",
            "pmodels/mpich#6083, open-mpi/ompi#10648: MPI_MIN of unsigned long compares as signed: u64 min / max as i64",
            &["all_reduce::out::u64::min::ws2"],
        ),
        spec::<GlooRsvRootZeros>(
            "wild_gloo_rsv_root_zeros",
            "values.reduce",
            "meta-pytorch/torchcomms#477: Gloo reduce_scatter as per-chunk reduces whose root contributes zeros",
            &["reduce_scatter_tensor::out::i8::sum::ws2"],
        ),
        spec::<AlltoallvDisplsAsBytes>(
            "wild_alltoallv_displs_as_bytes",
            "values.move",
            "open-mpi/ompi#9668: alltoallv places each block at rdispls bytes, not rdispls elements",
            &["sizes::all_to_all_single::uneven::f32::grid::ws2"],
        ),
        spec::<AllgatherReduceOwnFirst>(
            "wild_allgather_reduce_own_first",
            "values.identical_on_every_rank",
            "open-mpi/ompi#12258: allgather-reduce allreduce sums own input first: float sums differ between ranks",
            &["identical::all_reduce::ws3"],
        ),
        spec::<MpichIbcastNonzeroRoot>(
            "wild_mpich_ibcast_nonzero_root",
            "values.sizes",
            "pmodels/mpich#4413: broadcast from a root != 0 on the scatter + ring allgather path fails at wait",
            &["sizes::broadcast::out::f32::grid::ws3", "reuse::no_late_write::broadcast::inplace::ws2"],
        ),
        spec::<GlooFirstOutputOnly>(
            "wild_gloo_first_output_only",
            "values.coalesced",
            "pytorch/gloo#152: an all_reduce with several outputs writes the result to the first only",
            &["all_reduce::coalesced::i8::sum::ws2"],
        ),
        spec::<HanInPlaceLaterSegments>(
            "wild_han_inplace_later_segments",
            "values.sizes",
            "open-mpi/ompi#11488: HAN in-place all_reduce: segments after the first 64 KiB are never reduced",
            &["all_reduce::inplace::f32::sum::ws2::large"],
        ),
        spec::<OfiShmConcurrentAllreduce>(
            "wild_ofi_shm_concurrent_allreduce",
            "async.result_final_after_wait",
            "ofiwg/libfabric#5508: an all_reduce issued while another is in flight returns this rank's input",
            &["async::many_outstanding_waited_out_of_order::ws2"],
        ),
        spec::<HorovodAllgatherOffset>(
            "wild_horovod_allgather_offset",
            "values.move",
            "horovod/horovod#2204: a variable-size gather places part j at one size entry, not the running sum (ws >= 3)",
            &["sizes::all_to_all_single::uneven::f32::grid::ws3"],
        ),
    ]
}
