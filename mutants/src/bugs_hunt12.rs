//! The twelfth outside hunt: the clauses with the fewest mutants (two to four). A communicator
//! whose drop finishes its pending all_reduces, an all_reduce of 1 MiB or more that meets its
//! peers at issue, a reduce-scatter that returns one of four pooled outputs, an all-gather-matmul
//! that converts a B of another float dtype, a pipelined low-contention all-gather that places
//! shards by arrival, sends of 8-byte dtypes staged on a helper thread, a large all_gather of a
//! matrix returned flat, a subgroup's in-place avg divided by the world, an in-place broadcast
//! run as an all_gather (roots never compared), a recv queued behind the collectives issued
//! before it, coalesced ops left off the in-flight record. Each is a bug a backend author could
//! ship, over the correct shm backend.

use crate::bugs_hunt5::unrecorded;
use crate::bugs_hunt6::Slot;
use crate::campaign::Spec;
use crate::{copy_bytes, edit, lock, Buf, Bug, Mutant, Shm, BUG_WAIT};
use concord_core::fused::{decomposed_all_gather_matmul, decomposed_low_contention, Gathered};
use concord_core::{progress, Backend, Completion, DType, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work};
use concord_shm::ShmBackend;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

fn bytes_of(s: &Shm, x: &Buf) -> usize {
    s.numel(x) * s.inner.buffer_dtype(x).size()
}

/// The in-flight records (`concord_core::progress`) as `(backend, seq)` keys.
fn records() -> HashSet<(String, u64)> {
    progress::in_flight().into_iter().map(|f| (f.backend, f.seq)).collect()
}

// ---------------------------------------------------------------- async.unwaited_exit

/// How long [`DropFinishesPendingOps`]'s drop waits for its all_reduces to complete.
const FINISH: Duration = Duration::from_secs(5);

/// The communicator's drop joins its progress thread only once every all_reduce it issued has
/// completed (up to 5 s): an un-waited all_reduce whose peer never issues it holds the process's
/// teardown. (A dropped work that has completed is no delay: a one-rank world never waits.)
#[derive(Default)]
pub struct DropFinishesPendingOps {
    issued: Mutex<Vec<(String, u64)>>,
    /// Keeps the correct backend alive until this bug's drop has run.
    inner: Mutex<Option<Arc<ShmBackend>>>,
}

impl DropFinishesPendingOps {
    fn track(&self, s: &Shm, issue: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let before = records();
        let w = issue()?;
        let now = records();
        let mut issued = lock(&self.issued);
        issued.retain(|k| now.contains(k));
        issued.extend(now.into_iter().filter(|k| !before.contains(k)));
        lock(&self.inner).get_or_insert_with(|| s.inner.clone());
        Ok(w)
    }
}

impl Bug for DropFinishesPendingOps {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.track(s, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.track(s, || s.inner.all_reduce_(x, op))
    }
}

impl Drop for DropFinishesPendingOps {
    fn drop(&mut self) {
        let issued = std::mem::take(&mut *lock(&self.issued));
        let t0 = Instant::now();
        while t0.elapsed() < FINISH {
            let live = records();
            if !issued.iter().any(|k| live.contains(k)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------- async.issue_returns

/// From which size an all_reduce takes the rendezvous protocol.
const RENDEZVOUS: usize = 1 << 20;

/// An all_reduce (out of place or in place) of 1 MiB or more takes a rendezvous protocol that
/// meets every peer at issue: issuing blocks until the peers have issued theirs (and the
/// transfer is done).
#[derive(Default)]
pub struct LargeAllReduceRendezvousAtIssue;

impl LargeAllReduceRendezvousAtIssue {
    fn meet(s: &Shm, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        if s.ws() > 1 && bytes_of(s, x) >= RENDEZVOUS {
            // A failure is the caller's to see at wait.
            let _ = w.wait(BUG_WAIT);
        }
        Ok(w)
    }
}

impl Bug for LargeAllReduceRendezvousAtIssue {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::meet(s, x, s.inner.all_reduce(x, op)?)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::meet(s, x, s.inner.all_reduce_(x, op)?)
    }
}

// ---------------------------------------------------------------- async.result_final_after_wait

/// How many pooled outputs [`RsOutputRing`] keeps per (dtype, shape).
const RING: usize = 4;

/// The out-of-place reduce_scatter_tensor returns one of four pooled output buffers per
/// (dtype, shape), in turn (a "quadruple-buffered" output): the fifth call of a shape writes
/// into the first call's result, long after that was waited.
#[derive(Default)]
pub struct RsOutputRing {
    pool: Mutex<OutputPool>,
}

/// Pooled outputs per (dtype, shape), and the next one's index.
type OutputPool = HashMap<(DType, Vec<usize>), (Vec<Buf>, usize)>;

impl Bug for RsOutputRing {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let (dtype, shape) = (s.inner.buffer_dtype(w.peek()), s.inner.buffer_shape(w.peek()));
        let out = {
            let mut pool = lock(&self.pool);
            let (bufs, next) = pool.entry((dtype, shape.clone())).or_default();
            if bufs.len() < RING {
                bufs.push(s.inner.alloc(dtype, &shape)?);
            }
            let b = bufs[*next % bufs.len()].clone();
            *next += 1;
            b
        };
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| be.write(&o, &be.download(r)?)))
    }
}

