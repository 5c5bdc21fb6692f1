//! The sixth outside hunt: the clauses the campaign covered thinly. Point to point under load (a
//! protocol switch that lets small messages overtake large ones, a bounded window that blocks at
//! issue, a receive from oneself, a failed pair that stays failed); bad input checked on one op
//! and not its sibling (reduce_scatter's `_out` dtype, all_to_all's output splits, the scaled
//! all-gather-matmul's gather dim, a matmul-reduce-scatter checked only locally); the fused ops'
//! buffers and pipeline (low-contention works outside the registry or in a workspace, shards
//! taken before they land); a subgroup whose first op connects at issue, whose ops are not
//! recorded in flight, and whose messages share the world's channel untagged. Each is a bug a backend author could ship, over the correct shm backend.

use crate::bugs::{pipelined_ag, AG_RIGHT};
use crate::bugs_hunt5::unrecorded;
use crate::campaign::Spec;
use crate::lock;
use crate::{Buf, Bug, Mutant, Shm, BUG_WAIT};
use concord_core::fused::{describe, input_descs, move_from_front, move_to_front, Gathered, MatmulRsPlan};
use concord_core::{Backend, CallOp, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A completion that relays a shared inner work (so a bug can keep watching it too).
struct Relay<T>(Arc<Work<T>>);

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        self.0.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match self.0.wait(timeout) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn timeout(s: &Shm, op: &str, waited: Duration, detail: &str) -> CollectiveError {
    CollectiveError::Timeout { op: op.into(), seq: 0, rank: s.rank(), waited_ms: waited.as_millis() as u64, detail: detail.into() }
}

// ---------------------------------------------------------------- p2p.order

/// Bytes from which a send takes the rendezvous path.
const RENDEZVOUS_BYTES: usize = 256 << 10;
/// How long a parked large send waits for a later send to the same peer before it goes anyway.
const PARK_AT_MOST: Duration = Duration::from_millis(50);

/// Where a parked send's inner work lands once it is issued.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<Option<Result<Arc<Work<()>>>>>,
    cv: Condvar,
}

impl Slot {
    pub(crate) fn fill(&self, r: Result<Work<()>>) {
        *lock(&self.state) = Some(r.map(Arc::new));
        self.cv.notify_all();
    }
}

impl Completion for Slot {
    fn is_completed(&self) -> bool {
        match &*lock(&self.state) {
            Some(Ok(w)) => w.is_completed(),
            Some(Err(_)) => true,
            None => false,
        }
    }
    fn wait_for(&self, t: Duration) -> Result<bool> {
        let deadline = Instant::now() + t;
        let mut g = lock(&self.state);
        let w = loop {
            match &*g {
                Some(Ok(w)) => break w.clone(),
                Some(Err(e)) => return Err(e.clone()),
                None => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        };
        drop(g);
        Relay(w).wait_for(deadline.saturating_duration_since(Instant::now()))
    }
}

pub(crate) type Parked = Arc<Mutex<HashMap<usize, Vec<(Buf, Arc<Slot>)>>>>;

pub(crate) fn flush(be: &concord_shm::ShmBackend, parked: &Parked, dst: usize) {
    let sends = lock(parked).remove(&dst).unwrap_or_default();
    for (x, slot) in sends {
        slot.fill(be.send(&x, dst));
    }
}

/// Sends of 256 KiB or more take a rendezvous path: parked until the next send to the same peer
/// (or 50 ms), so that small messages are not stuck behind them. A small send issued after a
/// large one to the same peer overtakes it.
#[derive(Default)]
pub struct LargeSendOvertaken {
    parked: Parked,
}

impl Bug for LargeSendOvertaken {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        if bytes < RENDEZVOUS_BYTES || dst >= s.ws() || dst == s.rank() {
            let w = s.inner.send(x, dst);
            flush(&s.inner, &self.parked, dst);
            return w;
        }
        let slot = Arc::new(Slot::default());
        lock(&self.parked).entry(dst).or_default().push((x.clone(), slot.clone()));
        let (be, parked) = (s.inner.clone(), self.parked.clone());
        std::thread::spawn(move || {
            std::thread::sleep(PARK_AT_MOST);
            flush(&be, &parked, dst);
        });
        Ok(Work::new((), slot, s.meta("send"), &s.own))
    }
}

