//! The eleventh review's blind spots (read-only helper review11, 2026-11-27): fused ops that
//! never met a missing peer, a local failure on rank 0, an init that refuses a one-rank world,
//! fused ops on subgroups at gather dim 1, rule-table entries of the scaled fused ops no case
//! reached, and ranks numbered by arrival order at init. Each was written here first and run
//! against the whole catalogue before any case was added. (Finding 2, the leader-based
//! autotuner, is a tuner bug: it is modelled where the autotune suite's faulty tuners live, the
//! hazard `leader_decision` of `concord_autotune::Hazards`, run by
//! `suites/tests/faulty_autotuners.rs`.)

use crate::bugs_review8::{other_rank, Relabel};
use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant, Shm};
use concord_core::fused::{move_from_front, move_to_front, Gathered};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Scaling, Tensor, Work, WorldInfo};
use concord_store::{Store, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the "no deadline" rendezvous of [`FusedRendezvousUnbounded`] really waits (a bound
/// for the campaign's sake only: the bug has none).
const RENDEZVOUS_WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- finding 1: no deadline

/// The world a bug was initialised with (the world communicator's only; a subgroup's bug has
/// none).
#[derive(Default)]
struct World(Mutex<Option<WorldInfo>>);

impl World {
    fn keep(&self, w: &WorldInfo) {
        *crate::lock(&self.0) = Some(w.clone());
    }
    fn get(&self) -> Option<WorldInfo> {
        crate::lock(&self.0).clone()
    }
}

/// Finding 1. A native all-gather-matmul / low-contention all-gather first meets its peers at a
/// rendezvous in the store (each rank publishes "my shard is ready" and spins until every peer
/// has: a symmetric-memory signal wait with no timeout), then runs. A dead or absent peer keeps
/// the caller inside the call for as long as the rendezvous spins (here 5 s, the op deadline
/// being 1 s), and nothing is recorded in the progress record meanwhile. Clauses
/// `faults.absent_peer_bounded` and `progress.recorded`.
#[derive(Default)]
pub struct FusedRendezvousUnbounded {
    world: World,
    calls: AtomicU64,
}

impl FusedRendezvousUnbounded {
    fn rendezvous(&self, s: &Shm) -> Result<()> {
        let Some(w) = self.world.get() else { return Ok(()) };
        if s.in_subgroup() {
            return Ok(());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let store = Store::open(&w.store_path, w.world_size, RENDEZVOUS_WAIT).map_err(|e| CollectiveError::Backend(e.to_string()))?;
        let key = |r: usize| format!("review11/{}/fused{n}/{r}", w.world_id);
        store.set(&key(w.rank), b"1").map_err(|e| CollectiveError::Backend(e.to_string()))?;
        let keys: Vec<String> = (0..w.world_size).map(key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match store.wait(&refs, RENDEZVOUS_WAIT) {
            Ok(()) => Ok(()),
            Err(StoreError::Timeout { waited_ms, .. }) => Err(CollectiveError::Timeout {
                op: "fused rendezvous".into(),
                seq: n,
                rank: w.rank,
                waited_ms,
                detail: "a peer never published its shard".into(),
            }),
            Err(e) => Err(CollectiveError::Backend(e.to_string())),
        }
    }
}

impl Bug for FusedRendezvousUnbounded {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        self.world.keep(world);
        Ok(world.clone())
    }
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        self.rendezvous(&m.s)?;
        concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc)
    }
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        if op.is_none() {
            self.rendezvous(&m.s)?;
        }
        concord_core::fused::decomposed_low_contention(m, x, op)
    }
}

// ---------------------------------------------------------------- finding 3: rank 0 as broker

/// Finding 3. Errors travel through rank 0 as a broker: a peer's local failure is reported to
/// rank 0, which raises the abort everywhere; but rank 0's own local failure is returned on
/// rank 0 only, and every other rank's wait ends in a timeout. Clause
/// `faults.local_failure_named_everywhere`.
#[derive(Default)]
pub struct Rank0FailureStaysOnRank0;

