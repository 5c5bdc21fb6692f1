//! The MPI calls the backend makes, through rsmpi's raw bindings (`mpi::ffi`), each wrapped so
//! that an MPI error code becomes a `Result` (our communicators use `MPI_ERRORS_RETURN`).
//! Every count is checked to fit MPI's `int` first.

use mpi::ffi;
use std::ffi::{c_int, c_void};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, TryLockError};
use std::time::{Duration, Instant};

/// A communicator handle (a pointer in Open MPI), shared between the threads that use it.
#[derive(Clone, Copy, Debug)]
pub struct Comm(pub ffi::MPI_Comm);
// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE; a handle may be used from any thread.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

#[derive(Clone, Copy)]
pub struct Op(ffi::MPI_Op);
unsafe impl Send for Op {}
unsafe impl Sync for Op {}

#[derive(Clone, Copy)]
pub struct Dt(ffi::MPI_Datatype);

/// `true` once MPI is finalised (at process exit). Every MPI call of this module runs under a
/// read lock of it ([`Busy`]) and refuses to start once it is set; the exit handler takes the
/// write lock (within [`FINALIZE_WAIT`]) before it finalises. So no call is in progress when
/// MPI_Finalize runs, and none starts after it: a thread between two calls of one op (a
/// point-to-point thread between its header and its data, a progress thread between the vote
/// and the data) gets a named error for its next call instead of Open MPI's abort of the job
/// ("called after MPI_FINALIZE"). (A count of calls in progress, as before, was 0 between
/// two calls, and the exit handler finalised under the second.)
static FINALIZED: RwLock<bool> = RwLock::new(false);

/// How long the exit handler waits for MPI calls in progress to end before it skips
/// MPI_Finalize (a call stuck on a dead peer would make MPI_Finalize hang; mpirun reports it).
const FINALIZE_WAIT: Duration = Duration::from_secs(1);

/// One MPI call in progress: a read lock of [`FINALIZED`], taken only while MPI is not
/// finalised.
struct Busy {
    _guard: RwLockReadGuard<'static, bool>,
}
impl Busy {
    fn enter() -> Result<Busy, String> {
        let g = FINALIZED.read().unwrap_or_else(|e| e.into_inner());
        if *g {
            return Err("MPI is already finalised (this process is exiting): the call was not made".into());
        }
        Ok(Busy { _guard: g })
    }
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: buf holds MPI_MAX_ERROR_STRING (256) bytes and more.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

fn check(what: &str, code: c_int) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed: {} (MPI error {code})", error_string(code)))
    }
}

/// `n` as an MPI count.
pub fn count(n: usize) -> Result<c_int, String> {
    c_int::try_from(n).map_err(|_| format!("{n} elements do not fit an MPI count (at most {})", c_int::MAX))
}

struct Ops {
    fmin: Op,
    fmax: Op,
    /// Integer ops over 64-bit containers: sum, product, signed min / max, unsigned min / max,
    /// and, or, xor.
    int: [Op; 9],
}
static OPS: OnceLock<Ops> = OnceLock::new();
static INIT: OnceLock<Result<(usize, usize), String>> = OnceLock::new();

