//! Issues one collective of any (op, variant) through the [`Backend`] trait ([`issue`]) and
//! waits for it ([`call`]). Everything that drives the trait generically goes through these two,
//! so every suite exercises the exact same entry points.

use concord_core::{Backend, CollectiveError, OpKind, ReduceOp, Variant, Work};
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

/// A collective issued and not yet waited: its work, in the shape its (op, variant) returns.
pub enum Pending<B: Backend> {
    One(Work<B::Buffer>),
    Many(Work<Vec<B::Buffer>>),
    Unit(Work<()>),
    /// (send, recv)
    Pair(Work<()>, Work<B::Buffer>),
}

impl<B: Backend> Pending<B> {
    /// The completion state of the part that needs the peers (the recv of a pair).
    pub fn is_completed(&self) -> bool {
        match self {
            Pending::One(w) => w.is_completed(),
            Pending::Many(w) => w.is_completed(),
            Pending::Unit(w) => w.is_completed(),
            Pending::Pair(_, r) => r.is_completed(),
        }
    }
    /// The completion state of every part (a pair: the send and the recv).
    pub fn all_completed(&self) -> bool {
        match self {
            Pending::Pair(s, r) => s.is_completed() && r.is_completed(),
            p => p.is_completed(),
        }
    }
    /// The result buffers *without* waiting (one per input; `[]` for barrier; a pair: the
    /// receive's): their contents are final only once the work completed.
    pub fn peek_values(&self) -> Vec<B::Buffer> {
        match self {
            Pending::One(w) => vec![w.peek().clone()],
            Pending::Many(w) => w.peek().clone(),
            Pending::Unit(_) => vec![],
            Pending::Pair(_, r) => vec![r.peek().clone()],
        }
    }
    /// Waits up to `t` for the part that needs the peers (the recv of a pair).
    pub fn wait(&self, t: Duration) -> Result<(), CollectiveError> {
        match self {
            Pending::One(w) => w.wait(t).map(|_| ()),
            Pending::Many(w) => w.wait(t).map(|_| ()),
            Pending::Unit(w) => w.wait(t).map(|_| ()),
            Pending::Pair(_, r) => r.wait(t).map(|_| ()),
        }
    }
    /// Waits (each work up to `t`) and returns the result buffers (one per input; `[]` for
    /// barrier; a pair: the received buffer, once the send has completed too).
    pub fn into_values(self, t: Duration) -> Result<Vec<B::Buffer>, CollectiveError> {
        match self {
            Pending::One(w) => Ok(vec![w.into_value(t)?]),
            Pending::Many(w) => w.into_value(t),
            Pending::Unit(w) => w.into_value(t).map(|_| vec![]),
            Pending::Pair(s, r) => {
                let got = r.into_value(t)?;
                s.wait(t)?;
                Ok(vec![got])
            }
        }
    }
}

