//! The autotuner conformance suite (`autotune::*`): any [`Autotuner`] held to a reference — the
//! oracle for values, and [`reference`], a pure model of the decisions (given the per-rank times
//! a choice takes and its failures: which winner, which choices inf or not run, which warnings,
//! under each policy).
//!
//! Behaviour is injected through the choice set (a known delay on one rank, a hang on one rank, a
//! panic on one rank, fast-but-wrong output, slower only on one rank so `Max` and `Avg`
//! disagree), never by sleeping in the harness. Every case compares what every rank ended with
//! through the world's store, so "every rank ends the same way" is checked, not assumed.
//!
//! Cases: the seed's four phases (`autotune::seed::*`), the built-in choice sets at 1, 2, 3, 4
//! and 8 ranks (`autotune::builtin::*`), one case per hazard (`autotune::hazard::*`), the cache
//! (`autotune::cache::*`) and tuning outside a world (`autotune::no_store::ws1`). Every tuned
//! op's output is checked against the oracle where the communicator is still usable.

use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::sched::Noise;
use concord_autotune::{
    cache, names_hash, run_choice, Autotuner, Choice, ChoiceCtx, Config, Env, OpInstance, Outcome, Phase, Policy, Request, RowStatus,
};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Variant};
use concord_fixtures::InputKind;
use concord_oracle::{compare, Semantics, Tolerance};
use std::time::{Duration, Instant};

/// The pure reference model of an autotuner's decisions.
pub mod reference {
    use concord_autotune::Policy;

    /// What one rank did with one choice.
    #[derive(Clone, Debug, PartialEq)]
    pub enum Obs {
        /// Took this long (ns) and was right.
        Time(u64),
        /// Failed: error, panic or wrong output (the communicator stays usable).
        Fail,
        /// Timed out, hung or never reported (the communicator may be unusable).
        Timeout,
    }

    pub struct ChoiceObs {
        pub name: String,
        pub applicable: bool,
        /// Per rank.
        pub ranks: Vec<Obs>,
    }

    #[derive(Clone, Debug, PartialEq)]
    pub struct Decision {
        pub winner: String,
        pub defaulted: bool,
        /// Inf on every rank, with the ranks it failed on.
        pub inf: Vec<(String, Vec<usize>)>,
        pub not_run: Vec<String>,
        /// Reduced time of each timed choice (ns, as f64).
        pub times: Vec<(String, f64)>,
        /// Warnings that MUST come out: each a set of fragments one warning contains together
        /// (an inf choice: its name in backticks and every rank it failed on; the default used:
        /// `default` and its name in backticks).
        pub warnings: Vec<Vec<String>>,
    }

    /// The policy's reduction, in f64.
    pub fn reduce(policy: Policy, t: &[u64]) -> f64 {
        let mut v: Vec<f64> = t.iter().map(|&x| x as f64).collect();
        v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        match policy {
            Policy::Max => *v.last().unwrap_or(&0.0),
            Policy::Avg => v.iter().sum::<f64>() / v.len().max(1) as f64,
            Policy::Median => {
                let n = v.len();
                if n == 0 {
                    0.0
                } else if n % 2 == 1 {
                    v[n / 2]
                } else {
                    (v[n / 2 - 1] + v[n / 2]) / 2.0
                }
            }
        }
    }

    /// The decision every rank MUST reach: choices in order; one that fails on any rank is inf
    /// on all; after one that timed out on any rank, every later choice is not run; the winner
    /// is the smallest reduced time, ties to the earlier choice; no timed choice → `default`.
    pub fn decide(choices: &[ChoiceObs], policy: Policy, default: &str) -> Decision {
        let mut d = Decision { winner: default.into(), defaulted: true, inf: vec![], not_run: vec![], times: vec![], warnings: vec![] };
        let mut stopped = false;
        let mut best: Option<f64> = None;
        for c in choices.iter().filter(|c| c.applicable) {
            if stopped {
                d.not_run.push(c.name.clone());
                continue;
            }
            let bad: Vec<usize> = c.ranks.iter().enumerate().filter(|(_, o)| !matches!(o, Obs::Time(_))).map(|(r, _)| r).collect();
            if !bad.is_empty() {
                stopped |= c.ranks.contains(&Obs::Timeout);
                let mut w = vec![format!("`{}`", c.name)];
                w.extend(bad.iter().map(|r| format!("rank {r}")));
                d.warnings.push(w);
                d.inf.push((c.name.clone(), bad));
                continue;
            }
            let t: Vec<u64> = c.ranks.iter().map(|o| if let Obs::Time(t) = o { *t } else { 0 }).collect();
            let r = reduce(policy, &t);
            d.times.push((c.name.clone(), r));
            if best.is_none_or(|b| r < b) {
                best = Some(r);
                d.winner = c.name.clone();
                d.defaulted = false;
            }
        }
        if d.defaulted {
            d.warnings.push(vec!["default".into(), format!("`{default}`")]);
        }
        d
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        fn c(name: &str, ranks: Vec<Obs>) -> ChoiceObs {
            ChoiceObs { name: name.into(), applicable: true, ranks }
        }
        #[test]
        fn max_sees_the_slow_rank_avg_does_not() {
            let set = [c("slow_on_1", vec![Obs::Time(10), Obs::Time(50)]), c("uniform", vec![Obs::Time(38), Obs::Time(38)])];
            assert_eq!(decide(&set, Policy::Max, "uniform").winner, "uniform");
            assert_eq!(decide(&set, Policy::Avg, "uniform").winner, "slow_on_1");
            assert_eq!(decide(&set, Policy::Median, "uniform").winner, "slow_on_1");
        }
        #[test]
        fn ties_go_to_the_earlier_choice_and_all_inf_to_the_default() {
            let set = [c("a", vec![Obs::Time(5), Obs::Time(5)]), c("b", vec![Obs::Time(5), Obs::Time(5)])];
            assert_eq!(decide(&set, Policy::Max, "b").winner, "a");
            let bad = [c("a", vec![Obs::Fail, Obs::Time(1)]), c("b", vec![Obs::Time(1), Obs::Fail])];
            let d = decide(&bad, Policy::Max, "b");
            assert!(d.defaulted && d.winner == "b" && d.inf.len() == 2);
            assert!(d.warnings.contains(&vec!["`a`".to_string(), "rank 0".to_string()]) && d.warnings.len() == 3, "{:?}", d.warnings);
        }
        #[test]
        fn a_timeout_stops_every_later_choice() {
            let set = [
                c("a", vec![Obs::Time(9), Obs::Time(9)]),
                c("h", vec![Obs::Timeout, Obs::Timeout]),
                c("z", vec![Obs::Time(1), Obs::Time(1)]),
            ];
            let d = decide(&set, Policy::Max, "z");
            assert_eq!((d.winner.as_str(), d.not_run.clone()), ("a", vec!["z".to_string()]));
        }
    }
}

fn meta(op: &str) -> CaseMeta {
    CaseMeta { suite: "autotune".into(), op: op.into(), variant: "tuned".into(), dtype: String::new(), reduce: String::new() }
}

fn here<B: Backend>(ctx: &Ctx<'_, B>) -> String {
    format!("backend={} world_size={} rank={} case={}", crate::case::backend_label(ctx.b), ctx.world_size(), ctx.rank(), ctx.case)
}

fn fail<B: Backend>(ctx: &Ctx<'_, B>, what: impl std::fmt::Display) -> CaseEnd {
    CaseEnd::Fail(format!("{}: {what}", here(ctx)))
}

fn cfg(timeout: Duration, policy: Policy) -> Config {
    Config { timeout, warmup: 1, runs: 3, policy, ..Config::default() }
}

fn env<'a, B: Backend>(ctx: &'a Ctx<'_, B>, n: usize) -> Env<'a, B> {
    Env::new(ctx.b, Some(ctx.store), format!("{}/{}/at{n}", ctx.case, ctx.world.world_id), ctx.world.op_timeout)
}

/// Every rank's `mine` for `label` (index = rank), through the world's store.
fn gather<B: Backend>(ctx: &Ctx<'_, B>, label: &str, mine: &str) -> Result<Vec<String>, CaseEnd> {
    let key = |r: usize| format!("{}/{}/check/{label}/{r}", ctx.case, ctx.world.world_id);
    ctx.store.set(&key(ctx.rank()), mine.as_bytes()).map_err(|e| fail(ctx, e))?;
    let keys: Vec<String> = (0..ctx.world_size()).map(key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    ctx.store.wait(&refs, ctx.timeout).map_err(|e| fail(ctx, format!("a rank never published its `{label}`: {e}")))?;
    refs.iter().map(|k| ctx.store.get(k).map(|v| String::from_utf8_lossy(&v).into_owned()).map_err(|e| fail(ctx, e))).collect()
}

/// The choices of the `hang_after_last_timed_run` hazards: `native`, then
/// `hangs_after_its_runs_on_rank{rank}` (right on every rank, but rank `rank` sleeps `sleep`
/// after its last timed run, past the deadline), then `after` (the declared default: no choice
/// may run after the hang).
fn hangs_after_last_timed_run<B: Backend>(rank: usize, sleep: Duration) -> Vec<Choice<B>> {
    let hang = Choice::new(&format!("hangs_after_its_runs_on_rank{rank}"), move |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
        let out = native(c, x)?;
        if c.b.rank() == rank && c.phase == Phase::Timed(2) {
            std::thread::sleep(sleep);
        }
        Ok(out)
    });
    vec![Choice::new("native", native::<B>), hang, Choice::new("after", native::<B>)]
}

/// The first rank (if any) whose `ok` for `label` is false: every rank's through [`gather`].
fn first_false<B: Backend>(ctx: &Ctx<'_, B>, label: &str, ok: bool) -> Result<Option<usize>, CaseEnd> {
    Ok(gather(ctx, label, &ok.to_string())?.iter().position(|s| s != "true"))
}

/// The per-call gate for tuned ops: a request's op instance is the call its `native` choice
/// makes (out of place) and the call every choice must match, so a case tuning an instance the
/// backend declares a gap is UNSUPPORTED (on every rank alike, before any rank tunes), naming
/// the call.
fn require_tuned<B: Backend>(ctx: &Ctx<'_, B>, reqs: &[Request<B>]) -> CaseResult {
    for r in reqs {
        crate::suites::util::require_call(ctx.b, r.inst.op, Variant::Out, r.inst.dtype, r.inst.reduce)?;
    }
    Ok(())
}

