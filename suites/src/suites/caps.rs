//! Capability probes: what a backend *declares* in its [`Capabilities`] (and the semantics the
//! oracle fixes for every backend) is observed through the [`Backend`] trait and compared, so a
//! wrong declaration fails by name — "declared X, observed Y" — instead of surfacing as a wrong
//! value somewhere in the matrix, or as a declared gap that silently computes something.
//!
//! | probe | observes | declared in |
//! |---|---|---|
//! | `nan_minmax` | min / max with NaN on one rank: NaN, or the other ranks' value; NaN on every rank is NaN | [`Capabilities::nan_minmax`] |
//! | `nan_sum` | sum with NaN on one rank is NaN, whatever the min/max policy | the oracle (IEEE) |
//! | `signed_zero_minmax` | `min(-0, +0) = -0`, `max(-0, +0) = +0` | the oracle's order `-0 < +0` |
//! | `int_avg` | integer avg of sums that do not divide: toward zero or toward -inf | [`Capabilities::int_avg`] |
//! | `aliasing` | `all_gather_into_tensor_out` whose input is this rank's chunk of the output | [`Capabilities::aliasing`] |
//! | `gaps_refused` | every call (op, variant, reduce op) declared unsupported for the dtype ends in a named error on every rank | [`Capabilities::gaps`], [`Capabilities::dtypes`] |
//! | `moves_data` | an all_gather of rank-distinct inputs delivers every peer's input (declared true) or not (declared false: the fake's stand-ins) | [`Capabilities::moves_data`] |
//! | `subgroups` | `new_group` itself: refused by name on every rank (declared false), or a communicator at the list's position (declared true) | [`Capabilities::subgroups`] |
//!
//! Case names: `caps::<probe>::<dtype>::ws<N>`. A probe of a combination the backend declares
//! unsupported is UNSUPPORTED; a backend that moves no data has nothing to observe (UNSUPPORTED),
//! except `moves_data`, which checks that very declaration (a backend that moves real data but
//! declares it does not would have every value check skipped).
//! These probes replace the "declared vs observed" checks of the former `concord-nccl-smoke`
//! binary, and now run on every backend that moves data.

use super::util::{expect_eq, fail, full, supported_all_reduce, GAP_REFUSALS};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use concord_core::{AliasPolicy, Backend, BadInputKind, Capabilities, DType, IntAvg, NanPolicy, OpKind, ReduceOp, Tensor, Variant};

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
const INTS: [DType; 8] = [DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64];
const WS: [usize; 2] = [2, 3];

