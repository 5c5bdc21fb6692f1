//! Failure paths under injected faults ([`concord_core::fault`], issue 15): a rank's stream
//! stalls, the communication library stays "in progress", a local failure (a simulated
//! out-of-memory) hits after the op was numbered, a rank stalls or fails before / after its
//! validation header or never launches its side. Each case runs in a world of its own with the
//! `fault` backend option, on every backend that lists the hooks in
//! [`Backend::fault_hooks`] (others: UNSUPPORTED, with the reason).
//!
//! One device (world size 1):
//! * `device_faults::abort_fails_ops_in_flight::ws1` — op #0 sits behind a stalled stream, op #1
//!   behind it; op #1's deadline aborts the communicator; op #0, whose completion was never
//!   observed before the abort, MUST then fail too (not `Ok` with whatever the aborted kernel left).
//! * `device_faults::abort_not_behind_a_launch::ws1` — op #0 behind a stalled stream, op #1 stuck
//!   while being enqueued (issued half an op deadline later): op #0's wait MUST end at its own
//!   deadline, not at op #1's (an abort must not wait for a launch in progress).
//! * `device_faults::copies_not_behind_collectives::ws1` — with op #0 stuck behind a stalled
//!   stream, `download` and `upload` MUST return promptly with the right data (they synchronise
//!   with the device, not with queued collectives) and MUST NOT abort the communicator.
//! * `device_faults::local_failure_after_begin::ws{1,2}` — op #1 fails locally on the last rank
//!   (simulated out-of-memory): every rank MUST get a named error for op #1 (never a timeout),
//!   and op #2 MUST then work on every rank. `::bystander::ws4`: the same at 4 ranks with the
//!   fault on rank 1, so rank 3 is neither the failing rank nor its neighbour (helper subfault,
//!   review17 §7), on a communicator the case starts (`faults::sub_world`).
//! * `device_faults::local_failure_on_group::ws3` — `faults::fail_on_group`'s case with the
//!   failure at `after_begin` of the first op on `new_group([0, 1])` (`core::fault`'s `/G`,
//!   declared by `fault::ON_GROUPS`).
//!
//! Two ranks (one device each): `stall_before_first_header` — rank 1 stalls before its header of
//! op #0, the communicator's first op (a lazily connecting backend waits for the peer inside that
//! launch): rank 0's op #0 MUST end in a named error within its deadline plus the abort's bound.
//! Then rank 1 stalls before its header of op #1
//! (`stall_before_header`), stalls after it (`stall_after_header`), fails before it
//! (`fail_before_header`), or never launches its side (`no_launch`): rank 0's op #1 MUST end in a
//! named error within its deadline plus the abort's bound, never `Ok` (for `fail_before_header`:
//! a named error that is not a timeout, and op #2 then works).

