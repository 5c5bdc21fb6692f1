//! `cargo xtask autotune --backend shm|nccl [--ranks N]`: tunes the built-in choice sets on a
//! built-in backend (shm, or NCCL with one GPU per rank) over sizes 4 KiB – 64 MiB and prints every table and the winners; ranks are started by
//! the harness launcher (this example re-executed once per rank). A benchmark, not a test.
//!
//! With `--measure`: per size, every applicable all_reduce choice is also timed on its own
//! (busbw, nccl-tests' factor 2(n-1)/n) next to the tuned winner; the pre-sync of one op is
//! compared with that of five ops in one call; and `--timeout-phase` ends with rank 1 sleeping
//! in a choice while the others decide (time-to-decision on the live ranks).

use clap::Parser;
use concord_autotune::{choices, Autotuner, Choice, ChoiceCtx, Config, Env, OpInstance, Phase, Policy, Request, Tuner};
use concord_core::{Backend, DType, OpKind, ReduceOp, WorldInfo};
use concord_harness::launch;
use concord_nccl::NcclBackend;
use concord_shm::ShmBackend;
use concord_store::Store;
use std::time::{Duration, Instant};

#[derive(Parser, Clone, Debug)]
#[command(about = "Tune the built-in collective choice sets on a built-in backend (shm, nccl)")]
struct Args {
    #[arg(long, default_value = "shm")]
    backend: String,
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Sizes in KiB (default 4 KiB – 64 MiB, powers of 4).
    #[arg(long = "sizes-kib", value_delimiter = ',')]
    sizes_kib: Vec<usize>,
    /// Ops: all_reduce, all_gather, reduce_scatter, all_to_all.
    #[arg(long, value_delimiter = ',', default_value = "all_reduce,all_gather,reduce_scatter,all_to_all")]
    ops: Vec<String>,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Autotune timeout per call (one call per op covers every size), seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Also time each all_reduce choice on its own, and the pre-sync of 1 vs 5 ops.
    #[arg(long)]
    measure: bool,
    /// Repetitions of the measurements (medians are reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// End with the timeout phase (rank 1 sleeps in a choice).
    #[arg(long)]
    timeout_phase: bool,
    #[arg(long, default_value_t = 900)]
    deadline_s: u64,
}

fn sizes(a: &Args) -> Vec<usize> {
    if a.sizes_kib.is_empty() {
        (0..8).map(|i| 4096usize << (2 * i)).collect()
    } else {
        a.sizes_kib.iter().map(|k| k << 10).collect()
    }
}

fn inst(op: &str, bytes: usize, ws: usize) -> OpInstance {
    let n = (bytes / 4).max(ws);
    let n = n - n % ws;
    match op {
        "all_reduce" => OpInstance::all_reduce(DType::F32, &[n], ReduceOp::Sum),
        "all_gather" => OpInstance::all_gather(DType::F32, &[n / ws]),
        "reduce_scatter" => OpInstance::reduce_scatter(DType::F32, &[n], ReduceOp::Sum),
        "all_to_all" => OpInstance::all_to_all(DType::F32, &[n]),
        o => panic!("unknown op {o}"),
    }
}

