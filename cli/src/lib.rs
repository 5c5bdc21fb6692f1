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
