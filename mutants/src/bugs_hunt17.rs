//! The seventeenth hunt: state that goes wrong only with time. Every earlier mutant is wrong on
//! the first call of a shape; these keep state over a communicator's life (or a process's) and
//! go wrong only once it has accumulated: a slot index or tag kept in a `u8` that wraps, a pool that leaks a slot per failed or abandoned op, a
//! staging pool shared by two ops in flight once it is full, a cache keyed by address and size,
//! a view's offset cached by its parent, a plan cached without its reduce op or its dtype, and a subgroup's
//! channel inherited by the next group of the same members. Each is a bug a backend author could
//! ship, over the correct shm backend; a mutant keeps its counters in its bug (one per
//! communicator) or, for what outlives a communicator, in a process-wide table.

use crate::campaign::Spec;
use crate::{lock, Buf, Bug, Mutant, Shm};
use concord_core::fused::Gathered;
use concord_core::{Backend, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A snapshot of a buffer's contents, by (dtype, element count).
type Snap = (DType, usize, Tensor);

/// `t` if it has `dtype` and `numel` elements.
fn fits(snap: &Option<Snap>, dtype: DType, numel: usize) -> Option<Tensor> {
    snap.as_ref().filter(|(d, n, _)| *d == dtype && *n == numel && numel > 0).map(|(_, _, t)| t.clone())
}

/// Slots of [`RecvTagU8`]'s mailbox per peer (a `u8` tag tells 256 apart).
const RING: usize = 256;

// ---------------------------------------------------------------- a u8 tag per pair (recv)

/// The receiver matches a message by a per-peer tag kept in a `u8`: its mailbox slot for tag
/// `k as u8` still holds message `k - 256` from that peer, and from the 257th receive from one
/// peer on, a receive whose tag slot holds an old message of the same dtype and element count
/// takes it (the wrapped tag matched) instead of the new one.
#[derive(Default)]
pub struct RecvTagU8 {
    mailbox: Arc<Mutex<HashMap<usize, Slots>>>,
}

/// One peer's receives so far and its mailbox slots (by tag).
type Slots = (usize, Vec<Option<Snap>>);

impl Bug for RecvTagU8 {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        let k = {
            let mut mb = lock(&self.mailbox);
            let e = mb.entry(src).or_insert_with(|| (0, vec![None; RING]));
            e.0 += 1;
            e.0 - 1
        };
        let mailbox = self.mailbox.clone();
        Ok(s.then(w, move |be, r| {
            let (dtype, numel) = (be.buffer_dtype(r), be.buffer_shape(r).iter().product::<usize>());
            let now = be.download(r)?;
            let mut mb = lock(&mailbox);
            let slots = &mut mb.get_mut(&src).expect("entered at issue").1;
            let stale = if k >= RING { fits(&slots[k % RING], dtype, numel) } else { None };
            slots[k % RING] = Some((dtype, numel, now));
            drop(mb);
            match stale {
                Some(t) => be.write(r, &t),
                None => Ok(()),
            }
        }))
    }
}

// ---------------------------------------------------------------- gates on every op

/// A work whose completion a gate watches: whether it was waited to an end, and its failure.
struct Watched<T> {
    inner: Work<T>,
    ended: AtomicBool,
    /// Called once when a wait returns the op's failure (not a timeout).
    on_fail: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Called when the work is dropped before any wait ended it.
    on_abandon: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl<T: Send + Sync> Completion for Watched<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = crate::relay_wait(&self.inner, timeout, |_| {
            if !self.ended.swap(true, Ordering::SeqCst) {
                if let Some(f) = &self.on_fail {
                    f();
                }
            }
        });
        if let Ok(true) = r {
            self.ended.store(true, Ordering::SeqCst);
        }
        r
    }
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        if !self.ended.load(Ordering::SeqCst) {
            if let Some(f) = &self.on_abandon {
                f();
            }
        }
    }
}

