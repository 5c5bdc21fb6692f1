//! The second outside hunt: bugs that need state carried across many calls, zero-element
//! messages and list entries, integer widths in reductions and in data movement, all_to_all rows
//! of several dimensions and zero splits, rooted ops at a root in the middle, and the fused ops'
//! later `b`s and `avg`. Each is a bug a backend author could ship, over the correct shm backend.

use crate::campaign::Spec;
use crate::{edit, Buf, Bug, Mutant, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Scaling, Tensor, Work};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// Element `i` of integer tensor `t`, widened.
pub(crate) fn int_at(t: &Tensor, i: usize) -> i128 {
    let es = t.dtype().size();
    let b = &t.bytes()[i * es..(i + 1) * es];
    let mut v: u128 = 0;
    for (k, &byte) in b.iter().enumerate() {
        v |= (byte as u128) << (8 * k);
    }
    let bits = 8 * es as u32;
    if t.dtype().is_signed_int() && v >> (bits - 1) & 1 == 1 {
        v as i128 - (1i128 << bits)
    } else {
        v as i128
    }
}

/// Stores `v` (already in range) into element `i` of integer tensor `t`.
pub(crate) fn set_int(t: &mut Tensor, i: usize, v: i128) {
    let es = t.dtype().size();
    let u = v as u128;
    for k in 0..es {
        t.bytes_mut()[i * es + k] = (u >> (8 * k)) as u8;
    }
}

/// The range of integer dtype `d`.
pub(crate) fn int_range(d: DType) -> (i128, i128) {
    let bits = 8 * d.size() as u32;
    if d.is_signed_int() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// An integer reduction whose kernel is `kernel` (the ranks' values in, the stored value out),
/// run over an all_gather of `x` (what a backend's own reduction kernel computes).
fn reduce_by_gather(s: &Shm, x: &Buf, kernel: fn(DType, &[i128]) -> i128) -> Result<Work<Buf>> {
    let (dtype, shape, ws) = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x), s.ws());
    let w = s.inner.all_gather_into_tensor(x)?;
    let out = s.inner.alloc(dtype, &shape)?;
    let o = out.clone();
    Ok(s.then_as(w, out, move |be, g| {
        let g = be.download(g)?;
        let n = g.numel() / ws;
        edit(be, &o, |t| {
            for i in 0..n {
                let vals: Vec<i128> = (0..ws).map(|r| int_at(&g, r * n + i)).collect();
                set_int(t, i, kernel(dtype, &vals));
            }
        })
    }))
}

// ---------------------------------------------------------------- state carried over many calls

/// `all_reduce` / `all_reduce_` keep their sequence number in a `u8`: the 256th call of a
/// communicator (the number wraps to the value the peers' ready flags were reset to) sees every
/// peer "ready" at once and returns this rank's own input.
#[derive(Default)]
pub struct AllReduceSeqU8Wraps {
    seq: AtomicU8,
}

impl AllReduceSeqU8Wraps {
    fn wraps(&self) -> bool {
        self.seq.fetch_add(1, Ordering::SeqCst) == u8::MAX
    }
    fn own_input(s: &Shm, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        let mine = s.inner.download(x)?;
        Ok(s.then(w, move |be, out| be.write(out, &mine)))
    }
}

impl Bug for AllReduceSeqU8Wraps {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !self.wraps() {
            return s.inner.all_reduce(x, op);
        }
        let w = s.inner.all_reduce(x, op)?;
        Self::own_input(s, x, w)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !self.wraps() {
            return s.inner.all_reduce_(x, op);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| be.write(out, &mine)))
    }
}

// ---------------------------------------------------------------- zero elements

/// A zero-element `send` or `recv` completes at once without touching the peer ("nothing to
/// move"): a zero-element send against a non-empty receive is no error on the sender, and the
/// receiver waits for a message that never comes.
#[derive(Default)]
pub struct EmptyP2pSkipsPeer;

