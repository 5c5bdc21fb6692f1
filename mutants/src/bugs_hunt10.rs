//! The tenth outside hunt: clauses that still had two or three mutants. A subgroup
//! reduce-scatter whose avg divides by the world, a subgroup's equal split checked against the
//! world size, an equal split that truncates an indivisible input, a scatter whose root
//! agreement is checked on the root only, a barrier elided when nothing ran since the last one,
//! an all_to_all whose refused splits stay in the exchange slot, an in-place broadcast copied
//! back through a temporary for its first 64 KiB only, an all_to_all that also lands in its
//! input, an `_out` all_gather that clears its output in 64-byte blocks, a gather that keeps the
//! shape it first registered for an address. Each is a bug a backend author could ship, over
//! the correct shm backend.

use crate::bugs::{pipelined_ag, AgKnobs, AG_RIGHT};
use crate::bugs_hunt6::{flush, Parked, Slot};
use crate::campaign::Spec;
use crate::{copy_bytes, edit, lock, set_f64, Buf, Bug, Mutant, Shm, BUG_WAIT};
use concord_core::fused::Gathered;
use concord_core::{Backend, BadInputKind, CollectiveError, Completion, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn bytes_of(s: &Shm, x: &Buf) -> usize {
    s.numel(x) * s.inner.buffer_dtype(x).size()
}

// ---------------------------------------------------------------- subgroups.reduce_ops

/// In a subgroup, reduce_scatter_tensor's avg divides the sum by the world's size (the divisor
/// taken from the process-wide communicator, as the all_reduce path does not).
#[derive(Default)]
pub struct SubgroupRsAvgByWorld;

impl Bug for SubgroupRsAvgByWorld {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(avg_by_world(s, x, op, s.inner.reduce_scatter_tensor(x, op)?))
    }
}

/// `w`, the result of a float `avg` on a subgroup, rescaled as if its sum had been divided by the
/// world's size instead of the group's (any other call: `w` as it is).
pub(crate) fn avg_by_world(s: &Shm, x: &Buf, op: ReduceOp, w: Work<Buf>) -> Work<Buf> {
    if op != ReduceOp::Avg || !s.in_subgroup() || !s.inner.buffer_dtype(x).is_float() {
        return w;
    }
    let scale = s.ws() as f64 / s.world_size as f64;
    s.then(w, move |be, r| {
        edit(be, r, |t| {
            for i in 0..t.numel() {
                let v = t.get_f64(i) * scale;
                set_f64(t, i, v);
            }
        })
    })
}

// ---------------------------------------------------------------- shapes.equal_split_all_to_all

/// In a subgroup, the equal-split all_to_all_single checks `d0 % world_size` (the world's size)
/// instead of the group's: a divisible input is refused as `Indivisible` when the world's size
/// does not divide it.
#[derive(Default)]
pub struct SubgroupEqualSplitByWorld;

impl Bug for SubgroupEqualSplitByWorld {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        if o.is_none() && i.is_none() && s.in_subgroup() && !shape.is_empty() && !shape[0].is_multiple_of(s.world_size) {
            let detail = format!("dim 0 ({}) is not divisible by the world size {}", shape[0], s.world_size);
            return Err(CollectiveError::bad_input(BadInputKind::Indivisible, "all_to_all_single", 0, s.rank(), detail));
        }
        s.inner.all_to_all_single(x, o, i)
    }
}

/// The equal-split all_to_all_single sends `d0 / ws` rows to each peer and drops the remainder:
/// an indivisible dim 0 is truncated, not refused.
#[derive(Default)]
pub struct A2aIndivisibleTruncated;

impl Bug for A2aIndivisibleTruncated {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        if o.is_some() || i.is_some() || shape.is_empty() || shape[0].is_multiple_of(s.ws()) || shape[0] < s.ws() {
            return s.inner.all_to_all_single(x, o, i);
        }
        shape[0] -= shape[0] % s.ws();
        let head = s.inner.view(x, 0, &shape)?;
        s.inner.all_to_all_single(&head, None, None)
    }
}

// ---------------------------------------------------------------- bad_input.root_agreement

/// scatter runs as an all_gather of every rank's input plus an all_gather of every rank's
/// `root`; only the rank that believes it is the root compares the roots (and refuses a
/// mismatch): a non-root takes its chunk from the rank it named, whatever the others named.
#[derive(Default)]
pub struct ScatterRootCheckedOnRoot;