/// At exit: finalises MPI once no call of this module is in progress (the write lock of
/// [`FINALIZED`], tried until [`FINALIZE_WAIT`]: a blocking `write()` could hang behind a call
/// stuck on a dead peer), and marks it finalised so that no call starts afterwards.
/// Communicators are freed under the read lock (a progress thread freeing its communicators
/// while the exiting main thread finalised crashed 1 run in 7).
extern "C" fn finalize_at_exit() {
    let until = Instant::now() + FINALIZE_WAIT;
    let mut fin = loop {
        match FINALIZED.try_write() {
            Ok(g) => break g,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
            // A call is stuck (on a peer that is late or gone): MPI_Finalize would hang behind
            // it. Skip it (mpirun reports the rank).
            Err(TryLockError::WouldBlock) => return,
        }
    };
    if *fin {
        return;
    }
    let mut done: c_int = 0;
    // MPI_Finalize is collective: a rank of the job that never finalises (gone, or stuck
    // outside this module) would hold this one forever. A watchdog ends the process instead,
    // naming the step.
    let _ = std::thread::Builder::new().name("concord-mpi-fin".into()).spawn(|| {
        std::thread::sleep(FINALIZE_DEADLINE);
        eprintln!(
            "concord: MPI_Finalize did not return within {FINALIZE_DEADLINE:?} (a rank of the mpirun job never finalised): \
             exiting without it"
        );
        // SAFETY: ends the process at once; nothing of this process runs after it.
        unsafe { libc::_exit(1) }
    });
    // SAFETY: plain MPI state queries and finalize, at process exit, with no call of ours in
    // progress (the write lock).
    unsafe {
        ffi::MPI_Finalized(&mut done);
        if done == 0 {
            ffi::MPI_Finalize();
        }
    }
    *fin = true;
}

/// How long [`finalize_at_exit`] lets `MPI_Finalize` take before the process exits without it.
const FINALIZE_DEADLINE: Duration = Duration::from_secs(10);

/// `a` combined into `b` elementwise over f64 with `f` (MPI user op shape).
unsafe fn combine(a: *mut c_void, b: *mut c_void, len: *mut c_int, f: fn(f64, f64) -> f64) {
    let n = *len as usize;
    let a = std::slice::from_raw_parts(a as *const f64, n);
    let b = std::slice::from_raw_parts_mut(b as *mut f64, n);
    for (x, y) in a.iter().zip(b.iter_mut()) {
        *y = f(*x, *y);
    }
}

/// NaN wins; `-0 < +0` (the declared [`concord_core::NanPolicy::Propagate`]).
pub fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}
pub fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b || (a == b && a.is_sign_positive()) {
        a
    } else {
        b
    }
}
/// `a` combined into `b` elementwise over 64-bit integer containers with `f`.
unsafe fn combine_u64(a: *mut c_void, b: *mut c_void, len: *mut c_int, f: fn(u64, u64) -> u64) {
    let n = *len as usize;
    let a = std::slice::from_raw_parts(a as *const u64, n);
    let b = std::slice::from_raw_parts_mut(b as *mut u64, n);
    for (x, y) in a.iter().zip(b.iter_mut()) {
        *y = f(*x, *y);
    }
}
macro_rules! int_op {
    ($name:ident, $f:expr) => {
        unsafe extern "C" fn $name(a: *mut c_void, b: *mut c_void, len: *mut c_int, _: *mut ffi::MPI_Datatype) {
            combine_u64(a, b, len, $f)
        }
    };
}
int_op!(isum, |x, y| x.wrapping_add(y));
int_op!(iprod, |x, y| x.wrapping_mul(y));
int_op!(smin, |x, y| (x as i64).min(y as i64) as u64);
int_op!(smax, |x, y| (x as i64).max(y as i64) as u64);
int_op!(umin, |x: u64, y| x.min(y));
int_op!(umax, |x: u64, y| x.max(y));
int_op!(iand, |x, y| x & y);
int_op!(ior, |x, y| x | y);
int_op!(ixor, |x, y| x ^ y);

unsafe extern "C" fn fmin_op(a: *mut c_void, b: *mut c_void, len: *mut c_int, _: *mut ffi::MPI_Datatype) {
    combine(a, b, len, fmin)
}
unsafe extern "C" fn fmax_op(a: *mut c_void, b: *mut c_void, len: *mut c_int, _: *mut ffi::MPI_Datatype) {
    combine(a, b, len, fmax)
}

