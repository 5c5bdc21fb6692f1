//! The progress thread: every NCCL call on a rank's communicators is made here, in issue order.
//!
//! Issuing a collective MUST return at once (the [`concord_core::Backend`] contract), but with
//! cross-rank validation a collective can only be launched once every peer's header has arrived.
//! So the issuing thread does the local checks, allocates the output, and queues a [`Job`]; one
//! thread per rank (shared by the world communicator and all of its subgroups, which use the
//! same stream) takes jobs in FIFO order and, for each, exchanges and validates the headers,
//! launches the NCCL group and records a CUDA event (one per batch of small ops launched back
//! to back: [`Tracker::defer`]). The job's [`Ticket`] tells the op's
//! completion where it stands: queued, launched (with its event) or finished (failed, or nothing
//! to launch).
//!
//! Contracts:
//! * Jobs run one at a time in submission order, so every rank launches in issue order, on
//!   every communicator (a subgroup's op queued after a world op is launched after it).
//! * A send / recv job only parks its op on its direction (`p2p`, `direction`): the thread
//!   never waits for a peer's send / recv. Parked ops are serviced ([`Tracker::service`])
//!   between jobs, while the queue is empty (polling every 100 us) and inside every wait of
//!   the thread for peers (a collective's header exchange, which first parks the sends /
//!   recvs queued behind its job: [`Tracker::service_waiting`]), so a pending send / recv and
//!   a collective never hold each other back. When the queue is closed with ops still parked,
//!   they get [`DROP_GRACE`], then their communicators are aborted and they fail.
//! * Every step of a job is bounded by the job's deadline (its start here + the world's op
//!   timeout; a header wait through the board ends there too; one through NCCL on the stream
//!   counts from when the stream reached it, see `Channel::wait_header`); a step that runs past
//!   it aborts the job's communicator and ends
//!   the job with a named [`CollectiveError::Timeout`] naming the op and its sequence number.
//!   A launched op's deadline counts from when the stream reached it; one still pending past
//!   it, found while later work waits behind it, gets its own communicator aborted
//!   ([`Tracker`]).
//! * A job whose op failed locally after issue (see `issue::Op`) still exchanges its header,
//!   marked failed; a peer's failed header ends the op with a named error naming that rank.
//! * Headers go through the communicator's host board when it has one
//!   ([`Channel::exchange_board`], see `board`): the wait depends on the peers only, never on
//!   the GPU, so op k+1 is validated and launched while op k runs. Without a board (ranks on
//!   several hosts, `header_board=0`), the header all-gather runs on the
//!   op's own communicator and stream ([`Channel::exchange_all`]): on the device it follows
//!   the previous op, and the progress thread waits for it before launching, so validated ops
//!   do not overlap (2 x H200, 1 KiB all_reduce back to back: 49-53 us per op validated that
//!   way, 13-15 us with `validate=0`).
//! * Communicator teardown (finalize, destroy) is a job too, queued when the communicator's
//!   last handle goes, so no NCCL call of a teardown runs beside another on this device.
//! * A job keeps the device memory its NCCL calls touch alive until those calls are enqueued
//!   (a buffer dropped by the caller right after issue is freed stream-ordered *after* the op).
//! * A launch runs on its communicator's blocking twin (see **Fast launch** in the crate docs),
//!   so it cannot poll its own deadline: the watchdog thread ([`watchdog`], one per progress
//!   thread, a look every 2 ms) aborts the communicator of the running job whose NCCL call is
//!   still inside NCCL past its deadline, which ends the call; the job then fails with a named
//!   timeout.
//! * [`Progress`] is dropped when the last backend sharing it goes: it lets the queue drain,
//!   aborts a communicator whose job still waits for its peers after [`DROP_GRACE`], and never
//!   waits for the thread longer than [`crate::comm::ABORT_WAIT`] plus a few seconds.

use crate::board::Board;
use crate::comm::{Comm, LaunchError, Teardown, TeardownVia, ABORT_WAIT};
use crate::cuda::{poll_until, DevMem, Device, Event, Padded, Pinned};
use crate::direction::{Data, NcclWire};
use crate::fault::Faults;
use crate::header::{failed_rank, header_len, parse_all, validate, Header};
use crate::p2p::{Failure, Outcome, Parked, Scheduler};
use concord_core::fault::{point, Action};
use concord_core::{progress, BadInputKind, CollectiveError, Result};
use cudarc::nccl::sys as nccl;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a dropped backend's queue may keep waiting for peers before its communicator is
/// aborted (the same grace the communicator's own teardown gives a busy stream).
pub const DROP_GRACE: Duration = Duration::from_millis(200);

/// How long the progress thread spins for the next job before sleeping (latency of short ops).
const SPIN: Duration = Duration::from_micros(50);

/// While a send / recv waits for its peer, the progress thread looks again after this, then
/// after twice as long each time, up to [`BUSY_WAIT_MAX`] (a peer that is late costs a look
/// every 100 us, as before: no spinning).
const BUSY_WAIT_MIN: Duration = Duration::from_micros(5);
const BUSY_WAIT_MAX: Duration = Duration::from_micros(100);

/// How often the spin after a job looks at parked sends / receives.
const SERVICE_EVERY: Duration = Duration::from_micros(2);

/// The NCCL calls of one launch: `(communicator, stream, premul-sum op handles)`.
pub(crate) type Calls =
    Box<dyn FnOnce(nccl::ncclComm_t, nccl::cudaStream_t, &[u32]) -> std::result::Result<(), (String, nccl::ncclResult_t)> + Send>;

/// What a job launches once its headers agree.
pub(crate) struct Launch {
    /// Premul-sum ops to create first (NCCL type, scalar bytes).
    pub premul: Vec<(nccl::ncclDataType_t, [u8; 8])>,
    pub calls: Calls,
    /// Device memory the calls read or write, kept alive until they are enqueued.
    pub keep: Vec<Arc<DevMem>>,
    /// What follows `calls`, in order (empty but for the fused ops: `fused_gpu`).
    pub then: Vec<Step>,
    /// On a communicator of one rank, a reduction that is the identity (`sum`, `prod`, `min`,
    /// `max` of one input; `avg` where [`crate::one_rank`] makes it `sum`): the device copies
    /// `(src, dst, bytes)` that replace `calls`, enqueued on the communicator's stream without
    /// entering NCCL (NCCL's own one-rank path is the same `cudaMemcpyAsync`, behind its group
    /// and enqueue work; an in-place op copies nothing). The op's completion event, tracker
    /// entry and deadlines are those of any launch. `None`: `calls` (also when a fault is
    /// injected at the enqueue, which only the NCCL path honours).
    pub local: Option<Vec<(u64, u64, usize)>>,
}

/// What [`Channel::run_op`] did.
pub(crate) enum Ran {
    /// Enqueued, with its own completion event.
    Launched(Launched),
    /// Enqueued; its completion event is shared with the ops launched next to it and recorded
    /// later (see [`Tracker::defer`]): the ticket stays `Running` until then.
    Deferred,
    /// Agreed, with nothing to launch.
    Nothing,
}

/// One more part of a launch after its first NCCL group.
pub(crate) enum Step {
    /// Another NCCL group (the launch's premul ops, a fresh enqueue deadline).
    Nccl(Calls),
    /// Device work enqueued between groups (matmuls, copies, events on any stream of the
    /// rank's GPU), given the NCCL stream; it never waits for the device.
    Device(Box<dyn FnOnce(cudarc::driver::sys::CUstream) -> std::result::Result<(), String> + Send>),
}

/// Names and numbers of an issued op, for messages and headers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpId {
    pub name: &'static str,
    pub seq: u64,
    pub issued: Instant,
    /// Index among the world's collective and point-to-point calls (fault injection only).
    pub nth: Option<u64>,
    /// The collective's number on its communicator (the same on every rank; 0 for other ops).
    pub cseq: u64,
    /// When the progress thread started the op's job (set there): its deadlines count from
    /// here, so time spent queued behind healthy earlier ops does not count against it.
    pub started: Option<Instant>,
}

/// The cross-rank check a job runs before launching.
pub(crate) enum Check {
    None,
    /// All-gather of every rank's header, then [`validate`].
    All(Header),
}

/// Where a queued op stands.
pub(crate) enum Stage {
    /// Not yet taken by the progress thread.
    Queued,
    /// Taken by the progress thread at this instant: headers / launch in progress, each step
    /// bounded by the job's own deadline (the job ends itself, with a named error).
    Running(Instant),
    /// Enqueued on the stream.
    Launched(Launched),
    Finished(Result<()>),
}

/// An op enqueued on the stream.
pub(crate) struct Launched {
    /// Recorded right after the op.
    pub ev: Arc<Event>,
    /// When it was enqueued.
    pub at: Instant,
    /// The event of the op launched before it on the stream (`None`: nothing was pending):
    /// once complete, the stream has reached this op, and its deadline starts.
    pub behind: Option<Arc<Event>>,
    /// A send / recv: the direction communicator it runs on (a child of the op's
    /// communicator, see `direction`), also watched for errors and aborts.
    pub side: Option<Arc<Comm>>,
}

/// Shared between a job (which sets it) and the op's completion (which reads it).
pub(crate) struct Ticket(Mutex<Stage>);

impl Ticket {
    pub fn new() -> Arc<Ticket> {
        Arc::new(Ticket(Mutex::new(Stage::Queued)))
    }
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Stage> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn set(&self, s: Stage) {
        *self.lock() = s;
    }
}

/// Header staging buffers of one communicator (used by the progress thread only).
struct SideBufs {
    dev_send: DevMem,
    dev_recv: DevMem,
    host_send: Pinned,
    host_recv: Pinned,
}

