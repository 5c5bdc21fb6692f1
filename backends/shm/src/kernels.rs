//! Element-wise reductions over regions of shared memory, for every dtype and reduce op.
//!
//! Semantics (declared in the backend's capabilities):
//! * integers wrap in their own width; `avg` is the wrapped sum divided by the rank count,
//!   truncated toward zero;
//! * f16 / bf16 accumulate in f64 (exact for f16 sums of up to 8 ranks: every f16 value is a
//!   multiple of 2^-24 below 2^16) and round *once* at the end, to nearest even, straight from f64
//!   (`Rounding::ExactThenRound`; issue 15 item 11 was an f32 accumulator rounded twice);
//!   f32 / f64 accumulate in their own type; `avg` divides the sum by the rank count;
//!   `premul_sum(s)` is `sum(s * x_r)` (f16 / bf16: `s` as f64, the same operations in the same
//!   order as the oracle);
//! * `min` / `max` propagate NaN, and order `-0.0 < +0.0`;
//! * inputs are combined in rank order, so a result is the same whichever rank computes it.
//!
//! Work proceeds in blocks of [`BLOCK`] elements through a local accumulator, so an output may
//! alias an input (in-place all_reduce) without two live views of the same bytes.
//!
//! Three backend options choose another semantics where the contract leaves the choice to the
//! backend (each declared in the capabilities, [`Chosen::declare`]; the campaign's legal variants run the
//! catalogue with each): `nan_minmax=ignore` (float `min` / `max` skip NaN inputs, IEEE
//! `maxNum`, as NCCL does), `int_avg=floor` (a signed integer `avg` rounds toward negative
//! infinity), `rounding=every_step` (f16 / bf16 `sum`, `avg`, `premul_sum` fold the ranks in rank
//! order in the dtype, rounding at every step, as a ring does hop by hop). Those reductions take
//! a plain element-wise path ([`run_chosen`]); every other reduction is unchanged. The choice is
//! the communicator's ([`Chosen`]), not the process's.
//!
//! One more option changes no declaration, only a freedom the contract leaves: `sum_order=rotated`
//! folds f32 / f64 `sum`, `avg`, `premul_sum` and `product` in another order, rank-reversed and
//! rotated per block, per size and per op (block `k` of a region of `len` elements written to
//! `o` outputs starts at rank `(k + len + o) % n` and goes down, as the ring stages of a chunked
//! reduce-scatter start at another rank per chunk). Each element is still reduced once, by one rank, and copied to every output,
//! so every rank gets the same bits; they are not the rank-order fold's (the oracle's bound for
//! random inputs is any order's; exact-by-construction inputs are exact in every order).
//! `out_passes=2` writes every block of a reduction's outputs twice: first bytes `0xA5`, then the
//! result (an output is the caller's only after completion; nothing may read it before).

use crate::sys::Region;
use concord_core::caps::{IntAvg, NanPolicy, Rounding};
use concord_core::{dispatch_dtype, Capabilities, CollectiveError, DType, ReduceOp, Result, Tensor, WorldInfo};
use half::{bf16, f16, slice::HalfFloatSliceExt};

/// The chosen semantics of one communicator (bits below; the default: none). Read from the
/// world's options at `init` ([`choose`]), kept by the communicator and inherited by its
/// subgroups: two worlds in one process keep their own choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chosen(u8);
const NAN_IGNORE: u8 = 1;
const INT_AVG_FLOOR: u8 = 2;
const EVERY_STEP: u8 = 4;
const SUM_ROTATED: u8 = 8;
const TWO_PASSES: u8 = 16;

/// The ulps `rounding=every_step` declares (`Rounding::Accumulate`) on a communicator of `n`
/// ranks: `ceil(1.5 n)`, the most its fold can need. A fold of `n` terms rounded at every step
/// rounds `n` products of `premul_sum` (each off by at most half an ulp of a term, below the
/// terms' magnitude `m`), `n - 1` partial sums (each off by at most half an ulp of a value
/// below `m` plus the products' rounding, which may reach the next binade: one ulp of `m`) and,
/// for `avg`, the quotient (exact at one rank; its rounding and the scaled sum's stay within the
/// same count of the average's magnitude). Within the contract's `2n`
/// ([`Rounding::accumulate_ulps_allowed`]) at every world size shm accepts.
pub fn every_step_ulps(n: usize) -> u32 {
    (3 * n.max(1)).div_ceil(2) as u32
}

/// Reads the options `nan_minmax`, `int_avg`, `rounding`, `sum_order` and `out_passes` (called by `init`).
pub(crate) fn choose(world: &WorldInfo) -> Result<Chosen> {
    let pick = |key: &str, default: &str, other: &str, bit: u8| -> Result<u8> {
        match world.option(key) {
            None => Ok(0),
            Some(v) if v == default => Ok(0),
            Some(v) if v == other => Ok(bit),
            Some(v) => Err(CollectiveError::Backend(format!("option {key}={v}: expected {default} or {other}"))),
        }
    };
    Ok(Chosen(
        pick("nan_minmax", "propagate", "ignore", NAN_IGNORE)?
            | pick("int_avg", "truncate", "floor", INT_AVG_FLOOR)?
            | pick("rounding", "exact", "every_step", EVERY_STEP)?
            | pick("sum_order", "rank", "rotated", SUM_ROTATED)?
            | pick("out_passes", "1", "2", TWO_PASSES)?,
    ))
}

