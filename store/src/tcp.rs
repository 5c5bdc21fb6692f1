//! A key-value store over TCP, wire-compatible with PyTorch's c10d `TCPStore` (client and
//! server), so Rust ranks can rendezvous on torchrun's store and Python and Rust processes can
//! share one server.
//!
//! # Wire protocol (c10d's, as of PyTorch 2.x; every integer in native = little-endian order)
//! * A connection opens with `VALIDATE` (`u8 0`) and the `u32` magic `0x3C85F7CE` (no reply);
//!   the client then sends `PING` (`u8 13`, a `u32` nonce) and the server echoes the nonce.
//! * A request is a `u8` query type followed by its arguments; a string or byte vector is a
//!   `u64` length and the bytes; a key list is a `u64` count and that many strings.
//!
//! | query | arguments | reply |
//! |---|---|---|
//! | SET 1 | key, value | — |
//! | COMPARE_SET 2 | key, expected, desired | value |
//! | GET 3 | key | value (the client WAITs for the key first) |
//! | ADD 4 | key, `i64` delta | `i64` new value (the value is kept as a decimal string) |
//! | CHECK 5 | keys | `u8` 0 ready / 1 not ready |
//! | WAIT 6 | keys | `u8` 0 (STOP_WAITING) once every key exists |
//! | GETNUMKEYS 7 | — | `i64` |
//! | DELETE_KEY 8 | key | `i64` number deleted |
//! | APPEND 9 | key, value | — |
//! | MULTI_GET 10 | keys | one value per key |
//! | MULTI_SET 11 | `u64` count, (key, value)… | — |
//! | CANCEL_WAIT 12 | — | `u8` 1 (WAIT_CANCELED), possibly after a racing `u8` 0 |
//! | PING 13 | `u32` nonce | `u32` nonce |
//!
//! The c10d client prefixes every user key with `/` (`set("a")` sends `/a`); so does
//! [`TcpStore`], after its own optional prefix (`tcp://h:p/run7` stores `a` as `/run7/a`, like
//! c10d's `PrefixStore("run7", store)`).
//!
//! # Contracts
//! * Every client operation has a deadline: connecting (name lookup included) retries until the
//!   store timeout and ends in [`StoreError::Unreachable`]; a wait ends in [`StoreError::Timeout`]
//!   naming the keys (the client cancels the wait on the server, as c10d's does; the server's
//!   answer to the cancel gets at most the wait's own timeout again, at least 250 ms and at most
//!   the store timeout); a server that closes the connection or stops answering is
//!   [`StoreError::Io`] naming the address, never a hang. Threads sharing a client take its
//!   connection in turn, each within its deadline.
//! * A request that fails mid-way (an I/O error, a reply cut short or late) leaves the byte
//!   stream out of step, so the client marks the connection broken: every later request on it
//!   fails at once with a [`StoreError::Io`] naming the first failure, never reads a stale reply.
//!   A wait that timed out and was cancelled cleanly leaves it usable.
//! * A key or value over 1 GiB, or more than 2^20 keys in one request (what the server accepts),
//!   is refused by the client before anything is sent ([`StoreError::Io`] naming the request),
//!   never sent for the server to drop while `set` returns `Ok`.
//! * The server serves each connection on its own thread; a waiting connection sleeps on poll(2)
//!   over its socket and a wake-up socket that writers signal (once, when the waiter's last
//!   missing key appears; the write never blocks): no fixed-period polling.

use crate::StoreError;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// c10d's `validationMagicNumber`.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// c10d's `QueryType` values.
pub mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}
const READY: u8 = 0;
const NOT_READY: u8 = 1;
const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;
/// Longest key or value the server accepts (a corrupt length must not allocate the machine).
const MAX_LEN: u64 = 1 << 30;
/// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET.
const MAX_KEYS: u64 = 1 << 20;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Parses a counter like c10d's `std::stoll`.
fn parse_i64(v: &[u8]) -> Option<i64> {
    crate::parse_counter(v)
}

// ---------------------------------------------------------------------------------------------
// Client

