//! The conformance binary as a plain executable (the same `main` as `tests/conformance.rs`), for
//! launchers, which want a fixed path: `mpirun -np 4 target/release/concord-conformance
//! --backend shm`, `torchrun --nproc-per-node 4 --no-python target/release/concord-conformance
//! --backend nccl`, `srun … concord-conformance --backend shm`. Without a launcher it is the
//! libtest-mimic test binary (or conformance mode with `--report DIR`).
fn main() {
    concord_suites::main_with(concord_cli::builtin_entries())
}
