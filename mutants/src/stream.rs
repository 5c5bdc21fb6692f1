//! `stream`: the campaign's reference *launch-based device backend*, on CPU. It has the
//! architecture of the NCCL backend (`backends/nccl`), small: so that the failure-path clauses
//! (`faults.*` of `core/src/backend.rs`), whose cases (`device_faults::*`) inject faults at hooks
//! only such a backend has, can be broken by mutants and checked in CI, without a GPU.
//!
//! * **Issue returns at once.** The calling thread numbers the op (`begin`: sequence, fault
//!   index, [`progress`]), runs the op's local step (a simulated allocation: fault point
//!   `after_begin`), allocates its output buffers and queues a job to the rank's *progress thread*,
//!   returning a pending [`Work`].
//! * **Validation header before every launch.** The progress thread, one per communicator, takes
//!   the jobs in issue order and exchanges a small header with every rank (this rank's status:
//!   healthy, or failed locally) on a *board*: a shm communicator of its own (`<world>-board`),
//!   beside the data one, so the header of op k+1 is exchanged while op k still runs on the
//!   stream, as NCCL's host board does. The board has no deadline of its own worth the name (the
//!   backstop below); the progress thread bounds each exchange by the op deadline, then aborts
//!   the communicator. A rank whose op failed locally after `begin` still sends the header,
//!   marked failed: every rank then ends that op in one named error naming the rank, nothing is
//!   launched anywhere, and the sequence stays in step (clause
//!   `faults.local_failure_named_everywhere`).
//! * **Launch onto a stream.** The progress thread then *enqueues* the op (the library call,
//!   under the library's lock; fault point `enqueue`) onto the rank's *stream*: a thread of its
//!   own that runs the launched ops in order. Running one is the data movement, done by the shm
//!   backend's collective on the data communicator (the "kernel"), whose result is copied into
//!   the output buffers allocated at issue (a kernel writing its output).
//! * **Deadlines.** An op reached by the stream has the op deadline from then (a wait past it
//!   aborts the communicator); an op queued behind it is bounded by the one running (a wait
//!   checks the stream's current op, as NCCL's tracker does) and by a backstop; an op still in
//!   the progress thread is bounded there.
//! * **Abort.** Requested from any thread at once (it never waits for a launch in progress):
//!   stalled stream gates open, every wait gives up, queued and running ops fail with the abort
//!   (never `Ok`: an op whose completion was not observed before the abort is not to be
//!   trusted), later ops fail at issue (clause `faults.aborted_ops_fail`). A running kernel is
//!   waited for (the shm op ends by its own deadline) before its op fails, so a failed wait
//!   hands the buffers back.
//! * **Copies synchronise with the device, not the stream.** `upload` / `download` / `write`
//!   copy at once, whatever is queued (clause `faults.copies_not_behind_collectives`).
//! * **Point to point** goes straight to the data communicator (NCCL parks sends and receives on
//!   streams of their own): a stuck collective never holds them back.
//!
//! Fault hooks ([`concord_core::fault`], NCCL's set): `after_begin:fail` (issuing thread),
//! `before_header` / `after_header` (stall, fail, die) and `no_launch:stall` (progress thread),
//! `enqueue:stall` (the library call stays "in progress" until its deadline or an abort),
//! `stream:stall` (the stream stops before the op until an abort, teardown or the backstop).
//! Points of other backends (shm's `after_post`, ...) are ignored: their cases are UNSUPPORTED.
//! Faults on groups (`/G`, [`concord_core::fault::ON_GROUPS`]) are honoured: the `G`-th
//! `new_group` hands them to the group it makes, whose ops they count.
//!
//! Option `stream_bug=<name>` turns on one [`StreamBug`], each a realistic mistake of such a
//! backend (see `bugs_stream`).

use crate::{lock, Buf};
use concord_core::fault::{self, point, Action, Fault};
use concord_core::{
    progress, Backend, Capabilities, CollectiveError, Completion, DType, FusedImpl, OutstandingCounter, ReduceOp, Result, Tensor, Work,
    WorkMeta, WorldInfo,
};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The backend option naming the bug to turn on (absent: the reference).
pub const BUG_OPTION: &str = "stream_bug";

/// The backend option naming a legal choice to make (absent: the reference's choices).
pub const LEGAL_OPTION: &str = "stream_legal";

/// One legal choice the reference could have made otherwise (option [`LEGAL_OPTION`]): a correct
/// launch-based backend, run by `concord-mutants --legal` (`crate::legal_review`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamLegal {
    /// A peer that reads a header marked failed reports the op's failure as
    /// `CollectiveError::Aborted` ("rank r failed its side of this op locally ..."), not
    /// `Backend`: still one named error, never a timeout, nothing is aborted and the next op
    /// runs (shm's own `peer_failure` names it so: clause `faults.local_failure_named_everywhere`
    /// leaves the kind to the backend).
    PeerAborted,
}

impl StreamLegal {
    pub const ALL: [StreamLegal; 1] = [StreamLegal::PeerAborted];
    /// The option value.
    pub fn name(self) -> &'static str {
        match self {
            StreamLegal::PeerAborted => "peer_aborted",
        }
    }
    pub fn parse(s: &str) -> Option<StreamLegal> {
        StreamLegal::ALL.into_iter().find(|l| l.name() == s)
    }
}

/// Every `(point, action)` the backend honours (the NCCL backend's set).
const HOOKS: &[(&str, Action)] = concord_core::fault::LAUNCH_HOOKS;

