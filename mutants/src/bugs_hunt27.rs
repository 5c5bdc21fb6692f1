//! The twenty-seventh hunt: bugs from the wild on the failure paths. Each ports a bug that
//! shipped in a collective library or its framework layer (PyTorch's ProcessGroupNCCL / Gloo,
//! Open MPI's HAN and base collectives, PMIx, MPICH, UCC), found in the issue or pull-request
//! thread named on its type: an op that failed or timed out reporting success, an error seen on
//! one rank only, a wait whose deadline is not the caller's, a wait that returns before the op
//! is done. Each keeps its original's trigger (the ops the faulty layer serves, the error kind
//! it drops) as far as a wrapper over shm can: every bug sits in how a work reports its inner
//! shm work's outcome ([`Relay`]), which is where each of these bugs lived.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Work, WorldInfo};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a relayed work reports its inner shm work (every field off: truthfully).
#[derive(Clone, Copy, Default)]
struct Fate {
    /// Failures this matches are reported as success (`Ok`, the buffers as the failed op left them).
    swallow: Option<fn(&CollectiveError) -> bool>,
    /// Failures this matches are never reported: the work stays pending (each wait sleeps out its
    /// deadline and times out).
    hide: Option<fn(&CollectiveError) -> bool>,
    /// `wait(t)` waits this long instead of `t`.
    wait: Option<Duration>,
    /// `wait` returns `Ok` at once while the op is not complete and no failure is known yet.
    early_ok: bool,
    /// The op's deadline is (about) zero: a wait that finds it not yet complete fails it with a
    /// timeout, for good.
    zero_deadline: bool,
    /// The op fails with a timeout once this long has passed since it was issued (a deadline of
    /// the wrapper's own, the inner op left running).
    op_deadline: Option<Duration>,
}

struct Relay<T> {
    inner: Work<T>,
    fate: Fate,
    /// `zero_deadline` / `op_deadline`: the op was failed by its expired deadline.
    expired: AtomicBool,
    issued: Instant,
}

impl<T: Send + Sync> Relay<T> {
    fn hidden(&self, e: &CollectiveError) -> bool {
        self.fate.hide.is_some_and(|f| f(e))
    }
}

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        if self.expired.load(Ordering::SeqCst) {
            return true;
        }
        if !self.inner.is_completed() {
            return false;
        }
        !matches!(self.inner.wait(Duration::ZERO), Err(e) if self.hidden(&e))
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let t0 = Instant::now();
        let expire = |detail: &str| {
            self.expired.store(true, Ordering::SeqCst);
            let m = self.inner.meta();
            Err(CollectiveError::Timeout {
                op: m.op.clone(),
                seq: m.seq,
                rank: m.rank,
                waited_ms: self.issued.elapsed().as_millis() as u64,
                detail: detail.into(),
            })
        };
        if self.fate.zero_deadline && (self.expired.load(Ordering::SeqCst) || !self.inner.is_completed()) {
            return expire("timeout 4.94066e-324 sec has expired on task");
        }
        if let Some(d) = self.fate.op_deadline {
            const CAUGHT: &str = "Watchdog caught collective operation timeout (the communicator is not aborted)";
            if self.expired.load(Ordering::SeqCst) {
                return expire(CAUGHT);
            }
            let left = d.saturating_sub(self.issued.elapsed());
            return match self.inner.wait(timeout.min(left)) {
                Ok(_) => Ok(true),
                Err(CollectiveError::Timeout { .. }) if self.issued.elapsed() >= d => expire(CAUGHT),
                Err(CollectiveError::Timeout { .. }) => Ok(false),
                Err(e) => Err(e),
            };
        }
        if self.fate.early_ok && !self.inner.is_completed() {
            return Ok(true);
        }
        let timeout = self.fate.wait.unwrap_or(timeout);
        match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) if self.fate.swallow.is_some_and(|f| f(&e)) => Ok(true),
            Err(e) if self.hidden(&e) => {
                std::thread::sleep(timeout.saturating_sub(t0.elapsed()));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// `w` reported under `fate`.
fn relay<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>, fate: Fate) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    s.relayed(value, Arc::new(Relay { inner: w, fate, expired: AtomicBool::new(false), issued: Instant::now() }), meta)
}

