//! The twenty-second hunt: bugs from the wild in custom collective kernels and symmetric-memory
//! paths written outside NCCL (FasterTransformer's and AITER's custom all-reduce, quick-reduce,
//! SGLang's torch symmetric-memory all-reduce, MSCCL++ under RCCL, MoRI and DeepEP-style
//! expert-parallel all-to-all, torchcomms' pipelined all-gather). Each ports a correctness bug
//! that shipped, found in the project's issue or pull-request thread named on its type, with the
//! original's trigger (dtype, reduce op, size threshold, world size, call order) as far as the
//! `Backend` trait lets a wrapper over shm reproduce it.

use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, lock, relay_wait, Buf, Bug, Shm};
use concord_core::{Backend, Completion, DType, OutstandingCounter, ReduceOp, Result, Tensor, Work};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn nbytes(s: &Shm, x: &Buf) -> usize {
    s.numel(x) * s.inner.buffer_dtype(x).size()
}

fn all_reduce_either(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
    if in_place {
        s.inner.all_reduce_(x, op)
    } else {
        s.inner.all_reduce(x, op)
    }
}

/// The helper ops a mutant issues beside the real one (a gather, a staged all_reduce): shm counts
/// each in its `outstanding` until it is waited or dropped, which the caller never sees, so the
/// mutant reports `outstanding` without the helpers alive ([`Helper`] counts them).
#[derive(Clone, Default)]
struct Helpers(Arc<AtomicUsize>);

impl Helpers {
    fn hold<T>(&self, w: Work<T>) -> Helper<T> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Helper { w, live: self.0.clone() }
    }
    fn outstanding(&self, s: &Shm) -> usize {
        (s.inner.outstanding() + s.own.get()).saturating_sub(self.0.load(Ordering::SeqCst))
    }
}

/// A helper op's work, counted in [`Helpers`] until dropped.
struct Helper<T> {
    w: Work<T>,
    live: Arc<AtomicUsize>,
}

impl<T> Drop for Helper<T> {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Issues a raw all_gather of `x` (held, so it is not counted as the caller's), then the real op
/// (`issue`); when the op is waited, `f` edits its result from every rank's input
/// ([`crate::then_gathered`]). The gather is issued on every call, whatever the bug decides, so
/// every rank issues the same ops.
fn with_gathered(
    s: &Shm,
    helpers: &Helpers,
    x: &Buf,
    issue: impl FnOnce() -> Result<Work<Buf>>,
    f: impl FnOnce(&Tensor, &mut Tensor) + Send + 'static,
) -> Result<Work<Buf>> {
    crate::then_gathered(s, helpers.hold(s.inner.all_gather_into_tensor(x)?), |g| &g.w, issue, |b: &Buf| Some(b), f)
}

// ---------------------------------------------------------------- NVIDIA/FasterTransformer PR #672

/// The two-shot custom all-reduce's gather step reads the wrong peer (NVIDIA/FasterTransformer PR
/// #672 "[bugfix] Fix 2-shot Custom All Reduce kernel correctness issue (indexing bug)", issue
/// #671: "2-shot all reduce was only producing correct results on device 0"). The kernel keeps its
/// peers' comm buffers rotated, `src_d[ii] = peer[(rank + ii) % N]`, and the all-gather step read
/// chunk `dst_rank[ii] = (rank + ii) % N` from `src_d[dst_rank[ii]]` instead of `src_d[ii]`: on
/// rank `r`, chunk `j` came from peer `(j + r) % N`, whose buffer holds the reduced sum only in its
/// own chunk and its raw input everywhere else. Here: a sum all_reduce (either variant) of f16,
/// bf16 or f32 (the kernel's types) on the two-shot path (more than 196,608 bytes, the kernel's
/// threshold, and an element count that splits into `N` chunks) gives, on every rank `r != 0`,
/// chunk `j` = rank `(j + r) % N`'s input chunk `j`; rank 0 is right.
#[derive(Default)]
pub struct FtTwoShotGatherWrongPeer {
    helpers: Helpers,
}

impl FtTwoShotGatherWrongPeer {
    const TWO_SHOT_ABOVE_BYTES: usize = 196_608;
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum
            && matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16 | DType::F32)
            && s.ws() >= 2
            && s.rank() != 0
            && nbytes(s, x) > Self::TWO_SHOT_ABOVE_BYTES
            && s.numel(x).is_multiple_of(s.ws())
    }
    fn issue(&self, s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        if s.ws() < 2 {
            return all_reduce_either(s, x, op, in_place);
        }
        let (ws, me, fires) = (s.ws(), s.rank(), Self::fires(s, x, op));
        with_gathered(
            s,
            &self.helpers,
            x,
            || all_reduce_either(s, x, op, in_place),
            move |all, t| {
                if !fires {
                    return;
                }
                let (n, es) = (t.numel(), t.dtype().size());
                let c = n / ws;
                for j in 0..ws {
                    let q = (j + me) % ws;
                    copy_bytes(t, j * c * es, all, (q * n + j * c) * es, c * es);
                }
            },
        )
    }
}