// ---------------------------------------------------------------- fused.bad_input

/// The all-gather-matmul converts every B of another float dtype to A's dtype (a "type
/// promotion" step) instead of refusing the mismatch (rule F6, `dtype_mismatch`).
#[derive(Default)]
pub struct AgMatmulBCastToA;

impl Bug for AgMatmulBCastToA {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let be = &*m.s.inner;
        let ad = be.buffer_dtype(a);
        let floats = ad.is_float() && bs.iter().all(|b| be.buffer_dtype(b).is_float());
        if !floats || bs.iter().all(|b| be.buffer_dtype(b) == ad) {
            return decomposed_all_gather_matmul(m, a, bs, dim, sc);
        }
        let cast = bs
            .iter()
            .map(|b| {
                let t = be.download(b)?;
                let v: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
                be.upload(&Tensor::from_f64(ad, t.shape(), &v))
            })
            .collect::<Result<Vec<_>>>()?;
        decomposed_all_gather_matmul(m, a, &cast, dim, sc)
    }
}

// ---------------------------------------------------------------- fused.pipelined_order

/// The low-contention all-gather runs as a pipeline over send / recv (receive from `rank + step`,
/// send to `rank - step`) and places the `k`-th shard to land at the place of the `k`-th peer in
/// step order: right while shards land in step order, wrong when a nearer peer is late.
#[derive(Default)]
pub struct LcAllGatherArrivalSlots;

impl Bug for LcAllGatherArrivalSlots {
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        let be = &*m.s.inner;
        let (ws, me) = (be.world_size(), be.rank());
        let shape = be.buffer_shape(x);
        if op.is_some() || ws == 1 || shape.is_empty() {
            return decomposed_low_contention(m, x, op);
        }
        let dtype = be.buffer_dtype(x);
        let mut recvs = Vec::new();
        for step in 1..ws {
            recvs.push(be.recv(&be.alloc(dtype, &shape)?, (me + step) % ws)?);
        }
        let sends = (1..ws).map(|step| be.send(x, (me + ws - step) % ws)).collect::<Result<Vec<_>>>()?;
        let chunk = shape.iter().product::<usize>() * dtype.size();
        let mut out_shape = shape.clone();
        out_shape[0] *= ws;
        let mut out = Tensor::zeros(dtype, &out_shape);
        copy_bytes(&mut out, me * chunk, &be.download(x)?, 0, chunk);
        let mut pending: Vec<usize> = (0..recvs.len()).collect();
        let t0 = Instant::now();
        for k in 0..recvs.len() {
            let at = loop {
                if let Some(at) = pending.iter().position(|&j| recvs[j].is_completed()) {
                    break at;
                }
                if t0.elapsed() > BUG_WAIT {
                    break 0;
                }
                std::thread::sleep(Duration::from_micros(50));
            };
            let landed = recvs[pending.remove(at)].wait(BUG_WAIT)?;
            copy_bytes(&mut out, ((me + k + 1) % ws) * chunk, &be.download(landed)?, 0, chunk);
        }
        for w in &sends {
            w.wait(BUG_WAIT)?;
        }
        Ok(m.s.done(be.upload(&out)?, "low_contention_all_gather"))
    }
}

// ---------------------------------------------------------------- p2p.order

/// How long an 8-byte-dtype send waits on its staging thread.
const STAGE: Duration = Duration::from_millis(100);

/// Sends of 8-byte dtypes (f64, i64, u64) are staged by a helper thread (a packing step) that
/// posts them 100 ms later (long enough that a later send issued at once overtakes it even on a loaded machine); a send of another dtype to the same peer, issued meanwhile, goes out
/// at once and overtakes it.
#[derive(Default)]
pub struct WideSendStaged;

