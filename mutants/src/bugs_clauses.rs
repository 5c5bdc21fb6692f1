//! Mutants for the contract clauses the first campaigns left without one (one bug each, written
//! before the case that catches it; see `coverage` for the per-clause table). Each is a bug a
//! backend author could ship, over the correct shm backend.

use crate::campaign::Spec;
use crate::{copy_bytes, edit, set_f64, Buf, Bug, Shm, Twist, BUG_WAIT};
use concord_core::{progress, Backend, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// `all_gather_into_tensor` of a tensor of rank >= 2 returns the flat buffer the library call
/// filled (`[ws * numel]`) instead of `[ws * d0, rest..]`.
#[derive(Default)]
pub struct AllGatherReturnsFlat;

impl Bug for AllGatherReturnsFlat {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        flat_when_nd(s, x, s.inner.all_gather_into_tensor(x)?)
    }
}

/// `w`'s output as a flat view of itself when the input `x` has 2 dims or more (the shape a
/// backend drops when it handles every call as a 1-D buffer).
fn flat_when_nd(s: &Shm, x: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
    if s.inner.buffer_shape(x).len() < 2 {
        return Ok(w);
    }
    let out = w.peek().clone();
    let flat = s.inner.view(&out, 0, &[s.numel(&out)])?;
    Ok(s.then_as(w, flat, |_, _| Ok(())))
}

/// Staging buffers registered per (address, dtype, numel): the caller's buffer is copied in only
/// when its address is first registered.
#[derive(Default)]
pub struct Staging {
    staged: Mutex<HashMap<(usize, DType, usize), Buf>>,
}

impl Staging {
    /// The staging buffer of `x` (filled from `x` only on first registration).
    fn stage(&self, s: &Shm, x: &Buf) -> Result<Buf> {
        let dtype = s.inner.buffer_dtype(x);
        let key = (s.inner.buffer_addr(x), dtype, s.numel(x));
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = staged.get(&key) {
            return Ok(b.clone());
        }
        let b = s.inner.alloc(dtype, &s.inner.buffer_shape(x))?;
        s.inner.write(&b, &s.inner.download(x)?)?;
        staged.insert(key, b.clone());
        Ok(b)
    }
}

/// In-place `all_reduce_` runs on a [`Staging`] buffer and copies the result back: a buffer
/// reused with new contents is reduced from the staging buffer's stale contents.
#[derive(Default)]
pub struct StagedOncePerAddress(Staging);

impl Bug for StagedOncePerAddress {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(&self.0.stage(s, x)?, op)?;
        let back = x.clone();
        Ok(s.then_as(w, x.clone(), move |be, res| be.write(&back, &be.download(res)?)))
    }
}

/// Out-of-place `reduce_scatter_tensor` reads its input from a [`Staging`] buffer: an input
/// buffer reused with new contents is reduced with the contents of its first use.
#[derive(Default)]
pub struct ReduceScatterStagedOnce(Staging);

impl Bug for ReduceScatterStagedOnce {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(&self.0.stage(s, x)?, op)
    }
}

/// A blocking receive: `recv` returns only once its message has arrived (up to [`BUG_WAIT`]),
/// so `irecv(p); isend(p)` on both ranks of a pair deadlocks.
#[derive(Default)]
pub struct RecvBlocksAtIssue;

impl Bug for RecvBlocksAtIssue {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let v = s.inner.recv(out, src)?.into_value(BUG_WAIT)?;
        Ok(s.done(v, "recv"))
    }
}

/// How long [`DropDrainsUnwaited`]'s drop waits for its works to be waited.
const DRAIN: Duration = Duration::from_secs(5);

/// The communicator's drop waits (up to 5 s) until every `all_reduce` it issued has been waited:
/// an un-waited work the caller dropped holds the process's teardown.
#[derive(Default)]
pub struct DropDrainsUnwaited {
    issued: AtomicUsize,
    waited: Arc<AtomicUsize>,
}

