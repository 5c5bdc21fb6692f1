//! # concord-autotune
//!
//! **One job:** pick, for one collective op instance (op, dtype, shape, reduce op, group), the
//! fastest *correct* implementation among named [`Choice`]s — the same one on every rank, within
//! a deadline, even when a rank errors, panics, hangs or never arrives.
//!
//! ## Design (each known failure mode of collective autotuning, and its answer)
//! * **Decisions go through the store, never through a collective.** Every agreement point
//!   (the pre-sync, each choice's screening and timing status, each winner) is an *exchange*:
//!   each rank `set`s `<prefix>/<rank>`, reads every rank's key with the deadline, and proposes
//!   its view with `compare_set(<prefix>/decision, "", view)`: the first writer wins and every
//!   rank adopts the stored value. Live ranks decide within the deadline even when a peer never
//!   returns (a collective-based decision would wait for it), and a late rank adopts the decision
//!   already stored, so every rank ends the same way.
//! * **One pre-sync for many ops**, out of band with a deadline: each rank publishes, per op, the
//!   ordered applicable candidate names, their hash and its cache hit; different lists are a named
//!   [`TuneError::CandidateMismatch`] on every rank; a rank missing at the deadline is named and
//!   every op takes its declared default.
//! * **Screening before timing**: each choice's output for exact-by-construction inputs
//!   (`concord-fixtures`, seeded identically on every rank) is compared with the oracle; a wrong,
//!   failing or panicking (`catch_unwind`) choice on any rank is out on every rank before timing.
//! * **Deadlines everywhere**: every wait of a choice uses `min(op timeout, deadline left)`
//!   ([`ChoiceCtx::timeout`]), timed runs included. A choice that timed out on any rank (or
//!   whose status never came) may have left the communicator unusable: every remaining choice is
//!   marked not run on every rank, as PyTorch does "to avoid corruption".
//! * **Per-rank times reduced by a declared [`Policy`]** (`Max` by default: averaging hides the
//!   slow rank), ties broken by candidate order; all inf → the declared default, with a warning.
//! * **A decision cache** ([`cache`]) keyed by backend, op, dtype, shape, reduce op, group ranks
//!   and choice-set hash, persisted as JSON; a hit is used only when every rank hit with the same
//!   winner (agreed in the pre-sync), else every rank re-tunes.
//! * Outside a world (no store): local benchmarking, with a warning.
#![forbid(unsafe_code)]

pub mod cache;
pub mod choices;
mod exchange;
pub mod table;
mod tuner;

pub use table::{Outcome, RankStatus, Row, RowStatus, Table};
pub use tuner::Tuner;

use concord_core::{Backend, Capabilities, DType, OpKind, ReduceOp, Result as CResult, Variant, Work};
use concord_oracle::Collective;
use concord_store::Store;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One op instance to tune: op, dtype, shape and reduce op (the group is the backend's).
#[derive(Clone, Debug, PartialEq)]
pub struct OpInstance {
    pub op: OpKind,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub reduce: Option<ReduceOp>,
}

impl OpInstance {
    pub fn all_reduce(dtype: DType, shape: &[usize], op: ReduceOp) -> Self {
        OpInstance { op: OpKind::AllReduce, dtype, shape: shape.to_vec(), reduce: Some(op) }
    }
    pub fn all_gather(dtype: DType, shape: &[usize]) -> Self {
        OpInstance { op: OpKind::AllGatherIntoTensor, dtype, shape: shape.to_vec(), reduce: None }
    }
    pub fn reduce_scatter(dtype: DType, shape: &[usize], op: ReduceOp) -> Self {
        OpInstance { op: OpKind::ReduceScatterTensor, dtype, shape: shape.to_vec(), reduce: Some(op) }
    }
    pub fn all_to_all(dtype: DType, shape: &[usize]) -> Self {
        OpInstance { op: OpKind::AllToAllSingle, dtype, shape: shape.to_vec(), reduce: None }
    }
    /// `all_reduce/f32/[1024]/sum`: how messages and cache keys name the instance.
    pub fn key(&self) -> String {
        let r = self.reduce.map(|r| r.name()).unwrap_or("-");
        format!("{}/{}/{:?}/{r}", self.op.name(), self.dtype, self.shape)
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// Dim 0 (1 for a 0-dim tensor).
    pub fn d0(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
    /// The oracle's description of the instance on `ws` ranks (all_to_all: equal splits).
    pub fn collective(&self, ws: usize) -> Collective {
        let op = self.reduce.unwrap_or(ReduceOp::Sum);
        match self.op {
            OpKind::AllReduce => Collective::AllReduce { op },
            OpKind::AllGatherIntoTensor => Collective::AllGather,
            OpKind::ReduceScatterTensor => Collective::ReduceScatter { op },
            OpKind::AllToAllSingle => Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] },
            other => panic!("concord-autotune tunes all_reduce, all_gather, reduce_scatter and all_to_all, not {other}"),
        }
    }
}

impl std::fmt::Display for OpInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key())
    }
}

