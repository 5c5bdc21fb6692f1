//! The dtype and reduce-op map: which NCCL type moves or reduces each Concord dtype, and what a
//! reduce op is to NCCL (a built-in op code, or a premul-sum scalar), or why NCCL cannot do it.

use concord_core::{BadInputKind, DType, ReduceOp};
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

pub(crate) fn red_check(
    op: ReduceOp,
    d: DType,
) -> std::result::Result<Red, (BadInputKind, String)> {
    if op.is_bitwise() {
        return Err((
            BadInputKind::UnsupportedOp,
            format!("NCCL has no bitwise reductions ({})", op.name()),
        ));
    }
    if !op.defined_for(d) {
        return Err((
            BadInputKind::UnsupportedDType,
            format!("{} is not defined for {d}", op.name()),
        ));
    }
    if nccl_dtype(d).is_none() {
        return Err((
            BadInputKind::UnsupportedDType,
            format!("NCCL has no {d} type, so it cannot reduce {d}"),
        ));
    }
    Ok(match op {
        ReduceOp::Sum => Red::Builtin(0),
        ReduceOp::Product => Red::Builtin(1),
        ReduceOp::Max => Red::Builtin(2),
        ReduceOp::Min => Red::Builtin(3),
        ReduceOp::Avg => Red::Builtin(4),
        ReduceOp::PremulSum(s) => Red::PreMul(s),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => unreachable!("rejected above"),
    })
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
