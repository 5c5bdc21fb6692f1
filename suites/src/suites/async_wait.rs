//! Async-wait semantics: pending before the peers arrive, completed after wait, waiting twice,
//! the outstanding-work registry (an all_reduce's, and every op's works counted while in flight),
//! many outstanding works waited out of order, waiting from another
//! thread, a peer that never joins (named timeout, then recovery; the op pending for it is
//! recorded in `concord_core::progress`), a lag test that catches a
//! backend reporting completion before the data is final, a process that exits with an
//! un-waited collective, out-of-place and in-place (must exit within 1 s), `wait(0)` as a poll (never blocking), a work
//! that completes without any wait (`is_completed()` polled: the all_reduce, and every op of the
//! trait with its result read before any wait, `::every_op::ws2`), a sub-second wait that waits its
//! deadline (not a poll), a timeout naming its own
//! sequence number (the in-flight record's), a work dropped un-waited whose collective still
//! runs for its peers, and a failed op whose `is_completed()` turns true. Point-to-point
//! (review8's finding 7): a 2-rank child whose rank 0 drops un-waited sends to a rank that never
//! receives exits within 3 s (`::unwaited_send_exits_within_3s::peer_absent::ws2`), and sends
//! whose works were dropped at once still reach the receives posted after the drop
//! (`::dropped_send_still_delivered::ws2`).

use super::util::{expect_eq, fail, full, here, member_group, take_key, take_keys, ArVehicle};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec;
use concord_core::{progress, AsyncResult, Backend, CollectiveError, DType, ReduceOp, Tensor, Variant};
use std::time::{Duration, Instant};

/// Environment variable that turns a conformance binary into the un-waited-exit child.
pub const CHILD_ENV: &str = concord_harness::worker::vars::UNWAITED_CHILD;
/// Set to `send` in the un-waited-exit child's environment: rank 0 of a 2-rank child drops
/// un-waited sends (to a rank 1 that never receives) instead of an all_reduce.
pub const CHILD_OP_ENV: &str = concord_harness::worker::vars::UNWAITED_OP;

fn meta(op: &str, variant: &str) -> CaseMeta {
    CaseMeta { suite: "async".into(), op: op.into(), variant: variant.into(), dtype: "f32".into(), reduce: "sum".into() }
}

/// A case that only carries its check on an f32 all_reduce: any of sum / max / min will do
/// (`red` picks one the backend supports), so the runner gates it only where all three are
/// declared gaps.
fn meta_any_reduce(op: &str, variant: &str) -> CaseMeta {
    CaseMeta { reduce: "sum,max,min".into(), ..meta(op, variant) }
}

/// The reduce op of a [`meta_any_reduce`] case's all_reduces: the first of sum / max / min the
/// backend does not declare a gap out of place on f32 (the same on every rank).
fn red<B: Backend>(b: &B) -> ReduceOp {
    vehicle(b).op
}

/// [`red`] as an [`ArVehicle`] (sum where every one is a gap: such a case is gated by its meta).
fn vehicle<B: Backend>(b: &B) -> ArVehicle {
    ArVehicle::pick(b, &[Variant::Out]).unwrap_or_else(|_| ArVehicle::with_op(b, ReduceOp::Sum))
}

/// rank r holds r+1 everywhere: the sum over ws ranks is ws(ws+1)/2.
fn rank_tensor<B: Backend>(b: &B, n: usize) -> Tensor {
    full(&[n], (b.rank() + 1) as f32)
}
/// [`red`]'s result over `ws` ranks of [`rank_tensor`]: ws(ws+1)/2 for sum, ws for max, 1 for min.
fn rank_sum<B: Backend>(b: &B, ws: usize) -> f32 {
    vehicle(b).fold((1..=ws).map(|r| r as f32))
}

/// How long a zero-timeout wait may take to return (generous: a loaded 2-core machine stalls).
const POLL_SLACK: Duration = Duration::from_secs(2);

/// The period of `async::lag_read_right_after_wait`'s inputs (rank `r`'s element `i` is
/// `(i mod 7) + 3r + it` at iteration `it`).
const LAG_PERIOD: usize = 7;

