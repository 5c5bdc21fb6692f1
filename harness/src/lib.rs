//! # concord-harness
//!
//! **One job:** run one worker process per rank and bring every rank's outcome back, with
//! nothing left running or on disk afterwards. Also: GPU gating, and the settings. (The store the
//! ranks rendezvous through is its own crate, `concord-store`.)
//!
//! Modules: [`config`] (every setting, read once; the deadline rule), [`declared`] (every rank's
//! capabilities compared with rank 0's at a world's setup), [`outcome`] (what a rank reports), [`launch`] (the public launcher: a program once per rank, for benches and
//! multi-process tests), [`verdict`] (the typed
//! verdict over every rank, the rank state machine), [`worker`] (the child side),
//! [`runner`] (the parent side: worlds, deadlines, teardown), [`external`] (a rank started by
//! torchrun / mpirun / srun: rendezvous, steps and verdicts over the TCP store), [`gpu`] (GPU counting),
//! [`platform`] (every Linux-specific call), [`pipe`] (a stdout reader that leaves early ends the
//! program quietly).
//!
//! # Using it
//! A binary that runs cases MUST start `main` with
//! `if let Some(env) = worker::WorkerEnv::from_env() { worker::serve(env, setup, run_case) }`:
//! the runner re-executes the same binary as each rank. The parent side calls
//! [`runner::Pool::run_case`] from any number of threads and [`runner::Pool::shutdown`] at the end.
//! Backends MUST start the names of their shared-memory objects with
//! [`concord_core::world_prefix`] (what [`platform::shm_prefix`] returns; backends do not depend on
//! this crate) so the runner can sweep them after a world ends.

pub mod config;
pub mod declared;
pub mod external;
pub mod gpu;
pub mod launch;
pub mod outcome;
pub mod pipe;
pub mod platform;
pub mod runner;
pub mod verdict;
pub mod worker;

/// `1 case`, `2 cases`: a count and its noun, singular for one (messages say "1 case", not
/// "1 cases").
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn count_is_singular_for_one() {
        assert_eq!(super::count(1, "case", "cases"), "1 case");
        assert_eq!(super::count(0, "case", "cases"), "0 cases");
        assert_eq!(super::count(2, "rank", "ranks"), "2 ranks");
    }
}
