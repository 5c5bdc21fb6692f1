//! The thirteenth review's blind spots (read-only review13, 2026-11-27; helper impl13): inputs
//! still read by peers after a successful wait, inputs not kept alive by their work, address
//! caches used only on the large-message path, and per-process workspaces keyed by size. Each
//! was written here first and run against the whole catalogue before any case was added.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work, WorldInfo};
use concord_shm::ShmBackend;
use concord_store::Store;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- finding 1: no closing handshake

/// Finding 1. A pull-model broadcast (peers copy the root's input where it lies) whose root
/// completes once every peer has *arrived* (each rank announces its call, size, dtype and root,
/// in a rendezvous, here the world's store), with no closing barrier: the root's wait returns while its peers may
/// still be reading its input, and a caller that overwrites the input right after its wait (the
/// next step's parameters) has peers receive the new bytes. The root's own result is copied at
/// issue; a real op that ends first (a refused call) ends the root's work with its own result.
/// On the world communicator. Clause `placement.reuse` (after a successful wait, a rank's inputs
/// are the caller's again).
#[derive(Default)]
pub struct RootCompletesOnArrival {
    /// The world's store and id (the world communicator's bug only).
    rendezvous: Mutex<Option<(Arc<Store>, String)>>,
    /// Broadcasts issued on the world communicator so far.
    calls: AtomicUsize,
    /// Real ops this bug waits for after the caller's work completed: the backend's own count
    /// leaves them out of `outstanding`.
    hidden: Arc<AtomicUsize>,
}

