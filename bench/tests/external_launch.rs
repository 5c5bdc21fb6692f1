//! The benchmark under an external launcher: 2 processes of `concord-bench` with a torchrun-style
//! environment (no torch). Rank 0 prints the table of every rank's results, merged through the
//! TCP store; the other rank prints nothing; both exit 0 and every output was checked.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn two_torchrun_style_ranks_print_one_checked_table_on_rank_0() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..2)
        .map(|r| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_concord-bench"));
            for k in concord_harness::config::LAUNCHER_VARS {
                c.env_remove(k);
            }
            c.env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .args(["--backend", "shm", "--op", "all_reduce,broadcast", "-b", "8", "-e", "64K", "-n", "3", "-w", "1", "--no-plot"])
                .arg("--json")
                .arg(dir.path().join("b.jsonl"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for k in &mut kids {
        while k.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                for k in &mut kids {
                    let _ = k.kill();
                    let _ = k.wait();
                }
                panic!("the ranks did not end within 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let outs: Vec<_> = kids.into_iter().map(|k| k.wait_with_output().unwrap()).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r}: {:?}\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let table = String::from_utf8_lossy(&outs[0].stdout);
    assert!(table.contains("# all_reduce") && table.contains("# broadcast"), "{table}");
    assert!(table.contains("# Wrong results: 0 OK"), "{table}");
    assert!(table.contains("2 ranks"), "{table}");
    // One row per size and op: 8 B .. 64 KiB doubling is 14 sizes.
    let rows = table.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(rows, 2 * 14, "{table}");
    assert!(outs[1].stdout.is_empty(), "rank 1 printed: {}", String::from_utf8_lossy(&outs[1].stdout));
    eprintln!("torchrun-style bench, 2 ranks: {:?}", t0.elapsed());
}
