//! The seventeenth review's blind spots (read-only review17, 2026-11-28; helper impl17): close
//! variants of bugs the wild_* / fault suites were written for: a size class or world size the
//! case did not run (findings 1, 2), a large view on the out-of-place path (3), a local failure
//! with an earlier op in flight (4), a process-wide resource set up by a subgroup first (5), and
//! the in-place path of a view cache (6). Each was written here first and run against the whole
//! catalogue before any case was added (docs/RESULTS.md, "review17's blind spots").
use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, Buf, Bug, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};

const MIB: usize = 1 << 20;

fn nbytes(s: &Shm, x: &Buf) -> usize {
    s.numel(x) * s.inner.buffer_dtype(x).size()
}

fn view_base(s: &Shm, b: &Buf) -> Option<(Buf, usize)> {
    match s.view_of(b) {
        Some((parent, off)) if off > 0 && s.inner.buffer_dtype(&parent) == s.inner.buffer_dtype(b) => Some((parent, off)),
        _ => None,
    }
}

/// Finding 3 (clause `views`). Zero-copy user-buffer registration, used only for large messages
/// (>= 4 MiB: NCCL's registered paths, RCCL's CE path), resolves a pointer to its *allocation*
/// (`cuMemGetAddressRange`) and hands the allocation's base to the kernel: an out-of-place
/// all_reduce of a large view at a non-zero offset reduces the view's length from the parent's
/// start.
#[derive(Default)]
pub struct LargeRegAtAllocBase;

impl Bug for LargeRegAtAllocBase {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match view_base(s, x).filter(|_| nbytes(s, x) >= 4 * MIB) {
            Some((parent, _)) => {
                let b = s.inner.view(&parent, 0, &s.inner.buffer_shape(x))?;
                s.inner.all_reduce(&b, op)
            }
            None => s.inner.all_reduce(x, op),
        }
    }
}

/// Finding 1 (clauses `values.sizes`, `values.world_sizes`). vLLM-style two-shot custom
/// all_reduce (5-8 ranks above 256 KiB, byte counts a multiple of 16, else the fallback): rank
/// `r` reduces packs `r * part .. (r + 1) * part` with `part = packs / ws`, and the last rank's
/// `end = rank == ngpus - 1 ? size : start + part` lost its condition: the last `packs % ws`
/// packs are never reduced, each rank keeps its own input there. Sum, f16 / bf16 / f32.
#[derive(Default)]
pub struct TwoShotLastPartWs5to8;

impl TwoShotLastPartWs5to8 {
    fn tail_start(s: &Shm, x: &Buf, op: ReduceOp) -> Option<usize> {
        let (b, ws) = (nbytes(s, x), s.ws());
        let float = matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16 | DType::F32);
        let packs = b / 16;
        (op == ReduceOp::Sum && float && (5..=8).contains(&ws) && b > 256 * 1024 && b % 16 == 0 && packs % ws != 0)
            .then_some(packs / ws * ws * 16)
    }
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let Some(start) = Self::tail_start(s, x, op) else {
            return if in_place { s.inner.all_reduce_(x, op) } else { s.inner.all_reduce(x, op) };
        };
        let own = s.inner.download(x)?;
        let w = if in_place { s.inner.all_reduce_(x, op)? } else { s.inner.all_reduce(x, op)? };
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let n = t.len_bytes() - start;
                copy_bytes(t, start, &own, start, n)
            })
        }))
    }
}

impl Bug for TwoShotLastPartWs5to8 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// Finding 2 (clause `values.sizes`). MSCCL++-style all_gather (RCCL routes messages above 1 MiB
/// that are a multiple of 32 bytes to it, ROCm/rccl PR #1281) copying `bytes / (16 * ws)` 16-byte
/// words of each peer's chunk, as `allreduce8` reduced them (ROCm/rccl PR #1556): the rest of
/// each peer's chunk is never written (zeros). Never fires at 2 ranks (`16 * ws = 32`).
#[derive(Default)]
pub struct MscclppAllgatherTail;

impl MscclppAllgatherTail {
    fn keep(s: &Shm, x: &Buf) -> Option<usize> {
        let (b, unit) = (nbytes(s, x), 16 * s.ws());
        (b > MIB && b % 32 == 0 && b % unit != 0).then_some(b / unit * unit)
    }
    fn fix(s: &Shm, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        let Some(keep) = Self::keep(s, x) else { return Ok(w) };
        let (ws, me, chunk) = (s.ws(), s.rank(), nbytes(s, x));
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t: &mut Tensor| {
                for r in (0..ws).filter(|&r| r != me) {
                    t.bytes_mut()[r * chunk + keep..(r + 1) * chunk].fill(0);
                }
            })
        }))
    }
}

impl Bug for MscclppAllgatherTail {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        Self::fix(s, x, w)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        Self::fix(s, x, w)
    }
}

/// Finding 4 (clause `faults.local_failure_named_everywhere`). A communicator-level sticky error
/// (an NCCL wrapper checking the communicator's async error, `ncclCommGetAsyncError`-style, in
/// every work's wait): once some op's wait returned a failure that is neither a timeout nor bad
/// input (a local failure), every op issued BEFORE it and waited after it returns that error
/// too, though it completed healthily; ops issued after it are fine (the world "stays usable").
/// all_reduce (both variants), broadcast, all_to_all_single.
static FAIL_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LAST_FAIL: std::sync::Mutex<Option<concord_core::CollectiveError>> = std::sync::Mutex::new(None);

