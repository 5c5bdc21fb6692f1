//! The public launcher: start one process per rank of a *program* (a bench, a multi-process
//! test), each running to completion, with the same guarantees as the runner's worlds.
//!
//! The runner ([`crate::runner`]) keeps worlds alive and feeds them cases; a launched world
//! instead runs `main` once per rank and exits. Both share the environment a rank reads
//! ([`crate::worker::vars`]), the world naming ([`crate::platform::shm_prefix`]) and the teardown
//! rules.
//!
//! # Contracts
//! * Parent: [`launch`] spawns `ranks` re-executions of `exe` in one new process group, each with
//!   `CONCORD_WORKER=launched`, its rank, the world size, a fresh store file in a temp directory
//!   named after the world, the world id, the op timeout and the backend options.
//!   [`Launched::wait`] waits for every rank up to a deadline, then SIGTERMs the group and every
//!   rank not yet reaped by its pid (a rank that left the group too), waits `grace`, SIGKILLs
//!   the same way, reaps every rank, SIGKILLs what the ranks left behind
//!   ([`platform::end_world_leftovers`]), removes the temp directory and sweeps `/dev/shm`.
//!   Dropping a [`Launched`] does the same at once. Nothing outlives it. Call [`launch`] from a
//!   thread that outlives the world (ranks get SIGKILL when the spawning *thread* ends).
//! * A launched world is one of the runner's live worlds until it is torn down: a parent ended by
//!   SIGTERM / SIGINT / SIGHUP kills its ranks and removes its files (the runner's termination
//!   handler, installed by [`launch`] too).
//! * Child: [`rank_world`] returns the rank's [`WorldInfo`] when the process was launched, so a
//!   binary's `main` starts with `if let Some(world) = launch::rank_world() { ... }`.
//! * [`LaunchReport::check`] names every rank that did not exit 0, with how it ended.

use crate::platform;
use crate::runner;
use crate::worker::{format_options, vars, WorkerEnv};
use concord_core::WorldInfo;
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The value of `CONCORD_WORKER` for a launched rank (a runner worker has `1`).
pub const LAUNCHED: &str = "launched";

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The program each rank runs (usually `std::env::current_exe()`).
    pub exe: PathBuf,
    pub args: Vec<String>,
    /// Ranks started: 0..ranks.
    pub ranks: usize,
    /// The world size the ranks are told (default `ranks`); larger leaves ranks `ranks..` absent,
    /// for tests of a peer that never joins.
    pub world_size: Option<usize>,
    /// The backend name handed to ranks (`WorldInfo` has none; it is for messages).
    pub backend: String,
    pub options: Vec<(String, String)>,
    pub op_timeout: Duration,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Rank 0's stdout goes to this process's stdout; every other rank's is discarded.
    /// (`false`: every rank's stdout is discarded.) stderr is always inherited.
    pub rank0_stdout: bool,
    /// Every rank's stdout is a pipe instead, for [`Launched::take_stdout`] (overrides
    /// `rank0_stdout`).
    pub pipe_stdout: bool,
    pub grace: Duration,
    /// Name prefixes of the files the backend's own library makes in `/dev/shm` (NCCL:
    /// `nccl-`), swept when the world ends, as the runner does ([`runner::WorldKey::foreign_shm`]).
    pub foreign_shm: Vec<String>,
}

impl LaunchSpec {
    /// `ranks` copies of the current executable with its own arguments; settings from
    /// [`crate::config::Config::global`].
    pub fn current_exe(ranks: usize, backend: &str) -> std::io::Result<LaunchSpec> {
        let c = crate::config::Config::global();
        Ok(LaunchSpec {
            exe: std::env::current_exe()?,
            args: std::env::args().skip(1).collect(),
            ranks,
            world_size: None,
            backend: backend.to_string(),
            options: Vec::new(),
            op_timeout: c.op_timeout(),
            env: Vec::new(),
            rank0_stdout: true,
            pipe_stdout: false,
            grace: c.grace,
            foreign_shm: Vec::new(),
        })
    }
}

/// A launched world, running.
pub struct Launched {
    pub world_id: String,
    pgid: i32,
    children: Vec<Child>,
    status: Vec<Option<ExitStatus>>,
    dir: Option<tempfile::TempDir>,
    grace: Duration,
    foreign: Option<std::sync::Arc<platform::ForeignShm>>,
}

