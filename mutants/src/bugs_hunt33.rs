//! The thirty-third hunt: bugs from the wild in what the caller sees of an op between issue and
//! wait: work / request handles. Each ports a bug that shipped in a collective or communication
//! library or its framework layer (NIXL, Open MPI, MPICH, torchft, PyTorch's Gloo process group),
//! found in the project's issue or pull-request thread named on its type: a completion check that
//! reads the ring's last posted request instead of the handle's own, a wait-any that retires the
//! request before the completed one, a first send that leaves only at the sender's wait, a
//! managed work's callback chain bound late, point-to-point works marked complete only in wait.
//! The trigger (two works in flight on one communicator, the later one done first; a first
//! message to a peer; a result that arrives after issue) is kept as far as a wrapper over shm can
//! reproduce it.

use crate::campaign::{spec, Spec};
use crate::{lock, relay_wait, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Work};
use concord_shm::ShmBackend;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Implements every op hook of [`Bug`] (collectives, send, recv, barrier) as the correct shm
/// call whose work is handed to the type's `wrap(&self, s, w)`; the out-of-place
/// `all_gather_into_tensor` and `reduce_scatter_tensor` are left right (the fused ops'
/// decompositions re-count the works they wait, which a wrapper's own work cannot follow: their
/// `outstanding()` would read 0, a symptom that is not the bug's).
macro_rules! wrap_every_op {
    ($t:ty) => {
        impl Bug for $t {
            fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.all_reduce(x, op)?))
            }
            fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.all_reduce_(x, op)?))
            }
            fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                Ok(self.wrap(s, s.inner.all_reduce_coalesced(xs, op)?))
            }
            fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                Ok(self.wrap(s, s.inner.all_reduce_coalesced_(xs, op)?))
            }
            fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.all_gather_into_tensor_out(x, out)?))
            }
            fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
                Ok(self.wrap(s, s.inner.all_gather_into_tensor_coalesced(xs)?))
            }
            fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.reduce_scatter_tensor_out(x, op, out)?))
            }
            fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                Ok(self.wrap(s, s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
            }
            fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.all_to_all_single(x, o, i)?))
            }
            fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.broadcast(x, src)?))
            }
            fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.broadcast_(x, src)?))
            }
            fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.permute_tensor(x, src_dst)?))
            }
            fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.reduce(x, op, root)?))
            }
            fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.gather(x, root)?))
            }
            fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.scatter(x, root)?))
            }
            fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
                Ok(self.wrap(s, s.inner.send(x, dst)?))
            }
            fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
                Ok(self.wrap(s, s.inner.recv(out, src)?))
            }
            fn barrier(&self, s: &Shm) -> Result<Work<()>> {
                Ok(self.wrap(s, s.inner.barrier()?))
            }
        }
    };
}
pub(crate) use wrap_every_op;

/// The inner (correct) work's own completion, relayed: its `is_completed`, its wait.
pub(crate) struct Own<T>(pub(crate) Work<T>);

impl<T: Send + Sync> Completion for Own<T> {
    fn is_completed(&self) -> bool {
        self.0.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        relay_wait(&self.0, timeout, |_| {})
    }
}

// ---------------------------------------------------------------- ai-dynamo/nixl PR #2176

/// The last posted request of a communicator: the slot a completion check reads
/// ([`TestReadsLastPosted`]).
type LastPosted = Arc<Mutex<Option<Weak<dyn Completion>>>>;

/// A completion check that reads the transfer ring's last posted slot, not the handle's own
/// (ai-dynamo/nixl PR #2176, GPUNetIO backend, as shipped before it: `releaseReqH` computed
/// `tmp = xferRingPos.load() & (DOCA_XFER_REQ_MAX - 1)` — the position of the last posted
/// transfer — and answered `NIXL_SUCCESS` when `completion_list_cpu[tmp].completed > 0`, whatever
/// handle it was given; the fix asks `checkXfer(handle)`). Here every work's `is_completed()`
/// reads the completion of the communicator's most recently issued work; `wait` is right. With
/// one work in flight the answer is right; with a collective still waiting for a peer and a
/// later send / recv done, the collective reads done (and a poller reads its unreduced result);
/// with an earlier op done and a later one pending, the earlier one reads pending.
#[derive(Default)]
pub struct TestReadsLastPosted {
    last: LastPosted,
}

/// A work whose `is_completed()` reads the last posted slot ([`TestReadsLastPosted`]).
struct ReadsLast {
    own: Arc<dyn Completion>,
    last: LastPosted,
}

impl Completion for ReadsLast {
    fn is_completed(&self) -> bool {
        match lock(&self.last).as_ref().and_then(Weak::upgrade) {
            Some(slot) => slot.is_completed(),
            None => self.own.is_completed(),
        }
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        self.own.wait_for(timeout)
    }
}

