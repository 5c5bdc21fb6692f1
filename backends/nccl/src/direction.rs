//! The NCCL side of point-to-point ([`crate::p2p`]'s [`Wire`]): one two-rank NCCL communicator
//! per direction `src -> dst` of a communicator (world or subgroup), each on a CUDA stream of its
//! own, as PyTorch's ProcessGroupNCCL does for its point-to-point ops.
//!
//! Contracts:
//! * A direction is set up lazily, when its first op becomes the head of its queue, by both of
//!   its ranks: `src` publishes a fresh `ncclGetUniqueId` in the world's store under
//!   `<communicator key>/<src>-<dst>` (the key names the parent communicator: the world's
//!   unique id, then `/g<seq>` per split), `dst` polls the store for it; both then run a
//!   non-blocking `ncclCommInitRankConfig` (`src` is rank 0), polled, never waited for.
//! * When the parent launches on a blocking twin (see **Fast launch** in the crate docs), so
//!   does a direction: right after its init (both ranks are there: the init is collective), a
//!   thread of its own splits the direction's blocking twin and connects it (a send and a
//!   receive of 8 bytes each way, `Comm::make_p2p_twin`), bounded by an op timeout; the
//!   progress thread only looks at its result. Every later group of the direction (header
//!   swaps, data) runs on the twin: about 6 us a launch instead of about 60 (2 x H200; a
//!   sendrecv in the bench went from 110–170 to 42–55 us). A launch still inside NCCL an op
//!   timeout after it started is ended by the twin watchdog (`Comm::watch_twin`); a direction
//!   given up while its twin connects is aborted (from a thread of its own), which ends the
//!   thread's call. At most [`MAX_IN_FLIGHT`] data ops of a direction are launched on its twin
//!   and not complete: the next waits, parked, instead of entering a blocking launch that a
//!   full queue of pending kernels would hold (sends no receive has met yet).
//! * A direction communicator is a child of its parent ([`Comm::adopt`]): an abort of the
//!   parent (a timeout, a fault, a drop) aborts it, so its ops in flight end and fail; its
//!   teardown (finalize / destroy) is a job of the progress thread like the parent's.
//! * Only the progress thread calls this module (every NCCL call here enqueues work or looks).
//!   A launch waits (bounded by the op deadline) only for NCCL to accept the group, which on
//!   the first use of the direction includes its connection to the peer.
//! * An op's data does not wait on the device for anything on the shared stream (MPI's rule:
//!   the buffers of a pending op are not the caller's, and an op's result is final only after
//!   its wait, so a send of a collective's output comes after that collective's wait). Making
//!   it wait would deadlock legal programs: `all_reduce; isend(1)` on rank 0 against
//!   `irecv(0); wait; all_reduce` on rank 1 (rank 0's all_reduce needs rank 1's, which comes
//!   after the receive). Nothing on the shared stream waits for a direction's stream either.
//!   The device memory of a launched op is kept until its event has completed (its frees are
//!   ordered on the shared stream, which does not wait for this one).

use crate::comm::{Comm, LaunchError, PendingInit, TeardownVia};
use crate::cuda::{derr, DevMem, Device, Event, Pinned};
use crate::dtype::move_type;
use crate::p2p::{Dir, Poll, Wire};
use crate::worker::{check, Launched};
use concord_core::DType;
use concord_store::Store;
use cudarc::driver::result as cu;
use cudarc::driver::sys as cusys;
use cudarc::nccl::sys as nccl;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a rank waiting for its peer's unique id looks at the store.
const STORE_POLL: Duration = Duration::from_millis(2);

/// The data half of a send or receive.
pub(crate) struct Data {
    pub send: bool,
    pub ptr: u64,
    pub n: usize,
    pub dtype: DType,
    /// Device memory the op reads or writes, kept until its data has moved.
    pub keep: Vec<Arc<DevMem>>,
}

/// A direction being set up.
pub(crate) struct Connecting {
    dir: Dir,
    state: ConnState,
}

