//! Fault injection: the vocabulary a backend uses to offer *hooks* — a rank that stalls, fails,
//! panics or dies at a chosen point of a chosen op — through its options
//! ([`crate::WorldInfo::options`], key [`FAULT_OPTION`]). A backend declares the points it
//! offers in [`crate::Capabilities::fault_points`]; the fault suites (`concord_suites::suites::
//! faults`) run on every backend that declares the points a case needs and are UNSUPPORTED
//! elsewhere.
//!
//! The option value is `<point>:<action>:<rank>:<op>[:<stall_ms>]`, e.g.
//! `between_barriers:stall:1:2:1500` — rank 1 stalls 1.5 s between the barriers of the 2nd op
//! issued on the communicator created by `init` (ops counted from 1 in issue order: collectives,
//! `new_group`, sends and receives alike; subgroups created from it carry no fault).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The option key that carries a [`Fault`].
pub const FAULT_OPTION: &str = "fault";

/// Where in an op the fault strikes. Backends declare the points they implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPoint {
    /// The rank's side of the call is published to its peers (shm: the post written and the
    /// barrier counter raised), and it has not yet waited for them.
    AfterPost,
    /// The peers agreed to run the op (shm: after the validation barrier), before this rank
    /// moves any data.
    BetweenBarriers,
    /// Inside the op's data movement, on the thread that runs it (shm: the progress thread,
    /// before the first copy; a receive: before copying the message).
    ProgressThread,
    /// NCCL: before the metadata header is exchanged.
    BeforeHeader,
    /// NCCL: after the header exchange, before the launch.
    AfterHeader,
    /// NCCL: the rank never launches its side of the kernel.
    NoLaunch,
}

/// What the rank does at the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Sleeps for the fault's stall time, then carries on.
    Stall,
    /// The op fails on this rank with a named error (as a local failure would: out of memory,
    /// a driver error).
    Fail,
    /// The code running the op panics.
    Panic,
    /// The process exits at once (`_exit`, no clean-up), as a killed rank would.
    Die,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 6] = [
        FaultPoint::AfterPost,
        FaultPoint::BetweenBarriers,
        FaultPoint::ProgressThread,
        FaultPoint::BeforeHeader,
        FaultPoint::AfterHeader,
        FaultPoint::NoLaunch,
    ];
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterPost => "after_post",
            FaultPoint::BetweenBarriers => "between_barriers",
            FaultPoint::ProgressThread => "progress_thread",
            FaultPoint::BeforeHeader => "before_header",
            FaultPoint::AfterHeader => "after_header",
            FaultPoint::NoLaunch => "no_launch",
        }
    }
}

impl FaultAction {
    pub const ALL: [FaultAction; 4] = [FaultAction::Stall, FaultAction::Fail, FaultAction::Panic, FaultAction::Die];
    pub fn name(self) -> &'static str {
        match self {
            FaultAction::Stall => "stall",
            FaultAction::Fail => "fail",
            FaultAction::Panic => "panic",
            FaultAction::Die => "die",
        }
    }
}

/// Exit status of a rank that dies through [`FaultAction::Die`].
pub const DIE_EXIT_CODE: i32 = 86;

/// One injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub point: FaultPoint,
    pub action: FaultAction,
    /// The rank (of the communicator created by `init`) that misbehaves.
    pub rank: usize,
    /// Which op of that communicator, counted from 1 in issue order.
    pub op: u64,
    /// How long a [`FaultAction::Stall`] sleeps.
    pub stall: Duration,
}

impl Fault {
    /// `(FAULT_OPTION, value)`, for [`crate::WorldInfo::options`].
    pub fn option(&self) -> (String, String) {
        let v = format!("{}:{}:{}:{}:{}", self.point.name(), self.action.name(), self.rank, self.op, self.stall.as_millis());
        (FAULT_OPTION.to_string(), v)
    }

    /// Parses an option value (see the module docs); the error names what is wrong.
    pub fn parse(v: &str) -> Result<Fault, String> {
        let parts: Vec<&str> = v.split(':').collect();
        let bad = |why: &str| format!("option {FAULT_OPTION}={v}: {why} (expected <point>:<action>:<rank>:<op>[:<stall_ms>])");
        if !(4..=5).contains(&parts.len()) {
            return Err(bad("wrong number of fields"));
        }
        let point = FaultPoint::ALL.into_iter().find(|p| p.name() == parts[0]).ok_or_else(|| bad("unknown point"))?;
        let action = FaultAction::ALL.into_iter().find(|a| a.name() == parts[1]).ok_or_else(|| bad("unknown action"))?;
        let rank = parts[2].parse().map_err(|_| bad("rank is not a number"))?;
        let op: u64 = parts[3].parse().map_err(|_| bad("op is not a number"))?;
        if op == 0 {
            return Err(bad("ops are counted from 1"));
        }
        let ms: u64 = match parts.get(4) {
            Some(s) => s.parse().map_err(|_| bad("stall_ms is not a number"))?,
            None => 0,
        };
        Ok(Fault { point, action, rank, op, stall: Duration::from_millis(ms) })
    }

    /// The fault in `options`, if any.
    pub fn from_options(options: &[(String, String)]) -> Result<Option<Fault>, String> {
        options.iter().find(|(k, _)| k == FAULT_OPTION).map(|(_, v)| Fault::parse(v)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_round_trip_and_named_errors() {
        let f =
            Fault { point: FaultPoint::BetweenBarriers, action: FaultAction::Stall, rank: 1, op: 2, stall: Duration::from_millis(1500) };
        let (k, v) = f.option();
        assert_eq!((k.as_str(), v.as_str()), ("fault", "between_barriers:stall:1:2:1500"));
        assert_eq!(Fault::parse(&v).unwrap(), f);
        assert!(Fault::parse("after_post:die:0:1").is_ok());
        assert!(Fault::parse("nowhere:die:0:1").unwrap_err().contains("unknown point"));
        assert!(Fault::parse("after_post:die:0:0").unwrap_err().contains("from 1"));
        assert_eq!(Fault::from_options(&[("x".into(), "1".into())]), Ok(None));
    }
}