impl Bug for DropDrainsUnwaited {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        self.issued.fetch_add(1, Ordering::SeqCst);
        let waited = self.waited.clone();
        Ok(s.then(w, move |_, _| {
            waited.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
    }
}

impl Drop for DropDrainsUnwaited {
    fn drop(&mut self) {
        let t0 = Instant::now();
        while self.waited.load(Ordering::SeqCst) < self.issued.load(Ordering::SeqCst) && t0.elapsed() < DRAIN {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A sticky error: after a call refused at issue with `bad_input`, every later call on the
/// communicator returns that error (as a library whose communicator stays in error would).
#[derive(Default)]
pub struct StickyBadInput {
    error: Mutex<Option<CollectiveError>>,
}

impl StickyBadInput {
    fn call<T>(&self, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &*error {
            return Err(e.clone());
        }
        let r = issue();
        if let Err(e) = &r {
            if e.name().starts_with("bad_input") {
                *error = Some(e.clone());
            }
        }
        r
    }
}

impl Bug for StickyBadInput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.call(|| s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.call(|| s.inner.all_reduce_(x, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.call(|| s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.call(|| s.inner.all_gather_into_tensor_out(x, out))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.call(|| s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.call(|| s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.call(|| s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.call(|| s.inner.broadcast(x, src))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.call(|| s.inner.scatter(x, root))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.call(|| s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.call(|| s.inner.recv(out, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.call(|| s.inner.barrier())
    }
}

/// Ends `w`'s record in [`progress`] at once (the record of the op just issued).
fn unrecord<T>(w: &Work<T>) {
    let (op, seq) = (w.meta().op.clone(), w.meta().seq);
    for f in progress::in_flight().into_iter().filter(|f| f.op == op && f.seq == seq) {
        progress::end(&f.backend, f.seq);
    }
}

/// Collectives are recorded in [`progress`] only while their launch runs: the record ends when
/// issue returns, not when the op completes (a stuck rank's deadline report then says `idle`).
#[derive(Default)]
pub struct ProgressEndsAtIssue;

impl Bug for ProgressEndsAtIssue {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        unrecord(&w);
        Ok(w)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        unrecord(&w);
        Ok(w)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        unrecord(&w);
        Ok(w)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        unrecord(&w);
        Ok(w)
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        let w = s.inner.barrier()?;
        unrecord(&w);
        Ok(w)
    }
}

/// A failure inside the backend (a panic or a local error on its progress thread) never reaches
/// the work: `all_reduce`'s wait reports the op as still pending (a timeout), not the failure.
#[derive(Default)]
pub struct FailureReportedAsPending;

impl Bug for FailureReportedAsPending {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let v = w.peek().clone();
        let twist = Twist {
            map_err: Some(|e| match e {
                e @ (CollectiveError::BadInput { .. } | CollectiveError::PeerDied { .. } | CollectiveError::Timeout { .. }) => e,
                e => CollectiveError::Timeout { op: "all_reduce".into(), seq: 0, rank: 0, waited_ms: 0, detail: format!("pending ({e})") },
            }),
            ..Twist::default()
        };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
}

/// bf16 `sum` at world size >= 3 accumulates in bf16: the partial sum is rounded to bf16 after
/// every rank's add (a ring kernel that stores partials in the wire dtype), not once at the end.
#[derive(Default)]
pub struct Bf16PartialSumsRounded;

impl Bug for Bf16PartialSumsRounded {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        crate::bugs::sum_rounded_per_add(s, x, op, DType::BF16)
    }
}

/// In a subgroup, `premul_sum` runs as `sum` (the group's op table lacks the pre-multiply; the
/// world's is right).
#[derive(Default)]
pub struct SubgroupPremulSumAsSum;

impl Bug for SubgroupPremulSumAsSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let op = if s.in_subgroup() && matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op };
        s.inner.all_reduce(x, op)
    }
}

/// Out-of-place `broadcast` runs as an all_gather from which each rank keeps chunk `src`: roots
/// are never compared across ranks, so ranks passing different `src` each get their own's data.
#[derive(Default)]
pub struct BroadcastViaAllGather;

impl Bug for BroadcastViaAllGather {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if src >= s.ws() {
            return s.inner.broadcast(x, src);
        }
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))?;
        let g = s.inner.all_gather_into_tensor(x)?;
        let o = out.clone();
        Ok(s.then_as(g, out, move |be, gathered| {
            let all = be.download(gathered)?;
            let n = all.len_bytes() / be.world_size();
            edit(be, &o, |t| copy_bytes(t, 0, &all, src * n, n))
        }))
    }
}

/// A collective the bug keeps an eye on (the caller's work waits on it; the bug holds a `Weak`).
struct Tracked {
    inner: Work<Buf>,
}

impl Completion for Tracked {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |_| {})
    }
}

/// One queue for collectives and point-to-point (a single stream): a `send` starts only once
/// every `all_reduce` issued before it on the communicator has completed, so `all_reduce;
/// isend(1)` against a peer doing `irecv(0); wait; all_reduce` deadlocks until the deadline.
#[derive(Default)]
pub struct SendQueuedBehindCollectives {
    pending: Mutex<Vec<Weak<Tracked>>>,
    /// Counts the mapped works (never reported: the inner work each holds is).
    shadow: OutstandingCounter,
}

impl Bug for SendQueuedBehindCollectives {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let t = Arc::new(Tracked { inner: w });
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|p| p.upgrade().is_some_and(|p| !p.is_completed()));
        pending.push(Arc::downgrade(&t));
        Ok(Work::new(value, t, meta, &self.shadow))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let ahead: Vec<Arc<Tracked>> = self.pending.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
        for t in ahead {
            // Failures are the collective's waiter's to see; the queue just moves on. Twice the
            // bug deadline: longer than the peer's op timeout (15 s by default, as long as
            // BUG_WAIT), so the peer's wait fails first instead of racing this one.
            let _ = t.inner.wait(2 * BUG_WAIT);
        }
        s.inner.send(x, dst)
    }
}

/// `reduce_scatter_tensor` of a tensor of rank >= 2 returns a flat `[numel / ws]` buffer, not
/// `[d0 / ws, rest..]`.
#[derive(Default)]
pub struct ReduceScatterReturnsFlat;

impl Bug for ReduceScatterReturnsFlat {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        flat_when_nd(s, x, s.inner.reduce_scatter_tensor(x, op)?)
    }
}