enum ConnState {
    /// `dst`: waiting for `src`'s unique id in the store.
    WaitId {
        key: String,
        next: Instant,
    },
    Init(PendingInit),
    /// The direction's blocking twin being made and connected by a thread of its own
    /// ([`Comm::make_p2p_twin`]), which sets `done`; the progress thread only looks.
    Twin {
        comm: Arc<Comm>,
        done: Arc<std::sync::Mutex<Option<Result<(), String>>>>,
    },
}

impl Drop for Connecting {
    fn drop(&mut self) {
        // Given up while the twin connects (the op's deadline, the communicator's abort): the
        // abort ends the twin thread's blocking call, and that thread ends by itself (detached).
        // The abort runs on a thread of its own too: it may wait (bounded) for the twin thread's
        // NCCL call to let go of the communicator, and the progress thread never waits. Without
        // that thread, the communicator dies with its parent's abort or teardown.
        if let ConnState::Twin { comm, done } = &self.state {
            if done.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                let (comm, dir) = (comm.clone(), self.dir);
                let why = format!("direction {} -> {}: given up while its blocking twin connected", dir.src, dir.dst);
                let _ = std::thread::Builder::new().name("nccl-p2p-twin-abort".into()).spawn(move || comm.abort(why));
            }
        }
    }
}

/// A ready direction: its communicator, stream, header staging and the memory of launched ops.
pub(crate) struct Link {
    comm: Arc<Comm>,
    /// The peer's rank in the two-rank communicator.
    peer: usize,
    dev_send: Option<DevMem>,
    dev_recv: Option<DevMem>,
    /// Its slot in the wire's pinned header staging ([`NcclWire::staging`]).
    slot: usize,
    /// Launched ops' events and memory, released once complete.
    retiring: Vec<(Arc<Event>, Vec<Arc<DevMem>>)>,
    next_check: Instant,
}

impl Link {
    fn stream(&self) -> cusys::CUstream {
        self.comm.stream as cusys::CUstream
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Memory the direction's stream may still use is never freed (the frees would be
        // ordered on the shared stream, not on this one): left to the process's end.
        let idle = Event::record_on(self.stream()).and_then(|e| e.query()).unwrap_or(false);
        // Work still on the stream (a timed-out or killed op): the communicator is aborted
        // now, before the queued teardown job, so a group NCCL was still accepting cannot land
        // later in a buffer its caller got back with a failed wait.
        if !idle && self.comm.aborted().is_none() {
            self.comm.abort("its direction was dropped with work in flight".into());
        }
        for (ev, keep) in self.retiring.drain(..) {
            if !idle && !matches!(ev.query(), Ok(true)) {
                std::mem::forget(keep);
            }
        }
        if !idle {
            std::mem::forget(self.dev_send.take());
            std::mem::forget(self.dev_recv.take());
        }
    }
}

/// A header swap in flight: NCCL still accepting its group (the first one of a direction
/// connects to the peer), then the event after its copy back to the host.
pub(crate) struct Swap {
    ev: Option<Event>,
    bytes: usize,
}

/// Data sends / receives of one direction launched on its blocking twin and not complete, at
/// most: past that the next one waits, parked (the progress thread free), instead of entering
/// NCCL, whose launch blocks once the stream's queue of pending kernels is full (about a
/// thousand sends that no receive has met yet), holding the progress thread until the peer
/// drains it, which may need this very thread.
pub(crate) const MAX_IN_FLIGHT: usize = 256;

/// A data send / receive NCCL is still accepting (or, on a twin with [`MAX_IN_FLIGHT`] ops
/// pending, not yet launched: `waiting`); its memory, kept (leaked if it is abandoned: the
/// group may still be enqueued).
pub(crate) struct Launching {
    keep: Option<Vec<Arc<DevMem>>>,
    /// `(send, ptr, NCCL type, count)` of an op waiting for room on its direction.
    waiting: Option<(bool, u64, nccl::ncclDataType_t, usize)>,
}

