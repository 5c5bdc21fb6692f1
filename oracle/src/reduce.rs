//! Elementwise reduction over ranks, with Concord's exact semantics.
//!
//! * Integers: wrapping arithmetic in the dtype's own width, so every reduction order gives the
//!   same bits (sum and product wrap). `avg` = wrapping sum in the dtype width, then division by
//!   the world size rounded per [`IntAvg`] (as NCCL: the sum is never widened).
//! * Floats: `sum`, `avg`, `product` and `premul_sum` are computed in f64 and rounded *once*
//!   (round to nearest, ties to even) to the dtype. With exact-by-construction inputs this equals
//!   the result of any reduction order done in the dtype itself.
//! * `min` / `max` per [`NanPolicy`]; `min(-0, +0) = -0`, `max(-0, +0) = +0`.
//! * Bitwise ops on integers only; `premul_sum(s)` = `sum(s * x)` on floats only.

use crate::Semantics;
use concord_core::{dispatch_dtype, DType, Element, IntAvg, NanPolicy, ReduceOp, Tensor};

/// Bits of an integer element, sign-extended (signed dtypes) or zero-extended (unsigned).
pub(crate) fn int_at(t: &Tensor, i: usize) -> i128 {
    match t.dtype() {
        DType::I8 => t.as_slice::<i8>()[i] as i128,
        DType::U8 => t.as_slice::<u8>()[i] as i128,
        DType::I16 => t.as_slice::<i16>()[i] as i128,
        DType::U16 => t.as_slice::<u16>()[i] as i128,
        DType::I32 => t.as_slice::<i32>()[i] as i128,
        DType::U32 => t.as_slice::<u32>()[i] as i128,
        DType::I64 => t.as_slice::<i64>()[i] as i128,
        DType::U64 => t.as_slice::<u64>()[i] as i128,
        d => panic!("int_at on float dtype {d}"),
    }
}

/// Stores the low `8 * size` bits of `v` (two's complement truncation: wrapping).
pub(crate) fn set_int(t: &mut Tensor, i: usize, v: i128) {
    match t.dtype() {
        DType::I8 => t.as_mut_slice::<i8>()[i] = v as i8,
        DType::U8 => t.as_mut_slice::<u8>()[i] = v as u8,
        DType::I16 => t.as_mut_slice::<i16>()[i] = v as i16,
        DType::U16 => t.as_mut_slice::<u16>()[i] = v as u16,
        DType::I32 => t.as_mut_slice::<i32>()[i] = v as i32,
        DType::U32 => t.as_mut_slice::<u32>()[i] = v as u32,
        DType::I64 => t.as_mut_slice::<i64>()[i] = v as i64,
        DType::U64 => t.as_mut_slice::<u64>()[i] = v as u64,
        d => panic!("set_int on float dtype {d}"),
    }
}

/// Wraps `v` to the dtype's width and re-extends it (signed or unsigned).
fn wrap(dtype: DType, v: i128) -> i128 {
    match dtype {
        DType::I8 => v as i8 as i128,
        DType::U8 => v as u8 as i128,
        DType::I16 => v as i16 as i128,
        DType::U16 => v as u16 as i128,
        DType::I32 => v as i32 as i128,
        DType::U32 => v as u32 as i128,
        DType::I64 => v as i64 as i128,
        DType::U64 => v as u64 as i128,
        d => panic!("wrap on float dtype {d}"),
    }
}

/// Exponent and explicit-mantissa bit counts of a float dtype.
const fn float_layout(dtype: DType) -> (u32, u32) {
    match dtype {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        DType::F64 => (11, 52),
        _ => (0, 0),
    }
}

