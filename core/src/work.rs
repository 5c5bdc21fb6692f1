//! Pending collectives. Every collective returns a [`Work`] at once; its result is final only
//! after [`Work::wait`] returns `Ok`.
//!
//! Contracts:
//! * `wait` MUST return within its timeout (a named [`CollectiveError::Timeout`] otherwise).
//! * Waiting twice is harmless and returns the same outcome.
//! * Each `Work` counts as outstanding in its backend's [`OutstandingCounter`] until waited
//!   successfully or dropped; dropping an un-waited `Work` warns and never blocks.

use crate::error::{CollectiveError, Result};
use crate::progress;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The completion side of a pending collective, implemented by each backend.
pub trait Completion: Send + Sync {
    /// True once the result is final (or the op has failed).
    fn is_completed(&self) -> bool;
    /// Blocks until completion or until `timeout` has passed. `Ok(true)`: completed successfully;
    /// `Ok(false)`: still pending after `timeout`; `Err`: the collective failed.
    fn wait_for(&self, timeout: Duration) -> Result<bool>;
}

/// A completion that is already done (fake backend, ops that complete synchronously).
pub struct Done;
impl Completion for Done {
    fn is_completed(&self) -> bool {
        true
    }
    fn wait_for(&self, _: Duration) -> Result<bool> {
        Ok(true)
    }
}

/// A completion that has already failed with `0`.
pub struct Failed(pub CollectiveError);
impl Completion for Failed {
    fn is_completed(&self) -> bool {
        true
    }
    fn wait_for(&self, _: Duration) -> Result<bool> {
        Err(self.0.clone())
    }
}

/// A one-shot completion flag a backend's progress thread sets, with condvar wake-up.
#[derive(Default)]
pub struct Flag {
    state: Mutex<Option<Result<()>>>,
    cv: std::sync::Condvar,
}

impl Flag {
    pub fn new() -> Arc<Flag> {
        Arc::new(Flag::default())
    }
    /// Marks the op complete (`Ok`) or failed. Later calls are ignored.
    pub fn set(&self, outcome: Result<()>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(outcome);
            self.cv.notify_all();
        }
    }
}

