//! The bad-input grid: does the catalogue check every bad-input kind of every hook, wherever the
//! bad argument sits, at every world size class, and the communicator afterwards? The suites'
//! bad-input cases were grown one by one (mostly at 2 and 3 ranks, the bad argument on every rank
//! or on the last); this grid asks the question cell by cell, as the dtype grid does for dtypes.
//!
//! One parameterised bug, [`Judged`] with the grid's [`TargetJudge`], wraps every hook of the correct shm backend. The rule
//! table (`concord_core::call`) still decides every call; the bug changes what ONE hook reports
//! when the verdict is ONE [`concord_core::BadInputKind`] whose offender sits at ONE position:
//! * `missed`: every rank of the communicator completes the call as if it were valid — the
//!   backend does not detect the kind when that rank carries it (an `_out` hook returns its
//!   output buffer as it lies, silently truncated / padded; the others return their input
//!   buffer(s) as the result; for `send` only the sender's hook misreports);
//! * `poisoned`: the right named error on every rank, but the next call of the same hook on that
//!   communicator fails with it again (the refused call's error left in the op's state).
//!
//! The *offender* is the rank the rule table's verdict names ([`offender`]): for a rank's own
//! broken rule (rules 1–13), the first rank that breaks it (rank 0 when every rank does); for a
//! cross-rank rule (14–21), the first rank that differs from rank 0; for a send / recv refused at
//! issue, the caller. Positions: `first` / `middle` / `last` of the communicator, and for the
//! rooted ops `root` / `nonroot` (the offender is / is not the root its rank named); `any` for
//! `poisoned` (the error is left behind wherever it came from). A cell is (target × world size);
//! the grid's world sizes are 1, 2, 3 (odd) and 16 by default. Targets are written
//! `HOOK:POSITION:MODE!KIND` (`broadcast:root:missed!bad_root`), the value of the backend option
//! `bad_sweep`; `cargo xtask mutants --bad-input KIND|all` prints the grid.
//!
//! A cell is caught as a sweep cell is ([`crate::sweep::catch_in`]): a case of that world size
//! that may issue bad input to the hook fails alone in a fresh world and passes its control (the
//! same target with [`crate::sweep::DRY_OPTION`]: every call wrapped the same way, nothing
//! misreported).

use crate::campaign::Spec;
use crate::sweep::{listed_without, run_cells};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, BadInputKind as K, CollectiveError, Completion, OutstandingCounter, ReduceOp, Result, Work};
use concord_suites::run::{BackendEntry, CaseInfo};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The backend option (and entry name) of the grid's mutant.
pub const NAME: &str = "bad_sweep";

/// The hooks of the grid (the trait's calls that take arguments the rule table judges; the fused
/// ops and new_group are left out: their bad input is judged before any hook of the wrapper).
pub use concord_suites::suites::bad_input_grid::HOOKS;

/// Positions of the offender.
pub const POSITIONS: &[&str] = &["first", "middle", "last", "root", "nonroot", "any"];

/// What the hook does with a matching verdict.
pub const MODES: &[&str] = &["missed", "poisoned"];

/// The world sizes of the grid by default: one rank, two, an odd number, sixteen.
pub const WORLD_SIZES: &[usize] = &[1, 2, 3, 16];

/// Whether `hook` takes a root / src.
pub fn rooted(hook: &str) -> bool {
    matches!(hook, "broadcast" | "broadcast_" | "reduce" | "gather" | "scatter")
}