impl Drop for Launching {
    fn drop(&mut self) {
        // Never launched (still waiting for room): nothing on the device uses the memory.
        if self.waiting.is_some() {
            return;
        }
        if let Some(k) = self.keep.take() {
            std::mem::forget(k);
        }
    }
}

/// The point-to-point transport of one communicator of this rank.
pub(crate) struct NcclWire {
    pub parent: Arc<Comm>,
    pub store: Option<Arc<Store>>,
    /// Store key prefix naming the parent communicator.
    pub key: String,
    pub me: usize,
    /// Bytes of a validation header of the parent's size.
    pub hdr_bytes: usize,
    pub via: Arc<TeardownVia>,
    /// The op deadline: bounds a direction's twin connection and every blocking launch on it.
    pub op_timeout: Duration,
    /// Pinned header staging for every direction this rank may have (send + receive halves
    /// of [`NcclWire::hdr_bytes`] per slot, [`NcclWire::slot`]), allocated with the
    /// communicator: no pinned allocation (which may wait for the device) while ops run.
    pub staging: Pinned,
    /// The communicator's host board, where a rank marks the directions it gave up on
    /// ([`Wire::give_up`]); `None`: ranks on several hosts or `header_board=0` (a peer's give-up
    /// is then seen only through this rank's own deadline).
    pub board: Option<Arc<crate::board::Board>>,
}

/// Bytes of pinned header staging a communicator of `ws` ranks needs (see [`NcclWire::staging`]).
pub(crate) fn staging_bytes(ws: usize, hdr_bytes: usize) -> usize {
    2 * ws * 2 * hdr_bytes
}

impl NcclWire {
    fn dev(&self) -> &Arc<Device> {
        &self.parent.dev
    }

    /// The staging slot of `dir` at this rank: its sends by destination, then its receives by
    /// source.
    fn slot(&self, dir: Dir) -> usize {
        if dir.src == self.me {
            dir.dst
        } else {
            self.parent.nranks + dir.src
        }
    }

    /// The send and receive halves of `link`'s staging.
    fn halves(&mut self, link: &Link) -> (&mut [u8], &mut [u8]) {
        let hb = self.hdr_bytes;
        let at = link.slot * 2 * hb;
        self.staging.as_mut_slice()[at..at + 2 * hb].split_at_mut(hb)
    }

    fn key_of(&self, dir: Dir) -> String {
        format!("{}/{}-{}", self.key, dir.src, dir.dst)
    }

