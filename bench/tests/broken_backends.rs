//! Testing the benchmark's checking (hunt13): broken backends the bench must catch, each a
//! wrapper of shm that is wrong in one realistic way, run through the whole bench (a
//! libtest-mimic binary: it is also the rank program the launcher re-executes, with the broken
//! backend named by `--backend`).
//!
//! Every trial asserts a non-zero exit, #wrong > 0 in a timed row, and a `WRONG` line naming
//! op, placement, size, `timed iteration N`, rank and first bad index; the hang asserts the
//! deadline's `HANG` line naming the rank and the collective, and that nothing of the world is
//! left (no rank process, no file in /tmp or /dev/shm).
//!
//! | backend | wrong how |
//! |---|---|
//! | `inplace-elsewhere` | `all_reduce_` returns a new buffer holding the right sum; the caller's buffer keeps its input |
//! | `recv-elsewhere` | `recv` receives into a buffer of its own; the caller's `out` is untouched |
//! | `out-aliases-input` | out-of-place `all_reduce` reduces in place and returns the input buffer |
//! | `scribbles-input` | out-of-place `all_reduce` right, but leaves its result in the input too (input as scratch) |
//! | `f16-wire` | f32 `all_reduce` through an f16 wire (a lossy compression) |
//! | `f32-wire` | f64 `broadcast` through an f32 wire |
//! | `a2a-order` | rank 1's `all_to_all` puts the ranks' rows in reverse order |
//! | `recv-half` | rank 0's `recv` writes the first half of the message; the rest of `out` keeps its old bytes |
//! | `stale` | rank 0's `all_gather` returns the previous call's result |
//! | `large-tail` | rank 1's `all_reduce` wrong at the last element only, at 1 Mi elements and more (rotated inputs) |
//! | `bcast-root1` | in-place `broadcast_` wrong on non-root ranks when the root is not 0 (`-r 1`) |
//! | `rs-last-rank` | `reduce_scatter` wrong on the last of 3 ranks, at its last element |
//! | `max-only` | int32 `all_reduce` wrong for `-o max` only |
//! | `late-write` | rank 1's `all_reduce` returns a completed work whose result lands at its next call |
//! | `silent-read` | shm with a device-data `read` hook that says Ok without handing the bytes over |
//! | `inplace-elsewhere+data`, `out-aliases-input+data` | the same through the device-data path (inputs as rotated copies, reads by closure) |
//! | `hang` | rank 1's 5th `all_reduce` never completes and its wait ignores the deadline |
//! | `fused-wrong`, `fused-memo` (`--fused`) | rank 1's fused outputs wrong at their last element; each fused op's result kept by its input's address |
//! | `gather-2d` (`--fused`) | `all_gather` of a 2-D input wrong at its last element, the fused ops the trait's decomposition over it: both paths wrong alike (review14 finding 6) |
//! | `init-hang` | every rank's `init` sleeps forever (a bootstrap waiting on nobody): the rank's watchdog names it at the setup timeout (review14 finding 8) |

use concord_bench::{main_with, Args, Hooks};
use concord_core::fused::{decomposed_all_gather_matmul, decomposed_matmul_reduce_scatter, Gathered};
use concord_core::{Backend, Completion, DType, OutstandingCounter, ReduceOp, Result, Tensor, Work, WorkMeta, WorldInfo};
use concord_shm::ShmBackend;
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

type Buf = <ShmBackend as Backend>::Buffer;

/// The broken behaviour of this rank process (from `--backend`).
static MODE: OnceLock<String> = OnceLock::new();

const LONG: Duration = Duration::from_secs(30);

struct Broken {
    inner: ShmBackend,
    mode: &'static str,
    calls: AtomicU64,
    counter: OutstandingCounter,
    /// `stale`: the previous all_gather result.
    last: Mutex<Option<Tensor>>,
    /// `late-write`: a result not yet written, and where it goes.
    pending: Mutex<Option<(Buf, Tensor)>>,
    /// `fused-memo`: results by (input address, shape, op).
    memo: Mutex<HashMap<MemoKey, Memo>>,
}

