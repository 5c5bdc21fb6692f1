//! # concord-shm
//!
//! **One job:** the embedded default [`Backend`]: a real multi-process collective backend for
//! ranks on one machine, over POSIX shared memory.
//!
//! ## Design
//! * **Arenas.** Each rank owns one large sparse segment (`concord-<world_id>-r<rank>`, size
//!   from the `shm_arena_gib` option, default 16 GiB of address space; pages are only backed
//!   when used). Every [`ShmBuffer`] (and every view) is a block of its owner's arena, and every
//!   rank maps every arena once at init, so peers read and write each other's buffers directly.
//!   A block new to a process is mapped into it in one `madvise(MADV_POPULATE_WRITE)` (the
//!   owner at allocation, a peer when an op first touches it) instead of one page fault per
//!   4 KiB page; blocks are recycled through a free list, so steady-state ops touch no new page.
//! * **Data path** (`exec.rs` `execute`, `kernels.rs`): nothing is staged; every op reads
//!   its sources where they lie and writes each result once, into its destination.
//!   all_reduce: rank r reduces its 1/n slice of every tensor, reading all n inputs, in blocks
//!   of 2048 elements (8 KiB of f32, so a reduced block is still in L1 when it is copied out)
//!   and writes each block into all n outputs (non-temporal stores from 1 MiB of output): one
//!   pass over memory, each rank reading and writing `S` bytes (one memcpy's worth, all ranks at
//!   once), then the final barrier. reduce_scatter: each rank its slice into its own output;
//!   reduce: its slice into the root's output; all_gather, broadcast, all_to_all, gather,
//!   scatter, permute: each rank copies (memmove) what it needs into its own output.
//!   Kernels: f32 / f64 / integers combine in their own type straight from the inputs; f16 /
//!   bf16 load exactly into f64 lanes and round once at the store (to odd in f32, then to
//!   nearest even, which equals `concord_core::dtype::round_f64_to_bits`); all loops are
//!   element-wise over blocks, which LLVM vectorises.
//! * **Control segment** per communicator: per-rank slots (barrier counter used as a futex word,
//!   pid, the location of the rank's current *post*) and per-pair point-to-point rings.
//! * **Posts and validation.** For each collective a rank posts its call's
//!   [`concord_core::CallDesc`] and its buffer locations; after a barrier every rank validates
//!   every rank's call with the core rule table ([`concord_core::validate_all`]), so bad input
//!   ends in the *same* named [`CollectiveError::BadInput`] on every rank (in the table's
//!   precedence), and the communicator stays usable. Send / recv: the receiver checks the pair
//!   with [`concord_core::validate_pair`] and posts the verdict back to the sender.
//! * **The engine and who runs it.** Per backend instance, the progress state (`exec::Progress`)
//!   sits behind a lock (`exec::Engine`) held by one thread at a time: the progress thread, or
//!   a caller that runs its own collective inline. Ops run one at a time, in issue order,
//!   whoever runs them. A caller whose `wait(t)` is long enough (`t` ≥ the op deadline + 1/16 of it, at least 50 ms,
//!   so the op's waits end before `t`), whose op carries no injected fault, and who finds the
//!   engine free and its op next in issue order runs the op on its own thread
//!   (`exec::CollWork`): no hand-off to the progress thread and back, the common case of the
//!   sync call (issue, then wait). Every other op — a short wait, a poll, no wait at all — is
//!   run by the progress thread: a collective's issue does not wake it from a *light* sleep
//!   (5 ms ticks for 50 ms after the last issue, `jobs`), only from a deep one; a poll
//!   (`is_completed`) or a wait that does not run the op inline wakes it at once; a
//!   point-to-point issue always does. So an op progresses without a wait (within a tick), and
//!   [`Work`] completes through a [`concord_core::Flag`] either way.
//! * **Waits** spin 30 µs (only when the ranks fit on the CPUs), then yield the CPU between looks
//!   for 300 µs, then sleep on the futex: a barrier between two ranks that arrive within that
//!   window costs no wake-up (a sleeping rank takes 50-150 µs to wake on a loaded 2-core VM).
//!   The windows count from the start of the whole wait: one per barrier, not one per late peer
//!   or per slice of a collective that waits for its peers in 2 ms slices (to serve
//!   point-to-point ops issued meanwhile).
//! * **Deadlines.** Every wait has the op deadline ([`WorldInfo::op_timeout`]), counted from
//!   the moment the engine (the progress thread or an inline caller) starts the op, for the
//!   peers' arrival; once every rank has arrived, the op's later steps (validation, data
//!   movement, the final barrier) get one op timeout of their own from then (never past an
//!   inline caller's wait): an op every rank entered in time never fails for lateness; expiry
//!   gives [`CollectiveError::Timeout`], a peer whose process is gone (or whose backend was
//!   dropped) gives
//!   [`CollectiveError::PeerDied`]; either poisons the communicator (later ops fail fast with
//!   [`CollectiveError::Aborted`], and peers stop waiting). A failure after posting may add at
//!   most one more op deadline, spent waiting for peers that are *inside* their data movement
//!   (see Failures). Liveness is an open-file-description lock each rank holds on its byte of
//!   the control segment (released by the kernel however the process ends): no pid is trusted
//!   (pid reuse, pid namespaces).
//! * **Failures** (issue 15). *Which thread does what:* only the engine's holder (the progress
//!   thread, or a caller running its own op inline) touches peers' memory, one at a time; a
//!   panic in an op is caught on either thread and becomes a named error that poisons the
//!   communicator; dropping the backend stops the progress thread, which takes the engine
//!   before it ends (so no inline op is still running), and *joins* it before marking the rank
//!   gone. An inline op that fails closes its memory like any other; if a peer still touches
//!   it when the caller's wait must return, the close is left to the progress thread, the wait
//!   returns a timeout, and the op completes with its failure once the close is done. *When memory may be freed:* a rank's post and the
//!   op's buffers are exposed from the moment its barrier counter is raised; peers *claim* a
//!   rank's memory (a bit in its slot) before touching it and only while the rank keeps it open
//!   for that op; a rank whose op fails after posting *closes* (no new claim succeeds) and waits
//!   for the claims in progress, so once its wait returns nobody touches its buffers — they are
//!   the caller's again. If a peer still holds a claim one op deadline later (stopped in the
//!   middle of a copy), the op's blocks are *quarantined* (never reused until the world is torn
//!   down) and the event is printed. The abort word is checked after the post barrier and before
//!   the data movement. A send whose wait fails *withdraws* its message; if the receiver has
//!   claimed it (it is copying), the sender waits for the copy — one op deadline after a failure,
//!   up to the caller's deadline past the op deadline — and then withdraws it even so: the
//!   receiver sets its verdict after the copy only if the message is still claimed, and
//!   otherwise fails with a named `aborted` (shmrace: a receiver stalled between claim and copy
//!   copied the bytes the caller wrote after its send had failed, `Ok`); a posted send whose receiver has not
//!   claimed it one op deadline after it was posted fails so, with a timeout, at its next wait
//!   or poll (`exec::SendCompletion::expire`: it used to stay posted, so a caller told "timeout"
//!   reused its buffer and a late receiver got the new bytes, `Ok`). *What a deadline covers:* the arrival of
//!   every peer at each barrier of the op; not a peer's data movement once started. *A local
//!   failure* (an injected `fail` at any point of a collective, a post it cannot allocate, an
//!   out-of-place op's output it cannot allocate at issue: the op is numbered first, and its
//!   steps go out marked failed, never posted; the issue returns the allocator's error) does
//!   not poison: the failing rank marks the op failed in its slot, publishes the op's last step,
//!   closes, and its wait returns its own error; its peers see the mark (after the first barrier,
//!   at a refused claim, or after the last barrier), pass the last barrier and end the op with a
//!   named `aborted` error naming the failed rank; every rank goes on in step, and the failing
//!   rank's next collective first waits (its deadline) for the peers to leave the failed op
//!   (`ctl`, "Local failures"); a `new_group` (three steps: its members open the group's segment
//!   between the last two) is no exception: the failing rank publishes all three, its peers pass
//!   as many, and the group's number is given back on every rank (shmrace). Timeouts, dead
//!   peers and panics still poison.
//! * **Fault injection** (option `fault`, [`concord_core::fault`]): a rank stalls, fails,
//!   panics or dies at `after_post` (post published, before waiting; a send: its ring entry
//!   written, before it is published, and a failure there publishes it withdrawn, so the
//!   receiver fails in step and never copies it: review15 finding 3), `between_barriers`
//!   (after validation, before claiming) or `progress_thread` (claims held, before the first
//!   copy; a receive: before copying the message) of its n-th op (collectives, sends, receives
//!   and `new_group` counted from 0), on the world or on a group it made (`/G`); `alloc_output:fail`
//!   makes the arena refuse an out-of-place op's output as full (`arena::World::alloc_in`); listed by `Backend::fault_hooks`. `shm_canary=1` fills freed blocks with a canary and checks
//!   it when they are reused and at teardown (`backends/shm/tests/campaign.rs`).
//! * **Cleanup.** Segment names start with `concord_core::world_prefix(world_id)`.
//!   They are unlinked as soon as every rank has mapped them (right after init / `new_group`),
//!   and until then a SIGTERM handler and an atexit hook unlink them.
//!
//! ## Contract
//! Declared in [`ShmBackend::capabilities`]: all 12 dtypes, every op and reduce op, world sizes
//! 1..=64, NaN propagates through min/max, integer avg truncates (of the wrapped sum), aliasing
//! of an output with an input (other than in-place ops) is rejected with `bad_input:aliasing`.
//! Point-to-point: the k-th `send(x, dst)` of a rank matches the k-th `recv(out, src)` of `dst`
//! from it; a send completes once the receiver has copied the data; a size or dtype mismatch is
//! reported on both sides. The send buffer MUST not be modified until the send completes.
//! Results of `reduce` / `gather` are defined on the root only (other ranks' outputs keep their
//! unspecified contents).