// ---------------------------------------------------------------- p2p.no_deadlock

/// Sends one rank keeps in flight to one peer before a send blocks at issue.
const WINDOW: usize = 64;

/// A credit window of 64 messages per peer: the 65th send in flight to a peer blocks at issue
/// until the oldest completes (and fails with a timeout after 15 s), so 65+ sends both ways
/// before any receive deadlock.
#[derive(Default)]
pub struct SendWindowBlocksAtIssue {
    in_flight: Mutex<HashMap<usize, Vec<Arc<Work<()>>>>>,
    hidden: OutstandingCounter,
}

impl Bug for SendWindowBlocksAtIssue {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let oldest = {
            let mut m = lock(&self.in_flight);
            let q = m.entry(dst).or_default();
            q.retain(|w| !w.is_completed());
            (q.len() >= WINDOW).then(|| q[0].clone())
        };
        if let Some(w) = oldest {
            let t0 = Instant::now();
            match w.wait(BUG_WAIT) {
                Ok(_) => {}
                Err(CollectiveError::Timeout { .. }) => {
                    return Err(timeout(s, "send", t0.elapsed(), "no credit: 64 sends to this peer still in flight"))
                }
                Err(e) => return Err(e),
            }
        }
        let w = Arc::new(s.inner.send(x, dst)?);
        lock(&self.in_flight).entry(dst).or_default().push(w.clone());
        let meta = w.meta().clone();
        Ok(Work::new((), Arc::new(Relay(w)), meta, &self.hidden))
    }
}

// ---------------------------------------------------------------- bad input

/// A receive from the caller itself is served from its own (empty) loop-back queue: it
/// completes at once and leaves `out` as it was, instead of `bad_input:bad_peer` (the send side
/// checks its peer, the receive side only the range).
#[derive(Default)]
pub struct RecvFromSelfNoop;

impl Bug for RecvFromSelfNoop {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        if src == s.rank() {
            return Ok(s.done(out.clone(), "recv"));
        }
        s.inner.recv(out, src)
    }
}

/// `t`'s values in `dtype` (the `copy_` a Python wrapper does into a caller's tensor).
fn cast(t: &Tensor, dtype: DType, shape: &[usize]) -> Tensor {
    Tensor::from_f64(dtype, shape, &(0..t.numel()).map(|i| t.get_f64(i)).collect::<Vec<_>>())
}

/// reduce_scatter_tensor_out checks its output's size but not its dtype (all_gather's `_out`
/// checks both): the result is cast into an output of another dtype, no error.
#[derive(Default)]
pub struct RsOutDtypeCast;

impl Bug for RsOutDtypeCast {
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let (dx, dout) = (s.inner.buffer_dtype(x), s.inner.buffer_dtype(out));
        if dx == dout || s.numel(out) * s.ws() != s.numel(x) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let (o, shape) = (out.clone(), s.inner.buffer_shape(out));
        Ok(s.then_as(w, out.clone(), move |be, res| be.write(&o, &cast(&be.download(res)?, dout, &shape))))
    }
}

/// all_to_all_single builds its receive plan by zipping the peers with the output splits: a
/// list of the wrong length is cut or padded with zeros instead of `bad_input:bad_splits`
/// (the input splits' length is checked).
#[derive(Default)]
pub struct A2aOutputSplitsZipped;

