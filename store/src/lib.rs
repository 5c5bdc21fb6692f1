//! # concord-store
//!
//! **One job:** a key-value store in one file (or on a TCP server), byte-compatible with PyTorch's c10d `FileStore`,
//! so a Rust rank and a Python `torch.distributed.FileStore` can share one file. Ranks and
//! backends rendezvous through it; it knows nothing of processes, runners or backends.
//!
//! [`tcp`] is the same store over TCP, wire-compatible with c10d's `TCPStore`; [`Store`] is
//! either, opened from a [`StoreAddr`] (a file path or `tcp://host:port[/prefix]`).
//!
//! # File format (c10d's, unchanged)
//! The file is an append-only sequence of records `[u32 len][key bytes][u32 len][value bytes]`,
//! lengths in native byte order (little-endian on every platform we run on). Replaying the
//! records in order gives the current map:
//! * user keys are stored with a `/` prefix (`set("a", ..)` writes key `/a`);
//! * a record whose key starts with `-` is a delete tombstone for the rest of the key
//!   (`delete_key("a")` writes `-/a` with an empty value);
//! * counters (`add`) hold their value as a decimal string;
//! * `refcount/` counts open stores (+1 on open, -1 on drop) and `cleanup/` counts dropped
//!   stores; the store that drops the refcount to 0, once at least `num_workers` stores were
//!   dropped, removes the file.
//!
//! # Contracts
//! * Every operation that reads takes a shared `flock`, every one that writes an exclusive one,
//!   so any number of processes (Rust or Python) MAY share the file. Within one process a mutex
//!   serialises the threads that share one `FileStore` (flock does not exclude them).
//! * Every wait (`get`, `wait`, `barrier`) has a deadline and ends in [`StoreError::Timeout`]
//!   naming the keys, the time waited and the file.
//! * Taking the file lock has a deadline too: `flock` is tried without blocking (`LOCK_NB`) and
//!   retried with a backoff (≤ 20 ms) up to the operation's deadline (a wait's own; the store
//!   timeout for the others), then fails: a wait with [`StoreError::Timeout`], any other
//!   operation with [`StoreError::Locked`] naming the file and the operation. A process that
//!   holds the lock and never lets go (stopped, stuck) stalls no one past a deadline.
//! * Waiters MUST NOT poll at a fixed period: a wait checks with a short exponential backoff
//!   (20–200 µs, first 10 ms only), then sleeps on inotify (`IN_MODIFY` of the file), re-checking
//!   at least every 20 ms even so (its backoff doubles from 1 ms to that cap, so a missed event
//!   costs at most 20 ms); where inotify is unavailable it sleeps the same backoff. (Why the
//!   short phase: closing an inotify instance that held a watch costs ~10 ms on Linux.)
//! * `num_keys` counts like c10d: every key in the map, including the internal `refcount/` and
//!   `cleanup/` keys.

pub mod addr;
pub mod tcp;
pub use addr::{Store, StoreAddr};
pub use tcp::{TcpServer, TcpStore};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The two Linux calls the store needs (advisory whole-file locks), retried on EINTR.
mod sys {
    use std::io;
    use std::os::fd::RawFd;

