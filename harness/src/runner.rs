//! The parent side: worlds of rank workers, case requests, deadlines, verdicts, teardown.
//!
//! # Contracts
//! * Workers are spawned by re-executing [`PoolConfig::exe`] (fork + exec through
//!   `std::process::Command`, never a bare fork), all from one long-lived spawner thread so that
//!   their parent-death signal (SIGKILL) fires only when the whole process goes away. Each
//!   world's ranks share one process group. Workers also exit when their stdin reaches EOF.
//! * Every rank is checked: a rank that crashes (signal, abort, non-zero exit, EOF without an
//!   outcome) fails the case with its rank and cause named, whatever the other ranks reported.
//! * On deadline the runner asks the unfinished ranks for their state (≤ 200 ms; a rank that does
//!   not answer and is stopped is named so), then SIGTERMs the world's process group and every
//!   unreaped rank (one that left the group too), SIGCONTs them (a stopped process acts on
//!   SIGTERM only once it runs), waits `grace`, SIGKILLs them, and reaps every child.
//! * A rank's end is seen by its pipe's EOF or, every `EXIT_POLL` (50 ms), by its exit status: a rank
//!   whose pipes stay open in a process it started (a fork without exec) is still seen to crash,
//!   `PIPE_DRAIN` (1 s) after its exit, not at the deadline.
//! * An outcome carries the pid of the process that sent it: one that is not the rank's own (a
//!   forked copy running the case body) is a protocol failure, never the rank's outcome.
//! * A rank that reported and then ended on its own with a failure status during a teardown
//!   after the case (not by the runner's signals) fails a case that nothing else failed:
//!   `reported passed but then died`; after another failure it is shown on its rank's line only.
//! * A world is reused by later cases with the same [`WorldKey`] while its verdicts are passed,
//!   skipped or unsupported; after a failure, crash or timeout it is torn down (rebuilt on next
//!   use). `isolated` cases get a fresh world, torn down after the case. At most
//!   `max_idle_worlds` idle worlds are kept (least recently used evicted first).
//! * Each world has a fresh store file in its own temp directory named
//!   `concord-<world_id>-…`; at teardown that directory is removed and `/dev/shm` is swept of
//!   names starting with [`platform::shm_prefix`]. Nothing of a world outlives its teardown: after
//!   its ranks are reaped, what is left of its process group is SIGKILLed, and so is every process
//!   whose environment names the world (helpers and daemons its ranks started, outside the group
//!   too) when there is a sign of one (the group was not empty, or a rank's stderr pipe is still
//!   open in another process), and every entry of the temp dir and `/dev/shm` with the world's
//!   prefix is removed ([`platform::end_world_leftovers`]).
//! * A parent SIGKILLed runs no teardown: its world dirs and segments stay. So the first world
//!   dir a process makes (here or in [`crate::launch::launch`]) is preceded by a sweep of the
//!   temp dir and `/dev/shm` ([`platform::sweep_dead_worlds_once`]): every `concord-p<pid>…` /
//!   `concord-l<pid>…` entry of this user whose owning pid is gone (`kill(pid, 0)` is `ESRCH`)
//!   is removed; a live process's, another user's, or one named in another pid namespace (a
//!   container sharing `/dev/shm`), never.
//! * Files a backend's own library makes in `/dev/shm` under names Concord does not choose (NCCL's
//!   `nccl-XXXXXX`) are swept too when the backend declares their prefix
//!   ([`WorldKey::foreign_shm`]): after the world's processes are reaped, and by the termination
//!   handler, the runner removes those that are new since the world was spawned, owned by this
//!   user, and neither open nor mapped by any live process ([`platform::ForeignShm`]): never
//!   another job's live segment, never a file that was there before the world.
//! * Owners of a [`Pool`] MUST call [`Pool::shutdown`] before the process exits (statics are not
//!   dropped); workers die with the process regardless, but their temp directories would stay.

use crate::outcome::Outcome;
use crate::platform;
use crate::verdict::{Failure, RankState, Verdict};
use crate::worker::{format_options, vars, RankCpu, WorkerMsg};
use nix::sys::signal::Signal;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the runner waits for `status` answers before killing (spec: ≤ 200 ms).
const STATUS_WAIT: Duration = Duration::from_millis(200);
/// Bytes of stderr kept per rank.
const TAIL_CAP: usize = 4096;
/// After SIGKILL, how long reaping may take before the runner gives up on a child.
const REAP_LIMIT: Duration = Duration::from_secs(10);
/// While a case runs, how often the runner checks whether a rank's process has ended (its pipe's
/// EOF does not come while a process it started holds the pipe).
const EXIT_POLL: Duration = Duration::from_millis(50);
/// A rank whose process has ended but whose protocol pipe stays open: how long the runner still
/// waits for the pipe's last lines (an outcome written just before the exit) before deciding.
const PIPE_DRAIN: Duration = Duration::from_secs(1);
/// At teardown, once every rank is reaped: how long their stderr pipes get to reach EOF before
/// the runner takes an open one as held by a process a rank started (and looks for such
/// processes by their environment).
const PIPE_CHECK: Duration = Duration::from_millis(50);

/// Which world a case needs: same key → same (reusable) world.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorldKey {
    pub backend: String,
    pub world_size: usize,
    pub options: Vec<(String, String)>,
    /// Name prefixes of the files the backend's own library makes in `/dev/shm` under names
    /// Concord does not choose (NCCL: `nccl-`), swept after the world's processes are reaped
    /// ([`platform::ForeignShm`]: only files new since the world was spawned, owned by this user
    /// and neither open nor mapped by any live process). Empty for most backends.
    pub foreign_shm: Vec<String>,
}

impl WorldKey {
    /// A key with no foreign `/dev/shm` prefix.
    pub fn new(backend: &str, world_size: usize, options: Vec<(String, String)>) -> WorldKey {
        WorldKey { backend: backend.to_string(), world_size, options, foreign_shm: Vec::new() }
    }
}

/// One case to run on every rank of a world.
pub struct CaseRequest<'a> {
    pub key: &'a WorldKey,
    pub case_id: &'a str,
    /// Wall-clock limit for the case itself (world setup has its own `setup_timeout`).
    pub deadline: Duration,
    /// Run in a fresh world, torn down after the case.
    pub isolated: bool,
}