/// Initialises MPI once per process (MPI_THREAD_MULTIPLE), registers MPI_Finalize at exit;
/// returns this process's (rank, size) in MPI_COMM_WORLD.
pub fn init() -> Result<(usize, usize), String> {
    INIT.get_or_init(|| {
        // SAFETY: MPI_Init_thread with null argc / argv is allowed; queried values are plain ints.
        unsafe {
            let mut inited: c_int = 0;
            ffi::MPI_Initialized(&mut inited);
            if inited == 0 {
                let mut provided: c_int = 0;
                check(
                    "MPI_Init_thread",
                    ffi::MPI_Init_thread(std::ptr::null_mut(), std::ptr::null_mut(), ffi::RSMPI_THREAD_MULTIPLE, &mut provided),
                )?;
                if provided < ffi::RSMPI_THREAD_MULTIPLE {
                    return Err(format!(
                        "this MPI library gives thread level {provided}, the backend needs MPI_THREAD_MULTIPLE ({})",
                        ffi::RSMPI_THREAD_MULTIPLE
                    ));
                }
                libc::atexit(finalize_at_exit);
            }
            let (mut r, mut n) = (0, 0);
            check("MPI_Comm_rank", ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut r))?;
            check("MPI_Comm_size", ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut n))?;
            let mut fmin = std::mem::zeroed();
            let mut fmax = std::mem::zeroed();
            check("MPI_Op_create", ffi::MPI_Op_create(Some(fmin_op), 1, &mut fmin))?;
            check("MPI_Op_create", ffi::MPI_Op_create(Some(fmax_op), 1, &mut fmax))?;
            let mut int = [Op(std::mem::zeroed()); 9];
            let fs: [unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype); 9] =
                [isum, iprod, smin, smax, umin, umax, iand, ior, ixor];
            for (slot, f) in int.iter_mut().zip(fs) {
                let mut h = std::mem::zeroed();
                check("MPI_Op_create", ffi::MPI_Op_create(Some(f), 1, &mut h))?;
                *slot = Op(h);
            }
            let _ = OPS.set(Ops { fmin: Op(fmin), fmax: Op(fmax), int });
            Ok((r as usize, n as usize))
        }
    })
    .clone()
}

/// A communicator over world ranks `0..n`, created by those ranks only (MPI_Comm_create_group),
/// with errors returned; plus a duplicate of it for point-to-point traffic.
pub fn world_prefix_comm(n: usize, tag: i32) -> Result<(Comm, Comm), String> {
    let _b = Busy::enter()?;
    // SAFETY: handles are written by MPI; ranks are in range (checked by the caller).
    unsafe {
        let mut wg = std::mem::zeroed();
        check("MPI_Comm_group", ffi::MPI_Comm_group(ffi::RSMPI_COMM_WORLD, &mut wg))?;
        let ranks: Vec<c_int> = (0..n as c_int).collect();
        let mut g = std::mem::zeroed();
        check("MPI_Group_incl", ffi::MPI_Group_incl(wg, count(n)?, ranks.as_ptr(), &mut g))?;
        let mut c = std::mem::zeroed();
        check("MPI_Comm_create_group", ffi::MPI_Comm_create_group(ffi::RSMPI_COMM_WORLD, g, tag, &mut c))?;
        ffi::MPI_Group_free(&mut g);
        ffi::MPI_Group_free(&mut wg);
        finish_comm(Comm(c))
    }
}

/// Errors returned on `c`; a duplicate for point-to-point.
fn finish_comm(c: Comm) -> Result<(Comm, Comm), String> {
    // SAFETY: c is a valid communicator.
    unsafe {
        check("MPI_Comm_set_errhandler", ffi::MPI_Comm_set_errhandler(c.0, ffi::RSMPI_ERRORS_RETURN))?;
        let mut p = std::mem::zeroed();
        check("MPI_Comm_dup", ffi::MPI_Comm_dup(c.0, &mut p))?;
        check("MPI_Comm_set_errhandler", ffi::MPI_Comm_set_errhandler(p, ffi::RSMPI_ERRORS_RETURN))?;
        Ok((c, Comm(p)))
    }
}

