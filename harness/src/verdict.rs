//! Typed verdicts: what the runner concludes about one case over every rank.
//!
//! A rank *reports* an [`Outcome`] (its own view: passed, a failed check with its message,
//! skipped, unsupported). The runner watches each rank through a small state machine
//! ([`RankState`]) and folds what it saw into one [`Verdict`]. A failed verdict is a list of
//! [`Failure`]s, each carrying the rank it blames, so callers (the report, the self-test,
//! summaries) read fields, never substrings of a message.

use crate::outcome::Outcome;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where one rank is in one case, as the runner sees it.
///
/// ```text
/// Spawning ─► Ready ─► Running ─┬─► Reported ─────────────────────┐
///                               ├─► Exited (crash / panic / EOF)  ├─► Reaped | kept Ready
///                               └─► Terminating (deadline, peer) ─┘
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankState {
    /// Its process is being started (world setup).
    Spawning,
    /// Rendezvous and setup done; waiting for a case.
    Ready,
    /// The case was sent; no outcome yet.
    Running,
    /// It sent its outcome and is still alive.
    Reported,
    /// Its process ended during the case (with or without an outcome).
    Exited,
    /// The runner gave up on it (case deadline, or a peer failed) and is ending it.
    Terminating,
    /// Its process was reaped.
    Reaped,
}

impl RankState {
    /// No further event is awaited from this rank for the case.
    pub fn settled(self) -> bool {
        matches!(self, RankState::Reported | RankState::Exited | RankState::Reaped)
    }
}

/// Why a case failed, blamed on one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Failure {
    /// The rank's own checks failed; `message` is what it reported (value, error or contract).
    Reported { rank: usize, message: String },
    /// The rank panicked in the case body (it reported the panic, then exited).
    Panicked { rank: usize, message: String, exit: String },
    /// The rank's process ended without a (final) outcome: signal, abort, non-zero exit.
    Crashed { rank: usize, exit: String, reported: Option<String> },
    /// No outcome by the case deadline (or, `abandoned`, by the time another rank had failed);
    /// `state` is the rank's own answer to "what are you doing".
    TimedOut { rank: usize, deadline_ms: u64, abandoned: bool, state: String },
    /// The rank broke the runner protocol (a line that is not a message, an unexpected message,
    /// a closed pipe).
    Protocol { rank: usize, detail: String },
    /// World setup (spawn, rendezvous, backend init) failed on this rank.
    Setup { rank: usize, detail: String },
}

impl Failure {
    /// The rank this failure blames.
    pub fn rank(&self) -> usize {
        match self {
            Failure::Reported { rank, .. }
            | Failure::Panicked { rank, .. }
            | Failure::Crashed { rank, .. }
            | Failure::TimedOut { rank, .. }
            | Failure::Protocol { rank, .. }
            | Failure::Setup { rank, .. } => *rank,
        }
    }

    /// Stable name of the failure kind (`reported`, `panicked`, `crashed`, `timed_out`,
    /// `protocol`, `setup`).
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Reported { .. } => "reported",
            Failure::Panicked { .. } => "panicked",
            Failure::Crashed { .. } => "crashed",
            Failure::TimedOut { .. } => "timed_out",
            Failure::Protocol { .. } => "protocol",
            Failure::Setup { .. } => "setup",
        }
    }

    /// Ranks that only failed because another rank failed first (abandoned waits) are
    /// bystanders: the first line of a failure names the culprit, not them.
    pub fn is_bystander(&self) -> bool {
        matches!(self, Failure::TimedOut { abandoned: true, .. })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Reported { rank, message } => write!(f, "rank {rank}: {message}"),
            Failure::Panicked { rank, message, exit } => write!(f, "rank {rank} panicked: {message} ({exit})"),
            Failure::Crashed { rank, exit, reported: None } => write!(f, "rank {rank} crashed: {exit} before reporting an outcome"),
            Failure::Crashed { rank, exit, reported: Some(o) } => write!(f, "rank {rank} reported {o} but then died: {exit}"),
            Failure::TimedOut { rank, deadline_ms, abandoned: false, state } => {
                write!(f, "rank {rank}: no outcome within the {deadline_ms} ms deadline; state: {state}")
            }
            Failure::TimedOut { rank, abandoned: true, state, .. } => {
                write!(f, "rank {rank}: no outcome; abandoned after another rank failed; state: {state}")
            }
            Failure::Protocol { rank, detail } => write!(f, "rank {rank}: {detail}"),
            Failure::Setup { rank, detail } => write!(f, "rank {rank}: {detail}"),
        }
    }
}

/// The verdict of one case over all ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum Verdict {
    Passed,
    /// At least one failure; culprits first, bystanders (abandoned ranks) last.
    Failed(Vec<Failure>),
    /// The case does not apply here; the reason says why.
    Skipped(String),
    /// The backend declares it does not support what the case exercises.
    Unsupported(String),
}

