//! End-to-end runs of the benchmark (a libtest-mimic binary: it is also the rank program the
//! launcher re-executes).
//!
//! * `wrong_in_timed_iterations_fails_the_run`: a backend that is right in its warm-up (check)
//!   iterations and wrong in every 7th all_reduce — inside the timed windows — on rank 1: the
//!   bench counts #wrong > 0, names op, size, iteration, rank and first bad index, exits 1;
//!   also through the device-data path (`..._with_device_data`: inputs as rotated copies of a
//!   base input on the backend, outputs read by closure), which the NCCL hooks use.
//! * `shm_every_op_end_to_end`: 2 ranks, a few small sizes, every op: 0 wrong, one parseable
//!   JSON line per op × size × placement, a plot.
//! * `one_rank_runs_every_op_but_sendrecv`: `--op all` at 1 rank (the one-GPU table) ends
//!   with exit 0: sendrecv is left out on the ranks too.
//! * `device_clock_and_reference_are_used`: a backend's device clock (here a fake one: 1 ms
//!   per window) gives the times, the wall-clock is recorded beside, and its reference's times
//!   become their own records, with device data on (the NCCL hooks' plumbing, without a GPU).

use concord_bench::{main_with, Args, Hooks};
use concord_core::{Backend, OutstandingCounter, ReduceOp, Result, Tensor, Work, WorkMeta, WorldInfo};
use concord_shm::ShmBackend;
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// shm, but rank 1's every 7th `all_reduce` result has one element's bits flipped.
struct Wrong7 {
    inner: ShmBackend,
    calls: AtomicU64,
    counter: OutstandingCounter,
}

type Buf = <ShmBackend as Backend>::Buffer;

impl Backend for Wrong7 {
    type Buffer = Buf;
    fn init(world: &WorldInfo) -> Result<Self> {
        // `--opts fail_init=1`: every rank's init fails (a world that never runs a step).
        if world.option("fail_init").is_some() {
            return Err(concord_core::CollectiveError::Backend(format!("fail_init on rank {}", world.rank)));
        }
        Ok(Wrong7 { inner: ShmBackend::init(world)?, calls: AtomicU64::new(0), counter: OutstandingCounter::default() })
    }
    fn name(&self) -> &str {
        "wrong7"
    }
    concord_core::forward!(inner =>
        rank, world_size, capabilities, buffers, all_reduce_, all_reduce_coalesced, all_reduce_coalesced_,
        all_gather_into_tensor, all_gather_into_tensor_out, all_gather_into_tensor_coalesced,
        reduce_scatter_tensor, reduce_scatter_tensor_out, reduce_scatter_tensor_coalesced, all_to_all_single,
        broadcast, broadcast_, permute_tensor, reduce, gather, scatter, barrier, p2p
    );
    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.counter.get()
    }
    fn new_group(&self, _: &[usize]) -> Result<Option<Self>> {
        Err(concord_core::CollectiveError::Unsupported("no groups".into()))
    }
    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let w = self.inner.all_reduce(x, op)?;
        if n.rem_euclid(7) != 0 || self.rank() != 1 {
            return Ok(w);
        }
        let out = w.into_value(Duration::from_secs(30))?;
        let mut t = self.inner.download(&out)?;
        let i = 3 % t.numel();
        t.bytes_mut()[i * 4 + 2] ^= 0x10;
        self.inner.write(&out, &t)?;
        let meta = WorkMeta { backend: "wrong7".into(), op: "all_reduce".into(), seq: n, rank: 1 };
        Ok(Work::done(out, meta, &self.counter))
    }
}

fn parse(argv: &[&str]) -> (Args, Vec<String>) {
    use clap::Parser;
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    (Args::parse_from(std::iter::once("concord-bench".to_string()).chain(argv.clone())), argv)
}

/// The bench run in this process (its ranks launched) as backend `name` with `hooks` and the
/// rest of its command line `argv` (`--backend name` first: the ranks' `main` picks the backend
/// by it): it MUST end cleanly (exit 0, no failure).
fn run_clean(name: &str, hooks: &Hooks<ShmBackend>, argv: &[&str]) -> std::result::Result<concord_bench::Outcome, Failed> {
    let (args, argv) = parse(&[&["--backend", name][..], argv].concat());
    let o = concord_bench::run_parent::<ShmBackend>(name, hooks, &args, argv);
    if o.code != 0 || !o.failures.is_empty() {
        return Err(format!("exit code {}; failures {:?}", o.code, o.failures).into());
    }
    Ok(o)
}

