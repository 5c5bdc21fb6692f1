//! Process-wide record of collectives in flight, so that a stuck rank can say *which* collective
//! and sequence number it is in when the runner asks (on deadline, before SIGTERM).
//!
//! Backends MUST call [`begin`] when a collective is issued and [`end`] when it completes or fails.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct InFlight {
    pub backend: String,
    pub op: String,
    pub seq: u64,
    pub since: Instant,
}

static IN_FLIGHT: Mutex<BTreeMap<(String, u64), InFlight>> = Mutex::new(BTreeMap::new());
static LAST: Mutex<Option<(String, String, u64)>> = Mutex::new(None);

/// Records that `backend` issued `op` with sequence number `seq`.
pub fn begin(backend: &str, op: &str, seq: u64) {
    let entry = InFlight { backend: backend.to_string(), op: op.to_string(), seq, since: Instant::now() };
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()).insert((backend.to_string(), seq), entry);
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some((backend.to_string(), op.to_string(), seq));
}

/// Records that `backend`'s collective `seq` is over (completed or failed).
pub fn end(backend: &str, seq: u64) {
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()).remove(&(backend.to_string(), seq));
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
    let map = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = map.values().min_by_key(|f| f.since) {
        let more = if map.len() > 1 { format!(" (+{} more in flight)", map.len() - 1) } else { String::new() };
        return format!("in {} #{} ({}, {} ms){more}", f.op, f.seq, f.backend, f.since.elapsed().as_millis());
    }
    match &*LAST.lock().unwrap_or_else(|e| e.into_inner()) {
        Some((b, op, seq)) => format!("idle; last collective {op} #{seq} ({b})"),
        None => "idle; no collective issued yet".into(),
    }
}

/// Snapshot of every collective in flight, oldest first.
pub fn in_flight() -> Vec<InFlight> {
    let mut v: Vec<_> = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
    v.sort_by_key(|f| f.since);
    v
}
