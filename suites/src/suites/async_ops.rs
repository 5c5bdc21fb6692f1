//! Asynchrony on every op of the trait and on every rank (issue 10): for each (op, variant) of
//! [`crate::exec::PAIRS`] and each rank `L` in turn as the *late* rank, every other rank issues
//! first and checks that
//! * issuing returned at once (the late rank has not issued),
//! * `is_completed()` is false while its result still needs the late rank,
//! * `wait(30 ms)` ends in a named timeout, within its deadline (not `Ok`, not a hang),
//!
//! then tells the late rank through the store (a rendezvous, not a sleep), which issues; every
//! rank then waits and checks its value against the oracle.
//!
//! Whether a rank's result "needs" the late rank: every rank for all_reduce / all_gather /
//! reduce_scatter / all_to_all / barrier; non-roots when the late rank is the root of broadcast /
//! scatter (root = late rank); the root of reduce / gather (root = the rank after the late one);
//! the receiver of permute and of recv. A send, and a rank whose result is defined without the
//! late rank, is only checked for returning at once.
//!
//! Also here: `async::issue_returns_at_once::fresh_group::ws3` (a new group's first op returns
//! at once while the other member has not issued: no lazy connect at issue),
//! `async::issue_returns_at_once::all_to_all_splits::ws2` (explicit, uneven splits), and
//! `async::barrier_synchronises` (and `::subgroup::ws3`, on a group) — the late rank sets a store key right before
//! entering the barrier (after a deliberate delay); every rank checks, right after its barrier
//! completes, with a non-waiting `check`, that the key is set; `::every_rank_checks::ws{4,5,8}`:
//! at 4, 5 and 8 ranks (late ranks 0, 4 and the last), every rank sets its key before entering and
//! checks every rank's.

use super::util::{expect_eq, fail, full, here, hold_off, member_group, take_key, take_keys};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params, PAIRS};
use crate::values::partner;
use concord_core::{progress, Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_oracle::Semantics;
use std::time::{Duration, Instant};

/// How long an early rank waits for a result that cannot be there yet.
const SHORT_WAIT: Duration = Duration::from_millis(30);
/// Slack on "returned at once" and "honoured its deadline" (a loaded 2-core machine stalls).
const SLACK: Duration = Duration::from_secs(2);

fn meta(op: OpKind, variant: Variant) -> CaseMeta {
    CaseMeta {
        suite: "async".into(),
        op: op.name().into(),
        variant: variant.to_string(),
        dtype: "f32".into(),
        reduce: if op.reduces() { "sum".into() } else { "-".into() },
    }
}

/// Whether rank `me`'s result needs rank `late` to have issued (see the module docs).
fn needs_late(op: OpKind, me: usize, late: usize, a: &Params) -> bool {
    match op {
        OpKind::Broadcast | OpKind::Scatter => me != a.root && late == a.root,
        OpKind::Reduce | OpKind::Gather => me == a.root,
        OpKind::PermuteTensor => a.src_dst[late] == me,
        OpKind::SendRecv => a.peer == Some(late),
        _ => true,
    }
}

/// Rank r's input number t: distinct per rank, tensor and element (exact in f32).
fn input(r: usize, t: usize, n: usize) -> Tensor {
    Tensor::from_vec(&[n], (0..n).map(|i| (r * 100 + t * 10 + i) as f32).collect())
}

/// The in-flight records that were not there in `before` (a record's backend and sequence
/// number tell it apart).
fn in_flight_since(before: &[progress::InFlight]) -> Vec<progress::InFlight> {
    progress::in_flight().into_iter().filter(|f| !before.iter().any(|o| o.backend == f.backend && o.seq == f.seq)).collect()
}

/// Whether a record's op name `name` is `op` (its [`OpKind::name`], possibly as the start of a
/// longer word of the name: `all_reduce_coalesced`, `broadcast_`): the longest op name a word of
/// `name` starts with must be `op`'s, so that `all_reduce` is no `reduce` and
/// `reduce_scatter_tensor` no `reduce` either.
fn records(name: &str, op: OpKind) -> bool {
    name.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| OpKind::ALL.iter().filter(|k| word.starts_with(k.name())).max_by_key(|k| k.name().len()).is_some_and(|k| *k == op))
}

