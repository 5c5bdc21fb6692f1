//! Cases written for shipped bugs of caches and state carried across calls (the twenty-ninth
//! hunt, `concord_mutants::bugs_hunt29`), where the rest of the catalogue let the bug through.
//!
//! * `wild_state::all_gather_rank_padded_shapes::ws2` — out-of-place all_gathers, one after
//!   another on one communicator, of inputs whose shapes are equal once padded to four dims with
//!   leading 1s but differ in rank (`[8, 16]`, `[1, 8, 16]`, `[1, 1, 8, 16]`; `[16]`, `[1, 16]`;
//!   `[]`, `[1]`, `[1, 1]`): each result MUST have its own input's shape rule (`[ws * d0,
//!   rest..]`, a 0-dim input `[ws]`) and every rank's values in rank order. TT-NN's program cache
//!   hashed a shape's padded dims without its rank, so the second input of a pair reused the
//!   program built for the first, with the first one's compile-time dims
//!   (tenstorrent/tt-metal PR #40279); every other case of the catalogue gathers shapes of one
//!   rank in a row, or shapes that differ once padded.

use super::util::{expect_eq, here, step_failed};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, Tensor, Variant};

/// The inputs' shapes in call order: each run of shapes pads to the same four dims.
pub const RANK_PADDED_SHAPES: [&[usize]; 8] = [&[8, 16], &[1, 8, 16], &[1, 1, 8, 16], &[16], &[1, 16], &[], &[1], &[1, 1]];

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let m = CaseMeta {
        suite: "wild_state".into(),
        op: "all_gather_into_tensor".into(),
        variant: "out".into(),
        dtype: "f32".into(),
        reduce: "-".into(),
    };
    vec![Case::<B>::new("wild_state::all_gather_rank_padded_shapes::ws2", m, 2, all_gather_rank_padded_shapes)]
}

/// Rank `r`'s element `i` at call `k`: a small integer (exact in f32), unique per rank and call.
fn padded_input(r: usize, k: usize, i: usize) -> f32 {
    (10_000 * r + 1_000 * k + i) as f32
}

fn all_gather_rank_padded_shapes<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    b.capabilities().check(OpKind::AllGatherIntoTensor, Some(Variant::Out), Some(DType::F32), None, ws).map_err(CaseEnd::Unsupported)?;
    for (k, &shape) in RANK_PADDED_SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let w = format!(
            "{} input shape={shape:?} (call {k} of {}; earlier calls gathered shapes of another rank that pad to the same four dims: {:?})",
            here(b, "all_gather_into_tensor", "out", DType::F32),
            RANK_PADDED_SHAPES.len(),
            &RANK_PADDED_SHAPES[..k]
        );
        let x = b.upload(&Tensor::from_vec(shape, (0..n).map(|i| padded_input(me, k, i)).collect())).map_err(step_failed(&w, "upload"))?;
        let got = b.all_gather_into_tensor(&x).and_then(|wk| wk.into_value(ctx.timeout)).map_err(step_failed(&w, "all_gather"))?;
        let out_shape: Vec<usize> = match shape.split_first() {
            None => vec![ws],
            Some((d0, rest)) => std::iter::once(ws * d0).chain(rest.iter().copied()).collect(),
        };
        let expected = Tensor::from_vec(&out_shape, (0..ws).flat_map(|r| (0..n).map(move |i| padded_input(r, k, i))).collect());
        expect_eq(b, &got, &expected, &format!("{w}: the result"))?;
    }
    Ok(())
}