/// Hooks that relay the named ops of the inner backend under `$fate` (an expression of type
/// [`Fate`], evaluated per call with `self` and `s` in scope).
macro_rules! relayed {
    ($fate:expr; $($op:ident($($a:ident: $t:ty),*) -> $r:ty);* $(;)?) => {
        $(
            fn $op(&self, s: &Shm, $($a: $t),*) -> Result<Work<$r>> {
                let w = s.inner.$op($($a),*)?;
                Ok(relay(s, w, $fate(self)))
            }
        )*
    };
}

/// Every collective of the trait (not the coalesced ones, not send / recv).
macro_rules! collectives {
    ($fate:expr) => {
        relayed! { $fate;
            all_reduce(x: &Buf, op: ReduceOp) -> Buf;
            all_reduce_(x: &Buf, op: ReduceOp) -> Buf;
            all_gather_into_tensor(x: &Buf) -> Buf;
            all_gather_into_tensor_out(x: &Buf, out: &Buf) -> Buf;
            reduce_scatter_tensor(x: &Buf, op: ReduceOp) -> Buf;
            reduce_scatter_tensor_out(x: &Buf, op: ReduceOp, out: &Buf) -> Buf;
            all_to_all_single(x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Buf;
            broadcast(x: &Buf, src: usize) -> Buf;
            broadcast_(x: &Buf, src: usize) -> Buf;
            permute_tensor(x: &Buf, src_dst: &[usize]) -> Buf;
            reduce(x: &Buf, op: ReduceOp, root: usize) -> Buf;
            gather(x: &Buf, root: usize) -> Buf;
            scatter(x: &Buf, root: usize) -> Buf;
            barrier() -> ();
        }
    };
}

/// The coalesced collectives.
macro_rules! coalesced {
    ($fate:expr) => {
        relayed! { $fate;
            all_reduce_coalesced(xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
            all_reduce_coalesced_(xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
            all_gather_into_tensor_coalesced(xs: &[Buf]) -> Vec<Buf>;
            reduce_scatter_tensor_coalesced(xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
        }
    };
}

/// Send and recv.
macro_rules! p2p {
    ($fate:expr) => {
        relayed! { $fate;
            send(x: &Buf, dst: usize) -> ();
            recv(out: &Buf, src: usize) -> Buf;
        }
    };
}

/// A failure a collective layer drops: anything but bad input (decided before the algorithm
/// runs, by the argument checks above it) and a timeout (a wait that is still pending).
fn dropped_failure(e: &CollectiveError) -> bool {
    !matches!(e, CollectiveError::BadInput { .. } | CollectiveError::Timeout { .. })
}

/// The communicator's op deadline, as `init` was given it (the last `init` of this process).
static OP_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

fn op_timeout() -> Duration {
    match OP_TIMEOUT_MS.load(Ordering::SeqCst) {
        0 => crate::BUG_WAIT,
        ms => Duration::from_millis(ms),
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #83486

/// The caller's wait deadline ignored (pytorch/pytorch #83486 "ProcessGroupNCCL work.wait()
/// timeout not respected even for NCCL_BLOCKING_WAIT": `WorkNCCL::wait(timeout)` never used its
/// argument, the blocking wait ran to the process group's `opTimeout`; the same in Gloo until
/// pytorch/pytorch PR #158128 "ProcessGroupGloo: support per operation timeouts", "previously the
/// timeouts were ignored even if they were set"). Here every wait, of every op, waits the
/// communicator's op deadline (the one `init` was given) instead of the caller's.
#[derive(Default)]
pub struct WaitUsesGroupTimeout;

fn group_timeout(_: &WaitUsesGroupTimeout) -> Fate {
    Fate { wait: Some(op_timeout()), ..Fate::default() }
}

impl Bug for WaitUsesGroupTimeout {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        OP_TIMEOUT_MS.store(world.op_timeout.as_millis().max(1) as u64, Ordering::SeqCst);
        Ok(world.clone())
    }
    collectives!(group_timeout);
    coalesced!(group_timeout);
    p2p!(group_timeout);
}

// ---------------------------------------------------------------- pytorch/pytorch PR #109611

/// Point-to-point outside the watchdog (pytorch/pytorch PR #109611 "Fix send()/recv() to adhere
/// to timeout": p2p ops did not enqueue their work in `workMetaList_`, so the NCCL watchdog never
/// watched them and they did not respect the collective timeouts: a recv whose peer never sends
/// hangs). Here a send's or recv's wait ignores its deadline: it returns once the op completes
/// or fails, however long that takes. Collectives are watched (unchanged).
#[derive(Default)]
pub struct P2pUnwatched;

fn unwatched<B>(_: &B) -> Fate {
    Fate { wait: Some(Duration::from_secs(3600)), ..Fate::default() }
}

impl Bug for P2pUnwatched {
    p2p!(unwatched);
}

// ---------------------------------------------------------------- pytorch/pytorch PR #117682

/// Coalesced work outside the watchdog (pytorch/pytorch PR #117682 "[c10d] Enable watchdog for
/// coalesced work", fixing #114301: `coalescing_state_` was reset to 0 before it was checked, so
/// the work `end_coalescing` made was never enqueued for the watchdog — a silent hang instead of
/// a timeout). Here the coalesced ops' waits ignore their deadline; single ops are watched.
#[derive(Default)]
pub struct CoalescedUnwatched;

impl Bug for CoalescedUnwatched {
    coalesced!(unwatched);
}

// ---------------------------------------------------------------- open-mpi/ompi #11794

/// HAN drops its sub-collectives' errors (open-mpi/ompi #11794 "Han collective do not return
/// errors from internal colls": the HAN module never checks the status of the intra- and
/// inter-node collectives it is built from and always returns `OMPI_SUCCESS`, so fault-tolerant
/// code sees success after a failure). Here the ops HAN serves (all_reduce, all_gather,
/// broadcast, reduce, gather, scatter, barrier) report any failure but bad input (checked above
/// HAN) and a timeout as success, with the buffers as the failed op left them.
#[derive(Default)]
pub struct HanDropsSubcollErrors;

fn han(_: &HanDropsSubcollErrors) -> Fate {
    Fate { swallow: Some(dropped_failure), ..Fate::default() }
}

impl Bug for HanDropsSubcollErrors {
    relayed! { han;
        all_reduce(x: &Buf, op: ReduceOp) -> Buf;
        all_reduce_(x: &Buf, op: ReduceOp) -> Buf;
        all_gather_into_tensor(x: &Buf) -> Buf;
        all_gather_into_tensor_out(x: &Buf, out: &Buf) -> Buf;
        broadcast(x: &Buf, src: usize) -> Buf;
        broadcast_(x: &Buf, src: usize) -> Buf;
        reduce(x: &Buf, op: ReduceOp, root: usize) -> Buf;
        gather(x: &Buf, root: usize) -> Buf;
        scatter(x: &Buf, root: usize) -> Buf;
        barrier() -> ();
    }
}

// ---------------------------------------------------------------- open-mpi/ompi #8916

/// An alltoallv whose requests failed returns success (open-mpi/ompi #8916
/// "ompi_coll_base_alltoallv_intra_basic_linear can return success even if
/// ompi_request_wait_all returns MPI_ERR_IN_STATUS": the error path looks for the real error code
/// in the statuses and finds none, so the collective returns `MPI_SUCCESS`, seen with
/// `osu_alltoallv` on EFA). Here `all_to_all_single` reports any failure but bad input and a
/// timeout as success, its output as the failed exchange left it. Every other op is unchanged.
#[derive(Default)]
pub struct AlltoallvErrInStatusOk;

fn err_in_status(_: &AlltoallvErrInStatusOk) -> Fate {
    Fate { swallow: Some(dropped_failure), ..Fate::default() }
}

impl Bug for AlltoallvErrInStatusOk {
    relayed! { err_in_status;
        all_to_all_single(x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Buf;
    }
}

// ---------------------------------------------------------------- openpmix/openpmix #2291

/// A departed participant dropped from the collective's tracker (openpmix/openpmix #2291
/// "Incomplete collective response", fixed by PR #2293 "Provide partial_success error when
/// collectives not complete": when a process dies before it participates, the server removes it
/// from the tracker and the fence completes with SUCCESS although not every process took part).
/// Here a barrier (PMIx's fence) whose peer died reports success. Other ops are unchanged.
#[derive(Default)]
pub struct FenceWithoutDeparted;

fn departed(_: &FenceWithoutDeparted) -> Fate {
    Fate { swallow: Some(|e| matches!(e, CollectiveError::PeerDied { .. })), ..Fate::default() }
}

impl Bug for FenceWithoutDeparted {
    relayed! { departed;
        barrier() -> ();
    }
}

// ---------------------------------------------------------------- pmodels/mpich #1119

/// The error returned on one rank only (pmodels/mpich #1119 "MPI_Comm_connect should return
/// error on every process": when the connect fails, only the root returns the error; the other
/// ranks stay in the call, waiting for the root's result that never comes). Here a collective
/// whose failure this rank learns from a peer (the communicator aborted by the peer's failure)
/// is never reported: its waits time out, as for a peer that is merely late. A failure of this
/// rank's own side is reported as before.
#[derive(Default)]
pub struct ErrorOnFailingRankOnly;

fn one_rank(_: &ErrorOnFailingRankOnly) -> Fate {
    Fate { hide: Some(|e| matches!(e, CollectiveError::Aborted(_))), ..Fate::default() }
}

impl Bug for ErrorOnFailingRankOnly {
    collectives!(one_rank);
}

// ---------------------------------------------------------------- pytorch/pytorch PR #22907

/// A wait that returns while the op is still running (pytorch/pytorch PR #22907 "Detect and
/// handle NCCL errors appropriately in ProcessGroupNCCL", the review of `WorkNCCL::wait`: when
/// the kernels have not finished and no communicator error is known yet, `wait()` returns, so an
/// error that comes later is never raised on the user's thread and the work queued after it runs
/// on garbage). Here a wait that finds the op not complete returns `Ok` at once.
#[derive(Default)]
pub struct WaitReturnsWhileRunning;

fn early(_: &WaitReturnsWhileRunning) -> Fate {
    Fate { early_ok: true, ..Fate::default() }
}

impl Bug for WaitReturnsWhileRunning {
    collectives!(early);
}

// ---------------------------------------------------------------- pytorch/pytorch PR #191517

/// Aborted work racing to success (pytorch/pytorch PR #191517 "[c10d][nccl2] Complete the
/// WorkNCCL contract": "abort published the communicator error only after teardown, allowing
/// canceled work to race to successful completion"). Here an op the communicator's abort ended
/// (shm aborts the communicator when any rank's side of an op fails) reports success on this
/// rank, its buffers as the abort left them; every op, collectives and point-to-point alike.
#[derive(Default)]
pub struct AbortedWorkSucceeds;

fn aborted_ok(_: &AbortedWorkSucceeds) -> Fate {
    Fate { swallow: Some(|e| matches!(e, CollectiveError::Aborted(_))), ..Fate::default() }
}

impl Bug for AbortedWorkSucceeds {
    collectives!(aborted_ok);
    coalesced!(aborted_ok);
    p2p!(aborted_ok);
}

// ---------------------------------------------------------------- openucx/ucc PR #314

/// A deadline lost in the args copy (openucx/ucc PR #314 "CORE: fix coll args copy": the copy
/// of `ucc_coll_args` dropped the timeout field, so a collective posted with the timeout flag
/// ran with a garbage deadline — torch_ucc's "timeout 4.94066e-324 sec has expired on task ...
/// Bcast" on a healthy job). Here a collective found not complete by its first wait fails with
/// a timeout at once, and stays failed.
#[derive(Default)]
pub struct CollTimeoutNotCopied;

fn no_deadline(_: &CollTimeoutNotCopied) -> Fate {
    Fate { zero_deadline: true, ..Fate::default() }
}

impl Bug for CollTimeoutNotCopied {
    collectives!(no_deadline);
}

// ---------------------------------------------------------------- pytorch/pytorch PR #31128

/// A timed-out op left running (pytorch/pytorch PR #31128 "abort nccl communicators before
/// throwing operation timed out": in blocking-wait mode `wait()` threw the timeout without
/// aborting the NCCL communicators, so the collective's kernel stayed live on the GPU — 100%
/// utilisation — and finished whenever its peers came, writing buffers the caller had taken
/// back). Here an op fails with a timeout once the communicator's op deadline has passed since
/// it was issued, while the shm op under it runs on with twenty times that deadline: when the
/// late peer comes, it completes and writes this rank's buffers after the failure was returned.
#[derive(Default)]
pub struct TimedOutOpNotAborted;

fn not_aborted(_: &TimedOutOpNotAborted) -> Fate {
    Fate { op_deadline: Some(op_timeout()), ..Fate::default() }
}

impl Bug for TimedOutOpNotAborted {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        OP_TIMEOUT_MS.store(world.op_timeout.as_millis().max(1) as u64, Ordering::SeqCst);
        Ok(WorldInfo { op_timeout: world.op_timeout * 20, ..world.clone() })
    }
    collectives!(not_aborted);
    coalesced!(not_aborted);
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<WaitUsesGroupTimeout>(
            "wild_wait_uses_group_timeout",
            "async.deadline",
            "pytorch/pytorch#83486, PR #158128: wait(t) ignores t and waits the communicator's op deadline (every op)",
            &["async::wait_zero_polls::ws2"],
        ),
        spec::<P2pUnwatched>(
            "wild_p2p_unwatched",
            "async.deadline",
            "pytorch/pytorch PR #109611: send / recv outside the watchdog: their waits ignore the deadline",
            &["async::pending_until_peers_arrive::send_recv::outbuf::ws2"],
        ),
        spec::<CoalescedUnwatched>(
            "wild_coalesced_unwatched",
            "async.deadline",
            "pytorch/pytorch PR #117682: coalesced work outside the watchdog: its waits ignore the deadline",
            &["async::pending_until_peers_arrive::all_reduce::coalesced::ws2"],
        ),
        spec::<HanDropsSubcollErrors>(
            "wild_han_drops_subcoll_errors",
            "failure.no_touch_after_failed_wait",
            "open-mpi/ompi#11794: HAN's ops (all_reduce, all_gather, broadcast, reduce, gather, scatter, barrier) report a failure as success",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<AlltoallvErrInStatusOk>(
            "wild_alltoallv_err_in_status_ok",
            "failure.no_touch_after_failed_wait",
            "open-mpi/ompi#8916: an all_to_all_single whose exchange failed reports success",
            &["faults::fail_after_post::all_to_all::ws2"],
        ),
        spec::<FenceWithoutDeparted>(
            "wild_fence_without_departed",
            "failure.no_touch_after_failed_wait",
            "openpmix/openpmix#2291, PR #2293: a barrier whose peer died completes with success",
            &["async::peer_dies_mid_collective::barrier::ws2"],
        ),
        spec::<ErrorOnFailingRankOnly>(
            "wild_error_on_failing_rank_only",
            "faults.local_failure_named_everywhere",
            "pmodels/mpich#1119: a peer's failure (the aborted communicator) never reaches this rank's op: it times out",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<WaitReturnsWhileRunning>(
            "wild_wait_returns_while_running",
            "async.result_final_after_wait",
            "pytorch/pytorch PR #22907: a wait that finds the op running and no error known returns Ok at once",
            &["async::pending_until_peers_arrive::ws2"],
        ),
        spec::<AbortedWorkSucceeds>(
            "wild_aborted_work_succeeds",
            "failure.no_touch_after_failed_wait",
            "pytorch/pytorch PR #191517: an op ended by the communicator's abort reports success (every op)",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<CollTimeoutNotCopied>(
            "wild_coll_timeout_not_copied",
            "async.deadline",
            "openucx/ucc PR #314: the coll args copy drops the timeout: a collective not complete at its first wait times out at once",
            &["async::pending_until_peers_arrive::ws2"],
        ),
        spec::<TimedOutOpNotAborted>(
            "wild_timed_out_op_not_aborted",
            "failure.no_touch_after_failed_wait",
            "pytorch/pytorch PR #31128: an op past its deadline reports a timeout but is not aborted: a late peer completes it into this rank's buffers",
            &["faults::late_peer::in_place::ws2"],
        ),
    ]
}
