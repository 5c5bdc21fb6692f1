//! Legal variants: backends that differ from shm only where the contract leaves the choice to
//! the backend, each declaring its choice in [`Capabilities`] and keeping it. The catalogue MUST
//! pass every one: a failure here is a suite that fails a correct backend (a false failure), the
//! other half of testing the tests. The mutants show the suites catch what is wrong; these show
//! they accept everything that is right, including the branches of the checks that read a
//! declaration no built-in CPU backend makes (NaN ignored by min / max, integer avg floored,
//! f16 / bf16 sums rounded at every step, aliased outputs computed, declared gaps, a smaller
//! largest world, slow completions). Before them, most of those branches ran only on NCCL, or on
//! nothing.
//!
//! Each variant is a wrapper around the shm backend, like a mutant, run against the whole
//! catalogue by `concord-mutants --legal` (and `cargo xtask mutants`), which fails if any case
//! fails; `mutants/tests/caught.rs` pins each on the cases that read its declaration.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Mutant, Shm};
use concord_core::caps::{AliasPolicy, FusedImpl, Gap};
use concord_core::fused::{self as fu, Gathered, Scaling};
use concord_core::{Backend, Capabilities, CollectiveError, DType, OpKind, ReduceOp, Result, Variant, Work, WorldInfo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Which legal choice a [`Legal`] makes (one type per choice: the catalogue's makers are
/// `fn() -> Box<dyn Bug>`).
const NAN_IGNORE: u8 = 0;
const INT_AVG_FLOOR: u8 = 1;
const ROUND_EVERY_STEP: u8 = 2;
const ALIAS_CORRECT: u8 = 3;
const GAPS: u8 = 4;
const MAX_WS_8: u8 = 5;
const SLOW: u8 = 6;
const NO_CROSS_RANK: u8 = 7;
const NO_SUBGROUPS: u8 = 8;
const NCCL_LIKE: u8 = 9;
const NO_HALF: u8 = 10;
const FUSED_PIPELINED: u8 = 11;
const GAP_FAULT_VEHICLE: u8 = 12;
const GAP_ALL_GATHER_F64: u8 = 13;
const GAP_BROADCAST_IN_PLACE: u8 = 14;

/// The world size [`MAX_WS_8`] declares and keeps.
const SMALL_MAX: usize = 8;

/// One legal variant of the shm backend (see the module doc; `K` picks it).
#[derive(Default)]
pub struct Legal<const K: u8> {
    /// Ops issued on this communicator (the slow variant's schedule).
    seq: AtomicU64,
    /// What this communicator declares, built once (every call's refusal reads it).
    caps: OnceLock<Capabilities>,
}

/// Every legal variant (a [`Spec`] like a mutant's; its rerun line goes through `--legal`).
pub fn catalogue() -> Vec<Spec> {
    let mut v = vec![
        spec::<Legal<NAN_IGNORE>>(
            "legal_nan_ignore",
            "nan_minmax = Ignore",
            "declares NanPolicy::Ignore: float min / max skip NaN inputs (IEEE maxNum, as NCCL does; shm's \
             option nan_minmax=ignore)",
            &["caps::nan_minmax", "caps::gaps_refused", "matrix::all_reduce::out::f32::max", "special"],
        ),
        spec::<Legal<INT_AVG_FLOOR>>(
            "legal_int_avg_floor",
            "int_avg = Floor",
            "declares IntAvg::Floor: a signed integer avg rounds toward negative infinity (shm's \
             option int_avg=floor)",
            &["caps::int_avg", "caps::gaps_refused", "matrix::all_reduce::out::i32::avg"],
        ),
        spec::<Legal<ROUND_EVERY_STEP>>(
            "legal_round_every_step",
            "rounding = Accumulate",
            "declares Rounding::Accumulate: f16 / bf16 sum, avg and premul_sum fold the ranks in rank order in the \
             dtype, rounding at every step (NCCL's ring does it hop by hop; shm's option rounding=every_step)",
            &["f16::sum", "bf16::sum", "f16::avg", "bf16::premul_sum"],
        ),
        spec::<Legal<ALIAS_CORRECT>>(
            "legal_alias_correct",
            "aliasing = Correct",
            "declares AliasPolicy::Correct: an `_out` op whose output overlaps its input reads the input first (a \
             copy), then computes the right result",
            &[
                "caps::aliasing",
                "reuse::aliasing",
                "bad_input::grid::all_gather_into_tensor_out",
                "bad_input::grid::reduce_scatter_tensor_out",
            ],
        ),
        spec::<Legal<GAPS>>(
            "legal_gaps",
            "gaps, fewer dtypes",
            "declares gaps and keeps them: no u16 / u32 / u64, no bitwise reduce ops, no premul_sum, no coalesced \
             reduce_scatter, no permute_tensor; each refused with `unsupported` on every rank",
            &["caps::gaps_refused", "programs::", "permute_tensor", "reduce_scatter_tensor::coalesced"],
        ),
        spec::<Legal<MAX_WS_8>>(
            "legal_max_ws_8",
            "max_world_size = 8",
            "declares max_world_size = 8 and refuses to initialise a larger world (Unsupported)",
            &["ws16"],
        ),
        spec::<Legal<SLOW>>(
            "legal_slow",
            "(nothing: slow)",
            "correct but slow: one call in four returns 1–4 ms after it issued its op, one in thirty-two 25 ms \
             after (a slow host path)",
            &["async", "reuse::", "p2p::"],
        ),
        spec::<Legal<NO_CROSS_RANK>>(
            "legal_no_cross_rank",
            "no cross-rank validation",
            "declares validates_across_ranks = false (it promises no named error for inputs that disagree across \
             ranks: those cases are UNSUPPORTED); computes like shm",
            &["bad_input::all_reduce_shape_mismatch::", "bad_input::grid::all_reduce::ws2"],
        ),
        spec::<Legal<NO_SUBGROUPS>>(
            "legal_no_subgroups",
            "subgroups = false",
            "declares subgroups = false and refuses every new_group with `unsupported` (a backend of one communicator)",
            &["subgroup::", "bad_input::new_group", "p2p::group_and_world"],
        ),
        spec::<Legal<NCCL_LIKE>>(
            "legal_nccl_like",
            "nan, avg, rounding as NCCL",
            "the three reduction choices NCCL makes, at once: NanPolicy::Ignore, IntAvg::Floor, Rounding::Accumulate \
             (shm's nan_minmax=ignore, int_avg=floor, rounding=every_step), and NCCL's same-order rule for communicators \
             (concurrent_communicators = false)",
            &["caps::nan_minmax", "caps::int_avg", "f16::sum", "i32::avg", "communicators_progress_apart", "world_and_group_crossed"],
        ),
        spec::<Legal<NO_HALF>>(
            "legal_no_half",
            "no f16 / bf16",
            "declares no f16 and no bf16 at all (a host backend without half types); refuses every call on them \
             with `unsupported`",
            &["f16", "bf16", "caps::gaps_refused"],
        ),
        spec::<Legal<FUSED_PIPELINED>>(
            "legal_fused_pipelined",
            "fused = Pipelined",
            "declares FusedImpl::Pipelined: its own fused_all_gather_matmul, a ring of sends and receives whose \
             shards are multiplied as they land (its own first, then the left neighbour's, ...), not one all_gather \
             then the product",
            &["fused::all_gather_matmul"],
        ),
        spec::<Legal<GAP_FAULT_VEHICLE>>(
            "legal_gap_fault_vehicle",
            "gap: all_reduce out f32 sum",
            "declares one narrow gap, exactly all_reduce / out of place / f32 / sum (the most common call there is), \
             and refuses it with `unsupported` on every rank; every other all_reduce as shm",
            &["all_reduce::out::f32::sum", "bad_input::", "autotune::", "state::", "reuse::", "p2p::", "async::"],
        ),
        spec::<Legal<GAP_ALL_GATHER_F64>>(
            "legal_gap_all_gather_f64",
            "gap: all_gather f64",
            "declares one narrow gap, all_gather_into_tensor on f64 (every variant), and refuses it with `unsupported` \
             on every rank; every other dtype as shm",
            &["all_gather_into_tensor", "f64", "bad_input::"],
        ),
        spec::<Legal<GAP_BROADCAST_IN_PLACE>>(
            "legal_gap_broadcast_in_place",
            "gap: broadcast in place",
            "declares one narrow gap, in-place broadcast (every dtype), and refuses it with `unsupported` on every rank; \
             out-of-place broadcast as shm",
            &["broadcast::in_place", "bad_input::", "state::", "reuse::"],
        ),
    ];
    v.extend(crate::legal_review::catalogue());
    v.extend(crate::legal3::catalogue());
    v.into_iter()
        .map(|mut s| {
            s.entry = s.entry.with_rerun(format!("cargo xtask mutants --legal --mutant {} --case", s.name));
            s
        })
        .collect()
}

/// `K`'s declared choice over shm's (the reduction semantics are shm's own options, declared
/// by shm itself: [`option`]).
fn declared<const K: u8>(s: &Shm) -> Capabilities {
    let mut c = s.inner.capabilities();
    match K {
        ALIAS_CORRECT => c.aliasing = AliasPolicy::Correct,
        GAPS => {
            c.dtypes.retain(|d| !matches!(d, DType::U16 | DType::U32 | DType::U64));
            for r in ["band", "bor", "bxor", "premul_sum"] {
                c.gaps.push(Gap::reduce(r, "legal_gaps: no bitwise reduce ops, no premul_sum"));
            }
            c.gaps.push(Gap::op_variant(OpKind::ReduceScatterTensor, Variant::Coalesced, "legal_gaps: no coalesced reduce_scatter"));
            c.gaps.push(Gap::op(OpKind::PermuteTensor, "legal_gaps: no permute_tensor"));
        }
        MAX_WS_8 => c.max_world_size = c.max_world_size.min(SMALL_MAX),
        NO_CROSS_RANK => c.validates_across_ranks = false,
        NO_SUBGROUPS => c.subgroups = false,
        // NCCL's rule for communicators used concurrently (review21 finding 4).
        NCCL_LIKE => c.concurrent_communicators = false,
        NO_HALF => c.dtypes.retain(|d| !matches!(d, DType::F16 | DType::BF16)),
        FUSED_PIPELINED => c.fused = FusedImpl::Pipelined,
        GAP_FAULT_VEHICLE => c.gaps.push(Gap {
            op: Some(OpKind::AllReduce),
            variant: Some(Variant::Out),
            dtype: Some(DType::F32),
            reduce: Some("sum".into()),
            reason: "legal_gap_fault_vehicle: no out-of-place f32 sum all_reduce".into(),
        }),
        GAP_ALL_GATHER_F64 => c.gaps.push(Gap {
            op: Some(OpKind::AllGatherIntoTensor),
            variant: None,
            dtype: Some(DType::F64),
            reduce: None,
            reason: "legal_gap_all_gather_f64: no f64 all_gather".into(),
        }),
        GAP_BROADCAST_IN_PLACE => {
            c.gaps.push(Gap::op_variant(OpKind::Broadcast, Variant::InPlace, "legal_gap_broadcast_in_place: no in-place broadcast"))
        }
        _ => {}
    }
    c
}

/// The shm options that make `K`'s reduction semantics (shm computes and declares them).
const fn options(k: u8) -> &'static [(&'static str, &'static str)] {
    match k {
        NAN_IGNORE => &[("nan_minmax", "ignore")],
        INT_AVG_FLOOR => &[("int_avg", "floor")],
        ROUND_EVERY_STEP => &[("rounding", "every_step")],
        NCCL_LIKE => &[("nan_minmax", "ignore"), ("int_avg", "floor"), ("rounding", "every_step")],
        _ => &[],
    }
}

impl<const K: u8> Legal<K> {
    /// What `K` declares on this communicator ([`declared`], built on first use).
    fn caps(&self, s: &Shm) -> &Capabilities {
        self.caps.get_or_init(|| declared::<K>(s))
    }
}

/// Refuses a call its variant declares unsupported (`Unsupported`, the same on every rank: the
/// declaration is the same everywhere).
fn refuse<const K: u8>(l: &Legal<K>, s: &Shm, op: OpKind, variant: Variant, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
    l.caps(s).check(op, Some(variant), Some(dtype), reduce, s.ws()).map_err(CollectiveError::Unsupported)
}

/// The byte range of `b` in memory.
fn span(s: &Shm, b: &Buf) -> (usize, usize) {
    let start = s.inner.buffer_addr(b);
    (start, start + s.numel(b) * s.inner.buffer_dtype(b).size())
}

/// `x` itself, or (when it overlaps `out`) a copy of it read before the op: what a backend that
/// computes aliased outputs correctly does.
fn unaliased(s: &Shm, x: &Buf, out: &Buf) -> Result<Buf> {
    let ((a0, a1), (b0, b1)) = (span(s, x), span(s, out));
    if a0 < b1 && b0 < a1 {
        s.inner.upload(&s.inner.download(x)?)
    } else {
        Ok(x.clone())
    }
}

/// [`FUSED_PIPELINED`]'s `fused_all_gather_matmul`: validated like the decomposition, then a
/// ring all-gather of `a` by send / recv (each step: send the shard last landed to the right
/// neighbour, receive the next from the left one), each shard multiplied as it lands, this
/// rank's own first. Exact the same: each output block is one shard's product, whatever the order.
fn ring_all_gather_matmul(m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, scaling: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
    let (ws, me) = (m.world_size(), m.rank());
    if ws == 1 {
        return fu::decomposed_all_gather_matmul(m, a, bs, dim, scaling);
    }
    // Recorded under the op called while it runs, beside its sends / receives (clause
    // `progress.recorded`; review11: a native fused op blocked on an absent peer must say so).
    let op = if scaling.is_some() { "fused_all_gather_scaled_matmul" } else { "fused_all_gather_matmul" };
    let _recorded = concord_core::progress::record(m.name(), op);
    let ins = fu::input_descs(m, a, bs);
    let d = fu::describe(concord_core::CallOp::FusedAllGatherMatmul, me, ins.clone(), None, dim, scaling);
    fu::exchange_and_validate(m, &d)?;
    let a_scales = scaling.map(|s| fu::gather_row_scales(m, &s.a)).transpose()?;
    let btensors = bs.iter().map(|x| m.download(x)).collect::<Result<Vec<_>>>()?;
    let plan = fu::AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, scaling);
    let mut parts = plan.start();
    let consume = |parts: &mut fu::AgMatmulParts, r: usize, shard: &concord_core::Tensor| {
        plan.consume(parts, r, shard, &btensors, a_scales.as_ref().map(|s| &s[r]), scaling.map(|s| s.b.as_slice()))
    };
    consume(&mut parts, me, &m.download(a)?);
    let (next, prev) = ((me + 1) % ws, (me + ws - 1) % ws);
    let mut cur = a.clone();
    let mut last = None;
    for step in 1..ws {
        let out = m.alloc(ins[0].dtype, &ins[0].shape)?;
        let sent = m.send(&cur, next)?;
        let recvd = m.recv(&out, prev)?;
        let got = recvd.wait(fu::DECOMPOSITION_WAIT)?.clone();
        sent.wait(fu::DECOMPOSITION_WAIT)?;
        consume(&mut parts, (me + ws - step) % ws, &m.download(&got)?);
        cur = got;
        last = Some(recvd);
    }
    let (ag, outs) = plan.finish(parts);
    let ag = m.upload(&ag)?;
    let outs = outs.iter().map(|t| m.upload(t)).collect::<Result<Vec<_>>>()?;
    let last = last.ok_or_else(|| CollectiveError::Backend("legal_fused_pipelined: no ring step at ws > 1".into()))?;
    Ok(last.counted_again((ag, outs)))
}

