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
//! * **Validation.** Before every collective the ranks all-gather a small header (op, sequence
//!   number, dtype, shape, reduce op, root, splits, local errors) on a side buffer and run the
//!   same pure check (see `header`), so mismatched inputs end on *every* rank in the same named
//!   [`CollectiveError::BadInput`] instead of an NCCL hang or silent truncation. Send/recv pairs
//!   exchange headers between the two peers. Option `validate=0` turns this off (then
//!   `capabilities().validates_across_ranks` is false).
//! * **Completion.** A [`Work`] completes when a CUDA event recorded after the op completes. A
//!   collective pending longer than the world's op deadline aborts the communicator
//!   (`ncclCommAbort`) and ends in [`CollectiveError::Timeout`] with op and sequence number; later
//!   ops on that communicator fail with [`CollectiveError::Aborted`]. No call waits without a
//!   deadline.
//! * **Semantics.** Declared in [`NcclBackend::capabilities`]: no bitwise reductions (NCCL has
//!   none), no reductions on i16/u16 (NCCL has no 16-bit integer type; they move as bytes),
//!   min/max ignore NaN (NaN only when every rank has NaN; min(-0, +0) = -0, max = +0), integer
//!   avg truncates toward zero — as observed on NCCL 2.28.3 (2 × H200) by the smoke binary
//!   `concord-nccl-smoke`, which re-checks the declaration on every run.
//! * **Safety of shared GPUs.** If `NCCL_NVLS_ENABLE` is unset, `init` sets it to `0`: NVLink
//!   multicast is never used unless the user asks for it explicitly.
//!
//! Options (`WorldInfo::options`): `validate=0|1` (default 1), `blocking=0|1` (default 0),
//! `init_timeout_ms=N` (default: the larger of the op deadline and 30 s).
//!
//! Cost of the defaults (2 × H200, 1 KiB all_reduce issue + wait): non-blocking communicator
//! ~73 us unvalidated / ~160 us validated; `blocking=1` ~20 us / ~50 us. A blocking
//! communicator still aborts a collective whose GPU kernels hang, but a peer lost while NCCL
//! is connecting (first use of a peer or algorithm) can then block the issuing thread.

#![allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80

mod comm;
mod completion;
mod cuda;
pub mod header;

use comm::{nccl_present, red_fns, version_string, Comm, LaunchError};
use completion::NcclCompletion;
use concord_core::caps::{AliasPolicy, Capabilities, Gap, IntAvg, NanPolicy};
use concord_core::{
    progress, Backend, BadInputKind, CollectiveError, DType, OpKind, OutstandingCounter, ReduceOp,
    Result, Tensor, Work, WorkMeta, WorldInfo,
};
use cuda::{DevMem, Device, Pinned};
use cudarc::nccl::sys as nccl;
use header::{hash_words, header_len, parse_all, validate, validate_pair, Header};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

fn first_err(checks: impl IntoIterator<Item = Local>) -> Local {
    checks.into_iter().find(|c| c.is_err()).unwrap_or(Ok(()))
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
    flight: InFlight,
}

struct SideBufs {
    dev_send: DevMem,
    dev_recv: DevMem,
    host_send: Pinned,
    host_recv: Pinned,
}

static GROUP_IDS: AtomicU64 = AtomicU64::new(1);

/// The NCCL backend: one instance per rank (and per subgroup). See the crate docs.
pub struct NcclBackend {
    rank: usize,
    ws: usize,
    /// `nccl` for the world, `nccl:gN` for subgroups (progress records are keyed by it).
    label: String,
    comm: Arc<Comm>,
    dev: Arc<Device>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    counter: OutstandingCounter,
    op_timeout: Duration,
    validate: AtomicBool,
    side: Mutex<SideBufs>,
    barrier_buf: DevMem,
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
        version_string(self.comm.lib_version)
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

