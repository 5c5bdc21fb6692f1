//! Subgroups: the core ops, the rooted and point-to-point ops ([`MORE_OPS`]), and every reduce op
//! defined for f32 / i32 ([`reduce_op_specs`]: `avg` divides by the GROUP size), on communicators over a subset of ranks, created with
//! `Backend::new_group` by every rank of the world. Layouts: reversed (all ranks, reverse order),
//! halves (two disjoint groups running at once), odd/even (two interleaved groups), and a partial
//! group (ranks {0, ws-1}; the others sit out and must not be involved). Also: the rooted ops at
//! EVERY root of a `shuffled` group (world ranks `[ws-2, ws-1, 1]`: not contiguous, not sorted,
//! not starting at 0; [`shuffled_cases`]), and two groups over the same ranks in two orders
//! ([`same_members_two_orders`]).

use super::WORLD_SIZES;
use crate::case::{Case, CaseEnd, CaseMeta};
use crate::values::{self, ValueSpec};
use concord_core::{Backend, DType, OpKind, ReduceOp, Variant};
use concord_fixtures::InputKind;

/// The groups of a layout at world size `ws` (every rank is in at most one group).
pub fn layout(name: &str, ws: usize) -> Vec<Vec<usize>> {
    match name {
        "reversed" => vec![(0..ws).rev().collect()],
        "halves" => {
            let h = ws / 2;
            vec![(0..h).collect(), (h..ws).collect()].into_iter().filter(|g: &Vec<usize>| !g.is_empty()).collect()
        }
        "odd_even" => {
            vec![(0..ws).step_by(2).collect(), (1..ws).step_by(2).collect()].into_iter().filter(|g: &Vec<usize>| !g.is_empty()).collect()
        }
        "partial" => {
            if ws == 1 {
                vec![vec![0]]
            } else {
                vec![vec![0, ws - 1]]
            }
        }
        // At ws >= 5: world ranks 0 and 2.. sit out, the group's order is neither the world's nor
        // sorted, and its middle rank is the world's last.
        "shuffled" => vec![vec![ws - 2, ws - 1, 1]],
        other => panic!("unknown subgroup layout {other}"),
    }
}

pub const LAYOUTS: [&str; 4] = ["reversed", "halves", "odd_even", "partial"];

const OPS: [(OpKind, Variant, Option<ReduceOp>); 7] = [
    (OpKind::AllReduce, Variant::Out, Some(ReduceOp::Sum)),
    (OpKind::AllReduce, Variant::InPlace, Some(ReduceOp::Max)),
    (OpKind::AllGatherIntoTensor, Variant::Out, None),
    (OpKind::ReduceScatterTensor, Variant::Out, Some(ReduceOp::Sum)),
    (OpKind::AllToAllSingle, Variant::Out, None),
    (OpKind::Broadcast, Variant::Out, None),
    (OpKind::Barrier, Variant::Out, None),
];

/// The rooted and point-to-point ops (and in-place broadcast) in the subgroup layouts: group
/// rank order is not world rank order in `reversed`, so a backend that places gathered chunks,
/// scatters chunks, picks roots or addresses peers by WORLD rank fails there. f32, world sizes 4
/// and 5; roots are the group's last rank, permute the group's rotation.
pub const MORE_OPS: [(OpKind, Variant, Option<ReduceOp>); 6] = [
    (OpKind::Gather, Variant::Out, None),
    (OpKind::Scatter, Variant::Out, None),
    (OpKind::Reduce, Variant::Out, Some(ReduceOp::Sum)),
    (OpKind::PermuteTensor, Variant::Out, None),
    (OpKind::SendRecv, Variant::OutBuf, None),
    (OpKind::Broadcast, Variant::InPlace, None),
];