/// Every op of the trait but the fused ones, each through `self.$gate(s, name, || issue)`.
macro_rules! gate_every_op {
    ($gate:ident) => {
        fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.$gate(s, "all_reduce", || s.inner.all_reduce(x, op))
        }
        fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.$gate(s, "all_reduce_", || s.inner.all_reduce_(x, op))
        }
        fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
            self.$gate(s, "all_reduce_coalesced", || s.inner.all_reduce_coalesced(xs, op))
        }
        fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
            self.$gate(s, "all_reduce_coalesced_", || s.inner.all_reduce_coalesced_(xs, op))
        }
        fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
            self.$gate(s, "all_gather_into_tensor", || s.inner.all_gather_into_tensor(x))
        }
        fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
            self.$gate(s, "all_gather_into_tensor_out", || s.inner.all_gather_into_tensor_out(x, out))
        }
        fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
            self.$gate(s, "all_gather_into_tensor_coalesced", || s.inner.all_gather_into_tensor_coalesced(xs))
        }
        fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.$gate(s, "reduce_scatter_tensor", || s.inner.reduce_scatter_tensor(x, op))
        }
        fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
            self.$gate(s, "reduce_scatter_tensor_out", || s.inner.reduce_scatter_tensor_out(x, op, out))
        }
        fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
            self.$gate(s, "reduce_scatter_tensor_coalesced", || s.inner.reduce_scatter_tensor_coalesced(xs, op))
        }
        fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
            self.$gate(s, "all_to_all_single", || s.inner.all_to_all_single(x, o, i))
        }
        fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
            self.$gate(s, "broadcast", || s.inner.broadcast(x, src))
        }
        fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
            self.$gate(s, "broadcast_", || s.inner.broadcast_(x, src))
        }
        fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
            self.$gate(s, "permute_tensor", || s.inner.permute_tensor(x, src_dst))
        }
        fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
            self.$gate(s, "reduce", || s.inner.reduce(x, op, root))
        }
        fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
            self.$gate(s, "gather", || s.inner.gather(x, root))
        }
        fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
            self.$gate(s, "scatter", || s.inner.scatter(x, root))
        }
        fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
            self.$gate(s, "send", || s.inner.send(x, dst))
        }
        fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
            self.$gate(s, "recv", || s.inner.recv(out, src))
        }
        fn barrier(&self, s: &Shm) -> Result<Work<()>> {
            self.$gate(s, "barrier", || s.inner.barrier())
        }
        // The fused ops take shm's own path (not the decomposition over the gated ops): a
        // decomposition's `counted_again` on a gated work would count it on the wrapper's
        // unreported counter, a wrapper artefact, not this bug.
        fn fused_all_gather_matmul(
            &self,
            m: &Mutant,
            a: &Buf,
            bs: &[Buf],
            dim: usize,
            sc: Option<&Scaling>,
        ) -> Result<Work<Gathered<Buf>>> {
            match sc {
                None => m.s.inner.fused_all_gather_matmul(a, bs, dim),
                Some(sc) => m.s.inner.fused_all_gather_scaled_matmul(a, bs, dim, sc),
            }
        }
        fn fused_matmul_reduce_scatter(
            &self,
            m: &Mutant,
            a: &Buf,
            b: &Buf,
            op: ReduceOp,
            dim: usize,
            sc: Option<&Scaling>,
        ) -> Result<Work<Buf>> {
            match sc {
                None => m.s.inner.fused_matmul_reduce_scatter(a, b, op, dim),
                Some(sc) => m.s.inner.fused_scaled_matmul_reduce_scatter(a, b, op, dim, sc),
            }
        }
        fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
            match op {
                None => m.s.inner.low_contention_all_gather(x),
                Some(op) => m.s.inner.low_contention_reduce_scatter(x, op),
            }
        }
    };
}

// ---------------------------------------------------------------- a slot leaked per failed op

/// Op slots of [`FailedOpLeaksSlot`]'s pool.
const FAIL_SLOTS: usize = 64;

/// Each op takes a slot of a pool of 64 for its descriptors and gives it back on completion; an
/// op whose wait returns a failure (bad input found across ranks, a peer's error) never gives
/// it back. After 64 failed ops on a communicator every op is refused at issue ("no free op
/// slot"): a communicator that survived its bad inputs one at a time dies of their sum.
#[derive(Default)]
pub struct FailedOpLeaksSlot {
    leaked: Arc<AtomicUsize>,
    shadow: OutstandingCounter,
}

