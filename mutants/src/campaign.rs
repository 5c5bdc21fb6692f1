//! The campaign runner: every mutant against the conformance catalogue, in persistent worlds,
//! each stopping at its first catch (a mutant is caught once a case fails that also fails alone), mutants side
//! by side (`--jobs`, default: the machine's parallelism). A failing case counts as the catch
//! only if it also fails alone in a fresh world ([`catch_alone`]): a failure that needs the cases
//! before it is listed and the search goes on. Prints one row per mutant, the first
//! lines of each catching message, which catching messages do not name op / variant / dtype /
//! world size / rank, then `catch rate: N/M (P %)` and the wall time; exits 1 if any survives.

use crate::{Bug, MakeBug, Mutant};
use concord_harness::runner::{Pool, PoolConfig};
use concord_harness::verdict::{Status, Verdict};
use concord_suites::run::{run_case_fresh_in, BackendEntry, CaseInfo};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One mutant of the catalogue.
#[derive(Clone)]
pub struct Spec {
    pub name: &'static str,
    /// The contract clause its bug breaks.
    pub clause: &'static str,
    pub what: &'static str,
    /// Case-id substrings (without the `<mutant>::` prefix) of the cases most likely to catch
    /// it, run first, in this order; then the rest of the catalogue by world size.
    pub catchers: &'static [&'static str],
    pub entry: BackendEntry,
    /// Builds the bug (for each communicator; [`Mutant`] finds it by name).
    pub make: MakeBug,
}

/// The spec of bug `B` under `name`.
pub fn spec<B: Bug + Default>(name: &'static str, clause: &'static str, what: &'static str, catchers: &'static [&'static str]) -> Spec {
    let entry = BackendEntry::new::<Mutant>(name, 0, concord_suites::catalogue::<Mutant>)
        .with_option("mutant", name)
        .with_rerun(format!("cargo xtask mutants --mutant {name} --case"));
    Spec { name, clause, what, catchers, entry, make: || Box::new(B::default()) }
}

/// What a catching message should name (`key=` fields of the suites' messages).
pub const FIELDS: [&str; 5] = ["op=", "variant=", "dtype=", "world_size=", "rank="];

/// The first failing case of a mutant.
#[derive(Clone, Debug)]
pub struct Catch {
    /// Case id without the mutant prefix.
    pub case: String,
    pub message: String,
    /// Failure kinds (`reported`, `timed_out`, ...).
    pub kinds: Vec<&'static str>,
    /// [`FIELDS`] the message does not contain.
    pub missing: Vec<&'static str>,
    /// Whether the case failed in a world spawned for it (no case ran there before it).
    pub fresh_world: bool,
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub name: &'static str,
    pub clause: &'static str,
    pub caught: Option<Catch>,
    /// Cases run against the mutant (reruns alone not counted).
    pub cases_run: usize,
    /// Cases that failed but are not the catch, each with the reason ([`attribute`]).
    pub set_aside: Vec<(String, SetAside)>,
    pub elapsed: Duration,
}

/// Why a case that failed a mutant (or a sweep target) is not its catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetAside {
    /// It fails the control too: the wrapper's path, not the wrong element, failed it.
    FailsWithoutCorruption,
    /// Alone in a fresh world it passes: it failed only after the cases before it (world
    /// history), so its rerun line would not reproduce the catch.
    OnlyAfterEarlierCases,
}

impl SetAside {
    pub fn says(self) -> &'static str {
        match self {
            SetAside::FailsWithoutCorruption => "fails without the corruption too (its control failed)",
            SetAside::OnlyAfterEarlierCases => "passes alone in a fresh world (failed only after earlier cases)",
        }
    }
}

/// Case ids (without the `<mutant>::` prefix) indexed for substring search: one text of every
/// id, each ended by a newline (no hint contains one), searched with `memchr`'s SIMD finder. The
/// CI guard resolves the hints of every mutant in each of its test processes; one `str::contains`
/// per (hint, id) was 0.25 s of CPU per process (about 1.5 M short searches).
pub struct CaseIds {
    text: String,
    /// Where each id starts in `text`.
    starts: Vec<usize>,
}

impl CaseIds {
    pub fn new(ids: &[&str]) -> CaseIds {
        let mut text = String::with_capacity(ids.iter().map(|i| i.len() + 1).sum());
        let mut starts = Vec::with_capacity(ids.len());
        for id in ids {
            starts.push(text.len());
            text.push_str(id);
            text.push('\n');
        }
        CaseIds { text, starts }
    }

    /// The indices of the ids that contain one of `catchers`, in hint order (all ids of the first
    /// hint in id order, then those of the second not yet taken, ...).
    pub fn hinted(&self, catchers: &[&str]) -> Vec<usize> {
        let mut taken = vec![false; self.starts.len()];
        let mut order = Vec::new();
        for pat in catchers {
            if pat.is_empty() {
                // Every id contains the empty hint.
                order.extend((0..taken.len()).filter(|&i| !std::mem::replace(&mut taken[i], true)));
                continue;
            }
            if pat.contains('\n') {
                // No id contains a newline (a match would span two ids).
                continue;
            }
            for at in memchr::memmem::find_iter(self.text.as_bytes(), pat.as_bytes()) {
                let i = self.starts.partition_point(|&s| s <= at) - 1;
                if !taken[i] {
                    taken[i] = true;
                    order.push(i);
                }
            }
        }
        order
    }
}

