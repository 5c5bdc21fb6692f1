//! The NCCL launch builders: the closures the progress thread runs to enqueue an op's NCCL calls
//! (elementwise reductions with their premul-sum ops, grouped point-to-point), and the device
//! memory each launch keeps alive until its calls are enqueued.

use crate::comm::{self, red_fns};
use crate::cuda::DevMem;
use crate::dtype::{move_type, nccl_dtype, premul_scalar, Red, AVG, SUM};
use crate::issue::Op;
use crate::worker::{check, Calls, Launch};
use crate::{NcclBackend, NcclBuffer};
use concord_core::{DType, Result};
use cudarc::nccl::sys as nccl;
use std::ffi::c_void;
use std::sync::Arc;

/// NCCL's built-in reduce ops that are the identity on one rank: `ncclSum`, `ncclProd`,
/// `ncclMax`, `ncclMin` (not `ncclAvg`, which divides, nor premul-sum, which scales).
const IDENTITY_ON_ONE_RANK: [u32; 4] = [SUM, 1, 2, 3];

/// [`NcclBackend::one_rank_copies`] for a communicator of `ws` ranks (`enabled`: the option).
fn identity_copies(ws: usize, enabled: bool, jobs: &[(u64, u64, usize, DType, Red)]) -> Option<Vec<(u64, u64, usize)>> {
    if ws != 1 || !enabled {
        return None;
    }
    let identity = |r: &Red| matches!(r, Red::Builtin(c) if IDENTITY_ON_ONE_RANK.contains(c));
    if !jobs.iter().all(|j| identity(&j.4)) {
        return None;
    }
    Some(jobs.iter().filter(|j| j.0 != j.1).map(|&(src, dst, n, d, _)| (src, dst, n * d.size())).collect())
}

/// The device memory behind `bufs`, for a [`Launch`] to keep alive until it is enqueued.
pub(crate) fn keep(bufs: &[&NcclBuffer]) -> Vec<Arc<DevMem>> {
    bufs.iter().map(|b| b.mem.clone()).collect()
}

/// A launch of grouped point-to-point calls: `(is_send, device pointer, elements, peer)`.
pub(crate) fn p2p_launch(jobs: Vec<(bool, u64, usize, usize)>, d: DType, keep: Vec<Arc<DevMem>>) -> Launch {
    Launch::calls_only(keep, Box::new(move |c, s, _| p2p(&jobs, d, c, s)))
}

impl Launch {
    /// A launch that is its NCCL `calls` alone, `keep` alive until they are enqueued: no
    /// premul-sum op to create, no step after them, never replaced by one-rank copies (the data
    /// movements, the barrier).
    pub(crate) fn calls_only(keep: Vec<Arc<DevMem>>, calls: Calls) -> Launch {
        Launch { premul: vec![], then: vec![], keep, calls, local: None }
    }
}

pub(crate) fn p2p(
    jobs: &[(bool, u64, usize, usize)],
    d: DType,
    c: nccl::ncclComm_t,
    s: nccl::cudaStream_t,
) -> std::result::Result<(), (String, nccl::ncclResult_t)> {
    for &(is_send, ptr, n, peer) in jobs {
        let (t, n) = move_type(d, n);
        if is_send {
            check(unsafe { nccl::ncclSend(ptr as *const c_void, n, t, peer as i32, c, s) }, "ncclSend")?;
        } else {
            check(unsafe { nccl::ncclRecv(ptr as *mut c_void, n, t, peer as i32, c, s) }, "ncclRecv")?;
        }
    }
    Ok(())
}

impl NcclBackend {
    /// The premul-sum ops a launch must create (one per distinct dtype and scalar).
    pub(crate) fn premul_list(reds: &[(Red, DType)]) -> Vec<(nccl::ncclDataType_t, [u8; 8])> {
        let mut v: Vec<(nccl::ncclDataType_t, [u8; 8])> = Vec::new();
        for (r, d) in reds {
            if let (Red::PreMul(s), Some(t)) = (r, nccl_dtype(*d)) {
                let item = (t, premul_scalar(*d, *s));
                if !v.iter().any(|(t2, b2)| *t2 == item.0 && *b2 == item.1) {
                    v.push(item);
                }
            }
        }
        v
    }

    /// The launch of one elementwise NCCL reduction (`ncclAllReduce` or `ncclReduceScatter`,
    /// chosen by `pick`) per job `(src, dst, count, dtype, op)`; empty jobs are skipped, and no
    /// launch at all when nothing is left. `keep_alive` buffers live until the calls are enqueued.
    pub(crate) fn reduction_launch(
        &self,
        o: &Op,
        jobs: Vec<(u64, u64, usize, DType, Red)>,
        keep_alive: &[&NcclBuffer],
        pick: fn(&comm::RedFns) -> comm::ElementwiseRedFn,
        label: &'static str,
    ) -> Result<Option<Launch>> {
        let jobs: Vec<_> = self.one_rank_jobs(jobs.into_iter().filter(|j| j.2 > 0).collect());
        if jobs.is_empty() {
            return Ok(None);
        }
        let reds: Vec<(Red, DType)> = jobs.iter().map(|j| (j.4, j.3)).collect();
        let premul = Self::premul_list(&reds);
        let local = self.one_rank_copies(&jobs);
        let call = pick(red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?);
        let p2 = premul.clone();
        Ok(Some(Launch {
            premul,
            then: vec![],
            keep: keep(keep_alive),
            local,
            calls: Box::new(move |c, s, ops| {
                for (src, dst, n, d, red) in jobs {
                    let t = nccl_dtype(d).expect("checked");
                    // SAFETY: src/dst are live device buffers of at least n elements of d (kept
                    // alive by `keep`), and c/s are this communicator's handle and stream.
                    check(unsafe { call(src as *const c_void, dst as *mut c_void, n, t, Self::op_code(red, d, &p2, ops), c, s) }, label)?;
                }
                Ok(())
            }),
        }))
    }

