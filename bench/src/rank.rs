//! The rank side: one launched process per rank runs every step on its backend and reports one
//! JSON message per line on stdout (the parent merges the ranks).
//!
//! # How a step is timed and checked
//! * Inputs differ per iteration: `P` base input sets (all ranks' inputs from
//!   `concord_fixtures::input`, exact by construction, so any reduction order is bit-exact) and
//!   the oracle's expected output for each; iteration `i` uses set `i % P` with every chunk of
//!   `count` elements rotated by `(i / P) · 7919 mod count`. Rotating every rank's chunks alike
//!   rotates the expected output's chunks alike, so the expected output of every iteration is
//!   exact and known without calling the oracle again.
//! * Timed iterations run in windows of `k` (memory budget): the `k` inputs are written first,
//!   then a barrier, then the clock runs over `k` back-to-back issues (and, on the wall clock,
//!   the waits of all `k`); the `k` outputs are kept and checked against the expected ones after
//!   the clock stops. Every timed iteration is checked; so is every warm-up iteration.
//! * What is checked is what the caller sees: an in-place op's result in the input buffer
//!   itself (not the buffer its work returns), sendrecv's in the buffer given to `recv`, an
//!   out-of-place op's in the buffer returned — and an out-of-place op's input buffer must still
//!   hold that iteration's input (an op that reduces in place and returns its input, or uses it
//!   as scratch, is wrong). A device-data `read` that returns Ok without handing the bytes over
//!   counts every element as wrong.
//! * f32 / f64 Exact inputs are scaled by one odd factor to fill the significand (`widen`):
//!   the fixtures' small integers pass exactly through a narrower float, so an f32 reduction
//!   over an f16 wire, or f64 data moved as f32, would otherwise be right to the bit.
//! * The clock: with a device clock ([`crate::ext::Clock`], CUDA events for NCCL) a window's
//!   time is the device time from a mark before its first issue to a mark after its last issue,
//!   as nccl-tests times (no per-op host synchronisation or check inside), and the window
//!   starts behind one untimed launch of the same op on scratch buffers (a GPU idle through
//!   the last window's checks runs its first kernels slower: at 64 MiB, 20-op windows read
//!   0.93-0.94 x raw NCCL's busbw without it; nccl-tests times right after its warm-up, never
//!   after an idle gap); without one, the
//!   host wall-clock from the first issue to the end of the last wait. The wall-clock is
//!   reported in both cases (`wall_us`; with a device clock it also holds what was left of the
//!   untimed launch when the window's issues began).
//! * A step's time per op is the median over its timed windows of each window's time per op
//!   (`--window K` caps a window at `K` iterations, so `-n 1000 --window 100` times ten
//!   windows); the fastest and slowest window's are reported beside it (`spread_us`). With one
//!   window (the default at small sizes) the median is that window's mean.
//! * A reference ([`crate::ext::Reference`]), when the backend has one, is timed right after
//!   each placement of each step, with the same iterations and window; with `--interleave`,
//!   one window right after each of the backend's timed windows instead (its first with the
//!   warm-up), its time the median over those windows as well.
//! * Checking is cheap for large sizes: the base sets are generated once per step (both
//!   placements), inputs are rotated straight into the tensor written, and outputs are compared
//!   with the rotated expected output in place, in parallel threads; only a mismatch builds the
//!   rotated tensor for the oracle's element-wise comparison (tolerance, first bad index).
//! * Warm-up runs in the same windows, and at least one whole window (`-w` is raised to the
//!   window), so the buffers of the timed windows have been touched before the clock runs.
//! * Waits use the world's op timeout; a watchdog thread ends the rank with the collective it is
//!   in ([`concord_core::progress::describe`]) if nothing moves for twice that plus 30 s. The
//!   watchdog starts before the backend: its set-up (`B::init`, `hooks.prepare`, the reference's
//!   set-up) is bounded by the setup timeout (`CONCORD_SETUP_TIMEOUT_MS`, the deadline of a
//!   world's spawn, rendezvous and backend init: `concord_harness::config`), after which a hung
//!   rank is named with the phase `backend init` (review14 finding 8: it waited for
//!   `--deadline-s`, an hour by default).

use crate::ext::{Clock, DeviceData, RefStep, Reference};
use crate::spec::{BenchOp, Placement, Step};
use crate::Hooks;
use concord_core::{progress, Backend, CollectiveError, DType, ReduceOp, Tensor, Work, WorldInfo};
use concord_fixtures::{widen, InputKind};
use concord_oracle::{Semantics, Tolerance};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Elements of all ranks' inputs generated per base set before sets are reused with rotations.
const GEN_BUDGET_ELEMS: usize = 1 << 22;
const ROT_STRIDE: usize = 7919;

/// One line from a rank.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    Hello {
        rank: usize,
        backend: String,
        version: String,
        timing: String,
        /// The reference's (label, description), when the backend has one.
        #[serde(default)]
        reference: Option<(String, String)>,
    },
    /// Something the parent prints (e.g. the reference was dropped and why).
    Note {
        rank: usize,
        message: String,
    },
    Start {
        rank: usize,
        op: String,
        size: usize,
        placement: Placement,
    },
    Result(RankResult),
    Wrong(Wrong),
    Fatal {
        rank: usize,
        message: String,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: usize,
    pub op: String,
    pub size: usize,
    pub placement: Placement,
    pub time_us: f64,
    pub window: usize,
    pub wrong: u64,
    pub wrong_iterations: u64,
    pub wrong_warmup: u64,
    /// Host wall-clock per timed iteration (issues + waits), whatever the clock.
    #[serde(default)]
    pub wall_us: f64,
    /// The reference's time per op for the same step and placement.
    #[serde(default)]
    pub ref_us: Option<f64>,
    /// Timed windows (`time_us` is the median over them of each window's time per op).
    #[serde(default)]
    pub windows: usize,
    /// The fastest and slowest window's time per op (µs).
    #[serde(default)]
    pub spread_us: Option<(f64, f64)>,
    /// The same for the reference's windows, when it reports them.
    #[serde(default)]
    pub ref_spread_us: Option<(f64, f64)>,
}

/// The median of `xs` (the mean of the middle two for an even count); 0 for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The first wrong element of one checked iteration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Wrong {
    pub rank: usize,
    pub op: String,
    pub size: usize,
    pub placement: Placement,
    /// `timed iteration 7` or `warm-up iteration 3` (0-based within its phase).
    pub iteration: String,
    pub index: usize,
    pub got: String,
    pub expected: String,
    pub detail: String,
}

