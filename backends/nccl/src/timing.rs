//! Device-side timing for benchmarks (additive: nothing here changes how a collective runs).
//!
//! * [`NcclBackend::mark`] records a timing CUDA event on the rank's shared stream, ordered
//!   after every collective issued before the call and before every collective issued after it
//!   returns. Send / recv run on per-direction streams (`direction`) that marks do not order:
//!   benchmarks time them by the host clock (`concord_bench::Clock::covers_p2p`). Issue is
//!   asynchronous (the progress thread launches), so `mark` first waits, up to the op timeout,
//!   until the progress thread has *launched* every earlier op — a host-side wait on launches,
//!   never on the GPU: the ops may still be running when the event is recorded behind them. It
//!   spins (no sleep) for that, so the event lands right behind the last launch.
//! * [`NcclBackend::elapsed`] is the GPU time between two marks (`cuEventElapsedTime`), waiting
//!   for the later one with a deadline (never without one).
//! * [`NcclBackend::wait_launched`] is that host-side wait alone (for per-phase breakdowns).
//! * [`NcclBackend::keep_pool_memory`] sets the release threshold of the device's default
//!   memory pool, from which out-of-place outputs are allocated stream-ordered: with the CUDA
//!   default (0) every synchronising call returns freed memory to the OS and the next
//!   allocations map it again. Outputs up to 4 MiB mostly come from the device's block cache
//!   instead (`block_cache`), which the threshold does not touch;
//!   [`NcclBackend::alloc_cache_stats`] counts its hits and misses.
//!
//! A bench times a window as nccl-tests does: `mark`, k back-to-back issues, `mark`, then waits
//! and checks outside the window; the window's time is `elapsed(start, end)`.

use crate::cuda::{derr, poll_until, Event};
use crate::NcclBackend;
use concord_core::{progress, CollectiveError, Result};
use cudarc::driver::{result as cu, sys};
use std::time::{Duration, Instant};

/// How long [`NcclBackend::mark`] spins for earlier launches before it sleeps between looks.
const SPIN_MARK: Duration = Duration::from_millis(20);

/// A timing CUDA event recorded on a rank's stream (see [`NcclBackend::mark`]).
pub struct Mark {
    ev: Event,
    recorded: Instant,
}

impl std::fmt::Debug for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mark(recorded {:?} ago)", self.recorded.elapsed())
    }
}