/// Rounds `v` to the float `dtype` (round to nearest, ties to even, overflow to ±inf, gradual
/// underflow to subnormals, NaN to a quiet NaN of the same sign) and returns the bit pattern in
/// the low bits. Correct rounding straight from f64: no double rounding through f32 (the `half`
/// crate's `from_f64` truncates the low mantissa bits first, which misrounds near ties).
///
/// f32 and bf16 take `concord_core::dtype`'s shortcuts (`round_f64_to_f32_bits`,
/// `round_f64_to_bf16_bits`): the same bits as the rule, which tests there and here compare.
#[inline]
pub fn round_f64_bits(dtype: DType, v: f64) -> u64 {
    match dtype {
        DType::F64 => return v.to_bits(),
        DType::F32 => return concord_core::dtype::round_f64_to_f32_bits(v) as u64,
        DType::BF16 => return concord_core::dtype::round_f64_to_bf16_bits(v) as u64,
        _ => assert!(dtype.is_float(), "round_f64_bits on integer dtype {dtype}"),
    }
    let (e_bits, m_bits) = float_layout(dtype);
    concord_core::dtype::round_f64_to_bits(v, e_bits, m_bits)
}

/// Element `i` of a float tensor, exactly, as f64 (every f16/bf16/f32 value is an f64 value).
pub(crate) fn float_at(t: &Tensor, i: usize) -> f64 {
    dispatch_dtype!(t.dtype(), T => <T as Element>::to_f64(t.as_slice::<T>()[i]))
}

/// The NaN rule shared by min and max: `Some(result)` when either side is NaN.
fn nan_pick(a: f64, b: f64, policy: NanPolicy) -> Option<f64> {
    match (a.is_nan(), b.is_nan(), policy) {
        (true, true, _) => Some(a),
        (true, false, NanPolicy::Propagate) | (false, true, NanPolicy::Ignore) => Some(a),
        (true, false, NanPolicy::Ignore) | (false, true, NanPolicy::Propagate) => Some(b),
        (false, false, _) => None,
    }
}

/// `min` of two floats: `-0 < +0`; NaN per `policy`.
pub fn fmin(a: f64, b: f64, policy: NanPolicy) -> f64 {
    nan_pick(a, b, policy).unwrap_or(if a < b || (a == b && a.is_sign_negative()) { a } else { b })
}

/// `max` of two floats: `+0 > -0`; NaN per `policy`.
pub fn fmax(a: f64, b: f64, policy: NanPolicy) -> f64 {
    nan_pick(a, b, policy).unwrap_or(if a > b || (a == b && a.is_sign_positive()) { a } else { b })
}

/// Reduces one element position over ranks for an integer dtype (values extended to i128), a
/// wrap after every step: the per-element fold the integer blocks of [`reduce_tensors`] are held
/// to (`tests::int_blocks_equal_the_element_by_element_fold`).
#[cfg(test)]
fn reduce_ints(dtype: DType, op: ReduceOp, vals: &[i128], sem: &Semantics) -> i128 {
    let w = |v: i128| wrap(dtype, v);
    match op {
        ReduceOp::Sum => vals.iter().fold(0, |acc, v| w(acc + v)),
        ReduceOp::Avg => {
            let s = vals.iter().fold(0, |acc, v| w(acc + v));
            let n = vals.len() as i128;
            match sem.int_avg {
                IntAvg::Truncate => s / n,        // i128 division truncates toward zero, as C
                IntAvg::Floor => s.div_euclid(n), // n > 0: Euclidean division is floor division
            }
        }
        ReduceOp::Product => vals.iter().fold(1, |acc, v| w(acc.wrapping_mul(*v))),
        ReduceOp::Min => *vals.iter().min().expect("at least one rank"),
        ReduceOp::Max => *vals.iter().max().expect("at least one rank"),
        ReduceOp::BAnd => w(vals.iter().fold(-1, |acc, v| acc & v)),
        ReduceOp::BOr => w(vals.iter().fold(0, |acc, v| acc | v)),
        ReduceOp::BXor => w(vals.iter().fold(0, |acc, v| acc ^ v)),
        ReduceOp::PremulSum(_) => panic!("premul_sum is not defined for integer dtypes"),
    }
}

