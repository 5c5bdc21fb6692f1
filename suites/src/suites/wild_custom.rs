//! Cases written for shipped bugs of custom collective kernels and symmetric-memory paths outside
//! NCCL (the twenty-second hunt, `concord_mutants::bugs_hunt22`), where the rest of the catalogue
//! let the bug through.
//!
//! * `wild_custom::all_reduce::tail_past_16ws::f32::{out::ws3,inplace::ws4}` — a sum all_reduce
//!   of [`TAIL_N`] f32 (1,048,736 bytes): past 1 MiB, a multiple of 32 bytes, but not of
//!   `16 * ws` bytes at 3, 4, 5 or 8 ranks, every element checked against the oracle (clause
//!   `values.sizes`). MSCCL++'s `allreduce8`, which RCCL runs above 1 MiB, reduced
//!   `bytes / 16 / ws` 16-byte words per rank and left the rest unreduced (ROCm/rccl PR #1556);
//!   the catalogue's sizes past 1 MiB were all multiples of `16 * ws` bytes, and its odd sizes
//!   (`sizes::all_reduce::f32::n65535`) are below the large-message path.
//! * `wild_custom::all_reduce::replayed_buffer::{f16::out::ws2,bf16::inplace::ws2}` — the same
//!   input buffer all-reduced [`REPLAYS`] times (sum, 1 MiB of f16 / bf16), new values written into
//!   it before each call, as a captured CUDA graph replays one call on its static buffers; every
//!   result checked (clause `placement.reuse`). AITER's and SGLang's quick-reduce froze its round
//!   flag in the graph, so a replay's waiter took the previous replay's flag and read the
//!   previous replay's data (ROCm/aiter PR #3928, sgl-project/sglang PR #29508); the catalogue's
//!   persistent-buffer cases run f32 below quick-reduce's 1 MiB floor, where it is not used.

use super::util::{expect_oracle, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use concord_core::{Backend, DType, OpKind, ReduceOp, Variant};
use concord_fixtures::InputKind;

/// Elements of the tail cases (f32): 1,048,736 bytes, a multiple of 32 but not of 48, 64, 80
/// or 128.
pub const TAIL_N: usize = 262_184;
/// Elements of the replay cases (f16 / bf16): 1 MiB.
pub const REPLAY_N: usize = 1 << 19;
/// Calls on the one buffer in a replay case.
pub const REPLAYS: usize = 3;

fn meta(variant: Variant, dtype: DType) -> CaseMeta {
    CaseMeta {
        suite: "wild_custom".into(),
        op: "all_reduce".into(),
        variant: variant.name().into(),
        dtype: dtype.name().into(),
        reduce: "sum".into(),
    }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for (variant, ws) in [(Variant::Out, 3), (Variant::InPlace, 4)] {
        let name = format!("wild_custom::all_reduce::tail_past_16ws::f32::{}::ws{ws}", variant.name());
        v.push(Case::<B>::new(name, meta(variant, DType::F32), ws, move |ctx| {
            let what = format!("shape=[{TAIL_N}] ({} bytes) input=exact", TAIL_N * 4);
            check_calls(ctx, DType::F32, variant, TAIL_N, 1, &what)
        }));
    }
    for (dtype, variant) in [(DType::F16, Variant::Out), (DType::BF16, Variant::InPlace)] {
        let name = format!("wild_custom::all_reduce::replayed_buffer::{dtype}::{}::ws2", variant.name());
        v.push(Case::<B>::new(name, meta(variant, dtype), 2, move |ctx| {
            let what = format!("shape=[{REPLAY_N}] input=exact, one input buffer rewritten before each call");
            check_calls(ctx, dtype, variant, REPLAY_N, REPLAYS, &what)
        }));
    }
    v
}

/// `calls` sum all_reduces of `n` elements on ONE input buffer, new exact inputs written into it
/// before each, every result checked against the oracle.
fn check_calls<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType, variant: Variant, n: usize, calls: usize, what: &str) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    if let Err(reason) = caps.check(OpKind::AllReduce, Some(variant), Some(dtype), Some(ReduceOp::Sum), ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let w = format!("{} reduce=sum {what}", here(b, "all_reduce", variant.name(), dtype));
    let p = Params { reduce: Some(ReduceOp::Sum), ..Default::default() };
    let coll = exec::collective(OpKind::AllReduce, &p, ws).ok_or_else(|| fail(&w, "suite bug: no oracle for all_reduce"))?;
    let seed = concord_fixtures::seed_for(&format!("wild_custom::all_reduce::{dtype}::{n}"));
    let x = b.alloc(dtype, &[n]).map_err(|e| fail(&w, format!("alloc: {e} [{}]", e.name())))?;
    for k in 0..calls {
        let inputs = concord_fixtures::inputs(seed + k as u64, ws, dtype, &[n], Some(ReduceOp::Sum), InputKind::Exact);
        b.write(&x, &inputs[me]).map_err(|e| fail(&w, format!("write of call {k}'s input: {e} [{}]", e.name())))?;
        let out = exec::call(b, OpKind::AllReduce, variant, std::slice::from_ref(&x), None, &p, ctx.timeout)
            .map_err(|e| fail(&w, format!("call {k} of {calls}: {e} [{}]", e.name())))?;
        if !caps.moves_data {
            // Values are not part of a data-less backend's contract (the fake's).
            continue;
        }
        expect_oracle(b, &coll, &inputs, &out[0], &format!("{w}; call {k} of {calls}"))?;
    }
    Ok(())
}
