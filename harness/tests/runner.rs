//! Runner tests. This binary (`harness = false`) is its own worker: when the runner re-executes
//! it with `CONCORD_WORKER=1`, `main` serves scripted cases whose behaviour is chosen by the case
//! id (`panic1`: rank 1 panics, `hang1`: rank 1 hangs in a fake all_reduce #12, ...). Otherwise
//! `main` runs the tests through libtest-mimic.
//!
//! Every test checks, after its cases, that no process of the run is alive and that nothing of
//! the run is left in the temp dir or /dev/shm.

use concord_harness::outcome::Outcome;
use concord_harness::platform::{list_prefixed, pid_alive, pid_running, shm_prefix};
use concord_harness::runner::{CaseReport, CaseRequest, Pool, PoolConfig, WorldKey};
use concord_harness::verdict::{Failure, Verdict};
use concord_harness::worker::{serve, SetupError, WorkerEnv};
use concord_store::FileStore;
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::Path;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// Worker side

struct WState {
    env: WorkerEnv,
}

/// Set by the `dropabort` case: the rank's state aborts when dropped (a backend whose teardown
/// crashes after every case passed).
static ABORT_ON_DROP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Drop for WState {
    fn drop(&mut self) {
        if ABORT_ON_DROP.load(std::sync::atomic::Ordering::SeqCst) {
            std::process::abort();
        }
    }
}

/// A helper process of the backend (`sleep 1000`), inheriting the rank's stdin and stderr and
/// its environment; `new_session`: it daemonises (setsid), leaving the world's process group.
fn spawn_helper(new_session: bool) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("1000");
    if new_session {
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
    }
    cmd.spawn().expect("spawn the helper process")
}

fn worker_setup(env: &WorkerEnv) -> Result<WState, SetupError> {
    // A shared-memory name the worker never removes: the runner's sweep must.
    let shm = Path::new("/dev/shm").join(format!("{}rank{}", shm_prefix(&env.world_id), env.rank));
    std::fs::write(&shm, b"x").map_err(|e| format!("cannot create {}: {e}", shm.display()))?;
    match env.option("setup") {
        Some("fail") if env.rank == 1 => return Err(SetupError::Failed("told to fail setup".into())),
        Some("unsupported") if env.rank == 1 => return Err(SetupError::Unsupported("worlds of 3 are not supported".into())),
        Some("abort") if env.rank == 0 => std::process::abort(),
        // A rank slow to start: its setup outlasts the setup deadline.
        Some("hang") if env.rank == 1 => std::thread::sleep(Duration::from_secs(1000)),
        _ => {}
    }
    Ok(WState { env: env.clone() })
}

