//! The functional matrix: every (op, variant) of the trait × every dtype × every reduce op defined
//! for it × world sizes 1, 2, 3, 4, 5, 8, over the whole shape catalogue, with exact-by-construction
//! inputs; plus seeded random inputs (checked with a bound) and NaN / inf / ±0 inputs for floats.
//!
//! World sizes 6, 7 and 16 ([`super::SPARSE_WORLD_SIZES`]) run a sparser slice, to keep the run
//! time in check (a world of 16 processes per case group): exact inputs only, dtypes f32, i32 and
//! bf16 (at 16: f32, and bf16 `sum` through the out-of-place reducing ops) plus the f64 out-of-place
//! all_reduce `sum` (at 6 and 7), every (op, variant)
//! and every reduce op defined for the dtype, the first [`SPARSE_SHAPES`] shapes of the catalogue
//! ([`sparse_specs`]). Same case names as the full matrix (`all_reduce::out::f32::sum::ws6`).
//! The dtypes that slice leaves out run once per (op, variant) at those world sizes
//! ([`dtype_grid_cases`], `all_reduce::out::dtypes::ws6`).
//!
//! At world size 8 ([`THINNED_WS`]) the exact inputs run in f32 only (with the barrier and the f64
//! all_reduce `sum` probe), over the whole shape catalogue; the other eleven dtypes run once per
//! (op, variant) in the dtype grid (`all_reduce::out::dtypes::ws8`), and the random and special
//! inputs in every float dtype as at the other world sizes. Every reduce op in those dtypes runs
//! at 1–5 ranks (a power of two and four others; i32 and bf16 at 6 and 7 too): the 8-rank copy of
//! each (633 cases, then i32's and bf16's 132) repeated those inputs and checks at a larger world,
//! for about 2 s and then 1 s of the main job's CPU, and no mutant of the catalogue needed it
//! (docs/RESULTS.md, helpers main11 and main14).

use super::{SPARSE_WORLD_SIZES, WORLD_SIZES};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::PAIRS;
use crate::values::{self, Extra, ValueSpec};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_fixtures::InputKind;

/// Name of a value case (without backend prefix).
pub fn case_name(spec: &ValueSpec, ws: usize) -> String {
    let mut n = format!("{}::{}::{}", spec.op, spec.variant, spec.dtype);
    if let Some(r) = spec.reduce {
        n.push_str("::");
        n.push_str(r.name());
    }
    n.push_str(&format!("::ws{ws}"));
    match spec.kind {
        InputKind::Exact => {}
        InputKind::Random => n.push_str("::random"),
        InputKind::Special => n.push_str("::special"),
    }
    n
}

pub fn meta(suite: &str, spec: &ValueSpec) -> CaseMeta {
    CaseMeta {
        suite: suite.into(),
        op: spec.op.name().into(),
        variant: spec.variant.name().into(),
        dtype: spec.dtype.name().into(),
        reduce: spec.reduce.map(|r| r.name().to_string()).unwrap_or_default(),
    }
}

/// The value case for `spec` at world size `ws`.
pub fn value_case<B: Backend>(spec: ValueSpec, ws: usize) -> Case<B> {
    let name = case_name(&spec, ws);
    let m = meta("matrix", &spec);
    let seed = concord_fixtures::seed_for(&name);
    Case::new(name, m, ws, move |ctx| values::run(ctx.b, &spec, seed, ctx.timeout, ""))
}

/// Shapes per case: the whole catalogue for the main dtypes, the first few for the rest.
fn max_shapes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F32 | DType::I32 | DType::BF16 | DType::F16 => None,
        _ => Some(5),
    }
}

/// Every exact-input spec: (op, variant) × dtype × reduce op defined for it.
pub fn exact_specs() -> Vec<ValueSpec> {
    let mut out = Vec::new();
    for &(op, variant) in PAIRS {
        let dtypes: &[DType] = if op == OpKind::Barrier { &[DType::U8] } else { &DType::ALL };
        for &dtype in dtypes {
            let reduces: Vec<Option<ReduceOp>> =
                if op.reduces() { ReduceOp::ALL.into_iter().filter(|r| r.defined_for(dtype)).map(Some).collect() } else { vec![None] };
            for reduce in reduces {
                out.push(ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: max_shapes(dtype) });
            }
        }
    }
    out
}