    fn from_comm(
        comm: Comm,
        label: String,
        op_timeout: Duration,
        validate: bool,
        init_time: Duration,
        gpus: usize,
        store: Option<concord_harness::store::FileStore>,
    ) -> std::result::Result<NcclBackend, String> {
        let dev = comm.dev.clone();
        let ws = comm.nranks;
        let hbytes = header_len(ws) * 8;
        let side = SideBufs {
            dev_send: dev.alloc(hbytes)?,
            dev_recv: dev.alloc(hbytes * ws.max(2))?,
            host_send: Pinned::new(&dev, hbytes)?,
            host_recv: Pinned::new(&dev, hbytes * ws.max(2))?,
        };
        let barrier_buf = dev.alloc(4)?;
        Ok(NcclBackend {
            rank: comm.rank,
            ws,
            label,
            comm: Arc::new(comm),
            dev,
            seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
            op_timeout,
            validate: AtomicBool::new(validate),
            side: Mutex::new(side),
            barrier_buf,
            init_time,
            gpus,
            _store: store,
        })
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

    fn launch_err(&self, op: &Op, e: LaunchError, started: Instant) -> CollectiveError {
        match e {
            LaunchError::Aborted(why) => CollectiveError::Aborted(format!(
                "nccl {} #{} on rank {}: the communicator was aborted earlier ({why})",
                op.name, op.seq, self.rank
            )),
            LaunchError::Nccl(msg) => self.backend_err(op.name, op.seq, msg),
            LaunchError::Timeout => CollectiveError::Timeout {
                op: op.name.to_string(),
                seq: op.seq,
                rank: self.rank,
                waited_ms: started.elapsed().as_millis() as u64,
                detail: "NCCL did not accept the op before the op deadline (a peer is missing?); communicator aborted"
                    .into(),
            },
        }
    }

    /// Waits (bounded) for everything queued on the stream; aborts and names `op` on deadline.
    fn drain(&self, op: &Op, started: Instant) -> Result<()> {
        match self.dev.sync_until(started + self.op_timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                let waited_ms = started.elapsed().as_millis() as u64;
                self.comm.abort(format!(
                    "{} #{} timed out after {waited_ms} ms",
                    op.name, op.seq
                ));
                Err(CollectiveError::Timeout {
                    op: op.name.to_string(),
                    seq: op.seq,
                    rank: self.rank,
                    waited_ms,
                    detail: format!(
                        "the GPU stream did not drain before the op deadline (an earlier collective is stuck); \
                         NCCL communicator aborted; this process is {}",
                        progress::describe()
                    ),
                })
            }
            Err(e) => Err(self.backend_err(op.name, op.seq, e)),
        }
    }

    /// Exchanges headers with every rank (all-gather on the side buffers); returns all headers.
    fn exchange_all(&self, op: &Op, hdr: &Header) -> Result<Vec<Vec<u64>>> {
        let started = Instant::now();
        let bytes = hdr.to_bytes();
        let n = bytes.len();
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let side = &mut *side;
        side.host_send.as_mut_slice()[..n].copy_from_slice(&bytes);
        let (send, recv) = (side.dev_send.ptr, side.dev_recv.ptr);
        self.dev
            .htod(send, &side.host_send.as_slice()[..n])
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        self.comm
            .launch(started + self.op_timeout, &[], |c, s, _| unsafe {
                let r = nccl::ncclAllGather(
                    send as *const c_void,
                    recv as *mut c_void,
                    n,
                    nccl::ncclDataType_t::ncclUint8,
                    c,
                    s,
                );
                check(r, "ncclAllGather (validation header)")
            })
            .map_err(|e| self.launch_err(op, e, started))?;
        self.dev
            .dtoh_pinned(&mut side.host_recv.as_mut_slice()[..n * self.ws], recv)
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        self.drain(op, started)?;
        Ok(parse_all(
            &side.host_recv.as_slice()[..n * self.ws],
            self.ws,
        ))
    }

    /// Exchanges headers with one peer (send/recv); returns the peer's header.
    fn exchange_pair(&self, op: &Op, hdr: &Header, peer: usize) -> Result<Vec<u64>> {
        let started = Instant::now();
        let bytes = hdr.to_bytes();
        let n = bytes.len();
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let side = &mut *side;
        side.host_send.as_mut_slice()[..n].copy_from_slice(&bytes);
        let (send, recv) = (side.dev_send.ptr, side.dev_recv.ptr);
        self.dev
            .htod(send, &side.host_send.as_slice()[..n])
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        self.comm
            .launch(started + self.op_timeout, &[], |c, s, _| unsafe {
                let u8t = nccl::ncclDataType_t::ncclUint8;
                check(
                    nccl::ncclSend(send as *const c_void, n, u8t, peer as i32, c, s),
                    "ncclSend (validation header)",
                )?;
                check(
                    nccl::ncclRecv(recv as *mut c_void, n, u8t, peer as i32, c, s),
                    "ncclRecv (validation header)",
                )
            })
            .map_err(|e| self.launch_err(op, e, started))?;
        self.dev
            .dtoh_pinned(&mut side.host_recv.as_mut_slice()[..n], recv)
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        self.drain(op, started)?;
        Ok(parse_all(&side.host_recv.as_slice()[..n], 1).remove(0))
    }

