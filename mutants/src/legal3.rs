//! Legal variants, a third round (helper `legal3`): freedoms the contract leaves that no earlier
//! variant took. Like [`crate::legal`]'s, each wraps the shm backend (or sets an shm option that
//! shm computes itself), is run against the whole catalogue by `concord-mutants --legal`, and MUST
//! pass it; none edits a result at wait.
//!
//! * `legal3_sum_order`: f32 / f64 `sum`, `avg`, `premul_sum` and `product` folded in another
//!   order than rank order — rank-reversed, from a start rank that rotates per block and per size
//!   (shm's `sum_order=rotated`, computed by shm). One order for every rank (each element is
//!   reduced once and copied to every output): identical results everywhere, not the serial
//!   rank-order fold's bits ([clause: values.reduce] "within the dtype's bound on random ones";
//!   [clause: values.identical_on_every_rank] "whatever order a backend reduces in").
//! * `legal3_late_flag`: `is_completed()` turns true only on a poll at least 2 ms after the op
//!   completed (a progress thread that publishes completion lazily): a caller must poll. `wait`
//!   returns as soon as the op is done, and after it `is_completed()` is true.
//! * `legal3_out_of_order`: independent ops complete out of issue order: op `n`'s completion
//!   (flag and wait alike) is held back until 6 ms (n % 4 == 0) or 2 ms (n % 4 == 2) after it
//!   was issued, so the op after it completes first. A wait shorter than that times out, as a
//!   wait on any op not yet complete does.
//! * `legal3_terse_errors`: every error keeps its kind and fields (op, sequence number, rank,
//!   peer, bad-input kind) but says nothing more: its free text is a few fixed words. The contract
//!   names errors by kind; only the fused ops' bad input has a fixed wording (the seed's,
//!   [clause: fused.bad_input]), and the fused ops are left as shm's.
//! * `legal3_composed`: collectives built from others, as ProcessGroupNCCL does: `barrier` is a
//!   one-element all_reduce, `broadcast` an all_gather whose result is the source's block (a
//!   view into the gathered buffer), `reduce` an all_reduce (every rank gets the result; it is
//!   defined on the root only), `gather` an all_gather (the same). Such a backend cannot tell a
//!   barrier from a peer's one-element all_reduce, nor roots that differ across ranks, so it
//!   declares `validates_across_ranks = false`; local rules (a root out of range) still come from
//!   the rule table, on the op the caller called, and the op in flight is recorded as the op the
//!   caller called ([clause: progress.recorded]), beside the op shm runs for it.
//! * `legal3_rounding_unspecified`: declares `Rounding::Unspecified` (no promise on f16 / bf16
//!   sums) and rounds at every step (shm's `rounding=every_step`, which itself declares less
//!   loosely): the exact-rounding cases are UNSUPPORTED, the random ones keep the oracle's bound
//!   for any order.
//! * `legal3_two_passes`: every reduction writes its outputs twice, bytes `0xA5` first, then the
//!   result (shm's `out_passes=2`): an output is the caller's only once the op completed.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Mutant, Shm};
use concord_core::call::{validate_local, CallDesc, CallOp, TensorDesc};
use concord_core::caps::Rounding;
use concord_core::fused::{self, Gathered, Scaling};
use concord_core::{
    progress, Backend, Capabilities, CollectiveError, Completion, DType, ReduceOp, Result, Tensor, Variant, Work, WorldInfo,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SUM_ORDER: u8 = 0;
const LATE_FLAG: u8 = 1;
const OUT_OF_ORDER: u8 = 2;
const TERSE_ERRORS: u8 = 3;
const COMPOSED: u8 = 4;
const ROUNDING_UNSPECIFIED: u8 = 5;
const TWO_PASSES: u8 = 6;

/// How long after completion [`LATE_FLAG`]'s flag turns true.
const FLAG_LAG: Duration = Duration::from_millis(2);

/// One third-round legal variant of the shm backend (`K` picks it).
#[derive(Default)]
pub struct Third<const K: u8> {
    /// Ops issued on this communicator ([`OUT_OF_ORDER`]'s schedule).
    seq: AtomicU64,
}

/// The third round's legal variants (registered by [`crate::legal::catalogue`]).
pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<Third<SUM_ORDER>>(
            "legal3_sum_order",
            "(nothing: another sum order)",
            "f32 / f64 sum, avg, premul_sum and product fold the ranks rank-reversed from a start rank that rotates \
             per block and per size (shm's sum_order=rotated): the same bits on every rank, not the rank-order fold's",
            &["matrix::all_reduce::out::f32::sum", "identical::", "numerics::"],
        ),
        spec::<Third<LATE_FLAG>>(
            "legal3_late_flag",
            "(nothing: lazy flag)",
            "is_completed() turns true only on a poll 2 ms after the op completed (polling needed); wait returns at \
             once and sets it",
            &["async::", "state::"],
        ),
        spec::<Third<OUT_OF_ORDER>>(
            "legal3_out_of_order",
            "(nothing: out of order)",
            "independent ops complete out of issue order: op n's completion is held back 6 ms (n % 4 == 0) or 2 ms \
             (n % 4 == 2) after its issue, so the next op completes first",
            &["async::", "p2p::", "programs::"],
        ),
        spec::<Third<TERSE_ERRORS>>(
            "legal3_terse_errors",
            "(nothing: terse errors)",
            "every error keeps its kind and its fields (op, seq, rank, peer, bad-input kind) but its free text is a \
             few fixed words (the fused ops' seed wording kept)",
            &["bad_input::", "faults::"],
        ),
        spec::<Third<COMPOSED>>(
            "legal3_composed",
            "composed, no cross-rank",
            "declares validates_across_ranks = false; barrier is a one-element all_reduce, broadcast an all_gather \
             (the source's block), reduce an all_reduce, gather an all_gather (local rules from the rule table)",
            &["broadcast::", "reduce::", "gather::", "async::barrier"],
        ),
        spec::<Third<ROUNDING_UNSPECIFIED>>(
            "legal3_rounding_unspecified",
            "rounding = Unspecified",
            "declares Rounding::Unspecified (no promise on f16 / bf16 sums) and rounds them at every step (shm's \
             rounding=every_step)",
            &["f16::sum", "bf16::avg"],
        ),
        spec::<Third<TWO_PASSES>>(
            "legal3_two_passes",
            "(nothing: two passes)",
            "every reduction writes its outputs twice before completing: bytes 0xA5, then the result (shm's \
             out_passes=2)",
            &["all_reduce", "reduce_scatter"],
        ),
    ]
}

