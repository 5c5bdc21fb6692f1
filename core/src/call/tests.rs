//! The rule table: each rule broken once gives its kind; two broken at once give the earlier.

use super::*;
use crate::BadInputKind as K;

fn caps() -> Capabilities {
    Capabilities::full(64)
}
fn t(dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::new(dtype, shape)
}
fn call(op: CallOp, rank: usize, x: TensorDesc) -> CallDesc {
    let mut d = CallDesc::new(op, Variant::Out, rank);
    d.inputs.push(x);
    d
}
fn f32(shape: &[usize]) -> TensorDesc {
    t(DType::F32, shape)
}
/// The same call on `ws` ranks, changed by `f(rank, desc)`.
fn world(ws: usize, base: &CallDesc, f: impl Fn(usize, &mut CallDesc)) -> Vec<CallDesc> {
    (0..ws)
        .map(|r| {
            let mut d = base.clone();
            d.rank = r;
            f(r, &mut d);
            d
        })
        .collect()
}
fn kind_all(all: &[CallDesc]) -> K {
    validate_all(all, &caps()).expect_err("should be rejected").kind
}
fn kind_local(d: &CallDesc, ws: usize) -> K {
    validate_local(d, ws, &caps()).expect_err("should be rejected").kind
}
fn ar() -> CallDesc {
    let mut d = call(CallOp::AllReduce, 0, f32(&[4]));
    d.reduce = Some(ReduceOp::Sum);
    d
}

#[test]
fn good_calls_pass() {
    assert!(validate_all(&world(3, &ar(), |_, _| {}), &caps()).is_ok());
    let mut a2a = call(CallOp::AllToAll, 0, f32(&[3, 2]));
    a2a.in_splits = Some(vec![1, 2]);
    a2a.out_splits = Some(vec![1, 1]);
    let all = world(2, &a2a, |r, d| {
        if r == 1 {
            d.inputs[0] = f32(&[1, 2]);
            d.in_splits = Some(vec![1, 0]);
            d.out_splits = Some(vec![2, 0]);
        }
    });
    assert!(validate_all(&all, &caps()).is_ok());
    let mut s = call(CallOp::Send, 0, f32(&[4]));
    s.peer = Some(1);
    let mut r = CallDesc::new(CallOp::Recv, Variant::Out, 1);
    r.outputs.push(f32(&[2, 2]));
    r.peer = Some(0);
    assert!(validate_pair(&s, &r, 2, &caps()).is_ok());
    assert!(validate_pair(&r, &s, 2, &caps()).is_ok());
}

