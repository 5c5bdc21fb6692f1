//! Equal-split all_to_all (`None` splits) on multi-dimensional tensors: dim 0 is cut in
//! `world_size` equal blocks of whole rows, so a backend that splits elements instead of rows,
//! or drops the trailing dims, gets it wrong. Shapes `[2ws, 3]`, `[ws, 4, 5]`, `[3ws, 1, 2, 2]`
//! and the empty `[0, 3]`; f32, bf16 and i64; world sizes 2, 3 and 4; checked with the oracle.
//! Also one split list given and the other `None` (`all_to_all_equal::in_splits_none::f32::ws3`):
//! input splits `None` (an equal split of each rank's own dim 0) with output splits given, the
//! ranks' dim 0 differing, so the two lists differ on every rank.

use super::util::{expect_oracle, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta};
use concord_core::{Backend, DType, OpKind};
use concord_fixtures::InputKind;
use concord_oracle::Collective;

/// The shapes at world size `ws` (every dim 0 a multiple of `ws`).
pub fn shapes(ws: usize) -> Vec<Vec<usize>> {
    vec![vec![2 * ws, 3], vec![ws, 4, 5], vec![3 * ws, 1, 2, 2], vec![0, 3]]
}

fn meta(dtype: DType) -> CaseMeta {
    CaseMeta {
        suite: "all_to_all_equal".into(),
        op: OpKind::AllToAllSingle.name().into(),
        variant: "out".into(),
        dtype: dtype.name().into(),
        reduce: String::new(),
    }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        for ws in [2, 3, 4] {
            let name = format!("all_to_all_equal::{dtype}::ws{ws}");
            let meta = meta(dtype);
            let seed = concord_fixtures::seed_for(&name);
            out.push(Case::<B>::new(name, meta, ws, move |ctx| {
                let b = ctx.b;
                let ws = b.world_size();
                if let Err(reason) = b.capabilities().check(OpKind::AllToAllSingle, None, Some(dtype), None, ws) {
                    return Err(CaseEnd::Unsupported(reason));
                }
                for (k, shape) in shapes(ws).into_iter().enumerate() {
                    let w = format!("{} splits=None shape={shape:?}", here(b, "all_to_all_single", "out", dtype));
                    let s = seed.wrapping_add(k as u64);
                    let inputs = concord_fixtures::inputs(s, ws, dtype, &shape, None, InputKind::Exact);
                    let x = b.upload(&inputs[b.rank()]).map_err(|e| fail(&w, format!("upload: {e}")))?;
                    let got = b
                        .all_to_all_single(&x, None, None)
                        .and_then(|wk| wk.into_value(ctx.timeout))
                        .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                    let coll = Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] };
                    expect_oracle(b, &coll, &inputs, &got, &w)?;
                }
                Ok(())
            }));
        }
    }
    for ws in [2, 3] {
        out.push(in_splits_none(ws));
    }
    out
}

/// Rank `r` holds `ws·(r+1)` rows of 3 and sends `r+1` rows to every rank (`input_splits`
/// `None`); every rank receives `i+1` rows from rank `i` (`output_splits` given). A backend that
/// takes the one list given for both directions sends the wrong rows, or fails.
fn in_splits_none<B: Backend>(ws: usize) -> Case<B> {
    let dtype = DType::F32;
    let name = format!("all_to_all_equal::in_splits_none::{dtype}::ws{ws}");
    let meta = meta(dtype);
    let seed = concord_fixtures::seed_for(&name);
    Case::<B>::new(name, meta, ws, move |ctx| {
        let b = ctx.b;
        let (ws, me) = (b.world_size(), b.rank());
        if let Err(reason) = b.capabilities().check(OpKind::AllToAllSingle, None, Some(dtype), None, ws) {
            return Err(CaseEnd::Unsupported(reason));
        }
        let out_splits: Vec<usize> = (1..=ws).collect();
        let inputs: Vec<_> =
            (0..ws).map(|r| concord_fixtures::input(seed, r, ws, dtype, &[ws * (r + 1), 3], None, InputKind::Exact)).collect();
        let w = format!(
            "{} input_splits=None output_splits={out_splits:?} shape={:?}",
            here(b, "all_to_all_single", "out", dtype),
            inputs[me].shape()
        );
        let x = b.upload(&inputs[me]).map_err(|e| fail(&w, format!("upload: {e}")))?;
        let got = b
            .all_to_all_single(&x, Some(&out_splits), None)
            .and_then(|wk| wk.into_value(ctx.timeout))
            .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        let coll = Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![Some(out_splits.clone()); ws] };
        expect_oracle(b, &coll, &inputs, &got, &w)
    })
}
