//! Mutants written from outside the catalogue, aimed where its cases looked thin (dtype-specific
//! kernels, the NaN policy off the out-of-place all_reduce, mixed-dtype coalesced lists, views of
//! 8-byte dtypes, empty tensors, state carried between calls, ops in flight together, rooted ops
//! at a root other than the last rank). Each is a bug a backend author could ship, over the
//! correct shm backend; see the campaign table for the case that catches each.

use crate::campaign::Spec;
use crate::{copy_bytes, edit, Buf, Bug, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// `t`'s values converted to `dtype` (through f64, as a cast kernel does).
fn converted(t: &Tensor, dtype: DType) -> Tensor {
    let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
    Tensor::from_f64(dtype, t.shape(), &vals)
}

/// A new buffer holding `x`'s values converted to `dtype`.
fn upload_as(s: &Shm, x: &Buf, dtype: DType) -> Result<Buf> {
    s.inner.upload(&converted(&s.inner.download(x)?, dtype))
}

/// Writes `src`'s values, converted to `dst`'s dtype, into `dst`.
fn write_converted(be: &concord_shm::ShmBackend, src: &Buf, dst: &Buf) -> Result<()> {
    let t = be.download(src)?;
    be.write(dst, &converted(&t, be.buffer_dtype(dst)))
}

/// Float min / max kernel of the `acc = ±inf; if x > acc { acc = x }` kind: NaN never wins
/// (and NaN on every rank gives the initial ±inf). `t` is edited so that the correct kernel
/// computes that: NaN replaced by the op's identity.
fn nan_to_identity(t: &mut Tensor, op: ReduceOp) {
    let id = if op == ReduceOp::Max { f64::NEG_INFINITY } else { f64::INFINITY };
    for i in 0..t.numel() {
        if t.get_f64(i).is_nan() {
            crate::set_f64(t, i, id);
        }
    }
}

fn is_float_minmax(dtype: DType, op: ReduceOp) -> bool {
    dtype.is_float() && matches!(op, ReduceOp::Min | ReduceOp::Max)
}

// ---------------------------------------------------------------- dtype-specific kernels

/// f64 `min` / `max` of `all_reduce` go through the f32 kernel (the min / max kernel family was
/// only instantiated for 4-byte floats): f64 values not exact in f32 come back rounded.
#[derive(Default)]
pub struct F64MinMaxThroughF32;

impl Bug for F64MinMaxThroughF32 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.inner.buffer_dtype(x) != DType::F64 || !matches!(op, ReduceOp::Min | ReduceOp::Max) {
            return s.inner.all_reduce(x, op);
        }
        let narrow = upload_as(s, x, DType::F32)?;
        let w = s.inner.all_reduce(&narrow, op)?;
        let out = s.inner.alloc(DType::F64, &s.inner.buffer_shape(x))?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| write_converted(be, r, &o)))
    }
}

/// bf16 / f16 `premul_sum` rounds its factor to the tensor's dtype before multiplying (the
/// scalar is passed to the kernel in the element type, as NCCL's `ncclRedOpCreatePreMulSum`
/// takes it).
#[derive(Default)]
pub struct PremulFactorInDtype;

impl Bug for PremulFactorInDtype {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        match op {
            ReduceOp::PremulSum(f) if matches!(d, DType::F16 | DType::BF16) => {
                let rounded = Tensor::from_f64(d, &[1], &[f]).get_f64(0);
                s.inner.all_reduce(x, ReduceOp::PremulSum(rounded))
            }
            _ => s.inner.all_reduce(x, op),
        }
    }
}

// ---------------------------------------------------------------- NaN off the main path

/// `reduce_scatter_tensor`'s float min / max kernel lets NaN lose (declared: NaN propagates).
#[derive(Default)]
pub struct ReduceScatterMinMaxDropsNan;

impl Bug for ReduceScatterMinMaxDropsNan {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !is_float_minmax(s.inner.buffer_dtype(x), op) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let mut t = s.inner.download(x)?;
        nan_to_identity(&mut t, op);
        s.inner.reduce_scatter_tensor(&s.inner.upload(&t)?, op)
    }
}

/// In-place `all_reduce_`'s float min / max (a separate in-place kernel) lets NaN lose.
#[derive(Default)]
pub struct InplaceMinMaxDropsNan;

impl Bug for InplaceMinMaxDropsNan {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if is_float_minmax(s.inner.buffer_dtype(x), op) {
            edit(&s.inner, x, |t| nan_to_identity(t, op))?;
        }
        s.inner.all_reduce_(x, op)
    }
}

// ---------------------------------------------------------------- coalesced lists of mixed dtypes

