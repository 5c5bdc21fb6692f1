//! Local reductions on host tensors. Partial results travel *wide*: floats as f64 (every f16 /
//! bf16 / f32 value is exact there, and the sums of the suites' inputs too), integers as i64
//! bits (sign-extended for signed dtypes, zero-extended for unsigned; sum and product wrap, which
//! is the dtype's wrapping arithmetic modulo its width). The result is narrowed to the dtype once,
//! at the end: one rounding for f16 / bf16 / f32, `avg` dividing the *wrapped* integer sum.

use crate::bugs::Bug;
use concord_core::dtype::round_f64_to_bits;
use concord_core::{dispatch_dtype, DType, Element, ReduceOp, Tensor};

/// A wide partial result: F64 or I64 values, one per element.
pub fn widen(t: &Tensor, op: ReduceOp, n: usize, bug: Bug) -> Tensor {
    let d = t.dtype();
    let numel = t.numel();
    if d.is_float() {
        let mut v: Vec<f64> = dispatch_dtype!(d, T => t.as_slice::<T>().iter().map(|x| <T as Element>::to_f64(*x)).collect());
        if let ReduceOp::PremulSum(f) = op {
            v.iter_mut().for_each(|x| *x *= f);
        }
        if op == ReduceOp::Avg && bug == Bug::AvgAsPremulReciprocal {
            let s = 1.0 / n as f64;
            v.iter_mut().for_each(|x| *x *= s);
        }
        Tensor::from_vec(&[numel], v)
    } else {
        let mut v: Vec<i64> = match d {
            DType::I8 => t.as_slice::<i8>().iter().map(|&x| x as i64).collect(),
            DType::U8 => t.as_slice::<u8>().iter().map(|&x| x as i64).collect(),
            DType::I16 => t.as_slice::<i16>().iter().map(|&x| x as i64).collect(),
            DType::U16 => t.as_slice::<u16>().iter().map(|&x| x as i64).collect(),
            DType::I32 => t.as_slice::<i32>().iter().map(|&x| x as i64).collect(),
            DType::U32 => t.as_slice::<u32>().iter().map(|&x| x as i64).collect(),
            DType::I64 => t.as_slice::<i64>().to_vec(),
            DType::U64 => t.as_slice::<u64>().iter().map(|&x| x as i64).collect(),
            _ => unreachable!("float handled above"),
        };
        if op == ReduceOp::Avg && bug == Bug::AvgAsPremulReciprocal {
            // "avg = premul_sum(1/n)": each contribution divided before the sum.
            v.iter_mut().for_each(|x| *x = if d.is_signed_int() { *x / n as i64 } else { ((*x as u64) / n as u64) as i64 });
        }
        Tensor::from_vec(&[numel], v)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return a;
    }
    if b.is_nan() {
        return b;
    }
    if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return a;
    }
    if b.is_nan() {
        return b;
    }
    if a > b || (a == b && a.is_sign_positive()) {
        a
    } else {
        b
    }
}

/// `acc[i] = acc[i] op other[i]` on wide values of a `dtype` reduction.
pub fn combine(acc: &mut Tensor, other: &Tensor, op: ReduceOp, dtype: DType, bug: Bug) {
    assert_eq!(acc.numel(), other.numel(), "combine of {} and {} elements", acc.numel(), other.numel());
    if dtype.is_float() {
        let half = matches!(dtype, DType::F16 | DType::BF16);
        let o = other.as_slice::<f64>().to_vec();
        for (a, b) in acc.as_mut_slice::<f64>().iter_mut().zip(o) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => {
                    let s = *a + b;
                    if half && bug == Bug::HalfSumRoundedPerStep {
                        // Partial sums kept in the dtype along the ring: rounded at every hop.
                        narrow_float(dtype, s)
                    } else {
                        s
                    }
                }
                ReduceOp::Product => *a * b,
                ReduceOp::Min if bug == Bug::MinMaxIgnoresZeroSign => {
                    if b < *a {
                        b
                    } else {
                        *a
                    }
                }
                ReduceOp::Max if bug == Bug::MinMaxIgnoresZeroSign => {
                    if b > *a {
                        b
                    } else {
                        *a
                    }
                }
                ReduceOp::Min => fmin(*a, b),
                ReduceOp::Max => fmax(*a, b),
                ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => unreachable!("validated: bitwise ops need integers"),
            };
        }
    } else {
        // The bug compares u64 as the signed wide bits.
        let signed_compare = dtype.is_signed_int() || (dtype == DType::U64 && bug == Bug::U64MinMaxSigned);
        let unsigned = !signed_compare;
        let o = other.as_slice::<i64>().to_vec();
        for (a, b) in acc.as_mut_slice::<i64>().iter_mut().zip(o) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                ReduceOp::Product => a.wrapping_mul(b),
                ReduceOp::Min if unsigned => (*a as u64).min(b as u64) as i64,
                ReduceOp::Max if unsigned => (*a as u64).max(b as u64) as i64,
                ReduceOp::Min => (*a).min(b),
                ReduceOp::Max => (*a).max(b),
                ReduceOp::BAnd => *a & b,
                ReduceOp::BOr => *a | b,
                ReduceOp::BXor => *a ^ b,
                ReduceOp::PremulSum(_) => unreachable!("validated: premul_sum needs floats"),
            };
        }
    }
}

/// `v` rounded once to the float `dtype` (as an f64 again).
fn narrow_float(dtype: DType, v: f64) -> f64 {
    let mut t = Tensor::zeros(dtype, &[1]);
    put_float(&mut t, 0, v);
    t.get_f64(0)
}

fn put_float(t: &mut Tensor, i: usize, v: f64) {
    let size = t.dtype().size();
    let bits = match t.dtype() {
        DType::F64 => v.to_bits(),
        DType::F32 => round_f64_to_bits(v, 8, 23),
        DType::F16 => round_f64_to_bits(v, 5, 10),
        DType::BF16 => round_f64_to_bits(v, 8, 7),
        d => unreachable!("put_float on {d}"),
    };
    t.bytes_mut()[i * size..(i + 1) * size].copy_from_slice(&bits.to_le_bytes()[..size]);
}

/// Sign- or zero-extends the low `8 * size` bits of `v` (the dtype's wrapped value).
fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I16 => v as i16 as i64,
        DType::U16 => v as u16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// The final result in `dtype` (shape `[numel]`): `avg` divides by `n` here.
pub fn narrow(wide: &Tensor, dtype: DType, op: ReduceOp, n: usize, bug: Bug) -> Tensor {
    let numel = wide.numel();
    let mut out = Tensor::zeros(dtype, &[numel]);
    let avg = op == ReduceOp::Avg && bug != Bug::AvgAsPremulReciprocal;
    if dtype.is_float() {
        for (i, &v) in wide.as_slice::<f64>().iter().enumerate() {
            put_float(&mut out, i, if avg { v / n as f64 } else { v });
        }
    } else {
        let size = dtype.size();
        for (i, &v) in wide.as_slice::<i64>().iter().enumerate() {
            let v = if avg {
                // The wrapped sum, divided (truncating); the bug divides the wide sum.
                let s = if bug == Bug::IntAvgOfUnwrappedSum { v } else { wrap(dtype, v) };
                if dtype.is_signed_int() {
                    s / n as i64
                } else {
                    ((s as u64) / n as u64) as i64
                }
            } else {
                v
            };
            out.bytes_mut()[i * size..(i + 1) * size].copy_from_slice(&v.to_le_bytes()[..size]);
        }
    }
    out
}
