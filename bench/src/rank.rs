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
//!   then a barrier, then the clock runs over `k` back-to-back issues and the waits of all `k`;
//!   the `k` outputs are kept and checked against the expected ones after the clock stops. Every
//!   timed iteration is checked; so is every warm-up iteration.
//! * Warm-up runs in the same windows, and at least one whole window (`-w` is raised to the
//!   window), so the buffers of the timed windows have been touched before the clock runs.
//! * Waits use the world's op timeout; a watchdog thread ends the rank with the collective it is
//!   in ([`concord_core::progress::describe`]) if nothing moves for twice that plus 30 s.

use crate::spec::{BenchOp, Placement, Step};
use crate::Hooks;
use concord_core::{progress, Backend, CollectiveError, DType, ReduceOp, Tensor, Work, WorldInfo};
use concord_fixtures::InputKind;
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
    Hello { rank: usize, backend: String, version: String, timing: String },
    Start { rank: usize, op: String, size: usize, placement: Placement },
    Result(RankResult),
    Wrong(Wrong),
    Fatal { rank: usize, message: String },
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

fn emit(m: &Msg) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, m);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// What a rank is doing, for the watchdog.
#[derive(Clone)]
struct Beat {
    last_ms: Arc<AtomicU64>,
    phase: Arc<Mutex<String>>,
    start: Instant,
}

