//! The command line (clap), nccl-tests' flags where they exist.

use crate::spec::parse_size;
use std::path::PathBuf;

#[derive(clap::Parser, Clone, Debug)]
#[command(
    name = "concord-bench",
    about = "nccl-tests' table for a Concord backend; every timed iteration checked against the oracle",
    after_help = "Sizes take K/M/G suffixes (binary). With --plot, -o names the SVG file.\n\
                  Exit status: 0 done, 1 a wrong result / failed rank / hang / regression (or a wrong or missing row under --compare), 2 cannot run here or bad arguments \
                  (nothing to run; --compare with no row in common), 141 stdout closed early (`| head`)."
)]
pub struct Args {
    /// Backend: a built-in (shm, nccl) or the name given to `bench_main`.
    #[arg(long)]
    pub backend: Option<String>,
    /// Collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce,
    /// sendrecv, a comma-separated list, or all.
    #[arg(long, default_value = "all")]
    pub op: String,
    /// Smallest size (bytes; K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Size step factor.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Timed iterations per size and placement (every one checked).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations (checked, not timed).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Data type (nccl-tests' names or Concord's: float, half, bfloat16, double, int32, ... / f32, ...).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduce op (sum, prod, min, max, avg, premulsum, band, bor, bxor); default sum. With --plot: the SVG file.
    #[arg(short = 'o')]
    pub o: Option<String>,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Rank processes.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// JSON-lines output (default: `target/concord-bench/<backend>-<ranks>r-<time>.jsonl`).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// SVG plot of this run (default: next to the JSON file, `.svg`).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write no plot at the end of a run.
    #[arg(long)]
    pub no_plot: bool,
    /// Also run OpenMPI's collectives (bench/mpi_collectives.c; installs openmpi with apt-get
    /// when mpicc is missing) and print them in the same table with the ratio.
    #[arg(long)]
    pub mpi: bool,
    /// Fused communication + compute instead of the collectives: each fused op (native, as
    /// the backend provides it) against the trait's unfused decomposition on the same backend,
    /// over a range of matmul shapes, every iteration of both checked against the oracle
    /// (`concord_bench::fused`).
    #[arg(long)]
    pub fused: bool,
    /// Plot these JSON-lines files (one line per backend and rank count) into -o (default bench.svg), then exit.
    #[arg(long, num_args = 1.., value_name = "JSONL")]
    pub plot: Vec<PathBuf>,
    /// Compare two JSON-lines files (baseline, candidate): busbw ratio per op and size, then exit.
    #[arg(long, num_args = 2, value_names = ["BASELINE", "CANDIDATE"])]
    pub compare: Vec<PathBuf>,
    /// With --compare: flag a ratio below this (exit 1; a candidate row that is wrong or missing
    /// is flagged too).
    #[arg(long, default_value_t = 0.9)]
    pub threshold: f64,
    /// Memory per rank for the buffers of one timed window (K/M/G); the window is
    /// min(iters, budget / bytes per iteration), at least 1. Default: 512M on host memory;
    /// 8G with a device clock (GPU backends), so that a window holds nccl-tests' whole timed
    /// loop up to large sizes and the first launch of a window is not paid every few ops.
    #[arg(long, value_parser = parse_size)]
    pub check_budget: Option<usize>,
    /// The most timed iterations per window (default: as many as the check budget allows).
    /// Each window is timed on its own and a size's time is the median over its windows, with
    /// the fastest and slowest reported: `-n 1000 --window 100` gives ten windows per size.
    #[arg(long)]
    pub window: Option<usize>,
    /// Times the reference (when the backend has one) window by window between the backend's
    /// windows of the same step (backend window 1, reference window 1, backend window 2, ...)
    /// instead of all its windows after the backend's: each pair of windows then runs within
    /// milliseconds of each other, so a host whose speed drifts over seconds moves both sides
    /// alike. The same iterations, windows, events and median over windows as without it.
    #[arg(long)]
    pub interleave: bool,
    /// Backend options, `k=v,k=v` (as `WorldInfo::options`).
    #[arg(long, default_value = "")]
    pub opts: String,
    /// Deadline for the whole run; ranks still running then are ended and named.
    #[arg(long, default_value_t = 3600)]
    pub deadline_s: u64,
}

impl Args {
    pub fn redop_name(&self) -> &str {
        self.o.as_deref().unwrap_or("sum")
    }
}
