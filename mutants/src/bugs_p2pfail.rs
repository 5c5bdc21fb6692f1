//! Point-to-point failure paths (helper p2pfail): review8's two unwritten findings (6 and 7)
//! and the failure-path bugs around them that a backend author ships. Each was written here
//! first and run against the whole catalogue before any case was added.
//!
//! Three of them route the world's sends and receives through a *second* communicator of their
//! own, as PyTorch's ProcessGroupNCCL does (send / recv run on a two-rank NCCL communicator per
//! pair, apart from the collectives' one), which the failure path never aborts: its ops run
//! with twenty times the op deadline, and how each work reports that (the bug) is the mutant's.
//! Its messages are staged through its own buffers (copied at issue for a send, into the
//! caller's `out` once received). Collectives stay on the correct communicator, so they fail
//! and poison as shm does. Only the world communicator has the second one (a subgroup's
//! point-to-point is shm's), and only without an injected fault (the fault suite counts the
//! faulty ops on one communicator).

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, Completion, Flag, Result, Work, WorldInfo};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- the never-aborted p2p comm

/// Which side's failure the [`SideP2p`] reports at the op deadline, leaving the op posted.
const LEFT_RECV: u8 = 0;
const LEFT_SEND: u8 = 1;
/// Neither side fails at the op deadline: a late peer completes the op, `Ok`.
const NO_DEADLINE: u8 = 2;

/// How many op deadlines the second communicator's ops run.
const SIDE_DEADLINES: u32 = 20;

/// Sends and receives on a second communicator that no failure aborts (module docs); `MODE`
/// says which works fail at the op deadline (their op left posted underneath) and which run on.
#[derive(Default)]
pub struct SideP2p<const MODE: u8> {
    side: Mutex<Option<Arc<ShmBackend>>>,
    deadline: Mutex<Duration>,
}

impl<const MODE: u8> SideP2p<MODE> {
    fn side(&self) -> Option<Arc<ShmBackend>> {
        lock(&self.side).clone()
    }
    /// The op deadline a work of this side reports, if any.
    fn reported(&self, recv: bool) -> Option<Duration> {
        let d = *lock(&self.deadline);
        match MODE {
            LEFT_RECV if recv => Some(d),
            LEFT_SEND if !recv => Some(d),
            _ => None,
        }
    }
}

/// A work that reports an inner op (`wait_inner`, `done`) failed with a timeout once `deadline`
/// has passed since issue, whatever the inner op does afterwards.
struct Deadlined {
    wait_inner: Box<dyn Fn(Duration) -> Result<bool> + Send + Sync>,
    done: Box<dyn Fn() -> bool + Send + Sync>,
    deadline: Option<Duration>,
    issued: Instant,
    expired: AtomicBool,
    op: String,
    rank: usize,
}

impl Deadlined {
    fn expire(&self) -> Result<bool> {
        self.expired.store(true, Ordering::SeqCst);
        Err(CollectiveError::Timeout {
            op: self.op.clone(),
            seq: 0,
            rank: self.rank,
            waited_ms: self.issued.elapsed().as_millis() as u64,
            detail: "the op deadline passed (the point-to-point communicator is not aborted: the op stays posted)".into(),
        })
    }
}

impl Completion for Deadlined {
    fn is_completed(&self) -> bool {
        self.expired.load(Ordering::SeqCst) || (self.done)()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let Some(d) = self.deadline else { return (self.wait_inner)(timeout) };
        if self.expired.load(Ordering::SeqCst) {
            return self.expire();
        }
        match (self.wait_inner)(timeout.min(d.saturating_sub(self.issued.elapsed()))) {
            Ok(false) if self.issued.elapsed() >= d => self.expire(),
            r => r,
        }
    }
}

/// `Completion::wait_for` of an inner work: `Ok(false)` while it is pending.
fn wait_work<T>(w: &Work<T>, t: Duration) -> Result<bool> {
    match w.wait(t) {
        Ok(_) => Ok(true),
        Err(CollectiveError::Timeout { .. }) if !w.is_completed() => Ok(false),
        Err(e) => Err(e),
    }
}

