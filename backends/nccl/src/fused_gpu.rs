//! The fused ops on NCCL + cuBLAS (seed 004's `_pipelined_all_gather_and_consume` /
//! `_pipelined_produce_and_all2all`, on GPUs): the shards move with NCCL on the rank's stream,
//! the matmuls run on a second (compute) stream, and CUDA events order the two, so the
//! transfer of piece `k + 1` overlaps the matmul of piece `k`. The geometry (which shard, which
//! offsets, which step) is `fused_plan`'s; this file turns it into calls.
//!
//! * `fused_all_gather_matmul`: the local shard's matmul first (and its copy into the
//!   gathered `a`), then `ws - 1` steps: at step `s` this rank sends its shard to `rank - s` and
//!   receives the shard of `rank + s`, piece by piece (one grouped `ncclSend` / `ncclRecv` per
//!   piece, straight into the gathered `a` when the gather dim leaves one band, else into a
//!   staging buffer placed with a 2-D copy); each piece's matmuls (one strided-batched
//!   `cublasGemmEx` per `b`) start on the compute stream as soon as that piece has landed.
//! * `fused_matmul_reduce_scatter`: for every rank `p` in rank order (the same on every rank:
//!   they are collectives), piece by piece, the matmul of the rows (columns) of `a @ b` that `p`
//!   owns on the compute stream into a staging buffer, then an `ncclReduce` (sum, or NCCL's avg)
//!   of that piece onto rank `p`, straight into its output: the reduce of piece `k` overlaps the
//!   matmul of piece `k + 1`.
//! * `low_contention_all_gather` / `_reduce_scatter`: one validated job each (NCCL's all_gather /
//!   reduce_scatter under the fused op's own description and rules), issued asynchronously
//!   instead of the trait's default (which exchanges descriptions with a blocking collective).
//! * The scaled variants stay the trait's decomposition (host matmul).
//!
//! Every op is one job of the progress thread: its header exchange runs the rule table (F1–F9)
//! on every rank's description, then the launch enqueues every group and matmul in order
//! (`worker::Step`); issue returns at once, and the op completes when its peers have come.
//!
//! Numerics (what the oracle's values need): every product block is accumulated in f32
//! (`CUBLAS_COMPUTE_32F`; f64 for f64) and rounded once to the output dtype: no TF32 (the
//! compute type is not `_FAST_TF32` and the math mode is not a tensor-op mode), and
//! `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`, so a split-K never sums partial results
//! in f16 / bf16. Exact-by-construction inputs (small integers, sums far below 2^24) therefore
//! give the decomposition's bits in any summation order; random ones differ by f32 summation
//! order only (within the suite's `fused_tolerance`). The reduction is NCCL's, as for the
//! decomposition's `reduce_scatter` (one rounding per hop: exact at two ranks).
//!
//! Option `fused_overlap` (read at `init`, process-wide): `1` (default) as above; `serial`: the
//! same GPU path with the matmuls on the NCCL stream (no overlap: the bench's baseline for
//! what the overlap buys); `0`: the trait's decomposition. Without libcublas the ops are the
//! decomposition too, and `capabilities().fused` says which.

