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
//! * store barrier: 8 processes (this binary re-executed) share one FileStore and pass 20 + 300
//!   barriers; rank 0 times each of the last 300 and reports the median.
//!
//! The binary is its own worker: when spawned by the runner it serves trivial cases.

use concord_harness::outcome::Outcome;
use concord_harness::runner::{CaseRequest, Pool, PoolConfig, WorldKey};
use concord_harness::worker::{serve, WorkerEnv};
use concord_store::FileStore;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CASE_SAMPLES: usize = 40;
const CASE_WARMUP: usize = 3;
const BARRIER_RANKS: usize = 8;
const BARRIER_WARMUP: usize = 20;
const BARRIERS: usize = 300;
const BARRIER_ROLE: &str = "CONCORD_BENCH_BARRIER_RANK";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Child role for the barrier bench: pass the barriers; rank 0 prints one timing per line.
fn barrier_child(rank: usize, path: &str) -> ! {
    let t = Duration::from_secs(30);
    let store = FileStore::open(std::path::Path::new(path), BARRIER_RANKS, t).unwrap_or_else(|e| {
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
        println!("{}", median(times));
    }
    drop(store);
    std::process::exit(0);
}

fn bench_cases() -> anyhow::Result<f64> {
    let mut cfg = PoolConfig::from_env();
    cfg.max_idle_worlds = 0;
    let pool = Pool::new(cfg);
    let key = WorldKey { backend: "none".into(), world_size: 4, options: vec![] };
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

fn bench_barrier() -> anyhow::Result<f64> {
    let dir = tempfile::Builder::new().prefix("concord-bench-").tempdir()?;
    let path = dir.path().join("store");
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..BARRIER_RANKS)
        .map(|r| {
            Command::new(&exe)
                .env(BARRIER_ROLE, r.to_string())
                .env("CONCORD_BENCH_STORE", &path)
                .stdin(Stdio::null())
                .stdout(if r == 0 { Stdio::piped() } else { Stdio::null() })
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut median_us = None;
    let mut failed = Vec::new();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            failed.push(format!("rank {r}: {}", out.status));
        }
        if r == 0 {
            median_us = String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().ok();
        }
    }
    anyhow::ensure!(failed.is_empty(), "barrier bench failed: {failed:?}");
    median_us.ok_or_else(|| anyhow::anyhow!("rank 0 printed no timing"))
}

fn main() -> anyhow::Result<()> {
    if let Some(env) = WorkerEnv::from_env() {
        serve(
            env,
            |_| Ok(()),
            |_, case| match case {
                "noop" => Outcome::Passed,
                other => Outcome::Failed(format!("unknown bench case {other}")),
            },
        );
    }
    if let Ok(r) = std::env::var(BARRIER_ROLE) {
        let path = std::env::var("CONCORD_BENCH_STORE")?;
        barrier_child(r.parse()?, &path);
    }
    let case_ms = bench_cases()?;
    println!("per-case overhead (4 ranks): median {case_ms:.2} ms");
    let barrier_us = bench_barrier()?;
    println!("store barrier (8 ranks): median {barrier_us:.0} us");
    Ok(())
}
