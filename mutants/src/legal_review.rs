//! Legal variants from a review of the checks for over-strictness (helper `reviewe`,
//! docs/review-e.md): each is a backend that keeps the contract where a check might demand more
//! than the contract does. Like [`crate::legal`]'s, each wraps the shm backend, is run against the
//! whole catalogue by `concord-mutants --legal`, and MUST pass it.
//!
//! * `legal_review_zero_sum_plus`: a float `sum` (and `avg`, `premul_sum`: sums too) folds from a
//!   `+0` identity (as a BLAS dot, or a `torch.stack(xs).sum(0)`), so a sum whose terms are all
//!   `-0` is `+0` (IEEE 754's fold from the first term gives `-0`). Every other sum is
//!   bit-identical: an IEEE addition whose exact result is zero or tiny is exact, so a float sum
//!   is `-0` only when every term is `-0`, in any order. The contract leaves that sign to the
//!   backend ([clause: values.reduce]).
//! * `legal_review_nonroot_garbage`: `reduce` and `gather` return, on a rank other than the root,
//!   a new buffer of the right shape holding garbage (bytes `0xA5`): their contents are defined on
//!   the root only ([clause: shapes]).
//! * `legal_review_empty_at_input`: an out-of-place op whose result has zero elements returns a
//!   zero-element view at its input's address (as PyTorch's empty tensors, whose `data_ptr()` is
//!   the same for all of them): a buffer of zero elements overlaps no buffer, whatever its
//!   address ([clause: placement.empty_no_alias]); the op itself still runs (peers need it).
//!
//! From review21 (docs/review21.md, made permanent by helper impl21):
//!
//! * `legal_review21_no_cross_rank_late` (finding 2): declares `validates_across_ranks = false`
//!   and has no header exchange, so an all_reduce whose shapes differ across ranks ends in a
//!   named `timeout` (the peers' calls never pair), never `bad_input`. Every valid call is shm's.
//!   (`legal_no_cross_rank` only changes the declaration and still names the mismatch like shm.)
//!   A cross-rank bad-input case MUST be UNSUPPORTED on it ([clause: bad_input.named_everywhere]).
//! * `legal_review21_stream_peer_aborted` (finding 3): the launch-based stream reference
//!   ([`crate::stream`]) whose peers of a local failure get `CollectiveError::Aborted` (as shm's
//!   `peer_failure` gives them), not `Backend`: one named error, never a timeout, nothing aborted,
//!   the next op runs ([clause: faults.local_failure_named_everywhere] leaves the kind open).
//!
//! From review23 (docs/RESULTS.md, "review23"):
//!
//! * `legal_review23_slow_teardown` (finding 2): each group holds a socket pair per peer while
//!   it lives; a dropped group's sockets are closed by one teardown thread per process, one group
//!   after another, [`TEARDOWN_PER_GROUP`] each (the NCCL backend finalizes and destroys its
//!   communicators on its progress thread, about half a second each on 2 × H200). Nothing is
//!   kept per group once the thread reaches it ([clause: failure.usable_after]: the release MAY
//!   come after the drop returns, as long as it keeps going). The descriptor count of
//!   `state::groups_each_without_a_rank` failed it at 600 ms per group with a fixed 3 s settle.
//!
//! From review24 (/work/reviews/review24.md, made permanent by helper impl24):
//!
//! * `legal_review24_deferred_release` (finding 1): the world communicator keeps a
//!   world-prefixed status page, `/dev/shm/concord-<world>-r24-status-<rank>` (a page a monitor
//!   or a restarted peer opens by name), while it lives; when it is dropped the page is unlinked
//!   on a thread of the backend's own, [`DEFERRED_RELEASE`] later (the NCCL backend finalizes
//!   and destroys its communicators on a thread of its own, about half a second each on H200).
//!   [clause: failure.usable_after]: the release MAY come after the drop returns, as long as it
//!   keeps going. The single `/dev/shm` read right after the drops of
//!   `faults::alloc_fails_at_issue::*` and `faults::new_group_failure_leaves_no_file::ws2`
//!   failed it.
//! * `legal_review24_oom_one_error` (finding 3): the failing rank's own out-of-memory at issue
//!   (its output cannot be allocated) is reported as the op's `aborted` error, naming the
//!   allocation, the kind its peers get (shm's `peer_failure`): ONE error for the failed op on
//!   every rank. Nothing is aborted, the next ops run ([clause:
//!   faults.local_failure_named_everywhere] leaves the kind open, as for
//!   `legal_review21_stream_peer_aborted`). The `backend`-only kind check of
//!   `faults::alloc_fails_at_issue::*` failed it.

use crate::campaign::{spec, Spec};
use crate::{edit, Buf, Bug, Mutant, Shm};
use concord_core::fused::{self, Gathered, Scaling};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Tensor, Work};