use crate::dtype::{red_of, Red};
use crate::fused_plan::{ag_step_peers, pieces, AgGeom, Copy2D, Gemm, RsGeom};
use crate::launch::{keep, p2p};
use crate::worker::{check, Check, Launch, Step};
use crate::{cuda::Device, NcclBackend, NcclBuffer};
use concord_core::fused::{describe, input_descs, AgMatmulPlan, Gathered, MatmulRsPlan};
use concord_core::{CallOp, CollectiveError, DType, ReduceOp, Result, Work};
use cudarc::cublas::sys as blas;
use cudarc::driver::{result as cu, sys as dsys, CudaContext};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A piece of a shard / chunk is at least this many bytes (smaller ones cost more in launches
/// than they hide), and a shard / chunk has at most [`MAX_PIECES`].
pub const PIECE_BYTES: usize = 2 << 20;
pub const MAX_PIECES: usize = 4;

const PIPELINED: u8 = 0;
const SERIAL: u8 = 1;
const DECOMPOSED: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(PIPELINED);

/// Reads the `fused_overlap` option (`init`).
pub(crate) fn set_mode(v: Option<&str>) -> std::result::Result<(), String> {
    let m = match v {
        None | Some("1") => PIPELINED,
        Some("serial") => SERIAL,
        Some("0") => DECOMPOSED,
        Some(o) => return Err(format!("option fused_overlap={o}: expected 1, serial or 0")),
    };
    MODE.store(m, Ordering::SeqCst);
    Ok(())
}

/// Whether libcublas loads here (checked once per process, never panicking).
pub(crate) fn cublas_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    *P.get_or_init(|| std::panic::catch_unwind(|| unsafe { blas::is_culib_present() }).unwrap_or(false))
}

/// Whether the fused ops take this file's path (else the trait's decomposition). Depends only
/// on the option (the same on every rank) and on cuBLAS being present.
pub(crate) fn native() -> bool {
    MODE.load(Ordering::SeqCst) != DECOMPOSED && cublas_present()
}

/// The cuBLAS handle and compute stream of one GPU, created on first use and kept for the
/// process (with a reference to the primary context, which must outlive them). Used by the
/// progress threads of the worlds on this GPU; cuBLAS handles are not for concurrent use, so
/// every set-stream + GEMM pair holds `lock` (a process may hold two worlds on one GPU: the
/// fault cases `init` a second one inside a case).
struct Blas {
    handle: blas::cublasHandle_t,
    compute: dsys::CUstream,
    lock: Mutex<()>,
    _ctx: Arc<CudaContext>,
}
// SAFETY: the handle and stream are plain driver / cuBLAS handles, usable from any thread with
// the context bound; only the progress thread uses them after creation (one job at a time).
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

/// Every GPU's [`Blas`] of this process, by device ordinal.
static ALL: Mutex<Vec<(usize, Arc<Blas>)>> = Mutex::new(Vec::new());

/// After a fused launch failed part-way: makes `dev`'s stream wait for everything enqueued on
/// its compute stream so far, so that the frees the failure leads to (the launch's staging,
/// then the caller's buffers after its failed wait), ordered on `dev`'s stream, come after the
/// matmuls that may still read or write them. Nothing when this GPU never ran a fused op.
pub(crate) fn join_compute(dev: &Device) -> std::result::Result<(), String> {
    let b = ALL.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(o, _)| *o == dev.ordinal).map(|(_, b)| b.clone());
    match b {
        Some(b) => order(b.compute, dev.stream),
        None => Ok(()),
    }
}

fn blas_for(dev: &Device) -> std::result::Result<Arc<Blas>, String> {
    let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = all.iter().find(|(o, _)| *o == dev.ordinal) {
        return Ok(b.clone());
    }
    dev.bind()?;
    let mut handle: blas::cublasHandle_t = std::ptr::null_mut();
    let st = unsafe { blas::cublasCreate_v2(&mut handle) };
    if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(format!("cublasCreate: {st:?}"));
    }
    let st = unsafe { blas::cublasSetMathMode(handle, blas::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) };
    if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        unsafe { blas::cublasDestroy_v2(handle) };
        return Err(format!("cublasSetMathMode: {st:?}"));
    }
    let compute = match cu::stream::create(cu::stream::StreamKind::NonBlocking) {
        Ok(s) => s,
        Err(e) => {
            unsafe { blas::cublasDestroy_v2(handle) };
            return Err(crate::cuda::derr("cuStreamCreate (compute stream)", e));
        }
    };
    let b = Arc::new(Blas { handle, compute, lock: Mutex::new(()), _ctx: dev.ctx.clone() });
    all.push((dev.ordinal, b.clone()));
    Ok(b)
}