    /// `flock(fd, LOCK_SH | LOCK_NB)` / `LOCK_EX | LOCK_NB`: `Ok(false)` while another open
    /// file holds a conflicting lock (the caller retries up to its deadline).
    pub fn try_flock(fd: RawFd, exclusive: bool) -> io::Result<bool> {
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        loop {
            // SAFETY: plain syscall on a caller-owned fd.
            if unsafe { libc::flock(fd, op | libc::LOCK_NB) } == 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EWOULDBLOCK) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    /// `flock(fd, LOCK_UN)`.
    pub fn funlock(fd: RawFd) -> io::Result<()> {
        // SAFETY: plain syscall on a caller-owned fd.
        if unsafe { libc::flock(fd, libc::LOCK_UN) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum StoreError {
    #[error("store timeout after {waited_ms} ms waiting for keys {keys:?} in {path}")]
    Timeout { keys: Vec<String>, waited_ms: u64, path: String },
    #[error("store I/O error on {path}: {msg}")]
    Io { path: String, msg: String },
    #[error("store file {path} is corrupt: {msg}")]
    Corrupt { path: String, msg: String },
    #[error("store server at {addr} unreachable after {waited_ms} ms: {msg}")]
    Unreachable { addr: String, waited_ms: u64, msg: String },
    /// The file's lock stayed held by another process up to the operation's deadline.
    #[error("store file {path}: its lock was still held by another process after {waited_ms} ms, for {op} (a process holding it is stopped or stuck)")]
    Locked { path: String, op: String, waited_ms: u64 },
}

/// A raw key and its value, as stored.
pub type KeyValue = (Vec<u8>, Vec<u8>);

const REGULAR_PREFIX: &str = "/";
const DELETE_PREFIX: u8 = b'-';
const REFCOUNT_KEY: &str = "refcount/";
const CLEANUP_KEY: &str = "cleanup/";
/// Longest sleep between checks when inotify is unavailable (or missed an event).
const MAX_BACKOFF: Duration = Duration::from_millis(20);
/// How long a wait polls (with backoff) before it sets up inotify.
const SHORT_WAIT: Duration = Duration::from_millis(10);

struct Inner {
    file: File,
    /// Bytes of the file already replayed into `cache`.
    pos: u64,
    cache: HashMap<Vec<u8>, Vec<u8>>,
}

/// A c10d-compatible file store. See the module docs for the format and contracts.
pub struct FileStore {
    path: PathBuf,
    num_workers: usize,
    timeout: Duration,
    inner: Mutex<Inner>,
    /// Reusable inotify instances watching `path` (one per concurrently waiting thread).
    watches: Mutex<Vec<Inotify>>,
}

/// Holds a `flock` until dropped.
struct FileLock<'a>(&'a File);
impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = sys::funlock(self.0.as_raw_fd());
    }
}

fn encode_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_ne_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(value.len() as u32).to_ne_bytes());
    out.extend_from_slice(value);
}

/// Parses a counter value the way c10d does (`std::stoll`: optional leading whitespace and sign,
/// then digits; anything after the digits is ignored).
pub(crate) fn parse_counter(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim_start();
    let end =
        s.char_indices().find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+')))).map(|(i, _)| i).unwrap_or(s.len());
    s[..end].parse().ok()
}

