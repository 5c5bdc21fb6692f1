//! Fault injection ([`concord_core::fault`]): the hooks this backend honours, read from the
//! `fault` option of the world at `init` (subgroups never fault: faults on groups, `/G`, are
//! dropped, and `fault::ON_GROUPS` is not declared). Hook sites: `after_begin:fail`
//! in output allocation on the issuing thread (a simulated out-of-memory); `alloc_output:fail`
//! there too, but real: the op's output allocation asks the device for twice its memory, and the
//! allocator's own path (block cache, pool, its one retry after emptying the cache) returns the
//! driver's `CUDA_ERROR_OUT_OF_MEMORY` (`NcclBackend::alloc_buf`); `before_header`,
//! `after_header` (stall / fail / die), `no_launch:stall` (the op's NCCL calls are skipped but its
//! event is recorded as if launched) and `stream:stall` (a host-function gate on the stream
//! before the op's NCCL calls, released by an abort, teardown or a bound) on the progress
//! thread; `enqueue:stall` in `Comm::launch` (NCCL's group is treated as still in progress).
//! Off by default; each check is a look at an empty list then.

use concord_core::fault::{Action, Fault};

/// The `(point, action)`s this backend honours besides a launch-based backend's
/// ([`concord_core::fault::LAUNCH_HOOKS`]): its output allocation failing at issue.
const OWN_HOOKS: &[(&str, Action)] = &[(concord_core::fault::point::ALLOC_OUTPUT, Action::Fail)];

/// Every `(point, action)` this backend honours.
fn honoured() -> impl Iterator<Item = &'static (&'static str, Action)> {
    concord_core::fault::LAUNCH_HOOKS.iter().chain(OWN_HOOKS)
}

/// The faults of one communicator's rank.
#[derive(Default, Debug)]
pub(crate) struct Faults {
    list: Vec<Fault>,
    rank: usize,
}

impl Faults {
    /// The faults `world` asks for; `Err` names an unknown or unhonoured one.
    pub fn from_world(world: &concord_core::WorldInfo) -> Result<Faults, String> {
        let mut list = concord_core::fault::from_world(world)?;
        // Faults on subgroups (`/G`) are not honoured (not declared: `fault::ON_GROUPS`), never
        // fired on the world either.
        list.retain(|f| f.group.is_none());
        for f in &list {
            if !honoured().any(|(p, a)| *p == f.point && *a == f.action) {
                return Err(format!("the NCCL backend has no fault hook {}:{}", f.point, f.action.name()));
            }
        }
        Ok(Faults { list, rank: world.rank })
    }

    /// Whether a fault that holds the op (`stall`, at any point) fires for the `nth` counted op:
    /// the progress thread then records the completion event of the ops launched before it
    /// first (see `worker::Tracker::defer`).
    pub fn stalls(&self, nth: Option<u64>) -> bool {
        match nth {
            Some(n) => {
                self.list.iter().any(|f| f.action == Action::Stall && f.rank.is_none_or(|r| r == self.rank) && f.nth.is_none_or(|k| k == n))
            }
            None => false,
        }
    }

    /// Whether `action` at `point` fires for the `nth` counted op (`None`: not a counted op).
    pub fn fires(&self, point: &str, action: Action, nth: Option<u64>) -> bool {
        match nth {
            Some(n) => self.list.iter().any(|f| f.fires(point, action, self.rank, n)),
            None => false,
        }
    }

    /// `die` at `point`: the process ends at once, as if killed.
    pub fn maybe_die(&self, point: &str, nth: Option<u64>) {
        if self.fires(point, Action::Die, nth) {
            eprintln!("concord-nccl: injected fault {point}:die on rank {}: aborting the process", self.rank);
            std::process::abort();
        }
    }
}

pub(crate) fn hooks() -> Vec<(String, Action)> {
    honoured().map(|(p, a)| (p.to_string(), *a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::fault::point;

    fn world(fault: &str) -> concord_core::WorldInfo {
        concord_core::WorldInfo {
            rank: 1,
            world_size: 2,
            store_path: "/nonexistent".into(),
            world_id: "t".into(),
            op_timeout: std::time::Duration::from_secs(1),
            options: vec![("fault".into(), fault.into())],
        }
    }

    #[test]
    fn faults_fire_on_their_rank_and_op_only() {
        let f = Faults::from_world(&world("stream:stall#2;after_begin:fail@1")).unwrap();
        assert!(f.fires(point::STREAM, Action::Stall, Some(2)));
        assert!(!f.fires(point::STREAM, Action::Stall, Some(1)));
        assert!(!f.fires(point::STREAM, Action::Stall, None), "buffer calls are never counted");
        assert!(f.fires(point::AFTER_BEGIN, Action::Fail, Some(7)));
        let other_rank = Faults { rank: 0, ..Faults::from_world(&world("after_begin:fail@1")).unwrap() };
        assert!(!other_rank.fires(point::AFTER_BEGIN, Action::Fail, Some(7)));
        assert!(!Faults::default().fires(point::STREAM, Action::Stall, Some(0)));
    }

    #[test]
    fn a_stall_at_any_point_holds_its_op_only() {
        // The progress thread records the completion event of the ops batched before an op
        // this fires for (`worker::Tracker::defer`): a stall must never hold their completion.
        for hook in ["before_header:stall#3", "after_header:stall#3", "no_launch:stall#3", "stream:stall#3", "enqueue:stall#3"] {
            let f = Faults::from_world(&world(hook)).unwrap();
            assert!(f.stalls(Some(3)), "{hook}");
            assert!(!f.stalls(Some(2)) && !f.stalls(None), "{hook}: another op, or an uncounted call");
        }
        let on_rank0 = Faults::from_world(&world("stream:stall@0#3")).unwrap();
        assert!(!on_rank0.stalls(Some(3)), "this is rank 1");
        let fail = Faults::from_world(&world("after_header:fail#3")).unwrap();
        assert!(!fail.stalls(Some(3)), "a fail returns at once");
        assert!(!Faults::default().stalls(Some(3)));
        // A fault on a group (`/G`, not declared here) never fires on the world.
        let on_group = Faults::from_world(&world("stream:stall#3/1;after_begin:fail#3/1")).unwrap();
        assert!(!on_group.stalls(Some(3)) && !on_group.fires(point::AFTER_BEGIN, Action::Fail, Some(3)));
    }

    #[test]
    fn unknown_or_unhonoured_hooks_are_named() {
        let e = Faults::from_world(&world("after_begin:stall")).unwrap_err();
        assert!(e.contains("no fault hook after_begin:stall"), "{e}");
        assert!(Faults::from_world(&world("nonsense")).unwrap_err().contains("nonsense"));
        for (p, a) in concord_core::fault::LAUNCH_HOOKS.iter().chain(OWN_HOOKS) {
            assert!(hooks().contains(&(p.to_string(), *a)));
        }
        // The output allocation failing at issue (the real out-of-memory of `alloc_buf`).
        assert!(hooks().contains(&(point::ALLOC_OUTPUT.to_string(), Action::Fail)));
        let f = Faults::from_world(&world("alloc_output:fail@1#2")).unwrap();
        assert!(f.fires(point::ALLOC_OUTPUT, Action::Fail, Some(2)) && !f.fires(point::ALLOC_OUTPUT, Action::Fail, Some(1)));
        assert!(!f.fires(point::AFTER_BEGIN, Action::Fail, Some(2)), "not the simulated one");
        assert!(Faults::from_world(&world("alloc_output:stall")).unwrap_err().contains("no fault hook alloc_output:stall"));
    }
}
