//! Rounding with exact expectations (issue 10): every expectation is the oracle's (f64, rounded
//! once, ties to even), compared bit for bit.
//!
//! * `numerics::round_once::{f16,bf16}::ws3` — sums whose exact value lies on, just above or just
//!   below a tie of the dtype: three ranks of f16 `[1.0, 2^-11, 2^-24]` give `0x3C01`, which an
//!   accumulator that rounds twice (f32, then f16) gets wrong (`0x3C00`; shm issue 15 item 11).
//!   Run only for a backend that declares [`Rounding::ExactThenRound`].
//! * `numerics::subnormal::{f16,bf16,f32,f64}::ws2` — sum / min / max of subnormal inputs,
//!   subnormal results of normal inputs, normal results of subnormal inputs, signed zeros (no
//!   flush to zero; exact in every dtype, whatever the declared rounding); then avg and
//!   premul_sum(0.5) whose results are subnormal (a scaling step run in a flush-to-zero kernel;
//!   each skipped where that reduce op is a declared gap of the call).
//! * `numerics::{round_once,subnormal}::{all_reduce_inplace,reduce_scatter,reduce_scatter_out,reduce_scatter_coalesced,reduce}::<dtype>::ws{3,2}`
//!   — the same expectations through in-place all_reduce, `reduce_scatter_tensor` (each rank's
//!   values repeated world-size times), `reduce_scatter_tensor_out` (the same, into the caller's
//!   buffer), `reduce_scatter_tensor_coalesced` (a list of that one tensor) and `reduce` (rooted
//!   at the last rank, checked there).
//! * `numerics::nan_minmax::{all_reduce_inplace,reduce_scatter,reduce_scatter_out,reduce_scatter_coalesced,reduce}::<dtype>::ws{2,3}`
//!   — min / max with NaN on one rank or both (at 3 ranks: each pair on every two rank positions,
//!   a number on the third), through the calls besides the out-of-place all_reduce (whose NaN
//!   policy `caps::nan_minmax` observes): the declared [`concord_core::NanPolicy`] holds there too.
//! * `numerics::{subnormal,premul_sum,nan_minmax}::{all_reduce_coalesced,all_reduce_coalesced_inplace}::<dtype>::ws{2,3}`
//!   — the subnormal, premul_sum and two-rank NaN expectations through the coalesced all_reduce
//!   (a list of one tensor: a fusion buffer's kernel).
//! * `numerics::round_once::spread::{f16,bf16}::ws{4,5,8,16}` — the tie sums with their three values
//!   on every ordered triple of the first, second, middle and last rank (zeros elsewhere): a
//!   reduction that rounds a partial of some ranks (a node group, a tree level) fails there.
//! * `numerics::round_once::spread::{all_reduce_inplace,reduce_scatter,reduce_scatter_out,reduce_scatter_coalesced,reduce}::<dtype>::ws{4,5}`
//!   — the spread ties through the other reducing calls (a rooted reduce's tree level, a
//!   reduce-scatter's ring step), rooted at the last rank.
//! * `numerics::round_once::long::{f16,bf16}::ws3` — the tie sums repeated to 4104 elements (a
//!   vector path taken past a block size).
//! * `numerics::round_once::avg_near_max::{f16,bf16}::ws{2,4}` — averages of values near the
//!   largest finite one: finite, though the sum overflows (a power-of-two world that scales the
//!   rounded sum by `1/ws` gets inf).
//! * `numerics::round_once::premul_sum::{f16,bf16}::ws3` — premul_sum(3.0) and (0.75) of the tie
//!   sums: `Σ s·x_r` rounded once, not the rounded sum scaled and rounded again.
//! * `numerics::premul_sum::{f16,bf16,f32,f64}::ws3` — factors 0.5 and 3.0 (exact in every
//!   dtype), and 1/3 (f16 / bf16 under `ExactThenRound`; f64 with inputs equal across ranks, so
//!   every order of the sum gives the same bits); factors 0.5 and 3.0 also through the other
//!   reducing calls (`numerics::premul_sum::reduce_scatter::f32::ws3`), and for f64 there the
//!   factor 1/3 and factors 0.5 and 3.0 of values that need more than f32's precision (a scale
//!   applied in f32 off the out-of-place calls).
//! * `numerics::round_once::all_reduce_coalesced::{f16,bf16}::ws3` — the tie sums through
//!   `all_reduce_coalesced` and `all_reduce_coalesced_` (a list of two tensors): a fusion buffer
//!   in another precision must round the same.
//! * `numerics::round_once::avg::{f16,bf16}::ws3` — `avg` whose exact average rounds differently
//!   from the rounded sum divided and rounded again.
//! * `numerics::round_once::large::bf16::ws2` — 2 MiB of bf16 (the smallest bf16 all_reduce vLLM's
//!   QuickReduce takes at two ranks) whose exact sums, rounded once, differ from the values
//!   converted to f16, added there and rounded back (vllm-project/vllm #55345): beyond f16's
//!   range, below its subnormals, and a sum f16 rounds onto a bf16 tie.

