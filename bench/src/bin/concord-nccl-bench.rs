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
//!
//! `--phases` (first, then the rest): where the time of a small all_reduce goes, per op, for
//! `--iters` back-to-back ops with validation off, out of place and in place — the caller's
//! issue call (checks, output allocation, queueing), the progress thread's launches (time from
//! the first issue until every op is launched), the GPU (CUDA events around the window), the
//! wait for all — next to the raw NCCL loop's GPU and host time on the same GPU, and the costs
//! of single steps of the issue path (`capabilities()` for the call checks, one stream-ordered
//! output allocation with the memory pool's default release threshold and with freed memory
//! kept).
//!
//! `--order-check` (alone): with validation off, rank 0's earlier all_reduce must complete
//! while rank 1 holds the later one back until it has seen the earlier one complete (see
//! `order_check`); fails named after 4 s otherwise. `dist/run-gpu.sh bench --ranks 2 --order-check`.

use clap::Parser;
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Tensor, Work, WorldInfo};
use concord_harness::launch;
use concord_nccl::{probe, NcclBackend, NcclBuffer};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(about = "NCCL timings: init, 1 KiB latency, busbw per op (one process per GPU)")]
struct Args {
    #[command(flatten)]
    common: concord_bench::Common,
    /// First print the per-phase breakdown of a small all_reduce (see the docs above).
    #[arg(long)]
    phases: bool,
    /// Bytes of the all_reduce of `--phases` (f32).
    #[arg(long, default_value_t = 8)]
    phase_bytes: usize,
    /// Only the order check (2 ranks or more; see `order_check`), then exit.
    #[arg(long)]
    order_check: bool,
}

