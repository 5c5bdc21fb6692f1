//! An op queued behind a stuck op ends at the queued backstop (review15 finding 5b).
//!
//! `cargo test --profile ci -p concord-mpi --features mpi --test queued_deadline` starts itself
//! under `mpirun -np 2 --oversubscribe` (SKIPPED, exit 0, where Open MPI's mpirun is missing). Op
//! deadline `D` = 2 s. After a barrier, rank 0 issues two all_reduces (`first`, `second`) that
//! rank 1 does not issue yet (absent): `first` sits in its call-description exchange on the
//! progress thread, `second` is queued behind it and never starts. Rank 0's wait of `first`
//! (timeout 10 D) MUST end in a named timeout by about D, and its wait of `second` (10 D) by
//! about `queued_op_backstop(D)` = 3 D from its issue, naming the op and that it never started,
//! not at the caller's 10 D (before the fix the op deadline counted only from a start that never
//! came). Rank 1 then arrives (3 D + 1.5 s after the barrier) and issues both: each MUST end in a
//! named error (rank 0 gave them up: nothing moves), never `Ok`; then a barrier on both ranks
//! shows the communicator still usable. Every wait has a deadline; the launcher kills mpirun
//! past its own.
use concord_core::{queued_op_backstop, Backend, CollectiveError, ReduceOp, Tensor, WorldInfo};
use concord_mpi::MpiBackend;
use std::process::Command;
use std::time::{Duration, Instant};

/// The op deadline of this test's world.
const D: Duration = Duration::from_secs(2);
/// The caller's timeout of every wait that the backend must end first.
const CALLER: Duration = Duration::from_secs(20);
/// How late past its deadline a wait may end (a loaded 2-core machine).
const SLACK: Duration = Duration::from_millis(2500);
/// The launcher's deadline for the whole mpirun.
const RUN: Duration = Duration::from_secs(120);

fn main() {
    if std::env::var("OMPI_COMM_WORLD_SIZE").is_err() {
        std::process::exit(launch());
    }
    std::process::exit(match rank_main() {
        Ok(()) => 0,
        Err(m) => {
            eprintln!("queued_deadline: {m}\n  rerun: cargo test --profile ci -p concord-mpi --features mpi --test queued_deadline");
            1
        }
    });
}

/// Outside mpirun: this binary under `mpirun -np 2`, waited up to [`RUN`], its status.
fn launch() -> i32 {
    let have = Command::new("mpirun").arg("--version").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if !have {
        eprintln!("SKIPPED: Open MPI's mpirun is not installed (cargo xtask conformance --backend mpi installs it)");
        return 0;
    }
    let exe = std::env::current_exe().expect("own path");
    let started = Instant::now();
    let mut child = match Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", "2"])
        .arg(exe)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("queued_deadline: cannot start mpirun: {e}");
            return 1;
        }
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                eprintln!("queued_deadline: mpirun -np 2 finished in {:.1} s: {status}", started.elapsed().as_secs_f64());
                return if status.success() { 0 } else { 1 };
            }
            Ok(None) if started.elapsed() < RUN => std::thread::sleep(Duration::from_millis(50)),
            other => {
                eprintln!("queued_deadline: mpirun not done after {RUN:?} ({other:?}): killed");
                let _ = child.kill();
                let _ = child.wait();
                return 1;
            }
        }
    }
}

fn rank_main() -> Result<(), String> {
    let env = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set: run through mpirun"));
    let rank: usize = env("OMPI_COMM_WORLD_RANK")?.parse().map_err(|e| format!("rank: {e}"))?;
    let world = WorldInfo {
        rank,
        world_size: 2,
        store_path: "/nonexistent/unused-by-mpi".into(),
        world_id: "queued_deadline".into(),
        op_timeout: D,
        options: vec![],
    };
    let here = |what: &str| format!("backend=mpi op=all_reduce variant=out dtype=f32 world_size=2 rank={rank}: {what}");
    let b = MpiBackend::init(&world).map_err(|e| here(&format!("mpi init: {e}")))?;
    b.barrier().and_then(|w| w.wait(CALLER).map(|_| ())).map_err(|e| here(&format!("first barrier: {e}")))?;
    let met = Instant::now();
    let x = b.upload(&Tensor::from_vec(&[4], vec![1.0f32 + rank as f32; 4])).map_err(|e| here(&format!("upload: {e}")))?;
    if rank == 0 {
        let first = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| here(&format!("first: issue: {e}")))?;
        let t0 = Instant::now();
        let second = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| here(&format!("second: issue: {e}")))?;
        must_time_out(&here("first (rank 1 absent)"), first.wait(CALLER).map(|_| ()), t0, D)?;
        must_time_out(&here("second (queued behind first)"), second.wait(CALLER).map(|_| ()), t0, queued_op_backstop(D))?;
        println!("rank 0: first ended by its op deadline, second by the queued backstop ({:?})", queued_op_backstop(D));
    } else {
        // Absent past both deadlines of rank 0's ops, then both issued: rank 0 gave them up.
        std::thread::sleep((met + queued_op_backstop(D) + Duration::from_millis(1500)).saturating_duration_since(Instant::now()));
        let first = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| here(&format!("first (late): issue: {e}")))?;
        let second = b.all_reduce(&x, ReduceOp::Sum).map_err(|e| here(&format!("second (late): issue: {e}")))?;
        for (name, w) in [("first", first), ("second", second)] {
            match w.wait(CALLER) {
                Ok(_) => return Err(here(&format!("{name} (late): Ok, although rank 0 gave it up at its deadline"))),
                Err(e) if e.to_string().contains("had given up") => println!("rank 1: {name} (late) refused: {e}"),
                Err(e) => return Err(here(&format!("{name} (late): expected rank 0's give-up named, got {e}"))),
            }
        }
    }
    b.barrier().and_then(|w| w.wait(CALLER).map(|_| ())).map_err(|e| here(&format!("barrier after the abandoned ops: {e}")))?;
    println!("rank {rank}: communicator usable after both abandoned ops");
    Ok(())
}

/// `r` (a wait that began at about `t0`) MUST be a named timeout that came by `t0 + by` (within
/// [`SLACK`]) and not before it.
fn must_time_out(what: &str, r: concord_core::Result<()>, t0: Instant, by: Duration) -> Result<(), String> {
    let took = t0.elapsed();
    match r {
        Err(e @ CollectiveError::Timeout { .. }) if took + Duration::from_millis(50) >= by && took <= by + SLACK => {
            println!("rank 0: {what}: timed out after {:.2} s (deadline {:.1} s): {e}", took.as_secs_f64(), by.as_secs_f64());
            Ok(())
        }
        Err(e @ CollectiveError::Timeout { .. }) => Err(format!(
            "{what}: timed out after {:.2} s, expected by {:.1} s (+{:.1} s): {e}",
            took.as_secs_f64(),
            by.as_secs_f64(),
            SLACK.as_secs_f64()
        )),
        Err(e) => Err(format!("{what}: expected a named timeout by {:.1} s, got after {:.2} s: {e}", by.as_secs_f64(), took.as_secs_f64())),
        Ok(()) => Err(format!("{what}: Ok after {:.2} s, although its peer never issued it", took.as_secs_f64())),
    }
}
