//! The thirty-first hunt: bugs from the wild in the life of a communicator. Each ports a bug
//! that shipped in a collective library or its framework layer (MPICH, PyTorch's c10d, PRRTE,
//! UCC), found in the project's issue or pull-request thread named on its type: a communicator's
//! id handed to the next communicator of the same members while a message sent on the first
//! still lingers, a group name salted with a count that differs between ranks, a reused group
//! name whose first construction left a memo behind, a communicator initialised lazily by its
//! first op, which only some members issue. The trigger (group made again, asymmetric
//! membership, first op a point-to-point one) is kept as far as a wrapper over shm can
//! reproduce it.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Group, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The error of a group construction that never completes (its waits for the peers' keys end at
/// the bug's own deadline).
fn never_released(s: &Shm, what: &str) -> CollectiveError {
    std::thread::sleep(BUG_WAIT);
    CollectiveError::Timeout { op: "new_group".into(), seq: 0, rank: s.rank(), waited_ms: BUG_WAIT.as_millis() as u64, detail: what.into() }
}

/// Every rank's `v` on the communicator `be` (an all_gather of one i64 each, waited).
fn exchange(be: &ShmBackend, v: i64) -> Result<Vec<i64>> {
    let x = be.upload(&Tensor::from_vec(&[1], vec![v]))?;
    let all = be.all_gather_into_tensor(&x)?.into_value(BUG_WAIT)?;
    Ok(be.download(&all)?.as_slice::<i64>().to_vec())
}

// ---------------------------------------------------------------- pmodels/mpich #6184

/// Communicators released by their users, kept for the next group of the same members
/// ([`CommPoolLingeringSend`]): (members as world ranks, the communicator).
static RELEASED: Mutex<Vec<(Vec<usize>, Arc<ShmBackend>)>> = Mutex::new(Vec::new());

/// A communicator's id reused while a message sent on it lingers (pmodels/mpich #6184 "ch4:
/// lingering sent message interferes with later communicator", from #6182: a send completed
/// eagerly and its communicator was freed; the next communicator picked up the same
/// `context_id`, and the message, still in the receiver's unexpected queue, matched that
/// communicator's receive; fixed by PR #6186 "comm: Check for unmatched messages before
/// releasing context_id"). Here a group whose user dropped it keeps its communicator (its
/// context) in a process-wide pool by member list, and the next `new_group` over the same members
/// takes it from the pool instead of the one just made: a message sent on the dropped group and
/// never received is the first one the new group's receive gets.
#[derive(Default)]
pub struct CommPoolLingeringSend;

