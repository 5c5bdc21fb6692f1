//! `concord-bench --backend shm --fused [--ranks N] [-n iters] [-w warmup]`: each fused op as the
//! backend provides it (`Backend::fused_*`, native when `Capabilities::fused` says `Pipelined`)
//! against the trait's unfused decomposition (`concord_core::fused::decomposed_*`, the seed's
//! fallbacks) on the same backend, same inputs, same matmul kernel, over a range of shapes.
//!
//! Method: exact-by-construction inputs (small integers), so every path must give the oracle's
//! bits; iterations alternate between two input sets written into the same buffers (a result
//! kept from an earlier call on those buffers is then wrong), and every iteration's outputs, of
//! both paths, warm-up included, are compared with the oracle's result for its set
//! (`concord_oracle::expected_fused_for`: every rank's inputs, regenerated on each rank, the
//! product written out on the host; tolerance `fused_tolerance`, exact here), computed once per
//! set outside the timed loop. So a bug both paths share (a backend keeping the trait's default
//! fused ops over a wrong all_gather) is wrong too, not only a fused op that differs from its
//! decomposition. `#wrong`: the iterations that differ, summed over ranks; each rank prints a
//! `WRONG` line naming op, shape, path, iteration, rank, first bad index, got and expected for
//! its first three. Any wrong iteration fails the run (exit 1). `-e` keeps the shapes whose `a`
//! shard is at most that many bytes. Iterations alternate fused / unfused, each after a barrier, the
//! pair's order swapped every iteration, so machine load and the first slot's cost hit both alike; each rank times its own calls (issue to completed wait) and
//! the row shows the slowest rank's median (an all_reduce max). Rank 0 prints the table.

use crate::Args;
use concord_core::fused::{decomposed_all_gather_matmul, decomposed_matmul_reduce_scatter};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Result, Tensor};
use concord_harness::launch;
use concord_oracle::{expected_fused_for, fused_tolerance, FusedCall, FusedInputs};
use std::time::{Duration, Instant};

/// (op, m rows per rank, k, n).
pub const SHAPES: &[(usize, usize, usize)] = &[(16, 64, 64), (64, 128, 128), (256, 256, 256), (1024, 256, 256), (2048, 512, 256)];

const WAIT: Duration = Duration::from_secs(600);

/// The whole `--fused` program: the parent launches the ranks; a rank runs [`rank`].
pub fn fused_main<B: Backend>(name: &str, args: &Args) -> i32 {
    fused_main_with::<B>(name, args, std::env::args().skip(1).collect())
}

