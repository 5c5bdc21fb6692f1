//! Bugs the sweep's dtype grid (`cargo xtask mutants --dtype all`, [`crate::sweep::dtype_targets`])
//! pointed at: an op whose output in one dtype no case of a world size checked (the fused ops in
//! f64 at every world size; every op in the dtypes the matrix's sparse slice leaves out at 6, 7
//! and 16 ranks). Each is a bug a backend author could ship for those dtypes alone, over the
//! correct shm backend.

use crate::campaign::Spec;
use crate::{edit, set_f64, Buf, Bug, Mutant, Shm};
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

// ---------------------------------------------------------------- values.world_sizes

/// Whether `ws` takes the fold-in path of a recursive-doubling algorithm that a flat one handles
/// up to 5 ranks: a world that is not a power of two, of 6 ranks or more.
fn folds_excess(ws: usize) -> bool {
    ws >= 6 && !ws.is_power_of_two()
}

/// all_reduce `sum` of 1- and 2-byte integers in a world that folds its excess ranks in
/// ([`folds_excess`]): the narrow-integer vector kernel skips the fold-in step, so the ranks
/// past the largest power of two are left out of the sum (their own result included). The
/// float and 4- and 8-byte paths fold correctly.
#[derive(Default)]
pub struct NarrowIntFoldDropsExcess;

impl Bug for NarrowIntFoldDropsExcess {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let narrow_int = !dtype.is_float() && dtype.size() <= 2;
        if op != ReduceOp::Sum || !narrow_int || !folds_excess(s.ws()) {
            return s.inner.all_reduce(x, op);
        }
        let p2 = 1usize << s.ws().ilog2();
        if s.rank() < p2 {
            return s.inner.all_reduce(x, op);
        }
        // An excess rank's contribution never reaches the sum.
        let zeros = s.inner.upload(&Tensor::zeros(dtype, &s.inner.buffer_shape(x)))?;
        s.inner.all_reduce(&zeros, op)
    }
}

// ---------------------------------------------------------------- values.move

/// broadcast of 8-byte dtypes in a world that folds its excess ranks in ([`folds_excess`]):
/// that path counts the payload in 4-byte words but moves 8-byte elements, so the receivers get
/// the first half of the elements (rounded down) and keep the rest of their fresh output (zero).
#[derive(Default)]
pub struct WideBroadcastHalfMoved;

impl Bug for WideBroadcastHalfMoved {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        if s.inner.buffer_dtype(x).size() != 8 || !folds_excess(s.ws()) || s.rank() == src {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| {
            edit(be, out, |t| {
                let n = t.numel();
                for i in n / 2..n {
                    set_f64(t, i, 0.0);
                }
            })
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<FusedF64ThroughF32>(
            "fused_f64_through_f32",
            "fused.values",
            "the fused ops run f64 operands through the f32 kernel: results rounded to f32's precision",
            &["fused::all_gather_matmul::dim1::f64::random", "fused::matmul_reduce_scatter::dim1::f64::sum::random", "::f64::"],
        ),
        spec::<NarrowIntFoldDropsExcess>(
            "narrow_int_fold_drops_excess",
            "values.world_sizes",
            "all_reduce sum of 1- and 2-byte integers at 6, 7, 9.. ranks (not a power of two) leaves the ranks past the largest power of two out",
            &["all_reduce::out::dtypes::ws6", "all_reduce::out::dtypes::ws7"],
        ),
        spec::<WideBroadcastHalfMoved>(
            "wide_broadcast_half_moved",
            "values.move",
            "broadcast of 8-byte dtypes at 6, 7, 9.. ranks (not a power of two) moves half the elements (a count in 4-byte words)",
            &["broadcast::out::dtypes::ws6", "broadcast::out::dtypes::ws7"],
        ),
    ]
}
