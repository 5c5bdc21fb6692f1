//! Fused communication + compute (issue 13, seed 004): `fused_all_gather_matmul`,
//! `fused_matmul_reduce_scatter`, their scaled variants and the low-contention all-gather /
//! reduce-scatter, on every backend (native or the trait's decomposition alike).
//!
//! * Values: gather / scatter dims 0, 1, 2 of a 3-D `a`, two `b`s, f32 / bf16 / f16, sum and avg,
//!   per-tensor and per-row scales into another output dtype at every dim (and on random inputs
//!   into f32), world sizes 1–8 (the catalogue's),
//!   the seed's own shapes (`a_shard [8, 64, 32]`, `b [32, 16]`); every output of every rank
//!   (the all-gathered `a` too) against `concord_oracle::fused`: bit-exact on exact-by-
//!   construction inputs (small integers, power-of-two scales), within
//!   [`concord_oracle::fused_tolerance`] on random ones.
//! * Buffers: inputs are views into parents full of guard bytes; after the op every parent byte
//!   (the input itself and the guards) is unchanged, no output aliases an input; the op is issued
//!   twice on the same buffers (buffer reuse) and each result waited twice (idempotent), and
//!   `outstanding()` is 0 after; a first call's outputs still hold its values after a second
//!   call on other inputs (`::outputs_kept::`); two calls issued before either is waited
//!   each return their own values (`::in_flight_twice::`; the low-contention ops too, at 2 ranks).
//! * Odd shard shapes (`::odd_rows::`, `a_shard [3, 5, 7]`): odd row counts and contraction
//!   lengths on every gather dim at 2 and 3 ranks; in f16 / bf16 too (`::odd_k::`, review19).
//! * Bad input: each of the seed's errors (and the rule table's F1–F9), on one rank or all, is
//!   the oracle's named error on every rank; a good call on the same world then passes.
//!
//! Only the body's thin shim is generic over the backend; inputs, oracle and messages are not.

use super::util::{fail, hold_off, take_keys, GAP_REFUSALS};
use crate::case::{backend_label, Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, BadInputKind, Capabilities, CollectiveError, DType, ReduceOp, Scale, Scaling, Tensor};
use concord_oracle::{avg_ulps, compare, expected_fused, expected_fused_for, fused_tolerance, FusedCall, FusedInputs, Tolerance};
use std::sync::Arc;

/// What a case feeds the op on every rank.
#[derive(Clone, Debug)]
pub struct FusedSpec {
    pub call: FusedCall,
    pub dtype: DType,
    pub a_shape: Vec<usize>,
    /// One shape per `b` (empty for the low-contention ops).
    pub b_shapes: Vec<Vec<usize>>,
    /// Per-row `a` scales (the scaled variants): each rank its own.
    pub row_scales: bool,
    pub exact: bool,
    /// A rank whose call differs (bad-input cases): `(rank, its a shape, its call)`.
    pub odd_rank: Option<(usize, Vec<usize>, FusedCall)>,
    /// The `b`s' dtype when it differs from `a`'s (bad-input cases; `None`: `dtype`).
    pub b_dtype: Option<DType>,
}

/// A small deterministic generator (inputs must be the same on every rank that builds them).
/// (`concord_fixtures::xorshift_values`: the loop lives there, compiled at the profile's
/// level, not the suites' opt-level 1.)
fn values(seed: u64, n: usize, exact: bool, lo: i64, hi: i64) -> Vec<f64> {
    concord_fixtures::xorshift_values(seed, n, exact, lo, hi)
}

impl FusedSpec {
    /// A reduce-scatter whose reduce op is avg.
    fn is_avg(&self) -> bool {
        matches!(
            self.call,
            FusedCall::MatmulReduceScatter { op: ReduceOp::Avg, .. } | FusedCall::LowContentionReduceScatter { op: ReduceOp::Avg }
        )
    }

    fn call_of(&self, rank: usize) -> &FusedCall {
        match &self.odd_rank {
            Some((r, _, c)) if *r == rank => c,
            _ => &self.call,
        }
    }

    /// Rank `r`'s inputs (every rank can build every rank's).
    pub fn inputs(&self, r: usize, seed: u64) -> FusedInputs {
        self.inputs_with(r, seed, None)
    }

    /// Rank `r`'s inputs as rank `reader` of `ws` needs them for its own answer: whole, except
    /// where the oracle reads one chunk of each rank's `a` (a reduce-scatter along dim 0, fused
    /// or low-contention: chunk `reader` of the flat `a`, [`concord_oracle::expected_fused_for`]
    /// with `only = reader`), whose other elements are left zero (not drawn into the tensor): the
    /// same answer, without every rank making every peer's whole operand.
    pub fn inputs_read_by(&self, r: usize, seed: u64, ws: usize, reader: usize) -> FusedInputs {
        let chunked = matches!(self.call, FusedCall::MatmulReduceScatter { dim: 0, .. } | FusedCall::LowContentionReduceScatter { .. });
        let n: usize = self.a_shape.iter().product();
        if r == reader || !chunked || self.odd_rank.is_some() || self.a_shape.first().is_none_or(|d0| d0 % ws != 0) {
            return self.inputs(r, seed);
        }
        self.inputs_with(r, seed, Some(reader * n / ws..(reader + 1) * n / ws))
    }

    /// [`FusedSpec::inputs`]; with `a_part`, only those elements of `a` (the rest zero).
    fn inputs_with(&self, r: usize, seed: u64, a_part: Option<std::ops::Range<usize>>) -> FusedInputs {
        let a_shape = match &self.odd_rank {
            Some((o, s, _)) if *o == r => s.clone(),
            _ => self.a_shape.clone(),
        };
        let n: usize = a_shape.iter().product();
        let s = seed ^ ((r as u64 + 1) * 7919);
        // An avg's terms share a sign at each output element (as nccl-tests' avg inputs): with
        // mixed signs a backend that pre-multiplies by 1/ws (NCCL) is off by far more than any
        // ulp bound where a sum cancels (observed at 3 ranks on NCCL 2.28). So `a` is
        // non-negative and `b`'s column j (the low-contention reduce-scatter's element j) takes
        // a sign every rank draws alike: negative values stay, never mixed within one sum.
        let avg = self.is_avg();
        let lo = |l: i64| if avg { 0 } else { l };
        // `from`: the index of `v[0]` in the whole tensor.
        let signed = |mut v: Vec<f64>, cols: usize, from: usize| {
            if avg {
                for (i, x) in v.iter_mut().enumerate() {
                    *x *= concord_fixtures::shared_sign(seed, (from + i) % cols.max(1));
                }
            }
            v
        };
        let part = a_part.unwrap_or(0..n);
        let mut av = concord_fixtures::xorshift_values_range(s, part.clone(), self.exact, lo(-2), 2);
        if self.b_shapes.is_empty() {
            av = signed(av, n, part.start);
        }
        let a = if part.len() == n {
            Tensor::from_f64(self.dtype, &a_shape, &av)
        } else {
            let mut a = Tensor::zeros(self.dtype, &a_shape);
            let es = self.dtype.size();
            let chunk = Tensor::from_f64(self.dtype, &[part.len()], &av);
            a.bytes_mut()[part.start * es..part.end * es].copy_from_slice(chunk.bytes());
            a
        };
        let bs = self
            .b_shapes
            .iter()
            .enumerate()
            .map(|(i, sh)| {
                let bv = values(s ^ ((i as u64 + 11) << 20), sh.iter().product(), self.exact, lo(-1), 1);
                Tensor::from_f64(self.b_dtype.unwrap_or(self.dtype), sh, &signed(bv, *sh.last().unwrap_or(&1), 0))
            })
            .collect();
        let a_scale = self.call.scaling().map(|sc| {
            if self.row_scales {
                let k = match self.call {
                    FusedCall::AllGatherMatmul { dim, .. } => *concord_core::fused::moved_shape(&a_shape, dim).last().unwrap_or(&1),
                    _ => *a_shape.last().unwrap_or(&1),
                };
                let rows = n.checked_div(k).unwrap_or(0);
                Scale::Rows((0..rows).map(|i| [0.5f32, 1.0, 2.0][(i + r) % 3]).collect())
            } else {
                sc.a.clone()
            }
        });
        FusedInputs { a, bs, a_scale }
    }

    fn k(&self) -> usize {
        self.b_shapes.first().map_or(1, |b| b[0])
    }

    fn out_dtype(&self) -> DType {
        self.call.scaling().map_or(self.dtype, |s| s.out_dtype)
    }