/// [`CaseIds::hinted`] for one search.
pub fn hinted(catchers: &[&str], ids: &[&str]) -> Vec<usize> {
    CaseIds::new(ids).hinted(catchers)
}

/// `spec`'s cases matching its catcher hints ([`Spec::catchers`], in hint order), then the rest.
fn split_hinted(spec: &Spec) -> (Vec<CaseInfo>, Vec<CaseInfo>) {
    let cases = spec.entry.cases();
    let prefix = format!("{}::", spec.name);
    let ids: Vec<&str> = cases.iter().map(|c| c.id.strip_prefix(&prefix).unwrap_or(&c.id)).collect();
    let first_idx = hinted(spec.catchers, &ids);
    let mut is_first = vec![false; cases.len()];
    for &i in &first_idx {
        is_first[i] = true;
    }
    let first = first_idx.iter().map(|&i| cases[i].clone()).collect();
    let rest = cases.iter().zip(&is_first).filter(|(_, f)| !**f).map(|(c, _)| c.clone()).collect();
    (first, rest)
}

/// `spec`'s cases in the order the campaign runs them (or just `only`, by full id, if given).
pub fn ordered_cases(spec: &Spec, only: &[String]) -> Vec<CaseInfo> {
    if !only.is_empty() {
        let all = spec.entry.cases();
        let by_id: std::collections::HashMap<&str, &CaseInfo> = all.iter().map(|c| (c.id.as_str(), c)).collect();
        return only.iter().filter_map(|id| by_id.get(id.as_str()).map(|c| (*c).clone())).collect();
    }
    let (mut first, mut rest) = split_hinted(spec);
    // The rest by world size, so each persistent world serves a long run of cases.
    rest.sort_by_key(|c| c.world_size);
    first.extend(rest);
    first
}

/// Runs `spec` until its first catch ([`catch_alone`]: a failing case that also fails alone in a
/// fresh world, so that its rerun line reproduces it).
pub fn run_mutant(spec: &Spec, only: &[String]) -> Finding {
    run_mutant_in(Pool::global(), spec, only)
}

/// [`run_mutant`] in the worlds of `pool`.
pub fn run_mutant_in(pool: &Pool, spec: &Spec, only: &[String]) -> Finding {
    catch_alone(pool, spec, None, ordered_cases(spec, only))
}

/// Runs `cases` of `spec`, in order, in the worlds of `pool`, until the first that fails (in
/// whatever world history the cases before it left: see [`catch_alone`] for the catch).
pub fn run_cases_in(pool: &Pool, spec: &Spec, cases: Vec<CaseInfo>) -> Finding {
    let started = Instant::now();
    let prefix = format!("{}::", spec.name);
    let mut cases_run = 0;
    for case in cases {
        cases_run += 1;
        let (verdict, message, _, fresh_world) = run_case_fresh_in(pool, &spec.entry, &case);
        if let Verdict::Failed(failures) = verdict {
            let missing = FIELDS.iter().copied().filter(|f| !message.contains(f)).collect();
            let kinds = failures.iter().map(|f| f.kind()).collect();
            let case = case.id.strip_prefix(&prefix).unwrap_or(&case.id).to_string();
            return Finding {
                name: spec.name,
                clause: spec.clause,
                caught: Some(Catch { case, message, kinds, missing, fresh_world }),
                cases_run,
                set_aside: Vec::new(),
                elapsed: started.elapsed(),
            };
        }
    }
    Finding { name: spec.name, clause: spec.clause, caught: None, cases_run, set_aside: Vec::new(), elapsed: started.elapsed() }
}

/// Whether `case`, which just failed `real` (`alone`: in a world spawned for it), counts as the
/// catch: it must fail alone in a fresh world (so its rerun line reproduces it; rerun in a world
/// of its own when it was not alone) and, given a `control` (for a sweep target: the same target
/// with the edit left out), pass it, so that it is the wrong element, not the wrapper's path,
/// that it caught. Each check is one case in a world of its own.
pub fn attribute(pool: &Pool, real: &Spec, control: Option<&Spec>, case: &CaseInfo, alone: bool) -> std::result::Result<(), SetAside> {
    if !alone {
        let mut own = case.clone();
        own.isolated = true;
        if run_cases_in(pool, real, vec![own]).caught.is_none() {
            return Err(SetAside::OnlyAfterEarlierCases);
        }
    }
    let Some(control) = control else { return Ok(()) };
    // The same case in the control's catalogue (its ids carry the control's name), in a world
    // of its own: an earlier case's history must not fail the control.
    let mut theirs = case.clone();
    theirs.isolated = true;
    if let Some(rest) = case.id.strip_prefix(&format!("{}::", real.name)) {
        theirs.id = format!("{}::{rest}", control.name);
    }
    match run_cases_in(pool, control, vec![theirs]).caught {
        Some(_) => Err(SetAside::FailsWithoutCorruption),
        None => Ok(()),
    }
}