/// An error with its kind and fields kept and its free text replaced ([`TERSE_ERRORS`]).
fn terse(e: CollectiveError) -> CollectiveError {
    use CollectiveError as E;
    let words = |w: &str| format!("{w} (legal3_terse_errors)");
    match e {
        E::BadInput { kind, op, seq, rank, .. } => E::BadInput { kind, op, seq, rank, detail: words("refused") },
        E::Timeout { op, seq, rank, waited_ms, .. } => E::Timeout { op, seq, rank, waited_ms, detail: words("not done") },
        E::PeerDied { op, seq, rank, peer, .. } => E::PeerDied { op, seq, rank, peer, detail: words("gone") },
        E::Unsupported(_) => E::Unsupported(words("not here")),
        E::Injected { op, seq } => E::Injected { op, seq },
        E::Aborted(_) => E::Aborted(words("aborted")),
        E::Backend(_) => E::Backend(words("failed")),
    }
}

/// The completion of a relayed work: the inner work's, reported later or in other words.
struct Relay<T> {
    inner: Work<T>,
    /// Not complete before this instant ([`OUT_OF_ORDER`]).
    ready: Option<Instant>,
    /// The flag turns true this long after a poll first saw the op complete ([`LATE_FLAG`]).
    lag: Duration,
    /// When a poll first saw the inner op complete.
    seen: Mutex<Option<Instant>>,
    /// A wait saw it complete (the flag is true from then on).
    waited: AtomicBool,
    map_err: fn(CollectiveError) -> CollectiveError,
    /// The caller's op this one stands for ([`COMPOSED`]), recorded in flight under this
    /// variant's name and number until its completion is seen (or the work is dropped).
    record: Option<u64>,
}

/// The name [`COMPOSED`] records its ops in flight under.
const COMPOSED_NAME: &str = "legal3_composed";

impl<T> Relay<T> {
    /// The caller's op is no longer in flight.
    fn done(&self) {
        if let Some(seq) = self.record {
            progress::end(COMPOSED_NAME, seq);
        }
    }
}

impl<T> Drop for Relay<T> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<T: Send + Sync> Completion for Relay<T> {
    fn is_completed(&self) -> bool {
        if self.waited.load(Ordering::SeqCst) {
            return true;
        }
        if self.ready.is_some_and(|r| Instant::now() < r) || !self.inner.is_completed() {
            return false;
        }
        self.done();
        let first = *lock(&self.seen).get_or_insert_with(Instant::now);
        first.elapsed() >= self.lag
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        if let Some(ready) = self.ready {
            let now = Instant::now();
            if ready > deadline {
                std::thread::sleep(deadline.saturating_duration_since(now));
                return Ok(false);
            }
            std::thread::sleep(ready.saturating_duration_since(now));
        }
        match self.inner.wait(deadline.saturating_duration_since(Instant::now())) {
            Ok(_) => {
                self.done();
                self.waited.store(true, Ordering::SeqCst);
                Ok(true)
            }
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => {
                self.done();
                Err((self.map_err)(e))
            }
        }
    }
}

/// A buffer's call description (dtype and shape).
fn desc(s: &Shm, b: &Buf) -> TensorDesc {
    TensorDesc::new(s.inner.buffer_dtype(b), &s.inner.buffer_shape(b))
}

