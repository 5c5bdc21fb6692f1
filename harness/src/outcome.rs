//! What one rank reports for one case (its own view; the runner's typed verdict over every rank
//! is [`crate::verdict::Verdict`]).

use serde::{Deserialize, Serialize};

/// The outcome of one case on one rank, as the rank reports it.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_roundtrip() {
        let o = Outcome::Skipped("needs 2 GPUs".into());
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Outcome>(&s).unwrap(), o);
    }
}
