//! The parent side: checks the command line, measures the memcpy reference, runs OpenMPI when
//! asked, launches the ranks (one persistent world for the whole run), merges their JSON lines
//! into nccl-tests' table, writes the JSON lines and the plot, and decides the exit status:
//! 0 done, 1 a wrong result, a failed rank or a hang, 2 cannot run here or bad arguments.

use crate::args::Args;
use crate::rank::{Msg, RankResult};
use crate::record::{now_unix, Machine, Record, SCHEMA};
use crate::spec::{self, BenchOp, Placement, Step};
use crate::table::{self, Cells, PeerCols, PeerRow};
use clap::Parser;
use concord_core::Backend;
use concord_harness::launch;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a CPU backend's time is taken (the default).
pub const WALL_CLOCK: &str =
    "wall-clock: host Instant around k back-to-back issues plus the waits of all k, per window; per rank the median over the windows \
of each window's mean per iteration (one window: its mean; --window caps a window), averaged over ranks";

/// What a backend adds to the generic benchmark.
pub struct Hooks<B: Backend> {
    /// Whether a world of `ranks` can run here; `Err(why)` prints `CANNOT RUN: why`, exit 2.
    pub available: fn(ranks: usize) -> Result<(), String>,
    /// Called on every rank after `init` (e.g. turn off a backend's own cross-rank validation:
    /// the bench checks every output itself).
    pub prepare: fn(&B),
    /// The backend's version, for the JSON records.
    pub version: fn(&B) -> String,
    /// How the time is taken, for the JSON records and the header (without a `clock`).
    pub timing: &'static str,
    /// A device-side clock (CUDA events for NCCL); `None`: host wall-clock ([`WALL_CLOCK`]).
    pub clock: Option<crate::ext::Clock<B>>,
    /// A reference timed in the same run and printed next to the backend (NCCL: raw NCCL calls).
    pub reference: Option<crate::ext::MakeReference<B>>,
    /// Device-side inputs and output reads, for cheap checking at large sizes.
    pub data: Option<crate::ext::DeviceData<B>>,
}

fn always(_: usize) -> Result<(), String> {
    Ok(())
}
fn nothing<B>(_: &B) {}
fn no_version<B>(_: &B) -> String {
    String::new()
}

impl<B: Backend> Default for Hooks<B> {
    fn default() -> Self {
        Hooks {
            available: always,
            prepare: nothing::<B>,
            version: no_version::<B>,
            timing: WALL_CLOCK,
            clock: None,
            reference: None,
            data: None,
        }
    }
}

/// A downstream backend's benchmark binary: `fn main() { concord_bench::bench_main::<MyBackend>("mine") }`.
pub fn bench_main<B: Backend>(name: &str) -> ! {
    bench_main_with::<B>(name, &Hooks::default())
}

/// [`bench_main`] with [`Hooks`].
pub fn bench_main_with<B: Backend>(name: &str, hooks: &Hooks<B>) -> ! {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = Args::parse();
    // A reader that leaves early (`| head`): exit 141 after the ranks are ended, no backtrace.
    let code = concord_harness::pipe::main_quiet_on_broken_pipe(std::panic::AssertUnwindSafe(|| main_with::<B>(name, hooks, &args, argv)));
    std::process::exit(code)
}

/// The whole program for one backend: a launched rank runs its steps; otherwise `--plot` /
/// `--compare` run alone, or the benchmark runs. `argv`: the arguments the ranks get.
pub fn main_with<B: Backend>(name: &str, hooks: &Hooks<B>, args: &Args, argv: Vec<String>) -> i32 {
    // Started by torchrun / mpirun / srun: this process is one rank; rank 0 prints the table.
    if let Some(l) = &concord_harness::config::Config::global().launch {
        if tools(args).is_none() {
            return crate::external::main::<B>(name, hooks, args, argv, l);
        }
    }
    if let Some(world) = launch::rank_world() {
        return crate::rank::rank_main::<B>(&world, args, hooks);
    }
    if let Some(code) = tools(args) {
        return code;
    }
    if let Some(b) = args.backend.as_deref().filter(|b| *b != name) {
        eprintln!("concord-bench: this binary benchmarks `{name}`, not `{b}`");
        return 2;
    }
    run_parent::<B>(name, hooks, args, argv).code
}

/// `--plot` and `--compare`, which need no backend; `None` when neither was given.
pub fn tools(args: &Args) -> Option<i32> {
    if !args.plot.is_empty() {
        let out = PathBuf::from(args.o.clone().unwrap_or_else(|| "bench.svg".into()));
        return Some(match crate::plot::plot_files(&args.plot, &out) {
            Ok(()) => {
                println!("# plot: {}", out.display());
                0
            }
            Err(e) => {
                eprintln!("concord-bench --plot: {e}");
                2
            }
        });
    }
    if !args.compare.is_empty() {
        let load = |p: &PathBuf| crate::record::read_jsonl(p);
        return Some(match (load(&args.compare[0]), load(&args.compare[1])) {
            (Ok(a), Ok(b)) => match crate::compare::compare(&a, &b, args.threshold) {
                Ok((t, flagged)) => {
                    print!("{t}");
                    i32::from(flagged > 0)
                }
                Err(e) => {
                    eprintln!("concord-bench --compare: {e}");
                    2
                }
            },
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("concord-bench --compare: {e}");
                2
            }
        });
    }
    None
}

