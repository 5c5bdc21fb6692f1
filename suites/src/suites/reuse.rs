//! Buffer reuse: one persistent buffer across 100 iterations with new contents each time, 300
//! ops on one communicator interleaved with a group's,
//! late-write detection (after wait, nothing may still write the result: also a recv's `out`
//! and an `_out` op's output), results of same-shaped
//! out-of-place calls kept at once (none overwrites another; also with the calls in flight
//! together; the coalesced ops with a list of one and the rooted ops too), and a world's and a group's call in flight together), and input/output aliasing (rejected with a named error, or correct, as the backend
//! declares).
//! Guard bytes around every `_out` buffer and untouched inputs are checked by the matrix itself.

use super::util::{expect_eq, expect_oracle, fail, full, here, ArVehicle};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use crate::values::partner;
use concord_core::{AliasPolicy, Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_fixtures::InputKind;
use std::time::Duration;

/// The call a reuse case makes: `op`, `variant`, f32, and `sum` where the op reduces (the
/// reduce op `exec::call` and these cases use), so the runner's gate reads the whole call.
fn meta(op: &str, variant: &str) -> CaseMeta {
    let reduce = if OpKind::from_name(op).is_some_and(|o| o.reduces()) { "sum" } else { "" };
    CaseMeta { suite: "reuse".into(), op: op.into(), variant: variant.into(), dtype: "f32".into(), reduce: reduce.into() }
}

const LATE_PATTERN: u8 = 0x5A;

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    for ws in [2, 4] {
        v.push(Case::<B>::new(
            format!("reuse::persistent_buffer_100_iterations::inplace::ws{ws}"),
            meta("all_reduce", "inplace"),
            ws,
            |ctx| {
                let b = ctx.b;
                let ws = b.world_size();
                let w = here(b, "all_reduce_", "inplace", DType::F32);
                let n = 257;
                let buf = b.alloc(DType::F32, &[n])?;
                for it in 0..100 {
                    let mine: Vec<f32> = (0..n).map(|i| ((i + it) % 11) as f32 + b.rank() as f32).collect();
                    b.write(&buf, &Tensor::from_vec(&[n], mine))?;
                    let out = b.all_reduce_(&buf, ReduceOp::Sum)?.into_value(ctx.timeout)?;
                    if b.buffer_addr(&out) != b.buffer_addr(&buf) {
                        return Err(fail(&w, format!("iteration {it}: in-place op returned a different buffer")));
                    }
                    let exp: Vec<f32> = (0..n).map(|i| (0..ws).map(|r| ((i + it) % 11) as f32 + r as f32).sum()).collect();
                    expect_eq(b, &buf, &Tensor::from_vec(&[n], exp), &format!("{w} iteration {it}"))?;
                }
                Ok(())
            },
        ));
        v.push(Case::<B>::new(
            format!("reuse::persistent_input_100_iterations::out::ws{ws}"),
            meta("all_gather_into_tensor", "out"),
            ws,
            |ctx| {
                let b = ctx.b;
                let ws = b.world_size();
                let w = here(b, "all_gather_into_tensor", "out", DType::F32);
                let n = 33;
                let buf = b.alloc(DType::F32, &[n])?;
                for it in 0..100 {
                    let of = |r: usize| Tensor::from_vec(&[n], (0..n).map(|i| (i * 7 + it * 13 + r * 1000) as f32).collect());
                    b.write(&buf, &of(b.rank()))?;
                    let out = b.all_gather_into_tensor(&buf)?.into_value(ctx.timeout)?;
                    let parts: Vec<Tensor> = (0..ws).map(of).collect();
                    expect_eq(b, &out, &Tensor::cat_rows(DType::F32, &[], &parts), &format!("{w} iteration {it}"))?;
                }
                Ok(())
            },
        ));
    }
    for (op, variant) in [
        (OpKind::AllReduce, Variant::Out),
        (OpKind::AllReduce, Variant::InPlace),
        (OpKind::AllGatherIntoTensor, Variant::Out),
        (OpKind::ReduceScatterTensor, Variant::Out),
        (OpKind::AllToAllSingle, Variant::Out),
        (OpKind::Broadcast, Variant::InPlace),
        // The caller's own output buffers: a receive (every other recv check reads `out` right
        // after wait, so a message written again later passed) and the `_out` ops.
        (OpKind::SendRecv, Variant::OutBuf),
        (OpKind::AllGatherIntoTensor, Variant::OutBuf),
        (OpKind::ReduceScatterTensor, Variant::OutBuf),
    ] {
        let name = format!("reuse::no_late_write::{}::{}::ws2", op.name(), variant.name());
        v.push(Case::<B>::new(name, meta(op.name(), variant.name()), 2, move |ctx| late_write(ctx, op, variant)));
    }
    for (op, variant) in [
        (OpKind::AllReduce, Variant::Out),
        (OpKind::AllGatherIntoTensor, Variant::Out),
        (OpKind::ReduceScatterTensor, Variant::Out),
        (OpKind::AllToAllSingle, Variant::Out),
        (OpKind::Broadcast, Variant::Out),
        (OpKind::PermuteTensor, Variant::Out),
        // A list of one tensor: a fusion buffer per shape list is reused the same way.
        (OpKind::AllReduce, Variant::Coalesced),
        (OpKind::AllGatherIntoTensor, Variant::Coalesced),
        (OpKind::ReduceScatterTensor, Variant::Coalesced),
        // Rooted at the last rank: a kept receive buffer on the root.
        (OpKind::Reduce, Variant::Out),
        (OpKind::Gather, Variant::Out),
        (OpKind::Scatter, Variant::Out),
    ] {
        let m = meta(op.name(), variant.name());
        v.push(Case::<B>::new(format!("reuse::outputs_kept::{}::{variant}::ws2", op.name()), m.clone(), 2, move |ctx| {
            outputs_kept(ctx, op, variant, false)
        }));
        v.push(Case::<B>::new(format!("reuse::outputs_in_flight::{}::{variant}::ws2", op.name()), m, 2, move |ctx| {
            outputs_kept(ctx, op, variant, true)
        }));
    }
    v.push(Case::<B>::new("reuse::aliasing::all_gather_out_contains_input::ws2", meta("all_gather_into_tensor", "outbuf"), 2, |ctx| {
        aliasing(ctx, "all_gather_into_tensor", false)
    }));
    v.push(Case::<B>::new("reuse::aliasing::reduce_scatter_out_inside_input::ws2", meta("reduce_scatter_tensor", "outbuf"), 2, |ctx| {
        aliasing(ctx, "reduce_scatter_tensor", false)
    }));
    v.push(Case::<B>::new(
        "reuse::aliasing::all_gather_out_overlaps_input_misaligned::ws2",
        meta("all_gather_into_tensor", "outbuf"),
        2,
        |ctx| aliasing(ctx, "all_gather_into_tensor", true),
    ));
    // At 4 ranks a broadcast tree has a relay that is not the root (virtual rank 1, with child 3)
    // and a ring or chain forwards through every rank: what a relay forwards leaves its result.
    for ws in [2, 4] {
        let name = format!("reuse::inputs_rewritten_after_wait::ws{ws}");
        v.push(Case::<B>::new(name, meta("mixed", "mixed"), ws, inputs_rewritten_after_wait));
    }
    // Its all_reduces only carry the check (a sequence number that wraps): any reduce op will do.
    let many = CaseMeta { reduce: "sum,max,min".into(), ..meta("all_reduce", "out") };
    v.push(Case::<B>::new("reuse::ops_300_world_and_group::ws3", many, 3, many_ops));
    for (op, variant) in [(OpKind::AllReduce, Variant::Out), (OpKind::AllGatherIntoTensor, Variant::Out)] {
        let name = format!("reuse::world_and_group_in_flight::{}::{variant}::ws3", op.name());
        v.push(Case::<B>::new(name, meta(op.name(), variant.name()), 3, move |ctx| world_and_group_in_flight(ctx, op, variant)));
    }
    v.push(
        Case::<B>::new("reuse::world_and_group_crossed::all_reduce::out::ws3", meta("all_reduce", "out"), 3, world_and_group_crossed)
            .stall_bound(),
    );
    v
}