/// `period` repeated up to `n` elements (the last repetition cut short).
fn repeat_to(period: &[f32], n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    while v.len() + period.len() <= n {
        v.extend_from_slice(period);
    }
    v.extend_from_slice(&period[..n - v.len()]);
    v
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    for ws in [2, 4] {
        v.push(Case::<B>::new(format!("async::pending_until_peers_arrive::ws{ws}"), meta_any_reduce("all_reduce", "out"), ws, |ctx| {
            // Rank 0 issues only after every other rank has issued and looked at its work (a
            // store handshake, not a sleep), so "pending before rank 0 joins" holds however
            // the ranks are scheduled on a loaded machine.
            let b = ctx.b;
            let w = here(b, "all_reduce", "out", DType::F32);
            let key = |r: usize| format!("{}/{}/issued{r}", ctx.case, ctx.world.world_id);
            let x = b.upload(&rank_tensor(b, 1024))?;
            if b.rank() == 0 {
                let keys: Vec<String> = (1..b.world_size()).map(key).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let never =
                    "the other ranks never returned from issuing the collective while rank 0 was absent (collectives must return at once)";
                take_keys(ctx, &refs, ctx.timeout, &w, never)?;
                let work = b.all_reduce(&x, red(b)).map_err(|e| fail(&w, format!("issue: {e}")))?;
                let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
                return expect_eq(b, out, &full(&[1024], rank_sum(b, b.world_size())), &w);
            }
            let t0 = Instant::now();
            let work = b.all_reduce(&x, red(b)).map_err(|e| fail(&w, format!("issue: {e}")))?;
            let issue = t0.elapsed();
            // Generous: a 2-core machine under load can stall any call this long.
            if issue > Duration::from_secs(2) {
                return Err(fail(
                    &w,
                    format!(
                        "issuing the collective blocked the caller for {issue:?} while rank 0 was absent (collectives must return at once)"
                    ),
                ));
            }
            if work.is_completed() {
                return Err(fail(&w, "is_completed() was true before rank 0 had joined the collective"));
            }
            ctx.store.set(&key(b.rank()), b"1").map_err(|e| fail(&w, e))?;
            let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
            if !work.is_completed() {
                return Err(fail(&w, "is_completed() was false after a successful wait"));
            }
            expect_eq(b, out, &full(&[1024], rank_sum(b, b.world_size())), &w)
        }));
        v.push(Case::<B>::new(
            format!("async::many_outstanding_waited_out_of_order::ws{ws}"),
            meta_any_reduce("all_reduce", "out"),
            ws,
            |ctx| {
                let b = ctx.b;
                let w = here(b, "all_reduce", "out", DType::F32);
                let n = 16;
                let mut works = Vec::new();
                for i in 0..n {
                    let x = b.upload(&full(&[64 + i], (b.rank() + 1) as f32 * (i + 1) as f32))?;
                    works.push(b.all_reduce(&x, red(b))?);
                }
                if b.outstanding() < n {
                    return Err(fail(&w, format!("outstanding() = {} with {n} un-waited collectives", b.outstanding())));
                }
                for (i, work) in works.iter().enumerate().rev() {
                    let out = work.wait(ctx.timeout)?;
                    expect_eq(
                        b,
                        out,
                        &full(&[64 + i], rank_sum(b, b.world_size()) * (i + 1) as f32),
                        &format!("{w} work #{i} (waited in reverse order)"),
                    )?;
                }
                drop(works);
                if b.outstanding() != 0 {
                    return Err(fail(&w, format!("outstanding() = {} after every work was waited", b.outstanding())));
                }
                Ok(())
            },
        ));
    }
    v.push(Case::<B>::new("async::wait_zero_polls::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // `wait(0)` is a poll: before rank 1 has issued it MUST return a named timeout at once
        // (c10d's `kNoTimeout` is 0 ms, so a port may read 0 as "no timeout" and block). The
        // poll runs on a thread, so a blocking one is reported, not a hang: rank 1 issues once
        // rank 0 has looked (store handshake), which ends a blocked poll too.
        let b = ctx.b;
        let w = format!("{} wait=0", here(b, "all_reduce", "out", DType::F32));
        let key = format!("{}/{}/polled", ctx.case, ctx.world.world_id);
        let x = b.upload(&rank_tensor(b, 64))?;
        if b.rank() != 0 {
            ctx.store.wait(&[&key], ctx.timeout).map_err(|e| fail(&w, format!("rank 0 never finished its poll: {e}")))?;
            let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
            return expect_eq(b, &out, &full(&[64], rank_sum(b, b.world_size())), &w);
        }
        let work = b.all_reduce(&x, red(b)).map_err(|e| fail(&w, format!("issue: {e}")))?;
        let verdict = std::thread::scope(|s| {
            let poll = s.spawn(|| {
                let t0 = Instant::now();
                let r = work.wait(Duration::ZERO).map(|_| ());
                (r, t0.elapsed())
            });
            let t0 = Instant::now();
            while !poll.is_finished() && t0.elapsed() < POLL_SLACK {
                std::thread::sleep(Duration::from_millis(1));
            }
            let returned = poll.is_finished();
            let set = ctx.store.set(&key, b"1");
            let (r, took) = poll.join().map_err(|_| fail(&w, "the polling thread panicked"))?;
            set.map_err(|e| fail(&w, e))?;
            if !returned {
                return Err(fail(
                    &w,
                    format!("wait(0) before rank 1 had issued did not return within {POLL_SLACK:?} (it returned after {took:?}, once rank 1 issued): a zero timeout polls, it never blocks"),
                ));
            }
            match r {
                Ok(()) => Err(fail(&w, "wait(0) returned Ok before rank 1 had issued its side")),
                Err(e) if e.name() == "timeout" => Ok(()),
                Err(e) => Err(fail(&w, format!("wait(0) before rank 1 issued: expected a named timeout, got {e} [{}]", e.name()))),
            }
        });
        let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait after the poll: {e}")))?;
        verdict?;
        expect_eq(b, out, &full(&[64], rank_sum(b, b.world_size())), &w)
    }));
    v.push(Case::<B>::new("async::completes_without_wait::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // A work completes on its own once every rank has issued: polling `is_completed()`
        // (PyTorch's `while not work.is_completed(): ...`) MUST see it turn true without any
        // `wait` (a backend that makes progress only inside `wait` spins such a caller forever).
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let x = b.upload(&rank_tensor(b, 64))?;
        let base = b.outstanding();
        let work = b.all_reduce(&x, red(b)).map_err(|e| fail(&w, format!("issue: {e}")))?;
        // The clock starts once every rank has issued (a store handshake), so a rank that is
        // descheduled before issuing is not counted against the others' polls.
        let key = |r: usize| format!("{}/{}/issued/{r}", ctx.case, ctx.world.world_id);
        ctx.store.set(&key(b.rank()), b"1").map_err(|e| fail(&w, e))?;
        let all: Vec<String> = (0..b.world_size()).map(key).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        ctx.store.wait(&all, ctx.timeout).map_err(|e| fail(&w, format!("the other ranks never issued: {e}")))?;
        let limit = (ctx.timeout / 2).min(Duration::from_secs(5));
        let t0 = Instant::now();
        while !work.is_completed() && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        let completed = work.is_completed();
        // Quiescence: a completed work still counts until it is waited (or dropped).
        let counted = b.outstanding();
        let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
        if completed && counted != base + 1 {
            return Err(fail(
                &w,
                format!("outstanding() = {counted} with one completed, un-waited all_reduce ({base} before it was issued): a work counts until it is waited, not until it completes"),
            ));
        }
        if !completed {
            return Err(fail(
                &w,
                format!("is_completed() stayed false for {limit:?} after every rank had issued, with no wait called (it turned true only inside wait)"),
            ));
        }
        expect_eq(b, out, &full(&[64], rank_sum(b, b.world_size())), &w)
    }));
    v.push(Case::<B>::new("async::completes_without_wait::every_op::ws2", meta("every_op", "every"), 2, completes_without_wait_every_op));
    v.push(Case::<B>::new(
        "async::completes_without_wait::every_op::large::ws2",
        meta("every_op", "every"),
        2,
        completes_without_wait_large,
    ));
    v.push(Case::<B>::new("async::wait_twice::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let work = b.all_reduce(&b.upload(&rank_tensor(b, 10))?, red(b))?;
        let a = b.buffer_addr(work.wait(ctx.timeout)?);
        let second = work.wait(Duration::from_millis(1)).map_err(|e| fail(&w, format!("second wait failed: {e}")))?;
        if b.buffer_addr(second) != a {
            return Err(fail(&w, "the second wait returned a different buffer"));
        }
        expect_eq(b, second, &full(&[10], rank_sum(b, 2)), &w)
    }));
    v.push(Case::<B>::new("async::registry_counts_unwaited_work::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let base = b.outstanding();
        if base != 0 {
            return Err(fail(&w, format!("outstanding() = {base} at the start of a case")));
        }
        let x = b.upload(&rank_tensor(b, 8))?;
        let works: Vec<_> = (0..3).map(|_| b.all_reduce(&x, red(b))).collect::<Result<_, _>>()?;
        if b.outstanding() != 3 {
            return Err(fail(&w, format!("outstanding() = {} after issuing 3", b.outstanding())));
        }
        works[0].wait(ctx.timeout)?;
        if b.outstanding() != 2 {
            return Err(fail(&w, format!("outstanding() = {} after waiting 1 of 3", b.outstanding())));
        }
        for wk in &works {
            wk.wait(ctx.timeout)?;
        }
        if b.outstanding() != 0 {
            return Err(fail(&w, format!("outstanding() = {} after waiting all", b.outstanding())));
        }
        Ok(())
    }));
    v.push(Case::<B>::new("async::registry_counts_unwaited_work::every_op::ws2", meta("every_op", "every"), 2, registry_counts_every_op));
    v.push(Case::<B>::new("async::wait_from_another_thread::ws2", meta_any_reduce("all_reduce", "out"), 2, wait_from_another_thread));
    v.push(Case::<B>::new("async::two_threads_wait_one_work::ws2", meta_any_reduce("all_reduce", "out"), 2, two_threads_wait_one_work));
    v.push(Case::<B>::new(
        "async::communicators_progress_apart::ws3",
        meta_any_reduce("all_reduce", "out"),
        3,
        communicators_progress_apart,
    ));
    v.push(Case::<B>::new("async::issue_on_one_thread_run_on_another::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // The communicator created on the worker's main thread is used from a new thread.
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let timeout = ctx.timeout;
        let got = std::thread::scope(|s| {
            s.spawn(move || -> Result<B::Buffer, concord_core::CollectiveError> {
                let x = b.upload(&rank_tensor(b, 16))?;
                b.all_reduce(&x, red(b))?.into_value(timeout)
            })
            .join()
        })
        .map_err(|_| fail(&w, "the thread panicked"))?
        .map_err(|e| {
            fail(
                &w,
                format!("the all_reduce issued and waited on a thread other than the one that made the communicator: {e} [{}]", e.name()),
            )
        })?;
        expect_eq(b, &got, &full(&[16], rank_sum(b, 2)), &w)
    }));
    v.push(
        Case::<B>::new("async::peer_dies_mid_collective::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
            peer_dies_mid_collective(ctx, "all_reduce", "out")
        })
        .isolated(),
    );
    // The same with a barrier: a fence whose peer died MUST NOT complete with success (PMIx
    // dropped a departed process from the collective's tracker and returned SUCCESS:
    // openpmix/openpmix #2291, PR #2293).
    v.push(
        Case::<B>::new("async::peer_dies_mid_collective::barrier::ws2", meta("barrier", "out"), 2, |ctx| {
            peer_dies_mid_collective(ctx, "barrier", "out")
        })
        .isolated(),
    );
    v.push(Case::<B>::new("async::peer_never_joins_then_recovers::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let key = format!("{}/{}/go", ctx.case, ctx.world.world_id);
        let x = b.upload(&rank_tensor(b, 32))?;
        if b.rank() == 0 {
            let work = b.all_reduce(&x, red(b))?;
            let asked = Duration::from_millis(300);
            let t0 = Instant::now();
            let waited = work.wait(asked);
            // The deadline is honoured: generous slack for a loaded machine, far below 2x.
            let took = t0.elapsed();
            if took > asked + Duration::from_millis(500) {
                return Err(fail(&w, format!("wait({asked:?}) on a pending collective returned after {took:?}")));
            }
            match waited {
                Ok(_) => return Err(fail(&w, "wait returned Ok although rank 1 had not issued the collective")),
                Err(e) if e.name() == "timeout" => {
                    let msg = e.to_string();
                    if !msg.contains("all_reduce") {
                        return Err(fail(&w, format!("the timeout error does not name the collective: {msg}")));
                    }
                }
                Err(e) => return Err(fail(&w, format!("expected a named timeout, got {e} [{}]", e.name()))),
            }
            ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
            let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined late: {e}")))?;
            expect_eq(b, out, &full(&[32], rank_sum(b, 2)), &w)
        } else {
            take_key(ctx, &key, &w, "rank 0 never said its short wait had ended")?;
            let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout)?;
            expect_eq(b, &out, &full(&[32], rank_sum(b, 2)), &w)
        }
    }));
    // async.every_op_every_rank: an op completes once its peers have issued it, whatever this
    // rank issued after it. Rank 0 issues #1 and #2 back to back and waits #1; rank 1 issues #2
    // only after rank 0 has seen #1 complete (a legal program: PyTorch users write it). A backend
    // that completes an op with the ops issued after it (one completion event recorded after a
    // burst of small ops) leaves #1 pending for good while rank 1 has long finished it.
    v.push(Case::<B>::new(
        "async::earlier_op_completes_before_a_later_one_is_issued::ws2",
        meta_any_reduce("all_reduce", "out"),
        2,
        |ctx| {
            let b = ctx.b;
            let w = here(b, "all_reduce", "out", DType::F32);
            let prefix = format!("{}/{}", ctx.case, ctx.world.world_id);
            let (seen, done1) = (format!("{prefix}/first_seen"), format!("{prefix}/first_done_on_1"));
            let x = b.upload(&rank_tensor(b, 16))?;
            let y = b.upload(&rank_tensor(b, 8))?;
            let (want_x, want_y) = (full(&[16], rank_sum(b, 2)), full(&[8], rank_sum(b, 2)));
            if b.rank() == 1 {
                let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout)?;
                ctx.store.set(&done1, b"1").map_err(|e| fail(&w, e))?;
                take_keys(ctx, &[&seen], ctx.timeout * 2, &w, "rank 0 never said it saw op #1 end")?;
                // #2 is issued whatever #1 held (rank 0 waits for it); both are checked after.
                let out2 = b.all_reduce(&y, red(b))?.into_value(ctx.timeout)?;
                expect_eq(b, &out, &want_x, &format!("{w} (op #1)"))?;
                return expect_eq(b, &out2, &want_y, &format!("{w} (op #2)"));
            }
            let first = b.all_reduce(&x, red(b))?;
            let second = b.all_reduce(&y, red(b))?;
            // Bounded by the op's own progress, not by a guess of the machine's speed: a failure
            // needs rank 1 to have finished #1 and #1 here to stay pending LAG longer.
            let t0 = Instant::now();
            // When this rank first saw rank 1's "done" (LAG counts from there).
            let mut done_at: Option<Instant> = None;
            let verdict = loop {
                match first.wait(LAG_STEP) {
                    Ok(_) => break Ok(()),
                    Err(e) if e.name() != "timeout" => break Err(fail(&w, format!("op #1: {e}"))),
                    Err(_) if done_after(&mut done_at, ctx.store.check(&[done1.as_str()]).unwrap_or(false)) > LAG => {
                        break Err(fail(
                            &w,
                            format!(
                                "all_reduce #1 is still pending {:?} after issue, at least {LAG:?} after rank 1 finished it; the only \
                             other op this rank has issued (#2) waits for rank 1, which issues it only once #1 has completed \
                             here: an op must complete once its peers have issued it, not with the ops issued after it",
                                t0.elapsed()
                            ),
                        ))
                    }
                    Err(_) if t0.elapsed() > ctx.timeout => {
                        break Err(fail(&w, format!("op #1 pending after {:?}; rank 1 never finished it", t0.elapsed())))
                    }
                    Err(_) => {}
                }
            };
            // Rank 1 goes on either way, so that #2 (and the world) ends.
            ctx.store.set(&seen, b"1").map_err(|e| fail(&w, e))?;
            let second = second.wait(ctx.timeout).map_err(|e| fail(&w, format!("op #2: {e}")));
            verdict?;
            expect_eq(b, first.wait(ctx.timeout)?, &want_x, &format!("{w} (op #1)"))?;
            let _ = ctx.store.delete_key(&done1);
            expect_eq(b, second?, &want_y, &format!("{w} (op #2)"))
        },
    ));
    // The same for the sharded ops (an all_gather / reduce_scatter issued while one is pending
    // may not join the pending one's launch: FSDP issues them back to back).
    for op in [concord_core::OpKind::AllGatherIntoTensor, concord_core::OpKind::ReduceScatterTensor] {
        let name = format!("async::earlier_op_completes_before_a_later_one_is_issued::{}::ws2", op.name());
        v.push(Case::<B>::new(name, meta(op.name(), "out"), 2, move |ctx| earlier_completes_before_later(ctx, op)));
    }
    v.push(Case::<B>::new("async::peer_never_joins_op_recorded_in_flight::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // progress.recorded: while rank 0's all_reduce waits for rank 1 (which has not issued
        // it), `concord_core::progress` lists it in flight, so a deadline report names it.
        let w = here(ctx.b, "all_reduce", "out", DType::F32);
        all_reduce_recorded_while_peer_absent(ctx, ctx.b, &w)
    }));
    v.push(Case::<B>::new(
        "async::peer_never_joins_op_recorded_in_flight::subgroup::ws3",
        meta_any_reduce("all_reduce", "out"),
        3,
        |ctx| {
            // The same on a group (world ranks [0, 1]; rank 2 is no member): a backend that keeps
            // the record for its world communicator only leaves a rank hung in a group's op
            // reporting itself idle.
            if !ctx.b.capabilities().subgroups {
                return Err(crate::case::CaseEnd::Unsupported("backend declares no subgroup support".into()));
            }
            let Some(g) = member_group(ctx.b, &[0, 1])? else { return Ok(()) };
            let w = format!("{} group=[0, 1]", here(&g, "all_reduce", "out", DType::F32));
            all_reduce_recorded_while_peer_absent(ctx, &g, &w)
        },
    ));
    // The same for the other ops a rank can hang in: a backend that records only its
    // all_reduce path leaves a rank stuck in a broadcast or a barrier reporting itself idle.
    // broadcast_ from rank 1 (rank 0 must receive it), and the barrier.
    for (op, variant) in [("broadcast", "inplace"), ("barrier", "out")] {
        v.push(Case::<B>::new(format!("async::peer_never_joins_op_recorded_in_flight::{op}::ws2"), meta(op, variant), 2, move |ctx| {
            let b = ctx.b;
            let w = here(b, op, variant, DType::F32);
            let key = format!("{}/{}/go", ctx.case, ctx.world.world_id);
            let x = b.upload(&rank_tensor(b, 16))?;
            if b.rank() == 0 {
                let same = |a: &progress::InFlight, z: &progress::InFlight| a.backend == z.backend && a.seq == z.seq;
                let before = progress::in_flight();
                let (bcast, bar) = if op == "broadcast" { (Some(b.broadcast_(&x, 1)?), None) } else { (None, Some(b.barrier()?)) };
                let recorded: Vec<progress::InFlight> =
                    progress::in_flight().into_iter().filter(|f| f.op.contains(op) && !before.iter().any(|o| same(o, f))).collect();
                let state = progress::describe();
                ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
                if let Some(work) = bcast {
                    let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined: {e}")))?;
                    expect_eq(b, out, &full(&[16], 2.0f32), &w)?;
                }
                if let Some(work) = bar {
                    work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined: {e}")))?;
                }
                if recorded.is_empty() {
                    return Err(fail(
                        &w,
                        format!("a {op} waiting for rank 1 is not recorded in flight (concord_core::progress::describe(): {state})"),
                    ));
                }
                Ok(())
            } else {
                take_key(ctx, &key, &w, "rank 0 never said it had looked at its op in flight")?;
                if op == "broadcast" {
                    let out = b.broadcast_(&x, 1)?.into_value(ctx.timeout)?;
                    expect_eq(b, &out, &full(&[16], 2.0f32), &w)?;
                } else {
                    b.barrier()?.wait(ctx.timeout)?;
                }
                Ok(())
            }
        }));
    }
    // The same for a coalesced all_reduce (a backend may run its coalesced ops on an engine of
    // their own): two tensors, each rank's values r + 1 and 2r + 2, sums 3 and 6.
    v.push(Case::<B>::new("async::peer_never_joins_op_recorded_in_flight::all_reduce_coalesced::ws2", meta("all_reduce", "coalesced"), 2, |ctx| {
        let b = ctx.b;
        let w = here(b, "all_reduce", "coalesced", DType::F32);
        let key = format!("{}/{}/go", ctx.case, ctx.world.world_id);
        let xs = [b.upload(&rank_tensor(b, 16))?, b.upload(&full(&[8], 2.0 * (b.rank() + 1) as f32))?];
        let want = [full(&[16], 3.0f32), full(&[8], 6.0f32)];
        let check = |outs: &[B::Buffer]| -> crate::case::CaseResult {
            for (out, want) in outs.iter().zip(&want) {
                expect_eq(b, out, want, &w)?;
            }
            Ok(())
        };
        if b.rank() == 0 {
            let same = |a: &progress::InFlight, z: &progress::InFlight| a.backend == z.backend && a.seq == z.seq;
            let before = progress::in_flight();
            let work = b.all_reduce_coalesced(&xs, ReduceOp::Sum)?;
            let recorded = progress::in_flight().into_iter().filter(|f| f.op.contains("all_reduce") && !before.iter().any(|o| same(o, f))).count();
            let state = progress::describe();
            ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
            let outs = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined: {e}")))?;
            check(outs)?;
            if recorded == 0 {
                return Err(fail(
                    &w,
                    format!("a coalesced all_reduce waiting for rank 1 is not recorded in flight (concord_core::progress::describe(): {state})"),
                ));
            }
            Ok(())
        } else {
            take_key(ctx, &key, &w, "rank 0 never said it had looked at its op in flight")?;
            let outs = b.all_reduce_coalesced(&xs, ReduceOp::Sum)?.into_value(ctx.timeout)?;
            check(&outs)
        }
    }));
    v.push(
        Case::<B>::new("async::lag_read_right_after_wait::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
            // A large buffer, read at once after wait: a backend that reports completion before the
            // data is final is caught here.
            let b = ctx.b;
            let w = here(b, "all_reduce", "out", DType::F32);
            let n = 4 << 20;
            let v = vehicle(b);
            for it in 0..3 {
                // Rank r's element i is (i mod 7) + 3r + it: one period of 7 elements, repeated
                // (the vehicle's ops are element-wise, so the expected result repeats the period's
                // too: made from 7 elements, not 4 Mi per rank, the same bits).
                let period = |r: usize| (0..LAG_PERIOD).map(|i| (i as f32) + (r * 3 + it) as f32).collect::<Vec<f32>>();
                // The expected result is made before the op, so the read really comes right after the
                // wait (not after milliseconds of arithmetic a late write could land in).
                let exp = Tensor::from_vec(&[n], repeat_to(v.expected(b.world_size(), period).as_slice::<f32>(), n));
                let x = b.upload(&Tensor::from_vec(&[n], repeat_to(&period(b.rank()), n)))?;
                let out = b.all_reduce(&x, v.op)?.into_value(ctx.timeout)?;
                expect_eq(b, &out, &exp, &format!("{w} shape=[{n}] iteration {it}"))?;
            }
            Ok(())
        })
        .heavy(),
    );
    // Its all_reduce is an avg (what the seed's AsyncResult test reduces with): the meta says so,
    // so the runner gates it on that call.
    v.push(Case::<B>::new(
        "async::async_result_waits_on_first_read::ws2",
        CaseMeta { reduce: "avg".into(), ..meta("all_reduce", "out") },
        2,
        |ctx| {
            let b = ctx.b;
            let w = here(b, "all_reduce", "out", DType::F32);
            let r = AsyncResult::new(b.all_reduce(&b.upload(&rank_tensor(b, 4))?, ReduceOp::Avg)?, ctx.timeout);
            if r.completed() {
                return Err(fail(&w, "AsyncResult.completed() true before the first read"));
            }
            let out = r.get()?;
            if !r.completed() {
                return Err(fail(&w, "AsyncResult.completed() false after a read"));
            }
            expect_eq(b, out, &full(&[4], 1.5f32), &w)
        },
    ));
    v.push(Case::<B>::new("async::sub_second_wait_waits_its_deadline::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // A wait with a sub-second deadline waits: it returns Ok once the peer arrives, or a
        // timeout only once its deadline has passed (never a timeout at once, as a port that
        // counts deadlines in whole seconds gives). Rank 1 issues ~100 ms after rank 0 began
        // waiting; a loaded machine that delays it past the deadline is no failure.
        let b = ctx.b;
        let asked = Duration::from_millis(950);
        let w = format!("{} wait={asked:?}", here(b, "all_reduce", "out", DType::F32));
        let key = format!("{}/{}/waiting", ctx.case, ctx.world.world_id);
        let x = b.upload(&rank_tensor(b, 16))?;
        let sum = full(&[16], rank_sum(b, b.world_size()));
        if b.rank() != 0 {
            take_key(ctx, &key, &w, "rank 0 never said it was waiting")?;
            std::thread::sleep(Duration::from_millis(100));
            let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
            return expect_eq(b, &out, &sum, &w);
        }
        let work = b.all_reduce(&x, red(b)).map_err(|e| fail(&w, format!("issue: {e}")))?;
        ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
        let t0 = Instant::now();
        let verdict = match work.wait(asked) {
            Ok(_) => Ok(()),
            Err(e) if e.name() == "timeout" && t0.elapsed() + Duration::from_millis(5) < asked => Err(fail(
                &w,
                format!(
                    "wait({asked:?}) returned a timeout after {:?}, before its deadline, while rank 1 was about to issue: {e}",
                    t0.elapsed()
                ),
            )),
            Err(e) if e.name() == "timeout" => Ok(()),
            Err(e) => Err(fail(&w, format!("expected Ok or (past the deadline) a timeout, got {e} [{}]", e.name()))),
        };
        let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined: {e}")))?;
        verdict?;
        expect_eq(b, out, &sum, &w)
    }));
    v.push(Case::<B>::new("async::timeout_names_its_sequence_number::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // progress.recorded: a timeout names the collective and ITS sequence number, the one the
        // in-flight record holds for it. Rank 0 issues two all_reduces rank 1 has not issued
        // yet; each short wait times out; the two errors name two different numbers, each
        // recorded in flight for an all_reduce issued here. Rank 1 then joins; both complete.
        let b = ctx.b;
        let w = here(b, "all_reduce", "out", DType::F32);
        let key = format!("{}/{}/go", ctx.case, ctx.world.world_id);
        let x = b.upload(&rank_tensor(b, 8))?;
        let sum = full(&[8], rank_sum(b, b.world_size()));
        if b.rank() != 0 {
            take_key(ctx, &key, &w, "rank 0 never said its short waits had timed out")?;
            for _ in 0..2 {
                let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e}")))?;
                expect_eq(b, &out, &sum, &w)?;
            }
            return Ok(());
        }
        let same = |a: &progress::InFlight, z: &progress::InFlight| a.backend == z.backend && a.seq == z.seq;
        let before = progress::in_flight();
        let works = [b.all_reduce(&x, red(b))?, b.all_reduce(&x, red(b))?];
        let recorded: Vec<u64> = progress::in_flight()
            .into_iter()
            .filter(|f| f.op.contains("all_reduce") && !before.iter().any(|o| same(o, f)))
            .map(|f| f.seq)
            .collect();
        let mut named = Vec::new();
        let mut verdict = Ok(());
        for (i, work) in works.iter().enumerate() {
            match work.wait(Duration::from_millis(20)) {
                Err(CollectiveError::Timeout { op, seq, .. }) if op.contains("all_reduce") => named.push(seq),
                Ok(_) => verdict = Err(fail(&w, format!("all_reduce #{i} of 2: wait returned Ok before rank 1 had issued it"))),
                Err(e) => verdict = Err(fail(&w, format!("all_reduce #{i} of 2 before rank 1 issued: expected a timeout naming all_reduce, got {e} [{}]", e.name()))),
            }
        }
        ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
        for work in &works {
            let out = work.wait(ctx.timeout).map_err(|e| fail(&w, format!("after rank 1 joined: {e}")))?;
            expect_eq(b, out, &sum, &w)?;
        }
        verdict?;
        if named.len() == 2 && (named[0] == named[1] || named.iter().any(|q| !recorded.contains(q))) {
            return Err(fail(
                &w,
                format!(
                    "the timeouts of two pending all_reduces name sequence numbers {named:?}; the in-flight record holds {recorded:?} for them: \
                     a timeout must name its own collective's number"
                ),
            ));
        }
        Ok(())
    }));
    v.push(Case::<B>::new(
        "async::dropped_work_still_runs_for_its_peers::ws2",
        CaseMeta { reduce: "sum,max,min".into(), ..meta("all_reduce", "inplace,out") },
        2,
        |ctx| {
            // Dropping a work does not withdraw its collective: rank 0 issues an all_reduce_ (then an
            // all_reduce) and drops the work at once (fire and forget); rank 1 waits for its own
            // side, which needs rank 0's, and MUST get the sum. A last all_reduce checks both ranks
            // are still in step.
            // The all_reduces only carry the check: a reduce op the backend supports in both variants.
            let b = ctx.b;
            let ws = b.world_size();
            let v = ArVehicle::pick(b, &[Variant::InPlace, Variant::Out])?;
            let rank_sum = |_: usize| v.fold((1..=ws).map(|r| r as f32));
            for (round, variant) in ["inplace", "out"].into_iter().enumerate() {
                let w = format!("{} reduce={} (rank 0 drops its work un-waited)", here(b, "all_reduce", variant, DType::F32), v.op.name());
                let x = b.upload(&full(&[16], ((b.rank() + 1) * (round + 1)) as f32))?;
                let work = if variant == "inplace" { b.all_reduce_(&x, v.op)? } else { b.all_reduce(&x, v.op)? };
                if b.rank() == 0 {
                    drop(work);
                    continue;
                }
                let out = work
                    .wait(ctx.timeout)
                    .map_err(|e| fail(&w, format!("rank 0 issued its side and dropped the work; this rank's wait: {e} [{}]", e.name())))?;
                expect_eq(b, out, &full(&[16], (rank_sum(ws) as usize * (round + 1)) as f32), &w)?;
            }
            let w = format!("{} reduce={} (after rank 0 dropped two works)", here(b, "all_reduce", "out", DType::F32), v.op.name());
            let x = b.upload(&full(&[16], 10.0 * (b.rank() + 1) as f32))?;
            let out = b.all_reduce(&x, v.op)?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
            expect_eq(b, &out, &full(&[16], 10.0 * rank_sum(ws)), &w)
        },
    ));
    v.push(Case::<B>::new("async::failed_work_reports_completed::ws2", meta_any_reduce("all_reduce", "out"), 2, |ctx| {
        // is_completed() is true once the op has failed, not only on success: a caller polling
        // it (`while not work.is_completed()`) sees a failed op end. The ranks' shapes differ
        // ([4] and [5]); an op that fails at issue has nothing to poll.
        let b = ctx.b;
        super::bad_input::cross_rank_validated(b)?;
        let w = format!("{} shapes=[4] / [5]", here(b, "all_reduce", "out", DType::F32));
        let x = b.upload(&full(&[4 + b.rank()], 1.0f32))?;
        if let Ok(work) = b.all_reduce(&x, red(b)) {
            let limit = POLL_SLACK;
            let t0 = Instant::now();
            while !work.is_completed() && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            let completed = work.is_completed();
            match work.wait(ctx.timeout) {
                Ok(_) => return Err(fail(&w, "an all_reduce of mismatched shapes returned Ok")),
                Err(e) if e.name() == "bad_input:shape_mismatch" => {}
                Err(e) => return Err(fail(&w, format!("expected bad_input:shape_mismatch, got {e} [{}]", e.name()))),
            }
            if !completed {
                return Err(fail(
                    &w,
                    format!("is_completed() stayed false for {limit:?} on an op that fails (its wait returns the named error): a failed op is completed"),
                ));
            }
        }
        let y = b.upload(&rank_tensor(b, 4))?;
        let out = b.all_reduce(&y, red(b))?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("the all_reduce after the failed one: {e}")))?;
        expect_eq(b, &out, &full(&[4], rank_sum(b, b.world_size())), &format!("{w} (the all_reduce after the failed one)"))
    }));
    v.push(Case::<B>::new("async::unwaited_collective_exits_within_1s::ws1", meta("all_reduce", "out"), 1, |ctx| unwaited_exit(ctx, 1)));
    // async.unwaited_exit with the peer absent: a child world of 2 ranks in which rank 1 never
    // issues the all_reduce that rank 0 drops un-waited (rank 1 stays alive until rank 0 has
    // dropped its backend). Rank 0's backend must drop within 3 s of the issue: a backend whose
    // drop finishes its pending ops first waits for a peer that never comes (in the one-rank
    // child every op has completed by the time it is dropped). A case of 2 ranks, so that it
    // runs where a world of 2 can (one device per rank); rank 0 launches the child world, rank 1
    // has nothing to do.
    v.push(Case::<B>::new("async::unwaited_collective_exits_within_3s::peer_absent::ws2", meta("all_reduce", "out"), 2, |ctx| {
        if ctx.rank() != 0 {
            return Ok(());
        }
        unwaited_exit(ctx, 2)
    }));
    // The same with un-waited sends (16 elements and 1 MiB) to a rank that never receives
    // (review8's finding 7): a backend whose drop flushes its sends waits for a receive that
    // never comes.
    v.push(Case::<B>::new("async::unwaited_send_exits_within_3s::peer_absent::ws2", meta("send_recv", "outbuf"), 2, |ctx| {
        if ctx.rank() != 0 {
            return Ok(());
        }
        unwaited_exit_op(ctx, 2, "send")
    }));
    v.push(Case::<B>::new("async::dropped_send_still_delivered::ws2", meta("send_recv", "outbuf"), 2, dropped_send_still_delivered));
    v
}