/// The rule table's local rules for a rooted op [`COMPOSED`] builds from another.
fn local_rules(s: &Shm, op: CallOp, x: &Buf, reduce: Option<ReduceOp>, root: usize) -> Result<()> {
    let mut d = CallDesc::new(op, Variant::Out, s.rank());
    d.inputs.push(desc(s, x));
    d.reduce = reduce;
    d.root = Some(root);
    validate_local(&d, s.ws(), &s.inner.capabilities()).map_err(|b| b.into_error(op.name(), 0, s.rank()))
}

impl<const K: u8> Third<K> {
    /// `w` as this variant reports it (`op`: the op the caller called, where another ran).
    fn relay<T, U>(&self, s: &Shm, w: Result<Work<T>>, value: impl FnOnce(&T) -> U, op: Option<&str>) -> Result<Work<U>>
    where
        T: Send + Sync + 'static,
    {
        let map_err: fn(CollectiveError) -> CollectiveError = if K == TERSE_ERRORS { terse } else { |e| e };
        let w = w.map_err(map_err)?;
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let hold = match n % 4 {
            0 => 6,
            2 => 2,
            _ => 0,
        };
        let ready = (K == OUT_OF_ORDER && hold > 0).then(|| Instant::now() + Duration::from_millis(hold));
        let lag = if K == LATE_FLAG { FLAG_LAG } else { Duration::ZERO };
        let mut meta = w.meta().clone();
        let mut record = None;
        if let Some(op) = op {
            meta.op = op.into();
            progress::begin(COMPOSED_NAME, op, n);
            record = Some(n);
        }
        let v = value(w.peek());
        let relay = Relay { inner: w, ready, lag, seen: Mutex::new(None), waited: AtomicBool::new(false), map_err, record };
        Ok(s.relayed(v, Arc::new(relay), meta))
    }

    /// `w` relayed with its own value (what every op but [`COMPOSED`]'s builds does).
    fn same<T: Clone + Send + Sync + 'static>(&self, s: &Shm, w: Result<Work<T>>) -> Result<Work<T>> {
        if !matches!(K, LATE_FLAG | OUT_OF_ORDER | TERSE_ERRORS) {
            return w;
        }
        self.relay(s, w, T::clone, None)
    }
}

impl<const K: u8> Bug for Third<K> {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        let mut w = world.clone();
        let option = match K {
            SUM_ORDER => Some(("sum_order", "rotated")),
            ROUNDING_UNSPECIFIED => Some(("rounding", "every_step")),
            TWO_PASSES => Some(("out_passes", "2")),
            _ => None,
        };
        if let Some((key, value)) = option {
            w.options.retain(|(k, _)| k != key);
            w.options.push((key.into(), value.into()));
        }
        Ok(w)
    }
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        match K {
            COMPOSED => c.validates_across_ranks = false,
            ROUNDING_UNSPECIFIED => c.rounding = Rounding::Unspecified,
            _ => {}
        }
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.same(s, s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.same(s, s.inner.all_reduce_(x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.same(s, s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.same(s, s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.same(s, s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.same(s, s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.same(s, s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.same(s, s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.same(s, s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.same(s, s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.same(s, s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if K == COMPOSED {
            local_rules(s, CallOp::Broadcast, x, None, src)?;
            let shape = s.inner.buffer_shape(x);
            let n: usize = shape.iter().product();
            let w = s.inner.all_gather_into_tensor(x)?;
            let block = s.inner.view(w.peek(), src * n, &shape)?;
            return self.relay(s, Ok(w), |_| block, Some("broadcast"));
        }
        self.same(s, s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.same(s, s.inner.broadcast_(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.same(s, s.inner.permute_tensor(x, src_dst))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        if K == COMPOSED {
            local_rules(s, CallOp::Reduce, x, Some(op), root)?;
            return self.relay(s, s.inner.all_reduce(x, op), Buf::clone, Some("reduce"));
        }
        self.same(s, s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        if K == COMPOSED {
            local_rules(s, CallOp::Gather, x, None, root)?;
            return self.relay(s, s.inner.all_gather_into_tensor(x), Buf::clone, Some("gather"));
        }
        self.same(s, s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.same(s, s.inner.scatter(x, root))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.same(s, s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.same(s, s.inner.recv(out, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        if K == COMPOSED {
            let one = s.inner.upload(&Tensor::from_f64(DType::F32, &[1], &[0.0]))?;
            return self.relay(s, s.inner.all_reduce_(&one, ReduceOp::Sum), |_| (), Some("barrier"));
        }
        self.same(s, s.inner.barrier())
    }
    // The fused ops: the seed's decomposition over shm itself (a decomposition over the variant
    // would hand its relayed works to `counted_again`, in a counter `outstanding` does not
    // report; the seed's wording of their bad input is kept).
    fused_on_shm!();
}
