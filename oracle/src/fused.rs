//! Expected results of the fused communication + compute ops (`concord_core::fused`): every
//! rank's outputs from every rank's inputs, by the unfused decomposition written out
//! coordinate by coordinate (an implementation independent of the one in `concord-core`):
//! each product element summed in f64 and rounded once to the output dtype; a reduce-scatter
//! sums every rank's rounded product in f64 and rounds once. Sums start from +0, as BLAS
//! accumulators do: a product sum that is exactly zero is +0, even when every product is -0.
//!
//! # Tolerances ([`fused_tolerance`])
//! * Exact-by-construction inputs (small integers, power-of-two scales, `|sum| <= 256`, so that
//!   every product, partial sum and result is a small integer exact in bf16, f16 and f32):
//!   bit-exact, every dtype. Any accumulation order gives the same bits.
//! * Random inputs in `[-1, 1]` (scales in `[0.5, 2]`, `s` their largest product): a backend may
//!   accumulate in f32 (`γ_K ≤ K·2^-24` relative to `Σ|a||b| ≤ K`, so `abs = s·K²·2^-24`; f64
//!   inputs accumulate in f64, `abs = s·K²·2^-53`: an f64 result through an f32 kernel fails) and
//!   then round once, which can land one ulp of the output dtype away from the f64 result's
//!   rounding (`rel = eps(out)`); a reduce-scatter adds up `ws` such rounded blocks
//!   (`abs += s·ws·K·eps(out)`). For bf16 at K = 32 that is about `rel 7.8e-3` — below the
//!   seed's `rtol = atol = 1e-2`, which it justifies: bf16 has 8 significant bits.

use crate::check::Tolerance;
use concord_core::fused::{describe, moved_shape};
use concord_core::{BadInput, CallOp, Capabilities, DType, ReduceOp, Scale, Scaling, Tensor, TensorDesc};

/// One fused call, as every rank makes it.
#[derive(Clone, Debug, PartialEq)]
pub enum FusedCall {
    AllGatherMatmul { dim: usize, scaling: Option<Scaling> },
    MatmulReduceScatter { op: ReduceOp, dim: usize, scaling: Option<Scaling> },
    LowContentionAllGather,
    LowContentionReduceScatter { op: ReduceOp },
}

impl FusedCall {
    pub fn op(&self) -> CallOp {
        match self {
            FusedCall::AllGatherMatmul { .. } => CallOp::FusedAllGatherMatmul,
            FusedCall::MatmulReduceScatter { .. } => CallOp::FusedMatmulReduceScatter,
            FusedCall::LowContentionAllGather => CallOp::LowContentionAllGather,
            FusedCall::LowContentionReduceScatter { .. } => CallOp::LowContentionReduceScatter,
        }
    }
    /// The op's name, `_scaled` inserted for the scaled variants.
    pub fn name(&self) -> &'static str {
        match self {
            FusedCall::AllGatherMatmul { scaling: Some(_), .. } => "fused_all_gather_scaled_matmul",
            FusedCall::MatmulReduceScatter { scaling: Some(_), .. } => "fused_scaled_matmul_reduce_scatter",
            c => c.op().name(),
        }
    }
    pub fn scaling(&self) -> Option<&Scaling> {
        match self {
            FusedCall::AllGatherMatmul { scaling, .. } | FusedCall::MatmulReduceScatter { scaling, .. } => scaling.as_ref(),
            _ => None,
        }
    }
}

/// Rank `r`'s inputs: `a` (or `x`), then every `b`; `a_scale` for the scaled variants (each rank
/// its own; `b` scales are in the call's [`Scaling`]).
#[derive(Clone, Debug)]
pub struct FusedInputs {
    pub a: Tensor,
    pub bs: Vec<Tensor>,
    pub a_scale: Option<Scale>,
}

fn flat(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (x, s)| acc * s + x)
}

/// The coordinates of flat index `i` in `shape`, into `c` (`shape.len()` long).
fn coords_into(mut i: usize, shape: &[usize], c: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
}

fn round(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
    let size = dtype.size();
    let mut bytes = Vec::with_capacity(v.len() * size);
    for x in v {
        bytes.extend_from_slice(&crate::round_f64_bits(dtype, *x).to_le_bytes()[..size]);
    }
    Tensor::from_bytes(dtype, shape, &bytes)
}

