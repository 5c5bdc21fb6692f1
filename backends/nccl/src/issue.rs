//! Issue bookkeeping shared by every entry point: numbering an op and recording it in flight
//! ([`concord_core::progress`]), named errors, local rejections (still sent to the peers in a
//! header, so every rank fails alike), and queueing a job to the progress thread in exchange for
//! a pending [`Work`].

use crate::comm::Comm;
use crate::completion::NcclCompletion;
use crate::header::Header;
use crate::ops::Local;
use crate::worker::{Channel, Check, Job, Launch, OpId, P2pData, P2pJob, Progress, Ticket};
use crate::NcclBackend;
use concord_core::{progress, BadInput, BadInputKind, CollectiveError, Result, Work, WorkMeta};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Marks a collective in flight in [`progress`] until handed to a completion or dropped.
pub(crate) struct InFlight {
    label: Arc<str>,
    seq: u64,
    armed: bool,
}
impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            progress::end(&self.label, self.seq);
        }
    }
}

/// One issued op: names and numbers for messages and validation.
pub(crate) struct Op {
    pub(crate) name: &'static str,
    pub(crate) seq: u64,
    pub(crate) cseq: u64,
    pub(crate) issued: Instant,
    pub(crate) flight: InFlight,
    /// Index among the world's collective and point-to-point calls (fault injection only).
    pub(crate) nth: Option<u64>,
    /// The op's validation header once admitted, until `submit` queues it: an op dropped with
    /// it still here failed locally after `begin` (an allocation, a reduce op...), and its drop
    /// sends the header marked failed, so every peer ends the op in one named error instead of
    /// a timeout and an abort, and the sequence stays in step.
    pub(crate) unsent: std::cell::RefCell<Option<Unsent>>,
}

/// What an op's drop needs to send its header marked failed.
pub(crate) struct Unsent {
    progress: Arc<Progress>,
    chan: Arc<Channel>,
    hdr: Header,
    /// `Some((peer, is_send))` for a send / recv (a header swap), `None` for a collective.
    peer: Option<(usize, bool)>,
}

impl Drop for Op {
    fn drop(&mut self) {
        let Some(u) = self.unsent.get_mut().take() else { return };
        if u.chan.comm.aborted().is_some() {
            return;
        }
        let job = match u.peer {
            // Parked without a ticket: its header goes marked failed.
            Some((peer, send)) => {
                Job::P2p(P2pJob { chan: u.chan.clone(), id: self.id(), hdr: Some(u.hdr), peer, send, data: None, ticket: None })
            }
            None => Job::Op { chan: u.chan.clone(), id: self.id(), check: Check::All(u.hdr.failed()), launch: None, ticket: None },
        };
        u.progress.submit(job);
    }
}

impl Op {
    pub(crate) fn id(&self) -> OpId {
        OpId { name: self.name, seq: self.seq, issued: self.issued, nth: self.nth, cseq: self.cseq, started: None }
    }
}

/// Entry points that are not counted for fault injection's `#N` (buffer calls and new_group).
const NOT_COUNTED: &[&str] = &["upload", "download", "alloc", "write", "new_group"];

impl NcclBackend {
    pub(crate) fn comm(&self) -> &Arc<Comm> {
        &self.chan.comm
    }