/// One round with rank `late` as the late rank.
fn round<B: Backend>(ctx: &Ctx<'_, B>, op: OpKind, v: Variant, late: usize) -> CaseResult {
    round_on(ctx, ctx.b, "", op, v, late)
}

/// [`round`] on communicator `b` (the world, or a group: `what` names it in messages, and its
/// ranks are `b`'s).
fn round_on<B: Backend>(ctx: &Ctx<'_, B>, b: &B, what: &str, op: OpKind, v: Variant, late: usize) -> CaseResult {
    let (ws, me) = (b.world_size(), b.rank());
    let w = format!("{}{what} late_rank={late}", here(b, op.name(), &v.to_string(), DType::F32));
    let a = Params {
        root: if matches!(op, OpKind::Reduce | OpKind::Gather) { (late + 1) % ws } else { late },
        src_dst: (0..ws).map(|r| (r + 1) % ws).collect(),
        peer: partner(me, ws),
        ..Default::default()
    };
    let n = 2 * ws;
    let tensors = if matches!(v, Variant::Coalesced | Variant::CoalescedInPlace) { 2 } else { 1 };
    let mine: Vec<Tensor> = (0..tensors).map(|t| input(me, t, n)).collect();
    let ins: Vec<B::Buffer> = mine.iter().map(|t| b.upload(t)).collect::<Result<_, _>>()?;
    // Expected results, tensor by tensor, from the oracle.
    let sem = Semantics::of(&b.capabilities());
    let mut expected = Vec::new();
    if let Some(c) = exec::collective(op, &a, ws) {
        for t in 0..tensors {
            let all: Vec<Tensor> = (0..ws).map(|r| input(r, t, n)).collect();
            let e = concord_oracle::expected(&c, &all, &sem).map_err(|e| fail(&w, format!("suite bug: oracle: {e}")))?;
            expected.push((e.outputs[me].clone(), e.defined[me]));
        }
    }
    let out = match v {
        Variant::OutBuf => {
            let shape = expected[0].0.shape().to_vec();
            Some(b.alloc(DType::F32, &shape)?)
        }
        _ => None,
    };
    let key = |r: usize| format!("{}/{}/late{late}/issued{r}", ctx.case, ctx.world.world_id);
    // A check that fails on an early rank is reported after the round, once every rank has
    // issued and waited (so the world stays in step); only an early rank whose issue itself
    // failed tells the late rank not to issue (store value "x").
    let mut early_failure: Option<crate::case::CaseEnd> = None;
    let pending = if me == late {
        let keys: Vec<String> = (0..ws).filter(|&r| r != late).map(key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let never = format!("the other ranks never returned from issuing while rank {late} was absent (ops must return at once)");
        let values = take_keys(ctx, &refs, ctx.timeout, &w, &never)?;
        let failed: Vec<String> = refs
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.as_slice() != b"1")
            .map(|(k, _)| k.rsplit("issued").next().unwrap_or("?").to_string())
            .collect();
        if !failed.is_empty() {
            return Err(fail(&w, format!("rank(s) {} could not issue the op (see their messages); not issuing", failed.join(", "))));
        }
        exec::issue(b, op, v, &ins, out.as_ref(), &a)?
    } else {
        let before = progress::in_flight();
        let t0 = Instant::now();
        let p = match exec::issue(b, op, v, &ins, out.as_ref(), &a) {
            Ok(p) => p,
            Err(e) => {
                let _ = ctx.store.set(&key(me), b"x");
                return Err(fail(&w, format!("issue failed: {e} [{}]", e.name())));
            }
        };
        let took = t0.elapsed();
        let check = || -> CaseResult {
            if took > SLACK {
                return Err(fail(
                    &w,
                    format!("issuing blocked the caller for {took:?} while rank {late} was absent (ops must return at once)"),
                ));
            }
            if !needs_late(op, me, late, &a) {
                return Ok(());
            }
            if p.is_completed() {
                return Err(fail(&w, format!("is_completed() was true before rank {late} had issued its side")));
            }
            let t0 = Instant::now();
            match p.wait(SHORT_WAIT) {
                Ok(()) => return Err(fail(&w, format!("wait returned Ok before rank {late} had issued its side"))),
                Err(e) if e.name() == "timeout" => {}
                Err(e) => {
                    return Err(fail(
                        &w,
                        format!("wait({SHORT_WAIT:?}) before rank {late} issued: expected a named timeout, got {e} [{}]", e.name()),
                    ))
                }
            }
            let took = t0.elapsed();
            if took > SHORT_WAIT + SLACK {
                return Err(fail(&w, format!("wait({SHORT_WAIT:?}) returned after {took:?}: waits must honour their deadline")));
            }
            if p.is_completed() {
                return Err(fail(&w, format!("is_completed() was true after a timed-out wait, before rank {late} had issued")));
            }
            // progress.recorded: pending this long for the late rank, the collective is listed
            // in flight under the op the caller called (what a rank hung in it reports), whatever
            // the backend builds it from. Send / recv are no collectives.
            if op != OpKind::SendRecv && !in_flight_since(&before).iter().any(|f| records(&f.op, op)) {
                return Err(fail(
                    &w,
                    format!(
                        "pending {SHORT_WAIT:?} for rank {late}, the collective was not recorded in flight under `{}` \
                         (concord_core::progress lists: {}): a rank hung in it must name the op its caller called",
                        op.name(),
                        progress::describe()
                    ),
                ));
            }
            Ok(())
        };
        early_failure = check().err();
        ctx.store.set(&key(me), b"1").map_err(|e| fail(&w, e))?;
        p
    };
    let outs = pending.into_values(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())));
    if let Some(f) = early_failure {
        return Err(f);
    }
    let outs = outs?;
    if outs.len() != expected.len() {
        return Err(fail(&w, format!("returned {} results, expected {}", outs.len(), expected.len())));
    }
    for (t, (o, (exp, defined))) in outs.iter().zip(&expected).enumerate() {
        if *defined {
            expect_eq(b, o, exp, &format!("{w} tensor {t}"))?;
        }
    }
    Ok(())
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    // Every (op, variant) at ws2; the ops with roots, permutations and all-to-all again at ws3.
    let ws3 = [
        OpKind::AllReduce,
        OpKind::AllToAllSingle,
        OpKind::Broadcast,
        OpKind::PermuteTensor,
        OpKind::Reduce,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::Barrier,
    ];
    for &(op, variant) in PAIRS {
        for ws in [2, 3] {
            if ws == 3 && (!ws3.contains(&op) || variant != Variant::Out) {
                continue;
            }
            let name = format!("async::pending_until_peers_arrive::{}::{variant}::ws{ws}", op.name());
            v.push(Case::<B>::new(name, meta(op, variant), ws, move |ctx| {
                // Every round runs even after a failed one (its peers run it too); the first
                // failure is the verdict.
                let mut first = Ok(());
                for late in 0..ctx.world_size() {
                    let r = round(ctx, op, variant, late);
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }));
        }
    }
    // The same on a group (world ranks [2, 0]; rank 1 is no member): a group's op is pending
    // until its members arrive, and its waits honour their deadline like the world's.
    for (op, variant) in [(OpKind::AllReduce, Variant::Out), (OpKind::Broadcast, Variant::Out), (OpKind::Barrier, Variant::Out)] {
        let name = format!("async::pending_until_peers_arrive::subgroup::{}::{variant}::ws3", op.name());
        v.push(Case::<B>::new(name, meta(op, variant), 3, move |ctx| {
            if !ctx.b.capabilities().subgroups {
                return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
            }
            let Some(g) = member_group(ctx.b, &[2, 0])? else { return Ok(()) };
            let mut first = Ok(());
            for late in 0..g.world_size() {
                let what = format!(" group=[2, 0] (group ranks; world rank {})", ctx.b.rank());
                let r = round_on(ctx, &g, &what, op, variant, late);
                if first.is_ok() {
                    first = r;
                }
            }
            first
        }));
    }
    v.push(Case::<B>::new("async::barrier_synchronises::subgroup::ws3", meta(OpKind::Barrier, Variant::Out), 3, |ctx| {
        // The same on a subgroup (world ranks [2, 0]; rank 1 is no member): a group's barrier
        // completes on a member only after every member has entered it.
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let Some(g) = member_group(ctx.b, &[2, 0])? else { return Ok(()) };
        let b = &g;
        for late in 0..b.world_size() {
            let w = format!("{} group=[2, 0] late_group_rank={late}", here(b, "barrier", "out", DType::F32));
            let key = format!("{}/{}/group_late{late}/entering", ctx.case, ctx.world.world_id);
            if b.rank() == late {
                // A deliberate delay, so that the other member is inside its barrier.
                std::thread::sleep(Duration::from_millis(50));
                ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
            }
            b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            if !ctx.store.check(&[&key]).map_err(|e| fail(&w, e))? {
                return Err(fail(
                    &w,
                    format!("the group's barrier completed before group rank {late} had entered it (its store key, set right before entering, was not there)"),
                ));
            }
            b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("second barrier: {e} [{}]", e.name())))?;
            if b.rank() == late {
                let _ = ctx.store.delete_key(&key);
            }
        }
        Ok(())
    }));
    v.push(Case::<B>::new("async::issue_returns_at_once::fresh_group::ws3", meta(OpKind::AllReduce, Variant::Out), 3, |ctx| {
        // async.issue_returns on a communicator that has run nothing yet (world ranks [0, 1];
        // rank 2 is no member): group rank 0's first all_reduce returns at once although group
        // rank 1 issues only after that (a store key): a backend that connects a new group
        // lazily must not hold the caller at issue until every member has arrived.
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let Some(g) = member_group(ctx.b, &[0, 1])? else { return Ok(()) };
        let b = &g;
        let w = format!(
            "{} group=[0, 1] (fresh; group rank 1 issues only once group rank 0's issue returned)",
            here(b, "all_reduce", "out", DType::F32)
        );
        let key = format!("{}/{}/issued", ctx.case, ctx.world.world_id);
        let x = b.upload(&Tensor::from_vec(&[4], vec![(b.rank() + 1) as f32; 4]))?;
        let sum = Tensor::from_vec(&[4], vec![3.0f32; 4]);
        if b.rank() == 0 {
            let t0 = Instant::now();
            let issued = b.all_reduce(&x, ReduceOp::Sum);
            let took = t0.elapsed();
            // The other member goes on in any case (it must not wait for a key that never comes).
            ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
            let work = issued.map_err(|e| fail(&w, format!("issuing the group's first all_reduce (after {took:?}): {e} [{}]", e.name())))?;
            if took > SLACK {
                return Err(fail(
                    &w,
                    format!("issuing the group's first all_reduce blocked the caller for {took:?} while the other member had not issued: issuing returns at once"),
                ));
            }
            let out = work.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            expect_eq(b, &out, &sum, &w)
        } else {
            take_key(ctx, &key, &w, "group rank 0 never issued")?;
            let out = b.all_reduce(&x, ReduceOp::Sum)?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            expect_eq(b, &out, &sum, &w)
        }
    }));
    v.push(Case::<B>::new("async::issue_returns_at_once::all_to_all_splits::ws2", meta(OpKind::AllToAllSingle, Variant::Out), 2, |ctx| {
        // async.issue_returns for all_to_all_single with explicit, uneven splits (the matrix's
        // rounds use the equal split): rank 0's issue returns at once although rank 1 issues only
        // after that (a store key): no exchange of split sizes that holds the caller at issue.
        // Rank r holds [10r, 10r + 1, 10r + 2]; rank 0 splits [1, 2], rank 1 [2, 1], so rank 0
        // gets [0, 10, 11] and rank 1 [1, 2, 12].
        let b = ctx.b;
        if let Err(reason) = b.capabilities().check(OpKind::AllToAllSingle, Some(Variant::Out), Some(DType::F32), None, 2) {
            return Err(CaseEnd::Unsupported(reason));
        }
        let w = format!("{} splits=[1, 2] / [2, 1] (rank 1 issues only once rank 0's issue returned)", here(b, "all_to_all_single", "out", DType::F32));
        let key = format!("{}/{}/issued", ctx.case, ctx.world.world_id);
        let r = b.rank() as f32;
        let x = b.upload(&Tensor::from_vec(&[3], vec![10.0 * r, 10.0 * r + 1.0, 10.0 * r + 2.0]))?;
        let splits: &[usize] = if b.rank() == 0 { &[1, 2] } else { &[2, 1] };
        let want = Tensor::from_vec(&[3], if b.rank() == 0 { vec![0.0f32, 10.0, 11.0] } else { vec![1.0f32, 2.0, 12.0] });
        if b.rank() == 0 {
            let t0 = Instant::now();
            let issued = b.all_to_all_single(&x, Some(splits), Some(splits));
            let took = t0.elapsed();
            // The other rank goes on in any case (it must not wait for a key that never comes).
            ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
            let work = issued.map_err(|e| fail(&w, format!("issuing (after {took:?}): {e} [{}]", e.name())))?;
            if took > SLACK {
                return Err(fail(
                    &w,
                    format!("issuing all_to_all_single with splits blocked the caller for {took:?} while rank 1 had not issued: issuing returns at once"),
                ));
            }
            let out = work.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            expect_eq(b, &out, &want, &w)
        } else {
            take_key(ctx, &key, &w, "rank 0 never issued")?;
            let out = b.all_to_all_single(&x, Some(splits), Some(splits))?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            expect_eq(b, &out, &want, &w)
        }
    }));
    v.push(Case::<B>::new("async::issue_returns_at_once::large_all_reduce::ws2", meta(OpKind::AllReduce, Variant::Out), 2, |ctx| {
        // async.issue_returns at 1 MiB (every case above issues a few elements; the sizes
        // ladder's large steps issue on every rank at once): rank 0's all_reduce, then its
        // in-place all_reduce_, each of 1 MiB, returns at once although rank 1 issues it only
        // after that (a store key): no rendezvous protocol for large messages that meets the
        // peers at issue. Rank r holds r + 1 (out of place) and 2r + 2 (in place): sums 3 and 6.
        let b = ctx.b;
        const N: usize = 1 << 18;
        for (round, inplace) in [(0, false), (1, true)] {
            let variant = if inplace { "inplace" } else { "out" };
            let w = format!("{} shape=[{N}] (rank 1 issues only once rank 0's issue returned)", here(b, "all_reduce", variant, DType::F32));
            let key = format!("{}/{}/issued{round}", ctx.case, ctx.world.world_id);
            let k = if inplace { 2.0 } else { 1.0 };
            let x = b.upload(&full(&[N], k * (b.rank() + 1) as f32))?;
            let want = full(&[N], 3.0 * k);
            let issue = || if inplace { b.all_reduce_(&x, ReduceOp::Sum) } else { b.all_reduce(&x, ReduceOp::Sum) };
            if b.rank() == 0 {
                let t0 = Instant::now();
                let issued = issue();
                let took = t0.elapsed();
                // The other rank goes on in any case (it must not wait for a key that never comes).
                ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
                let work = issued.map_err(|e| fail(&w, format!("issuing (after {took:?}): {e} [{}]", e.name())))?;
                if took > SLACK {
                    return Err(fail(&w, format!("issuing a 1 MiB all_reduce blocked the caller for {took:?} while rank 1 had not issued: issuing returns at once")));
                }
                let out = work.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                expect_eq(b, &out, &want, &w)?;
            } else {
                take_key(ctx, &key, &w, "rank 0 never issued")?;
                let out = issue()?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                expect_eq(b, &out, &want, &w)?;
            }
        }
        Ok(())
    }));
    for ws in [4, 5, 8] {
        v.push(Case::<B>::new(
            format!("async::barrier_synchronises::every_rank_checks::ws{ws}"),
            meta(OpKind::Barrier, Variant::Out),
            ws,
            barrier_every_rank_checks,
        ));
    }
    for ws in [2, 3] {
        v.push(Case::<B>::new(format!("async::barrier_synchronises::ws{ws}"), meta(OpKind::Barrier, Variant::Out), ws, |ctx| {
            let b = ctx.b;
            for late in 0..b.world_size() {
                let w = format!("{} late_rank={late}", here(b, "barrier", "out", DType::F32));
                let key = format!("{}/{}/late{late}/entering", ctx.case, ctx.world.world_id);
                if b.rank() == late {
                    // A deliberate delay, so that the other ranks are inside their barrier.
                    std::thread::sleep(Duration::from_millis(50));
                    set_seen(ctx.store, &key).map_err(|e| fail(&w, e))?;
                }
                b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                let set = ctx.store.check(&[&key]).map_err(|e| fail(&w, e))?;
                if !set {
                    return Err(fail(
                        &w,
                        format!("the barrier completed before rank {late} had entered it (its store key, set right before entering, was not there)"),
                    ));
                }
                // Everyone has checked before the key goes away.
                b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("second barrier: {e} [{}]", e.name())))?;
                if b.rank() == late {
                    let _ = ctx.store.delete_key(&key);
                }
            }
            Ok(())
        }));
    }
    v
}

