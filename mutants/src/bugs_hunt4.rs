//! The fourth outside hunt: semantics over time and failure paths. Waits with a sub-second
//! deadline, the sequence number a timeout names, a work dropped before it was posted, a failed
//! work that never reports completion, failed works left in the registry, a result copied back
//! after the wait returned, a receive cancelled by its own timed-out wait; bad input seen by one
//! rank only; a large send that blocks at issue; a tuned backend's cached plan and first-call
//! tuning; the fused ops' works in flight and in the registry; declared capabilities (aliasing,
//! integer avg) on the ops the probes did not look at. Each is a bug a backend author could ship,
//! over the correct shm backend.

use crate::bugs_hunt2::{int_at, set_int};
use crate::campaign::Spec;
use crate::lock;
use crate::{edit, Buf, Bug, Mutant, Shm, Twist};
use concord_core::fused::Gathered;
use concord_core::{
    Backend, BadInputKind, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Implements every op hook of [`Bug`] as the correct shm call, with `$before` run before it is
/// issued and the issued work `$w` replaced by `$wrap` (the same expression, typed per op);
/// `$extra` adds or overrides the other hooks.
macro_rules! every_op {
    ($t:ty, |$me:ident, $s:ident| $before:block, |$w:ident| $wrap:expr, { $($extra:tt)* }) => {
        every_op!($t, |$me, $s| $before, |$w| $wrap, except_all_reduce_ {
            $($extra)*
            fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_reduce_(x, op)?;
                Ok($wrap)
            }
        });
    };
    ($t:ty, |$me:ident, $s:ident| $before:block, |$w:ident| $wrap:expr, except_all_reduce_ { $($extra:tt)* }) => {
        impl Bug for $t {
            $($extra)*
            fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_reduce(x, op)?;
                Ok($wrap)
            }
            fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_reduce_coalesced(xs, op)?;
                Ok($wrap)
            }
            fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_reduce_coalesced_(xs, op)?;
                Ok($wrap)
            }
            fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_gather_into_tensor(x)?;
                Ok($wrap)
            }
            fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_gather_into_tensor_out(x, out)?;
                Ok($wrap)
            }
            fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_gather_into_tensor_coalesced(xs)?;
                Ok($wrap)
            }
            fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.reduce_scatter_tensor(x, op)?;
                Ok($wrap)
            }
            fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
                Ok($wrap)
            }
            fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
                Ok($wrap)
            }
            fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.all_to_all_single(x, o, i)?;
                Ok($wrap)
            }
            fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.broadcast(x, src)?;
                Ok($wrap)
            }
            fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.broadcast_(x, src)?;
                Ok($wrap)
            }
            fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.permute_tensor(x, src_dst)?;
                Ok($wrap)
            }
            fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.reduce(x, op, root)?;
                Ok($wrap)
            }
            fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.gather(x, root)?;
                Ok($wrap)
            }
            fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.scatter(x, root)?;
                Ok($wrap)
            }
            fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.send(x, dst)?;
                Ok($wrap)
            }
            fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.recv(out, src)?;
                Ok($wrap)
            }
            fn barrier(&self, s: &Shm) -> Result<Work<()>> {
                let ($me, $s) = (self, s);
                let _ = (&$me, &$s);
                $before
                let $w = s.inner.barrier()?;
                Ok($wrap)
            }
        }
    };
}

/// A completion that relays an inner work (its value, completion and failure), with a hook on
/// each outcome of a wait and on `is_completed`.
struct Relay<T> {
    inner: Work<T>,
    /// `is_completed()` given the inner work.
    completed: fn(&Work<T>) -> bool,
    /// Runs on a failure (not a timeout) the first time a wait returns it.
    on_failure: Option<Arc<AtomicUsize>>,
}

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        (self.completed)(&self.inner)
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |_| {
            if let Some(n) = &self.on_failure {
                n.fetch_add(1, Ordering::SeqCst);
            }
        })
    }
}

/// `w` relayed through a [`Relay`], counted in `hidden` (never reported: the inner work is).
fn relay<T: Clone + Send + Sync + 'static>(
    w: Work<T>,
    hidden: &OutstandingCounter,
    meta: impl FnOnce(&mut concord_core::WorkMeta),
    completed: fn(&Work<T>) -> bool,
    on_failure: Option<Arc<AtomicUsize>>,
) -> Work<T> {
    let value = w.peek().clone();
    let mut m = w.meta().clone();
    meta(&mut m);
    Work::new(value, Arc::new(Relay { inner: w, completed, on_failure }), m, hidden)
}

