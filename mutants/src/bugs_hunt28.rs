//! The twenty-eighth hunt: bugs from the wild in the numerics of reductions. Each ports a
//! correctness bug that shipped in a collective library or its framework layer (TensorRT-LLM,
//! vLLM's QuickReduce, PaddlePaddle on Ascend, NCCLX's CTRAN, oneCCL, TensorFlow's NCCL
//! kernel): low-precision sums accumulated in their own type or in a narrower one, a
//! conversion that truncates instead of rounding, NaN handled by rewriting the input, an
//! average taken of an unscaled half-precision sum. Each keeps the original's trigger (dtype,
//! reduce op, size, world size, order of the additions) as far as a wrapper over shm can.
//!
//! Every bug computes its result from every rank's input: once the correct all_reduce has
//! completed (so only on a call every rank agreed on), the inputs are all-gathered inside the
//! wait and the result is rewritten element by element, on every rank alike ([`rewrite`], the
//! pattern of `bugs_hunt18::OneShotRankOrder`).

use crate::campaign::{spec, Spec};
use crate::{set_f64, Buf, Bug, Shm, BUG_WAIT};
use concord_core::half::{bf16, f16};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};

/// `v` rounded to `dtype` (to nearest, ties to even; out of range: ±inf), back as f64.
pub(crate) fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => Tensor::from_f64(dtype, &[1], &[v]).get_f64(0),
    }
}

/// Rank `q`'s element `i` of a raw all_gather of `n`-element inputs.
pub(crate) fn at(all: &Tensor, n: usize, q: usize, i: usize) -> f64 {
    all.get_f64(q * n + i)
}

/// The all_reduce (variant `in_place`) of `x`; when `fires` (decided from the call alone, the
/// same on every rank of a valid call) and nothing else is in flight on the communicator, its
/// result is rewritten once it completed: the inputs (`x` as it was at issue) are all-gathered
/// then, so only on a call every rank agreed on, and `f` edits the result from them (`all`:
/// rank `q`'s element `i` at `q * n + i`). The gather is waited inside the hook: nothing stays
/// counted in `outstanding()`.
pub(crate) fn rewrite(
    s: &Shm,
    x: &Buf,
    op: ReduceOp,
    in_place: bool,
    fires: bool,
    f: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<Buf>> {
    let issue = || if in_place { s.inner.all_reduce_(x, op) } else { s.inner.all_reduce(x, op) };
    if !fires || s.inner.outstanding() != 0 {
        return issue();
    }
    let snap = if in_place { s.inner.upload(&s.inner.download(x)?)? } else { x.clone() };
    let w = issue()?;
    Ok(s.then(w, move |be, out| {
        let g = be.all_gather_into_tensor(&snap)?;
        let all = be.download(g.wait(BUG_WAIT)?)?;
        crate::edit(be, out, |t| f(&all, t))
    }))
}

/// [`rewrite`] with element `i` of the result set to `f(all, n, i)`.
pub(crate) fn rewrite_each(
    s: &Shm,
    x: &Buf,
    op: ReduceOp,
    in_place: bool,
    fires: bool,
    f: impl Fn(&Tensor, usize, usize) -> f64 + Send + 'static,
) -> Result<Work<Buf>> {
    rewrite(s, x, op, in_place, fires, move |all, t| {
        let n = t.numel();
        for i in 0..n {
            let v = f(all, n, i);
            set_f64(t, i, v);
        }
    })
}

/// Whether `dtype` is one of the two half-precision floats.
pub(crate) fn half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

// ---------------------------------------------------------------- NVIDIA/TensorRT-LLM PR #16753

/// TensorRT-LLM's custom all-reduce fusion kernels accumulating in the 16-bit dtype
/// (NVIDIA/TensorRT-LLM PR #16753 "Default to FP32 accumulation in allreduce fusion kernels":
/// the one-shot / two-shot kernels summed the peers' f16 / bf16 values in the native dtype
/// unless `ALL_REDUCE_FUSION_KERNEL_ACC_FP32` was set, and the autotuner picked them on speed
/// alone — a GPQA swing of ~5 points on GPT-OSS 120B, whose residual values reach ~75k where a
/// bf16 ulp is 512). Here an f16 / bf16 `sum` all_reduce (either variant) adds the ranks'
/// values in rank order, rounding to the dtype after every addition, instead of rounding the
/// exact sum once (what shm declares: `Rounding::ExactThenRound`). Two ranks are one addition,
/// rounded once: the bug shows from three ranks on.
#[derive(Default)]
pub struct TrtllmHalfNativeAccumulate;

impl TrtllmHalfNativeAccumulate {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = op == ReduceOp::Sum && half(dtype) && s.ws() >= 2;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            (1..ws).fold(at(all, n, 0, i), |acc, q| round_to(dtype, acc + at(all, n, q, i)))
        })
    }
}

