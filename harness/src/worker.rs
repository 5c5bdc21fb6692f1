//! The child side: a rank worker process.
//!
//! A binary that the runner re-executes MUST call [`WorkerEnv::from_env`] first thing in `main`
//! and, when it returns `Some`, hand over to [`serve`] (which never returns). Everything else
//! (argument parsing, test listing) comes after that check.
//!
//! # Protocol (private between this module and [`crate::runner`])
//! * parent → worker, on stdin, one command per line: `run <case id>`, `status`, `exit`.
//! * worker → parent, one JSON [`WorkerMsg`] per line on a private duplicate of the original
//!   stdout; fd 1 itself is pointed at stderr, so user `println!`s cannot corrupt the protocol.
//! * The worker's stdin thread answers `status` at once (from [`concord_core::progress`]), even
//!   while the main thread is stuck in a collective, and ends the process when stdin reaches EOF
//!   (the parent died or gave up on the world).

use crate::outcome::Outcome;
use crate::platform;
use concord_store::Store;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Environment variables the runner sets for each worker.
pub mod vars {
    pub const WORKER: &str = "CONCORD_WORKER";
    pub const RANK: &str = "CONCORD_RANK";
    pub const WORLD_SIZE: &str = "CONCORD_WORLD_SIZE";
    pub const STORE: &str = "CONCORD_STORE";
    pub const WORLD_ID: &str = "CONCORD_WORLD_ID";
    pub const BACKEND: &str = "CONCORD_BACKEND";
    /// The backend's op timeout (the same name as the setting: a worker inherits it).
    pub const OP_TIMEOUT_MS: &str = crate::config::OP_TIMEOUT_MS;
    /// `k=v,k=v` (keys and values MUST NOT contain `,`; keys MUST NOT contain `=`).
    pub const BACKEND_OPTS: &str = "CONCORD_BACKEND_OPTS";
    /// Deadline of the rendezvous barrier (the runner's setup timeout).
    pub const SETUP_TIMEOUT_MS: &str = crate::config::SETUP_TIMEOUT_MS;
    /// Turns a conformance binary into the async suite's un-waited-exit child (the value names
    /// the backend); set only by that case, through `launch`.
    pub const UNWAITED_CHILD: &str = "CONCORD_UNWAITED_CHILD";
    /// The op the un-waited-exit child's rank 0 drops: unset for an all_reduce, `send` for
    /// sends to a rank that never receives.
    pub const UNWAITED_OP: &str = "CONCORD_UNWAITED_OP";
}

/// Name of the store barrier every world's workers pass before `setup`.
pub const RENDEZVOUS_BARRIER: &str = "concord/rendezvous";
/// After `exit`, how long the worker's stdin thread waits for the main thread to clean up.
const EXIT_FALLBACK: Duration = Duration::from_secs(5);

/// One line from a worker to the runner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum WorkerMsg {
    /// Rendezvous and setup done; ready for cases. `cpu_ns`: the process's CPU so far (spawn,
    /// rendezvous, `setup`), under `CONCORD_CASE_CPU=1` only.
    Ready {
        pid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_ns: Option<u64>,
    },
    /// Rendezvous or setup failed; the worker exits after sending this.
    SetupFailed { message: String },
    /// Setup refused a world the backend declares it does not support (e.g. larger than its
    /// maximum world size); the worker exits after sending this.
    SetupUnsupported { reason: String },
    /// The outcome of `run <case>`. `exiting`: the worker exits right after (it panicked).
    /// `pid`: the process that sent it (the runner refuses an outcome from any other process
    /// than the rank's own, e.g. a copy forked inside the case body; 0: not given).
    Outcome {
        case: String,
        outcome: Outcome,
        exiting: bool,
        #[serde(default)]
        pid: u32,
        /// Under `CONCORD_CASE_CPU=1`: this rank's CPU for the case.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu: Option<RankCpu>,
    },
    /// Answer to `status`: what the rank is doing (`in all_reduce #12 (shm, 503 ms)`).
    Status { state: String },
}

/// One rank's CPU (user + sys, every thread of its process, ns) for one case, measured under
/// `CONCORD_CASE_CPU=1` ([`crate::config::Config::case_cpu`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RankCpu {
    /// From `run` read by the main thread to the outcome: the case body (and whatever the
    /// backend's own threads did meanwhile).
    pub body_ns: u64,
    /// From the previous outcome (the first case: `Ready`) to this one: the body plus what ran
    /// between cases (the command's dispatch, a backend's threads still ticking after the last
    /// case). Summed over a world's cases, every CPU the process spent after `Ready`.
    pub since_ns: u64,
}