impl Bug for EmptyP2pSkipsPeer {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        if s.numel(x) == 0 && dst < s.ws() && dst != s.rank() {
            return Ok(s.done((), "send"));
        }
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        if s.numel(out) == 0 && src < s.ws() && src != s.rank() {
            return Ok(s.done(out.clone(), "recv"));
        }
        s.inner.recv(out, src)
    }
}

/// The coalesced all_reduce loop `break`s at the first zero-element tensor of the list: the
/// tensors after it come back as this rank's inputs, unreduced.
#[derive(Default)]
pub struct CoalescedStopsAtEmpty;

impl CoalescedStopsAtEmpty {
    fn after_empty(s: &Shm, xs: &[Buf], w: Work<Vec<Buf>>) -> Result<Work<Vec<Buf>>> {
        let Some(e) = xs.iter().position(|x| s.numel(x) == 0) else { return Ok(w) };
        let mine: Vec<Tensor> = xs[e + 1..].iter().map(|x| s.inner.download(x)).collect::<Result<_>>()?;
        Ok(s.then(w, move |be, outs| outs[e + 1..].iter().zip(&mine).try_for_each(|(o, t)| be.write(o, t))))
    }
}

impl Bug for CoalescedStopsAtEmpty {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        Self::after_empty(s, xs, w)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        // The inputs are snapshot before the in-place call overwrites them.
        let Some(e) = xs.iter().position(|x| s.numel(x) == 0) else { return s.inner.all_reduce_coalesced_(xs, op) };
        let mine: Vec<Tensor> = xs[e + 1..].iter().map(|x| s.inner.download(x)).collect::<Result<_>>()?;
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        Ok(s.then(w, move |be, outs| outs[e + 1..].iter().zip(&mine).try_for_each(|(o, t)| be.write(o, t))))
    }
}

/// A one-tensor coalesced all_reduce takes the single-tensor fast path, which is handed the
/// default reduce op (`sum`) instead of the caller's.
#[derive(Default)]
pub struct CoalescedSingleAsSum;

impl Bug for CoalescedSingleAsSum {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let op = if xs.len() == 1 && !matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op };
        s.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let op = if xs.len() == 1 && !matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op };
        s.inner.all_reduce_coalesced_(xs, op)
    }
}

// ---------------------------------------------------------------- integer widths

/// i16 / u16 `sum` of `all_reduce` saturates (a saturating-add SIMD instruction, `paddsw` /
/// `paddusw`, picked for the 16-bit lanes) instead of wrapping in the dtype's width.
#[derive(Default)]
pub struct Int16SumSaturates;

impl Bug for Int16SumSaturates {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if op != ReduceOp::Sum || !matches!(s.inner.buffer_dtype(x), DType::I16 | DType::U16) {
            return s.inner.all_reduce(x, op);
        }
        reduce_by_gather(s, x, |d, vals| {
            let (lo, hi) = int_range(d);
            vals.iter().fold(0i128, |a, &v| (a + v).clamp(lo, hi))
        })
    }
}

/// 32- and 64-bit integer `product` of `all_reduce` saturates at the dtype's bounds (the kernel
/// multiplies with a checked multiply and clamps on overflow) instead of wrapping.
#[derive(Default)]
pub struct IntProductSaturates;

impl Bug for IntProductSaturates {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if op != ReduceOp::Product || d.is_float() || d.size() < 4 {
            return s.inner.all_reduce(x, op);
        }
        reduce_by_gather(s, x, |d, vals| {
            let (lo, hi) = int_range(d);
            vals.iter().fold(1i128, |a, &v| a.saturating_mul(v).clamp(lo, hi))
        })
    }
}

/// `gather` of the 8-byte integer dtypes goes through the f64 copy kernel (converting values,
/// not moving bytes): values above 2^53 in magnitude come back rounded.
#[derive(Default)]
pub struct GatherWideIntsThroughF64;

