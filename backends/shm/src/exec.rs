//! The communicator and its engine, which runs the collectives of one backend instance in issue
//! order, on the progress thread or inline on a waiting caller's thread ([`Engine`],
//! [`CollWork`]); point-to-point ops wait in per-peer queues (in issue order per peer) and are
//! served in between, never blocking the thread (so legal send/recv programs cannot deadlock). Each collective: post (in the rank's arena) → barrier → every rank decodes
//! every post and validates every rank's call with the core rule table
//! ([`concord_core::validate_all`]) → on a verdict of bad input one
//! more barrier and the same named error on every rank; otherwise the data movement (ranks read
//! peers' buffers directly in shared memory) and a final barrier, after which no peer touches
//! this rank's buffers any more.

use crate::arena::World;
use crate::ctl::{Ctl, Entry, WaitErr, V_CLAIMED, V_RECV_FAILED, V_WITHDRAWN};
use crate::post::{self, Desc, Post};
use crate::sys::{self, Mapping, Region};
use crate::ShmBuffer;
use concord_core::{
    fault::{point, Action, Fault},
    progress, validate_all, validate_pair, BadInputKind, CallDesc, CallOp, CollectiveError, Completion, Flag, ReduceOp, Result, TensorDesc,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One communicator (the world or a subgroup) as seen by one rank.
pub struct Comm {
    pub world: Arc<World>,
    pub ctl: Ctl,
    pub n: usize,
    pub me: usize,
    /// Communicator rank → global (world) rank, for arena lookup.
    pub globals: Vec<usize>,
    /// "" for the world, "g1", "g1g2", ... for subgroups (part of segment names).
    pub tag: String,
    /// Name recorded in [`progress`] (unique per communicator and rank).
    pub label: String,
    pub op_timeout: Duration,
    /// Set when the backend is dropped: every wait gives up at once.
    pub abort: AtomicBool,
    /// The injected faults of this rank (option `fault`, communicator created by `init` only).
    pub fault: Vec<Fault>,
    /// Ops issued so far (collectives, `new_group`, sends and receives), to find a fault's op.
    pub issued: AtomicU64,
    /// The faults meant for this communicator's groups (`/G`, every rank's: a group's rank is
    /// known once it is made; communicator created by `init` only).
    pub group_faults: Vec<Fault>,
    /// `new_group` calls issued so far (numbers the groups the faults name, from 1).
    pub groups_made: AtomicU64,
    /// The reduction semantics chosen by the world's options (inherited by subgroups).
    pub chosen: crate::kernels::Chosen,
}

impl Comm {
    /// The fault to inject into the op being issued now (counts the op).
    pub fn next_fault(&self) -> Option<Fault> {
        let nth = self.issued.fetch_add(1, SeqCst);
        self.fault.iter().find(|f| f.nth.is_none_or(|n| n == nth)).cloned()
    }

    /// Injects `fault` if it strikes at `at`: stall, fail (a named error), panic or die.
    pub fn strike(&self, fault: &Option<Fault>, at: &str, op: &str, seq: u64) -> Result<()> {
        let Some(f) = fault.as_ref().filter(|f| f.point == at) else { return Ok(()) };
        let what = format!("{op} #{seq} on rank {} at {at}", self.me);
        match f.action {
            Action::Stall => {
                // Without a stall time: past the op's deadline (the peers' waits end first).
                std::thread::sleep(f.stall.unwrap_or(self.op_timeout + Duration::from_secs(1)));
                Ok(())
            }
            Action::Fail => Err(CollectiveError::Backend(format!("shm backend: injected fault: {what} failed"))),
            Action::Panic => panic!("shm backend: injected fault: panic in {what}"),
            Action::Die => sys::die_now(concord_core::fault::DIE_EXIT_CODE),
        }
    }

    pub fn region(&self, r: usize, d: &Desc) -> Region {
        self.world.mapped_region(self.globals[r], d.off as usize, d.nbytes())
    }

    fn wait_error(&self, e: WaitErr, op: &str, seq: u64, started: Instant) -> CollectiveError {
        match e {
            WaitErr::Timeout { peer } => CollectiveError::Timeout {
                op: op.to_string(),
                seq,
                rank: self.me,
                waited_ms: started.elapsed().as_millis() as u64,
                detail: format!("shm backend: rank {peer} did not arrive within the op deadline of {:?}", self.op_timeout),
            },
            WaitErr::Dead { peer, detail } => {
                CollectiveError::PeerDied { op: op.to_string(), seq, rank: self.me, peer, detail: format!("shm backend: {detail}") }
            }
            WaitErr::Aborted(msg) => CollectiveError::Aborted(format!("{op} #{seq} on rank {}: {msg}", self.me)),
        }
    }
}

/// What the progress thread hands back from a `new_group` op: the group's tag and, for members,
/// the group's control segment.
pub type GroupReply = mpsc::Sender<(String, Option<Mapping>)>;

// A job is built once per op and moved once into the channel: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    /// `failed`: this rank's side already failed at issue (an output it could not allocate):
    /// the op is never posted, only its steps published marked failed (see `collective`).
    Coll {
        name: String,
        post: Post,
        keep: Vec<ShmBuffer>,
        flag: Arc<Flag>,
        reply: Option<GroupReply>,
        fault: Option<Fault>,
        failed: Option<CollectiveError>,
    },
    Send {
        k: u32,
        dst: usize,
        entry: Entry,
        comp: Arc<SendCompletion>,
        fault: Option<Fault>,
    },
    Recv {
        k: u32,
        src: usize,
        out: ShmBuffer,
        flag: Arc<Flag>,
        fault: Option<Fault>,
    },
}

/// Completion of a send: posted by the progress thread, complete once the receiver consumed it;
/// the receiver's verdict (a named bad input) is reported on the sender too.
pub struct SendCompletion {
    pub comm: Arc<Comm>,
    pub dst: usize,
    pub k: u32,
    pub posted: Arc<Flag>,
    /// The sent buffer, kept alive until the receiver has consumed it.
    pub keep: Mutex<Option<ShmBuffer>>,
    outcome: Mutex<Option<Result<()>>>,
    /// When the progress thread posted the message: the op deadline counts from there.
    posted_at: std::sync::OnceLock<Instant>,
}

impl SendCompletion {
    pub fn new(comm: Arc<Comm>, dst: usize, k: u32, keep: ShmBuffer) -> Arc<SendCompletion> {
        Arc::new(SendCompletion {
            comm,
            dst,
            k,
            posted: Flag::new(),
            keep: Mutex::new(Some(keep)),
            outcome: Mutex::new(None),
            posted_at: std::sync::OnceLock::new(),
        })
    }

    /// The op deadline of a posted send: one op deadline after it was posted.
    fn op_deadline(&self) -> Option<Instant> {
        self.posted_at.get().map(|&t| t + self.comm.op_timeout)
    }

