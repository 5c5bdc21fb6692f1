//! # concord-mutants
//!
//! **One job:** measure what the conformance suites catch, and that they accept what is right.
//! Each mutant is the shm backend with ONE bug, written the way a downstream author writes a
//! backend: a type implementing [`concord_core::Backend`] by wrapping [`concord_shm::ShmBackend`].
//! `cargo xtask mutants` runs the catalogue against every mutant (see [`campaign`]) and prints the
//! catch rate, then against every legal variant ([`legal`], [`legal_review`], [`legal3`]: correct
//! backends that differ from shm in legal ways), which MUST pass it. [`sweep`] and [`sweep_bad`]
//! are the grids beside the hand-written bugs; [`stream`] is the reference launch-based backend
//! whose own mutants ([`bugs_stream`]) break the failure-path clauses.
//!
//! The delegation boilerplate lives here once: [`Mutant`] implements `Backend` around one
//! [`Bug`] (chosen at init by the backend option `mutant=<name>`), whose hooks default to the
//! correct shm call, so a mutant overrides one hook. One backend type for all mutants: the
//! catalogue is compiled once, not once per mutant.
//! Issue stays asynchronous: a hook returns the inner [`Work`] or maps it with [`Shm::then`]
//! (the bug runs when the result is waited), and waits at issue time only when that IS the bug.
#![forbid(unsafe_code)]

/// The three fused ops of a legal variant, run as the seed's decomposition over shm itself (a
/// decomposition over the variant would hand its edited works to a counter `outstanding` does not
/// report). Expanded inside an `impl Bug for ...`; the module needs `fused`, `Gathered`,
/// `Scaling`, `Buf`, `Mutant`, `ReduceOp`, `Result` and `Work` in scope.
macro_rules! fused_on_shm {
    () => {
        fn fused_all_gather_matmul(
            &self,
            m: &Mutant,
            a: &Buf,
            bs: &[Buf],
            dim: usize,
            sc: Option<&Scaling>,
        ) -> Result<Work<Gathered<Buf>>> {
            fused::decomposed_all_gather_matmul(&*m.s.inner, a, bs, dim, sc)
        }
        fn fused_matmul_reduce_scatter(
            &self,
            m: &Mutant,
            a: &Buf,
            b: &Buf,
            op: ReduceOp,
            dim: usize,
            sc: Option<&Scaling>,
        ) -> Result<Work<Buf>> {
            fused::decomposed_matmul_reduce_scatter(&*m.s.inner, a, b, op, dim, sc)
        }
        fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
            fused::decomposed_low_contention(&*m.s.inner, x, op)
        }
    };
}

pub mod bugs;
pub mod bugs_alloc1;
pub mod bugs_clauses;
pub mod bugs_dtype;
pub mod bugs_findings13;
pub mod bugs_hunt;
pub mod bugs_hunt10;
pub mod bugs_hunt12;
pub mod bugs_hunt16;
pub mod bugs_hunt17;
pub mod bugs_hunt18;
pub mod bugs_hunt19;
pub mod bugs_hunt2;
pub mod bugs_hunt20;
pub mod bugs_hunt21;
pub mod bugs_hunt22;
pub mod bugs_hunt23;
pub mod bugs_hunt24;
pub mod bugs_hunt25;
pub mod bugs_hunt26;
pub mod bugs_hunt27;
pub mod bugs_hunt28;
pub mod bugs_hunt29;
pub mod bugs_hunt3;
pub mod bugs_hunt30;
pub mod bugs_hunt31;
pub mod bugs_hunt32;
pub mod bugs_hunt33;
pub mod bugs_hunt34;
pub mod bugs_hunt35;
pub mod bugs_hunt36;
pub mod bugs_hunt37;
pub mod bugs_hunt38;
pub mod bugs_hunt39;
pub mod bugs_hunt40;
pub mod bugs_hunt41;
pub mod bugs_hunt42;
#[macro_use]
pub mod bugs_hunt4;
pub mod bugs_hunt5;
pub mod bugs_hunt6;
pub mod bugs_hunt7;
pub mod bugs_hunt8;
pub mod bugs_hunt9;
pub mod bugs_left20;
pub mod bugs_p2pfail;
pub mod bugs_review;
pub mod bugs_review10;
pub mod bugs_review11;
pub mod bugs_review13;
pub mod bugs_review14;
pub mod bugs_review16;
pub mod bugs_review17;
pub mod bugs_review18;
pub mod bugs_review19;
pub mod bugs_review2;
pub mod bugs_review20;
pub mod bugs_review3;
pub mod bugs_review4;
pub mod bugs_review5;
pub mod bugs_review6;
pub mod bugs_review8;
pub mod bugs_risks;
pub mod bugs_shmfail;
pub mod bugs_sizes;
pub mod bugs_stream;
pub mod bugs_subfault;
pub mod campaign;
pub mod coverage;
pub mod legal;
pub mod legal3;
pub mod legal_review;
pub mod stream;
pub mod sweep;
pub mod sweep_bad;