/// Every reduce op defined for the dtype, in the subgroup layouts: all_reduce with each, and
/// reduce_scatter / reduce / the in-place all_reduce_ with `avg` (whose divisor is the GROUP
/// size, not the world's), and reduce_scatter with `premul_sum` (floats).
/// f32 and i32, world sizes 4 and 5 (the f32 all_reduce `sum` case is in [`OPS`] already).
pub fn reduce_op_specs() -> Vec<ValueSpec> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::I32] {
        for r in ReduceOp::ALL.into_iter().filter(|r| r.defined_for(dtype)) {
            if dtype == DType::F32 && r == ReduceOp::Sum {
                continue;
            }
            out.push(ValueSpec {
                op: OpKind::AllReduce,
                variant: Variant::Out,
                dtype,
                reduce: Some(r),
                kind: InputKind::Exact,
                max_shapes: Some(4),
            });
        }
        for (op, variant) in
            [(OpKind::ReduceScatterTensor, Variant::Out), (OpKind::Reduce, Variant::Out), (OpKind::AllReduce, Variant::InPlace)]
        {
            out.push(ValueSpec { op, variant, dtype, reduce: Some(ReduceOp::Avg), kind: InputKind::Exact, max_shapes: Some(4) });
        }
        // The pre-multiplied sum a sharded optimiser reduce-scatters gradients with on its group.
        if let Some(premul) = ReduceOp::ALL.into_iter().find(|r| matches!(r, ReduceOp::PremulSum(_)) && r.defined_for(dtype)) {
            out.push(ValueSpec {
                op: OpKind::ReduceScatterTensor,
                variant: Variant::Out,
                dtype,
                reduce: Some(premul),
                kind: InputKind::Exact,
                max_shapes: Some(4),
            });
        }
    }
    out
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for lay in LAYOUTS {
        for (op, variant, reduce) in OPS {
            for dtype in [DType::F32, DType::I64] {
                if op == OpKind::Barrier && dtype != DType::F32 {
                    continue;
                }
                for ws in WORLD_SIZES.into_iter().filter(|&w| w >= 2 && crate::case::wanted_world_size(w)) {
                    let spec = ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: Some(4) };
                    out.push(subgroup_case(lay, spec, ws));
                }
            }
        }
        for spec in reduce_op_specs() {
            for ws in [4, 5].into_iter().filter(|&w| crate::case::wanted_world_size(w)) {
                out.push(subgroup_case(lay, spec.clone(), ws));
            }
        }
        for (op, variant, reduce) in MORE_OPS {
            for ws in [4, 5].into_iter().filter(|&w| crate::case::wanted_world_size(w)) {
                let spec = ValueSpec { op, variant, dtype: DType::F32, reduce, kind: InputKind::Exact, max_shapes: Some(4) };
                out.push(subgroup_case(lay, spec, ws));
            }
        }
    }
    out.extend(shuffled_cases());
    out.push(same_members_two_orders());
    out
}

/// The rooted ops (reduce `sum` in f32 and i32, gather, scatter, broadcast and broadcast_ in
/// f32) in the `shuffled` layout at world size 5, each at every root of the group in turn
/// (`subgroup::shuffled::gather::out::f32::ws5`): the layouts above root at the group's last
/// rank, so a backend that mixes group and world ranks only for a root inside the group (a
/// chain or tree split at the root by world rank) passes there.
pub fn shuffled_cases<B: Backend>() -> Vec<Case<B>> {
    let specs = [
        (OpKind::Reduce, Variant::Out, DType::F32, Some(ReduceOp::Sum)),
        (OpKind::Reduce, Variant::Out, DType::I32, Some(ReduceOp::Sum)),
        (OpKind::Gather, Variant::Out, DType::F32, None),
        (OpKind::Scatter, Variant::Out, DType::F32, None),
        (OpKind::Broadcast, Variant::Out, DType::F32, None),
        (OpKind::Broadcast, Variant::InPlace, DType::F32, None),
    ];
    let roots: Vec<Option<usize>> = (0..layout("shuffled", 5)[0].len()).map(Some).collect();
    specs
        .into_iter()
        .map(|(op, variant, dtype, reduce)| {
            let spec = ValueSpec { op, variant, dtype, reduce, kind: InputKind::Exact, max_shapes: Some(4) };
            subgroup_case_at("shuffled", spec, 5, roots.clone())
        })
        .collect()
}

/// Two groups over the same world ranks in two orders (`[ws-1, 1]` then `[1, ws-1]`, world size
/// 3): each is a communicator of its own, whose rank order is its list's; an all_gather on each
/// shows the order (`subgroup::same_members_two_orders::ws3`).
pub fn same_members_two_orders<B: Backend>() -> Case<B> {
    let spec = ValueSpec {
        op: OpKind::AllGatherIntoTensor,
        variant: Variant::Out,
        dtype: DType::F32,
        reduce: None,
        kind: InputKind::Exact,
        max_shapes: Some(2),
    };
    let meta = CaseMeta { suite: "subgroup_same_members".into(), ..crate::suites::matrix::meta("subgroup", &spec) };
    let name = "subgroup::same_members_two_orders::ws3".to_string();
    let seed = concord_fixtures::seed_for(&name);
    Case::<B>::new(name, meta, 3, move |ctx| {
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let (me, ws, timeout) = (ctx.rank(), ctx.world_size(), ctx.timeout);
        let wname = crate::case::backend_label(ctx.b);
        for g in [vec![ws - 1, 1], vec![1, ws - 1]] {
            let Some(sub) = ctx.group(&g)? else { continue };
            let want_rank = g.iter().position(|&r| r == me).expect("member");
            if sub.rank() != want_rank || sub.world_size() != g.len() {
                return Err(CaseEnd::Fail(format!(
                    "backend={wname} op=new_group variant=- dtype=- world_size={ws} rank={me}: group {g:?} (the same ranks as another group, in another order) gave rank {} of {}, expected rank {want_rank} of {}",
                    sub.rank(),
                    sub.world_size(),
                    g.len()
                )));
            }
            let label = format!("(group {g:?}, made beside a group of the same ranks in the other order)");
            values::run(sub, &spec, group_seed(seed, &g), timeout, &label)?;
        }
        Ok(())
    })
}