impl Bug for A2aOutputSplitsZipped {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        match o {
            Some(o) if o.len() != s.ws() => {
                let zipped: Vec<usize> = (0..s.ws()).map(|r| o.get(r).copied().unwrap_or(0)).collect();
                s.inner.all_to_all_single(x, Some(&zipped), i)
            }
            _ => s.inner.all_to_all_single(x, o, i),
        }
    }
}

// ---------------------------------------------------------------- fused

/// The scaled all-gather-matmul normalises its gather dim like a Python index (`dim` past the
/// last dim becomes the last dim) before validating it; the unscaled op validates it as given.
#[derive(Default)]
pub struct ScaledGatherDimClamped;

impl Bug for ScaledGatherDimClamped {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let nd = m.s.inner.buffer_shape(a).len();
        let dim = if sc.is_some() && dim >= nd && nd > 0 { nd - 1 } else { dim };
        concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc)
    }
}

/// matmul-reduce-scatter validates this rank's call alone and leaves the cross-rank checks to
/// the reduce-scatter it runs: a scatter dim that differs across ranks while the moved products
/// have the same shape is accepted (each rank scatters its own dim).
#[derive(Default)]
pub struct MmRsValidatedLocally;

impl Bug for MmRsValidatedLocally {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let be = &*m.s.inner;
        let ins = input_descs(be, a, std::slice::from_ref(b));
        let d = describe(CallOp::FusedMatmulReduceScatter, be.rank(), ins.clone(), Some(op), dim, sc);
        concord_core::validate_local(&d, be.world_size(), &be.capabilities())
            .map_err(|e| e.into_error("fused_matmul_reduce_scatter", 0, be.rank()))?;
        let plan = MatmulRsPlan::new(be.world_size(), &ins[0], &ins[1], op, dim, sc);
        let c = plan.product(&be.download(a)?, &be.download(b)?, sc);
        let work = be.reduce_scatter_tensor(&be.upload(&move_to_front(&c, dim))?, op)?;
        let out = be.upload(&move_from_front(&be.download(work.wait(BUG_WAIT)?)?, dim))?;
        Ok(m.s.done(out, "fused_matmul_reduce_scatter"))
    }
}

/// The pipelined all-gather-matmul waits for the first peer's shard only and takes the others
/// as landed (shards assumed to arrive in rank order): a later peer's shard is multiplied
/// before it has arrived.
#[derive(Default)]
pub struct AgMatmulTrustsArrivalOrder;

impl Bug for AgMatmulTrustsArrivalOrder {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, crate::bugs::AgKnobs { wait_first_only: true, ..AG_RIGHT })
    }
}

/// The low-contention ops run to completion inside the call (allowed) and return a ready work
/// made outside the registry: it never counts in `outstanding()`.
#[derive(Default)]
pub struct LowContentionUncounted {
    hidden: OutstandingCounter,
}

impl Bug for LowContentionUncounted {
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        let w = concord_core::fused::decomposed_low_contention(m, x, op)?;
        let meta = w.meta().clone();
        Ok(Work::done(w.into_value(BUG_WAIT)?, meta, &self.hidden))
    }
}

/// The low-contention all-gather returns its result in a persistent workspace per (dtype,
/// shape) (a symmetric-memory buffer): the next call with that shape overwrites the tensor an
/// earlier call returned.
#[derive(Default)]
pub struct LowContentionGatherWorkspace {
    workspace: Mutex<HashMap<(DType, Vec<usize>), Buf>>,
}

impl Bug for LowContentionGatherWorkspace {
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        let w = concord_core::fused::decomposed_low_contention(m, x, op)?;
        if op.is_some() {
            return Ok(w);
        }
        let be = &*m.s.inner;
        let got = w.into_value(BUG_WAIT)?;
        let key = (be.buffer_dtype(&got), be.buffer_shape(&got));
        let buf = {
            let mut spaces = lock(&self.workspace);
            match spaces.get(&key) {
                Some(b) => b.clone(),
                None => spaces.entry(key.clone()).or_insert(be.alloc(key.0, &key.1)?).clone(),
            }
        };
        be.write(&buf, &be.download(&got)?)?;
        Ok(m.s.done(buf, "low_contention_all_gather"))
    }
}

