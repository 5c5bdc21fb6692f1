//! The eighth review (the lead's, 2026-11-27): blind spots a read-only review of the async,
//! failure, fault, point-to-point, subgroup and progress clauses pointed at. Each was written
//! here first and run against the whole catalogue before any case was added.

use crate::bugs_review5::CompletionWaitsForNextOp;
use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm, Twist};
use concord_core::{Backend, BadInputKind, CollectiveError, Completion, ReduceOp, Result, Work};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- large ops, staged copies

/// From this many bytes an op takes the chunked path.
const STAGED_BYTES: usize = 256 << 10;

/// Finding 1. At 256 KiB or more the out-of-place ops and recv go through a staging buffer:
/// `is_completed()` turns true once the last chunk landed in staging, and the copy into the
/// buffer the op returned happens inside `wait` (`review3_completed_before_copied`, which is
/// all_reduce-only, on the large path of every op). Clause `async.completed_means_final`.
#[derive(Default)]
pub struct LargeCompletedBeforeCopied;

impl LargeCompletedBeforeCopied {
    fn large(s: &Shm, b: &Buf) -> bool {
        s.numel(b) * s.inner.buffer_dtype(b).size() >= STAGED_BYTES
    }
    /// `staged`'s result copied into a new buffer of its shape only when waited.
    fn staged(s: &Shm, staged: Work<Buf>) -> Result<Work<Buf>> {
        let out = staged.peek().clone();
        let result = s.inner.alloc(s.inner.buffer_dtype(&out), &s.inner.buffer_shape(&out))?;
        let target = result.clone();
        Ok(s.then_as(staged, result, move |be, staging| be.write(&target, &be.download(staging)?)))
    }
}

impl Bug for LargeCompletedBeforeCopied {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        if Self::large(s, x) {
            Self::staged(s, w)
        } else {
            Ok(w)
        }
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        if Self::large(s, x) {
            Self::staged(s, w)
        } else {
            Ok(w)
        }
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        if Self::large(s, x) {
            Self::staged(s, w)
        } else {
            Ok(w)
        }
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        if Self::large(s, x) {
            Self::staged(s, w)
        } else {
            Ok(w)
        }
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        if !Self::large(s, out) {
            return s.inner.recv(out, src);
        }
        let staging = s.inner.alloc(s.inner.buffer_dtype(out), &s.inner.buffer_shape(out))?;
        let w = s.inner.recv(&staging, src)?;
        let target = out.clone();
        Ok(s.then_as(w, out.clone(), move |be, staged| be.write(&target, &be.download(staged)?)))
    }
}

// ---------------------------------------------------------------- failure to the successor only

/// The first rank other than `me` a message names (`... on rank 0: rank 1's side ...`).
pub(crate) fn other_rank(msg: &str, me: usize) -> Option<usize> {
    msg.split("rank ").skip(1).filter_map(|t| t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()).find(|&r| r != me)
}

/// Finding 2. A rank's local failure is pushed to its ring successor only: the successor's wait
/// ends in the abort at once, every other rank's in a timeout at its deadline (real NCCL
/// without PyTorch's store-based propagation). At 2 ranks the only peer is the successor, so
/// nothing changes there. Clause `faults.local_failure_named_everywhere`.
#[derive(Default)]
pub struct LocalFailureToSuccessorOnly;

fn not_successor_as_timeout<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let (me, ws) = (s.rank(), s.ws());
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    s.relayed(value, Arc::new(Relabel { inner: w, relabel: Box::new(move |e| successor_only(e, me, ws)) }), meta)
}

fn successor_only(e: CollectiveError, me: usize, ws: usize) -> CollectiveError {
    match e {
        CollectiveError::Aborted(detail) => match other_rank(&detail, me) {
            Some(failed) if (failed + 1) % ws != me => CollectiveError::Timeout {
                op: "collective".into(),
                seq: 0,
                rank: me,
                waited_ms: 0,
                detail: format!("no word from the peers within the deadline (rank {failed} failed; only its successor was told)"),
            },
            _ => CollectiveError::Aborted(detail),
        },
        e => e,
    }
}