impl Bug for FtTwoShotGatherWrongPeer {
    fn outstanding(&self, s: &Shm) -> usize {
        self.helpers.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- stale peer inputs (two ports)

/// One rank's input to an all_reduce, as the next call's staging would still hold it.
#[derive(Clone)]
struct Staged {
    addr: usize,
    dtype: DType,
    shape: Vec<usize>,
    input: Tensor,
}

/// An all_reduce whose peers' contributions come from their *previous* call's input when
/// `eligible` and `same(previous, current)` hold: every rank's result is its own current input
/// plus every peer's previous one. Every call, whatever the bug decides, runs as ONE all_reduce
/// (same op) of `[input ; staged]` along dim 0 (`staged`: the previous input where stale, else
/// the input), so every rank issues the same op and bad input is refused as the real op would
/// be; the first half is the real result `R`, the second the staged sum `S`. Where `S` differs
/// from `R` at an element, some peer's stale input differs there, and the result is `S - own
/// previous + own current` (rounded once); elsewhere `R` stands, bit for bit.
fn stale_peers(
    s: &Shm,
    last: &Mutex<Option<Staged>>,
    x: &Buf,
    op: ReduceOp,
    in_place: bool,
    eligible: bool,
    same: fn(&Staged, &Staged) -> bool,
) -> Result<Work<Buf>> {
    let cur = Staged {
        addr: s.inner.buffer_addr(x),
        dtype: s.inner.buffer_dtype(x),
        shape: s.inner.buffer_shape(x),
        input: s.inner.download(x)?,
    };
    let prev = std::mem::replace(&mut *lock(last), eligible.then(|| cur.clone()));
    let stale = prev.filter(|p| eligible && same(p, &cur)).map(|p| p.input);
    let mut both_shape = cur.shape.clone();
    match both_shape.first_mut() {
        Some(d0) => *d0 *= 2,
        None => both_shape.push(2),
    }
    let mut both = Tensor::zeros(cur.dtype, &both_shape);
    let len = cur.input.len_bytes();
    both.bytes_mut()[..len].copy_from_slice(cur.input.bytes());
    both.bytes_mut()[len..].copy_from_slice(stale.as_ref().unwrap_or(&cur.input).bytes());
    let w = s.inner.all_reduce(&s.inner.upload(&both)?, op)?;
    let target = if in_place { x.clone() } else { s.inner.alloc(cur.dtype, &cur.shape)? };
    let own = cur.input;
    Ok(s.then_as(w, target.clone(), move |be, res| {
        let res = be.download(res)?;
        let mut t = Tensor::from_bytes(own.dtype(), own.shape(), &res.bytes()[..len]);
        if let Some(prev_own) = stale {
            let staged = Tensor::from_bytes(own.dtype(), own.shape(), &res.bytes()[len..]);
            let es = t.dtype().size();
            for i in 0..t.numel() {
                if staged.bytes()[i * es..(i + 1) * es] != t.bytes()[i * es..(i + 1) * es] {
                    crate::set_f64(&mut t, i, staged.get_f64(i) - prev_own.get_f64(i) + own.get_f64(i));
                }
            }
        }
        be.write(&target, &t)
    }))
}

// ---------------------------------------------------------------- ROCm/aiter PR #3928

/// Quick-reduce's round flag baked into a captured CUDA graph (ROCm/aiter PR #3928
/// "fix(quick_all_reduce): make flag sync CUDA-graph-safe", the same bug fixed in SGLang by
/// sgl-project/sglang PR #29508 "[Bugfix] fix quickreduce acc error in cudagraph mode"): the
/// round counter `flag_color` is a host-side kernel argument, frozen in the graph, and the flags
/// are never reset between replays, so on the next replay a waiter finds the value it waits for
/// already there and reads the previous replay's data: "silent corruption of the all-reduce
/// result". A replay reissues the same call on the same buffers; here: a sum all_reduce (either
/// variant) of f16 or bf16 at a world size quick-reduce serves (2, 4, 8), at or above its
/// smallest size (1 MiB at 2 and 4 ranks, 16 MiB at 8; bf16 is cast to f16 by default), on the
/// same input buffer, dtype and shape as this communicator's previous all_reduce, sums every
/// peer's input of that previous call with this rank's current input.
#[derive(Default)]
pub struct QuickReduceGraphReplayStaleFlag {
    last: Mutex<Option<Staged>>,
}

impl QuickReduceGraphReplayStaleFlag {
    fn eligible(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        let min = match s.ws() {
            2 | 4 => MIB,
            8 => 16 * MIB,
            _ => return false,
        };
        let b = nbytes(s, x);
        op == ReduceOp::Sum && matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16) && b >= min && b.is_multiple_of(16)
    }
    fn same(p: &Staged, c: &Staged) -> bool {
        p.addr == c.addr && p.dtype == c.dtype && p.shape == c.shape
    }
}

impl Bug for QuickReduceGraphReplayStaleFlag {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        stale_peers(s, &self.last, x, op, false, Self::eligible(s, x, op), Self::same)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        stale_peers(s, &self.last, x, op, true, Self::eligible(s, x, op), Self::same)
    }
}

