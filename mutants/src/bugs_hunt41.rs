//! The forty-first hunt: bugs from the wild in subcommunicators and rank translation. Each ports
//! a bug that shipped in a collective library or its framework layer (the StableHLO reference
//! interpreter, TensorFlow's TPU CollectivePermute, Horovod's process sets, MindSpore's
//! hyper-parallel torch platform, Paddle's `new_group`, PyTorch's functional p2p), found in the
//! project's issue or pull-request thread named on its type: an all_to_all whose received blocks
//! are stitched in process-id order instead of group order, a permutation whose ids are read in
//! the devices' numbering, equivalent groups that share one process set so that dropping one
//! removes the other, a group of the whole world that is the world's own communicator so that
//! dropping it destroys the world, a group of one rank left unset (its member told it is not in
//! it), and a p2p peer translated to its global rank and read as a group rank. The trigger
//! (members not in world order, an 8-rank communicator, two groups over one member list alive at
//! once, a group of every rank in world order dropped, a group of one, a group that is not the
//! world's first ranks) is kept as far as a wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, lock, Buf, Bug, Group, Shm};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Work};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

// ---------------------------------------------------------------- openxla/stablehlo #2433

/// An all_to_all whose received blocks are concatenated in process-id order (openxla/stablehlo
/// #2433 "Bug report on all_to_all implementation in stablehlo interpreter": with
/// `replica_groups = [[1, 0]]` the result did not follow the spec's `scattered_parts@receiver =
/// [split_parts@sender[receiver_index] for sender in process_group]`; fixed by PR #2457, whose
/// diff replaces `process->rendezvous(*processGroup, channelId, {operand}).getSortedTensors()`
/// — the senders' tensors sorted by process id — so that "the order of `split_part` in
/// `scattered_parts` matches with the order of the `sender/processes` within the
/// `process_group`"). Here every rank's all_to_all_single on a communicator whose members are
/// not in world order receives the right block from each sender (the split index is the
/// receiver's group rank) but stitches the blocks by the senders' world ranks: a group `[1, 0]`
/// gets its two blocks swapped.
#[derive(Default)]
pub struct StablehloA2aSortedByProcessId;