use super::util::{expect_eq, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use concord_core::{Backend, DType, OpKind, ReduceOp, Rounding, Tensor, Variant};
use concord_oracle::{Collective, Semantics};

fn meta(dtype: DType, reduce: &str) -> CaseMeta {
    meta_op("all_reduce", dtype, reduce)
}
fn meta_op(op: &str, dtype: DType, reduce: &str) -> CaseMeta {
    CaseMeta { suite: "numerics".into(), op: op.into(), variant: "out".into(), dtype: dtype.to_string(), reduce: reduce.into() }
}

/// all_reduce(op) of `per_rank[r]` (f64 values, exact in `dtype`), checked bit-exactly against
/// the oracle. `label` goes into the failure message.
fn check<B: Backend>(ctx: &Ctx<'_, B>, dtype: DType, op: ReduceOp, per_rank: &[Vec<f64>], label: &str) -> CaseResult {
    check_op(ctx, Via::AllReduce, dtype, op, per_rank, label)
}

/// The reducing call a numerics check goes through.
#[derive(Clone, Copy)]
enum Via {
    AllReduce,
    AllReduceInPlace,
    /// Each rank's values repeated world-size times, so every rank's chunk holds the same columns.
    ReduceScatter,
    /// [`Via::ReduceScatter`] through `reduce_scatter_tensor_out` (the caller's output buffer).
    ReduceScatterOut,
    /// [`Via::ReduceScatter`] through `reduce_scatter_tensor_coalesced` (a list of one tensor).
    ReduceScatterCoalesced,
    /// Rooted at the last rank; checked there.
    Reduce,
    /// `all_reduce_coalesced` of a list of one tensor (a fusion buffer's kernel).
    AllReduceCoalesced,
    /// [`Via::AllReduceCoalesced`] in place (`all_reduce_coalesced_`).
    AllReduceCoalescedInPlace,
}

impl Via {
    /// The name in case ids (`numerics::subnormal::<name>::...`).
    fn name(self) -> &'static str {
        match self {
            Via::AllReduce => "all_reduce",
            Via::AllReduceInPlace => "all_reduce_inplace",
            Via::ReduceScatter => "reduce_scatter",
            Via::ReduceScatterOut => "reduce_scatter_out",
            Via::ReduceScatterCoalesced => "reduce_scatter_coalesced",
            Via::Reduce => "reduce",
            Via::AllReduceCoalesced => "all_reduce_coalesced",
            Via::AllReduceCoalescedInPlace => "all_reduce_coalesced_inplace",
        }
    }
}

/// The ops besides out-of-place all_reduce (other kernels: flush-to-zero or per-step rounding
/// there is not seen by the all_reduce cases; a `_out` variant may reduce through a scratch of
/// its own, a coalesced one through a fusion buffer of another dtype).
const OTHER_VIAS: [Via; 5] = [Via::AllReduceInPlace, Via::ReduceScatter, Via::ReduceScatterOut, Via::ReduceScatterCoalesced, Via::Reduce];

/// The coalesced all_reduce calls (review10 finding 5: a fusion-buffer kernel that flushes
/// subnormals or orders signed zeros its own way is not seen by the single-tensor calls): the
/// subnormal, premul_sum and two-rank NaN cases go through them too (their rounding ties run in
/// `numerics::round_once::all_reduce_coalesced`).
const COALESCED_VIAS: [Via; 2] = [Via::AllReduceCoalesced, Via::AllReduceCoalescedInPlace];

/// [`check`] through `via`.
fn check_op<B: Backend>(ctx: &Ctx<'_, B>, via: Via, dtype: DType, op: ReduceOp, per_rank: &[Vec<f64>], label: &str) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let root = ws - 1;
    let (kind, variant, name) = match via {
        Via::AllReduce => (OpKind::AllReduce, Variant::Out, "all_reduce"),
        Via::AllReduceInPlace => (OpKind::AllReduce, Variant::InPlace, "all_reduce_"),
        Via::ReduceScatter => (OpKind::ReduceScatterTensor, Variant::Out, "reduce_scatter_tensor"),
        Via::ReduceScatterOut => (OpKind::ReduceScatterTensor, Variant::OutBuf, "reduce_scatter_tensor_out"),
        Via::ReduceScatterCoalesced => (OpKind::ReduceScatterTensor, Variant::Coalesced, "reduce_scatter_tensor_coalesced"),
        Via::Reduce => (OpKind::Reduce, Variant::Out, "reduce"),
        Via::AllReduceCoalesced => (OpKind::AllReduce, Variant::Coalesced, "all_reduce_coalesced"),
        Via::AllReduceCoalescedInPlace => (OpKind::AllReduce, Variant::CoalescedInPlace, "all_reduce_coalesced_"),
    };
    let p = Params { reduce: Some(op), root, ..Default::default() };
    let coll = exec::collective(kind, &p, ws).ok_or_else(|| CaseEnd::Fail(format!("suite bug: {kind} moves no data")))?;
    b.capabilities().check(kind, Some(variant), Some(dtype), Some(op), ws).map_err(CaseEnd::Unsupported)?;
    let rows = if matches!(via, Via::ReduceScatter | Via::ReduceScatterOut | Via::ReduceScatterCoalesced) { ws } else { 1 };
    let n = per_rank[0].len() * rows;
    let inputs: Vec<Tensor> = per_rank.iter().map(|v| Tensor::from_f64(dtype, &[n], &v.repeat(rows))).collect();
    let w = format!("{} reduce={op} {label}", here(b, name, variant.name(), dtype));
    let exp = concord_oracle::expected(&coll, &inputs, &Semantics::of(&b.capabilities()))
        .map_err(|e| CaseEnd::Fail(format!("{w}: suite bug: oracle: {e}")))?;
    let x = b.upload(&inputs[b.rank()])?;
    let out_buf = match via {
        Via::ReduceScatterOut => Some(b.alloc(dtype, &[per_rank[0].len()])?),
        _ => None,
    };
    let out = exec::call(b, kind, variant, std::slice::from_ref(&x), out_buf.as_ref(), &p, ctx.timeout)?.remove(0);
    if matches!(via, Via::Reduce) && b.rank() != root {
        return Ok(());
    }
    expect_eq(b, &out, &exp.outputs[b.rank()], &w)
}