impl<const K: u8> Legal<K> {
    /// The slow variant's work, handed back late on a fixed schedule of op numbers (the op is
    /// already in flight: only the call returns late).
    fn late<T>(&self, w: Work<T>) -> Work<T> {
        if K != SLOW {
            return w;
        }
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let delay = match n % 32 {
            7 => Duration::from_millis(25),
            k if k % 4 == 1 => Duration::from_millis(1 + (k / 4) % 4),
            _ => return w,
        };
        std::thread::sleep(delay);
        w
    }
}

impl<const K: u8> Bug for Legal<K> {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if !options(K).is_empty() {
            let mut w = world.clone();
            for (key, value) in options(K) {
                w.options.retain(|(k, _)| k != key);
                w.options.push(((*key).into(), (*value).into()));
            }
            return Ok(w);
        }
        if K == MAX_WS_8 && world.world_size > SMALL_MAX {
            return Err(CollectiveError::Unsupported(format!(
                "legal_max_ws_8: worlds of up to {SMALL_MAX} ranks (this one has {})",
                world.world_size
            )));
        }
        Ok(world.clone())
    }
    fn capabilities(&self, s: &Shm) -> Capabilities {
        self.caps(s).clone()
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::AllReduce, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::AllReduce, Variant::InPlace, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s.inner.all_reduce_(x, op)?))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(self, s, OpKind::AllReduce, Variant::Coalesced, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(self, s, OpKind::AllReduce, Variant::CoalescedInPlace, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s.inner.all_reduce_coalesced_(xs, op)?))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::AllGatherIntoTensor, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.all_gather_into_tensor(x)?))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::AllGatherIntoTensor, Variant::OutBuf, s.inner.buffer_dtype(x), None)?;
        if K == GAP_ALL_GATHER_F64 {
            // A call that carries the gapped dtype anywhere (here: its output) is the gap, as the
            // bad-input grid reads a declaration (every dtype a call carries).
            refuse::<K>(self, s, OpKind::AllGatherIntoTensor, Variant::OutBuf, s.inner.buffer_dtype(out), None)?;
        }
        let x = if K == ALIAS_CORRECT { unaliased(s, x, out)? } else { x.clone() };
        Ok(self.late(s.inner.all_gather_into_tensor_out(&x, out)?))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(self, s, OpKind::AllGatherIntoTensor, Variant::Coalesced, s.inner.buffer_dtype(x), None)?;
        }
        Ok(self.late(s.inner.all_gather_into_tensor_coalesced(xs)?))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::ReduceScatterTensor, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s.inner.reduce_scatter_tensor(x, op)?))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::ReduceScatterTensor, Variant::OutBuf, s.inner.buffer_dtype(x), Some(op))?;
        let x = if K == ALIAS_CORRECT { unaliased(s, x, out)? } else { x.clone() };
        Ok(self.late(s.inner.reduce_scatter_tensor_out(&x, op, out)?))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(self, s, OpKind::ReduceScatterTensor, Variant::Coalesced, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::AllToAllSingle, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.all_to_all_single(x, o, i)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::Broadcast, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.broadcast(x, src)?))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::Broadcast, Variant::InPlace, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.broadcast_(x, src)?))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::PermuteTensor, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.permute_tensor(x, src_dst)?))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::Reduce, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s.inner.reduce(x, op, root)?))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::Gather, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.gather(x, root)?))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::Scatter, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.scatter(x, root)?))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        refuse::<K>(self, s, OpKind::SendRecv, Variant::OutBuf, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(self, s, OpKind::SendRecv, Variant::OutBuf, s.inner.buffer_dtype(out), None)?;
        Ok(self.late(s.inner.recv(out, src)?))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(self.late(s.inner.barrier()?))
    }
    fn fused_all_gather_matmul(
        &self,
        m: &Mutant,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Gathered<Buf>>> {
        if K == FUSED_PIPELINED {
            return ring_all_gather_matmul(m, a, bs, dim, scaling);
        }
        fu::decomposed_all_gather_matmul(m, a, bs, dim, scaling)
    }
    fn refuse_group(&self, _s: &Shm, _ranks: &[usize]) -> Result<()> {
        if K == NO_SUBGROUPS {
            return Err(CollectiveError::Unsupported("legal_no_subgroups: one communicator only (declares subgroups = false)".into()));
        }
        Ok(())
    }
}
