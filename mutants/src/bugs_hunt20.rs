//! The twentieth hunt: bugs from the wild in fused communication + compute. Each of these ports
//! a correctness bug that shipped in a fused / symmetric-memory layer (PyTorch's async-TP
//! symmetric-memory ops, vLLM's and AITER's reduce-scatter along a dim, vLLM's NCCL
//! symmetric-memory collectives), found in the project's issue or pull-request thread named on
//! its type. Each keeps the original's mechanism and its trigger (the scatter dim, the rank of
//! the operands, the scale layout, a second call of the same shape) over the correct shm backend,
//! as far as the `Backend` trait lets a wrapper reproduce it. Bad input is still validated as shm
//! validates it (every rank exchanges its description first), so only the mechanism differs.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant, BUG_WAIT};
use concord_core::fused::{
    decomposed_low_contention, describe, exchange_and_validate, gather_row_scales, input_descs, move_from_front, move_to_front,
    AgMatmulPlan, Gathered, MatmulRsPlan,
};
use concord_core::{Backend, CallOp, CollectiveError, ReduceOp, Result, Scale, Scaling, Tensor, Work};
use std::collections::HashMap;
use std::sync::Mutex;

/// The validated product `a @ b` of this rank and its plan (the decomposition's first half).
fn product(m: &Mutant, a: &Buf, b: &Buf, op: ReduceOp, dim: usize, sc: Option<&Scaling>) -> Result<(MatmulRsPlan, Tensor)> {
    let be = &*m.s.inner;
    let ins = input_descs(be, a, std::slice::from_ref(b));
    exchange_and_validate(be, &describe(CallOp::FusedMatmulReduceScatter, be.rank(), ins.clone(), Some(op), dim, sc))?;
    let plan = MatmulRsPlan::new(be.world_size(), &ins[0], &ins[1], op, dim, sc);
    let c = plan.product(&be.download(a)?, &be.download(b)?, sc);
    Ok((plan, c))
}

/// Reduce-scatters `moved` along its dim 0 with shm and waits (the bug's own wait).
/// `res`'s bytes read in the caller's output shape, uploaded: the op's (already complete) result.
fn finish(m: &Mutant, plan: &MatmulRsPlan, res: &Tensor, op: &'static str) -> Result<Work<Buf>> {
    let out = Tensor::from_bytes(res.dtype(), &plan.out_shape(), res.bytes());
    Ok(m.s.done(m.s.inner.upload(&out)?, op))
}

fn reduce_scatter_front(m: &Mutant, moved: &Tensor, op: ReduceOp) -> Result<Tensor> {
    let be = &*m.s.inner;
    let work = be.reduce_scatter_tensor(&be.upload(moved)?, op)?;
    be.download(work.wait(BUG_WAIT)?)
}

// ---------------------------------------------------------------- vllm-project/vllm PR #30610

/// vLLM's `reduce_scatter(input_, dim)` (vllm-project/vllm PR #30610 "Fix incorrect dimension in
/// reduce_scatter", fixing #30546; the same bug in ROCm/aiter PR #3395 "Fix reduce scatter when
/// dim != 0"): the scattered dim is brought to the front with `input_.movedim(0, dim)` (dim 0
/// moved *to* `dim`) instead of `movedim(dim, 0)`, reduce-scattered along dim 0, and moved back
/// with `movedim(0, dim)`. For dim 0, and for dim 1 of a 2-D or 3-D tensor (where both moves are
/// one swap), it is right, which is why the 1-D `dim=0` test never saw it; from dim 2 on the wrong
/// dim is scattered. Ported onto the matmul-reduce-scatter's reduce-scatter along `scatter_dim`
/// (both variants): the result's bytes come back in the expected shape. At one rank vLLM returns
/// the input untouched (`if world_size == 1: return input_`), so the bug needs two ranks.
#[derive(Default)]
pub struct RsMovedimReversed;

impl Bug for RsMovedimReversed {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        if m.s.ws() == 1 {
            return concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, sc);
        }
        let (plan, c) = product(m, a, b, op, dim, sc)?;
        // movedim(0, dim): dim 0 goes to `dim`, which is `move_from_front` of the product.
        let wrong = move_from_front(&c, dim);
        let res = reduce_scatter_front(m, &wrong, op)?;
        let back = move_from_front(&res, dim);
        finish(m, &plan, &back, "fused_matmul_reduce_scatter")
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #153595

