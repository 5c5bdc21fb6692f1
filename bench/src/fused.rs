//! `concord-bench --backend shm --fused [--ranks N] [-n iters] [-w warmup]`: each fused op as the
//! backend provides it (`Backend::fused_*`, native when `Capabilities::fused` says `Pipelined`)
//! against the trait's unfused decomposition (`concord_core::fused::decomposed_*`, the seed's
//! fallbacks) on the same backend, same inputs, same matmul kernel, over a range of shapes.
//!
//! Method: exact-by-construction inputs (small integers), so both paths must give the same bits;
//! every timed iteration's outputs are compared with the first unfused result (`#wrong` counts
//! the iterations that differ). Iterations alternate fused / unfused, each after a barrier, the
//! pair's order swapped every iteration, so machine load and the first slot's cost hit both alike; each rank times its own calls (issue to completed wait) and
//! the row shows the slowest rank's median (an all_reduce max). Rank 0 prints the table.

use crate::Args;
use concord_core::fused::{decomposed_all_gather_matmul, decomposed_matmul_reduce_scatter};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor};
use concord_harness::launch;
use std::time::{Duration, Instant};

/// (op, m rows per rank, k, n).
pub const SHAPES: &[(usize, usize, usize)] = &[(16, 64, 64), (64, 128, 128), (256, 256, 256), (1024, 256, 256), (2048, 512, 256)];

const WAIT: Duration = Duration::from_secs(600);

/// The whole `--fused` program: the parent launches the ranks; a rank runs [`rank`].
pub fn fused_main<B: Backend>(name: &str, args: &Args) -> i32 {
    if let Some(world) = launch::rank_world() {
        return match rank::<B>(&world, args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("concord-bench --fused: rank {}: {e}", world.rank);
                1
            }
        };
    }
    let spec = launch::LaunchSpec::current_exe(args.ranks, name).and_then(|mut s| {
        s.options = concord_harness::worker::parse_options(&args.opts).map_err(std::io::Error::other)?;
        Ok(s)
    });
    let spec = match spec {
        Ok(s) => s,
        Err(e) => {
            eprintln!("concord-bench --fused: cannot launch: {e}");
            return 2;
        }
    };
    let launched = match launch::launch(&spec) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("concord-bench --fused: cannot launch the ranks: {e}");
            return 2;
        }
    };
    let report = launched.wait(Duration::from_secs(args.deadline_s));
    match report.check() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("concord-bench --fused: {e}");
            1
        }
    }
}

fn ints(n: usize, seed: usize, lo: i64, span: i64) -> Vec<f64> {
    (0..n).map(|i| (lo + ((i * 7 + seed * 13 + i / 5) as i64 % span)) as f64).collect()
}

/// The median (robust to the preemptions of a loaded machine, which a mean is not).
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The slowest rank's value.
fn max_over_ranks<B: Backend>(b: &B, v: &[f64]) -> Result<Vec<f64>> {
    let buf = b.upload(&Tensor::from_vec(&[v.len()], v.to_vec()))?;
    let w = b.all_reduce(&buf, ReduceOp::Max)?;
    Ok(b.download(w.wait(WAIT)?)?.as_slice::<f64>().to_vec())
}

fn rank<B: Backend>(world: &concord_core::WorldInfo, args: &Args) -> Result<()> {
    let b = B::init(world)?;
    let (ws, me) = (b.world_size(), b.rank());
    let dt = DType::F32;
    if me == 0 {
        println!(
            "# concord-bench --fused: backend {} ({:?}), {ws} ranks, f32, {} timed + {} warm-up iterations, options `{}`",
            b.name(),
            b.capabilities().fused,
            args.iters,
            args.warmup,
            args.opts
        );
        println!(
            "# time: median per call of the slowest rank (us); fused = Backend::fused_* as provided; unfused = the seed's decomposition"
        );
        println!(
            "# {:>28}  {:>16}  {:>10}  {:>10}  {:>10}  {:>7}  {:>6}",
            "op", "a (per rank)", "b", "unfused", "fused", "speedup", "#wrong"
        );
        println!("# {:>28}  {:>16}  {:>10}  {:>10}  {:>10}  {:>7}  {:>6}", "", "", "", "(us)", "(us)", "", "");
    }
    for &(m, k, n) in SHAPES {
        for op in ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"] {
            let ag = op == "fused_all_gather_matmul";
            let (a_shape, m_rs) = if ag { (vec![m, k], m) } else { (vec![m * ws, k], m * ws) };
            let a = b.upload(&Tensor::from_f64(dt, &a_shape, &ints(m_rs * k, me, -2, 5)))?;
            let bm = b.upload(&Tensor::from_f64(dt, &[k, n], &ints(k * n, 7, -1, 3)))?;
            let bs = [bm.clone()];
            let run = |fused: bool| -> Result<(Duration, Vec<Tensor>)> {
                let t0 = Instant::now();
                let outs = if ag {
                    let w =
                        if fused { b.fused_all_gather_matmul(&a, &bs, 0)? } else { decomposed_all_gather_matmul(&b, &a, &bs, 0, None)? };
                    let (g, o) = w.into_value(WAIT)?;
                    let dt = t0.elapsed();
                    return Ok((dt, vec![b.download(&g)?, b.download(&o[0])?]));
                } else {
                    let w = if fused {
                        b.fused_matmul_reduce_scatter(&a, &bm, ReduceOp::Sum, 0)?
                    } else {
                        decomposed_matmul_reduce_scatter(&b, &a, &bm, ReduceOp::Sum, 0, None)?
                    };
                    w.into_value(WAIT)?
                };
                let dt = t0.elapsed();
                Ok((dt, vec![b.download(&outs)?]))
            };
            let barrier = || -> Result<()> { b.barrier()?.wait(WAIT).map(|_| ()) };
            let (_, reference) = run(false)?;
            for _ in 0..args.warmup {
                barrier()?;
                run(true)?;
                barrier()?;
                run(false)?;
            }
            let (mut tf, mut tu, mut wrong) = (Vec::new(), Vec::new(), 0u64);
            for i in 0..args.iters {
                // Alternate which path goes first after the barrier: the first call of a pair
                // pays for what the previous one left (freed blocks, cold caches), which an A/A
                // run showed as a steady 10-15 % bias against the first slot.
                for fused in if i % 2 == 0 { [true, false] } else { [false, true] } {
                    barrier()?;
                    let (t, o) = run(fused)?;
                    if fused {
                        tf.push(t.as_secs_f64() * 1e6);
                    } else {
                        tu.push(t.as_secs_f64() * 1e6);
                    }
                    wrong += (o != reference) as u64;
                }
            }
            let v = max_over_ranks(&b, &[median(&mut tu), median(&mut tf), wrong as f64])?;
            if me == 0 {
                println!(
                    "  {op:>28}  {:>16}  {:>10}  {}  {}  {:7.2}  {:6}",
                    format!("{a_shape:?}"),
                    format!("[{k}, {n}]"),
                    crate::table::time_str(v[0]),
                    crate::table::time_str(v[1]),
                    v[0] / v[1],
                    v[2] as u64
                );
            }
        }
    }
    Ok(())
}
