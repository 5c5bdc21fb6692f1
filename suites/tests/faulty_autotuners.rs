//! Self-test of the autotune suite: deliberately broken autotuners (the reference autotuner with
//! one known hazard each) must FAIL the autotune suite on the shm backend, with a message naming
//! the behaviour; the reference autotuner must pass the very same cases (control).

use concord_autotune::{Autotuner, Config, Env, Outcome, Policy, Request, TuneError, Tuner};
use concord_core::Backend;
use concord_harness::verdict::Verdict;
use concord_shm::ShmBackend;
use concord_suites::run::{run_case, BackendEntry};
use concord_suites::Case;

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

fn faulty_cases<const H: u8>() -> Vec<Case<ShmBackend>> {
    concord_suites::autotune::cases::<ShmBackend, Faulty<H>>()
}
fn control_cases() -> Vec<Case<ShmBackend>> {
    concord_suites::autotune::cases::<ShmBackend, Tuner>()
}

fn e(name: &str, cases: fn() -> Vec<Case<ShmBackend>>) -> BackendEntry {
    BackendEntry::new::<ShmBackend>(name, 0, cases)
        .with_rerun(format!("cargo test -p concord-suites --test faulty_autotuners -- --exact faulty::{name}_is_caught # case"))
}

fn expectations() -> Vec<(BackendEntry, &'static [&'static str], &'static [&'static str])> {
    vec![
        (
            e("local_fallback", faulty_cases::<LOCAL_FALLBACK>),
            &["autotune::hazard::panic_on_one_rank::ws2"],
            &["rank-local fallback", "panics_on_rank1", "rank="],
        ),
        (
            e("avg_declared_max", faulty_cases::<AVG_DECLARED_MAX>),
            &["autotune::hazard::max_vs_avg::ws2"],
            &["declared policy max", "hides the slow rank", "slow_on_rank1", "rank="],
        ),
        (
            e("collective_timeout", faulty_cases::<COLLECTIVE_TIMEOUT>),
            &["autotune::seed::timeout_rank1_sleeps_10s::ws2"],
            &["waited on the slow peer", "timeout decided by a collective", "rank 0 ended"],
        ),
        (
            e("no_screening", faulty_cases::<NO_SCREENING>),
            &["autotune::hazard::fast_but_wrong::ws2"],
            &["not rejected before timing", "fast_but_wrong", "first bad index"],
        ),
        (
            e("unagreed_cache", faulty_cases::<UNAGREED_CACHE>),
            &["autotune::cache::partial_hit_retunes::ws2"],
            &["cache not agreed across ranks", "rank 1"],
        ),
    ]
}

fn case_info(entry: &BackendEntry, id: &str) -> concord_suites::run::CaseInfo {
    let full = format!("{}::{id}", entry.name);
    entry.cases().into_iter().find(|c| c.id == full).unwrap_or_else(|| panic!("no case {full}"))
}

fn main() {
    let control = e("control_tuner", control_cases);
    let mut entries: Vec<BackendEntry> = expectations().into_iter().map(|(e, _, _)| e).collect();
    entries.push(control.clone());
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
    let all_ids: Vec<&'static str> = expectations().into_iter().flat_map(|(_, ids, _)| ids.iter().copied()).collect();
    trials.push(libtest_mimic::Trial::test("faulty::control_tuner_passes_the_same_cases", move || {
        for id in &all_ids {
            let (verdict, msg, _) = run_case(&control, &case_info(&control, id));
            if verdict != Verdict::Passed {
                return Err(format!("the reference autotuner did not pass {id}: {verdict:?}\n{msg}").into());
            }
        }
        Ok(())
    }));
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    concord_harness::runner::Pool::global().shutdown();
    std::process::exit(code);
}
