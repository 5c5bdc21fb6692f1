//! The fifth review (the lead's, 2026-11-27): a bug a review found in Concord's own NCCL backend
//! (a change of that session, before its merge) that no case of the catalogue could catch.

use crate::campaign::{spec, Spec};
use crate::{lock, relay_wait, Buf, Bug, Shm};
use concord_core::{Backend, Completion, ReduceOp, Result, Work};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Clause `async.every_op_every_rank` ("... whatever the caller issued after it"): small ops
/// issued back to back share one completion marker recorded after the last of them (an NCCL
/// wrapper recording one CUDA event after a burst, to save an event per op), so an all_reduce
/// issued while the one before it was still pending completes only once that later one has. A
/// program in which a peer issues the later op only after it has seen the earlier one complete
/// here never ends: the earlier op stays pending on this rank although every rank issued it.
#[derive(Default)]
pub struct CompletionWaitsForNextOp {
    /// The last all_reduce issued on this communicator.
    last: Mutex<Option<Arc<Link>>>,
}

/// One all_reduce's place in its rank's burst: its own completion, and the op issued after it
/// while it was still pending (whose completion it shares).
struct Link {
    inner: Weak<Work<Buf>>,
    next: Mutex<Option<Arc<Link>>>,
}

impl Link {
    /// The op's own completion (a dropped work counts as done).
    fn own(&self) -> bool {
        self.inner.upgrade().is_none_or(|w| w.is_completed())
    }
    /// Its own completion and the next op's: the shared marker.
    fn marker(&self) -> bool {
        self.own() && lock(&self.next).as_ref().is_none_or(|n| n.own())
    }
}

struct SharedMarker {
    inner: Arc<Work<Buf>>,
    link: Arc<Link>,
}

impl Completion for SharedMarker {
    fn is_completed(&self) -> bool {
        self.link.marker()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let until = Instant::now() + timeout;
        if !relay_wait(&self.inner, timeout, |_| {})? {
            return Ok(false);
        }
        loop {
            if self.link.marker() {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl CompletionWaitsForNextOp {
    pub(crate) fn chain(&self, s: &Shm, w: Work<Buf>) -> Work<Buf> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let inner = Arc::new(w);
        let link = Arc::new(Link { inner: Arc::downgrade(&inner), next: Mutex::new(None) });
        let mut last = lock(&self.last);
        if let Some(prev) = last.take() {
            if !prev.own() {
                *lock(&prev.next) = Some(link.clone());
            }
        }
        *last = Some(link.clone());
        s.relayed(value, Arc::new(SharedMarker { inner, link }), meta)
    }
}

impl Bug for CompletionWaitsForNextOp {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.chain(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.chain(s, s.inner.all_reduce_(x, op)?))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![spec::<CompletionWaitsForNextOp>(
        "review5_completion_waits_for_next_op",
        "async.every_op_every_rank",
        "an all_reduce issued while the one before it is pending shares that one's completion marker (one event after a \
         burst): the earlier op completes only once the later one has, so a peer that issues the later op only after seeing \
         the earlier one complete leaves it pending for good",
        &["async::earlier_op_completes_before_a_later_one_is_issued::ws2"],
    )]
}