/// A c10d-compatible TCPStore client. Threads may share one (`&self`); requests are serialised
/// on the one connection, as c10d's client does.
pub struct TcpStore {
    addr: String,
    prefix: String,
    timeout: Duration,
    conn: Mutex<Conn>,
}

/// The connection and, once a request failed mid-way, why it is out of step.
struct Conn {
    stream: TcpStream,
    broken: Option<String>,
}

/// Least time the server gets to answer a CANCEL_WAIT (when the wait's own timeout is shorter).
const CANCEL_MIN: Duration = Duration::from_millis(250);

/// `host:port`'s addresses, looked up within `left` (getaddrinfo has no deadline of its own: it
/// runs on a thread of its own, left behind if it outlives `left`). An IP literal needs no lookup.
fn resolve(host: &str, port: u16, left: Duration) -> Result<Vec<std::net::SocketAddr>, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(vec![std::net::SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let h = host.to_string();
    std::thread::Builder::new()
        .name("concord-tcpstore-resolve".into())
        .spawn(move || {
            let _ = tx.send((h.as_str(), port).to_socket_addrs().map(|a| a.collect::<Vec<_>>()));
        })
        .map_err(|e| format!("resolve {host}: cannot start the lookup thread: {e}"))?;
    match rx.recv_timeout(left) {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(format!("resolve {host}: {e}")),
        Err(_) => Err(format!("resolve {host}: no answer from the name lookup within {} ms", left.as_millis())),
    }
}

impl TcpStore {
    /// Connects to the server at `host:port`, retrying until `timeout` (the server may not be up
    /// yet), validates and pings it. `prefix` (may be empty) namespaces every key.
    pub fn connect(host: &str, port: u16, prefix: &str, timeout: Duration) -> Result<TcpStore, StoreError> {
        let addr = format!("{host}:{port}");
        let start = Instant::now();
        let deadline = start + timeout;
        let mut nap = Duration::from_millis(5);
        let unreachable = |msg: String| StoreError::Unreachable { addr: addr.clone(), waited_ms: start.elapsed().as_millis() as u64, msg };
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let last = match resolve(host, port, left) {
                Ok(addrs) => {
                    let mut last = String::from("no address");
                    let mut ok = None;
                    for a in addrs {
                        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                        match TcpStream::connect_timeout(&a, left) {
                            Ok(s) => {
                                ok = Some(s);
                                break;
                            }
                            Err(e) => last = format!("connect {a}: {e}"),
                        }
                    }
                    match ok {
                        Some(s) => break s,
                        None => last,
                    }
                }
                Err(e) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(unreachable(last));
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(200));
        };
        let _ = stream.set_nodelay(true);
        let store = TcpStore {
            addr: addr.clone(),
            prefix: prefix.trim_matches('/').to_string(),
            timeout,
            conn: Mutex::new(Conn { stream, broken: None }),
        };
        let mut hello = vec![query::VALIDATE];
        hello.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
        let nonce = std::process::id() ^ (start.elapsed().subsec_nanos());
        hello.push(query::PING);
        hello.extend_from_slice(&nonce.to_le_bytes());
        let got = store.request("connect", |c| {
            store.send(c, &hello)?;
            store.recv_u32(c, timeout)
        })?;
        if got != nonce {
            return Err(unreachable(format!("the server answered ping nonce {nonce} with {got}: not a c10d TCPStore")));
        }
        Ok(store)
    }

    /// The connection, taken within `within` (another thread's request holds it meanwhile, up
    /// to its own deadline); else a named error.
    fn lock(&self, what: &str, within: Duration) -> Result<MutexGuard<'_, Conn>, StoreError> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            match self.conn.try_lock() {
                Ok(c) => return Ok(c),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            let waited = start.elapsed();
            if waited >= within {
                return Err(
                    self.io(what, format!("the connection stayed busy with another thread's request for {} ms", waited.as_millis()))
                );
            }
            std::thread::sleep(nap.min(within - waited));
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// Runs one request on the connection (taken within the store timeout, or `within` for a
    /// wait). A connection that broke earlier fails at once; a request that fails (anything but
    /// a cleanly cancelled wait's timeout) breaks it.
    fn request<T>(&self, what: &str, f: impl FnOnce(&mut TcpStream) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.request_within(what, self.timeout, f)
    }

    fn request_within<T>(
        &self,
        what: &str,
        within: Duration,
        f: impl FnOnce(&mut TcpStream) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut c = self.lock(what, within)?;
        if let Some(why) = &c.broken {
            return Err(
                self.io(what, format!("the connection is out of step since an earlier request failed mid-way ({why}); connect again"))
            );
        }
        let r = f(&mut c.stream);
        if let Err(e) = &r {
            if !matches!(e, StoreError::Timeout { .. }) {
                c.broken = Some(e.to_string());
            }
        }
        r
    }

    /// Refuses what the server would drop the connection for (see the module's contracts).
    fn fits(&self, what: &str, lens: impl IntoIterator<Item = usize>, keys: usize) -> Result<(), StoreError> {
        if keys as u64 > MAX_KEYS {
            return Err(self.io(what, format!("{keys} keys in one request; the store server takes at most {MAX_KEYS}")));
        }
        if let Some(n) = lens.into_iter().find(|&n| n as u64 > MAX_LEN) {
            return Err(self.io(
                what,
                format!("a key or value of {n} bytes; the store server takes at most {MAX_LEN} (1 GiB) and drops the connection past it"),
            ));
        }
        Ok(())
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The default deadline of [`TcpStore::get`] and of every reply.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn io(&self, what: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io { path: format!("tcp://{}", self.addr), msg: format!("{what}: {e}") }
    }

    /// The key as sent: `/` + prefix + `/` + key (c10d's client `/` and PrefixStore's join).
    fn wire_key(&self, key: &str) -> Vec<u8> {
        if self.prefix.is_empty() {
            format!("/{key}").into_bytes()
        } else {
            format!("/{}/{key}", self.prefix).into_bytes()
        }
    }

    fn send(&self, c: &mut TcpStream, buf: &[u8]) -> Result<(), StoreError> {
        let _ = c.set_write_timeout(Some(self.timeout));
        c.write_all(buf).map_err(|e| self.io("send to the store server", e))
    }

    /// Reads exactly `buf.len()` bytes within `within`; `Ok(false)` when nothing arrived in time
    /// (only possible before the first byte).
    fn recv_exact(&self, c: &mut TcpStream, buf: &mut [u8], within: Duration) -> Result<bool, StoreError> {
        let deadline = Instant::now() + within;
        let mut at = 0;
        while at < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if at == 0 {
                    return Ok(false);
                }
                return Err(self.io("receive", format!("the server stopped mid-reply ({at} of {} bytes) for {within:?}", buf.len())));
            }
            let _ = c.set_read_timeout(Some(left.max(Duration::from_millis(1))));
            match c.read(&mut buf[at..]) {
                Ok(0) => return Err(self.io("receive", "the server closed the connection (is it still running?)")),
                Ok(n) => at += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => return Err(self.io("receive", e)),
            }
        }
        Ok(true)
    }

    fn recv_or_timeout(&self, c: &mut TcpStream, buf: &mut [u8], within: Duration) -> Result<(), StoreError> {
        if self.recv_exact(c, buf, within)? {
            Ok(())
        } else {
            Err(self.io("receive", format!("no reply from the store server within {} ms", within.as_millis())))
        }
    }

    fn recv_u8(&self, c: &mut TcpStream) -> Result<u8, StoreError> {
        let mut b = [0u8; 1];
        self.recv_or_timeout(c, &mut b, self.timeout)?;
        Ok(b[0])
    }

    fn recv_u32(&self, c: &mut TcpStream, within: Duration) -> Result<u32, StoreError> {
        let mut b = [0u8; 4];
        self.recv_or_timeout(c, &mut b, within)?;
        Ok(u32::from_le_bytes(b))
    }

    fn recv_i64(&self, c: &mut TcpStream) -> Result<i64, StoreError> {
        let mut b = [0u8; 8];
        self.recv_or_timeout(c, &mut b, self.timeout)?;
        Ok(i64::from_le_bytes(b))
    }

    fn recv_vec(&self, c: &mut TcpStream) -> Result<Vec<u8>, StoreError> {
        let mut b = [0u8; 8];
        self.recv_or_timeout(c, &mut b, self.timeout)?;
        let n = u64::from_le_bytes(b);
        if n > MAX_LEN {
            return Err(self.io("receive", format!("the server sent a value of {n} bytes (corrupt stream?)")));
        }
        let mut v = vec![0u8; n as usize];
        self.recv_or_timeout(c, &mut v, self.timeout)?;
        Ok(v)
    }

    fn keys_msg(&self, q: u8, keys: &[&str]) -> Result<Vec<u8>, StoreError> {
        let name = match q {
            query::WAIT => "wait",
            query::CHECK => "check",
            _ => "multi_get",
        };
        self.fits(name, keys.iter().map(|k| self.wire_key(k).len()), keys.len())?;
        let mut m = vec![q];
        m.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            put_bytes(&mut m, &self.wire_key(k));
        }
        Ok(m)
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let what = format!("set {key:?}");
        let wk = self.wire_key(key);
        self.fits(&what, [wk.len(), value.len()], 1)?;
        let mut m = vec![query::SET];
        put_bytes(&mut m, &wk);
        put_bytes(&mut m, value);
        self.request(&what, |c| self.send(c, &m))
    }

    /// Waits (up to the store timeout) for `key`, then returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let wait = self.keys_msg(query::WAIT, &[key])?;
        let mut m = vec![query::GET];
        put_bytes(&mut m, &self.wire_key(key));
        self.request(&format!("get {key:?}"), |c| {
            self.wait_locked(c, &wait, &[key], self.timeout)?;
            self.send(c, &m)?;
            self.recv_vec(c)
        })
    }

    /// Adds `delta` to the integer under `key` (absent counts as 0) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let wk = self.wire_key(key);
        let what = format!("add {key:?}");
        self.fits(&what, [wk.len()], 1)?;
        let mut m = vec![query::ADD];
        put_bytes(&mut m, &wk);
        m.extend_from_slice(&delta.to_le_bytes());
        self.request(&what, |c| {
            self.send(c, &m)?;
            self.recv_i64(c)
        })
    }

    /// c10d semantics (see [`crate::FileStore::compare_set`]).
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let wk = self.wire_key(key);
        let what = format!("compare_set {key:?}");
        self.fits(&what, [wk.len(), expected.len(), desired.len()], 1)?;
        let mut m = vec![query::COMPARE_SET];
        put_bytes(&mut m, &wk);
        put_bytes(&mut m, expected);
        put_bytes(&mut m, desired);
        self.request(&what, |c| {
            self.send(c, &m)?;
            self.recv_vec(c)
        })
    }

    /// Waits until every key exists, or fails with [`StoreError::Timeout`] after `timeout`.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let msg = self.keys_msg(query::WAIT, keys)?;
        self.request_within(&format!("wait {keys:?}"), timeout, |c| self.wait_locked(c, &msg, keys, timeout))
    }

    /// One WAIT (`msg`, for `keys`) up to `timeout`; past it, cancelled on the server, whose
    /// answer gets at most `timeout` again (≥ [`CANCEL_MIN`], ≤ the store timeout).
    fn wait_locked(&self, c: &mut TcpStream, msg: &[u8], keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let start = Instant::now();
        self.send(c, msg)?;
        let mut b = [0u8; 1];
        if self.recv_exact(c, &mut b, timeout)? {
            return match b[0] {
                STOP_WAITING => Ok(()),
                x => Err(self.io("wait", format!("unexpected wait reply {x}"))),
            };
        }
        // Deadline: cancel on the server (it may have answered STOP_WAITING meanwhile). Both
        // replies share one deadline, scaled to the caller's wait, not two store timeouts.
        self.send(c, &[query::CANCEL_WAIT])?;
        let cancel_end = Instant::now() + timeout.max(CANCEL_MIN).min(self.timeout.max(CANCEL_MIN));
        let mut one = || -> Result<u8, StoreError> {
            let left = cancel_end.saturating_duration_since(Instant::now());
            let mut b = [0u8; 1];
            if self.recv_exact(c, &mut b, left)? {
                Ok(b[0])
            } else {
                Err(self.io(
                    "wait",
                    format!("the store server did not answer the cancel of a wait for {keys:?} within {} ms", left.as_millis()),
                ))
            }
        };
        let mut r = one()?;
        if r == STOP_WAITING {
            r = one()?;
        }
        if r != WAIT_CANCELED {
            return Err(self.io("wait", format!("unexpected cancel-wait reply {r}")));
        }
        Err(StoreError::Timeout {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            waited_ms: start.elapsed().as_millis() as u64,
            path: format!("tcp://{}", self.addr),
        })
    }

    /// True iff every key exists now.
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let msg = self.keys_msg(query::CHECK, keys)?;
        self.request(&format!("check {keys:?}"), |c| {
            self.send(c, &msg)?;
            match self.recv_u8(c)? {
                READY => Ok(true),
                NOT_READY => Ok(false),
                x => Err(self.io("check", format!("unexpected check reply {x}"))),
            }
        })
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let wk = self.wire_key(key);
        let what = format!("delete_key {key:?}");
        self.fits(&what, [wk.len()], 1)?;
        let mut m = vec![query::DELETE_KEY];
        put_bytes(&mut m, &wk);
        self.request(&what, |c| {
            self.send(c, &m)?;
            Ok(self.recv_i64(c)? == 1)
        })
    }

    /// Number of keys on the server (every key, whatever its prefix, as c10d counts).
    pub fn num_keys(&self) -> Result<i64, StoreError> {
        self.request("num_keys", |c| {
            self.send(c, &[query::GETNUMKEYS])?;
            self.recv_i64(c)
        })
    }

    /// Appends `value` to the bytes under `key` (absent: sets it).
    pub fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let wk = self.wire_key(key);
        let what = format!("append {key:?}");
        self.fits(&what, [wk.len(), value.len()], 1)?;
        let mut m = vec![query::APPEND];
        put_bytes(&mut m, &wk);
        put_bytes(&mut m, value);
        self.request(&what, |c| self.send(c, &m))
    }

    /// Waits (up to the store timeout) for every key, then returns their values in order.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        let wait = self.keys_msg(query::WAIT, keys)?;
        let get = self.keys_msg(query::MULTI_GET, keys)?;
        self.request(&format!("multi_get {keys:?}"), |c| {
            self.wait_locked(c, &wait, keys, self.timeout)?;
            self.send(c, &get)?;
            keys.iter().map(|_| self.recv_vec(c)).collect()
        })
    }

    pub fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
        let what = format!("multi_set of {} key(s)", pairs.len());
        self.fits(&what, pairs.iter().flat_map(|(k, v)| [self.wire_key(k).len(), v.len()]), pairs.len())?;
        let mut m = vec![query::MULTI_SET];
        m.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
        for (k, v) in pairs {
            put_bytes(&mut m, &self.wire_key(k));
            put_bytes(&mut m, v);
        }
        self.request(&what, |c| self.send(c, &m))
    }

    /// Round trip to the server; `Err` when it does not echo within the store timeout.
    pub fn ping(&self) -> Result<(), StoreError> {
        let nonce = 0x5eed_u32 ^ std::process::id();
        let mut m = vec![query::PING];
        m.extend_from_slice(&nonce.to_le_bytes());
        self.request("ping", |c| {
            self.send(c, &m)?;
            match self.recv_u32(c, self.timeout)? {
                n if n == nonce => Ok(()),
                n => Err(self.io("ping", format!("echoed {n}, sent {nonce}"))),
            }
        })
    }

    /// Barrier of `world_size` participants named `name`, with the file store's keys
    /// (`barrier/<name>/arrived`, `barrier/<name>/done`).
    pub fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> Result<(), StoreError> {
        let done = format!("barrier/{name}/done");
        if self.add(&format!("barrier/{name}/arrived"), 1)? == world_size as i64 {
            self.set(&done, b"1")?;
        }
        self.wait(&[&done], timeout)
    }
}

