//! The MPI backend under `mpirun` (feature `mpi`; `cargo test --profile ci -p concord-cli
//! --features mpi --test mpi_launch`): the ws4 matrix passes with one report on rank 0, and a
//! killed rank is named on rank 0 (with `--enable-recovery`, so mpirun does not end the other
//! ranks first), every other rank exits non-zero, and nothing of the run is left running.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_concord-conformance");

/// One mpirun at a time (two oversubscribed jobs on a small machine starve each other).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `mpirun -np 4` of the conformance binary on the mpi backend, tagged with `tag` in every rank's
/// environment (to find the run's processes in /proc).
fn mpirun(tag: &str, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    for k in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CONCORD_LAUNCHER", "CONCORD_STORE_ADDR"] {
        c.env_remove(k);
    }
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").env("CONCORD_TEST_RUN", tag);
    c.args([
        "-np",
        "4",
        "--oversubscribe",
        "--enable-recovery",
        "-x",
        "CONCORD_TEST_RUN",
        "-x",
        "CONCORD_CASE_TIMEOUT_MS",
        BIN,
        "--backend",
        "mpi",
    ])
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn have_mpirun() -> bool {
    let ok =
        Command::new("mpirun").arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI")).unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: Open MPI's mpirun is not installed (cargo xtask conformance --backend mpi installs it)");
    }
    ok
}

/// Pids of live processes whose environment holds `CONCORD_TEST_RUN=tag`, with their rank.
fn run_processes(tag: &str) -> Vec<(u32, Option<String>)> {
    let want = format!("CONCORD_TEST_RUN={tag}");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
                .filter_map(|pid| {
                    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
                    let env = String::from_utf8_lossy(&env).into_owned();
                    let vars: Vec<&str> = env.split('\0').collect();
                    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true);
                    (vars.contains(&want.as_str()) && !zombie)
                        .then(|| (pid, vars.iter().find_map(|v| v.strip_prefix("OMPI_COMM_WORLD_RANK=")).map(str::to_string)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(passed, failed)` from the closing line `N passed, M failed, K skipped`.
fn counts(stdout: &str) -> Option<(usize, usize)> {
    let line = stdout.lines().rev().find(|l| l.contains(" passed, ") && l.contains(" failed"))?;
    let num = |word: &str| -> Option<usize> { line[..line.find(word)?].trim_end().rsplit([' ', ',']).next()?.parse().ok() };
    Some((num(" passed")?, num(" failed")?))
}

#[test]
fn under_mpirun_the_mpi_matrix_passes_with_one_report() {
    if !have_mpirun() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let t0 = Instant::now();
    let out = mpirun(&format!("ok{}", std::process::id()), &["--report", report.to_str().unwrap()]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mpirun: {}\n{stdout}\n{stderr}", out.status);
    let (passed, failed) = counts(&stdout).unwrap_or_else(|| panic!("no closing line:\n{stdout}\n{stderr}"));
    assert!(failed == 0 && passed > 500, "{stdout}\n{stderr}");
    assert!(report.join("conformance.json").exists(), "rank 0 writes the report");
    eprintln!("mpirun -np 4 mpi: {passed} passed in {:?}", t0.elapsed());
}

#[test]
fn under_mpirun_a_killed_rank_is_named_on_rank_0_and_nothing_is_left() {
    if !have_mpirun() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = format!("kill{}", std::process::id());
    let mut child = mpirun(&tag, &[]).env("CONCORD_CASE_TIMEOUT_MS", "5000").spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    let (tx, rx) = std::sync::mpsc::channel();
    let err = std::thread::spawn(move || {
        let mut all = Vec::new();
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l.clone());
            all.push(l);
        }
        all.join("\n")
    });
    // Once rank 0 announced the run, let it go on a little (into init or the cases: both must
    // name the rank), then SIGKILL rank 2.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("rank 0 never announced the run").contains("running ")
    {
    }
    std::thread::sleep(Duration::from_millis(1500));
    let victim = run_processes(&tag).into_iter().find(|(_, r)| r.as_deref() == Some("2")).expect("rank 2's process").0;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let t_kill = Instant::now();
    // Every rank must end by itself within the case deadline and the dead-rank detection.
    let end = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            for (pid, _) in run_processes(&tag) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            }
            panic!("mpirun still running 90 s after rank 2 was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled = t_kill.elapsed();
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let all = format!("{out}\n{err}");
    // Rank 0 names the dead rank (in a case: with its pid and host, from its last heartbeat).
    assert!(out.contains("ABORTED: rank 2 died"), "rank 0 must name rank 2 as dead:\n{all}");
    if !out.contains("ABORTED: rank 2 died in mpi init") {
        assert!(all.contains("rank 2 crashed") && all.contains(&format!("pid {victim}")), "rank 0 must name rank 2 (pid {victim}):\n{all}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let left = run_processes(&tag);
    assert!(left.is_empty(), "processes of the run still alive: {left:?}");
    eprintln!("killed rank 2 under mpirun: named on rank 0, every process gone {settled:?} after the kill");
}