impl Completion for Flag {
    fn is_completed(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(outcome) = &*s {
                return outcome.clone().map(|_| true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            s = self.cv.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Number of issued-but-not-waited works of one backend instance (PyTorch's work registry).
#[derive(Clone, Default, Debug)]
pub struct OutstandingCounter(Arc<AtomicUsize>);
impl OutstandingCounter {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Which collective a [`Work`] belongs to, for error messages.
#[derive(Clone, Debug)]
pub struct WorkMeta {
    pub backend: String,
    pub op: String,
    pub seq: u64,
    pub rank: usize,
}

/// A pending collective and the value it will produce.
pub struct Work<T> {
    value: Option<T>,
    completion: Arc<dyn Completion>,
    meta: WorkMeta,
    counter: OutstandingCounter,
    counted: AtomicBool,
    outcome: Mutex<Option<Result<()>>>,
}

impl<T> Work<T> {
    pub fn new(value: T, completion: Arc<dyn Completion>, meta: WorkMeta, counter: &OutstandingCounter) -> Work<T> {
        counter.0.fetch_add(1, Ordering::SeqCst);
        Work { value: Some(value), completion, meta, counter: counter.clone(), counted: AtomicBool::new(true), outcome: Mutex::new(None) }
    }

    /// A work that is complete at once.
    pub fn done(value: T, meta: WorkMeta, counter: &OutstandingCounter) -> Work<T> {
        Work::new(value, Arc::new(Done), meta, counter)
    }

    pub fn meta(&self) -> &WorkMeta {
        &self.meta
    }

    pub fn is_completed(&self) -> bool {
        self.completion.is_completed()
    }

    fn uncount(&self) {
        if self.counted.swap(false, Ordering::SeqCst) {
            self.counter.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits up to `timeout` for the collective; returns the result. Idempotent, and callable
    /// from several threads at once: the blocking wait holds no lock of the work's, so each
    /// waiter gets its own deadline (review14 finding 4); the first outcome seen is recorded once
    /// and the outstanding count moves once.
    pub fn wait(&self, timeout: Duration) -> Result<&T> {
        let recorded = self.outcome.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let outcome = match recorded {
            Some(o) => o,
            None => {
                let start = Instant::now();
                let seen = match self.completion.wait_for(timeout) {
                    Ok(true) => Ok(()),
                    Ok(false) => {
                        return Err(CollectiveError::Timeout {
                            op: self.meta.op.clone(),
                            seq: self.meta.seq,
                            rank: self.meta.rank,
                            waited_ms: start.elapsed().as_millis() as u64,
                            detail: format!("{} backend; this process is {}", self.meta.backend, progress::describe()),
                        })
                    }
                    Err(e) => Err(e),
                };
                // Another waiter may have recorded first: its outcome stands.
                let o = self.outcome.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(seen).clone();
                self.uncount();
                o
            }
        };
        match outcome {
            Ok(()) => Ok(self.value.as_ref().expect("value present until into_value")),
            Err(e) => Err(e),
        }
    }

    /// Waits, then hands the value over.
    pub fn into_value(mut self, timeout: Duration) -> Result<T> {
        self.wait(timeout)?;
        Ok(self.value.take().expect("value present"))
    }

    /// The same pending collective with its value transformed by `f` (at once, not at
    /// completion): for wrappers whose buffer type differs from the inner backend's. Completion,
    /// deadline behaviour, metadata and the outstanding count carry over — the count is moved,
    /// never counted twice.
    pub fn map<U>(mut self, f: impl FnOnce(T) -> U) -> Work<U> {
        let value = self.value.take().map(f);
        let counted = self.counted.swap(false, Ordering::SeqCst);
        let outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
        Work {
            value,
            completion: self.completion.clone(),
            meta: self.meta.clone(),
            counter: self.counter.clone(),
            counted: AtomicBool::new(counted),
            outcome: Mutex::new(outcome),
        }
    }

    /// `value` as a work that completes with this one, counted in `outstanding()` again until
    /// its caller waits or drops it, like any work an op returns: for a backend whose op ran to
    /// completion inside the call (a synchronous decomposition that waited this inner work).
    pub fn counted_again<U>(self, value: U) -> Work<U> {
        let w = self.map(|_| ());
        if !w.counted.swap(true, Ordering::SeqCst) {
            w.counter.0.fetch_add(1, Ordering::SeqCst);
        }
        // Not yet waited by its caller: the first wait looks at the (finished) completion and
        // then uncounts it.
        *w.outcome.lock().unwrap_or_else(|e| e.into_inner()) = None;
        w.map(|()| value)
    }

    /// The same pending collective under another name in messages (a wrapper reporting its own
    /// backend name).
    pub fn with_backend_name(mut self, name: &str) -> Work<T> {
        self.meta.backend = name.to_string();
        self
    }

    /// The value *without* waiting: its contents are not final. For identity checks only.
    pub fn peek(&self) -> &T {
        self.value.as_ref().expect("value present")
    }
}

impl<T> Drop for Work<T> {
    fn drop(&mut self) {
        if self.counted.load(Ordering::SeqCst) {
            if !std::thread::panicking() {
                eprintln!(
                    "concord: warning: {} #{} on rank {} ({} backend) dropped without wait",
                    self.meta.op, self.meta.seq, self.meta.rank, self.meta.backend
                );
            }
            self.uncount();
        }
    }
}

/// PyTorch's `AsyncCollectiveTensor`: waits on first read, exposes `completed()`.
pub struct AsyncResult<T> {
    work: Work<T>,
    timeout: Duration,
    read: AtomicBool,
}

impl<T> AsyncResult<T> {
    pub fn new(work: Work<T>, timeout: Duration) -> Self {
        AsyncResult { work, timeout, read: AtomicBool::new(false) }
    }
    /// True once the value has been read (and so waited), like `AsyncCollectiveTensor.completed`.
    pub fn completed(&self) -> bool {
        self.read.load(Ordering::SeqCst)
    }
    /// Reads the value, waiting for it first if this is the first read.
    pub fn get(&self) -> Result<&T> {
        let v = self.work.wait(self.timeout)?;
        self.read.store(true, Ordering::SeqCst);
        Ok(v)
    }
    pub fn work(&self) -> &Work<T> {
        &self.work
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> WorkMeta {
        WorkMeta { backend: "test".into(), op: "all_reduce".into(), seq: 3, rank: 1 }
    }

    #[test]
    fn pending_work_times_out_with_a_named_error_then_completes() {
        let counter = OutstandingCounter::default();
        let flag = Flag::new();
        let w = Work::new(7u32, flag.clone(), meta(), &counter);
        assert_eq!(counter.get(), 1);
        assert!(!w.is_completed());
        let err = w.wait(Duration::from_millis(20)).unwrap_err();
        assert_eq!(err.name(), "timeout");
        assert!(err.to_string().contains("all_reduce #3 on rank 1"), "{err}");
        assert_eq!(counter.get(), 1, "a timed-out wait leaves the work outstanding");
        flag.set(Ok(()));
        assert_eq!(*w.wait(Duration::from_secs(1)).unwrap(), 7);
        assert_eq!(*w.wait(Duration::from_secs(1)).unwrap(), 7, "waiting twice is harmless");
        assert_eq!(counter.get(), 0);
    }

    #[test]
    fn a_waited_work_counted_again_counts_until_its_own_wait() {
        let counter = OutstandingCounter::default();
        let inner = Work::done(1u32, meta(), &counter);
        assert_eq!(*inner.wait(Duration::from_secs(1)).unwrap(), 1);
        assert_eq!(counter.get(), 0);
        let outer = inner.counted_again("result");
        assert_eq!(counter.get(), 1, "the caller has not waited it yet");
        assert!(outer.is_completed());
        assert_eq!(*outer.wait(Duration::from_secs(1)).unwrap(), "result");
        assert_eq!(counter.get(), 0);
        drop(outer);
        assert_eq!(counter.get(), 0, "no double uncount");
        let never_waited = Work::done(2u32, meta(), &counter).counted_again(());
        assert_eq!(counter.get(), 1, "an unwaited inner work is not counted twice");
        drop(never_waited);
        assert_eq!(counter.get(), 0);
    }

    #[test]
    fn map_keeps_completion_and_moves_the_count() {
        let counter = OutstandingCounter::default();
        let flag = Flag::new();
        let w = Work::new(7u32, flag.clone(), meta(), &counter).map(|v| format!("v{v}")).with_backend_name("wrapped");
        assert_eq!(counter.get(), 1, "mapping does not count twice");
        assert!(!w.is_completed(), "the mapped work is as pending as the original");
        let err = w.wait(Duration::from_millis(10)).unwrap_err();
        assert!(err.to_string().contains("wrapped backend"), "{err}");
        flag.set(Ok(()));
        assert_eq!(w.wait(Duration::from_secs(1)).unwrap(), "v7");
        assert_eq!(counter.get(), 0);
        let unwaited = Work::new(1u8, Flag::new(), meta(), &counter).map(|v| v + 1);
        assert_eq!(counter.get(), 1);
        drop(unwaited);
        assert_eq!(counter.get(), 0, "dropping the mapped work uncounts once");
    }

    #[test]
    fn failed_work_reports_its_error_every_time_and_drop_uncounts() {
        let counter = OutstandingCounter::default();
        let flag = Flag::new();
        flag.set(Err(CollectiveError::Aborted("x".into())));
        let w = Work::new((), flag, meta(), &counter);
        assert!(w.wait(Duration::from_secs(1)).is_err());
        assert!(w.wait(Duration::from_secs(1)).is_err());
        let dropped = Work::new((), Flag::new(), meta(), &counter);
        assert_eq!(counter.get(), 1);
        drop(dropped);
        assert_eq!(counter.get(), 0);
    }

    /// review14 finding 4: `Work<T>` is `Sync`, so two threads may wait one work (a watchdog
    /// polling `wait(0)` beside the owner's long wait). The second waiter MUST get its own
    /// deadline, not the first one's: `wait` must not hold a lock across the blocking wait.
    #[test]
    fn a_second_waiter_gets_its_own_deadline() {
        let counter = OutstandingCounter::default();
        let flag = Flag::new();
        let w = Work::new(7u32, flag.clone(), meta(), &counter);
        std::thread::scope(|sc| {
            let long = sc.spawn(|| w.wait(Duration::from_secs(3)).copied());
            std::thread::sleep(Duration::from_millis(100));
            let t0 = Instant::now();
            let err = w.wait(Duration::from_millis(50)).unwrap_err();
            let took = t0.elapsed();
            assert_eq!(err.name(), "timeout");
            assert!(took < Duration::from_secs(1), "a 50 ms wait beside another thread's 3 s wait took {took:?}");
            assert_eq!(counter.get(), 1, "a timed-out wait leaves the work outstanding");
            flag.set(Ok(()));
            assert_eq!(long.join().unwrap().unwrap(), 7);
        });
        assert_eq!(*w.wait(Duration::ZERO).unwrap(), 7);
        assert_eq!(counter.get(), 0, "two waits that saw completion uncount once");
    }

    /// Many threads see one completion at once: the outcome is recorded once and the count
    /// moves once.
    #[test]
    fn concurrent_waiters_uncount_once() {
        let counter = OutstandingCounter::default();
        let flag = Flag::new();
        let w = Work::new(1u8, flag.clone(), meta(), &counter);
        let _other = Work::new(2u8, Flag::new(), meta(), &counter);
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..8).map(|_| sc.spawn(|| w.wait(Duration::from_secs(5)).copied())).collect();
            std::thread::sleep(Duration::from_millis(20));
            flag.set(Ok(()));
            for h in hs {
                assert_eq!(h.join().unwrap().unwrap(), 1);
            }
        });
        assert_eq!(counter.get(), 1, "only the other, un-waited work is still counted");
    }

    #[test]
    fn async_result_is_completed_only_after_first_read() {
        let counter = OutstandingCounter::default();
        let r = AsyncResult::new(Work::done(5i64, meta(), &counter), Duration::from_secs(1));
        assert!(!r.completed());
        assert_eq!(*r.get().unwrap(), 5);
        assert!(r.completed());
    }
}
