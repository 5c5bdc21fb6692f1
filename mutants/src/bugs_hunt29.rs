//! The twenty-ninth hunt: bugs from the wild in caches and state carried across calls. Each
//! ports a correctness bug that shipped in a collective library or its framework layer (MPICH,
//! Tenstorrent's TT-NN collectives, Horovod, XLA:GPU, PyTorch's symmetric memory and
//! ProcessGroupNCCL), found in the project's issue or pull-request thread named on its type: a
//! cache keyed on too few fields (a buffer's address without the op, a shape without its rank),
//! a persistent or cached op that replays its first call, a counter that is the process's where
//! it must be the group's, a write that outlives the op's wait. The trigger (op, call order,
//! buffer reuse, group shape) is kept as far as a wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{edit, lock, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, Completion, DType, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A buffer's identity as the caches below see it: address, dtype and shape.
type BufKey = (usize, DType, Vec<usize>);

fn key_of(s: &Shm, b: &Buf) -> BufKey {
    (s.inner.buffer_addr(b), s.inner.buffer_dtype(b), s.inner.buffer_shape(b))
}

// ---------------------------------------------------------------- pmodels/mpich #7078

/// A persistent gather that keeps its first call's send data (pmodels/mpich #7078 "Persistent
/// gather not working as expected": `MPI_Gather_init` copied the contents of the send buffer
/// when the request was made, so each `MPI_Start` sent the values the buffer held at init, not
/// the ones written since). Here the first `gather` of a buffer (address, dtype, shape) on a
/// communicator makes its persistent request, which takes a copy of the buffer's contents; every
/// later `gather` of that buffer starts the request again and sends the copy.
#[derive(Default)]
pub struct PersistentGatherStaleSend {
    /// The persistent requests by send buffer: the send data copied at init.
    requests: Mutex<HashMap<BufKey, Tensor>>,
}

impl Bug for PersistentGatherStaleSend {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        if s.numel(x) == 0 {
            return be.gather(x, root);
        }
        let key = key_of(s, x);
        let mut requests = lock(&self.requests);
        match requests.get(&key) {
            Some(copied) => {
                let copied = be.upload(copied)?;
                drop(requests);
                be.gather(&copied, root)
            }
            None => {
                requests.insert(key, be.download(x)?);
                drop(requests);
                be.gather(x, root)
            }
        }
    }
}

// ---------------------------------------------------------------- tenstorrent/tt-metal #47108

/// An all-to-all whose cached program writes zeros (tenstorrent/tt-metal #47108
/// "all_to_all_combine returns all-zeros on program-cache HIT with static (reused) input
/// buffers": the first call, a cache miss, is right; every later call with the same input
/// buffers hits the program cache, whose path never completes the cross-device init barrier,
/// and the output is all zeros; PR #45332's workaround hashed the input addresses, so only
/// callers that reallocate their inputs each call were spared). Here an `all_to_all_single`
/// whose input (address, dtype, shape) and splits match an earlier call on the communicator
/// returns an output of zeros.
#[derive(Default)]
pub struct ProgramCacheHitZeros {
    programs: Mutex<HashSet<A2aProgram>>,
}

/// An all-to-all program's key: the input buffer and the output / input splits.
type A2aProgram = (BufKey, Option<Vec<usize>>, Option<Vec<usize>>);

impl Bug for ProgramCacheHitZeros {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let key = (key_of(s, x), o.map(<[usize]>::to_vec), i.map(<[usize]>::to_vec));
        let hit = !lock(&self.programs).insert(key);
        let w = s.inner.all_to_all_single(x, o, i)?;
        if !hit {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0))))
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #2872

/// A response cache that does not compare the op (horovod/horovod PR #2872 "add allgather
/// cache", the review's finding: `ResponseCache::cached` matched a request to a cached response
/// by the tensor's name only, never checking that the `RequestType` / `ResponseType` were the
/// same, so a second op on a tensor of the same name, another collective, ran as the cached one:
/// `test_broadcast_object` failed). Here the cache's name for a tensor is its buffer (address,
/// dtype, shape): an all_reduce caches its response (with its reduce op) under its input, and a
/// later broadcast of that buffer on the communicator runs the cached all_reduce instead.
#[derive(Default)]
pub struct ResponseCacheIgnoresOp {
    responses: Mutex<HashMap<BufKey, ReduceOp>>,
}

