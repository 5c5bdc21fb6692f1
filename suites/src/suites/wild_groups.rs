//! Cases written for shipped bugs of communicator splitting, subgroups and point-to-point (the
//! twenty-first hunt, `concord_mutants::bugs_hunt21`), where the rest of the catalogue let the
//! bug through.
//!
//! * `wild_groups::nested::{ws2,ws4}` — a group made *from a subgroup* (`new_group` called on a
//!   communicator that `new_group` returned): its `ranks` are ranks of that parent, not of the
//!   world. Every other case splits the world only, where the two rank spaces coincide, so a
//!   backend that reads a subgroup's split list in world ranks passed them all (pytorch/pytorch
//!   PR #153798: `new_subgroups(group=)` compared a group rank with lists of global ranks). Each
//!   case checks who is a member and at which rank, then an all_gather of every member's world
//!   rank (the members in the nested group's order) and one message on the nested group.
//!   ws4: world → `[3, 1, 2]` → parent ranks `[2, 0]` = world `[2, 3]`; ws2: world → `[1, 0]` →
//!   parent rank `[1]` = world `[0]`.

use super::util::{expect_eq, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, Tensor, Variant};

fn meta() -> CaseMeta {
    CaseMeta { suite: "wild_groups".into(), op: "new_group".into(), variant: "out".into(), dtype: "f32".into(), reduce: "-".into() }
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    vec![
        Case::<B>::new("wild_groups::nested::ws4", meta(), 4, |ctx| nested(ctx, &[3, 1, 2], &[2, 0])),
        Case::<B>::new("wild_groups::nested::ws2", meta(), 2, |ctx| nested(ctx, &[1, 0], &[1])),
    ]
}

/// World → `outer` (world ranks) → `inner` (ranks of `outer`): membership, ranks, an all_gather
/// of world ranks and, with two or more members, a message from the nested group's last rank to
/// its rank 0.
fn nested<B: Backend>(ctx: &mut Ctx<'_, B>, outer: &[usize], inner: &[usize]) -> CaseResult {
    let b = ctx.b;
    let caps = b.capabilities();
    if !caps.subgroups {
        return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    // The nested group's all_gather (f32) is the check; its message needs send / recv, passed
    // over when the backend declares that gap.
    let gather = caps.check(OpKind::AllGatherIntoTensor, Some(Variant::Out), Some(DType::F32), None, inner.len());
    if let Err(why) = gather {
        return Err(CaseEnd::Unsupported(why));
    }
    let message = caps.check(OpKind::SendRecv, Some(Variant::OutBuf), Some(DType::F32), None, inner.len()).is_ok();
    let me = b.rank();
    let world: Vec<usize> = inner.iter().map(|&r| outer[r]).collect();
    let w0 = format!(
        "{} outer group {outer:?}, nested new_group({inner:?}) on it (world ranks {world:?})",
        here(b, "new_group", "out", DType::F32)
    );
    let named = |w: &str, what: &str, e: concord_core::CollectiveError| fail(w, format!("{what}: {e} [{}]", e.name()));
    let g = b.new_group(outer).map_err(|e| named(&w0, "outer new_group", e))?;
    let Some(g) = g else {
        if outer.contains(&me) {
            return Err(fail(&w0, "the outer new_group returned nothing to a member"));
        }
        return Ok(());
    };
    let h = g.new_group(inner).map_err(|e| named(&w0, &format!("nested new_group (this rank is outer rank {})", g.rank()), e))?;
    let want = world.iter().position(|&r| r == me);
    let h = match (h, want) {
        (None, None) => return Ok(()),
        (Some(h), Some(pos)) if h.rank() == pos && h.world_size() == world.len() => h,
        (Some(h), _) => {
            return Err(fail(
                &w0,
                format!(
                    "nested group gave rank {} of {}, expected {}",
                    h.rank(),
                    h.world_size(),
                    match want {
                        Some(p) => format!("rank {p} of {}", world.len()),
                        None => "no communicator (not a member)".into(),
                    }
                ),
            ))
        }
        (None, Some(pos)) => return Err(fail(&w0, format!("nested group returned nothing, expected rank {pos} of {}", world.len()))),
    };
    let w = format!("{} (nested group {inner:?} of outer {outer:?})", here(&h, "all_gather_into_tensor", "out", DType::F32));
    let x = h.upload(&Tensor::from_f64(DType::F32, &[1], &[me as f64])).map_err(|e| named(&w, "upload", e))?;
    let got = h.all_gather_into_tensor(&x).and_then(|wk| wk.into_value(ctx.timeout)).map_err(|e| named(&w, "all_gather", e))?;
    let expected = Tensor::from_f64(DType::F32, &[world.len()], &world.iter().map(|&r| r as f64).collect::<Vec<_>>());
    expect_eq(&h, &got, &expected, &format!("{w}: the members' world ranks in nested-group order"))?;
    if world.len() < 2 || !message {
        return Ok(());
    }
    let last = world.len() - 1;
    let w = format!(
        "{} (nested group {inner:?} of outer {outer:?}, group rank {last} sends to group rank 0)",
        here(&h, "send_recv", "outbuf", DType::F32)
    );
    if h.rank() == last {
        let x = h.upload(&Tensor::from_f64(DType::F32, &[2], &[me as f64, 100.0 + me as f64])).map_err(|e| named(&w, "upload", e))?;
        h.send(&x, 0).and_then(|s| s.wait(ctx.timeout).map(|_| ())).map_err(|e| named(&w, "send", e))?;
    } else if h.rank() == 0 {
        let out = h.alloc(DType::F32, &[2]).map_err(|e| named(&w, "alloc", e))?;
        let got = h.recv(&out, last).and_then(|r| r.into_value(ctx.timeout)).map_err(|e| named(&w, "recv", e))?;
        let src = world[last] as f64;
        expect_eq(&h, &got, &Tensor::from_f64(DType::F32, &[2], &[src, 100.0 + src]), &format!("{w}: the message from group rank {last}"))?;
    }
    Ok(())
}
