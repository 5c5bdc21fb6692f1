//! Pending NCCL collectives: first a job on the progress thread (header exchange, validation,
//! launch), then a CUDA event recorded on the communicator's stream after the op (after the
//! last op of its batch: see `worker::Tracker::defer`).
//!
//! Contracts:
//! * `is_completed` never blocks for long (a look at the job's [`Ticket`], an event query plus,
//!   after 10 ms pending, a check of NCCL's asynchronous error state). It is false while the job
//!   waits for the peers' headers.
//! * `wait_for` returns within its timeout. A launched op pending longer than the op deadline
//!   (counted from when the stream reached it, so time queued behind healthy earlier ops does
//!   not count; while it is queued, the wait lets the tracker abort an overdue earlier op's
//!   communicator) is declared dead: the communicator is aborted and the wait
//!   ends with [`CollectiveError::Timeout`] naming the op and its sequence number. Before its
//!   launch the progress thread ends the job itself at its deadlines (the waiter steps in only
//!   as a backstop). Shorter waits that run out simply report "still pending", leaving the
//!   communicator intact.
//! * A communicator error (a peer gone, a failed kernel) ends the wait with
//!   [`CollectiveError::Aborted`] after aborting the communicator.
//! * A completion is trusted only when observed before any abort of its communicator: every
//!   op launched on a communicator later aborted, whose completion was not observed before the
//!   abort was requested, fails with [`CollectiveError::Aborted`] (an abort makes NCCL's kernels
//!   return early, so its event completes although the op did not).

use crate::comm::Comm;
use crate::cuda::poll_until;
use crate::worker::{Stage, Ticket, Tracker};
use concord_core::{progress, CollectiveError, Completion, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct NcclCompletion {
    pub comm: Arc<Comm>,
    pub ticket: Arc<Ticket>,
    pub label: Arc<str>,
    pub op: &'static str,
    pub seq: u64,
    pub rank: usize,
    pub issued: Instant,
    pub op_timeout: Duration,
    pub state: Mutex<Option<Result<()>>>,
    /// When the stream reached this op (the op launched before it completed), once seen.
    pub reached: Mutex<Option<Instant>>,
    /// This rank's launched ops (see `worker::Tracker`).
    pub tracker: Arc<Tracker>,
    pub progress_open: AtomicBool,
}

impl NcclCompletion {
    /// When this wait declares the op dead and aborts the communicator. Launched: the job's
    /// start plus the op timeout. Before that the progress thread ends the job itself, each
    /// step bounded by the job's deadline (a header wait by three op timeouts: see
    /// `Channel::wait_header`), so the waiter steps in only as a backstop after that bound
    /// and the abort's; time queued behind healthy earlier ops does not count.
    fn op_deadline(&self) -> Instant {
        let backstop = concord_core::queued_op_backstop(self.op_timeout) + 2 * crate::comm::ABORT_WAIT;
        match &*self.ticket.lock() {
            Stage::Queued => self.issued + backstop,
            Stage::Running(start) => *start + backstop,
            Stage::Launched(l) => match *self.reached.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(r) => r.max(l.at) + self.op_timeout,
                // Nothing before it on the stream: it was reached when launched.
                None if l.behind.is_none() => l.at + self.op_timeout,
                // Queued behind earlier ops on the stream, each with its own deadline (see
                // `worker::Tracker`); the backstop bounds the wait in every case.
                None => l.at + backstop,
            },
            Stage::Finished(_) => self.issued + backstop,
        }
    }

    /// While launched behind earlier ops: notes when the stream reached this one (the op
    /// before it completed), or lets the tracker abort an overdue earlier op's communicator.
    fn watch_queue(&self) {
        if self.reached.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        let (behind_done, first) = match &*self.ticket.lock() {
            Stage::Launched(l) => (l.behind.as_ref().is_none_or(|b| !matches!(b.query(), Ok(false))), l.behind.is_none().then_some(l.at)),
            _ => return,
        };
        if behind_done {
            // Nothing before it on the stream: reached when launched (not when first watched,
            // which may be much later); else the earlier op's end was seen only now.
            *self.reached.lock().unwrap_or_else(|e| e.into_inner()) = Some(first.unwrap_or_else(Instant::now));
        } else {
            self.tracker.enforce();
        }
    }

    fn finish(&self, outcome: Result<()>) -> Result<()> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(outcome);
        }
        if self.progress_open.swap(false, Ordering::SeqCst) {
            progress::end(&self.label, self.seq);
        }
        s.clone().expect("set above")
    }

    /// One non-blocking look: `Some(outcome)` once final.
    fn poll(&self) -> Option<Result<()>> {
        if let Some(done) = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Some(done);
        }
        {
            let stage = self.ticket.lock();
            match &*stage {
                // The progress thread finishes or launches it, within its own deadlines.
                Stage::Queued | Stage::Running(_) => {}
                Stage::Finished(outcome) => {
                    let outcome = outcome.clone();
                    drop(stage);
                    return Some(self.finish(outcome));
                }
                Stage::Launched(l) => match l.ev.query() {
                    // Trusted only when observed before any abort of the communicator: an
                    // abort makes NCCL's kernels return early, so the event of an op that
                    // never finished completes too. The reason is set before the abort starts
                    // (`Comm::abort`), and read after the query, so `None` here means the op
                    // completed on its own.
                    Ok(true) => {
                        // A send / recv also trusts its direction's communicator (a child of
                        // `comm`, aborted with it).
                        let side = l.side.as_ref().and_then(|c| c.aborted());
                        drop(stage);
                        if let Some(why) = self.comm.aborted().or(side) {
                            return Some(self.finish(Err(CollectiveError::Aborted(format!(
                                "{} #{} on rank {}: the communicator was aborted before this op's completion was \
                                 observed ({why}); its output is not trusted",
                                self.op, self.seq, self.rank
                            )))));
                        }
                        return Some(self.finish(Ok(())));
                    }
                    Ok(false) => {}
                    Err(e) => {
                        drop(stage);
                        return Some(
                            self.finish(Err(CollectiveError::Backend(format!("{} #{} on rank {}: {e}", self.op, self.seq, self.rank)))),
                        );
                    }
                },
            }
        }
        if let Some(why) = self.comm.aborted() {
            return Some(
                self.finish(Err(CollectiveError::Aborted(format!(
                    "{} #{} on rank {} cannot complete: {why}",
                    self.op, self.seq, self.rank
                )))),
            );
        }
        if self.issued.elapsed() > Duration::from_millis(10) {
            let side = match &*self.ticket.lock() {
                Stage::Launched(l) => l.side.clone(),
                _ => None,
            };
            if let Some(why) = side.as_ref().and_then(|c| c.aborted()) {
                self.comm.abort(format!("{} #{} on rank {}: its direction communicator was aborted ({why})", self.op, self.seq, self.rank));
                return Some(self.finish(Err(CollectiveError::Aborted(format!(
                    "{} #{} on rank {} cannot complete: {why}",
                    self.op, self.seq, self.rank
                )))));
            }
            if let Some(err) = self.comm.async_error().or_else(|| side.and_then(|c| c.async_error())) {
                let why = format!("{} #{} on rank {}: NCCL reported {err}", self.op, self.seq, self.rank);
                self.comm.abort(why.clone());
                return Some(self.finish(Err(CollectiveError::Aborted(format!("{why}; communicator aborted")))));
            }
        }
        None
    }
}