/// The elementwise reduction of `inputs` (one per rank, rank order) under `op` and `sem`.
///
/// Callers MUST pass at least one tensor, all of one dtype and shape, and an op defined for the
/// dtype ([`ReduceOp::defined_for`]); [`crate::expected`] checks all of that and names the error,
/// this function panics with a message instead.
pub fn reduce_tensors(op: ReduceOp, inputs: &[&Tensor], sem: &Semantics) -> Tensor {
    assert!(!inputs.is_empty(), "reduce_tensors needs at least one input");
    let (dtype, shape) = (inputs[0].dtype(), inputs[0].shape().to_vec());
    for (r, t) in inputs.iter().enumerate() {
        assert!(
            t.dtype() == dtype && t.shape() == shape.as_slice(),
            "reduce_tensors: rank {r} has {}{:?}, rank 0 has {dtype}{shape:?}",
            t.dtype(),
            t.shape()
        );
    }
    assert!(op.defined_for(dtype), "reduce op {op} is not defined for {dtype}");
    let mut out = Tensor::zeros(dtype, &shape);
    let n = out.numel();
    // Block by block: each rank's elements of a block are read with one dtype dispatch.
    const BLOCK: usize = 256;
    let ws = inputs.len();
    if dtype.is_float() {
        // Rank by rank over a block of elements, each element folded in rank order as
        // the element-wise fold of the tests' `reference` (same operations, same order: same bits).
        let size = dtype.size();
        let mut acc = vec![0.0f64; BLOCK];
        let mut col = vec![0.0f64; BLOCK];
        for start in (0..n).step_by(BLOCK) {
            let len = BLOCK.min(n - start);
            let (acc, col) = (&mut acc[..len], &mut col[..len]);
            floats_into(inputs[0], start, acc);
            if let ReduceOp::PremulSum(f) = op {
                acc.iter_mut().for_each(|a| *a *= f);
            }
            for t in &inputs[1..] {
                floats_into(t, start, col);
                let pairs = acc.iter_mut().zip(col.iter());
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, v)| *a += 1.0 * v),
                    ReduceOp::PremulSum(f) => pairs.for_each(|(a, v)| *a += f * v),
                    ReduceOp::Product => pairs.for_each(|(a, v)| *a *= v),
                    ReduceOp::Min => pairs.for_each(|(a, v)| *a = fmin(*a, *v, sem.nan_minmax)),
                    ReduceOp::Max => pairs.for_each(|(a, v)| *a = fmax(*a, *v, sem.nan_minmax)),
                    ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => unreachable!("checked: {op} is defined for {dtype}"),
                }
            }
            if op == ReduceOp::Avg {
                acc.iter_mut().for_each(|a| *a /= ws as f64);
            }
            let dst = &mut out.bytes_mut()[start * size..(start + len) * size];
            for (d, v) in dst.chunks_exact_mut(size).zip(acc.iter()) {
                d.copy_from_slice(&round_f64_bits(dtype, *v).to_le_bytes()[..size]);
            }
        }
    } else {
        // Rank by rank over a block too, in i128 without a wrap per step: the dtype's wrap is a
        // function of the value modulo 2^bits, which a sum or product in i128 (wrapping modulo
        // 2^128) keeps, so one wrap at the end gives the per-element fold's bits
        // ([`reduce_ints`], which `tests::int_blocks_equal_the_element_by_element_fold` compares).
        let mut acc = vec![0i128; BLOCK];
        let mut col = vec![0i128; BLOCK];
        for start in (0..n).step_by(BLOCK) {
            let len = BLOCK.min(n - start);
            let (acc, col) = (&mut acc[..len], &mut col[..len]);
            ints_into(inputs[0], start, acc);
            for t in &inputs[1..] {
                ints_into(t, start, col);
                let pairs = acc.iter_mut().zip(col.iter());
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, v)| *a = a.wrapping_add(*v)),
                    ReduceOp::Product => pairs.for_each(|(a, v)| *a = a.wrapping_mul(*v)),
                    ReduceOp::Min => pairs.for_each(|(a, v)| *a = (*a).min(*v)),
                    ReduceOp::Max => pairs.for_each(|(a, v)| *a = (*a).max(*v)),
                    ReduceOp::BAnd => pairs.for_each(|(a, v)| *a &= v),
                    ReduceOp::BOr => pairs.for_each(|(a, v)| *a |= v),
                    ReduceOp::BXor => pairs.for_each(|(a, v)| *a ^= v),
                    ReduceOp::PremulSum(_) => unreachable!("checked: {op} is defined for {dtype}"),
                }
            }
            for (j, a) in acc.iter().enumerate() {
                let v = match op {
                    ReduceOp::Avg => {
                        let (s, n) = (wrap(dtype, *a), ws as i128);
                        match sem.int_avg {
                            IntAvg::Truncate => s / n,
                            IntAvg::Floor => s.div_euclid(n),
                        }
                    }
                    _ => wrap(dtype, *a),
                };
                set_int(&mut out, start + j, v);
            }
        }
    }
    out
}