fn worker_case(s: &mut WState, case: &str) -> Outcome {
    let rank = s.env.rank;
    // `<name><r>` targets rank r only.
    let target = case.chars().last().and_then(|c| c.to_digit(10)).map(|d| d as usize);
    let me = target == Some(rank);
    let name = case.trim_end_matches(|c: char| c.is_ascii_digit());
    match name {
        "pass" | "pids" => Outcome::Passed,
        // 30 ms of this rank's own CPU (whatever the load), for `CONCORD_CASE_CPU`'s measure.
        "burn" => {
            let t0 = concord_harness::platform::thread_cpu_time();
            while concord_harness::platform::thread_cpu_time() - t0 < Duration::from_millis(30) {
                std::hint::black_box(0u64);
            }
            Outcome::Passed
        }
        "fail" if me => Outcome::Failed("wrong value at index 3".into()),
        "panic" if me => panic!("boom from rank {rank}"),
        "abort" if me => std::process::abort(),
        "sigkill" if me => {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            unreachable!("SIGKILL cannot be survived")
        }
        "exit" if me => std::process::exit(3),
        "hang" | "hangterm" if me => {
            if name == "hangterm" {
                // SAFETY: setting a signal disposition to ignore.
                unsafe { nix::sys::signal::signal(nix::sys::signal::SIGTERM, nix::sys::signal::SigHandler::SigIgn) }.unwrap();
            }
            concord_core::progress::begin("test", "all_reduce", 12);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        "skip" if me => Outcome::Skipped("needs 2 GPUs, found 0".into()),
        "unsupported" => Outcome::Unsupported("bitwise ops on f32".into()),
        "println" => {
            println!("{{ not json, printed by rank {rank}");
            Outcome::Passed
        }
        "noisy" if me => {
            for i in 0..2000 {
                eprintln!("noise line {i:05} ..........................................");
            }
            Outcome::Failed("noisy rank failed".into())
        }
        "use_after_free" if me => {
            // A backend that reads a host tensor it has freed. A 64 MiB block is above glibc's
            // largest mmap threshold: it is its own mapping, unmapped when freed, so the read
            // must crash the worker as it would crash the user's process (the workers' allocator
            // settings must not turn the bug into a read of reused memory).
            let v = vec![7u8; 64 << 20];
            let p = v.as_ptr();
            drop(v);
            // SAFETY: none; this is the bug under test (a read of freed memory). The worker is
            // expected to die of SIGSEGV here.
            let x = unsafe { std::ptr::read_volatile(p.add(32 << 20)) };
            Outcome::Failed(format!("read {x} from a freed 64 MiB host tensor without crashing"))
        }
        "adds" => adds(&s.env),
        // --- Process-level misbehaviour (hunt 14) ---
        // A helper process (same process group) outlives the rank.
        "spawnpass" if me => {
            std::mem::forget(spawn_helper(false));
            Outcome::Passed
        }
        "spawnfail" if me => {
            std::mem::forget(spawn_helper(false));
            Outcome::Failed("failed after starting a helper".into())
        }
        // A daemonised helper (its own session): the world's process group does not hold it.
        "setsidspawn" if me => {
            std::mem::forget(spawn_helper(true));
            Outcome::Failed("failed after starting a daemon".into())
        }
        // fork() without exec: the copy holds every pipe of the rank; the rank then exits 3.
        "forkexit" if me => {
            // SAFETY: the child only calls async-signal-safe functions (sleep, _exit).
            match unsafe { libc::fork() } {
                0 => unsafe {
                    libc::sleep(1000);
                    libc::_exit(0)
                },
                _ => std::process::exit(3),
            }
        }
        // fork() whose child falls through into the rest of the case (a failed exec that does not
        // _exit): the copy reports a pass first, the real rank then fails.
        "forkreport" if me => {
            // SAFETY: this is the bug under test; the child returns into the worker's loop (its
            // copy then blocks forever on the command channel whose sender has no thread).
            match unsafe { libc::fork() } {
                0 => Outcome::Passed,
                _ => {
                    std::thread::sleep(Duration::from_millis(200));
                    Outcome::Failed("the real rank 1 failed".into())
                }
            }
        }
        // Leaves the world's process group and hangs.
        "setsidhang" if me => {
            nix::unistd::setsid().expect("setsid");
            concord_core::progress::begin("test", "all_reduce", 12);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Forges a passing outcome on stdout, then exits 0 mid-case.
        "forged" if me => {
            println!(r#"{{"Outcome":{{"case":"forged1","outcome":"Passed","exiting":true}}}}"#);
            std::process::exit(0)
        }
        // Stops itself (SIGSTOP); `sigstopterm`: with a SIGTERM handler that does nothing.
        "sigstop" | "sigstopterm" if me => {
            if name == "sigstopterm" {
                extern "C" fn ignore(_: libc::c_int) {}
                // SAFETY: installing a handler that does nothing.
                unsafe { libc::signal(libc::SIGTERM, ignore as *const () as libc::sighandler_t) };
            }
            concord_core::progress::begin("test", "all_reduce", 12);
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Passes, then crashes in its teardown (the state's Drop aborts).
        "dropabort" if me => {
            ABORT_ON_DROP.store(true, std::sync::atomic::Ordering::SeqCst);
            Outcome::Passed
        }
        // Takes its time (the runner's next command meanwhile meets a replaced stdin).
        "slow" if me => {
            std::thread::sleep(Duration::from_millis(500));
            Outcome::Passed
        }
        // Rank 1 passes, then crashes in its teardown; rank 0 failed the case first.
        "dropabortpeerfail" if me => {
            ABORT_ON_DROP.store(true, std::sync::atomic::Ordering::SeqCst);
            Outcome::Passed
        }
        "dropabortpeerfail" => Outcome::Failed("rank 0 failed first".into()),
        // Closes every fd above stderr (a library that "daemonises"): the protocol channel too.
        "closefds" if me => {
            for fd in 3..1024 {
                // SAFETY: closing fds; this is the bug under test.
                unsafe { libc::close(fd) };
            }
            Outcome::Passed
        }
        // Points fd 0 at /dev/null: the runner's commands no longer arrive.
        "nullstdin" if me => {
            // The worker's stdin thread is back in its read of the old pipe by then (it then
            // reads /dev/null after the runner's next line); if it is not, it reads /dev/null's
            // EOF at once, while this case still sleeps.
            std::thread::sleep(Duration::from_millis(200));
            let null = std::fs::File::open("/dev/null").unwrap();
            nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            Outcome::Passed
        }
        // Leaves files of its world in the temp dir and /dev/shm, then dies.
        "tmpfiles" if me => {
            let prefix = shm_prefix(&s.env.world_id);
            std::fs::write(std::env::temp_dir().join(format!("{prefix}r{rank}-sock")), b"x").unwrap();
            std::fs::write(Path::new("/dev/shm").join(format!("{prefix}r{rank}-extra")), b"x").unwrap();
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            unreachable!("SIGKILL cannot be survived")
        }
        // Every rank makes a file of the backend's own library in /dev/shm (a name Concord does
        // not choose, like NCCL's `nccl-XXXXXX`) and keeps it open; the target rank is then
        // killed mid-case, before it could unlink it.
        "foreignshm" => {
            let pfx = s.env.option("foreign").unwrap_or("concordtest-foreign-").to_string();
            let f = std::fs::File::create(Path::new("/dev/shm").join(format!("{pfx}r{rank}"))).unwrap();
            std::mem::forget(f);
            if me {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
                unreachable!("SIGKILL cannot be survived")
            }
            Outcome::Passed
        }
        // One 1 MiB stderr line without a newline.
        "hugeline" if me => {
            eprint!("{}", "x".repeat(1 << 20));
            Outcome::Failed("failed after a 1 MiB stderr line".into())
        }
        _ => Outcome::Passed,
    }
}

/// Every rank adds 1 to one counter 1,000 times; rank 0 checks that the values handed out are
/// exactly 1..=1000·ws (no lost or duplicated update).
fn adds(env: &WorkerEnv) -> Outcome {
    let t = Duration::from_secs(20);
    let store = match FileStore::open(&env.store_path, env.world_size, t) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let mut got = Vec::with_capacity(1000);
    for _ in 0..1000 {
        match store.add("adds/ctr", 1) {
            Ok(v) => got.push(v),
            Err(e) => return Outcome::Failed(e.to_string()),
        }
    }
    if got.windows(2).any(|w| w[0] >= w[1]) {
        return Outcome::Failed("add results not increasing".into());
    }
    let list = got.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    if let Err(e) = store.set(&format!("adds/vals/{}", env.rank), list.as_bytes()) {
        return Outcome::Failed(e.to_string());
    }
    if let Err(e) = store.barrier("adds", env.world_size, t) {
        return Outcome::Failed(e.to_string());
    }
    if env.rank != 0 {
        return Outcome::Passed;
    }
    let mut all = Vec::new();
    for r in 0..env.world_size {
        let v = match store.get(&format!("adds/vals/{r}")) {
            Ok(v) => v,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        all.extend(String::from_utf8_lossy(&v).split(',').map(|x| x.parse::<i64>().unwrap_or(-1)));
    }
    all.sort();
    let want: Vec<i64> = (1..=(1000 * env.world_size) as i64).collect();
    if all != want {
        return Outcome::Failed(format!(
            "lost or duplicated updates: {} values, first bad at {:?}",
            all.len(),
            all.iter().zip(&want).position(|(a, b)| a != b)
        ));
    }
    match store.get("adds/ctr") {
        Ok(v) if v == want.len().to_string().as_bytes() => Outcome::Passed,
        Ok(v) => Outcome::Failed(format!("final counter {}", String::from_utf8_lossy(&v))),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

// ------------------------------------------------------------------------------------------
// Parent side helpers

fn pool(max_idle: usize) -> Pool {
    let mut cfg = PoolConfig::from_env();
    cfg.grace = Duration::from_millis(300);
    cfg.setup_timeout = Duration::from_secs(20);
    cfg.max_idle_worlds = max_idle;
    Pool::new(cfg)
}

fn key(ws: usize) -> WorldKey {
    WorldKey::new("script", ws, vec![])
}

fn run(p: &Pool, k: &WorldKey, case: &str) -> CaseReport {
    run_with(p, k, case, Duration::from_secs(20), false)
}

fn run_with(p: &Pool, k: &WorldKey, case: &str, deadline: Duration, isolated: bool) -> CaseReport {
    p.run_case(CaseRequest { key: k, case_id: case, deadline, isolated })
}

fn pids(r: &CaseReport) -> Vec<u32> {
    r.ranks.iter().map(|r| r.pid).collect()
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failed::from(format!("{} (at line {}): {}", stringify!($cond), line!(), format!($($fmt)+))));
        }
    };
}

/// Every live (not zombie) process whose environment names world `world_id` (the ranks and
/// whatever they started: helpers, forked copies, daemons in their own session). Read from
/// /proc here, independently of the runner's own sweep.
fn world_procs(world_id: &str) -> Vec<u32> {
    let needle = format!("CONCORD_WORLD_ID={world_id}\0");
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                && pid_running(pid)
        })
        .collect()
}

/// No process of world `world_id` is left (within 3 s); leftovers are killed, then named.
fn assert_no_world_procs(world_id: &str) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left = world_procs(world_id);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        left = world_procs(world_id);
    }
    for &pid in &left {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
    }
    check!(left.is_empty(), "processes of world {world_id} outlived it (orphans, now killed by the test): {left:?}");
    Ok(())
}

/// No process of these reports is alive; nothing of their worlds is left on disk or in shm.
fn assert_clean(reports: &[&CaseReport]) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(3);
    for r in reports {
        for rank in &r.ranks {
            while pid_alive(rank.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            check!(!pid_alive(rank.pid), "rank {} (pid {}) of world {} still alive", rank.rank, rank.pid, r.world_id);
        }
        if r.world_id.is_empty() {
            continue;
        }
        assert_no_world_procs(&r.world_id)?;
        let prefix = shm_prefix(&r.world_id);
        let tmp = list_prefixed(&std::env::temp_dir(), &prefix);
        check!(tmp.is_empty(), "left in temp dir: {tmp:?}");
        let shm = list_prefixed(Path::new("/dev/shm"), &prefix);
        check!(shm.is_empty(), "left in /dev/shm: {shm:?}");
    }
    Ok(())
}

fn expect_failed(r: &CaseReport, needles: &[&str]) -> Result<String, Failed> {
    let Verdict::Failed(_) = &r.verdict else {
        return Err(format!("expected a failure, got {:?}\n{}", r.verdict, r.failure_message()).into());
    };
    let msg = r.failure_message();
    for n in needles {
        check!(msg.contains(n), "verdict lacks {n:?}:\n{msg}");
    }
    Ok(msg)
}

/// Snapshots a failure message (insta), with what changes from run to run (pids, world ids,
/// milliseconds, stderr tails of panics) redacted ([`redact`]), so a change of wording is reviewed.
fn snapshot(name: &str, r: &CaseReport) {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    settings.bind(|| insta::assert_snapshot!(name, redact(&r.failure_message())));
}

/// One piece of a [`redact`] pattern.
#[derive(Clone, Copy)]
enum Tok {
    Lit(&'static str),
    /// One or more ASCII digits.
    Digits,
    /// One or more lowercase hex digits.
    Hex,
}

/// The length of the match of `pat` at the start of `s`, if it matches there.
fn match_at(s: &str, pat: &[Tok]) -> Option<usize> {
    let mut at = 0;
    for t in pat {
        let rest = &s[at..];
        at += match t {
            Tok::Lit(l) => rest.starts_with(l).then_some(l.len())?,
            Tok::Digits => Some(rest.bytes().take_while(u8::is_ascii_digit).count()).filter(|n| *n > 0)?,
            Tok::Hex => Some(rest.bytes().take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)).count()).filter(|n| *n > 0)?,
        };
    }
    Some(at)
}