fn record(e: concord_core::CollectiveError) -> concord_core::CollectiveError {
    if e.name() != "timeout" && !e.name().starts_with("bad_input") {
        *LAST_FAIL.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        FAIL_GEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    e
}

#[derive(Default)]
pub struct StickyFailureFailsInFlight;

impl StickyFailureFailsInFlight {
    fn wrap(s: &Shm, w: Work<Buf>) -> Work<Buf> {
        let gen = FAIL_GEN.load(std::sync::atomic::Ordering::SeqCst);
        let value = w.peek().clone();
        let twist = crate::Twist { map_err: Some(record), ..Default::default() };
        s.twisted(w, value, twist, move |_, _| {
            if FAIL_GEN.load(std::sync::atomic::Ordering::SeqCst) != gen {
                if let Some(e) = LAST_FAIL.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    return Err(e);
                }
            }
            Ok(())
        })
    }
}

impl Bug for StickyFailureFailsInFlight {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::wrap(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(Self::wrap(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(Self::wrap(s, s.inner.broadcast(x, src)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(Self::wrap(s, s.inner.all_to_all_single(x, o, i)?))
    }
}

/// Finding 6 (clause `views`). The registration cache of `state::views_of_one_parent`'s mutant
/// (`view_offset_by_parent`), on the in-place path (DDP / FSDP bucket views of one flat buffer,
/// all-reduced in place): all_reduce_ finds a view's region by (parent, count, dtype) and
/// reduces the first such view's region in place.
#[derive(Default)]
pub struct InPlaceViewOffsetByParent {
    table: std::sync::Mutex<std::collections::HashMap<(usize, usize, DType), usize>>,
}

impl Bug for InPlaceViewOffsetByParent {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let Some((parent, off)) = s.view_of(x) else { return s.inner.all_reduce_(x, op) };
        let be = &*s.inner;
        let (numel, dtype) = (s.numel(x), be.buffer_dtype(x));
        let key = (be.buffer_addr(&parent), numel, dtype);
        let first = *crate::lock(&self.table).entry(key).or_insert(off);
        if first == off || numel == 0 || first + numel > s.numel(&parent) {
            return be.all_reduce_(x, op);
        }
        let w = be.all_reduce_(&be.view(&parent, first, &be.buffer_shape(x))?, op)?;
        Ok(s.then_as(w, x.clone(), |_, _| Ok(())))
    }
}

/// Finding 5 (clause `async.communicators_independent`). NVIDIA/nccl #2430's shape: a resource
/// shared by every communicator of the process (a split with shared resources) is set up lazily
/// by whichever communicator first runs the op, for ITS size; a later all_gather on a larger
/// communicator moves only that many ranks' chunks (the rest of the output is zeros). Fires only
/// when a subgroup's all_gather is the process's first.
static AG_SETUP_WS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

#[derive(Default)]
pub struct SharedSetupFirstUserSize;

impl SharedSetupFirstUserSize {
    fn fix(s: &Shm, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        let (ws, me) = (s.ws(), s.rank());
        let set = *AG_SETUP_WS.get_or_init(|| ws);
        if set >= ws || nbytes(s, x) == 0 {
            return Ok(w);
        }
        let chunk = nbytes(s, x);
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t: &mut Tensor| {
                for r in (set..ws).filter(|&r| r != me) {
                    t.bytes_mut()[r * chunk..(r + 1) * chunk].fill(0);
                }
            })
        }))
    }
}

impl Bug for SharedSetupFirstUserSize {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        Self::fix(s, x, w)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        Self::fix(s, x, w)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<TwoShotLastPartWs5to8>(
            "review17_two_shot_last_part_ws5to8",
            "values.sizes",
            "two-shot sum all_reduce (5-8 ranks, > 256 KiB, a multiple of 16 bytes) splits packs / ws per rank and the last rank does not take the remainder: the last packs % ws 16-byte packs keep each rank's input",
            &["sizes::all_reduce::out::f32::grid::ws5"],
        ),
        spec::<MscclppAllgatherTail>(
            "review17_mscclpp_allgather_tail",
            "values.sizes",
            "all_gather past 1 MiB of a multiple of 32 bytes copies bytes / (16 ws) 16-byte words of each peer's chunk: the tail of every peer's chunk stays zero (at 3+ ranks)",
            &["wild_custom::all_reduce::tail_past_16ws::f32::out::ws3"],
        ),
        spec::<LargeRegAtAllocBase>(
            "review17_large_reg_at_alloc_base",
            "views",
            "out-of-place all_reduce of an input view of 4 MiB or more registers the allocation, not the view: it reduces the view's length from the parent's start",
            &["wild_layout::inplace_all_reduce_view_in_window::ws2"],
        ),
        spec::<StickyFailureFailsInFlight>(
            "review17_sticky_failure_fails_in_flight",
            "faults.local_failure_named_everywhere",
            "one error flag per communicator set by a local failure: an op issued before the failing one and waited after it returns the failure, though it completed",
            &["faults::fail_after_post::in_place::ws2"],
        ),
        spec::<SharedSetupFirstUserSize>(
            "review17_shared_setup_first_user_size",
            "async.communicators_independent",
            "a process-wide all_gather resource set up by the first communicator that runs one, for its size: after a 2-rank group's all_gather, the 3-rank world's gathers only 2 ranks' chunks",
            &["state::group_recreated_same_members::ws3"],
        ),
        spec::<InPlaceViewOffsetByParent>(
            "review17_inplace_view_offset_by_parent",
            "views",
            "all_reduce_ of a view finds its region by (parent, count, dtype): equal-sized in-place views of one flat buffer after the first reduce the first one's region",
            &["state::views_of_one_parent::ws2"],
        ),
    ]
}
