//! The CUDA side: library presence checks, one context + stream per rank, device memory,
//! events and deadline-bounded polling. Everything here goes through cudarc's driver bindings,
//! loaded at run time.
//!
//! Contract: no function here blocks without a deadline on work queued on the stream (a hung
//! NCCL kernel must never hang the host), and nothing panics when the driver is missing — callers
//! MUST check [`driver_present`] before anything else in this module.

use crate::block_cache::BlockCache;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether `libcuda` can be loaded (checked without panicking).
pub fn driver_present() -> bool {
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Formats a driver error with its name.
pub(crate) fn derr(what: &str, e: cu::DriverError) -> String {
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    format!("{what}: {name}")
}

/// Number of visible CUDA devices (respects `CUDA_VISIBLE_DEVICES`). `Ok(0)` when the driver
/// reports no device. The driver MUST be present.
pub fn device_count() -> Result<usize, String> {
    match cu::init() {
        Ok(()) => {}
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
        Err(e) => return Err(derr("cuInit", e)),
    }
    cu::device::get_count().map(|n| n.max(0) as usize).map_err(|e| derr("cuDeviceGetCount", e))
}

/// Polls `f` until it yields `Some`, or until `deadline` (then `None`). Spins briefly first
/// (low latency for short collectives), then sleeps with a growing back-off up to 50 us (a
/// coarser cap overshoots multi-millisecond collectives by up to the cap).
pub(crate) fn poll_until<T>(deadline: Instant, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let mut i: u32 = 0;
    let mut sleep = Duration::from_micros(5);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        i += 1;
        if i < 2000 {
            std::hint::spin_loop();
            if i.is_multiple_of(64) {
                std::thread::yield_now();
            }
        } else {
            std::thread::sleep(sleep.min(deadline.saturating_duration_since(Instant::now())));
            sleep = (sleep * 2).min(Duration::from_micros(50));
        }
    }
}

/// One rank's GPU: the primary context of its device and the one stream every NCCL call,
/// copy and allocation of this rank (and of its subgroups) is ordered on.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: sys::CUstream,
    /// A second stream for host copies (`upload`, `download`, `write`): they synchronise with
    /// the device, not with the collectives queued on `stream`.
    pub copy: sys::CUstream,
    /// Pinned staging for host copies (grown on demand up to [`STAGING_MAX`]; leaked when a copy
    /// times out, since the pending copy may still use it).
    staging: std::sync::Mutex<Option<Pinned>>,
    pub async_alloc: bool,
    pub ordinal: usize,
    /// Stream gates of injected `stream:stall` faults (see `fault`), opened by an abort or drop.
    gates: std::sync::Mutex<Vec<Arc<Gate>>>,
    /// The device's default memory pool (with stream-ordered allocation), trimmed as memory is
    /// freed (see [`TRIM_EVERY`]).
    pool: sys::CUmemoryPool,
    freed_since_trim: std::sync::atomic::AtomicUsize,
    /// Without stream-ordered allocation: frees waiting for an idle device (`cuMemFree` may
    /// synchronise the device, so it never runs while work is queued: see [`Device::reap`]).
    deferred: std::sync::Mutex<Vec<u64>>,
    /// Free completion events for reuse (see [`Device::record`]), destroyed with the device.
    /// On lines of its own, with counts of its own: the progress thread takes one per op (an
    /// event holds the pool, not a `Weak` of the device, whose counts every allocation of the
    /// issuing thread changes).
    events: Arc<EventPool>,
    /// Blocks freed on `stream`, for later allocations on `stream` (see `block_cache`).
    cache: std::sync::Mutex<BlockCache>,
    /// How a reduction of a one-rank communicator on this device that is the identity is
    /// enqueued (see `Launch::local`; backend option `one_rank_copy`): a [`OneRankCopy`] as u8.
    pub one_rank_copy: std::sync::atomic::AtomicU8,
    /// The copy kernel ([`COPY_PTX`]), loaded at init ([`Device::load_copy_kernel`]), never on
    /// an op's path: loading a module may wait for the device, which a stalled stream never
    /// frees (seen: `device_faults::abort_not_behind_a_launch::ws1`, whose op #0 sits behind a
    /// stalled stream, kept the progress thread inside `cuModuleLoadData` until the backstop).
    /// Unset or `None` (it did not load): copies use `cuMemcpyDtoDAsync`.
    copy_fn: std::sync::OnceLock<Option<CopyFn>>,
}