/// Every mutant of the campaign: [`bugs`], [`bugs_clauses`] (a mutant per contract clause the
/// first campaigns left without one), [`bugs_hunt`], [`bugs_hunt2`], [`bugs_hunt3`] and
/// [`bugs_hunt4`] to [`bugs_hunt10`] and [`bugs_hunt12`] (bugs
/// aimed at the catalogue's thin spots), [`bugs_dtype`] (bugs the sweep's dtype grid pointed at),
/// [`bugs_hunt16`] (bugs the bad-input grid pointed at), [`bugs_hunt17`] (state that goes
/// wrong only with time), [`bugs_hunt18`] (bugs that shipped in GPU collective libraries),
/// [`bugs_hunt19`] (bugs shipped by CPU collective libraries, from their issue trackers),
/// [`bugs_hunt20`] (bugs shipped by fused communication + compute layers), [`bugs_hunt21`]
/// (shipped bugs of communicator splitting, subgroups and point-to-point), [`bugs_hunt22`]
/// (shipped bugs of custom collective kernels and symmetric-memory paths outside NCCL),
/// [`bugs_hunt23`] (shipped bugs of the frameworks that issue collectives: DeepSpeed, torchft,
/// Accelerate, ...) and [`bugs_hunt24`] (shipped bugs of memory layout and sizes: views,
/// registration caches, zero and short counts, 32-bit offsets that wrap), [`bugs_hunt25`]
/// (shipped bugs of language bindings and thin wrappers over a collective library),
/// [`bugs_hunt26`] (shipped bugs of the vendor collective libraries themselves: RCCL, NCCLX,
/// MLX, FlagCX, ACCL, XLA:GPU), [`bugs_hunt27`] (shipped bugs of the failure paths: errors
/// swallowed or seen on one rank only, deadlines not the caller's, waits that return early),
/// [`bugs_hunt28`] (shipped bugs of reduction numerics: low-precision accumulation, truncating
/// conversions, NaN rewritten, averages of unscaled half-precision sums), [`bugs_hunt29`]
/// (shipped bugs of caches and state carried across calls: persistent and cached ops that replay
/// their first call, caches keyed on too few fields, counters of the process where they must be
/// the group's), [`bugs_hunt30`] (shipped bugs where a library switches how it works: a
/// segmented pipeline's last segment, a ring path below its segment size, a fast path's guard),
/// [`bugs_hunt31`] (shipped bugs of a communicator's life: ids reused while a message lingers,
/// group names salted with per-rank counts, reused group names, lazy init on the first op),
/// [`bugs_hunt33`] (shipped bugs of work handles: a completion check reading another request,
/// a wait-any retiring the wrong request, a first send that leaves only at wait, a callback
/// chain bound late),
/// [`bugs_hunt34`] (shipped bugs of hierarchical and topology-aware algorithms: blocks stitched in
/// node order, a reorder copy reversed, a pipeline ring over full nodes only, a root alone on its
/// node, a node leader accumulating in the caller's input),
/// [`bugs_hunt32`] (shipped bugs of what a backend counts over a long run: op tags a pair's p2p
/// advances on two ranks only, a parent's tag counter walking into reserved tags, a rank that
/// skips a collective whose own share is empty),
/// [`bugs_hunt35`] (shipped bugs in what a backend accepts: zero-size collectives skipped per
/// rank, same-size checks by element count, split sums as an upper bound, a coalesced list
/// reduced as one flat bucket, an average emulated as a sum),
/// [`bugs_hunt38`] (shipped bugs that escaped their project's own tests, each behind a combination:
/// an all_to_all rank whose own block is empty, a gather to a root other than 0, a ring whose two
/// neighbours are one process, integer min / max summed, an all_gather on one rank);
/// [`bugs_hunt36`] (shipped bugs in moving a large message through bounded resources: an op that
/// returns before its peers are done reading the caller's buffer, a chunk written past its FIFO
/// slot, a ping-pong staging index reset so that two ops in flight share one buffer);
/// [`bugs_hunt37`] (shipped bugs when a resource runs out: descriptors and `/dev/shm` segments a
/// dropped group keeps, an out-of-resource error dropped, a process that crashes instead of
/// failing, a fallback taken by the failing rank alone);
/// [`bugs_hunt40`] (shipped bugs whose fix a release note announced: pipelined fragments written
/// at the buffer's start or re-run with the first fragment's arguments, a per-peer count check
/// the wrong way round, a grouped launch's work items past the 64th never run);
/// [`bugs_hunt41`] (shipped bugs of subcommunicators and rank translation: all_to_all blocks
/// stitched in process-id order, a permutation read in the devices' numbering, equivalent groups
/// sharing one process set that one drop removes, a group of the whole world that is the world, a
/// group of one left unset, a p2p peer translated to its global rank and read as a group rank);
/// [`bugs_hunt42`] (shipped bugs whose trigger is a size and a world size together: MPICH's
/// scatter + ring-allgather broadcast at 8+ ranks and long messages, Open MPI coll/spacc's
/// all_reduce fallback for vectors shorter than the communicator);
/// [`bugs_hunt39`] (shipped bugs in how a backend meets its caller's threads: a work registry per
/// thread, a second waiter that asserts, a request freed by each of two waiters, a wake-up that
/// reaches one waiter only, a device bound per thread);
/// [`bugs_alloc1`] (an output that cannot be allocated at issue on one rank: the peers left to
/// their deadline, the error dropped for a zeroed output, the communicator aborted);
/// [`bugs_review`] (declarations and init a review found the suites trusted), [`bugs_review2`]
/// (bugs the second review's weak checks let through), [`bugs_review3`] (the third review's:
/// async, point-to-point, subgroups and state) and [`bugs_review4`] (fused-op bugs the fourth
/// review's findings let through), [`bugs_review5`] (a bug a review found in Concord's own NCCL
/// backend that no case caught), [`bugs_review6`], [`bugs_review8`], [`bugs_review10`], [`bugs_review11`], [`bugs_review13`], [`bugs_review14`], [`bugs_review16`], [`bugs_review17`], [`bugs_review18`], [`bugs_review19`] and [`bugs_review20`] (blind spots read-only
/// reviews of the catalogue pointed at), [`bugs_findings13`] (review13's findings 5 and 7); [`bugs_left20`] (review18's finding 8: a declaration that differs between ranks, each rank keeping its own); [`bugs_p2pfail`] (point-to-point failure paths: review8's findings 6
/// and 7 and their neighbours); [`bugs_risks`] (the legal variants' open risks: declarations
/// the suites trusted too far); [`bugs_shmfail`] (a communicator poisoned by a local failure: the
/// bug shm had until helper shmfail); [`bugs_sizes`] (bugs past every shm size switch, at the
/// contract's 64 MiB floor);
/// [`bugs_stream`] (the failure-path clauses, on [`stream`], the campaign's reference
/// launch-based backend: another backend type); [`bugs_subfault`] (failures on subgroups and
/// their parent, and a launch-based bystander beyond 2 ranks).
pub fn catalogue() -> Vec<campaign::Spec> {
    let mut v = bugs::catalogue();
    v.extend(bugs_clauses::catalogue());
    v.extend(bugs_hunt::catalogue());
    v.extend(bugs_hunt2::catalogue());
    v.extend(bugs_hunt3::catalogue());
    v.extend(bugs_hunt4::catalogue());
    v.extend(bugs_hunt5::catalogue());
    v.extend(bugs_hunt6::catalogue());
    v.extend(bugs_hunt7::catalogue());
    v.extend(bugs_hunt8::catalogue());
    v.extend(bugs_hunt9::catalogue());
    v.extend(bugs_hunt10::catalogue());
    v.extend(bugs_hunt12::catalogue());
    v.extend(bugs_hunt17::catalogue());
    v.extend(bugs_dtype::catalogue());
    v.extend(bugs_hunt16::catalogue());
    v.extend(bugs_hunt18::catalogue());
    v.extend(bugs_hunt19::catalogue());
    v.extend(bugs_hunt21::catalogue());
    v.extend(bugs_hunt20::catalogue());
    v.extend(bugs_hunt22::catalogue());
    v.extend(bugs_hunt23::catalogue());
    v.extend(bugs_hunt24::catalogue());
    v.extend(bugs_hunt25::catalogue());
    v.extend(bugs_hunt26::catalogue());
    v.extend(bugs_hunt27::catalogue());
    v.extend(bugs_hunt28::catalogue());
    v.extend(bugs_hunt29::catalogue());
    v.extend(bugs_hunt30::catalogue());
    v.extend(bugs_hunt31::catalogue());
    v.extend(bugs_hunt33::catalogue());
    v.extend(bugs_hunt34::catalogue());
    v.extend(bugs_hunt32::catalogue());
    v.extend(bugs_hunt35::catalogue());
    v.extend(bugs_hunt38::catalogue());
    v.extend(bugs_hunt36::catalogue());
    v.extend(bugs_hunt37::catalogue());
    v.extend(bugs_hunt40::catalogue());
    v.extend(bugs_hunt42::catalogue());
    v.extend(bugs_hunt39::catalogue());
    v.extend(bugs_hunt41::catalogue());
    v.extend(bugs_alloc1::catalogue());
    v.extend(bugs_review::catalogue());
    v.extend(bugs_review2::catalogue());
    v.extend(bugs_review3::catalogue());
    v.extend(bugs_review4::catalogue());
    v.extend(bugs_review5::catalogue());
    v.extend(bugs_review6::catalogue());
    v.extend(bugs_review8::catalogue());
    v.extend(bugs_review10::catalogue());
    v.extend(bugs_p2pfail::catalogue());
    v.extend(bugs_review11::catalogue());
    v.extend(bugs_review13::catalogue());
    v.extend(bugs_review14::catalogue());
    v.extend(bugs_findings13::catalogue());
    v.extend(bugs_review16::catalogue());
    v.extend(bugs_review17::catalogue());
    v.extend(bugs_review18::catalogue());
    v.extend(bugs_review19::catalogue());
    v.extend(bugs_review20::catalogue());
    v.extend(bugs_left20::catalogue());
    v.extend(bugs_risks::catalogue());
    v.extend(bugs_shmfail::catalogue());
    v.extend(bugs_sizes::catalogue());
    v.extend(bugs_stream::catalogue());
    v.extend(bugs_subfault::catalogue());
    v
}