impl FailedOpLeaksSlot {
    fn slot<T: Clone + Send + Sync + 'static>(&self, s: &Shm, op: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let leaked = self.leaked.load(Ordering::SeqCst);
        if leaked >= FAIL_SLOTS {
            return Err(CollectiveError::Backend(format!("{op} on rank {}: no free op slot ({leaked} of {FAIL_SLOTS} in use)", s.rank())));
        }
        let w = issue()?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let l = self.leaked.clone();
        let on_fail: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            l.fetch_add(1, Ordering::SeqCst);
        });
        let watched = Watched { inner: w, ended: AtomicBool::new(false), on_fail: Some(on_fail), on_abandon: None };
        Ok(Work::new(value, Arc::new(watched), meta, &self.shadow))
    }
}

impl Bug for FailedOpLeaksSlot {
    gate_every_op!(slot);
}

// ---------------------------------------------------------------- a slot leaked per abandoned op

/// Op slots of [`AbandonedOpLeaksSlot`]'s pool.
const WORK_SLOTS: usize = 32;

/// Each op's work record takes a slot of a pool of 32, given back when a wait ends the op; a
/// work dropped without a wait that ended it (never waited, or given up after a timeout) keeps
/// its slot for good. `outstanding()` stays right (the work is gone), but after 32 abandoned
/// works on a communicator every op is refused at issue ("work table full").
#[derive(Default)]
pub struct AbandonedOpLeaksSlot {
    leaked: Arc<AtomicUsize>,
    shadow: OutstandingCounter,
}

impl AbandonedOpLeaksSlot {
    fn slot<T: Clone + Send + Sync + 'static>(&self, s: &Shm, op: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let leaked = self.leaked.load(Ordering::SeqCst);
        if leaked >= WORK_SLOTS {
            return Err(CollectiveError::Backend(format!(
                "{op} on rank {}: work table full ({leaked} of {WORK_SLOTS} slots held by dropped works)",
                s.rank()
            )));
        }
        let w = issue()?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let l = self.leaked.clone();
        let on_abandon: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            l.fetch_add(1, Ordering::SeqCst);
        });
        let watched = Watched { inner: w, ended: AtomicBool::new(false), on_fail: None, on_abandon: Some(on_abandon) };
        Ok(Work::new(value, Arc::new(watched), meta, &self.shadow))
    }
}

impl Bug for AbandonedOpLeaksSlot {
    gate_every_op!(slot);
}

// ---------------------------------------------------------------- staging shared once the pool is full

/// Staging buffers of [`StagingSharedWhenFull`]'s pool.
const STAGING: usize = 8;

/// Out-of-place all_reduces stage through a pool of 8 buffers; while 8 are in flight (issued,
/// not yet waited) the next one is handed the staging of the op `8` before it (the free list's
/// head wraps onto a busy slot), and its result is that op's result.
#[derive(Default)]
pub struct StagingSharedWhenFull {
    /// Ops in flight: (issue number, result buffer, still in flight).
    in_flight: Mutex<Vec<(usize, Buf, Arc<AtomicBool>)>>,
    issued: AtomicUsize,
    shadow: OutstandingCounter,
}

impl Bug for StagingSharedWhenFull {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let k = self.issued.fetch_add(1, Ordering::SeqCst);
        let busy = Arc::new(AtomicBool::new(true));
        let shared = {
            let mut fl = lock(&self.in_flight);
            fl.retain(|(_, _, b)| b.load(Ordering::SeqCst));
            let shared =
                if fl.len() >= STAGING { fl.iter().find(|(j, _, _)| j % STAGING == k % STAGING).map(|(_, b, _)| b.clone()) } else { None };
            fl.push((k, w.peek().clone(), busy.clone()));
            shared
        };
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let w = match shared {
            None => w,
            // The staging holds the other op's bytes: as many as both results hold.
            Some(other) => s.then(w, move |be, r| {
                let theirs = be.download(&other)?;
                crate::edit(be, r, |t| {
                    let n = t.len_bytes().min(theirs.len_bytes());
                    crate::copy_bytes(t, 0, &theirs, 0, n)
                })
            }),
        };
        Ok(Work::new(value, Arc::new(Freed { inner: w, busy }), meta, &self.shadow))
    }
}