/// What a worker learns from its environment.
#[derive(Clone, Debug)]
pub struct WorkerEnv {
    pub rank: usize,
    pub world_size: usize,
    pub store_path: PathBuf,
    pub world_id: String,
    pub backend: String,
    pub op_timeout: Duration,
    pub options: Vec<(String, String)>,
}

/// Parses `k=v,k=v` (empty string: no options).
pub fn parse_options(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("backend option {p:?} is not key=value")),
        })
        .collect()
}

/// Formats options as `k=v,k=v`.
pub fn format_options(opts: &[(String, String)]) -> String {
    opts.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl WorkerEnv {
    /// `Some` iff this process was spawned as a worker (`CONCORD_WORKER=1`). A worker whose
    /// environment is malformed exits with status 2 and a message (it MUST NOT fall through to
    /// the binary's normal `main`, which could spawn workers itself).
    pub fn from_env() -> Option<WorkerEnv> {
        if std::env::var(vars::WORKER).ok().as_deref() != Some("1") {
            return None;
        }
        match Self::parse_env() {
            Ok(e) => Some(e),
            Err(msg) => {
                eprintln!("concord worker: bad environment: {msg}");
                std::process::exit(2);
            }
        }
    }

    pub(crate) fn parse_env() -> Result<WorkerEnv, String> {
        fn var(k: &str) -> Result<String, String> {
            std::env::var(k).map_err(|_| format!("{k} is not set"))
        }
        fn num(k: &str) -> Result<u64, String> {
            let v = var(k)?;
            v.parse().map_err(|_| format!("{k}={v:?} is not a number"))
        }
        let rank = num(vars::RANK)? as usize;
        let world_size = num(vars::WORLD_SIZE)? as usize;
        if rank >= world_size {
            return Err(format!("rank {rank} out of range for world size {world_size}"));
        }
        Ok(WorkerEnv {
            rank,
            world_size,
            store_path: PathBuf::from(var(vars::STORE)?),
            world_id: var(vars::WORLD_ID)?,
            backend: var(vars::BACKEND)?,
            op_timeout: Duration::from_millis(num(vars::OP_TIMEOUT_MS)?),
            options: parse_options(&std::env::var(vars::BACKEND_OPTS).unwrap_or_default())?,
        })
    }

    pub fn world_info(&self) -> concord_core::WorldInfo {
        concord_core::WorldInfo {
            rank: self.rank,
            world_size: self.world_size,
            store_path: self.store_path.clone(),
            world_id: self.world_id.clone(),
            op_timeout: self.op_timeout,
            options: self.options.clone(),
        }
    }

    /// The value of backend option `key`, if given.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

enum Cmd {
    Run(String),
    Exit,
}

fn send(out: &Mutex<File>, msg: &WorkerMsg) {
    let mut line = serde_json::to_string(msg).expect("WorkerMsg serialises");
    line.push('\n');
    let mut f = out.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = f.write_all(line.as_bytes()) {
        if e.raw_os_error() == Some(libc::EPIPE) {
            // The parent is gone: nobody is left to report to.
            platform::exit_now(0);
        }
        // The fd itself is gone (closed or replaced by the code under test): say so, or the rank
        // would end with nothing in its stderr to explain it.
        let _ = writeln!(
            std::io::stderr(),
            "concord worker: cannot write to the runner's protocol channel: {e} (did the backend close or replace this process's file descriptors?)"
        );
        platform::exit_now(70);
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

static EXIT_AFTER_CASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called from a case body: once this case's (passing) outcome is reported, this rank's process
/// ends at once (exit status 0, nothing torn down politely) — for cases about a peer that dies
/// mid-collective. The runner counts such a rank as healthy (it reported, then exited as
/// announced) and tears the world down after the case.
pub fn exit_after_this_case() {
    EXIT_AFTER_CASE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Why a worker's `setup` did not give a usable state.
#[derive(Clone, Debug, PartialEq)]
pub enum SetupError {
    /// A fault: the case fails, naming the rank.
    Failed(String),
    /// A declared gap (the backend does not support this world): the case is UNSUPPORTED.
    Unsupported(String),
}

impl From<String> for SetupError {
    fn from(m: String) -> Self {
        SetupError::Failed(m)
    }
}

/// The worker's setup deadline from `CONCORD_SETUP_TIMEOUT_MS` (60 s when unset): a value that
/// is not a positive whole number of milliseconds is named, never silently replaced.
fn setup_timeout_from(v: Option<&str>) -> Result<Duration, String> {
    match v.map(str::trim) {
        None => Ok(Duration::from_secs(60)),
        Some(t) => match t.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(format!("{}={t:?} is not a positive whole number of milliseconds", vars::SETUP_TIMEOUT_MS)),
        },
    }
}

/// Worker main loop; never returns. Runs `setup` once (after store rendezvous), then serves case
/// requests from the parent, calling `run_case(&mut state, case_id)` for each; a panic in
/// run_case is caught and reported as Failed("rank R panicked: msg") (then the worker exits
/// non-zero, status 101).
pub fn serve<S, E: Into<SetupError>>(
    env: WorkerEnv,
    setup: impl FnOnce(&WorkerEnv) -> Result<S, E>,
    mut run_case: impl FnMut(&mut S, &str) -> Outcome,
) -> ! {
    let proto = match platform::take_protocol_stdout() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("concord worker rank {}: cannot set up the protocol channel: {e}", env.rank);
            platform::exit_now(70);
        }
    };
    let out = Arc::new(Mutex::new(proto));
    let (tx, rx) = mpsc::channel::<Cmd>();
    {
        let out = out.clone();
        let rank = env.rank;
        std::thread::Builder::new()
            .name("concord-worker-stdin".into())
            .spawn(move || {
                let stdin = std::io::stdin();
                for line in stdin.lock().lines() {
                    let line = match line {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = writeln!(
                                std::io::stderr(),
                                "concord worker rank {rank}: cannot read the runner's commands on stdin: {e} (was fd 0 closed?); exiting"
                            );
                            platform::exit_now(70);
                        }
                    };
                    let line = line.trim_end();
                    if line == "status" {
                        send(&out, &WorkerMsg::Status { state: concord_core::progress::describe() });
                    } else if let Some(case) = line.strip_prefix("run ") {
                        let _ = tx.send(Cmd::Run(case.to_string()));
                    } else if line == "exit" {
                        let _ = tx.send(Cmd::Exit);
                        std::thread::sleep(EXIT_FALLBACK);
                        platform::exit_now(0);
                    } else {
                        eprintln!("concord worker rank {rank}: unknown command {line:?}");
                    }
                }
                // stdin closed without `exit`: the parent died or abandoned this world (or the code
                // under test replaced fd 0). Said on stderr, which a dead parent no longer reads.
                let _ = writeln!(
                    std::io::stderr(),
                    "concord worker rank {rank}: stdin reached EOF without `exit` (the runner went away, or fd 0 was replaced); exiting"
                );
                platform::exit_now(0);
            })
            .expect("spawn the worker's stdin thread");
    }

    let setup_timeout = match setup_timeout_from(std::env::var(vars::SETUP_TIMEOUT_MS).ok().as_deref()) {
        Ok(t) => t,
        Err(e) => {
            send(&out, &WorkerMsg::SetupFailed { message: format!("rank {}: {e}", env.rank) });
            std::process::exit(1);
        }
    };
    let store = match rendezvous(&env, setup_timeout) {
        Ok(s) => s,
        Err(message) => {
            send(&out, &WorkerMsg::SetupFailed { message });
            std::process::exit(1);
        }
    };
    let mut state = match setup(&env) {
        Ok(s) => s,
        Err(e) => {
            let msg = match e.into() {
                SetupError::Failed(message) => WorkerMsg::SetupFailed { message },
                SetupError::Unsupported(reason) => WorkerMsg::SetupUnsupported { reason },
            };
            send(&out, &msg);
            drop(store);
            std::process::exit(1);
        }
    };
    // `CONCORD_CASE_CPU=1`: the process's CPU at `Ready`, then around every case.
    let measure = crate::config::Config::global().case_cpu;
    let mut last_cpu = measure.then(platform::process_cpu_time);
    send(&out, &WorkerMsg::Ready { pid: std::process::id(), cpu_ns: last_cpu.map(|c| c.as_nanos() as u64) });

    loop {
        match rx.recv() {
            Ok(Cmd::Run(case)) => {
                let before = last_cpu.map(|_| platform::process_cpu_time());
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&mut state, &case)));
                let cpu = match (last_cpu, before) {
                    (Some(last), Some(before)) => {
                        let now = platform::process_cpu_time();
                        last_cpu = Some(now);
                        Some(RankCpu {
                            body_ns: now.saturating_sub(before).as_nanos() as u64,
                            since_ns: now.saturating_sub(last).as_nanos() as u64,
                        })
                    }
                    _ => None,
                };
                match r {
                    Ok(outcome) => {
                        let exiting = EXIT_AFTER_CASE.load(std::sync::atomic::Ordering::SeqCst) && !outcome.is_failed();
                        send(&out, &WorkerMsg::Outcome { case, outcome, exiting, pid: std::process::id(), cpu });
                        if exiting {
                            // A deliberate death (see `exit_after_this_case`): no goodbye to peers.
                            platform::exit_now(0);
                        }
                    }
                    Err(p) => {
                        let msg = panic_message(&*p);
                        send(
                            &out,
                            &WorkerMsg::Outcome { case, outcome: Outcome::Failed(msg), exiting: true, pid: std::process::id(), cpu },
                        );
                        std::process::exit(101);
                    }
                }
            }
            Ok(Cmd::Exit) | Err(_) => {
                drop(state);
                drop(store);
                std::process::exit(0);
            }
        }
    }
}

