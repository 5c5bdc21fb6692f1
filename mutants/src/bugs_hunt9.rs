//! The ninth outside hunt: the thinnest clauses of the contract. A result pool recycled by the
//! next call, an exchange of split sizes at issue, a teardown that waits for in-place works to
//! be released, a word-wise copy past an `_out` view, a registration keyed by (address, bytes)
//! that remembers the dtype, a gather whose non-roots get an empty result, a barrier that only
//! meets at rank 0, a plan cache that keeps a refused call's error, works forgotten once
//! completed, an aligned view passed by its parent, an in-place buffer rolled back after its
//! failed wait. Each is a bug a backend author could ship,
//! over the correct shm backend.

use crate::campaign::Spec;
use crate::lock;
use crate::{bump, edit, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

fn timeout(s: &Shm, op: &str, waited: Duration, detail: &str) -> CollectiveError {
    CollectiveError::Timeout { op: op.into(), seq: 0, rank: s.rank(), waited_ms: waited.as_millis() as u64, detail: detail.into() }
}

// ---------------------------------------------------------------- async.result_final_after_wait

/// The out-of-place broadcast returns its result in a pooled buffer per (dtype, shape) (a
/// registered staging buffer): the next broadcast of that shape writes into the buffer an
/// earlier call returned, after that call's wait.
#[derive(Default)]
pub struct BroadcastResultPooled {
    pool: Mutex<HashMap<(DType, Vec<usize>), Buf>>,
}

impl Bug for BroadcastResultPooled {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        let key = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let buf = {
            let mut pool = lock(&self.pool);
            match pool.get(&key) {
                Some(b) => b.clone(),
                None => pool.entry(key.clone()).or_insert(s.inner.alloc(key.0, &key.1)?).clone(),
            }
        };
        let b = buf.clone();
        Ok(s.then_as(w, buf, move |be, res| be.write(&b, &be.download(res)?)))
    }
}

// ---------------------------------------------------------------- async.issue_returns

/// all_to_all_single with explicit splits exchanges the split sizes with every peer at issue
/// (a blocking handshake, as a library that sizes its receive buffers first), and fails with a
/// timeout after 15 s; the equal split (no splits) needs no exchange and returns at once.
#[derive(Default)]
pub struct A2aSplitsExchangedAtIssue;

impl Bug for A2aSplitsExchangedAtIssue {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        if (o.is_some() || i.is_some()) && s.ws() > 1 {
            let t0 = Instant::now();
            match s.inner.barrier()?.wait(BUG_WAIT) {
                Ok(_) => {}
                Err(CollectiveError::Timeout { .. }) => {
                    return Err(timeout(s, "all_to_all_single", t0.elapsed(), "exchanging split sizes: not every peer issued"))
                }
                Err(e) => return Err(e),
            }
        }
        s.inner.all_to_all_single(x, o, i)
    }
}

// ---------------------------------------------------------------- async.unwaited_exit

/// How long [`DropWaitsInplaceUnpinned`]'s drop waits for its in-place works to be waited.
const UNPIN: Duration = Duration::from_secs(5);

/// In-place ops pin the caller's buffer until their work is waited; the communicator's drop
/// waits (up to 5 s) for every pinned buffer to be released, so a process that drops an
/// un-waited in-place collective hangs in teardown (out-of-place ops pin nothing).
#[derive(Default)]
pub struct DropWaitsInplaceUnpinned {
    pinned: Arc<AtomicUsize>,
}

