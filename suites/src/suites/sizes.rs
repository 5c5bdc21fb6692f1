//! A size ladder per op: element counts sampled sparsely up to 64 MiB — powers of two and one
//! element either side of them, across the chunk and protocol boundaries real backends have
//! (KiB to MiB; pipelined CPU backends chunk at 64 K elements) — with every element of every
//! result checked, bit-exactly.
//!
//! * **Ops**: every data-moving op of the trait: all_reduce, all_gather_into_tensor,
//!   reduce_scatter_tensor, all_to_all_single (equal split), broadcast (in-place), reduce, gather,
//!   scatter, permute_tensor, send/recv. Reducing ops use `sum`; rooted ops root at rank ws-1.
//! * **`n`** in a case name (`sizes::all_reduce::f32::n65537::ws2`) is the element count per rank
//!   and per peer: the input of all_reduce / broadcast / reduce / permute / send-recv and of
//!   all_gather / gather (whose output is `ws·n`), the output of reduce_scatter / scatter /
//!   all_to_all (whose input is `ws·n`).
//! * **Ladder**: f32 at 1023, 1025, 4097, 65535, 65536, 65537, 262145 (world sizes 2 and 3), and
//!   at world size 2 only 1048575 and the 64 MiB step: the largest buffer of the op is
//!   64 MiB + one element per rank (`n` = 16777217, or 8388609 for the ops whose larger buffer is
//!   `ws·n`). bf16 and i32 at 1025, 65535, 65537 (2 and 3) and 1048577 (2). That is ~300 cases
//!   and a few seconds on the shm backend, the 64 MiB ones most of it.
//! * **Inputs** are exact by construction and cheap to make at 64 MiB: rank `r`'s element `i` is a
//!   small integer from a hash of `(seed, i)` plus `97·r` (so ranks differ at every index and no
//!   shift of the data by any number of elements goes unnoticed), in `[-63, 63]` for bf16 and
//!   `[-500001, 500001]` for f32 (a sum of up to 4 ranks is exact), any bit pattern for i32
//!   (wrapping sums). The expected result is computed in closed form from the same function
//!   ([`expected`]), which a unit test checks against the oracle at small sizes.

use super::util::here;
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use crate::values::partner;
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_fixtures::ladder::{self, Closed};
use concord_oracle::{compare, Tolerance};

/// The (op, variant)s of the ladder.
pub const OPS: [(OpKind, Variant); 10] = [
    (OpKind::AllReduce, Variant::Out),
    (OpKind::AllGatherIntoTensor, Variant::Out),
    (OpKind::ReduceScatterTensor, Variant::Out),
    (OpKind::AllToAllSingle, Variant::Out),
    (OpKind::Broadcast, Variant::InPlace),
    (OpKind::Reduce, Variant::Out),
    (OpKind::Gather, Variant::Out),
    (OpKind::Scatter, Variant::Out),
    (OpKind::PermuteTensor, Variant::Out),
    (OpKind::SendRecv, Variant::OutBuf),
];

/// The largest world the inputs stay exact for (bf16 sums of 4 values in `[-63, 63]`).
pub const MAX_WS: usize = 4;

const BIG: usize = 1 << 24;

/// Whether the op's larger buffer is `ws·n` elements (its input or its output).
fn folds(op: OpKind) -> bool {
    matches!(op, OpKind::AllGatherIntoTensor | OpKind::Gather | OpKind::ReduceScatterTensor | OpKind::Scatter | OpKind::AllToAllSingle)
}

/// The `(n, world size)`s of `op` in `dtype`.
pub fn ladder(op: OpKind, dtype: DType) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let (both, two): (&[usize], &[usize]) = match dtype {
        DType::F32 => (&[1023, 1025, 4097, 65535, 65536, 65537, 262145], &[1048575]),
        _ => (&[1025, 65535, 65537], &[1048577]),
    };
    for &n in both {
        v.push((n, 2));
        v.push((n, 3));
    }
    for &n in two {
        v.push((n, 2));
    }
    if dtype == DType::F32 {
        v.push((if folds(op) { BIG / 2 } else { BIG } + 1, 2));
    }
    v
}

