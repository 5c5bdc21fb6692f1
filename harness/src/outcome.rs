//! What one rank reports for one case, and how the runner folds the ranks' reports into one
//! verdict.

use serde::{Deserialize, Serialize};

/// The outcome of one case on one rank (or, folded, on the whole world).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Outcome {
    Passed,
    /// The case ran and found a fault; the message says what and where.
    Failed(String),
    /// The case does not apply here (e.g. not enough GPUs); the reason says why.
    Skipped(String),
    /// The backend declares it does not support what the case exercises.
    Unsupported(String),
}

impl Outcome {
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }

    /// Short label: `passed`, `failed`, `skipped`, `unsupported`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed(_) => "failed",
            Outcome::Skipped(_) => "skipped",
            Outcome::Unsupported(_) => "unsupported",
        }
    }

    /// The message or reason, empty for `Passed`.
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Passed => "",
            Outcome::Failed(m) | Outcome::Skipped(m) | Outcome::Unsupported(m) => m,
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Passed => write!(f, "passed"),
            o => write!(f, "{}: {}", o.label(), o.detail()),
        }
    }
}

/// `msg` attributed to rank `rank`: unchanged when it already starts by naming that rank
/// (`rank 1 panicked: ..`; `rank 10 ..` does not name rank 1), else prefixed with `rank <rank>: `.
pub fn blame(rank: usize, msg: &str) -> String {
    let names_rank = msg
        .strip_prefix(&format!("rank {rank}"))
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()));
    if names_rank {
        msg.to_string()
    } else {
        format!("rank {rank}: {msg}")
    }
}

/// Folds per-rank outcomes (all ranks healthy) into one: any `Failed` → `Failed` (messages of
/// every failing rank, each prefixed by its rank unless it already names it), else any
/// `Skipped` → that `Skipped`, else all `Unsupported` → that `Unsupported`, else `Passed`.
pub fn aggregate(outcomes: &[(usize, Outcome)]) -> Outcome {
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(r, o)| match o {
            Outcome::Failed(m) => Some(blame(*r, m)),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        return Outcome::Failed(failures.join("\n"));
    }
    if let Some((_, o)) = outcomes.iter().find(|(_, o)| matches!(o, Outcome::Skipped(_))) {
        return o.clone();
    }
    if !outcomes.is_empty() && outcomes.iter().all(|(_, o)| matches!(o, Outcome::Unsupported(_))) {
        return outcomes[0].1.clone();
    }
    Outcome::Passed
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(vec![Outcome::Passed, Outcome::Passed], "passed")]
    #[case(vec![Outcome::Passed, Outcome::Failed("x".into())], "failed")]
    #[case(vec![Outcome::Skipped("s".into()), Outcome::Failed("x".into())], "failed")]
    #[case(vec![Outcome::Passed, Outcome::Skipped("s".into())], "skipped")]
    #[case(vec![Outcome::Unsupported("u".into()), Outcome::Unsupported("u".into())], "unsupported")]
    #[case(vec![Outcome::Unsupported("u".into()), Outcome::Passed], "passed")]
    #[case(vec![Outcome::Unsupported("u".into()), Outcome::Skipped("s".into())], "skipped")]
    fn folding(#[case] v: Vec<Outcome>, #[case] want: &str) {
        let ranked: Vec<_> = v.into_iter().enumerate().collect();
        assert_eq!(aggregate(&ranked).label(), want);
    }

    #[test]
    fn failure_names_rank_once() {
        let o = aggregate(&[(0, Outcome::Failed("bad".into())), (1, Outcome::Failed("rank 1 panicked: x".into()))]);
        assert_eq!(o, Outcome::Failed("rank 0: bad\nrank 1 panicked: x".into()));
    }

    #[test]
    fn blame_does_not_confuse_rank_1_with_rank_10() {
        assert_eq!(blame(1, "rank 1 panicked: x"), "rank 1 panicked: x");
        assert_eq!(blame(1, "rank 1: bad"), "rank 1: bad");
        assert_eq!(blame(1, "rank 10 sent nothing"), "rank 1: rank 10 sent nothing");
        assert_eq!(blame(0, "bad"), "rank 0: bad");
    }

    #[test]
    fn serde_roundtrip() {
        let o = Outcome::Skipped("needs 2 GPUs".into());
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Outcome>(&s).unwrap(), o);
    }
}