/// Random and special-value specs for floats (random: sum and avg through the out-of-place
/// reducing ops, min and max through all_reduce).
pub fn float_extra_specs() -> Vec<ValueSpec> {
    let floats = [DType::F16, DType::BF16, DType::F32, DType::F64];
    let mut out = Vec::new();
    for dtype in floats {
        for (op, variant) in
            [(OpKind::AllReduce, Variant::Out), (OpKind::ReduceScatterTensor, Variant::Out), (OpKind::Reduce, Variant::Out)]
        {
            for r in [ReduceOp::Sum, ReduceOp::Avg] {
                out.push(ValueSpec { op, variant, dtype, reduce: Some(r), kind: InputKind::Random, max_shapes: None });
            }
        }
        // min / max of random values (exact: a selection): the exact inputs are integers, which
        // survive a min / max kernel of a narrower float (f64 through f32); these do not.
        for r in [ReduceOp::Min, ReduceOp::Max] {
            out.push(ValueSpec {
                op: OpKind::AllReduce,
                variant: Variant::Out,
                dtype,
                reduce: Some(r),
                kind: InputKind::Random,
                max_shapes: None,
            });
        }
        // The scaled reductions too: a kernel that converts its scaled result with saturation
        // turns ±inf into the largest finite value (a review found no case fed them NaN / ±inf).
        for r in [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg, ReduceOp::PremulSum(2.0)] {
            out.push(ValueSpec {
                op: OpKind::AllReduce,
                variant: Variant::Out,
                dtype,
                reduce: Some(r),
                kind: InputKind::Special,
                max_shapes: None,
            });
        }
    }
    out
}

/// Shapes per case at the sparse world sizes: one element, a prime, 0-dim, empty, 2x3x5, 3.
pub const SPARSE_SHAPES: usize = 6;

/// The 8-byte probe of the sparse slice: the out-of-place f64 all_reduce `sum` (a reduction
/// that folds a non-power-of-two world's excess ranks in may be written for 4-byte elements).
fn wide_sum(s: &ValueSpec) -> bool {
    s.dtype == DType::F64 && s.op == OpKind::AllReduce && s.variant == Variant::Out && s.reduce == Some(ReduceOp::Sum)
}

/// The slice of [`exact_specs`] run at [`SPARSE_WORLD_SIZES`].
pub fn sparse_specs() -> Vec<ValueSpec> {
    exact_specs()
        .into_iter()
        .filter(|s| matches!(s.dtype, DType::F32 | DType::I32 | DType::BF16) || s.op == OpKind::Barrier || wide_sum(s))
        .map(|s| ValueSpec { max_shapes: Some(SPARSE_SHAPES), ..s })
        .collect()
}

/// The world size of [`WORLD_SIZES`] whose exact-input cases keep only the sparse slice's dtypes
/// ([`thinned_out`]); the dtype grid ([`dtype_grid_cases`]) runs the others there.
pub const THINNED_WS: usize = 8;

/// Whether the exact-input `spec` is left out at world size `ws` (see [`THINNED_WS`]): a dtype
/// outside the sparse slice, not the barrier, not the f64 probe ([`wide_sum`]).
fn thinned_out(spec: &ValueSpec, ws: usize) -> bool {
    ws == THINNED_WS && spec.kind == InputKind::Exact && spec.op != OpKind::Barrier && !wide_sum(spec) && !in_sparse_slice(spec.dtype, ws)
}

/// World sizes of the dtype grid ([`dtype_grid_cases`]): the sparse ones and [`THINNED_WS`].
pub const DTYPE_GRID_WORLD_SIZES: [usize; 4] = [SPARSE_WORLD_SIZES[0], SPARSE_WORLD_SIZES[1], THINNED_WS, SPARSE_WORLD_SIZES[2]];

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for spec in exact_specs().into_iter().chain(float_extra_specs()) {
        for ws in WORLD_SIZES {
            if !thinned_out(&spec, ws) && crate::case::wanted_world_size(ws) {
                out.push(value_case(spec.clone(), ws));
            }
        }
    }
    for spec in sparse_specs() {
        for ws in SPARSE_WORLD_SIZES {
            // The largest world runs f32 (and the barrier), plus bf16 `sum` through the
            // out-of-place reducing ops: a half-precision path may stage a fixed number of ranks.
            let bf16_sum = spec.dtype == DType::BF16 && spec.variant == Variant::Out && spec.reduce == Some(ReduceOp::Sum);
            if ws > 8 && !matches!(spec.dtype, DType::F32) && spec.op != OpKind::Barrier && !bf16_sum {
                continue;
            }
            if !crate::case::wanted_world_size(ws) {
                continue;
            }
            out.push(value_case(spec.clone(), ws));
        }
    }
    out.extend(dtype_grid_cases());
    out.extend(permutation_cases());
    out.extend(long_cases());
    out.extend(large_cases());
    out.extend(review16_cases());
    out.extend(bits_cases());
    out.extend(mixed_dtype_cases());
    out.extend(many_tensor_cases());
    out
}

/// Whether the sparse slice runs every op in `dtype` at world size `ws` (see [`cases`]: f32, i32
/// and bf16 at 6 and 7; f32 in the exact matrix at [`THINNED_WS`] and at 16). Its few single-op
/// probes (f64 all_reduce `sum` at 6 and 7, bf16 `sum` at 16) do not count: the dtype grid covers
/// every other op in those dtypes. At [`THINNED_WS`] i32 and bf16 run in the dtype grid too: their
/// whole shape catalogue with every reduce op runs at 1–7 ranks, and the 8-rank copy (132 cases,
/// about 1 s of the main job's CPU) was caught no mutant first (helper main14).
fn in_sparse_slice(dtype: DType, ws: usize) -> bool {
    matches!(dtype, DType::F32) || (ws < THINNED_WS && matches!(dtype, DType::I32 | DType::BF16))
}