/// How long rank 0 of `world_and_group_crossed` holds its world op back behind its group op
/// (which cannot complete yet: its peer issues it later): time for the group op to start moving.
const GROUP_HEAD_START: Duration = Duration::from_millis(1000);

/// `reuse::world_and_group_crossed::all_reduce::out::ws3`: the two communicators' ops in opposite
/// orders on the two ranks they share, in a legal program: world rank 2 runs the world's
/// all_reduce and only then the group's (`[2, 0]`); world rank 0 issues the group's first, lets
/// it start ([`GROUP_HEAD_START`]; its wait MUST end in a timeout, or `Ok` — never a failure:
/// rank 2 has not issued it yet), then issues the world's, waits the world's, then the group's.
/// A backend whose subgroup runs its internal traffic on the world's channel (p2pcoll's
/// `groups_share_world_channel`) has rank 0's group messages meet rank 2's world messages on
/// that channel: the crossing no longer depends on how two progress threads interleave
/// (`world_and_group_in_flight` issues both ops on both ranks, whose threads decide).
fn world_and_group_crossed<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    if !ctx.b.capabilities().subgroups {
        return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    super::util::communicators_in_any_order(ctx.b)?;
    let (ws, me, timeout) = (ctx.world_size(), ctx.rank(), ctx.timeout);
    let (op, variant) = (OpKind::AllReduce, Variant::Out);
    let members = [2, 0];
    let b = ctx.b;
    let sub = ctx.group(&members)?;
    let p = Params { reduce: Some(ReduceOp::Sum), ..Default::default() };
    let seed = concord_fixtures::seed_for("reuse::world_and_group_crossed");
    // Different shapes on the two communicators: a message of one taken for the other is wrong.
    let shapes = [[4 * ws, 3], [2 * ws, 5]];
    let w_in = concord_fixtures::inputs(seed, ws, DType::F32, &shapes[0], p.reduce, InputKind::Exact);
    let x = b.upload(&w_in[me])?;
    let g_in = sub.map(|g| concord_fixtures::inputs(seed + 1, g.world_size(), DType::F32, &shapes[1], p.reduce, InputKind::Exact));
    let w = format!(
        "{} group={members:?} (world rank 2: world op, then group op; world rank 0: group op issued first, {GROUP_HEAD_START:?} later \
         the world op, waited world first)",
        here(b, op.name(), &variant.to_string(), DType::F32)
    );
    let named = |what: &'static str| super::util::step_failed(&w, what);
    let issue =
        |c: &B, x: &B::Buffer, what: &'static str| exec::issue(c, op, variant, std::slice::from_ref(x), None, &p).map_err(named(what));
    let gx = match (sub, &g_in) {
        (Some(g), Some(ins)) => Some((g, g.upload(&ins[g.rank()])?)),
        _ => None,
    };
    let (w_out, g_out) = match (me, gx) {
        (0, Some((g, gx))) => {
            let gp = issue(g, &gx, "group issue")?;
            match gp.wait(GROUP_HEAD_START) {
                Ok(()) => {}
                Err(e) if e.name() == "timeout" => {}
                Err(e) => {
                    return Err(fail(
                        &w,
                        format!(
                            "the group op's first wait ({GROUP_HEAD_START:?}) failed while its peer (world rank 2) had not issued it yet \
                             (that rank runs the world op first): {e} [{}] (a message of the world's op taken for the group's?)",
                            e.name()
                        ),
                    ))
                }
            }
            let wp = issue(b, &x, "world issue")?;
            let w_out = wp.into_values(timeout).map_err(named("world wait"))?;
            (w_out, Some((g, gp.into_values(timeout).map_err(named("group wait"))?)))
        }
        (_, gx) => {
            let w_out = issue(b, &x, "world issue")?.into_values(timeout).map_err(named("world wait"))?;
            let g_out = match gx {
                Some((g, gx)) => Some((g, issue(g, &gx, "group issue")?.into_values(timeout).map_err(named("group wait"))?)),
                None => None,
            };
            (w_out, g_out)
        }
    };
    let coll = exec::collective(op, &p, ws).ok_or_else(|| fail(&w, "suite bug: no data moved".to_string()))?;
    expect_oracle(b, &coll, &w_in, &w_out[0], &format!("{w} world result shape={:?}", shapes[0]))?;
    if let (Some(ins), Some((g, out))) = (&g_in, g_out) {
        let coll = exec::collective(op, &p, g.world_size()).ok_or_else(|| fail(&w, "suite bug: no data moved".to_string()))?;
        let gw = format!("{} (group {members:?}, world rank {me})", here(g, op.name(), &variant.to_string(), DType::F32));
        expect_oracle(g, &coll, ins, &out[0], &format!("{gw} group result shape={:?}", shapes[1]))?;
    }
    Ok(())
}

