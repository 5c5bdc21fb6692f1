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
//!   at different addresses. Then the same op with elements, input and output disjoint views of
//!   one parent (one guard element between): valid whatever the aliasing policy, since aliasing
//!   is decided by byte ranges, not by allocation (review13's finding 8).
//! * `wild_layout::inplace_all_reduce_view_in_window::ws2` — an out-of-place, then an in-place
//!   all_reduce of a 4 MiB view (2^20 f32) at element 1031 of a larger
//!   parent: each result right, every byte of the parent around the view untouched. RCCL's
//!   copy-engine all_reduce (4 MiB to 256 MiB, a count divisible by the ranks, a registered
//!   window) copied the peers' shards to `rank * shardBytes` from the *window's* base, right only
//!   for a buffer at the window's start (ROCm/rocm-systems PR #10887); the view cases
//!   (`views::*`) are below 4 MiB, and the random programs' views of 4 MiB or more come from
//!   one seed's draw (`programs::p3::ws3`'s 7.2 MiB all_gather output). The out-of-place call
//!   (review17 finding 3) is for a registration used for large messages only that hands the
//!   kernel the allocation's base (`review17_large_reg_at_alloc_base`).
//! * `wild_layout::empty_p2p_at_parent_end::ws2` — a zero-element message sent from, and
//!   received into, an empty view at its parent's *end* (the empty tail slice `t[n:]`, whose
//!   address is one past the parent's last byte), then a two-element message on the same pair:
//!   both complete, the second arrives whole, neither parent changes. aws-ofi-nccl handed a
//!   zero-byte transfer of a user-registered buffer a memory region that did not cover its
//!   pointer, and the provider refused it (aws/aws-ofi-nccl PR #804); every other empty view of
//!   the catalogue lies strictly inside its parent, between guard elements.

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
        .chain([2].map(|ws| {
            let m = CaseMeta {
                suite: "wild_layout".into(),
                op: "all_reduce".into(),
                variant: "inplace".into(),
                dtype: "f32".into(),
                reduce: "sum".into(),
            };
            Case::<B>::new(format!("wild_layout::inplace_all_reduce_view_in_window::ws{ws}"), m, ws, inplace_all_reduce_view_in_window)
        }))
        .chain(std::iter::once({
            let m = CaseMeta {
                suite: "wild_layout".into(),
                op: "send_recv".into(),
                variant: "outbuf".into(),
                dtype: "f32".into(),
                reduce: "-".into(),
            };
            Case::<B>::new("wild_layout::empty_p2p_at_parent_end::ws2", m, 2, empty_p2p_at_parent_end)
        }))
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
        reduce.map(|r| format!(" reduce={}", r.name())).unwrap_or_default()
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
    expect_eq(b, &parent, &guard, &format!("{w}: the parent around the empty views (no byte may change)"))?;
    disjoint_views_of_one_parent(ctx, op)
}

/// Elements of the input of [`disjoint_views_of_one_parent`] (a multiple of every world size up
/// to 4).
const DISJOINT_IN: usize = 12;