impl NcclBackend {
    fn timing_err(&self, what: &str, e: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("nccl {what} on rank {}: {e}", self.rank))
    }

    /// Waits, up to `timeout`, until the progress thread has launched (or failed) every op
    /// issued before this call. `true` when it has.
    pub fn wait_launched(&self, timeout: Duration) -> bool {
        self.progress.flush(Instant::now() + timeout)
    }

    /// Records a timing event on this rank's stream after every op issued before the call (see
    /// the module docs). Fails named when earlier ops are still not launched at the op timeout.
    pub fn mark(&self) -> Result<Mark> {
        let started = Instant::now();
        self.dev.bind().map_err(|e| self.timing_err("mark", e))?;
        // Spin (no sleep) for the last launch, so that the event follows it on the stream as
        // closely as nccl-tests' does (a late event would count GPU idle time); past SPIN_MARK
        // the host is the bottleneck anyway and the wait sleeps between looks.
        // The spin is gentle (a burst of pause hints between two looks at one counter that
        // only the progress thread writes): a waiter spinning hard competes with the thread it
        // waits for (a hyperthread sibling, a contended cache line).
        let spin_until = started + SPIN_MARK;
        let target = self.progress.submitted();
        let mut launched = false;
        'spin: loop {
            for _ in 0..64 {
                if self.progress.launched_up_to(target) {
                    launched = true;
                    break 'spin;
                }
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
        if !launched && !self.wait_launched(self.op_timeout) {
            return Err(CollectiveError::Timeout {
                op: "mark".into(),
                seq: self.seq.load(std::sync::atomic::Ordering::SeqCst),
                rank: self.rank,
                waited_ms: started.elapsed().as_millis() as u64,
                detail: format!(
                    "ops issued before the timing event were still not launched after {} ms; this process is {}",
                    self.op_timeout.as_millis(),
                    progress::describe()
                ),
            });
        }
        let ev = Event::owned(
            cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(|e| self.timing_err("mark", derr("cuEventCreate", e)))?,
        );
        unsafe { cu::event::record(ev.0, self.dev.stream) }.map_err(|e| self.timing_err("mark", derr("cuEventRecord", e)))?;
        Ok(Mark { ev, recorded: Instant::now() })
    }

    /// GPU time from `start` to `end` (both from [`Self::mark`] of this backend, `start` first).
    /// Waits up to `timeout` for `end` to complete; a timeout is a named error.
    pub fn elapsed(&self, start: &Mark, end: &Mark, timeout: Duration) -> Result<Duration> {
        self.dev.bind().map_err(|e| self.timing_err("elapsed", e))?;
        let deadline = Instant::now() + timeout;
        match end.ev.wait_until(deadline) {
            Ok(true) => {}
            Ok(false) => {
                return Err(CollectiveError::Timeout {
                    op: "elapsed".into(),
                    seq: self.seq.load(std::sync::atomic::Ordering::SeqCst),
                    rank: self.rank,
                    waited_ms: end.recorded.elapsed().as_millis() as u64,
                    detail: format!(
                        "the GPU did not reach the timing event within {} ms; this process is {}",
                        timeout.as_millis(),
                        progress::describe()
                    ),
                })
            }
            Err(e) => return Err(self.timing_err("elapsed", e)),
        }
        // The start event is before `end` on the same stream: complete too.
        let _ = poll_until(deadline, || start.ev.query().ok().filter(|d| *d));
        let ms =
            unsafe { cu::event::elapsed(start.ev.0, end.ev.0) }.map_err(|e| self.timing_err("elapsed", derr("cuEventElapsedTime", e)))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// Turns the progress thread's per-job time breakdown on (`true`) or off and returns what
    /// it measured since the last call: mean microseconds per job of each section (see
    /// `worker::Profile`: the whole job, its NCCL calls, its CUDA event, its bookkeeping).
    pub fn profile_progress(&self, on: bool) -> Vec<(&'static str, f64)> {
        let t = self.progress.tracker();
        let out = t.profile.take();
        t.profile.on.store(on, std::sync::atomic::Ordering::SeqCst);
        out
    }

    /// How this backend's collectives are launched, in words: on a blocking twin of the
    /// non-blocking communicator (the default; see **Fast launch** in the crate docs), on the
    /// non-blocking communicator itself (`fast_launch=0`), or on a blocking communicator
    /// (`blocking=1`, no watchdog for its init).
    pub fn launch_mode(&self) -> &'static str {
        if self.chan.comm.blocking {
            "blocking communicator (blocking=1)"
        } else if self.chan.comm.has_twin() {
            "non-blocking communicator, groups on its blocking twin (the default)"
        } else {
            "non-blocking communicator (fast_launch=0)"
        }
    }

    /// The release threshold of this GPU's default memory pool (see [`Self::keep_pool_memory`]).
    pub fn pool_release_threshold(&self) -> std::result::Result<u64, String> {
        self.pool_threshold(None)
    }

    /// Sets the release threshold of this GPU's default memory pool to `bytes`: freed memory up
    /// to that much stays mapped in the pool for the next stream-ordered allocations (as a
    /// caching allocator does). Returns the previous threshold. `Err` when the device has no
    /// stream-ordered allocator.
    pub fn keep_pool_memory(&self, bytes: u64) -> std::result::Result<u64, String> {
        self.pool_threshold(Some(bytes))
    }

    /// The block cache's hits and misses (allocations on the rank's stream served from it or
    /// not) since the device was made (see `block_cache`; option `alloc_cache=0`: no hits).
    pub fn alloc_cache_stats(&self) -> (u64, u64) {
        self.dev.cache_stats()
    }

    fn pool_threshold(&self, set: Option<u64>) -> std::result::Result<u64, String> {
        if !self.dev.async_alloc {
            return Err("this GPU has no stream-ordered allocator (cuMemAllocAsync)".into());
        }
        self.dev.bind()?;
        let dev = cu::device::get(self.dev.ordinal as i32).map_err(|e| derr("cuDeviceGet", e))?;
        let pool = unsafe { cu::device::get_default_mem_pool(dev) }.map_err(|e| derr("cuDeviceGetDefaultMemPool", e))?;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        let mut old: u64 = 0;
        unsafe { cu::mem_pool::get_attribute(pool, attr, &mut old as *mut u64 as *mut _) }.map_err(|e| derr("cuMemPoolGetAttribute", e))?;
        if let Some(mut new) = set {
            unsafe { cu::mem_pool::set_attribute(pool, attr, &mut new as *mut u64 as *mut _) }
                .map_err(|e| derr("cuMemPoolSetAttribute", e))?;
        }
        Ok(old)
    }
}
