//! The twenty-sixth hunt: bugs from the wild in the vendor collective libraries themselves
//! (RCCL, Meta's NCCLX fork of NCCL, Apple's MLX distributed backends, BAAI's FlagCX, Xilinx /
//! AMD ACCL) and in XLA:GPU's lowering of collectives. Each ports a correctness bug that shipped,
//! found in the project's issue or pull-request thread named on its type, with the original's
//! trigger (dtype, reduce op, collective, world size, rank position, NaN placement, permutation
//! shape, call history) as far as the `Backend` trait lets a wrapper over shm reproduce it.

use crate::campaign::{spec, Spec};
use crate::{edit, lock, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};
use std::sync::Mutex;

/// `x`'s shape with dim 0 divided by `ws` (the reduce_scatter result), `None` for a 0-dim
/// input (the correct op refuses it; the bug then leaves the call alone).
fn scattered_shape(s: &Shm, x: &Buf) -> Option<Vec<usize>> {
    let mut shape = s.inner.buffer_shape(x);
    let d0 = shape.first_mut()?;
    *d0 /= s.ws().max(1);
    Some(shape)
}

// ---------------------------------------------------------------- ROCm/rccl PR #2139

/// RCCL's bf16 min / max (ROCm/rccl PR #2139 "fix bug in reduce kernel bfloat16 for ROCm >=
/// 6.0", cherry-picked for ROCm 7.2.1 as PR #2147): the `SPECIALIZE_REDUCE(FuncMinMax,
/// hip_bfloat16, ...)` line sat behind `#elif ROCM_VERSION < 60000`, so on ROCm 6 and later bf16
/// min / max fell into the generic `Apply_Reduce<FuncMinMax<T>>`, which compares the raw bits
/// as an unsigned integer, `(a ^ xormask) < (b ^ xormask) ? a : b` (xormask 0 for min, all ones
/// for max; the sign-bit flip is only set for signed integer types). Every negative bf16 then
/// compares above every positive one, and a larger negative magnitude above a smaller one:
/// `max(-1, 2) = -1`, `min(-1, -2) = -1`. Sum and prod were right (hip_bfloat16's operators).
/// Here every reduction of bf16 with `min` / `max` (all_reduce, reduce_scatter, reduce) runs on
/// the inputs' bits as u16 and gives back the winning bits as bf16.
#[derive(Default)]
pub struct RcclBf16MinMaxBitwise;

impl RcclBf16MinMaxBitwise {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        s.inner.buffer_dtype(x) == DType::BF16 && matches!(op, ReduceOp::Min | ReduceOp::Max)
    }

    /// `x`'s bits as a new u16 buffer.
    fn as_bits(s: &Shm, x: &Buf) -> Result<Buf> {
        let t = s.inner.download(x)?;
        s.inner.upload(&Tensor::from_bytes(DType::U16, t.shape(), t.bytes()))
    }

    /// Runs `issue` on `x`'s bits (u16, the generic integer kernel) and writes the result's bits
    /// into `target` as bf16 once it completed.
    fn on_bits(s: &Shm, x: &Buf, target: Buf, issue: impl FnOnce(&Buf) -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let w = issue(&Self::as_bits(s, x)?)?;
        Ok(s.then_as(w, target.clone(), move |be, res| {
            let r = be.download(res)?;
            be.write(&target, &Tensor::from_bytes(DType::BF16, &be.buffer_shape(&target), r.bytes()))
        }))
    }
}

impl Bug for RcclBf16MinMaxBitwise {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.all_reduce(x, op);
        }
        let out = s.inner.alloc(DType::BF16, &s.inner.buffer_shape(x))?;
        Self::on_bits(s, x, out, |b| s.inner.all_reduce(b, op))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.all_reduce_(x, op);
        }
        Self::on_bits(s, x, x.clone(), |b| s.inner.all_reduce_(b, op))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let shape = scattered_shape(s, x);
        match shape {
            Some(shape) if Self::fires(s, x, op) => {
                let out = s.inner.alloc(DType::BF16, &shape)?;
                Self::on_bits(s, x, out, |b| s.inner.reduce_scatter_tensor(b, op))
            }
            _ => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) || s.inner.buffer_dtype(out) != DType::BF16 {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        // The bits land in a u16 buffer of the caller's output shape (so the call is refused as
        // the caller's would be), then in the caller's buffer.
        let bits_out = s.inner.alloc(DType::U16, &s.inner.buffer_shape(out))?;
        Self::on_bits(s, x, out.clone(), |b| s.inner.reduce_scatter_tensor_out(b, op, &bits_out))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.reduce(x, op, root);
        }
        let out = s.inner.alloc(DType::BF16, &s.inner.buffer_shape(x))?;
        Self::on_bits(s, x, out, |b| s.inner.reduce(b, op, root))
    }
}