    pub(crate) fn backend_err(&self, op: &str, seq: u64, msg: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("nccl {op} #{seq} on rank {}: {msg}", self.rank))
    }

    pub(crate) fn bind(&self, op: &str) -> Result<()> {
        self.dev.bind().map_err(|e| CollectiveError::Backend(format!("nccl {op} on rank {}: {e}", self.rank)))
    }

    /// Starts an op: binds the device, numbers it, records it in flight.
    pub(crate) fn begin(&self, name: &'static str, collective: bool) -> Result<Op> {
        self.bind(name)?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let cseq = if collective { self.coll_seq.fetch_add(1, Ordering::SeqCst) } else { 0 };
        let nth = (!NOT_COUNTED.contains(&name)).then(|| self.nth.fetch_add(1, Ordering::SeqCst));
        progress::begin(&self.label, name, seq);
        Ok(Op {
            name,
            seq,
            cseq,
            issued: Instant::now(),
            flight: InFlight { label: self.label.clone(), seq, armed: true },
            nth,
            unsent: std::cell::RefCell::new(None),
        })
    }

    pub(crate) fn bad(&self, op: &Op, kind: BadInputKind, detail: impl Into<String>) -> CollectiveError {
        CollectiveError::bad_input(kind, op.name, op.seq, self.rank, detail)
    }

    /// `Err(Aborted)` once the communicator has been aborted: later ops fail at issue.
    pub(crate) fn alive(&self, op: &Op) -> Result<()> {
        match self.comm().aborted() {
            Some(why) => Err(self.chan.aborted_err(&op.id(), &why)),
            None => Ok(()),
        }
    }

    /// Waits until the progress thread has launched (or failed) every op issued before `op`,
    /// so that `op` is ordered after them on the stream; not the failure notices of ops that
    /// already failed at issue here, which launch nothing (`Progress::flush_while_progressing`:
    /// such a notice waits for the peers, which may wait for this write). Bounded by progress, not by a count
    /// from issue: a long queue of healthy jobs is waited out, and the wait fails once no job
    /// has finished for as long as one job can take (each bounds itself: see `worker`).
    pub(crate) fn flush(&self, op: &Op) -> Result<()> {
        if self.progress.flush_while_progressing(concord_core::queued_op_backstop(self.op_timeout) + 2 * crate::comm::ABORT_WAIT) {
            return Ok(());
        }
        Err(CollectiveError::Timeout {
            op: op.name.to_string(),
            seq: op.seq,
            rank: self.rank,
            waited_ms: op.issued.elapsed().as_millis() as u64,
            detail: format!(
                "collectives issued before it stopped making progress (no job finished within the bound of \
                 one job, three op deadlines of {} ms plus the abort's); this process is {}",
                self.op_timeout.as_millis(),
                progress::describe()
            ),
        })
    }

    /// Arms `op`'s drop to send `hdr` marked failed (see [`Op::unsent`]); `submit` disarms it.
    pub(crate) fn arm(&self, op: &Op, hdr: &Header, peer: Option<(usize, bool)>) {
        if self.validating() {
            *op.unsent.borrow_mut() = Some(Unsent { progress: self.progress.clone(), chan: self.chan.clone(), hdr: hdr.clone(), peer });
        }
    }

    /// A local input error: returned at issue. With validation on, the peers still need this
    /// rank's header for this collective, so an exchange carrying the error is queued: every
    /// rank then ends the collective in the same named error, and the sequence stays in step.
    pub(crate) fn reject(&self, op: &Op, hdr: &Header, e: BadInput) -> CollectiveError {
        op.unsent.borrow_mut().take();
        if self.validating() && self.comm().aborted().is_none() {
            self.progress.submit(Job::Op {
                chan: self.chan.clone(),
                id: op.id(),
                check: Check::All(hdr.clone().error(e.kind)),
                launch: None,
                ticket: None,
            });
        }
        self.bad(op, e.kind, e.detail)
    }

    pub(crate) fn meta(&self, op: &Op) -> WorkMeta {
        WorkMeta { backend: "nccl".into(), op: op.name.to_string(), seq: op.seq, rank: self.rank }
    }

    pub(crate) fn done<T>(&self, op: Op, value: T) -> Work<T> {
        Work::done(value, self.meta(&op), &self.counter)
    }

    /// Queues `op` for the progress thread (cross-rank `check` when validating, then `launch`)
    /// and returns its pending [`Work`] at once.
    pub(crate) fn submit<T>(&self, mut op: Op, value: T, check: Check, launch: Option<Launch>) -> Result<Work<T>> {
        op.unsent.get_mut().take();
        let check = if self.validating() { check } else { Check::None };
        if matches!(check, Check::None) && launch.is_none() {
            // Nothing to queue (an empty op without validation): its number is published all
            // the same, or this rank's issue counter would stop there for good and no later
            // unvalidated op of the communicator could batch. It launches nothing here, so a
            // peer's batch never waits on it.
            if let Some(b) = &self.chan.board {
                b.note_issued(op.cseq);
            }
            return Ok(self.done(op, value));
        }
        self.alive(&op)?;
        if let Some(b) = &self.chan.board {
            // Before the job is queued: a peer that reads it may let this op share a completion
            // event with the ops before it (see `worker::Channel::issued_everywhere`).
            b.note_issued(op.cseq);
        }
        let ticket = Ticket::new();
        self.progress.submit(Job::Op { chan: self.chan.clone(), id: op.id(), check, launch, ticket: Some(ticket.clone()) });
        Ok(self.pending(op, value, ticket))
    }

    /// Queues a send / recv for the progress thread, which parks it on its direction (see
    /// `p2p`), and returns its pending [`Work`] at once.
    pub(crate) fn submit_p2p<T>(
        &self,
        mut op: Op,
        value: T,
        hdr: Header,
        peer: usize,
        send: bool,
        data: Option<P2pData>,
    ) -> Result<Work<T>> {
        op.unsent.get_mut().take();
        let hdr = self.validating().then_some(hdr);
        if hdr.is_none() && data.is_none() {
            return Ok(self.done(op, value));
        }
        self.alive(&op)?;
        let ticket = Ticket::new();
        self.progress.submit(Job::P2p(P2pJob {
            chan: self.chan.clone(),
            id: op.id(),
            hdr,
            peer,
            send,
            data,
            ticket: Some(ticket.clone()),
        }));
        Ok(self.pending(op, value, ticket))
    }

    /// The pending [`Work`] of `op`, whose job holds `ticket`.
    fn pending<T>(&self, mut op: Op, value: T, ticket: Arc<Ticket>) -> Work<T> {
        op.flight.armed = false;
        let completion = NcclCompletion {
            comm: self.comm().clone(),
            ticket,
            label: self.label.clone(),
            op: op.name,
            seq: op.seq,
            rank: self.rank,
            issued: op.issued,
            op_timeout: self.op_timeout,
            state: Mutex::new(None),
            reached: Mutex::new(None),
            tracker: self.progress.tracker(),
            progress_open: AtomicBool::new(true),
        };
        Work::new(value, Arc::new(completion), self.meta(&op), &self.counter)
    }
}