/// Elements `start..start + dst.len()` of a float tensor, exactly, as f64.
fn floats_into(t: &Tensor, start: usize, dst: &mut [f64]) {
    let end = start + dst.len();
    dispatch_dtype!(t.dtype(), T => {
        for (d, x) in dst.iter_mut().zip(&t.as_slice::<T>()[start..end]) {
            *d = <T as Element>::to_f64(*x);
        }
    });
}

/// Elements `start..start + dst.len()` of an integer tensor as [`int_at`] reads them.
fn ints_into(t: &Tensor, start: usize, dst: &mut [i128]) {
    fn copy<T: Copy + Into<i128>>(src: &[T], dst: &mut [i128]) {
        for (d, x) in dst.iter_mut().zip(src) {
            *d = (*x).into();
        }
    }
    let end = start + dst.len();
    match t.dtype() {
        DType::I8 => copy(&t.as_slice::<i8>()[start..end], dst),
        DType::U8 => copy(&t.as_slice::<u8>()[start..end], dst),
        DType::I16 => copy(&t.as_slice::<i16>()[start..end], dst),
        DType::U16 => copy(&t.as_slice::<u16>()[start..end], dst),
        DType::I32 => copy(&t.as_slice::<i32>()[start..end], dst),
        DType::U32 => copy(&t.as_slice::<u32>()[start..end], dst),
        DType::I64 => copy(&t.as_slice::<i64>()[start..end], dst),
        DType::U64 => copy(&t.as_slice::<u64>()[start..end], dst),
        d => panic!("ints_into on float dtype {d}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::half::{bf16, f16};

    /// Exact rational comparison: is `cand` (an f64 holding a dtype value) the correctly rounded
    /// dtype value of `v`? Checked by brute force on neighbours.
    fn f16_neighbours_ok(v: f64) {
        let got = f16::from_bits(round_f64_bits(DType::F16, v) as u16);
        let g = got.to_f64();
        if g.is_infinite() {
            assert!(v.abs() >= 65520.0, "{v} rounded to inf");
            return;
        }
        let up = f16::from_bits(got.to_bits() + 1).to_f64();
        let down = f16::from_bits(got.to_bits().wrapping_sub(1)).to_f64();
        let d = (v - g).abs();
        for n in [up, down] {
            if n.is_finite() && (n.is_sign_negative() == g.is_sign_negative()) {
                let dn = (v - n).abs();
                assert!(d < dn || (d == dn && got.to_bits() & 1 == 0), "{v}: got {g}, neighbour {n} is closer");
            }
        }
    }

    #[test]
    fn rounding_to_f32_matches_the_native_cast() {
        // A deterministic spread of f64 values, including ties and subnormal results.
        let mut x: u64 = 0x1234_5678_9abc_def0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            let want = (v as f32).to_bits() as u64;
            let got = round_f64_bits(DType::F32, v);
            // The shortcut is the one rounding rule, bit for bit (NaN included).
            assert_eq!(got, concord_core::dtype::round_f64_to_bits(v, 8, 23), "{v:e}");
            if v.is_nan() {
                assert!(f32::from_bits(got as u32).is_nan());
            } else {
                assert_eq!(got, want, "{v:e}");
            }
            // Exact ties: a float halfway between two f32 values.
            let f = f32::from_bits((x >> 32) as u32 & 0x7f7f_ffff);
            let tie = f as f64 + (f32::from_bits(f.to_bits() + 1) as f64 - f as f64) / 2.0;
            assert_eq!(round_f64_bits(DType::F32, tie), (tie as f32).to_bits() as u64, "tie {tie:e}");
        }
    }

    /// The f32 and bf16 shortcuts of [`round_f64_bits`] (and its f16 path) give the one rounding
    /// rule's bits on every value of `concord_core::dtype::rounding_probes`.
    #[test]
    fn shortcuts_are_the_rounding_rule() {
        let rule = |d: DType, v: f64| {
            let (e, m) = float_layout(d);
            concord_core::dtype::round_f64_to_bits(v, e, m)
        };
        let check = |v: f64| {
            for d in [DType::F32, DType::BF16, DType::F16] {
                assert_eq!(round_f64_bits(d, v), rule(d, v), "{d} {v:e} ({:#x})", v.to_bits());
            }
        };
        concord_core::dtype::rounding_probes(check);
    }

    #[test]
    fn rounding_to_f16_and_bf16_is_nearest_even() {
        // Every f16 midpoint, and points just beside it.
        for b in 0u16..0x7bff {
            let lo = f16::from_bits(b).to_f64();
            let hi = f16::from_bits(b + 1).to_f64();
            let mid = (lo + hi) / 2.0;
            for v in [mid, mid + (hi - lo) * 1e-6, mid - (hi - lo) * 1e-6, -mid] {
                f16_neighbours_ok(v);
            }
            // A value a hair above the tie, where the excess sits in the low 32 bits of the f64:
            // the `half` crate misrounds this one.
            let above = f64::from_bits(mid.to_bits() + 1);
            assert_eq!(round_f64_bits(DType::F16, above), (b + 1) as u64, "just above midpoint of {lo} and {hi}");
        }
        assert_eq!(round_f64_bits(DType::F16, 65520.0), 0x7c00); // ties to even at the top: inf
        assert_eq!(round_f64_bits(DType::F16, 65519.99), 0x7bff);
        assert_eq!(round_f64_bits(DType::F16, 2f64.powi(-25)), 0); // tie below the smallest subnormal
        assert_eq!(round_f64_bits(DType::F16, 2f64.powi(-25) * 1.0001), 1);
        assert_eq!(round_f64_bits(DType::F16, -0.0), 0x8000);
        for b in (0u16..0x7f7f).step_by(7) {
            let lo = bf16::from_bits(b).to_f64();
            let hi = bf16::from_bits(b + 1).to_f64();
            let mid = (lo + hi) / 2.0;
            let want_tie = if b & 1 == 0 { b } else { b + 1 };
            assert_eq!(round_f64_bits(DType::BF16, mid), want_tie as u64, "bf16 tie between {lo} and {hi}");
            assert_eq!(round_f64_bits(DType::BF16, f64::from_bits(mid.to_bits() + 1)), (b + 1) as u64);
            assert_eq!(round_f64_bits(DType::BF16, f64::from_bits(mid.to_bits() - 1)), b as u64);
        }
        assert!(bf16::from_bits(round_f64_bits(DType::BF16, f64::NAN) as u16).is_nan());
        assert_eq!(round_f64_bits(DType::BF16, f64::NEG_INFINITY), 0xff80);
        assert_eq!(round_f64_bits(DType::BF16, 1e39), 0x7f80);
    }

    fn sem(nan: NanPolicy, avg: IntAvg) -> Semantics {
        Semantics { nan_minmax: nan, int_avg: avg }
    }

    #[test]
    fn integer_semantics_wrap_and_round_avg_as_declared() {
        let s = sem(NanPolicy::Propagate, IntAvg::Truncate);
        let t = |v: Vec<i32>| Tensor::from_vec(&[v.len()], v);
        let (a, b) = (t(vec![3, -3, i32::MAX, 7]), t(vec![4, -4, 1, -8]));
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&a, &b], &s).as_slice::<i32>(), &[3, -3, i32::MIN / 2, 0]);
        let f = sem(NanPolicy::Propagate, IntAvg::Floor);
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&a, &b], &f).as_slice::<i32>(), &[3, -4, i32::MIN / 2, -1]);
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&a, &b], &s).as_slice::<i32>(), &[7, -7, i32::MIN, -1]);
        assert_eq!(reduce_tensors(ReduceOp::Product, &[&a, &b], &s).as_slice::<i32>(), &[12, 12, i32::MAX, -56]);
        let u = |v: Vec<u8>| Tensor::from_vec(&[v.len()], v);
        let (x, y, z) = (u(vec![200, 3, 0b1100]), u(vec![100, 4, 0b1010]), u(vec![1, 0, 0b0110]));
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&x, &y, &z], &s).as_slice::<u8>(), &[45, 7, 28]);
        // (200 + 100 + 1) wraps to 45 in u8 before the division: 45 / 3 = 15, not 301 / 3.
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&x, &y, &z], &s).as_slice::<u8>(), &[15, 2, 9]);
        assert_eq!(
            reduce_tensors(ReduceOp::Product, &[&x, &y, &z], &s).as_slice::<u8>(),
            &[(20000u32 % 256) as u8, 0, (720u32 % 256) as u8]
        );
        assert_eq!(reduce_tensors(ReduceOp::BAnd, &[&x, &y, &z], &s).as_slice::<u8>(), &[0, 0, 0]);
        assert_eq!(reduce_tensors(ReduceOp::BOr, &[&x, &y, &z], &s).as_slice::<u8>(), &[237, 7, 0b1110]);
        assert_eq!(reduce_tensors(ReduceOp::BXor, &[&x, &y, &z], &s).as_slice::<u8>(), &[200 ^ 100 ^ 1, 7, 0]);
        assert_eq!(reduce_tensors(ReduceOp::Min, &[&x, &y, &z], &s).as_slice::<u8>(), &[1, 0, 0b0110]);
        assert_eq!(reduce_tensors(ReduceOp::Max, &[&x, &y, &z], &s).as_slice::<u8>(), &[200, 4, 0b1100]);
        let i8s = |v: Vec<i8>| Tensor::from_vec(&[v.len()], v);
        let (p, q) = (i8s(vec![-128, -7, 127]), i8s(vec![-1, 2, 127]));
        assert_eq!(reduce_tensors(ReduceOp::Product, &[&p, &q], &s).as_slice::<i8>(), &[-128, -14, 1]);
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&p, &q], &s).as_slice::<i8>(), &[127, -5, -2]);
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&p, &q], &s).as_slice::<i8>(), &[63, -2, -1]);
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&p, &q], &f).as_slice::<i8>(), &[63, -3, -1]);
        assert_eq!(reduce_tensors(ReduceOp::Min, &[&p, &q], &s).as_slice::<i8>(), &[-128, -7, 127]);
        let big = Tensor::from_vec(&[1], vec![u64::MAX]);
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&big, &big], &s).as_slice::<u64>(), &[u64::MAX - 1]);
        assert_eq!(reduce_tensors(ReduceOp::Avg, &[&big, &big], &s).as_slice::<u64>(), &[u64::MAX / 2]);
        let neg = Tensor::from_vec(&[1], vec![i64::MIN]);
        assert_eq!(reduce_tensors(ReduceOp::BAnd, &[&neg, &neg], &s).as_slice::<i64>(), &[i64::MIN]);
    }

    #[test]
    fn float_nan_policies_and_signed_zeros() {
        let t = |v: Vec<f32>| Tensor::from_vec(&[v.len()], v);
        let nan = f32::NAN;
        let a = t(vec![nan, 1.0, -0.0, 0.0, nan, f32::INFINITY, -0.0]);
        let b = t(vec![1.0, nan, 0.0, -0.0, nan, 1.0, -0.0]);
        let prop = sem(NanPolicy::Propagate, IntAvg::Truncate);
        let ign = sem(NanPolicy::Ignore, IntAvg::Truncate);
        let bits = |t: Tensor| t.as_slice::<f32>().iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
        let n = u32::MAX;
        let (z, nz, one, inf) = (0f32.to_bits(), (-0f32).to_bits(), 1f32.to_bits(), f32::INFINITY.to_bits());
        assert_eq!(bits(reduce_tensors(ReduceOp::Max, &[&a, &b], &prop)), vec![n, n, z, z, n, inf, nz]);
        assert_eq!(bits(reduce_tensors(ReduceOp::Min, &[&a, &b], &prop)), vec![n, n, nz, nz, n, one, nz]);
        assert_eq!(bits(reduce_tensors(ReduceOp::Max, &[&a, &b], &ign)), vec![one, one, z, z, n, inf, nz]);
        assert_eq!(bits(reduce_tensors(ReduceOp::Min, &[&a, &b], &ign)), vec![one, one, nz, nz, n, one, nz]);
        // sum / avg / product propagate NaN whatever the min/max policy; -0 + -0 = -0.
        let sum = bits(reduce_tensors(ReduceOp::Sum, &[&a, &b], &ign));
        assert_eq!(sum, vec![n, n, z, z, n, inf, nz]);
        let prod = bits(reduce_tensors(ReduceOp::Product, &[&a, &b], &ign));
        assert_eq!(prod, vec![n, n, nz, nz, n, inf, z]);
        let c = t(vec![f32::INFINITY]);
        let d = t(vec![f32::NEG_INFINITY]);
        assert!(reduce_tensors(ReduceOp::Sum, &[&c, &d], &prop).as_slice::<f32>()[0].is_nan());
        assert_eq!(reduce_tensors(ReduceOp::Min, &[&c, &d], &prop).as_slice::<f32>()[0], f32::NEG_INFINITY);
    }

    #[test]
    fn float_sums_round_once_from_the_exact_value() {
        // 1 + 2^-11 + 2^-11 in f16: the exact sum 1 + 2^-10 is representable; a left-to-right
        // f16 sum would round 1 + 2^-11 to 1 (tie to even) and lose both halves.
        let t = |v: f64| Tensor::from_f64(DType::F16, &[1], &[v]);
        let (a, b, c) = (t(1.0), t(2f64.powi(-11)), t(2f64.powi(-11)));
        let s = sem(NanPolicy::Propagate, IntAvg::Truncate);
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&a, &b, &c], &s).get_f64(0), 1.0 + 2f64.powi(-10));
        let x = Tensor::from_f64(DType::BF16, &[2], &[3.0, 1.5]);
        let y = Tensor::from_f64(DType::BF16, &[2], &[4.0, -0.5]);
        let avg = reduce_tensors(ReduceOp::Avg, &[&x, &y], &s);
        assert_eq!((avg.get_f64(0), avg.get_f64(1)), (3.5, 0.5));
        let pre = reduce_tensors(ReduceOp::PremulSum(2.0), &[&x, &y], &s);
        assert_eq!((pre.get_f64(0), pre.get_f64(1)), (14.0, 2.0));
        // Overflow in the dtype becomes inf, even though f64 holds the sum.
        let m = Tensor::from_f64(DType::F16, &[1], &[65504.0]);
        assert_eq!(reduce_tensors(ReduceOp::Sum, &[&m, &m], &s).get_f64(0), f64::INFINITY);
    }

    /// The float reduction element by element, as it was written before the rank-by-rank blocks of
    /// [`reduce_tensors`]: one element position over ranks (values exact in f64).
    fn reference(op: ReduceOp, vals: &[f64], sem: &Semantics) -> f64 {
        let n = vals.len() as f64;
        // Start from the first value (not 0.0) so that a sum of all -0.0 stays -0.0.
        let sum = |scale: f64| vals.iter().skip(1).fold(scale * vals[0], |acc, v| acc + scale * v);
        match op {
            ReduceOp::Sum => sum(1.0),
            ReduceOp::Avg => sum(1.0) / n,
            ReduceOp::PremulSum(s) => sum(s),
            ReduceOp::Product => vals.iter().skip(1).fold(vals[0], |acc, v| acc * v),
            ReduceOp::Min => vals.iter().skip(1).fold(vals[0], |acc, v| fmin(acc, *v, sem.nan_minmax)),
            ReduceOp::Max => vals.iter().skip(1).fold(vals[0], |acc, v| fmax(acc, *v, sem.nan_minmax)),
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                panic!("bitwise {op} is not defined for floating-point dtypes")
            }
        }
    }

    /// The integer blocks (one wrap at the end) give [`reduce_ints`]' per-element fold (a wrap
    /// after every step) bit for bit: every integer dtype and op, both avg roundings, 1..=9 and
    /// 33 ranks, sizes around the block length, arbitrary bit patterns (products and sums that
    /// wrap many times over).
    #[test]
    fn int_blocks_equal_the_element_by_element_fold() {
        let mut x: u64 = 0x5eed_0bad_8765_4321;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let ints = [DType::I8, DType::U8, DType::I16, DType::U16, DType::I32, DType::U32, DType::I64, DType::U64];
        let ops =
            [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor];
        for dtype in ints {
            for ws in (1..=9).chain([33]) {
                for n in [0, 1, 255, 256, 257, 700] {
                    let inputs: Vec<Tensor> = (0..ws)
                        .map(|_| {
                            let mut t = Tensor::zeros(dtype, &[n]);
                            for i in 0..n {
                                set_int(&mut t, i, next() as i128);
                            }
                            t
                        })
                        .collect();
                    let refs: Vec<&Tensor> = inputs.iter().collect();
                    for op in ops {
                        for int_avg in [IntAvg::Truncate, IntAvg::Floor] {
                            let sem = Semantics { int_avg, ..Semantics::default() };
                            let got = reduce_tensors(op, &refs, &sem);
                            for i in 0..n {
                                let vals: Vec<i128> = inputs.iter().map(|t| int_at(t, i)).collect();
                                let want = reduce_ints(dtype, op, &vals, &sem);
                                assert_eq!(int_at(&got, i), want, "{dtype} {op} ws{ws} n{n} {int_avg:?} element {i}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn float_blocks_equal_the_element_by_element_fold() {
        // Values of every kind (exact small integers, random bits: NaNs with payloads, ±inf,
        // ±0, subnormals, huge values), every float dtype, op and NaN policy, 1..=9 ranks,
        // sizes around the block length.
        let mut x: u64 = 0x0bad_5eed_1234_5678;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Avg,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::PremulSum(0.5),
            ReduceOp::PremulSum(1.0 / 3.0),
        ];
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for ws in 1..=9 {
                for n in [0, 1, 255, 256, 257, 700] {
                    let inputs: Vec<Tensor> = (0..ws)
                        .map(|_| {
                            let mut t = Tensor::zeros(dtype, &[n]);
                            let size = dtype.size();
                            for e in t.bytes_mut().chunks_exact_mut(size) {
                                let r = next();
                                let v = match r % 4 {
                                    0 => r,                                         // any bits
                                    1 => (((r >> 8) % 41) as f64 - 20.0).to_bits(), // small integer
                                    2 => [0.0f64, -0.0, f64::INFINITY, f64::NEG_INFINITY][(r >> 8) as usize % 4].to_bits(),
                                    _ => (f64::from_bits(r >> 12) * 1e-300).to_bits(), // tiny
                                };
                                let bits = if r % 4 == 0 { v } else { round_f64_bits(dtype, f64::from_bits(v)) };
                                e.copy_from_slice(&bits.to_le_bytes()[..size]);
                            }
                            t
                        })
                        .collect();
                    let refs: Vec<&Tensor> = inputs.iter().collect();
                    for op in ops {
                        for nan in [NanPolicy::Propagate, NanPolicy::Ignore] {
                            let s = sem(nan, IntAvg::Truncate);
                            let got = reduce_tensors(op, &refs, &s);
                            for i in 0..n {
                                let vals: Vec<f64> = inputs.iter().map(|t| float_at(t, i)).collect();
                                let want = reference(op, &vals, &s);
                                if want.is_nan() {
                                    // A NaN's sign and payload are no part of the result (the
                                    // comparison takes any NaN for any NaN), nor fixed by Rust.
                                    assert!(float_at(&got, i).is_nan(), "{dtype} {op} ws{ws} n{n} element {i} of {vals:?}: not NaN");
                                    continue;
                                }
                                let size = dtype.size();
                                let mut b = [0u8; 8];
                                b[..size].copy_from_slice(&got.bytes()[i * size..(i + 1) * size]);
                                let want = round_f64_bits(dtype, want);
                                assert_eq!(u64::from_le_bytes(b), want, "{dtype} {op} ws{ws} n{n} element {i} of {vals:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