impl FileStore {
    /// Opens (creating if needed) the store at `path`, as one of `num_workers` users.
    /// Registers this user in the `refcount/` key, as c10d's constructor does.
    pub fn open(path: &Path, num_workers: usize, timeout: Duration) -> Result<FileStore, StoreError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o644)
            .open(path)
            .map_err(|e| StoreError::Io { path: path.display().to_string(), msg: format!("open: {e}") })?;
        let store = FileStore {
            path: path.to_path_buf(),
            num_workers,
            timeout,
            inner: Mutex::new(Inner { file, pos: 0, cache: HashMap::new() }),
            watches: Mutex::new(Vec::new()),
        };
        store.add_raw(REFCOUNT_KEY.as_bytes(), 1)?;
        Ok(store)
    }

    fn io(&self, what: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io { path: self.path.display().to_string(), msg: format!("{what}: {e}") }
    }

    fn corrupt(&self, msg: String) -> StoreError {
        StoreError::Corrupt { path: self.path.display().to_string(), msg }
    }

    fn timeout_err(&self, keys: &[&str], start: Instant) -> StoreError {
        StoreError::Timeout {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            waited_ms: start.elapsed().as_millis() as u64,
            path: self.path.display().to_string(),
        }
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the file lock, retrying a non-blocking `flock` with a backoff (≤ 20 ms) until
    /// `deadline`; `Ok(false)` if it is still held by another process then.
    fn try_lock_until(&self, inner: &Inner, exclusive: bool, deadline: Instant) -> Result<bool, StoreError> {
        let fd = inner.file.as_raw_fd();
        let mut nap = Duration::from_micros(50);
        loop {
            if sys::try_flock(fd, exclusive).map_err(|e| self.io("flock", e))? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(MAX_BACKOFF);
        }
    }

    /// The file lock within the store timeout, else [`StoreError::Locked`] naming `op`.
    fn lock_for(&self, inner: &Inner, exclusive: bool, op: &str) -> Result<(), StoreError> {
        let start = Instant::now();
        if self.try_lock_until(inner, exclusive, start + self.timeout)? {
            Ok(())
        } else {
            Err(StoreError::Locked {
                path: self.path.display().to_string(),
                op: op.to_string(),
                waited_ms: start.elapsed().as_millis() as u64,
            })
        }
    }

    fn flock<'a>(&self, inner: &'a Inner, exclusive: bool, op: &str) -> Result<FileLock<'a>, StoreError> {
        self.lock_for(inner, exclusive, op)?;
        Ok(FileLock(&inner.file))
    }

    /// Replays the records appended since the last refresh into the cache. Caller holds a flock.
    fn refresh(&self, inner: &mut Inner) -> Result<(), StoreError> {
        let size = inner.file.metadata().map_err(|e| self.io("fstat", e))?.len();
        if size == inner.pos {
            return Ok(());
        }
        if size < inner.pos {
            return Err(self.corrupt(format!("file shrank from {} to {size} bytes", inner.pos)));
        }
        let mut buf = vec![0u8; (size - inner.pos) as usize];
        inner.file.read_exact_at(&mut buf, inner.pos).map_err(|e| self.io("read", e))?;
        let mut at = 0usize;
        let take = |at: &mut usize, what: &str| -> Result<Vec<u8>, StoreError> {
            let base = inner.pos + *at as u64;
            let len_bytes: [u8; 4] = buf
                .get(*at..*at + 4)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| self.corrupt(format!("truncated {what} length at byte {base}")))?;
            let len = u32::from_ne_bytes(len_bytes) as usize;
            let data = buf
                .get(*at + 4..*at + 4 + len)
                .ok_or_else(|| self.corrupt(format!("{what} of {len} bytes at byte {base} runs past the end ({size} bytes)")))?
                .to_vec();
            *at += 4 + len;
            Ok(data)
        };
        let mut pending = Vec::new();
        while at < buf.len() {
            let key = take(&mut at, "key")?;
            let value = take(&mut at, "value")?;
            pending.push((key, value));
        }
        for (key, value) in pending {
            if key.first() == Some(&DELETE_PREFIX) {
                inner.cache.remove(&key[1..]);
            } else {
                inner.cache.insert(key, value);
            }
        }
        inner.pos = size;
        Ok(())
    }

    fn append(&self, inner: &Inner, records: &[(&[u8], &[u8])]) -> Result<(), StoreError> {
        let mut out = Vec::new();
        for (k, v) in records {
            if k.len() > u32::MAX as usize || v.len() > u32::MAX as usize {
                return Err(self.io("write", "key or value longer than 4 GiB"));
            }
            encode_record(&mut out, k, v);
        }
        (&inner.file).write_all(&out).map_err(|e| self.io("write", e))
    }

    fn reg(key: &str) -> Vec<u8> {
        let mut k = REGULAR_PREFIX.as_bytes().to_vec();
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// Runs `f` on a refreshed cache under an exclusive (or shared) lock, taken within the
    /// store timeout (else [`StoreError::Locked`] naming `op`).
    fn with_locked<T>(
        &self,
        exclusive: bool,
        op: &str,
        f: impl FnOnce(&Self, &mut Inner) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock_inner();
        let inner = &mut *inner;
        self.lock_for(inner, exclusive, op)?;
        self.locked_run(inner, f)
    }

    /// `f` on a refreshed cache; the caller holds the file lock, released here.
    fn locked_run<T>(&self, inner: &mut Inner, f: impl FnOnce(&Self, &mut Inner) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let fd = inner.file.as_raw_fd();
        let r = self.refresh(inner).and_then(|_| f(self, inner));
        let _ = sys::funlock(fd);
        r
    }

    /// Adds `delta` to the counter under the raw (unprefixed) key; optionally, when the new
    /// value equals `then_set.0`, also writes `then_set.1 = "1"` in the same locked append.
    fn add_raw_then(&self, key: &[u8], delta: i64, then_set: Option<(i64, &[u8])>) -> Result<i64, StoreError> {
        self.with_locked(true, &format!("add to {:?}", String::from_utf8_lossy(key)), |s, inner| {
            let cur = match inner.cache.get(key) {
                Some(v) if !v.is_empty() => parse_counter(v).ok_or_else(|| {
                    s.corrupt(format!("key {:?} holds {:?}, not an integer", String::from_utf8_lossy(key), String::from_utf8_lossy(v)))
                })?,
                _ => 0,
            };
            let new = cur.checked_add(delta).ok_or_else(|| s.corrupt(format!("counter {:?} overflows", String::from_utf8_lossy(key))))?;
            let text = new.to_string();
            match then_set {
                Some((target, done)) if new == target => s.append(inner, &[(key, text.as_bytes()), (done, b"1")])?,
                _ => s.append(inner, &[(key, text.as_bytes())])?,
            }
            Ok(new)
        })
    }

    fn add_raw(&self, key: &[u8], delta: i64) -> Result<i64, StoreError> {
        self.add_raw_then(key, delta, None)
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let inner = self.lock_inner();
        let _l = self.flock(&inner, true, &format!("set {key:?}"))?;
        self.append(&inner, &[(&Self::reg(key), value)])
    }

    /// Waits (up to the store timeout) for `key`, then returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let reg = Self::reg(key);
        let mut found = None;
        self.wait_until(&[key], self.timeout, |inner| match inner.cache.get(&reg) {
            Some(v) => {
                found = Some(v.clone());
                true
            }
            None => false,
        })?;
        Ok(found.expect("wait_until returned Ok only after the predicate held"))
    }

    /// Adds `delta` to the integer under `key` (absent counts as 0) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.add_raw(&Self::reg(key), delta)
    }

    /// c10d semantics: if `key` is absent and `expected` is empty, or `key` holds `expected`,
    /// sets it to `desired` and returns `desired`; if absent (and `expected` non-empty) returns
    /// `expected`; otherwise returns the current value.
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let reg = Self::reg(key);
        self.with_locked(true, &format!("compare_set {key:?}"), |s, inner| match inner.cache.get(&reg) {
            None if expected.is_empty() => {
                s.append(inner, &[(&reg, desired)])?;
                Ok(desired.to_vec())
            }
            None => Ok(expected.to_vec()),
            Some(cur) if cur.as_slice() == expected => {
                s.append(inner, &[(&reg, desired)])?;
                Ok(desired.to_vec())
            }
            Some(cur) => Ok(cur.clone()),
        })
    }

    /// Waits until every key exists, or fails with [`StoreError::Timeout`] after `timeout`.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let regs: Vec<Vec<u8>> = keys.iter().map(|k| Self::reg(k)).collect();
        self.wait_until(keys, timeout, |inner| regs.iter().all(|k| inner.cache.contains_key(k)))
    }

    /// True iff every key exists now.
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.with_locked(false, &format!("check {keys:?}"), |_, inner| Ok(keys.iter().all(|k| inner.cache.contains_key(&Self::reg(k)))))
    }

    /// Deletes `key` by appending a tombstone (always, as c10d does, so both write the same
    /// bytes). Returns whether the key existed (c10d's FileStore always returns true).
    pub fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let reg = Self::reg(key);
        self.with_locked(true, &format!("delete_key {key:?}"), |s, inner| {
            let existed = inner.cache.contains_key(&reg);
            let mut tomb = vec![DELETE_PREFIX];
            tomb.extend_from_slice(&reg);
            s.append(inner, &[(&tomb, b"")])?;
            Ok(existed)
        })
    }

    /// Number of keys, counted as c10d does (internal `refcount/` and `cleanup/` included).
    pub fn num_keys(&self) -> Result<i64, StoreError> {
        self.with_locked(false, "num_keys", |_, inner| Ok(inner.cache.len() as i64))
    }

    /// Barrier of `world_size` participants named `name` (reusable with new names). Uses keys
    /// `barrier/<name>/arrived` (a counter) and `barrier/<name>/done`.
    pub fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> Result<(), StoreError> {
        let arrived = Self::reg(&format!("barrier/{name}/arrived"));
        let done_key = format!("barrier/{name}/done");
        let done = Self::reg(&done_key);
        self.add_raw_then(&arrived, 1, Some((world_size as i64, &done)))?;
        self.wait_until(&[&done_key], timeout, |inner| inner.cache.contains_key(&done))
    }

    /// The default deadline of [`FileStore::get`].
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw (unprefixed) key → value map as of now, for diagnostics and interop checks.
    pub fn snapshot(&self) -> Result<Vec<KeyValue>, StoreError> {
        self.with_locked(false, "snapshot", |_, inner| {
            let mut v: Vec<_> = inner.cache.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            v.sort();
            Ok(v)
        })
    }

    /// Refreshes under a shared lock until `pred` holds.
    ///
    /// Waiting strategy: a short phase of checks with an exponential backoff (20 µs doubling to
    /// 200 µs, for at most [`SHORT_WAIT`]), then sleeping on inotify. The short phase exists
    /// because an inotify instance that ever held a watch costs ~10 ms to close (the kernel waits
    /// for an SRCU grace period in `close` and at process exit): most rendezvous and barrier
    /// waits end within 10 ms and never pay it. Inotify instances are kept per store and
    /// reused, so long waits pay the close once per store, not once per wait.
    fn wait_until(&self, keys: &[&str], timeout: Duration, mut pred: impl FnMut(&Inner) -> bool) -> Result<(), StoreError> {
        let start = Instant::now();
        let deadline = start + timeout;
        // The file lock is part of the wait: held past the deadline by another process, the wait
        // ends in the same named timeout.
        let mut check = |s: &Self| -> Result<bool, StoreError> {
            let mut inner = s.lock_inner();
            let inner = &mut *inner;
            if !s.try_lock_until(inner, false, deadline)? {
                return Err(s.timeout_err(keys, start));
            }
            s.locked_run(inner, |_, inner| Ok(pred(inner)))
        };
        if check(self)? {
            return Ok(());
        }
        // Short phase.
        let mut nap = Duration::from_micros(20);
        let short_end = (start + SHORT_WAIT).min(deadline);
        loop {
            let now = Instant::now();
            if now >= short_end {
                break;
            }
            std::thread::sleep(nap.min(short_end - now));
            nap = (nap * 2).min(Duration::from_micros(200));
            if check(self)? {
                return Ok(());
            }
        }
        // Long phase: inotify (watch first, then re-check, so no write can be missed).
        let watch = self.take_watch();
        let result = (|| {
            let mut backoff = Duration::from_millis(1);
            loop {
                if check(self)? {
                    return Ok(());
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(self.timeout_err(keys, start));
                }
                let nap = (deadline - now).min(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                match &watch {
                    Some(ino) => {
                        // Millisecond granularity is fine: inotify wakes us on the write itself.
                        let ms = nap.as_millis().clamp(1, u16::MAX as u128) as u16;
                        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                        match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
                            Ok(n) if n > 0 => drain(ino),
                            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                            Err(e) => return Err(self.io("poll(inotify)", e)),
                        }
                    }
                    None => std::thread::sleep(nap),
                }
            }
        })();
        if let Some(w) = watch {
            self.watches.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        }
        result
    }

    /// An inotify instance watching the file for writes, drained of stale events; `None` where
    /// inotify is unavailable (the caller falls back to backoff sleeps).
    fn take_watch(&self) -> Option<Inotify> {
        if let Some(w) = self.watches.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            drain(&w);
            return Some(w);
        }
        let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
        ino.add_watch(&self.path, AddWatchFlags::IN_MODIFY).ok()?;
        Some(ino)
    }
}