    /// A posted send whose receiver has not taken the message by the op deadline fails with a
    /// timeout and its message is withdrawn (p2pfail: it used to stay posted for good, so a
    /// caller told "timeout" reused its buffer and a late receiver got the new contents, `Ok`).
    /// `Ok(true)` if the receiver consumed it meanwhile; `Ok(false)` while the receiver has
    /// claimed it (it is copying: the op is in its data movement, which a deadline does not
    /// cover), so the caller waits on — unless `claimed_too` (the caller's own wait ends now,
    /// past the op deadline): then a claimed message is withdrawn too and the send fails with a
    /// timeout, final; the receiver sees the withdrawal after its copy and fails (shmrace: the
    /// wait returned a timeout, the caller reused its buffer, and the receiver, late in its
    /// copy, returned the new bytes with `Ok`).
    fn expire(&self, claimed_too: bool) -> Result<bool> {
        let c = &self.comm;
        let word = c.ctl.verdict(c.me, self.dst, self.k);
        let claimed = match word.compare_exchange(0, V_WITHDRAWN, SeqCst, SeqCst) {
            Ok(_) | Err(V_WITHDRAWN) => false,
            Err(V_CLAIMED) if !claimed_too => return Ok(false),
            Err(V_CLAIMED) => match word.compare_exchange(V_CLAIMED, V_WITHDRAWN, SeqCst, SeqCst) {
                Ok(_) => true,
                // The receiver set its verdict meanwhile: it consumed the message.
                Err(_) => return self.resolve().map(|_| true),
            },
            // A verdict: the receiver consumed it.
            Err(_) => return self.resolve().map(|_| true),
        };
        if claimed {
            // The receiver may still be reading it: never reused.
            self.quarantine();
        }
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).take();
        let started = *self.posted_at.get().expect("expired only once posted");
        let err = if claimed {
            CollectiveError::Timeout {
                op: "send".into(),
                seq: self.k as u64,
                rank: c.me,
                waited_ms: started.elapsed().as_millis() as u64,
                detail: format!(
                    "shm backend: rank {} took the message up but had not copied it when this wait ended, past the op deadline of {:?}; \
                     the message is withdrawn (rank {}'s receive fails)",
                    self.dst, c.op_timeout, self.dst
                ),
            }
        } else {
            c.wait_error(WaitErr::Timeout { peer: self.dst }, "send", self.k as u64, started)
        };
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(err.clone()));
        Err(err)
    }

    fn consumed(&self) -> bool {
        self.comm.ctl.consumed(self.comm.me, self.dst).load(SeqCst).wrapping_sub(self.k) as i32 >= 0
    }

    /// Caches the receiver's verdict (call only once consumed).
    fn resolve(&self) -> Result<()> {
        let mut o = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &*o {
            return r.clone();
        }
        let v = self.comm.ctl.verdict(self.comm.me, self.dst, self.k).load(SeqCst);
        let r = match v {
            1 => Ok(()),
            // Withdrawn: the send failed (its error was returned where it was withdrawn).
            V_WITHDRAWN => Err(CollectiveError::Aborted(format!(
                "send #{} on rank {}: the message to rank {} was withdrawn (the send had failed)",
                self.k, self.comm.me, self.dst
            ))),
            // The receiver's side failed locally after it took the message up (review15 finding 4:
            // the message stayed posted, and the sender got a timeout or a wrong bad-input kind).
            V_RECV_FAILED => Err(CollectiveError::Aborted(format!(
                "send #{} on rank {}: rank {}'s receive of the message failed locally (rank {}'s own error names the cause); \
                 the message is not delivered, and the communicator stays usable",
                self.k, self.comm.me, self.dst, self.dst
            ))),
            c => match c.checked_sub(2).and_then(|c| post::kind_from(c as u64)) {
                Some(kind) => Err(CollectiveError::bad_input(
                    kind,
                    "send",
                    self.k as u64,
                    self.comm.me,
                    format!("the receiver (rank {}) rejected message #{} to it", self.dst, self.k),
                )),
                // Never a bad-input kind the receiver did not name.
                None => Err(CollectiveError::Backend(format!(
                    "send #{} on rank {}: message #{} to rank {} was consumed with an unknown verdict ({c}); shm backend bug",
                    self.k, self.comm.me, self.k, self.dst
                ))),
            },
        };
        *o = Some(r.clone());
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).take();
        r
    }
}

impl SendCompletion {
    /// After the send failed: withdraws the message so that the receiver never reads the buffer
    /// again, or — if the receiver is copying it right now — waits (one op deadline at most) until
    /// it is done or gone, then withdraws it even so (the receiver, finding it withdrawn after its
    /// copy, fails instead of returning `Ok` with bytes the caller may have rewritten: shmrace).
    /// True if the receiver consumed the message (the send succeeded after all). Releases the
    /// buffer, quarantined if the receiver might still read it.
    fn give_up(&self) -> bool {
        let c = &self.comm;
        let word = c.ctl.verdict(c.me, self.dst, self.k);
        let until = Instant::now() + c.op_timeout;
        let consumed = loop {
            match word.compare_exchange(0, V_WITHDRAWN, SeqCst, SeqCst) {
                Ok(_) | Err(V_WITHDRAWN) => break false,
                Err(V_CLAIMED) => {
                    let gone = c.ctl.gone(self.dst).load(SeqCst) != 0 || c.ctl.alive(self.dst).is_err();
                    if gone || Instant::now() >= until {
                        match word.compare_exchange(V_CLAIMED, V_WITHDRAWN, SeqCst, SeqCst) {
                            Ok(_) => {
                                if !gone {
                                    self.quarantine();
                                }
                                break false;
                            }
                            // The receiver set its verdict meanwhile.
                            Err(_) => continue,
                        }
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(_) => break true, // a verdict: the receiver consumed it
            }
        };
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).take();
        consumed
    }

    fn quarantine(&self) {
        if let Some(b) = self.keep.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            b.block.quarantine();
        }
    }

    /// A send that fails after posting (on the progress thread): withdraw, else quarantine.
    /// A message the receiver is copying is withdrawn too: its receive fails after the copy.
    fn withdraw_or_quarantine(&self) {
        let c = &self.comm;
        let word = c.ctl.verdict(c.me, self.dst, self.k);
        if let Err(v) = word.compare_exchange(0, V_WITHDRAWN, SeqCst, SeqCst) {
            if v == V_CLAIMED {
                let _ = word.compare_exchange(V_CLAIMED, V_WITHDRAWN, SeqCst, SeqCst);
            }
            self.quarantine();
        }
    }
}

impl Completion for SendCompletion {
    fn is_completed(&self) -> bool {
        if self.outcome.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return true;
        }
        match self.posted.wait_for(Duration::ZERO) {
            // Past its op deadline a posted send is failed (and withdrawn) by the first look.
            Ok(true) => {
                self.consumed() || (self.op_deadline().is_some_and(|d| Instant::now() >= d) && !matches!(self.expire(false), Ok(false)))
            }
            Ok(false) => false,
            Err(_) => true,
        }
    }

    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        if let Some(r) = &*self.outcome.lock().unwrap_or_else(|e| e.into_inner()) {
            return r.clone().map(|_| true);
        }
        if !self.posted.wait_for(timeout)? {
            return Ok(false);
        }
        if !self.consumed() {
            let end = start + timeout;
            // First up to the op deadline, if it comes before the caller's.
            let mut until = self.op_deadline().map_or(end, |d| d.min(end));
            let c = &self.comm;
            loop {
                match c.ctl.wait_consumed(self.dst, self.k, until, &c.abort) {
                    Ok(()) => break,
                    Err(WaitErr::Timeout { .. }) if until < end => match self.expire(false) {
                        // Claimed: the receiver is copying (a deadline does not cover a peer's
                        // data movement once started): wait for it up to the caller's deadline.
                        Ok(false) => until = end,
                        r => return r,
                    },
                    // The caller's wait ends past the op deadline: the send fails for good, its
                    // message withdrawn even if claimed (the caller may reuse its buffer now).
                    Err(WaitErr::Timeout { .. }) if self.op_deadline().is_some_and(|d| Instant::now() >= d) => return self.expire(true),
                    Err(WaitErr::Timeout { .. }) => return Ok(false),
                    Err(e) => {
                        let err = c.wait_error(e, "send", self.k as u64, start);
                        if self.give_up() {
                            // The receiver had the message after all.
                            return self.resolve().map(|_| true);
                        }
                        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(err.clone()));
                        return Err(err);
                    }
                }
            }
        }
        self.resolve().map(|_| true)
    }
}

/// A send the progress thread has not posted yet (its ring slot is still in use).
struct QueuedSend {
    k: u32,
    entry: Entry,
    comp: Arc<SendCompletion>,
    started: Instant,
    fault: Option<Fault>,
}

