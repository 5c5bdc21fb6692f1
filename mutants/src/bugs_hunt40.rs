//! The fortieth hunt: bugs from release notes. Each ports a bug whose fix a collective library
//! announced in its changelog or NEWS file in one line ("Fixed pipelining in linear rs",
//! "Resolved an issue when using more than 64 channels when multiple collectives are used in the
//! same ncclGroup() call", ...), with the pull request behind the line read for the mechanism:
//! UCC (TL/CUDA's pipelined reduce-scatter and all-gather fragments, CL/HIER's split-rail
//! all_reduce), Gloo (a per-peer count check written the wrong way round), RCCL (work items past
//! the 64th of a grouped launch, MSCCL++'s LL round flag advanced on the host). Each
//! bites only past a condition the line names (a fragment size, a list length, uneven counts);
//! the trigger is kept as far as a wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{copy_bytes, lock, set_f64, then_gathered, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// TL/CUDA's scratch buffer as this port sizes it (`UCC_TL_CUDA_SCRATCH_SIZE`; 4 MiB is the
/// port's choice, not a checked default): a pipelined linear algorithm moves at most
/// `scratch / 2 / team size` bytes of a block per fragment (`max_frag_size` of PR #669's comment).
const SCRATCH: usize = 4 << 20;

/// The fragment size in bytes of a pipelined TL/CUDA schedule on `ws` ranks, whole elements.
fn frag_bytes(ws: usize, elem: usize) -> usize {
    (SCRATCH / 2 / ws.max(1)) / elem * elem
}

// ---------------------------------------------------------------- openucx/ucc PR #770

/// The pipelined linear reduce-scatter that never advances its receive pointer (openucx/ucc
/// PR #770 "TL/CUDA: fix pipelining in linear rs", listed in UCC's NEWS as "Fixed pipelining in
/// linear rs": "TL CUDA linear reduce scatter doesn't update rbuf pointer after fragment setup of
/// pipelined schedule"). TL/CUDA's linear reduce-scatter moves a rank's block in fragments of
/// `scratch / 2 / N` bytes; each fragment's reduced values were written at the start of the
/// receive buffer. A block that fits one fragment is right; a larger one ends with every fragment
/// written over the first (the last one on top) and the rest of the buffer as it was: the
/// caller's old contents for `reduce_scatter_tensor_out`, zeros for a fresh output.
#[derive(Default)]
pub struct RsFragmentRbufNotAdvanced;

impl RsFragmentRbufNotAdvanced {
    /// The receive buffer as the fragments leave it: each written at offset 0, in order.
    fn misplace(be: &ShmBackend, out: &Buf, prior: Option<Tensor>, ws: usize) -> Result<()> {
        let r = be.download(out)?;
        let (n, fb) = (r.len_bytes(), frag_bytes(ws, r.dtype().size()));
        if fb == 0 || n <= fb {
            return Ok(());
        }
        let mut t = prior.unwrap_or_else(|| Tensor::zeros(r.dtype(), r.shape()));
        let mut at = 0;
        while at < n {
            let len = fb.min(n - at);
            copy_bytes(&mut t, 0, &r, at, len);
            at += len;
        }
        be.write(out, &t)
    }
}