mod arena;
mod ctl;
mod exec;
mod fused;
mod jobs;
mod kernels;
mod post;
mod sys;

use arena::{Block, World};
use concord_core::{
    fault, progress, validate_local, Backend, CallDesc, CallOp, Capabilities, CollectiveError, DType, Flag, OutstandingCounter, ReduceOp,
    Result, Tensor, TensorDesc, Variant, Work, WorkMeta, WorldInfo,
};
use concord_store::Store;
use exec::{CollWork, Comm, Engine, Job, Progress, SendCompletion};
use post::Post;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use sys::{Mapping, Region};

/// Largest world (and subgroup) the backend runs.
pub const MAX_WORLD_SIZE: usize = 64;

/// What the backend declares (and validates calls against) on communicator `comm`: its chosen
/// reduction semantics ([`kernels::Chosen`]) and, under `rounding=every_step`, the ulps its size
/// needs.
fn caps(comm: &Comm) -> Capabilities {
    let mut c = Capabilities { fused: concord_core::FusedImpl::Pipelined, ..Capabilities::full(MAX_WORLD_SIZE) };
    comm.chosen.declare(&mut c, comm.n);
    c
}

/// The fault points the backend honours (every action at each).
const FAULT_POINTS: [&str; 3] = [fault::point::AFTER_POST, fault::point::BETWEEN_BARRIERS, fault::point::PROGRESS_THREAD];