impl Bug for CommPoolLingeringSend {
    fn new_group(&self, _s: &Shm, made: Option<Group>) -> Option<Group> {
        let (fresh, members) = made?;
        let mut pool = lock(&RELEASED);
        // Released: nobody but the pool holds it any more.
        if let Some((_, reused)) = pool.iter().find(|(m, g)| *m == members && Arc::strong_count(g) == 1) {
            return Some((reused.clone(), members));
        }
        pool.push((members.clone(), fresh.clone()));
        Some((fresh, members))
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #189073

/// The groups this process registered (it was a member of), the world's included
/// ([`GroupNameSaltRegistered`]).
static REGISTERED: AtomicU64 = AtomicU64::new(1);

/// A group name salted with the count of groups this rank registered (pytorch/pytorch PR #189073
/// "Make subgroup name hash salt collective-consistent": `_hash_ranks_to_str` salted the group
/// name with `len(_world.pg_names)`, which non-member ranks of an earlier new_group do not
/// advance; a later split then computed different names on different ranks, and Gloo, which
/// uses the group name as the store prefix of `connectFullMesh`, deadlocked; the same counter
/// gave pytorch/pytorch #190396 its teardown hang, PR #190431). Here each member of a new group
/// names it with its own count of groups registered and connects under that name (an exchange
/// over the new group); a member that finds another name waits for keys that never come, and
/// its `new_group` ends in a timeout.
#[derive(Default)]
pub struct GroupNameSaltRegistered;

impl Bug for GroupNameSaltRegistered {
    fn group_made(&self, s: &Shm, _ranks: &[usize], made: Option<&Group>) -> Result<()> {
        let Some((g, _)) = made else { return Ok(()) };
        let salt = REGISTERED.fetch_add(1, Ordering::SeqCst) as i64;
        let names = exchange(g, salt)?;
        if names.iter().all(|&n| n == salt) {
            return Ok(());
        }
        Err(never_released(s, &format!("connectFullMesh under group name salt {salt}, the members' salts {names:?}")))
    }
}

// ---------------------------------------------------------------- openpmix/prrte PR #2806

/// Group names whose construction this process relayed without hosting a member
/// ([`ReusedGroupIdMemo`]).
static RELAYED: Mutex<Option<HashSet<Vec<usize>>>> = Mutex::new(None);

/// A reused group name discarded by a relay's memo of the first construction (openpmix/prrte PR
/// #2806 "grpcomm: tell one group operation of a reused name from the next": `completed_group_ops`
/// was an "already released" memo dropped only where a local client started the operation; on a
/// relay-only daemon it stayed, so every contribution to the next operation of that name was
/// discarded and the second construct over a reused group ID hung; reachable from MPI, where
/// `MPI_Comm_create_from_group`'s tag is the group ID). Here a group's name is its member list;
/// every rank of the parent takes part in the construction's rollup (an exchange over the
/// parent), a non-member as a relay that remembers the names it relayed and, on a name seen
/// before, discards the contributions: the members of a group made again over the same members
/// are never released, and their `new_group` ends in a timeout.
#[derive(Default)]
pub struct ReusedGroupIdMemo;

impl Bug for ReusedGroupIdMemo {
    fn group_made(&self, s: &Shm, ranks: &[usize], made: Option<&Group>) -> Result<()> {
        let members: Vec<usize> = ranks.iter().map(|&r| s.members.get(r).copied().unwrap_or(r)).collect();
        let relay_only = made.is_none();
        let discards = relay_only && lock(&RELAYED).get_or_insert_with(HashSet::new).contains(&members);
        let rollup = exchange(&s.inner, i64::from(discards))?;
        if relay_only {
            lock(&RELAYED).get_or_insert_with(HashSet::new).insert(members);
            return Ok(());
        }
        if rollup.contains(&1) {
            return Err(never_released(
                s,
                &format!("group {members:?}: a relay discarded the contributions (a memo of its earlier construction)"),
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- openucx/ucc PR #974

/// A communicator initialised by its first op (openucx/ucc PR #974 "TL/NCCL: disable active set
/// colls for lazyinit": with TL/NCCL's lazy init, PR #851, the NCCL communicator is created on the
/// first collective, and creating it is collective over every rank of the team; an active-set
/// broadcast, which only some ranks call, as that first op left its ranks waiting for the others
/// in the init: "With lazy init we cannot create communicator on first collective since not all
/// ranks participate in init"). Here a communicator's first op of any kind (a collective, a
/// send, a receive) first runs the init, a collective over every member (a barrier), and the op
/// completes only once the init has: a send / receive pair as a communicator's first op waits
/// for members that issue nothing.
#[derive(Default)]
pub struct LazyInitFirstOp {
    inited: Mutex<bool>,
}

impl LazyInitFirstOp {
    fn lazily<T: Clone + Send + Sync + 'static>(&self, s: &Shm, issue: impl FnOnce() -> Result<Work<T>>) -> Result<Work<T>> {
        let mut inited = lock(&self.inited);
        if *inited {
            drop(inited);
            return issue();
        }
        let init = s.inner.barrier()?;
        *inited = true;
        drop(inited);
        let w = issue().inspect_err(|_| {
            let _ = init.wait(BUG_WAIT);
        })?;
        Ok(s.then(w, move |_, _| init.wait(BUG_WAIT).map(|_| ())))
    }
}

impl Bug for LazyInitFirstOp {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.all_reduce(x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.all_reduce_(x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.lazily(s, || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.lazily(s, || s.inner.all_reduce_coalesced_(xs, op))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.all_gather_into_tensor_out(x, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.lazily(s, || s.inner.all_gather_into_tensor_coalesced(xs))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.reduce_scatter_tensor(x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.reduce_scatter_tensor_out(x, op, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.lazily(s, || s.inner.reduce_scatter_tensor_coalesced(xs, op))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.all_to_all_single(x, o, i))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.broadcast(x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.broadcast_(x, src))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.permute_tensor(x, src_dst))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.reduce(x, op, root))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.gather(x, root))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.scatter(x, root))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.lazily(s, || s.inner.send(x, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.lazily(s, || s.inner.recv(out, src))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        self.lazily(s, || s.inner.barrier())
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #128459

/// A split that gives its non-members nothing, read as a communicator (pytorch/pytorch PR #128459
/// "[c10d] fix OSS commSplit bug": D56907877 changed the open-source `commSplit` to look up the
/// new communicator's rank on every rank, but "commSplit requires every rank being called even
/// though it is no-color. ncclCommSplit will not create a communicator for nocolor ranks hence
/// this line of code will potentially throw error like `NCCL WARN CommUserRank : comm argument
/// is NULL`"; the change was reverted). Here `new_group` fails on every non-member with that
/// error (the members get their group).
#[derive(Default)]
pub struct NoColorRankLookup;

impl Bug for NoColorRankLookup {
    fn group_made(&self, _s: &Shm, _ranks: &[usize], made: Option<&Group>) -> Result<()> {
        match made {
            Some(_) => Ok(()),
            None => {
                Err(CollectiveError::Backend("NCCL WARN CommUserRank : comm argument is NULL (a NOCOLOR rank of ncclCommSplit)".into()))
            }
        }
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<CommPoolLingeringSend>(
            "wild_comm_pool_lingering_send",
            "p2p.matching",
            "pmodels/mpich#6184: a dropped group's communicator is reused by the next group of the same members; a message sent on the dropped group and never received is the new group's first",
            &["state::group_recreated_unreceived_send::ws3"],
        ),
        spec::<GroupNameSaltRegistered>(
            "wild_group_name_salt_registered",
            "subgroups",
            "pytorch/pytorch PR #189073: a new group is named with each member's count of groups it belongs to; after an asymmetric group the names differ and new_group times out",
            &["state::groups_each_without_a_rank::ws3"],
        ),
        spec::<ReusedGroupIdMemo>(
            "wild_reused_group_id_memo",
            "subgroups",
            "openpmix/prrte PR #2806: a non-member relay remembers a group name it relayed and discards the next construction of that name: a group made again times out",
            &["state::group_recreated_same_members::ws3"],
        ),
        spec::<LazyInitFirstOp>(
            "wild_lazy_init_first_op",
            "p2p.no_deadlock",
            "openucx/ucc PR #974: a communicator's first op first runs a collective init over every member; a send / recv pair as the first op waits for members that issue nothing",
            &["p2p::pair_first_on_new_group::ws3"],
        ),
        spec::<NoColorRankLookup>(
            "wild_nocolor_rank_lookup",
            "subgroups",
            "pytorch/pytorch PR #128459: new_group looks up the new communicator's rank on non-members too, where ncclCommSplit made none: their new_group fails",
            &["state::group_recreated_same_members::ws3"],
        ),
    ]
}