/// The maker of the mutant `name`.
pub fn maker(name: &str) -> Option<MakeBug> {
    if name == "sweep" {
        return Some(sweep::make);
    }
    if name == sweep_bad::NAME {
        return Some(sweep_bad::make);
    }
    catalogue().into_iter().chain(legal::catalogue()).find(|s| s.name == name).map(|s| s.make)
}

use concord_core::fused::Gathered;
use concord_core::{
    Backend, Capabilities, CollectiveError, Completion, DType, OutstandingCounter, ReduceOp, Result, Scaling, Tensor, Work, WorkMeta,
    WorldInfo,
};
use concord_shm::ShmBackend;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A mutant's bookkeeping lock (a poisoned one still gives its data: a rank thread that panicked
/// must not hide what it noted).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `Completion::wait_for` of a completion that relays `inner`: `Ok(true)` once it is done,
/// `Ok(false)` at the timeout, its error after `seen` has looked at it (a mutant noting a failure).
pub(crate) fn relay_wait<T>(inner: &Work<T>, timeout: Duration, seen: impl FnOnce(&CollectiveError)) -> Result<bool> {
    match inner.wait(timeout) {
        Ok(_) => Ok(true),
        Err(CollectiveError::Timeout { .. }) => Ok(false),
        Err(e) => {
            seen(&e);
            Err(e)
        }
    }
}

