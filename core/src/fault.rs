//! Fault injection: the one shared vocabulary through which a backend lets the suites make a rank
//! stall, fail, panic or die at a chosen point of an op, so its failure paths can be checked
//! (`suites::faults`, `suites::device_faults`, shm's kill / timeout campaign). A backend opts in:
//! it reads the [`OPTION`] backend option (`WorldInfo::options`) at `init` and lists the hooks it
//! honours in [`crate::Backend::fault_hooks`]; a case whose hook a backend does not list ends
//! UNSUPPORTED with the reason (a backend without hooks MUST ignore the option, or refuse it from
//! `init` with [`crate::CollectiveError::Unsupported`]). A *point* is a plain name, so a backend
//! may add its own without touching this crate; the shared ones are the constants in [`point`].
//!
//! Option value: one or more faults separated by `;`, each `POINT:ACTION[@RANK][#N][~MS][/G]`:
//! `RANK` limits it to one rank of the communicator `init` created (default: every rank); `N` to
//! its `N`-th op, counted from 0 in issue order over collectives, point-to-point calls and
//! `new_group` on that communicator (buffer calls are not counted; default: every op); `MS` is how
//! long a `stall` lasts before the rank carries on (default: until the op's deadline, an abort or
//! teardown releases it). `G` moves the fault onto a subgroup: the communicator made by the
//! `G`-th `new_group` called on the communicator `init` created (counted from 1 over every
//! `new_group` call, on members and non-members alike, so every rank numbers the groups alike);
//! `RANK` and `N` then count in that group (its rank, its ops). Without `/G` a fault is the init
//! communicator's and no subgroup ever faults. Example:
//! `fault=between_barriers:stall@1#1~1500;stream:stall#0;after_post:fail@0#0/1`.
//!
//! A `fail` hook ([`Action::Fail`] at [`point::AFTER_POST`], [`point::AFTER_BEGIN`],
//! [`point::ALLOC_OUTPUT`], the header points...) is a local failure, and the cases that fire it
//! hold the backend to clause `faults.local_failure_named_everywhere` (`crate::backend`): a
//! backend lists such a hook only where it keeps that clause for it, that is, where the failure
//! reaches the op's peers through the op's own exchange (each ends in a named error within its
//! deadline) and the world MUST stay usable after it (the next ops on the same communicator
//! run, with their values). A backend that aborts the communicator on a local failure (NCCL's
//! own rule after an error), or that cannot tell its peers before posting (no per-op exchange),
//! leaves the hook out, and those cases are UNSUPPORTED; declared, an abort is a bug the cases
//! report.
//!
//! Faults on subgroups are a declared capability: a backend that honours them lists
//! `(`[`ON_GROUPS`]`, action)` in [`crate::Backend::fault_hooks`] for every action it honours
//! there (at the same points as on the world), and hands [`for_group`]'s faults to the `G`-th
//! group it makes. [`Fault::applies`] never matches a fault meant for a group, so a backend
//! unaware of `/G` never fires it on its world (the cases are then UNSUPPORTED by the declaration).

use std::time::Duration;

/// The backend option holding the faults.
pub const OPTION: &str = "fault";

/// The pseudo-point a backend lists in [`crate::Backend::fault_hooks`], once per action, when it
/// honours faults on subgroups (`/G`, module docs).
pub const ON_GROUPS: &str = "on_groups";

/// Exit status of a rank that dies through [`Action::Die`].
pub const DIE_EXIT_CODE: i32 = 86;

/// Points shared by the built-in backends (a backend documents which it honours).
pub mod point {
    /// The rank's side of the call is published to its peers and it has not yet waited for
    /// them (shm: the post written and the barrier counter raised). `fail` there is a local
    /// failure (listed only where the backend keeps `faults.local_failure_named_everywhere` for
    /// it: module docs).
    pub const AFTER_POST: &str = "after_post";
    /// The peers agreed to run the op (shm: after the validation barrier), before this rank
    /// moves any data.
    pub const BETWEEN_BARRIERS: &str = "between_barriers";
    /// Inside the op's data movement, on the thread that runs it (shm: the progress thread,
    /// before the first copy; a receive: before copying the message).
    pub const PROGRESS_THREAD: &str = "progress_thread";
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
    /// such as an out-of-memory while allocating the output (listed only where the backend
    /// keeps `faults.local_failure_named_everywhere` for it: module docs).
    pub const AFTER_BEGIN: &str = "after_begin";
    /// The backend allocates the op's output (an out-of-place op's new buffer) on the issuing
    /// thread, after the op was numbered: `fail` makes the backend's OWN allocator refuse that
    /// allocation, as a full arena / `/dev/shm` or a device out of memory would (shm: the arena
    /// answers "full"; NCCL: the allocation asks for twice the GPU's memory, and the driver's
    /// `CUDA_ERROR_OUT_OF_MEMORY` comes back through its block cache and pool), on that rank alone. A declared capability like every hook: a backend
    /// lists `(ALLOC_OUTPUT, Action::Fail)` in [`crate::Backend::fault_hooks`] only where its
    /// real allocation path is what fails (never a simulated error beside it), and only where it
    /// keeps clause `faults.local_failure_named_everywhere` for it (module docs: the failure
    /// reaches the peers through the op's own exchange, and the world MUST stay usable).
    pub const ALLOC_OUTPUT: &str = "alloc_output";
    /// The device stream the op runs on is stalled just before the op (until an abort or
    /// teardown releases it): the op and everything queued after it stay pending.
    pub const STREAM: &str = "stream";
}