/// The gate of a case tuning built-in choices: each choice declares the calls it makes and the
/// tuner skips one the backend declares a gap, so the case is UNSUPPORTED (every rank alike,
/// before any rank tunes) only where a request has no applicable choice left, naming each
/// choice's gap.
fn require_some_choice<B: Backend>(ctx: &Ctx<'_, B>, reqs: &[Request<B>]) -> CaseResult {
    let (caps, ws) = (ctx.b.capabilities(), ctx.world_size());
    for r in reqs {
        let applicable: Vec<&Choice<B>> = r.choices.iter().filter(|c| (c.applies)(&r.inst, ws)).collect();
        let gaps: Vec<String> =
            applicable.iter().filter_map(|c| c.declared_gap(&caps, &r.inst, ws).map(|g| format!("`{}`: {g}", c.name))).collect();
        if gaps.len() == applicable.len() {
            return Err(CaseEnd::Unsupported(format!(
                "every built-in choice of {} on {ws} ranks is a declared gap: {}",
                r.inst,
                gaps.join("; ")
            )));
        }
    }
    Ok(())
}

/// Each row of a built-in table is skipped exactly where its choice does not apply or one of its
/// declared calls is a declared gap (then with that reason), and timed otherwise: a tuner that
/// runs a gapped choice leaves it failed (a correct backend refuses it), one that skips a
/// supported choice tunes less than it was asked.
fn check_skips<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, reqs: &[Request<B>]) -> CaseResult {
    let (caps, ws) = (ctx.b.capabilities(), ctx.world_size());
    for (t, r) in o.tables.iter().zip(reqs) {
        for (row, c) in t.rows.iter().zip(&r.choices) {
            let why = if (c.applies)(&r.inst, ws) { c.declared_gap(&caps, &r.inst, ws) } else { Some("not applicable".into()) };
            match (&row.status, why) {
                (RowStatus::Skipped(got), Some(want)) if want == "not applicable" || *got == want => {}
                (RowStatus::Skipped(got), Some(want)) => {
                    return Err(fail(ctx, format!("built-in choice `{}` of {} skipped as `{got}`, expected `{want}`\n{o}", c.name, t.inst)))
                }
                (RowStatus::Skipped(got), None) => {
                    return Err(fail(
                        ctx,
                        format!("built-in choice `{}` of {} skipped (`{got}`) though it applies and the backend declares none of its calls a gap\n{o}", c.name, t.inst),
                    ))
                }
                (RowStatus::Failed(_) | RowStatus::NotRun(_), why) => {
                    return Err(fail(
                        ctx,
                        format!(
                            "built-in choice `{}` of {} did not pass on a correct backend: {:?}{}\n{o}",
                            c.name,
                            t.inst,
                            row.status,
                            why.map_or(String::new(), |w| format!(" (it should have been skipped: {w})"))
                        ),
                    ))
                }
                (_, Some(want)) => {
                    return Err(fail(ctx, format!("built-in choice `{}` of {} was run, but it must be skipped: {want}\n{o}", c.name, t.inst)))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn tune<B: Backend, A: Autotuner<B>>(ctx: &Ctx<'_, B>, a: &A, n: usize, reqs: &[Request<B>]) -> Result<Outcome, CaseEnd> {
    require_tuned(ctx, reqs)?;
    tune_ungated(ctx, a, n, reqs)
}

/// [`tune`] without its per-call gate (the caller gates).
fn tune_ungated<B: Backend, A: Autotuner<B>>(ctx: &Ctx<'_, B>, a: &A, n: usize, reqs: &[Request<B>]) -> Result<Outcome, CaseEnd> {
    let o = a.tune(&env(ctx, n), reqs).map_err(|e| fail(ctx, format!("tune failed: {e} [{}]", e.name())))?;
    if o.tables.len() != reqs.len() {
        return Err(fail(ctx, format!("tune returned {} tables for {} requests", o.tables.len(), reqs.len())));
    }
    check_tables_match(ctx, &o, reqs)?;
    Ok(o)
}

/// Table `i` is request `i`'s: the same instance, one row per candidate in the request's order,
/// and a winner among the candidates.
fn check_tables_match<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, reqs: &[Request<B>]) -> CaseResult {
    for (i, (t, r)) in o.tables.iter().zip(reqs).enumerate() {
        if t.inst != r.inst {
            return Err(fail(
                ctx,
                format!(
                    "table {i} is for {} but request {i} is {}: tables out of order — tune must return one table per request, in the order of the requests\n{o}",
                    t.inst, r.inst
                ),
            ));
        }
        let want: Vec<&str> = r.choices.iter().map(|c| c.name.as_str()).collect();
        let got: Vec<&str> = t.rows.iter().map(|row| row.choice.as_str()).collect();
        if got != want {
            let missing: Vec<&str> = want.iter().filter(|n| !got.contains(n)).copied().collect();
            return Err(fail(
                ctx,
                format!(
                    "{}: rows [{}] but the request's candidates are [{}] (missing: [{}]): a candidate silently dropped — every candidate must have one row, in the request's order\n{t}",
                    r.inst,
                    got.join(", "),
                    want.join(", "),
                    missing.join(", ")
                ),
            ));
        }
        if !want.contains(&t.winner.as_str()) {
            return Err(fail(
                ctx,
                format!("{}: winner `{}` is not among the request's candidates [{}]\n{t}", r.inst, t.winner, want.join(", ")),
            ));
        }
        if !t.defaulted && t.row(&t.winner).is_some_and(|row| matches!(row.status, RowStatus::Skipped(_))) {
            return Err(fail(
                ctx,
                format!("{}: winner `{}` was skipped as not applicable to {} on {} ranks: a winner must be a choice that was timed (or the cached one)\n{t}", r.inst, t.winner, r.inst, t.world_size),
            ));
        }
    }
    Ok(())
}

/// Every rank ended with the same winners.
/// Every rank also holds the same reduced column (the policy's reduction of the agreed per-rank
/// times is the same everywhere; a rank showing its own time differs).
fn check_same_winners<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, label: &str, hint: &str) -> CaseResult {
    let mine: Vec<&str> = o.tables.iter().map(|t| t.winner.as_str()).collect();
    let reduced: Vec<String> = o
        .tables
        .iter()
        .map(|t| {
            t.rows
                .iter()
                .map(|r| format!("{} {}", r.choice, r.reduced_ns.map(|x| format!("{x} ns")).unwrap_or_else(|| "inf".into())))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    let all = gather(ctx, &format!("winners-{label}"), &format!("{}|{}", mine.join(","), reduced.join("; ")))?;
    let split: Vec<(&str, &str)> = all.iter().map(|s| s.split_once('|').unwrap_or((s.as_str(), ""))).collect();
    if split.iter().any(|(w, _)| *w != split[0].0) {
        let per = split.iter().enumerate().map(|(r, (w, _))| format!("rank {r}: [{w}]")).collect::<Vec<_>>().join("; ");
        return Err(fail(ctx, format!("ranks ended with different winners ({per}){hint}\n{o}")));
    }
    if split.iter().any(|(_, x)| *x != split[0].1) {
        let per = split.iter().enumerate().map(|(r, (_, x))| format!("rank {r}: [{x}]")).collect::<Vec<_>>().join("; ");
        return Err(fail(
            ctx,
            format!("ranks hold different reduced times for the same agreed per-rank times ({per}): the reduced column must be the policy's reduction of every rank's time, the same on every rank\n{o}"),
        ));
    }
    Ok(())
}

/// The table's winner is what the reference model picks from the table's own per-rank times
/// and statuses under the declared policy.
fn check_reference<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, reqs: &[Request<B>], declared: Policy) -> CaseResult {
    for (t, r) in o.tables.iter().zip(reqs) {
        if t.from_cache {
            continue;
        }
        let obs: Vec<reference::ChoiceObs> = t
            .rows
            .iter()
            .map(|row| reference::ChoiceObs {
                name: row.choice.clone(),
                applicable: !matches!(row.status, RowStatus::Skipped(_)),
                ranks: match &row.status {
                    RowStatus::Ok => row.per_rank_ns.iter().map(|n| n.map(reference::Obs::Time).unwrap_or(reference::Obs::Fail)).collect(),
                    RowStatus::Failed(c) => (0..t.world_size)
                        .map(|q| match c.iter().find(|(r, _)| *r == q) {
                            None => reference::Obs::Time(1),
                            Some((_, why)) if why.starts_with("timeout") || why.contains("never reported") => reference::Obs::Timeout,
                            Some(_) => reference::Obs::Fail,
                        })
                        .collect(),
                    _ => vec![reference::Obs::Timeout; t.world_size],
                },
            })
            .collect();
        // Rows not run are inputs to the model only through what stopped them.
        let obs: Vec<reference::ChoiceObs> =
            obs.into_iter().zip(&t.rows).filter(|(_, row)| !matches!(row.status, RowStatus::NotRun(_))).map(|(o, _)| o).collect();
        let d = reference::decide(&obs, declared, &r.default);
        let warnings: Vec<&String> = o.warnings.iter().chain(&t.warnings).collect();
        for must in &d.warnings {
            if !warnings.iter().any(|w| must.iter().all(|f| w.contains(f.as_str()))) {
                return Err(fail(
                    ctx,
                    format!("{}: no warning mentions {} together, as the reference model requires\n{t}", t.inst, must.join(" and ")),
                ));
            }
        }
        if d.winner != t.winner {
            let got = d.times.iter().find(|(n, _)| *n == t.winner).map(|(_, x)| *x);
            let exp = d.times.iter().find(|(n, _)| *n == d.winner).map(|(_, x)| *x).unwrap_or(0.0);
            // A difference of a nanosecond is rounding, not a decision.
            if got.is_none_or(|g| g - exp > 1.0) {
                let hint = if declared == Policy::Max && {
                    let avg = reference::decide(&obs, Policy::Avg, &r.default);
                    avg.winner == t.winner
                } {
                    " — it is what Avg picks: averaging per-rank times hides the slow rank, while the declared policy is Max"
                } else {
                    ""
                };
                return Err(fail(
                    ctx,
                    format!(
                        "{}: winner `{}`, but under the declared policy {} the reference model picks `{}` from the same per-rank times ({}){hint}\n{t}",
                        t.inst,
                        t.winner,
                        declared.name(),
                        d.winner,
                        d.times.iter().map(|(n, x)| format!("{n} {:.0} ns", x)).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        // The reduced column is the declared policy's reduction of the per-rank times (what the
        // table prints and the cache keeps); inf for every row not timed.
        for row in &t.rows {
            let per: Option<Vec<u64>> = row.per_rank_ns.iter().copied().collect();
            let want = match (&row.status, &per) {
                (RowStatus::Ok, Some(per)) => Some(reference::reduce(declared, per)),
                (RowStatus::Ok, None) => continue,
                _ => None,
            };
            let bad = match (row.reduced_ns, want) {
                (Some(x), Some(w)) => (x as f64 - w).abs() > 1.0,
                (None, None) => false,
                _ => true,
            };
            if bad {
                let ns = |x: Option<f64>| x.map(|x| format!("{x:.0} ns")).unwrap_or_else(|| "inf".into());
                let avg = per.as_ref().map(|p| reference::reduce(Policy::Avg, p));
                let hint = match (declared, row.reduced_ns, avg) {
                    (Policy::Max, Some(x), Some(a)) if (x as f64 - a).abs() <= 1.0 => {
                        " — it is their Avg: averaging per-rank times hides the slow rank, while the declared policy is Max"
                    }
                    _ => "",
                };
                return Err(fail(
                    ctx,
                    format!(
                        "{}: choice `{}` shows reduced time {}, but the declared policy {} over its per-rank times {:?} gives {} — the reduced column must be the policy's reduction of every rank's time (inf where not timed){hint}\n{t}",
                        t.inst,
                        row.choice,
                        ns(row.reduced_ns.map(|x| x as f64)),
                        declared.name(),
                        row.per_rank_ns,
                        ns(want)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Runs each winner once on fresh inputs and compares with the oracle.
fn check_outputs<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, reqs: &[Request<B>]) -> CaseResult {
    let (b, ws, rank) = (ctx.b, ctx.world_size(), ctx.rank());
    for (t, r) in o.tables.iter().zip(reqs) {
        let i = &r.inst;
        let seed = concord_fixtures::seed_for(&format!("{}/{}", ctx.case, i.key()));
        let mut all = concord_fixtures::inputs(seed, ws, i.dtype, &i.shape, i.reduce, InputKind::Exact);
        // Widened (f32 / f64): a lossy winner (a narrower wire) gives small integers back exactly.
        concord_fixtures::widen(&mut all, i.reduce);
        let exp = concord_oracle::expected(&i.collective(ws), &all, &Semantics::of(&b.capabilities()))
            .map_err(|e| fail(ctx, format!("{e:?}")))?;
        let x = b.upload(&all[rank])?;
        let out = run_choice(b, r, &t.winner, &x, ctx.timeout)
            .map_err(|e| fail(ctx, format!("tuned op {i} (winner `{}`) failed: {e}", t.winner)))?;
        let got = b.download(&out)?;
        compare(&got, &exp.outputs[rank], Tolerance::Exact).map_err(|m| {
            fail(
                ctx,
                format!(
                    "tuned op {i} (winner `{}`) is wrong: first bad index {} got {} expected {} ({}) — a wrong choice was not rejected before timing\n{t}",
                    t.winner, m.index, m.got, m.expected, m.detail
                ),
            )
        })?;
    }
    Ok(())
}

fn check_presyncs<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, want: usize) -> CaseResult {
    if o.presyncs != want {
        return Err(fail(ctx, format!("{} op(s) tuned with {} pre-sync(s); one call pays exactly {want}", o.tables.len(), o.presyncs)));
    }
    Ok(())
}

/// The checks of a healthy tuning: same winners everywhere, reference decision, oracle outputs.
fn check_all<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, reqs: &[Request<B>], declared: Policy, label: &str) -> CaseResult {
    check_same_winners(ctx, o, label, "")?;
    check_reference(ctx, o, reqs, declared)?;
    check_outputs(ctx, o, reqs)
}

// ---- injected choices ----

fn native<B: Backend>(c: &ChoiceCtx<'_, B>, x: &B::Buffer) -> concord_core::Result<B::Buffer> {
    let op = c.inst.reduce.unwrap_or(ReduceOp::Sum);
    match c.inst.op {
        concord_core::OpKind::AllReduce => c.wait(c.b.all_reduce(x, op)?),
        concord_core::OpKind::AllGatherIntoTensor => c.wait(c.b.all_gather_into_tensor(x)?),
        concord_core::OpKind::ReduceScatterTensor => c.wait(c.b.reduce_scatter_tensor(x, op)?),
        _ => c.wait(c.b.all_to_all_single(x, None, None)?),
    }
}

/// The native op, then `delay` on `ranks` (all when empty) in timed runs only: the collective's
/// own time is shared, the delay is this rank's alone.
fn delayed<B: Backend>(name: &str, ranks: &'static [usize], delay: Duration) -> Choice<B> {
    Choice::new(name, move |c: &ChoiceCtx<'_, B>, x| {
        let out = native(c, x)?;
        if matches!(c.phase, Phase::Timed(_)) && (ranks.is_empty() || ranks.contains(&c.b.rank())) {
            std::thread::sleep(delay);
        }
        Ok(out)
    })
}

/// On `rank`, in the phase `when` selects, sleeps `d` before the collective (a hang).
fn sleeps_on<B: Backend>(name: &str, rank: usize, d: Duration, when: impl Fn(Phase) -> bool + Send + Sync + 'static) -> Choice<B> {
    Choice::new(name, move |c: &ChoiceCtx<'_, B>, x| {
        if c.b.rank() == rank && when(c.phase) {
            std::thread::sleep(d);
        }
        native(c, x)
    })
}

fn panics_on<B: Backend>(name: &str, rank: usize) -> Choice<B> {
    Choice::new(name, move |c: &ChoiceCtx<'_, B>, x| {
        let out = native(c, x)?;
        if c.b.rank() == rank && c.phase != Phase::Use {
            panic!("injected panic on rank {rank}");
        }
        Ok(out)
    })
}

fn errors_on<B: Backend>(name: &str, rank: usize, screen_only: bool) -> Choice<B> {
    Choice::new(name, move |c: &ChoiceCtx<'_, B>, x| {
        let out = native(c, x)?;
        if c.b.rank() == rank && c.phase != Phase::Use && (!screen_only || c.phase == Phase::Screen) {
            return Err(CollectiveError::Backend(format!("injected error on rank {rank}")));
        }
        Ok(out)
    })
}

/// No communication at all: fast, and wrong on every rank of a world of 2 or more.
fn fast_wrong<B: Backend>(name: &str) -> Choice<B> {
    Choice::new(name, |c: &ChoiceCtx<'_, B>, x| c.b.upload(&c.b.download(x)?))
}

fn ar(n: usize) -> OpInstance {
    OpInstance::all_reduce(DType::F32, &[n], ReduceOp::Sum)
}

fn req<B: Backend>(inst: OpInstance, choices: Vec<Choice<B>>, default: &str) -> Request<B> {
    Request::new(inst, choices, default)
}

/// `row` of `choice` is failed on every rank, naming `rank` and `cause`, and a warning says so.
fn expect_inf<B: Backend>(ctx: &Ctx<'_, B>, o: &Outcome, choice: &str, rank: usize, cause: &str, hint: &str) -> CaseResult {
    let t = &o.tables[0];
    let ok =
        t.row(choice).is_some_and(|r| matches!(&r.status, RowStatus::Failed(c) if c.iter().any(|(q, w)| *q == rank && w.contains(cause))));
    let warned = o.all_warnings().iter().any(|w| w.contains(choice) && w.contains(&format!("rank {rank}")) && w.contains(cause));
    if let Some(bad) = first_false(ctx, &format!("inf-{choice}"), ok && warned)? {
        return Err(fail(
            ctx,
            format!(
                "rank {bad} does not hold choice `{choice}` inf with a warning naming rank {rank} and `{cause}` (this rank: {}){hint}\n{o}",
                if ok && warned { "yes" } else { "no" }
            ),
        ));
    }
    Ok(())
}

/// Every rank but `slow` returned within `timeout + 500 ms`. The slack is for a loaded 2-core
/// machine (seen: 866 ms for a 500 ms timeout at load 14 with 100 ms of slack); every stall the
/// cases inject outlasts the timeout by more than that (1 s, 1.5 s, 9 s).
/// Every rank but `slow` ended its tuning within `timeout` + a fixed slack + its own scheduler
/// noise over the window (its threads' run-queue wait while it tuned, [`crate::sched`]): the
/// slack and the noise absorb scheduling only. A rank that waits on the slow peer is asleep, not
/// runnable, while it waits, so the wait itself is not noise: it ends seconds late and fails.
/// Only its wake-ups count, but under heavy load they add up: the allowance is capped at 300 ms.
fn check_live_ranks_in_time<B: Backend>(
    ctx: &Ctx<'_, B>,
    o: &Outcome,
    slow: usize,
    timeout: Duration,
    t0: Instant,
    noise: &Noise,
) -> CaseResult {
    let (elapsed, waited) = (t0.elapsed(), noise.so_far());
    let all = gather(ctx, "elapsed-ms", &format!("{:.1} {:.1}", elapsed.as_secs_f64() * 1e3, waited.as_secs_f64() * 1e3))?;
    let parse = |s: &str, i: usize| s.split(' ').nth(i).and_then(|v| v.parse::<f64>().ok());
    let slack = Duration::from_millis(500);
    const NOISE_CAP: Duration = Duration::from_millis(300);
    for (r, s) in all.iter().enumerate() {
        let ms = parse(s, 0).unwrap_or(f64::MAX);
        // Capped: the wake-ups of a long wait add up under heavy load (uncapped, a tuner whose
        // timed runs overran the 2 s deadline by 0.7 s passed at load 28), so the allowance is
        // at most NOISE_CAP beyond the fixed slack, and only where the rank measured it.
        let noise_ms = parse(s, 1).unwrap_or(0.0).min(NOISE_CAP.as_secs_f64() * 1e3);
        if r != slow && ms > (timeout + slack).as_secs_f64() * 1e3 + noise_ms {
            return Err(fail(
                ctx,
                format!(
                    "rank {r} ended {ms:.0} ms after it started tuning, beyond the autotune timeout {} ms + {} ms + {noise_ms:.0} ms it waited for a CPU meanwhile (at most {} ms), while rank {slow} was slow: its decision waited on the slow peer (a timeout decided by a collective, or a wait without the deadline)\n{o}",
                    timeout.as_millis(),
                    slack.as_millis(),
                    NOISE_CAP.as_millis()
                ),
            ));
        }
    }
    Ok(())
}

/// The pre-sync hazard of `autotune::hazard::*missing_at_presync::ws3`: rank `late` comes 1.5 s
/// late to a tuning with a 0.5 s timeout; the other ranks decide without it by the deadline (the
/// default choice, naming rank `late` in the outcome) and `late` adopts that decision when it
/// arrives. `winners` and `missing` label the gathers; `who` names the late rank in the failure.
fn missing_at_presync<B: Backend, A: Autotuner<B>>(ctx: &Ctx<'_, B>, late: usize, winners: &str, missing: &str, who: &str) -> CaseResult {
    let timeout = Duration::from_millis(500);
    if ctx.rank() == late {
        std::thread::sleep(Duration::from_millis(1500));
    }
    let reqs = vec![Request::builtin(ar(256))];
    let (t0, noise) = (Instant::now(), Noise::start());
    let o = tune(ctx, &A::new(cfg(timeout, Policy::Max)), 0, &reqs)?;
    check_live_ranks_in_time(ctx, &o, late, timeout, t0, &noise)?;
    check_same_winners(ctx, &o, winners, " — a rank that arrives after the decision must adopt it")?;
    let named = |w: &String| w.contains(&format!("rank(s) {late}")) || w.contains(&format!("rank {late}"));
    let ok = o.missing == [late] && o.winner(0) == "native" && o.all_warnings().iter().any(named);
    if let Some(bad) = first_false(ctx, missing, ok)? {
        return Err(fail(ctx, format!("rank {bad}: {who} must be named in the outcome and every rank must use the default (this rank: missing {:?}, winner `{}`)\n{o}", o.missing, o.winner(0))));
    }
    Ok(())
}

fn builtin_reqs<B: Backend>(ws: usize) -> Vec<Request<B>> {
    let d0 = 16 * ws;
    vec![
        Request::builtin(OpInstance::all_reduce(DType::F32, &[d0, 8], ReduceOp::Sum)),
        Request::builtin(OpInstance::all_gather(DType::I32, &[d0, 4])),
        Request::builtin(OpInstance::reduce_scatter(DType::F32, &[d0, 8], ReduceOp::Sum)),
        Request::builtin(OpInstance::all_to_all(DType::F32, &[d0, 4])),
    ]
}

/// The requests whose op instance the backend declares it runs (a tuned op on a declared gap,
/// say bf16 where no bf16 is declared, may be refused as unsupported); UNSUPPORTED, naming the
/// declarations, when none is left.
fn declared_reqs<B: Backend>(ctx: &Ctx<'_, B>, reqs: Vec<Request<B>>) -> Result<Vec<Request<B>>, CaseEnd> {
    let caps = ctx.b.capabilities();
    let mut gaps = Vec::new();
    let kept: Vec<Request<B>> = reqs
        .into_iter()
        .filter(|r| match caps.check_call(r.inst.op, Some(Variant::Out), Some(r.inst.dtype), r.inst.reduce) {
            Ok(()) => true,
            Err(why) => {
                gaps.push(format!("{}/{} ({why})", r.inst.op, r.inst.dtype));
                false
            }
        })
        .collect();
    if kept.is_empty() {
        return Err(CaseEnd::Unsupported(format!("declared gap: every tuned op is declared unsupported: {}", gaps.join("; "))));
    }
    Ok(kept)
}

fn cache_path<B: Backend>(ctx: &Ctx<'_, B>, rank: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("concord-{}-at-cache-{:x}-r{rank}.json", ctx.world.world_id, concord_fixtures::seed_for(ctx.case)))
}

/// What [`policy_picks`] expects of a tuning: the winner `want`, which the reference model
/// picks from the injected per-rank delays by `margin`.
struct PolicyPick<'a> {
    want: &'a str,
    margin: Duration,
    /// The tuning's number (its store keys) at each attempt.
    seq: &'a dyn Fn(usize) -> usize,
    /// The prefix of the attempts' gather tags.
    tag: &'a str,
    /// Ends the failure when the ranks' winners differ.
    first_hint: &'a str,
    /// Ends the failure when the winner is not `want`.
    hint: &'a str,
}

/// Tunes `reqs()` with `config` and holds the declared policy to the injected delays: the
/// autotuner declares `config.policy`; the ranks agree; the recorded per-rank times reduce as
/// the policy says (`check_reference`, noise or not); the winner is `p.want`. A timed run is wall
/// time, so a loaded machine can move it: each rank adds up the time its threads waited for a CPU
/// while it tuned (`crate::sched`), and a winner other than the model's is a failure at once when
/// the ranks' noise together stays under the margin (it cannot have moved the decision); only a
/// tuning with more noise than the margin is run again, at most 3 times, and the last one's
/// verdict stands.
fn policy_picks<B: Backend, A: Autotuner<B>>(
    ctx: &Ctx<'_, B>,
    config: Config,
    reqs: impl Fn() -> Vec<Request<B>>,
    p: PolicyPick<'_>,
) -> CaseResult {
    const ATTEMPTS: usize = 3;
    let policy = config.policy;
    for attempt in 0..ATTEMPTS {
        let reqs = reqs();
        let a = A::new(config.clone());
        let declared = a.policy();
        if declared != policy {
            return Err(fail(ctx, format!("asked for policy {}, the autotuner declares {}", policy.name(), declared.name())));
        }
        let noise = Noise::start();
        let o = tune(ctx, &a, (p.seq)(attempt), &reqs)?;
        let mine = noise.so_far().as_secs_f64() * 1e3;
        let tag = format!("{}-{attempt}", p.tag);
        check_same_winners(ctx, &o, &format!("{tag}-first"), p.first_hint)?;
        check_reference(ctx, &o, &reqs, declared)?;
        if o.winner(0) == p.want {
            return Ok(());
        }
        let all = gather(ctx, &format!("{tag}-noise-ms"), &format!("{mine:.3}"))?;
        let noise_ms: f64 = all.iter().map(|s| s.parse::<f64>().unwrap_or(0.0)).sum();
        if noise_ms >= p.margin.as_secs_f64() * 1e3 && attempt + 1 < ATTEMPTS {
            continue;
        }
        return Err(fail(
            ctx,
            format!(
                "declared policy {}: winner `{}`, the reference model picks `{}` from the injected per-rank delays{} (attempt {} of \
                 {ATTEMPTS}; the ranks waited {noise_ms:.1} ms for a CPU while tuning, the decision's margin is {} ms)\n{o}",
                declared.name(),
                o.winner(0),
                p.want,
                p.hint,
                attempt + 1,
                p.margin.as_millis()
            ),
        ));
    }
    Ok(())
}

/// A 2-rank case (isolated, stall-bound, deadline 30 s) whose 2 s tuning call has
/// `slow_screen` sleep `ms.0` in its screening run on every rank, then rank 1 sleep `ms.1` in
/// phase `phase` of choice `hanging`: the live rank MUST end by the call's deadline, every rank
/// agree, and `hanging` hold inf ("never reported"; `hint` ends the failure).
fn hang_in_phase<B: Backend, A: Autotuner<B>>(
    name: &str,
    ms: (u64, u64),
    phase: Phase,
    hanging: &'static str,
    hint: &'static str,
) -> Case<B> {
    let mut c = Case::<B>::new(name, meta("all_reduce"), 2, move |ctx| {
        let timeout = Duration::from_secs(2);
        let slow = Choice::new("slow_screen", move |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
            if c.phase == Phase::Screen {
                std::thread::sleep(Duration::from_millis(ms.0));
            }
            native(c, x)
        });
        let reqs = vec![req(
            ar(1024),
            vec![slow, sleeps_on::<B>(hanging, 1, Duration::from_millis(ms.1), move |p| p == phase), Choice::new("after", native::<B>)],
            "after",
        )];
        let (t0, noise) = (Instant::now(), Noise::start());
        let o = tune(ctx, &A::new(cfg(timeout, Policy::Max)), 0, &reqs)?;
        check_live_ranks_in_time(ctx, &o, 1, timeout, t0, &noise)?;
        check_same_winners(ctx, &o, "hang", "")?;
        expect_inf(ctx, &o, hanging, 1, "never reported", hint)
    })
    .isolated()
    .stall_bound();
    c.deadline = Duration::from_secs(30);
    c
}

/// The autotune suite for autotuner `A` on backend `B`.
pub fn cases<B: Backend, A: Autotuner<B>>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    let t10 = Duration::from_secs(10);

    // ---- the seed's four phases ----
    v.push(Case::<B>::new("autotune::seed::one_op::ws2", meta("all_reduce"), 2, move |ctx| {
        let reqs = vec![Request::builtin(ar(4096))];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        check_presyncs(ctx, &o, 1)?;
        check_all(ctx, &o, &reqs, Policy::Max, "one")
    }));
    v.push(Case::<B>::new("autotune::seed::three_ops::ws2", meta("all_reduce,all_gather,reduce_scatter"), 2, move |ctx| {
        let reqs = vec![
            Request::builtin(ar(2048)),
            Request::builtin(OpInstance::all_gather(DType::F32, &[512])),
            Request::builtin(OpInstance::reduce_scatter(DType::F32, &[1024], ReduceOp::Sum)),
        ];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        check_presyncs(ctx, &o, 1)?;
        check_all(ctx, &o, &reqs, Policy::Max, "three")
    }));
    v.push(Case::<B>::new("autotune::seed::five_ops::ws4", meta("all_reduce,all_gather,reduce_scatter,all_to_all"), 4, move |ctx| {
        let reqs = vec![
            Request::builtin(ar(1024)),
            Request::builtin(OpInstance::all_reduce(DType::I32, &[4096], ReduceOp::Max)),
            Request::builtin(OpInstance::all_gather(DType::BF16, &[256])),
            Request::builtin(OpInstance::reduce_scatter(DType::F32, &[1024], ReduceOp::Sum)),
            Request::builtin(OpInstance::all_to_all(DType::I64, &[64])),
        ];
        let reqs = declared_reqs(ctx, reqs)?;
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        check_presyncs(ctx, &o, 1)?;
        check_all(ctx, &o, &reqs, Policy::Max, "five")
    }));
    let mut sleep = Case::<B>::new("autotune::seed::timeout_rank1_sleeps_10s::ws2", meta("all_reduce"), 2, move |ctx| {
        // Rank 1 sleeps 10 s inside the second choice; the autotune timeout is 1 s.
        let timeout = Duration::from_secs(1);
        let reqs = vec![req(
            ar(1024),
            vec![
                Choice::new("native", native::<B>),
                sleeps_on::<B>("sleeps_10s_on_rank1", 1, Duration::from_secs(10), |p| p == Phase::Screen),
                Choice::new("after", native::<B>),
            ],
            // Not the winner (`native`, timed before the timeout): a rank that falls back alone
            // to its default after the timeout ends differently.
            "after",
        )];
        let (t0, noise) = (Instant::now(), Noise::start());
        let o = tune(ctx, &A::new(cfg(timeout, Policy::Max)), 0, &reqs)?;
        check_live_ranks_in_time(ctx, &o, 1, timeout, t0, &noise)?;
        check_same_winners(ctx, &o, "sleep", " after a timeout: not every rank ended the same way")?;
        expect_inf(ctx, &o, "sleeps_10s_on_rank1", 1, "never reported", "")?;
        let after_not_run = matches!(o.tables[0].row("after").map(|r| &r.status), Some(RowStatus::NotRun(_)));
        if let Some(bad) = first_false(ctx, "after-not-run", after_not_run)? {
            return Err(fail(ctx, format!("rank {bad} ran or timed a choice after one timed out (the communicator may be unusable: every later choice must be not run on every rank)\n{o}")));
        }
        Ok(())
    })
    .isolated()
    .stall_bound();
    sleep.deadline = Duration::from_secs(40);
    v.push(sleep);

    // ---- the built-in choice sets ----
    for ws in [1, 2, 3, 4, 8] {
        v.push(Case::<B>::new(
            format!("autotune::builtin::ws{ws}"),
            meta("all_reduce,all_gather,reduce_scatter,all_to_all"),
            ws,
            move |ctx| {
                let reqs = builtin_reqs::<B>(ctx.world_size());
                require_some_choice(ctx, &reqs)?;
                let mut c = cfg(Duration::from_secs(14), Policy::Max);
                c.runs = 2;
                let o = tune_ungated(ctx, &A::new(c), 0, &reqs)?;
                check_skips(ctx, &o, &reqs)?;
                check_all(ctx, &o, &reqs, Policy::Max, "builtin")
            },
        ));
    }
    v.push(Case::<B>::new("autotune::no_store::ws1", meta("all_reduce"), 1, move |ctx| {
        let reqs = vec![Request::builtin(ar(256))];
        require_tuned(ctx, &reqs)?;
        let e = Env::new(ctx.b, None, "no-store", ctx.world.op_timeout);
        let o = A::new(cfg(t10, Policy::Max)).tune(&e, &reqs).map_err(|e| fail(ctx, e))?;
        if o.presyncs != 0 || !o.all_warnings().iter().any(|w| w.contains("no store")) {
            return Err(fail(
                ctx,
                format!("outside a world: expected local benchmarking (no pre-sync) and a warning saying `no store`\n{o}"),
            ));
        }
        let t = &o.tables[0];
        let untimed: Vec<&str> =
            t.rows.iter().filter(|r| !matches!(r.status, RowStatus::Ok | RowStatus::Skipped(_))).map(|r| r.choice.as_str()).collect();
        if t.defaulted || !untimed.is_empty() {
            return Err(fail(
                ctx,
                format!("outside a world the choices must still be benchmarked locally (a correct backend: every applicable choice timed), not the default taken untuned: not timed [{}]\n{o}", untimed.join(", ")),
            ));
        }
        check_reference(ctx, &o, &reqs, Policy::Max)?;
        check_outputs(ctx, &o, &reqs)
    }));

    // ---- one case per hazard ----
    v.push(Case::<B>::new("autotune::hazard::error_on_one_rank::ws3", meta("all_reduce"), 3, move |ctx| {
        let reqs = vec![req(
            ar(1024),
            vec![
                Choice::new("native", native::<B>),
                errors_on::<B>("errors_on_rank2", 2, false),
                delayed::<B>("later", &[], Duration::ZERO),
                // Passes screening, then fails in timed run 1 (review19: a timing loop that
                // ignores its runs' results times it as fast). On every rank: an error on one
                // rank desynchronises the barrier that follows, a timeout that ends every later choice.
                Choice::new("errors_in_timed_run", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                    let out = native(c, x)?;
                    if c.phase == Phase::Timed(1) {
                        return Err(CollectiveError::Backend("injected error in a timed run".into()));
                    }
                    Ok(out)
                }),
            ],
            "native",
        )];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        expect_inf(ctx, &o, "errors_on_rank2", 2, "injected error", " (a failure on one rank must be inf on every rank)")?;
        if !matches!(o.tables[0].row("later").map(|r| &r.status), Some(RowStatus::Ok)) {
            return Err(fail(
                ctx,
                format!("an error (not a timeout) leaves the communicator usable: the next choice must still be timed\n{o}"),
            ));
        }
        // After the checks above, whose failures name the broken tuners they were written for.
        expect_inf(ctx, &o, "errors_in_timed_run", 0, "injected error in a timed run", " (a choice failing after screening)")?;
        check_all(ctx, &o, &reqs, Policy::Max, "err")
    }));
    v.push(Case::<B>::new("autotune::hazard::panic_on_one_rank::ws2", meta("all_reduce"), 2, move |ctx| {
        let reqs = vec![req(
            ar(1024),
            vec![
                delayed::<B>("native_plus_2ms", &[], Duration::from_millis(2)),
                panics_on::<B>("panics_on_rank1", 1),
                delayed::<B>("ring_plus_3ms", &[], Duration::from_millis(3)),
            ],
            "native_plus_2ms",
        )];
        let o = tune(ctx, &A::new(cfg(Duration::from_secs(3), Policy::Max)), 0, &reqs)?;
        expect_inf(
            ctx,
            &o,
            "panics_on_rank1",
            1,
            "panicked",
            " — a rank-local fallback: a choice that failed on one rank was not made inf on every rank",
        )?;
        check_same_winners(ctx, &o, "panic", " — a rank-local fallback: ranks that fall back alone pick differently")?;
        check_reference(ctx, &o, &reqs, Policy::Max)?;
        check_outputs(ctx, &o, &reqs)
    }));
    v.push(Case::<B>::new("autotune::hazard::fast_but_wrong::ws2", meta("all_reduce"), 2, move |ctx| {
        // `wrong_in_last_element`: the native op, then its last element replaced by the input's
        // (a chunked kernel that forgets the remainder): right everywhere but at the end.
        let wrong_tail = Choice::new("wrong_in_last_element", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
            let mut t = c.b.download(&native(c, x)?)?;
            let last = c.b.download(x)?.as_slice::<f32>()[c.inst.numel() - 1];
            t.as_mut_slice::<f32>()[c.inst.numel() - 1] = last;
            c.b.upload(&t)
        });
        let reqs = vec![req(ar(1024), vec![Choice::new("native", native::<B>), fast_wrong::<B>("fast_but_wrong"), wrong_tail], "native")];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        check_outputs(ctx, &o, &reqs)?;
        expect_inf(ctx, &o, "fast_but_wrong", 0, "first bad index", " — the wrong choice was not rejected before timing (no screening)")?;
        expect_inf(
            ctx,
            &o,
            "wrong_in_last_element",
            0,
            "first bad index 1023",
            " — a choice wrong in its last element only was timed: screening must compare every element",
        )?;
        check_all(ctx, &o, &reqs, Policy::Max, "wrong")
    }));
    v.push(Case::<B>::new("autotune::hazard::lossy_but_exact_on_integers::ws2", meta("all_reduce"), 2, move |ctx| {
        // `f16_wire` sends f32 through f16 (half the bytes: PyTorch DDP's
        // `fp16_compress_hook`, a compressed all-reduce): the fixtures' small integers
        // (|x| <= 1000, within f16's 11 bits) come back exact, values that fill f32's
        // significand do not. It is the fastest choice, so only screening on inputs that need
        // the whole significand keeps it out (review-d, finding 7).
        let wire = Choice::new("f16_wire", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
            let t = c.b.download(x)?;
            let v: Vec<f32> = t.as_slice::<f32>().iter().map(|x| concord_core::half::f16::from_f32(*x).to_f32()).collect();
            native(c, &c.b.upload(&concord_core::Tensor::from_vec(t.shape(), v))?)
        });
        let reqs = vec![req(ar(1024), vec![delayed::<B>("native_plus_20ms", &[], Duration::from_millis(20)), wire], "native_plus_20ms")];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        expect_inf(
            ctx,
            &o,
            "f16_wire",
            0,
            "first bad index",
            " — a lossy choice passed screening: screening inputs must fill the significand (small integers cross an f16 wire exactly)",
        )?;
        check_all(ctx, &o, &reqs, Policy::Max, "lossy")
    }));
    v.push(
        Case::<B>::new("autotune::hazard::max_vs_avg::ws2", meta("all_reduce"), 2, move |ctx| {
            // Rank 1 alone spends 120 ms after the collective in `slow_on_rank1`; every rank spends
            // 90 ms in `uniform`. Max: uniform (90 < 120); Avg and Median: slow_on_rank1 (60 < 90).
            // Both decisions have 30 ms to spare. A timed run is wall time, so a loaded machine
            // can move it by more (seen: a 28 ms sleep measured as 51, a native run of ~60 ms):
            // `policy_picks` runs again only a tuning whose ranks waited for a CPU longer than
            // that (`crate::sched`; the whole call, so a peer's late wake-up between runs counts).
            for (n, policy, want) in [(0, Policy::Max, "uniform"), (1, Policy::Avg, "slow_on_rank1")] {
                let reqs = || {
                    vec![req(
                        ar(256),
                        vec![
                            delayed::<B>("slow_on_rank1", &[1], Duration::from_millis(120)),
                            delayed::<B>("uniform", &[], Duration::from_millis(90)),
                        ],
                        "uniform",
                    )]
                };
                let hint = if policy == Policy::Max { " — averaging per-rank times hides the slow rank" } else { "" };
                policy_picks::<B, A>(
                    ctx,
                    cfg(t10, policy),
                    reqs,
                    PolicyPick {
                        want,
                        margin: Duration::from_millis(30),
                        seq: &|attempt| n + 2 * attempt,
                        tag: &format!("policy{n}"),
                        first_hint: " — each rank must pick from every rank's times reduced by the declared policy, not from its own times",
                        hint,
                    },
                )?;
            }
            Ok(())
        })
        .stall_bound(),
    );
    v.push(
        Case::<B>::new("autotune::hazard::median_vs_avg::ws3", meta("all_reduce"), 3, move |ctx| {
            // Policy::Median run (review19, finding 7: only the reference model ran it; at 2
            // ranks the median is the mean). Ranks 1 and 2 spend 900 ms after the collective in
            // `two_slow` (per rank about [0, 900, 900]: median 900, mean 600); every rank spends
            // 750 ms in `uniform` (750 both ways). Median: uniform, by 150 ms; Avg would pick
            // two_slow, by 150 ms. One timed run each (the median over runs plays no part). The
            // declared reduction is checked on the recorded per-rank times, noise or not; the
            // winner with `max_vs_avg`'s noise rule (`policy_picks`).
            let reqs = || {
                vec![req(
                    ar(256),
                    vec![
                        delayed::<B>("two_slow", &[1, 2], Duration::from_millis(900)),
                        delayed::<B>("uniform", &[], Duration::from_millis(750)),
                    ],
                    "two_slow",
                )]
            };
            policy_picks::<B, A>(
                ctx,
                Config { runs: 1, ..cfg(t10, Policy::Median) },
                reqs,
                PolicyPick {
                    want: "uniform",
                    margin: Duration::from_millis(150),
                    seq: &|attempt| attempt,
                    tag: "median",
                    first_hint: "",
                    hint: " — it is what Avg picks",
                },
            )
        })
        .stall_bound(),
    );
    v.push(Case::<B>::new("autotune::hazard::different_candidate_lists::ws2", meta("all_reduce"), 2, move |ctx| {
        let mut choices = vec![Choice::new("native", native::<B>), Choice::new("copy_of_native", native::<B>)];
        if ctx.rank() == 1 {
            choices.push(Choice::new("only_on_rank1", native::<B>));
        }
        let reqs = vec![req(ar(256), choices, "native")];
        require_tuned(ctx, &reqs)?;
        let got = A::new(cfg(Duration::from_secs(3), Policy::Max)).tune(&env(ctx, 0), &reqs);
        let mine = match &got {
            Err(e) if e.name() == "candidate_mismatch" && e.to_string().contains("only_on_rank1") => "named".to_string(),
            Err(e) => format!("error {e}"),
            Ok(o) => format!("tuned, winner `{}`", o.winner(0)),
        };
        let all = gather(ctx, "mismatch", &mine)?;
        if let Some(bad) = all.iter().position(|s| s != "named") {
            return Err(fail(ctx, format!("ranks with different candidate lists: rank {bad} ended with {} instead of the named error candidate_mismatch naming the lists", all[bad])));
        }
        Ok(())
    }));
    v.push(
        Case::<B>::new("autotune::hazard::rank_missing_at_presync::ws3", meta("all_reduce"), 3, move |ctx| {
            // Rank 2 comes 1.5 s late to a tuning with a 0.5 s timeout: the others decide without it
            // (default choice, naming rank 2), and rank 2 adopts that decision when it arrives.
            missing_at_presync::<B, A>(ctx, 2, "late", "missing", "a rank missing at the pre-sync")
        })
        .stall_bound(),
    );
    v.push(
        Case::<B>::new("autotune::hazard::rank0_missing_at_presync::ws3", meta("all_reduce"), 3, move |ctx| {
            // review11 (finding 2): the same with rank 0 the late one (every other timing hazard's
            // slow rank is not 0): ranks 1 and 2 decide without it by the deadline and rank 0 adopts
            // that decision; a leader-based tuner whose followers wait for rank 0's decision with the
            // op timeout keeps them waiting until rank 0 arrives.
            missing_at_presync::<B, A>(ctx, 0, "late0", "missing0", "rank 0, missing at the pre-sync,")
        })
        .stall_bound(),
    );
    v.push(Case::<B>::new("autotune::hazard::all_inf_uses_default::ws2", meta("all_reduce"), 2, move |ctx| {
        let reqs = vec![req(
            ar(512),
            vec![fast_wrong::<B>("wrong"), errors_on::<B>("fails_screening_on_rank0", 0, true)],
            "fails_screening_on_rank0",
        )];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        let ok = o.winner(0) == "fails_screening_on_rank0" && o.all_warnings().iter().any(|w| w.contains("default"));
        if let Some(bad) = first_false(ctx, "default", ok)? {
            return Err(fail(
                ctx,
                format!("rank {bad}: every choice inf must give the declared default on every rank, with a warning saying so\n{o}"),
            ));
        }
        check_reference(ctx, &o, &reqs, Policy::Max)?;
        check_outputs(ctx, &o, &reqs)
    }));
    // The timed runs have a deadline too, and it is the call's, not each run's:
    // `slow_screen` spends 1.2 s of the 2 s timeout in its screening run on every rank, then
    // rank 1 sleeps 2.5 s in the second timed run of `hangs_in_timed_run_on_rank1`. Rank 0
    // ends by the call's deadline (2 s, + slack); a run given the whole timeout from its own
    // start waits until about 3.2 s.
    v.push(hang_in_phase::<B, A>(
        "autotune::hazard::hang_in_timed_runs::ws2",
        (1200, 2500),
        Phase::Timed(1),
        "hangs_in_timed_run_on_rank1",
        " — the timed runs need a deadline too",
    ));
    // The warm-up runs have the call's deadline too (review19, finding 6: a warm-up loop
    // written before the timed loop got its deadline waits with the op timeout): `slow_screen`
    // spends 0.6 s of the 2 s timeout screening, then rank 1 sleeps 3.5 s in the warm-up run of
    // `hangs_in_warmup_on_rank1`. Rank 0 ends by the call's deadline (2 s, + slack); a warm-up
    // run given the op timeout waits until about 4.1 s. (With `hang_in_timed_runs`' 1.2 s the
    // screening itself ran out of the deadline once under load: 1.4 s are left for it here.)
    v.push(hang_in_phase::<B, A>(
        "autotune::hazard::hang_in_warmup::ws2",
        (600, 3500),
        Phase::Warmup(0),
        "hangs_in_warmup_on_rank1",
        " — the warm-up runs need the call's deadline too",
    ));

    // ---- subgroups ----
    v.push(Case::<B>::new("autotune::subgroup::halves_tune_apart::ws4", meta("all_reduce"), 4, move |ctx| {
        // Both halves of the world tune at the same time, each on its own communicator: the
        // pre-sync and the decision count the group's ranks (not the world's), each half agrees
        // on one winner, and the tuned op computes the half's result.
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let (ga, gb) = (ctx.b.new_group(&[0, 1])?, ctx.b.new_group(&[2, 3])?);
        let (g, members) = match (ga, gb) {
            (Some(g), None) => (g, vec![0usize, 1]),
            (None, Some(g)) => (g, vec![2usize, 3]),
            _ => return Err(fail(ctx, "new_group([0, 1]) / new_group([2, 3]) did not give this rank exactly one communicator")),
        };
        // `fast_on_0_1` pays 60 ms per timed run on ranks 2 and 3, `fast_on_2_3` on ranks 0 and
        // 1: each half has its own winner, so a decision shared across the halves (store keys
        // without the group) is wrong for one of them. (60 ms: a margin no scheduling hiccup of a
        // loaded 2-core machine closes.)
        let slow_here = |name: &str, slow: bool| {
            Choice::new(name, move |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                let out = native(c, x)?;
                if slow && matches!(c.phase, Phase::Timed(_)) {
                    std::thread::sleep(Duration::from_millis(60));
                }
                Ok(out)
            })
        };
        let low = ctx.rank() < 2;
        let reqs = vec![req(ar(1024), vec![slow_here("fast_on_0_1", !low), slow_here("fast_on_2_3", low)], "fast_on_0_1")];
        let mut e = Env::new(&g, Some(ctx.store), format!("{}/{}/half{}", ctx.case, ctx.world.world_id, members[0]), ctx.world.op_timeout);
        e.group_ranks = members.clone();
        require_tuned(ctx, &reqs)?;
        let o = A::new(cfg(t10, Policy::Max))
            .tune(&e, &reqs)
            .map_err(|err| fail(ctx, format!("tune on the subgroup {members:?} failed: {err} [{}]", err.name())))?;
        let all = gather(ctx, "half-winner", o.winner(0))?;
        let half = |r: usize| if r < 2 { 0 } else { 1 };
        for (r, w) in all.iter().enumerate() {
            if half(r) == half(ctx.rank()) && *w != o.winner(0) {
                return Err(fail(ctx, format!("ranks of the subgroup {members:?} ended with different winners (rank {r}: `{w}`, this rank: `{}`)\n{o}", o.winner(0))));
            }
        }
        if let Some(r) = all.iter().enumerate().position(|(r, w)| w != if r < 2 { "fast_on_0_1" } else { "fast_on_2_3" }) {
            return Err(fail(
                ctx,
                format!("the subgroups ended with winners {all:?} (rank order); each half must pick the choice fast on its own ranks (ranks 0, 1: `fast_on_0_1`; ranks 2, 3: `fast_on_2_3`): rank {r} took the other half's decision — the two groups' agreements were not kept apart (store keys without the group?)\n{o}"),
            ));
        }
        check_reference(ctx, &o, &reqs, Policy::Max)?;
        // The tuned op on the group: the group's sum, not the world's.
        let (gr, gws) = (g.rank(), g.world_size());
        let i = &reqs[0].inst;
        let seed = concord_fixtures::seed_for(&format!("{}/{}", ctx.case, i.key()));
        let mut inputs = concord_fixtures::inputs(seed, gws, i.dtype, &i.shape, i.reduce, InputKind::Exact);
        concord_fixtures::widen(&mut inputs, i.reduce);
        let exp = concord_oracle::expected(&i.collective(gws), &inputs, &Semantics::of(&g.capabilities())).map_err(|err| fail(ctx, format!("{err:?}")))?;
        let out = run_choice(&g, &reqs[0], o.winner(0), &g.upload(&inputs[gr])?, ctx.timeout)
            .map_err(|err| fail(ctx, format!("tuned op {i} on the subgroup {members:?} (winner `{}`) failed: {err}", o.winner(0))))?;
        compare(&g.download(&out)?, &exp.outputs[gr], Tolerance::Exact).map_err(|m| {
            fail(
                ctx,
                format!(
                    "tuned op {i} on the subgroup {members:?} (group rank {gr}, winner `{}`) is wrong: first bad index {} got {} expected {} ({})",
                    o.winner(0),
                    m.index,
                    m.got,
                    m.expected,
                    m.detail
                ),
            )
        })
    }));

    // ---- the cache ----
    v.push(Case::<B>::new("autotune::cache::reused_by_a_later_process::ws2", meta("all_reduce,all_gather"), 2, move |ctx| {
        let path = cache_path(ctx, ctx.rank());
        let _ = std::fs::remove_file(&path);
        let mut c = cfg(t10, Policy::Max);
        c.cache = Some(path.clone());
        let reqs = vec![Request::builtin(ar(1024)), Request::builtin(OpInstance::all_gather(DType::F32, &[256]))];
        // The file goes on every path, a failed first tuning included.
        let both = (|| {
            let first = tune(ctx, &A::new(c.clone()), 0, &reqs)?;
            check_same_winners(ctx, &first, "first", "")?;
            // A new autotuner with the same file: all it knows comes from the file (a later process).
            let second = tune(ctx, &A::new(c), 1, &reqs)?;
            Ok::<_, CaseEnd>((first, second))
        })();
        let _ = std::fs::remove_file(&path);
        let (first, second) = both?;
        let same: Vec<bool> = first.tables.iter().zip(&second.tables).map(|(a, b)| a.winner == b.winner && b.from_cache && b.ran() == 0).collect();
        if same.iter().any(|s| !s) || second.presyncs != 1 {
            return Err(fail(ctx, format!("a second tuning with every rank's cache file must reuse the cached winners through one pre-sync, running no choice\nfirst:\n{first}second:\n{second}")));
        }
        check_same_winners(ctx, &second, "second", "")?;
        check_outputs(ctx, &second, &reqs)
    }));
    v.push(Case::<B>::new("autotune::cache::partial_hit_retunes::ws2", meta("all_reduce"), 2, move |ctx| {
        // Rank 1 alone holds a (stale) cached winner; then both hold different ones. Either way
        // every rank must re-tune: no rank may use a hit the others do not share.
        let reqs = vec![req(
            ar(512),
            vec![Choice::new("native", native::<B>), delayed::<B>("slower", &[], Duration::from_millis(5)), delayed::<B>("slowest", &[], Duration::from_millis(10))],
            "native",
        )];
        let names: Vec<String> = reqs[0].choices.iter().map(|c| c.name.clone()).collect();
        let key = cache::key(ctx.b.name(), &reqs[0].inst, &(0..ctx.world_size()).collect::<Vec<_>>(), &names_hash(&names), Policy::Max);
        let path = cache_path(ctx, ctx.rank());
        for (n, stale) in [(0, [None, Some("slowest")]), (1, [Some("slower"), Some("slowest")])] {
            let _ = std::fs::remove_file(&path);
            if let Some(w) = stale[ctx.rank().min(1)] {
                let mut cf = cache::Cache::default();
                cf.put(key.clone(), cache::Entry { winner: w.into(), policy: "max".into(), reduced_ns: Some(1) });
                cf.save(&path).map_err(|e| fail(ctx, e))?;
            }
            let mut c = cfg(Duration::from_secs(2), Policy::Max);
            c.cache = Some(path.clone());
            let o = tune(ctx, &A::new(c), n, &reqs);
            let _ = std::fs::remove_file(&path);
            let o = o?;
            let all = gather(ctx, &format!("cache{n}"), &format!("{} {}", o.tables[0].from_cache, o.winner(0)))?;
            if all.iter().any(|s| s != &all[0]) || o.tables[0].from_cache {
                let per = all.iter().enumerate().map(|(r, s)| format!("rank {r}: from_cache/winner {s}")).collect::<Vec<_>>().join("; ");
                return Err(fail(ctx, format!("a cache not agreed across ranks: with cached winners {stale:?} (rank 0, rank 1) every rank must re-tune and end the same way ({per})\n{o}")));
            }
            check_reference(ctx, &o, &reqs, Policy::Max)?;
        }
        Ok(())
    }));
    v.push(Case::<B>::new("autotune::cache::key_covers_dtype_reduce_op_and_candidates::ws2", meta("all_reduce"), 2, move |ctx| {
        // One cache file, one later process per step: a decision cached for f32/sum/[512] under
        // policy max must not be taken for the same op with another dtype, reduce op, shape,
        // candidate list or policy. `sums_always` computes a sum whatever the reduce op: reused
        // for max it is a wrong tuned op. A winner under max is not one under avg (review11: the
        // reference tuner's own key once left the policy out).
        let path = cache_path(ctx, ctx.rank());
        let _ = std::fs::remove_file(&path);
        let sums_always = || {
            Choice::new("sums_always", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| c.wait(c.b.all_reduce(x, ReduceOp::Sum)?))
        };
        let set = |inst: OpInstance| req(inst, vec![sums_always(), delayed::<B>("native_plus_20ms", &[], Duration::from_millis(20))], "native_plus_20ms");
        let base = OpInstance::all_reduce(DType::F32, &[512], ReduceOp::Sum);
        let mut c = cfg(t10, Policy::Max);
        c.cache = Some(path.clone());
        let steps: Vec<(&str, Vec<Request<B>>, Policy)> = vec![
            ("the dtype", vec![set(OpInstance::all_reduce(DType::I32, &[512], ReduceOp::Sum))], Policy::Max),
            ("the reduce op", vec![set(OpInstance::all_reduce(DType::F32, &[512], ReduceOp::Max))], Policy::Max),
            ("the shape", vec![set(OpInstance::all_reduce(DType::F32, &[4096], ReduceOp::Sum))], Policy::Max),
            (
                "the candidate list",
                {
                    let mut r = set(base.clone());
                    r.choices.insert(0, Choice::new("native_added_later", native::<B>));
                    vec![r]
                },
                Policy::Max,
            ),
            ("the policy", vec![set(base.clone())], Policy::Avg),
        ];
        let run = || -> CaseResult {
            let first = tune(ctx, &A::new(c.clone()), 0, &[set(base.clone())])?;
            check_same_winners(ctx, &first, "key-first", "")?;
            for (n, (part, reqs, policy)) in steps.iter().enumerate() {
                let mut c = c.clone();
                c.policy = *policy;
                let o = tune(ctx, &A::new(c), n + 1, reqs)?;
                let all = gather(ctx, &format!("key{n}"), &o.tables[0].from_cache.to_string())?;
                if let Some(bad) = all.iter().position(|s| s != "false") {
                    return Err(fail(
                        ctx,
                        format!(
                            "rank {bad}: the decision cached for {base} under policy max (winner `{}`) was reused for {} under policy {} — a cache key without {part}: every part of the instance, the candidate list and the policy must be in the key\n{o}",
                            first.winner(0),
                            reqs[0].inst,
                            policy.name()
                        ),
                    ));
                }
                check_all(ctx, &o, reqs, *policy, &format!("key{n}"))?;
            }
            Ok(())
        };
        let r = run();
        let _ = std::fs::remove_file(&path);
        r
    }));
    v.push(Case::<B>::new("autotune::cache::key_covers_the_group::ws4", meta("all_reduce"), 4, move |ctx| {
        // Each half of the world tunes on its own communicator with its cache file, then the whole
        // world tunes the same op with the same files: a decision cached for the group [0, 1] or
        // [2, 3] must not be taken for the group [0, 1, 2, 3] (another group, another world size).
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let (ga, gb) = (ctx.b.new_group(&[0, 1])?, ctx.b.new_group(&[2, 3])?);
        let (g, members) = match (ga, gb) {
            (Some(g), None) => (g, vec![0usize, 1]),
            (None, Some(g)) => (g, vec![2usize, 3]),
            _ => return Err(fail(ctx, "new_group([0, 1]) / new_group([2, 3]) did not give this rank exactly one communicator")),
        };
        let path = cache_path(ctx, ctx.rank());
        let _ = std::fs::remove_file(&path);
        // 200 ms apart, so that both halves cache the same winner however loaded the machine:
        // with 20 ms, a half that picked the slower choice under load left the halves' cached
        // winners different, the world's lookup missed on its own, and a key without the group
        // went unseen (`faulty::cache_ignores_group` passed once in a fresh-clone CI run).
        let reqs = vec![req(ar(1024), vec![Choice::new("native", native::<B>), delayed::<B>("native_plus_200ms", &[], Duration::from_millis(200))], "native_plus_200ms")];
        let mut c = cfg(t10, Policy::Max);
        c.cache = Some(path.clone());
        let run = || -> CaseResult {
            let mut e = Env::new(&g, Some(ctx.store), format!("{}/{}/half{}", ctx.case, ctx.world.world_id, members[0]), ctx.world.op_timeout);
            e.group_ranks = members.clone();
            require_tuned(ctx, &reqs)?;
            let half = A::new(c.clone())
                .tune(&e, &reqs)
                .map_err(|err| fail(ctx, format!("tune on the subgroup {members:?} failed: {err} [{}]", err.name())))?;
            let o = tune(ctx, &A::new(c.clone()), 1, &reqs)?;
            let all = gather(ctx, "group-key", &o.tables[0].from_cache.to_string())?;
            if let Some(bad) = all.iter().position(|s| s != "false") {
                return Err(fail(
                    ctx,
                    format!(
                        "rank {bad}: the decision cached by the subgroup {members:?} (winner `{}`) was reused for the whole world [0, 1, 2, 3] — a cache key without the group: the group's ranks must be in the key\n{o}",
                        half.winner(0)
                    ),
                ));
            }
            check_all(ctx, &o, &reqs, Policy::Max, "group-key")
        };
        let r = run();
        let _ = std::fs::remove_file(&path);
        r
    }));
    v.push(Case::<B>::new("autotune::cache::default_not_cached::ws2", meta("all_reduce"), 2, move |ctx| {
        // The first tuning meets a transient fault: both choices fail on every rank, and every
        // rank takes the declared default. A later process with the same file finds them working:
        // a default taken because every choice was inf is not a measured winner, so it is not
        // cached, and the later process tunes.
        let broken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mk = |name: &str, delay: Duration| {
            let broken = broken.clone();
            Choice::new(name, move |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                if broken.load(std::sync::atomic::Ordering::SeqCst) && c.phase != Phase::Use {
                    return Err(CollectiveError::Backend("injected transient fault".into()));
                }
                let out = native(c, x)?;
                if matches!(c.phase, Phase::Timed(_)) {
                    std::thread::sleep(delay);
                }
                Ok(out)
            })
        };
        let reqs = vec![req(ar(512), vec![mk("native", Duration::ZERO), mk("native_plus_20ms", Duration::from_millis(20))], "native_plus_20ms")];
        let path = cache_path(ctx, ctx.rank());
        let _ = std::fs::remove_file(&path);
        let mut c = cfg(t10, Policy::Max);
        c.cache = Some(path.clone());
        let run = || -> CaseResult {
            let first = tune(ctx, &A::new(c.clone()), 0, &reqs)?;
            if !first.tables[0].defaulted || first.winner(0) != "native_plus_20ms" {
                return Err(fail(ctx, format!("every choice failed on every rank: the declared default `native_plus_20ms` must be used, marked defaulted\n{first}")));
            }
            broken.store(false, std::sync::atomic::Ordering::SeqCst);
            let o = tune(ctx, &A::new(c.clone()), 1, &reqs)?;
            let all = gather(ctx, "default-cached", &o.tables[0].from_cache.to_string())?;
            if let Some(bad) = all.iter().position(|s| s != "false") {
                return Err(fail(
                    ctx,
                    format!("rank {bad}: the declared default of a tuning where every choice was inf was cached and reused by a later tuning — only a measured winner may be cached (a transient fault would never be tuned again)\n{o}"),
                ));
            }
            check_all(ctx, &o, &reqs, Policy::Max, "default-cached")
        };
        let r = run();
        let _ = std::fs::remove_file(&path);
        r
    }));
    v.push(
        Case::<B>::new("autotune::hazard::hang_after_last_timed_run::ws2", meta("all_reduce"), 2, move |ctx| {
            // `hangs_after_its_runs_on_rank1` completes every collective on every rank, then rank 1
            // sleeps 1.5 s after its last timed run, past the 1 s deadline: rank 0 timed it, rank 1
            // never reports. Its time is unknown and rank 1 may be stuck in it: inf on every rank
            // (naming rank 1), and no later choice runs.
            let reqs = vec![req(ar(1024), hangs_after_last_timed_run::<B>(1, Duration::from_millis(1500)), "after")];
            let o = tune(ctx, &A::new(cfg(Duration::from_secs(1), Policy::Max)), 0, &reqs)?;
            check_same_winners(ctx, &o, "after-runs", "")?;
            expect_inf(
                ctx,
                &o,
                "hangs_after_its_runs_on_rank1",
                1,
                "never reported",
                " — a choice timed on the other ranks but never reported by one was kept as timed over the ranks that reported",
            )?;
            check_reference(ctx, &o, &reqs, Policy::Max)
        })
        .stall_bound(),
    );
    v.push(
        Case::<B>::new("autotune::hazard::rank0_hangs_after_last_timed_run::ws2", meta("all_reduce"), 2, move |ctx| {
            // review11 (finding 2): `hang_after_last_timed_run` with rank 0 the one that hangs
            // (2.5 s past a 1 s deadline): rank 1 ends by the deadline (+ slack) with the choice
            // inf naming rank 0, not when rank 0 wakes up (a follower waiting for the leader's
            // decision with the op timeout).
            let reqs = vec![req(ar(1024), hangs_after_last_timed_run::<B>(0, Duration::from_millis(2500)), "after")];
            let timeout = Duration::from_secs(1);
            let (t0, noise) = (Instant::now(), Noise::start());
            let o = tune(ctx, &A::new(cfg(timeout, Policy::Max)), 0, &reqs)?;
            check_live_ranks_in_time(ctx, &o, 0, timeout, t0, &noise)?;
            check_same_winners(ctx, &o, "after-runs0", "")?;
            expect_inf(
                ctx,
                &o,
                "hangs_after_its_runs_on_rank0",
                0,
                "never reported",
                " — a choice timed on the other ranks but never reported by rank 0 was kept as timed over the ranks that reported",
            )?;
            check_reference(ctx, &o, &reqs, Policy::Max)
        })
        .stall_bound(),
    );
    v.push(
        Case::<B>::new("autotune::hazard::slow_first_call::ws2", meta("all_reduce"), 2, move |ctx| {
            // With 2 warm-up runs and 3 timed runs: `lazy_init` pays 150 ms in each of its first
            // 2 runs after screening (a one-off set-up), then runs at native speed; `hiccup` pays
            // 450 ms in its timed run 1 only (one outlier run: a preempted rank, a page fault).
            // With the warm-up runs untimed and a rank's time the median of its timed runs, both
            // take native time, far under 150 ms. Timing a warm-up run makes lazy_init's median
            // at least 150 ms; the mean of the runs makes hiccup's at least 150 ms. (No bar set by
            // another choice's time: a native run slow under load must not decide.)
            let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let lazy = Choice::new("lazy_init", move |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                if matches!(c.phase, Phase::Warmup(_) | Phase::Timed(_)) && calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                    std::thread::sleep(Duration::from_millis(150));
                }
                native(c, x)
            });
            let hiccup = Choice::new("hiccup", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
                if c.phase == Phase::Timed(1) {
                    std::thread::sleep(Duration::from_millis(450));
                }
                native(c, x)
            });
            let reqs = vec![req(ar(1024), vec![lazy, hiccup], "hiccup")];
            let mut c = cfg(t10, Policy::Max);
            c.warmup = 2;
            let o = tune(ctx, &A::new(c), 0, &reqs)?;
            check_same_winners(ctx, &o, "lazy", "")?;
            let t = &o.tables[0];
            let max_ns = |name: &str| {
                t.row(name)
                    .filter(|r| r.status == RowStatus::Ok)
                    .and_then(|r| r.per_rank_ns.iter().copied().collect::<Option<Vec<u64>>>())
                    .map(|v| v.into_iter().max().unwrap_or(0))
            };
            let bar = Duration::from_millis(150).as_nanos() as u64;
            for (name, why) in [
                ("lazy_init", "the one-off cost (150 ms in each of its first 2 runs after screening) of lazy_init was timed — the configured warm-up runs (2) must be untimed"),
                ("hiccup", "one outlier run (450 ms in timed run 1 of 3) decided hiccup's time — a rank's time must be the median of its timed runs (3), not their mean"),
            ] {
                if max_ns(name).is_none_or(|x| x >= bar) {
                    let ms = max_ns(name).map(|x| format!("{:.1} ms", x as f64 / 1e6)).unwrap_or_else(|| "inf".into());
                    return Err(fail(ctx, format!("`{name}` took {ms} (slowest rank), not under 150 ms: {why}\n{o}")));
                }
            }
            check_reference(ctx, &o, &reqs, Policy::Max)?;
            check_outputs(ctx, &o, &reqs)
        })
        .stall_bound(),
    );
    v.push(Case::<B>::new("autotune::hazard::not_applicable_is_skipped::ws3", meta("all_reduce"), 3, move |ctx| {
        // `pow2_only` declares itself applicable to power-of-two worlds only, and errors when run
        // elsewhere: on 3 ranks it MUST be skipped by name on every rank, never run.
        let pow2_only = Choice::new("pow2_only", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
            if !c.b.world_size().is_power_of_two() {
                return Err(CollectiveError::Backend(format!("pow2_only run on {} ranks", c.b.world_size())));
            }
            native(c, x)
        })
        .when(|_, ws| ws.is_power_of_two());
        let reqs = vec![req(ar(768), vec![pow2_only, Choice::new("native", native::<B>)], "native")];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        let skipped = matches!(o.tables[0].row("pow2_only").map(|r| &r.status), Some(RowStatus::Skipped(_)));
        if let Some(bad) = first_false(ctx, "skipped", skipped)? {
            return Err(fail(
                ctx,
                format!("rank {bad}: choice `pow2_only` (applicable to power-of-two worlds only) was not skipped on 3 ranks — `Choice::applies` was ignored and a choice run where it does not apply\n{o}"),
            ));
        }
        check_all(ctx, &o, &reqs, Policy::Max, "applies")
    }));
    // hunt20 (NVIDIA/nccl #1136: a rank-local term in the decision). Eight identical choices
    // per op, eight ops: their agreed times differ by noise alone (µs), so any rank-local input
    // to the decision (a per-host cost model, a local bias, a local tie-break) flips some
    // near-tie on some rank. The decision MUST be the policy's reduction of the agreed table,
    // argmin with ties to the earlier choice, on every rank; then near-ties are harmless.
    for ws in [2, 4] {
        v.push(Case::<B>::new(format!("autotune::hazard::near_ties_decided_from_table::ws{ws}"), meta("all_reduce"), ws, move |ctx| {
            let twins = |n: usize| {
                req(ar(n), (0..8).map(|i| Choice::new(&format!("twin{i}"), native::<B>)).collect(), "twin0")
            };
            // Eight ops: a rank-local term must lose every near-tie to go unseen (hunt20's model
            // of it was missed now and then with four).
            let reqs: Vec<Request<B>> = [64, 96, 128, 160, 192, 224, 256, 288].into_iter().map(twins).collect();
            let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
            check_same_winners(
                ctx,
                &o,
                "twins",
                " — eight identical choices whose agreed times differ by noise alone: every rank MUST pick the declared policy's argmin of the agreed table (a rank-local term in the decision, such as a per-host cost model, splits the ranks at near-ties)",
            )?;
            check_reference(ctx, &o, &reqs, Policy::Max)?;
            check_outputs(ctx, &o, &reqs)
        }));
    }
    v.push(Case::<B>::new("autotune::hazard::wrong_on_one_rank::ws2", meta("all_reduce"), 2, move |ctx| {
        // `wrong_on_rank1` computes the sum on rank 0 and returns its input unchanged on rank 1:
        // every rank checks its own output, so it is inf on every rank, naming rank 1.
        let wrong = Choice::new("wrong_on_rank1", |c: &ChoiceCtx<'_, B>, x: &B::Buffer| {
            let out = native(c, x)?;
            if c.b.rank() == 1 {
                return c.b.upload(&c.b.download(x)?);
            }
            Ok(out)
        });
        let reqs = vec![req(ar(1024), vec![Choice::new("native", native::<B>), wrong], "native")];
        let o = tune(ctx, &A::new(cfg(t10, Policy::Max)), 0, &reqs)?;
        expect_inf(
            ctx,
            &o,
            "wrong_on_rank1",
            1,
            "first bad index",
            " — an output checked on some ranks only: a choice wrong on rank 1 was timed",
        )?;
        check_all(ctx, &o, &reqs, Policy::Max, "wrong1")
    }));
    v
}
