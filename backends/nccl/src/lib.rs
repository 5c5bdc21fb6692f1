//! # concord-nccl
//!
//! **One job:** implement [`concord_core::Backend`] over NVIDIA NCCL, one process per GPU, so the
//! Concord suites can check NCCL the way they check every other backend.
//!
//! * **Loading.** libcuda and libnccl are loaded at run time (cudarc's `dynamic-loading`): the
//!   crate builds and its tests run on machines without CUDA. Every entry point MUST fail with a
//!   named error, never a panic or abort, when the libraries or GPUs are missing:
//!   [`NcclBackend::init`] returns [`CollectiveError::Unsupported`] ("libnccl could not be
//!   loaded", "needs 2 GPUs, found 0", ...). [`probe`] says up front whether NCCL can run here.
//! * **World.** Rank `r` drives visible GPU `r` (`CUDA_VISIBLE_DEVICES` respected). Rank 0's
//!   `ncclGetUniqueId` travels through the world's file store. The communicator is
//!   non-blocking (`ncclConfig_t.blocking = 0`) and created once per world, in `init`.
//! * **Fast launch.** A non-blocking communicator hands every group to a thread NCCL starts for
//!   it, to be polled to completion before the next call: about 50 us per launch (2 x H200),
//!   against about 6 us on a blocking one. So right after `init` (and after every `new_group`)
//!   every rank splits a *blocking twin* off the communicator (`ncclCommSplit` with
//!   `blocking = 1`, `splitShare = 0`: asynchronous, since the parent is non-blocking, and polled
//!   against the init deadline) and runs the twin's first collective at once (an 8-byte-per-rank
//!   all-gather and a one-element all-reduce in one group: NCCL connects lazily, inside a first
//!   launch, which would otherwise wait for the peers in the middle of a program). Every group
//!   of that communicator (header exchanges, collectives, fused ops' NCCL steps, premul-sum ops)
//!   then runs on the twin; the parent keeps what must stay non-blocking: splits (subgroups,
//!   the twin itself) and its state. A blocking call cannot be polled against its deadline, so
//!   each is marked inside the twin with its deadline, and the progress thread's watchdog
//!   (`worker`, a look every 2 ms) aborts the communicator of a call still inside NCCL past it;
//!   `Comm::abort` from any thread does the same once the call has stayed inside 20 ms (a
//!   healthy enqueue takes microseconds and then carries the abort out itself: it checks the
//!   request right after marking itself inside, so `ncclCommAbort`, which frees the
//!   communicator, never runs under a call that is merely busy). `ncclCommAbort` on the twin
//!   from that other thread makes the call return (measured on NCCL 2.28.3: a first launch
//!   waiting for an absent peer's connection returned an error right after the abort); the
//!   launch then carries out the rest of the abort and fails with a named timeout. Send /
//!   recv-based collectives (all_to_all, gather, scatter) still connect their peers inside
//!   their first launch. The point-to-point directions (two-rank communicators, `direction`)
//!   get a blocking twin too, made and connected by a thread of their own when the direction
//!   is set up (both of its ranks are there then), and watched by a per-process twin watchdog
//!   (their launches run outside any job). Option `fast_launch=0` keeps every group on the non-blocking
//!   communicator (each polled); `blocking=1` makes the communicator itself blocking (its
//!   `init` then has no deadline: for comparisons only).
//! * **Buffers.** [`NcclBuffer`] is device memory (Arc-shared, views by offset). An op's output
//!   is allocated stream-ordered on the rank's NCCL stream (every NCCL call uses it); a
//!   caller's buffer (`upload`, `alloc`) on the copy stream, waited for before it is returned;
//!   every free is stream-ordered on the NCCL stream.
//! * **Issue is asynchronous.** Every collective MUST return its [`Work`] at once, even while
//!   its peers are absent. The calling thread does the local checks (a bad root, indivisible
//!   shapes, a wrong-size `_out` buffer... are returned at issue as a named
//!   [`CollectiveError::BadInput`]), allocates the output and queues a job. One progress thread
//!   per rank (see `worker`), shared by the world and its subgroups, runs the jobs in issue
//!   order: it is the only thread that enqueues NCCL work, so every rank launches in the same
//!   order (see **Which thread calls NCCL**).
//!   A job keeps the buffers it uses alive until its NCCL calls are enqueued.
//! * **Validation.** Issue checks the call's [`concord_core::CallDesc`] with the core rule
//!   table's local rules ([`concord_core::validate_local`]). Before every collective the
//!   progress thread exchanges a small header (the encoded `CallDesc` and any local error) with
//!   every rank and runs the core rule table over all of them (see `header`), so mismatched
//!   inputs end on *every* rank in the same
//!   named [`CollectiveError::BadInput`] (at wait) instead of an NCCL hang or silent truncation.
//!   A rank that rejected its input at issue still sends its header, marked with the error, so
//!   its peers fail too and the sequence stays in step. Option `validate=0` turns this off (then
//!   `capabilities().validates_across_ranks` is false). The headers travel through host shared
//!   memory when every rank of the world is on this host (`board`: the ranks agree at `init`
//!   through the store; subgroups follow their parent), so collective k+1 is validated while
//!   collective k still runs on the GPU and validated collectives overlap as unvalidated ones
//!   do; otherwise (ranks on several hosts, or option `header_board=0`) they are all-gathered by
//!   NCCL on a side buffer, ordered on the stream after collective k's kernels, and validated
//!   collectives do not overlap. `new_group`'s headers take the same path (a `new_group` facing
//!   another collective is one named error on every rank); its split follows every earlier
//!   collective on the GPU. Send / recv headers go on their directions'
//!   own communicators (below). A rank that fails locally *after* issuing
//!   an op (an out-of-memory allocating the output, a refused reduce op) still sends the op's
//!   header, marked failed, so every peer ends that op in one named error naming the rank
//!   (never a timeout), and the sequence stays in step.
//! * **Point to point.** `send` / `recv` do not use the shared stream: every ordered pair
//!   `src -> dst` of a communicator (world or subgroup) gets a two-rank NCCL communicator of its
//!   own, on a stream of its own, created lazily by both ranks on first use (unique id through
//!   the world's store under a key naming the parent communicator, src and dst; non-blocking
//!   init, polled). The progress thread parks a send / recv on its direction and goes on with
//!   the next job; parked ops move (header swap with the peer on the direction, the pair rule
//!   of the core rule table, then the data) between jobs, while idle and inside every wait of
//!   the thread, so the `k`-th send from `a` to `b` meets the `k`-th recv on `b` from `a`, in
//!   order, and a pending send / recv never holds back a collective or another direction, nor
//!   the other way round (see `p2p`, `direction`). A size or dtype mismatch is the same
//!   [`CollectiveError::BadInput`] on both ranks. An abort of a communicator aborts its
//!   directions; a send / recv that times out (its peer never posted the matching op) aborts
//!   its communicator, as a collective's does. A send / recv's data waits for nothing on the
//!   shared stream (MPI's rule: an op's buffers are the caller's again only after its wait), and
//!   a send / recv queued behind a collective that waits for its peers is parked at once.
//! * **Completion.** A [`Work`] completes once its job has launched and a CUDA event recorded
//!   after the op has completed; `is_completed()` is false while the job waits for its peers.
//!   Small ops launched back to back (up to 16 of one communicator, each keeping at most 1 MiB)
//!   share one event, recorded after the last of them as soon as the progress thread's queue is
//!   empty, before it waits for anything, or by its watchdog after 2 ms (`worker::Tracker::defer`;
//!   backend option `batch=0`: one event per op): each op still completes in issue order and never
//!   before its own work, only observed a few launches later under a burst.
//!   A completion is trusted only when it was observed before any abort of its communicator:
//!   `ncclCommAbort` makes NCCL's kernels return early, so the event of an op that never
//!   finished completes too; every op whose completion was not observed before the abort was
//!   requested fails with [`CollectiveError::Aborted`]. A wait that runs out of its own
//!   timeout leaves the op (and the communicator) alone.
//! * **Deadlines.** Every step of a job is bounded by its deadline: its start on the progress
//!   thread plus the world's op timeout (time queued behind healthy earlier jobs does not
//!   count). A header exchange through the board waits for the peers only, within the job's
//!   deadline, naming the ranks whose headers never came; one through NCCL waits behind
//!   earlier work on the shared stream without that counting against it: its own deadline
//!   starts when the stream reaches it, and a hard bound of three op timeouts ends it in every
//!   case. Meanwhile any earlier launched op past *its* deadline gets *its* communicator
//!   aborted (a hung subgroup op never aborts the world). A
//!   launched op's deadline counts from when the stream reached it (the op launched before it
//!   completed; the enqueue itself gets a full op timeout); an op pending past it is declared
//!   dead by its waiter, or by an op waiting behind it (`worker::Tracker`): its communicator is
//!   aborted and the wait ends in [`CollectiveError::Timeout`] with op and sequence number;
//!   later ops on that communicator fail at issue with [`CollectiveError::Aborted`]. No call
//!   waits without a deadline.
//! * **Abort.** `Comm::abort` is a request: it records the reason (from then on no completion
//!   is trusted), raises a flag that the poll loops of a launch or split in progress check (they
//!   let go of the communicator's lock and carry the abort out), and never waits on that lock
//!   beyond a bound.
//! * **Ordering of copies.** `upload`, `download`, `write` and `alloc` run on a second stream
//!   through pinned staging, polled with the op deadline: they synchronise with the device,
//!   not with collectives queued on the NCCL stream (no pageable copy that could block in the
//!   driver; a stalled GPU is a named timeout that leaves the communicator alone, and the
//!   memory of a copy still pending is kept for it). `upload`, `write` and `alloc` are finished
//!   before they return, so an op issued after them sees the data; `write` first waits
//!   (bounded) until every op issued before it has been launched, and its copy waits for them
//!   on the device, so it lands after them. `download` after a successful wait sees the final
//!   result. Frees are stream-ordered after every op enqueued so far (without memory pools,
//!   deferred until the device is idle, since `cuMemFree` may wait for it); the pool is trimmed
//!   back to 256 MiB every 256 MiB freed.
//! * **Semantics.** Declared in [`NcclBackend::capabilities`]: no bitwise reductions (NCCL has
//!   none), no reductions on i16/u16 (NCCL has no 16-bit integer type; they move as bytes),
//!   min/max ignore NaN (NaN only when every rank has NaN; min(-0, +0) = -0, max = +0), integer
//!   avg truncates toward zero — as observed on NCCL 2.28.3 (2 × H200); the suites' `caps::*`
//!   probes re-check the declaration on every conformance run.
//! * **Which thread calls NCCL.** NCCL's rules: one thread at a time per communicator, and no
//!   NCCL operations issued in parallel to communicators of the same device. So every NCCL
//!   call that enqueues work or talks to the peers — header exchanges, collective and
//!   point-to-point groups, premul-sum op create / destroy, `ncclCommSplit`, and the teardown
//!   (`ncclCommFinalize`, then `ncclCommDestroy`) — is made by the rank's one progress thread
//!   (`worker`, shared by the world and its subgroups), one job at a time, in issue order;
//!   issuing threads (any number, any thread) never call NCCL, they only queue jobs. The
//!   exceptions, none of which enqueues work: `init` runs `ncclGetUniqueId` (rank 0) and
//!   `ncclCommInitRankConfig` on the caller's thread, before the progress thread exists;
//!   `ncclCommGetAsyncError`, a state query, is polled by whichever thread waits, with a
//!   `try_lock` on the communicator so it never runs during another call on it;
//!   The direction communicators of point to point are created (`ncclGetUniqueId`,
//!   non-blocking `ncclCommInitRankConfig`) and used by the progress thread too.
//!   `ncclCommAbort` — whose purpose is to end a hung communicator from another thread — runs
//!   on a short-lived `nccl-abort` thread, taking the communicator's lock (requested, see
//!   **Abort**), except on a blocking twin whose call is in progress: that one is aborted
//!   without the lock, from the aborting thread (the watchdog, a waiter), which is the only
//!   way to end the call (see **Fast launch**); `ncclCommDestroy` after a successful finalize (it then only frees this
//!   rank's resources) runs on an `nccl-destroy` thread so that its wait stays bounded; a
//!   communicator whose progress thread has stopped is torn down on the thread dropping it.
//! * **Safety of shared GPUs.** If `NCCL_NVLS_ENABLE` is unset, `init` sets it to `0`: NVLink
//!   multicast is never used unless the user asks for it explicitly.
//!
//! * **Fault injection.** The hooks of [`concord_core::fault`] listed in `fault`, through the
//!   `fault` option (off by default): the `device_faults` suite's cases check the paths above,
//!   and `faults::alloc_fails_at_issue::*` the real out-of-memory of `alloc_output:fail`.
//!
//! Modules: `buffer` (device buffers; upload / download / alloc / write / view), `dtype` (NCCL
//! types and reduce ops), `ops` (the collective entry points: each call's `CallDesc`, admitted
//! by the core rule table's local rules), `launch` (the NCCL launch builders), `issue` (op
//! numbering, in-flight records, rejections, queueing, [`Work`]), `header` (the encoded
//! `CallDesc` and the cross-rank check through the rule table), `board` (the headers through
//! host shared memory), `worker` (the progress thread),
//! `p2p` (send / recv matching and scheduling per direction, pure, tested with simulated ranks),
//! `direction` (the direction communicators of point to point),
//! `completion` (pending results), `comm` (the communicator; `init` and `new_group`), `cuda`
//! (device, streams, memory), `fault` (the fault hooks), `fused_plan` (the fused ops' pure
//! geometry: steps, pieces, GEMM descriptors; unit-tested without a GPU) and `fused_gpu` (those
//! ops on cuBLAS + NCCL, matmuls on a second stream overlapping the transfers); for benchmarks, `timing` (CUDA events
//! on the rank's stream, the memory pool's release threshold) `reference` (the raw NCCL loop the
//! bench prints next to the backend) and `bench_io` (device-side rotated copies, reads through
//! pinned staging). This file: the [`NcclBackend`] type and the [`Backend`] impl,
//! which delegates to them.
//!
//! Options (`WorldInfo::options`): `validate=0|1` (default 1), `header_board=0|1` (default 1:
//! validation headers through host shared memory when every rank is on this host, see
//! **Validation**), `blocking=0|1` (default 0),
//! `fast_launch=0|1` (default 1: groups run on the communicator's blocking twin, see **Fast
//! launch**), `fused_overlap=1|serial|0` (default 1: the fused ops on cuBLAS + NCCL, see
//! `fused_gpu`), `alloc_cache=0|1` (default 1: device blocks freed on the rank's stream are
//! reused by later allocations on it, see `block_cache`), `one_rank_copy=kernel|memcpy|0` (default
//! kernel: on a communicator of one rank, an all_reduce / reduce_scatter whose op is the identity
//! there — `sum`, `prod`, `min`, `max` — is a device copy on the stream instead of NCCL calls, a
//! copy kernel up to 1 MiB (`cuda::COPY_KERNEL_MAX_BYTES`) and `cuMemcpyDtoDAsync` above, or
//! `cuMemcpyDtoDAsync` always (`memcpy`), see `worker::Launch::local`; 0: through NCCL as on any
//! communicator), `batch=0|1` (default 1: small ops that every rank has issued — its header posted, or
//! without validation its number on the ranks' issue counters, `board` — share one
//! completion event, see `worker::Tracker::defer`; without validation a peer's local failure of
//! a later op of the batch fails the earlier ones here too), `init_timeout_ms=N` (default: the
//! larger of the op deadline and 30 s), `progress_pin=N` (default: unpinned; the progress thread
//! on CPU N + local rank only, a measuring aid: the bench's raw loop pins its launching thread
//! alike with `raw_pin=N`, so both launch from the same vCPU, see `pin`; `raw_pin` pins the
//! bench's main thread, which issues the backend's ops too, for the raw step only, and moves it
//! off that CPU when it restores its set, but the scheduler may put it back: with both at the
//! same N, pin the caller elsewhere for the whole run with the bench's `caller_pin=M`, as
//! gpulat11 saw the caller and the progress thread sharing one vCPU 5-8 x slower on 2 x H200),
//! `fault=...` (fault injection, see [`concord_core::fault`]). Every option is read before any
//! GPU is touched, and a value outside its set (a yes/no option reads 1/0, true/false, yes/no,
//! on/off: [`concord_core::WorldInfo::flag`]) or an unknown fault hook fails `init` with a named
//! error on every rank.
//!
//! Cost of the defaults (2 × H200, NCCL 2.28.3, 1 KiB all_reduce issue + wait, through the
//! progress thread, before the blocking twin): non-blocking communicator ~76 us unvalidated /
//! ~163 us validated; `blocking=1` ~21 us / ~49 us. With the twin (default since 2026-11-26):
//! 27 us unvalidated, 64 us validated (issue + wait), 15.3 / 53 us back to back. With
//! `blocking=1` (the communicator itself blocking, no twin) a collective whose GPU kernels
//! hang is still aborted, but a peer lost while NCCL is connecting can block the progress
//! thread inside NCCL; the twin's watchdog (default) ends exactly that case.

