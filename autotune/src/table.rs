//! The result of tuning: per op a [`Table`] (choice × per-rank times, reduced time, status,
//! winner, the autotuner's own overhead beyond the timed runs), printable.

use crate::{OpInstance, Policy};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// One rank's report for one choice, as agreed (every rank holds the same).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankStatus {
    /// Passed screening; median of its timed runs (ns). During screening: 0.
    Ok(u64),
    /// Failed on this rank: the cause (`timeout: ..`, `error: ..`, `panicked: ..`, `wrong: ..`).
    Fail(String),
    /// Never reported by the deadline (hung, slow or gone).
    Missing,
}

impl RankStatus {
    pub(crate) fn encode(&self) -> String {
        match self {
            RankStatus::Ok(ns) => format!("ok {ns}"),
            RankStatus::Fail(c) => format!("fail {c}"),
            RankStatus::Missing => "missing".into(),
        }
    }
    pub(crate) fn decode(s: Option<&str>) -> RankStatus {
        match s {
            None | Some("missing") => RankStatus::Missing,
            Some(s) => match s.split_once(' ') {
                Some(("ok", ns)) => RankStatus::Ok(ns.parse().unwrap_or(u64::MAX)),
                Some(("fail", c)) => RankStatus::Fail(c.to_string()),
                _ => RankStatus::Fail(format!("unreadable status `{s}`")),
            },
        }
    }
    /// A timeout or a missing report: the communicator may be unusable afterwards.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RankStatus::Missing) || matches!(self, RankStatus::Fail(c) if c.starts_with("timeout"))
    }
}

/// What became of one choice (the same on every rank).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowStatus {
    /// Timed; its reduced time is in the row.
    Ok,
    /// Inf on every rank: `(rank, cause)` for every rank where it failed or never reported.
    Failed(Vec<(usize, String)>),
    /// Not run (inf): why (an earlier timeout, a missing rank at the pre-sync).
    NotRun(String),
    /// Not applicable to the instance at this world size: skipped by name on every rank.
    Skipped(String),
    /// The agreed cache hit (not benchmarked).
    Cached,
}

/// One choice of one op.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub choice: String,
    /// Per rank: the median of its timed runs (ns), `None` where it failed / never ran.
    pub per_rank_ns: Vec<Option<u64>>,
    /// The policy's reduction of `per_rank_ns`; `None` = inf.
    pub reduced_ns: Option<u64>,
    pub status: RowStatus,
}

/// The tuning of one op instance.
#[derive(Clone, Debug)]
pub struct Table {
    pub inst: OpInstance,
    pub world_size: usize,
    pub policy: Policy,
    pub rows: Vec<Row>,
    pub winner: String,
    /// The default was used because every choice was inf (or the pre-sync failed).
    pub defaulted: bool,
    pub from_cache: bool,
    /// Time in timed runs (this rank).
    pub timed: Duration,
    /// Wall time of this op's tuning on this rank (pre-sync excluded).
    pub elapsed: Duration,
    /// Of `elapsed`, the time spent agreeing through the store (status exchanges, winner).
    pub sync: Duration,
    pub warnings: Vec<String>,
}

impl Table {
    /// The autotuner's own time beyond the timed runs, for this op (pre-sync excluded).
    pub fn overhead(&self) -> Duration {
        self.elapsed.saturating_sub(self.timed)
    }
    pub fn row(&self, choice: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.choice == choice)
    }
    /// Choices that were screened or timed (not skipped, not cached, not "not run").
    pub fn ran(&self) -> usize {
        self.rows.iter().filter(|r| matches!(r.status, RowStatus::Ok | RowStatus::Failed(_))).count()
    }
}

fn fmt_ns(ns: Option<u64>) -> String {
    match ns {
        None => "inf".into(),
        Some(ns) if ns >= 10_000_000 => format!("{:.1}ms", ns as f64 / 1e6),
        Some(ns) => format!("{:.1}us", ns as f64 / 1e3),
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} on {} ranks, policy {}: winner `{}`{}{}  (overhead {:.2} ms beyond {:.2} ms of timed runs, {:.2} ms of it agreeing)",
            self.inst,
            self.world_size,
            self.policy.name(),
            self.winner,
            if self.defaulted { " (default)" } else { "" },
            if self.from_cache { " (cache)" } else { "" },
            self.overhead().as_secs_f64() * 1e3,
            self.timed.as_secs_f64() * 1e3,
            self.sync.as_secs_f64() * 1e3
        )?;
        write!(f, "  {:<22} {:>10}", "choice", self.policy.name())?;
        for r in 0..self.world_size {
            write!(f, " {:>10}", format!("rank{r}"))?;
        }
        writeln!(f, "  status")?;
        for row in &self.rows {
            write!(f, "  {:<22} {:>10}", row.choice, fmt_ns(row.reduced_ns))?;
            for r in 0..self.world_size {
                write!(f, " {:>10}", fmt_ns(row.per_rank_ns.get(r).copied().flatten()))?;
            }
            let status = match &row.status {
                RowStatus::Ok => "ok".to_string(),
                RowStatus::Failed(c) => {
                    format!("inf: {}", c.iter().map(|(r, c)| format!("rank {r}: {c}")).collect::<Vec<_>>().join("; "))
                }
                RowStatus::NotRun(w) => format!("not run: {w}"),
                RowStatus::Skipped(w) => format!("skipped: {w}"),
                RowStatus::Cached => "cached".into(),
            };
            writeln!(f, "  {status}{}", if row.choice == self.winner { "  <- winner" } else { "" })?;
        }
        for w in &self.warnings {
            writeln!(f, "  warning: {w}")?;
        }
        Ok(())
    }
}

/// The result of one `tune` call.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub tables: Vec<Table>,
    /// Warnings not tied to one op (no store, missing ranks at the pre-sync).
    pub warnings: Vec<String>,
    /// Pre-syncs paid (one per call, zero outside a world).
    pub presyncs: usize,
    pub presync_time: Duration,
    /// Ranks missing at the pre-sync deadline.
    pub missing: Vec<usize>,
    /// Wall time of the whole call on this rank.
    pub elapsed: Duration,
}

impl Outcome {
    pub fn winner(&self, i: usize) -> &str {
        &self.tables[i].winner
    }
    /// Every warning: the call's, then each op's.
    pub fn all_warnings(&self) -> Vec<String> {
        let mut v = self.warnings.clone();
        v.extend(self.tables.iter().flat_map(|t| t.warnings.iter().cloned()));
        v
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        for t in &self.tables {
            write!(f, "{t}")?;
        }
        writeln!(
            f,
            "{} op(s), {} pre-sync(s) ({:.2} ms), {:.2} ms in all",
            self.tables.len(),
            self.presyncs,
            self.presync_time.as_secs_f64() * 1e3,
            self.elapsed.as_secs_f64() * 1e3
        )
    }
}