/// The seed of group `g`'s inputs in a case seeded `seed`: the group's first world rank mixed
/// in, so disjoint groups of one size (halves, odd / even, singletons, one set of ranks in two
/// orders) get different inputs. Inputs depend only on (seed, group rank, group size): with one
/// seed, a backend that answered one group's collective with another's result would pass.
pub fn group_seed(seed: u64, g: &[usize]) -> u64 {
    let first = g.first().map_or(0, |&r| r as u64 + 1);
    seed ^ first.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The value case for `spec` in layout `lay` at world size `ws`.
pub fn subgroup_case<B: Backend>(lay: &'static str, spec: ValueSpec, ws: usize) -> Case<B> {
    subgroup_case_at(lay, spec, ws, vec![None])
}

/// [`subgroup_case`] at each of `roots` in turn (`None`: the group's last rank).
pub fn subgroup_case_at<B: Backend>(lay: &'static str, spec: ValueSpec, ws: usize, roots: Vec<Option<usize>>) -> Case<B> {
    let name = format!("subgroup::{lay}::{}", crate::suites::matrix::case_name(&spec, ws));
    let meta = CaseMeta { suite: format!("subgroup_{lay}"), ..crate::suites::matrix::meta("subgroup", &spec) };
    let seed = concord_fixtures::seed_for(&name);
    Case::<B>::new(name, meta, ws, move |ctx| {
        let caps = ctx.b.capabilities();
        if !caps.subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let groups = layout(lay, ctx.world_size());
        let me = ctx.rank();
        let mut mine = None;
        // Every rank creates every group, in the same order (new_group is collective).
        for g in &groups {
            let handle = ctx.group(g)?;
            let is_member = g.contains(&me);
            match (handle, is_member) {
                (Some(_), true) => mine = Some(g.clone()),
                (None, false) => {}
                (Some(_), false) => {
                    return Err(CaseEnd::Fail(format!(
                        "{}: new_group({g:?}) returned a communicator to a non-member",
                        crate::case::axes(&crate::case::backend_label(ctx.b), "new_group", "-", "-", ctx.world_size(), me)
                    )))
                }
                (None, true) => {
                    return Err(CaseEnd::Fail(format!(
                        "{}: new_group({g:?}) returned nothing to a member",
                        crate::case::axes(&crate::case::backend_label(ctx.b), "new_group", "-", "-", ctx.world_size(), me)
                    )))
                }
            }
        }
        let Some(g) = mine else { return Ok(()) };
        let (wname, world_ws, timeout) = (crate::case::backend_label(ctx.b), ctx.world_size(), ctx.timeout);
        let sub = ctx.group(&g)?.expect("member");
        let want_rank = g.iter().position(|&r| r == me).expect("member");
        if sub.rank() != want_rank || sub.world_size() != g.len() {
            return Err(CaseEnd::Fail(format!(
                "backend={wname} op=new_group variant=- dtype=- world_size={world_ws} rank={me}: group {g:?} gave rank {} of {}, expected rank {want_rank} of {}",
                sub.rank(),
                sub.world_size(),
                g.len()
            )));
        }
        // `rank=` and `world_size=` in the message are the group's: `case::axes` says so, with the world's.
        let label = format!("(group {lay}{g:?})");
        let seed = group_seed(seed, &g);
        for &root in &roots {
            let Some(r) = root else {
                values::run(sub, &spec, seed, timeout, &label)?;
                continue;
            };
            let extra = values::Extra { root: Some(r), ..values::Extra::default() };
            let label = format!("{label} root={r} (group rank; world rank {})", g[r]);
            values::run_extra(sub, &spec, seed.wrapping_add(r as u64), timeout, &label, &extra)?;
        }
        Ok(())
    })
}
