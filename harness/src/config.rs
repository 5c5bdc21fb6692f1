//! Every setting Concord takes from the environment, read once, in one place.
//!
//! [`Config::global`] reads the variables below the first time it is asked and hands the same
//! value to everything after (the runner, the suites, GPU gating). A variable that is set but not
//! understood is an error that names it (never silently replaced by a default).
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CONCORD_CASE_TIMEOUT_MS` | 20000 | deadline of one case, all ranks (a case may ask for more) |
//! | `CONCORD_OP_TIMEOUT_MS` | see below | deadline of one collective inside a backend |
//! | `CONCORD_SETUP_TIMEOUT_MS` | 60000 | spawn + rendezvous + backend init of a world |
//! | `CONCORD_GRACE_MS` | 1000 | between SIGTERM and SIGKILL; settle time after a rank failed |
//! | `CONCORD_MAX_IDLE_WORLDS` | 4 | persistent worlds kept for reuse |
//! | `CONCORD_GPU_COUNT` | detected | overrides the GPU count (gating) |
//! | `CONCORD_LIST` | `groups` | `cases`: a conformance binary lists one test per case |
//! | `CONCORD_RUNNER_TRACE` | off | `1`: the runner prints its phase timings to stderr |
//! | `CONCORD_LAUNCHER` | `auto` | `off`, `torchrun`, `mpi` or `slurm`: how ranks were started (below) |
//! | `CONCORD_STORE_ADDR` | see below | `HOST:PORT` of the TCP store externally launched ranks meet on |
//! | `CONCORD_GIT_COMMIT` | `git rev-parse` | the source commit a bench records (the GPU bundle sets it) |
//! | `CONCORD_BENCH_PROBE` | off | `1`: the bench profiles each timed window and prints one `# probe` line per step and rank (a diagnosis aid: the profile costs the backend time) |
//! | `CONCORD_CASE_CPU` | off | `1`: every rank measures its process's CPU (user + sys) around each case and at `Ready`, the runner its lane thread's; the report's cases get a `cpu` field (a measuring aid: off, nothing is read) |
//!
//! # Externally launched ranks ([`Launch`])
//! A conformance binary (or a bench) started by a launcher runs as ONE rank of the launcher's
//! world. `auto` recognises, in this order:
//! * **torchrun**: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (and `LOCAL_RANK`); the
//!   store is torchrun's own at `MASTER_ADDR:MASTER_PORT` when `TORCHELASTIC_USE_AGENT_STORE=True`,
//!   else rank 0 serves one there (what `init_process_group("env://")` does);
//! * **Open MPI**: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`; store at `MASTER_ADDR` (else
//!   127.0.0.1 when every rank is on this host) : `MASTER_PORT` (else a port derived from the job
//!   id: `OMPI_MCA_ess_base_jobid`, else `PMIX_NAMESPACE`; neither set is a named error), served
//!   by rank 0;
//! * **Slurm** (an `srun` step: `SLURM_STEP_ID` set): `SLURM_PROCID`, `SLURM_NTASKS`,
//!   `SLURM_LOCALID`; store on the first host of `SLURM_STEP_NODELIST` (else
//!   `SLURM_JOB_NODELIST`) or `MASTER_ADDR`, port `MASTER_PORT` or derived from the job and step
//!   ids, served by rank 0.
//!
//! `CONCORD_STORE_ADDR=HOST:PORT` overrides the store address for every launcher (rank 0 serves,
//! except under torchrun's agent store). `CONCORD_LAUNCHER=off` ignores launcher variables;
//! `auto` also ignores a launcher world of ONE process (`srun -n1 cargo test` stays a test run;
//! name the launcher to run a world of one).
//!
//! (The runner → worker protocol has variables of its own, [`crate::worker::vars`]; they are
//! not settings.)
//!
//! # The deadline rule
//! For a case deadline `D` (the case's own, else `CONCORD_CASE_TIMEOUT_MS`):
//! * a backend gives up on one collective after the **op timeout** = `CONCORD_OP_TIMEOUT_MS`,
//!   else **3/4 of the default case deadline** (fixed per world: workers get it at spawn);
//! * a case body gives up on one wait after the **wait timeout** = **4/5 of `D`**;
//! * the runner gives up on the case at `D`, asks the ranks what they are doing, then ends them.
//!
//! So a stuck collective is first reported by the backend itself (op and sequence number), then
//! by the body's wait, and only then by the runner: the most precise witness speaks first.
//!
//! A world's set-up (spawn, rendezvous, `Backend::init`) is bounded by the **setup timeout**
//! (`CONCORD_SETUP_TIMEOUT_MS`): the runner's worlds, the gates and inits of externally launched
//! ranks, and a bench rank's set-up (`B::init`, `hooks.prepare`, its reference's set-up: its
//! watchdog names the rank and `backend init` at that limit, whatever `--deadline-s` says).