/// `reduce_scatter_tensor`'s kernel flushes subnormal results to zero (built with
/// flush-to-zero, unlike the all_reduce kernel).
#[derive(Default)]
pub struct ReduceScatterFlushesSubnormals;

impl Bug for ReduceScatterFlushesSubnormals {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        if !s.inner.buffer_dtype(x).is_float() {
            return Ok(w);
        }
        Ok(crate::bugs::flushed(s, w))
    }
}

/// Rooted `reduce`'s kernel flushes subnormal results to zero.
#[derive(Default)]
pub struct ReduceFlushesSubnormals;

impl Bug for ReduceFlushesSubnormals {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        Ok(if s.inner.buffer_dtype(x).is_float() { crate::bugs::flushed(s, w) } else { w })
    }
}

/// In-place `all_reduce_` flushes subnormal results to zero (the out-of-place one does not).
#[derive(Default)]
pub struct InPlaceAllReduceFlushesSubnormals;

impl Bug for InPlaceAllReduceFlushesSubnormals {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        Ok(if s.inner.buffer_dtype(x).is_float() { crate::bugs::flushed(s, w) } else { w })
    }
}

/// f16 / bf16 `reduce_scatter_tensor` sum at world size >= 3 rounds the partial sum to the
/// dtype after every rank's add (the all_reduce kernel accumulates wide and rounds once).
#[derive(Default)]
pub struct ReduceScatterHalfRoundedPerStep;

impl Bug for ReduceScatterHalfRoundedPerStep {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        if op != ReduceOp::Sum || !matches!(dtype, DType::F16 | DType::BF16) || s.ws() < 3 {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let g = s.inner.all_gather_into_tensor(x)?;
        let (ws, me, n) = (s.ws(), s.rank(), s.numel(x));
        let round = move |v: f64| Tensor::from_f64(dtype, &[1], &[v]).get_f64(0);
        Ok(s.then(w, move |be, out| {
            let all = be.download(g.wait(BUG_WAIT)?)?;
            let c = n / ws;
            edit(be, out, |t| {
                for i in 0..c {
                    let at = |r: usize| all.get_f64(r * n + me * c + i);
                    let acc = (1..ws).fold(at(0), |acc, r| round(acc + at(r)));
                    set_f64(t, i, acc);
                }
            })
        }))
    }
}

