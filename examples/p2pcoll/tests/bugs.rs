//! The p2pcoll hunt's guard (hunt15): each bug of [`Bug`] against the case that catches it in
//! the whole catalogue (`P2PCOLL_BUG=<name> P2PCOLL_FULL=1 cargo test --profile ci -p
//! concord-example-p2pcoll --test conformance -- --report DIR` runs it against all of them).
//! Each trial runs that one case on the backend built with the bug, in a fresh world, and
//! requires it to FAIL with a message naming the op; and the same case on the correct backend
//! must pass (so the case tells the two apart, and the correct backend stays correct there).
//! A suite change that lets a bug through, or a catcher renamed, fails here.

use concord_example_p2pcoll::bugs::{rerun_prefix, Bug};
use concord_example_p2pcoll::P2pColl;
use concord_harness::runner::{Pool, PoolConfig};
use concord_harness::verdict::{Failure, Verdict};
use concord_suites::run::{dispatch_child, profile_flag, run_case_in};
use concord_suites::BackendEntry;
use std::sync::OnceLock;
use std::time::Duration;

/// Each bug, the case (id without the backend prefix) that catches it, and the op its failure
/// message must name (`op=...`). Chosen from the bug's run against the whole catalogue (its
/// lightest failing case that fails by a rank's own check where there is one; docs/RESULTS.md,
/// hunt15, has the counts).
const CATCHES: &[(&str, &str, &str)] = &[
    ("permute_inverse", "permute_tensor::out::f32::ws3", "permute_tensor"),
    ("int_avg_of_unwrapped_sum", "all_reduce::inplace::u8::avg::ws2", "all_reduce"),
    ("u64_minmax_signed", "all_reduce::out::u64::max::ws2", "all_reduce"),
    ("a2a_out_offsets_from_input", "all_to_all_single::out::u32::ws5", "all_to_all_single"),
    ("bcast_segments_drop_tail", "sizes::broadcast::f32::n65537::ws2", "broadcast"),
    ("avg_as_premul_reciprocal", "all_reduce::out::i8::avg::ws2", "all_reduce"),
    ("half_sum_rounded_per_step", "numerics::round_once::f16::ws3", "all_reduce"),
    // Caught every run by the crossed order (shmrace); `reuse::world_and_group_in_flight::*`
    // caught it only when two progress threads interleaved out of turn (it needed up to 5 runs).
    ("groups_share_world_channel", "reuse::world_and_group_crossed::all_reduce::out::ws3", "all_reduce"),
    ("minmax_ignores_zero_sign", "all_reduce::out::f32::min::ws2::special", "all_reduce"),
    ("tree_vrank_unsigned", "broadcast::out::f32::ws3", "broadcast"),
    ("scatter_chunk_by_vrank", "scatter::out::f32::ws2", "scatter"),
    ("shared_p2p_channel", "p2p::recv_before_barrier::ws2", "send_recv"),
    ("gather_slot_by_vrank", "gather::out::f32::ws2", "gather"),
    ("reduce_scatter_owner_shift", "reduce_scatter_tensor::out::f32::sum::ws2", "reduce_scatter_tensor"),
    ("ring_drops_remainder", "all_reduce::out::f32::sum::ws2", "all_reduce"),
    // Survived the 7,939 cases of the catalogue; caught by the cases hunt15 added.
    ("reduce_tree_partials_in_dtype", "numerics::round_once::spread::reduce::f16::ws4", "reduce"),
    ("desc_cut_at_header", "all_reduce::coalesced::f32::sum::ws2::list100", "all_reduce"),
];

/// Every entry's name, bugged or not, as in the conformance binary (`tests/conformance.rs`):
/// the worlds are told apart by the `p2pcoll_bug` option, and a failure's rerun line names a
/// case that binary has.
const NAME: &str = "p2pcoll";

/// The backend with `bug` (empty: the correct one); its rerun line runs the conformance binary
/// with that bug, in the profile this test ran in.
fn entry(bug: &str) -> BackendEntry {
    BackendEntry::new::<P2pColl>(NAME, 0, concord_suites::catalogue::<P2pColl>)
        .with_option("p2pcoll_bug", bug)
        .with_rerun(rerun_prefix(bug, true))
}

fn entries() -> Vec<BackendEntry> {
    let mut v = vec![entry("")];
    v.extend(Bug::ALL.iter().map(|(n, _)| entry(n)));
    v
}

/// Worlds for verdicts only: a failed rank's peers get 150 ms to report.
fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(PoolConfig { settle: Duration::from_millis(150), ..PoolConfig::from_env() }))
}