/// `x` rounded once to the float `dtype`, as f64 (what [`round`] stores, read back).
fn rounded(dtype: DType, x: f64) -> f64 {
    let bits = crate::round_f64_bits(dtype, x);
    match dtype {
        DType::F32 => f32::from_bits(bits as u32) as f64,
        DType::F16 => concord_core::half::f16::from_bits(bits as u16).to_f64(),
        DType::BF16 => concord_core::half::bf16::from_bits(bits as u16).to_f64(),
        _ => f64::from_bits(bits),
    }
}

/// Every rank's outputs (index = rank): all-gather-matmul `[ag, out_0, ..]`, the others
/// `[out]`; or the named bad-input error every rank MUST report.
pub fn expected_fused(call: &FusedCall, inputs: &[FusedInputs], caps: &Capabilities) -> Result<Vec<Vec<Tensor>>, BadInput> {
    expected_fused_for(call, inputs, caps, None)
}

/// [`expected_fused`] computing the outputs of rank `only` alone (the others' are left empty):
/// what one rank of a case needs.
pub fn expected_fused_for(
    call: &FusedCall,
    inputs: &[FusedInputs],
    caps: &Capabilities,
    only: Option<usize>,
) -> Result<Vec<Vec<Tensor>>, BadInput> {
    let ws = inputs.len();
    let (reduce, dim) = match call {
        FusedCall::AllGatherMatmul { dim, .. } => (None, *dim),
        FusedCall::MatmulReduceScatter { op, dim, .. } => (Some(*op), *dim),
        FusedCall::LowContentionAllGather => (None, 0),
        FusedCall::LowContentionReduceScatter { op } => (Some(*op), 0),
    };
    let descs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(r, x)| {
            let mut ins = vec![TensorDesc::new(x.a.dtype(), x.a.shape())];
            ins.extend(x.bs.iter().map(|b| TensorDesc::new(b.dtype(), b.shape())));
            let mut sc = call.scaling().cloned();
            if let (Some(s), Some(a)) = (sc.as_mut(), &x.a_scale) {
                s.a = a.clone();
            }
            describe(call.op(), r, ins, reduce, dim, sc.as_ref())
        })
        .collect();
    concord_core::validate_all(&descs, caps)?;
    Ok(match call {
        FusedCall::AllGatherMatmul { dim, scaling } => ag_matmul(inputs, *dim, scaling.as_ref(), only),
        FusedCall::MatmulReduceScatter { op, dim, scaling } => matmul_rs(inputs, *op, *dim, scaling.as_ref(), only),
        FusedCall::LowContentionAllGather => {
            let row: Vec<usize> = inputs[0].a.shape()[1..].to_vec();
            let parts: Vec<Tensor> = inputs.iter().map(|x| x.a.clone()).collect();
            let gathered = Tensor::cat_rows(inputs[0].a.dtype(), &row, &parts);
            (0..ws).map(|q| if only.is_some_and(|o| o != q) { vec![] } else { vec![gathered.clone()] }).collect()
        }
        FusedCall::LowContentionReduceScatter { op } => {
            let x0 = &inputs[0].a;
            let rows = x0.shape()[0] / ws;
            let n = x0.numel() / ws;
            let mut shape = x0.shape().to_vec();
            shape[0] = rows;
            let mut col = Vec::with_capacity(n);
            (0..ws)
                .map(|r| {
                    if only.is_some_and(|o| o != r) {
                        return vec![];
                    }
                    // Each element summed from +0 in rank order (the element-wise fold), every
                    // rank's chunk read with one dtype dispatch.
                    let mut v = vec![0.0f64; n];
                    for x in inputs {
                        col.clear();
                        floats_of(&x.a, r * n, (r + 1) * n, &mut col);
                        v.iter_mut().zip(&col).for_each(|(s, x)| *s += x);
                    }
                    if *op == ReduceOp::Avg {
                        v.iter_mut().for_each(|s| *s /= ws as f64);
                    }
                    vec![round(x0.dtype(), &shape, &v)]
                })
                .collect()
        }
    })
}