/// A buffer in shared memory: a block of its owner's arena, or a view into one.
#[derive(Clone)]
pub struct ShmBuffer {
    block: Arc<Block>,
    byte_off: usize,
    dtype: DType,
    shape: Vec<usize>,
}

impl ShmBuffer {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    fn desc(&self) -> post::Desc {
        post::Desc { off: (self.block.off + self.byte_off) as u64, dtype: self.dtype, shape: self.shape.clone() }
    }
    fn region(&self) -> Region {
        self.block.world.region(self.block.world.global_rank, self.block.off + self.byte_off, self.nbytes())
    }
}

/// The mutation campaign's hook (feature `campaign`, turned on by `concord-mutants` only): a
/// buffer over the same bytes as `b` that does not keep them allocated (a raw pointer / arena
/// offset instead of an owning handle). Once every owning handle is dropped the bytes go back to
/// the free list and the next allocation may get them: an op still reading through this handle
/// reads whatever was written there since. Never used by shm itself.
#[cfg(feature = "campaign")]
impl ShmBuffer {
    pub fn unowned(&self) -> ShmBuffer {
        ShmBuffer { block: Arc::new(self.block.unowned()), byte_off: self.byte_off, dtype: self.dtype, shape: self.shape.clone() }
    }
    /// The same bytes under another dtype and shape (the same byte count): for the mutants
    /// (`review18_movers_compare_widths` moves data as the unsigned integer of its width).
    pub fn retyped(&self, dtype: DType, shape: &[usize]) -> ShmBuffer {
        ShmBuffer { block: self.block.clone(), byte_off: self.byte_off, dtype, shape: shape.to_vec() }
    }
}

impl std::fmt::Debug for ShmBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShmBuffer<{}>{:?}@{:#x}", self.dtype, self.shape, self.region().addr())
    }
}

/// The shared-memory backend (one instance per rank and per subgroup).
pub struct ShmBackend {
    comm: Arc<Comm>,
    tx: Mutex<Option<jobs::Sender<Job>>>,
    engine: Arc<Engine>,
    thread: Mutex<Option<JoinHandle<()>>>,
    seq: Mutex<u64>,
    send_k: Mutex<Vec<u32>>,
    recv_k: Mutex<Vec<u32>>,
    counter: OutstandingCounter,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> CollectiveError + '_ {
    move |e| CollectiveError::Backend(format!("shm backend: {what}: {e}"))
}

/// Unlinks the named segments on drop unless disarmed (error paths of init).
struct UnlinkGuard(Vec<String>);
impl Drop for UnlinkGuard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = sys::unlink(n);
            sys::unregister_cleanup(n);
        }
    }
}

impl ShmBackend {
    fn start(comm: Comm) -> Result<ShmBackend> {
        let comm = Arc::new(comm);
        let (tx, rx) = jobs::channel();
        let engine = Engine::new(Progress::new(comm.clone()), rx);
        let e = engine.clone();
        let thread = std::thread::Builder::new()
            .name(format!("concord-shm-{}", comm.label))
            .spawn(move || Progress::run(e))
            .map_err(io_err("cannot start the progress thread"))?;
        let n = comm.n;
        Ok(ShmBackend {
            comm,
            tx: Mutex::new(Some(tx)),
            engine,
            thread: Mutex::new(Some(thread)),
            seq: Mutex::new(0),
            send_k: Mutex::new(vec![0; n]),
            recv_k: Mutex::new(vec![0; n]),
            counter: OutstandingCounter::default(),
        })
    }

    /// Publishes this rank's pid in the control segment, then the init barrier (step 1).
    fn join_ctl(ctl: &ctl::Ctl, op_timeout: std::time::Duration, rank: usize) -> Result<()> {
        ctl.join().map_err(io_err("cannot take the liveness lock on the control segment"))?;
        let started = Instant::now();
        let no_abort = AtomicBool::new(false);
        ctl.barrier(1, started + op_timeout, &no_abort).map_err(|e| match e {
            ctl::WaitErr::Timeout { peer } => CollectiveError::Timeout {
                op: "init".into(),
                seq: 0,
                rank,
                waited_ms: started.elapsed().as_millis() as u64,
                detail: format!("shm backend: rank {peer} did not join the control segment"),
            },
            ctl::WaitErr::Dead { peer, detail } => CollectiveError::PeerDied { op: "init".into(), seq: 0, rank, peer, detail },
            ctl::WaitErr::Aborted(m) => CollectiveError::Aborted(format!("init on rank {rank}: {m}")),
        })
    }

    fn check_buf(&self, b: &ShmBuffer) -> Result<()> {
        if Arc::ptr_eq(&b.block.world, &self.comm.world) {
            Ok(())
        } else {
            Err(CollectiveError::Backend(format!(
                "shm backend rank {}: buffer {b:?} belongs to another world (world {})",
                self.comm.me, b.block.world.world_id
            )))
        }
    }

    /// Issue-time checks of a send / recv: the buffer's world, then the rule table's local rules.
    fn check_p2p(&self, op: CallOp, b: &ShmBuffer, peer: usize) -> Result<()> {
        self.check_buf(b)?;
        let d = CallDesc::p2p(op, self.comm.me, TensorDesc::new(b.dtype, &b.shape), peer);
        validate_local(&d, self.comm.n, &caps(&self.comm)).map_err(|e| e.into_error(op.name(), 0, self.comm.me))
    }

    fn meta(&self, op: &str, seq: u64) -> WorkMeta {
        WorkMeta { backend: "shm".into(), op: op.to_string(), seq, rank: self.comm.me }
    }

    fn submit(&self, job: Job) -> Result<()> {
        self.submit_as(job, true)
    }