impl Bug for ScatterRootCheckedOnRoot {
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (ws, rank) = (s.ws(), s.rank());
        let shape = s.inner.buffer_shape(x);
        if ws == 1 || root >= ws || shape.is_empty() || !shape[0].is_multiple_of(ws) {
            return s.inner.scatter(x, root);
        }
        let roots = s.inner.all_gather_into_tensor(&s.inner.upload(&Tensor::from_vec(&[1], vec![root as f32]))?)?;
        let all = s.inner.all_gather_into_tensor(x)?;
        let dtype = s.inner.buffer_dtype(x);
        let mut chunk = shape.clone();
        chunk[0] /= ws;
        let out = s.inner.alloc(dtype, &chunk)?;
        let o = out.clone();
        let chunk_bytes = chunk.iter().product::<usize>() * dtype.size();
        Ok(s.then_as(all, out, move |be, g| {
            let named = be.download(roots.wait(BUG_WAIT)?)?;
            if rank == root && (0..ws).any(|r| named.get_f64(r) as usize != root) {
                let detail = "ranks passed different roots".to_string();
                return Err(CollectiveError::bad_input(BadInputKind::BadRoot, "scatter", 0, rank, detail));
            }
            let g = be.download(g)?;
            let mut t = Tensor::zeros(dtype, &chunk);
            copy_bytes(&mut t, 0, &g, (root * ws + rank) * chunk_bytes, chunk_bytes);
            be.write(&o, &t)
        }))
    }
}

// ---------------------------------------------------------------- barrier

/// A barrier with no collective or send / recv since this rank's last barrier is elided (the
/// communicator is "already synchronised"): it completes at once, before the peers enter it.
#[derive(Default)]
pub struct BackToBackBarrierElided {
    synced: AtomicBool,
}

impl BackToBackBarrierElided {
    fn ran(&self) {
        self.synced.store(false, Ordering::SeqCst);
    }
}

impl Bug for BackToBackBarrierElided {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if self.synced.swap(true, Ordering::SeqCst) {
            return Ok(s.done((), "barrier"));
        }
        s.inner.barrier()
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.ran();
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.ran();
        s.inner.all_reduce_(x, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.ran();
        s.inner.all_gather_into_tensor(x)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.ran();
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.ran();
        s.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.ran();
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.ran();
        s.inner.broadcast_(x, src)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.ran();
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.ran();
        s.inner.recv(out, src)
    }
}

// ---------------------------------------------------------------- failure.usable_after

/// A completion that leaves a bad-input failure of its work in a slot.
struct Leave {
    inner: Work<Buf>,
    slot: Arc<Mutex<Option<CollectiveError>>>,
}

impl Completion for Leave {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |e| {
            if e.bad_input_kind().is_some() {
                *lock(&self.slot) = Some(e.clone());
            }
        })
    }
}

/// all_to_all_single exchanges its splits through a per-communicator slot; a call refused as
/// bad input leaves its error there, and the next all_to_all_single on this rank fails with it
/// (then the slot is clean again).
#[derive(Default)]
pub struct A2aRefusedSplitsKept {
    slot: Arc<Mutex<Option<CollectiveError>>>,
    hidden: OutstandingCounter,
}

impl Bug for A2aRefusedSplitsKept {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        if let Some(e) = lock(&self.slot).take() {
            return Err(e);
        }
        let w = match s.inner.all_to_all_single(x, o, i) {
            Ok(w) => w,
            Err(e) => {
                if e.bad_input_kind().is_some() {
                    *lock(&self.slot) = Some(e.clone());
                }
                return Err(e);
            }
        };
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Ok(Work::new(v, Arc::new(Leave { inner: w, slot: self.slot.clone() }), meta, &self.hidden))
    }
}

// ---------------------------------------------------------------- placement.in_place

/// The first chunk of a staged copy-back.
const FIRST_CHUNK: usize = 64 << 10;

/// A non-root's in-place broadcast_ of more than 64 KiB receives into a temporary and copies
/// back only its first 64 KiB (the copy-back loop stops after one chunk).
#[derive(Default)]
pub struct BroadcastInplaceFirstChunk;

impl Bug for BroadcastInplaceFirstChunk {
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if s.rank() == src || src >= s.ws() || bytes_of(s, x) <= FIRST_CHUNK {
            return s.inner.broadcast_(x, src);
        }
        let tmp = s.inner.upload(&s.inner.download(x)?)?;
        let w = s.inner.broadcast_(&tmp, src)?;
        let xc = x.clone();
        Ok(s.then_as(w, x.clone(), move |be, got| {
            let got = be.download(got)?;
            edit(be, &xc, |t| copy_bytes(t, 0, &got, 0, FIRST_CHUNK))
        }))
    }
}

