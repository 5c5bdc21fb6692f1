//! A signal to the xtask while it waits for a child reaches the child: no orphan is left.
//! (`cargo xtask mutants` SIGTERMed in its first stage left `concord-mutants` running.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// True while `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string)))
        .is_some_and(|st| st != "Z" && st != "X")
}

fn send(sig: &str, pid: u32) {
    let ok = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid} failed");
}

/// Starts `xtask __forward sh -c '<write pid>; exec sleep 60'`, sends `sig` to the xtask once
/// the child runs, and checks that the xtask exits with 128 + signal and the child is gone,
/// each within a deadline.
fn child_ends_with_the_xtask(sig: &str, signo: i32) {
    let dir = std::env::temp_dir().join(format!("concord-xtask-forward-{}-{sig}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}.tmp && mv {0}.tmp {0} && exec sleep 60", pidfile.display());
    let mut xtask = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["__forward", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the xtask");
    let until = Instant::now() + Duration::from_secs(20);
    let child: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()) {
            break pid;
        }
        if Instant::now() > until || xtask.try_wait().unwrap().is_some() {
            let _ = xtask.kill();
            let _ = std::fs::remove_dir_all(&dir);
            panic!("the xtask's child did not start within 20 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_dir_all(&dir);
    send(sig, xtask.id());
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = xtask.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let until = Instant::now() + Duration::from_secs(5);
    while running(child) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let orphan = running(child);
    if orphan {
        send("KILL", child);
    }
    if status.is_none() {
        let _ = xtask.kill();
        let _ = xtask.wait();
    }
    assert!(!orphan, "SIG{sig} to the xtask (pid {}) left its child `sleep 60` (pid {child}) running: an orphan", xtask.id());
    let status = status.expect("the xtask did not exit within 10 s of the signal");
    assert_eq!(status.code(), Some(128 + signo), "the xtask's exit after SIG{sig}: {status}");
    assert!(!Path::new(&format!("/proc/{child}")).exists() || !running(child));
}

#[test]
fn sigterm_to_the_xtask_ends_its_child() {
    child_ends_with_the_xtask("TERM", 15);
}

#[test]
fn sigint_to_the_xtask_ends_its_child() {
    child_ends_with_the_xtask("INT", 2);
}