/// How long a second waiter's `wait(SECOND_WAIT)` may take while another thread waits the same
/// work with the case's deadline (the usual slack of a loaded machine, far below that deadline).
const SECOND_WAIT: Duration = Duration::from_millis(50);
const SECOND_WAIT_SLACK: Duration = Duration::from_secs(1);
/// The helper thread's wait (at most the case's): ample for an all_reduce whose last peer
/// issues ~150 ms after it starts, and what a serialised second waiter is held for.
const HELPER_WAIT: Duration = Duration::from_secs(5);

/// `async::wait_from_another_thread::ws2`: the all_reduce is waited by a helper thread of rank 0
/// (up to 5 s) while rank 1 holds back (a store key); meanwhile rank 0's main thread
/// calls `wait(50 ms)` on the same work, which MUST end in a named timeout within about 1 s
/// (clause `async.deadline`: a work's wait — core's or a backend's completion — that holds a
/// lock across the blocking wait gives the second waiter the first one's whole deadline,
/// review14 finding 4). Then rank 1 issues, and the helper's wait MUST return the result.
fn wait_from_another_thread<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let w = here(b, "all_reduce", "out", DType::F32);
    let key = format!("{}/{}/second_waiter_done", ctx.case, ctx.world.world_id);
    let timeout = ctx.timeout;
    let x = b.upload(&rank_tensor(b, 100))?;
    if b.rank() == 1 {
        // Rank 0 says so only after its second waiter returned: up to the helper's whole wait
        // when the waiters are serialised (the bug this case hunts), so wait past that, for
        // rank 0's message to come first.
        let never = "rank 0 never said its second waiter returned";
        take_keys(ctx, &[key.as_str()], timeout + HELPER_WAIT + Duration::from_secs(1), &w, never)?;
        let out = b.all_reduce(&x, red(b))?.into_value(timeout)?;
        return expect_eq(b, &out, &full(&[100], rank_sum(b, 2)), &w);
    }
    let work = b.all_reduce(&x, red(b))?;
    let started = std::sync::atomic::AtomicBool::new(false);
    let (second, helper) = std::thread::scope(|s| {
        let helper = s.spawn(|| {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            work.wait(timeout.min(HELPER_WAIT)).map(|_| ())
        });
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The helper is inside (or about to enter) its long wait.
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let second = work.wait(SECOND_WAIT).map(|_| ());
        let took = t0.elapsed();
        // Rank 1 issues now, whatever the verdict (the helper's wait then completes).
        let said = ctx.store.set(&key, b"1");
        (said.map(|()| (second, took)), helper.join())
    });
    let helper = helper.map_err(|_| fail(&w, "the waiting thread panicked"))?;
    let (second, took) = second.map_err(|e| fail(&w, e))?;
    let second_verdict = match second {
        Ok(()) => Err(fail(&w, "wait(50 ms) on the main thread returned Ok although rank 1 had not issued the all_reduce")),
        Err(e) if e.name() != "timeout" => Err(fail(&w, format!("wait(50 ms) on the main thread: expected a named timeout, got {e} [{}]", e.name()))),
        Err(_) if took > SECOND_WAIT + SECOND_WAIT_SLACK => Err(fail(
            &w,
            format!(
                "wait({SECOND_WAIT:?}) on the main thread, while a helper thread waited the same work with {:?}, returned after {took:?}: each waiter gets its own deadline (a lock held across the blocking wait queues the second waiter behind the first)", timeout.min(HELPER_WAIT)
            ),
        )),
        Err(_) => Ok(()),
    };
    second_verdict?;
    helper.map_err(|e| fail(&w, format!("the helper thread's wait, after rank 1 issued: {e} [{}]", e.name())))?;
    let out = work.into_value(timeout)?;
    expect_eq(b, &out, &full(&[100], rank_sum(b, 2)), &w)
}