// ---------------------------------------------------------------- placement.out_of_place

/// From which input size the all_to_all uses its input as the receive buffer.
const RECV_IN_INPUT: usize = 1 << 20;

/// The equal-split all_to_all_single of 1 MiB or more receives into its input (to save an
/// allocation) and copies the result out: the input holds the result afterwards.
#[derive(Default)]
pub struct A2aLargeReceivesInInput;

impl Bug for A2aLargeReceivesInInput {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        if o.is_some() || i.is_some() || bytes_of(s, x) < RECV_IN_INPUT {
            return Ok(w);
        }
        let xc = x.clone();
        Ok(s.then(w, move |be, r| be.write(&xc, &be.download(r)?)))
    }
}

// ---------------------------------------------------------------- placement.out_buffer

/// The `_out` all_gather clears its output first in 64-byte blocks of the allocation: an output
/// view whose end is not 64-byte aligned has the elements after it, up to the block's end,
/// zeroed.
#[derive(Default)]
pub struct OutClearedInBlocks;

impl Bug for OutClearedInBlocks {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        let (n, es) = (s.numel(out), s.inner.buffer_dtype(out).size());
        let Some((parent, off)) = s.view_of(out) else { return Ok(w) };
        let end = off + n;
        let block_end = (end * es).div_ceil(64) * 64 / es;
        Ok(s.then(w, move |be, _| {
            edit(be, &parent, |t| {
                for i in end..block_end.min(t.numel()) {
                    set_f64(t, i, 0.0);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- placement.realloc

/// gather registers its input by (address, bytes) with its first shape and sizes its result from
/// that: a buffer re-allocated there with another shape of the same byte size (and dtype
/// size) gets a result of the old shape.
#[derive(Default)]
pub struct GatherShapeKeptByAddress {
    registered: Mutex<HashMap<(usize, usize), Vec<usize>>>,
}

impl Bug for GatherShapeKeptByAddress {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let key = (s.inner.buffer_addr(x), bytes_of(s, x));
        let kept = lock(&self.registered).entry(key).or_insert(shape.clone()).clone();
        let w = s.inner.gather(x, root)?;
        if kept == shape || kept.is_empty() || shape.is_empty() || key.1 == 0 {
            return Ok(w);
        }
        let mut out = kept;
        out[0] *= s.ws();
        if out.iter().product::<usize>() != s.numel(w.peek()) {
            return Ok(w);
        }
        let v = s.inner.view(w.peek(), 0, &out)?;
        Ok(s.then_as(w, v, |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- fused.pipelined_order

/// The pipelined all-gather-matmul consumes peers' shards as they land, and puts the `k`-th to
/// land at the place of the `k`-th peer in step order (`rank + 1`, `rank + 2`, ...): right while
/// shards land in step order, wrong when a nearer peer is late.
#[derive(Default)]
pub struct AgMatmulLatePeerMisplaced;

impl Bug for AgMatmulLatePeerMisplaced {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { arrival_slots: true, ..AG_RIGHT })
    }
}

// ---------------------------------------------------------------- p2p.order

/// How often the send engine retries its parked sends. 500 ms (a backoff, not a spin): the
/// catch needs rank 2's receive (posted once rank 0 issued message 0, a store handshake in the
/// case) to complete before the retry; with 20 ms a rank descheduled under load let the retry go
/// first and the mutant through (it survived its pin at load 30, two tests side by side).
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A send engine that serves one peer at a time: a send issued while a send to another peer is
/// in flight is parked in that peer's retry queue (retried after [`RETRY_EVERY`]); a send issued while
/// the engine is idle goes out at once, without looking at the retry queue of its peer, so it
/// overtakes an earlier parked send to the same peer.
#[derive(Default)]
pub struct SendRetryOvertaken {
    in_flight: Mutex<Vec<(usize, Arc<Slot>)>>,
    retry: Parked,
    hidden: OutstandingCounter,
}

impl Bug for SendRetryOvertaken {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        if dst >= s.ws() || dst == s.rank() {
            return s.inner.send(x, dst);
        }
        let busy = {
            let mut f = lock(&self.in_flight);
            f.retain(|(_, w)| !w.is_completed());
            f.iter().any(|(d, _)| *d != dst)
        };
        let slot = Arc::new(Slot::default());
        if busy {
            lock(&self.retry).entry(dst).or_default().push((x.clone(), slot.clone()));
            let (be, retry) = (s.inner.clone(), self.retry.clone());
            std::thread::spawn(move || {
                std::thread::sleep(RETRY_EVERY);
                flush(&be, &retry, dst);
            });
            return Ok(Work::new((), slot, s.meta("send"), &s.own));
        }
        slot.fill(s.inner.send(x, dst));
        lock(&self.in_flight).push((dst, slot.clone()));
        Ok(Work::new((), slot, s.meta("send"), &self.hidden))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<SubgroupRsAvgByWorld>(
            "subgroup_rs_avg_by_world",
            "subgroups.reduce_ops",
            "in a subgroup, reduce_scatter_tensor's avg divides by the world size",
            &["subgroup::halves::reduce_scatter_tensor::out::f32::avg::ws4"],
        ),
        spec::<SubgroupEqualSplitByWorld>(
            "subgroup_equal_split_by_world",
            "shapes.equal_split_all_to_all",
            "in a subgroup, the equal-split all_to_all_single refuses d0 not divisible by the world size (not the group's)",
            &["sizes::all_to_all_single::out::f32::group_grid::ws7"],
        ),
        spec::<A2aIndivisibleTruncated>(
            "a2a_indivisible_truncated",
            "shapes.equal_split_all_to_all",
            "the equal-split all_to_all_single truncates an indivisible dim 0 to a multiple of ws instead of refusing it",
            &["bad_input::all_to_all_equal_split_indivisible::ws2"],
        ),
        spec::<ScatterRootCheckedOnRoot>(
            "scatter_root_checked_on_root",
            "bad_input.root_agreement",
            "scatter gathers every rank's root, but only a rank that names itself root compares them: a non-root takes its chunk from the rank it named",
            &["bad_input::scatter_root_differs_on_one_rank::ws3"],
        ),
        spec::<BackToBackBarrierElided>(
            "back_to_back_barrier_elided",
            "barrier",
            "a barrier with no collective or send / recv since this rank's last barrier completes at once",
            &["async::barrier_synchronises::subgroup::ws3"],
        ),
        spec::<A2aRefusedSplitsKept>(
            "a2a_refused_splits_kept",
            "failure.usable_after",
            "an all_to_all_single refused as bad input leaves its error in the split-exchange slot: the next all_to_all_single on that rank fails with it",
            &["bad_input::all_to_all_output_split_disagrees_with_peer::ws2"],
        ),
        spec::<BroadcastInplaceFirstChunk>(
            "broadcast_inplace_first_chunk",
            "placement.in_place",
            "a non-root's broadcast_ of more than 64 KiB receives into a temporary and copies back only its first 64 KiB",
            &["sizes::broadcast::f32::n65535::ws2"],
        ),
        spec::<A2aLargeReceivesInInput>(
            "a2a_large_receives_in_input",
            "placement.out_of_place",
            "the equal-split all_to_all_single of 1 MiB or more receives into its input: the input holds the result afterwards",
            &["sizes::all_to_all_single::f32::n262145::ws2"],
        ),
        spec::<OutClearedInBlocks>(
            "out_cleared_in_blocks",
            "placement.out_buffer",
            "the _out all_gather clears its output in 64-byte blocks: elements after an output view, to the block's end, are zeroed",
            &["views::all_gather_into_tensor::outbuf::f32::ws2"],
        ),
        spec::<GatherShapeKeptByAddress>(
            "gather_shape_kept_by_address",
            "placement.realloc",
            "gather sizes its result from the shape first registered for the input's (address, bytes): re-allocated with another shape, the result has the old shape",
            &["realloc::gather::out::ws2"],
        ),
        spec::<AgMatmulLatePeerMisplaced>(
            "ag_matmul_late_peer_misplaced",
            "fused.pipelined_order",
            "the pipelined all-gather-matmul puts the k-th shard to land at the k-th peer's place in step order: wrong when a nearer peer is late",
            &["fused::all_gather_matmul::dim0::f32::late_peer::ws3", "fused::all_gather_matmul::dim0::f32::grid_tiny::ws3"],
        ),
        spec::<SendRetryOvertaken>(
            "send_retry_overtaken",
            "p2p.order",
            "a send issued while a send to another peer is in flight is parked for a 500 ms retry; a later send to that peer, issued while idle, overtakes it",
            &["p2p::in_order_across_other_traffic::ws3"],
        ),
    ]
}
