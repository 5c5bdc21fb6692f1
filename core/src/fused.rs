//! Fused communication + compute (seed 004, PyTorch's symmetric-memory ops): the arguments,
//! the layout rules, the host matmul kernel, and the *unfused decomposition* every backend gets
//! by default (the seed's "fallback" implementations, which define what the fused ops return).
//!
//! # Semantics (every backend MUST return exactly this; see [`crate::Backend`])
//! * `fused_all_gather_matmul(a_shard, [b..], g)` → `(ag, [out_i])` with
//!   `ag = cat(a_shard of rank 0, 1, .., ws-1; dim g)` and
//!   `out_i = (movedim(ag, g, 0) @ b_i).movedim(0, g)` — the seed's fallback literally. For
//!   `g < ndim - 1` that is `ag @ b_i`; for `g = ndim - 1` the contraction runs over the last dim
//!   of `movedim(ag, g, 0)` (dim `ndim - 2` of `a`), as in the seed.
//! * `fused_matmul_reduce_scatter(a, b, op, d)` → `reduce_scatter(a @ b, op, d)`: rank `r` gets
//!   chunk `r` along dim `d` of the sum (`op = sum`) or mean (`avg`) over ranks of `a @ b`.
//! * Scaled variants ([`Scaling`]): the product is `diag(sa) · A · B · diag(sb)` with `sa` one f32
//!   per tensor or per *row* of the flattened `A` (all-gather: per row of this rank's shard,
//!   gathered with it), `sb` one f32 per tensor or per *column* of `B` (rowwise `_scaled_mm`),
//!   the result in [`Scaling::out_dtype`].
//! * `low_contention_all_gather(x)` = `all_gather_into_tensor(x)`;
//!   `low_contention_reduce_scatter(x, op)` = `reduce_scatter_tensor(x, op)`, `op ∈ {sum, avg}`.
//! * Values: every product block is accumulated (f32 for f32 / bf16 / f16, f64 for f64 inputs)
//!   and rounded *once* to the output dtype; a reduce-scatter sums the rounded blocks exactly and
//!   rounds once (the same rule as [`crate::Rounding::ExactThenRound`]). Accumulators start
//!   from +0 (as in BLAS): an exactly-zero product sum is +0 even when every product is -0.
//!
//! Bad input is decided by the rule table of [`crate::call`] on a [`CallDesc`] with
//! [`crate::call::FusedArgs`]; every rank exchanges its description before any data moves
//! ([`exchange_and_validate`]), so a broken call is the same named error on every rank.

use crate::backend::Backend;
use crate::call::{CallDesc, CallOp, FusedArgs, TensorDesc};
use crate::dtype::{round_f64_to_bf16_bits, round_f64_to_bits, round_f64_to_f32_bits, DType};
use crate::error::{CollectiveError, Result};
use crate::op::{ReduceOp, Variant};
use crate::tensor::Tensor;
use crate::work::Work;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What `fused_all_gather_matmul` returns: the all-gathered `a` and one output per `b`.
pub type Gathered<Buf> = (Buf, Vec<Buf>);

/// How long the unfused decomposition waits for each collective it issues.
pub const DECOMPOSITION_WAIT: Duration = Duration::from_secs(120);

/// A scale of the scaled variants: one f32 for the whole tensor, or one per row of `A` / per
/// column of `B`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Scale {
    Tensor(f32),
    Rows(Vec<f32>),
}

