//! The third review's mutants (helper reviewc: async, point-to-point, subgroups and state): each
//! is a bug that a check of `async_ops.rs`, `async_wait.rs`, `p2p.rs`, `reuse.rs`, `state.rs` or
//! `faults.rs` looked able to catch but could not, written before the check was strengthened
//! (docs/review-c.md lists the findings, docs/RESULTS.md "Review fixes: async, point-to-point,
//! subgroups and state" what each did before and after).

use crate::bugs::only_once_waited;
use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Shm, Twist};
use concord_core::Backend;
use concord_core::{CollectiveError, ReduceOp, Result, Work};
use std::sync::Mutex;
use std::time::Duration;

// ---------------------------------------------------------------- a late write into recv's out

/// Finding 1 (`reuse.rs` `no_late_write`: six ops, no recv, no `_out` variant). A receive of
/// 1 Ki elements or more (the "rendezvous" path) delivers its message a second time 20 ms after
/// the recv completed, as a transport that retransmits a message it was not sure had landed: the
/// values are the message's, so a check that reads `out` right after `wait` passes; a caller that
/// reuses `out` after the wait (as every receive loop does) has it overwritten.
/// Clause `async.result_final_after_wait`.
#[derive(Default)]
pub struct RecvRewrittenLate;

impl Bug for RecvRewrittenLate {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        if s.numel(out) < 1024 {
            return Ok(w);
        }
        let inner = s.inner.clone();
        Ok(s.then(w, move |be, got| {
            let message = be.download(got)?;
            let got = got.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = inner.write(&got, &message);
            });
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- progress only inside wait

/// Finding 2 (`async::completes_without_wait` polls an all_reduce only). Every op but the
/// all_reduce family makes progress only inside `wait`: `is_completed()` stays false until the
/// work is waited, however long ago the op finished, so PyTorch's `while not
/// work.is_completed()` spins for ever on a send, a recv, a barrier, a broadcast... (The
/// out-of-place all_gather and reduce_scatter are left right: the fused ops' decompositions
/// re-count the works they wait, which a wrapper's own work cannot follow.)
/// Clause `async.every_op_every_rank` (the work completes once the peers arrive).
#[derive(Default)]
pub struct CompletesOnlyInWaitButAllReduce;

impl Bug for CompletesOnlyInWaitButAllReduce {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.all_gather_into_tensor_out(x, out)?))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        Ok(only_once_waited(s, s.inner.all_gather_into_tensor_coalesced(xs)?))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.reduce_scatter_tensor_out(x, op, out)?))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(only_once_waited(s, s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.all_to_all_single(x, o, i)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.broadcast(x, src)?))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.broadcast_(x, src)?))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.permute_tensor(x, src_dst)?))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.reduce(x, op, root)?))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.gather(x, root)?))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.scatter(x, root)?))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(only_once_waited(s, s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.recv(out, src)?))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(only_once_waited(s, s.inner.barrier()?))
    }
}

// ---------------------------------------------------------------- completed before the copy

/// Finding 3 (nothing reads a result that `is_completed()` reported done without also waiting
/// for it; the contract did not say that a completed work's result is final). An out-of-place
/// all_reduce reduces into a staging buffer and copies into the buffer it returned only inside
/// `wait`; `is_completed()` reports the staging buffer's completion. A caller that polls
/// `is_completed()` and then reads (PyTorch's `AsyncCollectiveTensor` after `completed`, a
/// polling loop) reads whatever the result buffer held. Clause `async.completed_means_final`.
#[derive(Default)]
pub struct CompletedBeforeCopied;

impl Bug for CompletedBeforeCopied {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let result = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))?;
        let staged = s.inner.all_reduce(x, op)?;
        let target = result.clone();
        Ok(s.then_as(staged, result, move |be, staging| {
            let t = be.download(staging)?;
            be.write(&target, &t)
        }))
    }
}

// ---------------------------------------------------------------- barrier past three ranks

/// Finding 4 (`async::barrier_synchronises` runs at 2 and 3 ranks only). A two-level tree
/// barrier whose second level is released by its parent's arrival instead of the root's
/// release: at 4 ranks or more, ranks 3 and up leave the barrier at once, before the others
/// have entered it (the barrier is still posted for its peers). At 2 and 3 ranks every rank is
/// on the first level and the barrier is right. Clause `barrier`.
#[derive(Default)]
pub struct BarrierEarlyPastThree;

