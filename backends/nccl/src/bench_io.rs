//! Data movement for benchmarks that check every output at large sizes (additive: the
//! collectives do not use it).
//!
//! * [`NcclBackend::copy_rotated`]: `dst` = `src` with every chunk of `l` elements rotated right
//!   by `s`, as device-to-device copies on the rank's stream (two per chunk), ordered after
//!   every op issued before the call and finished (waited for, with the op deadline) before it
//!   returns, as `write` is — a per-iteration input made on the GPU from a base input
//!   uploaded once, instead of a host-to-device copy of the whole input each iteration.
//! * [`NcclBackend::read_with`]: a buffer's bytes through one pinned staging buffer per process
//!   (grown as needed, reused): a truly asynchronous device-to-host copy at full link speed,
//!   waited for with the op deadline, instead of a pageable copy into a fresh zeroed tensor.

use crate::cuda::{derr, Pinned};
use crate::{NcclBackend, NcclBuffer};
use concord_core::{progress, CollectiveError, Result};
use cudarc::driver::result as cu;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The pinned staging buffer of this process (one GPU per process) and its size.
static STAGING: Mutex<Option<(Pinned, usize)>> = Mutex::new(None);

impl NcclBackend {
    fn io_err(&self, what: &str, e: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("nccl {what} on rank {}: {e}", self.rank))
    }

    fn io_timeout(&self, what: &str, started: Instant, detail: &str) -> CollectiveError {
        CollectiveError::Timeout {
            op: what.into(),
            seq: self.seq.load(std::sync::atomic::Ordering::SeqCst),
            rank: self.rank,
            waited_ms: started.elapsed().as_millis() as u64,
            detail: format!(
                "{detail} within the op deadline of {} ms; this process is {}",
                self.op_timeout.as_millis(),
                progress::describe()
            ),
        }
    }

    /// Device-side `dst` = `src` rotated by chunks (see the module docs). `dst` and `src` must
    /// not overlap and must have the same dtype and element count, a multiple of `l`.
    pub fn copy_rotated(&self, dst: &NcclBuffer, src: &NcclBuffer, l: usize, s: usize) -> Result<()> {
        let started = Instant::now();
        if dst.dtype != src.dtype || dst.numel() != src.numel() || (l > 0 && !src.numel().is_multiple_of(l)) || dst.overlaps(src) {
            return Err(self.io_err(
                "copy_rotated",
                format!("{dst:?} <- {src:?} by chunks of {l}: needs the same dtype and size, a whole number of chunks, no overlap"),
            ));
        }
        self.dev.bind().map_err(|e| self.io_err("copy_rotated", e))?;
        if !self.wait_launched(self.op_timeout) {
            return Err(self.io_timeout("copy_rotated", started, "earlier ops were not launched"));
        }
        let elt = src.dtype.size() as u64;
        let n = src.numel() as u64;
        let (l, s) = (l as u64, if l == 0 { 0 } else { (s % l) as u64 });
        let copy = |d: u64, from: u64, bytes: u64| -> Result<()> {
            if bytes == 0 {
                return Ok(());
            }
            unsafe { cu::memcpy_dtod_async(dst.ptr() + d, src.ptr() + from, bytes as usize, self.dev.stream) }
                .map_err(|e| self.io_err("copy_rotated", derr("cuMemcpyDtoDAsync", e)))
        };
        if s == 0 || l == 0 {
            copy(0, 0, n * elt)?;
        } else {
            let (cb, sb) = (l * elt, s * elt);
            let mut o = 0;
            while o < n * elt {
                copy(o, o + cb - sb, sb)?;
                copy(o + sb, o, cb - sb)?;
                o += cb;
            }
        }
        let deadline = Instant::now() + self.op_timeout.max(Duration::from_secs(1));
        match self.dev.sync_until(deadline) {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.io_timeout("copy_rotated", started, "the GPU did not finish the copies")),
            Err(e) => Err(self.io_err("copy_rotated", e)),
        }
    }

    /// Runs `f` on `b`'s bytes, copied through the pinned staging buffer after every op issued
    /// before the call (see the module docs).
    pub fn read_with<R>(&self, b: &NcclBuffer, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let started = Instant::now();
        let n = b.nbytes();
        self.dev.bind().map_err(|e| self.io_err("read", e))?;
        if !self.wait_launched(self.op_timeout) {
            return Err(self.io_timeout("read", started, "earlier ops were not launched"));
        }
        let mut staging = STAGING.lock().unwrap_or_else(|e| e.into_inner());
        if staging.as_ref().is_none_or(|(_, len)| *len < n) {
            *staging = None; // free the old one first
            let len = n.max(1 << 20).next_power_of_two();
            *staging = Some((Pinned::new(&self.dev, len).map_err(|e| self.io_err("read", e))?, len));
        }
        let (pinned, _) = staging.as_mut().expect("set above");
        let host = &mut pinned.as_mut_slice()[..n];
        self.dev.dtoh_pinned(host, b.ptr()).map_err(|e| self.io_err("read", e))?;
        let deadline = Instant::now() + self.op_timeout.max(Duration::from_secs(1));
        match self.dev.sync_until(deadline) {
            Ok(true) => {}
            Ok(false) => return Err(self.io_timeout("read", started, "the GPU did not finish the copy")),
            Err(e) => return Err(self.io_err("read", e)),
        }
        Ok(f(&pinned.as_slice()[..n]))
    }
}
