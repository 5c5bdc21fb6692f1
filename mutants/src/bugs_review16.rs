//! The sixteenth review's blind spots (read-only review16, 2026-11-28; helper impl16): inputs
//! of the core verifier on which a wrong answer coincides with the right one (`bor` on disjoint
//! bits, no infinity on every rank, large float reductions fed only small integers, float
//! products of ±2^k only, f32 / f64 min / max decided by the end ranks), and infinities in sums
//! seen only through the all_reduce. Each was written here first and run against the whole
//! catalogue before any case or generator was changed.

use crate::bugs_hunt28::{at, half, rewrite_each, round_to};
use crate::campaign::{spec, Spec};
use crate::{set_f64, Buf, Bug, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};

/// The largest finite magnitude of a float dtype.
fn finite_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65_504.0,
        DType::BF16 => concord_core::half::bf16::MAX.to_f64(),
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// Every `±inf` element of `b` replaced by `±finite_max` (a saturating store), once the work
/// completed.
fn saturate(s: &Shm, w: Work<Buf>) -> Work<Buf> {
    s.then(w, |be, out| {
        crate::edit(be, out, |t| {
            let lim = finite_max(t.dtype());
            for i in 0..t.numel() {
                let v = t.get_f64(i);
                if v.is_infinite() {
                    set_f64(t, i, lim.copysign(v));
                }
            }
        })
    })
}

/// `impl Bug` for a mutant whose all_reduce, both variants, goes through its own
/// `issue(s, x, op, in_place)`.
macro_rules! all_reduce_both_variants {
    ($t:ty) => {
        impl Bug for $t {
            fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                Self::issue(s, x, op, false)
            }
            fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
                Self::issue(s, x, op, true)
            }
        }
    };
}

// ---------------------------------------------------------------- finding 1: bor as sum

/// Finding 1. A reduce-op table without a `BOR` entry that falls back to `sum`
/// (pytorch/pytorch#39708: `ncclOp[opts.reduceOp]` on a `std::map` inserts `ncclSum`;
/// meta-pytorch/torchcomms#2082: BAND / BOR / BXOR silently mapped to `ncclSum`), or `bor`
/// emulated as a sum of one-hot flags on a library without bitwise ops: every reducing call
/// (all_reduce, reduce_scatter, reduce, both variants and coalesced) runs `sum` for `bor` on
/// integer tensors (floats still refused by the real op). Clause `values.reduce`.
#[derive(Default)]
pub struct BorUnmappedSum;

impl BorUnmappedSum {
    fn op(s: &Shm, x: &Buf, op: ReduceOp) -> ReduceOp {
        if op == ReduceOp::BOr && !s.inner.buffer_dtype(x).is_float() {
            ReduceOp::Sum
        } else {
            op
        }
    }
    fn ops(s: &Shm, xs: &[Buf], op: ReduceOp) -> ReduceOp {
        if op == ReduceOp::BOr && xs.iter().all(|x| !s.inner.buffer_dtype(x).is_float()) {
            ReduceOp::Sum
        } else {
            op
        }
    }
}

impl Bug for BorUnmappedSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, Self::op(s, x, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, Self::op(s, x, op))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, Self::ops(s, xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced_(xs, Self::ops(s, xs, op))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, Self::op(s, x, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, Self::op(s, x, op), out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.reduce_scatter_tensor_coalesced(xs, Self::ops(s, xs, op))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, Self::op(s, x, op), root)
    }
}

// ---------------------------------------------------------------- finding 2: finite identity

/// Finding 2. A float max reduction folded from `lowest()` / `-FLT_MAX` (min from `max()` /
/// `FLT_MAX`) instead of `∓inf` (kokkos/kokkos#8244, rapidsai/cudf#11357, NVIDIA/raft#2226):
/// an element that is `-inf` on every rank comes back as the most negative finite value (min:
/// `+inf` on every rank → the largest finite). From 2 ranks (one rank is a copy, as NCCL's
/// one-rank kernel), float min / max all_reduce (both variants). The max of the inputs is
/// `-inf` only where every rank holds `-inf` (a NaN anywhere gives NaN), so the result alone
/// tells where the identity shows. Clause `values.reduce`.
#[derive(Default)]
pub struct MinMaxFiniteIdentity;

impl MinMaxFiniteIdentity {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let w = if in_place { s.inner.all_reduce_(x, op)? } else { s.inner.all_reduce(x, op)? };
        let identity = match op {
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
            _ => return Ok(w),
        };
        if s.ws() < 2 || !s.inner.buffer_dtype(x).is_float() {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let lim = finite_max(t.dtype()).copysign(identity);
                for i in 0..t.numel() {
                    if t.get_f64(i) == identity {
                        set_f64(t, i, lim);
                    }
                }
            })
        }))
    }
}

