//! The thirty-fourth hunt: bugs from the wild in hierarchical and topology-aware algorithms.
//! Each ports a bug that shipped in a collective library (Open MPI's HAN, UCC's hierarchical
//! CL, MPICH's SMP-aware collectives, NCCLX's ctran, Faabric's locality-aware MPI), found in the
//! project's issue or pull-request thread named on its type: blocks stitched back in node order
//! instead of rank order, a reorder copy whose source and destination are swapped, a pipeline
//! ring that assumes every node is full, a root alone on its node, a node leader that
//! accumulates its node's partial result in the caller's input. shm is one host, so each mutant
//! forms virtual "nodes" by a rule a real launch gives (ranks placed round robin over two
//! domains, as `mpirun --map-by node` / `--map-by numa` does; or blocks of a fixed number of
//! ranks per node, as a launcher's `--ntasks-per-node` does) and runs the two-level algorithm
//! the real bug was in, with the bug.

use crate::bugs_hunt28::at;
use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, set_f64, then_gathered, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Tensor, Work, WorldInfo};

/// The world rank of communicator rank `r` (a node is where a process runs: its world rank's).
fn world_rank_of(s: &Shm, r: usize) -> usize {
    s.members.get(r).copied().unwrap_or(r)
}

/// Domains the round-robin placement spreads ranks over (two nodes, or two sockets / NUMA
/// domains of one host: `--map-by node` over two hosts, `--map-by numa` on a two-socket host).
const DOMAINS: usize = 2;

/// The communicator's ranks in node order: node 0's ranks (ascending), then node 1's, ...; the
/// node of a rank is its world rank modulo [`DOMAINS`] (round-robin placement).
fn node_order(s: &Shm) -> Vec<usize> {
    let ws = s.ws();
    (0..DOMAINS).flat_map(|d| (0..ws).filter(move |&r| world_rank_of(s, r) % DOMAINS == d)).collect()
}

/// Whether every node holds the same number of the communicator's ranks (HAN's
/// `are_ppn_imbalanced` is false).
fn balanced(s: &Shm) -> bool {
    let counts: Vec<usize> = (0..DOMAINS).map(|d| (0..s.ws()).filter(|&r| world_rank_of(s, r) % DOMAINS == d).count()).collect();
    counts.iter().all(|&c| c == counts[0])
}