pub mod bench_io;
mod block_cache;
mod board;
mod buffer;
mod comm;
mod completion;
mod cuda;
mod direction;
mod dtype;
mod fault;
mod fused_gpu;
pub mod fused_plan;
pub mod header;
mod issue;
mod launch;
mod one_rank;
mod ops;

mod p2p;
pub mod pin;
pub mod reference;
pub mod timing;
mod worker;

pub use buffer::NcclBuffer;

use comm::{nccl_present, version_string};
use concord_core::caps::{AliasPolicy, Capabilities, Gap, IntAvg, NanPolicy};
use concord_core::fused::Gathered;
#[cfg(doc)]
use concord_core::CollectiveError; // named by the crate docs
use concord_core::{Backend, DType, OpKind, OutstandingCounter, ReduceOp, Result, Tensor, Work, WorldInfo};
use cuda::Device;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use worker::{Channel, Progress};

/// Why NCCL cannot run here, or what it would run on.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeInfo {
    /// NCCL's version, e.g. `2.28.9`.
    pub nccl_version: String,
    /// Visible CUDA devices.
    pub gpus: usize,
}

/// Checks, without panicking and without touching any GPU state beyond `cuInit`, whether the
/// CUDA driver and NCCL load and how many GPUs are visible. `Err` names what is missing.
pub fn probe() -> std::result::Result<ProbeInfo, String> {
    if !cuda::driver_present() {
        return Err("the CUDA driver library (libcuda) could not be loaded: no NVIDIA driver on this machine".into());
    }
    let gpus = std::panic::catch_unwind(cuda::device_count).map_err(|_| "the CUDA driver panicked in cuInit".to_string())??;
    let v = nccl_present()?;
    Ok(ProbeInfo { nccl_version: version_string(v), gpus })
}