    /// Queues `job`; `urgent`: wake the progress thread from any sleep (else only from a deep
    /// one: a collective its caller will probably run inline, see [`CollWork`]).
    fn submit_as(&self, job: Job, urgent: bool) -> Result<()> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let tx = tx.as_ref().ok_or_else(|| CollectiveError::Aborted("shm backend is shutting down".into()))?;
        if urgent { tx.send(job) } else { tx.send_quiet(job) }
            .map_err(|_| CollectiveError::Aborted("shm backend progress thread is gone".into()))
    }

    /// Queues a collective and returns its completion ([`CollWork`]).
    fn submit_coll(&self, job: Job, flag: Arc<Flag>, fault: bool) -> Result<Arc<CollWork>> {
        self.submit_as(job, fault)?;
        Ok(Arc::new(CollWork { flag, engine: self.engine.clone(), inline: !fault }))
    }

    /// Issues a collective on the caller's buffers (an in-place or `_out` op: nothing to
    /// allocate): [`ShmBackend::issue_new`] with no output.
    fn issue<T>(&self, name: &str, post: Post, keep: Vec<ShmBuffer>, value: T) -> Result<Work<T>> {
        for b in &keep {
            self.check_buf(b)?;
        }
        self.issue_new(name, &[], &[], move |_| (post, keep, value))
    }

    /// Issues a collective over the caller's buffers `ins`: assigns the sequence number,
    /// allocates the outputs the backend makes for it (`outs`: dtype and shape of each, in
    /// order; `build` makes the post, the buffers the op keeps and the caller's value from them)
    /// and queues it, atomically in issue order. An output that cannot be allocated (the arena
    /// or `/dev/shm` is full, or the fault `alloc_output:fail`) is a *local failure at issue*
    /// (clause `faults.local_failure_named_everywhere`): the op keeps its number and goes to the
    /// engine failed, which marks it failed and publishes its steps without a post, as for a
    /// post it cannot allocate (`exec`), so every peer ends it with a named error and the ranks
    /// stay in step; this rank's issue returns the allocator's error. (Returning before the op
    /// was numbered left the peers waiting to their deadline, then paired this rank's next op
    /// with theirs.)
    fn issue_new<T>(
        &self,
        name: &str,
        ins: &[&ShmBuffer],
        outs: &[(DType, &[usize])],
        build: impl FnOnce(Vec<ShmBuffer>) -> (Post, Vec<ShmBuffer>, T),
    ) -> Result<Work<T>> {
        for b in ins {
            self.check_buf(b)?;
        }
        let flag = Flag::new();
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        progress::begin(&self.comm.label, name, *seq);
        let fault = self.comm.next_fault();
        let full = fault.as_ref().is_some_and(|f| f.point == fault::point::ALLOC_OUTPUT && f.action == fault::Action::Fail);
        let made: Result<Vec<ShmBuffer>> = outs.iter().map(|&(dtype, shape)| self.new_buf_in(dtype, shape, full)).collect();
        let (mut post, keep, value) = match made {
            Ok(bufs) => build(bufs),
            Err(e) => {
                let why = match e {
                    CollectiveError::Backend(m) => m,
                    e => e.to_string(),
                };
                let e = CollectiveError::Backend(format!("{name} #{} on rank {}: cannot allocate its output: {why}", *seq, self.comm.me));
                // Never posted (`failed`): the engine publishes the op's steps marked failed.
                let mut post = Post::new(CallOp::Barrier, Variant::Out, self.comm.me, vec![], vec![]);
                post.call.seq = *seq;
                let job = Job::Coll { name: name.to_string(), post, keep: vec![], flag, reply: None, fault, failed: Some(e.clone()) };
                self.submit(job)?;
                return Err(e);
            }
        };
        post.call.seq = *seq;
        let faulty = fault.is_some();
        let job = Job::Coll { name: name.to_string(), post, keep, flag: flag.clone(), reply: None, fault, failed: None };
        let c = self.submit_coll(job, flag, faulty)?;
        Ok(Work::new(value, c, self.meta(name, *seq), &self.counter))
    }

    fn new_buf(&self, dtype: DType, shape: &[usize]) -> Result<ShmBuffer> {
        self.new_buf_in(dtype, shape, false)
    }

    /// A fresh buffer; `full`: the arena refuses it as full (the fault `alloc_output:fail`).
    fn new_buf_in(&self, dtype: DType, shape: &[usize], full: bool) -> Result<ShmBuffer> {
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| CollectiveError::Backend(format!("shm backend: a {dtype}{shape:?} buffer does not fit in the address space")))?;
        let block = self.comm.world.alloc_in(bytes, full).map_err(|e| {
            CollectiveError::Backend(if full { format!("{e} (the fault alloc_output:fail made the arena answer as full)") } else { e })
        })?;
        Ok(ShmBuffer { block: Arc::new(block), byte_off: 0, dtype, shape: shape.to_vec() })
    }

    fn post_of(&self, op: CallOp, variant: Variant, ins: &[&ShmBuffer], outs: &[&ShmBuffer]) -> Post {
        Post::new(op, variant, self.comm.me, ins.iter().map(|b| b.desc()).collect(), outs.iter().map(|b| b.desc()).collect())
    }

    fn gathered_shape(&self, x: &ShmBuffer) -> Vec<usize> {
        let n = self.comm.n;
        match x.shape.split_first() {
            None => vec![n],
            Some((d0, rest)) => std::iter::once(d0 * n).chain(rest.iter().copied()).collect(),
        }
    }
    fn scattered_shape(&self, x: &ShmBuffer) -> Vec<usize> {
        match x.shape.split_first() {
            None => vec![],
            Some((d0, rest)) => std::iter::once(d0 / self.comm.n).chain(rest.iter().copied()).collect(),
        }
    }

    /// Issues an all_reduce of `xs` (every variant): the outputs are `xs` in place, else new.
    fn all_reduce_impl(&self, name: &str, xs: &[ShmBuffer], op: ReduceOp, variant: Variant) -> Result<Work<Vec<ShmBuffer>>> {
        let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
        let new: Vec<(DType, &[usize])> = if in_place { vec![] } else { xs.iter().map(|x| (x.dtype, &x.shape[..])).collect() };
        self.issue_new(name, &xs.iter().collect::<Vec<_>>(), &new, |made| {
            let outs = if in_place { xs.to_vec() } else { made };
            let mut p = self.post_of(CallOp::AllReduce, variant, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
            p.call.reduce = Some(op);
            let keep = xs.iter().chain(outs.iter()).cloned().collect();
            (p, keep, outs)
        })
    }

    /// Issues an op of one input `x` whose one output the backend allocates (`dtype` of `x`,
    /// `shape`); `set` fills in the post's parameters (reduce op, root, splits...).
    fn issue_one(&self, name: &str, op: CallOp, x: &ShmBuffer, shape: &[usize], set: impl FnOnce(&mut Post)) -> Result<Work<ShmBuffer>> {
        self.issue_new(name, &[x], &[(x.dtype, shape)], |mut made| {
            let out = made.remove(0);
            let mut p = self.post_of(op, Variant::Out, &[x], &[&out]);
            set(&mut p);
            (p, vec![x.clone(), out.clone()], out)
        })
    }

    /// Issues a coalesced op over `xs` whose outputs the backend allocates (`shape` of each).
    fn issue_coalesced(
        &self,
        name: &str,
        op: CallOp,
        xs: &[ShmBuffer],
        shape: impl Fn(&ShmBuffer) -> Vec<usize>,
        set: impl FnOnce(&mut Post),
    ) -> Result<Work<Vec<ShmBuffer>>> {
        let shapes: Vec<Vec<usize>> = xs.iter().map(&shape).collect();
        let new: Vec<(DType, &[usize])> = xs.iter().zip(&shapes).map(|(x, s)| (x.dtype, &s[..])).collect();
        self.issue_new(name, &xs.iter().collect::<Vec<_>>(), &new, |outs| {
            let mut p = self.post_of(op, Variant::Coalesced, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
            set(&mut p);
            (p, xs.iter().chain(&outs).cloned().collect(), outs)
        })
    }
}

/// This machine as the shm backend tells hosts apart: the UTS hostname and the kernel's boot id
/// (two machines may share a hostname; two UTS namespaces of one machine do not).
fn host_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{} (boot {})", host.trim(), boot.trim())
}

