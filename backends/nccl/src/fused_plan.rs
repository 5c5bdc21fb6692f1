//! The pure part of the NCCL fused ops (no CUDA, no NCCL; unit-tested on any machine): which
//! shard moves at which step, how a shard or a chunk splits into pieces, and every matmul as
//! one row-major strided-batched GEMM over device buffers (element offsets, leading dims,
//! batch strides), together with where its rows land in the outputs. `fused_gpu` turns these
//! descriptions into cuBLAS / NCCL / copy calls; the tests here run the same descriptions on the
//! host and compare them with `concord_core::fused`'s plans (the decomposition's values).
//!
//! Layouts (all contiguous, row-major):
//! * all-gather-matmul, gather dim `g` of an `nd`-dim shard `s`: the gathered `ag` is
//!   `[P, ws * block]` with `P = prod(s[..g])`, `block = prod(s[g..])`; shard `r` is the
//!   `block`-wide column band `r` of it (one band when `P = 1`: it lands in `ag` directly).
//!   For `g < nd - 1` every output is `ag @ b` row by row: shard `r`'s rows (`P` batches of
//!   `R = prod(s[g..nd-1])` rows of `k = s[nd-1]`) go to rows `r * R ..` of each batch of
//!   `ws * R` output rows. For `g = nd - 1` (the seed's movedim case) the output is
//!   `[L, n, ws * sg]` with `L = prod(s[..nd-2])`, `k = s[nd-2]`, `sg = s[nd-1]`, and batch
//!   `l`'s columns `r * sg ..` are `b^T · shard[l]` (`[n, k] · [k, sg]`).
//! * matmul-reduce-scatter, scatter dim `d` of `c = a @ b` (`a`: `[.., k]`, `b`: `[k, n]`):
//!   the chunk for rank `p` is staged contiguously at `p * chunk` in the output's layout
//!   (`[P, R, n]` with `P = prod(a[..d])`, `R = a[d] / ws * prod(a[d+1..nd-1])` for
//!   `d < nd - 1`; `[M, n / ws]`, the columns `p * n / ws ..` of `b`, for `d = nd - 1`), then
//!   reduced onto rank `p` (piece by piece) straight into its output.

/// One operand of a [`Gemm`]: element offset into its buffer, leading dimension (row-major),
/// whether it is used transposed, and its batch stride (elements; 0: the same for every batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub off: usize,
    pub ld: usize,
    pub trans: bool,
    pub stride: usize,
}

/// A row-major strided-batched GEMM: for every batch `i < batch`,
/// `C_i[m × n] = X_i[m × k] · Y_i[k × n]` where `(X, Y)` is `(op(A), op(B))`, or
/// `(op(B), op(A))` when `b_first` (A: the `a` side — a shard or `a`; B: the `b` matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub b_first: bool,
}

impl Gemm {
    /// Whether every size fits cuBLAS's 32-bit arguments.
    pub fn fits_i32(&self) -> bool {
        let max = i32::MAX as usize;
        [self.m, self.n, self.k, self.batch, self.a.ld, self.b.ld, self.c.ld].iter().all(|&x| x <= max)
    }

    /// Nothing to multiply (an empty output; a zero contraction is not empty: it writes zeros).
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }
}

/// A strided copy of `height` rows of `width` elements (`src_pitch` / `dst_pitch` elements
/// apart) from `src_off` to `dst_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2D {
    pub src_off: usize,
    pub dst_off: usize,
    pub width: usize,
    pub height: usize,
    pub src_pitch: usize,
    pub dst_pitch: usize,
}

/// Splits `units` (rows or batches, `unit_bytes` each) into at most `max` contiguous pieces of
/// at least `target` bytes each (one piece when the whole is smaller), balanced, in order.
pub fn pieces(units: usize, unit_bytes: usize, target: usize, max: usize) -> Vec<(usize, usize)> {
    if units == 0 {
        return vec![(0, 0)];
    }
    let total = units.saturating_mul(unit_bytes);
    let n = (total / target.max(1)).clamp(1, max.max(1)).min(units);
    (0..n).map(|i| (units * i / n, units * (i + 1) / n)).collect()
}