/// A completion that relays `inner`, its error rewritten by `relabel`.
pub(crate) struct Relabel<T> {
    pub(crate) inner: Work<T>,
    pub(crate) relabel: Box<dyn Fn(CollectiveError) -> CollectiveError + Send + Sync>,
}

impl<T: Send + Sync> Completion for Relabel<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |_| {}).map_err(|e| (self.relabel)(e))
    }
}

impl Bug for LocalFailureToSuccessorOnly {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(not_successor_as_timeout(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(not_successor_as_timeout(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(not_successor_as_timeout(s, s.inner.broadcast(x, src)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(not_successor_as_timeout(s, s.inner.all_to_all_single(x, o, i)?))
    }
}

// ---------------------------------------------------------------- a group's waits

/// Finding 4. A group made by `new_group` does not inherit the world's deadline handling: its
/// works' `wait(t)` blocks for at least the group's own default of 10 s, whatever `t` the caller
/// gave. The world's waits are right. Clause `async.deadline`.
#[derive(Default)]
pub struct GroupWaitsOwnDefault;

fn group_wait<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    if !s.in_subgroup() {
        return w;
    }
    let value = w.peek().clone();
    s.twisted(w, value, Twist { wait_instead: Some(|t| t.max(Duration::from_secs(10))), ..Twist::default() }, |_, _| Ok(()))
}

impl Bug for GroupWaitsOwnDefault {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(group_wait(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(group_wait(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(group_wait(s, s.inner.broadcast(x, src)?))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(group_wait(s, s.inner.barrier()?))
    }
}

// ---------------------------------------------------------------- gathers batched

/// Finding 5. FSDP-style batching: an all_gather_into_tensor or reduce_scatter_tensor issued
/// while one is still pending joins its launch, so the earlier one completes only with the
/// later one (`review5_completion_waits_for_next_op` on the sharded ops). Clause
/// `async.every_op_every_rank`.
#[derive(Default)]
pub struct ShardedOpsWaitForNext {
    chain: CompletionWaitsForNextOp,
}

impl Bug for ShardedOpsWaitForNext {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(self.chain.chain(s, s.inner.all_gather_into_tensor(x)?))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.chain.chain(s, s.inner.reduce_scatter_tensor(x, op)?))
    }
}

// ---------------------------------------------------------------- recorded as another op

/// Finding 8. reduce_scatter_tensor run as a whole all_reduce and a local slice (Gloo's old
/// emulation): the values are right, but a rank hung in it is recorded in an all_reduce.
/// Clause `progress.recorded`.
#[derive(Default)]
pub struct ReduceScatterRecordedAsAllReduce;

impl Bug for ReduceScatterRecordedAsAllReduce {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let ws = s.ws();
        if shape.is_empty() || !shape[0].is_multiple_of(ws) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let mut out_shape = shape.clone();
        out_shape[0] /= ws;
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &out_shape)?;
        let w = s.inner.all_reduce(x, op)?;
        let meta = w.meta().clone();
        let slice = Slice { inner: w, be: s.inner.clone(), target: out.clone(), me: s.rank(), ws, copied: Mutex::new(false) };
        Ok(s.relayed(out, Arc::new(slice), meta))
    }
}

/// The all_reduce behind a reduce_scatter: complete once the all_reduce is and this rank's
/// chunk is copied out (done by whoever first sees the all_reduce complete, so a completed
/// work's result is final).
struct Slice {
    inner: Work<Buf>,
    be: Arc<concord_shm::ShmBackend>,
    target: Buf,
    me: usize,
    ws: usize,
    copied: Mutex<bool>,
}

impl Slice {
    fn copy_once(&self) -> Result<()> {
        let mut copied = crate::lock(&self.copied);
        if !*copied {
            let all = self.be.download(self.inner.peek())?;
            let chunk = all.len_bytes() / self.ws;
            let mut mine = self.be.download(&self.target)?;
            mine.bytes_mut().copy_from_slice(&all.bytes()[self.me * chunk..(self.me + 1) * chunk]);
            self.be.write(&self.target, &mine)?;
            *copied = true;
        }
        Ok(())
    }
}

impl Completion for Slice {
    fn is_completed(&self) -> bool {
        self.inner.is_completed() && self.copy_once().is_ok()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if !crate::relay_wait(&self.inner, timeout, |_| {})? {
            return Ok(false);
        }
        self.copy_once().map(|()| true)
    }
}

// ---------------------------------------------------------------- a peer's failure as bad input

/// Finding 9. The failed rank's poison header is decoded by its peers as a call mismatch: a
/// peer's wait ends in `bad_input:shape_mismatch` (users hunt a phantom shape bug) instead of
/// the abort. Clause `faults.local_failure_named_everywhere` ("one named error").
#[derive(Default)]
pub struct PeerFailureAsBadInput;

fn as_bad_input<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let me = s.rank();
    let value = w.peek().clone();
    let meta = w.meta().clone();
    s.relayed(
        value,
        Arc::new(Relabel {
            inner: w,
            relabel: Box::new(move |e| match e {
                CollectiveError::Aborted(detail) if other_rank(&detail, me).is_some() => CollectiveError::BadInput {
                    kind: BadInputKind::ShapeMismatch,
                    op: "collective".into(),
                    seq: 0,
                    rank: me,
                    detail: format!("the peers' calls differ ({detail})"),
                },
                e => e,
            }),
        }),
        meta,
    )
}

impl Bug for PeerFailureAsBadInput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(as_bad_input(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(as_bad_input(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(as_bad_input(s, s.inner.broadcast(x, src)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(as_bad_input(s, s.inner.all_to_all_single(x, o, i)?))
    }
}

// ---------------------------------------------------------------- group premul_sum

/// Finding 10. The per-communicator pre-multiply handle exists on the world only: a group's
/// reduce_scatter with `premul_sum` falls back to `sum` (FSDP2 reduce-scatters gradients with a
/// pre-multiply on its shard group). Clause `subgroups.reduce_ops`.
#[derive(Default)]
pub struct GroupReduceScatterPremulAsSum;

impl Bug for GroupReduceScatterPremulAsSum {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let op = if s.in_subgroup() && matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op };
        s.inner.reduce_scatter_tensor(x, op)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<LargeCompletedBeforeCopied>(
            "review8_large_completed_before_copied",
            "async.completed_means_final",
            "at 256 KiB or more the out-of-place ops and recv report is_completed() once staged; the result is copied only in wait",
            &["async::completes_without_wait::every_op::large::ws2"],
        ),
        spec::<LocalFailureToSuccessorOnly>(
            "review8_local_failure_to_successor_only",
            "faults.local_failure_named_everywhere",
            "a rank's local failure reaches its ring successor only; every other rank's wait ends in a timeout",
            &["faults::fail_after_post::in_place::ws4"],
        ),
        spec::<GroupWaitsOwnDefault>(
            "review8_group_waits_own_default",
            "async.deadline",
            "a group's works wait at least 10 s whatever the caller's wait asked",
            &["async::pending_until_peers_arrive::subgroup::all_reduce::out::ws3"],
        ),
        spec::<ShardedOpsWaitForNext>(
            "review8_sharded_ops_wait_for_next",
            "async.every_op_every_rank",
            "an all_gather / reduce_scatter issued while one is pending joins its launch: the earlier completes only with the later",
            &["async::earlier_op_completes_before_a_later_one_is_issued::all_gather_into_tensor::ws2"],
        ),
        spec::<ReduceScatterRecordedAsAllReduce>(
            "review8_reduce_scatter_recorded_as_all_reduce",
            "progress.recorded",
            "reduce_scatter_tensor runs as an all_reduce and a slice: a rank hung in it is recorded in an all_reduce",
            &["async::pending_until_peers_arrive::reduce_scatter_tensor::out::ws2"],
        ),
        spec::<PeerFailureAsBadInput>(
            "review8_peer_failure_as_bad_input",
            "faults.local_failure_named_everywhere",
            "a peer's local failure reaches this rank as bad_input:shape_mismatch, not as the abort",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<GroupReduceScatterPremulAsSum>(
            "review8_group_reduce_scatter_premul_as_sum",
            "subgroups.reduce_ops",
            "a group's reduce_scatter with premul_sum runs as sum",
            &["subgroup::halves::reduce_scatter_tensor::out::f32::premul_sum::ws4"],
        ),
    ]
}