/// The NCCL backend: one instance per rank (and per subgroup). See the crate docs.
pub struct NcclBackend {
    // Dropped first: the progress thread (shared with subgroups) drains its queue before the
    // communicator below is torn down.
    progress: Arc<Progress>,
    rank: usize,
    ws: usize,
    /// `nccl` for the world, `nccl:gN` for subgroups (progress records are keyed by it; shared
    /// with every pending op's records, not copied per op).
    label: Arc<str>,
    chan: Arc<Channel>,
    dev: Arc<Device>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    /// Collective and point-to-point calls issued so far (fault injection's `#N`).
    nth: AtomicU64,
    /// Injected faults (`fault` option; empty for subgroups).
    faults: Arc<fault::Faults>,
    counter: OutstandingCounter,
    op_timeout: Duration,
    validate: AtomicBool,
    barrier_buf: NcclBuffer,
    init_time: Duration,
    gpus: usize,
    /// The world's store (shared with subgroups): point-to-point directions meet through it.
    store: Option<Arc<concord_store::Store>>,
}

impl NcclBackend {
    /// Wall time `init` took (CUDA context + rendezvous + `ncclCommInitRankConfig`).
    pub fn init_time(&self) -> Duration {
        self.init_time
    }
    /// The loaded NCCL's version, e.g. `2.28.9`.
    pub fn nccl_version(&self) -> String {
        version_string(self.chan.comm.lib_version)
    }
    /// The CUDA device (visible ordinal) this rank drives.
    pub fn device_ordinal(&self) -> usize {
        self.dev.ordinal
    }
    /// Whether collectives are validated across ranks.
    pub fn validating(&self) -> bool {
        self.validate.load(Ordering::SeqCst)
    }
    /// Turns cross-rank validation on or off. Every rank MUST make the same call at the same
    /// point of its sequence of collectives (e.g. right after a barrier).
    pub fn set_validation(&self, on: bool) {
        self.validate.store(on, Ordering::SeqCst);
    }