impl std::fmt::Display for Wrong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WRONG: {} {} {} B, {}, rank {}: first bad index {}: got {}, expected {} ({})",
            self.op,
            self.placement.name(),
            self.size,
            self.iteration,
            self.rank,
            self.index,
            self.got,
            self.expected,
            self.detail
        )
    }
}

/// Where an externally launched rank's message lines go instead of stdout (set once, by
/// [`crate::external`]): rank 0 merges them as the parent merges launched ranks' stdout.
pub(crate) static RELAY: std::sync::OnceLock<RelayFn> = std::sync::OnceLock::new();

/// Sends one message line elsewhere than stdout.
pub(crate) type RelayFn = Box<dyn Fn(&str) + Send + Sync>;

fn emit(m: &Msg) {
    if let Some(relay) = RELAY.get() {
        relay(&serde_json::to_string(m).expect("a message serialises"));
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, m);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// The watchdog's phase while a rank sets its backend up (bounded by the setup timeout).
pub(crate) const INIT_PHASE: &str = "backend init (B::init, hooks.prepare, the reference's set-up; limit: the setup timeout)";

/// What a rank is doing, for the watchdog.
#[derive(Clone)]
pub(crate) struct Beat {
    last_ms: Arc<AtomicU64>,
    phase: Arc<Mutex<String>>,
    start: Instant,
    /// How long the watchdog lets the current phase go without progress (ms).
    limit_ms: Arc<AtomicU64>,
}

impl Beat {
    /// A beat in `phase` and the thread that ends this process (exit 1, after `say` got the
    /// `HANG` line naming the rank and the phase) once nothing has moved for the current limit.
    pub(crate) fn watched(rank: usize, phase: &str, limit: Duration, say: fn(usize, String)) -> Beat {
        let beat = Beat {
            last_ms: Arc::new(AtomicU64::new(0)),
            phase: Arc::new(Mutex::new(phase.into())),
            start: Instant::now(),
            limit_ms: Arc::new(AtomicU64::new(limit.as_millis() as u64)),
        };
        let watched = beat.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let beat = &watched;
            let idle = beat.start.elapsed().saturating_sub(Duration::from_millis(beat.last_ms.load(Ordering::Relaxed)));
            let limit = Duration::from_millis(beat.limit_ms.load(Ordering::Relaxed));
            if idle > limit {
                let phase = beat.phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
                say(
                    rank,
                    format!(
                        "HANG: rank {rank} made no progress for {} s (limit {} ms) during {phase}; this process is {}",
                        idle.as_secs(),
                        limit.as_millis(),
                        progress::describe()
                    ),
                );
                std::process::exit(1);
            }
        });
        beat
    }
    /// Enters `phase` with another limit.
    pub(crate) fn limit(&self, phase: String, limit: Duration) {
        // Tick first: the new (shorter) limit must never be read against the idle time of the
        // phase before it (a long set-up would read as a hang of the next phase).
        self.phase(phase);
        self.limit_ms.store(limit.as_millis() as u64, Ordering::Relaxed);
    }
    fn tick(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn phase(&self, s: String) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = s;
        self.tick();
    }
}

/// Default memory per rank for one timed window's buffers (`--check-budget`): host memory.
pub const HOST_BUDGET: usize = 512 << 20;
/// The same with a device clock (GPU memory): nccl-tests' whole timed loop in one window up to
/// 64 MiB at its default 20 iterations.
pub const DEVICE_BUDGET: usize = 8 << 30;

/// The settings every step of a rank shares.
struct Ctx<'a, B: Backend> {
    b: &'a B,
    rank: usize,
    ws: usize,
    dtype: DType,
    redop: ReduceOp,
    root: usize,
    iters: usize,
    warmup: usize,
    budget: usize,
    /// `--window`: the most timed iterations per window.
    window_max: usize,
    timeout: Duration,
    sem: Semantics,
    beat: Beat,
    clock: Option<&'a Clock<B>>,
    data: Option<&'a DeviceData<B>>,
    /// First wrong messages already sent for this step (at most a few per step).
    reported: std::cell::Cell<usize>,
}