/// How a one-rank identity reduction is enqueued (backend option `one_rank_copy`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum OneRankCopy {
    /// Through NCCL, as on any communicator (`one_rank_copy=0`).
    Off = 0,
    /// `cuMemcpyDtoDAsync` (`one_rank_copy=memcpy`; what NCCL itself does at one rank).
    Memcpy = 1,
    /// A byte-copy kernel launched on the stream for copies up to [`COPY_KERNEL_MAX_BYTES`]
    /// (`one_rank_copy=kernel`, the default); `Memcpy` above that, and when the kernel does not
    /// load.
    Kernel = 2,
}

impl OneRankCopy {
    /// The option's value: `kernel` (default), `memcpy`, or a no (`0`, `false`, `no`, `off`).
    pub fn parse(v: Option<&str>) -> Result<OneRankCopy, String> {
        match v {
            None | Some("kernel") | Some("1") | Some("true") | Some("yes") | Some("on") => Ok(OneRankCopy::Kernel),
            Some("memcpy") => Ok(OneRankCopy::Memcpy),
            Some("0") | Some("false") | Some("no") | Some("off") => Ok(OneRankCopy::Off),
            Some(o) => Err(format!("backend option one_rank_copy={o}: expected kernel, memcpy or 0 (through NCCL)")),
        }
    }
    fn from_u8(v: u8) -> OneRankCopy {
        match v {
            0 => OneRankCopy::Off,
            1 => OneRankCopy::Memcpy,
            _ => OneRankCopy::Kernel,
        }
    }
}

/// A loaded kernel (a handle of the device's primary context, which lives as long as the process).
struct CopyFn(sys::CUfunction);
// SAFETY: a CUfunction may be launched from any thread with its context current.
unsafe impl Send for CopyFn {}
unsafe impl Sync for CopyFn {}

/// The largest one-rank copy the copy kernel makes; larger ones use `cuMemcpyDtoDAsync`. The
/// kernel exists to save the driver's host-side cost of a memcpy (about 4.5 µs per call on
/// 2 × H200), which matters for small ops only; it copies a byte per thread, far below the
/// copy engines' bandwidth on large buffers.
pub const COPY_KERNEL_MAX_BYTES: usize = 1 << 20;

/// `concord_copy_bytes(src, dst, n)`: `dst[i] = src[i]` for `i < n` bytes, a grid-stride loop
/// (PTX, JIT-compiled by the driver when it is loaded at init, see `Device::load_copy_kernel`).
/// NUL-terminated for `cuModuleLoadData`.
const COPY_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64

.visible .entry concord_copy_bytes(
    .param .u64 p_src,
    .param .u64 p_dst,
    .param .u64 p_n
)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b32 %v;
    .reg .b64 %rd<9>;

    ld.param.u64 %rd1, [p_src];
    ld.param.u64 %rd2, [p_dst];
    ld.param.u64 %rd3, [p_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.u8 %v, [%rd7];
    add.u64 %rd8, %rd2, %rd4;
    st.global.u8 [%rd8], %v;
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    ret;
}
\0";

