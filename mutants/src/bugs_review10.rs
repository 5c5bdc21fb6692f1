//! The tenth review (helper review10, 2026-11-27): blind spots a read-only review of the
//! numerics, identical-results and bad-input clauses pointed at. Each bug was written here first
//! and run against the whole catalogue before any case was added (helper impl10).

use crate::bugs::flushed;
use crate::bugs_hunt7::HalfSumRoundedPerNodeGroup;
use crate::campaign::{spec, Spec};
use crate::Mutant;
use crate::{edit, lock, relay_wait, set_f64, Buf, Bug, Shm};
use concord_core::fused::{self, Gathered, Scaling};
use concord_core::{Backend, CollectiveError, Completion, DType, ReduceOp, Result, Tensor, Work};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

// ---------------------------------------------------------------- helpers

/// `x` (a float buffer) multiplied by `f` in f64, uploaded as an f64 buffer.
fn scaled_f64(s: &Shm, x: &Buf, f: f64) -> Result<Buf> {
    let t = s.inner.download(x)?;
    let v: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i) * f).collect();
    s.inner.upload(&Tensor::from_f64(DType::F64, t.shape(), &v))
}

/// Writes the f64 buffer `src` into `dst` (of `dtype`), rounded once.
fn convert(be: &concord_shm::ShmBackend, src: &Buf, dst: &Buf, dtype: DType) -> Result<()> {
    let v = be.download(src)?;
    be.write(dst, &Tensor::from_f64(dtype, v.shape(), &(0..v.numel()).map(|i| v.get_f64(i)).collect::<Vec<_>>()))
}

/// A float dtype's premul_sum factor, if `op` is premul_sum on a float buffer.
fn premul_factor(s: &Shm, x: &Buf, op: ReduceOp) -> Option<f64> {
    match op {
        ReduceOp::PremulSum(f) if s.inner.buffer_dtype(x).is_float() => Some(f),
        _ => None,
    }
}

// ---------------------------------------------------------------- 1. premul factors off all_reduce

/// Finding 1. premul_sum off all_reduce (reduce_scatter_tensor, `_out`, `_coalesced`, reduce,
/// all_reduce_coalesced and `_`) runs as NCCL's `ncclRedOpCreatePreMulSum`: each rank multiplies
/// its own input by its own factor (here in f64) and the ranks sum, rounded once. Right whenever
/// the factors agree; ranks that pass 2.0 and 0.5 get `Σ f_r x_r` instead of
/// `bad_input:reduce_op_mismatch` (FSDP2's gradient reduce-scatter path). The all_reduce version
/// is `premul_sum_factors_not_compared`. Clause `bad_input.named_everywhere`.
#[derive(Default)]
pub struct PremulFactorsNotComparedOffAllReduce;

impl PremulFactorsNotComparedOffAllReduce {
    fn list(s: &Shm, xs: &[Buf], f: f64, in_place: bool, reduce_scatter: bool) -> Result<Work<Vec<Buf>>> {
        let ys: Vec<Buf> = xs.iter().map(|x| scaled_f64(s, x, f)).collect::<Result<_>>()?;
        let w = if reduce_scatter {
            s.inner.reduce_scatter_tensor_coalesced(&ys, ReduceOp::Sum)?
        } else {
            s.inner.all_reduce_coalesced(&ys, ReduceOp::Sum)?
        };
        let dtypes: Vec<DType> = xs.iter().map(|x| s.inner.buffer_dtype(x)).collect();
        let outs: Vec<Buf> = if in_place {
            xs.to_vec()
        } else {
            w.peek().iter().zip(&dtypes).map(|(o, &d)| s.inner.alloc(d, &s.inner.buffer_shape(o))).collect::<Result<_>>()?
        };
        let targets = outs.clone();
        Ok(s.then_as(w, outs, move |be, sums| {
            for ((sum, out), &d) in sums.iter().zip(&targets).zip(&dtypes) {
                convert(be, sum, out, d)?;
            }
            Ok(())
        }))
    }
    /// `issue` (the op as a sum over the scaled f64 input), its result rounded into `out` (a new
    /// buffer of `x`'s dtype and the result's shape when `None`).
    fn one(s: &Shm, x: &Buf, f: f64, out: Option<&Buf>, issue: impl FnOnce(&Buf) -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        let w = issue(&scaled_f64(s, x, f)?)?;
        let out = match out {
            Some(o) => o.clone(),
            None => s.inner.alloc(d, &s.inner.buffer_shape(w.peek()))?,
        };
        let target = out.clone();
        Ok(s.then_as(w, out, move |be, sum| convert(be, sum, &target, d)))
    }
}