all_reduce_both_variants!(MinMaxFiniteIdentity);

// ---------------------------------------------------------------- finding 3: large half path

/// The message size (bytes) from which [`HalfLargePerStep`] leaves its one-shot kernel.
const HALF_LARGE_FROM: usize = 64 << 10;

/// Finding 3. A backend whose small-message f16 / bf16 all_reduce accumulates in f32 and rounds
/// once (so it declares `Rounding::ExactThenRound`) hands messages from 64 KiB to a ring
/// fallback that rounds every hop in the 16-bit dtype (vLLM's custom all-reduce above its
/// maximum size goes to NCCL; TensorRT-LLM's size-selected kernels). From 3 ranks (two ranks are
/// one addition, rounded once either way), f16 / bf16 `sum` all_reduce (both variants) adds in
/// rank order, rounding after every addition. Clauses `numerics.round_once` × `values.sizes`.
#[derive(Default)]
pub struct HalfLargePerStep;

impl HalfLargePerStep {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = op == ReduceOp::Sum && half(dtype) && s.ws() >= 3 && s.numel(x) * dtype.size() >= HALF_LARGE_FROM;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            (1..ws).fold(at(all, n, 0, i), |acc, q| round_to(dtype, acc + at(all, n, q, i)))
        })
    }
}

all_reduce_both_variants!(HalfLargePerStep);

// ---------------------------------------------------------------- finding 4: f64 via f32

/// The message size (bytes) from which [`F64LargeViaF32`] takes its vectorised path.
const F64_LARGE_FROM: usize = 128 << 10;

/// Finding 4. A large-message reduction path (vectorised, or a staging buffer) written for
/// 4-byte floats and used for f64 through a conversion (the small-path forms are the catalogue's
/// `f64_min_max_through_f32` and `review10_f64_scale_in_f32_off_out_of_place`): from 128 KiB,
/// f64 `sum` / `avg` all_reduce (both variants) converts every input to f32, adds in f32 in rank
/// order (avg: then divides by the world size in f32). Clauses `values.reduce` × `values.sizes`.
#[derive(Default)]
pub struct F64LargeViaF32;

impl F64LargeViaF32 {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = matches!(op, ReduceOp::Sum | ReduceOp::Avg) && dtype == DType::F64 && s.numel(x) * 8 >= F64_LARGE_FROM;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let sum = (0..ws).fold(0f32, |acc, q| acc + at(all, n, q, i) as f32);
            (if op == ReduceOp::Avg { sum / ws as f32 } else { sum }) as f64
        })
    }
}

all_reduce_both_variants!(F64LargeViaF32);

// ---------------------------------------------------------------- finding 5: saturating store

/// Finding 5. A reduce_scatter / reduce whose f16 / bf16 result is stored from its f32
/// accumulator through a saturating conversion (`__NV_SATFINITE`-style, or a clamp to the
/// finite range before packing, as FP8 / quantised codecs do): `±inf` becomes `±65504` /
/// `±3.39e38`. The catalogue's `review_scaled_reduce_saturates` is this store on the scaled
/// all_reduce path. `reduce_scatter_tensor` (all three forms) and `reduce` (the root's result),
/// f16 / bf16 `sum`. Clause `values.reduce`.
#[derive(Default)]
pub struct RsHalfSaturating;

impl RsHalfSaturating {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum && half(s.inner.buffer_dtype(x))
    }
}

impl Bug for RsHalfSaturating {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        Ok(if Self::fires(s, x, op) { saturate(s, w) } else { w })
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(if Self::fires(s, x, op) { saturate(s, w) } else { w })
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
        if !xs.iter().any(|x| Self::fires(s, x, op)) {
            return Ok(w);
        }
        Ok(s.then(w, |be, outs| {
            for out in outs {
                if half(be.buffer_dtype(out)) {
                    crate::edit(be, out, |t| {
                        let lim = finite_max(t.dtype());
                        for i in 0..t.numel() {
                            let v = t.get_f64(i);
                            if v.is_infinite() {
                                set_f64(t, i, lim.copysign(v));
                            }
                        }
                    })?;
                }
            }
            Ok(())
        }))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.reduce(x, op, root)?;
        Ok(if Self::fires(s, x, op) && s.rank() == root { saturate(s, w) } else { w })
    }
}

// ---------------------------------------------------------------- finding 6: f64 product

