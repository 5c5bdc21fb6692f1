//! The NCCL side: library checks, a non-blocking communicator with deadline-bounded launches,
//! split, and abort.
//!
//! Contracts:
//! * [`nccl_present`] MUST be called (and be true) before anything else here: cudarc panics on a
//!   missing library or symbol, and this module never lets that happen.
//! * Every launch is one NCCL group; with a non-blocking communicator the host polls
//!   `ncclCommGetAsyncError` until the group is enqueued, never past the caller's deadline.
//! * [`Comm::abort`] is idempotent, bounded in time (it runs `ncclCommAbort` on a helper thread
//!   and gives up waiting after [`ABORT_WAIT`]), and every later use reports the abort's reason.
//!
//! The backend's side of its communicators is here too (end of the file): `init` (unique id
//! through the world's file store, `ncclCommInitRankConfig`) and `new_group` (agreed list,
//! `ncclCommSplit` on the progress thread), each building an [`NcclBackend`].

use crate::cuda::{poll_until, Device, Padded};
use cudarc::nccl::sys;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long `abort` waits for `ncclCommAbort` to return before leaving it on its thread.
pub const ABORT_WAIT: Duration = Duration::from_secs(10);

/// Every NCCL symbol this backend calls; checked at init so that a too-old library is a named
/// error instead of a panic deep inside a collective.
const SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommGetAsyncError",
    "ncclCommAbort",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommSplit",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
];

/// `Ok(version)` (e.g. 22809 for 2.28.9) when libnccl loads and has every symbol we use.
pub fn nccl_present() -> Result<i32, String> {
    let found = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !found {
        return Err("libnccl could not be loaded (looked for libnccl.so and its versioned names on the \
                    library path; set LD_LIBRARY_PATH to the folder holding libnccl.so)"
            .into());
    }
    let lib = std::panic::catch_unwind(|| unsafe { sys::culib() }).map_err(|_| "libnccl could not be loaded".to_string())?;
    for s in SYMBOLS {
        if unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err() {
            return Err(format!("libnccl lacks the symbol {s}: NCCL 2.19 or newer is needed"));
        }
    }
    let mut v = 0;
    let r = unsafe { sys::ncclGetVersion(&mut v) };
    if r != sys::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetVersion failed: {r:?}"));
    }
    Ok(v)
}

/// `ncclAllReduce` and `ncclReduceScatter` share this signature
/// (sendbuff, recvbuff, count, datatype, op, comm, stream).
pub(crate) type ElementwiseRedFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    u32,
    sys::ncclComm_t,
    sys::cudaStream_t,
) -> sys::ncclResult_t;

/// NCCL entry points that take a reduce op, declared with the op as a plain `u32`: a
/// premul-sum op made by `ncclRedOpCreatePreMulSum` is not one of the values of cudarc's
/// `ncclRedOp_t` enum, so passing it through that enum would be undefined behaviour.
pub(crate) struct RedFns {
    pub all_reduce: ElementwiseRedFn,
    pub reduce_scatter: ElementwiseRedFn,
    pub reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        sys::ncclDataType_t,
        u32,
        c_int,
        sys::ncclComm_t,
        sys::cudaStream_t,
    ) -> sys::ncclResult_t,
    pub premul_create:
        unsafe extern "C" fn(*mut u32, *mut c_void, sys::ncclDataType_t, sys::ncclScalarResidence_t, sys::ncclComm_t) -> sys::ncclResult_t,
    pub op_destroy: unsafe extern "C" fn(u32, sys::ncclComm_t) -> sys::ncclResult_t,
}

static RED_FNS: OnceLock<Result<RedFns, String>> = OnceLock::new();

/// The reduce entry points. Call only after [`nccl_present`] returned `Ok`.
pub(crate) fn red_fns() -> Result<&'static RedFns, String> {
    RED_FNS
        .get_or_init(|| {
            let lib = std::panic::catch_unwind(|| unsafe { sys::culib() }).map_err(|_| "libnccl could not be loaded".to_string())?;
            macro_rules! sym {
                ($name:literal) => {
                    *unsafe { lib.get($name.as_bytes()) }.map_err(|e| format!("libnccl symbol {}: {e}", $name))?
                };
            }
            Ok(RedFns {
                all_reduce: sym!("ncclAllReduce"),
                reduce_scatter: sym!("ncclReduceScatter"),
                reduce: sym!("ncclReduce"),
                premul_create: sym!("ncclRedOpCreatePreMulSum"),
                op_destroy: sym!("ncclRedOpDestroy"),
            })
        })
        .as_ref()
        .map_err(|e| e.clone())
}

/// `22809` → `2.28.9`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

pub(crate) fn err_string(r: sys::ncclResult_t) -> String {
    let p = unsafe { sys::ncclGetErrorString(r) };
    let s = if p.is_null() { String::new() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() };
    format!("{r:?} ({s})")
}

fn last_error(comm: sys::ncclComm_t) -> String {
    let p = unsafe { sys::ncclGetLastError(comm) };
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A config for `ncclCommInitRankConfig` / `ncclCommSplit` (NCCL_CONFIG_INITIALIZER + blocking).
pub(crate) fn config(blocking: bool, lib_version: i32) -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    // SAFETY: a plain C struct of ints and pointers; every field is set below.
    let mut c: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = std::mem::size_of::<sys::ncclConfig_t>();
    c.magic = 0xcafe_beef;
    c.version = lib_version.min(22800) as u32;
    c.blocking = blocking as i32;
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.netName = std::ptr::null();
    c.splitShare = UNDEF;
    c.trafficClass = UNDEF;
    c.commName = std::ptr::null();
    c.collnetEnable = UNDEF;
    c.CTAPolicy = UNDEF;
    c.shrinkShare = UNDEF;
    c.nvlsCTAs = UNDEF;
    c.nChannelsPerNetPeer = UNDEF;
    c.nvlinkCentricSched = UNDEF;
    c
}

/// Why a launch did not produce an enqueued op.
#[derive(Debug)]
pub(crate) enum LaunchError {
    /// The communicator was aborted earlier (the reason).
    Aborted(String),
    /// NCCL refused or failed the call (message with NCCL's last error).
    Nccl(String),
    /// The group was still being enqueued at the deadline; the communicator has been aborted.
    Timeout,
}

struct RawComm(sys::ncclComm_t);
unsafe impl Send for RawComm {}

struct Inner {
    /// Null once aborted or destroyed.
    raw: RawComm,
    aborted: Option<String>,
}

/// One NCCL communicator and the device whose stream it runs on.
pub(crate) struct Comm {
    pub dev: Arc<Device>,
    pub nranks: usize,
    pub rank: usize,
    pub blocking: bool,
    pub lib_version: i32,
    /// Locked by the progress thread for every launch: on lines of its own, away from the
    /// `Arc`'s counts, which the issuing thread changes on every op (a completion's handle).
    inner: Padded<Mutex<Inner>>,
    /// The abort reason, readable without waiting for a launch that holds `inner`.
    reason: Mutex<Option<String>>,
    /// `reason` is set (raised under its lock, right after it is set, never lowered): lets
    /// [`Comm::aborted`] answer the common "not aborted" with one atomic load, without the lock
    /// that the caller's issue, the progress thread's launch and every completion poll would
    /// otherwise all take (a cache line bouncing between threads on every op).
    has_reason: AtomicBool,
    /// Set (before anything else) by [`Comm::abort`]: the poll loops of a thread holding
    /// `inner` (launch, split) check it and let go, so an abort never waits behind a launch.
    abort_requested: AtomicBool,
    /// Where the teardown runs (see [`Comm::set_teardown`]); unset: on the dropping thread.
    teardown_via: OnceLock<TeardownVia>,
    /// The stream its NCCL calls are enqueued on: the device's shared stream, or (a direction
    /// communicator of point-to-point, see `direction`) a stream of its own, `own_stream`.
    pub stream: sys::cudaStream_t,
    own_stream: Option<Arc<OwnedStream>>,
    /// Communicators that live and die with this one (its point-to-point directions): an
    /// abort of this one aborts them too.
    children: Mutex<Vec<std::sync::Weak<Comm>>>,
    /// The blocking twin (see [`Comm::make_twin`]) that runs this communicator's groups; null
    /// when there is none (then groups run on the non-blocking communicator itself, polled).
    twin: AtomicPtr<sys::ncclComm>,
    /// Where a launch stands with the twin: [`TWIN_IDLE`], [`TWIN_INSIDE`] a blocking NCCL call
    /// (ended from another thread by [`Comm::abort`] or the progress thread's watchdog),
    /// [`TWIN_ABORTING`], [`TWIN_GONE`].
    twin_state: Padded<AtomicU8>,
    /// The deadline of the blocking call in progress on the twin (nanoseconds since [`epoch`]).
    twin_deadline: Padded<AtomicU64>,
    /// Set when this communicator was given a twin at creation (every rank alike): its
    /// subgroups get one too, whatever has happened to this one's since.
    wants_twin: AtomicBool,
}

/// What a new twin's first group connects (see [`Comm::connect_twin`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TwinConnect {
    /// The collectives' algorithms (a world or subgroup communicator).
    Collectives,
    /// The pair's point to point (a two-rank direction communicator).
    PeerToPeer,
}

/// The direction communicators whose blocking calls on their twin the twin watchdog looks at
/// ([`Comm::watch_twin`]); whether that thread runs.
static WATCHED: Mutex<(Vec<Weak<Comm>>, bool)> = Mutex::new((Vec::new(), false));