impl<const MODE: u8> Bug for SideP2p<MODE> {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if world.option(concord_core::fault::OPTION).is_none() {
            let w =
                WorldInfo { world_id: format!("{}-p2p", world.world_id), op_timeout: world.op_timeout * SIDE_DEADLINES, ..world.clone() };
            *lock(&self.side) = Some(Arc::new(ShmBackend::init(&w)?));
            *lock(&self.deadline) = world.op_timeout;
        }
        Ok(world.clone())
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let Some(p) = self.side() else { return s.inner.send(x, dst) };
        let staged = p.upload(&s.inner.download(x)?)?;
        let w = Arc::new(p.send(&staged, dst)?);
        let meta = w.meta().clone();
        let (w1, w2) = (w.clone(), w);
        let c = Deadlined {
            wait_inner: Box::new(move |t| wait_work(&w1, t)),
            done: Box::new(move || w2.is_completed()),
            deadline: self.reported(false),
            issued: Instant::now(),
            expired: AtomicBool::new(false),
            op: meta.op.clone(),
            rank: s.rank(),
        };
        Ok(Work::new((), Arc::new(c), meta, &s.own))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let Some(p) = self.side() else { return s.inner.recv(out, src) };
        let staging = p.alloc(s.inner.buffer_dtype(out), &s.inner.buffer_shape(out))?;
        let w = p.recv(&staging, src)?;
        let meta = w.meta().clone();
        let flag = Flag::new();
        let (f, main, side, target) = (flag.clone(), Arc::downgrade(&s.inner), Arc::downgrade(&p), out.clone());
        let limit = *lock(&self.deadline) * SIDE_DEADLINES + Duration::from_secs(5);
        // The message lands in `out` whenever it comes, whatever the caller was told meanwhile.
        std::thread::spawn(move || {
            let gone = || CollectiveError::Aborted("the backend was dropped".into());
            let r = w.wait(limit).and_then(|st| {
                let (m, sd) = (main.upgrade().ok_or_else(gone)?, side.upgrade().ok_or_else(gone)?);
                m.write(&target, &sd.download(st)?)
            });
            f.set(r);
        });
        let (f1, f2) = (flag.clone(), flag);
        let c = Deadlined {
            wait_inner: Box::new(move |t| f1.wait_for(t)),
            done: Box::new(move || f2.is_completed()),
            deadline: self.reported(true),
            issued: Instant::now(),
            expired: AtomicBool::new(false),
            op: meta.op.clone(),
            rank: s.rank(),
        };
        Ok(Work::new(out.clone(), Arc::new(c), meta, &s.own))
    }
}

// ---------------------------------------------------------------- failures reported as success

/// A point-to-point work relayed with some of its failures reported as success.
struct Swallowing<T> {
    inner: Work<T>,
    /// Whether this failure (of an op that has failed, not a wait that ran out) reads as success.
    swallow: Box<dyn Fn(&CollectiveError) -> bool + Send + Sync>,
}

impl<T: Send + Sync> Completion for Swallowing<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match wait_work(&self.inner, timeout) {
            Err(e) if !matches!(e, CollectiveError::BadInput { .. }) && (self.swallow)(&e) => Ok(true),
            r => r,
        }
    }
}

fn swallowing<T: Clone + Send + Sync + 'static>(
    s: &Shm,
    w: Work<T>,
    swallow: Box<dyn Fn(&CollectiveError) -> bool + Send + Sync>,
) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    s.relayed(value, Arc::new(Swallowing { inner: w, swallow }), meta)
}

/// A receive whose op failed (its deadline passed, its peer died, its communicator aborted)
/// reports success, with `out` as the failed op left it (partial or untouched): the receive
/// path maps the transport's "truncated / cancelled" completion status to success when the
/// status carries no error code of its own. Sends report their failures.
#[derive(Default)]
pub struct FailedRecvReportedOk;

impl Bug for FailedRecvReportedOk {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(swallowing(s, s.inner.recv(out, src)?, Box::new(|_| true)))
    }
}

/// A failure of several point-to-point ops in flight is reported on the first of them only
/// (the one whose completion carried the error: a batch's `MPI_Waitall` whose later statuses
/// are `MPI_ERR_PENDING`, read by the layer above as "not an error"): every later send or
/// receive of the communicator that fails reports success.
#[derive(Default)]
pub struct P2pFailureOnFirstOnly {
    reported: Arc<AtomicBool>,
}

impl P2pFailureOnFirstOnly {
    fn first_only(&self) -> Box<dyn Fn(&CollectiveError) -> bool + Send + Sync> {
        let r = self.reported.clone();
        Box::new(move |_| r.swap(true, Ordering::SeqCst))
    }
}