fn rank0_failure_as_timeout<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let me = s.rank();
    if me == 0 {
        return w;
    }
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    let relabel = move |e: CollectiveError| match e {
        CollectiveError::Aborted(detail) if other_rank(&detail, me) == Some(0) => CollectiveError::Timeout {
            op: "collective".into(),
            seq: 0,
            rank: me,
            waited_ms: 0,
            detail: format!("no word from rank 0 within the deadline (rank 0 failed locally and told no one: {detail})"),
        },
        e => e,
    };
    s.relayed(value, Arc::new(Relabel { inner: w, relabel: Box::new(relabel) }), meta)
}

impl Bug for Rank0FailureStaysOnRank0 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(rank0_failure_as_timeout(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(rank0_failure_as_timeout(s, s.inner.all_reduce_(x, op)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(rank0_failure_as_timeout(s, s.inner.broadcast(x, src)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(rank0_failure_as_timeout(s, s.inner.all_to_all_single(x, o, i)?))
    }
}

// ---------------------------------------------------------------- finding 4: no one-rank world

/// Finding 4. A ring builder that needs two ranks: `init` refuses a one-rank world and every
/// odd size as unsupported ("ring needs 2 ranks"), while declaring shm's `max_world_size` (64). The
/// harness reads the declaration by initialising a one-rank world, which is refused too, so
/// every refused size stayed UNSUPPORTED. Clause `init.declared_world_sizes`.
#[derive(Default)]
pub struct InitRefusesOneRank;

impl Bug for InitRefusesOneRank {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if world.world_size % 2 == 1 {
            return Err(CollectiveError::Unsupported(format!("ring needs an even number of ranks (2 or more), not {}", world.world_size)));
        }
        Ok(world.clone())
    }
}

// ---------------------------------------------------------------- finding 7: group, dim 1

/// `t` with its `n` equal chunks along dim `d` put in the order `order` (chunk `i` of the result
/// is chunk `order[i]` of `t`).
fn reorder_chunks(t: &Tensor, d: usize, order: &[usize]) -> Tensor {
    let moved = move_to_front(t, d);
    let chunk = moved.len_bytes() / order.len().max(1);
    let mut out = moved.clone();
    for (i, &q) in order.iter().enumerate() {
        out.bytes_mut()[i * chunk..(i + 1) * chunk].copy_from_slice(&moved.bytes()[q * chunk..(q + 1) * chunk]);
    }
    move_from_front(&out, d)
}

/// Finding 7. The movedim path of all-gather-matmul (gather dim 1 or more) places each shard at
/// its owner's position among the members' WORLD ranks, not at its group rank (the dim-0 path
/// is right): on a group whose members are not in world order, the gathered `a` and every
/// product have their blocks along the gather dim in the wrong order. Clauses `fused.values`,
/// `subgroups`.
#[derive(Default)]
pub struct GroupAgMatmulDim1ByWorldRank;

impl Bug for GroupAgMatmulDim1ByWorldRank {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc)?;
        if dim == 0 || !m.s.in_subgroup() {
            return Ok(w);
        }
        let (ag, outs) = w.into_value(crate::BUG_WAIT)?;
        let mut order: Vec<usize> = (0..m.s.members.len()).collect();
        order.sort_by_key(|&q| m.s.members[q]);
        let ag = m.upload(&reorder_chunks(&m.download(&ag)?, dim, &order))?;
        let outs =
            outs.iter().map(|o| m.download(o).and_then(|t| m.upload(&reorder_chunks(&t, dim, &order)))).collect::<Result<Vec<_>>>()?;
        Ok(m.s.done((ag, outs), "fused_all_gather_matmul"))
    }
}

// ---------------------------------------------------------------- finding 8: unreached rules

/// Finding 8. The scaled all-gather-matmul pairs the Bs with their scales by
/// `bs.iter().zip(&scaling.b)`: given fewer B scales than Bs it silently computes (and returns)
/// only as many products as there are scales, instead of rule F8's "N B scales for M B tensors".
/// Clause `fused.bad_input`.
#[derive(Default)]
pub struct ScaledAgZipsBScales;

impl Bug for ScaledAgZipsBScales {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let bs = match sc {
            Some(s) if s.b.len() < bs.len() => &bs[..s.b.len()],
            _ => bs,
        };
        concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc)
    }
}

/// Finding 8. All-gather-matmul with no B at all returns the gathered `a` and no products
/// (PyTorch's fallback returns `(A, [])`) instead of the named bad input ("at least one B").
/// Clause `fused.bad_input`.
#[derive(Default)]
pub struct AgMatmulNoBReturnsA;