/// A receive whose message has not been posted yet.
struct QueuedRecv {
    k: u32,
    out: ShmBuffer,
    flag: Arc<Flag>,
    started: Instant,
    fault: Option<Fault>,
}

/// The progress thread's state.
pub struct Progress {
    comm: Arc<Comm>,
    /// This rank's barrier step on the control segment (1 was the init barrier).
    step: u32,
    poisoned: Option<String>,
    groups: u64,
    pending_sends: Vec<VecDeque<Arc<SendCompletion>>>,
    /// Point-to-point ops not yet possible, per peer, in issue order. The progress thread never
    /// blocks on one (issue 15 item 9): it posts a send once its ring slot is free and serves a
    /// receive once its message is posted, in between other jobs, so `irecv(p); isend(p)` on both
    /// ranks and more than [`crate::ctl::RING`] sends in flight both ways complete.
    send_q: Vec<VecDeque<QueuedSend>>,
    recv_q: Vec<VecDeque<QueuedRecv>>,
    /// When peers' liveness was last checked for the queued ops.
    last_check: Instant,
    /// The job channel (set by [`Progress::run`]); read also while a collective waits for its
    /// peers to arrive, so that point-to-point ops issued after it are not held back (see
    /// [`Progress::arrive`]).
    rx: Option<crate::jobs::Receiver<Job>>,
    /// Collectives taken from the channel during such a wait, run next, in issue order.
    stash: VecDeque<Job>,
    /// Set while a caller runs its own op inline: its wait's deadline.
    inline_by: Option<Instant>,
    /// A close an inline caller could not finish by its wait's deadline.
    closing: Option<Closing>,
    /// The last step of an op whose side failed locally on this rank, which its peers have not
    /// all reached yet ([`Behind`]): the next collective waits for them before it posts.
    behind: Option<Behind>,
    /// Set by a collective that failed with every rank still in step (a peer's local failure):
    /// [`Progress::guard`] does not poison for it.
    in_step: bool,
}

/// An op whose side failed locally on this rank (see `ctl`, "Local failures"): the rank marked
/// it failed and published its last step at once; until every peer has reached that step a peer
/// may still read this rank's post, so its block is kept (and quarantined if the wait is never
/// done: a dropped backend, a peer that never comes).
struct Behind {
    step: u32,
    blk: Option<crate::arena::Block>,
    name: String,
    seq: u64,
}

impl Drop for Behind {
    fn drop(&mut self) {
        if let Some(b) = &self.blk {
            b.quarantine();
        }
    }
}

/// How the part of a collective after its post ended, when not `Ok`.
enum Ended {
    /// Every rank ends the op with an error and stays in step (bad input, a peer's local
    /// failure), past the op's last barrier: nobody touches this rank's memory any more.
    InStep(CollectiveError),
    /// This rank's own side failed locally (an injected `fail`) before the op's last barrier.
    Local(CollectiveError),
    /// Anything else (a timeout, a dead peer, an abort, a corrupt post): poisons.
    Broken(CollectiveError),
}

impl From<CollectiveError> for Ended {
    fn from(e: CollectiveError) -> Ended {
        Ended::Broken(e)
    }
}

/// The engine: the progress state behind a lock that the progress thread holds, or a caller
/// that runs its own collective on its thread (so ops run one at a time, in issue order).
pub struct Engine {
    progress: Mutex<Progress>,
    pub waker: crate::jobs::Waker<Job>,
    op_timeout: Duration,
}

impl Engine {
    pub fn new(mut p: Progress, rx: crate::jobs::Receiver<Job>) -> Arc<Engine> {
        let waker = rx.waker();
        let op_timeout = p.comm.op_timeout;
        p.rx = Some(rx);
        Arc::new(Engine { progress: Mutex::new(p), waker, op_timeout })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_lock(&self) -> Option<std::sync::MutexGuard<'_, Progress>> {
        match self.progress.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// How much longer than the op deadline a wait must be for its caller to run the op inline:
/// the op's waits end at its deadline, and the wait must still return by its own, after the data
/// movement of peers that arrived just before that deadline (1/16 of the op deadline, at least
/// 50 ms: the catalogue's waits are 1/15 longer than its op deadline).
fn inline_margin(op_timeout: Duration) -> Duration {
    (op_timeout / 16).max(Duration::from_millis(50))
}

/// A collective's completion. A caller whose wait is long enough (the op deadline plus
/// [`inline_margin`]) and finds the engine free runs the op on its own thread when it is the
/// next one in issue order ([`Progress::run_own`]): no hand-off to the progress thread and back.
/// Otherwise the progress thread runs it (woken now if it sleeps) and the caller waits on the
/// flag.
pub struct CollWork {
    pub flag: Arc<Flag>,
    pub engine: Arc<Engine>,
    /// May run inline (no fault is injected into this op: a stall must not hold the caller).
    pub inline: bool,
}

impl Completion for CollWork {
    fn is_completed(&self) -> bool {
        let done = self.flag.is_completed();
        if !done {
            // Polled: the op must progress without a wait.
            self.engine.waker.wake();
        }
        done
    }

    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        if self.inline && timeout >= self.engine.op_timeout + inline_margin(self.engine.op_timeout) && !self.flag.is_completed() {
            if let Some(mut p) = self.engine.try_lock() {
                p.run_own(&self.flag, start + timeout);
                // Point-to-point ops queued, or a close left over: the progress thread goes on.
                self.engine.waker.set_pending(p.has_pending());
            }
        }
        if !self.flag.is_completed() {
            self.engine.waker.wake();
        }
        self.flag.wait_for(timeout.saturating_sub(start.elapsed()))
    }
}

/// A failed inline op whose memory a peer still touched when the caller's wait had to return:
/// the progress thread closes it (up to `until`, one op deadline after the failure) and only
/// then completes the op with `err`.
struct Closing {
    held: Posted,
    err: CollectiveError,
    until: Instant,
    flag: Option<Arc<Flag>>,
}

impl Progress {
    pub fn new(comm: Arc<Comm>) -> Progress {
        let n = comm.n;
        let q = || (0..n).map(|_| VecDeque::new()).collect();
        Progress {
            comm,
            step: 1,
            poisoned: None,
            groups: 0,
            pending_sends: q(),
            send_q: (0..n).map(|_| VecDeque::new()).collect(),
            recv_q: (0..n).map(|_| VecDeque::new()).collect(),
            last_check: Instant::now(),
            rx: None,
            stash: VecDeque::new(),
            inline_by: None,
            closing: None,
            behind: None,
            in_step: false,
        }
    }

    /// Queues a point-to-point job (it goes when it can: [`Progress::progress_p2p`]); any other
    /// job is handed back.
    fn enqueue_p2p(&mut self, job: Job) -> Option<Job> {
        match job {
            Job::Send { k, dst, entry, comp, fault } => {
                self.send_q[dst].push_back(QueuedSend { k, entry, comp, started: Instant::now(), fault });
                None
            }
            Job::Recv { k, src, out, flag, fault } => {
                self.recv_q[src].push_back(QueuedRecv { k, out, flag, started: Instant::now(), fault });
                None
            }
            other => Some(other),
        }
    }

    /// Waits, up to `deadline`, for every peer to arrive at this collective (its counter is
    /// published), serving point-to-point ops meanwhile, also those issued after it: a send
    /// issued behind a collective that waits for a peer which itself waits in a receive of that
    /// send (rank 0 `all_reduce; isend(1)`, rank 1 `irecv(0); wait; all_reduce`) must go, or
    /// both ranks time out. Collectives issued meanwhile wait in `stash`, in order.
    fn arrive(&mut self, step: u32, deadline: Instant) -> std::result::Result<(), WaitErr> {
        let comm = self.comm.clone();
        let since = Instant::now();
        loop {
            let slice = (Instant::now() + ARRIVE_SLICE).min(deadline);
            match comm.ctl.wait_all(step, since, slice, &comm.abort) {
                Err(WaitErr::Timeout { .. }) if Instant::now() < deadline => {
                    while let Some(Ok(job)) = self.rx.as_ref().map(|rx| rx.try_recv()) {
                        if let Some(coll) = self.enqueue_p2p(job) {
                            self.stash.push_back(coll);
                        }
                    }
                    self.progress_p2p();
                    // A point-to-point op that failed just now poisoned the communicator (its
                    // own poison word does not end this rank's waits): this collective fails too.
                    if let Some(why) = &self.poisoned {
                        return Err(WaitErr::Aborted(format!("the communicator was poisoned while waiting for the peers: {why}")));
                    }
                }
                r => return r,
            }
        }
    }