/// The dtype every tensor of `xs` is moved in when the list mixes dtypes (the first's), or `None`.
fn mixed_first(s: &Shm, xs: &[Buf]) -> Option<DType> {
    let first = s.inner.buffer_dtype(xs.first()?);
    xs.iter().any(|x| s.inner.buffer_dtype(x) != first).then_some(first)
}

/// `w` (the results of a coalesced call on converted inputs) mapped to new buffers of the
/// original dtypes `dtypes`, filled by converting back.
fn converted_back(s: &Shm, w: Work<Vec<Buf>>, dtypes: Vec<DType>) -> Result<Work<Vec<Buf>>> {
    let outs: Vec<Buf> = w.peek().iter().zip(&dtypes).map(|(r, &d)| s.inner.alloc(d, &s.inner.buffer_shape(r))).collect::<Result<_>>()?;
    let o = outs.clone();
    Ok(s.then_as(w, outs, move |be, rs| rs.iter().zip(&o).try_for_each(|(r, o)| write_converted(be, r, o))))
}

/// `all_gather_into_tensor_coalesced` of a list mixing dtypes packs it into one flat buffer of
/// the first tensor's dtype: every other tensor is moved as that dtype and converted back.
#[derive(Default)]
pub struct AllGatherCoalescedMixedAsFirst;

impl Bug for AllGatherCoalescedMixedAsFirst {
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let Some(first) = mixed_first(s, xs) else { return s.inner.all_gather_into_tensor_coalesced(xs) };
        let conv: Vec<Buf> = xs.iter().map(|x| upload_as(s, x, first)).collect::<Result<_>>()?;
        let w = s.inner.all_gather_into_tensor_coalesced(&conv)?;
        converted_back(s, w, xs.iter().map(|x| s.inner.buffer_dtype(x)).collect())
    }
}

/// `reduce_scatter_tensor_coalesced` of a list mixing dtypes reduces every tensor in the first
/// tensor's dtype.
#[derive(Default)]
pub struct ReduceScatterCoalescedMixedAsFirst;

impl Bug for ReduceScatterCoalescedMixedAsFirst {
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let Some(first) = mixed_first(s, xs) else { return s.inner.reduce_scatter_tensor_coalesced(xs, op) };
        let conv: Vec<Buf> = xs.iter().map(|x| upload_as(s, x, first)).collect::<Result<_>>()?;
        let w = s.inner.reduce_scatter_tensor_coalesced(&conv, op)?;
        converted_back(s, w, xs.iter().map(|x| s.inner.buffer_dtype(x)).collect())
    }
}

/// `reduce_scatter_tensor_coalesced` leaves the last tensor's result unreduced: this rank's own
/// chunk of its input (the loop over the list stops one short).
#[derive(Default)]
pub struct ReduceScatterCoalescedDropsLast;

impl Bug for ReduceScatterCoalescedDropsLast {
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
        let (Some(last), rank) = (xs.last().cloned(), s.rank()) else { return Ok(w) };
        Ok(s.then(w, move |be, outs| {
            let input = be.download(&last)?;
            let out = outs.last().expect("one result per input");
            edit(be, out, |t| {
                let n = t.len_bytes();
                copy_bytes(t, 0, &input, rank * n, n)
            })
        }))
    }
}

// ---------------------------------------------------------------- views, empty tensors

/// The 8-byte dtypes (f64 / i64 / u64) take a 64-bit all_reduce path that is given the storage's
/// base pointer: an input view at an offset is read from its parent's start.
#[derive(Default)]
pub struct EightByteViewReadAtBase;

impl Bug for EightByteViewReadAtBase {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match s.view_of(x) {
            Some((parent, off)) if off > 0 && s.inner.buffer_dtype(x).size() == 8 => {
                s.inner.all_reduce(&s.inner.view(&parent, 0, &s.inner.buffer_shape(x))?, op)
            }
            _ => s.inner.all_reduce(x, op),
        }
    }
}

/// An `all_reduce` of zero elements returns at once without talking to the peers (there is
/// nothing to reduce): a rank whose tensor is empty never learns that a peer's is not.
#[derive(Default)]
pub struct EmptyAllReduceSkipsPeers;

impl Bug for EmptyAllReduceSkipsPeers {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.numel(x) > 0 {
            return s.inner.all_reduce(x, op);
        }
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))?;
        Ok(s.done(out, "all_reduce"))
    }
}

// ---------------------------------------------------------------- roots

/// The gather root appends its own chunk after the peers' (received chunks are packed in arrival
/// order, the local copy last): right when the root is the last rank.
#[derive(Default)]
pub struct GatherRootChunkLast;