/// Runs case `id` (no prefix) on `e`: its verdict and failure message.
fn run(e: &BackendEntry, id: &str) -> Result<(Verdict, String), String> {
    let full = format!("{}::{id}", e.name);
    let case = e.cases().into_iter().find(|c| c.id == full).ok_or_else(|| format!("no case {full} in the catalogue"))?;
    let (v, msg, _) = run_case_in(pool(), e, &case);
    Ok((v, msg))
}

fn main() {
    let all = entries();
    dispatch_child(&all);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    trials.push(libtest_mimic::Trial::test("p2pcoll::every_bug_is_pinned", || {
        let missing: Vec<&str> = Bug::ALL.iter().map(|(n, _)| *n).filter(|n| !CATCHES.iter().any(|(b, _, _)| b == n)).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("bugs without a catching case here: {missing:?}").into())
        }
    }));
    trials.push(libtest_mimic::Trial::test("p2pcoll::rerun_prefix", || {
        // What the conformance binary's failures start their rerun line with (tests/conformance.rs).
        let got = [rerun_prefix("", false), rerun_prefix("ring_drops_remainder", false), rerun_prefix("ring_drops_remainder", true)];
        let want = [
            "cargo test{profile} -p concord-example-p2pcoll --test conformance -- --exact",
            "P2PCOLL_BUG=ring_drops_remainder cargo test{profile} -p concord-example-p2pcoll --test conformance -- --exact",
            "P2PCOLL_BUG=ring_drops_remainder P2PCOLL_FULL=1 cargo test{profile} -p concord-example-p2pcoll --test conformance -- --exact",
        ];
        match got.iter().zip(want).find(|(g, w)| g.as_str() != *w) {
            None => Ok(()),
            Some((g, w)) => Err(format!("rerun_prefix gives `{g}`, expected `{w}`").into()),
        }
    }));
    trials.push(libtest_mimic::Trial::test("p2pcoll::no_gpu_dependency", || {
        // A host backend written outside must build without the GPU stack (as a downstream
        // crate would): its normal dependencies never include cudarc.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["tree", "--offline", "-p", "concord-example-p2pcoll", "-e", "normal", "--prefix", "none"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map_err(|e| format!("cargo tree: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.contains("concord-shm") {
            return Err(format!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        match text.lines().find(|l| l.starts_with("cudarc")) {
            Some(l) => Err(format!("concord-example-p2pcoll depends on {l}").into()),
            None => Ok(()),
        }
    }));
    for &(bug, case, op) in CATCHES {
        trials.push(libtest_mimic::Trial::test(format!("p2pcoll::{bug}_is_caught"), move || {
            let bugged = entry(bug);
            // One run: every catch here is deterministic.
            let (v, msg) = run(&bugged, case)?;
            // Caught means a rank REPORTED the wrong result, naming the op (`op=all_reduce ` with
            // its space: not `op=all_reduce_coalesced`); a crash or a timeout of the world is not.
            let named = format!("op={op} ");
            match &v {
                Verdict::Failed(fs) if fs.iter().any(|f| matches!(f, Failure::Reported { message, .. } if message.contains(&named))) => {}
                Verdict::Failed(_) => {
                    return Err(format!("{bug}: {case} failed, but no rank reported a check naming op={op}:\n{msg}").into())
                }
                v => return Err(format!("{bug} SURVIVED {case}: {v:?}").into()),
            }
            // The rerun line: this bug, the whole catalogue, the conformance binary (whose harness
            // names its cases `p2pcoll::...` and builds its line with the same `rerun_prefix`),
            // this case, in the profile this test ran in.
            let want = format!(
                "rerun: P2PCOLL_BUG={bug} P2PCOLL_FULL=1 cargo test{} -p concord-example-p2pcoll --test conformance -- --exact {NAME}::{case}",
                profile_flag()
            );
            if !msg.lines().any(|l| l.trim() == want) {
                return Err(format!("{bug}: the failure's rerun line is not `{want}`:\n{msg}").into());
            }
            let (v, msg) = run(&entry(""), case)?;
            if !matches!(v, Verdict::Passed) {
                return Err(format!("the correct p2pcoll does not pass {case}: {v:?}\n{msg}").into());
            }
            Ok(())
        }));
    }
    // The pool's idle worlds (and their temp directories) end here: `Pool` owners MUST shut
    // it down before exiting (harness/src/runner.rs).
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    pool().shutdown();
    std::process::exit(code);
}