// ---------------------------------------------------------------- ml-explore/mlx #4072

/// MLX's distributed `all_min` / `all_max` (ml-explore/mlx #4072 "`mx.distributed.all_max` /
/// `all_min` silently drop `NaN`"): both the ring and the JACCL backends combine with a bare
/// C++ comparison, `out = (out < in) ? out : in` (`std::min` is the same), which returns the
/// *incoming* operand whenever the comparison is false, and every comparison with a NaN is
/// false: an accumulated NaN is dropped by the next rank's value, a NaN arriving from a later
/// rank replaces the accumulator. The answer depends on which rank holds the NaN: two ranks,
/// NaN on rank 0 gives 5, on rank 1 gives NaN; four ranks contributing 1, NaN, 3, 4 give
/// `all_min = 3` (neither NaN nor the minimum). The same comparison also takes the incoming
/// zero on a `-0` / `+0` tie. Here a float `min` / `max` all_reduce (either variant) folds the
/// ranks' inputs in rank order with that comparison.
#[derive(Default)]
pub struct MlxMinMaxNanOrder;

impl MlxMinMaxNanOrder {
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let fires = matches!(op, ReduceOp::Min | ReduceOp::Max) && dtype.is_float() && s.ws() >= 2;
        let ws = s.ws();
        let issue = || if in_place { s.inner.all_reduce_(x, op) } else { s.inner.all_reduce(x, op) };
        // Every call gathers, whatever the bug decides, so every rank issues the same ops.
        crate::then_gathered(
            s,
            s.inner.all_gather_into_tensor(x)?,
            |g| g,
            issue,
            |b: &Buf| Some(b),
            move |all, t| {
                if !fires {
                    return;
                }
                let n = t.numel();
                for i in 0..n {
                    let mut acc = all.get_f64(i);
                    for q in 1..ws {
                        let incoming = all.get_f64(q * n + i);
                        let keep = if op == ReduceOp::Min { acc < incoming } else { acc > incoming };
                        if !keep {
                            acc = incoming;
                        }
                    }
                    set_f64(t, i, acc);
                }
            },
        )
    }
}

impl Bug for MlxMinMaxNanOrder {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #690

/// NCCLX's PAT reduce_scatter `avg` of int8 (meta-pytorch/torchcomms PR #690 "Fix signed
/// division for small integer types in FuncPatSumPostDiv"): NCCL maps `ncclInt8` to `uint8_t`
/// in its kernels (`equivalent_primary`), and the PAT algorithm's post-division widened that
/// `uint8_t` straight to `int32_t`: a zero-extension, so the wrapped sum `-20` (bits `0xec`)
/// was divided as `236`, giving `118` on two ranks instead of `-10`. Non-negative sums are
/// right. PAT runs reduce_scatter (and all_gather, which does not divide). Here an int8 `avg`
/// reduce_scatter (either variant) sums (wrapping, as the contract does), then divides each
/// element's bits as an unsigned byte by the world size, truncating.
#[derive(Default)]
pub struct NcclxPatInt8AvgZeroExtend;

impl NcclxPatInt8AvgZeroExtend {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Avg && s.inner.buffer_dtype(x) == DType::I8 && s.ws() >= 2
    }
    fn divide(ws: usize) -> impl FnOnce(&concord_shm::ShmBackend, &Buf) -> Result<()> + Send + 'static {
        move |be, r| {
            edit(be, r, |t| {
                for b in t.bytes_mut() {
                    *b = (i32::from(*b) / ws as i32) as u8;
                }
            })
        }
    }
}