/// How far apart the two waiters of `async::two_threads_wait_one_work` may return once the op
/// completed (the slack of a loaded machine, far below their [`HELPER_WAIT`]).
const WAITERS_APART: Duration = Duration::from_secs(1);

/// `async::two_threads_wait_one_work::ws2` (clause `async.caller_threads`): rank 0 issues an
/// all_reduce and two helper threads wait it (up to 5 s each) while rank 1 holds back (a store
/// key); 50 ms later neither wait may have returned. Then rank 1 issues, rank 0's main thread
/// polls `is_completed()` as a watchdog does, and both waits MUST return `Ok` within 1 s of
/// each other (the same buffer is core's: `Work::wait` returns the one work's value) (a wait on a thread that did not issue waits as the issuer's
/// does; a second waiter neither fails nor sleeps past the op's completion); the work is
/// uncounted once. Then the work is finalised once: rank 0 issues two more all_reduces, rank 1
/// only the first until rank 0 has waited it, and the second MUST still be pending (a request
/// object freed by each of the two waiters is shared by both later ops).
fn two_threads_wait_one_work<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let w = format!("{} (rank 0: two threads wait one work, the main thread polls it)", here(b, "all_reduce", "out", DType::F32));
    let w2 = format!(
        "{} (after two threads waited one work: rank 0 issues two all_reduces, rank 1 the second only once rank 0 waited the first)",
        here(b, "all_reduce", "out", DType::F32)
    );
    let go = format!("{}/{}/go", ctx.case, ctx.world.world_id);
    let next = format!("{}/{}/next", ctx.case, ctx.world.world_id);
    let (timeout, wait) = (ctx.timeout, ctx.timeout.min(HELPER_WAIT));
    let sum = rank_sum(b, 2);
    let x = b.upload(&rank_tensor(b, 64))?;
    let y1 = b.upload(&full(&[48], (b.rank() + 1) as f32 * 2.0))?;
    let y2 = b.upload(&full(&[40], (b.rank() + 1) as f32 * 4.0))?;
    if b.rank() == 1 {
        // Rank 0 says so once both its waiters are waiting (or one returned too early).
        take_keys(ctx, &[go.as_str()], timeout + HELPER_WAIT, &w, "rank 0 never said its two waiters were waiting")?;
        let out = b.all_reduce(&x, red(b))?.into_value(timeout)?;
        expect_eq(b, &out, &full(&[64], sum), &w)?;
        let first = b.all_reduce(&y1, red(b))?.into_value(timeout)?;
        expect_eq(b, &first, &full(&[48], 2.0 * sum), &format!("{w2} first"))?;
        take_keys(ctx, &[next.as_str()], timeout, &w2, "rank 0 never said it had looked at its second all_reduce")?;
        let second = b.all_reduce(&y2, red(b))?.into_value(timeout)?;
        return expect_eq(b, &second, &full(&[40], 4.0 * sum), &format!("{w2} second"));
    }
    let base = b.outstanding();
    let work = b.all_reduce(&x, red(b))?;
    let entered = std::sync::atomic::AtomicUsize::new(0);
    let (seen, joined) = std::thread::scope(|s| {
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let t0 = Instant::now();
                    let r = work.wait(wait).map(|out| b.buffer_addr(out));
                    (r, t0.elapsed(), Instant::now())
                })
            })
            .collect();
        while entered.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        // Both waiters are inside (or about to enter) their waits.
        std::thread::sleep(Duration::from_millis(50));
        let early: Vec<usize> = (0..2).filter(|&i| waiters[i].is_finished()).collect();
        // Rank 1 issues now, whatever was seen; the main thread polls like a watchdog.
        let said = ctx.store.set(&go, b"1");
        let t0 = Instant::now();
        while !work.is_completed() && t0.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(1));
        }
        let polled = work.is_completed();
        let joined: Vec<_> = waiters.into_iter().map(|h| h.join()).collect();
        (said.map(|()| (early, polled)), joined)
    });
    let (early, polled) = seen.map_err(|e| fail(&w, e))?;
    let mut outs = Vec::new();
    for (i, j) in joined.into_iter().enumerate() {
        let (r, took, at) = j.map_err(|_| fail(&w, format!("waiting thread {i} panicked")))?;
        match r {
            Ok(addr) if early.contains(&i) => {
                return Err(fail(
                    &w,
                    format!("the wait on waiting thread {i} (not the issuing thread) returned Ok after {took:?}, before rank 1 had issued the all_reduce: a wait on any thread waits as one on the issuing thread does (buffer {addr:#x})"),
                ))
            }
            Ok(_) => outs.push((i, at)),
            Err(e) => {
                return Err(fail(
                    &w,
                    format!("the wait on waiting thread {i}, while another thread waited the same work, failed after {took:?}: {e} [{}]: every waiter gets the op's outcome", e.name()),
                ));
            }
        }
    }
    let (first, last) = (outs.iter().map(|o| o.1).min(), outs.iter().map(|o| o.1).max());
    if let (Some(first), Some(last)) = (first, last) {
        let apart = last - first;
        if apart > WAITERS_APART {
            let late = outs.iter().max_by_key(|o| o.1).map_or(0, |o| o.0);
            return Err(fail(
                &w,
                format!("waiting thread {late} returned Ok {apart:?} after the other thread's wait of the same work had returned Ok: each waiter returns once the op completes, not at its own deadline ({wait:?})"),
            ));
        }
    }
    if !polled {
        return Err(fail(
            &w,
            format!(
                "is_completed() polled on the main thread stayed false for {wait:?} after rank 1 issued, while two threads waited the work"
            ),
        ));
    }
    let out = work.wait(timeout).map_err(|e| fail(&w, format!("the main thread's wait after both waiters returned: {e}")))?;
    expect_eq(b, out, &full(&[64], sum), &w)?;
    if b.outstanding() != base {
        return Err(fail(
            &w,
            format!(
                "outstanding() = {} after three waits of one work ({base} before it was issued): a work is uncounted once",
                b.outstanding()
            ),
        ));
    }
    drop(work);
    // Finalised once: the two later ops have a request each.
    let first = b.all_reduce(&y1, red(b))?;
    let second = b.all_reduce(&y2, red(b))?;
    let got = first.wait(timeout).map_err(|e| fail(&w2, format!("wait of the first: {e}")))?;
    expect_eq(b, got, &full(&[48], 2.0 * sum), &format!("{w2} first"))?;
    let completed = second.is_completed();
    let polled = second.wait(Duration::from_millis(20)).map(|_| ());
    let said = ctx.store.set(&next, b"1");
    match (completed, polled) {
        (false, Err(e)) if e.name() == "timeout" => {}
        (completed, polled) => {
            return Err(fail(
                &w2,
                format!(
                    "the second all_reduce, which rank 1 had not issued, read is_completed() = {completed} and wait(20 ms) = {}: a work's completion is its own, finalised once however many threads waited the work before it",
                    match polled {
                        Ok(()) => "Ok".to_string(),
                        Err(e) => format!("{e} [{}]", e.name()),
                    }
                ),
            ))
        }
    }
    said.map_err(|e| fail(&w2, e))?;
    let got = second.wait(timeout).map_err(|e| fail(&w2, format!("wait of the second: {e}")))?;
    expect_eq(b, got, &full(&[40], 4.0 * sum), &format!("{w2} second"))
}