/// A rank's main: runs every step, prints one message per line, returns the exit code.
pub fn rank_main<B: Backend>(world: &WorldInfo, a: &crate::Args, hooks: &Hooks<B>) -> i32 {
    let rank = world.rank;
    let fatal = |message: String| {
        emit(&Msg::Fatal { rank, message });
        1
    };
    let parsed = (|| -> Result<_, String> {
        let dtype = crate::spec::parse_dtype(&a.dtype)?;
        let redop = crate::spec::parse_redop(a.redop_name())?;
        let ops = BenchOp::parse_list(&a.op)?;
        let sizes = crate::spec::sizes(a.min_bytes, a.max_bytes, a.factor)?;
        Ok((dtype, redop, crate::spec::runnable(ops, world.world_size), sizes))
    })();
    let (dtype, redop, ops, sizes) = match parsed {
        Ok(p) => p,
        Err(e) => return fatal(e),
    };
    // The backend's set-up is bounded by the setup timeout (the module docs); the steps by the op limit.
    let setup = concord_harness::config::Config::global().setup_timeout;
    let beat = Beat::watched(rank, INIT_PHASE, setup, |rank, message| emit(&Msg::Fatal { rank, message }));
    // The world's store, opened before init and held for the rank's life, as a runner world's
    // worker does (`suites::run::init_state`): a c10d FileStore's file goes once every user has
    // closed it, so a handle opened only around the declarations' check let rank 0's close remove
    // the file (the key with it) while rank 1 still waited on it (a hang at init, CI under load).
    let store = match concord_store::Store::open(&world.store_path, world.world_size, world.op_timeout) {
        Ok(s) => s,
        Err(e) => return fatal(format!("rank {rank}: cannot open the world's store: {e}")),
    };
    let b = match B::init(world) {
        Ok(b) => b,
        Err(e) => return fatal(format!("rank {rank}: backend init failed: {e} [{}]", e.name())),
    };
    // The ranks' declarations compared with rank 0's, as at every runner world's setup
    // ([clause: init.same_capabilities]): a rank's checks read its own.
    if let Err(message) = concord_harness::declared::same_on_every_rank(&store, rank, world.world_size, &b.capabilities(), b.name(), setup)
    {
        return fatal(message);
    }
    (hooks.prepare)(&b);
    let mut reference: Option<Box<dyn Reference>> = match hooks.reference.map(|make| make(&b, world)) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => {
            emit(&Msg::Note { rank, message: format!("rank {rank}: no reference in this run: {e}") });
            None
        }
    };
    let timing = hooks.clock.as_ref().map_or(hooks.timing, |c| c.describe).to_string();
    emit(&Msg::Hello {
        rank,
        backend: b.name().to_string(),
        version: (hooks.version)(&b),
        timing,
        reference: reference.as_ref().map(|r| {
            let how = if a.interleave { "; its windows interleaved with the backend's (--interleave)" } else { "" };
            (r.label(), format!("{}{how}", r.describe()))
        }),
    });
    beat.limit("starting".into(), world.op_timeout * 2 + Duration::from_secs(30));
    let cx = Ctx {
        b: &b,
        rank,
        ws: world.world_size,
        dtype,
        redop,
        root: a.root,
        iters: a.iters,
        warmup: a.warmup,
        budget: a.check_budget.unwrap_or(if hooks.clock.is_some() { DEVICE_BUDGET } else { HOST_BUDGET }),
        window_max: a.window.unwrap_or(usize::MAX).max(1),
        timeout: world.op_timeout,
        sem: Semantics::of(&b.capabilities()),
        beat,
        clock: hooks.clock.as_ref(),
        data: hooks.data.as_ref(),
        reported: std::cell::Cell::new(0),
    };
    let (steps, _) = crate::spec::plan(&ops, &sizes, dtype.size(), world.world_size);
    let mut any_wrong = false;
    for step in steps {
        let sets = match base_sets(&cx, step) {
            Ok(s) => s,
            Err(e) => return fatal(format!("rank {rank}: {} {} B: {e} [{}]", step.op.name(), step.size, e.name())),
        };
        for placement in [Placement::OutOfPlace, Placement::InPlace] {
            if placement == Placement::InPlace && !step.op.has_in_place() {
                continue;
            }
            emit(&Msg::Start { rank, op: step.op.name().into(), size: step.size, placement });
            cx.reported.set(0);
            // The reference times the backend's very call (op, count, dtype, reduce op, root,
            // placement) with a warm-up, iterations and window of its own.
            let ref_step = |warmup: usize, iters: usize, window: usize| RefStep {
                op: step.op,
                count: step.count,
                dtype,
                redop,
                root: a.root,
                placement,
                warmup,
                iters,
                window,
            };
            // `--interleave`: the reference times one window right after each of the
            // backend's (same iterations), its first with the warm-up.
            let mut between = Interleaved::default();
            let ran = match reference.as_mut().filter(|_| a.interleave) {
                Some(rf) => {
                    let mut after_window = |k: usize, own_us: f64| {
                        between.own.push(own_us);
                        if between.stopped {
                            return;
                        }
                        cx.beat.phase(format!("{} {} {} B: reference {} window", step.op.name(), placement.name(), step.size, rf.label()));
                        let rs = ref_step(if between.windows.is_empty() { a.warmup } else { 0 }, k, k);
                        match rf.time_us(&rs) {
                            Ok(Some(t)) => between.windows.push(t),
                            Ok(None) => between.stopped = true,
                            Err(e) => (between.stopped, between.failed) = (true, Some(e)),
                        }
                    };
                    run_step(&cx, step, placement, &sets, Some(&mut after_window))
                }
                None => run_step(&cx, step, placement, &sets, None),
            };
            match ran {
                Ok(mut r) if a.interleave && reference.is_some() => {
                    if let Some(e) = between.failed {
                        emit(&Msg::Note {
                            rank,
                            message: format!(
                                "rank {rank}: reference {} failed at {} {} {} B, not used from here on: {e}",
                                reference.as_ref().map(|rf| rf.label()).unwrap_or_default(),
                                step.op.name(),
                                placement.name(),
                                step.size
                            ),
                        });
                        reference = None;
                    } else if !between.windows.is_empty() && !between.stopped {
                        let w = &between.windows;
                        if concord_harness::config::Config::global().bench_probe {
                            // The windows in the order they ran, µs per op: one line per step
                            // and rank (one write: the ranks share the parent's stderr).
                            let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" ");
                            let line = format!(
                                "# pairs rank {rank} {} {} {} B: backend {} | reference {}\n",
                                step.op.name(),
                                placement.name(),
                                step.size,
                                list(&between.own),
                                list(w)
                            );
                            let _ = std::io::stderr().lock().write_all(line.as_bytes());
                        }
                        r.ref_us = Some(median(w));
                        r.ref_spread_us = Some((w.iter().copied().fold(f64::INFINITY, f64::min), w.iter().copied().fold(0.0, f64::max)));
                    }
                    any_wrong |= r.wrong + r.wrong_warmup > 0;
                    emit(&Msg::Result(r));
                }
                Ok(mut r) => {
                    if let Some(rf) = reference.as_mut() {
                        cx.beat.phase(format!("{} {} {} B: reference {}", step.op.name(), placement.name(), step.size, rf.label()));
                        let rs = ref_step(a.warmup, a.iters, r.window);
                        match rf.time_us(&rs) {
                            Ok(t) => {
                                r.ref_us = t;
                                r.ref_spread_us = t.and_then(|_| rf.last_spread_us());
                            }
                            Err(e) => {
                                emit(&Msg::Note {
                                    rank,
                                    message: format!(
                                        "rank {rank}: reference {} failed at {} {} {} B, not used from here on: {e}",
                                        rf.label(),
                                        step.op.name(),
                                        placement.name(),
                                        step.size
                                    ),
                                });
                                reference = None; // dropped: its communicator is destroyed (aborted if stuck)
                            }
                        }
                    }
                    any_wrong |= r.wrong + r.wrong_warmup > 0;
                    emit(&Msg::Result(r));
                }
                Err(e) => {
                    return fatal(format!(
                        "rank {rank}: {} {} {} B failed: {e} [{}]; this process is {}",
                        step.op.name(),
                        placement.name(),
                        step.size,
                        e.name(),
                        progress::describe()
                    ))
                }
            }
        }
    }
    drop(reference);
    // Leave together: a rank that exits while a peer still reads its buffers would look dead.
    if let Err(e) = b.barrier().and_then(|w| w.wait(cx.timeout).map(|_| ())) {
        return fatal(format!("rank {rank}: final barrier failed: {e}"));
    }
    i32::from(any_wrong)
}