impl Scale {
    /// Number of values (1 for a per-tensor scale).
    pub fn len(&self) -> usize {
        match self {
            Scale::Tensor(_) => 1,
            Scale::Rows(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The factor for row / column `i`.
    pub fn at(&self, i: usize) -> f64 {
        match self {
            Scale::Tensor(s) => *s as f64,
            Scale::Rows(v) => v[i] as f64,
        }
    }
    /// The per-row part of the description (`None` for per-tensor).
    fn desc_len(&self) -> usize {
        match self {
            Scale::Tensor(_) => 0,
            Scale::Rows(v) => v.len().max(1),
        }
    }
}

/// The scales and output dtype of a scaled variant (`b` has one scale per `b` tensor).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    pub a: Scale,
    pub b: Vec<Scale>,
    pub out_dtype: DType,
}

/// `shape` with dim `d` moved to the front (`[s_d, s_0, .., s_{d-1}, s_{d+1}, ..]`).
pub fn moved_shape(shape: &[usize], d: usize) -> Vec<usize> {
    let mut s = vec![shape[d]];
    s.extend(shape.iter().enumerate().filter(|(i, _)| *i != d).map(|(_, x)| *x));
    s
}

/// The inverse of [`moved_shape`]: dim 0 of `moved` goes back to position `d`.
pub fn unmoved_shape(moved: &[usize], d: usize) -> Vec<usize> {
    let mut s = moved[1..].to_vec();
    s.insert(d, moved[0]);
    s
}

/// `movedim(t, d, 0)`, contiguous.
pub fn move_to_front(t: &Tensor, d: usize) -> Tensor {
    let shape = t.shape();
    if d == 0 {
        return t.clone();
    }
    let p: usize = shape[..d].iter().product();
    let q: usize = shape[d + 1..].iter().product::<usize>() * t.dtype().size();
    let sd = shape[d];
    let mut out = Tensor::zeros(t.dtype(), &moved_shape(shape, d));
    let (src, dst) = (t.bytes(), out.bytes_mut());
    for i in 0..p {
        for j in 0..sd {
            let s = (i * sd + j) * q;
            let o = (j * p + i) * q;
            dst[o..o + q].copy_from_slice(&src[s..s + q]);
        }
    }
    out
}

/// `movedim(t, 0, d)`, contiguous (the inverse of [`move_to_front`]).
pub fn move_from_front(t: &Tensor, d: usize) -> Tensor {
    let shape = t.shape();
    if d == 0 {
        return t.clone();
    }
    let sd = shape[0];
    let p: usize = shape[1..=d].iter().product();
    let q: usize = shape[d + 1..].iter().product::<usize>() * t.dtype().size();
    let mut out = Tensor::zeros(t.dtype(), &unmoved_shape(shape, d));
    let (src, dst) = (t.bytes(), out.bytes_mut());
    for j in 0..sd {
        for i in 0..p {
            let s = (j * p + i) * q;
            let o = (i * sd + j) * q;
            dst[o..o + q].copy_from_slice(&src[s..s + q]);
        }
    }
    out
}

/// The values of a float tensor as f32 (f64 tensors: use [`to_f64`]).
pub fn to_f32(t: &Tensor) -> Vec<f32> {
    match t.dtype() {
        DType::F32 => t.as_slice::<f32>().to_vec(),
        DType::BF16 => t.as_slice::<bf16>().iter().map(|x| x.to_f32()).collect(),
        DType::F16 => t.as_slice::<f16>().iter().map(|x| x.to_f32()).collect(),
        _ => (0..t.numel()).map(|i| t.get_f64(i) as f32).collect(),
    }
}

/// The values as f32, borrowed when the tensor is f32 already.
fn f32_view(t: &Tensor) -> std::borrow::Cow<'_, [f32]> {
    if t.dtype() == DType::F32 {
        std::borrow::Cow::Borrowed(t.as_slice::<f32>())
    } else {
        std::borrow::Cow::Owned(to_f32(t))
    }
}

pub fn to_f64(t: &Tensor) -> Vec<f64> {
    (0..t.numel()).map(|i| t.get_f64(i)).collect()
}

/// Rounds f64 values once (to nearest, ties to even) into a tensor of float `dtype`.
pub fn round_into(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
    let mut t = Tensor::zeros(dtype, shape);
    match dtype {
        DType::F32 => t.as_mut_slice::<f32>().iter_mut().zip(v).for_each(|(d, x)| *d = f32::from_bits(round_f64_to_f32_bits(*x))),
        DType::BF16 => t.as_mut_slice::<bf16>().iter_mut().zip(v).for_each(|(d, x)| *d = bf16::from_bits(round_f64_to_bf16_bits(*x))),
        DType::F16 => t.as_mut_slice::<f16>().iter_mut().zip(v).for_each(|(d, x)| *d = f16::from_bits(round_f64_to_bits(*x, 5, 10) as u16)),
        _ => return Tensor::from_f64(dtype, shape, v),
    }
    t
}

/// `c[m×n] = a[m×k] · b[k×n]`, row-major, f32 accumulation (`matrixmultiply::sgemm`).
#[allow(unsafe_code)]
pub fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "sgemm: slices shorter than {m}x{k}x{n}");
    // SAFETY: the three slices hold at least m*k, k*n and m*n elements (asserted above), the
    // strides describe dense row-major matrices inside them, and `c` does not alias `a` or `b`
    // (a unique borrow).
    unsafe {
        matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1, 0.0, c.as_mut_ptr(), n as isize, 1);
    }
}

