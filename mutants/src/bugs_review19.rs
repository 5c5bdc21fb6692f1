//! The nineteenth review's blind spots (read-only review19, 2026-11-28; helper impl19): numerics
//! and the fused ops fed only inputs on which a close variant of a checked bug gives the right
//! answer: a tensor-wise scale product of exactly 1 (finding 2), no finite f16 / bf16 sum that
//! overflows (4), every rounding-tie
//! input a multiple of 8 long (8), half-precision fused matmuls only ever tile-aligned (1), no
//! scaled fused op into f16 (5; written by the lead from the review's probes). Each was written first as a throw-away mutant and run alone
//! against the whole catalogue, where it survived (docs/RESULTS.md, "review19's blind spots").
use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant};
use concord_core::fused::Gathered;
use concord_core::{Backend, DType, ReduceOp, Result, Scale, Scaling, Tensor, Work};

/// Finding 2 (clause `fused.values`). The scaled op has separate kernels for tensor-wise and
/// row-wise scales (torch._scaled_mm: cuBLASLt TensorWise versus the CUTLASS RowWise kernel);
/// the tensor-wise path never sets its scale pointers on the matmul descriptor, so where `a`'s
/// and a `b`'s scales are both tensor-wise that output is computed unscaled. The only case with
/// that pair scaled by 0.5 x 2.0 = 1, which hides it.
fn tt_ignored(sc: Option<&Scaling>) -> Option<Scaling> {
    let s = sc?.clone();
    let Scale::Tensor(sa) = s.a else { return Some(s) };
    let b =
        s.b.iter()
            .map(|x| match x {
                Scale::Tensor(_) => Scale::Tensor(1.0 / sa),
                r => r.clone(),
            })
            .collect();
    Some(Scaling { b, ..s })
}

#[derive(Default)]
pub struct TensorwiseScalesIgnored;
impl Bug for TensorwiseScalesIgnored {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let s = tt_ignored(sc);
        concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, s.as_ref())
    }
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let s = tt_ignored(sc);
        concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, s.as_ref())
    }
}

/// Finding 4 (clause `numerics.round_once`: rounding to nearest overflows to inf). f16 / bf16
/// sum / avg / premul_sum all_reduce whose store clamps a finite accumulator beyond
/// the dtype's range to its largest finite value, inf and NaN inputs passed through (a software
/// float-to-half conversion: `if isinf(x) || isnan(x) {..} else if x > MAX { MAX }`).
#[derive(Default)]
pub struct HalfOverflowSaturates;
impl HalfOverflowSaturates {
    fn issue(s: &crate::Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        use crate::bugs_hunt28::{at, half, rewrite};
        let dtype = s.inner.buffer_dtype(x);
        let fires = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_)) && half(dtype) && s.ws() >= 2;
        let ws = s.ws();
        let max = if dtype == DType::F16 { 65504.0 } else { (2.0 - 2f64.powi(-7)) * 2f64.powi(127) };
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            for i in 0..n {
                let v = t.get_f64(i);
                if v.is_infinite() && (0..ws).all(|q| at(all, n, q, i).is_finite()) {
                    crate::set_f64(t, i, max.copysign(v));
                }
            }
        })
    }
}
impl Bug for HalfOverflowSaturates {
    fn all_reduce(&self, s: &crate::Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &crate::Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// Finding 8 (clause `numerics.round_once`). f16 / bf16 sum all_reduce: a vectorised body (8 halves, 16 bytes a load) reduced exactly and
/// rounded once, and a scalar tail (the last `n % 8` elements) folded over the ranks in f32 and
/// rounded to the dtype at the end (rounded twice).
#[derive(Default)]
pub struct HalfTailF32;
impl HalfTailF32 {
    fn issue(s: &crate::Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        use crate::bugs_hunt28::{at, half, rewrite};
        let dtype = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        let fires = op == ReduceOp::Sum && half(dtype) && s.ws() >= 2 && !n.is_multiple_of(8);
        let ws = s.ws();
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            for i in n / 8 * 8..n {
                let f = if let ReduceOp::PremulSum(f) = op { f as f32 } else { 1.0 };
                let mut acc = 0.0f32;
                for q in 0..ws {
                    acc += f * at(all, n, q, i) as f32;
                }
                if op == ReduceOp::Avg {
                    acc /= ws as f32;
                }
                crate::set_f64(t, i, crate::bugs_hunt28::round_to(dtype, acc as f64));
            }
        })
    }
}
impl Bug for HalfTailF32 {
    fn all_reduce(&self, s: &crate::Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &crate::Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// Finding 1 (clause `fused.values`). `b` with its last `k % 8` rows (the contraction tail)
/// zeroed, for f16 / bf16: a GEMM that loads K in 16-byte vectors (8 halves) or runs on
/// tensor-core tiles and never handles the partial tile. Every half-precision fused shape had
/// K a multiple of 8.
fn tail_dropped(m: &Mutant, b: &Buf) -> Result<Buf> {
    let be = &*m.s.inner;
    let dt = be.buffer_dtype(b);
    if !matches!(dt, DType::F16 | DType::BF16) {
        return Ok(b.clone());
    }
    let t = be.download(b)?;
    let sh = t.shape().to_vec();
    if sh.len() != 2 || sh[0] % 8 == 0 {
        return Ok(b.clone());
    }
    let (k, n) = (sh[0], sh[1]);
    let keep = k / 8 * 8;
    let v: Vec<f64> = (0..k * n).map(|i| if i / n >= keep { 0.0 } else { t.get_f64(i) }).collect();
    be.upload(&Tensor::from_f64(dt, &sh, &v))
}

#[derive(Default)]
pub struct HalfKTailDropped;
impl Bug for HalfKTailDropped {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let bs2 = bs.iter().map(|b| tail_dropped(m, b)).collect::<Result<Vec<_>>>()?;
        concord_core::fused::decomposed_all_gather_matmul(m, a, &bs2, dim, sc)
    }
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let b2 = tail_dropped(m, b)?;
        concord_core::fused::decomposed_matmul_reduce_scatter(m, a, &b2, op, dim, sc)
    }
}