/// all_reduce_coalesced (in place with `in_place`) of a list of two tensors, `per_rank[r]` and its
/// reverse, checked bit-exactly against the oracle.
fn check_coalesced<B: Backend>(ctx: &Ctx<'_, B>, in_place: bool, dtype: DType, per_rank: &[Vec<f64>], label: &str) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let variant = if in_place { Variant::CoalescedInPlace } else { Variant::Coalesced };
    let op = ReduceOp::Sum;
    b.capabilities().check(OpKind::AllReduce, Some(variant), Some(dtype), Some(op), ws).map_err(CaseEnd::Unsupported)?;
    let lists: Vec<Vec<Tensor>> = per_rank
        .iter()
        .map(|v| {
            let rev: Vec<f64> = v.iter().rev().copied().collect();
            vec![Tensor::from_f64(dtype, &[v.len()], v), Tensor::from_f64(dtype, &[rev.len()], &rev)]
        })
        .collect();
    let name = if in_place { "all_reduce_coalesced_" } else { "all_reduce_coalesced" };
    let w = format!("{} reduce={op} {label}", here(b, name, variant.name(), dtype));
    let sem = Semantics::of(&b.capabilities());
    let ins: Vec<B::Buffer> = lists[me].iter().map(|t| b.upload(t)).collect::<Result<_, _>>()?;
    let p = Params { reduce: Some(op), ..Default::default() };
    let outs = exec::call(b, OpKind::AllReduce, variant, &ins, None, &p, ctx.timeout)?;
    for (t, out) in outs.iter().enumerate() {
        let all: Vec<Tensor> = lists.iter().map(|l| l[t].clone()).collect();
        let exp = concord_oracle::expected(&Collective::AllReduce { op }, &all, &sem)
            .map_err(|e| CaseEnd::Fail(format!("{w}: suite bug: oracle: {e}")))?;
        expect_eq(b, out, &exp.outputs[me], &format!("{w} tensor {t} of {}", outs.len()))?;
    }
    Ok(())
}

/// Three ranks' values (rows: ranks) whose exact average rounds differently from the sum rounded
/// to `dtype`, then divided by 3 and rounded again (most columns; one column per element).
fn avg_columns(dtype: DType) -> Vec<Vec<f64>> {
    let (m, _, _) = layout(dtype);
    let u = p2(-m); // ulp of [1, 2)
    let cols: [[f64; 3]; 6] = [
        [1.0, 1.0 + 2.0 * u, 1.0 + 3.0 * u],
        [1.0, 1.0, 1.5 * u],
        [1.0, 1.0 + 3.0 * u, 1.5 * u],
        [1.0, 1.5 * u, 0.75 * u],
        [-1.0, -1.0, -1.5 * u],
        [2.0, 1.0 + u, 0.5 * u],
    ];
    (0..3).map(|r| cols.iter().map(|c| c[r]).collect()).collect()
}

fn exact_rounding<B: Backend>(b: &B) -> Result<(), CaseEnd> {
    match b.capabilities().rounding {
        Rounding::ExactThenRound => Ok(()),
        r => Err(CaseEnd::Unsupported(format!("declared rounding {r:?}: exact expectations need Rounding::ExactThenRound"))),
    }
}

/// premul_sum's inputs of three ranks: small integers (every product and sum exact).
fn premul_ints() -> Vec<Vec<f64>> {
    (0..3).map(|r| (0..16).map(|i| ((r * 5 + i * 3) % 17) as f64 - 8.0).collect()).collect()
}

fn p2(e: i32) -> f64 {
    2f64.powi(e)
}

/// (explicit mantissa bits, smallest subnormal, smallest normal)
fn layout(d: DType) -> (i32, f64, f64) {
    match d {
        DType::F16 => (10, p2(-24), p2(-14)),
        DType::BF16 => (7, p2(-133), p2(-126)),
        DType::F32 => (23, p2(-149), p2(-126)),
        _ => (52, f64::from_bits(1), f64::MIN_POSITIVE),
    }
}