#[test]
fn each_local_rule_broken_once_names_its_kind() {
    let ws = 2;
    let mut g = CallDesc::new(CallOp::NewGroup, Variant::Out, 0);
    for l in [vec![], vec![0, 0], vec![0, 2]] {
        g.group = Some(l);
        assert_eq!(kind_local(&g, ws), K::BadGroup);
    }
    let mut s = call(CallOp::Send, 0, f32(&[4]));
    for p in [None, Some(0), Some(2)] {
        s.peer = p;
        assert_eq!(kind_local(&s, ws), K::BadPeer);
    }
    for op in [CallOp::Broadcast, CallOp::Reduce, CallOp::Gather, CallOp::Scatter] {
        let mut d = call(op, 0, f32(&[4]));
        d.root = Some(2);
        assert_eq!(kind_local(&d, ws), K::BadRoot, "{op:?}");
    }
    let mut p = call(CallOp::Permute, 0, f32(&[4]));
    for l in [vec![0, 0], vec![0, 2], vec![1, 0, 2]] {
        p.perm = Some(l);
        assert_eq!(kind_local(&p, ws), K::BadPermutation);
    }
    let mut a = call(CallOp::AllToAll, 0, f32(&[4]));
    a.in_splits = Some(vec![2, 1, 1]);
    assert_eq!(kind_local(&a, ws), K::BadSplits);
    let mut d = ar();
    d.reduce = Some(ReduceOp::BXor);
    assert_eq!(kind_local(&d, ws), K::UnsupportedDType);
    let mut d = call(CallOp::AllReduce, 0, t(DType::I32, &[4]));
    d.reduce = Some(ReduceOp::PremulSum(2.0));
    assert_eq!(kind_local(&d, ws), K::UnsupportedDType);
    let mut few = caps();
    few.dtypes.retain(|x| *x != DType::F32);
    assert_eq!(validate_local(&ar(), ws, &few).unwrap_err().kind, K::UnsupportedDType);
    let mut gap = caps();
    gap.gaps.push(crate::Gap::reduce("sum", "no sums here"));
    let e = validate_local(&ar(), ws, &gap).unwrap_err();
    assert_eq!((e.kind, e.detail.contains("no sums here")), (K::UnsupportedOp, true));
    for op in [CallOp::ReduceScatter, CallOp::Scatter, CallOp::AllToAll] {
        let mut d = call(op, 0, f32(&[]));
        d.root = Some(0);
        assert_eq!(kind_local(&d, ws), K::ZeroDim, "{op:?}");
        d.inputs[0] = f32(&[3]);
        assert_eq!(kind_local(&d, ws), K::Indivisible, "{op:?}");
    }
    let mut a = call(CallOp::AllToAll, 0, f32(&[4]));
    a.in_splits = Some(vec![1, 2]);
    assert_eq!(kind_local(&a, ws), K::BadSplits);
    let mut o = call(CallOp::AllGather, 0, f32(&[4]));
    o.variant = Variant::OutBuf;
    o.outputs.push(t(DType::F64, &[8]));
    assert_eq!(kind_local(&o, ws), K::DTypeMismatch);
    o.outputs[0] = f32(&[9]);
    assert_eq!(kind_local(&o, ws), K::OutBufferSize);
    o.outputs[0] = f32(&[2, 4]);
    o.aliased = true;
    assert_eq!(kind_local(&o, ws), K::Aliasing);
    let mut rs = call(CallOp::ReduceScatter, 0, f32(&[4]));
    rs.reduce = Some(ReduceOp::Sum);
    rs.outputs.push(f32(&[3]));
    assert_eq!(kind_local(&rs, ws), K::OutBufferSize);
}

#[test]
fn each_cross_rank_rule_broken_once_names_its_kind() {
    let b = ar();
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.op = CallOp::Broadcast;
            d.root = Some(0);
            d.reduce = None
        })),
        K::OpMismatch
    );
    assert_eq!(kind_all(&world(2, &b, |r, d| d.seq = r as u64)), K::OpMismatch);
    assert_eq!(kind_all(&world(2, &b, |r, d| d.inputs.extend((0..r).map(|_| f32(&[4]))))), K::CountMismatch);
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.reduce = Some(ReduceOp::Max)
        })),
        K::ReduceOpMismatch
    );
    let pm = |f: f64| Some(ReduceOp::PremulSum(f));
    assert_eq!(kind_all(&world(2, &b, |r, d| d.reduce = pm(1.0 + r as f64))), K::ReduceOpMismatch);
    for op in [CallOp::Broadcast, CallOp::Reduce, CallOp::Gather, CallOp::Scatter] {
        let mut x = call(op, 0, f32(&[4]));
        x.reduce = (op == CallOp::Reduce).then_some(ReduceOp::Sum);
        assert_eq!(kind_all(&world(2, &x, |r, d| d.root = Some(r))), K::BadRoot, "{op:?}");
    }
    let p = call(CallOp::Permute, 0, f32(&[4]));
    assert_eq!(kind_all(&world(2, &p, |r, d| d.perm = Some(if r == 0 { vec![0, 1] } else { vec![1, 0] }))), K::BadPermutation);
    let g = CallDesc::new(CallOp::NewGroup, Variant::Out, 0);
    assert_eq!(kind_all(&world(2, &g, |r, d| d.group = Some(vec![r]))), K::BadGroup);
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.inputs[0].dtype = DType::F64
        })),
        K::DTypeMismatch
    );
    assert_eq!(kind_all(&world(2, &b, |r, d| d.inputs[0].shape = vec![4 + r])), K::ShapeMismatch);
    let a = call(CallOp::AllToAll, 0, f32(&[4, 2]));
    assert_eq!(kind_all(&world(2, &a, |r, d| d.inputs[0].shape = vec![4, 2 + r])), K::ShapeMismatch);
    assert!(validate_all(&world(2, &a, |r, d| d.inputs[0].shape = vec![2 + 2 * r, 2]), &caps()).is_err());
    let split = world(2, &a, |r, d| {
        d.in_splits = Some(if r == 0 { vec![3, 1] } else { vec![2, 2] });
        // Rank 0's output splits are right ([3, 2]); rank 1 claims the same, but should say [1, 2].
        let _ = r;
        d.out_splits = Some(vec![3, 2]);
    });
    assert_eq!(kind_all(&split), K::SplitMismatch);
}