impl Bug for P2pFailureOnFirstOnly {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(swallowing(s, s.inner.send(x, dst)?, self.first_only()))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(swallowing(s, s.inner.recv(out, src)?, self.first_only()))
    }
}

// ---------------------------------------------------------------- un-waited sends at exit

/// A send the [`DropFlushesUnwaitedSends`] communicator holds until its drop.
struct HeldSend {
    w: Work<()>,
    /// The caller dropped its work un-waited.
    abandoned: AtomicBool,
    /// The op ended (waited to its success or failure).
    settled: AtomicBool,
}

/// The caller's side of a [`HeldSend`].
struct FrontSend(Arc<HeldSend>);

impl Completion for FrontSend {
    fn is_completed(&self) -> bool {
        self.0.w.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = wait_work(&self.0.w, timeout);
        if !matches!(r, Ok(false)) {
            self.0.settled.store(true, Ordering::SeqCst);
        }
        r
    }
}

impl Drop for FrontSend {
    fn drop(&mut self) {
        if !self.0.settled.load(Ordering::SeqCst) {
            self.0.abandoned.store(true, Ordering::SeqCst);
        }
    }
}

/// Finding 7, first half. The communicator's drop flushes its sends: it waits (here at most
/// [`BUG_WAIT`], in the original for ever) until every send it issued has completed, those the
/// caller dropped un-waited included (UCX's endpoint close in flush mode; `MPI_Finalize` in a
/// library that completes pending sends first). A receiver that never posts its receive holds
/// the sender's exit. Collectives are not held (the existing drop mutants' ground).
/// Clause `async.unwaited_exit`.
#[derive(Default)]
pub struct DropFlushesUnwaitedSends {
    held: Mutex<Vec<Arc<HeldSend>>>,
    be: Mutex<Option<Arc<ShmBackend>>>,
}

impl Bug for DropFlushesUnwaitedSends {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let w = s.inner.send(x, dst)?;
        let meta = w.meta().clone();
        let h = Arc::new(HeldSend { w, abandoned: AtomicBool::new(false), settled: AtomicBool::new(false) });
        {
            let mut held = lock(&self.held);
            // Ended ones go (an abandoned one's inner work with them).
            held.retain(|h| !(h.settled.load(Ordering::SeqCst) || h.abandoned.load(Ordering::SeqCst) && h.w.is_completed()));
            held.push(h.clone());
        }
        lock(&self.be).get_or_insert_with(|| s.inner.clone());
        Ok(s.relayed((), Arc::new(FrontSend(h)), meta))
    }
    fn outstanding(&self, s: &Shm) -> usize {
        // A send the caller dropped is no longer the caller's: its inner work, held here, is not
        // counted.
        let abandoned = lock(&self.held).iter().filter(|h| h.abandoned.load(Ordering::SeqCst) && !h.settled.load(Ordering::SeqCst)).count();
        (s.inner.outstanding() + s.own.get()).saturating_sub(abandoned)
    }
}

impl Drop for DropFlushesUnwaitedSends {
    fn drop(&mut self) {
        for h in std::mem::take(&mut *lock(&self.held)) {
            if !h.settled.load(Ordering::SeqCst) {
                let _ = h.w.wait(BUG_WAIT);
            }
        }
        lock(&self.be).take();
    }
}

/// A send queued for the next launch.
enum Lazy {
    Queued(Box<dyn FnOnce() -> Result<Work<()>> + Send>),
    Posted(Work<()>),
    Failed(CollectiveError),
    Withdrawn,
}

type Batch = Arc<Mutex<Vec<Arc<Mutex<Lazy>>>>>;

/// Posts every queued send, in issue order.
fn launch(batch: &Batch) {
    for l in lock(batch).drain(..) {
        let mut st = lock(&l);
        if let Lazy::Queued(_) = &*st {
            let Lazy::Queued(post) = std::mem::replace(&mut *st, Lazy::Withdrawn) else { unreachable!() };
            *st = match post() {
                Ok(w) => Lazy::Posted(w),
                Err(e) => Lazy::Failed(e),
            };
        }
    }
}

struct LazySend {
    me: Arc<Mutex<Lazy>>,
    batch: Batch,
}