/// The dtypes the sparse slice leaves out, at the sparse world sizes and [`THINNED_WS`]: one case per (op, variant)
/// and world size, `{op}::{variant}::dtypes::ws{ws}`, calling the op once in every such dtype
/// (exact inputs, the catalogue's first two shapes: one element and a prime; for the reducing
/// ops `sum` on the first and [`grid_second_op`] on the second). The corruption sweep's dtype grid (`cargo xtask mutants --dtype all`) found
/// every op's output in those dtypes unchecked at 6, 7 and 16 ranks: a dtype's kernel taken only
/// on a path those worlds take (a non-power-of-two world's fold-in, a tree above 8 ranks) went
/// unseen.
pub fn dtype_grid_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for &(op, variant) in PAIRS.iter().filter(|(op, _)| *op != OpKind::Barrier) {
        for ws in DTYPE_GRID_WORLD_SIZES {
            let name = format!("{}::{variant}::dtypes::ws{ws}", op.name());
            let m = CaseMeta {
                suite: "matrix".into(),
                op: op.name().into(),
                variant: variant.name().into(),
                dtype: "dtypes".into(),
                reduce: if op.reduces() { "sum".into() } else { String::new() },
            };
            let seed = concord_fixtures::seed_for(&name);
            out.push(Case::new(name, m, ws, move |ctx| {
                let dtypes = DType::ALL.into_iter().enumerate().filter(|(_, d)| !in_sparse_slice(*d, ws));
                each_dtype_with(ctx, op, variant, dtypes, seed, true)
            }));
        }
    }
    out
}

/// `op` / `variant` once in each of `dtypes`, in that order, on the communicator (exact inputs,
/// the catalogue's first two shapes: one element and a prime, the same in every dtype; `sum` for
/// the reducing ops; the inputs of `(i, dtype)` from `seed + i`). A dtype the backend declares
/// unsupported for the op is passed over; the case is unsupported only if every one is.
pub(crate) fn each_dtype<B: Backend>(
    ctx: &mut Ctx<'_, B>,
    op: OpKind,
    variant: Variant,
    dtypes: impl Iterator<Item = (usize, DType)>,
    seed: u64,
) -> CaseResult {
    each_dtype_with(ctx, op, variant, dtypes, seed, false)
}

/// The reduce op the dtype grid gives its second shape list in `dtype` (the `i`-th of
/// [`DType::ALL`]) at world size `ws`: every op but `sum` defined for the dtype (bitwise ones for
/// integers, premul_sum for floats), rotated by dtype and world size, so that the grid's worlds
/// of 6, 7, 8 and 16 ranks reduce each dtype with another op (review20: above 8 ranks no dtype but
/// f32 was ever reduced with anything but `sum`; a hierarchical integer avg, one node per 8 ranks,
/// passed the whole catalogue).
pub fn grid_second_op(i: usize, dtype: DType, ws: usize) -> ReduceOp {
    let ops: Vec<ReduceOp> = ReduceOp::ALL.into_iter().filter(|r| *r != ReduceOp::Sum && r.defined_for(dtype)).collect();
    ops[(i + ws) % ops.len()]
}

/// [`each_dtype`]; with `rotate`, a reducing op runs `sum` on the first shape list only and
/// [`grid_second_op`] on the others (the same calls, two reduce ops).
fn each_dtype_with<B: Backend>(
    ctx: &mut Ctx<'_, B>,
    op: OpKind,
    variant: Variant,
    dtypes: impl Iterator<Item = (usize, DType)>,
    seed: u64,
    rotate: bool,
) -> CaseResult {
    let mut unsupported = Vec::new();
    let mut ran = 0;
    let ws = ctx.world_size();
    for (i, dtype) in dtypes {
        let reduce = op.reduces().then_some(ReduceOp::Sum);
        let spec = ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: Some(2) };
        let r = if rotate && op.reduces() {
            let mut runs = values::shape_runs(&spec, ws);
            let rest = runs.split_off(1.min(runs.len()));
            let first = values::run_extra(
                ctx.b,
                &spec,
                seed.wrapping_add(i as u64),
                ctx.timeout,
                "",
                &Extra { runs: Some(runs), ..Extra::default() },
            );
            match first {
                Ok(()) if !rest.is_empty() => {
                    let second = ValueSpec { reduce: Some(grid_second_op(i, dtype, ws)), ..spec.clone() };
                    let extra = Extra { runs: Some(rest), ..Extra::default() };
                    match values::run_extra(ctx.b, &second, seed.wrapping_add(i as u64), ctx.timeout, "", &extra) {
                        // A reduce op the backend declares unsupported in this dtype: `sum` ran.
                        Err(CaseEnd::Unsupported(_)) => Ok(()),
                        other => other,
                    }
                }
                other => other,
            }
        } else {
            values::run(ctx.b, &spec, seed.wrapping_add(i as u64), ctx.timeout, "")
        };
        match r {
            Err(CaseEnd::Unsupported(why)) => unsupported.push(format!("{dtype}: {why}")),
            other => {
                other?;
                ran += 1;
            }
        }
    }
    if ran == 0 {
        return Err(CaseEnd::Unsupported(unsupported.join("; ")));
    }
    Ok(())
}