const ZERO_SUM_PLUS: u8 = 0;
const NONROOT_GARBAGE: u8 = 1;
const EMPTY_AT_INPUT: u8 = 2;
const NO_CROSS_RANK_LATE: u8 = 3;

/// One reviewed legal variant of the shm backend (`K` picks it).
#[derive(Default)]
pub struct Review<const K: u8>;

/// The reviewed legal variants (registered by [`crate::legal::catalogue`]).
pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<Review<ZERO_SUM_PLUS>>(
            "legal_review_zero_sum_plus",
            "(nothing: +0 identity)",
            "a float sum / avg / premul_sum folds from a +0 identity: a sum of all -0 terms is +0 (every other result \
             is IEEE's, bit for bit)",
            &["special", "numerics::"],
        ),
        spec::<Review<NONROOT_GARBAGE>>(
            "legal_review_nonroot_garbage",
            "(nothing: root only)",
            "reduce and gather return garbage (bytes 0xA5) of the right shape on every rank but the root: their \
             contents are defined on the root only",
            &["reduce::", "gather::"],
        ),
        spec::<Review<EMPTY_AT_INPUT>>(
            "legal_review_empty_at_input",
            "(nothing: empty at input)",
            "an out-of-place op whose result has zero elements returns a zero-element view at its input's address \
             (empty buffers overlap nothing)",
            &["sizes::", "seed::", "reuse::"],
        ),
        spec::<Review<NO_CROSS_RANK_LATE>>(
            "legal_review21_no_cross_rank_late",
            "validates_across_ranks = false",
            "declares validates_across_ranks = false and has no header exchange: an all_reduce whose shapes differ across \
             ranks ends in a named timeout (its peers' ops never pair), never bad_input",
            &["state::bad_input_100_then_usable::ws2"],
        ),
        spec::<SlowTeardown>(
            "legal_review23_slow_teardown",
            "(nothing: slow teardown)",
            "each group holds a socket pair per peer while it lives; one teardown thread per process closes dropped \
             groups' sockets one group after another, 700 ms each (as NCCL's finalize + destroy on a progress thread)",
            &["state::groups_each_without_a_rank::ws3"],
        ),
        spec::<DeferredRelease>(
            "legal_review24_deferred_release",
            "(nothing: deferred release)",
            "the world communicator keeps a world-prefixed /dev/shm status page while it lives, unlinked on a thread of \
             its own 500 ms after the drop returns (as NCCL's destroy on a thread of its own)",
            &["faults::alloc_fails_at_issue::", "faults::new_group_failure_leaves_no_file::"],
        ),
        spec::<OomOneError>(
            "legal_review24_oom_one_error",
            "(nothing: one error)",
            "the failing rank's out-of-memory at issue reported as the op's `aborted` error naming the allocation, the \
             kind its peers get: one error for the op on every rank, nothing aborted",
            &["faults::alloc_fails_at_issue::"],
        ),
        crate::bugs_stream::legal_spec(
            "legal_review21_stream_peer_aborted",
            crate::stream::StreamLegal::PeerAborted,
            "(nothing: peer's error kind)",
            "stream reference whose peers of a local failure get `aborted` (\"rank r failed its side of this op locally\"), \
             not `backend`: one named error, nothing aborted, the next op runs",
            &["device_faults::local_failure_after_begin::", "device_faults::fail_before_header::"],
        ),
    ]
}

/// [`NO_CROSS_RANK_LATE`]'s all_reduce work: a cross-rank shape mismatch (which shm names) is
/// reported as what a backend without a header exchange sees: a named timeout.
struct LateMismatch {
    w: Work<Buf>,
    rank: usize,
}

fn as_late(e: CollectiveError, rank: usize) -> CollectiveError {
    if e.bad_input_kind() == Some(concord_core::BadInputKind::ShapeMismatch) {
        CollectiveError::Timeout {
            op: "all_reduce".into(),
            seq: 0,
            rank,
            waited_ms: 0,
            detail: "legal_review21: no header exchange; the peers' calls did not pair".into(),
        }
    } else {
        e
    }
}

impl concord_core::Completion for LateMismatch {
    fn is_completed(&self) -> bool {
        self.w.is_completed()
    }
    fn wait_for(&self, t: std::time::Duration) -> Result<bool> {
        match self.w.wait(t) {
            Ok(_) => Ok(true),
            Err(CollectiveError::Timeout { .. }) if !self.w.is_completed() => Ok(false),
            Err(e) => Err(as_late(e, self.rank)),
        }
    }
}