    fn variant(&self) -> &'static str {
        if self.call.scaling().is_some() {
            "scaled"
        } else {
            "out"
        }
    }

    /// What the call is beside the where-line's axes: its dim and operand shapes.
    fn describe(&self) -> String {
        let dim = match &self.call {
            FusedCall::AllGatherMatmul { dim, .. } | FusedCall::MatmulReduceScatter { dim, .. } => format!("dim={dim}"),
            _ => "dim=0".into(),
        };
        format!("{dim} a={:?} b={:?}", self.a_shape, self.b_shapes)
    }
}

/// The outputs of one issue, downloaded; or its error.
type Outs = Result<Vec<Tensor>, CollectiveError>;

/// The one generic shim: issue `call` on `b` with this rank's inputs as views into guarded
/// parents, wait twice, download, and check the parents and aliasing. `Err(CaseEnd)` for a
/// broken buffer rule; `Ok(Err(e))` when the op reported `e`.
fn issue<B: Backend>(b: &B, call: &FusedCall, me: &FusedInputs, ctx_timeout: std::time::Duration, where_: &str) -> Result<Outs, CaseEnd> {
    issue_when(b, call, me, ctx_timeout, where_, &|| Ok(()))
}

/// [`issue`], running `ready` once the operands are in place, just before the call.
fn issue_when<B: Backend>(
    b: &B,
    call: &FusedCall,
    me: &FusedInputs,
    ctx_timeout: std::time::Duration,
    where_: &str,
    ready: &dyn Fn() -> Result<(), CaseEnd>,
) -> Result<Outs, CaseEnd> {
    Ok(issue_keep_when(b, call, me, ctx_timeout, where_, ready)?.map(|(got, _)| got))
}

/// [`issue_when`], also returning the output buffers themselves (to read them again later).
type Kept<Buf> = Result<(Vec<Tensor>, Vec<Buf>), CollectiveError>;

fn issue_keep_when<B: Backend>(
    b: &B,
    call: &FusedCall,
    me: &FusedInputs,
    ctx_timeout: std::time::Duration,
    where_: &str,
    ready: &dyn Fn() -> Result<(), CaseEnd>,
) -> Result<Kept<B::Buffer>, CaseEnd> {
    const OFF: usize = 3;
    const GUARD: u8 = 0xA5;
    let mk = |t: &Tensor| -> Result<(B::Buffer, B::Buffer, Tensor), CaseEnd> {
        let n = t.numel();
        let mut p = Tensor::filled_bytes(t.dtype(), &[n + 2 * OFF + 1], GUARD);
        let es = t.dtype().size();
        p.bytes_mut()[OFF * es..(OFF + n) * es].copy_from_slice(t.bytes());
        let parent = b.upload(&p)?;
        let view = b.view(&parent, OFF, t.shape())?;
        Ok((parent, view, p))
    };
    let a = mk(&me.a)?;
    let bs = me.bs.iter().map(mk).collect::<Result<Vec<_>, _>>()?;
    let bviews: Vec<B::Buffer> = bs.iter().map(|x| x.1.clone()).collect();
    let t = ctx_timeout;
    let scaling = call.scaling().map(|s| Scaling { a: me.a_scale.clone().unwrap_or(s.a.clone()), ..s.clone() });
    ready()?;
    let got: Result<Vec<B::Buffer>, CollectiveError> = (|| match call {
        FusedCall::AllGatherMatmul { dim, .. } => {
            let w = match &scaling {
                None => b.fused_all_gather_matmul(&a.1, &bviews, *dim)?,
                Some(s) => b.fused_all_gather_scaled_matmul(&a.1, &bviews, *dim, s)?,
            };
            w.wait(t)?;
            let (ag, outs) = w.into_value(t)?;
            Ok(std::iter::once(ag).chain(outs).collect())
        }
        FusedCall::MatmulReduceScatter { op, dim, .. } => {
            let w = match &scaling {
                None => b.fused_matmul_reduce_scatter(&a.1, &bviews[0], *op, *dim)?,
                Some(s) => b.fused_scaled_matmul_reduce_scatter(&a.1, &bviews[0], *op, *dim, s)?,
            };
            w.wait(t)?;
            Ok(vec![w.into_value(t)?])
        }
        FusedCall::LowContentionAllGather => {
            let w = b.low_contention_all_gather(&a.1)?;
            w.wait(t)?;
            Ok(vec![w.into_value(t)?])
        }
        FusedCall::LowContentionReduceScatter { op } => {
            let w = b.low_contention_reduce_scatter(&a.1, *op)?;
            w.wait(t)?;
            Ok(vec![w.into_value(t)?])
        }
    })();
    let moves = b.capabilities().moves_data;
    if !moves {
        crate::case::note_values_unchecked();
    }
    for (i, (parent, _, host)) in std::iter::once(&a).chain(bs.iter()).enumerate() {
        if moves && b.download(parent)?.bytes() != host.bytes() {
            return Err(fail(
                where_,
                format!("input {i} (or a guard byte around it) changed: the op MUST leave its inputs untouched and write only its outputs"),
            ));
        }
    }
    let got = match got {
        Ok(g) => g,
        Err(e) => return Ok(Err(e)),
    };
    for (i, g) in got.iter().enumerate() {
        let (lo, hi) = (b.buffer_addr(g), b.buffer_addr(g) + b.buffer_dtype(g).size() * b.buffer_shape(g).iter().product::<usize>());
        for (j, (p, _, host)) in std::iter::once(&a).chain(bs.iter()).enumerate() {
            let (plo, phi) = (b.buffer_addr(p), b.buffer_addr(p) + host.len_bytes());
            if lo < phi && plo < hi {
                return Err(fail(where_, format!("output {i} overlaps input {j}'s buffer")));
            }
        }
    }
    Ok(Ok((got.iter().map(|g| b.download(g)).collect::<Result<Vec<_>, _>>()?, got)))
}

fn where_of(backend: &str, spec: &FusedSpec, ws: usize, rank: usize) -> String {
    format!("{} {}", crate::case::axes(backend, spec.call.name(), spec.variant(), spec.dtype.name(), ws, rank), spec.describe())
}

/// Checks one rank's outputs against the oracle's (non-generic).
/// The oracle's answer for this rank (each rank's call: bad-input cases make one rank's differ).
type Expected = Result<Vec<Vec<Tensor>>, concord_core::BadInput>;

fn expected_for(spec: &FusedSpec, caps: &Capabilities, seed: u64, ws: usize, rank: usize) -> Expected {
    let inputs: Vec<FusedInputs> = (0..ws).map(|r| spec.inputs_read_by(r, seed, ws, rank)).collect();
    if spec.odd_rank.is_some() {
        odd_expected(spec, &inputs, caps)
    } else {
        expected_fused_for(&spec.call, &inputs, caps, Some(rank))
    }
}

fn check(spec: &FusedSpec, caps: &Capabilities, exp: &Expected, ws: usize, rank: usize, got: Outs, where_: &str) -> CaseResult {
    match (exp.clone(), got) {
        (Err(bad), Err(e)) => {
            if e.bad_input_kind() == Some(bad.kind) {
                Ok(())
            } else {
                Err(fail(where_, format!("expected bad_input:{} ({}) on every rank, got {e} [{}]", bad.kind.name(), bad.detail, e.name())))
            }
        }
        (Err(bad), Ok(_)) => {
            Err(fail(where_, format!("expected bad_input:{} ({}) on every rank, the op succeeded", bad.kind.name(), bad.detail)))
        }
        (Ok(_), Err(e)) => Err(fail(where_, format!("collective failed: {e} [{}]", e.name()))),
        (Ok(exp), Ok(got)) => {
            let exp = &exp[rank];
            if got.len() != exp.len() {
                return Err(fail(where_, format!("{} outputs, expected {}", got.len(), exp.len())));
            }
            let ag = matches!(spec.call, FusedCall::AllGatherMatmul { .. });
            let rs = matches!(spec.call, FusedCall::MatmulReduceScatter { .. });
            for (i, (g, e)) in got.iter().zip(exp).enumerate() {
                let what = if ag && i == 0 {
                    "all-gathered a".to_string()
                } else if ag {
                    format!("output b[{}]", i - 1)
                } else {
                    "output".into()
                };
                if !caps.moves_data {
                    crate::case::note_values_unchecked();
                    if g.dtype() != e.dtype() || g.shape() != e.shape() {
                        return Err(fail(where_, format!("{what} is {}{:?}, expected {}{:?}", g.dtype(), g.shape(), e.dtype(), e.shape())));
                    }
                    continue;
                }
                let tol = if ag && i == 0 || matches!(spec.call, FusedCall::LowContentionAllGather) {
                    Tolerance::Exact
                } else if spec.exact {
                    // Avg: the sum divided by ws is rarely representable; a pre-multiplying
                    // backend rounds once per rank (nccl-tests' bound, same-sign inputs).
                    if spec.is_avg() {
                        Tolerance::Ulps(avg_ulps(spec.dtype, ws))
                    } else {
                        Tolerance::Exact
                    }
                } else {
                    fused_tolerance(
                        spec.dtype,
                        spec.out_dtype(),
                        spec.k(),
                        ws,
                        rs || matches!(spec.call, FusedCall::LowContentionReduceScatter { .. }),
                        4.0,
                        false,
                    )
                };
                compare(g, e, tol).map_err(|m| fail(where_, format!("{what}: {m}")))?;
            }
            Ok(())
        }
    }
}

