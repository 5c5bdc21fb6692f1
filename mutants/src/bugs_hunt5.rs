//! The fifth outside hunt: what the earlier hunts left alone. Views through the dtypes and reduce
//! ops the views suite does not reach; a registration cache keyed by address (realloc) on the
//! rooted reduce; declared capabilities (NaN policy, integer avg) on the calls the probes do not
//! look at; a subgroup barrier that does not wait; in-flight reporting for one op only; world
//! size 1's shortcut; the sparse world sizes in a dtype their slice does not run; a buffer reused
//! after a failed op. Each is a bug a backend author could ship, over the correct shm backend.

use crate::bugs_hunt2::{int_at, set_int};
use crate::campaign::Spec;
use crate::lock;
use crate::{edit, Buf, Bug, Shm};
use concord_core::{progress, Backend, Completion, OutstandingCounter, ReduceOp, Result, Tensor, Work};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A view of `x`'s parent at offset 0 with `x`'s shape, if `x` is a view at a non-zero offset:
/// what a kernel that takes the parent's base pointer (not the view's) reads.
fn parent_start(s: &Shm, x: &Buf) -> Result<Option<Buf>> {
    match s.view_of(x) {
        Some((parent, off)) if off > 0 => Ok(Some(s.inner.view(&parent, 0, &s.inner.buffer_shape(x))?)),
        _ => Ok(None),
    }
}

// ---------------------------------------------------------------- views

/// The byte-copy path of all_gather (1-byte dtypes, no element conversion) takes the input's
/// allocation, not the view: an i8 / u8 input view is read from its parent's start.
#[derive(Default)]
pub struct ByteGatherViewOffsetDropped;

impl ByteGatherViewOffsetDropped {
    fn input(&self, s: &Shm, x: &Buf) -> Result<Buf> {
        if s.inner.buffer_dtype(x).size() != 1 {
            return Ok(x.clone());
        }
        Ok(parent_start(s, x)?.unwrap_or_else(|| x.clone()))
    }
}

impl Bug for ByteGatherViewOffsetDropped {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor(&self.input(s, x)?)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor_out(&self.input(s, x)?, out)
    }
}

/// The min / max kernel of the out-of-place all_reduce (a separate path from sum's) reads a view
/// input from its parent's start.
#[derive(Default)]
pub struct MinMaxViewReadsParentStart;

impl Bug for MinMaxViewReadsParentStart {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !matches!(op, ReduceOp::Min | ReduceOp::Max) {
            return s.inner.all_reduce(x, op);
        }
        match parent_start(s, x)? {
            Some(v) => s.inner.all_reduce(&v, op),
            None => s.inner.all_reduce(x, op),
        }
    }
}

// ---------------------------------------------------------------- realloc

/// The rooted reduce registers its input by address once, with its size then: a buffer freed
/// and re-allocated larger at the same address is reduced over the registered bytes only (the
/// root's tail keeps its own input).
#[derive(Default)]
pub struct ReduceSizeCachedByAddr {
    registered: Mutex<HashMap<usize, usize>>,
}

