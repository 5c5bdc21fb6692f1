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

/// The contract's text and the map agree: every `[clause: id]` tag of `core/src/backend.rs` is a
/// clause of the map, and every clause the map sources from that file is tagged there.
#[test]
fn the_contract_text_and_the_map_name_the_same_clauses() {
    let text = include_str!("../../core/src/backend.rs");
    let tagged: Vec<&str> = text.split("[clause: ").skip(1).filter_map(|t| t.split(']').next()).collect();
    let map = concord_suites::contract::CLAUSES;
    let unknown: Vec<&&str> = tagged.iter().filter(|t| !map.iter().any(|c| c.id == **t)).collect();
    assert!(unknown.is_empty(), "tags in core/src/backend.rs with no clause in the map: {unknown:?}");
    let untagged: Vec<&str> = map.iter().filter(|c| c.source == "core/src/backend.rs" && !tagged.contains(&c.id)).map(|c| c.id).collect();
    assert!(untagged.is_empty(), "clauses sourced from core/src/backend.rs but not tagged there: {untagged:?}");
}