fn ag_matmul(inputs: &[FusedInputs], g: usize, scaling: Option<&Scaling>, only: Option<usize>) -> Vec<Vec<Tensor>> {
    let ws = inputs.len();
    let s = inputs[0].a.shape().to_vec();
    let nd = s.len();
    let sg = s[g];
    let mut ag_shape = s.clone();
    ag_shape[g] *= ws;
    // The gathered tensor: element at ag coords c comes from rank c[g] / s_g at c[g] % s_g;
    // `l` receives the coords in that rank's shard.
    let a_vals: Vec<Vec<f64>> = inputs
        .iter()
        .map(|x| {
            let mut v = Vec::with_capacity(x.a.numel());
            floats_of(&x.a, 0, x.a.numel(), &mut v);
            v
        })
        .collect();
    let ag_val = |c: &[usize], l: &mut [usize]| {
        l.copy_from_slice(c);
        let r = l[g] / sg;
        l[g] %= sg;
        (r, a_vals[r][flat(l, &s)])
    };
    let ag_n: usize = ag_shape.iter().product();
    let es = inputs[0].a.dtype().size();
    let (mut c, mut l) = (vec![0; nd], vec![0; nd]);
    let mut ag_bits: Vec<u8> = Vec::with_capacity(ag_n * es);
    for i in 0..ag_n {
        coords_into(i, &ag_shape, &mut c);
        let (r, _) = ag_val(&c, &mut l);
        let off = flat(&l, &s) * es;
        ag_bits.extend_from_slice(&inputs[r].a.bytes()[off..off + es]);
    }
    let ag = Tensor::from_bytes(inputs[0].a.dtype(), &ag_shape, &ag_bits);
    let ms = moved_shape(&s, g); // shard's moved shape [s_g, .., k]
    let k = ms[nd - 1];
    // A' = movedim(ag, g, 0) as a dense [rows, k] f64 matrix, with each row's source rank and
    // its row in that rank's moved shard (for row scales).
    let mut full = ms.clone();
    full[0] *= ws;
    let rows: usize = full[..nd - 1].iter().product();
    let mut a_mat = vec![0.0f64; rows * k];
    let mut row_src = vec![(0usize, 0usize); rows];
    let mut m = vec![0; nd];
    let mut row = vec![0; nd - 1];
    for (idx, slot) in a_mat.iter_mut().enumerate() {
        coords_into(idx, &full, &mut m);
        // c = m[1..] with m[0] inserted at g
        c[..g].copy_from_slice(&m[1..=g]);
        c[g] = m[0];
        c[g + 1..].copy_from_slice(&m[g + 1..]);
        let (r, v) = ag_val(&c, &mut l);
        *slot = v;
        if m[nd - 1] == 0 {
            row[0] = m[0] % sg;
            row[1..].copy_from_slice(&m[1..nd - 1]);
            row_src[idx / k.max(1)] = (r, flat(&row, &ms[..nd - 1]));
        }
    }
    (0..ws)
        .map(|q| {
            if only.is_some_and(|o| o != q) {
                return vec![];
            }
            let mut outs = vec![ag.clone()];
            for (bi, b) in inputs[q].bs.iter().enumerate() {
                let n = b.shape()[1];
                // b transposed ([n, k]): each dot product below walks both operands contiguously
                // (the same products, summed in the same order, as down b's column).
                let bt = transposed(b, k, n);
                // Moved output [ws*s_g, ms[1..nd-1].., n]; final = movedim(0, g).
                let mut mo = full.clone();
                mo[nd - 1] = n;
                let mut fin = mo[1..].to_vec();
                fin.insert(g, mo[0]);
                let total: usize = fin.iter().product();
                let (mut o, mut m) = (vec![0; nd], vec![0; nd]);
                let mut v: Vec<f64> = Vec::with_capacity(total);
                for i in 0..total {
                    coords_into(i, &fin, &mut o);
                    // m = o[g], then o without its g-th coordinate
                    m[0] = o[g];
                    m[1..=g].copy_from_slice(&o[..g]);
                    m[g + 1..].copy_from_slice(&o[g + 1..]);
                    let j = m[nd - 1];
                    let row = flat(&m[..nd - 1], &mo[..nd - 1]);
                    // Accumulated from +0 like every BLAS: a sum of -0 products is +0.
                    let (a_row, b_col) = (&a_mat[row * k..(row + 1) * k], &bt[j * k..(j + 1) * k]);
                    let mut acc: f64 = a_row.iter().zip(b_col).fold(0.0, |acc, (x, y)| acc + x * y);
                    if let Some(sc) = scaling {
                        let (src, ri) = row_src[row];
                        let sa = inputs[src].a_scale.as_ref().unwrap_or(&sc.a);
                        acc *= sa.at(ri) * sc.b[bi].at(j);
                    }
                    v.push(acc);
                }
                let dt = scaling.map_or(b.dtype(), |s| s.out_dtype);
                outs.push(round(dt, &fin, &v));
            }
            outs
        })
        .collect()
}