/// The peers of step `step` (1..ws) of the all-gather: this rank sends its shard to
/// `rank - step` and receives the shard of `rank + step` (the pair that rank `rank - step`
/// receives from at the same step is this rank: every send meets its receive).
pub fn ag_step_peers(ws: usize, rank: usize, step: usize) -> (usize, usize) {
    ((rank + ws - step % ws) % ws, (rank + step) % ws)
}

/// The geometry of one `fused_all_gather_matmul` (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgGeom {
    pub ws: usize,
    /// Elements of one shard.
    pub elems: usize,
    /// `P` and `block` of the gathered layout.
    pub bands: usize,
    pub block: usize,
    kind: AgKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgKind {
    /// `g < nd - 1`: `p` batches of `r` rows of `k`.
    Rows { p: usize, r: usize, k: usize },
    /// `g = nd - 1`: `l` batches of `[k, sg]`.
    Cols { l: usize, k: usize, sg: usize },
}

impl AgGeom {
    /// `shard` is `a_shard`'s shape (at least 2 dims, `dim < shard.len()`: the rule table's).
    pub fn new(ws: usize, shard: &[usize], dim: usize) -> AgGeom {
        let nd = shard.len();
        let prod = |s: &[usize]| s.iter().product::<usize>();
        let (bands, block) = (prod(&shard[..dim]), prod(&shard[dim..]));
        let kind = if dim + 1 < nd {
            AgKind::Rows { p: bands, r: prod(&shard[dim..nd - 1]), k: shard[nd - 1] }
        } else {
            AgKind::Cols { l: prod(&shard[..nd - 2]), k: shard[nd - 2], sg: shard[nd - 1] }
        };
        AgGeom { ws, elems: prod(shard), bands, block, kind }
    }

    /// The contraction length (`b`'s rows).
    pub fn k(&self) -> usize {
        match self.kind {
            AgKind::Rows { k, .. } | AgKind::Cols { k, .. } => k,
        }
    }

    /// Whether shards land in `ag` directly (one band): else through a staging buffer of
    /// `ws` shards, then [`AgGeom::placement`].
    pub fn direct(&self) -> bool {
        self.bands <= 1
    }

    /// The units a shard splits into for pieces (rows, or batches when there are several) and
    /// the shard elements per unit: unit `u` is shard elements `u * per .. (u + 1) * per`.
    pub fn units(&self) -> (usize, usize) {
        match self.kind {
            AgKind::Rows { p, r, k } if p > 1 => (p, r * k),
            AgKind::Rows { r, k, .. } => (r, k),
            AgKind::Cols { l, k, sg } => (l, k * sg),
        }
    }

    /// Shard `r`'s band of `ag`, copied from the shard (contiguous) into `ag`.
    pub fn placement(&self, r: usize) -> Copy2D {
        Copy2D {
            src_off: 0,
            dst_off: r * self.block,
            width: self.block,
            height: self.bands,
            src_pitch: self.block,
            dst_pitch: self.ws * self.block,
        }
    }

    /// The GEMM of units `u0..u1` of shard `r` into an output for a `b` of `n` columns (`a`
    /// offsets relative to the shard's first element, `c` offsets into the whole output).
    pub fn gemm(&self, r: usize, n: usize, (u0, u1): (usize, usize)) -> Gemm {
        let ws = self.ws;
        let b_plain = Operand { off: 0, ld: n, trans: false, stride: 0 };
        match self.kind {
            AgKind::Rows { p, r: rows, k } if p > 1 => Gemm {
                m: rows,
                n,
                k,
                batch: u1 - u0,
                a: Operand { off: u0 * rows * k, ld: k, trans: false, stride: rows * k },
                b: b_plain,
                c: Operand { off: u0 * ws * rows * n + r * rows * n, ld: n, trans: false, stride: ws * rows * n },
                b_first: false,
            },
            AgKind::Rows { r: rows, k, .. } => Gemm {
                m: u1 - u0,
                n,
                k,
                batch: 1,
                a: Operand { off: u0 * k, ld: k, trans: false, stride: 0 },
                b: b_plain,
                c: Operand { off: (r * rows + u0) * n, ld: n, trans: false, stride: 0 },
                b_first: false,
            },
            AgKind::Cols { k, sg, .. } => Gemm {
                m: n,
                n: sg,
                k,
                batch: u1 - u0,
                a: Operand { off: u0 * k * sg, ld: sg, trans: false, stride: k * sg },
                b: Operand { off: 0, ld: n, trans: true, stride: 0 },
                c: Operand { off: u0 * n * ws * sg + r * sg, ld: ws * sg, trans: false, stride: n * ws * sg },
                b_first: true,
            },
        }
    }
}