/// Rotates every chunk of `l` elements of `elt` bytes right by `s` elements.
pub fn rotate_chunks(src: &[u8], elt: usize, l: usize, s: usize) -> Vec<u8> {
    let mut dst = vec![0u8; src.len()];
    rotate_into(&mut dst, src, elt, l, s);
    dst
}

/// The copies of a chunk rotation as `(dst offset, src offset, bytes)`, ascending in `dst`,
/// covering `0..len` once, each at most `piece` bytes (so that threads can share them).
fn rotation_pieces(len: usize, elt: usize, l: usize, s: usize, piece: usize) -> Vec<(usize, usize, usize)> {
    let s = if l == 0 { 0 } else { s % l };
    let mut segs = Vec::new();
    if s == 0 || len == 0 {
        segs.push((0, 0, len));
    } else {
        let (cb, sb) = (l * elt, s * elt);
        for o in (0..len).step_by(cb) {
            segs.push((o, o + cb - sb, sb));
            segs.push((o + sb, o, cb - sb));
        }
    }
    let piece = piece.max(1);
    let mut out = Vec::with_capacity(segs.len());
    for (d, s, n) in segs {
        let mut off = 0;
        while off < n {
            let m = piece.min(n - off);
            out.push((d + off, s + off, m));
            off += m;
        }
    }
    out
}

/// Threads for a pass over `len` bytes (1 below 8 MiB).
fn threads_for(len: usize) -> usize {
    if len < (8 << 20) {
        return 1;
    }
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 16)
}

/// `dst` = `src` with every chunk of `l` elements rotated right by `s` (parallel when large).
pub fn rotate_into(dst: &mut [u8], src: &[u8], elt: usize, l: usize, s: usize) {
    assert_eq!(dst.len(), src.len(), "rotate_into: lengths differ");
    let threads = threads_for(src.len());
    let pieces = rotation_pieces(src.len(), elt, l, s, src.len().div_ceil(threads).max(1 << 20));
    // Disjoint mutable slices of `dst`, in order.
    let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(pieces.len());
    let mut rest = dst;
    for &(_, so, n) in &pieces {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
        jobs.push((head, &src[so..so + n]));
        rest = tail;
    }
    if threads == 1 {
        jobs.into_iter().for_each(|(d, s)| d.copy_from_slice(s));
        return;
    }
    let per = jobs.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let mut jobs = jobs;
        while !jobs.is_empty() {
            let batch: Vec<_> = jobs.drain(..per.min(jobs.len())).collect();
            sc.spawn(move || batch.into_iter().for_each(|(d, s)| d.copy_from_slice(s)));
        }
    });
}

/// Whether `got` is `exp` with every chunk of `l` elements rotated right by `s`, compared in
/// place (no rotated copy), in parallel threads when large.
pub fn rotated_eq(got: &[u8], exp: &[u8], elt: usize, l: usize, s: usize) -> bool {
    if got.len() != exp.len() {
        return false;
    }
    let threads = threads_for(got.len());
    let pieces = rotation_pieces(got.len(), elt, l, s, got.len().div_ceil(threads).max(1 << 20));
    let same = |&(d, so, n): &(usize, usize, usize)| got[d..d + n] == exp[so..so + n];
    if threads == 1 {
        return pieces.iter().all(same);
    }
    let per = pieces.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let handles: Vec<_> = pieces.chunks(per).map(|batch| sc.spawn(move || batch.iter().all(same))).collect();
        handles.into_iter().all(|h| h.join().unwrap_or(false))
    })
}

/// One base set: this rank's input and expected output (`None`: not defined on this rank).
struct BaseSet {
    input: Tensor,
    expected: Option<Tensor>,
}

/// A pending iteration: the collective's work, and a send's for sendrecv.
struct Pending<B: Backend> {
    main: Work<B::Buffer>,
    send: Option<Work<()>>,
}

/// The base sets of a step (shared by its placements: the inputs and expected outputs do not
/// depend on the placement).
struct Sets {
    sets: Vec<BaseSet>,
}

fn base_sets<B: Backend>(cx: &Ctx<'_, B>, step: Step) -> Result<Sets, CollectiveError> {
    let (op, l, ws, rank) = (step.op, step.count, cx.ws, cx.rank);
    let (in_n, _) = op.numels(l, ws);
    let total = cx.warmup + cx.iters;
    let nsets = (GEN_BUDGET_ELEMS / (ws * in_n).max(1)).clamp(1, total.max(1));
    let fixture_op = if op.is_reduction() { Some(cx.redop) } else { None };
    let collective = op.collective(cx.redop, ws, cx.root);
    let what = format!("{} {} B", op.name(), step.size);
    let threads = threads_for(ws * in_n * cx.dtype.size());
    if nsets == 1 && threads > 1 && l >= threads {
        cx.beat.phase(format!("{what}: inputs and expected outputs, {threads} pieces in parallel"));
        let g = Gen { step, ws, rank, dtype: cx.dtype, redop: cx.redop, root: cx.root, sem: &cx.sem };
        return Ok(Sets { sets: vec![pieced_set(&g, threads)?] });
    }
    let mut sets = Vec::with_capacity(nsets);
    for s in 0..nsets {
        cx.beat.phase(format!("{what}: inputs and expected outputs, set {s}"));
        let seed = concord_fixtures::seed_for(&format!("bench:{}:{}:{}:{}:{s}", op.name(), cx.dtype.name(), cx.redop.name(), step.size));
        let (input, expected) = exact_pair(seed, ws, cx.dtype, in_n, fixture_op, &collective, &cx.sem, rank)
            .map_err(|e| CollectiveError::Backend(format!("the oracle refuses {what}: {e}")))?;
        sets.push(BaseSet { input, expected });
    }
    Ok(Sets { sets })
}

/// Every rank's exact inputs of `n` elements (seed `seed`), widened ([`widen`]), and the oracle's
/// answer: this rank's input and expected output (`None`: not defined on this rank). `Err`: the
/// oracle's refusal, as text.
#[allow(clippy::too_many_arguments)]
fn exact_pair(
    seed: u64,
    ws: usize,
    dtype: DType,
    n: usize,
    fixture_op: Option<ReduceOp>,
    collective: &concord_oracle::Collective,
    sem: &Semantics,
    rank: usize,
) -> Result<(Tensor, Option<Tensor>), String> {
    let mut inputs = concord_fixtures::inputs(seed, ws, dtype, &[n], fixture_op, InputKind::Exact);
    widen(&mut inputs, fixture_op);
    let mut exp = concord_oracle::expected(collective, &inputs, sem).map_err(|e| format!("{e:?}"))?;
    let expected = if exp.defined[rank] { Some(exp.outputs.swap_remove(rank)) } else { None };
    Ok((inputs.into_iter().nth(rank).expect("one input per rank"), expected))
}

