//! Conformance mode under an external launcher (torchrun, mpirun, srun): this process is one
//! rank; every rank selects the same cases (those of the launcher's world size, after the same
//! filters), checks that they agree, and walks them in order through
//! [`concord_harness::external::Rank::step`]. Rank 0 prints each failure, writes the report
//! (`--report DIR`) and the closing line; every rank exits with the same code (0: every case
//! passed or was skipped / unsupported), or non-zero at once when a rank died or hung.

use crate::case::Case;
use crate::report::{CaseRecord, Report};
use crate::run::{init_state, rerun_hint, run_body, BackendEntry, CaseInfo, Opts, WorkerState};
use concord_core::{Backend, WorldInfo, LOCAL_RANK_OPTION};
use concord_harness::config::{Config, Launch};
use concord_harness::external::{Decision, Rank, StepResult};
use concord_harness::outcome::Outcome;
use concord_harness::verdict::Verdict;
use concord_harness::worker::SetupError;
use std::time::{Duration, Instant};

/// What the steps concluded, kept on every rank (rank 0 also prints and reports).
pub(crate) struct Recorder {
    rank0: bool,
    records: Vec<CaseRecord>,
    failed: usize,
    aborted: Option<String>,
    /// Every world id used (their shared-memory names are swept at the end).
    worlds: Vec<String>,
}

impl Recorder {
    fn record(&mut self, entry: &BackendEntry, case: &CaseInfo, verdict: &Verdict, msg: &str, elapsed: Duration) {
        if verdict.is_failed() {
            self.failed += 1;
            if self.rank0 {
                eprintln!("FAIL {}\n{msg}\n", case.id);
            }
        }
        if self.rank0 {
            self.records.push(CaseRecord::new(&entry.name, case, verdict, msg, elapsed));
        }
    }
}

/// A name safe for shared-memory objects and store keys.
fn safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect()
}

/// Fingerprint of the selected case list (FNV-1a over the ids, in order).
fn fingerprint(ids: &[&str]) -> String {
    let h =
        ids.iter().flat_map(|s| s.bytes().chain([0u8])).fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("{}, fingerprint {h:016x}", concord_harness::count(ids.len(), "case", "cases"))
}

