//! `concord-harness-bench` (run by `cargo xtask bench-harness`): measures the harness's own
//! overhead and prints exactly two lines:
//!
//! ```text
//! per-case overhead (4 ranks): median X ms
//! store barrier (8 ranks): median Y us
//! ```
//!
//! * per-case overhead: an isolated world of 4 ranks (spawn + rendezvous + one trivial case +
//!   teardown), timed end to end from the parent, 40 samples after 3 warm-ups.
//! * store barrier: 8 processes (this binary re-executed through [`concord_harness::launch`])
//!   share one FileStore and pass 20 + 300 barriers; rank 0 times each of the last 300 and
//!   prints the median.
//!
//! The binary is its own worker: when spawned by the runner it serves trivial cases.

use concord_harness::launch::{self, LaunchSpec};
use concord_harness::outcome::Outcome;
use concord_harness::runner::{CaseRequest, Pool, PoolConfig, WorldKey};
use concord_harness::worker::{serve, WorkerEnv};
use concord_store::FileStore;
use std::time::{Duration, Instant};

const CASE_SAMPLES: usize = 40;
const CASE_WARMUP: usize = 3;
const BARRIER_RANKS: usize = 8;
const BARRIER_WARMUP: usize = 20;
const BARRIERS: usize = 300;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A launched rank of the barrier bench: pass the barriers; rank 0 prints the median.
fn barrier_child(world: &concord_core::WorldInfo) -> ! {
    let rank = world.rank;
    let t = Duration::from_secs(30);
    let store = FileStore::open(&world.store_path, BARRIER_RANKS, t).unwrap_or_else(|e| {
        eprintln!("barrier bench rank {rank}: {e}");
        std::process::exit(1)
    });
    let mut times = Vec::with_capacity(BARRIERS);
    for i in 0..BARRIER_WARMUP + BARRIERS {
        let t0 = Instant::now();
        if let Err(e) = store.barrier(&format!("b{i}"), BARRIER_RANKS, t) {
            eprintln!("barrier bench rank {rank}: {e}");
            std::process::exit(1);
        }
        if i >= BARRIER_WARMUP {
            times.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    if rank == 0 {
        println!("store barrier ({BARRIER_RANKS} ranks): median {:.0} us", median(times));
    }
    drop(store);
    std::process::exit(0);
}

fn bench_cases() -> anyhow::Result<f64> {
    let mut cfg = PoolConfig::from_env();
    cfg.max_idle_worlds = 0;
    let pool = Pool::new(cfg);
    let key = WorldKey::new("none", 4, vec![]);
    let mut samples = Vec::new();
    for i in 0..CASE_WARMUP + CASE_SAMPLES {
        let t0 = Instant::now();
        let rep = pool.run_case(CaseRequest { key: &key, case_id: "noop", deadline: Duration::from_secs(10), isolated: true });
        let dt = t0.elapsed();
        anyhow::ensure!(rep.verdict == concord_harness::verdict::Verdict::Passed, "bench case failed:\n{}", rep.failure_message());
        if i >= CASE_WARMUP {
            samples.push(dt.as_secs_f64() * 1000.0);
        }
    }
    pool.shutdown();
    Ok(median(samples))
}

/// Launches the barrier world; rank 0 prints its line.
fn bench_barrier() -> anyhow::Result<()> {
    let mut spec = LaunchSpec::current_exe(BARRIER_RANKS, "store")?;
    spec.args.clear();
    let report = launch::launch(&spec)?.wait(Duration::from_secs(120));
    report.check().map_err(|e| anyhow::anyhow!("barrier bench failed: {e}"))
}

fn main() -> anyhow::Result<()> {
    if let Some(env) = WorkerEnv::from_env() {
        serve(
            env,
            |_| Ok::<(), String>(()),
            |_, case| match case {
                "noop" => Outcome::Passed,
                other => Outcome::Failed(format!("unknown bench case {other}")),
            },
        );
    }
    if let Some(world) = launch::rank_world() {
        barrier_child(&world);
    }
    let case_ms = bench_cases()?;
    println!("per-case overhead (4 ranks): median {case_ms:.2} ms");
    bench_barrier()
}