/// An op on the world and the same op on a group (world ranks `[2, 0]`; rank 1 is in the world
/// only) in flight together on the ranks in both: issued world first then group first, each time
/// waited in the other order, then both results checked (against the oracle); then once more,
/// world first, with one shape on both communicators. State kept per
/// process instead of per communicator (one staging buffer, one output slot) has the two
/// communicators' ops overwrite each other; every case before runs one communicator's op at a time.
fn world_and_group_in_flight<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant) -> CaseResult {
    if !ctx.b.capabilities().subgroups {
        return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    let (ws, me, timeout) = (ctx.world_size(), ctx.rank(), ctx.timeout);
    let members = [2, 0];
    let b = ctx.b;
    let sub = ctx.group(&members)?;
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    let p = Params { reduce, ..Default::default() };
    let seed = concord_fixtures::seed_for(&format!("reuse::world_and_group_in_flight::{op}"));
    // Different shapes on the two communicators (a shared buffer sized for one is wrong for
    // both), then one shape on both (a per-process workspace keyed by dtype and size is shared
    // by the two calls: [clause: placement.reuse]).
    let different = [[4 * ws, 3], [2 * ws, 5]];
    let same = [[6, 5], [6, 5]];
    for (round, (world_first, shapes)) in [(true, different), (false, different), (true, same)].into_iter().enumerate() {
        let w_in = concord_fixtures::inputs(seed + 2 * round as u64, ws, DType::F32, &shapes[0], reduce, InputKind::Exact);
        let x = b.upload(&w_in[me])?;
        let g_in = sub.map(|g| {
            concord_fixtures::inputs(seed + 2 * round as u64 + 1, g.world_size(), DType::F32, &shapes[1], reduce, InputKind::Exact)
        });
        let gx = match (sub, &g_in) {
            (Some(g), Some(ins)) => Some(g.upload(&ins[g.rank()])?),
            _ => None,
        };
        let order = if world_first { "world op issued first, group op second" } else { "group op issued first, world op second" };
        let w = format!("{} group={members:?} {order}", here(b, op.name(), &variant.to_string(), DType::F32));
        let issue_group = || -> Result<Option<exec::Pending<B>>, CaseEnd> {
            match (sub, &gx) {
                (Some(g), Some(gx)) => Ok(Some(
                    exec::issue(g, op, variant, std::slice::from_ref(gx), None, &p)
                        .map_err(|e| fail(&w, format!("group issue: {e} [{}]", e.name())))?,
                )),
                _ => Ok(None),
            }
        };
        let (world, group) = if world_first {
            let wp = exec::issue(b, op, variant, std::slice::from_ref(&x), None, &p)
                .map_err(|e| fail(&w, format!("world issue: {e} [{}]", e.name())))?;
            (wp, issue_group()?)
        } else {
            let gp = issue_group()?;
            (
                exec::issue(b, op, variant, std::slice::from_ref(&x), None, &p)
                    .map_err(|e| fail(&w, format!("world issue: {e} [{}]", e.name())))?,
                gp,
            )
        };
        // Waited in the other order than issued.
        let (w_out, g_out) = if world_first {
            let g_out =
                group.map(|g| g.into_values(timeout)).transpose().map_err(|e| fail(&w, format!("group wait: {e} [{}]", e.name())))?;
            (world.into_values(timeout).map_err(|e| fail(&w, format!("world wait: {e} [{}]", e.name())))?, g_out)
        } else {
            let w_out = world.into_values(timeout).map_err(|e| fail(&w, format!("world wait: {e} [{}]", e.name())))?;
            (w_out, group.map(|g| g.into_values(timeout)).transpose().map_err(|e| fail(&w, format!("group wait: {e} [{}]", e.name())))?)
        };
        let coll = exec::collective(op, &p, ws).ok_or_else(|| fail(&w, "suite bug: no data moved".to_string()))?;
        expect_oracle(b, &coll, &w_in, &w_out[0], &format!("{w} world result shape={:?}", shapes[0]))?;
        if let (Some(g), Some(ins), Some(out)) = (sub, &g_in, g_out) {
            let coll = exec::collective(op, &p, g.world_size()).ok_or_else(|| fail(&w, "suite bug: no data moved".to_string()))?;
            let gw = format!("{} (group {members:?}, world rank {me}) {order}", here(g, op.name(), &variant.to_string(), DType::F32));
            expect_oracle(g, &coll, ins, &out[0], &format!("{gw} group result shape={:?}", shapes[1]))?;
        }
    }
    Ok(())
}

/// The data-moving (op, variant)s whose peers read this rank's input: after a successful wait
/// the caller writes its input again at once (the next step's parameters) and no peer may still
/// read it ([clause: placement.reuse]).
const REWRITTEN: [(OpKind, Variant); 10] = [
    (OpKind::Broadcast, Variant::Out),
    (OpKind::Broadcast, Variant::InPlace),
    (OpKind::Scatter, Variant::Out),
    (OpKind::PermuteTensor, Variant::Out),
    (OpKind::AllToAllSingle, Variant::Out),
    (OpKind::AllGatherIntoTensor, Variant::Out),
    (OpKind::AllGatherIntoTensor, Variant::OutBuf),
    (OpKind::ReduceScatterTensor, Variant::Out),
    (OpKind::ReduceScatterTensor, Variant::OutBuf),
    (OpKind::Reduce, Variant::Out),
];

/// Each of [`REWRITTEN`] on rank-dependent inputs of 64 Ki elements (root rank 0): right after
/// its wait each rank overwrites its input, then keeps a copy of its result and overwrites the
/// result too (each first the last element, through a one-element view: a front-to-back reader
/// reaches it last; then the whole buffer), then one barrier, then every rank checks the copy
/// against the oracle's answer for the inputs as they were at issue. The input comes first so
/// that nothing (the copy) widens the window a peer still reading it has; the in-place root,
/// whose result is its input, overwrites it at once and checks nothing. A backend whose op completes on a rank before its
/// peers are done reading that rank's input (no closing handshake) has a peer receive the new
/// bytes; so does one where a relay (a tree's inner node, a ring's or chain's next hop) forwards
/// from its result buffer after its own op completed (xiaoyeli/superlu_dist PR #117: a tree
/// broadcast's forwarding `MPI_Isend` only tested before return), which only a world of 4 ranks
/// or more has for a binary tree.
fn inputs_rewritten_after_wait<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    for (op, variant) in REWRITTEN {
        let reduce = op.reduces().then_some(ReduceOp::Sum);
        // A broadcast's peers all read one buffer (the root's): 4 MiB keeps them reading for
        // about a millisecond, longer than a root that returns early takes to rewrite it.
        let n = if op == OpKind::Broadcast { 1 << 20 } else { 1 << 16 };
        if caps.check(op, Some(variant), Some(DType::F32), reduce, ws).is_err() {
            continue;
        }
        let p = Params { reduce, root: 0, src_dst: (0..ws).map(|r| (r + 1) % ws).collect(), ..Default::default() };
        let w = format!("{} root=0 n={n} input rewritten right after wait", here(b, op.name(), variant.name(), DType::F32));
        let coll = exec::collective(op, &p, ws).ok_or_else(|| fail(&w, "suite bug: no data moved"))?;
        let seed = concord_fixtures::seed_for(&format!("reuse::inputs_rewritten_after_wait::{op}::{variant}"));
        let inputs = concord_fixtures::inputs(seed, ws, DType::F32, &[n], reduce, InputKind::Exact);
        let x = b.upload(&inputs[me])?;
        let out = match (op, variant) {
            (OpKind::AllGatherIntoTensor, Variant::OutBuf) => Some(b.alloc(DType::F32, &[n * ws])?),
            (OpKind::ReduceScatterTensor, Variant::OutBuf) => Some(b.alloc(DType::F32, &[n / ws])?),
            _ => None,
        };
        let got = exec::call(b, op, variant, std::slice::from_ref(&x), out.as_ref(), &p, ctx.timeout)
            .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?
            .remove(0);
        let rewrite = |buf: &B::Buffer| -> concord_core::Result<()> {
            let len = b.buffer_shape(buf).iter().product::<usize>();
            if len == 0 {
                return Ok(());
            }
            b.write(&b.view(buf, len - 1, &[1])?, &Tensor::filled_bytes(DType::F32, &[1], LATE_PATTERN))?;
            b.write(buf, &Tensor::filled_bytes(DType::F32, &[len], LATE_PATTERN))
        };
        // The input is rewritten first, before anything else runs on this rank: a peer still
        // reading it is caught by how soon the rewrite comes, so the copy of the result waits.
        // An in-place op's input is its result: the root (whose input the peers read) rewrites
        // it at once and checks nothing; every other rank copies its result first.
        let in_place = b.buffer_addr(&got) == b.buffer_addr(&x);
        let root_in_place = in_place && me == p.root;
        if !in_place || root_in_place {
            rewrite(&x)?;
        }
        let kept = if root_in_place { None } else { Some(b.download(&got)?) };
        if !root_in_place {
            rewrite(&got)?;
        }
        b.barrier().and_then(|wk| wk.wait(ctx.timeout).map(|_| ())).map_err(|e| fail(&w, format!("barrier: {e} [{}]", e.name())))?;
        // Uploaded again (expect_oracle reads a buffer) only now, out of the window.
        let Some(kept) = kept else { continue };
        let kept = b.upload(&kept)?;
        expect_oracle(
            b,
            &coll,
            &inputs,
            &kept,
            &format!("{w} (its copy taken at wait, checked after every rank rewrote its input and its result and a barrier)"),
        )?;
    }
    Ok(())
}

