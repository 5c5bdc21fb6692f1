//! Bugs the sweep's dtype grid (`cargo xtask mutants --dtype all`, [`crate::sweep::dtype_targets`])
//! pointed at: an op whose output in one dtype no case of a world size checked. Each is a bug a
//! backend author could ship for that dtype alone, over the correct shm backend.

use crate::campaign::Spec;
use crate::{edit, set_f64, Buf, Bug, Mutant};
use concord_core::fused::Gathered;
use concord_core::{Backend, DType, ReduceOp, Result, Scaling, Tensor, Work};

// ---------------------------------------------------------------- fused.values

/// Rounds every element of `t` to f32's precision (an f64 result computed by an f32 GEMM).
fn through_f32(t: &mut Tensor) {
    for i in 0..t.numel() {
        set_f64(t, i, t.get_f64(i) as f32 as f64);
    }
}

/// The fused ops run f64 operands through the f32 kernel (inputs and products in f32, the result
/// widened back): one kernel per float width is the usual shortcut, f64 being rare in training.
/// Exact small-integer inputs come out right; random ones lose everything past f32's 24 bits.
#[derive(Default)]
pub struct FusedF64ThroughF32;

impl Bug for FusedF64ThroughF32 {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc)?;
        if m.s.inner.buffer_dtype(a) != DType::F64 {
            return Ok(w);
        }
        Ok(m.s.then(w, |be, (_, outs)| outs.iter().try_for_each(|o| edit(be, o, through_f32))))
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
        let w = concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, sc)?;
        if m.s.inner.buffer_dtype(a) != DType::F64 {
            return Ok(w);
        }
        Ok(m.s.then(w, |be, out| edit(be, out, through_f32)))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![spec::<FusedF64ThroughF32>(
        "fused_f64_through_f32",
        "fused.values",
        "the fused ops run f64 operands through the f32 kernel: results rounded to f32's precision",
        &["fused::all_gather_matmul::dim1::f64::random", "fused::matmul_reduce_scatter::dim1::f64::sum::random", "::f64::"],
    )]
}