/// Rank `r`'s coalesced list of five dtypes for [`mixed_dtype_cases`] (tensor `t` of `lens[t]`
/// elements), and the sum of every rank's list: values that survive only in their own dtype (i64
/// and i32 beyond f32's 24 significant bits, f64 fractions below f32's resolution), each sum exact
/// in its dtype.
fn mixed_lists(ws: usize, lens: [usize; 5]) -> (Vec<Vec<Tensor>>, Vec<Tensor>) {
    let list = |r: usize| -> Vec<Tensor> {
        let bf16: Vec<f64> = (0..lens[3]).map(|i| (r + 1 + i) as f64).collect();
        vec![
            Tensor::from_vec(&[lens[0]], (0..lens[0]).map(|i| (r * 10 + i) as f32).collect()),
            Tensor::from_vec(&[lens[1]], (0..lens[1]).map(|i| (1i64 << 40) + 1 + (3 * r + i) as i64).collect()),
            Tensor::from_vec(&[lens[2]], (0..lens[2]).map(|i| 1.0 + (r + 1 + i) as f64 * (-40f64).exp2()).collect()),
            Tensor::from_f64(DType::BF16, &[lens[3]], &bf16),
            Tensor::from_vec(&[lens[4]], (0..lens[4]).map(|i| (1i32 << 28) + 1 + (7 * r + i) as i32).collect()),
        ]
    };
    let lists: Vec<Vec<Tensor>> = (0..ws).map(list).collect();
    // Every sum is exact in f64 (below 2^53) and in its dtype (no i32 wrap at 2 ranks).
    let sums = (0..lists[0].len())
        .map(|t| {
            let x = &lists[0][t];
            let s: Vec<f64> = (0..x.numel()).map(|i| lists.iter().map(|l| l[t].get_f64(i)).sum()).collect();
            Tensor::from_f64(x.dtype(), x.shape(), &s)
        })
        .collect();
    (lists, sums)
}

/// The coalesced ops of [`mixed_dtype_cases`]: (op, variant, tensor lengths). reduce_scatter's
/// lengths are even (world size 2 divides them).
const MIXED: [(OpKind, Variant, [usize; 5]); 4] = [
    (OpKind::AllReduce, Variant::Coalesced, [5, 4, 3, 2, 3]),
    (OpKind::AllReduce, Variant::CoalescedInPlace, [5, 4, 3, 2, 3]),
    (OpKind::AllGatherIntoTensor, Variant::Coalesced, [5, 4, 3, 2, 3]),
    (OpKind::ReduceScatterTensor, Variant::Coalesced, [6, 4, 2, 2, 4]),
];

/// The coalesced ops (all_reduce and `_`, all_gather_into_tensor, reduce_scatter_tensor) on one
/// list mixing f32, i64, f64, bf16 and i32 (`all_gather_into_tensor::coalesced::mixed_dtypes::ws2`):
/// each tensor is reduced / moved in its own dtype, as the single op would. The matrix's lists
/// hold one dtype each; a backend that flattens the list into one buffer of the first tensor's
/// dtype (pytorch/pytorch#1179, #35671) passes there.
pub fn mixed_dtype_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for (op, variant, lens) in MIXED {
        let reduce = op.reduces().then_some(ReduceOp::Sum);
        let name = format!("{}::{variant}::mixed_dtypes::ws2", op.name());
        let m = CaseMeta {
            suite: "matrix".into(),
            op: op.name().into(),
            variant: variant.to_string(),
            dtype: "mixed".into(),
            reduce: reduce.map(|r| r.name().to_string()).unwrap_or_default(),
        };
        out.push(Case::<B>::new(name, m, 2, move |ctx| {
            let b = ctx.b;
            let (ws, me) = (b.world_size(), b.rank());
            let (lists, sums) = mixed_lists(ws, lens);
            let caps = b.capabilities();
            for t in &sums {
                caps.check(op, Some(variant), Some(t.dtype()), reduce, ws).map_err(CaseEnd::Unsupported)?;
            }
            let expected: Vec<Tensor> = match op {
                OpKind::AllGatherIntoTensor => (0..sums.len())
                    .map(|t| Tensor::cat_rows(sums[t].dtype(), &[], &lists.iter().map(|l| l[t].clone()).collect::<Vec<_>>()))
                    .collect(),
                OpKind::ReduceScatterTensor => sums
                    .iter()
                    .map(|s| {
                        let k = s.numel() / ws;
                        s.slice_rows(me * k, k)
                    })
                    .collect(),
                _ => sums,
            };
            let w = format!(
                "{} reduce={} dtypes=[f32, i64, f64, bf16, i32]",
                super::util::here(b, op.name(), &variant.to_string(), DType::F32).replace("dtype=f32", "dtype=mixed"),
                reduce.map(|r| r.name()).unwrap_or("-")
            );
            let ins: Vec<B::Buffer> = lists[me].iter().map(|t| b.upload(t)).collect::<Result<_, _>>()?;
            let work = match (op, variant) {
                (OpKind::AllReduce, Variant::Coalesced) => b.all_reduce_coalesced(&ins, ReduceOp::Sum)?,
                (OpKind::AllReduce, _) => b.all_reduce_coalesced_(&ins, ReduceOp::Sum)?,
                (OpKind::AllGatherIntoTensor, _) => b.all_gather_into_tensor_coalesced(&ins)?,
                _ => b.reduce_scatter_tensor_coalesced(&ins, ReduceOp::Sum)?,
            };
            let outs = work.into_value(ctx.timeout).map_err(|e| super::util::fail(&w, format!("{e} [{}]", e.name())))?;
            if outs.len() != expected.len() {
                return Err(super::util::fail(&w, format!("returned {} results for {} inputs", outs.len(), expected.len())));
            }
            for (t, (o, exp)) in outs.iter().zip(&expected).enumerate() {
                let tag = format!("{w} tensor {t} of {} ({})", expected.len(), exp.dtype());
                if variant == Variant::CoalescedInPlace && b.buffer_addr(o) != b.buffer_addr(&ins[t]) {
                    return Err(super::util::fail(&tag, "in-place op returned a different buffer"));
                }
                super::util::expect_eq(b, o, exp, &tag)?;
            }
            Ok(())
        }));
    }
    out
}