impl Drop for ShmBackend {
    /// Stops the progress thread (every wait gives up, queued ops fail), joins it — so that
    /// nothing of this rank touches a peer's memory any more — and only then marks the rank gone
    /// (issue 15 item 7: marking it gone first let a sender release its buffer while this
    /// rank's progress thread was still copying from it).
    fn drop(&mut self) {
        self.comm.abort.store(true, SeqCst);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        self.comm.ctl.leave();
    }
}

impl Backend for ShmBackend {
    type Buffer = ShmBuffer;

    /// Joins the world. Options: `shm_arena_gib` (address space per rank arena, default 16);
    /// `fault` (faults to inject, [`concord_core::fault`]: the points in `FAULT_POINTS`);
    /// `shm_canary=1` (fill freed blocks with a canary and check it when they are reused and at
    /// teardown; a write into freed memory ends the process with status 87); `nan_minmax=ignore`,
    /// `int_avg=floor`, `rounding=every_step` (another reduction semantics, declared:
    /// [`kernels`]); `sum_order=rotated` (f32 / f64 sums folded in another order, the same on
    /// every rank: [`kernels`]); `out_passes=2` (reductions write their outputs twice, junk
    /// first: [`kernels`]).
    fn init(world: &WorldInfo) -> Result<Self> {
        let (rank, n) = (world.rank, world.world_size);
        if n == 0 || n > MAX_WORLD_SIZE || rank >= n {
            return Err(CollectiveError::Unsupported(format!(
                "shm backend runs worlds of 1..={MAX_WORLD_SIZE} ranks; got rank {rank} of {n}"
            )));
        }
        // Options first, all of them, before anything process-wide changes.
        let gib: f64 = match world.option("shm_arena_gib") {
            None => 16.0,
            Some(v) => v.parse().ok().filter(|g: &f64| g.is_finite() && (0.0..=1024.0).contains(g)).ok_or_else(|| {
                CollectiveError::Backend(format!("option shm_arena_gib={v}: expected GiB from 0 (the 1 MiB minimum) to 1024"))
            })?,
        };
        let fault = fault::from_world(world).map_err(CollectiveError::Backend)?;
        let canary = world.flag("shm_canary", false).map_err(CollectiveError::Backend)?;
        fused::set_mode(world.option("fused_pipeline"))?;
        let chosen = kernels::choose(world)?;
        sys::install_cleanup_handlers();
        let arena_bytes = ((gib * (1u64 << 30) as f64) as usize).next_multiple_of(4096).max(1 << 20);
        let prefix = concord_core::world_prefix(&world.world_id);
        let arena_name = |r: usize| format!("{prefix}r{r}");
        let ctl_name = format!("{prefix}ctl");
        let store_err = |e: concord_store::StoreError| match e {
            concord_store::StoreError::Timeout { waited_ms, .. } => CollectiveError::Timeout {
                op: "init".into(),
                seq: 0,
                rank,
                waited_ms,
                detail: format!("shm backend rendezvous through the store: {e}"),
            },
            e => CollectiveError::Backend(format!("shm backend rendezvous through the store: {e}")),
        };

        let mut guard = UnlinkGuard(vec![]);
        let own = arena_name(rank);
        sys::register_cleanup(&own);
        guard.0.push(own.clone());
        let own_map = Mapping::create(&own, arena_bytes, true).map_err(io_err(&format!("cannot create arena {own}")))?;
        let mut ctl_map = None;
        if rank == 0 {
            sys::register_cleanup(&ctl_name);
            guard.0.push(ctl_name.clone());
            let m =
                Mapping::create(&ctl_name, ctl::ctl_size(n), true).map_err(io_err(&format!("cannot create control segment {ctl_name}")))?;
            ctl::Ctl::init(&m, n);
            ctl_map = Some(m);
        }
        let store = Store::open(&world.store_path, n, world.op_timeout).map_err(store_err)?;
        let host_key = |r: usize| format!("concord-shm/{}/host/{r}", world.world_id);
        store.set(&host_key(rank), host_identity().as_bytes()).map_err(store_err)?;
        store.barrier(&format!("concord-shm/{}/segments", world.world_id), n, world.op_timeout).map_err(store_err)?;
        // One host only: every rank compares every rank's host identity (the same verdict
        // everywhere, before any peer's segment is opened).
        let hosts: Vec<String> = (0..n)
            .map(|r| store.get(&host_key(r)).map(|v| String::from_utf8_lossy(&v).into_owned()))
            .collect::<std::result::Result<_, _>>()
            .map_err(store_err)?;
        if let Some(r) = hosts.iter().position(|h| *h != hosts[0]) {
            return Err(CollectiveError::Unsupported(format!(
                "shm backend: the world spans hosts: rank 0 is on {} but rank {r} is on {}; shared memory needs every rank on one host (use the mpi backend across hosts)",
                hosts[0], hosts[r]
            )));
        }
        let mut own_map = Some(own_map);
        let mut arenas = Vec::with_capacity(n);
        for r in 0..n {
            if r == rank {
                arenas.push(own_map.take().expect("own arena"));
            } else {
                arenas.push(Mapping::open(&arena_name(r), false).map_err(io_err(&format!("cannot open arena {}", arena_name(r))))?);
            }
        }
        let ctl_map = match ctl_map {
            Some(m) => m,
            None => Mapping::open(&ctl_name, true).map_err(io_err(&format!("cannot open control segment {ctl_name}")))?,
        };
        let ctl = ctl::Ctl::attach(ctl_map, n, rank).map_err(CollectiveError::Backend)?;
        Self::join_ctl(&ctl, world.op_timeout, rank)?;
        drop(guard); // every rank has mapped everything: unlink our names now
        drop(store);
        let world_arc = Arc::new(World::new(world.world_id.clone(), rank, arenas, canary));
        Self::start(Comm {
            world: world_arc,
            ctl,
            n,
            me: rank,
            globals: (0..n).collect(),
            tag: String::new(),
            label: format!("shm r{rank}"),
            op_timeout: world.op_timeout,
            abort: AtomicBool::new(false),
            fault: fault.iter().filter(|f| f.group.is_none() && f.rank.is_none_or(|r| r == rank)).cloned().collect(),
            issued: AtomicU64::new(0),
            group_faults: fault.into_iter().filter(|f| f.group.is_some()).collect(),
            groups_made: AtomicU64::new(0),
            chosen,
        })
    }

