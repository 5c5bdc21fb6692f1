//! The NCCL bench on a machine without enough GPUs: exit status 2 and one `CANNOT RUN` line,
//! never a panic or a hang.

#[test]
fn nccl_bench_exits_cleanly_when_it_cannot_run() {
    if concord_nccl::probe().map(|i| i.gpus >= 2).unwrap_or(false) {
        return; // a real 2-GPU machine: the benchmark is the GPU job's business, not this test's
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord-nccl-bench")).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("CANNOT RUN"), "{stdout}");
}

#[test]
fn bench_says_in_one_line_why_nccl_cannot_run() {
    if concord_nccl::probe().map(|i| i.gpus >= 2).unwrap_or(false) {
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_concord-bench"))
        .args(["--backend", "nccl", "--ranks", "2", "--no-plot"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stdout}");
    assert!(lines[0].starts_with("CANNOT RUN: nccl benchmark: "), "{stdout}");
}
