//! The thirtieth hunt: bugs from the wild at the places where a collective library switches how
//! it works. Each ports a correctness bug that shipped in a collective library (Open MPI's HAN,
//! ROCm's rocSHMEM, a custom all-reduce beside NCCL, ...), found in the project's issue or
//! pull-request thread named on its type: a segmented pipeline whose last segment keeps the full
//! segment's count, a ring path taken below the size its segment arithmetic assumes, a guard that
//! checks a fast path's size but not its alignment. The trigger (op, size, world size, rank,
//! buffer layout) is kept as far as a wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Result, Work};

// ---------------------------------------------------------------- open-mpi/ompi #11441, PR #11442

/// HAN's `allreduce` segment size (`coll_han_allreduce_segsize`, bytes).
const HAN_ALLREDUCE_SEGSIZE: usize = 65536;

/// HAN's segmented all-reduce whose broadcasts keep the full segment count on the last segment
/// (open-mpi/ompi #11441 "Open MPI 5.0.x branch MPI_Allreduce cause data corruption for certain
/// message size", fixed by PR #11442 "coll/han: fix count of allreduce t3 task's bcast
/// operations": "The two bcast operation in t3 task are using wrong count, causing illegal memory
/// access"). `mca_coll_han_allreduce_intra` cuts the message into segments of
/// `seg_count = 65536 / type size` elements (the last one `last_seg_count`) and pipelines, per
/// segment, an intra-node reduce, an inter-node reduce and broadcast, and an intra-node
/// broadcast from the node leader (local rank 0); the t3 task computed `tmp_count` for the last
/// segment and then passed `t->seg_count` to both broadcasts anyway, so on every rank but the
/// leader the last segment's broadcast wrote `seg_count - last_seg_count` elements past the end
/// of the caller's buffer, copied from the leader's memory past the end of its own. Here an
/// in-place `all_reduce_` of `n` elements, `n` not a multiple of `seg_count`, on a view with
/// room after it in its parent: on every rank but rank 0 (one node: rank 0 leads it) the
/// elements of the parent after the view, up to `seg_count - n % seg_count` of them, become rank
/// 0's elements at the same place. (An out-of-place result is a fresh buffer: nothing of the
/// caller's lies past its end.)
#[derive(Default)]
pub struct HanLastSegmentBcastCount;

impl Bug for HanLastSegmentBcastCount {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let (n, dtype) = (s.numel(x), be.buffer_dtype(x));
        let seg_count = (HAN_ALLREDUCE_SEGSIZE / dtype.size()).max(1);
        let tail = |parent: &Buf, off: usize| {
            let room = s.numel(parent).saturating_sub(off + n);
            room.min(seg_count - n % seg_count)
        };
        let past_end = match s.view_of(x) {
            Some((parent, off)) if s.ws() > 1 && n > 0 && !n.is_multiple_of(seg_count) && be.buffer_dtype(&parent) == dtype => {
                Some((parent.clone(), off + n, tail(&parent, off)))
            }
            _ => None,
        };
        let Some((parent, at, len)) = past_end.filter(|p| p.2 > 0) else {
            return be.all_reduce_(x, op);
        };
        let beyond = be.view(&parent, at, &[len])?;
        let me = s.rank();
        // Every rank gathers what lies past its buffer's end (rank 0's is what the leader's
        // broadcast of the last segment sends), then runs the op; a refused op still sees the
        // gather its peers are in through.
        let gather = be.all_gather_into_tensor(&beyond)?;
        let w = be.all_reduce_(x, op).inspect_err(|_| {
            let _ = gather.wait(BUG_WAIT);
        })?;
        Ok(s.then(w, move |be, _| {
            let all = be.download(gather.wait(BUG_WAIT)?)?;
            if me == 0 {
                return Ok(());
            }
            let mut t = be.download(&beyond)?;
            let bytes = t.bytes().len();
            t.bytes_mut().copy_from_slice(&all.bytes()[..bytes]);
            be.write(&beyond, &t)
        }))
    }
}

// ---------------------------------------------------------------- ROCm/rocm-systems PR #3213

/// rocSHMEM's `ROCSHMEM_REDUCE_MIN_WRKDATA_SIZE` (elements of the work array).
const ROCSHMEM_REDUCE_MIN_WRKDATA: usize = 1024;
/// rocSHMEM's `ROCSHMEM_REDUCE_SYNC_SIZE`.
const ROCSHMEM_REDUCE_SYNC: usize = 256;