/// What changes from run to run, replaced by placeholders: `pid N`, world ids `pNnHEXwNxHEX`,
/// `after N ms`, `(test, N ms)`; and the stderr-tail lines (`    | ...`) dropped. (Plain code
/// instead of insta's regex filters: the `regex` crate was most of this test's build.)
fn redact(msg: &str) -> String {
    use Tok::*;
    let rules: [(&[Tok], &str); 4] = [
        (&[Lit("pid "), Digits], "pid [PID]"),
        (&[Lit("world p"), Digits, Lit("n"), Hex, Lit("w"), Digits, Lit("x"), Hex], "world [WORLD]"),
        (&[Lit("after "), Digits, Lit(" ms")], "after [N] ms"),
        (&[Lit("(test, "), Digits, Lit(" ms)")], "(test, [N] ms)"),
    ];
    let mut s: String = msg.split_inclusive('\n').filter(|l| !(l.starts_with("    | ") && l.ends_with('\n'))).collect();
    for (pat, with) in rules {
        let mut out = String::with_capacity(s.len());
        let mut i = 0;
        while i < s.len() {
            match match_at(&s[i..], pat) {
                Some(n) => {
                    out.push_str(with);
                    i += n;
                }
                None => {
                    let c = s[i..].chars().next().expect("in bounds");
                    out.push(c);
                    i += c.len_utf8();
                }
            }
        }
        s = out;
    }
    s
}

/// The verdict's typed failures, as (rank, kind) pairs in the verdict's order.
fn blamed(r: &CaseReport) -> Vec<(usize, &'static str)> {
    r.verdict.failures().iter().map(|f| (f.rank(), f.kind())).collect()
}

// ------------------------------------------------------------------------------------------
// Tests

fn t_redact() -> Result<(), Failed> {
    let raw =
        "rank 1 (pid 4242) in world p17n0a0b0cw3x1f9a failed after 250 ms (test, 12 ms)\n    | a stderr tail\nlast pid x\n    | kept: no newline";
    let want = "rank 1 (pid [PID]) in world [WORLD] failed after [N] ms (test, [N] ms)\nlast pid x\n    | kept: no newline";
    let got = redact(raw);
    check!(got == want, "redact gave:\n{got}");
    check!(redact("world p1n0aw2xZZ after ms") == "world p1n0aw2xZZ after ms", "a partial match is left alone");
    Ok(())
}

fn t_pass(ws: usize) -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(ws), "pass");
    check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    check!(r.ranks.len() == ws, "{} rank reports", r.ranks.len());
    check!(r.ranks.iter().all(|x| x.outcome == Some(Outcome::Passed) && x.exit.is_none()), "{:?}", r.ranks);
    check!(p.idle_worlds() == 1, "world kept for reuse");
    p.shutdown();
    assert_clean(&[&r])
}

/// `PoolConfig::case_cpu` (`CONCORD_CASE_CPU=1`): every rank's CPU for the case and up to
/// `Ready` comes back in the report, the spawn only with the world's first case; off, nothing.
fn t_case_cpu() -> Result<(), Failed> {
    let ws = 3;
    let p = Pool::new(PoolConfig { case_cpu: true, ..pool(2).config().clone() });
    let first = run(&p, &key(ws), "burn");
    check!(first.verdict == Verdict::Passed, "{}", first.failure_message());
    let c = first.cpu.ok_or_else(|| Failed::from("no cpu measured with case_cpu on"))?;
    check!(c.ranks == ws, "{c:?}");
    check!(c.ranks_body >= Duration::from_millis(30 * ws as u64), "every rank burned 30 ms: {c:?}");
    check!(c.ranks_since >= c.ranks_body, "{c:?}");
    check!(c.spawn > Duration::ZERO, "a fresh world's ranks spent CPU up to Ready: {c:?}");
    let second = run(&p, &key(ws), "pass");
    let c2 = second.cpu.ok_or_else(|| Failed::from("no cpu measured for the second case"))?;
    check!(c2.spawn == Duration::ZERO && c2.ranks == ws, "a reused world has no spawn: {c2:?}");
    check!(c2.ranks_body < Duration::from_millis(30 * ws as u64), "the burn is not counted twice: {c2:?}");
    p.shutdown();
    let off = pool(2);
    let r = run(&off, &key(ws), "pass");
    check!(r.cpu.is_none() || PoolConfig::from_env().case_cpu, "measured with case_cpu off: {:?}", r.cpu);
    off.shutdown();
    assert_clean(&[&first, &second, &r])
}

fn t_failed_outcome() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(3), "fail1");
    expect_failed(&r, &["rank 1: wrong value at index 3"])?;
    check!(blamed(&r) == vec![(1, "reported")], "only rank 1 is blamed: {:?}", r.verdict);
    snapshot("failed_outcome", &r);
    check!(p.idle_worlds() == 0, "world torn down after failure");
    assert_clean(&[&r])
}

fn t_panic() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "panic1");
    expect_failed(&r, &["rank 1 panicked: boom from rank 1", "exit code 101"])?;
    check!(blamed(&r) == vec![(1, "panicked")], "{:?}", r.verdict);
    snapshot("panic", &r);
    check!(r.ranks[0].outcome == Some(Outcome::Passed), "rank 0 passed: {:?}", r.ranks[0]);
    check!(r.ranks[1].stderr_tail.contains("boom from rank 1"), "panic message in stderr tail: {:?}", r.ranks[1].stderr_tail);
    check!(r.failure_message().contains("--- rank 1"), "{}", r.failure_message());
    assert_clean(&[&r])
}