impl Completion for NcclCompletion {
    fn is_completed(&self) -> bool {
        self.poll().is_some()
    }

    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let wait_deadline = Instant::now() + timeout;
        let mut next_watch = Instant::now();
        let outcome = poll_until(wait_deadline, || match self.poll() {
            Some(outcome) => Some(Some(outcome)),
            None => {
                let now = Instant::now();
                if now >= next_watch {
                    self.watch_queue();
                    next_watch = now + Duration::from_millis(10);
                }
                (Instant::now() >= self.op_deadline()).then_some(None)
            }
        });
        match outcome {
            Some(Some(outcome)) => return outcome.map(|_| true),
            None => return Ok(false),
            Some(None) => {}
        }
        let waited_ms = self.issued.elapsed().as_millis() as u64;
        let launched = matches!(&*self.ticket.lock(), Stage::Launched(..));
        let detail = format!(
            "pending longer than the op deadline of {} ms ({}); \
                 NCCL communicator aborted; this process is {}",
            self.op_timeout.as_millis(),
            if launched {
                "launched, but a peer died or never issued it"
            } else {
                "never launched: still waiting for the peers' validation headers or for an earlier op"
            },
            progress::describe()
        );
        self.comm.abort(format!("{} #{} timed out after {waited_ms} ms", self.op, self.seq));
        let err = CollectiveError::Timeout { op: self.op.to_string(), seq: self.seq, rank: self.rank, waited_ms, detail };
        self.finish(Err(err)).map(|_| true)
    }
}

impl Drop for NcclCompletion {
    fn drop(&mut self) {
        if self.progress_open.swap(false, Ordering::SeqCst) {
            progress::end(&self.label, self.seq);
        }
    }
}