/// The geometry of one `fused_matmul_reduce_scatter` (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsGeom {
    pub ws: usize,
    kind: RsKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RsKind {
    /// `d < nd - 1`: `p` batches of `r` rows (per target rank) of `k`; `n` output columns.
    Rows { p: usize, r: usize, k: usize, n: usize },
    /// `d = nd - 1`: `m` rows, `cs = n / ws` columns per target rank.
    Cols { m: usize, k: usize, n: usize, cs: usize },
}

impl RsGeom {
    /// `a`'s shape, `b`'s columns and the scatter dim (the rule table's: divisible by `ws`).
    pub fn new(ws: usize, a: &[usize], n: usize, dim: usize) -> RsGeom {
        let nd = a.len();
        let prod = |s: &[usize]| s.iter().product::<usize>();
        let k = a[nd - 1];
        let kind = if dim + 1 < nd {
            RsKind::Rows { p: prod(&a[..dim]), r: a[dim] / ws * prod(&a[dim + 1..nd - 1]), k, n }
        } else {
            RsKind::Cols { m: prod(&a[..nd - 1]), k, n, cs: n / ws }
        };
        RsGeom { ws, kind }
    }

    /// Elements of one rank's chunk (= of the output).
    pub fn chunk(&self) -> usize {
        match self.kind {
            RsKind::Rows { p, r, n, .. } => p * r * n,
            RsKind::Cols { m, cs, .. } => m * cs,
        }
    }

    /// The units a chunk splits into for pieces, and the chunk elements per unit.
    pub fn units(&self) -> (usize, usize) {
        match self.kind {
            RsKind::Rows { p, r, n, .. } if p > 1 => (p, r * n),
            RsKind::Rows { r, n, .. } => (r, n),
            RsKind::Cols { m, cs, .. } => (m, cs),
        }
    }

    /// The GEMM of units `u0..u1` of the chunk for rank `target`, into the staging buffer of
    /// `ws` chunks (`a` offsets into `a`, `b` into `b`).
    pub fn gemm(&self, target: usize, (u0, u1): (usize, usize)) -> Gemm {
        let (ws, base) = (self.ws, target * self.chunk());
        match self.kind {
            RsKind::Rows { p, r, k, n } if p > 1 => Gemm {
                m: r,
                n,
                k,
                batch: u1 - u0,
                a: Operand { off: u0 * ws * r * k + target * r * k, ld: k, trans: false, stride: ws * r * k },
                b: Operand { off: 0, ld: n, trans: false, stride: 0 },
                c: Operand { off: base + u0 * r * n, ld: n, trans: false, stride: r * n },
                b_first: false,
            },
            RsKind::Rows { r, k, n, .. } => Gemm {
                m: u1 - u0,
                n,
                k,
                batch: 1,
                a: Operand { off: (target * r + u0) * k, ld: k, trans: false, stride: 0 },
                b: Operand { off: 0, ld: n, trans: false, stride: 0 },
                c: Operand { off: base + u0 * n, ld: n, trans: false, stride: 0 },
                b_first: false,
            },
            RsKind::Cols { k, n, cs, .. } => Gemm {
                m: u1 - u0,
                n: cs,
                k,
                batch: 1,
                a: Operand { off: u0 * k, ld: k, trans: false, stride: 0 },
                b: Operand { off: target * cs, ld: n, trans: false, stride: 0 },
                c: Operand { off: base + u0 * cs, ld: cs, trans: false, stride: 0 },
                b_first: false,
            },
        }
    }
}