/// The fake device clocks' mark: nothing (their `elapsed` counts windows, not time).
fn mark(_: &ShmBackend) -> Result<concord_bench::ext::Mark> {
    Ok(Box::new(()))
}

/// Device data through the host (download, rotate, write): the bench's device-data path
/// (rotated copies, reads by closure) on a CPU backend.
fn via_host<B: Backend>() -> concord_bench::DeviceData<B> {
    fn copy<B: Backend>(b: &B, dst: &B::Buffer, src: &B::Buffer, l: usize, s: usize) -> Result<()> {
        let t = b.download(src)?;
        let r = concord_bench::rank::rotate_chunks(t.bytes(), t.dtype().size(), l, s);
        b.write(dst, &Tensor::from_bytes(t.dtype(), t.shape(), &r))
    }
    fn read<B: Backend>(b: &B, x: &B::Buffer, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(b.download(x)?.bytes());
        Ok(())
    }
    concord_bench::DeviceData { copy_rotated: copy::<B>, read: read::<B> }
}

fn data_hooks<B: Backend>() -> Hooks<B> {
    Hooks { data: Some(via_host::<B>()), ..Hooks::default() }
}

fn wrong_in_timed_iterations_fails_the_run() -> std::result::Result<(), Failed> {
    wrong_in_timed_iterations("wrong7", &Hooks::default())
}

/// The same through the device-data path (inputs made by rotated copies, outputs read by closure).
fn wrong_in_timed_iterations_fails_the_run_with_device_data() -> std::result::Result<(), Failed> {
    wrong_in_timed_iterations("wrong7data", &data_hooks())
}

fn wrong_in_timed_iterations(name: &str, hooks: &Hooks<Wrong7>) -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("w.jsonl");
    let json_s = json.to_string_lossy().into_owned();
    // Warm-up: calls 1-2 (right); timed: calls 3-12, of which 7 is wrong (timed iteration 4).
    // A 4 KiB check budget makes the out-of-place window 2 iterations (1 KiB in + 1 KiB out
    // each), so the warm-up (at least one window) stays at 2.
    let (args, argv) = parse(&[
        "--check-budget",
        "4K",
        "--backend",
        name,
        "--op",
        "all_reduce",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "10",
        "-w",
        "2",
        "--no-plot",
        "--json",
        &json_s,
    ]);
    let o = concord_bench::run_parent::<Wrong7>(name, hooks, &args, argv);
    if o.code != 1 {
        return Err(format!("exit code {} (want 1); failures {:?}", o.code, o.failures).into());
    }
    let out = o.records.iter().find(|r| r.op == "all_reduce" && r.placement == "out-of-place").ok_or("no out-of-place record")?;
    if out.wrong == 0 || out.wrong_iterations != 1 || out.wrong_warmup != 0 {
        return Err(format!(
            "#wrong {} in {} timed iterations (warm-up {}): want > 0 in 1, 0",
            out.wrong, out.wrong_iterations, out.wrong_warmup
        )
        .into());
    }
    let msg = o.failures.iter().find(|f| f.starts_with("WRONG")).ok_or_else(|| format!("no WRONG line: {:?}", o.failures))?;
    for want in ["all_reduce out-of-place 1024 B", "timed iteration 4", "rank 1", "first bad index 3", "got ", "expected "] {
        if !msg.contains(want) {
            return Err(format!("`{want}` missing from: {msg}").into());
        }
    }
    let inplace = o.records.iter().find(|r| r.op == "all_reduce" && r.placement == "in-place").ok_or("no in-place record")?;
    if inplace.wrong != 0 {
        return Err(format!("in-place (not corrupted) shows {} wrong", inplace.wrong).into());
    }
    let lines = concord_bench::record::read_jsonl(&json)?;
    if !lines.iter().any(|r| r.wrong > 0) {
        return Err("the JSON file does not record the wrong elements".into());
    }
    Ok(())
}