/// 300 rounds of an out-of-place `all_reduce` on the world then (where the backend declares
/// subgroups) an in-place one on the reversed group: a sequence number kept in a narrow integer
/// wraps within the case (at 256 calls of a communicator, whatever ran before it), and the
/// two communicators' ops interleave.
fn many_ops<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    const ROUNDS: usize = 300;
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let n = 5;
    let of = |it: usize, r: usize| -> Vec<f32> { (0..n).map(|i| ((i + 3 * it) % 17) as f32 + 100.0 * r as f32).collect() };
    let v = ArVehicle::pick(b, &[Variant::Out, Variant::InPlace])?;
    let sum = |it: usize, ranks: &mut dyn Iterator<Item = usize>| -> Tensor {
        let all: Vec<Vec<f32>> = ranks.map(|r| of(it, r)).collect();
        Tensor::from_vec(&[n], (0..n).map(|i| v.fold(all.iter().map(|x| x[i]))).collect())
    };
    let timeout = ctx.timeout;
    let group: Vec<usize> = (0..ws).rev().collect();
    let sub = if b.capabilities().subgroups { ctx.group(&group)? } else { None };
    let w = format!("{} reduce={}", here(b, "all_reduce", "out", DType::F32), v.op.name());
    let x = b.alloc(DType::F32, &[n])?;
    for it in 0..ROUNDS {
        b.write(&x, &Tensor::from_vec(&[n], of(it, me)))?;
        let out = b.all_reduce(&x, v.op)?.into_value(timeout)?;
        expect_eq(b, &out, &sum(it, &mut (0..ws)), &format!("{w} world call {it} of {ROUNDS}"))?;
        if let Some(g) = sub {
            // Group rank gr is world rank ws-1-gr; its input is the one of group rank gr.
            let gx = g.upload(&Tensor::from_vec(&[n], of(it, g.rank())))?;
            g.all_reduce_(&gx, v.op)?.into_value(timeout)?;
            let gw = here(g, "all_reduce_", "inplace", DType::F32);
            expect_eq(g, &gx, &sum(it, &mut (0..ws)), &format!("{gw} (reversed group, world rank {me}) group call {it} of {ROUNDS}"))?;
        }
    }
    Ok(())
}

