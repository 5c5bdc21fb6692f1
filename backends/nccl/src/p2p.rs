//! Point-to-point matching and scheduling, pure (no CUDA, no NCCL): which send meets which
//! receive, in what order, and when an op gives up. The NCCL side (`direction`) implements
//! [`Wire`]; the tests below implement it with simulated ranks and streams.
//!
//! Design (issue: p2p on NCCL). Every ordered pair `src -> dst` of a communicator is a
//! *direction* with a communicator of its own (two ranks, its own stream, set up on first use
//! by both ranks). A rank's sends to `p` go to direction `me -> p`, its receives from `p` to
//! direction `p -> me`. Per direction, ops are handled strictly one after the other, in issue
//! order: the head op's header is swapped with the peer's (a grouped send + receive of the
//! header on the direction's communicator), the pair rule of the core rule table decides
//! (`header::pair_verdict`), then the data send / receive is launched and the next op becomes
//! the head. So both ranks enqueue the same sequence on the direction's stream (header 0,
//! data 0, header 1, data 1, ...): the `k`-th send from `a` to `b` meets the `k`-th receive on
//! `b` from `a` (clause p2p.matching), in order (p2p.order), a send never meets a send, and a
//! receive waiting for its sender holds back nothing but later ops of its own direction (no
//! other direction, no collective: p2p.no_deadlock).
//!
//! Contracts:
//! * [`Scheduler::poll`] never blocks on a peer: it advances every direction as far as it can
//!   (the [`Wire`]'s calls only enqueue or look) and returns the ops it settled. The owner calls
//!   it between jobs, while idle and inside every wait of its thread.
//! * A head op gives up at `max(its start, when its direction reached it) + op timeout` (the
//!   direction's set-up or the header swap still pending): [`Failure::Timeout`]. That, and a
//!   [`Wire`] error, kill the direction: every op queued behind fails too, later ops fail at
//!   once, and the verdict asks the owner to abort the communicator ([`Polled::abort`]) — an
//!   abandoned header swap left enqueued would pair with the peer's next one. A rank that
//!   kills a direction says so where its peer sees it at once ([`Wire::give_up`]: the host
//!   board); the peer's ops of that direction not yet agreed fail at once
//!   ([`Failure::PeerGaveUp`], killing the direction there too) instead of pairing with a
//!   header swapped before the give-up (an eager send would then return `Ok` into a peer that
//!   had given up, a receive would launch a kernel nobody sends to).
//! * A mismatch (dtype, size, send meeting send...) is [`Failure::Bad`] on *both* ranks (both
//!   run the same rule over the same two headers), nothing is launched, and the direction goes
//!   on with the next op.

use crate::header::{pair_verdict, PairVerdict};
use concord_core::BadInputKind;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A direction of a communicator: messages from rank `src` to rank `dst` (ranks of the
/// communicator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Dir {
    pub src: usize,
    pub dst: usize,
}

/// A non-blocking look at something in progress.
pub(crate) enum Poll<T> {
    Pending,
    Ready(T),
}

/// What the scheduler needs from the transport (NCCL direction communicators on a GPU; a
/// simulation in the tests). Every call returns at once.
pub(crate) trait Wire {
    /// A direction communicator being set up.
    type Connecting;
    /// A direction communicator, ready.
    type Link;
    /// A header swap in flight.
    type Swap;
    /// What an agreed op launches (its data send or receive).
    type Payload;
    /// A launch NCCL is still accepting (it may need the peer: a first connection).
    type Launching;
    /// A launched op (for its completion).
    type Launched;