/// The shape of every rank's input.
pub fn input_shape(op: OpKind, n: usize, ws: usize) -> Vec<usize> {
    if matches!(op, OpKind::ReduceScatterTensor | OpKind::Scatter | OpKind::AllToAllSingle) {
        vec![ws * n]
    } else {
        vec![n]
    }
}

/// Rank `r`'s input.
pub fn input(op: OpKind, dtype: DType, seed: u64, n: usize, ws: usize, r: usize) -> Tensor {
    ladder::tensor(dtype, seed, &input_shape(op, n, ws), Closed::From { src: r, off: 0 })
}

/// The root of rooted ops (as in the matrix) and the permutation.
fn root(ws: usize) -> usize {
    ws - 1
}

/// Rank `me`'s expected result in closed form, or `None` where it is undefined (non-root ranks
/// of reduce and gather, a send/recv rank without partner).
pub fn expected(op: OpKind, dtype: DType, seed: u64, n: usize, ws: usize, me: usize) -> Option<Tensor> {
    let (shape, what) = expected_form(op, n, ws, me)?;
    Some(ladder::tensor(dtype, seed, &shape, what))
}

/// [`expected`] as a shape and the closed form of its element `k` (generated and checked by
/// `concord_fixtures::ladder`, which keeps the loops over 16 M elements optimised).
fn expected_form(op: OpKind, n: usize, ws: usize, me: usize) -> Option<(Vec<usize>, Closed)> {
    let src = root(ws);
    Some(match op {
        OpKind::AllReduce => (vec![n], Closed::Sum { ws, off: 0 }),
        OpKind::Reduce if me == src => (vec![n], Closed::Sum { ws, off: 0 }),
        OpKind::AllGatherIntoTensor => (vec![ws * n], Closed::Blocks { n, off: 0 }),
        OpKind::Gather if me == src => (vec![ws * n], Closed::Blocks { n, off: 0 }),
        OpKind::ReduceScatterTensor => (vec![n], Closed::Sum { ws, off: me * n }),
        OpKind::AllToAllSingle => (vec![ws * n], Closed::Blocks { n, off: me * n }),
        OpKind::Broadcast => (vec![n], Closed::From { src, off: 0 }),
        OpKind::Scatter => (vec![n], Closed::From { src, off: me * n }),
        // permute, send/recv: the source's input
        OpKind::PermuteTensor => (vec![n], Closed::From { src: (me + ws - 1) % ws, off: 0 }),
        OpKind::SendRecv => (vec![n], Closed::From { src: partner(me, ws)?, off: 0 }),
        _ => return None,
    })
}

/// Name of a ladder case (without backend prefix).
pub fn case_name(op: OpKind, dtype: DType, n: usize, ws: usize) -> String {
    format!("sizes::{op}::{dtype}::n{n}::ws{ws}")
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for (op, variant) in OPS {
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            for (n, ws) in ladder(op, dtype) {
                let name = case_name(op, dtype, n, ws);
                let meta = CaseMeta {
                    suite: "sizes".into(),
                    op: op.name().into(),
                    variant: variant.name().into(),
                    dtype: dtype.name().into(),
                    reduce: if op.reduces() { "sum".into() } else { String::new() },
                };
                let seed = concord_fixtures::seed_for(&name);
                let c = Case::new(name, meta, ws, move |ctx| run(ctx, op, variant, dtype, n, seed));
                // The MiB steps take most of the suite's time: started first.
                out.push(if n >= 1 << 20 { c.heavy() } else { c });
            }
        }
    }
    out
}

