//! Every `unsafe` block and every `libc` call of the crate lives here: POSIX shared-memory
//! segments and their mappings, raw views of mapped memory, futexes on shared words, peer
//! liveness, and the process-global cleanup registry (SIGTERM / atexit unlinking).
//!
//! # Safety contract of [`Region`]
//! A `Region` is a (pointer, length) pair into a live [`Mapping`]. Whoever creates one MUST keep
//! the mapping alive for as long as the region is used (the backend holds an `Arc` of its world,
//! which owns every mapping). Concurrent access by other ranks is ordered by the collective
//! protocol (futex barriers with SeqCst atomics): no two ranks write the same bytes in the same
//! phase, and nobody reads bytes that another rank writes in the same phase.

use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Once;
use std::time::Duration;

fn cname(name: &str) -> io::Result<CString> {
    CString::new(format!("/{name}")).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in shm name"))
}

/// A shared mapping of a whole POSIX shared-memory segment (`MAP_SHARED | MAP_NORESERVE`).
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// Kept open for the owner's segment (for `fallocate`); -1 otherwise.
    fd: i32,
}

// SAFETY: the mapping is plain shared memory; all access goes through atomics or through
// `Region`s whose use is ordered by the collective protocol (see the module docs).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates segment `name` (which must not exist) of `len` bytes (sparse) and maps it.
    /// `keep_fd`: keep the descriptor for [`Mapping::reserve`].
    pub fn create(name: &str, len: usize, keep_fd: bool) -> io::Result<Mapping> {
        let c = cname(name)?;
        // SAFETY: plain syscalls on a fresh descriptor; errors are checked.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
                return Err(e);
            }
            Self::map(fd, len, keep_fd).inspect_err(|_| {
                libc::shm_unlink(c.as_ptr());
            })
        }
    }

    /// Opens and maps the existing segment `name` (its whole current size).
    pub fn open(name: &str) -> io::Result<Mapping> {
        let c = cname(name)?;
        // SAFETY: plain syscalls; `st` is fully written by a successful fstat.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            Self::map(fd, st.st_size as usize, false)
        }
    }

    unsafe fn map(fd: i32, len: usize, keep_fd: bool) -> io::Result<Mapping> {
        let ptr =
            libc::mmap(std::ptr::null_mut(), len.max(1), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_NORESERVE, fd, 0);
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let fd = if keep_fd {
            fd
        } else {
            libc::close(fd);
            -1
        };
        Ok(Mapping { ptr: ptr as *mut u8, len, fd })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Backs `[off, off + len)` with memory now (`fallocate`), so that a full `/dev/shm` is an
    /// error here rather than a SIGBUS later. Needs a mapping created with `keep_fd`.
    pub fn reserve(&self, off: usize, len: usize) -> io::Result<()> {
        if self.fd < 0 || len == 0 {
            return Ok(());
        }
        // SAFETY: plain syscall on our own descriptor.
        let rc = unsafe { libc::fallocate(self.fd, 0, off as libc::off_t, len as libc::off_t) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Maps the pages of `[off, off + len)` into this process now, writable
    /// (`MADV_POPULATE_WRITE`): one system call instead of one page fault per 4 KiB page on
    /// first touch (about 3x cheaper on the 2-core VM). Only for bytes the owner has backed
    /// ([`Mapping::reserve`]). Best effort: where the kernel lacks it (before Linux 5.14) pages
    /// fault in on first touch as before.
    pub fn populate(&self, off: usize, len: usize) {
        let start = off & !4095;
        let end = off.saturating_add(len).next_multiple_of(4096).min(self.len);
        if end <= start {
            return;
        }
        // SAFETY: madvise on a page-aligned range inside our own live mapping; POPULATE_WRITE
        // only faults pages in (it neither changes contents nor unmaps anything).
        unsafe {
            libc::madvise(self.ptr.add(start) as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE);
        }
    }

    /// The `AtomicU32` at byte offset `off` (4-aligned, in bounds).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.len, "u32 at {off} outside mapping of {} bytes", self.len);
        // SAFETY: in bounds, aligned (the mapping is page-aligned), lives as long as &self.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    /// The `AtomicU64` at byte offset `off` (8-aligned, in bounds).
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len, "u64 at {off} outside mapping of {} bytes", self.len);
        // SAFETY: as above.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// The region `[off, off + len)` of this mapping (bounds-checked).
    pub fn region(&self, off: usize, len: usize) -> Region {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len), "region {off}+{len} outside mapping of {} bytes", self.len);
        // SAFETY: in bounds of the mapping.
        Region { ptr: unsafe { self.ptr.add(off) }, len }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and the descriptor.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len.max(1));
            if self.fd >= 0 {
                libc::close(self.fd);
            }
        }
    }
}