/// One realistic bug of a launch-based backend (option [`BUG_OPTION`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamBug {
    /// The abort opens the stalled stream's gate and the op behind it "completes": its
    /// completion event fires once the abort released it, and the stream reports it `Ok`.
    AbortReleasesOk,
    /// The abort takes the library's lock first (to serialise with launches): it waits for an
    /// enqueue in progress, so a wait ends at the launching op's deadline, not its own.
    AbortWaitsForLaunch,
    /// The header exchange waits for the peers' headers until they come or the communicator is
    /// aborted (no deadline of its own: the op deadline is counted from the launch).
    HeaderWaitUnbounded,
    /// A kernel waiting for an absent peer's data, ended by the abort, counts as done: the
    /// stream stops waiting and reports the op complete, and the wait that aborted reports
    /// what the stream said (`Ok`), as an event queried after the abort says "complete".
    AbortedKernelDone,
    /// `download` / `upload` are queued on the collectives' stream: they wait for every op
    /// issued before them (bounded by the op deadline).
    CopiesOnTheStream,
    /// A local failure after `begin` returns its error at issue without sending the op's header:
    /// the peers wait for it until their deadline (a timeout, and an aborted communicator).
    LocalFailureUnsent,
    /// A local failure after `begin` sends its header marked failed, then aborts the
    /// communicator (its state "cannot be trusted"): the next op fails everywhere.
    LocalFailureAborts,
    /// A peer's failed header is reported as a timeout of this op (and aborts), not as the
    /// peer's named local failure.
    PeerFailureAsTimeout,
    /// The header check reads only the ranks this rank exchanges data with in a ring (itself and
    /// its two neighbours), as a ring kernel's connection setup does: at 4 ranks and more a
    /// bystander (neither the failing rank nor its neighbour) launches its side of an op a peer
    /// failed locally, and waits in it for ranks that never launch, until its deadline.
    FailedHeaderFromRingNeighbours,
}