/// `cases`, in order, against `real` until one is its catch ([`attribute`], with `control` if
/// given). A case that fails only after the cases before it (a mutant whose bug needs state
/// that those built up, or a backend path they left behind) is set aside and the search goes on:
/// the catch rate counts only catches that a rerun reproduces. The finding's `cases_run` counts
/// the runs against `real`, reruns alone not counted.
pub fn catch_alone(pool: &Pool, real: &Spec, control: Option<&Spec>, cases: Vec<CaseInfo>) -> Finding {
    let started = Instant::now();
    let (mut rest, mut cases_run, mut set_aside) = (cases, 0, Vec::new());
    while !rest.is_empty() {
        let f = run_cases_in(pool, real, rest.clone());
        cases_run += f.cases_run;
        let Some(c) = f.caught else { break };
        let failed = rest[f.cases_run - 1].clone();
        // Alone only in a world spawned for it: the pool reports it (a world of this world
        // size may have served earlier cases, this run's or another's).
        let why = match attribute(pool, real, control, &failed, c.fresh_world) {
            Ok(()) => return Finding { cases_run, set_aside, elapsed: started.elapsed(), caught: Some(c), ..f },
            Err(why) => why,
        };
        set_aside.push((c.case, why));
        rest.drain(..f.cases_run);
    }
    Finding { name: real.name, clause: real.clause, caught: None, cases_run, set_aside, elapsed: started.elapsed() }
}

/// How long the peers of a failed rank get to report in a [`verdict_pool`].
pub const VERDICT_SETTLE: Duration = Duration::from_millis(150);

/// A pool for runs that only need each case's verdict (the CI guard, the sweep): once a rank has
/// failed, the case has failed; its peers (usually stuck in the case's next collective, waiting
/// for the failed rank) get [`VERDICT_SETTLE`] to report, not the default second.
pub fn verdict_pool() -> Pool {
    Pool::new(PoolConfig { settle: VERDICT_SETTLE, ..PoolConfig::from_env() })
}

/// `f` over `items`, up to `jobs` side by side; `report` is called as each one finishes. The
/// results come in the order they finished.
pub fn side_by_side<I: Send, O: Send>(items: Vec<I>, jobs: usize, f: impl Fn(I) -> O + Sync, report: impl Fn(&O) + Sync) -> Vec<O> {
    let queue = Mutex::new(items.into_iter());
    let out = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some(item) = next else { break };
                let o = f(item);
                report(&o);
                out.lock().unwrap_or_else(|e| e.into_inner()).push(o);
            });
        }
    });
    out.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Runs every spec (up to `jobs` side by side); `report` is called as each one finishes.
pub fn run_all(specs: &[Spec], only: &[String], jobs: usize, report: impl Fn(&Finding) + Sync) -> Vec<Finding> {
    let mut found = side_by_side(specs.iter().collect(), jobs, |spec| run_mutant(spec, only), report);
    let pos = |n: &str| specs.iter().position(|s| s.name == n);
    found.sort_by_key(|f| pos(f.name));
    found
}

/// The table, the message heads, the field check and the closing lines.
pub fn render(found: &[Finding], wall: Duration) -> String {
    let mut out = String::new();
    let w = found.iter().map(|f| f.name.len()).max().unwrap_or(6).max(6);
    let cw = found.iter().map(|f| f.clause.len()).max().unwrap_or(6).max(6);
    out += &format!("{:<w$}  {:<cw$}  {:<8}  {:>6}  {:>8}  first failing case\n", "mutant", "clause", "caught?", "cases", "time");
    for f in found {
        let (caught, case) = match &f.caught {
            Some(c) => ("caught", c.case.clone()),
            None => ("SURVIVED", "SURVIVED".to_string()),
        };
        out +=
            &format!("{:<w$}  {:<cw$}  {:<8}  {:>6}  {:>7.1}s  {}\n", f.name, f.clause, caught, f.cases_run, f.elapsed.as_secs_f64(), case);
    }
    out += "\nfirst failure of each caught mutant:\n";
    for f in found {
        if let Some(c) = &f.caught {
            out += &format!("* {} — {} [{}]\n", f.name, c.case, c.kinds.join(", "));
            for line in c.message.lines().filter(|l| !l.trim().is_empty()).take(3) {
                let line: String = line.chars().take(220).collect();
                out += &format!("    {line}\n");
            }
        }
    }
    let incomplete: Vec<String> = found
        .iter()
        .filter_map(|f| f.caught.as_ref().filter(|c| !c.missing.is_empty()).map(|c| (f.name, c)))
        .map(|(n, c)| format!("  {n} ({}): lacks {}", c.case, c.missing.join(" ")))
        .collect();
    if incomplete.is_empty() {
        out += "\nevery catching message names op, variant, dtype, world size and rank\n";
    } else {
        out += &format!("\ncatching messages that do not name all of {}:\n{}\n", FIELDS.join(" "), incomplete.join("\n"));
    }
    let aside: Vec<String> =
        found.iter().flat_map(|f| f.set_aside.iter().map(move |(case, why)| format!("  {} ({case}): {}", f.name, why.says()))).collect();
    if !aside.is_empty() {
        out += &format!("\nfailing cases not counted as a catch ({}): the search went on past them\n{}\n", aside.len(), aside.join("\n"));
    }
    let caught = found.iter().filter(|f| f.caught.is_some()).count();
    let total = found.len();
    let pct = if total == 0 { 0.0 } else { 100.0 * caught as f64 / total as f64 };
    out += &format!("\ncatch rate: {caught}/{total} ({pct:.1} %)\nwall time: {:.1} s\n", wall.as_secs_f64());
    out
}

