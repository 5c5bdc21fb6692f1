//! The twenty-first hunt: bugs from the wild in communicator splitting, subgroups and
//! point-to-point. Each ports a correctness bug that shipped in a collective library or its
//! framework layer (Open MPI, PyTorch, TorchRec, NCCL), found in the project's issue or
//! pull-request thread named on its type, with the original's trigger (member order, root
//! position, message size) as far as the `Backend` trait lets a wrapper over shm reproduce it.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, Completion, DType, Result, Work};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- open-mpi/ompi #8854

/// A split that ignores the caller's order (open-mpi/ompi #8854 "MPI_Comm_split_type does not
/// treat 'key' correctly": the new communicator ranks its processes by their old rank, never by
/// the key; the same shape in pytorch/TensorRT PR #4380, where a process group `[5, 2]` was read
/// as `[2, 5]`, and in pytorch/pytorch PR #192777, LocalTensor's collectives on a group
/// `[0, 3, 1, 2]` built over its sorted ranks). Here `new_group(ranks)` builds the communicator
/// over `ranks` sorted: a member's rank is its place in world order, not in the list.
#[derive(Default)]
pub struct GroupSortedMembers;

impl Bug for GroupSortedMembers {
    fn group_ranks(&self, _s: &Shm, ranks: &[usize]) -> Vec<usize> {
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchrec PR #4601

/// A group-local root read as a global rank (meta-pytorch/torchrec PR #4601 "Use group-local rank
/// when broadcasting in collective_utils": the leader is chosen by `pg.rank()`, a group rank, and
/// the same number is passed to `broadcast_object_list` as `src`, a global rank). On a subgroup,
/// `broadcast(x, src)` roots at the member whose *world* rank is `src`, and fails ("Global rank
/// `src` is not part of group") when no member has that world rank. The world is unchanged
/// (there the two rank spaces coincide).
#[derive(Default)]
pub struct GroupRootAsGlobal;

impl GroupRootAsGlobal {
    fn root(s: &Shm, src: usize) -> Result<usize> {
        if !s.in_subgroup() || src >= s.ws() {
            return Ok(src); // the world, or a bad root: the correct backend's refusal
        }
        s.members.iter().position(|&m| m == src).ok_or_else(|| {
            CollectiveError::Backend(format!("broadcast_object_list: Global rank {src} is not part of group {:?}", s.members))
        })
    }
}

impl Bug for GroupRootAsGlobal {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, Self::root(s, src)?)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, Self::root(s, src)?)
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #192777

/// LocalTensor's rooted collectives on a subgroup (pytorch/pytorch PR #192777 "[LocalTensor]
/// Support permuted process group ranks in collectives", the `root_rank - offset` part): c10d
/// hands the backend a group-local root, and the code subtracts the group's offset (its lowest
/// world rank) from it as if it were global: `broadcast(src=5)` on `[4, 5, 6, 7]` arrives as root
/// 1 and becomes index `1 - 4` (a `KeyError: -3`). Here, on a subgroup whose lowest member is not
/// world rank 0, broadcast and scatter root at group rank `src - min(members)`, and fail when
/// that is negative or past the group.
#[derive(Default)]
pub struct GroupRootMinusOffset;

impl GroupRootMinusOffset {
    fn root(s: &Shm, src: usize) -> Result<usize> {
        let offset = s.members.iter().copied().min().unwrap_or(0);
        if !s.in_subgroup() || offset == 0 || src >= s.ws() {
            return Ok(src);
        }
        match src.checked_sub(offset) {
            Some(r) if r < s.ws() => Ok(r),
            _ => Err(CollectiveError::Backend(format!(
                "LocalTensor: KeyError: {} (root {src} - group offset {offset})",
                src as i64 - offset as i64
            ))),
        }
    }
}

impl Bug for GroupRootMinusOffset {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, Self::root(s, src)?)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, Self::root(s, src)?)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.scatter(x, Self::root(s, root)?)
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #345

/// Zero-sized point-to-point (NVIDIA/nccl #345 "ncclSend/ncclRecv: zero sized messages result in
/// invalid argument cuda errors", on the p2p preview branch before 2.7): a send or a recv of zero
/// elements fails with a CUDA invalid-argument error instead of completing as an empty message.
/// Both sides refuse at issue, so neither waits for the other.
#[derive(Default)]
pub struct ZeroSizeP2pInvalid;

impl ZeroSizeP2pInvalid {
    fn check(s: &Shm, b: &Buf, op: &str) -> Result<()> {
        if s.numel(b) == 0 {
            return Err(CollectiveError::Backend(format!("{op}: CUDA error 'invalid argument' (zero-sized message)")));
        }
        Ok(())
    }
}

impl Bug for ZeroSizeP2pInvalid {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Self::check(s, x, "ncclSend")?;
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::check(s, out, "ncclRecv")?;
        s.inner.recv(out, src)
    }
}

// ---------------------------------------------------------------- NVIDIA/nvalchemi-toolkit PR #155

