//! review20's axis audit (docs/review20.md): the catalogue read as a matrix (clause × op × dtype ×
//! reduce op × world size × size × root). Each bug here is restricted to cells no case visited
//! (a reduce op but `sum` above 8 ranks, half-precision sums past 1,031 elements at 4+ ranks, …),
//! and each SURVIVED the whole catalogue (8,311 cases) before its case or grid change.
use crate::bugs_hunt2::{int_at, set_int};
use crate::bugs_hunt28::{at, half, rewrite, round_to};
use crate::campaign::{spec, Spec};
use crate::{set_f64, Buf, Bug, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};

/// `v` wrapped to the dtype's width, then read back as that dtype's value.
fn wrap(d: DType, v: i128) -> i128 {
    let bits = 8 * d.size() as u32;
    let m = v.rem_euclid(1i128 << bits);
    if d.is_signed_int() && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Rank `q`'s element `i` of a raw all_gather of `n`-element integer inputs.
fn at_int(all: &Tensor, n: usize, q: usize, i: usize) -> i128 {
    int_at(all, q * n + i)
}

/// Ranks per node of the hierarchical path.
const NODE: usize = 8;

/// A1: hierarchical all_reduce above one node of 8 ranks (intra-node then inter-node), the
/// reduce op passed down to both levels: integer `avg` becomes an average of per-node averages,
/// each truncated in the dtype (float avg of equal nodes is exact, so only ints show it).
#[derive(Default)]
pub struct HierIntAvg;
impl HierIntAvg {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        let fires = op == ReduceOp::Avg && !dtype.is_float() && ws > NODE;
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            let nodes = ws.div_ceil(NODE);
            for i in 0..n {
                let mut top: i128 = 0;
                for g in 0..nodes {
                    let members = (g * NODE..((g + 1) * NODE).min(ws)).collect::<Vec<_>>();
                    let s: i128 = wrap(dtype, members.iter().map(|&q| at_int(all, n, q, i)).sum());
                    top = wrap(dtype, top + s / members.len() as i128);
                }
                set_int(t, i, top / nodes as i128);
            }
        })
    }
}
impl Bug for HierIntAvg {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// A2: the two-shot all_reduce (taken from 4 ranks on, for messages of 64 KiB and more)
/// accumulates f16 / bf16 in the native dtype, in rank order (TensorRT-LLM PR #16753's bug, kept
/// to the kernel that had it); the one-shot path below is right. Same bits on every rank.
#[derive(Default)]
pub struct TwoShotHalfNative;
impl TwoShotHalfNative {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        let n = s.numel(x);
        let fires = op == ReduceOp::Sum && half(dtype) && ws >= 4 && n * 2 >= 64 << 10;
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            for i in 0..n {
                let v = (1..ws).fold(at(all, n, 0, i), |acc, q| round_to(dtype, acc + at(all, n, q, i)));
                set_f64(t, i, v);
            }
        })
    }
}
impl Bug for TwoShotHalfNative {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// Elements per pipeline chunk of the large path.
const CHUNK: usize = 1 << 16;

/// A3: float `premul_sum(s)` over 64 Ki elements run as pipelined chunks of 64 Ki elements, each
/// chunk launched with the op's scalar; the last partial chunk's launch is built without it (the
/// default scalar 1: the plain sum). `avg` (the backend's own 1/ws, not the caller's) is right.
#[derive(Default)]
pub struct AvgTailUnscaled;
impl AvgTailUnscaled {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        let n = s.numel(x);
        let scaled = matches!(op, ReduceOp::PremulSum(_));
        let fires = scaled && dtype.is_float() && ws >= 2 && n > CHUNK && !n.is_multiple_of(CHUNK);
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            for i in n / CHUNK * CHUNK..n {
                let v: f64 = (0..ws).map(|q| at(all, n, q, i)).sum();
                set_f64(t, i, round_to(dtype, v));
            }
        })
    }
}
impl Bug for AvgTailUnscaled {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

/// A4: the in-place all_reduce stages its input in a scratch buffer from 64 KiB on (peers read
/// it while the caller's buffer is overwritten); the staging copy is sized `numel * 4` bytes, so
/// for 8-byte dtypes the scratch's second half is never filled (fresh zeros): the result's second
/// half is the reduction of zeros, on every rank alike.
#[derive(Default)]
pub struct InplaceWideStaged;
impl InplaceWideStaged {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        let fires = dtype.size() == 8 && n * 8 >= 64 << 10 && s.ws() >= 2;
        rewrite(s, x, op, true, fires, move |_all, t| {
            let n = t.numel();
            for b in &mut t.bytes_mut()[n / 2 * 8..] {
                *b = 0;
            }
        })
    }
}
impl Bug for InplaceWideStaged {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op)
    }
}