impl Bug for GatherRootChunkLast {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.gather(x, root)?;
        let (me, ws) = (s.rank(), s.ws());
        if me != root || root + 1 == ws {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let chunk = t.len_bytes() / ws;
                let orig = t.clone();
                // Chunks root+1.. move down one place; the root's own goes last.
                for c in root + 1..ws {
                    copy_bytes(t, (c - 1) * chunk, &orig, c * chunk, chunk);
                }
                copy_bytes(t, (ws - 1) * chunk, &orig, root * chunk, chunk);
            })
        }))
    }
}

// ---------------------------------------------------------------- state carried between calls

/// Out-of-place `broadcast`'s root sends from a staging copy registered once per (address,
/// dtype, numel): a source buffer reused with new contents sends its first contents again.
#[derive(Default)]
pub struct BroadcastStagedOnce {
    staged: Mutex<HashMap<(usize, DType, usize), Buf>>,
}

impl Bug for BroadcastStagedOnce {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if s.rank() != src {
            return s.inner.broadcast(x, src);
        }
        let dtype = s.inner.buffer_dtype(x);
        let key = (s.inner.buffer_addr(x), dtype, s.numel(x));
        let staged = {
            let mut m = self.staged.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(&key) {
                Some(b) => b.clone(),
                None => {
                    let b = s.inner.upload(&s.inner.download(x)?)?;
                    m.insert(key, b.clone());
                    b
                }
            }
        };
        s.inner.broadcast(&staged, src)
    }
}

/// A buffer's (dtype, shape): what a shape-keyed cache looks up.
type ShapeKey = (DType, Vec<usize>);
/// all_to_all's (output, input) split sizes.
type Splits = (Option<Vec<usize>>, Option<Vec<usize>>);

/// `all_to_all_single` caches its transfer plan (the split sizes) per (dtype, input shape): a
/// later call of the same shape with other splits moves rows by the first call's plan.
#[derive(Default)]
pub struct AllToAllPlanCachedByShape {
    plans: Mutex<HashMap<ShapeKey, Splits>>,
}

impl Bug for AllToAllPlanCachedByShape {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let (o, i) = self
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert_with(|| (o.map(<[usize]>::to_vec), i.map(<[usize]>::to_vec)))
            .clone();
        s.inner.all_to_all_single(x, o.as_deref(), i.as_deref())
    }
}

/// Back-to-back `all_gather_into_tensor`s of one (dtype, shape) are bucketed: while one is in
/// flight (issued, not yet waited), a second of the same shape is answered from the first's
/// output (the bucket's demultiplexing keys results by shape).
#[derive(Default)]
pub struct InFlightAllGathersMerged {
    pending: Arc<Mutex<HashMap<ShapeKey, Buf>>>,
}

impl Bug for InFlightAllGathersMerged {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let w = s.inner.all_gather_into_tensor(x)?;
        let earlier = {
            let mut m = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(&key) {
                Some(b) => Some(b.clone()),
                None => {
                    m.insert(key.clone(), w.peek().clone());
                    None
                }
            }
        };
        match earlier {
            // The second of the bucket: the first's result (final once this one completes: shm
            // completes in issue order).
            Some(first) => Ok(s.then(w, move |be, out| be.write(out, &be.download(&first)?))),
            None => {
                let pending = self.pending.clone();
                Ok(s.then(w, move |_, _| {
                    pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    Ok(())
                }))
            }
        }
    }
}

/// Integer `min` / `max` in-place `all_reduce_` of 1-byte dtypes leaves the first element as this
/// rank's input: the vector loop starts at element 1 after a misaligned-head peel that forgets
/// to store.
#[derive(Default)]
pub struct ByteInplaceMaxHeadNotStored;

impl Bug for ByteInplaceMaxHeadNotStored {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if d.size() != 1 || !matches!(op, ReduceOp::Max | ReduceOp::Min) || s.numel(x) == 0 {
            return s.inner.all_reduce_(x, op);
        }
        let head = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| edit(be, out, |t| copy_bytes(t, 0, &head, 0, 1))))
    }
}

/// How many ranks the half-precision all_reduce path stages (one slot per rank).
const HALF_SLOTS: usize = 8;

/// bf16 / f16 `all_reduce` `sum` stages the ranks' inputs in [`HALF_SLOTS`] fixed slots: at a
/// world above 8 ranks, the ranks past the last slot are left out of the sum.
#[derive(Default)]
pub struct HalfSumDropsRanksAbove8;

