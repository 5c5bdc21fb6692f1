//! `concord-shm-bench [--ranks N] [--iters K] [--sizes-mib 1,16,64]`: all_reduce f32 sum on the
//! shm backend, N rank processes (this binary re-executed by the harness launcher), nccl-tests-like output, next to a
//! single-core memcpy bandwidth of 64 MiB measured in the same run. A benchmark, not a test.

use clap::Parser;
use concord_core::{Backend, ReduceOp, Tensor, WorldInfo};
use concord_harness::launch;
use concord_shm::ShmBackend;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "all_reduce f32 sum on the shm backend, nccl-tests-like output, next to memcpy")]
struct Args {
    #[command(flatten)]
    common: concord_bench::Common,
}

/// Single-core memcpy bandwidth of 64 MiB (bytes copied per second), best of 7 after warm-up.
fn memcpy_bw() -> f64 {
    let n = 64 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / best
}

fn rank_main(world: &WorldInfo, a: &concord_bench::Common) {
    let rank = world.rank;
    let b = ShmBackend::init(world).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let n = world.world_size as f64;
    let t = Duration::from_secs(60);
    let iters = a.iters.unwrap_or(20);
    for bytes in a.sizes(&[1, 16, 64]) {
        let count = bytes / 4;
        let x = b.upload(&Tensor::from_vec(&[count], vec![1.0f32; count])).unwrap();
        for _ in 0..3 {
            b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(t).unwrap();
        }
        b.barrier().unwrap().wait(t).unwrap();
        let start = Instant::now();
        let mut last = None;
        for _ in 0..iters {
            last = Some(b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(t).unwrap());
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let got = b.download(&last.unwrap()).unwrap();
        assert_eq!(got.get_f64(count - 1), n, "wrong all_reduce result");
        if rank == 0 {
            let algbw = bytes as f64 / us / 1e3;
            println!(
                "{:>12} {:>12} {:>8} {:>6} {:>10.1} {:>8.2} {:>8.2}",
                bytes,
                count,
                "float",
                "sum",
                us,
                algbw,
                algbw * 2.0 * (n - 1.0) / n
            );
        }
    }
}

fn main() {
    let a = Args::parse().common;
    if let Some(world) = launch::rank_world() {
        rank_main(&world, &a);
        return;
    }
    let mem = memcpy_bw();
    println!("# concord-shm-bench: all_reduce, {} ranks (processes), {} iterations, out of place", a.ranks, a.iters.unwrap_or(20));
    println!("# {:>10} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8}", "size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw");
    a.launch_and_wait("shm");
    println!("# memcpy (single core, 64 MiB): {:.2} GB/s", mem / 1e9);
    println!("# busbw / memcpy is printed by run-cpu-bench.sh; goal at 64 MiB: >= 0.5");
}