fn drain(ino: &Inotify) {
    while matches!(ino.read_events(), Ok(v) if !v.is_empty()) {}
}

impl Drop for FileStore {
    /// c10d's cleanup: count this user in `cleanup/`, drop it from `refcount/`; the user that
    /// brings the refcount to 0 after at least `num_workers` users left removes the file.
    fn drop(&mut self) {
        if !self.path.exists() {
            return;
        }
        let finished = self.add_raw(CLEANUP_KEY.as_bytes(), 1);
        let refs = self.add_raw(REFCOUNT_KEY.as_bytes(), -1);
        if let (Ok(finished), Ok(refs)) = (finished, refs) {
            if refs == 0 && finished >= self.num_workers as i64 {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const T: Duration = Duration::from_secs(5);

    fn tmp() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::Builder::new().prefix("concord-storetest-").tempdir().unwrap();
        let p = d.path().join("store");
        (d, p)
    }

    #[test]
    fn a_lock_held_elsewhere_ends_at_the_deadline_named() {
        let (_d, p) = tmp();
        let limit = Duration::from_millis(150);
        let s = FileStore::open(&p, 1, limit).unwrap();
        s.set("a", b"1").unwrap();
        // Another open file of the store holds its lock (as a stopped process would).
        let holder = File::open(&p).unwrap();
        assert!(sys::try_flock(holder.as_raw_fd(), true).unwrap());
        let t0 = Instant::now();
        let e = s.set("b", b"2").unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(&e, StoreError::Locked { op, waited_ms, .. } if op.contains("set \"b\"") && *waited_ms >= 150), "{e:?}");
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        assert!(took >= limit && took < limit + Duration::from_secs(2), "{took:?}");
        assert!(matches!(s.num_keys().unwrap_err(), StoreError::Locked { .. }));
        // A wait ends at its own deadline with the usual timeout naming its keys.
        let t0 = Instant::now();
        let e = s.wait(&["a"], Duration::from_millis(100)).unwrap_err();
        assert!(matches!(&e, StoreError::Timeout { keys, .. } if keys == &["a".to_string()]), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        // Let go: everything works again.
        drop(holder);
        s.set("b", b"2").unwrap();
        assert_eq!(s.get("b").unwrap(), b"2");
    }

    #[test]
    fn set_get_roundtrip_and_overwrite() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, T).unwrap();
        s.set("a", b"1").unwrap();
        assert_eq!(s.get("a").unwrap(), b"1");
        s.set("a", b"two").unwrap();
        assert_eq!(s.get("a").unwrap(), b"two");
        s.set("empty", b"").unwrap();
        assert_eq!(s.get("empty").unwrap(), b"");
        let other = FileStore::open(&p, 1, T).unwrap();
        assert_eq!(other.get("a").unwrap(), b"two");
    }