impl Bug for AgMatmulNoBReturnsA {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        if !bs.is_empty() {
            return concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc);
        }
        let t = m.download(a)?;
        let moved = m.upload(&move_to_front(&t, dim))?;
        let g = m.all_gather_into_tensor(&moved)?.into_value(crate::BUG_WAIT)?;
        let ag = m.upload(&move_from_front(&m.download(&g)?, dim))?;
        Ok(m.s.done((ag, vec![]), "fused_all_gather_matmul"))
    }
}

// ---------------------------------------------------------------- weaker: arrival order

/// The weaker finding. The backend numbers its internal slots by arrival order at init (a
/// store counter, as a rendezvous that hands out slots first come first served), while `rank()`
/// reports the launcher's rank: every op moves data by slot, so rank `r`'s shard lands where the
/// rank that arrived `r`-th expects it. With the runner spawning ranks 0..N in order the slots
/// mostly are the ranks: caught only by scheduling luck. Clause `init.rank_is_the_launchers`.
#[derive(Default)]
pub struct SlotsByArrival {
    launcher_rank: Mutex<Option<usize>>,
}

impl Bug for SlotsByArrival {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if world.world_size < 2 || world.store_path.to_string_lossy().starts_with("tcp://") {
            return Ok(world.clone());
        }
        let store =
            Store::open(&world.store_path, world.world_size, world.op_timeout).map_err(|e| CollectiveError::Backend(e.to_string()))?;
        let arrived =
            store.add(&format!("review11/{}/arrivals", world.world_id), 1).map_err(|e| CollectiveError::Backend(e.to_string()))?;
        let mut w = world.clone();
        w.rank = (arrived as usize).saturating_sub(1) % world.world_size;
        *crate::lock(&self.launcher_rank) = Some(world.rank);
        Ok(w)
    }
    fn rank(&self, s: &Shm) -> usize {
        crate::lock(&self.launcher_rank).unwrap_or_else(|| s.rank())
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<FusedRendezvousUnbounded>(
            "review11_fused_rendezvous_unbounded",
            "faults.absent_peer_bounded",
            "all_gather_matmul / low_contention_all_gather first spin in the store until every peer published its shard, with no deadline (5 s here) and nothing recorded",
            &["faults::absent_peer::fused_all_gather_matmul::ws2"],
        ),
        spec::<Rank0FailureStaysOnRank0>(
            "review11_rank0_failure_stays_on_rank0",
            "faults.local_failure_named_everywhere",
            "errors go through rank 0 as a broker: rank 0's own local failure is returned on rank 0 only, every other rank times out",
            &["faults::fail_after_post::in_place::victim0::ws3"],
        ),
        spec::<InitRefusesOneRank>(
            "review11_init_refuses_one_rank",
            "init.declared_world_sizes",
            "init refuses a one-rank world and every odd size as unsupported while declaring max_world_size 64",
            &["caps::init_one_rank_world::ws2"],
        ),
        spec::<GroupAgMatmulDim1ByWorldRank>(
            "review11_group_ag_matmul_dim1_by_world_rank",
            "fused.values",
            "all_gather_matmul at gather dim >= 1 on a subgroup places the shards in the order of the members' world ranks",
            &["fused::all_gather_matmul::dim1::f32::group_grid::ws7"],
        ),
        spec::<ScaledAgZipsBScales>(
            "review11_scaled_ag_zips_b_scales",
            "fused.bad_input",
            "scaled all_gather_matmul with fewer B scales than Bs returns only as many products as scales (zip), no error",
            &["fused::bad_input::b_scales_count::ws2"],
        ),
        spec::<AgMatmulNoBReturnsA>(
            "review11_ag_matmul_no_b_returns_a",
            "fused.bad_input",
            "all_gather_matmul with no B returns the gathered A and no products instead of the named error",
            &["fused::bad_input::no_b::ws2"],
        ),
        spec::<SlotsByArrival>(
            "review11_slots_by_arrival",
            "init.rank_is_the_launchers",
            "internal slots numbered by arrival order at init (a store counter); rank() reports the launcher's rank",
            &["caps::init_arrival_order::ws3"],
        ),
    ]
}
