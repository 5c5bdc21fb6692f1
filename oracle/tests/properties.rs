//! Algebraic properties of the oracle over several world sizes, dtypes, shapes and ops, on
//! inputs from `concord-fixtures`.

use concord_core::{BadInputKind, DType, NanPolicy, ReduceOp, Tensor};
use concord_fixtures::{divisible_by, inputs, seed_for, shapes, split_matrix, transpose, InputKind};
use concord_oracle::{compare, compare_outputs, expected, reduce_tensors, Collective, Semantics, Tolerance};

const WORLD_SIZES: [usize; 6] = [1, 2, 3, 4, 5, 8];
const DTYPES: [DType; 6] = [DType::I8, DType::U16, DType::I64, DType::F16, DType::BF16, DType::F32];

fn ops_for(dtype: DType) -> Vec<ReduceOp> {
    ReduceOp::ALL.into_iter().filter(|o| o.defined_for(dtype)).collect()
}

fn ex(c: &Collective, xs: &[Tensor]) -> Vec<Tensor> {
    expected(c, xs, &Semantics::default()).unwrap_or_else(|e| panic!("{c:?} rejected: {e}")).outputs
}

fn same(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        if let Err(m) = compare(g, w, Tolerance::Exact) {
            panic!("{what}: rank {r}: {m}");
        }
    }
}

#[test]
fn all_gather_chunks_sum_to_the_all_reduce_sum() {
    for ws in WORLD_SIZES {
        for dtype in DTYPES {
            for (name, shape) in shapes() {
                let xs = inputs(seed_for(name), ws, dtype, &shape, Some(ReduceOp::Sum), InputKind::Exact);
                let gathered = &ex(&Collective::AllGather, &xs)[0];
                let rows = shape.first().copied().unwrap_or(1);
                let chunks: Vec<Tensor> = (0..ws).map(|r| gathered.slice_rows(r * rows, rows).reshaped(&shape)).collect();
                same(&chunks, &xs, "all_gather chunk r is rank r's input");
                let refs: Vec<&Tensor> = chunks.iter().collect();
                let sum = reduce_tensors(ReduceOp::Sum, &refs, &Semantics::default());
                let ar = ex(&Collective::AllReduce { op: ReduceOp::Sum }, &xs);
                same(&vec![sum; ws], &ar, &format!("{dtype} ws={ws} {name}"));
            }
        }
    }
}

#[test]
fn all_gather_of_reduce_scatter_is_all_reduce() {
    for ws in WORLD_SIZES {
        for dtype in DTYPES {
            for op in ops_for(dtype) {
                for (name, shape) in shapes().into_iter().take(7) {
                    let shape = divisible_by(&shape, ws);
                    let xs = inputs(seed_for(name), ws, dtype, &shape, Some(op), InputKind::Exact);
                    let rs = ex(&Collective::ReduceScatter { op }, &xs);
                    let ag = ex(&Collective::AllGather, &rs);
                    let ar = ex(&Collective::AllReduce { op }, &xs);
                    same(&ag, &ar, &format!("{dtype} ws={ws} {op} {name}{shape:?}"));
                    // Reduce to any root equals all_reduce there.
                    let root = ws / 2;
                    let red = expected(&Collective::Reduce { op, root }, &xs, &Semantics::default()).unwrap();
                    compare_outputs(&ar, &red, Tolerance::Exact).unwrap();
                }
            }
        }
    }
}