use std::sync::OnceLock;
use std::time::Duration;

pub const CASE_TIMEOUT_MS: &str = "CONCORD_CASE_TIMEOUT_MS";
pub const OP_TIMEOUT_MS: &str = "CONCORD_OP_TIMEOUT_MS";
pub const SETUP_TIMEOUT_MS: &str = "CONCORD_SETUP_TIMEOUT_MS";
pub const GRACE_MS: &str = "CONCORD_GRACE_MS";
pub const MAX_IDLE_WORLDS: &str = "CONCORD_MAX_IDLE_WORLDS";
pub const GPU_COUNT: &str = "CONCORD_GPU_COUNT";
pub const LIST: &str = "CONCORD_LIST";
pub const RUNNER_TRACE: &str = "CONCORD_RUNNER_TRACE";
pub const LAUNCHER: &str = "CONCORD_LAUNCHER";
pub const STORE_ADDR: &str = "CONCORD_STORE_ADDR";
/// Every variable [`Config`] reads to tell whether (and which) outside launcher started this
/// process (module docs). A test that starts ranks of its own removes them from each child's
/// environment first: the test itself may run under a launcher.
pub const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    LAUNCHER,
    STORE_ADDR,
];
pub const GIT_COMMIT: &str = "CONCORD_GIT_COMMIT";
pub const BENCH_PROBE: &str = "CONCORD_BENCH_PROBE";
pub const CASE_CPU: &str = "CONCORD_CASE_CPU";

/// The settings that change what a case does or how long it may take: a failure's rerun line
/// carries those set (`CONCORD_CASE_TIMEOUT_MS=5 cargo xtask conformance ...`), so that pasting
/// it reproduces the failure rather than running the case under the defaults.
pub const RERUN_VARS: [&str; 5] = [CASE_TIMEOUT_MS, OP_TIMEOUT_MS, SETUP_TIMEOUT_MS, GRACE_MS, GPU_COUNT];

/// `VAR=value ` for each of [`RERUN_VARS`] set in this process's environment (empty when none
/// is): the prefix of a rerun command. Values are quoted for the shell when they need it.
pub fn rerun_env() -> String {
    rerun_env_from(|k| std::env::var(k).ok())
}

/// [`rerun_env`] over any lookup (tests).
pub fn rerun_env_from(get: impl Fn(&str) -> Option<String>) -> String {
    let mut s = String::new();
    for k in RERUN_VARS {
        if let Some(v) = get(k) {
            let plain = !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-:/,".contains(c));
            if plain {
                s.push_str(&format!("{k}={v} "));
            } else {
                s.push_str(&format!("{k}='{}' ", v.replace('\'', "'\\''")));
            }
        }
    }
    s
}

/// How often an externally launched rank publishes its heartbeat (state and stderr tail).
pub const HEARTBEAT_PERIOD: Duration = Duration::from_millis(200);
/// An externally launched rank whose heartbeat stopped this long ago is dead (rank 0 names it).
pub const SILENT_RANK_DEAD: Duration = Duration::from_secs(3);