// ---------------------------------------------------------------- waits and deadlines

/// The library's wait takes whole seconds: `wait(t)` waits `floor(t)` seconds, so a wait with a
/// sub-second deadline is a poll (a named timeout at once, though the op would have completed
/// well within the deadline).
#[derive(Default)]
pub struct SubSecondWaitIsPoll;

fn whole_seconds(t: Duration) -> Duration {
    Duration::from_secs(t.as_secs())
}

/// `w` whose waits wait whole seconds only.
fn poll_below_a_second<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let v = w.peek().clone();
    s.twisted(w, v, Twist { wait_instead: Some(whole_seconds), ..Twist::default() }, |_, _| Ok(()))
}

every_op!(SubSecondWaitIsPoll, |me, s| {}, |w| poll_below_a_second(s, w), {});

/// A work's sequence number is read before the communicator's counter is incremented: every
/// timeout names the previous op's number (the in-flight record, made after the increment,
/// names the right one).
#[derive(Default)]
pub struct TimeoutSeqOffByOne {
    hidden: OutstandingCounter,
}

every_op!(TimeoutSeqOffByOne, |me, _s| {}, |w| relay(w, &me.hidden, |m| m.seq = m.seq.saturating_sub(1), |w| w.is_completed(), None), {});

/// A first call of each (dtype, shape) of `all_reduce` on a communicator tunes the backend's
/// algorithm (a tuned backend): its wait runs the tuning to the end under the tuner's own budget
/// (5 s), not the caller's deadline.
#[derive(Default)]
pub struct FirstCallTuningIgnoresDeadline {
    seen: Mutex<HashSet<(DType, Vec<usize>)>>,
}

impl Bug for FirstCallTuningIgnoresDeadline {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let first = lock(&self.seen).insert((s.inner.buffer_dtype(x), s.inner.buffer_shape(x)));
        let w = s.inner.all_reduce(x, op)?;
        if !first {
            return Ok(w);
        }
        let v = w.peek().clone();
        let twist = Twist { wait_instead: Some(|t| t.max(Duration::from_secs(5))), ..Twist::default() };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- works over time

/// In-place `all_reduce_` is queued for a launcher that posts it at the next wait, poll or
/// issue on the communicator (fire-and-forget in-place all_reduces are batched); a work dropped
/// before that is withdrawn, so its peers wait for a side that never comes.
#[derive(Default)]
pub struct DroppedInPlaceWithdrawn {
    queue: Arc<Mutex<Vec<Arc<Lazy>>>>,
    hidden: OutstandingCounter,
}

pub(crate) type Post = Box<dyn FnOnce() -> Result<Work<Buf>> + Send>;

pub(crate) enum LazyState {
    Queued(Post),
    Posted(Work<Buf>),
    Failed(CollectiveError),
    Withdrawn,
}

pub(crate) struct Lazy {
    pub(crate) state: Mutex<LazyState>,
}

impl Lazy {
    pub(crate) fn post(&self) {
        let mut st = lock(&self.state);
        if let LazyState::Queued(_) = &*st {
            let LazyState::Queued(post) = std::mem::replace(&mut *st, LazyState::Withdrawn) else { unreachable!() };
            *st = match post() {
                Ok(w) => LazyState::Posted(w),
                Err(e) => LazyState::Failed(e),
            };
        }
    }
}

/// Posts every queued op, in issue order.
pub(crate) fn flush(queue: &Mutex<Vec<Arc<Lazy>>>) {
    let mut q = lock(queue);
    for l in q.drain(..) {
        l.post();
    }
}

pub(crate) struct LazyWork {
    pub(crate) lazy: Arc<Lazy>,
    pub(crate) queue: Arc<Mutex<Vec<Arc<Lazy>>>>,
}

impl Completion for LazyWork {
    fn is_completed(&self) -> bool {
        flush(&self.queue);
        match &*lock(&self.lazy.state) {
            LazyState::Posted(w) => w.is_completed(),
            LazyState::Failed(_) => true,
            _ => false,
        }
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        flush(&self.queue);
        match &*lock(&self.lazy.state) {
            LazyState::Posted(w) => match w.wait(timeout) {
                Ok(_) => Ok(true),
                Err(CollectiveError::Timeout { .. }) => Ok(false),
                Err(e) => Err(e),
            },
            LazyState::Failed(e) => Err(e.clone()),
            _ => Err(CollectiveError::Aborted("the op was withdrawn before it was posted".into())),
        }
    }
}

impl Drop for LazyWork {
    fn drop(&mut self) {
        let mut st = lock(&self.lazy.state);
        if let LazyState::Queued(_) = &*st {
            *st = LazyState::Withdrawn;
        }
    }
}

every_op!(DroppedInPlaceWithdrawn, |me, _s| { flush(&me.queue) }, |w| w, except_all_reduce_ {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (be, xx) = (s.inner.clone(), x.clone());
        let lazy = Arc::new(Lazy { state: Mutex::new(LazyState::Queued(Box::new(move || be.all_reduce_(&xx, op)))) });
        lock(&self.queue).push(lazy.clone());
        let meta = s.meta("all_reduce_");
        Ok(Work::new(x.clone(), Arc::new(LazyWork { lazy, queue: self.queue.clone() }), meta, &self.hidden))
    }
    fn outstanding(&self, s: &Shm) -> usize {
        // Queued works count too (the registry holds every issued work; a withdrawn one is gone).
        let queued = lock(&self.queue).iter().filter(|l| matches!(*lock(&l.state), LazyState::Queued(_))).count();
        s.inner.outstanding() + s.own.get() + queued
    }
});