/// One count in a counter while alive.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(c: &Arc<AtomicUsize>) -> Counted {
        c.fetch_add(1, Ordering::SeqCst);
        Counted(c.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A root's broadcast: complete once every rank announced the call (or once the real op ended,
/// with its result); from then on the real op is waited aside.
struct Arrival {
    store: Arc<Store>,
    keys: Vec<String>,
    /// This rank's call as announced (numel, dtype, root).
    desc: Vec<u8>,
    /// The real op, counted in the bug's hidden works until it is waited.
    real: Mutex<Option<(Work<Buf>, Counted)>>,
    outcome: Mutex<Option<Result<()>>>,
}

impl Arrival {
    fn settle(&self, outcome: Result<()>) -> Result<bool> {
        if let Some((w, guard)) = crate::lock(&self.real).take() {
            std::thread::spawn(move || {
                let _ = w.wait(BUG_WAIT);
                drop(w);
                drop(guard);
            });
        }
        *crate::lock(&self.outcome) = Some(outcome.clone());
        outcome.map(|()| true)
    }

    fn poll(&self) -> Option<Result<bool>> {
        if let Some(o) = crate::lock(&self.outcome).clone() {
            return Some(o.map(|()| true));
        }
        let ended = crate::lock(&self.real).as_ref().filter(|(w, _)| w.is_completed()).map(|(w, _)| w.wait(Duration::ZERO).map(|_| ()));
        if let Some(r) = ended {
            return Some(self.settle(r));
        }
        let refs: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        if self.store.check(&refs).unwrap_or(false) {
            // Every rank announced a call: the same call (size, dtype, root) completes the
            // root; another one is left to the real op, which refuses it.
            let same = self.keys.iter().all(|k| self.store.get(k).is_ok_and(|v| v == self.desc));
            if same {
                return Some(self.settle(Ok(())));
            }
        }
        None
    }
}

impl concord_core::Completion for Arrival {
    fn is_completed(&self) -> bool {
        self.poll().is_some()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(r) = self.poll() {
                return r;
            }
            if t0.elapsed() >= timeout {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl RootCompletesOnArrival {
    fn issue(&self, s: &Shm, x: &Buf, src: usize, in_place: bool, real: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let Some((store, world_id)) = crate::lock(&self.rendezvous).clone() else { return real() };
        if s.in_subgroup() || src >= s.ws() {
            return real();
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let key = |r: usize| format!("review13/{world_id}/broadcast{n}/{r}");
        let desc = format!("{} {} {src}", s.numel(x), s.inner.buffer_dtype(x)).into_bytes();
        store.set(&key(s.rank()), &desc).map_err(|e| concord_core::CollectiveError::Backend(e.to_string()))?;
        let w = real()?;
        if s.rank() != src {
            return Ok(w);
        }
        let out = w.peek().clone();
        if !in_place {
            s.inner.write(&out, &s.inner.download(x)?)?;
        }
        let meta = w.meta().clone();
        let arrival = Arrival {
            store,
            keys: (0..s.ws()).map(key).collect(),
            desc,
            real: Mutex::new(Some((w, Counted::new(&self.hidden)))),
            outcome: Mutex::new(None),
        };
        // The caller's work is counted in `outstanding` until waited (the real op is not).
        Ok(Work::new(out, Arc::new(arrival), meta, &s.own))
    }
}

impl Bug for RootCompletesOnArrival {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if world.world_size > 1 {
            let store = Store::open(&world.store_path, world.world_size, world.op_timeout)
                .map_err(|e| concord_core::CollectiveError::Backend(e.to_string()))?;
            *crate::lock(&self.rendezvous) = Some((Arc::new(store), world.world_id.clone()));
        }
        Ok(world.clone())
    }
    fn outstanding(&self, s: &Shm) -> usize {
        (s.inner.outstanding() + s.own.get()).saturating_sub(self.hidden.load(Ordering::SeqCst))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.issue(s, x, src, false, || s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.issue(s, x, src, true, || s.inner.broadcast_(x, src))
    }
}

// ---------------------------------------------------------------- finding 2: inputs not kept

/// Finding 2. The rooted paths (broadcast, reduce, gather, scatter) queue their job with the
/// input's raw location (an arena offset, a pointer) instead of an owning handle (the other
/// paths stash the tensor, as c10d's `stashed_for_allocator_safety_`); the job runs later (shm
/// runs a collective at the first wait or the next progress tick). A caller that drops its
/// input after issue (`reduce(x * 2)` on a temporary) returns the block to the allocator, the
/// next allocation gets it, and the op sends its contents. Clauses `async.issue_returns`,
/// `placement.reuse` (an op keeps every buffer it was given until it completes).
#[derive(Default)]
pub struct RootedInputNotKept;

impl Bug for RootedInputNotKept {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(&x.unowned(), src)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(&x.unowned(), op, root)
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.gather(&x.unowned(), root)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.scatter(&x.unowned(), root)
    }
}

// ---------------------------------------------------------------- finding 3: large-path cache

/// The size from which [`LargeRegistrationByAddress`] registers a buffer (zero-copy / user
/// buffer registration pays only there).
const REGISTER_FROM: usize = 1 << 20;

/// Finding 3. Buffers of 1 MiB or more are registered once (zero-copy path) in a cache keyed by
/// base address and never dropped when the buffer is freed; the registration carries the dtype
/// the reduction kernel is picked by. A buffer re-allocated at that address with another dtype
/// of the same element size is reduced as the old dtype (the bits of i32 summed as f32).
/// Clause `placement.realloc`.
#[derive(Default)]
pub struct LargeRegistrationByAddress {
    registered: Mutex<HashMap<usize, DType>>,
}

impl LargeRegistrationByAddress {
    /// The dtype the reduction of `x` runs as, if it is not `x`'s own.
    fn stale(&self, s: &Shm, x: &Buf) -> Option<DType> {
        let d = s.inner.buffer_dtype(x);
        if s.numel(x) * d.size() < REGISTER_FROM {
            return None;
        }
        let reg = *crate::lock(&self.registered).entry(s.inner.buffer_addr(x)).or_insert(d);
        (reg != d && reg.size() == d.size()).then_some(reg)
    }

    fn all_reduce_as(&self, s: &Shm, x: &Buf, op: ReduceOp, into: Option<&Buf>) -> Result<Work<Buf>> {
        let Some(reg) = self.stale(s, x) else {
            return match into {
                Some(x) => s.inner.all_reduce_(x, op),
                None => s.inner.all_reduce(x, op),
            };
        };
        let be = &s.inner;
        let (d, shape) = (be.buffer_dtype(x), be.buffer_shape(x));
        let t = be.download(x)?;
        let y = be.upload(&Tensor::from_bytes(reg, &shape, t.bytes()))?;
        let w = be.all_reduce_(&y, op)?;
        let out = match into {
            Some(x) => x.clone(),
            None => be.alloc(d, &shape)?,
        };
        let dst = out.clone();
        Ok(s.then_as(w, out, move |be: &ShmBackend, r: &Buf| {
            let r = be.download(r)?;
            be.write(&dst, &Tensor::from_bytes(d, &shape, r.bytes()))
        }))
    }
}

impl Bug for LargeRegistrationByAddress {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.all_reduce_as(s, x, op, None)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.all_reduce_as(s, x, op, Some(x))
    }
}

// ---------------------------------------------------------------- finding 6: keyed by size

/// One all_reduce in flight on some communicator of this process, in the workspace of its
/// (dtype, numel): its staged input is overwritten (`clobbered`) when another communicator
/// issues an all_reduce of the same dtype and numel before it completes.
struct Slot {
    comm: usize,
    key: (DType, usize),
    clobbered: Arc<Mutex<Option<Tensor>>>,
}

/// The process's workspaces, one per (dtype, numel) (see [`StagingKeyedBySize`]).
static WORKSPACES: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

/// Finding 6. Out-of-place `all_reduce` stages its input in a per-PROCESS workspace keyed by
/// (dtype, numel) (the "fix" of one shared staging buffer, hunt3's `shared_staging`): two
/// communicators' all_reduces of one shape in flight together share one slot, the later one's
/// input overwrites the earlier one's, and the earlier one returns the bytes staged last.
/// Clauses `placement.reuse`, `subgroups`.
#[derive(Default)]
pub struct StagingKeyedBySize;

impl Bug for StagingKeyedBySize {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let comm = Arc::as_ptr(&s.inner) as usize;
        let key = (s.inner.buffer_dtype(x), s.numel(x));
        let mine = s.inner.download(x)?;
        let clobbered = Arc::new(Mutex::new(None));
        {
            let mut st = crate::lock(&WORKSPACES);
            st.retain(|e| Arc::strong_count(&e.clobbered) > 1);
            for e in st.iter().filter(|e| e.comm != comm && e.key == key) {
                crate::lock(&e.clobbered).get_or_insert_with(|| mine.clone());
            }
            st.push(Slot { comm, key, clobbered: clobbered.clone() });
        }
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| {
            let Some(staged) = crate::lock(&clobbered).take() else { return Ok(()) };
            crate::edit(be, out, |t| {
                let n = t.len_bytes().min(staged.len_bytes());
                t.bytes_mut()[..n].copy_from_slice(&staged.bytes()[..n]);
            })
        }))
    }
}

