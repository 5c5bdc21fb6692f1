//! The raw NCCL reference of the benchmark: each collective called directly through cudarc's
//! NCCL bindings in a tight loop on preallocated buffers, as nccl-tests does — its own
//! *blocking* communicator (`ncclCommInitRank`, nccl-tests' default; [`RawMode`] for one
//! configured as the backend's, polled after every call as NCCL requires, or one made as the
//! backend's blocking twin) and its own stream on the
//! rank's GPU, no progress thread, no validation, nothing checked — timed with CUDA events
//! around back-to-back launches, window by window, exactly as the bench times the backend.
//! Not a [`concord_core::Backend`]: a yardstick printed next to the backend's row.
//!
//! Every rank of the world makes the same calls in the same order (the bench does). The GPU
//! waits end at a deadline; `ncclCommInitRank` itself is NCCL's blocking call (the bench's
//! per-rank watchdog bounds it).

use crate::cuda::{derr, DevMem, Device, Event};
use crate::dtype::nccl_dtype;
use concord_core::{DType, ReduceOp};
use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::sys as nccl;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The collectives of the reference (nccl-tests' set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// nccl-tests' alltoall: one group of ncclSend / ncclRecv of a chunk to and from every rank.
    AllToAll,
    Broadcast,
    Reduce,
    /// ncclSend to rank + 1 and ncclRecv from rank - 1, one group.
    SendRecv,
}

impl RawOp {
    /// From the bench's op names (`all_reduce`, ...).
    pub fn from_name(s: &str) -> Option<RawOp> {
        Some(match s {
            "all_reduce" => RawOp::AllReduce,
            "all_gather" => RawOp::AllGather,
            "reduce_scatter" => RawOp::ReduceScatter,
            "all_to_all" => RawOp::AllToAll,
            "broadcast" => RawOp::Broadcast,
            "reduce" => RawOp::Reduce,
            "sendrecv" => RawOp::SendRecv,
            _ => return None,
        })
    }
}

/// One timed step: `count` elements per rank chunk (the bench's `count` column).
#[derive(Clone, Debug)]
pub struct RawStep {
    pub op: RawOp,
    pub count: usize,
    pub dtype: DType,
    pub redop: ReduceOp,
    pub root: usize,
    /// In-place as nccl-tests: receive buffer = send buffer (all_gather: send at this rank's
    /// chunk of the receive buffer; reduce_scatter: receive at this rank's chunk of the send).
    pub in_place: bool,
    pub warmup: usize,
    pub iters: usize,
    /// Launches between two events (the bench's window).
    pub window: usize,
    /// Distinct buffer sets the launches cycle through: 1 is nccl-tests' loop (one pair reused
    /// by every launch); the bench's window makes every launch of a window use buffers of its
    /// own, as the backend's side does (each timed iteration's output is checked there).
    pub buffers: usize,
    /// Records a completion event after every launch, as the backend does for every op (an
    /// experiment on what the backend's events cost on the GPU: option `raw_events=1`).
    pub events: bool,
    /// Buffers filled with zeros (option `raw_fill=zero`) instead of a non-zero pattern (the
    /// default: nccl-tests, too, times its loop on buffers holding data, and the backend's side
    /// always moves data).
    pub zeros: bool,
    /// A timed window's launches made by a second thread while the calling thread spins until
    /// it has made them all, then records the end event (option `raw_thread=1`): the backend's
    /// two-thread shape (the caller waits in `mark` while the progress thread launches), with
    /// none of its work per op. An experiment on what the second thread costs by itself.
    pub thread: bool,
    /// With `thread`: the waiting thread sleeps 20 µs between looks while more than 8 launches
    /// are still to come, and spins only for the last ones (option `raw_thread=nap`).
    pub nap: bool,
    /// Option `raw_pin=N`: the thread that makes the timed launches (this one, or the launcher
    /// of `thread`) runs on CPU `N + rank` only, for the step (this thread's CPU set is restored
    /// after it). An experiment on where the main thread's fast mode comes from.
    pub pin: Option<usize>,
    /// With `thread`: one launcher thread for the whole step, started before its first window
    /// and reused by every window (option `raw_thread=keep`, `keepblock`), as the backend's
    /// progress thread lives as long as the backend; without it, a fresh launcher per window.
    pub keep: bool,
    /// With `thread`: the launcher records the end event itself right behind its last launch,
    /// and the calling thread blocks (a condition variable, no spinning) until it has (option
    /// `raw_thread=block`, `keepblock`): the two-thread shape with a caller that takes no CPU
    /// and touches no line the launcher writes while it launches.
    pub block: bool,
    /// Each launch wrapped in `ncclGroupStart` / `ncclGroupEnd`, as the backend's launch is
    /// (option `raw_group=1`).
    pub group: bool,
}