/// A failed op's work never reports completion: `is_completed()` is true only on success, so a
/// caller polling it (`while not work.is_completed()`) spins for ever on a failure.
#[derive(Default)]
pub struct FailedWorkNeverCompleted {
    hidden: OutstandingCounter,
}

fn completed_only_on_success<T>(w: &Work<T>) -> bool {
    // The outcome of a completed work, without blocking.
    w.is_completed() && w.wait(Duration::ZERO).is_ok()
}

every_op!(FailedWorkNeverCompleted, |me, _s| {}, |w| relay(w, &me.hidden, |_| (), completed_only_on_success, None), {
    fn outstanding(&self, s: &Shm) -> usize {
        // Every work is relayed: the relays' count is the registry (a poll may settle the inner one).
        self.hidden.get() + s.own.get()
    }
});

/// The work registry forgets a work only when its wait succeeds: a work whose wait returned its
/// failure stays in `outstanding()` for ever.
#[derive(Default)]
pub struct FailedWorksStayCounted {
    hidden: OutstandingCounter,
    failed: Arc<AtomicUsize>,
}

every_op!(FailedWorksStayCounted, |me, _s| {}, |w| relay(w, &me.hidden, |_| (), |w| w.is_completed(), Some(me.failed.clone())), {
    fn outstanding(&self, s: &Shm) -> usize {
        s.inner.outstanding() + s.own.get() + self.failed.load(Ordering::SeqCst)
    }
});

/// In-place `all_reduce_` reduces into a staging buffer; the copy back into the caller's buffer
/// is queued on a copy thread, and the wait returns once the reduction is done, not the copy: a
/// read right after the wait sees the caller's input for a few milliseconds.
#[derive(Default)]
pub struct InPlaceCopyBackAfterWait;

impl Bug for InPlaceCopyBackAfterWait {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let input = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        let be = s.inner.clone();
        Ok(s.then(w, move |_, out| {
            let result = be.download(out)?;
            be.write(out, &input)?;
            let out = out.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                let _ = be.write(&out, &result);
            });
            Ok(())
        }))
    }
}

/// A receive whose wait timed out is cancelled (`MPI_Cancel` on a timeout): every later wait of
/// that work returns an abort, although the message arrives (into the cancelled buffer).
#[derive(Default)]
pub struct RecvCancelledByTimedOutWait {
    hidden: OutstandingCounter,
}

struct CancelOnTimeout {
    inner: Work<Buf>,
    cancelled: AtomicBool,
}