/// The oracle for a case whose ranks make different calls: the rule table over every rank's
/// description (the values are never needed: such a call is always bad).
fn odd_expected(spec: &FusedSpec, inputs: &[FusedInputs], caps: &Capabilities) -> Result<Vec<Vec<Tensor>>, concord_core::BadInput> {
    use concord_core::fused::describe;
    use concord_core::TensorDesc;
    let descs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(r, x)| {
            let c = spec.call_of(r);
            let (reduce, dim) = match c {
                FusedCall::AllGatherMatmul { dim, .. } => (None, *dim),
                FusedCall::MatmulReduceScatter { op, dim, .. } => (Some(*op), *dim),
                FusedCall::LowContentionAllGather => (None, 0),
                FusedCall::LowContentionReduceScatter { op } => (Some(*op), 0),
            };
            let mut ins = vec![TensorDesc::new(x.a.dtype(), x.a.shape())];
            ins.extend(x.bs.iter().map(|b| TensorDesc::new(b.dtype(), b.shape())));
            let sc = c.scaling().map(|s| Scaling { a: x.a_scale.clone().unwrap_or(s.a.clone()), ..s.clone() });
            describe(c.op(), r, ins, reduce, dim, sc.as_ref())
        })
        .collect();
    concord_core::validate_all(&descs, caps)?;
    expected_fused(&spec.call, inputs, caps)
}

/// The per-call gate of a fused case: a fused op is defined as its decomposition
/// (`concord_core::fused`: the calls' values), and a backend that computes it so may refuse the
/// decomposition's calls where it declares them gaps (an f64 all_gather gap refuses the f64
/// all_gather_matmul). Not for a bad-input spec, nor for a dtype the backend does not declare at
/// all: their refusal is named before any data moves, and the case checks it.
/// - `Capabilities::fused == Decomposed`: such a case is UNSUPPORTED on every rank alike, naming
///   the call, before anything runs (`Err`).
/// - `Pipelined` (the backend's own code, which may not use that call at all; shm falls back to
///   the decomposition off its pipelined shapes, and a wrapper inherits the declaration): the
///   case runs, and only a refusal named as a gap's ([`GAP_REFUSALS`]) makes it UNSUPPORTED
///   (`Ok(Some(why))`, see [`gap_refused`]); wrong values still fail.
fn decomposition_gate<B: Backend>(b: &B, spec: &FusedSpec) -> Result<Option<String>, CaseEnd> {
    match require_decomposition(b, spec) {
        Ok(()) => Ok(None),
        Err(CaseEnd::Unsupported(why)) if b.capabilities().fused == concord_core::FusedImpl::Pipelined => Ok(Some(why)),
        Err(e) => Err(e),
    }
}

/// Under a [`decomposition_gate`] that let a pipelined backend run: its refusal of the call,
/// named as a declared gap's, ends the case UNSUPPORTED naming the gap.
fn gap_refused(gap: &Option<String>, e: &CollectiveError) -> Option<CaseEnd> {
    let why = gap.as_ref()?;
    GAP_REFUSALS.contains(&e.name().as_str()).then(|| CaseEnd::Unsupported(format!("{why}; the fused op was refused: {e} [{}]", e.name())))
}

fn require_decomposition<B: Backend>(b: &B, spec: &FusedSpec) -> CaseResult {
    use super::util::require_call;
    use concord_core::{OpKind, Variant};
    // A dtype the backend does not declare at all is the rule table's (rule 6): the fused op
    // itself refuses it by name before any data moves, and the case checks that refusal.
    let dtypes = b.capabilities().dtypes;
    if spec.odd_rank.is_some() || spec.b_dtype.is_some() || !dtypes.contains(&spec.dtype) || !dtypes.contains(&spec.out_dtype()) {
        return Ok(());
    }
    // Every rank's call description, all-gathered as bytes.
    require_call(b, OpKind::AllGatherIntoTensor, Variant::Out, DType::U8, None)?;
    if spec.row_scales {
        require_call(b, OpKind::AllGatherIntoTensor, Variant::Out, DType::F32, None)?;
    }
    match &spec.call {
        FusedCall::AllGatherMatmul { .. } | FusedCall::LowContentionAllGather => {
            require_call(b, OpKind::AllGatherIntoTensor, Variant::Out, spec.dtype, None)
        }
        FusedCall::MatmulReduceScatter { op, .. } | FusedCall::LowContentionReduceScatter { op } => {
            require_call(b, OpKind::ReduceScatterTensor, Variant::Out, spec.out_dtype(), Some(*op))
        }
    }
}

fn body<B: Backend>(ctx: &mut Ctx<'_, B>, spec: &FusedSpec, seed: u64, repeats: usize) -> CaseResult {
    let gap = decomposition_gate(ctx.b, spec)?;
    let (ws, rank) = (ctx.world_size(), ctx.rank());
    let caps = ctx.b.capabilities();
    let where_ = where_of(&backend_label(ctx.b), spec, ws, rank);
    let me = spec.inputs(rank, seed);
    let exp = expected_for(spec, &caps, seed, ws, rank);
    for rep in 0..repeats {
        let got = issue(ctx.b, spec.call_of(rank), &me, ctx.timeout, &where_)?;
        if let Some(u) = got.as_ref().err().and_then(|e| gap_refused(&gap, e)) {
            return Err(u);
        }
        check(spec, &caps, &exp, ws, rank, got, &format!("{where_} issue={}", rep + 1))?;
    }
    if spec.odd_rank.is_some() || !spec.exact || repeats == 1 {
        // After a bad call: a good one on the same world.
        let good = FusedSpec { odd_rank: None, ..ag_spec(0, DType::F32, vec![2, 4, 8], vec![vec![8, 4]], true) };
        let w = where_of(&backend_label(ctx.b), &good, ws, rank);
        let me = good.inputs(rank, seed);
        let got = issue(ctx.b, &good.call, &me, ctx.timeout, &w)?;
        let exp = expected_for(&good, &caps, seed, ws, rank);
        check(&good, &caps, &exp, ws, rank, got, &format!("{w} (a good call after the case's)"))?;
    }
    if ctx.b.outstanding() != 0 {
        return Err(fail(&where_, format!("outstanding() is {} after every work was waited", ctx.b.outstanding())));
    }
    Ok(())
}

/// Two calls with the same shapes on different inputs: the first call's outputs, read again
/// after the second, MUST still hold the first call's values (new buffers each call, never a
/// persistent workspace that the next call gathers or reduces into again).
fn body_outputs_kept<B: Backend>(ctx: &mut Ctx<'_, B>, spec: &FusedSpec, seed: u64) -> CaseResult {
    let gap = decomposition_gate(ctx.b, spec)?;
    let (ws, rank) = (ctx.world_size(), ctx.rank());
    let caps = ctx.b.capabilities();
    let where_ = where_of(&backend_label(ctx.b), spec, ws, rank);
    let seeds = [seed, seed ^ 0x5EED];
    let exp: Vec<Expected> = seeds.iter().map(|&s| expected_for(spec, &caps, s, ws, rank)).collect();
    let first = match issue_keep_when(ctx.b, &spec.call, &spec.inputs(rank, seeds[0]), ctx.timeout, &where_, &|| Ok(()))? {
        Ok((got, bufs)) => {
            check(spec, &caps, &exp[0], ws, rank, Ok(got), &format!("{where_} issue=1"))?;
            bufs
        }
        Err(e) => {
            if let Some(u) = gap_refused(&gap, &e) {
                return Err(u);
            }
            return check(spec, &caps, &exp[0], ws, rank, Err(e), &format!("{where_} issue=1"));
        }
    };
    let got = issue(ctx.b, &spec.call, &spec.inputs(rank, seeds[1]), ctx.timeout, &where_)?;
    check(spec, &caps, &exp[1], ws, rank, got, &format!("{where_} issue=2 (other inputs)"))?;
    let again = first.iter().map(|x| ctx.b.download(x)).collect::<Result<Vec<_>, _>>()?;
    let w = format!("{where_} (issue 1's outputs read after issue 2: each call MUST return new buffers that a later call does not write)");
    check(spec, &caps, &exp[0], ws, rank, Ok(again), &w)?;
    if ctx.b.outstanding() != 0 {
        return Err(fail(&where_, format!("outstanding() is {} after every work was waited", ctx.b.outstanding())));
    }
    Ok(())
}

