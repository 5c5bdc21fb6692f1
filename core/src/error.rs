//! Named errors. Every failure a backend reports is one of these variants, so suites can assert
//! on the *kind* of error (`err.name()`), and every message says which op and sequence number.

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

/// Which rule a bad input broke. `name()` is a stable, greppable identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BadInputKind {
    /// Shapes differ across ranks where the op needs them equal.
    ShapeMismatch,
    /// Dtypes differ across ranks, or between input and output.
    DTypeMismatch,
    /// Dim 0 is not divisible by the world size (reduce_scatter, scatter).
    Indivisible,
    /// Split sizes do not sum to dim 0, or have the wrong length.
    BadSplits,
    /// My output split for peer j does not match peer j's input split for me.
    SplitMismatch,
    /// A root / src rank out of range, or not the same on every rank.
    BadRoot,
    /// A send/recv peer out of range, or equal to self.
    BadPeer,
    /// The op is not defined for this dtype (e.g. bitwise on floats).
    UnsupportedDType,
    /// The backend does not support this op / reduce op.
    UnsupportedOp,
    /// An `_out` or recv buffer of the wrong size or shape.
    OutBufferSize,
    /// A permutation that is not a permutation of 0..world_size.
    BadPermutation,
    /// Input and output buffers alias where the op forbids it.
    Aliasing,
    /// A coalesced list whose length differs across ranks, or a bad group member list.
    CountMismatch,
    /// A 0-dim tensor where the op needs at least one dimension.
    ZeroDim,
    /// A different op was issued on another rank at the same sequence number.
    OpMismatch,
    /// A reduce op that differs across ranks.
    ReduceOpMismatch,
    /// A subgroup rank list that is empty, has duplicates or out-of-range ranks.
    BadGroup,
    /// A fused op's `A` (fewer than 2 dims) or `B` (not 2 dims) is not a matrix.
    NotAMatrix,
    /// A fused op's gather / scatter dim is not a dim of `A`, or differs across ranks.
    BadDim,
    /// A fused reduce-scatter's reduce op is not sum or avg.
    BadReduceOp,
    /// A scaled fused op's scales have the wrong length, or differ in kind across ranks.
    BadScale,
}

impl BadInputKind {
    /// Every kind, in a fixed order: position = [`BadInputKind::code`].
    pub const ALL: [BadInputKind; 21] = [
        BadInputKind::ShapeMismatch,
        BadInputKind::DTypeMismatch,
        BadInputKind::Indivisible,
        BadInputKind::BadSplits,
        BadInputKind::SplitMismatch,
        BadInputKind::BadRoot,
        BadInputKind::BadPeer,
        BadInputKind::UnsupportedDType,
        BadInputKind::UnsupportedOp,
        BadInputKind::OutBufferSize,
        BadInputKind::BadPermutation,
        BadInputKind::Aliasing,
        BadInputKind::CountMismatch,
        BadInputKind::ZeroDim,
        BadInputKind::OpMismatch,
        BadInputKind::ReduceOpMismatch,
        BadInputKind::BadGroup,
        BadInputKind::NotAMatrix,
        BadInputKind::BadDim,
        BadInputKind::BadReduceOp,
        BadInputKind::BadScale,
    ];

    /// A stable small integer for wire formats (backends post it to their peers).
    pub fn code(self) -> u64 {
        BadInputKind::ALL.iter().position(|k| *k == self).expect("ALL lists every kind") as u64
    }

    pub fn from_code(code: u64) -> Option<BadInputKind> {
        BadInputKind::ALL.get(code as usize).copied()
    }

    pub const fn name(self) -> &'static str {
        match self {
            BadInputKind::ShapeMismatch => "shape_mismatch",
            BadInputKind::DTypeMismatch => "dtype_mismatch",
            BadInputKind::Indivisible => "indivisible",
            BadInputKind::BadSplits => "bad_splits",
            BadInputKind::SplitMismatch => "split_mismatch",
            BadInputKind::BadRoot => "bad_root",
            BadInputKind::BadPeer => "bad_peer",
            BadInputKind::UnsupportedDType => "unsupported_dtype",
            BadInputKind::UnsupportedOp => "unsupported_op",
            BadInputKind::OutBufferSize => "out_buffer_size",
            BadInputKind::BadPermutation => "bad_permutation",
            BadInputKind::Aliasing => "aliasing",
            BadInputKind::CountMismatch => "count_mismatch",
            BadInputKind::ZeroDim => "zero_dim",
            BadInputKind::OpMismatch => "op_mismatch",
            BadInputKind::ReduceOpMismatch => "reduce_op_mismatch",
            BadInputKind::BadGroup => "bad_group",
            BadInputKind::NotAMatrix => "not_a_matrix",
            BadInputKind::BadDim => "bad_dim",
            BadInputKind::BadReduceOp => "bad_reduce_op",
            BadInputKind::BadScale => "bad_scale",
        }
    }
}

/// Every error a collective can end in.
#[derive(Clone, Debug, Error, PartialEq, Serialize, Deserialize)]
pub enum CollectiveError {
    #[error("bad input ({}) to {op} #{seq} on rank {rank}: {detail}", kind.name())]
    BadInput { kind: BadInputKind, op: String, seq: u64, rank: usize, detail: String },

    #[error("timeout: {op} #{seq} on rank {rank} not complete after {waited_ms} ms: {detail}")]
    Timeout { op: String, seq: u64, rank: usize, waited_ms: u64, detail: String },

    #[error("peer died: rank {peer} went away during {op} #{seq} (seen by rank {rank}): {detail}")]
    PeerDied { op: String, seq: u64, rank: usize, peer: usize, detail: String },

    #[error("unsupported by this backend: {0}")]
    Unsupported(String),

    #[error("injected failure: {op} #{seq} failed because the backend was told to fail every collective")]
    Injected { op: String, seq: u64 },

    #[error("communicator aborted: {0}")]
    Aborted(String),

    #[error("backend error: {0}")]
    Backend(String),
}

impl CollectiveError {
    /// A stable identifier of the error's kind: `bad_input:indivisible`, `timeout`, `peer_died`...
    pub fn name(&self) -> String {
        match self {
            CollectiveError::BadInput { kind, .. } => format!("bad_input:{}", kind.name()),
            CollectiveError::Timeout { .. } => "timeout".into(),
            CollectiveError::PeerDied { .. } => "peer_died".into(),
            CollectiveError::Unsupported(_) => "unsupported".into(),
            CollectiveError::Injected { .. } => "injected".into(),
            CollectiveError::Aborted(_) => "aborted".into(),
            CollectiveError::Backend(_) => "backend".into(),
        }
    }

    pub fn bad_input(kind: BadInputKind, op: &str, seq: u64, rank: usize, detail: impl Into<String>) -> Self {
        CollectiveError::BadInput { kind, op: op.to_string(), seq, rank, detail: detail.into() }
    }

    pub fn bad_input_kind(&self) -> Option<BadInputKind> {
        match self {
            CollectiveError::BadInput { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}