use super::util::{expect_eq, fail, full, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::fault::{self, point, Action, Fault};
use concord_core::{Backend, DType, ReduceOp};
use std::time::{Duration, Instant};

fn meta() -> CaseMeta {
    CaseMeta { suite: "device_faults".into(), op: "all_reduce".into(), variant: "out".into(), dtype: "f32".into(), reduce: "sum".into() }
}

/// The meta of a case that starts its own communicator inside the case's world
/// (`faults::sub_world`): suite `faults`, so that it runs in the `faults` suite's persistent
/// worlds (`run::group_id`) and a backend without its hooks spawns no world only to skip it.
fn meta_in_faults_worlds() -> CaseMeta {
    CaseMeta { suite: "faults".into(), ..meta() }
}

/// `Unsupported` unless the backend lists every hook of `faults`.
fn needs<B: Backend>(b: &B, faults: &[Fault]) -> CaseResult {
    let have = b.fault_hooks();
    for f in faults {
        if !have.contains(&f.hook()) {
            return Err(CaseEnd::Unsupported(format!(
                "backend={} does not declare the fault hook {}:{} (Backend::fault_hooks)",
                crate::case::backend_label(b),
                f.point,
                f.action.name()
            )));
        }
    }
    Ok(())
}

/// A case in a fresh world with `faults` injected; deadline long enough for two op deadlines
/// and an abort (the op deadline is the world's; `CONCORD_CASE_TIMEOUT_MS` scales both).
fn fault_case<B: Backend>(
    name: &str,
    ws: usize,
    faults: Vec<Fault>,
    body: impl Fn(&mut Ctx<'_, B>) -> CaseResult + Send + Sync + 'static,
) -> Case<B> {
    let value = fault::format(&faults);
    let mut c = Case::<B>::new(format!("device_faults::{name}::ws{ws}"), meta(), ws, move |ctx| {
        needs(ctx.b, &faults)?;
        body(ctx)
    })
    .isolated()
    .with_option(fault::OPTION, &value);
    let op = concord_harness::config::Config::global().op_timeout();
    c.deadline = c.deadline.max(op * 3 + Duration::from_secs(25));
    c
}

fn op_timeout<B: Backend>(ctx: &Ctx<'_, B>) -> Duration {
    ctx.world.op_timeout
}

/// How late past a deadline an error may come (an abort is bounded, not instant).
const SLACK: Duration = Duration::from_millis(1500);

fn is_named_failure(name: &str) -> bool {
    matches!(name, "timeout" | "aborted" | "peer_died")
}

/// `local_failure_after_begin`: op #1 fails locally on rank `faulty` of `b` (op deadline `t`):
/// every rank MUST get a named error for op #1 (faults' `local_failure_named`: never a timeout,
/// bad input or a dead peer; the failing rank still sends its header), and op #2 MUST then work
/// on every rank (so a communicator really aborted fails there).
fn local_failure_after_begin<B: Backend>(b: &B, t: Duration, wait: Duration, faulty: usize) -> CaseResult {
    let w = format!("{} fault=after_begin:fail@{faulty}#1", here(b, "all_reduce", "out", DType::F32));
    let x = b.upload(&full(&[16], 1.0f32))?;
    let ws_f = b.world_size() as f32;
    let ok0 = b.all_reduce(&x, ReduceOp::Sum)?;
    expect_eq(b, ok0.wait(wait)?, &full(&[16], ws_f), &format!("{w} op #0"))?;
    let t0 = Instant::now();
    let r = b.all_reduce(&x, ReduceOp::Sum).and_then(|work| work.wait(t * 2 + Duration::from_secs(15)).map(|_| ()));
    let who = if b.rank() == faulty { "this rank".to_string() } else { format!("rank {faulty}") };
    match r {
        Ok(()) => return Err(fail(&w, format!("op #1 succeeded although {who} failed locally after begin()"))),
        // faults' rule for the clause (one rule in one place): named, never a timeout, bad input
        // or a dead peer; `aborted` naming the failure is allowed (shm's peers get it), and an
        // abort that really happened fails op #2 below.
        Err(e) => {
            super::faults::local_failure_named(&e, &format!("{w} op #1 (after {:?})", t0.elapsed()), "op #1", faulty, b.rank() == faulty)?
        }
    }
    let ok2 = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| fail(&w, format!("op #2 after the local failure: {e} [{}]", e.name())))?;
    let got = ok2.wait(wait).map_err(|e| fail(&w, format!("op #2 after the local failure: {e} [{}]", e.name())))?;
    expect_eq(b, got, &full(&[16], ws_f), &format!("{w} op #2 after the local failure"))
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    let stall0 = Fault::new(point::STREAM, Action::Stall).nth(0);

    v.push(fault_case::<B>("abort_fails_ops_in_flight", 1, vec![stall0.clone()], |ctx| {
        let b = ctx.b;
        let w = format!("{} fault=stream:stall#0", here(b, "all_reduce", "out", DType::F32));
        let x = b.upload(&full(&[64], 1.0f32))?;
        let first = b.all_reduce(&x, ReduceOp::Sum)?;
        let second = b.all_reduce(&x, ReduceOp::Sum)?;
        let long = op_timeout(ctx) * 2 + Duration::from_secs(15);
        match second.wait(long) {
            Ok(_) => return Err(fail(&w, "op #1 behind a stalled stream completed Ok")),
            Err(e) if is_named_failure(&e.name()) => {}
            Err(e) => return Err(fail(&w, format!("op #1: expected a timeout / abort, got {e} [{}]", e.name()))),
        }
        // The abort released the stream: op #0's kernel (or what the abort left of it) ends now;
        // let its completion be observed (after the abort) before the wait.
        let seen = Instant::now() + Duration::from_secs(3);
        while !first.is_completed() && Instant::now() < seen {
            std::thread::sleep(Duration::from_millis(5));
        }
        match first.wait(long) {
            Ok(_) => Err(fail(
                &w,
                "op #0 reported Ok after its communicator was aborted (its completion was never observed before the abort, \
                 so its output is not to be trusted): an aborted op must fail with the abort",
            )),
            Err(e) if is_named_failure(&e.name()) => Ok(()),
            Err(e) => Err(fail(&w, format!("op #0: expected aborted / timeout, got {e} [{}]", e.name()))),
        }
    }));

    v.push(fault_case::<B>(
        "abort_not_behind_a_launch",
        1,
        vec![stall0.clone(), Fault::new(point::ENQUEUE, Action::Stall).nth(1)],
        |ctx| {
            let b = ctx.b;
            let w = format!("{} fault=stream:stall#0;enqueue:stall#1", here(b, "all_reduce", "out", DType::F32));
            let t = op_timeout(ctx);
            let x = b.upload(&full(&[64], 1.0f32))?;
            let t0 = Instant::now();
            let first = b.all_reduce(&x, ReduceOp::Sum)?;
            std::thread::sleep(t / 2);
            let second = b.all_reduce(&x, ReduceOp::Sum)?;
            let r = first.wait(t * 3 + Duration::from_secs(15));
            let took = t0.elapsed();
            match r {
                Ok(_) => return Err(fail(&w, "op #0 behind a stalled stream completed Ok")),
                Err(e) if !is_named_failure(&e.name()) => {
                    return Err(fail(&w, format!("op #0: expected a timeout / abort, got {e} [{}]", e.name())))
                }
                Err(_) => {}
            }
            // An abort behind op #1's launch ends op #0's wait at op #1's deadline, t / 2 + t
            // after the issue: under a short op deadline (t < 3 s) the slack must stay below t / 2
            // to tell the two apart (the stream backend's `stream_abort_waits_for_launch`
            // survived t = 1.5 s with the fixed 1.5 s).
            let slack = SLACK.min(t / 4);
            if took > t + slack {
                return Err(fail(
                    &w,
                    format!(
                        "op #0's wait ended {took:?} after its issue, past its op deadline of {t:?} (+{slack:?}): the abort \
                         waited for op #1's launch (issued {:?} later) instead of being requested at once",
                        t / 2
                    ),
                ));
            }
            match second.wait(t * 2 + Duration::from_secs(15)) {
                Ok(_) => Err(fail(&w, "op #1 (stuck while being enqueued, communicator aborted) completed Ok")),
                Err(_) => Ok(()),
            }
        },
    ));

    v.push(fault_case::<B>("copies_not_behind_collectives", 1, vec![stall0], |ctx| {
        let b = ctx.b;
        let w = format!("{} fault=stream:stall#0", here(b, "download", "-", DType::F32));
        let t = op_timeout(ctx);
        let quick = (t / 3).min(Duration::from_secs(3));
        let x = b.upload(&full(&[64], 1.0f32))?;
        let stuck = b.all_reduce(&x, ReduceOp::Sum)?;
        let t0 = Instant::now();
        let got = b.download(&x).map_err(|e| fail(&w, format!("download behind a stalled collective: {e} [{}]", e.name())))?;
        let y_in = full(&[32], 7.0f32);
        let y = b.upload(&y_in).map_err(|e| fail(&w, format!("upload behind a stalled collective: {e} [{}]", e.name())))?;
        let took = t0.elapsed();
        if took > quick {
            return Err(fail(&w, format!("download + upload took {took:?} with a collective stuck on the stream (limit {quick:?})")));
        }
        concord_oracle::compare(&got, &full(&[64], 1.0f32), concord_oracle::Tolerance::Exact)
            .map_err(|m| fail(&w, format!("download behind a stalled collective: {m}")))?;
        expect_eq(b, &y, &y_in, &format!("{w} upload then download"))?;
        if stuck.is_completed() {
            return Err(fail(&w, "the collective behind the stalled stream reported completion"));
        }
        // The copies must not have aborted the communicator: a new op still issues.
        let later = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| {
            fail(&w, format!("issue after download / upload failed ({e} [{}]): the copies aborted the communicator", e.name()))
        })?;
        let _ = stuck.wait(t * 2 + Duration::from_secs(15));
        let _ = later.wait(t * 2 + Duration::from_secs(15));
        Ok(())
    }));

    for ws in [1, 2] {
        let f = Fault::new(point::AFTER_BEGIN, Action::Fail).on_rank(ws - 1).nth(1);
        v.push(fault_case::<B>("local_failure_after_begin", ws, vec![f], move |ctx| {
            local_failure_after_begin(ctx.b, op_timeout(ctx), ctx.timeout, ws - 1)
        }));
    }
    // helper subfault (review17 §7): at 4 ranks with the fault on rank 1, rank 3 is a bystander
    // (neither the failing rank nor one of its ring neighbours): it MUST get the same named
    // error, never launch its side and time out in it. On a communicator the case starts
    // (`faults::sub_world`, op deadline `faults::OP_TIMEOUT`) inside the case's world, so a
    // backend without the hook spawns no world of its own for it.
    {
        let f = Fault::new(point::AFTER_BEGIN, Action::Fail).on_rank(1).nth(1);
        v.push(Case::<B>::new("device_faults::local_failure_after_begin::bystander::ws4", meta_in_faults_worlds(), 4, move |ctx| {
            needs(ctx.b, std::slice::from_ref(&f))?;
            let (b, _id) = super::faults::sub_world(ctx, Some(f.clone()))?;
            local_failure_after_begin(&b, super::faults::OP_TIMEOUT, ctx.timeout, 1)
        }));
    }

    // helper subfault: a local failure on a subgroup (`/G`): the group's members get its named
    // error; the world, a sibling group and the group stay usable (`faults::fail_on_group`'s body).
    v.push(Case::<B>::new("device_faults::local_failure_on_group::ws3", meta_in_faults_worlds(), 3, |ctx| {
        super::faults::group_fail_case(ctx, point::AFTER_BEGIN)
    }));

    // The communicator's very first op (a fresh world, nothing run on it yet): a backend that
    // connects lazily (NCCL) waits for the absent peer inside its first launch, which its
    // deadline MUST still bound.
    {
        let f = Fault::new(point::BEFORE_HEADER, Action::Stall).on_rank(1).nth(0);
        let tag = f.to_string();
        v.push(fault_case::<B>("stall_before_first_header", 2, vec![f], move |ctx| {
            let b = ctx.b;
            let w = format!("{} fault={tag}", here(b, "all_reduce", "out", DType::F32));
            let t = op_timeout(ctx);
            let x = b.upload(&full(&[16], 1.0f32))?;
            let t0 = Instant::now();
            let r = b.all_reduce(&x, ReduceOp::Sum).and_then(|work| work.wait(t * 2 + Duration::from_secs(15)).map(|_| ()));
            let took = t0.elapsed();
            if b.rank() == 1 {
                return Ok(()); // the faulty rank
            }
            match r {
                Ok(()) => Err(fail(&w, "op #0 completed Ok although rank 1 never did its part")),
                Err(e) if !is_named_failure(&e.name()) => {
                    Err(fail(&w, format!("op #0: expected a timeout / abort / peer_died, got {e} [{}]", e.name())))
                }
                Err(_) if took > t + Duration::from_secs(12) => Err(fail(
                    &w,
                    format!("op #0, the communicator's first, failed only after {took:?} (op deadline {t:?} + the abort's bound)"),
                )),
                Err(_) => Ok(()),
            }
        }));
    }

    for (name, f, recovers) in [
        ("stall_before_header", Fault::new(point::BEFORE_HEADER, Action::Stall), false),
        ("stall_after_header", Fault::new(point::AFTER_HEADER, Action::Stall), false),
        ("no_launch", Fault::new(point::NO_LAUNCH, Action::Stall), false),
        ("fail_before_header", Fault::new(point::BEFORE_HEADER, Action::Fail), true),
    ] {
        let f = f.on_rank(1).nth(1);
        let tag = f.to_string();
        v.push(fault_case::<B>(name, 2, vec![f], move |ctx| {
            let b = ctx.b;
            let w = format!("{} fault={tag}", here(b, "all_reduce", "out", DType::F32));
            let t = op_timeout(ctx);
            let x = b.upload(&full(&[16], 1.0f32))?;
            let ok0 = b.all_reduce(&x, ReduceOp::Sum)?;
            expect_eq(b, ok0.wait(ctx.timeout)?, &full(&[16], 2.0f32), &format!("{w} op #0"))?;
            let t0 = Instant::now();
            let r = b.all_reduce(&x, ReduceOp::Sum).and_then(|work| work.wait(t * 2 + Duration::from_secs(15)).map(|_| ()));
            let took = t0.elapsed();
            if b.rank() == 1 && !recovers {
                return Ok(()); // the faulty rank: what it reports is the fault's, not the contract's
            }
            match r {
                Ok(()) => return Err(fail(&w, "op #1 completed Ok although rank 1 never did its part")),
                // A local failure: faults' rule for the clause (one rule in one place).
                Err(e) if recovers => super::faults::local_failure_named(&e, &format!("{w} op #1"), "op #1", 1, b.rank() == 1)?,
                Err(e) if !is_named_failure(&e.name()) => {
                    return Err(fail(&w, format!("op #1: expected a timeout / abort / peer_died, got {e} [{}]", e.name())))
                }
                Err(_) => {}
            }
            if took > t + Duration::from_secs(12) {
                return Err(fail(&w, format!("op #1 failed only after {took:?} (op deadline {t:?} + the abort's bound)")));
            }
            if recovers {
                let ok2 = b.all_reduce(&x, ReduceOp::Sum)?;
                let got = ok2.wait(ctx.timeout).map_err(|e| fail(&w, format!("op #2 after the local failure: {e} [{}]", e.name())))?;
                expect_eq(b, got, &full(&[16], 2.0f32), &format!("{w} op #2 after the local failure"))?;
            }
            Ok(())
        }));
    }
    v
}
