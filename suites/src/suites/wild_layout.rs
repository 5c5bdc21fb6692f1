//! Cases written for shipped bugs of memory layout and sizes (the twenty-fourth hunt,
//! `concord_mutants::bugs_hunt24`), where the rest of the catalogue let the bug through.
//!
//! * `wild_layout::empty_out_at_input_address::{reduce_scatter_tensor,all_gather_into_tensor}::ws2`
//!   — an `_out` call whose input and output have no element and sit at one address: two empty
//!   views of one parent at one offset (FSDP's empty shards of one flat buffer). Zero bytes
//!   overlap nothing, so the call is valid and MUST complete with the empty output, the parent
//!   untouched. MPICH's alias check compared the two pointers whatever the count and refused it
//!   (pmodels/mpich #2124 for reduce_scatter, #264 for allreduce, open-mpi/ompi #4135 for
//!   Open MPI's reduce); every other case gives an empty input and output their own allocations,
//!   at different addresses.

use super::util::{expect_eq, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};

fn meta(op: OpKind) -> CaseMeta {
    let reduce = if op.reduces() { "sum" } else { "-" };
    CaseMeta { suite: "wild_layout".into(), op: op.name().into(), variant: "outbuf".into(), dtype: "f32".into(), reduce: reduce.into() }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    [OpKind::ReduceScatterTensor, OpKind::AllGatherIntoTensor]
        .into_iter()
        .map(|op| {
            let name = format!("wild_layout::empty_out_at_input_address::{}::ws2", op.name());
            Case::<B>::new(name, meta(op), 2, move |ctx| empty_out_at_input_address(ctx, op))
        })
        .collect()
}

/// The parent's elements: a guard pattern no collective writes.
const PARENT: usize = 8;
/// The element offset of both empty views.
const AT: usize = 3;

/// `op`'s `_out` form with an empty input and an empty output, both views of one parent at
/// element `AT`: it must complete, return the output buffer, empty, and leave the parent as it was.
fn empty_out_at_input_address<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    b.capabilities().check(op, Some(Variant::OutBuf), Some(DType::F32), reduce, ws).map_err(CaseEnd::Unsupported)?;
    let w = format!(
        "{}{} (input and output: empty views of one {PARENT}-element parent, both at element {AT}, so at one address)",
        here(b, &format!("{}_out", op.name()), "outbuf", DType::F32),
        reduce.map(|r| format!(" reduce={r:?}")).unwrap_or_default()
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let guard: Vec<f64> = (0..PARENT).map(|i| 1000.0 + (10 * b.rank() + i) as f64).collect();
    let guard = Tensor::from_f64(DType::F32, &[PARENT], &guard);
    let parent = b.upload(&guard).map_err(|e| named("upload", e))?;
    let x = b.view(&parent, AT, &[0]).map_err(|e| named("view (input)", e))?;
    let out = b.view(&parent, AT, &[0]).map_err(|e| named("view (output)", e))?;
    let issued = match op {
        OpKind::ReduceScatterTensor => b.reduce_scatter_tensor_out(&x, ReduceOp::Sum, &out),
        _ => b.all_gather_into_tensor_out(&x, &out),
    };
    let got = issued.and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| {
        named("the valid call failed (zero bytes overlap nothing: an empty output at the input's address is not aliasing)", e)
    })?;
    if b.buffer_addr(&got) != b.buffer_addr(&out) {
        return Err(fail(&w, format!("returned a buffer at {:#x}, not the output at {:#x}", b.buffer_addr(&got), b.buffer_addr(&out))));
    }
    expect_eq(b, &got, &Tensor::zeros(DType::F32, &[0]), &format!("{w}: the result"))?;
    expect_eq(b, &parent, &guard, &format!("{w}: the parent around the empty views (no byte may change)"))
}
