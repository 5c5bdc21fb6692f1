//! [`expected`]: validation in the documented precedence, then the exact outputs.

use crate::reduce::reduce_tensors;
use crate::{Collective, Expected, OracleError, Semantics};
use concord_core::{BadInputKind as K, DType, ReduceOp, Tensor};

type R<T> = Result<T, OracleError>;

fn err<T>(kind: K, detail: impl Into<String>) -> R<T> {
    Err(OracleError::new(kind, detail))
}

fn check_root(what: &str, root: usize, ws: usize) -> R<()> {
    if root >= ws {
        return err(K::BadRoot, format!("{what} {root} out of range for world size {ws}"));
    }
    Ok(())
}

fn check_split_len(which: &str, splits: &[Option<Vec<usize>>], ws: usize) -> R<()> {
    if splits.len() != ws {
        return err(K::BadSplits, format!("{which} given for {} ranks, world size is {ws}", splits.len()));
    }
    for (r, s) in splits.iter().enumerate() {
        if let Some(s) = s {
            if s.len() != ws {
                return err(K::BadSplits, format!("rank {r}'s {which} have {} entries, world size is {ws}", s.len()));
            }
        }
    }
    Ok(())
}

fn same_dtype(inputs: &[Tensor]) -> R<DType> {
    let d = inputs[0].dtype();
    if let Some((r, t)) = inputs.iter().enumerate().find(|(_, t)| t.dtype() != d) {
        return err(K::DTypeMismatch, format!("rank {r} has dtype {}, rank 0 has {d}", t.dtype()));
    }
    Ok(d)
}

fn op_defined(op: ReduceOp, dtype: DType) -> R<()> {
    if !op.defined_for(dtype) {
        let why = if op.is_bitwise() {
            "bitwise ops need an integer dtype"
        } else {
            "premul_sum needs a floating-point dtype"
        };
        return err(K::UnsupportedDType, format!("reduce op {op} is not defined for {dtype}: {why}"));
    }
    Ok(())
}

fn not_zero_dim(op: &str, inputs: &[Tensor]) -> R<()> {
    if let Some(r) = inputs.iter().position(|t| t.shape().is_empty()) {
        return err(K::ZeroDim, format!("{op} splits dim 0, but rank {r}'s input is 0-dim"));
    }
    Ok(())
}

fn same_shape(inputs: &[Tensor]) -> R<()> {
    let s = inputs[0].shape();
    if let Some((r, t)) = inputs.iter().enumerate().find(|(_, t)| t.shape() != s) {
        return err(K::ShapeMismatch, format!("rank {r} has shape {:?}, rank 0 has {s:?}", t.shape()));
    }
    Ok(())
}