/// The launcher that started this process as one rank of its world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Slurm,
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "mpirun (Open MPI)",
            Launcher::Slurm => "srun (Slurm)",
        }
    }
}

/// This process is one rank of a world a launcher started (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    /// Index among the ranks of this host (GPU backends pick their device from it).
    pub local_rank: usize,
    /// The TCP store every rank meets on.
    pub store_host: String,
    pub store_port: u16,
    /// This process starts the store server (rank 0, unless torchrun's agent serves it).
    pub serve_store: bool,
    /// Common to every rank of this launch (a job id): the prefix of every store key.
    pub run_id: String,
}

/// The first host of a Slurm node list (`node[01-04,07],gpu5` -> `node01`).
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    // The first top-level element (commas inside brackets do not split).
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map(|(i, _)| i)
        .unwrap_or(list.len());
    let first = &list[..end];
    if first.is_empty() {
        return None;
    }
    match first.split_once('[') {
        None => Some(first.to_string()),
        Some((prefix, rest)) => {
            let (ranges, suffix) = rest.split_once(']')?;
            let lo = ranges.split(',').next()?.split('-').next()?;
            Some(format!("{prefix}{lo}{suffix}"))
        }
    }
}

/// A port in 20000..40000 derived from a job id, so every rank of the job picks the same one.
fn derived_port(id: &str) -> u16 {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 20000) as u16
}

/// How a conformance binary lists its tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMode {
    /// One test per (backend, suite, world size), run in one persistent world.
    Groups,
    /// One test per case.
    Cases,
}

/// The settings, as read from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub case_deadline: Duration,
    /// `CONCORD_OP_TIMEOUT_MS` when set; else derived ([`Config::op_timeout`]).
    pub op_timeout_override: Option<Duration>,
    pub setup_timeout: Duration,
    pub grace: Duration,
    pub max_idle_worlds: usize,
    pub gpu_count: Option<usize>,
    pub list: ListMode,
    pub trace: bool,
    /// `CONCORD_BENCH_PROBE=1`: the bench's per-window probe.
    pub bench_probe: bool,
    /// `CONCORD_CASE_CPU=1`: per-case CPU, every rank's and the runner's, in the report.
    pub case_cpu: bool,
    /// `Some` when a launcher started this process as one rank of its world.
    pub launch: Option<Launch>,
    /// `CONCORD_GIT_COMMIT`: the commit the binaries were built from, when the caller knows it
    /// better than the working directory's `.git` (the GPU bundle's entry script sets it).
    pub git_commit: Option<String>,
}

/// A variable that is set but not understood.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{var}={value:?} is not valid: {expected}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            case_deadline: Duration::from_secs(20),
            op_timeout_override: None,
            setup_timeout: Duration::from_secs(60),
            grace: Duration::from_secs(1),
            max_idle_worlds: 4,
            gpu_count: None,
            list: ListMode::Groups,
            trace: false,
            bench_probe: false,
            case_cpu: false,
            launch: None,
            git_commit: None,
        }
    }
}