/// Elements `lo..hi` of a float tensor as f64 (exact), appended to `dst`: one dtype dispatch
/// for the run, where [`Tensor::get_f64`] dispatches per element.
fn floats_of(t: &Tensor, lo: usize, hi: usize, dst: &mut Vec<f64>) {
    concord_core::dispatch_dtype!(t.dtype(), T => dst.extend(t.as_slice::<T>()[lo..hi].iter().map(|x| <T as concord_core::Element>::to_f64(*x))));
}

/// `b` (`[k, n]`) transposed to `[n, k]`, as f64: each dot product then walks both operands
/// contiguously (the same products, summed in the same order, as down b's column).
fn transposed(b: &Tensor, k: usize, n: usize) -> Vec<f64> {
    let mut flat = Vec::with_capacity(k * n);
    floats_of(b, 0, k * n, &mut flat);
    (0..n * k).map(|t| flat[(t % k) * n + t / k]).collect()
}

fn matmul_rs(inputs: &[FusedInputs], op: ReduceOp, d: usize, scaling: Option<&Scaling>, only: Option<usize>) -> Vec<Vec<Tensor>> {
    let ws = inputs.len();
    let s = inputs[0].a.shape().to_vec();
    let nd = s.len();
    let k = s[nd - 1];
    let n = inputs[0].bs[0].shape()[1];
    let mut c_shape = s.clone();
    c_shape[nd - 1] = n;
    let dt = scaling.map_or(inputs[0].a.dtype(), |s| s.out_dtype);
    // Every rank's product, each element rounded once to the output dtype (the seed's fallback
    // computes C in the output dtype before the reduce-scatter); an element of C belongs to one
    // rank's chunk, so each is computed when that chunk is (once in all, only the chunk of rank
    // `only` when given). A chunk is walked row by row of C (`[.., n]`): each rank's row of `a`
    // is read once per row, as f64, and only the rows of the chunk are read.
    let bts: Vec<Vec<f64>> = inputs.iter().map(|x| transposed(&x.bs[0], k, n)).collect();
    let mut out_shape = c_shape.clone();
    out_shape[d] /= ws;
    let total: usize = out_shape.iter().product();
    let width = out_shape[nd - 1];
    let out_rows = total.checked_div(width).unwrap_or(0);
    let mut a_rows: Vec<f64> = Vec::with_capacity(ws * k);
    (0..ws)
        .map(|r| {
            if only.is_some_and(|o| o != r) {
                return vec![];
            }
            let mut c = vec![0; nd];
            let mut v: Vec<f64> = Vec::with_capacity(total);
            for q in 0..out_rows {
                // The chunk's row q is C's row `row`, columns j0..j0 + width.
                coords_into(q * width, &out_shape, &mut c);
                c[d] += r * out_shape[d];
                let row = flat(&c, &c_shape) / n;
                let j0 = c[nd - 1];
                a_rows.clear();
                for x in inputs {
                    floats_of(&x.a, row * k, (row + 1) * k, &mut a_rows);
                }
                for j in j0..j0 + width {
                    let mut sum = 0.0;
                    for (x, bt) in bts.iter().enumerate() {
                        let mut acc = 0.0;
                        for (a, b) in a_rows[x * k..(x + 1) * k].iter().zip(&bt[j * k..(j + 1) * k]) {
                            acc += a * b;
                        }
                        if let Some(sc) = scaling {
                            acc *= inputs[x].a_scale.as_ref().unwrap_or(&sc.a).at(row) * sc.b[0].at(j);
                        }
                        sum += rounded(dt, acc);
                    }
                    v.push(if op == ReduceOp::Avg { sum / ws as f64 } else { sum });
                }
            }
            vec![round(dt, &out_shape, &v)]
        })
        .collect()
}

/// The tolerance for a fused op's products (module docs): exact on exact-by-construction
/// inputs; otherwise a bound from the input dtype (which sets the accumulator's: f64 for f64,
/// f32 for the others), the contraction length `k`, the world size, the output dtype and the
/// largest scale product `scale`. The all-gathered tensor is always exact.
pub fn fused_tolerance(input: DType, out: DType, k: usize, ws: usize, reduce_scatter: bool, scale: f64, exact_inputs: bool) -> Tolerance {
    if exact_inputs {
        return Tolerance::Exact;
    }
    let k = k.max(1) as f64;
    let eps = out.epsilon();
    let acc = if input == DType::F64 { f64::EPSILON } else { f32::EPSILON as f64 };
    let mut abs = scale * k * k * acc / 2.0 + eps;
    if reduce_scatter {
        abs += scale * ws as f64 * k * eps;
    }
    Tolerance::Bound { abs, rel: eps }
}