/// A value on cache lines of its own (128 bytes: two lines, as adjacent-line prefetchers
/// pair them). The issuing thread and the progress thread each write their own fields of
/// the progress thread's queue, its tracker and the device on every op; sharing a line, each write would take the line from
/// the other core (and a waiter spinning on `finished` would take it back).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Padded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// Bytes freed between two trims of the memory pool back to [`POOL_KEEP`] (or the pool's
/// release threshold, if larger): the pool's high-water mark is not held for the life of a
/// persistent world (beyond the block cache's [`CACHE_MAX`]).
const TRIM_EVERY: usize = 256 << 20;
/// What a trim leaves reserved in the pool (the working set of ordinary runs).
const POOL_KEEP: usize = 256 << 20;
/// Pinned staging allocated with the device, so that small host copies never allocate pinned
/// memory (an allocation that may wait for the device) while a collective is stuck.
const STAGING_START: usize = 1 << 20;
/// The most pinned staging a device keeps: larger host copies go through it in chunks.
const STAGING_MAX: usize = 64 << 20;
/// The most device memory a [`Device`]'s block cache keeps (see `block_cache`).
const CACHE_MAX: usize = 64 << 20;
/// The largest block the cache keeps: above it an allocation's cost is small next to the op's.
const CACHE_BLOCK_MAX: usize = 4 << 20;
/// How long an allocation off the collectives' stream that ran out of memory waits (polling,
/// never making its stream wait) for the cache's blocks, just freed on the collectives' stream,
/// to be free for it.
const CACHE_FLUSH_WAIT: Duration = Duration::from_millis(100);

/// A host-function gate on the stream: work queued after it waits until `open` (or `until`).
struct Gate {
    open: std::sync::atomic::AtomicBool,
    until: Instant,
}

