//! The sixth review (the lead's, 2026-11-27): blind spots a read-only review of the catalogue
//! pointed at — realistic bugs it reasoned no case would catch. Each was written here first and
//! run against the whole catalogue before any case was added.

use crate::campaign::{spec, Spec};
use crate::{edit, lock, Buf, Bug, Shm};
use concord_core::{Backend, Completion, DType, ReduceOp, Result, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- in-place overrun

/// One element written past `b` when it is a view (what the rounded-up last chunk of a
/// large-message path writes; only a guarded parent shows it).
fn write_one_past(s: &Shm, b: &Buf) -> Option<(Buf, usize)> {
    let (parent, off) = s.view_of(b)?;
    Some((parent, off + s.numel(b)))
}

/// The in-place ops' large-message path rounds its last chunk up: `all_reduce_`,
/// `broadcast_` (on the ranks that receive) and `all_reduce_coalesced_` write one element past
/// a buffer of 4 Ki elements or more, at 3 ranks or more (`review_large_out_overrun` on the
/// in-place ops, whose inputs are the outputs).
#[derive(Default)]
pub struct InPlaceLargeOverrun;

impl InPlaceLargeOverrun {
    fn over(s: &Shm, bufs: &[Buf]) -> Vec<(Buf, usize)> {
        if s.ws() < 3 {
            return Vec::new();
        }
        bufs.iter().filter(|b| s.numel(b) >= 4096).filter_map(|b| write_one_past(s, b)).collect()
    }
    fn then<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>, past: Vec<(Buf, usize)>) -> Work<T> {
        if past.is_empty() {
            return w;
        }
        s.then(w, move |be, _| {
            for (parent, at) in &past {
                let v = be.view(parent, *at, &[1])?;
                be.write(&v, &Tensor::filled_bytes(be.buffer_dtype(&v), &[1], 0x11))?;
            }
            Ok(())
        })
    }
}

impl Bug for InPlaceLargeOverrun {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let past = Self::over(s, std::slice::from_ref(x));
        Ok(Self::then(s, s.inner.all_reduce_(x, op)?, past))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let past = if s.rank() == src { Vec::new() } else { Self::over(s, std::slice::from_ref(x)) };
        Ok(Self::then(s, s.inner.broadcast_(x, src)?, past))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let past = Self::over(s, xs);
        Ok(Self::then(s, s.inner.all_reduce_coalesced_(xs, op)?, past))
    }
}

// ---------------------------------------------------------------- persistent results

/// Buffers a backend keeps per (dtype, shape list).
type Kept = Mutex<HashMap<(DType, Vec<Vec<usize>>), Vec<Buf>>>;

/// The persistent buffers of one key, made on first use.
fn persistent(map: &Kept, s: &Shm, outs: &[Buf]) -> Result<Vec<Buf>> {
    let dtype = outs.first().map_or(DType::F32, |b| s.inner.buffer_dtype(b));
    let key = (dtype, outs.iter().map(|b| s.inner.buffer_shape(b)).collect::<Vec<_>>());
    let mut map = lock(map);
    if let Some(v) = map.get(&key) {
        return Ok(v.clone());
    }
    let made = outs.iter().map(|b| s.inner.alloc(s.inner.buffer_dtype(b), &s.inner.buffer_shape(b))).collect::<Result<Vec<_>>>()?;
    map.insert(key, made.clone());
    Ok(made)
}

/// The coalesced ops with a new output (`all_reduce_coalesced`,
/// `all_gather_into_tensor_coalesced`, `reduce_scatter_tensor_coalesced`) return views of one
/// fusion buffer per (dtype, shape list), as a DDP-style bucket does: the next call with the
/// same shapes overwrites the results the caller still holds.
#[derive(Default)]
pub struct CoalescedStaticOutputs {
    fusion: Kept,
}

impl CoalescedStaticOutputs {
    fn recycle(&self, s: &Shm, w: Work<Vec<Buf>>) -> Result<Work<Vec<Buf>>> {
        let outs = w.peek().clone();
        if outs.is_empty() || outs.iter().all(|b| s.numel(b) == 0) {
            return Ok(w);
        }
        let fused = persistent(&self.fusion, s, &outs)?;
        let to = fused.clone();
        Ok(s.then_as(w, fused, move |be, res| {
            for (o, r) in to.iter().zip(res) {
                be.write(o, &be.download(r)?)?;
            }
            Ok(())
        }))
    }
}