/// How often the twin watchdog looks (as the progress thread's watchdog does).
const TWIN_WATCH_EVERY: Duration = Duration::from_millis(2);

/// No NCCL call in progress on the twin.
const TWIN_IDLE: u8 = 0;
/// The progress thread is inside a blocking NCCL call on the twin (it holds `inner`).
const TWIN_INSIDE: u8 = 1;
/// Another thread is running `ncclCommAbort` on the twin, to end that call.
const TWIN_ABORTING: u8 = 2;
/// The twin is aborted or torn down (or there is none).
const TWIN_GONE: u8 = 3;

/// How long [`Comm::abort`] lets a call inside the twin return by itself before it ends the
/// call with `ncclCommAbort` (a healthy enqueue takes microseconds).
const TWIN_GRACE: Duration = Duration::from_millis(20);

/// The zero of [`Comm::twin_deadline`]'s clock.
fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn since_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

// SAFETY: the raw handles (communicator under its mutex, stream) may be used from any thread
// of the process; NCCL's one-thread-per-communicator rule is kept by the progress thread.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// A CUDA stream of a direction communicator, destroyed when its communicator and teardown are
/// done with it (the driver frees it once its pending work has finished).
pub(crate) struct OwnedStream(pub cudarc::driver::sys::CUstream);
unsafe impl Send for OwnedStream {}
unsafe impl Sync for OwnedStream {}
impl Drop for OwnedStream {
    fn drop(&mut self) {
        unsafe {
            let _ = cudarc::driver::result::stream::destroy(self.0);
        }
    }
}

/// A direction communicator whose `ncclCommInitRankConfig` (non-blocking) is in progress;
/// aborted if dropped before it is ready.
pub(crate) struct PendingInit {
    raw: RawComm,
    dev: Arc<Device>,
    rank: usize,
    lib_version: i32,
}

impl PendingInit {
    /// One look: `Some(Ok(comm))` ready (on a new stream of its own), `Some(Err)` failed (and
    /// aborted), `None` still in progress.
    pub fn poll(&mut self) -> Option<Result<Comm, String>> {
        let mut state = sys::ncclResult_t::ncclInProgress;
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw.0, &mut state) };
        let failed = |e: sys::ncclResult_t| format!("ncclCommInitRankConfig (direction): {}: {}", err_string(e), last_error(self.raw.0));
        let err = if r != sys::ncclResult_t::ncclSuccess {
            failed(r)
        } else {
            match state {
                sys::ncclResult_t::ncclInProgress => return None,
                sys::ncclResult_t::ncclSuccess => {
                    let stream = match cudarc::driver::result::stream::create(cudarc::driver::result::stream::StreamKind::NonBlocking) {
                        Ok(s) => s,
                        Err(e) => {
                            let raw = std::mem::replace(&mut self.raw, RawComm(std::ptr::null_mut()));
                            abort_raw(raw.0);
                            return Some(Err(crate::cuda::derr("cuStreamCreate (direction)", e)));
                        }
                    };
                    let raw = std::mem::replace(&mut self.raw, RawComm(std::ptr::null_mut()));
                    let mut c = Comm::from_raw(self.dev.clone(), 2, self.rank, false, self.lib_version, raw);
                    c.stream = stream as sys::cudaStream_t;
                    c.own_stream = Some(Arc::new(OwnedStream(stream)));
                    return Some(Ok(c));
                }
                e => failed(e),
            }
        };
        let raw = std::mem::replace(&mut self.raw, RawComm(std::ptr::null_mut()));
        abort_raw(raw.0);
        Some(Err(err))
    }
}

impl Drop for PendingInit {
    fn drop(&mut self) {
        if !self.raw.0.is_null() {
            let raw = std::mem::replace(&mut self.raw, RawComm(std::ptr::null_mut()));
            abort_raw(raw.0);
        }
    }
}

fn ok_or_progress(r: sys::ncclResult_t) -> Result<bool, sys::ncclResult_t> {
    match r {
        sys::ncclResult_t::ncclSuccess => Ok(false),
        sys::ncclResult_t::ncclInProgress => Ok(true),
        e => Err(e),
    }
}

/// How [`wait_ready`] ended.
pub(crate) enum Ready {
    Done,
    Failed(sys::ncclResult_t),
    Deadline,
    /// An abort was requested meanwhile ([`Comm::abort`] from another thread).
    AbortRequested,
}

/// Polls a non-blocking communicator until its pending operation is done, the deadline passes
/// or (with `abort`) an abort is requested. `stalled` (fault injection, `enqueue:stall`) treats
/// the operation as still in progress.
pub(crate) fn wait_ready(comm: sys::ncclComm_t, deadline: Instant, stalled: bool, abort: Option<&AtomicBool>) -> Ready {
    poll_until(deadline, || {
        if abort.is_some_and(|a| a.load(Ordering::SeqCst)) {
            return Some(Ready::AbortRequested);
        }
        if stalled {
            return None;
        }
        let mut state = sys::ncclResult_t::ncclInProgress;
        let r = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        if r != sys::ncclResult_t::ncclSuccess {
            return Some(Ready::Failed(r));
        }
        match state {
            sys::ncclResult_t::ncclInProgress => None,
            sys::ncclResult_t::ncclSuccess => Some(Ready::Done),
            e => Some(Ready::Failed(e)),
        }
    })
    .unwrap_or(Ready::Deadline)
}

/// Creates a launch's premul-sum ops on `comm` (their handles in `premul`'s order); on a failure
/// the ones already created are destroyed again.
fn create_premul(comm: sys::ncclComm_t, premul: &[(sys::ncclDataType_t, [u8; 8])]) -> Result<Vec<u32>, LaunchError> {
    let mut ops: Vec<u32> = Vec::with_capacity(premul.len());
    if premul.is_empty() {
        return Ok(ops);
    }
    let f = red_fns().map_err(LaunchError::Nccl)?;
    for (t, scalar) in premul {
        let mut scalar = *scalar;
        let mut op = 0u32;
        let r = unsafe {
            (f.premul_create)(&mut op, scalar.as_mut_ptr() as *mut c_void, *t, sys::ncclScalarResidence_t::ncclScalarHostImmediate, comm)
        };
        if let Err(e) = ok_or_progress(r) {
            destroy_premul(comm, &ops);
            return Err(LaunchError::Nccl(format!("ncclRedOpCreatePreMulSum: {}: {}", err_string(e), last_error(comm))));
        }
        ops.push(op);
    }
    Ok(ops)
}

/// `calls` (NCCL calls on `comm`) as one group: `Ok(true)` when NCCL returned in progress (a
/// non-blocking communicator); a refused call or group end is named with NCCL's last error.
fn group(comm: sys::ncclComm_t, calls: impl FnOnce() -> Result<(), (String, sys::ncclResult_t)>) -> Result<bool, LaunchError> {
    let start = unsafe { sys::ncclGroupStart() };
    if let Err(e) = ok_or_progress(start) {
        return Err(LaunchError::Nccl(format!("ncclGroupStart: {}", err_string(e))));
    }
    let body = calls();
    let end = unsafe { sys::ncclGroupEnd() };
    match (body, ok_or_progress(end)) {
        (Err((what, e)), _) => Err(LaunchError::Nccl(format!("{what}: {}: {}", err_string(e), last_error(comm)))),
        (Ok(()), Err(e)) => Err(LaunchError::Nccl(format!("ncclGroupEnd: {}: {}", err_string(e), last_error(comm)))),
        (Ok(()), Ok(pending)) => Ok(pending),
    }
}

/// Destroys premul-sum ops made by [`create_premul`].
fn destroy_premul(comm: sys::ncclComm_t, ops: &[u32]) {
    if let Ok(f) = red_fns() {
        for op in ops {
            unsafe { (f.op_destroy)(*op, comm) };
        }
    }
}

/// Runs `ncclCommAbort` on a helper thread; waits at most [`ABORT_WAIT`].
fn abort_raw(raw: sys::ncclComm_t) {
    let raw = RawComm(raw);
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("nccl-abort".into()).spawn(move || {
        let raw = raw;
        unsafe {
            let _ = sys::ncclCommAbort(raw.0);
        }
        let _ = tx.send(());
    });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(ABORT_WAIT);
    }
}

impl Comm {
    /// `ncclCommInitRankConfig`, waited for up to `deadline`.
    pub fn init(
        dev: Arc<Device>,
        nranks: usize,
        rank: usize,
        id: sys::ncclUniqueId,
        blocking: bool,
        lib_version: i32,
        deadline: Instant,
    ) -> Result<Comm, String> {
        dev.bind()?;
        let mut cfg = config(blocking, lib_version);
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let r = unsafe { sys::ncclCommInitRankConfig(&mut raw, nranks as i32, id, rank as i32, &mut cfg) };
        let pending = ok_or_progress(r).map_err(|e| format!("ncclCommInitRankConfig: {}", err_string(e)))?;
        if pending || !blocking {
            if raw.is_null() {
                return Err("ncclCommInitRankConfig returned no communicator".into());
            }
            match wait_ready(raw, deadline, false, None) {
                Ready::Done => {}
                Ready::Failed(e) => {
                    let msg = format!("ncclCommInitRankConfig: {}: {}", err_string(e), last_error(raw));
                    abort_raw(raw);
                    return Err(msg);
                }
                Ready::Deadline | Ready::AbortRequested => {
                    abort_raw(raw);
                    return Err(format!("ncclCommInitRankConfig did not finish in time (rank {rank} of {nranks}): a peer did not join"));
                }
            }
        }
        Ok(Comm::from_raw(dev, nranks, rank, blocking, lib_version, RawComm(raw)))
    }

