//! The JSON lines a run writes: one [`Record`] per op × size × placement (plus the memcpy
//! reference and OpenMPI's rows), with the machine, versions and full command.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

/// Bumped when a field changes meaning.
pub const SCHEMA: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub cores: usize,
}

impl Machine {
    pub fn this() -> Machine {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Machine { hostname, cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) }
    }
}

/// One measured row: an op at one size and placement, on one backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    /// `shm`, `nccl`, `openmpi`, `memcpy`, or a downstream backend's name.
    pub backend: String,
    pub op: String,
    /// `out-of-place` or `in-place`.
    pub placement: String,
    pub size: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub ranks: usize,
    pub iters: usize,
    pub warmup: usize,
    /// Timed iterations issued back to back per window (outputs kept, checked after it).
    pub window: usize,
    /// Mean over ranks of each rank's mean time per iteration.
    pub time_us: f64,
    pub time_us_per_rank: Vec<f64>,
    /// GB/s (1e9 bytes): size / time.
    pub algbw: f64,
    /// algbw × nccl-tests' factor for the op.
    pub busbw: f64,
    /// Wrong elements over the timed iterations, summed over ranks (nccl-tests' `#wrong`).
    pub wrong: u64,
    /// Timed iterations with at least one wrong element, summed over ranks.
    pub wrong_iterations: u64,
    /// Wrong elements in the warm-up iterations (also checked; they fail the run too).
    pub wrong_warmup: u64,
    /// How the time was taken.
    pub timing: String,
    /// Host wall-clock per iteration of the same timed windows, when `time_us` is device time
    /// (CUDA events): issues plus the waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_us: Option<f64>,
    /// Timed windows per rank: each rank's time is the median over them of each window's time
    /// per iteration (`--window`; 0 in records of older runs).
    #[serde(default)]
    pub windows: usize,
    /// Mean over ranks of the fastest and slowest window's time per iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_us: Option<(f64, f64)>,
    pub machine: Machine,
    pub versions: BTreeMap<String, String>,
    pub command: Vec<String>,
    /// Seconds since the Unix epoch when the run started.
    pub started: u64,
}

impl Record {
    /// `shm (2 ranks)`: the series name in plots and comparisons.
    pub fn label(&self) -> String {
        format!("{} ({} ranks)", self.backend, self.ranks)
    }
}

/// Appends records as JSON lines.
pub fn write_jsonl(path: &Path, records: &[Record]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in records {
        serde_json::to_writer(&mut f, r).map_err(std::io::Error::other)?;
        f.write_all(b"\n")?;
    }
    f.flush()
}

/// Every record of a JSON-lines file; a line that does not parse is an error naming it.
pub fn read_jsonl(path: &Path) -> Result<Vec<Record>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|e| format!("{}:{}: not a bench record: {e}", path.display(), i + 1))?);
    }
    Ok(out)
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
pub(crate) fn sample(backend: &str, op: &str, size: u64, busbw: f64) -> Record {
    Record {
        schema: SCHEMA,
        backend: backend.into(),
        op: op.into(),
        placement: "out-of-place".into(),
        size,
        count: size / 4,
        dtype: "float".into(),
        redop: "sum".into(),
        root: -1,
        ranks: 2,
        iters: 20,
        warmup: 5,
        window: 20,
        time_us: size as f64 / busbw / 1e3,
        time_us_per_rank: vec![],
        algbw: busbw,
        busbw,
        wrong: 0,
        wrong_iterations: 0,
        wrong_warmup: 0,
        timing: "test".into(),
        wall_time_us: None,
        windows: 0,
        spread_us: None,
        machine: Machine { hostname: "h".into(), cores: 2 },
        versions: BTreeMap::new(),
        command: vec![],
        started: 0,
    }
}
