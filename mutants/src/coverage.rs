//! Per-clause coverage of the campaign. Every mutant names the contract clause its bug breaks
//! (the most specific one): a `[clause: id]` tag of `core/src/backend.rs`, parsed by
//! [`concord_suites::contract::contract_clause_ids`] (the one parser, shared with the contract
//! map's self-test). Every clause id has at least one mutant, or is on [`EXEMPT`] with the reason
//! no mutant can break it. The failure-path clauses (`faults.*`) have theirs on the reference
//! launch-based backend ([`crate::stream`], [`crate::bugs_stream`]), since their hooks are not
//! shm's. [`problems`] lists what breaks
//! that rule (the `fast` test fails on any); [`render`] is the table `cargo xtask mutants` prints.

use crate::campaign::{Finding, Spec};
use concord_suites::contract::contract_clause_ids;

/// Clauses no mutant covers, each with the reason. A clause that is both exempt and covered is a
/// problem too (drop the exemption once a mutant exists).
pub const EXEMPT: &[(&str, &str)] = &[(
    "seeds.pytorch",
    "not a behaviour of its own: it names PyTorch's test file, whose checks are those of other clauses \
         (shapes, quiescence, async, values); a bug that breaks it breaks one of those and is labelled there \
         (the most specific clause), while the seed cases still run against every mutant",
)];

/// One clause of the contract in the campaign.
#[derive(Clone, Debug)]
pub struct Row {
    pub clause: &'static str,
    /// Mutants labelled with the clause, in catalogue order.
    pub mutants: Vec<&'static str>,
    pub exempt: Option<&'static str>,
}

/// Every clause id of the contract with its mutants and exemption.
pub fn rows(specs: &[Spec]) -> Vec<Row> {
    contract_clause_ids()
        .into_iter()
        .map(|clause| Row {
            clause,
            mutants: specs.iter().filter(|s| s.clause == clause).map(|s| s.name).collect(),
            exempt: EXEMPT.iter().find(|(c, _)| *c == clause).map(|(_, why)| *why),
        })
        .collect()
}

/// What breaks the rule: a mutant naming no clause id of the contract, a clause with neither a
/// mutant nor an exemption, an exemption of a covered clause or of no clause. Empty when all holds.
pub fn problems(specs: &[Spec]) -> Vec<String> {
    let ids = contract_clause_ids();
    let mut out: Vec<String> = specs
        .iter()
        .filter(|s| !ids.contains(&s.clause))
        .map(|s| format!("mutant {} names `{}`, which is no `[clause: id]` of core/src/backend.rs", s.name, s.clause))
        .collect();
    for (c, _) in EXEMPT {
        if !ids.contains(c) {
            out.push(format!("exemption of `{c}`, which is no clause of core/src/backend.rs"));
        }
    }
    for r in rows(specs) {
        match (r.mutants.is_empty(), r.exempt.is_some()) {
            (true, false) => out.push(format!("clause {} has no mutant and no exemption", r.clause)),
            (false, true) => {
                out.push(format!("clause {} is exempt but has mutants ({}): drop the exemption", r.clause, r.mutants.join(", ")))
            }
            _ => {}
        }
    }
    out
}

/// The per-clause table: each clause's mutants (caught / run, from `found`) or its exemption, then
/// the totals.
pub fn render(specs: &[Spec], found: &[Finding]) -> String {
    let rows = rows(specs);
    let w = rows.iter().map(|r| r.clause.len()).max().unwrap_or(6);
    let mut out = format!(
        "\nper-clause coverage (clause ids of core/src/backend.rs):\n{:<w$}  {:>7}  {:>6}  mutants / exemption\n",
        "clause", "mutants", "caught"
    );
    for r in &rows {
        let run: Vec<&Finding> = found.iter().filter(|f| r.mutants.contains(&f.name)).collect();
        let caught = run.iter().filter(|f| f.caught.is_some()).count();
        let (n, c, what) = if r.mutants.is_empty() {
            ("-".to_string(), "-".to_string(), format!("EXEMPT: {}", r.exempt.unwrap_or("NONE (no mutant, no exemption)")))
        } else {
            (r.mutants.len().to_string(), format!("{caught}/{}", run.len()), r.mutants.join(", "))
        };
        out += &format!("{:<w$}  {n:>7}  {c:>6}  {what}\n", r.clause);
    }
    let covered = rows.iter().filter(|r| !r.mutants.is_empty()).count();
    let exempt = rows.iter().filter(|r| r.mutants.is_empty() && r.exempt.is_some()).count();
    let holes = rows.len() - covered - exempt;
    out += &format!("clauses: {} — {covered} with a mutant, {exempt} exempt, {holes} with neither\n", rows.len());
    out
}