impl Bug for TrtllmHalfNativeAccumulate {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- vllm-project/vllm #55345

/// The smallest bf16 message QuickReduce takes at `ws` ranks with its FP codec (vLLM's
/// `_QR_MIN_SIZE[(torch.bfloat16, ws)][FP]`: 2, 8 and 16 MiB at 2, 4 and 8 ranks), `None` at a
/// world size it does not serve.
fn quick_reduce_min_bytes(ws: usize) -> Option<usize> {
    const MB: usize = 1 << 20;
    match ws {
        2 => Some(2 * MB),
        4 => Some(8 * MB),
        8 => Some(16 * MB),
        _ => None,
    }
}

/// QuickReduce's bf16 path (vllm-project/vllm #55345 "QuickReduce converts bf16 to fp16 without
/// saturation": with `cast_bf16_to_fp16` on, the default, every bf16 input is converted to f16
/// by `__float22half2_rn` before any codec runs, reduced in f16 and converted back; a value
/// beyond f16's range becomes inf, one below its subnormals becomes zero, and the f16 sum is
/// rounded twice, to f16 and then to bf16). QuickReduce serves a bf16 all_reduce at 2, 4 and 8
/// ranks from [`quick_reduce_min_bytes`] on. Here such a `sum` all_reduce (either variant)
/// converts each rank's values to f16, adds them in rank order in f16 and rounds the f16 sum to
/// bf16.
#[derive(Default)]
pub struct QuickReduceBf16ThroughF16;

impl QuickReduceBf16ThroughF16 {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let bytes = s.numel(x) * dtype.size();
        let fires = op == ReduceOp::Sum && dtype == DType::BF16 && quick_reduce_min_bytes(s.ws()).is_some_and(|m| bytes >= m);
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let h = |q: usize| f16::from_f64(at(all, n, q, i)).to_f64();
            let sum = (1..ws).fold(h(0), |acc, q| f16::from_f64(acc + h(q)).to_f64());
            bf16::from_f64(sum).to_f64()
        })
    }
}

impl Bug for QuickReduceBf16ThroughF16 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- PaddlePaddle/Paddle PR #34462

/// PaddlePaddle's `c_allreduce_sum` on Ascend (PaddlePaddle/Paddle PR #34462 "Fix allreduce_sum
/// potential bugs on NPU", after PR #32735 "Set input and output to inf when program meets
/// float overflow": HCCL crashed on NaN data, so before the sum the kernel checks its f32 / f16
/// input for NaN and, if it finds one, fills the whole input with +inf). A NaN anywhere in one
/// rank's input turns every element of the sum into +inf (or NaN where a peer holds -inf),
/// where only that element should be NaN. Here an f32 / f16 `sum` all_reduce (either variant)
/// gives each rank whose input holds a NaN an all-+inf contribution.
#[derive(Default)]
pub struct PaddleNpuNanFillsInf;

impl PaddleNpuNanFillsInf {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = op == ReduceOp::Sum && matches!(dtype, DType::F32 | DType::F16) && s.ws() >= 2;
        let ws = s.ws();
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            let filled: Vec<bool> = (0..ws).map(|q| (0..n).any(|j| at(all, n, q, j).is_nan())).collect();
            if !filled.contains(&true) {
                return;
            }
            for i in 0..n {
                let v = (0..ws).map(|q| if filled[q] { f64::INFINITY } else { at(all, n, q, i) }).fold(0.0, |acc, v| acc + v);
                set_f64(t, i, v);
            }
        })
    }
}