impl Bug for NcclxPatInt8AvgZeroExtend {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        Ok(s.then(s.inner.reduce_scatter_tensor(x, ReduceOp::Sum)?, Self::divide(s.ws())))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        Ok(s.then(s.inner.reduce_scatter_tensor_out(x, ReduceOp::Sum, out)?, Self::divide(s.ws())))
    }
}

// ---------------------------------------------------------------- ROCm/rocm-systems PR #10322

/// RCCL's Direct ReduceScatter on `avg` (ROCm/rocm-systems PR #10322 "fix(rccl): keep Direct
/// ReduceScatter off avg"): `rcclSelectReduceScatter` picked the direct algorithm for every op,
/// but its local reduce is an unscaled N-way sum, and `avg` (PreMulSum by `1/nRanks` for
/// floats) and a user PreMulSum need the scaling: "the result was the sum rather than the mean
/// and every element was wrong whenever DRS was eligible"; sum / prod / min / max were right.
/// Here a reduce_scatter (either variant) with `avg` or `premul_sum` on two or more ranks
/// returns the plain sum.
#[derive(Default)]
pub struct RcclDirectReduceScatterAvgUnscaled;

impl RcclDirectReduceScatterAvgUnscaled {
    /// The op the direct algorithm really applies (one rank runs NCCL's one-rank kernel, never
    /// the direct algorithm).
    fn op(s: &Shm, op: ReduceOp) -> ReduceOp {
        match op {
            ReduceOp::Avg | ReduceOp::PremulSum(_) if s.ws() >= 2 => ReduceOp::Sum,
            other => other,
        }
    }
}

impl Bug for RcclDirectReduceScatterAvgUnscaled {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, Self::op(s, op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, Self::op(s, op), out)
    }
}

// ---------------------------------------------------------------- flagos-ai/FlagCX #619

/// FlagCX's gather across a cluster split (flagos-ai/FlagCX #619 "Heterogeneous Gather
/// (FLAGCX_CLUSTER_SPLIT_LIST=2) drops data from the second cluster split"): with the
/// communicator split into two clusters (ranks 0–3 / 4–7 of 8), `flagcxGather` to root 0
/// delivers only the first cluster's blocks; the other cluster's blocks come back all zero, with
/// no error (all_gather, reduce_scatter, broadcast, scatter ... were right). Here the world is
/// split into two halves (`q * 2 / ws`), and a gather's root gets zeros in the blocks of the
/// ranks outside its own half.
#[derive(Default)]
pub struct FlagcxGatherOtherClusterZero;

impl Bug for FlagcxGatherOtherClusterZero {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.gather(x, root)?;
        let ws = s.ws();
        if ws < 2 || s.rank() != root || root >= ws {
            return Ok(w);
        }
        let block = s.numel(x) * s.inner.buffer_dtype(x).size();
        let cluster = move |q: usize| q * 2 / ws;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for q in (0..ws).filter(|&q| cluster(q) != cluster(root)) {
                    t.bytes_mut()[q * block..(q + 1) * block].fill(0);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- openxla/xla #45222

/// XLA:GPU's collective-permute cycle decomposer (openxla/xla #45222 "collective-permute cycle
/// decomposer miscompiles permutes with more than one cycle", fix proposed in PR #46248):
/// `GetCycleTypeAndIndices` calls the permute a forward cycle when most pairs go up (else a
/// backward one) and returns one back edge per cycle (a pair going the other way whose far end
/// is reached by a pair going the main way); `DecomposeCollectivePermuteCycle` moves the back
/// edges to one collective-permute, the rest to another, and picks each device's result with
/// `select(id == bwd_recv_id, back_cp, fwd_cp)`, where `bwd_recv_id = back_pairs.back().second`
/// is the target of the *last* back edge only. With two or more cycles, every other back edge's
/// target takes the forward permute's result, where it is no target: zeros. The pass's own test
/// `{0→2, 2→4, 4→6, 6→0, 1→3, 3→5, 5→7, 7→1}` zeroed device 0. Here `permute_tensor(x,
/// src_dst)` is that permute with the pairs `(r, src_dst[r])` in rank order (the pass's byte
/// threshold at 0): a rank that is the target of a back edge other than the last gets zeros.
#[derive(Default)]
pub struct XlaPermuteCycleLastBackEdge;

impl XlaPermuteCycleLastBackEdge {
    /// The ranks the decomposed permute leaves with zeros (`GetCycleTypeAndIndices`, then every
    /// back-edge target but the last), for the pairs `(i, src_dst[i])`.
    pub fn zeroed(src_dst: &[usize]) -> Vec<usize> {
        let pairs: Vec<(usize, usize)> = src_dst.iter().copied().enumerate().collect();
        if pairs.len() < 2 {
            return Vec::new();
        }
        let forward = pairs.iter().filter(|(a, b)| a < b).count() > pairs.iter().filter(|(a, b)| a >= b).count();
        let mut seen = std::collections::BTreeSet::new();
        let mut tentative = std::collections::BTreeSet::new();
        for (i, &(a, b)) in pairs.iter().enumerate() {
            match (forward, a < b, a > b) {
                (true, true, _) => {
                    seen.insert(a);
                }
                (true, false, _) => {
                    tentative.insert((b, i));
                }
                (false, _, true) => {
                    seen.insert(b);
                }
                (false, _, false) => {
                    tentative.insert((a, i));
                }
            }
        }
        let back: std::collections::BTreeSet<usize> = tentative.into_iter().filter(|(id, _)| seen.contains(id)).map(|(_, i)| i).collect();
        let Some(&last) = back.iter().next_back() else { return Vec::new() };
        let bwd_recv_id = pairs[last].1;
        back.iter().map(|&i| pairs[i].1).filter(|&t| t != bwd_recv_id).collect()
    }
}

impl Bug for XlaPermuteCycleLastBackEdge {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let w = s.inner.permute_tensor(x, src_dst)?;
        let ws = s.ws();
        let mut sorted = src_dst.to_vec();
        sorted.sort_unstable();
        let is_permutation = src_dst.len() == ws && sorted.iter().enumerate().all(|(i, &t)| i == t);
        if !is_permutation || !Self::zeroed(src_dst).contains(&s.rank()) {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0))))
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #3213

