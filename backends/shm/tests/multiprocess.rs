//! Real multi-process runs: this test binary re-executes itself (the `child_rank` test, ignored
//! in normal runs) as rank processes, started by the harness launcher.

mod common;
use common::leftovers;
use concord_core::{Backend, ReduceOp, Tensor};
use concord_harness::launch::{self, LaunchSpec, Launched};
use concord_shm::ShmBackend;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

const ROLE: &str = "CONCORD_SHM_TEST_ROLE";

/// Ranks `0..ranks` of a 2-rank world, each running `child_rank` in `role`, stdout piped.
fn start(role: &str, ranks: usize) -> Launched {
    let mut spec = LaunchSpec::current_exe(ranks, "shm").unwrap();
    spec.args = ["--ignored", "--exact", "child_rank", "--nocapture", "--test-threads=1"].map(String::from).to_vec();
    spec.world_size = Some(2);
    spec.pipe_stdout = true;
    spec.env = vec![(ROLE.into(), role.into())];
    spec.options = vec![("shm_arena_gib".into(), "0.25".into())];
    spec.op_timeout = Duration::from_secs(if role == "term" { 60 } else { 5 });
    launch::launch(&spec).unwrap()
}

fn wait_line(w: &mut Launched, rank: usize, want: &str) -> BufReader<std::process::ChildStdout> {
    let mut r = BufReader::new(w.take_stdout(rank).unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "rank {rank} ended before printing {want}");
        // libtest may print `test child_rank ... ` on the same line first.
        if line.trim_end().ends_with(want) {
            return r;
        }
    }
}

#[test]
fn two_processes_reduce_then_a_killed_peer_is_reported_as_dead() {
    let mut w = start("kill", 2);
    let wid = w.world_id.clone();
    let _out1 = wait_line(&mut w, 1, "READY");
    w.signal(1, nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(w.wait_rank(1, Duration::from_secs(10)).is_some(), "rank 1 survived SIGKILL");
    let t0 = Instant::now();
    let mut out0 = wait_line(&mut w, 0, "PEER_DIED");
    assert!(t0.elapsed() < Duration::from_secs(4), "PeerDied took {:?}", t0.elapsed());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out0, &mut rest).unwrap();
    let st = w.wait_rank(0, Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "rank 0 failed ({st:?}): {rest}");
    drop(w);
    assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
}

#[test]
fn sigterm_during_rendezvous_unlinks_the_segments() {
    // Rank 0 alone of a world of 2: it waits in the rendezvous for a peer that never comes.
    let mut w = start("term", 1);
    let wid = w.world_id.clone();
    let t0 = Instant::now();
    while leftovers(&wid).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "segments never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    w.signal(0, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = w.wait_rank(0, Duration::from_secs(10)).expect("rank 0 exits on SIGTERM");
    assert!(!st.success());
    // Before the launcher's own sweep: the backend's SIGTERM hook must have unlinked them.
    assert!(leftovers(&wid).is_empty(), "SIGTERM left {:?}", leftovers(&wid));
}

/// A rank process (run only by the tests above, through `--ignored --exact child_rank`).
#[test]
#[ignore = "a rank process for the multi-process tests, not a test by itself"]
fn child_rank() {
    std::env::var(ROLE).expect("run by the multi-process tests");
    let world = launch::rank_world().expect("started by the harness launcher");
    let rank = world.rank;
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
