//! The built-in conformance binary: every suite on every built-in backend, one libtest-mimic
//! trial per case (`cargo nextest run -p concord-suites --test conformance`), or the full
//! conformance run with a report (`cargo xtask conformance --backend shm`).
fn main() {
    concord_suites::main_with(concord_suites::builtin_entries())
}