/// `async::communicators_progress_apart::ws3`: with `G = new_group([0, 1])`, rank 0 issues
/// `G.all_reduce` then `world.all_reduce` and waits the world op first; rank 1 issues the world
/// op, waits it, and only then issues `G.all_reduce`; rank 2 issues the world op. Every op MUST
/// complete (clause `async.communicators_independent`: communicators progress independently, an
/// op on one never waits for an op of another). A backend running every communicator of the
/// process on one serial engine (one stream for every communicator) queues rank 0's world op
/// behind G, which waits for rank 1, which waits for the world op: review14 finding 3.
fn communicators_progress_apart<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    if !b.capabilities().subgroups {
        return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    super::util::communicators_in_any_order(b)?;
    let members = [0, 1];
    let (me, timeout) = (b.rank(), ctx.timeout);
    let g = ctx.group(&members)?;
    let w = format!(
        "{} group={members:?} (rank 0: group op then world op, waits the world op first; rank 1: world op waited, then group op)",
        here(b, "all_reduce", "out", DType::F32)
    );
    let x = b.upload(&rank_tensor(b, 4))?;
    let world_sum = full(&[4], rank_sum(b, 3));
    let waited = |what: &str, e: CollectiveError| {
        fail(&w, format!("{what}: {e} [{}]; communicators progress independently: an op on one never waits for an op of another", e.name()))
    };
    match (me, g) {
        (0, Some(g)) => {
            let gx = g.upload(&rank_tensor(g, 4))?;
            let gw = g.all_reduce(&gx, red(g)).map_err(|e| waited("group all_reduce issue", e))?;
            let ww = b.all_reduce(&x, red(b)).map_err(|e| waited("world all_reduce issue (a group op in flight)", e))?;
            let wout =
                ww.into_value(timeout).map_err(|e| waited("world all_reduce wait (the group op issued before it still pending)", e))?;
            let gout = gw.into_value(timeout).map_err(|e| waited("group all_reduce wait", e))?;
            expect_eq(b, &wout, &world_sum, &format!("{w} world result"))?;
            expect_eq(g, &gout, &full(&[4], rank_sum(g, 2)), &format!("{w} group result"))
        }
        (1, Some(g)) => {
            let wout = b.all_reduce(&x, red(b))?.into_value(timeout).map_err(|e| waited("world all_reduce wait", e))?;
            expect_eq(b, &wout, &world_sum, &format!("{w} world result"))?;
            let gx = g.upload(&rank_tensor(g, 4))?;
            let gout = g.all_reduce(&gx, red(g))?.into_value(timeout).map_err(|e| waited("group all_reduce wait", e))?;
            expect_eq(g, &gout, &full(&[4], rank_sum(g, 2)), &format!("{w} group result"))
        }
        _ => {
            let wout = b.all_reduce(&x, red(b))?.into_value(timeout).map_err(|e| waited("world all_reduce wait", e))?;
            expect_eq(b, &wout, &world_sum, &format!("{w} world result"))
        }
    }
}

/// Lengths of the sends [`dropped_send_still_delivered`] drops: small, then 1 MiB of f32.
const DROPPED_SENDS: [usize; 2] = [16, 1 << 18];

/// `async::dropped_send_still_delivered::ws2`: rank 0 issues two sends to rank 1 and drops both
/// works at once, un-waited (fire and forget), then says so; only then does rank 1 post its two
/// receives, which MUST complete with the messages: dropping a work never withdraws its op
/// (review8's finding 7: a send held as a future, cancelled with its handle, never arrives).
/// Then the same for a dropped receive ([`dropped_recv_not_withdrawn`]).
fn dropped_send_still_delivered<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let w = format!("{} lens={DROPPED_SENDS:?} (rank 0 drops its sends' works un-waited)", here(b, "send_recv", "outbuf", DType::F32));
    let key = format!("{}/{}/sends_dropped", ctx.case, ctx.world.world_id);
    let msg = |k: usize, n: usize| Tensor::from_vec(&[n], (0..n).map(|i| (k * 1000 + i % 991 + 1) as f32).collect());
    let wait = ctx.timeout;
    if b.rank() == 0 {
        let xs = DROPPED_SENDS.iter().enumerate().map(|(k, &n)| b.upload(&msg(k, n))).collect::<Result<Vec<_>, _>>()?;
        for x in &xs {
            drop(b.send(x, 1).map_err(|e| fail(&w, format!("issuing a send: {e} [{}]", e.name())))?);
        }
        ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
        return dropped_recv_not_withdrawn(ctx);
    }
    take_key(ctx, &key, &w, "rank 0 never said it dropped its sends")?;
    let outs = DROPPED_SENDS.iter().map(|&n| b.alloc(DType::F32, &[n])).collect::<Result<Vec<_>, _>>()?;
    let recvs = outs.iter().map(|o| b.recv(o, 0)).collect::<Result<Vec<_>, _>>()?;
    for (k, r) in recvs.iter().enumerate() {
        r.wait(wait).map_err(|e| {
            fail(
                &w,
                format!(
                    "receive #{k} (of {} elements): {e} [{}]; rank 0 issued the send and dropped its work un-waited: the send still runs",
                    DROPPED_SENDS[k],
                    e.name()
                ),
            )
        })?;
    }
    for (k, (o, &n)) in outs.iter().zip(&DROPPED_SENDS).enumerate() {
        expect_eq(b, o, &msg(k, n), &format!("{w}: receive #{k}"))?;
    }
    dropped_recv_not_withdrawn(ctx)
}

