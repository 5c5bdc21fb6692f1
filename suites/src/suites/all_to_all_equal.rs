//! Equal-split all_to_all (`None` splits) on multi-dimensional tensors: dim 0 is cut in
//! `world_size` equal blocks of whole rows, so a backend that splits elements instead of rows,
//! or drops the trailing dims, gets it wrong. Shapes `[2ws, 3]`, `[ws, 4, 5]`, `[3ws, 1, 2, 2]`
//! and the empty `[0, 3]`; f32, bf16 and i64; world sizes 2, 3 and 4; checked with the oracle.

use super::util::{expect_oracle, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta};
use concord_core::{Backend, DType, OpKind};
use concord_fixtures::InputKind;
use concord_oracle::Collective;

/// The shapes at world size `ws` (every dim 0 a multiple of `ws`).
pub fn shapes(ws: usize) -> Vec<Vec<usize>> {
    vec![vec![2 * ws, 3], vec![ws, 4, 5], vec![3 * ws, 1, 2, 2], vec![0, 3]]
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        for ws in [2, 3, 4] {
            let name = format!("all_to_all_equal::{dtype}::ws{ws}");
            let meta = CaseMeta {
                suite: "all_to_all_equal".into(),
                op: OpKind::AllToAllSingle.name().into(),
                variant: "out".into(),
                dtype: dtype.name().into(),
                reduce: String::new(),
            };
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
    out
}