fn run<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant, dtype: DType, n: usize, seed: u64) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    let w = format!("{} reduce={} n={n}", here(b, op.name(), variant.name(), dtype), if reduce.is_some() { "sum" } else { "-" });
    let fail = |what: String| CaseEnd::Fail(format!("{w}: {what}"));
    if ws > MAX_WS {
        return Err(CaseEnd::Skip(format!("the size ladder's inputs are exact up to world size {MAX_WS}")));
    }
    if let Err(reason) = b.capabilities().check(op, Some(variant), Some(dtype), reduce, ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let mut p = Params { reduce, root: root(ws), ..Default::default() };
    p.src_dst = (0..ws).map(|r| (r + 1) % ws).collect();
    p.peer = partner(me, ws);
    let x = b.upload(&input(op, dtype, seed, n, ws, me)).map_err(|e| fail(format!("upload: {e}")))?;
    let out = if op == OpKind::SendRecv { Some(b.alloc(dtype, &[n]).map_err(|e| fail(format!("alloc: {e}")))?) } else { None };
    let res = exec::call(b, op, variant, std::slice::from_ref(&x), out.as_ref(), &p, ctx.timeout)
        .map_err(|e| fail(format!("{e} [{}]", e.name())))?;
    let Some(res) = res.first() else { return Err(fail("returned no result".into())) };
    if variant == Variant::InPlace && b.buffer_addr(res) != b.buffer_addr(&x) {
        return Err(fail("in-place op returned a different buffer".into()));
    }
    let Some((shape, what)) = expected_form(op, n, ws, me) else { return Ok(()) };
    if !b.capabilities().moves_data {
        return Ok(());
    }
    let got = b.download(res).map_err(|e| fail(format!("download: {e}")))?;
    // Element by element against the closed form (fast at 64 MiB, no expected tensor made); on a
    // difference, the oracle's comparison with the expected tensor names the first bad element.
    if !ladder::holds(&got, dtype, seed, &shape, what) {
        let exp = ladder::tensor(dtype, seed, &shape, what);
        return Err(match compare(&got, &exp, Tolerance::Exact) {
            Err(m) => fail(m.to_string()),
            Ok(()) => fail("result differs from the expected one in its bytes, though not in value".into()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_oracle::{Collective, Semantics};

    fn collective(op: OpKind, ws: usize) -> Collective {
        let p = crate::exec::Params { root: root(ws), src_dst: (0..ws).map(|r| (r + 1) % ws).collect(), ..Default::default() };
        crate::exec::collective(op, &p, ws).expect("the ladder's ops move data")
    }

    #[test]
    fn closed_form_matches_the_oracle() {
        for (op, _) in OPS {
            for dtype in [DType::F32, DType::BF16, DType::I32] {
                for ws in 1..=MAX_WS {
                    for n in [1, 37, 130] {
                        let seed = 0x5EED ^ n as u64;
                        let ins: Vec<Tensor> = (0..ws).map(|r| input(op, dtype, seed, n, ws, r)).collect();
                        let exp = concord_oracle::expected(&collective(op, ws), &ins, &Semantics::default()).unwrap();
                        for me in 0..ws {
                            match expected(op, dtype, seed, n, ws, me) {
                                Some(t) => {
                                    assert!(exp.defined[me], "{op} {dtype} ws{ws} rank {me}: defined");
                                    assert_eq!(t, exp.outputs[me], "{op} {dtype} n{n} ws{ws} rank {me}");
                                    // The in-place check accepts exactly that tensor.
                                    let (shape, what) = expected_form(op, n, ws, me).unwrap();
                                    let holds = |t: &Tensor, shape: &[usize]| ladder::holds(t, dtype, seed, shape, what);
                                    assert!(holds(&t, &shape), "{op} {dtype} n{n} ws{ws} rank {me}: holds");
                                    let mut bad = t.clone();
                                    let last = bad.len_bytes() - 1;
                                    bad.bytes_mut()[last] ^= 0x40;
                                    assert!(!holds(&bad, &shape), "{op} {dtype} n{n} ws{ws} rank {me}: a changed element holds");
                                    assert!(!holds(&t.clone().reshaped(&[1, t.numel()]), &shape), "{op} {dtype}: another shape holds");
                                }
                                None => assert!(!exp.defined[me] || op == OpKind::SendRecv, "{op} {dtype} ws{ws} rank {me}"),
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_differ_at_every_index_and_sums_stay_exact() {
        for dtype in [DType::F32, DType::BF16] {
            for i in 0..5000 {
                let vs: Vec<i64> = (0..MAX_WS).map(|r| ladder::value(dtype, 7, r, i)).collect();
                for a in 0..MAX_WS {
                    for c in a + 1..MAX_WS {
                        assert_ne!(vs[a], vs[c]);
                    }
                }
                let bound = if dtype == DType::BF16 { 256 } else { 1 << 24 };
                assert!(vs.iter().map(|v| v.abs()).sum::<i64>() <= bound);
            }
        }
    }
}
