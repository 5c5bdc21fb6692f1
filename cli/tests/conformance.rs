//! The built-in conformance binary: every suite on every built-in backend. Under nextest
//! (`cargo nextest run -p concord-cli --test conformance`) one test per (backend, suite, world
//! size), each in one persistent world; `cargo xtask conformance --backend shm` runs it in
//! conformance mode with a report.
fn main() {
    concord_suites::main_with(concord_cli::builtin_entries())
}
