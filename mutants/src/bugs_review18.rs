//! review18's mutants (/work/reviews/review18.md, findings 1-7): backends that describe a call to
//! the rule table differently from what they then do (counts, not shapes; widths, not dtypes; a
//! bucket's total, not the list; a chunk, not the call; `numel % ws`, not `dim0 % ws`), so they
//! are right on every bad input whose description differs in what they ship and silently wrong on
//! the ones that differ only in what they drop; one that declares no f64 (so the fixed f64 dtype
//! rows switched off); and one that writes its `_out` buffer before a cross-rank refusal.
use crate::campaign::{spec, Spec};
use crate::{copy_bytes, Buf, Bug, Mutant, Shm};
use concord_core::fused::{self, Gathered};
use concord_core::Scaling;
use concord_core::{Backend, CollectiveError, Completion, DType, ReduceOp, Result, Tensor, Work};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn shape(s: &Shm, x: &Buf) -> Vec<usize> {
    s.inner.buffer_shape(x)
}

fn gathered_shape(sh: &[usize], ws: usize) -> Vec<usize> {
    if sh.is_empty() {
        vec![ws]
    } else {
        let mut o = sh.to_vec();
        o[0] *= ws;
        o
    }
}

/// A hook run once on a work's inner result.
type Hook<T> = Box<dyn FnOnce(&concord_shm::ShmBackend, &T) -> Result<()> + Send>;

/// A work whose value is `value`, complete when `inner` is, with `hook` run on the inner result
/// before completion is reported (by `is_completed` or `wait`): truthful completion.
struct Eager<T> {
    inner: Work<T>,
    be: Arc<concord_shm::ShmBackend>,
    hook: Mutex<Option<Hook<T>>>,
    failed: Mutex<Option<CollectiveError>>,
}