/// An all_reduce that frees its staging slot once a wait ended it (or its work is dropped).
struct Freed {
    inner: Work<Buf>,
    busy: Arc<AtomicBool>,
}

impl Completion for Freed {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = crate::relay_wait(&self.inner, timeout, |_| self.busy.store(false, Ordering::SeqCst));
        if let Ok(true) = r {
            self.busy.store(false, Ordering::SeqCst);
        }
        r
    }
}

impl Drop for Freed {
    fn drop(&mut self) {
        self.busy.store(false, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------- a reduce plan keyed by (address, bytes)

/// `reduce` keeps a registration per input buffer keyed by (address, bytes), holding the dtype
/// it was registered with; a buffer freed and another allocated at the same address with the
/// same byte size but another dtype hits the old registration and is reduced as the old dtype
/// (bytes reinterpreted), e.g. i32 summed as f32.
#[derive(Default)]
pub struct ReduceRegByAddr {
    reg: Mutex<HashMap<(usize, usize), DType>>,
}

impl Bug for ReduceRegByAddr {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let (dtype, shape) = (be.buffer_dtype(x), be.buffer_shape(x));
        let bytes = s.numel(x) * dtype.size();
        let key = (be.buffer_addr(x), bytes);
        let old = *lock(&self.reg).entry(key).or_insert(dtype);
        if old == dtype || old.size() != dtype.size() || bytes == 0 || matches!(op, ReduceOp::PremulSum(_)) {
            return be.reduce(x, op, root);
        }
        // Reduced as the registered dtype: the same bytes, read as `old`.
        let as_old = be.upload(&Tensor::from_bytes(old, &[bytes / old.size()], be.download(x)?.bytes()))?;
        let w = be.reduce(&as_old, op, root)?;
        let out = be.alloc(dtype, &shape)?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| be.write(&o, &Tensor::from_bytes(dtype, &shape, be.download(r)?.bytes()))))
    }
}

// ---------------------------------------------------------------- a view's offset cached by its parent

/// All_reduce (out of place) keeps a chunk table per input keyed by (parent allocation, element
/// count), holding the element offset first seen: a later view of the same parent with the same
/// count at another offset reads at the first view's offset.
#[derive(Default)]
pub struct ViewOffsetByParent {
    table: Mutex<HashMap<(usize, usize, DType), usize>>,
}

impl Bug for ViewOffsetByParent {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let Some((parent, off)) = s.view_of(x) else { return s.inner.all_reduce(x, op) };
        let be = &*s.inner;
        let (numel, dtype) = (s.numel(x), be.buffer_dtype(x));
        let key = (be.buffer_addr(&parent), numel, dtype);
        let first = *lock(&self.table).entry(key).or_insert(off);
        if first == off || numel == 0 || first + numel > s.numel(&parent) {
            return be.all_reduce(x, op);
        }
        be.all_reduce(&be.view(&parent, first, &be.buffer_shape(x))?, op)
    }
}

// ---------------------------------------------------------------- a plan cached without its reduce op

/// All_reduce (out of place) caches its plan per (dtype, element count) and the plan holds the
/// reduce op it was built for: a later all_reduce of the same dtype and count with another
/// reduce op runs the first one's.
#[derive(Default)]
pub struct PlanIgnoresReduceOp {
    plans: Mutex<HashMap<(DType, usize), ReduceOp>>,
}

impl Bug for PlanIgnoresReduceOp {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.numel(x));
        let planned = lock(&self.plans).get(&key).copied();
        match planned {
            // A premul factor is data, not the plan.
            Some(p) if !matches!(p, ReduceOp::PremulSum(_)) && !matches!(op, ReduceOp::PremulSum(_)) => s.inner.all_reduce(x, p),
            _ => {
                let w = s.inner.all_reduce(x, op)?;
                lock(&self.plans).entry(key).or_insert(op);
                Ok(w)
            }
        }
    }
}

// ---------------------------------------------------------------- a plan cached without its dtype

