//! Pinning a thread to one CPU: the raw reference's launching thread (`raw_pin`), the
//! progress thread (backend option `progress_pin`) and the bench's issuing thread (the bench's
//! option `caller_pin`, [`pin_caller`]), so that a comparison of the two launching threads runs
//! them at the same placement (NCCL's host time per call follows the launching thread's vCPU on
//! the 2 x H200 guest: ~7 us on some, ~10 us on others) with no other thread of the rank on
//! their vCPU.

/// Runs the calling thread on `cpu` only for the rest of its life (the bench's option
/// `caller_pin`: its issuing thread kept off the vCPUs the launching threads are pinned to).
/// A later [`pin_to`] of the same thread restores this one-CPU set when its [`Unpin`] drops.
pub fn pin_caller(cpu: usize) -> Result<(), String> {
    pin_to(cpu).map(|_| ())
}

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

/// Restores a CPU set saved by [`pin_to`] when dropped: `Unpin(Some((saved, pinned)))`.
///
/// Widening a thread's CPU set does not move it: Linux leaves it on the CPU it was pinned to,
/// which may now be another pinned thread's only CPU (gpulat11: `raw_pin=N` left the bench's
/// issuing thread on CPU N + rank, beside the progress thread pinned there by `progress_pin=N`,
/// 5-8 x slower). So the saved set less the pinned CPU comes first, which moves the thread off
/// it, then the saved set ([`restore_steps`]).
pub(crate) struct Unpin(pub(crate) Option<(libc::cpu_set_t, usize)>);
impl Drop for Unpin {
    fn drop(&mut self) {
        if let Some((old, pinned)) = self.0.take() {
            for set in restore_steps(&old, pinned) {
                // SAFETY: as in `pin_to`.
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
            }
        }
    }
}

/// The CPU sets [`Unpin`] applies in turn to go back from `pinned` to `saved`: `saved` without
/// `pinned` first when that leaves a CPU (the thread moves off `pinned`), then `saved`.
fn restore_steps(saved: &libc::cpu_set_t, pinned: usize) -> Vec<libc::cpu_set_t> {
    let mut off = *saved;
    if pinned < libc::CPU_SETSIZE as usize {
        // SAFETY: plain data; `pinned` is inside the set.
        unsafe { libc::CPU_CLR(pinned, &mut off) };
    }
    // SAFETY: plain data.
    let others = unsafe { libc::CPU_COUNT(&off) };
    if others > 0 && off != *saved {
        vec![off, *saved]
    } else {
        vec![*saved]
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
        let _restore = Unpin(Some((all, cpu)));
        pin_thread(me, cpu).expect("pinned");
        let now = affinity();
        assert_eq!(unsafe { libc::CPU_COUNT(&now) }, 1);
        assert!(unsafe { libc::CPU_ISSET(cpu, &now) });
    }

    /// The CPUs of a set, in order.
    fn cpus(set: &libc::cpu_set_t) -> Vec<usize> {
        // SAFETY: plain data.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, set) }).collect()
    }

    fn set_of(cpus: &[usize]) -> libc::cpu_set_t {
        // SAFETY: plain data; every CPU below is inside the set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut set);
            }
            set
        }
    }

    /// The bench's `caller_pin=M` with `raw_pin=N`: the issuing thread on M, pinned to N for the
    /// raw loop's step, is back on M alone once the step's `Unpin` drops, running there (a
    /// one-CPU set moves the thread at once), never left on N beside a progress thread pinned
    /// there.
    #[test]
    fn a_pin_inside_a_caller_pin_restores_the_callers_cpu_and_runs_there() {
        let all = affinity();
        let ours = cpus(&all);
        let (Some(&m), Some(&n)) = (ours.first(), ours.last()) else { panic!("no CPU") };
        let _back = Unpin(Some((all, usize::MAX)));
        pin_caller(m).expect("caller pinned");
        {
            let saved = pin_to(n).expect("pinned for the step");
            assert_eq!(cpus(&saved), vec![m]);
            let _unpin = Unpin(Some((saved, n)));
            assert_eq!(cpus(&affinity()), vec![n]);
            // SAFETY: no arguments.
            assert_eq!(unsafe { libc::sched_getcpu() }, n as i32);
        }
        assert_eq!(cpus(&affinity()), vec![m], "the caller's one-CPU set after the step");
        // SAFETY: no arguments.
        assert_eq!(unsafe { libc::sched_getcpu() }, m as i32, "the caller runs on its CPU again");
    }

    /// Without a caller pin the saved set comes back whole, by way of the set without the pinned
    /// CPU (which moves the thread off it); a one-CPU saved set, or one without the pinned CPU,
    /// comes back in one step.
    #[test]
    fn unpinning_moves_off_the_pinned_cpu_before_restoring_the_saved_set() {
        let steps: Vec<Vec<usize>> = restore_steps(&set_of(&[0, 1, 2, 3]), 2).iter().map(cpus).collect();
        assert_eq!(steps, vec![vec![0, 1, 3], vec![0, 1, 2, 3]]);
        let steps: Vec<Vec<usize>> = restore_steps(&set_of(&[5]), 5).iter().map(cpus).collect();
        assert_eq!(steps, vec![vec![5]]);
        let steps: Vec<Vec<usize>> = restore_steps(&set_of(&[4]), 7).iter().map(cpus).collect();
        assert_eq!(steps, vec![vec![4]]);
        let steps: Vec<Vec<usize>> = restore_steps(&set_of(&[0, 1]), usize::MAX).iter().map(cpus).collect();
        assert_eq!(steps, vec![vec![0, 1]]);
        // And for real, when this thread may run on two CPUs or more: the set comes back whole.
        let all = affinity();
        let ours = cpus(&all);
        if ours.len() >= 2 {
            let last = *ours.last().expect("a CPU");
            {
                let saved = pin_to(last).expect("pinned");
                let _unpin = Unpin(Some((saved, last)));
            }
            assert_eq!(cpus(&affinity()), ours);
        }
    }
}
