//! # concord-bench
//!
//! **One job:** the benchmark users trust — nccl-tests' table for any [`concord_core::Backend`], with every
//! timed iteration's output checked against the oracle — and the tools around it (JSON lines,
//! SVG plots, regression comparison, OpenMPI side by side).
//!
//! * [`bench_main`]: a downstream backend's whole benchmark binary in one line,
//!   `fn main() { concord_bench::bench_main::<MyBackend>("mine") }`. The built-in binary
//!   (`src/bin/concord-bench.rs`, what `cargo xtask bench` runs) registers shm and nccl.
//! * Ranks are started by the harness launcher ([`concord_harness::launch`]) once per run
//!   (persistent world: set-up is paid once); each runs [`rank::rank_main`] and reports JSON
//!   lines on stdout; the parent ([`run::run_parent`]) merges them into the table. Under torchrun
//!   / mpirun / srun each process is one rank instead (`external`): the lines go through the TCP
//!   store and rank 0 prints the table.
//! * [`ext`]: what a backend may add through its [`Hooks`] — a device clock (CUDA events for
//!   NCCL; CPU backends keep wall-clock) and a reference timed in the same run (NCCL: the raw
//!   NCCL calls in a tight loop), printed next to the backend's rows.
//! * [`Common`] is the older shared command line of `concord-nccl-bench`.
#![forbid(unsafe_code)]

pub mod args;
pub mod compare;
pub mod ext;
mod external;
pub mod fused;
pub mod mpi;
pub mod nccl;
pub mod plot;
pub mod rank;
pub mod record;
pub mod run;
pub mod spec;
pub mod table;

pub use args::Args;
pub use ext::{Clock, DeviceData, MakeReference, RefStep, Reference};
pub use run::{bench_main, bench_main_with, main_with, run_parent, Hooks, Outcome};

use std::time::Duration;

/// The arguments of `concord-nccl-bench` (init and latency timings).
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// Rank processes.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Timed iterations per size.
    #[arg(long)]
    pub iters: Option<usize>,
    /// Message sizes in MiB, comma-separated.
    #[arg(long = "sizes-mib", value_delimiter = ',')]
    pub sizes_mib: Vec<usize>,
    /// Backend options, `k=v,k=v` (as `WorldInfo::options`).
    #[arg(long, default_value = "")]
    pub opts: String,
    /// Deadline for the whole run; ranks still running then are ended.
    #[arg(long, default_value_t = 600)]
    pub deadline_s: u64,
}

impl Common {
    /// Sizes in bytes (`default_mib` when none were given).
    pub fn sizes(&self, default_mib: &[usize]) -> Vec<usize> {
        let mib = if self.sizes_mib.is_empty() { default_mib } else { &self.sizes_mib };
        mib.iter().map(|m| m << 20).collect()
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_secs(self.deadline_s)
    }

    /// Launches `ranks` copies of this binary (same arguments) with the backend options, waits
    /// up to the deadline and exits 1 naming the ranks that failed. Call from `main` after the
    /// rank check (`launch::rank_world()`). Sweeps the `/dev/shm` files of `B::SHM_PREFIXES`
    /// that the world leaves.
    pub fn launch_and_wait<B: concord_core::Backend>(&self, backend: &str) {
        let spec = concord_harness::launch::LaunchSpec::current_exe(self.ranks, backend).and_then(|mut s| {
            s.options = concord_harness::worker::parse_options(&self.opts).map_err(std::io::Error::other)?;
            s.foreign_shm = B::SHM_PREFIXES.iter().map(|p| p.to_string()).collect();
            Ok(s)
        });
        let launched = spec.and_then(|s| concord_harness::launch::launch(&s));
        match launched.map(|l| l.wait(self.deadline())) {
            Ok(report) => {
                if let Err(e) = report.check() {
                    eprintln!("{backend} bench failed: {e}");
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("{backend} bench: cannot launch the ranks: {e}");
                std::process::exit(1);
            }
        }
    }
}
