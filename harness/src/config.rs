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
        let trace = match get(RUNNER_TRACE).as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(ConfigError { var: RUNNER_TRACE, value: v.into(), expected: "`0` or `1`" }),
        };
        Ok(Config {
            case_deadline: positive_ms(CASE_TIMEOUT_MS)?.unwrap_or(d.case_deadline),
            op_timeout_override: positive_ms(OP_TIMEOUT_MS)?,
            setup_timeout: positive_ms(SETUP_TIMEOUT_MS)?.unwrap_or(d.setup_timeout),
            grace: ms(GRACE_MS)?.unwrap_or(d.grace),
            max_idle_worlds: num(MAX_IDLE_WORLDS, "a whole number")?.map(|n| n as usize).unwrap_or(d.max_idle_worlds),
            gpu_count: num(GPU_COUNT, "a whole number of GPUs")?.map(|n| n as usize),
            list,
            trace,
        })
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
    fn defaults_and_the_deadline_rule() {
        let c = with(&[]).unwrap();
        assert_eq!(c, Config::default());
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
    }
}