fn t_crash(case: &str, cause: &str) -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), case);
    expect_failed(&r, &[&format!("rank 1 crashed: {cause}")])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    snapshot(&format!("crash_{case}"), &r);
    check!(r.ranks[1].outcome.is_none(), "{:?}", r.ranks[1]);
    check!(r.ranks[1].exit.as_deref().unwrap_or("").starts_with(cause), "{:?}", r.ranks[1].exit);
    check!(r.ranks[0].outcome == Some(Outcome::Passed), "rank 0 passed: {:?}", r.ranks[0]);
    check!(p.idle_worlds() == 0, "world torn down");
    assert_clean(&[&r])
}

fn t_use_after_free_crashes() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "use_after_free1");
    expect_failed(&r, &["rank 1 crashed: killed by signal SIGSEGV"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    check!(r.ranks[0].outcome == Some(Outcome::Passed), "rank 0 passed: {:?}", r.ranks[0]);
    assert_clean(&[&r])
}

fn t_hang(case: &str, exit: &str) -> Result<(), Failed> {
    let p = pool(2);
    let deadline = Duration::from_millis(700);
    let r = run_with(&p, &key(2), case, deadline, false);
    expect_failed(&r, &["rank 1: no outcome within the 700 ms deadline", "state: in all_reduce #12 (test"])?;
    check!(matches!(r.verdict.failures(), [Failure::TimedOut { rank: 1, abandoned: false, .. }]), "{:?}", r.verdict);
    snapshot(&format!("hang_{case}"), &r);
    let st = r.ranks[1].state_at_deadline.clone().unwrap_or_default();
    check!(st.starts_with("in all_reduce #12 (test,"), "state {st:?}");
    check!(r.ranks[1].exit.as_deref().unwrap_or("").starts_with(exit), "exit {:?}", r.ranks[1].exit);
    check!(r.ranks[0].state_at_deadline.is_none(), "rank 0 finished: {:?}", r.ranks[0]);
    let limit = deadline + Duration::from_millis(200) + 2 * p.config().grace + Duration::from_millis(800);
    check!(r.elapsed < limit, "took {:?} (limit {limit:?})", r.elapsed);
    assert_clean(&[&r])
}

fn t_skip_propagates_and_keeps_world() -> Result<(), Failed> {
    let p = pool(2);
    let k = key(3);
    let a = run(&p, &k, "skip0");
    check!(a.verdict == Verdict::Skipped("needs 2 GPUs, found 0".into()), "{:?}", a.verdict);
    let b = run(&p, &k, "pass");
    check!(b.verdict == Verdict::Passed, "{}", b.failure_message());
    check!(pids(&a) == pids(&b), "skip keeps the world: {:?} vs {:?}", pids(&a), pids(&b));
    p.shutdown();
    assert_clean(&[&a, &b])
}

fn t_unsupported() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "unsupported");
    check!(r.verdict == Verdict::Unsupported("bitwise ops on f32".into()), "{:?}", r.verdict);
    p.shutdown();
    assert_clean(&[&r])
}

fn t_reuse_and_isolation() -> Result<(), Failed> {
    let p = pool(2);
    let k = key(3);
    let a = run(&p, &k, "pids");
    let b = run(&p, &k, "pids");
    check!(a.verdict == Verdict::Passed && b.verdict == Verdict::Passed, "{:?} {:?}", a.verdict, b.verdict);
    check!(pids(&a) == pids(&b) && a.world_id == b.world_id, "same world reused");
    let c = run_with(&p, &k, "pids", Duration::from_secs(20), true);
    check!(c.verdict == Verdict::Passed, "{}", c.failure_message());
    check!(c.world_id != a.world_id && pids(&c).iter().all(|x| !pids(&a).contains(x)), "isolated case gets a fresh world");
    assert_clean(&[&c])?;
    check!(pids(&a).iter().all(|&x| pid_alive(x)), "the shared world is untouched by the isolated case");
    p.shutdown();
    assert_clean(&[&a])
}

fn t_rebuild_after_failure() -> Result<(), Failed> {
    let p = pool(2);
    let k = key(2);
    let a = run(&p, &k, "pass");
    let f = run(&p, &k, "fail0");
    check!(pids(&a) == pids(&f), "failure ran in the reused world");
    expect_failed(&f, &["rank 0: wrong value"])?;
    assert_clean(&[&a])?;
    let b = run(&p, &k, "pass");
    check!(b.verdict == Verdict::Passed, "{}", b.failure_message());
    check!(b.world_id != a.world_id && pids(&b) != pids(&a), "rebuilt after failure");
    p.shutdown();
    assert_clean(&[&b])
}

fn t_setup_failure() -> Result<(), Failed> {
    let p = pool(2);
    let k = WorldKey::new("script", 3, vec![("setup".into(), "fail".into())]);
    let r = run(&p, &k, "pass");
    expect_failed(&r, &["world setup failed", "rank 1: setup failed: told to fail setup"])?;
    check!(r.verdict.failures().iter().all(|f| f.kind() == "setup") && r.verdict.failing_ranks().contains(&1), "{:?}", r.verdict);
    snapshot("setup_failure", &r);
    let k2 = WorldKey::new("script", 2, vec![("setup".into(), "abort".into())]);
    let r2 = run(&p, &k2, "pass");
    expect_failed(&r2, &["world setup failed", "rank 0: died during setup: killed by signal SIGABRT"])?;
    let k3 = WorldKey::new("script", 3, vec![("setup".into(), "unsupported".into())]);
    let r3 = run(&p, &k3, "pass");
    check!(
        r3.verdict == Verdict::Unsupported("worlds of 3 are not supported".into()),
        "a declared gap at setup is UNSUPPORTED: {:?}",
        r3.verdict
    );
    check!(p.idle_worlds() == 0, "nothing kept");
    assert_clean(&[&r, &r2, &r3])
}

fn t_stdout_cannot_corrupt_protocol() -> Result<(), Failed> {
    let p = pool(2);
    let k = key(2);
    let r = run(&p, &k, "println");
    check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    let again = run(&p, &k, "pass");
    check!(again.verdict == Verdict::Passed && pids(&again) == pids(&r), "protocol still in sync in the kept world");
    // Isolated: the report is built after teardown, so the whole stderr is in.
    let r = run_with(&p, &k, "println", Duration::from_secs(20), true);
    check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    check!(r.ranks[1].stderr_tail.contains("not json, printed by rank 1"), "println went to stderr: {:?}", r.ranks[1].stderr_tail);
    p.shutdown();
    assert_clean(&[&r, &again])
}

fn t_stderr_tail_bounded() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "noisy1");
    expect_failed(&r, &["rank 1: noisy rank failed"])?;
    let tail = &r.ranks[1].stderr_tail;
    check!(tail.len() <= 4096 && tail.len() > 3000, "tail of {} bytes", tail.len());
    check!(tail.contains("noise line 01999"), "tail keeps the end");
    assert_clean(&[&r])
}

