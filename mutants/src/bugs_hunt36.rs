//! The thirty-sixth hunt: bugs from the wild in how a backend moves a large message through
//! bounded resources. Each ports a bug that shipped in a collective library or its framework
//! layer (Open MPI's HAN, ROCm's aiter custom collectives, NCCL's p2p FIFO, DeepSpeed's ZeRO
//! gradient buckets, rocSHMEM, SuperLU_DIST's broadcast trees, MPICH's GPU pipeline), found in the
//! project's issue or pull-request thread named on its type: an op that returns before its peers
//! are done reading the caller's buffer (no closing barrier, a relay's forwarding only tested), a
//! chunk larger than the FIFO slot it is written into, a ping-pong staging pair whose index is
//! reset so that two ops in flight share one buffer, a reduction that starts before every
//! contribution is visible, pipelined chunks written in completion order. Timing races are ported
//! with the slow side always behind, as far as a wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{edit, lock, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, DType, ReduceOp, Result, Work};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- late readers (no closing barrier)

/// How far behind the slow reader is: it starts copying a lower rank's block this long after its
/// own op completed (by then the fast rank has returned and its caller may have written its
/// input again).
const READER_BEHIND: Duration = Duration::from_millis(20);

/// One block a rank moves by a direct read: `(peer, element offset, element count)`.
type Block = (usize, usize, usize);

/// The sends of this rank's live input to the peers that read it late, kept until they complete
/// (never counted in `outstanding`: the caller's op is what it waited).
#[derive(Default)]
struct LateReads {
    pending: Mutex<Vec<Work<()>>>,
}

impl LateReads {
    fn outstanding(&self, s: &Shm) -> usize {
        let mut p = lock(&self.pending);
        p.retain(|w| !(w.is_completed() && w.wait(Duration::ZERO).is_ok()));
        (s.inner.outstanding() + s.own.get()).saturating_sub(p.len())
    }

    /// `w`, whose completion on this rank no longer waits for the peers' reads: the lower rank
    /// (fast, returning at once) hands each higher peer the block of `x` it reads, straight from
    /// the caller's buffer and without waiting for the copy; the higher rank (the slow reader)
    /// copies each lower peer's block into `out` only [`READER_BEHIND`] after its own op completed.
    /// What the reader gets is the lower rank's buffer as it is then: the input of the op when its
    /// caller left it alone, its next contents when the caller wrote it again on return.
    fn around(self: &Arc<Self>, s: &Shm, w: Work<Buf>, x: &Buf, sends: Vec<Block>, reads: Vec<Block>) -> Work<Buf> {
        let me = s.rank();
        let sends = sends.into_iter().filter(|b| b.0 > me).collect();
        let reads = reads.into_iter().filter(|b| b.0 < me).collect();
        self.late(s, w, Some(x.clone()), sends, reads)
    }

    /// The general form: this rank's blocks `sends` leave from `from` (`None`: the op's result)
    /// once its op completed, without waiting for the copies; the blocks `reads` of its result are
    /// copied from their peers [`READER_BEHIND`] later.
    fn late(self: &Arc<Self>, s: &Shm, w: Work<Buf>, from: Option<Buf>, sends: Vec<Block>, reads: Vec<Block>) -> Work<Buf> {
        let (be, this) = (s.inner.clone(), self.clone());
        s.then(w, move |_, res| {
            let from = from.unwrap_or_else(|| res.clone());
            for &(q, off, n) in sends.iter().filter(|b| b.2 > 0) {
                let v = be.view(&from, off, &[n])?;
                lock(&this.pending).push(be.send(&v, q)?);
            }
            let reads: Vec<&Block> = reads.iter().filter(|b| b.2 > 0).collect();
            if reads.is_empty() {
                return Ok(());
            }
            std::thread::sleep(READER_BEHIND);
            for &&(r, off, n) in &reads {
                let v = be.view(res, off, &[n])?;
                be.recv(&v, r)?.wait(BUG_WAIT)?;
            }
            Ok(())
        })
    }
}

/// Element offsets of consecutive blocks of `rows` rows of `row` elements each.
fn blocks(rows: &[usize], row: usize) -> Vec<Block> {
    let mut at = 0;
    rows.iter()
        .enumerate()
        .map(|(p, &k)| {
            let b = (p, at * row, k * row);
            at += k;
            b
        })
        .collect()
}

