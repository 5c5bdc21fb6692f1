//! Self-test of the autotune suite: deliberately broken autotuners (the reference autotuner with
//! one known hazard each) must FAIL the autotune suite on the shm backend, with a message naming
//! the behaviour; the reference autotuner must pass the very same cases (control).

use concord_autotune::{
    cache, names_hash, Autotuner, ChoiceCtx, Config, Env, Outcome, Phase, Policy, Request, Row, RowStatus, RunFn, Table, TuneError, Tuner,
};
use concord_core::Backend;
use concord_fixtures::{inputs, seed_for, InputKind};
use concord_harness::verdict::Verdict;
use concord_oracle::{compare, expected, Semantics, Tolerance};
use concord_shm::ShmBackend;
use concord_suites::run::{run_case, BackendEntry};
use concord_suites::Case;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A choice failing on one rank is dropped on that rank alone.
const LOCAL_FALLBACK: u8 = 1;
/// Asked for (and declaring) Max, reduces per-rank times with Avg.
const AVG_DECLARED_MAX: u8 = 2;
/// Per-choice outcomes agreed by a backend all_gather waited with the op timeout.
const COLLECTIVE_TIMEOUT: u8 = 3;
/// No check of outputs before timing.
const NO_SCREENING: u8 = 4;
/// A local cache hit used without agreement.
const UNAGREED_CACHE: u8 = 5;
/// A rank's time is the mean of its timed runs, not their median.
const MEAN_OF_RUNS: u8 = 6;
/// Choices screened on small integers that an f16 wire carries exactly (review-d).
const SMALL_INTEGERS: u8 = 7;
/// Leader-based decisions: the followers wait for rank 0's decision with the op timeout, not
/// what is left of the tuning deadline (review11, finding 2).
const LEADER_DECISION: u8 = 8;

struct Faulty<const H: u8> {
    inner: Tuner,
    declared: Policy,
}

impl<B: Backend, const H: u8> Autotuner<B> for Faulty<H> {
    fn new(mut cfg: Config) -> Self {
        let declared = cfg.policy;
        match H {
            LOCAL_FALLBACK => cfg.hazards.local_fallback = true,
            AVG_DECLARED_MAX if cfg.policy == Policy::Max => cfg.policy = Policy::Avg,
            COLLECTIVE_TIMEOUT => cfg.hazards.collective_decision = true,
            NO_SCREENING => cfg.hazards.no_screening = true,
            UNAGREED_CACHE => cfg.hazards.unagreed_cache = true,
            MEAN_OF_RUNS => cfg.hazards.mean_of_runs = true,
            SMALL_INTEGERS => cfg.hazards.small_integer_screening = true,
            LEADER_DECISION => cfg.hazards.leader_decision = true,
            _ => {}
        }
        Faulty { inner: <Tuner as Autotuner<B>>::new(cfg), declared }
    }
    fn policy(&self) -> Policy {
        self.declared
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        <Tuner as Autotuner<B>>::tune(&self.inner, env, requests)
    }
}

// ---- Broken autotuners written OUTSIDE the reference tuner ----
//
// What a user ships: their own `Autotuner`, here each a thin wrapper around `Tuner` that gets one
// thing wrong the way a hand-written autotuner could (no hazard flag, no access to its
// internals). Each must fail the suite with a message naming the behaviour.

/// The settings a wrapper keeps, and its inner reference tuner.
fn inner<B: Backend>(cfg: &Config) -> Tuner {
    <Tuner as Autotuner<B>>::new(cfg.clone())
}

/// Recomputes each timed table's reduced times with `reduce` (per row, over the ranks' times) and
/// picks the smallest (ties to the earlier row), as a hand-written selection loop would.
fn repick(t: &mut Table, reduce: impl Fn(&[u64]) -> u64) {
    if t.from_cache {
        return;
    }
    let mut best: Option<(String, u64)> = None;
    for row in &mut t.rows {
        if row.status == RowStatus::Ok {
            let per: Vec<u64> = row.per_rank_ns.iter().map(|n| n.unwrap_or(0)).collect();
            let r = reduce(&per);
            row.reduced_ns = Some(r);
            if best.as_ref().is_none_or(|(_, b)| r < *b) {
                best = Some((row.choice.clone(), r));
            }
        }
    }
    if let Some((w, _)) = best {
        t.winner = w;
        t.defaulted = false;
    }
}

