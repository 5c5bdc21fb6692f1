//! The reference autotuner: the protocol of the crate docs.

use crate::cache::{self, Cache};
use crate::exchange::{agree, exchange, exchange_led};
use crate::table::{Outcome, RankStatus, Row, RowStatus, Table};
use crate::{median, names_hash, Autotuner, Choice, ChoiceCtx, Config, Env, OpInstance, Phase, Policy, Request, TuneError};
use concord_core::{Backend, CollectiveError, Tensor};
use concord_fixtures::InputKind;
use concord_oracle::{compare, Semantics, Tolerance};
use serde::{Deserialize, Serialize};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The autotuner of this crate (see the crate docs for the protocol).
pub struct Tuner {
    cfg: Config,
}

impl Tuner {
    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

impl<B: Backend> Autotuner<B> for Tuner {
    fn new(cfg: Config) -> Self {
        Tuner { cfg }
    }
    fn policy(&self) -> Policy {
        self.cfg.policy
    }
    fn tune(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        self.run(env, requests)
    }
}

/// One op as a rank announces it in the pre-sync.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct PresyncOp {
    op: String,
    cands: Vec<String>,
    hash: String,
    /// This rank's cached winner, if it hit.
    hit: Option<String>,
}

struct Plan {
    /// Per choice, why it is skipped (not applicable, or a declared gap); `None` for a candidate.
    skip: Vec<Option<String>>,
    /// The candidates' names, in order.
    names: Vec<String>,
    hash: String,
    cache_key: String,
    hit: Option<String>,
}

fn store_err(e: concord_store::StoreError) -> TuneError {
    TuneError::Store(e.to_string())
}

fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

/// Runs one choice, turning an error or a panic into a status.
fn guarded<B: Backend>(c: &Choice<B>, ctx: &ChoiceCtx<'_, B>, x: &B::Buffer) -> Result<B::Buffer, RankStatus> {
    match catch_unwind(AssertUnwindSafe(|| (c.run)(ctx, x))) {
        Err(p) => Err(RankStatus::Fail(format!("panicked: {}", panic_msg(p.as_ref())))),
        Ok(Err(e @ CollectiveError::Timeout { .. })) => {
            let s = e.to_string();
            Err(RankStatus::Fail(if s.starts_with("timeout") { s } else { format!("timeout: {s}") }))
        }
        Ok(Err(e)) => Err(RankStatus::Fail(format!("error: {e} [{}]", e.name()))),
        Ok(Ok(out)) => Ok(out),
    }
}

