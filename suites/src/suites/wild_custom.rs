//! Cases written for shipped bugs of custom collective kernels and symmetric-memory paths outside
//! NCCL (the twenty-second hunt, `concord_mutants::bugs_hunt22`), where the rest of the catalogue
//! let the bug through.
//!
//! * `wild_custom::all_reduce::tail_past_16ws::f32::{out::ws3,inplace::ws4}` — a sum all_reduce
//!   of [`TAIL_N`] f32 (1,048,736 bytes): past 1 MiB, a multiple of 32 bytes, but not of
//!   `16 * ws` bytes at 3, 4, 5 or 8 ranks, every element checked against the exact sum (clause
//!   `values.sizes`). MSCCL++'s `allreduce8`, which RCCL runs above 1 MiB, reduced
//!   `bytes / 16 / ws` 16-byte words per rank and left the rest unreduced (ROCm/rccl PR #1556);
//!   the catalogue's sizes past 1 MiB were all multiples of `16 * ws` bytes, and its odd sizes
//!   (`sizes::all_reduce::f32::n65535`) are below the large-message path. The ws3 case then
//!   all-gathers [`TAIL_N`] f32 per rank, every element checked: MSCCL++'s all_gather has the
//!   same 32-byte gate (ROCm/rccl PR #1281), and no other input past 1 MiB at 3+ ranks is a
//!   multiple of 32 bytes (review17 finding 2). The size grid runs the same all_reduce at 5 and
//!   8 ranks ([`tail_past_16ws`], review17 finding 1).
//! * `wild_custom::all_reduce::replayed_buffer::{f16::out::ws2,bf16::inplace::ws2}` — the same
//!   input buffer all-reduced [`REPLAYS`] times (sum, 1 MiB of f16 / bf16), new values written into
//!   it before each call, as a captured CUDA graph replays one call on its static buffers; every
//!   result checked (clause `placement.reuse`). AITER's and SGLang's quick-reduce froze its round
//!   flag in the graph, so a replay's waiter took the previous replay's flag and read the
//!   previous replay's data (ROCm/aiter PR #3928, sgl-project/sglang PR #29508); the catalogue's
//!   persistent-buffer cases run f32 below quick-reduce's 1 MiB floor, where it is not used.
//! * `wild_custom::all_reduce::back_to_back_large::f32::out::ws2` — two sum all_reduces of the
//!   same shape past 4 MiB ([`LARGE_N`] f32), each from a new input buffer with other values,
//!   back to back; both results checked (clause `values.sizes`). AITER's registered-buffer
//!   all-reduce above its 4 MiB LL threshold let a peer see "ready" before the input copy into the
//!   reused IPC buffer was visible, so it reduced the previous call's input (ROCm/aiter PR #4812).
//!   Only one other case ran two large all_reduces back to back with new values
//!   (`async::lag_read_right_after_wait::ws2`, a timing case, seconds long).

use super::util::{expect_eq, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};

/// Elements of the tail cases (f32): 1,048,736 bytes, a multiple of 32 but not of 48, 64, 80
/// or 128.
pub const TAIL_N: usize = 262_184;
/// Elements of the replay cases (f16 / bf16): 1 MiB.
pub const REPLAY_N: usize = 1 << 19;
/// Calls on the one buffer in a replay case.
pub const REPLAYS: usize = 2;
/// Elements of the back-to-back large case (f32): 4 MiB and 16 bytes.
pub const LARGE_N: usize = (1 << 20) + 4;

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
            tail_past_16ws(ctx, variant)?;
            if ws == 3 {
                tail_all_gather(ctx)?;
            }
            Ok(())
        }));
    }
    for (dtype, variant) in [(DType::F16, Variant::Out), (DType::BF16, Variant::InPlace)] {
        let name = format!("wild_custom::all_reduce::replayed_buffer::{dtype}::{}::ws2", variant.name());
        v.push(Case::<B>::new(name, meta(variant, dtype), 2, move |ctx| {
            let what = format!("shape=[{REPLAY_N}] ({} bytes), one input buffer rewritten before each call", REPLAY_N * 2);
            calls(ctx, dtype, variant, REPLAY_N, REPLAYS, true, &what)
        }));
    }
    let name = "wild_custom::all_reduce::back_to_back_large::f32::out::ws2";
    v.push(Case::<B>::new(name, meta(Variant::Out, DType::F32), 2, |ctx| {
        let what = format!("shape=[{LARGE_N}] ({} bytes), a new input buffer per call", LARGE_N * 4);
        calls(ctx, DType::F32, Variant::Out, LARGE_N, 2, false, &what)
    }));
    v
}

/// One sum all_reduce of [`TAIL_N`] f32 (`variant`: out of place or in place), every element
/// checked: the tail cases' call, run too by the size grid's all_reduce cases at 5 and 8 ranks
/// (`sizes::all_reduce::{out::f32::grid::ws5,inplace::f32::grid::ws8}`, review17 finding 1:
/// a two-shot all_reduce splits `bytes / 16` packs per rank from 5 ranks on, and no other case
/// moves more than 256 KiB, a multiple of 16 bytes, at 5 to 8 ranks).
pub fn tail_past_16ws<B: Backend>(ctx: &mut Ctx<'_, B>, variant: Variant) -> CaseResult {
    let what = format!("shape=[{TAIL_N}] ({} bytes)", TAIL_N * 4);
    calls(ctx, DType::F32, variant, TAIL_N, 1, true, &what)
}