pub(crate) fn main(entries: &[BackendEntry], launch: &Launch, opts: &Opts) -> i32 {
    let cfg = Config::global();
    let started = Instant::now();
    let ws = launch.world_size;
    let mut work: Vec<(BackendEntry, Vec<CaseInfo>)> = Vec::new();
    for e in entries {
        let cases: Vec<CaseInfo> = e
            .cases()
            .into_iter()
            .filter(|c| {
                (opts.exact.is_empty() || opts.exact.contains(&c.id))
                    && (opts.filter.is_empty() || opts.filter.iter().any(|f| c.id.contains(f.as_str())))
            })
            .collect();
        if !opts.exact.is_empty() {
            // An exact id of another world size is a mistake worth naming.
            if let Some(c) = cases.iter().find(|c| c.world_size != ws) {
                let started = concord_harness::count(ws, "rank", "ranks");
                eprintln!("error: case {} needs a world of {}, but {} started {started}", c.id, c.world_size, launch.launcher.name());
                return 2;
            }
        }
        let cases: Vec<CaseInfo> = cases.into_iter().filter(|c| c.world_size == ws).collect();
        if !cases.is_empty() {
            work.push((e.clone(), cases));
        }
    }
    let ids: Vec<&str> = work.iter().flat_map(|(_, cs)| cs.iter().map(|c| c.id.as_str())).collect();
    if ids.is_empty() {
        eprintln!(
            "error: no case of world size {ws} matches (filters {:?}, exact {:?}); {} started {ws} ranks",
            opts.filter,
            opts.exact,
            launch.launcher.name()
        );
        return 2;
    }
    let list = fingerprint(&ids);
    let mut rank = match Rank::join(launch, cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("concord: {e}");
            return 1;
        }
    };
    let me = rank.rank();
    if me == 0 {
        eprintln!(
            "concord: {} ranks started by {}, store tcp://{}:{}; running {list}",
            ws,
            launch.launcher.name(),
            launch.store_host,
            launch.store_port
        );
    }
    // Step 1: every rank selected the same cases.
    let agree = {
        let store_list = rank.base_addr().clone();
        let setup = rank.setup_timeout();
        let list = list.clone();
        rank.step("the case list", setup, move || {
            let s = match concord_store::Store::open_addr(&store_list, ws, setup) {
                Ok(s) => s,
                Err(e) => return Outcome::Failed(format!("rank {me}: {e}")),
            };
            if me == 0 {
                return match s.set("list", list.as_bytes()) {
                    Ok(()) => Outcome::Passed,
                    Err(e) => Outcome::Failed(format!("rank 0: {e}")),
                };
            }
            match s.get("list") {
                Ok(v) if v == list.as_bytes() => Outcome::Passed,
                Ok(v) => Outcome::Failed(format!(
                    "rank {me} selected {list} but rank 0 selected {}: every rank must run the same binary with the same arguments",
                    String::from_utf8_lossy(&v)
                )),
                Err(e) => Outcome::Failed(format!("rank {me}: reading rank 0's case list: {e}")),
            }
        })
    };
    match agree {
        Ok(r) if r.verdict.is_failed() => {
            if me == 0 {
                match &r.decision {
                    // A rank died or hung before the cases were agreed on: named, with its pid.
                    Decision::Abort(why) => {
                        eprintln!("concord: {why}:\n{}", r.message);
                        let n = ids.len();
                        println!(
                            "ABORTED: {why}; {n} of {} not run; every rank exits non-zero",
                            concord_harness::count(n, "case", "cases")
                        );
                    }
                    _ => eprintln!("concord: the ranks could not agree on the cases:\n{}", r.message),
                }
            }
            return rank.finish(1);
        }
        Ok(_) => {}
        Err(e) => rank.fail(&e),
    }
    let mut rec = Recorder { rank0: me == 0, records: Vec::new(), failed: 0, aborted: None, worlds: Vec::new() };
    for (entry, cases) in &work {
        if let Err(e) = (entry.external)(&mut rank, entry, cases, &mut rec) {
            rank.fail(&e);
        }
        if rec.aborted.is_some() {
            break;
        }
    }
    if launch.local_rank == 0 {
        for w in &rec.worlds {
            concord_harness::platform::sweep_shm(w);
        }
    }
    let ran = rec.records.len();
    let code = if rec.failed > 0 || rec.aborted.is_some() { 1 } else { 0 };
    if me == 0 {
        let mut records = std::mem::take(&mut rec.records);
        records.sort_by(|a, b| a.id.cmp(&b.id));
        let report = Report::new(records, started.elapsed());
        if let Some(dir) = &opts.report {
            match report.write(dir) {
                Ok((md, json)) => println!("report: {} and {}", md.display(), json.display()),
                Err(e) => eprintln!("could not write the report to {}: {e}", dir.display()),
            }
        }
        if let Some(why) = &rec.aborted {
            let of = concord_harness::count(ids.len(), "case", "cases");
            println!("ABORTED: {why}; {} of {of} not run; every rank exits non-zero", ids.len() - ran);
        }
        print!("{}", report.summary_text());
    }
    rank.finish(code)
}