/// `c[m×n] = a[m×k] · b[k×n]`, row-major, f64 (`matrixmultiply::dgemm`).
#[allow(unsafe_code)]
pub fn dgemm(m: usize, k: usize, n: usize, a: &[f64], b: &[f64], c: &mut [f64]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "dgemm: slices shorter than {m}x{k}x{n}");
    // SAFETY: as for `sgemm`.
    unsafe {
        matrixmultiply::dgemm(m, k, n, 1.0, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1, 0.0, c.as_mut_ptr(), n as isize, 1);
    }
}

/// One block product: `a` is `[m, k]` (any float dtype, as a tensor of `m * k` elements), `b`
/// `[k, n]`; scales `sa(row0 + i)` and `sb(j)`; the result `[m, n]` as f64 before rounding.
pub fn block_product(a: &Tensor, m: usize, k: usize, b: &Tensor, sa: Option<(&Scale, usize)>, sb: Option<&Scale>) -> Vec<f64> {
    let n = b.shape()[1];
    let mut out: Vec<f64> = if a.dtype() == DType::F64 || b.dtype() == DType::F64 {
        let mut c = vec![0.0f64; m * n];
        dgemm(m, k, n, &to_f64(a), &to_f64(b), &mut c);
        c
    } else {
        let mut c = vec![0.0f32; m * n];
        sgemm(m, k, n, &f32_view(a), &f32_view(b), &mut c);
        c.into_iter().map(f64::from).collect()
    };
    if sa.is_some() || sb.is_some() {
        for i in 0..m {
            let fa = sa.map_or(1.0, |(s, row0)| s.at(row0 + i));
            for j in 0..n {
                out[i * n + j] *= fa * sb.map_or(1.0, |s| s.at(j));
            }
        }
    }
    out
}

/// The geometry of one `fused_all_gather_matmul` call, and its per-shard consumer: what the
/// unfused decomposition runs over the gathered tensor, and what a pipelined implementation runs
/// on each shard as it lands (local shard first).
#[derive(Clone, Debug)]
pub struct AgMatmulPlan {
    pub ws: usize,
    pub dim: usize,
    pub dtype: DType,
    /// `a_shard`'s shape.
    pub shard_shape: Vec<usize>,
    /// Rows and contraction length of `movedim(a_shard, dim, 0)` flattened to a matrix.
    pub rows: usize,
    pub k: usize,
    /// `n` of each `b`, and each output's dtype.
    pub ns: Vec<usize>,
    pub out_dtypes: Vec<DType>,
}

impl AgMatmulPlan {
    pub fn new(ws: usize, a_shard: &TensorDesc, bs: &[TensorDesc], dim: usize, scaling: Option<&Scaling>) -> AgMatmulPlan {
        let moved = moved_shape(&a_shard.shape, dim);
        let k = *moved.last().expect("a matrix");
        let rows = a_shard.numel().checked_div(k).unwrap_or_else(|| moved[..moved.len() - 1].iter().product());
        AgMatmulPlan {
            ws,
            dim,
            dtype: a_shard.dtype,
            shard_shape: a_shard.shape.clone(),
            rows,
            k,
            ns: bs.iter().map(|b| b.shape[1]).collect(),
            out_dtypes: bs.iter().map(|b| scaling.map_or(b.dtype, |s| s.out_dtype)).collect(),
        }
    }

    /// The all-gathered tensor's shape.
    pub fn ag_shape(&self) -> Vec<usize> {
        let mut s = self.shard_shape.clone();
        s[self.dim] *= self.ws;
        s
    }

    /// Output `i`'s shape.
    pub fn out_shape(&self, i: usize) -> Vec<usize> {
        let mut m = moved_shape(&self.shard_shape, self.dim);
        m[0] *= self.ws;
        *m.last_mut().expect("a matrix") = self.ns[i];
        unmoved_shape(&m, self.dim)
    }

    /// Empty accumulators (moved layout) for the gathered tensor and every output.
    pub fn start(&self) -> AgMatmulParts {
        let ag = vec![0u8; self.rows * self.k * self.ws * self.dtype.size()];
        let outs = self.ns.iter().zip(&self.out_dtypes).map(|(n, d)| vec![0u8; self.rows * self.ws * n * d.size()]).collect();
        AgMatmulParts { ag, outs }
    }