impl Bug for CoalescedStaticOutputs {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.recycle(s, s.inner.all_reduce_coalesced(xs, op)?)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.recycle(s, s.inner.all_gather_into_tensor_coalesced(xs)?)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.recycle(s, s.inner.reduce_scatter_tensor_coalesced(xs, op)?)
    }
}

/// The rooted ops (`reduce`, `gather`, `scatter`) return their result in one receive buffer
/// per (dtype, shape) that the backend keeps and reuses: the next call of the same shape
/// overwrites the tensor an earlier call returned.
#[derive(Default)]
pub struct RootedStaticOutput {
    kept: Kept,
}

impl RootedStaticOutput {
    fn recycle(&self, s: &Shm, w: Work<Buf>) -> Result<Work<Buf>> {
        let out = w.peek().clone();
        if s.numel(&out) == 0 {
            return Ok(w);
        }
        let kept = persistent(&self.kept, s, std::slice::from_ref(&out))?.remove(0);
        let to = kept.clone();
        Ok(s.then_as(w, kept, move |be, res| be.write(&to, &be.download(res)?)))
    }
}

impl Bug for RootedStaticOutput {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.recycle(s, s.inner.reduce(x, op, root)?)
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.recycle(s, s.inner.gather(x, root)?)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.recycle(s, s.inner.scatter(x, root)?)
    }
}

// ---------------------------------------------------------------- hierarchical barrier

/// A hierarchical barrier in groups of 4 ranks (node or socket leaders): the first group's
/// leader releases ranks 0–3 once its own group has arrived, without waiting for the exchange
/// between leaders. Up to 4 ranks it is right; from 5 ranks up, ranks 0–3 leave the barrier
/// before rank 4 has entered it. (The world barrier still runs underneath, so nothing hangs.)
#[derive(Default)]
pub struct BarrierLeadersOfFour {
    group: Mutex<Option<Option<Arc<concord_shm::ShmBackend>>>>,
}

impl Bug for BarrierLeadersOfFour {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if s.ws() < 5 || s.in_subgroup() {
            return s.inner.barrier();
        }
        let group = {
            let mut g = lock(&self.group);
            if g.is_none() {
                // Every rank makes the first group (a collective call), on its first barrier.
                *g = Some(s.inner.new_group(&[0, 1, 2, 3])?.map(Arc::new));
            }
            g.clone().flatten()
        };
        let world = s.inner.barrier()?;
        let Some(group) = group else { return Ok(world) };
        let local = group.barrier()?;
        // The world barrier completes in the background; the caller sees the group's.
        let meta = world.meta().clone();
        Ok(s.relayed((), Arc::new(GroupFirst { local, _world: world }), meta))
    }
}

struct GroupFirst {
    local: Work<()>,
    _world: Work<()>,
}

impl Completion for GroupFirst {
    fn is_completed(&self) -> bool {
        self.local.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.local, timeout, |_| {})
    }
}

// ---------------------------------------------------------------- narrow integers, other ops

/// Bytes per pass of the integer reduction loop.
const PASS_BYTES: usize = 64 << 10;

/// `narrow_int_pass_counted_as_i32` on the other reductions: `reduce_scatter_tensor`, `reduce`
/// and in-place `all_reduce_` of 1- and 2-byte integers above 64 KiB step 64 KiB passes but
/// reduce `PASS_BYTES / 4` elements of each (the count written for i32): the rest of every pass
/// keeps this rank's own input.
#[derive(Default)]
pub struct NarrowIntPassOtherOps;

impl NarrowIntPassOtherOps {
    fn hit(s: &Shm, x: &Buf) -> bool {
        let d = s.inner.buffer_dtype(x);
        !d.is_float() && d.size() <= 2 && s.numel(x) * d.size() > PASS_BYTES
    }
    /// Keeps `mine`'s element at every index of the result (index `base + i` of the input) that
    /// the short pass skipped.
    fn keep(s: &Shm, w: Work<Buf>, mine: Tensor, base: usize) -> Work<Buf> {
        s.then(w, move |be, out| {
            edit(be, out, |t| {
                let es = t.dtype().size();
                let (step, done) = (PASS_BYTES / es, PASS_BYTES / 4);
                for i in (0..t.numel()).filter(|i| (base + i) % step >= done) {
                    crate::copy_bytes(t, i * es, &mine, (base + i) * es, es);
                }
            })
        })
    }
}

