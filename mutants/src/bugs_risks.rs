//! The open risks of the legal variants (helper risks): mutants that each lean on a declaration
//! the suites trusted too far — a `Rounding::Accumulate` bound with no upper limit, a declared
//! gap on exactly the call a fault case carries its check on, `subgroups = false` never held
//! against `new_group`, and a declared gap whose bad-input rows were skipped. Each was missed by
//! the whole catalogue before its fix (docs/RESULTS.md, "Open risks of the legal variants,
//! closed").

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant, Shm};
use concord_core::caps::{FusedImpl, Gap, Rounding};
use concord_core::fused::Gathered;
use concord_core::{Backend, Capabilities, CollectiveError, DType, OpKind, ReduceOp, Result, Scaling, Tensor, Variant, Work};

/// Risk 1 (clause `numerics.accumulate_bound`): declares `Rounding::Accumulate { ulps: 2^20 }`
/// and returns f16 / bf16 `sum` and `avg` all_reduce results of magnitude 1/4 or more on a grid
/// of 1/8 (a fixed-point transport with three fraction bits): exact on the integer-valued
/// exact-by-construction inputs and on small (subnormal) values, off by up to 1/16 — up to 64
/// ulp — on random ones, which the declared bound covered.
#[derive(Default)]
pub struct AccumulateHugeUlps;

const HUGE_ULPS: u32 = 1 << 20;

fn eighths(be: &concord_shm::ShmBackend, out: &Buf) -> Result<()> {
    let t = be.download(out)?;
    // From 1/4 up (subnormal and small results untouched, integers stay themselves).
    let v: Vec<f64> =
        (0..t.numel()).map(|i| t.get_f64(i)).map(|v| if v.abs() >= 0.25 && v.is_finite() { (v * 8.0).round() / 8.0 } else { v }).collect();
    be.write(out, &Tensor::from_f64(t.dtype(), t.shape(), &v))
}

fn coarse(dtype: DType, op: ReduceOp) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && matches!(op, ReduceOp::Sum | ReduceOp::Avg)
}

/// The issued all_reduce, its output rounded to eighths once it completes when the call is coarse.
fn to_eighths(s: &Shm, x: &Buf, op: ReduceOp, w: Work<Buf>) -> Result<Work<Buf>> {
    if !coarse(s.inner.buffer_dtype(x), op) {
        return Ok(w);
    }
    let out = w.peek().clone();
    Ok(s.then_as(w, out, eighths))
}

impl Bug for AccumulateHugeUlps {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        Capabilities { rounding: Rounding::Accumulate { ulps: HUGE_ULPS }, ..s.inner.capabilities() }
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        to_eighths(s, x, op, s.inner.all_reduce(x, op)?)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        to_eighths(s, x, op, s.inner.all_reduce_(x, op)?)
    }
}

/// Risk 2 (clause `faults.local_failure_named_everywhere`): declares a gap on exactly the call
/// the fault cases carried their checks on — all_reduce, out of place, f32, sum — and refuses it
/// (`unsupported`, every rank); and cannot tell a failed peer from a slow one on an out-of-place
/// all_reduce of any other reduce op: the abort of a peer's local failure reaches the wait as a
/// `timeout`. Before the fix the fault cases on that call were UNSUPPORTED (gated by their meta)
/// and the in-place ones failed on their refused warm-up — a false failure, not the bug.
#[derive(Default)]
pub struct GapOnFaultVehicle;

fn vehicle_gap() -> Gap {
    Gap {
        op: Some(OpKind::AllReduce),
        variant: Some(Variant::Out),
        dtype: Some(DType::F32),
        reduce: Some("sum".into()),
        reason: "no out-of-place f32 sum all_reduce (a narrow declared gap)".into(),
    }
}

fn as_timeout(e: CollectiveError) -> CollectiveError {
    match e {
        CollectiveError::Aborted(detail) => {
            CollectiveError::Timeout { op: "all_reduce".into(), seq: 0, rank: 0, waited_ms: 0, detail: format!("(was: aborted: {detail})") }
        }
        e => e,
    }
}

impl Bug for GapOnFaultVehicle {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        c.gaps.push(vehicle_gap());
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.capabilities(s)
            .check_call(OpKind::AllReduce, Some(Variant::Out), Some(s.inner.buffer_dtype(x)), Some(op))
            .map_err(CollectiveError::Unsupported)?;
        let w = s.inner.all_reduce(x, op)?;
        let value = w.peek().clone();
        Ok(s.twisted(w, value, crate::Twist { map_err: Some(as_timeout), ..crate::Twist::default() }, |_, _| Ok(())))
    }
}

/// Risk 3 (clause `caps.subgroups_declared`): declares `subgroups = false`, yet `new_group`
/// succeeds, and the group it returns does not reduce: its all_reduce hands back each member's
/// own input. The suites trusted the declaration and never called `new_group` on it.
#[derive(Default)]
pub struct NoSubgroupsYetGroups;

impl Bug for NoSubgroupsYetGroups {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        Capabilities { subgroups: false, ..s.inner.capabilities() }
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !s.in_subgroup() {
            return s.inner.all_reduce(x, op);
        }
        let copy = s.inner.upload(&s.inner.download(x)?)?;
        Ok(s.done(copy, "all_reduce"))
    }
}

/// Risk 4 (clause `bad_input.named_everywhere`): declares band / bor / bxor a gap; its
/// out-of-place reduce_scatter and its reduce refuse them (`unsupported`) on the integer dtypes
/// where they are defined, but on a float dtype — where the rule table names
/// `bad_input:unsupported_dtype` (rule 6) whatever the gaps — compute a sum and complete (the
/// all_reduce family refuses correctly). `caps::gaps_refused` probes bitwise ops only where
/// defined, the bad-input table's band rows are gated by their meta, and the grid skipped its
/// band rows as declared gaps.
#[derive(Default)]
pub struct BitwiseGapFloatsComputed;