    fn queued(&self) -> bool {
        self.send_q.iter().any(|q| !q.is_empty()) || self.recv_q.iter().any(|q| !q.is_empty())
    }

    /// The engine's own pending work: queued point-to-point ops, collectives an inline caller
    /// stashed while it waited, or a close to finish.
    pub fn has_pending(&self) -> bool {
        self.queued() || self.closing.is_some() || !self.stash.is_empty()
    }

    /// The next job in issue order (collectives stashed by [`Progress::arrive`] first).
    fn next_job(&mut self) -> std::result::Result<Job, mpsc::TryRecvError> {
        match self.stash.pop_front() {
            Some(j) => Ok(j),
            None => self.rx.as_ref().map_or(Err(mpsc::TryRecvError::Disconnected), |rx| rx.try_recv()),
        }
    }

    /// Runs one job: a collective to its end, a point-to-point op into its peer's queue.
    fn run_job(&mut self, job: Job) {
        match job {
            Job::Coll { name, post, keep, flag, reply, fault, failed } => {
                let seq = post.call.seq;
                let r = self.guard(&name, seq, |s| s.collective(&name, post, keep, reply, fault, failed));
                if let Some(c) = self.closing.as_mut().filter(|c| c.flag.is_none()) {
                    // Run inline, failed, and its close outlasts the caller's wait: the
                    // progress thread finishes the close and then completes the op.
                    c.flag = Some(flag);
                    return;
                }
                progress::end(&self.comm.label, seq);
                flag.set(r);
            }
            p2p => {
                let _ = self.enqueue_p2p(p2p);
            }
        }
    }

    /// On the caller's thread (holding the engine): runs the caller's own collective (`flag`)
    /// if it is the next collective in issue order, after queueing the point-to-point ops issued
    /// before it. Its waits end by its op deadline, which is before `by` (the caller's wait
    /// deadline); a failure's close that would outlast `by` is left to the progress thread
    /// ([`Closing`]). Does nothing if another collective (or a close) comes first.
    pub fn run_own(&mut self, flag: &Arc<Flag>, by: Instant) {
        if flag.is_completed() || self.closing.is_some() {
            return;
        }
        loop {
            let Ok(job) = self.next_job() else { return };
            match job {
                Job::Coll { flag: ref f, .. } if Arc::ptr_eq(f, flag) => {
                    self.inline_by = Some(by);
                    // The point-to-point ops issued before it go first, as on the thread.
                    self.progress_p2p();
                    self.run_job(job);
                    self.inline_by = None;
                    return;
                }
                Job::Coll { .. } => {
                    self.stash.push_front(job);
                    return;
                }
                p2p => {
                    let _ = self.enqueue_p2p(p2p);
                }
            }
        }
    }

    /// Finishes a close handed over by a caller ([`Closing`]) and completes its op.
    fn finish_closing(&mut self) {
        if let Some(c) = self.closing.take() {
            let seq = c.held.seq;
            let e = c.held.fail_by(c.err, c.until);
            progress::end(&self.comm.label, seq);
            if let Some(f) = c.flag {
                f.set(Err(e));
            }
        }
    }

    /// The progress thread: runs the jobs nobody ran inline, in issue order, and serves the
    /// point-to-point queues. It holds the engine only while it works, never in its sleep.
    pub fn run(engine: Arc<Engine>) {
        let mut nap = Duration::from_micros(20);
        let mut p = loop {
            let mut p = engine.lock();
            p.finish_closing();
            let progressed = p.progress_p2p();
            if progressed {
                nap = Duration::from_micros(20);
            }
            match p.next_job() {
                Ok(job) => {
                    p.run_job(job);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => break p,
                Err(mpsc::TryRecvError::Empty) => {}
            }
            let queued = p.queued();
            // Told while the engine is held, so that a holder after this one has the last word.
            engine.waker.set_pending(queued);
            drop(p);
            if !queued {
                nap = Duration::from_micros(20);
                engine.waker.wait_ready(None);
            } else if !progressed {
                engine.waker.wait_ready(Some(nap));
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        };
        // The backend is being dropped: whatever is still queued fails. The engine stays held
        // until then, so once this thread is joined no caller runs an op any more.
        p.comm.abort.store(true, SeqCst);
        p.finish_closing();
        while p.queued() {
            p.progress_p2p();
        }
    }

    /// Serves every queued point-to-point op that can go now (the front of each peer's queue
    /// first, so per-pair order holds), and fails those past their deadline or whose peer died.
    /// True if any op was completed or failed.
    fn progress_p2p(&mut self) -> bool {
        let mut any = false;
        let check_peers = self.last_check.elapsed() >= Duration::from_millis(20);
        if check_peers {
            self.last_check = Instant::now();
        }
        let me = self.comm.me;
        for peer in 0..self.comm.n {
            while let Some(q) = self.send_q[peer].front() {
                if self.stall_left(&q.fault) {
                    break;
                }
                let (k, started) = (q.k, q.started);
                let ring = crate::ctl::RING;
                let ready = k <= ring || self.comm.ctl.consumed(me, peer).load(SeqCst).wrapping_sub(k - ring) as i32 >= 0;
                let stuck = if ready { None } else { self.stuck("send", k, peer, started, check_peers) };
                if !ready && stuck.is_none() {
                    break;
                }
                let q = self.send_q[peer].pop_front().expect("front exists");
                let r = match stuck {
                    Some(e) => self.guard("send", k as u64, |_| Err(e)),
                    None => self.guard("send", k as u64, |s| s.send(k, peer, q.entry, &q.comp, q.fault)),
                };
                progress::end(&self.comm.label, send_key(peer, k));
                if r.is_err() {
                    q.comp.keep.lock().unwrap_or_else(|e| e.into_inner()).take();
                }
                q.comp.posted.set(r);
                any = true;
            }
            while let Some(q) = self.recv_q[peer].front() {
                if self.stall_left(&q.fault) {
                    break;
                }
                let (k, started) = (q.k, q.started);
                let ready = self.comm.ctl.posted(peer, me).load(SeqCst).wrapping_sub(k) as i32 >= 0;
                let stuck = if ready { None } else { self.stuck("recv", k, peer, started, check_peers) };
                if !ready && stuck.is_none() {
                    break;
                }
                let q = self.recv_q[peer].pop_front().expect("front exists");
                let r = match stuck {
                    Some(e) => self.guard("recv", k as u64, |_| Err(e)),
                    None => self.guard("recv", k as u64, |s| s.recv(k, peer, &q.out, q.fault)),
                };
                progress::end(&self.comm.label, recv_key(peer, k));
                q.flag.set(r);
                any = true;
            }
        }
        any
    }

    /// Whether a queued point-to-point op is left for the progress thread: an inline caller
    /// (serving the queues while its collective waits for its peers) does not run an op whose
    /// injected fault stalls, which would hold the caller past its wait's deadline.
    fn stall_left(&self, fault: &Option<Fault>) -> bool {
        self.inline_by.is_some() && fault.as_ref().is_some_and(|f| matches!(f.action, Action::Stall))
    }

    /// Why a queued op waiting on `peer` since `started` can never go (`None`: keep waiting).
    fn stuck(&self, op: &str, k: u32, peer: usize, started: Instant, check_peers: bool) -> Option<CollectiveError> {
        let c = &self.comm;
        let err = |e: WaitErr| Some(c.wait_error(e, op, k as u64, started));
        if self.poisoned.is_some() {
            // guard() names the earlier failure.
            return Some(CollectiveError::Aborted("poisoned".into()));
        }
        if c.abort.load(SeqCst) {
            return err(WaitErr::Aborted("this rank's backend is being dropped".into()));
        }
        if started.elapsed() >= c.op_timeout {
            return err(WaitErr::Timeout { peer });
        }
        if check_peers {
            if let Err(e) = c.ctl.peer_state(peer) {
                return err(e);
            }
        }
        None
    }

    /// Runs `f` unless poisoned or aborted; poisons on timeout / dead peer / abort (not on an
    /// abort that left every rank in step: a peer's local failure, `in_step`), and on
    /// a panic inside `f`, which becomes a named error (issue 15 item 10: a panic used to end the
    /// thread silently, and every wait timed out). Memory an op had posted is closed and
    /// quarantined by `Posted` while the panic unwinds.
    fn guard(&mut self, op: &str, seq: u64, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if self.comm.abort.load(SeqCst) {
            return Err(CollectiveError::Aborted(format!("{op} #{seq} on rank {}: the backend was dropped", self.comm.me)));
        }
        if let Some(why) = &self.poisoned {
            return Err(CollectiveError::Aborted(format!(
                "{op} #{seq} on rank {}: communicator unusable after an earlier failure: {why}",
                self.comm.me
            )));
        }
        let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                let e = CollectiveError::Backend(format!(
                    "shm backend rank {}: the progress thread panicked in {op} #{seq}: {msg} (the communicator is poisoned)",
                    self.comm.me
                ));
                self.poisoned = Some(e.to_string());
                self.comm.ctl.poison();
                return Err(e);
            }
        };
        let in_step = std::mem::take(&mut self.in_step);
        if let Err(e) = &r {
            if !in_step && matches!(e, CollectiveError::Timeout { .. } | CollectiveError::PeerDied { .. } | CollectiveError::Aborted(_)) {
                self.poisoned = Some(e.to_string());
                self.comm.ctl.poison();
            }
        }
        r
    }