/// Returns the tables sorted by op key (it grouped the requests in a `BTreeMap`), not in the
/// order of the requests.
struct SortedTables(Tuner);
impl<B: Backend> Autotuner<B> for SortedTables {
    fn new(cfg: Config) -> Self {
        SortedTables(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let mut by_key: BTreeMap<String, Table> = BTreeMap::new();
        for t in o.tables.drain(..) {
            by_key.insert(t.inst.key(), t);
        }
        o.tables = by_key.into_values().collect();
        Ok(o)
    }
}

/// Reduces per-rank times with `min` (the fastest rank) while declaring the configured policy.
struct MinOverRanks(Tuner);
impl<B: Backend> Autotuner<B> for MinOverRanks {
    fn new(cfg: Config) -> Self {
        MinOverRanks(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        for t in &mut o.tables {
            repick(t, |v| v.iter().copied().min().unwrap_or(0));
        }
        Ok(o)
    }
}

/// Each rank picks the choice fastest on itself (its own column of the agreed times), no
/// reduction across ranks.
struct OwnTimesOnly(Tuner);
impl<B: Backend> Autotuner<B> for OwnTimesOnly {
    fn new(cfg: Config) -> Self {
        OwnTimesOnly(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let rank = env.b.rank();
        for t in &mut o.tables {
            repick(t, |v| v[rank]);
        }
        Ok(o)
    }
}

/// A choice that failed (error, panic, wrong output, timeout) is recorded as taking 0 s, as in
/// `except Exception: timings[choice] = 0.0`: it is "ok" and the fastest.
struct FailureAsZero(Tuner);
impl<B: Backend> Autotuner<B> for FailureAsZero {
    fn new(cfg: Config) -> Self {
        FailureAsZero(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        for t in &mut o.tables {
            let mut zeroed = Vec::new();
            for row in &mut t.rows {
                if matches!(row.status, RowStatus::Failed(_)) {
                    row.status = RowStatus::Ok;
                    row.per_rank_ns = vec![Some(0); t.world_size];
                    zeroed.push(format!("`{}`", row.choice));
                }
            }
            t.warnings.retain(|w| !zeroed.iter().any(|c| w.contains(c.as_str())) && !w.contains("every choice"));
            repick(t, |v| v.iter().copied().max().unwrap_or(0));
        }
        Ok(o)
    }
}

/// Times one call of each choice, the first one, with no warm-up.
struct SingleColdRun(Tuner);
impl<B: Backend> Autotuner<B> for SingleColdRun {
    fn new(mut cfg: Config) -> Self {
        cfg.warmup = 0;
        cfg.runs = 1;
        SingleColdRun(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        <Tuner as Autotuner<B>>::tune(&self.0, env, requests)
    }
}

/// Which part of the decision cache's key a [`LooseCache`] leaves out of its lookup.
const NO_DTYPE: u8 = 1;
const NO_REDUCE_OP: u8 = 2;
const NO_CANDIDATES: u8 = 3;
const NO_GROUP: u8 = 4;
const NO_SHAPE: u8 = 5;
const NO_POLICY: u8 = 6;

/// A decision cache looked up without one part of the key (a dict keyed by op and size only):
/// a cached decision for another dtype / reduce op / shape / candidate list / group / policy is
/// taken as this one's.
struct LooseCache<const K: u8>(Tuner);
impl<const K: u8> LooseCache<K> {
    /// `backend|op/dtype/shape/reduce|group|hash|policy` without the left-out part.
    fn loose(key: &str) -> String {
        let mut parts: Vec<String> = key.split('|').map(str::to_string).collect();
        if parts.len() != 5 {
            return key.to_string();
        }
        let p1 = parts[1].clone();
        let mut inst: Vec<&str> = p1.split('/').collect();
        match K {
            NO_DTYPE if inst.len() == 4 => inst[1] = "*",
            NO_REDUCE_OP if inst.len() == 4 => inst[3] = "*",
            NO_SHAPE if inst.len() == 4 => inst[2] = "*",
            NO_POLICY => parts[4] = "*".into(),
            NO_CANDIDATES => parts[3] = "*".into(),
            NO_GROUP => parts[2] = "*".into(),
            _ => {}
        }
        parts[1] = inst.join("/");
        parts.join("|")
    }
}
impl<B: Backend, const K: u8> Autotuner<B> for LooseCache<K> {
    fn new(cfg: Config) -> Self {
        LooseCache(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        if let Some(path) = &self.0.config().cache {
            let mut c = cache::Cache::load(path);
            let ws = env.b.world_size();
            for r in requests {
                let names: Vec<String> = r.choices.iter().filter(|c| (c.applies)(&r.inst, ws)).map(|c| c.name.clone()).collect();
                let key = cache::key(env.b.name(), &r.inst, &env.group_ranks, &names_hash(&names), self.0.config().policy);
                if c.get(&key).is_none() {
                    let found = c.entries.iter().find(|(k, _)| Self::loose(k) == Self::loose(&key)).map(|(_, e)| e.clone());
                    if let Some(e) = found {
                        c.put(key, e);
                    }
                }
            }
            let _ = c.save(path);
        }
        <Tuner as Autotuner<B>>::tune(&self.0, env, requests)
    }
}

/// Every wait of a choice (and the pre-sync) uses the backend's op timeout, not the autotune
/// deadline: a hung choice is waited for up to the op timeout.
struct OpTimeoutOnly(Config);
impl<B: Backend> Autotuner<B> for OpTimeoutOnly {
    fn new(cfg: Config) -> Self {
        OpTimeoutOnly(cfg)
    }
    fn policy(&self) -> Policy {
        self.0.policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut cfg = self.0.clone();
        cfg.timeout = cfg.timeout.max(env.op_timeout);
        <Tuner as Autotuner<B>>::tune(&inner::<B>(&cfg), env, requests)
    }
}

/// Runs every candidate, ignoring `Choice::applies` (a choice for a power-of-two world is timed
/// on 3 ranks).
struct IgnoresApplicability(Tuner);
impl<B: Backend> Autotuner<B> for IgnoresApplicability {
    fn new(cfg: Config) -> Self {
        IgnoresApplicability(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let all: Vec<Request<B>> = requests
            .iter()
            .map(|r| {
                let mut r = r.clone();
                for c in &mut r.choices {
                    c.applies = Arc::new(|_, _| true);
                }
                r
            })
            .collect();
        <Tuner as Autotuner<B>>::tune(&self.0, env, &all)
    }
}

/// `fn policy(&self) -> Policy { Policy::Max }`: declares Max whatever it was configured with.
struct DeclaresMaxAlways(Tuner);
impl<B: Backend> Autotuner<B> for DeclaresMaxAlways {
    fn new(cfg: Config) -> Self {
        DeclaresMaxAlways(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        Policy::Max
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        <Tuner as Autotuner<B>>::tune(&self.0, env, requests)
    }
}

/// An off-by-one over the candidates (`for j in 0..n - 1`): the last choice is silently never
/// tuned (when it is not the default, which it keeps).
struct DropsLastCandidate(Tuner);
impl<B: Backend> Autotuner<B> for DropsLastCandidate {
    fn new(cfg: Config) -> Self {
        DropsLastCandidate(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let fewer: Vec<Request<B>> = requests
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if r.choices.len() > 1 && r.choices.last().is_some_and(|c| c.name != r.default) {
                    r.choices.pop();
                }
                r
            })
            .collect();
        <Tuner as Autotuner<B>>::tune(&self.0, env, &fewer)
    }
}

/// Rank 0 alone picks the winner and never shares it: the other ranks keep the declared default
/// (the broadcast of the decision was forgotten).
struct Rank0DecidesAlone(Tuner);
impl<B: Backend> Autotuner<B> for Rank0DecidesAlone {
    fn new(cfg: Config) -> Self {
        Rank0DecidesAlone(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        if env.b.rank() != 0 {
            for (t, r) in o.tables.iter_mut().zip(requests) {
                if !t.from_cache {
                    t.winner = r.default.clone();
                }
            }
        }
        Ok(o)
    }
}

/// Only rank 0 compares a choice's screening output with the expected one; the other ranks take
/// any output as right. (Modelled from outside: on ranks other than 0 the screening run still
/// runs the choice, then hands the inner tuner the expected output of its fixture inputs, seeded
/// as the reference seeds them: `autotune/<instance key>`.)
struct ScreensOnRank0Only(Tuner);
impl<B: Backend> Autotuner<B> for ScreensOnRank0Only {
    fn new(cfg: Config) -> Self {
        ScreensOnRank0Only(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let (b, rank, ws) = (env.b, env.b.rank(), env.b.world_size());
        if rank == 0 {
            return <Tuner as Autotuner<B>>::tune(&self.0, env, requests);
        }
        let unchecked = requests
            .iter()
            .map(|r| {
                let i = &r.inst;
                let mut all = inputs(seed_for(&format!("autotune/{}", i.key())), ws, i.dtype, &i.shape, i.reduce, InputKind::Exact);
                concord_fixtures::widen(&mut all, i.reduce); // as the reference tuner screens
                let exp = expected(&i.collective(ws), &all, &Semantics::of(&b.capabilities()))
                    .map_err(|e| TuneError::BadRequest(format!("{i}: {e:?}")))?
                    .outputs[rank]
                    .clone();
                let mut r = r.clone();
                for c in &mut r.choices {
                    let (run, exp) = (c.run.clone(), exp.clone());
                    c.run = Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                        let out = run(ctx, x)?;
                        if ctx.phase == Phase::Screen {
                            ctx.b.upload(&exp)
                        } else {
                            Ok(out)
                        }
                    });
                }
                Ok(r)
            })
            .collect::<Result<Vec<Request<B>>, TuneError>>()?;
        <Tuner as Autotuner<B>>::tune(&self.0, env, &unchecked)
    }
}

/// Picks the winner's index among the applicable candidates, then names it from the full list
/// (`request.choices[best]`): wrong whenever a skipped choice comes before the winner.
struct IndexIntoFullList(Tuner);
impl<B: Backend> Autotuner<B> for IndexIntoFullList {
    fn new(cfg: Config) -> Self {
        IndexIntoFullList(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        for (t, r) in o.tables.iter_mut().zip(requests) {
            let applicable: Vec<&str> =
                t.rows.iter().filter(|row| !matches!(row.status, RowStatus::Skipped(_))).map(|row| row.choice.as_str()).collect();
            if let Some(best) = applicable.iter().position(|n| *n == t.winner) {
                t.winner = r.choices[best].name.clone();
            }
        }
        Ok(o)
    }
}

// ---- The eleventh hunt (helper hunt11): more autotuners a user could ship ----

/// The cache key of request `r` as the reference tuner builds it.
fn key_of<B: Backend>(env: &Env<'_, B>, r: &Request<B>, policy: Policy) -> String {
    let ws = env.b.world_size();
    let names: Vec<String> = r.choices.iter().filter(|c| (c.applies)(&r.inst, ws)).map(|c| c.name.clone()).collect();
    cache::key(env.b.name(), &r.inst, &env.group_ranks, &names_hash(&names), policy)
}

/// Wraps every choice of every request with `wrap` (what a wrapper does to reach inside a run).
fn wrap_choices<B: Backend>(requests: &[Request<B>], wrap: impl Fn(&Request<B>, RunFn<B>) -> RunFn<B>) -> Vec<Request<B>> {
    requests
        .iter()
        .map(|r| {
            let mut w = r.clone();
            for c in &mut w.choices {
                c.run = wrap(r, c.run.clone());
            }
            w
        })
        .collect()
}

/// Caches every decision, the declared default of a tuning where every choice was inf included:
/// a transient failure (a slow peer, a choice that failed once) is remembered for good, and no
/// later process ever tunes the op again.
struct CachesTheDefault(Tuner);
impl<B: Backend> Autotuner<B> for CachesTheDefault {
    fn new(cfg: Config) -> Self {
        CachesTheDefault(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        if let Some(path) = &self.0.config().cache {
            let mut c = cache::Cache::load(path);
            for (t, r) in o.tables.iter().zip(requests) {
                if t.defaulted && !t.from_cache {
                    c.put(
                        key_of(env, r, t.policy),
                        cache::Entry { winner: t.winner.clone(), policy: t.policy.name().into(), reduced_ns: None },
                    );
                }
            }
            let _ = c.save(path);
        }
        Ok(o)
    }
}

/// Shows each choice's time on this rank as its reduced time (the winner is still picked by the
/// declared policy): the printed and cached `reduced_ns` is not the policy's reduction.
struct ReducedIsOwnTime(Tuner);
impl<B: Backend> Autotuner<B> for ReducedIsOwnTime {
    fn new(cfg: Config) -> Self {
        ReducedIsOwnTime(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let rank = env.b.rank();
        for t in &mut o.tables {
            for row in &mut t.rows {
                if row.status == RowStatus::Ok {
                    row.reduced_ns = row.per_rank_ns[rank];
                }
            }
        }
        Ok(o)
    }
}

/// Gives every run of a choice the whole timeout from the run's own start (`deadline =
/// Instant::now() + timeout` in the run), not what is left of the call's: a choice that hangs
/// late in the call is waited for past the call's deadline.
struct DeadlinePerRun(Tuner);
impl<B: Backend> Autotuner<B> for DeadlinePerRun {
    fn new(cfg: Config) -> Self {
        DeadlinePerRun(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let timeout = self.0.config().timeout;
        let w = wrap_choices(requests, |_, run| {
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                let fresh = ChoiceCtx {
                    b: ctx.b,
                    inst: ctx.inst,
                    phase: ctx.phase,
                    deadline: Instant::now() + timeout,
                    op_timeout: ctx.op_timeout,
                };
                run(&fresh, x)
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

/// A rank that finds itself named "never reported" in an agreed table (it was the slow one)
/// concludes it timed out and takes the op's declared default, alone: the awake ranks keep the
/// winner they timed before the timeout.
struct LateRankTakesDefault(Tuner);
impl<B: Backend> Autotuner<B> for LateRankTakesDefault {
    fn new(cfg: Config) -> Self {
        LateRankTakesDefault(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let rank = env.b.rank();
        for (t, r) in o.tables.iter_mut().zip(requests) {
            let late = t.rows.iter().any(
                |row| matches!(&row.status, RowStatus::Failed(c) if c.iter().any(|(q, why)| *q == rank && why.contains("never reported"))),
            );
            if late && !t.from_cache && t.winner != r.default {
                t.warnings.push(format!("rank {rank}: this rank timed out: using the default `{}`", r.default));
                t.winner = r.default.clone();
                t.defaulted = true;
            }
        }
        Ok(o)
    }
}

/// Outside a world (no store) it does not benchmark: every op takes its declared default, with a
/// warning ("if not dist.is_initialized(): return default").
struct NoStoreTakesDefault(Tuner);
impl<B: Backend> Autotuner<B> for NoStoreTakesDefault {
    fn new(cfg: Config) -> Self {
        NoStoreTakesDefault(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        if env.store.is_some() {
            return <Tuner as Autotuner<B>>::tune(&self.0, env, requests);
        }
        let ws = env.b.world_size();
        let why = "no store (outside a world): not tuned".to_string();
        let tables = requests
            .iter()
            .map(|r| Table {
                inst: r.inst.clone(),
                world_size: ws,
                policy: self.0.config().policy,
                rows: r
                    .choices
                    .iter()
                    .map(|c| Row {
                        choice: c.name.clone(),
                        per_rank_ns: vec![None; ws],
                        reduced_ns: None,
                        status: RowStatus::NotRun(why.clone()),
                    })
                    .collect(),
                winner: r.default.clone(),
                defaulted: true,
                from_cache: false,
                timed: Duration::ZERO,
                elapsed: Duration::ZERO,
                sync: Duration::ZERO,
                warnings: vec![format!("no store: every op uses its declared default `{}`", r.default)],
            })
            .collect();
        Ok(Outcome { tables, warnings: vec![why], presyncs: 0, presync_time: Duration::ZERO, missing: vec![], elapsed: Duration::ZERO })
    }
}

/// Names its store keys by its own call count (`mytuner/call<n>`), not by the tag it is given:
/// two groups tuning at the same time share every key, and the first writer decides for both.
static CALLS: AtomicUsize = AtomicUsize::new(0);
struct OwnCallCountTag(Tuner);
impl<B: Backend> Autotuner<B> for OwnCallCountTag {
    fn new(cfg: Config) -> Self {
        OwnCallCountTag(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let n = CALLS.fetch_add(1, Ordering::SeqCst);
        let e = Env {
            b: env.b,
            store: env.store,
            tag: format!("mytuner/call{n}"),
            group_ranks: env.group_ranks.clone(),
            op_timeout: env.op_timeout,
        };
        <Tuner as Autotuner<B>>::tune(&self.0, &e, requests)
    }
}

/// Screening compares the first element of the output only. (Modelled from outside: a screening
/// output whose first bad index is not 0 is replaced by the expected output before the inner
/// tuner checks it.)
struct ScreensFirstElementOnly(Tuner);
impl<B: Backend> Autotuner<B> for ScreensFirstElementOnly {
    fn new(cfg: Config) -> Self {
        ScreensFirstElementOnly(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let (b, rank, ws) = (env.b, env.b.rank(), env.b.world_size());
        let mut exps = Vec::new();
        for r in requests {
            let i = &r.inst;
            let mut all = inputs(seed_for(&format!("autotune/{}", i.key())), ws, i.dtype, &i.shape, i.reduce, InputKind::Exact);
            concord_fixtures::widen(&mut all, i.reduce); // as the reference tuner screens
            let exp = expected(&i.collective(ws), &all, &Semantics::of(&b.capabilities()))
                .map_err(|e| TuneError::BadRequest(format!("{i}: {e:?}")))?;
            exps.push(exp.outputs[rank].clone());
        }
        let w = wrap_choices(requests, |r, run| {
            let exp = exps[requests.iter().position(|q| std::ptr::eq(q, r)).expect("one of the requests")].clone();
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                let out = run(ctx, x)?;
                if ctx.phase != Phase::Screen {
                    return Ok(out);
                }
                match compare(&ctx.b.download(&out)?, &exp, Tolerance::Exact) {
                    Err(m) if m.index > 0 => ctx.b.upload(&exp),
                    _ => Ok(out),
                }
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

/// Ignores the configured warm-up count (no warm-up run), keeping the timed runs.
struct IgnoresWarmupSetting(Tuner);
impl<B: Backend> Autotuner<B> for IgnoresWarmupSetting {
    fn new(mut cfg: Config) -> Self {
        cfg.warmup = 0;
        IgnoresWarmupSetting(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        <Tuner as Autotuner<B>>::tune(&self.0, env, requests)
    }
}

/// PyTorch's rule for every failure, not only timeouts: after a choice fails (an error, a wrong
/// output), every later choice is marked not run.
struct StopsAfterAnyFailure(Tuner);
impl<B: Backend> Autotuner<B> for StopsAfterAnyFailure {
    fn new(cfg: Config) -> Self {
        StopsAfterAnyFailure(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let policy = self.0.config().policy;
        for (t, r) in o.tables.iter_mut().zip(requests) {
            let mut failed: Option<String> = None;
            for row in &mut t.rows {
                match (&failed, &row.status) {
                    (None, RowStatus::Failed(_)) => failed = Some(row.choice.clone()),
                    (Some(f), RowStatus::Ok) => {
                        row.status = RowStatus::NotRun(format!("choice `{f}` failed before it"));
                        row.per_rank_ns = vec![None; t.world_size];
                        row.reduced_ns = None;
                    }
                    _ => {}
                }
            }
            if !t.from_cache && failed.is_some() {
                t.winner = r.default.clone();
                t.defaulted = true;
                repick(t, |v| policy.reduce(v));
                if t.defaulted {
                    t.warnings.push(format!("every choice of {} is inf: the default `{}`", t.inst, r.default));
                }
            }
        }
        Ok(o)
    }
}

/// One `tune` call per op (each with its own pre-sync and its own deadline), as the seed's V1
/// does; the pre-syncs are counted honestly.
struct TunesEachOpApart(Tuner);
impl<B: Backend> Autotuner<B> for TunesEachOpApart {
    fn new(cfg: Config) -> Self {
        TunesEachOpApart(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut all: Option<Outcome> = None;
        for (i, r) in requests.iter().enumerate() {
            let e = Env {
                b: env.b,
                store: env.store,
                tag: format!("{}/apart{i}", env.tag),
                group_ranks: env.group_ranks.clone(),
                op_timeout: env.op_timeout,
            };
            let o = <Tuner as Autotuner<B>>::tune(&self.0, &e, std::slice::from_ref(r))?;
            match &mut all {
                None => all = Some(o),
                Some(a) => {
                    a.tables.extend(o.tables);
                    a.warnings.extend(o.warnings);
                    a.presyncs += o.presyncs;
                    a.presync_time += o.presync_time;
                    a.missing.extend(o.missing);
                    a.elapsed += o.elapsed;
                }
            }
        }
        all.ok_or_else(|| TuneError::BadRequest("no requests".into()))
    }
}

/// A choice that timed out or went unreported on some rank, but was timed on the others, is kept
/// as timed: reduced over the ranks that reported (the slow rank's time is simply absent).
struct TimeoutKeptOnOthers(Tuner);
impl<B: Backend> Autotuner<B> for TimeoutKeptOnOthers {
    fn new(cfg: Config) -> Self {
        TimeoutKeptOnOthers(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let policy = self.0.config().policy;
        for t in &mut o.tables {
            let mut kept = Vec::new();
            for row in &mut t.rows {
                let RowStatus::Failed(causes) = &row.status else { continue };
                let timeouts = causes.iter().all(|(_, c)| c.starts_with("timeout") || c.contains("never reported"));
                let some: Vec<u64> = row.per_rank_ns.iter().flatten().copied().collect();
                if timeouts && !some.is_empty() {
                    row.status = RowStatus::Ok;
                    row.reduced_ns = Some(policy.reduce(&some));
                    kept.push(format!("`{}`", row.choice));
                }
            }
            if !kept.is_empty() {
                t.warnings.retain(|w| !kept.iter().any(|c| w.contains(c.as_str())));
                let mut best: Option<(String, u64)> = None;
                for row in &t.rows {
                    if let (RowStatus::Ok, Some(x)) = (&row.status, row.reduced_ns) {
                        if best.as_ref().is_none_or(|(_, b)| x < *b) {
                            best = Some((row.choice.clone(), x));
                        }
                    }
                }
                if let Some((w, _)) = best {
                    t.winner = w;
                    t.defaulted = false;
                }
            }
        }
        Ok(o)
    }
}

/// A choice that fails during screening on this rank is retried once on this rank, silently
/// (a "flaky kernel" retry): the retry issues its collectives on this rank alone.
struct RetriesFailedChoice(Tuner);
impl<B: Backend> Autotuner<B> for RetriesFailedChoice {
    fn new(cfg: Config) -> Self {
        RetriesFailedChoice(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let w = wrap_choices(requests, |_, run| {
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                let first = catch_unwind(AssertUnwindSafe(|| run(ctx, x)));
                match first {
                    Ok(Ok(out)) => Ok(out),
                    _ if ctx.phase == Phase::Screen => run(ctx, x),
                    Ok(Err(e)) => Err(e),
                    Err(p) => resume_unwind(p),
                }
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

// ---- The twentieth hunt (helper hunt20): autotuners that shipped, from their issue threads ----

/// NCCL's tuning model with a rank-local term (NVIDIA/nccl #1136 "nccl hangs in clusters with
/// mixed cpu vendors (Intel/AMD), due to inconsistent ALGO/PROTO selection in tuning"): since
/// 2.18 the latency of each algorithm includes a network overhead per step that depends on the
/// *local* CPU vendor (1 µs on Intel, 2 µs on AMD), so ranks on different hosts switch algorithm
/// at different sizes and issue different collectives. Ported as: each rank takes the agreed
/// table, adds its own overhead (1 µs on even ranks, 2 µs on odd ranks: two host kinds) per step
/// of each candidate (candidate `i` takes `2 (ws - 1) i` steps, later candidates being the
/// longer pipelines), and picks the cheapest by that model, without agreement.
struct RankLocalCostModel(Tuner);
impl<B: Backend> Autotuner<B> for RankLocalCostModel {
    fn new(cfg: Config) -> Self {
        RankLocalCostModel(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let mut o = <Tuner as Autotuner<B>>::tune(&self.0, env, requests)?;
        let (rank, ws) = (env.b.rank(), env.b.world_size() as u64);
        let overhead_ns: u64 = if rank % 2 == 0 { 1_000 } else { 2_000 };
        for t in &mut o.tables {
            if t.from_cache {
                continue;
            }
            let mut best: Option<(String, u64)> = None;
            for (i, row) in t.rows.iter().enumerate() {
                if let (RowStatus::Ok, Some(x)) = (&row.status, row.reduced_ns) {
                    let modeled = x + overhead_ns * 2 * ws.saturating_sub(1) * i as u64;
                    if best.as_ref().is_none_or(|(_, b)| modeled < *b) {
                        best = Some((row.choice.clone(), modeled));
                    }
                }
            }
            if let Some((w, _)) = best {
                t.winner = w;
            }
        }
        Ok(o)
    }
}

/// Helion's distributed autotuning before its fix (pytorch/helion PR #1532 "helion distributed
/// kernel autotuning": "Both benchmarking functions will decide the number of times to run the
/// kernel based on a time budget and an estimation of a single run of the kernel. The estimation
/// is based on runtime data and can vary across different GPUs. This causes different GPUs to
/// run the kernel different number of times and causes a stuck job."). Ported as: each rank
/// times one run of the choice in its last warm-up run (its own estimate) and, in its first
/// timed run, runs the choice `max(1, 100 ms / estimate)` times (triton's `do_bench` arithmetic
/// with its default `rep` of 100 ms), so ranks whose estimates differ issue different numbers of
/// collectives. (With a 25 ms budget, likely a loaded machine where one run took 25 ms or more on both
/// ranks, gave both ranks one run of the first choices: the counts first differed in a send / recv
/// choice, whose extra send is a timeout, not the named `op_mismatch`; it failed its test twice at
/// the run's start, load 20-30. Equal counts need both estimates in one bucket of 100 ms / k: the
/// larger the counts, the less likely.)
struct BenchCountFromOwnEstimate(Tuner);
impl<B: Backend> Autotuner<B> for BenchCountFromOwnEstimate {
    fn new(cfg: Config) -> Self {
        BenchCountFromOwnEstimate(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        const BUDGET: Duration = Duration::from_millis(100);
        let warmup = self.0.config().warmup;
        let w = wrap_choices(requests, |_, run| {
            let estimate = Arc::new(std::sync::Mutex::new(None::<Duration>));
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                let last_warmup = warmup.saturating_sub(1);
                let estimating = match ctx.phase {
                    Phase::Warmup(i) => i == last_warmup,
                    Phase::Screen => warmup == 0,
                    _ => false,
                };
                if estimating {
                    let t0 = Instant::now();
                    let out = run(ctx, x)?;
                    *estimate.lock().unwrap_or_else(|e| e.into_inner()) = Some(t0.elapsed());
                    return Ok(out);
                }
                if ctx.phase == Phase::Timed(0) {
                    let est = estimate.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(BUDGET);
                    let reps = (BUDGET.as_nanos() / est.as_nanos().max(1)).max(1) as usize;
                    for _ in 1..reps {
                        run(ctx, x)?;
                    }
                }
                run(ctx, x)
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

/// The nineteenth review (finding 3): a hand-written timing loop that checks the choice in
/// screening but ignores the result of its warm-up and timed runs (`let _ = run(); t.push(..)`):
/// a choice that passes screening and then fails (a registration pool or IPC-handle table that
/// runs out, a one-shot workspace) is timed as very fast and can win.
struct TimedErrorsIgnored(Tuner);
impl<B: Backend> Autotuner<B> for TimedErrorsIgnored {
    fn new(cfg: Config) -> Self {
        TimedErrorsIgnored(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let w = wrap_choices(requests, |_, run| {
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| match (run(ctx, x), ctx.phase) {
                (Err(_), Phase::Warmup(_) | Phase::Timed(_)) => Ok(x.clone()),
                (r, _) => r,
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

/// Declares Median and reduces per-rank times with Avg (review19, finding 7: at 2 ranks the two
/// agree, and no case ran Median at 3 or more).
struct MedianIsAvg(Tuner, Policy);
impl<B: Backend> Autotuner<B> for MedianIsAvg {
    fn new(mut cfg: Config) -> Self {
        let declared = cfg.policy;
        if cfg.policy == Policy::Median {
            cfg.policy = Policy::Avg;
        }
        MedianIsAvg(inner::<B>(&cfg), declared)
    }
    fn policy(&self) -> Policy {
        self.1
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        <Tuner as Autotuner<B>>::tune(&self.0, env, requests)
    }
}

/// The warm-up runs (a loop of their own, written before the timed loop got its deadline
/// handling) wait with the op timeout, not what is left of the call's deadline (review19,
/// finding 6): a peer that hangs in a warm-up run holds the live ranks for the op timeout.
struct WarmupWithoutDeadline(Tuner);
impl<B: Backend> Autotuner<B> for WarmupWithoutDeadline {
    fn new(cfg: Config) -> Self {
        WarmupWithoutDeadline(inner::<B>(&cfg))
    }
    fn policy(&self) -> Policy {
        self.0.config().policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let w = wrap_choices(requests, |_, run| {
            Arc::new(move |ctx: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                if matches!(ctx.phase, Phase::Warmup(_)) {
                    let far = ChoiceCtx {
                        b: ctx.b,
                        inst: ctx.inst,
                        phase: ctx.phase,
                        deadline: Instant::now() + ctx.op_timeout,
                        op_timeout: ctx.op_timeout,
                    };
                    return run(&far, x);
                }
                run(ctx, x)
            })
        });
        <Tuner as Autotuner<B>>::tune(&self.0, env, &w)
    }
}

/// Every autotuner of this test behind one type, so the autotune suite is compiled once, not
/// once per broken tuner (21 instantiations took 25 s of the CI build, 6 took 6 s): a worker
/// builds the one its backend entry names (`CHOSEN`, set in `main` from the worker's
/// environment); `control_tuner` is the reference.
static CHOSEN: OnceLock<String> = OnceLock::new();

struct Chosen(Box<dyn Autotuner<ShmBackend>>);

/// Builds one autotuner of this test.
type Make = fn(Config) -> Box<dyn Autotuner<ShmBackend>>;

fn build<A: Autotuner<ShmBackend>>(cfg: Config) -> Box<dyn Autotuner<ShmBackend>> {
    Box::new(A::new(cfg))
}

/// The maker of each entry's autotuner, by entry name.
fn maker(name: &str) -> Option<Make> {
    Some(match name {
        "control_tuner" => build::<Tuner>,
        "local_fallback" => build::<Faulty<LOCAL_FALLBACK>>,
        "avg_declared_max" => build::<Faulty<AVG_DECLARED_MAX>>,
        "collective_timeout" => build::<Faulty<COLLECTIVE_TIMEOUT>>,
        "no_screening" => build::<Faulty<NO_SCREENING>>,
        "unagreed_cache" => build::<Faulty<UNAGREED_CACHE>>,
        "sorted_tables" => build::<SortedTables>,
        "min_over_ranks" => build::<MinOverRanks>,
        "own_times_only" => build::<OwnTimesOnly>,
        "failure_as_zero" => build::<FailureAsZero>,
        "single_cold_run" => build::<SingleColdRun>,
        "cache_ignores_dtype" => build::<LooseCache<NO_DTYPE>>,
        "cache_ignores_reduce_op" => build::<LooseCache<NO_REDUCE_OP>>,
        "cache_ignores_candidates" => build::<LooseCache<NO_CANDIDATES>>,
        "op_timeout_only" => build::<OpTimeoutOnly>,
        "ignores_applicability" => build::<IgnoresApplicability>,
        "declares_max_always" => build::<DeclaresMaxAlways>,
        "drops_last_candidate" => build::<DropsLastCandidate>,
        "rank0_decides_alone" => build::<Rank0DecidesAlone>,
        "screens_on_rank0_only" => build::<ScreensOnRank0Only>,
        "index_into_full_list" => build::<IndexIntoFullList>,
        // The eleventh hunt.
        "mean_of_runs" => build::<Faulty<MEAN_OF_RUNS>>,
        // The fourth review (helper reviewd).
        "screens_small_integers" => build::<Faulty<SMALL_INTEGERS>>,
        "cache_ignores_group" => build::<LooseCache<NO_GROUP>>,
        // review11: the reference tuner's own key once lacked the policy; no case varied the shape.
        "cache_ignores_shape" => build::<LooseCache<NO_SHAPE>>,
        "cache_ignores_policy" => build::<LooseCache<NO_POLICY>>,
        "caches_the_default" => build::<CachesTheDefault>,
        "reduced_is_own_time" => build::<ReducedIsOwnTime>,
        "deadline_per_run" => build::<DeadlinePerRun>,
        "late_rank_takes_default" => build::<LateRankTakesDefault>,
        "no_store_takes_default" => build::<NoStoreTakesDefault>,
        "own_call_count_tag" => build::<OwnCallCountTag>,
        "screens_first_element_only" => build::<ScreensFirstElementOnly>,
        "ignores_warmup_setting" => build::<IgnoresWarmupSetting>,
        "stops_after_any_failure" => build::<StopsAfterAnyFailure>,
        "tunes_each_op_apart" => build::<TunesEachOpApart>,
        "timeout_kept_on_others" => build::<TimeoutKeptOnOthers>,
        "retries_failed_choice" => build::<RetriesFailedChoice>,
        // The twentieth hunt.
        "rank_local_cost_model" => build::<RankLocalCostModel>,
        "bench_count_from_own_estimate" => build::<BenchCountFromOwnEstimate>,
        // The eleventh review (helper impl11).
        "leader_decision" => build::<Faulty<LEADER_DECISION>>,
        // The nineteenth review (helper impl19).
        "timed_errors_ignored" => build::<TimedErrorsIgnored>,
        // Helper left20 (review19's findings 6 and 7).
        "r19_warmup_without_deadline" => build::<WarmupWithoutDeadline>,
        "r19_median_is_avg" => build::<MedianIsAvg>,
        _ => return None,
    })
}

impl Autotuner<ShmBackend> for Chosen {
    fn new(cfg: Config) -> Self {
        let name = CHOSEN.get().map(String::as_str).unwrap_or("(not a worker)");
        let make = maker(name).unwrap_or_else(|| panic!("faulty_autotuners: no autotuner for the entry `{name}`"));
        Chosen(make(cfg))
    }
    fn policy(&self) -> Policy {
        self.0.policy()
    }
    fn tune(&self, env: &Env<'_, ShmBackend>, requests: &[Request<ShmBackend>]) -> Result<Outcome, TuneError> {
        self.0.tune(env, requests)
    }
}

fn chosen_cases() -> Vec<Case<ShmBackend>> {
    concord_suites::autotune::cases::<ShmBackend, Chosen>()
}

fn e(name: &str) -> BackendEntry {
    assert!(maker(name).is_some(), "no autotuner for the entry `{name}`");
    BackendEntry::new::<ShmBackend>(name, 0, chosen_cases)
        .with_rerun(format!("cargo test -p concord-suites --test faulty_autotuners -- --exact faulty::{name}_is_caught # case"))
}

fn expectations() -> Vec<(BackendEntry, &'static [&'static str], &'static [&'static str])> {
    vec![
        (e("local_fallback"), &["autotune::hazard::panic_on_one_rank::ws2"], &["rank-local fallback", "panics_on_rank1", "rank="]),
        (
            e("avg_declared_max"),
            &["autotune::hazard::max_vs_avg::ws2"],
            &["declared policy max", "hides the slow rank", "slow_on_rank1", "rank="],
        ),
        (
            e("collective_timeout"),
            &["autotune::seed::timeout_rank1_sleeps_10s::ws2"],
            &["waited on the slow peer", "timeout decided by a collective", "rank 0 ended"],
        ),
        (
            e("no_screening"),
            &["autotune::hazard::fast_but_wrong::ws2"],
            &["not rejected before timing", "fast_but_wrong", "first bad index"],
        ),
        (e("unagreed_cache"), &["autotune::cache::partial_hit_retunes::ws2"], &["cache not agreed across ranks", "rank 1"]),
        // Written outside the reference tuner.
        (e("sorted_tables"), &["autotune::seed::three_ops::ws2"], &["tables out of order", "rank="]),
        (
            e("min_over_ranks"),
            &["autotune::hazard::max_vs_avg::ws2"],
            &["under the declared policy max the reference model picks `uniform`", "rank="],
        ),
        (e("own_times_only"), &["autotune::hazard::max_vs_avg::ws2"], &["ranks ended with different winners", "not from its own times"]),
        (
            e("failure_as_zero"),
            &["autotune::hazard::error_on_one_rank::ws3"],
            &["does not hold choice `errors_on_rank2` inf", "injected error", "rank="],
        ),
        (
            e("single_cold_run"),
            &["autotune::hazard::slow_first_call::ws2"],
            &["the configured warm-up runs (2) must be untimed", "lazy_init", "rank="],
        ),
        (
            e("cache_ignores_dtype"),
            &["autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2"],
            &["a cache key without the dtype", "rank="],
        ),
        (
            e("cache_ignores_reduce_op"),
            &["autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2"],
            &["a cache key without the reduce op", "rank="],
        ),
        (
            e("cache_ignores_shape"),
            &["autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2"],
            &["a cache key without the shape", "rank="],
        ),
        (
            e("cache_ignores_policy"),
            &["autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2"],
            &["a cache key without the policy", "under policy avg", "rank="],
        ),
        (
            e("cache_ignores_candidates"),
            &["autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2"],
            &["a cache key without the candidate list", "rank="],
        ),
        (
            e("op_timeout_only"),
            &["autotune::hazard::rank_missing_at_presync::ws3"],
            &["a wait without the deadline", "while rank 2 was slow"],
        ),
        (e("ignores_applicability"), &["autotune::hazard::not_applicable_is_skipped::ws3"], &["`Choice::applies` was ignored", "rank="]),
        (e("declares_max_always"), &["autotune::hazard::max_vs_avg::ws2"], &["asked for policy avg, the autotuner declares max", "rank="]),
        (e("drops_last_candidate"), &["autotune::seed::one_op::ws2"], &["a candidate silently dropped", "missing: [", "rank="]),
        (
            e("rank0_decides_alone"),
            &["autotune::hazard::max_vs_avg::ws2"],
            &["ranks ended with different winners", "rank 0: [slow_on_rank1]; rank 1: [uniform]"],
        ),
        (
            e("screens_on_rank0_only"),
            &["autotune::hazard::wrong_on_one_rank::ws2"],
            &["an output checked on some ranks only", "wrong_on_rank1", "rank="],
        ),
        (
            e("index_into_full_list"),
            &["autotune::hazard::not_applicable_is_skipped::ws3"],
            &["winner `pow2_only` was skipped as not applicable", "rank="],
        ),
        // The eleventh hunt (helper hunt11): each survived the suite before its case was written,
        // but the last three (caught by cases that were already there).
        (
            e("mean_of_runs"),
            &["autotune::hazard::slow_first_call::ws2"],
            &["must be the median of its timed runs (3), not their mean", "`hiccup`", "rank="],
        ),
        (e("cache_ignores_group"), &["autotune::cache::key_covers_the_group::ws4"], &["a cache key without the group", "rank="]),
        (e("caches_the_default"), &["autotune::cache::default_not_cached::ws2"], &["only a measured winner may be cached", "rank="]),
        (
            e("reduced_is_own_time"),
            &["autotune::hazard::max_vs_avg::ws2"],
            &["ranks hold different reduced times", "the reduced column must be the policy's reduction of every rank's time"],
        ),
        (
            e("deadline_per_run"),
            &["autotune::hazard::hang_in_timed_runs::ws2"],
            &["beyond the autotune timeout 2000 ms", "while rank 1 was slow"],
        ),
        (
            e("late_rank_takes_default"),
            &["autotune::hazard::hang_after_last_timed_run::ws2"],
            &["ranks ended with different winners", "rank 0: [native]; rank 1: [after]"],
        ),
        (e("no_store_takes_default"), &["autotune::no_store::ws1"], &["must still be benchmarked locally", "not timed [native"]),
        (
            e("own_call_count_tag"),
            &["autotune::subgroup::halves_tune_apart::ws4"],
            &["took the other half's decision", "agreements were not kept apart"],
        ),
        (e("screens_first_element_only"), &["autotune::hazard::fast_but_wrong::ws2"], &["wrong_in_last_element", "first bad index 1023"]),
        (
            e("ignores_warmup_setting"),
            &["autotune::hazard::slow_first_call::ws2"],
            &["the configured warm-up runs (2) must be untimed", "`lazy_init`", "rank="],
        ),
        (
            e("timeout_kept_on_others"),
            &["autotune::hazard::hang_after_last_timed_run::ws2"],
            &["kept as timed over the ranks that reported", "hangs_after_its_runs_on_rank1"],
        ),
        (
            e("stops_after_any_failure"),
            &["autotune::hazard::error_on_one_rank::ws3"],
            &["an error (not a timeout) leaves the communicator usable", "rank="],
        ),
        (e("tunes_each_op_apart"), &["autotune::seed::three_ops::ws2"], &["3 op(s) tuned with 3 pre-sync(s); one call pays exactly 1"]),
        (
            e("retries_failed_choice"),
            &["autotune::hazard::panic_on_one_rank::ws2"],
            &["does not hold choice `panics_on_rank1` inf", "rank="],
        ),
        // The twentieth hunt (helper hunt20): autotuner bugs that shipped. The survey caught
        // both before any case was written; rank_local_cost_model only where two built-in
        // choices happened to be within its µs term (noise), so it got a case of near-ties.
        (e("rank_local_cost_model"), &["autotune::hazard::near_ties_decided_from_table::ws4"], &["twin", "rank="]),
        // The fourth review (helper reviewd): screening on the fixtures' small integers, which
        // an f16 wire carries exactly (survived the survey before the case was written).
        (
            e("screens_small_integers"),
            &["autotune::hazard::lossy_but_exact_on_integers::ws2"],
            &["does not hold choice `f16_wire` inf", "screening inputs must fill the significand", "rank="],
        ),
        // The eleventh review (helper impl11): a leader-based decision whose followers wait for
        // rank 0 with the op timeout (survived the survey before the rank-0 cases were written).
        (
            e("leader_decision"),
            &["autotune::hazard::rank0_missing_at_presync::ws3"],
            &["while rank 0 was slow", "a wait without the deadline"],
        ),
        // The nineteenth review (helper impl19): warm-up / timed runs whose errors are ignored
        // (survived the survey before `errors_in_timed_run` was added).
        (
            e("timed_errors_ignored"),
            &["autotune::hazard::error_on_one_rank::ws3"],
            &["does not hold choice `errors_in_timed_run` inf", "injected error in a timed run", "rank="],
        ),
        // Helper left20: review19's findings 6 and 7 (each survived the survey before its case
        // was written).
        (
            e("r19_warmup_without_deadline"),
            &["autotune::hazard::hang_in_warmup::ws2"],
            &["beyond the autotune timeout 2000 ms", "while rank 1 was slow"],
        ),
        (
            e("r19_median_is_avg"),
            &["autotune::hazard::median_vs_avg::ws3"],
            &["under the declared policy median the reference model picks `uniform`", "rank="],
        ),
        (
            e("bench_count_from_own_estimate"),
            &["autotune::builtin::ws2"],
            &["did not pass on a correct backend", "op_mismatch", "ops (and sequence numbers) differ across ranks"],
        ),
    ]
}

/// Every entry's name, the control's first: the broken ones are `ALL[1..]`.
const ALL: &[&str] = &[
    "control_tuner",
    "local_fallback",
    "avg_declared_max",
    "collective_timeout",
    "no_screening",
    "unagreed_cache",
    "sorted_tables",
    "min_over_ranks",
    "own_times_only",
    "failure_as_zero",
    "single_cold_run",
    "cache_ignores_dtype",
    "cache_ignores_reduce_op",
    "cache_ignores_candidates",
    "op_timeout_only",
    "ignores_applicability",
    "declares_max_always",
    "drops_last_candidate",
    "rank0_decides_alone",
    "screens_on_rank0_only",
    "index_into_full_list",
    "mean_of_runs",
    "cache_ignores_group",
    "caches_the_default",
    "reduced_is_own_time",
    "deadline_per_run",
    "late_rank_takes_default",
    "no_store_takes_default",
    "own_call_count_tag",
    "screens_first_element_only",
    "ignores_warmup_setting",
    "stops_after_any_failure",
    "tunes_each_op_apart",
    "timeout_kept_on_others",
    "retries_failed_choice",
    "rank_local_cost_model",
    "bench_count_from_own_estimate",
    "screens_small_integers",
    "cache_ignores_shape",
    "cache_ignores_policy",
    "leader_decision",
    "timed_errors_ignored",
    "r19_warmup_without_deadline",
    "r19_median_is_avg",
];

/// The survey (`-- --ignored survey::`): each autotuner against EVERY case of the suite, as a
/// hunt runs a new broken autotuner before writing the case that catches it. A broken one
/// passes its trial when some case fails it (the failing cases are printed); the control when
/// every case passes.
fn survey(name: &'static str) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(format!("survey::{name}"), move || {
        let entry = e(name);
        let mut failed = Vec::new();
        for info in entry.cases() {
            let (verdict, msg, _) = run_case(&entry, &info);
            if verdict != Verdict::Passed {
                // The check's own line (`backend=… rank=…: what`), else the verdict's first.
                let line = msg.lines().find(|l| l.contains("rank=")).or_else(|| msg.lines().find(|l| !l.trim().is_empty()));
                let first = line.unwrap_or("").trim().chars().take(400).collect::<String>();
                failed.push(format!("{}: {first}", info.id));
            }
        }
        println!("survey {name}: {} case(s) failed{}", failed.len(), failed.iter().map(|f| format!("\n  {f}")).collect::<String>());
        match (name == "control_tuner", failed.is_empty()) {
            (true, false) => Err(format!("the reference autotuner failed {} case(s)", failed.len()).into()),
            (false, true) => Err(format!("{name} SURVIVED: it passes every case of the autotune suite").into()),
            _ => Ok(()),
        }
    })
    .with_ignored_flag(true)
}

fn case_info(entry: &BackendEntry, id: &str) -> concord_suites::run::CaseInfo {
    let full = format!("{}::{id}", entry.name);
    entry.cases().into_iter().find(|c| c.id == full).unwrap_or_else(|| panic!("no case {full}"))
}

fn main() {
    if let Some(env) = concord_harness::worker::WorkerEnv::from_env() {
        let _ = CHOSEN.set(env.backend);
    }
    let control = e("control_tuner");
    let entries: Vec<BackendEntry> = ALL.iter().map(|n| e(n)).collect();
    concord_suites::run::dispatch_child(&entries);

    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (entry, ids, words) in expectations() {
        let name = format!("faulty::{}_is_caught", entry.name);
        trials.push(libtest_mimic::Trial::test(name, move || {
            for id in ids {
                let (verdict, msg, _) = run_case(&entry, &case_info(&entry, id));
                let Verdict::Failed(failures) = &verdict else {
                    return Err(format!("{}: the broken autotuner was not caught by {id}: verdict {verdict:?}", entry.name).into());
                };
                if failures.is_empty() || failures.iter().any(|f| f.kind() != "reported") {
                    return Err(format!("{}: {id} failed, but not by a reported check: {failures:?}\n{msg}", entry.name).into());
                }
                for w in words {
                    if !msg.contains(w) {
                        return Err(format!("{}: the failure of {id} does not mention `{w}`:\n{msg}", entry.name).into());
                    }
                }
            }
            Ok(())
        }));
    }
    let mut all_ids: Vec<&'static str> = expectations().into_iter().flat_map(|(_, ids, _)| ids.iter().copied()).collect();
    all_ids.sort_unstable();
    all_ids.dedup();
    trials.push(libtest_mimic::Trial::test("faulty::control_tuner_passes_the_same_cases", move || {
        for id in &all_ids {
            let (verdict, msg, _) = run_case(&control, &case_info(&control, id));
            if verdict != Verdict::Passed {
                return Err(format!("the reference autotuner did not pass {id}: {verdict:?}\n{msg}").into());
            }
        }
        Ok(())
    }));
    trials.extend(ALL.iter().map(|n| survey(n)));
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    concord_harness::runner::Pool::global().shutdown();
    std::process::exit(code);
}