    /// Cross-rank agreement on a collective: every rank gets the same verdict.
    fn agree(&self, op: &Op, hdr: Header, local: Local) -> Result<()> {
        let hdr = match &local {
            Err((kind, _)) => hdr.error(*kind),
            Ok(()) => hdr,
        };
        if !self.validating() {
            return local.map_err(|(k, d)| self.bad(op, k, d));
        }
        let all = self.exchange_all(op, &hdr)?;
        match validate(&all) {
            Ok(()) => Ok(()),
            Err((kind, detail)) => {
                let detail = match local {
                    Err((k, mine)) if k == kind => mine,
                    _ => detail,
                };
                Err(self.bad(op, kind, detail))
            }
        }
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

    /// Launches `calls` as one NCCL group and returns a pending [`Work`] for `value`.
    fn run<T>(
        &self,
        mut op: Op,
        value: T,
        premul: &[(nccl::ncclDataType_t, [u8; 8])],
        calls: impl FnOnce(
            nccl::ncclComm_t,
            nccl::cudaStream_t,
            &[u32],
        ) -> std::result::Result<(), (String, nccl::ncclResult_t)>,
    ) -> Result<Work<T>> {
        let started = Instant::now();
        self.comm
            .launch(started + self.op_timeout, premul, calls)
            .map_err(|e| self.launch_err(&op, e, started))?;
        let event = self
            .dev
            .record()
            .map_err(|e| self.backend_err(op.name, op.seq, e))?;
        op.flight.armed = false;
        let completion = NcclCompletion {
            comm: self.comm.clone(),
            event,
            label: self.label.clone(),
            op: op.name.to_string(),
            seq: op.seq,
            rank: self.rank,
            issued: started,
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

    /// The reduce op for NCCL calls, given the premul ops `run` created (one per premul dtype).
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
        let red = red_check(op, x.dtype);
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        self.agree(&o, hdr, red.clone().map(|_| ()))?;
        let red = red.expect("agreed");
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        if x.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let premul = Self::premul_list(&[(red, x.dtype)]);
        let (src, dst, n, d) = (x.ptr(), out.ptr(), x.numel(), x.dtype);
        let f = red_fns().map_err(|e| self.backend_err(name, o.seq, e))?;
        let p2 = premul.clone();
        self.run(o, out, &premul, move |c, s, ops| unsafe {
            let t = nccl_dtype(d).expect("checked");
            check(
                (f.all_reduce)(
                    src as *const c_void,
                    dst as *mut c_void,
                    n,
                    t,
                    Self::op_code(red, d, &p2, ops),
                    c,
                    s,
                ),
                "ncclAllReduce",
            )
        })
    }

    fn all_reduce_coalesced_impl(
        &self,
        name: &'static str,
        xs: &[NcclBuffer],
        op: ReduceOp,
        in_place: bool,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin(name, true)?;
        let reds: Vec<_> = xs.iter().map(|x| red_check(op, x.dtype)).collect();
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        self.agree(
            &o,
            hdr,
            first_err(reds.iter().map(|r| r.clone().map(|_| ()))),
        )?;
        let reds: Vec<(Red, DType)> = reds
            .into_iter()
            .zip(xs)
            .map(|(r, x)| (r.expect("agreed"), x.dtype))
            .collect();
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
            .filter(|((x, _), _)| x.numel() > 0)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), x.numel(), *d, *r))
            .collect();
        if jobs.is_empty() {
            return Ok(self.done(o, outs));
        }
        let premul = Self::premul_list(&reds);
        let f = red_fns().map_err(|e| self.backend_err(name, o.seq, e))?;
        let p2 = premul.clone();
        self.run(o, outs, &premul, move |c, s, ops| {
            for (src, dst, n, d, red) in jobs {
                let t = nccl_dtype(d).expect("checked");
                check(
                    unsafe {
                        (f.all_reduce)(
                            src as *const c_void,
                            dst as *mut c_void,
                            n,
                            t,
                            Self::op_code(red, d, &p2, ops),
                            c,
                            s,
                        )
                    },
                    "ncclAllReduce (coalesced)",
                )?;
            }
            Ok(())
        })
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

/// `Ok` for success / in progress, else the call's name and NCCL result.
fn check(
    r: nccl::ncclResult_t,
    what: &str,
) -> std::result::Result<(), (String, nccl::ncclResult_t)> {
    match r {
        nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => Ok(()),
        e => Err((what.to_string(), e)),
    }
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
            .aux(hash_words(ranks.iter().map(|&r| r as u64)));
        // The split itself needs every rank, so a subgroup is always agreed on, even with
        // validation off.
        let all = self.exchange_all(&o, &hdr.error_if(&local))?;
        if let Err((kind, detail)) = validate(&all) {
            let detail = match local {
                Err((k, mine)) if k == kind => mine,
                _ => detail,
            };
            return Err(self.bad(&o, kind, detail));
        }
        let pos = ranks.iter().position(|&r| r == self.rank);
        let started = Instant::now();
        let sub = self
            .comm
            .split(
                pos.is_some(),
                pos.unwrap_or(0),
                ranks.len(),
                started + self.op_timeout.max(Duration::from_secs(30)),
            )
            .map_err(|e| self.launch_err(&o, e, started))?;
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
        )
        .map(Some)
        .map_err(|e| self.backend_err("new_group", o.seq, e))
    }

    // ---- buffers ----

    fn upload(&self, t: &Tensor) -> Result<NcclBuffer> {
        let o = self.begin("upload", false)?;
        let b = self.alloc_buf(&o, t.dtype(), t.shape())?;
        self.write_impl(&o, &b, t)?;
        Ok(b)
    }

    fn download(&self, b: &NcclBuffer) -> Result<Tensor> {
        let o = self.begin("download", false)?;
        self.drain(&o, Instant::now())?;
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
        self.write_impl(&o, b, t)
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
        self.agree(&o, hdr, Ok(()))?;
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        self.gather_all(o, x, out)
    }

    fn all_gather_into_tensor_out(
        &self,
        x: &NcclBuffer,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor_out", true)?;
        let local = self.out_checks(x, out, x.numel() * self.ws, "all_gather_into_tensor_out");
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape);
        self.agree(&o, hdr, local)?;
        self.gather_all(o, x, out.clone())
    }

    fn all_gather_into_tensor_coalesced(&self, xs: &[NcclBuffer]) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("all_gather_into_tensor_coalesced", true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        self.agree(&o, self.new_header(&o).list(&items), Ok(()))?;
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
        if jobs.is_empty() {
            return Ok(self.done(o, outs));
        }
        self.run(o, outs, &[], move |c, s, _| {
            for (src, dst, n, d) in jobs {
                let (t, n) = move_type(d, n);
                check(
                    unsafe {
                        nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s)
                    },
                    "ncclAllGather (coalesced)",
                )?;
            }
            Ok(())
        })
    }

    fn reduce_scatter_tensor(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor", true)?;
        let red = self.reduce_scatter_local(x, op);
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        self.agree(&o, hdr, red.clone().map(|_| ()))?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        self.scatter_reduce(o, x, out, red.expect("agreed"))
    }

    fn reduce_scatter_tensor_out(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor_out", true)?;
        let red = self.reduce_scatter_local(x, op);
        let local = match &red {
            Err(e) => Err(e.clone()),
            Ok(_) => self.out_checks(x, out, x.numel() / self.ws, "reduce_scatter_tensor_out"),
        };
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        self.agree(&o, hdr, local)?;
        self.scatter_reduce(o, x, out.clone(), red.expect("agreed"))
    }

    fn reduce_scatter_tensor_coalesced(
        &self,
        xs: &[NcclBuffer],
        op: ReduceOp,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("reduce_scatter_tensor_coalesced", true)?;
        let reds: Vec<_> = xs
            .iter()
            .map(|x| self.reduce_scatter_local(x, op))
            .collect();
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        self.agree(
            &o,
            hdr,
            first_err(reds.iter().map(|r| r.clone().map(|_| ()))),
        )?;
        let reds: Vec<(Red, DType)> = reds
            .into_iter()
            .zip(xs)
            .map(|(r, x)| (r.expect("agreed"), x.dtype))
            .collect();
        let outs: Vec<NcclBuffer> = xs
            .iter()
            .map(|x| self.alloc_buf(&o, x.dtype, &self.scattered_shape(x)))
            .collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType, Red)> = xs
            .iter()
            .zip(&outs)
            .zip(&reds)
            .filter(|((y, _), _)| y.numel() > 0)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), y.numel(), *d, *r))
            .collect();
        if jobs.is_empty() {
            return Ok(self.done(o, outs));
        }
        let premul = Self::premul_list(&reds);
        let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
        let p2 = premul.clone();
        self.run(o, outs, &premul, move |c, s, ops| {
            for (src, dst, n, d, red) in jobs {
                let t = nccl_dtype(d).expect("checked");
                check(
                    unsafe {
                        (f.reduce_scatter)(
                            src as *const c_void,
                            dst as *mut c_void,
                            n,
                            t,
                            Self::op_code(red, d, &p2, ops),
                            c,
                            s,
                        )
                    },
                    "ncclReduceScatter (coalesced)",
                )?;
            }
            Ok(())
        })
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
        let mut local: Local = Ok(());
        let mut ins = vec![0usize; ws];
        let mut outs = vec![0usize; ws];
        if x.shape.is_empty() {
            local = Err((
                BadInputKind::ZeroDim,
                "all_to_all_single needs at least one dimension".into(),
            ));
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
                (Ok(i), Ok(out)) => {
                    ins = i;
                    outs = out;
                }
                (Err(e), _) | (_, Err(e)) => local = Err(e),
            }
        }
        let (_, row) = x.rows();
        let row_shape: Vec<u64> = x.shape.iter().skip(1).map(|&d| d as u64).collect();
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .aux(hash_words(
                std::iter::once(row_shape.len() as u64).chain(row_shape),
            ))
            .splits(&ins, &outs);
        self.agree(&o, hdr, local)?;
        let mut out_shape = x.shape.clone();
        out_shape[0] = outs.iter().sum();
        let out = self.alloc_buf(&o, x.dtype, &out_shape)?;
        let esz = x.dtype.size();
        let (src, dst, d, me) = (x.ptr(), out.ptr(), x.dtype, self.rank);
        let mut jobs: Vec<(bool, u64, usize, usize)> = Vec::new(); // (is_send, ptr, rows, peer)
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
        if jobs.iter().all(|j| j.2 == 0) {
            return Ok(self.done(o, out));
        }
        let _ = me;
        self.run(o, out, &[], move |c, s, _| p2p(&jobs, d, c, s))
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
        let local: Local = if valid {
            Ok(())
        } else {
            Err((
                BadInputKind::BadPermutation,
                format!("{src_dst:?} is not a permutation of 0..{ws}"),
            ))
        };
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .aux(hash_words(src_dst.iter().map(|&d| d as u64)));
        self.agree(&o, hdr, local)?;
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        if x.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let dst_rank = src_dst[self.rank];
        let src_rank = src_dst
            .iter()
            .position(|&d| d == self.rank)
            .expect("a permutation");
        let jobs = vec![
            (true, x.ptr(), x.numel(), dst_rank),
            (false, out.ptr(), x.numel(), src_rank),
        ];
        let d = x.dtype;
        self.run(o, out, &[], move |c, s, _| p2p(&jobs, d, c, s))
    }

    fn reduce(&self, x: &NcclBuffer, op: ReduceOp, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce", true)?;
        let red = red_check(op, x.dtype);
        let local = first_err([self.root_check(root), red.clone().map(|_| ())]);
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .reduce(op)
            .root(root);
        self.agree(&o, hdr, local)?;
        let red = red.expect("agreed");
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        if x.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let premul = Self::premul_list(&[(red, x.dtype)]);
        let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
        let (src, dst, n, d) = (x.ptr(), out.ptr(), x.numel(), x.dtype);
        let p2 = premul.clone();
        self.run(o, out, &premul, move |c, s, ops| unsafe {
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
        })
    }

    fn gather(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("gather", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(root);
        self.agree(&o, hdr, self.root_check(root))?;
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        let n = x.numel();
        if n == 0 {
            return Ok(self.done(o, out));
        }
        let esz = x.dtype.size();
        let mut jobs = vec![(true, x.ptr(), n, root)];
        if self.rank == root {
            for j in 0..self.ws {
                jobs.push((false, out.ptr() + (j * n * esz) as u64, n, j));
            }
        }
        let d = x.dtype;
        self.run(o, out, &[], move |c, s, _| p2p(&jobs, d, c, s))
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
        self.agree(&o, hdr, local)?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        let n = out.numel();
        if n == 0 {
            return Ok(self.done(o, out));
        }
        let esz = x.dtype.size();
        let mut jobs = Vec::new();
        if self.rank == root {
            for j in 0..self.ws {
                jobs.push((true, x.ptr() + (j * n * esz) as u64, n, j));
            }
        }
        jobs.push((false, out.ptr(), n, root));
        let d = x.dtype;
        self.run(o, out, &[], move |c, s, _| p2p(&jobs, d, c, s))
    }

    fn send(&self, x: &NcclBuffer, dst: usize) -> Result<Work<()>> {
        let o = self.begin("send", false)?;
        if dst >= self.ws || dst == self.rank {
            return Err(self.bad(
                &o,
                BadInputKind::BadPeer,
                format!(
                    "send to rank {dst} from rank {} in a world of {}",
                    self.rank, self.ws
                ),
            ));
        }
        if self.validating() {
            let mine = Header::new(self.ws, "send", 0)
                .tensor(x.dtype, &x.shape)
                .peer(dst);
            let theirs = self.exchange_pair(&o, &mine, dst)?;
            validate_pair(&mine.words, &theirs, self.rank, dst)
                .map_err(|(k, d)| self.bad(&o, k, d))?;
        }
        if x.numel() == 0 {
            return Ok(self.done(o, ()));
        }
        let jobs = vec![(true, x.ptr(), x.numel(), dst)];
        let d = x.dtype;
        self.run(o, (), &[], move |c, s, _| p2p(&jobs, d, c, s))
    }

    fn recv(&self, out: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("recv", false)?;
        if src >= self.ws || src == self.rank {
            return Err(self.bad(
                &o,
                BadInputKind::BadPeer,
                format!(
                    "recv from rank {src} on rank {} in a world of {}",
                    self.rank, self.ws
                ),
            ));
        }
        if self.validating() {
            let mine = Header::new(self.ws, "recv", 0)
                .tensor(out.dtype, &out.shape)
                .peer(src);
            let theirs = self.exchange_pair(&o, &mine, src)?;
            validate_pair(&mine.words, &theirs, self.rank, src)
                .map_err(|(k, d)| self.bad(&o, k, d))?;
        }
        if out.numel() == 0 {
            return Ok(self.done(o, out.clone()));
        }
        let jobs = vec![(false, out.ptr(), out.numel(), src)];
        let d = out.dtype;
        self.run(o, out.clone(), &[], move |c, s, _| p2p(&jobs, d, c, s))
    }

    fn barrier(&self) -> Result<Work<()>> {
        let o = self.begin("barrier", true)?;
        self.agree(&o, self.new_header(&o), Ok(()))?;
        let p = self.barrier_buf.ptr;
        self.run(o, (), &[], move |c, s, _| unsafe {
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
        })
    }
}

