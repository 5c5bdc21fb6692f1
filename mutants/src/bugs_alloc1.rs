//! Helper alloc1 (2026-11-28): an out-of-place op whose output cannot be allocated at issue on
//! ONE rank (the fault `alloc_output:fail`, `concord_core::fault::point::ALLOC_OUTPUT`: the
//! backend's own allocator refuses it, as a full arena / `/dev/shm` or a device out of memory
//! would). Clause `faults.local_failure_named_everywhere`: the failing rank gets its own named
//! error, every peer a named error (never a timeout, never `Ok`), and the world stays usable. The
//! three wrong handlings a backend author writes, each caught by
//! `faults::alloc_fails_at_issue::*` and by no case before it:
//! * [`AllocBeforeIssue`]: the output allocated before the op is handed to the backend, a failed
//!   allocation raised at once: the op never reaches the peers, which wait to their deadline (shm
//!   itself until helper alloc1: it allocated the output before numbering the op).
//! * [`OomZeroedOutput`]: the allocation's error dropped: the rank retries the allocation and
//!   returns the fresh, zero-filled buffer as the op's result, `Ok`.
//! * [`OomAbortsCommunicator`]: an out-of-memory taken as fatal: the rank aborts its
//!   communicator, and every later op of it fails (its peers wait for it), where the contract
//!   keeps the world usable after a local failure.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Shm};
use concord_core::fault::{self, point, Action, Fault};
use concord_core::{Backend, CollectiveError, DType, ReduceOp, Result, Tensor, Work, WorldInfo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// An error an out-of-place op's issue returned for want of memory for its output (shm's
/// allocator error, a `backend` error at issue).
fn out_of_memory(e: &CollectiveError) -> bool {
    matches!(e, CollectiveError::Backend(m) if m.contains("cannot allocate"))
}

// ---------------------------------------------------------------- allocated before issue

/// A layer above the backend allocates every out-of-place op's output before it hands the op to
/// the backend (as PyTorch's functional collectives allocate the output in ATen before calling
/// the process group), and raises at once when that allocation fails: the op never reaches the
/// backend on this rank, so its peers wait for it to their deadline and then pair this rank's
/// next op with theirs (shm until helper alloc1 allocated the output before numbering the op).
/// The layer's allocator is the one `alloc_output:fail` strikes (taken out of the option the
/// backend gets); the layer numbers the ops it hands on as the fault's `#N` counts them.
#[derive(Default)]
pub struct AllocBeforeIssue {
    /// This rank's `alloc_output` faults (world communicator only).
    faults: Mutex<Vec<Fault>>,
    rank: AtomicU64,
    /// Ops handed on so far (collectives, sends, receives and `new_group`).
    issued: AtomicU64,
}

impl AllocBeforeIssue {
    /// Counts one op.
    fn tick(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::SeqCst)
    }
    /// Counts one op whose output the layer allocates first: its allocation's failure (at once,
    /// nothing handed on), else `issue`.
    fn out<T>(&self, s: &Shm, name: &str, shape: &[usize], dtype: DType, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        let nth = self.tick();
        let rank = self.rank.load(Ordering::SeqCst) as usize;
        if lock(&self.faults).iter().any(|f| f.fires(point::ALLOC_OUTPUT, Action::Fail, rank, nth)) {
            return Err(CollectiveError::Backend(format!(
                "{name} on rank {}: cannot allocate its output ({dtype}{shape:?}): out of memory",
                s.rank()
            )));
        }
        issue()
    }
    fn pass<T>(&self, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        self.tick();
        issue()
    }
}

fn gathered(s: &Shm, x: &Buf) -> Vec<usize> {
    let sh = s.inner.buffer_shape(x);
    match sh.split_first() {
        None => vec![s.ws()],
        Some((d0, rest)) => std::iter::once(d0 * s.ws()).chain(rest.iter().copied()).collect(),
    }
}
fn scattered(s: &Shm, x: &Buf) -> Vec<usize> {
    let sh = s.inner.buffer_shape(x);
    match sh.split_first() {
        None => vec![],
        Some((d0, rest)) => std::iter::once(d0 / s.ws()).chain(rest.iter().copied()).collect(),
    }
}
fn same(s: &Shm, x: &Buf) -> Vec<usize> {
    s.inner.buffer_shape(x)
}
fn a2a_shape(s: &Shm, x: &Buf, o: Option<&[usize]>) -> Vec<usize> {
    let sh = s.inner.buffer_shape(x);
    let rows = match (o, sh.first()) {
        (Some(o), _) => o.iter().sum(),
        (None, Some(&d0)) => d0 / s.ws() * s.ws(),
        (None, None) => return vec![],
    };
    std::iter::once(rows).chain(sh[1..].iter().copied()).collect()
}