/// Permutations other than the matrix's rotation `r -> r + 1`, by name: `reversed` (at odd
/// world sizes the middle rank maps to itself), `swap01` (ranks 0 and 1 trade, every other rank
/// maps to itself) and `pairs` (`r -> r ^ 1`; at odd world sizes the last rank maps to itself).
/// None of them is a cyclic shift at world size 3 and above, and each has fixed points somewhere.
pub fn permutations(ws: usize) -> Vec<(&'static str, Vec<usize>)> {
    let swap01 = (0..ws).map(|r| if r < 2 { 1 - r } else { r }).collect();
    let pairs = (0..ws).map(|r| if (r ^ 1) < ws { r ^ 1 } else { r }).collect();
    vec![("reversed", (0..ws).rev().collect()), ("swap01", swap01), ("pairs", pairs)]
}

/// permute_tensor with [`permutations`] at world sizes 3, 4 and 5, f32, every shape of the
/// catalogue (`permute_tensor::out::f32::ws4::perm_reversed`): a backend that runs every
/// permutation as a cyclic shift, or skips a rank's send to itself, fails here.
pub fn permutation_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    let spec = ValueSpec {
        op: OpKind::PermuteTensor,
        variant: Variant::Out,
        dtype: DType::F32,
        reduce: None,
        kind: InputKind::Exact,
        max_shapes: None,
    };
    for ws in [3, 4, 5] {
        for (perm, src_dst) in permutations(ws) {
            let name = format!("{}::perm_{perm}", case_name(&spec, ws));
            let seed = concord_fixtures::seed_for(&name);
            let spec = spec.clone();
            let label = format!("src_dst={src_dst:?}");
            let extra = Extra { src_dst: Some(src_dst), ..Extra::default() };
            out.push(Case::new(name, meta("matrix", &spec), ws, move |ctx| {
                values::run_extra(ctx.b, &spec, seed, ctx.timeout, &label, &extra)
            }));
        }
    }
    out
}

/// Tensors in a list of [`many_tensor_cases`].
const MANY: usize = 100;

/// Coalesced calls over a list of [`MANY`] tensors (`all_reduce::coalesced::f32::sum::ws3::list100`),
/// f32, world sizes 2 and 3: the matrix's lists hold the catalogue's 12 shapes, so a backend whose
/// call description, fusion table or message header has a fixed size (hunt15's
/// `desc_cut_at_header`: a 256-word header cuts the description of a 60-tensor list, and the
/// call fails on every rank) passes there. A DDP gradient bucket is such a list. The shapes cycle
/// through one element, odd, empty, 2-D and 0-dim tensors (dim 0 times the world size for
/// reduce_scatter).
pub fn many_tensor_cases<B: Backend>() -> Vec<Case<B>> {
    const BASE: [&[usize]; 6] = [&[1], &[3], &[0], &[2, 2], &[5], &[]];
    let mut out = Vec::new();
    let calls = [
        (OpKind::AllReduce, Variant::Coalesced, Some(ReduceOp::Sum)),
        (OpKind::AllReduce, Variant::CoalescedInPlace, Some(ReduceOp::Sum)),
        (OpKind::AllGatherIntoTensor, Variant::Coalesced, None),
        (OpKind::ReduceScatterTensor, Variant::Coalesced, Some(ReduceOp::Sum)),
    ];
    for (op, variant, reduce) in calls {
        for ws in [2, 3] {
            let spec = ValueSpec { op, variant, dtype: DType::F32, reduce, kind: InputKind::Exact, max_shapes: None };
            let name = format!("{}::list{MANY}", case_name(&spec, ws));
            let seed = concord_fixtures::seed_for(&name);
            let shapes: Vec<Vec<usize>> = (0..MANY)
                .map(|i| {
                    let s = BASE[i % BASE.len()];
                    if op == OpKind::ReduceScatterTensor {
                        concord_fixtures::divisible_by(s, ws)
                    } else {
                        s.to_vec()
                    }
                })
                .collect();
            let extra = Extra { runs: Some(vec![shapes]), ..Extra::default() };
            out.push(Case::new(name, meta("matrix", &spec), ws, move |ctx| {
                values::run_extra(ctx.b, &spec, seed, ctx.timeout, &format!("list of {MANY} tensors"), &extra)
            }));
        }
    }
    out
}