/// What a run produced.
#[derive(Debug, Default)]
pub struct Outcome {
    pub code: i32,
    pub records: Vec<Record>,
    /// Every wrong result, failed rank and hang, one line each.
    pub failures: Vec<String>,
    pub json: Option<PathBuf>,
    pub svg: Option<PathBuf>,
    /// The summary lines printed on stdout (`# ...`), as printed.
    pub lines: Vec<String>,
    /// The lines printed on stderr while the ranks ran (`FAILED: ...`, wrong results), as printed.
    pub warnings: Vec<String>,
}

/// Single-core memcpy bandwidth of `bytes` (bytes per second), best of 7 after a warm-up.
pub fn memcpy_bw(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best
}

/// `target/concord-bench` when this executable lives in a cargo target directory, else
/// `./concord-bench`.
fn default_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    for dir in exe.iter().flat_map(|e| e.ancestors().skip(1).take(4)) {
        if dir.join("CACHEDIR.TAG").exists() {
            return dir.join("concord-bench");
        }
    }
    PathBuf::from("concord-bench")
}

/// The source commit of this run: `CONCORD_GIT_COMMIT` when set (the GPU bundle's entry script
/// sets it from `dist/COMMIT`: on the GPU machine the working directory's `.git` need not be the
/// bundle's), else `git rev-parse` here.
fn git_commit() -> Option<String> {
    if let Some(c) = &concord_harness::config::Config::global().git_commit {
        return Some(c.clone());
    }
    let out = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `message` with every `rank <rank>` (as a whole number) written `rank *`: failures that differ
/// only in the rank they name compare equal.
fn blank_rank(message: &str, rank: usize) -> String {
    let needle = format!("rank {rank}");
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(&needle) {
        let after = &rest[i + needle.len()..];
        out.push_str(&rest[..i]);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(&needle);
        } else {
            out.push_str("rank *");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Prints above the progress bar.
struct Out {
    bar: Option<indicatif::ProgressBar>,
    lines: Vec<String>,
    warnings: Vec<String>,
}

impl Out {
    fn say(&mut self, s: String) {
        match &self.bar {
            Some(b) => b.suspend(|| println!("{s}")),
            None => println!("{s}"),
        }
        self.lines.push(s);
    }
    fn warn(&mut self, s: String) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{s}")),
            None => eprintln!("{s}"),
        }
        self.warnings.push(s);
    }
}

/// The ranks' message lines and how to end the ranks.
pub(crate) struct Ranks {
    pub(crate) rx: mpsc::Receiver<(usize, Option<String>)>,
    pub(crate) op_timeout: Duration,
    /// Waits up to the duration for the ranks to end; returns one HANG line per rank still
    /// running (given each rank's phase) and the launcher's check.
    #[allow(clippy::type_complexity)]
    pub(crate) finish: Box<dyn FnOnce(Duration, &[String]) -> (Vec<String>, Result<(), String>)>,
}

/// Launches `args.ranks` processes of this executable (the parent's way to get [`Ranks`]).
fn launch_ranks(name: &str, shm_prefixes: &[&str], args: &Args, argv: &[String]) -> Result<Ranks, String> {
    let spec = launch::LaunchSpec::current_exe(args.ranks, name).and_then(|mut s| {
        s.args = argv.to_vec();
        s.options = concord_harness::worker::parse_options(&args.opts).map_err(std::io::Error::other)?;
        s.pipe_stdout = true;
        s.foreign_shm = shm_prefixes.iter().map(|p| p.to_string()).collect();
        Ok(s)
    });
    let op_timeout = spec.as_ref().map(|s| s.op_timeout).unwrap_or(Duration::from_secs(15));
    let mut launched = spec.and_then(|s| launch::launch(&s)).map_err(|e| format!("cannot launch the ranks: {e}"))?;
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    for r in 0..args.ranks {
        let Some(stdout) = launched.take_stdout(r) else { continue };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((r, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((r, None));
        });
    }
    drop(tx);
    let finish = Box::new(move |within: Duration, phase: &[String]| {
        let report = launched.wait(within);
        let hangs = report
            .ranks
            .iter()
            .filter(|r| r.ended_by_launcher)
            .map(|r| format!("HANG: rank {} was still in {} at the deadline; ended ({})", r.rank, phase[r.rank], r.describe()))
            .collect();
        (hangs, report.check())
    });
    Ok(Ranks { rx, op_timeout, finish })
}

/// Runs the benchmark of backend `name` (see the module docs).
pub fn run_parent<B: Backend>(name: &str, hooks: &Hooks<B>, args: &Args, argv: Vec<String>) -> Outcome {
    run_parent_with::<B>(name, hooks, args, argv, &mut |a, v| launch_ranks(name, B::SHM_PREFIXES, a, v))
}

/// [`run_parent`] with the ranks from `get_ranks` (called after the header is printed).
#[allow(clippy::type_complexity)]
pub(crate) fn run_parent_with<B: Backend>(
    name: &str,
    hooks: &Hooks<B>,
    args: &Args,
    argv: Vec<String>,
    get_ranks: &mut dyn FnMut(&Args, &[String]) -> Result<Ranks, String>,
) -> Outcome {
    let mut outcome = Outcome::default();
    let bad = |e: String| {
        eprintln!("concord-bench: {e}");
        Outcome { code: 2, ..Outcome::default() }
    };
    let parsed = (|| -> Result<_, String> {
        let dtype = spec::parse_dtype(&args.dtype)?;
        let redop = spec::parse_redop(args.redop_name())?;
        let ops = BenchOp::parse_list(&args.op)?;
        let sizes = spec::sizes(args.min_bytes, args.max_bytes, args.factor)?;
        if args.ranks == 0 {
            return Err("--ranks must be at least 1".into());
        }
        if args.root >= args.ranks {
            return Err(format!("--root {} is not a rank of {}", args.root, args.ranks));
        }
        if ops.iter().any(|o| o.is_reduction()) && !redop.defined_for(dtype) {
            return Err(format!("-o {} is not defined for {}", redop.name(), dtype.name()));
        }
        if args.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        Ok((dtype, redop, ops, sizes))
    })();
    let (dtype, redop, ops, sizes) = match parsed {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    let asked = ops.len();
    let ops = spec::runnable(ops, args.ranks);
    if let Err(why) = (hooks.available)(args.ranks) {
        println!("CANNOT RUN: {name} benchmark: {why}");
        return Outcome { code: 2, ..Outcome::default() };
    }
    let (steps, skipped) = spec::plan(&ops, &sizes, dtype.size(), args.ranks);
    // Nothing to time is a mistake in the arguments, not a clean run ("0 wrong, OK").
    if steps.is_empty() {
        return bad(if ops.is_empty() && asked > 0 {
            format!("nothing to run: sendrecv needs a peer (--ranks {} runs no sendrecv; give --ranks 2 or more)", args.ranks)
        } else {
            format!(
                "nothing to run: every size from -b {} to -e {} is below one {} element per rank chunk at --ranks {}",
                args.min_bytes,
                args.max_bytes,
                dtype.name(),
                args.ranks
            )
        });
    }
    let machine = Machine::this();
    let started = now_unix();
    let exe_name = std::env::args().next().unwrap_or_else(|| "concord-bench".into());
    let command: Vec<String> = std::iter::once(exe_name).chain(argv.iter().cloned()).collect();
    let type_name = spec::nccl_type_name(dtype);
    let json = args.json.clone().unwrap_or_else(|| default_dir().join(format!("{name}-{}r-{started}.jsonl", args.ranks)));
    let mut versions = BTreeMap::new();
    versions.insert("concord".to_string(), env!("CARGO_PKG_VERSION").to_string());
    if let Some(c) = git_commit() {
        versions.insert("git".to_string(), c);
    }
    let base = |backend: &str, ranks: usize, timing: &str| Record {
        schema: SCHEMA,
        backend: backend.into(),
        op: String::new(),
        placement: String::new(),
        size: 0,
        count: 0,
        dtype: type_name.into(),
        redop: String::new(),
        root: -1,
        ranks,
        iters: args.iters,
        warmup: args.warmup,
        window: 0,
        time_us: 0.0,
        time_us_per_rank: vec![],
        algbw: 0.0,
        busbw: 0.0,
        wrong: 0,
        wrong_iterations: 0,
        wrong_warmup: 0,
        timing: timing.into(),
        wall_time_us: None,
        windows: 0,
        spread_us: None,
        machine: machine.clone(),
        versions: versions.clone(),
        command: command.clone(),
        started,
    };

    // The references first, so that they print in the same table.
    let max = steps.iter().map(|s| s.size).max().unwrap_or(args.max_bytes);
    let mem = memcpy_bw(max);
    let mut memrec = base("memcpy", 1, "best of 7 single-core copies (slice copy_from_slice)");
    memrec.op = "memcpy".into();
    memrec.placement = "out-of-place".into();
    memrec.size = max as u64;
    memrec.count = max as u64;
    memrec.dtype = "uint8".into();
    memrec.redop = "none".into();
    memrec.time_us = max as f64 / mem * 1e6;
    memrec.algbw = mem / 1e9;
    memrec.busbw = mem / 1e9;
    outcome.records.push(memrec);
    let mut mpi: Option<BTreeMap<(BenchOp, usize), crate::mpi::MpiRow>> = None;
    let mut mpi_failed = false;
    if args.mpi {
        let mut rows = BTreeMap::new();
        let r = (|| -> Result<(), String> {
            if !crate::mpi::type_supported(type_name) {
                return Err(format!("bench/mpi_collectives.c has no {type_name}"));
            }
            if !matches!(redop.name(), "sum" | "product" | "min" | "max") {
                return Err(format!("bench/mpi_collectives.c has no {}", redop.name()));
            }
            let exe = crate::mpi::build(&default_dir().join("mpi"))?;
            let mpi_redop = if redop.name() == "product" { "prod" } else { redop.name() };
            let version = crate::mpi::version();
            for &op in &ops {
                eprintln!("# OpenMPI: {} ...", op.name());
                for (size, m) in crate::mpi::run_op(
                    &exe,
                    args.ranks,
                    op,
                    type_name,
                    mpi_redop,
                    args.root,
                    args.iters,
                    args.warmup,
                    args.check_budget.unwrap_or(crate::rank::HOST_BUDGET),
                    &sizes,
                )? {
                    let mut rec = base("openmpi", args.ranks, "MPI_Wtime around ITERS back-to-back blocking calls; mean over ranks");
                    rec.versions.insert("openmpi".into(), version.clone());
                    rec.op = op.name().into();
                    rec.placement = Placement::OutOfPlace.name().into();
                    rec.size = size as u64;
                    rec.count = m.count as u64;
                    rec.redop = if op.is_reduction() { redop.name().into() } else { "none".into() };
                    rec.root = if op.has_root() { args.root as i64 } else { -1 };
                    rec.window = args.iters;
                    rec.time_us = m.time_us;
                    rec.algbw = m.algbw;
                    rec.busbw = m.busbw;
                    rec.wrong = m.wrong;
                    outcome.records.push(rec);
                    rows.insert((op, size), m);
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => mpi = Some(rows),
            Err(e) => {
                eprintln!("concord-bench --mpi: OpenMPI not run: {e}");
                mpi_failed = true;
            }
        }
    }

    let bar = if std::io::stderr().is_terminal() {
        let total = steps.iter().map(|s| if s.op.has_in_place() { 2 } else { 1 }).sum::<usize>() as u64;
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Some(b)
    } else {
        None
    };
    let mut out = Out { bar, lines: Vec::new(), warnings: Vec::new() };
    out.say(format!(
        "# concord-bench: backend {name}, {} (processes), {type_name}, redop {}, {} + {} warm-up (at least one window), every output checked; {}",
        concord_harness::count(args.ranks, "rank", "ranks"),
        redop.name(),
        concord_harness::count(args.iters, "iteration", "iterations"),
        args.warmup,
        machine.hostname
    ));
    out.say(format!("# command: {}", command.join(" ")));
    out.say(format!("# memcpy (single core, {}): {:.2} GB/s", spec::human(max as u64), mem / 1e9));
    for (op, bytes) in &skipped {
        out.say(format!("# {}: {bytes} B is less than one element per rank chunk: skipped", op.name()));
    }

    // Start (or meet) the ranks.
    let Ranks { rx, op_timeout, finish } = match get_ranks(args, &argv) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };

    let start = Instant::now();
    let mut deadline = start + Duration::from_secs(args.deadline_s);
    let mut eof = 0;
    let mut phase: Vec<String> = vec!["starting (backend init)".into(); args.ranks];
    let mut results: HashMap<(BenchOp, usize, Placement), Vec<Option<RankResult>>> = HashMap::new();
    let mut hello: Option<(String, String)> = None;
    // The reference's (label, description), from the ranks' hello.
    let mut reference: Option<(String, String)> = None;
    // (op, size, placement) -> (backend time, reference time), for the goals at the end.
    let mut vs_ref: BTreeMap<(BenchOp, usize, Placement), (f64, f64)> = BTreeMap::new();
    let mut next = 0usize; // index of the next step to print
    let mut cur_op: Option<BenchOp> = None;
    let mut busbws: Vec<f64> = Vec::new();
    let mut total_wrong = 0u64;
    let mut timed_out = false;
    let mpi_cols = mpi.is_some();
    // Fatal failures that are the same but for the rank (every rank's init refusing the world
    // size): printed once, with the other ranks named in one line after the run (`--ranks 99`
    // printed 99 lines). (the message with the rank blanked, the first rank, the other ranks)
    let mut fatal_seen: Vec<(String, usize, Vec<usize>)> = Vec::new();
    while eof < args.ranks {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            break;
        }
        let (r, line) = match rx.recv_timeout(deadline - now) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let Some(line) = line else {
            eof += 1;
            continue;
        };
        let msg: Msg = match serde_json::from_str(&line) {
            Ok(m) => m,
            Err(_) => {
                out.warn(format!("rank {r}: {line}"));
                continue;
            }
        };
        match msg {
            Msg::Hello { backend, version, timing, reference: r, .. } => {
                if hello.is_none() {
                    out.say(format!(
                        "# backend {backend}{}; timing: {timing}",
                        if version.is_empty() { String::new() } else { format!(" {version}") }
                    ));
                    if let Some((label, what)) = &r {
                        out.say(format!("# reference `{label}` (columns on the right; ratio = its time / the backend's, above 1: the backend is faster): {what}"));
                    }
                    hello = Some((version, timing));
                    reference = r;
                }
            }
            Msg::Note { message, .. } => out.say(format!("# note: {message}")),
            Msg::Start { rank, op, size, placement } => {
                phase[rank] = format!("{op} {} {size} B", placement.name());
                if let Some(b) = &out.bar {
                    b.set_message(phase[rank].clone());
                }
            }
            Msg::Wrong(w) => {
                let s = w.to_string();
                out.warn(s.clone());
                outcome.failures.push(s);
            }
            Msg::Fatal { rank, message } => {
                let key = blank_rank(&message, rank);
                match fatal_seen.iter_mut().find(|(k, _, _)| *k == key) {
                    Some((_, _, more)) => more.push(rank),
                    None => {
                        out.warn(format!("FAILED: {message}"));
                        fatal_seen.push((key, rank, Vec::new()));
                    }
                }
                outcome.failures.push(message);
                // Peers blocked on the failed rank report their own timeouts within the op timeout.
                deadline = deadline.min(Instant::now() + op_timeout + Duration::from_secs(10));
            }
            Msg::Result(res) => {
                let Some(op) = BenchOp::from_name(&res.op) else { continue };
                let key = (op, res.size, res.placement);
                let slot = results.entry(key).or_insert_with(|| vec![None; args.ranks]);
                let rank = res.rank;
                if rank < slot.len() {
                    slot[rank] = Some(res);
                }
                if let Some(b) = &out.bar {
                    if slot.iter().all(Option::is_some) {
                        b.inc(1);
                    }
                }
                // Print every step now complete, in order.
                while let Some(step) = steps.get(next) {
                    let complete = |p: Placement| results.get(&(step.op, step.size, p)).is_some_and(|v| v.iter().all(Option::is_some));
                    if !complete(Placement::OutOfPlace) || (step.op.has_in_place() && !complete(Placement::InPlace)) {
                        break;
                    }
                    if cur_op != Some(step.op) {
                        if cur_op.is_some() {
                            out.say(table::avg_line(&busbws));
                            busbws.clear();
                        }
                        out.say(format!("#\n# {}", step.op.name()));
                        let peer = if mpi_cols {
                            Some(PeerCols { label: "openmpi", in_place: false })
                        } else {
                            reference.as_ref().map(|(label, _)| PeerCols { label, in_place: step.op.has_in_place() })
                        };
                        out.say(table::header(peer));
                        cur_op = Some(step.op);
                    }
                    let timing = hello.as_ref().map(|h| h.1.clone()).unwrap_or_else(|| WALL_CLOCK.into());
                    let version = hello.as_ref().map(|h| h.0.clone()).unwrap_or_default();
                    let mut cells = [None, None];
                    let mut refs: [Option<(f64, f64)>; 2] = [None, None];
                    for (i, p) in [Placement::OutOfPlace, Placement::InPlace].into_iter().enumerate() {
                        let Some(rs) = results.get(&(step.op, step.size, p)) else { continue };
                        let rs: Vec<&RankResult> = rs.iter().flatten().collect();
                        let rec = merge(&base(name, args.ranks, &timing), &version, *step, p, redop.name(), args.root, &rs);
                        total_wrong += rec.wrong + rec.wrong_warmup;
                        busbws.push(rec.busbw);
                        cells[i] = Some(Cells { time_us: rec.time_us, algbw: rec.algbw, busbw: rec.busbw, wrong: rec.wrong });
                        // The reference's row: every rank timed it (mean over ranks, as the backend's).
                        let ref_times: Option<Vec<f64>> = rs.iter().map(|r| r.ref_us).collect();
                        if let (Some((label, what)), Some(ts)) = (&reference, ref_times.filter(|t| !t.is_empty())) {
                            let mut rr = rec.clone();
                            rr.backend = label.clone();
                            rr.timing = what.clone();
                            rr.wall_time_us = None;
                            rr.time_us_per_rank = ts.clone();
                            rr.spread_us = mean_spread(rs.iter().map(|r| r.ref_spread_us));
                            rr.time_us = ts.iter().sum::<f64>() / ts.len() as f64;
                            rr.algbw = if rr.time_us > 0.0 { step.size as f64 / rr.time_us / 1e3 } else { 0.0 };
                            rr.busbw = rr.algbw * step.op.busbw_factor(args.ranks);
                            (rr.wrong, rr.wrong_iterations, rr.wrong_warmup) = (0, 0, 0);
                            refs[i] = Some((rr.time_us, rr.busbw));
                            vs_ref.insert((step.op, step.size, p), (rec.time_us, rr.time_us));
                            outcome.records.push(rec);
                            outcome.records.push(rr);
                        } else {
                            outcome.records.push(rec);
                        }
                    }
                    let m = match &mpi {
                        Some(m) => Some(PeerRow { out: m.get(&(step.op, step.size)).map(|r| (r.time_us, r.busbw)), inp: None }),
                        None if reference.is_some() => {
                            Some(PeerRow { out: refs[0], inp: step.op.has_in_place().then_some(refs[1].map(|r| r.0)) })
                        }
                        None => None,
                    };
                    let redop_col = if step.op.is_reduction() { redop.name() } else { "none" };
                    let root_col = if step.op.has_root() { args.root as i64 } else { -1 };
                    out.say(table::row(step.size, step.count, type_name, redop_col, root_col, cells[0], cells[1], m));
                    next += 1;
                }
            }
        }
    }
    if cur_op.is_some() {
        out.say(table::avg_line(&busbws));
    }
    for (_, first, more) in &fatal_seen {
        if !more.is_empty() {
            let n = more.len();
            out.warn(format!(
                "FAILED: the same as rank {first}'s failure above on {n} more {}: {}",
                if n == 1 { "rank" } else { "ranks" },
                launch::rank_ranges(more)
            ));
        }
    }
    let (hangs, check) = finish(
        if timed_out { Duration::ZERO } else { deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)) },
        &phase,
    );
    if let Some(b) = &out.bar {
        b.finish_and_clear();
    }
    for s in hangs {
        eprintln!("{s}");
        outcome.failures.push(s);
    }
    if let Err(e) = check {
        if outcome.failures.is_empty() {
            outcome.failures.push(e.clone());
        }
        eprintln!("FAILED: {e}");
    }
    if next < steps.len() && outcome.failures.is_empty() {
        outcome.failures.push(format!("the ranks ended after {next} of {} steps", steps.len()));
    }

    // Footer: the goals' inputs.
    let ar = |size: usize, backend: &str| {
        outcome
            .records
            .iter()
            .find(|r| r.backend == backend && r.op == "all_reduce" && r.size as usize == size && r.placement == "out-of-place")
            .map(|r| r.busbw)
    };
    if let Some(s) = steps.iter().filter(|s| s.op == BenchOp::AllReduce).map(|s| s.size).max() {
        if let Some(bw) = ar(s, name) {
            let mut line =
                format!("# all_reduce out-of-place busbw at {}: {bw:.2} GB/s = {:.2} x memcpy", spec::human(s as u64), bw / (mem / 1e9));
            if let Some(m) = ar(s, "openmpi") {
                line.push_str(&format!(", {:.2} x OpenMPI ({m:.2} GB/s)", bw / m));
            }
            out.say(line);
        }
    }
    // Device-clock runs: the host wall-clock of the same windows at the smallest size, for
    // comparison with wall-clock runs.
    let walls: Vec<String> = outcome
        .records
        .iter()
        .filter(|r| r.backend == name && r.wall_time_us.is_some())
        .filter(|r| steps.iter().find(|s| s.op.name() == r.op).is_some_and(|s| s.size as u64 == r.size))
        .map(|r| format!("{} {} {} {:.2}", r.op, r.placement, spec::human(r.size), r.wall_time_us.unwrap_or(0.0)))
        .collect();
    if !walls.is_empty() {
        out.say(format!("# host wall-clock per op (issues + waits; what wall-clock runs report), us: {}", walls.join(", ")));
    }
    for line in spread_lines(name, reference.as_ref().map(|(l, _)| l.as_str()), &outcome.records) {
        out.say(line);
    }
    if let Some((label, _)) = &reference {
        for line in goals_vs_reference(name, label, &vs_ref) {
            out.say(line);
        }
    }
    // "OK" only for a run whose every step ran and was checked: a rank that failed (or never
    // started) leaves steps unchecked, and 0 wrong of nothing is not a pass.
    let verdict = if total_wrong > 0 {
        "FAILED".to_string()
    } else if outcome.failures.is_empty() {
        "OK".to_string()
    } else {
        format!("in the {next} of {} steps that ran; the run FAILED (above)", steps.len())
    };
    out.say(format!("# Wrong results: {total_wrong} {verdict}"));
    match crate::record::write_jsonl(&json, &outcome.records) {
        Ok(()) => {
            out.say(format!("# JSON: {}", json.display()));
            outcome.json = Some(json.clone());
        }
        Err(e) => eprintln!("concord-bench: cannot write {}: {e}", json.display()),
    }
    if !args.no_plot {
        let svg = args.svg.clone().unwrap_or_else(|| json.with_extension("svg"));
        let series = crate::plot::series_of(&[(String::new(), outcome.records.clone())]);
        match crate::plot::write_svg(&series, &svg) {
            Ok(()) => {
                out.say(format!("# plot: {}", svg.display()));
                outcome.svg = Some(svg);
            }
            Err(e) => eprintln!("concord-bench: no plot: {e}"),
        }
    }
    outcome.lines = std::mem::take(&mut out.lines);
    outcome.warnings = std::mem::take(&mut out.warnings);
    outcome.code = if !outcome.failures.is_empty() || total_wrong > 0 {
        1
    } else if mpi_failed {
        2
    } else {
        0
    };
    outcome
}

/// Latency goal: at sizes up to this, the backend's time within [`LATENCY_GOAL`] × the reference's.
pub const SMALL_MAX: usize = 64 << 10;
pub const LATENCY_GOAL: f64 = 1.2;
/// Bandwidth goal: at sizes from this, at least [`BANDWIDTH_GOAL`] × the reference's busbw.
pub const LARGE_MIN: usize = 64 << 20;
pub const BANDWIDTH_GOAL: f64 = 0.97;

/// The summary against a reference, one line per op and placement measured: the worst time
/// ratio at small sizes (goal: at most [`LATENCY_GOAL`]) and the worst bandwidth ratio at large
/// ones (goal: at least [`BANDWIDTH_GOAL`]), each with `met` / `MISSED`.
pub fn goals_vs_reference(name: &str, label: &str, vs: &BTreeMap<(BenchOp, usize, Placement), (f64, f64)>) -> Vec<String> {
    let mut lines = vec![format!(
        "# {name} vs {label}: latency = {name} time / {label} time at <= {} (goal <= {LATENCY_GOAL:.2}); \
         bandwidth = {label} time / {name} time (= busbw ratio) at >= {} (goal >= {BANDWIDTH_GOAL:.2})",
        spec::human(SMALL_MAX as u64),
        spec::human(LARGE_MIN as u64)
    )];
    let keys: std::collections::BTreeSet<(BenchOp, Placement)> = vs.keys().map(|(o, _, p)| (*o, *p)).collect();
    for (op, p) in keys {
        let rows: Vec<(usize, f64, f64)> =
            vs.iter().filter(|((o, _, q), _)| *o == op && *q == p).map(|((_, s, _), (b, r))| (*s, *b, *r)).collect();
        let worst = |f: &dyn Fn(usize) -> bool, v: &dyn Fn(f64, f64) -> f64, max: bool| {
            rows.iter().filter(|(s, b, r)| f(*s) && *b > 0.0 && *r > 0.0).map(|(s, b, r)| (v(*b, *r), *s)).fold(
                None,
                |acc: Option<(f64, usize)>, x| match acc {
                    Some(a) if (max && a.0 >= x.0) || (!max && a.0 <= x.0) => Some(a),
                    _ => Some(x),
                },
            )
        };
        // The median over the sizes beside the worst: one size's single measurement moves by
        // tens of percent between runs on a shared host; the goal is judged on the worst.
        let median = |f: &dyn Fn(usize) -> bool, v: &dyn Fn(f64, f64) -> f64| {
            let mut xs: Vec<f64> = rows.iter().filter(|(s, b, r)| f(*s) && *b > 0.0 && *r > 0.0).map(|(_, b, r)| v(*b, *r)).collect();
            xs.sort_by(f64::total_cmp);
            let n = xs.len();
            (n > 1).then(|| if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 })
        };
        let typical = |m: Option<f64>| m.map(|m| format!(", median {m:.2} x")).unwrap_or_default();
        let mut parts = Vec::new();
        match worst(&|s| s <= SMALL_MAX, &|b, r| b / r, true) {
            Some((x, s)) => parts.push(format!(
                "latency worst {x:.2} x at {} ({}){}",
                spec::human(s as u64),
                if x <= LATENCY_GOAL { "met" } else { "MISSED" },
                typical(median(&|s| s <= SMALL_MAX, &|b, r| b / r))
            )),
            None => parts.push("latency: no size <= 64 KiB".into()),
        }
        match worst(&|s| s >= LARGE_MIN, &|b, r| r / b, false) {
            Some((x, s)) => parts.push(format!(
                "bandwidth worst {x:.2} x at {} ({}){}",
                spec::human(s as u64),
                if x >= BANDWIDTH_GOAL { "met" } else { "MISSED" },
                typical(median(&|s| s >= LARGE_MIN, &|b, r| r / b))
            )),
            None => parts.push("bandwidth: no size >= 64 MiB".into()),
        }
        lines.push(format!("#   {} {}: {}", op.name(), p.name(), parts.join("; ")));
    }
    lines
}

