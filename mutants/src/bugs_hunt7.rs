//! The seventh outside hunt: the dtype and reduce-op axis, which the corruption sweep (f32-agnostic
//! last elements) does not cover. Half-precision sums, averages and pre-multiplied sums rounded at
//! the wrong step (per node group, in f32 vector blocks, the sum before an exact power-of-two
//! scale or a factor), integer kernels that take another path past a vector width or a chunk
//! size (signed lanes for unsigned values, a saturating pack, a rounding byte average, a chunk
//! counted in 4-byte elements), min / max that lose NaN on the ring path or through a sign-folded
//! integer compare, a `_out` variant and a coalesced one reduced in f32, and reduce ops accepted on dtypes they are not
//! defined for off the op the bad-input table checks. Each is a bug a backend author could ship,
//! over the correct shm backend.

use crate::bugs_hunt2::{int_at, int_range, set_int};
use crate::bugs_hunt3::{chunk, Hidden};
use crate::campaign::Spec;
use crate::{edit, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};

/// `v` rounded once to the float dtype `d`, to nearest, ties to even (as f64).
fn round_to(d: DType, v: f64) -> f64 {
    let (e, m) = match d {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        _ => return v,
    };
    let bits = concord_core::dtype::round_f64_to_bits(v, e, m);
    Tensor::from_bytes(d, &[1], &bits.to_le_bytes()[..d.size()]).get_f64(0)
}

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Rank `r`'s element `i` of a gathered tensor of `ws` equal parts.
fn part(g: &Tensor, ws: usize, r: usize, i: usize) -> f64 {
    g.get_f64(r * (g.numel() / ws) + i)
}

/// `all_reduce(x, op)` whose result is then edited by `kernel(gathered inputs of every rank,
/// output)`: what the bug's own kernel computes, emulated over a hidden all_gather issued first.
fn all_reduce_as(
    s: &Shm,
    hidden: &Hidden,
    x: &Buf,
    op: ReduceOp,
    kernel: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<Buf>> {
    let (g, hid) = hidden.gather(s, x)?;
    let w = s.inner.all_reduce(x, op)?;
    Ok(s.then(w, move |be, out| {
        let _hid = hid;
        let g = be.download(g.wait(BUG_WAIT)?)?;
        edit(be, out, |t| kernel(&g, t))
    }))
}

/// Every element's float result `f(values of every rank)`, stored in `t` (rounded by `from_f64`'s
/// caller: `f` returns a value of the dtype).
fn float_map(g: &Tensor, ws: usize, t: &mut Tensor, f: impl Fn(&[f64]) -> f64) {
    let (d, n) = (t.dtype(), t.numel());
    columns(g, ws, t, n, 0, |vals| round_to(d, f(vals)));
}

/// For each output element `i < n`: `f(every rank's value at index base + i)`, stored in `t`.
fn columns(g: &Tensor, ws: usize, t: &mut Tensor, n: usize, base: usize, f: impl Fn(&[f64]) -> f64) {
    let mut vals = vec![0.0; ws];
    for i in 0..n {
        for (r, v) in vals.iter_mut().enumerate() {
            *v = part(g, ws, r, base + i);
        }
        crate::set_f64(t, i, f(&vals));
    }
}

// ---------------------------------------------------------------- numerics.round_once

/// Ranks per node group of the hierarchical half-precision sum (hunt7's mutant; review10's
/// `review10_half_sum_rounded_per_node_group_of_8` is the same bug with groups of 8).
const GROUP: usize = 4;

/// f16 / bf16 `sum` of `all_reduce` on more than 4 ranks is hierarchical: each group of 4
/// consecutive ranks sums exactly, the group's partial is stored in the dtype (the buffer handed
/// to the next level), and the partials are summed exactly and rounded once more. Up to 4 ranks
/// (one group) it is exact-then-round.
#[derive(Default)]
pub struct HalfSumRoundedPerNodeGroup<const G: usize = GROUP> {
    hidden: Hidden,
}

impl<const G: usize> Bug for HalfSumRoundedPerNodeGroup<G> {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if op != ReduceOp::Sum || !is_half(d) || ws <= G {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| {
            float_map(g, ws, t, |v| v.chunks(G).map(|grp| round_to(d, grp.iter().sum())).sum())
        })
    }
}