// ---------------------------------------------------------------- finding 4: 32-wide masks

/// The width of [`MaskOf32`]'s readiness mask.
const MASK_BITS: usize = 32;

/// Finding 4. A port of shm's control segment with a `uint32_t` readiness mask (`1 << rank`)
/// instead of `u64`: from 33 ranks, rank 32 sets rank 0's bit, and a sum counts only the ranks
/// whose bits are distinct: ranks 32 and up are left out of every all_reduce `sum` (the
/// world sizes of the catalogue stopped at 16; shm declares 64). Clause `values.world_sizes`.
#[derive(Default)]
pub struct MaskOf32;

impl Bug for MaskOf32 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.ws() <= MASK_BITS || op != ReduceOp::Sum {
            return s.inner.all_reduce(x, op);
        }
        let (ws, n) = (s.ws(), s.numel(x));
        crate::then_gathered(
            s,
            s.inner.all_gather_into_tensor(x)?,
            |g| g,
            || s.inner.all_reduce(x, op),
            |b: &Buf| Some(b),
            move |all: &Tensor, t: &mut Tensor| {
                for i in 0..n {
                    let left_out: f64 = (MASK_BITS..ws).map(|r| all.get_f64(r * n + i)).sum();
                    crate::set_f64(t, i, t.get_f64(i) - left_out);
                }
            },
        )
    }
}

// ---------------------------------------------------------------- finding 8: aliasing by parent

/// Finding 8. `all_gather_into_tensor_out` decides "in place" by allocation (the input is a
/// part of the output's parent block: NCCL's in-place layout, where the input IS this rank's
/// chunk of the output), not by byte ranges (MPICH compared pointers, pmodels/mpich #2124), and
/// takes the in-place shortcut: it skips the local copy of its own chunk. An input and an output
/// carved disjoint from one parent (FSDP's shards of one flat buffer) leave this rank's chunk
/// of the output with the bytes it held before. Clauses `placement.out_buffer`,
/// `bad_input.named_everywhere` (aliasing = an output that overlaps an input).
#[derive(Default)]
pub struct InPlaceShortcutByParent;