impl DropWaitsInplaceUnpinned {
    fn pin(&self, s: &Shm, w: Work<Buf>) -> Work<Buf> {
        self.pinned.fetch_add(1, Ordering::SeqCst);
        let pinned = self.pinned.clone();
        s.then(w, move |_, _| {
            pinned.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

impl Bug for DropWaitsInplaceUnpinned {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.pin(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.pin(s, s.inner.broadcast_(x, src)?))
    }
}

impl Drop for DropWaitsInplaceUnpinned {
    fn drop(&mut self) {
        let t0 = Instant::now();
        while self.pinned.load(Ordering::SeqCst) > 0 && t0.elapsed() < UNPIN {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------- placement.out_buffer

/// The `_out` all_gather / reduce_scatter copy 2-byte dtypes (f16 / bf16) into the output in
/// 4-byte words: an odd element count writes one element past the end of the output (inside
/// its parent when the output is a view; a whole allocation is padded, so only views show it).
#[derive(Default)]
pub struct OutWordCopyTail;

fn word_tail(s: &Shm, w: Work<Buf>, out: &Buf) -> Work<Buf> {
    let n = s.numel(out);
    let two_bytes = s.inner.buffer_dtype(out).size() == 2;
    match s.view_of(out) {
        Some((parent, off)) if two_bytes && n % 2 == 1 => s.then(w, move |be, _| edit(be, &parent, |t| bump(t, off + n))),
        _ => w,
    }
}

impl Bug for OutWordCopyTail {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Ok(word_tail(s, s.inner.all_gather_into_tensor_out(x, out)?, out))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(word_tail(s, s.inner.reduce_scatter_tensor_out(x, op, out)?, out))
    }
}

// ---------------------------------------------------------------- placement.realloc

/// all_reduce registers its input by (address, bytes) and keeps the dtype it was first
/// registered with: a buffer freed and re-allocated at the same address with the same byte size
/// and another dtype of the same element size (f32 -> i32) is reduced as the old dtype.
#[derive(Default)]
pub struct DtypeKeptByRegistration {
    registered: Mutex<HashMap<(usize, usize), DType>>,
}

impl Bug for DtypeKeptByRegistration {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (dtype, shape) = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let key = (s.inner.buffer_addr(x), s.numel(x) * dtype.size());
        let kept = *lock(&self.registered).entry(key).or_insert(dtype);
        if kept == dtype || kept.size() != dtype.size() || key.1 == 0 {
            return s.inner.all_reduce(x, op);
        }
        let as_kept = s.inner.upload(&Tensor::from_bytes(kept, &shape, s.inner.download(x)?.bytes()))?;
        let w = s.inner.all_reduce(&as_kept, op)?;
        let out = s.inner.alloc(dtype, &shape)?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, res| be.write(&o, &Tensor::from_bytes(dtype, &shape, be.download(res)?.bytes()))))
    }
}

// ---------------------------------------------------------------- shapes

/// gather allocates its result on the root only: a non-root gets an empty `[0]` buffer (its
/// contents are undefined there, but its shape is the root's on every rank).
#[derive(Default)]
pub struct GatherNonRootEmpty;

impl Bug for GatherNonRootEmpty {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.gather(x, root)?;
        if s.rank() == root || root >= s.ws() {
            return Ok(w);
        }
        let empty = s.inner.alloc(s.inner.buffer_dtype(x), &[0])?;
        Ok(s.then_as(w, empty, |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- barrier

/// Completes once every inner work has.
struct AllOf(Vec<Work<Buf>>);

impl Completion for AllOf {
    fn is_completed(&self) -> bool {
        self.0.iter().all(|w| w.is_completed())
    }
    fn wait_for(&self, t: Duration) -> Result<bool> {
        let deadline = Instant::now() + t;
        for w in &self.0 {
            match w.wait(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => {}
                Err(CollectiveError::Timeout { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// The barrier is a gather of tokens to rank 0 with no release: rank 0 completes once every
/// rank has entered, another rank as soon as rank 0 has taken its token (it synchronises with
/// rank 0 only).
#[derive(Default)]
pub struct BarrierMeetsRankZeroOnly;

impl Bug for BarrierMeetsRankZeroOnly {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if s.ws() == 1 {
            return s.inner.barrier();
        }
        let token = || s.inner.upload(&Tensor::from_vec(&[1], vec![0f32]));
        if s.rank() == 0 {
            let recvs = (1..s.ws()).map(|r| s.inner.recv(&token()?, r)).collect::<Result<Vec<_>>>()?;
            return Ok(Work::new((), Arc::new(AllOf(recvs)), s.meta("barrier"), &s.own));
        }
        let w = s.inner.send(&token()?, 0)?;
        Ok(s.then_as(w, (), |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- failure.usable_after

type PlanKey = (DType, Vec<usize>, String);

/// A completion that notes a bad-input failure of an all_reduce against its plan key.
struct NotePlan {
    inner: Work<Buf>,
    key: PlanKey,
    failed: Arc<Mutex<HashMap<PlanKey, CollectiveError>>>,
}

impl Completion for NotePlan {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |e| {
            if e.bad_input_kind().is_some() {
                lock(&self.failed).insert(self.key.clone(), e.clone());
            }
        })
    }
}

/// all_reduce caches its plan per (dtype, shape, op), and a plan whose call was refused as bad
/// input is cached with its error: every later all_reduce with that key on this rank fails with
/// the stale error at issue (other keys, and other ops, run).
#[derive(Default)]
pub struct FailedPlanCached {
    failed: Arc<Mutex<HashMap<PlanKey, CollectiveError>>>,
    hidden: OutstandingCounter,
}

impl Bug for FailedPlanCached {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x), format!("{op:?}"));
        if let Some(e) = lock(&self.failed).get(&key) {
            return Err(e.clone());
        }
        let w = s.inner.all_reduce(x, op)?;
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Ok(Work::new(v, Arc::new(NotePlan { inner: w, key, failed: self.failed.clone() }), meta, &self.hidden))
    }
}

// ---------------------------------------------------------------- quiescence

/// A completion that notes that its work was waited (to an end).
struct NoteWaited {
    inner: Arc<Work<Buf>>,
    waited: Arc<AtomicBool>,
}

impl Completion for NoteWaited {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        };
        if !matches!(r, Ok(false)) {
            self.waited.store(true, Ordering::SeqCst);
        }
        r
    }
}

/// An issued all_reduce's inner work and whether it was waited.
type Issued = (Weak<Work<Buf>>, Arc<AtomicBool>);

/// The work registry drops an all_reduce once it has completed, not once it is waited:
/// `outstanding()` leaves out a completed all_reduce its caller has not waited yet.
#[derive(Default)]
pub struct CompletedWorksUncounted {
    issued: Mutex<Vec<Issued>>,
    hidden: OutstandingCounter,
}

impl Bug for CompletedWorksUncounted {
    fn outstanding(&self, s: &Shm) -> usize {
        let mut issued = lock(&self.issued);
        issued.retain(|(w, waited)| w.strong_count() > 0 && !waited.load(Ordering::SeqCst));
        let done = issued.iter().filter(|(w, _)| w.upgrade().is_some_and(|w| w.is_completed())).count();
        (s.inner.outstanding() + s.own.get()).saturating_sub(done)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = Arc::new(s.inner.all_reduce(x, op)?);
        let waited = Arc::new(AtomicBool::new(false));
        lock(&self.issued).push((Arc::downgrade(&w), waited.clone()));
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Ok(Work::new(v, Arc::new(NoteWaited { inner: w, waited }), meta, &self.hidden))
    }
}

// ---------------------------------------------------------------- views

/// all_reduce passes a view at a 16-byte-aligned offset to its vectorised kernel zero-copy, by
/// its parent's registration: the kernel reads from the parent's start (the offset is lost).
/// Views at misaligned offsets are staged and read right.
#[derive(Default)]
pub struct AlignedViewByParent;

impl Bug for AlignedViewByParent {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let es = s.inner.buffer_dtype(x).size();
        match s.view_of(x) {
            Some((parent, off)) if off > 0 && (off * es).is_multiple_of(16) => {
                let at_base = s.inner.view(&parent, 0, &s.inner.buffer_shape(x))?;
                s.inner.all_reduce(&at_base, op)
            }
            _ => s.inner.all_reduce(x, op),
        }
    }
}

// ---------------------------------------------------------------- failure.no_touch_after_failed_wait

/// How long after a failed wait the rollback of an in-place buffer lands.
const ROLLBACK_AFTER: Duration = Duration::from_millis(20);

/// An in-place all_reduce_ that rolls its buffer back to its staged input when its wait fails.
struct Rollback {
    inner: Work<Buf>,
    be: Arc<concord_shm::ShmBackend>,
    x: Buf,
    saved: Tensor,
    rolled: AtomicBool,
}

impl Completion for Rollback {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match self.inner.wait(timeout) {
            Ok(_) => Ok(true),
            Err(e) => {
                if !self.rolled.swap(true, Ordering::SeqCst) {
                    let (be, x, saved) = (self.be.clone(), self.x.clone(), self.saved.clone());
                    std::thread::spawn(move || {
                        std::thread::sleep(ROLLBACK_AFTER);
                        let _ = be.write(&x, &saved);
                    });
                }
                match e {
                    CollectiveError::Timeout { .. } => Ok(false),
                    e => Err(e),
                }
            }
        }
    }
}

/// The in-place all_reduce_ stages its input, and when its wait fails it rolls the caller's
/// buffer back to that input (so a retry starts from the same values) on its progress thread,
/// 20 ms after the wait returned the failure: the buffer is written after it was the caller's
/// again.
#[derive(Default)]
pub struct FailedInplaceRolledBackLate {
    hidden: OutstandingCounter,
}

impl Bug for FailedInplaceRolledBackLate {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let saved = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        let rb = Rollback { inner: w, be: s.inner.clone(), x: x.clone(), saved, rolled: AtomicBool::new(false) };
        Ok(Work::new(v, Arc::new(rb), meta, &self.hidden))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<BroadcastResultPooled>(
            "broadcast_result_pooled",
            "async.result_final_after_wait",
            "the out-of-place broadcast returns a pooled buffer per (dtype, shape): the next broadcast of that shape overwrites an earlier call's result",
            &["reuse::outputs_kept::broadcast::out::ws2"],
        ),
        spec::<A2aSplitsExchangedAtIssue>(
            "a2a_splits_exchanged_at_issue",
            "async.issue_returns",
            "all_to_all_single with explicit splits exchanges the split sizes at issue, blocking until every peer has issued",
            &["async::issue_returns_at_once::all_to_all_splits::ws2"],
        ),
        spec::<DropWaitsInplaceUnpinned>(
            "drop_waits_inplace_unpinned",
            "async.unwaited_exit",
            "in-place ops pin the caller's buffer until waited; the communicator's drop waits (up to 5 s) for un-waited in-place works",
            &["async::unwaited_collective_exits_within_1s::ws1"],
        ),
        spec::<OutWordCopyTail>(
            "out_word_copy_tail",
            "placement.out_buffer",
            "the _out all_gather / reduce_scatter copy f16 / bf16 in 4-byte words: an odd count writes one element past an output view",
            &["views::all_gather_into_tensor::outbuf::bf16::ws3"],
        ),
        spec::<DtypeKeptByRegistration>(
            "dtype_kept_by_registration",
            "placement.realloc",
            "all_reduce registers its input by (address, bytes) with its first dtype: re-allocated there as i32 after f32, it is reduced as f32",
            &["realloc::all_reduce::out::ws2"],
        ),
        spec::<GatherNonRootEmpty>(
            "gather_non_root_empty",
            "shapes",
            "gather allocates its result on the root only: a non-root gets an empty [0] buffer, not the root's shape",
            &["gather::out::i8::ws2"],
        ),
        spec::<BarrierMeetsRankZeroOnly>(
            "barrier_meets_rank_zero_only",
            "barrier",
            "the barrier gathers tokens to rank 0 with no release: a non-root completes once rank 0 took its token, before the others entered",
            &["async::barrier_synchronises::ws3"],
        ),
        spec::<FailedPlanCached>(
            "failed_plan_cached",
            "failure.usable_after",
            "all_reduce caches its plan per (dtype, shape, op) with a refused call's error: the next all_reduce with that key fails with it",
            &["bad_input::all_reduce_shape_mismatch::ws2"],
        ),
        spec::<CompletedWorksUncounted>(
            "completed_works_uncounted",
            "quiescence",
            "the registry drops an all_reduce once completed, not once waited: a completed, un-waited all_reduce is not in outstanding()",
            &["async::completes_without_wait::ws2"],
        ),
        spec::<AlignedViewByParent>(
            "aligned_view_by_parent",
            "views",
            "all_reduce passes a view at a 16-byte-aligned offset zero-copy by its parent: the kernel reads from the parent's start",
            &["views::aligned::all_reduce::out::f32::sum::ws2"],
        ),
        spec::<FailedInplaceRolledBackLate>(
            "failed_inplace_rolled_back_late",
            "failure.no_touch_after_failed_wait",
            "all_reduce_ rolls the caller's buffer back to its staged input 20 ms after its wait failed (on its progress thread)",
            &["faults::stall_between_barriers::ws2"],
        ),
    ]
}