impl Bug for PremulFactorsNotComparedOffAllReduce {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match premul_factor(s, x, op) {
            Some(f) => Self::one(s, x, f, None, |y| s.inner.reduce_scatter_tensor(y, ReduceOp::Sum)),
            None => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        match premul_factor(s, x, op) {
            Some(f) => Self::one(s, x, f, Some(out), |y| s.inner.reduce_scatter_tensor(y, ReduceOp::Sum)),
            None => s.inner.reduce_scatter_tensor_out(x, op, out),
        }
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| premul_factor(s, x, op)) {
            Some(f) => Self::list(s, xs, f, false, true),
            None => s.inner.reduce_scatter_tensor_coalesced(xs, op),
        }
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        match premul_factor(s, x, op) {
            Some(f) => Self::one(s, x, f, None, |y| s.inner.reduce(y, ReduceOp::Sum, root)),
            None => s.inner.reduce(x, op, root),
        }
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| premul_factor(s, x, op)) {
            Some(f) => Self::list(s, xs, f, false, false),
            None => s.inner.all_reduce_coalesced(xs, op),
        }
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| premul_factor(s, x, op)) {
            Some(f) => Self::list(s, xs, f, true, false),
            None => s.inner.all_reduce_coalesced_(xs, op),
        }
    }
}

// ---------------------------------------------------------------- 2. a subgroup folds from its own input

/// `v` rounded to f32 (f64 unchanged).
fn in_dtype(d: DType, v: f64) -> f64 {
    if d == DType::F32 {
        v as f32 as f64
    } else {
        v
    }
}

/// Element `i` of every member's input (`all`: member `q`'s element `i` at `q * n + i`), folded
/// from member `me`'s value, then the others in rank order, each step rounded to `d`.
fn fold_from(d: DType, op: ReduceOp, all: &Tensor, ws: usize, me: usize, n: usize, i: usize) -> f64 {
    let term = |q: usize| {
        let v = all.get_f64(q * n + i);
        match op {
            ReduceOp::PremulSum(f) => in_dtype(d, v * f),
            _ => v,
        }
    };
    let acc = (0..ws).filter(|&q| q != me).fold(term(me), |acc, q| in_dtype(d, acc + term(q)));
    match op {
        ReduceOp::Avg => in_dtype(d, acc / ws as f64),
        _ => acc,
    }
}

/// Finding 2. On a subgroup of 3 or more members, f32 / f64 all_reduce (`sum`, `avg`,
/// `premul_sum`; every variant) runs as a fallback for sub-communicators: an all_gather over the
/// group, then each member folds locally starting from its OWN input (open-mpi/ompi#12258), each
/// step rounded to the dtype. Each member's result is within the oracle's bound; the members'
/// bits differ in the last place. The world's all_reduce is right. Clause
/// `values.identical_on_every_rank`.
#[derive(Default)]
pub struct SubgroupAllReduceFoldsFromOwnInput;

impl SubgroupAllReduceFoldsFromOwnInput {
    fn applies(s: &Shm, xs: &[Buf], op: ReduceOp) -> bool {
        s.in_subgroup()
            && s.ws() >= 3
            && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_))
            && !xs.is_empty()
            && xs.iter().all(|x| matches!(s.inner.buffer_dtype(x), DType::F32 | DType::F64))
    }
    fn run(s: &Shm, xs: &[Buf], op: ReduceOp, in_place: bool) -> Result<Work<Vec<Buf>>> {
        let g = s.inner.all_gather_into_tensor_coalesced(xs)?;
        let outs: Vec<Buf> = if in_place {
            xs.to_vec()
        } else {
            xs.iter().map(|x| s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))).collect::<Result<_>>()?
        };
        let (targets, ws, me) = (outs.clone(), s.ws(), s.rank());
        Ok(s.then_as(g, outs, move |be, gathered| {
            for (gb, out) in gathered.iter().zip(&targets) {
                let all = be.download(gb)?;
                edit(be, out, |t| {
                    let (d, n) = (t.dtype(), t.numel());
                    for i in 0..n {
                        set_f64(t, i, fold_from(d, op, &all, ws, me, n, i));
                    }
                })?;
            }
            Ok(())
        }))
    }
    fn single(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let w = Self::run(s, std::slice::from_ref(x), op, in_place)?;
        let out = w.peek()[0].clone();
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
}

