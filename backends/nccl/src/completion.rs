//! Pending NCCL collectives: a CUDA event recorded on the communicator's stream after the op.
//!
//! Contracts:
//! * `is_completed` never blocks for long (an event query plus, after 10 ms pending, a check of
//!   NCCL's asynchronous error state).
//! * `wait_for` returns within its timeout. An op pending longer than the world's op deadline
//!   (counted from issue) is declared dead: the communicator is aborted and the wait ends with
//!   [`CollectiveError::Timeout`] naming the op and its sequence number. Shorter waits that run
//!   out simply report "still pending", leaving the communicator intact.
//! * A communicator error (a peer gone, a failed kernel) ends the wait with
//!   [`CollectiveError::Aborted`] after aborting the communicator.

use crate::comm::Comm;
use crate::cuda::{poll_until, Event};
use concord_core::{progress, CollectiveError, Completion, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct NcclCompletion {
    pub comm: Arc<Comm>,
    pub event: Event,
    pub label: String,
    pub op: String,
    pub seq: u64,
    pub rank: usize,
    pub issued: Instant,
    pub op_timeout: Duration,
    pub state: Mutex<Option<Result<()>>>,
    pub progress_open: AtomicBool,
}

impl NcclCompletion {
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
        match self.event.query() {
            Ok(true) => return Some(self.finish(Ok(()))),
            Ok(false) => {}
            Err(e) => {
                return Some(self.finish(Err(CollectiveError::Backend(format!(
                    "{} #{} on rank {}: {e}",
                    self.op, self.seq, self.rank
                )))))
            }
        }
        if let Some(why) = self.comm.aborted() {
            return Some(self.finish(Err(CollectiveError::Aborted(format!(
                "{} #{} on rank {} cannot complete: {why}",
                self.op, self.seq, self.rank
            )))));
        }
        if self.issued.elapsed() > Duration::from_millis(10) {
            if let Some(err) = self.comm.async_error() {
                let why = format!(
                    "{} #{} on rank {}: NCCL reported {err}",
                    self.op, self.seq, self.rank
                );
                self.comm.abort(why.clone());
                return Some(self.finish(Err(CollectiveError::Aborted(format!(
                    "{why}; communicator aborted"
                )))));
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
        let now = Instant::now();
        let op_deadline = self.issued + self.op_timeout;
        let wait_deadline = now + timeout;
        let deadline = wait_deadline.min(op_deadline);
        if let Some(outcome) = poll_until(deadline, || self.poll()) {
            return outcome.map(|_| true);
        }
        if Instant::now() >= op_deadline {
            let waited_ms = self.issued.elapsed().as_millis() as u64;
            let detail = format!(
                "pending longer than the op deadline of {} ms (a peer died or never issued it); \
                 NCCL communicator aborted; this process is {}",
                self.op_timeout.as_millis(),
                progress::describe()
            );
            self.comm.abort(format!(
                "{} #{} timed out after {waited_ms} ms",
                self.op, self.seq
            ));
            let err = CollectiveError::Timeout {
                op: self.op.clone(),
                seq: self.seq,
                rank: self.rank,
                waited_ms,
                detail,
            };
            return self.finish(Err(err)).map(|_| true);
        }
        Ok(false)
    }
}

impl Drop for NcclCompletion {
    fn drop(&mut self) {
        if self.progress_open.swap(false, Ordering::SeqCst) {
            progress::end(&self.label, self.seq);
        }
    }
}