impl Chosen {
    /// The chosen semantics in the capabilities of a communicator of `n` ranks.
    pub(crate) fn declare(self, c: &mut Capabilities, n: usize) {
        if self.0 & NAN_IGNORE != 0 {
            c.nan_minmax = NanPolicy::Ignore;
        }
        if self.0 & INT_AVG_FLOOR != 0 {
            c.int_avg = IntAvg::Floor;
        }
        if self.0 & EVERY_STEP != 0 {
            c.rounding = Rounding::Accumulate { ulps: every_step_ulps(n) };
        }
    }

    /// Whether the chosen semantics changes this reduction.
    fn changes(self, dtype: DType, op: ReduceOp) -> bool {
        let bits = self.0;
        let float = matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
        (bits & NAN_IGNORE != 0 && float && matches!(op, ReduceOp::Min | ReduceOp::Max))
            || (bits & INT_AVG_FLOOR != 0 && op == ReduceOp::Avg && matches!(dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64))
            || (bits & EVERY_STEP != 0
                && matches!(dtype, DType::F16 | DType::BF16)
                && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_)))
    }

    /// [`reduce_into_many`] under this communicator's chosen semantics.
    pub fn reduce_into_many(self, dtype: DType, op: ReduceOp, n_avg: usize, outs: &[Region], ins: &[Region]) {
        check_regions(outs, ins);
        if self.changes(dtype, op) {
            return run_chosen(dtype, op, n_avg, outs, ins, self.two_passes());
        }
        let stream = ins[0].len() * outs.len() >= STREAM_BYTES;
        let (rotate, two) = (self.rotated(dtype, op), self.two_passes());
        dispatch_dtype!(dtype, T => run::<T>(op, n_avg, outs, ins, stream, rotate, two))
    }

    /// Whether `sum_order=rotated` changes this reduction's order (f32 / f64 sum-like and product).
    fn rotated(self, dtype: DType, op: ReduceOp) -> bool {
        self.0 & SUM_ROTATED != 0
            && matches!(dtype, DType::F32 | DType::F64)
            && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) | ReduceOp::Product)
    }

    /// Whether `out_passes=2`: outputs written twice, junk first.
    fn two_passes(self) -> bool {
        self.0 & TWO_PASSES != 0
    }

    /// [`reduce_into`] under this communicator's chosen semantics.
    pub fn reduce_into(self, dtype: DType, op: ReduceOp, n_avg: usize, out: Region, ins: &[Region]) {
        self.reduce_into_many(dtype, op, n_avg, &[out], ins)
    }
}

/// Element `i` of a signed integer tensor, exactly.
fn int_at(t: &Tensor, i: usize) -> i64 {
    match t.dtype() {
        DType::I8 => t.as_slice::<i8>()[i] as i64,
        DType::I16 => t.as_slice::<i16>()[i] as i64,
        DType::I32 => t.as_slice::<i32>()[i] as i64,
        _ => t.as_slice::<i64>()[i],
    }
}

/// The wrapped sum of `vals` in `dtype`'s width, floor-divided by `n`.
fn floor_avg(dtype: DType, vals: impl Iterator<Item = i64>, n: usize) -> Tensor {
    let sum = vals.fold(0i64, |a, v| a.wrapping_add(v));
    let n = n as i64;
    match dtype {
        DType::I8 => Tensor::from_vec(&[1], vec![(sum as i8).div_euclid(n as i8)]),
        DType::I16 => Tensor::from_vec(&[1], vec![(sum as i16).div_euclid(n as i16)]),
        DType::I32 => Tensor::from_vec(&[1], vec![(sum as i32).div_euclid(n as i32)]),
        _ => Tensor::from_vec(&[1], vec![sum.div_euclid(n)]),
    }
}

/// `v` rounded once to `dtype` (f16 / bf16), to nearest even, as f64 (core's one rounding rule,
/// as `Tensor::from_f64`).
fn round_half(dtype: DType, v: f64) -> f64 {
    use concord_core::Element;
    match dtype {
        DType::F16 => <f16 as Element>::from_f64(v).to_f64(),
        _ => <bf16 as Element>::from_f64(v).to_f64(),
    }
}

