//! # concord-suites
//!
//! **One job:** the conformance suites, and the machinery that runs them on any
//! [`concord_core::Backend`] — the case catalogue, the checks, the libtest-mimic / conformance-mode
//! runner, the report, and the [`harness!`] macro that is the whole downstream API.
//!
//! ```ignore
//! // tests/conformance.rs of your backend crate, with `harness = false` in Cargo.toml:
//! concord_suites::harness!(MyBackend, name = "mine");
//! ```
#![forbid(unsafe_code)]

pub mod autotune;
pub mod case;
pub mod contract;
pub mod exec;
mod external;
pub mod report;
pub mod run;
pub mod sched;
pub mod suites;
pub mod values;

pub use case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
pub use run::{main_with, BackendEntry};

use concord_core::Backend;

/// Every suite, for a backend that moves data.
pub fn catalogue<B: Backend>() -> Vec<Case<B>> {
    let mut v = suites::matrix::cases::<B>();
    v.extend(suites::subgroup::cases::<B>());
    v.extend(suites::seed::cases::<B>());
    v.extend(suites::async_wait::cases::<B>());
    v.extend(suites::async_ops::cases::<B>());
    v.extend(suites::p2p::cases::<B>());
    v.extend(suites::numerics::cases::<B>());
    v.extend(suites::reuse::cases::<B>());
    v.extend(suites::bad_input::cases::<B>());
    v.extend(suites::bad_input_grid::cases::<B>());
    v.extend(suites::caps::cases::<B>());
    v.extend(suites::views::cases::<B>());
    v.extend(suites::sizes::cases::<B>());
    v.extend(suites::all_to_all_equal::cases::<B>());
    v.extend(suites::realloc::cases::<B>());
    v.extend(suites::state::cases::<B>());
    v.extend(suites::wild_gpu::cases::<B>());
    v.extend(suites::identical::cases::<B>());
    v.extend(suites::wild_groups::cases::<B>());
    v.extend(suites::wild_layout::cases::<B>());
    v.extend(suites::wild_custom::cases::<B>());
    v.extend(suites::wild_state::cases::<B>());
    v.extend(suites::device_faults::cases::<B>());
    v.extend(suites::faults::cases::<B>());
    v.extend(suites::p2p_fail::cases::<B>());
    v.extend(suites::fused::cases::<B>());
    v.extend(suites::programs::cases::<B>());
    v.extend(autotune::cases::<B, concord_autotune::Tuner>());
    v
}

/// The value-independent subset (shapes, identity, async), for backends that move no data
/// (`Capabilities::moves_data == false`), like the fake backend.
pub fn shape_catalogue<B: Backend>() -> Vec<Case<B>> {
    let mut v = suites::matrix::shape_cases::<B>();
    v.extend(suites::async_wait::cases::<B>().into_iter().filter(|c| {
        // Cases that need peers to really meet cannot pass without communication.
        !c.name.contains("pending_until_peers")
            && !c.name.contains("peer_never_joins")
            && !c.name.contains("peer_dies")
            && !c.name.contains("wait_zero_polls")
            && !c.name.contains("timeout_names_its_sequence_number")
            // Its second waiter must time out while a peer holds back (review14 finding 4).
            && !c.name.contains("wait_from_another_thread")
            // Its two waiters must stay waiting while a peer holds back (hunt39).
            && !c.name.contains("two_threads_wait_one_work")
    }));
    v
}

/// Compile-time check used by [`harness!`]: names the fix when the type is not a backend.
#[doc(hidden)]
pub const fn assert_backend<B: Backend>() {}

/// The whole downstream API: expands to a `main` that runs every Concord suite on your backend.
///
/// ```ignore
/// concord_suites::harness!(MyBackend, name = "mine");
/// concord_suites::harness!(MyGpuBackend, name = "mygpu", gpus_per_rank = 1);
/// ```
///
/// Put it in a test target with `harness = false`; then `cargo nextest run` / `cargo test` run
/// every case, one test per suite and world size (`mine::suite::matrix::ws4`, one persistent
/// world each), `cargo test --test <target> -- --exact mine::all_reduce::out::f32::sum::ws4`
/// reruns one case (`CONCORD_LIST=cases` lists one test per case, for nextest filters), and
/// `cargo test --test <target> -- --report DIR` writes the conformance report.
///
/// Settings, in any order after `name`: `gpus_per_rank = 1` (GPU backends: cases needing more
/// GPUs than the machine has are skipped with the reason); `catalogue = f` (a
/// `fn() -> Vec<Case<MyBackend>>`) runs your own selection: a slice of [`catalogue`], or
/// [`catalogue`] plus cases of your own; `options = [("key", "value")]` reaches every rank's
/// `WorldInfo::options` (and so your `Backend::init`); `rerun = "..."` replaces the command a
/// failure's rerun line starts with (the case id is appended; `{profile}` becomes the cargo
/// profile flag), for a harness whose options come from the environment: put the variables in
/// it, so that the line reproduces the failure.
#[macro_export]
macro_rules! harness {
    // One setting, in any order after `name` (listed first: `@set` must not reach `$backend:ty`).
    (@set $entry:ident, gpus_per_rank, $v:expr) => {
        $entry.gpus_per_rank = $v;
    };
    (@set $entry:ident, catalogue, $v:expr) => {
        $entry = $entry.with_catalogue::<_>($v);
    };
    (@set $entry:ident, options, $v:expr) => {
        for (k, v) in $v {
            $entry = $entry.with_option(k, v);
        }
    };
    (@set $entry:ident, rerun, $v:expr) => {
        $entry = $entry.with_rerun($v);
    };
    (@set $entry:ident, $other:ident, $v:expr) => {
        compile_error!(concat!(
            "concord_suites::harness!: unknown setting `",
            stringify!($other),
            "`; the settings are `gpus_per_rank = 1`, `catalogue = my_cases`, `options = [(\"key\", \"value\")]` and `rerun = \"MY_ENV=1 cargo test{profile} -p my-crate --test my-test -- --exact\"`"
        ));
    };
    ($backend:ty, name = $name:literal $(, $key:ident = $val:expr)* $(,)?) => {
        const _: () = $crate::assert_backend::<$backend>();
        fn main() {
            #[allow(unused_mut)]
            let mut entry = $crate::BackendEntry::new::<$backend>($name, 0, $crate::catalogue::<$backend>).with_rerun(concat!(
                "cargo test{profile} -p ",
                env!("CARGO_PKG_NAME"),
                " --test ",
                env!("CARGO_CRATE_NAME"),
                " -- --exact"
            ));
            $( $crate::harness!(@set entry, $key, $val); )*
            $crate::main_with(vec![entry])
        }
    };
    ($backend:ty $(,)?) => {
        compile_error!(
            "concord_suites::harness! needs a name for your backend: write `concord_suites::harness!(MyBackend, name = \"mine\");` (the name prefixes every case id, e.g. `mine::all_reduce::out::f32::sum::ws4`)"
        );
        fn main() {}
    };
    ($($other:tt)*) => {
        compile_error!(
            "usage: `concord_suites::harness!(MyBackend, name = \"mine\");`, optionally followed by `gpus_per_rank = 1`, `catalogue = my_cases` (a `fn() -> Vec<concord_suites::Case<MyBackend>>`), `options = [(\"key\", \"value\")]` (handed to every rank's `WorldInfo::options`) and `rerun = \"...\"` (the start of a failure's rerun line), where MyBackend implements concord_core::Backend"
        );
        fn main() {}
    };
}
