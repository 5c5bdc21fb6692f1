//! Externally launched ranks: this process is ONE rank of a world that torchrun, mpirun or srun
//! started ([`crate::config::Launch`]); there is no parent runner. The ranks meet on a TCP store
//! (rank 0 serves it, or torchrun's agent does) and walk the same list of *steps* (a backend's
//! gate, its init, each case) in the same order:
//!
//! 1. every rank runs the step's body under a watchdog and posts its record
//!    (`out/<step>/<rank>`: outcome, whether it is about to exit);
//! 2. rank 0 gathers every record, naming a rank whose heartbeat stopped
//!    ([`SILENT_RANK_DEAD`]: died) or that posted nothing by the step deadline (hung), folds them
//!    into one [`Verdict`] and posts it with a [`Decision`] (`verdict/<step>`); as the runner
//!    does, a rank whose failure came more than the settle time (the grace) after another rank's
//!    failed only because of it (it waited for a rank that had left the op): it is a bystander
//!    (`TimedOut { abandoned }`), listed after the culprit;
//! 3. every rank reads that verdict: continue, re-initialise the backend (after a failure, as the
//!    runner would tear a world down), or abort (a rank died or hung: every rank exits non-zero).
//!
//! Every rank publishes a heartbeat (`hb/<rank>`: its progress state and the tail of its stderr)
//! every [`HEARTBEAT_PERIOD`]; rank 0 quotes it when it names a dead or hung rank. A rank whose
//! step outlives its deadline (plus grace) is ended by its own watchdog, which first posts a
//! timed-out record; a rank that cannot reach the store, or gets no verdict from rank 0 in time,
//! exits non-zero naming rank 0. Nothing waits without a deadline.

use crate::config::{Config, Launch, HEARTBEAT_PERIOD, SILENT_RANK_DEAD};
use crate::outcome::Outcome;
use crate::platform::{self, StderrTail};
use crate::verdict::{Failure, Verdict};
use concord_store::{StoreAddr, StoreError, TcpServer, TcpStore};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of stderr each rank keeps (and rank 0 quotes) per rank.
const TAIL_BYTES: usize = 2048;
/// Most stderr lines quoted per rank in a failure message.
const TAIL_LINES: usize = 12;

/// What every rank does after a step, as rank 0 decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Decision {
    Continue,
    /// A case failed: drop the backend and initialise it again before the next case.
    Reinit,
    /// A rank died, hung or is exiting: every rank stops and exits non-zero.
    Abort(String),
}