#[derive(clap::Parser, Debug)]
#[command(name = "concord-mutants", about = "Mutation campaign: the conformance catalogue against the shm backend with one bug each")]
struct Cli {
    /// Run only this mutant (repeatable).
    #[arg(long = "mutant", value_name = "NAME")]
    mutants: Vec<String>,
    /// Run only these case ids (`<mutant>::<case>`, as in a failure's rerun line).
    #[arg(long = "case", value_name = "ID", num_args = 1..)]
    cases: Vec<String>,
    /// Mutants run side by side (default: the machine's parallelism).
    #[arg(long)]
    jobs: Option<usize>,
    /// List the mutants (name, clause, bug) and exit; with `--legal`, the legal variants (name,
    /// declaration, choice).
    #[arg(long)]
    list: bool,
    /// The corruption sweep instead of the catalogue's mutants (`crate::sweep`): every cell of
    /// hook × rank position × size class × world size, or only the target `HOOK:POSITION:CLASS`
    /// (with `--case`: only those case ids, as in a failure's rerun line).
    #[arg(long, value_name = "TARGET", num_args = 0..=1, default_missing_value = "")]
    sweep: Option<String>,
    /// Sweep: only these hooks (repeatable).
    #[arg(long, value_name = "HOOK")]
    hook: Vec<String>,
    /// Sweep: only these world sizes (repeatable; a subgroup cell then runs only the cases of
    /// these world sizes).
    #[arg(long, value_name = "N")]
    ws: Vec<usize>,
    /// Leave out the cases whose id contains this (repeatable): the catalogue as it was before
    /// a hunt's cases, to count the survivors (or, with `--sweep`, the holes) they close.
    #[arg(long, value_name = "SUBSTR")]
    skip: Vec<String>,
    /// Sweep: the cells of these communicator shapes (repeatable; `world`, the default, or a
    /// subgroup shape: `strided`, `no_zero`, `singleton`, `unsorted`; a subgroup cell covers
    /// every world size).
    #[arg(long, value_name = "SHAPE")]
    shape: Vec<String>,
    /// Sweep: the dtype grid instead, for these dtypes (repeatable; `all`: every dtype): every hook
    /// × dtype × world size, one wrong element in every output of the dtype, on every rank
    /// (`HOOK:every:any@DTYPE`).
    #[arg(long, value_name = "DTYPE")]
    dtype: Vec<String>,
    /// Sweep: the bad-input grid instead, for these kinds (repeatable; `all`: every kind): every
    /// hook × kind × offender position × world size (`HOOK:POSITION:MODE!KIND`,
    /// `crate::sweep_bad`); `--ws` defaults to 1, 2, 3 and 16 there.
    #[arg(long = "bad-input", value_name = "KIND")]
    bad_input: Vec<String>,
    /// Sweep: the order grid instead: every all_reduce hook × position × size class × world size
    /// (3 or more ranks), the float reduction done in another rank order on that rank
    /// (`HOOK:POSITION:CLASS+order`, clause `values.identical_on_every_rank`).
    #[arg(long)]
    order: bool,
    /// The legal variants instead (`crate::legal`; with `--mutant`, only those): each runs the
    /// whole catalogue (or the `--case` ids) and MUST pass every case it does not declare
    /// unsupported.
    #[arg(long)]
    legal: bool,
    /// Run the reference launch-based backend (`crate::stream`, no bug) over its catalogue (every
    /// case under this binary's `campaign` feature, or only the `--case` ids, `stream::...`) and
    /// print how many cases passed, were skipped, unsupported or failed; exits 1 on a failure.
    #[arg(long)]
    stream_reference: bool,
}

/// One legal variant's run of the catalogue.
pub struct LegalRun {
    pub name: &'static str,
    /// What the variant declares (its spec's `clause` field).
    pub declares: &'static str,
    pub passed: usize,
    pub unsupported: usize,
    /// (case id, first line of the failure, whole message).
    pub failed: Vec<(String, String, String)>,
    pub elapsed: Duration,
}

/// Runs `spec` (a legal variant) on `only` (full case ids; empty: the whole catalogue), the way
/// conformance mode runs a backend.
pub fn run_legal(spec: &Spec, only: &[String], jobs: usize) -> LegalRun {
    let started = Instant::now();
    let cases = spec.entry.cases().into_iter().filter(|c| only.is_empty() || only.contains(&c.id));
    let work = cases.map(|c| (spec.entry.clone(), c)).collect();
    let report = concord_suites::run::run_work(work, jobs, true);
    let count = |st: Status| report.cases.iter().filter(|r| r.status == st).count();
    let failed = report
        .cases
        .iter()
        .filter(|r| r.status == Status::Failed)
        .map(|r| (r.id.clone(), r.detail.lines().find(|l| l.contains("rank ")).unwrap_or("").trim().to_string(), r.detail.clone()))
        .collect();
    LegalRun {
        name: spec.name,
        declares: spec.clause,
        passed: count(Status::Passed),
        unsupported: count(Status::Unsupported) + count(Status::Skipped),
        failed,
        elapsed: started.elapsed(),
    }
}

