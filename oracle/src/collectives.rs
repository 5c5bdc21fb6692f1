//! [`expected`]: validation in the documented precedence, then the exact outputs.

use crate::reduce::reduce_tensors;
use crate::{Collective, Expected, OracleError, Semantics};
use concord_core::Tensor;
use concord_core::{
    validate_all, validate_local, validate_pair, BadInputKind as K, CallDesc, CallOp, Capabilities, DType, TensorDesc, Variant,
};

type R<T> = Result<T, OracleError>;

fn err<T>(kind: K, detail: impl Into<String>) -> R<T> {
    Err(concord_core::BadInput::new(kind, detail))
}

/// Every rank's call of `c` as the rule table sees it (index = rank).
fn descs(c: &Collective, inputs: &[Tensor]) -> Vec<CallDesc> {
    let (op, reduce, root) = match c {
        Collective::AllReduce { op } => (CallOp::AllReduce, Some(*op), None),
        Collective::AllGather => (CallOp::AllGather, None, None),
        Collective::ReduceScatter { op } => (CallOp::ReduceScatter, Some(*op), None),
        Collective::AllToAll { .. } => (CallOp::AllToAll, None, None),
        Collective::Broadcast { src } => (CallOp::Broadcast, None, Some(*src)),
        Collective::Permute { .. } => (CallOp::Permute, None, None),
        Collective::Reduce { op, root } => (CallOp::Reduce, Some(*op), Some(*root)),
        Collective::Gather { root } => (CallOp::Gather, None, Some(*root)),
        Collective::Scatter { root } => (CallOp::Scatter, None, Some(*root)),
        Collective::SendRecv { .. } => unreachable!("send/recv are checked in pairs"),
    };
    inputs
        .iter()
        .enumerate()
        .map(|(r, t)| {
            let mut d = CallDesc::new(op, Variant::Out, r);
            d.inputs.push(TensorDesc::new(t.dtype(), t.shape()));
            (d.reduce, d.root) = (reduce, root);
            match c {
                Collective::Permute { src_dst } => d.perm = Some(src_dst.clone()),
                Collective::AllToAll { input_splits, output_splits } => {
                    d.in_splits = input_splits[r].clone();
                    d.out_splits = output_splits[r].clone();
                }
                _ => {}
            }
            d
        })
        .collect()
}

/// The send / recv calls of a send/recv pattern, checked pair by pair in sender order.
fn validate_send_recv(src_dst: &[Option<usize>], inputs: &[Tensor], caps: &Capabilities) -> R<()> {
    let ws = inputs.len();
    if src_dst.len() != ws {
        return err(K::BadPeer, format!("src_dst has {} entries, world size is {ws}", src_dst.len()));
    }
    let p2p = |op, r: usize, peer: usize| CallDesc::p2p(op, r, TensorDesc::new(inputs[r].dtype(), inputs[r].shape()), peer);
    let sends: Vec<(usize, usize)> = src_dst.iter().enumerate().filter_map(|(r, d)| d.map(|d| (r, d))).collect();
    for &(r, d) in &sends {
        validate_local(&p2p(CallOp::Send, r, d), ws, caps)?;
    }
    let mut sender_of = vec![None; ws];
    for &(r, d) in &sends {
        if let Some(s) = sender_of[d].replace(r) {
            return err(K::BadPeer, format!("rank {d} would receive from both rank {s} and rank {r}"));
        }
    }
    for &(r, d) in &sends {
        validate_pair(&p2p(CallOp::Send, r, d), &p2p(CallOp::Recv, d, r), ws, caps)?;
    }
    Ok(())
}

/// Rows of dim 0 (a 0-dim tensor counts as one row).
fn rows(t: &Tensor) -> usize {
    t.shape().first().copied().unwrap_or(1)
}

/// The concatenation of `parts` along dim 0 (0-dim parts are one row each): `[Σ rows, rest..]`.
fn cat(dtype: DType, row_shape: &[usize], parts: &[Tensor]) -> Tensor {
    Tensor::cat_rows(dtype, row_shape, parts)
}