/// PyTorch's `fused_scaled_matmul_reduce_scatter` (pytorch/pytorch PR #153595 "[Async TP] Fix dim
/// swapping before reduction in fused_scaled_matmul_reduce_scatter"): the op swaps dims 0 and
/// `scatter_dim` at its start (to chunk along dim 0) and must swap them back before the
/// reduction; the swap back was wrong, "causing incorrect numerics when `scatter_dim=1`" (its
/// test had not been running). Ported as: the scaled variant with `scatter_dim >= 1` reduces the
/// chunks with the scatter dim still in front and returns those bytes in the caller's shape. The
/// unscaled op (a different code path) is right.
#[derive(Default)]
pub struct ScaledRsDimNotSwappedBack;

impl Bug for ScaledRsDimNotSwappedBack {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        if sc.is_none() || dim == 0 {
            return concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, sc);
        }
        let (plan, c) = product(m, a, b, op, dim, sc)?;
        let res = reduce_scatter_front(m, &move_to_front(&c, dim), op)?;
        // Not swapped back: the moved layout, read in the caller's shape.
        finish(m, &plan, &res, "fused_scaled_matmul_reduce_scatter")
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #136866

/// PyTorch's `fused_scaled_matmul_reduce_scatter` with a row-wise (channel-wise) `A` scale
/// (pytorch/pytorch #136866 "fused_scaled_matmul_reduce_scatter report error with channel-wise
/// scaling"): `A` is chunked for each destination rank but `scale_a` is not, so `_scaled_mm`
/// gets the whole scale for one chunk and every valid call fails with "Invalid scaling
/// configuration ... scale_a should be (1024, 1) ... Got scale_a.size()=(8192, 1)". A per-tensor
/// scale works. At one rank the chunk is the whole `A`, so the shapes agree.
#[derive(Default)]
pub struct ScaledRsRowScaleUnsharded;

impl Bug for ScaledRsRowScaleUnsharded {
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        sc: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let be = &*m.s.inner;
        let ws = be.world_size();
        let rows = match sc.map(|s| &s.a) {
            Some(Scale::Rows(v)) if ws > 1 => v.len(),
            _ => return concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, sc),
        };
        // Bad input is refused as shm refuses it; a valid call reaches the chunk's `_scaled_mm`.
        let ins = input_descs(be, a, std::slice::from_ref(b));
        exchange_and_validate(be, &describe(CallOp::FusedMatmulReduceScatter, be.rank(), ins, Some(op), dim, sc))?;
        Err(CollectiveError::Backend(format!(
            "Invalid scaling configuration. For RowWise scaling, scale_a should be ({}, 1). Got scale_a.size()=({rows}, 1)",
            rows / ws
        )))
    }
}

// ---------------------------------------------------------------- vllm-project/vllm PR #58154

/// vLLM's NCCL symmetric-memory all_gather / reduce_scatter (vllm-project/vllm PR #58154
/// "[Bugfix][Distributed] Preserve symmetric collective outputs"): the ops reuse a persistent
/// registered scratch buffer per shape and dtype (from #46703) and return that buffer itself, so
/// a later collective of the same shape and dtype overwrites an earlier result that is still
/// live ("the collective itself computes the correct value, but the returned tensor does not
/// have independent storage"). Ported onto the symmetric-memory ops of the trait,
/// `low_contention_all_gather` / `low_contention_reduce_scatter`: the first result of a (op,
/// shape, dtype) becomes the scratch, and every later one is written into it and returned.
#[derive(Default)]
pub struct SymmScratchOutputReused {
    scratch: Mutex<HashMap<String, Buf>>,
}

impl Bug for SymmScratchOutputReused {
    fn low_contention(&self, m: &Mutant, x: &Buf, op: Option<ReduceOp>) -> Result<Work<Buf>> {
        let be = &*m.s.inner;
        let key = format!("{op:?}/{:?}/{}", be.buffer_shape(x), be.buffer_dtype(x));
        let w = decomposed_low_contention(m, x, op)?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        match scratch.get(&key) {
            None => {
                scratch.insert(key, w.peek().clone());
                Ok(w)
            }
            Some(buf) => {
                let buf = buf.clone();
                let into = buf.clone();
                Ok(m.s.then_as(w, buf, move |be, out| be.write(&into, &be.download(out)?)))
            }
        }
    }
}

// ---------------------------------------------------------------- openxla/xla PR #20086