/// Elements per f32 vector block of the half-precision sum kernel.
const VBLOCK: usize = 32;

/// The ranks' values summed in rank order in f32 (each add rounded to f32), then rounded to `d`.
fn f32_sum(d: DType, v: &[f64]) -> f64 {
    let acc = v.iter().skip(1).fold(v[0] as f32, |a, &x| a + x as f32);
    round_to(d, acc as f64)
}

/// f16 / bf16 `sum` of `all_reduce` of 64 elements or more takes a vector path for every full
/// block of 32 elements: converted to f32 (F16C / AVX-512 BF16), added in f32 in rank order and
/// converted back (rounded twice: f32, then the dtype). The tail past the last full block, and
/// shorter tensors, take the exact scalar loop.
#[derive(Default)]
pub struct HalfSumF32VectorBlocks {
    hidden: Hidden,
}

impl Bug for HalfSumF32VectorBlocks {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws, n) = (s.inner.buffer_dtype(x), s.ws(), s.numel(x));
        if op != ReduceOp::Sum || !is_half(d) || n < 2 * VBLOCK {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| {
            let full = n - n % VBLOCK;
            columns(g, ws, t, full, 0, |vals| f32_sum(d, vals));
        })
    }
}

/// f16 / bf16 `avg` of `all_reduce` at a power-of-two world size: the sum kernel's result (rounded
/// to the dtype) is scaled by `1/ws`, a power of two, "so exact" — except where the sum overflows
/// the dtype (an average of values near the largest finite one comes back infinite). Other world
/// sizes divide the exact sum.
#[derive(Default)]
pub struct HalfAvgPow2ScalesRoundedSum {
    hidden: Hidden,
}

impl Bug for HalfAvgPow2ScalesRoundedSum {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if op != ReduceOp::Avg || !is_half(d) || ws < 2 || !ws.is_power_of_two() {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| float_map(g, ws, t, |v| round_to(d, v.iter().sum()) * (1.0 / ws as f64)))
    }
}

/// f16 / bf16 `premul_sum(s)` of `all_reduce` runs the sum kernel (rounded to the dtype), then
/// scales the result by `s` and rounds again, instead of rounding `Σ s·x_r` once.
#[derive(Default)]
pub struct HalfPremulScalesRoundedSum {
    hidden: Hidden,
}

impl Bug for HalfPremulScalesRoundedSum {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        let ReduceOp::PremulSum(f) = op else { return s.inner.all_reduce(x, op) };
        if !is_half(d) {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| float_map(g, ws, t, |v| round_to(d, v.iter().sum()) * f))
    }
}

/// f16 / bf16 `reduce_scatter_tensor_out` reduces into the caller's output through an f32
/// scratch (a buffer of the output's element count): the ranks' values are added in f32, then
/// rounded to the dtype — twice rounded. The out-of-place `reduce_scatter_tensor` is exact.
#[derive(Default)]
pub struct ReduceScatterOutHalfViaF32 {
    hidden: Hidden,
}

impl Bug for ReduceScatterOutHalfViaF32 {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let (d, ws, me) = (s.inner.buffer_dtype(x), s.ws(), s.rank());
        if op != ReduceOp::Sum || !is_half(d) || s.inner.buffer_dtype(out) != d || s.numel(out) * ws != s.numel(x) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let (g, hid) = self.hidden.gather(s, x)?;
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(g.wait(BUG_WAIT)?)?;
            edit(be, out, |t| {
                let k = t.numel();
                columns(&g, ws, t, k, me * k, |vals| f32_sum(d, vals));
            })
        }))
    }
}

/// `reduce_scatter_tensor_coalesced` of a list holding f16 / bf16 tensors fuses the list into one
/// f32 buffer (the widest float of the list's dtypes, as a fusion buffer is typed once): the half
/// tensors are added in f32, then rounded back — twice rounded. The single op is exact.
#[derive(Default)]
pub struct ReduceScatterCoalescedHalfViaF32 {
    hidden: Hidden,
}