impl Bug for PaddleNpuNanFillsInf {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #4071

/// NCCLX's legacy CTRAN Ring average in half precision (meta-pytorch/torchcomms PR #4071 "Match
/// NCCL Ring FP16 AVG pre-multiply semantics" and PR #4069, its BF16 twin: the ring summed the
/// ranks' f16 / bf16 contributions unscaled, hop by hop in the dtype, and divided at the end, so
/// an average of values near the largest finite one overflowed to inf in the intermediate sum).
/// Here an f16 / bf16 `avg` all_reduce (either variant) adds the ranks' values in ring order,
/// rounding to the dtype after every hop, then multiplies by `1 / ws` and rounds again.
#[derive(Default)]
pub struct CtranRingHalfAvgSumFirst;

impl CtranRingHalfAvgSumFirst {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = op == ReduceOp::Avg && half(dtype) && s.ws() >= 2;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let sum = (1..ws).fold(at(all, n, 0, i), |acc, q| round_to(dtype, acc + at(all, n, q, i)));
            round_to(dtype, sum * f64::from(1.0f32 / ws as f32))
        })
    }
}

impl Bug for CtranRingHalfAvgSumFirst {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- oneapi-src/oneCCL bf16 avx512f

/// `f` of two bf16 values in f32, stored back as bf16 by dropping the low 16 bits (round toward
/// zero; a NaN stays a NaN, its payload's top bits kept).
fn bf16_truncating(a: f64, b: f64, f: fn(f32, f32) -> f32) -> f64 {
    let r = f(a as f32, b as f32);
    bf16::from_bits((r.to_bits() >> 16) as u16).to_f64()
}

/// oneCCL's bf16 reduction on CPUs without AVX512-BF16 (oneapi-src/oneCCL,
/// `src/comp/bf16/bf16_intrisics.hpp`, shipped from 2020 in `bfp16_intrisics.h` on: the
/// `avx512f` implementation loads both bf16 operands as f32, reduces them in f32 and stores the
/// result with `ccl_fp32_store_as_bf16_avx512f`, `_mm512_cvtepi32_epi16(_mm512_bsrli_epi128(x,
/// 2))`, which keeps the top 16 bits: round toward zero, where the `avx512bf` twin rounds to
/// nearest even with `_mm512_cvtneps_pbh`). Every pairwise reduce of the ring truncates. Here a
/// bf16 `sum` / `product` all_reduce (either variant) folds the ranks in rank order, each step in
/// f32 truncated to bf16. A source citation, not an issue thread: no report of it was found.
#[derive(Default)]
pub struct OnecclBf16TruncatingStore;

impl OnecclBf16TruncatingStore {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let step: Option<fn(f32, f32) -> f32> = match op {
            ReduceOp::Sum => Some(|a, b| a + b),
            ReduceOp::Product => Some(|a, b| a * b),
            _ => None,
        };
        let fires = step.is_some() && dtype == DType::BF16 && s.ws() >= 2;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let f = step.unwrap_or(|a, b| a + b);
            (1..ws).fold(at(all, n, 0, i), |acc, q| bf16_truncating(acc, at(all, n, q, i), f))
        })
    }
}

impl Bug for OnecclBf16TruncatingStore {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- tensorflow/tensorflow #102046

/// TensorFlow's NCCL all-reduce of f16 (tensorflow/tensorflow #102046, PR #102098 "Fix distribute
/// reduce f16 overflow": `tf.distribute.Strategy.reduce("SUM")` of float16 tensors went through
/// `NcclAllReduceOpKernel`, whose ring summed in native f16, so a partial sum overflowed to inf
/// before the final, finite, sum was reached, and every hop rounded). In a ring all-reduce the
/// message is cut into one chunk per rank and chunk `c` is accumulated starting at rank
/// `(c + 1) % ws`, around the ring, ending at rank `c`: the order of the additions depends on
/// the element's chunk. Here an f16 `sum` all_reduce (either variant) adds each element's values
/// in its chunk's ring order, rounding to f16 after every hop. Two ranks are one addition per
/// element, rounded once: the bug shows from three ranks on.
#[derive(Default)]
pub struct TfNcclF16RingHops;

impl TfNcclF16RingHops {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = op == ReduceOp::Sum && dtype == DType::F16 && s.ws() >= 2;
        let ws = s.ws();
        rewrite_each(s, x, op, in_place, fires, move |all, n, i| {
            let chunk = n.div_ceil(ws).max(1);
            let c = i / chunk;
            let start = (c + 1) % ws;
            (1..ws).fold(at(all, n, start, i), |acc, k| round_to(DType::F16, acc + at(all, n, (start + k) % ws, i)))
        })
    }
}

