//! Helper subfault (review17 §7): failure paths on subgroups, and a launch-based backend beyond
//! two ranks. Before these, no fault case injected a failure on a subgroup (the fault hooks had
//! no way to name one: `core::fault`'s `/G` is new with them), none had a world op fail while a
//! group op was in flight, and the launch-based cases ran at 1 and 2 ranks with the fault on
//! the last rank, so no rank was ever a bystander (neither the faulty rank nor its peer).
//!
//! * [`GroupFailureAbortsParent`]: NCCL shares the abort flag between a parent and the
//!   communicators split from it when they share resources (`splitShare`; NVIDIA/nccl PR #2373
//!   stores back-pointers to the children's flags when they are NOT shared): a wrapper that
//!   aborts a communicator on any error then aborts the whole family when a group's op fails.
//! * [`WorldTimeoutCompletesGroupWorks`]: the other direction (NVIDIA-NeMo/RL PR #3591: an abort
//!   that did not reach a split child): the world's watchdog, on an op deadline of the world,
//!   aborts the world and "cleans up" the works in flight on its groups by marking them
//!   completed, without an error: a group op whose peer never came returns `Ok`.
//! * `subfault_stream_failed_header_ring_neighbours` ([`StreamBug::FailedHeaderFromRingNeighbours`],
//!   on [`crate::stream`]): the failed-header check reads the ring neighbours only; at 4 ranks a
//!   bystander launches and waits for ranks that never launch (a timeout, not the peer's named
//!   local failure).

use crate::bugs_shmfail::Noted;
use crate::campaign::{spec, Spec};
use crate::stream::StreamBug;
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Work};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The abort flag one communicator and every group split from it share.
type Family = Arc<Mutex<Option<String>>>;

/// A failure on a group (bad input and waits that time out excepted) aborts the group's whole
/// family — the world it was split from and every sibling included: their later ops fail at
/// issue with the abort. The world's own failures do not (a local failure on the world leaves
/// it usable, as shm does).
#[derive(Default)]
pub struct GroupFailureAbortsParent {
    family: Family,
    group: bool,
}

impl GroupFailureAbortsParent {
    fn op<T: Clone + Send + Sync + 'static>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        if let Some(why) = crate::lock(&self.family).clone() {
            return Err(CollectiveError::Aborted(format!(
                "{name} on rank {}: communicator aborted (its abort flag is shared with a group split from the same parent): {why}",
                s.rank()
            )));
        }
        let w = issue()?;
        if !self.group {
            return Ok(w);
        }
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        Ok(s.relayed(value, Arc::new(Noted { inner: w, first: self.family.clone() }), meta))
    }
}

/// The shm ops both bugs of this file wrap (not the all_gather / reduce_scatter the fused ops'
/// decompositions are built from: a work the wrapper relays is not counted in `outstanding()`,
/// which the fused cases check, and a family flag there adds nothing to either bug).
macro_rules! wrapped_ops {
    () => {
        crate::through_op!(all_reduce, all_reduce_, all_to_all_single, broadcast, broadcast_, barrier);
    };
}

impl Bug for GroupFailureAbortsParent {
    fn child(&self) -> Option<Box<dyn Bug>> {
        Some(Box::new(GroupFailureAbortsParent { family: self.family.clone(), group: true }))
    }
    fn refuse_group(&self, s: &Shm, _ranks: &[usize]) -> Result<()> {
        match crate::lock(&self.family).clone() {
            Some(why) => Err(CollectiveError::Aborted(format!("new_group on rank {}: communicator aborted: {why}", s.rank()))),
            None => Ok(()),
        }
    }
    wrapped_ops!();
}

/// The world's watchdog and its family: set once an op of the world failed at its deadline (or
/// on a dead peer).
#[derive(Default)]
struct Watchdog {
    fired: Mutex<Option<String>>,
}

/// When an op of the world fails at its op deadline (a timeout the op itself ended in, or a dead
/// peer), the world's watchdog aborts it and finishes every work still in flight on the groups
/// split from it, as completed, without an error (it only meant to unblock their waiters): a
/// group op whose peer never issued returns `Ok` with whatever its output held.
#[derive(Default)]
pub struct WorldTimeoutCompletesGroupWorks {
    dog: Arc<Watchdog>,
    group: bool,
}

impl WorldTimeoutCompletesGroupWorks {
    fn op<T: Clone + Send + Sync + 'static>(&self, s: &Shm, _name: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let w = issue()?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        Ok(s.relayed(value, Arc::new(Watched { inner: w, dog: self.dog.clone(), group: self.group }), meta))
    }
}

/// A work under the world's watchdog: the world's fire it; the groups' are finished by it.
struct Watched<T> {
    inner: Work<T>,
    dog: Arc<Watchdog>,
    group: bool,
}

impl<T: Send + Sync> Completion for Watched<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed() || (self.group && crate::lock(&self.dog.fired).is_some())
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        if !self.group {
            return match self.inner.wait(timeout) {
                Ok(_) => Ok(true),
                Err(CollectiveError::Timeout { .. }) if !self.inner.is_completed() => Ok(false),
                Err(e) => {
                    if matches!(e, CollectiveError::Timeout { .. } | CollectiveError::PeerDied { .. }) {
                        crate::lock(&self.dog.fired).get_or_insert_with(|| e.to_string());
                    }
                    Err(e)
                }
            };
        }
        let until = Instant::now() + timeout;
        loop {
            let slice = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(10));
            match self.inner.wait(slice) {
                Ok(_) => return Ok(true),
                Err(CollectiveError::Timeout { .. }) if !self.inner.is_completed() => {}
                Err(e) => return Err(e),
            }
            if crate::lock(&self.dog.fired).is_some() {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
        }
    }
}

impl Bug for WorldTimeoutCompletesGroupWorks {
    fn child(&self) -> Option<Box<dyn Bug>> {
        Some(Box::new(WorldTimeoutCompletesGroupWorks { dog: self.dog.clone(), group: true }))
    }
    wrapped_ops!();
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<GroupFailureAbortsParent>(
            "subfault_group_failure_aborts_parent",
            "faults.local_failure_named_everywhere",
            "a failure on a subgroup aborts the abort flag the group shares with its parent (NCCL splitShare): the world's and a \
             sibling group's later ops fail",
            &["faults::fail_on_group::"],
        ),
        spec::<WorldTimeoutCompletesGroupWorks>(
            "subfault_world_timeout_completes_group_works",
            "faults.absent_peer_bounded",
            "the world's watchdog, on an op deadline of the world, marks the works in flight on its groups completed without an \
             error: a group op whose peer never came returns Ok",
            &["faults::world_timeout_with_group_op_in_flight::"],
        ),
        crate::bugs_stream::spec(
            StreamBug::FailedHeaderFromRingNeighbours,
            "faults.local_failure_named_everywhere",
            "stream: the failed-header check reads the ring neighbours only: at 4 ranks a bystander launches an op a peer failed \
             locally and times out in it",
            &["device_faults::local_failure_after_begin::bystander::"],
        ),
    ]
}