/// Two calls with the same shapes on different inputs, both issued before either is waited
/// (then waited in reverse order): each MUST return its own call's values (a pipelined op that
/// stages its results in one workspace per shape and copies them out at wait would give the
/// first call the second's).
fn body_in_flight<B: Backend>(ctx: &mut Ctx<'_, B>, spec: &FusedSpec, seed: u64) -> CaseResult {
    let gap = decomposition_gate(ctx.b, spec)?;
    enum Pending<W> {
        Ag(concord_core::Work<concord_core::fused::Gathered<W>>),
        Rs(concord_core::Work<W>),
    }
    let (b, ws, rank, t) = (ctx.b, ctx.world_size(), ctx.rank(), ctx.timeout);
    let caps = b.capabilities();
    let where_ = where_of(&backend_label(b), spec, ws, rank);
    let named = |e: CollectiveError| gap_refused(&gap, &e).unwrap_or_else(|| fail(&where_, format!("{e} [{}]", e.name())));
    let seeds = [seed, seed ^ 0x1F1F];
    let mut works = Vec::new();
    for &sd in &seeds {
        let me = spec.inputs(rank, sd);
        let a = b.upload(&me.a)?;
        let bs: Vec<B::Buffer> = me.bs.iter().map(|x| b.upload(x)).collect::<Result<_, _>>()?;
        works.push(match &spec.call {
            FusedCall::AllGatherMatmul { dim, .. } => Pending::Ag(b.fused_all_gather_matmul(&a, &bs, *dim).map_err(named)?),
            FusedCall::MatmulReduceScatter { op, dim, .. } => {
                Pending::Rs(b.fused_matmul_reduce_scatter(&a, &bs[0], *op, *dim).map_err(named)?)
            }
            FusedCall::LowContentionAllGather => Pending::Rs(b.low_contention_all_gather(&a).map_err(named)?),
            FusedCall::LowContentionReduceScatter { op } => Pending::Rs(b.low_contention_reduce_scatter(&a, *op).map_err(named)?),
        });
    }
    // Issued and not waited, each counts (clause fused.buffers), however the backend runs it.
    if b.outstanding() < works.len() {
        return Err(fail(
            &where_,
            format!(
                "outstanding() is {} with {} fused works issued and not waited: each MUST count until it is waited",
                b.outstanding(),
                works.len()
            ),
        ));
    }
    for (i, work) in works.into_iter().enumerate().rev() {
        let bufs = match work {
            Pending::Ag(w) => {
                let (ag, outs) = w.into_value(t).map_err(named)?;
                std::iter::once(ag).chain(outs).collect::<Vec<_>>()
            }
            Pending::Rs(w) => vec![w.into_value(t).map_err(named)?],
        };
        let got = bufs.iter().map(|x| b.download(x)).collect::<Result<Vec<_>, _>>()?;
        let exp = expected_for(spec, &caps, seeds[i], ws, rank);
        let w = format!("{where_} call {} of 2 (both issued before either was waited; waited in reverse order)", i + 1);
        check(spec, &caps, &exp, ws, rank, Ok(got), &w)?;
    }
    if b.outstanding() != 0 {
        return Err(fail(&where_, format!("outstanding() is {} after every work was waited", b.outstanding())));
    }
    Ok(())
}

fn push_in_flight<B: Backend>(out: &mut Vec<Case<B>>, name: String, ws: usize, spec: FusedSpec) {
    if !crate::case::wanted_world_size(ws) {
        return;
    }
    let seed = concord_fixtures::seed_for(&name);
    let m = meta(&spec);
    out.push(Case::new(name, m, ws, move |ctx| body_in_flight(ctx, &spec, seed)));
}

fn ag_spec(dim: usize, dtype: DType, a: Vec<usize>, b_shapes: Vec<Vec<usize>>, exact: bool) -> FusedSpec {
    FusedSpec {
        call: FusedCall::AllGatherMatmul { dim, scaling: None },
        dtype,
        a_shape: a,
        b_shapes,
        row_scales: false,
        exact,
        odd_rank: None,
        b_dtype: None,
    }
}

/// The low-contention all_gather of a `[3, 5]` shard of `dtype`, exact inputs.
fn lc_spec(dtype: DType) -> FusedSpec {
    FusedSpec {
        call: FusedCall::LowContentionAllGather,
        dtype,
        a_shape: vec![3, 5],
        b_shapes: vec![],
        row_scales: false,
        exact: true,
        odd_rank: None,
        b_dtype: None,
    }
}

fn rs_spec(op: ReduceOp, dim: usize, dtype: DType, ws: usize, exact: bool) -> FusedSpec {
    FusedSpec {
        call: FusedCall::MatmulReduceScatter { op, dim, scaling: None },
        dtype,
        a_shape: vec![2 * ws, 4 * ws, 32],
        b_shapes: vec![vec![32, 2 * ws]],
        row_scales: false,
        exact,
        odd_rank: None,
        b_dtype: None,
    }
}

/// `a` and `b`s for an all-gather along `dim` of a 3-D `a` (dim 2 contracts over dim 1).
fn ag_shapes(dim: usize) -> (Vec<usize>, Vec<Vec<usize>>) {
    let a = vec![4, 8, 32];
    let k = *concord_core::fused::moved_shape(&a, dim).last().expect("3-D");
    (a, vec![vec![k, 16], vec![k, 8]])
}

fn meta(spec: &FusedSpec) -> CaseMeta {
    CaseMeta {
        suite: "fused".into(),
        op: spec.call.name().into(),
        variant: "out".into(),
        dtype: spec.dtype.to_string(),
        reduce: match &spec.call {
            FusedCall::MatmulReduceScatter { op, .. } | FusedCall::LowContentionReduceScatter { op } => op.name().into(),
            _ => "-".into(),
        },
    }
}

fn push<B: Backend>(out: &mut Vec<Case<B>>, name: String, ws: usize, spec: FusedSpec, repeats: usize) {
    if !crate::case::wanted_world_size(ws) {
        return;
    }
    let seed = concord_fixtures::seed_for(&name);
    let m = meta(&spec);
    let spec = Arc::new(spec);
    // The large operands at 5 and 8 ranks take a second or more each: started first.
    let heavy = name.contains("::large::") && ws >= 5;
    let c = Case::new(name, m, ws, move |ctx| body(ctx, &spec, seed, repeats));
    out.push(if heavy { c.heavy() } else { c });
}

/// The fused grid's size classes (the corruption sweep's: an output below 16 elements, 16 to
/// 4 Ki, to 64 Ki, past 64 Ki), the tags of [`grid_spec`].
const GRID_TAGS: [&str; 4] = ["tiny", "small", "medium", "large"];

/// The fused grid's spec of size class `tag` for a communicator of `n` ranks.
fn grid_spec(ag: bool, tag: &str, n: usize) -> FusedSpec {
    if ag {
        let (r, k) = match tag {
            "tiny" => (1, 1),
            "small" => (1, 16),
            "medium" => (256usize.div_ceil(n), 16),
            _ => (4096usize.div_ceil(n), 16),
        };
        ag_spec(0, DType::F32, vec![r, 1, 2], vec![vec![2, k]], true)
    } else {
        let (r, k) = match tag {
            "tiny" => (1, 1),
            "small" => (1, 16),
            "medium" => (257, 16),
            _ => (4097, 16),
        };
        FusedSpec { a_shape: vec![n * r, 1, 2], b_shapes: vec![vec![2, k]], ..rs_spec(ReduceOp::Sum, 0, DType::F32, n, true) }
    }
}

/// The fused grid on subgroups (`fused::all_gather_matmul::dim0::f32::group_grid::ws7`): each size
/// class of the fused grid on every group of `sizes::GROUP_LAYOUTS` at world size 7 (every other
/// rank, an order not the world's, every rank alone, two groups sharing ranks used alternately),
/// checked against the oracle for the GROUP's ranks. No fused case ran on a group before (the
/// corruption sweep's subgroup cells).
fn group_grid_case<B: Backend>(ag: bool) -> Case<B> {
    use super::sizes::GROUP_GRID_WS;
    let ws = GROUP_GRID_WS;
    let name = if ag {
        format!("fused::all_gather_matmul::dim0::f32::group_grid::ws{ws}")
    } else {
        format!("fused::matmul_reduce_scatter::dim0::f32::sum::group_grid::ws{ws}")
    };
    let seed = concord_fixtures::seed_for(&name);
    group_grid(name, ws, seed, GRID_TAGS.len(), move |k, n| grid_spec(ag, GRID_TAGS[k], n))
}

