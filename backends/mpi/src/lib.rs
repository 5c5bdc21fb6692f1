//! # concord-mpi
//!
//! **One job:** a [`concord_core::Backend`] over MPI (rsmpi's bindings to Open MPI), for ranks
//! started by `mpirun`: the multi-host CPU backend, and an implementation independent of the
//! shm backend to check it (and the oracle) against.
//!
//! The crate needs MPI only with its `mpi` feature (off by default, so the workspace builds and
//! tests on a machine without MPI); without it the crate is empty. `cargo xtask conformance
//! --backend mpi --ranks 4` turns the feature on, installs Open MPI and libclang with apt-get when
//! missing, and runs the conformance binary under `mpirun`.
//!
//! ## Design (with the `mpi` feature)
//! * **Init.** MPI is initialised once per process with `MPI_THREAD_MULTIPLE` (finalised at exit
//!   unless a call is stuck). A world of `n` ranks is `MPI_COMM_WORLD` ranks `0..n`
//!   (`MPI_Comm_create_group`, so ranks outside it need not take part); the world's rank MUST be
//!   the process's `mpirun` rank, else init names the mismatch. Init runs under the op deadline.
//! * **Collectives** run on a progress thread per communicator, in issue order; issue returns at
//!   once with a [`concord_core::Work`]. Each collective first allgathers every rank's [`concord_core::CallDesc`] and checks
//!   them with [`concord_core::validate_all`], so bad input is the same named `BadInput` on
//!   every rank and the communicator stays usable; then every rank votes (a one-word
//!   allgather) on whatever could stop it alone from taking part: its waiter has given up on the
//!   op, it cannot allocate the temporaries, or (all_to_all, whose counts differ per rank) a
//!   count or offset does not fit MPI's `int`. The data step then runs on every rank or on none
//!   (a late peer gets a named error, never a rank that has left). It is the MPI calls that
//!   run everywhere or nowhere, not the writes of the results: a data step can still fail on one
//!   rank (an MPI error), and a waiter that gives up during it leaves its own outputs untouched
//!   while its peers' are written. One MPI collective
//!   moves the data (`MPI_Allreduce`, `_Reduce_scatter_block`, `_Allgather`,
//!   `_Alltoallv`, `_Bcast`, `_Reduce`, `_Gather`, `_Scatter`, `_Sendrecv` for permute,
//!   `_Barrier`), through temporary buffers (views, in-place ops and aliasing need no care).
//! * **Reductions.** Integers travel sign- or zero-extended to 64 bits and reduce with this
//!   backend's own MPI user ops (Open MPI 4.1's built-in 8/16-bit sums saturate,
//!   open-mpi/ompi#8045, and 4.1.4's unsigned min is wrong, #10648: the differential test caught
//!   the first); the result's low bits are the wrapped result, `avg` divides it by the size,
//!   truncating. Floats (f16, bf16, f32, f64) travel as f64: `premul_sum`
//!   scales by the factor first, `avg` divides the f64 sum; the f64 result is rounded once to the
//!   dtype (exact-then-round); min / max are user ops with NaN propagating and `-0 < +0`.
//! * **Point to point** on a duplicate communicator, one thread per op: the `k`-th message from
//!   `a` to `b` uses tags `5k` .. `5k+4` (headers both ways, a vote both ways, then the data;
//!   each direction its own tag), so pairs match by count whatever the threads' order; both sides check the
//!   pair with [`concord_core::validate_pair`], then vote under the op's lock whether their
//!   waiter gave up the op at its deadline (the op deadline counts from the issue; a waiter
//!   still waiting then ends it in a named timeout and marks it abandoned, as a collective's):
//!   the data moves only if both said go, a send reads the caller's buffer only once it voted
//!   go, a receive writes it only then, so a buffer whose wait failed is never touched and the
//!   late peer ends in a named error; the data goes with `MPI_Ssend` (a send completes once
//!   the receiver takes it).
//! * **Subgroups**: `MPI_Comm_split` after the same cross-rank check.
//! * **Deadlines** (collectives; send / recv alike, from their issue). A wait still
//!   pending at the op deadline (the world's op timeout, counted from when the progress thread
//!   took the job) ends in a named [`concord_core::CollectiveError::Timeout`] and marks the op abandoned: the
//!   data moves through temporaries and reaches the caller's outputs only if the op was not
//!   abandoned first (one lock orders the two), so no buffer is written after its op failed at
//!   its deadline. A job still queued (behind an op stuck for good) is ended the same way once
//!   the progress thread has neither taken nor finished a job for
//!   [`concord_core::queued_op_backstop`] (three op timeouts; its issue at the earliest), as
//!   NCCL's backstop ends its queued ops: marked abandoned, its vote stops every rank when it is
//!   finally taken. A long queue of healthy ops moves, so it is waited out.
//!   A wait that ends at its own shorter timeout leaves the op alone, as NCCL's do;
//!   `is_completed` never ends an op.
//!   A `new_group` is committed at the vote: a waiter no longer gives up on a split its peers
//!   make. A wait never outlasts its caller's timeout, also not past the op deadline (a
//!   committed op still writing its outputs then stays pending).
//! * **Communicators** are freed when the last user of their group lets go (the backend, its
//!   progress thread, every point-to-point thread still running), never under a thread that may
//!   still call MPI on them. Every MPI call runs under a read lock that the exit handler takes
//!   (within 1 s) before `MPI_Finalize`, and none starts after it (a named error instead of
//!   Open MPI's abort).
//! * **Limits.** A peer that dies is not detected by MPI here: waits time out with a named
//!   [`concord_core::CollectiveError::Timeout`], and the stuck call keeps its thread (later ops on that
//!   communicator time out too, by the queued backstop at the latest). Plain `mpirun` ends every rank when one dies; with
//!   `--enable-recovery` (as `cargo xtask conformance --backend mpi` runs it) the others live on
//!   and the external-launch mode names the dead rank on rank 0. Messages are at most 2 GiB (MPI's
//!   `int` counts).

#[cfg(feature = "mpi")]
mod sys;

#[cfg(feature = "mpi")]
pub use imp::*;

#[cfg(feature = "mpi")]
mod imp {
    use crate::sys::{self, Comm};
    use concord_core::Completion;
    use concord_core::{
        progress, validate_all, validate_local, validate_pair, Backend, CallDesc, CallOp, Capabilities, CollectiveError, DType, Flag,
        OutstandingCounter, ReduceOp, Result, Tensor, TensorDesc, Variant, Work, WorkMeta, WorldInfo,
    };
    use std::alloc::Layout;
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::{Duration, Instant};

    /// Largest world (and subgroup) the backend declares.
    pub const MAX_WORLD_SIZE: usize = 64;

    fn caps() -> Capabilities {
        Capabilities::full(MAX_WORLD_SIZE)
    }

    fn backend_err(m: impl std::fmt::Display) -> CollectiveError {
        CollectiveError::Backend(format!("mpi backend: {m}"))
    }

    /// Heap storage of one buffer (64-byte aligned, zeroed).
    struct Mem {
        ptr: *mut u8,
        layout: Layout,
    }
    // SAFETY: the storage is plain bytes; collectives read and write it from the progress thread
    // while the caller holds the buffer, as a device buffer would be.
    unsafe impl Send for Mem {}
    unsafe impl Sync for Mem {}
    impl Drop for Mem {
        fn drop(&mut self) {
            // SAFETY: allocated with this layout in `MpiBuffer::new`.
            unsafe { std::alloc::dealloc(self.ptr, self.layout) }
        }
    }

    /// A buffer in this process's memory, or a view into one.
    #[derive(Clone)]
    pub struct MpiBuffer {
        mem: Arc<Mem>,
        off: usize,
        dtype: DType,
        shape: Vec<usize>,
    }