fn med(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn rank_main<B: Backend>(world: &WorldInfo, a: &Args) {
    let b = B::init(world).unwrap_or_else(|e| panic!("rank {}: {e}", world.rank));
    let store = Store::open(&world.store_path, world.world_size, Duration::from_secs(60)).expect("store");
    let ws = world.world_size;
    let r0 = world.rank == 0;
    let cfg = Config { timeout: Duration::from_secs(a.timeout_s), runs: a.runs, warmup: 1, policy: Policy::Max, ..Config::default() };
    let tuner = <Tuner as Autotuner<B>>::new(cfg.clone());
    let mut call = 0usize;
    let mut tag = || {
        call += 1;
        format!("{}/tune{call}", world.world_id)
    };
    // 1. Every op × size, one call per op (one pre-sync for all its sizes).
    let mut winners = Vec::new();
    let mut overheads: Vec<(String, usize, f64, usize)> = Vec::new();
    for op in &a.ops {
        let reqs: Vec<Request<B>> = sizes(a).into_iter().map(|s| Request::builtin(inst(op, s, ws))).collect();
        let o = tuner.tune(&Env::new(&b, Some(&store), tag(), world.op_timeout), &reqs).expect("tune");
        if r0 {
            print!("{o}");
        }
        for (t, s) in o.tables.iter().zip(sizes(a)) {
            winners.push((op.clone(), s, t.winner.clone()));
            overheads.push((op.clone(), s, t.overhead().as_secs_f64() * 1e3, t.ran()));
        }
    }
    if r0 {
        println!("\nwinners ({ws} ranks, policy max):");
        for (op, s, w) in &winners {
            println!("  {op:<15} {:>9} KiB  {w}", s >> 10);
        }
        println!("\nautotuner overhead beyond the timed runs, per choice per op (this run):");
        for (op, s, ms, n) in &overheads {
            println!("  {op:<15} {:>9} KiB  {:.3} ms ({n} choices)", s >> 10, ms / (*n).max(1) as f64);
        }
    }
    if a.measure {
        measure(&b, &store, world, a, &tuner, &mut tag);
    }
    if a.timeout_phase {
        timeout_phase(&b, &store, world, &mut tag);
    }
}

fn busbw(bytes: usize, ws: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9 * 2.0 * (ws as f64 - 1.0) / ws as f64
}

/// Times `c` for `iters` calls between barriers: seconds per call (max over ranks via the store
/// would need another exchange; rank-local, after a barrier on both sides).
fn time_choice<B: Backend>(b: &B, c: &Choice<B>, i: &OpInstance, x: &B::Buffer, iters: usize) -> f64 {
    let t = Duration::from_secs(120);
    let ctx = ChoiceCtx { b, inst: i, phase: Phase::Use, deadline: Instant::now() + t, op_timeout: t };
    (c.run)(&ctx, x).expect("warm-up");
    b.barrier().unwrap().wait(t).unwrap();
    let t0 = Instant::now();
    for _ in 0..iters {
        (c.run)(&ctx, x).expect("run");
    }
    b.barrier().unwrap().wait(t).unwrap();
    t0.elapsed().as_secs_f64() / iters as f64
}

fn measure<B: Backend>(b: &B, store: &Store, world: &WorldInfo, a: &Args, tuner: &Tuner, tag: &mut impl FnMut() -> String) {
    let ws = world.world_size;
    let r0 = world.rank == 0;
    // Pre-sync of one op vs five ops in one call (small ops, medians of `repeat`).
    let small = || -> Vec<Request<B>> {
        vec![
            Request::builtin(OpInstance::all_reduce(DType::F32, &[1024], ReduceOp::Sum)),
            Request::builtin(OpInstance::all_reduce(DType::F32, &[4096], ReduceOp::Sum)),
            Request::builtin(OpInstance::all_gather(DType::F32, &[256])),
            Request::builtin(OpInstance::reduce_scatter(DType::F32, &[1024 * ws], ReduceOp::Sum)),
            Request::builtin(OpInstance::all_to_all(DType::F32, &[256 * ws])),
        ]
    };
    let (mut one, mut five, mut per_choice) = (Vec::new(), Vec::new(), Vec::new());
    let t = Duration::from_secs(60);
    for _ in 0..a.repeat {
        // Each repetition: the median of 9 calls, every call started right after a barrier so
        // that the pre-sync measures the exchange, not how late the last rank arrived.
        let (mut o1s, mut o5s, mut ohs, mut sys) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..9 {
            b.barrier().unwrap().wait(t).unwrap();
            let o1 = tuner.tune(&Env::new(b, Some(store), tag(), world.op_timeout), &small()[..1]).unwrap();
            b.barrier().unwrap().wait(t).unwrap();
            let o5 = tuner.tune(&Env::new(b, Some(store), tag(), world.op_timeout), &small()).unwrap();
            o1s.push(o1.presync_time.as_secs_f64() * 1e3);
            o5s.push(o5.presync_time.as_secs_f64() * 1e3);
            let n = o5.tables.iter().map(|t| t.ran()).sum::<usize>().max(1) as f64;
            ohs.push(o5.tables.iter().map(|t| t.overhead().as_secs_f64() * 1e3).sum::<f64>() / n);
            sys.push(o5.tables.iter().map(|t| t.sync.as_secs_f64() * 1e3).sum::<f64>() / n);
        }
        one.push(med(&mut o1s));
        five.push(med(&mut o5s));
        per_choice.push((med(&mut ohs), med(&mut sys)));
    }
    if r0 {
        println!(
            "\npre-sync (each repetition the median of 9 calls after a barrier), medians of {}: 1 op {:.3} ms, 5 ops in one call {:.3} ms ({:.2}x); raw 1 op {one:.3?}, 5 ops {five:.3?}",
            a.repeat,
            med(&mut one.clone()),
            med(&mut five.clone()),
            med(&mut five.clone()) / med(&mut one.clone())
        );
        let mut oh: Vec<f64> = per_choice.iter().map(|p| p.0).collect();
        let mut sy: Vec<f64> = per_choice.iter().map(|p| p.1).collect();
        println!(
            "overhead beyond the timed runs per choice per op (5 small ops), median of {}: {:.3} ms, of which agreeing through the store {:.3} ms; raw (overhead, agreeing) {per_choice:.3?}",
            a.repeat,
            med(&mut oh),
            med(&mut sy)
        );
        println!("\nall_reduce f32 sum busbw (GB/s), medians of {} (tune, then time every choice and the winner):", a.repeat);
        println!("  {:>9}  {:>8} {:>8} {:>6}", "KiB", "tuned", "best", "ratio");
    }
    for s in sizes(a) {
        let i = inst("all_reduce", s, ws);
        let iters = (64usize << 20).div_ceil(s).clamp(3, 50);
        let (mut ratios, mut tuned_bw, mut best_bw) = (Vec::new(), Vec::new(), Vec::new());
        let (mut winners, mut bests) = (Vec::new(), Vec::new());
        for _ in 0..a.repeat {
            let req = Request::<B>::builtin(i.clone());
            let o = tuner.tune(&Env::new(b, Some(store), tag(), world.op_timeout), std::slice::from_ref(&req)).unwrap();
            let winner = o.winner(0).to_string();
            let x = b.upload(&concord_core::Tensor::from_vec(&i.shape, vec![1.0f32; i.numel()])).unwrap();
            let mut best = (String::new(), 0.0f64);
            let mut tuned = 0.0;
            for c in choices::builtin::<B>(OpKind::AllReduce).iter().filter(|c| (c.applies)(&i, ws)) {
                let bw = busbw(i.bytes(), ws, time_choice(b, c, &i, &x, iters));
                if bw > best.1 {
                    best = (c.name.clone(), bw);
                }
                if c.name == winner {
                    tuned = bw;
                }
            }
            winners.push(winner);
            bests.push(best.0.clone());
            ratios.push(tuned / best.1);
            tuned_bw.push(tuned);
            best_bw.push(best.1);
        }
        if r0 {
            println!(
                "  {:>9}  {:>8.3} {:>8.3} {:>6.2}   ratios {ratios:.2?}, tuned winners {winners:?}, best fixed {bests:?}",
                s >> 10,
                med(&mut tuned_bw),
                med(&mut best_bw),
                med(&mut ratios.clone())
            );
        }
    }
}

fn timeout_phase<B: Backend>(b: &B, store: &Store, world: &WorldInfo, tag: &mut impl FnMut() -> String) {
    let timeout = Duration::from_secs(1);
    let sleepy = Choice::<B>::new("sleeps_3s_on_rank1", |c: &ChoiceCtx<'_, B>, x| {
        if c.b.rank() == 1 && c.phase == Phase::Screen {
            std::thread::sleep(Duration::from_secs(3));
        }
        c.wait(c.b.all_reduce(x, ReduceOp::Sum)?)
    });
    let mut set = choices::builtin::<B>(OpKind::AllReduce);
    set.insert(1, sleepy);
    let req = Request::new(OpInstance::all_reduce(DType::F32, &[1024], ReduceOp::Sum), set, "native");
    let tuner = <Tuner as Autotuner<B>>::new(Config { timeout, runs: 3, ..Config::default() });
    let t0 = Instant::now();
    let o = tuner.tune(&Env::new(b, Some(store), tag(), world.op_timeout), &[req]).unwrap();
    let el = t0.elapsed();
    // stderr: every rank's line shows (only rank 0's stdout is kept by the launcher).
    eprintln!(
        "timeout phase: rank {} decided `{}` after {:.1} ms (autotune timeout {} ms){}",
        world.rank,
        o.winner(0),
        el.as_secs_f64() * 1e3,
        timeout.as_millis(),
        if world.rank == 0 { format!("\n{o}") } else { String::new() }
    );
}

fn main() {
    let a = Args::parse();
    if let Some(world) = launch::rank_world() {
        match a.backend.as_str() {
            "nccl" => rank_main::<NcclBackend>(&world, &a),
            _ => rank_main::<ShmBackend>(&world, &a),
        }
        return;
    }
    if a.backend != "shm" && a.backend != "nccl" {
        eprintln!("concord autotune: the built-in backends that can be tuned from here are shm and nccl (got `{}`)", a.backend);
        std::process::exit(2);
    }
    let spec = launch::LaunchSpec::current_exe(a.ranks, &a.backend).expect("current exe");
    let report = launch::launch(&spec).expect("launch").wait(Duration::from_secs(a.deadline_s));
    if let Err(e) = report.check() {
        eprintln!("concord autotune failed: {e}");
        std::process::exit(1);
    }
}