/// A case of `ws` ranks running fused calls on every group of `sizes::GROUP_LAYOUTS`: for each
/// layout `li`, each level `k` of `levels` (`spec_for(k, group size)`: the grid's size classes,
/// or one spec) on every group of the layout this rank is a member of, each checked against the
/// oracle for the group's ranks; inputs drawn from `seed + 8 li + k` (at most 8 levels).
fn group_grid<B: Backend>(
    name: String,
    ws: usize,
    seed: u64,
    levels: usize,
    spec_for: impl Fn(usize, usize) -> FusedSpec + Send + Sync + 'static,
) -> Case<B> {
    use super::sizes::GROUP_LAYOUTS;
    assert!((1..=8).contains(&levels), "{name}: {levels} levels; the seed schedule leaves 8 a layout");
    let m = meta(&spec_for(0, 2));
    Case::new(name, m, ws, move |ctx: &mut Ctx<'_, B>| {
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let timeout = ctx.timeout;
        for (li, (lay, groups)) in GROUP_LAYOUTS.iter().enumerate() {
            let mine = ctx.layout(groups)?;
            for k in 0..levels {
                let sd = seed.wrapping_add((li * 8 + k) as u64);
                for (g, sub) in &mine {
                    on_group(*sub, g, lay, &spec_for(k, g.len()), sd, timeout)?;
                }
            }
        }
        Ok(())
    })
}

/// The fused ops on subgroups off dim 0 (review11, finding 7: the group grids ran gather /
/// scatter dim 0 unscaled only): `fused::all_gather_matmul::dim1::f32::group_grid::ws7` (a
/// `[2, 1, 2]` shard gathered along dim 1, one B of 1 and one of 16 columns) and
/// `fused::scaled_matmul_reduce_scatter::dim1::f32::sum::group_grid::ws7` (the scaled
/// reduce-scatter along dim 1, per-column B scales), on every group of `sizes::GROUP_LAYOUTS`,
/// checked against the oracle for the GROUP's ranks: shards sized or placed by the world's size
/// or rank on the movedim path are wrong on the groups whose members are not in world order.
fn group_dim1_case<B: Backend>(ag: bool) -> Case<B> {
    use super::sizes::GROUP_GRID_WS;
    let ws = GROUP_GRID_WS;
    let name = if ag {
        format!("fused::all_gather_matmul::dim1::f32::group_grid::ws{ws}")
    } else {
        format!("fused::scaled_matmul_reduce_scatter::dim1::f32::sum::group_grid::ws{ws}")
    };
    let seed = concord_fixtures::seed_for(&name);
    let spec_for = move |_: usize, n: usize| {
        if ag {
            ag_spec(1, DType::F32, vec![2, 1, 2], vec![vec![2, 1], vec![2, 16]], true)
        } else {
            let scaling = Scaling {
                a: Scale::Tensor(0.5),
                b: vec![Scale::Rows((0..2 * n).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
                out_dtype: DType::F32,
            };
            FusedSpec {
                call: FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 1, scaling: Some(scaling) },
                a_shape: vec![2, 2 * n, 4],
                b_shapes: vec![vec![4, 2 * n]],
                ..rs_spec(ReduceOp::Sum, 1, DType::F32, n, true)
            }
        }
    };
    group_grid(name, ws, seed, 1, spec_for)
}

/// One fused call on the subgroup `sub` (members `g`, of layout `lay`), checked against the
/// oracle for the GROUP's ranks (the where-line names the world rank too, `case::axes`).
fn on_group<B: Backend>(sub: &B, g: &[usize], lay: &str, spec: &FusedSpec, sd: u64, timeout: std::time::Duration) -> CaseResult {
    let (n, grank) = (g.len(), sub.rank());
    let caps = sub.capabilities();
    let where_ = format!("{} (layout {lay}, group {g:?})", where_of(&backend_label(sub), spec, n, grank));
    let exp = expected_for(spec, &caps, sd, n, grank);
    let got = issue(sub, &spec.call, &spec.inputs(grank, sd), timeout, &where_)?;
    check(spec, &caps, &exp, n, grank, got, &where_)
}

/// The low-contention ops on subgroups (`fused::low_contention_all_gather::dim0::f32::group_grid::ws7`,
/// `fused::low_contention_reduce_scatter::dim0::f32::sum::group_grid::ws7`): each group of
/// `sizes::GROUP_LAYOUTS` at world size 7, checked against the oracle for the GROUP's ranks
/// (review-d: no low-contention op ran on a group; one group lists its members out of world
/// order, so shards placed by world rank are wrong there).
fn lc_group_grid_case<B: Backend>(rs: bool) -> Case<B> {
    use super::sizes::GROUP_GRID_WS;
    let ws = GROUP_GRID_WS;
    let name = if rs {
        format!("fused::low_contention_reduce_scatter::dim0::f32::sum::group_grid::ws{ws}")
    } else {
        format!("fused::low_contention_all_gather::dim0::f32::group_grid::ws{ws}")
    };
    let seed = concord_fixtures::seed_for(&name);
    let spec_for = move |_: usize, n: usize| {
        let lc = lc_spec(DType::F32);
        if rs {
            FusedSpec { call: FusedCall::LowContentionReduceScatter { op: ReduceOp::Sum }, a_shape: vec![2 * n, 5], ..lc }
        } else {
            lc
        }
    };
    group_grid(name, ws, seed, 1, spec_for)
}

/// How late the late rank of [`late_peer_case`] issues, after every other rank is about to.
const LATE_BY: std::time::Duration = std::time::Duration::from_millis(20);

/// The all-gather-matmul with one peer late (`fused::all_gather_matmul::dim0::f32::late_peer::ws3`):
/// one call per rank, that rank issuing 20 ms after the others, so its shard lands after the
/// shard of a peer farther on in every pipeline order; each result checked against the oracle.
/// A pipelined implementation that puts shards in the order they land, not at their source
/// ranks' places, is right only when they land in its step order. The late rank waits for every
/// other rank's word in the store that its operands are in place and it is calling the op, then
/// [`LATE_BY`] (longer on a loaded machine: `util::hold_off`): the others are ahead however the
/// machine schedules them (with only a sleep, a peer the machine stalled as long came as late:
/// ag_matmul_late_peer_misplaced survived this case in the campaign at 7aa010f, caught there by
/// its second hint, `grid_tiny`).
///
/// The same for the low-contention all-gather (`fused::low_contention_all_gather::dim0::f32::late_peer::ws3`),
/// whose shards a pipelined implementation also places as they land.
fn late_peer_case<B: Backend>(name: String, spec: FusedSpec, ws: usize) -> Case<B> {
    let seed = concord_fixtures::seed_for(&name);
    let m = meta(&spec);
    Case::new(name, m, ws, move |ctx: &mut Ctx<'_, B>| {
        let me = ctx.rank();
        let caps = ctx.b.capabilities();
        for late in 0..ws {
            let sd = seed.wrapping_add(late as u64);
            let where_ = format!("{} (rank {late} issued {LATE_BY:?} after the others)", where_of(&backend_label(ctx.b), &spec, ws, me));
            let exp = expected_for(&spec, &caps, sd, ws, me);
            let key = |r: usize| format!("{}/{}/late{late}/calling{r}", ctx.case, ctx.world.world_id);
            let ready = || -> Result<(), CaseEnd> {
                if me != late {
                    return ctx.store.set(&key(me), b"1").map_err(|e| fail(&where_, format!("store: {e}")));
                }
                let keys: Vec<String> = (0..ws).filter(|&r| r != late).map(key).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                take_keys(ctx, &refs, ctx.timeout, &where_, "the other ranks never reached the call")?;
                hold_off(LATE_BY);
                Ok(())
            };
            let got = issue_when(ctx.b, &spec.call, &spec.inputs(me, sd), ctx.timeout, &where_, &ready)?;
            check(&spec, &caps, &exp, ws, me, got, &where_)?;
        }
        Ok(())
    })
}

fn push_kept<B: Backend>(out: &mut Vec<Case<B>>, name: String, ws: usize, spec: FusedSpec) {
    let seed = concord_fixtures::seed_for(&name);
    let m = meta(&spec);
    out.push(Case::new(name, m, ws, move |ctx| body_outputs_kept(ctx, &spec, seed)));
}

/// World sizes of the fused suite (the catalogue's).
pub const FUSED_WORLD_SIZES: [usize; 6] = super::WORLD_SIZES;