impl Completion for CancelOnTimeout {
    fn is_completed(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst) || self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(CollectiveError::Aborted("the receive was cancelled when an earlier wait of it timed out".into()));
        }
        match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => {
                self.cancelled.store(true, Ordering::SeqCst);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

impl Bug for RecvCancelledByTimedOutWait {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Ok(Work::new(v, Arc::new(CancelOnTimeout { inner: w, cancelled: AtomicBool::new(false) }), meta, &self.hidden))
    }
}

// ---------------------------------------------------------------- bad input on one rank

/// The `_out` size check runs on the rank that holds the buffer, before the op is posted, and
/// returns the error at once without telling the peers: with a wrong-sized output on one rank
/// only, the other ranks wait for a side that never comes (then pair with its next op).
#[derive(Default)]
pub struct OutSizeRefusedLocallyOnly;

impl Bug for OutSizeRefusedLocallyOnly {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let want = s.numel(x) * s.ws();
        if s.numel(out) != want && s.inner.buffer_dtype(out) == s.inner.buffer_dtype(x) {
            let detail = format!("output holds {} elements, expected {want}", s.numel(out));
            return Err(CollectiveError::bad_input(BadInputKind::OutBufferSize, "all_gather_into_tensor_out", 0, s.rank(), detail));
        }
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let divisible = shape.first().is_some_and(|d0| d0 % s.ws() == 0);
        let want = s.numel(x) / s.ws();
        if divisible && s.numel(out) != want && s.inner.buffer_dtype(out) == s.inner.buffer_dtype(x) {
            let detail = format!("output holds {} elements, expected {want}", s.numel(out));
            return Err(CollectiveError::bad_input(BadInputKind::OutBufferSize, "reduce_scatter_tensor_out", 0, s.rank(), detail));
        }
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

// ---------------------------------------------------------------- point to point

/// Sends of 256 KiB or more use a rendezvous protocol that blocks the caller at issue until the
/// receiver has taken the message (or the handshake gives up, after 5 s): two ranks that both
/// send a large message before receiving deadlock (the contract: issuing never blocks on the
/// peer).
#[derive(Default)]
pub struct LargeSendBlocksAtIssue;

const RENDEZVOUS_GIVES_UP: Duration = Duration::from_secs(5);

impl Bug for LargeSendBlocksAtIssue {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let w = s.inner.send(x, dst)?;
        if s.numel(x) * s.inner.buffer_dtype(x).size() >= 256 << 10 {
            // Blocks until the send settled (received, or failed) or the handshake gave up: the
            // work reports its outcome.
            let _ = w.wait(RENDEZVOUS_GIVES_UP);
        }
        Ok(w)
    }
}

// ---------------------------------------------------------------- a tuned backend

/// A tuned backend caches its all_reduce plan (algorithm and chunking, in bytes) per element
/// count: a later call with the same count in a wider dtype runs the cached plan, which covers
/// only the first bytes the plan was made for; the rest of the result is this rank's input.
#[derive(Default)]
pub struct PlanCachedByNumel {
    plans: Mutex<HashMap<usize, usize>>,
}

impl Bug for PlanCachedByNumel {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = s.numel(x);
        let bytes = n * s.inner.buffer_dtype(x).size();
        let plan = *lock(&self.plans).entry(n).or_insert(bytes);
        if plan >= bytes {
            return s.inner.all_reduce(x, op);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| edit(be, out, |t| t.bytes_mut()[plan..].copy_from_slice(&mine.bytes()[plan..]))))
    }
}

// ---------------------------------------------------------------- fused ops

/// A pipelined `fused_all_gather_matmul` stages its results in one workspace per (shapes,
/// dtype, dim) and copies them out when the work is waited: with two same-shaped calls in
/// flight, the first one's wait returns the second one's results.
#[derive(Default)]
pub struct FusedAgWorkspaceReadAtWait {
    slots: Arc<Mutex<HashMap<String, Vec<Tensor>>>>,
}