/// What happened on one rank.
#[derive(Clone, Debug)]
pub struct RankReport {
    pub rank: usize,
    pub pid: u32,
    /// What the rank reported; `None` if it crashed or never answered.
    pub outcome: Option<Outcome>,
    /// Where the rank was when the case was decided (before teardown).
    pub state: RankState,
    /// How the process ended, when it ended during the case or its teardown: `exit code 3`,
    /// `killed by signal SIGSEGV`, `terminated by the runner (SIGTERM) ...`. `None`: still alive
    /// (the world was kept) or ended politely at teardown.
    pub exit: Option<String>,
    /// The rank's own account of what it was doing when the runner gave up on it.
    pub state_at_deadline: Option<String>,
    /// The last ≤ 4 KiB its stderr printed during this case.
    pub stderr_tail: String,
}

/// The verdict of one case over all ranks, with each rank's story.
#[derive(Clone, Debug)]
pub struct CaseReport {
    pub case_id: String,
    pub backend: String,
    pub world_size: usize,
    pub verdict: Verdict,
    pub ranks: Vec<RankReport>,
    pub elapsed: Duration,
    /// The world the case ran in (its temp dir and shm names start with `concord-<world_id>-`).
    pub world_id: String,
    /// Whether that world was spawned for this case (no case ran in it before), not reused;
    /// `false` when it failed to set up (what an earlier world left behind may be why).
    pub fresh_world: bool,
    /// Under [`PoolConfig::case_cpu`]: where the case's CPU went (`None` off, or when the case
    /// never reached a ready world).
    pub cpu: Option<CaseCpu>,
}

/// One case's CPU (user + sys) under [`PoolConfig::case_cpu`] (`CONCORD_CASE_CPU=1`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CaseCpu {
    /// Summed over the ranks that reported: their processes' CPU from `run` to the outcome.
    pub ranks_body: Duration,
    /// Summed over the ranks that reported: from their previous outcome (or `Ready`) to this
    /// one, so the body plus what the ranks spent between cases.
    pub ranks_since: Duration,
    /// The ranks' CPU up to `Ready` (exec, rendezvous, backend init), when the world was spawned
    /// for this case; zero for a reused world.
    pub spawn: Duration,
    /// The runner's thread that ran the case (checkout, dispatch, collecting the outcomes, the
    /// verdict, a teardown); the spawner and reader threads are not in it.
    pub runner: Duration,
    /// Ranks that reported a measure (fewer than the world when a rank crashed or timed out).
    pub ranks: usize,
}

impl CaseReport {
    /// Multi-line: the verdict, then each failing rank with its cause, exit, state at deadline
    /// and stderr tail.
    pub fn failure_message(&self) -> String {
        let mut s = format!(
            "case {} on backend {} with {}: {} after {} ms (world {})\n",
            self.case_id,
            self.backend,
            crate::count(self.world_size, "rank", "ranks"),
            self.verdict.label(),
            self.elapsed.as_millis(),
            self.world_id
        );
        if self.verdict.failures().iter().any(|f| matches!(f, Failure::Setup { .. })) {
            s.push_str("  world setup failed:\n");
        }
        for line in self.verdict.detail().lines() {
            s.push_str(&format!("  {line}\n"));
        }
        for r in &self.ranks {
            let bad = matches!(r.outcome, None | Some(Outcome::Failed(_))) || r.exit.is_some();
            if !bad {
                continue;
            }
            s.push_str(&format!(
                "--- rank {} (pid {}): outcome {}",
                r.rank,
                r.pid,
                r.outcome.as_ref().map(|o| o.label()).unwrap_or("none")
            ));
            if let Some(e) = &r.exit {
                s.push_str(&format!("; {e}"));
            }
            if let Some(st) = &r.state_at_deadline {
                s.push_str(&format!("; state: {st}"));
            }
            s.push('\n');
            let tail = r.stderr_tail.trim_end();
            if tail.is_empty() {
                s.push_str("    (stderr empty)\n");
            } else {
                for line in tail.lines() {
                    s.push_str(&format!("    | {line}\n"));
                }
            }
        }
        s
    }
}

/// How the pool spawns and tends worlds.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The worker binary (re-executed with the worker environment).
    pub exe: PathBuf,
    pub args: Vec<String>,
    /// Extra environment for workers (applied after, so overriding, the runner's variables).
    pub env: Vec<(String, String)>,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// After a rank failed (reported a failure, exited, broke the protocol): how long the other
    /// ranks still have to report before the runner stops waiting for them (their failures are
    /// then the bystanders' `abandoned` time-outs). [`PoolConfig::from_env`] sets it to `grace`;
    /// a caller that only needs the verdict (the mutation guard) may shorten it: the case has
    /// failed by then whatever it is.
    pub settle: Duration,
    /// Limit for spawn + rendezvous + `setup` of a world.
    pub setup_timeout: Duration,
    /// Per-collective deadline handed to every worker (`WorldInfo::op_timeout`).
    pub op_timeout: Duration,
    pub max_idle_worlds: usize,
    /// Measure every case's CPU ([`CaseReport::cpu`]); [`PoolConfig::from_env`] takes it from
    /// `CONCORD_CASE_CPU`, and the workers get it in their environment.
    pub case_cpu: bool,
}

impl PoolConfig {
    /// `exe` = the current executable, no args; deadlines and limits from
    /// [`Config::global`](crate::config::Config::global).
    pub fn from_env() -> PoolConfig {
        let c = crate::config::Config::global();
        PoolConfig {
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            args: Vec::new(),
            env: Vec::new(),
            grace: c.grace,
            settle: c.grace,
            setup_timeout: c.setup_timeout,
            op_timeout: c.op_timeout(),
            max_idle_worlds: c.max_idle_worlds,
            case_cpu: c.case_cpu,
        }
    }
}

/// `CONCORD_RUNNER_TRACE=1`: print the runner's phase timings to stderr.
fn trace(msg: &str) {
    if crate::config::Config::global().trace {
        eprintln!("concord-runner: {msg}");
    }
}

// ---------------------------------------------------------------------------------------------
// Spawner thread

type SpawnJob = Box<dyn FnOnce() + Send>;

/// Runs `f` on the process-wide spawner thread (which never exits, so a child's
/// PR_SET_PDEATHSIG fires only when this process dies) and returns its result.
fn on_spawner<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnJob>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("concord-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("spawn the concord spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    let job: SpawnJob = Box::new(move || {
        let _ = rtx.send(f());
    });
    tx.lock().unwrap_or_else(|e| e.into_inner()).send(job).expect("spawner thread alive");
    rrx.recv().expect("spawner thread answers")
}

