//! Runs a catalogue: the worker side (serve cases on one rank) and the parent side, either as a
//! libtest-mimic test binary (`cargo test`, `cargo nextest run`: one trial per case) or in
//! conformance mode (`--report DIR`: every case, a progress bar, a report, a closing line).

use crate::case::{to_outcome, Case, CaseEnd, CaseMeta, Ctx, Load};
use crate::report::{CaseRecord, Report};
use concord_core::{Backend, CollectiveError};
use concord_harness::outcome::Outcome;
use concord_harness::runner::{CaseRequest, Pool, WorldKey};
use concord_harness::verdict::{Failure, Verdict};
use concord_harness::worker::{self, SetupError, WorkerEnv};
use concord_store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A case as the parent sees it (no body: bodies only run in workers).
#[derive(Clone, Debug)]
pub struct CaseInfo {
    /// Full name, `<backend>::<case>`.
    pub id: String,
    pub meta: CaseMeta,
    pub world_size: usize,
    pub deadline: Duration,
    pub isolated: bool,
    /// The case's own backend options (added to the entry's).
    pub options: Vec<(String, String)>,
    /// What the case spends its time on (scheduling only).
    pub load: crate::case::Load,
}

type ServeFn = dyn Fn(WorkerEnv) + Send + Sync;
type ListFn = dyn Fn() -> Vec<CaseInfo> + Send + Sync;
type ChildFn = dyn Fn() + Send + Sync;
type ExternalFn = dyn Fn(&mut concord_harness::external::Rank, &BackendEntry, &[CaseInfo], &mut crate::external::Recorder) -> Result<(), String>
    + Send
    + Sync;

/// One backend in a conformance binary: its name (the case-id prefix), its catalogue, and how a
/// worker process serves it.
#[derive(Clone)]
pub struct BackendEntry {
    pub name: String,
    /// GPUs each rank needs (0 for host backends). Cases needing more than the machine has are
    /// listed as ignored, with the reason, so nextest shows them as SKIP.
    pub gpus_per_rank: usize,
    /// Options handed to every worker (`WorldInfo::options`).
    pub options: Vec<(String, String)>,
    /// The command that reruns one case, to which ` <case id>` is appended.
    pub rerun: String,
    /// Name prefixes of the files the backend's own library makes in `/dev/shm`
    /// (`Backend::SHM_PREFIXES`; NCCL: `nccl-`), swept by the runner after a world's processes
    /// are reaped ([`WorldKey::foreign_shm`]).
    pub foreign_shm: Vec<String>,
    list: Arc<ListFn>,
    serve: Arc<ServeFn>,
    child: Arc<ChildFn>,
    pub(crate) external: Arc<ExternalFn>,
}

impl BackendEntry {
    /// Registers backend `B` under `name` with catalogue `cases`.
    pub fn new<B: Backend>(name: &str, gpus_per_rank: usize, cases: fn() -> Vec<Case<B>>) -> BackendEntry {
        let prefix = name.to_string();
        let p2 = prefix.clone();
        BackendEntry {
            name: name.to_string(),
            gpus_per_rank,
            options: Vec::new(),
            rerun: format!("cargo xtask conformance --backend {name} --exact"),
            foreign_shm: B::SHM_PREFIXES.iter().map(|p| p.to_string()).collect(),
            list: Arc::new(move || {
                cases()
                    .into_iter()
                    .map(|c| CaseInfo {
                        id: format!("{prefix}::{}", c.name),
                        meta: c.meta,
                        world_size: c.world_size,
                        deadline: c.deadline,
                        isolated: c.isolated,
                        options: c.options,
                        load: c.load,
                    })
                    .collect()
            }),
            serve: Arc::new(move |env| serve_worker::<B>(env, &p2, cases)),
            child: Arc::new(|| crate::suites::async_wait::unwaited_child::<B>()),
            external: Arc::new(move |rank, entry, selected, rec| crate::external::run_backend::<B>(rank, entry, cases, selected, rec)),
        }
    }

    /// The same backend with another catalogue (name, GPUs, options and rerun command kept).
    pub fn with_catalogue<B: Backend>(self, cases: fn() -> Vec<Case<B>>) -> Self {
        let fresh = BackendEntry::new::<B>(&self.name, self.gpus_per_rank, cases);
        BackendEntry { list: fresh.list, serve: fresh.serve, child: fresh.child, external: fresh.external, ..self }
    }

    /// Sets the rerun command (the built-in default is `cargo xtask conformance --backend <name>
    /// --exact`; `harness!` sets `cargo test -p <crate> --test <target> -- --exact`).
    pub fn with_rerun(mut self, command: impl Into<String>) -> Self {
        self.rerun = command.into();
        self
    }

    pub fn with_option(mut self, key: &str, value: &str) -> Self {
        self.options.push((key.to_string(), value.to_string()));
        self
    }

    pub fn cases(&self) -> Vec<CaseInfo> {
        (self.list)()
    }
}

pub(crate) struct WorkerState<B: Backend> {
    pub(crate) backend: B,
    pub(crate) world: concord_core::WorldInfo,
    pub(crate) store: Store,
    pub(crate) groups: HashMap<Vec<usize>, Option<B>>,
    pub(crate) cases: HashMap<String, Case<B>>,
}