/// The element-by-element implementations these replaced (as they were before the oracle read
/// its operands row by row, one dtype dispatch per run): the new ones must give the same bits.
#[cfg(test)]
mod reference {
    use super::*;

    /// The low-contention reduce-scatter as it was: every rank's chunk, `get_f64` per element.
    pub(super) fn low_contention_rs(inputs: &[FusedInputs], op: ReduceOp) -> Vec<Vec<Tensor>> {
        let ws = inputs.len();
        let x0 = &inputs[0].a;
        let rows = x0.shape()[0] / ws;
        (0..ws)
            .map(|r| {
                let mut shape = x0.shape().to_vec();
                shape[0] = rows;
                let n = x0.numel() / ws;
                let v: Vec<f64> = (0..n)
                    .map(|i| {
                        let s: f64 = inputs.iter().fold(0.0, |s, x| s + x.a.get_f64(r * n + i));
                        if op == ReduceOp::Avg {
                            s / ws as f64
                        } else {
                            s
                        }
                    })
                    .collect();
                vec![round(x0.dtype(), &shape, &v)]
            })
            .collect()
    }

    pub(super) fn ag_matmul(inputs: &[FusedInputs], g: usize, scaling: Option<&Scaling>, only: Option<usize>) -> Vec<Vec<Tensor>> {
        let ws = inputs.len();
        let s = inputs[0].a.shape().to_vec();
        let nd = s.len();
        let sg = s[g];
        let mut ag_shape = s.clone();
        ag_shape[g] *= ws;
        // The gathered tensor: element at ag coords c comes from rank c[g] / s_g at c[g] % s_g;
        // `l` receives the coords in that rank's shard.
        let ag_val = |c: &[usize], l: &mut [usize]| {
            l.copy_from_slice(c);
            let r = l[g] / sg;
            l[g] %= sg;
            (r, inputs[r].a.get_f64(flat(l, &s)))
        };
        let ag_n: usize = ag_shape.iter().product();
        let es = inputs[0].a.dtype().size();
        let (mut c, mut l) = (vec![0; nd], vec![0; nd]);
        let mut ag_bits: Vec<u8> = Vec::with_capacity(ag_n * es);
        for i in 0..ag_n {
            coords_into(i, &ag_shape, &mut c);
            let (r, _) = ag_val(&c, &mut l);
            let off = flat(&l, &s) * es;
            ag_bits.extend_from_slice(&inputs[r].a.bytes()[off..off + es]);
        }
        let ag = Tensor::from_bytes(inputs[0].a.dtype(), &ag_shape, &ag_bits);
        let ms = moved_shape(&s, g); // shard's moved shape [s_g, .., k]
        let k = ms[nd - 1];
        // A' = movedim(ag, g, 0) as a dense [rows, k] f64 matrix, with each row's source rank and
        // its row in that rank's moved shard (for row scales).
        let mut full = ms.clone();
        full[0] *= ws;
        let rows: usize = full[..nd - 1].iter().product();
        let mut a_mat = vec![0.0f64; rows * k];
        let mut row_src = vec![(0usize, 0usize); rows];
        let mut m = vec![0; nd];
        let mut row = vec![0; nd - 1];
        for (idx, slot) in a_mat.iter_mut().enumerate() {
            coords_into(idx, &full, &mut m);
            // c = m[1..] with m[0] inserted at g
            c[..g].copy_from_slice(&m[1..=g]);
            c[g] = m[0];
            c[g + 1..].copy_from_slice(&m[g + 1..]);
            let (r, v) = ag_val(&c, &mut l);
            *slot = v;
            if m[nd - 1] == 0 {
                row[0] = m[0] % sg;
                row[1..].copy_from_slice(&m[1..nd - 1]);
                row_src[idx / k.max(1)] = (r, flat(&row, &ms[..nd - 1]));
            }
        }
        (0..ws)
            .map(|q| {
                if only.is_some_and(|o| o != q) {
                    return vec![];
                }
                let mut outs = vec![ag.clone()];
                for (bi, b) in inputs[q].bs.iter().enumerate() {
                    let n = b.shape()[1];
                    // b transposed ([n, k]): each dot product below walks both operands contiguously
                    // (the same products, summed in the same order, as down b's column).
                    let bt: Vec<f64> = (0..n * k).map(|t| b.get_f64((t % k) * n + t / k)).collect();
                    // Moved output [ws*s_g, ms[1..nd-1].., n]; final = movedim(0, g).
                    let mut mo = full.clone();
                    mo[nd - 1] = n;
                    let mut fin = mo[1..].to_vec();
                    fin.insert(g, mo[0]);
                    let total: usize = fin.iter().product();
                    let (mut o, mut m) = (vec![0; nd], vec![0; nd]);
                    let mut v: Vec<f64> = Vec::with_capacity(total);
                    for i in 0..total {
                        coords_into(i, &fin, &mut o);
                        // m = o[g], then o without its g-th coordinate
                        m[0] = o[g];
                        m[1..=g].copy_from_slice(&o[..g]);
                        m[g + 1..].copy_from_slice(&o[g + 1..]);
                        let j = m[nd - 1];
                        let row = flat(&m[..nd - 1], &mo[..nd - 1]);
                        // Accumulated from +0 like every BLAS: a sum of -0 products is +0.
                        let (a_row, b_col) = (&a_mat[row * k..(row + 1) * k], &bt[j * k..(j + 1) * k]);
                        let mut acc: f64 = a_row.iter().zip(b_col).fold(0.0, |acc, (x, y)| acc + x * y);
                        if let Some(sc) = scaling {
                            let (src, ri) = row_src[row];
                            let sa = inputs[src].a_scale.as_ref().unwrap_or(&sc.a);
                            acc *= sa.at(ri) * sc.b[bi].at(j);
                        }
                        v.push(acc);
                    }
                    let dt = scaling.map_or(b.dtype(), |s| s.out_dtype);
                    outs.push(round(dt, &fin, &v));
                }
                outs
            })
            .collect()
    }