impl<T: Send + Sync> Eager<T> {
    fn run(&self, v: &T) -> Result<()> {
        if let Some(h) = self.hook.lock().unwrap().take() {
            if let Err(e) = h(&self.be, v) {
                *self.failed.lock().unwrap() = Some(e);
            }
        }
        match &*self.failed.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl<T: Send + Sync> Completion for Eager<T> {
    fn is_completed(&self) -> bool {
        if !self.inner.is_completed() {
            return false;
        }
        if let Ok(v) = self.inner.wait(Duration::ZERO) {
            let _ = self.run(v);
        }
        true
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match self.inner.wait(timeout) {
            Ok(v) => self.run(v).map(|_| true),
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn eager<T: Send + Sync + 'static, U>(
    s: &Shm,
    w: Work<T>,
    value: U,
    hook: impl FnOnce(&concord_shm::ShmBackend, &T) -> Result<()> + Send + 'static,
) -> Work<U> {
    let meta = w.meta().clone();
    let c = Eager { inner: w, be: s.inner.clone(), hook: Mutex::new(Some(Box::new(hook))), failed: Mutex::new(None) };
    s.relayed(value, Arc::new(c), meta)
}

/// A: the validation header carries element counts, not shapes (NCCL's count; c10d's
/// `numel` checks): all_reduce and all_gather run on flat views, the result takes the caller's
/// shape. Two ranks whose shapes differ with equal numel ([2, 3] / [3, 2]) pass.
#[derive(Default)]
pub struct ShapeAsNumel;

impl Bug for ShapeAsNumel {
    fused_on_shm!();
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let sh = shape(s, x);
        let flat = s.inner.view(x, 0, &[s.numel(x)])?;
        let w = s.inner.all_reduce(&flat, op)?;
        let out = s.inner.view(w.peek(), 0, &sh)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let flat = s.inner.view(x, 0, &[s.numel(x)])?;
        let w = s.inner.all_reduce_(&flat, op)?;
        Ok(s.then_as(w, x.clone(), |_, _| Ok(())))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let sh = gathered_shape(&shape(s, x), s.ws());
        let flat = s.inner.view(x, 0, &[s.numel(x)])?;
        let w = s.inner.all_gather_into_tensor(&flat)?;
        let out = s.inner.view(w.peek(), 0, &sh)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
}

/// B: reduce_scatter / scatter validate `numel % ws` (the byte / count check) instead of
/// `dim0 % ws`, and shape the result `[d0 / ws, rest..]`: [3, 2] at 2 ranks reduces chunks of 3
/// elements and returns [1, 2] — the third element of each chunk silently dropped.
#[derive(Default)]
pub struct ScatterNumelDivisible;

impl ScatterNumelDivisible {
    fn flat(s: &Shm, x: &Buf) -> Option<(Buf, Vec<usize>)> {
        let (sh, n, ws) = (shape(s, x), s.numel(x), s.ws());
        if sh.is_empty() || sh[0] % ws == 0 || n % ws != 0 {
            return None;
        }
        let mut o = sh.clone();
        o[0] /= ws;
        Some((s.inner.view(x, 0, &[n]).ok()?, o))
    }
}

impl Bug for ScatterNumelDivisible {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let Some((flat, o)) = Self::flat(s, x) else { return s.inner.reduce_scatter_tensor(x, op) };
        let w = s.inner.reduce_scatter_tensor(&flat, op)?;
        let out = s.inner.view(w.peek(), 0, &o)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let Some((flat, o)) = Self::flat(s, x) else { return s.inner.scatter(x, root) };
        let w = s.inner.scatter(&flat, root)?;
        let out = s.inner.view(w.peek(), 0, &o)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
}

/// C: ops that do no arithmetic move bits: the dtype goes on the wire as the unsigned integer of
/// its width (u8 / u16 / u32 / u64), so the header compares widths, not dtypes: f32 against i32
/// (or bf16 against f16) on all_gather / gather / scatter / all_to_all / permute passes, and each
/// rank reads its peers' bits as its own dtype. (broadcast is left exact: its row catches it.)
#[derive(Default)]
pub struct MoversCompareWidths;

fn width(d: DType) -> DType {
    match d.size() {
        1 => DType::U8,
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    }
}

fn as_width(s: &Shm, x: &Buf) -> (Buf, DType) {
    let d = s.inner.buffer_dtype(x);
    (x.retyped(width(d), &shape(s, x)), d)
}

fn back(s: &Shm, w: Work<Buf>, d: DType) -> Work<Buf> {
    let r = w.peek();
    let out = r.retyped(d, &s.inner.buffer_shape(r));
    s.then_as(w, out, |_, _| Ok(()))
}

impl Bug for MoversCompareWidths {
    fused_on_shm!();
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        Ok(back(s, s.inner.all_gather_into_tensor(&u)?, d))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        let (o, _) = as_width(s, out);
        let w = s.inner.all_gather_into_tensor_out(&u, &o)?;
        let _ = d;
        Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        Ok(back(s, s.inner.all_to_all_single(&u, o, i)?, d))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        Ok(back(s, s.inner.gather(&u, root)?, d))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        Ok(back(s, s.inner.scatter(&u, root)?, d))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let (u, d) = as_width(s, x);
        Ok(back(s, s.inner.permute_tensor(&u, src_dst)?, d))
    }
}

/// D: all_gather_into_tensor_coalesced as one bucket (DDP / FSDP-style flatten-concat): the
/// list is copied into one flat buffer, all-gathered once, and unflattened by this rank's own
/// sizes. Only the bucket's total is validated: [3], [4] on one rank against [4], [3] on its
/// peer passes, each output holding the wrong rows.
#[derive(Default)]
pub struct CoalescedBucket;

impl Bug for CoalescedBucket {
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let Some(first) = xs.first() else { return s.inner.all_gather_into_tensor_coalesced(xs) };
        let d = s.inner.buffer_dtype(first);
        if xs.iter().any(|x| s.inner.buffer_dtype(x) != d) {
            return s.inner.all_gather_into_tensor_coalesced(xs);
        }
        let es = d.size();
        let ns: Vec<usize> = xs.iter().map(|x| s.numel(x)).collect();
        let total: usize = ns.iter().sum();
        let mut bucket = Tensor::zeros(d, &[total]);
        let mut off = 0;
        for (x, &n) in xs.iter().zip(&ns) {
            let t = s.inner.download(x)?;
            copy_bytes(&mut bucket, off * es, &t, 0, n * es);
            off += n;
        }
        let b = s.inner.upload(&bucket)?;
        let ws = s.ws();
        let outs: Vec<Buf> = xs.iter().map(|x| s.inner.alloc(d, &gathered_shape(&shape(s, x), ws))).collect::<Result<_>>()?;
        // The header carries the list's length (count mismatches stay named) and the bucket.
        let mut list = vec![b];
        for _ in 1..xs.len() {
            list.push(s.inner.alloc(d, &[0])?);
        }
        let w = s.inner.all_gather_into_tensor_coalesced(&list)?;
        let (outs2, shapes): (Vec<Buf>, Vec<Vec<usize>>) = (outs.clone(), xs.iter().map(|x| gathered_shape(&shape(s, x), ws)).collect());
        Ok(eager(s, w, outs, move |be, g: &Vec<Buf>| {
            let all = be.download(&g[0])?;
            let mut off = 0;
            for ((out, &n), sh) in outs2.iter().zip(&ns).zip(&shapes) {
                let mut t = Tensor::zeros(d, sh);
                for r in 0..ws {
                    copy_bytes(&mut t, r * n * es, &all, (r * total + off) * es, n * es);
                }
                be.write(out, &t)?;
                off += n;
            }
            Ok(())
        }))
    }
}

/// D2: all_reduce_coalesced as one bucket (DDP's gradient buckets): the list flattened into one
/// buffer, all-reduced once (the header carries the list's length and the bucket), unflattened by
/// this rank's own sizes: [3], [4] against [4], [3] sums misaligned elements, silently.
#[derive(Default)]
pub struct AllReduceBucket;

impl Bug for AllReduceBucket {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let Some(first) = xs.first() else { return s.inner.all_reduce_coalesced(xs, op) };
        let d = s.inner.buffer_dtype(first);
        if xs.iter().any(|x| s.inner.buffer_dtype(x) != d) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        let es = d.size();
        let ns: Vec<usize> = xs.iter().map(|x| s.numel(x)).collect();
        let total: usize = ns.iter().sum();
        let mut bucket = Tensor::zeros(d, &[total]);
        let mut off = 0;
        for (x, &n) in xs.iter().zip(&ns) {
            let t = s.inner.download(x)?;
            copy_bytes(&mut bucket, off * es, &t, 0, n * es);
            off += n;
        }
        let mut list = vec![s.inner.upload(&bucket)?];
        for _ in 1..xs.len() {
            list.push(s.inner.alloc(d, &[0])?);
        }
        let outs: Vec<Buf> = xs.iter().map(|x| s.inner.alloc(d, &shape(s, x))).collect::<Result<_>>()?;
        let w = s.inner.all_reduce_coalesced(&list, op)?;
        let shapes: Vec<Vec<usize>> = xs.iter().map(|x| shape(s, x)).collect();
        let outs2 = outs.clone();
        Ok(eager(s, w, outs, move |be, g: &Vec<Buf>| {
            let all = be.download(&g[0])?;
            let mut off = 0;
            for ((out, &n), sh) in outs2.iter().zip(&ns).zip(&shapes) {
                let mut t = Tensor::zeros(d, sh);
                copy_bytes(&mut t, 0, &all, off * es, n * es);
                be.write(out, &t)?;
                off += n;
            }
            Ok(())
        }))
    }
}

/// F: no f64 (declared: `dtypes` without f64, every f64 call refused `unsupported`), and the
/// `_out` ops check the buffer's element count only: an `_out` buffer of another dtype gets the
/// result cast into it (the bug reduce_scatter_out_wrong_dtype was written for).
#[derive(Default)]
pub struct NoF64OutCast;

fn no_f64(s: &Shm, bufs: &[&Buf]) -> Result<()> {
    if bufs.iter().any(|b| s.inner.buffer_dtype(b) == DType::F64) {
        return Err(CollectiveError::Unsupported("review18_no_f64_out_cast: no f64".into()));
    }
    Ok(())
}

fn cast_into(s: &Shm, w: Work<Buf>, out: &Buf) -> Work<Buf> {
    let o = out.clone();
    eager(s, w, out.clone(), move |be, r: &Buf| {
        let t = be.download(r)?;
        let od = be.buffer_dtype(&o);
        let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
        be.write(&o, &Tensor::from_f64(od, &be.buffer_shape(&o), &vals))
    })
}

impl Bug for NoF64OutCast {
    fn capabilities(&self, s: &Shm) -> concord_core::Capabilities {
        let mut c = s.inner.capabilities();
        c.dtypes.retain(|d| *d != DType::F64);
        c
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        no_f64(s, &xs.iter().collect::<Vec<_>>())?;
        s.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        no_f64(s, &xs.iter().collect::<Vec<_>>())?;
        s.inner.all_reduce_coalesced_(xs, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        no_f64(s, &[x, out])?;
        if s.inner.buffer_dtype(x) == s.inner.buffer_dtype(out) {
            return s.inner.all_gather_into_tensor_out(x, out);
        }
        let tmp = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(out))?;
        Ok(cast_into(s, s.inner.all_gather_into_tensor_out(x, &tmp)?, out))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        no_f64(s, &xs.iter().collect::<Vec<_>>())?;
        s.inner.all_gather_into_tensor_coalesced(xs)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        no_f64(s, &[x, out])?;
        if s.inner.buffer_dtype(x) == s.inner.buffer_dtype(out) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let tmp = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(out))?;
        Ok(cast_into(s, s.inner.reduce_scatter_tensor_out(x, op, &tmp)?, out))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        no_f64(s, &xs.iter().collect::<Vec<_>>())?;
        s.inner.reduce_scatter_tensor_coalesced(xs, op)
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.all_to_all_single(x, o, i)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.broadcast_(x, src)
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.permute_tensor(x, src_dst)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.reduce(x, op, root)
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.gather(x, root)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        no_f64(s, &[x])?;
        s.inner.scatter(x, root)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        no_f64(s, &[x])?;
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        no_f64(s, &[out])?;
        s.inner.recv(out, src)
    }
}