// ---------------------------------------------------------------------------------------------
// Server

#[derive(Default)]
struct State {
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Waiting connections: id -> (keys still missing, wake-up socket).
    waiters: HashMap<u64, (Vec<Vec<u8>>, Arc<UnixStream>)>,
    /// Every live connection (to shut them down with the server).
    conns: HashMap<u64, TcpStream>,
    next_id: u64,
    stopping: bool,
}

struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// After `key` was written: wakes every waiter whose keys now all exist.
    /// Signals a waiter once, when its last missing key appears (not at every later write), and
    /// never blocks under the lock: the wake-up socket is non-blocking, and a full one already
    /// holds a wake-up.
    fn written(&mut self, key: &[u8]) {
        for (missing, wake) in self.waiters.values_mut() {
            if missing.is_empty() {
                continue;
            }
            missing.retain(|k| k.as_slice() != key);
            if missing.is_empty() {
                let _ = (&**wake).write(&[1]);
            }
        }
    }
}

/// A c10d-compatible TCPStore server: listens on every interface, one thread per connection.
/// Dropping it (or [`TcpServer::stop`]) closes the listener and every connection.
pub struct TcpServer {
    port: u16,
    shared: Arc<Shared>,
    stop_tx: UnixStream,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl TcpServer {
    /// Binds `0.0.0.0:port` (`port` 0: any free port; see [`TcpServer::port`]).
    pub fn bind(port: u16) -> Result<TcpServer, StoreError> {
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| StoreError::Io { path: format!("tcp://0.0.0.0:{port}"), msg: format!("bind the store server: {e}") })?;
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
        let (stop_tx, stop_rx) =
            UnixStream::pair().map_err(|e| StoreError::Io { path: format!("tcp://0.0.0.0:{port}"), msg: format!("socketpair: {e}") })?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()) });
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("concord-tcpstore-{port}"))
            .spawn(move || accept_loop(listener, stop_rx, sh))
            .map_err(|e| StoreError::Io { path: format!("tcp://0.0.0.0:{port}"), msg: format!("spawn: {e}") })?;
        Ok(TcpServer { port, shared, stop_tx, acceptor: Some(acceptor) })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Number of keys held (diagnostics).
    pub fn num_keys(&self) -> usize {
        self.shared.lock().map.len()
    }

    /// Closes the listener and every connection; clients then get a named error.
    pub fn stop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stopping = true;
            for c in st.conns.values() {
                let _ = c.shutdown(Shutdown::Both);
            }
            for (_, w) in st.waiters.values() {
                let _ = (&**w).write(&[1]);
            }
        }
        let _ = (&self.stop_tx).write(&[1]);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, stop_rx: UnixStream, shared: Arc<Shared>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(stop_rx.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        let Ok((sock, _)) = listener.accept() else { continue };
        let _ = sock.set_nodelay(true);
        let id = {
            let mut st = shared.lock();
            if st.stopping {
                return;
            }
            st.next_id += 1;
            let id = st.next_id;
            if let Ok(c) = sock.try_clone() {
                st.conns.insert(id, c);
            }
            id
        };
        let sh = shared.clone();
        let spawned = std::thread::Builder::new().name("concord-tcpstore-conn".into()).spawn(move || {
            let _ = serve_conn(id, sock, &sh);
            let mut st = sh.lock();
            st.conns.remove(&id);
            st.waiters.remove(&id);
        });
        if spawned.is_err() {
            shared.lock().conns.remove(&id);
        }
    }
}