/// The buffer type every mutant moves (the shm backend's).
pub type Buf = <ShmBackend as Backend>::Buffer;

/// The correct backend underneath a mutant, plus what bugs need to know about it.
pub struct Shm {
    pub inner: Arc<ShmBackend>,
    /// view address -> (parent, element offset), so a bug can misplace a view.
    views: Mutex<HashMap<usize, (Buf, usize)>>,
    /// Counts the wrapper's mapped works (never reported: the inner work they wrap is).
    shadow: OutstandingCounter,
    /// Counts works the wrapper creates itself (reported by `outstanding`).
    pub own: OutstandingCounter,
    /// This process's rank and size in the whole world (differs from `inner`'s in subgroups).
    pub world_rank: usize,
    pub world_size: usize,
    /// World ranks of this communicator's members, by communicator rank.
    pub members: Vec<usize>,
}

/// How long a bug's own waits may block (beyond the case's wait, which bounds everything else).
pub const BUG_WAIT: Duration = Duration::from_secs(15);

/// A communicator of the correct backend and its members (world ranks, by communicator rank).
pub type Group = (Arc<ShmBackend>, Vec<usize>);

impl Shm {
    fn new(inner: Arc<ShmBackend>, world_rank: usize, world_size: usize, members: Vec<usize>) -> Shm {
        Shm {
            inner,
            views: Mutex::new(HashMap::new()),
            shadow: OutstandingCounter::default(),
            own: OutstandingCounter::default(),
            world_rank,
            world_size,
            members,
        }
    }
    pub fn rank(&self) -> usize {
        self.inner.rank()
    }
    pub fn ws(&self) -> usize {
        self.inner.world_size()
    }
    /// True in a subgroup smaller than the world.
    pub fn in_subgroup(&self) -> bool {
        self.ws() != self.world_size
    }
    pub fn meta(&self, op: &str) -> WorkMeta {
        WorkMeta { backend: "shm".into(), op: op.into(), seq: 0, rank: self.rank() }
    }
    pub fn numel(&self, b: &Buf) -> usize {
        self.inner.buffer_shape(b).iter().product()
    }
    /// `(parent, element offset)` if `b` was made by [`Backend::view`].
    pub fn view_of(&self, b: &Buf) -> Option<(Buf, usize)> {
        self.views.lock().unwrap_or_else(|e| e.into_inner()).get(&self.inner.buffer_addr(b)).cloned()
    }

    /// `w`, whose result `hook` edits once the collective has completed (when it is waited).
    pub fn then<T>(&self, w: Work<T>, hook: impl FnOnce(&ShmBackend, &T) -> Result<()> + Send + 'static) -> Work<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        let value = w.peek().clone();
        self.then_as(w, value, hook)
    }