/// `-0` elements of a float tensor made `+0` (what folding from a `+0` identity gives).
fn plus_zero(t: &mut Tensor) {
    let dtype = t.dtype();
    if !dtype.is_float() {
        return;
    }
    let es = dtype.size();
    let sign = 1u64 << (8 * es - 1);
    for chunk in t.bytes_mut().chunks_exact_mut(es) {
        let mut bits = 0u64;
        for (k, byte) in chunk.iter().enumerate() {
            bits |= (*byte as u64) << (8 * k);
        }
        if bits == sign {
            chunk.fill(0);
        }
    }
}

impl<const K: u8> Review<K> {
    /// The zero-sum variant's result edit (sum, avg and premul_sum: each a sum folded from +0;
    /// other ops as given).
    fn sum_plus<T>(&self, s: &Shm, w: Work<T>, op: ReduceOp, outs: fn(&T) -> Vec<Buf>) -> Work<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        if K != ZERO_SUM_PLUS || !matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_)) {
            return w;
        }
        s.then(w, move |be, v| {
            for b in outs(v) {
                edit(be, &b, plus_zero)?;
            }
            Ok(())
        })
    }

    /// The garbage variant's non-root result.
    fn not_root(&self, s: &Shm, w: Work<Buf>, root: usize) -> Work<Buf> {
        if K != NONROOT_GARBAGE || s.rank() == root {
            return w;
        }
        s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0xA5)))
    }

    /// The empty variant's result: a zero-element view of `x` when the op's result is empty.
    fn empty_at(&self, s: &Shm, w: Work<Buf>, x: &Buf) -> Result<Work<Buf>> {
        if K != EMPTY_AT_INPUT {
            return Ok(w);
        }
        let shape = s.inner.buffer_shape(w.peek());
        if shape.iter().product::<usize>() != 0 {
            return Ok(w);
        }
        let at_input = s.inner.view(x, 0, &shape)?;
        Ok(s.then_as(w, at_input, |_, _| Ok(())))
    }

    /// [`Self::empty_at`] for a coalesced op: each empty result at its own input.
    fn empties_at(&self, s: &Shm, w: Work<Vec<Buf>>, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        if K != EMPTY_AT_INPUT {
            return Ok(w);
        }
        let mut outs = w.peek().clone();
        let mut any = false;
        for (o, x) in outs.iter_mut().zip(xs) {
            let shape = s.inner.buffer_shape(o);
            if shape.iter().product::<usize>() == 0 {
                *o = s.inner.view(x, 0, &shape)?;
                any = true;
            }
        }
        if !any {
            return Ok(w);
        }
        Ok(s.then_as(w, outs, |_, _| Ok(())))
    }
}

fn one(b: &Buf) -> Vec<Buf> {
    vec![b.clone()]
}
// `&Vec`: it is a `fn(&T) -> Vec<Buf>` with `T` the coalesced ops' `Vec<Buf>`.
#[allow(clippy::ptr_arg)]
fn all(bs: &Vec<Buf>) -> Vec<Buf> {
    bs.clone()
}

