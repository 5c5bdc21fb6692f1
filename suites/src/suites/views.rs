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
//! offsets (f32, world size 2, two shapes).

use crate::case::Case;
use crate::exec::PAIRS;
use crate::suites::matrix;
use crate::values::{self, Layout, ValueSpec};
use concord_core::{Backend, DType, OpKind, ReduceOp};
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
    out
}
