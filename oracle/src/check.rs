//! Comparing a backend's result with the oracle's.
//!
//! Rules every [`Tolerance`] follows:
//! * dtype and shape MUST match exactly (else a [`Mismatch`] with `bad_count == 0` whose `detail`
//!   explains the difference);
//! * a NaN matches only a NaN (any payload); a NaN where a number was expected, or a number where
//!   NaN was expected, is always a mismatch;
//! * an infinity matches only the same infinity;
//! * [`Tolerance::Exact`] is bit equality otherwise (so `-0.0` does not match `+0.0`).

use crate::reduce::{float_at, int_at};
use concord_core::{DType, ReduceOp, Tensor};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Bit-exact; NaN equals NaN whatever the payload.
    Exact,
    /// At most this many units in the last place apart (floats; `-0.0` and `+0.0` are 0 apart);
    /// for integers, at most this far apart as numbers.
    Ulps(u32),
    /// `|got - expected| <= abs + rel * |expected|`.
    Bound { abs: f64, rel: f64 },
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Exact => write!(f, "exact"),
            Tolerance::Ulps(n) => write!(f, "{n} ulp"),
            Tolerance::Bound { abs, rel } => write!(f, "abs {abs:e} + rel {rel:e}"),
        }
    }
}

/// Where and how a result differs from the expected one.
///
/// `bad_count == 0` means a structural mismatch (dtype or shape): no element was compared,
/// `got` / `expected` describe the two tensors and `detail` says what differs. Otherwise `index`
/// (flat) and `coords` locate the first bad element, `got` / `expected` are its two values
/// printed exactly, and `detail` reads "`bad_count` of `numel` elements differ" (plus the
/// tolerance when it is not exact).
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub coords: Vec<usize>,
    pub got: String,
    pub expected: String,
    pub bad_count: usize,
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bad_count == 0 {
            write!(f, "{}", self.detail)
        } else {
            write!(
                f,
                "first bad index {} (coords {:?}): got {}, expected {} ({})",
                self.index, self.coords, self.got, self.expected, self.detail
            )
        }
    }
}

impl std::error::Error for Mismatch {}

/// Row-major coordinates of flat index `i` in `shape`.
pub fn coords_of(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            c[d] = i % n;
            i /= n;
        }
    }
    c
}

/// Maps a float's bits to an integer line where adjacent floats are adjacent integers and
/// `-0.0` and `+0.0` coincide.
fn ordered(v: f64, dtype: DType) -> i64 {
    // Every f16/bf16/f32 value is exact in f64, but ulps must count in the dtype's own spacing.
    let (bits, sign_bit) = match dtype {
        DType::F16 => (crate::reduce::round_f64_bits(dtype, v), 15),
        DType::BF16 => (crate::reduce::round_f64_bits(dtype, v), 15),
        DType::F32 => ((v as f32).to_bits() as u64, 31),
        _ => (v.to_bits(), 63),
    };
    let mag = (bits & ((1u64 << sign_bit) - 1)) as i64;
    if bits >> sign_bit & 1 == 1 {
        -mag
    } else {
        mag
    }
}

fn element_ok(got: &Tensor, exp: &Tensor, i: usize, tol: Tolerance) -> bool {
    let dtype = exp.dtype();
    if !dtype.is_float() {
        let (g, e) = (int_at(got, i), int_at(exp, i));
        return match tol {
            Tolerance::Exact => g == e,
            Tolerance::Ulps(n) => (g - e).unsigned_abs() <= n as u128,
            Tolerance::Bound { abs, rel } => ((g - e) as f64).abs() <= abs + rel * (e as f64).abs(),
        };
    }
    let size = dtype.size();
    let (gb, eb) = (&got.bytes()[i * size..(i + 1) * size], &exp.bytes()[i * size..(i + 1) * size]);
    let (g, e) = (float_at(got, i), float_at(exp, i));
    if g.is_nan() || e.is_nan() {
        return g.is_nan() && e.is_nan();
    }
    if g.is_infinite() || e.is_infinite() {
        return g == e;
    }
    match tol {
        Tolerance::Exact => gb == eb,
        Tolerance::Ulps(n) => (ordered(g, dtype) - ordered(e, dtype)).unsigned_abs() <= n as u64,
        Tolerance::Bound { abs, rel } => (g - e).abs() <= abs + rel * e.abs(),
    }
}