    /// For an error that leaves this rank out of step with its peers' barriers: poisons the
    /// communicator, so that peers fail fast instead of pairing this rank's next op with this one.
    fn out_of_step(&mut self, e: CollectiveError) -> CollectiveError {
        self.poisoned = Some(e.to_string());
        self.comm.ctl.poison();
        e
    }

    /// THE deadline of a collective's steps after its arrival barrier (validation, data
    /// movement, the final barrier), given the op deadline `deadline` that bounded the arrival.
    /// Every rank entered the op in time, so none may fail it for lateness now (review15
    /// finding 2: a peer arriving just inside the deadline made the early rank time out at the
    /// final barrier after every byte had moved, and poison the world): the rest gets one op
    /// timeout of its own from now, never less than the op deadline; on a caller running its op
    /// inline, never past its wait's deadline less the margin (`inline_by`: a wait never blocks
    /// longer than asked).
    fn after_arrival(&self, deadline: Instant) -> Instant {
        let own = Instant::now() + self.comm.op_timeout;
        let own = match self.inline_by {
            Some(by) => own.min(by.checked_sub(inline_margin(self.comm.op_timeout) / 2).unwrap_or(by)),
            None => own,
        };
        own.max(deadline)
    }

    /// A barrier after the op's arrival (its deadline from [`Progress::after_arrival`]): a peer
    /// that misses it arrived, but did not finish the op's steps in time.
    fn barrier(&mut self, op: &str, seq: u64, deadline: Instant, started: Instant) -> Result<()> {
        self.step = self.step.wrapping_add(1);
        let c = &self.comm;
        c.ctl.barrier(self.step, deadline, &c.abort).map_err(|e| {
            let late = match e {
                WaitErr::Timeout { peer } => Some(peer),
                _ => None,
            };
            match (c.wait_error(e, op, seq, started), late) {
                (CollectiveError::Timeout { op, seq, rank, waited_ms, .. }, Some(peer)) => CollectiveError::Timeout {
                    op,
                    seq,
                    rank,
                    waited_ms,
                    detail: format!(
                        "shm backend: rank {peer} arrived in time but did not finish the op's later steps within {:?} of every rank's arrival",
                        c.op_timeout
                    ),
                },
                (other, _) => other,
            }
        })
    }

    fn collective(
        &mut self,
        name: &str,
        post: Post,
        keep: Vec<ShmBuffer>,
        reply: Option<GroupReply>,
        fault: Option<Fault>,
        failed: Option<CollectiveError>,
    ) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.comm.op_timeout;
        let seq = post.call.seq;
        let comm = self.comm.clone();
        let me = comm.me;
        // The barriers after the first: a new_group takes three steps (its members open the
        // group's segment between the last two), every other collective two. A rank whose side
        // fails locally publishes them all at once, and its peers pass as many (shmrace: a
        // new_group's local failure used to poison the world).
        let rest: u32 = if post.call.op == CallOp::NewGroup { 2 } else { 1 };
        // 0. An earlier op whose side failed here: its peers must have left it before this post
        // replaces the one they may still read.
        self.catch_up(name, seq, deadline, started)?;
        // 1. Post. Until the counter is raised, no peer can see this op: a failure here frees
        // everything at once. An op whose side already failed at issue (`failed`: an output it
        // could not allocate) fails here the same way, never posted.
        let bytes = post.encode();
        let blk = failed.map_or_else(
            || comm.world.alloc(bytes.len()).map_err(|e| CollectiveError::Backend(format!("{name} #{seq} on rank {me}: cannot post: {e}"))),
            Err,
        );
        let blk = match blk {
            Ok(b) => b,
            Err(e) => {
                // A local failure: the op is marked failed before its first step is published,
                // so every peer sees the mark before it would read this rank's post.
                self.step = self.step.wrapping_add(1);
                comm.ctl.mark_failed(self.step.max(1));
                comm.ctl.set_counter(self.step);
                for _ in 0..rest {
                    self.step = self.step.wrapping_add(1);
                    comm.ctl.set_counter(self.step);
                }
                self.behind = Some(Behind { step: self.step, blk: None, name: name.to_string(), seq });
                return Err(e);
            }
        };
        comm.world.region(comm.world.global_rank, blk.off, bytes.len()).copy_from_bytes(&bytes);
        comm.ctl.post_off(me).store(blk.off as u64, SeqCst);
        comm.ctl.post_len(me).store(bytes.len() as u64, SeqCst);
        self.step = self.step.wrapping_add(1);
        let token = self.step.max(1);
        comm.ctl.open(token);
        comm.ctl.set_counter(self.step);
        // From here on peers may read the post and touch the buffers: the op's memory is held by
        // `Posted` until the op ends, and a failure closes it first (see `Posted`).
        let mut held = Posted { comm: comm.clone(), blk: Some(blk), keep, settled: false, name: name.to_string(), seq };
        let e = match self.posted(name, seq, token, started, deadline, reply, fault, rest) {
            Ok(()) => {
                held.settle();
                return Ok(());
            }
            Err(Ended::InStep(e)) => {
                // Bad input, or a peer's local failure, after the last barrier on every rank:
                // nobody touches this rank's memory any more, and every rank is in step.
                held.settle();
                self.in_step = true;
                return Err(e);
            }
            Err(Ended::Local(e)) => {
                // This rank's own side failed (before the op's last barrier): mark it, publish
                // the last step at once (peers pass it and end with the named error), keep the
                // post for the peers that may still read it, and close the buffers below.
                comm.ctl.mark_failed(token);
                for _ in 0..rest {
                    self.step = self.step.wrapping_add(1);
                    comm.ctl.set_counter(self.step);
                }
                self.behind = Some(Behind { step: self.step, blk: held.blk.take(), name: name.to_string(), seq });
                e
            }
            Err(Ended::Broken(e)) => {
                self.poisoned = Some(e.to_string());
                comm.ctl.poison();
                e
            }
        };
        let until = Instant::now() + comm.op_timeout;
        match self.inline_by.filter(|&by| by < until) {
            // On a caller's thread whose wait ends before the close's full deadline:
            // close until then; if a peer still touches this rank's memory, the progress
            // thread finishes the close and completes the op later.
            Some(by) => {
                if comm.ctl.close(by).is_ok() {
                    held.settle();
                } else {
                    self.closing = Some(Closing { held, err: e.clone(), until, flag: None });
                }
                Err(e)
            }
            None => Err(held.fail(e)),
        }
    }

