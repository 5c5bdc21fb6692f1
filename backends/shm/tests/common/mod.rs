#![allow(dead_code)]
//! Test helpers: a world of ranks as threads of this process, sharing one temporary store.

use concord_core::{Backend, WorldInfo};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static WORLDS: AtomicUsize = AtomicUsize::new(0);

pub fn world_id() -> String {
    format!("t{}-{}", std::process::id(), WORLDS.fetch_add(1, Ordering::SeqCst))
}

pub fn info(rank: usize, n: usize, dir: &std::path::Path, wid: &str, timeout: Duration) -> WorldInfo {
    WorldInfo {
        rank,
        world_size: n,
        store_path: dir.join("store"),
        world_id: wid.to_string(),
        op_timeout: timeout,
        options: vec![("shm_arena_gib".into(), "0.25".into())],
    }
}

/// /dev/shm entries of world `wid`.
pub fn leftovers(wid: &str) -> Vec<std::path::PathBuf> {
    concord_harness::platform::list_prefixed(std::path::Path::new("/dev/shm"), &concord_core::world_prefix(wid))
}

/// Runs `f(backend)` on `n` ranks (threads), returns the results by rank, and checks that the
/// world left nothing in /dev/shm.
pub fn run<R: Send>(n: usize, timeout: Duration, f: impl Fn(ShmBackend) -> R + Sync) -> Vec<R> {
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, dir, wid) = (&f, dir.path(), wid.as_str());
                s.spawn(move || {
                    let b = ShmBackend::init(&info(r, n, dir, wid, timeout)).unwrap_or_else(|e| panic!("rank {r} init: {e}"));
                    f(b)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    assert!(leftovers(&wid).is_empty(), "leftovers in /dev/shm: {:?}", leftovers(&wid));
    out
}

pub const T: Duration = Duration::from_secs(10);

/// A two-party rendezvous for test threads that cannot hang: the opening side opens it when its
/// guard drops (also when an assertion panics), and the waiting side waits at most a deadline.
#[derive(Default)]
pub struct Gate {
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

pub struct OpenOnDrop<'a>(pub &'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.cv.notify_all();
    }
}

impl Gate {
    /// Waits until the gate is open; panics (never hangs) after `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let g = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self.cv.wait_timeout_while(g, timeout, |open| !*open).unwrap_or_else(|e| e.into_inner());
        assert!(*g, "the other rank never opened the gate within {timeout:?}");
    }
}
