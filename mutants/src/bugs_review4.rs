//! The fourth review (helper reviewd, docs/review-d.md): bugs in the fused ops that the fused
//! suite's checks looked able to catch but were never given the shape or the inputs to: the
//! scaled ops ran at dims 0 and 1 only, with column scales repeating at the chunk's width, and
//! on small exact integers only, always into bf16; the low-contention ops never ran on a group.
//! Each keeps shm's validation (the
//! decomposition's own exchange), so only the values differ.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant, BUG_WAIT};
use concord_core::fused::{decomposed_all_gather_matmul, decomposed_matmul_reduce_scatter, Gathered};
use concord_core::half::bf16;
use concord_core::{Backend, DType, ReduceOp, Result, Scale, Scaling, Tensor, Work};

/// Finding 1 (clause `fused.values`, "every gather / scatter dim"): the scaled
/// matmul-reduce-scatter scattering the LAST dim scales every rank's chunk of columns with
/// columns `0..cs` of the per-column `scale_b` (the chunk's offset into the scales forgotten:
/// the per-column twin of pytorch/pytorch #136866's unsharded row scale). Right at every other
/// scatter dim, with per-tensor scales, at one rank, and wherever the column scales repeat with
/// the chunk's width.
#[derive(Default)]
pub struct ScaledRsColScalesUnshifted;

impl Bug for ScaledRsColScalesUnshifted {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let last = m.buffer_shape(a).len().saturating_sub(1);
        let ws = m.world_size();
        let wrong = sc.map(|s| {
            let mut s = s.clone();
            if dim == last {
                if let Some(Scale::Rows(v)) = s.b.first() {
                    let cs = v.len() / ws.max(1);
                    if cs > 0 {
                        s.b[0] = Scale::Rows((0..v.len()).map(|j| v[j % cs]).collect());
                    }
                }
            }
            s
        });
        decomposed_matmul_reduce_scatter(m, a, b, op, dim, wrong.as_ref())
    }
}

/// An f32 operand rounded to bf16 and back (a quantised fast path); other dtypes unchanged.
fn through_bf16(m: &Mutant, x: &Buf) -> Result<Buf> {
    let t = m.download(x)?;
    if t.dtype() != DType::F32 {
        return m.upload(&t);
    }
    let v: Vec<f32> = t.as_slice::<f32>().iter().map(|x| bf16::from_f32(*x).to_f32()).collect();
    m.upload(&Tensor::from_vec(t.shape(), v))
}

/// Finding 2 (clause `fused.values`, "each product block accumulated and rounded once to the
/// output dtype"): the scaled variants (both) quantise their f32 operands to bf16 before the
/// matmul, as a fast `_scaled_mm` path does; the all-gathered `a` is still exact, and the
/// unscaled ops are right. Small integers are exact in bf16, so exact inputs cannot see it.
#[derive(Default)]
pub struct ScaledOperandsBf16;

impl Bug for ScaledOperandsBf16 {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        if sc.is_none() {
            return decomposed_all_gather_matmul(m, a, bs, dim, sc);
        }
        let (ag, _) = decomposed_all_gather_matmul(m, a, bs, dim, sc)?.into_value(BUG_WAIT)?;
        let aq = through_bf16(m, a)?;
        let bq = bs.iter().map(|x| through_bf16(m, x)).collect::<Result<Vec<_>>>()?;
        let (_, outs) = decomposed_all_gather_matmul(m, &aq, &bq, dim, sc)?.into_value(BUG_WAIT)?;
        Ok(m.s.done((ag, outs), "fused_all_gather_scaled_matmul"))
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
        if sc.is_none() {
            return decomposed_matmul_reduce_scatter(m, a, b, op, dim, sc);
        }
        decomposed_matmul_reduce_scatter(m, &through_bf16(m, a)?, &through_bf16(m, b)?, op, dim, sc)
    }
}

/// Left out by the review, then written (finding 9, clause `subgroups`): the low-contention
/// all-gather on a subgroup places each member's shard by the order of the members' WORLD ranks,
/// not by their group ranks (a symmetric-memory rendezvous that numbers peers by world rank).
/// Right on the world and on every group whose members ascend in world rank; the fused suite
/// never ran a low-contention op on a group.
#[derive(Default)]
pub struct LcGroupShardsByWorldRank;

impl Bug for LcGroupShardsByWorldRank {
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        let w = concord_core::fused::decomposed_low_contention(m, x, op)?;
        if op.is_some() || !m.s.in_subgroup() {
            return Ok(w);
        }
        let out = w.into_value(BUG_WAIT)?;
        let t = m.download(&out)?;
        let n = m.s.members.len().max(1);
        let chunk = t.len_bytes() / n;
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&q| m.s.members[q]);
        let mut wrong = t.clone();
        for (i, &q) in order.iter().enumerate() {
            wrong.bytes_mut()[i * chunk..(i + 1) * chunk].copy_from_slice(&t.bytes()[q * chunk..(q + 1) * chunk]);
        }
        Ok(m.s.done(m.upload(&wrong)?, "low_contention_all_gather"))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<ScaledRsColScalesUnshifted>(
            "review4_scaled_rs_col_scales_unshifted",
            "fused.values",
            "scaled matmul-reduce-scatter along the last dim scales every rank's chunk with the first chunk's column scales",
            &["fused::scaled_matmul_reduce_scatter::dim2::f32::tensor::exact::ws2"],
        ),
        spec::<ScaledOperandsBf16>(
            "review4_scaled_operands_bf16",
            "fused.values",
            "the scaled fused ops quantise their f32 operands to bf16 before the matmul (exact on small integers)",
            &["fused::all_gather_scaled_matmul::dim1::f32::random::ws2"],
        ),
        spec::<LcGroupShardsByWorldRank>(
            "review4_lc_group_shards_by_world_rank",
            "subgroups",
            "low_contention_all_gather on a subgroup places the shards in the order of the members' world ranks, not their group ranks",
            &["fused::low_contention_all_gather::dim0::f32::group_grid::ws7"],
        ),
    ]
}
