//! The control segment of one communicator (world or subgroup) and the waits built on it.
//!
//! Layout (all offsets in bytes):
//! * header (256): magic `u64` @0, world size `u64` @8, `abort_by` `u32` @16 (0, or 1 + the
//!   rank that poisoned the communicator: [`POISON_CAUSES`]; never after a local failure).
//! * one 128-byte slot per rank: `counter` @0 (the rank's barrier step, a futex word),
//!   `waiters` @4, `pid` @8 (for messages only), `gone` @12 (set when the rank's backend is
//!   dropped, after its progress thread was joined), `post_off` `u64` @16 and `post_len` `u64`
//!   @24 (where in the rank's arena its current post lies), `open` @32 (the token of the op
//!   whose post and buffers peers may touch, 0 = closed), `touching` `u64` @40 (bit `p`: rank
//!   `p` is touching this rank's post or buffers right now) and `failed` `[u32; 4]` @48 (the
//!   tokens of the last ops whose side failed *locally* on this rank, slot `token % 4`: see
//!   "Local failures" below).
//! * liveness: each rank holds an open-file-description lock on byte `rank` of the segment
//!   (taken before it publishes its pid); a peer that published its pid and holds no lock is
//!   dead — whatever its pid names now (pid reuse) and whatever pid namespace it ran in.
//! * one point-to-point channel per ordered pair (src, dst): `posted` @0 (sends posted, a futex
//!   word), `posted_waiters` @4, `consumed` @8 (receives done), `consumed_waiters` @12, then a
//!   ring of [`RING`] 32-byte entries: sender buffer offset `u64` @0, byte length `u64` @8,
//!   dtype code `u32` @16, verdict `u32` @20 (written by the receiver), element count `u64` @24.
//!
//! A barrier at step `s`: every rank stores `s` into its counter (waking sleepers), then waits
//! until every other rank's counter has reached `s`. Waits spin briefly (only when the ranks fit
//! on the CPUs), then yield the CPU between looks for a while (`SPIN`, `YIELD`, both counted from
//! the start of the whole wait: one window per barrier, not one per peer or per slice of a wait
//! that is resumed), then sleep on the futex in slices of at most 20 ms, checking between slices the deadline, the peer's
//! liveness (its lock and `gone`) and the communicator's `abort_by`.
//!
//! **Claims** (issue 15 item 7): a rank posts with `open = token` (its op's first barrier
//! step). Before touching a peer's post memory or buffers, a rank sets its bit in the peer's
//! `touching` word, *then* reads the peer's `open`: if it is not the op's token it clears the bit
//! and touches nothing. A rank whose op fails after posting *closes*: stores `open = 0`, then
//! waits until no live peer's bit is set in its `touching` word. Both sides use SeqCst, so either
//! the claimer sees the close (and backs off) or the closer sees the claim (and waits for its
//! release): once `close` returns, no peer touches the op's memory again.
//!
//! **Local failures** (`faults.local_failure_named_everywhere`): a rank whose side of an op fails
//! on its own (an injected `fail`, a post it cannot allocate) does not poison the communicator.
//! It marks the op failed (`failed[token % 4] = token`) *before* it publishes the op's last
//! step, closes, and keeps stepping: it publishes that last step at once and waits for its peers
//! to reach it before its next op posts. A peer looks at the marks after the op's first barrier,
//! when a claim finds the failed rank closed, and after the op's last barrier (the mark precedes
//! the failed rank's publication of it): whichever look sees it, the peer moves no more data,
//! passes the last barrier and ends the op with a named error; every rank goes on in step. A
//! mark is overwritten only four tokens later, by an op the failed rank can post only once every
//! peer has finished this one (and looked).

use crate::sys::{self, Mapping};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

pub const MAGIC: u64 = 0x434f_4e43_4f52_4431;
const HDR: usize = 256;
const SLOT: usize = 128;
pub const RING: u32 = 16;
/// Verdict word of a ring entry: the receiver is copying the message.
pub const V_CLAIMED: u32 = u32::MAX;
/// Verdict word of a ring entry: the sender withdrew the message (its send failed).
pub const V_WITHDRAWN: u32 = u32::MAX - 1;
/// Verdict word of a ring entry: the receiver's side failed locally after it took the message
/// up (the message is consumed, not delivered; the sender's send fails, named).
pub const V_RECV_FAILED: u32 = u32::MAX - 2;
const ENTRY: usize = 32;
/// What poisons a communicator (its peers' error says so; a local failure does not poison).
pub const POISON_CAUSES: &str =
    "a timeout or a dead peer seen there, a panic there, or an op that failed there out of step with its peers: that rank's own error names it";
