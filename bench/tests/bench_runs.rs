//! End-to-end runs of the benchmark (a libtest-mimic binary: it is also the rank program the
//! launcher re-executes).
//!
//! * `wrong_in_timed_iterations_fails_the_run`: a backend that is right in its warm-up (check)
//!   iterations and wrong in every 7th all_reduce — inside the timed windows — on rank 1: the
//!   bench counts #wrong > 0, names op, size, iteration, rank and first bad index, exits 1.
//! * `shm_every_op_end_to_end`: 2 ranks, a few small sizes, every op: 0 wrong, one parseable
//!   JSON line per op × size × placement, a plot.

use concord_bench::{main_with, Args, Hooks};
use concord_core::{Backend, Capabilities, DType, OutstandingCounter, ReduceOp, Result, Tensor, Work, WorkMeta, WorldInfo};
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
        Ok(Wrong7 { inner: ShmBackend::init(world)?, calls: AtomicU64::new(0), counter: OutstandingCounter::default() })
    }
    fn name(&self) -> &str {
        "wrong7"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.counter.get()
    }
    fn new_group(&self, _: &[usize]) -> Result<Option<Self>> {
        Err(concord_core::CollectiveError::Unsupported("no groups".into()))
    }
    fn upload(&self, t: &Tensor) -> Result<Buf> {
        self.inner.upload(t)
    }
    fn download(&self, b: &Buf) -> Result<Tensor> {
        self.inner.download(b)
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Buf> {
        self.inner.alloc(dtype, shape)
    }
    fn write(&self, b: &Buf, t: &Tensor) -> Result<()> {
        self.inner.write(b, t)
    }
    fn view(&self, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        self.inner.view(b, offset, shape)
    }
    fn buffer_addr(&self, b: &Buf) -> usize {
        self.inner.buffer_addr(b)
    }
    fn buffer_dtype(&self, b: &Buf) -> DType {
        self.inner.buffer_dtype(b)
    }
    fn buffer_shape(&self, b: &Buf) -> Vec<usize> {
        self.inner.buffer_shape(b)
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
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.inner.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.inner.all_reduce_coalesced_(xs, op)
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        self.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.inner.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.inner.all_gather_into_tensor_coalesced(xs)
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.inner.reduce_scatter_tensor_out(x, op, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.inner.reduce_scatter_tensor_coalesced(xs, op)
    }
    fn all_to_all_single(&self, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.inner.broadcast(x, src)
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.inner.broadcast_(x, src)
    }
    fn permute_tensor(&self, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.inner.permute_tensor(x, src_dst)
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.inner.reduce(x, op, root)
    }
    fn gather(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.inner.gather(x, root)
    }
    fn scatter(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.inner.scatter(x, root)
    }
    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.inner.send(x, dst)
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.inner.recv(out, src)
    }
    fn barrier(&self) -> Result<Work<()>> {
        self.inner.barrier()
    }
}

fn parse(argv: &[&str]) -> (Args, Vec<String>) {
    use clap::Parser;
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    (Args::parse_from(std::iter::once("concord-bench".to_string()).chain(argv.clone())), argv)
}

fn wrong_in_timed_iterations_fails_the_run() -> std::result::Result<(), Failed> {
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
        "wrong7",
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
    let o = concord_bench::run_parent::<Wrong7>("wrong7", &Hooks::default(), &args, argv);
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
    let (args, argv) = parse(&[
        "--backend",
        "shm",
        "--op",
        "all",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "8",
        "-n",
        "4",
        "-w",
        "1",
        "--ranks",
        "2",
        "--json",
        &js,
        "--svg",
        &ss,
    ]);
    let o = concord_bench::run_parent::<ShmBackend>("shm", &Hooks::default(), &args, argv);
    if o.code != 0 || !o.failures.is_empty() {
        return Err(format!("exit code {}; failures {:?}", o.code, o.failures).into());
    }
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

fn main() {
    if let Some(_world) = concord_harness::launch::rank_world() {
        use clap::Parser;
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let args = Args::parse();
        let code = match args.backend.as_deref() {
            Some("wrong7") => main_with::<Wrong7>("wrong7", &Hooks::default(), &args, argv),
            _ => main_with::<ShmBackend>("shm", &Hooks::default(), &args, argv),
        };
        std::process::exit(code);
    }
    let trials = vec![
        Trial::test("wrong_in_timed_iterations_fails_the_run", wrong_in_timed_iterations_fails_the_run),
        Trial::test("shm_every_op_end_to_end", shm_every_op_end_to_end),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
