//! The thirty-second hunt: bugs from the wild in what a backend counts and names over a long run.
//! Each ports a bug that shipped in a collective library or its framework layer (torchcomms'
//! Gloo backend, Open MPI's libnbc tag allocator, OpenSHMEM's zero-length collectives), found in
//! the project's issue or pull-request thread named on its type: an operation tag drawn from one
//! per-rank counter that point-to-point ops advance on their two ranks only, a parent
//! communicator's nonblocking-collective tag counter that walks into tags reserved for another
//! protocol after a few communicator creations, a rank that short-circuits a collective whose
//! own share is empty and so falls one op behind its peers. The counters start and step as the
//! shipped code's did, so the trigger is the same number of ops.

use crate::bugs_hunt3::Hidden;
use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Group, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Tensor, Work};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #2964

/// An operation tag drawn from one per-rank counter that point-to-point ops advance too
/// (meta-pytorch/torchcomms PR #2964 "Fix Gloo P2P tag skew in TorchComms tests": "Gloo assigns
/// operation tags from a per-rank `nextTag()` counter, so every rank that later joins a world
/// collective must have consumed the same number of preceding TorchComm operations. The failing
/// 1x8 Gloo tests only exercised point-to-point send/recv on ranks 0 and 1, while ranks 2-7
/// skipped those calls and then all ranks entered `barrier()`. That left the ranks with different
/// next tags, causing the tearDown/world barriers to wait on different Gloo operations until
/// TestX killed the ranks"; the PR changed the tests, so the backend kept the counter). Here every
/// op of a communicator, a send or a receive included, takes the next tag of the rank's counter;
/// a collective's ranks meet under their tags (an exchange beside the op), and a rank whose
/// peers carry another tag waits for an op that never comes: its wait ends in a timeout.
#[derive(Default)]
pub struct GlooP2pTagSkew {
    next: AtomicU64,
    /// The tag exchanges beside the ops (the emulation's, left out of `outstanding()`).
    hidden: Hidden,
}

impl GlooP2pTagSkew {
    fn tag(&self) -> i64 {
        self.next.fetch_add(1, Ordering::SeqCst) as i64
    }
    /// `issue`'s op, met under this rank's next tag.
    fn tagged<T: Clone + Send + Sync + 'static>(
        &self,
        s: &Shm,
        op: &'static str,
        issue: impl FnOnce() -> Result<Work<T>>,
    ) -> Result<Work<T>> {
        let tag = self.tag();
        let mine = s.inner.upload(&Tensor::from_vec(&[1], vec![tag]))?;
        let (meet, held) = self.hidden.gather(s, &mine)?;
        let w = issue().inspect_err(|_| {
            let _ = meet.wait(BUG_WAIT);
        })?;
        let rank = s.rank();
        Ok(s.then(w, move |be, _| {
            let all = be.download(meet.wait(BUG_WAIT)?)?;
            drop(held);
            match all.as_slice::<i64>().iter().enumerate().find(|(_, &t)| t != tag) {
                None => Ok(()),
                Some((peer, &theirs)) => Err(CollectiveError::Timeout {
                    op: op.into(),
                    seq: tag as u64,
                    rank,
                    waited_ms: BUG_WAIT.as_millis() as u64,
                    detail: format!("gloo: waiting for tag {tag} from rank {peer}, which runs tag {theirs} (nextTag() skew)"),
                }),
            }
        }))
    }
}