fn divisible(op: &str, d0: usize, ws: usize) -> R<()> {
    if d0 % ws != 0 {
        return err(K::Indivisible, format!("{op}: dim 0 ({d0}) is not divisible by the world size ({ws})"));
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
    let ws = inputs.len();
    if ws == 0 {
        return err(K::BadGroup, "no ranks: a collective needs at least one input");
    }
    let all_defined = |outputs: Vec<Tensor>| Expected { defined: vec![true; outputs.len()], outputs };
    let name = c.name();

    // 1. Arguments.
    match c {
        Collective::Broadcast { src } => check_root("broadcast src", *src, ws)?,
        Collective::Reduce { root, .. } | Collective::Gather { root } | Collective::Scatter { root } => {
            check_root(&format!("{name} root"), *root, ws)?
        }
        Collective::Permute { src_dst } => {
            if src_dst.len() != ws {
                return err(K::BadPermutation, format!("src_dst has {} entries, world size is {ws}", src_dst.len()));
            }
            let mut seen = vec![false; ws];
            for (r, &d) in src_dst.iter().enumerate() {
                if d >= ws {
                    return err(K::BadPermutation, format!("src_dst[{r}] = {d} is out of range for world size {ws}"));
                }
                if std::mem::replace(&mut seen[d], true) {
                    return err(
                        K::BadPermutation,
                        format!("rank {d} is the destination of more than one rank ({src_dst:?})"),
                    );
                }
            }
        }
        Collective::SendRecv { src_dst } => {
            if src_dst.len() != ws {
                return err(K::BadPeer, format!("src_dst has {} entries, world size is {ws}", src_dst.len()));
            }
            let mut sender_of = vec![None; ws];
            for (r, d) in src_dst.iter().enumerate() {
                let Some(d) = *d else { continue };
                if d >= ws {
                    return err(K::BadPeer, format!("rank {r} sends to rank {d}, out of range for world size {ws}"));
                }
                if d == r {
                    return err(K::BadPeer, format!("rank {r} sends to itself"));
                }
                if let Some(s) = sender_of[d].replace(r) {
                    return err(K::BadPeer, format!("rank {d} would receive from both rank {s} and rank {r}"));
                }
            }
        }
        Collective::AllToAll { input_splits, output_splits } => {
            check_split_len("input splits", input_splits, ws)?;
            check_split_len("output splits", output_splits, ws)?;
        }
        Collective::AllReduce { .. } | Collective::AllGather | Collective::ReduceScatter { .. } => {}
    }

    // 2. Dtypes; 3. op for dtype.
    let dtype = match c {
        // Only the pairs that talk need to agree.
        Collective::SendRecv { .. } => inputs[0].dtype(),
        _ => same_dtype(inputs)?,
    };
    if let Some(op) = c.reduce_op() {
        op_defined(op, dtype)?;
    }

    // 4. Zero-dim; 5. shapes; 6. divisibility and splits; then the outputs.
    match c {
        Collective::AllReduce { op } => {
            same_shape(inputs)?;
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let out = reduce_tensors(*op, &refs, sem);
            Ok(all_defined(vec![out; ws]))
        }
        Collective::AllGather => {
            same_shape(inputs)?;
            let row_shape = inputs[0].shape().get(1..).unwrap_or(&[]).to_vec();
            let out = cat(dtype, &row_shape, inputs);
            Ok(all_defined(vec![out; ws]))
        }
        Collective::ReduceScatter { op } => {
            not_zero_dim(name, inputs)?;
            same_shape(inputs)?;
            let d0 = rows(&inputs[0]);
            divisible(name, d0, ws)?;
            let chunk = d0 / ws;
            let outputs = (0..ws)
                .map(|r| {
                    let parts: Vec<Tensor> = inputs.iter().map(|t| t.slice_rows(r * chunk, chunk)).collect();
                    let refs: Vec<&Tensor> = parts.iter().collect();
                    reduce_tensors(*op, &refs, sem)
                })
                .collect();
            Ok(all_defined(outputs))
        }
        Collective::AllToAll { input_splits, output_splits } => {
            not_zero_dim(name, inputs)?;
            let row_shape = inputs[0].shape()[1..].to_vec();
            if let Some((r, t)) = inputs.iter().enumerate().find(|(_, t)| t.shape()[1..] != row_shape[..]) {
                return err(
                    K::ShapeMismatch,
                    format!(
                        "rank {r} has shape {:?}, rank 0 has {:?}: all dims but the first must match",
                        t.shape(),
                        inputs[0].shape()
                    ),
                );
            }
            // Resolve each rank's input splits (equal split when None).
            let mut ins = Vec::with_capacity(ws);
            for (r, t) in inputs.iter().enumerate() {
                let d0 = rows(t);
                let s = match &input_splits[r] {
                    Some(s) => {
                        let sum: usize = s.iter().sum();
                        if sum != d0 {
                            return err(
                                K::BadSplits,
                                format!("rank {r}'s input splits {s:?} sum to {sum}, its dim 0 is {d0}"),
                            );
                        }
                        s.clone()
                    }
                    None => {
                        if d0 % ws != 0 {
                            return err(
                                K::Indivisible,
                                format!("rank {r}: equal input split of dim 0 ({d0}) needs it divisible by the world size ({ws})"),
                            );
                        }
                        vec![d0 / ws; ws]
                    }
                };
                ins.push(s);
            }
            // Output splits: given, or an equal split of the rank's own dim 0 (PyTorch allocates
            // the output like the input when output splits are None).
            for (j, t) in inputs.iter().enumerate() {
                let column: Vec<usize> = (0..ws).map(|i| ins[i][j]).collect();
                let outs = match &output_splits[j] {
                    Some(s) => s.clone(),
                    None => {
                        let d0 = rows(t);
                        if d0 % ws != 0 {
                            return err(
                                K::Indivisible,
                                format!("rank {j}: equal output split of dim 0 ({d0}) needs it divisible by the world size ({ws})"),
                            );
                        }
                        vec![d0 / ws; ws]
                    }
                };
                if let Some(i) = (0..ws).find(|&i| outs[i] != column[i]) {
                    return err(
                        K::SplitMismatch,
                        format!("rank {j} expects {} rows from rank {i}, which sends it {}", outs[i], column[i]),
                    );
                }
            }
            let outputs = (0..ws)
                .map(|j| {
                    let parts: Vec<Tensor> = (0..ws)
                        .map(|i| {
                            let start: usize = ins[i][..j].iter().sum();
                            inputs[i].slice_rows(start, ins[i][j])
                        })
                        .collect();
                    cat(dtype, &row_shape, &parts)
                })
                .collect();
            Ok(all_defined(outputs))
        }
        Collective::Broadcast { src } => {
            same_shape(inputs)?;
            Ok(all_defined(vec![inputs[*src].clone(); ws]))
        }
        Collective::Permute { src_dst } => {
            same_shape(inputs)?;
            let mut outputs = inputs.to_vec();
            for (r, &d) in src_dst.iter().enumerate() {
                outputs[d] = inputs[r].clone();
            }
            Ok(all_defined(outputs))
        }
        Collective::Reduce { op, root } => {
            same_shape(inputs)?;
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let mut outputs = inputs.to_vec();
            outputs[*root] = reduce_tensors(*op, &refs, sem);
            Ok(Expected { outputs, defined: (0..ws).map(|r| r == *root).collect() })
        }
        Collective::Gather { root } => {
            same_shape(inputs)?;
            let row_shape = inputs[0].shape().get(1..).unwrap_or(&[]).to_vec();
            let out = cat(dtype, &row_shape, inputs);
            let mut outputs = vec![Tensor::zeros(dtype, out.shape()); ws];
            outputs[*root] = out;
            Ok(Expected { outputs, defined: (0..ws).map(|r| r == *root).collect() })
        }
        Collective::Scatter { root } => {
            not_zero_dim(name, inputs)?;
            same_shape(inputs)?;
            let d0 = rows(&inputs[0]);
            divisible(name, d0, ws)?;
            let chunk = d0 / ws;
            Ok(all_defined((0..ws).map(|r| inputs[*root].slice_rows(r * chunk, chunk)).collect()))
        }
        Collective::SendRecv { src_dst } => {
            let mut outputs = inputs.to_vec();
            for (r, d) in src_dst.iter().enumerate() {
                let Some(d) = *d else { continue };
                let (x, buf) = (&inputs[r], &inputs[d]);
                if x.dtype() != buf.dtype() {
                    return err(
                        K::DTypeMismatch,
                        format!("rank {r} sends {} to rank {d}, whose buffer is {}", x.dtype(), buf.dtype()),
                    );
                }
                if x.shape() != buf.shape() {
                    return err(
                        K::OutBufferSize,
                        format!(
                            "rank {r} sends shape {:?} to rank {d}, whose receive buffer has shape {:?}",
                            x.shape(),
                            buf.shape()
                        ),
                    );
                }
                outputs[d] = x.clone();
            }
            Ok(all_defined(outputs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::{IntAvg, NanPolicy};

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
        let c = Collective::AllToAll {
            input_splits: vec![Some(vec![1, 1]), None],
            output_splits: vec![None, Some(vec![2, 1])],
        };
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
        let rows_differ = [i32s(&[2, 1], &[1, 2]), i32s(&[1, 2], &[3, 4])];
        assert_eq!(kind(&c, &rows_differ), K::ShapeMismatch);
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
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![Some(1), None] }, &shapes), K::OutBufferSize);
        assert_eq!(kind(&Collective::SendRecv { src_dst: vec![None, Some(0)] }, &mixed), K::DTypeMismatch);
        // A rank that takes no part may hold anything.
        assert!(expected(&Collective::SendRecv { src_dst: vec![None, None] }, &mixed, &sem()).is_ok());
        // Precedence: an argument error wins over a dtype error, which wins over a shape error.
        assert_eq!(kind(&Collective::Broadcast { src: 9 }, &mixed), K::BadRoot);
        let both = [i32s(&[2], &[1, 2]), Tensor::zeros(DType::F32, &[3])];
        assert_eq!(kind(&Collective::AllReduce { op: sum }, &both), K::DTypeMismatch);
        // The error message says what and where.
        let e = expected(&Collective::Gather { root: 2 }, &two, &sem()).unwrap_err();
        assert_eq!(e.to_string(), "BadRoot: gather root 2 out of range for world size 2");
    }
}
