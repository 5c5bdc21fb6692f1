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
//! * **Buffers.** [`NcclBuffer`] is device memory (Arc-shared, views by offset), allocated and
//!   freed stream-ordered on the rank's one stream, which every NCCL call and copy also uses.
//! * **Issue is asynchronous.** Every collective MUST return its [`Work`] at once, even while
//!   its peers are absent. The calling thread does the local checks (a bad root, indivisible
//!   shapes, a wrong-size `_out` buffer... are returned at issue as a named
//!   [`CollectiveError::BadInput`]), allocates the output and queues a job. One progress thread
//!   per rank (see `worker`), shared by the world and its subgroups, runs the jobs in issue
//!   order: it is the only thread making NCCL calls, so every rank launches in the same order.
//!   A job keeps the buffers it uses alive until its NCCL calls are enqueued.
//! * **Validation.** Before every collective the progress thread all-gathers a small header (op,
//!   sequence number, dtype, shape, reduce op, root, splits, local errors) on a side buffer and
//!   runs the same pure check (see `header`), so mismatched inputs end on *every* rank in the same
//!   named [`CollectiveError::BadInput`] (at wait) instead of an NCCL hang or silent truncation.
//!   A rank that rejected its input at issue still sends its header, marked with the error, so
//!   its peers fail too and the sequence stays in step. Send/recv pairs exchange headers between
//!   the two peers. Option `validate=0` turns this off (then
//!   `capabilities().validates_across_ranks` is false). With validation on, op k+1 is launched
//!   only after op k's headers have been exchanged.
//! * **Completion.** A [`Work`] completes once its job has launched and a CUDA event recorded
//!   after the op has completed; `is_completed()` is false while the job waits for its peers. A
//!   wait that runs out of its own timeout leaves the op (and the communicator) alone. A
//!   collective pending longer than the world's op deadline (counted from issue) aborts the
//!   communicator (`ncclCommAbort`) and ends in [`CollectiveError::Timeout`] with op and
//!   sequence number; later ops on that communicator fail at issue with
//!   [`CollectiveError::Aborted`]. No call waits without a deadline.
//! * **Ordering of copies.** `upload` and `write` are finished (in stream order) before they
//!   return, so an op issued after them sees the data; `write` first waits (bounded) until every
//!   op issued before it has been launched, so it lands after them. `download` after a
//!   successful wait sees the final result.
//! * **Semantics.** Declared in [`NcclBackend::capabilities`]: no bitwise reductions (NCCL has
//!   none), no reductions on i16/u16 (NCCL has no 16-bit integer type; they move as bytes),
//!   min/max ignore NaN (NaN only when every rank has NaN; min(-0, +0) = -0, max = +0), integer
//!   avg truncates toward zero — as observed on NCCL 2.28.3 (2 × H200); the suites' `caps::*`
//!   probes re-check the declaration on every conformance run.
//! * **Safety of shared GPUs.** If `NCCL_NVLS_ENABLE` is unset, `init` sets it to `0`: NVLink
//!   multicast is never used unless the user asks for it explicitly.
//!
//! Options (`WorldInfo::options`): `validate=0|1` (default 1), `blocking=0|1` (default 0),
//! `init_timeout_ms=N` (default: the larger of the op deadline and 30 s).
//!
//! Cost of the defaults (2 × H200, NCCL 2.28.3, 1 KiB all_reduce issue + wait, through the
//! progress thread): non-blocking communicator ~76 us unvalidated / ~163 us validated;
//! `blocking=1` ~21 us / ~49 us (the same as when issue ran on the caller's thread). A blocking
//! communicator still aborts a collective whose GPU kernels hang, but a peer lost while NCCL
//! is connecting (first use of a peer or algorithm) can then block the progress thread inside
//! NCCL (waits still end at the op deadline; the abort itself may then wait for that call).

#![allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80

mod comm;
mod completion;
mod cuda;
pub mod header;
mod worker;

use comm::{nccl_present, red_fns, version_string, Comm};
use completion::NcclCompletion;
use concord_core::caps::{AliasPolicy, Capabilities, Gap, IntAvg, NanPolicy};
use concord_core::{
    progress, Backend, BadInputKind, CollectiveError, DType, OpKind, OutstandingCounter, ReduceOp,
    Result, Tensor, Work, WorkMeta, WorldInfo,
};
use cuda::{DevMem, Device};
use cudarc::nccl::sys as nccl;
use header::{hash_words, Header};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::{check, Channel, Check, Job, Launch, OpId, Progress, Ticket};

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
    let gpus = std::panic::catch_unwind(cuda::device_count)
        .map_err(|_| "the CUDA driver panicked in cuInit".to_string())??;
    let v = nccl_present()?;
    Ok(ProbeInfo {
        nccl_version: version_string(v),
        gpus,
    })
}

/// A buffer in one rank's GPU memory: a view (byte offset, dtype, shape) of an Arc-shared
/// allocation. Cloning clones the handle.
#[derive(Clone)]
pub struct NcclBuffer {
    mem: Arc<DevMem>,
    offset: usize,
    dtype: DType,
    shape: Vec<usize>,
}

impl NcclBuffer {
    fn ptr(&self) -> u64 {
        self.mem.ptr + self.offset as u64
    }
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// Rows of dim 0 and elements per row (a 0-dim buffer is one row of one element).
    fn rows(&self) -> (usize, usize) {
        match self.shape.split_first() {
            None => (1, 1),
            Some((d0, rest)) => (*d0, rest.iter().product()),
        }
    }
    fn overlaps(&self, other: &NcclBuffer) -> bool {
        let (a0, a1) = (self.ptr(), self.ptr() + self.nbytes() as u64);
        let (b0, b1) = (other.ptr(), other.ptr() + other.nbytes() as u64);
        a0 < b1 && b0 < a1 && self.nbytes() > 0 && other.nbytes() > 0
    }
}

