//! The thirty-ninth hunt: bugs from the wild in how a backend meets its CALLER's threads: works
//! issued on one thread and waited on another, one work waited by two threads at once, a
//! communicator used from a thread other than the one that set it up. Each ports a bug that
//! shipped in a collective or communication library or its framework layer (PyTorch's c10d
//! functional collectives, Open MPI's request layer, UCX, vLLM's Mooncake connector), found in
//! the project's issue or pull-request thread named on its type: a work registry kept per
//! thread, a second waiter that trips an assertion, a request freed by each of two waiters, a
//! wake-up that reaches one waiter only, a device bound per thread. The trigger (a second
//! thread; two waiters inside one wait when the op completes) is kept as far as a wrapper over
//! shm can reproduce it.

use crate::bugs_hunt33::{wrap_every_op, Own};
use crate::campaign::{spec, Spec};
use crate::{lock, relay_wait, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Work, WorldInfo};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- pytorch/pytorch PR #171614

thread_local! {
    /// This thread's work registry ([`WorkRegistryPerThread`]): the ids of the works issued on it
    /// and not yet waited.
    static REGISTRY: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
}

/// Ids of registered works (unique in the process).
static NEXT_WORK: AtomicU64 = AtomicU64::new(1);

/// A work registry per thread (pytorch/pytorch PR #171614 "[c10d] Fix cross-thread work registry
/// lookup in wait_tensor", issue #160833: the functional collectives register each op's work in
/// `RankLocal<WorkRegistry>::get()`, which is the *calling thread's* registry; "Pass tensor to
/// Thread B ... tensor.wait() called ... Returns Thread B's registry (which is EMPTY!)", so
/// `wait_tensor` pops nothing and returns at once, and thread B reads a result the collective has
/// not written). Here every op's work is registered in the issuing thread's registry and its wait
/// pops it from the waiting thread's: on the issuing thread it waits as it should (a wait that
/// times out registers it again), on any other thread it finds nothing and returns `Ok` at once.
#[derive(Default)]
pub struct WorkRegistryPerThread;

/// A work found through the waiting thread's registry ([`WorkRegistryPerThread`]).
struct Registered {
    own: Arc<dyn Completion>,
    id: u64,
}

impl Completion for Registered {
    fn is_completed(&self) -> bool {
        self.own.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let found = REGISTRY.try_with(|r| r.borrow_mut().remove(&self.id)).unwrap_or(false);
        if !found {
            // `pop_work` found no work for the tensor: wait_tensor treats it as already waited.
            return Ok(true);
        }
        let r = self.own.wait_for(timeout);
        if matches!(r, Ok(false)) {
            let _ = REGISTRY.try_with(|reg| reg.borrow_mut().insert(self.id));
        }
        r
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let _ = REGISTRY.try_with(|r| r.borrow_mut().remove(&self.id));
    }
}

impl WorkRegistryPerThread {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let id = NEXT_WORK.fetch_add(1, Ordering::SeqCst);
        let _ = REGISTRY.try_with(|r| r.borrow_mut().insert(id));
        s.relayed(value, Arc::new(Registered { own: Arc::new(Own(w)), id }), meta)
    }
}

wrap_every_op!(WorkRegistryPerThread);

// ---------------------------------------------------------------- open-mpi/ompi #11965

/// A second waiter that trips the request's assertion (open-mpi/ompi #11965 "Multi-thread wait
/// can result in an assert failure": "When multiple threads are waiting on the same request, only
/// the first one is blocked and the other threads fails on an assertion" in
/// `ompi_request_wait_completion`: the first waiter swaps its sync object into `req_complete`,
/// the second one's compare-and-swap fails and it asserts `REQUEST_COMPLETE(req)`). Here a work's
/// wait installs its waiter while the op is pending; a wait from another thread meanwhile fails
/// at once with the assertion, a named backend error, instead of waiting.
#[derive(Default)]
pub struct SecondWaiterAsserts;

/// A work whose pending wait holds the request's one sync slot ([`SecondWaiterAsserts`]).
struct OneSync<T> {
    inner: Work<T>,
    waiting: Mutex<bool>,
}