/// Dtypes whose matrix cases run only the first five shapes (30 elements at most).
const NARROW_SHAPES: [DType; 8] = [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32, DType::I64, DType::U64, DType::F64];

/// Element counts of the long cases: a word's and a vector's multiple, a prime past the
/// catalogue's, and 6151 (a prime past 2 x 2048 per rank at world sizes 2 and 3: a second kernel
/// block of a rank's work chunk, which the matrix's 1031 elements never reach).
const LONG: [usize; 3] = [64, 1031, 6151];

/// The 1- and 2-byte integer dtypes also run [`LONG`] and one size past 64 KiB (65537 elements):
/// a loop over fixed-size byte passes whose element count is written for another width goes
/// wrong only past one pass.
const LONG_NARROW_INT: [usize; 4] = [64, 1031, 6151, 65537];

/// all_reduce `sum` of [`LONG`] elements in the dtypes whose matrix cases stop at 30 elements,
/// and in f16 (`all_reduce::out::u8::sum::ws2::long`), plus `min` / `max` of the 1- and 2-byte
/// integers (`all_reduce::out::i8::max::ws2::long`) and of u32, i64 and u64, and `product` /
/// `avg` of the 1- and 2-byte integers (`all_reduce::out::u8::avg::ws2::long`), world sizes 2 and
/// 3: a dtype-specific vector path (several elements per word or register, a remainder loop, a
/// wide-lane compare, a signed lane compare for unsigned values, a saturating pack, a rounding
/// average instruction) and a rank's later kernel blocks are taken only there. Also u8 `sum` of
/// reduce_scatter, reduce and in-place all_reduce at world size 2, to 65537 elements.
pub fn long_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    let mut specs: Vec<(DType, ReduceOp)> = NARROW_SHAPES.iter().chain([&DType::F16]).map(|&d| (d, ReduceOp::Sum)).collect();
    for d in [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32, DType::I64, DType::U64] {
        specs.extend([(d, ReduceOp::Min), (d, ReduceOp::Max)]);
    }
    for d in [DType::I8, DType::U8, DType::I16, DType::U16] {
        specs.extend([(d, ReduceOp::Product), (d, ReduceOp::Avg)]);
    }
    for (dtype, r) in specs {
        let spec =
            ValueSpec { op: OpKind::AllReduce, variant: Variant::Out, dtype, reduce: Some(r), kind: InputKind::Exact, max_shapes: None };
        let lens: &[usize] = if !dtype.is_float() && dtype.size() <= 2 { &LONG_NARROW_INT } else { &LONG };
        for ws in [2, 3] {
            let name = format!("{}::long", case_name(&spec, ws));
            let seed = concord_fixtures::seed_for(&name);
            let extra = Extra { runs: Some(lens.iter().map(|&n| vec![vec![n]]).collect()), ..Extra::default() };
            let spec = spec.clone();
            out.push(Case::new(name, meta("matrix", &spec), ws, move |ctx| {
                values::run_extra(ctx.b, &spec, seed, ctx.timeout, "long", &extra)
            }));
        }
    }
    // The other reductions' narrow-integer passes (`reduce_scatter_tensor::out::u8::sum::ws2::long`):
    // the same pass loop may sit under reduce_scatter, reduce and the in-place all_reduce.
    for (op, variant) in
        [(OpKind::ReduceScatterTensor, Variant::Out), (OpKind::Reduce, Variant::Out), (OpKind::AllReduce, Variant::InPlace)]
    {
        let spec = ValueSpec { op, variant, dtype: DType::U8, reduce: Some(ReduceOp::Sum), kind: InputKind::Exact, max_shapes: None };
        let name = format!("{}::long", case_name(&spec, 2));
        let seed = concord_fixtures::seed_for(&name);
        // reduce_scatter's inputs hold one output per rank.
        let per = if op == OpKind::ReduceScatterTensor { 2 } else { 1 };
        let extra = Extra { runs: Some(LONG_NARROW_INT.iter().map(|&n| vec![vec![per * n]]).collect()), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| values::run_extra(ctx.b, &spec, seed, ctx.timeout, "long", &extra)));
    }
    out
}