// ---------------------------------------------------------------- ROCm/aiter PR #4812

/// The registered-buffer custom all-reduce reads a peer's previous input (ROCm/aiter PR #4812
/// "Fix gfx1250 (NPS2, DPX mode) custom all-reduce input publication"): the eager path copies
/// each rank's input into a reusable IPC-registered buffer, and the `start_sync` ready flag was a
/// relaxed store, so a peer could see "ready" before the copy was visible and reduce the buffer's
/// previous contents: "The collective completes normally but returns incorrect results", above
/// the 4 MiB LL threshold only; the regression test queues 64 back-to-back 8 MiB f16 all-reduces
/// with changing values. Here: a sum all_reduce (either variant) of f16, bf16 or f32 larger than
/// 4 MiB, right after an all_reduce of the same dtype and shape on this communicator, sums every
/// peer's input of that previous call with this rank's current input.
#[derive(Default)]
pub struct AiterRegisteredInputStale {
    last: Mutex<Option<Staged>>,
}

impl AiterRegisteredInputStale {
    fn eligible(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum
            && matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16 | DType::F32)
            && nbytes(s, x) > 4 * MIB
            && s.ws() >= 2
    }
    fn same(p: &Staged, c: &Staged) -> bool {
        p.dtype == c.dtype && p.shape == c.shape
    }
}

impl Bug for AiterRegisteredInputStale {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        stale_peers(s, &self.last, x, op, false, Self::eligible(s, x, op), Self::same)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        stale_peers(s, &self.last, x, op, true, Self::eligible(s, x, op), Self::same)
    }
}

// ---------------------------------------------------------------- ROCm/rccl PR #1556

/// MSCCL++'s `allreduce8` under RCCL drops the tail of messages that are not a multiple of
/// `16 * worldSize` bytes (ROCm/rccl PR #1556 "ext-src: fix mscclpp allreduce for non-multiple of
/// 128 message sizes": "MSCCLPP allreduce8 currently assumes that the message size is a multiple
/// of 128. This PR fixes the data corruption"). The kernel reduces `nInt4PerRank = bytes / 16 /
/// worldSize` 16-byte words per rank and never touches the rest; RCCL sends messages above 1 MiB
/// to `allreduce8` and, since ROCm/rccl PR #1253, only sizes that are a multiple of 32 bytes to
/// MSCCL++ at all. Here: a sum all_reduce (either variant, any dtype) of more than 1 MiB, a
/// multiple of 32 bytes but not of `16 * ws`, leaves its last bytes from
/// `bytes / (16 * ws) * 16 * ws` on unreduced: they hold the rank's own input (what an in-place
/// buffer holds there).
#[derive(Default)]
pub struct MscclppAllreduce8Tail;