impl<B: Backend> Drop for WorkerState<B> {
    fn drop(&mut self) {
        // The backend, store and subgroups are dropped as usual (after this), but not the
        // catalogue: a worker exits right after, and freeing its thousands of cases one
        // allocation at a time cost each worker of the main job 3-9 ms of CPU. (An externally
        // launched rank that re-initialises after a failed case keeps the old one's memory.)
        std::mem::forget(std::mem::take(&mut self.cases));
    }
}

/// Opens the world's store and initialises the backend on this rank (a worker's setup, and an
/// externally launched rank's init step).
pub(crate) fn init_state<B: Backend>(
    world: concord_core::WorldInfo,
    prefix: &str,
    cases: fn() -> Vec<Case<B>>,
) -> Result<WorkerState<B>, SetupError> {
    crate::case::set_world(world.rank, world.world_size);
    let store = Store::open(&world.store_path, world.world_size, world.op_timeout)
        .map_err(|e| SetupError::Failed(format!("rank {}: cannot open the world's store: {e}", world.rank)))?;
    let backend = match B::init(&world) {
        Ok(b) => b,
        // A declared gap (say, a world larger than the backend supports): UNSUPPORTED, unless
        // the backend declares it runs worlds of this size.
        Err(CollectiveError::Unsupported(why)) => return Err(refused_world::<B>(&world, why)),
        Err(e) => {
            return Err(SetupError::Failed(format!(
                "rank {}: {}: backend init failed: {e} [{}]",
                world.rank,
                crate::case::axes(prefix, "init", "-", "-", world.world_size, world.rank),
                e.name()
            )))
        }
    };
    // [clause: init.rank_is_the_launchers] The communicator's rank and size are the launcher's:
    // the harness's fixtures, oracle and verdicts are per launcher rank, and so is a job's data.
    if backend.rank() != world.rank || backend.world_size() != world.world_size {
        return Err(SetupError::Failed(format!(
            "rank {r}: backend={} op=init variant=- dtype=- world_size={ws} rank={r}: init.rank_is_the_launchers: after init the \
             backend reports rank {} of world size {}, but the launcher started this process as rank {r} of {ws}: a backend MUST \
             take its rank and world size from the WorldInfo it is given (never number the ranks by arrival or any order of its own)",
            crate::case::backend_label(&backend),
            backend.rank(),
            backend.world_size(),
            r = world.rank,
            ws = world.world_size,
        )));
    }
    // [clause: init.same_capabilities] One declaration per world: rank 0's, compared on every
    // other rank (one store round per world, never per case).
    concord_harness::declared::same_on_every_rank(
        &store,
        world.rank,
        world.world_size,
        &backend.capabilities(),
        &crate::case::backend_label(&backend),
        concord_harness::config::Config::global().setup_timeout,
    )
    .map_err(SetupError::Failed)?;
    // Only the cases of this world's size: a case always runs in a world of its own size
    // (runner worlds are keyed by it, externally launched ranks select by it). The others are
    // not freed, as the kept ones are not at exit (see `WorkerState`'s drop): a worker of the
    // main job indexed and freed some 6,000 cases it could never be asked for.
    let built = crate::case::building_for_world_size(world.world_size, cases);
    let (mine, others): (Vec<_>, Vec<_>) = built.into_iter().partition(|c| c.world_size == world.world_size);
    std::mem::forget(others);
    let cases = mine.into_iter().map(|c| (format!("{prefix}::{}", c.name), c)).collect();
    Ok(WorkerState { backend, world, store, groups: HashMap::new(), cases })
}

/// What `init` refusing `world` as unsupported (`why`) means: UNSUPPORTED when the world is
/// larger than the backend declares it runs, FAIL when it is within the declared
/// `max_world_size` ([clause: init.declared_world_sizes]). The declaration is read from a
/// one-rank world of this rank's own (a fresh store file and world id under this world's, so the
/// runner sweeps whatever it leaves); where none can be made (a one-rank world already, a TCP
/// store, a backend that refuses that too) the refusal stays UNSUPPORTED.
fn refused_world<B: Backend>(world: &concord_core::WorldInfo, why: String) -> SetupError {
    let unsupported = SetupError::Unsupported(format!("backend init: {why}"));
    let path = world.store_path.to_string_lossy();
    if world.world_size == 1 || path.starts_with("tcp://") {
        return unsupported;
    }
    let mut probe = world.clone();
    probe.rank = 0;
    probe.world_size = 1;
    probe.world_id = format!("{}-declared{}", world.world_id, world.rank);
    probe.store_path = std::path::PathBuf::from(format!("{path}.declared{}", world.rank));
    probe.options.retain(|(k, _)| k != concord_core::fault::OPTION);
    let declared = B::init(&probe).map(|b| (b.capabilities().max_world_size, crate::case::backend_label(&b)));
    let _ = std::fs::remove_file(&probe.store_path);
    match declared {
        Ok((max, label)) if world.world_size <= max => SetupError::Failed(format!(
            "rank {r}: backend={label} op=init variant=- dtype=- world_size={ws} rank={r}: init.declared_world_sizes: init refused \
             a world of {ws} ranks as unsupported ({why}), but the backend declares max_world_size = {max}: every world size up to \
             the declared maximum MUST initialise (or declare a smaller max_world_size)",
            r = world.rank,
            ws = world.world_size,
        )),
        _ => unsupported,
    }
}