/// The world size of [`FUSED_WORLD_SIZES`] that runs only the larger operands (the pipelined
/// path with 8 shards in flight), the size grid and dim 0 in bf16 / f16 / f64, as 6, 7 and 16
/// do: its other 45 exact, scaled and low-contention cases repeated 1-5 ranks' shapes and checks
/// at a larger world (about 0.7 s of the main job's CPU) and no mutant of the catalogue needed them
/// (docs/RESULTS.md, helper main11).
pub const THINNED_WS: usize = super::matrix::THINNED_WS;

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    // f64 too: the contract accumulates f64 operands in f64 (the dtype grid of the corruption
    // sweep found no case checking a fused op's f64 output).
    let dts = [DType::F32, DType::BF16, DType::F16, DType::F64];
    // The fused ops' size grid (the corruption sweep found their outputs below 16 and past 64 Ki
    // elements unchecked at every world size, and 6, 7 and 16 ranks without a fused case): f32
    // along dim 0, K = 2, an output in each of the sweep's size classes (below 16, 16 to 4 Ki, to
    // 64 Ki, past 64 Ki; all_gather_matmul's is ws times its shard's), at every world size.
    for ws in super::sizes::GRID_WORLD_SIZES {
        for tag in GRID_TAGS {
            push(&mut out, format!("fused::all_gather_matmul::dim0::f32::grid_{tag}::ws{ws}"), ws, grid_spec(true, tag, ws), 1);
        }
        for tag in GRID_TAGS {
            push(&mut out, format!("fused::matmul_reduce_scatter::dim0::f32::sum::grid_{tag}::ws{ws}"), ws, grid_spec(false, tag, ws), 1);
        }
    }
    // The other float dtypes at the world sizes the exact loop below does not run (the sweep's
    // dtype grid found the fused ops' bf16, f16 and f64 outputs unchecked at 6, 7 and 16 ranks):
    // dim 0, the exact loop's shapes.
    for ws in super::sizes::GRID_WORLD_SIZES.into_iter().filter(|&ws| !FUSED_WORLD_SIZES.contains(&ws) || ws == THINNED_WS) {
        for dt in [DType::BF16, DType::F16, DType::F64] {
            let (a, bs) = ag_shapes(0);
            push(&mut out, format!("fused::all_gather_matmul::dim0::{dt}::exact::ws{ws}"), ws, ag_spec(0, dt, a, bs, true), 2);
            let s = rs_spec(ReduceOp::Sum, 0, dt, ws, true);
            push(&mut out, format!("fused::matmul_reduce_scatter::dim0::{dt}::sum::exact::ws{ws}"), ws, s, 2);
        }
    }
    for ag in [true, false] {
        out.push(group_grid_case(ag));
    }
    for rs in [false, true] {
        out.push(lc_group_grid_case(rs));
    }
    for ag in [true, false] {
        out.push(group_dim1_case(ag));
    }
    out.push(late_peer_case("fused::all_gather_matmul::dim0::f32::late_peer::ws3".to_string(), grid_spec(true, "small", 3), 3));
    let lc = lc_spec(DType::F32);
    out.push(late_peer_case("fused::low_contention_all_gather::dim0::f32::late_peer::ws3".to_string(), lc, 3));
    for ws in FUSED_WORLD_SIZES {
        if ws != THINNED_WS {
            exact_cases(&mut out, ws, dts);
        }
        // Larger operands (a native backend's pipelined path, above any small-size shortcut):
        // a_shard [8, 64, 32] f32 on every dim; a [8 ws, 16, 32] for the reduce-scatter.
        for dim in 0..3 {
            let a = vec![8, 64, 32];
            let k = *concord_core::fused::moved_shape(&a, dim).last().expect("3-D");
            push(
                &mut out,
                format!("fused::all_gather_matmul::dim{dim}::f32::large::ws{ws}"),
                ws,
                ag_spec(dim, DType::F32, a, vec![vec![k, 16], vec![k, 8]], true),
                2,
            );
        }
        for dim in [0, 2] {
            let s = FusedSpec { a_shape: vec![8 * ws, 16, 32], ..rs_spec(ReduceOp::Sum, dim, DType::F32, ws, true) };
            push(&mut out, format!("fused::matmul_reduce_scatter::dim{dim}::f32::sum::large::ws{ws}"), ws, s, 2);
            let s = FusedSpec { a_shape: vec![8 * ws, 16, 32], dtype: DType::BF16, ..rs_spec(ReduceOp::Avg, dim, DType::BF16, ws, true) };
            push(&mut out, format!("fused::matmul_reduce_scatter::dim{dim}::bf16::avg::large::ws{ws}"), ws, s, 2);
        }
        // Odd shard shapes (every moved row count and contraction length odd: no split of a
        // shard into equal halves or blocks is exact) at 2 and 3 ranks (odd shard offsets).
        if [2, 3].contains(&ws) {
            for dim in 0..3 {
                let a = vec![3, 5, 7];
                let k = *concord_core::fused::moved_shape(&a, dim).last().expect("3-D");
                push(
                    &mut out,
                    format!("fused::all_gather_matmul::dim{dim}::f32::odd_rows::ws{ws}"),
                    ws,
                    ag_spec(dim, DType::F32, a, vec![vec![k, 3]], true),
                    2,
                );
            }
            // The same odd M / N / K in half precision (review19, finding 1): every other f16 /
            // bf16 shape is a multiple of 8 (K = 32), so a kernel that drops a partial tile (the
            // last K % 8 contraction terms of a 16-byte-vector or tensor-core GEMM) passed.
            for dt in [DType::BF16, DType::F16] {
                push(
                    &mut out,
                    format!("fused::all_gather_matmul::dim0::{dt}::odd_k::ws{ws}"),
                    ws,
                    ag_spec(0, dt, vec![3, 5, 7], vec![vec![7, 3]], true),
                    1,
                );
                let s = FusedSpec { a_shape: vec![ws, 3, 7], b_shapes: vec![vec![7, 3]], ..rs_spec(ReduceOp::Sum, 0, dt, ws, true) };
                push(&mut out, format!("fused::matmul_reduce_scatter::dim0::{dt}::sum::odd_k::ws{ws}"), ws, s, 1);
            }
        }
        // A call's outputs are still its own after a second call on the same shapes.
        if ws == 2 {
            let (a, bs) = ag_shapes(0);
            push_kept(
                &mut out,
                format!("fused::all_gather_matmul::dim0::f32::outputs_kept::ws{ws}"),
                ws,
                ag_spec(0, DType::F32, a, bs, true),
            );
            push_kept(
                &mut out,
                format!("fused::matmul_reduce_scatter::dim0::f32::sum::outputs_kept::ws{ws}"),
                ws,
                rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true),
            );
        }
        // The same for the low-contention ops (which may complete inside the call, but whose
        // works count until waited and whose results are new buffers).
        if ws == 2 {
            let lc = lc_spec(DType::F32);
            push_kept(&mut out, format!("fused::low_contention_all_gather::dim0::f32::outputs_kept::ws{ws}"), ws, lc.clone());
            push_in_flight(&mut out, format!("fused::low_contention_all_gather::dim0::f32::in_flight_twice::ws{ws}"), ws, lc.clone());
            let lc = FusedSpec { call: FusedCall::LowContentionReduceScatter { op: ReduceOp::Sum }, a_shape: vec![2 * ws, 5], ..lc };
            push_in_flight(&mut out, format!("fused::low_contention_reduce_scatter::dim0::f32::sum::in_flight_twice::ws{ws}"), ws, lc);
        }
        // Two calls in flight at once, waited in reverse order.
        if ws == 2 || ws == 3 {
            let (a, bs) = ag_shapes(0);
            push_in_flight(
                &mut out,
                format!("fused::all_gather_matmul::dim0::f32::in_flight_twice::ws{ws}"),
                ws,
                ag_spec(0, DType::F32, a, bs, true),
            );
            push_in_flight(
                &mut out,
                format!("fused::matmul_reduce_scatter::dim0::f32::sum::in_flight_twice::ws{ws}"),
                ws,
                rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true),
            );
        }
        // Random inputs (tolerance) and the seed's shapes.
        if [2, 4].contains(&ws) || ws == 1 {
            for dt in dts {
                for dim in [0, 1] {
                    push(
                        &mut out,
                        format!("fused::all_gather_matmul::dim{dim}::{dt}::seed_shape::ws{ws}"),
                        ws,
                        ag_spec(dim, dt, vec![8, 64, 32], vec![vec![32, 16]; 3], true),
                        1,
                    );
                }
                let (a, bs) = ag_shapes(1);
                push(&mut out, format!("fused::all_gather_matmul::dim1::{dt}::random::ws{ws}"), ws, ag_spec(1, dt, a, bs, false), 1);
                push(
                    &mut out,
                    format!("fused::matmul_reduce_scatter::dim1::{dt}::sum::random::ws{ws}"),
                    ws,
                    rs_spec(ReduceOp::Sum, 1, dt, ws, false),
                    1,
                );
            }
            // The scaled variants on random inputs into f32 (review-d, finding 2): small exact
            // integers fit bf16 (and FP8), so only values that fill f32's significand see a
            // scaled path that quantises its operands or rounds through a narrower dtype.
            let scaling = |ncols: usize, nb: usize| Scaling {
                a: Scale::Tensor(0.5),
                b: vec![Scale::Rows((0..ncols).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect()); nb],
                out_dtype: DType::F32,
            };
            let (a, bs) = ag_shapes(1);
            let s = FusedSpec {
                call: FusedCall::AllGatherMatmul { dim: 1, scaling: Some(scaling(16, 1)) },
                row_scales: true,
                ..ag_spec(1, DType::F32, a, vec![bs[0].clone()], false)
            };
            push(&mut out, format!("fused::all_gather_scaled_matmul::dim1::f32::random::ws{ws}"), ws, s.clone(), 1);
            // The same into f16 (review19, finding 5): every other scaled case writes bf16 (exact
            // values) or f32, so an f16 output computed through bf16 passed.
            let mut s16 = s;
            if let FusedCall::AllGatherMatmul { scaling: Some(sc), .. } = &mut s16.call {
                sc.out_dtype = DType::F16;
            }
            push(&mut out, format!("fused::all_gather_scaled_matmul::dim1::f32::random_f16_out::ws{ws}"), ws, s16, 1);
            let s = FusedSpec {
                call: FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 1, scaling: Some(scaling(2 * ws, 1)) },
                row_scales: true,
                ..rs_spec(ReduceOp::Sum, 1, DType::F32, ws, false)
            };
            push(&mut out, format!("fused::scaled_matmul_reduce_scatter::dim1::f32::random::ws{ws}"), ws, s, 1);
        }
        // Bad input (each a named error on every rank, then a good call).
        if ws <= 4 {
            for (tag, spec) in bad_specs(ws) {
                push(&mut out, format!("fused::bad_input::{tag}::ws{ws}"), ws, spec, 1);
            }
        }
    }
    out
}