/// MPI_Comm_split: members (`key` = position) get `Some`, the others `None`.
pub fn split(c: Comm, pos: Option<usize>) -> Result<Option<(Comm, Comm)>, String> {
    let _b = Busy::enter()?;
    // SAFETY: c is valid; the new handle is written by MPI.
    unsafe {
        let mut nc = std::mem::zeroed();
        let (color, key) = match pos {
            Some(p) => (0, count(p)?),
            None => (ffi::RSMPI_UNDEFINED, 0),
        };
        check("MPI_Comm_split", ffi::MPI_Comm_split(c.0, color, key, &mut nc))?;
        match pos {
            Some(_) => finish_comm(Comm(nc)).map(Some),
            None => Ok(None),
        }
    }
}

/// The largest tag this MPI allows (`MPI_TAG_UB`, read once from `MPI_COMM_WORLD`, where the
/// standard attaches it). It is at least 32,767; Open MPI's `pml/ob1` gives 2^31 - 1, its
/// `pml/ucx` 2^23 - 1 (Trilinos PR #15380 measured that bound with Open MPI 4.1.1).
pub fn tag_ub() -> Result<c_int, String> {
    static UB: OnceLock<Result<c_int, String>> = OnceLock::new();
    UB.get_or_init(|| {
        let _b = Busy::enter()?;
        let mut ptr: *mut c_int = std::ptr::null_mut();
        let mut flag: c_int = 0;
        // SAFETY: for a predefined attribute MPI stores a pointer to its int value in `ptr`.
        let code = unsafe {
            ffi::MPI_Comm_get_attr(
                ffi::RSMPI_COMM_WORLD,
                ffi::MPI_TAG_UB as c_int,
                (&mut ptr as *mut *mut c_int).cast::<c_void>(),
                &mut flag,
            )
        };
        check("MPI_Comm_get_attr(MPI_TAG_UB)", code)?;
        if flag == 0 || ptr.is_null() {
            return Err("MPI_TAG_UB is not attached to MPI_COMM_WORLD".into());
        }
        // SAFETY: MPI owns the int and keeps it for the life of MPI_COMM_WORLD.
        Ok(unsafe { *ptr })
    })
    .clone()
}

/// Frees a communicator no thread uses any more (its `Group`'s last reference is gone); a no-op
/// once MPI is finalised.
pub fn free(c: Comm) {
    if let Ok(_b) = Busy::enter() {
        let mut h = c.0;
        // SAFETY: freeing a communicator this backend created and no longer uses.
        unsafe { ffi::MPI_Comm_free(&mut h) };
    }
}

pub fn bytes() -> Dt {
    // SAFETY: reading an MPI predefined handle after init.
    Dt(unsafe { ffi::RSMPI_UINT8_T })
}
pub fn f64_dt() -> Dt {
    Dt(unsafe { ffi::RSMPI_DOUBLE })
}
pub fn u64_dt() -> Dt {
    // SAFETY: reading an MPI predefined handle after init.
    Dt(unsafe { ffi::RSMPI_UINT64_T })
}

/// The MPI reduction for a reduce op. Floats travel as f64: sums and products are MPI's own,
/// min / max this backend's (the declared NaN / signed-zero order). Integers travel as 64-bit
/// containers (sign- or zero-extended) and every op is this backend's own: Open MPI 4.1's
/// vectorised integer ops saturate 8- and 16-bit sums instead of wrapping
/// (open-mpi/ompi#8045, found here by the differential test) and 4.1.4 misreduces unsigned
/// min (open-mpi/ompi#10648).
pub fn op(r: concord_core::ReduceOp, float: bool, signed: bool) -> Op {
    use concord_core::ReduceOp::*;
    let ops = OPS.get().expect("MPI initialised before any collective");
    if float {
        // SAFETY: reading MPI predefined handles after init.
        return unsafe {
            match r {
                Min => ops.fmin,
                Max => ops.fmax,
                Product => Op(ffi::RSMPI_PROD),
                _ => Op(ffi::RSMPI_SUM),
            }
        };
    }
    ops.int[match r {
        Sum | Avg | PremulSum(_) => 0,
        Product => 1,
        Min if signed => 2,
        Max if signed => 3,
        Min => 4,
        Max => 5,
        BAnd => 6,
        BOr => 7,
        BXor => 8,
    }]
}