    /// `w` mapped to a work that yields `value`; `hook` runs on `w`'s result once it completed.
    pub fn then_as<T, U>(&self, w: Work<T>, value: U, hook: impl FnOnce(&ShmBackend, &T) -> Result<()> + Send + 'static) -> Work<U>
    where
        T: Send + Sync + 'static,
    {
        self.twisted(w, value, Twist::default(), hook)
    }

    /// The general form: `w` mapped to `value`, with a [`Twist`] on how completion is reported.
    pub fn twisted<T, U>(
        &self,
        w: Work<T>,
        value: U,
        twist: Twist,
        hook: impl FnOnce(&ShmBackend, &T) -> Result<()> + Send + 'static,
    ) -> Work<U>
    where
        T: Send + Sync + 'static,
    {
        let meta = w.meta().clone();
        let then = Then { inner: w, be: self.inner.clone(), hook: Mutex::new(Some(Box::new(hook))), failed: Mutex::new(None), twist };
        Work::new(value, Arc::new(then), meta, &self.shadow)
    }

    /// A work yielding `value` whose completion is the wrapper's own `completion` (which relays
    /// an inner work, counted in the inner backend's `outstanding` until that is waited), under
    /// `meta`: counted, like [`Shm::then`]'s works, in a counter `outstanding` does not report.
    pub fn relayed<U>(&self, value: U, completion: Arc<dyn Completion>, meta: WorkMeta) -> Work<U> {
        Work::new(value, completion, meta, &self.shadow)
    }

    /// A work that is complete at once, counted in `outstanding` until waited.
    pub fn done<T>(&self, value: T, op: &str) -> Work<T> {
        Work::done(value, self.meta(op), &self.own)
    }
}
/// `Bug` methods, one per named shm op, each routing its op through the mutant's own
/// `self.op(s, "<op>", || s.inner.<op>(..))` (mutants that do one thing around every op they
/// wrap: a poisoned communicator, an abort flag, a watchdog). Used inside `impl Bug for ..`:
/// `through_op!(all_reduce, broadcast, barrier);`, or `through_op!(every);` for all of them (the
/// collectives, their `_out` and coalesced forms, send and recv).
macro_rules! through_op {
    (every) => {
        $crate::through_op!(
            all_reduce,
            all_reduce_,
            all_reduce_coalesced,
            all_gather_into_tensor,
            all_gather_into_tensor_out,
            reduce_scatter_tensor,
            reduce_scatter_tensor_out,
            all_to_all_single,
            broadcast,
            broadcast_,
            permute_tensor,
            reduce,
            gather,
            scatter,
            barrier,
            send,
            recv
        );
    };
    ($($name:ident),* $(,)?) => { $($crate::through_op!(@one $name);)* };
    (@one all_reduce_coalesced) => {
        fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
            self.op(s, "all_reduce_coalesced", || s.inner.all_reduce_coalesced(xs, op))
        }
    };
    (@one all_gather_into_tensor_out) => {
        fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
            self.op(s, "all_gather_into_tensor_out", || s.inner.all_gather_into_tensor_out(x, out))
        }
    };
    (@one reduce_scatter_tensor_out) => {
        fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
            self.op(s, "reduce_scatter_tensor_out", || s.inner.reduce_scatter_tensor_out(x, op, out))
        }
    };
    (@one send) => {
        fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
            self.op(s, "send", || s.inner.send(x, dst))
        }
    };
    (@one recv) => {
        fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
            self.op(s, "recv", || s.inner.recv(out, src))
        }
    };
    (@one all_reduce) => {
        fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.op(s, "all_reduce", || s.inner.all_reduce(x, op))
        }
    };
    (@one all_reduce_) => {
        fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.op(s, "all_reduce_", || s.inner.all_reduce_(x, op))
        }
    };
    (@one all_gather_into_tensor) => {
        fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
            self.op(s, "all_gather_into_tensor", || s.inner.all_gather_into_tensor(x))
        }
    };
    (@one reduce_scatter_tensor) => {
        fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
            self.op(s, "reduce_scatter_tensor", || s.inner.reduce_scatter_tensor(x, op))
        }
    };
    (@one all_to_all_single) => {
        fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
            self.op(s, "all_to_all_single", || s.inner.all_to_all_single(x, o, i))
        }
    };
    (@one broadcast) => {
        fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
            self.op(s, "broadcast", || s.inner.broadcast(x, src))
        }
    };
    (@one broadcast_) => {
        fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
            self.op(s, "broadcast_", || s.inner.broadcast_(x, src))
        }
    };
    (@one permute_tensor) => {
        fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
            self.op(s, "permute_tensor", || s.inner.permute_tensor(x, src_dst))
        }
    };
    (@one reduce) => {
        fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
            self.op(s, "reduce", || s.inner.reduce(x, op, root))
        }
    };
    (@one gather) => {
        fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
            self.op(s, "gather", || s.inner.gather(x, root))
        }
    };
    (@one scatter) => {
        fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
            self.op(s, "scatter", || s.inner.scatter(x, root))
        }
    };
    (@one barrier) => {
        fn barrier(&self, s: &Shm) -> Result<Work<()>> {
            self.op(s, "barrier", || s.inner.barrier())
        }
    };
}
pub(crate) use through_op;