/// Runs `selected` (cases of backend `B`, all of the launcher's world size) on this rank.
pub(crate) fn run_backend<B: Backend>(
    rank: &mut Rank,
    entry: &BackendEntry,
    cases: fn() -> Vec<Case<B>>,
    selected: &[CaseInfo],
    rec: &mut Recorder,
) -> Result<(), String> {
    crate::case::set_registered_name(&entry.name);
    let me = rank.rank();
    let local = rank.launch.local_rank;
    let setup = rank.setup_timeout();
    let needed = entry.gpus_per_rank * (local + 1);
    // A gate or an init that ends the run (a rank died or hung in it) names that rank, its pid
    // and its stderr tail on rank 0, as a failed case does: no case carries the message.
    let aborted_by = |r: &StepResult, step: &str, rec: &mut Recorder| -> bool {
        let Decision::Abort(why) = &r.decision else { return false };
        if rec.rank0 && !r.message.is_empty() {
            eprintln!("FAIL {} {step}\n{}\n", entry.name, r.message);
        }
        rec.aborted = Some(why.clone());
        true
    };
    let gate = rank.step(&format!("{} gate", entry.name), setup, || {
        if entry.gpus_per_rank == 0 {
            return Outcome::Passed;
        }
        let have = concord_harness::gpu::count();
        if have < needed {
            return Outcome::Skipped(format!(
                "rank {me} (local rank {local}) needs {needed} GPUs on its host, which has {have} ({})",
                concord_harness::gpu::describe()
            ));
        }
        Outcome::Passed
    })?;
    if aborted_by(&gate, "gate", rec) {
        return Ok(());
    }
    if gate.verdict != Verdict::Passed {
        for c in selected {
            rec.record(entry, c, &gate.verdict, &gate.message, Duration::ZERO);
        }
        return Ok(());
    }
    let mut gen = 0u32;
    let mut state: Option<WorkerState<B>> = None;
    let init = |rank: &mut Rank, gen: u32, state: &mut Option<WorkerState<B>>, rec: &mut Recorder| -> Result<StepResult, String> {
        let world_id = safe(&format!("x{}-{}-{}-g{gen}", rank.launch.run_id, rank.launch.store_port, entry.name));
        rec.worlds.push(world_id.clone());
        let mut options = entry.options.clone();
        options.push((LOCAL_RANK_OPTION.to_string(), local.to_string()));
        let world = WorldInfo {
            rank: me,
            world_size: rank.world_size(),
            store_path: rank.base_addr().with_prefix(&format!("{}/g{gen}", safe(&entry.name))).to_path_buf(),
            world_id,
            op_timeout: Config::global().op_timeout(),
            options,
        };
        let r = rank.step(&format!("{} init", entry.name), setup, || match init_state::<B>(world, &entry.name, cases) {
            Ok(st) => {
                *state = Some(st);
                Outcome::Passed
            }
            Err(SetupError::Unsupported(r)) => Outcome::Unsupported(r),
            Err(SetupError::Failed(m)) => Outcome::Failed(m),
        })?;
        if r.verdict != Verdict::Passed {
            *state = None;
        }
        Ok(r)
    };
    let mut last_init = init(rank, gen, &mut state, rec)?;
    if aborted_by(&last_init, &format!("init (generation {gen})"), rec) {
        return Ok(());
    }
    for c in selected {
        if c.isolated {
            let why = "an isolated case (it ends or poisons ranks, so it needs a fresh world); run it without a launcher".to_string();
            rec.record(entry, c, &Verdict::Skipped(why), "", Duration::ZERO);
            continue;
        }
        let Some(st) = state.as_mut() else {
            // The backend did not initialise on every rank: the case inherits that verdict.
            let msg = format!("backend init (generation {gen}) failed:\n{}", last_init.message);
            rec.record(entry, c, &last_init.verdict, &msg, Duration::ZERO);
            continue;
        };
        let r = rank.step(&c.id, c.deadline, || run_body(st, &c.id))?;
        let msg = match &r.verdict {
            Verdict::Failed(_) => format!(
                "{}\n  rerun: {} (here: the same {} command with --exact {})",
                r.message,
                rerun_hint(entry, &c.id),
                rank.launch.launcher.name(),
                c.id
            ),
            _ => String::new(),
        };
        rec.record(entry, c, &r.verdict, &msg, Duration::from_millis(r.elapsed_ms));
        match r.decision {
            Decision::Continue => {}
            Decision::Abort(why) => {
                rec.aborted = Some(why);
                return Ok(());
            }
            Decision::Reinit => {
                // After a failure the world may be poisoned: start a fresh one, as the runner would.
                state = None;
                gen += 1;
                last_init = init(rank, gen, &mut state, rec)?;
                if aborted_by(&last_init, &format!("init (generation {gen})"), rec) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}