/// Reduce_scatter_tensor (out of place) caches its plan per (element count, element size) and
/// the plan holds the dtype it was built for: a later reduce_scatter of the same count in another
/// dtype of the same width (i32 after f32, bf16 after f16) reduces its bytes as the first dtype.
#[derive(Default)]
pub struct RsPlanIgnoresDtype {
    plans: Mutex<HashMap<(usize, usize), DType>>,
}

impl Bug for RsPlanIgnoresDtype {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let (dtype, shape, numel) = (be.buffer_dtype(x), be.buffer_shape(x), s.numel(x));
        let planned = lock(&self.plans).get(&(numel, dtype.size())).copied();
        let Some(old) = planned.filter(|&d| d != dtype && numel > 0 && !shape.is_empty() && op.defined_for(d)) else {
            let w = be.reduce_scatter_tensor(x, op)?;
            lock(&self.plans).entry((numel, dtype.size())).or_insert(dtype);
            return Ok(w);
        };
        // The same bytes, reduced as the planned dtype, handed back as the caller's.
        let mut as_old_shape = shape.clone();
        let row: usize = shape.iter().skip(1).product();
        as_old_shape.truncate(1);
        as_old_shape.push(row);
        let as_old = be.upload(&Tensor::from_bytes(old, &as_old_shape, be.download(x)?.bytes()))?;
        let w = be.reduce_scatter_tensor(&as_old, op)?;
        let mut out_shape = shape;
        if let Some(d0) = out_shape.first_mut() {
            *d0 /= s.ws();
        }
        let out = be.alloc(dtype, &out_shape)?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, r| be.write(&o, &Tensor::from_bytes(dtype, &out_shape, be.download(r)?.bytes()))))
    }
}

// ---------------------------------------------------------------- work ids in a u8 bitmap

/// Work ids [`WorkIdU8`] tells apart (a `u8`).
const IDS: usize = 256;

/// The work registry gives each op the id `seq as u8` and keeps the ids in flight in a bitmap:
/// `outstanding()` counts set bits. An op held un-waited while 256 later ops run shares its id
/// with the 256th: while both are in flight they count once, and once the later one is waited
/// the bit is clear and the held op is not counted at all.
#[derive(Default)]
pub struct WorkIdU8 {
    ids: Arc<Mutex<Ids>>,
    shadow: OutstandingCounter,
}

/// The registry: the next op number, the id of every op in flight, the bitmap of ids.
#[derive(Default)]
struct Ids {
    next: usize,
    in_flight: HashMap<usize, usize>,
    bits: std::collections::HashSet<usize>,
}

impl WorkIdU8 {
    fn id<T: Clone + Send + Sync + 'static>(&self, _s: &Shm, _op: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let w = issue()?;
        let k = {
            let mut ids = lock(&self.ids);
            let k = ids.next;
            ids.next += 1;
            ids.in_flight.insert(k, k % IDS);
            ids.bits.insert(k % IDS);
            k
        };
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let ids = self.ids.clone();
        let clear: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            // This op leaves the registry and its id's bit is cleared, whoever else holds it.
            let mut ids = lock(&ids);
            if let Some(id) = ids.in_flight.remove(&k) {
                ids.bits.remove(&id);
            }
        });
        let watched = Watched { inner: w, ended: AtomicBool::new(false), on_fail: Some(clear.clone()), on_abandon: Some(clear.clone()) };
        Ok(Work::new(value, Arc::new(Cleared { inner: watched, clear }), meta, &self.shadow))
    }
}

/// A watched work whose id is cleared once a wait completed it.
struct Cleared<T> {
    inner: Watched<T>,
    clear: Arc<dyn Fn() + Send + Sync>,
}

impl<T: Send + Sync> Completion for Cleared<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = self.inner.wait_for(timeout);
        if let Ok(true) = r {
            (self.clear)();
        }
        r
    }
}

impl Bug for WorkIdU8 {
    gate_every_op!(id);
    fn outstanding(&self, s: &Shm) -> usize {
        // The correct count, with this registry's works counted by their set bits.
        let ids = lock(&self.ids);
        (s.inner.outstanding() + s.own.get()).saturating_sub(ids.in_flight.len()) + ids.bits.len()
    }
}

// ---------------------------------------------------------------- a warm path's static output