/// A subgroup's `barrier` completes at once (the world's waits for every rank).
#[derive(Default)]
pub struct SubgroupBarrierAtOnce;

impl Bug for SubgroupBarrierAtOnce {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if s.in_subgroup() {
            return Ok(s.done((), "barrier"));
        }
        s.inner.barrier()
    }
}

/// `reduce_scatter_tensor` runs `premul_sum` as `sum` (its kernel has no pre-multiply; the
/// all_reduce one has).
#[derive(Default)]
pub struct ReduceScatterPremulAsSum;

impl Bug for ReduceScatterPremulAsSum {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, if matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op })
    }
}

/// `reduce_scatter_tensor` compares u32 / u64 as signed in min / max (an int32 / int64 kernel).
#[derive(Default)]
pub struct ReduceScatterUnsignedMinMaxAsSigned;

impl Bug for ReduceScatterUnsignedMinMaxAsSigned {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        crate::bugs::unsigned_min_max_as_signed(s, x, op, concord_shm::ShmBackend::reduce_scatter_tensor)
    }
}

/// `all_gather_into_tensor`'s `is_completed()` is true at once, before the peers arrive.
#[derive(Default)]
pub struct CompletesEarlyAllGather;

impl Bug for CompletesEarlyAllGather {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let v = w.peek().clone();
        Ok(s.twisted(w, v, Twist { completed_at_once: true, ..Twist::default() }, |_, _| Ok(())))
    }
}

/// `scatter`'s `is_completed()` is true at once, before the peers arrive.
#[derive(Default)]
pub struct CompletesEarlyScatter;