impl<const K: u8> Bug for Review<K> {
    fn capabilities(&self, s: &Shm) -> concord_core::Capabilities {
        let mut c = s.inner.capabilities();
        if K == NO_CROSS_RANK_LATE {
            c.validates_across_ranks = false;
        }
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if K == NO_CROSS_RANK_LATE {
            let rank = s.rank();
            let w = s.inner.all_reduce(x, op).map_err(|e| as_late(e, rank))?;
            let (value, meta) = (w.peek().clone(), w.meta().clone());
            return Ok(s.relayed(value, std::sync::Arc::new(LateMismatch { w, rank }), meta));
        }
        let w = s.inner.all_reduce(x, op)?;
        let w = self.empty_at(s, w, x)?;
        Ok(self.sum_plus(s, w, op, one))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.sum_plus(s, s.inner.all_reduce_(x, op)?, op, one))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        let w = self.empties_at(s, w, xs)?;
        Ok(self.sum_plus(s, w, op, all))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(self.sum_plus(s, s.inner.all_reduce_coalesced_(xs, op)?, op, all))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        self.empty_at(s, w, x)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        self.empties_at(s, w, xs)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let w = self.empty_at(s, w, x)?;
        Ok(self.sum_plus(s, w, op, one))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(self.sum_plus(s, s.inner.reduce_scatter_tensor_out(x, op, out)?, op, one))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
        let w = self.empties_at(s, w, xs)?;
        Ok(self.sum_plus(s, w, op, all))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        self.empty_at(s, w, x)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        self.empty_at(s, w, x)
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let w = s.inner.permute_tensor(x, src_dst)?;
        self.empty_at(s, w, x)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        let w = self.empty_at(s, w, x)?;
        let w = self.not_root(s, w, root);
        Ok(self.sum_plus(s, w, op, one))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.gather(x, root)?;
        let w = self.empty_at(s, w, x)?;
        Ok(self.not_root(s, w, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.scatter(x, root)?;
        self.empty_at(s, w, x)
    }
    // The fused ops: the seed's decomposition over shm itself (a wrapper's edited works count
    // in a counter `outstanding` does not report, so a decomposition over the variant would
    // lose the count its `counted_again` gives back; the fused products fold from +0 anyway).
    fused_on_shm!();
}

/// [`SlowTeardown`]'s time per dropped group on its teardown thread.
const TEARDOWN_PER_GROUP: std::time::Duration = std::time::Duration::from_millis(700);

/// A socket pair a group holds for one peer (what a backend's connection to it would be).
type Channel = (std::os::unix::net::UnixStream, std::os::unix::net::UnixStream);

/// `legal_review23_slow_teardown` (module doc): the world's bug and each group's.
#[derive(Default)]
pub struct SlowTeardown {
    /// This group's channels, one per peer (empty on the world).
    held: std::sync::Mutex<Vec<Channel>>,
}

/// The channels `group_made` opened on this rank for the group `child` is about to wrap.
static OPENED: std::sync::Mutex<Vec<Channel>> = std::sync::Mutex::new(Vec::new());

/// The process's teardown thread: closes each dropped group's channels after
/// [`TEARDOWN_PER_GROUP`], one group after another.
fn tear_down_later(group: Vec<Channel>) {
    static THREAD: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Vec<Channel>>>> = std::sync::OnceLock::new();
    let tx = THREAD.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Channel>>();
        std::thread::spawn(move || {
            while let Ok(group) = rx.recv() {
                std::thread::sleep(TEARDOWN_PER_GROUP);
                drop(group);
            }
        });
        std::sync::Mutex::new(tx)
    });
    // A send fails only once the thread is gone (the process is exiting): the channels close here.
    let _ = crate::lock(tx).send(group);
}

impl Drop for SlowTeardown {
    fn drop(&mut self) {
        let held = std::mem::take(&mut *crate::lock(&self.held));
        if !held.is_empty() {
            tear_down_later(held);
        }
    }
}

impl Bug for SlowTeardown {
    fn group_made(&self, _s: &Shm, ranks: &[usize], made: Option<&crate::Group>) -> Result<()> {
        if made.is_some() {
            let mut opened = crate::lock(&OPENED);
            for _ in 1..ranks.len() {
                opened.push(
                    std::os::unix::net::UnixStream::pair()
                        .map_err(|e| CollectiveError::Backend(format!("legal_review23_slow_teardown: socketpair: {e}")))?,
                );
            }
        }
        Ok(())
    }
    fn child(&self) -> Option<Box<dyn Bug>> {
        let held = std::mem::take(&mut *crate::lock(&OPENED));
        Some(Box::new(SlowTeardown { held: std::sync::Mutex::new(held) }))
    }
}

/// [`DeferredRelease`]'s delay between the drop of the world communicator and the unlink of its
/// status page, on a thread of its own.
const DEFERRED_RELEASE: std::time::Duration = std::time::Duration::from_millis(500);

/// `legal_review24_deferred_release` (module doc): the world communicator's status page (a
/// group's bug holds none).
#[derive(Default)]
pub struct DeferredRelease {
    page: std::sync::Mutex<Option<(std::fs::File, String)>>,
}

impl Bug for DeferredRelease {
    fn init_world(&self, world: &concord_core::WorldInfo) -> Result<concord_core::WorldInfo> {
        let path = format!("/dev/shm/{}r24-status-{}", concord_core::world_prefix(&world.world_id), world.rank);
        let named = |e: std::io::Error| CollectiveError::Backend(format!("legal_review24_deferred_release: {path}: {e}"));
        let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).map_err(named)?;
        f.set_len(4096).map_err(named)?;
        *crate::lock(&self.page) = Some((f, path));
        Ok(world.clone())
    }
}

impl Drop for DeferredRelease {
    fn drop(&mut self) {
        if let Some((f, path)) = crate::lock(&self.page).take() {
            std::thread::spawn(move || {
                std::thread::sleep(DEFERRED_RELEASE);
                drop(f);
                let _ = std::fs::remove_file(&path);
            });
        }
    }
}

/// `legal_review24_oom_one_error` (module doc).
#[derive(Default)]
pub struct OomOneError;

impl OomOneError {
    fn op<T>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        issue().map_err(|e| match e {
            CollectiveError::Backend(m) if m.contains("cannot allocate") => CollectiveError::Aborted(format!(
                "{name} on rank {r}: the op failed on every rank because rank {r} could not allocate its output: {m}",
                r = s.rank()
            )),
            e => e,
        })
    }
}

impl Bug for OomOneError {
    crate::through_op!(all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast);
}
