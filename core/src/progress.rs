//! Process-wide record of collectives in flight, so that a stuck rank can say *which* collective
//! and sequence number it is in when the runner asks (on deadline, before SIGTERM).
//!
//! Backends MUST call [`begin`] when a collective is issued and [`end`] when it completes or fails.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct InFlight {
    pub backend: String,
    pub op: String,
    pub seq: u64,
    pub since: Instant,
}

/// An op in flight (its backend and sequence number are its keys in [`State`]).
struct Entry {
    op: Arc<str>,
    since: Instant,
}

/// What [`begin`] and [`end`] keep: the ops in flight by backend, then sequence number, and the
/// last op begun. Both run once per op on the issuing thread, so they allocate nothing in the
/// common case (a backend seen before, the same op name as the last one): `end` looks the
/// backend up by `&str`, and an op name is shared with the last op's when it is the same.
struct State {
    in_flight: BTreeMap<String, BTreeMap<u64, Entry>>,
    last: Option<(String, Arc<str>, u64)>,
}

static STATE: Mutex<State> = Mutex::new(State { in_flight: BTreeMap::new(), last: None });

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that `backend` issued `op` with sequence number `seq`.
pub fn begin(backend: &str, op: &str, seq: u64) {
    let since = Instant::now();
    let mut s = state();
    let s = &mut *s;
    let op: Arc<str> = match &s.last {
        Some((_, last, _)) if &**last == op => last.clone(),
        _ => Arc::from(op),
    };
    if !s.in_flight.contains_key(backend) {
        s.in_flight.insert(backend.to_string(), BTreeMap::new());
    }
    s.in_flight.get_mut(backend).expect("inserted above").insert(seq, Entry { op: op.clone(), since });
    match &mut s.last {
        Some((b, o, q)) => {
            if b != backend {
                b.clear();
                b.push_str(backend);
            }
            (*o, *q) = (op, seq);
        }
        None => s.last = Some((backend.to_string(), op, seq)),
    }
}

/// Records that `backend`'s collective `seq` is over (completed or failed).
pub fn end(backend: &str, seq: u64) {
    if let Some(m) = state().in_flight.get_mut(backend) {
        m.remove(&seq);
    }
}

/// Keys of [`record`]s: a range no backend's sequence numbers reach (shm's point-to-point keys
/// set bit 63 or 62).
const RECORD_KEYS: u64 = 1 << 61;
static NEXT_RECORD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An op recorded as in flight until the guard is dropped ([`record`]).
#[must_use = "the op is recorded only while the guard lives"]
pub struct Recorded {
    backend: String,
    key: u64,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        end(&self.backend, self.key);
    }
}

/// Records `op` of `backend` as in flight until the returned guard is dropped, under a key of
/// its own: for an op built from others (a fused op run as an all_gather and matmuls), recorded
/// under the op the caller called beside the ops it runs ([clause: progress.recorded]).
pub fn record(backend: &str, op: &str) -> Recorded {
    let key = RECORD_KEYS | NEXT_RECORD.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    begin(backend, op, key);
    Recorded { backend: backend.to_string(), key }
}

/// A one-line description of what this process is doing, for deadline reports:
/// `in all_reduce #12 (shm, 5012 ms)` or `idle; last collective all_gather_into_tensor #11 (shm)`.
pub fn describe() -> String {
    let s = state();
    let all = || s.in_flight.iter().flat_map(|(b, m)| m.iter().map(move |(seq, e)| (b, seq, e)));
    let n = all().count();
    if let Some((b, seq, e)) = all().min_by_key(|(_, _, e)| e.since) {
        let more = if n > 1 { format!(" (+{} more in flight)", n - 1) } else { String::new() };
        return format!("in {} #{} ({}, {} ms){more}", e.op, seq, b, e.since.elapsed().as_millis());
    }
    match &s.last {
        Some((b, op, seq)) => format!("idle; last collective {op} #{seq} ({b})"),
        None => "idle; no collective issued yet".into(),
    }
}

/// Snapshot of every collective in flight, oldest first.
pub fn in_flight() -> Vec<InFlight> {
    let s = state();
    let mut v: Vec<InFlight> = s
        .in_flight
        .iter()
        .flat_map(|(b, m)| m.iter().map(move |(seq, e)| InFlight { backend: b.clone(), op: e.op.to_string(), seq: *seq, since: e.since }))
        .collect();
    v.sort_by_key(|f| f.since);
    v
}
