//! The built-in choice sets, over the [`Backend`] trait only.
//!
//! * all_reduce: `native`; `rs_ag` (reduce_scatter + all_gather, when `d0 % ws == 0`); `ring`
//!   (every rank's input passed around a ring with send/recv, reduced locally in rank order);
//!   `recursive_doubling` (send/recv with partner `rank ^ d`, power-of-two ws, associative ops);
//!   `chunked` (native all_reduce_ on 4 views of a copy, all in flight at once).
//! * all_gather: `native`; `ring`; `gather_bcast` (gather to 0, then broadcast).
//! * reduce_scatter: `native`; `ar_slice` (all_reduce, then this rank's slice as a view); `ring`
//!   (chunk for rank `r + s` sent at step `s`, reduced locally in rank order).
//! * all_to_all (equal splits): `native`; `pairwise` (send/recv, step `s` to `r + s`).
//!
//! Local reductions use the oracle's `reduce_tensors` with the backend's declared semantics.
//! Every choice declares the calls it makes ([`Choice::calls`]): one the backend declares a gap is
//! skipped by name, never run.

use crate::{Choice, ChoiceCtx, OpInstance};
use concord_core::{Backend, OpKind, ReduceOp, Result, Tensor, Variant};
use concord_oracle::{reduce_tensors, Semantics};

/// The built-in choices of `op` (empty for ops the autotuner does not tune).
pub fn builtin<B: Backend>(op: OpKind) -> Vec<Choice<B>> {
    match op {
        OpKind::AllReduce => vec![
            Choice::new("native", |c: &ChoiceCtx<'_, B>, x| c.wait(c.b.all_reduce(x, op_of(c))?)).calls(native(OpKind::AllReduce)),
            Choice::new("rs_ag", |c: &ChoiceCtx<'_, B>, x| {
                let part = c.wait(c.b.reduce_scatter_tensor(x, op_of(c))?)?;
                c.wait(c.b.all_gather_into_tensor(&part)?)
            })
            .when(|i, ws| !i.shape.is_empty() && i.d0() > 0 && i.d0() % ws == 0)
            .calls(|i, _| vec![(OpKind::ReduceScatterTensor, Variant::Out, i.reduce), (OpKind::AllGatherIntoTensor, Variant::Out, None)]),
            Choice::new("ring", |c: &ChoiceCtx<'_, B>, x| {
                let parts = ring_gather(c, x)?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                c.b.upload(&reduce_tensors(op_of(c), &refs, &sem(c)))
            })
            .calls(p2p),
            Choice::new("recursive_doubling", recursive_doubling::<B>)
                .when(|i, ws| ws.is_power_of_two() && associative(i.reduce))
                .calls(p2p),
            Choice::new("chunked", |c: &ChoiceCtx<'_, B>, x| {
                let n = c.inst.numel();
                let out = c.b.upload(&c.b.download(x)?)?;
                let k = 4;
                let mut works = Vec::with_capacity(k);
                for j in 0..k {
                    let (lo, hi) = (n * j / k, n * (j + 1) / k);
                    let v = c.b.view(&out, lo, &[hi - lo])?;
                    works.push(c.b.all_reduce_(&v, op_of(c))?);
                }
                for w in works {
                    c.wait(w)?;
                }
                Ok(out)
            })
            .when(|i, _| i.numel() >= 4)
            .calls(|i, _| vec![(OpKind::AllReduce, Variant::InPlace, i.reduce)]),
        ],
        OpKind::AllGatherIntoTensor => vec![
            Choice::new("native", |c: &ChoiceCtx<'_, B>, x| c.wait(c.b.all_gather_into_tensor(x)?))
                .calls(native(OpKind::AllGatherIntoTensor)),
            Choice::new("ring", |c: &ChoiceCtx<'_, B>, x| {
                let parts = ring_gather(c, x)?;
                let row: Vec<usize> = c.inst.shape.iter().skip(1).copied().collect();
                c.b.upload(&Tensor::cat_rows(c.inst.dtype, &row, &parts))
            })
            .calls(p2p),
            Choice::new("gather_bcast", |c: &ChoiceCtx<'_, B>, x| {
                let g = c.wait(c.b.gather(x, 0)?)?;
                c.wait(c.b.broadcast_(&g, 0)?)
            })
            .calls(|_, _| vec![(OpKind::Gather, Variant::Out, None), (OpKind::Broadcast, Variant::InPlace, None)]),
        ],
        OpKind::ReduceScatterTensor => vec![
            Choice::new("native", |c: &ChoiceCtx<'_, B>, x| c.wait(c.b.reduce_scatter_tensor(x, op_of(c))?))
                .calls(native(OpKind::ReduceScatterTensor)),
            Choice::new("ar_slice", |c: &ChoiceCtx<'_, B>, x| {
                let full = c.wait(c.b.all_reduce(x, op_of(c))?)?;
                let (shape, chunk) = chunk_shape(c);
                c.b.view(&full, c.b.rank() * chunk, &shape)
            })
            .calls(|i, _| vec![(OpKind::AllReduce, Variant::Out, i.reduce)]),
            Choice::new("ring", |c: &ChoiceCtx<'_, B>, x| {
                let (shape, chunk) = chunk_shape(c);
                let parts = exchange_chunks(c, x, &shape, chunk)?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                c.b.upload(&reduce_tensors(op_of(c), &refs, &sem(c)))
            })
            .calls(p2p),
        ],
        OpKind::AllToAllSingle => vec![
            Choice::new("native", |c: &ChoiceCtx<'_, B>, x| c.wait(c.b.all_to_all_single(x, None, None)?))
                .calls(native(OpKind::AllToAllSingle)),
            Choice::new("pairwise", |c: &ChoiceCtx<'_, B>, x| {
                let (shape, chunk) = chunk_shape(c);
                let parts = exchange_chunks(c, x, &shape, chunk)?;
                let row: Vec<usize> = shape.iter().skip(1).copied().collect();
                c.b.upload(&Tensor::cat_rows(c.inst.dtype, &row, &parts))
            })
            .calls(p2p),
        ],
        _ => Vec::new(),
    }
}

