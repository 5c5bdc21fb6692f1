//! What a backend declares it supports. Suites report UNSUPPORTED for a declared gap and FAIL for
//! everything else, so a backend's declaration is part of its contract and is itself checked:
//! a case a backend claims to support MUST pass.

use crate::dtype::DType;
use crate::op::{OpKind, ReduceOp, Variant};
use serde::{Deserialize, Serialize};

/// How min / max treat NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NanPolicy {
    /// NaN wins: `max(NaN, 1) = NaN` (IEEE `maximum`, Gloo, the Concord CPU backend).
    Propagate,
    /// NaN loses: `max(NaN, 1) = 1` (observed on NCCL 2.28.9, IEEE `maxNum`).
    Ignore,
}

/// How `avg` rounds for integer dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntAvg {
    /// Toward zero: `(3 + 4) / 2 = 3`, `(-3 + -4) / 2 = -3` (C division; observed on NCCL).
    Truncate,
    /// Toward negative infinity.
    Floor,
}

/// What an op does when its input and output buffers alias where the op forbids it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AliasPolicy {
    /// Rejects with `bad_input:aliasing`.
    Reject,
    /// Computes the right result anyway.
    Correct,
}

/// How a backend rounds f16 / bf16 `sum`, `avg` and `premul_sum` reductions (the results of
/// f32 / f64 reductions of exact-by-construction inputs are exact whatever the order; every
/// dtype keeps subnormals: no flush to zero, on inputs or results).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Rounding {
    /// The exact result (the f64 result, for the factors and world sizes the suites use), rounded
    /// *once* to the dtype, to nearest, ties to even: three ranks of f16 `[1.0, 2^-11, 2^-24]`
    /// sum to `0x3C01`. The suites check this bit-exactly.
    ExactThenRound,
    /// Accumulated in the dtype or a wider type and rounded more than once (a ring rounding hop
    /// by hop): a result element is within `ulps` units in the last place of the magnitude of
    /// its terms (`Σ|x_r|`, scaled like the result) of the exact result — with terms of one sign,
    /// `ulps` ulp of the result itself; where terms cancel, of the partial sums the rounding
    /// happened at (a bound relative to the result alone holds for no order of rounded steps).
    /// The exact-rounding cases are UNSUPPORTED. `ulps` MUST be at most
    /// [`Rounding::accumulate_ulps_allowed`] of the communicator's size: the bound a fold of `n`
    /// terms rounded at every step can need; a larger declaration is refused (the value checks
    /// FAIL naming it), so no backend can loosen the check by declaring a large `ulps`.
    Accumulate { ulps: u32 },
    /// No promise (the exact-rounding cases are UNSUPPORTED).
    Unspecified,
}

impl Rounding {
    /// The largest `ulps` a backend may declare in [`Rounding::Accumulate`] on a communicator of
    /// `n` ranks: `2n` (`2` at one rank). A reduction of `n` terms rounded at every step rounds at
    /// most `2n` times (`n - 1` additions, the `n` products of `premul_sum`, the division of
    /// `avg`), each by at most half an ulp of a value below twice the terms' magnitude (a partial
    /// sum of rounded terms may cross into the next binade): at most one ulp of the magnitude
    /// each. Any order of rounded steps (a ring, a tree, a fold) is within it; a wider
    /// accumulator needs less.
    pub fn accumulate_ulps_allowed(n: usize) -> u32 {
        (2 * n.max(1)).min(u32::MAX as usize) as u32
    }

    /// `Err` naming the declaration when it is [`Rounding::Accumulate`] with more `ulps` than
    /// [`Rounding::accumulate_ulps_allowed`] of `n` (clause `numerics.accumulate_bound`).
    pub fn check_bound(self, n: usize) -> Result<(), String> {
        match self {
            Rounding::Accumulate { ulps } if ulps > Rounding::accumulate_ulps_allowed(n) => Err(format!(
                "the backend declares Rounding::Accumulate {{ ulps: {ulps} }} on a communicator of {n} rank(s); the contract allows at \
                 most {} (2 per rank: a reduction of {n} term(s) rounded at every step needs no more) [clause: numerics.accumulate_bound]",
                Rounding::accumulate_ulps_allowed(n)
            )),
            _ => Ok(()),
        }
    }
}