/// Review16's targeted value cases (each closed a surviving mutant of `bugs_review16`):
/// * random f16 / bf16 `sum` all_reduce of 65,537 elements at 3 ranks
///   (`all_reduce::out::f16::sum::ws3::random::large`): above the catalogue's 1,031 elements every
///   other float sum is of small integers, exact in any order, so a large-message path that
///   rounds every step (under `ExactThenRound`) passed (finding 3); also f16 at 5 ranks and bf16
///   at 4 (review20: at 4 ranks or more only `identical::` ran them, comparing ranks with each
///   other, so a two-shot path that accumulates in the half type passed);
/// * random f64 `sum` all_reduce of 65,537 elements at 2 ranks
///   (`all_reduce::out::f64::sum::ws2::random::large`): a large f64 path through f32 (finding 4);
/// * Special (NaN / ±inf) f16 / bf16 `sum` through reduce_scatter and reduce at 2 ranks
///   (`reduce_scatter_tensor::out::f16::sum::ws2::special`): ±inf reached `sum` only through the
///   all_reduce, so a saturating store elsewhere passed (finding 5);
/// * random f32 / f64 `product` all_reduce at 2 ranks (`all_reduce::out::f64::product::ws2::random`):
///   the exact product inputs are ±2^k, exact in any float, so a narrower accumulator passed
///   (finding 6).
pub fn review16_cases<B: Backend>() -> Vec<Case<B>> {
    const N: usize = (1 << 16) + 1;
    let mut out = Vec::new();
    for (dtype, ws) in [(DType::F16, 3), (DType::BF16, 3), (DType::F64, 2), (DType::F16, 5), (DType::BF16, 4)] {
        let spec = ValueSpec {
            op: OpKind::AllReduce,
            variant: Variant::Out,
            dtype,
            reduce: Some(ReduceOp::Sum),
            kind: InputKind::Random,
            max_shapes: None,
        };
        let name = format!("{}::large", case_name(&spec, ws));
        let seed = concord_fixtures::seed_for(&name);
        let extra = Extra { runs: Some(vec![vec![vec![N]]]), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), ws, move |ctx| {
            values::run_extra(ctx.b, &spec, seed, ctx.timeout, "large", &extra)
        }));
    }
    for dtype in [DType::F16, DType::BF16] {
        for op in [OpKind::ReduceScatterTensor, OpKind::Reduce] {
            let spec =
                ValueSpec { op, variant: Variant::Out, dtype, reduce: Some(ReduceOp::Sum), kind: InputKind::Special, max_shapes: None };
            out.push(value_case(spec, 2));
        }
    }
    for dtype in [DType::F32, DType::F64] {
        let spec = ValueSpec {
            op: OpKind::AllReduce,
            variant: Variant::Out,
            dtype,
            reduce: Some(ReduceOp::Product),
            kind: InputKind::Random,
            max_shapes: None,
        };
        out.push(value_case(spec, 2));
    }
    out
}