impl Config {
    /// Reads the variables through `get` (the environment in [`Config::from_env`]).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let d = Config::default();
        let num = |var: &'static str, expected: &'static str| -> Result<Option<u64>, ConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| ConfigError { var, value: v, expected }),
            }
        };
        let ms = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            Ok(num(var, "a whole number of milliseconds")?.map(Duration::from_millis))
        };
        let positive_ms = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            match ms(var)? {
                Some(x) if x.is_zero() => Err(ConfigError { var, value: "0".into(), expected: "more than 0 milliseconds" }),
                o => Ok(o),
            }
        };
        let list = match get(LIST).as_deref().map(str::trim) {
            None | Some("") | Some("groups") => ListMode::Groups,
            Some("cases") => ListMode::Cases,
            Some(v) => return Err(ConfigError { var: LIST, value: v.into(), expected: "`groups` or `cases`" }),
        };
        let switch = |var: &'static str| -> Result<bool, ConfigError> {
            match get(var).as_deref().map(str::trim) {
                None | Some("") | Some("0") => Ok(false),
                Some("1") => Ok(true),
                Some(v) => Err(ConfigError { var, value: v.into(), expected: "`0` or `1`" }),
            }
        };
        let trace = switch(RUNNER_TRACE)?;
        let bench_probe = switch(BENCH_PROBE)?;
        let case_cpu = switch(CASE_CPU)?;
        let launch = Config::launch_from(&get)?;
        Ok(Config {
            launch,
            case_deadline: positive_ms(CASE_TIMEOUT_MS)?.unwrap_or(d.case_deadline),
            op_timeout_override: positive_ms(OP_TIMEOUT_MS)?,
            setup_timeout: positive_ms(SETUP_TIMEOUT_MS)?.unwrap_or(d.setup_timeout),
            grace: ms(GRACE_MS)?.unwrap_or(d.grace),
            max_idle_worlds: num(MAX_IDLE_WORLDS, "a whole number")?.map(|n| n as usize).unwrap_or(d.max_idle_worlds),
            gpu_count: num(GPU_COUNT, "a whole number of GPUs")?.map(|n| n as usize),
            list,
            trace,
            bench_probe,
            case_cpu,
            git_commit: get(GIT_COMMIT).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()),
        })
    }

    /// Reads the launcher variables (see the module docs): `None` when no launcher started us.
    fn launch_from(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, ConfigError> {
        let var = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let has = |k: &str| var(k).is_some();
        let mode = var(LAUNCHER).unwrap_or_else(|| "auto".into());
        let launcher = match mode.as_str() {
            "off" => return Ok(None),
            "torchrun" => Launcher::Torchrun,
            "mpi" => Launcher::OpenMpi,
            "slurm" => Launcher::Slurm,
            "auto" => {
                // A launcher world of one process (`srun -n1 cargo test`) is not a world of ranks.
                let size_of = |k: &str| var(k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
                let (l, size_var) = if ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"].iter().all(|k| has(k)) {
                    (Launcher::Torchrun, "WORLD_SIZE")
                } else if has("OMPI_COMM_WORLD_RANK") && has("OMPI_COMM_WORLD_SIZE") {
                    (Launcher::OpenMpi, "OMPI_COMM_WORLD_SIZE")
                } else if has("SLURM_PROCID") && has("SLURM_NTASKS") && has("SLURM_STEP_ID") {
                    (Launcher::Slurm, "SLURM_NTASKS")
                } else {
                    return Ok(None);
                };
                if size_of(size_var) == 1 {
                    return Ok(None);
                }
                l
            }
            _ => return Err(ConfigError { var: LAUNCHER, value: mode, expected: "`auto`, `off`, `torchrun`, `mpi` or `slurm`" }),
        };
        // A launcher variable that is missing or not a number is named.
        let need = |k: &'static str| -> Result<String, ConfigError> {
            var(k).ok_or(ConfigError { var: k, value: String::new(), expected: "set by the launcher (it is missing)" })
        };
        let number = |k: &'static str| -> Result<usize, ConfigError> {
            let v = need(k)?;
            v.parse().map_err(|_| ConfigError { var: k, value: v, expected: "a whole number" })
        };
        let port_of = |k: &'static str| -> Result<Option<u16>, ConfigError> {
            match var(k) {
                None => Ok(None),
                Some(v) => v.parse().map(Some).map_err(|_| ConfigError { var: k, value: v, expected: "a TCP port (0-65535)" }),
            }
        };
        let (rank, world_size, local_rank, run_id, mut host, mut port) = match launcher {
            Launcher::Torchrun => {
                let rank = number("RANK")?;
                let local = if has("LOCAL_RANK") { number("LOCAL_RANK")? } else { rank };
                let run = format!(
                    "{}-r{}",
                    var("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "torchrun".into()),
                    var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into())
                );
                (rank, number("WORLD_SIZE")?, local, run, Some(need("MASTER_ADDR")?), port_of("MASTER_PORT")?)
            }
            Launcher::OpenMpi => {
                let rank = number("OMPI_COMM_WORLD_RANK")?;
                let size = number("OMPI_COMM_WORLD_SIZE")?;
                let local = if has("OMPI_COMM_WORLD_LOCAL_RANK") { number("OMPI_COMM_WORLD_LOCAL_RANK")? } else { 0 };
                let one_host = var("OMPI_COMM_WORLD_LOCAL_SIZE").is_some_and(|v| v == size.to_string());
                // The job id names the run (store keys) and derives the store port: a constant
                // stand-in would let two jobs on one host share both. Open MPI 5 (PRRTE) sets no
                // `OMPI_MCA_ess_base_jobid`; its PMIx namespace names the job as well.
                let job = var("OMPI_MCA_ess_base_jobid").or_else(|| var("PMIX_NAMESPACE")).ok_or(ConfigError {
                    var: "OMPI_MCA_ess_base_jobid",
                    value: String::new(),
                    expected:
                        "set by mpirun (it is missing, and so is PMIX_NAMESPACE): the job id names the run and derives the store port",
                })?;
                let host = var("MASTER_ADDR").or_else(|| one_host.then(|| "127.0.0.1".to_string()));
                let port = port_of("MASTER_PORT")?.or(Some(derived_port(&job)));
                (rank, size, local, format!("ompi-{job}"), host, port)
            }
            Launcher::Slurm => {
                let job = format!("{}.{}", var("SLURM_JOB_ID").unwrap_or_default(), var("SLURM_STEP_ID").unwrap_or_default());
                let host = var("MASTER_ADDR")
                    .or_else(|| var("SLURM_STEP_NODELIST").and_then(|l| first_slurm_host(&l)))
                    .or_else(|| var("SLURM_JOB_NODELIST").and_then(|l| first_slurm_host(&l)));
                let port = port_of("MASTER_PORT")?.or(Some(derived_port(&job)));
                let local = if has("SLURM_LOCALID") { number("SLURM_LOCALID")? } else { 0 };
                (number("SLURM_PROCID")?, number("SLURM_NTASKS")?, local, format!("slurm-{job}"), host, port)
            }
        };
        if let Some(a) = var(STORE_ADDR) {
            let bad = || ConfigError { var: STORE_ADDR, value: a.clone(), expected: "HOST:PORT" };
            let (h, p) = a.rsplit_once(':').ok_or_else(bad)?;
            host = Some(h.trim_start_matches('[').trim_end_matches(']').to_string()).filter(|h| !h.is_empty());
            port = Some(p.parse().map_err(|_| bad())?);
            if host.is_none() {
                return Err(bad());
            }
        }
        let Some(store_host) = host else {
            return Err(ConfigError {
                var: STORE_ADDR,
                value: String::new(),
                expected:
                    "HOST:PORT of rank 0's host: the ranks are on several hosts and neither MASTER_ADDR nor CONCORD_STORE_ADDR is set",
            });
        };
        let store_port = port.unwrap_or(29500);
        if world_size == 0 || rank >= world_size {
            return Err(ConfigError { var: "RANK", value: rank.to_string(), expected: "a rank below the world size the launcher gave" });
        }
        let agent_store = launcher == Launcher::Torchrun
            && var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            && !has(STORE_ADDR);
        Ok(Some(Launch { launcher, rank, world_size, local_rank, store_host, store_port, serve_store: rank == 0 && !agent_store, run_id }))
    }

    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// The process-wide settings. A variable that is not understood ends the process with one
    /// line naming it (exit code 2): running with a setting silently ignored would be worse.
    pub fn global() -> &'static Config {
        static GLOBAL: OnceLock<Config> = OnceLock::new();
        GLOBAL.get_or_init(|| match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("concord: {e}");
                std::process::exit(2)
            }
        })
    }

    /// Deadline of one collective in a backend (see the module's deadline rule).
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout_override.unwrap_or(self.case_deadline * 3 / 4)
    }

    /// Deadline of one wait in a case body whose case deadline is `case_deadline`.
    pub fn wait_timeout(case_deadline: Duration) -> Duration {
        case_deadline * 4 / 5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn rerun_lines_carry_the_settings_that_change_a_case() {
        let env =
            |vars: &'static [(&'static str, &'static str)]| move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(rerun_env_from(env(&[])), "");
        // Listing, tracing, probing and the launcher do not change a case: left out.
        assert_eq!(rerun_env_from(env(&[(LIST, "cases"), (RUNNER_TRACE, "1"), (GIT_COMMIT, "abc"), (BENCH_PROBE, "1")])), "");
        assert_eq!(
            rerun_env_from(env(&[(GPU_COUNT, "0"), (CASE_TIMEOUT_MS, "5"), (OP_TIMEOUT_MS, "3")])),
            "CONCORD_CASE_TIMEOUT_MS=5 CONCORD_OP_TIMEOUT_MS=3 CONCORD_GPU_COUNT=0 "
        );
        assert_eq!(rerun_env_from(env(&[(GRACE_MS, "1 0")])), "CONCORD_GRACE_MS='1 0' ");
    }

    #[test]
    fn defaults_and_the_deadline_rule() {
        let c = with(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(with(&[(GIT_COMMIT, " 073d42e+dirty\n")]).unwrap().git_commit.as_deref(), Some("073d42e+dirty"));
        assert_eq!(with(&[(GIT_COMMIT, "")]).unwrap().git_commit, None);
        assert_eq!(c.op_timeout(), Duration::from_secs(15));
        assert_eq!(Config::wait_timeout(c.case_deadline), Duration::from_secs(16));
        let c = with(&[(CASE_TIMEOUT_MS, "4000")]).unwrap();
        assert_eq!(c.op_timeout(), Duration::from_millis(3000));
        let c = with(&[(CASE_TIMEOUT_MS, "4000"), (OP_TIMEOUT_MS, " 250 ")]).unwrap();
        assert_eq!(c.op_timeout(), Duration::from_millis(250));
    }

    #[test]
    fn a_bad_value_is_named_not_ignored() {
        let e = with(&[(CASE_TIMEOUT_MS, "1.5s")]).unwrap_err();
        assert_eq!(e.var, CASE_TIMEOUT_MS);
        assert_eq!(e.to_string(), "CONCORD_CASE_TIMEOUT_MS=\"1.5s\" is not valid: a whole number of milliseconds");
        assert_eq!(with(&[(OP_TIMEOUT_MS, "0")]).unwrap_err().var, OP_TIMEOUT_MS);
        assert_eq!(with(&[(LIST, "each")]).unwrap_err().var, LIST);
        assert_eq!(with(&[(LIST, "cases")]).unwrap().list, ListMode::Cases);
        assert_eq!(with(&[(GPU_COUNT, "two")]).unwrap_err().var, GPU_COUNT);
        assert_eq!(with(&[(BENCH_PROBE, "yes")]).unwrap_err().var, BENCH_PROBE);
        assert!(with(&[(BENCH_PROBE, "1")]).unwrap().bench_probe && !with(&[(BENCH_PROBE, "0")]).unwrap().bench_probe);
        assert_eq!(with(&[(CASE_CPU, "on")]).unwrap_err().var, CASE_CPU);
        assert!(with(&[(CASE_CPU, "1")]).unwrap().case_cpu && !with(&[]).unwrap().case_cpu);
    }

    #[test]
    fn launchers_are_read_from_their_own_variables() {
        assert_eq!(with(&[]).unwrap().launch, None);
        let t = with(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "n1"), ("MASTER_PORT", "29400")]).unwrap();
        let l = t.launch.unwrap();
        assert_eq!((l.launcher, l.rank, l.world_size, l.local_rank), (Launcher::Torchrun, 3, 4, 1));
        assert_eq!((l.store_host.as_str(), l.store_port, l.serve_store), ("n1", 29400, false));
        let r0 = with(&[("RANK", "0"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "n1"), ("MASTER_PORT", "29400")]).unwrap().launch.unwrap();
        assert!(r0.serve_store, "rank 0 serves unless torchrun's agent does");
        let agent = with(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "1"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]);
        assert!(!agent.unwrap().launch.unwrap().serve_store);

        let m = with(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "77"),
        ]);
        let m = m.unwrap().launch.unwrap();
        assert_eq!((m.launcher, m.rank, m.world_size, m.local_rank), (Launcher::OpenMpi, 2, 4, 2));
        assert_eq!(m.store_host, "127.0.0.1", "one host: loopback");
        let m2 = with(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "77"),
        ]);
        assert_eq!(m2.unwrap().launch.unwrap().store_port, m.store_port, "every rank derives the same port");
        let hosts = with(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "77"),
        ]);
        assert_eq!(hosts.unwrap_err().var, STORE_ADDR, "several hosts, no address: named");
        let over = with(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMIX_NAMESPACE", "prterun-n1-4242@1"),
            (STORE_ADDR, "10.0.0.1:5555"),
        ])
        .unwrap()
        .launch
        .unwrap();
        assert_eq!((over.store_host.as_str(), over.store_port), ("10.0.0.1", 5555));
        assert_eq!(over.run_id, "ompi-prterun-n1-4242@1", "Open MPI 5: the PMIx namespace names the job");
        // No job id at all: named, never a constant shared by every job on the host.
        let nojob = with(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]);
        let e = nojob.unwrap_err();
        assert_eq!(e.var, "OMPI_MCA_ess_base_jobid");
        assert!(e.expected.contains("PMIX_NAMESPACE"), "{}", e.expected);
        let n5 = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")];
        let (a, b) = (
            with(&[n5.as_slice(), &[("PMIX_NAMESPACE", "job-a")]].concat()),
            with(&[n5.as_slice(), &[("PMIX_NAMESPACE", "job-b")]].concat()),
        );
        assert_ne!(a.unwrap().launch.unwrap().run_id, b.unwrap().launch.unwrap().run_id, "two jobs, two runs");

        let s = with(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_ID", "99"),
            ("SLURM_JOB_NODELIST", "gpu[07-08,11],cpu1"),
        ]);
        let s = s.unwrap().launch.unwrap();
        assert_eq!((s.launcher, s.rank, s.world_size, s.local_rank, s.store_host.as_str()), (Launcher::Slurm, 5, 8, 1, "gpu07"));
        // A batch script (no step) is not a rank; `off` ignores every launcher.
        assert_eq!(with(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")]).unwrap().launch, None);
        assert_eq!(with(&[(LAUNCHER, "off"), ("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap().launch, None);
        assert_eq!(with(&[(LAUNCHER, "pbs")]).unwrap_err().var, LAUNCHER);
        // `srun -n1 cargo test` stays a test run (unless the launcher is named).
        let one = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_NODELIST", "n1")];
        assert_eq!(with(&one).unwrap().launch, None);
        assert!(with(&[one.as_slice(), &[(LAUNCHER, "slurm")]].concat()).unwrap().launch.is_some());

        assert_eq!(with(&[("RANK", "x"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")]).unwrap_err().var, "RANK");
        assert_eq!(with(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")]).unwrap_err().var, "RANK");
    }

    #[test]
    fn slurm_node_lists() {
        for (list, first) in [("n1", "n1"), ("n1,n2", "n1"), ("node[01-04,07]", "node01"), ("a[3,5]-ib,b1", "a3-ib"), ("x[10-12]", "x10")] {
            assert_eq!(first_slurm_host(list).as_deref(), Some(first), "{list}");
        }
        assert_eq!(first_slurm_host(""), None);
    }
}