/// Calls of one (dtype, count) after which [`WarmStaticOutput`] takes its captured path.
const WARM_UP: usize = 64;

/// After 64 out-of-place all_reduces of one (dtype, element count) the communicator captures the
/// call (a CUDA-graph-like replay) and from then on returns the capture's static output buffer,
/// rewritten by each call: every result past the warm-up is the same buffer, and a result kept
/// by the caller changes under it at the next call.
#[derive(Default)]
pub struct WarmStaticOutput {
    calls: Mutex<HashMap<(DType, usize), Warm>>,
}

/// Calls so far of one (dtype, count) and the captured output once warm.
type Warm = (usize, Option<Buf>);

impl Bug for WarmStaticOutput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let (dtype, numel) = (be.buffer_dtype(x), s.numel(x));
        let w = be.all_reduce(x, op)?;
        let fixed = {
            let mut calls = lock(&self.calls);
            let e = calls.entry((dtype, numel)).or_insert((0, None));
            e.0 += 1;
            if e.0 <= WARM_UP || numel == 0 {
                return Ok(w);
            }
            match &e.1 {
                Some(b) if be.buffer_shape(b) == be.buffer_shape(w.peek()) => b.clone(),
                _ => {
                    let b = be.alloc(dtype, &be.buffer_shape(w.peek()))?;
                    e.1 = Some(b.clone());
                    b
                }
            }
        };
        let o = fixed.clone();
        Ok(s.then_as(w, fixed, move |be, r| be.write(&o, &be.download(r)?)))
    }
}

// ---------------------------------------------------------------- a group's channel inherited by the next

/// What a subgroup's channel keeps per member list (world ranks, in group order): the results of
/// its all_reduces, by op number, and whether the communicator that owns it is alive.
#[derive(Default)]
struct Channel {
    results: Vec<Option<Snap>>,
    /// The owner's id (a process-wide count of channels opened), `None` once it is dropped.
    owner: Option<usize>,
    /// The results of the previous owner, read as fresh by the next (ready flags left set).
    stale: Vec<Option<Snap>>,
}

/// Channels by member list, process-wide (they outlive the communicators).
fn channels() -> &'static Mutex<HashMap<Vec<usize>, Channel>> {
    static CH: OnceLock<Mutex<HashMap<Vec<usize>, Channel>>> = OnceLock::new();
    CH.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Results a channel keeps.
const CHANNEL_OPS: usize = 64;

/// A subgroup's shared-memory channel is named by its member list and is not unlinked when the
/// group is destroyed: the next group of the same members reopens it with the old group's
/// ready flags still set, and its `k`-th all_reduce (out of place or in place) returns the old
/// group's `k`-th result whenever the two had the same dtype and element count.
#[derive(Default)]
pub struct GroupChannelReused {
    /// (channel key, this communicator's owner id), set at its first all_reduce.
    me: OnceLock<(Vec<usize>, usize)>,
    ops: AtomicUsize,
}

static OWNERS: AtomicUsize = AtomicUsize::new(0);

impl GroupChannelReused {
    fn run(&self, s: &Shm, w: Work<Buf>) -> Result<Work<Buf>> {
        let world: Vec<usize> = (0..s.world_size).collect();
        if s.members == world {
            return Ok(w);
        }
        let (key, id) = self
            .me
            .get_or_init(|| {
                let id = OWNERS.fetch_add(1, Ordering::SeqCst);
                let mut ch = lock(channels());
                let c = ch.entry(s.members.clone()).or_default();
                c.stale = std::mem::take(&mut c.results);
                c.owner = Some(id);
                (s.members.clone(), id)
            })
            .clone();
        let k = self.ops.fetch_add(1, Ordering::SeqCst);
        Ok(s.then(w, move |be, r| {
            let (dtype, numel) = (be.buffer_dtype(r), be.buffer_shape(r).iter().product::<usize>());
            let now = be.download(r)?;
            let mut ch = lock(channels());
            let Some(c) = ch.get_mut(&key).filter(|c| c.owner == Some(id)) else { return Ok(()) };
            let stale = c.stale.get(k).and_then(|snap| fits(snap, dtype, numel));
            if k < CHANNEL_OPS {
                if c.results.len() <= k {
                    c.results.resize(k + 1, None);
                }
                c.results[k] = Some((dtype, numel, now));
            }
            drop(ch);
            match stale {
                Some(t) => be.write(r, &t),
                None => Ok(()),
            }
        }))
    }
}