    /// Starts this rank's `ncclCommInitRankConfig` of a direction (`rank` 0: its source) with
    /// the unique id `bytes`.
    fn init(&self, rank: usize, bytes: &[u8]) -> Result<PendingInit, String> {
        if bytes.len() != 128 {
            return Err(format!("a direction's unique id in the store has {} bytes, expected 128", bytes.len()));
        }
        let mut id = nccl::ncclUniqueId { internal: [0; 128] };
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = *s as _;
        }
        Comm::start_init(self.dev().clone(), rank, id, self.parent.lib_version)
    }

    /// A direction communicator just made: torn down through the progress thread, aborted
    /// with its parent.
    fn adopt(&self, comm: Comm) -> Arc<Comm> {
        let via = self.via.clone();
        comm.set_teardown(Box::new(move |t| via(t)));
        let comm = Arc::new(comm);
        self.parent.adopt(&comm);
        comm
    }

    /// Runs `calls` as one group on `link`'s communicator: on its blocking twin when it has
    /// one (enqueued when this returns: `Ok(false)`; a call still inside NCCL an op timeout
    /// after it started is ended by the twin watchdog), else without waiting (`Ok(true)`: poll
    /// [`Comm::group_ready`]).
    fn enqueue(
        &self,
        link: &Link,
        calls: impl FnOnce(nccl::ncclComm_t, nccl::cudaStream_t) -> Result<(), (String, nccl::ncclResult_t)>,
    ) -> Result<bool, String> {
        if link.comm.has_twin() {
            link.comm.launch(Instant::now() + self.op_timeout, false, &[], |c, st, _| calls(c, st)).map_err(Self::launch_err)?;
            return Ok(false);
        }
        link.comm.launch_nowait(calls).map_err(Self::launch_err)
    }

    fn link(&self, dir: Dir, comm: Arc<Comm>) -> Result<Link, String> {
        let dev = self.dev();
        let stream = comm.stream as cusys::CUstream;
        Ok(Link {
            peer: 1 - comm.rank,
            dev_send: Some(dev.alloc_on(stream, self.hdr_bytes)?),
            dev_recv: Some(dev.alloc_on(stream, self.hdr_bytes)?),
            slot: self.slot(dir),
            retiring: Vec::new(),
            next_check: Instant::now(),
            comm,
        })
    }

    /// Queues the copy of the peer's header back to the host, after the swap; its event.
    fn copy_back(&mut self, link: &Link, n: usize) -> Result<Event, String> {
        let stream = link.stream();
        let recv = link.dev_recv.as_ref().expect("live").ptr;
        let host = &mut self.halves(link).1[..n];
        unsafe { cu::memcpy_dtoh_async(host, recv, stream) }.map_err(|e| derr("cuMemcpyDtoHAsync", e))?;
        self.dev().record_at(stream)
    }

    fn launch_err(e: LaunchError) -> String {
        match e {
            LaunchError::Aborted(why) => format!("the direction's communicator was aborted ({why})"),
            LaunchError::Nccl(m) => m,
            LaunchError::Timeout => "NCCL did not accept the op before the op deadline (the peer never connected?)".into(),
        }
    }

    /// A look at the link's health: `Some(reason)` once it was aborted or NCCL reports an
    /// error (checked every 10 ms).
    fn broken(link: &mut Link) -> Option<String> {
        if let Some(why) = link.comm.aborted() {
            return Some(format!("the direction's communicator was aborted ({why})"));
        }
        let now = Instant::now();
        if now < link.next_check {
            return None;
        }
        link.next_check = now + Duration::from_millis(10);
        link.comm.async_error().map(|e| format!("NCCL reported {e} on the direction's communicator"))
    }
}

impl Wire for NcclWire {
    fn give_up(&mut self, dir: Dir) {
        if let Some(b) = &self.board {
            b.give_up(dir.src, dir.dst);
        }
    }
    fn peer_gave_up(&self, dir: Dir) -> bool {
        self.board.as_ref().is_some_and(|b| b.peer_gave_up(dir.src, dir.dst))
    }

    type Connecting = Connecting;
    type Link = Link;
    type Swap = Swap;
    type Payload = Data;
    type Launching = Launching;
    type Launched = Launched;

    fn connect(&mut self, dir: Dir) -> Result<Connecting, String> {
        let store = self.store.as_ref().ok_or("this communicator has no store to set up point-to-point directions through")?;
        let key = self.key_of(dir);
        if self.me != dir.src {
            return Ok(Connecting { dir, state: ConnState::WaitId { key, next: Instant::now() } });
        }
        let mut id = nccl::ncclUniqueId { internal: [0; 128] };
        let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
        if r != nccl::ncclResult_t::ncclSuccess {
            return Err(format!("ncclGetUniqueId: {}", crate::comm::err_string(r)));
        }
        let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
        store.set(&key, &bytes).map_err(|e| format!("publishing the unique id of direction {} -> {}: {e}", dir.src, dir.dst))?;
        Ok(Connecting { dir, state: ConnState::Init(self.init(0, &bytes)?) })
    }