/// Issues `(op, variant)` on `ins` (and `out` for `_out` variants / recv) without waiting. A
/// send / recv sends to `p.peer`, then receives from it, into `out`.
pub fn issue<B: Backend>(
    b: &B,
    op: OpKind,
    variant: Variant,
    ins: &[B::Buffer],
    out: Option<&B::Buffer>,
    p: &Params,
) -> Result<Pending<B>, CollectiveError> {
    let red = || p.reduce.unwrap_or(ReduceOp::Sum);
    let need_out = || out.ok_or_else(|| CollectiveError::Backend("suite bug: _out variant without output buffer".into()));
    Ok(match (op, variant) {
        (OpKind::AllReduce, Variant::Out) => Pending::One(b.all_reduce(&ins[0], red())?),
        (OpKind::AllReduce, Variant::InPlace) => Pending::One(b.all_reduce_(&ins[0], red())?),
        (OpKind::AllReduce, Variant::Coalesced) => Pending::Many(b.all_reduce_coalesced(ins, red())?),
        (OpKind::AllReduce, Variant::CoalescedInPlace) => Pending::Many(b.all_reduce_coalesced_(ins, red())?),
        (OpKind::AllGatherIntoTensor, Variant::Out) => Pending::One(b.all_gather_into_tensor(&ins[0])?),
        (OpKind::AllGatherIntoTensor, Variant::OutBuf) => Pending::One(b.all_gather_into_tensor_out(&ins[0], need_out()?)?),
        (OpKind::AllGatherIntoTensor, Variant::Coalesced) => Pending::Many(b.all_gather_into_tensor_coalesced(ins)?),
        (OpKind::ReduceScatterTensor, Variant::Out) => Pending::One(b.reduce_scatter_tensor(&ins[0], red())?),
        (OpKind::ReduceScatterTensor, Variant::OutBuf) => Pending::One(b.reduce_scatter_tensor_out(&ins[0], red(), need_out()?)?),
        (OpKind::ReduceScatterTensor, Variant::Coalesced) => Pending::Many(b.reduce_scatter_tensor_coalesced(ins, red())?),
        (OpKind::AllToAllSingle, Variant::Out) => {
            Pending::One(b.all_to_all_single(&ins[0], p.out_splits.as_deref(), p.in_splits.as_deref())?)
        }
        (OpKind::Broadcast, Variant::Out) => Pending::One(b.broadcast(&ins[0], p.root)?),
        (OpKind::Broadcast, Variant::InPlace) => Pending::One(b.broadcast_(&ins[0], p.root)?),
        (OpKind::PermuteTensor, Variant::Out) => Pending::One(b.permute_tensor(&ins[0], &p.src_dst)?),
        (OpKind::Reduce, Variant::Out) => Pending::One(b.reduce(&ins[0], red(), p.root)?),
        (OpKind::Gather, Variant::Out) => Pending::One(b.gather(&ins[0], p.root)?),
        (OpKind::Scatter, Variant::Out) => Pending::One(b.scatter(&ins[0], p.root)?),
        (OpKind::SendRecv, Variant::OutBuf) => {
            let peer = p.peer.ok_or_else(|| CollectiveError::Backend("suite bug: send / recv on a rank without partner".into()))?;
            let sw = b.send(&ins[0], peer)?;
            Pending::Pair(sw, b.recv(need_out()?, peer)?)
        }
        (OpKind::Barrier, Variant::Out) => Pending::Unit(b.barrier()?),
        (op, v) => return Err(CollectiveError::Backend(format!("suite bug: {op} has no {v} variant"))),
    })
}

/// Issues `(op, variant)` on `ins` (and `out` for `_out` variants / recv), waits up to `timeout`,
/// and returns the result buffers (one per input; `[]` for barrier). A send / recv pair is
/// issued send first on even ranks and receive first on odd ones; a rank without partner
/// (`p.peer` is `None`) sits out and gets `out` back.
pub fn call<B: Backend>(
    b: &B,
    op: OpKind,
    variant: Variant,
    ins: &[B::Buffer],
    out: Option<&B::Buffer>,
    p: &Params,
    timeout: Duration,
) -> Result<Vec<B::Buffer>, CollectiveError> {
    if (op, variant) == (OpKind::SendRecv, Variant::OutBuf) {
        let out = out.ok_or_else(|| CollectiveError::Backend("suite bug: _out variant without output buffer".into()))?;
        let Some(peer) = p.peer else { return Ok(vec![out.clone()]) };
        // Even ranks send first, odd ranks receive first: no pairing deadlock on any backend.
        if b.rank().is_multiple_of(2) {
            return issue(b, op, variant, ins, Some(out), p)?.into_values(timeout);
        }
        let r = b.recv(out, peer)?;
        let s = b.send(&ins[0], peer)?;
        let got = r.into_value(timeout)?;
        s.wait(timeout)?;
        return Ok(vec![got]);
    }
    issue(b, op, variant, ins, out, p)?.into_values(timeout)
}

/// Whether the result of `(op, variant)` must be the input buffer itself.
pub fn is_in_place(variant: Variant) -> bool {
    matches!(variant, Variant::InPlace | Variant::CoalescedInPlace)
}
