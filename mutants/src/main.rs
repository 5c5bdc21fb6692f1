//! `cargo xtask mutants`: the mutation campaign (see `concord_mutants::campaign`).
fn main() {
    concord_mutants::campaign::main()
}