impl StreamBug {
    pub const ALL: [StreamBug; 9] = [
        StreamBug::AbortReleasesOk,
        StreamBug::AbortWaitsForLaunch,
        StreamBug::HeaderWaitUnbounded,
        StreamBug::AbortedKernelDone,
        StreamBug::CopiesOnTheStream,
        StreamBug::LocalFailureUnsent,
        StreamBug::LocalFailureAborts,
        StreamBug::PeerFailureAsTimeout,
        StreamBug::FailedHeaderFromRingNeighbours,
    ];
    /// The mutant's name (the option value).
    pub fn name(self) -> &'static str {
        match self {
            StreamBug::AbortReleasesOk => "stream_abort_releases_ok",
            StreamBug::AbortWaitsForLaunch => "stream_abort_waits_for_launch",
            StreamBug::HeaderWaitUnbounded => "stream_header_wait_unbounded",
            StreamBug::AbortedKernelDone => "stream_aborted_kernel_done",
            StreamBug::CopiesOnTheStream => "stream_copies_on_the_stream",
            StreamBug::LocalFailureUnsent => "stream_local_failure_unsent",
            StreamBug::LocalFailureAborts => "stream_local_failure_aborts",
            StreamBug::PeerFailureAsTimeout => "stream_peer_failure_as_timeout",
            StreamBug::FailedHeaderFromRingNeighbours => "subfault_stream_failed_header_ring_neighbours",
        }
    }
    pub fn parse(s: &str) -> Option<StreamBug> {
        StreamBug::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// How long past its start an op may stay unfinished before a wait gives up on it, whatever
/// else bounds it (queued behind others, in the progress thread): three op deadlines and 10 s.
fn backstop(op_timeout: Duration) -> Duration {
    op_timeout * 3 + Duration::from_secs(10)
}

/// One communicator's shared state: the abort, the faults, the library's lock, the stream's
/// current op.
struct Host {
    rank: usize,
    op_timeout: Duration,
    faults: Vec<Fault>,
    bug: Option<StreamBug>,
    legal: Option<StreamLegal>,
    aborted: Mutex<Option<String>>,
    wake: Condvar,
    /// Teardown: running kernels are left at once.
    closing: AtomicBool,
    /// The library's lock, held by an enqueue (never by an abort).
    lib: Mutex<()>,
    /// The op the stream runs and when it reached it.
    current: Mutex<Option<(Instant, &'static str, u64)>>,
    /// Ops launched onto the stream and not yet reached by it.
    queued: std::sync::atomic::AtomicUsize,
    /// Ops issued and not yet finished (a split waits for them).
    unfinished: std::sync::atomic::AtomicUsize,
}

impl Host {
    fn bug(&self, b: StreamBug) -> bool {
        self.bug == Some(b)
    }
    fn fires(&self, at: &str, action: Action, nth: Option<u64>) -> bool {
        nth.is_some_and(|n| self.faults.iter().any(|f| f.fires(at, action, self.rank, n)))
    }
    fn aborted(&self) -> Option<String> {
        lock(&self.aborted).clone()
    }
    /// Aborts the communicator (the first reason stays); wakes every gate and wait.
    fn abort(&self, why: String) {
        let _serialised = self.bug(StreamBug::AbortWaitsForLaunch).then(|| lock(&self.lib));
        let mut a = lock(&self.aborted);
        if a.is_none() {
            *a = Some(why);
        }
        self.wake.notify_all();
    }
    /// Sleeps until `until` or an abort; `true` if aborted.
    fn sleep_until(&self, until: Instant) -> bool {
        let mut a = lock(&self.aborted);
        loop {
            if a.is_some() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            a = self.wake.wait_timeout(a, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
    /// The stream's current op, if it passed its deadline (`now`).
    fn overdue(&self, now: Instant) -> Option<String> {
        let cur = *lock(&self.current);
        cur.filter(|(at, _, _)| now >= *at + self.op_timeout).map(|(at, name, seq)| {
            format!("{name} #{seq}, running on the stream for {} ms, passed its op deadline", (now - at).as_millis())
        })
    }
}

/// One op's names and numbers.
#[derive(Clone)]
struct OpId {
    name: &'static str,
    seq: u64,
    nth: Option<u64>,
    issued: Instant,
}

/// Where a pending op is (its deadline depends on it).
#[derive(Clone, Copy)]
enum Stage {
    /// In the progress thread (header, enqueue): bounded there.
    Queued,
    /// On the stream, behind the op it runs.
    Launched(Instant),
    /// Reached by the stream.
    Running(Instant),
}

/// What the threads tell a [`Work`] about its op.
struct Ticket {
    host: Arc<Host>,
    label: String,
    id: OpId,
    state: Mutex<(Stage, Option<Result<()>>)>,
    cv: Condvar,
}

impl Ticket {
    fn new(host: &Arc<Host>, label: &str, id: &OpId) -> Arc<Ticket> {
        host.unfinished.fetch_add(1, Ordering::SeqCst);
        let state = Mutex::new((Stage::Queued, None));
        Arc::new(Ticket { host: host.clone(), label: label.to_string(), id: id.clone(), state, cv: Condvar::new() })
    }
    fn stage(&self, s: Stage) {
        lock(&self.state).0 = s;
    }
    /// The op's outcome (the first one stays); ends its [`progress`] record.
    fn finish(&self, r: Result<()>) {
        let mut st = lock(&self.state);
        if st.1.is_none() {
            st.1 = Some(r);
            progress::end(&self.label, self.id.seq);
            self.host.unfinished.fetch_sub(1, Ordering::SeqCst);
        }
        self.cv.notify_all();
    }
    fn outcome(&self) -> Option<Result<()>> {
        lock(&self.state).1.clone()
    }
    /// Waits for the outcome until `until`.
    fn wait_until(&self, until: Instant) -> Option<Result<()>> {
        let mut st = lock(&self.state);
        loop {
            if let Some(r) = &st.1 {
                return Some(r.clone());
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            st = self.cv.wait_timeout(st, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Issues an op's shm collective on the data communicator.
type Call = Box<dyn FnOnce(&ShmBackend) -> Result<Work<Vec<Buf>>> + Send>;

/// The data step of an op: the shm collective, issued on the stream; its results are copied
/// into `outs` (`None`: the result is the caller's own buffer).
struct Launch {
    call: Call,
    outs: Vec<Option<Buf>>,
}

/// A job of the progress thread: the header exchange (marked failed for an op that failed
/// locally after `begin`), then the launch.
struct Job {
    id: OpId,
    /// A `new_group` (its header says so: matched against another op, it is `op_mismatch` on
    /// every rank).
    group: bool,
    failed: Option<String>,
    launch: Option<Launch>,
    ticket: Arc<Ticket>,
}

/// A launched op on the stream (`launch` `None`: reported launched, never run).
struct Kernel {
    id: OpId,
    launch: Option<Launch>,
    ticket: Arc<Ticket>,
}

/// What the progress and stream threads share.
struct Chan {
    host: Arc<Host>,
    data: Arc<ShmBackend>,
    board: Arc<ShmBackend>,
    label: String,
}

impl Chan {
    fn rank(&self) -> usize {
        self.host.rank
    }
    fn err(&self, id: &OpId, msg: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("stream {} #{} on rank {}: {msg}", id.name, id.seq, self.rank()))
    }
    fn aborted_err(&self, id: &OpId, why: &str) -> CollectiveError {
        CollectiveError::Aborted(format!("stream {} #{} on rank {}: the communicator was aborted ({why})", id.name, id.seq, self.rank()))
    }
    fn timeout(&self, id: &OpId, detail: String) -> CollectiveError {
        CollectiveError::Timeout {
            op: id.name.to_string(),
            seq: id.seq,
            rank: self.rank(),
            waited_ms: id.issued.elapsed().as_millis() as u64,
            detail: format!("{detail}; this process is {}", progress::describe()),
        }
    }

    /// Fault injection at `at` (before / after the header): `die` ends the process; `stall`
    /// holds the op until `deadline` or an abort, then aborts (this rank's sequence is out of
    /// step) and fails; `fail` is `Ok(Some(error))`, a local failure.
    fn fault_point(&self, id: &OpId, at: &str, deadline: Instant) -> Result<Option<String>> {
        if self.host.fires(at, Action::Die, id.nth) {
            eprintln!("concord stream backend: injected fault {at}:die on rank {}: the process ends", self.rank());
            std::process::exit(fault::DIE_EXIT_CODE);
        }
        if self.host.fires(at, Action::Stall, id.nth) {
            if !self.host.sleep_until(deadline) {
                self.host.abort(format!("{} #{}: injected fault {at}:stall", id.name, id.seq));
            }
            return Err(self.err(id, format!("injected fault {at}:stall held the op until its deadline or an abort")));
        }
        Ok(self.host.fires(at, Action::Fail, id.nth).then(|| format!("injected fault {at}:fail (a simulated local failure)")))
    }

    /// The progress thread's work on one job.
    fn run_job(&self, job: Job, stream: &mpsc::Sender<Kernel>) {
        let Job { id, group, failed, launch, ticket } = job;
        let fail = |e: CollectiveError| ticket.finish(Err(e));
        if let Some(why) = self.host.aborted() {
            return fail(self.aborted_err(&id, &why));
        }
        let t = self.host.op_timeout;
        let deadline = (id.issued + t).max(Instant::now() + t);
        let local = match self.fault_point(&id, point::BEFORE_HEADER, deadline) {
            Ok(l) => failed.clone().or(l),
            Err(e) => return fail(e),
        };
        let all = match self.exchange(&id, local.is_some(), group, deadline) {
            Ok(all) => all,
            Err(e) => return fail(e),
        };
        if let Some(why) = local {
            if failed.is_some() && self.host.bug(StreamBug::LocalFailureAborts) {
                self.host.abort(format!("{} #{} failed locally on this rank", id.name, id.seq));
            }
            return fail(self.err(&id, why));
        }
        if let Some(r) = all.iter().position(|&(_, g)| g != group) {
            let (what, other) = if group { ("new_group", "another op") } else { ("this op", "new_group") };
            return fail(CollectiveError::bad_input(
                concord_core::BadInputKind::OpMismatch,
                id.name,
                id.seq,
                self.rank(),
                format!("{what} on rank {} met {other} on rank {r} at the same place in the sequence", self.rank()),
            ));
        }
        let ws = all.len();
        let seen = |r: usize| {
            !self.host.bug(StreamBug::FailedHeaderFromRingNeighbours) || (r + 1) % ws == self.rank() || (self.rank() + 1) % ws == r
        };
        if let Some(r) = (0..ws).find(|&r| all[r].0 != 0 && seen(r)) {
            if self.host.bug(StreamBug::PeerFailureAsTimeout) {
                self.host.abort(format!("{} #{}: rank {r} did not take part", id.name, id.seq));
                return fail(self.timeout(&id, format!("rank {r} did not complete its side of the op; communicator aborted")));
            }
            let msg = format!("rank {r} failed its side of this op locally after issuing it (see rank {r}'s error); nothing was launched");
            if self.host.legal == Some(StreamLegal::PeerAborted) {
                return fail(CollectiveError::Aborted(format!("stream {} #{} on rank {}: {msg}", id.name, id.seq, self.rank())));
            }
            return fail(self.err(&id, msg));
        }
        match self.fault_point(&id, point::AFTER_HEADER, deadline) {
            Ok(None) => {}
            Ok(Some(why)) => return fail(self.err(&id, why)),
            Err(e) => return fail(e),
        }
        // no_launch: this rank's side is never run, but the op looks launched here.
        let launch = if self.host.fires(point::NO_LAUNCH, Action::Stall, id.nth) { None } else { launch };
        // The enqueue: the library call, under the library's lock.
        let lib = lock(&self.host.lib);
        if self.host.fires(point::ENQUEUE, Action::Stall, id.nth) {
            let until = deadline.max(Instant::now() + t);
            let aborted = self.host.sleep_until(until);
            drop(lib);
            if aborted {
                return fail(self.aborted_err(&id, &self.host.aborted().unwrap_or_default()));
            }
            self.host.abort(format!("{} #{}: the library call stayed in progress past the op deadline", id.name, id.seq));
            return fail(self.timeout(
                &id,
                "injected fault enqueue:stall: the library call stayed in progress past the op deadline; communicator aborted".into(),
            ));
        }
        let behind = self.host.queued.fetch_add(1, Ordering::SeqCst) > 0 || lock(&self.host.current).is_some();
        ticket.stage(if behind { Stage::Launched(Instant::now()) } else { Stage::Running(Instant::now()) });
        let tk = ticket.clone();
        if stream.send(Kernel { id: id.clone(), launch, ticket }).is_err() {
            self.host.queued.fetch_sub(1, Ordering::SeqCst);
            tk.finish(Err(self.aborted_err(&id, "the stream is gone")));
        }
        drop(lib);
    }

    /// Exchanges this rank's header (status: failed locally or not) with every rank on the
    /// board, until `deadline` (then the communicator is aborted). Every rank's status, by rank.
    fn exchange(&self, id: &OpId, failed: bool, group: bool, deadline: Instant) -> Result<Vec<(i64, bool)>> {
        let mine = Tensor::from_vec(&[2], vec![i64::from(failed), i64::from(group)]);
        let b = self.board.upload(&mine).map_err(|e| self.err(id, format!("header upload: {e}")))?;
        let w = self.board.all_gather_into_tensor(&b).map_err(|e| self.err(id, format!("header exchange: {e}")))?;
        loop {
            match poll(&w, Duration::from_millis(10)) {
                Some(Ok(out)) => {
                    let t = self.board.download(out).map_err(|e| self.err(id, format!("header download: {e}")))?;
                    return Ok((0..t.numel() / 2).map(|r| (t.get_f64(2 * r) as i64, t.get_f64(2 * r + 1) != 0.0)).collect());
                }
                Some(Err(e)) => {
                    self.host.abort(format!("{} #{}: the header exchange failed: {e}", id.name, id.seq));
                    return Err(match e {
                        CollectiveError::PeerDied { .. } | CollectiveError::Timeout { .. } | CollectiveError::Aborted(_) => e,
                        e => self.err(id, format!("the validation header exchange failed ({e}); communicator aborted")),
                    });
                }
                None => {}
            }
            if let Some(why) = self.host.aborted() {
                return Err(self.aborted_err(id, &why));
            }
            if Instant::now() >= deadline && !self.host.bug(StreamBug::HeaderWaitUnbounded) {
                self.host.abort(format!("{} #{} timed out waiting for the peers' headers", id.name, id.seq));
                return Err(self.timeout(
                    id,
                    format!(
                        "the peers' validation headers did not arrive (a peer never issued this op?) before the op deadline of {} ms; \
                         communicator aborted",
                        self.host.op_timeout.as_millis()
                    ),
                ));
            }
        }
    }

    /// The stream thread's work on one launched op.
    fn run_kernel(&self, k: Kernel) {
        let Kernel { id, launch, ticket } = k;
        let started = Instant::now();
        *lock(&self.host.current) = Some((started, id.name, id.seq));
        self.host.queued.fetch_sub(1, Ordering::SeqCst);
        ticket.stage(Stage::Running(started));
        if self.host.fires(point::STREAM, Action::Stall, id.nth) {
            // A gate on the stream before the op: opened by an abort, teardown or the backstop.
            self.host.sleep_until(started + backstop(self.host.op_timeout));
        }
        let r = match self.host.aborted() {
            Some(_) if self.host.bug(StreamBug::AbortReleasesOk) => Ok(()),
            Some(why) => Err(self.aborted_err(&id, &why)),
            None => match launch {
                Some(l) => self.run(&id, l, started),
                None => Ok(()),
            },
        };
        *lock(&self.host.current) = None;
        ticket.finish(r);
    }

    /// Runs the data step: the shm collective, waited for with the op deadline (then the
    /// communicator is aborted), then the copies into the outputs. After an abort the
    /// collective is still waited for (it ends by its own deadline), so nothing runs it once
    /// the op has failed; the op fails with the abort even if it completed meanwhile.
    fn run(&self, id: &OpId, l: Launch, started: Instant) -> Result<()> {
        let w = (l.call)(&self.data)?;
        let deadline = started + self.host.op_timeout;
        let grace = deadline + self.host.op_timeout + Duration::from_secs(1);
        let res: Result<Vec<Buf>> = loop {
            if let Some(r) = poll(&w, Duration::from_millis(10)) {
                break r.cloned();
            }
            let now = Instant::now();
            if self.host.closing.load(Ordering::SeqCst) {
                break Err(self.aborted_err(id, "teardown"));
            }
            if self.host.bug(StreamBug::AbortedKernelDone) && self.host.aborted().is_some() {
                return Ok(());
            }
            if now >= deadline && self.host.aborted().is_none() {
                self.host.abort(format!("{} #{} passed its op deadline on the stream", id.name, id.seq));
            }
            if now >= grace {
                eprintln!(
                    "concord stream backend: warning: {} #{} on rank {}: the shm collective did not end after the abort",
                    id.name,
                    id.seq,
                    self.rank()
                );
                break Err(self.timeout(id, "the data exchange did not end by the op deadline; communicator aborted".into()));
            }
        };
        drop(w);
        if let Err(e) = &res {
            if matches!(e, CollectiveError::Timeout { .. } | CollectiveError::PeerDied { .. }) {
                self.host.abort(format!("{} #{}: {e}", id.name, id.seq));
            }
        }
        if let Some(why) = self.host.aborted() {
            return Err(match res {
                Err(e @ (CollectiveError::Timeout { .. } | CollectiveError::PeerDied { .. })) => e,
                _ => self.aborted_err(id, &why),
            });
        }
        let got = res?;
        for (r, out) in got.iter().zip(&l.outs) {
            if let Some(out) = out {
                let t = self.data.download(r)?;
                self.data.write(out, &t)?;
            }
        }
        Ok(())
    }
}

/// `Some(result)` once `w` is complete (waiting up to `slice`), `None` while pending.
fn poll<T>(w: &Work<T>, slice: Duration) -> Option<Result<&T>> {
    match w.wait(slice) {
        Ok(v) => Some(Ok(v)),
        Err(CollectiveError::Timeout { .. }) if !w.is_completed() => None,
        Err(CollectiveError::Timeout { .. }) => Some(w.wait(Duration::ZERO)),
        Err(e) => Some(Err(e)),
    }
}

/// The completion of a send / recv: the data communicator's work.
struct Relay<T>(Work<T>);

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        self.0.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match poll(&self.0, timeout) {
            None => Ok(false),
            Some(r) => r.map(|_| true),
        }
    }
}

/// The completion of a [`Stream`] op.
struct StreamCompletion {
    ticket: Arc<Ticket>,
    host: Arc<Host>,
}

impl StreamCompletion {
    fn deadline(&self) -> Instant {
        let t = self.host.op_timeout;
        match lock(&self.ticket.state).0 {
            Stage::Queued => self.ticket.id.issued + backstop(t),
            Stage::Launched(at) => at + backstop(t),
            Stage::Running(at) => at + t,
        }
    }

    /// The op (or the one the stream runs before it) passed its deadline: abort, let the
    /// threads fail it (bounded), report the timeout.
    /// The threads get until `until` (the caller's wait) to fail the op, at most an op deadline
    /// and 2 s: then the caller's buffers are its own again.
    fn expire(&self, why: String, until: Instant) -> Result<bool> {
        let id = &self.ticket.id;
        self.host.abort(format!("{} #{}: {why}", id.name, id.seq));
        let released = self.ticket.wait_until(until.min(Instant::now() + self.host.op_timeout + Duration::from_secs(2)));
        let waited_ms = id.issued.elapsed().as_millis() as u64;
        match released {
            Some(Err(e @ CollectiveError::Timeout { .. })) => return Err(e),
            Some(Ok(())) if self.host.bug(StreamBug::AbortedKernelDone) => return Ok(true),
            _ => {}
        }
        Err(CollectiveError::Timeout {
            op: id.name.to_string(),
            seq: id.seq,
            rank: self.host.rank,
            waited_ms,
            detail: format!(
                "{why} (op deadline {} ms); stream communicator aborted; this process is {}",
                self.host.op_timeout.as_millis(),
                progress::describe()
            ),
        })
    }
}

impl Completion for StreamCompletion {
    fn is_completed(&self) -> bool {
        self.ticket.outcome().is_some()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(r) = self.ticket.outcome() {
                return r.map(|_| true);
            }
            let now = Instant::now();
            let deadline = self.deadline();
            if now >= deadline {
                return self.expire("pending past its op deadline".into(), until);
            }
            if matches!(lock(&self.ticket.state).0, Stage::Launched(_)) {
                if let Some(why) = self.host.overdue(now) {
                    return self.expire(format!("queued behind {why}"), until);
                }
            }
            if now >= until {
                return Ok(false);
            }
            let next = until.min(deadline).min(now + Duration::from_millis(10));
            self.ticket.wait_until(next);
        }
    }
}

/// An op being issued: numbered and in [`progress`] until its ticket takes it over.
struct Op {
    id: OpId,
    label: String,
    handed: bool,
}

impl Drop for Op {
    fn drop(&mut self) {
        if !self.handed {
            progress::end(&self.label, self.id.seq);
        }
    }
}

/// The reference launch-based backend (see the module docs).
pub struct Stream {
    chan: Arc<Chan>,
    rank: usize,
    ws: usize,
    seq: AtomicU64,
    /// The fault index (the communicator `init` created, or a group that holds faults of its own).
    nth: Option<AtomicU64>,
    /// `new_group` calls issued so far (numbers the groups faults on groups name, from 1).
    groups_made: AtomicU64,
    counter: OutstandingCounter,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

static COMMS: AtomicU64 = AtomicU64::new(0);

impl Stream {
    fn make(
        data: ShmBackend,
        board: ShmBackend,
        faults: Vec<Fault>,
        bug: Option<StreamBug>,
        legal: Option<StreamLegal>,
        op_timeout: Duration,
        counted: bool,
    ) -> Stream {
        let (rank, ws) = (data.rank(), data.world_size());
        let host = Arc::new(Host {
            rank,
            op_timeout,
            faults,
            bug,
            legal,
            aborted: Mutex::new(None),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
            lib: Mutex::new(()),
            current: Mutex::new(None),
            queued: Default::default(),
            unfinished: Default::default(),
        });
        let label = format!("stream r{rank} c{}", COMMS.fetch_add(1, Ordering::SeqCst));
        let chan = Arc::new(Chan { host, data: Arc::new(data), board: Arc::new(board), label });
        let (jtx, jrx) = mpsc::channel::<Job>();
        let (ktx, krx) = mpsc::channel::<Kernel>();
        let c = chan.clone();
        let progress = std::thread::Builder::new()
            .name(format!("{} progress", chan.label))
            .spawn(move || {
                while let Ok(job) = jrx.recv() {
                    c.run_job(job, &ktx);
                }
            })
            .expect("spawn the progress thread");
        let c = chan.clone();
        let stream = std::thread::Builder::new()
            .name(format!("{} stream", chan.label))
            .spawn(move || {
                while let Ok(k) = krx.recv() {
                    c.run_kernel(k);
                }
            })
            .expect("spawn the stream thread");
        Stream {
            chan,
            rank,
            ws,
            seq: AtomicU64::new(0),
            nth: counted.then(|| AtomicU64::new(0)),
            groups_made: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
            jobs: Mutex::new(Some(jtx)),
            threads: Mutex::new(vec![progress, stream]),
        }
    }

    fn host(&self) -> &Host {
        &self.chan.host
    }

    fn begin(&self, name: &'static str) -> Op {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let nth = self.nth.as_ref().map(|n| n.fetch_add(1, Ordering::SeqCst));
        progress::begin(&self.chan.label, name, seq);
        Op { id: OpId { name, seq, nth, issued: Instant::now() }, label: self.chan.label.clone(), handed: false }
    }

    /// `Err(Aborted)` once the communicator was aborted: later ops fail at issue.
    fn alive(&self, o: &Op) -> Result<()> {
        match self.host().aborted() {
            Some(why) => Err(self.chan.aborted_err(&o.id, &why)),
            None => Ok(()),
        }
    }

    fn send_job(&self, job: Job) -> Result<()> {
        let id = job.id.clone();
        let tx = lock(&self.jobs);
        match tx.as_ref().map(|tx| tx.send(job).is_ok()) {
            Some(true) => Ok(()),
            _ => Err(self.chan.aborted_err(&id, "the progress thread is gone")),
        }
    }

    /// The op's local step after `begin` (a simulated allocation, fault point `after_begin`):
    /// a failure there still sends the op's header, marked failed, so that every rank ends the
    /// op in one named error.
    fn admit(&self, o: &mut Op) -> Result<()> {
        self.alive(o)?;
        if !self.host().fires(point::AFTER_BEGIN, Action::Fail, o.id.nth) {
            return Ok(());
        }
        let why = "injected fault after_begin:fail (a simulated out-of-memory)".to_string();
        if !self.host().bug(StreamBug::LocalFailureUnsent) {
            let ticket = Ticket::new(&self.chan.host, &self.chan.label, &o.id);
            o.handed = true;
            let _ = self.send_job(Job { id: o.id.clone(), group: false, failed: Some(why.clone()), launch: None, ticket });
        }
        Err(self.chan.err(&o.id, why))
    }

    /// An output buffer of the op (allocated at issue, as a device backend allocates it
    /// stream-ordered).
    fn out(&self, dtype: DType, shape: &[usize]) -> Result<Buf> {
        self.chan.data.alloc(dtype, shape)
    }

    /// Queues `o` (header, then `launch` on the stream) and returns its pending work.
    fn submit<T>(&self, mut o: Op, value: T, launch: Launch) -> Result<Work<T>> {
        let ticket = Ticket::new(&self.chan.host, &self.chan.label, &o.id);
        o.handed = true;
        let meta = WorkMeta { backend: "stream".into(), op: o.id.name.to_string(), seq: o.id.seq, rank: self.rank };
        self.send_job(Job { id: o.id.clone(), group: false, failed: None, launch: Some(launch), ticket: ticket.clone() })?;
        Ok(Work::new(value, Arc::new(StreamCompletion { ticket, host: self.chan.host.clone() }), meta, &self.counter))
    }

    /// An op with one output.
    fn one(
        &self,
        name: &'static str,
        out: Option<(DType, Vec<usize>)>,
        given: Option<&Buf>,
        call: impl FnOnce(&ShmBackend) -> Result<Work<Buf>> + Send + 'static,
    ) -> Result<Work<Buf>> {
        let mut o = self.begin(name);
        self.admit(&mut o)?;
        let (value, target) = match (out, given) {
            (Some((dt, shape)), _) => {
                let b = self.out(dt, &shape)?;
                (b.clone(), Some(b))
            }
            (None, Some(b)) => (b.clone(), None),
            (None, None) => unreachable!("an op returns a new buffer or the caller's"),
        };
        self.submit(o, value, Launch { call: Box::new(move |d| Ok(call(d)?.map(|b| vec![b]))), outs: vec![target] })
    }

    /// An op with one output per input.
    fn many(
        &self,
        name: &'static str,
        outs: Option<Vec<(DType, Vec<usize>)>>,
        given: &[Buf],
        call: impl FnOnce(&ShmBackend) -> Result<Work<Vec<Buf>>> + Send + 'static,
    ) -> Result<Work<Vec<Buf>>> {
        let mut o = self.begin(name);
        self.admit(&mut o)?;
        let (value, targets): (Vec<Buf>, Vec<Option<Buf>>) = match outs {
            Some(shapes) => {
                let bs = shapes.iter().map(|(dt, s)| self.out(*dt, s)).collect::<Result<Vec<_>>>()?;
                (bs.clone(), bs.into_iter().map(Some).collect())
            }
            None => (given.to_vec(), given.iter().map(|_| None).collect()),
        };
        self.submit(o, value, Launch { call: Box::new(call), outs: targets })
    }

    /// `w` (the data communicator's) as this backend's work, counted in its `outstanding()`.
    fn relay<T: Send + Sync + 'static, U>(&self, w: Work<T>, value: U) -> Work<U> {
        let meta = WorkMeta { backend: "stream".into(), ..w.meta().clone() };
        Work::new(value, Arc::new(Relay(w)), meta, &self.counter)
    }

    fn desc(&self, b: &Buf) -> (DType, Vec<usize>) {
        (self.chan.data.buffer_dtype(b), self.chan.data.buffer_shape(b))
    }
    fn gathered(&self, b: &Buf) -> (DType, Vec<usize>) {
        let (dt, s) = self.desc(b);
        let s = match s.split_first() {
            None => vec![self.ws],
            Some((d0, rest)) => std::iter::once(d0 * self.ws).chain(rest.iter().copied()).collect(),
        };
        (dt, s)
    }
    fn scattered(&self, b: &Buf) -> (DType, Vec<usize>) {
        let (dt, s) = self.desc(b);
        let s = match s.split_first() {
            None => vec![],
            Some((d0, rest)) => std::iter::once(d0 / self.ws).chain(rest.iter().copied()).collect(),
        };
        (dt, s)
    }

    /// Waits (until `until`) for every op issued so far to finish; `false` if one is still
    /// pending then.
    fn drained(&self, until: Instant) -> bool {
        loop {
            if self.host().unfinished.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The bug [`StreamBug::CopiesOnTheStream`]: a copy waits for the ops queued before it.
    fn copy_on_the_stream(&self) {
        if self.host().bug(StreamBug::CopiesOnTheStream) {
            self.drained(Instant::now() + self.host().op_timeout);
        }
    }
}

impl Drop for Stream {
    /// Teardown: aborts (gates open, waits give up, running kernels are left), stops the
    /// threads and joins them.
    fn drop(&mut self) {
        self.host().closing.store(true, Ordering::SeqCst);
        self.host().abort("the communicator was destroyed".into());
        lock(&self.jobs).take();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
    }
}

impl Backend for Stream {
    type Buffer = Buf;

    /// Options: `fault` (the hooks above; other backends' points are ignored), `stream_bug`,
    /// `stream_legal`.
    fn init(world: &WorldInfo) -> Result<Self> {
        let rank = world.rank;
        let faults = fault::from_world(world)
            .map_err(|e| CollectiveError::Backend(format!("stream init on rank {rank}: option `fault`: {e}")))?
            .into_iter()
            .filter(|f| HOOKS.contains(&(f.point.as_str(), f.action)))
            .collect();
        let bug = match world.option(BUG_OPTION) {
            None => None,
            Some(n) => Some(
                StreamBug::parse(n)
                    .ok_or_else(|| CollectiveError::Backend(format!("stream init on rank {rank}: no stream bug named `{n}`")))?,
            ),
        };
        let legal = match world.option(LEGAL_OPTION) {
            None => None,
            Some(n) => Some(
                StreamLegal::parse(n)
                    .ok_or_else(|| CollectiveError::Backend(format!("stream init on rank {rank}: no stream legal choice named `{n}`")))?,
            ),
        };
        let mut inner = world.clone();
        inner.options.retain(|(k, _)| k != fault::OPTION && k != BUG_OPTION && k != LEGAL_OPTION);
        let mut board = inner.clone();
        // The library's own watchdog comes 1 s after this backend's deadline (a device library
        // has none: NCCL waits until aborted), so the deadlines that end ops are this backend's.
        inner.op_timeout = world.op_timeout + Duration::from_secs(1);
        let data = ShmBackend::init(&inner)?;
        board.world_id = format!("{}-board", world.world_id);
        board.op_timeout = backstop(world.op_timeout);
        board.options.retain(|(k, _)| k != "shm_arena_gib");
        board.options.push(("shm_arena_gib".into(), "0".into()));
        let board = ShmBackend::init(&board)?;
        Ok(Stream::make(data, board, faults, bug, legal, world.op_timeout, true))
    }
    fn name(&self) -> &str {
        "stream"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.ws
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities { fused: FusedImpl::Decomposed, ..self.chan.data.capabilities() }
    }
    /// This backend's works (the data communicator's are held by them or by the stream).
    fn outstanding(&self) -> usize {
        self.counter.get()
    }
    /// NCCL's set, on the world and on its groups (`/G`).
    fn fault_hooks(&self) -> Vec<(String, Action)> {
        let on_groups = [Action::Stall, Action::Fail, Action::Die].map(|a| (fault::ON_GROUPS, a));
        HOOKS.iter().chain(on_groups.iter()).map(|(p, a)| (p.to_string(), *a)).collect()
    }
    /// Its header goes the ops' way (a `new_group` met by another op is `op_mismatch` on every
    /// rank, the communicator usable), then it waits for the stream to reach it (the split
    /// follows every earlier op on the device); then the data communicator and the board split.
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        let g = self.groups_made.fetch_add(1, Ordering::SeqCst) + 1;
        let mut o = self.begin("new_group");
        self.alive(&o)?;
        let ticket = Ticket::new(&self.chan.host, &self.chan.label, &o.id);
        o.handed = true;
        self.send_job(Job { id: o.id.clone(), group: true, failed: None, launch: None, ticket: ticket.clone() })?;
        match ticket.wait_until(o.id.issued + backstop(self.host().op_timeout)) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => {
                self.host().abort(format!("new_group #{} did not reach the stream", o.id.seq));
                return Err(self
                    .chan
                    .timeout(&o.id, "its header exchange or the ops before it did not finish; communicator aborted".into()));
            }
        }
        let data = self.chan.data.new_group(ranks)?;
        let board = self.chan.board.new_group(ranks)?;
        match (data, board) {
            (Some(d), Some(b)) => {
                let faults = fault::for_group(&self.host().faults, g);
                let counted = !faults.is_empty();
                Ok(Some(Stream::make(d, b, faults, self.host().bug, self.host().legal, self.host().op_timeout, counted)))
            }
            (None, None) => Ok(None),
            _ => Err(self.chan.err(&o.id, "the board and the data communicator disagree on membership")),
        }
    }
    fn upload(&self, t: &Tensor) -> Result<Buf> {
        self.copy_on_the_stream();
        self.chan.data.upload(t)
    }
    fn download(&self, b: &Buf) -> Result<Tensor> {
        self.copy_on_the_stream();
        self.chan.data.download(b)
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Buf> {
        self.chan.data.alloc(dtype, shape)
    }
    fn write(&self, b: &Buf, t: &Tensor) -> Result<()> {
        self.chan.data.write(b, t)
    }
    fn view(&self, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        self.chan.data.view(b, offset, shape)
    }
    fn buffer_addr(&self, b: &Buf) -> usize {
        self.chan.data.buffer_addr(b)
    }
    fn buffer_dtype(&self, b: &Buf) -> DType {
        self.chan.data.buffer_dtype(b)
    }
    fn buffer_shape(&self, b: &Buf) -> Vec<usize> {
        self.chan.data.buffer_shape(b)
    }

    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("all_reduce", Some(self.desc(&x)), None, move |d| d.all_reduce(&x, op))
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let x2 = x.clone();
        self.one("all_reduce_", None, Some(x), move |d| d.all_reduce_(&x2, op))
    }
    fn all_reduce_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let shapes = xs.iter().map(|x| self.desc(x)).collect();
        let xs2 = xs.to_vec();
        self.many("all_reduce_coalesced", Some(shapes), xs, move |d| d.all_reduce_coalesced(&xs2, op))
    }
    fn all_reduce_coalesced_(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let xs2 = xs.to_vec();
        self.many("all_reduce_coalesced_", None, xs, move |d| d.all_reduce_coalesced_(&xs2, op))
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("all_gather_into_tensor", Some(self.gathered(&x)), None, move |d| d.all_gather_into_tensor(&x))
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let (x, o) = (x.clone(), out.clone());
        self.one("all_gather_into_tensor_out", None, Some(out), move |d| d.all_gather_into_tensor_out(&x, &o))
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let shapes = xs.iter().map(|x| self.gathered(x)).collect();
        let xs2 = xs.to_vec();
        self.many("all_gather_into_tensor_coalesced", Some(shapes), xs, move |d| d.all_gather_into_tensor_coalesced(&xs2))
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("reduce_scatter_tensor", Some(self.scattered(&x)), None, move |d| d.reduce_scatter_tensor(&x, op))
    }
    fn reduce_scatter_tensor_out(&self, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let (x, o) = (x.clone(), out.clone());
        self.one("reduce_scatter_tensor_out", None, Some(out), move |d| d.reduce_scatter_tensor_out(&x, op, &o))
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let shapes = xs.iter().map(|x| self.scattered(x)).collect();
        let xs2 = xs.to_vec();
        self.many("reduce_scatter_tensor_coalesced", Some(shapes), xs, move |d| d.reduce_scatter_tensor_coalesced(&xs2, op))
    }
    fn all_to_all_single(&self, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let (dt, s) = self.desc(x);
        let rows = match (o, s.first()) {
            (Some(o), _) => o.iter().try_fold(0usize, |a, &r| a.checked_add(r)).unwrap_or(0),
            (None, Some(&d0)) => d0 / self.ws * self.ws,
            (None, None) => 0,
        };
        let shape: Vec<usize> = if s.is_empty() { vec![] } else { std::iter::once(rows).chain(s[1..].iter().copied()).collect() };
        let (x, o, i) = (x.clone(), o.map(<[usize]>::to_vec), i.map(<[usize]>::to_vec));
        self.one("all_to_all_single", Some((dt, shape)), None, move |d| d.all_to_all_single(&x, o.as_deref(), i.as_deref()))
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("broadcast", Some(self.desc(&x)), None, move |d| d.broadcast(&x, src))
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let x2 = x.clone();
        self.one("broadcast_", None, Some(x), move |d| d.broadcast_(&x2, src))
    }
    fn permute_tensor(&self, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let (x, p) = (x.clone(), src_dst.to_vec());
        self.one("permute_tensor", Some(self.desc(&x)), None, move |d| d.permute_tensor(&x, &p))
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("reduce", Some(self.desc(&x)), None, move |d| d.reduce(&x, op, root))
    }
    fn gather(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("gather", Some(self.gathered(&x)), None, move |d| d.gather(&x, root))
    }
    fn scatter(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let x = x.clone();
        self.one("scatter", Some(self.scattered(&x)), None, move |d| d.scatter(&x, root))
    }
    /// Point to point: counted, then straight to the data communicator (streams of their own).
    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        let o = self.begin("send");
        self.alive(&o)?;
        Ok(self.relay(self.chan.data.send(x, dst)?, ()))
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let o = self.begin("recv");
        self.alive(&o)?;
        Ok(self.relay(self.chan.data.recv(out, src)?, out.clone()))
    }
    fn barrier(&self) -> Result<Work<()>> {
        let mut o = self.begin("barrier");
        self.admit(&mut o)?;
        self.submit(o, (), Launch { call: Box::new(|d| Ok(d.barrier()?.map(|_| Vec::new()))), outs: Vec::new() })
    }
}