/// The host function of a [`Gate`]: holds the stream until the gate opens or its bound passes.
/// It makes no CUDA call (not allowed in a host function).
unsafe extern "C" fn gate_fn(p: *mut std::ffi::c_void) {
    // SAFETY: `p` is the `Arc::into_raw` of `Device::stall`, handed over exactly once.
    let g = unsafe { Arc::from_raw(p as *const Gate) };
    while !g.open.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < g.until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

// SAFETY: the stream handle is only used with the context bound (see `bind`), and CUDA streams
// may be used from any thread of the process.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    pub fn new(ordinal: usize) -> Result<Arc<Device>, String> {
        let ctx = CudaContext::new(ordinal).map_err(|e| derr(&format!("creating the context of GPU {ordinal}"), e))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(|e| derr("cuStreamCreate", e))?;
        let copy = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(|e| derr("cuStreamCreate", e))?;
        let async_alloc = ctx.has_async_alloc();
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        if async_alloc {
            // Memory freed on one stream is reused on the other only once that free is done
            // (never by making the allocating stream wait for the other one): a copy must not
            // queue behind a collective through the pool.
            if unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) } != sys::CUresult::CUDA_SUCCESS {
                pool = std::ptr::null_mut();
            } else {
                let mut off: i32 = 0;
                let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
                let _ = unsafe { sys::cuMemPoolSetAttribute(pool, attr, &mut off as *mut i32 as *mut std::ffi::c_void) };
            }
        }
        let dev = Device {
            ctx,
            stream,
            copy,
            staging: std::sync::Mutex::new(None),
            async_alloc,
            ordinal,
            gates: std::sync::Mutex::new(Vec::new()),
            pool,
            freed_since_trim: std::sync::atomic::AtomicUsize::new(0),
            deferred: std::sync::Mutex::new(Vec::new()),
            events: Arc::new(EventPool::default()),
            cache: std::sync::Mutex::new(BlockCache::new(if async_alloc { CACHE_MAX } else { 0 }, CACHE_BLOCK_MAX)),
            one_rank_copy: std::sync::atomic::AtomicU8::new(OneRankCopy::Kernel as u8),
            copy_fn: std::sync::OnceLock::new(),
        };
        *dev.staging.lock().unwrap_or_else(|e| e.into_inner()) = Some(Pinned::new(&dev, STAGING_START)?);
        Ok(Arc::new(dev))
    }

    /// Without stream-ordered allocation: frees the deferred allocations if the device is idle
    /// now (both streams drained), so that `cuMemFree` has nothing to wait for.
    fn reap(&self) {
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_empty() {
            return;
        }
        let idle = |s| Event::record_on(s).and_then(|e| e.query()).unwrap_or(false);
        if idle(self.stream) && idle(self.copy) {
            for p in d.drain(..) {
                unsafe {
                    let _ = cu::free_sync(p);
                }
            }
        }
    }

    /// A free of `bytes` at `ptr` (see [`DevMem`]'s drop).
    fn free(&self, ptr: u64, bytes: usize) {
        if self.bind().is_err() {
            return;
        }
        if self.async_alloc {
            let evicted = self.cache.lock().unwrap_or_else(|e| e.into_inner()).put(ptr, bytes);
            self.free_all_to_pool(evicted);
        } else {
            self.deferred.lock().unwrap_or_else(|e| e.into_inner()).push(ptr);
            self.reap();
        }
    }

    /// `cuMemFreeAsync` on the collectives' stream; trims the pool now and then.
    fn free_to_pool(&self, ptr: u64, bytes: usize) {
        unsafe {
            let _ = cu::free_async(ptr, self.stream);
        }
        let freed = self.freed_since_trim.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed) + bytes;
        if freed >= TRIM_EVERY && !self.pool.is_null() {
            self.freed_since_trim.store(0, std::sync::atomic::Ordering::Relaxed);
            // Never below the pool's release threshold (a bench may keep memory mapped on
            // purpose: `timing::keep_pool_memory`). Releases reserved memory whose frees
            // are done; never waits.
            let mut threshold: u64 = 0;
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            let _ = unsafe { sys::cuMemPoolGetAttribute(self.pool, attr, &mut threshold as *mut u64 as *mut std::ffi::c_void) };
            let keep = (threshold as usize).max(POOL_KEEP);
            let _ = unsafe { sys::cuMemPoolTrimTo(self.pool, keep) };
        }
    }

    /// Allocations served by the block cache and those that were not, since the device was
    /// made (for benchmarks' reports).
    pub fn cache_stats(&self) -> (u64, u64) {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        (c.hits, c.misses)
    }

    /// Stops keeping freed blocks for reuse (backend option `alloc_cache=0`); what was kept goes
    /// back to the pool.
    pub fn disable_cache(&self) {
        let kept = self.cache.lock().unwrap_or_else(|e| e.into_inner()).disable();
        if self.bind().is_ok() {
            self.free_all_to_pool(kept);
        }
    }

    /// Gives every cached block back to the pool (the context bound); `true` when there was one.
    fn flush_cache(&self) -> bool {
        let kept = self.cache.lock().unwrap_or_else(|e| e.into_inner()).drain();
        self.free_all_to_pool(kept)
    }

    /// [`Device::free_to_pool`] of each block; `true` when there was one.
    fn free_all_to_pool(&self, blocks: Vec<(u64, usize)>) -> bool {
        let any = !blocks.is_empty();
        for (p, n) in blocks {
            self.free_to_pool(p, n);
        }
        any
    }

    /// Allocates `bytes` for a host copy, ordered on the copy stream (see [`Device::copy_htod`]).
    pub fn alloc_for_copy(self: &Arc<Self>, bytes: usize) -> Result<DevMem, String> {
        self.alloc_on(self.copy, bytes)
    }

    /// Host → device on the copy stream through pinned staging, after `after` (an event on the
    /// collectives' stream) when given; waits until `deadline`. `Ok(false)`: still pending at
    /// the deadline (the staging is then leaked to the pending copy; the caller MUST leak `dst`
    /// too). Never blocks in the driver: the copy is from pinned memory.
    pub fn copy_htod(&self, dst: u64, src: &[u8], after: Option<&Event>, deadline: Instant) -> Result<bool, String> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ev) = after {
            unsafe { cu::stream::wait_event(self.copy, ev.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
                .map_err(|e| derr("cuStreamWaitEvent", e))?;
        }
        // In chunks of at most the staging's cap; each is waited for before the staging is
        // refilled. Even with nothing to copy the wait below runs: it orders `dst`'s
        // allocation on the copy stream before any use on the collectives' stream.
        let mut off = 0;
        loop {
            let n = (src.len() - off).min(STAGING_MAX);
            let pinned = self.staging_for(&mut staging, n)?;
            pinned.as_mut_slice()[..n].copy_from_slice(&src[off..off + n]);
            if n > 0 {
                unsafe { cu::memcpy_htod_async(dst + off as u64, &pinned.as_slice()[..n], self.copy) }
                    .map_err(|e| derr("cuMemcpyHtoDAsync", e))?;
            }
            if !self.finish_copy(&mut staging, deadline)? {
                return Ok(false);
            }
            off += n;
            if off >= src.len() {
                return Ok(true);
            }
        }
    }

    /// Device → host on the copy stream through pinned staging (in chunks, see
    /// [`Device::copy_htod`]); waits until `deadline`. `Ok(false)`: still pending at the
    /// deadline (see [`Device::copy_htod`]; the caller MUST keep the source alive).
    pub fn copy_dtoh(&self, dst: &mut [u8], src: u64, deadline: Instant) -> Result<bool, String> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        let mut off = 0;
        while off < dst.len() {
            let n = (dst.len() - off).min(STAGING_MAX);
            let pinned = self.staging_for(&mut staging, n)?;
            unsafe { cu::memcpy_dtoh_async(&mut pinned.as_mut_slice()[..n], src + off as u64, self.copy) }
                .map_err(|e| derr("cuMemcpyDtoHAsync", e))?;
            if !self.finish_copy(&mut staging, deadline)? {
                return Ok(false);
            }
            let pinned = staging.as_ref().expect("kept by finish_copy");
            dst[off..off + n].copy_from_slice(&pinned.as_slice()[..n]);
            off += n;
        }
        Ok(true)
    }

    fn staging_for<'a>(&self, staging: &'a mut Option<Pinned>, len: usize) -> Result<&'a mut Pinned, String> {
        if staging.as_ref().is_none_or(|p| p.len < len) {
            *staging = None;
            *staging = Some(Pinned::new(self, len.next_power_of_two().clamp(4096, STAGING_MAX.max(len)))?);
        }
        Ok(staging.as_mut().expect("set above"))
    }

    /// Waits for the copy stream until `deadline`; on deadline leaks the staging.
    fn finish_copy(&self, staging: &mut Option<Pinned>, deadline: Instant) -> Result<bool, String> {
        let ev = Event::record_on(self.copy)?;
        let done = ev.wait_until(deadline)?;
        if !done {
            if let Some(p) = staging.take() {
                std::mem::forget(p);
            }
        }
        Ok(done)
    }

    /// Fault injection: stalls the stream here (work queued after this waits) until
    /// [`Device::release_gates`] or `max` from now.
    pub fn stall(&self, max: Duration) -> Result<(), String> {
        let g = Arc::new(Gate { open: std::sync::atomic::AtomicBool::new(false), until: Instant::now() + max });
        self.gates.lock().unwrap_or_else(|e| e.into_inner()).push(g.clone());
        let raw = Arc::into_raw(g) as *mut std::ffi::c_void;
        let r = unsafe { sys::cuLaunchHostFunc(self.stream, Some(gate_fn), raw) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: not handed to the driver: take the reference back.
            drop(unsafe { Arc::from_raw(raw as *const Gate) });
            return Err(format!("cuLaunchHostFunc: {r:?}"));
        }
        Ok(())
    }

    /// Opens every stream gate of injected faults (an abort or teardown ends the stall).
    pub fn release_gates(&self) {
        for g in self.gates.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            g.open.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Makes this device's context current on the calling thread (needed on every thread).
    pub fn bind(&self) -> Result<(), String> {
        self.ctx.bind_to_thread().map_err(|e| derr("binding the CUDA context to this thread", e))
    }

    /// Fault injection (`alloc_output:fail`): a size no allocation on this device can get,
    /// twice its total memory (`cuMemGetInfo`).
    pub fn beyond_capacity(&self) -> Result<usize, String> {
        self.bind()?;
        let (_, total) = cu::mem_get_info().map_err(|e| derr("cuMemGetInfo", e))?;
        Ok(total.saturating_mul(2))
    }

    /// Allocates `bytes` (at least 1, so every buffer has a distinct address), stream-ordered.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevMem, String> {
        self.alloc_on(self.stream, bytes)
    }

    /// Allocates `bytes` (at least 1) ordered on `stream` (with memory pools; else synchronous).
    pub(crate) fn alloc_on(self: &Arc<Self>, stream: sys::CUstream, bytes: usize) -> Result<DevMem, String> {
        self.bind()?;
        let n = bytes.max(1);
        // Only an allocation ordered on the collectives' stream may reuse a block freed there.
        if self.async_alloc && stream == self.stream {
            if let Some(ptr) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).take(n) {
                return Ok(DevMem { dev: self.clone(), ptr, bytes: n });
            }
        }
        let raw = || unsafe {
            if self.async_alloc {
                cu::malloc_async(stream, n)
            } else {
                cu::malloc_sync(n)
            }
        };
        let ptr = match raw() {
            // Out of memory with blocks kept: they go back to the pool, and it is tried again.
            // Freed on the collectives' stream, they serve another stream only once those
            // frees are done: that is waited for (bounded; the stream itself never waits).
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY && self.flush_cache() => {
                if stream != self.stream {
                    if let Ok(ev) = Event::record_on(self.stream) {
                        let _ = ev.wait_until(Instant::now() + CACHE_FLUSH_WAIT);
                    }
                }
                raw()
            }
            r => r,
        }
        .map_err(|e| derr(&format!("allocating {n} bytes on GPU {}", self.ordinal), e))?;
        if !self.async_alloc {
            self.reap();
        }
        Ok(DevMem { dev: self.clone(), ptr, bytes: n })
    }

    /// Records an event on the stream.
    /// A completion event recorded on the collectives' stream now; reuses a free one of this
    /// device (creating and destroying one per launched op cost about a microsecond of the
    /// progress thread's time per op).
    pub fn record(self: &Arc<Self>) -> Result<Event, String> {
        self.record_at(self.stream)
    }

    /// [`Device::record`] on another stream of this device (a direction's).
    pub fn record_at(self: &Arc<Self>, stream: sys::CUstream) -> Result<Event, String> {
        let free = self.events.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let raw = match free {
            Some(e) => e as sys::CUevent,
            None => cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| derr("cuEventCreate", e))?,
        };
        let ev = Event(raw, Some(self.events.clone()));
        unsafe { cu::event::record(ev.0, stream) }.map_err(|e| derr("cuEventRecord", e))?;
        Ok(ev)
    }

    /// Waits until everything queued on the stream so far is done, or until `deadline`:
    /// `Ok(true)` done, `Ok(false)` deadline passed.
    pub fn sync_until(&self, deadline: Instant) -> Result<bool, String> {
        let ev = Event::record_on(self.stream)?;
        ev.wait_until(deadline)
    }

    /// How one-rank identity reductions are enqueued on this device (option `one_rank_copy`).
    pub fn one_rank_copy(&self) -> OneRankCopy {
        OneRankCopy::from_u8(self.one_rank_copy.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Queues a device-to-device copy of `bytes` on `stream` (a one-rank identity reduction:
    /// see `Launch::local`): the copy kernel, or `cuMemcpyDtoDAsync` (option
    /// `one_rank_copy=memcpy`, or a kernel that did not load). The context must be current.
    pub fn copy_on(&self, stream: sys::CUstream, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        if self.one_rank_copy() == OneRankCopy::Kernel && bytes <= COPY_KERNEL_MAX_BYTES {
            if let Some(f) = self.copy_fn.get().and_then(|f| f.as_ref()).map(|f| f.0) {
                const THREADS: usize = 256;
                let blocks = bytes.div_ceil(THREADS).clamp(1, 1024) as u32;
                let (mut s, mut d, mut n) = (src, dst, bytes as u64);
                let mut params = [
                    &mut s as *mut u64 as *mut std::ffi::c_void,
                    &mut d as *mut u64 as *mut std::ffi::c_void,
                    &mut n as *mut u64 as *mut std::ffi::c_void,
                ];
                // SAFETY: the kernel takes three u64 parameters (src, dst, n), pointed to by
                // `params` for the call; src / dst are live device buffers of `bytes` bytes.
                return unsafe { cu::launch_kernel(f, (blocks, 1, 1), (THREADS as u32, 1, 1), 0, stream, &mut params) }
                    .map_err(|e| derr("cuLaunchKernel (one-rank copy)", e));
            }
        }
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream) }.map_err(|e| derr("cuMemcpyDtoDAsync", e))
    }

    /// Loads the copy kernel of one-rank copies (at init, before any op: see `copy_fn`); a
    /// kernel that does not load leaves a warning, and copies use `cuMemcpyDtoDAsync`. Binds
    /// the device's context.
    pub fn load_copy_kernel(&self) {
        if self.bind().is_err() {
            return;
        }
        self.copy_fn.get_or_init(|| {
            // SAFETY: COPY_PTX is NUL-terminated PTX; the module stays loaded for the process.
            let loaded = unsafe {
                cu::module::load_data(COPY_PTX.as_ptr() as *const std::ffi::c_void)
                    .and_then(|m| cu::module::get_function(m, std::ffi::CString::new("concord_copy_bytes").expect("no NUL in the name")))
            };
            match loaded {
                Ok(f) => Some(CopyFn(f)),
                Err(e) => {
                    eprintln!(
                        "concord-nccl: warning: GPU {}: the one-rank copy kernel did not load ({}); one-rank copies use cuMemcpyDtoDAsync",
                        self.ordinal,
                        derr("cuModuleLoadData", e)
                    );
                    None
                }
            }
        });
    }

    /// Queues a host-to-device copy on the collectives' stream. `src` MUST be pinned (a
    /// pageable copy may wait for the stream in the driver, without a deadline): the progress
    /// thread's header staging.
    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<(), String> {
        if src.is_empty() {
            return Ok(());
        }
        unsafe { cu::memcpy_htod_async(dst, src, self.stream) }.map_err(|e| derr("cuMemcpyHtoDAsync", e))
    }

    /// Queues a device-to-host copy into pinned memory (truly asynchronous).
    pub fn dtoh_pinned(&self, dst: &mut [u8], src: u64) -> Result<(), String> {
        if dst.is_empty() {
            return Ok(());
        }
        unsafe { cu::memcpy_dtoh_async(dst, src, self.stream) }.map_err(|e| derr("cuMemcpyDtoHAsync", e))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.release_gates();
        // Later drops of its events destroy them (see `EventPool`); these go below.
        let pooled = {
            let mut free = self.events.free.lock().unwrap_or_else(|e| e.into_inner());
            self.events.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            std::mem::take(&mut *free)
        };
        if self.bind().is_ok() {
            // Deferred frees: only on an idle device (else left to the process's end).
            let pending = !self.deferred.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
            if pending && matches!(self.sync_until(Instant::now() + Duration::from_millis(200)), Ok(true)) {
                self.reap();
            }
            self.flush_cache();
            unsafe {
                let _ = cu::stream::destroy(self.stream);
                let _ = cu::stream::destroy(self.copy);
            }
            for e in pooled {
                unsafe {
                    let _ = cu::event::destroy(e as sys::CUevent);
                }
            }
        }
    }
}

