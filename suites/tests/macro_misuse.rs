//! Misusing `harness!` is a compile error that says how to fix it (trybuild UI tests; the
//! expected messages are in `tests/ui/*.stderr`).
#[test]
fn harness_macro_misuse_explains_the_fix() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