/// The legal variants' table: each with its passed / unsupported / failed counts, then every
/// false failure's first line.
pub fn render_legal(runs: &[LegalRun]) -> String {
    let w = runs.iter().map(|r| r.name.len()).max().unwrap_or(6).max(6);
    let mut out = format!(
        "\nlegal variants (each MUST pass the catalogue):\n{:<w$}  {:<26}  {:>6}  {:>11}  {:>6}  {:>7}\n",
        "name", "declares", "passed", "unsupported", "failed", "seconds"
    );
    for r in runs {
        out += &format!(
            "{:<w$}  {:<26}  {:>6}  {:>11}  {:>6}  {:>7.1}\n",
            r.name,
            r.declares,
            r.passed,
            r.unsupported,
            r.failed.len(),
            r.elapsed.as_secs_f64()
        );
    }
    for r in runs {
        for (id, head, _) in &r.failed {
            out += &format!("  FALSE FAILURE {id}: {head}\n");
        }
    }
    let bad = runs.iter().filter(|r| !r.failed.is_empty()).count();
    out += &format!("legal variants passing: {}/{}\n", runs.len() - bad, runs.len());
    out
}

/// `--legal`: the legal variants against the catalogue; exits 1 on any false failure.
fn legal_main(cli: &Cli) -> ! {
    let all = crate::legal::catalogue();
    if cli.list {
        for s in &all {
            println!("{:<38} {:<30} {}", s.name, s.clause, s.what);
        }
        std::process::exit(0);
    }
    for w in &cli.mutants {
        if !all.iter().any(|s| s.name == w) {
            eprintln!("error: no legal variant `{w}` (they are: {})", all.iter().map(|s| s.name).collect::<Vec<_>>().join(", "));
            std::process::exit(2);
        }
    }
    let chosen: Vec<&Spec> = all
        .iter()
        .filter(|s| cli.mutants.iter().any(|w| w == s.name) || cli.cases.iter().any(|c| c.starts_with(&format!("{}::", s.name))))
        .collect();
    let chosen = if chosen.is_empty() { all.iter().collect() } else { chosen };
    let jobs = cli.jobs.unwrap_or_else(concord_suites::run::default_jobs);
    let runs: Vec<LegalRun> = chosen
        .iter()
        .map(|s| {
            let only: Vec<String> = cli.cases.iter().filter(|c| c.starts_with(&format!("{}::", s.name))).cloned().collect();
            let r = run_legal(s, &only, jobs);
            // A run that checked nothing proves nothing: named cases that are not in the catalogue,
            // or no case passed at all.
            let ran = r.passed + r.unsupported + r.failed.len();
            if (!only.is_empty() && ran != only.len()) || r.passed == 0 {
                eprintln!(
                    "error: {}: {ran} of {} named case(s) ran, {} passed: a legal run must pass cases, not only skip them",
                    r.name,
                    if only.is_empty() { ran } else { only.len() },
                    r.passed
                );
                std::process::exit(2);
            }
            for (_, _, msg) in &r.failed {
                eprintln!("{msg}\n");
            }
            eprintln!("  {:<24} {} passed, {} failed ({:.1} s)", r.name, r.passed, r.failed.len(), r.elapsed.as_secs_f64());
            r
        })
        .collect();
    print!("{}", render_legal(&runs));
    Pool::global().shutdown();
    std::process::exit(if runs.iter().all(|r| r.failed.is_empty()) { 0 } else { 1 })
}