impl Bug for RsFragmentRbufNotAdvanced {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let ws = s.ws();
        Ok(s.then(w, move |be, out| Self::misplace(be, out, None, ws)))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let ws = s.ws();
        let bytes = s.numel(out) * s.inner.buffer_dtype(out).size();
        let prior = if bytes > frag_bytes(ws, s.inner.buffer_dtype(out).size()) { Some(s.inner.download(out)?) } else { None };
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(s.then(w, move |be, out| match prior {
            Some(p) => Self::misplace(be, out, Some(p), ws),
            None => Ok(()),
        }))
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #770 (bug 1)

/// The split-rail all_reduce that hands its in-place reduce-scatter the wrong buffer (openucx/ucc
/// PR #770, the same NEWS line, bug 1: "CL HIER split rail algorithm doesn't provide correct
/// buffer for inplace reduce scatter, it passes original rbuf with stairway patter rank offset").
/// The split-rail (SRA) all_reduce is an in-place reduce-scatter into the receive buffer, then an
/// in-place all-gather of each rank's block from `rbuf + rank * block`. Given `rbuf` itself, rank
/// `q` reduces its block into the buffer's start, and the all-gather then takes, at `q`'s offset,
/// what was there: rank `q`'s own input for block `q`. Every rank's result has block 0 right and
/// block `q` (q >= 1) equal to rank `q`'s input. The port's own choice of when CL/HIER takes the
/// split-rail path: a message of at least [`SRA_MIN`] bytes on 2 ranks or more.
#[derive(Default)]
pub struct SplitRailRsWrongBuffer {
    /// The side all-gathers issued and not yet waited (left out of `outstanding`).
    side: Arc<AtomicUsize>,
}

/// The smallest all_reduce (bytes) this port sends down the split-rail path.
const SRA_MIN: usize = 1 << 20;

impl SplitRailRsWrongBuffer {
    fn taken(s: &Shm, x: &Buf) -> bool {
        s.ws() >= 2 && s.numel(x) * s.inner.buffer_dtype(x).size() >= SRA_MIN
    }
    /// Block `q >= 1` of `t` replaced by rank `q`'s input block (`all`: every rank's input, rank
    /// `q`'s element `i` at `q * n + i`); the last block takes the remainder.
    fn stale_blocks(all: &Tensor, t: &mut Tensor, ws: usize) {
        let (n, es) = (t.numel(), t.dtype().size());
        let b = n / ws;
        for q in 1..ws {
            let start = q * b;
            let end = if q == ws - 1 { n } else { start + b };
            copy_bytes(t, start * es, all, (q * n + start) * es, (end - start) * es);
        }
    }
}

impl SplitRailRsWrongBuffer {
    /// An all_reduce (in place or not) of a taken size: the real op, its result's blocks past
    /// the first made stale from a side gather of the inputs.
    fn issue(&self, s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        if !Self::taken(s, x) {
            return all_reduce(s, x, op, in_place);
        }
        let ws = s.ws();
        with_side_gather(s, x, op, in_place, &self.side, move |all, t| Self::stale_blocks(all, t, ws))
    }
}

impl Bug for SplitRailRsWrongBuffer {
    fn outstanding(&self, s: &Shm) -> usize {
        outstanding_but(s, &self.side)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- ROCm/rccl PR #1634

/// The LL allreduce whose round flag is advanced on the host (ROCm/rccl PR #1634 "Fix MSCCLPP
/// accuracy issue for allreduce7" and PR #1654, RCCL's changelog for ROCm 6.4.1: "Fixed the
/// accuracy issue for MSCCLPP `allreduce7` kernel in graph mode"; PR #1654: "the LL protocol flag
/// was getting updated in the host side and not getting captured in graph mode"). MSCCL++'s
/// `allreduce7` is the small-message LL all_reduce: each packet carries the round's flag, and a
/// reader takes a peer's packet once its flag matches. Replayed from a captured graph the flag
/// never advances, so a replay's reader accepts the packets the peer left in the previous
/// round. Here a `sum` all_reduce (both variants) of f32 / f16 / bf16 / i32 below [`LL_MAX`]
/// bytes on the same buffer, dtype and shape as this communicator's previous such call (a replay
/// on the graph's static buffer) returns the rank's own current input plus every peer's previous
/// input. The port's own choice of the LL range: below 1 MiB.
/// An LL call as the next one sees it: buffer address, dtype, shape and every rank's input.
type LlRound = (usize, DType, Vec<usize>, Tensor);

#[derive(Default)]
pub struct LlFlagNotAdvancedOnReplay {
    /// The previous LL call on this communicator.
    prev: Arc<Mutex<Option<LlRound>>>,
    /// The side all-gathers issued and not yet waited (not the caller's works: left out of
    /// `outstanding`).
    side: Arc<AtomicUsize>,
}

/// The largest all_reduce (bytes, exclusive) the port sends down the LL path.
const LL_MAX: usize = 1 << 20;

impl LlFlagNotAdvancedOnReplay {
    fn taken(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        let dtype = s.inner.buffer_dtype(x);
        op == ReduceOp::Sum
            && matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32)
            && s.numel(x) * dtype.size() < LL_MAX
            && s.numel(x) > 0
    }
    fn issue(&self, s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        if !Self::taken(s, x, op) {
            return all_reduce(s, x, op, in_place);
        }
        let key = (s.inner.buffer_addr(x), s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let (me, ws, prev) = (s.rank(), s.ws(), self.prev.clone());
        with_side_gather(s, x, op, in_place, &self.side, move |all, t| {
            let mut last = lock(&prev);
            if let Some((addr, dtype, shape, old)) = last.as_ref() {
                if (*addr, *dtype, shape) == (key.0, key.1, &key.2) {
                    let n = t.numel();
                    for i in 0..n {
                        let peers: f64 = (0..ws).filter(|&q| q != me).map(|q| old.get_f64(q * n + i)).sum();
                        set_f64(t, i, all.get_f64(me * n + i) + peers);
                    }
                }
            }
            *last = Some((key.0, key.1, key.2, all.clone()));
        })
    }
}

impl Bug for LlFlagNotAdvancedOnReplay {
    fn outstanding(&self, s: &Shm) -> usize {
        outstanding_but(s, &self.side)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #450

/// Pipelined all-gather fragments that keep the first fragment's arguments (openucx/ucc PR #450
/// "TL/CUDA: rsv/agv restart": "In the case of pipeline sbuf/count will be different for each
/// frag. The same "task" object can be used for different tasks, hence need to update buf/counts
/// on start"; the fix moved the buffer / count set-up from init to start). A pipelined
/// all-gather whose blocks exceed one fragment (`scratch / 2 / N` bytes) re-runs the first
/// fragment's task for every later one: each rank's block in the result holds its first fragment
/// again and again (the last piece cut to the block's end). Blocks of one fragment are right.
#[derive(Default)]
pub struct AgFragmentKeepsFirstArgs;

impl AgFragmentKeepsFirstArgs {
    fn repeat_first(be: &ShmBackend, out: &Buf, ws: usize) -> Result<()> {
        let r = be.download(out)?;
        let block = r.len_bytes() / ws.max(1);
        let fb = frag_bytes(ws, r.dtype().size());
        if fb == 0 || block <= fb {
            return Ok(());
        }
        let mut t = r.clone();
        for q in 0..ws {
            let base = q * block;
            let mut at = fb;
            while at < block {
                let len = fb.min(block - at);
                copy_bytes(&mut t, base + at, &r, base, len);
                at += len;
            }
        }
        be.write(out, &t)
    }
}

impl Bug for AgFragmentKeepsFirstArgs {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let ws = s.ws();
        Ok(s.then(w, move |be, out| Self::repeat_first(be, out, ws)))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        let ws = s.ws();
        Ok(s.then(w, move |be, out| Self::repeat_first(be, out, ws)))
    }
}

// ---------------------------------------------------------------- pytorch/gloo PR #347

/// A per-peer count check written the wrong way round (pytorch/gloo PR #347 "Fixed the bug in
/// gatherv": "in gloo/gatherv.cc, `GLOO_ENFORCE_GE` is a wrong check ... task A send 3 and 4
/// elements to task A and task B, respectively, while task B send 5 and 6 ... 4 (the number of
/// elements send to task B) is not greater equal than 5 (the number of elements receive from
/// task B)"). Here all_to_all_single with explicit splits enforces, on each rank, that what it
/// sends to each peer is at least what it receives from that peer: legal uneven splits whose
/// receive count from some peer exceeds the send count to it fail on that rank with the
/// enforce's message, and its peers wait for it.
#[derive(Default)]
pub struct AllToAllCountCheckReversed;

impl Bug for AllToAllCountCheckReversed {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        if let (Some(o), Some(i)) = (o, i) {
            if o.len() == s.ws() && i.len() == s.ws() {
                if let Some(j) = (0..s.ws()).find(|&j| i[j] < o[j]) {
                    return Err(CollectiveError::Backend(format!(
                        "[enforce fail at gloo/alltoallv.cc:107] elementsPerRank[{j}] >= recvCounts[{j}]. {} vs {}",
                        i[j], o[j]
                    )));
                }
            }
        }
        s.inner.all_to_all_single(x, o, i)
    }
}

// ---------------------------------------------------------------- ROCm/rccl PR #1688

/// Batch items past the 64th of a grouped launch put in the wrong slot (ROCm/rccl PR #1688 "Fix
/// when more than 64 channels are used for multi-collective group calls", RCCL's changelog:
/// "Resolved an issue when using more than 64 channels when multiple collectives are used in the
/// same `ncclGroup()` call": "The original code would incorrectly assign some batches to the
/// wrong channel ... The original code iterated over each set of 64 channels at a time,
/// including additional batch items, instead of iterating over all of them first"). The port's
/// own mapping: a coalesced all_reduce is one grouped launch whose work items are its tensors;
/// the items from the 65th on land in a slot no channel runs, so their results are never
/// written (a fresh output stays zero, an in-place tensor keeps its input). Lists of up to 64
/// tensors are right.
#[derive(Default)]
pub struct GroupItemsPast64Unrun;

/// Work items one grouped launch arranges per set of channels.
const GROUP_SLOTS: usize = 64;

impl Bug for GroupItemsPast64Unrun {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        Ok(s.then(w, |be, outs| {
            for out in outs.iter().skip(GROUP_SLOTS) {
                let t = be.download(out)?;
                be.write(out, &Tensor::zeros(t.dtype(), t.shape()))?;
            }
            Ok(())
        }))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let kept: Vec<Tensor> = xs.iter().skip(GROUP_SLOTS).map(|x| s.inner.download(x)).collect::<Result<_>>()?;
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        Ok(s.then(w, move |be, outs| {
            for (out, t) in outs.iter().skip(GROUP_SLOTS).zip(&kept) {
                be.write(out, t)?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- side gathers (two ports)

/// The real all_reduce of `x`, in place or not.
fn all_reduce(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
    if in_place {
        s.inner.all_reduce_(x, op)
    } else {
        s.inner.all_reduce(x, op)
    }
}

/// The real all_reduce of `x` (in place or not), its result edited by `f` from every rank's
/// input (`all`), taken by an all-gather issued beside it. That side gather is counted in `side`
/// until `f` ran or the call was refused (a refused call waits it at once, `then_gathered`):
/// not the caller's work, [`outstanding_but`] leaves it out.
fn with_side_gather(
    s: &Shm,
    x: &Buf,
    op: ReduceOp,
    in_place: bool,
    side: &Arc<AtomicUsize>,
    f: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<Buf>> {
    let gather = s.inner.all_gather_into_tensor(x)?;
    side.fetch_add(1, Ordering::SeqCst);
    let (undo, done) = (side.clone(), side.clone());
    let real = move || {
        all_reduce(s, x, op, in_place).inspect_err(|_| {
            undo.fetch_sub(1, Ordering::SeqCst);
        })
    };
    then_gathered(
        s,
        gather,
        |g| g,
        real,
        |o| Some(o),
        move |all, t| {
            done.fetch_sub(1, Ordering::SeqCst);
            f(all, t)
        },
    )
}

/// The backend's outstanding works less the side gathers counted in `side`.
fn outstanding_but(s: &Shm, side: &AtomicUsize) -> usize {
    (s.inner.outstanding() + s.own.get()).saturating_sub(side.load(Ordering::SeqCst))
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<RsFragmentRbufNotAdvanced>(
            "wild_rs_fragment_rbuf_not_advanced",
            "values.sizes",
            "openucx/ucc PR #770: a pipelined reduce_scatter writes every fragment at the start of the output (rbuf never advanced): blocks past scratch/2/N bytes wrong",
            &["sizes::reduce_scatter_tensor::f32::n262145::ws2"],
        ),
        spec::<SplitRailRsWrongBuffer>(
            "wild_split_rail_rs_wrong_buffer",
            "values.reduce",
            "openucx/ucc PR #770 (bug 1): the split-rail all_reduce gives its in-place reduce-scatter rbuf itself, not rbuf + rank * block: blocks past the first come back as their rank's input",
            &["all_reduce::out::f32::max::ws2::large"],
        ),
        spec::<LlFlagNotAdvancedOnReplay>(
            "wild_ll_flag_not_advanced_on_replay",
            "values.reduce",
            "ROCm/rccl PR #1634 / #1654: the LL allreduce7's round flag advanced on the host: a small sum all_reduce replayed on the same buffer reads the peers' previous inputs",
            &["async::completes_without_wait::every_op::ws2"],
        ),
        spec::<AgFragmentKeepsFirstArgs>(
            "wild_ag_fragment_keeps_first_args",
            "values.sizes",
            "openucx/ucc PR #450: pipelined all_gather fragments keep the first fragment's buffer and count: blocks past scratch/2/N bytes repeat their first fragment",
            &["sizes::all_gather_into_tensor::f32::n262145::ws2"],
        ),
        spec::<AllToAllCountCheckReversed>(
            "wild_alltoallv_count_check_reversed",
            "values.move",
            "pytorch/gloo PR #347: an enforce that what a rank sends each peer is at least what it receives from it refuses legal uneven all_to_all splits",
            &["sizes::all_to_all_single::uneven::f32::grid::ws2"],
        ),
        spec::<GroupItemsPast64Unrun>(
            "wild_group_items_past_64_unrun",
            "values.coalesced",
            "ROCm/rccl PR #1688: a grouped launch of more than 64 work items puts the later ones where no channel runs them: a coalesced all_reduce's tensors past the 64th are never written",
            &["all_reduce::coalesced::f32::sum::ws2::list100"],
        ),
    ]
}