impl Bug for WideSendStaged {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        if dst >= s.ws() || dst == s.rank() || s.inner.buffer_dtype(x).size() != 8 {
            return s.inner.send(x, dst);
        }
        let slot = Arc::new(Slot::default());
        let (be, xc, sl) = (s.inner.clone(), x.clone(), slot.clone());
        std::thread::spawn(move || {
            std::thread::sleep(STAGE);
            sl.fill(be.send(&xc, dst));
        });
        Ok(Work::new((), slot, s.meta("send"), &s.own))
    }
}

// ---------------------------------------------------------------- shapes

/// From which output size all_gather_into_tensor takes its bulk path.
const BULK: usize = 1 << 20;

/// all_gather_into_tensor of an output of 1 MiB or more takes a bulk path that returns the flat
/// `[ws * numel]` buffer (right for 1-D inputs), not `[ws * d0, rest..]`.
#[derive(Default)]
pub struct LargeAllGatherFlat;

impl Bug for LargeAllGatherFlat {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        if s.inner.buffer_shape(x).len() < 2 || bytes_of(s, x) * s.ws() < BULK {
            return Ok(w);
        }
        let v = s.inner.view(w.peek(), 0, &[s.numel(w.peek())])?;
        Ok(s.then_as(w, v, |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- subgroups.reduce_ops

/// In a subgroup, the in-place all_reduce_'s avg divides the sum by the world's size (the
/// in-place path takes the divisor from the process-wide communicator).
#[derive(Default)]
pub struct SubgroupInplaceAvgByWorld;

impl Bug for SubgroupInplaceAvgByWorld {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(crate::bugs_hunt10::avg_by_world(s, x, op, s.inner.all_reduce_(x, op)?))
    }
}

// ---------------------------------------------------------------- bad_input.root_agreement

/// The in-place broadcast_ runs as an all_gather of every rank's buffer, each rank copying the
/// chunk of the src it named (recorded in flight as a broadcast): the srcs are never compared,
/// so ranks naming different srcs each get "their" root's data. (The out-of-place broadcast is
/// shm's own.)
#[derive(Default)]
pub struct BroadcastInplaceSrcUnchecked;

impl Bug for BroadcastInplaceSrcUnchecked {
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if s.ws() == 1 || src >= s.ws() {
            return s.inner.broadcast_(x, src);
        }
        let before = records();
        let all = s.inner.all_gather_into_tensor(x)?;
        for f in progress::in_flight().into_iter().filter(|f| !before.contains(&(f.backend.clone(), f.seq))) {
            progress::begin(&f.backend, "broadcast", f.seq);
            if all.is_completed() {
                progress::end(&f.backend, f.seq);
            }
        }
        let (xc, bytes) = (x.clone(), bytes_of(s, x));
        Ok(s.then_as(all, x.clone(), move |be, g| {
            let g = be.download(g)?;
            edit(be, &xc, |t| copy_bytes(t, 0, &g, src * bytes, bytes))
        }))
    }
}

// ---------------------------------------------------------------- p2p.no_deadlock

/// A collective the bug keeps an eye on (the caller's work waits on it; the bug holds a `Weak`).
struct Watched {
    inner: Work<Buf>,
}

impl Completion for Watched {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |_| {})
    }
}

/// One queue for collectives and receives: a `recv` is posted only once every all_reduce issued
/// before it on the communicator has completed (its issue blocks until then), so `all_reduce;
/// irecv(0)` against a peer doing `isend(1); wait; all_reduce` deadlocks until the deadline.
/// (Sends are not queued: the mirror case with the send behind the all_reduce passes.)
#[derive(Default)]
pub struct RecvQueuedBehindCollectives {
    pending: Mutex<Vec<Weak<Watched>>>,
    /// Counts the mapped works (never reported: the inner work each holds is).
    shadow: OutstandingCounter,
}

impl Bug for RecvQueuedBehindCollectives {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let t = Arc::new(Watched { inner: w });
        let mut pending = lock(&self.pending);
        pending.retain(|p| p.upgrade().is_some_and(|p| !p.is_completed()));
        pending.push(Arc::downgrade(&t));
        Ok(Work::new(value, t, meta, &self.shadow))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let ahead: Vec<Arc<Watched>> = lock(&self.pending).iter().filter_map(Weak::upgrade).collect();
        for t in ahead {
            // Failures are the collective's waiter's to see; the queue just moves on. Twice the
            // bug deadline: longer than the peer's op timeout (15 s by default, as long as
            // BUG_WAIT), so the peer's wait fails first instead of racing this one.
            let _ = t.inner.wait(2 * BUG_WAIT);
        }
        s.inner.recv(out, src)
    }
}

