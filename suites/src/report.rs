//! The conformance report: a matrix (op × variant × dtype → pass / fail / unsupported / skip) as
//! Markdown and JSON, and the closing line `N passed, M failed, K skipped`.

use crate::case::CaseMeta;
use crate::run::CaseInfo;
use concord_harness::verdict::{Status, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One case in the report (a stable part of the JSON schema, see [`SCHEMA_VERSION`]).
#[derive(Clone, Debug, Serialize)]
pub struct CaseRecord {
    pub id: String,
    pub backend: String,
    pub world_size: usize,
    pub meta: CaseMeta,
    pub status: Status,
    /// The ranks a failure blames, culprits first (empty unless failed).
    pub failing_ranks: Vec<usize>,
    /// The kind of each failure (`reported`, `panicked`, `crashed`, `timed_out`, `protocol`,
    /// `setup`), one per failure, culprits first (as the verdict lists them).
    pub failure_kinds: Vec<&'static str>,
    /// The whole failure message (with its rerun line), or the skip / unsupported reason.
    pub detail: String,
    pub seconds: f64,
    /// Under `CONCORD_CASE_CPU=1` only (absent otherwise): where the case's CPU went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuRecord>,
}

/// A case's CPU (user + sys, seconds) under `CONCORD_CASE_CPU=1`
/// ([`concord_harness::runner::CaseCpu`]).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CpuRecord {
    /// Every rank's process from `run` to its outcome, summed.
    pub body: f64,
    /// Every rank's process from its previous outcome (or `Ready`) to this one, summed: the body
    /// plus what the ranks spent between cases.
    pub ranks: f64,
    /// The ranks' CPU up to `Ready` when the world was spawned for this case (else 0).
    pub spawn: f64,
    /// The runner's thread that ran the case.
    pub runner: f64,
    /// How many ranks reported a measure.
    pub ranks_measured: usize,
}

impl CaseRecord {
    pub fn new(backend: &str, case: &CaseInfo, verdict: &Verdict, failure: &str, elapsed: Duration) -> CaseRecord {
        let detail = match verdict {
            Verdict::Passed => String::new(),
            Verdict::Failed(_) => failure.to_string(),
            Verdict::Unsupported(r) | Verdict::Skipped(r) => r.clone(),
        };
        CaseRecord {
            id: case.id.clone(),
            backend: backend.to_string(),
            world_size: case.world_size,
            meta: case.meta.clone(),
            status: verdict.status(),
            failing_ranks: verdict.failing_ranks(),
            failure_kinds: verdict.failures().iter().map(|f| f.kind()).collect(),
            detail,
            seconds: elapsed.as_secs_f64(),
            cpu: None,
        }
    }

    /// The record with the case's CPU, when it was measured.
    pub fn with_cpu(mut self, cpu: Option<concord_harness::runner::CaseCpu>) -> CaseRecord {
        self.cpu = cpu.map(|c| CpuRecord {
            body: c.ranks_body.as_secs_f64(),
            ranks: c.ranks_since.as_secs_f64(),
            spawn: c.spawn.as_secs_f64(),
            runner: c.runner.as_secs_f64(),
            ranks_measured: c.ranks,
        });
        self
    }
}

/// Version of the JSON report's schema (`conformance.json`'s `schema_version`): bumped on any
/// change that renames or removes a field; adding a field keeps it.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
pub struct Report {
    pub cases: Vec<CaseRecord>,
    pub wall_seconds: f64,
    /// Under `CONCORD_CASE_CPU=1`: the runner process's own CPU (every thread: lanes, spawner,
    /// pipe readers; not its reaped ranks), in the JSON as `runner_cpu_seconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_cpu_seconds: Option<f64>,
}

#[derive(Default, Serialize, Clone, Copy)]
struct Counts {
    passed: usize,
    failed: usize,
    unsupported: usize,
    skipped: usize,
}

impl Counts {
    fn add(&mut self, status: Status) {
        match status {
            Status::Passed => self.passed += 1,
            Status::Failed => self.failed += 1,
            Status::Unsupported => self.unsupported += 1,
            Status::Skipped => self.skipped += 1,
        }
    }
    fn cell(&self) -> String {
        if self.failed > 0 {
            format!("**FAIL {}**/{}", self.failed, self.total())
        } else if self.passed == self.total() {
            format!("pass {}", self.passed)
        } else if self.passed == 0 && self.unsupported > 0 && self.skipped == 0 {
            "unsupported".into()
        } else if self.passed == 0 && self.unsupported == 0 {
            "skip".into()
        } else {
            format!("pass {} / unsup {} / skip {}", self.passed, self.unsupported, self.skipped)
        }
    }
    fn total(&self) -> usize {
        self.passed + self.failed + self.unsupported + self.skipped
    }
}

impl Report {
    pub fn new(cases: Vec<CaseRecord>, wall: Duration) -> Report {
        Report { cases, wall_seconds: wall.as_secs_f64(), runner_cpu_seconds: None }
    }