/// Past 1 MiB with what the size ladder (`sum` of single tensors, out-of-place) does not run
/// there: `all_reduce` `max` / `min` / `avg` of 262145 f32 (a large-message kernel may exist for
/// `sum` only; `avg` as a sum then a divide that covers only part of the output), coalesced
/// `sum` of a list whose second tensor ends past 1 MiB (a fixed-size fusion buffer), in-place `all_reduce_` (a large path written for out-of-place calls), the `_out`
/// variants of all_gather / reduce_scatter with an output past 1 MiB (a view into a guarded
/// parent, as every matrix `_out` output), world size 2 (`all_reduce::out::f32::max::ws2::large`);
/// and the rooted ops past 1 MiB rooted at rank 0 (`gather::out::f32::ws2::large_root0`: the
/// ladder roots at the last rank, so a large path that assumes the root is last passes there);
/// reduce_scatter `avg`, in-place f64 and half-precision min / max past the catalogue's sizes
/// (review20).
pub fn large_cases<B: Backend>() -> Vec<Case<B>> {
    const N: usize = (1 << 18) + 1;
    let mut out = Vec::new();
    let specs = [
        (OpKind::AllReduce, Variant::Out, Some(ReduceOp::Max), vec![vec![vec![N]]]),
        (OpKind::AllReduce, Variant::Out, Some(ReduceOp::Min), vec![vec![vec![N]]]),
        // A scaled reduction done as a sum then a divide whose kernel covers only a first part.
        (OpKind::AllReduce, Variant::Out, Some(ReduceOp::Avg), vec![vec![vec![N]]]),
        (OpKind::AllReduce, Variant::InPlace, Some(ReduceOp::Sum), vec![vec![vec![N]]]),
        (OpKind::AllReduce, Variant::Coalesced, Some(ReduceOp::Sum), vec![vec![vec![N - 4], vec![7], vec![5, 3]]]),
        (OpKind::AllReduce, Variant::CoalescedInPlace, Some(ReduceOp::Sum), vec![vec![vec![N - 4], vec![7], vec![5, 3]]]),
        // Outputs of 2 x 131073 and 262145 elements; reduce_scatter as `avg` (review20: no
        // reduce_scatter ran an op but `sum` past 1,031 elements, so an avg whose last partial
        // chunk is left undivided passed; `sum` past 1 MiB stays in the size ladder).
        (OpKind::AllGatherIntoTensor, Variant::OutBuf, None, vec![vec![vec![N / 2 + 1]]]),
        (OpKind::ReduceScatterTensor, Variant::OutBuf, Some(ReduceOp::Avg), vec![vec![vec![2 * N]]]),
    ];
    for (op, variant, r, runs) in specs {
        let spec = ValueSpec { op, variant, dtype: DType::F32, reduce: r, kind: InputKind::Exact, max_shapes: None };
        let name = format!("{}::large", case_name(&spec, 2));
        let seed = concord_fixtures::seed_for(&name);
        let extra = Extra { runs: Some(runs), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| values::run_extra(ctx.b, &spec, seed, ctx.timeout, "large", &extra)));
    }
    // An 8-byte in-place all_reduce past 64 KiB at 2 ranks (review20: above 30 elements in-place
    // f64 / i64 ran only at 1 rank, so a staging copy sized for 4-byte elements passed).
    {
        let spec = ValueSpec {
            op: OpKind::AllReduce,
            variant: Variant::InPlace,
            dtype: DType::F64,
            reduce: Some(ReduceOp::Sum),
            kind: InputKind::Exact,
            max_shapes: None,
        };
        let name = format!("{}::large", case_name(&spec, 2));
        let seed = concord_fixtures::seed_for(&name);
        let extra = Extra { runs: Some(vec![vec![vec![N]]]), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| values::run_extra(ctx.b, &spec, seed, ctx.timeout, "large", &extra)));
    }
    // Random f16 `min` and bf16 `max` of 4,099 elements (review20: half-precision min / max ran
    // only up to 1,031 elements, so a large-message path comparing bit patterns as signed
    // integers, wrong for every negative value, passed).
    for (dtype, r) in [(DType::F16, ReduceOp::Min), (DType::BF16, ReduceOp::Max)] {
        let spec =
            ValueSpec { op: OpKind::AllReduce, variant: Variant::Out, dtype, reduce: Some(r), kind: InputKind::Random, max_shapes: None };
        let name = format!("{}::p4099", case_name(&spec, 2));
        let seed = concord_fixtures::seed_for(&name);
        let extra = Extra { runs: Some(vec![vec![vec![4099]]]), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| values::run_extra(ctx.b, &spec, seed, ctx.timeout, "p4099", &extra)));
    }
    let rooted = [
        (OpKind::Gather, Variant::Out, None, N / 2 + 1),
        (OpKind::Scatter, Variant::Out, None, 2 * N),
        (OpKind::Reduce, Variant::Out, Some(ReduceOp::Sum), N),
        (OpKind::Broadcast, Variant::InPlace, None, N),
    ];
    for (op, variant, r, n) in rooted {
        let spec = ValueSpec { op, variant, dtype: DType::F32, reduce: r, kind: InputKind::Exact, max_shapes: None };
        let name = format!("{}::large_root0", case_name(&spec, 2));
        let seed = concord_fixtures::seed_for(&name);
        let extra = Extra { runs: Some(vec![vec![vec![n]]]), root: Some(0), ..Extra::default() };
        out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| {
            values::run_extra(ctx.b, &spec, seed, ctx.timeout, "large root=0", &extra)
        }));
    }
    out
}

/// The data-moving ops on inputs of arbitrary bit patterns (`broadcast::out::bf16::ws2::bits`):
/// every float dtype, world size 2, the first five shapes. The matrix's exact inputs are small
/// integers, which survive a detour through a narrower format (bf16 sent as f16, f64 as f32);
/// these do not, and every byte must arrive as sent.
pub fn bits_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for &(op, variant) in PAIRS {
        if op.reduces() || op == OpKind::Barrier || matches!(variant, Variant::Coalesced) {
            continue;
        }
        for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
            let spec = ValueSpec { op, variant, dtype, reduce: None, kind: InputKind::Exact, max_shapes: Some(5) };
            let name = format!("{}::bits", case_name(&spec, 2));
            let seed = concord_fixtures::seed_for(&name);
            let extra = Extra { bits: true, ..Extra::default() };
            out.push(Case::new(name, meta("matrix", &spec), 2, move |ctx| {
                values::run_extra(ctx.b, &spec, seed, ctx.timeout, "input=bits", &extra)
            }));
        }
    }
    out
}

/// The value-independent subset (shapes, identity, aliasing) for backends that move no data:
/// every (op, variant) in f32 and i32 with `sum`, all world sizes.
pub fn shape_cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for &(op, variant) in PAIRS {
        for dtype in [DType::F32, DType::I32] {
            if op == OpKind::Barrier && dtype != DType::F32 {
                continue;
            }
            let reduce = op.reduces().then_some(ReduceOp::Sum);
            let spec = ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: None };
            for ws in WORLD_SIZES {
                out.push(value_case(spec.clone(), ws));
            }
        }
    }
    out
}