/// Every `(point, action)` a launch-based device backend honours (one validation header per op,
/// then a launch on a device stream): the NCCL backend's set, and the campaign's CPU reference of
/// that architecture (`concord-mutants`' `stream`), which the failure-path cases
/// (`suites::device_faults`) need.
pub const LAUNCH_HOOKS: &[(&str, Action)] = &[
    (point::BEFORE_HEADER, Action::Stall),
    (point::BEFORE_HEADER, Action::Fail),
    (point::BEFORE_HEADER, Action::Die),
    (point::AFTER_HEADER, Action::Stall),
    (point::AFTER_HEADER, Action::Fail),
    (point::AFTER_HEADER, Action::Die),
    (point::NO_LAUNCH, Action::Stall),
    (point::ENQUEUE, Action::Stall),
    (point::AFTER_BEGIN, Action::Fail),
    (point::STREAM, Action::Stall),
];

/// What the faulty rank does at the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Does not proceed for the fault's stall time (default: until the op's deadline, an abort
    /// or teardown).
    Stall,
    /// Fails locally with a named error (a simulated out-of-memory, a refused call...).
    Fail,
    /// The code running the op panics.
    Panic,
    /// The process ends at once (exit status [`DIE_EXIT_CODE`], no clean-up), as if killed.
    Die,
}

impl Action {
    pub const ALL: [Action; 4] = [Action::Stall, Action::Fail, Action::Panic, Action::Die];
    pub fn name(self) -> &'static str {
        match self {
            Action::Stall => "stall",
            Action::Fail => "fail",
            Action::Panic => "panic",
            Action::Die => "die",
        }
    }
    fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// One fault: `action` at `point`, on `rank` (or every rank) for op `nth` (or every op).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub point: String,
    pub action: Action,
    pub rank: Option<usize>,
    pub nth: Option<u64>,
    /// How long a [`Action::Stall`] lasts (`None`: until released by a deadline, abort or teardown).
    pub stall: Option<Duration>,
    /// The subgroup the fault is on (`/G`: the `G`-th `new_group` of the init communicator,
    /// from 1); `None`: the init communicator itself.
    pub group: Option<u64>,
}

impl Fault {
    pub fn new(point: &str, action: Action) -> Fault {
        Fault { point: point.to_string(), action, rank: None, nth: None, stall: None, group: None }
    }
    /// On the `g`-th group made by `new_group` on the init communicator (from 1); `rank` and
    /// `nth` then count in that group.
    pub fn on_group(mut self, g: u64) -> Fault {
        self.group = Some(g);
        self
    }
    pub fn on_rank(mut self, rank: usize) -> Fault {
        self.rank = Some(rank);
        self
    }
    pub fn nth(mut self, n: u64) -> Fault {
        self.nth = Some(n);
        self
    }
    pub fn stall_for(mut self, d: Duration) -> Fault {
        self.stall = Some(d);
        self
    }
    /// Whether this fault fires at `point` with `action` for the `nth` op on `rank`.
    pub fn fires(&self, point: &str, action: Action, rank: usize, nth: u64) -> bool {
        self.action == action && self.applies(point, rank, nth)
    }
    /// Whether this fault (any action) applies at `point` for the `nth` op on `rank` of the
    /// communicator holding it (never while it is still meant for a group: see [`for_group`]).
    pub fn applies(&self, point: &str, rank: usize, nth: u64) -> bool {
        self.group.is_none() && self.point == point && self.rank.is_none_or(|r| r == rank) && self.nth.is_none_or(|n| n == nth)
    }
    /// The `(point, action)` pair, as [`crate::Backend::fault_hooks`] lists it.
    pub fn hook(&self) -> (String, Action) {
        (self.point.clone(), self.action)
    }
    /// `(OPTION, value)`, for [`crate::WorldInfo::options`].
    pub fn option(&self) -> (String, String) {
        (OPTION.to_string(), self.to_string())
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
        if let Some(d) = self.stall {
            write!(f, "~{}", d.as_millis())?;
        }
        if let Some(g) = self.group {
            write!(f, "/{g}")?;
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
        let bad =
            |why: &str| format!("fault `{item}`: {why} (expected POINT:ACTION[@RANK][#N][~MS][/G], ACTION one of stall, fail, panic, die)");
        let (rest, group) = match item.split_once('/') {
            Some((a, g)) => (a, Some(g.parse::<u64>().ok().filter(|&g| g > 0).ok_or_else(|| bad("G is not a number from 1"))?)),
            None => (item, None),
        };
        let (rest, stall) = match rest.split_once('~') {
            Some((a, ms)) => (a, Some(Duration::from_millis(ms.parse::<u64>().map_err(|_| bad("MS is not a number"))?))),
            None => (rest, None),
        };
        let (rest, nth) = match rest.split_once('#') {
            Some((a, n)) => (a, Some(n.parse::<u64>().map_err(|_| bad("N is not a number"))?)),
            None => (rest, None),
        };
        let (rest, rank) = match rest.split_once('@') {
            Some((a, r)) => (a, Some(r.parse::<usize>().map_err(|_| bad("RANK is not a number"))?)),
            None => (rest, None),
        };
        let (point, action) = rest.split_once(':').ok_or_else(|| bad("no `:`"))?;
        if point.is_empty() || !point.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(bad("POINT must be a lower-case name"));
        }
        let action = Action::parse(action).ok_or_else(|| bad("unknown ACTION"))?;
        v.push(Fault { point: point.to_string(), action, rank, nth, stall, group });
    }
    Ok(v)
}