/// Three ranks' values (rows: ranks) whose exact sums lie on, just above or just below a tie of
/// `dtype` (one column per element).
fn tie_columns(dtype: DType) -> Vec<Vec<f64>> {
    let (m, _, _) = layout(dtype);
    let ulp = p2(-m); // ulp of [1, 2)
    let half = ulp / 2.0;
    let low = p2(-24); // far below half an ulp, lost by a second rounding
                       // Columns: one element each; rows: ranks.
    let cols: [[f64; 3]; 9] = [
        [1.0, half, low],              // above the tie: 1 + ulp (f16: 0x3C01)
        [1.0, half, 0.0],              // on the tie, even below: 1.0
        [1.0 + ulp, half, 0.0],        // on the tie, even above: 1 + 2 ulp
        [1.0, half, -low],             // below the tie: 1.0
        [-1.0, -half, -low],           // negative, above the tie in magnitude
        [1.0 + ulp, half, -low],       // just below a tie that would go up
        [2.0, half, half],             // two halves of the ulp of 1 at 2: a tie at 2
        [1.0, half * 0.5, half * 0.5], // quarter + quarter = a tie
        [1.0, half, low],              // column 0 again, at index 8: past a vector of 8 halves (review19)
    ];
    (0..3).map(|r| cols.iter().map(|c| c[r]).collect()).collect()
}

/// The subnormal pairs of two ranks (rows: ranks): `t` the smallest subnormal, `mn` the smallest
/// normal.
fn subnormal_pairs(dtype: DType) -> Vec<Vec<f64>> {
    let (_, t, mn) = layout(dtype);
    let pairs: [[f64; 2]; 14] = [
        [t, t],          // subnormal + subnormal
        [3.0 * t, -t],   // subnormal difference
        [mn - t, t],     // largest subnormal + smallest: the smallest normal
        [mn, -t],        // normal - subnormal: largest subnormal
        [1.5 * mn, -mn], // normal - normal: a subnormal result
        [-t, t],         // +0
        [-t, -t],        // negative subnormal
        [t, 0.0],        // subnormal + zero
        [-0.0, t],       // -0 and a subnormal
        [t, 2.0 * t],    // min / max among subnormals
        [-t, -2.0 * t],  // negative ones
        [mn - t, mn],    // min / max across the subnormal / normal boundary
        [0.0, -0.0],     // signed zeros: min -0, max +0 (the declared -0 < +0), sum +0
        [-0.0, 0.0],     // ... whichever rank holds which
    ];
    (0..2).map(|r| pairs.iter().map(|p| p[r]).collect()).collect()
}

/// Two ranks' values (rows: ranks) whose `avg` and `premul_sum(0.5)` results are subnormal, exact
/// in every dtype whatever the declared rounding (every sum, product and halving is exact):
/// `mn/2`, `t`, `mn/2 - t`, `-mn/2`, `2t` and a normal `mn` (review10 finding 4: the scaling step
/// of avg / premul_sum run in a flush-to-zero kernel).
fn subnormal_scaled_pairs(dtype: DType) -> Vec<Vec<f64>> {
    let (_, t, mn) = layout(dtype);
    let pairs: [[f64; 2]; 6] = [[mn, 0.0], [2.0 * t, 0.0], [mn, -2.0 * t], [-mn, 0.0], [3.0 * t, t], [mn, mn]];
    (0..2).map(|r| pairs.iter().map(|p| p[r]).collect()).collect()
}

/// The subnormal checks of two ranks through `via`: sum / min / max of [`subnormal_pairs`], then
/// avg and premul_sum(0.5) of [`subnormal_scaled_pairs`] (each skipped where the backend declares
/// that reduce op unsupported on the call: sum / min / max decide the case).
fn check_subnormal<B: Backend>(ctx: &Ctx<'_, B>, via: Via, dtype: DType) -> CaseResult {
    for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
        check_op(ctx, via, dtype, op, &subnormal_pairs(dtype), "input=subnormal")?;
    }
    for op in [ReduceOp::Avg, ReduceOp::PremulSum(0.5)] {
        match check_op(ctx, via, dtype, op, &subnormal_scaled_pairs(dtype), "input=subnormal_after_scaling") {
            Err(CaseEnd::Unsupported(_)) => {}
            r => r?,
        }
    }
    Ok(())
}

/// f64 `premul_sum(1/3)` of inputs equal across `ws` ranks (every order of the sum gives the same
/// bits), then `premul_sum(0.5)` and `(3.0)` of inputs equal across ranks that need more than
/// f32's precision (`x = ±(1 + 2^-40)·2^k`): every sum, product and order is exact in f64, so the
/// result is bit-exact whether a backend scales the sum or each term (as NCCL's pre-multiplied
/// sum does). A scale applied in f32 (review10 finding 7: `((sum as f32) * (s as f32)) as f64`)
/// loses the 2^-40. (An `avg` of such inputs at 3 ranks is not exact when each term is scaled by
/// a rounded 1/3, so the scale is checked through premul_sum only.)
fn check_f64_scales<B: Backend>(ctx: &Ctx<'_, B>, via: Via) -> CaseResult {
    let ws = ctx.b.world_size();
    let same: Vec<Vec<f64>> = (0..ws).map(|_| (0..16).map(|i| (if i % 2 == 0 { 1.0 } else { -1.0 }) * p2(i - 8)).collect()).collect();
    check_op(ctx, via, DType::F64, ReduceOp::PremulSum(1.0 / 3.0), &same, "factor=1/3 input=equal_across_ranks")?;
    let fine: Vec<Vec<f64>> =
        (0..ws).map(|_| (0..16).map(|i| (if i % 3 == 0 { -1.0 } else { 1.0 }) * (1.0 + p2(-40)) * p2(i - 8)).collect()).collect();
    for f in [0.5, 3.0] {
        check_op(ctx, via, DType::F64, ReduceOp::PremulSum(f), &fine, &format!("factor={f} input=equal_across_ranks_beyond_f32"))?;
    }
    Ok(())
}

