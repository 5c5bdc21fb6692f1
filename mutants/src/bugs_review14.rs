//! The fourteenth review's blind spots (read-only review14, 2026-11-27): a large in-place op whose
//! completion flag is set before the result is copied back, a dropped receive that is withdrawn,
//! one process-wide engine shared by every communicator, and a completion whose waiters queue
//! behind each other. Each was written here first and run against the whole catalogue before
//! any case was added.

use crate::bugs_hunt4::{flush, Lazy, LazyState, LazyWork};
use crate::campaign::{spec, Spec};
use crate::{lock, relay_wait, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, Completion, OutstandingCounter, ReduceOp, Result, Work};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- finding 1: in-place staging

/// From this many bytes an in-place op goes through a staging buffer (as review8's out-of-place
/// twin).
const STAGED_BYTES: usize = 256 << 10;

/// Finding 1. At 256 KiB or more the in-place ops (`all_reduce_`, `broadcast_`,
/// `all_reduce_coalesced_`) run out of place into a staging buffer (a ring needs a receive
/// buffer): `is_completed()` turns true once staging holds the result, and the copy back into
/// the caller's buffer happens inside `wait`. A caller that polls reads its own stale input
/// (`review8_large_completed_before_copied` on the in-place path). Clause
/// `async.completed_means_final`.
#[derive(Default)]
pub struct InPlaceLargeCompletedBeforeCopied;

fn bytes(s: &Shm, xs: &[Buf]) -> usize {
    xs.iter().map(|x| s.numel(x) * s.inner.buffer_dtype(x).size()).sum()
}

/// `staged` (an out-of-place op's work) as a work over `x`, copied into it only when waited.
fn copied_back(s: &Shm, staged: Work<Buf>, x: &Buf) -> Work<Buf> {
    let target = x.clone();
    s.then_as(staged, x.clone(), move |be, staging| be.write(&target, &be.download(staging)?))
}