/// Never completes; its wait sleeps past any deadline (a wait that ignores its timeout).
struct Stuck;
impl Completion for Stuck {
    fn is_completed(&self) -> bool {
        false
    }
    fn wait_for(&self, _: Duration) -> Result<bool> {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

impl Broken {
    fn meta(&self, op: &str) -> WorkMeta {
        WorkMeta { backend: self.mode.into(), op: op.into(), seq: self.calls.load(Ordering::SeqCst), rank: self.rank() }
    }
    fn done(&self, b: Buf, op: &str) -> Work<Buf> {
        Work::done(b, self.meta(op), &self.counter)
    }
    /// `late-write`: the last call's result lands now.
    fn flush(&self) -> Result<()> {
        if let Some((b, t)) = self.pending.lock().unwrap().take() {
            self.inner.write(&b, &t)?;
        }
        Ok(())
    }
    /// Flips a bit of element `i` of `b` (counted from the end when `from_end`).
    fn corrupt(&self, b: &Buf, i: usize, from_end: bool) -> Result<()> {
        let mut t = self.inner.download(b)?;
        let n = t.numel();
        let i = if from_end { n - 1 - i.min(n - 1) } else { i % n };
        let elt = t.dtype().size();
        t.bytes_mut()[i * elt + elt - 1] ^= 0x10;
        self.inner.write(b, &t)
    }
    /// `t` rounded through `wire` and back.
    fn through(t: &Tensor, wire: DType) -> Tensor {
        let v: Vec<f64> = (0..t.numel()).map(|i| Tensor::from_f64(wire, &[1], &[t.get_f64(i)]).get_f64(0)).collect();
        Tensor::from_f64(t.dtype(), t.shape(), &v)
    }
}

impl Backend for Broken {
    type Buffer = Buf;
    fn init(world: &WorldInfo) -> Result<Self> {
        // `<mode>+data`: the same broken backend through the device-data path.
        let mode: &'static str = MODE.get().map(|s| s.as_str()).unwrap_or("shm");
        let mode = mode.strip_suffix("+data").unwrap_or(mode);
        if mode == "init-hang" {
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Ok(Broken {
            inner: ShmBackend::init(world)?,
            mode,
            calls: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
            last: Mutex::new(None),
            pending: Mutex::new(None),
            memo: Mutex::new(HashMap::new()),
        })
    }
    fn name(&self) -> &str {
        self.mode
    }
    concord_core::forward!(inner =>
        rank, world_size, capabilities, buffers, all_reduce_coalesced, all_reduce_coalesced_,
        all_gather_into_tensor_out, all_gather_into_tensor_coalesced, reduce_scatter_tensor_out,
        reduce_scatter_tensor_coalesced, permute_tensor, reduce, gather, scatter, send
    );
    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.counter.get()
    }
    fn new_group(&self, _: &[usize]) -> Result<Option<Self>> {
        Err(concord_core::CollectiveError::Unsupported("no groups".into()))
    }
    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.flush()?;
        let rank = self.rank();
        match self.mode {
            "out-aliases-input" => self.inner.all_reduce_(x, op),
            "scribbles-input" => {
                let out = self.inner.all_reduce(x, op)?.into_value(LONG)?;
                self.inner.write(x, &self.inner.download(&out)?)?;
                Ok(self.done(out, "all_reduce"))
            }
            "f16-wire" if self.inner.buffer_dtype(x) == DType::F32 => {
                let out = self.inner.all_reduce(x, op)?.into_value(LONG)?;
                self.inner.write(&out, &Self::through(&self.inner.download(&out)?, DType::F16))?;
                Ok(self.done(out, "all_reduce"))
            }
            "large-tail" if rank == 1 && self.inner.buffer_shape(x).iter().product::<usize>() >= 1 << 20 => {
                let out = self.inner.all_reduce(x, op)?.into_value(LONG)?;
                self.corrupt(&out, 0, true)?;
                Ok(self.done(out, "all_reduce"))
            }
            "max-only" if op == ReduceOp::Max && rank == 0 => {
                let out = self.inner.all_reduce(x, op)?.into_value(LONG)?;
                self.corrupt(&out, 5, false)?;
                Ok(self.done(out, "all_reduce"))
            }
            "late-write" if rank == 1 => {
                let out = self.inner.all_reduce(x, op)?.into_value(LONG)?;
                let t = self.inner.download(&out)?;
                let fresh = self.inner.alloc(t.dtype(), t.shape())?;
                *self.pending.lock().unwrap() = Some((fresh.clone(), t));
                Ok(self.done(fresh, "all_reduce"))
            }
            "hang" if rank == 1 && n == 5 => Ok(Work::new(x.clone(), std::sync::Arc::new(Stuck), self.meta("all_reduce"), &self.counter)),
            _ => self.inner.all_reduce(x, op),
        }
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.flush()?;
        if self.mode == "inplace-elsewhere" {
            let y = self.inner.upload(&self.inner.download(x)?)?;
            let y = self.inner.all_reduce_(&y, op)?.into_value(LONG)?;
            return Ok(self.done(y, "all_reduce_"));
        }
        self.inner.all_reduce_(x, op)
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.mode == "gather-2d" && self.inner.buffer_shape(x).len() >= 2 {
            // A separate path for multi-dimensional inputs (rows copied one by one) whose last
            // element comes out wrong; the 1-D path (the main bench's) is right.
            let out = self.inner.all_gather_into_tensor(x)?.into_value(LONG)?;
            self.corrupt(&out, 0, true)?;
            return Ok(self.done(out, "all_gather"));
        }
        if self.mode == "stale" && self.rank() == 0 {
            let out = self.inner.all_gather_into_tensor(x)?.into_value(LONG)?;
            let now = self.inner.download(&out)?;
            let prev = self.last.lock().unwrap().replace(now);
            if let Some(p) = prev.filter(|p| p.shape() == self.inner.buffer_shape(&out).as_slice()) {
                self.inner.write(&out, &p)?;
            }
            return Ok(self.done(out, "all_gather"));
        }
        self.inner.all_gather_into_tensor(x)
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.mode == "rs-last-rank" && self.rank() + 1 == self.world_size() {
            let out = self.inner.reduce_scatter_tensor(x, op)?.into_value(LONG)?;
            self.corrupt(&out, 0, true)?;
            return Ok(self.done(out, "reduce_scatter"));
        }
        self.inner.reduce_scatter_tensor(x, op)
    }
    fn all_to_all_single(&self, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.mode == "a2a-order" && self.rank() == 1 {
            // The rows from the ranks in reverse rank order.
            let out = self.inner.all_to_all_single(x, o, i)?.into_value(LONG)?;
            let t = self.inner.download(&out)?;
            let ws = self.world_size();
            let chunk = t.bytes().len() / ws;
            let mut r = t.clone();
            for k in 0..ws {
                r.bytes_mut()[k * chunk..(k + 1) * chunk].copy_from_slice(&t.bytes()[(ws - 1 - k) * chunk..(ws - k) * chunk]);
            }
            self.inner.write(&out, &r)?;
            return Ok(self.done(out, "all_to_all"));
        }
        self.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.mode == "f32-wire" && self.inner.buffer_dtype(x) == DType::F64 {
            let out = self.inner.broadcast(x, src)?.into_value(LONG)?;
            self.inner.write(&out, &Self::through(&self.inner.download(&out)?, DType::F32))?;
            return Ok(self.done(out, "broadcast"));
        }
        self.inner.broadcast(x, src)
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.mode == "bcast-root1" && src != 0 && self.rank() != src {
            let out = self.inner.broadcast_(x, src)?.into_value(LONG)?;
            self.corrupt(&out, 2, false)?;
            return Ok(self.done(out, "broadcast_"));
        }
        self.inner.broadcast_(x, src)
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        if self.mode == "recv-half" && self.rank() == 0 {
            // Only the first half of the message lands in `out`; the rest keeps what it held.
            let mine = self.inner.alloc(self.inner.buffer_dtype(out), &self.inner.buffer_shape(out))?;
            let got = self.inner.recv(&mine, src)?.into_value(LONG)?;
            let (new, mut old) = (self.inner.download(&got)?, self.inner.download(out)?);
            let half = new.bytes().len() / 2;
            old.bytes_mut()[..half].copy_from_slice(&new.bytes()[..half]);
            self.inner.write(out, &old)?;
            return Ok(self.done(out.clone(), "recv"));
        }
        if self.mode == "recv-elsewhere" {
            let mine = self.inner.alloc(self.inner.buffer_dtype(out), &self.inner.buffer_shape(out))?;
            return self.inner.recv(&mine, src);
        }
        self.inner.recv(out, src)
    }
    fn barrier(&self) -> Result<Work<()>> {
        self.flush()?;
        self.inner.barrier()
    }
    fn fused_all_gather_matmul(&self, a: &Buf, bs: &[Buf], dim: usize) -> Result<Work<Gathered<Buf>>> {
        let key = (self.inner.buffer_addr(a), self.inner.buffer_shape(a), "ag");
        if self.mode == "fused-memo" {
            if let Some(Memo::Ag(g)) = self.memo.lock().unwrap().get(&key) {
                return Ok(Work::done(g.clone(), self.meta("fused_all_gather_matmul"), &self.counter));
            }
        }
        let (ag, outs) = decomposed_all_gather_matmul(self, a, bs, dim, None)?.into_value(LONG)?;
        if self.mode == "fused-wrong" && self.rank() == 1 {
            self.corrupt(&outs[0], 0, true)?;
        }
        if self.mode == "fused-memo" {
            self.memo.lock().unwrap().insert(key, Memo::Ag((ag.clone(), outs.clone())));
        }
        Ok(Work::done((ag, outs), self.meta("fused_all_gather_matmul"), &self.counter))
    }
    fn fused_matmul_reduce_scatter(&self, a: &Buf, b: &Buf, op: ReduceOp, dim: usize) -> Result<Work<Buf>> {
        let key = (self.inner.buffer_addr(a), self.inner.buffer_shape(a), "rs");
        if self.mode == "fused-memo" {
            if let Some(Memo::Rs(o)) = self.memo.lock().unwrap().get(&key) {
                return Ok(self.done(o.clone(), "fused_matmul_reduce_scatter"));
            }
        }
        let out = decomposed_matmul_reduce_scatter(self, a, b, op, dim, None)?.into_value(LONG)?;
        if self.mode == "fused-wrong" && self.rank() == 1 {
            self.corrupt(&out, 0, true)?;
        }
        if self.mode == "fused-memo" {
            self.memo.lock().unwrap().insert(key, Memo::Rs(out.clone()));
        }
        Ok(self.done(out, "fused_matmul_reduce_scatter"))
    }
}

/// `fused-memo`'s key: the input's address and shape, and the op.
type MemoKey = (usize, Vec<usize>, &'static str);

/// `fused-memo`: a fused op's result, kept by the input's address and shape.
enum Memo {
    Ag(Gathered<Buf>),
    Rs(Buf),
}

/// Device data whose `read` never calls back with the bytes (and says Ok).
fn silent_read_hooks() -> Hooks<Broken> {
    fn copy(b: &Broken, dst: &Buf, src: &Buf, l: usize, s: usize) -> Result<()> {
        let t = b.download(src)?;
        let r = concord_bench::rank::rotate_chunks(t.bytes(), t.dtype().size(), l, s);
        b.write(dst, &Tensor::from_bytes(t.dtype(), t.shape(), &r))
    }
    fn read(_: &Broken, _: &Buf, _: &mut dyn FnMut(&[u8])) -> Result<()> {
        Ok(())
    }
    Hooks { data: Some(concord_bench::DeviceData { copy_rotated: copy, read }), ..Hooks::default() }
}

/// Device data through the host (download, rotate, write; reads by closure): the bench's
/// device-data path on a CPU backend.
fn via_host_hooks() -> Hooks<Broken> {
    fn read(b: &Broken, x: &Buf, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(b.download(x)?.bytes());
        Ok(())
    }
    let mut h = silent_read_hooks();
    if let Some(d) = h.data.as_mut() {
        d.read = read;
    }
    h
}

fn hooks_for(mode: &str) -> Hooks<Broken> {
    if mode == "silent-read" {
        silent_read_hooks()
    } else if mode.ends_with("+data") {
        via_host_hooks()
    } else {
        Hooks::default()
    }
}

/// One broken backend through the bench: `args` after the common ones.
/// The run most cases use: 1 KiB f32 all_reduce, 6 timed iterations, no warm-up.
const AR_1K: &[&str] = &["--op", "all_reduce", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"];

struct Case {
    mode: &'static str,
    args: &'static [&'static str],
    /// What the first timed WRONG line must contain (op, placement, size, rank).
    want: &'static [&'static str],
}

fn run(mode: &str, extra: &[&str]) -> std::result::Result<(concord_bench::Outcome, tempfile::TempDir), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("b.jsonl").to_string_lossy().into_owned();
    let mut argv: Vec<String> = ["--backend", mode, "--no-plot", "--json", &json].iter().map(|s| s.to_string()).collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    use clap::Parser;
    let args = Args::parse_from(std::iter::once("concord-bench".to_string()).chain(argv.clone()));
    Ok((concord_bench::run_parent::<Broken>(mode, &hooks_for(mode), &args, argv), dir))
}

