//! # concord-oracle
//!
//! **One job:** say, for any collective, exactly what every rank MUST end up with given every
//! rank's input — or which named bad-input error every rank MUST report — and compare a
//! backend's result with that answer, bit-exactly or within a stated tolerance.
//!
//! The oracle is pure: no I/O, no processes, no communication. Every rank can regenerate every
//! rank's input (see `concord-fixtures`) and call [`expected`] alone; a rank that checks only its
//! own result calls [`expected_for`], which computes that rank's output alone and reads the data
//! of the inputs [`reads`] names only (the others' dtypes and shapes still go through validation).
//!
//! ## The contract it encodes
//! * **Reductions** ([`reduce_tensors`], module [`reduce`]): integers use wrapping arithmetic in
//!   the dtype's own width (any reduction order gives the same bits); integer `avg` is the
//!   wrapping sum in the dtype width divided by the world size, rounded per [`IntAvg`]; float
//!   `sum` / `avg` / `product` / `premul_sum` are computed in f64 and rounded once to the dtype
//!   (nearest, ties to even); `min` / `max` follow [`NanPolicy`] and order `-0 < +0`; bitwise ops
//!   are defined on integers only, `premul_sum` on floats only.
//! * **Shapes**: as [`concord_core::Backend`] documents (all_gather of a 0-dim input → `[ws]`,
//!   reduce_scatter and scatter need `d0 % ws == 0`, ...).
//! * **Bad input** ([`OracleError`]): every rank's call is described as a
//!   [`concord_core::CallDesc`] and checked by the one rule table of `concord_core::call`
//!   ([`concord_core::validate_all`], send/recv pairs by [`concord_core::validate_pair`]),
//!   in its documented precedence — the same verdict every backend reaches. Only the shape of
//!   a [`Collective`] itself (one split list or send target per rank, one sender per receiver)
//!   is checked here.
//! * **Checking** ([`check`]): [`Tolerance::Exact`] is bit equality (any NaN equals any NaN, and
//!   nothing else); NaN never passes against a number under any tolerance; infinities must match
//!   exactly.
#![forbid(unsafe_code)]

pub mod check;
mod collectives;
pub mod fused;
pub mod reduce;

pub use check::{avg_ulps, compare, compare_outputs, tolerance_for, Mismatch, Tolerance};
pub use collectives::{expected, expected_for, reads};
pub use fused::{expected_fused, expected_fused_for, fused_tolerance, FusedCall, FusedInputs};
pub use reduce::{reduce_tensors, round_f64_bits};

use concord_core::{Capabilities, IntAvg, NanPolicy, ReduceOp, Tensor};

/// The semantic choices a backend declares that change expected values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Semantics {
    pub nan_minmax: NanPolicy,
    pub int_avg: IntAvg,
}

impl Semantics {
    /// The semantics a backend declares in its capabilities.
    pub fn of(caps: &Capabilities) -> Semantics {
        Semantics { nan_minmax: caps.nan_minmax, int_avg: caps.int_avg }
    }

    /// What NCCL 2.28.9 was observed to do: min/max ignore NaN, integer avg truncates.
    pub fn nccl() -> Semantics {
        Semantics { nan_minmax: NanPolicy::Ignore, int_avg: IntAvg::Truncate }
    }
}

impl Default for Semantics {
    /// Concord's default (and [`Capabilities::full`]'s): NaN propagates through min/max, integer
    /// avg truncates toward zero.
    fn default() -> Semantics {
        Semantics { nan_minmax: NanPolicy::Propagate, int_avg: IntAvg::Truncate }
    }
}

/// One collective call, with the arguments every rank passes (the same on every rank).
#[derive(Clone, Debug)]
pub enum Collective {
    AllReduce {
        op: ReduceOp,
    },
    /// `all_gather_into_tensor`: concat along dim 0 in rank order; a 0-dim input gathers to `[ws]`.
    AllGather,
    /// Needs `d0 % ws == 0`; rank r gets the reduction of chunk r.
    ReduceScatter {
        op: ReduceOp,
    },
    /// Per rank (index = rank): its input and output splits; `None` = equal split of its own dim 0.
    AllToAll {
        input_splits: Vec<Option<Vec<usize>>>,
        output_splits: Vec<Option<Vec<usize>>>,
    },
    Broadcast {
        src: usize,
    },
    /// Rank r's data goes to rank `src_dst[r]`.
    Permute {
        src_dst: Vec<usize>,
    },
    /// The result has the input's shape on every rank; it is defined on `root` only.
    Reduce {
        op: ReduceOp,
        root: usize,
    },
    /// `[ws * d0, ..]` (0-dim: `[ws]`) on every rank; defined on `root` only.
    Gather {
        root: usize,
    },
    /// Every rank passes the same shape; the root's input is split in ws chunks of dim 0.
    Scatter {
        root: usize,
    },
    /// Rank r sends its x to `src_dst[r]` (if `Some`); a receiving rank ends with the sender's x,
    /// a rank that receives nothing keeps its own x.
    SendRecv {
        src_dst: Vec<Option<usize>>,
    },
}

impl Collective {
    /// The reduce op, for the reducing collectives.
    pub fn reduce_op(&self) -> Option<ReduceOp> {
        match self {
            Collective::AllReduce { op } | Collective::ReduceScatter { op } | Collective::Reduce { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// The op's name as in [`concord_core::OpKind::name`].
    pub fn name(&self) -> &'static str {
        use concord_core::OpKind as K;
        match self {
            Collective::AllReduce { .. } => K::AllReduce.name(),
            Collective::AllGather => K::AllGatherIntoTensor.name(),
            Collective::ReduceScatter { .. } => K::ReduceScatterTensor.name(),
            Collective::AllToAll { .. } => K::AllToAllSingle.name(),
            Collective::Broadcast { .. } => K::Broadcast.name(),
            Collective::Permute { .. } => K::PermuteTensor.name(),
            Collective::Reduce { .. } => K::Reduce.name(),
            Collective::Gather { .. } => K::Gather.name(),
            Collective::Scatter { .. } => K::Scatter.name(),
            Collective::SendRecv { .. } => K::SendRecv.name(),
        }
    }
}

/// Every rank's expected result (index = rank).
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub outputs: Vec<Tensor>,
    /// Per rank: `false` where the contents are unspecified (non-root ranks of reduce and
    /// gather); the shape is specified everywhere. Undefined outputs hold that rank's input
    /// (reduce) or zeros (gather) so that they have the right shape, and MUST NOT be compared.
    pub defined: Vec<bool>,
}

/// The bad-input error every rank of the collective must report: the rule table's
/// [`concord_core::BadInput`] (kind and detail).
pub type OracleError = concord_core::BadInput;