/// A buffer pointer MPI accepts: an empty slice's dangling pointer can equal `MPI_IN_PLACE`
/// (`(void *)1` in Open MPI), so zero-length buffers point at a real (unused) byte instead.
static SCRATCH: [u64; 1] = [0];
fn cv(p: *const u8) -> *const c_void {
    if (p as usize) < 4096 {
        SCRATCH.as_ptr().cast()
    } else {
        p.cast()
    }
}
fn mv(p: *mut u8) -> *mut c_void {
    // Never written through when the count is zero, which is the only case it is redirected.
    cv(p) as *mut c_void
}

pub fn barrier(c: Comm) -> Result<(), String> {
    let _b = Busy::enter()?;
    check("MPI_Barrier", unsafe { ffi::MPI_Barrier(c.0) })
}

/// Every rank's `words` (any length), in rank order.
pub fn allgather_words(c: Comm, n: usize, words: &[u64]) -> Result<Vec<Vec<u64>>, String> {
    let _b = Busy::enter()?;
    let mine = words.len() as u64;
    let mut lens = vec![0u64; n];
    // SAFETY: buffers sized for n ranks' counts; element type u64 matches MPI_UINT64_T.
    unsafe {
        check(
            "MPI_Allgather",
            ffi::MPI_Allgather(
                cv((&mine as *const u64).cast()),
                1,
                ffi::RSMPI_UINT64_T,
                mv(lens.as_mut_ptr().cast()),
                1,
                ffi::RSMPI_UINT64_T,
                c.0,
            ),
        )?;
        let counts: Vec<c_int> = lens.iter().map(|&l| count(l as usize)).collect::<Result<_, _>>()?;
        let mut displs = Vec::with_capacity(n);
        let mut total = 0usize;
        for &k in &counts {
            displs.push(count(total)?);
            total += k as usize;
        }
        let mut all = vec![0u64; total];
        check(
            "MPI_Allgatherv",
            ffi::MPI_Allgatherv(
                cv(words.as_ptr().cast()),
                count(words.len())?,
                ffi::RSMPI_UINT64_T,
                mv(all.as_mut_ptr().cast()),
                counts.as_ptr(),
                displs.as_ptr(),
                ffi::RSMPI_UINT64_T,
                c.0,
            ),
        )?;
        let mut out = Vec::with_capacity(n);
        let mut at = 0;
        for &k in &counts {
            out.push(all[at..at + k as usize].to_vec());
            at += k as usize;
        }
        Ok(out)
    }
}

/// MPI_Allreduce (`root: None`) or MPI_Reduce to `root` of `count` elements of `dt`.
pub fn reduce(c: Comm, send: &[u8], recv: &mut [u8], n_elems: usize, dt: Dt, op: Op, root: Option<usize>) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: send and recv hold n_elems elements of dt (checked by the caller).
    unsafe {
        match root {
            None => check("MPI_Allreduce", ffi::MPI_Allreduce(cv(send.as_ptr()), mv(recv.as_mut_ptr()), count(n_elems)?, dt.0, op.0, c.0)),
            Some(r) => {
                check("MPI_Reduce", ffi::MPI_Reduce(cv(send.as_ptr()), mv(recv.as_mut_ptr()), count(n_elems)?, dt.0, op.0, count(r)?, c.0))
            }
        }
    }
}