/// Elements of the two messages of [`dropped_recv_not_withdrawn`].
const DROPPED_RECV_LEN: usize = 16;

/// The second phase of `async::dropped_send_still_delivered::ws2` (review14 finding 2): rank 1
/// posts receive A and drops its work at once (`dist.irecv`, the buffer read later), then says
/// so; rank 0 sends messages 2 and 3; rank 1 posts receive B and waits it. B MUST hold message 3
/// (the k-th receive gets the k-th send) and A's buffer, still held, message 2 (polled up to the
/// case's deadline: nothing waits A): dropping a receive's work never withdraws it (a receive
/// cancelled on drop leaves message 2 to B, and message 3 to no one).
fn dropped_recv_not_withdrawn<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let n = DROPPED_RECV_LEN;
    let w =
        format!("{} len={n} (rank 1 drops receive A's work un-waited, then posts receive B)", here(b, "send_recv", "outbuf", DType::F32));
    let key = format!("{}/{}/recv_dropped", ctx.case, ctx.world.world_id);
    let msg = |k: usize| Tensor::from_vec(&[n], (0..n).map(|i| (k * 1000 + i + 1) as f32).collect());
    let wait = ctx.timeout;
    if b.rank() == 0 {
        take_keys(ctx, &[&key], wait, &w, "rank 1 never said it dropped receive A")?;
        let xs = [b.upload(&msg(2))?, b.upload(&msg(3))?];
        let sends = xs.iter().map(|x| b.send(x, 1)).collect::<Result<Vec<_>, _>>()?;
        for (k, s) in sends.iter().enumerate() {
            s.wait(wait).map_err(|e| {
                fail(
                    &w,
                    format!(
                        "send of message {}: {e} [{}]; rank 1 posted two receives (one dropped un-waited): both sends match",
                        k + 2,
                        e.name()
                    ),
                )
            })?;
        }
        return Ok(());
    }
    let out_a = b.alloc(DType::F32, &[n])?;
    drop(b.recv(&out_a, 0).map_err(|e| fail(&w, format!("issuing receive A: {e} [{}]", e.name())))?);
    ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
    let out_b = b.alloc(DType::F32, &[n])?;
    b.recv(&out_b, 0)?.wait(wait).map_err(|e| fail(&w, format!("receive B: {e} [{}]", e.name())))?;
    expect_eq(
        b,
        &out_b,
        &msg(3),
        &format!("{w}: receive B (the second receive gets the second send, message 3; message 2 here means dropping receive A's work withdrew it)"),
    )?;
    let t0 = Instant::now();
    loop {
        // A backend that moves no data (the fake) has nothing to poll for: `expect_eq` checks
        // only the buffer's dtype and shape there.
        let got = b.download(&out_a)?;
        if !b.capabilities().moves_data || got == msg(2) || t0.elapsed() > wait {
            return expect_eq(b, &out_a, &msg(2), &format!("{w}: receive A's buffer (its work dropped un-waited: the receive still runs)"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The exit code of an [`unwaited_child`] rank whose backend refused to start (`Unsupported`).
const UNSUPPORTED_EXIT: i32 = 7;

/// How long rank 0 of a 2-rank child may take to drop its backend with an un-waited
/// collective its peer never issued: the op must be ended, not finished (a backend that waits
/// for pending ops waits for a peer that never comes).
const PEER_ABSENT_DROP: Duration = Duration::from_secs(3);

/// The un-waited-exit cases: a child world of `ranks` ranks ([`unwaited_child`]); rank 0 says
/// when it has issued (`issued`) and how long its backend took to drop (`dropped <µs>`, timed in
/// the child): within 1 s with one rank, [`PEER_ABSENT_DROP`] with two; the world exits cleanly.
fn unwaited_exit<B: Backend>(ctx: &mut crate::case::Ctx<'_, B>, ranks: usize) -> crate::case::CaseResult {
    unwaited_exit_op(ctx, ranks, "all_reduce")
}

/// [`unwaited_exit`] with the op rank 0 drops: `all_reduce`, or `send` (2 ranks; [`CHILD_OP_ENV`]).
fn unwaited_exit_op<B: Backend>(ctx: &mut crate::case::Ctx<'_, B>, ranks: usize, op: &str) -> crate::case::CaseResult {
    let b = ctx.b;
    let w = if op == "send" {
        format!(
            "{} child world of {ranks} (rank 0 drops un-waited sends to rank 1, which never receives)",
            here(b, "send_recv", "outbuf", DType::F32)
        )
    } else {
        format!("{} child world of {ranks}", here(b, "all_reduce", "out", DType::F32))
    };
    let backend = ctx.case.split("::").next().unwrap_or_default().to_string();
    // A world started by the harness launcher (which removes its files).
    let mut spec = concord_harness::launch::LaunchSpec::current_exe(ranks, &backend).map_err(|e| fail(&w, e))?;
    spec.args.clear();
    spec.pipe_stdout = true;
    spec.op_timeout = Duration::from_secs(5);
    spec.options = ctx.world.options.clone();
    spec.env = vec![(CHILD_ENV.to_string(), backend.clone()), (CHILD_OP_ENV.to_string(), op.to_string())];
    let mut child = concord_harness::launch::launch(&spec).map_err(|e| fail(&w, format!("launch the child: {e}")))?;
    // The clock starts when the child says it has issued the collective (backend start-up,
    // e.g. a CUDA context and an NCCL communicator, is not part of the 1 s).
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.take_stdout(0).expect("piped");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let line = line.trim().to_string();
            if line == "issued" || line.starts_with("dropped") || line.starts_with("unsupported ") {
                let _ = tx.send((line, Instant::now()));
            }
        }
    });
    let limit = Duration::from_secs(30);
    let report = child.wait(limit);
    let exited = Instant::now();
    // The drop's time, from the issue's report to the backend's drop, as the child measured it.
    let (mut issued, mut dropped, mut unsupported) = (None, None, None);
    while let Ok((line, at)) = rx.recv_timeout(Duration::from_millis(500)) {
        if line == "issued" {
            issued = Some(at);
        } else if let Some(why) = line.strip_prefix("unsupported ") {
            unsupported = Some(why.to_string());
        } else {
            dropped = line.strip_prefix("dropped ").and_then(|us| us.parse::<u64>().ok()).map(Duration::from_micros);
        }
    }
    let err = "in the ranks' stderr tails below";
    if let Some(why) = unsupported.filter(|_| report.ranks.iter().any(|r| r.status.and_then(|s| s.code()) == Some(UNSUPPORTED_EXIT))) {
        return Err(crate::case::CaseEnd::Unsupported(format!(
            "the backend cannot start in a world of {ranks} launched by the case: {why}"
        )));
    }
    if let Some(r) = report.ranks.iter().find(|r| r.ended_by_launcher || r.status.is_none()) {
        return Err(fail(&w, format!("child rank {} did not exit within {limit:?} (killed); stderr: {err}", r.rank)));
    }
    if let Some(r) = report.ranks.iter().find(|r| !r.status.is_some_and(|s| s.success())) {
        return Err(fail(&w, format!("child rank {} exited with {:?}; stderr: {err}", r.rank, r.status)));
    }
    let Some(at) = issued else {
        return Err(fail(&w, format!("the child exited without reporting the issued collective; stderr: {err}")));
    };
    // With its peer absent, the drop has to end an op that can never complete (abort its
    // communicator: on NCCL, `ncclCommAbort`, 1.7 s measured on 2 x H200): bounded, not 1 s.
    let bound = if ranks > 1 { PEER_ABSENT_DROP } else { Duration::from_secs(1) };
    if let Some(d) = dropped.filter(|d| *d > bound) {
        return Err(fail(&w, format!("rank 0 took {d:?} from issuing an un-waited collective to dropping its backend (limit {bound:?})")));
    }
    if ranks == 1 && exited.duration_since(at) > Duration::from_secs(1) {
        return Err(fail(
            &w,
            format!("the child took {:?} from issuing an un-waited collective to exiting (limit 1 s)", exited.duration_since(at)),
        ));
    }
    if dropped.is_none() {
        return Err(fail(&w, format!("rank 0 exited without reporting its backend dropped; stderr: {err}")));
    }
    Ok(())
}

/// Rank 0 of `b` issues an all_reduce that rank 1 of `b` issues only once rank 0 has looked at
/// `concord_core::progress`: the all_reduce must be listed in flight there, and complete.
fn all_reduce_recorded_while_peer_absent<B: Backend, C: Backend>(ctx: &crate::case::Ctx<'_, C>, b: &B, w: &str) -> crate::case::CaseResult {
    let key = format!("{}/{}/go", ctx.case, ctx.world.world_id);
    let x = b.upload(&rank_tensor(b, 16))?;
    if b.rank() == 0 {
        let same = |a: &progress::InFlight, z: &progress::InFlight| a.backend == z.backend && a.seq == z.seq;
        let before = progress::in_flight();
        let work = b.all_reduce(&x, red(b))?;
        let recorded: Vec<progress::InFlight> =
            progress::in_flight().into_iter().filter(|f| f.op.contains("all_reduce") && !before.iter().any(|o| same(o, f))).collect();
        let state = progress::describe();
        ctx.store.set(&key, b"1").map_err(|e| fail(w, e))?;
        let out = work.wait(ctx.timeout).map_err(|e| fail(w, format!("after rank 1 joined: {e}")))?;
        expect_eq(b, out, &full(&[16], rank_sum(b, 2)), w)?;
        if recorded.is_empty() {
            return Err(fail(
                w,
                format!("an all_reduce waiting for rank 1 is not recorded in flight (concord_core::progress::describe(): {state})"),
            ));
        }
        Ok(())
    } else {
        take_key(ctx, &key, w, "rank 0 never said it had looked at its op in flight")?;
        let out = b.all_reduce(&x, red(b))?.into_value(ctx.timeout)?;
        expect_eq(b, &out, &full(&[16], rank_sum(b, 2)), w)
    }
}

/// Body of the un-waited-exit child. One rank: a large all_reduce and an in-place `all_reduce_`
/// issued, never waited, then return from main. Two ranks: rank 0 issues an all_reduce that
/// rank 1 never issues (with [`CHILD_OP_ENV`] `=send`: two sends, 16 elements and 1 MiB, that
/// rank 1 never receives) and drops it un-waited; rank 1 waits (store key, at most 20 s) until rank
/// 0 has dropped its backend. Rank 0 prints `issued` and, once its backend is dropped, `dropped`.
pub fn unwaited_child<B: Backend>() -> ! {
    use std::io::Write;
    let Some(world) = concord_harness::launch::rank_world() else {
        eprintln!("unwaited child: not started by the harness launcher");
        std::process::exit(3)
    };
    let key = format!("{}/unwaited/dropped", world.world_id);
    // Opened before init and held to the end (a file store goes away when its last user leaves).
    let store = (world.world_size > 1).then(|| concord_store::Store::open(&world.store_path, world.world_size, Duration::from_secs(20)));
    let code = match B::init(&world) {
        Ok(b) if world.rank > 0 => match store.expect("two ranks").and_then(|s| s.wait(&[key.as_str()], Duration::from_secs(20))) {
            Ok(()) => {
                drop(b);
                0
            }
            Err(e) => {
                eprintln!("unwaited child rank {}: rank 0 never said it dropped its backend: {e}", world.rank);
                6
            }
        },
        Ok(b) => {
            let issued = if world.world_size == 1 {
                // An out-of-place and an in-place collective (a backend may pin the caller's buffer).
                b.upload(&full(&[4 << 20], 1.0f32)).and_then(|x| b.all_reduce(&x, ReduceOp::Sum)).and_then(|out_of_place| {
                    let x = b.upload(&full(&[16], 1.0f32))?;
                    Ok(vec![out_of_place.map(Some), b.all_reduce_(&x, ReduceOp::Sum)?.map(Some)])
                })
            } else if std::env::var(CHILD_OP_ENV).is_ok_and(|op| op == "send") {
                // Sends to rank 1, which never receives: small and 1 MiB (a large-message path).
                [16, 1 << 18]
                    .into_iter()
                    .map(|n| b.upload(&full(&[n], 1.0f32)).and_then(|x| b.send(&x, 1)))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|sends| sends.into_iter().map(|w| w.map(|()| None)).collect::<Vec<_>>())
            } else {
                b.upload(&full(&[16], 1.0f32)).and_then(|x| b.all_reduce(&x, ReduceOp::Sum)).map(|w| vec![w.map(Some)])
            };
            match issued {
                Ok(works) => {
                    println!("issued");
                    let _ = std::io::stdout().flush();
                    let at = std::time::Instant::now();
                    drop(works); // never waited
                    drop(b);
                    // Timed here, not by the parent's reader (a loaded parent reads late).
                    println!("dropped {}", at.elapsed().as_micros());
                    let _ = std::io::stdout().flush();
                    if let Some(store) = store {
                        if let Err(e) = store.and_then(|s| s.set(&key, b"1")) {
                            eprintln!("unwaited child: could not tell rank 1: {e}");
                        }
                    }
                    0
                }
                Err(e) => {
                    eprintln!("unwaited child: issue failed: {e}");
                    4
                }
            }
        }
        // A backend that cannot start in a world Concord launches itself (the mpi backend
        // outside mpirun): the case is unsupported there, with the backend's reason.
        Err(concord_core::CollectiveError::Unsupported(why)) => {
            println!("unsupported {why}");
            let _ = std::io::stdout().flush();
            UNSUPPORTED_EXIT
        }
        Err(e) => {
            eprintln!("unwaited child: init failed: {e}");
            5
        }
    };
    std::process::exit(code)
}