/// Runs one case body on this rank and checks quiescence after it.
pub(crate) fn run_body<B: Backend>(st: &mut WorkerState<B>, case_id: &str) -> Outcome {
    let Some(case) = st.cases.get(case_id) else {
        return Outcome::Failed(format!(
            "unknown case `{case_id}` in a world of {} (the parent and the worker disagree on the catalogue)",
            concord_harness::count(st.world.world_size, "rank", "ranks")
        ));
    };
    let body = case.body.clone();
    let mut ctx = Ctx {
        b: &st.backend,
        world: &st.world,
        case: case_id,
        timeout: concord_harness::config::Config::wait_timeout(case.deadline),
        groups: &mut st.groups,
        store: &st.store,
    };
    // A case whose one call the backend declares unsupported is UNSUPPORTED, not run: every
    // suite alike, whether or not its body reads the declaration ("suites report UNSUPPORTED for
    // a declared gap"; `caps::gaps_refused` checks the gaps are refused).
    if let Some(why) = crate::case::declared_gap(&st.backend.capabilities(), &case.meta) {
        return Outcome::Unsupported(why);
    }
    crate::case::take_values_unchecked();
    let result = body(&mut ctx);
    let result = crate::case::unchecked_is_unsupported(result, crate::case::take_values_unchecked());
    if result.is_ok() {
        // Quiescence: a case that returns Ok has waited (or dropped) every work it issued,
        // on the world and on every subgroup; a backend whose count stays up leaks works.
        if let Some(m) = leaked_works(&st.backend, &st.groups, case_id, &case.meta) {
            return Outcome::Failed(m);
        }
    }
    // A failure no check wrote a where-line for (a collective error passed up with `?`, whose
    // `From` knows nothing of the case): the case's axes on this rank, so it too names backend,
    // op, variant, dtype, world size and rank.
    let result = result.map_err(|e| match e {
        CaseEnd::Fail(m) if !m.contains("backend=") => {
            let b = &st.backend;
            CaseEnd::Fail(format!("{}: {m}", crate::case::case_axes(&crate::case::backend_label(b), &case.meta, b.world_size(), b.rank())))
        }
        e => e,
    });
    to_outcome(result)
}

fn serve_worker<B: Backend>(env: WorkerEnv, prefix: &str, cases: fn() -> Vec<Case<B>>) -> ! {
    let prefix = prefix.to_string();
    crate::case::set_registered_name(&prefix);
    worker::serve(
        env,
        move |env| init_state::<B>(env.world_info(), &prefix, cases),
        |st: &mut WorkerState<B>, case_id: &str| run_body(st, case_id),
    )
}

/// `Some(message)` when the world or a cached subgroup backend still counts outstanding works
/// after a case body returned Ok. Works of a peer rank are completed by now (every rank waited
/// its own), so a short grace covers only a backend that uncounts asynchronously.
fn leaked_works<B: Backend>(b: &B, groups: &HashMap<Vec<usize>, Option<B>>, case_id: &str, meta: &crate::case::CaseMeta) -> Option<String> {
    let count = || {
        let mut v = vec![(String::from("world"), b.outstanding())];
        for (ranks, g) in groups {
            if let Some(g) = g {
                v.push((format!("subgroup {ranks:?}"), g.outstanding()));
            }
        }
        v.retain(|(_, n)| *n > 0);
        v
    };
    let deadline = Instant::now() + Duration::from_millis(200);
    let mut leaked = count();
    while !leaked.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        leaked = count();
    }
    if leaked.is_empty() {
        return None;
    }
    let what: Vec<String> = leaked.iter().map(|(c, n)| format!("{n} on the {c}")).collect();
    Some(format!(
        "{}: quiescence: case {case_id} returned with outstanding() > 0 ({}): every issued work must count as outstanding only \
         until it is waited or dropped (leaked works)",
        crate::case::case_axes(&crate::case::backend_label(b), meta, b.world_size(), b.rank()),
        what.join(", ")
    ))
}

/// How to rerun exactly one case of `entry`: with the settings of this run that change a case
/// (`CONCORD_CASE_TIMEOUT_MS`, ...: [`concord_harness::config::RERUN_VARS`]) in front, so that
/// the line reproduces the failure when pasted.
pub fn rerun_hint(entry: &BackendEntry, case_id: &str) -> String {
    format!("{}{} {case_id}", concord_harness::config::rerun_env(), entry.rerun.replace(PROFILE_SLOT, &profile_flag()))
}

/// Where a rerun command names the cargo profile the case ran in (`harness!` puts it after
/// `cargo test`), so a rerun rebuilds nothing and runs the same code.
pub const PROFILE_SLOT: &str = "{profile}";

/// The cargo flag for the profile this binary was built with, read from its path
/// (`target/<profile>/deps/<name>-<hash>`): `` for `debug`, ` --release`, ` --profile <name>`.
pub fn profile_flag() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut parts = exe.iter().rev().skip(1).map(|p| p.to_string_lossy().into_owned());
    let dir = parts.next().unwrap_or_default();
    let profile = if dir == "deps" || dir == "examples" { parts.next().unwrap_or_default() } else { dir };
    match profile.as_str() {
        "debug" | "" => String::new(),
        "release" => " --release".into(),
        p => format!(" --profile {p}"),
    }
}

/// Runs one case in a world of the pool; maps the verdict.
pub fn run_case(entry: &BackendEntry, case: &CaseInfo) -> (Verdict, String, Duration) {
    run_case_in(Pool::global(), entry, case)
}

/// [`run_case`] in the worlds of `pool` (a pool configured apart from the process-wide one).
pub fn run_case_in(pool: &Pool, entry: &BackendEntry, case: &CaseInfo) -> (Verdict, String, Duration) {
    let (verdict, msg, elapsed, _) = run_case_fresh_in(pool, entry, case);
    (verdict, msg, elapsed)
}