impl Bug for GatherWideIntsThroughF64 {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if !matches!(d, DType::I64 | DType::U64) {
            return s.inner.gather(x, root);
        }
        let t = s.inner.download(x)?;
        let vals: Vec<f64> = (0..t.numel()).map(|i| int_at(&t, i) as f64).collect();
        let w = s.inner.gather(&s.inner.upload(&Tensor::from_f64(DType::F64, t.shape(), &vals))?, root)?;
        let out = s.inner.alloc(d, &s.inner.buffer_shape(w.peek()))?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| {
            let r = be.download(r)?;
            edit(be, &o, |t| {
                let (lo, hi) = int_range(d);
                for i in 0..r.numel() {
                    set_int(t, i, (r.get_f64(i) as i128).clamp(lo, hi));
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- all_to_all rows

/// `all_to_all_single` computes a row's length as `shape[1]` (right for 2-d inputs): with three
/// or more dims, only the first `shape[1]` elements of each row arrive, the rest stay zero.
#[derive(Default)]
pub struct AllToAllRowAsDim1;

impl Bug for AllToAllRowAsDim1 {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let w = s.inner.all_to_all_single(x, o, i)?;
        if shape.len() < 3 {
            return Ok(w);
        }
        let (d1, row): (usize, usize) = (shape[1], shape[1..].iter().product());
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let es = t.dtype().size();
                for r in 0..t.numel() / row.max(1) {
                    t.bytes_mut()[(r * row + d1) * es..(r + 1) * row * es].fill(0);
                }
            })
        }))
    }
}

/// `all_to_all_single`'s send loop `break`s (instead of `continue`) at the first peer this rank
/// sends zero rows to: the rows for every later peer are never sent and arrive as zeros.
#[derive(Default)]
pub struct AllToAllBreaksAtZeroSplit;

impl Bug for AllToAllBreaksAtZeroSplit {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let Some(splits) = i else { return s.inner.all_to_all_single(x, o, i) };
        let Some(z) = splits.iter().position(|&n| n == 0) else { return s.inner.all_to_all_single(x, o, i) };
        let mut t = s.inner.download(x)?;
        let start: usize = splits[..=z].iter().sum();
        let row = t.row_numel() * t.dtype().size();
        t.bytes_mut()[start * row..].fill(0);
        s.inner.all_to_all_single(&s.inner.upload(&t)?, o, i)
    }
}

// ---------------------------------------------------------------- roots in the middle

/// `reduce` `sum` with a root strictly between the first and the last rank leaves out the
/// ranks above the root (a chain reduce that runs 0 -> root and forgets the upper segment).
#[derive(Default)]
pub struct ReduceMidRootDropsUpper;

impl Bug for ReduceMidRootDropsUpper {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let (me, ws) = (s.rank(), s.ws());
        if op != ReduceOp::Sum || root == 0 || root + 1 >= ws || me <= root {
            return s.inner.reduce(x, op, root);
        }
        let zeros = s.inner.upload(&Tensor::zeros(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x)))?;
        s.inner.reduce(&zeros, op, root)
    }
}

// ---------------------------------------------------------------- fused ops

/// `fused_all_gather_matmul` (gather dim 0) with several `b`s overlaps the gather with the first
/// product only: the later products see only this rank's rows (the others are still zero when
/// they run).
#[derive(Default)]
pub struct AgMatmulLaterBsLocalRows;

impl Bug for AgMatmulLaterBsLocalRows {
    fn fused_all_gather_matmul(
        &self,
        m: &Mutant,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<concord_core::fused::Gathered<Buf>>> {
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, scaling)?;
        let a_shape = m.s.inner.buffer_shape(a);
        if bs.len() < 2 || dim != 0 || a_shape.is_empty() {
            return Ok(w);
        }
        let (rows, me) = (a_shape[0], m.s.rank());
        Ok(m.s.then(w, move |be, (_, outs)| {
            outs[1..].iter().try_for_each(|o| {
                edit(be, o, |t| {
                    let rb = t.row_numel() * t.dtype().size();
                    let n = t.len_bytes();
                    t.bytes_mut()[..(me * rows * rb).min(n)].fill(0);
                    t.bytes_mut()[((me + 1) * rows * rb).min(n)..].fill(0);
                })
            })
        }))
    }
}

