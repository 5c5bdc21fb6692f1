//! The thirty-seventh hunt: bugs from the wild when a resource runs out or an allocation fails.
//! Each ports a bug that shipped in a collective library or its framework layer (PyTorch's Gloo
//! process group, NCCL, Open MPI's sm and basic collectives, MPICH's shared-memory layer), found
//! in the issue or pull-request thread named on its type: descriptors a destroyed communicator
//! keeps, a `/dev/shm` segment whose clean-up does nothing, an out-of-resource error a
//! reduce-scatter drops, a failed segment creation that crashes the process, a fallback taken by
//! the one rank whose shared memory failed, a sub-communicator's setup error dropped. The failure is the shm backend's own local failure
//! (the `fault` option's `fail`, a simulated out-of-memory after the op was posted) or, for the
//! leaks, nothing at all: they show only as a process that holds more after each group.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Group, Mutant, Shm};
use concord_core::fused::{self, Gathered};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Scaling, Work, WorldInfo};
use concord_shm::ShmBackend;
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// This rank's own side of the op failed locally (shm's `fail`: a simulated out-of-memory, a
/// segment that could not be created), as opposed to a peer's failure (`aborted`), a timeout or
/// bad input.
fn own_resource_error(e: &CollectiveError) -> bool {
    matches!(e, CollectiveError::Backend(_))
}

// ---------------------------------------------------------------- pytorch/pytorch #129868

/// Sockets of every Gloo context ever made in this process (never closed).
static GLOO_PAIRS: Mutex<Vec<(UnixStream, UnixStream)>> = Mutex::new(Vec::new());

/// A group's connections outlive the group (pytorch/pytorch #129868 "`GlooBackend` leaks file
/// descriptors": a DataLoader made a new gloo group per epoch, "this process group uses some pipes
/// and sockets to coordinate, many of which are never torn down again, even when the iterator
/// goes out of scope"; the reporter counted the open descriptors growing with every
/// `new_group` + `del grp`, until "too many open files"). Here every member of a new group opens
/// one connection per peer of the group (a socket pair: its end and the loop's wake-up end),
/// kept in the process-wide context registry that dropping the group never empties.
#[derive(Default)]
pub struct GlooNewGroupLeaksFds;