const PAIR: usize = 64 + RING as usize * ENTRY;
const SLICE: Duration = Duration::from_millis(20);
/// Spinning on the word (when the ranks fit on the CPUs), then yielding the CPU between looks
/// (to a peer that shares it, when they do not), before sleeping on the futex. A sleeping peer
/// takes 50-150 µs to wake on the loaded 2-core VM, and two ranks that each sleep once per
/// barrier pay that on every op (8 B all_reduce: 150 µs instead of 10 µs); waits shorter than
/// these windows never sleep.
const SPIN: Duration = Duration::from_micros(30);
const YIELD: Duration = Duration::from_micros(300);

pub fn ctl_size(n: usize) -> usize {
    HDR + n * SLOT + n * n * PAIR
}

/// Why a wait ended without its condition.
#[derive(Debug)]
pub enum WaitErr {
    Timeout { peer: usize },
    Dead { peer: usize, detail: String },
    Aborted(String),
}

pub struct Ctl {
    map: Mapping,
    pub n: usize,
    pub me: usize,
    /// How long a wait spins on the word before yielding (zero when the ranks outnumber the CPUs).
    spin: Duration,
}

/// One entry of a point-to-point ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    pub off: u64,
    pub nbytes: u64,
    pub dtype: u32,
    pub numel: u64,
}

impl Ctl {
    /// Writes a fresh header into a new control segment.
    pub fn init(map: &Mapping, n: usize) {
        map.u64_at(8).store(n as u64, SeqCst);
        map.u64_at(0).store(MAGIC, SeqCst);
    }

    pub fn attach(map: Mapping, n: usize, me: usize) -> Result<Ctl, String> {
        if map.len() < ctl_size(n) || map.u64_at(0).load(SeqCst) != MAGIC || map.u64_at(8).load(SeqCst) != n as u64 {
            return Err(format!("control segment is not a Concord control segment for {n} ranks"));
        }
        let spin = if n <= sys::ncpus() { SPIN } else { Duration::ZERO };
        Ok(Ctl { map, n, me, spin })
    }

    fn slot(&self, r: usize) -> usize {
        HDR + r * SLOT
    }
    pub fn counter(&self, r: usize) -> &AtomicU32 {
        self.map.u32_at(self.slot(r))
    }
    fn waiters(&self, r: usize) -> &AtomicU32 {
        self.map.u32_at(self.slot(r) + 4)
    }
    pub fn pid(&self, r: usize) -> &AtomicU32 {
        self.map.u32_at(self.slot(r) + 8)
    }
    pub fn gone(&self, r: usize) -> &AtomicU32 {
        self.map.u32_at(self.slot(r) + 12)
    }
    pub fn post_off(&self, r: usize) -> &AtomicU64 {
        self.map.u64_at(self.slot(r) + 16)
    }
    pub fn post_len(&self, r: usize) -> &AtomicU64 {
        self.map.u64_at(self.slot(r) + 24)
    }
    fn open_word(&self, r: usize) -> &AtomicU32 {
        self.map.u32_at(self.slot(r) + 32)
    }
    fn touching(&self, r: usize) -> &AtomicU64 {
        self.map.u64_at(self.slot(r) + 40)
    }
    fn failed_word(&self, r: usize, token: u32) -> &AtomicU32 {
        self.map.u32_at(self.slot(r) + 48 + 4 * (token % 4) as usize)
    }

    /// Marks this rank's side of op `token` failed locally (see "Local failures"): before the
    /// op's last step is published.
    pub fn mark_failed(&self, token: u32) {
        self.failed_word(self.me, token).store(token, SeqCst);
    }

    /// The first other rank whose side of op `token` failed locally.
    pub fn failed_peer(&self, token: u32) -> Option<usize> {
        (0..self.n).find(|&r| r != self.me && self.failed_word(r, token).load(SeqCst) == token)
    }

    /// Whether rank `r`'s side of op `token` failed locally.
    pub fn failed(&self, r: usize, token: u32) -> bool {
        self.failed_word(r, token).load(SeqCst) == token
    }

    /// Joins: takes this rank's liveness lock, then publishes its pid.
    pub fn join(&self) -> std::io::Result<()> {
        self.map.lock_byte(self.me as u64)?;
        self.pid(self.me).store(sys::getpid(), SeqCst);
        Ok(())
    }