#[test]
fn all_to_all_with_the_transposed_splits_round_trips() {
    for ws in WORLD_SIZES {
        for dtype in [DType::U8, DType::BF16, DType::F64] {
            for (k, row_shape) in [vec![], vec![3], vec![2, 2]].into_iter().enumerate() {
                let m = split_matrix(seed_for(&format!("a2a/{ws}/{k}")), ws, 20);
                let xs: Vec<Tensor> = (0..ws)
                    .map(|r| {
                        let mut s = vec![m[r].iter().sum::<usize>()];
                        s.extend(&row_shape);
                        concord_fixtures::input(9, r, ws, dtype, &s, None, InputKind::Exact)
                    })
                    .collect();
                let mt = transpose(&m);
                let there = Collective::AllToAll {
                    input_splits: m.iter().cloned().map(Some).collect(),
                    output_splits: mt.iter().cloned().map(Some).collect(),
                };
                let back = Collective::AllToAll {
                    input_splits: mt.iter().cloned().map(Some).collect(),
                    output_splits: m.iter().cloned().map(Some).collect(),
                };
                let mid = ex(&there, &xs);
                for (j, t) in mid.iter().enumerate() {
                    assert_eq!(t.shape()[0], mt[j].iter().sum::<usize>());
                }
                same(&ex(&back, &mid), &xs, &format!("a2a round trip ws={ws} {dtype}"));
                // Equal splits (None) on a divisible dim 0 round-trip too.
                let mut s = vec![ws * 2];
                s.extend(&row_shape);
                let ys = inputs(4, ws, dtype, &s, None, InputKind::Exact);
                let eq = Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] };
                same(&ex(&eq, &ex(&eq, &ys)), &ys, "equal-split all_to_all is its own inverse");
            }
        }
    }
}

#[test]
fn broadcast_gather_scatter_permute_send_recv() {
    for ws in WORLD_SIZES {
        for dtype in [DType::I32, DType::F16] {
            for (name, shape) in shapes() {
                let xs = inputs(seed_for(name), ws, dtype, &shape, None, InputKind::Exact);
                let rows = shape.first().copied().unwrap_or(1);
                for src in [0, ws - 1] {
                    let b = ex(&Collective::Broadcast { src }, &xs);
                    let g = expected(&Collective::Gather { root: src }, &xs, &Semantics::default()).unwrap();
                    assert!(g.defined[src] && g.defined.iter().filter(|d| **d).count() == 1);
                    let root_part = g.outputs[src].slice_rows(src * rows, rows).reshaped(&shape);
                    same(&b, &vec![root_part; ws], "broadcast == the root's part of gather");
                    same(&b, &vec![xs[src].clone(); ws], "broadcast gives src's input");
                }
                let id: Vec<usize> = (0..ws).collect();
                same(&ex(&Collective::Permute { src_dst: id }, &xs), &xs, "identity permutation");
                let shift: Vec<usize> = (0..ws).map(|r| (r + 1) % ws).collect();
                let unshift: Vec<usize> = (0..ws).map(|r| (r + ws - 1) % ws).collect();
                let there = ex(&Collective::Permute { src_dst: shift }, &xs);
                same(&ex(&Collective::Permute { src_dst: unshift }, &there), &xs, "permutation then its inverse");
                // Ring send/recv equals the shift permutation.
                let ring: Vec<Option<usize>> = (0..ws).map(|r| (ws > 1).then_some((r + 1) % ws)).collect();
                same(&ex(&Collective::SendRecv { src_dst: ring }, &xs), &there, "ring send/recv == shift permute");
                // scatter from root, gathered back at root, is the root's input.
                let big = divisible_by(&shape, ws);
                let ys = inputs(seed_for(name) ^ 3, ws, dtype, &big, None, InputKind::Exact);
                let root = ws / 2;
                let sc = ex(&Collective::Scatter { root }, &ys);
                let back = expected(&Collective::Gather { root }, &sc, &Semantics::default()).unwrap();
                same(&[back.outputs[root].clone()], &[ys[root].clone()], "gather(scatter(x)) == x at the root");
            }
        }
    }
}

