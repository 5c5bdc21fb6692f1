//! Self-test of the contract map: every clause of the contract has at least one case of the
//! catalogue for each of its patterns (on the embedded backend, which runs the whole catalogue).
#[test]
fn every_clause_has_a_case() {
    let ids: Vec<String> = concord_suites::catalogue::<concord_shm::ShmBackend>().into_iter().map(|c| c.name).collect();
    let holes: Vec<String> = concord_suites::contract::coverage(&ids)
        .into_iter()
        .filter(|(_, _, holes)| !holes.is_empty())
        .map(|(c, _, holes)| format!("{}: no case matches {}", c.id, holes.join(", ")))
        .collect();
    assert!(holes.is_empty(), "clauses without a case:\n{}", holes.join("\n"));
}