/// NaN against numbers, infinities, a signed zero and NaN, then two numbers (rows: two ranks):
/// min / max through each call must apply the declared [`concord_core::NanPolicy`] (the oracle's
/// expectation), as the out-of-place all_reduce does (`caps::nan_minmax`).
fn nan_pairs() -> Vec<Vec<f64>> {
    let pairs: [[f64; 2]; 8] = [
        [f64::NAN, 1.0],
        [1.0, f64::NAN],
        [f64::NAN, f64::NAN],
        [f64::NAN, f64::NEG_INFINITY],
        [f64::INFINITY, f64::NAN],
        [-0.0, f64::NAN],
        [f64::NAN, -2.0],
        [2.0, 3.0],
    ];
    (0..2).map(|r| pairs.iter().map(|p| p[r]).collect()).collect()
}

/// [`tie_columns`] on `ws` ranks: each column's three values on the ranks of every ordered triple
/// of distinct positions among the first two, the middle and the last rank, every other rank 0
/// (rows: ranks). A reduction that rounds a partial sum of some ranks (a node group, a tree
/// level, a ring step) holds two of the values in one partial and the third outside it for some
/// triple, whatever its grouping.
fn spread_tie_columns(dtype: DType, ws: usize) -> Vec<Vec<f64>> {
    let cols = tie_columns(dtype);
    let triples: Vec<[f64; 3]> = (0..cols[0].len()).map(|i| [cols[0][i], cols[1][i], cols[2][i]]).collect();
    let mut pos = vec![0, 1, ws / 2, ws - 1];
    pos.sort_unstable();
    pos.dedup();
    let mut rows = vec![Vec::new(); ws];
    for &a in &pos {
        for &b in &pos {
            for &c in &pos {
                if a == b || b == c || a == c {
                    continue;
                }
                for t in &triples {
                    for (r, row) in rows.iter_mut().enumerate() {
                        let v = [(a, 0), (b, 1), (c, 2)].iter().find(|(p, _)| *p == r).map_or(0.0, |&(_, k)| t[k]);
                        row.push(v);
                    }
                }
            }
        }
    }
    rows
}

/// Elements of the long tie case: past 4 Ki, the tie columns over and over (a vector path, a
/// kernel block or a size switch is taken only past the numerics cases' 9 columns).
const LONG_TIES: usize = 4104;

/// [`tie_columns`] repeated to [`LONG_TIES`] elements (rows: ranks).
fn long_tie_columns(dtype: DType) -> Vec<Vec<f64>> {
    tie_columns(dtype).into_iter().map(|row| row.iter().copied().cycle().take(LONG_TIES).collect()).collect()
}

/// The largest finite value of a half-precision dtype.
fn max_finite(d: DType) -> f64 {
    match d {
        DType::F16 => 65504.0,
        _ => (2.0 - p2(-7)) * p2(127),
    }
}

/// `ws` ranks' values near the largest finite value of `dtype` (rows: ranks): the exact average
/// is finite, the sum is not (every rank at the max, at minus the max, at half of it).
fn near_max_columns(dtype: DType, ws: usize) -> Vec<Vec<f64>> {
    let m = max_finite(dtype);
    (0..ws).map(|r| vec![m, -m, if r % 2 == 0 { m } else { m / 2.0 }, m / 2.0, if r == 0 { m } else { 0.0 }, 3.0]).collect()
}

/// Whether rounding the sum to `dtype` before the final step `f` (divide, scale) changes some
/// column's result: the suite's self-check that a case tells the two roundings apart.
fn rounding_the_sum_first_shows(dtype: DType, per_rank: &[Vec<f64>], f: impl Fn(f64) -> f64) -> bool {
    let round = |v: f64| {
        let bits = concord_oracle::round_f64_bits(dtype, v).to_le_bytes();
        Tensor::from_bytes(dtype, &[1], &bits[..dtype.size()]).get_f64(0)
    };
    (0..per_rank[0].len()).any(|i| {
        let s: f64 = per_rank.iter().map(|c| c[i]).sum();
        let (once, twice) = (round(f(s)), round(f(round(s))));
        once != twice && !(once.is_nan() && twice.is_nan())
    })
}

/// [`nan_pairs`] on three ranks (rows: ranks): each pair on ranks (0, 1), (1, 2) and (2, 0), the
/// third rank 2.5, so that NaN meets a number on every rank position of a ring or a tree.
fn nan_triples() -> Vec<Vec<f64>> {
    let pairs = nan_pairs();
    let mut rows = vec![Vec::new(); 3];
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        for (&x, &y) in pairs[0].iter().zip(&pairs[1]) {
            for (r, row) in rows.iter_mut().enumerate() {
                row.push(if r == a {
                    x
                } else if r == b {
                    y
                } else {
                    2.5
                });
            }
        }
    }
    rows
}