impl<T: Send + Sync> Completion for OneSync<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if !self.inner.is_completed() {
            let mut w = lock(&self.waiting);
            if *w {
                return Err(CollectiveError::Backend(format!(
                    "{} #{}: ompi_request_wait_completion: Assertion `REQUEST_COMPLETE(req)' failed (another thread's wait sync object holds req_complete)",
                    self.inner.meta().op,
                    self.inner.meta().seq
                )));
            }
            *w = true;
        }
        let r = relay_wait(&self.inner, timeout, |_| {});
        *lock(&self.waiting) = false;
        r
    }
}

impl SecondWaiterAsserts {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        s.relayed(value, Arc::new(OneSync { inner: w, waiting: Mutex::new(false) }), meta)
    }
}

wrap_every_op!(SecondWaiterAsserts);

// ---------------------------------------------------------------- open-mpi/ompi PR #11966

/// A request object of a communicator's free list ([`RequestFreedTwice`]): `done` once the op
/// it was taken for completed.
#[derive(Default)]
struct Req {
    done: AtomicBool,
}

type FreeList = Arc<Mutex<Vec<Arc<Req>>>>;

/// A request freed by each waiter that saw it complete (open-mpi/ompi PR #11966 "Fix multithread
/// request wait", the second fix: "ensure request free is only called once on each request in
/// ompi/request/req_wait.c:ompi_request_default_wait"; with several threads in `MPI_Wait` on one
/// request, each one that saw it complete called `ompi_request_free`, returning the request to
/// the free list once per waiter). Here each op takes a request object from its communicator's
/// free list, and a wait that saw the op complete returns the object to the list. With one
/// waiter that is right; with two threads inside the wait when the op completes, the object is
/// on the list twice, so the next two ops share it: once the first of them completes, the
/// second reads done (its `is_completed()` true, its wait `Ok` at once) before its own peers
/// have arrived, with its result not written.
#[derive(Default)]
pub struct RequestFreedTwice {
    free: FreeList,
}

/// A work completed through its request object ([`RequestFreedTwice`]).
struct Pooled<T> {
    inner: Work<T>,
    req: Arc<Req>,
    free: FreeList,
}

impl<T> Pooled<T> {
    fn release(&self) {
        lock(&self.free).push(self.req.clone());
    }
}

impl<T: Send + Sync> Completion for Pooled<T> {
    fn is_completed(&self) -> bool {
        self.req.done.load(Ordering::SeqCst) || self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if self.req.done.load(Ordering::SeqCst) {
            self.release();
            return Ok(true);
        }
        let done = relay_wait(&self.inner, timeout, |_| {})?;
        if done {
            self.req.done.store(true, Ordering::SeqCst);
            self.release();
        }
        Ok(done)
    }
}

impl RequestFreedTwice {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let req = lock(&self.free).pop().unwrap_or_default();
        req.done.store(false, Ordering::SeqCst);
        s.relayed(value, Arc::new(Pooled { inner: w, req, free: self.free.clone() }), meta)
    }
}

wrap_every_op!(RequestFreedTwice);

// ---------------------------------------------------------------- openucx/ucx PR #3852

/// A communicator's progress engine and its wake-up event ([`WorkerWaitWakesOne`]).
#[derive(Default)]
struct Worker {
    progressing: Mutex<bool>,
    event: Condvar,
}

/// A completion event that wakes one waiter (openucx/ucx PR #3852 "UCP: remove locking from
/// ucp_worker_wait": "calling `ucp_worker_wait` from multiple threads may have unpredictable
/// behavior for threads 2,... (e.g. one thread will wake up, while others won't). So at least
/// one thread will wake up"). Here the first thread to wait a work of a communicator progresses
/// it (the worker's event is armed for it and it drains the event when woken); a thread that
/// waits meanwhile, on the same work or another of the communicator, sleeps on the worker's
/// event, which nobody signals again: it wakes at its own deadline, whenever the op completed,
/// and only then reads the op's state (`Ok` if it completed, a timeout if not).
#[derive(Default)]
pub struct WorkerWaitWakesOne {
    worker: Arc<Worker>,
}

/// A work waited through its communicator's worker ([`WorkerWaitWakesOne`]).
struct OnWorker<T> {
    inner: Work<T>,
    worker: Arc<Worker>,
}

