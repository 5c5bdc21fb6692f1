//! Bugs from the wild (the eighteenth hunt): checks aimed at correctness bugs that shipped in GPU
//! collective libraries and that the rest of the catalogue let through when they were ported to
//! the mutation campaign (`concord-mutants`, module `bugs_hunt18`). Each case names the thread
//! its bug comes from.
//!
//! * `wild::one_rank_block_tails::ws1` — one rank, float `avg` and `premul_sum` (all_reduce out of
//!   place and in place, reduce_scatter, reduce) on f16 / bf16 / f32 / f64 tensors whose length is one more than, or one pack short
//!   of, a multiple of a kernel's block split (16 KiB + 1 element, 512 KiB + a pack - 1): every
//!   element, the last ones included, must be the oracle's (NVIDIA/nccl #1950, pytorch/pytorch
//!   #168092: the one-rank kernel's blocks took `alignUp(⌊n / grid⌋, pack)` elements each and
//!   the tail was never written).
//!
//! (The eighteenth hunt's `wild::all_reduce_identical_on_every_rank` case grew into the
//! [`super::identical`] grid.)

use super::util::{expect_oracle, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_oracle::Collective;

fn meta(op: &str, variant: &str, dtype: &str, reduce: &str) -> CaseMeta {
    CaseMeta { suite: "wild".into(), op: op.into(), variant: variant.into(), dtype: dtype.into(), reduce: reduce.into() }
}

/// The block a one-rank kernel splits its work by (bytes): NCCL's `ncclLaunchOneRank` launches
/// `min(32, ⌈bytes / 16 KiB⌉)` blocks.
pub const BLOCK_BYTES: usize = 16 << 10;
/// Its largest grid.
pub const MAX_BLOCKS: usize = 32;
/// Its pack (bytes): each block's share is rounded to whole 16-byte packs.
pub const PACK_BYTES: usize = 16;
/// The premul_sum factor of [`one_rank_block_tails`] (exact in every float dtype).
pub const FACTOR: f64 = 3.0;

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    vec![Case::<B>::new(
        "wild::one_rank_block_tails::ws1",
        meta("all_reduce", "out/inplace", "f16/bf16/f32/f64", "avg/premul_sum"),
        1,
        one_rank_block_tails,
    )]
}

/// The lengths of [`one_rank_block_tails`] for `dtype`: a block and one element (two blocks,
/// one element past their split), and the largest grid's bytes plus a pack less one element.
pub fn tail_lengths(dtype: DType) -> [usize; 2] {
    let es = dtype.size();
    [BLOCK_BYTES / es + 1, MAX_BLOCKS * BLOCK_BYTES / es + PACK_BYTES / es - 1]
}

/// Element `i` of the one-rank input: small integers of both signs (exact in every float dtype,
/// times [`FACTOR`] too), none zero, so an element left unwritten or unscaled shows.
fn one_rank_input(dtype: DType, n: usize) -> Tensor {
    let vals: Vec<f64> = (0..n)
        .map(|i| match (i % 83) as f64 - 41.0 {
            0.0 => 7.0,
            v => v,
        })
        .collect();
    Tensor::from_f64(dtype, &[n], &vals)
}

fn one_rank_block_tails<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let caps = b.capabilities();
    let mut ran = 0;
    let mut unsupported: Vec<String> = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for n in tail_lengths(dtype) {
            let input = one_rank_input(dtype, n);
            for op in [ReduceOp::Avg, ReduceOp::PremulSum(FACTOR)] {
                // all_reduce out of place and in place, then reduce_scatter and reduce: every
                // reduction that takes NCCL's one-rank kernel.
                for (kind, v) in [
                    (OpKind::AllReduce, Variant::Out),
                    (OpKind::AllReduce, Variant::InPlace),
                    (OpKind::ReduceScatterTensor, Variant::Out),
                    (OpKind::Reduce, Variant::Out),
                ] {
                    // What the backend declares it does not do is passed over (the case is
                    // unsupported only if that is every combination).
                    if let Err(why) = caps.check(kind, Some(v), Some(dtype), Some(op), 1) {
                        unsupported.push(why);
                        continue;
                    }
                    ran += 1;
                    let w = format!(
                        "{} reduce={} shape=[{n}] (one rank: the tail past a block split)",
                        here(b, kind.name(), v.name(), dtype),
                        op.name()
                    );
                    let x = b.upload(&input).map_err(|e| fail(&w, format!("upload: {e}")))?;
                    let (work, coll) = match (kind, v) {
                        (OpKind::AllReduce, Variant::InPlace) => (b.all_reduce_(&x, op), Collective::AllReduce { op }),
                        (OpKind::AllReduce, _) => (b.all_reduce(&x, op), Collective::AllReduce { op }),
                        (OpKind::ReduceScatterTensor, _) => (b.reduce_scatter_tensor(&x, op), Collective::ReduceScatter { op }),
                        _ => (b.reduce(&x, op, 0), Collective::Reduce { op, root: 0 }),
                    };
                    let work = work.map_err(|e| fail(&w, format!("issue: {e} [{}]", e.name())))?;
                    let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e} [{}]", e.name())))?;
                    expect_oracle(b, &coll, std::slice::from_ref(&input), out, &w)?;
                }
            }
        }
    }
    if ran == 0 {
        unsupported.sort();
        unsupported.dedup();
        return Err(CaseEnd::Unsupported(unsupported.join("; ")));
    }
    Ok(())
}