/// How long op #1 of the `earlier_op_completes_before_a_later_one_is_issued` cases may stay
/// pending after rank 1 said it finished it, and the step of rank 0's waits meanwhile.
const LAG: Duration = Duration::from_secs(4);
const LAG_STEP: Duration = Duration::from_millis(100);

/// How long ago this rank first saw the peer's "done" (`seen` now: noted in `at` the first
/// time); zero while it has not.
fn done_after(at: &mut Option<Instant>, seen: bool) -> Duration {
    if seen {
        at.get_or_insert_with(Instant::now).elapsed()
    } else {
        Duration::ZERO
    }
}

/// `async::earlier_op_completes_before_a_later_one_is_issued::{op}::ws2` for an out-of-place
/// `op` (f32, sum): rank 0 issues #1 and #2 back to back and waits #1; rank 1 issues #2 only
/// after rank 0 has seen #1 complete. #1 must complete once both ranks issued it, whatever rank 0
/// issued after it (clause `async.every_op_every_rank`); both results are checked against the
/// oracle.
fn earlier_completes_before_later<B: Backend>(ctx: &mut Ctx<'_, B>, op: concord_core::OpKind) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let w = here(b, op.name(), "out", DType::F32);
    let p = exec::Params { reduce: op.reduces().then_some(ReduceOp::Sum), ..Default::default() };
    let coll = exec::collective(op, &p, ws).ok_or_else(|| fail(&w, "suite bug: the op moves no data"))?;
    let prefix = format!("{}/{}", ctx.case, ctx.world.world_id);
    let (seen, done1) = (format!("{prefix}/first_seen"), format!("{prefix}/first_done_on_1"));
    let inputs = |n: usize, salt: usize| -> Vec<Tensor> {
        (0..ws).map(|r| Tensor::from_vec(&[n], (0..n).map(|e| (100 * salt + 10 * r + e) as f32).collect())).collect()
    };
    let (in1, in2) = (inputs(16, 1), inputs(8, 2));
    let (x, y) = (b.upload(&in1[me])?, b.upload(&in2[me])?);
    let issue = |t: &B::Buffer| exec::issue(b, op, Variant::Out, std::slice::from_ref(t), None, &p);
    let named = |step| super::util::step_failed(&w, step);
    if me == 1 {
        let out = issue(&x).map_err(named("issue #1"))?.into_values(ctx.timeout).map_err(named("op #1"))?;
        ctx.store.set(&done1, b"1").map_err(|e| fail(&w, e))?;
        take_keys(ctx, &[&seen], ctx.timeout * 2, &w, "rank 0 never said it saw op #1 end")?;
        // #2 is issued whatever #1 held (rank 0 waits for it); both are checked after.
        let out2 = issue(&y).map_err(named("issue #2"))?.into_values(ctx.timeout).map_err(named("op #2"))?;
        super::util::expect_oracle(b, &coll, &in1, &out[0], &format!("{w} (op #1)"))?;
        return super::util::expect_oracle(b, &coll, &in2, &out2[0], &format!("{w} (op #2)"));
    }
    let first = issue(&x).map_err(named("issue #1"))?;
    let second = issue(&y).map_err(named("issue #2"))?;
    let t0 = Instant::now();
    let mut done_at: Option<Instant> = None;
    let verdict = loop {
        match first.wait(LAG_STEP) {
            Ok(()) => break Ok(()),
            Err(e) if e.name() != "timeout" => break Err(fail(&w, format!("op #1: {e}"))),
            Err(_) if done_after(&mut done_at, ctx.store.check(&[done1.as_str()]).unwrap_or(false)) > LAG => {
                break Err(fail(
                    &w,
                    format!(
                        "{} #1 is still pending {:?} after issue, at least {LAG:?} after rank 1 finished it; the only other op this \
                         rank has issued (#2) waits for rank 1, which issues it only once #1 has completed here: an op must \
                         complete once its peers have issued it, not with the ops issued after it",
                        op.name(),
                        t0.elapsed()
                    ),
                ))
            }
            Err(_) if t0.elapsed() > ctx.timeout => {
                break Err(fail(&w, format!("op #1 pending after {:?}; rank 1 never finished it", t0.elapsed())))
            }
            Err(_) => {}
        }
    };
    // Rank 1 goes on either way, so that #2 (and the world) ends.
    ctx.store.set(&seen, b"1").map_err(|e| fail(&w, e))?;
    let second = second.into_values(ctx.timeout).map_err(named("op #2"));
    verdict?;
    let first = first.into_values(ctx.timeout).map_err(named("op #1"))?;
    super::util::expect_oracle(b, &coll, &in1, &first[0], &format!("{w} (op #1)"))?;
    let _ = ctx.store.delete_key(&done1);
    super::util::expect_oracle(b, &coll, &in2, &second?[0], &format!("{w} (op #2)"))
}

/// One call of the `::every_op` cases: an (op, variant) of [`exec::PAIRS`] (its index `i`) that
/// is no declared gap for f32 (sum where it reduces; a gap is the same on every rank, so every
/// rank skips it), with its parameters (root the last rank, a ring permutation, the partner for
/// send / recv), `n` elements per input and `tensors` inputs (two for the coalesced variants).
struct EveryOpCall {
    i: usize,
    op: concord_core::OpKind,
    variant: Variant,
    params: exec::Params,
    n: usize,
    tensors: usize,
}

fn every_op_calls<B: Backend>(b: &B) -> Vec<EveryOpCall> {
    let (ws, me, caps) = (b.world_size(), b.rank(), b.capabilities());
    let mut v = Vec::new();
    for (i, &(op, variant)) in exec::PAIRS.iter().enumerate() {
        let reduce = op.reduces().then_some(ReduceOp::Sum);
        if caps.check(op, Some(variant), Some(DType::F32), reduce, ws).is_err() {
            continue;
        }
        let params = exec::Params {
            reduce,
            root: ws - 1,
            src_dst: (0..ws).map(|r| (r + 1) % ws).collect(),
            peer: crate::values::partner(me, ws),
            ..Default::default()
        };
        let tensors = if matches!(variant, Variant::Coalesced | Variant::CoalescedInPlace) { 2 } else { 1 };
        v.push(EveryOpCall { i, op, variant, params, n: 2 * ws, tensors });
    }
    v
}

/// `async::completes_without_wait::every_op::ws2`: every (op, variant) of [`exec::PAIRS`] in
/// turn (f32, `sum` for the reducing ops, root the last rank, a rotation for permute, send / recv
/// with the partner), issued on both ranks; once both have issued (a store handshake), the
/// work's `is_completed()` — a pair's send and recv both — MUST turn true without any `wait`
/// (clause `async.every_op_every_rank`: a backend whose ops progress only inside `wait` spins a
/// polling caller for ever; `async::completes_without_wait::ws2` checks the all_reduce alone), and
/// the result read right then, before any wait, MUST already be the oracle's (clause
/// `async.completed_means_final`: a completion flag set before the result is in the buffer the
/// op returned hands a polling caller stale bytes). Then the work is waited and its result
/// checked again. Every op is issued and waited on both ranks even after a failure (the first
/// failure is the verdict; later ops are not polled). The first op that never completes without a
/// wait is polled for half the case's wait deadline, at most 5 s, as the all_reduce case does.
fn completes_without_wait_every_op<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    completes_without_wait_calls(ctx, every_op_calls(ctx.b))
}

/// Elements per input of `async::completes_without_wait::every_op::large::ws2` (1 MiB of f32: a
/// backend's chunked or staged large-message path).
const LARGE_POLLED: usize = 1 << 18;

