//! Bugs the bad-input grid (`cargo xtask mutants --bad-input all`, [`crate::sweep_bad`]) pointed
//! at: bad input a backend author plausibly leaves unchecked on one path (one rank, sixteen ranks,
//! an in-place or coalesced variant, a smaller buffer, a middle rank), or an error a refused call
//! leaves behind. Each is a [`Judge`] over the correct shm backend: the rule table still decides
//! every call; the bug changes what a refusal becomes on that path.

use crate::campaign::{spec, Spec};
use crate::sweep_bad::{Effect, Judge, Judged, Verdict};
use concord_core::BadInputKind as K;

/// The number after the first `pat` in `s`.
fn number_after(s: &str, pat: &str) -> Option<usize> {
    let i = s.find(pat)? + pat.len();
    s[i..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().ok()
}

/// A single-rank communicator takes the copy fast path (nothing to exchange) before any check:
/// every bad input at one rank completes (a root out of range, a wrong `_out` buffer, bad splits,
/// a bitwise op on floats, a send to itself).
#[derive(Default)]
pub struct SingleRankSkipsChecks;
impl Judge for SingleRankSkipsChecks {
    fn effect(&self, v: &Verdict) -> Effect {
        if v.ws == 1 {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

/// A refused broadcast / reduce / gather / scatter leaves its error in the op's cached plan: the
/// next call of the same op on that communicator fails with it (all_reduce, used by every check
/// of a usable world, has a plan of its own).
#[derive(Default)]
pub struct RootedRefusalSticks;
impl Judge for RootedRefusalSticks {
    fn effect(&self, v: &Verdict) -> Effect {
        if crate::sweep_bad::rooted(v.hook) {
            Effect::LeaveBehind
        } else {
            Effect::Report
        }
    }
}

/// The in-place all_reduce (`all_reduce_`, `all_reduce_coalesced_`) reduces into the caller's
/// buffers without the cross-rank comparison of the out-of-place path: differing shapes, dtypes,
/// reduce ops or list lengths complete (each rank reduces what it has).
#[derive(Default)]
pub struct InplaceAllReduceUnchecked;
impl Judge for InplaceAllReduceUnchecked {
    fn effect(&self, v: &Verdict) -> Effect {
        let across = matches!(v.kind, K::ShapeMismatch | K::DTypeMismatch | K::ReduceOpMismatch | K::CountMismatch);
        if matches!(v.hook, "all_reduce_" | "all_reduce_coalesced_") && across {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

/// Coalesced all_gather zips the ranks' lists: lists of different lengths (or a tensor of another
/// shape in them) are cut to the shortest.
#[derive(Default)]
pub struct CoalescedAllGatherZips;
impl Judge for CoalescedAllGatherZips {
    fn effect(&self, v: &Verdict) -> Effect {
        if v.hook == "all_gather_into_tensor_coalesced" && matches!(v.kind, K::CountMismatch | K::ShapeMismatch) {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

/// Past 8 ranks the backend switches to a tree algorithm whose setup compares only the roots and
/// ops: differing shapes and dtypes complete, each rank moving its own byte count.
#[derive(Default)]
pub struct TreePathSkipsShapeCheck;
impl Judge for TreePathSkipsShapeCheck {
    fn effect(&self, v: &Verdict) -> Effect {
        if v.ws > 8 && matches!(v.kind, K::ShapeMismatch | K::DTypeMismatch) {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

/// An `_out` buffer is checked only for being large enough to write past: a smaller one is
/// filled up to its end (the result silently truncated).
#[derive(Default)]
pub struct SmallerOutTruncated;
impl Judge for SmallerOutTruncated {
    fn effect(&self, v: &Verdict) -> Effect {
        let holds = number_after(v.detail, "holds ");
        let needs = number_after(v.detail, "needs ");
        match (v.kind, holds, needs) {
            (K::OutBufferSize, Some(h), Some(n)) if h < n && v.hook.ends_with("_out") => Effect::Complete,
            _ => Effect::Report,
        }
    }
}

/// A barrier is counted as "every rank arrived at its next op", whatever op that is: a barrier
/// facing another collective completes on the barrier's ranks.
#[derive(Default)]
pub struct BarrierMatchesAnyOp;
impl Judge for BarrierMatchesAnyOp {
    fn effect(&self, v: &Verdict) -> Effect {
        if v.hook == "barrier" && v.kind == K::OpMismatch {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

/// Cross-rank agreement is checked between the two ends of the chain only (rank 0 against the
/// last rank, whose posts the setup reads anyway): a middle rank that differs goes through.
#[derive(Default)]
pub struct AgreementChecksEndsOnly;
impl Judge for AgreementChecksEndsOnly {
    fn effect(&self, v: &Verdict) -> Effect {
        let o = v.offender();
        let across = matches!(v.kind, K::ShapeMismatch | K::DTypeMismatch | K::ReduceOpMismatch | K::BadRoot | K::OpMismatch);
        let middle = o > 0 && o + 1 < v.ws;
        if across && middle && v.detail.contains("differ across ranks") {
            Effect::Complete
        } else {
            Effect::Report
        }
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<Judged<SingleRankSkipsChecks>>(
            "single_rank_skips_checks",
            "bad_input.named_everywhere",
            "a one-rank communicator takes the copy fast path before any check: every bad input at ws1 completes",
            &["bad_input::grid::all_reduce::ws1"],
        ),
        spec::<Judged<RootedRefusalSticks>>(
            "rooted_refusal_sticks",
            "bad_input.named_everywhere",
            "a refused broadcast / reduce / gather / scatter leaves its error in the op's plan: the next call of that op fails with it",
            &["bad_input::grid::broadcast::ws2"],
        ),
        spec::<Judged<InplaceAllReduceUnchecked>>(
            "inplace_all_reduce_unchecked",
            "bad_input.named_everywhere",
            "in-place all_reduce (and its coalesced form) skips the cross-rank comparison: differing shapes / dtypes / ops / counts complete",
            &["bad_input::grid::all_reduce_::ws2"],
        ),
        spec::<Judged<CoalescedAllGatherZips>>(
            "coalesced_all_gather_zips",
            "bad_input.named_everywhere",
            "coalesced all_gather zips the ranks' lists: lists of different lengths or shapes are cut to the shortest",
            &["bad_input::grid::all_gather_into_tensor_coalesced::ws2"],
        ),
        spec::<Judged<TreePathSkipsShapeCheck>>(
            "tree_path_skips_shape_check",
            "bad_input.named_everywhere",
            "past 8 ranks the tree path compares only roots and ops: differing shapes and dtypes complete",
            &["bad_input::grid::all_reduce::ws16"],
        ),
        spec::<Judged<SmallerOutTruncated>>(
            "smaller_out_truncated",
            "bad_input.named_everywhere",
            "an _out buffer is checked only for being too large: a smaller one gets the result truncated",
            &["bad_input::grid::all_gather_into_tensor_out::ws2"],
        ),
        spec::<Judged<BarrierMatchesAnyOp>>(
            "barrier_matches_any_op",
            "bad_input.named_everywhere",
            "a barrier completes when every rank reaches its next op, whatever op: a barrier facing another collective completes",
            &["bad_input::grid::barrier::ws2"],
        ),
        spec::<Judged<AgreementChecksEndsOnly>>(
            "agreement_checks_ends_only",
            "bad_input.named_everywhere",
            "cross-rank agreement compares rank 0 with the last rank only: a middle rank that differs goes through",
            &["bad_input::grid::all_reduce::ws3"],
        ),
    ]
}