impl Bug for NarrowIntPassOtherOps {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::hit(s, x) {
            return s.inner.all_reduce_(x, op);
        }
        let mine = s.inner.download(x)?;
        Ok(Self::keep(s, s.inner.all_reduce_(x, op)?, mine, 0))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::hit(s, x) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let mine = s.inner.download(x)?;
        let base = s.rank() * (s.numel(x) / s.ws());
        Ok(Self::keep(s, s.inner.reduce_scatter_tensor(x, op)?, mine, base))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        if !Self::hit(s, x) || s.rank() != root {
            return s.inner.reduce(x, op, root);
        }
        let mine = s.inner.download(x)?;
        Ok(Self::keep(s, s.inner.reduce(x, op, root)?, mine, 0))
    }
}

// ---------------------------------------------------------------- avg tail

/// Elements per launch of the divide kernel (no grid-stride loop).
const DIVIDE_GRID: usize = 64 << 10;

/// Float `avg` on 2 ranks or more as a sum followed by a divide kernel launched for 64 Ki
/// elements with no grid-stride loop: elements past 64 Ki come back undivided (the sum).
/// nccl #1950's one-rank bug (`wild_onerank_avg_drops_tail`), at any world size.
#[derive(Default)]
pub struct AvgTailUndivided;

impl AvgTailUndivided {
    fn undivide(s: &Shm, w: Work<Buf>, ws: usize) -> Work<Buf> {
        s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in DIVIDE_GRID..t.numel() {
                    let v = t.get_f64(i);
                    crate::set_f64(t, i, v * ws as f64);
                }
            })
        })
    }
    fn hit(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Avg && s.ws() >= 2 && s.inner.buffer_dtype(x).is_float() && s.numel(x) > DIVIDE_GRID
    }
}

impl Bug for AvgTailUndivided {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(if Self::hit(s, x, op) { Self::undivide(s, w, s.ws()) } else { w })
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        Ok(if Self::hit(s, x, op) { Self::undivide(s, w, s.ws()) } else { w })
    }
}

// ---------------------------------------------------------------- nested views

/// A view of a view is placed from the parent's start: the new view's byte offset is
/// `offset · size` instead of the view's own offset plus it (a view that forgets its base's
/// offset). Views of a plain buffer are right.
#[derive(Default)]
pub struct NestedViewForgetsBase;

impl Bug for NestedViewForgetsBase {
    fn view(&self, s: &Shm, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        let right = s.inner.view(b, offset, shape)?;
        match s.view_of(b) {
            Some((parent, base)) if base > 0 => s.inner.view(&parent, offset, shape),
            _ => Ok(right),
        }
    }
}

// ---------------------------------------------------------------- coalesced span

/// In-place `all_reduce_coalesced_` of a list whose tensors all view one parent reduces the
/// span from the lowest start to the highest end as one buffer (a "contiguous storage" fast
/// path): the elements between the views are reduced too.
#[derive(Default)]
pub struct CoalescedSpanOfOneParent;

impl Bug for CoalescedSpanOfOneParent {
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let placed: Option<Vec<(Buf, usize, usize)>> = xs.iter().map(|x| s.view_of(x).map(|(p, o)| (p, o, s.numel(x)))).collect();
        let Some(placed) = placed.filter(|p| p.len() >= 2) else { return s.inner.all_reduce_coalesced_(xs, op) };
        let addr = |b: &Buf| s.inner.buffer_addr(b);
        if placed.iter().any(|(p, ..)| addr(p) != addr(&placed[0].0)) {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        let start = placed.iter().map(|(_, o, _)| *o).min().unwrap_or(0);
        let end = placed.iter().map(|(_, o, n)| o + n).max().unwrap_or(0);
        let span = s.inner.view(&placed[0].0, start, &[end - start])?;
        let w = s.inner.all_reduce_(&span, op)?;
        Ok(w.map(|_| xs.to_vec()))
    }
}

// ---------------------------------------------------------------- uncounted works

/// Works of `send`, `recv`, `barrier` and `broadcast` built against a throwaway counter (as
/// `low_contention_uncounted` does for the fused ops): `outstanding()` never counts them, so a
/// caller that drains by the count exits with them in flight.
#[derive(Default)]
pub struct P2pWorksUncounted {
    live: Arc<AtomicUsize>,
}