/// [`run_case_in`], and whether the case ran in a world spawned for it (no case ran there
/// before it: its verdict owes nothing to the world's history).
pub fn run_case_fresh_in(pool: &Pool, entry: &BackendEntry, case: &CaseInfo) -> (Verdict, String, Duration, bool) {
    let (verdict, msg, elapsed, fresh, _) = run_case_measured(pool, entry, case);
    (verdict, msg, elapsed, fresh)
}

/// [`run_case_fresh_in`], and the case's CPU under `CONCORD_CASE_CPU=1`
/// ([`concord_harness::runner::CaseReport::cpu`]).
fn run_case_measured(
    pool: &Pool,
    entry: &BackendEntry,
    case: &CaseInfo,
) -> (Verdict, String, Duration, bool, Option<concord_harness::runner::CaseCpu>) {
    let needed = entry.gpus_per_rank * case.world_size;
    if needed > 0 {
        let have = concord_harness::gpu::count();
        if have < needed {
            return (
                Verdict::Skipped(format!(
                    "needs {}, this machine has {have} ({})",
                    concord_harness::count(needed, "GPU", "GPUs"),
                    concord_harness::gpu::describe()
                )),
                String::new(),
                Duration::ZERO,
                true,
                None,
            );
        }
    }
    let options = entry.options.iter().chain(&case.options).cloned().collect();
    let key = WorldKey { backend: entry.name.clone(), world_size: case.world_size, options, foreign_shm: entry.foreign_shm.clone() };
    let report = pool.run_case(CaseRequest { key: &key, case_id: &case.id, deadline: case.deadline, isolated: case.isolated });
    let msg = match &report.verdict {
        Verdict::Failed(f) => {
            let mut m = report.failure_message();
            // A verdict the runner reached (a timeout, a crash, a setup or protocol failure)
            // carries no check's `where` line: name the case's axes and the blamed rank here,
            // once, so every failure names op / variant / dtype / world size / rank.
            if let Some(first) = f.first().filter(|x| !matches!(x, Failure::Reported { .. })) {
                let at = m.find('\n').map_or(m.len(), |i| i + 1);
                m.insert_str(at, &format!("  {}\n", case_axes(entry, case, first.rank())));
            }
            format!("{m}\n  rerun: {}", rerun_hint(entry, &case.id))
        }
        _ => String::new(),
    };
    (report.verdict.clone(), msg, report.elapsed, report.fresh_world, report.cpu)
}

/// The case's axes as a failure's `where` line: `backend= op= variant= dtype= world_size= rank=`
/// (`-` for an axis the case does not have), [`crate::case::case_axes`].
fn case_axes(entry: &BackendEntry, case: &CaseInfo, rank: usize) -> String {
    crate::case::case_axes(&entry.name, &case.meta, case.world_size, rank)
}

/// The command line of a conformance binary: libtest's arguments (so `cargo test`, nextest and
/// IDEs drive it like any test binary), plus Concord's own.
#[derive(clap::Parser, Debug)]
#[command(about = "Concord conformance suites: a test binary (libtest arguments) or, with --report, conformance mode")]
struct Cli {
    /// Run only this backend (repeatable).
    #[arg(long = "backend", value_name = "NAME")]
    backends: Vec<String>,
    /// Conformance mode: run every selected case (persistent worlds, a progress bar), write
    /// `conformance.md` and `.json` into DIR and end with `N passed, M failed, K skipped`.
    #[arg(long, value_name = "DIR")]
    report: Option<std::path::PathBuf>,
    /// Conformance mode: worlds run side by side (default: what the machine can run); with more
    /// than one, stall-bound cases (sleeps, deadlines) also run on lanes of their own beside them.
    #[arg(long)]
    jobs: Option<usize>,
    /// Print the contract map (every MUST clause and the cases that check it) and exit.
    #[arg(long)]
    contract: bool,
    #[command(flatten)]
    libtest: libtest_mimic::Arguments,
    /// Conformance mode: more filters (or exact case ids with --exact) after the first, after
    /// `--` (`FILTER -- MORE...`). Declared after libtest's FILTER: a `last` positional must
    /// come after every other one, or clap rejects the first filter.
    #[arg(last = true, value_name = "MORE")]
    more: Vec<String>,
}

/// What conformance mode runs.
#[derive(Default, Debug)]
pub(crate) struct Opts {
    pub(crate) report: Option<std::path::PathBuf>,
    pub(crate) exact: Vec<String>,
    pub(crate) filter: Vec<String>,
    jobs: Option<usize>,
}

/// If this process is a worker (or the un-waited-exit child) of one of `entries`, serves it and
/// never returns; otherwise returns at once. Every binary that runs cases calls this first.
pub fn dispatch_child(entries: &[BackendEntry]) {
    if let Some(env) = WorkerEnv::from_env() {
        match entries.iter().find(|e| e.name == env.backend) {
            Some(e) => {
                (e.serve)(env);
                std::process::exit(0)
            }
            None => {
                eprintln!("concord worker: unknown backend `{}`", env.backend);
                std::process::exit(3)
            }
        }
    }
    if let Ok(name) = std::env::var(crate::suites::async_wait::CHILD_ENV) {
        match entries.iter().find(|e| e.name == name) {
            Some(e) => {
                (e.child)();
                std::process::exit(0)
            }
            None => std::process::exit(3),
        }
    }
}