#[test]
fn send_recv_pairs() {
    let mut s = call(CallOp::Send, 0, f32(&[4]));
    s.peer = Some(1);
    let mut r = CallDesc::new(CallOp::Recv, Variant::Out, 1);
    r.outputs.push(f32(&[4]));
    r.peer = Some(0);
    let k = |a: &CallDesc, b: &CallDesc| validate_pair(a, b, 3, &caps()).unwrap_err().kind;
    let mut s2 = s.clone();
    s2.rank = 1;
    s2.peer = Some(0);
    assert_eq!(k(&s, &s2), K::OpMismatch);
    let mut r2 = r.clone();
    r2.peer = Some(2);
    assert_eq!(k(&s, &r2), K::BadPeer);
    r2 = r.clone();
    r2.outputs[0].dtype = DType::I32;
    assert_eq!(k(&s, &r2), K::DTypeMismatch);
    r2 = r.clone();
    r2.outputs[0] = f32(&[3]);
    assert_eq!((k(&s, &r2), k(&r2, &s)), (K::OutBufferSize, K::OutBufferSize));
    // A local error of either side first: the lower rank's.
    let mut bad_s = s.clone();
    bad_s.peer = Some(0);
    r2.peer = Some(5);
    assert_eq!(k(&bad_s, &r2), K::BadPeer);
    assert!(validate_pair(&bad_s, &r2, 3, &caps()).unwrap_err().detail.starts_with("rank 0"));
}

#[test]
fn precedence_when_two_rules_are_broken() {
    let ws = 2;
    // Local order: root before reduce op, reduce op before zero-dim, zero-dim before
    // indivisible, output dtype before output size, output size before aliasing.
    let mut d = call(CallOp::Reduce, 0, f32(&[4]));
    d.reduce = Some(ReduceOp::BAnd);
    d.root = Some(7);
    assert_eq!(kind_local(&d, ws), K::BadRoot);
    let mut rs = call(CallOp::ReduceScatter, 0, f32(&[]));
    rs.reduce = Some(ReduceOp::BOr);
    assert_eq!(kind_local(&rs, ws), K::UnsupportedDType);
    rs.reduce = Some(ReduceOp::Sum);
    assert_eq!(kind_local(&rs, ws), K::ZeroDim);
    let mut a = call(CallOp::AllToAll, 0, f32(&[5]));
    a.in_splits = Some(vec![5]);
    assert_eq!(kind_local(&a, ws), K::BadSplits, "split length before divisibility");
    let mut o = call(CallOp::AllGather, 0, f32(&[4]));
    o.outputs.push(t(DType::F64, &[3]));
    o.aliased = true;
    assert_eq!(kind_local(&o, ws), K::DTypeMismatch);
    o.outputs[0].dtype = DType::F32;
    assert_eq!(kind_local(&o, ws), K::OutBufferSize);
    // A local error on any rank beats every cross-rank rule, and the lowest rank's wins.
    let b = ar();
    let all = world(2, &b, |r, d| {
        d.inputs[0].shape = vec![4 + r];
        if r == 1 {
            d.reduce = Some(ReduceOp::BXor);
            d.op = CallOp::AllReduce;
        }
    });
    assert_eq!(kind_all(&all), K::UnsupportedDType);
    let all = world(2, &call(CallOp::Broadcast, 0, f32(&[4])), |r, d| {
        d.root = Some(if r == 0 { 9 } else { 0 });
        d.inputs[0].dtype = if r == 0 { DType::F32 } else { DType::I8 };
    });
    assert_eq!(kind_all(&all), K::BadRoot);
    // Cross order: op, count, reduce op, root, permutation, dtype, shape, splits.
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.op = CallOp::AllGather;
            d.inputs.push(f32(&[1]))
        })),
        K::OpMismatch
    );
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.reduce = Some(ReduceOp::Max);
            d.inputs.push(f32(&[1]))
        })),
        K::CountMismatch
    );
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.reduce = Some(ReduceOp::Max);
            d.inputs[0] = t(DType::F64, &[5])
        })),
        K::ReduceOpMismatch
    );
    let mut red = call(CallOp::Reduce, 0, f32(&[4]));
    red.reduce = Some(ReduceOp::Sum);
    assert_eq!(
        kind_all(&world(2, &red, |r, d| {
            d.root = Some(r);
            d.inputs[0] = t(DType::F64, &[4 + r])
        })),
        K::BadRoot
    );
    assert_eq!(
        kind_all(&world(2, &b, |r, d| if r == 1 {
            d.inputs[0] = t(DType::F64, &[5])
        })),
        K::DTypeMismatch
    );
    let a = call(CallOp::AllToAll, 0, f32(&[4, 2]));
    let all = world(2, &a, |r, d| {
        d.inputs[0].shape = vec![4, 2 + r];
        d.in_splits = Some(if r == 0 { vec![3, 1] } else { vec![2, 2] });
        d.out_splits = Some(vec![3, 2]);
    });
    assert_eq!(kind_all(&all), K::ShapeMismatch);
}