    /// Consumes rank `r`'s shard (as that rank holds it, contiguous): copies it into the
    /// gathered tensor and computes its rows of every output. `a_scale_r` is rank `r`'s scale.
    pub fn consume(
        &self,
        parts: &mut AgMatmulParts,
        r: usize,
        shard: &Tensor,
        bs: &[Tensor],
        a_scale_r: Option<&Scale>,
        b_scales: Option<&[Scale]>,
    ) {
        let moved = move_to_front(shard, self.dim);
        let nb = moved.len_bytes();
        parts.ag[r * nb..(r + 1) * nb].copy_from_slice(moved.bytes());
        for (i, b) in bs.iter().enumerate() {
            let v = block_product(&moved, self.rows, self.k, b, a_scale_r.map(|s| (s, 0)), b_scales.map(|s| &s[i]));
            let t = round_into(self.out_dtypes[i], &[self.rows, self.ns[i]], &v);
            let ob = t.len_bytes();
            parts.outs[i][r * ob..(r + 1) * ob].copy_from_slice(t.bytes());
        }
    }

    /// The final tensors (moved back to `dim`).
    pub fn finish(&self, parts: AgMatmulParts) -> (Tensor, Vec<Tensor>) {
        let mut m = moved_shape(&self.shard_shape, self.dim);
        m[0] *= self.ws;
        let ag = move_from_front(&Tensor::from_bytes(self.dtype, &m, &parts.ag), self.dim);
        let outs = parts
            .outs
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                let mut mo = m.clone();
                *mo.last_mut().expect("a matrix") = self.ns[i];
                move_from_front(&Tensor::from_bytes(self.out_dtypes[i], &mo, bytes), self.dim)
            })
            .collect();
        (ag, outs)
    }
}

/// The partial results of an [`AgMatmulPlan`] (moved layout, bytes).
pub struct AgMatmulParts {
    pub ag: Vec<u8>,
    pub outs: Vec<Vec<u8>>,
}

/// The geometry of one `fused_matmul_reduce_scatter` call and its chunk producer.
#[derive(Clone, Debug)]
pub struct MatmulRsPlan {
    pub ws: usize,
    pub dim: usize,
    /// `a @ b`'s shape and dtype.
    pub c_shape: Vec<usize>,
    pub out_dtype: DType,
    pub op: ReduceOp,
}

impl MatmulRsPlan {
    pub fn new(ws: usize, a: &TensorDesc, b: &TensorDesc, op: ReduceOp, dim: usize, scaling: Option<&Scaling>) -> MatmulRsPlan {
        let mut c_shape = a.shape.clone();
        *c_shape.last_mut().expect("a matrix") = b.shape[1];
        MatmulRsPlan { ws, dim, c_shape, out_dtype: scaling.map_or(a.dtype, |s| s.out_dtype), op }
    }

    pub fn out_shape(&self) -> Vec<usize> {
        let mut s = self.c_shape.clone();
        s[self.dim] /= self.ws;
        s
    }

    /// This rank's whole `a @ b` (scaled, rounded once to the output dtype).
    pub fn product(&self, a: &Tensor, b: &Tensor, scaling: Option<&Scaling>) -> Tensor {
        let k = *a.shape().last().expect("a matrix");
        let m = a.numel().checked_div(k).unwrap_or(0);
        let v = block_product(a, m, k, b, scaling.map(|s| (&s.a, 0)), scaling.map(|s| &s.b[0]));
        round_into(self.out_dtype, &self.c_shape, &v)
    }