/// NCCLX's NVLink device barrier at a non-power-of-two rank count (meta-pytorch/torchcomms PR
/// #3213 "Fix NVL barrier for non-power-of-2 rank counts"): the barrier was a recursive doubling
/// (butterfly) whose step `k` pairs rank `r` with `r ^ 2^k` and silently skipped a peer `>=
/// nranks`, dropping synchronisation edges: at 6 local ranks, ranks 2 and 3 never synchronised
/// with ranks 4 and 5 and could leave the barrier before them. The barrier backs AllGatherP
/// (the CE broadcast), so a rank could read a peer's buffer from the wrong iteration: "flaky
/// wrong-iteration reads in AllGatherP at nLocalRanks=6". Here the race is always lost: at a
/// non-power-of-two world size, an all_gather (either variant) gives rank `r`, in the block of
/// every rank whose arrival its barrier never learned of, that rank's input to its *previous*
/// all_gather of the same dtype and shape on the communicator (its current one when there was
/// none: a first call has no earlier iteration to read).
#[derive(Default)]
pub struct NcclxNvlBarrierSkipsPeers {
    /// This rank's input to its last all_gather on the communicator.
    last: Mutex<Option<Tensor>>,
}

impl NcclxNvlBarrierSkipsPeers {
    /// Whose arrival each rank has learned of when the butterfly barrier that skips peers `>=
    /// ws` ends: `known(ws)[r][q]`.
    pub fn known(ws: usize) -> Vec<Vec<bool>> {
        let mut k: Vec<Vec<bool>> = (0..ws).map(|r| (0..ws).map(|q| q == r).collect()).collect();
        let mut dist = 1;
        while dist < ws {
            let before = k.clone();
            for (r, row) in k.iter_mut().enumerate() {
                let peer = r ^ dist;
                if peer < ws {
                    for (q, seen) in row.iter_mut().enumerate() {
                        *seen |= before[peer][q];
                    }
                }
            }
            dist <<= 1;
        }
        k
    }