fn t_eight_ranks_thousand_adds() -> Result<(), Failed> {
    let p = pool(0);
    let r = run_with(&p, &key(8), "adds", Duration::from_secs(60), true);
    check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    assert_clean(&[&r])
}

fn t_lru_eviction() -> Result<(), Failed> {
    let p = pool(1);
    let a = run(&p, &key(2), "pass");
    let b = run(&p, &key(3), "pass");
    check!(a.verdict == Verdict::Passed && b.verdict == Verdict::Passed, "{:?} {:?}", a.verdict, b.verdict);
    check!(p.idle_worlds() == 1, "bounded to 1 idle world");
    assert_clean(&[&a])?; // evicted
    p.shutdown();
    assert_clean(&[&b])
}

fn t_concurrent_callers() -> Result<(), Failed> {
    let p = pool(4);
    let reports: Vec<CaseReport> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|i| {
                let p = &p;
                s.spawn(move || (0..3).map(|_| run(p, &key(2 + i % 2), "pass")).collect::<Vec<_>>())
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    for r in &reports {
        check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    }
    p.shutdown();
    assert_clean(&reports.iter().collect::<Vec<_>>())
}

/// A parent that dies (SIGKILL, no cleanup) takes its workers with it.
fn t_parent_death_kills_workers() -> Result<(), Failed> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .env("CONCORD_TEST_ROLE", "doomed_parent")
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.starts_with("WORLD ")).ok_or_else(|| format!("no WORLD line: {text:?} {:?}", out.status))?;
    let mut words = line.split_whitespace().skip(1);
    let world_id = words.next().unwrap_or_default().to_string();
    let worker_pids: Vec<u32> = words.map(|w| w.parse().unwrap()).collect();
    check!(worker_pids.len() == 2, "{line}");
    // Orphans are reaped by init, which may take its time here: a zombie counts as dead.
    let deadline = Instant::now() + Duration::from_secs(3);
    while worker_pids.iter().any(|&x| pid_running(x)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The dead parent could not remove its world's files; clean them up for it.
    concord_harness::platform::sweep_dir(&std::env::temp_dir(), &shm_prefix(&world_id));
    concord_harness::platform::sweep_shm(&world_id);
    check!(worker_pids.iter().all(|&x| !pid_running(x)), "workers {worker_pids:?} outlived their parent");
    Ok(())
}

/// Kills and reaps a helper process when dropped, so a test that fails early leaves nothing
/// running (the `terminated_parent` helper otherwise sleeps forever).
struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A parent terminated by SIGTERM (nextest's timeout, ^C) kills its worlds and removes their
/// files itself before exiting.
fn t_parent_sigterm_cleans_up() -> Result<(), Failed> {
    sigterm_parent_cleans_up("terminated_parent", "workers")
}

/// Starts this test binary as a parent of role `role` (it prints `WORLD <id> <pid>...` for a
/// world of 2 ranks, then waits), SIGTERMs it, and checks that it exited 143, that the ranks
/// (`what`) ended within 3 s and that the world's files are gone.
fn sigterm_parent_cleans_up(role: &str, what: &str) -> Result<(), Failed> {
    let mut child = KillOnDrop(
        std::process::Command::new(std::env::current_exe()?)
            .env("CONCORD_TEST_ROLE", role)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()?,
    );
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line)?;
    let mut words = line.split_whitespace().skip(1);
    let world_id = words.next().unwrap_or_default().to_string();
    let pids: Vec<u32> = words.map(|w| w.parse().unwrap()).collect();
    check!(pids.len() == 2, "{line}");
    check!(!list_prefixed(&std::env::temp_dir(), &shm_prefix(&world_id)).is_empty(), "the live world has no temp dir");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.0.id() as i32), nix::sys::signal::Signal::SIGTERM)?;
    let status = child.0.wait()?;
    check!(status.code() == Some(128 + 15), "parent exit status {status:?}, expected 143");
    let deadline = Instant::now() + Duration::from_secs(3);
    while pids.iter().any(|&x| pid_running(x)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    check!(pids.iter().all(|&x| !pid_running(x)), "{what} {pids:?} outlived their SIGTERMed parent");
    let left_tmp = list_prefixed(&std::env::temp_dir(), &shm_prefix(&world_id));
    let left_shm = list_prefixed(std::path::Path::new("/dev/shm"), &shm_prefix(&world_id));
    check!(left_tmp.is_empty() && left_shm.is_empty(), "left behind: {left_tmp:?} {left_shm:?}");
    Ok(())
}