/// Whether rocSHMEM's all-reduce before PR #3213 took the ring path with a forced first segment
/// for `n` elements at `ws` PEs: not the direct path (`max(n / 2 + 1, MIN_WRKDATA) >= ws * n`
/// and `SYNC >= ws`), and fewer elements than one ring segment (`(MIN_WRKDATA / ws) * ws`).
fn rocshmem_forced_segment(n: usize, ws: usize) -> bool {
    let direct = (n / 2 + 1).max(ROCSHMEM_REDUCE_MIN_WRKDATA) >= ws * n && ROCSHMEM_REDUCE_SYNC >= ws;
    let seg_size = (ROCSHMEM_REDUCE_MIN_WRKDATA / ws) * ws;
    ws > 1 && n > 0 && !direct && 2 * ws <= ROCSHMEM_REDUCE_SYNC && n < seg_size
}

/// rocSHMEM's ring all-reduce run over a whole segment on a shorter buffer (ROCm/rocm-systems PR
/// #3213 "[rocshmem] Fix a crash in allreduce for certain cases"). The IPC / GDA conduits take
/// the direct all-reduce while the work array holds `ws * n` elements, else the ring, cut in
/// segments of `seg_size = (1024 / ws) * ws` elements; the code before the fix set `n_seg = 1`
/// when `n / seg_size` was 0 (`if (n_seg == 0) n_seg = 1;`), so a message longer than the direct
/// path's limit but shorter than one segment ran the ring over a whole segment: it read and wrote
/// `seg_size` elements from buffers of `n`, and the kernel faulted (the fix runs the ring only
/// for `n_seg > 0` and the rest through the direct path). Here an all_reduce (out of place or in
/// place, any dtype and op) of `n` elements with `1024 / ws < n < seg_size` (2 ranks: 513 to
/// 1,023 elements; 4 ranks: 257 to 1,023) fails on every rank with the fault.
#[derive(Default)]
pub struct RocshmemRingForcedSegment;

impl RocshmemRingForcedSegment {
    fn check(s: &Shm, x: &Buf) -> Result<()> {
        let (n, ws) = (s.numel(x), s.ws());
        if !rocshmem_forced_segment(n, ws) {
            return Ok(());
        }
        let seg = (ROCSHMEM_REDUCE_MIN_WRKDATA / ws) * ws;
        Err(CollectiveError::Backend(format!(
            "rocshmem allreduce: ring over one {seg}-element segment of a {n}-element buffer: memory access fault (HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION)"
        )))
    }
}

impl Bug for RocshmemRingForcedSegment {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.all_reduce_(x, op)
    }
}

// ---------------------------------------------------------------- ztxz16/fastllm #724

/// The largest message fastllm's custom all-reduce takes (`CustomArMaxBytes()`; its value is not
/// in the thread: vLLM's custom all-reduce default, 8 MiB, here).
const CUSTOM_AR_MAX_BYTES: usize = 8 << 20;

/// A custom all-reduce whose guard checks the message's size but not its pointers' alignment
/// (ztxz16/fastllm #724 "[custom all-reduce] missing pointer-alignment guard faults on the device
/// (cudaErrorMisalignedAddress / Xid 13)": `RunCustomArCandidate` refused `bytes == 0`,
/// `bytes > CustomArMaxBytes()` and `bytes % 16 != 0`, then every kernel read the buffers as
/// 16-byte packets; "a call whose tensor is a view at a non-16-byte-aligned offset passes every
/// guard and faults on the device: the launch reports success, the error only shows up at the
/// next synchronisation"). Here a sum all_reduce (out of place or in place) of f32 / f16 / bf16
/// at two or more ranks, `0 < bytes <= 8 MiB` and a multiple of 16, whose buffer does not start
/// on a 16-byte boundary, fails at its wait on that rank with the misaligned-address error.
#[derive(Default)]
pub struct CustomArUnalignedView;

impl CustomArUnalignedView {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, call: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let dtype = be.buffer_dtype(x);
        let bytes = s.numel(x) * dtype.size();
        let custom = s.ws() > 1
            && op == ReduceOp::Sum
            && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            && bytes > 0
            && bytes <= CUSTOM_AR_MAX_BYTES
            && bytes.is_multiple_of(16);
        let addr = be.buffer_addr(x);
        let w = call()?;
        if !custom || addr.is_multiple_of(16) {
            return Ok(w);
        }
        Ok(s.then(w, move |_, _| {
            Err(CollectiveError::Backend(format!(
                "custom all-reduce: cudaErrorMisalignedAddress (Xid 13: misaligned address) reading 16-byte packets at 0x{addr:x}"
            )))
        }))
    }
}