/// The exact output of every rank of `c` given every rank's input (index = rank), or the named
/// bad-input error every rank MUST report. See the crate docs for the precedence of checks.
pub fn expected(c: &Collective, inputs: &[Tensor], sem: &Semantics) -> Result<Expected, OracleError> {
    validate(c, inputs)?;
    let ws = inputs.len();
    let mut out = Expected { outputs: Vec::with_capacity(ws), defined: Vec::with_capacity(ws) };
    for rank in 0..ws {
        // all_reduce, all_gather and broadcast give every rank one tensor: computed once.
        let (t, defined) = match c {
            Collective::AllReduce { .. } | Collective::AllGather | Collective::Broadcast { .. } if rank > 0 => {
                (out.outputs[0].clone(), out.defined[0])
            }
            _ => output_of(c, inputs, sem, rank),
        };
        out.outputs.push(t);
        out.defined.push(defined);
    }
    Ok(out)
}

/// Rank `rank`'s part of [`expected`] (its output, and whether it is defined), computing no other
/// rank's output: `expected_for(c, inputs, sem, rank)` is
/// `(expected(c, inputs, sem)?.outputs[rank], expected(c, inputs, sem)?.defined[rank])`, with the
/// same validation of every rank's call. Of the inputs of the ranks that [`reads`] leaves out,
/// only the dtype and shape are used (a caller may pass placeholders of the right shape).
pub fn expected_for(c: &Collective, inputs: &[Tensor], sem: &Semantics, rank: usize) -> Result<(Tensor, bool), OracleError> {
    validate(c, inputs)?;
    assert!(rank < inputs.len(), "rank {rank} of a world of {}", inputs.len());
    Ok(output_of(c, inputs, sem, rank))
}

/// Whose input data rank `rank`'s output of `c` is made of, in a world of `ws` (index = rank):
/// every rank for the reductions, all_gather, all_to_all and the root of reduce / gather; the
/// source for broadcast, scatter, permute and a receiving rank of send/recv; the rank itself where
/// it keeps its own input (a non-root rank of reduce, a rank of send/recv or permute that
/// receives nothing); nobody for a non-root rank of gather (zeros of the right shape). `c` MUST
/// be valid for `ws` ranks (see [`expected`]).
pub fn reads(c: &Collective, ws: usize, rank: usize) -> Vec<bool> {
    let only = |r: usize| (0..ws).map(|i| i == r).collect();
    let all = || vec![true; ws];
    match c {
        Collective::AllReduce { .. } | Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AllToAll { .. } => all(),
        Collective::Broadcast { src } => only(*src),
        Collective::Scatter { root } => only(*root),
        Collective::Reduce { root, .. } => {
            if rank == *root {
                all()
            } else {
                only(rank)
            }
        }
        Collective::Gather { root } => {
            if rank == *root {
                all()
            } else {
                vec![false; ws]
            }
        }
        Collective::Permute { src_dst } => only(src_dst.iter().position(|&d| d == rank).unwrap_or(rank)),
        Collective::SendRecv { src_dst } => only(src_dst.iter().position(|&d| d == Some(rank)).unwrap_or(rank)),
    }
}

/// Checks every rank's call of `c` with the rule table (concord_core::call); the oracle's own
/// checks are only those of its `Collective` encoding (one entry per rank).
fn validate(c: &Collective, inputs: &[Tensor]) -> R<()> {
    let ws = inputs.len();
    if ws == 0 {
        return err(K::BadGroup, "no ranks: a collective needs at least one input");
    }
    let caps = Capabilities::full(usize::MAX);
    match c {
        Collective::SendRecv { src_dst } => validate_send_recv(src_dst, inputs, &caps),
        Collective::AllToAll { input_splits, output_splits } => {
            for (which, s) in [("input splits", input_splits), ("output splits", output_splits)] {
                if s.len() != ws {
                    return err(K::BadSplits, format!("{which} given for {} ranks, world size is {ws}", s.len()));
                }
            }
            validate_all(&descs(c, inputs), &caps)
        }
        _ => validate_all(&descs(c, inputs), &caps),
    }
}