impl Bug for InPlaceLargeCompletedBeforeCopied {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if bytes(s, std::slice::from_ref(x)) < STAGED_BYTES {
            return s.inner.all_reduce_(x, op);
        }
        Ok(copied_back(s, s.inner.all_reduce(x, op)?, x))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if bytes(s, std::slice::from_ref(x)) < STAGED_BYTES {
            return s.inner.broadcast_(x, src);
        }
        Ok(copied_back(s, s.inner.broadcast(x, src)?, x))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if bytes(s, xs) < STAGED_BYTES {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        let targets = xs.to_vec();
        Ok(s.then_as(s.inner.all_reduce_coalesced(xs, op)?, xs.to_vec(), move |be, staged| {
            for (t, st) in targets.iter().zip(staged) {
                be.write(t, &be.download(st)?)?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- finding 2: dropped recv withdrawn

/// Finding 2. A receive is posted lazily (at the next issue, wait or poll on the backend: a Rust
/// future not yet polled, rsmpi's cancel-on-drop guard) and its handle cancels it on drop: a
/// caller that issues `irecv`, drops the work and reads `out` after a barrier leaves the message
/// unmatched, and the next receive from that peer takes it (message k lands in receive k+1).
/// Clauses `async.unwaited_exit` ("dropping a work never withdraws its op") and `p2p.matching`.
pub struct DroppedRecvWithdrawn {
    queue: Arc<Mutex<Vec<Arc<Lazy>>>>,
    hidden: OutstandingCounter,
}

/// How often the backend's executor posts the queued receives that were already queued at its
/// previous tick (queued a whole tick at least): a receive dropped within a tick of its issue
/// is always withdrawn, however the dropping thread is scheduled (with a 20 ms tick that posted
/// whatever it found, a rank descheduled between issue and drop on a loaded machine had its
/// receive posted first, and the catch came and went).
const POST_TICK: Duration = Duration::from_millis(500);

impl Default for DroppedRecvWithdrawn {
    fn default() -> Self {
        let queue: Arc<Mutex<Vec<Arc<Lazy>>>> = Arc::default();
        // The executor: every tick, posts (in issue order) what it saw queued at the previous
        // tick, until the communicator is gone.
        let weak = Arc::downgrade(&queue);
        std::thread::spawn(move || {
            let mut seen: Vec<std::sync::Weak<Lazy>> = Vec::new();
            loop {
                std::thread::sleep(POST_TICK);
                let Some(q) = weak.upgrade() else { break };
                let mut g = lock(&q);
                // Entries are in issue order, so those seen at the last tick lead the queue.
                let old = g.iter().take_while(|l| seen.iter().any(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(l)))).count();
                for l in g.drain(..old).collect::<Vec<_>>() {
                    l.post();
                }
                seen = g.iter().map(Arc::downgrade).collect();
            }
        });
        DroppedRecvWithdrawn { queue, hidden: OutstandingCounter::default() }
    }
}

impl DroppedRecvWithdrawn {
    fn post_queued(&self) {
        flush(&self.queue)
    }
}

impl Bug for DroppedRecvWithdrawn {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.post_queued();
        let (be, o) = (s.inner.clone(), out.clone());
        let lazy = Arc::new(Lazy { state: Mutex::new(LazyState::Queued(Box::new(move || be.recv(&o, src)))) });
        lock(&self.queue).push(lazy.clone());
        Ok(Work::new(out.clone(), Arc::new(LazyWork { lazy, queue: self.queue.clone() }), s.meta("recv"), &self.hidden))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.post_queued();
        s.inner.send(x, dst)
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.post_queued();
        s.inner.barrier()
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.post_queued();
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.post_queued();
        s.inner.all_reduce_(x, op)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.post_queued();
        s.inner.broadcast(x, src)
    }
    fn outstanding(&self, s: &Shm) -> usize {
        // Queued receives count too (the registry holds every issued work; a withdrawn one is gone).
        let queued = lock(&self.queue).iter().filter(|l| matches!(*lock(&l.state), LazyState::Queued(_))).count();
        s.inner.outstanding() + s.own.get() + queued
    }
}

// ---------------------------------------------------------------- finding 3: one engine per process

/// Communicator ids of this process (every communicator's bug takes one).
static COMMS: AtomicU64 = AtomicU64::new(0);

/// The process-wide engine: the communicator and the completion of the last op issued on it.
static ENGINE: Mutex<Option<(u64, Weak<dyn Completion>)>> = Mutex::new(None);

/// Finding 3. Every communicator of the process runs on one serial engine (one progress thread,
/// or one CUDA stream for every communicator: the legacy default stream): an op issued on one
/// communicator starts only once the last op of any other communicator has completed. A legal
/// program whose ranks issue on two communicators in different orders deadlocks (rank 0:
/// `G.all_reduce; world.all_reduce`, rank 1: `world.all_reduce`, then `G.all_reduce`). Clause
/// `async.communicators_independent` (`async.every_op_every_rank` across communicators).
/// Here point-to-point goes through the engine too.
pub struct ProcessWideEngine {
    comm: u64,
    hidden: OutstandingCounter,
}

impl Default for ProcessWideEngine {
    fn default() -> Self {
        ProcessWideEngine { comm: COMMS.fetch_add(1, Ordering::SeqCst), hidden: OutstandingCounter::default() }
    }
}

/// A completion relaying `inner`, shared with the engine's record.
struct Engined<T> {
    inner: Work<T>,
}

impl<T: Send + Sync> Completion for Engined<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        relay_wait(&self.inner, timeout, |_| {})
    }
}

/// Waits (the engine's queue) for the last op of any communicator but `comm`.
fn queue_behind(comm: u64, s: &Shm) -> Result<()> {
    let last = lock(&ENGINE).as_ref().filter(|(c, _)| *c != comm).and_then(|(_, w)| w.upgrade());
    if let Some(prev) = last {
        let t0 = Instant::now();
        if !prev.wait_for(BUG_WAIT).unwrap_or(true) {
            return Err(CollectiveError::Timeout {
                op: "collective".into(),
                seq: 0,
                rank: s.rank(),
                waited_ms: t0.elapsed().as_millis() as u64,
                detail: "queued behind another communicator's op on the process's engine".into(),
            });
        }
    }
    Ok(())
}

/// `w` relayed, recorded as the engine's last op if it runs there (`Some(comm)`), counted in
/// `hidden` (the inner work is counted by shm until the relay waits it).
fn engined<T: Clone + Send + Sync + 'static>(comm: Option<u64>, hidden: &OutstandingCounter, w: Work<T>) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    let c: Arc<dyn Completion> = Arc::new(Engined { inner: w });
    if let Some(comm) = comm {
        *lock(&ENGINE) = Some((comm, Arc::downgrade(&c)));
    }
    Work::new(value, c, meta, hidden)
}

every_op!(ProcessWideEngine, |me, s| { queue_behind(me.comm, s)? }, |w| engined(Some(me.comm), &me.hidden, w), {
    fn outstanding(&self, s: &Shm) -> usize {
        // Every work is relayed: the relays' count is the registry.
        self.hidden.get() + s.own.get()
    }
});

/// Finding 3, collectives only: every collective of the process runs on one serial engine (one
/// collective stream for every communicator), while point-to-point has a path of its own (a
/// separate p2p stream, direct copies), so the p2p cases across communicators pass.
pub struct ProcessWideCollectiveEngine {
    comm: u64,
    hidden: OutstandingCounter,
}

impl Default for ProcessWideCollectiveEngine {
    fn default() -> Self {
        ProcessWideCollectiveEngine { comm: COMMS.fetch_add(1, Ordering::SeqCst), hidden: OutstandingCounter::default() }
    }
}

/// The collective hooks of [`ProcessWideCollectiveEngine`]: queued behind the engine, recorded.
macro_rules! on_the_engine {
    ($( fn $name:ident(&self, s: &Shm $(, $a:ident: $t:ty)*) -> $r:ty; )*) => {
        $(
            fn $name(&self, s: &Shm $(, $a: $t)*) -> Result<Work<$r>> {
                queue_behind(self.comm, s)?;
                Ok(engined(Some(self.comm), &self.hidden, s.inner.$name($($a),*)?))
            }
        )*
    };
}

impl Bug for ProcessWideCollectiveEngine {
    on_the_engine! {
        fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Buf;
        fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Buf;
        fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
        fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
        fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Buf;
        fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Buf;
        fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Vec<Buf>;
        fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Buf;
        fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Buf;
        fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Vec<Buf>;
        fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Buf;
        fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Buf;
        fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Buf;
        fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Buf;
        fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Buf;
        fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Buf;
        fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Buf;
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        queue_behind(self.comm, s)?;
        Ok(engined(Some(self.comm), &self.hidden, s.inner.barrier()?))
    }
    // Point-to-point: its own path, not the engine (relayed only to count it with the rest).
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(engined(None, &self.hidden, s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(engined(None, &self.hidden, s.inner.recv(out, src)?))
    }
    fn outstanding(&self, s: &Shm) -> usize {
        // Every work is relayed: the relays' count is the registry.
        self.hidden.get() + s.own.get()
    }
}

// ---------------------------------------------------------------- finding 4: waiters serialised

/// Finding 4. The backend's completion holds its own lock across the blocking wait (a
/// `std::sync::Mutex` around an event's synchronize): while one thread waits with a long
/// timeout, a second thread's `wait(50 ms)` on the same work (a watchdog's poll) blocks for the
/// first one's whole wait. Clause `async.deadline` ("no wait blocks longer than asked").
#[derive(Default)]
pub struct WaitersSerialised {
    hidden: OutstandingCounter,
}

struct OneWaiterAtATime<T> {
    inner: Work<T>,
    gate: Mutex<()>,
}

impl<T: Send + Sync> Completion for OneWaiterAtATime<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let _one = lock(&self.gate);
        relay_wait(&self.inner, timeout, |_| {})
    }
}