#[test]
fn descriptions_round_trip_through_words() {
    let mut d = call(CallOp::AllToAll, 3, f32(&[5, 2]));
    d.variant = Variant::CoalescedInPlace;
    d.seq = 77;
    d.inputs.push(t(DType::BF16, &[]));
    d.outputs.push(t(DType::U8, &[1, 2, 3]));
    d.reduce = Some(ReduceOp::PremulSum(0.25));
    d.root = Some(2);
    d.peer = Some(1);
    d.in_splits = Some(vec![2, 3]);
    d.out_splits = None;
    d.perm = Some(vec![]);
    d.group = Some(vec![4, 1]);
    d.aliased = true;
    let mut w = d.encode();
    assert_eq!(CallDesc::decode(&w), Some(d.clone()));
    w.extend([9, 9, 9]);
    assert_eq!(CallDesc::decode(&w), Some(d.clone()), "trailing words are ignored");
    for cut in 0..w.len() - 3 {
        assert_eq!(CallDesc::decode(&w[..cut]), None, "truncated at {cut}");
    }
    assert_eq!(CallDesc::decode(&[99]), None);
    for op in CallOp::ALL {
        let g = CallDesc::new(op, Variant::Out, 0);
        assert_eq!(CallDesc::decode(&g.encode()), Some(g));
    }
    let mut f = CallDesc::new(CallOp::FusedAllGatherMatmul, Variant::Out, 1);
    f.fused = Some(crate::call::FusedArgs { dim: 2, scales: Some((0, vec![16, 0])), out_dtype: Some(DType::BF16) });
    let w = f.encode();
    assert_eq!(CallDesc::decode(&w), Some(f.clone()));
    for cut in 0..w.len() {
        assert_eq!(CallDesc::decode(&w[..cut]), None, "fused, truncated at {cut}");
    }
}