impl Header {
    pub(crate) fn error_if(self, local: &Local) -> Header {
        match local {
            Err((k, _)) => self.error(*k),
            Ok(()) => self,
        }
    }
}

/// The issue path's CPU-only pieces, without a GPU: what an all_reduce's issue does per op
/// besides CUDA calls and the queue. A measurement aid, not a check (ignored): run one piece
/// under `perf stat -e instructions:u` (this shared machine's wall clock is too noisy), minus
/// `issue_cost_none`, divided by `N`; e.g. `perf stat -e instructions:u $TESTBIN --ignored
/// --exact issue::issue_cost::progress`.
#[cfg(test)]
mod issue_cost {
    use concord_core::{progress, validate_local, CallDesc, CallOp, Capabilities, DType, ReduceOp, TensorDesc, Variant, WorkMeta};

    const N: u64 = 200_000;
    const LABEL: &str = "nccl[world 0 rank 0]";

    #[test]
    #[ignore = "instruction-count probe for callgrind (gpulat7), not a check: run by name under valgrind --tool=callgrind"]
    fn none() {
        std::hint::black_box(LABEL.to_string());
    }

    /// `progress::begin` at issue, `progress::end` at completion, 100 in flight (a window).
    #[test]
    #[ignore = "instruction-count probe for callgrind (gpulat7), not a check: run by name under valgrind --tool=callgrind"]
    fn progress() {
        let label = LABEL.to_string();
        for w in 0..N / 100 {
            for s in 0..100 {
                progress::begin(&label, "all_reduce", w * 100 + s);
            }
            for s in 0..100 {
                progress::end(&label, w * 100 + s);
            }
        }
    }

    /// The call's description, its local rules and its validation header.
    #[test]
    #[ignore = "instruction-count probe for callgrind (gpulat7), not a check: run by name under valgrind --tool=callgrind"]
    fn desc() {
        let caps = std::sync::Arc::new(Capabilities::full(8));
        for s in 0..N {
            let mut d = CallDesc::new(CallOp::AllReduce, Variant::Out, 0);
            d.seq = s;
            d.inputs = [&[2usize][..]].iter().map(|sh| TensorDesc::new(DType::F32, sh)).collect();
            d.reduce = Some(ReduceOp::Sum);
            let c = caps.clone();
            let ok = validate_local(&d, 2, &c).is_ok();
            let h = crate::header::Header::new(2, &d).expect("fits");
            std::hint::black_box((ok, h));
        }
    }

    /// The strings of a pending Work: its meta, the completion's label (shared) and op name
    /// (static; until gpulat7 each a fresh `String`: 1,220 instructions per op, now ~610).
    #[test]
    #[ignore = "instruction-count probe for callgrind (gpulat7), not a check: run by name under valgrind --tool=callgrind"]
    fn strings() {
        let label: std::sync::Arc<str> = LABEL.into();
        for s in 0..N {
            let meta = WorkMeta { backend: "nccl".into(), op: "all_reduce".to_string(), seq: s, rank: 0 };
            let strings: (std::sync::Arc<str>, &'static str) = (label.clone(), "all_reduce");
            std::hint::black_box((meta, strings));
        }
    }
}