impl Bug for FusedAgWorkspaceReadAtWait {
    fn fused_all_gather_matmul(
        &self,
        m: &Mutant,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Gathered<Buf>>> {
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, scaling)?;
        let be = &m.s.inner;
        let shapes: Vec<Vec<usize>> = std::iter::once(a).chain(bs).map(|x| be.buffer_shape(x)).collect();
        let key = format!("{:?}/{}/{dim}/{}", shapes, be.buffer_dtype(a), scaling.is_some());
        // The decomposition completed before returning: its buffers are final.
        let (ag, outs) = w.peek();
        let staged: Vec<Tensor> = std::iter::once(ag).chain(outs).map(|x| be.download(x)).collect::<Result<_>>()?;
        lock(&self.slots).insert(key.clone(), staged);
        let slots = self.slots.clone();
        Ok(m.s.then(w, move |be, (ag, outs)| {
            let staged = lock(&slots).get(&key).cloned().unwrap_or_default();
            std::iter::once(ag).chain(outs).zip(&staged).try_for_each(|(o, t)| be.write(o, t))
        }))
    }
}

// ---------------------------------------------------------------- failures

/// A non-root's side of `broadcast` reports success when the op fails (its receive loop ends
/// on the error and marks the work done): a root that failed after posting leaves the non-roots
/// with `Ok` and whatever their buffer held. Bad input and timeouts are still reported.
#[derive(Default)]
pub struct BroadcastFailureOkOnNonRoot {
    hidden: OutstandingCounter,
}

struct SwallowFailure<T> {
    inner: Work<T>,
}

impl<T: Send + Sync> Completion for SwallowFailure<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e @ CollectiveError::BadInput { .. }) => Err(e),
            Err(_) => Ok(true),
        }
    }
}

impl BroadcastFailureOkOnNonRoot {
    fn non_root(&self, s: &Shm, w: Work<Buf>, src: usize) -> Work<Buf> {
        if s.rank() == src {
            return w;
        }
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Work::new(v, Arc::new(SwallowFailure { inner: w }), meta, &self.hidden)
    }
}

impl Bug for BroadcastFailureOkOnNonRoot {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.non_root(s, s.inner.broadcast(x, src)?, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.non_root(s, s.inner.broadcast_(x, src)?, src))
    }
}

// ---------------------------------------------------------------- declared capabilities

/// The aliasing check (declared `AliasPolicy::Reject`) is written for `all_gather_into_tensor_out`
/// only: a `reduce_scatter_tensor_out` whose output overlaps its input is accepted (computed
/// through a temporary buffer).
#[derive(Default)]
pub struct ReduceScatterAliasUnchecked;

impl Bug for ReduceScatterAliasUnchecked {
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let span = |b: &Buf| {
            let (parent, off) = s.view_of(b).unwrap_or((b.clone(), 0));
            (s.inner.buffer_addr(&parent), off, off + s.numel(b))
        };
        let ((px, x0, x1), (po, o0, o1)) = (span(x), span(out));
        if px != po || o1 <= x0 || x1 <= o0 || s.inner.buffer_dtype(x) != s.inner.buffer_dtype(out) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let tmp = s.inner.alloc(s.inner.buffer_dtype(out), &s.inner.buffer_shape(out))?;
        let w = s.inner.reduce_scatter_tensor_out(x, op, &tmp)?;
        let o = out.clone();
        Ok(s.then_as(w, out.clone(), move |be, t| be.write(&o, &be.download(t)?)))
    }
}

/// Signed-integer `avg` of `reduce_scatter_tensor` divides the sum with an arithmetic shift /
/// floor division (rounding toward -inf) while the backend declares `IntAvg::Truncate` (and its
/// all_reduce truncates).
#[derive(Default)]
pub struct ReduceScatterIntAvgFloors;