impl Bug for CustomArUnalignedView {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, || s.inner.all_reduce_(x, op))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #4984

/// OpenSHMEM's all-to-all whose traffic permutation moved the destination but not the block
/// (open-mpi/ompi PR #4984 "ompi/oshmem: fix bug in shmem_alltoall in mca/scoll/basic": "When it
/// calculates dst PE idx, it does index permutation to achieve better distribution of traffic
/// (get_dst_pe() function), therefore, the src block index should be re-calculated from that new
/// dst PE index, not starting from 0"). `a2as_alg_simple` looped `src_blk_idx` from 0 and put
/// block `src_blk_idx` to PE `(my index + src_blk_idx) % n` (`get_dst_pe`, which staggers the
/// destinations so that PEs do not all write to PE 0 first), at the slot of the sender; the fix
/// takes the block of the PE it sends to. Here an equal-split `all_to_all_single` at two or more
/// ranks: rank `q`'s slot `p` holds rank `p`'s block `(q - p) mod n` instead of block `q` (slot 0
/// is right).
#[derive(Default)]
pub struct ShmemAlltoallPermutedBlock;

impl Bug for ShmemAlltoallPermutedBlock {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let ws = s.ws();
        let shape = be.buffer_shape(x);
        let rows = shape.first().copied().unwrap_or(0);
        if ws < 2 || o.is_some() || i.is_some() || rows == 0 || !rows.is_multiple_of(ws) {
            return be.all_to_all_single(x, o, i);
        }
        let block = s.numel(x) / ws * be.buffer_dtype(x).size();
        let q = s.rank();
        // Every rank's whole input, gathered beside the op, gives each slot the block its
        // sender put there.
        crate::then_gathered(
            s,
            be.all_gather_into_tensor(x)?,
            |g| g,
            || be.all_to_all_single(x, o, i),
            |b: &Buf| Some(b),
            move |all, t| {
                let input = block * ws;
                for p in 1..ws {
                    let sent = (q + ws - p) % ws;
                    crate::copy_bytes(t, p * block, all, p * input + sent * block, block);
                }
            },
        )
    }
}

// ---------------------------------------------------------------- RBLN-SW/torch-rbln PR #56

/// The per-rank receive alignment (bytes) the RBLN driver's strict `_rcclReduceScatter` demands.
const RBLN_RS_RECV_ALIGN: usize = 128;

/// A reduce_scatter whose padded-remainder path passes the unpadded per-rank count
/// (RBLN-SW/torch-rbln PR #56 "fix(c10d): align ReduceScatter padded-remainder recv_count to
/// driver requirement": `ReduceScatterRBLNWork::run()` splits a reduce_scatter into an aligned
/// block and a padded remainder; the remainder block padded the total send buffer but "still
/// passing the unaligned per-rank `recv_count` to the driver", whose v3.2.0 `_rcclReduceScatter`
/// requires `recv_count × elem_size % 128 == 0` and returns `-EINVAL`: "RCCL ReduceScatter
/// (padded remainder) failed: 1" for sizes such as 8 MiB + 88; the all-reduce remainder path of
/// the same file passed the aligned count and was right). Here a reduce_scatter_tensor (out of
/// place or `_out`) at two or more ranks whose per-rank output is not a multiple of 128 bytes
/// fails on every rank.
#[derive(Default)]
pub struct RblnRsRemainderUnaligned;

impl RblnRsRemainderUnaligned {
    fn check(s: &Shm, x: &Buf) -> Result<()> {
        let be = &*s.inner;
        let ws = s.ws();
        let per_rank = s.numel(x) / ws.max(1) * be.buffer_dtype(x).size();
        if ws < 2 || per_rank == 0 || per_rank.is_multiple_of(RBLN_RS_RECV_ALIGN) {
            return Ok(());
        }
        Err(CollectiveError::Backend(format!(
            "RCCL ReduceScatter (padded remainder) failed: 1 (_rcclReduceScatter: recv_count x elem_size = {per_rank} B, not a multiple of {RBLN_RS_RECV_ALIGN}: -EINVAL)"
        )))
    }
}