/// E: large all_reduce (>= 1 MiB) pipelined in 1 MiB chunks, each chunk its own validated
/// collective (the header travels with each chunk and carries the chunk's count): ranks whose
/// sizes differ past the first chunk never compare their totals.
#[derive(Default)]
pub struct LargeChunkHeaders;

struct Chunks(Vec<Work<Buf>>);

impl Completion for Chunks {
    fn is_completed(&self) -> bool {
        self.0.iter().all(|w| w.is_completed())
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let end = Instant::now() + timeout;
        for w in &self.0 {
            match w.wait(end.saturating_duration_since(Instant::now())) {
                Ok(_) => {}
                Err(CollectiveError::Timeout { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl Bug for LargeChunkHeaders {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        let chunk = (1 << 20) / d.size();
        if n * d.size() < (1 << 20) || n <= chunk {
            return s.inner.all_reduce(x, op);
        }
        let out = s.inner.upload(&s.inner.download(x)?)?;
        let flat = s.inner.view(&out, 0, &[n])?;
        let mut works = Vec::new();
        let mut at = 0;
        while at < n {
            let len = chunk.min(n - at);
            works.push(s.inner.all_reduce_(&s.inner.view(&flat, at, &[len])?, op)?);
            at += len;
        }
        let meta = works[0].meta().clone();
        Ok(s.relayed(out, Arc::new(Chunks(works)), meta))
    }
}

/// G (finding 7): the `_out` ops copy this rank's own chunk into the caller's buffer at issue (the
/// local copy first, a common overlap trick: all_gather's own slot, reduce_scatter's accumulator
/// seeded with its own chunk) once the local checks pass, then run the collective, whose
/// cross-rank validation refuses a mismatch: the caller gets `bad_input` and a written buffer.
#[derive(Default)]
pub struct RefusedOutWritten;

impl RefusedOutWritten {
    /// Copies `n` elements of `x` from element `from` into `out` at element `to`.
    fn seed(s: &Shm, x: &Buf, from: usize, out: &Buf, to: usize, n: usize) -> Result<()> {
        let d = s.inner.buffer_dtype(x);
        let src = s.inner.download(x)?;
        let es = d.size();
        crate::edit(&s.inner, out, |t| copy_bytes(t, to * es, &src, from * es, n * es))
    }
}

impl Bug for RefusedOutWritten {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let (n, ws, me) = (s.numel(x), s.ws(), s.rank());
        if s.inner.buffer_dtype(x) == s.inner.buffer_dtype(out) && s.numel(out) == n * ws {
            Self::seed(s, x, 0, out, me * n, n)?;
        }
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let (n, ws, me) = (s.numel(out), s.ws(), s.rank());
        if s.inner.buffer_dtype(x) == s.inner.buffer_dtype(out) && n * ws == s.numel(x) {
            Self::seed(s, x, me * n, out, 0, n)?;
        }
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<ShapeAsNumel>(
            "review18_shape_as_numel",
            "bad_input.named_everywhere",
            "the validation header ships element counts, not shapes: all_reduce / all_gather of [2, 3] against [3, 2] complete",
            &["bad_input::grid::all_reduce::ws2", "bad_input::grid::all_gather_into_tensor::ws2"],
        ),
        spec::<ScatterNumelDivisible>(
            "review18_scatter_numel_divisible",
            "bad_input.named_everywhere",
            "reduce_scatter / scatter check numel % ws instead of dim0 % ws: [5, 2] at 2 ranks is truncated to [2, 2]",
            &["bad_input::grid::reduce_scatter_tensor::ws2", "bad_input::grid::scatter::ws2"],
        ),
        spec::<MoversCompareWidths>(
            "review18_movers_compare_widths",
            "bad_input.named_everywhere",
            "all_gather / all_to_all / gather / scatter / permute move bits and compare dtype widths: f32 against i32 completes",
            &["bad_input::grid::all_gather_into_tensor::ws2", "bad_input::grid::all_to_all_single::ws2"],
        ),
        spec::<CoalescedBucket>(
            "review18_coalesced_bucket",
            "bad_input.named_everywhere",
            "all_gather_into_tensor_coalesced as one flat bucket: only the list's length and total are validated",
            &["bad_input::grid::all_gather_into_tensor_coalesced::ws2"],
        ),
        spec::<AllReduceBucket>(
            "review18_all_reduce_bucket",
            "bad_input.named_everywhere",
            "all_reduce_coalesced as one flat bucket (DDP): only the list's length and total are validated",
            &["bad_input::all_reduce_coalesced_one_shape_mismatch", "bad_input::grid::all_reduce_coalesced::ws2"],
        ),
        spec::<NoF64OutCast>(
            "review18_no_f64_out_cast",
            "bad_input.named_everywhere",
            "declares no f64 (every f64 row off); the _out ops check the count only and cast into an _out buffer of another dtype",
            &["bad_input::grid::reduce_scatter_tensor_out::ws2", "bad_input::grid::all_gather_into_tensor_out::ws2"],
        ),
        spec::<LargeChunkHeaders>(
            "review18_large_chunk_headers",
            "bad_input.named_everywhere",
            "all_reduce of 1 MiB or more pipelined in 1 MiB chunks, each validated alone: a mismatch past the first chunk completes",
            &["bad_input::all_reduce_shape_mismatch_large"],
        ),
        spec::<RefusedOutWritten>(
            "review18_refused_out_written",
            "bad_input.refused_untouched",
            "the _out ops copy this rank's own chunk into the caller's buffer at issue, then a cross-rank refusal: bad_input and a written buffer",
            &["bad_input::grid::all_gather_into_tensor_out::ws2", "bad_input::grid::reduce_scatter_tensor_out::ws2"],
        ),
    ]
}
