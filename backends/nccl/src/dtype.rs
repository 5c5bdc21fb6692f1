//! The dtype and reduce-op map: which NCCL type moves or reduces each Concord dtype, and what a
//! reduce op is to NCCL (a built-in op code, or a premul-sum scalar; which ops and dtypes NCCL
//! cannot reduce is the core rule table's business, from the declared gaps).

use concord_core::{DType, ReduceOp};
use cudarc::nccl::sys as nccl;

/// NCCL's type for `d`, if it has one (not for i16 / u16).
pub(crate) fn nccl_dtype(d: DType) -> Option<nccl::ncclDataType_t> {
    use nccl::ncclDataType_t::*;
    Some(match d {
        DType::I8 => ncclInt8,
        DType::U8 => ncclUint8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::I16 | DType::U16 => return None,
    })
}

/// Type and count to *move* `numel` elements (dtypes NCCL lacks move as bytes).
pub(crate) fn move_type(d: DType, numel: usize) -> (nccl::ncclDataType_t, usize) {
    match nccl_dtype(d) {
        Some(t) => (t, numel),
        None => (nccl::ncclDataType_t::ncclUint8, numel * d.size()),
    }
}

/// A reduce op as NCCL sees it.
#[derive(Clone, Copy)]
pub(crate) enum Red {
    Builtin(u32),
    PreMul(f64),
}

/// NCCL's `ncclSum`.
pub(crate) const SUM: u32 = 0;
/// NCCL's `ncclAvg`.
pub(crate) const AVG: u32 = 4;

/// NCCL's reduce op for `op` (after the rule table: bitwise ops are a declared gap).
pub(crate) fn red_of(op: ReduceOp) -> Red {
    match op {
        ReduceOp::Sum => Red::Builtin(SUM),
        ReduceOp::Product => Red::Builtin(1),
        ReduceOp::Max => Red::Builtin(2),
        ReduceOp::Min => Red::Builtin(3),
        ReduceOp::Avg => Red::Builtin(AVG),
        ReduceOp::PremulSum(s) => Red::PreMul(s),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            unreachable!("rejected by validate_local: a declared gap")
        }
    }
}

/// The scalar of a premul-sum op in `d`'s representation (little-endian, padded to 8 bytes).
pub(crate) fn premul_scalar(d: DType, s: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    match d {
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(s).to_bits().to_le_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(s).to_bits().to_le_bytes()),
        DType::F32 => b[..4].copy_from_slice(&(s as f32).to_le_bytes()),
        _ => b.copy_from_slice(&s.to_le_bytes()),
    }
    b
}