impl std::fmt::Debug for NcclBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclBuffer<{}>{:?}@{:#x} (GPU {})",
            self.dtype,
            self.shape,
            self.ptr(),
            self.mem.dev.ordinal
        )
    }
}

/// NCCL's type for `d`, if it has one (not for i16 / u16).
fn nccl_dtype(d: DType) -> Option<nccl::ncclDataType_t> {
    use nccl::ncclDataType_t::*;
    Some(match d {
        DType::I8 => ncclInt8,
        DType::U8 => ncclUint8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::I16 | DType::U16 => return None,
    })
}

/// Type and count to *move* `numel` elements (dtypes NCCL lacks move as bytes).
fn move_type(d: DType, numel: usize) -> (nccl::ncclDataType_t, usize) {
    match nccl_dtype(d) {
        Some(t) => (t, numel),
        None => (nccl::ncclDataType_t::ncclUint8, numel * d.size()),
    }
}

/// A reduce op as NCCL sees it.
#[derive(Clone, Copy)]
enum Red {
    Builtin(u32),
    PreMul(f64),
}

type Local = std::result::Result<(), (BadInputKind, String)>;

fn red_check(op: ReduceOp, d: DType) -> std::result::Result<Red, (BadInputKind, String)> {
    if op.is_bitwise() {
        return Err((
            BadInputKind::UnsupportedOp,
            format!("NCCL has no bitwise reductions ({})", op.name()),
        ));
    }
    if !op.defined_for(d) {
        return Err((
            BadInputKind::UnsupportedDType,
            format!("{} is not defined for {d}", op.name()),
        ));
    }
    if nccl_dtype(d).is_none() {
        return Err((
            BadInputKind::UnsupportedDType,
            format!("NCCL has no {d} type, so it cannot reduce {d}"),
        ));
    }
    Ok(match op {
        ReduceOp::Sum => Red::Builtin(0),
        ReduceOp::Product => Red::Builtin(1),
        ReduceOp::Max => Red::Builtin(2),
        ReduceOp::Min => Red::Builtin(3),
        ReduceOp::Avg => Red::Builtin(4),
        ReduceOp::PremulSum(s) => Red::PreMul(s),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => unreachable!("rejected above"),
    })
}

/// The scalar of a premul-sum op in `d`'s representation (little-endian, padded to 8 bytes).
fn premul_scalar(d: DType, s: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    match d {
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(s).to_bits().to_le_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(s).to_bits().to_le_bytes()),
        DType::F32 => b[..4].copy_from_slice(&(s as f32).to_le_bytes()),
        _ => b.copy_from_slice(&s.to_le_bytes()),
    }
    b
}

/// Shape of an all-gather / gather result: `[ws * d0, rest..]`, `[ws]` for a 0-dim input.
fn gathered_shape(shape: &[usize], ws: usize) -> Vec<usize> {
    match shape.split_first() {
        None => vec![ws],
        Some((d0, rest)) => std::iter::once(d0 * ws)
            .chain(rest.iter().copied())
            .collect(),
    }
}

/// Marks a collective in flight in [`progress`] until handed to a completion or dropped.
struct InFlight {
    label: String,
    seq: u64,
    armed: bool,
}
impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            progress::end(&self.label, self.seq);
        }
    }
}

/// One issued op: names and numbers for messages and validation.
struct Op {
    name: &'static str,
    seq: u64,
    cseq: u64,
    issued: Instant,
    flight: InFlight,
}

impl Op {
    fn id(&self) -> OpId {
        OpId {
            name: self.name,
            seq: self.seq,
            issued: self.issued,
        }
    }
}

static GROUP_IDS: AtomicU64 = AtomicU64::new(1);

/// The NCCL backend: one instance per rank (and per subgroup). See the crate docs.
pub struct NcclBackend {
    // Dropped first: the progress thread (shared with subgroups) drains its queue before the
    // communicator below is torn down.
    progress: Arc<Progress>,
    rank: usize,
    ws: usize,
    /// `nccl` for the world, `nccl:gN` for subgroups (progress records are keyed by it).
    label: String,
    chan: Arc<Channel>,
    dev: Arc<Device>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    counter: OutstandingCounter,
    op_timeout: Duration,
    validate: AtomicBool,
    barrier_buf: NcclBuffer,
    init_time: Duration,
    gpus: usize,
    _store: Option<concord_harness::store::FileStore>,
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

    #[allow(clippy::too_many_arguments)]
    fn from_comm(
        comm: Comm,
        label: String,
        op_timeout: Duration,
        validate: bool,
        init_time: Duration,
        gpus: usize,
        store: Option<concord_harness::store::FileStore>,
        progress: Option<Arc<Progress>>,
    ) -> std::result::Result<NcclBackend, String> {
        let dev = comm.dev.clone();
        let comm = Arc::new(comm);
        let chan = Channel::new(comm.clone(), op_timeout)?;
        let barrier_buf = NcclBuffer {
            mem: Arc::new(dev.alloc(4)?),
            offset: 0,
            dtype: DType::I32,
            shape: vec![1],
        };
        let progress = match progress {
            Some(p) => p,
            None => Progress::start(dev.clone())?,
        };
        Ok(NcclBackend {
            progress,
            rank: comm.rank,
            ws: comm.nranks,
            label,
            chan: Arc::new(chan),
            dev,
            seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
            op_timeout,
            validate: AtomicBool::new(validate),
            barrier_buf,
            init_time,
            gpus,
            _store: store,
        })
    }

    fn comm(&self) -> &Arc<Comm> {
        &self.chan.comm
    }