impl TestReadsLastPosted {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let own: Arc<dyn Completion> = Arc::new(Own(w));
        *lock(&self.last) = Some(Arc::downgrade(&own));
        s.relayed(value, Arc::new(ReadsLast { own, last: self.last.clone() }), meta)
    }
}

wrap_every_op!(TestReadsLastPosted);

// ---------------------------------------------------------------- open-mpi/ompi PR #1725

/// One request of a communicator's active list ([`WaitAnyRetiresPrevious`]): retired once a
/// completion marked it inactive (its wait then returns at once).
#[derive(Default)]
struct Active {
    retired: AtomicBool,
}

/// The communicator's active requests, in issue order.
type ActiveList = Arc<Mutex<Vec<Arc<Active>>>>;

/// A wait-any that retires the request before the completed one (open-mpi/ompi PR #1725
/// "ompi/request: fix bugs in MPI_Wait_some and MPI_Wait_any": "The request pointer was pointing
/// to the request before the completed request which caused the wrong request to be freed or
/// marked inactive"; found by MTT, the request refactoring's Waitany failures of #1759). Here the
/// backend's progress keeps the communicator's active requests in issue order and, when a wait
/// sees its request complete, marks inactive the one before it in the list (its own stays
/// listed): an earlier work still pending — a collective waiting for a late peer, a receive —
/// is then reported complete, and its wait returns at once with what its buffer holds. Works
/// that complete in issue order never meet it. Before hunt33's check the catalogue caught it
/// only by a race (`p2p::recv_before_barrier::ws2`, whose receive's message may land before its
/// retired wait is read: 3 catches in 6 runs alone).
#[derive(Default)]
pub struct WaitAnyRetiresPrevious {
    active: ActiveList,
}

struct Retiring<T> {
    inner: Work<T>,
    me: Arc<Active>,
    active: ActiveList,
}

impl<T: Send + Sync> Completion for Retiring<T> {
    fn is_completed(&self) -> bool {
        self.me.retired.load(Ordering::SeqCst) || self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if self.me.retired.load(Ordering::SeqCst) {
            return Ok(true);
        }
        let done = relay_wait(&self.inner, timeout, |_| {})?;
        if done {
            let mut list = lock(&self.active);
            if let Some(i) = list.iter().position(|a| Arc::ptr_eq(a, &self.me)) {
                // The pointer one before the completed request: that one is marked inactive.
                let at = i.saturating_sub(1);
                list.remove(at).retired.store(true, Ordering::SeqCst);
            }
        }
        Ok(done)
    }
}

impl<T> Drop for Retiring<T> {
    fn drop(&mut self) {
        lock(&self.active).retain(|a| !Arc::ptr_eq(a, &self.me));
    }
}

impl WaitAnyRetiresPrevious {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let me = Arc::new(Active::default());
        lock(&self.active).push(me.clone());
        s.relayed(value, Arc::new(Retiring { inner: w, me, active: self.active.clone() }), meta)
    }
}

wrap_every_op!(WaitAnyRetiresPrevious);

// ---------------------------------------------------------------- pmodels/mpich #423

/// One peer's connection ([`FirstSendAtWait`]): sends issued before it exists wait for it, in
/// issue order.
#[derive(Default)]
struct PeerConn {
    connected: bool,
    queued: Vec<(Buf, Arc<OnceLock<Work<()>>>)>,
}

/// A first message to a peer that leaves only when its sender waits (pmodels/mpich #423
/// "messages don't get sent until MPI_Wait called": "when I send my first message with
/// MPI_Isend, the message is never actually delivered until the sending process calls
/// MPI_Wait"; the reply at the time was that this was known behaviour, against MPI's progress
/// rule that a receive completes once a matching nonblocking send was started). Here a
/// communicator's first send to each peer is queued until the connection to that peer is made,
/// and the connection is made inside the first wait of one of those sends; sends issued to the
/// peer meanwhile queue behind it (their order is kept). A receiver waiting for that first
/// message waits until the sender waits; a sender that polls `is_completed()` (or drops the send)
/// never sends it.
#[derive(Default)]
pub struct FirstSendAtWait {
    conns: Mutex<HashMap<usize, Arc<Mutex<PeerConn>>>>,
}

struct QueuedSend {
    be: Arc<ShmBackend>,
    dst: usize,
    conn: Arc<Mutex<PeerConn>>,
    mine: Arc<OnceLock<Work<()>>>,
}

impl Completion for QueuedSend {
    fn is_completed(&self) -> bool {
        self.mine.get().is_some_and(|w| w.is_completed())
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        {
            let mut c = lock(&self.conn);
            if !c.connected {
                c.connected = true;
                for (x, slot) in std::mem::take(&mut c.queued) {
                    let w = self.be.send(&x, self.dst)?;
                    let _ = slot.set(w);
                }
            }
        }
        match self.mine.get() {
            Some(w) => relay_wait(w, timeout, |_| {}),
            None => Err(CollectiveError::Backend(format!("send to {}: connection made but this send was never posted", self.dst))),
        }
    }
}