    fn name(&self) -> &str {
        "shm"
    }
    fn rank(&self) -> usize {
        self.comm.me
    }
    fn world_size(&self) -> usize {
        self.comm.n
    }
    fn capabilities(&self) -> Capabilities {
        caps(&self.comm)
    }
    /// Every action at every point of `FAULT_POINTS`, on the world and on its groups (`/G`);
    /// `alloc_output:fail` (the arena refuses an out-of-place op's output: `issue_new`).
    fn fault_hooks(&self) -> Vec<(String, fault::Action)> {
        fault::hooks(&FAULT_POINTS)
            .into_iter()
            .chain(fault::hooks(&[fault::ON_GROUPS]))
            .chain([(fault::point::ALLOC_OUTPUT.to_string(), fault::Action::Fail)])
            .collect()
    }
    fn outstanding(&self) -> usize {
        self.counter.get()
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        // The group's number for faults on groups (`/G`): every call counts, on every rank.
        let g = self.comm.groups_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let flag = Flag::new();
        let (reply_tx, reply_rx) = mpsc::channel();
        let seq = {
            let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
            *seq += 1;
            let mut p = Post::new(CallOp::NewGroup, Variant::Out, self.comm.me, vec![], vec![]);
            p.call.seq = *seq;
            p.call.group = Some(ranks.to_vec());
            progress::begin(&self.comm.label, "new_group", *seq);
            let fault = self.comm.next_fault();
            let faulty = fault.is_some();
            let job = Job::Coll {
                name: "new_group".into(),
                post: p,
                keep: vec![],
                flag: flag.clone(),
                reply: Some(reply_tx),
                fault,
                failed: None,
            };
            (*seq, self.submit_coll(job, flag, faulty)?)
        };
        let (seq, c) = seq;
        let work = Work::new((), c, self.meta("new_group", seq), &self.counter);
        work.wait(self.comm.op_timeout + std::time::Duration::from_secs(1))?;
        let (tag, mapping) =
            reply_rx.recv().map_err(|_| CollectiveError::Backend(format!("new_group #{seq}: progress thread gave no group")))?;
        let Some(pos) = ranks.iter().position(|&r| r == self.comm.me) else { return Ok(None) };
        let mapping = mapping.ok_or_else(|| CollectiveError::Backend(format!("new_group #{seq}: no control segment")))?;
        let m = ranks.len();
        let ctl = ctl::Ctl::attach(mapping, m, pos).map_err(CollectiveError::Backend)?;
        Self::join_ctl(&ctl, self.comm.op_timeout, pos)?;
        let global = self.comm.world.global_rank;
        Self::start(Comm {
            world: self.comm.world.clone(),
            ctl,
            n: m,
            me: pos,
            globals: ranks.iter().map(|&r| self.comm.globals[r]).collect(),
            label: format!("shm[{tag}] r{global}"),
            tag,
            op_timeout: self.comm.op_timeout,
            abort: AtomicBool::new(false),
            fault: fault::for_group(&self.comm.group_faults, g).into_iter().filter(|f| f.rank.is_none_or(|r| r == pos)).collect(),
            issued: AtomicU64::new(0),
            group_faults: Vec::new(),
            groups_made: AtomicU64::new(0),
            chosen: self.comm.chosen,
        })
        .map(Some)
    }