struct Uncounted<T> {
    inner: Work<T>,
    live: Arc<AtomicUsize>,
    held: AtomicBool,
}

impl<T> Uncounted<T> {
    fn release(&self) {
        if self.held.swap(false, Ordering::SeqCst) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl<T: Send + Sync> Completion for Uncounted<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = crate::relay_wait(&self.inner, timeout, |_| {});
        if !matches!(r, Ok(false)) {
            self.release();
        }
        r
    }
}

impl<T> Drop for Uncounted<T> {
    fn drop(&mut self) {
        self.release();
    }
}

impl P2pWorksUncounted {
    fn hide<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        self.live.fetch_add(1, Ordering::SeqCst);
        s.relayed(value, Arc::new(Uncounted { inner: w, live: self.live.clone(), held: AtomicBool::new(true) }), meta)
    }
}

impl Bug for P2pWorksUncounted {
    fn outstanding(&self, s: &Shm) -> usize {
        (s.inner.outstanding() + s.own.get()).saturating_sub(self.live.load(Ordering::SeqCst))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(self.hide(s, s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.hide(s, s.inner.recv(out, src)?))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(self.hide(s, s.inner.barrier()?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.hide(s, s.inner.broadcast(x, src)?))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<InPlaceLargeOverrun>(
            "review6_inplace_large_overrun",
            "placement.in_place",
            "all_reduce_, broadcast_ (receivers) and all_reduce_coalesced_ write one element past a buffer of 4 Ki elements or more, at 3 ranks or more",
            &["sizes::all_reduce::inplace::f32::grid::ws3"],
        ),
        spec::<CoalescedStaticOutputs>(
            "review6_coalesced_static_outputs",
            "placement.out_of_place",
            "the coalesced ops with a new output return one persistent fusion buffer per (dtype, shape list): the next such call overwrites results the caller holds",
            &["reuse::outputs_kept::all_reduce::coalesced::ws2"],
        ),
        spec::<RootedStaticOutput>(
            "review6_rooted_static_output",
            "placement.out_of_place",
            "reduce, gather and scatter return one kept receive buffer per (dtype, shape): the next such call overwrites the tensor an earlier call returned",
            &["reuse::outputs_kept::reduce::out::ws2"],
        ),
        spec::<BarrierLeadersOfFour>(
            "review6_barrier_leaders_of_four",
            "barrier",
            "a barrier in groups of 4 ranks: at 5 ranks or more, ranks 0-3 leave once their own group has arrived",
            // The first catches by timing (rank 4 must still be out when ranks 0-3 leave: it
            // survived 10 runs of 30 at load 20 with a 20 ms sleep); the second by structure
            // (rank 8 calls another op: ranks 0-3 complete theirs, so the bad input is accepted).
            &["async::barrier_synchronises::every_rank_checks::ws5", "bad_input::grid::barrier::ws16"],
        ),
        spec::<NarrowIntPassOtherOps>(
            "review6_narrow_int_pass_other_ops",
            "values.sizes",
            "reduce_scatter, reduce and all_reduce_ of 1- and 2-byte integers past 64 KiB reduce 16 Ki elements of every 64 KiB pass: the rest keeps the rank's input",
            &["reduce_scatter_tensor::out::u8::sum::ws2::long"],
        ),
        spec::<AvgTailUndivided>(
            "review6_avg_tail_undivided",
            "values.reduce",
            "float all_reduce avg on 2+ ranks past 64 Ki elements: the divide kernel covers 64 Ki elements, the rest come back as the sum",
            &["all_reduce::out::f32::avg::ws2::large"],
        ),
        spec::<NestedViewForgetsBase>(
            "review6_nested_view_forgets_base",
            "views",
            "a view of a view is placed from the parent's start, not from the view's own offset",
            &["views::nested::all_reduce::inplace::f32::ws2"],
        ),
        spec::<CoalescedSpanOfOneParent>(
            "review6_coalesced_span_of_one_parent",
            "placement.in_place",
            "all_reduce_coalesced_ of views of one parent reduces the span from the first start to the last end: the gaps are reduced too",
            &["views::one_parent::all_reduce::coalesced_inplace::f32::ws2"],
        ),
        spec::<P2pWorksUncounted>(
            "review6_p2p_works_uncounted",
            "quiescence",
            "works of send, recv, barrier and broadcast are not counted in outstanding()",
            &["async::registry_counts_unwaited_work::every_op::ws2"],
        ),
    ]
}