impl Beat {
    fn tick(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn phase(&self, s: String) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = s;
        self.tick();
    }
}

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
    timeout: Duration,
    sem: Semantics,
    beat: Beat,
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
        Ok((dtype, redop, ops, sizes))
    })();
    let (dtype, redop, ops, sizes) = match parsed {
        Ok(p) => p,
        Err(e) => return fatal(e),
    };
    let b = match B::init(world) {
        Ok(b) => b,
        Err(e) => return fatal(format!("rank {rank}: backend init failed: {e} [{}]", e.name())),
    };
    (hooks.prepare)(&b);
    emit(&Msg::Hello { rank, backend: b.name().to_string(), version: (hooks.version)(&b), timing: hooks.timing.to_string() });
    let beat = Beat { last_ms: Arc::new(AtomicU64::new(0)), phase: Arc::new(Mutex::new("starting".into())), start: Instant::now() };
    let limit = world.op_timeout * 2 + Duration::from_secs(30);
    {
        let beat = beat.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let idle = beat.start.elapsed().saturating_sub(Duration::from_millis(beat.last_ms.load(Ordering::Relaxed)));
            if idle > limit {
                let phase = beat.phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
                emit(&Msg::Fatal {
                    rank,
                    message: format!(
                        "HANG: rank {rank} made no progress for {} s during {phase}; this process is {}",
                        idle.as_secs(),
                        progress::describe()
                    ),
                });
                std::process::exit(1);
            }
        });
    }
    let cx = Ctx {
        b: &b,
        rank,
        ws: world.world_size,
        dtype,
        redop,
        root: a.root,
        iters: a.iters,
        warmup: a.warmup,
        budget: a.check_budget,
        timeout: world.op_timeout,
        sem: Semantics::of(&b.capabilities()),
        beat,
        reported: std::cell::Cell::new(0),
    };
    let (steps, _) = crate::spec::plan(&ops, &sizes, dtype.size(), world.world_size);
    let mut any_wrong = false;
    for step in steps {
        for placement in [Placement::OutOfPlace, Placement::InPlace] {
            if placement == Placement::InPlace && !step.op.has_in_place() {
                continue;
            }
            emit(&Msg::Start { rank, op: step.op.name().into(), size: step.size, placement });
            cx.reported.set(0);
            match run_step(&cx, step, placement) {
                Ok(r) => {
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
    // Leave together: a rank that exits while a peer still reads its buffers would look dead.
    if let Err(e) = b.barrier().and_then(|w| w.wait(cx.timeout).map(|_| ())) {
        return fatal(format!("rank {rank}: final barrier failed: {e}"));
    }
    i32::from(any_wrong)
}

/// Rotates every chunk of `l` elements of `elt` bytes right by `s` elements.
pub fn rotate_chunks(src: &[u8], elt: usize, l: usize, s: usize) -> Vec<u8> {
    let s = if l == 0 { 0 } else { s % l };
    if s == 0 {
        return src.to_vec();
    }
    let mut dst = vec![0u8; src.len()];
    let (cb, sb) = (l * elt, s * elt);
    for (d, c) in dst.chunks_exact_mut(cb).zip(src.chunks_exact(cb)) {
        d[sb..].copy_from_slice(&c[..cb - sb]);
        d[..sb].copy_from_slice(&c[cb - sb..]);
    }
    dst
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

fn run_step<B: Backend>(cx: &Ctx<'_, B>, step: Step, placement: Placement) -> Result<RankResult, CollectiveError> {
    let (op, l, ws, rank) = (step.op, step.count, cx.ws, cx.rank);
    let (in_n, out_n) = op.numels(l, ws);
    let elt = cx.dtype.size();
    let total = cx.warmup + cx.iters;
    let nsets = (GEN_BUDGET_ELEMS / (ws * in_n).max(1)).clamp(1, total.max(1));
    let fixture_op = if op.is_reduction() { Some(cx.redop) } else { None };
    let collective = op.collective(cx.redop, ws, cx.root);
    let tol = concord_oracle::tolerance_for(cx.dtype, fixture_op, ws, true);
    let what = format!("{} {} {} B", op.name(), placement.name(), step.size);
    let mut sets = Vec::with_capacity(nsets);
    for s in 0..nsets {
        cx.beat.phase(format!("{what}: inputs and expected outputs, set {s}"));
        let seed = concord_fixtures::seed_for(&format!("bench:{}:{}:{}:{}:{s}", op.name(), cx.dtype.name(), cx.redop.name(), step.size));
        let inputs = concord_fixtures::inputs(seed, ws, cx.dtype, &[in_n], fixture_op, InputKind::Exact);
        let mut exp = concord_oracle::expected(&collective, &inputs, &cx.sem)
            .map_err(|e| CollectiveError::Backend(format!("the oracle refuses {what}: {e:?}")))?;
        let expected = if exp.defined[rank] { Some(exp.outputs.swap_remove(rank)) } else { None };
        let input = inputs.into_iter().nth(rank).expect("one input per rank");
        sets.push(BaseSet { input, expected });
    }
    let input_of = |i: usize| -> Tensor {
        let set = &sets[i % nsets];
        Tensor::from_bytes(cx.dtype, &[in_n], &rotate_chunks(set.input.bytes(), elt, l, (i / nsets) * ROT_STRIDE))
    };
    let per_iter = (in_n + if placement == Placement::InPlace { 0 } else { out_n }) * elt;
    let window = (cx.budget / per_iter.max(1)).clamp(1, cx.iters.max(1));
    let b = cx.b;
    let ins: Vec<B::Buffer> = (0..window).map(|_| b.alloc(cx.dtype, &[in_n])).collect::<Result<_, _>>()?;
    let recv_outs: Vec<B::Buffer> =
        if op == BenchOp::SendRecv { (0..window).map(|_| b.alloc(cx.dtype, &[out_n])).collect::<Result<_, _>>()? } else { Vec::new() };
    let (peer_to, peer_from) = ((rank + 1) % ws, (rank + ws - 1) % ws);
    let issue = |j: usize| -> Result<Pending<B>, CollectiveError> {
        let x = &ins[j];
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
                let main = b.recv(&recv_outs[j], peer_from)?;
                return Ok(Pending { main, send: Some(send) });
            }
        };
        Ok(Pending { main, send: None })
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
            b.write(x, &input_of(i0 + j))?;
        }
        let pending: Vec<Pending<B>> = (0..k).map(&issue).collect::<Result<_, _>>()?;
        for p in &pending {
            wait(p)?;
        }
        for (j, p) in pending.iter().enumerate() {
            let i = i0 + j;
            let got = b.download(p.main.wait(cx.timeout)?)?;
            let bad =
                check(cx, &sets[i % nsets], nsets, i, &got, tol, l, &what, op, step.size, placement, format!("warm-up iteration {i}"));
            counts.wrong_warmup += bad;
        }
        i0 += k;
    }
    // Timed windows.
    let mut elapsed = Duration::ZERO;
    let mut done = 0;
    while done < cx.iters {
        let k = window.min(cx.iters - done);
        cx.beat.phase(format!("{what}: writing inputs of timed iterations {done}..{}", done + k));
        for (j, x) in ins.iter().take(k).enumerate() {
            b.write(x, &input_of(warm + done + j))?;
        }
        b.barrier()?.wait(cx.timeout)?;
        cx.beat.phase(format!("{what}: timed iterations {done}..{}", done + k));
        let t = Instant::now();
        let pending: Vec<Pending<B>> = (0..k).map(&issue).collect::<Result<_, _>>()?;
        for p in &pending {
            wait(p)?;
        }
        elapsed += t.elapsed();
        cx.beat.phase(format!("{what}: checking timed iterations {done}..{}", done + k));
        for (j, p) in pending.iter().enumerate() {
            let i = warm + done + j;
            let got = b.download(p.main.wait(cx.timeout)?)?;
            let bad = check(
                cx,
                &sets[i % nsets],
                nsets,
                i,
                &got,
                tol,
                l,
                &what,
                op,
                step.size,
                placement,
                format!("timed iteration {}", done + j),
            );
            counts.wrong += bad;
            counts.wrong_iterations += u64::from(bad > 0);
            cx.beat.tick();
        }
        done += k;
    }
    counts.time_us = elapsed.as_secs_f64() * 1e6 / cx.iters.max(1) as f64;
    Ok(counts)
}

/// Checks one output; returns its wrong elements (reporting the first of a few per step).
#[allow(clippy::too_many_arguments)]
fn check<B: Backend>(
    cx: &Ctx<'_, B>,
    set: &BaseSet,
    nsets: usize,
    i: usize,
    got: &Tensor,
    tol: Tolerance,
    l: usize,
    what: &str,
    op: BenchOp,
    size: usize,
    placement: Placement,
    iteration: String,
) -> u64 {
    let Some(exp) = &set.expected else { return 0 };
    let want = rotate_chunks(exp.bytes(), cx.dtype.size(), l, (i / nsets) * ROT_STRIDE);
    if got.bytes() == want.as_slice() && got.shape() == exp.shape() && got.dtype() == exp.dtype() {
        return 0;
    }
    let want = Tensor::from_bytes(exp.dtype(), exp.shape(), &want);
    match concord_oracle::compare(got, &want, tol) {
        Ok(()) => 0,
        Err(m) => {
            if cx.reported.get() < 3 {
                cx.reported.set(cx.reported.get() + 1);
                emit(&Msg::Wrong(Wrong {
                    rank: cx.rank,
                    op: op.name().into(),
                    size,
                    placement,
                    iteration,
                    index: m.index,
                    got: m.got.clone(),
                    expected: m.expected.clone(),
                    detail: format!("{what}: {}", m.detail),
                }));
            }
            m.bad_count.max(1) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rotate_chunks;

    #[test]
    fn rotation_is_per_chunk() {
        let src: Vec<u8> = (0..6).collect();
        assert_eq!(rotate_chunks(&src, 1, 3, 1), vec![2, 0, 1, 5, 3, 4]);
        assert_eq!(rotate_chunks(&src, 2, 3, 0), src);
        assert_eq!(rotate_chunks(&src, 2, 3, 4), vec![4, 5, 0, 1, 2, 3]);
    }
}