/// Rank `rank`'s output of a validated `c` and whether it is defined; reads only the data of the
/// inputs [`reads`] names.
fn output_of(c: &Collective, inputs: &[Tensor], sem: &Semantics, rank: usize) -> (Tensor, bool) {
    let ws = inputs.len();
    let dtype = inputs[0].dtype();
    let row_shape = || inputs[0].shape().get(1..).unwrap_or(&[]).to_vec();
    let reduce_all = |op: &concord_core::ReduceOp| {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        reduce_tensors(*op, &refs, sem)
    };
    match c {
        Collective::AllReduce { op } => (reduce_all(op), true),
        Collective::AllGather => (cat(dtype, &row_shape(), inputs), true),
        Collective::ReduceScatter { op } => {
            let chunk = rows(&inputs[0]) / ws;
            let parts: Vec<Tensor> = inputs.iter().map(|t| t.slice_rows(rank * chunk, chunk)).collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            (reduce_tensors(*op, &refs, sem), true)
        }
        Collective::AllToAll { .. } => {
            let ins: Vec<Vec<usize>> = descs(c, inputs).iter().map(|d| d.input_splits(ws)).collect();
            let parts: Vec<Tensor> = (0..ws)
                .map(|i| {
                    let start: usize = ins[i][..rank].iter().sum();
                    inputs[i].slice_rows(start, ins[i][rank])
                })
                .collect();
            (cat(dtype, &inputs[0].shape()[1..], &parts), true)
        }
        Collective::Broadcast { src } => (inputs[*src].clone(), true),
        // Validated: a permutation, so exactly one rank sends to `rank`.
        Collective::Permute { src_dst } => {
            let from = src_dst.iter().position(|&d| d == rank).unwrap_or(rank);
            (inputs[from].clone(), true)
        }
        Collective::Reduce { op, root } => {
            if rank == *root {
                (reduce_all(op), true)
            } else {
                (inputs[rank].clone(), false)
            }
        }
        Collective::Gather { root } => {
            if rank == *root {
                (cat(dtype, &row_shape(), inputs), true)
            } else {
                let mut shape = vec![inputs.iter().map(rows).sum()];
                shape.extend(row_shape());
                (Tensor::zeros(dtype, &shape), false)
            }
        }
        Collective::Scatter { root } => {
            let chunk = rows(&inputs[0]) / ws;
            (inputs[*root].slice_rows(rank * chunk, chunk), true)
        }
        Collective::SendRecv { src_dst } => match src_dst.iter().position(|&d| d == Some(rank)) {
            // Validated: one sender, same dtype and element count; the data lands in the receive buffer.
            Some(from) => {
                let buf = &inputs[rank];
                (Tensor::from_bytes(buf.dtype(), buf.shape(), inputs[from].bytes()), true)
            }
            None => (inputs[rank].clone(), true),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::{IntAvg, NanPolicy, ReduceOp};

    fn i32s(shape: &[usize], v: &[i32]) -> Tensor {
        Tensor::from_vec(shape, v.to_vec())
    }
    fn sem() -> Semantics {
        Semantics { nan_minmax: NanPolicy::Propagate, int_avg: IntAvg::Truncate }
    }
    fn vals(t: &Tensor) -> Vec<i32> {
        t.as_slice::<i32>().to_vec()
    }
    fn kind(c: &Collective, inputs: &[Tensor]) -> K {
        expected(c, inputs, &sem()).expect_err("should be rejected").kind
    }

    #[test]
    fn all_reduce_and_reduce_scatter_by_hand() {
        let x = [i32s(&[4], &[1, 2, 3, 4]), i32s(&[4], &[10, 20, 30, 40])];
        let e = expected(&Collective::AllReduce { op: ReduceOp::Sum }, &x, &sem()).unwrap();
        assert_eq!(e.outputs.iter().map(vals).collect::<Vec<_>>(), vec![vec![11, 22, 33, 44]; 2]);
        assert_eq!(e.defined, vec![true, true]);
        let e = expected(&Collective::ReduceScatter { op: ReduceOp::Max }, &x, &sem()).unwrap();
        assert_eq!(vals(&e.outputs[0]), vec![10, 20]);
        assert_eq!(vals(&e.outputs[1]), vec![30, 40]);
        assert_eq!(e.outputs[1].shape(), &[2]);
        // Multi-dim: chunks are rows of dim 0.
        let y = [i32s(&[2, 3], &[1, 2, 3, 4, 5, 6]), i32s(&[2, 3], &[1, 1, 1, 2, 2, 2])];
        let e = expected(&Collective::ReduceScatter { op: ReduceOp::Product }, &y, &sem()).unwrap();
        assert_eq!((vals(&e.outputs[0]), e.outputs[0].shape().to_vec()), (vec![1, 2, 3], vec![1, 3]));
        assert_eq!(vals(&e.outputs[1]), vec![8, 10, 12]);
        // The NCCL counter-example: [0,1,2,3,4] over 2 ranks is an error, not a silent drop.
        let z = [i32s(&[5], &[0, 1, 2, 3, 4]), i32s(&[5], &[0, 1, 2, 3, 4])];
        assert_eq!(kind(&Collective::ReduceScatter { op: ReduceOp::Sum }, &z), K::Indivisible);
    }

    #[test]
    fn integer_avg_truncates_like_nccl() {
        let x = [i32s(&[2], &[3, -3]), i32s(&[2], &[4, -4])];
        let e = expected(&Collective::AllReduce { op: ReduceOp::Avg }, &x, &sem()).unwrap();
        assert_eq!(vals(&e.outputs[0]), vec![3, -3]);
        let floor = Semantics { int_avg: IntAvg::Floor, ..sem() };
        let e = expected(&Collective::AllReduce { op: ReduceOp::Avg }, &x, &floor).unwrap();
        assert_eq!(vals(&e.outputs[1]), vec![3, -4]);
    }

    #[test]
    fn all_gather_gather_and_zero_dim() {
        let x = [i32s(&[1, 2], &[1, 2]), i32s(&[1, 2], &[3, 4]), i32s(&[1, 2], &[5, 6])];
        let e = expected(&Collective::AllGather, &x, &sem()).unwrap();
        assert_eq!(e.outputs[2].shape(), &[3, 2]);
        assert_eq!(vals(&e.outputs[2]), vec![1, 2, 3, 4, 5, 6]);
        let s = [i32s(&[], &[7]), i32s(&[], &[8])];
        let e = expected(&Collective::AllGather, &s, &sem()).unwrap();
        assert_eq!((e.outputs[0].shape().to_vec(), vals(&e.outputs[0])), (vec![2], vec![7, 8]));
        let e = expected(&Collective::Gather { root: 1 }, &x, &sem()).unwrap();
        assert_eq!(e.defined, vec![false, true, false]);
        assert_eq!(vals(&e.outputs[1]), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(e.outputs[0].shape(), &[3, 2]);
        let e = expected(&Collective::Gather { root: 0 }, &s, &sem()).unwrap();
        assert_eq!(e.outputs[0].shape(), &[2]);
        let empty = [Tensor::zeros(DType::F32, &[0, 3]), Tensor::zeros(DType::F32, &[0, 3])];
        let e = expected(&Collective::AllGather, &empty, &sem()).unwrap();
        assert_eq!(e.outputs[0].shape(), &[0, 3]);
    }

    #[test]
    fn all_to_all_uneven_zero_and_equal_splits() {
        // rank 0 sends [1 row to 0, 0 to 1, 2 to 2]; rank 1 [0, 1, 0]; rank 2 [2, 0, 1].
        let x = [i32s(&[3], &[1, 2, 3]), i32s(&[1], &[10]), i32s(&[3], &[20, 21, 22])];
        let m = [vec![1, 0, 2], vec![0, 1, 0], vec![2, 0, 1]];
        let c = Collective::AllToAll {
            input_splits: m.iter().cloned().map(Some).collect(),
            output_splits: (0..3).map(|j| Some((0..3).map(|i| m[i][j]).collect())).collect(),
        };
        let e = expected(&c, &x, &sem()).unwrap();
        assert_eq!(vals(&e.outputs[0]), vec![1, 20, 21]);
        assert_eq!(vals(&e.outputs[1]), vec![10]);
        assert_eq!(vals(&e.outputs[2]), vec![2, 3, 22]);
        // Output splits may be left to the oracle only when they equal an equal split.
        let eq = [i32s(&[2, 1], &[1, 2]), i32s(&[2, 1], &[3, 4])];
        let c = Collective::AllToAll { input_splits: vec![None, None], output_splits: vec![None, None] };
        let e = expected(&c, &eq, &sem()).unwrap();
        assert_eq!((vals(&e.outputs[0]), vals(&e.outputs[1])), (vec![1, 3], vec![2, 4]));
        assert_eq!(e.outputs[1].shape(), &[2, 1]);
        // Mismatch: rank 1 expects 2 rows from rank 0, which sends 1.
        let c = Collective::AllToAll { input_splits: vec![Some(vec![1, 1]), None], output_splits: vec![None, Some(vec![2, 1])] };
        assert_eq!(kind(&c, &eq), K::SplitMismatch);
        let c = Collective::AllToAll { input_splits: vec![Some(vec![1, 2]), None], output_splits: vec![None, None] };
        assert_eq!(kind(&c, &eq), K::BadSplits);
        let c = Collective::AllToAll { input_splits: vec![Some(vec![2]), None], output_splits: vec![None, None] };
        assert_eq!(kind(&c, &eq), K::BadSplits);
        let odd = [i32s(&[3], &[1, 2, 3]), i32s(&[3], &[1, 2, 3])];
        let c = Collective::AllToAll { input_splits: vec![None, None], output_splits: vec![None, None] };
        assert_eq!(kind(&c, &odd), K::Indivisible);
        let c = Collective::AllToAll { input_splits: vec![None], output_splits: vec![None, None] };
        assert_eq!(kind(&c, &odd), K::BadSplits);
        let scalar = [i32s(&[], &[1]), i32s(&[], &[2])];
        let c = Collective::AllToAll { input_splits: vec![None, None], output_splits: vec![None, None] };
        assert_eq!(kind(&c, &scalar), K::ZeroDim);
        let rows_differ = [i32s(&[2, 1], &[1, 2]), i32s(&[2, 2], &[3, 4, 5, 6])];
        assert_eq!(kind(&c, &rows_differ), K::ShapeMismatch);
        // A local rule (rank 1 cannot split its 1 row equally) comes before a cross-rank one.
        let both = [i32s(&[2, 1], &[1, 2]), i32s(&[1, 2], &[3, 4])];
        assert_eq!(kind(&c, &both), K::Indivisible);
    }

    #[test]
    fn broadcast_permute_reduce_scatter_sendrecv_by_hand() {
        let x = [i32s(&[2], &[1, 2]), i32s(&[2], &[3, 4]), i32s(&[2], &[5, 6])];
        let e = expected(&Collective::Broadcast { src: 2 }, &x, &sem()).unwrap();
        assert!(e.outputs.iter().all(|t| vals(t) == vec![5, 6]));
        let e = expected(&Collective::Permute { src_dst: vec![1, 2, 0] }, &x, &sem()).unwrap();
        assert_eq!(e.outputs.iter().map(vals).collect::<Vec<_>>(), vec![vec![5, 6], vec![1, 2], vec![3, 4]]);
        let e = expected(&Collective::Reduce { op: ReduceOp::Sum, root: 1 }, &x, &sem()).unwrap();
        assert_eq!((vals(&e.outputs[1]), e.defined.clone()), (vec![9, 12], vec![false, true, false]));
        let y = [i32s(&[3], &[0; 3]), i32s(&[3], &[7, 8, 9]), i32s(&[3], &[0; 3])];
        let e = expected(&Collective::Scatter { root: 1 }, &y, &sem()).unwrap();
        assert_eq!(e.outputs.iter().map(vals).collect::<Vec<_>>(), vec![vec![7], vec![8], vec![9]]);
        assert_eq!(e.outputs[0].shape(), &[1]);
        let e = expected(&Collective::SendRecv { src_dst: vec![Some(1), Some(0), None] }, &x, &sem()).unwrap();
        assert_eq!(e.outputs.iter().map(vals).collect::<Vec<_>>(), vec![vec![3, 4], vec![1, 2], vec![5, 6]]);
        let e = expected(&Collective::SendRecv { src_dst: vec![Some(2), None, None] }, &x, &sem()).unwrap();
        assert_eq!(e.outputs.iter().map(vals).collect::<Vec<_>>(), vec![vec![1, 2], vec![3, 4], vec![1, 2]]);
    }

    #[test]
    fn every_bad_input_kind_is_named() {
        let two = [i32s(&[2], &[1, 2]), i32s(&[2], &[3, 4])];
        let f = [Tensor::zeros(DType::F32, &[2]), Tensor::zeros(DType::F32, &[2])];
        let mixed = [i32s(&[2], &[1, 2]), Tensor::zeros(DType::F32, &[2])];
        let shapes = [i32s(&[2], &[1, 2]), i32s(&[1, 2], &[3, 4])];
        let scalar = [i32s(&[], &[1]), i32s(&[], &[2])];
        let sum = ReduceOp::Sum;
        assert_eq!(kind(&Collective::AllReduce { op: sum }, &[]), K::BadGroup);
        assert_eq!(kind(&Collective::AllReduce { op: sum }, &mixed), K::DTypeMismatch);
        assert_eq!(kind(&Collective::AllGather, &mixed), K::DTypeMismatch);
        assert_eq!(kind(&Collective::AllReduce { op: sum }, &shapes), K::ShapeMismatch);
        assert_eq!(kind(&Collective::AllGather, &shapes), K::ShapeMismatch);
        assert_eq!(kind(&Collective::Broadcast { src: 0 }, &shapes), K::ShapeMismatch);
        assert_eq!(kind(&Collective::AllReduce { op: ReduceOp::BXor }, &f), K::UnsupportedDType);
        assert_eq!(kind(&Collective::Reduce { op: ReduceOp::BAnd, root: 0 }, &f), K::UnsupportedDType);
        assert_eq!(kind(&Collective::ReduceScatter { op: ReduceOp::PremulSum(2.0) }, &two), K::UnsupportedDType);
        assert_eq!(kind(&Collective::ReduceScatter { op: sum }, &scalar), K::ZeroDim);
        assert_eq!(kind(&Collective::Scatter { root: 0 }, &scalar), K::ZeroDim);
        let three = [i32s(&[3], &[1, 2, 3]), i32s(&[3], &[1, 2, 3])];
        assert_eq!(kind(&Collective::Scatter { root: 0 }, &three), K::Indivisible);
        assert_eq!(kind(&Collective::Broadcast { src: 2 }, &two), K::BadRoot);
        assert_eq!(kind(&Collective::Reduce { op: sum, root: 5 }, &two), K::BadRoot);
        assert_eq!(kind(&Collective::Gather { root: 2 }, &two), K::BadRoot);
        assert_eq!(kind(&Collective::Scatter { root: 2 }, &two), K::BadRoot);
        assert_eq!(kind(&Collective::Permute { src_dst: vec![0, 0] }, &two), K::BadPermutation);
        assert_eq!(kind(&Collective::Permute { src_dst: vec![0, 2] }, &two), K::BadPermutation);
        assert_eq!(kind(&Collective::Permute { src_dst: vec![0] }, &two), K::BadPermutation);
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![Some(0), None] }, &two), K::BadPeer);
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![Some(2), None] }, &two), K::BadPeer);
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![None] }, &two), K::BadPeer);
        let three_ranks = [i32s(&[1], &[1]), i32s(&[1], &[2]), i32s(&[1], &[3])];
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![Some(2), Some(2), None] }, &three_ranks), K::BadPeer);
        let sizes = [i32s(&[2], &[1, 2]), i32s(&[3], &[3, 4, 5])];
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![Some(1), None] }, &sizes), K::OutBufferSize);
        // Same element count, other shape: the data lands in the receive buffer's shape.
        let e = expected(&Collective::SendRecv { src_dst: vec![Some(1), None] }, &shapes, &sem()).unwrap();
        assert_eq!(e.outputs[1], i32s(&[1, 2], &[1, 2]));
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![None, Some(0)] }, &mixed), K::DTypeMismatch);
        // A rank that takes no part may hold anything.
        assert!(expected(&Collective::SendRecv { src_dst: vec![None, None] }, &mixed, &sem()).is_ok());
        // Precedence: an argument error wins over a dtype error, which wins over a shape error.
        assert_eq!(kind(&Collective::Broadcast { src: 9 }, &mixed), K::BadRoot);
        let both = [i32s(&[2], &[1, 2]), Tensor::zeros(DType::F32, &[3])];
        assert_eq!(kind(&Collective::AllReduce { op: sum }, &both), K::DTypeMismatch);
        // The error message says what and where.
        let e = expected(&Collective::Gather { root: 2 }, &two, &sem()).unwrap_err();
        assert_eq!(e.to_string(), "BadRoot: rank 0: gather root 2 out of range for world size 2");
    }
}