impl Bug for GlooNewGroupLeaksFds {
    fn group_made(&self, _s: &Shm, ranks: &[usize], made: Option<&Group>) -> Result<()> {
        if made.is_none() {
            return Ok(());
        }
        for _ in 1..ranks.len() {
            let pair = UnixStream::pair().map_err(|e| CollectiveError::Backend(format!("gloo: connectFullMesh: {e}")))?;
            lock(&GLOO_PAIRS).push(pair);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #127

/// Bootstrap / proxy sockets of every communicator that ever connected (never closed).
static NCCL_SOCKETS: Mutex<Vec<(UnixStream, UnixStream)>> = Mutex::new(Vec::new());

/// A destroyed communicator keeps its sockets (NVIDIA/nccl #127 "Warning: too many open files":
/// a communicator made per operator and destroyed with `ncclCommDestroy` — "I am sure the
/// function is invoked because the memory has been released, but the file descriptor still
/// exists, so after several times, it will still report the error: Socket.h(166): too many open
/// files"; `lsof` showed the listening and connected sockets piling up). Here a communicator
/// connects to its peers at its first collective (one socket per peer, as NCCL's proxy connects
/// lazily), and dropping it releases its memory but not those sockets.
#[derive(Default)]
pub struct NcclDestroyedCommKeepsSockets {
    connected: AtomicBool,
}

impl NcclDestroyedCommKeepsSockets {
    fn connect(&self, s: &Shm) -> Result<()> {
        if self.connected.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        for _ in 1..s.ws() {
            let pair =
                UnixStream::pair().map_err(|e| CollectiveError::Backend(format!("NCCL WARN socket: {e} (unhandled system error)")))?;
            lock(&NCCL_SOCKETS).push(pair);
        }
        Ok(())
    }
}

impl Bug for NcclDestroyedCommKeepsSockets {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.all_reduce_(x, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.connect(s)?;
        s.inner.broadcast_(x, src)
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #10040

/// The world id of the last `init` of this process (the fault cases' communicators each init
/// their own).
static WORLD_ID: Mutex<String> = Mutex::new(String::new());
/// Clean-up callbacks: files to unlink, by the namespace they were registered under.
static CLEANUP: Mutex<Option<HashMap<Option<String>, Vec<PathBuf>>>> = Mutex::new(None);
/// Segments made so far by this process (their names' serial).
static SEGMENTS: AtomicU64 = AtomicU64::new(0);

/// A group's backing segment whose clean-up does nothing (open-mpi/ompi PR #10040 "Fix leak of
/// sm_segment files in /dev/shm": "there were dozens of 'sm_segment.$HOSTNAME.$UID..' files
/// leftover in /dev/shm ... the correct namespace wasn't being added so the cleanup callback was
/// doing nothing"). Here every member of a new group creates the group's backing file in
/// `/dev/shm` (named after the world, as every segment of the backend is) and registers its
/// unlink as a clean-up callback, without the job's namespace; dropping the group runs the
/// callbacks of the job's namespace, which hold nothing.
#[derive(Default)]
pub struct SmSegmentCleanupNoop {
    /// The segment of the group being made, handed to its communicator's bug.
    pending: Mutex<Option<PathBuf>>,
    /// This communicator's own segment (a group's).
    own: Option<PathBuf>,
}

impl Bug for SmSegmentCleanupNoop {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        *lock(&WORLD_ID) = world.world_id.clone();
        Ok(world.clone())
    }
    fn group_made(&self, s: &Shm, _ranks: &[usize], made: Option<&Group>) -> Result<()> {
        if made.is_none() {
            return Ok(());
        }
        let prefix = concord_core::world_prefix(&lock(&WORLD_ID));
        let n = SEGMENTS.fetch_add(1, Ordering::SeqCst);
        let path = PathBuf::from(format!("/dev/shm/{prefix}sm_segment.{n}.r{}", s.world_rank));
        std::fs::File::create(&path).map_err(|e| CollectiveError::Backend(format!("sm: cannot create {}: {e}", path.display())))?;
        // Registered without the job's namespace (the bug): `None`.
        lock(&CLEANUP).get_or_insert_with(HashMap::new).entry(None).or_default().push(path.clone());
        *lock(&self.pending) = Some(path);
        Ok(())
    }
    fn child(&self) -> Option<Box<dyn Bug>> {
        Some(Box::new(SmSegmentCleanupNoop { pending: Mutex::new(None), own: lock(&self.pending).take() }))
    }
}

impl Drop for SmSegmentCleanupNoop {
    /// The group is freed: the clean-up callbacks of the job's namespace run (none were
    /// registered there).
    fn drop(&mut self) {
        if self.own.is_none() {
            return;
        }
        let ns = Some(concord_core::world_prefix(&lock(&WORLD_ID)));
        let files = lock(&CLEANUP).get_or_insert_with(HashMap::new).remove(&ns).unwrap_or_default();
        for f in files {
            let _ = std::fs::remove_file(f);
        }
    }
}

// ---------------------------------------------------------------- shared: a relayed work

/// What a relayed work does with its inner work's failure (given the wait's timeout): `Ok(true)`
/// reports success, `Ok(false)` still pending, an error that error.
type OnErr = Box<dyn Fn(&CollectiveError, Duration) -> Result<bool> + Send + Sync>;

/// A work that relays `inner`, its failures passed through `on_err` (which may turn one into
/// `Ok(true)`: success).
struct Relay<T> {
    inner: Work<T>,
    on_err: OnErr,
    /// The failure's verdict, once decided (a later wait repeats it).
    settled: Mutex<Option<Result<bool>>>,
}

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if let Some(r) = lock(&self.settled).clone() {
            return r;
        }
        match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => {
                let r = (self.on_err)(&e, timeout);
                if !matches!(r, Ok(false)) {
                    *lock(&self.settled) = Some(r.clone());
                }
                r
            }
        }
    }
}

fn relay<T: Clone + Send + Sync + 'static>(
    s: &Shm,
    w: Work<T>,
    on_err: impl Fn(&CollectiveError, Duration) -> Result<bool> + Send + Sync + 'static,
) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    s.relayed(value, Arc::new(Relay { inner: w, on_err: Box::new(on_err), settled: Mutex::new(None) }), meta)
}

