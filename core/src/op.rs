//! Collective op kinds, variants and reduce ops, with the spellings used in case names.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The collectives of the [`crate::Backend`] trait, without their variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OpKind {
    AllReduce,
    AllGatherIntoTensor,
    ReduceScatterTensor,
    AllToAllSingle,
    Broadcast,
    PermuteTensor,
    Reduce,
    Gather,
    Scatter,
    SendRecv,
    Barrier,
}

impl OpKind {
    pub const ALL: [OpKind; 11] = [
        OpKind::AllReduce,
        OpKind::AllGatherIntoTensor,
        OpKind::ReduceScatterTensor,
        OpKind::AllToAllSingle,
        OpKind::Broadcast,
        OpKind::PermuteTensor,
        OpKind::Reduce,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::SendRecv,
        OpKind::Barrier,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::AllGatherIntoTensor => "all_gather_into_tensor",
            OpKind::ReduceScatterTensor => "reduce_scatter_tensor",
            OpKind::AllToAllSingle => "all_to_all_single",
            OpKind::Broadcast => "broadcast",
            OpKind::PermuteTensor => "permute_tensor",
            OpKind::Reduce => "reduce",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::SendRecv => "send_recv",
            OpKind::Barrier => "barrier",
        }
    }
    pub fn from_name(s: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|o| o.name() == s)
    }
    /// Whether the op takes a reduce op.
    pub const fn reduces(self) -> bool {
        matches!(self, OpKind::AllReduce | OpKind::ReduceScatterTensor | OpKind::Reduce)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an op hands back its result.
///
/// * `Out` — out-of-place: a new buffer, never aliasing the input (`all_reduce`).
/// * `InPlace` — the very buffer given is overwritten and returned (`all_reduce_`).
/// * `OutBuf` — the caller's output buffer is written (`all_gather_into_tensor_out`).
/// * `Coalesced` / `CoalescedInPlace` — a list of inputs in one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Variant {
    Out,
    InPlace,
    OutBuf,
    Coalesced,
    CoalescedInPlace,
}

impl Variant {
    pub const ALL: [Variant; 5] = [Variant::Out, Variant::InPlace, Variant::OutBuf, Variant::Coalesced, Variant::CoalescedInPlace];
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Out => "out",
            Variant::InPlace => "inplace",
            Variant::OutBuf => "outbuf",
            Variant::Coalesced => "coalesced",
            Variant::CoalescedInPlace => "coalesced_inplace",
        }
    }
    pub fn from_name(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduce ops, as PyTorch's reduce-op strings. `PremulSum(s)` is `sum(s * x_r)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Avg,
    Product,
    Min,
    Max,
    BAnd,
    BOr,
    BXor,
    PremulSum(f64),
}

impl ReduceOp {
    /// Every op, with premul_sum's factor fixed at 2.0 (exact in every float dtype).
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
        ReduceOp::PremulSum(2.0),
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Product => "product",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
            ReduceOp::PremulSum(_) => "premul_sum",
        }
    }

    pub fn from_name(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == s)
    }

    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }

    /// Whether the op is defined for `dtype` at all (bitwise ops need integers, premul_sum floats).
    /// Backends may support less; that is declared in their capabilities.
    pub const fn defined_for(self, dtype: DType) -> bool {
        match self {
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => !dtype.is_float(),
            ReduceOp::PremulSum(_) => dtype.is_float(),
            _ => true,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