/// How one launched rank ended.
#[derive(Clone, Debug)]
pub struct RankExit {
    pub rank: usize,
    pub pid: u32,
    /// `None`: could not be reaped (should not happen after SIGKILL).
    pub status: Option<ExitStatus>,
    /// The launcher ended it at the deadline.
    pub ended_by_launcher: bool,
}

impl RankExit {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success()) && !self.ended_by_launcher
    }
    /// `exit code 3`, `killed by signal SIGSEGV`, `ended at the deadline (SIGTERM)`.
    pub fn describe(&self) -> String {
        let how = match self.status {
            None => "could not be reaped".to_string(),
            Some(s) => platform::describe_exit(&s),
        };
        if self.ended_by_launcher {
            format!("still running at the deadline; {how}")
        } else {
            how
        }
    }
}

/// Every rank's end.
#[derive(Clone, Debug)]
pub struct LaunchReport {
    pub world_id: String,
    pub ranks: Vec<RankExit>,
    pub elapsed: Duration,
}

impl LaunchReport {
    /// `Ok` iff every rank exited 0 by itself; else every other rank named with how it ended:
    /// `rank 1 (pid 42): exit code 3`; three or more ranks that ended the same way in one item
    /// (`ranks 0-98: exit code 1`; a world of 99 ranks all refused was 99 items).
    pub fn check(&self) -> Result<(), String> {
        let mut groups: Vec<(String, Vec<&RankExit>)> = Vec::new();
        for r in self.ranks.iter().filter(|r| !r.success()) {
            let how = r.describe();
            match groups.iter_mut().find(|(h, _)| *h == how) {
                Some((_, v)) => v.push(r),
                None => groups.push((how, vec![r])),
            }
        }
        if groups.is_empty() {
            return Ok(());
        }
        let items: Vec<String> = groups
            .iter()
            .flat_map(|(how, rs)| {
                if rs.len() >= 3 {
                    vec![format!("ranks {}: {how}", rank_ranges(&rs.iter().map(|r| r.rank).collect::<Vec<_>>()))]
                } else {
                    rs.iter().map(|r| format!("rank {} (pid {}): {how}", r.rank, r.pid)).collect()
                }
            })
            .collect();
        Err(format!("world {}: {}", self.world_id, items.join("; ")))
    }
}

/// `0-3, 5, 7-9` for ranks in any order (duplicates once): how the launcher's summary and the
/// bench name a set of ranks.
pub fn rank_ranges(ranks: &[usize]) -> String {
    let mut v = ranks.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", v[i], v[j]) } else { v[i].to_string() });
        i = j + 1;
    }
    parts.join(", ")
}

/// Whether `name` is a variable by which an outer launcher's job names its processes (Open
/// MPI, PMIx, PMI): the ranks of a world launched here never inherit them.
pub fn outer_launcher_var(name: &str) -> bool {
    ["OMPI_", "PMIX_", "PMI_"].iter().any(|p| name.starts_with(p))
}

/// Removes the outer launcher's variables ([`outer_launcher_var`]) from a rank's command. A world
/// Concord starts (the runner's pool, [`launch`]) is not part of the launcher job this process
/// may run in (mpirun): its ranks must not take that job's identity (with an Open MPI rank's
/// `OMPI_*` / PMIx variables, `MPI_Init` in a child aborts; without them the mpi backend refuses
/// to start, a named `Unsupported`).
pub fn without_outer_launcher(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(outer_launcher_var) {
            cmd.env_remove(&k);
        }
    }
}