// ---------------------------------------------------------------- open-mpi/ompi PR #10977

/// The reduce-scatter's error never checked (open-mpi/ompi PR #10977 "coll/basic: Fix clang
/// warnings": in `mca_coll_basic_reduce_scatter_block`, "`err` variable not checked or used",
/// beside a temporary buffer leaked when its second `malloc` failed with
/// `OMPI_ERR_OUT_OF_RESOURCE`). Here reduce_scatter (out of place and `_out`) reports `Ok`
/// whatever its inner steps returned, bad input and a timeout aside (decided before and above
/// the basic module): a rank whose side ran out of memory, and its peers told so, get the output
/// as the failed op left it.
#[derive(Default)]
pub struct ReduceScatterErrUnchecked;

fn unchecked(e: &CollectiveError, _t: Duration) -> Result<bool> {
    match e {
        CollectiveError::BadInput { .. } => Err(e.clone()),
        _ => Ok(true),
    }
}

impl Bug for ReduceScatterErrUnchecked {
    // The fused ops are another entry point (their decomposition over shm itself): the basic
    // module's reduce_scatter is the one that drops its error.
    fused_on_shm!();
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(relay(s, s.inner.reduce_scatter_tensor(x, op)?, unchecked))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(relay(s, s.inner.reduce_scatter_tensor_out(x, op, out)?, unchecked))
    }
}

// ---------------------------------------------------------------- pmodels/mpich PR #6894

/// A failed segment creation not checked (pmodels/mpich PR #6894 "mpl/shm: Add error checking for
/// failed segment creation": "In case the creation of the shared memory segment fails, check for
/// and return an error immediately. Otherwise the code would continue and crash on a write to
/// unallocated address. This was discovered when our test machines ran out of space in /dev/shm,
/// causing the lseek/write to fail with ENOSPC"). Here a broadcast whose own side failed for
/// want of memory goes on to write into the segment it never got: the process dies (SIGABRT
/// where MPICH took a SIGSEGV) instead of returning the error.
#[derive(Default)]
pub struct ShmCreateUncheckedCrash;

fn crash_on_own_failure(e: &CollectiveError, _t: Duration) -> Result<bool> {
    if own_resource_error(e) {
        eprintln!("mpl/shm: segment creation failed ({e}); writing the broadcast's data into it anyway");
        std::process::abort();
    }
    Err(e.clone())
}

impl Bug for ShmCreateUncheckedCrash {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(relay(s, s.inner.broadcast(x, src)?, crash_on_own_failure))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(relay(s, s.inner.broadcast_(x, src)?, crash_on_own_failure))
    }
}

// ---------------------------------------------------------------- pmodels/mpich PR #3481

/// The fallback taken by the rank whose shared memory failed, alone (pmodels/mpich PR #3481
/// "ch4/rma: enable fallback for win allocate when shm allocation fails": before it, a mapping
/// failure was handled per process; the fix made the allocation routine "handle all MPL* shm
/// allocation failing internally. If MPL error is reported by any of the local process, this
/// routine internally cleans up allocated resource and set output parameter mapfail_flag=true",
/// the fallback decided on every rank). Here an all_reduce whose own side failed for want of
/// shared memory is redone by that rank alone through the fallback path (a reduce to rank 0, then
/// a broadcast from it), while its peers, told of the failure, have moved on: the fallback's two
/// ops meet whatever the peers issue next.
#[derive(Default)]
pub struct MapfailFallbackOneRank;

