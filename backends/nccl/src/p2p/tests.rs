//! The scheduler against simulated ranks: each rank has a user thread (issue returns at once,
//! waits block), one in-order progress thread (parks send / recv, runs collectives one at a
//! time and services the scheduler between jobs and while a collective waits for its peers),
//! and per direction a simulated stream on which an item completes only once the peer's stream
//! holds its counterpart at the same position (a send or header never completes alone, as on
//! NCCL). Both ranks' streams of a direction MUST hold the same sequence (a desync panics).
//! A program that stops moving is a deadlock (the test fails, naming it).

use super::*;
use crate::header::Header;
use concord_core::{CallDesc, CallOp, DType, TensorDesc};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A message: (source rank, index among its sends to that peer, length).
type Msg = (usize, usize, usize);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Item {
    Swap,
    Data { send: bool, msg: Option<Msg> },
}

#[derive(Default)]
struct Net {
    connected: HashMap<Dir, Vec<usize>>,
    /// (direction, rank) pairs where that rank gave up on the direction (the board's marks).
    gave_up: std::collections::HashSet<(Dir, usize)>,
    streams: HashMap<(Dir, usize), Vec<Item>>,
    hdrs: HashMap<(Dir, usize), Vec<Vec<u64>>>,
}

impl Net {
    fn peer(dir: Dir, me: usize) -> usize {
        if dir.src == me {
            dir.dst
        } else {
            dir.src
        }
    }
    /// Whether item `i` of `me`'s stream of `dir` has completed.
    fn done(&self, dir: Dir, me: usize, i: usize) -> bool {
        let mine = &self.streams[&(dir, me)];
        let Some(theirs) = self.streams.get(&(dir, Self::peer(dir, me))) else { return false };
        for (j, m) in mine.iter().enumerate().take(i + 1) {
            let Some(t) = theirs.get(j) else { return false };
            match (*m, *t) {
                (Item::Swap, Item::Swap) => {}
                (Item::Data { send: a, .. }, Item::Data { send: b, .. }) if a != b => {}
                (a, b) => panic!("stream desync on {dir:?} at item {j}: rank {me} has {a:?}, its peer {b:?}"),
            }
        }
        true
    }
}

struct SimWire {
    net: Rc<RefCell<Net>>,
    me: usize,
    /// A launch is accepted on the second look (as NCCL may take a while).
    looked: bool,
}

impl Wire for SimWire {
    type Connecting = Dir;
    type Link = Dir;
    type Swap = (usize, usize);
    type Payload = (bool, Option<Msg>);
    type Launching = Option<(Dir, usize)>;
    type Launched = (Dir, usize);

