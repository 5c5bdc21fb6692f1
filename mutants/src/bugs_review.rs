//! The review's mutants: a backend's own declarations and its `init` trusted by the suites. Each
//! is a backend the catalogue passed before the review's fixes: one that declares it moves no
//! data (every value check was skipped, and the cases PASSED), one whose ranks are not the
//! launcher's (nothing compared them), one that refuses a world it declares it runs (the world
//! was UNSUPPORTED, never FAIL).

use crate::campaign::{spec, Spec};
use crate::{edit, Buf, Bug, Group, Shm};
use concord_core::{Backend, Capabilities, CollectiveError, ReduceOp, Result, Work, WorldInfo};

/// A backend that declares `moves_data = false` (as the fake backend does, on purpose) and
/// whose `all_reduce` returns zeros: every value check skipped for the declaration let its cases
/// pass.
#[derive(Default)]
pub struct DeclaresNoData;

impl Bug for DeclaresNoData {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        c.moves_data = false;
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0))))
    }
}

/// A backend that numbers its ranks its own way (by arrival order at a rendezvous, say) instead
/// of taking the launcher's: here consistently reversed, rank `r` joins as `ws - 1 - r`. Every
/// value it returns is right for the rank it reports, so only a comparison with the launcher's
/// rank sees it (a job that puts rank `r`'s shard on rank `r` gets it on the wrong process).
#[derive(Default)]
pub struct RanksReversed;

impl Bug for RanksReversed {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        let mut w = world.clone();
        w.rank = world.world_size - 1 - world.rank;
        Ok(w)
    }
}

/// A backend that declares `max_world_size` 16 but refuses `init` as unsupported at 3, 5, 6 and
/// 7 ranks (say, a ring or tree builder that handles only even or power-of-two worlds).
#[derive(Default)]
pub struct InitRefusesOddWs;

impl Bug for InitRefusesOddWs {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if [3, 5, 6, 7].contains(&world.world_size) {
            return Err(CollectiveError::Unsupported(format!("no topology for a world of {} ranks", world.world_size)));
        }
        Ok(world.clone())
    }
}

/// A `new_group` that gives its members no communicator (`None`, what only non-members get):
/// a case that returned `Ok` on `None` (the async group cases) passed on every rank.
#[derive(Default)]
pub struct MemberGetsNoGroup;

impl Bug for MemberGetsNoGroup {
    fn new_group(&self, _s: &Shm, _made: Option<Group>) -> Option<Group> {
        None
    }
}

/// Declares no cross-rank validation (legal: its cross-rank bad-input rows are UNSUPPORTED) and
/// misses a rule every rank can check alone: an all_gather `_out` buffer one element too large
/// is taken, the gather written into its front. The final review found the grid skipped every
/// row of such a backend, local ones too.
#[derive(Default)]
pub struct NoCrossRankOutLargerTaken;

impl Bug for NoCrossRankOutLargerTaken {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        Capabilities { validates_across_ranks: false, ..s.inner.capabilities() }
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let need = s.numel(x) * s.ws();
        if s.numel(out) == need + 1 {
            let front = s.inner.view(out, 0, &[need])?;
            let w = s.inner.all_gather_into_tensor_out(x, &front)?;
            return Ok(s.then_as(w, out.clone(), |_, _| Ok(())));
        }
        s.inner.all_gather_into_tensor_out(x, out)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<NoCrossRankOutLargerTaken>(
            "review_no_cross_rank_out_larger_taken",
            "bad_input.named_everywhere",
            "declares no cross-rank validation and takes an all_gather _out buffer one element too large",
            &["bad_input::grid::all_gather_into_tensor_out::ws2"],
        ),
        spec::<DeclaresNoData>(
            "review_declares_no_data",
            "caps.moves_data_declared",
            "declares moves_data = false; all_reduce returns zeros (checks skipped for the declaration passed the cases)",
            &["caps::moves_data::f32::ws2"],
        ),
        spec::<RanksReversed>(
            "review_ranks_reversed",
            "init.rank_is_the_launchers",
            "init numbers the ranks ws-1-r, consistently (every value right for the rank it reports, not the launcher's)",
            &["barrier::out::u8::ws2"],
        ),
        spec::<InitRefusesOddWs>(
            "review_init_refuses_odd_ws",
            "init.declared_world_sizes",
            "init returns Unsupported at 3, 5, 6 and 7 ranks while declaring max_world_size 16",
            &["barrier::out::u8::ws3"],
        ),
        spec::<MemberGetsNoGroup>(
            "review_member_gets_no_group",
            "subgroups",
            "new_group returns None on its members too (the async group cases returned Ok on None)",
            &["async::barrier_synchronises::subgroup::ws3"],
        ),
    ]
}