/// A CUDA event; destroyed on drop (the driver releases it once complete), or, for the
/// completion events of [`Device::record`], given back to its device's pool for reuse.
pub(crate) struct Event(pub sys::CUevent, Option<Arc<EventPool>>);

/// A device's free completion events (see [`Device::record`]). Closed when the device goes
/// (its events destroyed then); an event dropped after that is destroyed at once.
#[derive(Default)]
pub(crate) struct EventPool {
    /// Free events (raw handles).
    free: Padded<std::sync::Mutex<Vec<usize>>>,
    closed: std::sync::atomic::AtomicBool,
}
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

/// The most free completion events a [`Device`] keeps for reuse.
const EVENT_POOL_MAX: usize = 4096;

impl Event {
    /// An event of the caller's own (never pooled).
    pub(crate) fn owned(ev: sys::CUevent) -> Event {
        Event(ev, None)
    }

    /// A completion event (no timing) created and recorded on `stream` now.
    pub(crate) fn record_on(stream: sys::CUstream) -> Result<Event, String> {
        let ev = Event(cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| derr("cuEventCreate", e))?, None);
        unsafe { cu::event::record(ev.0, stream) }.map_err(|e| derr("cuEventRecord", e))?;
        Ok(ev)
    }

    /// `Ok(true)` complete, `Ok(false)` pending.
    pub fn query(&self) -> Result<bool, String> {
        match unsafe { cu::event::query(self.0) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(derr("cuEventQuery", e)),
        }
    }

    pub fn wait_until(&self, deadline: Instant) -> Result<bool, String> {
        match poll_until(deadline, || match self.query() {
            Ok(false) => None,
            other => Some(other),
        }) {
            Some(r) => r,
            None => Ok(false),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(p) = &self.1 {
            let mut pool = p.free.lock().unwrap_or_else(|e| e.into_inner());
            // `closed` is raised under this lock by the device's drop, before it destroys
            // what the pool holds.
            if !p.closed.load(std::sync::atomic::Ordering::SeqCst) && pool.len() < EVENT_POOL_MAX {
                pool.push(self.0 as usize);
                return;
            }
        }
        unsafe {
            let _ = cu::event::destroy(self.0);
        }
    }
}