/// Which run of a choice this is (injected behaviours key on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The one run whose output is checked against the oracle.
    Screen,
    Warmup(usize),
    Timed(usize),
    /// The tuned op, run after tuning ([`run_choice`]).
    Use,
}

/// What a choice sees while it runs.
pub struct ChoiceCtx<'a, B: Backend> {
    pub b: &'a B,
    pub inst: &'a OpInstance,
    pub phase: Phase,
    pub deadline: Instant,
    pub op_timeout: Duration,
}

impl<B: Backend> ChoiceCtx<'_, B> {
    /// The deadline for one wait: `min(op timeout, autotune deadline left)`.
    pub fn timeout(&self) -> Duration {
        self.op_timeout.min(self.deadline.saturating_duration_since(Instant::now()))
    }
    /// Waits for `w` with [`ChoiceCtx::timeout`].
    pub fn wait<T>(&self, w: Work<T>) -> CResult<T> {
        w.into_value(self.timeout())
    }
}

pub type RunFn<B> = Arc<dyn Fn(&ChoiceCtx<'_, B>, &<B as Backend>::Buffer) -> CResult<<B as Backend>::Buffer> + Send + Sync>;
pub type ApplicableFn = Arc<dyn Fn(&OpInstance, usize) -> bool + Send + Sync>;
/// The backend calls a choice makes for an instance at a world size: `(op, variant, reduce op)`,
/// each in the instance's dtype.
pub type CallsFn = Arc<dyn Fn(&OpInstance, usize) -> Vec<(OpKind, Variant, Option<ReduceOp>)> + Send + Sync>;

/// A named implementation of one collective over the [`Backend`] trait.
pub struct Choice<B: Backend> {
    pub name: String,
    /// Whether the choice applies to an instance at a world size (every rank asks the same).
    pub applies: ApplicableFn,
    /// The calls it makes, where declared ([`Choice::calls`]): a choice one of whose calls the
    /// backend declares a gap (`Capabilities::gaps`) is skipped by name on every rank, never run.
    pub calls: Option<CallsFn>,
    pub run: RunFn<B>,
}

impl<B: Backend> Clone for Choice<B> {
    fn clone(&self) -> Self {
        Choice { name: self.name.clone(), applies: self.applies.clone(), calls: self.calls.clone(), run: self.run.clone() }
    }
}

impl<B: Backend> Choice<B> {
    pub fn new(name: &str, run: impl Fn(&ChoiceCtx<'_, B>, &B::Buffer) -> CResult<B::Buffer> + Send + Sync + 'static) -> Self {
        Choice { name: name.to_string(), applies: Arc::new(|_, _| true), calls: None, run: Arc::new(run) }
    }
    /// The same choice, applicable only where `f` says.
    pub fn when(mut self, f: impl Fn(&OpInstance, usize) -> bool + Send + Sync + 'static) -> Self {
        self.applies = Arc::new(f);
        self
    }
    /// The same choice, declaring the calls it makes (so that a declared gap skips it).
    pub fn calls(mut self, f: impl Fn(&OpInstance, usize) -> Vec<(OpKind, Variant, Option<ReduceOp>)> + Send + Sync + 'static) -> Self {
        self.calls = Some(Arc::new(f));
        self
    }
    /// The first of its declared calls for `inst` on `ws` ranks that `caps` declares a gap,
    /// named with the declaration's reason; `None` when none is (or no calls are declared).
    pub fn declared_gap(&self, caps: &Capabilities, inst: &OpInstance, ws: usize) -> Option<String> {
        let calls = self.calls.as_ref()?;
        calls(inst, ws).into_iter().find_map(|(op, variant, reduce)| {
            caps.check_call(op, Some(variant), Some(inst.dtype), reduce).err().map(|why| {
                let r = reduce.map_or(String::new(), |r| format!(" reduce={}", r.name()));
                format!(
                    "declared gap: it calls {op} variant={variant} dtype={}{r}, which the backend declares unsupported ({why})",
                    inst.dtype
                )
            })
        })
    }
}

/// One op instance with its candidate choices (in order: ties go to the earlier one) and the
/// declared default (what every rank uses when no choice can be timed).
pub struct Request<B: Backend> {
    pub inst: OpInstance,
    pub choices: Vec<Choice<B>>,
    pub default: String,
}

impl<B: Backend> Clone for Request<B> {
    fn clone(&self) -> Self {
        Request { inst: self.inst.clone(), choices: self.choices.clone(), default: self.default.clone() }
    }
}

impl<B: Backend> Request<B> {
    /// The built-in choice set of the instance's op, default `native`.
    pub fn builtin(inst: OpInstance) -> Self {
        Request { choices: choices::builtin::<B>(inst.op), inst, default: "native".into() }
    }
    pub fn new(inst: OpInstance, choices: Vec<Choice<B>>, default: &str) -> Self {
        Request { inst, choices, default: default.into() }
    }
}

/// How per-rank times of one choice become its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Policy {
    /// The slowest rank (default): a collective takes as long as its slowest rank.
    #[default]
    Max,
    /// The mean over ranks (PyTorch's all_reduce(AVG)): hides a slow rank.
    Avg,
    Median,
}

impl Policy {
    /// Reduces per-rank times (ns). Median of an even count: the mean of the middle two.
    pub fn reduce(self, times: &[u64]) -> u64 {
        if times.is_empty() {
            return 0;
        }
        match self {
            Policy::Max => *times.iter().max().expect("non-empty"),
            Policy::Avg => (times.iter().map(|&t| t as u128).sum::<u128>() / times.len() as u128) as u64,
            Policy::Median => median(times),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::Max => "max",
            Policy::Avg => "avg",
            Policy::Median => "median",
        }
    }
}

/// Median (mean of the middle two for an even count).
pub fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    let n = s.len();
    if n == 0 {
        0
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        ((s[n / 2 - 1] as u128 + s[n / 2] as u128) / 2) as u64
    }
}

