//! Every op and variant of the shm backend, ranks as threads, checked against hand-computed
//! results at world sizes 1, 2, 3, 4, 8.

mod common;
use common::{run, T};
use concord_core::{dispatch_dtype, Backend, DType, Element, ReduceOp, Tensor};

const SIZES: [usize; 5] = [1, 2, 3, 4, 8];

/// Rank r's value at element i for reduce op `op`: small, so every result is exact.
fn val(op: ReduceOp, r: usize, i: usize) -> f64 {
    match op {
        ReduceOp::Product => {
            if (r + i).is_multiple_of(4) {
                2.0
            } else {
                1.0
            }
        }
        _ => ((r * 3 + i) % 4) as f64,
    }
}

fn expected(op: ReduceOp, dtype: DType, n: usize, i: usize) -> f64 {
    let v: Vec<f64> = (0..n).map(|r| val(op, r, i)).collect();
    let ints: Vec<u64> = v.iter().map(|x| *x as u64).collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Avg if dtype.is_float() => v.iter().sum::<f64>() / n as f64,
        ReduceOp::Avg => (v.iter().sum::<f64>() / n as f64).trunc(),
        ReduceOp::Product => v.iter().product(),
        ReduceOp::Min => v.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::BAnd => ints.iter().fold(u64::MAX, |a, b| a & b) as f64,
        ReduceOp::BOr => ints.iter().fold(0, |a, b| a | b) as f64,
        ReduceOp::BXor => ints.iter().fold(0, |a, b| a ^ b) as f64,
        ReduceOp::PremulSum(f) => f * v.iter().sum::<f64>(),
    }
}

fn input(op: ReduceOp, dtype: DType, r: usize, len: usize) -> Tensor {
    Tensor::from_f64(dtype, &[len], &(0..len).map(|i| val(op, r, i)).collect::<Vec<_>>())
}

fn close(dtype: DType, got: f64, want: f64) -> bool {
    if dtype.is_float() {
        (got - want).abs() <= want.abs() * dtype.epsilon() * 2.0
    } else {
        got == want
    }
}

#[test]
fn all_reduce_every_dtype_and_reduce_op_in_every_variant() {
    for n in SIZES {
        run(n, T, |b| {
            let r = b.rank();
            for dtype in DType::ALL {
                for op in ReduceOp::ALL.into_iter().filter(|op| op.defined_for(dtype)) {
                    // 5000 elements: several kernel blocks, not a multiple of the rank count.
                    let len = 5003;
                    let x = b.upload(&input(op, dtype, r, len)).unwrap();
                    let y = b.upload(&input(op, dtype, r, 7)).unwrap();
                    let out = b.all_reduce(&x, op).unwrap().into_value(T).unwrap();
                    assert_ne!(b.buffer_addr(&out), b.buffer_addr(&x));
                    assert_eq!(b.download(&x).unwrap(), input(op, dtype, r, len), "input untouched");
                    let inplace = b.all_reduce_(&x, op).unwrap();
                    assert_eq!(b.buffer_addr(inplace.peek()), b.buffer_addr(&x));
                    let inplace = inplace.into_value(T).unwrap();
                    let co = b.all_reduce_coalesced(&[y.clone(), x.clone()], op).unwrap().into_value(T).unwrap();
                    let co_ = b.all_reduce_coalesced_(std::slice::from_ref(&y), op).unwrap().into_value(T).unwrap();
                    for (what, t, l) in [
                        ("out", b.download(&out).unwrap(), len),
                        ("inplace", b.download(&inplace).unwrap(), len),
                        ("coalesced[0]", b.download(&co[0]).unwrap(), 7),
                        ("coalesced_[0]", b.download(&co_[0]).unwrap(), 7),
                    ] {
                        for i in 0..l {
                            let want = expected(op, dtype, n, i);
                            assert!(
                                close(dtype, t.get_f64(i), want),
                                "ws{n} {dtype} {op} {what} rank {r} [{i}]: got {} want {want}",
                                t.get_f64(i)
                            );
                        }
                    }
                    // co[1] reduced the already-reduced x: check it is the reduction of n copies
                    // of the first result only for idempotent ops.
                    if matches!(op, ReduceOp::Min | ReduceOp::Max | ReduceOp::BAnd | ReduceOp::BOr) {
                        assert_eq!(b.download(&co[1]).unwrap(), b.download(&inplace).unwrap());
                    }
                }
            }
            assert_eq!(b.outstanding(), 0);
        });
    }
}

fn iota(dtype: DType, shape: &[usize], base: usize) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f64(dtype, shape, &(0..n).map(|i| ((base + i) % 30) as f64).collect::<Vec<_>>())
}