impl Bug for SubgroupAllReduceFoldsFromOwnInput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if Self::applies(s, std::slice::from_ref(x), op) {
            Self::single(s, x, op, false)
        } else {
            s.inner.all_reduce(x, op)
        }
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if Self::applies(s, std::slice::from_ref(x), op) {
            Self::single(s, x, op, true)
        } else {
            s.inner.all_reduce_(x, op)
        }
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if Self::applies(s, xs, op) {
            Self::run(s, xs, op, false)
        } else {
            s.inner.all_reduce_coalesced(xs, op)
        }
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if Self::applies(s, xs, op) {
            Self::run(s, xs, op, true)
        } else {
            s.inner.all_reduce_coalesced_(xs, op)
        }
    }
}

// ---------------------------------------------------------------- 4. the scaling step flushes

fn scales(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Avg | ReduceOp::PremulSum(_)) && s.inner.buffer_dtype(x).is_float()
}

/// Finding 4. The `1/ws` of `avg` and the factor of `premul_sum` are applied by a separate
/// scaling kernel compiled with flush-to-zero: subnormal RESULTS of avg and premul_sum become
/// ±0 (every float dtype; all_reduce, all_reduce_, reduce_scatter_tensor, `_out`, reduce);
/// sum / min / max keep their subnormals. Clause `numerics.subnormal`.
#[derive(Default)]
pub struct ScaleStepFlushesSubnormals;

impl Bug for ScaleStepFlushesSubnormals {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(if scales(s, x, op) { flushed(s, w) } else { w })
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        Ok(if scales(s, x, op) { flushed(s, w) } else { w })
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        Ok(if scales(s, x, op) { flushed(s, w) } else { w })
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(if scales(s, x, op) { flushed(s, w) } else { w })
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        Ok(if scales(s, x, op) { flushed(s, w) } else { w })
    }
}

// ---------------------------------------------------------------- 5. the coalesced kernel flushes

/// The smallest positive normal value of a float dtype.
fn min_normal(d: DType) -> f64 {
    match d {
        DType::F16 => 6.103515625e-5,
        DType::F64 => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    }
}

/// `w` with the subnormal values of every (float) result flushed to ±0.
fn flushed_list(s: &Shm, w: Work<Vec<Buf>>) -> Work<Vec<Buf>> {
    s.then(w, |be, outs| {
        for out in outs {
            if !be.buffer_dtype(out).is_float() {
                continue;
            }
            edit(be, out, |t| {
                let tiny = min_normal(t.dtype());
                for i in 0..t.numel() {
                    let v = t.get_f64(i);
                    if v != 0.0 && v.abs() < tiny {
                        set_f64(t, i, 0.0f64.copysign(v));
                    }
                }
            })?;
        }
        Ok(())
    })
}

/// Finding 5. all_reduce_coalesced and all_reduce_coalesced_ reduce through a fusion-buffer
/// kernel built with flush-to-zero: every subnormal result becomes ±0 (every op, every float
/// dtype); the single-tensor calls keep subnormals. Clause `numerics.subnormal`.
#[derive(Default)]
pub struct CoalescedFusionFlushesSubnormals;

impl Bug for CoalescedFusionFlushesSubnormals {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(flushed_list(s, s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(flushed_list(s, s.inner.all_reduce_coalesced_(xs, op)?))
    }
}

/// Finding 5, its second half. The coalesced fusion kernel's min / max fold from the rank's own
/// value and compare with `<` on floats, so `-0` and `+0` are equal and a rank whose own value
/// is a zero keeps its zero: `min(+0, -0)` is `+0` on the rank holding `+0` (the contract orders
/// `-0 < +0`). The single-tensor calls are right. Clause `numerics.subnormal` (its signed-zero
/// order).
#[derive(Default)]
pub struct CoalescedMinMaxKeepsOwnZero;

impl CoalescedMinMaxKeepsOwnZero {
    fn run(s: &Shm, xs: &[Buf], op: ReduceOp, in_place: bool) -> Result<Work<Vec<Buf>>> {
        let w = if in_place { s.inner.all_reduce_coalesced_(xs, op)? } else { s.inner.all_reduce_coalesced(xs, op)? };
        if !matches!(op, ReduceOp::Min | ReduceOp::Max) {
            return Ok(w);
        }
        // The rank's own values, as the kernel's first operand (copied at issue: in place, the
        // buffer is overwritten).
        let own: Vec<Option<Tensor>> = xs
            .iter()
            .map(|x| if s.inner.buffer_dtype(x).is_float() { s.inner.download(x).map(Some) } else { Ok(None) })
            .collect::<Result<_>>()?;
        Ok(s.then(w, move |be, outs| {
            for (mine, out) in own.iter().zip(outs) {
                let Some(mine) = mine else { continue };
                edit(be, out, |t| {
                    for i in 0..t.numel().min(mine.numel()) {
                        if t.get_f64(i) == 0.0 && mine.get_f64(i) == 0.0 {
                            set_f64(t, i, mine.get_f64(i));
                        }
                    }
                })?;
            }
            Ok(())
        }))
    }
}

impl Bug for CoalescedMinMaxKeepsOwnZero {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::run(s, xs, op, false)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::run(s, xs, op, true)
    }
}