    /// Chunk `p` of this rank's `a @ b` along `dim` (the part rank `p` reduces), as a tensor of
    /// the output's shape. Computes only that chunk's rows (or columns, for the last dim).
    pub fn chunk(&self, p: usize, a: &Tensor, b: &Tensor, scaling: Option<&Scaling>, src: Option<&RsSource>) -> Tensor {
        let nd = self.c_shape.len();
        let cs = self.c_shape[self.dim] / self.ws;
        let k = *a.shape().last().expect("a matrix");
        let n = b.shape()[1];
        let (sa, sb) = (scaling.map(|s| &s.a), scaling.map(|s| &s.b[0]));
        if self.dim == nd - 1 {
            // Columns p*cs.. of b; every row of a.
            let m = a.numel().checked_div(k).unwrap_or(0);
            let bdt = if b.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
            let bcols =
                Tensor::from_f64(bdt, &[k, cs], &(0..k * cs).map(|i| b.get_f64((i / cs) * n + p * cs + i % cs)).collect::<Vec<_>>());
            let sbc = sb.map(|s| match s {
                Scale::Tensor(x) => Scale::Tensor(*x),
                Scale::Rows(v) => Scale::Rows(v[p * cs..(p + 1) * cs].to_vec()),
            });
            let v = block_product(a, m, k, &bcols, sa.map(|s| (s, 0)), sbc.as_ref());
            return round_into(self.out_dtype, &self.out_shape(), &v);
        }
        // Rows of a along `dim` (a and c share every dim but the last): chunk p of the moved a
        // (moved once, in `prepare`), multiplied, moved back.
        let src = match src {
            Some(s) => s,
            None => &self.prepare(a, scaling),
        };
        let part = src.am.slice_rows(p * cs, cs);
        let m = part.numel().checked_div(k).unwrap_or(0);
        let sa_chunk = src.sa.as_ref().map(|s| match s {
            Scale::Tensor(x) => Scale::Tensor(*x),
            Scale::Rows(v) => {
                let per = v.len() / self.c_shape[self.dim].max(1);
                Scale::Rows(v[p * cs * per..(p + 1) * cs * per].to_vec())
            }
        });
        let v = block_product(&part, m, k, b, sa_chunk.as_ref().map(|s| (s, 0)), sb);
        let mut mo = moved_shape(&self.out_shape(), self.dim);
        *mo.last_mut().expect("a matrix") = n;
        move_from_front(&round_into(self.out_dtype, &mo, &v), self.dim)
    }

    /// `a` moved so that the scattered dim is first (and its row scales with it), once for
    /// every [`MatmulRsPlan::chunk`] of a call.
    pub fn prepare(&self, a: &Tensor, scaling: Option<&Scaling>) -> RsSource {
        let nd = a.shape().len();
        if self.dim + 1 == nd {
            return RsSource { am: Tensor::zeros(a.dtype(), &[0]), sa: scaling.map(|s| s.a.clone()) };
        }
        let sa = scaling.map(|s| match &s.a {
            Scale::Tensor(x) => Scale::Tensor(*x),
            Scale::Rows(v) => {
                let t = Tensor::from_vec(&a.shape()[..nd - 1], v.clone());
                Scale::Rows(move_to_front(&t, self.dim).as_slice::<f32>().to_vec())
            }
        });
        RsSource { am: move_to_front(a, self.dim), sa }
    }

    /// Reduces every rank's chunk for this rank (index = source rank): exact sum in f64, divided
    /// by the world size for `avg`, rounded once.
    pub fn reduce(&self, chunks: &[Tensor]) -> Tensor {
        let n = chunks[0].numel();
        let mut acc = vec![0.0f64; n];
        for c in chunks {
            if c.dtype() == DType::F64 {
                acc.iter_mut().zip(c.as_slice::<f64>()).for_each(|(a, x)| *a += x);
            } else {
                // f32 / bf16 / f16 widen to f32 exactly, then to f64.
                acc.iter_mut().zip(f32_view(c).iter()).for_each(|(a, x)| *a += *x as f64);
            }
        }
        if self.op == ReduceOp::Avg {
            acc.iter_mut().for_each(|a| *a /= self.ws as f64);
        }
        round_into(self.out_dtype, &self.out_shape(), &acc)
    }
}

/// `a` prepared for [`MatmulRsPlan::chunk`] ([`MatmulRsPlan::prepare`]).
pub struct RsSource {
    am: Tensor,
    sa: Option<Scale>,
}

/// The description of one fused call (the rule table's input).
pub fn describe(
    op: CallOp,
    rank: usize,
    inputs: Vec<TensorDesc>,
    reduce: Option<ReduceOp>,
    dim: usize,
    scaling: Option<&Scaling>,
) -> CallDesc {
    let mut d = CallDesc::new(op, Variant::Out, rank);
    d.inputs = inputs;
    d.reduce = reduce;
    d.fused = Some(FusedArgs {
        dim,
        scales: scaling.map(|s| (s.a.desc_len(), s.b.iter().map(Scale::desc_len).collect())),
        out_dtype: scaling.map(|s| s.out_dtype),
    });
    d
}