impl Bug for HalfSumDropsRanksAbove8 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if s.ws() <= HALF_SLOTS || op != ReduceOp::Sum || !matches!(d, DType::F16 | DType::BF16) || s.rank() < HALF_SLOTS {
            return s.inner.all_reduce(x, op);
        }
        s.inner.all_reduce(&s.inner.upload(&Tensor::zeros(d, &s.inner.buffer_shape(x)))?, op)
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<F64MinMaxThroughF32>(
            "f64_min_max_through_f32",
            "values.reduce",
            "f64 min / max of all_reduce run through the f32 kernel: values not exact in f32 come back rounded",
            &["all_reduce::out::f64::min::ws2::random", "numerics::subnormal::f64"],
        ),
        spec::<PremulFactorInDtype>(
            "premul_factor_in_dtype",
            "numerics.premul_sum",
            "f16 / bf16 premul_sum rounds its factor to the tensor's dtype before multiplying",
            &["numerics::premul_sum"],
        ),
        spec::<ReduceScatterMinMaxDropsNan>(
            "reduce_scatter_min_max_drops_nan",
            "numerics.subnormal",
            "reduce_scatter_tensor float min / max lets NaN lose (declared: NaN propagates)",
            &["numerics::nan_minmax::reduce_scatter"],
        ),
        spec::<InplaceMinMaxDropsNan>(
            "inplace_min_max_drops_nan",
            "numerics.subnormal",
            "in-place all_reduce_ float min / max lets NaN lose (declared: NaN propagates)",
            &["numerics::nan_minmax::all_reduce_inplace"],
        ),
        spec::<AllGatherCoalescedMixedAsFirst>(
            "all_gather_coalesced_mixed_as_first",
            "values.coalesced",
            "all_gather_into_tensor_coalesced of mixed dtypes moves every tensor as the first tensor's dtype",
            &["all_gather_into_tensor::coalesced::mixed_dtypes"],
        ),
        spec::<ReduceScatterCoalescedMixedAsFirst>(
            "reduce_scatter_coalesced_mixed_as_first",
            "values.coalesced",
            "reduce_scatter_tensor_coalesced of mixed dtypes reduces every tensor in the first tensor's dtype",
            &["reduce_scatter_tensor::coalesced::mixed_dtypes"],
        ),
        spec::<ReduceScatterCoalescedDropsLast>(
            "reduce_scatter_coalesced_drops_last",
            "values.coalesced",
            "reduce_scatter_tensor_coalesced leaves the last tensor unreduced (this rank's own input chunk)",
            &["reduce_scatter_tensor::coalesced"],
        ),
        spec::<EightByteViewReadAtBase>(
            "eight_byte_view_read_at_base",
            "views",
            "all_reduce of 8-byte dtypes reads an input view at an offset from its parent's start",
            &["views::all_reduce::out::f64"],
        ),
        spec::<EmptyAllReduceSkipsPeers>(
            "empty_all_reduce_skips_peers",
            "bad_input.named_everywhere",
            "all_reduce of zero elements returns at once without the peers: a peer's non-empty shape is never compared",
            &["bad_input::all_reduce_shape_mismatch_one_empty"],
        ),
        spec::<GatherRootChunkLast>(
            "gather_root_chunk_last",
            "values.move",
            "the gather root puts its own chunk after the peers' (right only when the root is the last rank)",
            &["async::pending_until_peers_arrive::gather"],
        ),
        spec::<BroadcastStagedOnce>(
            "broadcast_staged_once",
            "placement.reuse",
            "broadcast's root sends from a staging copy made once per (address, dtype, numel)",
            &["broadcast::out::", "reuse::"],
        ),
        spec::<AllToAllPlanCachedByShape>(
            "all_to_all_plan_cached_by_shape",
            "values.move",
            "all_to_all_single caches its split plan per (dtype, input shape): a same-shaped call with other splits moves rows by the old plan",
            &["all_to_all_single::out"],
        ),
        spec::<InFlightAllGathersMerged>(
            "in_flight_all_gathers_merged",
            "values.move",
            "two same-shaped all_gather_into_tensor in flight at once: the second returns the first's result",
            &["reuse::outputs_in_flight::all_gather"],
        ),
        spec::<ByteInplaceMaxHeadNotStored>(
            "byte_inplace_min_max_head_not_stored",
            "values.reduce",
            "i8 / u8 in-place all_reduce_ min / max leaves element 0 as this rank's input",
            &["all_reduce::inplace::u8::max", "all_reduce::inplace::i8::min"],
        ),
        spec::<HalfSumDropsRanksAbove8>(
            "half_sum_drops_ranks_above_8",
            "values.world_sizes",
            "bf16 / f16 all_reduce sum above world size 8 leaves ranks 8.. out of the sum (8 staging slots)",
            &["all_reduce::out::bf16::sum::ws16"],
        ),
    ]
}