    fn issue(&self, s: &Shm, x: &Buf, real: impl FnOnce() -> Result<Work<Buf>>) -> Result<Work<Buf>> {
        let ws = s.ws();
        if ws < 3 || ws.is_power_of_two() {
            return real();
        }
        let cur = s.inner.download(x)?;
        let prev = lock(&self.last).replace(cur.clone());
        let staged = prev.filter(|p| p.dtype() == cur.dtype() && p.shape() == cur.shape()).unwrap_or(cur);
        let known = Self::known(ws).swap_remove(s.rank());
        let block = staged.len_bytes();
        // Every rank gathers the staged (previous) inputs beside the real call.
        let stale = s.inner.all_gather_into_tensor(&s.inner.upload(&staged)?)?;
        crate::then_gathered(
            s,
            stale,
            |g| g,
            real,
            |b: &Buf| Some(b),
            move |all, t| {
                for q in (0..ws).filter(|&q| !known[q]) {
                    crate::copy_bytes(t, q * block, all, q * block, block);
                }
            },
        )
    }
}

impl Bug for NcclxNvlBarrierSkipsPeers {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        self.issue(s, x, || s.inner.all_gather_into_tensor(x))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.issue(s, x, || s.inner.all_gather_into_tensor_out(x, out))
    }
}

// ---------------------------------------------------------------- Xilinx/ACCL #25, PR #37

/// ACCL's reduce_scatter chunk order (Xilinx/ACCL #25 "Unintuitive result order of
/// reduce_scatter operation", fixed by PR #37 "Fixed chunk offset in reduce-scatter": "rank _i_
/// will receive the index (_i_ + 1) % _n_"): the ring reduce-scatter ends with each rank holding
/// the chunk its ring step finished on, one past its own, and ACCL returned that chunk instead of
/// scattering chunk `i` to rank `i` as MPI (and every framework above it) expects. Here a
/// reduce_scatter (either variant) gives rank `i` the reduced chunk `(i + 1) % ws`: each rank
/// hands the real reduce_scatter its input rotated by one chunk.
#[derive(Default)]
pub struct AcclReduceScatterNextChunk;

impl AcclReduceScatterNextChunk {
    /// `x` rotated by one chunk along dim 0 (chunk `j` holds chunk `j + 1`), `None` where the
    /// real call refuses it or rotating changes nothing.
    fn rotated(s: &Shm, x: &Buf) -> Result<Option<Buf>> {
        let ws = s.ws();
        let shape = s.inner.buffer_shape(x);
        let Some(&d0) = shape.first() else { return Ok(None) };
        if ws < 2 || d0 == 0 || d0 % ws != 0 {
            return Ok(None);
        }
        let t = s.inner.download(x)?;
        let chunk = t.len_bytes() / ws;
        let mut r = t.clone();
        r.bytes_mut().rotate_left(chunk);
        Ok(Some(s.inner.upload(&r)?))
    }
}

