//! OpenMPI side by side: compiles `bench/mpi_collectives.c` (embedded in the binary) with mpicc
//! — installing Debian's `openmpi-bin libopenmpi-dev` with apt-get first when mpicc is missing —
//! and runs it under mpirun for each op, parsing its nccl-tests rows.

use crate::spec::BenchOp;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = include_str!("../mpi_collectives.c");

/// OpenMPI's out-of-place cells at one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MpiRow {
    pub size: usize,
    pub count: usize,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: u64,
}

fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd}")]).output().map(|o| o.status.success()).unwrap_or(false)
}

/// mpicc, installed with apt-get when missing (needs root).
pub fn ensure_mpicc() -> Result<(), String> {
    if have("mpicc") && have("mpirun") {
        return Ok(());
    }
    eprintln!("# mpicc is missing: installing openmpi-bin libopenmpi-dev with apt-get");
    let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
    if !ok(Command::new("apt-get").args(["update", "-qq"]))
        || !ok(Command::new("apt-get")
            .args(["install", "-y", "-qq", "openmpi-bin", "libopenmpi-dev"])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    {
        return Err("mpicc is missing and `apt-get install openmpi-bin libopenmpi-dev` failed (run as root, or install OpenMPI)".into());
    }
    Ok(())
}

/// Compiles the program into `dir`; returns its path.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    ensure_mpicc()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("mpi_collectives.c");
    let exe = dir.join("mpi_collectives");
    std::fs::write(&src, SOURCE).map_err(|e| format!("{}: {e}", src.display()))?;
    let out = Command::new("mpicc").args(["-O2", "-o"]).arg(&exe).arg(&src).output().map_err(|e| format!("mpicc: {e}"))?;
    if !out.status.success() {
        return Err(format!("mpicc failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(exe)
}

/// `mpirun (Open MPI) 4.1.4`.
pub fn version() -> String {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// nccl-tests' type name → the program's, for the types it has.
pub fn type_supported(t: &str) -> bool {
    matches!(t, "float" | "double" | "int32" | "int64")
}

/// Runs `op` at every size, cycling through as many buffer pairs as `budget` bytes hold (the
/// window rule of the backend's side, so both sides see the same cache state); rows by size.
#[allow(clippy::too_many_arguments)]
pub fn run_op(
    exe: &Path,
    ranks: usize,
    op: BenchOp,
    dtype: &str,
    redop: &str,
    root: usize,
    iters: usize,
    warmup: usize,
    budget: usize,
    sizes: &[usize],
) -> Result<BTreeMap<usize, MpiRow>, String> {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", &ranks.to_string()])
        .arg(exe)
        .args([op.name(), dtype, redop, &root.to_string(), &iters.to_string(), &warmup.to_string(), &budget.to_string()])
        .args(sizes.iter().map(|s| s.to_string()));
    let out = c.output().map_err(|e| format!("mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!("mpirun {} failed ({}): {}", op.name(), out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    let mut rows = parse_rows(&String::from_utf8_lossy(&out.stdout));
    // The program prints GB/s with 2 decimals; recompute from the time for small sizes.
    for r in rows.values_mut() {
        if r.time_us > 0.0 {
            r.algbw = r.size as f64 / r.time_us / 1e3;
            r.busbw = r.algbw * op.busbw_factor(ranks);
        }
    }
    Ok(rows)
}

/// The program's rows (lines not starting with `#`), by size.
pub fn parse_rows(text: &str) -> BTreeMap<usize, MpiRow> {
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 {
            continue;
        }
        let (Ok(size), Ok(count), Ok(time_us), Ok(algbw), Ok(busbw), Ok(wrong)) =
            (f[0].parse(), f[1].parse(), f[5].parse(), f[6].parse(), f[7].parse(), f[8].parse())
        else {
            continue;
        };
        rows.insert(size, MpiRow { size, count, time_us, algbw, busbw, wrong });
    }
    rows
}