/// What generating a rank's base set of a step depends on.
struct Gen<'a> {
    step: Step,
    ws: usize,
    rank: usize,
    dtype: DType,
    redop: ReduceOp,
    root: usize,
    sem: &'a Semantics,
}

/// One base set of a large step, generated in `p` pieces in parallel: every op of the bench
/// works chunk by chunk (chunks of `count` elements, position by position), so each piece is
/// an ordinary fixture with chunks of `count / p` (its own seed) whose oracle output is exact,
/// and the set is the pieces side by side within every chunk of input and output.
fn pieced_set(g: &Gen<'_>, p: usize) -> Result<BaseSet, CollectiveError> {
    let (step, ws, rank) = (g.step, g.ws, g.rank);
    let (op, l) = (step.op, step.count);
    let fixture_op = if op.is_reduction() { Some(g.redop) } else { None };
    let collective = op.collective(g.redop, ws, g.root);
    let (dtype, redop, sem) = (g.dtype, g.redop, g.sem);
    let lens: Vec<usize> = (0..p).map(|i| l / p + usize::from(i < l % p)).collect();
    let pieces: Vec<Result<(Tensor, Option<Tensor>), CollectiveError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &lp)| {
                let collective = &collective;
                sc.spawn(move || {
                    let key = format!("bench:{}:{}:{}:{}:0:piece{i}/{p}", op.name(), dtype.name(), redop.name(), step.size);
                    let (in_p, _) = op.numels(lp, ws);
                    exact_pair(concord_fixtures::seed_for(&key), ws, dtype, in_p, fixture_op, collective, sem, rank)
                        .map_err(|e| CollectiveError::Backend(format!("the oracle refuses {} {} B (piece {i}): {e}", op.name(), step.size)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(CollectiveError::Backend("a fixture thread panicked".into()))))
            .collect()
    });
    let pieces: Vec<(Tensor, Option<Tensor>)> = pieces.into_iter().collect::<Result<_, _>>()?;
    let elt = dtype.size();
    // Chunk c of the whole = piece 0's chunk c, then piece 1's, ... (each piece's chunk is lens[i]).
    let interleave = |parts: Vec<&Tensor>| -> Tensor {
        let total: usize = parts.iter().map(|t| t.bytes().len()).sum();
        let chunks = total / (l * elt);
        let mut out = Tensor::zeros(dtype, &[total / elt]);
        let dst = out.bytes_mut();
        let mut o = 0;
        for c in 0..chunks {
            for (t, &lp) in parts.iter().zip(&lens) {
                let n = lp * elt;
                dst[o..o + n].copy_from_slice(&t.bytes()[c * n..(c + 1) * n]);
                o += n;
            }
        }
        out
    };
    let input = interleave(pieces.iter().map(|(i, _)| i).collect());
    let expected = if pieces.iter().all(|(_, e)| e.is_some()) {
        Some(interleave(pieces.iter().filter_map(|(_, e)| e.as_ref()).collect()))
    } else {
        None
    };
    Ok(BaseSet { input, expected })
}

/// What `--interleave`'s reference windows of one step gave.
#[derive(Default)]
struct Interleaved {
    /// Each reference window's time per op (µs).
    windows: Vec<f64>,
    /// Each of the backend's windows' (µs per op), in the same order.
    own: Vec<f64>,
    /// No more windows: the reference has no such step (`Ok(None)`) or failed.
    stopped: bool,
    failed: Option<String>,
}