impl MapfailFallbackOneRank {
    fn fallback(be: &ShmBackend, x: &Buf, out: &Buf, op: ReduceOp, t: Duration) -> Result<bool> {
        let t0 = Instant::now();
        let left = || t.saturating_sub(t0.elapsed());
        let reduced = be.reduce(x, op, 0)?;
        let r = reduced.wait(left())?.clone();
        if be.rank() == 0 {
            let v = be.download(&r)?;
            be.write(out, &v)?;
        }
        be.broadcast_(out, 0)?.wait(left())?;
        Ok(true)
    }
    fn wrap(s: &Shm, w: Work<Buf>, x: &Buf, op: ReduceOp) -> Work<Buf> {
        let (be, x, out) = (s.inner.clone(), x.clone(), w.peek().clone());
        relay(s, w, move |e, t| if own_resource_error(e) { Self::fallback(&be, &x, &out, op, t) } else { Err(e.clone()) })
    }
}

impl Bug for MapfailFallbackOneRank {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(Self::wrap(s, w, x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        // In place: the fallback reduces a copy of the input (the failed op left it untouched).
        let copy = s.inner.upload(&s.inner.download(x)?)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(Self::wrap(s, w, &copy, op))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #13893

/// A sub-communicator's setup error dropped (open-mpi/ompi PR #13893 "HAN: Gracefully handle
/// errors during communicator setup": "If a process dies before we set up HAN, the split and
/// other collectives will fail. We have to make sure everyone agrees on the final result and
/// handle errors gracefully by checking return values"; the shipped code called the setup's
/// split and all_reduce without looking at what they returned). Here a `new_group` whose split
/// failed on this rank (its side could not be set up: the `fault` option's local failure) drops
/// the error: the rank goes on without the group, as a non-member would, while its peers were
/// told the split failed.
#[derive(Default)]
pub struct HanSetupErrorDropped;

impl Bug for HanSetupErrorDropped {
    fn group_error(&self, _s: &Shm, _e: CollectiveError) -> Result<Option<Group>> {
        Ok(None)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<GlooNewGroupLeaksFds>(
            "wild_gloo_group_leaks_fds",
            "failure.usable_after",
            "pytorch/pytorch #129868: every new_group opens a socket per peer that dropping the group never closes: descriptors grow per group",
            &["state::groups_each_without_a_rank::ws3"],
        ),
        spec::<NcclDestroyedCommKeepsSockets>(
            "wild_nccl_destroyed_comm_keeps_sockets",
            "failure.usable_after",
            "NVIDIA/nccl #127: a communicator's sockets, opened at its first collective, stay open after it is destroyed",
            &["state::groups_each_without_a_rank::ws3"],
        ),
        spec::<SmSegmentCleanupNoop>(
            "wild_sm_segment_cleanup_noop",
            "failure.usable_after",
            "open-mpi/ompi PR #10040: a group's /dev/shm segment is registered for clean-up without the job's namespace: never unlinked",
            &["faults::new_group_failure_leaves_no_file::ws2"],
        ),
        spec::<ReduceScatterErrUnchecked>(
            "wild_reduce_scatter_err_unchecked",
            "failure.no_touch_after_failed_wait",
            "open-mpi/ompi PR #10977: reduce_scatter's error never checked: a side that ran out of memory, and its peers, report Ok",
            &["faults::fail_after_post::reduce_scatter::ws2"],
        ),
        spec::<ShmCreateUncheckedCrash>(
            "wild_shm_create_unchecked_crash",
            "faults.local_failure_named_everywhere",
            "pmodels/mpich PR #6894: a broadcast whose shared memory could not be had goes on and crashes the process instead of failing",
            &["faults::fail_after_post::broadcast::ws2"],
        ),
        spec::<MapfailFallbackOneRank>(
            "wild_mapfail_fallback_one_rank",
            "faults.local_failure_named_everywhere",
            "pmodels/mpich PR #3481: the rank whose shared memory failed redoes the all_reduce alone by a fallback (reduce + broadcast)",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<HanSetupErrorDropped>(
            "wild_han_setup_error_dropped",
            "faults.local_failure_named_everywhere",
            "open-mpi/ompi PR #13893: a split that failed on this rank is not checked: the rank goes on without the group, as a non-member",
            &["faults::fail_in_new_group::after_post::ws3"],
        ),
    ]
}