impl Completion for LazySend {
    fn is_completed(&self) -> bool {
        launch(&self.batch);
        match &*lock(&self.me) {
            Lazy::Posted(w) => w.is_completed(),
            _ => true,
        }
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        launch(&self.batch);
        match &*lock(&self.me) {
            Lazy::Posted(w) => wait_work(w, timeout),
            Lazy::Failed(e) => Err(e.clone()),
            _ => Err(CollectiveError::Aborted("the send was withdrawn before it was launched".into())),
        }
    }
}

impl Drop for LazySend {
    fn drop(&mut self) {
        let mut st = lock(&self.me);
        if let Lazy::Queued(_) = &*st {
            *st = Lazy::Withdrawn;
        }
    }
}

/// How long a queued send waits for a call to launch it.
const LAUNCH_TICK: Duration = Duration::from_millis(20);

/// Finding 7, second half. Sends are batched: each is queued and launched with the next
/// point-to-point call (a send, a receive, a wait or poll of a send) or after a 20 ms tick; a
/// send whose work is dropped before its launch is taken out of the batch (a send held as a
/// future, cancelled when its handle is dropped). Fire-and-forget sends never reach their
/// receiver, whose receive never completes. Clause `async.unwaited_exit` (dropping a work never
/// withdraws its op).
#[derive(Default)]
pub struct DroppedSendWithdrawn {
    batch: Batch,
}

impl Bug for DroppedSendWithdrawn {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        launch(&self.batch);
        let (be, xx) = (s.inner.clone(), x.clone());
        let me = Arc::new(Mutex::new(Lazy::Queued(Box::new(move || be.send(&xx, dst)))));
        lock(&self.batch).push(me.clone());
        let batch = self.batch.clone();
        std::thread::spawn(move || {
            std::thread::sleep(LAUNCH_TICK);
            launch(&batch);
        });
        Ok(s.relayed((), Arc::new(LazySend { me, batch: self.batch.clone() }), s.meta(&format!("send to {dst}"))))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        launch(&self.batch);
        s.inner.recv(out, src)
    }
    fn outstanding(&self, s: &Shm) -> usize {
        // Queued sends count too (the registry holds every issued work; a withdrawn one is gone).
        let queued = lock(&self.batch).iter().filter(|l| matches!(*lock(l), Lazy::Queued(_))).count();
        s.inner.outstanding() + s.own.get() + queued
    }
}

// ---------------------------------------------------------------- a ring of large messages

/// From this many bytes a send takes the rendezvous path.
const RENDEZVOUS_BYTES: usize = 256 << 10;

/// How long a held receive waits for the sends ahead of it before the mutant lets it go (so
/// that a campaign world ends): longer than a case's wait (`Config::wait_timeout`, 16 s at the
/// default 20 s case deadline), so the deadlock is seen as one. At `BUG_WAIT` (15 s) the hold
/// ended a second before the case's wait, and the ring completed: the mutant survived the
/// campaign once (lead, after merging).
const RING_HOLD: Duration = Duration::from_secs(40);

/// A rendezvous send, as the caller sees it.
struct LargeSend {
    inner: Work<()>,
}

impl Completion for LargeSend {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        wait_work(&self.inner, timeout)
    }
}

/// Point-to-point ops go to the transport in issue order, and a rendezvous send (256 KiB or
/// more) holds the ops issued after it until its receiver has taken the message — except a
/// receive from the same peer, which joins the send's group (the send / recv pair of one peer
/// is launched together, as `batch_isend_irecv` of that pair would be). Sends and receives of
/// different peers are not grouped: a legal ring exchange of large messages (every rank sends
/// to the next, then receives from the previous, then waits) deadlocks from 3 ranks on — each
/// rank's receive waits behind its own send, whose receiver waits behind its own — while every
/// 2-rank exchange (next = previous) passes. NCCL's documented rule (sends and receives to
/// different peers must be grouped, or a ring deadlocks) broken by a layer that groups per peer.
/// Clause `p2p.no_deadlock`.
#[derive(Default)]
pub struct UngroupedRingDeadlocks {
    /// Rendezvous sends not yet known complete: (destination, the caller's work).
    blockers: Mutex<Vec<(usize, std::sync::Weak<LargeSend>)>>,
    /// Per source: the issue flag of the last receive held back, so that receives from one
    /// peer reach the transport in issue order.
    chains: Mutex<std::collections::HashMap<usize, Arc<Flag>>>,
}

