//! The NCCL backend's [`Hooks`]: one GPU per rank, the backend's own cross-rank validation off
//! (the bench checks every output itself), the GPU's memory pool keeping freed memory (out-of-place
//! outputs are allocated per call, stream-ordered, as a caching allocator would serve them),
//! CUDA-event timing ([`concord_nccl::timing`]), the raw NCCL reference
//! ([`concord_nccl::reference`]) in the same run, and inputs rotated on the GPU with outputs read
//! through pinned memory ([`concord_nccl::bench_io`]).

use crate::ext::{Clock, DeviceData, Mark, RefStep, Reference};
use crate::spec::Placement;
use crate::Hooks;
use concord_core::{Backend, CollectiveError, DType, Tensor, WorldInfo};
use concord_nccl::reference::{self, RawMode, RawNccl, RawOp, RawStep};
use concord_nccl::{NcclBackend, NcclBuffer};
use std::time::Duration;

/// How the NCCL rows are timed (the table's header and the JSON lines).
pub const EVENT_TIMING: &str = "CUDA events on the rank's stream: GPU time from an event recorded before a window's first issue \
to one recorded after its last issue (k back-to-back issues, no per-op host synchronisation; the waits and every output's \
check come after the end event; each window, on both sides, behind one untimed launch of the same op, so the GPU is busy \
when the clock starts, as in nccl-tests' loop after its warm-up); per rank the median over the windows of each window's mean \
per iteration (one window: its mean; --window caps a window), averaged over ranks; sendrecv: host wall-clock around the window's issues \
and waits (send / recv run on per-direction streams the events are not recorded on)";

fn mark(b: &NcclBackend) -> concord_core::Result<Mark> {
    Ok(Box::new(b.mark()?))
}

fn elapsed(b: &NcclBackend, start: &Mark, end: &Mark, timeout: Duration) -> concord_core::Result<Duration> {
    use concord_nccl::timing::Mark as M;
    match (start.downcast_ref::<M>(), end.downcast_ref::<M>()) {
        (Some(s), Some(e)) => b.elapsed(s, e, timeout),
        _ => Err(CollectiveError::Backend("nccl bench clock: marks that are not CUDA events of this backend".into())),
    }
}

fn copy_rotated(b: &NcclBackend, dst: &NcclBuffer, src: &NcclBuffer, l: usize, s: usize) -> concord_core::Result<()> {
    b.copy_rotated(dst, src, l, s)
}

fn read(b: &NcclBackend, x: &NcclBuffer, f: &mut dyn FnMut(&[u8])) -> concord_core::Result<()> {
    b.read_with(x, f)
}

fn prepare(b: &NcclBackend) {
    b.set_validation(false);
    let _ = b.keep_pool_memory(u64::MAX);
}

fn version(b: &NcclBackend) -> String {
    let pool = match b.pool_release_threshold() {
        Ok(u64::MAX) => "memory pool keeps freed memory".to_string(),
        Ok(t) => format!("memory pool release threshold {t} B"),
        Err(e) => format!("no memory pool ({e})"),
    };
    format!("NCCL {} ({}, validation off, {pool})", b.nccl_version(), b.launch_mode())
}

/// The raw reference of one rank.
struct Raw {
    raw: RawNccl,
    /// Option `raw_buffers=window`: the raw loop cycles through a window's worth of buffer sets,
    /// as the backend's side does; default `pair`: one pair, nccl-tests' loop.
    per_window: bool,
    /// Option `raw_events=1`: a completion event recorded after every raw launch, as the
    /// backend records one after every op.
    events: bool,
    /// Option `raw_fill=zero`: the raw loop's buffers hold zeros (default `data`: a non-zero
    /// pattern, as nccl-tests' buffers hold data).
    zeros: bool,
    /// The last step's fastest and slowest window, µs per op.
    spread: Option<(f64, f64)>,
    /// Option `raw_thread=1`: each window's launches made by a second thread while the caller
    /// spins (the backend's two-thread shape without its work per op; `RawStep::thread`);
    /// `raw_thread=nap`: the caller sleeps between looks until the last 8 (`Some(true)`).
    thread: Option<bool>,
    /// Option `raw_pin=N`: the launching thread on CPU `N + rank` (`RawStep::pin`).
    pin: Option<usize>,
    /// `raw_thread=keep` / `keepblock`: one launcher thread for the whole step (`RawStep::keep`).
    keep: bool,
    /// `raw_thread=block` / `keepblock`: the launcher records the end event and the caller
    /// blocks meanwhile (`RawStep::block`).
    block: bool,
    /// Option `raw_group=1`: each launch in its own NCCL group, as the backend's (`RawStep::group`).
    group: bool,
    /// Option `raw_comm=init|nonblocking|split`: how the raw communicator is made (default
    /// `init`, nccl-tests' `ncclCommInitRank`; `split`: as the backend's blocking twin).
    mode: RawMode,
    /// Option `caller_pin=M`: the rank's issuing thread (this one: the backend's issues and
    /// marks, and the raw loop's launches unless `raw_pin` or `raw_thread` moves them) runs on
    /// CPU `M + rank` only, from the reference's set-up to the rank's end (see [`caller_pin`]).
    caller: Option<usize>,
}