    fn from_raw(dev: Arc<Device>, nranks: usize, rank: usize, blocking: bool, lib_version: i32, raw: RawComm) -> Comm {
        let stream = dev.stream as sys::cudaStream_t;
        Comm {
            dev,
            nranks,
            rank,
            blocking,
            lib_version,
            inner: Padded(Mutex::new(Inner { raw, aborted: None })),
            reason: Mutex::new(None),
            has_reason: AtomicBool::new(false),
            abort_requested: AtomicBool::new(false),
            teardown_via: OnceLock::new(),
            stream,
            own_stream: None,
            children: Mutex::new(Vec::new()),
            twin: AtomicPtr::new(std::ptr::null_mut()),
            twin_state: Padded(AtomicU8::new(TWIN_GONE)),
            twin_deadline: Padded(AtomicU64::new(0)),
            wants_twin: AtomicBool::new(false),
        }
    }

    /// Splits a *blocking* twin off this (non-blocking) communicator, with all of its ranks
    /// (collective: every rank calls it at the same point), and runs every later group on it
    /// (see **Fast launch** in the crate docs). The split itself is asynchronous (a non-blocking
    /// parent), polled up to `deadline`; any failure aborts this communicator.
    ///
    /// Why: a non-blocking communicator hands every group to a thread NCCL starts for it, which
    /// must be polled to completion before the next call (about 50 us per launch on 2 x H200,
    /// against about 6 us on a blocking one). A blocking call cannot be polled against its
    /// deadline; instead the progress thread's watchdog (or any [`Comm::abort`]) ends a call
    /// that overruns it with `ncclCommAbort` on the twin from another thread, which makes the
    /// call return (measured on NCCL 2.28.3: a first launch waiting for an absent peer's
    /// connection returned an error right after the abort).
    pub fn make_twin(&self, deadline: Instant) -> Result<(), String> {
        self.make_twin_then(deadline, TwinConnect::Collectives)
    }

    /// [`Comm::make_twin`] for a two-rank direction communicator of point to point (see
    /// `direction`): the twin's first group is a send and a receive of 8 bytes with the peer,
    /// which connects the pair (NCCL connects point to point lazily too, inside a first launch
    /// that waits for the peer). Both ranks of the direction call it, on a thread of their own
    /// (`direction` never lets the progress thread wait for a peer), right after the direction's
    /// `init`, when both are there.
    pub fn make_p2p_twin(&self, deadline: Instant) -> Result<(), String> {
        self.make_twin_then(deadline, TwinConnect::PeerToPeer)
    }

