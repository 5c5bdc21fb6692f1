//! Cases written for bugs shipped by CPU collective libraries (the nineteenth hunt,
//! `concord_mutants::bugs_hunt19`), where the rest of the catalogue let the bug through.
//!
//! * `wild_cpu::all_reduce::same_bits::{f32,f64}::{out,inplace}::ws{3,5}` — a float sum of
//!   random inputs whose value depends on the order of the additions, then every rank's result
//!   compared bit for bit with every other rank's through the store (`util::expect_same_on_every_rank`): an all_reduce returns the same bits
//!   on every rank, whatever order the backend adds in (clause `values.identical_on_every_rank`).
//!   Open MPI's allgather-then-reduce allreduce added each rank's own input first
//!   (open-mpi/ompi#12258), so ranks of one job held different sums; every other case compares a
//!   rank's random-input result with the oracle within the dtype's bound, which each rank's
//!   order passes alone.

use super::util::{expect_same_on_every_rank, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};

/// Elements of the same-bits cases (odd, so no chunking divides it evenly).
pub const SAME_BITS_N: usize = 1031;

fn meta(variant: &str, dtype: DType) -> CaseMeta {
    CaseMeta {
        suite: "wild_cpu".into(),
        op: "all_reduce".into(),
        variant: variant.into(),
        dtype: dtype.name().into(),
        reduce: "sum".into(),
    }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for (dtype, variant, ws) in
        [(DType::F32, Variant::Out, 3), (DType::F64, Variant::InPlace, 3), (DType::F32, Variant::InPlace, 5), (DType::F64, Variant::Out, 5)]
    {
        let name = format!("wild_cpu::all_reduce::same_bits::{dtype}::{}::ws{ws}", variant.name());
        v.push(Case::<B>::new(name, meta(variant.name(), dtype), ws, move |ctx| same_bits(ctx, dtype, variant)));
    }
    v
}

/// splitmix64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rank `r`'s input: random signs, mantissas and exponents over 2^-20..2^20, so a sum's bits
/// depend on the order of its additions.
fn input(dtype: DType, r: usize, n: usize) -> Tensor {
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let h = mix(((r as u64) << 32) ^ i as u64 ^ 0x5EED_0019);
            let mant = 1.0 + (h >> 12) as f64 / (1u64 << 52) as f64;
            let exp = ((h >> 4) % 41) as i32 - 20;
            let sign = if h & 1 == 0 { 1.0 } else { -1.0 };
            sign * mant * 2f64.powi(exp)
        })
        .collect();
    Tensor::from_f64(dtype, &[n], &vals)
}

fn same_bits<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType, variant: Variant) -> CaseResult {
    let b = ctx.b;
    let (ws, me, n) = (b.world_size(), b.rank(), SAME_BITS_N);
    let caps = b.capabilities();
    if let Err(reason) = caps.check(OpKind::AllReduce, Some(variant), Some(dtype), Some(ReduceOp::Sum), ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let w = format!("{} reduce=sum shape=[{n}] input=random (exponents 2^-20..2^20)", here(b, "all_reduce", variant.name(), dtype));
    let x = b.upload(&input(dtype, me, n)).map_err(|e| fail(&w, format!("upload: {e}")))?;
    let work = match variant {
        Variant::InPlace => b.all_reduce_(&x, ReduceOp::Sum),
        _ => b.all_reduce(&x, ReduceOp::Sum),
    };
    let out = work.and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
    if !caps.moves_data {
        // Values are not part of a data-less backend's contract (the fake's).
        return Ok(());
    }
    let mine = b.download(&out).map_err(|e| fail(&w, format!("download: {e}")))?;
    expect_same_on_every_rank(ctx, &mine, "result", &w)
}