/// The kinds the rule table can give `hook` on the shm backend (it moves every dtype and
/// declares no gap, so `unsupported_dtype` is a reduce op not defined for the dtype, and there is
/// no `unsupported_op`).
pub fn kinds(hook: &str) -> Vec<K> {
    let mut v = Vec::new();
    if hook == "barrier" {
        return vec![K::OpMismatch];
    }
    if matches!(hook, "send" | "recv") {
        // Not op_mismatch: a send facing a send is two messages waiting for receivers (each
        // may be matched by a later recv), a timeout at the op deadline, not bad input.
        return vec![K::BadPeer, K::DTypeMismatch, K::OutBufferSize];
    }
    v.extend([K::OpMismatch, K::DTypeMismatch, K::ShapeMismatch]);
    let reduces = hook.starts_with("all_reduce") || hook.starts_with("reduce_scatter") || hook == "reduce";
    if reduces {
        v.extend([K::ReduceOpMismatch, K::UnsupportedDType]);
    }
    if hook.ends_with("_coalesced") || hook.ends_with("_coalesced_") {
        v.push(K::CountMismatch);
    }
    if hook.starts_with("reduce_scatter") || hook == "scatter" || hook == "all_to_all_single" {
        v.extend([K::ZeroDim, K::Indivisible]);
    }
    if hook.ends_with("_out") {
        v.extend([K::OutBufferSize, K::Aliasing]);
    }
    if hook == "all_to_all_single" {
        v.extend([K::BadSplits, K::SplitMismatch]);
    }
    if rooted(hook) {
        v.push(K::BadRoot);
    }
    if hook == "permute_tensor" {
        v.push(K::BadPermutation);
    }
    v
}

/// Kinds only a disagreement between ranks gives (never one rank's own call): their verdict names
/// the first rank that differs from rank 0, never rank 0.
pub fn only_across_ranks(k: K) -> bool {
    matches!(k, K::OpMismatch | K::CountMismatch | K::ReduceOpMismatch | K::ShapeMismatch)
}

/// One grid target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub hook: &'static str,
    pub pos: &'static str,
    pub mode: &'static str,
    pub kind: K,
}

impl Target {
    pub fn parse(s: &str) -> Option<Target> {
        let (s, k) = s.split_once('!')?;
        let kind = K::ALL.iter().copied().find(|x| x.name() == k)?;
        let mut it = s.split(':');
        let (h, p, m) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let t = Target {
            hook: HOOKS.iter().copied().find(|x| *x == h)?,
            pos: POSITIONS.iter().copied().find(|x| *x == p)?,
            mode: MODES.iter().copied().find(|x| *x == m)?,
            kind,
        };
        let placed = rooted(t.hook) || !matches!(t.pos, "root" | "nonroot");
        let moded = (t.pos == "any") == (t.mode == "poisoned");
        (kinds(t.hook).contains(&kind) && placed && moded).then_some(t)
    }
    pub fn label(&self) -> String {
        format!("{}:{}:{}!{}", self.hook, self.pos, self.mode, self.kind.name())
    }
}

/// Every target for `kinds_wanted` (every kind a hook can get, if empty): `missed` at each
/// position, `poisoned` at `any`.
pub fn targets(kinds_wanted: &[K]) -> Vec<Target> {
    let mut v = Vec::new();
    for h in HOOKS {
        for k in kinds(h) {
            if !kinds_wanted.is_empty() && !kinds_wanted.contains(&k) {
                continue;
            }
            for p in POSITIONS {
                let mode = if *p == "any" { "poisoned" } else { "missed" };
                if matches!(*p, "root" | "nonroot") && !rooted(h) {
                    continue;
                }
                v.push(Target { hook: h, pos: p, mode, kind: k });
            }
        }
    }
    v
}

/// Whether no call can put `t` at world size `ws`.
pub fn impossible(t: &Target, ws: usize) -> bool {
    let pos_absent = match t.pos {
        "last" | "nonroot" => ws < 2,
        "middle" => ws < 3,
        _ => false,
    };
    let k = t.kind;
    let one_rank = ws == 1
        && (only_across_ranks(k)
            || k == K::Indivisible
            || matches!(t.hook, "send" | "recv") && k != K::BadPeer
            || k == K::DTypeMismatch && !t.hook.ends_with("_out"));
    // Input dtypes are compared across ranks (a verdict never names rank 0); only an `_out`
    // buffer's dtype, or a send's, is one rank's own.
    let dtype_across = k == K::DTypeMismatch && !t.hook.ends_with("_out") && !matches!(t.hook, "send" | "recv");
    // One rank is its own root: a root it could name and be is in range. And one rank has no
    // peer for a valid send / recv after a refused one.
    let own_root = ws == 1 && t.pos == "root" && k == K::BadRoot;
    let no_peer = ws == 1 && t.mode == "poisoned" && matches!(t.hook, "send" | "recv");
    pos_absent || one_rank || own_root || no_peer || (t.pos == "first" && (only_across_ranks(k) || dtype_across))
}

