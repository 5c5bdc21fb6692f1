//! Freed-and-reallocated buffers (PyTorch FSDP's `_test_storage_resize_zero/nonzero`): every
//! buffer of a collective is dropped before the next one allocates, so the same address tends to
//! come back with another size, shape or dtype (the shm arena reuses freed blocks first-fit).
//! A backend that caches registrations, mappings or sizes by address goes wrong here. Each case
//! runs one (op, variant) over [`STEPS`] twice over (then, at world size 2, [`LARGE_STEPS`]),
//! checking every result against the oracle;
//! a failure names the step, its dtype and shape, and whether its address was seen before.

use super::util::{expect_oracle, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use crate::values::partner;
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_fixtures::InputKind;
use std::collections::HashMap;

/// The buffers' (dtype, shape) in allocation order; dim 0 is multiplied by the world size for
/// the ops that split it. Sizes shrink, grow past the first, go to zero and back; the dtype
/// changes at an unchanged byte size.
pub const STEPS: [(DType, &[usize]); 11] = [
    (DType::F32, &[4096]),
    // The same bytes at the same address, another dtype of the same element size.
    (DType::I32, &[4096]),
    // The same bytes at the same address, another shape (a result sized from a shape kept by
    // address has the old one).
    (DType::F32, &[64, 64]),
    (DType::F32, &[1000]),
    (DType::I32, &[16, 64]),
    (DType::BF16, &[4096]),
    (DType::F32, &[0]),
    (DType::F32, &[70000]),
    (DType::F64, &[300]),
    (DType::U8, &[4097]),
    (DType::F32, &[4096]),
];

/// Appended once, after the two passes of [`STEPS`], at world size 2 only: a buffer of 2 MiB
/// freed, then one of another dtype of the same element size and another size (1 MiB and 4
/// bytes) that first-fit puts at its address. Caches kept by address only where they pay
/// (zero-copy or registered buffers of 1 MiB or more) are reached here alone.
pub const LARGE_STEPS: [(DType, &[usize]); 2] = [(DType::F32, &[1 << 19]), (DType::I32, &[(1 << 18) + 1])];

pub const OPS: [(OpKind, Variant); 8] = [
    (OpKind::AllReduce, Variant::Out),
    (OpKind::Gather, Variant::Out),
    (OpKind::AllReduce, Variant::InPlace),
    (OpKind::AllGatherIntoTensor, Variant::OutBuf),
    (OpKind::ReduceScatterTensor, Variant::OutBuf),
    (OpKind::AllToAllSingle, Variant::Out),
    (OpKind::Broadcast, Variant::InPlace),
    (OpKind::SendRecv, Variant::OutBuf),
];

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for (op, variant) in OPS {
        for ws in [2, 3] {
            let name = format!("realloc::{op}::{variant}::ws{ws}");
            let meta = CaseMeta {
                suite: "realloc".into(),
                op: op.name().into(),
                variant: variant.name().into(),
                dtype: "mixed".into(),
                reduce: if op.reduces() { "sum".into() } else { String::new() },
            };
            let seed = concord_fixtures::seed_for(&name);
            out.push(Case::<B>::new(name, meta, ws, move |ctx| run(ctx, op, variant, seed)));
        }
    }
    out
}

fn run<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant, seed: u64) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    let p = Params { reduce, root: ws - 1, peer: partner(me, ws), ..Default::default() };
    let coll = exec::collective(op, &p, ws).expect("every op of this suite moves data");
    // Address of each input seen so far -> the step that had it.
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let large: &[(DType, &[usize])] = if ws == 2 { &LARGE_STEPS } else { &[] };
    for (i, &(dtype, shape)) in STEPS.iter().chain(STEPS.iter()).chain(large).enumerate() {
        let w0 = here(b, op.name(), variant.name(), dtype);
        if let Err(reason) = b.capabilities().check(op, Some(variant), Some(dtype), reduce, ws) {
            return Err(CaseEnd::Unsupported(reason));
        }
        let shape = if matches!(op, OpKind::ReduceScatterTensor | OpKind::AllToAllSingle) {
            concord_fixtures::divisible_by(shape, ws)
        } else {
            shape.to_vec()
        };
        let s = seed.wrapping_add(i as u64);
        let inputs = concord_fixtures::inputs(s, ws, dtype, &shape, reduce, InputKind::Exact);
        let x = b.upload(&inputs[me]).map_err(|e| fail(&w0, format!("step {i}: upload: {e}")))?;
        let addr = b.buffer_addr(&x);
        let again = match seen.insert(addr, i) {
            Some(j) => format!(" (address 0x{addr:x} reused from step {j})"),
            None => String::new(),
        };
        let w = format!("{w0} reduce={} step={i} shape={shape:?}{again}", if reduce.is_some() { "sum" } else { "-" });
        let out = match (op, variant) {
            (_, Variant::OutBuf) => {
                let out_shape = match op {
                    OpKind::AllGatherIntoTensor => concord_fixtures::divisible_by(&shape, ws),
                    OpKind::ReduceScatterTensor => {
                        let mut o = shape.clone();
                        o[0] /= ws;
                        o
                    }
                    _ => shape.clone(),
                };
                let o = b.alloc(dtype, &out_shape).map_err(|e| fail(&w, format!("alloc: {e}")))?;
                // A receiver without partner keeps its buffer: make it this rank's input.
                b.write(&o, &Tensor::zeros(dtype, &out_shape)).map_err(|e| fail(&w, format!("write: {e}")))?;
                Some(o)
            }
            _ => None,
        };
        let res = exec::call(b, op, variant, std::slice::from_ref(&x), out.as_ref(), &p, ctx.timeout)
            .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        let Some(res) = res.first() else { return Err(fail(&w, "returned no result")) };
        if op == OpKind::SendRecv && p.peer.is_none() {
            continue;
        }
        expect_oracle(b, &coll, &inputs, res, &w)?;
        // Everything of this step is dropped here, before the next step allocates.
    }
    Ok(())
}
