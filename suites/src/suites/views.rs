//! Views at non-zero offsets: every op that takes an input or an `_out` / recv buffer, run with
//! each input (and the `_out` / recv output) a `Backend::view` at a non-zero element offset into
//! a larger parent filled with guard bytes. The result is checked against the oracle as in the
//! matrix (identity, values, untouched input), and every byte of every parent outside its view
//! must be untouched: a backend that ignores a view's offset reads or writes the parent's start.
//!
//! Offsets alternate from one shape to the next between a small misaligned one (3 / 5 elements:
//! not a multiple of 16 bytes) and one past a 4 KiB page (1029 / 1031 elements). Every
//! (op, variant) of the trait but barrier, f32 and bf16 (sum for reducing ops), world sizes 2 and 3; f64
//! (8-byte elements) at world size 2. `views::aligned::*`: the same at 16-byte and page-aligned
//! offsets (f32, world size 2, two shapes). `views::nested::*`: a view of a view (its offset
//! counts from the outer view's start, not the parent's). `views::one_parent::*`: a coalesced
//! in-place list of views into one parent, out of order and with gaps between them (only the
//! views' elements may change).

use super::util::{expect_eq, fail, here, step_failed};
use crate::case::{Case, CaseMeta, CaseResult, Ctx};
use crate::exec::PAIRS;
use crate::suites::matrix;
use crate::values::{self, check_frame, guard_byte, Layout, ValueSpec};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor};
use concord_fixtures::InputKind;

/// The layout of run `i`: input and output offsets alternate between small and page-crossing.
pub fn layout(i: usize) -> Layout {
    if i.is_multiple_of(2) {
        Layout { in_offset: 3, out_offset: 1031 }
    } else {
        Layout { in_offset: 1029, out_offset: 5 }
    }
}

/// The layout of run `i` of the aligned cases: offsets of 16 bytes and of a 4 KiB page (f32).
pub fn aligned_layout(i: usize) -> Layout {
    if i.is_multiple_of(2) {
        Layout { in_offset: 4, out_offset: 1024 }
    } else {
        Layout { in_offset: 1024, out_offset: 4 }
    }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for &(op, variant) in PAIRS {
        if op == OpKind::Barrier {
            continue;
        }
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            let reduce = op.reduces().then_some(ReduceOp::Sum);
            let spec = ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: None };
            // f64 (8-byte elements: another element size, often another kernel path) at ws 2.
            let sizes: &[usize] = if dtype == DType::F64 { &[2] } else { &[2, 3] };
            for &ws in sizes {
                let name = format!("views::{}", matrix::case_name(&spec, ws));
                let meta = matrix::meta("views", &spec);
                let seed = concord_fixtures::seed_for(&name);
                let spec = spec.clone();
                out.push(Case::new(name, meta, ws, move |ctx| {
                    values::run_in(ctx.b, &spec, seed, ctx.timeout, "views_at_offset", layout, &values::Extra::default())
                }));
            }
        }
        // Offsets a whole number of 16-byte vectors (and of pages) in: a backend may hand an
        // aligned view to a vectorised or zero-copy path that the misaligned ones above never take.
        let reduce = op.reduces().then_some(ReduceOp::Sum);
        let spec = ValueSpec { op, variant, dtype: DType::F32, reduce, kind: InputKind::Exact, max_shapes: Some(2) };
        let name = format!("views::aligned::{}", matrix::case_name(&spec, 2));
        let meta = matrix::meta("views", &spec);
        let seed = concord_fixtures::seed_for(&name);
        out.push(Case::new(name, meta, 2, move |ctx| {
            values::run_in(ctx.b, &spec, seed, ctx.timeout, "views_at_aligned_offset", aligned_layout, &values::Extra::default())
        }));
    }
    let meta = |variant: &str| CaseMeta {
        suite: "views".into(),
        op: "all_reduce".into(),
        variant: variant.into(),
        dtype: "f32".into(),
        reduce: "sum".into(),
    };
    out.push(Case::new("views::nested::all_reduce::inplace::f32::ws2", meta("inplace"), 2, nested));
    out.push(Case::new("views::one_parent::all_reduce::coalesced_inplace::f32::ws2", meta("coalesced_inplace"), 2, one_parent));
    out
}

/// Rank `r`'s input of `n` elements for the view cases below (exact in f32, distinct per rank).
fn view_input(r: usize, n: usize, salt: usize) -> Tensor {
    Tensor::from_vec(&[n], (0..n).map(|i| ((i * 7 + r * 3 + salt) % 29) as f32).collect())
}

/// [`view_input`] summed over `ws` ranks.
fn view_sum(ws: usize, n: usize, salt: usize) -> Tensor {
    Tensor::from_vec(&[n], (0..n).map(|i| (0..ws).map(|r| ((i * 7 + r * 3 + salt) % 29) as f32).sum::<f32>()).collect())
}