/// Known hazards, for the self-test only: each flag reintroduces one failure mode that the
/// autotune suite must catch. Never set in real use.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct Hazards {
    /// A choice that fails on this rank is dropped on this rank alone (no exchange).
    pub local_fallback: bool,
    /// Per-choice outcomes are exchanged with a backend all_gather waited with the op timeout.
    pub collective_decision: bool,
    /// Outputs are not checked before timing.
    pub no_screening: bool,
    /// A local cache hit is used at once, without agreement in the pre-sync.
    pub unagreed_cache: bool,
    /// A rank's time is the mean of its timed runs, not the median (one outlier run decides).
    pub mean_of_runs: bool,
    /// Choices are screened on the fixtures' small integers as they are (not widened to fill
    /// the significand): a lossy choice (f32 through an f16 wire) gives them back exactly.
    pub small_integer_screening: bool,
    /// A leader-based decision (review11, finding 2): rank 0 gathers every rank's status with the
    /// deadline and publishes the decision; every other rank publishes its own and waits for
    /// rank 0's decision with the backend's op timeout, not what is left of the deadline (and,
    /// if that ends first, goes on alone with its own view).
    pub leader_decision: bool,
}

/// Autotuner settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The deadline of one `tune` call (pre-sync, screening, timed runs, decisions).
    pub timeout: Duration,
    pub warmup: usize,
    /// Timed runs per choice; a rank's time is the median of its runs.
    pub runs: usize,
    pub policy: Policy,
    /// The decision cache file of this rank (JSON), if any.
    pub cache: Option<std::path::PathBuf>,
    #[doc(hidden)]
    pub hazards: Hazards,
}