fn shm_every_op_end_to_end() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("shm.jsonl");
    let svg = dir.path().join("shm.svg");
    let (js, ss) = (json.to_string_lossy().into_owned(), svg.to_string_lossy().into_owned());
    run_clean(
        "shm",
        &Hooks::default(),
        &["--op", "all", "-b", "8", "-e", "4K", "-f", "8", "-n", "4", "-w", "1", "--ranks", "2", "--json", &js, "--svg", &ss],
    )?;
    let recs = concord_bench::record::read_jsonl(&json)?;
    let shm: Vec<_> = recs.iter().filter(|r| r.backend == "shm").collect();
    // 7 ops × sizes 8, 64, 512, 4096 (8 B is one f32 per rank chunk for the chunked ops), plus
    // the in-place placement of all_reduce and broadcast.
    let want = 7 * 4 + 2 * 4;
    if shm.len() != want {
        return Err(format!("{} shm records, want {want}", shm.len()).into());
    }
    for r in &shm {
        if r.wrong != 0 || r.wrong_warmup != 0 || r.time_us.is_nan() || r.time_us <= 0.0 || r.busbw <= 0.0 || r.iters != 4 || r.ranks != 2 {
            return Err(format!("bad record {r:?}").into());
        }
    }
    if !recs.iter().any(|r| r.backend == "memcpy") {
        return Err("no memcpy reference record".into());
    }
    let text = std::fs::read_to_string(&svg).map_err(|e| e.to_string())?;
    if !text.trim_end().ends_with("</svg>") {
        return Err("the plot is not a complete SVG".into());
    }
    Ok(())
}

/// A device clock that says every timed window took exactly 1 ms, and a reference that says
/// every all_reduce took 100 us (and has no other op): the bench must use them as they are.
fn clocked_hooks() -> Hooks<ShmBackend> {
    fn elapsed(_: &ShmBackend, a: &concord_bench::ext::Mark, b: &concord_bench::ext::Mark, _: Duration) -> Result<Duration> {
        assert!(a.is::<()>() && b.is::<()>(), "the clock got marks it did not make");
        Ok(Duration::from_millis(1))
    }
    struct FakeRef;
    impl concord_bench::Reference for FakeRef {
        fn label(&self) -> String {
            "fake-ref".into()
        }
        fn describe(&self) -> String {
            "a fixed 100 us for all_reduce".into()
        }
        fn time_us(&mut self, s: &concord_bench::RefStep) -> std::result::Result<Option<f64>, String> {
            Ok((s.op == concord_bench::spec::BenchOp::AllReduce).then_some(100.0))
        }
    }
    fn make(_: &ShmBackend, _: &WorldInfo) -> std::result::Result<Box<dyn concord_bench::Reference>, String> {
        Ok(Box::new(FakeRef))
    }
    Hooks {
        clock: Some(concord_bench::Clock {
            mark,
            elapsed,
            describe: "fake device clock: 1 ms per window",
            covers_p2p: true,
            profile: None,
        }),
        reference: Some(make),
        data: Some(via_host()),
        ..Hooks::default()
    }
}

fn device_clock_and_reference_are_used() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("c.jsonl");
    let js = json.to_string_lossy().into_owned();
    run_clean(
        "shmclock",
        &clocked_hooks(),
        &[
            "--op",
            "all_reduce,all_gather",
            "-b",
            "64",
            "-e",
            "4M",
            "-f",
            "16",
            "-n",
            "4",
            "-w",
            "1",
            "--ranks",
            "2",
            "--no-plot",
            "--json",
            &js,
        ],
    )?;
    let recs = concord_bench::record::read_jsonl(&json)?;
    let own: Vec<_> = recs.iter().filter(|r| r.backend == "shmclock").collect();
    // all_reduce 64 B, 1K, 16K, 256K, 4M in both placements, all_gather out-of-place. At 4 MiB
    // the 5 iterations share 2 base sets, so iterations 2-4 use rotated inputs (device data).
    if own.len() != 15 {
        return Err(format!("{} shmclock records, want 15", own.len()).into());
    }
    for r in &own {
        // One window of 4 iterations, 1 ms by the clock: 250 us, whatever the wall-clock said.
        if r.window != 4
            || r.time_us != 250.0
            || r.timing != "fake device clock: 1 ms per window"
            || !r.wall_time_us.is_some_and(|w| w > 0.0)
        {
            return Err(format!("the device clock was not used: {r:?}").into());
        }
    }
    let refs: Vec<_> = recs.iter().filter(|r| r.backend == "fake-ref").collect();
    if refs.len() != 10 || refs.iter().any(|r| r.op != "all_reduce" || r.time_us != 100.0 || r.ranks != 2) {
        return Err(format!("reference records: {refs:?}").into());
    }
    Ok(())
}