/// Device memory, freed when the last handle goes: stream-ordered on the collectives' stream
/// (after every op enqueued so far, so a job may drop its buffers once its calls are
/// enqueued) — kept in the device's block cache for a later allocation on that stream, or
/// given back to the pool; without stream-ordered allocation, deferred until the device is
/// idle.
pub(crate) struct DevMem {
    pub dev: Arc<Device>,
    pub ptr: u64,
    bytes: usize,
}

impl DevMem {
    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        self.dev.free(self.ptr, self.bytes);
    }
}

/// Pinned (page-locked) host memory, for truly asynchronous device-to-host copies.
pub(crate) struct Pinned {
    ptr: *mut u8,
    len: usize,
}
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(dev: &Device, len: usize) -> Result<Pinned, String> {
        dev.bind()?;
        let ptr = unsafe { cu::malloc_host(len.max(1), 0) }.map_err(|e| derr("cuMemHostAlloc", e))? as *mut u8;
        Ok(Pinned { ptr, len })
    }
    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Pinned {
    /// Never frees this memory (`cuMemFreeHost` synchronises with the device, so freeing while
    /// a kernel that never ends is queued would block without a deadline; a copy into it may
    /// also still be queued): left to the process's end.
    pub fn leak(&mut self) {
        self.ptr = std::ptr::null_mut();
        self.len = 0;
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        unsafe {
            let _ = cu::free_host(self.ptr as *mut _);
        }
    }
}
