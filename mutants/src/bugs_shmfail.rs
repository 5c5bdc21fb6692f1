//! Helper shmfail (2026-11-27): the bug review8 found in our own shm backend and that backend no
//! longer has — a communicator poisoned by a local failure. Clause
//! `faults.local_failure_named_everywhere` ("... and the world stays usable"). Helper shmrace
//! (2026-11-27): the same bug left in `new_group` only, which shm kept until then
//! ([`PoisonedAfterGroupFailure`]).

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, Completion, ReduceOp, Result, Work};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Once any op of the communicator failed on this rank (its own local failure, or a peer's that
/// reached it as a named error; bad input excepted, as shm always excepted it), every later op
/// fails at issue with "communicator unusable after an earlier failure": the failure itself is
/// named on every rank, never a timeout, but the world is not usable any more (shm before helper
/// shmfail: `exec.rs` poisoned the communicator on every failure but bad input).
#[derive(Default)]
pub struct PoisonedAfterAnyFailure {
    /// The first failure this rank's waits returned (per communicator: one bug per `init`).
    first: Arc<Mutex<Option<String>>>,
}

impl PoisonedAfterAnyFailure {
    /// `issue`, unless an earlier op failed: then the named error at once.
    fn op<T: Clone + Send + Sync + 'static>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        if let Some(why) = crate::lock(&self.first).clone() {
            return Err(CollectiveError::Aborted(format!(
                "{name} on rank {}: communicator unusable after an earlier failure: {why}",
                s.rank()
            )));
        }
        let w = issue()?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        Ok(s.relayed(value, Arc::new(Noted { inner: w, first: self.first.clone() }), meta))
    }
}

/// A completion that relays `inner` and notes its failure (bad input excepted) in `first`.
pub(crate) struct Noted<T> {
    pub(crate) inner: Work<T>,
    pub(crate) first: Arc<Mutex<Option<String>>>,
}

impl<T: Send + Sync> Completion for Noted<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        crate::relay_wait(&self.inner, timeout, |e| {
            if e.bad_input_kind().is_none() {
                crate::lock(&self.first).get_or_insert_with(|| e.to_string());
            }
        })
    }
}

impl Bug for PoisonedAfterAnyFailure {
    crate::through_op!(
        all_reduce,
        all_reduce_,
        all_gather_into_tensor,
        reduce_scatter_tensor,
        all_to_all_single,
        broadcast,
        permute_tensor,
        reduce,
        gather,
        scatter,
        barrier
    );
}

/// Once a `new_group` failed on this rank (bad input excepted: a mismatched group stays a named
/// `bad_input` and the world usable), every later op of the communicator fails at issue: the
/// local-failure path of every collective keeps the world usable, but `new_group`'s (three
/// steps, not two) was left on the poisoning path (shm before helper shmrace: `exec.rs`'s
/// `steps_on`).
#[derive(Default)]
pub struct PoisonedAfterGroupFailure {
    /// The failed `new_group`'s error on this rank.
    first: Arc<Mutex<Option<String>>>,
}

impl PoisonedAfterGroupFailure {
    fn op<T>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(why) = crate::lock(&self.first).clone() {
            return Err(CollectiveError::Aborted(format!(
                "{name} on rank {}: communicator unusable after an earlier failure: {why}",
                s.rank()
            )));
        }
        issue()
    }
}

impl Bug for PoisonedAfterGroupFailure {
    fn group_failed(&self, _s: &Shm, e: &CollectiveError) {
        if e.bad_input_kind().is_none() {
            crate::lock(&self.first).get_or_insert_with(|| e.to_string());
        }
    }
    fn refuse_group(&self, s: &Shm, _ranks: &[usize]) -> Result<()> {
        self.op(s, "new_group", || Ok(()))
    }
    crate::through_op!(all_reduce, all_reduce_, broadcast, barrier);
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<PoisonedAfterAnyFailure>(
            "shmfail_poisoned_after_any_failure",
            "faults.local_failure_named_everywhere",
            "after any failure but bad input (a local one included) every later op of the communicator fails: the world is not usable",
            &["faults::fail_after_post::broadcast::ws2"],
        ),
        spec::<PoisonedAfterGroupFailure>(
            "shmrace_group_failure_poisons",
            "faults.local_failure_named_everywhere",
            "a local failure inside new_group (not bad input) poisons the communicator: every later op fails, the world is not usable",
            &["faults::fail_in_new_group::after_post::ws3"],
        ),
    ]
}