/// `async::completes_without_wait::every_op::large::ws2`: the same with 1 MiB inputs, for the
/// out-of-place all_reduce, all_gather, reduce_scatter, broadcast and send / recv, and the
/// in-place all_reduce, coalesced all_reduce and broadcast. A backend whose large path stages
/// its result and copies it into the buffer it returned (or, in place, back into the caller's
/// buffer: review14 finding 1) only inside `wait` reports completion before the result is final
/// there (the small calls above take another path).
fn completes_without_wait_large<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let large = [
        (concord_core::OpKind::AllReduce, Variant::Out),
        (concord_core::OpKind::AllReduce, Variant::InPlace),
        (concord_core::OpKind::AllReduce, Variant::CoalescedInPlace),
        (concord_core::OpKind::AllGatherIntoTensor, Variant::Out),
        (concord_core::OpKind::ReduceScatterTensor, Variant::Out),
        (concord_core::OpKind::Broadcast, Variant::Out),
        (concord_core::OpKind::Broadcast, Variant::InPlace),
        (concord_core::OpKind::SendRecv, Variant::OutBuf),
    ];
    let calls = every_op_calls(ctx.b)
        .into_iter()
        .filter(|c| large.contains(&(c.op, c.variant)))
        .map(|c| EveryOpCall { n: LARGE_POLLED, ..c })
        .collect::<Vec<_>>();
    if calls.is_empty() {
        return Err(CaseEnd::Unsupported("every op of the large polls is a declared gap for f32".into()));
    }
    completes_without_wait_calls(ctx, calls)
}

fn completes_without_wait_calls<B: Backend>(ctx: &mut Ctx<'_, B>, calls: Vec<EveryOpCall>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    let sem = concord_oracle::Semantics::of(&caps);
    let mut first: CaseResult = Ok(());
    // As `async::completes_without_wait::ws2` (generous: a loaded machine delays a progress thread).
    let mut limit = (ctx.timeout / 2).min(Duration::from_secs(5));
    for EveryOpCall { i, op, variant, params: a, n, tensors } in calls {
        let w = format!("{} (both ranks issued; is_completed() polled, no wait)", here(b, op.name(), &variant.to_string(), DType::F32));
        // Distinct per op, rank, tensor and element (exact in f32).
        let input = |r: usize, t: usize| Tensor::from_vec(&[n], (0..n).map(|e| (1000 * (i + 1) + 100 * r + 10 * t + e) as f32).collect());
        let ins: Vec<B::Buffer> = (0..tensors).map(|t| b.upload(&input(me, t))).collect::<Result<_, _>>()?;
        let mut expected = Vec::new();
        if let Some(c) = exec::collective(op, &a, ws) {
            for t in 0..tensors {
                let all: Vec<Tensor> = (0..ws).map(|r| input(r, t)).collect();
                let e = concord_oracle::expected(&c, &all, &sem).map_err(|e| fail(&w, format!("suite bug: oracle: {e}")))?;
                expected.push((e.outputs[me].clone(), e.defined[me]));
            }
        }
        let out = match variant {
            Variant::OutBuf => Some(b.alloc(DType::F32, expected[0].0.shape())?),
            _ => None,
        };
        let pending = exec::issue(b, op, variant, &ins, out.as_ref(), &a).map_err(|e| fail(&w, format!("issue: {e} [{}]", e.name())))?;
        let key = |r: usize| format!("{}/{}/every_op/{i}/issued{r}", ctx.case, ctx.world.world_id);
        ctx.store.set(&key(me), b"1").map_err(|e| fail(&w, e))?;
        let keys: Vec<String> = (0..ws).map(key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        ctx.store.wait(&refs, ctx.timeout).map_err(|e| fail(&w, format!("the other rank never issued: {e}")))?;
        let t0 = Instant::now();
        while !pending.all_completed() && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        let polled = t0.elapsed();
        let mut verdict: CaseResult = Ok(());
        if !pending.all_completed() {
            verdict = Err(fail(
                &w,
                format!("is_completed() stayed false for {polled:?} after both ranks had issued, with no wait called (a work completes once its peers have issued, not only inside wait)"),
            ));
        } else {
            for (t, (o, (exp, defined))) in pending.peek_values().iter().zip(&expected).enumerate() {
                if *defined && verdict.is_ok() {
                    verdict = expect_eq(
                        b,
                        o,
                        exp,
                        &format!(
                            "{w} tensor {t}, read once is_completed() was true and before any wait (a completed work's result is final)"
                        ),
                    );
                }
            }
        }
        let outs = pending.into_values(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e} [{}]", e.name())));
        if verdict.is_ok() {
            verdict = outs.and_then(|outs| {
                for (t, (o, (exp, defined))) in outs.iter().zip(&expected).enumerate() {
                    if *defined {
                        expect_eq(b, o, exp, &format!("{w} tensor {t}, after wait"))?;
                    }
                }
                Ok(())
            });
        }
        if first.is_ok() && verdict.is_err() {
            first = verdict;
            // The ranks stay in step (every op is still issued and waited); later ops are not polled.
            limit = Duration::ZERO;
        }
    }
    first
}

/// `async::registry_counts_unwaited_work::every_op::ws2`: every (op, variant) of [`exec::PAIRS`]
/// (f32, sum where it reduces; a declared gap is skipped on both ranks) is issued and, before any
/// wait, `outstanding()` MUST count its works (at least one per work the call returned: a send /
/// recv pair is two); once they are waited it MUST be back at 0 (clause `quiescence`). The
/// all_reduce case above checks the count on one op only: a backend whose send, recv, barrier or
/// broadcast works are built against another counter reported 0 with them in flight, and a
/// caller draining by the count left them behind.
fn registry_counts_every_op<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let base = b.outstanding();
    if base != 0 {
        return Err(fail(&here(b, "every_op", "every", DType::F32), format!("outstanding() = {base} at the start of a case")));
    }
    for EveryOpCall { op, variant, params: a, n, tensors, .. } in every_op_calls(b) {
        let w = format!("{} (issued on both ranks, not yet waited)", here(b, op.name(), &variant.to_string(), DType::F32));
        let ins: Vec<B::Buffer> = (0..tensors).map(|_| b.upload(&rank_tensor(b, n))).collect::<Result<_, _>>()?;
        let out = match (op, variant) {
            (concord_core::OpKind::AllGatherIntoTensor, Variant::OutBuf) => Some(b.alloc(DType::F32, &[n * ws])?),
            (concord_core::OpKind::ReduceScatterTensor, Variant::OutBuf) => Some(b.alloc(DType::F32, &[n / ws])?),
            (_, Variant::OutBuf) => Some(b.alloc(DType::F32, &[n])?),
            _ => None,
        };
        let pending = exec::issue(b, op, variant, &ins, out.as_ref(), &a).map_err(|e| fail(&w, format!("issue: {e} [{}]", e.name())))?;
        let works = if matches!(pending, exec::Pending::Pair(..)) { 2 } else { 1 };
        let counted = b.outstanding();
        pending.into_values(ctx.timeout).map_err(|e| fail(&w, format!("wait: {e} [{}]", e.name())))?;
        // At least the call's works (a backend may count internal work of its own beside them).
        if counted < works {
            return Err(fail(
                &w,
                format!("outstanding() = {counted} with the call's {works} work(s) issued and not yet waited, expected at least {works}: every work counts from its issue until it is waited or dropped"),
            ));
        }
        let after = b.outstanding();
        if after != 0 {
            return Err(fail(&w, format!("outstanding() = {after} once the call's {works} work(s) were waited, expected 0")));
        }
    }
    Ok(())
}

/// Rank 1 dies without issuing the op (`all_reduce` or `barrier`) rank 0 has issued: rank 0's
/// wait MUST end in a named error (peer_died best; timeout or aborted for a backend that cannot
/// tell death from slowness) within its deadline, never `Ok`.
fn peer_dies_mid_collective<B: Backend>(ctx: &mut Ctx<'_, B>, op: &str, variant: &str) -> CaseResult {
    let b = ctx.b;
    let w = here(b, op, variant, DType::F32);
    let key = format!("{}/{}/issued", ctx.case, ctx.world.world_id);
    let x = b.upload(&rank_tensor(b, 32))?;
    if b.rank() == 1 {
        // Rank 0 has issued its side; this rank dies without ever issuing its own.
        take_key(ctx, &key, &w, "rank 0 never said it issued")?;
        concord_harness::worker::exit_after_this_case();
        return Ok(());
    }
    let work: concord_core::Work<Option<B::Buffer>> =
        if op == "barrier" { b.barrier()?.map(|_| None) } else { b.all_reduce(&x, red(b))?.map(Some) };
    ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
    let t0 = Instant::now();
    match work.wait(ctx.timeout) {
        Ok(_) => Err(fail(&w, format!("wait returned Ok although rank 1 died without issuing the {op}"))),
        // Named: a dead peer (best), or a timeout / abort for a backend that cannot tell
        // death from slowness; never a generic error, never past the deadline.
        Err(e) if matches!(e.name().as_str(), "peer_died" | "timeout" | "aborted") => {
            if t0.elapsed() > ctx.timeout + Duration::from_millis(500) {
                return Err(fail(&w, format!("the dead peer was reported after {:?} (deadline {:?})", t0.elapsed(), ctx.timeout)));
            }
            Ok(())
        }
        Err(e) => Err(fail(&w, format!("rank 1 died mid-{op}; expected a named peer_died (or timeout / aborted), got {e} [{}]", e.name()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_oracle::{reduce_tensors, Semantics};

    /// `async::lag_read_right_after_wait`'s inputs and expected result, made from one period
    /// and repeated, are bit for bit the element-by-element ones, for every op its vehicle may
    /// take, at a length that cuts the last period short.
    #[test]
    fn lag_read_period_repeated_is_the_element_formula() {
        let n = 3 * 1024 + 5;
        for ws in 1..=3 {
            for it in 0..3 {
                let of = |r: usize| (0..n).map(|i| ((i % 7) as f32) + (r * 3 + it) as f32).collect::<Vec<f32>>();
                let period = |r: usize| (0..LAG_PERIOD).map(|i| (i as f32) + (r * 3 + it) as f32).collect::<Vec<f32>>();
                for r in 0..ws {
                    assert_eq!(repeat_to(&period(r), n), of(r), "ws{ws} it{it} rank {r}");
                }
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                    let reduce = |f: &dyn Fn(usize) -> Vec<f32>| {
                        let all: Vec<Tensor> = (0..ws).map(f).map(|v| Tensor::from_vec(&[v.len()], v)).collect();
                        reduce_tensors(op, &all.iter().collect::<Vec<_>>(), &Semantics::default())
                    };
                    let repeated = Tensor::from_vec(&[n], repeat_to(reduce(&period).as_slice::<f32>(), n));
                    assert_eq!(repeated, reduce(&of), "ws{ws} it{it} {op:?}");
                }
            }
        }
    }
}