/// Makes `to` wait for everything enqueued on `from` so far (nothing when they are one stream).
fn order(from: dsys::CUstream, to: dsys::CUstream) -> std::result::Result<(), String> {
    if from == to {
        return Ok(());
    }
    let ev = cu::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| crate::cuda::derr("cuEventCreate", e))?;
    let r = unsafe { cu::event::record(ev, from) }.map_err(|e| crate::cuda::derr("cuEventRecord", e)).and_then(|()| {
        unsafe { cu::stream::wait_event(to, ev, dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| crate::cuda::derr("cuStreamWaitEvent", e))
    });
    // Released by the driver once recorded work completes.
    unsafe {
        let _ = cu::event::destroy(ev);
    }
    r
}

fn cuda_type(d: DType) -> blas::cudaDataType {
    use blas::cudaDataType::*;
    match d {
        DType::F16 => CUDA_R_16F,
        DType::BF16 => CUDA_R_16BF,
        DType::F64 => CUDA_R_64F,
        _ => CUDA_R_32F,
    }
}

/// Enqueues `g` on `stream`: `a` / `b` / `c` are device pointers of elements of `dt`.
fn gemm(h: &Blas, stream: dsys::CUstream, g: &Gemm, dt: DType, a: u64, b: u64, c: u64) -> std::result::Result<(), String> {
    if g.is_empty() {
        return Ok(());
    }
    let es = dt.size() as u64;
    let call = g.blas();
    let (p1, p2) = if call.first_is_b { (b, a) } else { (a, b) };
    let op = |t: bool| if t { blas::cublasOperation_t::CUBLAS_OP_T } else { blas::cublasOperation_t::CUBLAS_OP_N };
    let t = cuda_type(dt);
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta, compute) = if dt == DType::F64 {
        (&one64 as *const f64 as *const c_void, &zero64 as *const f64 as *const c_void, blas::cublasComputeType_t::CUBLAS_COMPUTE_64F)
    } else {
        (&one32 as *const f32 as *const c_void, &zero32 as *const f32 as *const c_void, blas::cublasComputeType_t::CUBLAS_COMPUTE_32F)
    };
    // SAFETY: the pointers are live device buffers (kept by the launch until enqueued, and
    // freed stream-ordered after the op) that hold every element the descriptor addresses
    // (`fused_plan`'s tests check the descriptors and this call against the host plans); the
    // scalars live until the call returns (host pointer mode: read at enqueue).
    let _one_at_a_time = h.lock.lock().unwrap_or_else(|e| e.into_inner());
    let st = unsafe { blas::cublasSetStream_v2(h.handle, stream as blas::cudaStream_t) };
    if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(format!("cublasSetStream: {st:?}"));
    }
    let st = unsafe {
        blas::cublasGemmStridedBatchedEx(
            h.handle,
            op(call.trans_first),
            op(call.trans_second),
            call.m as i32,
            call.n as i32,
            call.k as i32,
            alpha,
            (p1 + call.first.off as u64 * es) as *const c_void,
            t,
            call.first.ld as i32,
            call.first.stride as i64,
            (p2 + call.second.off as u64 * es) as *const c_void,
            t,
            call.second.ld as i32,
            call.second.stride as i64,
            beta,
            (c + call.c.off as u64 * es) as *mut c_void,
            t,
            call.c.ld as i32,
            call.c.stride as i64,
            call.batch as i32,
            compute,
            blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        )
    };
    if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(format!("cublasGemmStridedBatchedEx ({}x{}x{} x{} {dt}): {st:?}", g.m, g.n, g.k, g.batch));
    }
    Ok(())
}

/// Enqueues a strided device copy (elements of `es` bytes) on `stream`.
fn copy2d(stream: dsys::CUstream, c: &Copy2D, es: usize, src: u64, dst: u64) -> std::result::Result<(), String> {
    if c.width == 0 || c.height == 0 {
        return Ok(());
    }
    let (src, dst) = (src + (c.src_off * es) as u64, dst + (c.dst_off * es) as u64);
    let r = if c.height == 1 {
        unsafe { dsys::cuMemcpyDtoDAsync_v2(dst, src, c.width * es, stream) }
    } else {
        let p = dsys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: dsys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: c.src_pitch * es,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: dsys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: c.dst_pitch * es,
            WidthInBytes: c.width * es,
            Height: c.height,
        };
        unsafe { dsys::cuMemcpy2DAsync_v2(&p, stream) }
    };
    if r != dsys::CUresult::CUDA_SUCCESS {
        return Err(format!("device copy ({} x {} elements): {r:?}", c.height, c.width));
    }
    Ok(())
}