/// How a backend provides the fused communication + compute ops ([`crate::fused`]). Either
/// way the ops MUST return the decomposition's values; the suites check both alike, and the
/// bench's `--fused` mode compares a native implementation with the decomposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FusedImpl {
    /// The trait's default methods: the seed's unfused fallbacks (validate, collective, host
    /// matmul).
    Decomposed,
    /// Its own implementation, overlapping the communication with the matmul.
    Pipelined,
}

/// One declared gap: every field that is `Some` must match for the gap to apply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    pub op: Option<OpKind>,
    pub variant: Option<Variant>,
    /// Matches a call any of whose tensors has this dtype: a call with an f32 input and an f64
    /// output (a bad input, `dtype_mismatch`) falls under a gap on f64 as well as under one on
    /// f32, and a backend may answer it with the gap's refusal (what the bad-input grid accepts).
    pub dtype: Option<DType>,
    /// A reduce-op name (`"band"`, `"premul_sum"`, ...).
    pub reduce: Option<String>,
    pub reason: String,
}

impl Gap {
    pub fn reduce(name: &str, reason: &str) -> Gap {
        Gap { op: None, variant: None, dtype: None, reduce: Some(name.into()), reason: reason.into() }
    }
    pub fn op(op: OpKind, reason: &str) -> Gap {
        Gap { op: Some(op), variant: None, dtype: None, reduce: None, reason: reason.into() }
    }
    pub fn op_variant(op: OpKind, variant: Variant, reason: &str) -> Gap {
        Gap { op: Some(op), variant: Some(variant), dtype: None, reduce: None, reason: reason.into() }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Dtypes the backend moves; any other dtype is unsupported for every op.
    pub dtypes: Vec<DType>,
    /// Largest world (and subgroup) size the backend runs.
    pub max_world_size: usize,
    pub nan_minmax: NanPolicy,
    pub int_avg: IntAvg,
    pub aliasing: AliasPolicy,
    /// Whether mismatched inputs across ranks (shapes, dtypes, splits, roots) end in a named
    /// error on every rank. If false, cross-rank bad-input cases are UNSUPPORTED, not run.
    pub validates_across_ranks: bool,
    /// Whether the values the backend moves are real (false for the fake backend).
    pub moves_data: bool,
    /// Whether `new_group` makes communicators. If false, every `new_group` MUST be refused by
    /// name on every rank (`Unsupported` or `bad_input:unsupported_op`, never a communicator),
    /// and cases that need a group are UNSUPPORTED.
    pub subgroups: bool,
    /// Whether ops on different communicators of the process complete whatever order each rank
    /// issued them in (clause `async.communicators_independent`: then one engine, queue, lock or
    /// stream for every communicator of the process is a bug). False for a backend that orders
    /// the collectives of different communicators, or over a library that documents the
    /// opposite rule, as NCCL does ("applications should ensure operations are submitted in the
    /// same order across ranks", user guide, "Using multiple NCCL communicators concurrently"):
    /// programs must then issue them in the same order on every rank, and the cases whose ranks
    /// issue ops on two communicators in different orders are UNSUPPORTED. Point-to-point ops
    /// are never ordered across communicators, even then (clause `p2p.no_deadlock`).
    #[serde(default = "yes")]
    pub concurrent_communicators: bool,
    /// How f16 / bf16 sum-like reductions round (see [`Rounding`]).
    pub rounding: Rounding,
    pub gaps: Vec<Gap>,
    /// How the fused ops are implemented (see [`FusedImpl`]).
    pub fused: FusedImpl,
}

fn yes() -> bool {
    true
}

impl Capabilities {
    /// Everything, for a backend that implements the whole contract.
    pub fn full(max_world_size: usize) -> Capabilities {
        Capabilities {
            dtypes: DType::ALL.to_vec(),
            max_world_size,
            nan_minmax: NanPolicy::Propagate,
            int_avg: IntAvg::Truncate,
            aliasing: AliasPolicy::Reject,
            validates_across_ranks: true,
            moves_data: true,
            subgroups: true,
            concurrent_communicators: true,
            rounding: Rounding::ExactThenRound,
            gaps: Vec::new(),
            fused: FusedImpl::Decomposed,
        }
    }