impl Bug for CompletesEarlyScatter {
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.scatter(x, root)?;
        let v = w.peek().clone();
        Ok(s.twisted(w, v, Twist { completed_at_once: true, ..Twist::default() }, |_, _| Ok(())))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<AllGatherReturnsFlat>(
            "all_gather_returns_flat",
            "shapes",
            "all_gather_into_tensor of a >= 2-D tensor returns the flat [ws * numel] buffer, not [ws * d0, rest..]",
            &["all_gather_into_tensor::out::"],
        ),
        spec::<StagedOncePerAddress>(
            "staged_once_per_address",
            "placement.reuse",
            "in-place all_reduce_ stages each buffer once per (address, dtype, numel): a reused buffer's new contents are ignored",
            &["reuse::persistent_buffer_100_iterations"],
        ),
        spec::<ReduceScatterStagedOnce>(
            "reduce_scatter_staged_once",
            "placement.reuse",
            "reduce_scatter_tensor reads its input from a staging copy made once per (address, dtype, numel)",
            &["reuse::", "reduce_scatter_tensor::out"],
        ),
        spec::<RecvBlocksAtIssue>(
            "recv_blocks_at_issue",
            "p2p.no_deadlock",
            "recv blocks at issue until its message has arrived: irecv; isend on both ranks deadlocks",
            &["p2p::recv_first_both", "p2p::"],
        ),
        spec::<SendQueuedBehindCollectives>(
            "send_queued_behind_collectives",
            "p2p.no_deadlock",
            "one queue for collectives and p2p: a send starts only once the all_reduces issued before it completed",
            &["p2p::send_behind_pending_collective", "p2p::"],
        ),
        spec::<DropDrainsUnwaited>(
            "drop_drains_unwaited",
            "async.unwaited_exit",
            "the communicator's drop waits (up to 5 s) for every all_reduce it issued to be waited",
            &["async::unwaited_collective_exits_within_1s"],
        ),
        spec::<StickyBadInput>(
            "sticky_bad_input",
            "failure.usable_after",
            "after a call refused with bad_input, every later call on the communicator returns that error",
            &["faults::split_sum_overflow", "bad_input::"],
        ),
        spec::<FailureReportedAsPending>(
            "failure_reported_as_pending",
            "failure.no_touch_after_failed_wait",
            "a failure inside the backend (a panic on its progress thread) is reported as a pending op: the wait times out",
            &["faults::panic_in_progress_thread", "faults::"],
        ),
        spec::<Bf16PartialSumsRounded>(
            "bf16_partial_sums_rounded",
            "numerics.round_once",
            "bf16 sum at ws >= 3 rounds the partial sum to bf16 after every rank's add",
            &["numerics::round_once::bf16", "all_reduce::out::bf16::sum"],
        ),
        spec::<SubgroupPremulSumAsSum>(
            "subgroup_premul_sum_as_sum",
            "subgroups.reduce_ops",
            "in a subgroup, premul_sum runs as sum",
            &["subgroup::halves::all_reduce::out::f32::premul_sum", "subgroup::"],
        ),
        spec::<BroadcastViaAllGather>(
            "broadcast_via_all_gather",
            "bad_input.root_agreement",
            "broadcast runs as all_gather + chunk src: roots are never compared, mismatched src accepted",
            &["bad_input::broadcast_src_differs_across_ranks", "broadcast::out"],
        ),
        spec::<ReduceScatterReturnsFlat>(
            "reduce_scatter_returns_flat",
            "shapes",
            "reduce_scatter_tensor of a >= 2-D tensor returns a flat [numel / ws] buffer",
            &["reduce_scatter_tensor::out::"],
        ),
        spec::<ReduceScatterFlushesSubnormals>(
            "reduce_scatter_flushes_subnormals",
            "numerics.subnormal",
            "reduce_scatter_tensor flushes subnormal results to zero (the all_reduce kernel does not)",
            &["numerics::subnormal::reduce_scatter::", "numerics::subnormal::"],
        ),
        spec::<ReduceFlushesSubnormals>(
            "reduce_flushes_subnormals",
            "numerics.subnormal",
            "rooted reduce flushes subnormal results to zero",
            &["numerics::subnormal::reduce::", "numerics::subnormal::"],
        ),
        spec::<InPlaceAllReduceFlushesSubnormals>(
            "inplace_all_reduce_flushes_subnormals",
            "numerics.subnormal",
            "in-place all_reduce_ flushes subnormal results to zero",
            &["numerics::subnormal::all_reduce_inplace::", "numerics::subnormal::"],
        ),
        spec::<ReduceScatterHalfRoundedPerStep>(
            "reduce_scatter_half_rounded_per_step",
            "numerics.round_once",
            "f16 / bf16 reduce_scatter sum at ws >= 3 rounds the partial sum after every rank's add",
            &["numerics::round_once::reduce_scatter::", "numerics::round_once::"],
        ),
        spec::<SubgroupBarrierAtOnce>(
            "subgroup_barrier_at_once",
            "barrier",
            "a subgroup's barrier completes at once, without the members",
            &["async::barrier_synchronises::subgroup", "subgroup::"],
        ),
        spec::<ReduceScatterPremulAsSum>(
            "reduce_scatter_premul_as_sum",
            "numerics.premul_sum",
            "reduce_scatter_tensor runs premul_sum as sum",
            &["reduce_scatter_tensor::out::f32::premul_sum", "premul_sum"],
        ),
        spec::<ReduceScatterUnsignedMinMaxAsSigned>(
            "reduce_scatter_unsigned_min_max_as_signed",
            "values.reduce",
            "reduce_scatter_tensor compares u32 / u64 as signed in min / max",
            &["reduce_scatter_tensor::out::u32::max", "reduce_scatter_tensor::out::u"],
        ),
        spec::<CompletesEarlyAllGather>(
            "completes_early_all_gather",
            "async.every_op_every_rank",
            "all_gather_into_tensor's is_completed() is true before the peers arrive",
            &["async::pending_until_peers_arrive::all_gather", "async::"],
        ),
        spec::<CompletesEarlyScatter>(
            "completes_early_scatter",
            "async.every_op_every_rank",
            "scatter's is_completed() is true before the peers arrive",
            &["async::pending_until_peers_arrive::scatter", "async::"],
        ),
        spec::<ProgressEndsAtIssue>(
            "progress_ends_at_issue",
            "progress.recorded",
            "collectives leave the in-flight record (concord_core::progress) when issue returns, not when they complete",
            &["async::peer_never_joins_op_recorded_in_flight"],
        ),
    ]
}