impl Bug for ReduceScatterCoalescedHalfViaF32 {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let (ws, me) = (s.ws(), s.rank());
        let dtypes: Vec<DType> = xs.iter().map(|x| s.inner.buffer_dtype(x)).collect();
        if op != ReduceOp::Sum || !dtypes.iter().copied().any(is_half) {
            return s.inner.reduce_scatter_tensor_coalesced(xs, op);
        }
        let (g, hid) = self.hidden.gather_all(s, xs)?;
        let w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
        Ok(s.then(w, move |be, outs| {
            let _hid = hid;
            let gs = g.wait(BUG_WAIT)?;
            for ((out, gb), d) in outs.iter().zip(gs).zip(dtypes) {
                if !is_half(d) {
                    continue;
                }
                let g = be.download(gb)?;
                edit(be, out, |t| {
                    let k = t.numel();
                    columns(&g, ws, t, k, me * k, |vals| f32_sum(d, vals));
                })?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- integer vector paths

/// Work-chunk length from which the integer kernels take their vector path.
const VECTOR_FROM: usize = 64;

/// Runs `kernel(values of every rank) -> stored value` over every element of the work chunks of
/// at least [`VECTOR_FROM`] elements (shm's split of the output over the ranks).
fn int_vector_chunks(g: &Tensor, ws: usize, t: &mut Tensor, kernel: impl Fn(DType, &[i128]) -> i128) {
    let (d, el) = (t.dtype(), t.numel());
    let mut vals = vec![0i128; ws];
    for j in 0..ws {
        let (a, b) = chunk(el, j, ws);
        if b - a < VECTOR_FROM {
            continue;
        }
        for i in a..b {
            for (r, v) in vals.iter_mut().enumerate() {
                *v = int_at(g, r * el + i);
            }
            set_int(t, i, kernel(d, &vals));
        }
    }
}

/// u32 / u64 `min` / `max` of `all_reduce` on work chunks of 64 elements or more take the vector
/// path with the SIGNED lane compare (AVX2 has `cmpgt_epi64` and no unsigned one; `max_epi32`
/// picked for `max_epu32`): values with the top bit set order below the others there.
#[derive(Default)]
pub struct WideUnsignedMinMaxSignedLanes {
    hidden: Hidden,
}

impl Bug for WideUnsignedMinMaxSignedLanes {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if !matches!(d, DType::U32 | DType::U64) || !matches!(op, ReduceOp::Min | ReduceOp::Max) || s.numel(x) < VECTOR_FROM {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| {
            int_vector_chunks(g, ws, t, move |d, vals| {
                let signed = |v: i128| if d == DType::U32 { v as u32 as i32 as i128 } else { v as u64 as i64 as i128 };
                let pick = vals.iter().copied();
                let v = if op == ReduceOp::Max { pick.max_by_key(|&v| signed(v)) } else { pick.min_by_key(|&v| signed(v)) };
                v.unwrap_or(0)
            })
        })
    }
}

/// i8 / u8 `product` of `all_reduce` on work chunks of 64 elements or more: bytes have no vector
/// multiply, so the lanes are widened to 16 bits, multiplied, and packed back with the
/// SATURATING pack (`packs_epi16` / `packus_epi16`) after every rank, instead of wrapping.
#[derive(Default)]
pub struct BytePackSaturatesProduct {
    hidden: Hidden,
}

impl Bug for BytePackSaturatesProduct {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if !matches!(d, DType::I8 | DType::U8) || op != ReduceOp::Product || s.numel(x) < VECTOR_FROM {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| {
            int_vector_chunks(g, ws, t, |d, vals| {
                let (lo, hi) = int_range(d);
                vals.iter().skip(1).fold(vals[0], |a, &v| (a * v).clamp(lo, hi))
            })
        })
    }
}

/// u8 / u16 `avg` of `all_reduce` at two ranks, on work chunks of 64 elements or more, is the
/// rounding average instruction (`pavgb` / `pavgw`): `(a + b + 1) >> 1` in a wider lane, where the
/// contract's integer average is the sum wrapped in the dtype, then divided toward zero.
#[derive(Default)]
pub struct UnsignedAvgRoundingInstruction {
    hidden: Hidden,
}

impl Bug for UnsignedAvgRoundingInstruction {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if !matches!(d, DType::U8 | DType::U16) || op != ReduceOp::Avg || ws != 2 || s.numel(x) < VECTOR_FROM {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| int_vector_chunks(g, ws, t, |_, v| (v[0] + v[1] + 1) >> 1))
    }
}

/// Bytes per pass of the integer reduction loop.
const PASS_BYTES: usize = 64 << 10;

/// `all_reduce` of the 1- and 2-byte integer dtypes above 64 KiB runs in passes of 64 KiB: the
/// loop steps by `PASS_BYTES / size` elements, but each pass reduces `PASS_BYTES / 4` elements
/// (the count written for i32): the rest of every pass keeps what the output was initialised
/// with, this rank's own input.
#[derive(Default)]
pub struct NarrowIntPassCountedAsI32;

impl Bug for NarrowIntPassCountedAsI32 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        if d.is_float() || d.size() > 2 || n * d.size() <= PASS_BYTES {
            return s.inner.all_reduce(x, op);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let (step, done, es) = (PASS_BYTES / d.size(), PASS_BYTES / 4, d.size());
                for i in (0..n).filter(|i| i % step >= done) {
                    crate::copy_bytes(t, i * es, &mine, i * es, es);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- min / max

/// NaN turned into the op's identity, so that it loses every compare (Rust's `f32::max`, IEEE
/// `maxNum`).
fn nan_loses(t: &mut Tensor, op: ReduceOp) {
    let id = if op == ReduceOp::Max { f64::NEG_INFINITY } else { f64::INFINITY };
    for i in 0..t.numel() {
        if t.get_f64(i).is_nan() {
            crate::set_f64(t, i, id);
        }
    }
}

/// Float `min` / `max` of `reduce_scatter_tensor` and `reduce` on 3 ranks or more run the ring
/// kernel, written with `f32::max` / `f32::min` (NaN loses); the 2-rank direct exchange keeps
/// the declared NaN policy.
#[derive(Default)]
pub struct RingMinMaxDropsNan;

impl RingMinMaxDropsNan {
    fn ring(s: &Shm, x: &Buf, op: ReduceOp) -> Result<Option<Buf>> {
        if !s.inner.buffer_dtype(x).is_float() || !matches!(op, ReduceOp::Min | ReduceOp::Max) || s.ws() < 3 {
            return Ok(None);
        }
        let mut t = s.inner.download(x)?;
        nan_loses(&mut t, op);
        Ok(Some(s.inner.upload(&t)?))
    }
}

impl Bug for RingMinMaxDropsNan {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::ring(s, x, op)? {
            Some(y) => s.inner.reduce_scatter_tensor(&y, op),
            None => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        match Self::ring(s, x, op)? {
            Some(y) => s.inner.reduce(&y, op, root),
            None => s.inner.reduce(x, op, root),
        }
    }
}

/// f16 / bf16 `min` / `max` of `all_reduce` on work chunks of 64 elements or more compare the
/// sign-folded bit patterns as integers (a total order: `-0 < +0` comes out right) — where a
/// positive NaN sorts above `+inf`, so `max` keeps it and `min` drops it.
#[derive(Default)]
pub struct HalfMinMaxSignFoldedBits {
    hidden: Hidden,
}

impl Bug for HalfMinMaxSignFoldedBits {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, ws) = (s.inner.buffer_dtype(x), s.ws());
        if !is_half(d) || !matches!(op, ReduceOp::Min | ReduceOp::Max) || s.numel(x) < VECTOR_FROM {
            return s.inner.all_reduce(x, op);
        }
        all_reduce_as(s, &self.hidden, x, op, move |g, t| {
            let el = t.numel();
            let bits = |tt: &Tensor, i: usize| u16::from_le_bytes([tt.bytes()[2 * i], tt.bytes()[2 * i + 1]]);
            let key = |b: u16| if b & 0x8000 != 0 { !b } else { b | 0x8000 };
            for j in 0..ws {
                let (a, b) = chunk(el, j, ws);
                if b - a < VECTOR_FROM {
                    continue;
                }
                for i in a..b {
                    let vals = (0..ws).map(|r| bits(g, r * el + i));
                    let v = if op == ReduceOp::Max { vals.max_by_key(|&b| key(b)) } else { vals.min_by_key(|&b| key(b)) };
                    t.bytes_mut()[2 * i..2 * i + 2].copy_from_slice(&v.unwrap_or(0).to_le_bytes());
                }
            }
        })
    }
}

// ---------------------------------------------------------------- bad input off all_reduce

/// The integer dtype of a float dtype's width.
fn same_width_int(d: DType) -> DType {
    match d.size() {
        2 => DType::I16,
        4 => DType::I32,
        _ => DType::I64,
    }
}

/// `b`'s bytes as a new buffer of dtype `to`.
fn reinterpret(s: &Shm, b: &Buf, to: DType) -> Result<Buf> {
    let t = s.inner.download(b)?;
    s.inner.upload(&Tensor::from_bytes(to, t.shape(), t.bytes()))
}

/// A work whose result `w` (of dtype `from`) is handed back as a new buffer of dtype `to`, same
/// bytes.
fn reinterpreted(s: &Shm, w: Work<Buf>, to: DType) -> Result<Work<Buf>> {
    let out = s.inner.alloc(to, &s.inner.buffer_shape(w.peek()))?;
    let o = out.clone();
    Ok(s.then_as(w, out, move |be, r| {
        let t = be.download(r)?;
        be.write(&o, &Tensor::from_bytes(to, t.shape(), t.bytes()))
    }))
}

/// `reduce_scatter_tensor` and `reduce` run `band` / `bor` / `bxor` on float tensors on their bits
/// (their kernels pick the bitwise kernel by element width), instead of
/// `bad_input:unsupported_dtype`; all_reduce checks the op against the dtype.
#[derive(Default)]
pub struct BitwiseOnFloatBitsOffAllReduce;

impl Bug for BitwiseOnFloatBitsOffAllReduce {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if !d.is_float() || !op.is_bitwise() {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let w = s.inner.reduce_scatter_tensor(&reinterpret(s, x, same_width_int(d))?, op)?;
        reinterpreted(s, w, d)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if !d.is_float() || !op.is_bitwise() {
            return s.inner.reduce(x, op, root);
        }
        let w = s.inner.reduce(&reinterpret(s, x, same_width_int(d))?, op, root)?;
        reinterpreted(s, w, d)
    }
}

/// `t` times the integer part of `f`, wrapped in the dtype.
fn scaled_int(s: &Shm, x: &Buf, f: f64) -> Result<Buf> {
    let mut t = s.inner.download(x)?;
    for i in 0..t.numel() {
        let v = int_at(&t, i);
        set_int(&mut t, i, v.wrapping_mul(f.trunc() as i128));
    }
    s.inner.upload(&t)
}

/// `all_reduce_coalesced` and `reduce_scatter_tensor` lower `premul_sum(f)` to a local scale and
/// a `sum`, for every dtype: on integer tensors the factor's integer part scales them, instead of
/// `bad_input:unsupported_dtype` (all_reduce checks the op against the dtype).
#[derive(Default)]
pub struct PremulOnIntsLoweredOffAllReduce;

impl Bug for PremulOnIntsLoweredOffAllReduce {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let ReduceOp::PremulSum(f) = op else { return s.inner.all_reduce_coalesced(xs, op) };
        if xs.iter().all(|x| s.inner.buffer_dtype(x).is_float()) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        let scaled: Vec<Buf> = xs
            .iter()
            .map(|x| {
                if s.inner.buffer_dtype(x).is_float() {
                    let t = s.inner.download(x)?;
                    let v: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i) * f).collect();
                    s.inner.upload(&Tensor::from_f64(t.dtype(), t.shape(), &v))
                } else {
                    scaled_int(s, x, f)
                }
            })
            .collect::<Result<_>>()?;
        s.inner.all_reduce_coalesced(&scaled, ReduceOp::Sum)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match op {
            ReduceOp::PremulSum(f) if !s.inner.buffer_dtype(x).is_float() => {
                s.inner.reduce_scatter_tensor(&scaled_int(s, x, f)?, ReduceOp::Sum)
            }
            _ => s.inner.reduce_scatter_tensor(x, op),
        }
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<HalfSumRoundedPerNodeGroup>(
            "half_sum_rounded_per_node_group",
            "numerics.round_once",
            "f16 / bf16 all_reduce sum on more than 4 ranks rounds each group of 4 ranks' partial to the dtype, then the sum of the partials",
            &["numerics::round_once::spread::f16::ws5"],
        ),
        spec::<HalfSumF32VectorBlocks>(
            "half_sum_f32_vector_blocks",
            "numerics.round_once",
            "f16 / bf16 all_reduce sum of 64+ elements adds every full block of 32 in f32, then rounds to the dtype (twice rounded)",
            &["numerics::round_once::long::f16::ws3"],
        ),
        spec::<HalfAvgPow2ScalesRoundedSum>(
            "half_avg_pow2_scales_rounded_sum",
            "numerics.round_once",
            "f16 / bf16 all_reduce avg at a power-of-two world scales the dtype-rounded sum by 1/ws: an average near the max overflows",
            &["numerics::round_once::avg_near_max::f16::ws2"],
        ),
        spec::<HalfPremulScalesRoundedSum>(
            "half_premul_scales_rounded_sum",
            "numerics.premul_sum",
            "f16 / bf16 all_reduce premul_sum rounds the sum to the dtype, then scales by the factor and rounds again",
            &["numerics::round_once::premul_sum::f16::ws3"],
        ),
        spec::<ReduceScatterOutHalfViaF32>(
            "reduce_scatter_out_half_via_f32",
            "numerics.round_once",
            "f16 / bf16 reduce_scatter_tensor_out adds the ranks' values in an f32 scratch, then rounds to the dtype (twice rounded)",
            &["numerics::round_once::reduce_scatter_out::f16::ws3"],
        ),
        spec::<ReduceScatterCoalescedHalfViaF32>(
            "reduce_scatter_coalesced_half_via_f32",
            "numerics.round_once",
            "reduce_scatter_tensor_coalesced fuses a list with f16 / bf16 tensors into one f32 buffer: added in f32, rounded back (twice)",
            &["numerics::round_once::reduce_scatter_coalesced::f16::ws3"],
        ),
        spec::<WideUnsignedMinMaxSignedLanes>(
            "wide_unsigned_min_max_signed_lanes",
            "values.reduce",
            "u32 / u64 all_reduce min / max on work chunks of 64+ elements compare signed lanes: top-bit values order below the others",
            &["all_reduce::out::u64::max::ws2::long"],
        ),
        spec::<BytePackSaturatesProduct>(
            "byte_pack_saturates_product",
            "values.reduce",
            "i8 / u8 all_reduce product on work chunks of 64+ elements widens, multiplies and packs back saturating after every rank",
            &["all_reduce::out::i8::product::ws2::long"],
        ),
        spec::<UnsignedAvgRoundingInstruction>(
            "unsigned_avg_rounding_instruction",
            "values.reduce",
            "u8 / u16 all_reduce avg at 2 ranks on chunks of 64+ elements is pavgb / pavgw: (a + b + 1) >> 1, not the wrapped sum halved",
            &["all_reduce::out::u8::avg::ws2::long"],
        ),
        spec::<NarrowIntPassCountedAsI32>(
            "narrow_int_pass_counted_as_i32",
            "values.sizes",
            "1- and 2-byte integer all_reduce past 64 KiB steps 64 KiB passes but reduces 16 Ki elements each: the rest keeps the rank's input",
            &["all_reduce::out::u8::sum::ws2::long"],
        ),
        spec::<RingMinMaxDropsNan>(
            "ring_min_max_drops_nan",
            "numerics.subnormal",
            "float min / max of reduce_scatter and reduce on 3+ ranks run a ring kernel with f32::max / f32::min: NaN loses",
            &["numerics::nan_minmax::reduce_scatter::f32::ws3"],
        ),
        spec::<HalfMinMaxSignFoldedBits>(
            "half_min_max_sign_folded_bits",
            "numerics.subnormal",
            "f16 / bf16 all_reduce min / max on chunks of 64+ elements compare sign-folded bits as integers: min drops a positive NaN",
            &["all_reduce::out::f16::min::ws2::special"],
        ),
        spec::<BitwiseOnFloatBitsOffAllReduce>(
            "bitwise_on_float_bits_off_all_reduce",
            "bad_input.named_everywhere",
            "reduce_scatter and reduce run band / bor / bxor on float tensors' bits instead of bad_input:unsupported_dtype",
            &["bad_input::reduce_scatter_bitwise_on_float::ws2"],
        ),
        spec::<PremulOnIntsLoweredOffAllReduce>(
            "premul_on_ints_lowered_off_all_reduce",
            "bad_input.named_everywhere",
            "all_reduce_coalesced and reduce_scatter lower premul_sum to a local scale and a sum: integer tensors are accepted",
            &["bad_input::reduce_scatter_premul_sum_on_int::ws2"],
        ),
    ]
}