/// `--stream-reference`: the reference stream backend over its catalogue, world sizes side by side.
fn stream_reference_main(cli: &Cli) -> ! {
    let entry = crate::bugs_stream::reference_entry();
    let all = entry.cases();
    let cases: Vec<CaseInfo> = if cli.cases.is_empty() { all } else { all.into_iter().filter(|c| cli.cases.contains(&c.id)).collect() };
    let mut by_ws: std::collections::BTreeMap<usize, Vec<CaseInfo>> = std::collections::BTreeMap::new();
    for c in cases {
        by_ws.entry(c.world_size).or_default().push(c);
    }
    let started = Instant::now();
    let jobs = cli.jobs.unwrap_or_else(concord_suites::run::default_jobs);
    let done = side_by_side(
        by_ws.into_values().collect(),
        jobs,
        |group| {
            group
                .into_iter()
                .map(|c| {
                    let t = Instant::now();
                    let (verdict, message, _, _) = run_case_fresh_in(Pool::global(), &entry, &c);
                    (c.id, verdict, message, t.elapsed())
                })
                .collect::<Vec<_>>()
        },
        |_| {},
    );
    let (mut passed, mut skipped, mut unsupported, mut failed) = (0, 0, 0, Vec::new());
    for (id, verdict, message, took) in done.into_iter().flatten() {
        match verdict {
            Verdict::Passed => passed += 1,
            Verdict::Skipped(_) => skipped += 1,
            Verdict::Unsupported(why) => {
                unsupported += 1;
                println!("UNSUPPORTED {id}: {}", why.chars().take(160).collect::<String>());
            }
            Verdict::Failed(_) => failed.push((id, message, took)),
        }
    }
    for (id, message, took) in &failed {
        println!("FAILED {id} ({:.1} s)", took.as_secs_f64());
        for line in message.lines().filter(|l| !l.trim().is_empty()).take(4) {
            println!("    {}", line.chars().take(240).collect::<String>());
        }
    }
    println!(
        "stream reference: {passed} passed, {skipped} skipped, {unsupported} unsupported, {} failed, in {:.1} s",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    Pool::global().shutdown();
    std::process::exit(i32::from(!failed.is_empty()))
}

/// `--bad-input`, or `--sweep HOOK:POSITION:MODE!KIND`: the bad-input grid, or one target's cases.
fn bad_input_main(cli: &Cli) -> ! {
    use crate::sweep_bad;
    let jobs = cli.jobs.unwrap_or_else(concord_suites::run::default_jobs);
    let mut targets: Vec<sweep_bad::Target> = match cli.sweep.as_deref() {
        Some(t) if !t.is_empty() => match sweep_bad::Target::parse(t) {
            Some(t) => vec![t],
            None => {
                eprintln!(
                    "error: bad bad-input target `{t}`: HOOK:POSITION:MODE!KIND, hooks {:?}, positions {:?}, modes {:?}, a kind the hook can get",
                    sweep_bad::HOOKS,
                    sweep_bad::POSITIONS,
                    sweep_bad::MODES
                );
                std::process::exit(2);
            }
        },
        _ => {
            let mut kinds = Vec::new();
            for k in &cli.bad_input {
                match concord_core::BadInputKind::ALL.iter().find(|x| x.name() == k) {
                    Some(x) => kinds.push(*x),
                    None if k == "all" => {}
                    None => {
                        eprintln!(
                            "error: no bad-input kind `{k}` (kinds: {:?}, or `all`)",
                            concord_core::BadInputKind::ALL.map(|x| x.name())
                        );
                        std::process::exit(2);
                    }
                }
            }
            sweep_bad::targets(&kinds)
        }
    };
    if !cli.hook.is_empty() {
        targets.retain(|t| cli.hook.iter().any(|h| h == t.hook));
    }
    if targets.is_empty() {
        eprintln!("error: the target, --bad-input and --hook select no target");
        std::process::exit(2);
    }
    if !cli.cases.is_empty() {
        let [t] = &targets[..] else {
            eprintln!("error: --case with --sweep needs one target (`--sweep HOOK:POSITION:MODE!KIND`)");
            std::process::exit(2);
        };
        let f = run_mutant(&sweep_bad::spec(t), &cli.cases);
        let control =
            f.caught.as_ref().and_then(|c| run_mutant(&sweep_bad::control(t), &[format!("{}::{}", sweep_bad::NAME, c.case)]).caught);
        let attributed = f.caught.is_some() && control.is_none();
        match (&f.caught, control) {
            (Some(c), None) => println!("{} caught by {} (its control passed)\n{}", t.label(), c.case, c.message),
            (Some(c), Some(k)) => println!("{}: {} failed, but its control failed too:\n{}", t.label(), c.case, k.message),
            (None, _) => println!("{}: none of the {} case(s) failed", t.label(), f.cases_run),
        }
        Pool::global().shutdown();
        std::process::exit(if attributed { 0 } else { 1 });
    }
    let sizes: Vec<usize> = if cli.ws.is_empty() { sweep_bad::WORLD_SIZES.to_vec() } else { cli.ws.clone() };
    eprintln!("concord-mutants: bad-input grid of {} target(s) x {} world size(s), {jobs} side by side", targets.len(), sizes.len());
    let started = Instant::now();
    let cells = sweep_bad::run(&targets, &sizes, jobs, &cli.skip, |c| {
        if c.candidates.is_some() && c.caught.is_none() {
            eprintln!(
                "  HOLE {} ws{} ({}, {:.1} s)",
                c.target.label(),
                c.ws,
                concord_harness::count(c.cases_run, "case", "cases"),
                c.elapsed.as_secs_f64()
            );
        }
    });
    print!("{}", sweep_bad::render(&cells, &sizes));
    println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    std::process::exit(if cells.iter().all(|c| c.candidates.is_none() || c.caught.is_some()) { 0 } else { 1 })
}

/// `--sweep`: the grid, or one target's cases.
fn sweep_main(cli: &Cli) -> ! {
    use crate::sweep;
    let jobs = cli.jobs.unwrap_or_else(concord_suites::run::default_jobs);
    let targets: Vec<sweep::Target> = match cli.sweep.as_deref() {
        Some("") | None if !cli.dtype.is_empty() => {
            if !cli.shape.is_empty() {
                eprintln!("error: --dtype and --shape are two grids: run them one at a time");
                std::process::exit(2);
            }
            let mut dtypes = Vec::new();
            for d in &cli.dtype {
                match concord_core::DType::from_name(d) {
                    Some(x) => dtypes.push(x),
                    None if d == "all" => dtypes.extend(concord_core::DType::ALL),
                    None => {
                        eprintln!("error: no dtype `{d}` (dtypes: {:?}, or `all`)", concord_core::DType::ALL.map(|x| x.name()));
                        std::process::exit(2);
                    }
                }
            }
            sweep::dtype_targets(&dtypes)
        }
        Some("") | None if cli.order => {
            if !cli.shape.is_empty() {
                eprintln!("error: --order and --shape are two grids: run them one at a time");
                std::process::exit(2);
            }
            sweep::order_targets()
        }
        Some("") | None if cli.shape.is_empty() => sweep::all_targets(),
        Some("") | None => {
            let mut v = Vec::new();
            for g in &cli.shape {
                let Some(&shape) = sweep::SHAPES.iter().find(|s| *s == g) else {
                    eprintln!("error: no shape `{g}` (shapes: {:?})", sweep::SHAPES);
                    std::process::exit(2);
                };
                v.extend(sweep::targets_of(shape));
            }
            v
        }
        Some(t) => match sweep::Target::parse(t) {
            // `--shape` with a target: the target on each of those shapes (its own `:SHAPE`, if
            // it names one, must be among them).
            Some(t) if !cli.shape.is_empty() => {
                let named = t.shape != "world";
                let mut v = Vec::new();
                for g in &cli.shape {
                    let Some(&shape) = sweep::SHAPES.iter().find(|s| *s == g) else {
                        eprintln!("error: no shape `{g}` (shapes: {:?})", sweep::SHAPES);
                        std::process::exit(2);
                    };
                    if named && shape != t.shape {
                        eprintln!("error: the target `{}` names the shape `{}`, and --shape asks for `{shape}`", t.label(), t.shape);
                        std::process::exit(2);
                    }
                    v.push(sweep::Target { shape, ..t.clone() });
                }
                v
            }
            Some(t) => vec![t],
            None => {
                eprintln!(
                    "error: bad sweep target `{t}`: HOOK:POSITION:CLASS[:SHAPE][@DTYPE][+EFFECT], effects {:?}, hooks {:?}, positions {:?} (or `every`), classes {:?} (or `any`), shapes {:?}",
                    sweep::EFFECTS,
                    sweep::HOOKS,
                    sweep::POSITIONS,
                    sweep::CLASSES.iter().map(|c| c.0).collect::<Vec<_>>(),
                    sweep::SHAPES
                );
                std::process::exit(2);
            }
        },
    };
    for h in &cli.hook {
        if !sweep::HOOKS.contains(&h.as_str()) {
            eprintln!("error: no hook `{h}` (hooks: {:?})", sweep::HOOKS);
            std::process::exit(2);
        }
    }
    let targets: Vec<_> = targets.into_iter().filter(|t| cli.hook.is_empty() || cli.hook.iter().any(|h| h == t.hook)).collect();
    if targets.is_empty() {
        eprintln!("error: the sweep target and --hook select no target");
        std::process::exit(2);
    }
    if !cli.cases.is_empty() {
        // A rerun: one target, the given case ids.
        let [t] = &targets[..] else {
            eprintln!("error: --case with --sweep needs one target (`--sweep HOOK:POSITION:CLASS`)");
            std::process::exit(2);
        };
        let f = run_mutant(&sweep::spec(t), &cli.cases);
        // The catch counts only if the failing case passes the control (the edit left out).
        let control = f.caught.as_ref().and_then(|c| run_mutant(&sweep::control(t), &[format!("sweep::{}", c.case)]).caught);
        let attributed = f.caught.is_some() && control.is_none();
        match (&f.caught, control) {
            (Some(c), None) => println!("{} caught by {} (its control passed)\n{}", t.label(), c.case, c.message),
            (Some(c), Some(k)) => println!(
                "{}: {} failed, but its control (the same path with the value left right) failed too, so the wrong element is not \
                 what it caught:\n{}",
                t.label(),
                c.case,
                k.message
            ),
            (None, _) => println!("{}: none of the {} case(s) failed", t.label(), f.cases_run),
        }
        Pool::global().shutdown();
        std::process::exit(if attributed { 0 } else { 1 });
    }
    let sizes: Vec<usize> = if cli.ws.is_empty() { sweep::WORLD_SIZES.to_vec() } else { cli.ws.clone() };
    eprintln!("concord-mutants: sweep of {} target(s) x {} world size(s), {jobs} side by side", targets.len(), sizes.len());
    let started = Instant::now();
    let cells = sweep::run(&targets, &sizes, jobs, &cli.skip, |c| {
        if c.candidates.is_some() && c.caught.is_none() {
            let ws = if c.ws == 0 { "any ws".to_string() } else { format!("ws{}", c.ws) };
            eprintln!(
                "  HOLE {} {ws} ({}, {:.1} s)",
                c.target.label(),
                concord_harness::count(c.cases_run, "case", "cases"),
                c.elapsed.as_secs_f64()
            );
        }
    });
    print!("{}", sweep::render(&cells, &sizes, &cli.skip));
    println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    std::process::exit(if cells.iter().all(|c| c.candidates.is_none() || c.caught.is_some()) { 0 } else { 1 })
}

/// The first of `ids` (`<mutant>::<case>`, as `--case` takes them) that is no case of its mutant
/// among `specs`, as an error line; `None` when every id names a case (or a mutant not in
/// `specs`, which the caller reports). Such an id would run nothing and print the mutant as
/// SURVIVED (0 cases): a typo must not read as a hole in the catalogue.
pub fn unknown_case(specs: &[Spec], ids: &[String]) -> Option<String> {
    for id in ids {
        let Some(s) = specs.iter().find(|s| id.starts_with(&format!("{}::", s.name))) else { continue };
        if s.entry.cases().iter().any(|c| &c.id == id) {
            continue;
        }
        let rest = &id[s.name.len() + 2..];
        // The conformance binary's ids start with the backend (`shm::...`); a mutant's do not.
        let hint = match rest.split_once("::") {
            Some(("shm" | "fake" | "nccl", r)) => format!("; without the backend: `{}::{r}`", s.name),
            _ => String::new(),
        };
        return Some(format!(
            "`{id}` is no case of mutant `{}` (case ids look like `sum_is_max_f32::all_reduce::out::f32::sum::ws2`{hint})",
            s.name
        ));
    }
    None
}

/// The whole `main` of the campaign binary.
pub fn main() -> ! {
    let specs = crate::catalogue();
    let mut entries: Vec<BackendEntry> = specs.iter().map(|s| s.entry.clone()).collect();
    entries.push(crate::sweep::worker_entry());
    entries.push(crate::sweep_bad::worker_entry());
    entries.extend(crate::legal::catalogue().into_iter().map(|s| s.entry));
    entries.push(crate::bugs_stream::reference_entry());
    concord_suites::run::dispatch_child(&entries);
    let cli = <Cli as clap::Parser>::parse();
    if cli.legal {
        legal_main(&cli);
    }
    if cli.stream_reference {
        stream_reference_main(&cli);
    }
    if !cli.bad_input.is_empty() || cli.sweep.as_deref().is_some_and(|t| t.contains('!')) {
        bad_input_main(&cli);
    }
    if cli.sweep.is_some() || cli.order || !cli.hook.is_empty() || !cli.ws.is_empty() || !cli.shape.is_empty() || !cli.dtype.is_empty() {
        sweep_main(&cli);
    }
    if cli.list {
        for s in &specs {
            println!("{:<38} {:<30} {}", s.name, s.clause, s.what);
        }
        std::process::exit(0);
    }
    let mut wanted = cli.mutants.clone();
    // A case id names its mutant.
    for id in &cli.cases {
        match specs.iter().find(|s| id.starts_with(&format!("{}::", s.name))) {
            Some(s) if !wanted.iter().any(|w| w == s.name) => wanted.push(s.name.to_string()),
            Some(_) => {}
            None => {
                eprintln!("error: `{id}` names no mutant (case ids look like `sum_is_max_f32::all_reduce::out::f32::sum::ws2`)");
                std::process::exit(2);
            }
        }
    }
    for w in &wanted {
        if !specs.iter().any(|s| s.name == w) {
            eprintln!("error: no mutant `{w}` (list them with --list)");
            std::process::exit(2);
        }
    }
    let chosen: Vec<Spec> = specs.into_iter().filter(|s| wanted.is_empty() || wanted.iter().any(|w| w == s.name)).collect();
    let jobs = cli.jobs.unwrap_or_else(concord_suites::run::default_jobs);
    if let Some(e) = unknown_case(&chosen, &cli.cases) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let mut only = cli.cases.clone();
    if !cli.skip.is_empty() && !only.is_empty() {
        eprintln!("error: --skip leaves cases out of the catalogue; with --case, name only the cases to run");
        std::process::exit(2);
    }
    if !cli.skip.is_empty() && !chosen.is_empty() {
        // Every case but the skipped ones, in the campaign's order, for each chosen mutant.
        for s in &chosen {
            let prefix = format!("{}::", s.name);
            only.extend(
                ordered_cases(s, &[])
                    .into_iter()
                    .filter(|c| !cli.skip.iter().any(|k| c.id.strip_prefix(&prefix).unwrap_or(&c.id).contains(k.as_str())))
                    .map(|c| c.id),
            );
        }
        // An empty list means "every case" to `run_all`: a skip that leaves nothing is an error.
        if only.is_empty() {
            eprintln!("error: --skip {:?} leaves no case to run", cli.skip);
            std::process::exit(2);
        }
    }
    eprintln!("concord-mutants: {} mutant(s), {jobs} side by side; each stops at its first failing case", chosen.len());
    let started = Instant::now();
    let found = run_all(&chosen, &only, jobs, |f| {
        let what = f.caught.as_ref().map_or("SURVIVED".to_string(), |c| format!("caught by {}", c.case));
        eprintln!("  {:<38} {what} ({}, {:.1} s)", f.name, concord_harness::count(f.cases_run, "case", "cases"), f.elapsed.as_secs_f64());
    });
    print!("{}", render(&found, started.elapsed()));
    if cli.cases.is_empty() {
        print!("{}", crate::coverage::render(&crate::catalogue(), &found));
    } else {
        // A rerun (`--case`, as a failure's rerun line): the whole message, with its ranks, stderr
        // tails and rerun line, not only its head; the per-clause table is the campaign's.
        for c in found.iter().filter_map(|f| f.caught.as_ref()) {
            println!("\nthe failure of {} in full:\n{}", c.case, c.message);
        }
    }
    Pool::global().shutdown();
    std::process::exit(if found.iter().all(|f| f.caught.is_some()) { 0 } else { 1 })
}