    /// Starts setting up `dir` (both ranks of the direction do).
    fn connect(&mut self, dir: Dir) -> Result<Self::Connecting, String>;
    fn poll_connect(&mut self, c: &mut Self::Connecting) -> Poll<Result<Self::Link, String>>;
    /// Enqueues the swap of `mine` with the peer's header on `link`.
    fn swap(&mut self, link: &mut Self::Link, mine: &[u64]) -> Result<Self::Swap, String>;
    /// The peer's header once the swap is done.
    fn poll_swap(&mut self, link: &mut Self::Link, s: &mut Self::Swap) -> Poll<Result<Vec<u64>, String>>;
    /// Starts enqueuing an agreed op's data on `link` (after everything enqueued on it before).
    fn launch(&mut self, link: &mut Self::Link, p: Self::Payload) -> Result<Self::Launching, String>;
    /// The launched op once NCCL has accepted it.
    fn poll_launch(&mut self, link: &mut Self::Link, l: &mut Self::Launching) -> Poll<Result<Self::Launched, String>>;
    /// Releases what finished ops of `link` kept alive; `true` when it holds nothing more.
    fn idle(&mut self, link: &mut Self::Link) -> bool;
    /// Publishes, where the peer sees it at once (the communicator's host board), that this
    /// rank gave up on `dir`: a head op of it timed out or its transport failed. A no-op where
    /// there is no such place (ranks on several hosts, `header_board=0`).
    fn give_up(&mut self, dir: Dir);
    /// Whether the peer gave up on `dir` ([`Wire::give_up`]); `false` where it cannot be known.
    fn peer_gave_up(&self, dir: Dir) -> bool;
}

/// One parked send or receive.
pub(crate) struct Parked<P, T> {
    /// What the owner gets back with the outcome (ticket, ids...).
    pub token: T,
    /// This rank's header (possibly marked failed); `None`: validation is off, no swap.
    pub hdr: Option<Vec<u64>>,
    /// The communicator rank of the other side.
    pub peer: usize,
    pub send: bool,
    /// A local failure of this rank (the header says so): after the swap the op fails with it.
    pub local: Option<String>,
    /// The data to launch once agreed (`None`: nothing to move, or a header-only op).
    pub payload: Option<P>,
    /// When the owner's thread started the op (its deadline counts from here at the earliest).
    pub started: Instant,
}

/// Why an op failed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Failure {
    /// The pair rule's verdict (the same on both ranks).
    Bad(BadInputKind, String),
    /// The peer failed its side locally after issuing it (its header said so).
    PeerFailed(usize),
    /// The peer gave up on the direction before this op could pair (an op of its side timed
    /// out or its transport failed: [`Wire::give_up`]); a header it swapped before that may
    /// still be in this rank's buffers, so nothing is agreed or launched.
    PeerGaveUp(usize),
    /// This rank's own local failure ([`Parked::local`]).
    Local(String),
    /// Nothing from the peer before the deadline (`what` was still pending).
    Timeout { what: &'static str, waited: Duration },
    /// The transport failed.
    Wire(String),
    /// An earlier op of its direction failed (the direction is dead), or the owner gave up.
    Aborted(String),
}

/// How an op ended.
pub(crate) enum Outcome<L> {
    Launched(L),
    /// Agreed, with nothing to move.
    Agreed,
    Failed(Failure),
}

/// What one [`Scheduler::poll`] settled.
pub(crate) struct Polled<T, L> {
    pub settled: Vec<(T, Outcome<L>)>,
    /// A direction died (timeout, transport error): the owner MUST abort the communicator.
    pub abort: Option<String>,
}

enum Conn<W: Wire> {
    Idle,
    Connecting(W::Connecting, Instant),
    Ready(W::Link),
    Dead(String),
}

/// Where the head op of a ready direction stands (each step with when it started).
enum Head<W: Wire> {
    Idle,
    Swapping(W::Swap, Instant),
    Launching(W::Launching, Instant),
}

struct DirState<W: Wire, T> {
    dir: Dir,
    conn: Conn<W>,
    queue: VecDeque<Parked<W::Payload, T>>,
    head: Head<W>,
}

/// The parked point-to-point ops of one rank in one communicator, by direction.
pub(crate) struct Scheduler<W: Wire, T> {
    me: usize,
    op_timeout: Duration,
    dirs: Vec<DirState<W, T>>,
}

impl<W: Wire, T> Scheduler<W, T> {
    pub fn new(me: usize, op_timeout: Duration) -> Self {
        Scheduler { me, op_timeout, dirs: Vec::new() }
    }

    /// The direction an op of this rank uses.
    pub fn dir_of(&self, peer: usize, send: bool) -> Dir {
        if send {
            Dir { src: self.me, dst: peer }
        } else {
            Dir { src: peer, dst: self.me }
        }
    }