impl Bug for AcclReduceScatterNextChunk {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::rotated(s, x)? {
            Some(r) => s.inner.reduce_scatter_tensor(&r, op),
            None => s.inner.reduce_scatter_tensor(x, op),
        }
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        match Self::rotated(s, x)? {
            Some(r) => s.inner.reduce_scatter_tensor_out(&r, op, out),
            None => s.inner.reduce_scatter_tensor_out(x, op, out),
        }
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #3213 (AllToAllP)

/// The same NCCLX barrier (meta-pytorch/torchcomms PR #3213), on the other collective the PR
/// names: the skipping butterfly also backs `nvlCeAllToAll` (AllToAllP, the persistent
/// all-to-all of equal per-peer counts), so a rank could read a peer's send buffer from the wrong
/// iteration there too. Here, at a non-power-of-two world size, an equal-split
/// `all_to_all_single` gives rank `r`, in the block from every rank its barrier never learned of
/// ([`NcclxNvlBarrierSkipsPeers::known`]), the block that rank sent it in its *previous* equal
/// all_to_all of the same dtype and shape (its current one when there was none). Each call runs
/// the real op beside the same op on each rank's previous input, so both are refused alike.
#[derive(Default)]
pub struct NcclxNvlBarrierAllToAllStale {
    /// This rank's input to its last equal-split all_to_all on the communicator.
    last: Mutex<Option<Tensor>>,
}

impl Bug for NcclxNvlBarrierAllToAllStale {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let ws = s.ws();
        if ws < 3 || ws.is_power_of_two() {
            return s.inner.all_to_all_single(x, o, i);
        }
        let equal = o.is_none() && i.is_none();
        let cur = s.inner.download(x)?;
        let prev = if equal { lock(&self.last).replace(cur.clone()) } else { None };
        let staged = prev.filter(|p| p.dtype() == cur.dtype() && p.shape() == cur.shape()).unwrap_or(cur);
        let known = NcclxNvlBarrierSkipsPeers::known(ws).swap_remove(s.rank());
        let stale = s.inner.all_to_all_single(&s.inner.upload(&staged)?, o, i)?;
        crate::then_gathered(
            s,
            stale,
            |g| g,
            || s.inner.all_to_all_single(x, o, i),
            |b: &Buf| Some(b),
            move |old, t| {
                if !equal || t.len_bytes() % ws != 0 {
                    return;
                }
                let block = t.len_bytes() / ws;
                for q in (0..ws).filter(|&q| !known[q]) {
                    crate::copy_bytes(t, q * block, old, q * block, block);
                }
            },
        )
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<RcclBf16MinMaxBitwise>(
            "wild_rccl_bf16_minmax_bitwise",
            "values.reduce",
            "ROCm/rccl PR #2139 (#2147): bf16 min / max compare the raw bits as unsigned integers (negatives above positives)",
            &["all_reduce::out::bf16::max::ws2"],
        ),
        spec::<MlxMinMaxNanOrder>(
            "wild_mlx_minmax_nan_order",
            "numerics.subnormal",
            "ml-explore/mlx #4072: float min / max all_reduce folds the ranks in order with `(acc < in) ? acc : in`: a NaN is kept or dropped by its rank position",
            &["all_reduce::out::f32::max::ws2::special"],
        ),
        spec::<NcclxPatInt8AvgZeroExtend>(
            "wild_ncclx_pat_int8_avg_zero_extend",
            "values.reduce",
            "meta-pytorch/torchcomms PR #690: int8 avg reduce_scatter divides the wrapped sum as an unsigned byte (zero-extended)",
            &["reduce_scatter_tensor::out::i8::avg::ws2"],
        ),
        spec::<RcclDirectReduceScatterAvgUnscaled>(
            "wild_rccl_drs_avg_unscaled",
            "values.reduce",
            "ROCm/rocm-systems PR #10322: reduce_scatter avg / premul_sum returns the unscaled sum (Direct ReduceScatter selected for scaled ops)",
            &["reduce_scatter_tensor::out::f32::avg::ws2"],
        ),
        spec::<FlagcxGatherOtherClusterZero>(
            "wild_flagcx_gather_other_cluster_zero",
            "values.move",
            "flagos-ai/FlagCX #619: gather's root gets zeros in the blocks of the ranks outside its half of the world (a two-cluster split)",
            &["gather::out::f32::ws2"],
        ),
        spec::<XlaPermuteCycleLastBackEdge>(
            "wild_xla_permute_cycle_last_back_edge",
            "values.move",
            "openxla/xla #45222: a permute of two or more cycles, decomposed into back / forward permutes, selects the back one only on the last back edge's target (the other back-edge targets get zeros)",
            &["permute_tensor::out::f32::ws4::perm_reversed"],
        ),
        spec::<NcclxNvlBarrierSkipsPeers>(
            "wild_ncclx_nvl_barrier_skips_peers",
            "values.world_sizes",
            "meta-pytorch/torchcomms PR #3213: at a non-power-of-two world size the butterfly barrier skips peers, and an all_gather reads the blocks of ranks it never synchronised with from their previous all_gather",
            &["reuse::world_and_group_in_flight::all_gather_into_tensor::out::ws3"],
        ),
        spec::<NcclxNvlBarrierAllToAllStale>(
            "wild_ncclx_nvl_barrier_alltoall_stale",
            "values.world_sizes",
            "meta-pytorch/torchcomms PR #3213 (AllToAllP): at a non-power-of-two world size an equal-split all_to_all reads the blocks of ranks its barrier never synchronised with from their previous all_to_all",
            &["realloc::all_to_all_single::out::ws3"],
        ),
        spec::<AcclReduceScatterNextChunk>(
            "wild_accl_reduce_scatter_next_chunk",
            "values.reduce",
            "Xilinx/ACCL #25, PR #37: reduce_scatter gives rank i the reduced chunk (i + 1) % ws (the ring's last chunk)",
            &["reduce_scatter_tensor::out::f32::sum::ws2"],
        ),
    ]
}