/// The exact, scaled and low-contention cases of world size `ws` in `dts` (every dim), the f32
/// `avg` reduce-scatters and the scaled ops (not at [`THINNED_WS`]).
fn exact_cases<B: Backend>(out: &mut Vec<Case<B>>, ws: usize, dts: [DType; 4]) {
    for dt in dts {
        for dim in 0..3 {
            let (a, bs) = ag_shapes(dim);
            push(out, format!("fused::all_gather_matmul::dim{dim}::{dt}::exact::ws{ws}"), ws, ag_spec(dim, dt, a, bs, true), 2);
            push(
                out,
                format!("fused::matmul_reduce_scatter::dim{dim}::{dt}::sum::exact::ws{ws}"),
                ws,
                rs_spec(ReduceOp::Sum, dim, dt, ws, true),
                2,
            );
        }
        let x = lc_spec(dt);
        push(out, format!("fused::low_contention_all_gather::dim0::{dt}::exact::ws{ws}"), ws, x.clone(), 2);
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let x = FusedSpec { call: FusedCall::LowContentionReduceScatter { op }, a_shape: vec![2 * ws, 5], ..x.clone() };
            push(out, format!("fused::low_contention_reduce_scatter::dim0::{dt}::{op}::exact::ws{ws}"), ws, x, 2);
        }
    }
    for dim in 0..3 {
        push(
            out,
            format!("fused::matmul_reduce_scatter::dim{dim}::f32::avg::exact::ws{ws}"),
            ws,
            rs_spec(ReduceOp::Avg, dim, DType::F32, ws, true),
            2,
        );
    }
    // Scaled: per-tensor and per-row `a` scales, per-tensor / per-column `b` scales, bf16 out,
    // every gather / scatter dim. The reduce-scatter's column scales repeat every 3 columns,
    // never with a chunk's width (2 columns at the last dim): a chunk scaled with another
    // chunk's columns is wrong (review-d, finding 1).
    for (rows, tag) in [(false, "tensor"), (true, "rows")] {
        let scaling = Scaling {
            a: Scale::Tensor(0.5),
            b: vec![Scale::Tensor(4.0), Scale::Rows((0..8).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
            out_dtype: DType::BF16,
        };
        for dim in 0..3 {
            let (a, bs) = ag_shapes(dim);
            let s = FusedSpec {
                call: FusedCall::AllGatherMatmul { dim, scaling: Some(scaling.clone()) },
                row_scales: rows,
                ..ag_spec(dim, DType::F32, a, bs, true)
            };
            let mut s = s;
            s.b_shapes[1] = vec![s.b_shapes[1][0], 8];
            push(out, format!("fused::all_gather_scaled_matmul::dim{dim}::f32::{tag}::exact::ws{ws}"), ws, s, 2);
            let rs_scaling = Scaling {
                a: Scale::Tensor(0.5),
                b: vec![Scale::Rows((0..2 * ws).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
                out_dtype: DType::BF16,
            };
            let s = FusedSpec {
                call: FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim, scaling: Some(rs_scaling) },
                row_scales: rows,
                ..rs_spec(ReduceOp::Sum, dim, DType::F32, ws, true)
            };
            push(out, format!("fused::scaled_matmul_reduce_scatter::dim{dim}::f32::{tag}::exact::ws{ws}"), ws, s, 2);
        }
    }
}

/// The bad-input cases at world size `ws`: the seed's errors and rules F1–F9, named by kind.
pub fn bad_specs(ws: usize) -> Vec<(String, FusedSpec)> {
    let f32s = |dim, a: Vec<usize>, b: Vec<Vec<usize>>| ag_spec(dim, DType::F32, a, b, true);
    let mut v = vec![
        ("a_not_matrix".to_string(), f32s(0, vec![8], vec![vec![8, 4]])),
        ("b_not_matrix".into(), f32s(0, vec![4, 8], vec![vec![8, 4], vec![8]])),
        ("invalid_gather_dim".into(), f32s(3, vec![2, 4, 8], vec![vec![8, 4]])),
        ("b_rows_mismatch".into(), f32s(0, vec![4, 8], vec![vec![7, 4]])),
        ("int_dtype".into(), FusedSpec { dtype: DType::I32, ..f32s(0, vec![4, 8], vec![vec![8, 4]]) }),
        // B of another float dtype than A (rule F6, dtype_mismatch): bf16 B against f32 A.
        ("b_dtype_differs".into(), FusedSpec { b_dtype: Some(DType::BF16), ..f32s(0, vec![4, 8], vec![vec![8, 4]]) }),
        ("reduce_op_not_sum_or_avg".into(), rs_spec(ReduceOp::Max, 0, DType::F32, ws, true)),
        (
            "invalid_scatter_dim".into(),
            FusedSpec {
                call: FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 3, scaling: None },
                ..rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true)
            },
        ),
        (
            "low_contention_reduce_op".into(),
            FusedSpec {
                call: FusedCall::LowContentionReduceScatter { op: ReduceOp::Product },
                dtype: DType::F32,
                a_shape: vec![2 * ws, 3],
                b_shapes: vec![],
                row_scales: false,
                exact: true,
                odd_rank: None,
                b_dtype: None,
            },
        ),
        (
            "bad_row_scale".into(),
            FusedSpec {
                call: FusedCall::AllGatherMatmul {
                    dim: 0,
                    scaling: Some(Scaling { a: Scale::Rows(vec![1.0; 3]), b: vec![Scale::Tensor(1.0)], out_dtype: DType::F32 }),
                },
                ..f32s(0, vec![4, 8], vec![vec![8, 4]])
            },
        ),
    ];
    // review11 (finding 8): rule-table entries no case reached. F8: fewer B scales than Bs (a
    // backend zipping Bs with their scales returns fewer products), and a B's column scales
    // that are not its column count; "at least one B" (PyTorch's fallback returns (A, []));
    // F6: a non-float output dtype; F5: a 0-dim input to a low-contention op. At 2 ranks only
    // (each rule is local, or needs just one other rank; the CI budget).
    if ws == 2 {
        review11_bad_specs(&mut v, ws);
    }
    // The scaled variant validates its gather dim like the unscaled one ("Invalid gather_dim").
    v.push((
        "scaled_invalid_gather_dim".into(),
        FusedSpec {
            call: FusedCall::AllGatherMatmul {
                dim: 3,
                scaling: Some(Scaling { a: Scale::Tensor(0.5), b: vec![Scale::Tensor(2.0)], out_dtype: DType::F32 }),
            },
            ..f32s(3, vec![2, 4, 8], vec![vec![8, 4]])
        },
    ));
    if ws > 1 {
        // The last rank scatters dim 1, the others dim 0, of a product whose dims 0 and 1 have
        // the same length: the moved products agree in shape, only the rule table tells.
        let base =
            FusedSpec { a_shape: vec![2 * ws, 2 * ws, 4], b_shapes: vec![vec![4, 3]], ..rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true) };
        let odd = FusedSpec {
            odd_rank: Some((ws - 1, base.a_shape.clone(), FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 1, scaling: None })),
            ..base
        };
        v.push(("scatter_dim_differs".into(), odd));
        let mut rs = rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true);
        rs.a_shape[0] = 2 * ws + 1;
        v.push(("indivisible_scatter_dim".into(), rs));
        let lc = FusedSpec {
            call: FusedCall::LowContentionReduceScatter { op: ReduceOp::Sum },
            dtype: DType::F32,
            a_shape: vec![2 * ws + 1, 3],
            b_shapes: vec![],
            row_scales: false,
            exact: true,
            odd_rank: None,
            b_dtype: None,
        };
        v.push(("low_contention_indivisible".into(), lc));
        // One rank alone is wrong: every rank names it.
        let base = f32s(1, vec![2, 4, 8], vec![vec![8, 4]]);
        let odd =
            FusedSpec { odd_rank: Some((ws - 1, vec![2, 4, 8], FusedCall::AllGatherMatmul { dim: 5, scaling: None })), ..base.clone() };
        v.push(("invalid_gather_dim_on_last_rank".into(), odd));
        let odd =
            FusedSpec { odd_rank: Some((ws - 1, vec![2, 4, 8], FusedCall::AllGatherMatmul { dim: 0, scaling: None })), ..base.clone() };
        v.push(("gather_dim_differs".into(), odd));
        let odd = FusedSpec { odd_rank: Some((0, vec![2, 5, 8], base.call.clone())), ..base };
        v.push(("a_shape_differs".into(), odd));
    }
    v
}