/// The rank the verdict's detail names as the offender: the rank after "but rank " (a cross-rank
/// rule: the first rank that differs from rank 0), else the first "rank N" it names, else `me`
/// (a rank's own call refused at issue names no rank prefix only when it is the caller's). A
/// send refused by its receiver names the receiver.
pub fn offender(detail: &str, me: usize) -> usize {
    fn number_after(s: &str, pat: &str) -> Option<usize> {
        let mut rest = s;
        while let Some(i) = rest.find(pat) {
            rest = &rest[i + pat.len()..];
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(n) = digits.parse() {
                return Some(n);
            }
        }
        None
    }
    number_after(detail, "but rank ").or_else(|| number_after(detail, "rank ")).unwrap_or(me)
}

static TARGET: OnceLock<(Target, bool)> = OnceLock::new();

/// Called by [`crate::Mutant`]'s init with the `bad_sweep` option and whether [`crate::sweep::DRY_OPTION`] is set.
pub fn set_target(option: Option<&str>, dry: bool) -> std::result::Result<(), String> {
    let s = option.ok_or("the bad-input grid's mutant needs the option `bad_sweep=HOOK:POSITION:MODE!KIND`")?;
    let t = Target::parse(s)
        .ok_or_else(|| format!("bad target `{s}` (HOOK:POSITION:MODE!KIND; hooks {HOOKS:?}, positions {POSITIONS:?}, modes {MODES:?})"))?;
    let _ = TARGET.set((t, dry));
    Ok(())
}

/// The grid's maker (the catalogue's `MakeBug` for [`NAME`]): one state per communicator.
pub fn make() -> Box<dyn Bug> {
    let (t, dry) = TARGET.get().cloned().map_or((None, false), |(t, d)| (Some(t), d));
    Box::new(Judged::new(TargetJudge { t, dry }))
}

/// What the rule table decided for one call, as a [`Judge`] sees it on one rank.
pub struct Verdict<'a> {
    pub hook: &'a str,
    pub kind: K,
    pub detail: &'a str,
    /// The communicator's size, this rank in it, the root this rank named.
    pub ws: usize,
    pub me: usize,
    pub root: Option<usize>,
    /// Whether the communicator is a subgroup smaller than the world.
    pub subgroup: bool,
}

impl Verdict<'_> {
    /// [`offender`] of the detail.
    pub fn offender(&self) -> usize {
        offender(self.detail, self.me)
    }
}

/// What a refused call becomes on this rank.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Effect {
    /// The error, as the rule table decided it.
    Report,
    /// The call completes as if valid (its output as it lies).
    Complete,
    /// The error, and the next call of the same hook on the communicator fails with it again.
    LeaveBehind,
}

/// A bad-input bug: what a refused call of a hook becomes ([`Judged`] applies it).
pub trait Judge: Send + Sync + 'static {
    fn effect(&self, v: &Verdict) -> Effect;
}

/// The grid's judge: the target's hook, kind and offender position, unless this is the control.
pub struct TargetJudge {
    t: Option<Target>,
    dry: bool,
}

impl Judge for TargetJudge {
    fn effect(&self, v: &Verdict) -> Effect {
        let Some(t) = &self.t else { return Effect::Report };
        if self.dry || v.subgroup || t.hook != v.hook || t.kind != v.kind {
            return Effect::Report;
        }
        let o = v.offender();
        let at = match t.pos {
            "any" => true,
            "first" => o == 0,
            "last" => v.ws > 1 && o == v.ws - 1,
            "middle" => o > 0 && o + 1 < v.ws,
            "root" => v.root == Some(o),
            "nonroot" => v.root.is_some_and(|r| r != o),
            _ => false,
        };
        match (at, t.mode) {
            (false, _) => Effect::Report,
            (true, "missed") => Effect::Complete,
            (true, _) => Effect::LeaveBehind,
        }
    }
}