    fn upload(&self, t: &Tensor) -> Result<ShmBuffer> {
        let b = self.new_buf(t.dtype(), t.shape())?;
        b.region().copy_from_bytes(t.bytes());
        Ok(b)
    }
    fn download(&self, b: &ShmBuffer) -> Result<Tensor> {
        let mut t = Tensor::zeros(b.dtype, &b.shape);
        b.region().copy_to_bytes(t.bytes_mut());
        Ok(t)
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<ShmBuffer> {
        self.new_buf(dtype, shape)
    }
    fn write(&self, b: &ShmBuffer, t: &Tensor) -> Result<()> {
        if t.dtype() != b.dtype || t.numel() != b.numel() {
            return Err(CollectiveError::Backend(format!(
                "write of a {}{:?} tensor into a {}{:?} buffer",
                t.dtype(),
                t.shape(),
                b.dtype,
                b.shape
            )));
        }
        b.region().copy_from_bytes(t.bytes());
        Ok(())
    }
    fn view(&self, b: &ShmBuffer, offset: usize, shape: &[usize]) -> Result<ShmBuffer> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.and_then(|n| n.checked_add(offset)).is_none_or(|end| end > b.numel()) {
            return Err(CollectiveError::Backend(format!(
                "view {shape:?} from element {offset} exceeds a buffer of {} elements",
                b.numel()
            )));
        }
        Ok(ShmBuffer { block: b.block.clone(), byte_off: b.byte_off + offset * b.dtype.size(), dtype: b.dtype, shape: shape.to_vec() })
    }
    fn buffer_addr(&self, b: &ShmBuffer) -> usize {
        b.region().addr()
    }
    fn buffer_dtype(&self, b: &ShmBuffer) -> DType {
        b.dtype
    }
    fn buffer_shape(&self, b: &ShmBuffer) -> Vec<usize> {
        b.shape.clone()
    }

    fn all_reduce(&self, x: &ShmBuffer, op: ReduceOp) -> Result<Work<ShmBuffer>> {
        Ok(self.all_reduce_impl("all_reduce", std::slice::from_ref(x), op, Variant::Out)?.map(|mut v| v.remove(0)))
    }
    fn all_reduce_(&self, x: &ShmBuffer, op: ReduceOp) -> Result<Work<ShmBuffer>> {
        Ok(self.all_reduce_impl("all_reduce_", std::slice::from_ref(x), op, Variant::InPlace)?.map(|mut v| v.remove(0)))
    }
    fn all_reduce_coalesced(&self, xs: &[ShmBuffer], op: ReduceOp) -> Result<Work<Vec<ShmBuffer>>> {
        self.all_reduce_impl("all_reduce_coalesced", xs, op, Variant::Coalesced)
    }
    fn all_reduce_coalesced_(&self, xs: &[ShmBuffer], op: ReduceOp) -> Result<Work<Vec<ShmBuffer>>> {
        self.all_reduce_impl("all_reduce_coalesced_", xs, op, Variant::CoalescedInPlace)
    }

    fn all_gather_into_tensor(&self, x: &ShmBuffer) -> Result<Work<ShmBuffer>> {
        self.issue_one("all_gather_into_tensor", CallOp::AllGather, x, &self.gathered_shape(x), |_| {})
    }
    fn all_gather_into_tensor_out(&self, x: &ShmBuffer, out: &ShmBuffer) -> Result<Work<ShmBuffer>> {
        let p = self.post_of(CallOp::AllGather, Variant::OutBuf, &[x], &[out]);
        self.issue("all_gather_into_tensor_out", p, vec![x.clone(), out.clone()], out.clone())
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[ShmBuffer]) -> Result<Work<Vec<ShmBuffer>>> {
        self.issue_coalesced("all_gather_into_tensor_coalesced", CallOp::AllGather, xs, |x| self.gathered_shape(x), |_| {})
    }

    fn reduce_scatter_tensor(&self, x: &ShmBuffer, op: ReduceOp) -> Result<Work<ShmBuffer>> {
        self.issue_one("reduce_scatter_tensor", CallOp::ReduceScatter, x, &self.scattered_shape(x), |p| p.call.reduce = Some(op))
    }
    fn reduce_scatter_tensor_out(&self, x: &ShmBuffer, op: ReduceOp, out: &ShmBuffer) -> Result<Work<ShmBuffer>> {
        let mut p = self.post_of(CallOp::ReduceScatter, Variant::OutBuf, &[x], &[out]);
        p.call.reduce = Some(op);
        self.issue("reduce_scatter_tensor_out", p, vec![x.clone(), out.clone()], out.clone())
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[ShmBuffer], op: ReduceOp) -> Result<Work<Vec<ShmBuffer>>> {
        self.issue_coalesced(
            "reduce_scatter_tensor_coalesced",
            CallOp::ReduceScatter,
            xs,
            |x| self.scattered_shape(x),
            |p| p.call.reduce = Some(op),
        )
    }

