//! The fast subset of the mutation campaign (a few seconds, under `cargo xtask test`): six
//! mutants that today's catalogue catches, each run on its known catching cases, must FAIL there
//! with a rank's own typed check (`reported`), never a crash or a hang. `cargo xtask mutants`
//! runs the whole campaign.

use concord_harness::verdict::Verdict;
use concord_mutants::campaign::Spec;
use concord_suites::run::run_case;

/// (mutant, case ids without the mutant prefix) — only mutants caught today, so CI stays green.
const FAST: &[(&str, &[&str])] = &[
    ("sum_is_max_f32", &["all_reduce::out::f32::sum::ws2"]),
    ("premul_sum_ignores_factor", &["all_reduce::out::f32::premul_sum::ws2"]),
    ("inplace_broadcast_returns_copy", &["broadcast::inplace::f32::ws2"]),
    ("truncates_indivisible_reduce_scatter", &["bad_input::reduce_scatter_indivisible_ws2::ws2"]),
    ("writes_past_reduce_scatter_out", &["reduce_scatter_tensor::outbuf::f32::sum::ws2"]),
    ("progress_ends_at_issue", &["async::peer_never_joins_op_recorded_in_flight::ws2"]),
];

fn spec(name: &str) -> Spec {
    concord_mutants::catalogue().into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no mutant {name}"))
}

fn main() {
    let specs = concord_mutants::catalogue();
    let entries: Vec<_> = specs.iter().map(|s| s.entry.clone()).collect();
    concord_suites::run::dispatch_child(&entries);

    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for &(name, ids) in FAST {
        trials.push(libtest_mimic::Trial::test(format!("mutants::{name}_is_caught"), move || {
            let spec = spec(name);
            for id in ids {
                let full = format!("{name}::{id}");
                let case = spec.entry.cases().into_iter().find(|c| c.id == full).ok_or_else(|| format!("no case {full}"))?;
                let (verdict, msg, _) = run_case(&spec.entry, &case);
                let Verdict::Failed(failures) = &verdict else {
                    return Err(format!("{name} survived {id}: verdict {verdict:?}").into());
                };
                if failures.is_empty() || failures.iter().any(|f| f.kind() != "reported") {
                    return Err(format!("{name}: {id} failed, but not by a reported check: {failures:?}\n{msg}").into());
                }
            }
            Ok(())
        }));
    }
    // Every mutant names a clause id of the contract (core/src/backend.rs), and every clause id
    // has a mutant or a reasoned exemption (`concord_mutants::coverage`).
    trials.push(libtest_mimic::Trial::test("mutants::every_clause_has_a_mutant_or_an_exemption", || {
        let problems = concord_mutants::coverage::problems(&concord_mutants::catalogue());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n").into())
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::a_label_outside_the_contract_is_a_problem", || {
        // The rule itself: a free-text label, and a clause with neither mutant nor exemption.
        let mut specs = concord_mutants::catalogue();
        specs[0].clause = "values";
        let p = concord_mutants::coverage::problems(&specs);
        if !p.iter().any(|m| m.contains("names `values`")) {
            return Err(format!("a free-text clause label was not reported: {p:?}").into());
        }
        let only: Vec<_> = concord_mutants::catalogue().into_iter().filter(|s| s.clause != "barrier").collect();
        let p = concord_mutants::coverage::problems(&only);
        if !p.iter().any(|m| m.contains("clause barrier has no mutant and no exemption")) {
            return Err(format!("a clause without mutant or exemption was not reported: {p:?}").into());
        }
        Ok(())
    }));
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    concord_harness::runner::Pool::global().shutdown();
    std::process::exit(code);
}