impl Bug for AllocBeforeIssue {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        let all = fault::from_world(world).map_err(CollectiveError::Backend)?;
        let (mine, rest): (Vec<Fault>, Vec<Fault>) = all.into_iter().partition(|f| f.point == point::ALLOC_OUTPUT && f.group.is_none());
        *lock(&self.faults) = mine;
        self.rank.store(world.rank as u64, Ordering::SeqCst);
        let mut w = world.clone();
        w.options.retain(|(k, _)| k != fault::OPTION);
        if !rest.is_empty() {
            w.options.push((fault::OPTION.to_string(), fault::format(&rest)));
        }
        Ok(w)
    }
    fn refuse_group(&self, _s: &Shm, _ranks: &[usize]) -> Result<()> {
        self.tick();
        Ok(())
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.out(s, "all_reduce", &same(s, x), s.inner.buffer_dtype(x), || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.pass(|| s.inner.all_reduce_(x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let first = xs.first().map(|x| (same(s, x), s.inner.buffer_dtype(x))).unwrap_or((vec![], DType::F32));
        self.out(s, "all_reduce_coalesced", &first.0, first.1, || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.pass(|| s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.out(s, "all_gather_into_tensor", &gathered(s, x), s.inner.buffer_dtype(x), || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.pass(|| s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let first = xs.first().map(|x| (gathered(s, x), s.inner.buffer_dtype(x))).unwrap_or((vec![], DType::F32));
        self.out(s, "all_gather_into_tensor_coalesced", &first.0, first.1, || s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.out(s, "reduce_scatter_tensor", &scattered(s, x), s.inner.buffer_dtype(x), || s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.pass(|| s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let first = xs.first().map(|x| (scattered(s, x), s.inner.buffer_dtype(x))).unwrap_or((vec![], DType::F32));
        self.out(s, "reduce_scatter_tensor_coalesced", &first.0, first.1, || s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.out(s, "all_to_all_single", &a2a_shape(s, x, o), s.inner.buffer_dtype(x), || s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.out(s, "broadcast", &same(s, x), s.inner.buffer_dtype(x), || s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.pass(|| s.inner.broadcast_(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.out(s, "permute_tensor", &same(s, x), s.inner.buffer_dtype(x), || s.inner.permute_tensor(x, src_dst))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.out(s, "reduce", &same(s, x), s.inner.buffer_dtype(x), || s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.out(s, "gather", &gathered(s, x), s.inner.buffer_dtype(x), || s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.out(s, "scatter", &scattered(s, x), s.inner.buffer_dtype(x), || s.inner.scatter(x, root))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.pass(|| s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.pass(|| s.inner.recv(out, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.pass(|| s.inner.barrier())
    }
}

// ---------------------------------------------------------------- the error dropped

/// The output allocation's error dropped: on an out-of-memory at issue the rank frees what it
/// caches, allocates the output again (which now succeeds), and returns that buffer as the op's
/// result, `Ok`, although the op never ran on this rank (its peers were told it failed): the
/// caller gets a zero-filled output as a success.
#[derive(Default)]
pub struct OomZeroedOutput;

impl OomZeroedOutput {
    fn op(&self, s: &Shm, name: &str, x: &Buf, shape: Vec<usize>, issue: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        match issue() {
            Err(e) if out_of_memory(&e) => {
                let dtype = s.inner.buffer_dtype(x);
                let out = s.inner.alloc(dtype, &shape)?;
                s.inner.write(&out, &Tensor::zeros(dtype, &shape))?;
                Ok(s.done(out, name))
            }
            r => r,
        }
    }
}

impl Bug for OomZeroedOutput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.op(s, "all_reduce", x, same(s, x), || s.inner.all_reduce(x, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.op(s, "all_gather_into_tensor", x, gathered(s, x), || s.inner.all_gather_into_tensor(x))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.op(s, "reduce_scatter_tensor", x, scattered(s, x), || s.inner.reduce_scatter_tensor(x, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.op(s, "all_to_all_single", x, a2a_shape(s, x, o), || s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.op(s, "broadcast", x, same(s, x), || s.inner.broadcast(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.op(s, "permute_tensor", x, same(s, x), || s.inner.permute_tensor(x, src_dst))
    }
}

// ---------------------------------------------------------------- fatal out-of-memory

/// An out-of-memory taken as fatal: when an op's output cannot be allocated the rank aborts its
/// communicator (as a framework that aborts the communicator on any collective error), so every
/// later op of it fails at issue on this rank, and its peers wait for it, where the contract keeps
/// the world usable after a local failure.
#[derive(Default)]
pub struct OomAbortsCommunicator {
    aborted: Mutex<Option<String>>,
}

impl OomAbortsCommunicator {
    fn op<T>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(why) = lock(&self.aborted).clone() {
            return Err(CollectiveError::Aborted(format!("{name} on rank {}: the communicator was aborted after: {why}", s.rank())));
        }
        issue().inspect_err(|e| {
            if out_of_memory(e) {
                lock(&self.aborted).get_or_insert_with(|| e.to_string());
            }
        })
    }
}

impl Bug for OomAbortsCommunicator {
    crate::through_op!(
        all_reduce,
        all_reduce_,
        all_gather_into_tensor,
        reduce_scatter_tensor,
        all_to_all_single,
        broadcast,
        broadcast_,
        permute_tensor,
        barrier
    );
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<AllocBeforeIssue>(
            "alloc1_alloc_before_issue",
            "faults.local_failure_named_everywhere",
            "an out-of-place op's output allocated before the op is handed on: a failed allocation raises at once, the peers wait to \
             their deadline (shm before helper alloc1)",
            &["faults::alloc_fails_at_issue::all_reduce::ws2"],
        ),
        spec::<OomZeroedOutput>(
            "alloc1_oom_zeroed_output",
            "faults.local_failure_named_everywhere",
            "an output allocation's out-of-memory dropped: the allocation retried and the zero-filled buffer returned as the op's \
             result, Ok",
            &["faults::alloc_fails_at_issue::all_gather_into_tensor::ws2"],
        ),
        spec::<OomAbortsCommunicator>(
            "alloc1_oom_aborts_communicator",
            "faults.local_failure_named_everywhere",
            "an out-of-memory at issue taken as fatal: the rank aborts its communicator, every later op fails, the world is not usable",
            &["faults::alloc_fails_at_issue::broadcast::ws2"],
        ),
    ]
}
