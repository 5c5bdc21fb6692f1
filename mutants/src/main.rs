//! `cargo xtask mutants`: the mutation campaign (see `concord_mutants::campaign`).
fn main() {
    // A reader that leaves early (`--list | head`): exit 141, no backtrace (`concord_harness::pipe`).
    concord_harness::pipe::main_quiet_on_broken_pipe(concord_mutants::campaign::main)
}