/// Every rank's description, exchanged through the backend's own `all_gather_into_tensor`
/// (fixed size, u8), then the rule table over all of them: the same verdict on every rank.
/// Every rank takes part even when its own call is broken, so no rank is left waiting.
pub fn exchange_and_validate<B: Backend>(b: &B, d: &CallDesc) -> Result<Vec<CallDesc>> {
    const WORDS: usize = 256;
    let mut w = d.encode();
    let too_long = w.len() >= WORDS;
    w.truncate(WORDS - 1);
    let mut words = vec![if too_long { u64::MAX } else { w.len() as u64 }];
    words.extend(w);
    words.resize(WORDS, 0);
    let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    let t = Tensor::from_bytes(DType::U8, &[bytes.len()], &bytes);
    let buf = b.upload(&t)?;
    let work = b.all_gather_into_tensor(&buf)?;
    let all = b.download(work.wait(DECOMPOSITION_WAIT)?)?;
    let name = d.op.name();
    let mut descs = Vec::with_capacity(b.world_size());
    for (r, chunk) in all.bytes().chunks(WORDS * 8).enumerate() {
        let ws: Vec<u64> = chunk.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        if ws[0] == u64::MAX {
            return Err(CollectiveError::bad_input(
                crate::error::BadInputKind::CountMismatch,
                name,
                0,
                b.rank(),
                format!("rank {r}: the call's description is longer than {WORDS} words (too many b tensors)"),
            ));
        }
        let n = (ws[0] as usize).min(WORDS - 1);
        let dd = CallDesc::decode(&ws[1..1 + n])
            .ok_or_else(|| CollectiveError::Backend(format!("{name}: rank {r}'s description does not decode")))?;
        descs.push(dd);
    }
    crate::call::validate_all(&descs, &b.capabilities()).map_err(|e| e.into_error(name, 0, b.rank()))?;
    Ok(descs)
}

fn descs_of<B: Backend>(b: &B, bufs: &[&B::Buffer]) -> Vec<TensorDesc> {
    bufs.iter().map(|x| TensorDesc::new(b.buffer_dtype(x), &b.buffer_shape(x))).collect()
}

/// The inputs' descriptions: `a` then every `b`.
pub fn input_descs<B: Backend>(b: &B, a: &B::Buffer, bs: &[B::Buffer]) -> Vec<TensorDesc> {
    let mut v = vec![a];
    v.extend(bs.iter());
    descs_of(b, &v)
}

/// All-gathers every rank's row scales (a per-tensor scale needs no exchange).
pub fn gather_row_scales<B: Backend>(b: &B, s: &Scale) -> Result<Vec<Scale>> {
    match s {
        Scale::Tensor(_) => Ok(vec![s.clone(); b.world_size()]),
        Scale::Rows(v) => {
            let buf = b.upload(&Tensor::from_vec(&[v.len()], v.clone()))?;
            let w = b.all_gather_into_tensor(&buf)?;
            let all = b.download(w.wait(DECOMPOSITION_WAIT)?)?;
            Ok(all.as_slice::<f32>().chunks(v.len().max(1)).map(|c| Scale::Rows(c.to_vec())).collect())
        }
    }
}

/// The seed's fallback for `fused_all_gather_matmul` (and its scaled variant): validate, one
/// `all_gather_into_tensor`, then the matmuls on the host.
pub fn decomposed_all_gather_matmul<B: Backend>(
    b: &B,
    a: &B::Buffer,
    bs: &[B::Buffer],
    dim: usize,
    scaling: Option<&Scaling>,
) -> Result<Work<Gathered<B::Buffer>>> {
    // Recorded under the op the caller called while it runs ([clause: progress.recorded]).
    let _recorded =
        crate::progress::record(b.name(), if scaling.is_some() { "fused_all_gather_scaled_matmul" } else { "fused_all_gather_matmul" });
    let ins = input_descs(b, a, bs);
    let d = describe(CallOp::FusedAllGatherMatmul, b.rank(), ins.clone(), None, dim, scaling);
    exchange_and_validate(b, &d)?;
    let a_scales = scaling.map(|s| gather_row_scales(b, &s.a)).transpose()?;
    let work = b.all_gather_into_tensor(a)?;
    let stacked = b.download(work.wait(DECOMPOSITION_WAIT)?)?;
    let btensors = bs.iter().map(|x| b.download(x)).collect::<Result<Vec<_>>>()?;
    let plan = AgMatmulPlan::new(b.world_size(), &ins[0], &ins[1..], dim, scaling);
    let mut parts = plan.start();
    let shard_bytes = ins[0].numel() * ins[0].dtype.size();
    for r in 0..b.world_size() {
        let shard = Tensor::from_bytes(plan.dtype, &plan.shard_shape, &stacked.bytes()[r * shard_bytes..(r + 1) * shard_bytes]);
        plan.consume(&mut parts, r, &shard, &btensors, a_scales.as_ref().map(|s| &s[r]), scaling.map(|s| s.b.as_slice()));
    }
    let (ag, outs) = plan.finish(parts);
    let ag = b.upload(&ag)?;
    let outs = outs.iter().map(|t| b.upload(t)).collect::<Result<Vec<_>>>()?;
    Ok(work.counted_again((ag, outs)))
}