/// Open MPI's HAN all-to-all without its closing barrier (open-mpi/ompi PR #13115 "Fix race
/// condition in coll_han_alltoall.c": "Add a barrier in cases where reading memory directly from
/// neighbors to fix an issue where the send buffer is overwritten prematurely ... The problem is
/// that alltoall returns before it is safe to touch the send buffer"; its reproducer rewrites the
/// send buffer right after each `MPI_Alltoall`). Each rank reads its block straight from its
/// peers' send buffers (smsc) and returns once its own reads are done. Here all_to_all_single:
/// a higher rank reads a lower rank's block [`READER_BEHIND`] after its own op completed, from
/// the lower rank's buffer as it is then.
#[derive(Default)]
pub struct HanAlltoallNoClosingBarrier {
    late: Arc<LateReads>,
}

impl Bug for HanAlltoallNoClosingBarrier {
    fn outstanding(&self, s: &Shm) -> usize {
        self.late.outstanding(s)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let ws = s.ws();
        let shape = s.inner.buffer_shape(x);
        let d0 = shape.first().copied().unwrap_or(1);
        let row: usize = shape.iter().skip(1).product();
        let equal = vec![d0 / ws; ws];
        let ins = i.map_or(equal.clone(), <[usize]>::to_vec);
        let outs = o.map_or(equal, <[usize]>::to_vec);
        Ok(self.late.around(s, w, x, blocks(&ins, row), blocks(&outs, row)))
    }
}

/// ROCm aiter's custom all-gather without `end_sync` (ROCm/aiter PR #4082 "fix: synchronize
/// custom collectives before return": "a collective may return before all peer reads from the
/// input buffer have completed. In CUDA graph / overlapped execution scenarios, the caller may
/// reuse or overwrite the input tensor immediately after the custom collective returns. Without
/// an end-of-kernel synchronization, another rank can still be reading that input buffer, which
/// can lead to corrupted collective outputs"; the fix adds `end_sync` to `allgather_naive`,
/// `allgather_vec`, `allgather_lastdim` and the reduce-scatter kernels). Here
/// all_gather_into_tensor and its `_out` variant: a higher rank copies a lower rank's input into
/// its slot [`READER_BEHIND`] after its own op completed, from the lower rank's buffer as it is
/// then.
#[derive(Default)]
pub struct AiterAllGatherNoEndSync {
    late: Arc<LateReads>,
}

impl AiterAllGatherNoEndSync {
    fn blocks(s: &Shm, x: &Buf) -> (Vec<Block>, Vec<Block>) {
        let n = s.numel(x);
        let sends = (0..s.ws()).map(|q| (q, 0, n)).collect();
        let reads = (0..s.ws()).map(|r| (r, r * n, n)).collect();
        (sends, reads)
    }
}