/// review11's bad-input entries (finding 8), see [`bad_specs`].
fn review11_bad_specs(v: &mut Vec<(String, FusedSpec)>, ws: usize) {
    let f32s = |dim, a: Vec<usize>, b: Vec<Vec<usize>>| ag_spec(dim, DType::F32, a, b, true);
    let scaled = |b: Vec<Scale>, out_dtype: DType| FusedCall::AllGatherMatmul {
        dim: 0,
        scaling: Some(Scaling { a: Scale::Tensor(0.5), b, out_dtype }),
    };
    v.push((
        "b_scales_count".into(),
        FusedSpec { call: scaled(vec![Scale::Tensor(2.0)], DType::F32), ..f32s(0, vec![4, 8], vec![vec![8, 4], vec![8, 4]]) },
    ));
    v.push((
        "b_scale_columns".into(),
        FusedSpec { call: scaled(vec![Scale::Rows(vec![1.0; 3])], DType::F32), ..f32s(0, vec![4, 8], vec![vec![8, 4]]) },
    ));
    v.push(("no_b".into(), f32s(0, vec![4, 8], vec![])));
    v.push((
        "int_out_dtype".into(),
        FusedSpec { call: scaled(vec![Scale::Tensor(2.0)], DType::I32), ..f32s(0, vec![4, 8], vec![vec![8, 4]]) },
    ));
    v.push((
        "low_contention_zero_dim".into(),
        FusedSpec {
            call: FusedCall::LowContentionAllGather,
            dtype: DType::F32,
            a_shape: vec![],
            b_shapes: vec![],
            row_scales: false,
            exact: true,
            odd_rank: None,
            b_dtype: None,
        },
    ));
    if ws > 1 {
        // Scale kinds that differ across ranks (the last rank's B scales per column).
        let base = FusedSpec { call: scaled(vec![Scale::Tensor(2.0)], DType::F32), ..f32s(0, vec![4, 8], vec![vec![8, 4]]) };
        let odd = FusedSpec { odd_rank: Some((ws - 1, vec![4, 8], scaled(vec![Scale::Rows(vec![1.0; 4])], DType::F32))), ..base };
        v.push(("scale_kind_differs_on_last_rank".into(), odd));
    }
}

/// The kind a bad-input case expects (for the contract map's text and the self-test).
pub fn expected_kind(spec: &FusedSpec, ws: usize, caps: &Capabilities) -> Option<BadInputKind> {
    let inputs: Vec<FusedInputs> = (0..ws).map(|r| spec.inputs(r, 1)).collect();
    odd_expected(spec, &inputs, caps).err().map(|e| e.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `values` is the plain draw (one modulo by the range's width per element) for every range
    /// the suite uses and one it does not, and for random values.
    #[test]
    fn values_are_the_plain_draws() {
        let plain = |seed: u64, n: usize, exact: bool, lo: i64, hi: i64| -> Vec<f64> {
            let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if exact {
                        (lo + (s % (hi - lo + 1) as u64) as i64) as f64
                    } else {
                        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                    }
                })
                .collect()
        };
        for seed in [0u64, 1, 7919, u64::MAX, 0x5EED] {
            for (lo, hi) in [(-2, 2), (0, 2), (-1, 1), (0, 1), (-3, 7)] {
                for exact in [true, false] {
                    let got: Vec<u64> = values(seed, 5000, exact, lo, hi).iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u64> = plain(seed, 5000, exact, lo, hi).iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "seed {seed} [{lo}, {hi}] exact {exact}");
                }
            }
        }
    }

    /// A peer's `a` made only where the reader's answer reads it (`inputs_read_by`) gives every
    /// rank the oracle's answer from whole inputs, bit for bit: every reduce-scatter kind the
    /// suite cuts (dim 0, scaled with and without row scales, low-contention, the size grid) and
    /// the ones it does not (dims 1 and 2), sum and avg, exact and random, f32 / bf16 / f16 /
    /// f64, at 1, 2, 3, 5 and 8 ranks.
    #[test]
    fn a_peer_made_where_the_reader_reads_gives_the_same_answer() {
        let caps = Capabilities::full(8);
        for ws in [1, 2, 3, 5, 8] {
            let mut specs = Vec::new();
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                for dim in 0..3 {
                    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
                        for exact in [true, false] {
                            specs.push(rs_spec(op, dim, dtype, ws, exact));
                        }
                    }
                }
                let lc = lc_spec(DType::F32);
                specs.push(FusedSpec { call: FusedCall::LowContentionReduceScatter { op }, a_shape: vec![2 * ws, 5], ..lc.clone() });
                specs.push(FusedSpec { call: FusedCall::LowContentionReduceScatter { op }, a_shape: vec![3 * ws, 4], exact: false, ..lc });
            }
            for rows in [false, true] {
                let scaling = Scaling {
                    a: Scale::Tensor(0.5),
                    b: vec![Scale::Rows((0..2 * ws).map(|j| [1.0f32, 0.5, 2.0][j % 3]).collect())],
                    out_dtype: DType::BF16,
                };
                specs.push(FusedSpec {
                    call: FusedCall::MatmulReduceScatter { op: ReduceOp::Sum, dim: 0, scaling: Some(scaling) },
                    row_scales: rows,
                    ..rs_spec(ReduceOp::Sum, 0, DType::F32, ws, true)
                });
            }
            for tag in GRID_TAGS.iter().filter(|&&t| t != "large" || ws <= 3) {
                specs.push(grid_spec(false, tag, ws));
            }
            for (i, spec) in specs.iter().enumerate() {
                let seed = 0x5EED ^ i as u64;
                let whole: Vec<FusedInputs> = (0..ws).map(|r| spec.inputs(r, seed)).collect();
                for rank in 0..ws {
                    let cut: Vec<FusedInputs> = (0..ws).map(|r| spec.inputs_read_by(r, seed, ws, rank)).collect();
                    let want = expected_fused_for(&spec.call, &whole, &caps, Some(rank)).expect("a good spec");
                    let got = expected_fused_for(&spec.call, &cut, &caps, Some(rank)).expect("a good spec");
                    let bytes = |v: &Vec<Vec<Tensor>>| v.iter().flatten().map(|t| t.bytes().to_vec()).collect::<Vec<_>>();
                    assert_eq!(bytes(&got), bytes(&want), "{:?} dim-0 cut, spec {i}, rank {rank} of {ws}", spec.call);
                }
            }
        }
    }

    #[test]
    fn every_bad_spec_is_bad_for_the_oracle() {
        let caps = Capabilities::full(8);
        for ws in 1..=4 {
            for (tag, spec) in bad_specs(ws) {
                assert!(expected_kind(&spec, ws, &caps).is_some(), "{tag} at ws{ws} is not bad input");
            }
        }
    }
}