impl Bug for ReduceSizeCachedByAddr {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        let cached = *lock(&self.registered).entry(s.inner.buffer_addr(x)).or_insert(bytes);
        if cached >= bytes || s.rank() != root {
            return s.inner.reduce(x, op, root);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.reduce(x, op, root)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let n = t.bytes().len().min(mine.bytes().len());
                if cached < n {
                    t.bytes_mut()[cached..n].copy_from_slice(&mine.bytes()[cached..n]);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- declared capabilities

/// The coalesced all_reduce's min / max kernel starts from the op's identity and keeps `x` only
/// if `x < acc` (`x > acc`): NaN never wins, while the backend declares `NanPolicy::Propagate`
/// (and its single-tensor calls propagate).
#[derive(Default)]
pub struct CoalescedMinMaxDropsNan;

/// `t` with every NaN replaced by `op`'s identity (`+inf` for min, `-inf` for max).
fn nan_to_identity(t: &Tensor, op: ReduceOp) -> Option<Tensor> {
    if !t.dtype().is_float() || !(0..t.numel()).any(|i| t.get_f64(i).is_nan()) {
        return None;
    }
    let id = if op == ReduceOp::Min { f64::INFINITY } else { f64::NEG_INFINITY };
    let mut u = t.clone();
    for i in 0..t.numel() {
        if t.get_f64(i).is_nan() {
            crate::set_f64(&mut u, i, id);
        }
    }
    Some(u)
}

impl Bug for CoalescedMinMaxDropsNan {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if !matches!(op, ReduceOp::Min | ReduceOp::Max) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        let mut ins = Vec::with_capacity(xs.len());
        for x in xs {
            match nan_to_identity(&s.inner.download(x)?, op) {
                Some(u) => ins.push(s.inner.upload(&u)?),
                None => ins.push(x.clone()),
            }
        }
        s.inner.all_reduce_coalesced(&ins, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if matches!(op, ReduceOp::Min | ReduceOp::Max) {
            for x in xs {
                if let Some(u) = nan_to_identity(&s.inner.download(x)?, op) {
                    s.inner.write(x, &u)?;
                }
            }
        }
        s.inner.all_reduce_coalesced_(xs, op)
    }
}

/// The rooted reduce's signed-integer `avg` divides the sum at the root with a floor division
/// (toward -inf) while the backend declares `IntAvg::Truncate` (and its all_reduce truncates).
#[derive(Default)]
pub struct ReduceIntAvgFloors;

impl Bug for ReduceIntAvgFloors {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        if op != ReduceOp::Avg || !s.inner.buffer_dtype(x).is_signed_int() {
            return s.inner.reduce(x, op, root);
        }
        let ws = s.ws() as i128;
        let w = s.inner.reduce(x, ReduceOp::Sum, root)?;
        if s.rank() != root {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = int_at(t, i);
                    set_int(t, i, v.div_euclid(ws));
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- barrier, progress

/// A subgroup's barrier is a fan-in to the group's last member, which counts its own arrival as
/// the release: on that member the barrier completes at once, before the others arrive (the
/// world barrier is right).
#[derive(Default)]
pub struct GroupBarrierLastMemberEarly;

impl Bug for GroupBarrierLastMemberEarly {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if !s.in_subgroup() || s.rank() + 1 != s.ws() {
            return s.inner.barrier();
        }
        // Still posted for the peers (a dropped work runs on), but not waited here.
        drop(s.inner.barrier()?);
        Ok(s.done((), "barrier"))
    }
}

/// The in-flight record (`concord_core::progress`) is kept by the all_reduce path only: every
/// other op is taken off it as soon as it is issued, so a rank hung in a broadcast reports
/// itself idle.
#[derive(Default)]
pub struct ProgressRecordsAllReduceOnly;

/// `issue`, with whatever it added to the in-flight record taken off again at once.
pub(crate) fn unrecorded<T>(issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
    let before: HashSet<(String, u64)> = progress::in_flight().into_iter().map(|f| (f.backend, f.seq)).collect();
    let w = issue()?;
    for f in progress::in_flight() {
        if !before.contains(&(f.backend.clone(), f.seq)) {
            progress::end(&f.backend, f.seq);
        }
    }
    Ok(w)
}

impl Bug for ProgressRecordsAllReduceOnly {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.all_gather_into_tensor_out(x, out))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.broadcast_(x, src))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        unrecorded(|| s.inner.scatter(x, root))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        unrecorded(|| s.inner.barrier())
    }
}

// ---------------------------------------------------------------- world sizes

/// At world size 1 the all_reduce is a copy (nothing to reduce): `premul_sum`'s factor is never
/// applied.
#[derive(Default)]
pub struct Ws1PremulSumUnscaled;

impl Ws1PremulSumUnscaled {
    fn op(s: &Shm, op: ReduceOp) -> ReduceOp {
        match op {
            ReduceOp::PremulSum(_) if s.ws() == 1 => ReduceOp::Sum,
            op => op,
        }
    }
}

impl Bug for Ws1PremulSumUnscaled {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(s, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(s, op))
    }
}

/// Worlds of 6 and 7 ranks (not a power of two, above the ring's 5) fold their excess ranks
/// (4 and up) into the first four with a pre-step written for 4-byte elements: an 8-byte
/// (f64 / i64 / u64) all_reduce sum / avg leaves their contributions out.
#[derive(Default)]
pub struct SparseWsWideDropsExcessRanks;

impl Bug for SparseWsWideDropsExcessRanks {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        if !matches!(s.ws(), 6 | 7) || dtype.size() != 8 || !matches!(op, ReduceOp::Sum | ReduceOp::Avg) || s.rank() < 4 {
            return s.inner.all_reduce(x, op);
        }
        let shape = s.inner.buffer_shape(x);
        let z = s.inner.upload(&Tensor::zeros(dtype, &shape))?;
        s.inner.all_reduce(&z, op)
    }
}

// ---------------------------------------------------------------- history

/// A completion relaying an all_reduce that records its buffer's address when it fails.
struct NoteFailure {
    inner: Work<Buf>,
    addr: usize,
    failed: Arc<Mutex<HashSet<usize>>>,
}