/// One step's result, the same on every rank.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepResult {
    pub verdict: Verdict,
    /// Every failing rank's failure and stderr tail (empty unless failed).
    pub message: String,
    pub decision: Decision,
    /// Rank 0's time for the step (its body and the gather).
    pub elapsed_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Record {
    outcome: Outcome,
    /// The rank ends its process right after posting (its watchdog fired).
    exiting: bool,
    /// How long the step's body ran on this rank (from its own start of the step): a failure
    /// reported more than the settle time (the grace) after the first one is a bystander's.
    elapsed_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct Beat {
    n: u64,
    host: String,
    pid: u32,
    state: String,
    tail: String,
}

struct Watch {
    /// (step, label, when the step started, when the watchdog fires).
    armed: Option<(u64, String, Instant, Instant)>,
    stop: bool,
}

/// This process as one rank of an externally launched world.
pub struct Rank {
    pub launch: Launch,
    store: Arc<TcpStore>,
    base: StoreAddr,
    server: Option<TcpServer>,
    tail: Option<StderrTail>,
    step: u64,
    grace: Duration,
    setup_timeout: Duration,
    hb_stop: Arc<AtomicBool>,
    hb: Option<std::thread::JoinHandle<()>>,
    watch: Arc<(Mutex<Watch>, Condvar)>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "?".into())
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Rank {
    /// Joins the launcher's world: captures stderr, serves the store (rank 0, unless torchrun's
    /// agent does), connects, starts the heartbeat and the watchdog, and passes the start
    /// barrier (every rank, within the setup timeout).
    pub fn join(launch: &Launch, cfg: &Config) -> Result<Rank, String> {
        let me = launch.rank;
        let tail = platform::tee_stderr(TAIL_BYTES).ok();
        let server = if launch.serve_store {
            Some(TcpServer::bind(launch.store_port).map_err(|e| format!("rank 0: cannot serve the rendezvous store: {e}"))?)
        } else {
            None
        };
        let base =
            StoreAddr::Tcp { host: launch.store_host.clone(), port: launch.store_port, prefix: format!("concord/{}", launch.run_id) };
        let connect = || -> Result<TcpStore, String> {
            let StoreAddr::Tcp { host, port, prefix } = &base else { unreachable!("a TCP address") };
            TcpStore::connect(host, *port, prefix, cfg.setup_timeout)
                .map_err(|e| format!("rank {me}: cannot reach the rendezvous store: {e}"))
        };
        let store = Arc::new(connect()?);
        let hb_store = connect()?;
        let watch_store = connect()?;
        let host = hostname();
        store.set(&format!("pid/{me}"), format!("{host} {}", std::process::id()).as_bytes()).map_err(|e| format!("rank {me}: {e}"))?;

        // Heartbeat: progress state + stderr tail. A store that went away ends this rank.
        let hb_stop = Arc::new(AtomicBool::new(false));
        let hb = {
            let stop = hb_stop.clone();
            let tail = tail.clone();
            let host = host.clone();
            std::thread::Builder::new()
                .name("concord-heartbeat".into())
                .spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let beat = Beat {
                            n,
                            host: host.clone(),
                            pid: std::process::id(),
                            state: concord_core::progress::describe(),
                            tail: tail.as_ref().map(|t| t.text()).unwrap_or_default(),
                        };
                        let v = serde_json::to_vec(&beat).expect("a heartbeat serialises");
                        if let Err(e) = hb_store.set(&format!("hb/{me}"), &v) {
                            if stop.load(Ordering::SeqCst) {
                                return;
                            }
                            let msg = format!(
                                "concord rank {me}: the rendezvous store is gone ({e}); rank 0 died or the network failed: exiting\n"
                            );
                            match &tail {
                                Some(t) => t.write_direct(&msg),
                                None => eprint!("{msg}"),
                            }
                            platform::exit_now(1);
                        }
                        std::thread::sleep(HEARTBEAT_PERIOD);
                    }
                })
                .map_err(|e| format!("rank {me}: spawn the heartbeat: {e}"))?
        };

        // Watchdog: a step that outlives its deadline posts a timed-out record, then ends us.
        let watch = Arc::new((Mutex::new(Watch { armed: None, stop: false }), Condvar::new()));
        let watchdog = {
            let watch = watch.clone();
            let tail = tail.clone();
            std::thread::Builder::new()
                .name("concord-watchdog".into())
                .spawn(move || {
                    let (m, cv) = &*watch;
                    let mut w = m.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        if w.stop {
                            return;
                        }
                        match w.armed.clone() {
                            None => w = cv.wait(w).unwrap_or_else(|e| e.into_inner()),
                            Some((step, label, started, at)) => {
                                let now = Instant::now();
                                if now < at {
                                    w = cv.wait_timeout(w, at - now).unwrap_or_else(|e| e.into_inner()).0;
                                    continue;
                                }
                                let state = concord_core::progress::describe();
                                let msg =
                                    format!("rank {me}: {label} did not finish by its deadline (+ grace); state: {state}; this rank exits");
                                let rec = Record {
                                    outcome: Outcome::Failed(msg.clone()),
                                    exiting: true,
                                    elapsed_ms: started.elapsed().as_millis() as u64,
                                };
                                let _ = watch_store.set(&format!("out/{step}/{me}"), &serde_json::to_vec(&rec).expect("serialises"));
                                let line = format!("concord {msg}\n");
                                match &tail {
                                    Some(t) => t.write_direct(&line),
                                    None => eprint!("{line}"),
                                }
                                platform::exit_now(1);
                            }
                        }
                    }
                })
                .map_err(|e| format!("rank {me}: spawn the watchdog: {e}"))?
        };

        let mut rank = Rank {
            launch: launch.clone(),
            store,
            base,
            server,
            tail,
            step: 0,
            grace: cfg.grace,
            setup_timeout: cfg.setup_timeout,
            hb_stop,
            hb: Some(hb),
            watch,
            watchdog: Some(watchdog),
        };
        if let Err(e) = rank.store.barrier("start", launch.world_size, cfg.setup_timeout) {
            let missing: Vec<String> = (0..launch.world_size)
                .filter(|r| !rank.store.check(&[&format!("pid/{r}")]).unwrap_or(false))
                .map(|r| r.to_string())
                .collect();
            rank.stop_threads();
            return Err(format!(
                "rank {me}: the {} ranks did not all start within {} ms (missing: rank(s) {}): {e}",
                launch.world_size,
                cfg.setup_timeout.as_millis(),
                missing.join(", ")
            ));
        }
        Ok(rank)
    }

    pub fn rank(&self) -> usize {
        self.launch.rank
    }

    pub fn world_size(&self) -> usize {
        self.launch.world_size
    }

    /// The store address of the whole run (`tcp://host:port/concord/<run id>`); a world's
    /// backend gets a sub-prefix of it.
    pub fn base_addr(&self) -> &StoreAddr {
        &self.base
    }

    /// The setup timeout (deadline of gates and backend inits).
    pub fn setup_timeout(&self) -> Duration {
        self.setup_timeout
    }

    fn arm(&self, label: &str, deadline: Duration) {
        let (m, cv) = &*self.watch;
        m.lock().unwrap_or_else(|e| e.into_inner()).armed = {
            let now = Instant::now();
            Some((self.step, label.to_string(), now, now + deadline + self.grace))
        };
        cv.notify_all();
    }

    fn disarm(&self) {
        let (m, cv) = &*self.watch;
        m.lock().unwrap_or_else(|e| e.into_inner()).armed = None;
        cv.notify_all();
    }

    /// Runs one step on every rank (see the module docs): `body` on this rank under the
    /// watchdog, then the gather on rank 0 and the common verdict. `Err` is this rank's own
    /// failure to take part (store unreachable, no verdict from rank 0): the caller exits
    /// non-zero with it.
    pub fn step(&mut self, label: &str, deadline: Duration, body: impl FnOnce() -> Outcome) -> Result<StepResult, String> {
        self.step += 1;
        let step = self.step;
        let me = self.rank();
        let t0 = Instant::now();
        self.arm(label, deadline);
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            Ok(o) => o,
            Err(p) => {
                let m = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
                Outcome::Failed(format!("rank {me} panicked: {m}"))
            }
        };
        self.disarm();
        let rec = Record { outcome, exiting: false, elapsed_ms: t0.elapsed().as_millis() as u64 };
        let err = |e: StoreError| format!("rank {me}: step {label}: {e}");
        self.store.set(&format!("out/{step}/{me}"), &serde_json::to_vec(&rec).expect("serialises")).map_err(err)?;
        let vkey = format!("verdict/{step}");
        if me == 0 {
            let result = self.gather(step, label, deadline, t0)?;
            self.store.set(&vkey, &serde_json::to_vec(&result).expect("serialises")).map_err(err)?;
            return Ok(result);
        }
        // Rank 0 may still run the body (deadline), then gathers (deadline + grace + silence).
        let patience = deadline + self.grace * 3 + SILENT_RANK_DEAD * 2 + Duration::from_secs(2);
        match self.store.wait(&[&vkey], patience) {
            Ok(()) => {}
            Err(StoreError::Timeout { .. }) => {
                let beat = self.beat(0).map(|b| format!("; rank 0's last heartbeat: {}", b.state)).unwrap_or_default();
                return Err(format!(
                    "rank {me}: no verdict from rank 0 for {label} within {} ms (rank 0 died or hung){beat}",
                    patience.as_millis()
                ));
            }
            Err(e) => return Err(err(e)),
        }
        let v = self.store.get(&vkey).map_err(err)?;
        serde_json::from_slice(&v).map_err(|e| format!("rank {me}: rank 0's verdict for {label} is unreadable: {e}"))
    }

    fn beat(&self, r: usize) -> Option<Beat> {
        let k = format!("hb/{r}");
        if !self.store.check(&[&k]).ok()? {
            return None;
        }
        serde_json::from_slice(&self.store.get(&k).ok()?).ok()
    }

    /// Rank 0: every rank's record for `step`, or a named failure for each rank that died or
    /// hung, folded into one verdict.
    fn gather(&self, step: u64, label: &str, deadline: Duration, t0: Instant) -> Result<StepResult, String> {
        let n = self.world_size();
        let end = t0 + deadline + self.grace * 2 + Duration::from_secs(1);
        let keys: Vec<String> = (0..n).map(|r| format!("out/{step}/{r}")).collect();
        let mut records: Vec<Option<Record>> = vec![None; n];
        let mut dead: Vec<Option<Beat>> = vec![None; n];
        // Per rank: the last heartbeat counter seen and when it last changed (rank 0's clock).
        let mut seen: Vec<(u64, Instant)> = vec![(0, Instant::now()); n];
        let mut last_beat: Vec<Option<Beat>> = vec![None; n];
        loop {
            for r in 0..n {
                if records[r].is_none() && dead[r].is_none() && self.store.check(&[&keys[r]]).map_err(|e| e.to_string())? {
                    let v = self.store.get(&keys[r]).map_err(|e| e.to_string())?;
                    records[r] = Some(serde_json::from_slice(&v).map_err(|e| format!("rank {r}'s record for {label} is unreadable: {e}"))?);
                }
            }
            let missing: Vec<usize> = (0..n).filter(|&r| records[r].is_none() && dead[r].is_none()).collect();
            if missing.is_empty() {
                break;
            }
            let now = Instant::now();
            for &r in &missing {
                let b = self.beat(r);
                let cnt = b.as_ref().map(|b| b.n).unwrap_or(0);
                if cnt != seen[r].0 {
                    seen[r] = (cnt, now);
                }
                if b.is_some() {
                    last_beat[r] = b;
                }
                if now.duration_since(seen[r].1) >= SILENT_RANK_DEAD {
                    dead[r] = Some(last_beat[r].clone().unwrap_or_default());
                }
            }
            if now >= end {
                break;
            }
            let still: Vec<&str> = (0..n).filter(|&r| records[r].is_none() && dead[r].is_none()).map(|r| keys[r].as_str()).collect();
            if still.is_empty() {
                continue;
            }
            let slice = (end - now).min(HEARTBEAT_PERIOD * 2);
            match self.store.wait(&still, slice) {
                Ok(()) | Err(StoreError::Timeout { .. }) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let mut failures = Vec::new();
        let mut tails = Vec::new();
        let mut abort = None;
        let quote = |r: usize, b: &Option<Beat>| -> String {
            match b {
                Some(b) if !b.tail.trim().is_empty() => {
                    format!("--- rank {r} stderr tail ({} pid {}) ---\n{}", b.host, b.pid, last_lines(&b.tail, TAIL_LINES))
                }
                _ => String::new(),
            }
        };
        // The runner's settle rule (`PoolConfig::settle`): once a rank failed, the others get the
        // grace to report; a rank whose failure came later only failed because of it (its peers
        // waited for a rank that had left the op: a timeout, an abort) and is a bystander,
        // `TimedOut { abandoned }` as the runner would have abandoned it, listed after the culprit.
        // A rank whose own watchdog ended it (`exiting`: it hung past its deadline) is never a
        // bystander: it reports late because it is the rank that hung.
        let first_failure = records
            .iter()
            .enumerate()
            .filter_map(|(r, rec)| rec.as_ref().filter(|x| matches!(x.outcome, Outcome::Failed(_))).map(|x| (x.elapsed_ms, r)))
            .min();
        for r in 0..n {
            let b = if r == 0 { None } else { last_beat[r].clone().or_else(|| self.beat(r)) };
            match (&records[r], &dead[r]) {
                (Some(rec), _) => {
                    if let Outcome::Failed(m) = &rec.outcome {
                        match first_failure {
                            Some((t, culprit)) if !rec.exiting && rec.elapsed_ms > t + self.grace.as_millis() as u64 => {
                                failures.push(Failure::TimedOut {
                                    rank: r,
                                    deadline_ms: deadline.as_millis() as u64,
                                    abandoned: true,
                                    state: format!(
                                        "it reported {} ms after rank {culprit} failed (settle {} ms): {m}",
                                        rec.elapsed_ms - t,
                                        self.grace.as_millis()
                                    ),
                                });
                            }
                            _ => {
                                failures.push(Failure::Reported { rank: r, message: m.clone() });
                                let own = if r == 0 { self.tail.as_ref().map(|t| t.text()) } else { self.beat(r).map(|b| b.tail) };
                                if let Some(t) = own.filter(|t| !t.trim().is_empty()) {
                                    tails.push(format!("--- rank {r} stderr tail ---\n{}", last_lines(&t, TAIL_LINES)));
                                }
                            }
                        }
                    }
                    if rec.exiting {
                        abort.get_or_insert(format!("rank {r} ended its process in {label}"));
                    }
                }
                (None, Some(beat)) => {
                    let where_ = if beat.host.is_empty() { String::new() } else { format!(" on {} (pid {})", beat.host, beat.pid) };
                    failures.push(Failure::Crashed {
                        rank: r,
                        exit: format!(
                            "its heartbeat stopped for {} ms{where_}: the process died (last state: {})",
                            SILENT_RANK_DEAD.as_millis(),
                            if beat.state.is_empty() { "unknown" } else { &beat.state }
                        ),
                        reported: None,
                    });
                    tails.push(quote(r, &b));
                    abort.get_or_insert(format!("rank {r} died in {label}"));
                }
                (None, None) => {
                    let state = b.as_ref().map(|b| b.state.clone()).unwrap_or_else(|| "no heartbeat".into());
                    failures.push(Failure::TimedOut { rank: r, deadline_ms: deadline.as_millis() as u64, abandoned: false, state });
                    tails.push(quote(r, &b));
                    abort.get_or_insert(format!("rank {r} hung in {label}"));
                }
            }
        }
        tails.retain(|t| !t.is_empty());
        // Culprits first: a rank that died or hung before the ranks that reported its absence,
        // and the bystanders last (each group in rank order: a stable sort).
        failures.sort_by_key(|f| (f.is_bystander(), matches!(f, Failure::Reported { .. })));
        let outcomes: Vec<&Outcome> = records.iter().flatten().map(|r| &r.outcome).collect();
        let verdict = if !failures.is_empty() {
            Verdict::Failed(failures)
        } else if let Some(o) = outcomes.iter().find(|o| matches!(o, Outcome::Unsupported(_))) {
            Verdict::Unsupported(o.detail().to_string())
        } else if let Some(o) = outcomes.iter().find(|o| matches!(o, Outcome::Skipped(_))) {
            Verdict::Skipped(o.detail().to_string())
        } else {
            Verdict::Passed
        };
        let message = match &verdict {
            Verdict::Failed(f) => {
                let mut lines: Vec<String> = f.iter().map(|f| f.to_string()).collect();
                lines.extend(tails);
                lines.join("\n")
            }
            _ => String::new(),
        };
        let decision = match (abort, &verdict) {
            (Some(why), _) => Decision::Abort(why),
            (None, Verdict::Failed(_)) => Decision::Reinit,
            _ => Decision::Continue,
        };
        Ok(StepResult { verdict, message, decision, elapsed_ms: t0.elapsed().as_millis() as u64 })
    }

    fn stop_threads(&mut self) {
        self.hb_stop.store(true, Ordering::SeqCst);
        {
            let (m, cv) = &*self.watch;
            m.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
            cv.notify_all();
        }
        if let Some(h) = self.hb.take() {
            let _ = h.join();
        }
        if let Some(h) = self.watchdog.take() {
            let _ = h.join();
        }
    }

    /// Leaves the world: stops the heartbeat, says goodbye; rank 0 keeps serving the store until
    /// every rank said goodbye (or the grace passed), so no rank loses its store early. Flushes
    /// stderr. Returns `code` for the caller to exit with.
    pub fn finish(mut self, code: i32) -> i32 {
        self.stop_threads();
        let me = self.rank();
        let _ = self.store.set(&format!("done/{me}"), b"1");
        if self.server.is_some() {
            let keys: Vec<String> = (0..self.world_size()).map(|r| format!("done/{r}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let _ = self.store.wait(&refs, self.grace * 2 + Duration::from_secs(2));
        }
        if let Some(t) = &self.tail {
            t.flush(Duration::from_millis(200));
        }
        drop(self.server.take());
        code
    }

    /// Ends this rank at once after a failure of its own (`message`), exiting non-zero.
    pub fn fail(mut self, message: &str) -> ! {
        eprintln!("concord rank {}: {message}", self.rank());
        if let Some(t) = &self.tail {
            t.flush(Duration::from_millis(200));
        }
        self.hb_stop.store(true, Ordering::SeqCst);
        drop(self.server.take());
        platform::exit_now(1)
    }
}