    fn make_twin_then(&self, deadline: Instant, connect: TwinConnect) -> Result<(), String> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &inner.aborted {
            return Err(format!("the communicator was aborted: {why}"));
        }
        self.wants_twin.store(true, Ordering::SeqCst);
        let parent = inner.raw.0;
        let mut cfg = config(true, self.lib_version);
        // Nothing shared with the parent (not even through NCCL_COMM_SPLIT_SHARE_RESOURCES):
        // the twin is aborted on its own, from another thread, and released beside it.
        cfg.splitShare = 0;
        let slot: *mut sys::ncclComm_t = Box::into_raw(Box::new(std::ptr::null_mut()));
        // SAFETY: reclaims the slot once NCCL can no longer write it.
        let free_slot = || unsafe { *Box::from_raw(slot) };
        let r = unsafe { sys::ncclCommSplit(parent, 0, self.rank as i32, slot, &mut cfg) };
        if let Err(e) = ok_or_progress(r) {
            let _ = free_slot();
            let msg = format!("ncclCommSplit (blocking twin): {}: {}", err_string(e), last_error(parent));
            self.abort_locked(inner, msg.clone());
            return Err(msg);
        }
        match wait_ready(parent, deadline, false, Some(&self.abort_requested)) {
            Ready::Done => {}
            other => {
                // NCCL may still hold the slot: leak it.
                let msg = match other {
                    Ready::Failed(e) => format!("ncclCommSplit (blocking twin): {}: {}", err_string(e), last_error(parent)),
                    _ => "ncclCommSplit (blocking twin) did not finish before the deadline (a peer did not join)".to_string(),
                };
                self.abort_locked(inner, msg.clone());
                return Err(msg);
            }
        }
        let raw = free_slot();
        if raw.is_null() {
            let msg = "ncclCommSplit (blocking twin) returned no communicator".to_string();
            self.abort_locked(inner, msg.clone());
            return Err(msg);
        }
        // An abort requested meanwhile (from another thread: the twin may be made off the
        // progress thread) ends this wait too.
        match wait_ready(raw, deadline, false, Some(&self.abort_requested)) {
            Ready::Done => {}
            other => {
                abort_raw(raw);
                let msg = match other {
                    Ready::Failed(e) => format!("ncclCommSplit (blocking twin, new communicator): {}", err_string(e)),
                    Ready::AbortRequested => {
                        format!("ncclCommSplit (blocking twin): the communicator was aborted ({})", self.aborted().unwrap_or_default())
                    }
                    _ => "ncclCommSplit (blocking twin) did not finish before the deadline".to_string(),
                };
                self.abort_locked(inner, msg.clone());
                return Err(msg);
            }
        }
        self.twin.store(raw, Ordering::SeqCst);
        self.twin_state.store(TWIN_IDLE, Ordering::SeqCst);
        drop(inner);
        self.connect_twin(deadline, connect)
    }

    /// Runs the twin's first collective (a one-element all-reduce) now, while every rank is
    /// here (creating the twin is collective): NCCL connects a communicator lazily, inside its
    /// first launch, which waits for the peers there. Left to a program's first collective on a
    /// new group, that wait would hold the progress thread while a peer waits for a send queued
    /// behind it (rank 0 `all_reduce; isend(1)` against rank 1 `irecv(0); wait; all_reduce`).
    /// Bounded by `deadline`: a scoped watchdog aborts the twin if the launch is still inside
    /// NCCL then (a peer gone right after the split), and the device wait has the same deadline.
    fn connect_twin(&self, deadline: Instant, connect: TwinConnect) -> Result<(), String> {
        // Collectives: an all-gather of 8 bytes per rank (what a validation header exchange
        // is) and a one-element all-reduce, in one group: the algorithms the header exchange
        // and small collectives use. Send / recv-based collectives (all_to_all, gather,
        // scatter) connect their peers on first use (see **Fast launch**). Point to point: a
        // send and a receive of 8 bytes with the peer, in one group (both ways at once).
        let n = self.nranks as u64;
        // On this communicator's own stream (a direction's, for point to point): a block the
        // collectives' stream freed may still be in use there.
        let buf = if connect == TwinConnect::PeerToPeer {
            self.dev.alloc_on(self.stream as cudarc::driver::sys::CUstream, 8 * n as usize + 16)?
        } else {
            self.dev.alloc(8 * n as usize + 16)?
        };
        let (recv, send, red) = (buf.ptr, buf.ptr + 8 * n, buf.ptr + 8 * n + 8);
        let done = AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            let guard = std::thread::Builder::new().name("nccl-connect-watchdog".into()).spawn_scoped(s, || {
                while !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(2));
                    if self.twin_overdue() {
                        self.abort("the blocking twin's first collective (its connection) was still inside NCCL at the deadline: a peer did not join".into());
                        return;
                    }
                }
            });
            if let Err(e) = guard {
                return Err(format!("connecting the blocking twin: starting its watchdog: {e}"));
            }
            let peer = (1 - self.rank.min(1)) as i32;
            let r = self
                .launch(deadline, false, &[], |c, st, _| unsafe {
                    if connect == TwinConnect::PeerToPeer {
                        let u8t = sys::ncclDataType_t::ncclUint8;
                        crate::worker::check(
                            sys::ncclSend(send as *const c_void, 8, u8t, peer, c, st),
                            "ncclSend (connecting the blocking twin)",
                        )?;
                        return crate::worker::check(
                            sys::ncclRecv(recv as *mut c_void, 8, u8t, peer, c, st),
                            "ncclRecv (connecting the blocking twin)",
                        );
                    }
                    crate::worker::check(
                        sys::ncclAllGather(send as *const c_void, recv as *mut c_void, 8, sys::ncclDataType_t::ncclUint8, c, st),
                        "ncclAllGather (connecting the blocking twin)",
                    )?;
                    crate::worker::check(
                        sys::ncclAllReduce(
                            red as *const c_void,
                            red as *mut c_void,
                            1,
                            sys::ncclDataType_t::ncclInt32,
                            sys::ncclRedOp_t::ncclSum,
                            c,
                            st,
                        ),
                        "ncclAllReduce (connecting the blocking twin)",
                    )
                })
                .map_err(|e| match e {
                    LaunchError::Aborted(why) => format!("connecting the blocking twin: the communicator was aborted ({why})"),
                    LaunchError::Nccl(m) => format!("connecting the blocking twin: {m}"),
                    LaunchError::Timeout => {
                        "connecting the blocking twin: its first collective was not enqueued before the deadline".into()
                    }
                })
                // This communicator's stream (a direction's own, for point to point), not the
                // device's: a direction connecting never waits for the collectives.
                .and_then(|()| {
                    match crate::cuda::Event::record_on(self.stream as cudarc::driver::sys::CUstream).and_then(|ev| ev.wait_until(deadline))
                    {
                        Ok(true) => Ok(()),
                        Ok(false) => {
                            Err("connecting the blocking twin: its first collective did not finish before the deadline".to_string())
                        }
                        Err(e) => Err(format!("connecting the blocking twin: {e}")),
                    }
                });
            done.store(true, Ordering::SeqCst);
            r
        });
        if r.is_ok() {
            drop(buf);
        } else {
            // The connect group may still be live on the device: its memory is never reused.
            std::mem::forget(buf);
        }
        if let Err(e) = &r {
            if self.aborted().is_none() {
                self.abort(e.clone());
            }
        }
        r
    }

    /// Puts this communicator under the twin watchdog: a blocking call on its twin still
    /// inside NCCL past the call's deadline gets the communicator aborted, which ends the call
    /// (what the progress thread's watchdog does for the running job's communicator; a
    /// direction's groups are launched outside any job). One watchdog thread per process runs
    /// while some watched communicator is alive.
    pub fn watch_twin(self: &Arc<Self>) {
        let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        w.0.push(Arc::downgrade(self));
        if w.1 {
            return;
        }
        let started = std::thread::Builder::new().name("nccl-twin-watchdog".into()).spawn(|| loop {
            std::thread::sleep(TWIN_WATCH_EVERY);
            let live: Vec<Arc<Comm>> = {
                let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
                w.0.retain(|c| c.strong_count() > 0);
                if w.0.is_empty() {
                    w.1 = false;
                    return;
                }
                w.0.iter().filter_map(|c| c.upgrade()).collect()
            };
            for c in live.iter().filter(|c| c.twin_overdue()) {
                c.abort(
                    "a point-to-point launch was still inside NCCL at its deadline (the peer never connected?); ended by the twin watchdog"
                        .into(),
                );
            }
        });
        // Without the thread, a stuck call still ends at the next abort of the communicator
        // (its op's deadline, or the parent's abort).
        w.1 = started.is_ok();
    }

    /// Whether this communicator was made to launch on a blocking twin ([`Comm::make_twin`]):
    /// the same on every rank (unlike [`Comm::has_twin`], which turns false once it is aborted).
    pub fn wants_twin(&self) -> bool {
        self.wants_twin.load(Ordering::SeqCst)
    }

    /// Whether groups run on a blocking twin (see [`Comm::make_twin`]).
    pub fn has_twin(&self) -> bool {
        !self.twin.load(Ordering::SeqCst).is_null()
    }

    /// The progress thread's watchdog: `true` while a blocking call on the twin runs past the
    /// deadline it was given.
    pub fn twin_overdue(&self) -> bool {
        self.twin_state.load(Ordering::SeqCst) == TWIN_INSIDE && since_epoch(Instant::now()) > self.twin_deadline.load(Ordering::SeqCst)
    }

    /// Ends a blocking call in progress on the twin from this thread (`ncclCommAbort`, NCCL's
    /// way to end a hung call from another thread; bounded by [`ABORT_WAIT`]). The thread
    /// inside returns and carries out the rest of the abort.
    fn abort_twin_inside(&self) {
        if self.twin_state.compare_exchange(TWIN_INSIDE, TWIN_ABORTING, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            let raw = self.twin.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !raw.is_null() {
                let _ = self.dev.bind();
                abort_raw(raw);
            }
            self.twin_state.store(TWIN_GONE, Ordering::SeqCst);
        }
    }

    /// Takes the twin out (for an abort or a teardown) unless a call is inside it; null if none.
    fn take_twin(&self) -> sys::ncclComm_t {
        match self.twin_state.compare_exchange(TWIN_IDLE, TWIN_GONE, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => self.twin.swap(std::ptr::null_mut(), Ordering::SeqCst),
            Err(_) => std::ptr::null_mut(),
        }
    }

    /// Starts a non-blocking `ncclCommInitRankConfig` of a two-rank direction communicator
    /// (see `direction`); [`PendingInit::poll`] finishes it. Never waits for the peer.
    pub fn start_init(dev: Arc<Device>, rank: usize, id: sys::ncclUniqueId, lib_version: i32) -> Result<PendingInit, String> {
        dev.bind()?;
        let mut cfg = config(false, lib_version);
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let r = unsafe { sys::ncclCommInitRankConfig(&mut raw, 2, id, rank as i32, &mut cfg) };
        if let Err(e) = ok_or_progress(r) {
            if !raw.is_null() {
                abort_raw(raw);
            }
            return Err(format!("ncclCommInitRankConfig (direction): {}", err_string(e)));
        }
        if raw.is_null() {
            return Err("ncclCommInitRankConfig (direction) returned no communicator".into());
        }
        Ok(PendingInit { raw: RawComm(raw), dev, rank, lib_version })
    }

    /// Makes `child` live and die with this communicator: an abort of this one aborts it too
    /// (at once, if this one is aborted already).
    pub fn adopt(&self, child: &Arc<Comm>) {
        self.children.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(child));
        if let Some(why) = self.aborted() {
            child.abort(format!("its parent communicator was aborted: {why}"));
        }
    }

    /// Aborts every child communicator (see [`Comm::adopt`]), all at once: each abort is
    /// bounded by [`ABORT_WAIT`] (twice: its lock, then `ncclCommAbort`), and the children (a
    /// subgroup, the point-to-point directions) are aborted side by side so that the whole
    /// cascade stays within that bound instead of adding one bound per child.
    fn abort_children(&self, reason: &str) {
        let kids: Vec<Arc<Comm>> = self.children.lock().unwrap_or_else(|e| e.into_inner()).drain(..).filter_map(|w| w.upgrade()).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut started = 0;
        for k in kids {
            let why = format!("its parent communicator was aborted: {reason}");
            let (kid, tx) = (k.clone(), tx.clone());
            match std::thread::Builder::new().name("nccl-abort-child".into()).spawn(move || {
                kid.abort(why);
                let _ = tx.send(());
            }) {
                Ok(_) => started += 1,
                Err(_) => k.abort(format!("its parent communicator was aborted: {reason}")),
            }
        }
        let until = Instant::now() + ABORT_WAIT * 2 + Duration::from_secs(1);
        for _ in 0..started {
            if rx.recv_timeout(until.saturating_duration_since(Instant::now())).is_err() {
                return; // detached: each ends at its own bound
            }
        }
    }

    /// `ncclCommSplit` (collective over this communicator). `None` for ranks not in the new group.
    ///
    /// NCCL's asynchronous init may write the new communicator's handle after `ncclCommSplit`
    /// returned, so the slot lives on the heap and is leaked (8 bytes) unless the split was seen
    /// to finish. Every failure of the split aborts the parent: it is never left in an error
    /// state un-aborted.
    pub fn split(&self, member: bool, key: usize, new_nranks: usize, deadline: Instant) -> Result<Option<Comm>, LaunchError> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &inner.aborted {
            return Err(LaunchError::Aborted(why.clone()));
        }
        let parent = inner.raw.0;
        let mut cfg = config(self.blocking, self.lib_version);
        let slot: *mut sys::ncclComm_t = Box::into_raw(Box::new(std::ptr::null_mut()));
        // SAFETY: reclaims the slot once NCCL can no longer write it.
        let free_slot = || unsafe { *Box::from_raw(slot) };
        let color = if member { 0 } else { -1 }; // NCCL_SPLIT_NOCOLOR
        let r = unsafe { sys::ncclCommSplit(parent, color, key as i32, slot, &mut cfg) };
        if let Err(e) = ok_or_progress(r) {
            // Refused before any asynchronous work started: the slot is ours again.
            let _ = free_slot();
            let msg = format!("ncclCommSplit: {}: {}", err_string(e), last_error(parent));
            self.abort_locked(inner, msg.clone());
            return Err(LaunchError::Nccl(msg));
        }
        // The split is done when the parent (and the child, for members) are ready.
        match wait_ready(parent, deadline, false, Some(&self.abort_requested)) {
            Ready::Done => {}
            Ready::Failed(e) => {
                // NCCL may still hold the slot: leak it.
                let msg = format!("ncclCommSplit: {}: {}", err_string(e), last_error(parent));
                self.abort_locked(inner, msg.clone());
                return Err(LaunchError::Nccl(msg));
            }
            Ready::Deadline => {
                self.abort_locked(inner, "ncclCommSplit did not finish before the deadline".into());
                return Err(LaunchError::Timeout);
            }
            Ready::AbortRequested => {
                let why = self.aborted().unwrap_or_default();
                self.abort_locked(inner, why.clone());
                return Err(LaunchError::Aborted(why));
            }
        }
        drop(inner);
        // The parent is ready: NCCL has written the slot (null for non-members).
        let raw = free_slot();
        if !member || raw.is_null() {
            return Ok(None);
        }
        match wait_ready(raw, deadline, false, None) {
            Ready::Done => {}
            Ready::Failed(e) => {
                abort_raw(raw);
                return Err(LaunchError::Nccl(format!("ncclCommSplit (new communicator): {}", err_string(e))));
            }
            Ready::Deadline | Ready::AbortRequested => {
                abort_raw(raw);
                return Err(LaunchError::Timeout);
            }
        }
        let child = Comm::from_raw(self.dev.clone(), new_nranks, key, self.blocking, self.lib_version, RawComm(raw));
        // A subgroup launches the way its parent does (every member decides alike).
        if self.wants_twin.load(Ordering::SeqCst) {
            child.make_twin(deadline).map_err(LaunchError::Nccl)?;
        }
        Ok(Some(child))
    }

    /// Runs `calls` (NCCL calls on the communicator and stream) as one group and waits, up to
    /// `deadline`, until the group is enqueued. On deadline the communicator is aborted; an
    /// abort requested meanwhile ([`Comm::abort`]) ends the wait at once and is carried out
    /// here. `premul` lists premul-sum ops to create first (NCCL type, scalar bytes); `calls`
    /// gets their handles in the same order; they are destroyed once the group is enqueued.
    /// `stall` (fault injection) treats the group as still in progress.
    pub fn launch(
        &self,
        deadline: Instant,
        stall: bool,
        premul: &[(sys::ncclDataType_t, [u8; 8])],
        calls: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t, &[u32]) -> Result<(), (String, sys::ncclResult_t)>,
    ) -> Result<(), LaunchError> {
        let inner = self.lock_live()?;
        let twin = self.twin.load(Ordering::SeqCst);
        if !twin.is_null() {
            return self.launch_twin(inner, twin, deadline, stall, premul, calls);
        }
        let comm = inner.raw.0;
        let stream = self.stream;
        let ops = create_premul(comm, premul)?;
        let destroy_ops = |ops: &[u32]| destroy_premul(comm, ops);
        let mut result = group(comm, || calls(comm, stream, &ops));
        let mut requested = false;
        if let Ok(pending) = result {
            result = Ok(false);
            if pending || !self.blocking {
                match wait_ready(comm, deadline, stall, Some(&self.abort_requested)) {
                    Ready::Done => {}
                    Ready::Failed(e) => {
                        result = Err(LaunchError::Nccl(format!("NCCL async error: {}: {}", err_string(e), last_error(comm))))
                    }
                    Ready::Deadline => result = Err(LaunchError::Timeout),
                    Ready::AbortRequested => {
                        requested = true;
                        result = Err(LaunchError::Aborted(self.aborted().unwrap_or_default()));
                    }
                }
            }
        }
        match result {
            Ok(_) if self.abort_requested.load(Ordering::SeqCst) => {
                // Requested while this thread was inside NCCL (a blocking communicator).
                let why = self.aborted().unwrap_or_default();
                self.abort_locked(inner, why.clone());
                Err(LaunchError::Aborted(why))
            }
            Ok(_) => {
                destroy_ops(&ops);
                Ok(())
            }
            Err(LaunchError::Timeout) => {
                self.abort_locked(inner, "an NCCL group was still being enqueued at its deadline".into());
                Err(LaunchError::Timeout)
            }
            Err(e) if requested => {
                // The group may still be in progress: leave the premul ops to the abort.
                self.abort_locked(inner, self.aborted().unwrap_or_default());
                Err(e)
            }
            Err(e) => {
                destroy_ops(&ops);
                Err(e)
            }
        }
    }

    /// [`Comm::launch`] on the blocking twin: the group is enqueued when `ncclGroupEnd`
    /// returns. The call is marked inside the twin with its deadline, so that the watchdog (at
    /// the deadline) or an abort request ends it from another thread; the abort is then carried
    /// out here, and the launch fails with [`LaunchError::Timeout`] (past the deadline) or
    /// [`LaunchError::Aborted`].
    fn launch_twin(
        &self,
        inner: MutexGuard<'_, Inner>,
        comm: sys::ncclComm_t,
        deadline: Instant,
        stall: bool,
        premul: &[(sys::ncclDataType_t, [u8; 8])],
        calls: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t, &[u32]) -> Result<(), (String, sys::ncclResult_t)>,
    ) -> Result<(), LaunchError> {
        self.twin_deadline.store(since_epoch(deadline), Ordering::SeqCst);
        if self.twin_state.compare_exchange(TWIN_IDLE, TWIN_INSIDE, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            let why = self.aborted().unwrap_or_else(|| "the communicator's blocking twin is gone".into());
            self.abort_locked(inner, why.clone());
            return Err(LaunchError::Aborted(why));
        }
        // An abort requested just before the state changed: back out before entering NCCL
        // (`abort` sets the flag before it looks at the state, both sequentially consistent,
        // so one of the two sides sees the other).
        if self.abort_requested.load(Ordering::SeqCst) {
            if self.twin_state.compare_exchange(TWIN_INSIDE, TWIN_IDLE, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                let _ = poll_until(Instant::now() + ABORT_WAIT, || (self.twin_state.load(Ordering::SeqCst) == TWIN_GONE).then_some(()));
            }
            let why = self.aborted().unwrap_or_default();
            self.abort_locked(inner, why.clone());
            return Err(LaunchError::Aborted(why));
        }
        // A panic inside the calls must not leave the twin marked busy (every later launch
        // would fail and nothing would tear it down): it becomes an abort request.
        struct Unwind<'a>(&'a Comm);
        impl Drop for Unwind<'_> {
            fn drop(&mut self) {
                if std::thread::panicking()
                    && self.0.twin_state.compare_exchange(TWIN_INSIDE, TWIN_IDLE, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                {
                    self.0.set_reason(|| "a panic inside an NCCL launch".into());
                    self.0.abort_requested.store(true, Ordering::SeqCst);
                }
            }
        }
        let _unwind = Unwind(self);
        let (ops, mut result) = match create_premul(comm, premul) {
            Ok(ops) => (ops, Ok(())),
            Err(e) => (Vec::new(), Err(e)),
        };
        if result.is_ok() {
            result = group(comm, || calls(comm, self.stream, &ops)).map(|_| ());
        }
        if self.twin_state.compare_exchange(TWIN_INSIDE, TWIN_IDLE, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            // Ended from another thread (the watchdog at the deadline, or an abort request):
            // wait for that abort (bounded), then abort the rest here. The premul ops went
            // with the twin.
            let _ = poll_until(Instant::now() + ABORT_WAIT, || (self.twin_state.load(Ordering::SeqCst) == TWIN_GONE).then_some(()));
            let overdue = Instant::now() >= deadline;
            let why = self.aborted().unwrap_or_else(|| "NCCL's blocking call was ended from another thread".into());
            self.abort_locked(inner, why.clone());
            return Err(if overdue { LaunchError::Timeout } else { LaunchError::Aborted(why) });
        }
        let destroy_ops = |ops: &[u32]| destroy_premul(comm, ops);
        if result.is_ok() && stall {
            // Fault injection (`enqueue:stall`): the group counts as still being enqueued.
            if poll_until(deadline, || self.abort_requested.load(Ordering::SeqCst).then_some(())).is_none() {
                self.abort_locked(inner, "an NCCL group was still being enqueued at its deadline".into());
                return Err(LaunchError::Timeout);
            }
        }
        if self.abort_requested.load(Ordering::SeqCst) {
            let why = self.aborted().unwrap_or_default();
            self.abort_locked(inner, why.clone());
            return Err(LaunchError::Aborted(why));
        }
        destroy_ops(&ops);
        result
    }

    /// The communicator's lock, unless it is aborted: an abort requested while this thread
    /// waited for the lock is carried out here.
    fn lock_live(&self) -> Result<MutexGuard<'_, Inner>, LaunchError> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &inner.aborted {
            return Err(LaunchError::Aborted(why.clone()));
        }
        if let Some(why) = self.aborted() {
            self.abort_locked(inner, why.clone());
            return Err(LaunchError::Aborted(why));
        }
        Ok(inner)
    }

    /// Enqueues `calls` as one group without waiting for NCCL to accept it (a non-blocking
    /// communicator may finish it in the background, e.g. while it connects to the peer, which
    /// needs the peer's side): `Ok(true)` still in progress — poll [`Comm::group_ready`] before
    /// anything else is enqueued on this communicator or its stream. For the direction
    /// communicators of point to point, whose first group MUST NOT hold the progress thread
    /// while the peer is busy elsewhere.
    pub fn launch_nowait(
        &self,
        calls: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<(), (String, sys::ncclResult_t)>,
    ) -> Result<bool, LaunchError> {
        let inner = self.lock_live()?;
        let comm = inner.raw.0;
        group(comm, || calls(comm, self.stream)).map(|pending| pending || !self.blocking)
    }

    /// Whether the group [`Comm::launch_nowait`] started has been accepted (`Ok(true)`); an
    /// error or an abort is `Err`.
    pub fn group_ready(&self) -> Result<bool, LaunchError> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &inner.aborted {
            return Err(LaunchError::Aborted(why.clone()));
        }
        let mut state = sys::ncclResult_t::ncclInProgress;
        let r = unsafe { sys::ncclCommGetAsyncError(inner.raw.0, &mut state) };
        if r != sys::ncclResult_t::ncclSuccess {
            return Err(LaunchError::Nccl(format!("ncclCommGetAsyncError: {}", err_string(r))));
        }
        match state {
            sys::ncclResult_t::ncclInProgress => Ok(false),
            sys::ncclResult_t::ncclSuccess => Ok(true),
            e => Err(LaunchError::Nccl(format!("NCCL async error: {}: {}", err_string(e), last_error(inner.raw.0)))),
        }
    }

    /// The communicator's asynchronous error, if any (a remote peer gone, a failed kernel...).
    /// Never waits: `None` while another thread is inside an NCCL call on the communicator.
    pub fn async_error(&self) -> Option<String> {
        let inner = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if inner.raw.0.is_null() {
            return None;
        }
        // The twin runs the groups: a peer gone shows there. Not while a call is inside it
        // (`inner` is held then, so this cannot happen here; checked all the same).
        let twin = self.twin.load(Ordering::SeqCst);
        if !twin.is_null() && self.twin_state.load(Ordering::SeqCst) == TWIN_IDLE {
            let mut state = sys::ncclResult_t::ncclSuccess;
            let r = unsafe { sys::ncclCommGetAsyncError(twin, &mut state) };
            if r != sys::ncclResult_t::ncclSuccess {
                return Some(err_string(r));
            }
            match state {
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {}
                e => return Some(format!("{}: {}", err_string(e), last_error(twin))),
            }
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        let r = unsafe { sys::ncclCommGetAsyncError(inner.raw.0, &mut state) };
        if r != sys::ncclResult_t::ncclSuccess {
            return Some(err_string(r));
        }
        match state {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => None,
            e => Some(format!("{}: {}", err_string(e), last_error(inner.raw.0))),
        }
    }

    /// Why the communicator was aborted (or an abort was requested), if it was. Never waits
    /// for a launch in progress. Set before the abort starts, so an op whose completion is first
    /// observed after this turned `Some` is not trusted (see `completion`).
    pub fn aborted(&self) -> Option<String> {
        // Raised under the lock right after the reason is set (`set_reason`), before any abort
        // starts: a `false` here is the same answer the lock would have given a moment earlier.
        if !self.has_reason.load(Ordering::SeqCst) {
            return None;
        }
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records why the communicator ends (the first reason stays) and raises `has_reason`.
    fn set_reason(&self, why: impl FnOnce() -> String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        r.get_or_insert_with(why);
        self.has_reason.store(true, Ordering::SeqCst);
    }

    /// Aborts the communicator (idempotent; bounded in time). Later launches fail with `reason`.
    ///
    /// The request itself takes no lock a launch holds: it records the reason, raises
    /// `abort_requested` (the launch / split poll loops check it and let go, carrying the
    /// abort out themselves) and opens injected stream gates; then it takes the lock without
    /// blocking (`try_lock`, polled up to [`ABORT_WAIT`]) to run `ncclCommAbort`. If a thread
    /// stays inside an NCCL call past that (a blocking communicator), that thread carries the
    /// abort out when the call returns.
    pub fn abort(&self, reason: String) {
        self.set_reason(|| reason.clone());
        self.abort_requested.store(true, Ordering::SeqCst);
        self.dev.release_gates();
        let until = Instant::now() + ABORT_WAIT;
        // A launch inside a blocking call on the twin cannot look at the flag. A healthy one
        // returns within microseconds and then carries the abort out itself (it re-checks the
        // flag before it enters NCCL); one still inside after `TWIN_GRACE` is ended from here
        // (`ncclCommAbort` frees the communicator, so never under a call that is merely busy).
        let mut inside_since: Option<Instant> = None;
        loop {
            match self.inner.try_lock() {
                Ok(g) => return self.abort_locked(g, reason),
                Err(std::sync::TryLockError::Poisoned(e)) => return self.abort_locked(e.into_inner(), reason),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    if self.twin_state.load(Ordering::SeqCst) == TWIN_INSIDE {
                        if inside_since.get_or_insert_with(Instant::now).elapsed() >= TWIN_GRACE {
                            self.abort_twin_inside();
                        }
                    } else {
                        inside_since = None;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(std::sync::TryLockError::WouldBlock) => return self.abort_children(&reason),
            }
        }
    }

    /// The abort itself, with the lock held (released before `ncclCommAbort` runs).
    fn abort_locked(&self, mut inner: MutexGuard<'_, Inner>, reason: String) {
        self.set_reason(|| reason.clone());
        self.abort_requested.store(true, Ordering::SeqCst);
        self.dev.release_gates();
        if inner.aborted.is_some() {
            return;
        }
        inner.aborted = Some(reason.clone());
        let raw = std::mem::replace(&mut inner.raw, RawComm(std::ptr::null_mut()));
        let twin = self.take_twin();
        drop(inner);
        let _ = self.dev.bind();
        if !twin.is_null() {
            abort_raw(twin);
        }
        if !raw.0.is_null() {
            abort_raw(raw.0);
        }
        self.abort_children(&reason);
    }

    /// Takes the communicator out for teardown (later uses report it destroyed); `None` when
    /// it was aborted or torn down already.
    fn take_for_teardown(&self) -> Option<Teardown> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let raw = std::mem::replace(&mut inner.raw, RawComm(std::ptr::null_mut()));
        if raw.0.is_null() {
            return None;
        }
        inner.aborted.get_or_insert_with(|| "the communicator was destroyed".into());
        let twin = RawComm(self.take_twin());
        drop(inner);
        self.set_reason(|| "the communicator was destroyed".into());
        Some(Teardown { raw, twin, dev: self.dev.clone(), stream: self.stream, _own_stream: self.own_stream.clone() })
    }

    /// Where this communicator's teardown runs: the rank's progress thread (set by the
    /// backend), so that `ncclCommFinalize` never runs beside another NCCL call on this device.
    pub fn set_teardown(&self, via: TeardownVia) {
        let _ = self.teardown_via.set(via);
    }
}

/// Hands a [`Teardown`] to the progress thread; `Err` gives it back (the thread has stopped)
/// to be run where it is.
pub(crate) type TeardownVia = Box<dyn Fn(Teardown) -> Result<(), Teardown> + Send + Sync>;

/// A communicator taken out for teardown.
pub(crate) struct Teardown {
    raw: RawComm,
    /// The blocking twin (null if none): released beside the parent, on a helper thread.
    twin: RawComm,
    dev: Arc<Device>,
    /// The communicator's stream (checked idle first), kept alive until the teardown is done.
    stream: sys::cudaStream_t,
    _own_stream: Option<Arc<OwnedStream>>,
}
// SAFETY: raw handles, usable from any thread (run on the progress thread or the dropping one).
unsafe impl Send for Teardown {}

impl Teardown {
    /// Finalize + destroy when the stream is idle, abort otherwise. This thread waits at most
    /// about 5 s for the finalize / destroy (then aborts the parent: up to [`ABORT_WAIT`] more),
    /// or two [`ABORT_WAIT`]s when the stream was busy; a helper thread still inside NCCL after
    /// that is left there, holding what its communicator needs (the device, the stream).
    pub fn run(self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let raw = self.raw;
        let twin = self.twin;
        self.dev.release_gates();
        if self.dev.bind().is_err() {
            return;
        }
        // Work still queued (an un-waited collective whose peer never came) → abort at once.
        let idle = matches!(
            crate::cuda::Event::record_on(self.stream as cudarc::driver::sys::CUstream)
                .and_then(|e| e.wait_until(Instant::now() + Duration::from_millis(200))),
            Ok(true)
        );
        if !idle {
            if !twin.0.is_null() {
                abort_raw(twin.0);
            }
            abort_raw(raw.0);
            return;
        }
        // What a helper thread's NCCL call may still use after this thread stops waiting for it:
        // moved into the helper, so it goes only when NCCL has returned.
        let keep = (self.dev.clone(), self._own_stream.clone());
        // The twin (blocking, its stream idle) is finalized and destroyed on a helper thread
        // *beside* the parent's finalize and destroy: each takes about half a second (2 x
        // H200), and one after the other pushed a process that drops an un-waited collective
        // past the 1 s it has to exit. Independent communicators (the twin shares nothing with
        // its parent), each used by one thread. Not `ncclCommAbort`: on 2 x H200 it made that
        // exit take 1.01-1.07 s in 4 runs out of 4 (NCCL's proxy thread notices an abort only at
        // its next poll), against 5 / 5 passing with finalize + destroy. A twin with an
        // asynchronous error (a peer gone) is aborted instead, as is one whose finalize NCCL
        // fails; a finalize that never returns (a peer stalled mid-teardown) is left on its
        // thread, and this thread's wait still ends at `deadline`.
        let twin_done = (!twin.0.is_null()).then(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let keep = keep.clone();
            let spawned = std::thread::Builder::new().name("nccl-destroy".into()).spawn(move || {
                let (twin, keep) = (twin, keep);
                let _ = keep.0.bind();
                unsafe {
                    let mut state = sys::ncclResult_t::ncclSuccess;
                    let healthy = sys::ncclCommGetAsyncError(twin.0, &mut state) == sys::ncclResult_t::ncclSuccess
                        && state == sys::ncclResult_t::ncclSuccess;
                    if healthy && sys::ncclCommFinalize(twin.0) == sys::ncclResult_t::ncclSuccess {
                        let _ = sys::ncclCommDestroy(twin.0);
                    } else {
                        let _ = sys::ncclCommAbort(twin.0);
                    }
                }
                let _ = tx.send(());
                drop(keep);
            });
            (spawned, rx)
        });
        let wait_twin = |twin_done: Option<(std::io::Result<std::thread::JoinHandle<()>>, std::sync::mpsc::Receiver<()>)>| {
            if let Some((Ok(_), rx)) = twin_done {
                let _ = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100)));
            }
        };
        let fin = unsafe { sys::ncclCommFinalize(raw.0) };
        let finished = match ok_or_progress(fin) {
            Ok(false) => true,
            Ok(true) => matches!(wait_ready(raw.0, deadline, false, None), Ready::Done),
            Err(_) => false,
        };
        if !finished {
            abort_raw(raw.0);
            wait_twin(twin_done);
            return;
        }
        // After a finalize, destroy only frees this rank's resources; on a helper thread all
        // the same, so that the wait stays bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("nccl-destroy".into()).spawn(move || {
            let (raw, keep) = (raw, keep);
            let _ = keep.0.bind();
            unsafe {
                let _ = sys::ncclCommDestroy(raw.0);
            }
            let _ = tx.send(());
            drop(keep);
        });
        if spawned.is_ok() {
            let _ = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100)));
        }
        wait_twin(twin_done);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let Some(t) = self.take_for_teardown() else { return };
        match self.teardown_via.get() {
            Some(via) => {
                if let Err(t) = via(t) {
                    t.run();
                }
            }
            None => t.run(),
        }
    }
}