// ---------------------------------------------------------------- 6. a subgroup's rooted ops

/// Finding 6. A subgroup's rooted ops take a group fallback: broadcast as an all_gather over the
/// group and the chunk of the root each member named, gather as an all_gather, reduce as an
/// all_reduce. The roots are never compared, and a root is checked against the WORLD's size: a
/// root inside the world but outside the group wraps (`root % group size`). A root outside the
/// world is refused as shm refuses it. The world's rooted ops are right. Clauses
/// `bad_input.root_agreement`, `bad_input.named_everywhere`.
#[derive(Default)]
pub struct SubgroupRootedOpsGroupFallback;

impl SubgroupRootedOpsGroupFallback {
    /// The root the fallback uses, when it applies.
    fn root(s: &Shm, root: usize) -> Option<usize> {
        (s.in_subgroup() && root < s.world_size).then(|| root % s.ws())
    }
    fn broadcast_from(s: &Shm, x: &Buf, root: usize, in_place: bool) -> Result<Work<Buf>> {
        let g = s.inner.all_gather_into_tensor(x)?;
        let out = if in_place { x.clone() } else { s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))? };
        let target = out.clone();
        Ok(s.then_as(g, out, move |be, gathered| {
            let all = be.download(gathered)?;
            let chunk = all.len_bytes() / be.world_size();
            let mut t = be.download(&target)?;
            crate::copy_bytes(&mut t, 0, &all, root * chunk, chunk);
            be.write(&target, &t)
        }))
    }
}

impl Bug for SubgroupRootedOpsGroupFallback {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        match Self::root(s, src) {
            Some(r) => Self::broadcast_from(s, x, r, false),
            None => s.inner.broadcast(x, src),
        }
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        match Self::root(s, src) {
            Some(r) => Self::broadcast_from(s, x, r, true),
            None => s.inner.broadcast_(x, src),
        }
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        match Self::root(s, root) {
            Some(_) => s.inner.all_gather_into_tensor(x),
            None => s.inner.gather(x, root),
        }
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        match Self::root(s, root) {
            Some(_) => s.inner.all_reduce(x, op),
            None => s.inner.reduce(x, op, root),
        }
    }
}

// ---------------------------------------------------------------- 7. f64 scaled in f32

/// Finding 7. Off the out-of-place all_reduce and reduce_scatter_tensor (all_reduce_,
/// all_reduce_coalesced and `_`, reduce_scatter_tensor_out and `_coalesced`), the f64 `avg` /
/// `premul_sum` scale runs in a kernel shared with f32: the result is
/// `((sum as f32) * (s as f32)) as f64`. Exact on small integers and exact factors (0.5, 3.0),
/// wrong in the 30th bit elsewhere. Clauses `numerics.premul_sum`, `values.reduce`.
#[derive(Default)]
pub struct F64ScaleInF32OffOutOfPlace;

