//! Fault injection: the small shared vocabulary through which a backend lets the suites make one
//! rank stall, fail or die at a chosen point of an op, so its failure paths can be checked
//! (`suites::device_faults`). A backend opts in: it reads the [`OPTION`] backend option
//! (`WorldInfo::options`) at `init` and lists the hooks it honours in
//! [`crate::Backend::fault_hooks`]; a case whose hook a backend does not list ends UNSUPPORTED
//! with the reason (a backend without hooks MUST ignore the option, or refuse it from `init`
//! with [`crate::CollectiveError::Unsupported`]). The vocabulary is deliberately small: a *point* (a plain name, so a backend
//! may add its own points without touching this crate; the shared ones are the constants in
//! [`point`]) and an [`Action`].
//!
//! Option value: one or more faults separated by `;`, each `POINT:ACTION[@RANK][#N]`:
//! `RANK` limits it to one rank (default: every rank); `N` to the `N`-th (from 0) collective or
//! point-to-point call issued on the world communicator (buffer calls and `new_group` are not
//! counted; subgroups never fault; default: every such call). Example:
//! `fault=stream:stall#0;enqueue:stall#1`.

/// The backend option holding the faults.
pub const OPTION: &str = "fault";

/// Points shared by the built-in backends (a backend documents which it honours).
pub mod point {
    /// On the rank's progress path, before the rank contributes its part of the op's cross-rank
    /// check (its validation header).
    pub const BEFORE_HEADER: &str = "before_header";
    /// After the cross-rank check agreed, before the data part of the op is launched.
    pub const AFTER_HEADER: &str = "after_header";
    /// The rank reports its side of the op launched but never launches it (`stall`: the rank's
    /// peers wait in the data exchange for it).
    pub const NO_LAUNCH: &str = "no_launch";
    /// While the op is being handed to the communication library (the library call keeps
    /// reporting "in progress" until the op's deadline or an abort).
    pub const ENQUEUE: &str = "enqueue";
    /// On the issuing thread, after the op was numbered (`begin`): `fail` is a local failure
    /// such as an out-of-memory while allocating the output.
    pub const AFTER_BEGIN: &str = "after_begin";
    /// The device stream the op runs on is stalled just before the op (until an abort or
    /// teardown releases it): the op and everything queued after it stay pending.
    pub const STREAM: &str = "stream";
}

/// What the faulty rank does at the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Never proceeds on its own (until the op's deadline, an abort or teardown).
    Stall,
    /// Fails locally with a named error (a simulated out-of-memory, a refused call...).
    Fail,
    /// The process ends at once (`abort`), as if killed.
    Die,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Stall => "stall",
            Action::Fail => "fail",
            Action::Die => "die",
        }
    }
    fn parse(s: &str) -> Option<Action> {
        [Action::Stall, Action::Fail, Action::Die].into_iter().find(|a| a.name() == s)
    }
}

/// One fault: `action` at `point`, on `rank` (or every rank) for op `nth` (or every op).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub point: String,
    pub action: Action,
    pub rank: Option<usize>,
    pub nth: Option<u64>,
}

impl Fault {
    pub fn new(point: &str, action: Action) -> Fault {
        Fault { point: point.to_string(), action, rank: None, nth: None }
    }
    pub fn on_rank(mut self, rank: usize) -> Fault {
        self.rank = Some(rank);
        self
    }
    pub fn nth(mut self, n: u64) -> Fault {
        self.nth = Some(n);
        self
    }
    /// Whether this fault fires at `point` for the `nth` op on `rank`.
    pub fn fires(&self, point: &str, action: Action, rank: usize, nth: u64) -> bool {
        self.point == point && self.action == action && self.rank.is_none_or(|r| r == rank) && self.nth.is_none_or(|n| n == nth)
    }
    /// The `(point, action)` pair, as [`crate::Backend::fault_hooks`] lists it.
    pub fn hook(&self) -> (String, Action) {
        (self.point.clone(), self.action)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.point, self.action.name())?;
        if let Some(r) = self.rank {
            write!(f, "@{r}")?;
        }
        if let Some(n) = self.nth {
            write!(f, "#{n}")?;
        }
        Ok(())
    }
}

/// The option value for `faults` (the inverse of [`parse`]).
pub fn format(faults: &[Fault]) -> String {
    faults.iter().map(Fault::to_string).collect::<Vec<_>>().join(";")
}

/// Parses an option value (see the module docs). `Err` names the bad part.
pub fn parse(s: &str) -> Result<Vec<Fault>, String> {
    let mut v = Vec::new();
    for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |why: &str| format!("fault `{item}`: {why} (expected POINT:ACTION[@RANK][#N], ACTION one of stall, fail, die)");
        let (item_nth, nth) = match item.split_once('#') {
            Some((a, n)) => (a, Some(n.parse::<u64>().map_err(|_| bad("N is not a number"))?)),
            None => (item, None),
        };
        let (item_rank, rank) = match item_nth.split_once('@') {
            Some((a, r)) => (a, Some(r.parse::<usize>().map_err(|_| bad("RANK is not a number"))?)),
            None => (item_nth, None),
        };
        let (point, action) = item_rank.split_once(':').ok_or_else(|| bad("no `:`"))?;
        if point.is_empty() || !point.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(bad("POINT must be a lower-case name"));
        }
        let action = Action::parse(action).ok_or_else(|| bad("unknown ACTION"))?;
        v.push(Fault { point: point.to_string(), action, rank, nth });
    }
    Ok(v)
}

/// The faults a world asks for (`Ok(empty)` when the option is absent).
pub fn from_world(world: &crate::WorldInfo) -> Result<Vec<Fault>, String> {
    world.option(OPTION).map(parse).unwrap_or(Ok(Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_matching() {
        let f = vec![Fault::new(point::STREAM, Action::Stall).nth(0), Fault::new(point::AFTER_HEADER, Action::Die).on_rank(1).nth(3)];
        let s = format(&f);
        assert_eq!(s, "stream:stall#0;after_header:die@1#3");
        assert_eq!(parse(&s).unwrap(), f);
        assert!(f[1].fires(point::AFTER_HEADER, Action::Die, 1, 3));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Die, 0, 3));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Die, 1, 2));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Stall, 1, 3));
        assert!(Fault::new("x", Action::Fail).fires("x", Action::Fail, 7, 99));
    }

    #[test]
    fn bad_values_are_named() {
        for bad in ["stream", "stream:wobble", "Stream:stall", "stream:stall@x", "stream:stall#-1"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert!(parse("").unwrap().is_empty());
    }
}