impl Bug for BarrierEarlyPastThree {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if s.ws() < 4 || s.rank() < 3 {
            return s.inner.barrier();
        }
        // Still posted for the peers (a dropped work runs on), but not waited here.
        drop(s.inner.barrier()?);
        Ok(s.done((), "barrier"))
    }
}

// ---------------------------------------------------------------- a recreated group, sorted

/// Member lists this process made groups of from its world communicator (in creation order).
static MADE: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());

/// Finding 5 (`state::group_recreated_same_members` sums symmetric inputs and never looks at the
/// ranks of the recreated group). A group whose member list was made before (and dropped) is
/// served from a pool of communicators keyed by the sorted member set, numbered in sorted
/// order: the second `new_group([2, 0])` gives world rank 0 group rank 0. A first group of a
/// list is right. Clause `subgroups` (a member's rank is its position in `ranks`).
#[derive(Default)]
pub struct RecreatedGroupSorted;

impl Bug for RecreatedGroupSorted {
    fn group_ranks(&self, s: &Shm, ranks: &[usize]) -> Vec<usize> {
        if s.in_subgroup() {
            return ranks.to_vec();
        }
        let mut made = lock(&MADE);
        if made.iter().any(|g| g == ranks) {
            let mut sorted = ranks.to_vec();
            sorted.sort_unstable();
            return sorted;
        }
        made.push(ranks.to_vec());
        ranks.to_vec()
    }
}

// ---------------------------------------------------------------- a peer's failure as a timeout

/// Finding 6 (`faults::fail_after_post` accepts any error on the rank whose peer failed,
/// a timeout included; `faults.local_failure_named_everywhere` was checked on device backends
/// only). A backend that cannot tell a failed peer from a slow one: the abort a peer's local
/// failure raises reaches this rank's wait as a `timeout`. Clause
/// `faults.local_failure_named_everywhere`.
#[derive(Default)]
pub struct PeerFailureAsTimeout;

fn as_timeout(e: CollectiveError) -> CollectiveError {
    match e {
        CollectiveError::Aborted(detail) => {
            CollectiveError::Timeout { op: "collective".into(), seq: 0, rank: 0, waited_ms: 0, detail: format!("(was: aborted: {detail})") }
        }
        e => e,
    }
}

fn failure_as_timeout<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let value = w.peek().clone();
    s.twisted(w, value, Twist { map_err: Some(as_timeout), ..Twist::default() }, |_, _| Ok(()))
}

impl Bug for PeerFailureAsTimeout {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(failure_as_timeout(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(failure_as_timeout(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(failure_as_timeout(s, s.inner.broadcast(x, src)?))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<RecvRewrittenLate>(
            "review3_recv_rewritten_late",
            "async.result_final_after_wait",
            "a recv of 1 Ki elements or more writes its message into out a second time, 20 ms after the recv completed",
            &["reuse::no_late_write::send_recv"],
        ),
        spec::<CompletesOnlyInWaitButAllReduce>(
            "review3_completes_only_in_wait_but_all_reduce",
            "async.every_op_every_rank",
            "every op but the all_reduce family reports is_completed() only once waited (progress inside wait)",
            &["async::completes_without_wait::every_op::ws2"],
        ),
        spec::<CompletedBeforeCopied>(
            "review3_completed_before_copied",
            "async.completed_means_final",
            "an out-of-place all_reduce is_completed() once its staging buffer is reduced; the result it returned is written only in wait",
            &["async::completes_without_wait::every_op::ws2"],
        ),
        spec::<BarrierEarlyPastThree>(
            "review3_barrier_early_past_three",
            "barrier",
            "at 4 ranks or more, ranks 3 and up leave the barrier at once (a tree's second level released by its parent)",
            &["async::barrier_synchronises::every_rank_checks::ws4"],
        ),
        spec::<RecreatedGroupSorted>(
            "review3_recreated_group_sorted",
            "subgroups",
            "a group whose member list was made before is served from a pool keyed by the sorted set, numbered in sorted order",
            &["state::group_recreated_same_members::ws3"],
        ),
        spec::<PeerFailureAsTimeout>(
            "review3_peer_failure_as_timeout",
            "faults.local_failure_named_everywhere",
            "the abort a peer's local failure raises reaches this rank's all_reduce / broadcast wait as a timeout",
            &["faults::fail_after_post::in_place::ws2"],
        ),
    ]
}