impl Bug for RblnRsRemainderUnaligned {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

// ---------------------------------------------------------------- ofiwg/libfabric PR #6571

/// The receive buffer size MPI posts for small messages over rxm (`FI_OFI_RXM_BUFFER_SIZE`,
/// also the multi-recv threshold Open MPI sets): 16 KiB.
const RXM_BUFFER_SIZE: usize = 16384;
/// `sizeof(struct rxm_pkt)`: `ofi_ctrl_hdr` (32 bytes) and `ofi_op_hdr` (32 bytes).
const RXM_PKT_HEADER: usize = 64;

/// An eager limit that silently keeps the packet header (ofiwg/libfabric PR #6571 "prov/rxm: Use
/// eager, sar, and buffer sizes correctly": rxm reserved its packet header inside the user's
/// eager size, so "the actual eager size is slightly less than 16k"; MPI posts multi-recv
/// buffers and receives transfers up to 16k in them, "the result is that 16k transfers from MPI
/// end up being transfered using either the SAR or rendezvous protocols. This results in
/// failures, as multi-recv handling isn't prepared to handle rendezvous messages"). Here a
/// point-to-point message of more than `16384 - 64` bytes and at most 16,384 (4,081 to 4,096
/// f32 elements, 8,161 to 8,192 of a 2-byte dtype) crosses to the rendezvous protocol while the
/// receiver expects it in its multi-recv buffer: the receive fails.
#[derive(Default)]
pub struct RxmEagerLimitMinusHeader;

impl Bug for RxmEagerLimitMinusHeader {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let bytes = s.numel(out) * be.buffer_dtype(out).size();
        let w = be.recv(out, src)?;
        if bytes <= RXM_BUFFER_SIZE - RXM_PKT_HEADER || bytes > RXM_BUFFER_SIZE {
            return Ok(w);
        }
        Ok(s.then(w, move |_, _| {
            Err(CollectiveError::Backend(format!(
                "rxm: a {bytes}-byte message past the eager limit ({} bytes) arrived as rendezvous in a multi-recv buffer: FI_EOPNOTSUPP",
                RXM_BUFFER_SIZE - RXM_PKT_HEADER
            )))
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<HanLastSegmentBcastCount>(
            "wild_han_last_segment_bcast_count",
            "views",
            "open-mpi/ompi#11441 (PR #11442): HAN's segmented all_reduce_ broadcasts the last segment with the full segment count: past a view's end, every rank but 0 gets rank 0's elements",
            &["views::all_reduce::inplace::f32::sum::ws2"],
        ),
        spec::<RocshmemRingForcedSegment>(
            "wild_rocshmem_ring_forced_segment",
            "values.sizes",
            "ROCm/rocm-systems PR #3213: an all_reduce past the direct path's limit but shorter than one ring segment (1024/ws < n < seg) runs a whole segment and faults",
            &["sizes::all_reduce::f32::n1023::ws2"],
        ),
        spec::<CustomArUnalignedView>(
            "wild_custom_ar_unaligned_view",
            "views",
            "ztxz16/fastllm#724: a sum all_reduce (f32/f16/bf16, <= 8 MiB, bytes % 16 == 0) of a buffer not 16-byte aligned faults at its wait",
            &["views::all_reduce::out::f32::sum::ws2"],
        ),
        spec::<ShmemAlltoallPermutedBlock>(
            "wild_shmem_alltoall_permuted_block",
            "values.move",
            "open-mpi/ompi PR #4984: oshmem's all-to-all staggers its destinations but sends block i to PE (me + i) % n: slot p of rank q holds block (q - p) mod n",
            &["seed::eager::all_to_all_equal_split_default"],
        ),
        spec::<RblnRsRemainderUnaligned>(
            "wild_rbln_rs_remainder_unaligned",
            "values.sizes",
            "RBLN-SW/torch-rbln PR #56: a reduce_scatter whose per-rank output is not a multiple of 128 bytes fails on the padded-remainder path (-EINVAL)",
            &["reduce_scatter_tensor::out::f32::sum::ws2"],
        ),
        spec::<RxmEagerLimitMinusHeader>(
            "wild_rxm_eager_limit_minus_header",
            "values.sizes",
            "ofiwg/libfabric PR #6571: a send / recv of 16,321 to 16,384 bytes goes rendezvous (eager limit 16 KiB minus the 64-byte header) into a multi-recv buffer: the receive fails",
            &["sizes::send_recv::f32::n4096::ws2"],
        ),
    ]
}