/// Removes segment `name` from `/dev/shm` (mappings stay valid).
pub fn unlink(name: &str) -> io::Result<()> {
    let c = cname(name)?;
    // SAFETY: plain syscall.
    if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes of a live mapping (see the module's safety contract).
#[derive(Clone, Copy, Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: see the module docs; regions are only used while their mapping is alive.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    /// Bytes `[off, off + len)` of this region.
    pub fn sub(&self, off: usize, len: usize) -> Region {
        assert!(off + len <= self.len, "sub-region {off}+{len} of a {}-byte region", self.len);
        // SAFETY: in bounds.
        Region { ptr: unsafe { self.ptr.add(off) }, len }
    }
    /// Copies `src` (same length) into this region (`memmove`, so overlap is fine).
    pub fn copy_from(&self, src: Region) {
        assert_eq!(self.len, src.len, "copy between regions of different sizes");
        if self.len == 0 || self.ptr == src.ptr {
            return;
        }
        // SAFETY: both regions are live and in bounds (module contract).
        unsafe { std::ptr::copy(src.ptr, self.ptr, self.len) }
    }
    pub fn copy_from_bytes(&self, src: &[u8]) {
        assert_eq!(self.len, src.len(), "copy of {} bytes into a {}-byte region", src.len(), self.len);
        // SAFETY: live, in bounds; `src` is ordinary memory that cannot overlap a mapping we write.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr, self.len) }
    }
    /// Like [`Region::copy_from_bytes`], but with non-temporal (cache-bypassing) stores where
    /// the platform has them: for large outputs that nobody reads soon, this avoids the
    /// read-for-ownership traffic of ordinary stores. Call [`store_fence`] after the last one.
    pub fn stream_from_bytes(&self, src: &[u8]) {
        assert_eq!(self.len, src.len(), "copy of {} bytes into a {}-byte region", src.len(), self.len);
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
            let head = (16 - (self.ptr as usize % 16)) % 16;
            if self.len >= head + 16 {
                self.sub(0, head).copy_from_bytes(&src[..head]);
                let body = (self.len - head) / 16;
                // SAFETY: destination in bounds and 16-aligned (head skipped); SSE2 is baseline
                // on x86_64; unaligned loads from the source slice are in bounds.
                unsafe {
                    let d = self.ptr.add(head) as *mut __m128i;
                    let s = src.as_ptr().add(head) as *const __m128i;
                    for i in 0..body {
                        _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
                    }
                }
                let done = head + body * 16;
                self.sub(done, self.len - done).copy_from_bytes(&src[done..]);
                return;
            }
        }
        self.copy_from_bytes(src)
    }
    pub fn copy_to_bytes(&self, dst: &mut [u8]) {
        assert_eq!(self.len, dst.len());
        // SAFETY: as above.
        unsafe { std::ptr::copy(self.ptr, dst.as_mut_ptr(), self.len) }
    }
    /// Runs `f` on the region viewed as `[T]` (length must be a multiple of `size_of::<T>()`,
    /// the pointer aligned). The borrow ends with `f`.
    pub fn with<T: bytemuck::Pod, R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        let (p, n) = self.typed::<T>();
        // SAFETY: live, in bounds, aligned (checked), and Pod has no invalid bit patterns.
        f(unsafe { std::slice::from_raw_parts(p as *const T, n) })
    }
    fn typed<T>(&self) -> (*mut T, usize) {
        let sz = std::mem::size_of::<T>();
        assert!(self.len.is_multiple_of(sz), "{}-byte region is not a whole number of {sz}-byte elements", self.len);
        assert!((self.ptr as usize).is_multiple_of(std::mem::align_of::<T>()), "misaligned region for a {sz}-byte element");
        (self.ptr as *mut T, self.len / sz)
    }
}

/// CPU time of the calling thread (for timings on a loaded machine: time spent descheduled is
/// not counted).
#[cfg(test)]
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Orders earlier non-temporal stores before later stores (a no-op where there are none).
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is baseline on x86_64; sfence has no other effect.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

// ---------------------------------------------------------------------------------------------
// Futexes on shared (non-private) words.