    /// [`Backend::capabilities`] for the issue path's call checks, built once per process and
    /// (GPUs, world size, validation) — what it depends on — instead of once per call (it
    /// allocates a few dozen strings: about a microsecond on every issue).
    pub(crate) fn issue_caps(&self) -> Arc<Capabilities> {
        type Key = (usize, usize, bool);
        static CACHE: std::sync::Mutex<Vec<(Key, Arc<Capabilities>)>> = std::sync::Mutex::new(Vec::new());
        let key = (self.gpus, self.ws, self.validating());
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = cache.iter().find(|(k, _)| *k == key) {
            return c.clone();
        }
        let c = Arc::new(self.capabilities());
        cache.push((key, c.clone()));
        c
    }
}

impl Backend for NcclBackend {
    type Buffer = NcclBuffer;
    /// NCCL's shared-memory transport segments (`/dev/shm/nccl-XXXXXX`; no setting renames them).
    const SHM_PREFIXES: &'static [&'static str] = &["nccl-"];

    fn init(world: &WorldInfo) -> Result<Self> {
        Self::init_impl(world)
    }

    fn name(&self) -> &str {
        "nccl"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.ws
    }

    // MUST depend only on (gpus, ws, validating()): `issue_caps` caches it by those.
    fn capabilities(&self) -> Capabilities {
        let mut gaps = vec![
            Gap::reduce("band", "NCCL has no bitwise reductions"),
            Gap::reduce("bor", "NCCL has no bitwise reductions"),
            Gap::reduce("bxor", "NCCL has no bitwise reductions"),
        ];
        for d in [DType::I16, DType::U16] {
            for op in [OpKind::AllReduce, OpKind::ReduceScatterTensor, OpKind::Reduce] {
                gaps.push(Gap {
                    op: Some(op),
                    variant: None,
                    dtype: Some(d),
                    reduce: None,
                    reason: format!("NCCL has no {d} type: it moves {d} as bytes but cannot reduce it"),
                });
            }
        }
        Capabilities {
            dtypes: DType::ALL.to_vec(),
            max_world_size: self.gpus.max(self.ws),
            nan_minmax: NanPolicy::Ignore,
            int_avg: IntAvg::Truncate,
            aliasing: AliasPolicy::Reject,
            validates_across_ranks: self.validating(),
            moves_data: true,
            subgroups: true,
            // NCCL documents ops on different communicators as safe only when every rank
            // submits them in the same order (review21 finding 4), and this backend runs every
            // collective communicator of a device on one stream: the two crossing cases
            // deadlocked on 3 x H200 before this declaration (docs/RESULTS.md).
            concurrent_communicators: false,
            // cuBLAS + NCCL, overlapped (`fused_gpu`; the scaled variants stay decomposed) when
            // libcublas loads and `fused_overlap` is not 0; else the trait's decomposition.
            fused: if fused_gpu::native() { concord_core::FusedImpl::Pipelined } else { concord_core::FusedImpl::Decomposed },
            // NCCL reduces f16 / bf16 hop by hop (ring / tree order, rounding at each step).
            rounding: concord_core::Rounding::Unspecified,
            gaps,
        }
    }

    fn outstanding(&self) -> usize {
        self.counter.get()
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        self.new_group_impl(ranks)
    }

    fn fault_hooks(&self) -> Vec<(String, concord_core::fault::Action)> {
        fault::hooks()
    }

    // ---- buffers ----

    fn upload(&self, t: &Tensor) -> Result<NcclBuffer> {
        self.upload_impl(t)
    }

    fn download(&self, b: &NcclBuffer) -> Result<Tensor> {
        self.download_impl(b)
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        self.alloc_impl(dtype, shape)
    }

    fn write(&self, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        self.write_impl(b, t)
    }

    fn view(&self, b: &NcclBuffer, offset: usize, shape: &[usize]) -> Result<NcclBuffer> {
        self.view_impl(b, offset, shape)
    }

    fn buffer_addr(&self, b: &NcclBuffer) -> usize {
        b.ptr() as usize
    }
    fn buffer_dtype(&self, b: &NcclBuffer) -> DType {
        b.dtype
    }
    fn buffer_shape(&self, b: &NcclBuffer) -> Vec<usize> {
        b.shape.clone()
    }

    // ---- collectives ----

    fn all_reduce(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        self.all_reduce_impl("all_reduce", x, op, false)
    }

    fn all_reduce_(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        self.all_reduce_impl("all_reduce_", x, op, true)
    }

    fn all_reduce_coalesced(&self, xs: &[NcclBuffer], op: ReduceOp) -> Result<Work<Vec<NcclBuffer>>> {
        self.all_reduce_coalesced_impl("all_reduce_coalesced", xs, op, false)
    }

    fn all_reduce_coalesced_(&self, xs: &[NcclBuffer], op: ReduceOp) -> Result<Work<Vec<NcclBuffer>>> {
        self.all_reduce_coalesced_impl("all_reduce_coalesced_", xs, op, true)
    }

    fn all_gather_into_tensor(&self, x: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        self.all_gather_into_tensor_impl(x)
    }

    fn all_gather_into_tensor_out(&self, x: &NcclBuffer, out: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        self.all_gather_into_tensor_out_impl(x, out)
    }

    fn all_gather_into_tensor_coalesced(&self, xs: &[NcclBuffer]) -> Result<Work<Vec<NcclBuffer>>> {
        self.all_gather_into_tensor_coalesced_impl(xs)
    }

    fn reduce_scatter_tensor(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        self.reduce_scatter_tensor_impl(x, op)
    }

    fn reduce_scatter_tensor_out(&self, x: &NcclBuffer, op: ReduceOp, out: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        self.reduce_scatter_tensor_out_impl(x, op, out)
    }

    fn reduce_scatter_tensor_coalesced(&self, xs: &[NcclBuffer], op: ReduceOp) -> Result<Work<Vec<NcclBuffer>>> {
        self.reduce_scatter_tensor_coalesced_impl(xs, op)
    }

    fn all_to_all_single(
        &self,
        x: &NcclBuffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<Work<NcclBuffer>> {
        self.all_to_all_single_impl(x, output_splits, input_splits)
    }

    fn broadcast(&self, x: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        self.broadcast_impl("broadcast", x, src, false)
    }

    fn broadcast_(&self, x: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        self.broadcast_impl("broadcast_", x, src, true)
    }

    fn permute_tensor(&self, x: &NcclBuffer, src_dst: &[usize]) -> Result<Work<NcclBuffer>> {
        self.permute_tensor_impl(x, src_dst)
    }

    fn reduce(&self, x: &NcclBuffer, op: ReduceOp, root: usize) -> Result<Work<NcclBuffer>> {
        self.reduce_impl(x, op, root)
    }

    fn gather(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        self.gather_impl(x, root)
    }

    fn scatter(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        self.scatter_impl(x, root)
    }

    fn send(&self, x: &NcclBuffer, dst: usize) -> Result<Work<()>> {
        self.send_impl(x, dst)
    }

    fn recv(&self, out: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        self.recv_impl(out, src)
    }

    fn barrier(&self) -> Result<Work<()>> {
        self.barrier_impl()
    }

    // ---- fused communication + compute (`fused_gpu`; the scaled variants: the trait's) ----

    fn fused_all_gather_matmul(&self, a_shard: &NcclBuffer, bs: &[NcclBuffer], gather_dim: usize) -> Result<Work<Gathered<NcclBuffer>>> {
        self.fused_all_gather_matmul_impl(a_shard, bs, gather_dim)
    }

    fn fused_matmul_reduce_scatter(&self, a: &NcclBuffer, b: &NcclBuffer, op: ReduceOp, scatter_dim: usize) -> Result<Work<NcclBuffer>> {
        self.fused_matmul_reduce_scatter_impl(a, b, op, scatter_dim)
    }

    fn low_contention_all_gather(&self, x: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        self.low_contention_impl(x, None)
    }

    fn low_contention_reduce_scatter(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        self.low_contention_impl(x, Some(op))
    }
}