impl ResponseCacheIgnoresOp {
    fn cache(&self, s: &Shm, x: &Buf, op: ReduceOp) {
        lock(&self.responses).insert(key_of(s, x), op);
    }
    fn cached(&self, s: &Shm, x: &Buf) -> Option<ReduceOp> {
        lock(&self.responses).get(&key_of(s, x)).copied()
    }
}

impl Bug for ResponseCacheIgnoresOp {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.cache(s, x, op);
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.cache(s, x, op);
        s.inner.all_reduce_(x, op)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        match self.cached(s, x) {
            Some(op) if src < s.ws() => s.inner.all_reduce(x, op),
            _ => s.inner.broadcast(x, src),
        }
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        match self.cached(s, x) {
            Some(op) if src < s.ws() => s.inner.all_reduce_(x, op),
            _ => s.inner.broadcast_(x, src),
        }
    }
}

// ---------------------------------------------------------------- openxla/xla #45406

/// A registration cache whose hits differ between ranks (openxla/xla #45406 "CollectiveMemoryCache
/// can cause rank-divergent NCCL window registration": symmetric-memory windows are cached by
/// (clique, device address); a miss calls `ncclCommWindowRegister`, which is collective over the
/// clique, a hit skips it; the cache assumed every rank sees the same hit or miss, but the
/// allocator's addresses differ between ranks, so one rank registers — a collective — while its
/// peers, hitting, go straight to the op: a deadlock). Here an all_reduce (out of place or in
/// place) whose input (address, bytes) this rank has not registered on the communicator first
/// runs a registration collective (a barrier), then the all_reduce; a registered one runs the
/// all_reduce alone.
#[derive(Default)]
pub struct WindowRegDivergentHits {
    windows: Mutex<HashSet<(usize, usize)>>,
}

impl WindowRegDivergentHits {
    fn registered(&self, s: &Shm, x: &Buf, issue: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let window = (s.inner.buffer_addr(x), s.numel(x) * s.inner.buffer_dtype(x).size());
        if !lock(&self.windows).insert(window) {
            return issue();
        }
        let reg = s.inner.barrier()?;
        let w = issue().inspect_err(|_| {
            let _ = reg.wait(BUG_WAIT);
        })?;
        Ok(s.then(w, move |_, _| reg.wait(BUG_WAIT).map(|_| ())))
    }
}