/// A device step (see `worker::Step`).
fn device(f: impl FnOnce(dsys::CUstream) -> std::result::Result<(), String> + Send + 'static) -> Step {
    Step::Device(Box::new(f))
}

/// Zero-fills `bufs` on the NCCL stream (an empty contraction: every product is +0).
fn zero_fill(bufs: Vec<(u64, usize)>) -> Step {
    device(move |s| {
        for (p, n) in bufs {
            if n > 0 {
                let r = unsafe { dsys::cuMemsetD8Async(p, 0, n, s) };
                if r != dsys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuMemsetD8Async: {r:?}"));
                }
            }
        }
        Ok(())
    })
}

/// A launch made only of `steps` (its first group is empty).
fn staged(keep_alive: &[&NcclBuffer], steps: Vec<Step>) -> Launch {
    Launch { premul: vec![], keep: keep(keep_alive), calls: Box::new(|_, _, _| Ok(())), then: steps, local: None }
}

impl NcclBackend {
    fn fused_err(&self, name: &str, seq: u64, e: impl std::fmt::Display) -> CollectiveError {
        self.backend_err(name, seq, e)
    }

    pub(crate) fn fused_all_gather_matmul_impl(&self, a: &NcclBuffer, bs: &[NcclBuffer], dim: usize) -> Result<Work<Gathered<NcclBuffer>>> {
        if !native() {
            return concord_core::fused::decomposed_all_gather_matmul(self, a, bs, dim, None);
        }
        let (ws, me) = (self.ws, self.rank);
        let o = self.begin("fused_all_gather_matmul", true)?;
        let ins = input_descs(self, a, bs);
        let mut d = describe(CallOp::FusedAllGatherMatmul, me, ins.clone(), None, dim, None);
        d.seq = o.cseq;
        let hdr = self.admit(&o, &d)?;
        let h = blas_for(&self.dev).map_err(|e| self.fused_err(o.name, o.seq, e))?;
        let plan = AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, None);
        let geo = AgGeom::new(ws, &a.shape, dim);
        let dt = a.dtype;
        let es = dt.size();
        let ag = self.alloc_buf(&o, dt, &plan.ag_shape())?;
        let outs: Vec<NcclBuffer> =
            (0..bs.len()).map(|i| self.alloc_buf(&o, plan.out_dtypes[i], &plan.out_shape(i))).collect::<Result<_>>()?;
        let staging = if geo.direct() || geo.elems == 0 { None } else { Some(self.alloc_buf(&o, dt, &[ws * geo.elems])?) };
        let mut kept: Vec<&NcclBuffer> = vec![a, &ag];
        kept.extend(bs.iter().chain(&outs).chain(staging.iter()));
        if geo.elems == 0 {
            // Nothing to move; an empty contraction (k = 0) gives zeros.
            let z = outs.iter().map(|x| (x.ptr(), x.nbytes())).collect();
            let launch = staged(&kept, vec![zero_fill(z)]);
            return self.submit(o, (ag, outs), Check::All(hdr), Some(launch));
        }
        let (units, per) = geo.units();
        let ps = pieces(units, per * es, PIECE_BYTES, MAX_PIECES);
        let (a_p, ag_p, st_p) = (a.ptr(), ag.ptr(), staging.as_ref().map(NcclBuffer::ptr));
        let outs_p: Vec<(u64, usize)> = outs.iter().zip(bs).map(|(x, b)| (x.ptr(), b.shape[1])).collect();
        let b_p: Vec<u64> = bs.iter().map(NcclBuffer::ptr).collect();
        if ps.iter().any(|&p| outs_p.iter().any(|&(_, n)| !geo.gemm(0, n, p).fits_i32())) {
            return Err(self.fused_err(o.name, o.seq, "a matmul's sizes exceed cuBLAS's 32-bit arguments"));
        }
        let serial = MODE.load(Ordering::SeqCst) == SERIAL;
        // Where shard r lies once it has landed (the local one: `a` itself).
        let shard = move |r: usize| -> u64 {
            if r == me {
                a_p
            } else if let Some(s) = st_p {
                s + (r * geo.elems * es) as u64
            } else {
                ag_p + (r * geo.elems * es) as u64
            }
        };
        let matmuls = {
            let (geo, h, outs_p, b_p) = (geo.clone(), h.clone(), outs_p.clone(), b_p.clone());
            move |k: dsys::CUstream, r: usize, p: (usize, usize)| -> std::result::Result<(), String> {
                for (i, &(out, n)) in outs_p.iter().enumerate() {
                    gemm(&h, k, &geo.gemm(r, n, p), dt, shard(r), b_p[i], out)?;
                }
                Ok(())
            }
        };
        let kc = h.compute as usize;
        let compute = move |s: dsys::CUstream| if serial { s } else { kc as dsys::CUstream };
        let mut steps = Vec::new();
        {
            let (geo, mm) = (geo.clone(), matmuls.clone());
            steps.push(device(move |s| {
                let k = compute(s);
                order(s, k)?;
                copy2d(k, &geo.placement(me), es, a_p, ag_p)?;
                mm(k, me, (0, units))
            }));
        }
        for step in 1..ws {
            let (to, from) = ag_step_peers(ws, me, step);
            let dst = shard(from);
            for (i, &(u0, u1)) in ps.iter().enumerate() {
                let (off, n) = ((u0 * per * es) as u64, (u1 - u0) * per);
                let jobs = vec![(true, a_p + off, n, to), (false, dst + off, n, from)];
                steps.push(Step::Nccl(Box::new(move |c, s, _| p2p(&jobs, dt, c, s))));
                let (geo, mm, last) = (geo.clone(), matmuls.clone(), i + 1 == ps.len());
                steps.push(device(move |s| {
                    let k = compute(s);
                    order(s, k)?;
                    if last && st_p.is_some() {
                        copy2d(k, &geo.placement(from), es, dst, ag_p)?;
                    }
                    mm(k, from, (u0, u1))
                }));
            }
        }
        steps.push(device(move |s| order(compute(s), s)));
        let launch = staged(&kept, steps);
        self.submit(o, (ag, outs), Check::All(hdr), Some(launch))
    }

    pub(crate) fn fused_matmul_reduce_scatter_impl(
        &self,
        a: &NcclBuffer,
        b: &NcclBuffer,
        op: ReduceOp,
        dim: usize,
    ) -> Result<Work<NcclBuffer>> {
        if !native() {
            return concord_core::fused::decomposed_matmul_reduce_scatter(self, a, b, op, dim, None);
        }
        let (ws, me) = (self.ws, self.rank);
        let o = self.begin("fused_matmul_reduce_scatter", true)?;
        let ins = input_descs(self, a, std::slice::from_ref(b));
        let mut d = describe(CallOp::FusedMatmulReduceScatter, me, ins.clone(), Some(op), dim, None);
        d.seq = o.cseq;
        let hdr = self.admit(&o, &d)?;
        let h = blas_for(&self.dev).map_err(|e| self.fused_err(o.name, o.seq, e))?;
        let plan = MatmulRsPlan::new(ws, &ins[0], &ins[1], op, dim, None);
        let geo = RsGeom::new(ws, &a.shape, b.shape[1], dim);
        let dt = plan.out_dtype;
        let es = dt.size();
        let out = self.alloc_buf(&o, dt, &plan.out_shape())?;
        let chunk = geo.chunk();
        if chunk == 0 || a.numel() == 0 {
            // Nothing to reduce, or an empty contraction (a sum of zeros).
            let launch = staged(&[a, b, &out], vec![zero_fill(vec![(out.ptr(), out.nbytes())])]);
            return self.submit(o, out, Check::All(hdr), Some(launch));
        }
        let staging = self.alloc_buf(&o, dt, &[ws * chunk])?;
        let (units, per) = geo.units();
        let ps = pieces(units, per * es, PIECE_BYTES, MAX_PIECES);
        if ps.iter().any(|&p| !geo.gemm(0, p).fits_i32()) {
            return Err(self.fused_err(o.name, o.seq, "a matmul's sizes exceed cuBLAS's 32-bit arguments"));
        }
        let Red::Builtin(code) = red_of(op) else { unreachable!("sum or avg: rule F4") };
        // One rank on an NCCL whose one-rank kernel drops a tail (`one_rank`): the average of
        // one input is the input, NCCL's copy.
        let code =
            if code == crate::dtype::AVG && crate::one_rank::affected(ws, self.chan.comm.lib_version) { crate::dtype::SUM } else { code };
        let reduce = crate::comm::red_fns().map_err(|e| self.fused_err(o.name, o.seq, e))?.reduce;
        let t = crate::dtype::nccl_dtype(dt).expect("a float dtype (rule F6)");
        let serial = MODE.load(Ordering::SeqCst) == SERIAL;
        let kc = h.compute as usize;
        let compute = move |s: dsys::CUstream| if serial { s } else { kc as dsys::CUstream };
        let (a_p, b_p, out_p, st_p) = (a.ptr(), b.ptr(), out.ptr(), staging.ptr());
        let mut steps = Vec::new();
        steps.push(device(move |s| order(s, compute(s))));
        for p in 0..ws {
            for &(u0, u1) in &ps {
                let g = geo.gemm(p, (u0, u1));
                let h = h.clone();
                steps.push(device(move |s| {
                    let k = compute(s);
                    gemm(&h, k, &g, dt, a_p, b_p, st_p)?;
                    order(k, s)
                }));
                let src = st_p + ((p * chunk + u0 * per) * es) as u64;
                let dst = if p == me { out_p + (u0 * per * es) as u64 } else { src };
                let n = (u1 - u0) * per;
                steps.push(Step::Nccl(Box::new(move |c, s, _| {
                    // SAFETY: `src` / `dst` hold `n` elements of `t` (the chunk's piece in the
                    // staging buffer / the output), kept alive by the launch.
                    check(unsafe { reduce(src as *const c_void, dst as *mut c_void, n, t, code, p as i32, c, s) }, "ncclReduce (fused)")
                })));
            }
        }
        let launch = staged(&[a, b, &out, &staging], steps);
        self.submit(o, out, Check::All(hdr), Some(launch))
    }

    /// The low-contention ops: one validated NCCL all_gather / reduce_scatter (see the module docs).
    pub(crate) fn low_contention_impl(&self, x: &NcclBuffer, op: Option<ReduceOp>) -> Result<Work<NcclBuffer>> {
        if !native() {
            return concord_core::fused::decomposed_low_contention(self, x, op);
        }
        let (name, call) = match op {
            None => ("low_contention_all_gather", CallOp::LowContentionAllGather),
            Some(_) => ("low_contention_reduce_scatter", CallOp::LowContentionReduceScatter),
        };
        let o = self.begin(name, true)?;
        let mut d = describe(call, self.rank, vec![concord_core::TensorDesc::new(x.dtype, &x.shape)], op, 0, None);
        d.seq = o.cseq;
        let hdr = self.admit(&o, &d)?;
        match op {
            None => {
                let out = self.alloc_buf(&o, x.dtype, &crate::ops::gathered_shape(&x.shape, self.ws))?;
                self.gather_all(o, hdr, x, out)
            }
            Some(op) => {
                let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
                self.scatter_reduce(o, hdr, x, out, red_of(op))
            }
        }
    }
}