type Probe<B> = fn(&mut Ctx<'_, B>, DType) -> CaseResult;

fn case<B: Backend>(probe: &'static str, op: OpKind, variant: Variant, reduce: &str, dtype: DType, ws: usize, f: Probe<B>) -> Case<B> {
    let meta = CaseMeta {
        suite: "caps".into(),
        op: op.name().into(),
        variant: variant.name().into(),
        dtype: dtype.name().into(),
        reduce: reduce.into(),
    };
    Case::new(format!("caps::{probe}::{dtype}::ws{ws}"), meta, ws, move |ctx| f(ctx, dtype))
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let (ar, out) = (OpKind::AllReduce, Variant::Out);
    let mut v = Vec::new();
    for ws in WS {
        for d in FLOATS {
            v.push(case::<B>("nan_minmax", ar, out, "min,max", d, ws, nan_minmax));
            v.push(case::<B>("nan_sum", ar, out, "sum", d, ws, nan_sum));
            v.push(case::<B>("signed_zero_minmax", ar, out, "min,max", d, ws, signed_zero_minmax));
        }
        for d in INTS {
            v.push(case::<B>("int_avg", ar, out, "avg", d, ws, int_avg));
        }
        v.push(case::<B>("aliasing", OpKind::AllGatherIntoTensor, Variant::OutBuf, "", DType::F32, ws, aliasing));
    }
    for d in DType::ALL {
        v.push(case::<B>("gaps_refused", ar, out, "", d, 2, gaps_refused));
    }
    v.push(case::<B>("moves_data", OpKind::AllGatherIntoTensor, out, "", DType::F32, 2, moves_data));
    for ws in WS {
        v.push(subgroups_case::<B>(ws));
    }
    // review11 (helper impl11): init itself.
    let init_meta = || CaseMeta { suite: "caps".into(), op: "init".into(), variant: "-".into(), dtype: "-".into(), reduce: "-".into() };
    v.push(Case::new("caps::init_one_rank_world::ws2", init_meta(), 2, init_one_rank_world));
    let mut meta = init_meta();
    (meta.op, meta.variant, meta.dtype) = ("all_gather_into_tensor".into(), "out".into(), "f32".into());
    v.push(Case::new("caps::init_arrival_order::ws3", meta, 3, init_arrival_order));
    v
}

/// `caps::init_one_rank_world::ws2` (review11, finding 4): on a healthy world, rank 0 reads the
/// declared `max_world_size` and initialises a fresh one-rank world (the way the runner reads
/// the declaration of a refused world). A one-rank world is within every declaration
/// (`max_world_size` >= 1 and the contract declares no minimum): `init` MUST NOT refuse it
/// ([clause: init.declared_world_sizes]). Without this case, a backend refusing one rank (and
/// with it the runner's probe of the declaration) had every refused world size UNSUPPORTED.
fn init_one_rank_world<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let path = ctx.world.store_path.to_string_lossy().into_owned();
    if path.starts_with("tcp://") {
        return Err(CaseEnd::Unsupported("a one-rank world needs a store of its own: a file store, not tcp://".into()));
    }
    if ctx.rank() != 0 {
        return Ok(());
    }
    let max = ctx.b.capabilities().max_world_size;
    let w = format!(
        "backend={} op=init variant=- dtype=- world_size=1 rank=0 (declared max_world_size = {max})",
        crate::case::backend_label(ctx.b)
    );
    let mut one = ctx.world.clone();
    one.rank = 0;
    one.world_size = 1;
    one.world_id = format!("{}-one", ctx.world.world_id);
    one.store_path = std::path::PathBuf::from(format!("{path}.one"));
    one.options.retain(|(k, _)| k != concord_core::fault::OPTION);
    let r = B::init(&one).map(|b| b.world_size());
    let _ = std::fs::remove_file(&one.store_path);
    match r {
        Ok(1) => Ok(()),
        Ok(n) => Err(fail(&w, format!("init of a one-rank world returned a communicator of world_size {n}"))),
        Err(e) if max >= 1 => Err(fail(
            &w,
            format!(
                "init refused a one-rank world ({e} [{}]), but the backend declares max_world_size = {max}: every world size up to the \
                 declared maximum MUST initialise, one rank included (init.declared_world_sizes)",
                e.name()
            ),
        )),
        Err(e) => Err(fail(&w, format!("init of a one-rank world failed ({e}) and max_world_size = {max} declares no world at all"))),
    }
}

/// `caps::init_arrival_order::ws3` (review11, the weaker finding): a fresh 3-rank communicator
/// whose ranks reach `init` in reverse order (rank r sleeps (2 - r) x 20 ms after a store
/// barrier), then an all_gather of rank-distinct values: rank r's value MUST be at slot r on
/// every rank. The runner spawns ranks 0..N in order, so a backend that numbers its slots by
/// arrival order at init passed by scheduling luck ([clause: init.rank_is_the_launchers]).
fn init_arrival_order<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    if !ctx.b.capabilities().moves_data {
        return Err(CaseEnd::Unsupported("the backend moves no data".into()));
    }
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut world = ctx.world.clone();
    world.world_id = format!("{}-arrive{}", ctx.world.world_id, N.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
    world.options.retain(|(k, _)| k != concord_core::fault::OPTION);
    let (me, ws) = (ctx.rank(), ctx.world_size());
    let w = format!("backend={} op=all_gather_into_tensor variant=out dtype=f32 world_size={ws} rank={me} (a fresh communicator whose ranks reached init in reverse order)", crate::case::backend_label(ctx.b));
    let key = |r: usize| format!("caps/{}/start{r}", world.world_id);
    ctx.store.set(&key(me), b"1").map_err(|e| fail(&w, format!("store: {e}")))?;
    let keys: Vec<String> = (0..ws).map(key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    ctx.store.wait(&refs, ctx.timeout).map_err(|e| fail(&w, format!("the ranks never all started the case: {e}")))?;
    std::thread::sleep(std::time::Duration::from_millis(20 * (ws - 1 - me) as u64));
    let b = B::init(&world).map_err(|e| fail(&w, format!("init of the case's communicator: {e}")))?;
    if b.rank() != me {
        return Err(fail(&w, format!("init returned rank {} for the launcher's rank {me} (init.rank_is_the_launchers)", b.rank())));
    }
    let x = b.upload(&full(&[2], (me + 1) as f32 * 10.0))?;
    let got = b.all_gather_into_tensor(&x)?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("all_gather_into_tensor: {e}")))?;
    let got = b.download(&got)?;
    for i in 0..got.numel() {
        let want = ((i / 2) + 1) as f64 * 10.0;
        if got.get_f64(i) != want {
            return Err(fail(
                &w,
                format!(
                    "first bad index {i}: got {} expected {want} (rank {}'s value): the slots follow the order the ranks reached init \
                     (rank 2 first), not the launcher's ranks (init.rank_is_the_launchers)",
                    got.get_f64(i),
                    i / 2
                ),
            ));
        }
    }
    Ok(())
}