impl MscclppAllreduce8Tail {
    fn tail_start(s: &Shm, x: &Buf, op: ReduceOp) -> Option<usize> {
        let (b, unit) = (nbytes(s, x), 16 * s.ws());
        (op == ReduceOp::Sum && b > MIB && b.is_multiple_of(32) && !b.is_multiple_of(unit)).then_some(b / unit * unit)
    }
    fn issue(s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let Some(start) = Self::tail_start(s, x, op) else {
            return all_reduce_either(s, x, op, in_place);
        };
        let own = s.inner.download(x)?;
        let w = all_reduce_either(s, x, op, in_place)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let n = t.len_bytes() - start;
                copy_bytes(t, start, &own, start, n)
            })
        }))
    }
}

impl Bug for MscclppAllreduce8Tail {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::issue(s, x, op, true)
    }
}

// ---------------------------------------------------------------- all_to_all layouts

/// Where an all_to_all_single's output rows come from: its dtype, row size and rows per source.
#[derive(Clone, PartialEq)]
struct A2aLayout {
    dtype: DType,
    row_bytes: usize,
    rows_from: Vec<usize>,
}

impl A2aLayout {
    /// `None` where the call is bad input (the correct backend's refusal decides).
    fn of(s: &Shm, x: &Buf, output_splits: Option<&[usize]>) -> Option<A2aLayout> {
        let (dtype, shape, ws) = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x), s.ws());
        let d0 = *shape.first()?;
        let row_bytes = shape[1..].iter().product::<usize>() * dtype.size();
        let rows_from = match output_splits {
            Some(o) if o.len() == ws => o.to_vec(),
            Some(_) => return None,
            None if d0.is_multiple_of(ws) => vec![d0 / ws; ws],
            None => return None,
        };
        Some(A2aLayout { dtype, row_bytes, rows_from })
    }
    /// Byte range of the rows from source `q`.
    fn block(&self, q: usize) -> (usize, usize) {
        let start: usize = self.rows_from[..q].iter().sum();
        (start * self.row_bytes, self.rows_from[q] * self.row_bytes)
    }
}

// ---------------------------------------------------------------- ROCm/mori PR #80

/// A completion that relays a shared inner work (so a later op can look at it, never wait it).
struct Relay(Arc<Work<Buf>>);

impl Completion for Relay {
    fn is_completed(&self) -> bool {
        self.0.is_completed()
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        relay_wait(&self.0, timeout, |_| {})
    }
}

/// One all_to_all of the communicator, as the next one's copy-out sees the shared buffer.
struct Issued {
    seq: u64,
    /// Its inner work while the caller holds it (to see whether its peers' rows landed).
    work: Weak<Work<Buf>>,
    layout: Option<A2aLayout>,
    /// What it received, once it was waited.
    landed: Option<Tensor>,
}

/// Consecutive expert-parallel exchanges sharing one symmetric receive buffer (ROCm/mori PR #80
/// "Fix: fix inconsistency in internode dispatch/combine": "Combine and dispatch share the same
/// input buffer", and "if combine starts immediately after dispatch on a fast GPU, its send phase
/// may perform RDMA writes to `shmemInpTokMemObj` before dispatch's recv phase has completed the
/// memcpy", corrupting the dispatch result when no barrier separates them; the same race in
/// deepseek-ai/DeepEP PR #580, "a race condition when we use dispatch -> dispatch -> combine ->
/// combine"). Here: an all_to_all_single is copied out when it is waited; if the next
/// all_to_all_single on the communicator was issued before that wait and its peers' rows have
/// landed by then (same layout), the rows this one received from peers are the next one's; its
/// own rows (a local copy) are right.
#[derive(Default)]
pub struct MoriSharedRecvBufferNextOp {
    issued: Arc<Mutex<Vec<Issued>>>,
    next_seq: Mutex<u64>,
    relays: OutstandingCounter,
}