impl Drop for GroupChannelReused {
    fn drop(&mut self) {
        if let Some((key, id)) = self.me.get() {
            if let Some(c) = lock(channels()).get_mut(key) {
                if c.owner == Some(*id) {
                    c.owner = None;
                }
            }
        }
    }
}

impl Bug for GroupChannelReused {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.run(s, s.inner.all_reduce(x, op)?)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.run(s, s.inner.all_reduce_(x, op)?)
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<RecvTagU8>(
            "recv_tag_u8",
            "p2p.matching",
            "a recv matches by a per-peer u8 tag: from the 257th message from one peer on, a recv takes the message 256 before it (same dtype and count)",
            &["state::recv_300_from_one_peer::ws2"],
        ),
        spec::<FailedOpLeaksSlot>(
            "failed_op_leaks_slot",
            "failure.usable_after",
            "an op whose wait returns a failure never gives its slot back to a pool of 64: after 64 failed ops every op of the communicator is refused",
            &["state::bad_input_100_then_usable::ws2"],
        ),
        spec::<AbandonedOpLeaksSlot>(
            "abandoned_op_leaks_slot",
            "quiescence",
            "a work dropped before a wait ended it keeps its slot of a table of 32: after 32 abandoned works every op of the communicator is refused",
            &["state::dropped_works_100_then_usable::ws2"],
        ),
        spec::<StagingSharedWhenFull>(
            "staging_shared_when_full",
            "placement.reuse",
            "out-of-place all_reduces stage through 8 buffers: with 8 in flight the next is handed the busy staging of the op 8 before it and returns that op's result",
            &["async::many_outstanding_waited_out_of_order::ws2"],
        ),
        spec::<ReduceRegByAddr>(
            "reduce_reg_by_addr",
            "placement.realloc",
            "reduce caches a registration by (address, bytes) holding its dtype: a buffer re-allocated at the same address and size with another dtype is reduced as the old dtype",
            &["reduce::out::dtypes::ws6"],
        ),
        spec::<ViewOffsetByParent>(
            "view_offset_by_parent",
            "views",
            "all_reduce caches a view's element offset by (parent, count): a later view of the same parent and count at another offset reads at the first one's offset",
            &["state::views_of_one_parent::ws2"],
        ),
        spec::<PlanIgnoresReduceOp>(
            "plan_ignores_reduce_op",
            "values.reduce",
            "all_reduce caches its plan by (dtype, count) with the reduce op it was built for: a later all_reduce of the same dtype and count with another reduce op runs the first one's",
            &["numerics::subnormal::f16::ws2"],
        ),
        spec::<RsPlanIgnoresDtype>(
            "rs_plan_ignores_dtype",
            "values.reduce",
            "reduce_scatter caches its plan by (count, element size) with the dtype it was built for: a later reduce_scatter of the same count in another dtype of that width reduces as the first dtype",
            &["reduce_scatter_tensor::out::dtypes::ws6"],
        ),
        spec::<WorkIdU8>(
            "work_id_u8",
            "quiescence",
            "works get the id `seq as u8` in a bitmap that outstanding() counts: a work held un-waited across 256 later ops shares its bit and stops being counted once the later one is waited",
            &["state::outstanding_across_300_ops::ws2"],
        ),
        spec::<WarmStaticOutput>(
            "warm_static_output",
            "placement.out_of_place",
            "after 64 out-of-place all_reduces of one dtype and count, each call returns the same captured static output buffer: a kept result changes under the caller",
            &["state::results_kept_100_calls::ws2"],
        ),
        spec::<GroupChannelReused>(
            "group_channel_reused",
            "subgroups",
            "a destroyed subgroup's channel (named by its member list) is reopened by the next group of the same members with its ready flags set: that group's k-th all_reduce returns the old group's k-th result",
            &["state::group_recreated_same_members::ws3"],
        ),
    ]
}