// ---- the backend's communicators: world init (rendezvous through the store) and new_group ----

use crate::board::Board;
use crate::comm; // the moved bodies name `comm::…` as they did from lib.rs
use crate::header::Header;
use crate::ops::Local;
use crate::worker::{Channel, Job, Progress};
use crate::{probe, NcclBackend, NcclBuffer};
use concord_core::{progress, validate_local, Backend, CallOp, CollectiveError, DType, OutstandingCounter, Variant, WorldInfo};
use cudarc::nccl::sys as nccl;

pub(crate) static GROUP_IDS: AtomicU64 = AtomicU64::new(1);

/// If `NCCL_NVLS_ENABLE` is unset, sets it to `0`, once per process, before this crate's first
/// CUDA or NCCL call of the process (the first `init`; NCCL reads it when a communicator is
/// created). Why this `set_var` is safe in a multi-threaded worker: Rust's own readers
/// (`std::env`) take the same lock as `set_var`; the C-level readers are CUDA's and NCCL's
/// threads, and none of ours exists yet at that point (later inits find the variable set and
/// never write it again). A program that starts CUDA on other threads before the first `init`
/// should set the variable itself (`dist/run-gpu.sh` does).
fn nvls_off_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
    });
}

/// The world's validation-header board (see `board`), or `None` when some rank cannot map it
/// (another host, another /dev/shm): rank 0 makes it and publishes its nonce through the store,
/// every other rank reports whether it opened it, and every rank reads every report, so all
/// ranks use it or none does. Rank 0 unlinks the name once every rank has reported.
fn world_board(
    store: &concord_store::Store,
    world: &WorldInfo,
    uid: u64,
    wanted: bool,
    deadline: Instant,
) -> std::result::Result<Option<Board>, String> {
    let (rank, ws) = (world.rank, world.world_size);
    let hlen = crate::header::header_len(ws);
    let key = format!("concord/nccl/{}/board/{uid:016x}", world.world_id);
    let name = format!("{}nccl-hdr-{uid:016x}", concord_core::world_prefix(&world.world_id));
    let store_err = |e: concord_store::StoreError| format!("the store: {e}");
    // Every read waits within the init deadline.
    let get = |k: &str| -> std::result::Result<Vec<u8>, String> {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        store.wait(&[k], left).map_err(store_err)?;
        store.get(k).map_err(store_err)
    };
    let mine = if rank == 0 {
        let nonce = crate::board::nonce();
        let b = if wanted { Board::create(&name, ws, 0, hlen, nonce) } else { Err("option header_board=0".into()) };
        let v = match &b {
            Ok(_) => nonce.to_string(),
            Err(e) => format!("none: {e}"),
        };
        store.set(&key, v.as_bytes()).map_err(store_err)?;
        b
    } else {
        let v = get(&key)?;
        let b = match String::from_utf8_lossy(&v).parse::<u64>() {
            Ok(_) if !wanted => Err("option header_board=0".into()),
            Ok(nonce) => Board::open(&name, ws, rank, hlen, nonce),
            Err(_) => Err(format!("rank 0 has no board ({})", String::from_utf8_lossy(&v))),
        };
        store.set(&format!("{key}/{rank}"), if b.is_ok() { b"1" } else { b"0" }).map_err(store_err)?;
        b
    };
    let mut everyone = true;
    for r in 1..ws {
        everyone &= get(&format!("{key}/{r}"))? == b"1";
    }
    if let Ok(b) = &mine {
        if rank == 0 {
            b.unlink();
        }
    }
    Ok(if everyone { mine.ok() } else { None })
}