/// One communicator as the progress thread sees it.
pub(crate) struct Channel {
    pub comm: Arc<Comm>,
    pub rank: usize,
    pub ws: usize,
    pub op_timeout: Duration,
    /// Injected faults (the world's channel only; see `fault`).
    pub faults: Arc<Faults>,
    side: Mutex<SideBufs>,
    /// Point-to-point: the parked sends / receives by direction and the direction
    /// communicators (see `p2p`, `direction`). Used by the progress thread only.
    p2p: Mutex<(Scheduler<NcclWire, P2pToken>, NcclWire)>,
    /// The store key naming this communicator (its directions' unique ids live under it).
    pub p2p_key: String,
    /// Host shared memory for the validation headers when every rank is on this host (see
    /// `board`); `None`: headers go through NCCL on the stream (`exchange_all`).
    pub board: Option<Arc<Board>>,
}

/// What a parked send / recv hands back with its outcome.
pub(crate) struct P2pToken {
    id: OpId,
    ticket: Option<Arc<Ticket>>,
    /// This rank's own failure (injected before the header), reported after the swap.
    local: Option<CollectiveError>,
}

/// A send or receive handed to the progress thread (see `Job::P2p`).
pub(crate) struct P2pJob {
    pub chan: Arc<Channel>,
    pub id: OpId,
    /// The validation header (`None`: validation is off).
    pub hdr: Option<Header>,
    pub peer: usize,
    pub send: bool,
    /// What moves (`None`: an empty buffer, or the header of a failed op).
    pub data: Option<P2pData>,
    /// `None` for an op that failed locally after issue: only its header (marked failed) goes.
    pub ticket: Option<Arc<Ticket>>,
}

/// The buffer of a send or receive.
pub(crate) struct P2pData {
    pub ptr: u64,
    pub n: usize,
    pub dtype: concord_core::DType,
    pub keep: Vec<Arc<DevMem>>,
}

/// What a split hands a member: its subgroup communicator and, when the parent has one, the
/// subgroup's header board.
pub(crate) type SplitOff = (Comm, Option<Board>);

/// One unit of work for the progress thread.
pub(crate) enum Job {
    /// A collective or point-to-point op. `ticket` is `None` for a header exchange whose only
    /// purpose is to tell the peers about an error this rank already returned at issue.
    Op { chan: Arc<Channel>, id: OpId, check: Check, launch: Option<Launch>, ticket: Option<Arc<Ticket>> },
    /// A send or receive: parked on its direction (see `p2p`); the progress thread goes on.
    P2p(P2pJob),
    /// `new_group`: header agreement (always), then `ncclCommSplit`.
    Split {
        chan: Arc<Channel>,
        id: OpId,
        hdr: Header,
        local: Option<(BadInputKind, String)>,
        member: Option<usize>,
        nranks: usize,
        /// The subgroup's header board, when the parent has one (see `board`).
        board: Option<String>,
        reply: mpsc::Sender<Result<Option<SplitOff>>>,
    },
    /// A communicator's finalize / destroy (see `Comm::set_teardown`), after every job before it.
    Teardown(Teardown),
}

impl Job {
    fn chan(&self) -> Option<&Arc<Channel>> {
        match self {
            Job::Op { chan, .. } | Job::Split { chan, .. } | Job::P2p(P2pJob { chan, .. }) => Some(chan),
            Job::Teardown(_) => None,
        }
    }
    fn id(&self) -> Option<OpId> {
        match self {
            Job::Op { id, .. } | Job::Split { id, .. } | Job::P2p(P2pJob { id, .. }) => Some(*id),
            Job::Teardown(_) => None,
        }
    }

    /// Whether a later `write` (host-to-device copy into a caller's buffer) must wait for this
    /// job: every job but a failure notice, the header exchange of an op that already failed at
    /// issue on this rank (`Job::Op` without a ticket: a dropped `Op` or a rejection), which
    /// launches nothing on the stream and touches no caller's buffer.
    fn orders_writes(&self) -> bool {
        !matches!(self, Job::Op { ticket: None, launch: None, .. })
    }

    /// Marks the job started now (its deadlines count from here).
    fn start(&mut self, now: Instant) {
        match self {
            Job::Op { id, ticket, .. } | Job::P2p(P2pJob { id, ticket, .. }) => {
                id.started = Some(now);
                if let Some(t) = ticket {
                    t.set(Stage::Running(now));
                }
            }
            Job::Split { id, .. } => id.started = Some(now),
            Job::Teardown(_) => {}
        }
    }

    fn run(self, tracker: &Tracker) {
        match self {
            Job::Op { chan, id, check, launch, ticket } => {
                let stage = match chan.run_op(&id, check, launch, tracker, ticket.is_some()) {
                    Ok(Ran::Launched(l)) => Stage::Launched(l),
                    Ok(Ran::Deferred) => {
                        if let Some(t) = ticket {
                            let since = tracker.profile.start();
                            tracker.defer(&chan.comm, t, &id, chan.rank, chan.op_timeout);
                            tracker.profile.add(6, since);
                        }
                        return;
                    }
                    Ok(Ran::Nothing) => Stage::Finished(Ok(())),
                    Err(e) => Stage::Finished(Err(e)),
                };
                if let Some(t) = ticket {
                    t.set(stage);
                }
            }
            Job::Split { chan, id, hdr, local, member, nranks, board, reply } => {
                let _ = reply.send(chan.run_split(&id, hdr, local, member, nranks, board, tracker));
            }
            Job::P2p(j) => {
                let chan = j.chan.clone();
                chan.park(j);
                tracker.activate(&chan);
            }
            Job::Teardown(t) => t.run(),
        }
    }
}

impl Drop for Channel {
    /// A channel dropped while its stream still has work (a header exchange or an op waiting
    /// for a peer that is gone): the communicator is aborted (NCCL's kernels then return), and
    /// the pinned staging is left to the process's end, since `cuMemFreeHost` synchronises with
    /// the device and blocked without a deadline behind such a kernel (seen on 2 x H100: the
    /// autotuner's timeout phase, a rank exiting after its peer had gone, hung in this drop).
    /// Device memory needs nothing: its frees are stream-ordered.
    fn drop(&mut self) {
        // Healthy work still running is given the same grace as a dropped backend's queue.
        let idle = match self.comm.dev.record() {
            Ok(ev) => poll_until(Instant::now() + DROP_GRACE, || matches!(ev.query(), Ok(true)).then_some(())).is_some(),
            Err(_) => false,
        };
        let (sched, wire) = &mut *self.p2p.get_mut().unwrap_or_else(|e| e.into_inner());
        // A direction's stream counts too: `cuMemFreeHost` waits for the whole device.
        if idle && !sched.busy(wire) {
            return;
        }
        if self.comm.aborted().is_none() {
            self.comm.abort("the backend was dropped while its GPU streams still had work (a peer gone?)".into());
        }
        wire.staging.leak();
        let side = self.side.get_mut().unwrap_or_else(|e| e.into_inner());
        side.host_send.leak();
        side.host_recv.leak();
    }
}

impl Channel {
    pub fn new(
        comm: Arc<Comm>,
        op_timeout: Duration,
        faults: Arc<Faults>,
        store: Option<Arc<concord_store::Store>>,
        p2p_key: String,
        via: TeardownVia,
        board: Option<Board>,
    ) -> std::result::Result<Channel, String> {
        let dev = comm.dev.clone();
        let ws = comm.nranks;
        let hbytes = header_len(ws) * 8;
        let side = SideBufs {
            dev_send: dev.alloc(hbytes)?,
            dev_recv: dev.alloc(hbytes * ws.max(2))?,
            host_send: Pinned::new(&dev, hbytes)?,
            host_recv: Pinned::new(&dev, hbytes * ws.max(2))?,
        };
        let staging = Pinned::new(&dev, crate::direction::staging_bytes(ws, hbytes))?;
        let board = board.map(Arc::new);
        let wire = NcclWire {
            board: board.clone(),
            parent: comm.clone(),
            store,
            key: p2p_key.clone(),
            me: comm.rank,
            hdr_bytes: hbytes,
            via: Arc::new(via),
            op_timeout,
            staging,
        };
        let sched = Scheduler::new(comm.rank, op_timeout);
        Ok(Channel {
            rank: comm.rank,
            ws,
            comm,
            op_timeout,
            faults,
            side: Mutex::new(side),
            p2p: Mutex::new((sched, wire)),
            p2p_key,
            board,
        })
    }

    fn dev(&self) -> &Arc<Device> {
        &self.comm.dev
    }

    /// The job's deadline: its start on the progress thread (issue, before it started) plus
    /// the op timeout.
    pub fn deadline(&self, id: &OpId) -> Instant {
        id.started.unwrap_or(id.issued) + self.op_timeout
    }