/// An all_gather_into_tensor (out of place) of [`TAIL_N`] f32 per rank, every element of the
/// `ws * TAIL_N` output checked (review17 finding 2: RCCL routes all_gathers past 1 MiB of a
/// multiple of 32 bytes to MSCCL++ too, and at 3 ranks and more no other input past 1 MiB is a
/// multiple of 32 bytes). Skipped where the backend declares the call a gap.
fn tail_all_gather<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    if b.capabilities().check(OpKind::AllGatherIntoTensor, Some(Variant::Out), Some(DType::F32), None, ws).is_err() {
        return Ok(());
    }
    let w = format!(
        "{} shape=[{TAIL_N}] ({} bytes) per rank, input[i] = i % 13 + 16 * rank",
        here(b, "all_gather_into_tensor", "out", DType::F32),
        TAIL_N * 4
    );
    let x = b.upload(&periodic(DType::F32, TAIL_N, |i| value(i, me, 0))).map_err(|e| fail(&w, format!("upload: {e} [{}]", e.name())))?;
    let out = exec::call(b, OpKind::AllGatherIntoTensor, Variant::Out, std::slice::from_ref(&x), None, &Params::default(), ctx.timeout)
        .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
    if !b.capabilities().moves_data {
        crate::case::note_values_unchecked();
        return Ok(());
    }
    let mut want = Tensor::zeros(DType::F32, &[ws * TAIL_N]);
    let chunk = TAIL_N * DType::F32.size();
    for r in 0..ws {
        want.bytes_mut()[r * chunk..(r + 1) * chunk].copy_from_slice(periodic(DType::F32, TAIL_N, |i| value(i, r, 0)).bytes());
    }
    expect_eq(b, &out[0], &want, &w)
}

/// The period of the cases' values.
const PERIOD: usize = 13;

/// Rank `r`'s input to call `k`, element `i`: small integers, exact in f16 and bf16 and in their
/// sums at 2 ranks over 2 calls (at most 168), and in f32 at any world size here.
fn value(i: usize, r: usize, k: usize) -> f64 {
    ((i % PERIOD) + 16 * r + 64 * k) as f64
}

/// `n` elements of `dtype` whose element `i` is `f(i % PERIOD)`: one period encoded, then its
/// bytes repeated (the cases' cost stays the collectives').
fn periodic(dtype: DType, n: usize, f: impl Fn(usize) -> f64) -> Tensor {
    let one = Tensor::from_f64(dtype, &[PERIOD], &(0..PERIOD).map(f).collect::<Vec<_>>());
    let es = dtype.size();
    let mut t = Tensor::zeros(dtype, &[n]);
    for chunk in t.bytes_mut().chunks_mut(PERIOD * es) {
        chunk.copy_from_slice(&one.bytes()[..chunk.len()]);
    }
    t
}

/// `calls` sum all_reduces of `n` elements, back to back, new values for each (written into ONE
/// input buffer with `one_buffer`, else each in a new buffer); every result checked element by
/// element against the sum of every rank's input, built in closed form ([`value`]), so the
/// case's cost is the collectives'.
fn calls<B: Backend>(
    ctx: &mut Ctx<'_, B>,
    dtype: DType,
    variant: Variant,
    n: usize,
    calls: usize,
    one_buffer: bool,
    what: &str,
) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    if let Err(reason) = caps.check(OpKind::AllReduce, Some(variant), Some(dtype), Some(ReduceOp::Sum), ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let w = format!("{} reduce=sum {what}, input[i] = i % 13 + 16 * rank + 64 * call", here(b, "all_reduce", variant.name(), dtype));
    let p = Params { reduce: Some(ReduceOp::Sum), ..Default::default() };
    let alloc = || b.alloc(dtype, &[n]).map_err(|e| fail(&w, format!("alloc: {e} [{}]", e.name())));
    let mut x = alloc()?;
    for k in 0..calls {
        if k > 0 && !one_buffer {
            x = alloc()?;
        }
        b.write(&x, &periodic(dtype, n, |i| value(i, me, k)))
            .map_err(|e| fail(&w, format!("write of call {k}'s input: {e} [{}]", e.name())))?;
        let out = exec::call(b, OpKind::AllReduce, variant, std::slice::from_ref(&x), None, &p, ctx.timeout)
            .map_err(|e| fail(&w, format!("call {k} of {calls}: {e} [{}]", e.name())))?;
        if !caps.moves_data {
            // Values are not part of a data-less backend's contract (the fake's): the case
            // cannot pass.
            crate::case::note_values_unchecked();
            continue;
        }
        let sum = periodic(dtype, n, |i| (0..ws).map(|r| value(i, r, k)).sum());
        expect_eq(b, &out[0], &sum, &format!("{w}; call {k} of {calls}"))?;
    }
    Ok(())
}
