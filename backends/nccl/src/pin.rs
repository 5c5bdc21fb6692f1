//! Pinning a thread to one CPU: the raw reference's launching thread (`raw_pin`) and the
//! progress thread (backend option `progress_pin`), so that a comparison of the two runs them at
//! the same placement (NCCL's host time per call follows the launching thread's vCPU on the
//! 2 x H200 guest: ~7 us on some, ~10 us on others).

/// Runs the calling thread on `cpu` only; returns its CPU set before, to restore.
pub(crate) fn pin_to(cpu: usize) -> Result<libc::cpu_set_t, String> {
    // SAFETY: cpu_set_t is plain data; the calls touch only the calling thread's affinity.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return Err(format!("sched_getaffinity: {}", std::io::Error::last_os_error()));
        }
        let set = one_cpu(cpu)?;
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("sched_setaffinity to CPU {cpu}: {}", std::io::Error::last_os_error()));
        }
        Ok(old)
    }
}

/// Restores a CPU set saved by [`pin_to`] when dropped.
pub(crate) struct Unpin(pub(crate) Option<libc::cpu_set_t>);
impl Drop for Unpin {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            // SAFETY: as in `pin_to`.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &old) };
        }
    }
}

/// Runs thread `t` (another thread of this process, such as one just spawned) on `cpu` only.
pub(crate) fn pin_thread(t: libc::pthread_t, cpu: usize) -> Result<(), String> {
    let set = one_cpu(cpu)?;
    // SAFETY: `t` is a live thread of this process (its caller holds its handle).
    let r = unsafe { libc::pthread_setaffinity_np(t, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    match r {
        0 => Ok(()),
        e => Err(format!("pthread_setaffinity_np to CPU {cpu}: {}", std::io::Error::from_raw_os_error(e))),
    }
}

/// The CPU set of `cpu` alone (a named error past the set's size rather than a panic).
fn one_cpu(cpu: usize) -> Result<libc::cpu_set_t, String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu} is past the largest CPU number a CPU set holds ({})", libc::CPU_SETSIZE - 1));
    }
    // SAFETY: cpu_set_t is plain data (all zeros: the empty set); `cpu` is inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's CPU set.
    fn affinity() -> libc::cpu_set_t {
        // SAFETY: plain data; the calling thread's own affinity.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            set
        }
    }

    #[test]
    fn a_thread_runs_on_the_cpu_it_is_pinned_to_and_a_cpu_past_the_set_is_named() {
        // SAFETY: the calling thread's own handle.
        let me = unsafe { libc::pthread_self() };
        let e = pin_thread(me, 1 << 20).unwrap_err();
        assert!(e.contains("CPU 1048576") && e.contains("largest"), "{e}");
        let all = affinity();
        // The last CPU this thread may run on, then only that one; the set is restored after.
        let cpu = (0..libc::CPU_SETSIZE as usize).rev().find(|&c| unsafe { libc::CPU_ISSET(c, &all) }).expect("a CPU");
        let _restore = Unpin(Some(all));
        pin_thread(me, cpu).expect("pinned");
        let now = affinity();
        assert_eq!(unsafe { libc::CPU_COUNT(&now) }, 1);
        assert!(unsafe { libc::CPU_ISSET(cpu, &now) });
    }
}