impl Bug for AiterAllGatherNoEndSync {
    fn outstanding(&self, s: &Shm) -> usize {
        self.late.outstanding(s)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let (sends, reads) = Self::blocks(s, x);
        Ok(self.late.around(s, w, x, sends, reads))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        let (sends, reads) = Self::blocks(s, x);
        Ok(self.late.around(s, w, x, sends, reads))
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl PR #2410 (#2408)

/// NCCL's p2p FIFO slot (`p2pChunkSize`, NVLink's default `NCCL_P2P_NVL_CHUNKSIZE`).
const P2P_STEP: usize = 512 << 10;
/// The chunk the p2p plan moves per step when `NCCL_CHUNK_SIZE` is set (the 1 MiB of #2408).
const P2P_CHUNK: usize = 1 << 20;
/// NCCL_STEPS: slots of the FIFO.
const NCCL_STEPS: usize = 8;

/// The p2p chunk written past its FIFO slot (NVIDIA/nccl #2408 "NCCL_CHUNK_SIZE /
/// NCCL_P2P_NET_CHUNKSIZE >= 1MiB gives incorrect results and Xid 31 GPU MMU faults", fixed by
/// NVIDIA/nccl PR #2410 "enqueue: clamp NCCL_CHUNK_SIZE to the P2P step size": "The P2P kernels
/// move one chunk per step into a buffer slot that is stepSize bytes ... addP2pToPlan applies
/// NCCL_CHUNK_SIZE to the chunk without checking it against that step, so a larger value makes the
/// kernel write past its slot: it overwrites the neighbouring slots that are still in flight
/// (wrong values)"). Here a message of more than one chunk (1 MiB) moves in 1 MiB chunks through
/// 512 KiB slots, the sender one step ahead of the receiver: the second half of every chunk but
/// the last is read after the next chunk's first half landed on it (a chunk in the FIFO's last
/// slot overflows past the FIFO's end, where nothing else writes, and arrives whole).
#[derive(Default)]
pub struct NcclChunkPastP2pStep;

impl Bug for NcclChunkPastP2pStep {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        Ok(s.then(w, |be, r| {
            edit(be, r, |t| {
                let len = t.len_bytes();
                if len <= P2P_CHUNK {
                    return;
                }
                let msg = t.bytes().to_vec();
                let bytes = t.bytes_mut();
                let chunks = len.div_ceil(P2P_CHUNK);
                for k in (0..chunks - 1).filter(|k| k % NCCL_STEPS != NCCL_STEPS - 1) {
                    let (at, next) = (k * P2P_CHUNK + P2P_STEP, (k + 1) * P2P_CHUNK);
                    let n = (P2P_CHUNK - P2P_STEP).min(len - next);
                    bytes[at..at + n].copy_from_slice(&msg[next..next + n]);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- deepspeedai/DeepSpeed PR #7805

/// An all_reduce's inner work, shared between the caller's work and an earlier op whose staged
/// input it overwrote (that op's result is this one's).
struct Shared(Arc<Work<Buf>>);

impl concord_core::Completion for Shared {
    fn is_completed(&self) -> bool {
        self.0.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.0, timeout, |_| {})
    }
}

/// The earlier all_reduce still in flight on a communicator's staging buffer, told the op that
/// reused the buffer under it.
struct Staged {
    reused_by: Arc<Mutex<Option<Arc<Work<Buf>>>>>,
}

/// DeepSpeed ZeRO's ping-pong reduction buffer whose index is reset (deepspeedai/DeepSpeed PR
/// #7805 "Fix ping-pong buffer index reset and removing redundant stream sync", fixing #7804 and
/// #7188: "In that PR [#6993], `bucket.clear()` incorrectly resets the ping-pong buffer index to 0
/// at the end of `reduce_ipg_grads`. This logic disrupts the buffer index swapping mechanism";
/// with `overlap_comm=True` gradients came out corrupted). The two staging buffers alternate only
/// in name: every reduction stages into buffer 0, so a bucket copied in while the previous
/// bucket's all_reduce is still in flight overwrites it. Here out-of-place all_reduce stages its
/// input in its communicator's buffer for (dtype, numel): an all_reduce issued while an earlier
/// one of that buffer is not yet waited overwrites the staged input under it, and the earlier one
/// reduces the later one's input (its result is the later one's). The later one's second pass
/// over the staged sum is left out: its result is right.
#[derive(Default)]
pub struct DsPingPongIndexReset {
    staging: Mutex<HashMap<(DType, usize), Vec<Staged>>>,
}

impl Bug for DsPingPongIndexReset {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.numel(x));
        let w = s.inner.all_reduce(x, op)?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let w = Arc::new(w);
        let reused_by = Arc::new(Mutex::new(None));
        {
            let mut st = lock(&self.staging);
            let list = st.entry(key).or_default();
            // An entry whose work is gone (waited or dropped) no longer holds the buffer.
            list.retain(|e| Arc::strong_count(&e.reused_by) > 1);
            for e in list.iter() {
                lock(&e.reused_by).get_or_insert_with(|| w.clone());
            }
            list.push(Staged { reused_by: reused_by.clone() });
        }
        let mine = s.relayed(value, Arc::new(Shared(w)), meta);
        Ok(s.then(mine, move |be, out| {
            let later = lock(&reused_by).take();
            if let Some(later) = later {
                let t = be.download(later.wait(BUG_WAIT)?)?;
                be.write(out, &t)?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- ROCm/rocm-systems PR #10000

/// The size from which rocSHMEM's work-group reduction reads peers' data before it is visible.
const ROCSHMEM_PARTIAL_BYTES: usize = 512;

/// rocSHMEM's team reduction without the fence before the reduce (ROCm/rocm-systems PR #10000
/// "fix(rocshmem): Fix reduce wg and wave to enable more than 2 pes": "`reduce_wave` and
/// `reduce_wg` operations that produce incorrect results when running with more than 2 PEs and
/// message sizes ≥512B. Data validation errors indicate partial reductions, suggesting not all PEs
/// are contributing to the reduction ... Needs additional fencing to ensure that all threads have
/// access to the correct data in order to proceed with the reduction"). The reduce starts
/// accumulating before every contribution is visible. Here a `sum` all_reduce (both variants) at 3
/// ranks or more of 512 bytes or more: the contribution read last, that of the rank before this
/// one, is not yet there, and each rank's result leaves it out.
#[derive(Default)]
pub struct RocshmemReduceBeforeFence;

impl RocshmemReduceBeforeFence {
    fn partial(s: &Shm, x: &Buf, op: ReduceOp, issue: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let (ws, me, n) = (s.ws(), s.rank(), s.numel(x));
        let bytes = n * s.inner.buffer_dtype(x).size();
        if ws < 3 || op != ReduceOp::Sum || bytes < ROCSHMEM_PARTIAL_BYTES {
            return issue();
        }
        let last = (me + ws - 1) % ws;
        crate::then_gathered(
            s,
            s.inner.all_gather_into_tensor(x)?,
            |g| g,
            issue,
            |b: &Buf| Some(b),
            move |all, t| {
                for i in 0..t.numel().min(n) {
                    let v = t.get_f64(i) - all.get_f64(last * n + i);
                    crate::set_f64(t, i, v);
                }
            },
        )
    }
}

impl Bug for RocshmemReduceBeforeFence {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::partial(s, x, op, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::partial(s, x, op, || s.inner.all_reduce_(x, op))
    }
}

// ---------------------------------------------------------------- xiaoyeli/superlu_dist PR #117

/// SuperLU_DIST's broadcast tree forwarding with a test, not a wait (xiaoyeli/superlu_dist PR #117
/// "changed mpi_test to mpi_wait in forwardMessageSimple functions": "Here I changed the
/// mpi_tests's to mpi_wait's, to prevent the send buffer from being overwritten until it has been
/// sent out"). A tree node receives the message into its buffer and forwards it to its children
/// with `MPI_Isend` from that same buffer, tests the sends once and returns, so its caller may
/// write the buffer before a child has it. Here broadcast (both variants) over a binary tree of
/// virtual ranks (`(rank - src) mod ws`): a relay (not the root, with children) forwards from its
/// result buffer once its own op completed, and its child copies it [`READER_BEHIND`] later, from
/// the relay's buffer as it is then. From 4 ranks (below, every child's parent is the root).
#[derive(Default)]
pub struct SuperluTreeForwardTested {
    late: Arc<LateReads>,
}

impl SuperluTreeForwardTested {
    fn relay(&self, s: &Shm, x: &Buf, src: usize, w: Work<Buf>) -> Work<Buf> {
        let (ws, me, n) = (s.ws(), s.rank(), s.numel(x));
        if src >= ws {
            return w;
        }
        let v = (me + ws - src) % ws;
        let real = |u: usize| (u + src) % ws;
        let sends = if v == 0 { vec![] } else { [2 * v + 1, 2 * v + 2].into_iter().filter(|&c| c < ws).map(|c| (real(c), 0, n)).collect() };
        let parent = if v == 0 { 0 } else { (v - 1) / 2 };
        let reads = if parent == 0 { vec![] } else { vec![(real(parent), 0, n)] };
        self.late.late(s, w, None, sends, reads)
    }
}

impl Bug for SuperluTreeForwardTested {
    fn outstanding(&self, s: &Shm) -> usize {
        self.late.outstanding(s)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        Ok(self.relay(s, x, src, w))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(x, src)?;
        Ok(self.relay(s, x, src, w))
    }
}

// ---------------------------------------------------------------- pmodels/mpich PR #7182

/// MPICH's GPU pipeline chunk (`MPIR_CVAR_CH4_OFI_GPU_PIPELINE_BUFFER_SZ`'s default, 1 MiB).
const GPU_PIPELINE_CHUNK: usize = 1 << 20;

/// MPICH's GPU pipelining writing chunks in completion order (pmodels/mpich PR #7182 "ofi: fix a
/// bug in gpu pipelining with potentially out of order chunks": "Receiver posts receive for each
/// chunk, and write to GPU buffers in the order of the receive event completion. This however can
/// potentially leads to out of order writing because the completion events may be out of order";
/// the report, pmodels/mpich #7139, "Wrong data with MPI send/recv and pipelining"). Each
/// completed chunk is copied to the next free offset of the receive buffer. Here a received
/// message of more than one 1 MiB chunk whose last chunk is partial: that shorter last chunk
/// completes before the full one ahead of it, so it is written at the full chunk's offset and the
/// full chunk after it.
#[derive(Default)]
pub struct MpichGpuPipelineCompletionOrder;

impl Bug for MpichGpuPipelineCompletionOrder {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        Ok(s.then(w, |be, r| {
            edit(be, r, |t| {
                let len = t.len_bytes();
                let tail = len % GPU_PIPELINE_CHUNK;
                if len <= GPU_PIPELINE_CHUNK || tail == 0 {
                    return;
                }
                let at = len - tail - GPU_PIPELINE_CHUNK;
                let msg = t.bytes()[at..].to_vec();
                let bytes = &mut t.bytes_mut()[at..];
                bytes[..tail].copy_from_slice(&msg[GPU_PIPELINE_CHUNK..]);
                bytes[tail..].copy_from_slice(&msg[..GPU_PIPELINE_CHUNK]);
            })
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<HanAlltoallNoClosingBarrier>(
            "wild_han_alltoall_no_closing_barrier",
            "placement.reuse",
            "open-mpi/ompi PR #13115: HAN's all-to-all returns before its peers are done reading the send buffer: a higher rank copies a lower rank's block after that rank's caller rewrote it",
            &["reuse::inputs_rewritten_after_wait::ws2"],
        ),
        spec::<AiterAllGatherNoEndSync>(
            "wild_aiter_all_gather_no_end_sync",
            "placement.reuse",
            "ROCm/aiter PR #4082: the custom all-gather returns without end_sync: a higher rank copies a lower rank's input after that rank's caller rewrote it",
            &["reuse::inputs_rewritten_after_wait::ws2"],
        ),
        spec::<NcclChunkPastP2pStep>(
            "wild_nccl_chunk_past_p2p_step",
            "values.sizes",
            "NVIDIA/nccl PR #2410 (#2408): p2p chunks of 1 MiB written into 512 KiB FIFO slots: the second half of every chunk but the last is the next chunk's first half",
            &["sizes::send_recv::f32::n262145::ws2"],
        ),
        spec::<DsPingPongIndexReset>(
            "wild_ds_pingpong_index_reset",
            "placement.reuse",
            "deepspeedai/DeepSpeed PR #7805: the ping-pong staging index is reset to 0: an all_reduce issued while another of that buffer is in flight overwrites its staged input",
            &["reuse::outputs_in_flight::all_reduce::out::ws2"],
        ),
        spec::<RocshmemReduceBeforeFence>(
            "wild_rocshmem_reduce_before_fence",
            "values.reduce",
            "ROCm/rocm-systems PR #10000: rocSHMEM's reduction reads before its fence at 3+ PEs and 512+ bytes: a sum all_reduce leaves out the contribution read last",
            &["all_reduce::out::f32::sum::ws3"],
        ),
        spec::<SuperluTreeForwardTested>(
            "wild_superlu_tree_forward_tested",
            "placement.reuse",
            "xiaoyeli/superlu_dist PR #117: a broadcast tree's relay forwards from its buffer with Isend and a test, and returns: its child copies the buffer after the relay's caller rewrote it (4+ ranks)",
            &["reuse::inputs_rewritten_after_wait::ws4"],
        ),
        spec::<MpichGpuPipelineCompletionOrder>(
            "wild_mpich_gpu_pipeline_completion_order",
            "values.sizes",
            "pmodels/mpich PR #7182: pipelined receive chunks written in completion order: a partial last chunk, done first, lands at the full chunk's offset ahead of it",
            &["sizes::send_recv::f32::n262145::ws2"],
        ),
    ]
}