fn caught(c: &Case) -> std::result::Result<(), Failed> {
    let (o, _dir) = run(c.mode, c.args)?;
    if o.code != 1 {
        return Err(format!("{}: exit code {} (want 1); failures {:?}", c.mode, o.code, o.failures).into());
    }
    let own: Vec<_> = o.records.iter().filter(|r| r.backend == c.mode).collect();
    if !own.iter().any(|r| r.wrong > 0 && r.wrong_iterations > 0) {
        return Err(format!("{}: no row counts #wrong > 0 in timed iterations: {:?}", c.mode, own).into());
    }
    let lines: Vec<&String> = o.failures.iter().filter(|f| f.starts_with("WRONG") && f.contains("timed iteration")).collect();
    let line = lines.first().ok_or_else(|| format!("{}: no WRONG line of a timed iteration: {:?}", c.mode, o.failures))?;
    for want in c.want.iter().chain(&[", rank ", "first bad index ", "got ", "expected "]) {
        if !line.contains(want) {
            return Err(format!("{}: `{want}` missing from: {line}", c.mode).into());
        }
    }
    println!("{}: {line}", c.mode);
    Ok(())
}

fn cases() -> Vec<Case> {
    vec![
        Case { mode: "inplace-elsewhere", args: AR_1K, want: &["all_reduce in-place 1024 B", "elements differ"] },
        Case {
            mode: "recv-elsewhere",
            args: &["--op", "sendrecv", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["sendrecv out-of-place 1024 B"],
        },
        Case {
            mode: "out-aliases-input",
            args: AR_1K,
            want: &["all_reduce out-of-place 1024 B", "the input of an out-of-place op changed"],
        },
        Case { mode: "inplace-elsewhere+data", args: AR_1K, want: &["all_reduce in-place 1024 B", "elements differ"] },
        Case {
            mode: "out-aliases-input+data",
            args: AR_1K,
            want: &["all_reduce out-of-place 1024 B", "the input of an out-of-place op changed"],
        },
        Case { mode: "scribbles-input", args: AR_1K, want: &["all_reduce out-of-place 1024 B", "the input of an out-of-place op changed"] },
        Case { mode: "f16-wire", args: AR_1K, want: &["all_reduce out-of-place 1024 B"] },
        Case {
            mode: "f32-wire",
            args: &["--op", "broadcast", "-d", "double", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["broadcast out-of-place 1024 B"],
        },
        Case {
            mode: "a2a-order",
            args: &["--op", "all_to_all", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["all_to_all out-of-place 1024 B", "rank 1", "first bad index 0"],
        },
        Case {
            mode: "recv-half",
            args: &["--op", "sendrecv", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["sendrecv out-of-place 1024 B", "rank 0", "first bad index 128"],
        },
        Case {
            mode: "stale",
            args: &["--op", "all_gather", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["all_gather out-of-place 1024 B", "rank 0"],
        },
        Case {
            mode: "large-tail",
            args: &["--op", "all_reduce", "-b", "4M", "-e", "4M", "-n", "3", "-w", "0"],
            want: &["all_reduce out-of-place 4194304 B", "rank 1", "first bad index 1048575"],
        },
        Case {
            mode: "bcast-root1",
            args: &["--op", "broadcast", "-r", "1", "--ranks", "3", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["broadcast in-place 1024 B", "first bad index 2"],
        },
        Case {
            mode: "rs-last-rank",
            args: &["--op", "reduce_scatter", "--ranks", "3", "-b", "3K", "-e", "3K", "-n", "6", "-w", "0"],
            want: &["reduce_scatter out-of-place 3072 B", "rank 2", "first bad index 255"],
        },
        Case {
            mode: "max-only",
            args: &["--op", "all_reduce", "-d", "int32", "-o", "max", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0"],
            want: &["all_reduce out-of-place 1024 B", "rank 0", "first bad index 5"],
        },
        Case { mode: "late-write", args: AR_1K, want: &["all_reduce out-of-place 1024 B", "rank 1"] },
        Case {
            mode: "silent-read",
            args: AR_1K,
            want: &["all_reduce out-of-place 1024 B", "the device-data read returned Ok without the bytes"],
        },
    ]
}

/// The broken fused ops (review-d): `fused-wrong` (rank 1's fused outputs wrong at their last
/// element, every call), `fused-memo` (each fused op computed once per input address and shape,
/// that result returned again for every later call on the same buffers); and `gather-2d`
/// (review14 finding 6: the trait's fused decomposition over an all_gather wrong for 2-D inputs,
/// so the fused and the unfused path agree and only the oracle tells them wrong).
const FUSED_MODES: [&str; 3] = ["fused-wrong", "fused-memo", "gather-2d"];

/// One broken fused backend through `--fused` (the smallest shape, 4 timed iterations): the run
/// must exit 1.
fn fused_caught(mode: &'static str) -> std::result::Result<(), Failed> {
    let code = fused_run(mode)?;
    if code != 1 {
        return Err(format!("{mode}: `--fused` exit code {code} (want 1: a wrong fused result must fail the run)").into());
    }
    Ok(())
}

/// `--fused` on `mode`'s backend: its exit code.
fn fused_run(mode: &str) -> std::result::Result<i32, Failed> {
    let argv: Vec<String> =
        ["--backend", mode, "--fused", "-e", "4K", "-n", "4", "-w", "1", "--deadline-s", "60"].iter().map(|s| s.to_string()).collect();
    use clap::Parser;
    let args = Args::parse_from(std::iter::once("concord-bench".to_string()).chain(argv.clone()));
    Ok(concord_bench::fused::fused_main_with::<Broken>(mode, &args, argv))
}

/// Entries of `dir` named after a world process `pid` launched (nextest runs each trial in a
/// process of its own, so these are the hang trial's).
fn leftovers(dir: &std::path::Path, pid: u32) -> Vec<String> {
    let launched = |n: &str| n.starts_with("concord-l") && concord_harness::platform::world_owner(n).is_some_and(|o| o.pid == pid);
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| launched(n)).collect())
        .unwrap_or_default()
}

/// Live children of this process running `--backend hang` (a rank left running would be one).
fn hang_ranks() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().nth(1) == Some(me.as_str())))
                .unwrap_or(false)
        })
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmd.windows(15).any(|w| w == b"--backend\0hang\0")
        })
        .collect()
}

