//! GPU gating: how many CUDA GPUs this machine has, found without crashing where no driver is
//! installed.
//!
//! * `CONCORD_GPU_COUNT=N` overrides detection (tests, CI without GPUs, or to limit a run).
//! * Otherwise `libcuda.so.1` is loaded at run time (never linked), `cuInit(0)` and
//!   `cuDeviceGetCount` are called once per process and the answer is cached. Any failure (no
//!   library, missing symbol, a CUDA error) counts as 0 GPUs, with the reason in [`describe`].
//!
//! Callers SHOULD gate a case that needs `n` GPUs with [`require`] at list time and mark it
//! ignored with the returned reason, so that test runners show it as skipped, not passed.

use std::sync::OnceLock;

/// Environment override of the GPU count (read through [`crate::config::Config`]).
pub const GPU_COUNT_ENV: &str = crate::config::GPU_COUNT;

#[derive(Clone, Debug)]
struct Probe {
    count: usize,
    /// Why the count is what it is: `CUDA driver` or the failure.
    why: String,
}

fn env_override() -> Option<Probe> {
    let n = crate::config::Config::global().gpu_count?;
    Some(Probe { count: n, why: GPU_COUNT_ENV.to_string() })
}

fn probe_driver() -> Probe {
    type CuInit = unsafe extern "C" fn(u32) -> i32;
    type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: loading the CUDA driver runs its initialisers; it is the documented way to use it.
    let lib = match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(l) => l,
        Err(e) => return Probe { count: 0, why: format!("libcuda.so.1 not found ({e})") },
    };
    // SAFETY: the symbol types match the CUDA driver API (CUresult is a C int).
    let r = unsafe {
        let init = match lib.get::<CuInit>(b"cuInit\0") {
            Ok(f) => f,
            Err(e) => return Probe { count: 0, why: format!("libcuda.so.1 has no cuInit ({e})") },
        };
        let get_count = match lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0") {
            Ok(f) => f,
            Err(e) => return Probe { count: 0, why: format!("libcuda.so.1 has no cuDeviceGetCount ({e})") },
        };
        let rc = init(0);
        if rc != 0 {
            Err(format!("cuInit failed with CUDA error {rc}"))
        } else {
            let mut n: i32 = 0;
            let rc = get_count(&mut n);
            if rc != 0 {
                Err(format!("cuDeviceGetCount failed with CUDA error {rc}"))
            } else {
                Ok(n.max(0) as usize)
            }
        }
    };
    // The driver MUST stay loaded: unloading it after cuInit while its threads run would crash.
    std::mem::forget(lib);
    match r {
        Ok(n) => Probe { count: n, why: "CUDA driver".into() },
        Err(why) => Probe { count: 0, why },
    }
}

fn probe() -> Probe {
    static DRIVER: OnceLock<Probe> = OnceLock::new();
    env_override().unwrap_or_else(|| DRIVER.get_or_init(probe_driver).clone())
}

/// Number of usable GPUs (0 on any failure; never crashes).
pub fn count() -> usize {
    probe().count
}

/// `2 GPUs (CUDA driver)`, `0 GPUs: libcuda.so.1 not found (...)`, `3 GPUs (CONCORD_GPU_COUNT)`.
pub fn describe() -> String {
    describe_probe(&probe())
}

fn describe_probe(p: &Probe) -> String {
    let noun = if p.count == 1 { "GPU" } else { "GPUs" };
    if p.count == 0 && p.why != GPU_COUNT_ENV && p.why != "CUDA driver" {
        format!("0 GPUs: {}", p.why)
    } else {
        format!("{} {noun} ({})", p.count, p.why)
    }
}

/// `Ok(())` if at least `n` GPUs are present, else the reason to skip:
/// `needs 2 GPUs, found 0 GPUs: libcuda.so.1 not found (...)`.
pub fn require(n: usize) -> Result<(), String> {
    require_of(&probe(), n)
}

fn require_of(p: &Probe, n: usize) -> Result<(), String> {
    if p.count >= n {
        Ok(())
    } else {
        Err(format!("needs {n} GPU{}, found {}", if n == 1 { "" } else { "s" }, describe_probe(p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_is_described_and_gates() {
        let p = Probe { count: 3, why: GPU_COUNT_ENV.to_string() };
        assert_eq!(describe_probe(&p), "3 GPUs (CONCORD_GPU_COUNT)");
        assert!(require_of(&p, 2).is_ok());
        assert_eq!(require_of(&p, 4).unwrap_err(), "needs 4 GPUs, found 3 GPUs (CONCORD_GPU_COUNT)");
        let one = Probe { count: 1, why: "CUDA driver".into() };
        assert_eq!(describe_probe(&one), "1 GPU (CUDA driver)");
    }

    #[test]
    fn driver_probe_never_crashes() {
        let p = probe_driver();
        let d = describe_probe(&p);
        assert!(d.starts_with(&format!("{} GPU", p.count)), "{d}");
        if p.count == 0 {
            assert!(d.starts_with("0 GPUs: "), "a zero count says why: {d}");
        }
    }
}