    fn connect(&mut self, dir: Dir) -> Result<Dir, String> {
        self.net.borrow_mut().connected.entry(dir).or_default().push(self.me);
        Ok(dir)
    }
    fn poll_connect(&mut self, c: &mut Dir) -> Poll<Result<Dir, String>> {
        let n = self.net.borrow();
        let both = n.connected.get(c).is_some_and(|v| v.contains(&c.src) && v.contains(&c.dst));
        if both {
            Poll::Ready(Ok(*c))
        } else {
            Poll::Pending
        }
    }
    fn swap(&mut self, link: &mut Dir, mine: &[u64]) -> Result<(usize, usize), String> {
        let mut n = self.net.borrow_mut();
        let s = n.streams.entry((*link, self.me)).or_default();
        s.push(Item::Swap);
        let i = s.len() - 1;
        let h = n.hdrs.entry((*link, self.me)).or_default();
        h.push(mine.to_vec());
        Ok((i, h.len() - 1))
    }
    fn poll_swap(&mut self, link: &mut Dir, s: &mut (usize, usize)) -> Poll<Result<Vec<u64>, String>> {
        let n = self.net.borrow();
        if !n.done(*link, self.me, s.0) {
            return Poll::Pending;
        }
        Poll::Ready(Ok(n.hdrs[&(*link, Net::peer(*link, self.me))][s.1].clone()))
    }
    fn launch(&mut self, link: &mut Dir, p: (bool, Option<Msg>)) -> Result<Option<(Dir, usize)>, String> {
        let mut n = self.net.borrow_mut();
        let s = n.streams.entry((*link, self.me)).or_default();
        s.push(Item::Data { send: p.0, msg: p.1 });
        Ok(Some((*link, s.len() - 1)))
    }
    fn poll_launch(&mut self, _link: &mut Dir, l: &mut Option<(Dir, usize)>) -> Poll<Result<(Dir, usize), String>> {
        // NCCL accepts a launch once it has been looked at (a first look: still pending).
        match l.take() {
            Some(x) if self.looked => {
                self.looked = false;
                Poll::Ready(Ok(x))
            }
            Some(x) => {
                self.looked = true;
                *l = Some(x);
                Poll::Pending
            }
            None => Poll::Ready(Err("polled twice".into())),
        }
    }
    fn idle(&mut self, _link: &mut Dir) -> bool {
        true
    }
    fn give_up(&mut self, dir: Dir) {
        self.net.borrow_mut().gave_up.insert((dir, self.me));
    }
    fn peer_gave_up(&self, dir: Dir) -> bool {
        self.net.borrow().gave_up.contains(&(dir, Net::peer(dir, self.me)))
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Send {
        peer: usize,
        len: usize,
    },
    Recv {
        peer: usize,
        len: usize,
    },
    /// A send whose rank failed locally after issuing it.
    SendFailing {
        peer: usize,
        len: usize,
    },
    Coll,
    /// Waits for the op issued at that step.
    Wait(usize),
}

#[derive(Clone, Debug, PartialEq)]
enum Res {
    Pending,
    Launched(Dir, usize),
    Done,
    Failed(Failure),
    /// A receive's final value.
    Got(Option<Msg>),
}

enum Job {
    P2p(usize),
    Coll(usize),
}

struct Rank {
    me: usize,
    prog: Vec<Step>,
    pc: usize,
    jobs: VecDeque<Job>,
    current: Option<(usize, usize)>,
    res: HashMap<usize, Res>,
    sched: Scheduler<SimWire, usize>,
    wire: SimWire,
    sent: HashMap<usize, usize>,
    aborts: Vec<String>,
    validate: bool,
    /// Whether a collective waiting for its peers parks the sends / recvs queued behind it
    /// (`worker::Tracker::service_waiting`).
    look_ahead: bool,
}

struct Sim {
    ranks: Vec<Rank>,
    net: Rc<RefCell<Net>>,
    arrived: Vec<usize>,
    now: Instant,
}

const TIMEOUT: Duration = Duration::from_secs(5);

impl Sim {
    fn new(progs: Vec<Vec<Step>>) -> Sim {
        Self::with(progs, true)
    }
    fn with(progs: Vec<Vec<Step>>, validate: bool) -> Sim {
        let net = Rc::new(RefCell::new(Net::default()));
        let n = progs.len();
        let ranks = progs
            .into_iter()
            .enumerate()
            .map(|(me, prog)| Rank {
                me,
                prog,
                pc: 0,
                jobs: VecDeque::new(),
                current: None,
                res: HashMap::new(),
                sched: Scheduler::new(me, TIMEOUT),
                wire: SimWire { net: net.clone(), me, looked: false },
                sent: HashMap::new(),
                aborts: Vec::new(),
                validate,
                look_ahead: true,
            })
            .collect();
        Sim { ranks, net, arrived: vec![0; n], now: Instant::now() }
    }

    fn header(ws: usize, me: usize, send: bool, peer: usize, len: usize) -> Vec<u64> {
        let op = if send { CallOp::Send } else { CallOp::Recv };
        Header::new(ws, &CallDesc::p2p(op, me, TensorDesc::new(DType::F32, &[len]), peer)).unwrap().words
    }