/// Results of out-of-place ops are the caller's: [`KEPT`] ops of one shape and dtype, each
/// with other inputs, are issued and waited one after the other while the caller keeps every
/// result; then every result is checked (against the oracle) and every address must differ. A
/// backend that recycles one output per shape (a static output, an allocator that reuses it)
/// has the later calls overwrite the earlier results.
/// With `in_flight` (`reuse::outputs_in_flight::`), the [`KEPT`] calls are all issued before
/// any is waited, then waited in reverse order: a backend that buckets same-shaped calls in
/// flight together (and mixes up their results) fails there. There the caller also drops each
/// input right after its issue and uploads a same-shaped decoy with other values before any
/// wait: an op that does not keep its inputs alive (a raw pointer queued for later) sends the
/// decoy ([clause: placement.reuse]).
fn outputs_kept<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant, in_flight: bool) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let w = here(b, op.name(), &variant.to_string(), DType::F32);
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    let p = Params { reduce, root: ws - 1, src_dst: (0..ws).map(|r| (r + 1) % ws).collect(), ..Default::default() };
    let Some(coll) = exec::collective(op, &p, ws) else {
        return Err(fail(&w, format!("suite bug: {op} moves no data to keep")));
    };
    let shape = [4 * ws, 3];
    let seed = concord_fixtures::seed_for(&format!("reuse::outputs_kept::{op}"));
    let mut kept = Vec::new();
    if in_flight {
        let mut issued = Vec::new();
        for k in 0..KEPT {
            let inputs = concord_fixtures::inputs(seed + k as u64, ws, DType::F32, &shape, reduce, InputKind::Exact);
            let x = b.upload(&inputs[me])?;
            let work = exec::issue(b, op, variant, std::slice::from_ref(&x), None, &p)
                .map_err(|e| fail(&w, format!("issue of call {k}: {e} [{}]", e.name())))?;
            // The caller's handle to the input goes at once (a call on a temporary): the op
            // keeps what it was given. A same-shaped decoy with other values, uploaded before
            // any wait, would take the freed block of a backend that does not.
            drop(x);
            let decoy = b.upload(&Tensor::filled_bytes(DType::F32, &shape, LATE_PATTERN))?;
            issued.push((work, inputs, decoy));
        }
        let mut waited = Vec::new();
        for (k, (work, inputs, x)) in issued.into_iter().enumerate().rev() {
            let mut out = work.into_values(ctx.timeout).map_err(|e| fail(&w, format!("wait of call {k}: {e} [{}]", e.name())))?;
            waited.push((out.remove(0), inputs, x));
        }
        waited.reverse();
        kept = waited;
    } else {
        for k in 0..KEPT {
            let inputs = concord_fixtures::inputs(seed + k as u64, ws, DType::F32, &shape, reduce, InputKind::Exact);
            let x = b.upload(&inputs[me])?;
            let out = exec::call(b, op, variant, std::slice::from_ref(&x), None, &p, ctx.timeout)
                .map_err(|e| fail(&w, format!("call {k}: {e} [{}]", e.name())))?;
            kept.push((out[0].clone(), inputs, x));
        }
    }
    let how = if in_flight { "issued together, waited in reverse order" } else { "results kept" };
    // Only results the contract defines on this rank must be distinct (a reduce's or gather's
    // off the root is undefined: a backend may hand back one scratch buffer there), and an empty
    // result overlaps nothing, whatever its address ([clause: placement.empty_no_alias]).
    let sem = concord_oracle::Semantics::of(&b.capabilities());
    let defined = match kept.first() {
        Some((_, inputs, _)) => concord_oracle::expected(&coll, inputs, &sem).map(|e| e.defined[me]).unwrap_or(true),
        None => true,
    };
    let filled = |x: &B::Buffer| b.buffer_shape(x).iter().product::<usize>() > 0;
    for (k, (out, inputs, _)) in kept.iter().enumerate() {
        let addr = b.buffer_addr(out);
        if let Some(j) = kept[..k].iter().position(|(o, _, _)| defined && filled(out) && filled(o) && b.buffer_addr(o) == addr) {
            return Err(fail(
                &w,
                format!(
                    "call {k} of {KEPT} (same shape {shape:?}) returned the buffer of call {j} (0x{addr:x}), which the caller still holds"
                ),
            ));
        }
        expect_oracle(b, &coll, inputs, out, &format!("{w} shape={shape:?} call {k} of {KEPT}, checked after all {KEPT} ({how})"))?;
    }
    Ok(())
}