// ---------------------------------------------------------------- subgroups: issue, progress

/// True on a communicator `new_group` made (its members are not the world in order).
fn made_by_new_group(s: &Shm) -> bool {
    s.in_subgroup() || s.members.iter().enumerate().any(|(i, &m)| i != m)
}

/// A new group connects lazily: its first op (any op) blocks at issue until every member has
/// issued its own first op (a handshake), and fails with a timeout after 15 s.
#[derive(Default)]
pub struct GroupFirstOpConnectsAtIssue {
    connected: AtomicBool,
}

impl GroupFirstOpConnectsAtIssue {
    fn connect(&self, s: &Shm, op: &str) -> Result<()> {
        if !made_by_new_group(s) || self.connected.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let t0 = Instant::now();
        match s.inner.barrier()?.wait(BUG_WAIT) {
            Ok(_) => Ok(()),
            Err(CollectiveError::Timeout { .. }) => Err(timeout(s, op, t0.elapsed(), "connecting the new group: not every member issued")),
            Err(e) => Err(e),
        }
    }
}

impl Bug for GroupFirstOpConnectsAtIssue {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s, "all_reduce")?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s, "all_reduce")?;
        s.inner.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.connect(s, "all_reduce")?;
        s.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.connect(s, "all_reduce")?;
        s.inner.all_reduce_coalesced_(xs, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.connect(s, "all_gather_into_tensor")?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.connect(s, "all_gather_into_tensor")?;
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.connect(s, "all_gather_into_tensor")?;
        s.inner.all_gather_into_tensor_coalesced(xs)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.connect(s, "reduce_scatter_tensor")?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.connect(s, "reduce_scatter_tensor")?;
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.connect(s, "reduce_scatter_tensor")?;
        s.inner.reduce_scatter_tensor_coalesced(xs, op)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.connect(s, "all_to_all_single")?;
        s.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.connect(s, "broadcast")?;
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.connect(s, "broadcast")?;
        s.inner.broadcast_(x, src)
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.connect(s, "permute_tensor")?;
        s.inner.permute_tensor(x, src_dst)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.connect(s, "reduce")?;
        s.inner.reduce(x, op, root)
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.connect(s, "gather")?;
        s.inner.gather(x, root)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.connect(s, "scatter")?;
        s.inner.scatter(x, root)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.connect(s, "send")?;
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.connect(s, "recv")?;
        s.inner.recv(out, src)
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.connect(s, "barrier")?;
        s.inner.barrier()
    }
}

/// Only the world communicator keeps the in-flight record: a group made by `new_group` takes
/// its collectives off it as soon as they are issued, so a rank hung in a subgroup's op reports
/// itself idle.
#[derive(Default)]
pub struct GroupOpsUnrecorded;