#[test]
fn bad_inputs_across_world_sizes() {
    let sem = Semantics::default();
    for ws in [2, 3, 5, 8] {
        let xs = inputs(1, ws, DType::F32, &[ws * 2 + 1], None, InputKind::Exact);
        let kind = |c: &Collective, xs: &[Tensor]| expected(c, xs, &sem).unwrap_err().kind;
        assert_eq!(kind(&Collective::ReduceScatter { op: ReduceOp::Sum }, &xs), BadInputKind::Indivisible);
        assert_eq!(kind(&Collective::Scatter { root: 0 }, &xs), BadInputKind::Indivisible);
        let eq = Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] };
        assert_eq!(kind(&eq, &xs), BadInputKind::Indivisible);
        assert_eq!(kind(&Collective::Broadcast { src: ws }, &xs), BadInputKind::BadRoot);
        assert_eq!(kind(&Collective::AllReduce { op: ReduceOp::BOr }, &xs), BadInputKind::UnsupportedDType);
        let mut odd = xs.clone();
        odd[ws - 1] = Tensor::zeros(DType::F32, &[ws * 2]);
        assert_eq!(kind(&Collective::AllGather, &odd), BadInputKind::ShapeMismatch);
        odd[ws - 1] = Tensor::zeros(DType::F64, &[ws * 2 + 1]);
        assert_eq!(kind(&Collective::AllReduce { op: ReduceOp::Sum }, &odd), BadInputKind::DTypeMismatch);
        // Splits off by one on the last rank: its row sums past its dim 0.
        let m = split_matrix(2, ws, 5);
        let ys: Vec<Tensor> = (0..ws).map(|r| Tensor::zeros(DType::U8, &[m[r].iter().sum()])).collect();
        let mut bad = m.clone();
        bad[ws - 1][0] += 1;
        let c = Collective::AllToAll {
            input_splits: bad.iter().cloned().map(Some).collect(),
            output_splits: transpose(&m).into_iter().map(Some).collect(),
        };
        assert_eq!(kind(&c, &ys), BadInputKind::BadSplits);
        let mut out_bad = transpose(&m);
        out_bad[0][ws - 1] += 1;
        let c = Collective::AllToAll {
            input_splits: m.iter().cloned().map(Some).collect(),
            output_splits: out_bad.into_iter().map(Some).collect(),
        };
        assert_eq!(kind(&c, &ys), BadInputKind::SplitMismatch);
    }
}

#[test]
fn special_inputs_follow_the_declared_policies() {
    let prop = Semantics::default();
    let ign = Semantics { nan_minmax: NanPolicy::Ignore, ..prop };
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for ws in [2, 3, 4] {
            let get = |op: ReduceOp, sem: &Semantics, i: usize| {
                let xs = inputs(5, ws, dtype, &[16], Some(op), InputKind::Special);
                expected(&Collective::AllReduce { op }, &xs, sem).unwrap().outputs[0].get_f64(i)
            };
            // i % 8 == 0: one rank NaN. 1: all NaN. 2: one +inf. 4: +inf and -inf. 5: all -0. 6: mixed zeros.
            assert!(get(ReduceOp::Max, &prop, 0).is_nan());
            assert!(!get(ReduceOp::Max, &ign, 0).is_nan());
            assert!(!get(ReduceOp::Min, &ign, 8).is_nan());
            assert!(get(ReduceOp::Min, &ign, 1).is_nan());
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product] {
                assert!(get(op, &ign, 0).is_nan(), "{op} propagates NaN whatever the min/max policy");
                let inf = get(op, &ign, 2);
                // A product's sign depends on the other ranks' signs.
                assert!(inf == f64::INFINITY || (op == ReduceOp::Product && inf == f64::NEG_INFINITY), "{dtype} {op}: {inf}");
                assert!(get(op, &prop, 4).is_nan() || op == ReduceOp::Product);
            }
            assert_eq!(get(ReduceOp::Max, &prop, 2), f64::INFINITY);
            assert_eq!(get(ReduceOp::Min, &prop, 4), f64::NEG_INFINITY);
            let z = get(ReduceOp::Sum, &prop, 5);
            assert!(z == 0.0 && z.is_sign_negative(), "sum of -0 is -0");
            let (mn, mx) = (get(ReduceOp::Min, &prop, 6), get(ReduceOp::Max, &prop, 6));
            assert!(mn == 0.0 && mn.is_sign_negative() && mx == 0.0 && mx.is_sign_positive());
            assert!(get(ReduceOp::Sum, &prop, 6).is_sign_positive());
        }
    }
}