/// Rank 1 stuck in its 5th all_reduce (timed iteration 4), its wait ignoring the deadline: the
/// run ends at `--deadline-s`, naming rank 1 and the collective, and leaves nothing behind.
fn hang_ends_at_the_deadline_naming_rank_and_collective() -> std::result::Result<(), Failed> {
    let t = std::time::Instant::now();
    let (o, _dir) = run("hang", &["--op", "all_reduce", "-b", "1K", "-e", "1K", "-n", "6", "-w", "0", "--deadline-s", "3"])?;
    if o.code != 1 {
        return Err(format!("exit code {} (want 1); failures {:?}", o.code, o.failures).into());
    }
    let hang = o
        .failures
        .iter()
        .find(|f| f.contains("HANG") && f.contains("rank 1") && f.contains("all_reduce out-of-place 1024 B"))
        .ok_or_else(|| format!("no HANG line naming rank 1 and the collective: {:?}", o.failures))?;
    if t.elapsed() > Duration::from_secs(20) {
        return Err(format!("the run took {:?} past a 3 s deadline ({hang})", t.elapsed()).into());
    }
    let left: Vec<String> = [std::env::temp_dir(), "/dev/shm".into()].iter().flat_map(|d| leftovers(d, std::process::id())).collect();
    if !left.is_empty() {
        return Err(format!("left behind: {left:?}").into());
    }
    let kids = hang_ranks();
    if !kids.is_empty() {
        return Err(format!("rank processes still running: {kids:?}").into());
    }
    Ok(())
}