    #[test]
    fn exact_bytes_match_c10d_layout() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, T).unwrap();
        s.set("k", b"vv").unwrap();
        assert!(s.delete_key("k").unwrap());
        let bytes = std::fs::read(&p).unwrap();
        let mut want = Vec::new();
        encode_record(&mut want, b"refcount/", b"1");
        encode_record(&mut want, b"/k", b"vv");
        encode_record(&mut want, b"-/k", b"");
        assert_eq!(bytes, want);
        assert_eq!(&bytes[..4], &9u32.to_le_bytes(), "c10d writes native (little-endian) u32 lengths");
    }

    #[test]
    fn reads_a_file_written_in_c10d_format() {
        let (_d, p) = tmp();
        let mut raw = Vec::new();
        encode_record(&mut raw, b"refcount/", b"1");
        encode_record(&mut raw, b"/x", b"hello");
        encode_record(&mut raw, b"/n", b"41");
        encode_record(&mut raw, b"/gone", b"z");
        encode_record(&mut raw, b"-/gone", b"");
        std::fs::write(&p, &raw).unwrap();
        let s = FileStore::open(&p, 1, T).unwrap();
        assert_eq!(s.get("x").unwrap(), b"hello");
        assert_eq!(s.add("n", 1).unwrap(), 42);
        assert!(!s.check(&["gone"]).unwrap());
        // refcount/, /x, /n
        assert_eq!(s.num_keys().unwrap(), 3);
    }

    #[test]
    fn get_times_out_with_named_error() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, Duration::from_millis(50)).unwrap();
        let t0 = Instant::now();
        let e = s.get("missing").unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(50) && t0.elapsed() < Duration::from_secs(2));
        match &e {
            StoreError::Timeout { keys, waited_ms, path } => {
                assert_eq!(keys, &vec!["missing".to_string()]);
                assert!(*waited_ms >= 50);
                assert!(path.ends_with("store"));
            }
            other => panic!("wrong error {other:?}"),
        }
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn add_accumulates() {
        let table: [(&[i64], i64); 4] = [(&[1], 1), (&[5, -2], 3), (&[0], 0), (&[-7, 7, 100], 100)];
        for (deltas, want) in table {
            let (_d, p) = tmp();
            let s = FileStore::open(&p, 1, T).unwrap();
            let mut last = 0;
            for d in deltas {
                last = s.add("c", *d).unwrap();
            }
            assert_eq!(last, want, "adds {deltas:?}");
            assert_eq!(s.get("c").unwrap(), want.to_string().as_bytes(), "adds {deltas:?}");
        }
    }

    #[test]
    fn add_on_non_integer_is_named_error() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, T).unwrap();
        s.set("c", b"abc").unwrap();
        assert!(matches!(s.add("c", 1), Err(StoreError::Corrupt { .. })));
    }

    #[test]
    fn compare_set_follows_c10d() {
        type Row = (Option<&'static [u8]>, &'static [u8], &'static [u8], &'static [u8], Option<&'static [u8]>);
        // (initial, expected, desired, returned, value after)
        let table: [Row; 4] = [
            // absent key, empty expected: sets
            (None, b"", b"new", b"new", Some(b"new")),
            // absent key, non-empty expected: returns expected, leaves absent
            (None, b"x", b"new", b"x", None),
            // present and matching: sets
            (Some(b"old"), b"old", b"new", b"new", Some(b"new")),
            // present, not matching: returns current, unchanged
            (Some(b"old"), b"nope", b"new", b"old", Some(b"old")),
        ];
        for (initial, expected, desired, ret, after) in table {
            let row = format!("initial {initial:?}, expected {expected:?}");
            let (_d, p) = tmp();
            let s = FileStore::open(&p, 1, T).unwrap();
            if let Some(v) = initial {
                s.set("k", v).unwrap();
            }
            assert_eq!(s.compare_set("k", expected, desired).unwrap(), ret, "{row}");
            match after {
                Some(v) => assert_eq!(s.get("k").unwrap(), v, "{row}"),
                None => assert!(!s.check(&["k"]).unwrap(), "{row}"),
            }
        }
    }

    #[test]
    fn wait_and_check() {
        let (_d, p) = tmp();
        let s = Arc::new(FileStore::open(&p, 2, T).unwrap());
        assert!(!s.check(&["a", "b"]).unwrap());
        let p2 = p.clone();
        let h = std::thread::spawn(move || {
            let w = FileStore::open(&p2, 2, T).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            w.set("a", b"1").unwrap();
            w.set("b", b"2").unwrap();
        });
        s.wait(&["a", "b"], T).unwrap();
        assert!(s.check(&["a", "b"]).unwrap());
        h.join().unwrap();
    }

    #[test]
    fn wait_times_out_naming_keys() {
        for keys in [&["never"][..], &["present", "never"]] {
            let (_d, p) = tmp();
            let s = FileStore::open(&p, 1, T).unwrap();
            s.set("present", b"").unwrap();
            let t0 = Instant::now();
            let e = s.wait(keys, Duration::from_millis(30)).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(2), "{keys:?}");
            match e {
                StoreError::Timeout { keys: k, .. } => assert_eq!(k, keys.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
                other => panic!("{keys:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn waits_past_the_spin_phase_are_woken_by_writes_and_reuse_one_watch() {
        // Waits longer than the short spin phase sleep on inotify; each must end because of the
        // other handle's write (not the store timeout), and later waits reuse the one watch.
        // Wake-up latency itself is measured by `cargo xtask bench-harness`, not asserted here.
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 2, T).unwrap();
        let w = FileStore::open(&p, 2, T).unwrap();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for i in 0..3 {
                    std::thread::sleep(Duration::from_millis(40));
                    w.set(&format!("go{i}"), b"").unwrap();
                }
            });
            for i in 0..3 {
                s.wait(&[&format!("go{i}")], T).unwrap();
                assert_eq!(s.get(&format!("go{i}")).unwrap(), b"");
            }
        });
        assert_eq!(s.watches.lock().unwrap().len(), 1, "one watch, reused");
    }

    #[test]
    fn delete_and_num_keys() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, T).unwrap();
        assert_eq!(s.num_keys().unwrap(), 1, "refcount/ counts, as in c10d");
        s.set("a", b"1").unwrap();
        s.add("b", 3).unwrap();
        assert_eq!(s.num_keys().unwrap(), 3);
        assert!(s.delete_key("a").unwrap());
        assert!(!s.delete_key("a").unwrap());
        assert_eq!(s.num_keys().unwrap(), 2);
        assert!(!s.check(&["a"]).unwrap());
        // A fresh reader replays the tombstone too.
        let t = FileStore::open(&p, 1, T).unwrap();
        assert!(!t.check(&["a"]).unwrap());
        s.set("a", b"again").unwrap();
        assert_eq!(t.get("a").unwrap(), b"again");
    }

    #[test]
    fn barrier_across_threads_and_timeout() {
        let (_d, p) = tmp();
        let n = 4;
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let s = FileStore::open(&p, n, T).unwrap();
                    for i in 0..20 {
                        s.barrier(&format!("b{i}"), n, T).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = FileStore::open(&p, 1, T).unwrap();
        let e = s.barrier("lonely", 2, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(&e, StoreError::Timeout { keys, .. } if keys[0] == "barrier/lonely/done"), "{e:?}");
    }

    #[test]
    fn last_user_removes_file() {
        let (_d, p) = tmp();
        let a = FileStore::open(&p, 2, T).unwrap();
        let b = FileStore::open(&p, 2, T).unwrap();
        drop(a);
        assert!(p.exists(), "one user left: file stays");
        drop(b);
        assert!(!p.exists(), "last user removes the file");
    }

    #[test]
    fn refcount_keeps_file_while_users_remain() {
        let (_d, p) = tmp();
        // num_workers = 1 but two users: the first to leave must not remove it (refcount > 0).
        let a = FileStore::open(&p, 1, T).unwrap();
        let b = FileStore::open(&p, 1, T).unwrap();
        drop(a);
        assert!(p.exists());
        b.set("x", b"1").unwrap();
        drop(b);
        assert!(!p.exists());
    }

    #[test]
    fn truncated_file_is_corrupt() {
        let (_d, p) = tmp();
        let s = FileStore::open(&p, 1, T).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&10u32.to_ne_bytes()).unwrap();
        f.write_all(b"abc").unwrap();
        let e = s.check(&["x"]).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn counter_parsing_matches_stoll() {
        assert_eq!(parse_counter(b"42"), Some(42));
        assert_eq!(parse_counter(b"-3"), Some(-3));
        assert_eq!(parse_counter(b" 7x"), Some(7));
        assert_eq!(parse_counter(b"x"), None);
    }
}
