//! Concord on `P2pColl`, the backend written outside: `P2PCOLL_FULL=1` runs the whole catalogue
//! (the hunt's run, minutes); by default (CI) a slice that still reaches every algorithm: every
//! suite at world sizes 1–5 (rings with remainders, trees at non-powers of two, roots ≠ 0),
//! the matrix cut to f32 / bf16 / i8 / u64, the size ladder to 64 Ki + 1 elements (past the
//! broadcast segment), the autotuner's isolated timing cases left out. Bugs:
//! `CONCORD_BACKEND_OPTS=p2pcoll_bug=<name>`.
use concord_example_p2pcoll::P2pColl;
use concord_suites::Case;

fn slice() -> Vec<Case<P2pColl>> {
    let all = concord_suites::catalogue::<P2pColl>();
    if std::env::var("P2PCOLL_FULL").is_ok_and(|v| v == "1") {
        return all;
    }
    all.into_iter()
        .filter(|c| c.world_size <= 5)
        .filter(|c| c.meta.suite != "matrix" || ["f32", "bf16", "i8", "u64"].contains(&c.meta.dtype.as_str()))
        .filter(|c| !(c.meta.suite == "autotune" && c.isolated))
        .filter(|c| c.meta.suite != "sizes" || (!c.name.contains("::grid") && ladder_n(&c.name) <= (1 << 16) + 1))
        .collect()
}

/// The element count of a size-ladder case id (`sizes::{op}::{dtype}::n{N}::ws{W}`).
fn ladder_n(id: &str) -> usize {
    id.split("::").find_map(|p| p.strip_prefix('n').and_then(|n| n.parse().ok())).unwrap_or(0)
}

concord_suites::harness!(P2pColl, name = "p2pcoll", catalogue = slice);