/// Same-shaped out-of-place calls whose results [`outputs_kept`] holds at once: more than a
/// pool of four outputs per shape (quadruple buffering) can serve without overwriting one.
const KEPT: usize = 5;

/// After wait, overwrite the result with a pattern, give the backend time, check nothing wrote it.
/// `_out` variants and recv (send / recv with the partner rank) get an output buffer of their
/// own, the buffer checked.
fn late_write<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let w = here(b, op.name(), variant.name(), DType::F32);
    let n = 1 << 16;
    let x = b.upload(&Tensor::from_vec(&[n * ws], (0..n * ws).map(|i| (i % 5) as f32).collect()))?;
    let p = Params { reduce: Some(ReduceOp::Sum), root: ws - 1, peer: partner(b.rank(), ws), ..Default::default() };
    let out_buf = match (op, variant) {
        (_, Variant::OutBuf) => {
            let numel = match op {
                OpKind::AllGatherIntoTensor => n * ws * ws,
                OpKind::ReduceScatterTensor => n,
                _ => n * ws,
            };
            Some(b.alloc(DType::F32, &[numel])?)
        }
        _ => None,
    };
    let out = exec::call(b, op, variant, std::slice::from_ref(&x), out_buf.as_ref(), &p, ctx.timeout)
        .map_err(|e| fail(&w, format!("root={} n={}: {e} [{}]", p.root, n * ws, e.name())))?
        .remove(0);
    let shape = b.buffer_shape(&out);
    let pattern = Tensor::filled_bytes(DType::F32, &shape, LATE_PATTERN);
    b.write(&out, &pattern)?;
    // Peers finish their side, then everyone gives a straggling write time to land.
    b.barrier().and_then(|wk| wk.wait(ctx.timeout).map(|_| ())).map_err(|e| fail(&w, format!("barrier: {e} [{}]", e.name())))?;
    std::thread::sleep(Duration::from_millis(50));
    let got = b.download(&out)?;
    if let Some(i) = got.bytes().iter().position(|&x| x != LATE_PATTERN) {
        return Err(fail(
            &w,
            format!("the result buffer was written after wait returned: byte {i} (element {}) is 0x{:02x}, expected the 0x{LATE_PATTERN:02x} written after wait", i / 4, got.bytes()[i]),
        ));
    }
    Ok(())
}