    /// One step of rank `r`'s progress thread and user thread; `true` if anything moved.
    fn tick(&mut self, r: usize) -> bool {
        let ws = self.ranks.len();
        let now = self.now;
        let arrived = self.arrived.clone();
        let rk = &mut self.ranks[r];
        let before = (rk.pc, rk.jobs.len(), rk.current, rk.res.clone(), rk.sched.parked());
        // Progress thread: service, then the current collective, then new jobs.
        let p = rk.sched.poll(&mut rk.wire, now);
        if let Some(a) = p.abort {
            rk.aborts.push(a);
        }
        for (step, o) in p.settled {
            rk.res.insert(
                step,
                match o {
                    Outcome::Launched((d, i)) => Res::Launched(d, i),
                    Outcome::Agreed => Res::Done,
                    Outcome::Failed(f) => Res::Failed(f),
                },
            );
        }
        if let Some((step, c)) = rk.current {
            if arrived.iter().all(|&a| a > c) {
                rk.res.insert(step, Res::Done);
                rk.current = None;
            }
        }
        loop {
            let next = if rk.current.is_none() {
                rk.jobs.pop_front()
            } else if rk.look_ahead {
                // Blocked in a collective's header wait: the sends / recvs queued behind it.
                let i = rk.jobs.iter().position(|j| matches!(j, Job::P2p(_)));
                i.and_then(|i| rk.jobs.remove(i))
            } else {
                None
            };
            match next {
                None => break,
                Some(Job::P2p(step)) => {
                    let (send, peer, len, local) = match rk.prog[step] {
                        Step::Send { peer, len } => (true, peer, len, None),
                        Step::SendFailing { peer, len } => (true, peer, len, Some("a simulated out-of-memory".to_string())),
                        Step::Recv { peer, len } => (false, peer, len, None),
                        _ => unreachable!(),
                    };
                    let msg = send.then(|| {
                        let k = rk.sent.entry(peer).or_insert(0);
                        *k += 1;
                        (rk.me, *k - 1, len)
                    });
                    let hdr = Self::header(ws, rk.me, send, peer, len);
                    let hdr = if local.is_some() { Header { words: hdr }.failed().words } else { hdr };
                    rk.sched.park(Parked {
                        token: step,
                        hdr: rk.validate.then_some(hdr),
                        peer,
                        send,
                        payload: local.is_none().then_some((send, msg)),
                        local,
                        started: now,
                    });
                }
                Some(Job::Coll(step)) => {
                    let c = self.arrived[r];
                    self.arrived[r] += 1;
                    rk.current = Some((step, c));
                }
            }
        }
        // User thread.
        if rk.pc < rk.prog.len() {
            match rk.prog[rk.pc] {
                Step::Send { .. } | Step::Recv { .. } | Step::SendFailing { .. } => {
                    rk.jobs.push_back(Job::P2p(rk.pc));
                    rk.res.insert(rk.pc, Res::Pending);
                    rk.pc += 1;
                }
                Step::Coll => {
                    rk.jobs.push_back(Job::Coll(rk.pc));
                    rk.res.insert(rk.pc, Res::Pending);
                    rk.pc += 1;
                }
                Step::Wait(h) => {
                    let net = self.net.borrow();
                    let fin = match rk.res[&h].clone() {
                        Res::Pending => None,
                        Res::Launched(d, i) if net.done(d, r, i) => match net.streams[&(d, Net::peer(d, r))][i] {
                            Item::Data { send: true, msg } => Some(Res::Got(msg)),
                            _ => Some(Res::Done),
                        },
                        Res::Launched(..) => None,
                        other => Some(other),
                    };
                    if let Some(f) = fin {
                        rk.res.insert(h, f);
                        rk.pc += 1;
                    }
                }
            }
        }
        before != (rk.pc, rk.jobs.len(), rk.current, rk.res.clone(), rk.sched.parked())
    }