    pub(super) fn matmul_rs(
        inputs: &[FusedInputs],
        op: ReduceOp,
        d: usize,
        scaling: Option<&Scaling>,
        only: Option<usize>,
    ) -> Vec<Vec<Tensor>> {
        let ws = inputs.len();
        let s = inputs[0].a.shape().to_vec();
        let nd = s.len();
        let k = s[nd - 1];
        let n = inputs[0].bs[0].shape()[1];
        let mut c_shape = s.clone();
        c_shape[nd - 1] = n;
        let dt = scaling.map_or(inputs[0].a.dtype(), |s| s.out_dtype);
        // Every rank's product, each element rounded once to the output dtype (the seed's fallback
        // computes C in the output dtype before the reduce-scatter); an element of C belongs to one
        // rank's chunk, so each is computed when that chunk is (once in all, only the chunk of rank
        // `only` when given).
        let mats: Vec<(Vec<f64>, Vec<f64>)> = inputs
            .iter()
            // b transposed ([n, k]), as in `ag_matmul`: contiguous dot products, same order.
            .map(|x| {
                ((0..x.a.numel()).map(|i| x.a.get_f64(i)).collect(), (0..n * k).map(|t| x.bs[0].get_f64((t % k) * n + t / k)).collect())
            })
            .collect();
        let c_at = |x: usize, fi: usize| {
            let (av, bt) = &mats[x];
            let (row, j) = (fi / n, fi % n);
            let mut acc = 0.0;
            for (a, b) in av[row * k..(row + 1) * k].iter().zip(&bt[j * k..(j + 1) * k]) {
                acc += a * b;
            }
            if let Some(sc) = scaling {
                acc *= inputs[x].a_scale.as_ref().unwrap_or(&sc.a).at(row) * sc.b[0].at(j);
            }
            rounded(dt, acc)
        };
        let mut out_shape = c_shape.clone();
        out_shape[d] /= ws;
        let total: usize = out_shape.iter().product();
        (0..ws)
            .map(|r| {
                if only.is_some_and(|o| o != r) {
                    return vec![];
                }
                let mut c = vec![0; nd];
                let mut v: Vec<f64> = Vec::with_capacity(total);
                for i in 0..total {
                    coords_into(i, &out_shape, &mut c);
                    c[d] += r * out_shape[d];
                    let fi = flat(&c, &c_shape);
                    let sum: f64 = (0..ws).fold(0.0, |s, x| s + c_at(x, fi));
                    v.push(if op == ReduceOp::Avg { sum / ws as f64 } else { sum });
                }
                vec![round(dt, &out_shape, &v)]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, v)
    }

    #[test]
    fn ag_matmul_gathers_along_dim_1_and_multiplies() {
        // two ranks, a_shard [1, 1, 2], gather dim 1: ag [1, 2, 2]; b = identity
        let b = t(&[2, 2], vec![1., 0., 0., 1.]);
        let ins = vec![
            FusedInputs { a: t(&[1, 1, 2], vec![1., 2.]), bs: vec![b.clone()], a_scale: None },
            FusedInputs { a: t(&[1, 1, 2], vec![3., 4.]), bs: vec![b], a_scale: None },
        ];
        let out = expected_fused(&FusedCall::AllGatherMatmul { dim: 1, scaling: None }, &ins, &Capabilities::full(8)).unwrap();
        assert_eq!(out[0][0], t(&[1, 2, 2], vec![1., 2., 3., 4.]));
        assert_eq!(out[1][1], t(&[1, 2, 2], vec![1., 2., 3., 4.]));
    }

    #[test]
    fn matmul_rs_sums_and_scatters() {
        let b = t(&[1, 2], vec![1., 1.]);
        let ins = vec![
            FusedInputs { a: t(&[2, 1], vec![1., 2.]), bs: vec![b.clone()], a_scale: None },
            FusedInputs { a: t(&[2, 1], vec![10., 20.]), bs: vec![b], a_scale: None },
        ];
        let out =
            expected_fused(&FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 0, scaling: None }, &ins, &Capabilities::full(8))
                .unwrap();
        assert_eq!(out[0][0], t(&[1, 2], vec![11., 11.]));
        assert_eq!(out[1][0], t(&[1, 2], vec![22., 22.]));
        let bad =
            expected_fused(&FusedCall::MatmulReduceScatter { op: ReduceOp::Max, dim: 0, scaling: None }, &ins, &Capabilities::full(8));
        assert_eq!(bad.unwrap_err().kind, concord_core::BadInputKind::BadReduceOp);
    }