impl Bug for GroupOpsUnrecorded {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !made_by_new_group(s) {
            return s.inner.all_reduce(x, op);
        }
        unrecorded(|| s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !made_by_new_group(s) {
            return s.inner.all_reduce_(x, op);
        }
        unrecorded(|| s.inner.all_reduce_(x, op))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if !made_by_new_group(s) {
            return s.inner.broadcast(x, src);
        }
        unrecorded(|| s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if !made_by_new_group(s) {
            return s.inner.broadcast_(x, src);
        }
        unrecorded(|| s.inner.broadcast_(x, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if !made_by_new_group(s) {
            return s.inner.barrier();
        }
        unrecorded(|| s.inner.barrier())
    }
}

// ---------------------------------------------------------------- p2p.matching

/// The world communicator of this process, as the last `new_group` called on it saw it.
static WORLD: Mutex<Option<std::sync::Weak<concord_shm::ShmBackend>>> = Mutex::new(None);

/// A group's send / recv ride the world's connection to the same process, with no tag for the
/// communicator (one channel per pair of processes): a group message and a world message
/// between the same two ranks match each other's receives, in issue order.
#[derive(Default)]
pub struct GroupP2pOnWorldChannel;

impl GroupP2pOnWorldChannel {
    /// The world communicator and the world rank of group peer `peer`, in a group.
    fn channel(s: &Shm, peer: usize) -> Option<(Arc<concord_shm::ShmBackend>, usize)> {
        if !made_by_new_group(s) || peer >= s.ws() || peer == s.rank() {
            return None;
        }
        let world = lock(&WORLD).as_ref().and_then(std::sync::Weak::upgrade)?;
        Some((world, s.members[peer]))
    }
}

impl Bug for GroupP2pOnWorldChannel {
    fn new_group(&self, s: &Shm, made: Option<crate::Group>) -> Option<crate::Group> {
        if !made_by_new_group(s) {
            *lock(&WORLD) = Some(Arc::downgrade(&s.inner));
        }
        made
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        match Self::channel(s, dst) {
            Some((world, to)) => {
                let w = Arc::new(world.send(x, to)?);
                let meta = w.meta().clone();
                Ok(Work::new((), Arc::new(Relay(w)), meta, &s.own))
            }
            None => s.inner.send(x, dst),
        }
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        match Self::channel(s, src) {
            Some((world, from)) => {
                let w = Arc::new(world.recv(out, from)?);
                let meta = w.meta().clone();
                Ok(Work::new(out.clone(), Arc::new(Relay(w)), meta, &s.own))
            }
            None => s.inner.recv(out, src),
        }
    }
}

// ---------------------------------------------------------------- failure.usable_after

/// A completion that notes a bad-input failure of a send / recv against its peer.
struct NotePeer<T> {
    inner: Work<T>,
    peer: usize,
    failed: Arc<Mutex<HashMap<usize, CollectiveError>>>,
}

impl<T: Send + Sync> Completion for NotePeer<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |e| {
            if e.bad_input_kind().is_some() {
                lock(&self.failed).insert(self.peer, e.clone());
            }
        })
    }
}

/// A send / recv pair refused as bad input leaves its error in the peer's connection slot: the
/// next send or recv with that peer returns that stale error at issue (once), instead of
/// running.
#[derive(Default)]
pub struct P2pErrorLeftInPeerSlot {
    failed: Arc<Mutex<HashMap<usize, CollectiveError>>>,
    hidden: OutstandingCounter,
}

impl P2pErrorLeftInPeerSlot {
    fn noted<T: Clone + Send + Sync + 'static>(&self, peer: usize, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        if let Some(e) = lock(&self.failed).remove(&peer) {
            return Err(e);
        }
        let w = issue()?;
        let (v, meta) = (w.peek().clone(), w.meta().clone());
        Ok(Work::new(v, Arc::new(NotePeer { inner: w, peer, failed: self.failed.clone() }), meta, &self.hidden))
    }
}