impl F64ScaleInF32OffOutOfPlace {
    /// The scale of `op` on an f64 buffer at `ws` ranks, if it scales.
    fn scale(s: &Shm, x: &Buf, op: ReduceOp) -> Option<f64> {
        if s.inner.buffer_dtype(x) != DType::F64 {
            return None;
        }
        match op {
            ReduceOp::Avg => Some(1.0 / s.ws() as f64),
            ReduceOp::PremulSum(f) => Some(f),
            _ => None,
        }
    }
    fn rescale(be: &concord_shm::ShmBackend, out: &Buf, f: f64) -> Result<()> {
        edit(be, out, |t| {
            for i in 0..t.numel() {
                set_f64(t, i, ((t.get_f64(i) as f32) * (f as f32)) as f64);
            }
        })
    }
    fn one(s: &Shm, w: Work<Buf>, f: f64) -> Work<Buf> {
        s.then(w, move |be, out| Self::rescale(be, out, f))
    }
    fn list(s: &Shm, w: Work<Vec<Buf>>, f: f64) -> Work<Vec<Buf>> {
        s.then(w, move |be, outs| outs.iter().try_for_each(|o| Self::rescale(be, o, f)))
    }
}

impl Bug for F64ScaleInF32OffOutOfPlace {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::scale(s, x, op) {
            Some(f) => Ok(Self::one(s, s.inner.all_reduce_(x, ReduceOp::Sum)?, f)),
            None => s.inner.all_reduce_(x, op),
        }
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| Self::scale(s, x, op)) {
            Some(f) => Ok(Self::list(s, s.inner.all_reduce_coalesced(xs, ReduceOp::Sum)?, f)),
            None => s.inner.all_reduce_coalesced(xs, op),
        }
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| Self::scale(s, x, op)) {
            Some(f) => Ok(Self::list(s, s.inner.all_reduce_coalesced_(xs, ReduceOp::Sum)?, f)),
            None => s.inner.all_reduce_coalesced_(xs, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        match Self::scale(s, x, op) {
            Some(f) => Ok(Self::one(s, s.inner.reduce_scatter_tensor_out(x, ReduceOp::Sum, out)?, f)),
            None => s.inner.reduce_scatter_tensor_out(x, op, out),
        }
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        match xs.first().and_then(|x| Self::scale(s, x, op)) {
            Some(f) => Ok(Self::list(s, s.inner.reduce_scatter_tensor_coalesced(xs, ReduceOp::Sum)?, f)),
            None => s.inner.reduce_scatter_tensor_coalesced(xs, op),
        }
    }
}

// ---------------------------------------------------------------- 8. one error flag per communicator

/// A pending work's poison: the bad-input error a later call of the communicator failed with.
type Poison = Arc<Mutex<Option<CollectiveError>>>;

/// The communicator's pending works' poisons, oldest first (weak: a dropped work is forgotten).
type Pending = Arc<Mutex<Vec<Weak<Mutex<Option<CollectiveError>>>>>>;

/// Finding 8. One error flag per communicator (NCCL's async-error style): when a call is refused
/// as bad input (at issue or at its wait), every work issued before it and not yet waited fails
/// with the same `bad_input` error, so a valid all_reduce A issued before a mismatched B returns
/// B's `shape_mismatch`. The communicator is fine afterwards. Clause `bad_input.named_everywhere`.
#[derive(Default)]
pub struct BadInputPoisonsPendingWorks {
    /// The works issued and not yet waited, oldest first.
    pending: Pending,
}

/// The completion of a work that fails with its poison once set.
struct Poisonable<T> {
    inner: Work<T>,
    /// Set once this work was waited to the end (it is no longer pending).
    poison: Poison,
    pending: Pending,
}

/// Poisons with `e` every pending work issued before `failed` (every pending work when `failed`
/// is not pending: a call refused at issue), and forgets them and `failed`.
fn poison_earlier(pending: &Mutex<Vec<Weak<Mutex<Option<CollectiveError>>>>>, failed: &Poison, e: &CollectiveError) {
    let mut pending = lock(pending);
    let at = pending.iter().position(|p| p.upgrade().is_some_and(|p| Arc::ptr_eq(&p, failed))).map_or(pending.len(), |i| i + 1);
    for p in pending.drain(..at) {
        if let Some(p) = p.upgrade() {
            if !Arc::ptr_eq(&p, failed) {
                lock(&p).get_or_insert_with(|| e.clone());
            }
        }
    }
}

impl<T: Send + Sync> Completion for Poisonable<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let done = relay_wait(&self.inner, timeout, |e| {
            if e.bad_input_kind().is_some() {
                poison_earlier(&self.pending, &self.poison, e);
            }
        })?;
        if done {
            lock(&self.pending).retain(|p| p.upgrade().is_some_and(|p| !Arc::ptr_eq(&p, &self.poison)));
            if let Some(e) = lock(&self.poison).clone() {
                return Err(e);
            }
        }
        Ok(done)
    }
}