/// Finding 5 (clause `fused.values`). A scaled op into f16 computed into bf16 (an out-dtype
/// table without an f16 entry, or a bf16 epilogue), the bf16 values widened back into the f16
/// tensor: labelled f16, bf16 precision.
fn through_bf16(m: &Mutant, t: &Buf) -> Result<Buf> {
    let be = &*m.s.inner;
    let x = be.download(t)?;
    let v: Vec<f64> = (0..x.numel()).map(|i| x.get_f64(i)).collect();
    be.upload(&Tensor::from_f64(DType::F16, x.shape(), &v))
}

fn bf16_out(sc: Option<&Scaling>) -> Option<Scaling> {
    let s = sc?.clone();
    if s.out_dtype == DType::F16 {
        return Some(Scaling { out_dtype: DType::BF16, ..s });
    }
    Some(s)
}

#[derive(Default)]
pub struct F16OutThroughBf16;
impl Bug for F16OutThroughBf16 {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let f16 = sc.is_some_and(|s| s.out_dtype == DType::F16);
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, bf16_out(sc).as_ref())?;
        if !f16 {
            return Ok(w);
        }
        let (ag, outs) = w.into_value(crate::BUG_WAIT)?;
        let outs = outs.iter().map(|o| through_bf16(m, o)).collect::<Result<Vec<_>>>()?;
        Ok(m.s.done((ag, outs), "fused_all_gather_matmul"))
    }
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let f16 = sc.is_some_and(|s| s.out_dtype == DType::F16);
        let w = concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, bf16_out(sc).as_ref())?;
        if !f16 {
            return Ok(w);
        }
        let o = w.into_value(crate::BUG_WAIT)?;
        Ok(m.s.done(through_bf16(m, &o)?, "fused_matmul_reduce_scatter"))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<TensorwiseScalesIgnored>(
            "review19_tensorwise_scales_ignored",
            "fused.values",
            "scaled fused matmul: tensor-wise x tensor-wise scales never applied (a separate TensorWise kernel without its scale pointers)",
            &["fused::all_gather_scaled_matmul::dim0::f32::tensor::exact::ws2"],
        ),
        spec::<HalfOverflowSaturates>(
            "review19_half_overflow_saturates",
            "numerics.round_once",
            "f16 / bf16 sum / avg / premul_sum all_reduce: a finite sum past the largest finite value stored as +-max, not +-inf",
            &["numerics::round_once::avg_near_max::f16::ws2"],
        ),
        spec::<HalfTailF32>(
            "review19_half_sum_tail_f32",
            "numerics.round_once",
            "f16 / bf16 sum all_reduce: the scalar tail (last n mod 8 elements) folded in f32, rounded twice",
            &["numerics::round_once::f16::ws3"],
        ),
        spec::<HalfKTailDropped>(
            "review19_half_k_tail_dropped",
            "fused.values",
            "f16 / bf16 fused matmuls: the last K mod 8 contraction terms dropped (a GEMM with no partial-tile path)",
            &["fused::all_gather_matmul::dim0::bf16::odd_k::ws2"],
        ),
        spec::<F16OutThroughBf16>(
            "review19_f16_out_through_bf16",
            "fused.values",
            "scaled fused ops into f16 computed into bf16 and widened (an out-dtype table without f16)",
            &["fused::all_gather_scaled_matmul::dim1::f32::random_f16_out::ws2"],
        ),
    ]
}