/// One `cublasGemmStridedBatchedEx` call (column-major) for a [`Gemm`]: row-major `C = X · Y`
/// is column-major `Cᵀ = Yᵀ · Xᵀ`, and a row-major operand's memory is its column-major
/// transpose, so each operand keeps its own `trans` and X / Y swap places. `first_is_b`: the
/// call's first operand is the `b` matrix (else the `a` side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlasCall {
    pub trans_first: bool,
    pub trans_second: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub first: Operand,
    pub second: Operand,
    pub first_is_b: bool,
    pub c: Operand,
    pub batch: usize,
}

impl Gemm {
    pub fn blas(&self) -> BlasCall {
        let (x, y, y_is_b) = if self.b_first { (self.b, self.a, false) } else { (self.a, self.b, true) };
        BlasCall {
            trans_first: y.trans,
            trans_second: x.trans,
            m: self.n,
            n: self.m,
            k: self.k,
            first: y,
            second: x,
            first_is_b: y_is_b,
            c: self.c,
            batch: self.batch,
        }
    }
}

impl BlasCall {
    /// cuBLAS's argument rules (`CUBLAS_STATUS_INVALID_VALUE` otherwise).
    pub fn valid(&self) -> bool {
        let rows_first = if self.trans_first { self.k } else { self.m };
        let rows_second = if self.trans_second { self.n } else { self.k };
        self.first.ld >= rows_first.max(1) && self.second.ld >= rows_second.max(1) && self.c.ld >= self.m.max(1)
    }

    /// What cuBLAS computes (column-major, `alpha = 1`, `beta = 0`), on the host.
    pub fn run_host(&self, a: &[f64], b: &[f64], c: &mut [f64]) {
        let (fa, sa) = if self.first_is_b { (b, a) } else { (a, b) };
        let el = |op: &Operand, t: bool, buf: &[f64], bi: usize, i: usize, j: usize| {
            let base = op.off + bi * op.stride;
            if t {
                buf[base + j + i * op.ld]
            } else {
                buf[base + i + j * op.ld]
            }
        };
        for bi in 0..self.batch {
            for i in 0..self.m {
                for j in 0..self.n {
                    let acc: f64 = (0..self.k)
                        .map(|l| el(&self.first, self.trans_first, fa, bi, i, l) * el(&self.second, self.trans_second, sa, bi, l, j))
                        .sum();
                    c[self.c.off + bi * self.c.stride + i + j * self.c.ld] = acc;
                }
            }
        }
    }
}

/// Runs `g` on the host (f64): the tests' model of what cuBLAS is asked to compute.
pub fn host_gemm(g: &Gemm, a: &[f64], b: &[f64], c: &mut [f64]) {
    let at = |op: &Operand, buf: &[f64], bi: usize, i: usize, j: usize| {
        let base = op.off + bi * op.stride;
        if op.trans {
            buf[base + j * op.ld + i]
        } else {
            buf[base + i * op.ld + j]
        }
    };
    for bi in 0..g.batch {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0.0;
                for l in 0..g.k {
                    acc += if g.b_first {
                        at(&g.b, b, bi, i, l) * at(&g.a, a, bi, l, j)
                    } else {
                        at(&g.a, a, bi, i, l) * at(&g.b, b, bi, l, j)
                    };
                }
                c[g.c.off + bi * g.c.stride + i * g.c.ld + j] = acc;
            }
        }
    }
}