/// The seed's fallback for `fused_matmul_reduce_scatter` (and its scaled variant): validate,
/// `a @ b` on the host, then one `reduce_scatter_tensor` along `dim` (moved to the front).
pub fn decomposed_matmul_reduce_scatter<B: Backend>(
    b: &B,
    a: &B::Buffer,
    bm: &B::Buffer,
    op: ReduceOp,
    dim: usize,
    scaling: Option<&Scaling>,
) -> Result<Work<B::Buffer>> {
    let _recorded = crate::progress::record(
        b.name(),
        if scaling.is_some() { "fused_scaled_matmul_reduce_scatter" } else { "fused_matmul_reduce_scatter" },
    );
    let ins = input_descs(b, a, std::slice::from_ref(bm));
    let d = describe(CallOp::FusedMatmulReduceScatter, b.rank(), ins.clone(), Some(op), dim, scaling);
    exchange_and_validate(b, &d)?;
    let plan = MatmulRsPlan::new(b.world_size(), &ins[0], &ins[1], op, dim, scaling);
    let c = plan.product(&b.download(a)?, &b.download(bm)?, scaling);
    let moved = b.upload(&move_to_front(&c, dim))?;
    let work = b.reduce_scatter_tensor(&moved, op)?;
    let res = b.download(work.wait(DECOMPOSITION_WAIT)?)?;
    let out = b.upload(&move_from_front(&res, dim))?;
    Ok(work.counted_again(out))
}

/// `low_contention_all_gather` / `low_contention_reduce_scatter` by default: validate, then the
/// backend's own `all_gather_into_tensor` / `reduce_scatter_tensor`.
pub fn decomposed_low_contention<B: Backend>(b: &B, x: &B::Buffer, op: Option<ReduceOp>) -> Result<Work<B::Buffer>> {
    let (call, ins) = match op {
        None => (CallOp::LowContentionAllGather, descs_of(b, &[x])),
        Some(_) => (CallOp::LowContentionReduceScatter, descs_of(b, &[x])),
    };
    // Recorded while the call blocks (the validation's exchange); the returned work is the
    // backend's own all_gather / reduce_scatter, recorded by the backend.
    let recorded = crate::progress::record(b.name(), call.name());
    exchange_and_validate(b, &describe(call, b.rank(), ins, op, 0, None))?;
    drop(recorded);
    match op {
        None => b.all_gather_into_tensor(x),
        Some(op) => b.reduce_scatter_tensor(x, op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movedim_round_trips_and_matches_coordinates() {
        let t = Tensor::from_vec(&[2, 3, 4], (0..24).map(|x| x as f32).collect());
        for d in 0..3 {
            let m = move_to_front(&t, d);
            assert_eq!(m.shape(), moved_shape(&[2, 3, 4], d).as_slice());
            assert_eq!(move_from_front(&m, d), t);
        }
        // movedim(t, 1, 0)[j, i, k] == t[i, j, k]
        let m = move_to_front(&t, 1);
        assert_eq!(m.as_slice::<f32>()[(2 * 2 + 1) * 4 + 3], t.as_slice::<f32>()[(3 + 2) * 4 + 3]);
    }

    #[test]
    fn sgemm_multiplies() {
        let mut c = [0.0f32; 4];
        sgemm(2, 3, 2, &[1., 2., 3., 4., 5., 6.], &[1., 0., 0., 1., 1., 1.], &mut c);
        assert_eq!(c, [4., 5., 10., 11.]);
    }
}