    /// The row-by-row `ag_matmul` / `matmul_rs` give the bits of the element-by-element ones
    /// ([`reference`]) for every rank and for one rank alone (the first, middle and last): f32,
    /// bf16, f16 and f64, every gather / scatter dim of a 3-D `a`, sum and avg, unscaled and
    /// scaled (per-tensor and per-row scales into bf16 and f32), world sizes 1 to 5 and 8, on
    /// random inputs (whose sums round) and on small integers.
    #[test]
    fn row_by_row_is_the_reference() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut cases = 0;
        for ws in [1usize, 2, 3, 4, 5, 8] {
            for dt in [DType::F32, DType::BF16, DType::F16, DType::F64] {
                for dim in 0..3 {
                    for (scaled, out) in [(false, dt), (true, DType::BF16), (true, DType::F32)] {
                        for random in [false, true] {
                            let mut val = |n: usize| -> Vec<f64> {
                                (0..n)
                                    .map(|_| {
                                        let x = next();
                                        if random {
                                            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                                        } else {
                                            (x % 5) as f64 - 2.0
                                        }
                                    })
                                    .collect()
                            };
                            // all_gather_matmul: a shard [3, 5, 7] (odd everywhere), two bs.
                            let a = vec![3usize, 5, 7];
                            let k = *moved_shape(&a, dim).last().unwrap();
                            let rows_scaled = scaled && (dim + ws) % 2 == 0;
                            let sc = scaled.then(|| Scaling {
                                a: Scale::Tensor(0.5),
                                b: vec![Scale::Tensor(2.0), Scale::Rows((0..4).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
                                out_dtype: out,
                            });
                            let ins: Vec<FusedInputs> = (0..ws)
                                .map(|r| {
                                    let rows = 3 * 5 * 7 / k;
                                    FusedInputs {
                                        a: Tensor::from_f64(dt, &a, &val(105)),
                                        bs: vec![Tensor::from_f64(dt, &[k, 6], &val(6 * k)), Tensor::from_f64(dt, &[k, 4], &val(4 * k))],
                                        a_scale: rows_scaled
                                            .then(|| Scale::Rows((0..rows).map(|i| [0.5f32, 1.0, 2.0][(i + r) % 3]).collect())),
                                    }
                                })
                                .collect();
                            let want = reference::ag_matmul(&ins, dim, sc.as_ref(), None);
                            assert_eq!(ag_matmul(&ins, dim, sc.as_ref(), None), want, "ag ws={ws} {dt} dim={dim} scaled={scaled} {out}");
                            for only in [0, ws / 2, ws - 1] {
                                assert_eq!(
                                    ag_matmul(&ins, dim, sc.as_ref(), Some(only)),
                                    reference::ag_matmul(&ins, dim, sc.as_ref(), Some(only))
                                );
                            }
                            // matmul_reduce_scatter: a [2 ws, 3 ws, 5], b [5, 2 ws].
                            let a = vec![2 * ws, 3 * ws, 5];
                            let n = 2 * ws;
                            let sc = scaled.then(|| Scaling {
                                a: Scale::Tensor(0.5),
                                b: vec![Scale::Rows((0..n).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
                                out_dtype: out,
                            });
                            let ins: Vec<FusedInputs> = (0..ws)
                                .map(|r| FusedInputs {
                                    a: Tensor::from_f64(dt, &a, &val(a.iter().product())),
                                    bs: vec![Tensor::from_f64(dt, &[5, n], &val(5 * n))],
                                    a_scale: rows_scaled
                                        .then(|| Scale::Rows((0..6 * ws * ws).map(|i| [0.5f32, 1.0, 2.0][(i + r) % 3]).collect())),
                                })
                                .collect();
                            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                                let want = reference::matmul_rs(&ins, op, dim, sc.as_ref(), None);
                                assert_eq!(
                                    matmul_rs(&ins, op, dim, sc.as_ref(), None),
                                    want,
                                    "rs ws={ws} {dt} dim={dim} {op} scaled={scaled} {out}"
                                );
                                for only in [0, ws / 2, ws - 1] {
                                    assert_eq!(
                                        matmul_rs(&ins, op, dim, sc.as_ref(), Some(only)),
                                        reference::matmul_rs(&ins, op, dim, sc.as_ref(), Some(only))
                                    );
                                }
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 6 * 4 * 3 * 3 * 2);
    }

    /// The low-contention ops for one rank are that rank's entry of every rank's (the
    /// all-gather: the concatenation; the reduce-scatter: the element-wise fold from +0 in rank
    /// order as it was, `reference::low_contention_rs`), on values with NaN, ±inf and ±0, in
    /// every float dtype, sum and avg, 1..=6 ranks.
    #[test]
    fn low_contention_for_one_rank_is_its_share_of_all() {
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 1.5, -2.0, 0.1, 1e-3, 65_504.0];
        let caps = Capabilities::full(64);
        for dt in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for ws in 1..=6usize {
                let ins: Vec<FusedInputs> = (0..ws)
                    .map(|r| {
                        let v: Vec<f64> = (0..ws * 12).map(|i| specials[(i * 7 + r * 3 + i / 5) % specials.len()]).collect();
                        FusedInputs { a: Tensor::from_f64(dt, &[ws * 4, 3], &v), bs: vec![], a_scale: None }
                    })
                    .collect();
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let call = FusedCall::LowContentionReduceScatter { op };
                    let all = expected_fused_for(&call, &ins, &caps, None).expect("valid");
                    let bits = |v: &Vec<Vec<Tensor>>| {
                        v.iter().map(|o| o.iter().map(|t| t.bytes().to_vec()).collect::<Vec<_>>()).collect::<Vec<_>>()
                    };
                    assert_eq!(bits(&all), bits(&reference::low_contention_rs(&ins, op)), "{dt} ws{ws} {op}");
                    for r in 0..ws {
                        let one = expected_fused_for(&call, &ins, &caps, Some(r)).expect("valid");
                        assert_eq!(bits(&vec![one[r].clone()]), bits(&vec![all[r].clone()]), "{dt} ws{ws} {op} rank {r}");
                        assert!(one.iter().enumerate().all(|(q, o)| q == r || o.is_empty()), "only rank {r}'s outputs made");
                    }
                }
                let call = FusedCall::LowContentionAllGather;
                let all = expected_fused_for(&call, &ins, &caps, None).expect("valid");
                for r in 0..ws {
                    let one = expected_fused_for(&call, &ins, &caps, Some(r)).expect("valid");
                    assert_eq!(one[r], all[r], "{dt} ws{ws} all_gather rank {r}");
                }
            }
        }
    }
}