/// Finding 6. A "generic float" product kernel whose accumulator is f32: f64 `product`
/// all_reduce (both variants) converts each input to f32 and multiplies in rank order in f32.
/// Clause `values.reduce`.
#[derive(Default)]
pub struct F64ProductViaF32;

impl F64ProductViaF32 {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let fires = op == ReduceOp::Product && s.inner.buffer_dtype(x) == DType::F64;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| (0..ws).fold(1f32, |acc, q| acc * at(all, n, q, i) as f32) as f64)
    }
}

all_reduce_both_variants!(F64ProductViaF32);

// ---------------------------------------------------------------- finding 7: interior ranks

/// Finding 7. A chain (pipelined) reduction whose interior steps use the copy-and-forward
/// primitive instead of reduce-and-forward (NCCL-style `recvCopySend` where `recvReduceSend`
/// was meant), in the f32 / f64 min / max kernel instantiation only: rank 0's value travels
/// the chain unreduced and only the last rank folds in its own, so the result is
/// `op(rank 0, rank ws-1)` and every interior rank's contribution is lost. From 3 ranks,
/// all_reduce (both variants). Clause `values.reduce`.
#[derive(Default)]
pub struct MinMaxChainCopiesInterior;

impl MinMaxChainCopiesInterior {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = matches!(op, ReduceOp::Min | ReduceOp::Max) && matches!(dtype, DType::F32 | DType::F64) && s.ws() >= 3;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let (a, b) = (at(all, n, 0, i), at(all, n, ws - 1, i));
            let t = Tensor::from_f64(dtype, &[2], &[a, b]);
            concord_oracle_minmax(op, t.get_f64(0), t.get_f64(1))
        })
    }
}

/// `op` (min / max) of two values, NaN-propagating, `-0 < +0` (shm's policy).
fn concord_oracle_minmax(op: ReduceOp, a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    let less = a < b || (a == b && a.is_sign_negative() && b.is_sign_positive());
    match (op, less) {
        (ReduceOp::Min, true) | (ReduceOp::Max, false) => a,
        _ => b,
    }
}

all_reduce_both_variants!(MinMaxChainCopiesInterior);

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<BorUnmappedSum>(
            "review16_bor_unmapped_sum",
            "values.reduce",
            "pytorch/pytorch#39708, meta-pytorch/torchcomms#2082: a reduce-op table with no BOR entry falls back to sum: every integer bor reduction (all_reduce, reduce_scatter, reduce) adds",
            &["all_reduce::out::i32::bor::ws2"],
        ),
        spec::<MinMaxFiniteIdentity>(
            "review16_minmax_finite_identity",
            "values.reduce",
            "kokkos/kokkos#8244, rapidsai/cudf#11357: float max / min all_reduce folds from lowest() / max() instead of -inf / +inf: an element that is -inf (max) / +inf (min) on every rank comes back finite",
            &["all_reduce::out::f16::max::ws2::special"],
        ),
        spec::<HalfLargePerStep>(
            "review16_half_large_per_step",
            "numerics.round_once",
            "f16 / bf16 sum all_reduce from 64 KiB and 3 ranks leaves the f32 one-shot kernel for a ring that rounds every hop in the 16-bit dtype (declares ExactThenRound)",
            &["all_reduce::out::f16::sum::ws3::random::large"],
        ),
        spec::<F64LargeViaF32>(
            "review16_f64_large_via_f32",
            "values.reduce",
            "f64 sum / avg all_reduce from 128 KiB takes a path written for 4-byte floats: converts to f32 and adds in f32",
            &["all_reduce::out::f64::sum::ws2::random::large"],
        ),
        spec::<RsHalfSaturating>(
            "review16_rs_half_saturating",
            "values.reduce",
            "f16 / bf16 sum reduce_scatter (every form) and reduce store the f32 accumulator through a saturating conversion: +-inf becomes +-max finite",
            &["reduce_scatter_tensor::out::f16::sum::ws2::special"],
        ),
        spec::<F64ProductViaF32>(
            "review16_f64_product_via_f32",
            "values.reduce",
            "f64 product all_reduce multiplies in an f32 accumulator (a generic float kernel)",
            &["all_reduce::out::f64::product::ws2::random"],
        ),
        spec::<MinMaxChainCopiesInterior>(
            "review16_minmax_chain_copies_interior",
            "values.reduce",
            "f32 / f64 min / max all_reduce from 3 ranks: the chain's interior steps copy-and-forward instead of reduce-and-forward: only rank 0 and the last rank decide",
            &["all_reduce::out::f32::min::ws3::random"],
        ),
    ]
}