/// The four statuses of a verdict, for counting and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Unsupported,
    Skipped,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Unsupported => "unsupported",
            Status::Skipped => "skipped",
        }
    }
}

impl Verdict {
    /// A failed verdict, ordered culprits first (then by rank).
    pub fn failed(mut failures: Vec<Failure>) -> Verdict {
        failures.sort_by_key(|f| (f.is_bystander(), f.rank()));
        Verdict::Failed(failures)
    }

    pub fn status(&self) -> Status {
        match self {
            Verdict::Passed => Status::Passed,
            Verdict::Failed(_) => Status::Failed,
            Verdict::Skipped(_) => Status::Skipped,
            Verdict::Unsupported(_) => Status::Unsupported,
        }
    }

    pub fn is_failed(&self) -> bool {
        matches!(self, Verdict::Failed(_))
    }

    pub fn label(&self) -> &'static str {
        self.status().label()
    }

    /// The failures (empty unless failed).
    pub fn failures(&self) -> &[Failure] {
        match self {
            Verdict::Failed(f) => f,
            _ => &[],
        }
    }

    /// The ranks blamed, culprits first.
    pub fn failing_ranks(&self) -> Vec<usize> {
        let mut v: Vec<usize> = Vec::new();
        for f in self.failures() {
            if !v.contains(&f.rank()) {
                v.push(f.rank());
            }
        }
        v
    }

    /// One line per failure, or the skip / unsupported reason; empty when passed.
    pub fn detail(&self) -> String {
        match self {
            Verdict::Passed => String::new(),
            Verdict::Failed(f) => f.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("\n"),
            Verdict::Skipped(r) | Verdict::Unsupported(r) => r.clone(),
        }
    }

    /// Folds the outcomes of healthy ranks (every rank reported and none crashed): any failed
    /// check → [`Verdict::Failed`] (one [`Failure::Reported`] per failing rank), else any skip →
    /// that skip, else all unsupported → that, else passed.
    pub fn fold(outcomes: &[(usize, Outcome)]) -> Verdict {
        let failures: Vec<Failure> = outcomes
            .iter()
            .filter_map(|(r, o)| match o {
                Outcome::Failed(m) => Some(Failure::Reported { rank: *r, message: m.clone() }),
                _ => None,
            })
            .collect();
        if !failures.is_empty() {
            return Verdict::failed(failures);
        }
        if let Some((_, Outcome::Skipped(r))) = outcomes.iter().find(|(_, o)| matches!(o, Outcome::Skipped(_))) {
            return Verdict::Skipped(r.clone());
        }
        if let Some((_, Outcome::Unsupported(r))) = outcomes.first() {
            if outcomes.iter().all(|(_, o)| matches!(o, Outcome::Unsupported(_))) {
                return Verdict::Unsupported(r.clone());
            }
        }
        Verdict::Passed
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Passed => write!(f, "passed"),
            v => write!(f, "{}: {}", v.label(), v.detail()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding() {
        let table: [(Vec<Outcome>, &str); 7] = [
            (vec![Outcome::Passed, Outcome::Passed], "passed"),
            (vec![Outcome::Passed, Outcome::Failed("x".into())], "failed"),
            (vec![Outcome::Skipped("s".into()), Outcome::Failed("x".into())], "failed"),
            (vec![Outcome::Passed, Outcome::Skipped("s".into())], "skipped"),
            (vec![Outcome::Unsupported("u".into()), Outcome::Unsupported("u".into())], "unsupported"),
            (vec![Outcome::Unsupported("u".into()), Outcome::Passed], "passed"),
            (vec![Outcome::Unsupported("u".into()), Outcome::Skipped("s".into())], "skipped"),
        ];
        for (v, want) in table {
            let ranked: Vec<_> = v.clone().into_iter().enumerate().collect();
            assert_eq!(Verdict::fold(&ranked).label(), want, "{v:?}");
        }
    }

    #[test]
    fn failures_carry_their_rank() {
        let v = Verdict::fold(&[(0, Outcome::Failed("bad".into())), (10, Outcome::Failed("worse".into())), (1, Outcome::Passed)]);
        assert_eq!(v.failing_ranks(), vec![0, 10]);
        assert_eq!(v.detail(), "rank 0: bad\nrank 10: worse");
    }

    #[test]
    fn culprits_come_before_bystanders() {
        let v = Verdict::failed(vec![
            Failure::TimedOut { rank: 0, deadline_ms: 100, abandoned: true, state: "in barrier #3".into() },
            Failure::Reported { rank: 2, message: "wrong value".into() },
        ]);
        assert_eq!(v.failing_ranks(), vec![2, 0]);
        assert!(v.detail().starts_with("rank 2: wrong value"));
    }

    #[test]
    fn serde_roundtrip() {
        let v = Verdict::failed(vec![Failure::Crashed { rank: 1, exit: "killed by signal SIGSEGV".into(), reported: None }]);
        let s = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<Verdict>(&s).unwrap(), v);
    }
}