/// [`fused_main`] with the arguments the ranks get (`argv`; a test's own are not the bench's).
pub fn fused_main_with<B: Backend>(name: &str, args: &Args, argv: Vec<String>) -> i32 {
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
        s.args = argv;
        s.options = concord_harness::worker::parse_options(&args.opts).map_err(std::io::Error::other)?;
        s.foreign_shm = B::SHM_PREFIXES.iter().map(|p| p.to_string()).collect();
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
    // The backend's set-up is bounded by the setup timeout, as in the main bench (`crate::rank`);
    // the fused ops after it by `--deadline-s` (the parent's).
    let setup = concord_harness::config::Config::global().setup_timeout;
    let beat = crate::rank::Beat::watched(world.rank, crate::rank::INIT_PHASE, setup, |_, m| eprintln!("concord-bench --fused: {m}"));
    let b = B::init(world)?;
    beat.limit("the fused ops (bounded by --deadline-s)".into(), Duration::from_millis(u64::MAX));
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
    // `-e`: the shapes whose `a` shard (f32) is at most that many bytes (default 64M: all).
    let mut total_wrong = 0u64;
    for &(m, k, n) in SHAPES.iter().filter(|(m, k, _)| m * k * dt.size() <= args.max_bytes) {
        for op in ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"] {
            let ag = op == "fused_all_gather_matmul";
            let (a_shape, m_rs) = if ag { (vec![m, k], m) } else { (vec![m * ws, k], m * ws) };
            // Two input sets, written into the same buffers alternately (set `i % 2` for
            // iteration `i`), each with its own reference: a result computed for the other
            // set (kept by the buffers' addresses, a workspace not rewritten) is wrong.
            let set_a = |r: usize, s: usize| Tensor::from_f64(dt, &a_shape, &ints(m_rs * k, r + 17 * s, -2, 5));
            let set_b = |s: usize| Tensor::from_f64(dt, &[k, n], &ints(k * n, 7 + s, -1, 3));
            let a = b.upload(&set_a(me, 0))?;
            let bm = b.upload(&set_b(0))?;
            let bs = [bm.clone()];
            let put = |s: usize| -> Result<()> {
                b.write(&a, &set_a(me, s))?;
                b.write(&bm, &set_b(s))
            };
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
            // The oracle's outputs of this rank for each set (all-gather-matmul: the gathered `a`
            // and the product; matmul-reduce-scatter: this rank's block), from every rank's
            // inputs regenerated here: no communication, outside the timed loop.
            let call = if ag {
                FusedCall::AllGatherMatmul { dim: 0, scaling: None }
            } else {
                FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 0, scaling: None }
            };
            let caps = b.capabilities();
            let mut references = Vec::with_capacity(SETS);
            for s in 0..SETS {
                let inputs: Vec<FusedInputs> = (0..ws).map(|r| FusedInputs { a: set_a(r, s), bs: vec![set_b(s)], a_scale: None }).collect();
                let mut every = expected_fused_for(&call, &inputs, &caps, Some(me)).map_err(|e| {
                    CollectiveError::Backend(format!("{op} a {a_shape:?} b [{k}, {n}]: the oracle refuses the bench's own call: {e:?}"))
                })?;
                references.push(every.swap_remove(me));
            }
            // Exact: small integers (`fused_tolerance`'s exact-by-construction case).
            let tol = fused_tolerance(dt, dt, k, ws, !ag, 1.0, true);
            let (mut wrong, mut reported) = (0u64, 0usize);
            let mut check = |o: &[Tensor], fused: bool, i: usize, phase: &str| {
                let Some((out, m)) = first_difference(o, &references[i % SETS], tol) else { return };
                wrong += 1;
                if reported < 3 {
                    reported += 1;
                    let what = if ag && out == 0 { "the all-gathered a".to_string() } else { "the product".to_string() };
                    let path = if fused { "fused (as the backend provides it)" } else { "unfused (the decomposition)" };
                    eprintln!(
                        "WRONG: {op} a {a_shape:?} b [{k}, {n}] f32, {path}, {phase} iteration {i} (input set {}), rank {me} of {ws}: {what}: {m} (expected: the oracle's result for every rank's inputs)",
                        i % SETS
                    );
                }
            };
            for i in 0..args.warmup {
                put(i % SETS)?;
                barrier()?;
                check(&run(true)?.1, true, i, "warm-up");
                barrier()?;
                check(&run(false)?.1, false, i, "warm-up");
            }
            let (mut tf, mut tu) = (Vec::new(), Vec::new());
            for i in 0..args.iters {
                put(i % SETS)?;
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
                    check(&o, fused, i, "timed");
                }
            }
            total_wrong += wrong;
            let v = max_over_ranks(&b, &[median(&mut tu), median(&mut tf)])?;
            let wrong_all = sum_over_ranks(&b, wrong as f64)?;
            if me == 0 {
                println!(
                    "  {op:>28}  {:>16}  {:>10}  {}  {}  {:7.2}  {:6}",
                    format!("{a_shape:?}"),
                    format!("[{k}, {n}]"),
                    crate::table::time_str(v[0]),
                    crate::table::time_str(v[1]),
                    v[0] / v[1],
                    wrong_all as u64
                );
            }
        }
    }
    let all = sum_over_ranks(&b, total_wrong as f64)? as u64;
    if me == 0 {
        println!("# Wrong results: {all} {}", if all == 0 { "OK" } else { "FAILED" });
    }
    if total_wrong > 0 {
        return Err(concord_core::CollectiveError::Backend(format!(
            "{total_wrong} wrong iteration result(s) on this rank (WRONG lines above): a fused op or its unfused decomposition differs from the oracle"
        )));
    }
    Ok(())
}

/// The input sets iterations alternate between.
const SETS: usize = 2;

/// The sum over ranks of one value.
fn sum_over_ranks<B: Backend>(b: &B, v: f64) -> Result<f64> {
    let buf = b.upload(&Tensor::from_vec(&[1], vec![v]))?;
    let w = b.all_reduce(&buf, ReduceOp::Sum)?;
    Ok(b.download(w.wait(WAIT)?)?.as_slice::<f64>()[0])
}

/// The first output where `got` differs from `want` under `tol` (`concord_oracle::compare`: first
/// bad index, got / expected, how many elements differ), with its index; `None` when every
/// output matches. A different output count is a difference of output 0.
fn first_difference(got: &[Tensor], want: &[Tensor], tol: concord_oracle::Tolerance) -> Option<(usize, concord_oracle::Mismatch)> {
    if got.len() != want.len() {
        let detail = format!("{} outputs, expected {}", got.len(), want.len());
        let m =
            concord_oracle::Mismatch { index: 0, coords: Vec::new(), got: String::new(), expected: String::new(), bad_count: 0, detail };
        return Some((0, m));
    }
    got.iter().zip(want).enumerate().find_map(|(o, (g, w))| concord_oracle::compare(g, w, tol).err().map(|m| (o, m)))
}
