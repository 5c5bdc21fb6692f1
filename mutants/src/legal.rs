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
use crate::{Buf, Bug, Shm};
use concord_core::caps::{AliasPolicy, Gap};
use concord_core::{Backend, Capabilities, CollectiveError, DType, OpKind, ReduceOp, Result, Variant, Work, WorldInfo};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The world size [`MAX_WS_8`] declares and keeps.
const SMALL_MAX: usize = 8;

/// One legal variant of the shm backend (see the module doc; `K` picks it).
#[derive(Default)]
pub struct Legal<const K: u8> {
    /// Ops issued on this communicator (the slow variant's schedule).
    seq: AtomicU64,
}

/// Every legal variant (a [`Spec`] like a mutant's; its rerun line goes through `--legal`).
pub fn catalogue() -> Vec<Spec> {
    let mut v = vec![
        spec::<Legal<NAN_IGNORE>>(
            "legal_nan_ignore",
            "nan_minmax = Ignore",
            "declares NanPolicy::Ignore: float min / max skip NaN inputs (IEEE maxNum, as NCCL does); the \
             coalesced min / max are declared gaps",
            &["caps::nan_minmax", "caps::gaps_refused", "matrix::all_reduce::out::f32::max", "special"],
        ),
        spec::<Legal<INT_AVG_FLOOR>>(
            "legal_int_avg_floor",
            "int_avg = Floor",
            "declares IntAvg::Floor: a signed integer avg rounds toward negative infinity; the coalesced avg is a \
             declared gap",
            &["caps::int_avg", "caps::gaps_refused", "matrix::all_reduce::out::i32::avg"],
        ),
        spec::<Legal<ROUND_EVERY_STEP>>(
            "legal_round_every_step",
            "rounding = Accumulate",
            "declares Rounding::Accumulate: f16 / bf16 sum, avg and premul_sum fold the ranks in rank order in the \
             dtype, rounding at every step (NCCL's ring does it hop by hop); the coalesced ones are declared gaps",
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
    ];
    v.extend(crate::legal_review::catalogue());
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
        _ => {}
    }
    c
}

/// The shm option that makes `K`'s reduction semantics (shm computes and declares it).
const fn option(k: u8) -> Option<(&'static str, &'static str)> {
    match k {
        NAN_IGNORE => Some(("nan_minmax", "ignore")),
        INT_AVG_FLOOR => Some(("int_avg", "floor")),
        ROUND_EVERY_STEP => Some(("rounding", "every_step")),
        _ => None,
    }
}

/// Refuses a call its variant declares unsupported (`Unsupported`, the same on every rank: the
/// declaration is the same everywhere).
fn refuse<const K: u8>(s: &Shm, op: OpKind, variant: Variant, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
    declared::<K>(s).check(op, Some(variant), Some(dtype), reduce, s.ws()).map_err(CollectiveError::Unsupported)
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

impl<const K: u8> Legal<K> {
    /// The slow variant's work, handed back late on a fixed schedule of op numbers (the op is
    /// already in flight: only the call returns late).
    fn late<T>(&self, _s: &Shm, w: Work<T>) -> Work<T> {
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
        if let Some((key, value)) = option(K) {
            let mut w = world.clone();
            w.options.retain(|(k, _)| k != key);
            w.options.push((key.into(), value.into()));
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
        declared::<K>(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::AllReduce, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::AllReduce, Variant::InPlace, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s, s.inner.all_reduce_(x, op)?))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(s, OpKind::AllReduce, Variant::Coalesced, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s, s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(s, OpKind::AllReduce, Variant::CoalescedInPlace, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s, s.inner.all_reduce_coalesced_(xs, op)?))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::AllGatherIntoTensor, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.all_gather_into_tensor(x)?))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::AllGatherIntoTensor, Variant::OutBuf, s.inner.buffer_dtype(x), None)?;
        let x = if K == ALIAS_CORRECT { unaliased(s, x, out)? } else { x.clone() };
        Ok(self.late(s, s.inner.all_gather_into_tensor_out(&x, out)?))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(s, OpKind::AllGatherIntoTensor, Variant::Coalesced, s.inner.buffer_dtype(x), None)?;
        }
        Ok(self.late(s, s.inner.all_gather_into_tensor_coalesced(xs)?))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::ReduceScatterTensor, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s, s.inner.reduce_scatter_tensor(x, op)?))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::ReduceScatterTensor, Variant::OutBuf, s.inner.buffer_dtype(x), Some(op))?;
        let x = if K == ALIAS_CORRECT { unaliased(s, x, out)? } else { x.clone() };
        Ok(self.late(s, s.inner.reduce_scatter_tensor_out(&x, op, out)?))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        for x in xs {
            refuse::<K>(s, OpKind::ReduceScatterTensor, Variant::Coalesced, s.inner.buffer_dtype(x), Some(op))?;
        }
        Ok(self.late(s, s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::AllToAllSingle, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.all_to_all_single(x, o, i)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::Broadcast, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.broadcast(x, src)?))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::Broadcast, Variant::InPlace, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.broadcast_(x, src)?))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::PermuteTensor, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.permute_tensor(x, src_dst)?))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::Reduce, Variant::Out, s.inner.buffer_dtype(x), Some(op))?;
        Ok(self.late(s, s.inner.reduce(x, op, root)?))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::Gather, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.gather(x, root)?))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::Scatter, Variant::Out, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.scatter(x, root)?))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        refuse::<K>(s, OpKind::SendRecv, Variant::OutBuf, s.inner.buffer_dtype(x), None)?;
        Ok(self.late(s, s.inner.send(x, dst)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        refuse::<K>(s, OpKind::SendRecv, Variant::OutBuf, s.inner.buffer_dtype(out), None)?;
        Ok(self.late(s, s.inner.recv(out, src)?))
    }
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(self.late(s, s.inner.barrier()?))
    }
}
