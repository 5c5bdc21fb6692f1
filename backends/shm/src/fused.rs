//! The fused communication + compute ops on shm, pipelined shard by shard (the seed's
//! `_pipelined_all_gather_and_consume` / `_pipelined_produce_and_all2all`):
//!
//! * all-gather-matmul: every receive (from `rank + step`) and every send of the local shard
//!   (to `rank - step`) is posted first; the progress thread moves the shards through the
//!   peers' shared segments while this thread multiplies the *local* shard, then each peer's
//!   shard as soon as its receive has completed (never before), in step order, into that
//!   peer's rows of the outputs;
//! * matmul-reduce-scatter: the receives of the chunks the peers compute for this rank are
//!   posted first; then this thread computes the chunk of each peer in turn (`rank - step`)
//!   and sends it at once (the transfer overlaps the next chunk's matmul), its own chunk last,
//!   and reduces the received chunks (exact sum, rounded once).
//!
//! Values and rules are `concord_core::fused`'s (the same plans and kernel as the unfused
//! decomposition: `matrixmultiply` through `concord_core::fused::sgemm`); every rank exchanges
//! its call's description first, so bad input is the same named error on every rank. The
//! When pipelining cannot win (`a` below [`PIPELINE_MIN_BYTES`] per rank, or fewer than two
//! cores per rank: option `fused_pipeline`, see [`set_mode`]) the ops take the decomposition. The
//! low-contention ops are shm's own all_gather / reduce_scatter (which already pull from the
//! peers' segments): the trait's defaults.

use crate::{ShmBackend, ShmBuffer};
use concord_core::fused::{
    describe, exchange_and_validate, gather_row_scales, input_descs, AgMatmulPlan, MatmulRsPlan, DECOMPOSITION_WAIT,
};
use concord_core::{progress, Backend, CallOp, ReduceOp, Result, Scaling, Tensor, Work};
use std::sync::atomic::{AtomicU8, Ordering};

/// The smallest `a` (bytes, per rank) that `auto` pipelines: below it the pipeline's extra
/// synchronisation costs about what it hides (256 KiB per rank measured 0.91 to 1.45 against the
/// decomposition over four runs, 1 MiB and up 1.04 to 1.18 in every run: docs/RESULTS.md), and
/// `auto` must never be slower than the decomposition it replaces.
pub const PIPELINE_MIN_BYTES: usize = 1 << 20;

/// Backend option `fused_pipeline`: `auto` (default: pipeline when `a` has at least
/// [`PIPELINE_MIN_BYTES`] per rank, and for the reduce-scatter only with two cores per rank —
/// its decomposition ends in shm's one-pass reduce-scatter kernel, and with fewer cores the
/// chunks' copies by the progress thread have no idle core to hide on: measured in
/// docs/RESULTS.md), `always` (the conformance registry: the suite checks the pipelined path at
/// every size), `never`.
static MODE: AtomicU8 = AtomicU8::new(AUTO);
const AUTO: u8 = 0;
const ALWAYS: u8 = 1;
const NEVER: u8 = 2;

/// Reads the `fused_pipeline` option (called by `init`).
pub(crate) fn set_mode(v: Option<&str>) -> Result<()> {
    let m = match v {
        None | Some("auto") => AUTO,
        Some("always") => ALWAYS,
        Some("never") => NEVER,
        Some(o) => {
            return Err(concord_core::CollectiveError::Backend(format!("option fused_pipeline={o}: expected auto, always or never")))
        }
    };
    MODE.store(m, Ordering::SeqCst);
    Ok(())
}

/// Whether this call takes the decomposition instead of the pipeline.
fn small(b: &ShmBackend, a: &ShmBuffer, reduce_scatter: bool) -> bool {
    let bytes = b.buffer_dtype(a).size() * b.buffer_shape(a).iter().product::<usize>();
    // available_parallelism reads cgroup files on every call (tens of µs): once per process.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = || *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    match MODE.load(Ordering::SeqCst) {
        ALWAYS => false,
        NEVER => true,
        _ => bytes < PIPELINE_MIN_BYTES || (reduce_scatter && cores() < 2 * b.world_size()),
    }
}