impl Bug for MoriSharedRecvBufferNextOp {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let layout = A2aLayout::of(s, x, o);
        let w = s.inner.all_to_all_single(x, o, i)?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let inner = Arc::new(w);
        let seq = {
            let mut n = lock(&self.next_seq);
            *n += 1;
            *n
        };
        {
            let mut issued = lock(&self.issued);
            issued.retain(|e| e.seq + 8 > seq);
            issued.push(Issued { seq, work: Arc::downgrade(&inner), layout: layout.clone(), landed: None });
        }
        let relay = Work::new(value, Arc::new(Relay(inner)), meta, &self.relays);
        let (issued, me, ws) = (self.issued.clone(), s.rank(), s.ws());
        Ok(s.then(relay, move |be, out| {
            let received = be.download(out)?;
            let next = {
                let mut issued = lock(&issued);
                if let Some(e) = issued.iter_mut().find(|e| e.seq == seq) {
                    e.landed = Some(received);
                }
                issued.iter().find(|e| e.seq == seq + 1).map(|e| (e.layout.clone(), e.landed.clone(), e.work.upgrade()))
            };
            let (Some(layout), Some((Some(next_layout), landed, alive))) = (layout, next) else { return Ok(()) };
            if next_layout != layout {
                return Ok(());
            }
            let theirs = match (landed, alive) {
                (Some(t), _) => t,
                (None, Some(w)) if w.is_completed() => be.download(w.peek())?,
                _ => return Ok(()),
            };
            edit(be, out, |t| {
                for q in (0..ws).filter(|&q| q != me) {
                    let (at, n) = layout.block(q);
                    copy_bytes(t, at, &theirs, at, n);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- AMD-AGI/Primus-Turbo PR #482

/// A ring tail published without a system-scope release (AMD-AGI/Primus-Turbo PR #482
/// "fix(deep_ep): stop defaulting to the cheap fence"): DeepEP's intranode dispatch / combine
/// publish a channel tail with `st_release_sys_global<kUseCheapFence>`, whose cheap form forces no
/// payload row out to where the peer sees it, "so a receiver that sees the new tail can read the
/// ring buffer's previous contents instead" ("1-6 corrupted rows out of 8192 ... silent"). Here:
/// in an all_to_all_single after an earlier one on the communicator with the same layout, the
/// last row this rank receives from peer `rank + 1` holds what that slot held after the previous
/// call (the previous call's row there).
#[derive(Default)]
pub struct PrimusCheapFenceStaleRow {
    last: Arc<Mutex<Option<(A2aLayout, Tensor)>>>,
}

impl Bug for PrimusCheapFenceStaleRow {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let layout = A2aLayout::of(s, x, o);
        let w = s.inner.all_to_all_single(x, o, i)?;
        let (last, me, ws) = (self.last.clone(), s.rank(), s.ws());
        Ok(s.then(w, move |be, out| {
            let Some(layout) = layout else { return Ok(()) };
            let received = be.download(out)?;
            let prev = lock(&last).replace((layout.clone(), received));
            let Some((prev_layout, prev_rows)) = prev else { return Ok(()) };
            let peer = (me + 1) % ws;
            if ws < 2 || prev_layout != layout || layout.rows_from[peer] == 0 || layout.row_bytes == 0 {
                return Ok(());
            }
            let (at, n) = layout.block(peer);
            let row = at + n - layout.row_bytes;
            edit(be, out, |t| copy_bytes(t, row, &prev_rows, row, layout.row_bytes))
        }))
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #3214

/// A ring all-gather whose peer and chunk arithmetic masks with `n - 1` (meta-pytorch/torchcomms
/// PR #3214 "Fix AllGatherP ctpipeline ring for non-po2 nRanks": the ring "computed the rail chunk
/// offset (`getRecvChunkIdxInRail`) and `upPeer` with `& (nRanks - 1)`, which only equals
/// `% nRanks` when nRanks is a power of two ... the mask then produced wrong chunk offsets/peers
/// and silently corrupted results"; the pipeline is the fallback for non-power-of-two sizes).
/// Here: an all_gather (every variant) at a world size that is not a power of two runs, on every
/// rank, as a ring where at step `s` rank `r` copies chunk `(r + n - s - 1) & (n - 1)` from rank
/// `(r + n - 1) & (n - 1)`; a chunk a rank never validly receives holds zeros (the receive
/// buffer's fresh contents, or a peer's unwritten slot).
#[derive(Default)]
pub struct TorchcommsRingMaskNonPow2;

impl TorchcommsRingMaskNonPow2 {
    /// Which chunks rank `me` ends up holding correctly after the masked ring.
    fn valid_chunks(n: usize, me: usize) -> Vec<bool> {
        let mask = n - 1;
        let mut valid: Vec<Vec<bool>> = (0..n).map(|r| (0..n).map(|c| c == r).collect()).collect();
        for step in 0..n.saturating_sub(1) {
            let before = valid.clone();
            for (r, row) in valid.iter_mut().enumerate() {
                let up = (r + n - 1) & mask;
                let idx = (r + n - step - 1) & mask;
                row[idx] = before[up][idx];
            }
        }
        valid.swap_remove(me)
    }
    fn corrupt(be: &concord_shm::ShmBackend, out: &Buf, n: usize, me: usize) -> Result<()> {
        let valid = Self::valid_chunks(n, me);
        edit(be, out, |t| {
            let cb = t.len_bytes() / n;
            for (c, ok) in valid.iter().enumerate() {
                if !ok {
                    t.bytes_mut()[c * cb..(c + 1) * cb].fill(0);
                }
            }
        })
    }
    fn fires(s: &Shm) -> bool {
        s.ws() >= 3 && !s.ws().is_power_of_two()
    }
}

impl Bug for TorchcommsRingMaskNonPow2 {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        if !Self::fires(s) {
            return Ok(w);
        }
        let (n, me) = (s.ws(), s.rank());
        Ok(s.then(w, move |be, out| Self::corrupt(be, out, n, me)))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        if !Self::fires(s) {
            return Ok(w);
        }
        let (n, me) = (s.ws(), s.rank());
        Ok(s.then(w, move |be, out| Self::corrupt(be, out, n, me)))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        if !Self::fires(s) {
            return Ok(w);
        }
        let (n, me) = (s.ws(), s.rank());
        Ok(s.then(w, move |be, outs| outs.iter().try_for_each(|out| Self::corrupt(be, out, n, me))))
    }
}

// ---------------------------------------------------------------- sgl-project/sglang PR #27123

/// The in-place branch of SGLang's torch symmetric-memory all-reduce drops its result
/// (sgl-project/sglang PR #27123 "Fix: _all_reduce_in_place add should_torch_symm_mem_allreduce
/// check": besides the missing size guard, "Fixed a bug where `torch_symm_mem_comm.all_reduce` did
/// not modify `input_` in place within the inplace branch": `_all_reduce_in_place` called the
/// out-of-place `all_reduce(input_)`, which returns a new tensor, and discarded it). Here:
/// `all_reduce_` with sum on bf16 (the communicator's one dtype) at a world size it serves (2, 4,
/// 6, 8) and within its size cap (64 MiB at 2 and 4 ranks, 128 MiB at 6 and 8; a multiple of
/// 4 bytes) runs the collective into a new buffer and returns the input buffer unchanged.
#[derive(Default)]
pub struct SglangSymmMemInplaceDropped;

impl SglangSymmMemInplaceDropped {
    fn fires(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        let cap = match s.ws() {
            2 | 4 => 64 * MIB,
            6 | 8 => 128 * MIB,
            _ => return false,
        };
        let b = nbytes(s, x);
        op == ReduceOp::Sum && s.inner.buffer_dtype(x) == DType::BF16 && b <= cap && b.is_multiple_of(4)
    }
}

impl Bug for SglangSymmMemInplaceDropped {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::fires(s, x, op) {
            return s.inner.all_reduce_(x, op);
        }
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then_as(w, x.clone(), |_, _| Ok(())))
    }
}

// ---------------------------------------------------------------- flashinfer-ai/flashinfer PR #1136

/// The Lamport one-shot all-reduce's arrival test compared floats, not bits
/// (flashinfer-ai/flashinfer PR #1136 "fix: negative zero by type trait --> binary value": the
/// TRT-LLM-derived kernel in `include/flashinfer/comm/trtllm_allreduce.cuh` fills its receive
/// buffer with `-0.0` and spins while `has_neg_zero(vec)`, senders having turned their `-0.0`
/// into `+0.0`; the test was `vec[i] == neg_zero_v<T>`, true for `+0.0` too, so a peer's data with
/// a zero in it never counts as arrived and the kernel spins forever; fixed by comparing the
/// bits). Here: a sum all_reduce (either variant) of f16, bf16 or f32 on the one-shot path (at
/// most 1 MiB, at 2, 4 or 8 ranks) never completes on a rank when some *peer's* input holds a
/// zero of either sign: its wait times out, every time. Every all_reduce runs as ONE inner
/// all_reduce (same op) of `[input ; flags]` along dim 0 (`flags[0]`: 1 where this rank's input
/// has a zero), so ranks learn their peers' zeros without another op, and bad input is refused as
/// the real op would be.
#[derive(Default)]
pub struct FlashinferNegZeroFloatCompare {
    uncounted: OutstandingCounter,
}

impl FlashinferNegZeroFloatCompare {
    fn eligible(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        op == ReduceOp::Sum
            && matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16 | DType::F32)
            && matches!(s.ws(), 2 | 4 | 8)
            && s.numel(x) > 0
            && nbytes(s, x) <= MIB
    }
    fn issue(&self, s: &Shm, x: &Buf, op: ReduceOp, in_place: bool) -> Result<Work<Buf>> {
        let (dtype, shape) = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let input = s.inner.download(x)?;
        let eligible = Self::eligible(s, x, op);
        let mine = if eligible && (0..input.numel()).any(|i| input.get_f64(i) == 0.0) { 1.0 } else { 0.0 };
        let mut both_shape = shape.clone();
        match both_shape.first_mut() {
            Some(d0) => *d0 *= 2,
            None => both_shape.push(2),
        }
        let mut both = Tensor::zeros(dtype, &both_shape);
        let len = input.len_bytes();
        both.bytes_mut()[..len].copy_from_slice(input.bytes());
        if len > 0 {
            crate::set_f64(&mut both, input.numel(), mine);
        }
        let inner = s.inner.all_reduce(&s.inner.upload(&both)?, op)?;
        let target = if in_place { x.clone() } else { s.inner.alloc(dtype, &shape)? };
        let meta = inner.meta().clone();
        let spin = NegZeroSpin {
            inner,
            be: s.inner.clone(),
            target: target.clone(),
            len,
            numel: input.numel(),
            mine,
            eligible,
            decided: Mutex::new(None),
        };
        Ok(Work::new(target, Arc::new(spin), meta, &self.uncounted))
    }
}

/// The completion of [`FlashinferNegZeroFloatCompare`]'s all_reduce: the inner op, then either
/// the result (first half) written to the target, or a spin that never ends.
struct NegZeroSpin {
    inner: Work<Buf>,
    be: Arc<concord_shm::ShmBackend>,
    target: Buf,
    len: usize,
    numel: usize,
    mine: f64,
    eligible: bool,
    /// `Some(true)`: spinning for ever; `Some(false)`: done.
    decided: Mutex<Option<bool>>,
}

impl NegZeroSpin {
    fn settle(&self) -> Result<bool> {
        let res = self.be.download(self.inner.wait(Duration::ZERO)?)?;
        let zeros = if self.len > 0 { res.get_f64(self.numel) } else { 0.0 };
        let spins = self.eligible && zeros - self.mine > 0.5;
        if !spins {
            let t = Tensor::from_bytes(res.dtype(), self.be.buffer_shape(&self.target).as_slice(), &res.bytes()[..self.len]);
            self.be.write(&self.target, &t)?;
        }
        Ok(spins)
    }
}

impl Completion for NegZeroSpin {
    fn is_completed(&self) -> bool {
        match *lock(&self.decided) {
            Some(spins) => !spins,
            None => false,
        }
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let start = std::time::Instant::now();
        let mut decided = lock(&self.decided);
        if decided.is_none() {
            if !relay_wait(&self.inner, timeout, |_| {})? {
                return Ok(false);
            }
            *decided = Some(self.settle()?);
        }
        if *decided == Some(true) {
            // The kernel spins: nothing ever completes; the wait ends at its deadline.
            drop(decided);
            std::thread::sleep(timeout.saturating_sub(start.elapsed()));
            return Ok(false);
        }
        Ok(true)
    }
}

impl Bug for FlashinferNegZeroFloatCompare {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, false)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.issue(s, x, op, true)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<FtTwoShotGatherWrongPeer>(
            "wild_ft_two_shot_gather_wrong_peer",
            "values.reduce",
            "NVIDIA/FasterTransformer PR #672: two-shot sum all_reduce (f16/bf16/f32, > 196608 bytes): on rank r != 0 chunk j is rank (j + r) % n's input chunk",
            &["async::issue_returns_at_once::large_all_reduce::ws2"],
        ),
        spec::<QuickReduceGraphReplayStaleFlag>(
            "wild_quick_reduce_replay_stale_flag",
            "placement.reuse",
            "ROCm/aiter PR #3928, sgl-project/sglang PR #29508: a replayed f16/bf16 sum all_reduce (>= 1 MiB, same buffer as the previous call) sums the peers' previous inputs",
            &["wild_custom::all_reduce::replayed_buffer::f16::out::ws2", "wild_custom::all_reduce::replayed_buffer::bf16::inplace::ws2"],
        ),
        spec::<AiterRegisteredInputStale>(
            "wild_aiter_registered_input_stale",
            "values.sizes",
            "ROCm/aiter PR #4812: back-to-back sum all_reduces > 4 MiB (f16/bf16/f32, same shape) sum the peers' previous inputs",
            &["wild_custom::all_reduce::back_to_back_large::f32::out::ws2"],
        ),
        spec::<MscclppAllreduce8Tail>(
            "wild_mscclpp_allreduce8_tail",
            "values.sizes",
            "ROCm/rccl PR #1556: sum all_reduce > 1 MiB, a multiple of 32 bytes but not of 16 * ws, leaves its tail unreduced",
            &["wild_custom::all_reduce::tail_past_16ws::f32::out::ws3", "wild_custom::all_reduce::tail_past_16ws::f32::inplace::ws4"],
        ),
        spec::<MoriSharedRecvBufferNextOp>(
            "wild_mori_shared_recv_buffer_next_op",
            "values.move",
            "ROCm/mori PR #80, deepseek-ai/DeepEP PR #580: an all_to_all waited after the next one landed returns the next one's peer rows",
            &["reuse::outputs_in_flight::all_to_all_single::out::ws2"],
        ),
        spec::<PrimusCheapFenceStaleRow>(
            "wild_primus_cheap_fence_stale_row",
            "values.move",
            "AMD-AGI/Primus-Turbo PR #482: in back-to-back all_to_alls the last row from peer rank + 1 is the previous call's row",
            &["reuse::outputs_kept::all_to_all_single::out::ws2"],
        ),
        spec::<TorchcommsRingMaskNonPow2>(
            "wild_torchcomms_ring_mask_non_pow2",
            "values.world_sizes",
            "meta-pytorch/torchcomms PR #3214: ring all_gather at a non-power-of-two world size masks peer and chunk with n - 1 (chunks lost)",
            &["all_gather_into_tensor::out::f32::ws3"],
        ),
        spec::<SglangSymmMemInplaceDropped>(
            "wild_sglang_symm_mem_inplace_dropped",
            "placement.in_place",
            "sgl-project/sglang PR #27123: bf16 sum all_reduce_ (ws 2/4/6/8, within the symm-mem cap) returns its input unchanged",
            &["all_reduce::inplace::bf16::sum::ws2"],
        ),
        spec::<FlashinferNegZeroFloatCompare>(
            "wild_flashinfer_neg_zero_float_compare",
            "async.every_op_every_rank",
            "flashinfer-ai/flashinfer PR #1136: one-shot Lamport sum all_reduce (f16/bf16/f32, <= 1 MiB, ws 2/4/8) never completes when a peer's input holds a zero",
            &["all_reduce::out::f32::sum::ws2::special"],
        ),
    ]
}