/// `caps::subgroups::ws<N>`: the declaration [`Capabilities::subgroups`] against `new_group`
/// itself (called directly, not through `Ctx::group`, which never calls it on a backend that
/// declares none). Declared false: every `new_group` — the whole world, and one rank alone —
/// MUST be refused by name (`unsupported` or `bad_input:unsupported_op`) on every rank, never
/// give a communicator (clause `caps.subgroups_declared`), and the world stays usable. Declared
/// true: `new_group` of the ranks in reverse order gives every rank the communicator whose rank
/// is its position in the list.
fn subgroups_case<B: Backend>(ws: usize) -> Case<B> {
    let meta = CaseMeta { suite: "caps".into(), op: "new_group".into(), variant: "-".into(), dtype: "-".into(), reduce: "-".into() };
    Case::new(format!("caps::subgroups::ws{ws}"), meta, ws, subgroups)
}

fn subgroups<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    const REFUSALS: [&str; 2] = ["unsupported", "bad_input:unsupported_op"];
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    let w = |ranks: &[usize]| {
        format!(
            "backend={} op=new_group variant=out dtype=- ranks={ranks:?} declared subgroups={} world_size={ws} rank={me}",
            crate::case::backend_label(b),
            caps.subgroups
        )
    };
    let reversed: Vec<usize> = (0..ws).rev().collect();
    if caps.subgroups {
        let g = b.new_group(&reversed).map_err(|e| fail(&w(&reversed), format!("{e} [{}]", e.name())))?;
        let g = g.ok_or_else(|| fail(&w(&reversed), "a member got no communicator"))?;
        let want = ws - 1 - me;
        if g.rank() != want || g.world_size() != ws {
            return Err(fail(&w(&reversed), format!("gave rank {} of {}, expected {want} of {ws}", g.rank(), g.world_size())));
        }
        return Ok(());
    }
    for ranks in [reversed.clone(), vec![0]] {
        match b.new_group(&ranks) {
            Ok(g) => {
                return Err(fail(
                    &w(&ranks),
                    format!(
                        "the backend declares subgroups = false, and new_group returned {} instead of a named refusal ({}) \
                         [clause: caps.subgroups_declared]",
                        if g.is_some() { "a communicator" } else { "Ok(None)" },
                        REFUSALS.join(" | ")
                    ),
                ))
            }
            Err(e) if REFUSALS.contains(&e.name().as_str()) => {}
            Err(e) => {
                return Err(fail(
                    &w(&ranks),
                    format!(
                        "the backend declares subgroups = false; expected a named refusal ({}), got {e} [{}]",
                        REFUSALS.join(" | "),
                        e.name()
                    ),
                ))
            }
        }
    }
    // The world is still usable (an all_gather: it takes no reduce op a backend may lack).
    let wa = at(b, "all_gather_into_tensor", "-", DType::F32);
    if caps.check(OpKind::AllGatherIntoTensor, Some(Variant::Out), Some(DType::F32), None, ws).is_err() {
        return Ok(());
    }
    let x = b.upload(&full(&[2], me as f32))?;
    let out = b
        .all_gather_into_tensor(&x)?
        .into_value(ctx.timeout)
        .map_err(|e| fail(&wa, format!("the world is not usable after the refused new_group calls: {e}")))?;
    let want: Vec<f32> = (0..ws).flat_map(|r| [r as f32, r as f32]).collect();
    expect_eq(b, &out, &Tensor::from_vec(&[2 * ws], want), &format!("{wa} (all_gather after the refused new_group calls)"))
}