fn terminated_parent() -> ! {
    let p = pool(2);
    let r = run(&p, &key(2), "pass");
    println!("WORLD {} {}", r.world_id, pids(&r).iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn doomed_parent() -> ! {
    let p = pool(2);
    let r = run(&p, &key(2), "pass");
    println!("WORLD {} {}", r.world_id, pids(&r).iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
    unreachable!()
}

/// A launched rank (`concord_harness::launch`): its behaviour is `LAUNCH_ROLE`, rank 1 only.
fn launched_rank(world: &concord_core::WorldInfo) -> ! {
    let role = std::env::var("CONCORD_TEST_LAUNCH_ROLE").unwrap_or_default();
    let store = FileStore::open(&world.store_path, world.world_size, Duration::from_secs(10)).unwrap_or_else(|e| {
        eprintln!("rank {}: {e}", world.rank);
        std::process::exit(1)
    });
    if world.rank == 1 {
        match role.as_str() {
            "fail" => std::process::exit(3),
            "hang" => std::thread::sleep(Duration::from_secs(600)),
            "outer" => {
                // A launched world is not part of the job its launcher runs in.
                let inherited: Vec<String> =
                    std::env::vars().map(|(k, _)| k).filter(|k| concord_harness::launch::outer_launcher_var(k)).collect();
                if !inherited.is_empty() {
                    eprintln!("rank 1 inherited {inherited:?}");
                    std::process::exit(5)
                }
            }
            "leavegroup" => {
                // Out of the world's process group: only a signal to its pid reaches it.
                // SAFETY: plain syscall on this process.
                unsafe { libc::setpgid(0, 0) };
                std::thread::sleep(Duration::from_secs(600))
            }
            _ => {}
        }
    }
    // Everyone else waits for every peer: a failed or hung rank 1 leaves them waiting.
    match store.barrier("launched/done", world.world_size, Duration::from_secs(30)) {
        Ok(()) => std::process::exit(0),
        Err(_) => std::process::exit(4),
    }
}

fn launch_world(role: &str, ranks: usize) -> concord_harness::launch::Launched {
    let mut spec = concord_harness::launch::LaunchSpec::current_exe(ranks, "test").unwrap();
    spec.args.clear();
    spec.rank0_stdout = false;
    spec.grace = Duration::from_millis(300);
    spec.env = vec![("CONCORD_TEST_LAUNCH_ROLE".into(), role.into())];
    concord_harness::launch::launch(&spec).unwrap()
}

fn launch_leaves_nothing(world_id: &str, pids: &[u32]) -> Result<(), Failed> {
    check!(pids.iter().all(|p| !pid_alive(*p)), "a launched rank outlived its world");
    let left_tmp = list_prefixed(&std::env::temp_dir(), &shm_prefix(world_id));
    check!(left_tmp.is_empty(), "left in the temp dir: {left_tmp:?}");
    Ok(())
}

fn t_launch_ok() -> Result<(), Failed> {
    let w = launch_world("ok", 3);
    let (id, pids) = (w.world_id.clone(), w.pids());
    let r = w.wait(Duration::from_secs(20));
    check!(r.check().is_ok(), "{:?}", r.check());
    launch_leaves_nothing(&id, &pids)
}

/// A world launched from a rank of an outer launcher's job (mpirun: `OMPI_*`, PMIx) does not
/// inherit that job's identity (an Open MPI child would abort in `MPI_Init`).
fn t_launch_children_drop_the_outer_launchers_identity() -> Result<(), Failed> {
    // A variable only this test sets (the other tests' ranks never look at it).
    std::env::set_var("OMPI_CONCORD_TEST_OUTER", "1");
    let w = launch_world("outer", 2);
    let (id, pids) = (w.world_id.clone(), w.pids());
    let r = w.wait(Duration::from_secs(20));
    check!(r.check().is_ok(), "{:?}", r.check());
    launch_leaves_nothing(&id, &pids)
}

fn t_launch_failed_rank_is_named_and_ends_the_world() -> Result<(), Failed> {
    let w = launch_world("fail", 3);
    let (id, pids) = (w.world_id.clone(), w.pids());
    let r = w.wait(Duration::from_secs(20));
    let msg = r.check().expect_err("rank 1 exited 3");
    check!(msg.contains("rank 1 (pid") && msg.contains("exit code 3"), "{msg}");
    // Its peers were ended soon after, not left to their 30 s barrier.
    check!(r.elapsed < Duration::from_secs(5), "took {:?}", r.elapsed);
    check!(r.ranks[0].ended_by_launcher && r.ranks[2].ended_by_launcher, "{:?}", r.ranks);
    launch_leaves_nothing(&id, &pids)
}

/// The launcher's teardown signals every unreaped rank by its pid too, as the runner's does: a
/// rank that left the group ends at SIGTERM within the grace (it was left to the stray sweep,
/// after a 10 s reap wait, and reported as never reaped).
fn t_launch_rank_outside_the_group_gets_sigterm() -> Result<(), Failed> {
    let w = launch_world("leavegroup", 2);
    let (id, pids) = (w.world_id.clone(), w.pids());
    let r = w.wait(Duration::from_millis(800));
    let msg = r.check().expect_err("rank 1 hangs");
    check!(msg.contains("rank 1") && msg.contains("still running at the deadline; killed by signal SIGTERM"), "{msg}");
    check!(r.elapsed < Duration::from_secs(4), "took {:?}", r.elapsed);
    launch_leaves_nothing(&id, &pids)
}

/// A parent ended by SIGTERM while a launched world runs kills its ranks and removes its files
/// (the launched world is one of the runner's live worlds).
fn t_launch_parent_sigterm_cleans_up() -> Result<(), Failed> {
    sigterm_parent_cleans_up("launch_terminated_parent", "launched ranks")
}

/// A process whose stderr goes through the tee ([`concord_harness::platform::tee_stderr`]) writes
/// a block that fills its real stderr (a pipe nobody reads yet), then its last line, flushes and
/// ends at once (`_exit`, as `Rank::fail` does). The last line must come out: the copier thread
/// may hold it (read from the tee's pipe, not yet written) while the pipe is already empty.
fn tee_child() -> ! {
    let tail = concord_harness::platform::tee_stderr(8192).unwrap();
    let fill = std::env::var("CONCORD_TEST_TEE_FILL").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(65536);
    let mut block = vec![b'x'; fill];
    block.push(b'\n');
    use std::io::Write;
    std::io::stderr().write_all(&block).unwrap();
    eprintln!("concord rank 1: THE LAST LINE (failure text and rerun hint)");
    let t0 = Instant::now();
    tail.flush(Duration::from_secs(5));
    // The parent reads only after 150 ms: a flush that returned well before that did not wait
    // for the copier (said on stdout, which is not the tee).
    println!("flushed after {} ms", t0.elapsed().as_millis());
    concord_harness::platform::exit_now(0)
}

fn t_stderr_tee_flush_keeps_the_last_line() -> Result<(), Failed> {
    for fill in [65536usize, 65536 + 4096 - 64, 65536 - 30] {
        let mut child = KillOnDrop(
            std::process::Command::new(std::env::current_exe()?)
                .env("CONCORD_TEST_ROLE", "tee_child")
                .env("CONCORD_TEST_TEE_FILL", fill.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?,
        );
        std::thread::sleep(Duration::from_millis(150));
        let mut err = Vec::new();
        let mut out = String::new();
        use std::io::Read;
        child.0.stderr.take().unwrap().read_to_end(&mut err)?;
        child.0.stdout.take().unwrap().read_to_string(&mut out)?;
        let status = child.0.wait()?;
        check!(status.success(), "tee child: {status:?}");
        let text = String::from_utf8_lossy(&err);
        check!(
            text.ends_with("concord rank 1: THE LAST LINE (failure text and rerun hint)\n"),
            "fill {fill}: the last line was lost ({} bytes of stderr came out, ending {:?}); {out}",
            err.len(),
            &text[text.len().saturating_sub(80)..]
        );
    }
    Ok(())
}

fn launch_terminated_parent() -> ! {
    let w = launch_world("hang", 2);
    // The world's dir exists once launch returns; the ranks are alive (rank 1 sleeps, rank 0
    // waits for it at the barrier).
    println!("WORLD {} {}", w.world_id, w.pids().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn t_launch_deadline_ends_a_hung_rank() -> Result<(), Failed> {
    let w = launch_world("hang", 2);
    let (id, pids) = (w.world_id.clone(), w.pids());
    let r = w.wait(Duration::from_millis(800));
    let msg = r.check().expect_err("rank 1 hangs");
    check!(msg.contains("rank 1") && msg.contains("still running at the deadline"), "{msg}");
    check!(r.elapsed < Duration::from_secs(3), "took {:?}", r.elapsed);
    launch_leaves_nothing(&id, &pids)
}

// ------------------------------------------------------------------------------------------
// Process-level misbehaviour (hunt 14): each case body above misbehaves on rank 1; each test
// asserts the verdict, the rank named, a time bound and that nothing of the world is left
// (processes found by their environment, files by prefix).

/// `r` took less than `limit`.
fn within(r: &CaseReport, limit: Duration) -> Result<(), Failed> {
    check!(r.elapsed < limit, "took {:?} (limit {limit:?})", r.elapsed);
    Ok(())
}

fn t_helper_of_failing_rank_is_killed() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "spawnfail1");
    expect_failed(&r, &["rank 1: failed after starting a helper"])?;
    check!(blamed(&r) == vec![(1, "reported")], "{:?}", r.verdict);
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_helper_of_kept_world_is_killed_at_shutdown() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "spawnpass1");
    check!(r.verdict == Verdict::Passed, "{}", r.failure_message());
    check!(p.idle_worlds() == 1, "world kept");
    let t = Instant::now();
    p.shutdown();
    check!(t.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t.elapsed());
    assert_clean(&[&r])
}

fn t_daemonised_helper_is_killed() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "setsidspawn1");
    expect_failed(&r, &["rank 1: failed after starting a daemon"])?;
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_forked_copy_does_not_hide_a_crash() -> Result<(), Failed> {
    let p = pool(2);
    let r = run_with(&p, &key(2), "forkexit1", Duration::from_secs(8), false);
    expect_failed(&r, &["rank 1 crashed: exit code 3"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    within(&r, Duration::from_secs(4))?;
    assert_clean(&[&r])
}

fn t_forked_copy_reporting_first_is_a_protocol_failure() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "forkreport1");
    let msg = expect_failed(&r, &["rank 1: the real rank 1 failed"])?;
    check!(msg.contains("not rank 1's process"), "the forked copy's report is named:\n{msg}");
    check!(r.verdict.failing_ranks() == vec![1], "{:?}", r.verdict);
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_rank_outside_the_group_gets_sigterm() -> Result<(), Failed> {
    let p = pool(2);
    let r = run_with(&p, &key(2), "setsidhang1", Duration::from_millis(1000), false);
    expect_failed(&r, &["rank 1: no outcome within the 1000 ms deadline", "state: in all_reduce #12 (test"])?;
    check!(blamed(&r) == vec![(1, "timed_out")], "{:?}", r.verdict);
    let exit = r.ranks[1].exit.clone().unwrap_or_default();
    check!(exit.starts_with("terminated by the runner (SIGTERM)"), "exit {exit:?}");
    within(&r, Duration::from_millis(1000 + 200 + 600 + 2000))?;
    assert_clean(&[&r])
}

fn t_forged_pass_then_exit_zero_is_a_crash() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "forged1");
    expect_failed(&r, &["rank 1 crashed: exit code 0 before reporting an outcome"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    check!(r.ranks[1].outcome.is_none(), "the forged line is no outcome: {:?}", r.ranks[1]);
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_stopped_rank(case: &str, exit: &str) -> Result<(), Failed> {
    let p = pool(2);
    let r = run_with(&p, &key(2), case, Duration::from_millis(1000), false);
    expect_failed(&r, &["rank 1: no outcome within the 1000 ms deadline"])?;
    check!(blamed(&r) == vec![(1, "timed_out")], "{:?}", r.verdict);
    let st = r.ranks[1].state_at_deadline.clone().unwrap_or_default();
    check!(st.contains("stopped"), "the state says the rank is stopped: {st:?}");
    let got = r.ranks[1].exit.clone().unwrap_or_default();
    check!(got.starts_with(exit), "exit {got:?}");
    within(&r, Duration::from_millis(1000 + 200 + 600 + 2000))?;
    assert_clean(&[&r])
}

fn t_crash_at_teardown_fails_the_case() -> Result<(), Failed> {
    let p = pool(2);
    let r = run_with(&p, &key(2), "dropabort1", Duration::from_secs(20), true);
    expect_failed(&r, &["rank 1 reported passed but then died: killed by signal SIGABRT"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_crash_at_teardown_after_a_failure_is_shown_not_blamed() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "dropabortpeerfail1");
    let msg = expect_failed(&r, &["rank 0: rank 0 failed first", "killed by signal SIGABRT in the teardown after the case"])?;
    check!(blamed(&r) == vec![(0, "reported")], "the culprit alone is blamed: {:?}\n{msg}", r.verdict);
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_closed_protocol_fd_is_explained() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "closefds1");
    expect_failed(&r, &["rank 1 crashed"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    let tail = &r.ranks[1].stderr_tail;
    check!(tail.contains("cannot write to the runner's protocol channel"), "the rank says why it ended: {tail:?}");
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&r])
}

fn t_replaced_stdin_is_explained() -> Result<(), Failed> {
    let p = pool(2);
    let k = key(2);
    let a = run(&p, &k, "nullstdin1");
    // Usually the next command reaches the rank, whose next read of fd 0 is /dev/null's EOF: it
    // ends while its case body still sleeps. (Under load the stdin thread may read the EOF
    // during the first case already.)
    let r = if a.verdict == Verdict::Passed { run(&p, &k, "slow1") } else { a.clone() };
    expect_failed(&r, &["rank 1 crashed: exit code 0 before reporting an outcome"])?;
    check!(blamed(&r) == vec![(1, "crashed")], "{:?}", r.verdict);
    let tail = &r.ranks[1].stderr_tail;
    check!(tail.contains("stdin reached EOF"), "the rank says why it ended: {tail:?}");
    within(&r, Duration::from_secs(5))?;
    assert_clean(&[&a, &r])
}

fn t_files_left_by_a_dead_rank_are_swept() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "tmpfiles1");
    expect_failed(&r, &["rank 1 crashed: killed by signal SIGKILL"])?;
    assert_clean(&[&r])
}

/// Removes its paths when dropped (the test's own files, also when a check fails).
struct RemoveOnDrop(Vec<std::path::PathBuf>);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A backend's own /dev/shm files (declared prefix, names Concord does not choose), left by a
/// rank SIGKILLed mid-case, are gone after the case; files with the same prefix that the world
/// did not make (one there before it, one an unrelated live process holds open, one it holds
/// only mapped) are kept.
fn t_foreign_shm_left_by_a_killed_rank_is_swept() -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let pfx = format!("concordtest-foreign-{}-{:06x}-", std::process::id(), concord_harness::platform::nonce());
    let shm = Path::new("/dev/shm");
    let (old, open, mapped) = (shm.join(format!("{pfx}old")), shm.join(format!("{pfx}open")), shm.join(format!("{pfx}mapped")));
    let mine: Vec<_> = (0..2).map(|r| shm.join(format!("{pfx}r{r}"))).collect();
    let _guard = RemoveOnDrop([old.clone(), open.clone(), mapped.clone()].into_iter().chain(mine.iter().cloned()).collect());
    // Before the world: an earlier job's leftover, held by nobody. Not the world's.
    std::fs::write(&old, b"x").unwrap();
    let mut k = WorldKey::new("script", 2, vec![("foreign".into(), pfx.clone())]);
    k.foreign_shm = vec![pfx.clone()];
    let p = pool(2);
    let a = run(&p, &k, "pass");
    check!(a.verdict == Verdict::Passed, "{:?}", a.verdict);
    // During the world's life, an unrelated process (this one) makes two live segments with the
    // same prefix: one it keeps open, one it only maps.
    let held = std::fs::File::create(&open).unwrap();
    let m = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&mapped).unwrap();
    m.set_len(4096).unwrap();
    // SAFETY: a fresh shared mapping of a 4 KiB file we own; unmapped below.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, m.as_raw_fd(), 0) };
    check!(addr != libc::MAP_FAILED, "mmap failed");
    drop(m);
    let r = run(&p, &k, "foreignshm1");
    let kept: Vec<bool> = [&old, &open, &mapped].iter().map(|f| f.exists()).collect();
    let left: Vec<_> = mine.iter().filter(|f| f.exists()).collect();
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(addr, 4096) };
    drop(held);
    expect_failed(&r, &["rank 1 crashed: killed by signal SIGKILL"])?;
    check!(left.is_empty(), "the world's own /dev/shm files outlived it: {left:?}");
    check!(kept == [true, true, true], "a file the world did not make was removed (old, open, mapped exist: {kept:?})");
    p.shutdown();
    assert_clean(&[&a, &r])
}