// ---------------------------------------------------------------------------------------------
// stderr tail

#[derive(Default)]
struct TailInner {
    buf: VecDeque<u8>,
    total: u64,
    closed: bool,
}

#[derive(Default)]
struct Tail {
    inner: Mutex<TailInner>,
    cv: Condvar,
}

impl Tail {
    fn push(&self, data: &[u8]) {
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        t.total += data.len() as u64;
        let data = if data.len() > TAIL_CAP { &data[data.len() - TAIL_CAP..] } else { data };
        let over = (t.buf.len() + data.len()).saturating_sub(TAIL_CAP);
        t.buf.drain(..over);
        t.buf.extend(data);
    }
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.cv.notify_all();
    }
    fn is_closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).closed
    }
    fn mark(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).total
    }
    fn wait_closed(&self, until: Instant) {
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while !t.closed {
            let now = Instant::now();
            if now >= until {
                return;
            }
            t = self.cv.wait_timeout(t, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
    /// What was written since `mark`, as far as the tail still holds it.
    fn since(&self, mark: u64) -> String {
        let t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = ((t.total - mark.min(t.total)) as usize).min(t.buf.len());
        let bytes: Vec<u8> = t.buf.iter().skip(t.buf.len() - n).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

// ---------------------------------------------------------------------------------------------
// Worlds

enum Event {
    Msg(usize, WorkerMsg),
    /// The rank's protocol stdout closed: the process is ending.
    Eof(usize),
    /// A protocol line that is not a [`WorkerMsg`].
    Garbage(usize, String),
}

struct RankProc {
    rank: usize,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    tail: Arc<Tail>,
    status: Option<ExitStatus>,
    /// The runner signalled it (SIGTERM / SIGKILL) in a teardown: an exit status by signal is
    /// then the runner's doing, not the rank's.
    signalled: bool,
    /// The pid the worker announced in `Ready` (its own `getpid`; 0 before): the only process
    /// whose outcomes are the rank's.
    worker_pid: u32,
}

impl RankProc {
    fn send(&mut self, line: &str) -> std::io::Result<()> {
        match &mut self.stdin {
            Some(s) => s.write_all(format!("{line}\n").as_bytes()),
            None => Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdin already closed")),
        }
    }
    /// Reaps if the process has ended (non-blocking).
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
            }
        }
        self.status
    }
    /// Reaps, waiting up to `until`.
    fn reap_until(&mut self, until: Instant) -> Option<ExitStatus> {
        let mut nap = Duration::from_micros(50);
        loop {
            if let Some(s) = self.poll_exit() {
                return Some(s);
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            std::thread::sleep(nap.min(until - now));
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }
}

fn describe_status(s: &ExitStatus) -> String {
    platform::describe_exit(s)
}

/// Why a world did not get ready: faults (rank, what), or only a declared gap (rank, reason).
enum SetupProblems {
    Failed(Vec<(usize, String)>),
    Unsupported(Vec<(usize, String)>),
}

impl SetupProblems {
    fn ranks(&self) -> Vec<usize> {
        match self {
            SetupProblems::Failed(v) | SetupProblems::Unsupported(v) => v.iter().map(|(r, _)| *r).collect(),
        }
    }
}

struct World {
    id: String,
    key: WorldKey,
    pgid: i32,
    dir: Option<tempfile::TempDir>,
    ranks: Vec<RankProc>,
    events: Receiver<Event>,
    last_used: Instant,
    /// The snapshot of `/dev/shm` for the backend's declared foreign prefixes, taken before the
    /// world's processes were spawned (`None`: no prefix declared).
    foreign: Option<Arc<platform::ForeignShm>>,
    /// Under `case_cpu`: the ranks' CPU up to `Ready`, summed, until the first case takes it.
    ready_cpu: Option<Duration>,
}

static WORLD_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Every world not yet torn down, the runner's and the launcher's ([`crate::launch`]): id ->
/// (process group, temp dir). Read by the termination handler, so that a parent killed by
/// SIGTERM / SIGINT / SIGHUP still leaves nothing behind.
pub(crate) fn live_worlds() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<String, (i32, PathBuf)>> {
    static LIVE: Mutex<std::collections::BTreeMap<String, (i32, PathBuf)>> = Mutex::new(std::collections::BTreeMap::new());
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set (under the `live_worlds` lock) once the termination handler has taken the live worlds: a
/// world spawned after that would leave its dir behind, so none is.
/// The foreign-shm snapshots of the live worlds that have one (see [`WorldKey::foreign_shm`]),
/// for the termination handler.
pub(crate) fn live_foreign() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<String, Arc<platform::ForeignShm>>> {
    static LIVE: Mutex<std::collections::BTreeMap<String, Arc<platform::ForeignShm>>> = Mutex::new(std::collections::BTreeMap::new());
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a foreign-shm sweep looks again at a file still mapped by a process that is exiting
/// (a rank or helper SIGKILLed moments before).
const FOREIGN_SETTLE: Duration = Duration::from_millis(500);

/// Sweeps a world's foreign `/dev/shm` files (see [`WorldKey::foreign_shm`]) and forgets its
/// snapshot.
pub(crate) fn sweep_foreign(id: &str, foreign: Option<&Arc<platform::ForeignShm>>) {
    let Some(f) = foreign else { return };
    let out = f.sweep(FOREIGN_SETTLE);
    if !out.removed.is_empty() || !out.undecided.is_empty() {
        trace(&format!("world {id}: removed {:?} from /dev/shm; kept (held) {:?}; undecided {:?}", out.removed, out.held, out.undecided));
    }
    live_foreign().remove(id);
}

pub(crate) static TERMINATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs (once per process) the termination handler that runs [`cleanup_live_worlds`].
pub(crate) fn install_cleanup() {
    platform::install_termination_cleanup(cleanup_live_worlds);
}

/// Kills every live world's processes and removes their files (termination handler): the
/// processes first, so no rank still running writes into a dir being removed.
pub(crate) fn cleanup_live_worlds() {
    let worlds = {
        let mut live = live_worlds();
        TERMINATING.store(true, Ordering::SeqCst);
        std::mem::take(&mut *live)
    };
    let foreign = std::mem::take(&mut *live_foreign());
    for (id, (pgid, dir)) in worlds {
        platform::end_world_leftovers(pgid, &id, true);
        let _ = std::fs::remove_dir_all(&dir);
        sweep_foreign(&id, foreign.get(&id));
    }
}

fn spawn_readers(rank: usize, child: &mut Child, tx: Sender<Event>, tail: Arc<Tail>) {
    let stdout = child.stdout.take().expect("stdout piped");
    let stderr = child.stderr.take().expect("stderr piped");
    std::thread::Builder::new()
        .name(format!("concord-r{rank}-out"))
        .spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let ev = match serde_json::from_str::<WorkerMsg>(line.trim_end()) {
                            Ok(m) => Event::Msg(rank, m),
                            Err(_) => Event::Garbage(rank, line.trim_end().to_string()),
                        };
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send(Event::Eof(rank));
        })
        .expect("spawn a stdout reader thread");
    std::thread::Builder::new()
        .name(format!("concord-r{rank}-err"))
        .spawn(move || {
            let mut e = stderr;
            let mut buf = [0u8; 4096];
            loop {
                match e.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => tail.push(&buf[..n]),
                }
            }
            tail.close();
        })
        .expect("spawn a stderr reader thread");
}

const GLIBC_TUNABLES: &str = "GLIBC_TUNABLES";
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// A worker's `GLIBC_TUNABLES`: the inherited ones plus `glibc.malloc.hugetlb=1` (unless they
/// set it), so glibc asks for transparent huge pages (`madvise`) on the memory it maps. A case
/// makes and frees host tensors of up to 64 MiB on every rank, each a fresh mapping faulted in
/// 4 KiB page by page (the main job's page faults: 1.3 M, half with huge pages). Nothing else
/// changes: a large block is still its own mapping, unmapped when freed (a backend that reads a
/// freed host tensor still crashes, `runner::use_after_free_crashes`), and the bytes a mapping
/// covers are the same; where the kernel gives no huge pages this is a no-op.
fn worker_tunables(inherited: Option<&str>) -> String {
    match inherited.filter(|t| !t.is_empty()) {
        Some(t) if t.split(':').any(|kv| kv.starts_with("glibc.malloc.hugetlb=")) => t.to_string(),
        Some(t) => format!("{t}:{HUGE_PAGES}"),
        None => HUGE_PAGES.to_string(),
    }
}

impl World {
    /// Spawns the world's processes (no waiting for readiness).
    fn spawn(cfg: &PoolConfig, key: &WorldKey) -> Result<World, String> {
        if key.world_size == 0 {
            return Err("world size 0".into());
        }
        let id = platform::pool_world_id(WORLD_COUNTER.fetch_add(1, Ordering::Relaxed));
        install_cleanup();
        platform::sweep_dead_worlds_once();
        // Made and registered under the lock, before any process exists (process group 0: nothing
        // to signal yet), so a termination signal that arrives at any point of the spawn still
        // removes the dir: the handler takes the live worlds under the same lock, and after it
        // has, no dir is made (a dir made between its take and the exit was left behind, under a
        // SIGTERM to a run with several jobs).
        let dir = {
            let mut live = live_worlds();
            if TERMINATING.load(Ordering::SeqCst) {
                return Err("the runner is terminating".into());
            }
            let dir = tempfile::Builder::new()
                .prefix(&platform::shm_prefix(&id))
                .tempdir()
                .map_err(|e| format!("cannot create the world's temp dir: {e}"))?;
            live.insert(id.clone(), (0, dir.path().to_path_buf()));
            dir
        };
        // Before any process of the world exists: what the backend's library makes from now on
        // is the world's (or another live job's, which holds it and is kept).
        let foreign = platform::ForeignShm::snapshot(&key.foreign_shm).map(Arc::new);
        if let Some(f) = &foreign {
            live_foreign().insert(id.clone(), f.clone());
        }
        let store = dir.path().join("store");
        let op_ms = cfg.op_timeout.as_millis().to_string();
        let setup_ms = cfg.setup_timeout.as_millis().to_string();
        let mut cmds = Vec::new();
        for r in 0..key.world_size {
            let mut cmd = Command::new(&cfg.exe);
            cmd.args(&cfg.args)
                .env(vars::WORKER, "1")
                .env(vars::RANK, r.to_string())
                .env(vars::WORLD_SIZE, key.world_size.to_string())
                .env(vars::STORE, &store)
                .env(vars::WORLD_ID, &id)
                .env(vars::BACKEND, &key.backend)
                .env(vars::OP_TIMEOUT_MS, &op_ms)
                .env(vars::SETUP_TIMEOUT_MS, &setup_ms)
                .env(vars::BACKEND_OPTS, format_options(&key.options))
                .env(GLIBC_TUNABLES, worker_tunables(std::env::var(GLIBC_TUNABLES).ok().as_deref()));
            crate::launch::without_outer_launcher(&mut cmd);
            if cfg.case_cpu {
                cmd.env(crate::config::CASE_CPU, "1");
            }
            for (k, v) in &cfg.env {
                cmd.env(k, v);
            }
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            cmds.push(cmd);
        }
        let exe = cfg.exe.display().to_string();
        let t_spawn = Instant::now();
        let spawned: Result<Vec<Child>, (Vec<Child>, String)> = on_spawner(move || {
            let mut children: Vec<Child> = Vec::new();
            let mut pgid = 0i32;
            for (r, mut cmd) in cmds.into_iter().enumerate() {
                platform::configure_child(&mut cmd, pgid);
                match cmd.spawn() {
                    Ok(c) => {
                        if r == 0 {
                            pgid = c.id() as i32;
                        }
                        children.push(c);
                    }
                    Err(e) => return Err((children, format!("cannot spawn rank {r} ({exe}): {e}"))),
                }
            }
            Ok(children)
        });
        let children = match spawned {
            Ok(c) => c,
            Err((mut children, msg)) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                platform::sweep_shm(&id);
                sweep_foreign(&id, foreign.as_ref());
                live_worlds().remove(&id);
                return Err(msg);
            }
        };
        let pgid = children[0].id() as i32;
        live_worlds().insert(id.clone(), (pgid, dir.path().to_path_buf()));
        trace(&format!("world {id}: {} ranks spawned in {:?}", children.len(), t_spawn.elapsed()));
        let (tx, rx) = mpsc::channel();
        let ranks = children
            .into_iter()
            .enumerate()
            .map(|(rank, mut child)| {
                let tail = Arc::new(Tail::default());
                spawn_readers(rank, &mut child, tx.clone(), tail.clone());
                RankProc { rank, pid: child.id(), stdin: child.stdin.take(), child, tail, status: None, signalled: false, worker_pid: 0 }
            })
            .collect();
        Ok(World { id, key: key.clone(), pgid, dir: Some(dir), ranks, events: rx, last_used: Instant::now(), foreign, ready_cpu: None })
    }

    /// Waits until every rank reported `Ready`. On failure returns one line per rank that did
    /// not get ready (the world must then be torn down).
    fn await_ready(&mut self, timeout: Duration) -> Result<(), SetupProblems> {
        let until = Instant::now() + timeout;
        let n = self.ranks.len();
        let mut ready = vec![false; n];
        let mut problems: Vec<(usize, String)> = Vec::new();
        let mut unsupported: Vec<(usize, String)> = Vec::new();
        let mut settle: Option<Instant> = None;
        while ready.iter().any(|r| !r) {
            let limit = settle.map_or(until, |s| s.min(until));
            let now = Instant::now();
            if now >= limit {
                break;
            }
            match self.events.recv_timeout(limit - now) {
                Ok(Event::Msg(r, WorkerMsg::Ready { pid, cpu_ns })) => {
                    self.ranks[r].worker_pid = pid;
                    if let Some(ns) = cpu_ns {
                        *self.ready_cpu.get_or_insert(Duration::ZERO) += Duration::from_nanos(ns);
                    }
                    ready[r] = true;
                }
                Ok(Event::Msg(r, WorkerMsg::SetupFailed { message })) => {
                    problems.push((r, format!("setup failed: {message}")));
                    ready[r] = true; // accounted for
                    settle.get_or_insert(Instant::now() + Duration::from_millis(100));
                }
                Ok(Event::Msg(r, WorkerMsg::SetupUnsupported { reason })) => {
                    unsupported.push((r, reason));
                    ready[r] = true;
                    settle.get_or_insert(Instant::now() + Duration::from_millis(100));
                }
                Ok(Event::Msg(_, _)) => {}
                Ok(Event::Garbage(r, line)) => {
                    problems.push((r, format!("protocol violation during setup: {line:?}")));
                    ready[r] = true;
                    settle.get_or_insert(Instant::now() + Duration::from_millis(100));
                }
                Ok(Event::Eof(r)) => {
                    if !ready[r] {
                        let st = self.ranks[r].reap_until(Instant::now() + Duration::from_millis(200));
                        let how = st.map(|s| describe_status(&s)).unwrap_or_else(|| "closed its stdout".into());
                        problems.push((r, format!("died during setup: {how}")));
                        ready[r] = true;
                        settle.get_or_insert(Instant::now() + Duration::from_millis(100));
                    } else if !problems.iter().chain(&unsupported).any(|(p, _)| *p == r) {
                        problems.push((r, "exited right after reporting ready".into()));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if problems.is_empty() && unsupported.is_empty() && ready.iter().all(|r| *r) {
            return Ok(());
        }
        // Ranks that were still setting up when another rank's problem ended the setup are
        // bystanders: they do not turn a declared gap into a failure.
        let cut_short = !problems.is_empty() || !unsupported.is_empty();
        let mut bystanders = Vec::new();
        for (r, ok) in ready.iter().enumerate() {
            if !ok {
                if cut_short {
                    bystanders.push(r);
                } else {
                    problems.push((r, format!("not ready after {} ms (spawn + rendezvous + setup)", timeout.as_millis())));
                }
            }
        }
        if problems.is_empty() {
            unsupported.sort_by_key(|(r, _)| *r);
            return Err(SetupProblems::Unsupported(unsupported));
        }
        problems.extend(bystanders.into_iter().map(|r| (r, "not ready when the world was torn down".to_string())));
        problems.extend(unsupported.into_iter().map(|(r, why)| (r, format!("setup refused the world as unsupported: {why}"))));
        problems.sort_by_key(|(r, _)| *r);
        Err(SetupProblems::Failed(problems))
    }

    /// A world that sat idle is reusable only if no rank has exited or spoken out of turn.
    fn healthy(&mut self) -> bool {
        let mut ok = true;
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                Event::Msg(_, WorkerMsg::Status { .. }) => {}
                _ => ok = false,
            }
        }
        for r in &mut self.ranks {
            if r.poll_exit().is_some() {
                ok = false;
            }
        }
        ok
    }

    fn unreaped(&self) -> bool {
        self.ranks.iter().any(|r| r.status.is_none())
    }

    fn reap_all_until(&mut self, until: Instant) -> bool {
        let mut all = true;
        for r in &mut self.ranks {
            if r.reap_until(until).is_none() {
                all = false;
            }
        }
        all
    }

    /// Polite start of a teardown: `exit` to every rank and close their stdin (which ends a
    /// worker even when its main thread is stuck).
    fn begin_polite(&mut self) {
        for r in &mut self.ranks {
            let _ = r.send("exit");
            r.stdin = None;
        }
    }

    /// Ends every process (SIGTERM the group, `grace`, SIGKILL), reaps them all, removes the
    /// temp dir and sweeps /dev/shm. `polite_wait`: time to let ranks exit on their own first.
    fn finish(&mut self, polite_wait: Duration, grace: Duration) {
        self.reap_all_until(Instant::now() + polite_wait);
        for sig in [Signal::SIGTERM, Signal::SIGKILL] {
            if !self.unreaped() {
                break;
            }
            // After SIGTERM, SIGCONT: a stopped process keeps SIGTERM pending until it runs again.
            let sigs: &[Signal] = if sig == Signal::SIGTERM { &[Signal::SIGTERM, Signal::SIGCONT] } else { &[Signal::SIGKILL] };
            for &s in sigs {
                let _ = platform::kill_group(self.pgid, s);
                for r in &mut self.ranks {
                    if r.status.is_none() {
                        // Not reaped, so the pid is still ours: safe to signal directly too
                        // (covers a worker that left the process group).
                        let _ = platform::kill_pid(r.pid, s);
                        r.signalled = true;
                    }
                }
            }
            self.reap_all_until(Instant::now() + if sig == Signal::SIGTERM { grace } else { REAP_LIMIT });
        }
        // What the ranks started and left behind (in the group or not), then the files. Evidence
        // of a process outside the group: a rank's stderr still open after the rank has ended
        // (held by a process it started; the reader sees EOF within moments otherwise).
        let until = Instant::now() + PIPE_CHECK;
        let pipes_held = self.ranks.iter().any(|r| {
            r.tail.wait_closed(until);
            !r.tail.is_closed()
        });
        let strays = platform::end_world_leftovers(self.pgid, &self.id, pipes_held);
        if !strays.is_empty() {
            trace(&format!("world {}: killed {} process(es) its ranks left behind: {strays:?}", self.id, strays.len()));
        }
        for r in &mut self.ranks {
            r.stdin = None;
        }
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
        sweep_foreign(&self.id, self.foreign.take().as_ref());
        live_worlds().remove(&self.id);
    }

    fn teardown_polite(mut self, grace: Duration) {
        self.begin_polite();
        self.finish(grace, grace);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Safety net: a world dropped without a teardown (e.g. a panic in the runner) still ends
        // its processes and removes its files.
        if self.unreaped() || self.dir.is_some() {
            self.begin_polite();
            self.finish(Duration::from_millis(200), Duration::from_millis(200));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pool

/// Persistent worlds, shared by many test threads.
pub struct Pool {
    cfg: PoolConfig,
    idle: Mutex<Vec<World>>,
}

/// One rank's progress through one case: the runner's state machine ([`RankState`]) plus what
/// the rank said on the way.
#[derive(Clone)]
struct RankCase {
    state: RankState,
    outcome: Option<Outcome>,
    /// It reported a panic and exits right after: settled only once it has exited.
    exiting: bool,
    /// A protocol problem: garbage on the pipe, an unexpected message, a case it could not be sent.
    protocol: Option<String>,
    /// Its answer to `status` after the runner gave up waiting.
    answer: Option<String>,
    /// When the runner saw its process end without its pipe's EOF (a process it started holds
    /// the pipe open).
    ended_at: Option<Instant>,
    /// Decided as exited without the EOF: its pipe stayed open after [`PIPE_DRAIN`].
    pipe_held: bool,
    /// The CPU its outcome carried (`case_cpu`).
    cpu: Option<RankCpu>,
}

impl RankCase {
    fn new() -> RankCase {
        RankCase {
            state: RankState::Running,
            outcome: None,
            exiting: false,
            protocol: None,
            answer: None,
            ended_at: None,
            pipe_held: false,
            cpu: None,
        }
    }
    /// Nothing more is awaited from this rank.
    fn settled(&self) -> bool {
        match self.state {
            RankState::Reported => !self.exiting,
            s => s.settled(),
        }
    }
    /// The world cannot be kept after this rank's case.
    fn bad(&self) -> bool {
        self.state != RankState::Reported || self.protocol.is_some() || matches!(self.outcome, Some(Outcome::Failed(_)))
    }
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> Pool {
        Pool { cfg, idle: Mutex::new(Vec::new()) }
    }

    /// The process-wide pool, configured by [`PoolConfig::from_env`].
    pub fn global() -> &'static Pool {
        static GLOBAL: OnceLock<Pool> = OnceLock::new();
        GLOBAL.get_or_init(|| Pool::new(PoolConfig::from_env()))
    }

    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    /// Number of idle worlds kept for reuse.
    pub fn idle_worlds(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Tears every idle world down (politely, then by signal) and removes its files.
    pub fn shutdown(&self) {
        let mut worlds: Vec<World> = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        for w in &mut worlds {
            w.begin_polite();
        }
        for mut w in worlds {
            w.finish(self.cfg.grace, self.cfg.grace);
        }
    }

    fn checkout(&self, key: &WorldKey) -> Option<World> {
        loop {
            let w = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                let i = idle.iter().position(|w| &w.key == key)?;
                idle.swap_remove(i)
            };
            let mut w = w;
            if w.healthy() {
                return Some(w);
            }
            w.begin_polite();
            w.finish(Duration::from_millis(50), self.cfg.grace);
        }
    }

    fn checkin(&self, mut w: World) {
        w.last_used = Instant::now();
        let evicted: Vec<World> = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push(w);
            let mut ev = Vec::new();
            while idle.len() > self.cfg.max_idle_worlds {
                let oldest = idle.iter().enumerate().min_by_key(|(_, w)| w.last_used).map(|(i, _)| i).expect("non-empty");
                ev.push(idle.swap_remove(oldest));
            }
            ev
        };
        for w in evicted {
            w.teardown_polite(self.cfg.grace);
        }
    }

    /// Runs one case on every rank of a world with `req.key` and returns the verdict. Thread-safe.
    pub fn run_case(&self, req: CaseRequest<'_>) -> CaseReport {
        let start = Instant::now();
        let thread_cpu = self.cfg.case_cpu.then(platform::thread_cpu_time);
        let key = req.key;
        let fresh = std::cell::Cell::new(true);
        let mk_report = |verdict: Verdict, ranks: Vec<RankReport>, world_id: String| CaseReport {
            case_id: req.case_id.to_string(),
            backend: key.backend.clone(),
            world_size: key.world_size,
            verdict,
            ranks,
            elapsed: start.elapsed(),
            world_id,
            fresh_world: fresh.get(),
            cpu: None,
        };
        if req.case_id.contains('\n') || req.case_id.is_empty() {
            let f = Failure::Protocol { rank: 0, detail: format!("invalid case id {:?}", req.case_id) };
            return mk_report(Verdict::failed(vec![f]), Vec::new(), String::new());
        }

        // 1. A world: reuse an idle healthy one, or spawn and rendezvous a new one.
        let reused = if req.isolated { None } else { self.checkout(key) };
        fresh.set(reused.is_none());
        let mut world = match reused {
            Some(w) => w,
            None => {
                let mut w = match World::spawn(&self.cfg, key) {
                    Ok(w) => w,
                    Err(msg) => {
                        fresh.set(false);
                        let f = Failure::Setup { rank: 0, detail: format!("world setup failed: {msg}") };
                        return mk_report(Verdict::failed(vec![f]), Vec::new(), String::new());
                    }
                };
                if let Err(problems) = w.await_ready(self.cfg.setup_timeout) {
                    fresh.set(false);
                    let marks = vec![0u64; w.ranks.len()];
                    w.begin_polite();
                    w.finish(Duration::from_millis(100), self.cfg.grace);
                    let deadline = Instant::now() + Duration::from_millis(100);
                    let ranks = w
                        .ranks
                        .iter()
                        .map(|r| {
                            r.tail.wait_closed(deadline);
                            let p = problems.ranks().into_iter().find(|pr| *pr == r.rank);
                            RankReport {
                                rank: r.rank,
                                pid: r.pid,
                                outcome: None,
                                state: if p.is_some() { RankState::Exited } else { RankState::Spawning },
                                exit: p.and(r.status.as_ref().map(describe_status)),
                                state_at_deadline: None,
                                stderr_tail: r.tail.since(marks[r.rank]),
                            }
                        })
                        .collect();
                    let verdict = match problems {
                        SetupProblems::Failed(v) => {
                            Verdict::failed(v.into_iter().map(|(rank, detail)| Failure::Setup { rank, detail }).collect())
                        }
                        SetupProblems::Unsupported(v) => Verdict::Unsupported(v.into_iter().next().map(|(_, why)| why).unwrap_or_default()),
                    };
                    let id = w.id.clone();
                    return mk_report(verdict, ranks, id);
                }
                w
            }
        };

        trace(&format!("world {} ready after {:?}", world.id, start.elapsed()));
        // 2. Run the case on every rank.
        let n = world.ranks.len();
        let marks: Vec<u64> = world.ranks.iter().map(|r| r.tail.mark()).collect();
        let mut st = vec![RankCase::new(); n];
        let case_start = Instant::now();
        let deadline_at = case_start + req.deadline;
        let mut settle_at: Option<Instant> = None;
        let grace = self.cfg.grace;
        let settle = self.cfg.settle;
        for (r, rp) in world.ranks.iter_mut().enumerate() {
            if let Err(e) = rp.send(&format!("run {}", req.case_id)) {
                st[r].protocol = Some(format!("could not send the case: {e}"));
                st[r].state = RankState::Exited;
                settle_at.get_or_insert(Instant::now() + settle);
            }
        }
        // The transitions: Running -> Reported (outcome) | Exited (EOF); a panic report is
        // followed by the rank's exit; anything else on the pipe is a protocol failure.
        let handle = |st: &mut Vec<RankCase>, world: &mut World, ev: Event, settle_at: &mut Option<Instant>| match ev {
            // Not the rank's process: a copy of it (fork without exec) ran the case body too.
            Event::Msg(r, WorkerMsg::Outcome { pid, outcome, .. })
                if pid != 0 && world.ranks[r].worker_pid != 0 && pid != world.ranks[r].worker_pid =>
            {
                st[r].protocol = Some(format!(
                    "an outcome ({}) from pid {pid}, not rank {r}'s process (pid {}): a copy of the rank (a fork without exec?) writes to its protocol pipe",
                    outcome.label(),
                    world.ranks[r].worker_pid
                ));
                settle_at.get_or_insert(Instant::now() + settle);
            }
            Event::Msg(r, WorkerMsg::Outcome { case, outcome, exiting, cpu, .. }) if case == req.case_id => {
                st[r].cpu = cpu;
                if outcome.is_failed() {
                    settle_at.get_or_insert(Instant::now() + settle);
                }
                st[r].outcome = Some(outcome);
                st[r].exiting = exiting;
                if st[r].state == RankState::Running || st[r].state == RankState::Terminating {
                    st[r].state = RankState::Reported;
                }
            }
            Event::Msg(r, WorkerMsg::Status { state }) => st[r].answer = Some(state),
            Event::Msg(r, other) => {
                st[r].protocol = Some(format!("unexpected message {other:?}"));
                settle_at.get_or_insert(Instant::now() + settle);
            }
            Event::Garbage(r, line) => {
                st[r].protocol = Some(format!("protocol violation: {line:?}"));
                settle_at.get_or_insert(Instant::now() + settle);
            }
            Event::Eof(r) => {
                st[r].state = RankState::Exited;
                world.ranks[r].reap_until(Instant::now() + Duration::from_millis(200));
                if !(st[r].exiting && st[r].outcome.is_some()) {
                    settle_at.get_or_insert(Instant::now() + settle);
                }
            }
        };
        let mut timed_out = false;
        while !st.iter().all(RankCase::settled) {
            let limit = settle_at.map_or(deadline_at, |s| s.min(deadline_at));
            let now = Instant::now();
            if now >= limit {
                timed_out = now >= deadline_at;
                break;
            }
            match world.events.recv_timeout((limit - now).min(EXIT_POLL)) {
                Ok(ev) => handle(&mut st, &mut world, ev, &mut settle_at),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // A rank that ended while a process it started holds its pipe sends no EOF: its exit
            // status says it ended; its pipe gets `PIPE_DRAIN` to bring the last lines in.
            for r in 0..n {
                if st[r].settled() || st[r].state == RankState::Exited {
                    continue;
                }
                if st[r].ended_at.is_none() && world.ranks[r].poll_exit().is_some() {
                    st[r].ended_at = Some(Instant::now());
                }
                if st[r].ended_at.is_some_and(|t| t.elapsed() >= PIPE_DRAIN) {
                    st[r].pipe_held = true;
                    handle(&mut st, &mut world, Event::Eof(r), &mut settle_at);
                }
            }
        }

        // 3. Ranks still running: Terminating. Ask what they are doing, briefly.
        let pending: Vec<usize> = (0..n).filter(|&r| !st[r].settled()).collect();
        if !pending.is_empty() {
            for &r in &pending {
                st[r].state = RankState::Terminating;
                let _ = world.ranks[r].send("status");
            }
            let until = Instant::now() + STATUS_WAIT;
            while pending.iter().any(|&r| st[r].answer.is_none() && st[r].state != RankState::Exited) {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                match world.events.recv_timeout(until - now) {
                    Ok(ev) => handle(&mut st, &mut world, ev, &mut settle_at),
                    Err(_) => break,
                }
            }
            // A stopped process answers nothing (and a SIGTERM it handles waits for a SIGCONT).
            for &r in &pending {
                if st[r].answer.is_none() && matches!(platform::process_state(world.ranks[r].pid), Some('T' | 't')) {
                    st[r].answer = Some("no answer to the status request: the process is stopped (SIGSTOP / SIGTSTP, or a tracer)".into());
                }
            }
        }

        trace(&format!("case {} collected after {:?}", req.case_id, start.elapsed()));
        // 4. Keep or tear down.
        let keep = !st.iter().any(RankCase::bad) && !req.isolated;
        let killed_by_runner = st.iter().any(|s| s.state == RankState::Terminating);
        if !keep {
            if killed_by_runner {
                // Spec order: SIGTERM the group, grace, SIGKILL (stdin stays open until reaped,
                // so the workers' EOF watchdog does not pre-empt the signals).
                world.finish(Duration::ZERO, grace);
            } else {
                world.begin_polite();
                world.finish(grace, grace);
            }
        }

        trace(&format!("teardown done after {:?}", start.elapsed()));
        // 5. Reports and verdict: one typed failure per thing that went wrong, blamed on its rank.
        let tail_deadline = Instant::now() + Duration::from_millis(100);
        let mut failures: Vec<Failure> = Vec::new();
        // Ranks that reported, then crashed in the polite teardown after the case.
        let mut teardown_crashes: Vec<Failure> = Vec::new();
        let mut ranks = Vec::with_capacity(n);
        let deadline_ms = req.deadline.as_millis() as u64;
        for (r, s) in st.iter().enumerate() {
            let rp = &world.ranks[r];
            let died_on_own = s.state == RankState::Exited;
            if died_on_own || !keep {
                rp.tail.wait_closed(tail_deadline);
            }
            // Reported, then ended on its own with a failure status in the teardown after the case.
            let died_after_report = s.state == RankState::Reported && !rp.signalled && rp.status.is_some_and(|st| !st.success());
            let exit = if died_on_own {
                let how =
                    rp.status.as_ref().map(describe_status).unwrap_or_else(|| "closed its protocol pipe (exit status unknown)".into());
                Some(if s.pipe_held { format!("{how}; its pipes stayed open in a process it started") } else { how })
            } else if died_after_report {
                rp.status.as_ref().map(|st| format!("{} in the teardown after the case", describe_status(st)))
            } else if s.state == RankState::Terminating {
                rp.status.as_ref().map(|st| match st.signal() {
                    Some(15) => "terminated by the runner (SIGTERM)".to_string(),
                    Some(9) => format!("killed by the runner (SIGKILL after {} ms of grace)", grace.as_millis()),
                    _ => format!("ended during teardown: {}", describe_status(st)),
                })
            } else {
                None
            };
            let state_at_deadline =
                (s.state == RankState::Terminating).then(|| s.answer.clone().unwrap_or_else(|| "no answer to the status request".into()));
            let exit_text = exit.clone().unwrap_or_default();
            match (&s.outcome, s.state) {
                (Some(Outcome::Failed(m)), RankState::Exited) if s.exiting => {
                    failures.push(Failure::Panicked { rank: r, message: m.clone(), exit: exit_text })
                }
                (Some(Outcome::Failed(m)), st) => {
                    failures.push(Failure::Reported { rank: r, message: m.clone() });
                    if st == RankState::Exited {
                        failures.push(Failure::Crashed { rank: r, exit: exit_text, reported: Some("failed".into()) });
                    }
                }
                // Reported a pass, announced its exit, and exited 0: a deliberate death.
                (Some(_), RankState::Exited) if s.exiting && rp.status.is_some_and(|st| st.success()) => {}
                (Some(o), RankState::Exited) => {
                    failures.push(Failure::Crashed { rank: r, exit: exit_text, reported: Some(o.label().into()) })
                }
                (Some(o), RankState::Reported) if died_after_report => {
                    teardown_crashes.push(Failure::Crashed { rank: r, exit: exit_text, reported: Some(o.label().into()) })
                }
                (None, RankState::Exited) if s.protocol.is_none() => {
                    failures.push(Failure::Crashed { rank: r, exit: exit_text, reported: None })
                }
                (None, RankState::Exited) => failures.push(Failure::Crashed {
                    rank: r,
                    exit: format!("{exit_text} ({})", s.protocol.clone().unwrap_or_default()),
                    reported: None,
                }),
                (None, RankState::Terminating) => failures.push(Failure::TimedOut {
                    rank: r,
                    deadline_ms,
                    abandoned: !timed_out,
                    state: state_at_deadline.clone().unwrap_or_default(),
                }),
                _ => {}
            }
            if let Some(p) = &s.protocol {
                if s.state != RankState::Exited {
                    failures.push(Failure::Protocol { rank: r, detail: p.clone() });
                }
            }
            ranks.push(RankReport {
                rank: r,
                pid: rp.pid,
                outcome: s.outcome.clone(),
                state: s.state,
                exit,
                state_at_deadline,
                stderr_tail: rp.tail.since(marks[r]),
            });
        }
        // A teardown crash fails a case that nothing else failed (never "passed" over a crash);
        // after a failure it is only shown on its rank's line (peers of a failed rank may well
        // crash on their way out: they are not the culprits).
        if failures.is_empty() {
            failures = teardown_crashes;
        }
        let verdict = if !failures.is_empty() {
            Verdict::failed(failures)
        } else {
            let outs: Vec<(usize, Outcome)> = st.iter().enumerate().filter_map(|(r, s)| s.outcome.clone().map(|o| (r, o))).collect();
            Verdict::fold(&outs)
        };
        let id = world.id.clone();
        let spawn_cpu = world.ready_cpu.take().unwrap_or_default();
        if keep {
            self.checkin(world);
        } else {
            drop(world);
        }
        let mut report = mk_report(verdict, ranks, id);
        if let Some(t0) = thread_cpu {
            let reported = st.iter().filter_map(|s| s.cpu);
            report.cpu = Some(CaseCpu {
                ranks_body: reported.clone().map(|c| Duration::from_nanos(c.body_ns)).sum(),
                ranks_since: reported.clone().map(|c| Duration::from_nanos(c.since_ns)).sum(),
                spawn: spawn_cpu,
                runner: platform::thread_cpu_time().saturating_sub(t0),
                ranks: reported.count(),
            });
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_bytes_since_mark() {
        let t = Tail::default();
        t.push(b"old stuff\n");
        let m = t.mark();
        t.push(b"new\n");
        assert_eq!(t.since(m), "new\n");
        let big = vec![b'x'; TAIL_CAP + 100];
        t.push(&big);
        assert_eq!(t.since(0).len(), TAIL_CAP);
    }

    #[test]
    fn worker_tunables_add_huge_pages_and_keep_the_inherited_ones() {
        assert_eq!(worker_tunables(None), "glibc.malloc.hugetlb=1");
        assert_eq!(worker_tunables(Some("")), "glibc.malloc.hugetlb=1");
        assert_eq!(worker_tunables(Some("glibc.malloc.mxfast=0")), "glibc.malloc.mxfast=0:glibc.malloc.hugetlb=1");
        assert_eq!(worker_tunables(Some("glibc.malloc.hugetlb=0")), "glibc.malloc.hugetlb=0");
    }

    #[test]
    fn status_descriptions() {
        assert_eq!(describe_status(&ExitStatus::from_raw(3 << 8)), "exit code 3");
        assert_eq!(describe_status(&ExitStatus::from_raw(11)), "killed by signal SIGSEGV");
    }
}
