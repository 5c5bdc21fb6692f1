//! Validation headers through host shared memory, for a communicator whose ranks share one host
//! (issue 15, item 3).
//!
//! The device path (`worker::Channel::exchange_all`) all-gathers the headers with NCCL on the
//! op's own stream, so op k+1's exchange runs on the GPU after op k's kernels, and the progress
//! thread waits for it before launching op k+1: validated ops never overlap. A board is a small
//! POSIX shared-memory segment all ranks of the communicator map: rank `r` writes the header of
//! its `n`-th exchange into slot `(n % 2, r)` and then publishes the slot's tag `n + 1`
//! (release); the exchange is complete once every rank's tag of slot `n % 2` reads `n + 1`
//! (acquire). The headers never touch the GPU, so op k+1 is validated while op k still runs.
//!
//! Contracts:
//! * Two slots per rank are enough, with no acknowledgements: a rank writes exchange `n + 2`
//!   only after its exchange `n + 1` completed, i.e. after every rank posted `n + 1`, which
//!   every rank does only after reading all of exchange `n` (the progress thread runs one job at
//!   a time). Every rank makes the same exchanges on a communicator in the same order, as with
//!   the device path.
//! * Every rank of a communicator uses a board, or none does: the world's ranks agree through
//!   the store at `init` (rank 0 creates the segment with a random nonce; every other rank
//!   reports whether it sees that nonce; every rank reads every report), subgroups use one iff
//!   their parent does, and a member that cannot open its subgroup's board fails the split on
//!   every rank with a named error.
//! * The segment is named with the world's prefix ([`concord_core::world_prefix`]), so the
//!   runner sweeps it after a crash; the rank that made it unlinks its name as soon as every
//!   rank has mapped it (or when its board is dropped before that). A subgroup's name carries
//!   the split's number and the member list's length and hash, so ranks that disagree on the
//!   list never share a segment (the header check names the mismatch).
//! * Its pages are reserved when it is made (`posix_fallocate`): a full /dev/shm is a named
//!   error at `init` or at the split, never a SIGBUS on the progress thread.
//!
//! This module has the crate's only `libc` calls; it needs no GPU and is unit-tested on any
//! machine.

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = 0x434f_4e43_4252_4431; // "CONCBRD1"
const W_MAGIC: usize = 0;
const W_NONCE: usize = 1;
const W_WS: usize = 2;
const W_HLEN: usize = 3;
/// Words before the first slot (one cache line).
const FIXED: usize = 8;
/// Slots per rank (see the module docs for why two suffice).
const SLOTS: usize = 2;
/// Words between two ranks' issue counters (one 128-byte line each: every rank's issuing
/// thread writes its own on every collective, and the other ranks' progress threads read it).
const ISSUED_STRIDE: usize = 16;

/// One rank's view of a communicator's board.
pub(crate) struct Board {
    base: *mut u64,
    bytes: usize,
    ws: usize,
    rank: usize,
    /// Words of one header.
    hlen: usize,
    /// The number of the next exchange (used by the progress thread only).
    next: AtomicU64,
    name: String,
    /// Whether this rank made the segment and has not unlinked its name yet: only the maker
    /// unlinks (a later segment under the same name, or someone else's, is never touched).
    unlink_on_drop: std::sync::atomic::AtomicBool,
}

// SAFETY: the mapping is plain shared memory, alive as long as the `Board`; tags are accessed
// as atomics, and a slot's payload is written only by its rank, before its tag's release store,
// and read by others only after the matching acquire load (see the module docs).
unsafe impl Send for Board {}
unsafe impl Sync for Board {}

fn cname(name: &str) -> Result<CString, String> {
    CString::new(format!("/{name}")).map_err(|_| format!("board name {name:?} holds a NUL byte"))
}

fn os_err(what: &str, name: &str) -> String {
    format!("{what} /dev/shm/{name}: {}", std::io::Error::last_os_error())
}

impl Board {
    fn words(ws: usize, hlen: usize) -> usize {
        FIXED + SLOTS * ws * (1 + hlen) + ws * ISSUED_STRIDE + ws * ws
    }