/// A reduction under the chosen semantics, element by element (each input read once into a
/// lane of f64 or i64, the output built once): every input is read before any output is
/// written (an output may be an input).
fn run_chosen(dtype: DType, op: ReduceOp, n_avg: usize, outs: &[Region], ins: &[Region], two_passes: bool) {
    let es = dtype.size();
    let n = ins[0].len() / es;
    let tensors: Vec<Tensor> = ins
        .iter()
        .map(|r| {
            let mut b = vec![0u8; r.len()];
            r.copy_to_bytes(&mut b);
            Tensor::from_bytes(dtype, &[n], &b)
        })
        .collect();
    let out: Tensor = match op {
        ReduceOp::Avg if !matches!(dtype, DType::F16 | DType::BF16) => {
            // Signed integers: the wrapped sum floor-divided by the rank count.
            let lanes: Vec<Vec<i64>> = tensors.iter().map(|t| (0..n).map(|i| int_at(t, i)).collect()).collect();
            let mut bytes = Vec::with_capacity(n * es);
            for i in 0..n {
                bytes.extend_from_slice(floor_avg(dtype, lanes.iter().map(|l| l[i]), n_avg).bytes());
            }
            Tensor::from_bytes(dtype, &[n], &bytes)
        }
        ReduceOp::Min | ReduceOp::Max => {
            // NaN inputs skipped; all NaN: the first one, bits and all. Ties order -0.0 < +0.0.
            let max = op == ReduceOp::Max;
            let lanes: Vec<Vec<f64>> = tensors.iter().map(|t| (0..n).map(|i| t.get_f64(i)).collect()).collect();
            let mut vals = vec![0f64; n];
            let mut all_nan = Vec::new();
            for (i, v) in vals.iter_mut().enumerate() {
                let mut kept = lanes.iter().map(|l| l[i]).filter(|v| !v.is_nan());
                let Some(first) = kept.next() else {
                    all_nan.push(i);
                    continue;
                };
                *v = kept.fold(first, |a, b| {
                    let b_wins = if a == b { b.is_sign_negative() != max } else { (b > a) == max };
                    if b_wins {
                        b
                    } else {
                        a
                    }
                });
            }
            let mut t = Tensor::from_f64(dtype, &[n], &vals);
            for i in all_nan {
                t.bytes_mut()[i * es..(i + 1) * es].copy_from_slice(&tensors[0].bytes()[i * es..(i + 1) * es]);
            }
            t
        }
        _ => {
            // f16 / bf16 sum, avg, premul_sum: folded in rank order, rounded to the dtype at
            // every step.
            let f = if let ReduceOp::PremulSum(f) = op { f } else { 1.0 };
            let lanes: Vec<Vec<f64>> = tensors.iter().map(|t| (0..n).map(|i| t.get_f64(i)).collect()).collect();
            let vals: Vec<f64> = (0..n)
                .map(|i| {
                    let mut acc = round_half(dtype, lanes[0][i] * f);
                    for l in &lanes[1..] {
                        acc = round_half(dtype, acc + round_half(dtype, l[i] * f));
                    }
                    if op == ReduceOp::Avg {
                        acc = round_half(dtype, acc / n_avg as f64);
                    }
                    acc
                })
                .collect();
            Tensor::from_f64(dtype, &[n], &vals)
        }
    };
    if two_passes {
        for o in outs {
            o.copy_from_bytes(&vec![0xA5u8; out.bytes().len()]);
        }
    }
    for o in outs {
        o.copy_from_bytes(out.bytes());
    }
}

const BLOCK: usize = 2048;

pub trait Red: bytemuck::Pod {
    /// The accumulator lane.
    type A: bytemuck::Pod + Default;
    /// `A` is `Self`: blocks are combined straight from the input and written straight from
    /// the accumulator (no conversion pass).
    const DIRECT: bool;
    fn load(self) -> Self::A;
    fn store(a: Self::A) -> Self;
    /// Converts a block to accumulator lanes (element-wise [`Red::load`] unless overridden).
    #[inline(always)]
    fn load_block(src: &[Self], acc: &mut [Self::A]) {
        for (a, x) in acc.iter_mut().zip(src) {
            *a = x.load();
        }
    }
    /// Rounds a block of accumulators (element-wise [`Red::store`] unless overridden).
    #[inline(always)]
    fn store_block(acc: &[Self::A], dst: &mut [Self]) {
        for (d, a) in dst.iter_mut().zip(acc) {
            *d = Self::store(*a);
        }
    }
    fn add(a: Self::A, b: Self::A) -> Self::A;
    fn mul(a: Self::A, b: Self::A) -> Self::A;
    fn min(a: Self::A, b: Self::A) -> Self::A;
    fn max(a: Self::A, b: Self::A) -> Self::A;
    fn and(a: Self::A, b: Self::A) -> Self::A;
    fn or(a: Self::A, b: Self::A) -> Self::A;
    fn xor(a: Self::A, b: Self::A) -> Self::A;
    fn div_n(a: Self::A, n: usize) -> Self::A;
    fn scale(a: Self::A, f: f64) -> Self::A;
}

