//! Children the xtask waits for, with SIGTERM, SIGINT and SIGHUP forwarded to them.
//!
//! Where the xtask has nothing left to do after a program, it `exec`s it (`main.rs`'s `exec`).
//! Where it has (a build before a run, the campaign before the legal variants, fmt before clippy
//! before nextest), it waits for the child, and a signal that ended the xtask alone used to leave
//! the child running (`cargo xtask mutants` SIGTERMed in its first stage left `concord-mutants`
//! running, an orphan). Here the xtask catches the three signals while a child runs, sends the
//! same signal to the child (whose own cleanup then runs: the runner ends its worlds and removes
//! their files), waits for it, and exits with `128 + signal` without starting the next step.
//! A signal the xtask inherited as ignored (`nohup`) stays ignored. The one `unsafe` of the
//! xtask: `signal(2)` and `kill(2)` from the C library std already links (the xtask depends on
//! nothing but std); the handler only loads and stores atomics and calls `kill`, all
//! async-signal-safe.
#![allow(unsafe_code)]

use std::io;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;
const SIG_DFL: usize = 0;
const SIG_IGN: usize = 1;

extern "C" {
    fn signal(sig: i32, handler: usize) -> usize;
    fn kill(pid: i32, sig: i32) -> i32;
}

/// The child being waited for (0: none).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The first forwarded signal that arrived (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: i32) {
    let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe. `pid` is our child, cleared right after it is
        // reaped: a reuse of the pid would have to happen within those microseconds.
        unsafe { kill(pid, sig) };
    }
}

fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [SIGTERM, SIGINT, SIGHUP] {
            // SAFETY: installs a handler that is async-signal-safe (see `on_signal`); a
            // disposition inherited as ignored is put back as it was.
            unsafe {
                if signal(sig, on_signal as extern "C" fn(i32) as usize) == SIG_IGN {
                    signal(sig, SIG_IGN);
                }
            }
        }
    });
}

/// Spawns `cmd`; until [`wait`] returns, the three signals are forwarded to it.
pub fn spawn(cmd: &mut Command) -> io::Result<Child> {
    install();
    if let Some(sig) = received() {
        std::process::exit(128 + sig);
    }
    let child = cmd.spawn()?;
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    // A signal that came between the spawn and the store found no child: forward it now.
    if let Some(sig) = received() {
        // SAFETY: plain syscall on our unreaped child.
        unsafe { kill(child.id() as i32, sig) };
    }
    Ok(child)
}

/// Waits for a child of [`spawn`]; if a signal was forwarded meanwhile, exits with
/// `128 + signal` once the child has ended (no next step starts).
pub fn wait(child: &mut Child) -> io::Result<ExitStatus> {
    // `wait` returns only once the child has been reaped; it retries on EINTR itself.
    let st = child.wait();
    CHILD.store(0, Ordering::SeqCst);
    if let Some(sig) = received() {
        std::process::exit(128 + sig);
    }
    st
}

/// [`spawn`] then [`wait`]: `Command::status` with the signals forwarded.
pub fn status(cmd: &mut Command) -> io::Result<ExitStatus> {
    let mut child = spawn(cmd)?;
    wait(&mut child)
}

/// Before the xtask `exec`s its last program: the three signals get their default action back
/// (where the handler was installed; an inherited `ignore` stays), so one that comes from now on
/// ends the xtask before the program starts, or reaches the program itself; and one that came
/// while no child ran (it was only recorded) ends the xtask now, with `128 + signal`.
pub fn before_exec() {
    for sig in [SIGTERM, SIGINT, SIGHUP] {
        // SAFETY: restores the default disposition; an ignored signal is put back as ignored.
        unsafe {
            if signal(sig, SIG_DFL) == SIG_IGN {
                signal(sig, SIG_IGN);
            }
        }
    }
    if let Some(sig) = received() {
        std::process::exit(128 + sig);
    }
}

fn received() -> Option<i32> {
    Some(RECEIVED.load(Ordering::SeqCst)).filter(|s| *s != 0)
}