    /// Runs until every program ends; `Err` names a deadlock (nothing moved for a while).
    fn run(&mut self) -> Result<(), String> {
        let mut still = 0;
        while self.ranks.iter().any(|r| r.pc < r.prog.len()) {
            let mut moved = false;
            for r in 0..self.ranks.len() {
                moved |= self.tick(r);
            }
            self.now += Duration::from_millis(1);
            still = if moved { 0 } else { still + 1 };
            if still > 100 {
                let at: Vec<String> = self.ranks.iter().map(|r| format!("rank {} at step {} {:?}", r.me, r.pc, r.prog.get(r.pc))).collect();
                return Err(format!("deadlock: {}", at.join("; ")));
            }
        }
        Ok(())
    }

    /// Runs past every deadline (for programs that cannot complete).
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end && self.ranks.iter().any(|r| r.pc < r.prog.len()) {
            for r in 0..self.ranks.len() {
                self.tick(r);
            }
            self.now += Duration::from_millis(10);
        }
    }

    fn res(&self, r: usize, step: usize) -> Res {
        self.ranks[r].res[&step].clone()
    }
}

/// The suite's `exchange`: `n` sends to `peer` and `n` receives from it in `recvs_first` order,
/// then waits for every receive, then every send. Message `k` has length `len(k)`.
fn exchange(peer: usize, n: usize, recvs_first: bool, len: impl Fn(usize) -> usize) -> Vec<Step> {
    let sends: Vec<Step> = (0..n).map(|k| Step::Send { peer, len: len(k) }).collect();
    let recvs: Vec<Step> = (0..n).map(|k| Step::Recv { peer, len: len(k) }).collect();
    let mut p: Vec<Step> = if recvs_first { recvs.into_iter().chain(sends).collect() } else { sends.into_iter().chain(recvs).collect() };
    let (r0, s0) = if recvs_first { (0, n) } else { (n, 0) };
    p.extend((0..n).map(|k| Step::Wait(r0 + k)));
    p.extend((0..n).map(|k| Step::Wait(s0 + k)));
    p
}

/// Checks that receive `k` from `peer` (issued at `recv_steps[k]`) got message `k`.
fn assert_in_order(sim: &Sim, r: usize, peer: usize, recv_steps: impl Iterator<Item = usize>, len: impl Fn(usize) -> usize) {
    for (k, step) in recv_steps.enumerate() {
        assert_eq!(sim.res(r, step), Res::Got(Some((peer, k, len(k)))), "rank {r} receive #{k}");
    }
}

fn sizes(k: usize) -> usize {
    [1, 7, 64, 1000][k % 4] + k
}

#[test]
fn recv_first_on_both_ranks_completes_in_order() {
    for n in [1, 20] {
        for validate in [true, false] {
            let mut sim = Sim::with(vec![exchange(1, n, true, sizes), exchange(0, n, true, sizes)], validate);
            sim.run().unwrap_or_else(|e| panic!("n={n} validate={validate}: {e}"));
            assert_in_order(&sim, 0, 1, 0..n, sizes);
            assert_in_order(&sim, 1, 0, 0..n, sizes);
        }
    }
}

#[test]
fn many_sends_in_flight_both_ways_before_receives() {
    for (n, same) in [(4, true), (4, false), (17, false)] {
        let len = move |k: usize| if same { 16 } else { sizes(k) };
        let mut sim = Sim::new(vec![exchange(1, n, false, len), exchange(0, n, false, len)]);
        sim.run().unwrap();
        assert_in_order(&sim, 0, 1, n..2 * n, len);
        assert_in_order(&sim, 1, 0, n..2 * n, len);
    }
}

#[test]
fn mixed_orders_and_one_way_bursts() {
    let mut sim = Sim::new(vec![exchange(1, 1, true, sizes), exchange(0, 1, false, sizes)]);
    sim.run().unwrap();
    assert_in_order(&sim, 0, 1, 0..1, sizes);
    // many_sends_one_way: rank 0 sends 17 before receiving; rank 1 receives 17 first.
    let mut sim = Sim::new(vec![exchange(1, 17, false, sizes), exchange(0, 17, true, sizes)]);
    sim.run().unwrap();
    assert_in_order(&sim, 1, 0, 0..17, sizes);
    assert_in_order(&sim, 0, 1, 17..34, sizes);
}