/// A communicator's state: the hook and error a `LeaveBehind` left.
#[derive(Default)]
struct State {
    left: Mutex<Option<(&'static str, CollectiveError)>>,
    /// Counts the wrapped works (reported: a fused decomposition moves its count onto them).
    counter: OutstandingCounter,
    /// Wrapped works whose inner work is not settled yet (counted by the inner backend too).
    pending: std::sync::atomic::AtomicUsize,
}

/// The shm backend with every hook's refusals passed through a [`Judge`].
pub struct Judged<J> {
    judge: Arc<J>,
    state: Arc<State>,
}

impl<J: Judge + Default> Default for Judged<J> {
    fn default() -> Self {
        Judged::new(J::default())
    }
}

/// What a judge decides for `e` on `hook` (anything but a bad input is reported as is).
fn decide(judge: &dyn Judge, hook: &str, e: &CollectiveError, ws: usize, me: usize, root: Option<usize>, subgroup: bool) -> Effect {
    match e {
        CollectiveError::BadInput { kind, detail, .. } => judge.effect(&Verdict { hook, kind: *kind, detail, ws, me, root, subgroup }),
        _ => Effect::Report,
    }
}

impl<J: Judge> Judged<J> {
    pub fn new(judge: J) -> Judged<J> {
        Judged { judge: Arc::new(judge), state: Arc::new(State::default()) }
    }

    /// `call` (the correct shm call) on `hook`, its refusal passed through the judge; `value`:
    /// what a call completed in spite of a refusal at issue returns.
    fn wrap<T: Clone + Send + Sync + 'static>(
        &self,
        s: &Shm,
        hook: &'static str,
        root: Option<usize>,
        value: T,
        call: impl FnOnce() -> Result<Work<T>>,
    ) -> Result<Work<T>> {
        // The error a refused call of this hook left behind fails this call.
        {
            let mut left = crate::lock(&self.state.left);
            if left.as_ref().is_some_and(|(h, _)| *h == hook) {
                return Err(left.take().expect("checked").1);
            }
        }
        let (ws, me, sub) = (s.ws(), s.rank(), s.in_subgroup());
        match call() {
            Err(e) => match decide(&*self.judge, hook, &e, ws, me, root, sub) {
                Effect::Complete => Ok(s.done(value, hook)),
                Effect::LeaveBehind => {
                    *crate::lock(&self.state.left) = Some((hook, e.clone()));
                    Err(e)
                }
                Effect::Report => Err(e),
            },
            Ok(w) => {
                let meta = w.meta().clone();
                let v = w.peek().clone();
                let judge: Arc<dyn Judge> = self.judge.clone();
                self.state.pending.fetch_add(1, SeqCst);
                let settled = AtomicBool::new(false);
                let relay = Relay { inner: w, judge, hook, ws, me, root, sub, state: self.state.clone(), settled };
                Ok(Work::new(v, Arc::new(relay), meta, &self.state.counter))
            }
        }
    }
}

/// The completion of a wrapped call: the inner work's, its refusal judged at wait.
struct Relay<T> {
    inner: Work<T>,
    judge: Arc<dyn Judge>,
    hook: &'static str,
    ws: usize,
    me: usize,
    root: Option<usize>,
    sub: bool,
    state: Arc<State>,
    /// The inner work has been waited to its end (no longer counted by the inner backend).
    settled: AtomicBool,
}

impl<T> Relay<T> {
    fn settle(&self) {
        if !self.settled.swap(true, SeqCst) {
            self.state.pending.fetch_sub(1, SeqCst);
        }
    }
}

impl<T> Drop for Relay<T> {
    fn drop(&mut self) {
        self.settle();
    }
}

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let r = self.inner.wait(timeout);
        if !matches!(r, Err(CollectiveError::Timeout { .. })) {
            self.settle();
        }
        match r {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => match decide(&*self.judge, self.hook, &e, self.ws, self.me, self.root, self.sub) {
                Effect::Complete => Ok(true),
                Effect::LeaveBehind => {
                    *crate::lock(&self.state.left) = Some((self.hook, e.clone()));
                    Err(e)
                }
                Effect::Report => Err(e),
            },
        }
    }
}