/// Shares a value with the launching thread of [`RawStep::thread`]: only one thread uses it at a
/// time (the caller waits on an atomic or a condition variable until the launcher is done).
struct OneAtATime<T>(T);
// SAFETY: see the type's docs; the CUDA stream and NCCL communicator may be used from any thread.
unsafe impl<T> Sync for OneAtATime<T> {}
unsafe impl<T> Send for OneAtATime<T> {}

/// What a window's launcher hands back: its end event (with [`RawStep::block`]) or an error.
type Outcome = Result<Option<OneAtATime<Event>>, String>;

/// The calling thread's and the launcher's shared state for [`RawStep::thread`] (see
/// [`RawNccl::launcher`], [`RawNccl::drive`]).
struct Ctl {
    keep: bool,
    block: bool,
    ready: std::sync::atomic::AtomicBool,
    quit: std::sync::atomic::AtomicBool,
    /// Launches asked for (0: none; only the caller sets it non-zero, only the launcher clears it).
    cmd: std::sync::atomic::AtomicUsize,
    made: std::sync::atomic::AtomicUsize,
    /// Raised with `done` (an atomic for the spinning caller to look at, not the lock).
    handed: std::sync::atomic::AtomicBool,
    done: std::sync::Mutex<Option<Outcome>>,
    cv: std::sync::Condvar,
}