impl Bug for FirstSendAtWait {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let conn = lock(&self.conns).entry(dst).or_default().clone();
        let mut c = lock(&conn);
        // A bad peer is refused at issue, as the library checks its arguments there.
        if c.connected || dst >= s.ws() || dst == s.rank() {
            drop(c);
            return s.inner.send(x, dst);
        }
        let mine = Arc::new(OnceLock::new());
        c.queued.push((x.clone(), mine.clone()));
        drop(c);
        let meta = s.meta(&format!("send to {dst}"));
        Ok(Work::new((), Arc::new(QueuedSend { be: s.inner.clone(), dst, conn, mine }), meta, &s.own))
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchft PR #355

/// A managed work's callback chain bound late (meta-pytorch/torchft PR #355 "Fix managed-future
/// callback late binding and record_event return value", bug 1: `_ManagedWork` hooked its
/// callbacks up in a loop whose closures all shared one variable; "If the result is ready right
/// away (like in the existing tests with `_DummyWork`), the callback runs inside the loop and sees
/// the right spot. ... But with `ProcessGroupBabyNCCL`, the result comes later, from another
/// thread. Then every callback saw the end of the list, hit `assert None`, and failed. So every
/// allreduce failed"). Here the manager's all_reduce (both variants): a work already complete
/// at issue runs its callback on its own node and is right; one whose result comes later fails
/// its wait with the assertion.
#[derive(Default)]
pub struct ManagedWorkLateBinding;

fn managed(s: &Shm, w: Work<Buf>) -> Work<Buf> {
    if w.is_completed() {
        return w;
    }
    s.then(w, |_, _| {
        Err(CollectiveError::Backend(
            "_ManagedWork callback: the chain's node is None (assert None): every callback bound to the end of the list".into(),
        ))
    })
}

impl Bug for ManagedWorkLateBinding {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(managed(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(managed(s, s.inner.all_reduce_(x, op)?))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #30723

/// Point-to-point works whose completion is set only in `wait` (pytorch/pytorch #30723
/// "Distributed Package asynchronous send/receive not working as expected (Gloo)": "I'd like to
/// use `is_completed()` and "occasionally" check whether sending/receiving took place ... it
/// seems like that you *need* to couple each `dist.irecv` and `dist.isend` with a `req.wait()`
/// call"; Gloo's send / recv works kept the base work's `completed_` flag, which only `wait`
/// set, while the transfer ran in Gloo's transport). Here send and recv move their data as
/// usual, but `is_completed()` stays false until the work is waited.
#[derive(Default)]
pub struct GlooP2pCompletedOnlyInWait;

impl Bug for GlooP2pCompletedOnlyInWait {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(crate::bugs::only_once_waited(s, s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(crate::bugs::only_once_waited(s, s.inner.recv(out, src)?))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<TestReadsLastPosted>(
            "wild_test_reads_last_posted",
            "async.every_op_every_rank",
            "ai-dynamo/nixl PR #2176: a work's is_completed() reads the communicator's last posted request: a collective still waiting for a peer reads done once a later send / recv is",
            &["p2p::send_behind_pending_collective::ws2"],
        ),
        spec::<WaitAnyRetiresPrevious>(
            "wild_waitany_retires_previous",
            "async.every_op_every_rank",
            "open-mpi/ompi PR #1725: a completed wait marks inactive the request before it in the active list: an earlier pending op (a receive, a collective) completes at once with its buffer not written",
            &["p2p::send_behind_pending_collective::ws2"],
        ),
        spec::<FirstSendAtWait>(
            "wild_first_send_at_wait",
            "async.every_op_every_rank",
            "pmodels/mpich#423: a communicator's first send to a peer (and the sends behind it) leaves only inside the sender's wait: a polled or dropped first send never arrives",
            &["async::completes_without_wait::every_op::ws2"],
        ),
        spec::<ManagedWorkLateBinding>(
            "wild_managed_work_late_binding",
            "async.result_final_after_wait",
            "meta-pytorch/torchft PR #355: an all_reduce whose result comes after issue runs a callback bound to the end of the chain: its wait fails (assert None)",
            &["all_reduce::out::f32::sum::ws2"],
        ),
        spec::<GlooP2pCompletedOnlyInWait>(
            "wild_gloo_p2p_completed_only_in_wait",
            "async.every_op_every_rank",
            "pytorch/pytorch#30723: send / recv works report is_completed() only once waited (the data moves): a polling caller spins for ever",
            &["async::completes_without_wait::every_op::ws2"],
        ),
    ]
}