#[test]
fn gather_scatter_family_moves_the_right_rows() {
    for n in SIZES {
        run(n, T, |b| {
            let r = b.rank();
            for dtype in [DType::U8, DType::BF16, DType::F64] {
                let mine = iota(dtype, &[3, 2], r * 10);
                let x = b.upload(&mine).unwrap();
                let all: Vec<Tensor> = (0..n).map(|p| iota(dtype, &[3, 2], p * 10)).collect();
                let cat = Tensor::cat_rows(dtype, &[2], &all);
                // all_gather: out, _out, coalesced, 0-dim
                let g = b.all_gather_into_tensor(&x).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&g).unwrap(), cat);
                let o = b.alloc(dtype, &[3 * n, 2]).unwrap();
                let g2 = b.all_gather_into_tensor_out(&x, &o).unwrap().into_value(T).unwrap();
                assert_eq!(b.buffer_addr(&g2), b.buffer_addr(&o));
                assert_eq!(b.download(&o).unwrap(), cat);
                let z = b.upload(&Tensor::from_f64(dtype, &[], &[r as f64])).unwrap();
                let gc = b.all_gather_into_tensor_coalesced(&[x.clone(), z]).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&gc[0]).unwrap(), cat);
                assert_eq!(b.download(&gc[1]).unwrap(), Tensor::from_f64(dtype, &[n], &(0..n).map(|p| p as f64).collect::<Vec<_>>()));
                // gather to the last rank
                let root = n - 1;
                let ga = b.gather(&x, root).unwrap().into_value(T).unwrap();
                assert_eq!(b.buffer_shape(&ga), vec![3 * n, 2]);
                if r == root {
                    assert_eq!(b.download(&ga).unwrap(), cat);
                }
                // reduce_scatter of [2n, 2]: rank r gets rows 2r, 2r+1 summed over ranks
                let rs_in = |p: usize| iota(dtype, &[2 * n, 2], p);
                let xs = b.upload(&rs_in(r)).unwrap();
                let want = {
                    let mut v = vec![0.0; 4];
                    for p in 0..n {
                        let t = rs_in(p);
                        for (k, vk) in v.iter_mut().enumerate() {
                            *vk += t.get_f64(4 * r + k);
                        }
                    }
                    Tensor::from_f64(dtype, &[2, 2], &v)
                };
                let rs = b.reduce_scatter_tensor(&xs, ReduceOp::Sum).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&rs).unwrap(), want, "ws{n} {dtype} reduce_scatter rank {r}");
                let o = b.alloc(dtype, &[2, 2]).unwrap();
                b.reduce_scatter_tensor_out(&xs, ReduceOp::Sum, &o).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&o).unwrap(), want);
                let rc = b.reduce_scatter_tensor_coalesced(std::slice::from_ref(&xs), ReduceOp::Sum).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&rc[0]).unwrap(), want);
                // scatter from rank 0: rank r gets rows 2r, 2r+1 of rank 0's input
                let sc = b.scatter(&xs, 0).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&sc).unwrap(), rs_in(0).slice_rows(2 * r, 2));
                // reduce (max) to rank 0
                let red = b.reduce(&xs, ReduceOp::Max, 0).unwrap().into_value(T).unwrap();
                if r == 0 {
                    let v: Vec<f64> = (0..4 * n).map(|i| (0..n).map(|p| rs_in(p).get_f64(i)).fold(f64::MIN, f64::max)).collect();
                    assert_eq!(b.download(&red).unwrap(), Tensor::from_f64(dtype, &[2 * n, 2], &v));
                }
                // broadcast from the last rank, both variants
                let bc = b.broadcast(&x, root).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&bc).unwrap(), all[root]);
                assert_eq!(b.download(&x).unwrap(), mine);
                let bc_ = b.broadcast_(&x, root).unwrap().into_value(T).unwrap();
                assert_eq!(b.buffer_addr(&bc_), b.buffer_addr(&x));
                assert_eq!(b.download(&x).unwrap(), all[root]);
                // permute: rank p's data goes to (p + 1) % n
                let perm: Vec<usize> = (0..n).map(|p| (p + 1) % n).collect();
                let y = b.upload(&mine).unwrap();
                let pt = b.permute_tensor(&y, &perm).unwrap().into_value(T).unwrap();
                assert_eq!(b.download(&pt).unwrap(), all[(r + n - 1) % n]);
            }
            b.barrier().unwrap().into_value(T).unwrap();
        });
    }
}