#[test]
fn avg_of_exact_inputs_and_int_wrap_over_the_matrix() {
    // The oracle's integer avg divides the dtype-width sum, so it can differ from a widened avg.
    let sem = Semantics::default();
    let xs = [Tensor::from_vec(&[1], vec![100i8]), Tensor::from_vec(&[1], vec![100i8])];
    let e = expected(&Collective::AllReduce { op: ReduceOp::Avg }, &xs, &sem).unwrap();
    assert_eq!(e.outputs[0].as_slice::<i8>(), &[(200u8 as i8) / 2]); // -28, not 100
                                                                     // Exact float avg inputs average to integers the oracle returns exactly.
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        for ws in WORLD_SIZES {
            let xs = inputs(8, ws, dtype, &[40], Some(ReduceOp::Avg), InputKind::Exact);
            let out = &ex(&Collective::AllReduce { op: ReduceOp::Avg }, &xs)[0];
            assert!((0..40).all(|i| out.get_f64(i).fract() == 0.0), "{dtype} ws={ws}: {out:?}");
        }
    }
}

/// `expected_for` is `expected` restricted to one rank, and reads the data of the inputs `reads`
/// names only: every other input replaced by a placeholder of its shape gives the same answer.
#[test]
fn expected_for_one_rank_is_expected_and_reads_only_what_it_says() {
    use concord_oracle::{expected_for, reads};
    for ws in WORLD_SIZES {
        for dtype in [DType::I8, DType::BF16, DType::F32] {
            let mut colls = vec![
                (Collective::AllReduce { op: ReduceOp::Sum }, false),
                (Collective::AllGather, false),
                (Collective::ReduceScatter { op: ReduceOp::Max }, true),
                (Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] }, true),
                (Collective::Broadcast { src: ws - 1 }, false),
                (Collective::Permute { src_dst: (0..ws).map(|r| (r + 1) % ws).collect() }, false),
                (Collective::Reduce { op: ReduceOp::Sum, root: ws / 2 }, false),
                (Collective::Gather { root: ws - 1 }, false),
                (Collective::Scatter { root: 0 }, true),
                (Collective::SendRecv { src_dst: (0..ws).map(|r| Some(r ^ 1).filter(|&p| p < ws)).collect() }, false),
                (Collective::SendRecv { src_dst: (0..ws).map(|r| (r == 0 && ws > 1).then_some(ws - 1)).collect() }, false),
            ];
            let m = split_matrix(seed_for("splits"), ws, 4);
            let t = transpose(&m);
            colls.push((
                Collective::AllToAll {
                    input_splits: m.iter().cloned().map(Some).collect(),
                    output_splits: t.iter().cloned().map(Some).collect(),
                },
                false,
            ));
            for (c, div) in colls {
                for (name, shape) in shapes() {
                    let shape = if div { divisible_by(&shape, ws) } else { shape };
                    let xs: Vec<Tensor> = match &c {
                        Collective::AllToAll { input_splits, .. } if input_splits[0].is_some() => (0..ws)
                            .map(|r| {
                                let mut s = vec![m[r].iter().sum::<usize>()];
                                s.extend(shape.iter().skip(1));
                                concord_fixtures::input(seed_for(name), r, ws, dtype, &s, None, InputKind::Exact)
                            })
                            .collect(),
                        _ => inputs(seed_for(name), ws, dtype, &shape, c.reduce_op(), InputKind::Exact),
                    };
                    let Ok(all) = expected(&c, &xs, &Semantics::default()) else { continue };
                    for rank in 0..ws {
                        let read = reads(&c, ws, rank);
                        let masked: Vec<Tensor> = xs
                            .iter()
                            .enumerate()
                            .map(|(r, x)| if read[r] { x.clone() } else { Tensor::filled_bytes(dtype, x.shape(), 0x5A) })
                            .collect();
                        let (out, defined) = expected_for(&c, &masked, &Semantics::default(), rank).unwrap();
                        let what = format!("{c:?} {dtype} ws={ws} {name} rank {rank}");
                        assert_eq!(defined, all.defined[rank], "{what}: defined");
                        if defined {
                            same(&[out], &all.outputs[rank..rank + 1], &what);
                        } else {
                            assert_eq!(out.shape(), all.outputs[rank].shape(), "{what}: shape");
                        }
                    }
                }
            }
        }
    }
    // Bad input: the same named error as `expected`.
    let xs = inputs(1, 3, DType::F32, &[4], None, InputKind::Exact);
    let c = Collective::Broadcast { src: 3 };
    assert_eq!(expected_for(&c, &xs, &Semantics::default(), 0).unwrap_err(), expected(&c, &xs, &Semantics::default()).unwrap_err());
}