/// The faults in `options` (`Ok(empty)` when the option is absent).
pub fn from_options(options: &[(String, String)]) -> Result<Vec<Fault>, String> {
    options.iter().find(|(k, _)| k == OPTION).map(|(_, v)| parse(v)).unwrap_or(Ok(Vec::new()))
}

/// The faults a world asks for (`Ok(empty)` when the option is absent).
pub fn from_world(world: &crate::WorldInfo) -> Result<Vec<Fault>, String> {
    from_options(&world.options)
}

/// The faults of `faults` meant for the `g`-th group (`/g`), made the group's own (no `/G`): what a
/// backend declaring [`ON_GROUPS`] gives the communicator its `g`-th `new_group` makes.
pub fn for_group(faults: &[Fault], g: u64) -> Vec<Fault> {
    faults.iter().filter(|f| f.group == Some(g)).map(|f| Fault { group: None, ..f.clone() }).collect()
}

/// Every `(point, action)` pair for `points` × every action (a backend honouring all actions).
pub fn hooks(points: &[&str]) -> Vec<(String, Action)> {
    points.iter().flat_map(|p| Action::ALL.into_iter().map(move |a| (p.to_string(), a))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_matching() {
        let f = vec![
            Fault::new(point::STREAM, Action::Stall).nth(0),
            Fault::new(point::AFTER_HEADER, Action::Die).on_rank(1).nth(3),
            Fault::new(point::BETWEEN_BARRIERS, Action::Stall).on_rank(1).nth(1).stall_for(Duration::from_millis(1500)),
        ];
        let s = format(&f);
        assert_eq!(s, "stream:stall#0;after_header:die@1#3;between_barriers:stall@1#1~1500");
        assert_eq!(parse(&s).unwrap(), f);
        assert!(f[1].fires(point::AFTER_HEADER, Action::Die, 1, 3));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Die, 0, 3));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Die, 1, 2));
        assert!(!f[1].fires(point::AFTER_HEADER, Action::Stall, 1, 3));
        assert!(f[2].applies(point::BETWEEN_BARRIERS, 1, 1));
        assert!(Fault::new("x", Action::Fail).fires("x", Action::Fail, 7, 99));
        assert_eq!(from_options(&[("x".into(), "1".into())]), Ok(Vec::new()));
        assert_eq!(hooks(&["a"]).len(), 4);
        // A fault on a group: never fires on the init communicator; `for_group` makes it the
        // group's own.
        let g = Fault::new(point::AFTER_POST, Action::Fail).on_rank(0).nth(0).on_group(2);
        assert_eq!(g.to_string(), "after_post:fail@0#0/2");
        assert_eq!(parse("after_post:fail@0#0/2").unwrap(), vec![g.clone()]);
        assert!(!g.fires(point::AFTER_POST, Action::Fail, 0, 0));
        let all = [g, f[0].clone()];
        assert!(for_group(&all, 1).is_empty());
        let mine = for_group(&all, 2);
        assert_eq!(mine.len(), 1);
        assert!(mine[0].fires(point::AFTER_POST, Action::Fail, 0, 0));
    }

    #[test]
    fn bad_values_are_named() {
        for bad in [
            "stream",
            "stream:wobble",
            "Stream:stall",
            "stream:stall@x",
            "stream:stall#-1",
            "stream:stall~x",
            "stream:stall/0",
            "stream:stall/x",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert!(parse("").unwrap().is_empty());
    }
}