/// MPI_Reduce_scatter_block: `recv_elems` elements of `dt` per rank.
pub fn reduce_scatter(c: Comm, send: &[u8], recv: &mut [u8], recv_elems: usize, dt: Dt, op: Op) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: send holds n * recv_elems elements, recv recv_elems (checked by the caller).
    unsafe {
        check(
            "MPI_Reduce_scatter_block",
            ffi::MPI_Reduce_scatter_block(cv(send.as_ptr()), mv(recv.as_mut_ptr()), count(recv_elems)?, dt.0, op.0, c.0),
        )
    }
}

/// MPI_Allgather (`root: None`) or MPI_Gather of `send.len()` bytes per rank.
pub fn gather(c: Comm, send: &[u8], recv: &mut [u8], root: Option<usize>) -> Result<(), String> {
    let _b = Busy::enter()?;
    let k = count(send.len())?;
    let u8t = bytes().0;
    // SAFETY: recv holds n * send.len() bytes (checked by the caller).
    unsafe {
        match root {
            None => check("MPI_Allgather", ffi::MPI_Allgather(cv(send.as_ptr()), k, u8t, mv(recv.as_mut_ptr()), k, u8t, c.0)),
            Some(r) => check("MPI_Gather", ffi::MPI_Gather(cv(send.as_ptr()), k, u8t, mv(recv.as_mut_ptr()), k, u8t, count(r)?, c.0)),
        }
    }
}

/// MPI_Scatter of `recv.len()` bytes per rank from `root`'s `send`.
pub fn scatter(c: Comm, send: &[u8], recv: &mut [u8], root: usize) -> Result<(), String> {
    let _b = Busy::enter()?;
    let k = count(recv.len())?;
    let u8t = bytes().0;
    // SAFETY: send holds n * recv.len() bytes on the root (checked by the caller).
    unsafe { check("MPI_Scatter", ffi::MPI_Scatter(cv(send.as_ptr()), k, u8t, mv(recv.as_mut_ptr()), k, u8t, count(root)?, c.0)) }
}

pub fn bcast(c: Comm, buf: &mut [u8], root: usize) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: buf is the same size on every rank (validated across ranks first).
    unsafe { check("MPI_Bcast", ffi::MPI_Bcast(mv(buf.as_mut_ptr()), count(buf.len())?, bytes().0, count(root)?, c.0)) }
}

/// MPI_Alltoallv over bytes; counts and displacements in bytes.
pub fn alltoallv(c: Comm, send: &[u8], sc: &[usize], recv: &mut [u8], rc: &[usize]) -> Result<(), String> {
    let _b = Busy::enter()?;
    let displs = |v: &[usize]| -> Result<Vec<c_int>, String> {
        let mut at = 0;
        v.iter()
            .map(|&k| {
                let d = count(at);
                at += k;
                d
            })
            .collect()
    };
    let (sd, rd) = (displs(sc)?, displs(rc)?);
    let sc: Vec<c_int> = sc.iter().map(|&k| count(k)).collect::<Result<_, _>>()?;
    let rc: Vec<c_int> = rc.iter().map(|&k| count(k)).collect::<Result<_, _>>()?;
    let u8t = bytes().0;
    // SAFETY: send / recv hold the sums of the counts (checked by the caller).
    unsafe {
        check(
            "MPI_Alltoallv",
            ffi::MPI_Alltoallv(cv(send.as_ptr()), sc.as_ptr(), sd.as_ptr(), u8t, mv(recv.as_mut_ptr()), rc.as_ptr(), rd.as_ptr(), u8t, c.0),
        )
    }
}

/// MPI_Sendrecv of bytes: `send` to `dst`, `recv` from `src`, with `tag`.
pub fn sendrecv(c: Comm, send: &[u8], dst: usize, recv: &mut [u8], src: usize, tag: i32) -> Result<(), String> {
    let _b = Busy::enter()?;
    let u8t = bytes().0;
    // SAFETY: both buffers are as long as the counts passed.
    unsafe {
        check(
            "MPI_Sendrecv",
            ffi::MPI_Sendrecv(
                cv(send.as_ptr()),
                count(send.len())?,
                u8t,
                count(dst)?,
                tag,
                mv(recv.as_mut_ptr()),
                count(recv.len())?,
                u8t,
                count(src)?,
                tag,
                c.0,
                ffi::RSMPI_STATUS_IGNORE,
            ),
        )
    }
}