impl Bug for TfNcclF16RingHops {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- horovod/horovod PR #2375

/// Horovod's half-precision average of a one-element buffer (horovod/horovod PR #2375 "Fix
/// averaging using CUDA half2 implementation one element half buffers": since PR #1949 an
/// average is a sum with a post-scale factor `1 / size`, applied by `ScaleBufferImpl`, whose
/// half2 CUDA kernel sizes its grid from the number of half2 pairs, `count / 2`; a buffer of a
/// single f16 element has no pair, the grid is empty and the division is skipped). Here an f16
/// `avg` all_reduce (either variant) of exactly one element returns the sum.
#[derive(Default)]
pub struct HorovodHalf2OneElementUnscaled;

impl HorovodHalf2OneElementUnscaled {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Avg && s.inner.buffer_dtype(x) == DType::F16 && s.numel(x) == 1
    }
}

impl Bug for HorovodHalf2OneElementUnscaled {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(x, if Self::fires(s, x, op) { ReduceOp::Sum } else { op })
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, if Self::fires(s, x, op) { ReduceOp::Sum } else { op })
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<TrtllmHalfNativeAccumulate>(
            "wild_trtllm_half_native_accumulate",
            "numerics.round_once",
            "NVIDIA/TensorRT-LLM PR #16753: f16 / bf16 sum all_reduce adds the ranks in rank order in the 16-bit dtype, rounding after every addition",
            &["numerics::round_once::f16::ws3"],
        ),
        spec::<QuickReduceBf16ThroughF16>(
            "wild_quickreduce_bf16_through_f16",
            "numerics.round_once",
            "vllm-project/vllm #55345: bf16 sum all_reduce at 2 / 4 / 8 ranks from 2 / 8 / 16 MiB converts to f16 (non-saturating), sums in f16, rounds back to bf16",
            &["numerics::round_once::large::bf16::ws2"],
        ),
        spec::<PaddleNpuNanFillsInf>(
            "wild_paddle_npu_nan_fills_inf",
            "values.reduce",
            "PaddlePaddle/Paddle PR #34462 (#32735): f32 / f16 sum all_reduce: a rank whose input holds a NaN contributes +inf in every element",
            &["all_reduce::out::f32::sum::ws2::special"],
        ),
        spec::<CtranRingHalfAvgSumFirst>(
            "wild_ctran_ring_half_avg_sum_first",
            "numerics.round_once",
            "meta-pytorch/torchcomms PR #4071 (#4069): f16 / bf16 avg all_reduce sums unscaled in the dtype hop by hop, then scales by 1/ws (overflows near the max)",
            &["numerics::round_once::avg_near_max::f16::ws2"],
        ),
        spec::<OnecclBf16TruncatingStore>(
            "wild_oneccl_bf16_truncating_store",
            "numerics.round_once",
            "oneapi-src/oneCCL bf16_intrisics.hpp (avx512f path, source): bf16 sum / product all_reduce truncates every pairwise f32 result to bf16 (round toward zero)",
            &["numerics::round_once::bf16::ws3"],
        ),
        spec::<TfNcclF16RingHops>(
            "wild_tf_nccl_f16_ring_hops",
            "numerics.round_once",
            "tensorflow/tensorflow #102046 (PR #102098): f16 sum all_reduce adds in ring order per chunk (from rank c+1), rounding to f16 after every hop",
            &["numerics::round_once::f16::ws3"],
        ),
        spec::<HorovodHalf2OneElementUnscaled>(
            "wild_horovod_half2_one_element_unscaled",
            "values.reduce",
            "horovod/horovod PR #2375: f16 avg all_reduce of exactly one element skips the half2 post-scale: returns the sum",
            &["all_reduce::out::f16::avg::ws2"],
        ),
    ]
}