/// Sleeps while `*word == expected`, at most `timeout` (spurious wake-ups possible).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: FUTEX_WAIT (shared) on a valid, aligned u32 with a valid timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, 0usize, 0u32);
    }
}

/// Wakes every waiter on `word` (in any process).
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE (shared) on a valid, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

// ---------------------------------------------------------------------------------------------
// Processes.

pub fn getpid() -> u32 {
    std::process::id()
}

/// False once process `pid` is gone or is a zombie (it has exited but not been reaped).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    // SAFETY: signal 0 only checks existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the last ')' (the command name may contain spaces and parens).
        Ok(s) => !matches!(s.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()), Some('Z' | 'X')),
        Err(_) => true,
    }
}

/// Number of CPUs this process may run on.
pub fn ncpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

// ---------------------------------------------------------------------------------------------
// Cleanup registry: names of segments this process created and has not unlinked yet. The
// SIGTERM handler and an atexit hook unlink them; both only touch this fixed static table with
// atomics and call async-signal-safe `unlink`.

const SLOTS: usize = 512;
const PATH_MAX: usize = 160;

struct Slot {
    /// 0 free, 1 being written, 2 holds a path.
    state: AtomicU8,
    path: std::cell::UnsafeCell<[u8; PATH_MAX]>,
}
// SAFETY: `path` is written only by the thread that moved `state` 0 -> 1, and read only in state 2.
unsafe impl Sync for Slot {}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { state: AtomicU8::new(0), path: std::cell::UnsafeCell::new([0; PATH_MAX]) };
static REGISTRY: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
static mut OLD_TERM: Option<libc::sigaction> = None;

fn shm_path(name: &str) -> Option<[u8; PATH_MAX]> {
    let p = format!("/dev/shm/{name}");
    if p.len() >= PATH_MAX || p.as_bytes().contains(&0) {
        return None;
    }
    let mut buf = [0u8; PATH_MAX];
    buf[..p.len()].copy_from_slice(p.as_bytes());
    Some(buf)
}

/// Records `name` for unlinking on SIGTERM / exit. Best effort: a full table is ignored (the
/// runner's sweep by prefix remains).
pub fn register_cleanup(name: &str) {
    install_cleanup_handlers();
    let Some(buf) = shm_path(name) else { return };
    for s in REGISTRY.iter() {
        if s.state.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: we own the slot in state 1.
            unsafe { *s.path.get() = buf };
            s.state.store(2, Ordering::Release);
            return;
        }
    }
}

/// Forgets `name` (after it was unlinked normally).
pub fn unregister_cleanup(name: &str) {
    let Some(buf) = shm_path(name) else { return };
    for s in REGISTRY.iter() {
        // SAFETY: read only in state 2 (set after the write completed).
        if s.state.load(Ordering::Acquire) == 2
            && unsafe { *s.path.get() } == buf
            && s.state.compare_exchange(2, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            s.state.store(0, Ordering::Release);
            return;
        }
    }
}

fn unlink_all_registered() {
    for s in REGISTRY.iter() {
        if s.state.load(Ordering::Acquire) == 2 {
            // SAFETY: async-signal-safe unlink of a NUL-terminated path.
            unsafe { libc::unlink((*s.path.get()).as_ptr() as *const libc::c_char) };
        }
    }
}

extern "C" fn on_sigterm(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    unlink_all_registered();
    // SAFETY: OLD_TERM is written once before the handler is installed; only async-signal-safe
    // calls follow (sigaction, raise, or the previous handler).
    unsafe {
        let old = *std::ptr::addr_of!(OLD_TERM);
        match old {
            Some(o) if o.sa_sigaction != libc::SIG_DFL && o.sa_sigaction != libc::SIG_IGN => {
                if o.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(o.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(o.sa_sigaction);
                    f(sig);
                }
            }
            Some(o) if o.sa_sigaction == libc::SIG_IGN => {}
            _ => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGTERM, &dfl, std::ptr::null_mut());
                libc::raise(libc::SIGTERM);
            }
        }
    }
}

extern "C" fn on_exit() {
    unlink_all_registered();
}

/// Installs (once per process) the SIGTERM handler (chaining to any previous one) and the atexit
/// hook that unlink every registered segment.
pub fn install_cleanup_handlers() {
    INSTALL.call_once(|| {
        // SAFETY: standard sigaction/atexit installation; OLD_TERM is written before the
        // handler can run.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) == 0 {
                *std::ptr::addr_of_mut!(OLD_TERM) = Some(old);
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigterm as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
            libc::atexit(on_exit);
        }
    });
}