    /// Parks `op` behind every earlier op of its direction.
    pub fn park(&mut self, op: Parked<W::Payload, T>) {
        let dir = self.dir_of(op.peer, op.send);
        let i = match self.dirs.iter().position(|d| d.dir == dir) {
            Some(i) => i,
            None => {
                self.dirs.push(DirState { dir, conn: Conn::Idle, queue: VecDeque::new(), head: Head::Idle });
                self.dirs.len() - 1
            }
        };
        self.dirs[i].queue.push_back(op);
    }

    /// Ops parked and not settled yet.
    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.dirs.iter().map(|d| d.queue.len()).sum()
    }

    /// Whether a [`Scheduler::poll`] may still have something to do (ops parked, or finished
    /// ops whose memory is kept until their data moved).
    pub fn busy(&mut self, wire: &mut W) -> bool {
        let mut busy = false;
        for d in &mut self.dirs {
            busy |= !d.queue.is_empty();
            if let Conn::Ready(l) = &mut d.conn {
                busy |= !wire.idle(l);
            }
        }
        busy
    }

    /// Fails every parked op with `why` (the communicator was aborted, the owner is gone).
    pub fn fail_all(&mut self, why: &str) -> Vec<(T, Outcome<W::Launched>)> {
        let mut out = Vec::new();
        for d in &mut self.dirs {
            d.head = Head::Idle;
            if !d.queue.is_empty() {
                d.conn = Conn::Dead(why.to_string());
            }
            out.extend(d.queue.drain(..).map(|op| (op.token, Outcome::Failed(Failure::Aborted(why.to_string())))));
        }
        out
    }

    /// Advances every direction as far as it goes without waiting. See the module docs.
    pub fn poll(&mut self, wire: &mut W, now: Instant) -> Polled<T, W::Launched> {
        let mut p = Polled { settled: Vec::new(), abort: None };
        let (me, timeout) = (self.me, self.op_timeout);
        for d in &mut self.dirs {
            if let Some(why) = Self::advance(d, wire, now, me, timeout, &mut p.settled) {
                p.abort.get_or_insert(why);
            }
        }
        p
    }

    /// One direction; `Some(reason)` when it died.
    fn advance(
        d: &mut DirState<W, T>,
        wire: &mut W,
        now: Instant,
        me: usize,
        timeout: Duration,
        out: &mut Vec<(T, Outcome<W::Launched>)>,
    ) -> Option<String> {
        loop {
            let head = d.queue.front()?;
            let started = head.started;
            let fail = match &mut d.conn {
                Conn::Dead(why) => {
                    let why = why.clone();
                    out.extend(d.queue.drain(..).map(|op| (op.token, Outcome::Failed(Failure::Aborted(why.clone())))));
                    return None;
                }
                Conn::Idle => match wire.connect(d.dir) {
                    Ok(c) => {
                        d.conn = Conn::Connecting(c, now);
                        continue;
                    }
                    Err(e) => Failure::Wire(e),
                },
                Conn::Connecting(c, since) => {
                    let since = *since;
                    match wire.poll_connect(c) {
                        Poll::Ready(Ok(link)) => {
                            d.conn = Conn::Ready(link);
                            continue;
                        }
                        Poll::Ready(Err(e)) => Failure::Wire(e),
                        Poll::Pending if now >= since.max(started) + timeout => {
                            Failure::Timeout { what: "the peer's side of the direction's set-up", waited: now - started }
                        }
                        Poll::Pending => return None,
                    }
                }
                Conn::Ready(link) => {
                    let head = d.queue.front_mut().expect("a head");
                    let step = match &mut d.head {
                        // Not agreed yet (nothing launched): a peer that gave up on the
                        // direction fails it here, whatever a stale swap says.
                        Head::Idle | Head::Swapping(..) if wire.peer_gave_up(d.dir) => Err(Failure::PeerGaveUp(head.peer)),
                        Head::Idle => match (&head.hdr, &head.local) {
                            (Some(mine), _) => match wire.swap(link, mine) {
                                Ok(s) => {
                                    d.head = Head::Swapping(s, now);
                                    continue;
                                }
                                Err(e) => Err(Failure::Wire(e)),
                            },
                            // Validation off: launch in issue order, nothing to agree on.
                            (None, Some(e)) => Ok(Outcome::Failed(Failure::Local(e.clone()))),
                            (None, None) => Ok(Outcome::Agreed),
                        },
                        Head::Swapping(s, at) => {
                            let at = *at;
                            match wire.poll_swap(link, s) {
                                Poll::Pending if now >= at.max(started) + timeout => {
                                    Err(Failure::Timeout { what: "the peer's header (its matching send / receive)", waited: now - started })
                                }
                                Poll::Pending => return None,
                                Poll::Ready(Err(e)) => Err(Failure::Wire(e)),
                                Poll::Ready(Ok(theirs)) => {
                                    d.head = Head::Idle;
                                    let mine = head.hdr.as_deref().expect("swapped");
                                    Ok(match (&head.local, pair_verdict(mine, &theirs, me, head.peer)) {
                                        (Some(e), _) => Outcome::Failed(Failure::Local(e.clone())),
                                        (None, PairVerdict::PeerFailed(r)) => Outcome::Failed(Failure::PeerFailed(r)),
                                        (None, PairVerdict::Bad(k, detail)) => Outcome::Failed(Failure::Bad(k, detail)),
                                        (None, PairVerdict::Agree) => Outcome::Agreed,
                                    })
                                }
                            }
                        }
                        Head::Launching(l, at) => {
                            let at = *at;
                            match wire.poll_launch(link, l) {
                                Poll::Pending if now >= at + timeout => Err(Failure::Timeout {
                                    what: "NCCL's acceptance of the data (its connection to the peer, or room among the direction's data ops in flight that the peer has not matched yet)",
                                    waited: now - started,
                                }),
                                Poll::Pending => return None,
                                Poll::Ready(Err(e)) => Err(Failure::Wire(e)),
                                Poll::Ready(Ok(l)) => {
                                    d.head = Head::Idle;
                                    let op = d.queue.pop_front().expect("a head");
                                    out.push((op.token, Outcome::Launched(l)));
                                    continue;
                                }
                            }
                        }
                    };
                    match step {
                        // Agreed: launch its data, if any (the head stays until NCCL took it).
                        Ok(Outcome::Agreed) => match head.payload.take() {
                            None => {
                                let op = d.queue.pop_front().expect("a head");
                                out.push((op.token, Outcome::Agreed));
                                continue;
                            }
                            Some(pl) => match wire.launch(link, pl) {
                                Ok(l) => {
                                    d.head = Head::Launching(l, now);
                                    continue;
                                }
                                Err(e) => Failure::Wire(e),
                            },
                        },
                        Ok(outcome) => {
                            let op = d.queue.pop_front().expect("a head");
                            out.push((op.token, outcome));
                            continue;
                        }
                        Err(f) => f,
                    }
                }
            };
            // The head failed in a way that kills the direction.
            let why = match &fail {
                Failure::Timeout { what, waited } => format!(
                    "send/recv between ranks {} -> {}: {what} did not arrive within the op deadline (waited {} ms)",
                    d.dir.src,
                    d.dir.dst,
                    waited.as_millis()
                ),
                Failure::Wire(e) => e.clone(),
                Failure::PeerGaveUp(r) => format!(
                    "send/recv between ranks {} -> {}: rank {r} gave up on this direction before this op could pair (an op of its side timed out or its transport failed)",
                    d.dir.src, d.dir.dst
                ),
                other => format!("{other:?}"),
            };
            wire.give_up(d.dir);
            let op = d.queue.pop_front().expect("a head");
            out.push((op.token, Outcome::Failed(fail)));
            return Some(Self::kill(d, why, out));
        }
    }

    /// Marks `d` dead and fails everything queued in it; returns the reason.
    fn kill(d: &mut DirState<W, T>, why: String, out: &mut Vec<(T, Outcome<W::Launched>)>) -> String {
        d.head = Head::Idle;
        let later = format!("an earlier send/recv between ranks {} -> {} failed: {why}", d.dir.src, d.dir.dst);
        out.extend(d.queue.drain(..).map(|op| (op.token, Outcome::Failed(Failure::Aborted(later.clone())))));
        d.conn = Conn::Dead(later);
        why
    }
}

#[cfg(test)]
mod tests;