/// Set for the bench parent `init_hang_*` starts as a process of its own (this binary, run as
/// `concord-bench` would be): its ranks read the small setup timeout it is given.
const PARENT_ENV: &str = "BROKEN_BACKENDS_BENCH_PARENT";

/// Every rank hangs in `B::init`; no `--deadline-s` (an hour by default): each rank's watchdog
/// ends it at the setup timeout (1 s here, `CONCORD_SETUP_TIMEOUT_MS`) naming the rank and the
/// backend init, and the run exits 1 within seconds, leaving nothing behind.
fn init_hang_ends_at_the_setup_timeout_naming_rank_and_init() -> std::result::Result<(), Failed> {
    use std::process::{Command, Stdio};
    let t = std::time::Instant::now();
    // The run's JSON lines in a directory of the trial's own (not `concord-bench/` here).
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("b.jsonl");
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args(["--backend", "init-hang", "--no-plot", "--op", "all_reduce", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--json"])
        .arg(&json)
        .env(PARENT_ENV, "1")
        .env(concord_harness::config::SETUP_TIMEOUT_MS, "1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id();
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    // Far below the default `--deadline-s` (3600 s); a run still going then is ended here.
    let code = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st.code();
        }
        if t.elapsed() > Duration::from_secs(30) {
            // SIGTERM first: the bench ends its ranks and removes its files; SIGKILL 5 s later.
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            let t_term = std::time::Instant::now();
            while child.try_wait().ok().flatten().is_none() && t_term.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the run still going after {:?}: a rank hung in init was not ended", t.elapsed()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t.elapsed();
    let err = reader.join().unwrap_or_default();
    if code != Some(1) {
        return Err(format!("exit code {code:?} (want 1)\n{err}").into());
    }
    let line = err
        .lines()
        .find(|l| l.contains("HANG: rank ") && l.contains("during backend init") && l.contains("limit 1000 ms"))
        .ok_or_else(|| format!("no HANG line naming a rank and its backend init:\n{err}"))?;
    // Both ranks are named: one line each, or rank 0's and "the same ... on 1 more rank: 1".
    let both = (err.contains("HANG: rank 0 ") && err.contains("HANG: rank 1 ")) || err.contains("on 1 more rank: ");
    if !both {
        return Err(format!("not every rank is named:\n{err}").into());
    }
    if took > Duration::from_secs(15) {
        return Err(format!("the run took {took:?} past a 1 s setup timeout ({line})").into());
    }
    let left: Vec<String> = [std::env::temp_dir(), "/dev/shm".into()].iter().flat_map(|d| leftovers(d, pid)).collect();
    if !left.is_empty() {
        return Err(format!("left behind: {left:?}").into());
    }
    println!("init-hang: ended in {took:?}: {line}");
    Ok(())
}

fn main() {
    if std::env::var_os(PARENT_ENV).is_some() && concord_harness::launch::rank_world().is_none() {
        // The bench parent of `init_hang_*` (its ranks, launched with this variable inherited,
        // take the branch below).
        use clap::Parser;
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let args = Args::parse();
        let mode = args.backend.clone().unwrap_or_else(|| "shm".into());
        std::process::exit(main_with::<Broken>(&mode, &hooks_for(&mode), &args, argv));
    }
    if let Some(_world) = concord_harness::launch::rank_world() {
        use clap::Parser;
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let args = Args::parse();
        let mode = args.backend.clone().unwrap_or_else(|| "shm".into());
        let _ = MODE.set(mode.clone());
        if args.fused {
            std::process::exit(concord_bench::fused::fused_main_with::<Broken>(&mode, &args, argv));
        }
        std::process::exit(main_with::<Broken>(&mode, &hooks_for(&mode), &args, argv));
    }
    let mut trials: Vec<Trial> = cases().into_iter().map(|c| Trial::test(format!("broken::{}", c.mode), move || caught(&c))).collect();
    for mode in FUSED_MODES {
        trials.push(Trial::test(format!("broken::{mode}"), move || fused_caught(mode)));
    }
    trials.push(Trial::test("broken::fused_control_shm_passes", || {
        let code = fused_run("shm")?;
        if code != 0 {
            return Err(format!("shm (correct): `--fused` exit code {code} (want 0)").into());
        }
        Ok(())
    }));
    trials.push(Trial::test(
        "broken::hang_ends_at_the_deadline_naming_rank_and_collective",
        hang_ends_at_the_deadline_naming_rank_and_collective,
    ));
    trials.push(Trial::test(
        "broken::init_hang_ends_at_the_setup_timeout_naming_rank_and_init",
        init_hang_ends_at_the_setup_timeout_naming_rank_and_init,
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