    fn all_to_all_single(&self, x: &ShmBuffer, output_splits: Option<&[usize]>, input_splits: Option<&[usize]>) -> Result<Work<ShmBuffer>> {
        let n = self.comm.n;
        let rows = match (output_splits, x.shape.first()) {
            // A sum that overflows is bad input, named by validation on every rank (issue 15
            // item 10); the output's shape does not matter then.
            (Some(s), _) => s.iter().try_fold(0usize, |a, &r| a.checked_add(r)).unwrap_or(0),
            (None, Some(&d0)) => d0 / n * n,
            (None, None) => 0,
        };
        let shape: Vec<usize> =
            if x.shape.is_empty() { vec![] } else { std::iter::once(rows).chain(x.shape[1..].iter().copied()).collect() };
        self.issue_one("all_to_all_single", CallOp::AllToAll, x, &shape, |p| {
            p.call.in_splits = input_splits.map(|s| s.to_vec());
            p.call.out_splits = output_splits.map(|s| s.to_vec());
        })
    }

    fn broadcast(&self, x: &ShmBuffer, src: usize) -> Result<Work<ShmBuffer>> {
        self.issue_one("broadcast", CallOp::Broadcast, x, &x.shape, |p| p.call.root = Some(src))
    }
    fn broadcast_(&self, x: &ShmBuffer, src: usize) -> Result<Work<ShmBuffer>> {
        let mut p = self.post_of(CallOp::Broadcast, Variant::InPlace, &[x], &[x]);
        p.call.root = Some(src);
        self.issue("broadcast_", p, vec![x.clone()], x.clone())
    }
    fn permute_tensor(&self, x: &ShmBuffer, src_dst: &[usize]) -> Result<Work<ShmBuffer>> {
        self.issue_one("permute_tensor", CallOp::Permute, x, &x.shape, |p| p.call.perm = Some(src_dst.to_vec()))
    }
    fn reduce(&self, x: &ShmBuffer, op: ReduceOp, root: usize) -> Result<Work<ShmBuffer>> {
        self.issue_one("reduce", CallOp::Reduce, x, &x.shape, |p| {
            p.call.reduce = Some(op);
            p.call.root = Some(root);
        })
    }
    fn gather(&self, x: &ShmBuffer, root: usize) -> Result<Work<ShmBuffer>> {
        self.issue_one("gather", CallOp::Gather, x, &self.gathered_shape(x), |p| p.call.root = Some(root))
    }
    fn scatter(&self, x: &ShmBuffer, root: usize) -> Result<Work<ShmBuffer>> {
        self.issue_one("scatter", CallOp::Scatter, x, &self.scattered_shape(x), |p| p.call.root = Some(root))
    }

    fn send(&self, x: &ShmBuffer, dst: usize) -> Result<Work<()>> {
        self.check_p2p(CallOp::Send, x, dst)?;
        let mut ks = self.send_k.lock().unwrap_or_else(|e| e.into_inner());
        ks[dst] = ks[dst].wrapping_add(1);
        let k = ks[dst];
        let d = x.desc();
        let entry = ctl::Entry { off: d.off, nbytes: d.nbytes() as u64, dtype: post::dtype_code(d.dtype) as u32, numel: d.numel() as u64 };
        let comp = SendCompletion::new(self.comm.clone(), dst, k, x.clone());
        progress::begin(&self.comm.label, "send", exec::send_key(dst, k));
        let fault = self.comm.next_fault();
        self.submit(Job::Send { k, dst, entry, comp: comp.clone(), fault })?;
        Ok(Work::new((), comp, self.meta(&format!("send to {dst}"), k as u64), &self.counter))
    }

    fn recv(&self, out: &ShmBuffer, src: usize) -> Result<Work<ShmBuffer>> {
        self.check_p2p(CallOp::Recv, out, src)?;
        let mut ks = self.recv_k.lock().unwrap_or_else(|e| e.into_inner());
        ks[src] = ks[src].wrapping_add(1);
        let k = ks[src];
        let flag = Flag::new();
        progress::begin(&self.comm.label, "recv", exec::recv_key(src, k));
        let fault = self.comm.next_fault();
        self.submit(Job::Recv { k, src, out: out.clone(), flag: flag.clone(), fault })?;
        Ok(Work::new(out.clone(), flag, self.meta(&format!("recv from {src}"), k as u64), &self.counter))
    }

    fn barrier(&self) -> Result<Work<()>> {
        let p = Post::new(CallOp::Barrier, Variant::Out, self.comm.me, vec![], vec![]);
        self.issue("barrier", p, vec![], ())
    }

    // Fused ops: pipelined shard by shard (fused.rs); the low-contention ops are the defaults.
    fn fused_all_gather_matmul(
        &self,
        a: &ShmBuffer,
        bs: &[ShmBuffer],
        dim: usize,
    ) -> Result<Work<concord_core::fused::Gathered<ShmBuffer>>> {
        self.pipelined_all_gather_matmul(a, bs, dim, None)
    }
    fn fused_all_gather_scaled_matmul(
        &self,
        a: &ShmBuffer,
        bs: &[ShmBuffer],
        dim: usize,
        s: &concord_core::Scaling,
    ) -> Result<Work<concord_core::fused::Gathered<ShmBuffer>>> {
        self.pipelined_all_gather_matmul(a, bs, dim, Some(s))
    }
    fn fused_matmul_reduce_scatter(&self, a: &ShmBuffer, b: &ShmBuffer, op: ReduceOp, dim: usize) -> Result<Work<ShmBuffer>> {
        self.pipelined_matmul_reduce_scatter(a, b, op, dim, None)
    }
    fn fused_scaled_matmul_reduce_scatter(
        &self,
        a: &ShmBuffer,
        b: &ShmBuffer,
        op: ReduceOp,
        dim: usize,
        s: &concord_core::Scaling,
    ) -> Result<Work<ShmBuffer>> {
        self.pipelined_matmul_reduce_scatter(a, b, op, dim, Some(s))
    }
}