    pub fn backend_err(&self, id: &OpId, msg: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("nccl {} #{} on rank {}: {msg}", id.name, id.seq, self.rank))
    }

    pub fn bad(&self, id: &OpId, kind: BadInputKind, detail: impl Into<String>) -> CollectiveError {
        CollectiveError::bad_input(kind, id.name, id.seq, self.rank, detail)
    }

    pub fn aborted_err(&self, id: &OpId, why: &str) -> CollectiveError {
        CollectiveError::Aborted(format!(
            "nccl {} #{} on rank {}: the communicator was aborted earlier ({why})",
            id.name, id.seq, self.rank
        ))
    }

    pub fn launch_err(&self, id: &OpId, e: LaunchError) -> CollectiveError {
        match e {
            LaunchError::Aborted(why) => self.aborted_err(id, &why),
            LaunchError::Nccl(msg) => self.backend_err(id, msg),
            LaunchError::Timeout => CollectiveError::Timeout {
                op: id.name.to_string(),
                seq: id.seq,
                rank: self.rank,
                waited_ms: id.issued.elapsed().as_millis() as u64,
                detail: format!(
                    "NCCL did not accept the op before the op deadline of {} ms (a peer is missing?); \
                     communicator aborted; this process is {}",
                    self.op_timeout.as_millis(),
                    progress::describe()
                ),
            },
        }
    }

    /// Waits for this job's header exchange, enqueued on the stream between `before` and
    /// `after`. Its deadline counts from when the stream reached the exchange (`before`
    /// complete), never earlier than the job's deadline: earlier work on the shared stream (a
    /// subgroup's op, a long healthy queue) does not count against it. Earlier launched ops
    /// past their own deadlines get *their* communicators aborted meanwhile (`tracker`), so
    /// the stream moves on; a hard bound of three op timeouts from the job's start ends the
    /// wait in every case. When this wait gives up it aborts this communicator: an abandoned
    /// header exchange left enqueued would pair with the peers' next one. An NCCL error on
    /// this communicator (a peer gone) aborts it and ends the wait early.
    fn wait_header(&self, id: &OpId, tracker: &Tracker, before: &Event, after: &Event) -> Result<()> {
        let start = id.started.unwrap_or(id.issued);
        let cap = start + concord_core::queued_op_backstop(self.op_timeout);
        let mut reached: Option<Instant> = None;
        let mut next_check = Instant::now() + Duration::from_millis(10);
        let outcome = poll_until(cap, || {
            // Parked sends / receives (and those queued behind this job) move on while this
            // collective waits: a peer may need one of them before it issues this collective.
            tracker.service_waiting();
            match after.query() {
                Ok(true) => return Some(Ok(())),
                Err(e) => {
                    // The peers may be past this point: end the communicator rather than leave
                    // them waiting for this rank.
                    self.comm.abort(format!("{} #{}: {e}", id.name, id.seq));
                    return Some(Err(Some(self.backend_err(id, e))));
                }
                Ok(false) => {}
            }
            let now = Instant::now();
            if now < next_check {
                return None;
            }
            next_check = now + Duration::from_millis(10);
            if reached.is_none() && matches!(before.query(), Ok(true)) {
                reached = Some(now);
            }
            match reached {
                None => tracker.enforce(),
                Some(r) if now >= (r + self.op_timeout).max(self.deadline(id)) => return Some(Err(None)),
                Some(_) => {}
            }
            let err = self.comm.async_error()?;
            let why = format!("nccl {} #{} on rank {}: NCCL reported {err}", id.name, id.seq, self.rank);
            self.comm.abort(why.clone());
            Some(Err(Some(CollectiveError::Aborted(format!("{why}; communicator aborted")))))
        });
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(Some(e))) => Err(e),
            Some(Err(None)) | None => {
                let waited_ms = id.issued.elapsed().as_millis() as u64;
                self.comm.abort(format!("{} #{} timed out after {waited_ms} ms", id.name, id.seq));
                let behind = if reached.is_some() {
                    "the peers' validation headers did not arrive (a peer never issued this collective?)"
                } else {
                    "earlier work on the GPU stream never finished"
                };
                Err(CollectiveError::Timeout {
                    op: id.name.to_string(),
                    seq: id.seq,
                    rank: self.rank,
                    waited_ms,
                    detail: format!(
                        "{behind} before the op deadline of {} ms; NCCL communicator aborted; this process is {}",
                        self.op_timeout.as_millis(),
                        progress::describe()
                    ),
                })
            }
        }
    }

    /// Exchanges headers with every rank (all-gather on the side buffers); returns all headers.
    fn exchange_all(&self, id: &OpId, hdr: &Header, tracker: &Tracker) -> Result<Vec<Vec<u64>>> {
        let deadline = self.deadline(id);
        let bytes = hdr.to_bytes();
        let n = bytes.len();
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let side = &mut *side;
        side.host_send.as_mut_slice()[..n].copy_from_slice(&bytes);
        let (send, recv) = (side.dev_send.ptr, side.dev_recv.ptr);
        let before = self.dev().record().map_err(|e| self.backend_err(id, e))?;
        self.dev().htod(send, &side.host_send.as_slice()[..n]).map_err(|e| self.backend_err(id, e))?;
        let stall = self.faults.fires(point::ENQUEUE, Action::Stall, id.nth);
        self.comm
            .launch(deadline, stall, &[], |c, s, _| unsafe {
                check(
                    nccl::ncclAllGather(send as *const c_void, recv as *mut c_void, n, nccl::ncclDataType_t::ncclUint8, c, s),
                    "ncclAllGather (validation header)",
                )
            })
            .map_err(|e| self.launch_err(id, e))?;
        self.dev().dtoh_pinned(&mut side.host_recv.as_mut_slice()[..n * self.ws], recv).map_err(|e| self.backend_err(id, e))?;
        let after = self.dev().record().map_err(|e| self.backend_err(id, e))?;
        self.wait_header(id, tracker, &before, &after)?;
        self.not_aborted(id)?;
        Ok(parse_all(&side.host_recv.as_slice()[..n * self.ws], self.ws))
    }

    /// Exchanges headers through the host board (see `board`): posts this rank's header, then
    /// waits for every rank's, with the job's deadline (the wait does not depend on the GPU, so
    /// this op is validated while earlier ops still run). Meanwhile parked sends / receives move,
    /// earlier launched ops past their deadlines get their communicators aborted, and an NCCL
    /// error or an abort of this communicator ends the wait. Giving up aborts this
    /// communicator (the peers that posted may already be launching the op) and names the
    /// ranks whose headers never came.
    fn exchange_board(&self, b: &Board, id: &OpId, hdr: &Header, tracker: &Tracker) -> Result<Vec<Vec<u64>>> {
        let n = b.post(&hdr.words);
        if !b.ready(n) {
            // Ops launched before this one get their completion event before this thread
            // waits for peers (a peer may wait for one of them before it issues this op).
            tracker.flush();
        }
        let mut next_check = Instant::now() + Duration::from_millis(10);
        let outcome = poll_until(self.deadline(id), || {
            if b.ready(n) {
                return Some(Ok(()));
            }
            tracker.service_waiting();
            let now = Instant::now();
            if now < next_check {
                return None;
            }
            next_check = now + Duration::from_millis(10);
            tracker.enforce();
            if let Some(why) = self.comm.aborted() {
                return Some(Err(self.aborted_err(id, &why)));
            }
            let err = self.comm.async_error()?;
            let why = format!("nccl {} #{} on rank {}: NCCL reported {err}", id.name, id.seq, self.rank);
            self.comm.abort(why.clone());
            Some(Err(CollectiveError::Aborted(format!("{why}; communicator aborted"))))
        });
        match outcome {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => {
                let waited_ms = id.issued.elapsed().as_millis() as u64;
                let missing = b.missing(n);
                self.comm.abort(format!("{} #{} timed out after {waited_ms} ms", id.name, id.seq));
                return Err(CollectiveError::Timeout {
                    op: id.name.to_string(),
                    seq: id.seq,
                    rank: self.rank,
                    waited_ms,
                    detail: format!(
                        "the validation headers of rank(s) {missing:?} did not arrive (never issued this collective?) \
                         before the op deadline of {} ms; NCCL communicator aborted; this process is {}",
                        self.op_timeout.as_millis(),
                        progress::describe()
                    ),
                });
            }
        }
        self.not_aborted(id)?;
        Ok(b.read(n))
    }

    /// Whether every rank of this communicator has queued collective `id` (its issuing thread
    /// published the number on the board, `Board::note_issued`, before queueing it), on a rank
    /// that has never split a subgroup. Then every peer's stream holds, before `id`'s kernel, only
    /// collectives of this communicator that this rank issued too (all ranks issue them in one
    /// order, and a new subgroup is a collective of this communicator, which sets `split_seen`
    /// here before any later op), and every peer's progress thread launches them in order
    /// without waiting for anything but the GPU: `id`'s kernel runs without any further call of
    /// any caller, so the ops batched before it never wait for something a peer does only after
    /// it has seen them complete. No board (ranks on several hosts, `header_board=0`): `false`.
    fn issued_everywhere(&self, id: &OpId, tracker: &Tracker) -> bool {
        !tracker.split_seen.load(Ordering::SeqCst) && self.board.as_ref().is_some_and(|b| b.all_issued(id.cseq))
    }

    /// `Err(Aborted)` once the communicator has been aborted (e.g. by a wait at the op deadline
    /// while this job's headers were in flight: what arrived then is not to be trusted).
    fn not_aborted(&self, id: &OpId) -> Result<()> {
        match self.comm.aborted() {
            Some(why) => Err(self.aborted_err(id, &why)),
            None => Ok(()),
        }
    }

    /// Check, then launch: [`Ran::Launched`] launched with its own completion event,
    /// [`Ran::Deferred`] launched with its event to come (only when `deferrable`: the job has a
    /// ticket for [`Tracker::defer`]), [`Ran::Nothing`] agreed with nothing to launch.
    fn run_op(&self, id: &OpId, check: Check, launch: Option<Launch>, tracker: &Tracker, deferrable: bool) -> Result<Ran> {
        let prof = &tracker.profile;
        let pre = prof.start();
        // Every step that may wait (an injected stall, a header exchange on the stream) comes
        // after the completion events of the ops launched before (see `Tracker::defer`); the
        // board's wait flushes them itself when it has to wait.
        if self.faults.stalls(id.nth) || (matches!(check, Check::All(_)) && self.board.is_none()) {
            tracker.flush();
        }
        // Only an op that every rank has issued may join a batch: its kernel then runs (every
        // peer issued it), so an earlier op of the batch never waits for a later op that a peer
        // issues only after it has waited for the earlier one (a legal program). Known from its
        // header (every rank posted it) or, without validation (`validate=0`), from the ranks'
        // issue counters on the board ([`Channel::issued_everywhere`]); otherwise the op gets
        // its own event (a communicator of one needs neither).
        let agreed = matches!(check, Check::All(_)) || self.ws == 1 || self.issued_everywhere(id, tracker);
        self.not_aborted(id)?;
        // A local failure before the header still sends it (marked failed), so the peers end
        // this op in a named error instead of waiting for it.
        let local = self.fault_point(id, point::BEFORE_HEADER)?;
        match check {
            Check::None => {}
            Check::All(hdr) => {
                let hdr = if local.is_some() { hdr.failed() } else { hdr };
                let all = match &self.board {
                    Some(b) => self.exchange_board(b, id, &hdr, tracker)?,
                    None => self.exchange_all(id, &hdr, tracker)?,
                };
                if let Some(e) = local {
                    return Err(e);
                }
                if let Some(r) = failed_rank(&all) {
                    return Err(self.peer_failed(id, r));
                }
                validate(&all).map_err(|(k, d)| self.bad(id, k, d))?;
            }
        }
        if let Some(e) = local {
            return Err(e);
        }
        if let Some(e) = self.fault_point(id, point::AFTER_HEADER)? {
            return Err(e);
        }
        let Some(Launch { premul, calls, keep, then, local }) = launch else {
            return Ok(Ran::Nothing);
        };
        if self.faults.fires(point::STREAM, Action::Stall, id.nth) {
            self.dev().stall(self.op_timeout * 3 + Duration::from_secs(30)).map_err(|e| self.backend_err(id, e))?;
        }
        if self.faults.fires(point::NO_LAUNCH, Action::Stall, id.nth) {
            // This rank's side is never launched, but the op looks launched here.
            tracker.flush();
            let ev = Arc::new(self.dev().record().map_err(|e| self.backend_err(id, e))?);
            return Ok(Ran::Launched(tracker.push(&self.comm, ev, id, self.op_timeout)));
        }
        let stall = self.faults.fires(point::ENQUEUE, Action::Stall, id.nth);
        // A full op timeout for the enqueue itself, even after a long (healthy) header wait.
        let deadline = self.deadline(id).max(Instant::now() + self.op_timeout);
        // A small op with nothing after its calls may share its completion event with the ops
        // launched next to it (see `Tracker::defer`); any other is launched after their event.
        let defer = batchable(
            deferrable && agreed && tracker.batching.load(Ordering::Relaxed) && !stall,
            then.is_empty(),
            keep.iter().map(|m| m.bytes()).sum(),
        );
        if !defer || !tracker.batch_fits(&self.comm) {
            tracker.flush();
        }
        prof.add(5, pre);
        let t = prof.start();
        match local {
            Some(copies) if !stall => self.copy_local(id, &copies)?,
            _ => self.comm.launch(deadline, stall, &premul, calls).map_err(|e| self.launch_err(id, e))?,
        }
        let keep = self.run_steps(id, &premul, then, keep)?;
        prof.add(1, t);
        if defer {
            if t.is_some() {
                prof.deferred.fetch_add(1, Ordering::Relaxed);
            }
            drop(keep); // enqueued: a free from here on is ordered after the op
            return Ok(Ran::Deferred);
        }
        let t = prof.start();
        let ev = Arc::new(self.dev().record().map_err(|e| self.backend_err(id, e))?);
        prof.add(2, t);
        let t = prof.start();
        let launched = tracker.push(&self.comm, ev, id, self.op_timeout);
        prof.add(3, t);
        drop(keep); // enqueued: a free from here on is ordered after the op
        Ok(Ran::Launched(launched))
    }

    /// A one-rank identity reduction (see [`Launch::local`]): its copies, on the communicator's
    /// stream. Never waits (an enqueue); refused once the communicator is aborted, as a launch is.
    fn copy_local(&self, id: &OpId, copies: &[(u64, u64, usize)]) -> Result<()> {
        self.not_aborted(id)?;
        let stream = self.comm.stream as cudarc::driver::sys::CUstream;
        for &(src, dst, bytes) in copies {
            self.dev().copy_on(stream, dst, src, bytes).map_err(|e| self.backend_err(id, e))?;
        }
        Ok(())
    }

    /// The steps after a launch's first group, in order. A failure part-way aborts the
    /// communicator: the peers may already be inside groups enqueued here, so this rank's
    /// sequence cannot go on (they end the op at its deadline).
    fn run_steps(
        &self,
        id: &OpId,
        premul: &[(nccl::ncclDataType_t, [u8; 8])],
        steps: Vec<Step>,
        keep: Vec<Arc<DevMem>>,
    ) -> Result<Vec<Arc<DevMem>>> {
        for step in steps {
            let r = match step {
                Step::Nccl(calls) => {
                    self.comm.launch(Instant::now() + self.op_timeout, false, premul, calls).map_err(|e| self.launch_err(id, e))
                }
                Step::Device(f) => f(self.dev().stream).map_err(|e| self.backend_err(id, e)),
            };
            if let Err(e) = r {
                if self.comm.aborted().is_none() {
                    self.comm.abort(format!("{} #{} failed part-way through its launch: {e}", id.name, id.seq));
                }
                // Device steps may have left matmuls on the compute stream that read or write
                // the launch's memory: the frees that follow (ordered on this stream) wait for
                // them. If even that fails, the launch's own memory is kept for the process's
                // life (the caller's buffers are its own: the warning says so).
                if let Err(j) = crate::fused_gpu::join_compute(self.dev()) {
                    eprintln!(
                        "concord: warning: {} #{}: {j}; its staging is never freed, and its matmuls may still touch the caller's buffers",
                        id.name, id.seq
                    );
                    std::mem::forget(keep);
                }
                return Err(e);
            }
        }
        Ok(keep)
    }

    /// Fault injection at `at` (before / after the header): `die` ends the process; `stall`
    /// holds the op until its deadline or an abort, then `Err`; `fail` is `Ok(Some(error))`, a
    /// local failure for the caller to report (after sending its header, when it has one).
    fn fault_point(&self, id: &OpId, at: &str) -> Result<Option<CollectiveError>> {
        self.faults.maybe_die(at, id.nth);
        if self.faults.fires(at, Action::Stall, id.nth) {
            let _ = poll_until(self.deadline(id), || self.comm.aborted().map(|_| ()));
            // A rank that gave up here never made this op's exchange (or launch): its sequence
            // is out of step with its peers', so the communicator ends with it.
            if self.comm.aborted().is_none() {
                self.comm.abort(format!("{} #{}: injected fault {at}:stall", id.name, id.seq));
            }
            return Err(self.backend_err(id, format!("injected fault {at}:stall held the op until its deadline or an abort")));
        }
        if self.faults.fires(at, Action::Fail, id.nth) {
            return Ok(Some(self.backend_err(id, format!("injected fault {at}:fail (a simulated local failure)"))));
        }
        Ok(None)
    }

    /// The error of an op whose peer `r` failed its side locally (its header said so).
    fn peer_failed(&self, id: &OpId, r: usize) -> CollectiveError {
        self.backend_err(
            id,
            format!("rank {r} failed its side of this op locally after issuing it (see rank {r}'s error); nothing was launched"),
        )
    }

    /// Parks a send / recv on its direction (see `p2p`): checks and the fault hook before the
    /// header; never waits for the peer.
    fn park(&self, j: P2pJob) {
        let P2pJob { id, hdr, peer, send, data, ticket, .. } = j;
        let fail = |e: CollectiveError| {
            if let Some(t) = &ticket {
                t.set(Stage::Finished(Err(e)));
            }
        };
        if let Err(e) = self.not_aborted(&id) {
            return fail(e);
        }
        let local = match self.fault_point(&id, point::BEFORE_HEADER) {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        // The header of an op that failed locally after issue (no ticket) says so.
        let failed = local.is_some() || ticket.is_none();
        // Padded: both sides of a swap move the same, fixed number of bytes.
        let hdr = hdr.map(|h| if failed { h.failed().padded() } else { h.padded() });
        let data = data.filter(|_| !failed).map(|d| Data { send, ptr: d.ptr, n: d.n, dtype: d.dtype, keep: d.keep });
        let op = Parked {
            hdr,
            peer,
            send,
            local: failed.then(|| local.as_ref().map_or_else(|| "failed locally after issue".to_string(), |e| e.to_string())),
            payload: data,
            started: id.started.unwrap_or(id.issued),
            token: P2pToken { id, ticket, local },
        };
        self.p2p.lock().unwrap_or_else(|e| e.into_inner()).0.park(op);
    }

    /// Advances this communicator's parked sends / receives without waiting (see `p2p`) and
    /// reports what settled to their tickets; `true` while something is left to do.
    fn service_p2p(&self) -> bool {
        let mut g = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let (sched, wire) = &mut *g;
        let mut settled = Vec::new();
        if let Some(why) = self.comm.aborted() {
            settled = sched.fail_all(&why);
        }
        let polled = sched.poll(wire, Instant::now());
        settled.extend(polled.settled);
        if let Some(why) = &polled.abort {
            // An abandoned header swap would pair with the peer's next one: end the
            // communicator (its directions with it), as a collective's header timeout does.
            self.comm.abort(format!("send/recv: {why}"));
        }
        let busy = sched.busy(wire);
        drop(g);
        for (tok, outcome) in settled {
            self.settle(tok, outcome, polled.abort.is_some());
        }
        busy
    }

    fn settle(&self, tok: P2pToken, outcome: Outcome<Launched>, aborted_now: bool) {
        let P2pToken { id, ticket, local } = tok;
        let Some(ticket) = ticket else { return };
        let stage = match outcome {
            Outcome::Launched(l) => Stage::Launched(l),
            Outcome::Agreed => Stage::Finished(Ok(())),
            Outcome::Failed(f) => Stage::Finished(Err(match f {
                Failure::Bad(k, d) => self.bad(&id, k, d),
                Failure::PeerFailed(r) => self.peer_failed(&id, r),
                Failure::PeerGaveUp(r) => CollectiveError::Aborted(format!(
                    "nccl {} #{} on rank {}: rank {r} gave up on send/recv with this rank before this op could pair (an op of its side \
                     timed out or its transport failed){}",
                    id.name,
                    id.seq,
                    self.rank,
                    if aborted_now { "; NCCL communicator aborted" } else { "" }
                )),
                Failure::Local(m) => local.unwrap_or_else(|| self.backend_err(&id, m)),
                Failure::Timeout { what, waited } => CollectiveError::Timeout {
                    op: id.name.to_string(),
                    seq: id.seq,
                    rank: self.rank,
                    waited_ms: waited.as_millis() as u64,
                    detail: format!(
                        "{what} did not arrive before the op deadline of {} ms{}; this process is {}",
                        self.op_timeout.as_millis(),
                        if aborted_now { "; NCCL communicator aborted" } else { "" },
                        progress::describe()
                    ),
                },
                Failure::Wire(m) => {
                    CollectiveError::Aborted(format!("nccl {} #{} on rank {}: {m}; NCCL communicator aborted", id.name, id.seq, self.rank))
                }
                Failure::Aborted(why) => self.aborted_err(&id, &why),
            })),
        };
        ticket.set(stage);
    }

    /// `new_group`: the headers take the ops' path (board or NCCL), so a `new_group` facing
    /// another collective is one named error on every rank. The split runs after every earlier
    /// collective of this rank has finished on the GPU (as with headers through NCCL on the
    /// stream; with a board, a bounded wait for the stream first; sends / receives run on
    /// their directions' streams and are not waited for). A member whose subgroup board
    /// (`board`: its name) cannot be opened sends its header marked failed, so every rank fails
    /// the split, naming it; the board is unlinked once the exchange shows every member has
    /// mapped it.
    #[allow(clippy::too_many_arguments)]
    fn run_split(
        &self,
        id: &OpId,
        hdr: Header,
        local: Option<(BadInputKind, String)>,
        member: Option<usize>,
        nranks: usize,
        board: Option<String>,
        tracker: &Tracker,
    ) -> Result<Option<SplitOff>> {
        tracker.split_seen.store(true, Ordering::SeqCst);
        self.not_aborted(id)?;
        // Not for a call already refused at issue (its member list may be anything).
        let sub_board = match (&board, member, &local) {
            (Some(name), Some(m), None) => Some(Board::open_or_create(name, nranks, m, header_len(nranks))),
            _ => None,
        };
        let hdr = if matches!(sub_board, Some(Err(_))) { hdr.failed() } else { hdr };
        let all = match &self.board {
            Some(b) => self.exchange_board(b, id, &hdr, tracker)?,
            None => self.exchange_all(id, &hdr, tracker)?,
        };
        let sub_board = match sub_board {
            Some(Err(e)) => return Err(self.backend_err(id, format!("the subgroup's validation board: {e}"))),
            Some(Ok(b)) => {
                b.unlink();
                Some(b)
            }
            None => None,
        };
        if let Some(r) = failed_rank(&all) {
            return Err(self.peer_failed(id, r));
        }
        if let Err((kind, detail)) = validate(&all) {
            let detail = match local {
                Some((k, mine)) if k == kind => mine,
                _ => detail,
            };
            return Err(self.bad(id, kind, detail));
        }
        if self.board.is_some() {
            // Earlier ops first, bounded as a header wait behind the stream is.
            let drained = self.dev().record().map_err(|e| self.backend_err(id, e))?;
            self.wait_header(id, tracker, &drained, &drained)?;
            self.not_aborted(id)?;
        }
        let started = Instant::now();
        // `ncclCommSplit` sets the child communicator up: NCCL's init time, not an op's.
        let sub = self
            .comm
            .split(member.is_some(), member.unwrap_or(0), nranks, started + self.op_timeout.max(Duration::from_secs(30)))
            .map_err(|e| self.launch_err(id, e))?;
        Ok(sub.map(|c| (c, sub_board)))
    }
}