impl Bug for InPlaceShortcutByParent {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let parent = |b: &Buf| s.view_of(b).map_or_else(|| s.inner.buffer_addr(b), |(p, _)| s.inner.buffer_addr(&p));
        let n = s.numel(x);
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        if n == 0 || parent(x) != parent(out) || s.numel(out) != n * s.ws() {
            return Ok(w);
        }
        let before = s.inner.download(out)?;
        let (at, len) = (s.rank() * n * before.dtype().size(), n * before.dtype().size());
        Ok(s.then(w, move |be, out| crate::edit(be, out, |t| t.bytes_mut()[at..at + len].copy_from_slice(&before.bytes()[at..at + len]))))
    }
}

// ---------------------------------------------------------------- finding 9: large 2-D flat

/// Finding 9. From 1 MiB of input, `reduce_scatter_tensor` takes a bulk path that returns its
/// flat staging result, `[numel / ws]`, instead of `[d0 / ws, rest..]` for an input of two or
/// more dims (hunt12's `large_all_gather_flat`, on reduce_scatter; the small path is right).
/// Clause `shapes`.
#[derive(Default)]
pub struct LargeReduceScatterFlat;

impl Bug for LargeReduceScatterFlat {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let d = s.inner.buffer_dtype(x);
        if s.inner.buffer_shape(x).len() < 2 || s.numel(x) * d.size() < REGISTER_FROM {
            return Ok(w);
        }
        let flat = s.inner.view(w.peek(), 0, &[s.numel(w.peek())])?;
        Ok(s.then_as(w, flat, |_: &ShmBackend, _| Ok(())))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<RootCompletesOnArrival>(
            "review13_root_completes_on_arrival",
            "placement.reuse",
            "broadcast's root completes once every peer announced the call (a rendezvous), with no closing barrier: peers still read its input after its wait returned",
            &["reuse::inputs_rewritten_after_wait::ws2"],
        ),
        spec::<RootedInputNotKept>(
            "review13_rooted_input_not_kept",
            "placement.reuse",
            "broadcast / reduce / gather / scatter queue their job with a non-owning handle to the input: an input the caller drops after issue is reused by the next allocation before the op reads it",
            &["reuse::outputs_in_flight::broadcast::out::ws2"],
        ),
        spec::<LargeRegistrationByAddress>(
            "review13_large_registration_by_address",
            "placement.realloc",
            "all_reduce registers buffers of 1 MiB or more by base address, never dropped at free: a buffer re-allocated there with another dtype of one size is reduced as the old dtype",
            &["realloc::all_reduce::out::ws2"],
        ),
        spec::<StagingKeyedBySize>(
            "review13_staging_keyed_by_size",
            "placement.reuse",
            "all_reduce stages its input in a per-process workspace keyed by (dtype, numel): the world's and a group's same-shaped calls in flight together share it",
            &["reuse::world_and_group_in_flight::all_reduce::out::ws3"],
        ),
        spec::<MaskOf32>(
            "review13_mask_of_32",
            "values.world_sizes",
            "a 32-wide readiness mask (uint32_t, 1 << rank): from 33 ranks, ranks 32 and up are left out of every all_reduce sum",
            &["sizes::wide::ws33"],
        ),
        spec::<InPlaceShortcutByParent>(
            "review13_inplace_shortcut_by_parent",
            "placement.out_buffer",
            "all_gather_into_tensor_out whose input and output are views of one parent takes the in-place shortcut (skips copying its own chunk), though the two do not overlap",
            &["wild_layout::empty_out_at_input_address::all_gather_into_tensor::ws2"],
        ),
        spec::<LargeReduceScatterFlat>(
            "review13_large_reduce_scatter_flat",
            "shapes",
            "reduce_scatter_tensor of 1 MiB or more with an input of 2 or more dims returns its flat [numel / ws] staging result",
            &["sizes::reduce_scatter_tensor::out::f32::matrix::ws2"],
        ),
    ]
}