/// Sets `key` and reads it back before returning: a store whose `set` is not answered (c10d's
/// TCP protocol) may still hold the write in flight when the caller enters the barrier, and a
/// peer's check after the barrier must not race it. The read-back on the same connection comes
/// after the write.
fn set_seen(store: &concord_store::Store, key: &str) -> Result<(), String> {
    store.set(key, b"1").map_err(|e| e.to_string())?;
    match store.check(&[key]) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("the store key {key} just set is not there")),
        Err(e) => Err(e.to_string()),
    }
}

/// `async::barrier_synchronises::every_rank_checks::ws{4,5,8}`: the barrier at 4, 5 and 8 ranks
/// (the cases above run at 2 and 3, where every rank of a tree barrier is on its first level; 5
/// and 8 ranks span two groups of 4, where a hierarchical barrier's leaders must meet before
/// releasing anyone). One round per late rank, rank 0, rank 4 (from 5 ranks up: the first rank
/// of the second group) and the last rank: every rank sets its own store key right before it
/// enters the barrier (the late rank once every other rank's key is there, and 20 ms more, longer
/// on a loaded machine: `util::hold_off`, so that the others are inside), and
/// every rank checks, right after its barrier completed, that EVERY rank's key is set. No rank's
/// barrier may complete before every rank has entered it. (The keys are the round's own, so no
/// second barrier is needed before the next round; the world's store goes with the world.)
fn barrier_every_rank_checks<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let mut lates = vec![0];
    if ws > 5 {
        lates.push(4);
    }
    lates.push(ws - 1);
    for (round, late) in lates.into_iter().enumerate() {
        let w = format!("{} late_rank={late} (every rank sets its key right before entering)", here(b, "barrier", "out", DType::F32));
        let keys: Vec<String> = (0..ws).map(|r| format!("{}/{}/round{round}/entering{r}", ctx.case, ctx.world.world_id)).collect();
        if me == late {
            // The others' keys first: the 20 ms count from the last of them entering, however the
            // machine scheduled them, and grow while the machine holds threads back (`hold_off`):
            // with a plain 20 ms sleep review6_barrier_leaders_of_four survived 10 runs of 30 at
            // load 20 (its early ranks' barrier had not completed yet when the late rank came).
            let others: Vec<&str> = keys.iter().enumerate().filter(|&(r, _)| r != late).map(|(_, k)| k.as_str()).collect();
            ctx.store.wait(&others, ctx.timeout).map_err(|e| fail(&w, format!("the other ranks never reached the barrier: {e}")))?;
            hold_off(Duration::from_millis(20));
        }
        set_seen(ctx.store, &keys[me]).map_err(|e| fail(&w, e))?;
        b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        // Every key looked at once, right as the barrier completed: the ranks missing then are
        // the ones named (a second look, later, could find a late rank's key already there).
        let mut missing = Vec::new();
        for (r, k) in keys.iter().enumerate() {
            if !ctx.store.check(&[k.as_str()]).map_err(|e| fail(&w, e))? {
                missing.push(r);
            }
        }
        if !missing.is_empty() {
            return Err(fail(
                &w,
                format!(
                    "the barrier completed on this rank before rank(s) {missing:?} had entered it (their store keys, set right before entering, were not there when it completed)"
                ),
            ));
        }
    }
    Ok(())
}