/// Issues the real op (`issue`) after a raw all_gather already issued (`gather`, reached through
/// `work_of`: the gather's work itself, or a holder of it); when the op is waited, `f` edits the
/// result `pick` names from every rank's input (`all`: rank `q`'s element `i` at `q * n + i`).
/// A refused op must not withdraw the gather its peers are in (shm withdraws a dropped op no peer
/// has met yet): the gather is seen through first.
pub(crate) fn then_gathered<T, K>(
    s: &Shm,
    gather: K,
    work_of: fn(&K) -> &Work<Buf>,
    issue: impl FnOnce() -> Result<Work<T>>,
    pick: fn(&T) -> Option<&Buf>,
    f: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<T>>
where
    T: Clone + Send + Sync + 'static,
    K: Send + 'static,
{
    let w = issue().inspect_err(|_| {
        let _ = work_of(&gather).wait(BUG_WAIT);
    })?;
    Ok(s.then(w, move |be, outs| {
        let all = be.download(work_of(&gather).wait(BUG_WAIT)?)?;
        match pick(outs) {
            Some(out) => edit(be, out, |t| f(&all, t)),
            None => Ok(()),
        }
    }))
}

/// Downloads `b`, lets `f` edit it, writes it back.
pub fn edit(be: &ShmBackend, b: &Buf, f: impl FnOnce(&mut Tensor)) -> Result<()> {
    let mut t = be.download(b)?;
    f(&mut t);
    be.write(b, &t)
}

/// Sets element `i` of `t` to `v` (rounded / converted as `Tensor::from_f64` does).
pub fn set_f64(t: &mut Tensor, i: usize, v: f64) {
    let es = t.dtype().size();
    let one = Tensor::from_f64(t.dtype(), &[1], &[v]);
    t.bytes_mut()[i * es..(i + 1) * es].copy_from_slice(one.bytes());
}

/// Makes element `i` clearly wrong in any dtype (not within any tolerance).
pub fn bump(t: &mut Tensor, i: usize) {
    if i >= t.numel() {
        return;
    }
    let v = t.get_f64(i);
    let w = if v.is_nan() || v.is_infinite() {
        0.0
    } else if v.abs() >= 1024.0 {
        v / 2.0
    } else if v >= 1.0 {
        v - 1.0
    } else {
        v + 1.0
    };
    set_f64(t, i, w);
}

/// Copies `n` bytes from `src` at `from` to `dst` at `to`.
pub fn copy_bytes(dst: &mut Tensor, to: usize, src: &Tensor, from: usize, n: usize) {
    dst.bytes_mut()[to..to + n].copy_from_slice(&src.bytes()[from..from + n]);
}

/// How a mapped work reports completion (every field off: truthfully).
#[derive(Clone, Copy, Default)]
pub struct Twist {
    /// `is_completed()` is true at once.
    pub completed_at_once: bool,
    /// `wait(t)` waits this long instead (`None`: `t`).
    pub wait_instead: Option<fn(Duration) -> Duration>,
    /// Errors from the inner work are replaced by this.
    pub map_err: Option<fn(CollectiveError) -> CollectiveError>,
}

type Hook<T> = Box<dyn FnOnce(&ShmBackend, &T) -> Result<()> + Send>;

/// The completion of a mapped work: the inner work, then the hook, once.
struct Then<T> {
    inner: Work<T>,
    be: Arc<ShmBackend>,
    hook: Mutex<Option<Hook<T>>>,
    failed: Mutex<Option<CollectiveError>>,
    twist: Twist,
}

impl<T: Send + Sync> Completion for Then<T> {
    fn is_completed(&self) -> bool {
        self.twist.completed_at_once || self.inner.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let timeout = self.twist.wait_instead.map_or(timeout, |f| f(timeout));
        match self.inner.wait(timeout) {
            Ok(v) => {
                if let Some(hook) = self.hook.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    if let Err(e) = hook(&self.be, v) {
                        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                }
                match &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
                    Some(e) => Err(e.clone()),
                    None => Ok(true),
                }
            }
            Err(e) => match self.twist.map_err.map_or(e.clone(), |f| f(e)) {
                CollectiveError::Timeout { .. } => Ok(false),
                e => Err(e),
            },
        }
    }
}