fn bitwise(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
}

impl BitwiseGapFloatsComputed {
    /// `Err(Unsupported)` for a bitwise op on an integer dtype (the declared gap, refused); on a
    /// float dtype the op as given (shm names it `unsupported_dtype`), or — where `wrong` — the
    /// sum it takes instead.
    fn route(&self, dtype: DType, op: ReduceOp, wrong: bool) -> Result<ReduceOp> {
        if !bitwise(op) {
            return Ok(op);
        }
        if dtype.is_float() {
            return Ok(if wrong { ReduceOp::Sum } else { op });
        }
        Err(CollectiveError::Unsupported(format!("no bitwise reduce ops ({} declared a gap)", op.name())))
    }
    fn route_all(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<ReduceOp> {
        xs.iter().try_fold(op, |o, x| self.route(s.inner.buffer_dtype(x), o, false))
    }
}

impl Bug for BitwiseGapFloatsComputed {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        for r in ["band", "bor", "bxor"] {
            c.gaps.push(Gap::reduce(r, "no bitwise reduce ops"));
        }
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, self.route(s.inner.buffer_dtype(x), op, false)?)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, self.route(s.inner.buffer_dtype(x), op, false)?)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, self.route_all(s, xs, op)?)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, self.route_all(s, xs, op)?)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, self.route(s.inner.buffer_dtype(x), op, true)?)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, self.route(s.inner.buffer_dtype(x), op, false)?, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.reduce_scatter_tensor_coalesced(xs, self.route_all(s, xs, op)?)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, self.route(s.inner.buffer_dtype(x), op, true)?, root)
    }
}

/// The fused gate, read by a pipelined backend (a review of the per-call gate, the lead,
/// 10:26–13:26): declares `FusedImpl::Pipelined` and one narrow gap, all_gather on f64 (refused
/// with `unsupported` on every rank), and its own f64 all-gather-matmul puts each peer's shard at
/// its arrival index (right on rank 0 only). The gate first made every f64 fused all-gather case
/// UNSUPPORTED from the declaration alone, though a pipelined backend's own code never calls the
/// gapped all_gather: the wrong values went unseen.
#[derive(Default)]
pub struct PipelinedGapHidesFused;

fn no_f64_all_gather(s: &Shm, x: &Buf) -> Result<()> {
    if s.inner.buffer_dtype(x) == DType::F64 {
        return Err(CollectiveError::Unsupported("no f64 all_gather (a narrow declared gap)".into()));
    }
    Ok(())
}

impl Bug for PipelinedGapHidesFused {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        c.fused = FusedImpl::Pipelined;
        c.gaps.push(Gap {
            op: Some(OpKind::AllGatherIntoTensor),
            variant: None,
            dtype: Some(DType::F64),
            reduce: None,
            reason: "no f64 all_gather (a narrow declared gap)".into(),
        });
        c
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        no_f64_all_gather(s, x)?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        no_f64_all_gather(s, x)?;
        no_f64_all_gather(s, out)?;
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            no_f64_all_gather(s, x)?;
        }
        s.inner.all_gather_into_tensor_coalesced(xs)
    }
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        use crate::bugs::{pipelined_ag, AgKnobs, AG_RIGHT};
        let knobs = if m.s.inner.buffer_dtype(a) == DType::F64 { AgKnobs { slot: |_, _, step, _| step, ..AG_RIGHT } } else { AG_RIGHT };
        pipelined_ag(m, a, bs, dim, sc, knobs)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<AccumulateHugeUlps>(
            "risks_accumulate_huge_ulps",
            "numerics.accumulate_bound",
            "declares Rounding::Accumulate { ulps: 2^20 } and returns f16 / bf16 sum / avg all_reduce results on a grid of 1/8 \
             (exact on integer data, hundreds of ulp off on random)",
            &["all_reduce::out::f16::sum::ws2::random"],
        ),
        spec::<GapOnFaultVehicle>(
            "risks_gap_on_fault_vehicle",
            "faults.local_failure_named_everywhere",
            "declares a gap on exactly all_reduce out f32 sum (the fault cases' vehicle) and refuses it; a peer's local failure \
             reaches an out-of-place all_reduce's wait as a timeout",
            &["faults::fail_after_post::out_of_place::ws2"],
        ),
        spec::<NoSubgroupsYetGroups>(
            "risks_no_subgroups_yet_groups",
            "caps.subgroups_declared",
            "declares subgroups = false, yet new_group returns a communicator whose all_reduce does not reduce",
            &["caps::subgroups::ws2"],
        ),
        spec::<PipelinedGapHidesFused>(
            "risks_pipelined_gap_hides_fused",
            "fused.values",
            "declares FusedImpl::Pipelined and a gap on f64 all_gather (refused); its own f64 all-gather-matmul puts each \
             shard at its arrival index (right on rank 0 only)",
            &["fused::all_gather_matmul::dim0::f64::exact::ws2"],
        ),
        spec::<BitwiseGapFloatsComputed>(
            "risks_bitwise_gap_floats_computed",
            "bad_input.named_everywhere",
            "declares the bitwise reduce ops a gap; reduce_scatter and reduce refuse them on integers, but compute a bitwise \
             op on a float dtype (rule 6: unsupported_dtype) as a sum and complete",
            &["bad_input::grid::reduce_scatter_tensor::ws1"],
        ),
    ]
}