/// Group-local peers read as global ranks (NVIDIA/nvalchemi-toolkit PR #155 "fix: keep DD
/// communication inside domain subgroups": the halo exchange's send / recv on a domain subgroup
/// passed domain-local peer numbers to PyTorch calls that take global ranks, so on the group
/// `{2, 3}` peer 0 meant global rank 0, "not part of group"). On a subgroup, `send(x, dst)` and
/// `recv(out, src)` address the member whose *world* rank is the peer, and fail when no member
/// has that world rank. The world is unchanged.
#[derive(Default)]
pub struct GroupPeerAsGlobal;

impl GroupPeerAsGlobal {
    fn peer(s: &Shm, p: usize) -> Result<usize> {
        if !s.in_subgroup() || p >= s.ws() {
            return Ok(p);
        }
        s.members
            .iter()
            .position(|&m| m == p)
            .ok_or_else(|| CollectiveError::Backend(format!("ValueError: Global rank {p} is not part of group {:?}", s.members)))
    }
}

impl Bug for GroupPeerAsGlobal {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(x, Self::peer(s, dst)?)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.recv(out, Self::peer(s, src)?)
    }
}

// ---------------------------------------------------------------- pmodels/mpich PR #3133

/// Out-of-order completion of receives posted together (pmodels/mpich PR #3133 "ch4/ofi:
/// Implement reorder logic in AM transport": the OFI provider does not complete messages in
/// order, easily seen over shared memory with several receive buffers posted, and CH4 took them
/// in completion order, so two messages from one peer could land in each other's receive). Here
/// a recv posted while an earlier recv from the same source, of the same dtype and shape, is
/// still unwaited pairs with it: once both messages are in, the earlier recv gets the later
/// message and the later recv the earlier one.
#[derive(Default)]
pub struct AmReorderPostedRecvs {
    /// The last unpaired recv from each source (dropped or waited: gone).
    open: Arc<Mutex<HashMap<usize, Weak<Mutex<Slot>>>>>,
}

struct Slot {
    inner: Work<Buf>,
    staging: Buf,
    out: Buf,
    key: (DType, Vec<usize>),
    partner: Option<Arc<Mutex<Slot>>>,
    written: bool,
}

struct ReorderedRecv {
    be: Arc<concord_shm::ShmBackend>,
    slot: Arc<Mutex<Slot>>,
}

