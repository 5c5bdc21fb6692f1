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
pub(crate) struct Unpin(Option<libc::cpu_set_t>);
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
    // SAFETY: cpu_set_t is plain data (all zeros: the empty set).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    libc::CPU_SET(cpu, &mut set);
    Ok(set)
}