impl Default for Config {
    fn default() -> Self {
        Config { timeout: Duration::from_secs(30), warmup: 1, runs: 5, policy: Policy::Max, cache: None, hazards: Hazards::default() }
    }
}

/// Where a `tune` call runs.
pub struct Env<'a, B: Backend> {
    pub b: &'a B,
    /// The world's store; `None` outside a world (local benchmarking, with a warning).
    pub store: Option<&'a Store>,
    /// A key prefix unique to this call and the same on every rank.
    pub tag: String,
    /// The group's ranks in the world (part of the cache key).
    pub group_ranks: Vec<usize>,
    /// The backend's op timeout (each wait uses the smaller of it and the deadline left).
    pub op_timeout: Duration,
}

impl<'a, B: Backend> Env<'a, B> {
    pub fn new(b: &'a B, store: Option<&'a Store>, tag: impl Into<String>, op_timeout: Duration) -> Self {
        Env { b, store, tag: tag.into(), group_ranks: (0..b.world_size()).collect(), op_timeout }
    }
}

/// A named error every rank reports alike.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum TuneError {
    #[error("autotune candidate_mismatch: the candidate lists of {op} differ across ranks: {detail}")]
    CandidateMismatch { op: String, detail: String },
    #[error("autotune bad_request: {0}")]
    BadRequest(String),
    #[error("autotune store: {0}")]
    Store(String),
}

impl TuneError {
    pub fn name(&self) -> &'static str {
        match self {
            TuneError::CandidateMismatch { .. } => "candidate_mismatch",
            TuneError::BadRequest(_) => "bad_request",
            TuneError::Store(_) => "store",
        }
    }
}

/// What the conformance suite holds an autotuner to (`concord_suites`' autotune suite): a
/// downstream autotuner implements it and runs the same cases. Among what the suite checks: one
/// deadline per `tune` call (every wait of every run uses what is left of it); a rank's time is
/// the median of its timed runs after the configured warm-up runs; a row's `reduced_ns` is the
/// declared policy's reduction of every rank's time, the same on every rank; a choice not
/// reported by some rank is inf on every rank even where others timed it; the agreements of two
/// groups tuning at once are kept apart (by [`Env::tag`]); outside a world the choices are still
/// benchmarked; the cache key holds the group, and a declared default taken because every
/// choice was inf is never cached; a choice is screened on inputs that fill the significand of
/// f32 / f64 ([`concord_fixtures::widen`]), so a lossy one (f32 through an f16 wire) is inf.
pub trait Autotuner<B: Backend>: Send + Sync + 'static {
    /// An autotuner with these settings.
    fn new(cfg: Config) -> Self
    where
        Self: Sized;
    /// The policy it declares (the suite checks the winners against it).
    fn policy(&self) -> Policy;
    /// Tunes every request (one pre-sync for all) and returns one [`Table`] per request, in order.
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError>;
}

/// FNV-1a of the candidate names in order (the pre-sync's and the cache key's hash).
pub fn names_hash(names: &[String]) -> String {
    let h = names
        .iter()
        .flat_map(|n| n.bytes().chain(std::iter::once(0u8)))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{h:016x}")
}

/// Runs the choice named `winner` of `request` once on `input` (the tuned op).
pub fn run_choice<B: Backend>(b: &B, request: &Request<B>, winner: &str, input: &B::Buffer, timeout: Duration) -> CResult<B::Buffer> {
    let c = request
        .choices
        .iter()
        .find(|c| c.name == winner)
        .ok_or_else(|| concord_core::CollectiveError::Backend(format!("no choice `{winner}` in the request")))?;
    let ctx = ChoiceCtx { b, inst: &request.inst, phase: Phase::Use, deadline: Instant::now() + timeout, op_timeout: timeout };
    (c.run)(&ctx, input)
}