/// The whole `main` of a conformance binary over `entries`. A reader that closes its stdout
/// early (`--list | head`) ends it quietly (exit 141), not with libtest-mimic's panic and a
/// backtrace (`concord_harness::pipe`).
pub fn main_with(entries: Vec<BackendEntry>) -> ! {
    concord_harness::pipe::main_quiet_on_broken_pipe(std::panic::AssertUnwindSafe(move || main_inner(entries)))
}

fn main_inner(entries: Vec<BackendEntry>) -> ! {
    dispatch_child(&entries);
    let cli = <Cli as clap::Parser>::parse();
    let entries: Vec<BackendEntry> = if cli.backends.is_empty() {
        entries
    } else {
        for b in &cli.backends {
            if !entries.iter().any(|e| &e.name == b) {
                let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
                eprintln!("error: unknown backend `{b}`; this binary has: {}", names.join(", "));
                std::process::exit(2);
            }
        }
        entries.into_iter().filter(|e| cli.backends.contains(&e.name)).collect()
    };
    if cli.contract {
        let ids: Vec<String> = entries.iter().flat_map(|e| e.cases()).map(|c| c.id).collect();
        print!("{}", crate::contract::render(&ids));
        let holes = crate::contract::coverage(&ids).iter().filter(|(_, _, h)| !h.is_empty()).count();
        std::process::exit(if holes == 0 { 0 } else { 1 });
    }
    let mut opts = Opts { report: cli.report.clone(), jobs: cli.jobs, ..Opts::default() };
    let names: Vec<String> = cli.libtest.filter.iter().cloned().chain(cli.more.iter().cloned()).collect();
    if cli.libtest.exact {
        opts.exact = names;
    } else {
        opts.filter = names;
    }
    // Started by torchrun / mpirun / srun: this process is one rank of the launcher's world.
    // (`--list` still lists: a test runner asking what is there is not a rank.)
    if let Some(launch) = concord_harness::config::Config::global().launch.as_ref().filter(|_| !cli.libtest.list) {
        std::process::exit(crate::external::main(&entries, launch, &opts));
    }
    if opts.report.is_none() && !cli.more.is_empty() {
        // libtest takes one filter; silently dropping the rest would run the wrong tests.
        eprintln!("error: more than one filter (`FILTER -- MORE...`) needs conformance mode (--report DIR)");
        std::process::exit(2);
    }
    let code = if opts.report.is_some() { conformance_mode(&entries, &opts) } else { libtest_mode(&entries, cli.libtest) };
    Pool::global().shutdown();
    std::process::exit(code)
}

/// The name of the nextest / libtest test that runs every case of one suite at one world size
/// in one persistent world: `<backend>::suite::<suite>::ws<N>`; the suite's stall-bound cases
/// ([`Load::Stall`]) are a group of their own, `<backend>::suite::<suite>::stall::ws<N>`
/// (`.config/nextest.toml` runs those beside the CPU-bound groups).
pub fn group_id(backend: &str, suite: &str, world_size: usize) -> String {
    format!("{backend}::{GROUP_WORD}::{suite}::ws{world_size}")
}

/// The word that marks a group test id (no case id uses it as its second part).
pub const GROUP_WORD: &str = "suite";

/// The word after the suite in the id of a group of stall-bound cases.
pub const STALL_WORD: &str = "stall";

/// `CONCORD_LIST=cases`: list one test per case instead of one per (backend, suite, world size),
/// so `cargo nextest run -- --exact <case id>` (or a nextest filter on case ids) works.
fn list_cases_individually() -> bool {
    concord_harness::config::Config::global().list == concord_harness::config::ListMode::Cases
}

/// The libtest verdict of one case or group.
fn trial_result(verdict: Verdict, msg: String) -> Result<libtest_mimic::Completion, libtest_mimic::Failed> {
    match verdict {
        Verdict::Passed => Ok(libtest_mimic::Completion::Completed),
        Verdict::Skipped(r) => Ok(libtest_mimic::Completion::ignored_with(r)),
        Verdict::Unsupported(r) => Ok(libtest_mimic::Completion::ignored_with(format!("UNSUPPORTED: {r}"))),
        Verdict::Failed(_) => Err(msg.into()),
    }
}

/// Runs every case of a group in order (one persistent world, reused from case to case); fails
/// with every failing case's message and rerun line.
fn run_group(entry: &BackendEntry, cases: &[CaseInfo]) -> (Verdict, String) {
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut typed = Vec::new();
    let (mut passed, mut unsupported, mut skipped) = (0usize, 0usize, 0usize);
    for c in cases {
        let (verdict, msg, _) = run_case(entry, c);
        match verdict {
            Verdict::Passed => passed += 1,
            Verdict::Unsupported(_) => unsupported += 1,
            Verdict::Skipped(_) => skipped += 1,
            Verdict::Failed(f) => {
                typed.extend(f);
                failures.push((c.id.clone(), msg));
            }
        }
    }
    let counts = format!("{passed} passed, {} failed, {unsupported} unsupported, {skipped} skipped", failures.len());
    if failures.is_empty() {
        if passed == 0 && skipped > 0 {
            return (Verdict::Skipped(format!("{counts} (every case skipped)")), String::new());
        }
        return (Verdict::Passed, String::new());
    }
    let names: Vec<&str> = failures.iter().map(|(id, _)| id.as_str()).collect();
    let head =
        format!("{} of {} failed ({counts}): {}", failures.len(), concord_harness::count(cases.len(), "case", "cases"), names.join(", "));
    let bodies: Vec<String> = failures.iter().map(|(id, m)| format!("FAIL {id}\n{m}")).collect();
    let msg = format!("{head}\n\n{}", bodies.join("\n\n"));
    (Verdict::Failed(typed), msg)
}