/// Where a probe ran: backend, op, variant, reduce op, dtype, world size, rank.
fn at<B: Backend>(b: &B, op: &str, reduce: &str, dtype: DType) -> String {
    // Every probe calls the out-of-place form, except the aliasing probe (into a given buffer).
    let (op, variant) = match op.strip_suffix("_out") {
        Some(base) => (base, Variant::OutBuf.name()),
        None => (op, Variant::Out.name()),
    };
    format!(
        "backend={} op={op} variant={variant} reduce={reduce} dtype={dtype} world_size={} rank={}",
        crate::case::backend_label(b),
        b.world_size(),
        b.rank()
    )
}

/// The capabilities, or UNSUPPORTED when there is nothing to observe or the backend declares
/// one of `reduces` on `dtype` unsupported.
fn gate<B: Backend>(b: &B, op: OpKind, variant: Variant, dtype: DType, reduces: &[ReduceOp]) -> Result<Capabilities, CaseEnd> {
    let caps = b.capabilities();
    if !caps.moves_data {
        return Err(CaseEnd::Unsupported("the backend moves no data (Capabilities::moves_data = false): nothing to observe".into()));
    }
    let reduces: Vec<Option<ReduceOp>> = if reduces.is_empty() { vec![None] } else { reduces.iter().copied().map(Some).collect() };
    for r in reduces {
        caps.check(op, Some(variant), Some(dtype), r, b.world_size()).map_err(CaseEnd::Unsupported)?;
    }
    Ok(caps)
}

/// all_reduce (out of place) of this rank's `mine`; the downloaded result.
fn reduce_values<B: Backend>(ctx: &Ctx<'_, B>, dtype: DType, mine: &[f64], op: ReduceOp, w: &str) -> Result<Tensor, CaseEnd> {
    let b = ctx.b;
    let x = b.upload(&Tensor::from_f64(dtype, &[mine.len()], mine)).map_err(|e| fail(w, format!("upload: {e}")))?;
    let y = b.all_reduce(&x, op).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| fail(w, format!("{e} [{}]", e.name())))?;
    b.download(&y).map_err(|e| fail(w, format!("download: {e}")))
}

fn fold(op: ReduceOp, vals: impl Iterator<Item = f64>) -> f64 {
    match op {
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        _ => vals.fold(f64::NEG_INFINITY, f64::max),
    }
}

/// min / max with NaN on rank 0 only (element 0), on the last rank only (element 1) and on
/// every rank (element 2); every other rank r holds r + 1.
fn nan_minmax<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    let caps = gate(b, OpKind::AllReduce, Variant::Out, dtype, &[ReduceOp::Min, ReduceOp::Max])?;
    let (ws, me) = (b.world_size(), b.rank());
    let v = |r: usize| (r + 1) as f64;
    let mine = [if me == 0 { f64::NAN } else { v(me) }, if me == ws - 1 { f64::NAN } else { v(me) }, f64::NAN];
    for op in [ReduceOp::Min, ReduceOp::Max] {
        let w = at(b, "all_reduce", op.name(), dtype);
        let got = reduce_values(ctx, dtype, &mine, op, &w)?;
        let nan = |i: usize| got.get_f64(i).is_nan();
        let ignore = [fold(op, (1..ws).map(v)), fold(op, (0..ws - 1).map(v))];
        let seen = format!(
            "{op}(NaN on rank 0, numbers elsewhere) = {}, {op}(NaN on rank {}, numbers elsewhere) = {}",
            got.fmt_element(0),
            ws - 1,
            got.fmt_element(1)
        );
        if !nan(2) {
            return Err(fail(&w, format!("{op}(NaN on every rank) = {}, expected NaN under either NaN policy", got.fmt_element(2))));
        }
        let observed = match (nan(0), nan(1)) {
            (true, true) => NanPolicy::Propagate,
            (false, false) if got.get_f64(0) == ignore[0] && got.get_f64(1) == ignore[1] => NanPolicy::Ignore,
            _ => {
                return Err(fail(
                    &w,
                    format!(
                        "declared nan_minmax={:?}, observed neither policy: {seen} (Propagate gives NaN, NaN; Ignore gives {}, {})",
                        caps.nan_minmax, ignore[0], ignore[1]
                    ),
                ))
            }
        };
        if observed != caps.nan_minmax {
            return Err(fail(&w, format!("declared nan_minmax={:?}, observed {observed:?}: {seen}", caps.nan_minmax)));
        }
    }
    Ok(())
}