    fn backend_err(&self, op: &str, seq: u64, msg: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("nccl {op} #{seq} on rank {}: {msg}", self.rank))
    }

    fn bind(&self, op: &str) -> Result<()> {
        self.dev
            .bind()
            .map_err(|e| CollectiveError::Backend(format!("nccl {op} on rank {}: {e}", self.rank)))
    }

    /// Starts an op: binds the device, numbers it, records it in flight.
    fn begin(&self, name: &'static str, collective: bool) -> Result<Op> {
        self.bind(name)?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let cseq = if collective {
            self.coll_seq.fetch_add(1, Ordering::SeqCst)
        } else {
            0
        };
        progress::begin(&self.label, name, seq);
        Ok(Op {
            name,
            seq,
            cseq,
            issued: Instant::now(),
            flight: InFlight {
                label: self.label.clone(),
                seq,
                armed: true,
            },
        })
    }

    fn bad(&self, op: &Op, kind: BadInputKind, detail: impl Into<String>) -> CollectiveError {
        CollectiveError::bad_input(kind, op.name, op.seq, self.rank, detail)
    }

    /// `Err(Aborted)` once the communicator has been aborted: later ops fail at issue.
    fn alive(&self, op: &Op) -> Result<()> {
        match self.comm().aborted() {
            Some(why) => Err(self.chan.aborted_err(&op.id(), &why)),
            None => Ok(()),
        }
    }

    /// Waits (bounded by the op deadline) for everything queued on the stream.
    fn drain(&self, op: &Op) -> Result<()> {
        self.chan.drain(&op.id(), op.issued + self.op_timeout)
    }

    /// Waits (bounded by the op deadline) until the progress thread has launched (or failed)
    /// every op issued before `op`, so that `op` is ordered after them on the stream.
    fn flush(&self, op: &Op) -> Result<()> {
        if self.progress.flush(op.issued + self.op_timeout) {
            return Ok(());
        }
        Err(CollectiveError::Timeout {
            op: op.name.to_string(),
            seq: op.seq,
            rank: self.rank,
            waited_ms: op.issued.elapsed().as_millis() as u64,
            detail: format!(
                "collectives issued before it were still waiting for their peers at the op deadline \
                 of {} ms; this process is {}",
                self.op_timeout.as_millis(),
                progress::describe()
            ),
        })
    }

    /// A local input error: returned at issue. With validation on, the peers still need this
    /// rank's header for this collective, so an exchange carrying the error is queued: every
    /// rank then ends the collective in the same named error, and the sequence stays in step.
    fn reject(
        &self,
        op: &Op,
        hdr: &Header,
        (kind, detail): (BadInputKind, String),
    ) -> CollectiveError {
        if self.validating() && self.comm().aborted().is_none() {
            self.progress.submit(Job::Op {
                chan: self.chan.clone(),
                id: op.id(),
                check: Check::All(hdr.clone().error(kind)),
                launch: None,
                ticket: None,
            });
        }
        self.bad(op, kind, detail)
    }

    /// `local`'s value, or [`Self::reject`]'s error.
    fn local_ok<T>(
        &self,
        op: &Op,
        hdr: &Header,
        local: std::result::Result<T, (BadInputKind, String)>,
    ) -> Result<T> {
        local.map_err(|e| self.reject(op, hdr, e))
    }

    fn new_header(&self, op: &Op) -> Header {
        Header::new(self.ws, op.name, op.cseq)
    }

    fn alloc_buf(&self, op: &Op, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let mem = self
            .dev
            .alloc(bytes)
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        Ok(NcclBuffer {
            mem: Arc::new(mem),
            offset: 0,
            dtype,
            shape: shape.to_vec(),
        })
    }

    fn meta(&self, op: &Op) -> WorkMeta {
        WorkMeta {
            backend: "nccl".into(),
            op: op.name.to_string(),
            seq: op.seq,
            rank: self.rank,
        }
    }

    fn done<T>(&self, op: Op, value: T) -> Work<T> {
        Work::done(value, self.meta(&op), &self.counter)
    }

    /// Queues `op` for the progress thread (cross-rank `check` when validating, then `launch`)
    /// and returns its pending [`Work`] at once.
    fn submit<T>(
        &self,
        mut op: Op,
        value: T,
        check: Check,
        launch: Option<Launch>,
    ) -> Result<Work<T>> {
        let check = if self.validating() {
            check
        } else {
            Check::None
        };
        if matches!(check, Check::None) && launch.is_none() {
            return Ok(self.done(op, value));
        }
        self.alive(&op)?;
        let ticket = Ticket::new();
        self.progress.submit(Job::Op {
            chan: self.chan.clone(),
            id: op.id(),
            check,
            launch,
            ticket: Some(ticket.clone()),
        });
        op.flight.armed = false;
        let completion = NcclCompletion {
            comm: self.comm().clone(),
            ticket,
            label: self.label.clone(),
            op: op.name.to_string(),
            seq: op.seq,
            rank: self.rank,
            issued: op.issued,
            op_timeout: self.op_timeout,
            state: Mutex::new(None),
            progress_open: AtomicBool::new(true),
        };
        Ok(Work::new(
            value,
            Arc::new(completion),
            self.meta(&op),
            &self.counter,
        ))
    }

    /// The premul-sum ops a launch must create (one per distinct dtype and scalar).
    fn premul_list(reds: &[(Red, DType)]) -> Vec<(nccl::ncclDataType_t, [u8; 8])> {
        let mut v: Vec<(nccl::ncclDataType_t, [u8; 8])> = Vec::new();
        for (r, d) in reds {
            if let (Red::PreMul(s), Some(t)) = (r, nccl_dtype(*d)) {
                let item = (t, premul_scalar(*d, *s));
                if !v.iter().any(|(t2, b2)| *t2 == item.0 && *b2 == item.1) {
                    v.push(item);
                }
            }
        }
        v
    }

    /// The shared part of `send` / `recv` (`name`): the peer check, the header paired with the
    /// peer's, and one ncclSend / ncclRecv of the whole buffer (none when it is empty).
    fn point_to_point(
        &self,
        name: &'static str,
        buf: &NcclBuffer,
        peer: usize,
    ) -> Result<(Op, Check, Option<Launch>)> {
        let o = self.begin(name, false)?;
        if peer >= self.ws || peer == self.rank {
            let dir = if name == "send" { "to" } else { "from" };
            let detail = format!(
                "{name} {dir} rank {peer} on rank {} in a world of {}",
                self.rank, self.ws
            );
            return Err(self.bad(&o, BadInputKind::BadPeer, detail));
        }
        let mine = Header::new(self.ws, name, 0)
            .tensor(buf.dtype, &buf.shape)
            .peer(peer);
        let is_send = name == "send";
        let launch = (buf.numel() > 0).then(|| {
            p2p_launch(
                vec![(is_send, buf.ptr(), buf.numel(), peer)],
                buf.dtype,
                keep(&[buf]),
            )
        });
        Ok((o, Check::Pair(mine, peer), launch))
    }

    /// The launch of one elementwise NCCL reduction (`ncclAllReduce` or `ncclReduceScatter`,
    /// chosen by `pick`) per job `(src, dst, count, dtype, op)`; empty jobs are skipped, and no
    /// launch at all when nothing is left. `keep_alive` buffers live until the calls are enqueued.
    fn reduction_launch(
        &self,
        o: &Op,
        jobs: Vec<(u64, u64, usize, DType, Red)>,
        keep_alive: &[&NcclBuffer],
        pick: fn(&comm::RedFns) -> comm::ElementwiseRedFn,
        label: &'static str,
    ) -> Result<Option<Launch>> {
        let jobs: Vec<_> = jobs.into_iter().filter(|j| j.2 > 0).collect();
        if jobs.is_empty() {
            return Ok(None);
        }
        let reds: Vec<(Red, DType)> = jobs.iter().map(|j| (j.4, j.3)).collect();
        let premul = Self::premul_list(&reds);
        let call = pick(red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?);
        let p2 = premul.clone();
        Ok(Some(Launch {
            premul,
            keep: keep(keep_alive),
            calls: Box::new(move |c, s, ops| {
                for (src, dst, n, d, red) in jobs {
                    let t = nccl_dtype(d).expect("checked");
                    // SAFETY: src/dst are live device buffers of at least n elements of d (kept
                    // alive by `keep`), and c/s are this communicator's handle and stream.
                    check(
                        unsafe {
                            call(
                                src as *const c_void,
                                dst as *mut c_void,
                                n,
                                t,
                                Self::op_code(red, d, &p2, ops),
                                c,
                                s,
                            )
                        },
                        label,
                    )?;
                }
                Ok(())
            }),
        }))
    }

    /// The reduce op for NCCL calls, given the premul ops the launch created (`premul` order).
    fn op_code(red: Red, d: DType, premul: &[(nccl::ncclDataType_t, [u8; 8])], ops: &[u32]) -> u32 {
        match red {
            Red::Builtin(c) => c,
            Red::PreMul(s) => {
                let key = (nccl_dtype(d).expect("checked"), premul_scalar(d, s));
                let i = premul
                    .iter()
                    .position(|p| *p == key)
                    .expect("premul op created for every premul dtype");
                ops[i]
            }
        }
    }

    // ---- shared bodies ----

    fn all_reduce_impl(
        &self,
        name: &'static str,
        x: &NcclBuffer,
        op: ReduceOp,
        in_place: bool,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, red_check(op, x.dtype))?;
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        let jobs = vec![(x.ptr(), out.ptr(), x.numel(), x.dtype, red)];
        let launch =
            self.reduction_launch(&o, jobs, &[x, &out], |f| f.all_reduce, "ncclAllReduce")?;
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn all_reduce_coalesced_impl(
        &self,
        name: &'static str,
        xs: &[NcclBuffer],
        op: ReduceOp,
        in_place: bool,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin(name, true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        let reds = xs
            .iter()
            .map(|x| red_check(op, x.dtype).map(|r| (r, x.dtype)))
            .collect::<std::result::Result<Vec<(Red, DType)>, _>>();
        let reds = self.local_ok(&o, &hdr, reds)?;
        let outs: Vec<NcclBuffer> = if in_place {
            xs.to_vec()
        } else {
            xs.iter()
                .map(|x| self.alloc_buf(&o, x.dtype, &x.shape))
                .collect::<Result<_>>()?
        };
        let jobs: Vec<(u64, u64, usize, DType, Red)> = xs
            .iter()
            .zip(&outs)
            .zip(&reds)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), x.numel(), *d, *r))
            .collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(
            &o,
            jobs,
            &bufs,
            |f| f.all_reduce,
            "ncclAllReduce (coalesced)",
        )?;
        self.submit(o, outs, Check::All(hdr), launch)
    }

    fn reduce_scatter_local(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
    ) -> std::result::Result<Red, (BadInputKind, String)> {
        if x.shape.is_empty() {
            return Err((
                BadInputKind::ZeroDim,
                "reduce_scatter needs at least one dimension".into(),
            ));
        }
        if x.shape[0] % self.ws != 0 {
            return Err((
                BadInputKind::Indivisible,
                format!(
                    "dim 0 ({}) is not divisible by the world size {}",
                    x.shape[0], self.ws
                ),
            ));
        }
        red_check(op, x.dtype)
    }

    fn scattered_shape(&self, x: &NcclBuffer) -> Vec<usize> {
        let mut s = x.shape.clone();
        if let Some(d0) = s.first_mut() {
            *d0 /= self.ws;
        }
        s
    }

    fn out_checks(&self, x: &NcclBuffer, out: &NcclBuffer, numel: usize, what: &str) -> Local {
        if out.dtype != x.dtype {
            return Err((
                BadInputKind::DTypeMismatch,
                format!(
                    "{what} output is {} but the input is {}",
                    out.dtype, x.dtype
                ),
            ));
        }
        if out.numel() != numel {
            return Err((
                BadInputKind::OutBufferSize,
                format!(
                    "{what} output holds {} elements ({:?}), needs {numel}",
                    out.numel(),
                    out.shape
                ),
            ));
        }
        if out.overlaps(x) {
            return Err((
                BadInputKind::Aliasing,
                format!("{what} output overlaps its input"),
            ));
        }
        Ok(())
    }

    fn root_check(&self, root: usize) -> Local {
        if root >= self.ws {
            return Err((
                BadInputKind::BadRoot,
                format!("root {root} is out of range for a world of {}", self.ws),
            ));
        }
        Ok(())
    }
}