    impl std::fmt::Debug for MpiBuffer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "MpiBuffer<{}>{:?}@{:#x}", self.dtype, self.shape, self.addr())
        }
    }

    impl MpiBuffer {
        fn new(dtype: DType, shape: &[usize]) -> Result<MpiBuffer> {
            let bytes = shape
                .iter()
                .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
                .ok_or_else(|| backend_err(format!("a {dtype}{shape:?} buffer does not fit in the address space")))?;
            let layout = Layout::from_size_align(bytes.max(1), 64).map_err(backend_err)?;
            // SAFETY: non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                return Err(backend_err(format!("cannot allocate {bytes} bytes")));
            }
            Ok(MpiBuffer { mem: Arc::new(Mem { ptr, layout }), off: 0, dtype, shape: shape.to_vec() })
        }
        fn numel(&self) -> usize {
            self.shape.iter().product()
        }
        fn nbytes(&self) -> usize {
            self.numel() * self.dtype.size()
        }
        fn addr(&self) -> usize {
            self.mem.ptr as usize + self.off
        }
        fn desc(&self) -> TensorDesc {
            TensorDesc::new(self.dtype, &self.shape)
        }
        fn read(&self) -> Vec<u8> {
            let mut v = vec![0u8; self.nbytes()];
            // SAFETY: off + nbytes lies inside the allocation (checked by `view`).
            unsafe { std::ptr::copy_nonoverlapping(self.mem.ptr.add(self.off), v.as_mut_ptr(), v.len()) };
            v
        }
        /// Writes `b` (at most `nbytes`) at the start of the buffer.
        fn write_bytes(&self, b: &[u8]) {
            let n = b.len().min(self.nbytes());
            // SAFETY: as `read`.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.mem.ptr.add(self.off), n) };
        }
        fn overlaps(&self, o: &MpiBuffer) -> bool {
            let (a, b) = (self.addr(), o.addr());
            self.nbytes() > 0 && o.nbytes() > 0 && a < b + o.nbytes() && b < a + self.nbytes()
        }
    }

    /// One communicator: its handles and this rank's place in it. Shared (`Arc`) by the backend,
    /// its progress thread and every point-to-point thread still running; the handles are freed
    /// when the last of them lets go, never while a thread may still call MPI on them.
    struct Group {
        coll: Comm,
        p2p: Comm,
        n: usize,
        me: usize,
        label: String,
    }

    impl Drop for Group {
        fn drop(&mut self) {
            sys::free(self.coll);
            sys::free(self.p2p);
        }
    }

    struct Job {
        name: String,
        call: CallDesc,
        ins: Vec<MpiBuffer>,
        outs: Vec<MpiBuffer>,
        flag: Arc<Flag>,
        ctl: Arc<Mutex<Ctl>>,
        reply: Option<mpsc::Sender<Option<(Comm, Comm)>>>,
    }

    /// Where a queued collective stands between its waiter and the progress thread.
    #[derive(Default)]
    struct Ctl {
        /// When the progress thread took the job: its op deadline counts from here.
        started: Option<Instant>,
        /// The waiter gave up at the op deadline (the op failed with a timeout): the progress
        /// thread MUST NOT touch the caller's outputs from then on.
        abandoned: bool,
        /// The progress thread is writing the outputs: the op is about to complete.
        committed: bool,
    }

    /// A collective's completion: its flag, ended at the op deadline (counted from when the
    /// progress thread took the job) by the first waiter still waiting then, which marks the job
    /// abandoned (see [`Ctl`]) and fails it with a named timeout. A job still queued (behind an
    /// earlier op stuck for good: a dead peer MPI never reports) is ended the same way once its
    /// communicator's queue has not moved for [`concord_core::queued_op_backstop`] (review15
    /// finding 5b): when it is finally taken its vote says it was given up, so no rank moves its
    /// data. A long queue of healthy ops moves (each starts and ends within its deadlines), so it
    /// is waited out.
    struct Deadlined {
        flag: Arc<Flag>,
        ctl: Arc<Mutex<Ctl>>,
        issued: Instant,
        /// When the communicator's progress thread last took or finished a job.
        moved: Arc<Mutex<Instant>>,
        op_timeout: Duration,
        what: (String, u64, usize),
    }

    impl Deadlined {
        /// When a waiter still waiting ends the op (`c` is its [`Ctl`]): its op deadline from
        /// the job's start, or while the job is still queued the backstop from when the queue
        /// last moved (its issue at the earliest; `true`: queued).
        fn op_deadline(&self, c: &Ctl) -> (Instant, bool) {
            match c.started {
                Some(s) => (s + self.op_timeout, false),
                None => {
                    let moved = *self.moved.lock().unwrap_or_else(|e| e.into_inner());
                    (self.issued.max(moved) + concord_core::queued_op_backstop(self.op_timeout), true)
                }
            }
        }

        /// The named timeout of an op ended at its deadline (`queued`: at the backstop).
        fn timeout(&self, queued: bool) -> CollectiveError {
            let (op, seq, rank) = self.what.clone();
            let ms = self.op_timeout.as_millis();
            let backstop = concord_core::queued_op_backstop(self.op_timeout);
            let why = if queued {
                format!(
                    "never started: still queued behind an earlier op of this communicator, stuck (a peer late or gone): the \
                     queue did not move for {} ms (the queued backstop, three op deadlines of {ms} ms)",
                    backstop.as_millis()
                )
            } else {
                format!("not complete at the op deadline of {ms} ms (a peer late or gone)")
            };
            CollectiveError::Timeout {
                op,
                seq,
                rank,
                waited_ms: if queued { backstop } else { self.op_timeout }.as_millis() as u64,
                detail: format!("{why}; its outputs are left untouched; this process is {}", progress::describe()),
            }
        }
    }

    impl Completion for Deadlined {
        fn is_completed(&self) -> bool {
            self.flag.is_completed()
        }
        fn wait_for(&self, timeout: Duration) -> Result<bool> {
            let end = Instant::now() + timeout;
            loop {
                let (op_end, _) = self.op_deadline(&self.ctl.lock().unwrap_or_else(|e| e.into_inner()));
                let until = op_end.min(end);
                // Short slices: a job started meanwhile brings its op deadline in.
                let slice = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(10));
                if self.flag.wait_for(slice)? {
                    return Ok(true);
                }
                let now = Instant::now();
                if now >= op_end {
                    let mut c = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
                    // Decided under the lock: a job the progress thread took since the look
                    // above has its own op deadline from its start.
                    let (op_end, queued) = self.op_deadline(&c);
                    if now < op_end {
                        continue;
                    }
                    if !c.committed && !c.abandoned {
                        c.abandoned = true;
                        drop(c);
                        self.flag.set(Err(self.timeout(queued)));
                    }
                    // Abandoned (the flag says so) or committed (the flag follows once the outputs
                    // are written): within the caller's own timeout still, never past it (a
                    // committed op not done by then stays pending, as at any shorter timeout).
                    return self.flag.wait_for(end.saturating_duration_since(now));
                }
                if now >= end {
                    return Ok(false);
                }
            }
        }
    }

    /// The MPI backend (one instance per rank and per subgroup).
    pub struct MpiBackend {
        g: Arc<Group>,
        tx: Mutex<Option<mpsc::Sender<Job>>>,
        seq: Mutex<u64>,
        send_k: Mutex<Vec<u64>>,
        recv_k: Mutex<Vec<u64>>,
        counter: OutstandingCounter,
        op_timeout: Duration,
        /// When the progress thread last took or finished a job (queued ops' backstop).
        moved: Arc<Mutex<Instant>>,
    }

    impl Drop for MpiBackend {
        fn drop(&mut self) {
            // Closing the queue ends the progress thread once its current op is done. Never joined:
            // a call stuck on a dead peer must not hang the drop. The communicators are freed with
            // the last reference to the group (this backend's, the progress thread's, or that of
            // a point-to-point thread still sending or receiving).
            self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    fn tag_of(world_id: &str) -> i32 {
        // FNV-1a of the world id, as a non-negative MPI tag (every rank of the world computes it).
        let h = world_id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        (h % 32_000) as i32
    }

    impl MpiBackend {
        fn start(g: Group, op_timeout: Duration) -> Result<MpiBackend> {
            let g = Arc::new(g);
            let (tx, rx) = mpsc::channel::<Job>();
            let gt = g.clone();
            let moved = Arc::new(Mutex::new(Instant::now()));
            let mt = moved.clone();
            let stamp = move || *mt.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            std::thread::Builder::new()
                .name(format!("concord-mpi-{}", g.label))
                .spawn(move || {
                    for job in rx {
                        stamp();
                        run_job(&gt, job);
                        stamp();
                    }
                })
                .map_err(|e| backend_err(format!("cannot start the progress thread: {e}")))?;
            let n = g.n;
            Ok(MpiBackend {
                g,
                tx: Mutex::new(Some(tx)),
                seq: Mutex::new(0),
                send_k: Mutex::new(vec![0; n]),
                recv_k: Mutex::new(vec![0; n]),
                counter: OutstandingCounter::default(),
                op_timeout,
                moved,
            })
        }

        fn meta(&self, op: &str, seq: u64) -> WorkMeta {
            WorkMeta { backend: "mpi".into(), op: op.to_string(), seq, rank: self.g.me }
        }

        fn call(&self, op: CallOp, variant: Variant, ins: &[&MpiBuffer], outs: &[&MpiBuffer]) -> CallDesc {
            let mut d = CallDesc::new(op, variant, self.g.me);
            d.inputs = ins.iter().map(|b| b.desc()).collect();
            // `outputs` names the caller's buffers only (`_out` ops); the rule table sizes them.
            if variant == Variant::OutBuf {
                d.outputs = outs.iter().map(|b| b.desc()).collect();
            }
            let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
            let same = |a: &MpiBuffer, b: &MpiBuffer| a.addr() == b.addr() && a.nbytes() == b.nbytes();
            d.aliased = outs.iter().enumerate().any(|(i, o)| {
                ins.iter().enumerate().any(|(j, x)| o.overlaps(x) && !(in_place && i == j && same(o, x)))
                    || outs[i + 1..].iter().any(|p| o.overlaps(p))
            });
            d
        }

        /// The completion of op `name` #`seq` of this rank, issued at `issued` (see [`Deadlined`]).
        fn deadlined(&self, flag: Arc<Flag>, ctl: Arc<Mutex<Ctl>>, issued: Instant, name: impl Into<String>, seq: u64) -> Deadlined {
            Deadlined { flag, ctl, issued, moved: self.moved.clone(), op_timeout: self.op_timeout, what: (name.into(), seq, self.g.me) }
        }

        /// Queues a collective: sequence number and queue order are taken atomically.
        fn issue<T>(&self, name: &str, mut call: CallDesc, ins: Vec<MpiBuffer>, outs: Vec<MpiBuffer>, value: T) -> Result<Work<T>> {
            let issued = Instant::now();
            let (flag, ctl, seq) = self.submit(name, &mut call, ins, outs, None)?;
            let done = self.deadlined(flag, ctl, issued, name, seq);
            Ok(Work::new(value, Arc::new(done), self.meta(name, seq), &self.counter))
        }

        fn submit(
            &self,
            name: &str,
            call: &mut CallDesc,
            ins: Vec<MpiBuffer>,
            outs: Vec<MpiBuffer>,
            reply: Option<mpsc::Sender<Option<(Comm, Comm)>>>,
        ) -> Result<(Arc<Flag>, Arc<Mutex<Ctl>>, u64)> {
            let flag = Flag::new();
            let ctl = Arc::new(Mutex::new(Ctl::default()));
            let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
            *seq += 1;
            call.seq = *seq;
            progress::begin(&self.g.label, name, *seq);
            let job = Job { name: name.to_string(), call: call.clone(), ins, outs, flag: flag.clone(), ctl: ctl.clone(), reply };
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let sent = tx.as_ref().map(|t| t.send(job).is_ok()).unwrap_or(false);
            if !sent {
                progress::end(&self.g.label, *seq);
                return Err(CollectiveError::Aborted(format!("mpi backend rank {}: the progress thread is gone", self.g.me)));
            }
            Ok((flag, ctl, *seq))
        }

        fn gathered_shape(&self, x: &MpiBuffer) -> Vec<usize> {
            match x.shape.split_first() {
                None => vec![self.g.n],
                Some((d0, rest)) => std::iter::once(d0 * self.g.n).chain(rest.iter().copied()).collect(),
            }
        }
        fn scattered_shape(&self, x: &MpiBuffer) -> Vec<usize> {
            match x.shape.split_first() {
                None => vec![],
                Some((d0, rest)) => std::iter::once(d0 / self.g.n).chain(rest.iter().copied()).collect(),
            }
        }

        fn all_reduce_impl(&self, name: &str, xs: &[MpiBuffer], op: ReduceOp, variant: Variant) -> Result<Work<Vec<MpiBuffer>>> {
            let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
            let outs: Vec<MpiBuffer> =
                if in_place { xs.to_vec() } else { xs.iter().map(|x| MpiBuffer::new(x.dtype, &x.shape)).collect::<Result<_>>()? };
            let mut c = self.call(CallOp::AllReduce, variant, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
            c.reduce = Some(op);
            self.issue(name, c, xs.to_vec(), outs.clone(), outs)
        }

        fn reduce_scatter_impl(
            &self,
            name: &str,
            xs: &[MpiBuffer],
            op: ReduceOp,
            variant: Variant,
            outs: Vec<MpiBuffer>,
        ) -> Result<Work<Vec<MpiBuffer>>> {
            let mut c = self.call(CallOp::ReduceScatter, variant, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
            c.reduce = Some(op);
            self.issue(name, c, xs.to_vec(), outs.clone(), outs)
        }

        fn check_p2p(&self, op: CallOp, b: &MpiBuffer, peer: usize) -> Result<CallDesc> {
            let d = CallDesc::p2p(op, self.g.me, b.desc(), peer);
            validate_local(&d, self.g.n, &caps()).map_err(|e| e.into_error(op.name(), 0, self.g.me))?;
            Ok(d)
        }

        /// A point-to-point op on its own thread (see the crate docs for the protocol).
        fn p2p<T>(&self, d: CallDesc, buf: MpiBuffer, peer: usize, value: T) -> Result<Work<T>> {
            let is_send = d.op == CallOp::Send;
            let k = {
                let mut ks = if is_send { self.send_k.lock() } else { self.recv_k.lock() }.unwrap_or_else(|e| e.into_inner());
                ks[peer] += 1;
                ks[peer]
            };
            let name = if is_send { format!("send to {peer}") } else { format!("recv from {peer}") };
            // Sequence numbers of p2p ops in the progress record: above every collective's.
            let key = (1u64 << 62) | ((is_send as u64) << 61) | ((peer as u64) << 40) | k;
            progress::begin(&self.g.label, if is_send { "send" } else { "recv" }, key);
            let flag = Flag::new();
            // The op deadline counts from the issue (the op's own thread starts at once); a
            // waiter still waiting then abandons the op (see `p2p_run`'s vote).
            let issued = Instant::now();
            let ctl = Arc::new(Mutex::new(Ctl { started: Some(issued), ..Ctl::default() }));
            let (g, f, c) = (self.g.clone(), flag.clone(), ctl.clone());
            let base = ((k % P2P_PAIRS) * P2P_TAGS) as i32;
            let op_name = d.op.name();
            std::thread::Builder::new()
                .name(format!("concord-mpi-p2p-{}", g.me))
                .spawn(move || {
                    let r = p2p_run(&g, &d, &buf, peer, base, &c);
                    progress::end(&g.label, key);
                    let r = r.map_err(|e| match e {
                        P2pErr::Bad(b) => b.into_error(op_name, k, g.me),
                        P2pErr::Mpi(m) => backend_err(format!("{op_name} #{k} on rank {}: {m}", g.me)),
                        P2pErr::Abandoned(r) => CollectiveError::Aborted(format!(
                            "{op_name} #{k} on rank {}: rank {r} had given up this message at its op deadline; nothing was moved",
                            g.me
                        )),
                    });
                    // An abandoned op's flag holds its timeout already (the first verdict stays).
                    f.set(r);
                })
                .map_err(|e| backend_err(format!("cannot start a point-to-point thread: {e}")))?;
            let done = self.deadlined(flag, ctl, issued, op_name, k);
            Ok(Work::new(value, Arc::new(done), self.meta(&name, k), &self.counter))
        }
    }

    /// Tags per message (headers both ways, votes both ways, the data: each direction its own
    /// tag, since a pair's `k`-th messages both ways share `k`) and messages per pair before the
    /// tags wrap (both within Open MPI's `MPI_TAG_UB`, 2^31 - 1).
    const P2P_TAGS: u64 = 5;
    const P2P_PAIRS: u64 = 400_000_000;

    enum P2pErr {
        Bad(concord_core::BadInput),
        Mpi(String),
        /// This side (`rank` = this rank) or the peer had given up the op at its deadline.
        Abandoned(usize),
    }
    impl From<String> for P2pErr {
        fn from(s: String) -> P2pErr {
            P2pErr::Mpi(s)
        }
    }

    /// One send or receive (the crate docs' protocol): headers both ways, `validate_pair`, then a
    /// one-word vote both ways on whether either waiter gave up the op at its deadline (review15
    /// finding 1: a thread left in the header exchange by a waiter that timed out used to pair
    /// with the peer's late op and move the data anyway, `Ok` on the peer). The vote is cast
    /// under the op's lock: a side that votes go is committed (its waiter no longer gives up;
    /// both threads are alive, so the rest is bounded) and a send reads the caller's buffer only
    /// then, a side that had given up votes no-go; the data moves only if both said go.
    fn p2p_run(g: &Group, d: &CallDesc, buf: &MpiBuffer, peer: usize, base: i32, ctl: &Mutex<Ctl>) -> std::result::Result<(), P2pErr> {
        let c = g.p2p;
        // Headers: the sender's on tag base (to the receiver), the receiver's on base + 1.
        let theirs = if d.op == CallOp::Send {
            sys::send_words(c, &d.encode(), peer, base)?;
            sys::recv_words(c, peer, base + 1)?
        } else {
            let h = sys::recv_words(c, peer, base)?;
            sys::send_words(c, &d.encode(), peer, base + 1)?;
            h
        };
        let other = CallDesc::decode(&theirs).ok_or_else(|| P2pErr::Mpi(format!("malformed header from rank {peer}")))?;
        validate_pair(d, &other, g.n, &caps()).map_err(P2pErr::Bad)?;
        let (vote, data) = {
            let mut st = ctl.lock().unwrap_or_else(|e| e.into_inner());
            if st.abandoned {
                (1u64, None)
            } else {
                st.committed = true;
                (0, (d.op == CallOp::Send).then(|| buf.read()))
            }
        };
        let theirs = if d.op == CallOp::Send {
            sys::send_words(c, &[vote], peer, base + 2)?;
            sys::recv_words(c, peer, base + 3)?
        } else {
            let v = sys::recv_words(c, peer, base + 2)?;
            sys::send_words(c, &[vote], peer, base + 3)?;
            v
        };
        if vote != 0 {
            return Err(P2pErr::Abandoned(g.me));
        }
        if theirs.first() != Some(&0) {
            return Err(P2pErr::Abandoned(peer));
        }
        match data {
            Some(bytes) => sys::ssend(c, &bytes, peer, base + 4)?,
            None => {
                let mut v = vec![0u8; buf.nbytes()];
                sys::recv_bytes(c, &mut v, peer, base + 4)?;
                buf.write_bytes(&v);
            }
        }
        Ok(())
    }

    /// Runs one queued collective on the progress thread and completes its flag.
    fn run_job(g: &Group, job: Job) {
        let (me, seq) = (g.me, job.call.seq);
        job.ctl.lock().unwrap_or_else(|e| e.into_inner()).started = Some(Instant::now());
        let r = (|| -> Result<Option<(Comm, Comm)>> {
            let all = sys::allgather_words(g.coll, g.n, &job.call.encode()).map_err(backend_err)?;
            let descs: Vec<CallDesc> = all
                .iter()
                .enumerate()
                .map(|(r, w)| CallDesc::decode(w).ok_or_else(|| backend_err(format!("malformed call description from rank {r}"))))
                .collect::<Result<_>>()?;
            validate_all(&descs, &caps()).map_err(|e| e.into_error(&job.name, seq, me))?;
            // Every rank says whether its waiter has given up on the op (at the op deadline,
            // while the headers waited for a late peer): all move the data or none does, so a
            // late peer never meets a rank that has left, and the communicator stays in step.
            // The temporaries the data goes through come first: a rank that cannot have them
            // says so in its vote, so no peer waits in a data step it never joins.
            let temps: std::result::Result<Vec<MpiBuffer>, CollectiveError> =
                job.outs.iter().map(|o| MpiBuffer::new(o.dtype, &o.shape)).collect();
            // So do the MPI `int` limits of all_to_all's counts and offsets, which differ from
            // rank to rank (the other ops' counts are equal on every rank, validated): a rank
            // whose counts do not fit says so, so no peer waits in an MPI_Alltoallv it never
            // joins.
            let counts = match job.call.op {
                CallOp::AllToAll => alltoall_counts(&job, &descs, me, g.n).map(|_| ()),
                _ => Ok(()),
            };
            // The inputs are read under the vote's lock, before this rank votes go (review15
            // finding 5a): the data step reads these snapshots, so a waiter that gives up after
            // the vote and rewrites its inputs changes nothing its peers receive.
            let mut snaps: Vec<Vec<u8>> = Vec::new();
            let vote = {
                let mut c = job.ctl.lock().unwrap_or_else(|e| e.into_inner());
                if !c.abandoned && temps.is_ok() && counts.is_ok() {
                    let root_only = matches!(job.call.op, CallOp::Broadcast | CallOp::Scatter) && job.call.root != Some(me);
                    snaps = job.ins.iter().map(|x| if root_only { Vec::new() } else { x.read() }).collect();
                }
                // A split is this rank's from here on (its waiter no longer gives up on it), so
                // no rank leaves a subgroup that its peers create.
                if job.call.op == CallOp::NewGroup && !c.abandoned && temps.is_ok() {
                    c.committed = true;
                }
                if c.abandoned {
                    1
                } else if temps.is_err() {
                    2
                } else if counts.is_err() {
                    3
                } else {
                    0
                }
            };
            let votes = sys::allgather_words(g.coll, g.n, &[vote]).map_err(backend_err)?;
            if let Some(r) = votes.iter().position(|v| v.first() != Some(&0)) {
                let why = match votes[r].first() {
                    Some(&1) => "had given up this op at its deadline before every rank issued it",
                    Some(&3) => "has counts or offsets that do not fit MPI's int",
                    _ => "could not allocate the op's buffers",
                };
                temps?;
                counts.map_err(|m| backend_err(format!("{} #{seq} on rank {me}: {m}; nothing was moved", job.name)))?;
                return Err(CollectiveError::Aborted(format!("{} #{seq} on rank {me}: rank {r} {why}; nothing was moved", job.name)));
            }
            let temps = temps?;
            // Into temporaries, then into the caller's outputs unless the waiter gave up
            // meanwhile (a data step that outlived the op deadline never writes them).
            let made =
                execute(g, &job, &snaps, &temps, &descs).map_err(|m| backend_err(format!("{} #{seq} on rank {me}: {m}", job.name)))?;
            let mut c = job.ctl.lock().unwrap_or_else(|e| e.into_inner());
            if c.abandoned {
                return Err(backend_err(format!("{} #{seq} on rank {me}: finished after its deadline; outputs left untouched", job.name)));
            }
            c.committed = true;
            for (t, o) in temps.iter().zip(&job.outs) {
                o.write_bytes(&t.read());
            }
            Ok(made)
        })();
        progress::end(&g.label, seq);
        match r {
            Ok(comm) => {
                if let Some(reply) = &job.reply {
                    let _ = reply.send(comm);
                }
                job.flag.set(Ok(()));
            }
            Err(e) => job.flag.set(Err(e)),
        }
    }

    /// Float dtype layout for rounding: (exponent bits, mantissa bits).
    fn layout(d: DType) -> (u32, u32) {
        match d {
            DType::F16 => (5, 10),
            DType::BF16 => (8, 7),
            DType::F32 => (8, 23),
            _ => (11, 52),
        }
    }

    /// Float elements as f64 (exact), each times `scale`.
    fn to_f64(d: DType, b: &[u8], scale: f64) -> Vec<f64> {
        let sz = d.size();
        b.chunks_exact(sz)
            .map(|c| {
                let v = match d {
                    DType::F16 => half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                    DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                    DType::F32 => f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64,
                    _ => f64::from_le_bytes(c.try_into().expect("8 bytes")),
                };
                if scale == 1.0 {
                    v
                } else {
                    v * scale
                }
            })
            .collect()
    }

    /// f64 values rounded once to the float dtype `d`, as bytes.
    fn from_f64(d: DType, v: &[f64]) -> Vec<u8> {
        let sz = d.size();
        let mut out = Vec::with_capacity(v.len() * sz);
        for &x in v {
            let bits = if d == DType::F64 {
                x.to_bits()
            } else {
                let (e, m) = layout(d);
                concord_core::dtype::round_f64_to_bits(x, e, m)
            };
            out.extend_from_slice(&bits.to_le_bytes()[..sz]);
        }
        out
    }

    /// Integer elements divided by `n`, truncating toward zero (avg of the wrapped sum).
    fn int_div(d: DType, b: &mut [u8], n: usize) {
        let sz = d.size();
        let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
        for c in b.chunks_exact_mut(sz) {
            let mut w = [0u8; 16];
            w[..sz].copy_from_slice(c);
            if signed && c[sz - 1] & 0x80 != 0 {
                w[sz..].fill(0xff);
            }
            let v = i128::from_le_bytes(w) / n as i128;
            c.copy_from_slice(&v.to_le_bytes()[..sz]);
        }
    }

    enum Red {
        All,
        Root(usize),
        Scatter,
    }

    /// One reduction of `x`'s bytes over the communicator; `None` on non-roots of a reduce.
    fn reduce_bytes(g: &Group, x: &[u8], d: DType, op: ReduceOp, how: Red) -> std::result::Result<Option<Vec<u8>>, String> {
        let n = g.n;
        let numel = x.len() / d.size();
        let out_elems = if matches!(how, Red::Scatter) { numel / n } else { numel };
        let root = match how {
            Red::Root(r) => Some(r),
            _ => None,
        };
        let mine = root.is_none_or(|r| r == g.me);
        if d.is_float() {
            let scale = if let ReduceOp::PremulSum(s) = op { s } else { 1.0 };
            let send = to_f64(d, x, scale);
            let mut recv = vec![0f64; out_elems];
            let (sb, rb) = (bytemuck_f64(&send), bytemuck_f64_mut(&mut recv));
            match how {
                Red::Scatter => sys::reduce_scatter(g.coll, sb, rb, out_elems, sys::f64_dt(), sys::op(op, true, true))?,
                _ => sys::reduce(g.coll, sb, rb, numel, sys::f64_dt(), sys::op(op, true, true), root)?,
            }
            if !mine {
                return Ok(None);
            }
            if op == ReduceOp::Avg {
                recv.iter_mut().for_each(|v| *v /= n as f64);
            }
            Ok(Some(from_f64(d, &recv)))
        } else {
            let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
            let send = widen(d, x);
            let mut recv = vec![0u64; out_elems];
            let (sb, rb) = (bytes_of(&send), bytes_of_mut(&mut recv));
            let mop = sys::op(op, false, signed);
            match how {
                Red::Scatter => sys::reduce_scatter(g.coll, sb, rb, out_elems, sys::u64_dt(), mop)?,
                _ => sys::reduce(g.coll, sb, rb, numel, sys::u64_dt(), mop, root)?,
            }
            if !mine {
                return Ok(None);
            }
            // The low bits of the 64-bit result are the result in the dtype's width (sums and
            // products wrap alike); avg divides that wrapped sum.
            let mut out: Vec<u8> = recv.iter().flat_map(|v| v.to_le_bytes()[..d.size()].to_vec()).collect();
            if op == ReduceOp::Avg {
                int_div(d, &mut out, n);
            }
            Ok(Some(out))
        }
    }

    /// Integer elements sign- or zero-extended to 64 bits.
    fn widen(d: DType, b: &[u8]) -> Vec<u64> {
        let sz = d.size();
        let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
        b.chunks_exact(sz)
            .map(|c| {
                let fill = if signed && c[sz - 1] & 0x80 != 0 { 0xff } else { 0 };
                let mut w = [fill; 8];
                w[..sz].copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .collect()
    }

    fn bytes_of(v: &[u64]) -> &[u8] {
        // SAFETY: u64 has no padding; u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }
    fn bytes_of_mut(v: &mut [u64]) -> &mut [u8] {
        // SAFETY: as above; every byte pattern is a valid u64.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
    }

    fn bytemuck_f64(v: &[f64]) -> &[u8] {
        // SAFETY: f64 has no padding; u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }
    fn bytemuck_f64_mut(v: &mut [f64]) -> &mut [u8] {
        // SAFETY: as above; every byte pattern is a valid f64.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
    }

    /// An all_to_all's byte counts on this rank: what it sends to each peer and what it receives
    /// from each (a peer's input split for this rank, validated equal to this rank's output
    /// split), each count and each running offset checked to fit MPI's `int`.
    fn alltoall_counts(job: &Job, descs: &[CallDesc], me: usize, n: usize) -> std::result::Result<(Vec<usize>, Vec<usize>), String> {
        let x = job.ins.first().ok_or("all_to_all without an input")?;
        let row = x.shape.get(1..).map_or(Some(1usize), |r| r.iter().try_fold(1usize, |a, &d| a.checked_mul(d)));
        let row = row.and_then(|r| r.checked_mul(x.dtype.size())).ok_or("a row of the input does not fit in the address space")?;
        let bytes = |k: usize| k.checked_mul(row).ok_or_else(|| format!("{k} rows of {row} bytes do not fit in the address space"));
        let sc: Vec<usize> = job.call.input_splits(n).iter().map(|&k| bytes(k)).collect::<std::result::Result<_, _>>()?;
        let rc: Vec<usize> = descs.iter().map(|d| bytes(d.input_splits(n)[me])).collect::<std::result::Result<_, _>>()?;
        for (what, v) in [("send", &sc), ("receive", &rc)] {
            let mut at = 0usize;
            for (peer, &k) in v.iter().enumerate() {
                sys::count(k).map_err(|e| format!("the {what} count for rank {peer} ({k} bytes): {e}"))?;
                sys::count(at).map_err(|e| format!("the {what} offset for rank {peer} ({at} bytes): {e}"))?;
                at = at.checked_add(k).ok_or_else(|| format!("the {what} total does not fit in the address space"))?;
            }
        }
        Ok((sc, rc))
    }

    /// The data movement of a validated collective.
    /// The data step, reading the inputs' snapshots `ins` (taken when this rank voted, see
    /// `run_job`), never the caller's input buffers.
    fn execute(
        g: &Group,
        job: &Job,
        ins: &[Vec<u8>],
        outs: &[MpiBuffer],
        descs: &[CallDesc],
    ) -> std::result::Result<Option<(Comm, Comm)>, String> {
        let (n, me) = (g.n, g.me);
        let c = &job.call;
        match c.op {
            CallOp::AllReduce | CallOp::ReduceScatter | CallOp::Reduce => {
                let op = c.reduce.expect("validated: reduce op present");
                for ((x, snap), out) in job.ins.iter().zip(ins).zip(outs) {
                    let how = match c.op {
                        CallOp::AllReduce => Red::All,
                        CallOp::ReduceScatter => Red::Scatter,
                        _ => Red::Root(c.root.expect("validated: root")),
                    };
                    if let Some(r) = reduce_bytes(g, snap, x.dtype, op, how)? {
                        out.write_bytes(&r);
                    }
                }
            }
            CallOp::AllGather | CallOp::Gather => {
                let root = if c.op == CallOp::Gather { c.root } else { None };
                for ((x, snap), out) in job.ins.iter().zip(ins).zip(outs) {
                    let mut recv = vec![0u8; if root.is_none_or(|r| r == me) { x.nbytes() * n } else { 0 }];
                    sys::gather(g.coll, snap, &mut recv, root)?;
                    out.write_bytes(&recv);
                }
            }
            CallOp::Scatter => {
                let root = c.root.expect("validated: root");
                let (x, out) = (&job.ins[0], &outs[0]);
                let send = if me == root { ins[0].clone() } else { vec![] };
                let mut recv = vec![0u8; x.nbytes() / n];
                sys::scatter(g.coll, &send, &mut recv, root)?;
                out.write_bytes(&recv);
            }
            CallOp::Broadcast => {
                let root = c.root.expect("validated: root");
                let (x, out) = (&job.ins[0], &outs[0]);
                let mut buf = if me == root { ins[0].clone() } else { vec![0u8; x.nbytes()] };
                sys::bcast(g.coll, &mut buf, root)?;
                out.write_bytes(&buf);
            }
            CallOp::AllToAll => {
                let out = &outs[0];
                // Checked before the vote (the same computation): fits here.
                let (sc, rc) = alltoall_counts(job, descs, me, n)?;
                let mut recv = vec![0u8; rc.iter().sum()];
                sys::alltoallv(g.coll, &ins[0], &sc, &mut recv, &rc)?;
                out.write_bytes(&recv);
            }
            CallOp::Permute => {
                let perm = c.perm.as_ref().expect("validated: permutation");
                let (x, out) = (&job.ins[0], &outs[0]);
                let src = perm.iter().position(|&d| d == me).expect("validated: a permutation");
                let mut recv = vec![0u8; x.nbytes()];
                sys::sendrecv(g.coll, &ins[0], perm[me], &mut recv, src, 7)?;
                out.write_bytes(&recv);
            }
            CallOp::Barrier => sys::barrier(g.coll)?,
            CallOp::NewGroup => {
                let ranks = c.group.as_ref().expect("validated: member list");
                return sys::split(g.coll, ranks.iter().position(|&r| r == me));
            }
            CallOp::Send | CallOp::Recv => return Err("send / recv are not queued collectives".into()),
            // The trait's default decompositions run them as the collectives above.
            CallOp::FusedAllGatherMatmul
            | CallOp::FusedMatmulReduceScatter
            | CallOp::LowContentionAllGather
            | CallOp::LowContentionReduceScatter => {
                return Err(format!("{} is decomposed by the trait's defaults, never queued", c.op.name()))
            }
        }
        Ok(None)
    }

    impl Backend for MpiBackend {
        type Buffer = MpiBuffer;

        /// Joins the world: MPI_COMM_WORLD ranks `0..world_size`; this process's `mpirun` rank
        /// MUST be `world.rank`.
        fn init(world: &WorldInfo) -> Result<Self> {
            let (rank, n) = (world.rank, world.world_size);
            if n == 0 || n > MAX_WORLD_SIZE || rank >= n {
                return Err(CollectiveError::Unsupported(format!(
                    "mpi backend runs worlds of 1..={MAX_WORLD_SIZE} ranks; got rank {rank} of {n}"
                )));
            }
            if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() {
                // A process Concord forked itself would be an MPI singleton (a world of one).
                return Err(CollectiveError::Unsupported(format!(
                    "the mpi backend runs on ranks started by Open MPI's mpirun, and this process was not \
                     (run `cargo xtask conformance --backend mpi --ranks {n}`)"
                )));
            }
            let (wr, wn) = sys::init().map_err(backend_err)?;
            if wr != rank || n > wn {
                return Err(backend_err(format!(
                    "this process is rank {wr} of {wn} in MPI_COMM_WORLD, but the world wants rank {rank} of {n}: \
                     the mpi backend runs only on ranks started by mpirun (e.g. `cargo xtask conformance --backend mpi --ranks {n}`)"
                )));
            }
            // Communicator creation waits for every rank: run it under the op deadline.
            let (tx, rx) = mpsc::channel();
            let tag = tag_of(&world.world_id);
            std::thread::Builder::new()
                .name("concord-mpi-init".into())
                .spawn(move || {
                    let _ = tx.send(sys::world_prefix_comm(n, tag));
                })
                .map_err(|e| backend_err(format!("cannot start the init thread: {e}")))?;
            let (coll, p2p) = match rx.recv_timeout(world.op_timeout) {
                Ok(r) => r.map_err(backend_err)?,
                Err(_) => {
                    return Err(CollectiveError::Timeout {
                        op: "init".into(),
                        seq: 0,
                        rank,
                        waited_ms: world.op_timeout.as_millis() as u64,
                        detail: format!("mpi backend: not every rank of 0..{n} created the world's communicator"),
                    })
                }
            };
            let label = format!("mpi r{rank} ({})", sys::processor_name());
            MpiBackend::start(Group { coll, p2p, n, me: rank, label }, world.op_timeout)
        }

        fn name(&self) -> &str {
            "mpi"
        }
        fn rank(&self) -> usize {
            self.g.me
        }
        fn world_size(&self) -> usize {
            self.g.n
        }
        fn capabilities(&self) -> Capabilities {
            caps()
        }
        fn outstanding(&self) -> usize {
            self.counter.get()
        }

        fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
            let (reply_tx, reply_rx) = mpsc::channel();
            let mut c = CallDesc::new(CallOp::NewGroup, Variant::Out, self.g.me);
            c.group = Some(ranks.to_vec());
            let issued = Instant::now();
            let (flag, ctl, seq) = self.submit("new_group", &mut c, vec![], vec![], Some(reply_tx))?;
            let done = self.deadlined(flag, ctl, issued, "new_group", seq);
            let work = Work::new((), Arc::new(done), self.meta("new_group", seq), &self.counter);
            // Past the op deadline, so the completion decides (an abandoned split is one no rank
            // makes; a committed one is waited for), also for a split queued behind earlier ops
            // (its start may come up to the queued backstop after its issue).
            work.wait(concord_core::queued_op_backstop(self.op_timeout) + self.op_timeout * 2 + Duration::from_secs(1))?;
            let comms = reply_rx.recv().map_err(|_| backend_err(format!("new_group #{seq}: the progress thread gave no communicator")))?;
            let (Some((coll, p2p)), Some(pos)) = (comms, ranks.iter().position(|&r| r == self.g.me)) else { return Ok(None) };
            let label = format!("{}[{ranks:?}]", self.g.label);
            MpiBackend::start(Group { coll, p2p, n: ranks.len(), me: pos, label }, self.op_timeout).map(Some)
        }

        fn upload(&self, t: &Tensor) -> Result<MpiBuffer> {
            let b = MpiBuffer::new(t.dtype(), t.shape())?;
            b.write_bytes(t.bytes());
            Ok(b)
        }
        fn download(&self, b: &MpiBuffer) -> Result<Tensor> {
            let mut t = Tensor::zeros(b.dtype, &b.shape);
            t.bytes_mut().copy_from_slice(&b.read());
            Ok(t)
        }
        fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<MpiBuffer> {
            MpiBuffer::new(dtype, shape)
        }
        fn write(&self, b: &MpiBuffer, t: &Tensor) -> Result<()> {
            if t.dtype() != b.dtype || t.numel() != b.numel() {
                return Err(backend_err(format!("write of a {}{:?} tensor into a {}{:?} buffer", t.dtype(), t.shape(), b.dtype, b.shape)));
            }
            b.write_bytes(t.bytes());
            Ok(())
        }
        fn view(&self, b: &MpiBuffer, offset: usize, shape: &[usize]) -> Result<MpiBuffer> {
            let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if numel.and_then(|k| k.checked_add(offset)).is_none_or(|end| end > b.numel()) {
                return Err(backend_err(format!("view {shape:?} from element {offset} exceeds a buffer of {} elements", b.numel())));
            }
            Ok(MpiBuffer { mem: b.mem.clone(), off: b.off + offset * b.dtype.size(), dtype: b.dtype, shape: shape.to_vec() })
        }
        fn buffer_addr(&self, b: &MpiBuffer) -> usize {
            b.addr()
        }
        fn buffer_dtype(&self, b: &MpiBuffer) -> DType {
            b.dtype
        }
        fn buffer_shape(&self, b: &MpiBuffer) -> Vec<usize> {
            b.shape.clone()
        }

        fn all_reduce(&self, x: &MpiBuffer, op: ReduceOp) -> Result<Work<MpiBuffer>> {
            Ok(self.all_reduce_impl("all_reduce", std::slice::from_ref(x), op, Variant::Out)?.map(|mut v| v.remove(0)))
        }
        fn all_reduce_(&self, x: &MpiBuffer, op: ReduceOp) -> Result<Work<MpiBuffer>> {
            Ok(self.all_reduce_impl("all_reduce_", std::slice::from_ref(x), op, Variant::InPlace)?.map(|mut v| v.remove(0)))
        }
        fn all_reduce_coalesced(&self, xs: &[MpiBuffer], op: ReduceOp) -> Result<Work<Vec<MpiBuffer>>> {
            self.all_reduce_impl("all_reduce_coalesced", xs, op, Variant::Coalesced)
        }
        fn all_reduce_coalesced_(&self, xs: &[MpiBuffer], op: ReduceOp) -> Result<Work<Vec<MpiBuffer>>> {
            self.all_reduce_impl("all_reduce_coalesced_", xs, op, Variant::CoalescedInPlace)
        }

        fn all_gather_into_tensor(&self, x: &MpiBuffer) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &self.gathered_shape(x))?;
            let c = self.call(CallOp::AllGather, Variant::Out, &[x], &[&out]);
            self.issue("all_gather_into_tensor", c, vec![x.clone()], vec![out.clone()], out)
        }
        fn all_gather_into_tensor_out(&self, x: &MpiBuffer, out: &MpiBuffer) -> Result<Work<MpiBuffer>> {
            let c = self.call(CallOp::AllGather, Variant::OutBuf, &[x], &[out]);
            self.issue("all_gather_into_tensor_out", c, vec![x.clone()], vec![out.clone()], out.clone())
        }
        fn all_gather_into_tensor_coalesced(&self, xs: &[MpiBuffer]) -> Result<Work<Vec<MpiBuffer>>> {
            let outs: Vec<MpiBuffer> = xs.iter().map(|x| MpiBuffer::new(x.dtype, &self.gathered_shape(x))).collect::<Result<_>>()?;
            let c = self.call(CallOp::AllGather, Variant::Coalesced, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
            self.issue("all_gather_into_tensor_coalesced", c, xs.to_vec(), outs.clone(), outs)
        }

        fn reduce_scatter_tensor(&self, x: &MpiBuffer, op: ReduceOp) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &self.scattered_shape(x))?;
            Ok(self
                .reduce_scatter_impl("reduce_scatter_tensor", std::slice::from_ref(x), op, Variant::Out, vec![out])?
                .map(|mut v| v.remove(0)))
        }
        fn reduce_scatter_tensor_out(&self, x: &MpiBuffer, op: ReduceOp, out: &MpiBuffer) -> Result<Work<MpiBuffer>> {
            Ok(self
                .reduce_scatter_impl("reduce_scatter_tensor_out", std::slice::from_ref(x), op, Variant::OutBuf, vec![out.clone()])?
                .map(|mut v| v.remove(0)))
        }
        fn reduce_scatter_tensor_coalesced(&self, xs: &[MpiBuffer], op: ReduceOp) -> Result<Work<Vec<MpiBuffer>>> {
            let outs: Vec<MpiBuffer> = xs.iter().map(|x| MpiBuffer::new(x.dtype, &self.scattered_shape(x))).collect::<Result<_>>()?;
            self.reduce_scatter_impl("reduce_scatter_tensor_coalesced", xs, op, Variant::Coalesced, outs)
        }

        fn all_to_all_single(
            &self,
            x: &MpiBuffer,
            output_splits: Option<&[usize]>,
            input_splits: Option<&[usize]>,
        ) -> Result<Work<MpiBuffer>> {
            let n = self.g.n;
            let rows = match (output_splits, x.shape.first()) {
                // A sum that overflows is the rule table's to reject (named, on every rank):
                // the placeholder output is never used.
                (Some(s), _) => s.iter().try_fold(0usize, |a, &b| a.checked_add(b)).unwrap_or(0),
                (None, Some(&d0)) => d0 / n * n,
                (None, None) => 0,
            };
            let shape: Vec<usize> =
                if x.shape.is_empty() { vec![] } else { std::iter::once(rows).chain(x.shape[1..].iter().copied()).collect() };
            let out = MpiBuffer::new(x.dtype, &shape)?;
            let mut c = self.call(CallOp::AllToAll, Variant::Out, &[x], &[&out]);
            c.in_splits = input_splits.map(|s| s.to_vec());
            c.out_splits = output_splits.map(|s| s.to_vec());
            self.issue("all_to_all_single", c, vec![x.clone()], vec![out.clone()], out)
        }

        fn broadcast(&self, x: &MpiBuffer, src: usize) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &x.shape)?;
            let mut c = self.call(CallOp::Broadcast, Variant::Out, &[x], &[&out]);
            c.root = Some(src);
            self.issue("broadcast", c, vec![x.clone()], vec![out.clone()], out)
        }
        fn broadcast_(&self, x: &MpiBuffer, src: usize) -> Result<Work<MpiBuffer>> {
            let mut c = self.call(CallOp::Broadcast, Variant::InPlace, &[x], &[x]);
            c.root = Some(src);
            self.issue("broadcast_", c, vec![x.clone()], vec![x.clone()], x.clone())
        }
        fn permute_tensor(&self, x: &MpiBuffer, src_dst: &[usize]) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &x.shape)?;
            let mut c = self.call(CallOp::Permute, Variant::Out, &[x], &[&out]);
            c.perm = Some(src_dst.to_vec());
            self.issue("permute_tensor", c, vec![x.clone()], vec![out.clone()], out)
        }
        fn reduce(&self, x: &MpiBuffer, op: ReduceOp, root: usize) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &x.shape)?;
            let mut c = self.call(CallOp::Reduce, Variant::Out, &[x], &[&out]);
            c.reduce = Some(op);
            c.root = Some(root);
            self.issue("reduce", c, vec![x.clone()], vec![out.clone()], out)
        }
        fn gather(&self, x: &MpiBuffer, root: usize) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &self.gathered_shape(x))?;
            let mut c = self.call(CallOp::Gather, Variant::Out, &[x], &[&out]);
            c.root = Some(root);
            self.issue("gather", c, vec![x.clone()], vec![out.clone()], out)
        }
        fn scatter(&self, x: &MpiBuffer, root: usize) -> Result<Work<MpiBuffer>> {
            let out = MpiBuffer::new(x.dtype, &self.scattered_shape(x))?;
            let mut c = self.call(CallOp::Scatter, Variant::Out, &[x], &[&out]);
            c.root = Some(root);
            self.issue("scatter", c, vec![x.clone()], vec![out.clone()], out)
        }

        fn send(&self, x: &MpiBuffer, dst: usize) -> Result<Work<()>> {
            let d = self.check_p2p(CallOp::Send, x, dst)?;
            self.p2p(d, x.clone(), dst, ())
        }
        fn recv(&self, out: &MpiBuffer, src: usize) -> Result<Work<MpiBuffer>> {
            let d = self.check_p2p(CallOp::Recv, out, src)?;
            self.p2p(d, out.clone(), src, out.clone())
        }
        fn barrier(&self) -> Result<Work<()>> {
            let c = CallDesc::new(CallOp::Barrier, Variant::Out, self.g.me);
            self.issue("barrier", c, vec![], vec![], ())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A job of `op` on rank `me` whose input claims `shape` of `dtype` (its memory is one
        /// byte: these tests never read it).
        fn job(op: CallOp, me: usize, dtype: DType, shape: &[usize], in_splits: Option<Vec<usize>>) -> Job {
            let one = MpiBuffer::new(DType::U8, &[1]).unwrap();
            let x = MpiBuffer { mem: one.mem.clone(), off: 0, dtype, shape: shape.to_vec() };
            let mut call = CallDesc::new(op, Variant::Out, me);
            call.inputs = vec![x.desc()];
            call.in_splits = in_splits;
            Job { name: op.name().into(), call, ins: vec![x], outs: vec![], flag: Flag::new(), ctl: Default::default(), reply: None }
        }

        #[test]
        fn all_to_all_counts_are_checked_against_mpi_int_before_the_vote() {
            // 2 ranks, rows of 3 f32 (12 bytes); rank 0 sends 1 row to itself and 3 to rank 1.
            let (a, b) = (
                job(CallOp::AllToAll, 0, DType::F32, &[4, 3], Some(vec![1, 3])),
                job(CallOp::AllToAll, 1, DType::F32, &[2, 3], Some(vec![2, 0])),
            );
            let descs = [a.call.clone(), b.call.clone()];
            assert_eq!(alltoall_counts(&a, &descs, 0, 2).unwrap(), (vec![12, 36], vec![12, 24]));
            assert_eq!(alltoall_counts(&b, &descs, 1, 2).unwrap(), (vec![24, 0], vec![36, 0]));
            // Rows of 2^28 f64 = 2^31 bytes: one row to rank 1 does not fit an int count. Only this
            // rank's side is over the limit (its peer's counts may fit): it must say so in the vote.
            let big = job(CallOp::AllToAll, 0, DType::F64, &[2, 1 << 28], Some(vec![0, 1]));
            let small = job(CallOp::AllToAll, 1, DType::F64, &[0, 1 << 28], Some(vec![0, 0]));
            let descs = [big.call.clone(), small.call.clone()];
            let e = alltoall_counts(&big, &descs, 0, 2).unwrap_err();
            assert!(e.contains("send count for rank 1") && e.contains("2147483648 bytes"), "{e}");
            let e = alltoall_counts(&small, &descs, 1, 2).unwrap_err();
            assert!(e.contains("receive count for rank 0"), "{e}");
            // An offset over the limit with every count under it.
            let offs = job(CallOp::AllToAll, 0, DType::U8, &[3, 1 << 30], Some(vec![1, 1, 1]));
            let descs = [offs.call.clone(), offs.call.clone(), offs.call.clone()];
            let e = alltoall_counts(&offs, &descs, 0, 3).unwrap_err();
            assert!(e.contains("send offset for rank 2") && e.contains("2147483648 bytes"), "{e}");
        }

        #[test]
        fn a_wait_past_the_op_deadline_ends_at_the_callers_timeout() {
            // Committed at the op deadline (the outputs are being written): a waiter with a
            // 100 ms timeout gets "not complete" at 100 ms, not a second later.
            let ctl = Arc::new(Mutex::new(Ctl { started: Some(Instant::now()), abandoned: false, committed: true }));
            let d = Deadlined {
                flag: Flag::new(),
                ctl,
                issued: Instant::now(),
                moved: Arc::new(Mutex::new(Instant::now())),
                op_timeout: Duration::from_millis(20),
                what: ("all_reduce".into(), 7, 1),
            };
            let t0 = Instant::now();
            assert!(!d.wait_for(Duration::from_millis(100)).unwrap());
            let took = t0.elapsed();
            assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(600), "{took:?}");
            // Not committed: the op deadline ends it with a named timeout (rank, op, seq).
            let ctl = Arc::new(Mutex::new(Ctl { started: Some(Instant::now()), abandoned: false, committed: false }));
            let d = Deadlined {
                flag: Flag::new(),
                ctl: ctl.clone(),
                issued: Instant::now(),
                moved: Arc::new(Mutex::new(Instant::now())),
                op_timeout: Duration::from_millis(20),
                what: ("all_reduce".into(), 8, 1),
            };
            match d.wait_for(Duration::from_secs(5)) {
                Err(CollectiveError::Timeout { op, seq, rank, .. }) => assert_eq!((op.as_str(), seq, rank), ("all_reduce", 8, 1)),
                other => panic!("{other:?}"),
            }
            assert!(ctl.lock().unwrap().abandoned);
        }

        #[test]
        fn a_job_still_queued_ends_at_the_queued_backstop() {
            // Never taken by the progress thread (queued behind a stuck op, the queue not moving
            // since before its issue): three op timeouts from the issue (review15 finding 5b),
            // not the caller's 5 s.
            let ctl = Arc::new(Mutex::new(Ctl::default()));
            let op_timeout = Duration::from_millis(40);
            let issued = Instant::now();
            let moved = Arc::new(Mutex::new(issued - Duration::from_secs(1)));
            let d = Deadlined { flag: Flag::new(), ctl: ctl.clone(), issued, moved, op_timeout, what: ("all_reduce".into(), 9, 0) };
            match d.wait_for(Duration::from_secs(5)) {
                Err(CollectiveError::Timeout { op, seq, rank, detail, .. }) => {
                    assert_eq!((op.as_str(), seq, rank), ("all_reduce", 9, 0));
                    assert!(detail.contains("never started"), "{detail}");
                }
                other => panic!("{other:?}"),
            }
            let took = issued.elapsed();
            let by = concord_core::queued_op_backstop(op_timeout);
            assert!(took >= by && took < by + Duration::from_millis(500), "{took:?}, backstop {by:?}");
            assert!(ctl.lock().unwrap().abandoned, "a queued op given up is abandoned: its vote stops every rank");
            // Taken just before the backstop: its own op deadline counts from its start.
            let ctl = Arc::new(Mutex::new(Ctl::default()));
            let issued = Instant::now() - by + Duration::from_millis(10);
            ctl.lock().unwrap().started = Some(Instant::now());
            let d = Deadlined {
                flag: Flag::new(),
                ctl,
                issued,
                moved: Arc::new(Mutex::new(issued)),
                op_timeout,
                what: ("all_reduce".into(), 10, 0),
            };
            let t0 = Instant::now();
            assert!(matches!(d.wait_for(Duration::from_secs(5)), Err(CollectiveError::Timeout { .. })));
            assert!(t0.elapsed() >= op_timeout, "{:?}", t0.elapsed());
            // Queued long behind healthy ops (the queue moved just now): not given up, however
            // long ago it was issued.
            let ctl = Arc::new(Mutex::new(Ctl::default()));
            let issued = Instant::now() - 10 * by;
            let d = Deadlined {
                flag: Flag::new(),
                ctl: ctl.clone(),
                issued,
                moved: Arc::new(Mutex::new(Instant::now())),
                op_timeout,
                what: ("all_reduce".into(), 11, 0),
            };
            assert!(!d.wait_for(by / 2).unwrap(), "a queue that moves keeps its queued ops");
            assert!(!ctl.lock().unwrap().abandoned);
        }

        #[test]
        fn integers_widen_and_average_in_their_width() {
            // i8 -3 sign-extends; u8 250 zero-extends.
            assert_eq!(widen(DType::I8, &[0xfd]), vec![u64::MAX - 2]);
            assert_eq!(widen(DType::U8, &[250]), vec![250]);
            // avg of a wrapped sum truncates toward zero: (-7) / 2 = -3.
            let mut b = (-7i16).to_le_bytes().to_vec();
            int_div(DType::I16, &mut b, 2);
            assert_eq!(i16::from_le_bytes([b[0], b[1]]), -3);
        }

        #[test]
        fn floats_round_once_and_min_max_order_signed_zeros_and_nan() {
            // f16: 1 + 2^-11 + 2^-24 rounds once to 0x3C01 (not to 1.0 as two roundings would).
            assert_eq!(from_f64(DType::F16, &[1.0 + 2f64.powi(-11) + 2f64.powi(-24)]), 0x3C01u16.to_le_bytes().to_vec());
            assert_eq!(to_f64(DType::BF16, &half::bf16::from_f32(1.5).to_bits().to_le_bytes(), 2.0), vec![3.0]);
            assert!(crate::sys::fmin(0.0, -0.0).is_sign_negative() && crate::sys::fmax(-0.0, 0.0).is_sign_positive());
            assert!(crate::sys::fmin(1.0, f64::NAN).is_nan() && crate::sys::fmax(f64::NAN, 1.0).is_nan());
        }
    }
}