/// `Ok` if `got` matches `expected` under `tol`, else where and how it first differs and how
/// many elements differ.
pub fn compare(got: &Tensor, expected: &Tensor, tol: Tolerance) -> Result<(), Mismatch> {
    let describe = |t: &Tensor| format!("{}{:?}", t.dtype(), t.shape());
    let structural = |what: &str| Mismatch {
        index: 0,
        coords: Vec::new(),
        got: describe(got),
        expected: describe(expected),
        bad_count: 0,
        detail: format!("{what} mismatch: got {}, expected {}", describe(got), describe(expected)),
    };
    if got.dtype() != expected.dtype() {
        return Err(structural("dtype"));
    }
    if got.shape() != expected.shape() {
        return Err(structural("shape"));
    }
    // Equal bytes are equal bits at every element: within every tolerance at once (one memcmp;
    // `element_ok` takes equal bits under `Exact`, equal NaNs and infinities always, and a zero
    // difference under `Ulps` and under a `Bound` whose terms are not negative or NaN).
    let bound_sane = match tol {
        Tolerance::Bound { abs, rel } => abs >= 0.0 && rel >= 0.0,
        Tolerance::Exact | Tolerance::Ulps(_) => true,
    };
    if bound_sane && got.bytes() == expected.bytes() {
        return Ok(());
    }
    let n = expected.numel();
    let mut first = None;
    let mut bad = 0usize;
    for i in 0..n {
        if !element_ok(got, expected, i, tol) {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            index: i,
            coords: coords_of(i, expected.shape()),
            got: got.fmt_element(i),
            expected: expected.fmt_element(i),
            bad_count: bad,
            detail: if tol == Tolerance::Exact {
                format!("{bad} of {n} elements differ")
            } else {
                format!("{bad} of {n} elements differ, tolerance {tol}")
            },
        }),
    }
}

/// Compares every rank's result with the oracle's where it is defined; the first failing rank
/// and its mismatch otherwise. `got` and `expected.outputs` MUST be indexed by rank.
pub fn compare_outputs(got: &[Tensor], expected: &crate::Expected, tol: Tolerance) -> Result<(), (usize, Mismatch)> {
    assert_eq!(got.len(), expected.outputs.len(), "compare_outputs: {} results for {} ranks", got.len(), expected.outputs.len());
    for (r, (g, e)) in got.iter().zip(&expected.outputs).enumerate() {
        if expected.defined[r] {
            compare(g, e, tol).map_err(|m| (r, m))?;
        }
    }
    Ok(())
}

/// The smallest positive (subnormal) value of a float dtype.
fn denorm_min(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        DType::F32 => 2f64.powi(-149),
        _ => f64::from_bits(1),
    }
}

/// How many ulp a floating `avg` may be off when its inputs share a sign but the average is not
/// exactly representable (`Σx / ws` with `Σx` not a multiple of `ws`): nccl-tests' bound for a
/// backend that pre-multiplies every input by `1 / ws` and sums (NCCL's float avg),
/// `1 + c · ws^p` (f32 / f64: c = 1.25, p = 0.51; f16: 0.75, 0.91; bf16: 0.66, 0.91), and never
/// under the 2 ulp every avg gets. 2 at 2 ranks, 3 for f32 at 3, 6 for f32 and 10 for f16 at 16.
/// With mixed signs no ulp bound holds: a partial sum can cancel far below its terms.
pub fn avg_ulps(dtype: DType, world_size: usize) -> u32 {
    let (c, p) = match dtype {
        DType::F16 => (0.75f64, 0.91f64),
        DType::BF16 => (0.66, 0.91),
        _ => (1.25, 0.51),
    };
    (1 + (c * (world_size.max(1) as f64).powf(p)) as u32).max(2)
}

