//! Concord on `MyBackend`: one `harness!` line is the downstream API.
//!
//! The built-in binary already runs the whole catalogue on the shm backend this example wraps,
//! so here the example proves the downstream path on a slice: every suite that runs at world
//! sizes 1–3, there only (the larger worlds are the same code paths; they were 25 of this binary's
//! tests and a third of its time), the matrix cut to f32, the size grid left out, the size ladder to 1 Mi (+ 1) elements (its 64 MiB steps took most of
//! this binary's time) and the autotuner's isolated timing cases (a rank asleep 10 s, a hang in
//! the timed runs) left to the built-in run. It also hands a backend option to every rank (`MyBackend::init`
//! refuses to start without it, so the option's path is proven too). A backend of your own
//! would write `concord_suites::harness!(MyBackend, name = "mine");` for everything.
use concord_example_downstream::MyBackend;
use concord_suites::Case;

fn slice() -> Vec<Case<MyBackend>> {
    concord_suites::catalogue::<MyBackend>()
        .into_iter()
        .filter(|c| c.world_size <= 3)
        .filter(|c| c.meta.suite != "matrix" || c.meta.dtype == "f32")
        .filter(|c| !(c.meta.suite == "autotune" && c.isolated))
        .filter(|c| c.meta.suite != "sizes" || (!c.name.contains("::grid") && ladder_n(&c.name) <= (1 << 20) + 1))
        .collect()
}

/// The element count of a size-ladder case id (`sizes::{op}::{dtype}::n{N}::ws{W}`).
fn ladder_n(id: &str) -> usize {
    id.split("::").find_map(|p| p.strip_prefix('n').and_then(|n| n.parse().ok())).unwrap_or(0)
}

concord_suites::harness!(MyBackend, name = "mine", catalogue = slice, options = [("example_greeting", "hello")]);