fn libtest_mode(entries: &[BackendEntry], args: libtest_mimic::Arguments) -> i32 {
    let gpus = if entries.iter().any(|e| e.gpus_per_rank > 0) { concord_harness::gpu::count() } else { 0 };
    let mut trials = Vec::new();
    // `--exact NAME` (how nextest runs one test, and how a rerun line names one case): build
    // only that trial, be NAME a group or a single case.
    let only = args.exact.then(|| args.filter.clone()).flatten();
    let per_case = list_cases_individually();
    for e in entries {
        let cases = e.cases();
        // Groups, in catalogue order: (suite, world size) -> cases.
        let mut groups: Vec<((String, usize), Vec<CaseInfo>)> = Vec::new();
        for c in cases {
            let single = match &only {
                Some(n) => n == &c.id,
                None => per_case,
            };
            if single {
                let needed = e.gpus_per_rank * c.world_size;
                let entry = e.clone();
                trials.push(
                    libtest_mimic::Trial::ignorable_test(c.id.clone(), move || {
                        let (verdict, msg, _) = run_case(&entry, &c);
                        trial_result(verdict, msg)
                    })
                    // Gated cases are listed as ignored (nextest: SKIP); the names stay exact, and
                    // `--include-ignored` runs them into a runtime skip that states the reason.
                    .with_ignored_flag(needed > gpus),
                );
                continue;
            }
            if per_case {
                continue;
            }
            // Stall-bound cases form groups of their own (`<suite>::stall`), which a test runner
            // can run beside CPU-bound groups (a group that sleeps costs no core).
            let suite = if c.load == Load::Stall { format!("{}::{STALL_WORD}", c.meta.suite) } else { c.meta.suite.clone() };
            let key = (suite, c.world_size);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(c),
                None => groups.push((key, vec![c])),
            }
        }
        for ((suite, ws), cases) in groups {
            let id = group_id(&e.name, &suite, ws);
            if only.as_ref().is_some_and(|n| n != &id) {
                continue;
            }
            let gated = e.gpus_per_rank * ws > gpus;
            let entry = e.clone();
            trials.push(
                libtest_mimic::Trial::ignorable_test(id, move || {
                    let (verdict, msg) = run_group(&entry, &cases);
                    trial_result(verdict, msg)
                })
                .with_ignored_flag(gated),
            );
        }
    }
    if let Some(name) = &only {
        if trials.is_empty() {
            eprintln!("error: no case or group is named `{name}` ({})", list_hint());
            return 2;
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        101
    } else {
        0
    }
}

/// How to list what a name may be, as a command that works when pasted: `--list` alone lists the
/// groups (`shm::suite::matrix::ws4`, one test per backend × suite × world size), not the case
/// ids; `CONCORD_LIST=cases` lists those.
pub fn list_hint() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let cwd = std::env::current_dir().unwrap_or_default();
    let exe = exe.strip_prefix(&cwd).map(std::path::Path::to_path_buf).unwrap_or(exe);
    format!("list the case ids with `CONCORD_LIST=cases {} --list`", exe.display())
}

fn conformance_mode(entries: &[BackendEntry], opts: &Opts) -> i32 {
    let mut work: Vec<(BackendEntry, CaseInfo)> = Vec::new();
    for e in entries {
        for c in e.cases() {
            let keep = (opts.exact.is_empty() || opts.exact.contains(&c.id))
                && (opts.filter.is_empty() || opts.filter.iter().any(|f| c.id.contains(f.as_str())));
            if keep {
                work.push((e.clone(), c));
            }
        }
    }
    // A filter or an exact name that selects nothing is a mistake (a typo in CI must not pass).
    let unknown: Vec<&String> = opts.exact.iter().filter(|x| !work.iter().any(|(_, c)| &c.id == *x)).collect();
    if !unknown.is_empty() {
        let names: Vec<&str> = unknown.iter().map(|s| s.as_str()).collect();
        eprintln!(
            "error: no case is named {} (case ids look like `{}::all_reduce::out::f32::sum::ws4`; {})",
            names.join(", "),
            entries.first().map_or("shm", |e| e.name.as_str()),
            list_hint()
        );
        return 2;
    }
    if work.is_empty() {
        eprintln!("error: no case matches the filter(s) {:?} (filters are substrings of case ids; {})", opts.filter, list_hint());
        return 2;
    }
    let jobs = opts.jobs.unwrap_or_else(default_jobs);
    let report = run_work(work, jobs, true);
    let dir = opts.report.clone().expect("conformance mode");
    match report.write(&dir) {
        Ok((md, json)) => println!("report: {} and {}", md.display(), json.display()),
        Err(e) => eprintln!("could not write the report to {}: {e}", dir.display()),
    }
    for line in skip_summary(&report) {
        println!("{line}");
    }
    print!("{}", report.summary_text());
    if report.failed() > 0 {
        1
    } else {
        0
    }
}