#[test]
fn a_pending_recv_does_not_hold_back_a_barrier() {
    // rank 0: irecv(1); barrier; wait; rank 1: barrier; isend(0); wait.
    let p0 = vec![Step::Recv { peer: 1, len: 16 }, Step::Coll, Step::Wait(1), Step::Wait(0)];
    let p1 = vec![Step::Coll, Step::Wait(0), Step::Send { peer: 0, len: 16 }, Step::Wait(2)];
    let mut sim = Sim::new(vec![p0, p1]);
    sim.run().unwrap();
    assert_eq!(sim.res(0, 0), Res::Got(Some((1, 0, 16))));
}

#[test]
fn a_pending_send_does_not_hold_back_a_collective() {
    // rank 0: isend(1); all_reduce; wait both; rank 1: irecv(0); wait; all_reduce; wait.
    let p0 = vec![Step::Send { peer: 1, len: 8 }, Step::Coll, Step::Wait(1), Step::Wait(0)];
    let p1 = vec![Step::Recv { peer: 0, len: 8 }, Step::Wait(0), Step::Coll, Step::Wait(2)];
    let mut sim = Sim::new(vec![p0, p1]);
    sim.run().unwrap();
    assert_eq!(sim.res(1, 0), Res::Got(Some((0, 0, 8))));
}

#[test]
fn a_send_queued_behind_a_waiting_collective_moves() {
    // rank 0: all_reduce; isend(1); wait both; rank 1: irecv(0); wait; all_reduce; wait. Rank
    // 0's send is queued behind its all_reduce, which waits for rank 1's, which waits for the
    // send: only parking sends / recvs queued behind a waiting collective completes it.
    let progs = || {
        vec![
            vec![Step::Coll, Step::Send { peer: 1, len: 8 }, Step::Wait(0), Step::Wait(1)],
            vec![Step::Recv { peer: 0, len: 8 }, Step::Wait(0), Step::Coll, Step::Wait(2)],
        ]
    };
    let mut sim = Sim::new(progs());
    sim.run().unwrap();
    assert_eq!(sim.res(1, 0), Res::Got(Some((0, 0, 8))));
    let mut strict = Sim::new(progs());
    strict.ranks.iter_mut().for_each(|r| r.look_ahead = false);
    assert!(strict.run().is_err(), "without the look-ahead this program deadlocks (the test can fail)");
}

#[test]
fn rings_and_recursive_doubling_complete() {
    for ws in [2, 3, 4] {
        // Ring: send right, receive left, wait both; ws - 1 rounds.
        let progs = (0..ws)
            .map(|r| {
                let mut p = Vec::new();
                for _ in 1..ws {
                    let i = p.len();
                    p.extend([Step::Send { peer: (r + 1) % ws, len: 4 }, Step::Recv { peer: (r + ws - 1) % ws, len: 4 }]);
                    p.extend([Step::Wait(i), Step::Wait(i + 1)]);
                }
                p
            })
            .collect();
        let mut sim = Sim::new(progs);
        sim.run().unwrap_or_else(|e| panic!("ring ws{ws}: {e}"));
        for r in 0..ws {
            assert_eq!(sim.res(r, 1), Res::Got(Some(((r + ws - 1) % ws, 0, 4))), "ring ws{ws} rank {r}");
        }
    }
    // Recursive doubling at ws4: send to and receive from r ^ d.
    let progs = (0..4)
        .map(|r: usize| {
            let mut p = Vec::new();
            for d in [1, 2] {
                let i = p.len();
                p.extend([Step::Send { peer: r ^ d, len: 2 }, Step::Recv { peer: r ^ d, len: 2 }, Step::Wait(i), Step::Wait(i + 1)]);
            }
            p
        })
        .collect();
    Sim::new(progs).run().unwrap();
}