impl Bug for WindowRegDivergentHits {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.registered(s, x, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.registered(s, x, || s.inner.all_reduce_(x, op))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #160795

/// A symmetric-memory handle that carries the allocation's base (pytorch/pytorch PR #160795
/// "[SymmMem] Handle should carry tensor data_ptr instead of allocation base address":
/// `rendezvous(tensor)` built `handle->buffer_ptrs` from the allocation's base on every rank,
/// and the kernels read the tensor through those pointers, so a tensor at an offset inside its
/// allocation was read from the allocation's first bytes). Here an out-of-place all_reduce of a
/// view at a non-zero offset reads, on every rank, the view's size of elements at its parent's
/// start.
#[derive(Default)]
pub struct SymmHandleAtAllocBase;

impl Bug for SymmHandleAtAllocBase {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let be = &*s.inner;
        match s.view_of(x) {
            Some((parent, off)) if off > 0 && s.numel(x) > 0 && be.buffer_dtype(&parent) == be.buffer_dtype(x) => {
                be.all_reduce(&be.view(&parent, 0, &be.buffer_shape(x))?, op)
            }
            _ => be.all_reduce(x, op),
        }
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #188655

/// How long after a wait the op's own write lands in [`StashLateWrite`].
const LATE_WRITE_AFTER: Duration = Duration::from_millis(10);

/// A result written after the wait (pytorch/pytorch #188655 "stash/unstash memory safety
/// mechanism breaks with async collectives across 3+ CUDA streams (data corruption)": with
/// `recordStream` replaced by stashing the tensor until the work is waited, an
/// `all_reduce(a, async_op=True)` issued on a side stream, waited there and freed, let the
/// caching allocator hand `a`'s memory to the default stream while NCCL's kernel was still to
/// write it: the new tensor read the all_reduce's output). Here an in-place all_reduce's wait
/// returns with the result in the buffer, and the op writes its result into the buffer once
/// more 10 ms later: whatever the caller put there after the wait is overwritten.
#[derive(Default)]
pub struct StashLateWrite;

impl Bug for StashLateWrite {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        let inner = s.inner.clone();
        Ok(s.then(w, move |be, out| {
            let result = be.download(out)?;
            let out = out.clone();
            std::thread::spawn(move || {
                std::thread::sleep(LATE_WRITE_AFTER);
                let _ = inner.write(&out, &result);
            });
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #196350

/// The process's symmetric-memory rendezvous count ([`StoreExchangeGlobalSeq`]).
static RENDEZVOUS_SEQ: AtomicU64 = AtomicU64::new(0);

/// A store exchange keyed by the process's count of rendezvous (pytorch/pytorch PR #196350
/// "symm_mem: Scope the StoreExchange sequence counter to the process group", fixing #196082:
/// `StoreExchange` keyed its store entries `<prefix>/<seq_id>/<rank>` with `seq_id` counting the
/// rendezvous the *process* had performed; a rendezvous on a strict subgroup advanced it on the
/// members only, so the next rendezvous on a larger group had its members read and write
/// different keys, and hang). Here every all_reduce (out of place or in place; the symmetric-
/// memory path rendezvouses its input) first exchanges the process's rendezvous count with its
/// peers and takes the next; where the counts differ the exchange never meets: the op never
/// completes (each wait times out).
#[derive(Default)]
pub struct StoreExchangeGlobalSeq;

impl StoreExchangeGlobalSeq {
    fn rendezvous(s: &Shm, issue: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let seq = RENDEZVOUS_SEQ.fetch_add(1, Ordering::SeqCst);
        let be = &*s.inner;
        let xchg = be.all_gather_into_tensor(&be.upload(&Tensor::from_vec(&[1], vec![seq as i64]))?)?;
        let op = issue().inspect_err(|_| {
            let _ = xchg.wait(BUG_WAIT);
        })?;
        let (value, meta) = (op.peek().clone(), op.meta().clone());
        let done = Rendezvous { be: s.inner.clone(), seq: seq as i64, xchg, op, met: Mutex::new(None) };
        Ok(s.relayed(value, Arc::new(done), meta))
    }
}

/// The exchange and the op behind it.
struct Rendezvous {
    be: Arc<ShmBackend>,
    seq: i64,
    xchg: Work<Buf>,
    op: Work<Buf>,
    /// Whether every peer had this rank's count (known once the exchange completed).
    met: Mutex<Option<bool>>,
}

impl Rendezvous {
    /// `Some(met)` once the exchange completed within `timeout`.
    fn met(&self, timeout: Duration) -> Result<Option<bool>> {
        if let Some(m) = *lock(&self.met) {
            return Ok(Some(m));
        }
        match crate::relay_wait(&self.xchg, timeout, |_| {})? {
            false => Ok(None),
            true => {
                let all = self.be.download(self.xchg.peek())?;
                let m = all.as_slice::<i64>().iter().all(|&q| q == self.seq);
                *lock(&self.met) = Some(m);
                Ok(Some(m))
            }
        }
    }
}

impl Completion for Rendezvous {
    fn is_completed(&self) -> bool {
        self.xchg.is_completed() && matches!(self.met(Duration::ZERO), Ok(Some(true))) && self.op.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        match self.met(timeout)? {
            None => Ok(false),
            Some(false) => {
                // The peers wait on keys this rank never writes: pending for good.
                std::thread::sleep(timeout.saturating_sub(start.elapsed()));
                Ok(false)
            }
            Some(true) => crate::relay_wait(&self.op, timeout.saturating_sub(start.elapsed()), |_| {}),
        }
    }
}

impl Bug for StoreExchangeGlobalSeq {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::rendezvous(s, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::rendezvous(s, || s.inner.all_reduce_(x, op))
    }
}

// ---------------------------------------------------------------- tenstorrent/tt-metal PR #40279

/// A program cache whose shape hash drops the rank (tenstorrent/tt-metal PR #40279 "Fix Shape
/// hash collision for different-rank shapes with identical padding", closing #39953: `Shape`
/// pads its dims to four with leading 1s and hashed only the padded dims, so `[128, 128]` and
/// `[1, 128, 128]` had one program-cache key; a reduce_scatter of the 3-D input reused the
/// program built for the 2-D one, with its compile-time dims). Here all_gather_into_tensor and
/// reduce_scatter_tensor (out of place) keep their program per (op, dtype, dims padded to four)
/// and the program holds the output shape it was built for: an input of another rank with the
/// same padded dims gets its result in the first one's output shape.
#[derive(Default)]
pub struct ShapeHashDropsRank {
    programs: Mutex<HashMap<PaddedKey, Vec<usize>>>,
}

/// A program's key in [`ShapeHashDropsRank`]: op, dtype, dims padded to four.
type PaddedKey = (&'static str, DType, Vec<usize>);

impl ShapeHashDropsRank {
    fn padded(shape: &[usize]) -> Vec<usize> {
        let mut p = vec![1; 4usize.saturating_sub(shape.len())];
        p.extend_from_slice(shape);
        p
    }
    fn cached(&self, s: &Shm, op: &'static str, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let out = w.peek().clone();
        let built_for = be.buffer_shape(&out);
        let key = (op, be.buffer_dtype(x), Self::padded(&be.buffer_shape(x)));
        let program = lock(&self.programs).entry(key).or_insert_with(|| built_for.clone()).clone();
        if program == built_for || program.iter().product::<usize>() != built_for.iter().product::<usize>() {
            return Ok(w);
        }
        let as_program = be.view(&out, 0, &program)?;
        Ok(s.then_as(w, as_program, |_, _| Ok(())))
    }
}

impl Bug for ShapeHashDropsRank {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        self.cached(s, "all_gather_into_tensor", x, w)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        self.cached(s, "reduce_scatter_tensor", x, w)
    }
}

// ---------------------------------------------------------------- pmodels/mpich PR #7550

/// MPICH's threshold for the scatter + allgather broadcast (`MPIR_CVAR_BCAST_SHORT_MSG_SIZE`).
const BCAST_SHORT_MSG: usize = 12288;
/// MPICH's long-message threshold (`MPIR_CVAR_BCAST_LONG_MSG_SIZE`): scatter + allgather at
/// any communicator size from here.
const BCAST_LONG_MSG: usize = 524288;

/// A persistent broadcast whose scatter state is not reset between starts (pmodels/mpich PR
/// #7550 "coll: fix persistent bcast algorithm": `iscatter_intra_sched_binomial`, the scatter
/// phase of the scatter + allgather broadcast, keeps its per-call state — how many bytes a rank
/// already holds — in the schedule; run as a persistent collective, that state was set when the
/// request was made and never re-initialised at the second `MPI_Start`, so from then on the
/// scatter phase treated every rank as already holding its part). Here an in-place broadcast
/// of a message that takes MPICH's scatter + allgather path (at least 12 KiB on a power-of-two
/// communicator, at least 512 KiB on any) is the first start of a persistent request per
/// (buffer address, dtype, shape, root); from its second start on, the scatter phase moves
/// nothing: on every rank but the root, each rank's part of the message (the `ceil(bytes / ws)`
/// bytes at its position relative to the root) is what that rank's own buffer held before the
/// call, and only the root's part is new (the allgather phase still spreads every part).
#[derive(Default)]
pub struct PersistentBcastStaleScatter {
    started: Mutex<HashSet<(BufKey, usize)>>,
}

impl Bug for PersistentBcastStaleScatter {
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let ws = s.ws();
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        let scatter_path = ws >= 2 && src < ws && (bytes >= BCAST_LONG_MSG || (bytes >= BCAST_SHORT_MSG && ws.is_power_of_two()));
        if !scatter_path {
            return s.inner.broadcast_(x, src);
        }
        let restarted = !lock(&self.started).insert((key_of(s, x), src));
        let me = s.rank();
        // Every rank on this path gathers its buffer as it was before the call, first or not.
        crate::then_gathered(
            s,
            s.inner.all_gather_into_tensor(x)?,
            |g| g,
            || s.inner.broadcast_(x, src),
            |b: &Buf| Some(b),
            move |before, t| {
                if !restarted || me == src {
                    return;
                }
                let part = bytes.div_ceil(ws);
                for rel in 1..ws {
                    let owner = (rel + src) % ws;
                    let (from, to) = ((rel * part).min(bytes), ((rel + 1) * part).min(bytes));
                    crate::copy_bytes(t, from, before, owner * bytes + from, to - from);
                }
            },
        )
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<PersistentGatherStaleSend>(
            "wild_persistent_gather_stale_send",
            "placement.reuse",
            "pmodels/mpich#7078: a gather of a buffer gathered before sends the contents it had at its first gather",
            &["realloc::gather::out::ws2"],
        ),
        spec::<ProgramCacheHitZeros>(
            "wild_program_cache_hit_zeros",
            "placement.reuse",
            "tenstorrent/tt-metal#47108: an all_to_all_single on the same input buffer and splits as an earlier one returns zeros",
            &["realloc::all_to_all_single::out::ws2"],
        ),
        spec::<ResponseCacheIgnoresOp>(
            "wild_response_cache_ignores_op",
            "placement.reuse",
            "horovod/horovod PR #2872: a broadcast of a buffer all_reduced before runs the cached all_reduce",
            &["async::completes_without_wait::every_op::ws2"],
        ),
        spec::<WindowRegDivergentHits>(
            "wild_window_reg_divergent_hits",
            "placement.reuse",
            "openxla/xla#45406: an all_reduce of an address this rank has not registered runs a registration barrier first; ranks whose caches differ mismatch",
            &["async::dropped_work_still_runs_for_its_peers::ws2"],
        ),
        spec::<SymmHandleAtAllocBase>(
            "wild_symm_handle_at_alloc_base",
            "views",
            "pytorch/pytorch PR #160795: an out-of-place all_reduce of a view at an offset reads its parent's first elements on every rank",
            &["views::all_reduce::out::f32::sum::ws2"],
        ),
        spec::<StashLateWrite>(
            "wild_stash_late_write",
            "async.result_final_after_wait",
            "pytorch/pytorch#188655: an in-place all_reduce writes its result into the buffer again 10 ms after the wait",
            &["reuse::no_late_write::all_reduce::inplace::ws2"],
        ),
        spec::<StoreExchangeGlobalSeq>(
            "wild_store_exchange_global_seq",
            "subgroups",
            "pytorch/pytorch PR #196350: every all_reduce rendezvouses on the process's count of rendezvous; after a subgroup's all_reduce the world's never meets",
            &["reuse::world_and_group_in_flight::all_reduce::out::ws3"],
        ),
        spec::<ShapeHashDropsRank>(
            "wild_shape_hash_drops_rank",
            "shapes",
            "tenstorrent/tt-metal PR #40279: all_gather / reduce_scatter programs cached by dims padded to four: an input of another rank gets the first one's output shape",
            &["wild_state::all_gather_rank_padded_shapes::ws2"],
        ),
        spec::<PersistentBcastStaleScatter>(
            "wild_persistent_bcast_stale_scatter",
            "placement.reuse",
            "pmodels/mpich PR #7550: a restarted in-place broadcast (>= 12 KiB, scatter + allgather path) keeps every non-root part as its owner held it before the call",
            &["realloc::broadcast::inplace::ws2"],
        ),
    ]
}
