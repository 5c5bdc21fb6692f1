//! `concord-shm-bench [--ranks N] [--iters K] [--sizes-mib 1,16,64]`: all_reduce f32 sum on the
//! shm backend, N rank processes (this binary re-executed), nccl-tests-like output, next to a
//! single-core memcpy bandwidth of 64 MiB measured in the same run. A benchmark, not a test.

use concord_core::{Backend, ReduceOp, Tensor, WorldInfo};
use concord_shm::ShmBackend;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANK_ENV: &str = "CONCORD_SHM_BENCH_RANK";

struct Args {
    ranks: usize,
    iters: usize,
    sizes: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args { ranks: 2, iters: 20, sizes: vec![1 << 20, 16 << 20, 64 << 20] };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--ranks" => a.ranks = v.parse().expect("--ranks N"),
            "--iters" => a.iters = v.parse().expect("--iters K"),
            "--sizes-mib" => a.sizes = v.split(',').map(|s| s.parse::<usize>().expect("MiB") << 20).collect(),
            _ => panic!("unknown argument {k} (use --ranks N --iters K --sizes-mib 1,16,64)"),
        }
    }
    a
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

fn rank_main(rank: usize, a: &Args) {
    let world = WorldInfo {
        rank,
        world_size: a.ranks,
        store_path: std::env::var("CONCORD_SHM_BENCH_STORE").expect("store").into(),
        world_id: std::env::var("CONCORD_SHM_BENCH_WID").expect("wid"),
        op_timeout: Duration::from_secs(60),
        options: vec![],
    };
    let b = ShmBackend::init(&world).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let n = a.ranks as f64;
    let t = Duration::from_secs(60);
    for &bytes in &a.sizes {
        let count = bytes / 4;
        let x = b.upload(&Tensor::from_vec(&[count], vec![1.0f32; count])).unwrap();
        for _ in 0..3 {
            b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(t).unwrap();
        }
        b.barrier().unwrap().wait(t).unwrap();
        let start = Instant::now();
        let mut last = None;
        for _ in 0..a.iters {
            last = Some(b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(t).unwrap());
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / a.iters as f64;
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
    let a = args();
    if let Ok(r) = std::env::var(RANK_ENV) {
        rank_main(r.parse().expect("rank"), &a);
        return;
    }
    let mem = memcpy_bw();
    let dir = std::env::temp_dir().join(format!("concord-shm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let wid = format!("bench{}", std::process::id());
    println!("# concord-shm-bench: all_reduce, {} ranks (processes), {} iterations, out of place", a.ranks, a.iters);
    println!("# {:>10} {:>12} {:>8} {:>6} {:>10} {:>8} {:>8}", "size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw");
    let me = std::env::current_exe().expect("current exe");
    let children: Vec<_> = (0..a.ranks)
        .map(|r| {
            Command::new(&me)
                .args(std::env::args().skip(1))
                .env(RANK_ENV, r.to_string())
                .env("CONCORD_SHM_BENCH_STORE", dir.join("store"))
                .env("CONCORD_SHM_BENCH_WID", &wid)
                .stdout(if r == 0 { Stdio::inherit() } else { Stdio::null() })
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait().expect("wait rank");
        if !st.success() {
            eprintln!("rank {r} failed: {st}");
            ok = false;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    concord_harness::platform::sweep_shm(&wid);
    println!("# memcpy (single core, 64 MiB): {:.2} GB/s", mem / 1e9);
    println!("# busbw / memcpy is printed by run-cpu-bench.sh; goal at 64 MiB: >= 0.5");
    if !ok {
        std::process::exit(1);
    }
}
