//! Concord on `P2pColl`, the backend written outside: `P2PCOLL_FULL=1` runs the whole catalogue
//! (the hunt's run, minutes); by default (CI) a slice that still reaches every algorithm
//! ([`in_slice`]). Bugs:
//! `P2PCOLL_BUG=<name>`.
use concord_example_p2pcoll::P2pColl;
use concord_suites::Case;

fn slice() -> Vec<Case<P2pColl>> {
    let all = concord_suites::catalogue::<P2pColl>();
    if std::env::var("P2PCOLL_FULL").is_ok_and(|v| v == "1") {
        return all;
    }
    all.into_iter().filter(in_slice).collect()
}

/// CI's slice: world sizes 3 and 5 (rings with remainders, trees and pairwise schedules at
/// non-powers of two, roots other than 0) for every suite but the size ladder, whose steps stop
/// past the broadcast segment (8193 elements); the matrix in f32, bf16 and u64 only; the
/// autotuner's isolated timing cases left out.
fn in_slice(c: &Case<P2pColl>) -> bool {
    let m = &c.meta;
    [3, 5].contains(&c.world_size)
        && (m.suite != "matrix" || ["f32", "bf16", "u64"].contains(&m.dtype.as_str()))
        && !(m.suite == "autotune" && c.isolated)
        && (m.suite != "sizes" || (!c.name.contains("::grid") && ladder_n(&c.name) <= 8193))
}

/// The element count of a size-ladder case id (`sizes::{op}::{dtype}::n{N}::ws{W}`).
fn ladder_n(id: &str) -> usize {
    id.split("::").find_map(|p| p.strip_prefix('n').and_then(|n| n.parse().ok())).unwrap_or(0)
}

/// The bug to build the backend with (`P2PCOLL_BUG=<name>`, empty: the correct backend): handed
/// to every rank as the option `p2pcoll_bug` (the runner sets each world's options itself, so
/// `CONCORD_BACKEND_OPTS` would not reach the ranks).
fn bug() -> &'static str {
    Box::leak(std::env::var("P2PCOLL_BUG").unwrap_or_default().into_boxed_str())
}

/// The start of a failure's rerun line: the same bug and catalogue, so the line reproduces it.
fn rerun() -> String {
    concord_example_p2pcoll::bugs::rerun_prefix(bug(), std::env::var("P2PCOLL_FULL").is_ok_and(|v| v == "1"))
}

concord_suites::harness!(P2pColl, name = "p2pcoll", catalogue = slice, options = [("p2pcoll_bug", bug())], rerun = rerun());