/// A5: the gather's root tracks which peers' chunks are ready in a 32-bit mask (`ready |= 1 << q`,
/// the shift count taken mod 32 as x86 does): from 33 ranks on, rank 32's bit is rank 0's, so the
/// root copies rank 32's chunk from rank 0's slot.
#[derive(Default)]
pub struct GatherMask32;
impl Bug for GatherMask32 {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let ws = s.ws();
        let me = s.rank();
        let n = s.numel(x);
        let w = s.inner.gather(x, root)?;
        if ws <= 32 || me != root {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let es = t.dtype().size();
                for q in 32..ws {
                    let src = (q % 32) * n * es;
                    let chunk = t.bytes()[src..src + n * es].to_vec();
                    t.bytes_mut()[q * n * es..(q + 1) * n * es].copy_from_slice(&chunk);
                }
            })
        }))
    }
}

/// A6: reduce_scatter `avg` of floats whose output passes 64 Ki elements runs as chunks of 64 Ki
/// output elements, each divided by the world size in the chunk loop; the last partial chunk is
/// left as the sum (the all_reduce large path was fixed for this, the reduce_scatter's copy not).
#[derive(Default)]
pub struct RsAvgTail;
impl RsAvgTail {
    fn fix(s: &Shm, op: ReduceOp, w: Work<Buf>, x: &Buf) -> Work<Buf> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        let n_out = s.numel(x) / ws.max(1);
        if op != ReduceOp::Avg || !dtype.is_float() || ws < 2 || n_out <= CHUNK || n_out.is_multiple_of(CHUNK) {
            return w;
        }
        s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                let n = t.numel();
                for i in n / CHUNK * CHUNK..n {
                    let v = t.get_f64(i) * ws as f64;
                    set_f64(t, i, v);
                }
            })
        })
    }
}
impl Bug for RsAvgTail {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        Ok(Self::fix(s, op, w, x))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(Self::fix(s, op, w, x))
    }
}

/// A7: f16 / bf16 `min` / `max` all_reduce from 4 Ki elements on (the vectorised large path)
/// compares the 16-bit patterns as signed integers (RCCL's bf16 min/max done bitwise, kept to
/// the path that vectorises): right for non-negative values, reversed among negatives.
#[derive(Default)]
pub struct HalfLargeMinMaxBits;
impl HalfLargeMinMaxBits {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        let n = s.numel(x);
        let fires = matches!(op, ReduceOp::Min | ReduceOp::Max) && half(dtype) && ws >= 2 && n >= 4096;
        rewrite(s, x, op, in_place, fires, move |all, t| {
            let n = t.numel();
            let bits = |q: usize, i: usize| i16::from_le_bytes([all.bytes()[2 * (q * n + i)], all.bytes()[2 * (q * n + i) + 1]]);
            for i in 0..n {
                let mut best = bits(0, i);
                for q in 1..ws {
                    let v = bits(q, i);
                    if (op == ReduceOp::Min && v < best) || (op == ReduceOp::Max && v > best) {
                        best = v;
                    }
                }
                t.bytes_mut()[2 * i..2 * i + 2].copy_from_slice(&best.to_le_bytes());
            }
        })
    }
}
impl Bug for HalfLargeMinMaxBits {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<HierIntAvg>(
            "review20_hier_int_avg",
            "values.world_sizes",
            "above 8 ranks integer avg = avg of per-node truncated avgs",
            &["all_reduce::out::dtypes::ws16"],
        ),
        spec::<TwoShotHalfNative>(
            "review20_twoshot_half_native",
            "values.sizes",
            "from 4 ranks and 64 KiB, f16/bf16 sum accumulated in the native dtype",
            &["all_reduce::out::f16::sum::ws5::random::large", "all_reduce::out::bf16::sum::ws4::random::large"],
        ),
        spec::<AvgTailUnscaled>(
            "review20_avg_tail_unscaled",
            "values.sizes",
            "float premul_sum over 64 Ki elements: last partial chunk unscaled",
            &["programs::p1::ws7"],
        ),
        spec::<InplaceWideStaged>(
            "review20_inplace_wide_staged",
            "values.sizes",
            "in-place all_reduce of 8-byte dtypes from 64 KiB: staging copy sized numel*4, second half zeros",
            &["all_reduce::inplace::f64::sum::ws2::large"],
        ),
        spec::<RsAvgTail>(
            "review20_rs_avg_tail",
            "values.reduce",
            "reduce_scatter float avg, output over 64 Ki elements: last partial chunk left as the sum",
            &["reduce_scatter_tensor::outbuf::f32::avg::ws2::large"],
        ),
        spec::<HalfLargeMinMaxBits>(
            "review20_half_large_minmax_bits",
            "values.reduce",
            "f16/bf16 min/max all_reduce from 4 Ki elements: bit patterns compared as signed ints",
            &["all_reduce::out::f16::min::ws2::random::p4099", "all_reduce::out::bf16::max::ws2::random::p4099"],
        ),
        spec::<GatherMask32>(
            "review20_gather_mask32",
            "values.world_sizes",
            "gather from 33 ranks: a 32-bit ready mask, rank 32 read from rank 0's slot",
            &["sizes::wide::ws33"],
        ),
    ]
}