impl ReorderedRecv {
    /// Writes this recv's output (its partner's message where paired) once both are in.
    /// Never holds its own lock and its partner's together (two threads settling a pair from
    /// both ends would deadlock): its own state first, then the partner's, then its own again.
    fn settle(&self, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        let (own, partner) = {
            let me = lock(&self.slot);
            if me.written {
                return Ok(true);
            }
            if me.inner.wait(timeout).is_err() && !me.inner.is_completed() {
                return Ok(false);
            }
            me.inner.wait(Duration::ZERO)?;
            (me.staging.clone(), me.partner.clone())
        };
        let source = match partner {
            None => own,
            Some(p) => {
                let p = lock(&p);
                let left = timeout.saturating_sub(start.elapsed()).min(BUG_WAIT);
                match p.inner.wait(left) {
                    Ok(_) => p.staging.clone(),
                    Err(_) if !p.inner.is_completed() => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
        };
        let t = self.be.download(&source)?;
        let mut me = lock(&self.slot);
        if !me.written {
            self.be.write(&me.out, &t)?;
            me.written = true;
        }
        Ok(true)
    }
}

impl Completion for ReorderedRecv {
    fn is_completed(&self) -> bool {
        let (written, own, partner) = {
            let me = lock(&self.slot);
            (me.written, me.inner.is_completed(), me.partner.clone())
        };
        let ready = written || (own && partner.is_none_or(|p| lock(&p).inner.is_completed()));
        ready && self.settle(Duration::ZERO).unwrap_or(true)
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        self.settle(timeout)
    }
}

impl Bug for AmReorderPostedRecvs {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(out), s.inner.buffer_shape(out));
        if src >= s.ws() || src == s.rank() {
            return s.inner.recv(out, src); // a bad peer: the correct backend's refusal
        }
        let staging = s.inner.alloc(key.0, &key.1)?;
        let inner = s.inner.recv(&staging, src)?;
        let meta = inner.meta().clone();
        let slot = Arc::new(Mutex::new(Slot { inner, staging, out: out.clone(), key: key.clone(), partner: None, written: false }));
        {
            let mut open = lock(&self.open);
            let earlier = open.get(&src).and_then(Weak::upgrade);
            match earlier {
                Some(e)
                    if {
                        let e = lock(&e);
                        !e.written && e.partner.is_none() && e.key == key
                    } =>
                {
                    lock(&e).partner = Some(slot.clone());
                    lock(&slot).partner = Some(e.clone());
                    open.remove(&src);
                }
                _ => {
                    open.insert(src, Arc::downgrade(&slot));
                }
            }
        }
        Ok(Work::new(out.clone(), Arc::new(ReorderedRecv { be: s.inner.clone(), slot }), meta, &s.own))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #38642

/// A receive that is not ordered after the fill of its fresh buffer (pytorch/pytorch #38642
/// "Synchronization problem in torch.distributed with MPI on CUDA": `recv_buffer =
/// torch.zeros_like(x)` is still running on the stream when the CUDA-aware MPI receive writes
/// the buffer, so the zero fill lands after the message; large messages only, 100000 f32 in the
/// report). Here a recv of at least 100000 elements into a buffer that is all zeros at issue
/// completes with the buffer all zeros again (the late fill wins).
#[derive(Default)]
pub struct RecvBeforePendingFill;

impl RecvBeforePendingFill {
    const MIN_ELEMENTS: usize = 100_000;
}

impl Bug for RecvBeforePendingFill {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let fresh = s.numel(out) >= Self::MIN_ELEMENTS && s.inner.download(out)?.bytes().iter().all(|&b| b == 0);
        let w = s.inner.recv(out, src)?;
        if !fresh {
            return Ok(w);
        }
        Ok(s.then(w, |be, r| crate::edit(be, r, |t| t.bytes_mut().fill(0))))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #153798

/// A split of a subgroup in the wrong rank space (pytorch/pytorch PR #153798 "[c10d] Fix
/// `new_subgroups(group=)` bug", introduced by #152765: splitting a non-world group compared
/// `get_rank(group)`, a group rank, with the subgroups' lists of global ranks, so a process
/// joined the subgroup of other members). Here `new_group(ranks)` called on a subgroup reads
/// `ranks` as world ranks (and translates each to the parent's rank of that world rank, failing
/// when the parent has no such member); where the parent's ranks are the world's (the world, or
/// a group `[0, 1, ..]`) the two spaces coincide and nothing changes.
#[derive(Default)]
pub struct NestedGroupRanksAsGlobal;

impl Bug for NestedGroupRanksAsGlobal {
    fn group_ranks(&self, s: &Shm, ranks: &[usize]) -> Vec<usize> {
        if s.members.iter().enumerate().all(|(i, &m)| i == m) {
            return ranks.to_vec(); // the world (or a group in world order): the spaces coincide
        }
        // A world rank the parent lacks becomes an out-of-range parent rank: the correct
        // backend's refusal stands in for the original's error.
        ranks.iter().map(|&r| s.members.iter().position(|&m| m == r).unwrap_or(s.ws() + r)).collect()
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<GroupSortedMembers>(
            "wild_group_sorted_members",
            "subgroups",
            "open-mpi/ompi#8854, pytorch/TensorRT PR #4380, pytorch/pytorch PR #192777: new_group builds the communicator over its ranks sorted (ranks by world order)",
            &["subgroup::reversed::all_reduce::out::f32::sum::ws2"],
        ),
        spec::<GroupRootAsGlobal>(
            "wild_group_root_as_global",
            "subgroups",
            "meta-pytorch/torchrec PR #4601: a subgroup broadcast's group-local src read as a global rank (fails when no member has it)",
            &["subgroup::halves::broadcast::out::f32::ws2"],
        ),
        spec::<GroupRootMinusOffset>(
            "wild_group_root_minus_offset",
            "subgroups",
            "pytorch/pytorch PR #192777: a subgroup broadcast / scatter roots at src - (lowest member's world rank), fails out of range",
            &["subgroup::halves::broadcast::out::f32::ws2"],
        ),
        spec::<ZeroSizeP2pInvalid>(
            "wild_zero_size_p2p_invalid",
            "p2p.matching",
            "NVIDIA/nccl#345: a zero-element send or recv fails with CUDA invalid argument",
            &["send_recv::outbuf::i8::ws2"],
        ),
        spec::<GroupPeerAsGlobal>(
            "wild_group_peer_as_global",
            "subgroups",
            "NVIDIA/nvalchemi-toolkit PR #155: a subgroup send / recv's group-local peer read as a global rank (fails when no member has it)",
            &["subgroup::halves::send_recv::outbuf::f32::ws4"],
        ),
        spec::<AmReorderPostedRecvs>(
            "wild_am_reorder_posted_recvs",
            "p2p.order",
            "pmodels/mpich PR #3133: two recvs from one peer posted together (same dtype, shape) complete out of order: each gets the other's message",
            &["p2p::in_flight_in_order::same_size::n4::ws2"],
        ),
        spec::<RecvBeforePendingFill>(
            "wild_recv_before_pending_fill",
            "values.move",
            "pytorch/pytorch#38642: a recv of >= 100000 elements into a fresh all-zero buffer ends all zeros (the buffer's pending fill lands after the message)",
            &["p2p::in_flight_in_order::mixed_protocols::ws2"],
        ),
        spec::<NestedGroupRanksAsGlobal>(
            "wild_nested_group_ranks_as_global",
            "subgroups",
            "pytorch/pytorch PR #153798: new_group on a subgroup reads its ranks as world ranks (splitting a group in the wrong rank space)",
            &["wild_groups::nested::ws2", "wild_groups::nested::ws4"],
        ),
    ]
}
