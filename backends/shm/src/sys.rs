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

    /// Opens and maps the existing segment `name` (its whole current size). `keep_fd`: keep the
    /// descriptor (for [`Mapping::lock_byte`] / [`Mapping::byte_locked_elsewhere`]).
    pub fn open(name: &str, keep_fd: bool) -> io::Result<Mapping> {
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
            Self::map(fd, st.st_size as usize, keep_fd)
        }
    }

    fn ofd_lock(&self, cmd: libc::c_int, ty: libc::c_int, byte: u64) -> io::Result<libc::flock> {
        if self.fd < 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment mapped without its descriptor"));
        }
        // SAFETY: a zeroed flock is a valid value; fcntl with F_OFD_* reads / writes it.
        unsafe {
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = ty as libc::c_short;
            fl.l_whence = libc::SEEK_SET as libc::c_short;
            fl.l_start = byte as libc::off_t;
            fl.l_len = 1;
            if libc::fcntl(self.fd, cmd, &mut fl as *mut libc::flock) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(fl)
        }
    }

    /// Takes a write lock on byte `byte` of the segment, owned by this mapping's open file
    /// description (`F_OFD_SETLK`): the kernel drops it when the description is closed — when
    /// the mapping is dropped or the process ends, however it ends. Liveness without pids: no
    /// pid reuse, no pid namespaces (a lock is on the file, seen by every process that maps it).
    pub fn lock_byte(&self, byte: u64) -> io::Result<()> {
        self.ofd_lock(libc::F_OFD_SETLK, libc::F_WRLCK, byte).map(|_| ())
    }

    /// Whether another open file description (another rank's mapping) holds a lock on `byte`.
    pub fn byte_locked_elsewhere(&self, byte: u64) -> io::Result<bool> {
        self.ofd_lock(libc::F_OFD_GETLK, libc::F_WRLCK, byte).map(|fl| fl.l_type != libc::F_UNLCK as libc::c_short)
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
    /// Runs `f` on a *snapshot* of the region viewed as `[T]` (length must be a multiple of
    /// `size_of::<T>()`, the pointer aligned): the bytes are copied through raw pointers into
    /// private memory first (a stack buffer up to 16 KiB), because peers may write the shared
    /// region at any time and a `&[T]` over it would promise Rust that nobody does (issue 15
    /// item 12).
    pub fn with<T: bytemuck::Pod, R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        const WORDS: usize = 2048;
        let (p, n) = self.typed::<T>();
        assert!(std::mem::align_of::<T>() <= 8, "element alignment above 8");
        if self.len <= WORDS * 8 {
            let mut buf = std::mem::MaybeUninit::<[u64; WORDS]>::uninit();
            let dst = buf.as_mut_ptr() as *mut u8;
            // SAFETY: the source is live and in bounds (module contract); the destination is a
            // private 8-aligned buffer of at least `len` bytes; the slice covers exactly the
            // bytes just written, and Pod has no invalid bit patterns.
            unsafe {
                std::ptr::copy_nonoverlapping(p as *const u8, dst, self.len);
                f(std::slice::from_raw_parts(dst as *const T, n))
            }
        } else {
            let mut v: Vec<T> = Vec::with_capacity(n);
            // SAFETY: as above; `set_len` after the `len` bytes (`n` elements) are written.
            unsafe {
                std::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr() as *mut u8, self.len);
                v.set_len(n);
            }
            f(&v)
        }
    }

    /// Fills the region with `byte` (the arena's canary; see `shm_canary`).
    pub fn fill(&self, byte: u8) {
        // SAFETY: live and in bounds (module contract).
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) }
    }

    /// The offset of the first byte that is not `byte`, if any.
    pub fn find_not(&self, byte: u8) -> Option<usize> {
        let mut chunk = [0u8; 4096];
        let mut at = 0;
        while at < self.len {
            let m = chunk.len().min(self.len - at);
            self.sub(at, m).copy_to_bytes(&mut chunk[..m]);
            if let Some(i) = chunk[..m].iter().position(|&b| b != byte) {
                return Some(at + i);
            }
            at += m;
        }
        None
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

/// Ends the process at once with `code` (no destructors, no atexit hooks): an injected death.
pub fn die_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(code) }
}