/// One bug: every hook defaults to the correct shm call; a mutant overrides one (or a few that
/// together make one bug). The catalogue's maker builds the bug's state for each communicator.
#[allow(unused_variables)]
pub trait Bug: Send + Sync + 'static {
    /// The world the inner shm backend joins, given the launcher's (called once per rank, at
    /// init, on the world communicator's bug); an error refuses `init`. Default: as given.
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        Ok(world.clone())
    }
    fn capabilities(&self, s: &Shm) -> Capabilities {
        s.inner.capabilities()
    }
    fn rank(&self, s: &Shm) -> usize {
        s.inner.rank()
    }
    fn outstanding(&self, s: &Shm) -> usize {
        s.inner.outstanding() + s.own.get()
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        s.inner.all_gather_into_tensor_coalesced(xs)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.reduce_scatter_tensor_coalesced(xs, op)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        s.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, src)
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        s.inner.permute_tensor(x, src_dst)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, op, root)
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.gather(x, root)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.scatter(x, root)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.recv(out, src)
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        s.inner.barrier()
    }
    /// Whether `new_group(ranks)` is refused before any group is made (a backend that declares
    /// no subgroups). Default: never.
    /// `view(b, offset, shape)`. Default: the correct backend's.
    fn view(&self, s: &Shm, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        s.inner.view(b, offset, shape)
    }
    fn refuse_group(&self, s: &Shm, ranks: &[usize]) -> Result<()> {
        Ok(())
    }
    /// Told of a `new_group` that failed on this rank (the correct backend's error, returned as
    /// is). Default: nothing.
    fn group_failed(&self, s: &Shm, e: &CollectiveError) {}
    /// What this rank's `new_group` returns when the correct backend's failed on it with `e`
    /// (after [`Bug::group_failed`]): a library that drops the error goes on with what it has.
    /// Default: the error.
    fn group_error(&self, s: &Shm, e: CollectiveError) -> Result<Option<Group>> {
        Err(e)
    }
    /// Told, on every rank of the parent (members and non-members alike), of a `new_group(ranks)`
    /// the correct backend made (`made`: this rank's communicator, `None` on a non-member); an
    /// error fails this rank's `new_group` with it (a library whose group creation hangs or
    /// fails after the communicator exists). Default: nothing.
    fn group_made(&self, s: &Shm, ranks: &[usize], made: Option<&Group>) -> Result<()> {
        Ok(())
    }
    /// The communicator `new_group` returns on this rank, given the one the correct backend made
    /// (`None` on a non-member). Called on the bug of the communicator `new_group` was called on.
    fn new_group(&self, s: &Shm, made: Option<Group>) -> Option<Group> {
        made
    }
    /// The member list the communicator is really built over, given the caller's `ranks` (every
    /// rank of the parent calls it with the same list). Default: `ranks` as given.
    fn group_ranks(&self, s: &Shm, ranks: &[usize]) -> Vec<usize> {
        ranks.to_vec()
    }
    /// The bug of a group made from this communicator (state a library shares between a parent
    /// and the communicators split from it). Default: `None`, a fresh one from the maker.
    fn child(&self) -> Option<Box<dyn Bug>> {
        None
    }
    /// `fused_all_gather_matmul` and its scaled variant (`scaling`). Default: the trait's
    /// decomposition over the mutant itself (what a backend without its own fused ops runs).
    fn fused_all_gather_matmul(
        &self,
        m: &Mutant,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Gathered<Buf>>> {
        concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, scaling)
    }
    /// `fused_matmul_reduce_scatter` and its scaled variant. Default: the decomposition.
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, scaling)
    }
    /// `low_contention_all_gather` (`op` `None`) and `low_contention_reduce_scatter`. Default:
    /// the decomposition over the mutant itself.
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        concord_core::fused::decomposed_low_contention(m, x, op)
    }
}

/// Builds one communicator's state of a bug.
pub type MakeBug = fn() -> Box<dyn Bug>;

/// The shm backend with the bug named by the backend option `mutant`.
pub struct Mutant {
    pub s: Shm,
    pub bug: Box<dyn Bug>,
    make: MakeBug,
}

impl Backend for Mutant {
    type Buffer = Buf;

