//! Scheduler noise, measured from the process's own clock: the time this process's threads spent
//! *runnable but not running* (waiting for a CPU), as Linux counts it per thread in
//! `/proc/self/task/<tid>/schedstat` (second field, nanoseconds; it includes the wake-up latency
//! after a sleep, a barrier or a condition variable).
//!
//! A timing check whose margin exists only to absorb a loaded machine's scheduling widens that
//! margin by the noise measured over the same window, and by nothing else. A rank that waits on a
//! slow peer, sleeps, or blocks on a pipe or a futex is *not* runnable while it waits, so such a
//! wait is never counted as noise: on a quiet machine the noise is ~0 and the check is exactly as
//! strict as its fixed margin; under load it grows by what the scheduler took, no more.
//!
//! Threads that exit inside the window lose what they waited (the measure only ever errs low,
//! i.e. strict). Where the counters are missing (not Linux, no `schedstat`), the noise is zero.

use std::collections::HashMap;
use std::time::Duration;

/// Every thread's run-queue wait so far (ns), by thread id.
fn per_thread() -> HashMap<u64, u64> {
    let mut m = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return m };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
        let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) else { continue };
        if let Some(wait) = s.split_whitespace().nth(1).and_then(|w| w.parse::<u64>().ok()) {
            m.insert(tid, wait);
        }
    }
    m
}

/// A start point of a noise measurement (see the module docs).
pub struct Noise {
    start: HashMap<u64, u64>,
}

impl Noise {
    /// Starts measuring.
    pub fn start() -> Noise {
        Noise { start: per_thread() }
    }

    /// The time this process's threads spent waiting for a CPU since [`Noise::start`] (summed
    /// over threads: a wait of any of them can delay the result).
    pub fn so_far(&self) -> Duration {
        let ns: u64 = per_thread().into_iter().map(|(tid, now)| now.saturating_sub(self.start.get(&tid).copied().unwrap_or(0))).sum();
        Duration::from_nanos(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's id and run-queue wait (ns).
    fn this_thread() -> Option<(u64, u64)> {
        let link = std::fs::read_link("/proc/thread-self").ok()?;
        let tid = link.file_name()?.to_str()?.parse().ok()?;
        Some((tid, *per_thread().get(&tid)?))
    }

    #[test]
    fn a_sleep_is_not_noise() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let (_, before) = this_thread().expect("no /proc/thread-self/schedstat on Linux");
        let t0 = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        let elapsed = t0.elapsed();
        let (_, after) = this_thread().expect("schedstat");
        // Not runnable while asleep: only the wake-up latency counts, at most what the window
        // had beyond the sleep.
        let waited = Duration::from_nanos(after - before);
        assert!(
            waited <= elapsed.saturating_sub(Duration::from_millis(199)),
            "a 200 ms sleep counted {waited:?} of run-queue wait in {elapsed:?}"
        );
    }

    #[test]
    fn runnable_threads_beyond_the_cores_are_noise() {
        if !cfg!(target_os = "linux") || per_thread().is_empty() {
            return;
        }
        // More spinning threads than cores for 300 ms: at least one of them waits for a CPU.
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let n = Noise::start();
        let until = std::time::Instant::now() + Duration::from_millis(300);
        let spin = || {
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        std::thread::scope(|s| {
            for _ in 0..cores + 2 {
                s.spawn(spin);
            }
            spin();
        });
        // Threads that exited lose their count: only the main thread's remains, and it shared
        // the cores with cores + 2 others for 300 ms.
        let got = n.so_far();
        assert!(got > Duration::ZERO, "{} threads spun on {cores} core(s) for 300 ms and no run-queue wait was counted", cores + 3);
    }
}