#[test]
fn fused_rules_in_the_seeds_order_and_wording() {
    use crate::fused::describe;
    let caps = Capabilities::full(8);
    let a = |s: &[usize]| t(DType::F32, s);
    let ag = |ins: Vec<TensorDesc>, dim| describe(CallOp::FusedAllGatherMatmul, 0, ins, None, dim, None);
    let kind = |d: &CallDesc| validate_local(d, 2, &caps).map_err(|e| (e.kind, e.detail));
    let e = kind(&ag(vec![a(&[4]), a(&[4, 2])], 0)).unwrap_err();
    assert_eq!(e.0, BadInputKind::NotAMatrix);
    assert!(e.1.starts_with("A_shard must be a matrix"), "{}", e.1);
    let e = kind(&ag(vec![a(&[4, 3]), a(&[3])], 0)).unwrap_err();
    assert!(e.0 == BadInputKind::NotAMatrix && e.1.starts_with("B must be a matrix"), "{e:?}");
    let e = kind(&ag(vec![a(&[4, 3]), a(&[3, 2])], 2)).unwrap_err();
    assert!(e.0 == BadInputKind::BadDim && e.1.starts_with("Invalid gather_dim"), "{e:?}");
    // gather dim 1 of a 2-dim A contracts over dim 0 (the seed's fallback): b needs 4 rows.
    assert_eq!(kind(&ag(vec![a(&[4, 3]), a(&[3, 2])], 1)).unwrap_err().0, BadInputKind::ShapeMismatch);
    assert!(kind(&ag(vec![a(&[4, 3]), a(&[4, 2])], 1)).is_ok());
    let rs = |op, dim, s: &[usize]| describe(CallOp::FusedMatmulReduceScatter, 0, vec![a(s), a(&[3, 2])], Some(op), dim, None);
    let e = kind(&rs(ReduceOp::Max, 0, &[4, 3])).unwrap_err();
    assert!(e.0 == BadInputKind::BadReduceOp && e.1.starts_with("reduce_op must be sum or avg"), "{e:?}");
    assert_eq!(kind(&rs(ReduceOp::Sum, 0, &[5, 3])).unwrap_err().0, BadInputKind::Indivisible);
    assert!(kind(&rs(ReduceOp::Avg, 0, &[4, 3])).is_ok());
    // Cross-rank: dims that differ are bad_dim on every rank.
    let mut d1 = ag(vec![a(&[4, 3]), a(&[3, 2])], 0);
    d1.rank = 1;
    d1.fused.as_mut().unwrap().dim = 1;
    let d1 = CallDesc { inputs: vec![a(&[4, 3]), a(&[4, 2])], ..d1 };
    let all = [ag(vec![a(&[4, 3]), a(&[3, 2])], 0), d1];
    assert_eq!(validate_all(&all, &caps).unwrap_err().kind, BadInputKind::BadDim);
}

#[test]
fn cross_rank_messages_print_the_fields_as_before() {
    // The keys of `agree` borrow from the calls; a mismatch prints them as the owned values
    // (a reduce op as its Debug text, lists as `Vec`s) were printed.
    let detail = |all: &[CallDesc]| validate_all(all, &caps()).expect_err("should be rejected").detail;
    let premul = |a: f64, b: f64| world(2, &ar(), move |r, d| d.reduce = Some(ReduceOp::PremulSum(if r == 0 { a } else { b })));
    assert_eq!(
        detail(&premul(0.0, -0.0)),
        r#"reduce ops differ across ranks: rank 0 has Some("PremulSum(0.0)") but rank 1 has Some("PremulSum(-0.0)")"#
    );
    assert!(validate_all(&premul(f64::NAN, -f64::NAN), &caps()).is_ok(), "any NaN factor is the same text");
    assert!(validate_all(&premul(0.5, 0.5), &caps()).is_ok());
    let sum_max = world(2, &ar(), |r, d| d.reduce = Some(if r == 0 { ReduceOp::Sum } else { ReduceOp::Max }));
    assert_eq!(detail(&sum_max), r#"reduce ops differ across ranks: rank 0 has Some("Sum") but rank 1 has Some("Max")"#);
    let dtypes = world(2, &ar(), |r, d| {
        if r == 1 {
            d.inputs[0].dtype = DType::F64;
        }
    });
    assert_eq!(detail(&dtypes), "input dtypes differ across ranks: rank 0 has [F32] but rank 1 has [F64]");
    let shapes = world(3, &ar(), |r, d| {
        if r == 2 {
            d.inputs[0].shape = vec![2, 2];
        }
    });
    assert_eq!(detail(&shapes), "input shapes differ across ranks: rank 0 has [[4]] but rank 2 has [[2, 2]]");
    let mut a2a = call(CallOp::AllToAll, 0, f32(&[2, 3]));
    a2a.in_splits = Some(vec![1, 1]);
    a2a.out_splits = Some(vec![1, 1]);
    let rows = world(2, &a2a, |r, d| {
        if r == 1 {
            d.inputs[0].shape = vec![2, 4];
        }
    });
    assert_eq!(detail(&rows), "row shapes (all dims but the first) differ across ranks: rank 0 has [Some([3])] but rank 1 has [Some([4])]");
    let mut perm = call(CallOp::Permute, 0, f32(&[4]));
    perm.perm = Some(vec![1, 0]);
    let perms = world(2, &perm, |r, d| {
        if r == 1 {
            d.perm = Some(vec![0, 1]);
        }
    });
    assert_eq!(detail(&perms), "permutations (src_dst) differ across ranks: rank 0 has Some([1, 0]) but rank 1 has Some([0, 1])");
}