/// A clock that reads 1, 2 and 9 ms for a rank's successive windows (per process).
fn shifting_clock_hooks() -> Hooks<ShmBackend> {
    fn elapsed(_: &ShmBackend, _: &concord_bench::ext::Mark, _: &concord_bench::ext::Mark, _: Duration) -> Result<Duration> {
        static N: AtomicU64 = AtomicU64::new(0);
        Ok(Duration::from_millis([1, 2, 9][(N.fetch_add(1, Ordering::SeqCst) % 3) as usize]))
    }
    Hooks {
        clock: Some(concord_bench::Clock {
            mark,
            elapsed,
            describe: "fake device clock: 1, 2, 9 ms in turn",
            covers_p2p: true,
            profile: None,
        }),
        data: Some(via_host()),
        ..Hooks::default()
    }
}

/// `--window`: a step timed in several windows reports the median window's time per op (not the
/// mean, which one slow window moves), the fastest and slowest beside it, and the spread line.
fn a_step_is_the_median_of_its_windows() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("w.jsonl");
    let js = json.to_string_lossy().into_owned();
    let o = run_clean(
        "shmwindows",
        &shifting_clock_hooks(),
        &["--op", "all_reduce", "-b", "64", "-e", "64", "-n", "6", "--window", "2", "-w", "1", "--ranks", "2", "--no-plot", "--json", &js],
    )?;
    let recs: Vec<_> = concord_bench::record::read_jsonl(&json)?.into_iter().filter(|r| r.backend == "shmwindows").collect();
    if recs.len() != 2 {
        return Err(format!("{} shmwindows records, want 2 (both placements)", recs.len()).into());
    }
    let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
    for r in &recs {
        // Windows of 2 ops: 1, 2, 9 ms = 500, 1000, 4500 us per op; the mean would be 2000.
        let spread_ok = r.spread_us.is_some_and(|(lo, hi)| near(lo, 500.0) && near(hi, 4500.0));
        if r.window != 2 || r.windows != 3 || !near(r.time_us, 1000.0) || !spread_ok {
            return Err(format!("want 3 windows of 2, 1000 us per op (the median), spread 500-4500: {r:?}").into());
        }
    }
    let spread = o.lines.iter().find(|l| l.contains("all_reduce out-of-place: 3 windows per size"));
    // (4500 - 500) / 1000 = 400 %.
    if !spread.is_some_and(|l| l.contains("shmwindows median 400 % (worst 400 % at 64 B)")) {
        return Err(format!("no spread line for the windows: {:?}", o.lines).into());
    }
    Ok(())
}