/// `fused_matmul_reduce_scatter` with `avg` runs the `sum` path (the divide by the world size is
/// only in the unfused fallback).
#[derive(Default)]
pub struct MmRsAvgAsSum;

impl Bug for MmRsAvgAsSum {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, scaling)
    }
}

// ---------------------------------------------------------------- sizes off the ladder's path

/// The fusion buffer of `all_reduce_coalesced` (the list packed into one staging buffer) holds
/// 1 MiB: the tensors that end past it are never reduced and come back as this rank's inputs.
#[derive(Default)]
pub struct CoalescedFusionBuffer1Mib;

const FUSION_BYTES: usize = 1 << 20;

impl CoalescedFusionBuffer1Mib {
    /// Index of the first tensor that ends past the fusion buffer.
    fn first_past(s: &Shm, xs: &[Buf]) -> Option<usize> {
        let mut end = 0;
        xs.iter().position(|x| {
            end += s.numel(x) * s.inner.buffer_dtype(x).size();
            end > FUSION_BYTES
        })
    }
    fn fix(s: &Shm, xs: &[Buf], issue: impl FnOnce() -> Result<Work<Vec<Buf>>>) -> Result<Work<Vec<Buf>>> {
        let Some(p) = Self::first_past(s, xs) else { return issue() };
        let mine: Vec<Tensor> = xs[p..].iter().map(|x| s.inner.download(x)).collect::<Result<_>>()?;
        let w = issue()?;
        Ok(s.then(w, move |be, outs| outs[p..].iter().zip(&mine).try_for_each(|(o, t)| be.write(o, t))))
    }
}

impl Bug for CoalescedFusionBuffer1Mib {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::fix(s, xs, || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::fix(s, xs, || s.inner.all_reduce_coalesced_(xs, op))
    }
}

/// `all_reduce` of 1 MiB or more switches to a large-message kernel instantiated for `sum`
/// only: `min` / `max` there dispatch to it and return the sum.
#[derive(Default)]
pub struct LargeMinMaxAsSum;

impl Bug for LargeMinMaxAsSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        let op = if bytes >= FUSION_BYTES && matches!(op, ReduceOp::Min | ReduceOp::Max) { ReduceOp::Sum } else { op };
        s.inner.all_reduce(x, op)
    }
}

// ---------------------------------------------------------------- point to point, several peers

/// A receive not yet waited: its source, its buffer, and whether it has been waited.
type PendingRecv = (usize, Buf, Arc<AtomicBool>);

/// Receives are matched to incoming messages by (dtype, count) in the order they were posted,
/// whatever their source (an any-source match): with receives from two peers in flight, a
/// later receive swaps contents with an earlier one of another source.
#[derive(Default)]
pub struct RecvMatchesAnyPeer {
    pending: Mutex<Vec<PendingRecv>>,
}