/// `Ok` for success / in progress, else the call's name and NCCL result.
pub(crate) fn check(r: nccl::ncclResult_t, what: &str) -> std::result::Result<(), (String, nccl::ncclResult_t)> {
    match r {
        nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => Ok(()),
        e => Err((what.to_string(), e)),
    }
}

/// The ops launched on this rank's stream (every communicator of the rank), oldest first. The
/// stream runs them in order, so only the oldest pending one is running; its deadline counts
/// from when it became the oldest (the stream reached it), so a long healthy queue never
/// times out. Whoever waits behind it (a header wait on the progress thread, a waiter of a
/// later op) calls [`Tracker::enforce`], which aborts *its* communicator once it is overdue:
/// the stream moves on, and the waiting op's own communicator is left alone.
pub(crate) struct Tracker {
    /// Locked by the progress thread on every launch: away from the `Arc`'s counts, which
    /// every issue (a completion's handle on the tracker) changes.
    launched: Padded<Mutex<VecDeque<Tracked>>>,
    /// Communicators with parked sends / receives (see `p2p`), serviced by the progress thread
    /// between jobs, while idle and inside its waits ([`Tracker::service`]).
    active: Mutex<Vec<Arc<Channel>>>,
    any_active: AtomicBool,
    /// The progress thread's queue, for [`Tracker::service_waiting`]'s look-ahead.
    queue: std::sync::OnceLock<std::sync::Weak<Shared>>,
    pub profile: Profile,
    /// When [`Tracker::push`] last pruned, in nanoseconds since `born` (read and written under
    /// the `launched` lock: one lock per push, not two).
    last_prune: AtomicU64,
    born: Instant,
    /// Ops launched whose completion event is still to be recorded (see [`Tracker::defer`]).
    batch: Padded<Mutex<Batch>>,
    /// Whether `batch` holds any op (read without its lock by the worker loop and the watchdog).
    batched: AtomicBool,
    /// Whether small ops share completion events (backend option `batch=0`: one event per op;
    /// set at the world's `init`, shared by its subgroups).
    pub batching: AtomicBool,
    /// Whether this rank has run a subgroup split (set by the progress thread, in queue order,
    /// never cleared): from then on the issue counters no longer let unvalidated ops batch (see
    /// [`Channel::issued_everywhere`]).
    split_seen: AtomicBool,
}