/// Runs every case of `work` the way conformance mode does (`jobs` lanes, stall-bound cases on
/// lanes of their own, the largest worlds taking turns: [`takes_turns`]) and returns the report;
/// `FAIL` lines go to stderr as failures come (with a progress bar on a terminal if `bar`). The
/// one runner of whole catalogues: conformance mode and the campaign's legal variants.
pub fn run_work(work: Vec<(BackendEntry, CaseInfo)>, jobs: usize, bar: bool) -> Report {
    let started = Instant::now();
    let total = work.len();
    let jobs = jobs.max(1);
    // A GPU backend's cases go to one lane of their own, in one queue (stall-bound first, then
    // the rest: `schedule` with one job), so that one world at a time holds the devices — rank r
    // drives GPU r. One case at a time is not enough: a world's communicators are torn down
    // after its case has reported (the progress thread's last jobs), and on 4 x H200 that
    // teardown beside the next case's world on the same GPUs held the next case's ranks seconds
    // apart (`wild_custom::all_reduce::tail_past_16ws::f32::inplace::ws4` timed out on rank 0
    // with the other ranks 3-5 s behind, in 2 of 2 runs of the ws4 cases with 64 lanes, never
    // with one lane, which also ran them in 22.1 s against 46.1 s: one world per world size, not
    // one per lane).
    let (gpu_work, work): (Vec<Work>, Vec<Work>) = work.into_iter().partition(|(e, _)| gpu_lane(e));
    let gpu_lanes = usize::from(!gpu_work.is_empty());
    let gpu = Mutex::new(schedule(gpu_work, 1).1.into_iter());
    let (stall, cpu) = schedule(work, jobs);
    let bar = if bar && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let pb = indicatif::ProgressBar::new(total as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let stall_lanes = stall.len();
    let stall = Mutex::new(stall.into_iter());
    let cpu = Mutex::new(std::collections::VecDeque::from(cpu));
    // Large worlds take turns (`BIG_TURN`, `takes_turns`); while one runs, the other lanes take
    // the smallest cases from the back of the queue.
    let cpus = default_jobs();
    let big = move |c: &CaseInfo| jobs > 1 && takes_turns(c.world_size, cpus);
    let records: Mutex<Vec<CaseRecord>> = Mutex::new(Vec::with_capacity(total));
    std::thread::scope(|s| {
        // `jobs` lanes take the CPU queue, then help with stall-bound cases left; one lane per
        // stall-bound case takes only those; one lane takes a GPU backend's cases, alone.
        let lanes = (0..jobs).map(|_| Lane::Cpu).chain((0..stall_lanes).map(|_| Lane::Stall)).chain((0..gpu_lanes).map(|_| Lane::Gpu));
        for lane in lanes {
            let (stall, cpu, gpu, records, bar) = (&stall, &cpu, &gpu, &records, &bar);
            let cpu_lane = lane == Lane::Cpu;
            s.spawn(move || loop {
                let next = if lane == Lane::Gpu {
                    let Some(w) = gpu.lock().unwrap().next() else { break };
                    Some(w)
                } else if cpu_lane {
                    let mut q = cpu.lock().unwrap();
                    let big_busy =
                        q.front().is_some_and(|(_, c)| big(c)) && matches!(BIG_TURN.try_lock(), Err(std::sync::TryLockError::WouldBlock));
                    if big_busy && q.back().is_some_and(|(_, c)| !big(c)) {
                        q.pop_back()
                    } else {
                        q.pop_front()
                    }
                } else {
                    None
                };
                let Some((entry, case)) = next.or_else(|| stall.lock().unwrap().next()) else { break };
                let big_turn =
                    (cpu_lane && big(&case) && case.load != Load::Stall).then(|| BIG_TURN.lock().unwrap_or_else(|e| e.into_inner()));
                // Worlds of a GPU backend run one at a time: rank r drives GPU r, so two worlds
                // side by side would share devices (measured on 2 GPUs: 32 NCCL worlds at once
                // ran their groups past the enqueue deadline). CPU backends keep every lane.
                let gpu_turn = gpu_lane(&entry).then(|| GPU_TURN.lock().unwrap_or_else(|e| e.into_inner()));
                let (verdict, msg, elapsed, _, cpu) = run_case_measured(Pool::global(), &entry, &case);
                drop(gpu_turn);
                drop(big_turn);
                if verdict.is_failed() {
                    bar.suspend(|| eprintln!("FAIL {}\n{msg}\n", case.id));
                }
                bar.set_message(case.id.clone());
                bar.inc(1);
                records.lock().unwrap().push(CaseRecord::new(&entry.name, &case, &verdict, &msg, elapsed).with_cpu(cpu));
            });
        }
    });
    bar.finish_and_clear();
    let mut records = records.into_inner().unwrap();
    records.sort_by(|a, b| a.id.cmp(&b.id));
    let mut report = Report::new(records, started.elapsed());
    if Pool::global().config().case_cpu {
        report.runner_cpu_seconds = Some(concord_harness::platform::process_cpu_time().as_secs_f64());
    }
    report
}

/// Whether `entry`'s cases go to [`run_work`]'s GPU lane (and take [`GPU_TURN`]): a backend
/// whose ranks need GPUs. The one place of the choice (`suites/tests/gpu_lane.rs` checks it).
fn gpu_lane(entry: &BackendEntry) -> bool {
    entry.gpus_per_rank > 0
}

/// Held while a case of a GPU backend runs in conformance mode (one GPU world at a time; its
/// cases also have one lane of their own).
static GPU_TURN: Mutex<()> = Mutex::new(());

/// What a lane of [`run_work`] takes: the CPU queue (then stall-bound cases left), only
/// stall-bound cases, or only a GPU backend's cases.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    Cpu,
    Stall,
    Gpu,
}