impl Bug for ReduceScatterIntAvgFloors {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if op != ReduceOp::Avg || !s.inner.buffer_dtype(x).is_signed_int() {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let ws = s.ws() as i128;
        let w = s.inner.reduce_scatter_tensor(x, ReduceOp::Sum)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = int_at(t, i);
                    set_int(t, i, v.div_euclid(ws));
                }
            })
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<SubSecondWaitIsPoll>(
            "sub_second_wait_is_poll",
            "async.deadline",
            "wait(t) waits floor(t) whole seconds: a sub-second wait is a poll that times out at once",
            &["async::sub_second_wait_waits_its_deadline::ws2"],
        ),
        spec::<TimeoutSeqOffByOne>(
            "timeout_seq_off_by_one",
            "progress.recorded",
            "a work's sequence number is read before the increment: every timeout names the previous op's number",
            &["async::timeout_names_its_sequence_number::ws2"],
        ),
        spec::<FirstCallTuningIgnoresDeadline>(
            "first_call_tuning_ignores_deadline",
            "async.deadline",
            "a tuned backend's first all_reduce of each (dtype, shape) tunes inside its wait, under its own 5 s budget, not the caller's deadline",
            &["async::peer_never_joins_then_recovers::ws2"],
        ),
        spec::<DroppedInPlaceWithdrawn>(
            "dropped_inplace_withdrawn",
            "async.every_op_every_rank",
            "in-place all_reduce_ is posted at the next wait / poll / issue; a work dropped before that is withdrawn and its peers wait",
            &["async::dropped_work_still_runs_for_its_peers::ws2"],
        ),
        spec::<FailedWorkNeverCompleted>(
            "failed_work_never_completed",
            "failure.no_touch_after_failed_wait",
            "is_completed() is true only on success: a caller polling a failed op spins for ever",
            &["async::failed_work_reports_completed::ws2"],
        ),
        spec::<FailedWorksStayCounted>(
            "failed_works_stay_counted",
            "quiescence",
            "the registry forgets a work only when its wait succeeds: failed works stay in outstanding()",
            &["bad_input::all_reduce_shape_mismatch::ws2"],
        ),
        spec::<InPlaceCopyBackAfterWait>(
            "inplace_copy_back_after_wait",
            "async.result_final_after_wait",
            "all_reduce_'s wait returns before the result is copied back into the caller's buffer (5 ms later)",
            &["all_reduce::inplace::"],
        ),
        spec::<RecvCancelledByTimedOutWait>(
            "recv_cancelled_by_timed_out_wait",
            "async.every_op_every_rank",
            "a receive whose wait timed out is cancelled: every later wait of it is an abort",
            &["async::pending_until_peers_arrive::send_recv::outbuf::ws2"],
        ),
        spec::<OutSizeRefusedLocallyOnly>(
            "out_size_refused_locally_only",
            "bad_input.named_everywhere",
            "a wrong-sized _out buffer is refused at issue on its rank only: the peers are never told",
            &["bad_input::all_gather_out_wrong_size_on_one_rank::ws2", "bad_input::reduce_scatter_out_wrong_size_on_one_rank::ws2"],
        ),
        spec::<LargeSendBlocksAtIssue>(
            "large_send_blocks_at_issue",
            "p2p.no_deadlock",
            "sends of 256 KiB or more block at issue until received (the handshake gives up after 5 s): both ranks sending first deadlock",
            &["p2p::sends_first_both::large::ws2"],
        ),
        spec::<PlanCachedByNumel>(
            "plan_cached_by_numel",
            "values.reduce",
            "a tuned backend caches its all_reduce plan (in bytes) per element count: the same count in a wider dtype is reduced only over the cached bytes",
            &["state::dtypes_widening::all_reduce::out::ws2"],
        ),
        spec::<FusedAgWorkspaceReadAtWait>(
            "fused_ag_workspace_read_at_wait",
            "fused.buffers",
            "fused_all_gather_matmul copies its results out of a per-shape workspace at wait: two calls in flight, the first gets the second's",
            &["fused::all_gather_matmul::dim0::f32::in_flight_twice::"],
        ),
        spec::<BroadcastFailureOkOnNonRoot>(
            "broadcast_failure_ok_on_non_root",
            "failure.no_touch_after_failed_wait",
            "a non-root's broadcast reports Ok when the op fails (not bad input, not a timeout): a failed root leaves them Ok",
            &["faults::fail_after_post::broadcast::ws2"],
        ),
        spec::<ReduceScatterAliasUnchecked>(
            "reduce_scatter_alias_unchecked",
            "bad_input.named_everywhere",
            "the aliasing check (declared Reject) covers all_gather_into_tensor_out only: an aliased reduce_scatter_tensor_out is accepted",
            &["reuse::aliasing::reduce_scatter_out_inside_input::ws2"],
        ),
        spec::<ReduceScatterIntAvgFloors>(
            "reduce_scatter_int_avg_floors",
            "values.reduce",
            "signed-integer reduce_scatter_tensor avg rounds toward -inf while the backend declares Truncate",
            &["reduce_scatter_tensor::out::i8::avg::ws2"],
        ),
    ]
}