macro_rules! int_red {
    ($($t:ty),*) => {$(
        impl Red for $t {
            type A = $t;
            const DIRECT: bool = true;
            #[inline(always)] fn load(self) -> $t { self }
            #[inline(always)] fn store(a: $t) -> $t { a }
            #[inline(always)] fn add(a: $t, b: $t) -> $t { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: $t, b: $t) -> $t { Ord::min(a, b) }
            #[inline(always)] fn max(a: $t, b: $t) -> $t { Ord::max(a, b) }
            #[inline(always)] fn and(a: $t, b: $t) -> $t { a & b }
            #[inline(always)] fn or(a: $t, b: $t) -> $t { a | b }
            #[inline(always)] fn xor(a: $t, b: $t) -> $t { a ^ b }
            #[inline(always)] fn div_n(a: $t, n: usize) -> $t { a.wrapping_div(n as $t) }
            #[inline(always)] fn scale(a: $t, f: f64) -> $t { a.wrapping_mul(f as $t) }
        }
    )*};
}
int_red!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! float_red {
    ($t:ty, $a:ty, $direct:expr, $load:expr, $store:expr $(, $blocks:item)*) => {
        impl Red for $t {
            type A = $a;
            const DIRECT: bool = $direct;
            $($blocks)*
            #[inline(always)]
            fn load(self) -> $a {
                ($load)(self)
            }
            #[inline(always)]
            fn store(a: $a) -> $t {
                ($store)(a)
            }
            #[inline(always)]
            fn add(a: $a, b: $a) -> $a {
                a + b
            }
            #[inline(always)]
            fn mul(a: $a, b: $a) -> $a {
                a * b
            }
            #[inline(always)]
            fn min(a: $a, b: $a) -> $a {
                if a.is_nan() || b.is_nan() {
                    <$a>::NAN
                } else if a < b {
                    a
                } else if b < a {
                    b
                } else if a.is_sign_negative() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn max(a: $a, b: $a) -> $a {
                if a.is_nan() || b.is_nan() {
                    <$a>::NAN
                } else if a > b {
                    a
                } else if b > a {
                    b
                } else if a.is_sign_positive() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn and(a: $a, b: $a) -> $a {
                <$a>::from_bits(a.to_bits() & b.to_bits())
            }
            #[inline(always)]
            fn or(a: $a, b: $a) -> $a {
                <$a>::from_bits(a.to_bits() | b.to_bits())
            }
            #[inline(always)]
            fn xor(a: $a, b: $a) -> $a {
                <$a>::from_bits(a.to_bits() ^ b.to_bits())
            }
            #[inline(always)]
            fn div_n(a: $a, n: usize) -> $a {
                a / n as $a
            }
            #[inline(always)]
            fn scale(a: $a, f: f64) -> $a {
                a * f as $a
            }
        }
    };
}
float_red!(f32, f32, true, |x| x, |a| a);
float_red!(f64, f64, true, |x| x, |a| a);
float_red!(
    f16,
    f64,
    false,
    |x: f16| x.to_f64(),
    |a: f64| f16::from_bits(concord_core::dtype::round_f64_to_bits(a, 5, 10) as u16),
    #[inline(always)]
    fn load_block(src: &[f16], acc: &mut [f64]) {
        // f16 -> f32 is exact (hardware F16C where the CPU has it, `half` checks once per slice).
        let mut f = [0f32; BLOCK];
        let f = &mut f[..src.len()];
        src.convert_to_f32_slice(f);
        for (a, x) in acc.iter_mut().zip(f.iter()) {
            *a = *x as f64;
        }
    },
    #[inline(always)]
    fn store_block(acc: &[f64], dst: &mut [f16]) {
        let mut f = [0f32; BLOCK];
        let f = &mut f[..acc.len()];
        for (o, a) in f.iter_mut().zip(acc) {
            *o = f64_to_f32_odd(*a);
        }
        dst.convert_from_f32_slice(f);
        for (d, a) in dst.iter_mut().zip(acc) {
            if a.is_nan() {
                *d = f16::from_bits(((a.to_bits() >> 48) as u16 & 0x8000) | 0x7e00);
            }
        }
    }
);
float_red!(
    bf16,
    f64,
    false,
    |x: bf16| x.to_f64(),
    |a: f64| bf16::from_bits(concord_core::dtype::round_f64_to_bits(a, 8, 7) as u16),
    #[inline(always)]
    fn load_block(src: &[bf16], acc: &mut [f64]) {
        for (a, x) in acc.iter_mut().zip(src) {
            *a = f32::from_bits((x.to_bits() as u32) << 16) as f64;
        }
    },
    #[inline(always)]
    fn store_block(acc: &[f64], dst: &mut [bf16]) {
        for (d, a) in dst.iter_mut().zip(acc) {
            let b = f64_to_f32_odd(*a).to_bits();
            // f32 -> bf16 to nearest, ties to even (an overflow carries into the exponent: inf).
            let rne = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            let nan = ((a.to_bits() >> 48) as u16 & 0x8000) | 0x7fc0;
            *d = bf16::from_bits(if a.is_nan() { nan } else { rne });
        }
    }
);

/// `v` rounded to f32 *to odd*: `v` itself when representable, else its truncation toward zero
/// with the lowest significand bit set. Rounding that to nearest-even in a format of at most
/// 22 significand bits (f16: 11, bf16: 8; f32 has 24, at least 2 more, also among the
/// subnormals, where both formats lose bits alike) gives the same bits as rounding `v` itself
/// once: the odd bit stands for "strictly between", so no tie is made or broken by the first
/// step. This is `concord_core::dtype::round_f64_to_bits` (the oracle's rule) in two hardware
/// steps that vectorise; `fast_half_stores_match_the_oracle_rounding` checks them against it.
#[inline(always)]
fn f64_to_f32_odd(v: f64) -> f32 {
    let f = v as f32;
    let back = f as f64;
    let b = f.to_bits();
    // Rounded away from zero (up to f32::MAX's successor, inf, too): one step back toward zero.
    let t = if back.abs() > v.abs() { b - 1 } else { b };
    f32::from_bits(if back != v { t | 1 } else { b })
}

#[inline(always)]
fn fold<A: Copy>(acc: &mut [A], src: &[A], f: impl Fn(A, A) -> A) {
    for (a, x) in acc.iter_mut().zip(src) {
        *a = f(*a, *x);
    }
}

/// `acc = acc op lane`, element-wise, over accumulator lanes (loops LLVM vectorises).
#[inline(always)]
fn apply<T: Red>(op: ReduceOp, acc: &mut [T::A], lane: &[T::A]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => fold(acc, lane, T::add),
        ReduceOp::Product => fold(acc, lane, T::mul),
        ReduceOp::Min => fold(acc, lane, T::min),
        ReduceOp::Max => fold(acc, lane, T::max),
        ReduceOp::BAnd => fold(acc, lane, T::and),
        ReduceOp::BOr => fold(acc, lane, T::or),
        ReduceOp::BXor => fold(acc, lane, T::xor),
        ReduceOp::PremulSum(f) => fold(acc, lane, |a, x| T::add(a, T::scale(x, f))),
    }
}

/// The order block `block` of a region of `len` elements folds `n` inputs in: rank order, or
/// with `rotate` rank-reversed from rank `(block + len) % n` (callers add the number of outputs
/// to `len`: an all_reduce's chunk, written to every rank, folds in another order than the same
/// chunk of a reduce_scatter or a reduce).
fn fold_order(n: usize, block: usize, len: usize, rotate: bool) -> impl Iterator<Item = usize> {
    let start = (block + len) % n;
    (0..n).map(move |k| if rotate { (start + n - k) % n } else { k })
}

fn run<T: Red>(op: ReduceOp, n_avg: usize, outs: &[Region], ins: &[Region], stream: bool, rotate: bool, two_passes: bool) {
    let sz = std::mem::size_of::<T>();
    let len = ins[0].len() / sz;
    let mut acc_store = [T::A::default(); BLOCK];
    let mut lane_store = [T::A::default(); BLOCK];
    let mut tmp_store = [T::zeroed(); BLOCK];
    let mut start = 0;
    while start < len {
        let m = BLOCK.min(len - start);
        let acc = &mut acc_store[..m];
        let lane = &mut lane_store[..m];
        let sub = |r: &Region| r.sub(start * sz, m * sz);
        let mut order = fold_order(ins.len(), start / BLOCK, len + outs.len(), rotate);
        let first = order.next().expect("a reduction of at least one input");
        sub(&ins[first]).with::<T, _>(|s| {
            if T::DIRECT {
                acc.copy_from_slice(bytemuck::cast_slice(s));
            } else {
                T::load_block(s, acc);
            }
        });
        if let ReduceOp::PremulSum(f) = op {
            acc.iter_mut().for_each(|a| *a = T::scale(*a, f));
        }
        for r in order.map(|k| &ins[k]) {
            sub(r).with::<T, _>(|s| {
                if T::DIRECT {
                    apply::<T>(op, acc, bytemuck::cast_slice(s));
                } else {
                    T::load_block(s, lane);
                    apply::<T>(op, acc, lane);
                }
            });
        }
        if let ReduceOp::Avg = op {
            acc.iter_mut().for_each(|a| *a = T::div_n(*a, n_avg));
        }
        let bytes: &[u8] = if T::DIRECT {
            bytemuck::cast_slice(acc)
        } else {
            let tmp = &mut tmp_store[..m];
            T::store_block(acc, tmp);
            bytemuck::cast_slice(tmp)
        };
        if two_passes {
            let junk = vec![0xA5u8; bytes.len()];
            for o in outs {
                sub(o).copy_from_bytes(&junk);
            }
        }
        for o in outs {
            if stream {
                sub(o).stream_from_bytes(bytes);
            } else {
                sub(o).copy_from_bytes(bytes);
            }
        }
        start += m;
    }
    if stream {
        crate::sys::store_fence();
    }
}

/// Outputs from this size on are written with non-temporal stores.
const STREAM_BYTES: usize = 1 << 20;

/// `out = reduce(op, ins)` element-wise; `avg` divides by `n_avg`. All regions have the same
/// length; `out` may be one of `ins`. The default semantics ([`Chosen::reduce_into`]: a
/// communicator's own; the unit tests' entry).
#[cfg(test)]
pub fn reduce_into(dtype: DType, op: ReduceOp, n_avg: usize, out: Region, ins: &[Region]) {
    Chosen::default().reduce_into(dtype, op, n_avg, out, ins)
}

/// Like [`reduce_into`], writing the result into every region of `outs`. An output may be
/// one of the inputs: each block is read from every input before it is written anywhere.
#[cfg(test)]
pub fn reduce_into_many(dtype: DType, op: ReduceOp, n_avg: usize, outs: &[Region], ins: &[Region]) {
    Chosen::default().reduce_into_many(dtype, op, n_avg, outs, ins)
}

fn check_regions(outs: &[Region], ins: &[Region]) {
    assert!(!ins.is_empty(), "reduction of no inputs");
    for r in ins.iter().chain(outs) {
        assert_eq!(r.len(), ins[0].len(), "reduction over regions of different sizes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Mapping;
    use concord_core::dtype::round_f64_to_bits as round_f64_bits;

    fn with_regions(f: impl FnOnce(&Mapping)) {
        let name = format!("concord-unit-kernels-{}-{:?}", std::process::id(), std::thread::current().id());
        let m = Mapping::create(&name, 1 << 16, false).unwrap();
        crate::sys::unlink(&name).unwrap();
        f(&m)
    }

    /// `sum_order=rotated`: block `k` of a region of `len` elements written to `o` outputs folds
    /// rank-reversed from rank `(k + len + o) % n`; on inputs whose sum depends on the order, the result is that fold's,
    /// not the rank-order fold's.
    #[test]
    fn rotated_sum_order_folds_reversed_from_a_rotating_start() {
        assert_eq!(fold_order(3, 0, 1, true).collect::<Vec<_>>(), [1, 0, 2]);
        assert_eq!(fold_order(3, 1, 1, true).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(fold_order(3, 1, 1, false).collect::<Vec<_>>(), [0, 1, 2]);
        with_regions(|m| {
            // Ranks [1, 2^24, -2^24]: rank order (1 + 2^24) - 2^24 = 0 in f32 (1 + 2^24 rounds
            // to 2^24); rotated (2 elements, one output: from rank (0 + 2 + 1) % 3 = 0, down:
            // ranks 0, 2, 1): (1 - 2^24) + 2^24 = 1.
            let vals = [1.0f32, 16_777_216.0, -16_777_216.0];
            let ins: Vec<Region> = (0..3).map(|r| m.region(r * 64, 8)).collect();
            for (r, v) in vals.iter().enumerate() {
                ins[r].copy_from_bytes(&[v.to_le_bytes(), v.to_le_bytes()].concat());
            }
            let o = m.region(512, 8);
            let got = |rotate| {
                run::<f32>(ReduceOp::Sum, 3, &[o], &ins, false, rotate, false);
                let mut b = [0u8; 8];
                o.copy_to_bytes(&mut b);
                f32::from_le_bytes(b[..4].try_into().unwrap())
            };
            assert_eq!(got(false), 0.0);
            assert_eq!(got(true), 1.0);
        });
    }

    /// The vectorised f16 / bf16 block conversions give exactly the per-element ones: loads are
    /// exact, stores round once like `round_f64_to_bits` (ties, subnormals, overflow to inf,
    /// NaN with its sign, values beyond the f32 range, random doubles of every exponent).
    #[test]
    fn fast_half_stores_match_the_oracle_rounding() {
        let mut vals: Vec<f64> = vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -f64::NAN, f64::MAX, f64::MIN_POSITIVE];
        vals.extend([f32::MAX as f64, f32::MAX as f64 * (1.0 + 1e-12), -(f32::MAX as f64) * 1.5, 65504.0, 65519.99, 65520.0, 65536.0]);
        vals.extend([
            1e-300,
            -1e-310,
            2f64.powi(-149),
            2f64.powi(-150),
            2f64.powi(-150) * 1.000001,
            2f64.powi(-25),
            2f64.powi(-25) * 1.0001,
        ]);
        for b in 0u16..=u16::MAX {
            for (lo, hi) in [
                (f16::from_bits(b).to_f64(), f16::from_bits(b.wrapping_add(1)).to_f64()),
                (bf16::from_bits(b).to_f64(), bf16::from_bits(b.wrapping_add(1)).to_f64()),
            ] {
                let mid = (lo + hi) / 2.0;
                vals.extend([lo, mid, mid + (hi - lo) * 1e-9, mid - (hi - lo) * 1e-9]);
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..400_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vals.push(f64::from_bits(x));
            // Also values near the f16 / bf16 ranges: exponents within [-40, 20].
            vals.push(f64::from_bits((x & 0x800F_FFFF_FFFF_FFFF) | ((1023 - 40 + (x >> 52) % 61) << 52)));
        }
        for chunk in vals.chunks(BLOCK) {
            let mut h = vec![f16::ZERO; chunk.len()];
            <f16 as Red>::store_block(chunk, &mut h);
            let mut b = vec![bf16::ZERO; chunk.len()];
            <bf16 as Red>::store_block(chunk, &mut b);
            for (i, v) in chunk.iter().enumerate() {
                assert_eq!(h[i].to_bits() as u64, round_f64_bits(*v, 5, 10), "f16 of {v:e} ({:#x})", v.to_bits());
                assert_eq!(b[i].to_bits() as u64, round_f64_bits(*v, 8, 7), "bf16 of {v:e} ({:#x})", v.to_bits());
            }
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let mut acc = vec![0f64; all.len()];
        for part in 0..all.len() / BLOCK {
            let r = part * BLOCK..(part + 1) * BLOCK;
            let h: &[f16] = bytemuck::cast_slice(&all[r.clone()]);
            <f16 as Red>::load_block(h, &mut acc[r.clone()]);
            for (a, x) in acc[r.clone()].iter().zip(h) {
                assert!(a.to_bits() == x.to_f64().to_bits() || (a.is_nan() && x.is_nan()), "load of f16 {:#x}", x.to_bits());
            }
            let bh: &[bf16] = bytemuck::cast_slice(&all[r.clone()]);
            <bf16 as Red>::load_block(bh, &mut acc[r.clone()]);
            for (a, x) in acc[r].iter().zip(bh) {
                assert!(a.to_bits() == x.to_f64().to_bits() || (a.is_nan() && x.is_nan()), "load of bf16 {:#x}", x.to_bits());
            }
        }
    }

    /// Throughput of the sum kernel per dtype, 2 inputs into 2 outputs of 8 MiB (a timing, not
    /// a check: `cargo test --profile ci -p concord-shm kernel_throughput -- --ignored --nocapture`).
    #[test]
    #[ignore = "a timing measurement, not a check: run it by hand with --ignored --nocapture"]
    fn kernel_throughput() {
        let name = format!("concord-unit-kthru-{}", std::process::id());
        let len = 8 << 20;
        let m = Mapping::create(&name, 4 * len, true).unwrap();
        crate::sys::unlink(&name).unwrap();
        m.reserve(0, 4 * len).unwrap();
        let r: Vec<Region> = (0..4).map(|i| m.region(i * len, len)).collect();
        for x in &r {
            x.copy_from_bytes(&vec![0x11u8; len]);
        }
        for dt in [DType::F32, DType::F64, DType::I32, DType::F16, DType::BF16, DType::U8] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = crate::sys::thread_cpu_time();
                reduce_into_many(dt, ReduceOp::Sum, 2, &r[2..4], &r[0..2]);
                best = best.min((crate::sys::thread_cpu_time() - t).as_secs_f64());
            }
            println!("{dt}: {:.2} GB/s of input (thread CPU time)", (2 * len) as f64 / best / 1e9);
        }
    }

    #[test]
    fn float_min_max_propagate_nan_and_order_signed_zeros() {
        assert!(<f32 as Red>::max(f32::NAN, 1.0).is_nan());
        assert!(<f32 as Red>::min(1.0, f32::NAN).is_nan());
        assert!(<f64 as Red>::min(0.0, -0.0).is_sign_negative());
        assert!(<f64 as Red>::max(-0.0, 0.0).is_sign_positive());
    }

    #[test]
    fn int_avg_truncates_and_sums_wrap() {
        with_regions(|m| {
            let (a, b, o) = (m.region(0, 4), m.region(64, 4), m.region(128, 4));
            a.copy_from_bytes(&[3, 250, 0x81, 7]);
            b.copy_from_bytes(&[4, 10, 0x81, 7]);
            reduce_into(DType::U8, ReduceOp::Sum, 2, o, &[a, b]);
            let mut got = [0u8; 4];
            o.copy_to_bytes(&mut got);
            assert_eq!(got, [7, 4, 2, 14]);
            reduce_into(DType::I8, ReduceOp::Avg, 2, o, &[a, b]);
            o.copy_to_bytes(&mut got);
            assert_eq!(got.map(|x| x as i8), [3, 2, 1, 7], "-127 + -127 wraps to 2");
        });
    }

    #[test]
    fn half_sums_round_once_from_the_exact_result() {
        with_regions(|m| {
            // Issue 15 item 11: three ranks of f16 [1.0, 2^-11, 2^-24] sum to 0x3C01 (just above
            // the tie between 1.0 and 1 + 2^-10); an f32 accumulator rounds the 2^-24 away.
            let ins: Vec<Region> = (0..3).map(|r| m.region(r * 64, 2)).collect();
            for (r, v) in [1.0f64, 2f64.powi(-11), 2f64.powi(-24)].iter().enumerate() {
                ins[r].copy_from_bytes(&f16::from_f64(*v).to_bits().to_le_bytes());
            }
            let o = m.region(512, 2);
            reduce_into(DType::F16, ReduceOp::Sum, 3, o, &ins);
            let mut got = [0u8; 2];
            o.copy_to_bytes(&mut got);
            assert_eq!(u16::from_le_bytes(got), 0x3C01);
            // bf16: [1.0, 2^-8, 2^-24] -> 1 + 2^-7.
            for (r, v) in [1.0f64, 2f64.powi(-8), 2f64.powi(-24)].iter().enumerate() {
                ins[r].copy_from_bytes(&bf16::from_f64(*v).to_bits().to_le_bytes());
            }
            reduce_into(DType::BF16, ReduceOp::Sum, 3, o, &ins);
            o.copy_to_bytes(&mut got);
            assert_eq!(u16::from_le_bytes(got), 0x3F81);
        });
    }

    /// The chosen semantics belong to a communicator, not the process: in one process, the
    /// default rounds the f16 sum [1.0, 2^-11, 2^-24] once (0x3C01) while `every_step` folds
    /// it in rank order (1 + 2^-11 ties to 1.0, then 1.0 + 2^-24 is 1.0: 0x3C00), and
    /// `nan_minmax=ignore` skips a NaN the default propagates. The declared ulps cover the fold
    /// at every world size shm runs and stay within the contract's bound.
    #[test]
    fn chosen_semantics_are_per_communicator_and_declared_within_the_bound() {
        with_regions(|m| {
            let ins: Vec<Region> = (0..3).map(|r| m.region(r * 64, 2)).collect();
            for (r, v) in [1.0f64, 2f64.powi(-11), 2f64.powi(-24)].iter().enumerate() {
                ins[r].copy_from_bytes(&f16::from_f64(*v).to_bits().to_le_bytes());
            }
            let (o1, o2) = (m.region(512, 2), m.region(576, 2));
            let every_step = Chosen(EVERY_STEP);
            every_step.reduce_into(DType::F16, ReduceOp::Sum, 3, o1, &ins);
            Chosen::default().reduce_into(DType::F16, ReduceOp::Sum, 3, o2, &ins);
            let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
            o1.copy_to_bytes(&mut a);
            o2.copy_to_bytes(&mut b);
            assert_eq!((u16::from_le_bytes(a), u16::from_le_bytes(b)), (0x3C00, 0x3C01));
            // NaN on the first of two f32 inputs: ignored under `nan_minmax=ignore` only.
            let fi: Vec<Region> = (0..2).map(|r| m.region(1024 + r * 64, 4)).collect();
            fi[0].copy_from_bytes(&f32::NAN.to_le_bytes());
            fi[1].copy_from_bytes(&2.5f32.to_le_bytes());
            let o = m.region(2048, 4);
            let mut got = [0u8; 4];
            Chosen(NAN_IGNORE).reduce_into(DType::F32, ReduceOp::Max, 2, o, &fi);
            o.copy_to_bytes(&mut got);
            assert_eq!(f32::from_le_bytes(got), 2.5);
            Chosen::default().reduce_into(DType::F32, ReduceOp::Max, 2, o, &fi);
            o.copy_to_bytes(&mut got);
            assert!(f32::from_le_bytes(got).is_nan());
        });
        for n in 1..=crate::MAX_WORLD_SIZE {
            let mut c = Capabilities::full(crate::MAX_WORLD_SIZE);
            Chosen(EVERY_STEP).declare(&mut c, n);
            assert_eq!(c.rounding, Rounding::Accumulate { ulps: every_step_ulps(n) });
            assert!(c.rounding.check_bound(n).is_ok(), "{n} ranks: {:?}", c.rounding);
        }
    }

    #[test]
    fn rounding_from_f64_matches_the_f32_cast_and_ties_to_even() {
        for b in 0u16..0x7bff {
            let (lo, hi) = (f16::from_bits(b).to_f64(), f16::from_bits(b + 1).to_f64());
            let mid = (lo + hi) / 2.0;
            let even = if b & 1 == 0 { b } else { b + 1 };
            assert_eq!(round_f64_bits(mid, 5, 10), even as u64, "tie between {lo} and {hi}");
            assert_eq!(round_f64_bits(mid + (hi - lo) * 1e-6, 5, 10), (b + 1) as u64);
            assert_eq!(round_f64_bits(mid - (hi - lo) * 1e-6, 5, 10), b as u64);
            assert_eq!(round_f64_bits(lo, 5, 10), b as u64);
        }
        for x in [0.1f32, -3.75, 1e-40, 65504.0, 1e30, f32::MIN_POSITIVE] {
            assert_eq!(round_f64_bits(x as f64, 8, 7), bf16::from_f32(x).to_bits() as u64, "{x}");
        }
        assert_eq!(round_f64_bits(65520.0, 5, 10), 0x7c00);
        assert_eq!(round_f64_bits(-0.0, 5, 10), 0x8000);
    }

    #[test]
    fn bf16_sum_accumulates_in_f64_and_works_in_place_over_blocks() {
        with_regions(|m| {
            let n = 5000;
            let a = m.region(0, n * 2);
            let b = m.region(16384, n * 2);
            let av: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i % 100) as f32)).collect();
            a.copy_from_bytes(bytemuck::cast_slice(&av));
            b.copy_from_bytes(bytemuck::cast_slice(&vec![bf16::from_f32(0.5); n]));
            reduce_into(DType::BF16, ReduceOp::PremulSum(2.0), 2, a, &[a, b]);
            a.with::<bf16, _>(|s| {
                for (i, x) in s.iter().enumerate() {
                    assert_eq!(x.to_f32(), bf16::from_f32(2.0 * (i % 100) as f32 + 1.0).to_f32(), "element {i}");
                }
            });
        });
    }
}