/// Runs one step's warm-up and timed windows; `after_window(k)` (the `--interleave`d
/// reference) is called after each timed window of `k` iterations, once its checks are done,
/// with that window's time per op (µs).
fn run_step<B: Backend>(
    cx: &Ctx<'_, B>,
    step: Step,
    placement: Placement,
    sets: &Sets,
    mut after_window: Option<&mut dyn FnMut(usize, f64)>,
) -> Result<RankResult, CollectiveError> {
    let (op, l, ws, rank) = (step.op, step.count, cx.ws, cx.rank);
    let (in_n, out_n) = op.numels(l, ws);
    let elt = cx.dtype.size();
    let sets = &sets.sets;
    let nsets = sets.len();
    let fixture_op = if op.is_reduction() { Some(cx.redop) } else { None };
    let tol = concord_oracle::tolerance_for(cx.dtype, fixture_op, ws, true);
    let what = format!("{} {} {} B", op.name(), placement.name(), step.size);
    let input_of = |i: usize| -> Tensor {
        let set = &sets[i % nsets];
        let mut t = Tensor::zeros(cx.dtype, &[in_n]);
        rotate_into(t.bytes_mut(), set.input.bytes(), elt, l, (i / nsets) * ROT_STRIDE);
        t
    };
    // With device data: the base inputs live on the device, each iteration's is a rotated copy.
    let dev_inputs: Vec<B::Buffer> =
        if cx.data.is_some() { sets.iter().map(|s| cx.b.upload(&s.input)).collect::<Result<_, _>>()? } else { Vec::new() };
    let put = |x: &B::Buffer, i: usize| -> Result<(), CollectiveError> {
        match cx.data {
            Some(d) => (d.copy_rotated)(cx.b, x, &dev_inputs[i % nsets], l, (i / nsets) * ROT_STRIDE),
            None => cx.b.write(x, &input_of(i)),
        }
    };
    let check_buf = |buf: &B::Buffer, i: usize, iteration: &str, want: Want| -> Result<u64, CollectiveError> {
        let set = &sets[i % nsets];
        let args = (tol, l, what.as_str(), op, step.size, placement);
        match cx.data {
            Some(d) => {
                let (shape, dtype) = (cx.b.buffer_shape(buf), cx.b.buffer_dtype(buf));
                let mut bad = None;
                (d.read)(cx.b, buf, &mut |bytes| bad = Some(check(cx, set, nsets, i, (bytes, &shape, dtype), args, iteration, want)))?;
                // A read that said Ok without handing the bytes over checked nothing: every
                // element of this iteration counts as wrong.
                Ok(bad.unwrap_or_else(|| unread(cx, &shape, args, iteration, want)))
            }
            None => {
                let got = cx.b.download(buf)?;
                Ok(check(cx, set, nsets, i, (got.bytes(), got.shape(), got.dtype()), args, iteration, want))
            }
        }
    };
    let per_iter = (in_n + if placement == Placement::InPlace { 0 } else { out_n }) * elt;
    let window = (cx.budget / per_iter.max(1)).clamp(1, cx.iters.max(1)).min(cx.window_max);
    let b = cx.b;
    let ins: Vec<B::Buffer> = (0..window).map(|_| b.alloc(cx.dtype, &[in_n])).collect::<Result<_, _>>()?;
    let recv_outs: Vec<B::Buffer> =
        if op == BenchOp::SendRecv { (0..window).map(|_| b.alloc(cx.dtype, &[out_n])).collect::<Result<_, _>>()? } else { Vec::new() };
    let (peer_to, peer_from) = ((rank + 1) % ws, (rank + ws - 1) % ws);
    // With a device clock, every timed window starts behind one untimed launch of the same op
    // on scratch buffers (never checked): a GPU idle since the last window's checks runs its
    // first kernels slower, which nccl-tests' loop (timed right after its warm-up) never sees.
    // An op the device clock does not cover (send / recv on NCCL) is timed on the host clock
    // behind a pre-window launch too, waited for before the clock starts.
    let clock = cx.clock.filter(|c| c.covers_p2p || op != BenchOp::SendRecv);
    let scratch: Option<(B::Buffer, Option<B::Buffer>)> = match cx.clock {
        Some(_) => Some((b.alloc(cx.dtype, &[in_n])?, if op == BenchOp::SendRecv { Some(b.alloc(cx.dtype, &[out_n])?) } else { None })),
        None => None,
    };
    let issue_on = |x: &B::Buffer, recv_out: Option<&B::Buffer>| -> Result<Pending<B>, CollectiveError> {
        let in_place = placement == Placement::InPlace;
        let main = match op {
            BenchOp::AllReduce if in_place => b.all_reduce_(x, cx.redop)?,
            BenchOp::AllReduce => b.all_reduce(x, cx.redop)?,
            BenchOp::AllGather => b.all_gather_into_tensor(x)?,
            BenchOp::ReduceScatter => b.reduce_scatter_tensor(x, cx.redop)?,
            BenchOp::AllToAll => b.all_to_all_single(x, None, None)?,
            BenchOp::Broadcast if in_place => b.broadcast_(x, cx.root)?,
            BenchOp::Broadcast => b.broadcast(x, cx.root)?,
            BenchOp::Reduce => b.reduce(x, cx.redop, cx.root)?,
            BenchOp::SendRecv => {
                let send = b.send(x, peer_to)?;
                let main = b.recv(recv_out.expect("sendrecv has receive buffers"), peer_from)?;
                return Ok(Pending { main, send: Some(send) });
            }
        };
        Ok(Pending { main, send: None })
    };
    let issue = |j: usize| issue_on(&ins[j], recv_outs.get(j));
    // Iteration `i` ran on slot `j`: its result is checked where the caller sees it (in-place:
    // the input buffer itself; sendrecv: the receive buffer given to `recv`; otherwise the
    // buffer returned), and an out-of-place op's input must still hold the iteration's input
    // (an op that reduces in place and returns its input, or uses it as scratch, is wrong).
    let check_iter = |p: &Pending<B>, j: usize, i: usize, iteration: String| -> Result<u64, CollectiveError> {
        let returned = p.main.wait(cx.timeout)?;
        let result = match (placement, recv_outs.get(j)) {
            (Placement::InPlace, _) => &ins[j],
            (_, Some(r)) => r,
            _ => returned,
        };
        let mut bad = check_buf(result, i, &iteration, Want::Output)?;
        if placement == Placement::OutOfPlace {
            bad += check_buf(&ins[j], i, &iteration, Want::Input)?;
        }
        Ok(bad)
    };
    let wait = |p: &Pending<B>| -> Result<(), CollectiveError> {
        if let Some(s) = &p.send {
            s.wait(cx.timeout)?;
        }
        p.main.wait(cx.timeout).map(|_| ())
    };
    let mut counts = RankResult {
        rank,
        op: op.name().into(),
        size: step.size,
        placement,
        time_us: 0.0,
        window,
        wrong: 0,
        wrong_iterations: 0,
        wrong_warmup: 0,
        wall_us: 0.0,
        ref_us: None,
        windows: 0,
        spread_us: None,
        ref_spread_us: None,
    };
    // Warm-up: in windows like the timed ones, and at least one whole window, so that every
    // buffer a timed window uses (its inputs, and the outputs out-of-place ops allocate) has
    // been touched once: first-touch page faults and arena growth are set-up cost, not part
    // of the op (nccl-tests' buffers, too, are allocated and used before it times).
    let warm = if cx.warmup == 0 { 0 } else { cx.warmup.max(window) };
    let mut i0 = 0;
    while i0 < warm {
        let k = window.min(warm - i0);
        cx.beat.phase(format!("{what}: warm-up iterations {i0}..{}", i0 + k));
        for (j, x) in ins.iter().take(k).enumerate() {
            put(x, i0 + j)?;
        }
        let pending: Vec<Pending<B>> = (0..k).map(&issue).collect::<Result<_, _>>()?;
        for p in &pending {
            wait(p)?;
        }
        for (j, p) in pending.iter().enumerate() {
            let i = i0 + j;
            counts.wrong_warmup += check_iter(p, j, i, format!("warm-up iteration {i}"))?;
        }
        i0 += k;
    }
    // Timed windows. A device clock that does not order send / recv leaves sendrecv to the
    // host clock (see `Clock::covers_p2p`; `clock` above).
    // Each window's time per op: the step's time is their median (one slow window, a host
    // hiccup, moves a mean over a few windows by as much as the code changes being measured).
    let mut per_window: Vec<f64> = Vec::new();
    // `CONCORD_BENCH_PROBE=1` (a diagnosis aid, off by default; the profile's clock reads cost
    // the backend time): per timed window, the host's times and the backend's own profile, one
    // `# probe` line per step and rank on stderr.
    let probe = clock.and_then(|c| c.profile).filter(|_| concord_harness::config::Config::global().bench_probe);
    // Per window, µs per op: the issues (start mark returned -> last issue returned) and the
    // launches (start mark returned -> end mark returned, which waits for the last launch).
    let mut host: Vec<[f64; 2]> = Vec::new();
    let mut profiles: Vec<Vec<(&'static str, f64)>> = Vec::new();
    let mut wall = Duration::ZERO;
    let mut done = 0;
    while done < cx.iters {
        let k = window.min(cx.iters - done);
        cx.beat.phase(format!("{what}: writing inputs of timed iterations {done}..{}", done + k));
        for (j, x) in ins.iter().take(k).enumerate() {
            put(x, warm + done + j)?;
        }
        b.barrier()?.wait(cx.timeout)?;
        cx.beat.phase(format!("{what}: timed iterations {done}..{}", done + k));
        // The timed region: k back-to-back issues between two marks (device clock), or up to the
        // end of the last wait (wall-clock). No host synchronisation or check inside.
        let pre = scratch.as_ref().map(|(x, r)| issue_on(x, r.as_ref())).transpose()?;
        let pre = match (pre, clock) {
            (Some(p), None) => {
                wait(&p)?;
                None
            }
            (p, _) => p,
        };
        let t = Instant::now();
        let start = clock.map(|c| (c.mark)(b)).transpose()?;
        let t_start = Instant::now();
        if let Some(p) = probe {
            let _ = p(b, true);
        }
        let pending: Vec<Pending<B>> = (0..k).map(&issue).collect::<Result<_, _>>()?;
        let t_issued = Instant::now();
        let end = clock.map(|c| (c.mark)(b)).transpose()?;
        if let Some(p) = probe {
            let per = |d: Duration| d.as_secs_f64() * 1e6 / k.max(1) as f64;
            host.push([per(t_issued - t_start), per(t_start.elapsed())]);
            profiles.push(p(b, false));
        }
        for p in pre.iter().chain(&pending) {
            wait(p)?;
        }
        let w = t.elapsed();
        wall += w;
        let elapsed = match (clock, &start, &end) {
            (Some(c), Some(s), Some(e)) => (c.elapsed)(b, s, e, cx.timeout)?,
            _ => w,
        };
        per_window.push(elapsed.as_secs_f64() * 1e6 / k.max(1) as f64);
        cx.beat.phase(format!("{what}: checking timed iterations {done}..{}", done + k));
        for (j, p) in pending.iter().enumerate() {
            let i = warm + done + j;
            let bad = check_iter(p, j, i, format!("timed iteration {}", done + j))?;
            counts.wrong += bad;
            counts.wrong_iterations += u64::from(bad > 0);
            cx.beat.tick();
        }
        if let Some(f) = after_window.as_mut() {
            f(k, per_window.last().copied().unwrap_or(f64::NAN));
        }
        done += k;
    }
    if probe.is_some() && !host.is_empty() {
        let col = |f: &dyn Fn(usize) -> f64| median(&(0..host.len()).map(f).collect::<Vec<_>>());
        let prof = profiles
            .first()
            .map(|first| {
                first
                    .iter()
                    .enumerate()
                    .map(|(i, (name, _))| format!("{name} {:.2}", col(&|w| profiles[w].get(i).map_or(f64::NAN, |x| x.1))))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let line = format!(
            "# probe rank {rank} {what}: gpu {:.2} launched {:.2} issue {:.2} (us per op, medians over {} windows of {window}) | backend per job (us; batched_share: a share of jobs): {prof}\n",
            median(&per_window),
            col(&|w| host[w][1]),
            col(&|w| host[w][0]),
            host.len()
        );
        // One write: the ranks share the parent's stderr, and lines written in pieces interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
    counts.time_us = median(&per_window);
    counts.windows = per_window.len();
    counts.spread_us = (!per_window.is_empty())
        .then(|| (per_window.iter().copied().fold(f64::INFINITY, f64::min), per_window.iter().copied().fold(0.0, f64::max)));
    counts.wall_us = wall.as_secs_f64() * 1e6 / cx.iters.max(1) as f64;
    Ok(counts)
}

/// What a check needs to name a wrong result: tolerance, chunk length, step name, op, size,
/// placement.
type CheckArgs<'s> = (Tolerance, usize, &'s str, BenchOp, usize, Placement);

/// What a checked buffer must hold: the iteration's expected output, or (an out-of-place op's
/// input buffer after the op) its input.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Output,
    Input,
}

impl Want {
    /// Before the oracle's message in a WRONG line.
    fn note(self) -> &'static str {
        match self {
            Want::Output => "",
            Want::Input => "the input of an out-of-place op changed: ",
        }
    }
}

/// Sends a WRONG message (at most a few per step).
fn report<B: Backend>(cx: &Ctx<'_, B>, w: Wrong) {
    if cx.reported.get() < 3 {
        cx.reported.set(cx.reported.get() + 1);
        emit(&Msg::Wrong(w));
    }
}

/// A device-data read returned Ok without calling back: nothing was checked; every element
/// counts as wrong.
fn unread<B: Backend>(
    cx: &Ctx<'_, B>,
    shape: &[usize],
    (_, _, what, op, size, placement): CheckArgs<'_>,
    iteration: &str,
    want: Want,
) -> u64 {
    let n: usize = shape.iter().product();
    report(
        cx,
        Wrong {
            rank: cx.rank,
            op: op.name().into(),
            size,
            placement,
            iteration: iteration.to_string(),
            index: 0,
            got: "nothing".into(),
            expected: "the buffer's bytes".into(),
            detail: format!("{what}: {}the device-data read returned Ok without the bytes: {n} elements unchecked", want.note()),
        },
    );
    n.max(1) as u64
}

/// Checks one buffer (`got`: bytes, shape, dtype) against the iteration's expected output or
/// input; returns its wrong elements (reporting the first of a few per step).
#[allow(clippy::too_many_arguments)]
fn check<B: Backend>(
    cx: &Ctx<'_, B>,
    set: &BaseSet,
    nsets: usize,
    i: usize,
    got: (&[u8], &[usize], DType),
    (tol, l, what, op, size, placement): CheckArgs<'_>,
    iteration: &str,
    want: Want,
) -> u64 {
    let (exp, tol) = match want {
        Want::Output => match &set.expected {
            Some(e) => (e, tol),
            None => return 0,
        },
        Want::Input => (&set.input, Tolerance::Exact),
    };
    let (bytes, shape, dtype) = got;
    let shift = (i / nsets) * ROT_STRIDE;
    if shape == exp.shape() && dtype == exp.dtype() && rotated_eq(bytes, exp.bytes(), cx.dtype.size(), l, shift) {
        return 0;
    }
    let got = Tensor::from_bytes(dtype, shape, bytes);
    let rotated = rotate_chunks(exp.bytes(), cx.dtype.size(), l, shift);
    let rotated = Tensor::from_bytes(exp.dtype(), exp.shape(), &rotated);
    match concord_oracle::compare(&got, &rotated, tol) {
        Ok(()) => 0,
        Err(m) => {
            report(
                cx,
                Wrong {
                    rank: cx.rank,
                    op: op.name().into(),
                    size,
                    placement,
                    iteration: iteration.to_string(),
                    index: m.index,
                    got: m.got.clone(),
                    expected: m.expected.clone(),
                    detail: format!("{what}: {}{}", want.note(), m.detail),
                },
            );
            m.bad_count.max(1) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pieced_set, rotate_chunks, rotate_into, rotated_eq, widen, Gen};
    use crate::spec::{BenchOp, Step};
    use concord_core::{DType, ReduceOp};
    use concord_oracle::Semantics;

    #[test]
    fn a_set_generated_in_pieces_is_what_the_oracle_says_of_its_inputs() {
        let sem = Semantics::default();
        for ws in [1, 2, 3] {
            // sendrecv needs 2 ranks (the bench leaves it out at 1).
            for op in BenchOp::ALL.into_iter().filter(|o| ws > 1 || *o != BenchOp::SendRecv) {
                for (dtype, redop) in [(DType::F32, ReduceOp::Sum), (DType::I32, ReduceOp::Max), (DType::F64, ReduceOp::Product)] {
                    let step = Step { op, size: 0, count: 11 };
                    let sets: Vec<_> = (0..ws)
                        .map(|rank| pieced_set(&Gen { step, ws, rank, dtype, redop, root: ws - 1, sem: &sem }, 3).unwrap())
                        .collect();
                    let inputs: Vec<_> = sets.iter().map(|s| s.input.clone()).collect();
                    let want = concord_oracle::expected(&op.collective(redop, ws, ws - 1), &inputs, &sem).unwrap();
                    for (rank, s) in sets.iter().enumerate() {
                        assert_eq!(s.input.numel(), op.numels(11, ws).0, "{op:?} ws {ws}: input size");
                        assert_eq!(s.expected.is_some(), want.defined[rank], "{op:?} ws {ws} rank {rank}: defined");
                        if let Some(e) = &s.expected {
                            assert_eq!(e.bytes(), want.outputs[rank].bytes(), "{op:?} {dtype} {redop:?} ws {ws} rank {rank}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn widened_inputs_stay_exact_and_need_the_whole_significand() {
        use concord_core::Tensor;
        for (dtype, narrow) in [(DType::F32, DType::F16), (DType::F64, DType::F32)] {
            for ws in [2, 3, 8] {
                for op in [Some(ReduceOp::Sum), Some(ReduceOp::PremulSum(2.0)), Some(ReduceOp::Max), None] {
                    let mut inputs = concord_fixtures::inputs(7, ws, dtype, &[513], op, concord_fixtures::InputKind::Exact);
                    widen(&mut inputs, op);
                    let v = |r: usize, e: usize| inputs[r].get_f64(e);
                    let mut unseen = 0;
                    for e in 0..513 {
                        for r in 0..ws {
                            let x = v(r, e);
                            assert!(x.fract() == 0.0 && x.abs() <= 2f64.powi(if dtype == DType::F32 { 24 } else { 53 }));
                            // Would a narrower float (a lossy wire) hold it exactly?
                            unseen += usize::from(Tensor::from_f64(narrow, &[1], &[x]).get_f64(0) == x);
                        }
                        if let Some(ReduceOp::Sum | ReduceOp::PremulSum(_)) = op {
                            // Every partial sum in either order is exact in the dtype.
                            let f = if let Some(ReduceOp::PremulSum(f)) = op { f } else { 1.0 };
                            let exact: f64 = (0..ws).map(|r| f * v(r, e)).sum();
                            let round = |x: f64| Tensor::from_f64(dtype, &[1], &[x]).get_f64(0);
                            let (mut fwd, mut bwd) = (0f64, 0f64);
                            for r in 0..ws {
                                fwd = round(fwd + round(f * v(r, e)));
                                bwd = round(bwd + round(f * v(ws - 1 - r, e)));
                            }
                            assert_eq!((fwd, bwd), (exact, exact), "{dtype} ws {ws} element {e}");
                        }
                    }
                    assert!(unseen * 20 < 513 * ws, "{dtype} {op:?} ws {ws}: {unseen} values a {narrow} wire keeps");
                }
            }
        }
    }

    /// Element by element: chunk `c`'s element `j` goes to `(j + s) % l`.
    fn naive(src: &[u8], elt: usize, l: usize, s: usize) -> Vec<u8> {
        let mut dst = vec![0u8; src.len()];
        for c in 0..src.len() / (l * elt) {
            for j in 0..l {
                let d = (c * l + (j + s) % l) * elt;
                dst[d..d + elt].copy_from_slice(&src[(c * l + j) * elt..(c * l + j + 1) * elt]);
            }
        }
        dst
    }

    #[test]
    fn parallel_rotation_and_in_place_comparison_match_the_naive_rotation() {
        // 24 MiB: large enough for the threaded paths; 3 chunks of 2 Mi 4-byte elements.
        let (elt, l) = (4, 2 << 20);
        let src: Vec<u8> = (0..3 * l * elt).map(|i| (i * 7 + i / 4093) as u8).collect();
        for s in [0, 1, 7919, l - 1, 5 * 7919] {
            let want = naive(&src, elt, l, s % l);
            let mut got = vec![0u8; src.len()];
            rotate_into(&mut got, &src, elt, l, s);
            assert!(got == want, "rotate_into, shift {s}");
            assert!(rotated_eq(&want, &src, elt, l, s), "rotated_eq, shift {s}");
            for bad in [0, 1, l * elt - 1, l * elt, src.len() / 2, src.len() - 1] {
                let mut w = want.clone();
                w[bad] ^= 0x40;
                assert!(!rotated_eq(&w, &src, elt, l, s), "a flipped byte at {bad} (shift {s}) went unseen");
            }
        }
    }

    #[test]
    fn rotation_is_per_chunk() {
        let src: Vec<u8> = (0..6).collect();
        assert_eq!(rotate_chunks(&src, 1, 3, 1), vec![2, 0, 1, 5, 3, 4]);
        assert_eq!(rotate_chunks(&src, 2, 3, 0), src);
        assert_eq!(rotate_chunks(&src, 2, 3, 4), vec![4, 5, 0, 1, 2, 3]);
    }
}