/// Sends `words` to `dst` with `tag` (small control messages).
pub fn send_words(c: Comm, words: &[u64], dst: usize, tag: i32) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: words is a valid slice.
    unsafe { check("MPI_Send", ffi::MPI_Send(cv(words.as_ptr().cast()), count(words.len())?, ffi::RSMPI_UINT64_T, count(dst)?, tag, c.0)) }
}

/// Receives one control message (any length) from `src` with `tag`.
pub fn recv_words(c: Comm, src: usize, tag: i32) -> Result<Vec<u64>, String> {
    let _b = Busy::enter()?;
    // SAFETY: the buffer is sized from the probed message.
    unsafe {
        let mut st: ffi::MPI_Status = std::mem::zeroed();
        check("MPI_Probe", ffi::MPI_Probe(count(src)?, tag, c.0, &mut st))?;
        let mut k: c_int = 0;
        check("MPI_Get_count", ffi::MPI_Get_count(&st, ffi::RSMPI_UINT64_T, &mut k))?;
        let mut w = vec![0u64; k.max(0) as usize];
        check(
            "MPI_Recv",
            ffi::MPI_Recv(mv(w.as_mut_ptr().cast()), k, ffi::RSMPI_UINT64_T, count(src)?, tag, c.0, ffi::RSMPI_STATUS_IGNORE),
        )?;
        Ok(w)
    }
}

/// Synchronous send of bytes: completes once `dst` has started receiving it.
pub fn ssend(c: Comm, data: &[u8], dst: usize, tag: i32) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: data is a valid slice.
    unsafe { check("MPI_Ssend", ffi::MPI_Ssend(cv(data.as_ptr()), count(data.len())?, bytes().0, count(dst)?, tag, c.0)) }
}

pub fn recv_bytes(c: Comm, data: &mut [u8], src: usize, tag: i32) -> Result<(), String> {
    let _b = Busy::enter()?;
    // SAFETY: data is a valid slice of the agreed size.
    unsafe {
        check(
            "MPI_Recv",
            ffi::MPI_Recv(mv(data.as_mut_ptr()), count(data.len())?, bytes().0, count(src)?, tag, c.0, ffi::RSMPI_STATUS_IGNORE),
        )
    }
}

/// The processor name MPI reports for this process (its host).
pub fn processor_name() -> String {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: buf holds more than MPI_MAX_PROCESSOR_NAME bytes.
    unsafe { ffi::MPI_Get_processor_name(buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_call_starts_once_finalised_and_finalising_waits_for_calls_in_progress() {
        // A call in progress holds the read lock: the exit handler cannot finalise under it.
        let b = Busy::enter().unwrap();
        assert!(matches!(FINALIZED.try_write(), Err(TryLockError::WouldBlock)));
        drop(b);
        // Finalised (as the exit handler marks it, under the write lock): a thread between two
        // calls of an op gets a named error for the next one, which never reaches MPI.
        *FINALIZED.write().unwrap() = true;
        // A null handle (never passed to MPI: both calls stop at the flag). Zeroed, not
        // `ptr::null_mut()`: rsmpi's `MPI_Comm` is a pointer on some versions and a newtype
        // around one on others (the unit tests did not compile with the latter).
        // SAFETY: an all-zero MPI_Comm is a null handle, valid as a value.
        let null = || Comm(unsafe { std::mem::zeroed() });
        let r = barrier(null());
        free(null());
        *FINALIZED.write().unwrap() = false;
        let e = r.unwrap_err();
        assert!(e.contains("finalised"), "{e}");
    }
}