/// Bytes of the large bf16 case: 2 MiB, the smallest bf16 all_reduce vLLM's QuickReduce takes
/// at two ranks (`_QR_MIN_SIZE[(bfloat16, 2)]`, its FP codec).
const LARGE_BF16_BYTES: usize = 2 << 20;

/// Two ranks' bf16 values (rows: ranks), one period of the large bf16 case, whose exact sums
/// rounded once to bf16 differ from the sums of the values converted to f16, added in f16 and
/// rounded back to bf16 (vllm-project/vllm #55345: QuickReduce's bf16 path): above a bf16 tie by
/// less than f16 keeps, beyond f16's range, below its subnormals; then a tie and an exact sum.
fn through_f16_columns() -> Vec<Vec<f64>> {
    let above_tie = p2(-8) + p2(-14); // bf16 half ulp of 1, plus less than f16's half ulp
    let cols: [[f64; 2]; 6] = [
        [1.0, above_tie],   // 1 + 2^-7 once; f16 rounds 1 + 2^-8 + 2^-14 onto the tie: 1.0
        [-1.0, -above_tie], // negative
        [p2(17), p2(16)],   // beyond f16's largest finite: inf through f16
        [p2(-30), p2(-30)], // below f16's smallest subnormal: 0 through f16
        [1.0, p2(-8)],      // on the tie: 1.0 both ways
        [3.0, 1.0],         // exact
    ];
    (0..2).map(|r| cols.iter().map(|c| c[r]).collect()).collect()
}

/// Whether some column of two ranks' bf16 values sums, rounded once, to another bf16 than
/// through f16 (each value converted, added in f16, rounded back): the suite's self-check.
fn through_f16_shows(per_rank: &[Vec<f64>]) -> bool {
    use concord_core::half::{bf16, f16};
    (0..per_rank[0].len()).any(|i| {
        let once = bf16::from_f64(per_rank.iter().map(|c| c[i]).sum::<f64>());
        let h = per_rank.iter().map(|c| f16::from_f64(c[i]).to_f64()).fold(0.0, |a, v| f16::from_f64(a + v).to_f64());
        once.to_bits() != bf16::from_f64(h).to_bits()
    })
}

/// `t` repeated to `n` elements (a whole number of periods), as one flat tensor.
fn tiled(t: &Tensor, n: usize) -> Tensor {
    let reps = n / t.numel();
    Tensor::from_bytes(t.dtype(), &[reps * t.numel()], &t.bytes().repeat(reps))
}