impl Ctl {
    fn new(keep: bool, block: bool) -> Ctl {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        Ctl {
            keep,
            block,
            ready: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            cmd: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
            handed: AtomicBool::new(false),
            done: std::sync::Mutex::new(None),
            cv: std::sync::Condvar::new(),
        }
    }
    fn hand_back(&self, r: Result<Option<Event>, String>) {
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *d = Some(r.map(|e| e.map(OneAtATime)));
        self.handed.store(true, std::sync::atomic::Ordering::SeqCst); // under the lock, as its clearing
        drop(d);
        self.cv.notify_all();
    }
    fn has_outcome(&self) -> bool {
        self.handed.load(std::sync::atomic::Ordering::Acquire)
    }
    fn take_outcome(&self) -> Option<Outcome> {
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        self.handed.store(false, std::sync::atomic::Ordering::SeqCst);
        d.take()
    }
    /// Blocks (no spinning) until the launcher hands a window's outcome back, up to `deadline`.
    fn wait_outcome(&self, deadline: Instant) -> Option<Outcome> {
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = d.take() {
                self.handed.store(false, std::sync::atomic::Ordering::SeqCst);
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            d = self.cv.wait_timeout(d, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The raw loop's fill (four bytes, repeated): 1.1 as an f32; every other type reads a non-zero
/// value of its own.
pub const RAW_FILL: u32 = 0x3F8C_CCCD;

/// What a step measured.
#[derive(Clone, Copy, Debug)]
pub struct RawTime {
    /// GPU time per op: the median over the windows of each window's event time / its
    /// iterations (one window: its mean), as the bench takes the backend's.
    pub per_op: Duration,
    /// Host wall-clock per op over the same windows (launches + the wait for the end event).
    pub wall_per_op: Duration,
    /// The fastest and slowest window's GPU time per op.
    pub min_per_op: Duration,
    pub max_per_op: Duration,
    /// Host time per launch call on the main thread (the median over the windows of each
    /// window's first launch to its last launch returned, per launch); `None` when a launcher
    /// thread made them. Compared with the backend's progress-thread NCCL section in a
    /// `CONCORD_BENCH_PROBE=1` run.
    pub launch_per_op: Option<Duration>,
}

/// Whether the reference can time `op` on `dtype` with `redop` (NCCL has no 16-bit integer
/// type; the reference has only NCCL's built-in reduce ops).
pub fn supports(op: RawOp, dtype: DType, redop: ReduceOp) -> bool {
    let reduces = matches!(op, RawOp::AllReduce | RawOp::ReduceScatter | RawOp::Reduce);
    nccl_dtype(dtype).is_some() && (!reduces || red(redop).is_ok())
}

struct RawCommHandle(nccl::ncclComm_t);
unsafe impl Send for RawCommHandle {}

/// How the reference's communicator is made ([`RawNccl::with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawMode {
    /// `ncclCommInitRank`: nccl-tests' blocking communicator.
    Blocking,
    /// `ncclCommInitRankConfig` with `blocking = 0` (the backend's default): every call's
    /// `ncclInProgress` is polled with `ncclCommGetAsyncError` until done before the next call,
    /// as NCCL requires. What NCCL's non-blocking mode costs per launch, measured without the
    /// backend.
    NonBlocking,
    /// A blocking communicator split (`ncclCommSplit`, `splitShare = 0`) off a non-blocking
    /// parent, exactly as the backend makes its blocking twin (`Comm::make_twin`): whether the
    /// twin's way of making a communicator costs per launch, measured without the backend.
    Split,
}

/// A rank's raw NCCL reference (see the module docs).
pub struct RawNccl {
    dev: Arc<Device>,
    comm: nccl::ncclComm_t,
    rank: usize,
    nranks: usize,
    timeout: Duration,
    /// `false`: a non-blocking communicator, polled after every call ([`RawNccl::ready`]).
    blocking: bool,
    /// [`RawMode::Split`]: the non-blocking parent `comm` was split off (aborted after `comm`).
    parent: Option<RawCommHandle>,
}

/// `ncclGetUniqueId` (rank 0), as bytes to hand to every rank.
pub fn unique_id() -> Result<Vec<u8>, String> {
    crate::comm::nccl_present()?;
    let mut id = nccl::ncclUniqueId { internal: [0; 128] };
    let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
    if r != nccl::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetUniqueId: {}", crate::comm::err_string(r)));
    }
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

/// `Ok` for success, and for `ncclInProgress` (only a non-blocking communicator returns it; the
/// caller then polls, [`RawNccl::ready`]).
fn ok(r: nccl::ncclResult_t, what: &str) -> Result<(), String> {
    match r {
        nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => Ok(()),
        e => Err(format!("{what}: {}", crate::comm::err_string(e))),
    }
}

fn red(op: ReduceOp) -> Result<nccl::ncclRedOp_t, String> {
    use nccl::ncclRedOp_t::*;
    Ok(match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Product => ncclProd,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
        ReduceOp::Avg => ncclAvg,
        other => return Err(format!("the raw NCCL reference has no {} (only sum, prod, min, max, avg)", other.name())),
    })
}

// SAFETY: the communicator and stream are used by one thread at a time (`&mut self`); NCCL
// communicators and CUDA streams may move between threads.
unsafe impl Send for RawNccl {}

impl RawNccl {
    /// This rank's number in the reference communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Joins the reference communicator made as `mode` says: rank `rank` of `nranks` on visible
    /// GPU `ordinal`, with the id from [`unique_id`] on rank 0. `timeout` bounds every GPU wait.
    pub fn with(mode: RawMode, ordinal: usize, rank: usize, nranks: usize, id: &[u8], timeout: Duration) -> Result<RawNccl, String> {
        let lib_version = crate::comm::nccl_present()?;
        if id.len() != 128 {
            return Err(format!("an NCCL unique id is 128 bytes, got {}", id.len()));
        }
        let dev = Device::new(ordinal)?;
        dev.bind()?;
        let mut uid = nccl::ncclUniqueId { internal: [0; 128] };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as _;
        }
        let mut comm: nccl::ncclComm_t = std::ptr::null_mut();
        if mode == RawMode::Blocking {
            ok(unsafe { nccl::ncclCommInitRank(&mut comm, nranks as i32, uid, rank as i32) }, "ncclCommInitRank")?;
            return Ok(RawNccl { dev, comm, rank, nranks, timeout, blocking: true, parent: None });
        }
        let mut cfg = crate::comm::config(false, lib_version);
        let r = unsafe { nccl::ncclCommInitRankConfig(&mut comm, nranks as i32, uid, rank as i32, &mut cfg) };
        if r != nccl::ncclResult_t::ncclInProgress {
            ok(r, "ncclCommInitRankConfig (non-blocking)")?;
        }
        // Polled as a non-blocking communicator until it is made (dropped, it is aborted).
        let mut raw = RawNccl { dev, comm, rank, nranks, timeout, blocking: false, parent: None };
        raw.ready("ncclCommInitRankConfig (non-blocking)")?;
        if mode == RawMode::NonBlocking {
            return Ok(raw);
        }
        // The twin's split (`Comm::make_twin`): blocking, nothing shared with the parent.
        let mut cfg = crate::comm::config(true, lib_version);
        cfg.splitShare = 0;
        let mut child: nccl::ncclComm_t = std::ptr::null_mut();
        ok(unsafe { nccl::ncclCommSplit(raw.comm, 0, rank as i32, &mut child, &mut cfg) }, "ncclCommSplit (as the twin)")?;
        raw.ready("ncclCommSplit (as the twin)")?;
        if child.is_null() {
            return Err("ncclCommSplit (as the twin) returned no communicator".into());
        }
        raw.parent = Some(RawCommHandle(raw.comm));
        raw.comm = child;
        // The new communicator polled until made too, as the twin's is.
        raw.ready("ncclCommSplit (as the twin, new communicator)")?;
        raw.blocking = true;
        Ok(raw)
    }

    /// With a non-blocking communicator: polls until the last call is done (NCCL requires it
    /// before the next call), up to the timeout. Nothing to do with a blocking one.
    fn ready(&self, what: &str) -> Result<(), String> {
        if self.blocking || self.comm.is_null() {
            return Ok(());
        }
        match crate::comm::wait_ready(self.comm, Instant::now() + self.timeout, false, None) {
            crate::comm::Ready::Done => Ok(()),
            crate::comm::Ready::Failed(e) => Err(format!("{what}: {}", crate::comm::err_string(e))),
            crate::comm::Ready::Deadline | crate::comm::Ready::AbortRequested => {
                Err(format!("{what}: still in progress after {} ms", self.timeout.as_millis()))
            }
        }
    }

    fn sync(&self, what: &str) -> Result<(), String> {
        let ev = self.record(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        match ev.wait_until(Instant::now() + self.timeout)? {
            true => Ok(()),
            false => Err(format!("raw NCCL reference: the GPU did not finish {what} within {} ms", self.timeout.as_millis())),
        }
    }

    fn record(&self, flags: cusys::CUevent_flags) -> Result<Event, String> {
        let ev = Event::owned(cu::event::create(flags).map_err(|e| derr("cuEventCreate", e))?);
        unsafe { cu::event::record(ev.0, self.dev.stream) }.map_err(|e| derr("cuEventRecord", e))?;
        Ok(ev)
    }

    /// [`RawStep::thread`]'s launcher: binds the context (and pins, with `cpu`), says it is
    /// ready, then makes each window's launches when `ctl.cmd` asks for them; with `ctl.block`
    /// it records the window's end event itself, right behind its last launch. It hands every
    /// window's outcome back through `ctl.done`, and ends after one window unless `ctl.keep`,
    /// at a failure, or when `ctl.quit` is raised.
    fn launcher(&self, ctl: &Ctl, cpu: Option<usize>, launch: &dyn Fn() -> Result<(), String>) {
        use std::sync::atomic::Ordering;
        let bound = self.dev.bind().and_then(|()| cpu.map_or(Ok(()), |c| crate::pin::pin_to(c).map(|_| ())));
        if let Err(e) = bound {
            ctl.hand_back(Err(e));
            return;
        }
        ctl.ready.store(true, Ordering::SeqCst);
        loop {
            let k = loop {
                if ctl.quit.load(Ordering::Relaxed) {
                    return;
                }
                let k = ctl.cmd.load(Ordering::Acquire);
                if k != 0 {
                    break k;
                }
                std::hint::spin_loop();
            };
            let run = || -> Result<Option<Event>, String> {
                for i in 0..k {
                    if ctl.quit.load(Ordering::Relaxed) {
                        return Err("raw NCCL reference: the launcher was told to stop".into());
                    }
                    launch()?;
                    ctl.made.store(i + 1, Ordering::Release);
                }
                if ctl.block {
                    return self.record(cusys::CUevent_flags::CU_EVENT_DEFAULT).map(Some);
                }
                Ok(None)
            };
            let r = run();
            let failed = r.is_err();
            ctl.cmd.store(0, Ordering::Release);
            ctl.hand_back(r);
            if failed || !ctl.keep {
                return;
            }
        }
    }

    /// One window of [`RawStep::thread`] on a started launcher (see [`RawNccl::launcher`]): waits
    /// until it is ready, records the start event, has it make `k` launches, and waits (spinning,
    /// napping, or with `ctl.block` blocked on the hand-back) until it has; the end event is the
    /// launcher's (`block`) or recorded here. Every wait ends at `deadline`.
    fn drive(&self, ctl: &Ctl, k: usize, nap: bool, deadline: Instant) -> Result<(Event, Event), String> {
        use std::sync::atomic::Ordering;
        let fail = |e: String| {
            ctl.quit.store(true, Ordering::SeqCst);
            Err(e)
        };
        while !ctl.ready.load(Ordering::SeqCst) || ctl.cmd.load(Ordering::Acquire) != 0 {
            if ctl.has_outcome() || Instant::now() > deadline {
                return match ctl.take_outcome() {
                    Some(Err(e)) => fail(e),
                    _ => fail("raw NCCL reference: the launcher thread did not start".into()),
                };
            }
            std::hint::spin_loop();
        }
        let start = match self.record(cusys::CUevent_flags::CU_EVENT_DEFAULT) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        ctl.made.store(0, Ordering::SeqCst);
        ctl.take_outcome();
        ctl.cmd.store(k, Ordering::Release);
        if !ctl.block {
            while ctl.made.load(Ordering::Acquire) < k {
                if ctl.has_outcome() {
                    break; // failed: its error is taken below
                }
                if nap && ctl.made.load(Ordering::Relaxed) + 8 < k {
                    std::thread::sleep(Duration::from_micros(20));
                    continue;
                }
                if Instant::now() > deadline {
                    return fail(format!("raw NCCL reference: {k} launches not made within {} ms", self.timeout.as_millis()));
                }
                std::hint::spin_loop();
            }
        }
        let end = if ctl.block { None } else { Some(self.record(cusys::CUevent_flags::CU_EVENT_DEFAULT)) };
        let outcome = ctl.wait_outcome(deadline);
        match (outcome, end) {
            (Some(Ok(Some(e))), _) => Ok((start, e.0)),
            (Some(Ok(None)), Some(end)) => Ok((start, end?)),
            (Some(Err(e)), _) => fail(e),
            (None, _) => fail(format!("raw NCCL reference: {k} launches not made within {} ms", self.timeout.as_millis())),
            (Some(Ok(None)), None) => fail("raw NCCL reference: the launcher recorded no end event".into()),
        }
    }

    /// Times `s`: warm-up launches, then windows of back-to-back launches between two CUDA
    /// events, each behind one untimed launch. Buffers are allocated (and filled) before, freed
    /// after.
    pub fn time(&mut self, s: &RawStep) -> Result<RawTime, String> {
        self.dev.bind()?;
        let t = nccl_dtype(s.dtype).ok_or_else(|| format!("NCCL has no {} type", s.dtype))?;
        let elt = s.dtype.size();
        let (n, l, rank) = (self.nranks, s.count, self.rank);
        let (send_n, recv_n) = match s.op {
            RawOp::AllGather => (l, l * n),
            RawOp::ReduceScatter => (l * n, l),
            RawOp::AllToAll => (l * n, l * n),
            _ => (l, l),
        };
        let redop = match s.op {
            RawOp::AllReduce | RawOp::ReduceScatter | RawOp::Reduce => red(s.redop)?,
            _ => nccl::ncclRedOp_t::ncclSum,
        };
        let alloc = |elems: usize| -> Result<DevMem, String> {
            let m = self.dev.alloc(elems * elt)?;
            unsafe { cu::memset_d8_async(m.ptr, 0, (elems * elt).max(1), self.dev.stream) }.map_err(|e| derr("cuMemsetD8Async", e))?;
            if !s.zeros {
                let r = unsafe { cusys::cuMemsetD32Async(m.ptr, RAW_FILL, elems * elt / 4, self.dev.stream) };
                if r != cusys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuMemsetD32Async: {r:?}"));
                }
            }
            Ok(m)
        };
        // In place: one buffer, as nccl-tests lays it out. `s.buffers` sets of them.
        let (big, small) = if send_n >= recv_n { (send_n, recv_n) } else { (recv_n, send_n) };
        let mut keep: Vec<DevMem> = Vec::new();
        let mut sets: Vec<(u64, u64)> = Vec::new();
        for _ in 0..s.buffers.max(1) {
            let a = alloc(big)?;
            let b = if s.in_place { None } else { Some(alloc(small)?) };
            sets.push(match (&b, s.op) {
                (Some(b), _) if send_n >= recv_n => (a.ptr, b.ptr),
                (Some(b), _) => (b.ptr, a.ptr),
                (None, RawOp::AllGather) => (a.ptr + (rank * l * elt) as u64, a.ptr),
                (None, RawOp::ReduceScatter) => (a.ptr, a.ptr + (rank * l * elt) as u64),
                (None, _) => (a.ptr, a.ptr),
            });
            keep.push(a);
            keep.extend(b);
        }
        let (comm, stream) = (self.comm, self.dev.stream as nccl::cudaStream_t);
        let root = s.root as i32;
        let next = std::cell::Cell::new(0usize);
        let launch_raw = || -> Result<(), String> {
            let (send, recv) = sets[next.get() % sets.len()];
            next.set(next.get() + 1);
            let (sp, rp) = (send as *const c_void, recv as *mut c_void);
            if s.group {
                ok(unsafe { nccl::ncclGroupStart() }, "ncclGroupStart")?;
            }
            let r = unsafe {
                match s.op {
                    RawOp::AllReduce => ok(nccl::ncclAllReduce(sp, rp, l, t, redop, comm, stream), "ncclAllReduce"),
                    RawOp::AllGather => ok(nccl::ncclAllGather(sp, rp, l, t, comm, stream), "ncclAllGather"),
                    RawOp::ReduceScatter => ok(nccl::ncclReduceScatter(sp, rp, l, t, redop, comm, stream), "ncclReduceScatter"),
                    RawOp::Broadcast => ok(nccl::ncclBroadcast(sp, rp, l, t, root, comm, stream), "ncclBroadcast"),
                    RawOp::Reduce => ok(nccl::ncclReduce(sp, rp, l, t, redop, root, comm, stream), "ncclReduce"),
                    RawOp::AllToAll => {
                        ok(nccl::ncclGroupStart(), "ncclGroupStart")?;
                        for p in 0..n {
                            let off = (p * l * elt) as u64;
                            ok(nccl::ncclSend((send + off) as *const c_void, l, t, p as i32, comm, stream), "ncclSend")?;
                            ok(nccl::ncclRecv((recv + off) as *mut c_void, l, t, p as i32, comm, stream), "ncclRecv")?;
                        }
                        ok(nccl::ncclGroupEnd(), "ncclGroupEnd")
                    }
                    RawOp::SendRecv => {
                        ok(nccl::ncclGroupStart(), "ncclGroupStart")?;
                        ok(nccl::ncclSend(sp, l, t, ((rank + 1) % n) as i32, comm, stream), "ncclSend")?;
                        ok(nccl::ncclRecv(rp, l, t, ((rank + n - 1) % n) as i32, comm, stream), "ncclRecv")?;
                        ok(nccl::ncclGroupEnd(), "ncclGroupEnd")
                    }
                }
            };
            if s.group {
                r?;
                return ok(unsafe { nccl::ncclGroupEnd() }, "ncclGroupEnd");
            }
            r
        };
        // Completion events as the backend's, reused round robin (`s.events`).
        let events: Vec<Event> = if s.events {
            (0..s.window.max(1))
                .map(|_| {
                    cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(Event::owned).map_err(|e| derr("cuEventCreate", e))
                })
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let launch = || -> Result<(), String> {
            launch_raw()?;
            if !events.is_empty() {
                let ev = &events[next.get() % events.len()];
                unsafe { cu::event::record(ev.0, self.dev.stream) }.map_err(|e| derr("cuEventRecord", e))?;
            }
            self.ready("the raw NCCL launch")
        };
        for _ in 0..s.warmup {
            launch()?;
        }
        self.sync("the warm-up launches")?;
        // Before each window the ranks meet (a one-element all-reduce, waited for), as the
        // bench's barrier before each of the backend's windows.
        let flag = alloc(1)?;
        let meet = || -> Result<(), String> {
            let f = flag.ptr as *mut c_void;
            ok(
                unsafe { nccl::ncclAllReduce(f, f, 1, nccl::ncclDataType_t::ncclUint8, nccl::ncclRedOp_t::ncclMax, comm, stream) },
                "ncclAllReduce (barrier)",
            )?;
            self.ready("ncclAllReduce (barrier)")?;
            self.sync("the barrier before a window")
        };
        let cpu = s.pin.map(|n| n + self.rank);
        let _unpin = crate::pin::Unpin(match cpu {
            Some(c) if !s.thread => Some((crate::pin::pin_to(c)?, c)),
            _ => None,
        });
        let mut per_window: Vec<Duration> = Vec::new();
        // The main thread's launch calls, per window and launch (`RawTime::launch_per_op`).
        let mut host: Vec<Duration> = Vec::new();
        let mut wall = Duration::ZERO;
        let window = s.window.max(1);
        // Every window: the ranks meet, one untimed launch, then `timed` (the window's launches
        // between two events, on this thread or a launcher's).
        let mut windows = |timed: &mut dyn FnMut(usize) -> Result<(Event, Event), String>| -> Result<(), String> {
            let mut done = 0;
            while done < s.iters {
                let k = window.min(s.iters - done);
                meet()?;
                // One untimed launch first, as the bench does before each of the backend's windows
                // (the GPU is busy when the clock starts, as in nccl-tests' loop after its warm-up).
                launch()?;
                let t0 = Instant::now();
                let (start, end) = timed(k)?;
                if !end.wait_until(Instant::now() + self.timeout)? {
                    return Err(format!("raw NCCL reference: the GPU did not finish {k} launches within {} ms", self.timeout.as_millis()));
                }
                wall += t0.elapsed();
                let ms = unsafe { cu::event::elapsed(start.0, end.0) }.map_err(|e| derr("cuEventElapsedTime", e))?;
                per_window.push(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3) / k as u32);
                done += k;
            }
            Ok(())
        };
        if s.thread {
            // The launcher uses `launch` (and `self`) only while this thread waits for it.
            let shared = OneAtATime((&launch, &*self));
            let shared = &shared;
            if s.keep {
                let ctl = Ctl::new(true, s.block);
                std::thread::scope(|sc| {
                    let c = OneAtATime(&ctl);
                    sc.spawn(move || {
                        let (launch, me) = shared.0;
                        me.launcher(c.0, cpu, launch)
                    });
                    let r = windows(&mut |k| self.drive(&ctl, k, s.nap, Instant::now() + self.timeout));
                    ctl.quit.store(true, std::sync::atomic::Ordering::SeqCst);
                    r
                })?;
            } else {
                windows(&mut |k| {
                    let ctl = Ctl::new(false, s.block);
                    std::thread::scope(|sc| {
                        let c = OneAtATime(&ctl);
                        sc.spawn(move || {
                            let (launch, me) = shared.0;
                            me.launcher(c.0, cpu, launch)
                        });
                        let r = self.drive(&ctl, k, s.nap, Instant::now() + self.timeout);
                        ctl.quit.store(true, std::sync::atomic::Ordering::SeqCst);
                        r
                    })
                })?;
            }
        } else {
            windows(&mut |k| {
                let start = self.record(cusys::CUevent_flags::CU_EVENT_DEFAULT)?;
                let t = Instant::now();
                for _ in 0..k {
                    launch()?;
                }
                host.push(t.elapsed() / k as u32);
                Ok((start, self.record(cusys::CUevent_flags::CU_EVENT_DEFAULT)?))
            })?;
        }
        drop((keep, flag)); // stream-ordered frees after the last launch
        let iters = s.iters.max(1) as u32;
        let median = |v: &mut Vec<Duration>| {
            v.sort();
            match v.len() {
                0 => Duration::ZERO,
                n if n % 2 == 1 => v[n / 2],
                n => (v[n / 2 - 1] + v[n / 2]) / 2,
            }
        };
        let per_op = median(&mut per_window);
        let launch_per_op = (!host.is_empty()).then(|| median(&mut host));
        let (min_per_op, max_per_op) = (per_window.first().copied().unwrap_or_default(), per_window.last().copied().unwrap_or_default());
        Ok(RawTime { per_op, wall_per_op: wall / iters, min_per_op, max_per_op, launch_per_op })
    }
}

impl Drop for RawNccl {
    fn drop(&mut self) {
        // A stream that does not drain (a peer gone mid-step) is aborted: ncclCommAbort ends
        // the waiting kernels, which would otherwise keep the GPU's SMs for the backend's ops.
        let drained = self.sync("the reference's last launches").is_ok();
        // Bounded: ncclCommDestroy / ncclCommAbort runs on a helper thread.
        let raw = RawCommHandle(self.comm);
        // A non-blocking communicator is aborted: its destroy would itself be in progress.
        let drained = drained && self.blocking;
        let parent = self.parent.take();
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("nccl-ref-destroy".into()).spawn(move || {
            let raw = raw;
            unsafe {
                let _ = if drained { nccl::ncclCommDestroy(raw.0) } else { nccl::ncclCommAbort(raw.0) };
                if let Some(p) = parent {
                    let _ = nccl::ncclCommAbort(p.0);
                }
            }
            let _ = tx.send(());
        });
        if spawned.is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}