impl ShmBackend {
    pub(crate) fn pipelined_all_gather_matmul(
        &self,
        a: &ShmBuffer,
        bs: &[ShmBuffer],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<concord_core::fused::Gathered<ShmBuffer>>> {
        if small(self, a, false) {
            return concord_core::fused::decomposed_all_gather_matmul(self, a, bs, dim, scaling);
        }
        let (ws, me) = (self.world_size(), self.rank());
        let ins = input_descs(self, a, bs);
        let op = CallOp::FusedAllGatherMatmul;
        // Recorded under the op called, beside the sends / receives it runs ([clause: progress.recorded]).
        let _recorded = progress::record(&self.comm.label, if scaling.is_some() { "fused_all_gather_scaled_matmul" } else { op.name() });
        exchange_and_validate(self, &describe(op, me, ins.clone(), None, dim, scaling))?;
        let a_scales = scaling.map(|s| gather_row_scales(self, &s.a)).transpose()?;
        let plan = AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, scaling);
        // Post every transfer first: the progress thread moves shards while we compute.
        let mut recvs = Vec::with_capacity(ws.saturating_sub(1));
        for step in 1..ws {
            let src = (me + step) % ws;
            let buf = self.alloc(plan.dtype, &plan.shard_shape)?;
            recvs.push((src, self.recv(&buf, src)?));
        }
        // The sends post the caller's `a` itself: from the first one on, the op returns (also
        // with an error) only once every send is settled — delivered, or failed, and a failed
        // send's wait withdraws it or waits for the receiver's copy in progress — so no peer
        // reads `a` after the op returned (review15 finding 6; clause
        // `failure.no_touch_after_failed_wait`). Each wait ends by the send's op deadline.
        let mut sends = Vec::with_capacity(ws.saturating_sub(1));
        let gathered = (|| {
            for step in 1..ws {
                sends.push(self.send(a, (me + ws - step) % ws)?);
            }
            let btensors = bs.iter().map(|x| self.download(x)).collect::<Result<Vec<_>>>()?;
            let b_scales = scaling.map(|s| s.b.as_slice());
            let mut parts = plan.start();
            // The local shard first, while the peers' shards are in flight.
            plan.consume(&mut parts, me, &self.download(a)?, &btensors, a_scales.as_ref().map(|s| &s[me]), b_scales);
            // Each peer's shard once it has landed.
            for (src, w) in recvs {
                let shard = self.download(w.wait(DECOMPOSITION_WAIT)?)?;
                plan.consume(&mut parts, src, &shard, &btensors, a_scales.as_ref().map(|s| &s[src]), b_scales);
            }
            Ok(parts)
        })();
        // Every send waited, the first failure kept.
        // (A loop, not `try_fold`: every send is waited even after one failed.)
        let mut settled = Ok(());
        for s in &sends {
            let r = s.wait(DECOMPOSITION_WAIT).map(|_| ());
            if settled.is_ok() {
                settled = r;
            }
        }
        let parts = gathered?;
        settled?;
        let (ag, outs) = plan.finish(parts);
        let ag = self.upload(&ag)?;
        let outs = outs.iter().map(|t| self.upload(t)).collect::<Result<Vec<_>>>()?;
        Ok(Work::done((ag, outs), self.meta(op.name(), 0), &self.counter))
    }

    pub(crate) fn pipelined_matmul_reduce_scatter(
        &self,
        a: &ShmBuffer,
        b: &ShmBuffer,
        rop: ReduceOp,
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<ShmBuffer>> {
        if small(self, a, true) {
            return concord_core::fused::decomposed_matmul_reduce_scatter(self, a, b, rop, dim, scaling);
        }
        let (ws, me) = (self.world_size(), self.rank());
        let ins = input_descs(self, a, std::slice::from_ref(b));
        let op = CallOp::FusedMatmulReduceScatter;
        let _recorded =
            progress::record(&self.comm.label, if scaling.is_some() { "fused_scaled_matmul_reduce_scatter" } else { op.name() });
        exchange_and_validate(self, &describe(op, me, ins.clone(), Some(rop), dim, scaling))?;
        let plan = MatmulRsPlan::new(ws, &ins[0], &ins[1], rop, dim, scaling);
        let out_shape = plan.out_shape();
        let mut recvs = Vec::with_capacity(ws.saturating_sub(1));
        for step in 1..ws {
            let src = (me + step) % ws;
            let buf = self.alloc(plan.out_dtype, &out_shape)?;
            recvs.push((src, self.recv(&buf, src)?));
        }
        let (at, bt) = (self.download(a)?, self.download(b)?);
        let src = plan.prepare(&at, scaling);
        // Produce each peer's chunk and send it at once; our own chunk last.
        let mut sends = Vec::with_capacity(ws.saturating_sub(1));
        for step in 1..ws {
            let dst = (me + ws - step) % ws;
            let buf = self.upload(&plan.chunk(dst, &at, &bt, scaling, Some(&src)))?;
            sends.push(self.send(&buf, dst)?);
        }
        let mut chunks: Vec<Option<Tensor>> = vec![None; ws];
        chunks[me] = Some(plan.chunk(me, &at, &bt, scaling, Some(&src)));
        for (src, w) in recvs {
            chunks[src] = Some(self.download(w.wait(DECOMPOSITION_WAIT)?)?);
        }
        for s in &sends {
            s.wait(DECOMPOSITION_WAIT)?;
        }
        let chunks: Vec<Tensor> = chunks.into_iter().map(|c| c.expect("every rank's chunk")).collect();
        let out = self.upload(&plan.reduce(&chunks))?;
        Ok(Work::done(out, self.meta(op.name(), 0), &self.counter))
    }
}