/// XLA:GPU's collective-permute over local peer memcpy (`xla_gpu_use_memcpy_local_p2p`), as a
/// collective matmul (all-gather + matmul unrolled over `ppermute` steps) runs it: openxla/xla
/// #19555 "[GPU bug] Memcpy local p2p leads to numerical issues (mem access problems)" (its repro
/// is exactly that collective matmul), fixed by openxla/xla PR #20086 "[NVIDIA GPU] Fix mem p2p
/// init in collective permute thunk", which adds a device sync before the memcpy "to make sure
/// all gpus arrive at the same stage. Otherwise it's possible to have data corruptions when the
/// receiving rank hasn't arrived at the memcpy". The sender copies the next step's shard into the
/// receiver's one buffer while the receiver still has to consume the current one. Ported with the
/// receiver always behind: at ring steps `1 ..= ws - 2` the shard consumed (and gathered) in the
/// place of rank `me - s` is the one of the next step, rank `me - s - 1`; step 0 is the local shard
/// (no copy) and the last step has no later copy, so two ranks are right and three are not.
#[derive(Default)]
pub struct MemcpyP2pOverwrittenBeforeRead;

impl Bug for MemcpyP2pOverwrittenBeforeRead {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let be = &*m.s.inner;
        let (ws, me) = (be.world_size(), be.rank());
        if ws < 3 {
            return concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, sc);
        }
        let ins = input_descs(be, a, bs);
        exchange_and_validate(be, &describe(CallOp::FusedAllGatherMatmul, me, ins.clone(), None, dim, sc))?;
        let a_scales = match sc {
            Some(s) => Some(gather_row_scales(be, &s.a)?),
            None => None,
        };
        let plan = AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, sc);
        // Every rank's shard, through shm (the ring's transfers).
        let all = be.download(be.all_gather_into_tensor(a)?.wait(BUG_WAIT)?)?;
        let n = all.bytes().len() / ws;
        let shard = |r: usize| Tensor::from_bytes(plan.dtype, &plan.shard_shape, &all.bytes()[r * n..(r + 1) * n]);
        let bts = bs.iter().map(|x| be.download(x)).collect::<Result<Vec<_>>>()?;
        let mut parts = plan.start();
        for step in 0..ws {
            let slot = (me + ws - step) % ws;
            // Steps 1 ..= ws - 2 read the buffer after the next step's copy landed in it.
            let src = if (1..ws - 1).contains(&step) { (me + 2 * ws - step - 1) % ws } else { slot };
            plan.consume(&mut parts, slot, &shard(src), &bts, a_scales.as_ref().map(|v| &v[src]), sc.map(|s| s.b.as_slice()));
        }
        let (ag, outs) = plan.finish(parts);
        let outs = outs.iter().map(|t| be.upload(t)).collect::<Result<Vec<_>>>()?;
        Ok(m.s.done((be.upload(&ag)?, outs), "fused_all_gather_matmul"))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<RsMovedimReversed>(
            "wild_rs_movedim_reversed",
            "fused.values",
            "vllm-project/vllm PR #30610 (ROCm/aiter PR #3395): reduce_scatter along dim moves it with movedim(0, dim), not movedim(dim, 0): from dim 2 on the wrong dim is scattered",
            &["fused::matmul_reduce_scatter::dim2::f32::sum::exact::ws2"],
        ),
        spec::<ScaledRsDimNotSwappedBack>(
            "wild_scaled_rs_dim_not_swapped_back",
            "fused.values",
            "pytorch/pytorch PR #153595: fused_scaled_matmul_reduce_scatter with scatter_dim >= 1 reduces with the scatter dim still in front and returns those bytes in the caller's shape",
            &["fused::scaled_matmul_reduce_scatter::dim1::f32::tensor::exact::ws2"],
        ),
        spec::<ScaledRsRowScaleUnsharded>(
            "wild_scaled_rs_row_scale_unsharded",
            "fused.values",
            "pytorch/pytorch #136866: fused_scaled_matmul_reduce_scatter with a row-wise A scale at ws > 1 passes the unchunked scale to each chunk's _scaled_mm: every valid call fails",
            &["fused::scaled_matmul_reduce_scatter::dim0::f32::rows::exact::ws2"],
        ),
        spec::<SymmScratchOutputReused>(
            "wild_symm_scratch_output_reused",
            "fused.buffers",
            "vllm-project/vllm PR #58154: symmetric-memory all_gather / reduce_scatter return a persistent scratch buffer per shape and dtype: a later call overwrites an earlier live result",
            &["fused::low_contention_all_gather::dim0::f32::outputs_kept::ws2"],
        ),
        spec::<MemcpyP2pOverwrittenBeforeRead>(
            "wild_memcpy_p2p_overwritten_before_read",
            "fused.values",
            "openxla/xla PR #20086 (#19555): collective matmul over memcpy p2p: the next step's shard is copied into the receiver's buffer before it consumed the current one (ws >= 3)",
            &["fused::all_gather_matmul::dim0::f32::exact::ws3"],
        ),
    ]
}