/// Why a connection ended (the client left, or sent something we do not understand).
type ConnResult = Result<(), String>;

fn read_n<const N: usize>(s: &mut TcpStream) -> Result<[u8; N], String> {
    let mut b = [0u8; N];
    s.read_exact(&mut b).map_err(|e| e.to_string())?;
    Ok(b)
}

fn read_vec(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let n = u64::from_le_bytes(read_n::<8>(s)?);
    if n > MAX_LEN {
        return Err(format!("length {n} too large"));
    }
    let mut v = vec![0u8; n as usize];
    s.read_exact(&mut v).map_err(|e| e.to_string())?;
    Ok(v)
}

fn read_keys(s: &mut TcpStream) -> Result<Vec<Vec<u8>>, String> {
    let n = u64::from_le_bytes(read_n::<8>(s)?);
    if n > MAX_KEYS {
        return Err(format!("{n} keys is too many"));
    }
    (0..n).map(|_| read_vec(s)).collect()
}

fn write_all(s: &mut TcpStream, b: &[u8]) -> Result<(), String> {
    s.write_all(b).map_err(|e| e.to_string())
}

fn serve_conn(id: u64, mut s: TcpStream, shared: &Shared) -> ConnResult {
    // A connection must validate first (c10d's server drops one that does not).
    let [q] = read_n::<1>(&mut s)?;
    if q != query::VALIDATE || u32::from_le_bytes(read_n::<4>(&mut s)?) != VALIDATION_MAGIC {
        return Err("the client did not validate".into());
    }
    let (wake_rx, wake_tx) = UnixStream::pair().map_err(|e| e.to_string())?;
    // Writers signal it under the server's lock: it must never block.
    wake_tx.set_nonblocking(true).map_err(|e| e.to_string())?;
    let wake_tx = Arc::new(wake_tx);
    loop {
        let [q] = read_n::<1>(&mut s)?;
        match q {
            query::VALIDATE => {
                if u32::from_le_bytes(read_n::<4>(&mut s)?) != VALIDATION_MAGIC {
                    return Err("bad validation magic".into());
                }
            }
            query::PING => {
                let n = read_n::<4>(&mut s)?;
                write_all(&mut s, &n)?;
            }
            query::SET => {
                let (k, v) = (read_vec(&mut s)?, read_vec(&mut s)?);
                let mut st = shared.lock();
                st.map.insert(k.clone(), v);
                st.written(&k);
            }
            query::MULTI_SET => {
                let n = u64::from_le_bytes(read_n::<8>(&mut s)?);
                if n > MAX_KEYS {
                    return Err("too many keys".into());
                }
                let mut pairs = Vec::new();
                for _ in 0..n {
                    pairs.push((read_vec(&mut s)?, read_vec(&mut s)?));
                }
                let mut st = shared.lock();
                for (k, v) in pairs {
                    st.map.insert(k.clone(), v);
                    st.written(&k);
                }
            }
            query::APPEND => {
                let (k, v) = (read_vec(&mut s)?, read_vec(&mut s)?);
                let mut st = shared.lock();
                st.map.entry(k.clone()).or_default().extend_from_slice(&v);
                st.written(&k);
            }
            query::COMPARE_SET => {
                let (k, expected, desired) = (read_vec(&mut s)?, read_vec(&mut s)?, read_vec(&mut s)?);
                let reply = {
                    let mut st = shared.lock();
                    match st.map.get(&k) {
                        None if expected.is_empty() => {
                            st.map.insert(k.clone(), desired.clone());
                            st.written(&k);
                            desired
                        }
                        None => expected,
                        Some(cur) if *cur == expected => {
                            st.map.insert(k.clone(), desired.clone());
                            st.written(&k);
                            desired
                        }
                        Some(cur) => cur.clone(),
                    }
                };
                let mut out = Vec::new();
                put_bytes(&mut out, &reply);
                write_all(&mut s, &out)?;
            }
            query::GET => {
                let k = read_vec(&mut s)?;
                let v = shared.lock().map.get(&k).cloned().unwrap_or_default();
                let mut out = Vec::new();
                put_bytes(&mut out, &v);
                write_all(&mut s, &out)?;
            }
            query::MULTI_GET => {
                let keys = read_keys(&mut s)?;
                let mut out = Vec::new();
                {
                    let st = shared.lock();
                    for k in &keys {
                        put_bytes(&mut out, st.map.get(k).map(Vec::as_slice).unwrap_or(&[]));
                    }
                }
                write_all(&mut s, &out)?;
            }
            query::ADD => {
                let k = read_vec(&mut s)?;
                let delta = i64::from_le_bytes(read_n::<8>(&mut s)?);
                let new = {
                    let mut st = shared.lock();
                    let cur = match st.map.get(&k) {
                        Some(v) => {
                            parse_i64(v).ok_or_else(|| format!("ADD on a non-integer value under {:?}", String::from_utf8_lossy(&k)))?
                        }
                        None => 0,
                    };
                    let new = cur.wrapping_add(delta);
                    st.map.insert(k.clone(), new.to_string().into_bytes());
                    st.written(&k);
                    new
                };
                write_all(&mut s, &new.to_le_bytes())?;
            }
            query::CHECK => {
                let keys = read_keys(&mut s)?;
                let ok = {
                    let st = shared.lock();
                    keys.iter().all(|k| st.map.contains_key(k))
                };
                write_all(&mut s, &[if ok { READY } else { NOT_READY }])?;
            }
            query::GETNUMKEYS => {
                let n = shared.lock().map.len() as i64;
                write_all(&mut s, &n.to_le_bytes())?;
            }
            query::DELETE_KEY => {
                let k = read_vec(&mut s)?;
                let n = shared.lock().map.remove(&k).is_some() as i64;
                write_all(&mut s, &n.to_le_bytes())?;
            }
            query::WAIT => {
                let keys = read_keys(&mut s)?;
                serve_wait(id, &mut s, shared, keys, &wake_rx, &wake_tx)?;
            }
            query::CANCEL_WAIT => {
                // No wait pending (it ended before the cancel arrived): still acknowledge.
                write_all(&mut s, &[WAIT_CANCELED])?;
            }
            other => return Err(format!("unknown query type {other}")),
        }
    }
}

