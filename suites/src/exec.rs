//! Issues one collective of any (op, variant) through the [`Backend`] trait and waits for it.
//! Everything that drives the trait generically goes through [`call`], so every suite exercises
//! the exact same entry points.

use concord_core::{Backend, CollectiveError, OpKind, ReduceOp, Variant};
use std::time::Duration;

/// Every (op, variant) pair the trait has, in catalogue order.
pub const PAIRS: &[(OpKind, Variant)] = &[
    (OpKind::AllReduce, Variant::Out),
    (OpKind::AllReduce, Variant::InPlace),
    (OpKind::AllReduce, Variant::Coalesced),
    (OpKind::AllReduce, Variant::CoalescedInPlace),
    (OpKind::AllGatherIntoTensor, Variant::Out),
    (OpKind::AllGatherIntoTensor, Variant::OutBuf),
    (OpKind::AllGatherIntoTensor, Variant::Coalesced),
    (OpKind::ReduceScatterTensor, Variant::Out),
    (OpKind::ReduceScatterTensor, Variant::OutBuf),
    (OpKind::ReduceScatterTensor, Variant::Coalesced),
    (OpKind::AllToAllSingle, Variant::Out),
    (OpKind::Broadcast, Variant::Out),
    (OpKind::Broadcast, Variant::InPlace),
    (OpKind::PermuteTensor, Variant::Out),
    (OpKind::Reduce, Variant::Out),
    (OpKind::Gather, Variant::Out),
    (OpKind::Scatter, Variant::Out),
    (OpKind::SendRecv, Variant::OutBuf),
    (OpKind::Barrier, Variant::Out),
];

/// Parameters besides the buffers.
#[derive(Clone, Debug, Default)]
pub struct Params {
    pub reduce: Option<ReduceOp>,
    /// broadcast src / reduce, gather, scatter root.
    pub root: usize,
    pub in_splits: Option<Vec<usize>>,
    pub out_splits: Option<Vec<usize>>,
    pub src_dst: Vec<usize>,
    /// send/recv partner of this rank (None: this rank sits out).
    pub peer: Option<usize>,
}

/// The oracle's [`concord_oracle::Collective`] for `op` called with `p` on `ws` ranks: `p`'s
/// reduce op (sum when none), root and permutation, equal all_to_all splits, send / recv between
/// [`crate::values::partner`]s; `None` for the barrier, which moves no data. The one mapping from
/// a call to what the oracle computes for it.
pub fn collective(op: OpKind, p: &Params, ws: usize) -> Option<concord_oracle::Collective> {
    use concord_oracle::Collective as C;
    let red = p.reduce.unwrap_or(ReduceOp::Sum);
    Some(match op {
        OpKind::AllReduce => C::AllReduce { op: red },
        OpKind::AllGatherIntoTensor => C::AllGather,
        OpKind::ReduceScatterTensor => C::ReduceScatter { op: red },
        OpKind::AllToAllSingle => C::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] },
        OpKind::Broadcast => C::Broadcast { src: p.root },
        OpKind::PermuteTensor => C::Permute { src_dst: p.src_dst.clone() },
        OpKind::Reduce => C::Reduce { op: red, root: p.root },
        OpKind::Gather => C::Gather { root: p.root },
        OpKind::Scatter => C::Scatter { root: p.root },
        OpKind::SendRecv => C::SendRecv { src_dst: (0..ws).map(|r| crate::values::partner(r, ws)).collect() },
        OpKind::Barrier => return None,
    })
}

/// Issues `(op, variant)` on `ins` (and `out` for `_out` variants / recv), waits up to `timeout`,
/// and returns the result buffers (one per input; `[]` for barrier).
pub fn call<B: Backend>(
    b: &B,
    op: OpKind,
    variant: Variant,
    ins: &[B::Buffer],
    out: Option<&B::Buffer>,
    p: &Params,
    timeout: Duration,
) -> Result<Vec<B::Buffer>, CollectiveError> {
    let red = || p.reduce.unwrap_or(ReduceOp::Sum);
    let need_out = || out.ok_or_else(|| CollectiveError::Backend("suite bug: _out variant without output buffer".into()));
    let one = |w: concord_core::Work<B::Buffer>| -> Result<Vec<B::Buffer>, CollectiveError> { Ok(vec![w.into_value(timeout)?]) };
    match (op, variant) {
        (OpKind::AllReduce, Variant::Out) => one(b.all_reduce(&ins[0], red())?),
        (OpKind::AllReduce, Variant::InPlace) => one(b.all_reduce_(&ins[0], red())?),
        (OpKind::AllReduce, Variant::Coalesced) => b.all_reduce_coalesced(ins, red())?.into_value(timeout),
        (OpKind::AllReduce, Variant::CoalescedInPlace) => b.all_reduce_coalesced_(ins, red())?.into_value(timeout),
        (OpKind::AllGatherIntoTensor, Variant::Out) => one(b.all_gather_into_tensor(&ins[0])?),
        (OpKind::AllGatherIntoTensor, Variant::OutBuf) => one(b.all_gather_into_tensor_out(&ins[0], need_out()?)?),
        (OpKind::AllGatherIntoTensor, Variant::Coalesced) => b.all_gather_into_tensor_coalesced(ins)?.into_value(timeout),
        (OpKind::ReduceScatterTensor, Variant::Out) => one(b.reduce_scatter_tensor(&ins[0], red())?),
        (OpKind::ReduceScatterTensor, Variant::OutBuf) => one(b.reduce_scatter_tensor_out(&ins[0], red(), need_out()?)?),
        (OpKind::ReduceScatterTensor, Variant::Coalesced) => b.reduce_scatter_tensor_coalesced(ins, red())?.into_value(timeout),
        (OpKind::AllToAllSingle, Variant::Out) => one(b.all_to_all_single(&ins[0], p.out_splits.as_deref(), p.in_splits.as_deref())?),
        (OpKind::Broadcast, Variant::Out) => one(b.broadcast(&ins[0], p.root)?),
        (OpKind::Broadcast, Variant::InPlace) => one(b.broadcast_(&ins[0], p.root)?),
        (OpKind::PermuteTensor, Variant::Out) => one(b.permute_tensor(&ins[0], &p.src_dst)?),
        (OpKind::Reduce, Variant::Out) => one(b.reduce(&ins[0], red(), p.root)?),
        (OpKind::Gather, Variant::Out) => one(b.gather(&ins[0], p.root)?),
        (OpKind::Scatter, Variant::Out) => one(b.scatter(&ins[0], p.root)?),
        (OpKind::SendRecv, Variant::OutBuf) => {
            let out = need_out()?;
            let Some(peer) = p.peer else { return Ok(vec![out.clone()]) };
            // Even ranks send first, odd ranks receive first: no pairing deadlock on any backend.
            if b.rank().is_multiple_of(2) {
                let s = b.send(&ins[0], peer)?;
                let r = b.recv(out, peer)?;
                s.wait(timeout)?;
                one(r)
            } else {
                let r = b.recv(out, peer)?;
                let s = b.send(&ins[0], peer)?;
                let got = r.into_value(timeout)?;
                s.wait(timeout)?;
                Ok(vec![got])
            }
        }
        (OpKind::Barrier, Variant::Out) => {
            b.barrier()?.wait(timeout)?;
            Ok(vec![])
        }
        (op, v) => Err(CollectiveError::Backend(format!("suite bug: {op} has no {v} variant"))),
    }
}

/// Whether the result of `(op, variant)` must be the input buffer itself.
pub fn is_in_place(variant: Variant) -> bool {
    matches!(variant, Variant::InPlace | Variant::CoalescedInPlace)
}