/// One call the built-in choices make: op, variant, reduce op (in the instance's dtype).
type Call = (OpKind, Variant, Option<ReduceOp>);

/// The native op's one call: out of place, with the instance's reduce op.
fn native(op: OpKind) -> impl Fn(&OpInstance, usize) -> Vec<Call> + Send + Sync + 'static {
    move |i, _| vec![(op, Variant::Out, i.reduce)]
}

/// Send / recv (none on one rank).
fn p2p(_: &OpInstance, ws: usize) -> Vec<Call> {
    if ws > 1 {
        vec![(OpKind::SendRecv, Variant::OutBuf, None)]
    } else {
        Vec::new()
    }
}

fn op_of<B: Backend>(c: &ChoiceCtx<'_, B>) -> ReduceOp {
    c.inst.reduce.unwrap_or(ReduceOp::Sum)
}

fn sem<B: Backend>(c: &ChoiceCtx<'_, B>) -> Semantics {
    Semantics::of(&c.b.capabilities())
}

/// Ops whose pairwise reduction in any grouping gives the oracle's bits on exact inputs.
fn associative(op: Option<ReduceOp>) -> bool {
    matches!(op, Some(ReduceOp::Sum | ReduceOp::Product | ReduceOp::Min | ReduceOp::Max | ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor))
}

/// The output shape of reduce_scatter / one all_to_all chunk, and its element count.
fn chunk_shape<B: Backend>(c: &ChoiceCtx<'_, B>) -> (Vec<usize>, usize) {
    let ws = c.b.world_size();
    let mut shape = c.inst.shape.clone();
    if shape.is_empty() {
        shape.push(1);
    }
    shape[0] /= ws;
    let n = shape.iter().product();
    (shape, n)
}

/// Every rank's `x`, in rank order, passed around the ring (ws - 1 steps of send right, recv left).
fn ring_gather<B: Backend>(c: &ChoiceCtx<'_, B>, x: &B::Buffer) -> Result<Vec<Tensor>> {
    let (r, ws) = (c.b.rank(), c.b.world_size());
    let mut parts: Vec<Option<Tensor>> = vec![None; ws];
    parts[r] = Some(c.b.download(x)?);
    let mut cur = x.clone();
    for s in 1..ws {
        let tmp = c.b.alloc(c.inst.dtype, &c.inst.shape)?;
        let sw = c.b.send(&cur, (r + 1) % ws)?;
        let rw = c.b.recv(&tmp, (r + ws - 1) % ws)?;
        c.wait(sw)?;
        let got = c.wait(rw)?;
        parts[(r + ws - s) % ws] = Some(c.b.download(&got)?);
        cur = got;
    }
    Ok(parts.into_iter().map(|p| p.expect("every rank's part arrives")).collect())
}

/// Chunk `j` of `x` goes to rank `j`; returns the chunks this rank received, in source order.
fn exchange_chunks<B: Backend>(c: &ChoiceCtx<'_, B>, x: &B::Buffer, shape: &[usize], chunk: usize) -> Result<Vec<Tensor>> {
    let (r, ws) = (c.b.rank(), c.b.world_size());
    let mut parts: Vec<Option<Tensor>> = vec![None; ws];
    parts[r] = Some(c.b.download(&c.b.view(x, r * chunk, shape)?)?);
    for s in 1..ws {
        let (dst, src) = ((r + s) % ws, (r + ws - s) % ws);
        let tmp = c.b.alloc(c.inst.dtype, shape)?;
        let sw = c.b.send(&c.b.view(x, dst * chunk, shape)?, dst)?;
        let rw = c.b.recv(&tmp, src)?;
        c.wait(sw)?;
        parts[src] = Some(c.b.download(&c.wait(rw)?)?);
    }
    Ok(parts.into_iter().map(|p| p.expect("every rank's chunk arrives")).collect())
}

fn recursive_doubling<B: Backend>(c: &ChoiceCtx<'_, B>, x: &B::Buffer) -> Result<B::Buffer> {
    let (r, ws) = (c.b.rank(), c.b.world_size());
    let sem = sem(c);
    let mut acc = c.b.download(x)?;
    let mut d = 1;
    while d < ws {
        let partner = r ^ d;
        let mine = c.b.upload(&acc)?;
        let tmp = c.b.alloc(c.inst.dtype, &c.inst.shape)?;
        let sw = c.b.send(&mine, partner)?;
        let rw = c.b.recv(&tmp, partner)?;
        c.wait(sw)?;
        let other = c.b.download(&c.wait(rw)?)?;
        acc = if r < partner { reduce_tensors(op_of(c), &[&acc, &other], &sem) } else { reduce_tensors(op_of(c), &[&other, &acc], &sem) };
        d *= 2;
    }
    c.b.upload(&acc)
}

/// Whether `inst` is an instance the built-in sets can tune at `ws` (the native op's own rules).
pub fn tunable(inst: &OpInstance, ws: usize) -> bool {
    match inst.op {
        OpKind::AllReduce => inst.reduce.is_some(),
        OpKind::AllGatherIntoTensor => true,
        OpKind::ReduceScatterTensor | OpKind::AllToAllSingle => !inst.shape.is_empty() && inst.d0().is_multiple_of(ws),
        _ => false,
    }
}