/// The tolerance for a result of `op` (`None`: data movement) over `world_size` ranks.
///
/// * Integers, data movement, `min` / `max`, bitwise ops: [`Tolerance::Exact`].
/// * Exact-by-construction float inputs: `Exact`, `avg` included up to 64 ranks (the fixtures
///   make sum-then-divide and pre-multiplication by `1/ws` both exact there); beyond 64,
///   `avg`: `Ulps(2)` (as nccl-tests: a pre-multiplication may be off). `premul_sum` is exact when its factor is a power of
///   two; with another factor the products round, and the random-input bound applies.
/// * Random float inputs (MUST lie in `[-1, 1]`, as `concord-fixtures` makes them): a worst-case
///   bound for any summation order done in the dtype itself,
///   `abs = eps/2 * (ws - 1) * ws * max(|s|, 1) + eps`, `rel = eps` (the oracle's own rounding and
///   a final division). `product`: `rel = ws * eps`, `abs = ws * smallest subnormal`.
pub fn tolerance_for(dtype: DType, op: Option<ReduceOp>, world_size: usize, exact_inputs: bool) -> Tolerance {
    let Some(op) = op else { return Tolerance::Exact };
    if !dtype.is_float() || matches!(op, ReduceOp::Min | ReduceOp::Max) || op.is_bitwise() {
        return Tolerance::Exact;
    }
    let premul_exact = |s: f64| s != 0.0 && s.is_finite() && s.abs().log2().fract() == 0.0;
    if exact_inputs {
        match op {
            ReduceOp::Avg if world_size > 64 => return Tolerance::Ulps(2),
            ReduceOp::PremulSum(s) if !premul_exact(s) => {}
            _ => return Tolerance::Exact,
        }
    }
    let eps = dtype.epsilon();
    let n = world_size.max(1) as f64;
    match op {
        ReduceOp::Product => Tolerance::Bound { abs: n * denorm_min(dtype), rel: n * eps },
        _ => {
            let scale = match op {
                ReduceOp::PremulSum(s) => s.abs().max(1.0),
                _ => 1.0,
            };
            Tolerance::Bound { abs: eps / 2.0 * (n - 1.0) * n * scale + eps, rel: eps }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg_ulps_follow_nccl_tests() {
        assert_eq!(avg_ulps(DType::F32, 1), 2);
        assert_eq!(avg_ulps(DType::F32, 2), 2);
        assert_eq!(avg_ulps(DType::F32, 3), 3);
        assert_eq!(avg_ulps(DType::BF16, 3), 2);
        assert_eq!(avg_ulps(DType::F16, 3), 3);
        assert_eq!(avg_ulps(DType::F32, 16), 6);
        assert_eq!(avg_ulps(DType::F16, 16), 10);
    }

    #[test]
    fn first_bad_index_coords_and_count() {
        let e = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let g = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 7.0, 8.0]);
        let m = compare(&g, &e, Tolerance::Exact).unwrap_err();
        assert_eq!((m.index, m.coords.clone(), m.bad_count), (4, vec![1, 1], 2));
        assert_eq!((m.got.as_str(), m.expected.as_str()), ("7.0", "5.0"));
        assert_eq!(m.to_string(), "first bad index 4 (coords [1, 1]): got 7.0, expected 5.0 (2 of 6 elements differ)");
        assert!(compare(&e, &e, Tolerance::Exact).is_ok());
        let m = compare(&g, &e, Tolerance::Bound { abs: 1.5, rel: 0.0 }).unwrap_err();
        assert_eq!((m.index, m.bad_count), (4, 2));
        assert!(m.to_string().ends_with("(2 of 6 elements differ, tolerance abs 1.5e0 + rel 0e0)"), "{m}");
        assert!(compare(&g, &e, Tolerance::Bound { abs: 2.0, rel: 0.0 }).is_ok());
        let i = Tensor::from_vec(&[3], vec![5u8, 6, 7]);
        let j = Tensor::from_vec(&[3], vec![5u8, 6, 9]);
        let m = compare(&j, &i, Tolerance::Exact).unwrap_err();
        assert_eq!(m.to_string(), "first bad index 2 (coords [2]): got 9, expected 7 (1 of 3 elements differ)");
        assert!(compare(&j, &i, Tolerance::Ulps(2)).is_ok());
        assert!(compare(&j, &i, Tolerance::Ulps(1)).is_err());
        let s = Tensor::from_vec(&[], vec![1i64]);
        let t = Tensor::from_vec(&[], vec![2i64]);
        assert_eq!(compare(&t, &s, Tolerance::Exact).unwrap_err().coords, Vec::<usize>::new());
    }

    #[test]
    fn shape_and_dtype_mismatches_are_explained() {
        let a = Tensor::zeros(DType::F32, &[2, 3]);
        let m = compare(&Tensor::zeros(DType::F32, &[3, 2]), &a, Tolerance::Exact).unwrap_err();
        assert_eq!(m.bad_count, 0);
        assert_eq!(m.to_string(), "shape mismatch: got f32[3, 2], expected f32[2, 3]");
        let m = compare(&Tensor::zeros(DType::BF16, &[2, 3]), &a, Tolerance::Ulps(2)).unwrap_err();
        assert_eq!(m.to_string(), "dtype mismatch: got bf16[2, 3], expected f32[2, 3]");
        // Empty tensors of the same shape match; of different shapes do not.
        assert!(compare(&Tensor::zeros(DType::F32, &[0, 3]), &Tensor::zeros(DType::F32, &[0, 3]), Tolerance::Exact).is_ok());
        assert!(compare(&Tensor::zeros(DType::F32, &[0]), &Tensor::zeros(DType::F32, &[0, 3]), Tolerance::Exact).is_err());
    }

    #[test]
    fn nan_inf_and_signed_zero_rules() {
        let t = |v: Vec<f64>| Tensor::from_vec(&[v.len()], v);
        let tols = [Tolerance::Exact, Tolerance::Ulps(1000), Tolerance::Bound { abs: 1e300, rel: 1e300 }];
        for tol in tols {
            // NaN vs NaN with different payloads: equal.
            let q = f64::from_bits(0x7ff8_0000_0000_0001);
            assert!(compare(&t(vec![f64::NAN]), &t(vec![q]), tol).is_ok(), "{tol:?}");
            assert!(compare(&t(vec![f64::NAN]), &t(vec![1.0]), tol).is_err(), "{tol:?}");
            assert!(compare(&t(vec![1.0]), &t(vec![f64::NAN]), tol).is_err(), "{tol:?}");
            assert!(compare(&t(vec![f64::MAX]), &t(vec![f64::INFINITY]), tol).is_err(), "{tol:?}");
            assert!(compare(&t(vec![f64::NEG_INFINITY]), &t(vec![f64::INFINITY]), tol).is_err(), "{tol:?}");
            assert!(compare(&t(vec![f64::INFINITY]), &t(vec![f64::INFINITY]), tol).is_ok(), "{tol:?}");
        }
        assert!(compare(&t(vec![-0.0]), &t(vec![0.0]), Tolerance::Exact).is_err());
        assert!(compare(&t(vec![-0.0]), &t(vec![0.0]), Tolerance::Ulps(0)).is_ok());
        let m = compare(&t(vec![1.0, f64::NAN]), &t(vec![1.0, 2.0]), Tolerance::Exact).unwrap_err();
        assert_eq!((m.index, m.got.as_str(), m.expected.as_str()), (1, "NaN", "2.0"));
    }

    #[test]
    fn ulps_count_in_the_dtypes_own_spacing() {
        use concord_core::half::bf16;
        let one = bf16::from_f32(1.0);
        let two_up = bf16::from_bits(one.to_bits() + 2);
        let three_up = bf16::from_bits(one.to_bits() + 3);
        let a = Tensor::from_vec(&[1], vec![one]);
        assert!(compare(&Tensor::from_vec(&[1], vec![two_up]), &a, Tolerance::Ulps(2)).is_ok());
        assert!(compare(&Tensor::from_vec(&[1], vec![three_up]), &a, Tolerance::Ulps(2)).is_err());
        // Across zero: the smallest negative and positive subnormals are 2 apart.
        let p = Tensor::from_vec(&[1], vec![f32::from_bits(1)]);
        let n = Tensor::from_vec(&[1], vec![-f32::from_bits(1)]);
        assert!(compare(&p, &n, Tolerance::Ulps(2)).is_ok());
        assert!(compare(&p, &n, Tolerance::Ulps(1)).is_err());
    }

    #[test]
    fn tolerance_choice() {
        use ReduceOp::*;
        assert_eq!(tolerance_for(DType::I32, Some(Avg), 8, false), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::F32, None, 8, false), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::F16, Some(Sum), 8, true), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::F16, Some(Avg), 8, true), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::F32, Some(Avg), 64, true), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::F32, Some(Avg), 65, true), Tolerance::Ulps(2));
        assert_eq!(tolerance_for(DType::BF16, Some(Max), 8, false), Tolerance::Exact);
        assert_eq!(tolerance_for(DType::BF16, Some(PremulSum(2.0)), 8, true), Tolerance::Exact);
        assert!(matches!(tolerance_for(DType::BF16, Some(PremulSum(0.3)), 8, true), Tolerance::Bound { .. }));
        let abs_of = |d, ws| match tolerance_for(d, Some(Sum), ws, false) {
            Tolerance::Bound { abs, .. } => abs,
            t => panic!("{t:?}"),
        };
        assert!(abs_of(DType::F32, 8) > abs_of(DType::F32, 2));
        assert!(abs_of(DType::BF16, 4) > abs_of(DType::F16, 4));
        assert!(abs_of(DType::F64, 64) < 1e-12);
    }
}