#[test]
fn a_size_mismatch_fails_both_sides_alike_and_the_pair_stays_usable() {
    let p0 = vec![Step::Send { peer: 1, len: 6 }, Step::Wait(0), Step::Send { peer: 1, len: 3 }, Step::Wait(2)];
    let p1 = vec![Step::Recv { peer: 0, len: 4 }, Step::Wait(0), Step::Recv { peer: 0, len: 3 }, Step::Wait(2)];
    let mut sim = Sim::new(vec![p0, p1]);
    sim.run().unwrap();
    let (a, b) = (sim.res(0, 0), sim.res(1, 0));
    assert!(matches!(&a, Res::Failed(Failure::Bad(BadInputKind::OutBufferSize, _))), "{a:?}");
    assert_eq!(a, b, "one verdict on both ranks");
    // Nothing moved for the failed pair: the next message is the sender's second send.
    assert_eq!(sim.res(1, 2), Res::Got(Some((0, 1, 3))));
    assert!(sim.ranks.iter().all(|r| r.aborts.is_empty()), "a bad input aborts nothing");
}

#[test]
fn a_mismatch_after_a_good_pair_is_named_on_both_ranks() {
    // Two sends in flight; the second meets a receive of another length.
    let p0 = vec![Step::Send { peer: 1, len: 5 }, Step::Send { peer: 1, len: 5 }, Step::Wait(0), Step::Wait(1)];
    let p1 = vec![Step::Recv { peer: 0, len: 5 }, Step::Recv { peer: 0, len: 9 }, Step::Wait(0), Step::Wait(1)];
    let mut sim = Sim::new(vec![p0, p1]);
    sim.run().unwrap();
    assert_eq!(sim.res(1, 0), Res::Got(Some((0, 0, 5))));
    assert_eq!(sim.res(0, 1), sim.res(1, 1));
    assert!(matches!(sim.res(0, 1), Res::Failed(Failure::Bad(BadInputKind::OutBufferSize, _))));
}

#[test]
fn a_local_failure_names_the_failing_rank_on_its_peer() {
    let p0 = vec![Step::SendFailing { peer: 1, len: 4 }, Step::Wait(0), Step::Send { peer: 1, len: 4 }, Step::Wait(2)];
    let p1 = vec![Step::Recv { peer: 0, len: 4 }, Step::Wait(0), Step::Recv { peer: 0, len: 4 }, Step::Wait(2)];
    let mut sim = Sim::new(vec![p0, p1]);
    sim.run().unwrap();
    assert!(matches!(sim.res(0, 0), Res::Failed(Failure::Local(_))));
    assert_eq!(sim.res(1, 0), Res::Failed(Failure::PeerFailed(0)));
    // The failed op's second send is the sender's first message (index 1 in its count).
    assert_eq!(sim.res(1, 2), Res::Got(Some((0, 1, 4))));
}

#[test]
fn a_missing_peer_times_out_kills_the_direction_and_asks_for_an_abort() {
    // Rank 1 never receives; rank 0's two sends: the first times out, the second fails with it.
    let p0 = vec![Step::Send { peer: 1, len: 4 }, Step::Send { peer: 1, len: 4 }, Step::Wait(0), Step::Wait(1)];
    let mut sim = Sim::new(vec![p0, vec![]]);
    assert!(sim.run().is_err(), "cannot complete before the deadline");
    sim.run_for(TIMEOUT * 2);
    assert!(matches!(sim.res(0, 0), Res::Failed(Failure::Timeout { .. })), "{:?}", sim.res(0, 0));
    assert!(matches!(sim.res(0, 1), Res::Failed(Failure::Aborted(_))), "{:?}", sim.res(0, 1));
    assert_eq!(sim.ranks[0].aborts.len(), 1);
    // A send parked after that fails at once.
    let now = sim.now;
    let r0 = &mut sim.ranks[0];
    r0.sched.park(Parked { token: 99, hdr: None, peer: 1, send: true, local: None, payload: None, started: now });
    let p = r0.sched.poll(&mut r0.wire, now);
    assert!(matches!(&p.settled[..], [(99, Outcome::Failed(Failure::Aborted(_)))]));
}