impl NcclBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_comm(
        comm: Comm,
        label: String,
        op_timeout: Duration,
        validate: bool,
        init_time: Duration,
        gpus: usize,
        store: Option<Arc<concord_store::Store>>,
        p2p_key: String,
        progress: Arc<Progress>,
        faults: crate::fault::Faults,
        board: Option<Board>,
    ) -> std::result::Result<NcclBackend, String> {
        let dev = comm.dev.clone();
        comm.set_teardown(progress.teardown_via());
        let comm = Arc::new(comm);
        let faults = Arc::new(faults);
        let chan = Channel::new(comm.clone(), op_timeout, faults.clone(), store.clone(), p2p_key, progress.teardown_via(), board)?;
        let barrier_buf = NcclBuffer { mem: Arc::new(dev.alloc(4)?), offset: 0, dtype: DType::I32, shape: vec![1] };
        Ok(NcclBackend {
            progress,
            rank: comm.rank,
            ws: comm.nranks,
            label: label.into(),
            chan: Arc::new(chan),
            dev,
            seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
            nth: AtomicU64::new(0),
            faults,
            counter: OutstandingCounter::default(),
            op_timeout,
            validate: AtomicBool::new(validate),
            barrier_buf,
            init_time,
            gpus,
            store,
        })
    }

    pub(crate) fn init_impl(world: &WorldInfo) -> concord_core::Result<Self> {
        let started = Instant::now();
        let (rank, ws) = (world.rank, world.world_size);
        if ws == 0 || rank >= ws {
            return Err(CollectiveError::Backend(format!("nccl init: rank {rank} is not in a world of {ws}")));
        }
        // Options first: a bad one is named even on a machine without GPUs.
        let faults = crate::fault::Faults::from_world(world)
            .map_err(|e| CollectiveError::Backend(format!("nccl init on rank {rank}: option `fault`: {e}")))?;
        let flag = |key: &str, default: bool| {
            world.flag(key, default).map_err(|e| CollectiveError::Backend(format!("nccl init on rank {rank}: {e}")))
        };
        let validate = flag("validate", true)?;
        let header_board = flag("header_board", true)?;
        let blocking = flag("blocking", false)?;
        let fast_launch = flag("fast_launch", true)?;
        let alloc_cache = flag("alloc_cache", true)?;
        let batch = flag("batch", true)?;
        let one_rank_copy = crate::cuda::OneRankCopy::parse(world.option("one_rank_copy"))
            .map_err(|e| CollectiveError::Backend(format!("nccl init on rank {rank}: {e}")))?;
        let init_timeout = match world.option("init_timeout_ms") {
            None => world.op_timeout.max(Duration::from_secs(30)),
            Some(v) => Duration::from_millis(v.parse().map_err(|_| {
                CollectiveError::Backend(format!(
                    "nccl init on rank {rank}: backend option init_timeout_ms={v}: expected a whole number of milliseconds"
                ))
            })?),
        };
        // `progress_pin=N`: the progress thread on CPU N + local rank (a measuring aid: the
        // bench's raw loop pins its launching thread alike with `raw_pin=N`).
        let pin = match world.option("progress_pin") {
            None => None,
            Some(v) => Some(v.parse::<usize>().map_err(|_| {
                CollectiveError::Backend(format!("nccl init on rank {rank}: backend option progress_pin={v}: expected a CPU number"))
            })?),
        };
        if let Some(v) = world.option(concord_core::LOCAL_RANK_OPTION) {
            v.parse::<usize>().map_err(|_| {
                CollectiveError::Backend(format!(
                    "nccl init on rank {rank}: backend option {}={v}: expected a GPU index",
                    concord_core::LOCAL_RANK_OPTION
                ))
            })?;
        }
        // Last: it sets the process's fused mode, so only once every option is valid.
        crate::fused_gpu::set_mode(world.option("fused_overlap"))
            .map_err(|e| CollectiveError::Backend(format!("nccl init on rank {rank}: {e}")))?;
        nvls_off_once();
        let info = probe().map_err(|e| CollectiveError::Unsupported(format!("nccl: {e}")))?;
        // One GPU per rank of this host: a launcher's local rank picks it (a world Concord
        // launched itself is on one host, so there the local rank is the rank).
        let local = world.local_rank();
        if world.option(concord_core::LOCAL_RANK_OPTION).is_some() {
            if local >= info.gpus {
                return Err(CollectiveError::Unsupported(format!(
                    "nccl: local rank {local} needs GPU {local}, this host has {}",
                    info.gpus
                )));
            }
        } else if ws > info.gpus {
            return Err(CollectiveError::Unsupported(format!("nccl: needs {ws} GPUs, found {}", info.gpus)));
        }
        let lib_version = nccl_present().map_err(|e| CollectiveError::Unsupported(format!("nccl: {e}")))?;
        let deadline = started + init_timeout;
        let fail = |what: &str, e: String| CollectiveError::Backend(format!("nccl init on rank {rank}: {what}: {e}"));

        let dev = Device::new(world.local_rank()).map_err(|e| fail("CUDA device", e))?;
        if !alloc_cache {
            dev.disable_cache();
        }
        dev.one_rank_copy.store(one_rank_copy as u8, std::sync::atomic::Ordering::Relaxed);
        if one_rank_copy == crate::cuda::OneRankCopy::Kernel {
            // Now, while the stream is idle (never on an op's path; subgroups of one rank share
            // the device).
            dev.load_copy_kernel();
        }
        let store = concord_store::Store::open(&world.store_path, ws, init_timeout)
            .map_err(|e| fail("opening the world's store", e.to_string()))?;
        let key = format!("concord/nccl/{}/unique_id", world.world_id);
        let id = if rank == 0 {
            let mut id = nccl::ncclUniqueId { internal: [0; 128] };
            let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
            if r != nccl::ncclResult_t::ncclSuccess {
                return Err(fail("ncclGetUniqueId", comm::err_string(r)));
            }
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            store.set(&key, &bytes).map_err(|e| fail("publishing the NCCL unique id", e.to_string()))?;
            id
        } else {
            let bytes = store.get(&key).map_err(|e| fail("reading rank 0's NCCL unique id", e.to_string()))?;
            if bytes.len() != 128 {
                return Err(fail("reading rank 0's NCCL unique id", format!("{} bytes, expected 128", bytes.len())));
            }
            let mut id = nccl::ncclUniqueId { internal: [0; 128] };
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as _;
            }
            id
        };
        let comm = Comm::init(dev, ws, rank, id, blocking, lib_version, deadline).map_err(|e| fail("communicator", e))?;
        if fast_launch && !blocking {
            comm.make_twin(deadline).map_err(|e| fail("communicator", e))?;
        }
        // Names this communicator in the store (its point-to-point directions meet under it)
        // and in /dev/shm (its header board): the world's id and this init's unique id, so a
        // re-init in the same world never meets an earlier one's keys.
        let uid = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            id.internal.hash(&mut h);
            h.finish()
        };
        let p2p_key = format!("concord/nccl/{}/p2p/{uid:016x}", world.world_id);
        // Always agreed, so that a rank started with `header_board=0` makes every rank go
        // without (rather than leaving them waiting for its report).
        let board =
            world_board(&store, world, uid, header_board, deadline).map_err(|e| fail("agreeing on a validation-header board", e))?;
        let progress = Progress::start(comm.dev.clone(), pin.map(|n| n.saturating_add(local))).map_err(|e| fail("progress thread", e))?;
        let init_time = started.elapsed();
        NcclBackend::from_comm(
            comm,
            "nccl".into(),
            world.op_timeout,
            validate,
            init_time,
            info.gpus,
            Some(Arc::new(store)),
            p2p_key,
            progress,
            faults,
            board,
        )
        .map_err(|e| fail("side buffers", e))
        .inspect(|b| b.progress.tracker().batching.store(batch, std::sync::atomic::Ordering::SeqCst))
    }

    pub(crate) fn new_group_impl(&self, ranks: &[usize]) -> concord_core::Result<Option<Self>> {
        let o = self.begin("new_group", true)?;
        let mut d = self.call(&o, CallOp::NewGroup, Variant::Out, &[]);
        d.group = Some(ranks.to_vec());
        let local: Local = validate_local(&d, self.ws, &self.capabilities()).map_err(|e| (e.kind, e.detail));
        let hdr = Header::new(self.ws, &d).unwrap_or_else(|_| Header::summary(self.ws, &d)).error_if(&local);
        self.alive(&o)?;
        // The split needs every rank, so a subgroup is always agreed on, even with validation
        // off. It runs on the progress thread, ordered after every op issued before it.
        let started = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        self.progress.submit(Job::Split {
            chan: self.chan.clone(),
            id: o.id(),
            hdr,
            local: local.err(),
            member: ranks.iter().position(|&r| r == self.rank),
            nranks: ranks.len(),
            // `cseq`: the same on every rank (collectives only; `seq` also counts buffer calls);
            // the member list's length and hash: ranks that disagree on it never share a segment
            // (the header check then names the mismatch).
            board: self.chan.board.as_ref().map(|b| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                ranks.hash(&mut h);
                format!("{}g{}n{}-{:08x}", b.name(), o.cseq, ranks.len(), h.finish() as u32)
            }),
            reply: tx,
        });
        // Bounded by the jobs' own deadlines (earlier ops, this header exchange, the split).
        let limit = self.op_timeout + self.op_timeout.max(Duration::from_secs(30)) + 2 * comm::ABORT_WAIT;
        let sub = match rx.recv_timeout(limit) {
            Ok(r) => r?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let waited_ms = started.elapsed().as_millis() as u64;
                self.comm().abort(format!("new_group #{} timed out after {waited_ms} ms", o.seq));
                return Err(CollectiveError::Timeout {
                    op: "new_group".into(),
                    seq: o.seq,
                    rank: self.rank,
                    waited_ms,
                    detail: format!(
                        "the progress thread did not finish the split; NCCL communicator aborted; this process is {}",
                        progress::describe()
                    ),
                });
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(self.backend_err("new_group", o.seq, "the NCCL progress thread ended without splitting the communicator"))
            }
        };
        let Some((sub, board)) = sub else { return Ok(None) };
        let label = format!("nccl:g{}", GROUP_IDS.fetch_add(1, Ordering::SeqCst));
        NcclBackend::from_comm(
            sub,
            label,
            self.op_timeout,
            self.validating(),
            started.elapsed(),
            self.gpus,
            self.store.clone(),
            // `cseq`: the same on every rank (collectives only; `seq` also counts buffer calls).
            format!("{}/g{}", self.chan.p2p_key, o.cseq),
            self.progress.clone(),
            crate::fault::Faults::default(),
            board,
        )
        .map(Some)
        .map_err(|e| self.backend_err("new_group", o.seq, e))
    }
}