    /// `Ok` if the combination is supported, else the declared reason.
    pub fn check(
        &self,
        op: OpKind,
        variant: Option<Variant>,
        dtype: Option<DType>,
        reduce: Option<ReduceOp>,
        world_size: usize,
    ) -> Result<(), String> {
        if world_size > self.max_world_size {
            return Err(format!("world size {world_size} > declared max {}", self.max_world_size));
        }
        self.check_call(op, variant, dtype, reduce)
    }

    /// [`Capabilities::check`] of the call alone (its dtype and the declared gaps), in a world of
    /// any size the backend runs.
    pub fn check_call(&self, op: OpKind, variant: Option<Variant>, dtype: Option<DType>, reduce: Option<ReduceOp>) -> Result<(), String> {
        if let Some(d) = dtype {
            if !self.dtypes.contains(&d) {
                return Err(format!("dtype {d} not supported"));
            }
        }
        for g in &self.gaps {
            let hit = g.op.is_none_or(|o| o == op)
                && g.variant.is_none_or(|v| Some(v) == variant)
                && g.dtype.is_none_or(|d| Some(d) == dtype)
                && g.reduce.as_deref().is_none_or(|r| reduce.map(|x| x.name()) == Some(r));
            if hit {
                return Err(g.reason.clone());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_match_on_every_given_field() {
        let mut c = Capabilities::full(8);
        c.gaps.push(Gap::reduce("band", "no bitwise"));
        c.dtypes.retain(|d| *d != DType::U16);
        assert!(c.check(OpKind::AllReduce, Some(Variant::Out), Some(DType::I32), Some(ReduceOp::Sum), 2).is_ok());
        assert_eq!(c.check(OpKind::AllReduce, Some(Variant::Out), Some(DType::I32), Some(ReduceOp::BAnd), 2), Err("no bitwise".into()));
        assert!(c.check(OpKind::Broadcast, None, Some(DType::U16), None, 2).is_err());
        assert!(c.check(OpKind::Broadcast, None, Some(DType::F32), None, 9).is_err());
        // The call alone: its dtype and the gaps, whatever the world size.
        assert!(c.check_call(OpKind::Broadcast, None, Some(DType::F32), None).is_ok());
        assert!(c.check_call(OpKind::Broadcast, None, Some(DType::U16), None).is_err());
        assert_eq!(c.check_call(OpKind::Reduce, Some(Variant::Out), None, Some(ReduceOp::BAnd)), Err("no bitwise".into()));
    }

    #[test]
    fn accumulate_ulps_are_bounded_by_the_world_size() {
        assert_eq!(Rounding::accumulate_ulps_allowed(1), 2);
        assert_eq!(Rounding::accumulate_ulps_allowed(16), 32);
        assert!(Rounding::Accumulate { ulps: 32 }.check_bound(16).is_ok());
        let e = Rounding::Accumulate { ulps: 33 }.check_bound(16).unwrap_err();
        assert!(e.contains("ulps: 33") && e.contains("at most 32") && e.contains("numerics.accumulate_bound"), "{e}");
        assert!(Rounding::Accumulate { ulps: 1_000_000 }.check_bound(64).is_err());
        assert!(Rounding::ExactThenRound.check_bound(1).is_ok() && Rounding::Unspecified.check_bound(1).is_ok());
    }
}