/// `views::nested::all_reduce::inplace::f32::ws2`: an in-place `all_reduce_` on a view made
/// from another view (1,029 elements into a view 3 elements into a guarded parent: element
/// 1,032 of the parent). The result is read through the parent at that place, and every other
/// byte of the parent must keep its guard. A backend that places a view of a view from the
/// parent's start (its base offset forgotten) reads and writes 3 elements early.
fn nested<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let (outer_off, inner_off, n) = (3, 1029, 300);
    let at = outer_off + inner_off;
    let w = format!(
        "{} a view {inner_off} elements into a view {outer_off} elements into a guarded parent (element {at} of the parent)",
        here(b, "all_reduce", "inplace", DType::F32)
    );
    let named = |step| step_failed(&w, step);
    let parent =
        b.upload(&Tensor::filled_bytes(DType::F32, &[at + n + values::GUARD_ELEMS], guard_byte(me))).map_err(named("upload the parent"))?;
    let outer = b.view(&parent, outer_off, &[inner_off + n + 4]).map_err(named("the outer view"))?;
    let inner = b.view(&outer, inner_off, &[n]).map_err(named("the view of the view"))?;
    b.write(&inner, &view_input(me, n, 0)).map_err(named("write the input"))?;
    let got = b.all_reduce_(&inner, ReduceOp::Sum).and_then(|wk| wk.into_value(ctx.timeout)).map_err(named("all_reduce_"))?;
    if b.buffer_addr(&got) != b.buffer_addr(&inner) {
        return Err(fail(&w, "the in-place op returned another buffer than the view it was given"));
    }
    let placed = b.view(&parent, at, &[n]).map_err(named("a view of the parent at the nested view's place"))?;
    expect_eq(b, &placed, &view_sum(ws, n, 0), &format!("{w}: the result read through the parent at element {at}"))?;
    check_frame(b, &parent, at, n, "nested view").map_err(|m| fail(&w, m))
}

/// `views::one_parent::all_reduce::coalesced_inplace::f32::ws2`: `all_reduce_coalesced_` of
/// three views into one guarded parent, listed out of order and with gaps between them
/// (elements 40..45, 3..10 and 17..26). Each view must hold its sum, and every byte of the
/// parent outside the three views must keep its guard: a backend that reduces the span from the
/// first view's start to the last one's end as one buffer (the tensors share one storage)
/// reduces the gaps too.
fn one_parent<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let places = [(40usize, 5usize), (3, 7), (17, 9)];
    let w = format!(
        "{} three views of one guarded parent at elements {places:?} (offset, length), listed out of order, gaps between them",
        here(b, "all_reduce", "coalesced_inplace", DType::F32)
    );
    let total = 48 + values::GUARD_ELEMS;
    let named = |step| step_failed(&w, step);
    let g = guard_byte(me);
    let parent = b.upload(&Tensor::filled_bytes(DType::F32, &[total], g)).map_err(named("upload the parent"))?;
    let views: Vec<B::Buffer> =
        places.iter().map(|&(off, n)| b.view(&parent, off, &[n])).collect::<Result<_, _>>().map_err(named("the views"))?;
    for (k, (v, &(_, n))) in views.iter().zip(&places).enumerate() {
        b.write(v, &view_input(me, n, 5 * k)).map_err(named("write the inputs"))?;
    }
    let got =
        b.all_reduce_coalesced_(&views, ReduceOp::Sum).and_then(|wk| wk.into_value(ctx.timeout)).map_err(named("all_reduce_coalesced_"))?;
    if got.len() != views.len() {
        return Err(fail(&w, format!("returned {} result(s) for {} input(s)", got.len(), views.len())));
    }
    for (k, (v, &(off, n))) in views.iter().zip(&places).enumerate() {
        if b.buffer_addr(&got[k]) != b.buffer_addr(v) {
            return Err(fail(&w, format!("tensor {k}: the in-place op returned another buffer than the view it was given")));
        }
        expect_eq(b, v, &view_sum(ws, n, 5 * k), &format!("{w}: tensor {k} (elements {off}..{})", off + n))?;
    }
    let all = b.download(&parent).map_err(named("download the parent"))?;
    let es = DType::F32.size();
    let inside = |i: usize| places.iter().any(|&(off, n)| (off * es..(off + n) * es).contains(&i));
    if let Some(i) = (0..all.bytes().len()).find(|&i| !inside(i) && all.bytes()[i] != g) {
        return Err(fail(
            &w,
            format!(
                "wrote outside the three views: byte {i} of the parent (element {}) is 0x{:02x}, expected this rank's guard 0x{g:02x} (only the views' elements may change)",
                i / es,
                all.bytes()[i]
            ),
        ));
    }
    Ok(())
}