impl Bug for P2pErrorLeftInPeerSlot {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.noted(dst, || s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.noted(src, || s.inner.recv(out, src))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<LargeSendOvertaken>(
            "large_send_overtaken",
            "p2p.order",
            "sends of 256 KiB or more are parked for a rendezvous path: a small send issued after a large one to the same peer overtakes it",
            &["p2p::in_flight_in_order::mixed_protocols::ws2"],
        ),
        spec::<SendWindowBlocksAtIssue>(
            "send_window_blocks_at_issue",
            "p2p.no_deadlock",
            "a credit window of 64 sends per peer: the 65th send in flight blocks at issue, so 65+ sends both ways before any receive deadlock",
            &["p2p::in_flight_in_order::same_size::n80::ws2"],
        ),
        spec::<RecvFromSelfNoop>(
            "recv_from_self_noop",
            "bad_input.named_everywhere",
            "a receive from the caller itself completes at once from an empty loop-back queue (out untouched) instead of bad_input:bad_peer",
            &["bad_input::recv_from_self::ws2"],
        ),
        spec::<RsOutDtypeCast>(
            "rs_out_dtype_cast",
            "bad_input.named_everywhere",
            "reduce_scatter_tensor_out checks its output's size but not its dtype: the result is cast into an output of another dtype",
            &["bad_input::reduce_scatter_out_wrong_dtype::ws2"],
        ),
        spec::<A2aOutputSplitsZipped>(
            "a2a_output_splits_zipped",
            "bad_input.named_everywhere",
            "all_to_all_single zips the peers with the output splits: a list of the wrong length is cut or zero-padded, no bad_splits",
            &["bad_input::all_to_all_output_splits_wrong_length::ws2"],
        ),
        spec::<ScaledGatherDimClamped>(
            "scaled_gather_dim_clamped",
            "fused.bad_input",
            "the scaled all-gather-matmul clamps a gather dim past the last dim to the last dim before validating (the unscaled op checks it)",
            &["fused::bad_input::scaled_invalid_gather_dim::ws1", "fused::bad_input::scaled_invalid_gather_dim::ws2"],
        ),
        spec::<MmRsValidatedLocally>(
            "mm_rs_validated_locally",
            "fused.bad_input",
            "matmul-reduce-scatter validates its own rank's call only: a scatter dim differing across ranks with equal product shapes is accepted",
            &["fused::bad_input::scatter_dim_differs::ws2"],
        ),
        spec::<AgMatmulTrustsArrivalOrder>(
            "ag_matmul_trusts_arrival_order",
            "fused.pipelined_order",
            "the pipelined all-gather-matmul waits for the first peer's shard only and multiplies the later peers' before they land",
            &[
                "fused::all_gather_matmul::dim1::f32::exact::ws3",
                "fused::all_gather_matmul::dim0::f32::exact::ws4",
                "fused::all_gather_matmul::dim2::f32::large::ws8",
            ],
        ),
        spec::<LowContentionUncounted>(
            "low_contention_uncounted",
            "fused.buffers",
            "the low-contention ops complete inside the call and return a ready work outside the registry: never counted in outstanding()",
            &["fused::low_contention_reduce_scatter::dim0::f32::sum::in_flight_twice::ws2"],
        ),
        spec::<LowContentionGatherWorkspace>(
            "low_contention_gather_workspace",
            "fused.buffers",
            "the low-contention all-gather returns a per-shape workspace: the next call with that shape overwrites an earlier call's result",
            &["fused::low_contention_all_gather::dim0::f32::outputs_kept::ws2"],
        ),
        spec::<GroupFirstOpConnectsAtIssue>(
            "group_first_op_connects_at_issue",
            "async.issue_returns",
            "a new group connects lazily: its first op blocks at issue until every member has issued its own first op",
            &["async::issue_returns_at_once::fresh_group::ws3"],
        ),
        spec::<GroupOpsUnrecorded>(
            "group_ops_unrecorded",
            "progress.recorded",
            "only the world communicator keeps the in-flight record: a rank hung in a subgroup's op reports itself idle",
            &["async::peer_never_joins_op_recorded_in_flight::subgroup::ws3"],
        ),
        spec::<GroupP2pOnWorldChannel>(
            "group_p2p_on_world_channel",
            "p2p.matching",
            "a group's send / recv ride the world's channel to the same process untagged: group and world messages between two ranks match each other's receives",
            &["p2p::group_and_world_messages_apart::ws2"],
        ),
        spec::<P2pErrorLeftInPeerSlot>(
            "p2p_error_left_in_peer_slot",
            "failure.usable_after",
            "a send / recv pair refused as bad input leaves its error in the peer's slot: the next send or recv with that peer fails with it",
            &["bad_input::send_recv_dtype_mismatch::ws2"],
        ),
    ]
}