/// The device memory behind `bufs`, for a [`Launch`] to keep alive until it is enqueued.
fn keep(bufs: &[&NcclBuffer]) -> Vec<Arc<DevMem>> {
    bufs.iter().map(|b| b.mem.clone()).collect()
}

fn opt_flag(world: &WorldInfo, key: &str, default: bool) -> bool {
    match world.option(key) {
        Some(v) => matches!(v, "1" | "true" | "yes" | "on"),
        None => default,
    }
}
impl Backend for NcclBackend {
    type Buffer = NcclBuffer;

    fn init(world: &WorldInfo) -> Result<Self> {
        let started = Instant::now();
        let (rank, ws) = (world.rank, world.world_size);
        if ws == 0 || rank >= ws {
            return Err(CollectiveError::Backend(format!(
                "nccl init: rank {rank} is not in a world of {ws}"
            )));
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
        let info = probe().map_err(|e| CollectiveError::Unsupported(format!("nccl: {e}")))?;
        if ws > info.gpus {
            return Err(CollectiveError::Unsupported(format!(
                "nccl: needs {ws} GPUs, found {}",
                info.gpus
            )));
        }
        let lib_version =
            nccl_present().map_err(|e| CollectiveError::Unsupported(format!("nccl: {e}")))?;
        let validate = opt_flag(world, "validate", true);
        let blocking = opt_flag(world, "blocking", false);
        let init_timeout = world
            .option("init_timeout_ms")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or_else(|| world.op_timeout.max(Duration::from_secs(30)));
        let deadline = started + init_timeout;
        let fail = |what: &str, e: String| {
            CollectiveError::Backend(format!("nccl init on rank {rank}: {what}: {e}"))
        };

        let dev = Device::new(rank).map_err(|e| fail("CUDA device", e))?;
        let store = concord_harness::store::FileStore::open(&world.store_path, ws, init_timeout)
            .map_err(|e| fail("opening the file store", e.to_string()))?;
        let key = format!("concord/nccl/{}/unique_id", world.world_id);
        let id = if rank == 0 {
            let mut id = nccl::ncclUniqueId { internal: [0; 128] };
            let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
            if r != nccl::ncclResult_t::ncclSuccess {
                return Err(fail("ncclGetUniqueId", comm::err_string(r)));
            }
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            store
                .set(&key, &bytes)
                .map_err(|e| fail("publishing the NCCL unique id", e.to_string()))?;
            id
        } else {
            let bytes = store
                .get(&key)
                .map_err(|e| fail("reading rank 0's NCCL unique id", e.to_string()))?;
            if bytes.len() != 128 {
                return Err(fail(
                    "reading rank 0's NCCL unique id",
                    format!("{} bytes, expected 128", bytes.len()),
                ));
            }
            let mut id = nccl::ncclUniqueId { internal: [0; 128] };
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as _;
            }
            id
        };
        let comm = Comm::init(dev, ws, rank, id, blocking, lib_version, deadline)
            .map_err(|e| fail("communicator", e))?;
        let init_time = started.elapsed();
        NcclBackend::from_comm(
            comm,
            "nccl".into(),
            world.op_timeout,
            validate,
            init_time,
            info.gpus,
            Some(store),
            None,
        )
        .map_err(|e| fail("side buffers", e))
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

    fn capabilities(&self) -> Capabilities {
        let mut gaps = vec![
            Gap::reduce("band", "NCCL has no bitwise reductions"),
            Gap::reduce("bor", "NCCL has no bitwise reductions"),
            Gap::reduce("bxor", "NCCL has no bitwise reductions"),
        ];
        for d in [DType::I16, DType::U16] {
            for op in [
                OpKind::AllReduce,
                OpKind::ReduceScatterTensor,
                OpKind::Reduce,
            ] {
                gaps.push(Gap {
                    op: Some(op),
                    variant: None,
                    dtype: Some(d),
                    reduce: None,
                    reason: format!(
                        "NCCL has no {d} type: it moves {d} as bytes but cannot reduce it"
                    ),
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
            gaps,
        }
    }

    fn outstanding(&self) -> usize {
        self.counter.get()
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        let o = self.begin("new_group", true)?;
        let mut seen = vec![false; self.ws];
        let mut local: Local = Ok(());
        if ranks.is_empty() {
            local = Err((
                BadInputKind::BadGroup,
                "a subgroup needs at least one rank".into(),
            ));
        }
        for &r in ranks {
            if r >= self.ws {
                local = Err((
                    BadInputKind::BadGroup,
                    format!("rank {r} is out of range for a world of {}", self.ws),
                ));
                break;
            }
            if std::mem::replace(&mut seen[r], true) {
                local = Err((BadInputKind::BadGroup, format!("rank {r} is listed twice")));
                break;
            }
        }
        let hdr = self
            .new_header(&o)
            .aux(hash_words(ranks.iter().map(|&r| r as u64)))
            .error_if(&local);
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
            reply: tx,
        });
        // Bounded by the jobs' own deadlines (earlier ops, this header exchange, the split).
        let limit =
            self.op_timeout + self.op_timeout.max(Duration::from_secs(30)) + 2 * comm::ABORT_WAIT;
        let sub = match rx.recv_timeout(limit) {
            Ok(r) => r?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let waited_ms = started.elapsed().as_millis() as u64;
                self.comm().abort(format!(
                    "new_group #{} timed out after {waited_ms} ms",
                    o.seq
                ));
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
                return Err(self.backend_err(
                    "new_group",
                    o.seq,
                    "the NCCL progress thread ended without splitting the communicator",
                ))
            }
        };
        let Some(sub) = sub else { return Ok(None) };
        let label = format!("nccl:g{}", GROUP_IDS.fetch_add(1, Ordering::SeqCst));
        NcclBackend::from_comm(
            sub,
            label,
            self.op_timeout,
            self.validating(),
            started.elapsed(),
            self.gpus,
            None,
            Some(self.progress.clone()),
        )
        .map(Some)
        .map_err(|e| self.backend_err("new_group", o.seq, e))
    }

    // ---- buffers ----

    fn upload(&self, t: &Tensor) -> Result<NcclBuffer> {
        let o = self.begin("upload", false)?;
        let b = self.alloc_buf(&o, t.dtype(), t.shape())?;
        // A new buffer: no queued collective can use it, so no flush.
        self.copy_in(&o, &b, t)?;
        Ok(b)
    }

    fn download(&self, b: &NcclBuffer) -> Result<Tensor> {
        let o = self.begin("download", false)?;
        self.drain(&o)?;
        let mut t = Tensor::zeros(b.dtype, &b.shape);
        if b.nbytes() > 0 {
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(t.bytes_mut(), b.ptr()) }
                .map_err(|e| self.backend_err("download", o.seq, cuda::derr("cuMemcpyDtoH", e)))?;
        }
        Ok(t)
    }

    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        let o = self.begin("alloc", false)?;
        self.alloc_buf(&o, dtype, shape)
    }

    fn write(&self, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        let o = self.begin("write", false)?;
        self.write_checks(&o, b, t)?;
        // Ordered after every collective issued before it, as on a single stream.
        self.flush(&o)?;
        self.copy_in(&o, b, t)
    }

    fn view(&self, b: &NcclBuffer, offset: usize, shape: &[usize]) -> Result<NcclBuffer> {
        let numel: usize = shape.iter().product();
        if offset.checked_add(numel).is_none_or(|end| end > b.numel()) {
            return Err(CollectiveError::bad_input(
                BadInputKind::OutBufferSize,
                "view",
                0,
                self.rank,
                format!(
                    "a view of {numel} elements at offset {offset} does not fit in a buffer of {}",
                    b.numel()
                ),
            ));
        }
        Ok(NcclBuffer {
            mem: b.mem.clone(),
            offset: b.offset + offset * b.dtype.size(),
            dtype: b.dtype,
            shape: shape.to_vec(),
        })
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

    fn all_reduce_coalesced(
        &self,
        xs: &[NcclBuffer],
        op: ReduceOp,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        self.all_reduce_coalesced_impl("all_reduce_coalesced", xs, op, false)
    }

    fn all_reduce_coalesced_(
        &self,
        xs: &[NcclBuffer],
        op: ReduceOp,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        self.all_reduce_coalesced_impl("all_reduce_coalesced_", xs, op, true)
    }

    fn all_gather_into_tensor(&self, x: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape);
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        self.gather_all(o, hdr, x, out)
    }

    fn all_gather_into_tensor_out(
        &self,
        x: &NcclBuffer,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor_out", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape);
        let local = self.out_checks(x, out, x.numel() * self.ws, "all_gather_into_tensor_out");
        self.local_ok(&o, &hdr, local)?;
        self.gather_all(o, hdr, x, out.clone())
    }

    fn all_gather_into_tensor_coalesced(&self, xs: &[NcclBuffer]) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("all_gather_into_tensor_coalesced", true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items);
        let outs: Vec<NcclBuffer> = xs
            .iter()
            .map(|x| self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws)))
            .collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType)> = xs
            .iter()
            .zip(&outs)
            .filter(|(x, _)| x.numel() > 0)
            .map(|(x, y)| (x.ptr(), y.ptr(), x.numel(), x.dtype))
            .collect();
        let launch = (!jobs.is_empty()).then(|| Launch {
            premul: vec![],
            keep: keep(&xs.iter().chain(&outs).collect::<Vec<_>>()),
            calls: Box::new(move |c, s, _| {
                for (src, dst, n, d) in jobs {
                    let (t, n) = move_type(d, n);
                    check(
                        unsafe {
                            nccl::ncclAllGather(
                                src as *const c_void,
                                dst as *mut c_void,
                                n,
                                t,
                                c,
                                s,
                            )
                        },
                        "ncclAllGather (coalesced)",
                    )?;
                }
                Ok(())
            }),
        });
        self.submit(o, outs, Check::All(hdr), launch)
    }

    fn reduce_scatter_tensor(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, self.reduce_scatter_local(x, op))?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        self.scatter_reduce(o, hdr, x, out, red)
    }

    fn reduce_scatter_tensor_out(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor_out", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, self.reduce_scatter_local(x, op))?;
        let local = self.out_checks(x, out, x.numel() / self.ws, "reduce_scatter_tensor_out");
        self.local_ok(&o, &hdr, local)?;
        self.scatter_reduce(o, hdr, x, out.clone(), red)
    }

    fn reduce_scatter_tensor_coalesced(
        &self,
        xs: &[NcclBuffer],
        op: ReduceOp,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("reduce_scatter_tensor_coalesced", true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        let reds = xs
            .iter()
            .map(|x| self.reduce_scatter_local(x, op).map(|r| (r, x.dtype)))
            .collect::<std::result::Result<Vec<(Red, DType)>, _>>();
        let reds = self.local_ok(&o, &hdr, reds)?;
        let outs: Vec<NcclBuffer> = xs
            .iter()
            .map(|x| self.alloc_buf(&o, x.dtype, &self.scattered_shape(x)))
            .collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType, Red)> = xs
            .iter()
            .zip(&outs)
            .zip(&reds)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), y.numel(), *d, *r))
            .collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(
            &o,
            jobs,
            &bufs,
            |f| f.reduce_scatter,
            "ncclReduceScatter (coalesced)",
        )?;
        self.submit(o, outs, Check::All(hdr), launch)
    }

    fn all_to_all_single(
        &self,
        x: &NcclBuffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_to_all_single", true)?;
        let ws = self.ws;
        let d0 = x.shape.first().copied().unwrap_or(0);
        let equal = |what: &str| -> std::result::Result<Vec<usize>, (BadInputKind, String)> {
            if d0 % ws != 0 {
                return Err((
                    BadInputKind::Indivisible,
                    format!(
                        "{what} splits default to equal, but dim 0 ({d0}) is not divisible by {ws}"
                    ),
                ));
            }
            Ok(vec![d0 / ws; ws])
        };
        let splits = if x.shape.is_empty() {
            Err((
                BadInputKind::ZeroDim,
                "all_to_all_single needs at least one dimension".into(),
            ))
        } else {
            let input = match input_splits {
                Some(s) if s.len() != ws => Err((
                    BadInputKind::BadSplits,
                    format!("{} input splits for a world of {ws}", s.len()),
                )),
                Some(s) if s.iter().sum::<usize>() != d0 => Err((
                    BadInputKind::BadSplits,
                    format!(
                        "input splits {s:?} sum to {}, dim 0 is {d0}",
                        s.iter().sum::<usize>()
                    ),
                )),
                Some(s) => Ok(s.to_vec()),
                None => equal("input"),
            };
            let output = match output_splits {
                Some(s) if s.len() != ws => Err((
                    BadInputKind::BadSplits,
                    format!("{} output splits for a world of {ws}", s.len()),
                )),
                Some(s) => Ok(s.to_vec()),
                None => equal("output"),
            };
            match (input, output) {
                (Ok(i), Ok(out)) => Ok((i, out)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        let (_, row) = x.rows();
        let row_shape: Vec<u64> = x.shape.iter().skip(1).map(|&d| d as u64).collect();
        let hdr_of = |ins: &[usize], outs: &[usize]| {
            self.new_header(&o)
                .tensor(x.dtype, &x.shape)
                .aux(hash_words(
                    std::iter::once(row_shape.len() as u64).chain(row_shape.iter().copied()),
                ))
                .splits(ins, outs)
        };
        let (ins, outs) = match splits {
            Ok(s) => s,
            Err(e) => {
                let zeros = vec![0usize; ws];
                let hdr = hdr_of(&zeros, &zeros);
                return Err(self.reject(&o, &hdr, e));
            }
        };
        let hdr = hdr_of(&ins, &outs);
        let mut out_shape = x.shape.clone();
        out_shape[0] = outs.iter().sum();
        let out = self.alloc_buf(&o, x.dtype, &out_shape)?;
        let esz = x.dtype.size();
        let (src, dst, d) = (x.ptr(), out.ptr(), x.dtype);
        let mut jobs: Vec<(bool, u64, usize, usize)> = Vec::new(); // (is_send, ptr, elements, peer)
        let (mut ioff, mut ooff) = (0usize, 0usize);
        for j in 0..ws {
            if ins[j] > 0 {
                jobs.push((true, src + (ioff * row * esz) as u64, ins[j] * row, j));
            }
            if outs[j] > 0 {
                jobs.push((false, dst + (ooff * row * esz) as u64, outs[j] * row, j));
            }
            ioff += ins[j];
            ooff += outs[j];
        }
        let launch =
            (!jobs.iter().all(|j| j.2 == 0)).then(|| p2p_launch(jobs, d, keep(&[x, &out])));
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn broadcast(&self, x: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        self.broadcast_impl("broadcast", x, src, false)
    }

    fn broadcast_(&self, x: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        self.broadcast_impl("broadcast_", x, src, true)
    }

    fn permute_tensor(&self, x: &NcclBuffer, src_dst: &[usize]) -> Result<Work<NcclBuffer>> {
        let o = self.begin("permute_tensor", true)?;
        let ws = self.ws;
        let mut seen = vec![false; ws];
        let valid = src_dst.len() == ws
            && src_dst
                .iter()
                .all(|&d| d < ws && !std::mem::replace(&mut seen[d], true));
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .aux(hash_words(src_dst.iter().map(|&d| d as u64)));
        if !valid {
            return Err(self.reject(
                &o,
                &hdr,
                (
                    BadInputKind::BadPermutation,
                    format!("{src_dst:?} is not a permutation of 0..{ws}"),
                ),
            ));
        }
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = (x.numel() > 0).then(|| {
            let dst_rank = src_dst[self.rank];
            let src_rank = src_dst
                .iter()
                .position(|&d| d == self.rank)
                .expect("a permutation");
            let jobs = vec![
                (true, x.ptr(), x.numel(), dst_rank),
                (false, out.ptr(), x.numel(), src_rank),
            ];
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn reduce(&self, x: &NcclBuffer, op: ReduceOp, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce", true)?;
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .reduce(op)
            .root(root);
        self.local_ok(&o, &hdr, self.root_check(root))?;
        let red = self.local_ok(&o, &hdr, red_check(op, x.dtype))?;
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = if x.numel() == 0 {
            None
        } else {
            let premul = Self::premul_list(&[(red, x.dtype)]);
            let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
            let (src, dst, n, d) = (x.ptr(), out.ptr(), x.numel(), x.dtype);
            let p2 = premul.clone();
            Some(Launch {
                premul,
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, ops| unsafe {
                    let t = nccl_dtype(d).expect("checked");
                    check(
                        (f.reduce)(
                            src as *const c_void,
                            dst as *mut c_void,
                            n,
                            t,
                            Self::op_code(red, d, &p2, ops),
                            root as i32,
                            c,
                            s,
                        ),
                        "ncclReduce",
                    )
                }),
            })
        };
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn gather(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("gather", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(root);
        self.local_ok(&o, &hdr, self.root_check(root))?;
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        let n = x.numel();
        let launch = (n > 0).then(|| {
            let esz = x.dtype.size();
            let mut jobs = vec![(true, x.ptr(), n, root)];
            if self.rank == root {
                for j in 0..self.ws {
                    jobs.push((false, out.ptr() + (j * n * esz) as u64, n, j));
                }
            }
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn scatter(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("scatter", true)?;
        let local = if x.shape.is_empty() {
            Err((
                BadInputKind::ZeroDim,
                "scatter needs at least one dimension".into(),
            ))
        } else if x.shape[0] % self.ws != 0 {
            Err((
                BadInputKind::Indivisible,
                format!(
                    "dim 0 ({}) is not divisible by the world size {}",
                    x.shape[0], self.ws
                ),
            ))
        } else {
            self.root_check(root)
        };
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(root);
        self.local_ok(&o, &hdr, local)?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        let n = out.numel();
        let launch = (n > 0).then(|| {
            let esz = x.dtype.size();
            let mut jobs = Vec::new();
            if self.rank == root {
                for j in 0..self.ws {
                    jobs.push((true, x.ptr() + (j * n * esz) as u64, n, j));
                }
            }
            jobs.push((false, out.ptr(), n, root));
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn send(&self, x: &NcclBuffer, dst: usize) -> Result<Work<()>> {
        let (o, check, launch) = self.point_to_point("send", x, dst)?;
        self.submit(o, (), check, launch)
    }

    fn recv(&self, out: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        let (o, check, launch) = self.point_to_point("recv", out, src)?;
        self.submit(o, out.clone(), check, launch)
    }

    fn barrier(&self) -> Result<Work<()>> {
        let o = self.begin("barrier", true)?;
        let hdr = self.new_header(&o);
        let p = self.barrier_buf.ptr();
        let launch = Launch {
            premul: vec![],
            keep: keep(&[&self.barrier_buf]),
            calls: Box::new(move |c, s, _| unsafe {
                check(
                    nccl::ncclAllReduce(
                        p as *const c_void,
                        p as *mut c_void,
                        1,
                        nccl::ncclDataType_t::ncclInt32,
                        nccl::ncclRedOp_t::ncclSum,
                        c,
                        s,
                    ),
                    "ncclAllReduce (barrier)",
                )
            }),
        };
        self.submit(o, (), Check::All(hdr), Some(launch))
    }
}

/// A launch of grouped point-to-point calls: `(is_send, device pointer, elements, peer)`.
fn p2p_launch(jobs: Vec<(bool, u64, usize, usize)>, d: DType, keep: Vec<Arc<DevMem>>) -> Launch {
    Launch {
        premul: vec![],
        keep,
        calls: Box::new(move |c, s, _| p2p(&jobs, d, c, s)),
    }
}

fn p2p(
    jobs: &[(bool, u64, usize, usize)],
    d: DType,
    c: nccl::ncclComm_t,
    s: nccl::cudaStream_t,
) -> std::result::Result<(), (String, nccl::ncclResult_t)> {
    for &(is_send, ptr, n, peer) in jobs {
        let (t, n) = move_type(d, n);
        if is_send {
            check(
                unsafe { nccl::ncclSend(ptr as *const c_void, n, t, peer as i32, c, s) },
                "ncclSend",
            )?;
        } else {
            check(
                unsafe { nccl::ncclRecv(ptr as *mut c_void, n, t, peer as i32, c, s) },
                "ncclRecv",
            )?;
        }
    }
    Ok(())
}

impl NcclBackend {
    fn write_checks(&self, o: &Op, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        if t.dtype() != b.dtype {
            return Err(self.bad(
                o,
                BadInputKind::DTypeMismatch,
                format!("writing a {} tensor into a {} buffer", t.dtype(), b.dtype),
            ));
        }
        if t.numel() != b.numel() {
            return Err(self.bad(
                o,
                BadInputKind::OutBufferSize,
                format!(
                    "writing {} elements into a buffer of {}",
                    t.numel(),
                    b.numel()
                ),
            ));
        }
        Ok(())
    }

    fn copy_in(&self, o: &Op, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        self.write_checks(o, b, t)?;
        // A pageable host-to-device copy waits for the stream: drain it first, with a deadline.
        self.drain(o)?;
        self.dev
            .htod(b.ptr(), t.bytes())
            .map_err(|e| self.backend_err(o.name, o.seq, e))
    }

    fn gather_all(
        &self,
        o: Op,
        hdr: Header,
        x: &NcclBuffer,
        out: NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (src, dst) = (x.ptr(), out.ptr());
            Launch {
                premul: vec![],
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, _| unsafe {
                    check(
                        nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s),
                        "ncclAllGather",
                    )
                }),
            }
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn scatter_reduce(
        &self,
        o: Op,
        hdr: Header,
        x: &NcclBuffer,
        out: NcclBuffer,
        red: Red,
    ) -> Result<Work<NcclBuffer>> {
        let jobs = vec![(x.ptr(), out.ptr(), out.numel(), x.dtype, red)];
        let launch = self.reduction_launch(
            &o,
            jobs,
            &[x, &out],
            |f| f.reduce_scatter,
            "ncclReduceScatter",
        )?;
        self.submit(o, out, Check::All(hdr), launch)
    }

    fn broadcast_impl(
        &self,
        name: &'static str,
        x: &NcclBuffer,
        src: usize,
        in_place: bool,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(src);
        self.local_ok(&o, &hdr, self.root_check(src))?;
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (sp, dp) = (x.ptr(), out.ptr());
            Launch {
                premul: vec![],
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, _| unsafe {
                    check(
                        nccl::ncclBroadcast(
                            sp as *const c_void,
                            dp as *mut c_void,
                            n,
                            t,
                            src as i32,
                            c,
                            s,
                        ),
                        "ncclBroadcast",
                    )
                }),
            }
        });
        self.submit(o, out, Check::All(hdr), launch)
    }
}

impl Header {
    fn error_if(self, local: &Local) -> Header {
        match local {
            Err((k, _)) => self.error(*k),
            Ok(()) => self,
        }
    }
}