impl Bug for UngroupedRingDeadlocks {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let w = s.inner.send(x, dst)?;
        if s.numel(x) * s.inner.buffer_dtype(x).size() < RENDEZVOUS_BYTES {
            return Ok(w);
        }
        let meta = w.meta().clone();
        let c = Arc::new(LargeSend { inner: w });
        lock(&self.blockers).push((dst, Arc::downgrade(&c)));
        Ok(s.relayed((), c, meta))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let blocking: Vec<std::sync::Weak<LargeSend>> = {
            let mut b = lock(&self.blockers);
            b.retain(|(_, w)| w.upgrade().is_some_and(|c| !c.is_completed()));
            b.iter().filter(|(d, _)| *d != src).map(|(_, w)| w.clone()).collect()
        };
        let mut chains = lock(&self.chains);
        let prev = chains.get(&src).filter(|f| !f.is_completed()).cloned();
        if blocking.is_empty() && prev.is_none() {
            return s.inner.recv(out, src);
        }
        let issued = Flag::new();
        chains.insert(src, issued.clone());
        drop(chains);
        let done = Flag::new();
        let (be, target, d) = (s.inner.clone(), out.clone(), done.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            // Held until every send ahead of it is done (or dropped by its caller).
            while t0.elapsed() < RING_HOLD && blocking.iter().any(|w| w.upgrade().is_some_and(|c| !c.is_completed())) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Some(p) = prev {
                let _ = p.wait_for(BUG_WAIT);
            }
            let r = be.recv(&target, src);
            issued.set(Ok(()));
            d.set(r.and_then(|w| w.wait(BUG_WAIT).map(|_| ())));
        });
        Ok(Work::new(out.clone(), done, s.meta(&format!("recv from {src}")), &s.own))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<SideP2p<LEFT_RECV>>(
            "p2pfail_recv_left_posted",
            "failure.no_touch_after_failed_wait",
            "review8 finding 6: a receive fails at the op deadline but stays posted on a point-to-point communicator no failure aborts; a late send matches it and writes the caller's buffer",
            &["faults::late_sender::recvs_in_flight::ws2"],
        ),
        spec::<SideP2p<LEFT_SEND>>(
            "p2pfail_send_left_posted",
            "failure.no_touch_after_failed_wait",
            "a send fails at the op deadline but stays posted on a point-to-point communicator no failure aborts; a late receive gets it, Ok",
            &["faults::late_receiver::sends_in_flight::ws2"],
        ),
        spec::<SideP2p<NO_DEADLINE>>(
            "p2pfail_p2p_no_op_deadline",
            "faults.absent_peer_bounded",
            "sends and receives run on a communicator whose op deadline is 20 times the caller's: an op whose peer is late never fails, and completes Ok when the peer comes",
            &["faults::late_sender::recvs_in_flight::ws2"],
        ),
        spec::<FailedRecvReportedOk>(
            "p2pfail_failed_recv_reported_ok",
            "failure.no_touch_after_failed_wait",
            "a receive whose op failed (deadline, dead peer, abort) reports Ok with out as the failed op left it",
            &["faults::late_sender::recvs_in_flight::ws2"],
        ),
        spec::<P2pFailureOnFirstOnly>(
            "p2pfail_failure_on_first_op_only",
            "failure.no_touch_after_failed_wait",
            "a failure of several sends / receives in flight is reported on the first only; every later one that fails reports Ok",
            &["faults::late_sender::recvs_in_flight::ws2"],
        ),
        spec::<DropFlushesUnwaitedSends>(
            "p2pfail_drop_flushes_unwaited_sends",
            "async.unwaited_exit",
            "review8 finding 7: the communicator's drop waits for every send it issued, the un-waited ones too: a receiver that never posts holds the exit",
            &["async::unwaited_send_exits_within_3s::peer_absent::ws2"],
        ),
        spec::<DroppedSendWithdrawn>(
            "p2pfail_dropped_send_withdrawn",
            "async.unwaited_exit",
            "review8 finding 7: sends launch in a batch at the next p2p call or a 20 ms tick; one dropped un-waited before that is withdrawn and its receive never completes",
            &["async::dropped_send_still_delivered::ws2"],
        ),
        spec::<UngroupedRingDeadlocks>(
            "p2pfail_ungrouped_ring_deadlocks",
            "p2p.no_deadlock",
            "a rendezvous send (>= 256 KiB) holds the receives from other peers issued after it: a ring exchange of large messages deadlocks from 3 ranks on",
            &["p2p::ring_exchange::large::ws3"],
        ),
    ]
}