impl<T: Send + Sync> Completion for OnWorker<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if self.inner.is_completed() {
            return relay_wait(&self.inner, timeout, |_| {});
        }
        let deadline = Instant::now() + timeout;
        let mut progressing = lock(&self.worker.progressing);
        if !*progressing {
            *progressing = true;
            drop(progressing);
            let r = relay_wait(&self.inner, timeout, |_| {});
            // The event this thread was woken by is drained: no other sleeper is signalled.
            *lock(&self.worker.progressing) = false;
            return r;
        }
        // Another thread progresses the worker: sleep on its event until this wait's deadline.
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            progressing = self.worker.event.wait_timeout(progressing, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(progressing);
        relay_wait(&self.inner, Duration::ZERO, |_| {})
    }
}

impl WorkerWaitWakesOne {
    fn wrap<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        s.relayed(value, Arc::new(OnWorker { inner: w, worker: self.worker.clone() }), meta)
    }
}

wrap_every_op!(WorkerWaitWakesOne);

// ---------------------------------------------------------------- vllm-project/vllm PR #39548

thread_local! {
    /// The device current on this thread ([`DevicePerThread`]): set where the backend set it up,
    /// `None` (device 0) on any other thread.
    static CURRENT_DEVICE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A device bound per thread (vllm-project/vllm PR #39548 "[Bugfix][Mooncake] Fix thread-local
/// CUDA context for NVLink transfers in _send_blocks": "`_send_blocks()` runs on a
/// `ThreadPoolExecutor` thread, but CUDA device selection is **thread-local** — a pool thread
/// defaults to device 0 ... TP0: works by accident ... TP1/TP2/TP3: fail because the pool
/// thread's CUDA context is on device 0, while the KV cache memory lives on device 1/2/3"; the
/// transfer engine's IPC calls are tied to the calling thread's current device). Here the
/// backend sets its rank's device current on the thread that initialised it, and an op that
/// moves data opens its peers' memory on the calling thread's current device: on a thread where
/// nothing set it (device 0) every rank but rank 0 fails the op with a named backend error.
#[derive(Default)]
pub struct DevicePerThread;

impl DevicePerThread {
    fn on_device(s: &Shm) -> Result<()> {
        let current = CURRENT_DEVICE.try_with(Cell::get).ok().flatten().unwrap_or(0);
        if current == s.world_rank {
            return Ok(());
        }
        Err(CollectiveError::Backend(format!(
            "cudaIpcOpenMemHandle: invalid device context: this thread's current device is {current} (a thread the backend did not set up starts on device 0), the buffers live on device {}",
            s.world_rank
        )))
    }
}

impl Bug for DevicePerThread {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        let _ = CURRENT_DEVICE.try_with(|d| d.set(Some(world.local_rank())));
        Ok(world.clone())
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.all_reduce_(x, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.all_gather_into_tensor(x)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.broadcast_(x, src)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.all_to_all_single(x, o, i)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Self::on_device(s)?;
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::on_device(s)?;
        s.inner.recv(out, src)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<WorkRegistryPerThread>(
            "wild_work_registry_per_thread",
            "async.caller_threads",
            "pytorch/pytorch PR #171614: works are registered in the issuing thread's registry; a wait on another thread finds nothing and returns Ok at once, before the op completed",
            &["async::wait_zero_polls::ws2"],
        ),
        spec::<SecondWaiterAsserts>(
            "wild_second_waiter_asserts",
            "async.caller_threads",
            "open-mpi/ompi#11965: a second thread waiting a pending work fails at once on an assertion (the first waiter's sync object holds the request)",
            &["async::wait_from_another_thread::ws2"],
        ),
        spec::<RequestFreedTwice>(
            "wild_request_freed_twice",
            "async.caller_threads",
            "open-mpi/ompi PR #11966: every waiter that saw a work complete frees its request object; two waiters free it twice and the next two ops share it: the later one reads done before its peers arrived",
            &["async::two_threads_wait_one_work::ws2"],
        ),
        spec::<WorkerWaitWakesOne>(
            "wild_worker_wait_wakes_one",
            "async.caller_threads",
            "openucx/ucx PR #3852: a second thread waiting a communicator's work sleeps on the worker's event, which only the progressing thread gets: it wakes at its own deadline, long after the op completed",
            &["async::two_threads_wait_one_work::ws2"],
        ),
        spec::<DevicePerThread>(
            "wild_device_per_thread",
            "async.caller_threads",
            "vllm-project/vllm PR #39548: the backend binds its rank's device on the thread that set it up; an op from any other thread runs on device 0 and fails on every rank but rank 0",
            &["async::issue_on_one_thread_run_on_another::ws2"],
        ),
    ]
}
