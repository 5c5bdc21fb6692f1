//! `concord-nccl-bench [--ranks N] [--iters K] [--sizes-mib 1024] [--opts blocking=1]`: NCCL
//! timings, one process per GPU (this binary re-executed by the harness launcher), nccl-tests-like output. A benchmark,
//! not a test: correctness is the conformance suites' job (`conformance --backend nccl`).
//!
//! Measures, on rank 0: `init` (communicator creation), 1 KiB `all_reduce_` latency (issue +
//! wait, and back to back) with cross-rank validation on and off, then per size the bus
//! bandwidth of all_reduce (in and out of place), all_gather_into_tensor,
//! reduce_scatter_tensor, all_to_all_single and broadcast_ with validation off (busbw factors as
//! nccl-tests: 2(n-1)/n, (n-1)/n, 1). Exit status: 0 done, 1 a rank failed, 2 cannot run here
//! (prints `CANNOT RUN: why`).

use clap::Parser;
use concord_core::{Backend, CollectiveError, ReduceOp, Tensor, Work, WorldInfo};
use concord_harness::launch;
use concord_nccl::{probe, NcclBackend};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(about = "NCCL timings: init, 1 KiB latency, busbw per op (one process per GPU)")]
struct Args {
    #[command(flatten)]
    common: concord_bench::Common,
}

/// Mean seconds per op: `f` run `iters` times after `warm` warm-ups and a barrier.
fn mean(b: &NcclBackend, warm: usize, iters: usize, f: &dyn Fn() -> Result<(), CollectiveError>) -> Result<f64, CollectiveError> {
    for _ in 0..warm {
        f()?;
    }
    b.barrier()?.wait(WAIT)?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() / iters as f64)
}

/// Issues `k` ops, then waits for all (the stream orders them): nccl-tests' back-to-back timing.
fn back_to_back<T>(b: &NcclBackend, k: usize, issue: &dyn Fn() -> Result<Work<T>, CollectiveError>) -> Result<f64, CollectiveError> {
    b.barrier()?.wait(WAIT)?;
    let t = Instant::now();
    let works: Vec<_> = (0..k).map(|_| issue()).collect::<Result<_, _>>()?;
    for w in &works {
        w.wait(WAIT)?;
    }
    Ok(t.elapsed().as_secs_f64() / k as f64)
}

fn rank_main(world: &WorldInfo, a: &concord_bench::Common) -> Result<(), CollectiveError> {
    let rank = world.rank;
    let b = NcclBackend::init(world)?;
    let iters = a.iters.unwrap_or(500);
    let say = |s: String| {
        if rank == 0 {
            println!("{s}");
        }
    };
    say(format!(
        "# NCCL {}, {} ranks, options {:?}; init {:.1} ms",
        b.nccl_version(),
        a.ranks,
        world.options,
        b.init_time().as_secs_f64() * 1e3
    ));
    let n = a.ranks as f64;
    let x = b.upload(&Tensor::from_vec(&[256], vec![1.0f32; 256]))?;
    for validate in [true, false] {
        b.set_validation(validate);
        let rt = mean(&b, 20, iters, &|| b.all_reduce_(&x, ReduceOp::Sum)?.wait(WAIT).map(|_| ()))?;
        let bb = back_to_back(&b, iters, &|| b.all_reduce_(&x, ReduceOp::Sum))?;
        say(format!(
            "latency all_reduce_ 1KiB f32 validate={validate}: issue+wait {:.1} us/op, back-to-back {:.1} us/op",
            rt * 1e6,
            bb * 1e6
        ));
    }
    b.set_validation(false);
    say(format!("# {:>10} {:>26} {:>12} {:>12} {:>8} {:>8}", "size(B)", "op", "mode", "time(us)", "algbw", "busbw"));
    for bytes in a.sizes(&[1024]) {
        let count = bytes / 4;
        let x = b.upload(&Tensor::from_vec(&[count], vec![1.0f32; count]))?;
        let part = b.view(&x, 0, &[count / a.ranks])?;
        let (ar, ag, one) = (2.0 * (n - 1.0) / n, (n - 1.0) / n, 1.0);
        let report = |name: &str, factor: f64, rt: f64, bb: f64| {
            for (mode, t) in [("issue+wait", rt), ("back-to-back", bb)] {
                let algbw = bytes as f64 / t / 1e9;
                say(format!("{bytes:>12} {name:>26} {mode:>12} {:>12.1} {algbw:>8.1} {:>8.1}", t * 1e6, algbw * factor));
            }
        };
        macro_rules! time_op {
            ($name:expr, $factor:expr, $issue:expr) => {{
                let rt = mean(&b, 3, 10, &|| $issue.and_then(|w| w.wait(WAIT).map(|_| ())))?;
                let bb = back_to_back(&b, 10, &|| $issue)?;
                report($name, $factor, rt, bb);
            }};
        }
        time_op!("all_reduce_ (in place)", ar, b.all_reduce_(&x, ReduceOp::Sum));
        time_op!("all_reduce (out of place)", ar, b.all_reduce(&x, ReduceOp::Sum));
        time_op!("all_gather_into_tensor", ag, b.all_gather_into_tensor(&part));
        time_op!("reduce_scatter_tensor", ag, b.reduce_scatter_tensor(&x, ReduceOp::Sum));
        time_op!("all_to_all_single", ag, b.all_to_all_single(&x, None, None));
        time_op!("broadcast_", one, b.broadcast_(&x, 0));
    }
    b.set_validation(true);
    b.barrier()?.wait(WAIT)?;
    Ok(())
}

fn main() {
    let a = Args::parse().common;
    if let Some(world) = launch::rank_world() {
        if let Err(e) = rank_main(&world, &a) {
            eprintln!("rank {}: {e} [{}]", world.rank, e.name());
            std::process::exit(1);
        }
        return;
    }
    let gpus = match probe() {
        Ok(i) => i.gpus,
        Err(why) => {
            println!("CANNOT RUN: {why}");
            std::process::exit(2);
        }
    };
    if gpus < a.ranks {
        println!("CANNOT RUN: needs {} GPUs, found {gpus}", a.ranks);
        std::process::exit(2);
    }
    // Every rank ends, or all are ended at the deadline, or soon after the first failure.
    a.launch_and_wait("nccl");
}