/// Whether an op just launched may leave its completion event to its batch (see
/// [`Tracker::defer`]): `allowed` (a job with a ticket, batching on, no injected enqueue stall), no
/// steps after its calls (`last`), and at most [`BATCH_MAX_BYTES`] in the buffers it keeps
/// (`kept`, bytes).
fn batchable(allowed: bool, last: bool, kept: usize) -> bool {
    allowed && last && kept <= BATCH_MAX_BYTES
}

/// The most ops sharing one completion event (see [`Tracker::defer`]).
const BATCH_MAX: usize = 16;

/// The largest op (bytes of the buffers its launch keeps) that may share a completion event: the
/// stream runs a batch's ops under one deadline, counted from when it reaches the first.
pub(crate) const BATCH_MAX_BYTES: usize = 1 << 20;

/// How long a batch may wait for its event before the watchdog records it (the progress thread
/// stuck inside a launch that waits for something).
const BATCH_MAX_AGE: Duration = Duration::from_millis(2);

/// Launched ops of one communicator whose completion event is still to be recorded.
#[derive(Default)]
struct Batch {
    comm: Option<Arc<Comm>>,
    /// Each op's ticket, name, sequence number and rank.
    ops: Vec<(Arc<Ticket>, &'static str, u64, usize)>,
    /// When its first op was enqueued.
    at: Option<Instant>,
    timeout: Duration,
}

/// Where the progress thread's time goes, per job (off unless a benchmark turns it on:
/// [`crate::NcclBackend::profile_progress`]). Sections: `nccl` inside the launch's NCCL group
/// calls, `event` recording the op's CUDA event, `track` the launched-op bookkeeping; `job` is
/// the whole job from taking it off the queue to counting it finished. Within `job`, besides
/// those (gpulat8): `take` marking it started (its ticket, the watchdog's `current`), `pre`
/// `run_op` up to the launch (faults, the board's issue counters, the batch's checks, a header
/// exchange when validating), `defer` handing a batched op's ticket to its batch, `after` the
/// bookkeeping once it ran (the queue's count, the flush when nothing is queued behind); the
/// rest of `job` is the job's own drop and dispatch. gpulat12: `run` is the whole of
/// `Job::run` (so `run` less `pre`, `nccl`, `event`, `track` and `defer` is what the job's run
/// does besides them: the launch's drop among it), and `gap` is *outside* `job`: from one job's
/// end to the next one's start when that one was already queued at the end (the loop's top, its
/// look at the queue's count, the queue's lock and pop), so the progress thread's time per op
/// in a backlog is `job` + `gap`. Each section boundary reads the clock, so the probe adds its
/// own cost to `job`.
#[derive(Default)]
pub(crate) struct Profile {
    pub on: AtomicBool,
    /// Nanoseconds per section of [`PROFILE_SECTIONS`].
    ns: [AtomicU64; PROFILE_SECTIONS.len()],
    jobs: AtomicU64,
    /// Ops that left their completion event to their batch ([`Tracker::defer`]).
    deferred: AtomicU64,
}

/// The sections of [`Profile`], in its order.
pub const PROFILE_SECTIONS: [&str; 10] = ["job", "nccl", "event", "track", "take", "pre", "defer", "after", "run", "gap"];

impl Profile {
    fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Relaxed).then(Instant::now)
    }
    fn add(&self, section: usize, since: Option<Instant>) {
        if let Some(t) = since {
            self.ns[section].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
    /// Mean microseconds per job of each section since the last call, then `batched`: the
    /// share of jobs whose op left its completion event to its batch; then zeroes.
    pub fn take(&self) -> Vec<(&'static str, f64)> {
        let jobs = self.jobs.swap(0, Ordering::Relaxed).max(1) as f64;
        let mut out: Vec<(&'static str, f64)> =
            PROFILE_SECTIONS.iter().zip(&self.ns).map(|(n, a)| (*n, a.swap(0, Ordering::Relaxed) as f64 / 1e3 / jobs)).collect();
        out.push(("batched_share", self.deferred.swap(0, Ordering::Relaxed) as f64 / jobs));
        out
    }
}

/// How long [`Tracker::push`] goes at most without dropping the completed ones.
const PRUNE_EVERY: Duration = Duration::from_micros(500);

struct Tracked {
    comm: std::sync::Weak<Comm>,
    ev: Arc<Event>,
    name: &'static str,
    seq: u64,
    timeout: Duration,
    /// When it was first seen the oldest pending op.
    reached: Option<Instant>,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            launched: Padded(Mutex::new(VecDeque::new())),
            active: Mutex::new(Vec::new()),
            any_active: AtomicBool::new(false),
            queue: std::sync::OnceLock::new(),
            profile: Profile::default(),
            last_prune: AtomicU64::new(0),
            born: Instant::now(),
            batch: Padded(Mutex::new(Batch::default())),
            batched: AtomicBool::new(false),
            batching: AtomicBool::new(true),
            split_seen: AtomicBool::new(false),
        }
    }

    /// Whether an op of `comm` may join the batch (empty, or of the same communicator).
    fn batch_fits(&self, comm: &Arc<Comm>) -> bool {
        if !self.batched.load(Ordering::SeqCst) {
            return true;
        }
        let b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        b.comm.as_ref().is_none_or(|c| Arc::ptr_eq(c, comm))
    }

    /// An op just enqueued on `comm`'s stream (nothing after it yet but, maybe, ops of the same
    /// batch) whose completion event is left to [`Tracker::flush`]: one event recorded after
    /// the batch's last op completes every op of the batch. An event after an op completes once
    /// the stream is past it, so each op still completes in issue order, never before its own
    /// work; it is only observed complete a little later (up to the ops launched after it in the
    /// batch). The progress thread flushes when its queue is empty, when the batch is full, before
    /// any job or step that may wait (a header wait, a fault, another communicator, a send /
    /// recv, a split, a teardown, an op that is not batched), and the watchdog flushes a batch
    /// older than [`BATCH_MAX_AGE`] (a launch stuck inside NCCL): a wait on a batched op never
    /// depends on a later op's launch. It depends on the later ops of its batch running, so only
    /// ops that every rank issued join one (`run_op`'s `agreed`: every rank posted its header, or,
    /// without validation, every rank's issue counter on the board has passed it, see
    /// [`Channel::issued_everywhere`]). A peer that fails after issuing a later op fails the
    /// earlier ops of its batch with it (in flight together; never reported `Ok` here, though the
    /// peer may have reported them `Ok`: a failure reported where none happened, never the
    /// reverse). With validation that is a peer failing after its header; without it (`validate=0`)
    /// any local failure of the peer's later op (an injected fault, a launch error, an abort
    /// before it launched), which is one reason the suites run with validation. Until the flush
    /// the op's ticket stays `Running` (its completion waits, bounded by the job's backstop, as
    /// for any op in its job).
    fn defer(&self, comm: &Arc<Comm>, ticket: Arc<Ticket>, id: &OpId, rank: usize, timeout: Duration) {
        let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if b.comm.as_ref().is_some_and(|c| !Arc::ptr_eq(c, comm)) {
            self.flush_locked(&mut b);
        }
        if b.ops.is_empty() {
            b.comm = Some(comm.clone());
            b.at = Some(Instant::now());
            b.timeout = timeout;
        }
        b.ops.push((ticket, id.name, id.seq, rank));
        self.batched.store(true, Ordering::SeqCst);
        if b.ops.len() >= BATCH_MAX {
            self.flush_locked(&mut b);
        }
    }

    /// Records the batch's completion event (see [`Tracker::defer`]) and hands it to every op
    /// of the batch. Progress thread, or the watchdog's flusher thread.
    pub fn flush(&self) {
        self.flush_older(Duration::ZERO);
    }

    /// Whether a batch older than `age` waits for its event; `false` while another thread holds
    /// the batch (never blocks: the watchdog asks).
    fn batch_older(&self, age: Duration) -> bool {
        self.batched.load(Ordering::SeqCst) && self.batch.try_lock().is_ok_and(|b| b.at.is_some_and(|a| a.elapsed() >= age))
    }

    /// [`Tracker::flush`] if the batch is older than `age`.
    fn flush_older(&self, age: Duration) {
        if !self.batched.load(Ordering::SeqCst) {
            return;
        }
        let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if b.at.is_some_and(|a| a.elapsed() >= age) {
            self.flush_locked(&mut b);
        }
    }

    /// `batched` is cleared last, under the batch's lock: a `flush` on another thread meanwhile
    /// waits for this record, so the launched list keeps the stream's order.
    fn flush_locked(&self, b: &mut Batch) {
        self.flush_ops(b);
        self.batched.store(false, Ordering::SeqCst);
    }

    fn flush_ops(&self, b: &mut Batch) {
        let ops = std::mem::take(&mut b.ops);
        let (Some(comm), Some(at)) = (b.comm.take(), b.at.take()) else { return };
        let Some(&(_, name, seq, _)) = ops.first() else { return };
        let t = self.profile.start();
        let ev = comm.dev.record();
        self.profile.add(2, t);
        match ev {
            Ok(ev) => {
                let t = self.profile.start();
                let l = self.push_at(&comm, Arc::new(ev), name, seq, b.timeout, at);
                self.profile.add(3, t);
                for (ticket, ..) in ops {
                    ticket.set(Stage::Launched(Launched { ev: l.ev.clone(), at: l.at, behind: l.behind.clone(), side: None }));
                }
            }
            Err(e) => {
                for (ticket, name, seq, rank) in ops {
                    ticket.set(Stage::Finished(Err(CollectiveError::Backend(format!("nccl {name} #{seq} on rank {rank}: {e}")))));
                }
            }
        }
    }

    /// [`Tracker::service`] for a wait of the progress thread (a collective's header exchange):
    /// first parks every send / recv queued behind the waiting job (in queue order, so each
    /// direction keeps its issue order; nothing else is taken), so that `all_reduce; isend(1)`
    /// on rank 0 against `irecv(0); wait; all_reduce` on rank 1 completes: rank 1 issues its
    /// all_reduce only once rank 0's send, queued behind rank 0's all_reduce, has moved.
    fn service_waiting(&self) -> bool {
        if let Some(sh) = self.queue.get().and_then(|w| w.upgrade()) {
            let is_p2p = |j: &Job| matches!(j, Job::P2p(_));
            let ahead: Vec<Job> = {
                let mut q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
                if q.jobs.iter().any(is_p2p) {
                    let (p2p, rest): (VecDeque<Job>, VecDeque<Job>) = q.jobs.drain(..).partition(is_p2p);
                    q.jobs = rest;
                    p2p.into()
                } else {
                    Vec::new()
                }
            };
            sh.taken_ahead.fetch_add(ahead.len() as u64, Ordering::SeqCst);
            for mut j in ahead {
                j.start(Instant::now());
                j.run(self); // parks it (counted as finished, like any parked send / recv)
                sh.finished.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.service()
    }

    /// Marks `chan` as having parked sends / receives.
    fn activate(&self, chan: &Arc<Channel>) {
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if !a.iter().any(|c| Arc::ptr_eq(c, chan)) {
            a.push(chan.clone());
        }
        self.any_active.store(true, Ordering::SeqCst);
        drop(a);
        self.service();
    }

    /// Advances every parked send / receive (progress thread only: it makes NCCL calls);
    /// `true` while some are left.
    pub fn service(&self) -> bool {
        if !self.any_active.load(Ordering::SeqCst) {
            return false;
        }
        let chans = self.active.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let idle: Vec<Arc<Channel>> = chans.into_iter().filter(|c| !c.service_p2p()).collect();
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        a.retain(|c| !idle.iter().any(|i| Arc::ptr_eq(c, i)));
        let any = !a.is_empty();
        self.any_active.store(any, Ordering::SeqCst);
        any
    }

    /// The backend is gone and parked sends / receives still wait for their peers: aborts
    /// their communicators (they fail with the abort) and forgets them.
    fn give_up(&self, why: &str) {
        let chans = std::mem::take(&mut *self.active.lock().unwrap_or_else(|e| e.into_inner()));
        for c in &chans {
            if c.comm.aborted().is_none() {
                c.comm.abort(why.to_string());
            }
            c.service_p2p();
        }
        self.any_active.store(false, Ordering::SeqCst);
    }

    /// Drops the completed ops at the front and notes when the new front was reached.
    fn prune(l: &mut VecDeque<Tracked>) {
        // Every tracked event is on the rank's one stream, so they complete in order: the
        // first pending one is found by bisection (a few event queries instead of one per op).
        let done = |t: &Tracked| !matches!(t.ev.query(), Ok(false));
        match l.back() {
            None => return,
            Some(t) if done(t) => l.clear(),
            Some(_) => {
                let (mut lo, mut hi) = (0, l.len() - 1); // `hi` is pending
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if done(&l[mid]) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                l.drain(..lo);
            }
        }
        if let Some(t) = l.front_mut() {
            t.reached.get_or_insert_with(Instant::now);
        }
    }

    /// Records an op just enqueued (`ev` after it); its [`Launched`] names the op before it.
    fn push(&self, comm: &Arc<Comm>, ev: Arc<Event>, id: &OpId, timeout: Duration) -> Launched {
        self.push_at(comm, ev, id.name, id.seq, timeout, Instant::now())
    }

    /// [`Tracker::push`] of the op (or first op of a batch) `name #seq`, enqueued at `at`.
    fn push_at(&self, comm: &Arc<Comm>, ev: Arc<Event>, name: &'static str, seq: u64, timeout: Duration, at: Instant) -> Launched {
        let mut l = self.launched.lock().unwrap_or_else(|e| e.into_inner());
        // Pruning queries events (about a microsecond each, and one at least whenever the GPU
        // is behind): on a long backlog of small ops it was a sixth of a launch. Every
        // [`Tracker::enforce`] prunes (that is where a front op's deadline is looked at); here
        // at most every `PRUNE_EVERY` (the list only holds what launched meanwhile), so
        // `behind` may name an op that has just completed (its waiter then finds the stream
        // reached when it first looks).
        let now = Instant::now();
        let now_ns = now.duration_since(self.born).as_nanos() as u64;
        if now_ns.saturating_sub(self.last_prune.load(Ordering::Relaxed)) >= PRUNE_EVERY.as_nanos() as u64 {
            self.last_prune.store(now_ns, Ordering::Relaxed);
            Self::prune(&mut l);
        }
        let behind = l.back().map(|t| t.ev.clone());
        let reached = behind.is_none().then_some(at);
        l.push_back(Tracked { comm: Arc::downgrade(comm), ev: ev.clone(), name, seq, timeout, reached });
        Launched { ev, at, behind, side: None }
    }

    /// Aborts the communicator of the running (oldest pending) op once it is past its deadline.
    pub fn enforce(&self) {
        let due = {
            let mut l = self.launched.lock().unwrap_or_else(|e| e.into_inner());
            Self::prune(&mut l);
            match l.front() {
                Some(t) if t.reached.is_some_and(|r| r.elapsed() >= t.timeout) => l.pop_front(),
                _ => None,
            }
        };
        let Some(t) = due else { return };
        if let Some(c) = t.comm.upgrade() {
            if c.aborted().is_none() {
                c.abort(format!(
                    "{} #{} was still running on the GPU past its op deadline (found by an op waiting behind it)",
                    t.name, t.seq
                ));
            }
        }
    }
}

struct QState {
    jobs: VecDeque<Job>,
    /// The progress thread is (about to be) asleep on `cv`: set and cleared by it under the
    /// lock, so [`Progress::submit`] wakes it only then (a spinning or busy thread looks at
    /// the queue by itself; a notify is a system call on the issuing thread for every op).
    waiting: bool,
    closed: bool,
    /// Set by the thread, under the lock, when it stops taking jobs.
    stopped: bool,
}

/// What the running job is: its communicator, op and start, for a bounded teardown.
type Current = Option<(Arc<Comm>, OpId, Instant)>;

struct Shared {
    /// The queue and its count of submitted jobs: written by the issuing threads.
    q: Padded<Mutex<QState>>,
    cv: Condvar,
    /// Jobs submitted / finished so far.
    queued: AtomicU64,
    /// The number of jobs submitted up to the last one a later `write` is ordered after: every
    /// job but a failure notice (`Job::Op` without a ticket, which launches nothing: see
    /// [`Job::orders_writes`]). Written under the queue's lock, so it only grows.
    ordering: AtomicU64,
    /// Written by the progress thread after every job; read by waiters (`flush`, `mark`).
    finished: Padded<AtomicU64>,
    /// The progress thread's and its watchdog's only.
    current: Padded<Mutex<Current>>,
    exited: AtomicBool,
    tracker: Arc<Tracker>,
    /// Jobs taken out of the queue by [`Tracker::service_waiting`]'s look-ahead.
    taken_ahead: AtomicU64,
}

/// A rank's progress thread and its FIFO queue (shared by the world backend and its subgroups).
pub(crate) struct Progress {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Progress {
    /// Starts the thread (and its watchdog); with `cpu`, the progress thread runs on that CPU
    /// only (backend option `progress_pin`).
    pub fn start(dev: Arc<Device>, cpu: Option<usize>) -> std::result::Result<Arc<Progress>, String> {
        let shared = Arc::new(Shared {
            q: Padded(Mutex::new(QState { jobs: VecDeque::new(), waiting: false, closed: false, stopped: false })),
            cv: Condvar::new(),
            queued: AtomicU64::new(0),
            ordering: AtomicU64::new(0),
            finished: Padded(AtomicU64::new(0)),
            current: Padded(Mutex::new(None)),
            exited: AtomicBool::new(false),
            tracker: Arc::new(Tracker::new()),
            taken_ahead: AtomicU64::new(0),
        });
        let _ = shared.tracker.queue.set(Arc::downgrade(&shared));
        let ordinal = dev.ordinal;
        // The watchdog first: it ends once the progress thread has (or, here, never started).
        let sh = shared.clone();
        let wdev = dev.clone();
        std::thread::Builder::new()
            .name(format!("nccl-watchdog-gpu{ordinal}"))
            .spawn(move || watchdog(sh, wdev))
            .map_err(|e| format!("starting the NCCL watchdog thread: {e}"))?;
        let sh = shared.clone();
        let thread =
            std::thread::Builder::new().name(format!("nccl-progress-gpu{ordinal}")).spawn(move || worker(sh, dev)).map_err(|e| {
                shared.exited.store(true, Ordering::SeqCst);
                format!("starting the NCCL progress thread: {e}")
            })?;
        let progress = Arc::new(Progress { shared, thread: Mutex::new(Some(thread)) });
        if let Some(c) = cpu {
            use std::os::unix::thread::JoinHandleExt;
            let t = progress.thread.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|h| h.as_pthread_t());
            // On an error the progress thread (dropped with `progress`) ends as at any drop.
            if let Some(t) = t {
                crate::pin::pin_thread(t, c).map_err(|e| format!("pinning the NCCL progress thread (option progress_pin): {e}"))?;
            }
        }
        Ok(progress)
    }

    /// The launched-op tracker of this rank's stream (see [`Tracker`]).
    pub fn tracker(&self) -> Arc<Tracker> {
        self.shared.tracker.clone()
    }

    /// Queues `job` behind every job submitted before it.
    pub fn submit(&self, job: Job) {
        let orders = job.orders_writes();
        let mut q = self.shared.q.lock().unwrap_or_else(|e| e.into_inner());
        q.jobs.push_back(job);
        let n = self.shared.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if orders {
            self.shared.ordering.store(n, Ordering::SeqCst);
        }
        let asleep = q.waiting;
        drop(q);
        if asleep {
            self.shared.cv.notify_one();
        }
    }

    /// How a communicator of this rank hands its teardown to this thread (queued behind every
    /// job submitted before; run where it is once the thread has stopped).
    pub fn teardown_via(&self) -> TeardownVia {
        let sh = Arc::downgrade(&self.shared);
        Box::new(move |t| {
            let Some(sh) = sh.upgrade() else { return Err(t) };
            let mut q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
            if q.stopped {
                return Err(t);
            }
            q.jobs.push_back(Job::Teardown(t));
            let n = sh.queued.fetch_add(1, Ordering::SeqCst) + 1;
            sh.ordering.store(n, Ordering::SeqCst);
            drop(q);
            sh.cv.notify_one();
            Ok(())
        })
    }

    /// The number of jobs submitted so far (for [`Progress::launched_up_to`]).
    pub fn submitted(&self) -> u64 {
        self.shared.queued.load(Ordering::SeqCst)
    }

    /// Whether the first `n` jobs submitted have finished (launched or failed). One atomic load:
    /// for a caller that spins.
    pub fn launched_up_to(&self, n: u64) -> bool {
        self.shared.finished.load(Ordering::Acquire) >= n
    }

    /// Waits until every job submitted so far has finished (launched or failed), or until
    /// `deadline`: `true` when they have.
    pub fn flush(&self, deadline: Instant) -> bool {
        let target = self.shared.queued.load(Ordering::SeqCst);
        poll_until(deadline, || (self.shared.finished.load(Ordering::SeqCst) >= target).then_some(())).is_some()
    }

    /// Waits until every job submitted so far that a `write` is ordered after has finished
    /// (launched or failed), or until no job has finished for `stalled`: `true` when they have.
    /// Failure notices at the queue's tail (see [`Job::orders_writes`]) are not waited for: they
    /// launch nothing, and one waits for the peers to issue its op, which a peer may do only
    /// after this rank has written its buffers (`faults::alloc_fails_at_issue::*`: the rank
    /// whose output allocation failed rewrites its input before telling its peers).
    pub fn flush_while_progressing(&self, stalled: Duration) -> bool {
        let target = self.shared.ordering.load(Ordering::SeqCst);
        let mut last = self.shared.finished.load(Ordering::SeqCst);
        let mut since = Instant::now();
        loop {
            let step = poll_until(since + stalled, || {
                let f = self.shared.finished.load(Ordering::SeqCst);
                (f >= target || f != last).then_some(f)
            });
            match step {
                Some(f) if f >= target => return true,
                Some(f) => (last, since) = (f, Instant::now()),
                None => return false,
            }
        }
    }
}

/// How often the watchdog looks at the progress thread.
const WATCH_EVERY: Duration = Duration::from_millis(2);

/// The progress thread's watchdog (one per progress thread; ends when it does): a job whose
/// launch is inside a blocking NCCL call on its communicator's twin past the call's deadline
/// (`Comm::twin_overdue`: a first launch waiting for an absent peer's connection, or a launch
/// waiting for room in a queue behind a kernel that never ends) gets its communicator aborted
/// from here, which ends the call; the launch then fails with a named timeout.
///
/// It also has the completion event of a batch of launched ops older than [`BATCH_MAX_AGE`]
/// recorded (see [`Tracker::defer`]), on a short-lived thread so that a record blocked behind a
/// full device queue never holds the abort: the progress thread stuck inside a later op's launch
/// (a lazy connection waiting for a peer, say) must not hold the earlier ops' completion.
fn watchdog(sh: Arc<Shared>, dev: Arc<Device>) {
    let bound = dev.bind().is_ok();
    // Whether a flusher thread (below) is out.
    let flushing = Arc::new(AtomicBool::new(false));
    while !sh.exited.load(Ordering::SeqCst) {
        std::thread::sleep(WATCH_EVERY);
        let cur = sh.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((comm, id, _)) = cur {
            if comm.twin_overdue() {
                comm.abort(format!(
                    "{} #{}: its launch was still inside NCCL at its deadline (a peer that never joined?); ended by the watchdog",
                    id.name, id.seq
                ));
            }
        }
        // An old batch's event is recorded on a thread of its own: recording can block behind a
        // full device queue (the very launch this thread may have to abort), and the abort above
        // must never wait for it. One flusher at a time; the look at the batch never blocks.
        if bound && !flushing.load(Ordering::SeqCst) && sh.tracker.batch_older(BATCH_MAX_AGE) {
            flushing.store(true, Ordering::SeqCst);
            let (sh2, dev2, done) = (sh.clone(), dev.clone(), flushing.clone());
            let spawned = std::thread::Builder::new().name("nccl-batch-flush".into()).spawn(move || {
                if dev2.bind().is_ok() {
                    sh2.tracker.flush_older(BATCH_MAX_AGE);
                }
                done.store(false, Ordering::SeqCst);
            });
            if spawned.is_err() {
                flushing.store(false, Ordering::SeqCst);
            }
        }
    }
}

fn worker(sh: Arc<Shared>, dev: Arc<Device>) {
    let _ = dev.bind();
    // Sleeps of a few microseconds (the busy waits below) are that short only with a small
    // timer slack: Linux's default of 50 us would stretch each to about 55 us. This thread only.
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches nothing but the calling thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0) };
    let mut taken = 0u64;
    // The probe's `gap` (see `Profile`): when the last job ended with the next one queued.
    let mut gap_from: Option<Instant> = None;
    // When the queue was first seen closed with sends / receives still parked.
    let mut closed_at: Option<Instant> = None;
    // Parked sends / receives move between jobs and while idle (and inside a job's waits).
    let service = |sh: &Shared| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sh.tracker.service())).unwrap_or_else(|_| {
            sh.tracker.give_up("the NCCL progress thread panicked while moving a send / recv");
            false
        })
    };
    loop {
        let mut busy = service(&sh);
        let mut last_look = Instant::now();
        let spin_until = Instant::now() + SPIN;
        while sh.queued.load(Ordering::SeqCst) == taken + sh.taken_ahead.load(Ordering::SeqCst) && Instant::now() < spin_until {
            // A parked send / recv is moved on while spinning: its peer's header often lands
            // within microseconds, and the timed waits below would add their period to the op
            // (the table's sendrecv at 4 ranks: 228 -> 159-200 us; raw NCCL ~11, the rest is
            // the header swap on the direction's stream).
            // At most one look every SERVICE_EVERY: a look takes locks and queries events,
            // which the caller's own CUDA calls would contend with.
            if busy && last_look.elapsed() >= SERVICE_EVERY {
                busy = service(&sh);
                last_look = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
        // The busy waits' period: short first, doubling up to BUSY_WAIT_MAX.
        let mut busy_wait = BUSY_WAIT_MIN;
        let job = {
            let mut q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break Some(j);
                }
                if busy {
                    if q.closed && closed_at.get_or_insert_with(Instant::now).elapsed() > DROP_GRACE {
                        drop(q);
                        sh.tracker.give_up("the backend was dropped while a send / recv still waited for its peer");
                        busy = false;
                        q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    q.waiting = true;
                    q = sh.cv.wait_timeout(q, busy_wait).unwrap_or_else(|e| e.into_inner()).0;
                    q.waiting = false;
                    busy_wait = (busy_wait * 2).min(BUSY_WAIT_MAX);
                    if q.jobs.is_empty() {
                        drop(q);
                        busy = service(&sh);
                        q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
                    }
                    continue;
                }
                if q.closed {
                    q.stopped = true;
                    break None;
                }
                q.waiting = true;
                q = sh.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                q.waiting = false;
            }
        };
        let Some(mut job) = job else { break };
        let job_started = sh.tracker.profile.start();
        // Only while the profile is on (a gap across its turning off is no job's).
        let gap = gap_from.take().filter(|_| job_started.is_some());
        sh.tracker.profile.add(9, gap);
        taken += 1;
        job.start(Instant::now());
        // The job's channel is only looked at here, by reference: a clone would change its
        // `Arc`'s counts, which the issuing thread changes on every op too (a cache line moving
        // between the two threads twice per job).
        if !matches!(job, Job::Op { .. }) {
            // Ops launched before get their completion event first (see `Tracker::defer`).
            sh.tracker.flush();
        }
        let (Some(id), Some(rank)) = (job.id(), job.chan().map(|c| c.rank)) else {
            // A teardown: bounded by itself; a panic in it must not end the thread.
            *sh.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&sh.tracker)));
            sh.finished.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        {
            // The communicator of the job before, when it is the same, is kept (no count
            // change on it: the issuing thread changes the same counts on every op).
            let comm = &job.chan().expect("an op's job has a channel").comm;
            let mut cur = sh.current.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *cur {
                Some((c, i, since)) if Arc::ptr_eq(c, comm) => (*i, *since) = (id, Instant::now()),
                slot => *slot = Some((comm.clone(), id, Instant::now())),
            }
        }
        sh.tracker.profile.add(4, job_started);
        // A panic must not leave the op's completion waiting for a launch that never comes: the
        // ticket (if any) is dropped unset, and the completion reports it at the op deadline.
        let ticket = match &job {
            Job::Op { ticket, .. } | Job::P2p(P2pJob { ticket, .. }) => ticket.clone(),
            Job::Split { .. } | Job::Teardown(_) => None,
        };
        let ran = sh.tracker.profile.start();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&sh.tracker)));
        sh.tracker.profile.add(8, ran);
        let after = sh.tracker.profile.start();
        if run.is_err() {
            if let Some(t) = ticket {
                t.set(Stage::Finished(Err(CollectiveError::Backend(format!(
                    "nccl {} #{} on rank {rank}: the NCCL progress thread panicked while launching this op",
                    id.name, id.seq
                )))));
            }
        }
        // Cleared once nothing is queued behind; with more queued, the next job replaces it
        // at once (meanwhile the watchdog finds its communicator outside NCCL, and a drop of
        // the queue would find the next job there).
        let backlog = sh.queued.load(Ordering::SeqCst) != taken + sh.taken_ahead.load(Ordering::SeqCst);
        if !backlog {
            // Nothing queued behind: the batched ops get their completion event now.
            sh.tracker.flush();
            *sh.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        sh.finished.fetch_add(1, Ordering::SeqCst);
        sh.tracker.profile.add(7, after);
        if job_started.is_some() {
            sh.tracker.profile.add(0, job_started);
            sh.tracker.profile.jobs.fetch_add(1, Ordering::Relaxed);
            gap_from = if backlog { sh.tracker.profile.start() } else { None };
        }
    }
    sh.tracker.flush();
    // The backend and its subgroups are gone: buffers still alive (leaked to a pending copy,
    // say) keep the device, but no cache of freed blocks with it (see `block_cache`).
    dev.disable_cache();
    sh.exited.store(true, Ordering::SeqCst);
}