    /// `Err(Dead)` once `peer` joined and its process is gone (its liveness lock is free).
    pub fn alive(&self, peer: usize) -> Result<(), WaitErr> {
        let pid = self.pid(peer).load(SeqCst);
        if pid == 0 {
            return Ok(()); // not joined yet
        }
        match self.map.byte_locked_elsewhere(peer as u64) {
            Ok(false) => Err(WaitErr::Dead { peer, detail: format!("process {pid} exited (its liveness lock is free)") }),
            _ => Ok(()),
        }
    }

    /// Opens this rank's post and buffers to peers for the op `token` (before it is posted).
    pub fn open(&self, token: u32) {
        self.open_word(self.me).store(token, SeqCst);
    }

    /// Claims rank `r`'s memory for op `token`: true if `r` is still open for it (release with
    /// [`Ctl::release`]); false if `r` closed (its op failed): touch nothing of `r`.
    pub fn claim(&self, r: usize, token: u32) -> bool {
        let bit = 1u64 << self.me;
        self.touching(r).fetch_or(bit, SeqCst);
        if self.open_word(r).load(SeqCst) == token {
            true
        } else {
            self.touching(r).fetch_and(!bit, SeqCst);
            false
        }
    }

    /// Whether rank `r` still keeps op `token` open (a claimer re-checks this right before it
    /// moves data: a peer that closed while this rank was delayed is not written).
    pub fn is_open(&self, r: usize, token: u32) -> bool {
        self.open_word(r).load(SeqCst) == token
    }

    pub fn release(&self, r: usize) {
        self.touching(r).fetch_and(!(1u64 << self.me), SeqCst);
    }