impl Bug for GlooP2pTagSkew {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.tagged(s, "all_reduce", || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.tagged(s, "all_reduce_", || s.inner.all_reduce_(x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.tagged(s, "all_reduce_coalesced", || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.tagged(s, "all_reduce_coalesced_", || s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.tagged(s, "all_gather_into_tensor", || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.tagged(s, "all_gather_into_tensor_out", || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.tagged(s, "all_gather_into_tensor_coalesced", || s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.tagged(s, "reduce_scatter_tensor", || s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.tagged(s, "reduce_scatter_tensor_out", || s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.tagged(s, "reduce_scatter_tensor_coalesced", || s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.tagged(s, "all_to_all_single", || s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.tagged(s, "broadcast", || s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.tagged(s, "broadcast_", || s.inner.broadcast_(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.tagged(s, "permute_tensor", || s.inner.permute_tensor(x, src_dst))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.tagged(s, "reduce", || s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.tagged(s, "gather", || s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.tagged(s, "scatter", || s.inner.scatter(x, root))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.tagged(s, "barrier", || s.inner.barrier())
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.tag();
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.tag();
        s.inner.recv(out, src)
    }
}

// ---------------------------------------------------------------- open-mpi/ompi #13918

/// The first tag of libnbc's nonblocking-collective range on Open MPI v4.1.x (counted down).
const NBC_TAG_BASE: i64 = -27;
/// The tags `MPI_Dist_graph_create`'s edge exchange used on the parent (hard-coded).
const EDGE_TAGS: [i64; 2] = [-50, -51];
/// The nonblocking collectives one communicator creation runs on its parent (`ompi_comm_nextcid`'s
/// three allreduce rounds, `ompi_comm_activate`'s one).
const NBC_PER_CREATION: i64 = 4;

/// A parent's nonblocking-collective tag counter that walks into tags reserved for another
/// protocol (open-mpi/ompi #13918 "5.0.9 on Mac: MPI_Dist_graph_create randomly hangs when run
/// multiple times", "seemingly always on the 6th iteration"; fixed by PR #13931 "Reserve dist
/// graph tags outside the libnbc tag range": "The topo base code used hard-coded internal tags
/// -50 and -51 for this exchange. Those tags are reachable by the dynamic nonblocking collective
/// tag allocator. In repeated communicator creation, `comm->c_nbc_tag` can count down into
/// -50/-51 ... The resulting tag collision can leave the CID allocation request waiting
/// forever"; the v4.1.x backport, PR #14211, gives that branch's numbers: "the libnbc dynamic tag
/// allocator starts at `-27` and counts down"). Here every group made from a communicator first
/// exchanges its members' edges on the parent under the static tags -50 / -51, then runs the
/// creation's four nonblocking collectives on the parent under the next tags of the parent's
/// counter (from -27 down): the creation whose tags reach -50 / -51 (the sixth from one parent)
/// matches the edge traffic and waits forever; every rank of the parent ends its `new_group` in
/// a timeout. (The race that made the original hang one run in five is decided here the way it
/// hangs.)
pub struct NbcTagIntoReserved {
    next: AtomicI64,
}

/// How long the clashing creation waits before it gives up. The real one waits forever; the
/// catch is the named `new_group` failure at the sixth group, not the length of the wait, so 2 s
/// keeps its pin cheap.
const CREATION_GIVES_UP: std::time::Duration = std::time::Duration::from_secs(2);

impl Default for NbcTagIntoReserved {
    fn default() -> Self {
        NbcTagIntoReserved { next: AtomicI64::new(NBC_TAG_BASE) }
    }
}

impl Bug for NbcTagIntoReserved {
    fn group_made(&self, s: &Shm, ranks: &[usize], _made: Option<&Group>) -> Result<()> {
        let first = self.next.fetch_sub(NBC_PER_CREATION, Ordering::SeqCst);
        let tags: Vec<i64> = (0..NBC_PER_CREATION).map(|k| first - k).collect();
        let Some(clash) = tags.iter().find(|t| EDGE_TAGS.contains(t)) else { return Ok(()) };
        std::thread::sleep(CREATION_GIVES_UP);
        Err(CollectiveError::Timeout {
            op: "new_group".into(),
            seq: 0,
            rank: s.rank(),
            waited_ms: CREATION_GIVES_UP.as_millis() as u64,
            detail: format!(
                "group {ranks:?}: ompi_comm_nextcid's iallreduce under nbc tag {clash} (tags {tags:?}) matched the dist graph edge exchange's static tags {EDGE_TAGS:?}"
            ),
        })
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #6104

/// A rank whose own share of a collective is empty returns at once (open-mpi/ompi PR #6104
/// "OSHMEM: added processing of zero-length collectives" and its v4.0 backport PR #6124:
/// "according spec 1.4, annex C shmem collectives should process calls where number of
/// elements is zero independently from pointer value - added zero-count processing - it just
/// call barrier to sync ranks"; the fix's diff of `mca_scoll_basic_collect` turns `if
/// (nlong_type)` into `if (nlong_type && nlong)`: before it, a call with zero elements was not
/// processed as a collective, so a PE with nothing to contribute did not synchronise with the PEs
/// that had data). Here an `all_to_all_single` on a rank that sends nothing and receives nothing
/// completes at once without joining the collective: its peers' op waits for it, and its next
/// collective meets theirs one op late.
#[derive(Default)]
pub struct ZeroShareSkipsCollective;

impl Bug for ZeroShareSkipsCollective {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let rows = shape.first().copied().unwrap_or(0);
        let received = o.map_or(rows, |o| o.iter().sum());
        if s.ws() > 1 && s.numel(x) == 0 && received == 0 && i.is_none_or(|i| i.iter().all(|&n| n == 0)) {
            let mut out_shape = shape;
            if let Some(d0) = out_shape.first_mut() {
                *d0 = 0;
            }
            let out = s.inner.alloc(s.inner.buffer_dtype(x), &out_shape)?;
            return Ok(s.done(out, "all_to_all_single"));
        }
        s.inner.all_to_all_single(x, o, i)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<GlooP2pTagSkew>(
            "wild_gloo_p2p_tag_skew",
            "p2p.no_deadlock",
            "meta-pytorch/torchcomms PR #2964: every op, send / recv included, takes the next tag of a per-rank counter; after a pair's p2p the ranks' next collective waits on different tags and times out",
            &["p2p::recv_before_barrier::ws2"],
        ),
        spec::<NbcTagIntoReserved>(
            "wild_nbc_tag_into_reserved",
            "subgroups",
            "open-mpi/ompi #13918: each group made from a parent takes 4 nonblocking-collective tags of the parent's counter from -27 down; the sixth reaches the static edge-exchange tags -50 / -51 and new_group hangs",
            &["state::groups_each_without_a_rank::ws3"],
        ),
        spec::<ZeroShareSkipsCollective>(
            "wild_zero_share_skips_collective",
            "async.every_op_every_rank",
            "open-mpi/ompi PR #6104: an all_to_all_single on a rank that sends and receives nothing completes at once without joining; its peers wait and its next collective is one op behind",
            &["sizes::all_to_all_single::uneven::f32::grid::ws2"],
        ),
    ]
}