impl<J: Judge> Bug for Judged<J> {
    /// Every work counted once: the inner backend's (while a wrapped one's inner work is
    /// pending, it counts the work), the wrapper's own, and the wrapped works past their inner one.
    fn outstanding(&self, s: &Shm) -> usize {
        (s.inner.outstanding() + s.own.get() + self.state.counter.get()).saturating_sub(self.state.pending.load(SeqCst))
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, "all_reduce", None, x.clone(), || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, "all_reduce_", None, x.clone(), || s.inner.all_reduce_(x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.wrap(s, "all_reduce_coalesced", None, xs.to_vec(), || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.wrap(s, "all_reduce_coalesced_", None, xs.to_vec(), || s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.wrap(s, "all_gather_into_tensor", None, x.clone(), || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.wrap(s, "all_gather_into_tensor_out", None, out.clone(), || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.wrap(s, "all_gather_into_tensor_coalesced", None, xs.to_vec(), || s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.wrap(s, "reduce_scatter_tensor", None, x.clone(), || s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.wrap(s, "reduce_scatter_tensor_out", None, out.clone(), || s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.wrap(s, "reduce_scatter_tensor_coalesced", None, xs.to_vec(), || s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.wrap(s, "all_to_all_single", None, x.clone(), || s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.wrap(s, "broadcast", Some(src), x.clone(), || s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.wrap(s, "broadcast_", Some(src), x.clone(), || s.inner.broadcast_(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.wrap(s, "permute_tensor", None, x.clone(), || s.inner.permute_tensor(x, src_dst))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.wrap(s, "reduce", Some(root), x.clone(), || s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.wrap(s, "gather", Some(root), x.clone(), || s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.wrap(s, "scatter", Some(root), x.clone(), || s.inner.scatter(x, root))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.wrap(s, "send", None, (), || s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.wrap(s, "recv", None, out.clone(), || s.inner.recv(out, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.wrap(s, "barrier", None, (), || s.inner.barrier())
    }
}

/// Whether `case` may give `hook` bad input (a superset, by metadata: the bad-input suite's rows
/// are named after their call; the fused bad-input cases, and the faults, async_wait, caps and
/// reuse suites, which refuse calls on purpose).
pub fn may_refuse(case: &CaseInfo, hook: &str) -> bool {
    let bad = case.id.contains("bad_input") || ["faults", "async_wait", "caps", "reuse"].contains(&case.meta.suite.as_str());
    let op = case.meta.op.as_str();
    let base = match hook {
        h if h.starts_with("all_reduce") => "all_reduce",
        h if h.starts_with("all_gather") => "all_gather",
        h if h.starts_with("reduce_scatter") => "reduce_scatter",
        "all_to_all_single" => "all_to_all",
        "broadcast_" => "broadcast",
        "permute_tensor" => "permute",
        h => h,
    };
    let uses = op == "mixed" || op.contains(base) || (matches!(hook, "send" | "recv") && (op.contains("send") || op.contains("recv")));
    bad && uses
}

/// A cell's cases: the world size's cases that may refuse the hook, those named after the kind first.
pub fn cell_cases(cases: &[CaseInfo], t: &Target, ws: usize) -> Vec<CaseInfo> {
    let mut v: Vec<&CaseInfo> = cases.iter().filter(|c| c.world_size == ws && may_refuse(c, t.hook)).collect();
    let words: Vec<&str> = t.kind.name().split('_').filter(|w| w.len() > 2).collect();
    v.sort_by_key(|c| !words.iter().all(|w| c.meta.op.contains(w)));
    v.into_iter().cloned().collect()
}

/// The spec of `t`.
pub fn spec(t: &Target) -> Spec {
    let entry = BackendEntry::new::<crate::Mutant>(NAME, 0, concord_suites::catalogue::<crate::Mutant>)
        .with_option("mutant", NAME)
        .with_option(NAME, &t.label())
        .with_rerun(format!("cargo xtask mutants --sweep '{}' --case", t.label())); // quoted: `!` is history expansion in bash
    Spec {
        name: NAME,
        clause: "bad_input.named_everywhere",
        what: "one bad-input kind of one hook misreported, by the offender's position",
        catchers: &[],
        entry,
        make,
    }
}

/// The control of `t`: the same wrapping, nothing misreported.
pub fn control(t: &Target) -> Spec {
    crate::sweep::control_of(spec(t), "the control: the same target, nothing misreported")
}

/// The entry a worker process of any target is served by.
pub fn worker_entry() -> BackendEntry {
    spec(&targets(&[])[0]).entry
}

/// One cell of the bad-input grid.
pub type Cell = crate::sweep::GridCell<Target>;

/// Every cell of `targets` × `sizes`, up to `jobs` side by side, without the cases whose id
/// contains one of `skip`.
pub fn run(targets: &[Target], sizes: &[usize], jobs: usize, skip: &[String], report: impl Fn(&Cell) + Sync) -> Vec<Cell> {
    if targets.is_empty() {
        return Vec::new();
    }
    let cases = listed_without(&spec(&targets[0]).entry, skip);
    let work: Vec<(Target, usize)> = targets.iter().flat_map(|t| sizes.iter().map(|&ws| (t.clone(), ws))).collect();
    let cell_run = |t: &Target, ws: usize| (!impossible(t, ws)).then(|| cell_cases(&cases, t, ws));
    run_cells(work, jobs, cell_run, |t| (spec(t), control(t)), report)
}

/// The grid: a table per hook, a row per (kind, position), a column per world size; then the
/// holes and the count.
pub fn render(cells: &[Cell], sizes: &[usize]) -> String {
    let mark = |c: Option<&Cell>| match c {
        None => ".",
        Some(c) if c.candidates.is_none() => "-",
        Some(c) if c.caught.is_some() => "ok",
        Some(_) => "HOLE",
    };
    let mut out = String::new();
    for h in HOOKS {
        let mine: Vec<&Cell> = cells.iter().filter(|c| c.target.hook == *h).collect();
        if mine.is_empty() {
            continue;
        }
        out += &format!("\n{h}\n{:<36}", "kind:position:mode");
        for ws in sizes {
            out += &format!(" {:>5}", format!("ws{ws}"));
        }
        out += "\n";
        let mut rows: Vec<&Target> = Vec::new();
        for c in &mine {
            if !rows.contains(&&c.target) {
                rows.push(&c.target);
            }
        }
        rows.sort_by_key(|t| (K::ALL.iter().position(|k| *k == t.kind), POSITIONS.iter().position(|p| *p == t.pos)));
        for t in rows {
            out += &format!("{:<36}", format!("{}:{}:{}", t.kind.name(), t.pos, t.mode));
            for ws in sizes {
                out += &format!(" {:>5}", mark(mine.iter().find(|c| &c.target == t && c.ws == *ws).copied()));
            }
            out += "\n";
        }
    }
    let run: Vec<&Cell> = cells.iter().filter(|c| c.candidates.is_some()).collect();
    let holes: Vec<&&Cell> = run.iter().filter(|c| c.caught.is_none()).collect();
    let aside: Vec<String> = run
        .iter()
        .flat_map(|c| c.set_aside.iter().map(move |(k, w)| format!("  {} ws{}: {k} {}", c.target.label(), c.ws, w.says())))
        .collect();
    if !aside.is_empty() {
        out += &format!("\nfailures not counted as catches ({}):\n{}\n", aside.len(), aside.join("\n"));
    }
    out += &format!("\nholes ({}):\n", holes.len());
    for c in &holes {
        out += &format!(
            "  {} ws{} ({} cases may refuse the hook; rerun: cargo xtask mutants --sweep '{}' --ws {})\n",
            c.target.label(),
            c.ws,
            c.candidates.unwrap_or(0),
            c.target.label(),
            c.ws
        );
    }
    out += &format!("cells caught: {}/{}\n", run.len() - holes.len(), run.len());
    out
}