    /// Closes this rank's memory after its op failed: no new claim succeeds, and this waits
    /// (until `deadline`) for the live peers still touching it. `Err(mask)`: peers (bits) still
    /// touching at the deadline — the op's memory must then never be reused (quarantine).
    pub fn close(&self, deadline: Instant) -> Result<(), u64> {
        self.open_word(self.me).store(0, SeqCst);
        loop {
            let t = self.touching(self.me).load(SeqCst);
            let live = (0..self.n).filter(|&p| t & (1 << p) != 0 && self.gone(p).load(SeqCst) == 0 && self.alive(p).is_ok());
            let mask = live.fold(0u64, |m, p| m | 1 << p);
            if mask == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(mask);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn abort_by(&self) -> &AtomicU32 {
        self.map.u32_at(16)
    }
    fn pair(&self, src: usize, dst: usize) -> usize {
        HDR + self.n * SLOT + (src * self.n + dst) * PAIR
    }
    /// Sends posted from `src` to `dst` (the point-to-point channel's `posted` word).
    pub fn posted(&self, src: usize, dst: usize) -> &AtomicU32 {
        self.map.u32_at(self.pair(src, dst))
    }

    /// `Err` if `peer` can no longer take part: the communicator was poisoned by another rank,
    /// or the peer left or exited.
    pub fn peer_state(&self, peer: usize) -> Result<(), WaitErr> {
        let ab = self.abort_by().load(SeqCst);
        if ab != 0 && ab != self.me as u32 + 1 {
            return Err(WaitErr::Aborted(format!("rank {} poisoned the communicator ({POISON_CAUSES})", ab - 1)));
        }
        if self.gone(peer).load(SeqCst) != 0 {
            return Err(WaitErr::Dead { peer, detail: "its backend was dropped (it left the communicator)".into() });
        }
        self.alive(peer)
    }

    /// `Err(Aborted)` if another rank poisoned the communicator.
    pub fn check_abort(&self) -> Result<(), WaitErr> {
        let ab = self.abort_by().load(SeqCst);
        if ab != 0 && ab != self.me as u32 + 1 {
            return Err(WaitErr::Aborted(format!("rank {} poisoned the communicator ({POISON_CAUSES})", ab - 1)));
        }
        Ok(())
    }

    pub fn consumed(&self, src: usize, dst: usize) -> &AtomicU32 {
        self.map.u32_at(self.pair(src, dst) + 8)
    }
    fn entry_off(&self, src: usize, dst: usize, k: u32) -> usize {
        self.pair(src, dst) + 64 + (k % RING) as usize * ENTRY
    }
    pub fn write_entry(&self, src: usize, dst: usize, k: u32, e: Entry) {
        let o = self.entry_off(src, dst, k);
        self.map.u64_at(o).store(e.off, SeqCst);
        self.map.u64_at(o + 8).store(e.nbytes, SeqCst);
        self.map.u32_at(o + 16).store(e.dtype, SeqCst);
        self.map.u32_at(o + 20).store(0, SeqCst);
        self.map.u64_at(o + 24).store(e.numel, SeqCst);
    }
    pub fn read_entry(&self, src: usize, dst: usize, k: u32) -> Entry {
        let o = self.entry_off(src, dst, k);
        Entry {
            off: self.map.u64_at(o).load(SeqCst),
            nbytes: self.map.u64_at(o + 8).load(SeqCst),
            dtype: self.map.u32_at(o + 16).load(SeqCst),
            numel: self.map.u64_at(o + 24).load(SeqCst),
        }
    }
    pub fn verdict(&self, src: usize, dst: usize, k: u32) -> &AtomicU32 {
        self.map.u32_at(self.entry_off(src, dst, k) + 20)
    }

    /// Stores `v` into `word` and wakes its sleepers (if any registered in `waiters`).
    fn publish(word: &AtomicU32, waiters: &AtomicU32, v: u32) {
        word.store(v, SeqCst);
        if waiters.load(SeqCst) > 0 {
            sys::futex_wake_all(word);
        }
    }

    pub fn set_counter(&self, v: u32) {
        Self::publish(self.counter(self.me), self.waiters(self.me), v);
    }
    pub fn set_posted(&self, dst: usize, k: u32) {
        let p = self.pair(self.me, dst);
        Self::publish(self.map.u32_at(p), self.map.u32_at(p + 4), k);
    }
    pub fn set_consumed(&self, src: usize, k: u32) {
        let p = self.pair(src, self.me);
        Self::publish(self.map.u32_at(p + 8), self.map.u32_at(p + 12), k);
    }

    /// Marks this rank as gone and wakes everyone who may wait on it.
    pub fn leave(&self) {
        self.gone(self.me).store(1, SeqCst);
        sys::futex_wake_all(self.counter(self.me));
        for p in 0..self.n {
            sys::futex_wake_all(self.map.u32_at(self.pair(self.me, p)));
            sys::futex_wake_all(self.map.u32_at(self.pair(p, self.me) + 8));
        }
    }

    /// Marks the communicator poisoned by this rank (first poisoner wins).
    pub fn poison(&self) {
        let _ = self.abort_by().compare_exchange(0, self.me as u32 + 1, SeqCst, SeqCst);
        for p in 0..self.n {
            sys::futex_wake_all(self.counter(p));
        }
    }

    /// Waits until `reached(word)` holds, `word` being published by `peer`. The spin and yield
    /// windows count from `since` (when the whole wait began: one window per barrier, not one per
    /// peer or per slice of a longer wait).
    #[allow(clippy::too_many_arguments)]
    fn wait_word(
        &self,
        word: &AtomicU32,
        waiters: &AtomicU32,
        reached: impl Fn(u32) -> bool,
        peer: usize,
        since: Instant,
        deadline: Instant,
        local_abort: &AtomicBool,
    ) -> Result<(), WaitErr> {
        let mut last_check: Option<Instant> = None;
        let window = self.spin + YIELD;
        let mut busy = since.elapsed();
        let mut looks = 0u32;
        loop {
            if reached(word.load(SeqCst)) {
                return Ok(());
            }
            if busy < window {
                // The clock is read every 8th look only: read on every one, it was 6 % of a
                // progress thread's CPU in 16-rank worlds.
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(8) {
                    busy = since.elapsed();
                }
                if busy < self.spin {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            if local_abort.load(SeqCst) {
                return Err(WaitErr::Aborted("this rank's backend is being dropped".into()));
            }
            let ab = self.abort_by().load(SeqCst);
            if ab != 0 && ab != self.me as u32 + 1 {
                return Err(WaitErr::Aborted(format!("rank {} poisoned the communicator ({POISON_CAUSES})", ab - 1)));
            }
            let now = Instant::now();
            if last_check.is_none_or(|t| now.duration_since(t) >= SLICE) {
                last_check = Some(now);
                if self.gone(peer).load(SeqCst) != 0 && !reached(word.load(SeqCst)) {
                    return Err(WaitErr::Dead { peer, detail: "its backend was dropped (it left the communicator)".into() });
                }
                if let Err(e) = self.alive(peer) {
                    if !reached(word.load(SeqCst)) {
                        return Err(e);
                    }
                }
            }
            if now >= deadline {
                return Err(WaitErr::Timeout { peer });
            }
            waiters.fetch_add(1, SeqCst);
            let v = word.load(SeqCst);
            if !reached(v) {
                sys::futex_wait(word, v, SLICE.min(deadline - now));
            }
            waiters.fetch_sub(1, SeqCst);
        }
    }

    /// Barrier at step `step`: publish, then wait for every other rank to reach it.
    pub fn barrier(&self, step: u32, deadline: Instant, local_abort: &AtomicBool) -> Result<(), WaitErr> {
        self.set_counter(step);
        self.wait_all(step, Instant::now(), deadline, local_abort)
    }

    /// The waiting half of [`Ctl::barrier`] (the counter already published); the wait began at
    /// `since` (a caller that waits in slices passes the start of the first).
    pub fn wait_all(&self, step: u32, since: Instant, deadline: Instant, local_abort: &AtomicBool) -> Result<(), WaitErr> {
        let reached = |v: u32| v.wrapping_sub(step) as i32 >= 0;
        for p in 0..self.n {
            if p != self.me {
                self.wait_word(self.counter(p), self.waiters(p), reached, p, since, deadline, local_abort)?;
            }
        }
        Ok(())
    }

    /// Waits until `src` has posted its `k`-th send to me.
    pub fn wait_posted(&self, src: usize, k: u32, deadline: Instant, local_abort: &AtomicBool) -> Result<(), WaitErr> {
        let p = self.pair(src, self.me);
        let reached = |v: u32| v.wrapping_sub(k) as i32 >= 0;
        self.wait_word(self.map.u32_at(p), self.map.u32_at(p + 4), reached, src, Instant::now(), deadline, local_abort)
    }

    /// Waits until `dst` has consumed my `k`-th send to it.
    pub fn wait_consumed(&self, dst: usize, k: u32, deadline: Instant, local_abort: &AtomicBool) -> Result<(), WaitErr> {
        let p = self.pair(self.me, dst);
        let reached = |v: u32| v.wrapping_sub(k) as i32 >= 0;
        self.wait_word(self.map.u32_at(p + 8), self.map.u32_at(p + 12), reached, dst, Instant::now(), deadline, local_abort)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(n: usize) -> Mapping {
        let name = format!("concord-unit-ctl-{}-{:?}", std::process::id(), std::thread::current().id());
        let m = Mapping::create(&name, ctl_size(n), true).unwrap();
        Ctl::init(&m, n);
        m
    }

    /// Issue 15 item 12: liveness must not trust a raw pid. Rank 1 published a pid and is gone
    /// (its process ended) while the pid now names another live process (pid reuse; or a peer
    /// in another pid namespace whose pid means something else here): the peer is dead.
    #[test]
    fn a_peer_whose_pid_was_reused_is_dead() {
        let m = segment(2);
        let name = format!("concord-unit-ctl-{}-{:?}", std::process::id(), std::thread::current().id());
        let me = Ctl::attach(m, 2, 0).unwrap();
        me.join().unwrap();
        // SAFETY (test): getppid has no preconditions; the parent (cargo / nextest) is alive.
        let live_other = unsafe { libc::getppid() } as u32;
        me.pid(1).store(live_other, SeqCst);
        match me.peer_state(1) {
            Err(WaitErr::Dead { .. }) => {}
            other => panic!("rank 1 never joined from a live process, yet peer_state says {other:?}"),
        }
        // A peer that holds its lock (another mapping of the segment, as another process has)
        // is alive, and dead once that mapping is gone.
        let other = Ctl::attach(Mapping::open(&name, true).unwrap(), 2, 1).unwrap();
        sys::unlink(&name).unwrap();
        other.join().unwrap();
        assert!(me.peer_state(1).is_ok(), "a peer holding its liveness lock is alive");
        drop(other);
        assert!(matches!(me.peer_state(1), Err(WaitErr::Dead { .. })), "a peer whose mapping is gone is dead");
    }

    #[test]
    fn a_closed_rank_refuses_claims_and_waits_for_current_ones() {
        let m = segment(2);
        let name = format!("concord-unit-ctl-{}-{:?}", std::process::id(), std::thread::current().id());
        let a = Ctl::attach(m, 2, 0).unwrap();
        let b = Ctl::attach(Mapping::open(&name, true).unwrap(), 2, 1).unwrap();
        sys::unlink(&name).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        a.open(7);
        assert!(b.claim(0, 7));
        let soon = Instant::now() + Duration::from_millis(50);
        assert_eq!(a.close(soon), Err(0b10), "a live claimer holds the close");
        b.release(0);
        assert_eq!(a.close(Instant::now()), Ok(()));
        assert!(!b.claim(0, 7), "claims fail once closed");
        a.open(9);
        assert!(!b.claim(0, 7) && b.claim(0, 9), "claims name the op");
    }
}