/// `_out` ops whose output aliases the input: NCCL's in-place layouts (input = this rank's chunk
/// of the output) or a misaligned overlap. Either a named `aliasing` error or the right result.
fn aliasing<B: Backend>(ctx: &mut Ctx<'_, B>, op: &str, misaligned: bool) -> CaseResult {
    let b = ctx.b;
    let ws = b.world_size();
    let me = b.rank();
    let w = here(b, op, "outbuf", DType::F32);
    let policy = b.capabilities().aliasing;
    let n = 6;
    let chunk_of = |r: usize| full(&[n], (r + 1) as f32 * 10.0);
    let (result, expected, out) = if op == "all_gather_into_tensor" {
        let parent = b.upload(&Tensor::filled_bytes(DType::F32, &[ws * n + 1], 0))?;
        let start = if misaligned { me * n + 1 } else { me * n };
        let input = b.view(&parent, start, &[n])?;
        b.write(&input, &chunk_of(me))?;
        let out = b.view(&parent, 0, &[ws * n])?;
        let parts: Vec<Tensor> = (0..ws).map(chunk_of).collect();
        (
            b.all_gather_into_tensor_out(&input, &out).and_then(|wk| wk.into_value(ctx.timeout)),
            Tensor::cat_rows(DType::F32, &[], &parts),
            out,
        )
    } else {
        // Rank-dependent (chunk j of rank r is j + 1 + 2^(r + 4)): with one input on every rank,
        // `ws` times this rank's own chunk (no peer read) would be the right sum.
        let part = |j: usize, r: usize| (j + 1 + (16 << r)) as f32;
        let parts: Vec<Tensor> = (0..ws).map(|j| full(&[n], part(j, me))).collect();
        let input = b.upload(&Tensor::cat_rows(DType::F32, &[], &parts))?;
        let out = b.view(&input, me * n, &[n])?;
        (
            b.reduce_scatter_tensor_out(&input, ReduceOp::Sum, &out).and_then(|wk| wk.into_value(ctx.timeout)),
            full(&[n], (0..ws).map(|r| part(me, r)).sum::<f32>()),
            out,
        )
    };
    match (result, policy) {
        (Err(e), AliasPolicy::Reject) if e.bad_input_kind() == Some(concord_core::BadInputKind::Aliasing) => Ok(()),
        (Err(e), _) => Err(CaseEnd::Fail(format!(
            "{w}: aliased output: expected {} , got {e} [{}]",
            if policy == AliasPolicy::Reject {
                "a named bad_input:aliasing error (the backend declares AliasPolicy::Reject)"
            } else {
                "a correct result (the backend declares AliasPolicy::Correct)"
            },
            e.name()
        ))),
        (Ok(_), AliasPolicy::Reject) => Err(fail(&w, "aliased output accepted although the backend declares AliasPolicy::Reject")),
        (Ok(_), AliasPolicy::Correct) => expect_eq(b, &out, &expected, &format!("{w} (aliased output)")),
    }
}