/// Grouped point-to-point jobs: `(is_send, device pointer, elements, peer)`.
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
    fn write_impl(&self, o: &Op, b: &NcclBuffer, t: &Tensor) -> Result<()> {
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
        // A pageable host-to-device copy waits for the stream: drain it first, with a deadline.
        self.drain(o, Instant::now())?;
        self.dev
            .htod(b.ptr(), t.bytes())
            .map_err(|e| self.backend_err(o.name, o.seq, e))
    }

    fn gather_all(&self, o: Op, x: &NcclBuffer, out: NcclBuffer) -> Result<Work<NcclBuffer>> {
        if x.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let (t, n) = move_type(x.dtype, x.numel());
        let (src, dst) = (x.ptr(), out.ptr());
        self.run(o, out, &[], move |c, s, _| unsafe {
            check(
                nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s),
                "ncclAllGather",
            )
        })
    }

    fn scatter_reduce(
        &self,
        o: Op,
        x: &NcclBuffer,
        out: NcclBuffer,
        red: Red,
    ) -> Result<Work<NcclBuffer>> {
        if out.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let premul = Self::premul_list(&[(red, x.dtype)]);
        let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
        let (src, dst, n, d) = (x.ptr(), out.ptr(), out.numel(), x.dtype);
        let p2 = premul.clone();
        self.run(o, out, &premul, move |c, s, ops| unsafe {
            let t = nccl_dtype(d).expect("checked");
            check(
                (f.reduce_scatter)(
                    src as *const c_void,
                    dst as *mut c_void,
                    n,
                    t,
                    Self::op_code(red, d, &p2, ops),
                    c,
                    s,
                ),
                "ncclReduceScatter",
            )
        })
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
        self.agree(&o, hdr, self.root_check(src))?;
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        if x.numel() == 0 {
            return Ok(self.done(o, out));
        }
        let (t, n) = move_type(x.dtype, x.numel());
        let (sp, dp) = (x.ptr(), out.ptr());
        self.run(o, out, &[], move |c, s, _| unsafe {
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
        })
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