/// Held while a CPU lane runs a case whose world [`takes_turns`].
static BIG_TURN: Mutex<()> = Mutex::new(());

/// Whether a world of `world_size` ranks takes turns with the other large worlds on a machine
/// of `cpus` CPUs in conformance mode (one at a time, [`BIG_TURN`]): more than twice as many
/// ranks as CPUs. Two such worlds side by side share the cores rank for rank, and every
/// collective waits for the slowest of twice as many processes (measured on 2 cores: 8-rank
/// cases alone finish in 6.0 s of wall for the 8.2 s of two worlds side by side, for the same
/// CPU). Smaller worlds run beside any other. When every world of more ranks than CPUs took
/// turns, the 3- to 7-rank worlds, queued last and by then without small cases left to pair
/// with, ran one world at a time: the last quarter to third of the main job with one lane waiting
/// (main12, a timeline of the job on 2 cores; the threshold `2 * cpus` against `cpus`,
/// alternated, in docs/RESULTS.md).
fn takes_turns(world_size: usize, cpus: usize) -> bool {
    world_size > 2 * cpus
}

/// One case of a conformance run, with its backend.
type Work = (BackendEntry, CaseInfo);

/// The order conformance mode runs `work` in: `(stall-bound, the rest)`. With more than one job,
/// stall-bound cases ([`Load::Stall`]: sleeps, stalls, deadlines that must pass) run on lanes
/// of their own, all started at once beside the `jobs` CPU lanes (a lane that sleeps costs no
/// core); with one job they come first in the one queue. The CPU queue holds heavy cases first,
/// then the rest by backend and world size, largest first: cases of one world run back to back
/// (persistent worlds are reused) and the run ends on the cheapest ones, not on one lane's long
/// case.
fn schedule(work: Vec<Work>, jobs: usize) -> (Vec<Work>, Vec<Work>) {
    let (mut stall, mut cpu): (Vec<_>, Vec<_>) = work.into_iter().partition(|(_, c)| c.load == Load::Stall);
    let key = |(e, c): &Work| (c.load, e.name.clone(), std::cmp::Reverse(c.world_size));
    cpu.sort_by_cached_key(key);
    // Longest waits first (the deadline is the best static bound on a stall-bound case's time).
    stall.sort_by_key(|(_, c)| std::cmp::Reverse(c.deadline));
    if jobs > 1 {
        (stall, cpu)
    } else {
        stall.extend(cpu);
        (Vec::new(), stall)
    }
}

/// Worlds run side by side in conformance mode when `--jobs` is not given: what the machine can
/// run (`std::thread::available_parallelism`).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// One line per backend that had skipped cases: how many, and why (the first reason, with the
/// number of other reasons), so a run that skipped everything says so without opening the report.
fn skip_summary(report: &Report) -> Vec<String> {
    let mut per: Vec<(String, usize, usize, Vec<String>)> = Vec::new();
    for c in &report.cases {
        let i = match per.iter().position(|p| p.0 == c.backend) {
            Some(i) => i,
            None => {
                per.push((c.backend.clone(), 0, 0, Vec::new()));
                per.len() - 1
            }
        };
        per[i].1 += 1;
        if c.status == concord_harness::verdict::Status::Skipped {
            per[i].2 += 1;
            // Reasons differ by their numbers (GPUs needed); keep one per shape of reason.
            let shape: String = c.detail.chars().filter(|ch| !ch.is_ascii_digit()).collect();
            if !per[i].3.iter().any(|r| r.chars().filter(|ch| !ch.is_ascii_digit()).collect::<String>() == shape) {
                per[i].3.push(c.detail.clone());
            }
        }
    }
    per.into_iter()
        .filter(|p| p.2 > 0)
        .map(|(backend, total, skipped, reasons)| {
            let all = if skipped == total { " (all of them)" } else { "" };
            let more =
                if reasons.len() > 1 { format!("; and {} other reason(s), see the report", reasons.len() - 1) } else { String::new() };
            let of = concord_harness::count(total, "case", "cases");
            format!("{backend}: {skipped} of {of} skipped{all}: {}{more}", reasons.first().map(String::as_str).unwrap_or(""))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::Parser;

    #[test]
    fn only_worlds_of_more_than_twice_the_cpus_take_turns() {
        // On the 2-core CI machine: 3- and 4-rank worlds run beside others, 5, 8, 16 take turns.
        assert!(!super::takes_turns(2, 2) && !super::takes_turns(3, 2) && !super::takes_turns(4, 2));
        assert!(super::takes_turns(5, 2) && super::takes_turns(8, 2) && super::takes_turns(16, 2));
        assert!(super::takes_turns(3, 1) && !super::takes_turns(32, 16) && super::takes_turns(33, 16));
    }

    #[test]
    fn a_filter_then_more_after_the_double_dash_parse() {
        // What `cargo xtask conformance --backend shm A B` passes to the binary.
        let cli = Cli::try_parse_from(["conformance", "--backend", "shm", "--report", "r", "A", "--", "B", "C"]).expect("parses");
        assert_eq!(cli.libtest.filter.as_deref(), Some("A"));
        assert_eq!(cli.more, ["B", "C"]);
        let cli = Cli::try_parse_from(["conformance", "--exact", "A"]).expect("parses");
        assert!(cli.libtest.exact && cli.more.is_empty());
    }
}