    fn poll_connect(&mut self, c: &mut Connecting) -> Poll<Result<Link, String>> {
        if let ConnState::WaitId { key, next } = &mut c.state {
            if Instant::now() < *next {
                return Poll::Pending;
            }
            *next = Instant::now() + STORE_POLL;
            let store = self.store.as_ref().expect("checked by connect");
            match store.check(&[key.as_str()]) {
                Ok(false) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(format!("reading the store: {e}"))),
                Ok(true) => {}
            }
            let bytes = match store.get(key) {
                Ok(b) => b,
                Err(e) => return Poll::Ready(Err(format!("reading the store: {e}"))),
            };
            match self.init(1, &bytes) {
                Ok(p) => c.state = ConnState::Init(p),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let dir = c.dir;
        if let ConnState::Twin { comm, done } = &c.state {
            let r = done.lock().unwrap_or_else(|e| e.into_inner()).take();
            return match r {
                None => Poll::Pending,
                Some(Err(e)) => Poll::Ready(Err(format!("connecting the direction's blocking twin: {e}"))),
                Some(Ok(())) => {
                    comm.watch_twin();
                    let comm = comm.clone();
                    // Done: dropping the state must not abort it.
                    *done.lock().unwrap_or_else(|e| e.into_inner()) = Some(Ok(()));
                    Poll::Ready(self.link(dir, comm))
                }
            };
        }
        let ConnState::Init(p) = &mut c.state else { unreachable!("set above") };
        let comm = match p.poll() {
            None => return Poll::Pending,
            Some(Err(e)) => return Poll::Ready(Err(e)),
            Some(Ok(comm)) => self.adopt(comm),
        };
        // Launches on a non-blocking communicator are handed to a thread NCCL starts for each
        // group (about 60 us each on 2 x H200, against 6 on a blocking one: see **Fast launch**
        // in the crate docs). So a direction gets a blocking twin as its parent has one; both of
        // its ranks are here now (the init is collective), so the twin's split and connection
        // wait for nobody else. A thread of its own makes it: the progress thread never waits.
        if !self.parent.wants_twin() {
            return Poll::Ready(self.link(dir, comm));
        }
        let done = Arc::new(std::sync::Mutex::new(None));
        let (twin, set) = (comm.clone(), done.clone());
        let deadline = Instant::now() + self.op_timeout;
        let dev = self.dev().clone();
        let spawned = std::thread::Builder::new().name(format!("nccl-p2p-twin-{}-{}", dir.src, dir.dst)).spawn(move || {
            let r = dev.bind().and_then(|()| twin.make_p2p_twin(deadline));
            *set.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        });
        match spawned {
            Ok(_) => {
                c.state = ConnState::Twin { comm, done };
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(format!("starting the thread that connects the direction's blocking twin: {e}"))),
        }
    }

    fn swap(&mut self, link: &mut Link, mine: &[u64]) -> Result<Swap, String> {
        let bytes: Vec<u8> = mine.iter().flat_map(|w| w.to_le_bytes()).collect();
        let n = bytes.len();
        if n > self.hdr_bytes {
            return Err(format!("a header of {n} bytes does not fit the staging of {}", self.hdr_bytes));
        }
        self.dev().bind()?;
        let host_send = {
            let h = &mut self.halves(link).0[..n];
            h.copy_from_slice(&bytes);
            &*h
        };
        let (send, recv) = (link.dev_send.as_ref().expect("live").ptr, link.dev_recv.as_ref().expect("live").ptr);
        let stream = link.stream();
        unsafe { cu::memcpy_htod_async(send, host_send, stream) }.map_err(|e| derr("cuMemcpyHtoDAsync", e))?;
        let peer = link.peer as i32;
        let pending = self.enqueue(link, |c, s| unsafe {
            let u8t = nccl::ncclDataType_t::ncclUint8;
            check(nccl::ncclSend(send as *const c_void, n, u8t, peer, c, s), "ncclSend (validation header)")?;
            check(nccl::ncclRecv(recv as *mut c_void, n, u8t, peer, c, s), "ncclRecv (validation header)")
        })?;
        let mut sw = Swap { ev: None, bytes: n };
        if !pending {
            sw.ev = Some(self.copy_back(link, n)?);
        }
        Ok(sw)
    }

    fn poll_swap(&mut self, link: &mut Link, s: &mut Swap) -> Poll<Result<Vec<u64>, String>> {
        if s.ev.is_none() {
            // NCCL still accepting the group: look (never wait), then queue the copy back.
            match link.comm.group_ready() {
                Ok(false) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(Self::launch_err(e))),
                Ok(true) => match self.copy_back(link, s.bytes) {
                    Ok(ev) => s.ev = Some(ev),
                    Err(e) => return Poll::Ready(Err(e)),
                },
            }
        }
        let ev = s.ev.as_ref().expect("set above");
        match ev.query() {
            Ok(true) => {
                if let Some(why) = link.comm.aborted() {
                    return Poll::Ready(Err(format!("the direction's communicator was aborted ({why})")));
                }
                let words =
                    self.halves(link).1[..s.bytes].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
                Poll::Ready(Ok(words))
            }
            Ok(false) => match Self::broken(link) {
                Some(why) => Poll::Ready(Err(why)),
                None => Poll::Pending,
            },
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn launch(&mut self, link: &mut Link, d: Data) -> Result<Launching, String> {
        self.dev().bind()?;
        let (t, n) = move_type(d.dtype, d.n);
        let mut launching = Launching { keep: Some(d.keep), waiting: Some((d.send, d.ptr, t, n)) };
        self.launch_if_room(link, &mut launching)?;
        Ok(launching)
    }

    fn poll_launch(&mut self, link: &mut Link, l: &mut Launching) -> Poll<Result<Launched, String>> {
        if l.waiting.is_some() {
            match self.launch_if_room(link, l) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(()) if l.waiting.is_some() => {
                    return match Self::broken(link) {
                        Some(why) => Poll::Ready(Err(why)),
                        None => Poll::Pending,
                    }
                }
                Ok(()) => {}
            }
        }
        match link.comm.group_ready() {
            Ok(false) => return Poll::Pending,
            Err(e) => return Poll::Ready(Err(Self::launch_err(e))),
            Ok(true) => {}
        }
        let ev = match self.dev().record_at(link.stream()) {
            Ok(ev) => Arc::new(ev),
            Err(e) => return Poll::Ready(Err(e)),
        };
        link.retiring.push((ev.clone(), l.keep.take().unwrap_or_default()));
        // The stream reached it: the header swap before it (this op's own) has completed.
        Poll::Ready(Ok(Launched { ev, at: Instant::now(), behind: None, side: Some(link.comm.clone()) }))
    }

    fn idle(&mut self, link: &mut Link) -> bool {
        Self::retire(link);
        link.retiring.is_empty()
    }
}

impl NcclWire {
    /// Releases what the direction's completed ops kept alive.
    fn retire(link: &mut Link) {
        link.retiring.retain(|(ev, _)| matches!(ev.query(), Ok(false)));
    }

    /// Launches `l`'s waiting op unless the direction's twin already has [`MAX_IN_FLIGHT`] ops
    /// pending (then it stays waiting).
    fn launch_if_room(&mut self, link: &mut Link, l: &mut Launching) -> Result<(), String> {
        let Some((send, ptr, t, n)) = l.waiting else { return Ok(()) };
        if link.comm.has_twin() && link.retiring.len() >= MAX_IN_FLIGHT {
            Self::retire(link);
            if link.retiring.len() >= MAX_IN_FLIGHT {
                return Ok(());
            }
        }
        l.waiting = None;
        let peer = link.peer as i32;
        self.enqueue(link, |c, s| unsafe {
            if send {
                check(nccl::ncclSend(ptr as *const c_void, n, t, peer, c, s), "ncclSend")
            } else {
                check(nccl::ncclRecv(ptr as *mut c_void, n, t, peer, c, s), "ncclRecv")
            }
        })?;
        Ok(())
    }
}