/// sum with NaN on rank 0 only: NaN, whatever the backend declares for min / max.
fn nan_sum<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    gate(b, OpKind::AllReduce, Variant::Out, dtype, &[ReduceOp::Sum])?;
    let me = b.rank();
    let w = at(b, "all_reduce", "sum", dtype);
    let mine = [if me == 0 { f64::NAN } else { 1.0 }];
    let got = reduce_values(ctx, dtype, &mine, ReduceOp::Sum, &w)?;
    if !got.get_f64(0).is_nan() {
        return Err(fail(
            &w,
            format!(
                "contract: sum(NaN on rank 0, 1 elsewhere) = NaN (NaN propagates through sum under either NaN policy); observed {}",
                got.fmt_element(0)
            ),
        ));
    }
    Ok(())
}

/// min / max of -0 and +0: element 0 has -0 on rank 0 and +0 elsewhere, element 1 the reverse.
fn signed_zero_minmax<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    gate(b, OpKind::AllReduce, Variant::Out, dtype, &[ReduceOp::Min, ReduceOp::Max])?;
    let me = b.rank();
    let mine = if me == 0 { [-0.0, 0.0] } else { [0.0, -0.0] };
    for (op, negative) in [(ReduceOp::Min, true), (ReduceOp::Max, false)] {
        let w = at(b, "all_reduce", op.name(), dtype);
        let got = reduce_values(ctx, dtype, &mine, op, &w)?;
        for i in 0..2 {
            let x = got.get_f64(i);
            if x != 0.0 || x.is_sign_negative() != negative {
                let (first, rest) = if i == 0 { ("-0", "+0") } else { ("+0", "-0") };
                return Err(fail(
                    &w,
                    format!(
                        "contract (the oracle orders -0 < +0): {op}({first} on rank 0, {rest} elsewhere) = {}; observed {}",
                        if negative { "-0" } else { "+0" },
                        got.fmt_element(i)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Integer avg of sums that do not divide by the world size. Rank 0 holds a, rank 1 holds b,
/// every other rank 0: signed (3, 4), (-3, -4), (1, -2); unsigned (3, 4), (5, 8), (0, 1).
/// For unsigned dtypes both policies agree; the probe then only checks the rounding is one of them.
fn int_avg<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    let caps = gate(b, OpKind::AllReduce, Variant::Out, dtype, &[ReduceOp::Avg])?;
    let (ws, me) = (b.world_size(), b.rank());
    let (a, c): ([i64; 3], [i64; 3]) = if dtype.is_signed_int() { ([3, -3, 1], [4, -4, -2]) } else { ([3, 5, 0], [4, 8, 1]) };
    let mine: Vec<f64> = match me {
        0 => a.iter().map(|&x| x as f64).collect(),
        1 => c.iter().map(|&x| x as f64).collect(),
        _ => vec![0.0; 3],
    };
    let w = at(b, "all_reduce", "avg", dtype);
    let got = reduce_values(ctx, dtype, &mine, ReduceOp::Avg, &w)?;
    let got: Vec<i64> = (0..3).map(|i| got.get_f64(i) as i64).collect();
    let sums: Vec<i64> = a.iter().zip(&c).map(|(x, y)| x + y).collect();
    let trunc: Vec<i64> = sums.iter().map(|s| s / ws as i64).collect();
    let floor: Vec<i64> = sums.iter().map(|s| s.div_euclid(ws as i64)).collect();
    let pairs: Vec<String> = a.iter().zip(&c).map(|(x, y)| format!("({x}, {y})")).collect();
    let seen = format!("avg of {} over {ws} ranks (0 on the others) = {got:?}", pairs.join(" "));
    let observed = if got == trunc {
        IntAvg::Truncate
    } else if got == floor {
        IntAvg::Floor
    } else {
        return Err(fail(
            &w,
            format!(
                "declared int_avg={:?}, observed neither policy: {seen} (Truncate gives {trunc:?}, Floor gives {floor:?})",
                caps.int_avg
            ),
        ));
    };
    // Unsigned sums are non-negative: truncation and floor give the same result.
    if observed != caps.int_avg && trunc != floor {
        return Err(fail(&w, format!("declared int_avg={:?}, observed {observed:?}: {seen}", caps.int_avg)));
    }
    Ok(())
}

/// `all_gather_into_tensor_out` whose input is this rank's chunk of the output (NCCL's in-place
/// layout): a named `bad_input:aliasing` is [`AliasPolicy::Reject`], the right result
/// [`AliasPolicy::Correct`]; anything else is neither.
fn aliasing<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    let caps = gate(b, OpKind::AllGatherIntoTensor, Variant::OutBuf, dtype, &[])?;
    let (ws, me) = (b.world_size(), b.rank());
    let w = at(b, "all_gather_into_tensor_out", "-", dtype);
    let n = 6;
    let chunk = |r: usize| Tensor::from_f64(dtype, &[n], &vec![(r + 1) as f64 * 10.0; n]);
    let out = b.upload(&Tensor::zeros(dtype, &[ws * n]))?;
    let input = b.view(&out, me * n, &[n])?;
    b.write(&input, &chunk(me))?;
    let result = b.all_gather_into_tensor_out(&input, &out).and_then(|wk| wk.into_value(ctx.timeout));
    let observed = match result {
        Err(e) if e.bad_input_kind() == Some(BadInputKind::Aliasing) => AliasPolicy::Reject,
        Err(e) => {
            return Err(fail(
                &w,
                format!("declared aliasing={:?}, observed neither policy: the aliased call ended in {e} [{}] (Reject is a named bad_input:aliasing error)", caps.aliasing, e.name()),
            ))
        }
        Ok(_) => {
            let parts: Vec<Tensor> = (0..ws).map(chunk).collect();
            let want = Tensor::cat_rows(dtype, &[], &parts);
            expect_eq(b, &out, &want, &format!("{w}: declared aliasing={:?}, observed neither policy: the aliased call was accepted but its result is wrong", caps.aliasing))?;
            AliasPolicy::Correct
        }
    };
    if observed != caps.aliasing {
        let how = match observed {
            AliasPolicy::Reject => "the aliased call was refused with bad_input:aliasing",
            AliasPolicy::Correct => "the aliased call was accepted and computed the right result",
        };
        return Err(fail(&w, format!("declared aliasing={:?}, observed {observed:?}: {how}", caps.aliasing)));
    }
    Ok(())
}

/// [`Capabilities::moves_data`] as observed: an all_gather of rank-distinct inputs (rank `r`
/// holds `4r + 1 ..= 4r + 4`) delivers every rank's input in rank order on a backend that
/// declares it moves data, and does not on one that declares it moves none (the fake's
/// stand-ins: its own input in every chunk). A backend that moves real data but declares
/// `moves_data = false` has every value check of the catalogue skipped (its cases UNSUPPORTED):
/// the declaration is false, and this probe names it.
fn moves_data<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    let caps = b.capabilities();
    let (ws, me) = (b.world_size(), b.rank());
    caps.check(OpKind::AllGatherIntoTensor, Some(Variant::Out), Some(dtype), None, ws).map_err(CaseEnd::Unsupported)?;
    const N: usize = 4;
    let w = at(b, "all_gather_into_tensor", "", dtype);
    let mine: Vec<f64> = (0..N).map(|i| (me * N + i + 1) as f64).collect();
    let x = b.upload(&Tensor::from_f64(dtype, &[N], &mine)).map_err(|e| fail(&w, format!("upload: {e}")))?;
    let y = b.all_gather_into_tensor(&x).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
    let got = b.download(&y).map_err(|e| fail(&w, format!("download: {e}")))?;
    let every: Vec<f64> = (0..ws * N).map(|i| (i + 1) as f64).collect();
    let delivered = got.numel() == every.len() && (0..got.numel()).all(|i| got.get_f64(i) == every[i]);
    let seen: Vec<f64> = (0..got.numel().min(2 * N * ws)).map(|i| got.get_f64(i)).collect();
    match (caps.moves_data, delivered) {
        (true, false) => Err(fail(
            &w,
            format!(
                "declared moves_data = true, observed: the all_gather did not deliver the ranks' inputs (got {seen:?}, expected {every:?})"
            ),
        )),
        (false, true) if ws > 1 => Err(fail(
            &w,
            format!(
                "declared moves_data = false (values are stand-ins: every value check of the catalogue is skipped and its cases are \
                 UNSUPPORTED), observed: the all_gather delivered every peer's input exactly ({seen:?}): the declaration is false; \
                 a backend that moves real data MUST declare moves_data = true so its values are checked"
            ),
        )),
        _ => Ok(()),
    }
}

/// Every call (every op and variant of the trait; every reduce op defined for the dtype where
/// the op reduces) the backend declares unsupported on `dtype` must end in a named error on every rank —
/// not a result, not a hang — and the world stays usable. Nothing declared: nothing to refuse.
fn gaps_refused<B: Backend>(ctx: &mut Ctx<'_, B>, dtype: DType) -> CaseResult {
    let b = ctx.b;
    let caps = b.capabilities();
    if !caps.moves_data {
        return Err(CaseEnd::Unsupported("the backend moves no data (Capabilities::moves_data = false): nothing to observe".into()));
    }
    let ws = b.world_size();
    if ws > caps.max_world_size {
        return Err(CaseEnd::Unsupported(format!("world size {ws} > declared max {}", caps.max_world_size)));
    }
    let mut probed = 0;
    // Every (op, variant) of the trait, each reduce op defined for the dtype where it reduces
    // (a gap may name any op, variant, dtype or reduce op: each is probed where declared).
    for &(op, variant) in exec::PAIRS.iter().filter(|(op, _)| *op != OpKind::Barrier) {
        let reduces: Vec<Option<ReduceOp>> =
            if op.reduces() { ReduceOp::ALL.into_iter().filter(|r| r.defined_for(dtype)).map(Some).collect() } else { vec![None] };
        for r in reduces {
            let Err(reason) = caps.check(op, Some(variant), Some(dtype), r, ws) else { continue };
            probed += 1;
            let rname = r.map_or("-", |r| r.name());
            let w = format!(
                "backend={} op={op} variant={} reduce={rname} dtype={dtype} world_size={ws} rank={}",
                crate::case::backend_label(b),
                variant.name(),
                b.rank()
            );
            let declared = format!("declared unsupported ({reason})");
            let x = match b.upload(&Tensor::zeros(dtype, &[2 * ws])) {
                Ok(x) => x,
                // A dtype the backend does not move at all may be refused at upload already.
                Err(_) if !caps.dtypes.contains(&dtype) => continue,
                Err(e) => return Err(fail(&w, format!("upload: {e}"))),
            };
            let out_shape = match op {
                OpKind::AllGatherIntoTensor => vec![2 * ws * ws],
                OpKind::ReduceScatterTensor => vec![2],
                _ => vec![2 * ws],
            };
            let out = match variant {
                Variant::OutBuf => Some(b.alloc(dtype, &out_shape).map_err(|e| fail(&w, format!("alloc: {e}")))?),
                _ => None,
            };
            let p = Params {
                reduce: r,
                root: 0,
                src_dst: (0..ws).map(|k| (k + 1) % ws).collect(),
                peer: crate::values::partner(b.rank(), ws),
                ..Default::default()
            };
            let called = exec::call(b, op, variant, std::slice::from_ref(&x), out.as_ref(), &p, ctx.timeout);
            let r = rname;
            match called {
                Ok(_) => {
                    return Err(fail(
                        &w,
                        format!(
                            "{declared}, observed a completed {op} {r}: a declared gap must end in a named error ({}) on every rank",
                            GAP_REFUSALS.join(" | ")
                        ),
                    ))
                }
                Err(e) if GAP_REFUSALS.contains(&e.name().as_str()) => {}
                Err(e) => {
                    return Err(fail(
                        &w,
                        format!("{declared}, observed {e} [{}]; expected a named refusal ({})", e.name(), GAP_REFUSALS.join(" | ")),
                    ))
                }
            }
        }
    }
    if probed == 0 {
        return Ok(());
    }
    // The world is still usable: an f32 all_reduce the backend supports (sum, else max; a
    // declared gap on one of them excuses that call only).
    let Ok(red) = supported_all_reduce(b, &[Variant::Out], &[ReduceOp::Sum, ReduceOp::Max]) else {
        return Ok(());
    };
    let w = at(b, "all_reduce", red.name(), DType::F32);
    let x = b.upload(&full(&[5], (b.rank() + 1) as f32))?;
    let out = b
        .all_reduce(&x, red)?
        .into_value(ctx.timeout)
        .map_err(|e| fail(&w, format!("the world is not usable after the refused calls: {e}")))?;
    let want = if red == ReduceOp::Sum { (ws * (ws + 1) / 2) as f32 } else { ws as f32 };
    expect_eq(b, &out, &Tensor::from_vec(&[5], vec![want; 5]), &format!("{w} (all_reduce after the refused calls)"))
}