/// The shifting clock (1, 2, 9 ms per window) and a reference that must be called once right
/// after each of the backend's timed windows (`--interleave`), for that window's iterations,
/// with the warm-up only on a step's first call: it answers 100, 200, 900 us in turn, and an
/// error for a call out of turn or of the wrong shape (the bench then drops it: no records).
fn interleaved_hooks() -> Hooks<ShmBackend> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    static WINDOWS: AtomicU64 = AtomicU64::new(0);
    fn elapsed(_: &ShmBackend, _: &concord_bench::ext::Mark, _: &concord_bench::ext::Mark, _: Duration) -> Result<Duration> {
        Ok(Duration::from_millis([1, 2, 9][(WINDOWS.fetch_add(1, Ordering::SeqCst) % 3) as usize]))
    }
    struct StepRef;
    impl concord_bench::Reference for StepRef {
        fn label(&self) -> String {
            "step-ref".into()
        }
        fn describe(&self) -> String {
            "100, 200, 900 us in turn, one window per call".into()
        }
        fn time_us(&mut self, s: &concord_bench::RefStep) -> std::result::Result<Option<f64>, String> {
            let j = CALLS.fetch_add(1, Ordering::SeqCst);
            let windows = WINDOWS.load(Ordering::SeqCst);
            let warmup = if j.is_multiple_of(3) { 1 } else { 0 };
            if windows != j + 1 || s.iters != 2 || s.window != 2 || s.warmup != warmup {
                return Err(format!(
                    "call {j} after {windows} backend windows with {} iterations, window {}, warm-up {} (want {} windows, 2, 2, {warmup})",
                    s.iters,
                    s.window,
                    s.warmup,
                    j + 1
                ));
            }
            Ok(Some([100.0, 200.0, 900.0][(j % 3) as usize]))
        }
    }
    fn make(_: &ShmBackend, _: &WorldInfo) -> std::result::Result<Box<dyn concord_bench::Reference>, String> {
        Ok(Box::new(StepRef))
    }
    Hooks {
        clock: Some(concord_bench::Clock {
            mark,
            elapsed,
            describe: "fake device clock: 1, 2, 9 ms in turn",
            covers_p2p: true,
            profile: None,
        }),
        reference: Some(make),
        data: Some(via_host()),
        ..Hooks::default()
    }
}

/// `--interleave`: the reference times one window after each of the backend's windows, and its
/// time per op is the median over those windows.
fn interleave_times_the_reference_between_the_windows() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("i.jsonl");
    let js = json.to_string_lossy().into_owned();
    let o = run_clean(
        "shminterleave",
        &interleaved_hooks(),
        &[
            "--op",
            "all_reduce",
            "-b",
            "64",
            "-e",
            "64",
            "-n",
            "6",
            "--window",
            "2",
            "-w",
            "1",
            "--ranks",
            "2",
            "--interleave",
            "--no-plot",
            "--json",
            &js,
        ],
    )?;
    let recs = concord_bench::record::read_jsonl(&json)?;
    let own: Vec<_> = recs.iter().filter(|r| r.backend == "shminterleave").collect();
    let refs: Vec<_> = recs.iter().filter(|r| r.backend == "step-ref").collect();
    let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
    if own.len() != 2 || own.iter().any(|r| r.windows != 3 || !near(r.time_us, 1000.0)) {
        return Err(format!("backend records: {own:?}").into());
    }
    // 100, 200, 900: the median 200 (the mean would be 400), on both placements.
    if refs.len() != 2 || refs.iter().any(|r| !near(r.time_us, 200.0)) {
        return Err(format!("reference records (want 2 at 200 us; none: it was dropped): {refs:?}; lines {:?}", o.lines).into());
    }
    if !o.lines.iter().any(|l| l.contains("interleaved with the backend's (--interleave)")) {
        return Err(format!("the header does not say the windows were interleaved: {:?}", o.lines).into());
    }
    Ok(())
}

/// One rank, every op: sendrecv (which needs a peer) is left out on the ranks as in the table,
/// instead of failing the run at its end.
fn one_rank_runs_every_op_but_sendrecv() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("one.jsonl");
    let js = json.to_string_lossy().into_owned();
    let o = run_clean(
        "shm",
        &Hooks::default(),
        &["--op", "all", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1", "--ranks", "1", "--no-plot", "--json", &js],
    )?;
    let ops: std::collections::BTreeSet<String> = o.records.iter().filter(|r| r.backend == "shm").map(|r| r.op.clone()).collect();
    if ops.len() != 6 || ops.contains("sendrecv") {
        return Err(format!("ops run at 1 rank: {ops:?}").into());
    }
    Ok(())
}