    /// Before a collective posts: waits (until `deadline`, serving point-to-point ops) for every
    /// peer to reach the last step of an earlier op whose side failed locally here ([`Behind`]);
    /// then frees that op's post. A peer that never does is a timeout (which poisons).
    fn catch_up(&mut self, name: &str, seq: u64, deadline: Instant, started: Instant) -> Result<()> {
        let Some(mut b) = self.behind.take() else { return Ok(()) };
        match self.arrive(b.step, deadline) {
            Ok(()) => {
                drop(b.blk.take());
                Ok(())
            }
            Err(e) => {
                let mut e = self.comm.wait_error(e, name, seq, started);
                if let CollectiveError::Timeout { detail, .. } = &mut e {
                    detail.push_str(&format!(" (the peers never finished {} #{}, whose side failed on this rank)", b.name, b.seq));
                }
                Err(self.out_of_step(e))
            }
        }
    }

    /// The part of a collective after its post is published.
    #[allow(clippy::too_many_arguments)]
    fn posted(
        &mut self,
        name: &str,
        seq: u64,
        token: u32,
        started: Instant,
        deadline: Instant,
        reply: Option<GroupReply>,
        fault: Option<Fault>,
        rest: u32,
    ) -> std::result::Result<(), Ended> {
        let comm = self.comm.clone();
        let (n, me) = (comm.n, comm.me);
        let werr = |e: WaitErr| comm.wait_error(e, name, seq, started);
        comm.strike(&fault, point::AFTER_POST, name, seq).map_err(Ended::Local)?;
        let step = self.step;
        self.arrive(step, deadline).map_err(werr)?;
        // Every rank entered the op in time: its later steps get a deadline of their own.
        let deadline = self.after_arrival(deadline);
        // A peer that failed after posting (its counter was already raised) poisoned the
        // communicator before its wait returned: check the abort word after every barrier.
        comm.ctl.check_abort().map_err(werr)?;
        // A peer whose side failed locally before this look marked it: read nothing of it.
        if let Some(r) = comm.ctl.failed_peer(token) {
            return Err(self.peer_failed(r, name, seq, deadline, started, rest));
        }
        // 2. Read and validate every rank's post.
        let mut posts = Vec::with_capacity(n);
        for r in 0..n {
            let off = comm.ctl.post_off(r).load(SeqCst) as usize;
            let len = comm.ctl.post_len(r).load(SeqCst) as usize;
            let arena = comm.world.arenas[comm.globals[r]].len();
            let decoded = (len <= MAX_POST && off.checked_add(len).is_some_and(|e| e <= arena)).then(|| {
                let mut b = vec![0u8; len];
                comm.world.region(comm.globals[r], off, len).copy_to_bytes(&mut b);
                Post::decode(&b)
            });
            match decoded.flatten() {
                Some(p) => posts.push(p),
                None => return Err(CollectiveError::Backend(format!("{name} #{seq} on rank {me}: rank {r}'s post is corrupt")).into()),
            }
        }
        let calls: Vec<CallDesc> = posts.iter().map(|p| p.call.clone()).collect();
        if let Err(e) = validate_all(&calls, &crate::caps(&comm)) {
            self.barrier(name, seq, deadline, started)?;
            return Err(Ended::InStep(e.into_error(name, seq, me)));
        }
        comm.strike(&fault, point::BETWEEN_BARRIERS, name, seq).map_err(Ended::Local)?;
        comm.ctl.check_abort().map_err(werr)?;
        // 3. Move the data, holding claims on every peer's memory (see `ctl`).
        let claims = match Claims::take(&comm, token) {
            Ok(c) => c,
            Err(r) if comm.ctl.failed(r, token) => return Err(self.peer_failed(r, name, seq, deadline, started, rest)),
            Err(r) => {
                return Err(CollectiveError::Aborted(format!(
                    "{name} #{seq} on rank {me}: rank {r}'s side of the op had already failed (it closed its buffers)"
                ))
                .into())
            }
        };
        comm.strike(&fault, point::PROGRESS_THREAD, name, seq).map_err(Ended::Local)?;
        // Re-checked right before the first store: a peer that gave up waiting for this rank's
        // claim (one op deadline after its own failure) has closed by now.
        if let Err(r) = claims.still_open(token) {
            drop(claims);
            if comm.ctl.failed(r, token) {
                return Err(self.peer_failed(r, name, seq, deadline, started, rest));
            }
            return Err(CollectiveError::Aborted(format!(
                "{name} #{seq} on rank {me}: rank {r} closed its buffers (its side of the op failed) before this rank moved data"
            ))
            .into());
        }
        let group = self.execute(&posts)?;
        drop(claims);
        // 4. Final barrier: after it, no peer reads or writes this rank's buffers.
        let group = match group {
            Some(g) => Some(self.finish_group(g, name, seq, token, deadline, started)?),
            None => {
                self.barrier(name, seq, deadline, started)?;
                // A peer whose side failed locally marked it before it published this step.
                if let Some(r) = comm.ctl.failed_peer(token) {
                    return Err(Ended::InStep(peer_failure(name, seq, me, r)));
                }
                None
            }
        };
        if let (Some(tx), Some(g)) = (reply, group) {
            let _ = tx.send(g);
        }
        Ok(())
    }

    /// Rank `r`'s side of this op failed locally: this rank moves no (more) data, passes the
    /// op's last barrier with its peers (the failed rank published it already) and ends the op
    /// with the named error, every rank in step.
    /// `rest`: the op's barriers after its first (see `collective`).
    fn peer_failed(&mut self, r: usize, name: &str, seq: u64, deadline: Instant, started: Instant, rest: u32) -> Ended {
        for _ in 0..rest {
            if let Err(e) = self.barrier(name, seq, deadline, started) {
                return Ended::Broken(e);
            }
        }
        Ended::InStep(peer_failure(name, seq, self.comm.me, r))
    }