/// `--order-check`: `async::earlier_op_completes_before_a_later_one_is_issued` with validation
/// off (the conformance suites run with it on, where headers tell which ops every rank issued).
/// Rank 0 issues all_reduce #1 and #2 back to back and waits for #1; rank 1 issues #2 only once
/// rank 0 has seen #1 complete (a file beside the world's; a legal program). A backend that
/// completes #1 with the ops issued after it (one completion event after a burst) leaves #1
/// pending for good while rank 1 has long finished it: the check fails once #1 is still pending
/// 4 s after rank 1 finished it. Ranks past 1 take part in #1 and #2 like rank 1 but wait for
/// nothing. Repeated `rounds` times (the batching is a race between the issue and the launch).
fn order_check(b: &NcclBackend, world: &WorldInfo, rounds: usize, say: &dyn Fn(String)) -> Result<(), CollectiveError> {
    const LAG: Duration = Duration::from_secs(4);
    let fail = |m: String| CollectiveError::Backend(format!("order check (validation off) on rank {}: {m}", b.rank()));
    b.set_validation(false);
    let x = b.upload(&Tensor::from_vec(&[4], vec![1.0f32; 4]))?;
    let y = b.upload(&Tensor::from_vec(&[2], vec![1.0f32; 2]))?;
    let dir = std::env::temp_dir();
    let file = |what: &str, r: usize| dir.join(format!("concord-order-check-{}-{r}-{what}", world.world_id));
    let wait_file = |p: &std::path::Path| {
        let end = Instant::now() + WAIT;
        while !p.exists() {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    };
    let want = b.world_size() as f32;
    let expect = |got: &NcclBuffer, what: &str| -> Result<(), CollectiveError> {
        let t = b.download(got)?;
        match t.as_slice::<f32>().iter().position(|v| *v != want) {
            None => Ok(()),
            Some(i) => Err(fail(format!("{what}: element {i} is {}, expected {want}", t.as_slice::<f32>()[i]))),
        }
    };
    let mut slowest = Duration::ZERO;
    // Counts the jobs that left their event to a batch: a check whose ops never batched
    // exercised nothing, and says so.
    let _ = b.profile_progress(true);
    for r in 0..rounds {
        b.barrier()?.wait(WAIT)?;
        let (seen, done1) = (file("seen", r), file("done1", r));
        if b.rank() != 0 {
            let out = b.all_reduce(&x, ReduceOp::Sum)?.into_value(WAIT)?;
            if b.rank() == 1 {
                std::fs::write(&done1, b"1").map_err(|e| fail(format!("writing {}: {e}", done1.display())))?;
                if !wait_file(&seen) {
                    return Err(fail(format!("rank 0 never said it saw op #1 complete (round {r})")));
                }
            }
            let out2 = b.all_reduce(&y, ReduceOp::Sum)?.into_value(WAIT)?;
            expect(&out, "op #1")?;
            expect(&out2, "op #2")?;
            b.barrier()?.wait(WAIT)?;
            continue;
        }
        let first = b.all_reduce(&x, ReduceOp::Sum)?;
        let second = b.all_reduce(&y, ReduceOp::Sum)?;
        let t0 = Instant::now();
        let mut finished_on_1: Option<Instant> = None;
        let verdict = loop {
            match first.wait(Duration::from_millis(50)) {
                Ok(_) => break Ok(t0.elapsed()),
                Err(e) if e.name() != "timeout" => break Err(fail(format!("op #1 (round {r}): {e}"))),
                Err(_) => {}
            }
            if done1.exists() && finished_on_1.get_or_insert_with(Instant::now).elapsed() > LAG {
                break Err(fail(format!(
                    "all_reduce #1 is still pending {:?} after issue, {LAG:?} after rank 1 finished it (round {r}); the only \
                     other op this rank issued (#2) waits for rank 1, which issues it only once #1 has completed here",
                    t0.elapsed()
                )));
            }
            if t0.elapsed() > WAIT {
                break Err(fail(format!("op #1 pending after {:?}; rank 1 never finished it (round {r})", t0.elapsed())));
            }
        };
        // Rank 1 goes on either way, so that #2 (and the world) ends.
        std::fs::write(&seen, b"1").map_err(|e| fail(format!("writing {}: {e}", seen.display())))?;
        let second_done = second.wait(WAIT).map(|_| ());
        let _ = std::fs::remove_file(&done1);
        slowest = slowest.max(verdict?);
        second_done?;
        expect(first.wait(WAIT)?, "op #1")?;
        expect(second.wait(WAIT)?, "op #2")?;
        // Rank 1 has passed its wait for `seen` once it joins the next barrier.
        b.barrier()?.wait(WAIT)?;
        let _ = std::fs::remove_file(&seen);
    }
    let share = b.profile_progress(false).iter().find(|(k, _)| *k == "batched_share").map_or(0.0, |(_, v)| *v);
    let engaged = if share > 0.0 {
        format!("{:.0} % of this rank's jobs left their event to a batch", share * 100.0)
    } else {
        "NO job of this rank left its event to a batch: the batching path was not exercised (counter frozen, no board, or batch=0)"
            .to_string()
    };
    say(format!(
        "# order check (validation off, {} ranks, {rounds} rounds): all_reduce #1 completed within {:.1} ms of issue while rank 1 held #2 back: OK; {engaged}",
        b.world_size(),
        slowest.as_secs_f64() * 1e3
    ));
    b.set_validation(true);
    Ok(())
}

/// Per-op microseconds of `n` back-to-back all_reduce of `x`: (issue call, all launched, GPU
/// by events, all done).
fn phase_window(b: &NcclBackend, x: &concord_nccl::NcclBuffer, in_place: bool, n: usize) -> Result<[f64; 4], CollectiveError> {
    b.barrier()?.wait(WAIT)?;
    let start = b.mark()?;
    let t0 = Instant::now();
    let mut issue = Duration::ZERO;
    let mut works = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        works.push(if in_place { b.all_reduce_(x, ReduceOp::Sum)? } else { b.all_reduce(x, ReduceOp::Sum)? });
        issue += t.elapsed();
    }
    let launched_ok = b.wait_launched(WAIT);
    let launched = t0.elapsed();
    let end = b.mark()?;
    for w in &works {
        w.wait(WAIT)?;
    }
    let done = t0.elapsed();
    if !launched_ok {
        return Err(CollectiveError::Backend("phases: the ops were not launched within the wait".into()));
    }
    let gpu = b.elapsed(&start, &end, WAIT)?;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Ok([per(issue), per(launched), per(gpu), per(done)])
}