    fn totals(&self) -> Counts {
        let mut c = Counts::default();
        for r in &self.cases {
            c.add(r.status);
        }
        c
    }

    pub fn failed(&self) -> usize {
        self.totals().failed
    }

    /// The closing lines. The last one is `N passed, M failed, K skipped` (K counts unsupported
    /// cases too; the line before breaks them out).
    pub fn summary_text(&self) -> String {
        let t = self.totals();
        let mut s = String::new();
        for r in self.cases.iter().filter(|r| r.status == Status::Failed) {
            s.push_str(&format!("failed: {}\n", r.id));
        }
        s.push_str(&format!(
            "{} in {:.1} s: {} passed, {} failed, {} unsupported (declared by the backend), {} skipped\n",
            concord_harness::count(t.total(), "case", "cases"),
            self.wall_seconds,
            t.passed,
            t.failed,
            t.unsupported,
            t.skipped
        ));
        s.push_str(&format!("{} passed, {} failed, {} skipped\n", t.passed, t.failed, t.unsupported + t.skipped));
        s
    }

    /// The matrix: rows `suite op variant`, columns dtypes.
    pub fn markdown(&self) -> String {
        let mut dtypes: Vec<String> = self.cases.iter().map(|c| c.meta.dtype.clone()).filter(|d| !d.is_empty()).collect();
        dtypes.sort_by_key(|d| concord_core::DType::from_name(d).map(|x| x as usize).unwrap_or(99));
        dtypes.dedup();
        let mut cols = dtypes.clone();
        cols.push("-".into());
        let mut rows: BTreeMap<(String, String, String, String), BTreeMap<String, Counts>> = BTreeMap::new();
        let mut backends: BTreeMap<String, Counts> = BTreeMap::new();
        for c in &self.cases {
            let key = (c.backend.clone(), c.meta.suite.clone(), c.meta.op.clone(), c.meta.variant.clone());
            let col = if c.meta.dtype.is_empty() { "-".to_string() } else { c.meta.dtype.clone() };
            rows.entry(key).or_default().entry(col).or_default().add(c.status);
            backends.entry(c.backend.clone()).or_default().add(c.status);
        }
        let mut md = String::from("# Concord conformance report\n\n");
        md.push_str(&format!("Wall time: {:.1} s. Cases: {}.\n\n", self.wall_seconds, self.cases.len()));
        md.push_str("| backend | passed | failed | unsupported | skipped |\n|---|---|---|---|---|\n");
        for (b, c) in &backends {
            md.push_str(&format!("| {b} | {} | {} | {} | {} |\n", c.passed, c.failed, c.unsupported, c.skipped));
        }
        md.push_str("\n## Matrix (op × variant × dtype)\n\n");
        md.push_str(&format!("| backend | suite | op | variant | {} |\n", cols.join(" | ")));
        md.push_str(&format!("|---|---|---|---|{}\n", "---|".repeat(cols.len())));
        for ((b, suite, op, variant), cells) in &rows {
            let line: Vec<String> = cols.iter().map(|d| cells.get(d).map(|c| c.cell()).unwrap_or_default()).collect();
            md.push_str(&format!("| {b} | {suite} | {op} | {variant} | {} |\n", line.join(" | ")));
        }
        let failed: Vec<_> = self.cases.iter().filter(|c| c.status == Status::Failed).collect();
        if !failed.is_empty() {
            md.push_str("\n## Failures\n\n");
            for c in failed {
                md.push_str(&format!("### `{}`\n\n```text\n{}\n```\n\n", c.id, c.detail));
            }
        }
        let unsupported: BTreeMap<&str, usize> =
            self.cases.iter().filter(|c| c.status == Status::Unsupported).fold(BTreeMap::new(), |mut m, c| {
                *m.entry(c.detail.as_str()).or_default() += 1;
                m
            });
        if !unsupported.is_empty() {
            md.push_str("\n## Declared gaps (unsupported)\n\n| reason | cases |\n|---|---|\n");
            for (r, n) in unsupported {
                md.push_str(&format!("| {r} | {n} |\n"));
            }
        }
        md
    }

    /// Writes `conformance.md` and `conformance.json` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let md = dir.join("conformance.md");
        let json = dir.join("conformance.json");
        std::fs::write(&md, self.markdown())?;
        std::fs::write(dir.join("contract.md"), crate::contract::markdown(&self.cases))?;
        let value = serde_json::json!({
            "schema_version": SCHEMA_VERSION,
            "wall_seconds": self.wall_seconds,
            "totals": self.totals(),
            "cases": self.cases,
        });
        let mut value = value;
        if let Some(c) = self.runner_cpu_seconds {
            value["runner_cpu_seconds"] = serde_json::json!(c);
        }
        std::fs::write(&json, serde_json::to_string_pretty(&value)?)?;
        Ok((md, json))
    }
}