impl Bug for RecvMatchesAnyPeer {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        let done = Arc::new(AtomicBool::new(false));
        let (dtype, shape) = (s.inner.buffer_dtype(out), s.inner.buffer_shape(out));
        let other = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.retain(|(_, _, d)| !d.load(Ordering::SeqCst));
            let other = p
                .iter()
                .find(|(s2, b, _)| *s2 != src && s.inner.buffer_dtype(b) == dtype && s.inner.buffer_shape(b) == shape)
                .map(|(_, b, _)| b.clone());
            p.push((src, out.clone(), done.clone()));
            other
        };
        Ok(s.then(w, move |be, mine| {
            done.store(true, Ordering::SeqCst);
            let Some(other) = other else { return Ok(()) };
            let (a, b) = (be.download(mine)?, be.download(&other)?);
            be.write(mine, &b)?;
            be.write(&other, &a)
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<AllReduceSeqU8Wraps>(
            "all_reduce_seq_u8_wraps",
            "placement.reuse",
            "all_reduce keeps its sequence number in a u8: the 256th call of a communicator returns this rank's own input",
            &["reuse::ops_300_world_and_group"],
        ),
        spec::<EmptyP2pSkipsPeer>(
            "empty_p2p_skips_peer",
            "p2p.matching",
            "a zero-element send / recv completes at once without the peer: an empty send against a non-empty recv is no error",
            &["bad_input::recv_buffer_larger_than_empty_message"],
        ),
        spec::<CoalescedStopsAtEmpty>(
            "coalesced_stops_at_empty",
            "values.coalesced",
            "all_reduce_coalesced stops at the first zero-element tensor: the later tensors come back unreduced",
            &["all_reduce::coalesced"],
        ),
        spec::<CoalescedSingleAsSum>(
            "coalesced_single_as_sum",
            "values.coalesced",
            "a one-tensor all_reduce_coalesced takes the single-op path with `sum` instead of the caller's op",
            &["all_reduce::coalesced"],
        ),
        spec::<Int16SumSaturates>(
            "int16_sum_saturates",
            "numerics.subnormal",
            "i16 / u16 all_reduce sum saturates instead of wrapping in the dtype's width",
            &["all_reduce::out::i16::sum", "all_reduce::out::u16::sum"],
        ),
        spec::<IntProductSaturates>(
            "int_product_saturates",
            "numerics.subnormal",
            "32- / 64-bit integer all_reduce product saturates at the dtype's bounds instead of wrapping",
            &["all_reduce::out::i32::product", "all_reduce::out::u64::product"],
        ),
        spec::<GatherWideIntsThroughF64>(
            "gather_wide_ints_through_f64",
            "values.move",
            "gather of i64 / u64 converts values through f64: beyond 2^53 they come back rounded",
            &["gather::out::i64", "gather::out::u64"],
        ),
        spec::<AllToAllRowAsDim1>(
            "all_to_all_row_as_dim1",
            "values.move",
            "all_to_all_single takes a row's length as shape[1]: rows of 3+ dims arrive cut, the rest zero",
            &["all_to_all_single::out"],
        ),
        spec::<AllToAllBreaksAtZeroSplit>(
            "all_to_all_breaks_at_zero_split",
            "values.move",
            "all_to_all_single stops sending at the first peer with a zero input split: later peers get zeros",
            &["all_to_all_single::out"],
        ),
        spec::<ReduceMidRootDropsUpper>(
            "reduce_mid_root_drops_upper",
            "values.reduce",
            "reduce sum at a root between the first and last rank leaves out the ranks above the root",
            &["async::pending_until_peers_arrive::reduce"],
        ),
        spec::<AgMatmulLaterBsLocalRows>(
            "ag_matmul_later_bs_local_rows",
            "fused.values",
            "fused_all_gather_matmul with several bs: the products after the first see only this rank's rows",
            &["fused::all_gather_matmul::dim0"],
        ),
        spec::<MmRsAvgAsSum>(
            "mm_rs_avg_as_sum",
            "fused.values",
            "fused_matmul_reduce_scatter with avg returns the sum",
            &["fused::matmul_reduce_scatter"],
        ),
        spec::<CoalescedFusionBuffer1Mib>(
            "coalesced_fusion_buffer_1mib",
            "values.coalesced",
            "all_reduce_coalesced packs the list into a 1 MiB fusion buffer: tensors ending past it come back unreduced",
            &["all_reduce::coalesced::f32::sum::ws2::large"],
        ),
        spec::<LargeMinMaxAsSum>(
            "large_min_max_as_sum",
            "values.sizes",
            "all_reduce of 1 MiB or more runs min / max through the large-message sum kernel",
            &["all_reduce::out::f32::max::ws2::large"],
        ),
        spec::<RecvMatchesAnyPeer>(
            "recv_matches_any_peer",
            "p2p.matching",
            "receives in flight from several peers are matched by (dtype, count) in posting order, whatever the source",
            &["p2p::recvs_from_every_peer"],
        ),
    ]
}