    /// The data movement of a validated op. Returns group-creation state for `new_group`.
    fn execute(&mut self, posts: &[Post]) -> Result<Option<NewGroup>> {
        let comm = self.comm.clone();
        let (n, me) = (comm.n, comm.me);
        let p0 = &posts[0];
        let inp = |r: usize, i: usize| comm.region(r, &posts[r].inputs[i]);
        let out = |r: usize, i: usize| comm.region(r, &posts[r].outputs[i]);
        let chunk = |len: usize, j: usize, esz: usize| {
            let el = len / esz;
            let (a, b) = (el * j / n, el * (j + 1) / n);
            (a * esz, (b - a) * esz)
        };
        let op = p0.call.reduce.unwrap_or(ReduceOp::Sum);
        match p0.call.op {
            CallOp::Barrier | CallOp::Send | CallOp::Recv => {}
            // The fused ops run over the trait's collectives and p2p (fused.rs), never posted.
            f @ (CallOp::FusedAllGatherMatmul
            | CallOp::FusedMatmulReduceScatter
            | CallOp::LowContentionAllGather
            | CallOp::LowContentionReduceScatter) => {
                return Err(CollectiveError::Backend(format!("{} is never posted to the progress engine", f.name())));
            }
            CallOp::AllReduce => {
                // Each rank reduces its 1/n chunk of every tensor and writes it straight into
                // every rank's output: one pass, no second barrier. Only this rank touches
                // its chunk in any buffer, so in-place (output = input) is safe.
                for (i, d) in p0.inputs.iter().enumerate() {
                    let (off, len) = chunk(d.nbytes(), me, d.dtype.size());
                    let ins: Vec<Region> = (0..n).map(|r| inp(r, i).sub(off, len)).collect();
                    let outs: Vec<Region> = (0..n).map(|r| out(r, i).sub(off, len)).collect();
                    comm.chosen.reduce_into_many(d.dtype, op, n, &outs, &ins);
                }
            }
            CallOp::AllGather => {
                for (i, d) in p0.inputs.iter().enumerate() {
                    let nb = d.nbytes();
                    for r in 0..n {
                        out(me, i).sub(r * nb, nb).copy_from(inp(r, i));
                    }
                }
            }
            CallOp::ReduceScatter => {
                for (i, d) in p0.inputs.iter().enumerate() {
                    let nb = d.nbytes() / n;
                    let ins: Vec<Region> = (0..n).map(|r| inp(r, i).sub(me * nb, nb)).collect();
                    comm.chosen.reduce_into(d.dtype, op, n, out(me, i), &ins);
                }
            }
            CallOp::AllToAll => {
                let d = &posts[me].inputs[0];
                let row = d.shape[1..].iter().product::<usize>() * d.dtype.size();
                let outs = posts[me].call.output_splits(n);
                let mut at = 0;
                for (j, &rows) in outs.iter().enumerate() {
                    let from = posts[j].call.input_splits(n)[..me].iter().sum::<usize>();
                    out(me, 0).sub(at * row, rows * row).copy_from(inp(j, 0).sub(from * row, rows * row));
                    at += rows;
                }
            }
            CallOp::Broadcast => {
                let root = p0.call.root.expect("validated");
                out(me, 0).copy_from(inp(root, 0));
            }
            CallOp::Permute => {
                let list = p0.call.perm.as_ref().expect("validated");
                let src = list.iter().position(|&d| d == me).expect("validated permutation");
                out(me, 0).copy_from(inp(src, 0));
            }
            CallOp::Reduce => {
                let root = p0.call.root.expect("validated");
                let d = &p0.inputs[0];
                let (off, len) = chunk(d.nbytes(), me, d.dtype.size());
                let ins: Vec<Region> = (0..n).map(|r| inp(r, 0).sub(off, len)).collect();
                comm.chosen.reduce_into(d.dtype, op, n, out(root, 0).sub(off, len), &ins);
            }
            CallOp::Gather => {
                let root = p0.call.root.expect("validated");
                let nb = posts[me].inputs[0].nbytes();
                out(root, 0).sub(me * nb, nb).copy_from(inp(me, 0));
            }
            CallOp::Scatter => {
                let root = p0.call.root.expect("validated");
                let nb = posts[me].inputs[0].nbytes() / n;
                out(me, 0).copy_from(inp(root, 0).sub(me * nb, nb));
            }
            CallOp::NewGroup => {
                // Counted here, after validation, on every rank alike (issue 15 item 8: counted
                // before validation, a new_group matched against another op bumped one side).
                self.groups += 1;
                let list = p0.call.group.clone().expect("validated");
                let tag = format!("{}g{}", comm.tag, self.groups);
                let seg = format!("{}{}-ctl", concord_core::world_prefix(&comm.world.world_id), tag);
                let pos = list.iter().position(|&x| x == me);
                let mut created = None;
                let mut err = None;
                if pos == Some(0) {
                    match Mapping::create(&seg, crate::ctl::ctl_size(list.len()), true) {
                        Ok(m) => {
                            sys::register_cleanup(&seg);
                            Ctl::init(&m, list.len());
                            created = Some(m);
                        }
                        Err(e) => err = Some(format!("cannot create group control segment {seg}: {e}")),
                    }
                }
                return Ok(Some(NewGroup { tag, seg, pos, created, err }));
            }
        }
        Ok(None)
    }

    /// new_group, after validation: the creator made the segment; members open it between two
    /// barriers; then the creator unlinks its name (mappings stay) — on every path, failures
    /// included (issue 15 item 12). A peer whose side failed locally (marked before it published
    /// the first of these barriers) is seen after it: nobody opens the segment, every rank passes
    /// the last barrier, and the group's number is given back (the failed rank never took it),
    /// so every rank numbers its next group alike.
    fn finish_group(
        &mut self,
        mut g: NewGroup,
        name: &str,
        seq: u64,
        token: u32,
        deadline: Instant,
        started: Instant,
    ) -> std::result::Result<(String, Option<Mapping>), Ended> {
        let mut mapping = g.created.take();
        let mut failed = None;
        let r = self.barrier(name, seq, deadline, started).and_then(|()| {
            failed = self.comm.ctl.failed_peer(token);
            if failed.is_none() && g.pos.is_some_and(|p| p > 0) {
                match Mapping::open(&g.seg, true) {
                    Ok(m) => mapping = Some(m),
                    Err(e) => g.err = Some(format!("cannot open group control segment {}: {e}", g.seg)),
                }
            }
            self.barrier(name, seq, deadline, started)
        });
        if g.pos == Some(0) {
            let _ = sys::unlink(&g.seg);
            sys::unregister_cleanup(&g.seg);
        }
        r?;
        if let Some(r) = failed {
            self.groups -= 1;
            return Err(Ended::InStep(peer_failure(name, seq, self.comm.me, r)));
        }
        if let Some(e) = g.err {
            return Err(CollectiveError::Backend(format!("new_group #{seq} on rank {}: {e}", self.comm.me)).into());
        }
        Ok((g.tag, mapping))
    }