/// `t` (blocks of `block` bytes by rank) with its block at position `k` replaced by block
/// `order[k]`: the blocks laid out in the order the nodes delivered them.
fn in_node_order(t: &mut Tensor, order: &[usize]) {
    let block = t.bytes().len() / order.len().max(1);
    let by_rank = t.clone();
    for (k, &r) in order.iter().enumerate() {
        copy_bytes(t, k * block, &by_rank, r * block, block);
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #1103

/// UCC's hierarchical all-gather whose node subgroups are not contiguous in team rank order
/// (openucx/ucc PR #1103 "CL/HIER: Allgatherv node sbgp unpack": "there was an issue in the case
/// that the ranks in each node subgroup are not contiguous in the team rank order. For example,
/// say you ran with mpirun --map-by node ... node0: {rank0, rank2} node1: {rank1, rank3}. Then
/// the destination buffer after the allgatherv is done on each node will look like {0,2,1,3},
/// when it really should be in order of the ranks in the team"; the first version, PR #1016,
/// said "Situation where the ranks are not in a continuous order across nodes is not handled
/// yet"). The algorithm gathers inside each node, all-gathers between the node leaders, and
/// broadcasts inside each node, with no unpack step. Here ranks are placed round robin over two
/// nodes (a rank's node is its world rank modulo 2), and an all_gather (out, `_out`, coalesced)
/// on a communicator whose ranks are not node-contiguous (3 ranks or more) returns the blocks in
/// node order: the even ranks' blocks first, then the odd ranks'.
#[derive(Default)]
pub struct UccHierAllgatherNodeOrder;

impl UccHierAllgatherNodeOrder {
    /// The node order when it is not the rank order (else `None`: the leaders' all-gather is
    /// already in rank order).
    fn order(s: &Shm) -> Option<Vec<usize>> {
        let order = node_order(s);
        (order.iter().enumerate().any(|(k, &r)| k != r)).then_some(order)
    }
    fn issue(s: &Shm, call: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let w = call()?;
        let Some(order) = Self::order(s) else { return Ok(w) };
        Ok(s.then(w, move |be, out| edit(be, out, |t| in_node_order(t, &order))))
    }
}

impl Bug for UccHierAllgatherNodeOrder {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        let Some(order) = Self::order(s) else { return Ok(w) };
        Ok(s.then(w, move |be, outs| outs.iter().try_for_each(|out| edit(be, out, |t| in_node_order(t, &order)))))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi #11664

/// HAN's gather whose reorder copy has its source and destination swapped (open-mpi/ompi #11664
/// "Is this a bug in COLL/HAN?": "when the rank is not map by core memory reorder is needed in
/// MPI_Gather. But is there a mistake in the order of the two arguments `pDestBuf` and
/// `pSrcBuf`? I think the data is transferred from `reorder_rbuf + src_shift` to `(char *)rbuf +
/// dest_shift`"). `mca_coll_han_gather_intra` gathers into a temporary `reorder_rbuf` when the
/// ranks are not mapped by core (the low gather inside each node, then the up gather between
/// the leaders, leave the blocks in node order), then copies block `i` to its rank's place with
/// `ompi_datatype_copy_content_same_ddt(rdtype, rcount, reorder_rbuf + src_shift,
/// (char *)rbuf + dest_shift)`, whose third argument is the destination: the caller's buffer is copied into
/// the temporary one, which is freed, and the caller's buffer is never written. HAN takes this
/// path only on balanced nodes (it falls back when `are_ppn_imbalanced`). Here ranks are placed
/// round robin over two nodes (a rank's node is its world rank modulo 2): a gather on an even
/// number of ranks, 4 or more, leaves the root's output as it was before the call (a fresh
/// buffer, never written).
#[derive(Default)]
pub struct HanGatherReorderReversed;

impl Bug for HanGatherReorderReversed {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let w = be.gather(x, root)?;
        let mapbycore = node_order(s).iter().enumerate().all(|(k, &r)| k == r);
        if s.rank() != root || mapbycore || !balanced(s) {
            return Ok(w);
        }
        let out = w.peek().clone();
        let untouched = be.alloc(be.buffer_dtype(&out), &be.buffer_shape(&out))?;
        Ok(s.then_as(w, untouched, |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #2119

/// The NVLink clique of NCCLX's GB200 racks in the thread (`cliqueSize=6`): the local ranks of
/// ctran's pipelined all-gather.
const CTRAN_LOCAL_RANKS: usize = 6;

/// ctran's pipelined all-gather (AllGatherP) over a world that its local-rank count does not
/// divide (meta-pytorch/torchcomms PR #2119 "Add divisibility check for AllGatherP pipeline
/// algorithm": "The AllGatherP pipeline algorithm requires nRanks to be evenly divisible by
/// nLocalRanks. When this invariant is violated (e.g., when the physical MNNVL domain size is 6
/// and the communicator has 32 ranks), the ring-based pipeline produces incorrect results",
/// causing "The ring to not visit all nodes in nNodes-1 steps" and "Potential data corruption
/// from misaligned buffer offsets"; the fix refuses such communicators with `commInvalidUsage`).
/// The pipeline all-gathers inside each NVLink domain and runs a ring between the
/// `nNodes = nRanks / nLocalRanks` domains. Here ranks form domains of 6 in rank order (rank
/// `r` in domain `r / 6`), and an all_gather (out, `_out`, coalesced) on more than 6 ranks, not
/// a multiple of 6, rings over the full domains only: a rank of a full domain never receives
/// the short last domain's blocks, and a rank of the short domain gets its own domain's blocks
/// only. The blocks not received keep what the output held before the call (a fresh output:
/// zeros).
#[derive(Default)]
pub struct CtranAllGatherPPartialDomain;

impl CtranAllGatherPPartialDomain {
    /// Whether rank `me` receives rank `q`'s block.
    fn received(me: usize, q: usize, ws: usize) -> bool {
        let full = ws / CTRAN_LOCAL_RANKS * CTRAN_LOCAL_RANKS;
        if me >= full {
            q >= full
        } else {
            q < full
        }
    }
    fn fires(s: &Shm) -> bool {
        let ws = s.ws();
        ws > CTRAN_LOCAL_RANKS && !ws.is_multiple_of(CTRAN_LOCAL_RANKS)
    }
    /// `t` with the blocks `me` never receives set back to `before`'s (zeros when `None`).
    fn unreceived(t: &mut Tensor, before: Option<&Tensor>, me: usize, ws: usize) {
        let block = t.bytes().len() / ws;
        for q in (0..ws).filter(|&q| !Self::received(me, q, ws)) {
            match before {
                Some(b) => copy_bytes(t, q * block, b, q * block, block),
                None => t.bytes_mut()[q * block..(q + 1) * block].fill(0),
            }
        }
    }
    fn issue(s: &Shm, out: Option<&Buf>, call: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        if !Self::fires(s) {
            return call();
        }
        let before = match out {
            Some(o) => Some(s.inner.download(o)?),
            None => None,
        };
        let (me, ws) = (s.rank(), s.ws());
        let w = call()?;
        Ok(s.then(w, move |be, o| edit(be, o, |t| Self::unreceived(t, before.as_ref(), me, ws))))
    }
}

impl Bug for CtranAllGatherPPartialDomain {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, None, || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, Some(out), || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        if !Self::fires(s) {
            return Ok(w);
        }
        let (me, ws) = (s.rank(), s.ws());
        Ok(s.then(w, move |be, outs| outs.iter().try_for_each(|o| edit(be, o, |t| Self::unreceived(t, None, me, ws)))))
    }
}

// ---------------------------------------------------------------- pmodels/mpich #6893

/// Ranks per node of the block placement (`--ntasks-per-node=4`, 4 GPUs per node): rank `r`
/// is on node `r / 4`, the last node short when 4 does not divide the world.
const RANKS_PER_NODE: usize = 4;
/// MPICH's `MPIR_CVAR_REDUCE_SHORT_MSG_SIZE` default (bytes): larger reduces leave the binomial
/// tree.
const MPICH_REDUCE_SHORT_MSG: usize = 2048;

/// MPICH's SMP-aware reduce with the root alone on its node (pmodels/mpich #6893 "Erroneous
/// MPI_Reduce Results with Data Sets larger than 2KB in Multi-Server Configurations": "MPI_Reduce,
/// specifically during addition reduction operations, yields incorrect results when dealing with
/// data sets larger than 2KB in size. This problem only manifests in a distributed environment
/// spanning multiple servers, under the condition that the root process (rank 0) is exclusively
/// running on its own server, and at least one of the other servers hosts more than one MPI
/// process"; in the reproducer the result was right only when the root's receive buffer already
/// held the root's own values: "if (myrank == 0) recvBuf[i] = 12;//After uncommenting, the
/// program runs with correct results"). The root's contribution was taken from its receive
/// buffer, not its send buffer. Here ranks are placed 4 per node in rank order, and a `sum`
/// reduce of more than 2,048 bytes whose root is the only rank of its node (the last node short
/// to one rank: 5, 9, 13, ... ranks, rooted at the last) while another node holds more ranks
/// gives the root the sum of every other rank's input and its output buffer's prior content (a
/// fresh output: zeros) in place of its own input.
#[derive(Default)]
pub struct MpichReduceRootAloneOnNode;

impl MpichReduceRootAloneOnNode {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> bool {
        let ws = s.ws();
        let node = |r: usize| world_rank_of(s, r) / RANKS_PER_NODE;
        let alone = (0..ws).filter(|&r| node(r) == node(root)).count() == 1;
        let crowded = (0..ws).any(|r| r != root && (0..ws).filter(|&q| node(q) == node(r)).count() > 1);
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        op == ReduceOp::Sum && root < ws && alone && crowded && bytes > MPICH_REDUCE_SHORT_MSG
    }
}

impl Bug for MpichReduceRootAloneOnNode {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        if !Self::fires(s, x, op, root) {
            return be.reduce(x, op, root);
        }
        let (me, ws, n) = (s.rank(), s.ws(), s.numel(x));
        then_gathered(
            s,
            be.all_gather_into_tensor(x)?,
            |g| g,
            || be.reduce(x, op, root),
            |b: &Buf| Some(b),
            move |all, t| {
                if me != root {
                    return;
                }
                for i in 0..n {
                    let others: f64 = (0..ws).filter(|&q| q != root).map(|q| at(all, n, q, i)).sum();
                    set_f64(t, i, others);
                }
            },
        )
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #1111

/// UCC's hierarchical all-gather with a node leader alone on its node (openucx/ucc PR #1111
/// "CL/HIER: Allgatherv lone node leader", the follow-up to PR #1103: "This PR fixes the case
/// where a node leader is the only rank on the node. In that case, the node subgroup wont exist
/// and he'll have to memcpy the src buf to the scratch buffer"). The node leaders all-gather, from
/// a scratch buffer, what the gather inside each node put there; a leader with no node subgroup
/// runs no gather, so its own block never reaches the scratch and the leaders' exchange sends
/// what the scratch held. Here ranks are placed 4 per node in rank order (a team that spans more
/// than one node: 5 ranks or more), and an all_gather (out, `_out`, coalesced) whose last node
/// holds one rank (5, 9, 13, ... ranks) gives every rank zeros (a fresh scratch) in place of
/// that rank's block.
#[derive(Default)]
pub struct UccHierAllgatherLoneLeader;

impl UccHierAllgatherLoneLeader {
    /// The communicator ranks alone on their node, when the team spans more than one node.
    fn lone(s: &Shm) -> Vec<usize> {
        let ws = s.ws();
        let node = |r: usize| world_rank_of(s, r) / RANKS_PER_NODE;
        let nodes: std::collections::BTreeSet<usize> = (0..ws).map(node).collect();
        if nodes.len() < 2 {
            return Vec::new();
        }
        (0..ws).filter(|&r| (0..ws).filter(|&q| node(q) == node(r)).count() == 1).collect()
    }
    fn blank(t: &mut Tensor, lone: &[usize], ws: usize) {
        let block = t.bytes().len() / ws;
        for &r in lone {
            t.bytes_mut()[r * block..(r + 1) * block].fill(0);
        }
    }
    fn issue(s: &Shm, call: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let w = call()?;
        let (lone, ws) = (Self::lone(s), s.ws());
        if lone.is_empty() {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| edit(be, out, |t| Self::blank(t, &lone, ws))))
    }
}

impl Bug for UccHierAllgatherLoneLeader {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Self::issue(s, || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        let (lone, ws) = (Self::lone(s), s.ws());
        if lone.is_empty() {
            return Ok(w);
        }
        Ok(s.then(w, move |be, outs| outs.iter().try_for_each(|o| edit(be, o, |t| Self::blank(t, &lone, ws)))))
    }
}

// ---------------------------------------------------------------- faasm/faabric PR #195

/// Faabric's locality-aware reduce whose remote leader accumulates in the caller's send buffer
/// (faasm/faabric PR #195 "Fix bug in `MPI_Reduce`", a bug introduced by PR #191 "Locality Aware
/// Reduce": "When performing the locality-aware reduce in a local leader that is not co-located
/// with the rank that originated the reduce, we perform the following operations: 1. Receive
/// data from local ranks. 2. Reduce data from local ranks (and ours). 3. Send reduced results to
/// the rank that originated the reduce. ... in (2) we were accumulating the partial reduce in the
/// same buffer the local leader's data was provided (i.e. `sendBuffer`) ... said `sendBuffer` is
/// a pointer to the application's memory, and the application is not expecting that memory to be
/// modified"). Here ranks are placed 4 per host in rank order, a host's leader is its lowest
/// rank, and a reduce (any op) whose root is on another host leaves, in each such leader's
/// input, its host's partial reduction (the leader's input and its local ranks', combined by the
/// op). The root's result is right.
#[derive(Default)]
pub struct FaabricReduceLeaderSendBuffer;

impl Bug for FaabricReduceLeaderSendBuffer {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let be = &*s.inner;
        let (me, ws, n) = (s.rank(), s.ws(), s.numel(x));
        let host = |r: usize| world_rank_of(s, r) / RANKS_PER_NODE;
        let locals_of = |r: usize| -> Vec<usize> { (0..ws).filter(|&q| host(q) == host(r)).collect() };
        // A remote leader: the lowest rank of a host of two or more ranks, not the root's host.
        let remote_leader = |r: usize| locals_of(r).first() == Some(&r) && locals_of(r).len() > 1 && host(root) != host(r);
        // Decided from the call alone, the same on every rank: every rank joins the gather.
        let fires = ws > 1 && root < ws && n > 0 && (0..ws).any(remote_leader);
        if !fires || !matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::Product) {
            return be.reduce(x, op, root);
        }
        let (leader, locals) = (remote_leader(me), locals_of(me));
        let gather = be.all_gather_into_tensor(x)?;
        let input = x.clone();
        let w = be.reduce(x, op, root).inspect_err(|_| {
            let _ = gather.wait(BUG_WAIT);
        })?;
        Ok(s.then(w, move |be, _| {
            let all = be.download(gather.wait(BUG_WAIT)?)?;
            if !leader {
                return Ok(());
            }
            edit(be, &input, |t| {
                for i in 0..n {
                    let vals = locals.iter().map(|&q| at(&all, n, q, i));
                    let v = match op {
                        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                        ReduceOp::Product => vals.product(),
                        _ => vals.sum(),
                    };
                    set_f64(t, i, v);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #2385

/// GPUs per node of the thread's cluster (8 ranks per node, in rank order).
const NCCL_RANKS_PER_NODE: usize = 8;

/// NCCL's bootstrap with unevenly filled nodes (NVIDIA/nccl #2385 "Deadlock in bootstrap when
/// ranks are unevenly distributed across nodes (7+8), contiguousRanksPerHost falls back to
/// INT_MAX": "A communicator built with an unequal number of ranks per node (7 on one node, 8
/// on the other) deadlocks during `ncclCommInitRank` and never reaches the collective. The same
/// job with an equal number of ranks per node works fine, both at full size (8+8) and reduced
/// size (7+7), so the trigger is the per-node mismatch"). Here ranks are placed 8 per node in
/// rank order, and a world of more than 8 ranks that 8 does not divide (its last node short:
/// 9 to 15, 17 to 23, ... ranks) never completes its init: every rank's bootstrap waits for
/// peers that wait too, and ends at the bug's own deadline (15 s) with a timeout.
#[derive(Default)]
pub struct NcclUnevenNodesBootstrap;

impl Bug for NcclUnevenNodesBootstrap {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        let ws = world.world_size;
        if ws > NCCL_RANKS_PER_NODE && !ws.is_multiple_of(NCCL_RANKS_PER_NODE) {
            std::thread::sleep(BUG_WAIT);
            return Err(CollectiveError::Timeout {
                op: "init".into(),
                seq: 0,
                rank: world.rank,
                waited_ms: BUG_WAIT.as_millis() as u64,
                detail: format!(
                    "bootstrap: {ws} ranks on nodes of {NCCL_RANKS_PER_NODE} (the last holds {}): contiguousRanksPerHost fell back to INT_MAX; no peer answered",
                    ws % NCCL_RANKS_PER_NODE
                ),
            });
        }
        Ok(world.clone())
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<UccHierAllgatherNodeOrder>(
            "wild_ucc_hier_allgather_node_order",
            "values.move",
            "openucx/ucc PR #1103: a hierarchical all_gather over nodes whose ranks are not contiguous (round robin over 2 nodes) returns the blocks in node order (0,2,4,..,1,3,..)",
            &["all_gather_into_tensor::out::f32::ws3"],
        ),
        spec::<HanGatherReorderReversed>(
            "wild_han_gather_reorder_reversed",
            "values.move",
            "open-mpi/ompi#11664: HAN's gather reorder copy has source and destination swapped: on balanced round-robin nodes (even ws >= 4) the root's output is never written",
            &["gather::out::f32::ws4"],
        ),
        spec::<CtranAllGatherPPartialDomain>(
            "wild_ctran_allgatherp_partial_domain",
            "values.move",
            "meta-pytorch/torchcomms PR #2119: ctran's pipelined all_gather rings over nRanks / 6 full NVLink domains only: above 6 ranks, not a multiple of 6, the short domain's blocks and the full domains' never cross",
            &["all_gather_into_tensor::out::f32::ws8"],
        ),
        spec::<MpichReduceRootAloneOnNode>(
            "wild_mpich_reduce_root_alone_on_node",
            "values.reduce",
            "pmodels/mpich#6893: a sum reduce over 2 KiB whose root is alone on its node (4 ranks per node, the last node short to one rank) takes the root's contribution from its output buffer, not its input",
            &["reduce::out::f32::sum::ws5"],
        ),
        spec::<UccHierAllgatherLoneLeader>(
            "wild_ucc_hier_allgather_lone_leader",
            "values.move",
            "openucx/ucc PR #1111: a hierarchical all_gather whose node leader is alone on its node (4 ranks per node, the last node of one rank) never copies its block into the scratch: every rank gets zeros there",
            &["all_gather_into_tensor::out::f32::ws5"],
        ),
        spec::<FaabricReduceLeaderSendBuffer>(
            "wild_faabric_reduce_leader_sendbuf",
            "values.reduce",
            "faasm/faabric PR #195: a locality-aware reduce's host leader (4 ranks per host) not on the root's host accumulates its host's partial result in the caller's input buffer",
            &["reduce::out::f32::sum::ws5"],
        ),
        spec::<NcclUnevenNodesBootstrap>(
            "wild_nccl_uneven_nodes_bootstrap",
            "values.world_sizes",
            "NVIDIA/nccl#2385: a world whose last node of 8 is short (9-15, 17-23, ... ranks) deadlocks in the bootstrap: init ends in a timeout",
            &["sizes::wide::ws33"],
        ),
    ]
}