impl BadInputPoisonsPendingWorks {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, issued: Result<Work<T>>) -> Result<Work<T>> {
        let w = match issued {
            Ok(w) => w,
            Err(e) => {
                if e.bad_input_kind().is_some() {
                    poison_earlier(&self.pending, &Arc::new(Mutex::new(None)), &e);
                }
                return Err(e);
            }
        };
        let poison: Poison = Arc::new(Mutex::new(None));
        lock(&self.pending).push(Arc::downgrade(&poison));
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        Ok(s.relayed(value, Arc::new(Poisonable { inner: w, poison, pending: self.pending.clone() }), meta))
    }
}

impl Bug for BadInputPoisonsPendingWorks {
    // The fused ops run as the seed's decomposition over shm itself: a decomposition over this
    // wrapper would hand its relayed works to a counter `outstanding` does not report (an
    // artefact of the wrapper, not the bug).
    fused_on_shm!();
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, s.inner.all_reduce_(x, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.wrap(s, s.inner.all_gather_into_tensor(x))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, s.inner.reduce_scatter_tensor(x, op))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.wrap(s, s.inner.broadcast(x, src))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<PremulFactorsNotComparedOffAllReduce>(
            "review10_premul_factors_not_compared_off_all_reduce",
            "bad_input.named_everywhere",
            "premul_sum off all_reduce (reduce_scatter, _out, _coalesced, reduce, all_reduce_coalesced) pre-multiplies each rank's input by its own factor: differing factors accepted",
            &["bad_input::reduce_scatter_premul_sum_factor_mismatch::ws3"],
        ),
        spec::<SubgroupAllReduceFoldsFromOwnInput>(
            "review10_subgroup_all_reduce_folds_from_own_input",
            "values.identical_on_every_rank",
            "on a subgroup of 3+ members, f32 / f64 all_reduce gathers and each member folds from its own input: bits differ across members",
            &["identical::subgroup::ws5"],
        ),
        spec::<HalfSumRoundedPerNodeGroup<8>>(
            "review10_half_sum_rounded_per_node_group_of_8",
            "numerics.round_once",
            "f16 / bf16 all_reduce sum on more than 8 ranks rounds each group of 8 ranks' partial to the dtype, then the sum of the partials",
            &["numerics::round_once::spread::f16::ws16"],
        ),
        spec::<ScaleStepFlushesSubnormals>(
            "review10_scale_step_flushes_subnormals",
            "numerics.subnormal",
            "avg / premul_sum scale in a flush-to-zero kernel: their subnormal results become zero (sum / min / max keep them)",
            &["numerics::subnormal::f32::ws2"],
        ),
        spec::<CoalescedFusionFlushesSubnormals>(
            "review10_coalesced_fusion_flushes_subnormals",
            "numerics.subnormal",
            "all_reduce_coalesced / _ reduce through a flush-to-zero fusion kernel: subnormal results become zero",
            &["numerics::subnormal::all_reduce_coalesced::f32::ws2"],
        ),
        spec::<CoalescedMinMaxKeepsOwnZero>(
            "review10_coalesced_minmax_keeps_own_zero",
            "numerics.subnormal",
            "all_reduce_coalesced / _ min / max fold from the rank's own value and treat -0 and +0 as equal: a rank keeps its own zero",
            &["numerics::subnormal::all_reduce_coalesced::f32::ws2"],
        ),
        spec::<SubgroupRootedOpsGroupFallback>(
            "review10_subgroup_rooted_ops_group_fallback",
            "bad_input.root_agreement",
            "a subgroup's broadcast / gather / reduce run as all_gather / all_reduce: roots never compared, a root outside the group wraps",
            &["bad_input::subgroup::rooted::ws4"],
        ),
        spec::<F64ScaleInF32OffOutOfPlace>(
            "review10_f64_scale_in_f32_off_out_of_place",
            "numerics.premul_sum",
            "f64 avg / premul_sum off out-of-place all_reduce / reduce_scatter scale in f32: ((sum as f32) * (s as f32)) as f64",
            &["numerics::premul_sum::all_reduce_inplace::f64::ws3"],
        ),
        spec::<BadInputPoisonsPendingWorks>(
            "review10_bad_input_poisons_pending_works",
            "bad_input.named_everywhere",
            "a call refused as bad input fails every earlier un-waited work with the same error (one error flag per communicator)",
            &["bad_input::shape_mismatch_behind_pending::ws2"],
        ),
    ]
}