fn t_setup_hang_is_bounded_and_named() -> Result<(), Failed> {
    let mut cfg = PoolConfig::from_env();
    cfg.grace = Duration::from_millis(300);
    cfg.setup_timeout = Duration::from_millis(1500);
    let p = Pool::new(cfg);
    let k = WorldKey::new("script", 2, vec![("setup".into(), "hang".into())]);
    let r = run(&p, &k, "pass");
    expect_failed(&r, &["world setup failed", "rank 1: not ready after 1500 ms"])?;
    check!(blamed(&r) == vec![(1, "setup")], "{:?}", r.verdict);
    within(&r, Duration::from_millis(1500 + 100 + 600 + 2000))?;
    assert_clean(&[&r])
}

fn t_huge_stderr_line_is_bounded() -> Result<(), Failed> {
    let p = pool(2);
    let r = run(&p, &key(2), "hugeline1");
    expect_failed(&r, &["rank 1: failed after a 1 MiB stderr line"])?;
    check!(r.ranks[1].stderr_tail.len() <= 4096, "tail of {} bytes", r.ranks[1].stderr_tail.len());
    check!(r.failure_message().len() < 8192, "message of {} bytes", r.failure_message().len());
    assert_clean(&[&r])
}

fn main() {
    if let Some(env) = WorkerEnv::from_env() {
        serve(env, worker_setup, worker_case);
    }
    if let Some(world) = concord_harness::launch::rank_world() {
        launched_rank(&world);
    }
    if std::env::var("CONCORD_TEST_ROLE").as_deref() == Ok("doomed_parent") {
        doomed_parent();
    }
    if std::env::var("CONCORD_TEST_ROLE").as_deref() == Ok("terminated_parent") {
        terminated_parent();
    }
    if std::env::var("CONCORD_TEST_ROLE").as_deref() == Ok("launch_terminated_parent") {
        launch_terminated_parent();
    }
    if std::env::var("CONCORD_TEST_ROLE").as_deref() == Ok("tee_child") {
        tee_child();
    }
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("snapshot::redact_replaces_what_changes_between_runs", t_redact),
        Trial::test("runner::case_cpu_measures_every_rank", t_case_cpu),
        Trial::test("launch::every_rank_exits_zero", t_launch_ok),
        Trial::test("launch::children_drop_the_outer_launchers_identity", t_launch_children_drop_the_outer_launchers_identity),
        Trial::test("launch::failed_rank_is_named_and_ends_the_world", t_launch_failed_rank_is_named_and_ends_the_world),
        Trial::test("launch::deadline_ends_a_hung_rank", t_launch_deadline_ends_a_hung_rank),
        Trial::test("launch::rank_outside_the_group_gets_sigterm", t_launch_rank_outside_the_group_gets_sigterm),
        Trial::test("launch::parent_sigterm_kills_the_world_and_removes_files", t_launch_parent_sigterm_cleans_up),
        Trial::test("runner::failed_outcome_names_rank", t_failed_outcome),
        Trial::test("runner::panic_names_rank_and_message", t_panic),
        Trial::test("runner::abort_names_sigabrt", || t_crash("abort1", "killed by signal SIGABRT")),
        Trial::test("runner::self_sigkill_names_signal", || t_crash("sigkill1", "killed by signal SIGKILL")),
        Trial::test("runner::nonzero_exit_names_code", || t_crash("exit1", "exit code 3")),
        Trial::test("runner::use_after_free_crashes", t_use_after_free_crashes),
        Trial::test("runner::hang_past_deadline_reports_state_then_sigterm", || t_hang("hang1", "terminated by the runner (SIGTERM)")),
        Trial::test("runner::hang_ignoring_sigterm_gets_sigkill", || t_hang("hangterm1", "killed by the runner (SIGKILL")),
        Trial::test("runner::skip_propagates_and_keeps_world", t_skip_propagates_and_keeps_world),
        Trial::test("runner::all_unsupported_is_unsupported", t_unsupported),
        Trial::test("runner::world_reuse_and_isolation", t_reuse_and_isolation),
        Trial::test("runner::rebuild_after_failure", t_rebuild_after_failure),
        Trial::test("runner::setup_failure_fails_case", t_setup_failure),
        Trial::test("runner::stdout_cannot_corrupt_protocol", t_stdout_cannot_corrupt_protocol),
        Trial::test("runner::stderr_tail_bounded", t_stderr_tail_bounded),
        Trial::test("platform::stderr_tee_flush_keeps_the_last_line", t_stderr_tee_flush_keeps_the_last_line),
        Trial::test("runner::lru_eviction", t_lru_eviction),
        Trial::test("runner::concurrent_callers", t_concurrent_callers),
        Trial::test("runner::parent_death_kills_workers", t_parent_death_kills_workers),
        Trial::test("runner::parent_sigterm_kills_worlds_and_removes_files", t_parent_sigterm_cleans_up),
        Trial::test("store::eight_processes_thousand_adds_each", t_eight_ranks_thousand_adds),
        Trial::test("misbehave::helper_of_a_failing_rank_is_killed", t_helper_of_failing_rank_is_killed),
        Trial::test("misbehave::helper_of_a_kept_world_is_killed_at_shutdown", t_helper_of_kept_world_is_killed_at_shutdown),
        Trial::test("misbehave::daemonised_helper_is_killed", t_daemonised_helper_is_killed),
        Trial::test("misbehave::forked_copy_holding_the_pipes_does_not_hide_a_crash", t_forked_copy_does_not_hide_a_crash),
        Trial::test("misbehave::forked_copy_reporting_first_is_a_protocol_failure", t_forked_copy_reporting_first_is_a_protocol_failure),
        Trial::test("misbehave::rank_outside_the_group_gets_sigterm", t_rank_outside_the_group_gets_sigterm),
        Trial::test("misbehave::forged_pass_then_exit_zero_is_a_crash", t_forged_pass_then_exit_zero_is_a_crash),
        Trial::test("misbehave::stopped_rank_is_named_and_ended", || t_stopped_rank("sigstop1", "terminated by the runner (SIGTERM)")),
        Trial::test("misbehave::stopped_rank_with_sigterm_handler_gets_sigkill", || {
            t_stopped_rank("sigstopterm1", "killed by the runner (SIGKILL")
        }),
        Trial::test("misbehave::crash_at_teardown_after_passing_fails_the_case", t_crash_at_teardown_fails_the_case),
        Trial::test(
            "misbehave::crash_at_teardown_after_a_failure_is_shown_not_blamed",
            t_crash_at_teardown_after_a_failure_is_shown_not_blamed,
        ),
        Trial::test("misbehave::closed_protocol_fd_is_explained", t_closed_protocol_fd_is_explained),
        Trial::test("misbehave::replaced_stdin_is_explained", t_replaced_stdin_is_explained),
        Trial::test("misbehave::files_left_by_a_dead_rank_are_swept", t_files_left_by_a_dead_rank_are_swept),
        Trial::test("misbehave::setup_hang_is_bounded_and_named", t_setup_hang_is_bounded_and_named),
        Trial::test("misbehave::foreign_shm_left_by_a_killed_rank_is_swept", t_foreign_shm_left_by_a_killed_rank_is_swept),
        Trial::test("misbehave::huge_stderr_line_is_bounded", t_huge_stderr_line_is_bounded),
    ];
    for ws in [1usize, 2, 4] {
        trials.push(Trial::test(format!("runner::pass::ws{ws}"), move || t_pass(ws)));
    }
    libtest_mimic::run(&args, trials).exit();
}