fn fmt_ranks(v: &[usize]) -> String {
    v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

impl Tuner {
    /// The agreement of one decision ([`exchange`]; under the self-test hazard
    /// `leader_decision`, the leader-based one).
    fn exchange<B: Backend>(
        &self,
        env: &Env<'_, B>,
        store: &concord_store::Store,
        prefix: &str,
        mine: &str,
        deadline: Instant,
    ) -> Result<Vec<Option<String>>, concord_store::StoreError> {
        let (rank, ws) = (env.b.rank(), env.b.world_size());
        if self.cfg.hazards.leader_decision {
            return exchange_led(store, prefix, rank, ws, mine, deadline, env.op_timeout);
        }
        exchange(store, prefix, rank, ws, mine, deadline)
    }

    fn run<B: Backend>(&self, env: &Env<'_, B>, requests: &[Request<B>]) -> Result<Outcome, TuneError> {
        let cfg = &self.cfg;
        let start = Instant::now();
        let deadline = start + cfg.timeout;
        let (b, rank, ws) = (env.b, env.b.rank(), env.b.world_size());
        let mut warnings = Vec::new();
        for r in requests {
            if !r.choices.iter().any(|c| c.name == r.default) {
                return Err(TuneError::BadRequest(format!("{}: the default `{}` is not among its choices", r.inst, r.default)));
            }
            if r.choices.is_empty() {
                return Err(TuneError::BadRequest(format!("{}: no choices", r.inst)));
            }
        }
        let mut cache = cfg.cache.as_ref().map(|p| Cache::load(p));
        let caps = b.capabilities();
        let plans: Vec<Plan> = requests
            .iter()
            .map(|r| {
                // Not applicable, or a declared gap: skipped by name (the same on every rank: the
                // declaration is).
                let skip: Vec<Option<String>> = r
                    .choices
                    .iter()
                    .map(|c| {
                        if !(c.applies)(&r.inst, ws) {
                            Some(format!("not applicable to {} on {ws} ranks", r.inst))
                        } else {
                            c.declared_gap(&caps, &r.inst, ws)
                        }
                    })
                    .collect();
                let names: Vec<String> = r.choices.iter().zip(&skip).filter(|(_, s)| s.is_none()).map(|(c, _)| c.name.clone()).collect();
                let hash = names_hash(&names);
                let cache_key = cache::key(b.name(), &r.inst, &env.group_ranks, &hash, cfg.policy);
                let hit = cache.as_ref().and_then(|c| c.get(&cache_key)).map(|e| e.winner.clone()).filter(|w| names.contains(w));
                Plan { skip, names, hash, cache_key, hit }
            })
            .collect();

        // The self-test's hazard: a local hit is used without asking the other ranks.
        if cfg.hazards.unagreed_cache && plans.iter().all(|p| p.hit.is_some()) {
            let tables = requests.iter().zip(&plans).map(|(r, p)| self.cached_table(r, p, ws, p.hit.clone().expect("all hit"))).collect();
            return Ok(Outcome { tables, warnings, presyncs: 0, presync_time: Duration::ZERO, missing: vec![], elapsed: start.elapsed() });
        }

        // (a) + (g) + (h): one pre-sync for every op, out of band, with the deadline.
        let mut presyncs = 0;
        let mut presync_time = Duration::ZERO;
        let mut missing = Vec::new();
        let mut agreed_hit: Vec<Option<String>> = vec![None; requests.len()];
        let mut unusable: Option<String> = None;
        match env.store {
            None => warnings
                .push(format!("rank {rank}: no store (outside a world): local benchmarking only, nothing is agreed with other ranks")),
            Some(store) => {
                let t = Instant::now();
                let mine: Vec<PresyncOp> = requests
                    .iter()
                    .zip(&plans)
                    .map(|(r, p)| PresyncOp { op: r.inst.key(), cands: p.names.clone(), hash: p.hash.clone(), hit: p.hit.clone() })
                    .collect();
                let mine = serde_json::to_string(&mine).expect("serialisable");
                let view = self.exchange(env, store, &format!("{}/cands", env.tag), &mine, deadline).map_err(store_err)?;
                presyncs = 1;
                presync_time = t.elapsed();
                let parsed: Vec<Option<Vec<PresyncOp>>> =
                    view.iter().map(|v| v.as_ref().and_then(|s| serde_json::from_str(s).ok())).collect();
                missing = (0..ws).filter(|&r| parsed[r].is_none()).collect();
                if !missing.is_empty() {
                    let why = format!(
                        "rank(s) {} missing at the pre-sync deadline ({} ms): no choice is run; every op uses its default choice on every rank",
                        fmt_ranks(&missing),
                        cfg.timeout.as_millis()
                    );
                    warnings.push(why.clone());
                    unusable = Some(why);
                } else {
                    let all: Vec<&Vec<PresyncOp>> = parsed.iter().map(|p| p.as_ref().expect("none missing")).collect();
                    for (i, r) in requests.iter().enumerate() {
                        let lists: Vec<Option<&PresyncOp>> = all.iter().map(|ops| ops.get(i)).collect();
                        let same = lists
                            .iter()
                            .all(|o| o.is_some_and(|o| o.op == r.inst.key() && o.cands == plans[i].names && o.hash == plans[i].hash));
                        if !same {
                            let detail = lists
                                .iter()
                                .enumerate()
                                .map(|(q, o)| match o {
                                    Some(o) => format!("rank {q}: {} [{}] (hash {})", o.op, o.cands.join(", "), o.hash),
                                    None => format!("rank {q}: no op #{i}"),
                                })
                                .collect::<Vec<_>>()
                                .join("; ");
                            return Err(TuneError::CandidateMismatch { op: r.inst.key(), detail });
                        }
                        let hits: Vec<Option<&String>> = lists.iter().map(|o| o.and_then(|o| o.hit.as_ref())).collect();
                        match hits[0] {
                            Some(w) if hits.iter().all(|h| *h == Some(w)) => agreed_hit[i] = Some(w.clone()),
                            _ if hits.iter().any(|h| h.is_some()) => warnings.push(format!(
                                "cache: partial or disagreeing hit for {} ({}): every rank re-tunes",
                                r.inst,
                                hits.iter()
                                    .enumerate()
                                    .map(|(q, h)| format!("rank {q} {}", h.map(|w| format!("hit `{w}`")).unwrap_or_else(|| "miss".into())))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )),
                            _ => {}
                        }
                    }
                }
            }
        }

        let sem = Semantics::of(&b.capabilities());
        let mut tables = Vec::with_capacity(requests.len());
        for (i, (req, plan)) in requests.iter().zip(&plans).enumerate() {
            if let Some(w) = agreed_hit[i].clone() {
                tables.push(self.cached_table(req, plan, ws, w));
                continue;
            }
            let t_op = Instant::now();
            let inst = &req.inst;
            let mut timed = Duration::ZERO;
            let mut sync = Duration::ZERO;
            let mut table_warnings = Vec::new();
            let mut rows = Vec::with_capacity(req.choices.len());
            // Inputs every rank regenerates, and this rank's expected output.
            let mut prepared: Option<(B::Buffer, Tensor)> = None;
            if unusable.is_none() {
                let seed = concord_fixtures::seed_for(&format!("autotune/{}", inst.key()));
                let mut all = concord_fixtures::inputs(seed, ws, inst.dtype, &inst.shape, inst.reduce, InputKind::Exact);
                // Values that need the whole significand (f32 / f64): the fixtures' small
                // integers cross a narrower wire exactly, so a lossy choice would pass.
                if !cfg.hazards.small_integer_screening {
                    concord_fixtures::widen(&mut all, inst.reduce);
                }
                let exp = concord_oracle::expected(&inst.collective(ws), &all, &sem)
                    .map_err(|e| TuneError::BadRequest(format!("{inst} is not a valid instance on {ws} ranks: {e:?}")))?;
                let x = b.upload(&all[rank]).map_err(|e| TuneError::BadRequest(format!("{inst}: upload: {e}")))?;
                prepared = Some((x, exp.outputs[rank].clone()));
            }
            for (j, c) in req.choices.iter().enumerate() {
                if let Some(why) = &plan.skip[j] {
                    rows.push(Row {
                        choice: c.name.clone(),
                        per_rank_ns: vec![None; ws],
                        reduced_ns: None,
                        status: RowStatus::Skipped(why.clone()),
                    });
                    continue;
                }
                if let Some(why) = &unusable {
                    rows.push(Row {
                        choice: c.name.clone(),
                        per_rank_ns: vec![None; ws],
                        reduced_ns: None,
                        status: RowStatus::NotRun(why.clone()),
                    });
                    continue;
                }
                let (x, exp) = prepared.as_ref().expect("prepared while usable");
                let prefix = format!("{}/op{i}/{}", env.tag, c.name);
                // (b) screening, agreed before any timing.
                let mine = self.screen(b, c, inst, x, exp, deadline, env.op_timeout);
                let ts = Instant::now();
                let view = self.decide(env, &format!("{prefix}/screen"), mine, deadline)?;
                sync += ts.elapsed();
                let mut view_ok = view.iter().all(|s| matches!(s, RankStatus::Ok(_)));
                let mut final_view = view;
                if view_ok {
                    // (c) warm-up, timed runs between barriers, each under the deadline.
                    let (mine, t) = self.time_runs(b, c, inst, x, deadline, env.op_timeout);
                    timed += t;
                    let ts = Instant::now();
                    final_view = self.decide(env, &format!("{prefix}/timed"), mine, deadline)?;
                    sync += ts.elapsed();
                    view_ok = final_view.iter().all(|s| matches!(s, RankStatus::Ok(_)));
                }
                if view_ok {
                    let per: Vec<u64> = final_view.iter().map(|s| if let RankStatus::Ok(ns) = s { *ns } else { 0 }).collect();
                    rows.push(Row {
                        choice: c.name.clone(),
                        per_rank_ns: per.iter().map(|&n| Some(n)).collect(),
                        reduced_ns: Some(cfg.policy.reduce(&per)),
                        status: RowStatus::Ok,
                    });
                    continue;
                }
                // (d) inf on every rank, naming choice, rank and cause.
                let causes: Vec<(usize, String)> = final_view
                    .iter()
                    .enumerate()
                    .filter_map(|(r, s)| match s {
                        RankStatus::Ok(_) => None,
                        RankStatus::Fail(c) => Some((r, c.clone())),
                        RankStatus::Missing => Some((r, "never reported by the deadline (hung, slow or gone)".into())),
                    })
                    .collect();
                table_warnings.push(format!(
                    "choice `{}` of {inst} is inf on every rank: {}",
                    c.name,
                    causes.iter().map(|(r, c)| format!("rank {r}: {c}")).collect::<Vec<_>>().join("; ")
                ));
                let timeouts: Vec<usize> = final_view.iter().enumerate().filter(|(_, s)| s.is_timeout()).map(|(r, _)| r).collect();
                if !timeouts.is_empty() {
                    let why = format!(
                        "choice `{}` of {inst} timed out or went unreported on rank(s) {}: the communicator may be unusable, so no further choice runs on any rank (to avoid corruption)",
                        c.name,
                        fmt_ranks(&timeouts)
                    );
                    table_warnings.push(why.clone());
                    unusable = Some(why);
                }
                rows.push(Row {
                    choice: c.name.clone(),
                    per_rank_ns: final_view.iter().map(|s| if let RankStatus::Ok(ns) = s { Some(*ns) } else { None }).collect(),
                    reduced_ns: None,
                    status: RowStatus::Failed(causes),
                });
            }
            // (e) one winner: the smallest reduced time, ties to the earlier candidate.
            let mut best: Option<(&str, u64)> = None;
            for row in &rows {
                if let (RowStatus::Ok, Some(t)) = (&row.status, row.reduced_ns) {
                    if best.is_none_or(|(_, bt)| t < bt) {
                        best = Some((&row.choice, t));
                    }
                }
            }
            let defaulted = best.is_none();
            let mut winner = best.map(|(n, _)| n.to_string()).unwrap_or_else(|| req.default.clone());
            if defaulted {
                table_warnings.push(format!("every choice of {inst} is inf: every rank uses the declared default `{}`", req.default));
            }
            if let (Some(store), false) = (env.store, cfg.hazards.local_fallback) {
                let ts = Instant::now();
                let stored = agree(store, &format!("{}/op{i}/winner", env.tag), &winner).map_err(store_err)?;
                sync += ts.elapsed();
                if stored != winner {
                    table_warnings.push(format!("rank {rank} computed winner `{winner}` but the agreed winner is `{stored}`: adopted"));
                    winner = stored;
                }
            }
            if let (Some(c), false) = (cache.as_mut(), defaulted) {
                let reduced = rows.iter().find(|r| r.choice == winner).and_then(|r| r.reduced_ns);
                c.put(
                    plan.cache_key.clone(),
                    cache::Entry { winner: winner.clone(), policy: cfg.policy.name().into(), reduced_ns: reduced },
                );
            }
            tables.push(Table {
                inst: inst.clone(),
                world_size: ws,
                policy: cfg.policy,
                rows,
                winner,
                defaulted,
                from_cache: false,
                timed,
                elapsed: t_op.elapsed(),
                sync,
                warnings: table_warnings,
            });
        }
        if let (Some(c), Some(p)) = (cache, cfg.cache.as_ref()) {
            if let Err(e) = c.save(p) {
                warnings.push(format!("rank {rank}: cannot write the decision cache {}: {e}", p.display()));
            }
        }
        Ok(Outcome { tables, warnings, presyncs, presync_time, missing, elapsed: start.elapsed() })
    }

    fn cached_table<B: Backend>(&self, req: &Request<B>, plan: &Plan, ws: usize, winner: String) -> Table {
        let rows = req
            .choices
            .iter()
            .enumerate()
            .map(|(j, c)| Row {
                choice: c.name.clone(),
                per_rank_ns: vec![None; ws],
                reduced_ns: None,
                status: if let Some(why) = &plan.skip[j] {
                    RowStatus::Skipped(why.clone())
                } else if c.name == winner {
                    RowStatus::Cached
                } else {
                    RowStatus::NotRun("the agreed cache hit decided".into())
                },
            })
            .collect();
        Table {
            inst: req.inst.clone(),
            world_size: ws,
            policy: self.cfg.policy,
            rows,
            winner,
            defaulted: false,
            from_cache: true,
            timed: Duration::ZERO,
            elapsed: Duration::ZERO,
            sync: Duration::ZERO,
            warnings: vec![],
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn screen<B: Backend>(
        &self,
        b: &B,
        c: &Choice<B>,
        inst: &OpInstance,
        x: &B::Buffer,
        exp: &Tensor,
        deadline: Instant,
        op_timeout: Duration,
    ) -> RankStatus {
        if Instant::now() >= deadline {
            return RankStatus::Fail("timeout: the autotune deadline passed before screening".into());
        }
        let ctx = ChoiceCtx { b, inst, phase: Phase::Screen, deadline, op_timeout };
        let out = match guarded(c, &ctx, x) {
            Ok(o) => o,
            Err(s) => return s,
        };
        if self.cfg.hazards.no_screening {
            return RankStatus::Ok(0);
        }
        let got = match b.download(&out) {
            Ok(g) => g,
            Err(e) => return RankStatus::Fail(format!("error: download of the output: {e}")),
        };
        match compare(&got, exp, Tolerance::Exact) {
            Ok(()) => RankStatus::Ok(0),
            Err(m) => RankStatus::Fail(format!("wrong: first bad index {} got {} expected {} ({})", m.index, m.got, m.expected, m.detail)),
        }
    }

    fn time_runs<B: Backend>(
        &self,
        b: &B,
        c: &Choice<B>,
        inst: &OpInstance,
        x: &B::Buffer,
        deadline: Instant,
        op_timeout: Duration,
    ) -> (RankStatus, Duration) {
        let mut timed = Duration::ZERO;
        for w in 0..self.cfg.warmup {
            let ctx = ChoiceCtx { b, inst, phase: Phase::Warmup(w), deadline, op_timeout };
            if let Err(s) = guarded(c, &ctx, x) {
                return (s, timed);
            }
        }
        let mut ts = Vec::with_capacity(self.cfg.runs);
        for k in 0..self.cfg.runs.max(1) {
            let ctx = ChoiceCtx { b, inst, phase: Phase::Timed(k), deadline, op_timeout };
            if let Err(e) = b.barrier().and_then(|w| ctx.wait(w)) {
                let kind = if matches!(e, CollectiveError::Timeout { .. }) { "timeout" } else { "error" };
                return (RankStatus::Fail(format!("{kind}: barrier before timed run {k}: {e}")), timed);
            }
            if Instant::now() >= deadline {
                return (RankStatus::Fail(format!("timeout: the autotune deadline passed before timed run {k}")), timed);
            }
            let t0 = Instant::now();
            let r = guarded(c, &ctx, x);
            let el = t0.elapsed();
            timed += el;
            if let Err(s) = r {
                return (s, timed);
            }
            ts.push(el.as_nanos() as u64);
        }
        let t = if self.cfg.hazards.mean_of_runs {
            (ts.iter().map(|&t| t as u128).sum::<u128>() / ts.len().max(1) as u128) as u64
        } else {
            median(&ts)
        };
        (RankStatus::Ok(t.max(1)), timed)
    }

    /// Every rank's status for one step, agreed (see [`exchange`]).
    fn decide<B: Backend>(
        &self,
        env: &Env<'_, B>,
        prefix: &str,
        mine: RankStatus,
        deadline: Instant,
    ) -> Result<Vec<RankStatus>, TuneError> {
        let (b, rank, ws) = (env.b, env.b.rank(), env.b.world_size());
        if self.cfg.hazards.local_fallback {
            return Ok(vec![mine; ws]);
        }
        if self.cfg.hazards.collective_decision {
            let (code, ns) = match &mine {
                RankStatus::Ok(ns) => (0i64, *ns as i64),
                s if s.is_timeout() => (2, 0),
                _ => (1, 0),
            };
            let flag = Tensor::from_vec(&[2], vec![code, ns]);
            let got = b
                .upload(&flag)
                .and_then(|x| b.all_gather_into_tensor(&x))
                .and_then(|w| w.into_value(env.op_timeout))
                .and_then(|o| b.download(&o));
            return Ok(match got {
                Ok(t) => (0..ws)
                    .map(|r| {
                        let v = t.as_slice::<i64>();
                        match v[2 * r] {
                            0 => RankStatus::Ok(v[2 * r + 1] as u64),
                            2 => RankStatus::Fail("timeout (agreed by a collective)".into()),
                            _ => RankStatus::Fail("error (agreed by a collective)".into()),
                        }
                    })
                    .collect(),
                Err(_) => (0..ws).map(|r| if r == rank { mine.clone() } else { RankStatus::Missing }).collect(),
            });
        }
        let Some(store) = env.store else {
            return Ok(vec![mine; ws]);
        };
        let view = self.exchange(env, store, prefix, &mine.encode(), deadline).map_err(store_err)?;
        Ok(view.iter().map(|v| RankStatus::decode(v.as_deref())).collect())
    }
}