/// The out-of-place all_reduce(`op`) of `period[r]` repeated to at least `bytes` bytes on rank
/// `r`, checked bit-exactly against the oracle's result for one period, repeated the same way
/// (an elementwise reduction of periodic inputs is periodic): a large case whose inputs and
/// expectation cost a copy, not a conversion or an oracle pass per element.
fn check_tiled<B: Backend>(ctx: &Ctx<'_, B>, dtype: DType, op: ReduceOp, period: &[Vec<f64>], bytes: usize, label: &str) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let variant = Variant::Out;
    b.capabilities().check(OpKind::AllReduce, Some(variant), Some(dtype), Some(op), ws).map_err(CaseEnd::Unsupported)?;
    let m = period[0].len();
    let n = bytes.div_ceil(m * dtype.size()) * m;
    let w = format!("{} reduce={op} {label} n={n}", here(b, "all_reduce", variant.name(), dtype));
    let inputs: Vec<Tensor> = period.iter().map(|v| Tensor::from_f64(dtype, &[m], v)).collect();
    let exp = concord_oracle::expected(&Collective::AllReduce { op }, &inputs, &Semantics::of(&b.capabilities()))
        .map_err(|e| CaseEnd::Fail(format!("{w}: suite bug: oracle: {e}")))?;
    let x = b.upload(&tiled(&inputs[b.rank()], n))?;
    let p = Params { reduce: Some(op), ..Default::default() };
    let out = exec::call(b, OpKind::AllReduce, variant, std::slice::from_ref(&x), None, &p, ctx.timeout)?.remove(0);
    expect_eq(b, &out, &tiled(&exp.outputs[b.rank()], n), &w)
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        v.push(Case::<B>::new(format!("numerics::round_once::{dtype}::ws3"), meta(dtype, "sum"), 3, move |ctx| {
            exact_rounding(ctx.b)?;
            let per_rank = tie_columns(dtype);
            // Self-check of the suite: the oracle's first element is the documented one.
            let first = concord_oracle::expected(
                &Collective::AllReduce { op: ReduceOp::Sum },
                &per_rank.iter().map(|v| Tensor::from_f64(dtype, &[v.len()], v)).collect::<Vec<_>>(),
                &Semantics::of(&ctx.b.capabilities()),
            )
            .map_err(|e| CaseEnd::Fail(format!("suite bug: {e}")))?;
            let bits = u16::from_le_bytes([first.outputs[0].bytes()[0], first.outputs[0].bytes()[1]]);
            let want = if dtype == DType::F16 { 0x3C01 } else { 0x3F81 };
            if bits != want {
                return Err(CaseEnd::Fail(format!(
                    "suite bug: the oracle gives {bits:#06x} for 1 + half ulp + 2^-24, expected {want:#06x}"
                )));
            }
            check(ctx, dtype, ReduceOp::Sum, &per_rank, "input=round_to_nearest_even_ties")
        }));
    }
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        v.push(Case::<B>::new(format!("numerics::subnormal::{dtype}::ws2"), meta(dtype, "sum"), 2, move |ctx| {
            check_subnormal(ctx, Via::AllReduce, dtype)
        }));
    }
    for dtype in [DType::F16, DType::BF16] {
        v.push(Case::<B>::new(
            format!("numerics::round_once::all_reduce_coalesced::{dtype}::ws3"),
            meta_op("all_reduce", dtype, "sum"),
            3,
            move |ctx| {
                exact_rounding(ctx.b)?;
                for in_place in [false, true] {
                    check_coalesced(ctx, in_place, dtype, &tie_columns(dtype), "input=round_to_nearest_even_ties")?;
                }
                Ok(())
            },
        ));
        v.push(Case::<B>::new(format!("numerics::round_once::avg::{dtype}::ws3"), meta(dtype, "avg"), 3, move |ctx| {
            exact_rounding(ctx.b)?;
            let cols = avg_columns(dtype);
            // Self-check of the suite: rounding the sum first gives another result somewhere.
            let round = |v: f64| Tensor::from_f64(dtype, &[1], &[v]).get_f64(0);
            let differs = (0..cols[0].len()).any(|i| {
                let s: f64 = cols.iter().map(|c| c[i]).sum();
                round(s / 3.0) != round(round(s) / 3.0)
            });
            if !differs {
                return Err(CaseEnd::Fail(format!("suite bug: no {dtype} avg column tells one rounding from two")));
            }
            check(ctx, dtype, ReduceOp::Avg, &cols, "input=average_off_the_rounded_sum")
        }));
    }
    // Rounded once at world sizes past the 3 of the tie cases, past 4 Ki elements, near the
    // largest finite value (avg at powers of two), and for premul_sum's factor.
    for dtype in [DType::F16, DType::BF16] {
        // 16 ranks (review10 finding 3): node groups of 8 hold two of the three values at
        // positions {0, 1, 8, 15} in one group; at 8 ranks one group is the whole world.
        for ws in [4, 5, 8, 16] {
            v.push(Case::<B>::new(format!("numerics::round_once::spread::{dtype}::ws{ws}"), meta(dtype, "sum"), ws, move |ctx| {
                exact_rounding(ctx.b)?;
                let per_rank = spread_tie_columns(dtype, ctx.b.world_size());
                check(ctx, dtype, ReduceOp::Sum, &per_rank, "input=ties_spread_over_the_ranks")
            }));
        }
        v.push(Case::<B>::new(format!("numerics::round_once::long::{dtype}::ws3"), meta(dtype, "sum"), 3, move |ctx| {
            exact_rounding(ctx.b)?;
            check(ctx, dtype, ReduceOp::Sum, &long_tie_columns(dtype), &format!("input=ties_repeated n={LONG_TIES}"))
        }));
        for ws in [2, 4] {
            v.push(Case::<B>::new(format!("numerics::round_once::avg_near_max::{dtype}::ws{ws}"), meta(dtype, "avg"), ws, move |ctx| {
                exact_rounding(ctx.b)?;
                let ws = ctx.b.world_size();
                let cols = near_max_columns(dtype, ws);
                if !rounding_the_sum_first_shows(dtype, &cols, |s| s / ws as f64) {
                    return Err(CaseEnd::Fail(format!("suite bug: no {dtype} column overflows a sum rounded first")));
                }
                // The sums of the same columns overflow to inf (rounded once; review19: a store
                // that saturates a finite overflow to the largest finite value passes avg).
                check(ctx, dtype, ReduceOp::Sum, &cols, "input=near_the_largest_finite_sum_overflows")?;
                check(ctx, dtype, ReduceOp::Avg, &cols, "input=near_the_largest_finite")
            }));
        }
        v.push(Case::<B>::new(format!("numerics::round_once::premul_sum::{dtype}::ws3"), meta(dtype, "premul_sum"), 3, move |ctx| {
            exact_rounding(ctx.b)?;
            let cols = tie_columns(dtype);
            for f in [3.0, 0.75] {
                if !rounding_the_sum_first_shows(dtype, &cols, |s| s * f) {
                    return Err(CaseEnd::Fail(format!("suite bug: no {dtype} column tells premul_sum({f}) from a scaled rounded sum")));
                }
                check(ctx, dtype, ReduceOp::PremulSum(f), &cols, &format!("factor={f} input=round_to_nearest_even_ties"))?;
            }
            Ok(())
        }));
    }
    // The same expectations through the other reducing calls.
    for via in OTHER_VIAS {
        let name = via.name();
        // The spread ties past 3 ranks (`numerics::round_once::spread::reduce::f16::ws4`): a
        // rooted reduce's tree that sends a subtree's partial in the dtype (hunt15's
        // `reduce_tree_partials_in_dtype`) rounds it there, which the out-of-place all_reduce
        // of the spread cases never reaches.
        for dtype in [DType::F16, DType::BF16] {
            for ws in [4, 5] {
                let m = meta_op(name, dtype, "sum");
                v.push(Case::<B>::new(format!("numerics::round_once::spread::{name}::{dtype}::ws{ws}"), m, ws, move |ctx| {
                    exact_rounding(ctx.b)?;
                    let per_rank = spread_tie_columns(dtype, ctx.b.world_size());
                    check_op(ctx, via, dtype, ReduceOp::Sum, &per_rank, "input=ties_spread_over_the_ranks")
                }));
            }
        }
        for dtype in [DType::F16, DType::BF16] {
            let m = meta_op(name, dtype, "sum");
            v.push(Case::<B>::new(format!("numerics::round_once::{name}::{dtype}::ws3"), m, 3, move |ctx| {
                exact_rounding(ctx.b)?;
                check_op(ctx, via, dtype, ReduceOp::Sum, &tie_columns(dtype), "input=round_to_nearest_even_ties")
            }));
        }
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let m = meta_op(name, dtype, "sum");
            v.push(Case::<B>::new(format!("numerics::subnormal::{name}::{dtype}::ws2"), m, 2, move |ctx| check_subnormal(ctx, via, dtype)));
        }
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let m = meta_op(name, dtype, "premul_sum");
            v.push(Case::<B>::new(format!("numerics::premul_sum::{name}::{dtype}::ws3"), m, 3, move |ctx| {
                for f in [0.5, 3.0] {
                    check_op(ctx, via, dtype, ReduceOp::PremulSum(f), &premul_ints(), &format!("factor={f} input=integers"))?;
                }
                if dtype == DType::F64 {
                    check_f64_scales(ctx, via)?;
                }
                Ok(())
            }));
        }
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let m = meta_op(name, dtype, "min,max");
            v.push(Case::<B>::new(format!("numerics::nan_minmax::{name}::{dtype}::ws2"), m, 2, move |ctx| {
                for op in [ReduceOp::Min, ReduceOp::Max] {
                    check_op(ctx, via, dtype, op, &nan_pairs(), "input=nan")?;
                }
                Ok(())
            }));
            // On three ranks (a ring or a tree, not a pairwise exchange), NaN on every position.
            let m = meta_op(name, dtype, "min,max");
            v.push(Case::<B>::new(format!("numerics::nan_minmax::{name}::{dtype}::ws3"), m, 3, move |ctx| {
                for op in [ReduceOp::Min, ReduceOp::Max] {
                    check_op(ctx, via, dtype, op, &nan_triples(), "input=nan_on_every_rank_position")?;
                }
                Ok(())
            }));
        }
    }
    // The subnormal, premul_sum and two-rank NaN expectations through the coalesced all_reduce.
    for via in COALESCED_VIAS {
        let name = via.name();
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let m = meta_op(name, dtype, "sum,min,max,avg,premul_sum");
            v.push(Case::<B>::new(format!("numerics::subnormal::{name}::{dtype}::ws2"), m, 2, move |ctx| check_subnormal(ctx, via, dtype)));
            let m = meta_op(name, dtype, "premul_sum");
            v.push(Case::<B>::new(format!("numerics::premul_sum::{name}::{dtype}::ws3"), m, 3, move |ctx| {
                for f in [0.5, 3.0] {
                    check_op(ctx, via, dtype, ReduceOp::PremulSum(f), &premul_ints(), &format!("factor={f} input=integers"))?;
                }
                if dtype == DType::F64 {
                    check_f64_scales(ctx, via)?;
                }
                Ok(())
            }));
            let m = meta_op(name, dtype, "min,max");
            v.push(Case::<B>::new(format!("numerics::nan_minmax::{name}::{dtype}::ws2"), m, 2, move |ctx| {
                for op in [ReduceOp::Min, ReduceOp::Max] {
                    check_op(ctx, via, dtype, op, &nan_pairs(), "input=nan")?;
                }
                Ok(())
            }));
        }
    }
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        v.push(Case::<B>::new(format!("numerics::premul_sum::{dtype}::ws3"), meta(dtype, "premul_sum"), 3, move |ctx| {
            let ints = premul_ints();
            for f in [0.5, 3.0] {
                check(ctx, dtype, ReduceOp::PremulSum(f), &ints, &format!("factor={f} input=integers"))?;
            }
            let third = 1.0 / 3.0;
            match dtype {
                DType::F64 => check_f64_scales(ctx, Via::AllReduce),
                DType::F16 | DType::BF16 if ctx.b.capabilities().rounding == Rounding::ExactThenRound => {
                    check(ctx, dtype, ReduceOp::PremulSum(third), &ints, "factor=1/3 input=integers")
                }
                _ => Ok(()),
            }
        }));
    }
    // 2 MiB of bf16 at two ranks: a size-selected path (vLLM's QuickReduce) that converts bf16
    // to f16, sums there and converts back.
    v.push(Case::<B>::new("numerics::round_once::large::bf16::ws2".to_string(), meta(DType::BF16, "sum"), 2, move |ctx| {
        exact_rounding(ctx.b)?;
        let period = through_f16_columns();
        if !through_f16_shows(&period) {
            return Err(CaseEnd::Fail("suite bug: no bf16 column tells a sum through f16 from the exact one".into()));
        }
        check_tiled(ctx, DType::BF16, ReduceOp::Sum, &period, LARGE_BF16_BYTES, "input=beyond_f16_and_f16_ties_repeated")
    }));
    v
}
