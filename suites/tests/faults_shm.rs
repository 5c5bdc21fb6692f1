//! The fault suite alone on the shared-memory backend: a small binary (one catalogue, one
//! backend) to run the failure-path cases quickly. The same cases run in the built-in
//! conformance binary (`cargo xtask conformance --backend shm --filter faults::`).
//!
//! `cargo test --profile ci -p concord-suites --test faults_shm`

fn main() {
    let entry = concord_suites::BackendEntry::new::<concord_shm::ShmBackend>("shm", 0, concord_suites::suites::faults::cases)
        .with_rerun("cargo test --profile ci -p concord-suites --test faults_shm -- --exact");
    concord_suites::main_with(vec![entry])
}