fn one_waiter_at_a_time<T: Clone + Send + Sync + 'static>(hidden: &OutstandingCounter, w: Work<T>) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    Work::new(value, Arc::new(OneWaiterAtATime { inner: w, gate: Mutex::new(()) }), meta, hidden)
}

every_op!(WaitersSerialised, |me, s| {}, |w| one_waiter_at_a_time(&me.hidden, w), {
    fn outstanding(&self, s: &Shm) -> usize {
        // Every work is relayed: the relays' count is the registry.
        self.hidden.get() + s.own.get()
    }
});

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<InPlaceLargeCompletedBeforeCopied>(
            "review14_inplace_large_completed_before_copied",
            "async.completed_means_final",
            "at 256 KiB or more all_reduce_ / broadcast_ / all_reduce_coalesced_ run into staging and report is_completed() once staged; the copy back into the caller's buffer happens only in wait",
            &["async::completes_without_wait::every_op::large::ws2"],
        ),
        spec::<DroppedRecvWithdrawn>(
            "review14_dropped_recv_withdrawn",
            "async.unwaited_exit",
            "a recv is posted lazily and withdrawn when its work is dropped before that: the next recv from the peer takes its message",
            &["async::dropped_send_still_delivered::ws2"],
        ),
        spec::<ProcessWideEngine>(
            "review14_process_wide_engine",
            "async.communicators_independent",
            "every communicator of the process runs on one serial engine: an op waits for the last op of any other communicator",
            &["p2p::group_and_world_messages_apart::ws2"],
        ),
        spec::<ProcessWideCollectiveEngine>(
            "review14_process_wide_collective_engine",
            "async.communicators_independent",
            "every collective of the process runs on one serial engine (point-to-point on a path of its own): a collective waits for the last collective of any other communicator",
            &["async::communicators_progress_apart::ws3"],
        ),
        spec::<WaitersSerialised>(
            "review14_waiters_serialised",
            "async.deadline",
            "a work's completion holds its lock across the blocking wait: a second waiter's short wait lasts the first waiter's whole wait",
            &["async::wait_from_another_thread::ws2"],
        ),
    ]
}