/// The mean over ranks of each rank's (fastest, slowest) window; `None` unless every rank has one.
fn mean_spread(xs: impl Iterator<Item = Option<(f64, f64)>>) -> Option<(f64, f64)> {
    let v: Option<Vec<(f64, f64)>> = xs.collect();
    let v = v.filter(|v| !v.is_empty())?;
    let n = v.len() as f64;
    Some((v.iter().map(|x| x.0).sum::<f64>() / n, v.iter().map(|x| x.1).sum::<f64>() / n))
}

/// How much a step's windows differed, per op and placement, for the backend and its reference:
/// `(max - min) / median` of the window times per op, as the median and the worst over sizes.
/// Empty unless some step timed several windows.
pub fn spread_lines(name: &str, label: Option<&str>, records: &[Record]) -> Vec<String> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in records.iter().filter(|r| r.windows > 1 && r.spread_us.is_some()) {
        let k = (r.op.clone(), r.placement.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut lines = Vec::new();
    for (op, placement) in keys {
        let mut parts = Vec::new();
        let mut windows = 0;
        for series in std::iter::once(name).chain(label) {
            let mut rel: Vec<(f64, u64)> = records
                .iter()
                .filter(|r| r.backend == series && r.op == op && r.placement == placement && r.time_us > 0.0)
                .filter_map(|r| r.spread_us.map(|(lo, hi)| ((hi - lo) / r.time_us, r.size)))
                .collect();
            if rel.is_empty() {
                continue;
            }
            windows = records.iter().filter(|r| r.op == op && r.placement == placement).map(|r| r.windows).max().unwrap_or(0);
            let med = crate::rank::median(&rel.iter().map(|x| x.0).collect::<Vec<_>>());
            rel.sort_by(|a, b| b.0.total_cmp(&a.0));
            parts.push(format!("{series} median {:.0} % (worst {:.0} % at {})", med * 100.0, rel[0].0 * 100.0, spec::human(rel[0].1)));
        }
        if !parts.is_empty() {
            lines.push(format!(
                "#   {op} {placement}: {windows} windows per size; (slowest - fastest window) / median, over the sizes: {}",
                parts.join(", ")
            ));
        }
    }
    if !lines.is_empty() {
        lines.insert(0, "# window spread (each size's time is the median over its windows):".into());
    }
    lines
}

/// One table cell's record from every rank's result: time = mean over ranks (nccl-tests' `-a 1`).
fn merge(base: &Record, version: &str, step: Step, p: Placement, redop: &str, root: usize, rs: &[&RankResult]) -> Record {
    let mut rec = base.clone();
    if !version.is_empty() {
        rec.versions.insert(rec.backend.clone(), version.to_string());
    }
    rec.op = step.op.name().into();
    rec.placement = p.name().into();
    rec.size = step.size as u64;
    rec.count = step.count as u64;
    rec.redop = if step.op.is_reduction() { redop.into() } else { "none".into() };
    rec.root = if step.op.has_root() { root as i64 } else { -1 };
    rec.time_us_per_rank = rs.iter().map(|r| r.time_us).collect();
    rec.time_us = rec.time_us_per_rank.iter().sum::<f64>() / rs.len().max(1) as f64;
    rec.window = rs.iter().map(|r| r.window).min().unwrap_or(0);
    rec.windows = rs.iter().map(|r| r.windows).min().unwrap_or(0);
    rec.spread_us = mean_spread(rs.iter().map(|r| r.spread_us));
    if rs.iter().all(|r| r.wall_us > 0.0) && base.timing != WALL_CLOCK {
        rec.wall_time_us = Some(rs.iter().map(|r| r.wall_us).sum::<f64>() / rs.len().max(1) as f64);
    }
    rec.wrong = rs.iter().map(|r| r.wrong).sum();
    rec.wrong_iterations = rs.iter().map(|r| r.wrong_iterations).sum();
    rec.wrong_warmup = rs.iter().map(|r| r.wrong_warmup).sum();
    rec.algbw = if rec.time_us > 0.0 { step.size as f64 / rec.time_us / 1e3 } else { 0.0 };
    rec.busbw = rec.algbw * step.op.busbw_factor(base.ranks);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_against_a_reference_use_the_worst_size_and_the_thresholds() {
        let mut vs = BTreeMap::new();
        let ar = BenchOp::AllReduce;
        // (backend time, reference time) in us.
        vs.insert((ar, 8, Placement::OutOfPlace), (6.0, 5.0)); // 1.20: met (at the limit)
        vs.insert((ar, 64 << 10, Placement::OutOfPlace), (13.0, 10.0)); // 1.30: the worst small one
        vs.insert((ar, 128 << 10, Placement::OutOfPlace), (100.0, 10.0)); // neither small nor large
        vs.insert((ar, 64 << 20, Placement::OutOfPlace), (100.0, 98.0)); // 0.98: met
        vs.insert((ar, 1 << 30, Placement::OutOfPlace), (100.0, 96.0)); // 0.96: missed
        vs.insert((ar, 8, Placement::InPlace), (5.5, 5.0)); // 1.10: met
        let lines = goals_vs_reference("nccl", "nccl-raw", &vs);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(
            lines[1],
            "#   all_reduce out-of-place: latency worst 1.30 x at 64 KiB (MISSED), median 1.25 x; \
             bandwidth worst 0.96 x at 1 GiB (MISSED), median 0.97 x"
        );
        assert_eq!(lines[2], "#   all_reduce in-place: latency worst 1.10 x at 8 B (met); bandwidth: no size >= 64 MiB");
        vs.remove(&(ar, 64 << 10, Placement::OutOfPlace));
        vs.remove(&(ar, 1 << 30, Placement::OutOfPlace));
        let lines = goals_vs_reference("nccl", "nccl-raw", &vs);
        assert_eq!(lines[1], "#   all_reduce out-of-place: latency worst 1.20 x at 8 B (met); bandwidth worst 0.98 x at 64 MiB (met)");
    }
}