impl Completion for NoteFailure {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |_| {
            lock(&self.failed).insert(self.addr);
        })
    }
}

/// A buffer whose all_reduce failed (at issue or at its wait) stays marked busy in the
/// registration cache: the next in-place all_reduce_ on it reduces into a staging copy that is
/// never copied back (the buffer keeps its input; peers get the right result).
#[derive(Default)]
pub struct InPlaceAfterFailureNotWritten {
    failed: Arc<Mutex<HashSet<usize>>>,
    hidden: OutstandingCounter,
}

impl InPlaceAfterFailureNotWritten {
    fn noted(&self, s: &Shm, x: &Buf, issued: Result<Work<Buf>>) -> Result<Work<Buf>> {
        let addr = s.inner.buffer_addr(x);
        match issued {
            Err(e) => {
                lock(&self.failed).insert(addr);
                Err(e)
            }
            Ok(w) => {
                let (v, meta) = (w.peek().clone(), w.meta().clone());
                Ok(Work::new(v, Arc::new(NoteFailure { inner: w, addr, failed: self.failed.clone() }), meta, &self.hidden))
            }
        }
    }
}

impl Bug for InPlaceAfterFailureNotWritten {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.noted(s, x, s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if lock(&self.failed).remove(&s.inner.buffer_addr(x)) {
            let w = s.inner.all_reduce(x, op)?;
            return Ok(s.then_as(w, x.clone(), |_, _| Ok(())));
        }
        self.noted(s, x, s.inner.all_reduce_(x, op))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<ByteGatherViewOffsetDropped>(
            "byte_gather_view_offset_dropped",
            "views",
            "all_gather's byte-copy path (i8 / u8) reads an input view from its parent's start",
            &["programs::p2::ws2"],
        ),
        spec::<MinMaxViewReadsParentStart>(
            "minmax_view_reads_parent_start",
            "views",
            "the out-of-place all_reduce's min / max kernel reads an input view from its parent's start",
            &["programs::p0::ws1"],
        ),
        spec::<ReduceSizeCachedByAddr>(
            "reduce_size_cached_by_addr",
            "placement.realloc",
            "the rooted reduce registers its input by address with its first size: a buffer re-allocated larger there is reduced over the old bytes only",
            &["reduce::out::f16::premul_sum::ws1"],
        ),
        spec::<CoalescedMinMaxDropsNan>(
            "coalesced_minmax_drops_nan",
            "values.coalesced",
            "the coalesced all_reduce's min / max never lets NaN win (identity start, strict compare) while the backend declares Propagate",
            &["programs::p3::ws2"],
        ),
        spec::<ReduceIntAvgFloors>(
            "reduce_int_avg_floors",
            "values.reduce",
            "signed-integer rooted reduce avg rounds toward -inf while the backend declares Truncate",
            &["reduce::out::i8::avg::ws2"],
        ),
        spec::<GroupBarrierLastMemberEarly>(
            "group_barrier_last_member_early",
            "barrier",
            "a subgroup's barrier completes at once on the group's last member, before the others arrive",
            &["async::barrier_synchronises::subgroup::ws3"],
        ),
        spec::<ProgressRecordsAllReduceOnly>(
            "progress_records_all_reduce_only",
            "progress.recorded",
            "only all_reduce is recorded in flight: a rank hung in any other op reports itself idle",
            &["async::peer_never_joins_op_recorded_in_flight::broadcast::ws2", "async::peer_never_joins_op_recorded_in_flight::barrier::ws2"],
        ),
        spec::<Ws1PremulSumUnscaled>(
            "ws1_premul_sum_unscaled",
            "numerics.premul_sum",
            "at world size 1 the all_reduce is a copy: premul_sum's factor is never applied",
            &["all_reduce::out::f16::premul_sum::ws1"],
        ),
        spec::<SparseWsWideDropsExcessRanks>(
            "sparse_ws_wide_drops_excess_ranks",
            "values.world_sizes",
            "at world sizes 6 and 7 an 8-byte all_reduce sum / avg leaves out ranks 4 and up",
            &["all_reduce::out::f64::sum::ws6", "all_reduce::out::f64::sum::ws7"],
        ),
        spec::<InPlaceAfterFailureNotWritten>(
            "inplace_after_failure_not_written",
            "failure.usable_after",
            "after an all_reduce on a buffer fails, the next in-place all_reduce_ on that buffer is never copied back",
            &["bad_input::refused_buffer_reused_in_place::ws2"],
        ),
    ]
}