    /// Elementwise reduction jobs `(src, dst, count, dtype, op)` as this communicator must
    /// launch them: on one rank with an NCCL that drops a one-rank reduction's tail
    /// ([`crate::one_rank`]), `avg` becomes `sum` (a copy: the average of one input is the
    /// input) and `premul_sum` is cut into segments the kernel covers whole.
    pub(crate) fn one_rank_jobs(&self, jobs: Vec<(u64, u64, usize, DType, Red)>) -> Vec<(u64, u64, usize, DType, Red)> {
        if !crate::one_rank::affected(self.ws, self.chan.comm.lib_version) {
            return jobs;
        }
        let mut out = Vec::with_capacity(jobs.len());
        for (src, dst, n, d, red) in jobs {
            match red {
                Red::Builtin(AVG) => out.push((src, dst, n, d, Red::Builtin(SUM))),
                Red::PreMul(_) => {
                    let es = d.size() as u64;
                    for (off, cnt) in crate::one_rank::segments(n, d.size()) {
                        out.push((src + off as u64 * es, dst + off as u64 * es, cnt, d, red));
                    }
                }
                Red::Builtin(_) => out.push((src, dst, n, d, red)),
            }
        }
        out
    }

    /// On a communicator of one rank, when every job `(src, dst, count, dtype, op)` (as
    /// [`Self::one_rank_jobs`] made them) is the identity — `sum`, `prod`, `max` or `min` of
    /// the one input — the device copies `(src, dst, bytes)` that are the whole op (see
    /// `Launch::local`); `None` otherwise (a premul-sum scales; `avg` where NCCL divides) and
    /// with option `one_rank_copy=0`.
    pub(crate) fn one_rank_copies(&self, jobs: &[(u64, u64, usize, DType, Red)]) -> Option<Vec<(u64, u64, usize)>> {
        identity_copies(self.ws, self.dev.one_rank_copy() != crate::cuda::OneRankCopy::Off, jobs)
    }

    /// The reduce op for NCCL calls, given the premul ops the launch created (`premul` order).
    pub(crate) fn op_code(red: Red, d: DType, premul: &[(nccl::ncclDataType_t, [u8; 8])], ops: &[u32]) -> u32 {
        match red {
            Red::Builtin(c) => c,
            Red::PreMul(s) => {
                let key = (nccl_dtype(d).expect("checked"), premul_scalar(d, s));
                let i = premul.iter().position(|p| *p == key).expect("premul op created for every premul dtype");
                ops[i]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::red_of;
    use concord_core::ReduceOp;

    #[test]
    fn only_identity_reductions_of_one_rank_become_copies() {
        let job = |red: Red, d: DType| (0x1000u64, 0x9000u64, 10usize, d, red);
        for op in [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min] {
            assert_eq!(identity_copies(1, true, &[job(red_of(op), DType::F16)]), Some(vec![(0x1000, 0x9000, 20)]), "{op:?}");
            assert_eq!(identity_copies(2, true, &[job(red_of(op), DType::F32)]), None, "two ranks reduce: {op:?}");
            assert_eq!(identity_copies(1, false, &[job(red_of(op), DType::F32)]), None, "option one_rank_copy=0");
        }
        // avg divides (unless `one_rank_jobs` made it sum), premul-sum scales: NCCL runs them.
        assert_eq!(identity_copies(1, true, &[job(red_of(ReduceOp::Avg), DType::F32)]), None);
        assert_eq!(identity_copies(1, true, &[job(red_of(ReduceOp::PremulSum(2.0)), DType::F32)]), None);
        // One job that is not the identity sends the whole launch through NCCL.
        let mixed = [job(Red::Builtin(SUM), DType::F32), job(red_of(ReduceOp::Avg), DType::F32)];
        assert_eq!(identity_copies(1, true, &mixed), None);
        // In place: nothing to copy, but still a launch (its event orders it on the stream).
        let in_place = [(0x1000u64, 0x1000u64, 10usize, DType::I64, Red::Builtin(SUM)), job(Red::Builtin(3), DType::U8)];
        assert_eq!(identity_copies(1, true, &in_place), Some(vec![(0x1000, 0x9000, 10)]));
        assert_eq!(identity_copies(1, true, &in_place[..1]), Some(vec![]));
    }

    #[test]
    fn the_one_rank_copy_option() {
        use crate::cuda::OneRankCopy::{self, *};
        assert_eq!(OneRankCopy::parse(None), Ok(Kernel));
        assert_eq!(OneRankCopy::parse(Some("kernel")), Ok(Kernel));
        assert_eq!(OneRankCopy::parse(Some("memcpy")), Ok(Memcpy));
        assert_eq!(OneRankCopy::parse(Some("0")), Ok(Off));
        assert_eq!(OneRankCopy::parse(Some("off")), Ok(Off));
        assert!(OneRankCopy::parse(Some("dma")).unwrap_err().contains("one_rank_copy=dma"));
    }
}