#[cfg(test)]
mod board_agreement_tests {
    use super::*;

    fn world(dir: &std::path::Path, rank: usize, ws: usize, id: &str) -> WorldInfo {
        WorldInfo {
            rank,
            world_size: ws,
            store_path: dir.join("store"),
            world_id: id.into(),
            op_timeout: Duration::from_secs(5),
            options: vec![],
        }
    }

    /// Runs `world_board` on `ws` ranks (threads), each with its own store handle; rank
    /// `unwilling` (if any) was started with `header_board=0`.
    fn agree_with(dir: &std::path::Path, ws: usize, id: &str, unwilling: Option<usize>) -> Vec<Option<Board>> {
        let hs: Vec<_> = (0..ws)
            .map(|r| {
                let w = world(dir, r, ws, id);
                std::thread::spawn(move || {
                    let store = concord_store::Store::open(&w.store_path, ws, Duration::from_secs(10)).unwrap();
                    world_board(&store, &w, 0xabc, unwilling != Some(r), Instant::now() + Duration::from_secs(10)).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn agree(dir: &std::path::Path, ws: usize, id: &str) -> Vec<Option<Board>> {
        agree_with(dir, ws, id, None)
    }

    #[test]
    fn one_rank_started_without_boards_means_none_for_all_and_no_wait() {
        for unwilling in [0, 2] {
            let d = tempfile::tempdir().unwrap();
            let id = format!("bt{}c{unwilling}", std::process::id());
            let t = Instant::now();
            let boards = agree_with(d.path(), 3, &id, Some(unwilling));
            assert!(boards.iter().all(Option::is_none), "rank {unwilling} with header_board=0: every rank goes without");
            assert!(t.elapsed() < Duration::from_secs(5), "nobody waited for a report that never comes");
            assert!(!std::path::Path::new("/dev/shm").join(name(&id)).exists());
        }
    }

    fn name(id: &str) -> String {
        format!("{}nccl-hdr-{:016x}", concord_core::world_prefix(id), 0xabc)
    }

    #[test]
    fn ranks_of_one_host_all_get_the_board_and_its_name_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let id = format!("bt{}a", std::process::id());
        let boards = agree(d.path(), 3, &id);
        assert!(boards.iter().all(Option::is_some), "every rank of one host uses the board");
        assert!(!std::path::Path::new("/dev/shm").join(name(&id)).exists(), "unlinked once every rank mapped it");
        // They are one board: what rank 2 posts, rank 0 reads.
        let b: Vec<Board> = boards.into_iter().map(Option::unwrap).collect();
        for x in &b {
            x.post(&[x.rank_for_test() as u64 + 40]);
        }
        assert!(b[0].ready(0));
        assert_eq!(b[0].read(0).iter().map(|h| h[0]).collect::<Vec<_>>(), vec![40, 41, 42]);
    }

    #[test]
    fn when_one_rank_cannot_have_it_no_rank_uses_it() {
        let d = tempfile::tempdir().unwrap();
        let id = format!("bt{}b", std::process::id());
        // A stale segment under the name: rank 0's exclusive create fails.
        let stale = Board::create(&name(&id), 1, 0, 1, 1).unwrap();
        let boards = agree(d.path(), 3, &id);
        assert!(boards.iter().all(Option::is_none), "all fall back to the device path together");
        drop(stale);
        assert!(!std::path::Path::new("/dev/shm").join(name(&id)).exists());
    }
}