#[test]
fn all_to_all_with_uneven_zero_and_default_splits() {
    for n in SIZES {
        run(n, T, |b| {
            let r = b.rank();
            // rank p sends (p + q) % 3 rows to rank q; rows carry (sender, row index).
            let split = |p: usize, q: usize| (p + q) % 3;
            let ins: Vec<usize> = (0..n).map(|q| split(r, q)).collect();
            let outs: Vec<usize> = (0..n).map(|p| split(p, r)).collect();
            let d0: usize = ins.iter().sum();
            let x =
                b.upload(&Tensor::from_f64(DType::I32, &[d0, 2], &(0..2 * d0).map(|i| (r * 1000 + i) as f64).collect::<Vec<_>>())).unwrap();
            let y = b.all_to_all_single(&x, Some(&outs), Some(&ins)).unwrap().into_value(T).unwrap();
            let mut want = Vec::new();
            for p in 0..n {
                let start: usize = (0..r).map(|q| split(p, q)).sum();
                for row in start..start + split(p, r) {
                    want.extend([(p * 1000 + 2 * row) as i32, (p * 1000 + 2 * row + 1) as i32]);
                }
            }
            assert_eq!(b.download(&y).unwrap(), Tensor::from_vec(&[want.len() / 2, 2], want));
            // equal split default
            let x = b.upload(&Tensor::from_vec(&[n], (0..n).map(|i| (r * 10 + i) as i64).collect())).unwrap();
            let y = b.all_to_all_single(&x, None, None).unwrap().into_value(T).unwrap();
            assert_eq!(b.download(&y).unwrap(), Tensor::from_vec(&[n], (0..n).map(|p| (p * 10 + r) as i64).collect()));
        });
    }
}

#[test]
fn send_recv_match_in_order_per_pair_including_head_to_head() {
    for n in [2, 3, 4, 8] {
        run(n, T, |b| {
            let r = b.rank();
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            // Ring exchange, both directions issued before any wait (no deadlock), 40 messages
            // so the per-pair ring wraps.
            let mut sends = Vec::new();
            let mut recvs = Vec::new();
            for k in 0..40u32 {
                let x = b.upload(&Tensor::from_vec(&[3], vec![r as u32, k, 7])).unwrap();
                sends.push((x.clone(), b.send(&x, next).unwrap()));
                let o = b.alloc(DType::U32, &[3]).unwrap();
                recvs.push((k, b.recv(&o, prev).unwrap()));
            }
            for (k, w) in recvs {
                let o = w.into_value(T).unwrap();
                assert_eq!(b.download(&o).unwrap(), Tensor::from_vec(&[3], vec![prev as u32, k, 7]));
            }
            for (_, w) in sends {
                w.wait(T).unwrap();
            }
            assert_eq!(b.outstanding(), 0);
        });
    }
}

#[test]
fn views_alias_their_parent_and_peers_read_through_them() {
    run(2, T, |b| {
        let r = b.rank();
        let big = b.upload(&Tensor::from_vec(&[10], (0..10).map(|i| (i + 100 * r) as f32).collect())).unwrap();
        let v = b.view(&big, 4, &[3]).unwrap();
        assert_eq!(b.buffer_addr(&v), b.buffer_addr(&big) + 16);
        b.all_reduce_(&v, ReduceOp::Sum).unwrap().into_value(T).unwrap();
        let t = b.download(&big).unwrap();
        let want: Vec<f32> = (0..10).map(|i| if (4..7).contains(&i) { (2 * i + 100) as f32 } else { (i + 100 * r) as f32 }).collect();
        assert_eq!(t, Tensor::from_vec(&[10], want));
        assert!(b.view(&big, 8, &[3]).is_err());
        assert!(b.view(&big, usize::MAX, &[3]).is_err(), "offset overflow is an error, not a panic");
        assert!(b.alloc(DType::F64, &[usize::MAX / 4, 2]).is_err(), "size overflow is an error, not a panic");
    });
}

#[test]
fn every_dtype_round_trips_through_upload_and_write() {
    run(1, T, |b| {
        for dtype in DType::ALL {
            let t = dispatch_dtype!(dtype, E => Tensor::from_vec(&[2, 3], (0..6).map(|i| <E as Element>::from_f64(i as f64)).collect()));
            let buf = b.upload(&t).unwrap();
            assert_eq!(b.download(&buf).unwrap(), t);
            let z = Tensor::zeros(dtype, &[6]);
            b.write(&buf, &z).unwrap();
            assert_eq!(b.download(&buf).unwrap().bytes(), z.bytes());
            assert_eq!(b.buffer_dtype(&buf), dtype);
            let empty = b.upload(&Tensor::zeros(dtype, &[0, 4])).unwrap();
            let e2 = b.all_reduce(&empty, ReduceOp::Max).unwrap().into_value(T).unwrap();
            assert_ne!(b.buffer_addr(&e2), b.buffer_addr(&empty), "empty buffers still have distinct addresses");
        }
    });
}