    /// Opens and maps segment `name` sized for `ws` ranks with headers of `hlen` words.
    /// `flags`: `O_CREAT | O_EXCL` (make it), `O_CREAT` (make it unless a peer did first) or 0
    /// (it must exist, sized). Whoever may create it reserves its pages (`posix_fallocate`: a
    /// full /dev/shm is a named error here, never a SIGBUS at a later write). Only the rank
    /// that made the segment unlinks its name ([`Board::unlink`]).
    fn map(name: &str, ws: usize, rank: usize, hlen: usize, flags: libc::c_int) -> Result<Board, String> {
        if ws == 0 || rank >= ws || hlen == 0 {
            return Err(format!("board {name}: rank {rank} of {ws}, headers of {hlen} words"));
        }
        let c = cname(name)?;
        let bytes = Self::words(ws, hlen) * 8;
        // SAFETY: plain syscalls on a descriptor this function owns; every result is checked,
        // and the descriptor is closed on every path (the mapping keeps the segment).
        unsafe {
            let mut made = false;
            let mut fd = -1;
            if flags & libc::O_CREAT != 0 {
                fd = libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600);
                made = fd >= 0;
                if fd < 0 && (flags & libc::O_EXCL != 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)) {
                    return Err(os_err("cannot create", name));
                }
            }
            if fd < 0 {
                fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0);
                if fd < 0 {
                    return Err(os_err("cannot open", name));
                }
            }
            let fail = |e: String| {
                libc::close(fd);
                if made {
                    libc::shm_unlink(c.as_ptr());
                }
                Err(e)
            };
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                return fail(os_err("cannot stat", name));
            }
            // A segment someone else made is taken as it is, unless its maker has not sized it
            // yet (then every member sizes it the same: reserving pages already reserved
            // changes nothing); a segment of another shape is refused, never resized.
            if flags & libc::O_CREAT != 0 && (made || st.st_size == 0) {
                let r = libc::posix_fallocate(fd, 0, bytes as libc::off_t);
                if r != 0 {
                    return fail(format!("cannot reserve {bytes} bytes for /dev/shm/{name}: {}", std::io::Error::from_raw_os_error(r)));
                }
                if libc::fstat(fd, &mut st) != 0 {
                    return fail(os_err("cannot stat", name));
                }
            }
            if st.st_size as usize != bytes {
                return fail(format!("/dev/shm/{name} holds {} bytes, a board of {ws} ranks needs {bytes}", st.st_size));
            }
            let p = libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            if p == libc::MAP_FAILED {
                return fail(os_err("cannot map", name));
            }
            libc::close(fd);
            Ok(Board {
                base: p as *mut u64,
                bytes,
                ws,
                rank,
                hlen,
                next: AtomicU64::new(0),
                name: name.to_string(),
                unlink_on_drop: made.into(),
            })
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.bytes / 8);
        // SAFETY: in bounds of the live mapping, 8-byte aligned (page-aligned base).
        unsafe { &*(self.base.add(i) as *const AtomicU64) }
    }

    fn slot(&self, n: u64, r: usize) -> usize {
        FIXED + ((n as usize % SLOTS) * self.ws + r) * (1 + self.hlen)
    }

    fn issued_word(&self, r: usize) -> &AtomicU64 {
        self.word(FIXED + SLOTS * self.ws * (1 + self.hlen) + r * ISSUED_STRIDE)
    }

    /// The give-up word of the point-to-point direction `src -> dst` (ranks of the
    /// communicator): bit 0 set by `src`, bit 1 by `dst` ([`Board::give_up`]).
    fn dir_word(&self, src: usize, dst: usize) -> &AtomicU64 {
        assert!(src < self.ws && dst < self.ws, "direction {src} -> {dst} on a board of {} ranks", self.ws);
        self.word(FIXED + SLOTS * self.ws * (1 + self.hlen) + self.ws * ISSUED_STRIDE + src * self.ws + dst)
    }

    fn side_bit(&self, src: usize, rank: usize) -> u64 {
        if rank == src {
            1
        } else {
            2
        }
    }

    /// Publishes that this rank gave up on the direction `src -> dst` (one of its two ranks):
    /// an op of it timed out or its transport failed (`p2p`, [`crate::p2p::Wire::give_up`]).
    /// Marks stay for the communicator's life (the owner aborts it).
    pub fn give_up(&self, src: usize, dst: usize) {
        let bit = self.side_bit(src, self.rank);
        self.dir_word(src, dst).fetch_or(bit, Ordering::Release);
    }

    /// Whether the other rank of the direction `src -> dst` gave up on it ([`Board::give_up`]).
    pub fn peer_gave_up(&self, src: usize, dst: usize) -> bool {
        let peer = if self.rank == src { dst } else { src };
        self.dir_word(src, dst).load(Ordering::Acquire) & self.side_bit(src, peer) != 0
    }

    /// A new board (`name` must not exist) stamped with `nonce`: the world's, made by rank 0.
    pub fn create(name: &str, ws: usize, rank: usize, hlen: usize, nonce: u64) -> Result<Board, String> {
        let b = Self::map(name, ws, rank, hlen, libc::O_CREAT | libc::O_EXCL)?;
        b.word(W_NONCE).store(nonce, Ordering::Relaxed);
        b.word(W_WS).store(ws as u64, Ordering::Relaxed);
        b.word(W_HLEN).store(hlen as u64, Ordering::Relaxed);
        b.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Ok(b)
    }

    /// Opens the board rank 0 made ([`Board::create`]); `Err` unless it carries `nonce` and
    /// the same shape (a segment of another host, or of another communicator, is refused).
    pub fn open(name: &str, ws: usize, rank: usize, hlen: usize, nonce: u64) -> Result<Board, String> {
        let b = Self::map(name, ws, rank, hlen, 0)?;
        let got = (
            b.word(W_MAGIC).load(Ordering::Acquire),
            b.word(W_NONCE).load(Ordering::Relaxed),
            b.word(W_WS).load(Ordering::Relaxed),
            b.word(W_HLEN).load(Ordering::Relaxed),
        );
        if got != (MAGIC, nonce, ws as u64, hlen as u64) {
            return Err(format!(
                "/dev/shm/{name} is not this communicator's board (magic, nonce, ranks, header words: {got:x?}; \
                 expected {:x?})",
                (MAGIC, nonce, ws, hlen)
            ));
        }
        Ok(b)
    }

    /// A subgroup's board: every member opens it, the first one creating it (no nonce; the
    /// name is unique to the split, and the parent's board proved the members share a host).
    pub fn open_or_create(name: &str, ws: usize, rank: usize, hlen: usize) -> Result<Board, String> {
        let b = Self::map(name, ws, rank, hlen, libc::O_CREAT)?;
        // Every member writes the same values: no torn or conflicting state.
        b.word(W_WS).store(ws as u64, Ordering::Relaxed);
        b.word(W_HLEN).store(hlen as u64, Ordering::Relaxed);
        b.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Ok(b)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    #[cfg(test)]
    pub fn rank_for_test(&self) -> usize {
        self.rank
    }

    /// Removes the segment's name (every rank has mapped it, or it is no longer wanted) if this
    /// rank made it; the mappings stay valid. A board unlinks at most once (a later segment
    /// under the same name is never touched); on the other ranks this does nothing.
    pub fn unlink(&self) {
        if !self.unlink_on_drop.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Ok(c) = cname(&self.name) {
            // SAFETY: a plain syscall on a NUL-terminated name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }

    /// Posts this rank's header (`hdr`, at most `hlen` words; the rest reads zero) as its next
    /// exchange; returns the exchange's number.
    pub fn post(&self, hdr: &[u64]) -> u64 {
        assert!(hdr.len() <= self.hlen, "a header of {} words on a board of {}-word headers", hdr.len(), self.hlen);
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let s = self.slot(n, self.rank);
        for i in 0..self.hlen {
            self.word(s + 1 + i).store(hdr.get(i).copied().unwrap_or(0), Ordering::Relaxed);
        }
        self.word(s).store(n + 1, Ordering::Release);
        n
    }

    /// Whether every rank has posted exchange `n`.
    pub fn ready(&self, n: u64) -> bool {
        (0..self.ws).all(|r| self.word(self.slot(n, r)).load(Ordering::Acquire) == n + 1)
    }

    /// Publishes that this rank's issuing thread has queued its collective number `cseq` (from 0,
    /// in issue order) on this communicator. The count only ever moves by one: a number
    /// published out of turn (a collective refused at issue, or two threads issuing at once)
    /// leaves it where it is for good, so a rank's count never claims a collective it did not
    /// queue. Read by the peers' progress threads ([`Board::all_issued`]); see
    /// `worker::Tracker::defer` for what they use it for.
    pub fn note_issued(&self, cseq: u64) {
        let _ = self.issued_word(self.rank).compare_exchange(cseq, cseq + 1, Ordering::Release, Ordering::Relaxed);
    }

    /// Whether every rank has queued its collective number `cseq` on this communicator
    /// ([`Board::note_issued`]).
    pub fn all_issued(&self, cseq: u64) -> bool {
        (0..self.ws).all(|r| self.issued_word(r).load(Ordering::Acquire) > cseq)
    }

    /// The ranks that have not posted exchange `n` yet.
    pub fn missing(&self, n: u64) -> Vec<usize> {
        (0..self.ws).filter(|&r| self.word(self.slot(n, r)).load(Ordering::Acquire) != n + 1).collect()
    }

    /// Every rank's header of exchange `n`, once [`Board::ready`]: each `hlen` words.
    pub fn read(&self, n: u64) -> Vec<Vec<u64>> {
        (0..self.ws)
            .map(|r| {
                let s = self.slot(n, r);
                (0..self.hlen).map(|i| self.word(s + 1 + i).load(Ordering::Relaxed)).collect()
            })
            .collect()
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.unlink(); // a no-op once unlinked, or for a refused segment
                       // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives
                       // `self` (`word` borrows `self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.bytes) };
    }
}

/// A nonce for a new world board: different for every init of every process.
pub(crate) fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn name(tag: &str) -> String {
        format!("concord-test-board-{}-{tag}", std::process::id())
    }

    fn exists(n: &str) -> bool {
        std::path::Path::new("/dev/shm").join(n).exists()
    }

    #[test]
    fn ranks_exchange_in_order_with_two_slots() {
        const WS: usize = 3;
        const HLEN: usize = 5;
        const ROUNDS: u64 = 300;
        let n = name("order");
        let nonce = nonce();
        let first = Board::create(&n, WS, 0, HLEN, nonce).unwrap();
        let mut boards = vec![first];
        for r in 1..WS {
            boards.push(Board::open(&n, WS, r, HLEN, nonce).unwrap());
        }
        boards[0].unlink();
        assert!(!exists(&n), "unlinked once every rank has mapped it");
        let handles: Vec<_> = boards
            .into_iter()
            .map(|b| {
                std::thread::spawn(move || {
                    let b = Arc::new(b);
                    for k in 0..ROUNDS {
                        // Ranks run at different paces: rank 2 is slow every 7th round.
                        if b.rank == 2 && k % 7 == 0 {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        let hdr = vec![k, b.rank as u64, k * 10 + b.rank as u64];
                        let e = b.post(&hdr);
                        assert_eq!(e, k);
                        let end = Instant::now() + Duration::from_secs(20);
                        while !b.ready(e) {
                            assert!(Instant::now() < end, "rank {} stuck at exchange {e}: missing {:?}", b.rank, b.missing(e));
                            std::thread::yield_now();
                        }
                        let all = b.read(e);
                        for (r, h) in all.iter().enumerate() {
                            assert_eq!(h, &vec![k, r as u64, k * 10 + r as u64, 0, 0], "rank {} exchange {k}", b.rank);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_missing_rank_is_named() {
        let n = name("missing");
        let a = Board::create(&n, 2, 0, 4, 7).unwrap();
        let b = Board::open(&n, 2, 1, 4, 7).unwrap();
        assert_eq!(a.post(&[1]), 0);
        assert!(!a.ready(0));
        assert_eq!(a.missing(0), vec![1]);
        assert_eq!(b.post(&[2]), 0);
        assert!(a.ready(0) && b.ready(0));
        assert_eq!(a.read(0), vec![vec![1, 0, 0, 0], vec![2, 0, 0, 0]]);
        drop(a);
        drop(b);
        assert!(!exists(&n), "dropping a board unlinks its name");
    }

    #[test]
    fn another_communicators_segment_is_refused() {
        let n = name("nonce");
        let _a = Board::create(&n, 2, 0, 4, 11).unwrap();
        let e = Board::open(&n, 2, 1, 4, 12).err().expect("a wrong nonce is refused");
        assert!(e.contains("not this communicator's board"), "{e}");
        assert!(exists(&n), "a refused segment is left to its owner");
        let e = Board::open(&n, 3, 1, 4, 11).err().expect("a wrong size is refused");
        assert!(e.contains("needs"), "{e}");
        assert!(Board::create(&n, 2, 0, 4, 11).is_err(), "create is exclusive");
        let e = Board::open(&name("absent"), 2, 1, 4, 11).err().expect("no segment");
        assert!(e.contains("cannot open"), "{e}");
    }

    #[test]
    fn subgroup_members_share_one_segment() {
        let n = name("sub");
        let a = Board::open_or_create(&n, 2, 0, 3).unwrap();
        let b = Board::open_or_create(&n, 2, 1, 3).unwrap();
        a.post(&[5, 6, 7]);
        b.post(&[8]);
        assert!(b.ready(0));
        assert_eq!(b.read(0), vec![vec![5, 6, 7], vec![8, 0, 0]]);
        a.unlink();
        assert!(!exists(&n));
    }

    #[test]
    fn only_the_rank_that_made_a_segment_unlinks_it() {
        let n = name("maker");
        let a = Board::open_or_create(&n, 2, 0, 3).unwrap();
        let b = Board::open_or_create(&n, 2, 1, 3).unwrap();
        b.unlink();
        drop(b);
        assert!(exists(&n), "a member that did not make the segment leaves its name alone");
        drop(a);
        assert!(!exists(&n), "its maker unlinks it when dropped");
        // A member list of another length is another shape: refused, and the maker's segment stays.
        let a = Board::open_or_create(&n, 2, 0, 3).unwrap();
        let e = Board::open_or_create(&n, 3, 1, 3).err().expect("another shape is refused");
        assert!(e.contains("needs"), "{e}");
        assert!(exists(&n));
        drop(a);
    }

    #[test]
    fn issue_counts_move_by_one_and_only_in_turn() {
        let n = name("issued");
        let a = Board::create(&n, 2, 0, 4, 5).unwrap();
        let b = Board::open(&n, 2, 1, 4, 5).unwrap();
        a.unlink();
        assert!(!a.all_issued(0) && !b.all_issued(0), "nothing issued yet");
        a.note_issued(0);
        assert!(!a.all_issued(0), "rank 1 has not issued collective 0");
        b.note_issued(0);
        assert!(a.all_issued(0) && b.all_issued(0) && !a.all_issued(1));
        // Rank 1 skips collective 1 (refused at issue) and queues 2: its count stays at 1 for
        // good, so no peer ever takes collective 1 or any later one as issued there.
        a.note_issued(1);
        a.note_issued(2);
        b.note_issued(2);
        b.note_issued(3);
        assert!(!a.all_issued(1) && !a.all_issued(2) && !a.all_issued(3), "a count published out of turn moves nothing");
        assert!(a.all_issued(0), "what was published stays");
        // The counters do not touch the header slots (both live in one segment).
        assert_eq!(a.post(&[9]), 0);
        assert_eq!(b.post(&[8]), 0);
        assert_eq!(a.read(0), vec![vec![9, 0, 0, 0], vec![8, 0, 0, 0]]);
        assert!(a.all_issued(0) && !a.all_issued(1));
    }

    #[test]
    fn a_give_up_is_seen_by_the_other_side_of_its_direction_only() {
        let n = name("gaveup");
        let (a, b, c) =
            (Board::create(&n, 3, 0, 4, 7).unwrap(), Board::open(&n, 3, 1, 4, 7).unwrap(), Board::open(&n, 3, 2, 4, 7).unwrap());
        a.unlink();
        assert!(!a.peer_gave_up(0, 1) && !b.peer_gave_up(0, 1));
        // Rank 1 gives up on its receives from rank 0 (direction 0 -> 1).
        b.give_up(0, 1);
        assert!(a.peer_gave_up(0, 1), "rank 0 sees its receiver gave up");
        assert!(!b.peer_gave_up(0, 1), "a rank's own mark is not its peer's");
        assert!(!a.peer_gave_up(1, 0) && !c.peer_gave_up(0, 2) && !c.peer_gave_up(2, 1), "other directions untouched");
        // Rank 2 gives up on its sends to rank 0 (direction 2 -> 0).
        c.give_up(2, 0);
        assert!(a.peer_gave_up(2, 0) && !c.peer_gave_up(2, 0) && !a.peer_gave_up(0, 2));
        // The marks do not touch the header slots or the issue counters.
        assert_eq!(a.post(&[9]), 0);
        assert_eq!((b.post(&[8]), c.post(&[7])), (0, 0));
        assert_eq!(a.read(0), vec![vec![9, 0, 0, 0], vec![8, 0, 0, 0], vec![7, 0, 0, 0]]);
        assert!(!a.all_issued(0));
    }

    #[test]
    #[should_panic(expected = "a header of 4 words")]
    fn an_oversized_header_is_a_bug() {
        let b = Board::open_or_create(&name("big"), 1, 0, 3).unwrap();
        b.post(&[1, 2, 3, 4]);
    }
}
