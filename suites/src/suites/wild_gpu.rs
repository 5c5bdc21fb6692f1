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
//! * `wild::all_reduce_identical_on_every_rank::ws{3,4}` — f32 `sum` all_reduce (out of place
//!   and in place) of random inputs whose rounding depends on the order of the additions: every
//!   rank's result must be the same bits as every other rank's (all_reduce leaves identical
//!   copies of one result), compared through the store, not through the backend under test
//!   (pytorch/pytorch PR #129501: each rank added its peers round-robin from itself, so the
//!   ranks' sums rounded differently; a tolerance against the oracle cannot see that).

use super::util::{expect_oracle, expect_same_on_every_rank, fail, here};
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
    let mut v = vec![Case::<B>::new(
        "wild::one_rank_block_tails::ws1",
        meta("all_reduce", "out/inplace", "f16/bf16/f32/f64", "avg/premul_sum"),
        1,
        one_rank_block_tails,
    )];
    for ws in [3, 4] {
        v.push(Case::<B>::new(
            format!("wild::all_reduce_identical_on_every_rank::ws{ws}"),
            meta("all_reduce", "out/inplace", "f32", "sum"),
            ws,
            identical_on_every_rank,
        ));
    }
    v
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

/// Lengths of [`identical_on_every_rank`]: a short one and a few pages.
pub const IDENTICAL_LENGTHS: [usize; 2] = [257, 4099];

/// Rank `r`'s f32 input of `n` elements: magnitudes spread over 2^-12..2^12 and both signs, so
/// sums of three or more of them round differently in different orders.
fn spread_input(r: usize, n: usize) -> Tensor {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15 ^ ((r as u64 + 1) << 32) ^ n as u64;
    let vals: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = ((s >> 40) as f32) / (1u64 << 24) as f32 - 0.5;
            let e = ((s >> 16) % 25) as i32 - 12;
            m * 2f32.powi(e)
        })
        .collect();
    Tensor::from_vec(&[n], vals)
}

fn identical_on_every_rank<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let me = b.rank();
    let caps = b.capabilities();
    let mut ran = 0;
    let mut unsupported: Vec<String> = Vec::new();
    for n in IDENTICAL_LENGTHS {
        for in_place in [false, true] {
            let variant = if in_place { "inplace" } else { "out" };
            let v = if in_place { Variant::InPlace } else { Variant::Out };
            if let Err(why) = caps.check(OpKind::AllReduce, Some(v), Some(DType::F32), Some(ReduceOp::Sum), b.world_size()) {
                unsupported.push(why);
                continue;
            }
            ran += 1;
            let w = format!(
                "{} reduce=sum shape=[{n}] input=random (all ranks' results must be the same bits)",
                here(b, "all_reduce", variant, DType::F32)
            );
            let x = b.upload(&spread_input(me, n)).map_err(|e| fail(&w, format!("upload: {e}")))?;
            let work = if in_place { b.all_reduce_(&x, ReduceOp::Sum) } else { b.all_reduce(&x, ReduceOp::Sum) };
            let work = work.map_err(|e| fail(&w, format!("issue: {e} [{}]", e.name())))?;
            let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e} [{}]", e.name())))?;
            if !b.capabilities().moves_data {
                continue;
            }
            let mine = b.download(out).map_err(|e| fail(&w, format!("download: {e}")))?;
            expect_same_on_every_rank(ctx, &mine, &format!("{variant}/n{n}"), &w)?;
        }
    }
    if ran == 0 {
        unsupported.sort();
        unsupported.dedup();
        return Err(CaseEnd::Unsupported(unsupported.join("; ")));
    }
    Ok(())
}
