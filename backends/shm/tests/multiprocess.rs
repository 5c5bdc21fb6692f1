//! Real multi-process runs: this test binary re-executes itself (the `child_rank` test, ignored
//! in normal runs) as rank processes.

mod common;
use common::{leftovers, world_id};
use concord_core::{Backend, ReduceOp, Tensor, WorldInfo};
use concord_shm::ShmBackend;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "CONCORD_SHM_TEST_ROLE";

fn spawn(role: &str, rank: usize, store: &std::path::Path, wid: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_rank", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("CONCORD_SHM_TEST_RANK", rank.to_string())
        .env("CONCORD_SHM_TEST_STORE", store)
        .env("CONCORD_SHM_TEST_WID", wid)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn wait_line(c: &mut Child, want: &str) -> BufReader<std::process::ChildStdout> {
    let mut r = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "child ended before printing {want}");
        // libtest may print `test child_rank ... ` on the same line first.
        if line.trim_end().ends_with(want) {
            return r;
        }
    }
}

fn wait_exit(c: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if t0.elapsed() > within {
            let _ = c.kill();
            let _ = c.wait();
            panic!("child did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_processes_reduce_then_a_killed_peer_is_reported_as_dead() {
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let store = dir.path().join("store");
    let mut r0 = spawn("kill", 0, &store, &wid);
    let mut r1 = spawn("kill", 1, &store, &wid);
    let _out1 = wait_line(&mut r1, "READY");
    r1.kill().unwrap();
    r1.wait().unwrap();
    let t0 = Instant::now();
    let mut out0 = wait_line(&mut r0, "PEER_DIED");
    assert!(t0.elapsed() < Duration::from_secs(4), "PeerDied took {:?}", t0.elapsed());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out0, &mut rest).unwrap();
    assert!(wait_exit(&mut r0, Duration::from_secs(10)).success(), "rank 0 failed: {rest}");
    assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
}

#[test]
fn sigterm_during_rendezvous_unlinks_the_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let mut r0 = spawn("term", 0, &dir.path().join("store"), &wid);
    let t0 = Instant::now();
    while leftovers(&wid).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "segments never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY-free: kill(2) through the harness helper.
    concord_harness::platform::kill_pid(r0.id(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = wait_exit(&mut r0, Duration::from_secs(10));
    assert!(!st.success());
    assert!(leftovers(&wid).is_empty(), "SIGTERM left {:?}", leftovers(&wid));
}

/// A rank process (run only by the tests above, through `--ignored --exact child_rank`).
#[test]
#[ignore = "a rank process for the multi-process tests, not a test by itself"]
fn child_rank() {
    let role = std::env::var(ROLE).expect("run by the multi-process tests");
    let rank: usize = std::env::var("CONCORD_SHM_TEST_RANK").unwrap().parse().unwrap();
    let world = WorldInfo {
        rank,
        world_size: 2,
        store_path: std::env::var("CONCORD_SHM_TEST_STORE").unwrap().into(),
        world_id: std::env::var("CONCORD_SHM_TEST_WID").unwrap(),
        op_timeout: Duration::from_secs(if role == "term" { 60 } else { 5 }),
        options: vec![("shm_arena_gib".into(), "0.25".into())],
    };
    let b = ShmBackend::init(&world).unwrap();
    let x = b.upload(&Tensor::from_vec(&[1000], vec![rank as f32 + 1.0; 1000])).unwrap();
    let y = b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(Duration::from_secs(5)).unwrap();
    assert_eq!(b.download(&y).unwrap(), Tensor::from_vec(&[1000], vec![3.0f32; 1000]), "cross-process all_reduce");
    println!("READY");
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    let t0 = Instant::now();
    let err = b.all_reduce(&x, ReduceOp::Sum).unwrap().wait(Duration::from_secs(10)).expect_err("peer was killed");
    assert_eq!(err.name(), "peer_died", "{err}");
    assert!(matches!(err, concord_core::CollectiveError::PeerDied { peer: 1, .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    println!("PEER_DIED");
}