pub fn getpid() -> u32 {
    std::process::id()
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
    /// 0 free, 1 being written (or unregistered), 2 holds a path, 3 being read.
    state: AtomicU8,
    path: std::cell::UnsafeCell<[u8; PATH_MAX]>,
}
// SAFETY: `path` is written only by the thread that moved `state` 0 -> 1, and read only by the
// thread that moved it 2 -> 1 (unregister) or 2 -> 3 (the clean-up reader).
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

/// Forgets `name` (after it was unlinked normally). A slot is only read by whoever owns it:
/// this function claims it (2 -> 1) before comparing the path, and gives it back (1 -> 2) if
/// the path is another one; it waits out a reader (state 3), which holds a slot for a few
/// hundred bytes' copy.
pub fn unregister_cleanup(name: &str) {
    let Some(buf) = shm_path(name) else { return };
    for s in REGISTRY.iter() {
        loop {
            match s.state.compare_exchange(2, 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // SAFETY: we own the slot in state 1.
                    if unsafe { *s.path.get() } == buf {
                        s.state.store(0, Ordering::Release);
                        return;
                    }
                    s.state.store(2, Ordering::Release);
                    break;
                }
                Err(3) => std::hint::spin_loop(),
                Err(_) => break,
            }
        }
    }
}

/// Calls `f` with every registered path (what the SIGTERM handler and the atexit hook unlink).
/// Each slot is claimed for the read (2 -> 3, back to 2 after), so nobody rewrites it meanwhile;
/// a slot being written or unregistered (state 1) is skipped. Async-signal-safe when `f` is
/// (lock-free atomics only).
fn for_each_registered(mut f: impl FnMut(&[u8; PATH_MAX])) {
    for s in REGISTRY.iter() {
        if s.state.compare_exchange(2, 3, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: we own the slot in state 3.
            f(unsafe { &*s.path.get() });
            s.state.store(2, Ordering::Release);
        }
    }
}

fn unlink_all_registered() {
    for_each_registered(|p| {
        // SAFETY: async-signal-safe unlink of a NUL-terminated path.
        unsafe { libc::unlink(p.as_ptr() as *const libc::c_char) };
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15 item 12: the clean-up reader must only read slots it owns. Two threads register
    /// and unregister their names as fast as they can (reusing the same slots) while a third
    /// reads the table as the SIGTERM handler does: every path read must be one of the two
    /// names, never a mix of both.
    #[test]
    fn the_cleanup_reader_never_sees_a_torn_path() {
        let names = ["concord-unit-reg-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "concord-unit-reg-b"];
        let paths: Vec<[u8; PATH_MAX]> = names.iter().map(|n| shm_path(n).unwrap()).collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = names
            .iter()
            .map(|n| {
                let (n, stop) = (n.to_string(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        register_cleanup(&n);
                        unregister_cleanup(&n);
                    }
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut torn = 0u64;
        let mut reads = 0u64;
        while t0.elapsed() < Duration::from_millis(1500) {
            for_each_registered(|p| {
                reads += 1;
                // Read slowly, byte by byte, as a signal handler interrupted mid-read would.
                let mut copy = [0u8; PATH_MAX];
                for (c, b) in copy.iter_mut().zip(p.iter()) {
                    // SAFETY (test): a plain read of the byte (volatile so it is really re-read).
                    *c = unsafe { std::ptr::read_volatile(b) };
                    std::hint::spin_loop();
                }
                if !paths.contains(&copy) {
                    torn += 1;
                }
            });
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(torn, 0, "{torn} of {reads} paths read by the clean-up reader were torn (a slot rewritten while read)");
    }

    /// Issue 15 item 12: `Region::with` must not hand out a `&[T]` over memory that peers may
    /// write: the closure sees a snapshot, so a write to the region during the closure does not
    /// show through the slice.
    #[test]
    fn with_gives_a_snapshot_not_a_reference_into_shared_memory() {
        let name = format!("concord-unit-with-{}", std::process::id());
        let m = Mapping::create(&name, 4096, false).unwrap();
        unlink(&name).unwrap();
        let r = m.region(0, 16);
        r.copy_from_bytes(&[1u8; 16]);
        r.with::<u32, _>(|s| {
            r.copy_from_bytes(&[2u8; 16]); // what a peer would do
            assert_eq!(s[0], u32::from_le_bytes([1; 4]), "the slice aliases the shared region");
        });
    }
}