    fn init(world: &WorldInfo) -> Result<Self> {
        let name =
            world.option("mutant").ok_or_else(|| CollectiveError::Backend("the mutant backend needs the option `mutant=<name>`".into()))?;
        let make =
            maker(name).ok_or_else(|| CollectiveError::Backend(format!("no mutant named `{name}` (see `cargo xtask mutants --list`)")))?;
        if name == "sweep" {
            sweep::set_target(world.option("sweep"), world.option(sweep::DRY_OPTION).is_some()).map_err(CollectiveError::Backend)?;
        }
        if name == sweep_bad::NAME {
            let dry = world.option(sweep::DRY_OPTION).is_some();
            sweep_bad::set_target(world.option(sweep_bad::NAME), dry).map_err(CollectiveError::Backend)?;
        }
        let bug = make();
        let world = bug.init_world(world)?;
        let inner = ShmBackend::init(&world)?;
        Ok(Mutant { s: Shm::new(Arc::new(inner), world.rank, world.world_size, (0..world.world_size).collect()), bug, make })
    }
    fn name(&self) -> &str {
        "mutant"
    }
    fn rank(&self) -> usize {
        self.bug.rank(&self.s)
    }
    fn world_size(&self) -> usize {
        self.s.ws()
    }
    fn capabilities(&self) -> Capabilities {
        self.bug.capabilities(&self.s)
    }
    fn outstanding(&self) -> usize {
        self.bug.outstanding(&self.s)
    }
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        self.bug.refuse_group(&self.s, ranks)?;
        let ranks = self.bug.group_ranks(&self.s, ranks);
        let members: Vec<usize> = ranks.iter().map(|&r| self.s.members.get(r).copied().unwrap_or(r)).collect();
        let made = match self.s.inner.new_group(&ranks) {
            Ok(g) => g.map(|g| (Arc::new(g), members)),
            Err(e) => {
                self.bug.group_failed(&self.s, &e);
                self.bug.group_error(&self.s, e)?
            }
        };
        self.bug.group_made(&self.s, &ranks, made.as_ref())?;
        Ok(self.bug.new_group(&self.s, made).map(|(g, members)| Mutant {
            s: Shm::new(g, self.s.world_rank, self.s.world_size, members),
            bug: self.bug.child().unwrap_or_else(self.make),
            make: self.make,
        }))
    }
    /// shm's hooks: the `fault` option reaches the inner shm backend, so the fault suite's cases
    /// run on every mutant.
    fn fault_hooks(&self) -> Vec<(String, concord_core::fault::Action)> {
        self.s.inner.fault_hooks()
    }
    fn upload(&self, t: &Tensor) -> Result<Buf> {
        self.s.inner.upload(t)
    }
    fn download(&self, b: &Buf) -> Result<Tensor> {
        self.s.inner.download(b)
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Buf> {
        self.s.inner.alloc(dtype, shape)
    }
    fn write(&self, b: &Buf, t: &Tensor) -> Result<()> {
        self.s.inner.write(b, t)
    }
    fn view(&self, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        let v = self.bug.view(&self.s, b, offset, shape)?;
        let (parent, base) = self.s.view_of(b).unwrap_or((b.clone(), 0));
        self.s.views.lock().unwrap_or_else(|e| e.into_inner()).insert(self.s.inner.buffer_addr(&v), (parent, base + offset));
        Ok(v)
    }
    fn buffer_addr(&self, b: &Buf) -> usize {
        self.s.inner.buffer_addr(b)
    }
    fn buffer_dtype(&self, b: &Buf) -> DType {
        self.s.inner.buffer_dtype(b)
    }
    fn buffer_shape(&self, b: &Buf) -> Vec<usize> {
        self.s.inner.buffer_shape(b)
    }

    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.bug.all_reduce(&self.s, x, op)
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.bug.all_reduce_(&self.s, x, op)
    }
    fn all_reduce_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.bug.all_reduce_coalesced(&self.s, xs, op)
    }
    fn all_reduce_coalesced_(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.bug.all_reduce_coalesced_(&self.s, xs, op)
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        self.bug.all_gather_into_tensor(&self.s, x)
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.bug.all_gather_into_tensor_out(&self.s, x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.bug.all_gather_into_tensor_coalesced(&self.s, xs)
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.bug.reduce_scatter_tensor(&self.s, x, op)
    }
    fn reduce_scatter_tensor_out(&self, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.bug.reduce_scatter_tensor_out(&self.s, x, op, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.bug.reduce_scatter_tensor_coalesced(&self.s, xs, op)
    }
    fn all_to_all_single(&self, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.bug.all_to_all_single(&self.s, x, o, i)
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.bug.broadcast(&self.s, x, src)
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.bug.broadcast_(&self.s, x, src)
    }
    fn permute_tensor(&self, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.bug.permute_tensor(&self.s, x, src_dst)
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.bug.reduce(&self.s, x, op, root)
    }
    fn gather(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.bug.gather(&self.s, x, root)
    }
    fn scatter(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.bug.scatter(&self.s, x, root)
    }
    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.bug.send(&self.s, x, dst)
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.bug.recv(&self.s, out, src)
    }
    fn barrier(&self) -> Result<Work<()>> {
        self.bug.barrier(&self.s)
    }
    fn fused_all_gather_matmul(&self, a: &Buf, bs: &[Buf], dim: usize) -> Result<Work<Gathered<Buf>>> {
        self.bug.fused_all_gather_matmul(self, a, bs, dim, None)
    }
    fn fused_all_gather_scaled_matmul(&self, a: &Buf, bs: &[Buf], dim: usize, scaling: &Scaling) -> Result<Work<Gathered<Buf>>> {
        self.bug.fused_all_gather_matmul(self, a, bs, dim, Some(scaling))
    }
    fn fused_matmul_reduce_scatter(&self, a: &Buf, b: &Buf, op: ReduceOp, dim: usize) -> Result<Work<Buf>> {
        self.bug.fused_matmul_reduce_scatter(self, a, b, op, dim, None)
    }
    fn fused_scaled_matmul_reduce_scatter(&self, a: &Buf, b: &Buf, op: ReduceOp, dim: usize, scaling: &Scaling) -> Result<Work<Buf>> {
        self.bug.fused_matmul_reduce_scatter(self, a, b, op, dim, Some(scaling))
    }
    fn low_contention_all_gather(&self, x: &Buf) -> Result<Work<Buf>> {
        self.bug.low_contention(self, x, None)
    }
    fn low_contention_reduce_scatter(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.bug.low_contention(self, x, Some(op))
    }
}