impl Drop for Progress {
    fn drop(&mut self) {
        {
            let mut q = self.shared.q.lock().unwrap_or_else(|e| e.into_inner());
            q.closed = true;
        }
        self.shared.cv.notify_all();
        let closed_at = Instant::now();
        let hard = closed_at + ABORT_WAIT + Duration::from_secs(5);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        loop {
            if self.shared.exited.load(Ordering::SeqCst) {
                if let Some(h) = handle {
                    let _ = h.join();
                }
                return;
            }
            if Instant::now() >= hard {
                return; // detached: it ends at its jobs' deadlines
            }
            let stuck = self.shared.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some((comm, id, since)) = stuck {
                if since.max(closed_at).elapsed() > DROP_GRACE && comm.aborted().is_none() {
                    comm.abort(format!("the backend was dropped while {} #{} still waited for its peers", id.name, id.seq));
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_single_step_ops_share_a_completion_event() {
        assert!(batchable(true, true, 0), "an in-place one-rank op keeps nothing it writes");
        assert!(batchable(true, true, BATCH_MAX_BYTES));
        assert!(!batchable(true, true, BATCH_MAX_BYTES + 1), "a large op gets its own event (and deadline)");
        assert!(!batchable(true, false, 8), "a fused op's steps come after its calls");
        assert!(!batchable(false, true, 8), "no ticket, batching off, or an injected enqueue stall");
        // The watchdog records a batch's event well before any op deadline could run out.
        assert!(BATCH_MAX_AGE < Duration::from_millis(100) && (2..=64).contains(&BATCH_MAX));
    }
}