// ---------------------------------------------------------------- progress.recorded

/// The coalesced ops run on a bucket engine of their own that never enters the in-flight
/// record: a rank hung in a coalesced all_reduce (or all_gather / reduce_scatter) reports itself
/// idle.
#[derive(Default)]
pub struct CoalescedUnrecorded;

impl Bug for CoalescedUnrecorded {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        unrecorded(|| s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        unrecorded(|| s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        unrecorded(|| s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        unrecorded(|| s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<DropFinishesPendingOps>(
            "drop_finishes_pending_ops",
            "async.unwaited_exit",
            "the communicator's drop waits (up to 5 s) until every all_reduce it issued has completed: an un-waited one whose peer never issues holds the exit",
            &["async::unwaited_collective_exits_within_3s::peer_absent::ws2"],
        ),
        spec::<LargeAllReduceRendezvousAtIssue>(
            "large_all_reduce_rendezvous_at_issue",
            "async.issue_returns",
            "an all_reduce of 1 MiB or more meets its peers at issue: issuing blocks until every peer has issued",
            &["async::issue_returns_at_once::large_all_reduce::ws2"],
        ),
        spec::<RsOutputRing>(
            "rs_output_ring",
            "async.result_final_after_wait",
            "reduce_scatter_tensor returns one of 4 pooled outputs per (dtype, shape) in turn: the fifth call overwrites the first call's result",
            &["reuse::outputs_kept::reduce_scatter_tensor::out::ws2"],
        ),
        spec::<AgMatmulBCastToA>(
            "ag_matmul_b_cast_to_a",
            "fused.bad_input",
            "the all-gather-matmul converts a B of another float dtype to A's dtype instead of refusing it (F6 dtype_mismatch)",
            &["fused::bad_input::b_dtype_differs::ws2"],
        ),
        spec::<LcAllGatherArrivalSlots>(
            "lc_all_gather_arrival_slots",
            "fused.pipelined_order",
            "the pipelined low-contention all-gather puts the k-th shard to land at the k-th peer's place in step order: wrong when a nearer peer is late",
            &["fused::low_contention_all_gather::dim0::f32::late_peer::ws3"],
        ),
        spec::<WideSendStaged>(
            "wide_send_staged",
            "p2p.order",
            "sends of 8-byte dtypes are posted 100 ms later by a staging thread: a later send of another dtype to the same peer overtakes them",
            &["p2p::in_order_mixed_dtypes::ws2"],
        ),
        spec::<LargeAllGatherFlat>(
            "large_all_gather_flat",
            "shapes",
            "all_gather_into_tensor with an output of 1 MiB or more returns the flat [ws * numel] buffer for a >= 2-D input",
            &["sizes::all_gather_into_tensor::out::f32::matrix::ws2"],
        ),
        spec::<SubgroupInplaceAvgByWorld>(
            "subgroup_inplace_avg_by_world",
            "subgroups.reduce_ops",
            "in a subgroup, the in-place all_reduce_'s avg divides by the world size",
            &["subgroup::halves::all_reduce::inplace::f32::avg::ws4"],
        ),
        spec::<BroadcastInplaceSrcUnchecked>(
            "broadcast_inplace_src_unchecked",
            "bad_input.root_agreement",
            "broadcast_ runs as an all_gather, each rank copying the chunk of the src it named: srcs never compared",
            &["bad_input::broadcast_inplace_src_differs_on_one_rank::ws3"],
        ),
        spec::<RecvQueuedBehindCollectives>(
            "recv_queued_behind_collectives",
            "p2p.no_deadlock",
            "a recv is posted only once every all_reduce issued before it completed: all_reduce; irecv(0) against isend(1); wait; all_reduce deadlocks",
            &["p2p::recv_behind_pending_collective::ws2"],
        ),
        spec::<CoalescedUnrecorded>(
            "coalesced_unrecorded",
            "progress.recorded",
            "the coalesced ops never enter the in-flight record: a rank hung in a coalesced all_reduce reports itself idle",
            &["async::peer_never_joins_op_recorded_in_flight::all_reduce_coalesced::ws2"],
        ),
    ]
}