/// The same `_out` op with elements: the input is elements `[0, DISJOINT_IN)` of a parent, the
/// output a view past it with one guard element between. The two do not overlap, so the call is
/// valid whatever the aliasing policy (aliasing is an output that *overlaps* an input, byte
/// ranges, not allocations): the result is right, the guard and the input unchanged. A backend
/// that decides aliasing by allocation refuses it, or takes an in-place shortcut.
fn disjoint_views_of_one_parent<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let out_n = if op == OpKind::ReduceScatterTensor { DISJOINT_IN / ws } else { DISJOINT_IN * ws };
    let total = DISJOINT_IN + 1 + out_n;
    let w = format!(
        "{}{} (input: elements [0, {DISJOINT_IN}) of a {total}-element parent; output: a disjoint view of {out_n} at element {}, one guard element between)",
        here(b, &format!("{}_out", op.name()), "outbuf", DType::F32),
        if op.reduces() { " reduce=Sum" } else { "" },
        DISJOINT_IN + 1
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let of = |r: usize, i: usize| (100 * r + i + 1) as f32;
    let before: Vec<f32> = (0..total).map(|i| if i < DISJOINT_IN { of(me, i) } else { -1.0 - i as f32 }).collect();
    let before = Tensor::from_vec(&[total], before);
    let parent = b.upload(&before).map_err(|e| named("upload", e))?;
    let x = b.view(&parent, 0, &[DISJOINT_IN]).map_err(|e| named("view (input)", e))?;
    let out = b.view(&parent, DISJOINT_IN + 1, &[out_n]).map_err(|e| named("view (output)", e))?;
    let issued = match op {
        OpKind::ReduceScatterTensor => b.reduce_scatter_tensor_out(&x, ReduceOp::Sum, &out),
        _ => b.all_gather_into_tensor_out(&x, &out),
    };
    issued
        .and_then(|wk| wk.into_value(ctx.timeout))
        .map_err(|e| named("the valid call failed (an output that overlaps no byte of the input is not aliasing)", e))?;
    let mut expected = before.clone();
    let result: Vec<f32> = match op {
        OpKind::ReduceScatterTensor => (0..out_n).map(|i| (0..ws).map(|r| of(r, me * out_n + i)).sum()).collect(),
        _ => (0..out_n).map(|i| of(i / DISJOINT_IN, i % DISJOINT_IN)).collect(),
    };
    expected.as_mut_slice::<f32>()[DISJOINT_IN + 1..].copy_from_slice(&result);
    expect_eq(b, &parent, &expected, &format!("{w}: the parent (input unchanged, guard unchanged, output the result)"))
}

/// The view's elements: 4 MiB of f32 (RCCL's copy-engine floor), a count divisible by 2.
const WINDOW_N: usize = 1 << 20;
/// The view's element offset in its parent (past a 4 KiB page, not a multiple of 16 bytes).
const WINDOW_AT: usize = 1031;
/// Guard elements after the view.
const WINDOW_TAIL: usize = 1029;

/// Rank `r`'s element `i` of the in-place all_reduce: a small integer, so any sum is exact.
fn window_input(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 1000) as f32 - 500.0
}

/// Parent element `i` outside the view on rank `me`: a value no sum of inputs takes.
fn window_guard(me: usize, i: usize) -> f32 {
    -10_000.0 - (i % 97) as f32 - 1000.0 * me as f32
}

/// An in-place all_reduce (sum) of a 4 MiB view at element [`WINDOW_AT`] of a larger parent:
/// the view holds the sum, the parent's elements around it keep their guard values. One pass
/// over the downloaded parent checks both (the case stays well under 0.2 s on shm).
fn inplace_all_reduce_view_in_window<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    b.capabilities()
        .check(OpKind::AllReduce, Some(Variant::InPlace), Some(DType::F32), Some(ReduceOp::Sum), ws)
        .map_err(CaseEnd::Unsupported)?;
    let total = WINDOW_AT + WINDOW_N + WINDOW_TAIL;
    let w = format!(
        "{} reduce=sum (input: a view of {WINDOW_N} elements, 4 MiB, at element {WINDOW_AT} of a {total}-element parent)",
        here(b, "all_reduce_", "inplace", DType::F32)
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let in_view = |i: usize| (WINDOW_AT..WINDOW_AT + WINDOW_N).contains(&i);
    let before: Vec<f32> = (0..total).map(|i| if in_view(i) { window_input(me, i - WINDOW_AT) } else { window_guard(me, i) }).collect();
    let parent = b.upload(&Tensor::from_vec(&[total], before)).map_err(|e| named("upload", e))?;
    let view = b.view(&parent, WINDOW_AT, &[WINDOW_N]).map_err(|e| named("view", e))?;
    // First the same view out of place (review17 finding 3: a registration used for large
    // messages only that resolves the view to its allocation's base reads the parent's first
    // bytes): its result checked here; the parent it must leave alone is checked below (an
    // input written would spoil the in-place sum too).
    if b.capabilities().check(OpKind::AllReduce, Some(Variant::Out), Some(DType::F32), Some(ReduceOp::Sum), ws).is_ok() {
        let wo = format!(
            "{} reduce=sum (input: a view of {WINDOW_N} elements, 4 MiB, at element {WINDOW_AT} of a {total}-element parent)",
            here(b, "all_reduce", "out", DType::F32)
        );
        let out = b
            .all_reduce(&view, ReduceOp::Sum)
            .and_then(|wk| wk.into_value(ctx.timeout))
            .map_err(|e| fail(&wo, format!("all_reduce: {e} [{}]", e.name())))?;
        if b.capabilities().moves_data {
            let sum: Vec<f32> = (0..WINDOW_N).map(|i| (0..ws).map(|r| window_input(r, i)).sum()).collect();
            expect_eq(b, &out, &Tensor::from_vec(&[WINDOW_N], sum), &wo)?;
        }
    }
    let got = b.all_reduce_(&view, ReduceOp::Sum).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| named("all_reduce_", e))?;
    if b.buffer_addr(&got) != b.buffer_addr(&view) {
        return Err(fail(&w, format!("returned a buffer at {:#x}, not the view at {:#x}", b.buffer_addr(&got), b.buffer_addr(&view))));
    }
    if !b.capabilities().moves_data {
        // The case cannot pass on stand-in values (the fake's).
        crate::case::note_values_unchecked();
        return Ok(());
    }
    let after = b.download(&parent).map_err(|e| named("download of the parent", e))?;
    let after = after.as_slice::<f32>();
    let want = |i: usize| if in_view(i) { (0..ws).map(|r| window_input(r, i - WINDOW_AT)).sum() } else { window_guard(me, i) };
    let (mut first, mut bad_view, mut bad_guard) = (None, 0, 0);
    for (i, g) in after.iter().enumerate() {
        if g.to_bits() != want(i).to_bits() {
            first = first.or(Some(i));
            *(if in_view(i) { &mut bad_view } else { &mut bad_guard }) += 1;
        }
    }
    let Some(first) = first else { return Ok(()) };
    let (part, index) = if in_view(first) { ("the view", first - WINDOW_AT) } else { ("a guard element of the parent", first) };
    Err(fail(
        &w,
        format!(
            "first bad index {index} of {part} (parent element {first}): got {}, expected {} ({bad_view} of {WINDOW_N} view elements and {bad_guard} guard elements differ)",
            after[first],
            want(first)
        ),
    ))
}