/// Runs `c` on the host.
pub fn host_copy(c: &Copy2D, src: &[f64], dst: &mut [f64]) {
    for y in 0..c.height {
        let (s, d) = (c.src_off + y * c.src_pitch, c.dst_off + y * c.dst_pitch);
        dst[d..d + c.width].copy_from_slice(&src[s..s + c.width]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::fused::{AgMatmulPlan, MatmulRsPlan};
    use concord_core::{DType, ReduceOp, Tensor, TensorDesc};

    /// The cuBLAS call made for `g` is valid and computes what `g` describes (same bits:
    /// small integers), writing nothing else.
    fn check_blas(g: &Gemm, a: &[f64], b: &[f64], c_len: usize) {
        let call = g.blas();
        assert!(call.valid(), "{g:?} -> {call:?}");
        let (mut want, mut got) = (vec![f64::NAN; c_len], vec![f64::NAN; c_len]);
        host_gemm(g, a, b, &mut want);
        call.run_host(a, b, &mut got);
        assert!(want.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()), "{g:?} -> {call:?}");
    }

    fn vals(n: usize, seed: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 7 + seed * 13 + i / 3) % 9) as f64 - 4.0).collect()
    }

    /// Every shard (each rank's own values) through the pieces' GEMMs and placements, against
    /// `AgMatmulPlan`'s gathered tensor and outputs.
    fn check_ag(ws: usize, shard: &[usize], dim: usize, ns: &[usize], target: usize) {
        let geo = AgGeom::new(ws, shard, dim);
        let d = TensorDesc::new(DType::F64, shard);
        let k = geo.k();
        let bdescs: Vec<TensorDesc> = ns.iter().map(|n| TensorDesc::new(DType::F64, &[k, *n])).collect();
        let plan = AgMatmulPlan::new(ws, &d, &bdescs, dim, None);
        let shards: Vec<Vec<f64>> = (0..ws).map(|r| vals(geo.elems, r)).collect();
        let bs: Vec<Vec<f64>> = ns.iter().enumerate().map(|(i, n)| vals(k * n, 50 + i)).collect();
        let mut parts = plan.start();
        let bts: Vec<Tensor> = bs.iter().zip(ns).map(|(v, n)| Tensor::from_f64(DType::F64, &[k, *n], v)).collect();
        for (r, s) in shards.iter().enumerate() {
            plan.consume(&mut parts, r, &Tensor::from_f64(DType::F64, shard, s), &bts, None, None);
        }
        let (ag_want, outs_want) = plan.finish(parts);
        let mut ag = vec![f64::NAN; geo.elems * ws];
        let mut outs: Vec<Vec<f64>> = outs_want.iter().map(|t| vec![f64::NAN; t.numel()]).collect();
        let (units, per) = geo.units();
        let ps = pieces(units, per * 8, target, 8);
        assert_eq!(ps.first().map(|p| p.0), Some(0));
        assert_eq!(ps.last().map(|p| p.1), Some(units));
        for me in 0..ws {
            // The order a rank consumes them in: its own, then step by step.
            let order: Vec<usize> = std::iter::once(me).chain((1..ws).map(|s| ag_step_peers(ws, me, s).1)).collect();
            for &r in &order {
                host_copy(&geo.placement(r), &shards[r], &mut ag);
                for &p in &ps {
                    // A piece reads only its own units of the shard (it may run as soon as they land).
                    let mut only = vec![f64::NAN; geo.elems];
                    only[p.0 * per..p.1 * per].copy_from_slice(&shards[r][p.0 * per..p.1 * per]);
                    for (i, n) in ns.iter().enumerate() {
                        let g = geo.gemm(r, *n, p);
                        host_gemm(&g, &only, &bs[i], &mut outs[i]);
                        check_blas(&g, &only, &bs[i], outs[i].len());
                    }
                }
            }
            assert_eq!(ag, ag_want.as_slice::<f64>(), "ag ws{ws} {shard:?} dim{dim}");
            for (i, o) in outs.iter().enumerate() {
                assert_eq!(o.as_slice(), outs_want[i].as_slice::<f64>(), "out {i} ws{ws} {shard:?} dim{dim} rank{me}");
            }
        }
    }

    #[test]
    fn ag_pieces_match_the_core_plan_on_every_dim() {
        for ws in [1, 2, 3, 4] {
            for (shard, dims) in [(vec![4usize, 8, 6], 0..3), (vec![3, 5], 0..2), (vec![2, 3, 4, 5], 0..4), (vec![1, 6, 4], 0..3)] {
                for dim in dims {
                    for target in [1, 64, 1 << 30] {
                        check_ag(ws, &shard, dim, &[5, 2], target);
                    }
                }
            }
        }
    }

    #[test]
    fn ag_direct_only_with_one_band() {
        assert!(AgGeom::new(4, &[8, 64, 32], 0).direct());
        assert!(!AgGeom::new(4, &[8, 64, 32], 1).direct());
        assert!(!AgGeom::new(4, &[8, 64, 32], 2).direct());
        assert!(AgGeom::new(4, &[1, 64, 32], 1).direct());
    }

    fn check_rs(ws: usize, a_shape: &[usize], n: usize, dim: usize, target: usize) {
        let geo = RsGeom::new(ws, a_shape, n, dim);
        let k = *a_shape.last().unwrap();
        let ad = TensorDesc::new(DType::F64, a_shape);
        let bd = TensorDesc::new(DType::F64, &[k, n]);
        let plan = MatmulRsPlan::new(ws, &ad, &bd, ReduceOp::Sum, dim, None);
        let av = vals(ad.numel(), 3);
        let bv = vals(k * n, 4);
        let (at, bt) = (Tensor::from_f64(DType::F64, a_shape, &av), Tensor::from_f64(DType::F64, &[k, n], &bv));
        let mut staging = vec![f64::NAN; ws * geo.chunk()];
        let (units, per) = geo.units();
        assert_eq!(units * per, geo.chunk());
        for p in 0..ws {
            for pc in pieces(units, per * 8, target, 8) {
                let g = geo.gemm(p, pc);
                host_gemm(&g, &av, &bv, &mut staging);
                check_blas(&g, &av, &bv, staging.len());
            }
            let want = plan.chunk(p, &at, &bt, None, None);
            assert_eq!(want.numel(), geo.chunk());
            assert_eq!(&staging[p * geo.chunk()..(p + 1) * geo.chunk()], want.as_slice::<f64>(), "ws{ws} {a_shape:?} dim{dim} chunk {p}");
        }
    }

    #[test]
    fn rs_chunks_match_the_core_plan_on_every_dim() {
        for ws in [1, 2, 3, 4] {
            for dim in 0..3 {
                let mut a = vec![2 * ws, 3 * ws, 5];
                let n = 2 * ws;
                if dim == 2 {
                    a = vec![2, 3, 5];
                }
                for target in [1, 64, 1 << 30] {
                    check_rs(ws, &a, n, dim, target);
                }
            }
            check_rs(ws, &[4 * ws, 6], 3, 0, 1);
            check_rs(ws, &[4, 6], ws, 1, 1);
        }
    }

    #[test]
    fn pieces_cover_in_order_and_respect_the_bounds() {
        assert_eq!(pieces(10, 100, 1 << 20, 8), vec![(0, 10)]);
        assert_eq!(pieces(10, 100, 250, 8), vec![(0, 2), (2, 5), (5, 7), (7, 10)]);
        assert_eq!(pieces(3, 1 << 20, 1, 8), vec![(0, 1), (1, 2), (2, 3)]);
        assert_eq!(pieces(100, 1 << 20, 1, 4).len(), 4);
        assert_eq!(pieces(0, 8, 1, 4), vec![(0, 0)]);
        for units in 1..40 {
            for max in 1..6 {
                let p = pieces(units, 1, 1, max);
                assert!(p.len() <= max && p.iter().all(|(a, b)| a < b));
                assert!(p.windows(2).all(|w| w[0].1 == w[1].0));
                assert_eq!((p[0].0, p[p.len() - 1].1), (0, units));
            }
        }
    }

    #[test]
    fn every_send_meets_its_receive() {
        for ws in 1..9 {
            for step in 1..ws {
                for r in 0..ws {
                    let (to, from) = ag_step_peers(ws, r, step);
                    assert_ne!(to, r);
                    assert_eq!(ag_step_peers(ws, to, step).1, r, "ws{ws} step{step}");
                    assert_eq!(ag_step_peers(ws, from, step).0, r);
                }
            }
        }
    }

    #[test]
    fn gemm_sizes_for_the_seed_shapes() {
        let g = AgGeom::new(2, &[8, 64, 32], 0).gemm(1, 16, (0, 512));
        assert_eq!((g.m, g.n, g.k, g.batch, g.c.off), (512, 16, 32, 1, 512 * 16));
        let g = AgGeom::new(2, &[8, 64, 32], 2).gemm(0, 16, (0, 8));
        assert_eq!((g.m, g.n, g.k, g.batch, g.b_first, g.c.ld), (16, 32, 64, 8, true, 64));
        assert!(g.fits_i32() && !g.is_empty());
    }
}