/// Arguments that leave nothing to time are an error (exit 2), not a clean run that prints
/// `Wrong results: 0 OK`: sendrecv at one rank (it needs a peer), and sizes below one element per
/// rank chunk. Nothing is launched.
fn nothing_to_run_is_an_error() -> std::result::Result<(), Failed> {
    for argv in
        [&["--op", "sendrecv", "--ranks", "1"][..], &["--op", "all_gather", "-b", "8", "-e", "16", "-d", "double", "--ranks", "4"][..]]
    {
        let mut full = vec!["--backend", "shm", "-n", "1", "-w", "0", "--no-plot", "--json", "/nonexistent/never-written.jsonl"];
        full.extend_from_slice(argv);
        let (args, argv) = parse(&full);
        let o = concord_bench::run_parent::<ShmBackend>("shm", &Hooks::default(), &args, argv);
        if o.code != 2 || !o.records.is_empty() || o.lines.iter().any(|l| l.contains("OK")) {
            return Err(format!("{full:?}: exit code {} (want 2), {} records, lines {:?}", o.code, o.records.len(), o.lines).into());
        }
    }
    Ok(())
}

/// A world whose ranks all fail at init ran no step: the run fails (exit 1) and its summary does
/// not say `Wrong results: 0 OK`.
fn failed_world_is_not_ok() -> std::result::Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("fail.jsonl");
    let js = json.to_string_lossy().into_owned();
    let (args, argv) = parse(&[
        "--backend",
        "wrong7",
        "--op",
        "all_reduce",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "4",
        "--opts",
        "fail_init=1",
        "--no-plot",
        "--json",
        &js,
        "--deadline-s",
        "60",
    ]);
    let o = concord_bench::run_parent::<Wrong7>("wrong7", &Hooks::default(), &args, argv);
    let summary = o.lines.iter().find(|l| l.starts_with("# Wrong results")).cloned().unwrap_or_default();
    if o.code != 1 || summary.contains("OK") || !summary.contains("FAILED") {
        return Err(format!("exit code {} (want 1); summary `{summary}`; failures {:?}", o.code, o.failures).into());
    }
    // Every rank failed the same way: one FAILED line, then one naming the other ranks (not one
    // line per rank: `--ranks 99` printed 99); every rank's failure is still counted.
    let failed: Vec<&String> = o.warnings.iter().filter(|l| l.starts_with("FAILED:")).collect();
    let folded = failed.iter().any(|l| l.contains("the same as rank") && l.contains("on 3 more ranks"));
    if failed.len() != 2 || !folded || o.failures.len() != 4 {
        return Err(format!("want one FAILED line and one naming 3 more ranks (4 failures): {failed:?}; failures {:?}", o.failures).into());
    }
    Ok(())
}

fn main() {
    if let Some(_world) = concord_harness::launch::rank_world() {
        use clap::Parser;
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let args = Args::parse();
        let code = match args.backend.as_deref() {
            Some("wrong7") => main_with::<Wrong7>("wrong7", &Hooks::default(), &args, argv),
            Some("wrong7data") => main_with::<Wrong7>("wrong7data", &data_hooks(), &args, argv),
            Some("shmclock") => main_with::<ShmBackend>("shmclock", &clocked_hooks(), &args, argv),
            Some("shmwindows") => main_with::<ShmBackend>("shmwindows", &shifting_clock_hooks(), &args, argv),
            Some("shminterleave") => main_with::<ShmBackend>("shminterleave", &interleaved_hooks(), &args, argv),
            _ => main_with::<ShmBackend>("shm", &Hooks::default(), &args, argv),
        };
        std::process::exit(code);
    }
    let trials = vec![
        Trial::test("wrong_in_timed_iterations_fails_the_run", wrong_in_timed_iterations_fails_the_run),
        Trial::test("wrong_in_timed_iterations_fails_the_run_with_device_data", wrong_in_timed_iterations_fails_the_run_with_device_data),
        Trial::test("shm_every_op_end_to_end", shm_every_op_end_to_end),
        Trial::test("device_clock_and_reference_are_used", device_clock_and_reference_are_used),
        Trial::test("one_rank_runs_every_op_but_sendrecv", one_rank_runs_every_op_but_sendrecv),
        Trial::test("a_step_is_the_median_of_its_windows", a_step_is_the_median_of_its_windows),
        Trial::test("interleave_times_the_reference_between_the_windows", interleave_times_the_reference_between_the_windows),
        Trial::test("nothing_to_run_is_an_error", nothing_to_run_is_an_error),
        Trial::test("failed_world_is_not_ok", failed_world_is_not_ok),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
