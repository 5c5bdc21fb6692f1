//! Conformance mode's GPU lane on a machine without GPUs: a backend that declares GPUs per rank
//! (here the fake backend, told the machine has 8 GPUs with `CONCORD_GPU_COUNT`) has its cases
//! run one at a time, in one queue's order, while a CPU backend's cases of the same run overlap.
//! Each case's rank 0 records when it started and ended in a directory the parent names; the
//! parent checks the intervals after `run_work`.
//!
//! This binary (`harness = false`) is its own worker (`dispatch_child`).

use concord_fake::FakeBackend;
use concord_suites::run::{dispatch_child, run_work, BackendEntry};
use concord_suites::{Case, CaseMeta, Ctx};
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DIR_ENV: &str = "CONCORD_TEST_LANE_DIR";
/// How long each case's rank 0 holds it (long enough that lanes side by side overlap).
const HOLD: Duration = Duration::from_millis(60);

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// Rank 0 writes `<start ns> <end ns>` to `<dir>/<name>` around a sleep.
fn record(name: &str, ctx: &mut Ctx<'_, FakeBackend>) -> concord_suites::CaseResult {
    if ctx.rank() != 0 {
        return Ok(());
    }
    let dir = std::env::var(DIR_ENV).map_err(|_| concord_suites::CaseEnd::Fail(format!("{DIR_ENV} not set")))?;
    let start = now_ns();
    std::thread::sleep(HOLD);
    let end = now_ns();
    std::fs::write(PathBuf::from(dir).join(name), format!("{start} {end}")).map_err(|e| concord_suites::CaseEnd::Fail(e.to_string()))
}

fn meta() -> CaseMeta {
    CaseMeta { suite: "lane".into(), op: "sleep".into(), variant: String::new(), dtype: String::new(), reduce: String::new() }
}

/// `gpu` cases: two stall-bound, then light ones at world sizes 3, 2 and 1, interleaved in the
/// catalogue (the schedule, not the catalogue, must group them).
fn gpu_cases() -> Vec<Case<FakeBackend>> {
    let mut v = Vec::new();
    for i in 0..12 {
        let ws = 3 - i % 3;
        let name = format!("gpu::light{i}::ws{ws}");
        let n = name.clone();
        v.push(Case::new(name, meta(), ws, move |ctx| record(&n, ctx)));
    }
    for i in 0..2 {
        let name = format!("gpu::stall{i}::ws1");
        let n = name.clone();
        v.push(Case::new(name, meta(), 1, move |ctx| record(&n, ctx)).stall_bound());
    }
    v
}

fn cpu_cases() -> Vec<Case<FakeBackend>> {
    (0..12)
        .map(|i| {
            let name = format!("cpu::light{i}::ws1");
            let n = name.clone();
            Case::new(name, meta(), 1, move |ctx| record(&n, ctx))
        })
        .collect()
}

fn entries() -> Vec<BackendEntry> {
    vec![BackendEntry::new::<FakeBackend>("gpufake", 1, gpu_cases), BackendEntry::new::<FakeBackend>("cpufake", 0, cpu_cases)]
}

/// (name, start, end) of every recorded case whose name starts with `prefix`, by start.
fn intervals(dir: &std::path::Path, prefix: &str) -> Vec<(String, u128, u128)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let (true, Some((a, b))) = (name.starts_with(prefix), text.split_once(' ')) {
            if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                v.push((name, a, b));
            }
        }
    }
    v.sort_by_key(|x| x.1);
    v
}

/// Removes the directory when dropped (also when a check fails).
struct RemoveDir(PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The most cases of `v` running at one instant.
fn max_overlap(v: &[(String, u128, u128)]) -> usize {
    v.iter().map(|(_, s, _)| v.iter().filter(|(_, a, b)| a <= s && s < b).count()).max().unwrap_or(0)
}

fn t_gpu_cases_run_alone_cpu_cases_side_by_side() -> Result<(), Failed> {
    let dir = RemoveDir(std::env::temp_dir().join(format!("concord-test-gpu-lane-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).map_err(|e| e.to_string())?;
    std::env::set_var(DIR_ENV, &dir.0);
    let work: Vec<_> = entries().into_iter().flat_map(|e| e.cases().into_iter().map(move |c| (e.clone(), c))).collect();
    let report = run_work(work, 4, false);
    concord_harness::runner::Pool::global().shutdown();
    if report.failed() > 0 || report.cases.len() != 26 {
        return Err(format!("the run was not clean ({} cases):\n{}", report.cases.len(), report.summary_text()).into());
    }
    let gpu = intervals(&dir.0, "gpu::");
    let cpu = intervals(&dir.0, "cpu::");
    if gpu.len() != 14 || cpu.len() != 12 {
        return Err(format!("{} gpu and {} cpu records, expected 14 and 12", gpu.len(), cpu.len()).into());
    }
    // One GPU case at a time: rank r drives GPU r, so two worlds side by side share devices.
    let g = max_overlap(&gpu);
    if g > 1 {
        return Err(format!("{g} cases of the GPU backend ran at once: {gpu:?}").into());
    }
    // The CPU backend keeps its lanes (this is what makes the check above able to fail).
    let c = max_overlap(&cpu);
    if c < 2 {
        return Err(format!("the CPU backend's cases never overlapped with 4 lanes: {cpu:?}").into());
    }
    // One queue, `schedule`d with one job: stall-bound cases first, then one world size after
    // the other (cases of one world back to back).
    let order: Vec<&str> = gpu.iter().map(|(n, _, _)| n.as_str()).collect();
    let stalls_first = order.iter().take(2).all(|n| n.contains("stall"));
    let sizes: Vec<&str> = order[2..].iter().map(|n| &n[n.len() - 3..]).collect();
    let switches = sizes.windows(2).filter(|w| w[0] != w[1]).count();
    if !stalls_first || switches != 2 {
        return Err(format!(
            "the GPU backend's cases did not run in one queue (stall-bound first, then one world size at a time): {order:?}"
        )
        .into());
    }
    Ok(())
}

fn main() {
    // The fake "GPU" backend passes the GPU gate (workers inherit it too; they gate nothing).
    std::env::set_var("CONCORD_GPU_COUNT", "8");
    dispatch_child(&entries());
    let args = Arguments::from_args();
    let trials =
        vec![Trial::test("lanes::gpu_backend_cases_run_alone_cpu_cases_side_by_side", t_gpu_cases_run_alone_cpu_cases_side_by_side)];
    libtest_mimic::run(&args, trials).exit();
}