/// Rank 0 sends an empty view at its 4-element parent's end to rank 1, which receives it into an
/// empty view at its own parent's end; then rank 0 sends two elements, which rank 1 receives
/// whole. Both calls complete and neither parent changes.
fn empty_p2p_at_parent_end<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    b.capabilities().check(OpKind::SendRecv, Some(Variant::OutBuf), Some(DType::F32), None, ws).map_err(CaseEnd::Unsupported)?;
    let w = format!(
        "{} (rank 0 sends an empty view at element 4 of its 4-element parent, the parent's end, to rank 1, which receives into the same layout; then 2 elements)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let guard = Tensor::from_f64(DType::F32, &[4], &[7.0 + me as f64, 8.0, 9.0, 10.0 + me as f64]);
    let parent = b.upload(&guard).map_err(|e| named("upload", e))?;
    let empty = b.view(&parent, 4, &[0]).map_err(|e| named("view (empty, at the parent's end)", e))?;
    let message = Tensor::from_f64(DType::F32, &[2], &[31.0, -32.0]);
    match me {
        0 => {
            b.send(&empty, 1).and_then(|wk| wk.wait(ctx.timeout).map(|_| ())).map_err(|e| named("send of the empty view", e))?;
            let x = b.upload(&message).map_err(|e| named("upload", e))?;
            b.send(&x, 1).and_then(|wk| wk.wait(ctx.timeout).map(|_| ())).map_err(|e| named("send of the 2-element message", e))?;
        }
        1 => {
            let got = b.recv(&empty, 0).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| named("recv into the empty view", e))?;
            if b.buffer_addr(&got) != b.buffer_addr(&empty) || b.buffer_shape(&got) != [0] {
                return Err(fail(
                    &w,
                    format!(
                        "recv returned {:?} at {:#x}, not the empty view at {:#x}",
                        b.buffer_shape(&got),
                        b.buffer_addr(&got),
                        b.buffer_addr(&empty)
                    ),
                ));
            }
            let out = b.alloc(DType::F32, &[2]).map_err(|e| named("alloc", e))?;
            let got = b.recv(&out, 0).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| named("recv of the 2-element message", e))?;
            expect_eq(b, &got, &message, &format!("{w}: the 2-element message after the empty one"))?;
        }
        _ => {}
    }
    expect_eq(b, &parent, &guard, &format!("{w}: the parent of the empty view (no byte may change)"))
}