    fn send(&mut self, k: u32, dst: usize, entry: Entry, comp: &Arc<SendCompletion>, fault: Option<Fault>) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.comm.op_timeout;
        let comm = self.comm.clone();
        // Called only once the ring slot is free (see `progress_p2p`); this wait returns at once.
        if k > crate::ctl::RING {
            comm.ctl
                .wait_consumed(dst, k - crate::ctl::RING, deadline, &comm.abort)
                .map_err(|e| comm.wait_error(e, "send", k as u64, started))?;
        }
        // Cache the verdicts of messages whose ring entries are about to be reused.
        let q = &mut self.pending_sends[dst];
        while q.front().is_some_and(|c| c.k.wrapping_add(crate::ctl::RING) <= k) {
            let c = q.pop_front().expect("front exists");
            let _ = c.resolve();
        }
        q.push_back(comp.clone());
        let _ = comp.posted_at.set(started);
        comm.ctl.write_entry(comm.me, dst, k, entry);
        // The local failure strikes before the message is published: it is published withdrawn,
        // so the receiver always sees a failed message, never a copy (review15 finding 3: struck
        // after `set_posted`, a receiver copying in between returned `Ok` while the send failed).
        let r = comm.strike(&fault, point::AFTER_POST, "send", k as u64);
        if r.is_err() {
            comp.withdraw_or_quarantine();
        }
        comm.ctl.set_posted(dst, k);
        r
    }

    fn recv(&mut self, k: u32, src: usize, out: &ShmBuffer, fault: Option<Fault>) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.comm.op_timeout;
        let comm = self.comm.clone();
        comm.ctl.wait_posted(src, k, deadline, &comm.abort).map_err(|e| comm.wait_error(e, "recv", k as u64, started))?;
        let e = comm.ctl.read_entry(src, comm.me, k);
        // The pair's calls as the rule table sees them: the ring entry carries the sender's
        // dtype and element count.
        let recv = CallDesc::p2p(CallOp::Recv, comm.me, TensorDesc::new(out.dtype, &out.shape), src);
        let verdict = match post::dtype_from(e.dtype as u64) {
            None => Err((BadInputKind::DTypeMismatch, format!("rank {src} sends an unknown dtype (code {})", e.dtype))),
            Some(dtype) => {
                let send = CallDesc::p2p(CallOp::Send, src, TensorDesc::new(dtype, &[e.numel as usize]), comm.me);
                validate_pair(&recv, &send, comm.n, &crate::caps(&comm)).map_err(|b| (b.kind, b.detail))
            }
        };
        if verdict.is_ok() {
            // Claim the message before reading the sender's buffer; a sender whose send failed
            // withdrew it (issue 15 item 7), and its buffer may hold new data by now.
            let word = comm.ctl.verdict(src, comm.me, k);
            if word.compare_exchange(0, V_CLAIMED, SeqCst, SeqCst).is_err() {
                comm.ctl.set_consumed(src, k);
                // Consumed: the pair is in step, nothing to poison (review15 finding 3: the
                // withdrawn message poisoned this rank's communicator).
                self.in_step = true;
                return Err(CollectiveError::Aborted(format!(
                    "recv #{k} on rank {}: rank {src} withdrew the message (its send had failed)",
                    comm.me
                )));
            }
            if let Err(e) = comm.strike(&fault, point::PROGRESS_THREAD, "recv", k as u64) {
                // Consume the message with a "receiver failed" verdict (unless the sender withdrew
                // it meanwhile), so that the sender's send fails at once, named, and the next
                // message of the pair matches the next receive (review15 finding 4: the message
                // was given back, unconsumed; the sender timed out, or got a bad-input kind once
                // a later message went through).
                let _ = word.compare_exchange(V_CLAIMED, V_RECV_FAILED, SeqCst, SeqCst);
                comm.ctl.set_consumed(src, k);
                return Err(e);
            }
            out.region().copy_from(comm.world.mapped_region(comm.globals[src], e.off as usize, e.nbytes as usize));
            // The verdict only if the message is still ours: a sender whose wait ended (past the
            // op deadline) while this rank was copying withdrew it, and its caller may have
            // rewritten the buffer during the copy (shmrace).
            if word.compare_exchange(V_CLAIMED, 1, SeqCst, SeqCst).is_err() {
                comm.ctl.set_consumed(src, k);
                return Err(CollectiveError::Aborted(format!(
                    "recv #{k} on rank {}: rank {src} withdrew the message while this rank was copying it (its send had failed at its \
                     deadline); the output's contents are undefined",
                    comm.me
                )));
            }
        } else {
            let code = match &verdict {
                Ok(()) => 1,
                Err((k, _)) => post::kind_code(*k) as u32 + 2,
            };
            // Unless the sender withdrew it meanwhile (both sides fail then, each named).
            let _ = comm.ctl.verdict(src, comm.me, k).compare_exchange(0, code, SeqCst, SeqCst);
        }
        comm.ctl.set_consumed(src, k);
        verdict.map_err(|(kind, detail)| CollectiveError::bad_input(kind, "recv", k as u64, comm.me, detail))
    }
}

/// Largest post a rank decodes (a larger length is a corrupt post, not an allocation).
const MAX_POST: usize = 1 << 20;

/// How long a collective waits for its peers between two looks at the point-to-point ops
/// ([`Progress::arrive`]).
const ARRIVE_SLICE: Duration = Duration::from_millis(2);

/// The memory of one posted collective — its post block and every buffer it names — from the
/// moment peers can see the post until the op ends. `settle` (the op completed or failed on
/// every rank alike, after its last barrier) frees it normally. `fail` (and `Drop` without
/// `settle`: a panic unwinding) first *closes* this rank's memory (`Ctl::close`: no new claim
/// succeeds, and it waits up to one op deadline for the live peers still touching it); if a peer
/// still holds a claim then, every block is quarantined (never reused) instead of freed.
struct Posted {
    comm: Arc<Comm>,
    blk: Option<crate::arena::Block>,
    keep: Vec<ShmBuffer>,
    settled: bool,
    name: String,
    seq: u64,
}

impl Posted {
    fn settle(&mut self) {
        self.settled = true;
    }

    /// Closes; returns `e`, naming the peers that still touched this rank's memory if any.
    fn fail(self, e: CollectiveError) -> CollectiveError {
        let until = Instant::now() + self.comm.op_timeout;
        self.fail_by(e, until)
    }

    /// [`Posted::fail`], closing until `until`.
    fn fail_by(mut self, e: CollectiveError, until: Instant) -> CollectiveError {
        self.settled = true;
        match self.close(until) {
            Ok(()) => e,
            Err(mask) => {
                let peers: Vec<usize> = (0..self.comm.n).filter(|p| mask & (1 << p) != 0).collect();
                eprintln!(
                    "concord-shm: {} #{} on rank {}: ranks {peers:?} were still moving data of this op one op deadline after it failed; its buffers are quarantined (never reused)",
                    self.name, self.seq, self.comm.me
                );
                e
            }
        }
    }

    fn close(&mut self, until: Instant) -> std::result::Result<(), u64> {
        let r = self.comm.ctl.close(until);
        if r.is_err() {
            self.quarantine();
        }
        r
    }

    fn quarantine(&self) {
        if let Some(b) = &self.blk {
            b.quarantine();
        }
        for b in &self.keep {
            b.block.quarantine();
        }
    }
}

impl Drop for Posted {
    fn drop(&mut self) {
        if !self.settled {
            // A panic is unwinding through the op: close, and quarantine whatever happens.
            let _ = self.close(Instant::now() + self.comm.op_timeout);
            self.quarantine();
        }
    }
}

/// Claims on every peer's memory for one op's data movement (see `ctl`), released on drop
/// (also while a panic unwinds).
struct Claims<'a> {
    comm: &'a Comm,
    held: Vec<usize>,
}

impl<'a> Claims<'a> {
    /// Claims every peer for op `token`; `Err(r)`: rank `r` has closed (its op failed).
    fn take(comm: &'a Comm, token: u32) -> std::result::Result<Claims<'a>, usize> {
        let mut c = Claims { comm, held: Vec::with_capacity(comm.n) };
        for r in (0..comm.n).filter(|&r| r != comm.me) {
            if !comm.ctl.claim(r, token) {
                return Err(r);
            }
            c.held.push(r);
        }
        Ok(c)
    }
}

impl Claims<'_> {
    /// `Err(r)` if rank `r` closed since it was claimed.
    fn still_open(&self, token: u32) -> std::result::Result<(), usize> {
        match self.held.iter().find(|&&r| !self.comm.ctl.is_open(r, token)) {
            Some(&r) => Err(r),
            None => Ok(()),
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        for &r in &self.held {
            self.comm.ctl.release(r);
        }
    }
}

pub struct NewGroup {
    tag: String,
    seg: String,
    pos: Option<usize>,
    created: Option<Mapping>,
    err: Option<String>,
}

/// A peer's error after rank `r`'s side of op `name #seq` failed locally (`ctl`, "Local
/// failures"): it names the failed rank, and claims no timeout or dead peer.
fn peer_failure(name: &str, seq: u64, me: usize, r: usize) -> CollectiveError {
    CollectiveError::Aborted(format!(
        "{name} #{seq} on rank {me}: rank {r}'s side of the op failed locally after it was posted (rank {r}'s own error names \
         the cause); the op's outputs on this rank are undefined, and the communicator stays usable"
    ))
}

/// Keys for [`progress`] of point-to-point ops (disjoint from collective sequence numbers).
pub fn send_key(dst: usize, k: u32) -> u64 {
    (1 << 63) | ((dst as u64) << 32) | k as u64
}
pub fn recv_key(src: usize, k: u32) -> u64 {
    (1 << 62) | ((src as u64) << 32) | k as u64
}