/// Serves one WAIT: answers STOP_WAITING once every key exists, or WAIT_CANCELED when the client
/// gives up first (CANCEL_WAIT). Sleeps on poll over the socket and the wake-up socket.
fn serve_wait(
    id: u64,
    s: &mut TcpStream,
    shared: &Shared,
    keys: Vec<Vec<u8>>,
    wake_rx: &UnixStream,
    wake_tx: &Arc<UnixStream>,
) -> ConnResult {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    {
        let mut st = shared.lock();
        let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !st.map.contains_key(k)).collect();
        if missing.is_empty() {
            drop(st);
            return write_all(s, &[STOP_WAITING]);
        }
        st.waiters.insert(id, (missing, wake_tx.clone()));
    }
    let _ = wake_rx.set_nonblocking(true);
    loop {
        let (sock_ready, woke) = {
            let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN), PollFd::new(wake_rx.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.to_string()),
            }
            (fds[0].revents().is_some_and(|r| !r.is_empty()), fds[1].revents().is_some_and(|r| !r.is_empty()))
        };
        if woke {
            let mut sink = [0u8; 64];
            while matches!((&*wake_rx).read(&mut sink), Ok(n) if n > 0) {}
            let mut st = shared.lock();
            if st.stopping {
                return Err("server stopping".into());
            }
            if st.waiters.get(&id).is_some_and(|(m, _)| m.is_empty()) {
                st.waiters.remove(&id);
                drop(st);
                return write_all(s, &[STOP_WAITING]);
            }
        }
        if sock_ready {
            // The only request a waiting c10d client sends is CANCEL_WAIT (or it hangs up).
            let [q] = read_n::<1>(s)?;
            let done = shared.lock().waiters.remove(&id).is_some_and(|(m, _)| m.is_empty());
            if q != query::CANCEL_WAIT {
                return Err(format!("query {q} during a wait"));
            }
            if done {
                write_all(s, &[STOP_WAITING])?;
            }
            return write_all(s, &[WAIT_CANCELED]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_signalled_once_when_complete_never_again_and_never_blocking() {
        let (rx, tx) = UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut st = State::default();
        st.waiters.insert(1, (vec![b"/a".to_vec(), b"/b".to_vec()], Arc::new(tx)));
        st.written(b"/a");
        let mut buf = [0u8; 16];
        assert!((&rx).read(&mut buf).is_err(), "one key still missing: no wake-up");
        st.written(b"/b");
        assert_eq!((&rx).read(&mut buf).unwrap(), 1, "complete: one wake-up");
        // Later writes of its keys (the waiter has not run yet) signal nothing more: a waiter
        // that is slow to run never fills its socket and blocks the writer under the lock.
        for _ in 0..100_000 {
            st.written(b"/a");
        }
        assert!((&rx).read(&mut buf).is_err(), "no repeated wake-ups");
    }
}