impl Reference for Raw {
    fn label(&self) -> String {
        format!(
            "{}{}{}{}{}{}",
            if self.per_window { "nccl-raw-window" } else { "nccl-raw" },
            match self.mode {
                RawMode::Blocking => "",
                RawMode::NonBlocking => "+nonblocking",
                RawMode::Split => "+split",
            },
            if self.events { "+events" } else { "" },
            if self.group { "+group" } else { "" },
            match (self.thread, self.keep, self.block) {
                (None, ..) => "",
                (Some(true), ..) => "+thread-nap",
                (Some(false), false, false) => "+thread",
                (Some(false), true, false) => "+thread-keep",
                (Some(false), false, true) => "+thread-block",
                (Some(false), true, true) => "+thread-keepblock",
            },
            if self.pin.is_some() { "+pin" } else { "" },
        )
    }
    fn describe(&self) -> String {
        let buffers = if self.per_window {
            "a buffer set of its own for every launch of a window, as the backend's side (option raw_buffers=window)"
        } else {
            "one preallocated buffer pair (nccl-tests' loop; --opts raw_buffers=window gives every launch of a window its own, as the backend's side)"
        };
        let events =
            if self.events { ", a completion event recorded after every launch as the backend does (option raw_events=1)" } else { "" };
        let thread = match self.thread {
            Some(false) => ", each window's launches made by a second thread while the first spins until they are made (option raw_thread=1)",
            Some(true) => ", each window's launches made by a second thread while the first sleeps 20 us between looks until the last 8 (option raw_thread=nap)",
            None => "",
        };
        let thread = match (self.thread.is_some(), self.keep, self.block) {
            (true, false, true) => ", each window's launches and its end event made by a second thread while the first blocks on a condition variable (option raw_thread=block)",
            (true, true, false) => ", each window's launches made by one launcher thread kept for the whole step while the first spins until they are made (option raw_thread=keep)",
            (true, true, true) => ", each window's launches and its end event made by one launcher thread kept for the whole step while the first blocks on a condition variable (option raw_thread=keepblock)",
            _ => thread,
        };
        let thread = if self.group {
            format!("{thread}, each launch in its own ncclGroupStart / ncclGroupEnd as the backend's (option raw_group=1)")
        } else {
            thread.to_string()
        };
        let thread = match self.pin {
            Some(n) => format!("{thread}, the launching thread on CPU {n} + rank (option raw_pin={n})"),
            None => thread,
        };
        let thread = match self.caller {
            Some(m) => format!(
                "{thread}; the bench's issuing thread on CPU {m} + rank for the whole run, the backend's side too (option caller_pin={m})"
            ),
            None => thread,
        };
        let fill = if self.zeros {
            "zeros (option raw_fill=zero)"
        } else {
            "a non-zero pattern (as nccl-tests' data; --opts raw_fill=zero: zeros)"
        };
        let comm = match self.mode {
            RawMode::Blocking => "its own blocking communicator (ncclCommInitRank)",
            RawMode::NonBlocking => "its own non-blocking communicator, polled after every call (option raw_comm=nonblocking)",
            RawMode::Split => {
                "its own blocking communicator split off a non-blocking parent (splitShare 0) as the backend's twin (option raw_comm=split)"
            }
        };
        format!(
            "the same collective called directly through NCCL (cudarc bindings) on {buffers} holding {fill}, {comm} \
             and stream{events}{thread}, timed with CUDA events around the same back-to-back windows"
        )
    }
    fn time_us(&mut self, s: &RefStep) -> Result<Option<f64>, String> {
        let Some(op) = RawOp::from_name(s.op.name()) else { return Ok(None) };
        if !reference::supports(op, s.dtype, s.redop) {
            return Ok(None);
        }
        let step = RawStep {
            op,
            count: s.count,
            dtype: s.dtype,
            redop: s.redop,
            root: s.root,
            in_place: s.placement == Placement::InPlace,
            warmup: s.warmup,
            iters: s.iters,
            window: s.window,
            buffers: if self.per_window { s.window } else { 1 },
            events: self.events,
            zeros: self.zeros,
            thread: self.thread.is_some(),
            nap: self.thread == Some(true),
            pin: self.pin,
            keep: self.keep,
            block: self.block,
            group: self.group,
        };
        let t = self.raw.time(&step)?;
        self.spread = Some((t.min_per_op.as_secs_f64() * 1e6, t.max_per_op.as_secs_f64() * 1e6));
        // `CONCORD_BENCH_PROBE=1`: the raw launch call's host time beside the backend's `# probe`
        // lines (its progress thread's `nccl` section), one write per line.
        if let (Some(l), true) = (t.launch_per_op, concord_harness::config::Config::global().bench_probe) {
            use std::io::Write as _;
            let line = format!(
                "# probe-raw rank {} {} {} {} B ({}): gpu {:.2} launch {:.2} (us per op, medians over the windows)\n",
                self.raw.rank(),
                s.op.name(),
                s.placement.name(),
                s.count * s.dtype.size(),
                self.label(),
                t.per_op.as_secs_f64() * 1e6,
                l.as_secs_f64() * 1e6,
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
        Ok(Some(t.per_op.as_secs_f64() * 1e6))
    }
    fn last_spread_us(&self) -> Option<(f64, f64)> {
        self.spread
    }
}

fn make_reference(b: &NcclBackend, world: &WorldInfo) -> Result<Box<dyn Reference>, String> {
    let per_window = match world.option("raw_buffers") {
        None | Some("pair") => false,
        Some("window") => true,
        Some(o) => return Err(format!("option raw_buffers={o}: expected pair or window")),
    };
    let events = world.flag("raw_events", false)?;
    let zeros = match world.option("raw_fill") {
        None | Some("data") => false,
        Some("zero") => true,
        Some(o) => return Err(format!("option raw_fill={o}: expected data or zero")),
    };
    let (thread, keep, block) = match world.option("raw_thread") {
        Some("nap") => (Some(true), false, false),
        Some("keep") => (Some(false), true, false),
        Some("block") => (Some(false), false, true),
        Some("keepblock") => (Some(false), true, true),
        _ => (world.flag("raw_thread", false)?.then_some(false), false, false),
    };
    let group = world.flag("raw_group", false)?;
    let pin = match world.option("raw_pin") {
        None => None,
        Some(v) => Some(v.parse::<usize>().map_err(|_| format!("option raw_pin={v}: expected a CPU number"))?),
    };
    let mode = match world.option("raw_comm") {
        None | Some("init") => RawMode::Blocking,
        Some("nonblocking") => RawMode::NonBlocking,
        Some("split") => RawMode::Split,
        Some(o) => return Err(format!("option raw_comm={o}: expected init, nonblocking or split")),
    };
    let caller = caller_pin(world, pin, thread.is_some())?;
    let raw = make_raw(b, world, mode)?;
    // After every set-up thread has started (the backend's progress thread, NCCL's own threads of
    // both communicators): none of them inherits the one-CPU set.
    if let Some(m) = caller {
        concord_nccl::pin::pin_caller(m + b.rank()).map_err(|e| format!("option caller_pin={m}: {e}"))?;
    }
    Ok(Box::new(Raw { raw, per_window, events, zeros, spread: None, thread, pin, keep, block, group, mode, caller }))
}

/// Option `caller_pin=M`: the bench's issuing thread of rank `r` on CPU `M + r` for the whole
/// run, so that one run compares the backend (caller on `M + r`, its progress thread on
/// `N + r` with the backend option `progress_pin=N`) with the raw loop (its launching thread on
/// `N + r` with `raw_pin=N`, restored to `M + r` after each step) with no two of those threads
/// sharing a vCPU. A raw launcher thread (`raw_thread`) would inherit the caller's one CPU, so
/// `raw_thread` needs `raw_pin` beside it; `caller_pin` equal to `raw_pin` or `progress_pin` is
/// refused for the same reason (gpulat11: two busy threads on one vCPU, 5-8 x slower).
fn caller_pin(world: &WorldInfo, raw_pin: Option<usize>, raw_thread: bool) -> Result<Option<usize>, String> {
    let Some(v) = world.option("caller_pin") else { return Ok(None) };
    let m = v.parse::<usize>().map_err(|_| format!("option caller_pin={v}: expected a CPU number"))?;
    if world.option("progress_pin") == Some(v) {
        return Err(format!("option caller_pin={m} with progress_pin={v}: the progress thread would share the caller's CPU"));
    }
    match raw_pin {
        Some(n) if n == m => {
            Err(format!("option caller_pin={m} with raw_pin={n}: the raw loop's launching thread would share the caller's CPU"))
        }
        None if raw_thread => {
            Err(format!("option caller_pin={m} with raw_thread needs raw_pin: the raw launcher thread would inherit the caller's one CPU"))
        }
        _ => Ok(Some(m)),
    }
}

/// The raw NCCL reference of this rank: rank 0's NCCL unique id reaches every rank through the
/// backend itself (one broadcast of a flag byte and the id), then every rank joins the
/// reference communicator (bounded wait). Collective: every rank calls it.
pub fn make_raw(b: &NcclBackend, world: &WorldInfo, mode: RawMode) -> Result<RawNccl, String> {
    let mut bytes = vec![0u8; 129];
    let mut why = String::new();
    if b.rank() == 0 {
        match reference::unique_id() {
            Ok(id) => {
                bytes[0] = 1;
                bytes[1..].copy_from_slice(&id);
            }
            Err(e) => why = e,
        }
    }
    let shared = (|| -> concord_core::Result<Tensor> {
        let x = b.upload(&Tensor::from_bytes(DType::U8, &[129], &bytes))?;
        b.broadcast_(&x, 0)?.wait(world.op_timeout)?;
        b.download(&x)
    })()
    .map_err(|e| format!("sharing the reference's NCCL unique id: {e}"))?;
    if shared.bytes()[0] != 1 {
        return Err(if why.is_empty() { "rank 0 could not make an NCCL unique id".into() } else { why });
    }
    let id = shared.bytes()[1..].to_vec();
    let (ordinal, rank, n, timeout) = (b.device_ordinal(), b.rank(), b.world_size(), world.op_timeout);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("nccl-ref-init".into())
        .spawn(move || {
            let _ = tx.send(RawNccl::with(mode, ordinal, rank, n, &id, timeout));
        })
        .map_err(|e| format!("starting the reference's init thread: {e}"))?;
    let limit = timeout + Duration::from_secs(30);
    match rx.recv_timeout(limit) {
        Ok(Ok(raw)) => Ok(raw),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("the reference's communicator did not join within {} s (a peer missing?)", limit.as_secs())),
    }
}

/// The NCCL backend's hooks (see the module docs).
pub fn hooks() -> Hooks<NcclBackend> {
    Hooks {
        available: |ranks| {
            let gpus = concord_nccl::probe()?.gpus;
            if gpus < ranks {
                return Err(format!("needs {ranks} GPUs (one per rank), found {gpus}"));
            }
            Ok(())
        },
        prepare,
        version,
        timing: EVENT_TIMING,
        clock: Some(Clock { mark, elapsed, describe: EVENT_TIMING, covers_p2p: false, profile: Some(NcclBackend::profile_progress) }),
        reference: Some(make_reference),
        data: Some(DeviceData { copy_rotated, read }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(opts: &[(&str, &str)]) -> WorldInfo {
        WorldInfo {
            rank: 0,
            world_size: 1,
            store_path: "/nonexistent".into(),
            world_id: "t".into(),
            op_timeout: Duration::from_secs(1),
            options: opts.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn caller_pin_is_read_and_never_shares_a_launching_threads_cpu() {
        assert_eq!(caller_pin(&world(&[]), Some(6), false), Ok(None));
        assert_eq!(caller_pin(&world(&[("caller_pin", "2")]), Some(6), false), Ok(Some(2)));
        assert_eq!(caller_pin(&world(&[("caller_pin", "2"), ("progress_pin", "6")]), Some(6), true), Ok(Some(2)));
        let e = caller_pin(&world(&[("caller_pin", "two")]), None, false).unwrap_err();
        assert!(e.contains("caller_pin=two") && e.contains("CPU number"), "{e}");
        let e = caller_pin(&world(&[("caller_pin", "6")]), Some(6), false).unwrap_err();
        assert!(e.contains("raw_pin=6"), "{e}");
        let e = caller_pin(&world(&[("caller_pin", "6"), ("progress_pin", "6")]), None, false).unwrap_err();
        assert!(e.contains("progress_pin=6"), "{e}");
        let e = caller_pin(&world(&[("caller_pin", "2")]), None, true).unwrap_err();
        assert!(e.contains("raw_thread needs raw_pin"), "{e}");
    }
}