impl Bug for StablehloA2aSortedByProcessId {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let members = s.members.clone();
        if members.windows(2).all(|p| p[0] < p[1]) {
            return Ok(w);
        }
        let out_splits = o.map(<[usize]>::to_vec);
        Ok(s.then(w, move |be, out| {
            let shape = be.buffer_shape(out);
            let n = members.len();
            let d0 = shape.first().copied().unwrap_or(0);
            if d0 == 0 {
                return Ok(());
            }
            let numel: usize = shape.iter().product();
            let row = be.buffer_dtype(out).size() * (numel / d0);
            let rows = out_splits.unwrap_or_else(|| vec![d0 / n; n]);
            let mut start = vec![0; n];
            for j in 1..n {
                start[j] = start[j - 1] + rows[j - 1];
            }
            // The senders (group ranks) sorted by process id (world rank).
            let mut by_id: Vec<usize> = (0..n).collect();
            by_id.sort_by_key(|&j| members[j]);
            edit(be, out, |t| {
                let got = t.clone();
                let mut at = 0;
                for &j in &by_id {
                    copy_bytes(t, at * row, &got, start[j] * row, rows[j] * row);
                    at += rows[j];
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- tensorflow/tensorflow #40250

/// The numbering of an 8-core TPU as CollectivePermute reads it (tensorflow/tensorflow #40250).
const TPU_CORE_OF: [usize; 8] = [0, 1, 2, 3, 6, 7, 4, 5];

/// A permutation whose ids are read in the devices' numbering, not the replicas'
/// (tensorflow/tensorflow #40250 "tf.raw_ops.CollectivePermute bug caused by strange device
/// numbering": "The 8 cores are numbered as 0,1,2,3,6,7,4,5 by CollectivePermute and
/// tensorflow.python.tpu.ops.tpu_ops.all_to_all. They should be numbered as 0,1,2,3,4,5,6,7";
/// the reproducer's ring `[[0,1],[1,2],...,[7,0]]` on `replica_id_in_sync_group` came back
/// shuffled). Here permute_tensor on a communicator of 8 ranks translates every source and
/// target through that numbering: rank `k`'s pair `(k, src_dst[k])` moves the data of rank
/// `TPU_CORE_OF[k]` to rank `TPU_CORE_OF[src_dst[k]]`. Ranks 0-3 are numbered right, so a
/// permutation that stays among them, or any communicator of another size, is right.
#[derive(Default)]
pub struct TfPermuteDeviceNumbering;

impl Bug for TfPermuteDeviceNumbering {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        if s.ws() != TPU_CORE_OF.len() || src_dst.len() != TPU_CORE_OF.len() || src_dst.iter().any(|&d| d >= TPU_CORE_OF.len()) {
            return s.inner.permute_tensor(x, src_dst);
        }
        let mut read = vec![0; src_dst.len()];
        for (k, &d) in src_dst.iter().enumerate() {
            read[TPU_CORE_OF[k]] = TPU_CORE_OF[d];
        }
        s.inner.permute_tensor(x, &read)
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #2839

/// One process set of this process: its members (world ranks, in order), the communicator every
/// equivalent handle shares, its id and whether it was removed.
struct ProcessSet {
    members: Vec<usize>,
    comm: Arc<ShmBackend>,
    id: u64,
    removed: Arc<AtomicBool>,
}

/// The process sets this process registered ([`EquivalentProcessSetsRemoved`]).
static PROCESS_SETS: Mutex<Vec<ProcessSet>> = Mutex::new(Vec::new());
/// The next process set id (the world is 0).
static NEXT_SET_ID: AtomicU64 = AtomicU64::new(1);

/// A handle's view of its process set: its id and the flag `remove_process_set` raises.
#[derive(Clone)]
struct SetHandle {
    id: u64,
    removed: Arc<AtomicBool>,
}

/// Equivalent process sets share one entry, and removing any handle removes it for all
/// (horovod/horovod PR #2839 "Concurrently running collective operations on process subsets",
/// the review of `process_sets.py`'s `_id_to_process_sets: Dict[int, List[ProcessSet]]`; the
/// author: "if a user managed to create lots of equivalent `ProcessSet` instances, then removing
/// one of them should either invalidate all of them (current implementation) or pop that handle
/// of the list until it's empty"; the reviewer: "`ps1 = hvd.add_process_set([0,1,2,3])`, `ps2 =
/// hvd.add_process_set([0,1,2,3])`, `hvd.remove_process_set(ps1)` — should `ps2` still work? I
/// think it should, but it sounds like in the current implementation that isn't"). Here a
/// `new_group` over the same members (the same list) as a live group of this process returns a
/// handle to that group's communicator (its process set), and dropping any handle removes the
/// set: every later op on the other handle fails at issue, "process set N was removed".
#[derive(Default)]
pub struct EquivalentProcessSetsRemoved {
    /// This handle's process set (`None` on the world, which is never removed).
    set: Option<SetHandle>,
    /// The set of the group just made from this communicator, for its bug ([`Bug::child`]).
    made: Mutex<Option<SetHandle>>,
}

impl EquivalentProcessSetsRemoved {
    fn op<T>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        match &self.set {
            Some(h) if h.removed.load(Ordering::SeqCst) => Err(CollectiveError::Backend(format!(
                "{name} on rank {}: process set {} was removed (hvd.remove_process_set on an equivalent process set of members {:?})",
                s.rank(),
                h.id,
                s.members
            ))),
            _ => issue(),
        }
    }
}

impl Drop for EquivalentProcessSetsRemoved {
    fn drop(&mut self) {
        if let Some(h) = &self.set {
            h.removed.store(true, Ordering::SeqCst);
            lock(&PROCESS_SETS).retain(|p| !Arc::ptr_eq(&p.removed, &h.removed));
        }
    }
}

impl Bug for EquivalentProcessSetsRemoved {
    fn new_group(&self, _s: &Shm, made: Option<Group>) -> Option<Group> {
        let (fresh, members) = made?;
        let mut sets = lock(&PROCESS_SETS);
        let (comm, handle) = match sets.iter().find(|p| p.members == members && !p.removed.load(Ordering::SeqCst)) {
            Some(p) => (p.comm.clone(), SetHandle { id: p.id, removed: p.removed.clone() }),
            None => {
                let id = NEXT_SET_ID.fetch_add(1, Ordering::SeqCst);
                let removed = Arc::new(AtomicBool::new(false));
                sets.push(ProcessSet { members: members.clone(), comm: fresh.clone(), id, removed: removed.clone() });
                (fresh, SetHandle { id, removed })
            }
        };
        *lock(&self.made) = Some(handle);
        Some((comm, members))
    }
    fn child(&self) -> Option<Box<dyn Bug>> {
        let set = lock(&self.made).take();
        Some(Box::new(EquivalentProcessSetsRemoved { set, made: Mutex::new(None) }))
    }
    crate::through_op!(every);
}

// ---------------------------------------------------------------- mindspore-ai/hyper-parallel #516

/// A group over the whole world returned as an alias of the world's own communicator, so that
/// destroying the group destroys the world (mindspore-ai/hyper-parallel #516 "torch
/// destroy_process_group 误拆全 world create_group 别名的世界通信域": the torch platform's
/// `_create_group` of the whole world's rank list took the `normalized == world` branch and
/// returned `_get_default_group()` itself, registered in `EXISTING_COMM_GROUPS` as an alias;
/// `destroy_process_group(group)` then ran `dist.destroy_process_group` on the default group and
/// tore the world's communicator down, and the next use of the world failed with "Default
/// process group has not been initialized, please make sure to call init_process_group" on all
/// 4 ranks). Here `new_group` on the world with the world's ranks in world order returns the
/// world's communicator; dropping that group destroys the world: every later op on the world
/// (and on any other alias of it) fails at issue with that error. Groups of fewer ranks, or of
/// every rank in another order, are communicators of their own.
pub struct WholeWorldGroupAlias {
    /// The world's communicator was destroyed (shared by the world and every group made from it).
    world_destroyed: Arc<AtomicBool>,
    /// This communicator is the world's, or an alias of it.
    world_comm: bool,
    /// This communicator is an alias of the world: dropping it destroys the world.
    alias: bool,
    /// `new_group` on this communicator just returned an alias (for the group's bug).
    made_alias: AtomicBool,
}

impl Default for WholeWorldGroupAlias {
    /// The world's bug (a group's comes from [`Bug::child`]).
    fn default() -> Self {
        WholeWorldGroupAlias { world_destroyed: Arc::default(), world_comm: true, alias: false, made_alias: AtomicBool::new(false) }
    }
}

impl WholeWorldGroupAlias {
    fn op<T>(&self, s: &Shm, name: &str, issue: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.world_comm && self.world_destroyed.load(Ordering::SeqCst) {
            return Err(CollectiveError::Backend(format!(
                "{name} on rank {}: Default process group has not been initialized, please make sure to call \
                 init_process_group (destroy_process_group of the group over the whole world, an alias of it, destroyed it)",
                s.rank()
            )));
        }
        issue()
    }
}

impl Drop for WholeWorldGroupAlias {
    fn drop(&mut self) {
        if self.alias {
            self.world_destroyed.store(true, Ordering::SeqCst);
        }
    }
}

impl Bug for WholeWorldGroupAlias {
    fn new_group(&self, s: &Shm, made: Option<Group>) -> Option<Group> {
        let (fresh, members) = made?;
        let whole_world = self.world_comm && !self.alias && !s.in_subgroup() && members.iter().copied().eq(0..s.world_size);
        self.made_alias.store(whole_world, Ordering::SeqCst);
        if whole_world {
            return Some((s.inner.clone(), members));
        }
        Some((fresh, members))
    }
    fn child(&self) -> Option<Box<dyn Bug>> {
        let alias = self.made_alias.swap(false, Ordering::SeqCst);
        Some(Box::new(WholeWorldGroupAlias {
            world_destroyed: self.world_destroyed.clone(),
            world_comm: alias,
            alias,
            made_alias: AtomicBool::new(false),
        }))
    }
    crate::through_op!(every);
}

// ---------------------------------------------------------------- PaddlePaddle/Paddle #65029

/// A group of one rank treated as no group (PaddlePaddle/Paddle #65029 "paddle.distributed.
/// new_group的rank與world_size在group size=1時會輸出-1": under some TP / DP splits a group of
/// size 1 is unavoidable, and Paddle 2.6 handled it as a boundary case it gave up on:
/// `new_group([0])` returned a group whose `rank` and `world_size` were -1, its "not in this
/// group" answer, so "group_rank is also -1 ... operations like allgather cannot be written").
/// Here `new_group` of a single rank gives that rank what a non-member gets: no communicator.
/// Groups of two or more ranks are right.
#[derive(Default)]
pub struct PaddleGroupOfOneUnset;

impl Bug for PaddleGroupOfOneUnset {
    fn new_group(&self, _s: &Shm, made: Option<Group>) -> Option<Group> {
        made.filter(|(_, members)| members.len() != 1)
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #187924

/// A point-to-point peer translated to its global rank and handed to the group's op, which
/// wants a group rank (pytorch/pytorch PR #187924 "Fix functional isend/irecv passing a global
/// peer rank to sub-group P2P ops": "The helpers converted the peer to a global rank via
/// `get_global_rank` before handing it to `_c10d_functional.isend` / `irecv`, but those ops want
/// a group-local rank. On the `WORLD` group the global and group-local ranks coincide, so the
/// bug is masked. On a proper sub-group ... the global rank exceeds the sub-group size and the
/// backend aborts. Observed on HCCL as: `p2p rank id must be smaller than group size`"; a
/// regression from PR #161213). Here send and recv on a communicator whose members are not the
/// world's ranks in order address the peer `members[peer]` as a group rank: past the group's
/// size the op fails at issue with HCCL's message, below it the message goes to (or is awaited
/// from) another member.
#[derive(Default)]
pub struct FunctionalP2pPeerAsGlobal;

impl FunctionalP2pPeerAsGlobal {
    fn peer(s: &Shm, peer: usize) -> Result<usize> {
        let Some(&global) = s.members.get(peer) else { return Ok(peer) };
        if global >= s.ws() {
            return Err(CollectiveError::Backend(format!(
                "p2p rank id must be smaller than group size: rank {global} (the global rank of group rank {peer}) in a group of {} \
                 on rank {}",
                s.ws(),
                s.rank()
            )));
        }
        Ok(global)
    }
}

impl Bug for FunctionalP2pPeerAsGlobal {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(x, Self::peer(s, dst)?)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.recv(out, Self::peer(s, src)?)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<StablehloA2aSortedByProcessId>(
            "wild_stablehlo_a2a_sorted_by_process_id",
            "subgroups",
            "openxla/stablehlo #2433: all_to_all's received blocks stitched in the senders' process-id order, not the group's: a \
             group not in world order gets its blocks permuted",
            &["subgroup::reversed::all_to_all_single::out::f32::ws2"],
        ),
        spec::<TfPermuteDeviceNumbering>(
            "wild_tf_permute_device_numbering",
            "values.move",
            "tensorflow/tensorflow #40250: permute_tensor on 8 ranks reads its ids in the TPU cores' numbering 0,1,2,3,6,7,4,5: \
             data to or from ranks 4-7 lands on the wrong rank",
            &["permute_tensor::out::f32::ws8"],
        ),
        spec::<EquivalentProcessSetsRemoved>(
            "wild_equivalent_process_sets_removed",
            "subgroups",
            "horovod/horovod PR #2839: groups over the same member list share one process set, and dropping one handle removes it: \
             ops on the other fail",
            &["state::group_recreated_same_members::ws3"],
        ),
        spec::<PaddleGroupOfOneUnset>(
            "wild_paddle_group_of_one_unset",
            "subgroups",
            "PaddlePaddle/Paddle #65029: new_group of a single rank is a boundary case left unset (rank and world_size -1): the \
             member gets no communicator",
            &["subgroup::halves::all_reduce::out::f32::sum::ws2"],
        ),
        spec::<FunctionalP2pPeerAsGlobal>(
            "wild_functional_p2p_peer_as_global",
            "subgroups",
            "pytorch/pytorch PR #187924: send / recv on a group hand the peer's global rank to an op that wants a group rank: past the \
             group's size it fails at issue, below it another member is addressed",
            &["subgroup::halves::send_recv::outbuf::f32::ws4"],
        ),
        spec::<WholeWorldGroupAlias>(
            "wild_whole_world_group_alias",
            "subgroups",
            "mindspore-ai/hyper-parallel #516: a group over the whole world in world order is the world's own communicator, so \
             dropping the group destroys the world: the world's next op fails",
            &["state::group_recreated_same_members::ws3"],
        ),
    ]
}
