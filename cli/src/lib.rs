//! # concord-cli
//!
//! **One job:** the front end over the built-in backends: their registry ([`builtin_entries`])
//! and the conformance binary (`tests/conformance.rs`, run by `cargo xtask conformance` and by
//! nextest). The engine — catalogue, checks, runner modes, report, `harness!` — is
//! `concord-suites`, which depends on no backend; this crate is the only one that depends on
//! all of them.
#![forbid(unsafe_code)]

use concord_suites::{catalogue, shape_catalogue, BackendEntry};

/// The backends built into Concord: `shm` (the embedded CPU default), `fake` (no communication,
/// value-independent subset), `nccl` (one GPU per rank; gated on the GPU count) and, with the
/// `mpi` feature, `mpi` (ranks started by mpirun).
pub fn builtin_entries() -> Vec<BackendEntry> {
    #[allow(unused_mut)]
    let mut v = vec![
        // The fused suite checks shm's pipelined path at every size (not only where `auto`
        // would choose it on this machine).
        BackendEntry::new::<concord_shm::ShmBackend>("shm", 0, catalogue::<concord_shm::ShmBackend>)
            .with_option("fused_pipeline", "always"),
        BackendEntry::new::<concord_fake::FakeBackend>("fake", 0, shape_catalogue::<concord_fake::FakeBackend>),
        // NCCL's own segments (`/dev/shm/nccl-XXXXXX`) stay behind when ranks are killed mid-op:
        // the backend declares their prefix (`Backend::SHM_PREFIXES`) and the runner sweeps.
        BackendEntry::new::<concord_nccl::NcclBackend>("nccl", 1, catalogue::<concord_nccl::NcclBackend>),
    ];
    #[cfg(feature = "mpi")]
    v.push(BackendEntry::new::<concord_mpi::MpiBackend>("mpi", 0, catalogue::<concord_mpi::MpiBackend>));
    v
}

#[cfg(test)]
mod tests {
    use concord_suites::case::building_for_world_size;
    use concord_suites::{catalogue, shape_catalogue, Case};

    fn ids_of<B: concord_core::Backend>(cases: Vec<Case<B>>, ws: usize) -> Vec<String> {
        let mut v: Vec<String> = cases.into_iter().filter(|c| c.world_size == ws).map(|c| c.name).collect();
        v.sort();
        v
    }

    /// A worker builds its catalogue with its world size as a hint (`building_for_world_size`):
    /// the cases of that size are exactly the whole catalogue's, at every world size it has.
    #[test]
    fn a_world_size_hint_builds_every_case_of_that_size() {
        type S = concord_shm::ShmBackend;
        let all = catalogue::<S>();
        let mut sizes: Vec<usize> = all.iter().map(|c| c.world_size).collect();
        sizes.sort();
        sizes.dedup();
        assert!(sizes.len() >= 10, "{sizes:?}");
        for &ws in &sizes {
            let hinted = building_for_world_size(ws, catalogue::<S>);
            assert_eq!(ids_of(hinted, ws), ids_of(all.clone(), ws), "world size {ws}");
        }
        // The hint is gone after the build.
        assert_eq!(catalogue::<S>().len(), all.len());
        let shapes = shape_catalogue::<concord_fake::FakeBackend>();
        for ws in [1, 2, 3, 16] {
            let hinted = building_for_world_size(ws, shape_catalogue::<concord_fake::FakeBackend>);
            assert_eq!(ids_of(hinted, ws), ids_of(shapes.clone(), ws), "fake, world size {ws}");
        }
    }
}