/// Opens the world's store, publishes this rank's pid (`pid/<rank>`) and passes the
/// rendezvous barrier.
fn rendezvous(env: &WorkerEnv, timeout: Duration) -> Result<Store, String> {
    let store = Store::open(&env.store_path, env.world_size, timeout).map_err(|e| format!("rendezvous: {e}"))?;
    store.set(&format!("pid/{}", env.rank), std::process::id().to_string().as_bytes()).map_err(|e| format!("rendezvous: {e}"))?;
    store.barrier(RENDEZVOUS_BARRIER, env.world_size, timeout).map_err(|e| format!("rendezvous: {e}"))?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_setup_timeout_is_named_not_replaced() {
        assert_eq!(setup_timeout_from(None), Ok(Duration::from_secs(60)));
        assert_eq!(setup_timeout_from(Some("1500")), Ok(Duration::from_millis(1500)));
        for bad in ["", "abc", "1.5", "-3", "0"] {
            let e = setup_timeout_from(Some(bad)).unwrap_err();
            assert!(e.contains("CONCORD_SETUP_TIMEOUT_MS") && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }

    #[test]
    fn options_roundtrip() {
        let o = parse_options("fail_all=1,mode=fast").unwrap();
        assert_eq!(o, vec![("fail_all".into(), "1".into()), ("mode".into(), "fast".into())]);
        assert_eq!(format_options(&o), "fail_all=1,mode=fast");
        assert!(parse_options("").unwrap().is_empty());
        assert!(parse_options("novalue").is_err());
    }

    #[test]
    fn messages_are_one_json_line() {
        let m = WorkerMsg::Outcome { case: "a b".into(), outcome: Outcome::Failed("x\ny".into()), exiting: false, pid: 7, cpu: None };
        let s = serde_json::to_string(&m).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<WorkerMsg>(&s).unwrap(), m);
        // An outcome without its sender's pid (0: not given) still decodes.
        let old = r#"{"Outcome":{"case":"c","outcome":"Passed","exiting":false}}"#;
        assert_eq!(
            serde_json::from_str::<WorkerMsg>(old).unwrap(),
            WorkerMsg::Outcome { case: "c".into(), outcome: Outcome::Passed, exiting: false, pid: 0, cpu: None }
        );
        // Without `CONCORD_CASE_CPU` nothing of the measure is on the line.
        assert!(!s.contains("cpu"), "{s}");
        let m = WorkerMsg::Outcome {
            case: "c".into(),
            outcome: Outcome::Passed,
            exiting: false,
            pid: 1,
            cpu: Some(RankCpu { body_ns: 5, since_ns: 9 }),
        };
        assert_eq!(serde_json::from_str::<WorkerMsg>(&serde_json::to_string(&m).unwrap()).unwrap(), m);
        let r = WorkerMsg::Ready { pid: 1, cpu_ns: None };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"Ready":{"pid":1}}"#);
    }
}