/// Mean microseconds of `f` over `n` calls.
fn per_call(n: usize, mut f: impl FnMut() -> Result<(), CollectiveError>) -> Result<f64, CollectiveError> {
    let t = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

fn phases(b: &NcclBackend, world: &WorldInfo, bytes: usize, n: usize, say: &dyn Fn(String)) -> Result<(), CollectiveError> {
    let count = (bytes / 4).max(1);
    let was = b.validating();
    b.set_validation(false);
    let x = b.upload(&Tensor::from_vec(&[count], vec![1.0f32; count]))?;
    let pool_default = b.pool_release_threshold().unwrap_or(0);
    say(format!(
        "# phases: all_reduce {} B (f32 x {count}), {} ranks, {}, validation off, {n} ops back to back; microseconds per op",
        count * 4,
        b.world_size(),
        b.launch_mode()
    ));
    say("#   issue: the caller's all_reduce call (checks, output allocation, queueing the job)".into());
    say("#   launched: first issue -> every op launched by the progress thread (its per-op throughput when it is the bottleneck)".into());
    say("#   (rank 0's issue, launched and profile; with several ranks the gpu column follows the slowest rank's launches)".into());
    say("#   gpu: CUDA events around the window (what the table reports); done: first issue -> every wait returned".into());
    say(format!("#   {:<14} {:>9} {:>9} {:>9} {:>9}", "placement", "issue", "launched", "gpu", "done"));
    for (name, in_place, keep) in [("out-of-place", false, false), ("out-of-place*", false, true), ("in-place", true, false)] {
        let _ = b.keep_pool_memory(if keep { u64::MAX } else { pool_default });
        let _ = phase_window(b, &x, in_place, n.min(50))?; // warm-up
        let _ = b.profile_progress(true);
        let [i, l, g, d] = phase_window(b, &x, in_place, n)?;
        let prof = b.profile_progress(false);
        say(format!("#   {name:<14} {i:9.2} {l:9.2} {g:9.2} {d:9.2}"));
        say(format!(
            "#   {:<14} progress thread per job (us; batched_share: the share of jobs that left their event to a batch): {}",
            "",
            prof.iter().map(|(k, v)| format!("{k} {v:.2}")).collect::<Vec<_>>().join(", ")
        ));
    }
    say("#   (*: the GPU memory pool keeps freed memory, as concord-bench sets it; the rows above use the default release threshold)"
        .into());
    let (hits, misses) = b.alloc_cache_stats();
    say(format!(
        "#   block cache (option alloc_cache): {hits} allocations on the rank's stream served from freed blocks, {misses} from the pool"
    ));
    // The raw loop on the same GPU: nccl-tests' blocking communicator, then one configured as
    // the backend's (non-blocking, polled after every call): what NCCL's mode costs by itself.
    for blocking in [true, false] {
        let mode = if blocking { concord_nccl::reference::RawMode::Blocking } else { concord_nccl::reference::RawMode::NonBlocking };
        match concord_bench::nccl::make_raw(b, world, mode) {
            Ok(mut raw) => {
                for in_place in [false, true] {
                    let step = concord_nccl::reference::RawStep {
                        op: concord_nccl::reference::RawOp::AllReduce,
                        count,
                        dtype: DType::F32,
                        redop: ReduceOp::Sum,
                        root: 0,
                        in_place,
                        warmup: 50,
                        iters: n,
                        window: n,
                        buffers: 1,
                        events: false,
                        zeros: false,
                        thread: false,
                        nap: false,
                        pin: None,
                        keep: false,
                        block: false,
                        group: false,
                    };
                    match raw.time(&step) {
                    Ok(t) => say(format!(
                        "#   raw NCCL {:<5}{}: gpu {:9.2}, host (launches + wait) {:9.2}   (ncclAllReduce in a tight loop, {} communicator)",
                        if in_place { "in" } else { "out" },
                        if blocking { "" } else { " nb" },
                        t.per_op.as_secs_f64() * 1e6,
                        t.wall_per_op.as_secs_f64() * 1e6,
                        if blocking { "blocking" } else { "non-blocking" }
                    )),
                    Err(e) => say(format!("#   raw NCCL: {e}")),
                }
                }
            }
            Err(e) => say(format!("#   raw NCCL: not run: {e}")),
        }
    }
    // Single steps of the issue path.
    let caps = per_call(n, || {
        std::hint::black_box(b.capabilities());
        Ok(())
    })?;
    let clock = per_call(n * 20, || {
        std::hint::black_box(Instant::now());
        Ok(())
    })?;
    say(format!("#   step costs: capabilities() {caps:.2}, Instant::now() {clock:.3}"));
    for keep in [false, true] {
        let _ = b.keep_pool_memory(if keep { u64::MAX } else { pool_default });
        let mut held = Vec::with_capacity(n);
        let alloc = per_call(n, || {
            held.push(b.alloc(DType::F32, &[count])?);
            Ok(())
        })?;
        let free = per_call(1, || {
            held.clear();
            Ok(())
        })? / n as f64;
        // A synchronising call (as the bench's downloads are), then allocate again.
        b.download(&x)?;
        let again = per_call(n, || {
            held.push(b.alloc(DType::F32, &[count])?);
            Ok(())
        })?;
        held.clear();
        say(format!(
            "#   step costs, pool {}: alloc {alloc:.2}, free {free:.2}, alloc after a synchronising download {again:.2}",
            if keep { "keeps freed memory" } else { "default release threshold" }
        ));
    }
    let _ = b.keep_pool_memory(pool_default);
    b.set_validation(was);
    b.barrier()?.wait(WAIT)?;
    Ok(())
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

fn rank_main(world: &WorldInfo, args: &Args) -> Result<(), CollectiveError> {
    let a = &args.common;
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
    if args.order_check {
        return order_check(&b, world, 20, &say);
    }
    if args.phases {
        phases(&b, world, args.phase_bytes, iters, &say)?;
    }
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
    let args = Args::parse();
    let a = &args.common;
    if let Some(world) = launch::rank_world() {
        if let Err(e) = rank_main(&world, &args) {
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
    a.launch_and_wait::<NcclBackend>("nccl");
}