#[test]
fn a_waiting_peer_within_the_deadline_is_only_pending_then_completes() {
    // Rank 1 sends only after a long collective-free delay (many ticks of nothing): the
    // receive stays pending meanwhile and completes once the send is issued.
    let p0 = vec![Step::Recv { peer: 1, len: 3 }, Step::Wait(0)];
    let mut sim = Sim::new(vec![p0, vec![]]);
    assert!(sim.run().is_err());
    assert_eq!(sim.res(0, 0), Res::Pending);
    sim.ranks[1].prog = vec![Step::Send { peer: 0, len: 3 }, Step::Wait(0)];
    sim.run().unwrap();
    assert_eq!(sim.res(0, 0), Res::Got(Some((1, 0, 3))));
}

#[test]
fn fail_all_settles_every_parked_op() {
    let mut sim = Sim::new(vec![vec![Step::Recv { peer: 1, len: 3 }, Step::Send { peer: 1, len: 3 }, Step::Wait(0)], vec![]]);
    let _ = sim.run();
    let r = &mut sim.ranks[0];
    assert_eq!(r.sched.parked(), 2);
    let failed = r.sched.fail_all("the communicator was aborted");
    assert_eq!(failed.len(), 2);
    assert_eq!(r.sched.parked(), 0);
    assert!(!r.sched.busy(&mut r.wire));
}

/// review of p2pfail's cases on NCCL (`faults::late_sender::recvs_in_flight`): rank 1's receive
/// times out with its header swap enqueued (on NCCL its header already sits in rank 0's
/// buffers); rank 0 sends later. Its swap pairs with that stale header, so without the peer's
/// give-up mark the send was agreed and launched (an eager send then returned `Ok` into a peer
/// that had given up). It MUST fail, named, and launch nothing.
#[test]
fn a_send_after_its_receiver_gave_up_fails_and_launches_nothing() {
    let p1 = vec![Step::Recv { peer: 0, len: 4 }, Step::Wait(0)];
    let mut sim = Sim::new(vec![vec![], p1]);
    assert!(sim.run().is_err(), "cannot complete before the deadline");
    sim.run_for(TIMEOUT * 2);
    assert!(matches!(sim.res(1, 0), Res::Failed(Failure::Timeout { .. })), "{:?}", sim.res(1, 0));
    sim.ranks[0].prog = vec![Step::Send { peer: 1, len: 4 }, Step::Wait(0)];
    sim.run_for(Duration::from_millis(100));
    assert_eq!(sim.res(0, 0), Res::Failed(Failure::PeerGaveUp(1)), "the late send");
    assert_eq!(sim.ranks[0].aborts.len(), 1, "the direction is dead: the owner aborts");
    assert!(
        !sim.net.borrow().streams.get(&(Dir { src: 0, dst: 1 }, 0)).is_some_and(|s| s.iter().any(|i| matches!(i, Item::Data { .. }))),
        "no data launched"
    );
}

/// The mirror (`faults::late_receiver::sends_in_flight`): rank 0's send times out; rank 1's
/// later receive MUST fail at once, named, instead of launching a receive nobody sends to (on
/// NCCL: a kernel that hangs past the op deadline).
#[test]
fn a_receive_after_its_sender_gave_up_fails_and_launches_nothing() {
    let p0 = vec![Step::Send { peer: 1, len: 4 }, Step::Wait(0)];
    let mut sim = Sim::new(vec![p0, vec![]]);
    assert!(sim.run().is_err(), "cannot complete before the deadline");
    sim.run_for(TIMEOUT * 2);
    assert!(matches!(sim.res(0, 0), Res::Failed(Failure::Timeout { .. })), "{:?}", sim.res(0, 0));
    sim.ranks[1].prog = vec![Step::Recv { peer: 0, len: 4 }, Step::Wait(0)];
    sim.run_for(Duration::from_millis(100));
    assert_eq!(sim.res(1, 0), Res::Failed(Failure::PeerGaveUp(0)), "the late receive");
    assert!(
        !sim.net.borrow().streams.get(&(Dir { src: 0, dst: 1 }, 1)).is_some_and(|s| s.iter().any(|i| matches!(i, Item::Data { .. }))),
        "no data launched"
    );
}