/// Spawns the world (see the module's contracts).
pub fn launch(spec: &LaunchSpec) -> std::io::Result<Launched> {
    let world_size = spec.world_size.unwrap_or(spec.ranks);
    if spec.ranks == 0 || world_size < spec.ranks {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("cannot start {} ranks of a world of {world_size}", spec.ranks),
        ));
    }
    let world_id = platform::launch_world_id();
    // Inside a rank of a runner's world (a case that launches a world of its own), the dir goes
    // into that world's dir: the runner's termination cleanup removes the world's dir, and a rank
    // it SIGKILLs cannot run this world's `Drop` (a SIGTERM to a conformance run left such dirs
    // in /tmp).
    let prefix = platform::shm_prefix(&world_id);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    let enclosing = std::env::var_os(vars::STORE).map(PathBuf::from).and_then(|s| s.parent().map(|p| p.to_path_buf()));
    // Made and registered under the live-worlds lock, before any process exists (as the runner's
    // worlds are), so a termination signal at any point still removes the dir.
    runner::install_cleanup();
    platform::sweep_dead_worlds_once();
    let dir = {
        let mut live = runner::live_worlds();
        if runner::TERMINATING.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("this process is terminating: no new world"));
        }
        let dir = match enclosing.filter(|p| p.is_dir()) {
            Some(p) => builder.tempdir_in(p)?,
            None => builder.tempdir()?,
        };
        live.insert(world_id.clone(), (0, dir.path().to_path_buf()));
        dir
    };
    let store = dir.path().join("store");
    let foreign = platform::ForeignShm::snapshot(&spec.foreign_shm).map(std::sync::Arc::new);
    if let Some(f) = &foreign {
        runner::live_foreign().insert(world_id.clone(), f.clone());
    }
    let mut launched = Launched { world_id, pgid: 0, children: Vec::new(), status: Vec::new(), dir: Some(dir), grace: spec.grace, foreign };
    for r in 0..spec.ranks {
        let mut cmd = Command::new(&spec.exe);
        cmd.args(&spec.args)
            .env(vars::WORKER, LAUNCHED)
            .env(vars::RANK, r.to_string())
            .env(vars::WORLD_SIZE, world_size.to_string())
            .env(vars::STORE, &store)
            .env(vars::WORLD_ID, &launched.world_id)
            .env(vars::BACKEND, &spec.backend)
            .env(vars::OP_TIMEOUT_MS, spec.op_timeout.as_millis().to_string())
            .env(vars::BACKEND_OPTS, format_options(&spec.options))
            .stdin(Stdio::null())
            .stdout(if spec.pipe_stdout {
                Stdio::piped()
            } else if r == 0 && spec.rank0_stdout {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        without_outer_launcher(&mut cmd);
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        platform::configure_child(&mut cmd, launched.pgid);
        // On error, `launched` is dropped: the ranks already spawned are ended and reaped.
        let child = cmd.spawn()?;
        if r == 0 {
            launched.pgid = child.id() as i32;
            if let Some(d) = &launched.dir {
                runner::live_worlds().insert(launched.world_id.clone(), (launched.pgid, d.path().to_path_buf()));
            }
        }
        launched.children.push(child);
        launched.status.push(None);
    }
    Ok(launched)
}

impl Launched {
    /// The ranks' pids, in rank order.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Rank `rank`'s stdout, once, when launched with `pipe_stdout`.
    pub fn take_stdout(&mut self, rank: usize) -> Option<std::process::ChildStdout> {
        self.children.get_mut(rank)?.stdout.take()
    }

    /// Sends `sig` to rank `rank` alone (fault injection in tests); a rank already reaped is
    /// left alone, so a reused pid is never signalled.
    pub fn signal(&mut self, rank: usize, sig: Signal) -> std::io::Result<()> {
        let _ = self.reap_until(Instant::now());
        match self.status.get(rank) {
            Some(None) => platform::kill_pid(self.children[rank].id(), sig),
            Some(Some(_)) => Ok(()),
            None => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no rank {rank}"))),
        }
    }

    /// Waits for rank `rank` alone, up to `within`; `None` if it is still running then.
    pub fn wait_rank(&mut self, rank: usize, within: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.children[rank].try_wait() {
                self.status[rank] = Some(st);
            }
            if self.status[rank].is_some() || Instant::now() >= until {
                return self.status[rank];
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for every rank up to `deadline` from now — or, once a rank has failed, up to
    /// `grace` more (its peers would only wait for it) — then ends the rest (SIGTERM, grace,
    /// SIGKILL), reaps them all and removes the world's files.
    pub fn wait(mut self, deadline: Duration) -> LaunchReport {
        let start = Instant::now();
        let all_done = self.reap_until(start + deadline);
        let mut ended = vec![false; self.children.len()];
        if !all_done {
            for (r, s) in self.status.iter().enumerate() {
                ended[r] = s.is_none();
            }
        }
        self.finish();
        let ranks = self
            .children
            .iter()
            .enumerate()
            .map(|(rank, c)| RankExit { rank, pid: c.id(), status: self.status[rank], ended_by_launcher: ended[rank] })
            .collect();
        LaunchReport { world_id: self.world_id.clone(), ranks, elapsed: start.elapsed() }
    }

    /// Reaps what has ended, polling until `until` (brought forward to `grace` after the first
    /// failed rank); `true` once every rank has ended.
    fn reap_until(&mut self, mut until: Instant) -> bool {
        let mut nap = Duration::from_micros(100);
        let mut failure_seen = false;
        loop {
            if !failure_seen && self.status.iter().flatten().any(|s| !s.success()) {
                failure_seen = true;
                until = until.min(Instant::now() + self.grace);
            }
            for (c, s) in self.children.iter_mut().zip(self.status.iter_mut()) {
                if s.is_none() {
                    if let Ok(Some(st)) = c.try_wait() {
                        *s = Some(st);
                    }
                }
            }
            if self.status.iter().all(Option::is_some) {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            std::thread::sleep(nap.min(until - now));
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to the group and to every rank not yet reaped (its pid is still ours: safe to
    /// signal directly; covers a rank that left the group), as the runner's teardown does.
    fn signal_unreaped(&self, sig: Signal) {
        if self.pgid > 1 {
            let _ = platform::kill_group(self.pgid, sig);
        }
        for (c, s) in self.children.iter().zip(&self.status) {
            if s.is_none() {
                let _ = platform::kill_pid(c.id(), sig);
            }
        }
    }

    /// SIGTERM, grace, SIGKILL for whatever still runs; then the files.
    fn finish(&mut self) {
        if self.status.iter().any(Option::is_none) {
            self.signal_unreaped(Signal::SIGTERM);
            // A stopped process keeps SIGTERM pending until it runs again.
            self.signal_unreaped(Signal::SIGCONT);
            if !self.reap_until(Instant::now() + self.grace) {
                self.signal_unreaped(Signal::SIGKILL);
                self.reap_until(Instant::now() + Duration::from_secs(10));
            }
        }
        // What the ranks started and left behind (in the group or not), then the files.
        platform::end_world_leftovers(self.pgid, &self.world_id, true);
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
        runner::sweep_foreign(&self.world_id, self.foreign.take().as_ref());
        runner::live_worlds().remove(&self.world_id);
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.dir.is_some() {
            self.grace = self.grace.min(Duration::from_millis(200));
            self.finish();
        }
    }
}

/// In a launched rank: its world. `None` in any other process. A launched rank whose
/// environment is malformed exits with status 2 and a message.
pub fn rank_world() -> Option<WorldInfo> {
    if std::env::var(vars::WORKER).ok().as_deref() != Some(LAUNCHED) {
        return None;
    }
    match WorkerEnv::parse_env() {
        Ok(e) => Some(e.world_info()),
        Err(msg) => {
            eprintln!("concord launched rank: bad environment: {msg}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn exit(rank: usize, code: i32) -> RankExit {
        RankExit { rank, pid: 100 + rank as u32, status: Some(ExitStatus::from_raw(code << 8)), ended_by_launcher: false }
    }

    #[test]
    fn check_names_ranks_that_ended_alike_once() {
        let mut ranks: Vec<RankExit> = (0..99).map(|r| exit(r, 1)).collect();
        ranks[5] = exit(5, 3);
        ranks[7] = exit(7, 0);
        let r = LaunchReport { world_id: "w".into(), ranks, elapsed: Duration::ZERO };
        assert_eq!(r.check().unwrap_err(), "world w: ranks 0-4, 6, 8-98: exit code 1; rank 5 (pid 105): exit code 3");
        let one = LaunchReport { world_id: "w".into(), ranks: vec![exit(0, 0), exit(1, 3)], elapsed: Duration::ZERO };
        assert_eq!(one.check().unwrap_err(), "world w: rank 1 (pid 101): exit code 3");
        // Two alike stay named one by one, with their pids.
        let two = LaunchReport { world_id: "w".into(), ranks: vec![exit(0, 1), exit(1, 1)], elapsed: Duration::ZERO };
        assert_eq!(two.check().unwrap_err(), "world w: rank 0 (pid 100): exit code 1; rank 1 (pid 101): exit code 1");
        let ok = LaunchReport { world_id: "w".into(), ranks: vec![exit(0, 0)], elapsed: Duration::ZERO };
        assert!(ok.check().is_ok());
    }
}
