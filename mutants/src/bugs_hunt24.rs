//! The twenty-fourth hunt: bugs from the wild in memory layout and sizes. Each ports a
//! correctness bug that shipped in a collective or communication library (Open MPI's libnbc,
//! MPICH, libfabric, Gloo, LCI, Xilinx ACCL, Mooncake), found in the project's issue or
//! pull-request thread named on its type: views and offsets inside a larger allocation, a
//! registration cache keyed by address, zero-count buffers that share an address, counts that
//! do not divide by the rank count or are below it, and 32-bit offsets that wrap.
//!
//! **Scaling of the 32-bit overflows.** Open MPI's and MPICH's bugs here compute a byte offset,
//! an element product or a byte count in a C `int`, which wraps past `INT_MAX` (2 GiB of bytes,
//! 2^31 elements): far beyond what the shm backend runs in CI (64 MiB at most). The ports keep
//! the mechanism (a two's-complement wrap of the same quantity, computed from the same operands)
//! and shrink the type: a C `int` becomes a 21-bit signed integer ([`SCALED_INT_MAX`] =
//! 2^20 - 1), i.e. every threshold is divided by 2^11 — 2 GiB of bytes becomes 1 MiB, 2^31
//! elements become 2^20 elements. Which element of which rank goes wrong follows from the
//! original's arithmetic at the scaled width.

use crate::campaign::{spec, Spec};
use crate::{lock, Buf, Bug, Shm, BUG_WAIT};
use concord_core::{Backend, BadInputKind, CollectiveError, Completion, ReduceOp, Result, Tensor, Work};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The largest value of a C `int` scaled down by 2^11 (see the module docs): a 21-bit signed
/// integer.
pub const SCALED_INT_MAX: usize = (1 << 20) - 1;

/// True when `v`, computed in a (scaled) C `int`, has wrapped to a negative value.
fn wraps(v: usize) -> bool {
    v > SCALED_INT_MAX
}

/// Writes `bytes` over `b`'s bytes `from..from + bytes.len()`.
fn patch(be: &concord_shm::ShmBackend, b: &Buf, from: usize, bytes: &[u8]) -> Result<()> {
    crate::edit(be, b, |t| t.bytes_mut()[from..from + bytes.len()].copy_from_slice(bytes))
}

// ---------------------------------------------------------------- pmodels/mpich #2124

/// A zero-count call refused as aliased (pmodels/mpich #2124 "buffer alias check in
/// reduce_scatter only if count not 0": MPI_Reduce_scatter's `MPIR_ERRTEST_ALIAS_COLL(sendbuf,
/// recvbuf)` compared the two pointers whatever the count, unlike scatter.c and gather.c; the
/// same check without a count tripped MPI_Allreduce with a zero count and NULL buffers,
/// pmodels/mpich #264, and Open MPI's MPI_Reduce, open-mpi/ompi #4135). Here
/// `reduce_scatter_tensor_out` whose output has no element and sits at the input's address
/// (two empty views of one parent at one offset, as FSDP's empty shards of one flat buffer are)
/// is refused at issue on that rank with the pointer check's error; zero bytes overlap nothing,
/// so the call is valid. With elements, equal addresses do overlap and shm's own refusal stands.
#[derive(Default)]
pub struct ZeroCountAliasRefused;

impl Bug for ZeroCountAliasRefused {
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if s.numel(out) == 0 && s.inner.buffer_addr(x) == s.inner.buffer_addr(out) {
            return Err(CollectiveError::bad_input(
                BadInputKind::Aliasing,
                "reduce_scatter_tensor_out",
                0,
                s.rank(),
                "MPI_Reduce_scatter: Buffers must not be aliased (sendbuf == recvbuf, count 0)",
            ));
        }
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

// ---------------------------------------------------------------- uiuc-hpc/lci #168

/// A registration cache that answers with a containing region's base (uiuc-hpc/lci #168
/// "RegCache can export wrong RMR base for subrange registrations": registering a buffer that
/// lies inside a region registered earlier returns that region's registration, and the remote
/// key exported for the buffer carries the *region's* base, so the peer's get or put lands
/// `buffer - region` bytes early, 848 in the report). Here every buffer given to `send` or `recv`
/// is registered (its byte range, kept per communicator); a later `send` / `recv` of a view that
/// lies strictly inside an earlier registered range of the same parent (starting after it)
/// moves its bytes at that range's start: the message is read from, or written to, the view's
/// size of bytes at the registered range's base.
#[derive(Default)]
pub struct RegCacheContainingBase {
    /// Registered byte ranges `(start address, length)`.
    regs: Mutex<Vec<(usize, usize)>>,
}

impl RegCacheContainingBase {
    /// The buffer the transfer really uses for `b`, registering `b`.
    fn registered(&self, s: &Shm, b: &Buf) -> Result<Option<Buf>> {
        let (addr, dtype, shape) = (s.inner.buffer_addr(b), s.inner.buffer_dtype(b), s.inner.buffer_shape(b));
        let len = s.numel(b) * dtype.size();
        let mut regs = lock(&self.regs);
        let hit = regs.iter().copied().find(|&(a, l)| a < addr && addr + len <= a + l);
        regs.push((addr, len));
        drop(regs);
        let (Some((base, _)), Some((parent, _))) = (hit, s.view_of(b)) else { return Ok(None) };
        let p = s.inner.buffer_addr(&parent);
        let plen = s.numel(&parent) * s.inner.buffer_dtype(&parent).size();
        if base < p || base + len > p + plen || (base - p) % dtype.size() != 0 || len == 0 {
            return Ok(None); // a range of another allocation: no containing registration here
        }
        if s.inner.buffer_dtype(&parent) != dtype {
            return Ok(None); // the parent's elements are of another size: no element offset
        }
        Ok(Some(s.inner.view(&parent, (base - p) / dtype.size(), &shape)?))
    }
}

impl Bug for RegCacheContainingBase {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        match self.registered(s, x)? {
            Some(at_base) => s.inner.send(&at_base, dst),
            None => s.inner.send(x, dst),
        }
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        match self.registered(s, out)? {
            Some(at_base) => {
                let w = s.inner.recv(&at_base, src)?;
                Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
            }
            None => s.inner.recv(out, src),
        }
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #9606

/// A reduce_scatter block offset that wraps (open-mpi/ompi PR #9606 "libnbc wrong answer (DI)
/// fix for reduce_scatter": in libnbc's reduce_scatter — a binomial reduce to rank 0, then rank
/// 0 sends each rank its block — the block's byte offset `count x dt_extent` was an `int`; past
/// `INT_MAX` it went negative and the block was sent from the wrong memory). Here (at the scaled
/// width, module docs) rank `r`'s block starts `r · n` elements into the reduced vector, `n`
/// the output's element count; when that byte offset wraps, rank `r` gets bytes from outside
/// the reduced vector (zeros here) instead of its block. Every form of reduce_scatter_tensor.
#[derive(Default)]
pub struct LibnbcRsOffsetWraps;

impl LibnbcRsOffsetWraps {
    fn wrong(s: &Shm, out_numel: usize, esize: usize) -> bool {
        wraps(s.rank() * out_numel * esize)
    }
    fn finish(s: &Shm, w: Work<Buf>) -> Work<Buf> {
        s.then(w, |be, out| crate::edit(be, out, |t| t.bytes_mut().fill(0)))
    }
}

impl Bug for LibnbcRsOffsetWraps {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let (n, es) = (s.numel(w.peek()), s.inner.buffer_dtype(x).size());
        Ok(if Self::wrong(s, n, es) { Self::finish(s, w) } else { w })
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Ok(if Self::wrong(s, s.numel(out), s.inner.buffer_dtype(x).size()) { Self::finish(s, w) } else { w })
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.reduce_scatter_tensor_coalesced(xs, op)?;
        let bad: Vec<bool> = w.peek().iter().map(|o| Self::wrong(s, s.numel(o), s.inner.buffer_dtype(o).size())).collect();
        if !bad.contains(&true) {
            return Ok(w);
        }
        Ok(s.then(w, move |be, outs| {
            for (o, _) in outs.iter().zip(&bad).filter(|(_, &b)| b) {
                crate::edit(be, o, |t| t.bytes_mut().fill(0))?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #10378

/// An all_gather whose own block is placed at a wrapped offset (open-mpi/ompi PR #10378
/// "libnbc: int overflow 'offset = i * count * extent'": at the top of `nbc_allgather_init`,
/// `rbuf = recvbuf + rank * recvcount * rcvext` multiplies two `int`s first, so with 4 ranks of
/// 800,000,000 `MPI_LONG_LONG` rank 3's product wrapped and its own contribution was copied to
/// a negative offset, outside the receive buffer). Here (scaled width, module docs) when
/// `rank · n` wraps, `n` the input's element count, the rank's own block of the gathered output
/// is never written: it keeps what the output held (zeros for a new output). Every form of
/// all_gather_into_tensor; the peers' blocks arrive as before.
#[derive(Default)]
pub struct LibnbcAllgatherOwnBlockWraps;

impl LibnbcAllgatherOwnBlockWraps {
    fn wrong(s: &Shm, x: &Buf) -> bool {
        wraps(s.rank() * s.numel(x))
    }
    /// The byte range `(start, length)` of this rank's block in the gathered output.
    fn own_range(s: &Shm, x: &Buf) -> (usize, usize) {
        let len = s.numel(x) * s.inner.buffer_dtype(x).size();
        (s.rank() * len, len)
    }
}

impl Bug for LibnbcAllgatherOwnBlockWraps {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        if !Self::wrong(s, x) {
            return Ok(w);
        }
        let (from, len) = Self::own_range(s, x);
        Ok(s.then(w, move |be, out| patch(be, out, from, &vec![0; len])))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        if !Self::wrong(s, x) {
            return s.inner.all_gather_into_tensor_out(x, out);
        }
        let (from, len) = Self::own_range(s, x);
        let before = s.inner.download(out)?;
        let kept = before.bytes().get(from..from + len).map(<[u8]>::to_vec);
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        Ok(match kept {
            Some(kept) => s.then(w, move |be, out| patch(be, out, from, &kept)),
            None => w, // a wrong-sized output: shm's refusal stands
        })
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let ranges: Vec<Option<(usize, usize)>> = xs.iter().map(|x| Self::wrong(s, x).then(|| Self::own_range(s, x))).collect();
        let w = s.inner.all_gather_into_tensor_coalesced(xs)?;
        if ranges.iter().all(Option::is_none) {
            return Ok(w);
        }
        Ok(s.then(w, move |be, outs| {
            for (o, r) in outs.iter().zip(&ranges) {
                if let Some((from, len)) = *r {
                    patch(be, o, from, &vec![0; len])?;
                }
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #10093

/// Ring all_reduce segments at wrapped offsets (open-mpi/ompi PR #10093 "libnbc fix for
/// iallreduce count*extent overflowing int": libnbc's ring all_reduce splits the vector into one
/// segment per rank, `segsize = ceil(count / p)` elements, and schedules each segment's sends,
/// receives and reductions at `segoffsets[i] * ext` computed in `int`; at -np 4 with 1.5 billion
/// `MPI_LONG_LONG` the later segments' offsets went negative). Here (scaled width, module docs)
/// every ring segment whose byte offset wraps is moved and reduced outside the output: the
/// output's elements of that segment are never written (zeros in a new output; an in-place
/// buffer keeps the rank's input). all_reduce out of place, in place and coalesced, at 2+ ranks.
#[derive(Default)]
pub struct LibnbcRingOffsetWraps;

impl LibnbcRingOffsetWraps {
    /// Byte ranges of the segments whose offset wraps, for `n` elements of `es` bytes.
    fn lost(ws: usize, n: usize, es: usize) -> Vec<(usize, usize)> {
        if ws < 2 || n == 0 {
            return Vec::new();
        }
        let seg = n.div_ceil(ws);
        (0..ws)
            .filter_map(|i| {
                let start = (i * seg).min(n);
                let end = ((i + 1) * seg).min(n);
                (end > start && wraps(start * es)).then_some((start * es, (end - start) * es))
            })
            .collect()
    }
    /// `w`'s output with the lost segments set from `keep` (the output's bytes before the op).
    fn finish(s: &Shm, w: Work<Buf>, lost: Vec<(usize, usize)>, keep: Option<Tensor>) -> Work<Buf> {
        s.then(w, move |be, out| {
            crate::edit(be, out, |t| {
                for &(from, len) in &lost {
                    let src = keep.as_ref().map(|k| k.bytes()[from..from + len].to_vec()).unwrap_or_else(|| vec![0; len]);
                    t.bytes_mut()[from..from + len].copy_from_slice(&src);
                }
            })
        })
    }
}

impl Bug for LibnbcRingOffsetWraps {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let lost = Self::lost(s.ws(), s.numel(x), s.inner.buffer_dtype(x).size());
        let w = s.inner.all_reduce(x, op)?;
        Ok(if lost.is_empty() { w } else { Self::finish(s, w, lost, None) })
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let lost = Self::lost(s.ws(), s.numel(x), s.inner.buffer_dtype(x).size());
        if lost.is_empty() {
            return s.inner.all_reduce_(x, op);
        }
        let keep = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(Self::finish(s, w, lost, Some(keep)))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let lost: Vec<_> = xs.iter().map(|x| Self::lost(s.ws(), s.numel(x), s.inner.buffer_dtype(x).size())).collect();
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        if lost.iter().all(Vec::is_empty) {
            return Ok(w);
        }
        Ok(s.then(w, move |be, outs| {
            for (o, l) in outs.iter().zip(&lost) {
                crate::edit(be, o, |t| {
                    for &(from, len) in l {
                        t.bytes_mut()[from..from + len].fill(0);
                    }
                })?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- pmodels/mpich #2257

/// A broadcast's size check through a byte count that overflows (pmodels/mpich #2257
/// "MPI_Bcast() fails with count=2^29": `MPIR_Bcast_binomial` checks the bytes each non-root
/// received with `MPIR_Get_count(&status, MPI_BYTE, ...)`, which answers `MPI_UNDEFINED`
/// (-32766) once the byte count passes `INT_MAX`, so every non-root fails with "message sizes do
/// not match across processes in the collective routine: Received -32766 but expected
/// -2147483648"; 2^28 ints worked). Here (scaled width, module docs) a broadcast of more than
/// [`SCALED_INT_MAX`] bytes completes on the root and fails on every other rank with that error.
#[derive(Default)]
pub struct BcastGetCountUndefined;

impl BcastGetCountUndefined {
    fn finish(s: &Shm, w: Work<Buf>, x: &Buf, src: usize) -> Work<Buf> {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        if s.rank() == src || src >= s.ws() || !wraps(bytes) {
            return w;
        }
        let expected = bytes as i64 - (1i64 << 21);
        s.then(w, move |_, _| {
            Err(CollectiveError::Backend(format!(
                "MPIR_Bcast_binomial: message sizes do not match across processes in the collective routine: Received -32766 but expected {expected}"
            )))
        })
    }
}

impl Bug for BcastGetCountUndefined {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        Ok(Self::finish(s, w, x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(x, src)?;
        Ok(Self::finish(s, w, x, src))
    }
}

// ---------------------------------------------------------------- ofiwg/libfabric #5881

/// A scatter + allgather broadcast with even shares (ofiwg/libfabric #5881 "fi_broadcast does
/// not work when there are more ranks than data available": the collective's broadcast scatters
/// `count / ranks` elements to each rank and allgathers them, which "should be scatterv and
/// allgatherv since each rank may send/recv different amount of data"). Here a broadcast of
/// `n` elements delivers only the first `ws · floor(n / ws)` to the non-roots: the last
/// `n mod ws` elements keep the rank's own data (all of them when `n < ws`). In place and out
/// of place (the output starting as the rank's input, as the in/out buffer of fi_broadcast).
#[derive(Default)]
pub struct OfiBcastEvenShares;

impl OfiBcastEvenShares {
    /// The bytes of `x` past the evenly shared part, when there are any on a non-root.
    fn tail(s: &Shm, x: &Buf, src: usize) -> Option<usize> {
        let n = s.numel(x);
        let kept = s.ws() * (n / s.ws());
        (s.rank() != src && src < s.ws() && kept < n).then(|| kept * s.inner.buffer_dtype(x).size())
    }
}

impl Bug for OfiBcastEvenShares {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let Some(from) = Self::tail(s, x, src) else { return s.inner.broadcast(x, src) };
        let own = s.inner.download(x)?.bytes()[from..].to_vec();
        let w = s.inner.broadcast(x, src)?;
        Ok(s.then(w, move |be, out| patch(be, out, from, &own)))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let Some(from) = Self::tail(s, x, src) else { return s.inner.broadcast_(x, src) };
        let own = s.inner.download(x)?.bytes()[from..].to_vec();
        let w = s.inner.broadcast_(x, src)?;
        Ok(s.then(w, move |be, out| patch(be, out, from, &own)))
    }
}

// ---------------------------------------------------------------- Xilinx/ACCL #73

/// An all_reduce that cannot split its count into one segment per rank (Xilinx/ACCL #73
/// "Allreduce with count=1 freezes": "presumably because the input buffer is not segmentable
/// into world size segments of length > 0"). Here an all_reduce of at least one and fewer than
/// `ws` elements never completes: the op runs underneath, but its work stays pending and every
/// wait times out. Out of place, in place and coalesced (any tensor of the list that short).
#[derive(Default)]
pub struct AcclShortAllreduceFreezes;

/// A work that never completes (its inner op kept alive, never reported).
struct Frozen<T> {
    _inner: Work<T>,
}

impl<T: Send + Sync> Completion for Frozen<T> {
    fn is_completed(&self) -> bool {
        false
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        std::thread::sleep(timeout.min(BUG_WAIT));
        Ok(false)
    }
}

impl AcclShortAllreduceFreezes {
    fn short(s: &Shm, x: &Buf) -> bool {
        let n = s.numel(x);
        n > 0 && n < s.ws()
    }
    fn freeze<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        Work::new(value, Arc::new(Frozen { _inner: w }), meta, &s.own)
    }
}

impl Bug for AcclShortAllreduceFreezes {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(if Self::short(s, x) { Self::freeze(s, w) } else { w })
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        Ok(if Self::short(s, x) { Self::freeze(s, w) } else { w })
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        Ok(if xs.iter().any(|x| Self::short(s, x)) { Self::freeze(s, w) } else { w })
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced_(xs, op)?;
        Ok(if xs.iter().any(|x| Self::short(s, x)) { Self::freeze(s, w) } else { w })
    }
}

// ---------------------------------------------------------------- pytorch/gloo #179

/// Empty inputs refused by the reduction algorithms (pytorch/gloo #179 "Gloo does not support
/// empty inputs on reduce/allreduce/allgather": "Reduce and Allreduce ops apply sanity check to
/// enforce non-empty inputs"; the all_gather half is pytorch/gloo #356, ported by the nineteenth
/// hunt). Here all_reduce (every form) and reduce of zero elements fail at issue with Gloo's
/// enforce message, on every rank.
#[derive(Default)]
pub struct GlooEmptyReduceEnforce;

impl GlooEmptyReduceEnforce {
    fn check(s: &Shm, xs: &[&Buf], algo: &str) -> Result<()> {
        if xs.iter().any(|x| s.numel(x) == 0) {
            return Err(CollectiveError::Backend(format!("[enforce fail at gloo/{algo}.cc] opts.elements > 0. 0 vs 0")));
        }
        Ok(())
    }
}

impl Bug for GlooEmptyReduceEnforce {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, &[x], "allreduce")?;
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, &[x], "allreduce")?;
        s.inner.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::check(s, &xs.iter().collect::<Vec<_>>(), "allreduce")?;
        s.inner.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Self::check(s, &xs.iter().collect::<Vec<_>>(), "allreduce")?;
        s.inner.all_reduce_coalesced_(xs, op)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        Self::check(s, &[x], "reduce")?;
        s.inner.reduce(x, op, root)
    }
}

// ---------------------------------------------------------------- kvcache-ai/Mooncake PR #2035

/// A registration made at the allocation's base (kvcache-ai/Mooncake PR #2035 "[TransferEngine]
/// Use allocation base addr for dmabuf-based mem registration": the dmabuf path called
/// `ibv_reg_dmabuf_mr` with a hard-coded offset 0, so for a buffer inside a larger allocation —
/// PyTorch's caching allocator packs many tensors into one `cudaMalloc` block — the memory
/// region pointed at the allocation's first bytes, not the buffer; the same shape in
/// pytorch/tensorpipe PR #248 "Fix cuda_ipc channel for off set buffers" and pmodels/mpich PR
/// #4630 "mpl/gpu: add addr offset in memory handle routines": a CUDA IPC handle names the
/// allocation's base, and the offset was not sent along). Here a send from a view reads, and a
/// recv into a view writes, the view's size of bytes at its parent's start.
#[derive(Default)]
pub struct DmabufRegAtAllocBase;

impl DmabufRegAtAllocBase {
    fn at_base(s: &Shm, b: &Buf) -> Result<Option<Buf>> {
        match s.view_of(b) {
            Some((parent, off)) if off > 0 && s.inner.buffer_dtype(&parent) == s.inner.buffer_dtype(b) => {
                Ok(Some(s.inner.view(&parent, 0, &s.inner.buffer_shape(b))?))
            }
            _ => Ok(None),
        }
    }
}

impl Bug for DmabufRegAtAllocBase {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        match Self::at_base(s, x)? {
            Some(b) => s.inner.send(&b, dst),
            None => s.inner.send(x, dst),
        }
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        match Self::at_base(s, out)? {
            Some(b) => {
                let w = s.inner.recv(&b, src)?;
                Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
            }
            None => s.inner.recv(out, src),
        }
    }
}

// ---------------------------------------------------------------- ROCm/rocm-systems PR #10887

/// CE all_reduce shards placed from the window's base (ROCm/rocm-systems PR #10887 "Fix CE
/// AllReduce receive-window offset for elastic buffers": RCCL's copy-engine all_reduce —
/// single node, symmetric window registration, messages of 4 MiB to 256 MiB (PR #9898), a count
/// that divides by the rank count — reduces each rank's shard in place, then in phase 3 copies
/// it to every peer at `rank * shardBytes` *inside the receive window*, which is right only when
/// the receive buffer starts at the window's base; a buffer at a non-zero offset in its window
/// got the shards in the wrong slots). Here the window is the allocation a view was made from:
/// an in-place all_reduce of a view at a non-zero offset, of 4 MiB to 256 MiB and a count that
/// divides by the world size, at 2+ ranks, leaves the rank's own shard right, the other shards
/// of the view as they were (the input), and writes shard `s` of the result at the parent's
/// byte `s * shardBytes`, over whatever lies there.
#[derive(Default)]
pub struct CeAllreduceWindowBaseSlots;

impl CeAllreduceWindowBaseSlots {
    const MIN_BYTES: usize = 4 << 20;
    const MAX_BYTES: usize = 256 << 20;
}

impl Bug for CeAllreduceWindowBaseSlots {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (n, es, ws, me) = (s.numel(x), s.inner.buffer_dtype(x).size(), s.ws(), s.rank());
        let bytes = n * es;
        let window = match s.view_of(x) {
            Some((parent, off)) if off > 0 && s.inner.buffer_dtype(&parent) == s.inner.buffer_dtype(x) => Some((parent, off * es)),
            _ => None,
        };
        let Some((parent, at)) = window.filter(|_| ws >= 2 && (Self::MIN_BYTES..=Self::MAX_BYTES).contains(&bytes) && n % ws == 0) else {
            return s.inner.all_reduce_(x, op);
        };
        let input = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, view| {
            let result = be.download(view)?;
            let shard = bytes / ws;
            crate::edit(be, &parent, |t| {
                let b = t.bytes_mut();
                // Phase 2 wrote this rank's shard in place; the others were never copied in.
                for sh in (0..ws).filter(|&sh| sh != me) {
                    b[at + sh * shard..at + (sh + 1) * shard].copy_from_slice(&input.bytes()[sh * shard..(sh + 1) * shard]);
                }
                // Phase 3 (the peers' copies) lands at the window's base.
                for sh in (0..ws).filter(|&sh| sh != me) {
                    b[sh * shard..(sh + 1) * shard].copy_from_slice(&result.bytes()[sh * shard..(sh + 1) * shard]);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- NVIDIA/nccl #2198

/// A window-relative offset paired with the backing memory's handle (NVIDIA/nccl #2198 "NCCL
/// RMA proxy path uses window-relative offsets with memory-level RMA handles": with several
/// symmetric windows carved from one allocation, the proxy's put / get addressed
/// `memory base + offset in the window`, so XLA's collective permute across nodes received
/// another rank's data or zeros). Here the window is a view and the memory its parent: a
/// permute_tensor whose input is a view at a non-zero offset sends the view's size of bytes from
/// the parent's start.
#[derive(Default)]
pub struct RmaWindowOffsetOnMemoryHandle;

impl Bug for RmaWindowOffsetOnMemoryHandle {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        match DmabufRegAtAllocBase::at_base(s, x)? {
            Some(b) => s.inner.permute_tensor(&b, src_dst),
            None => s.inner.permute_tensor(x, src_dst),
        }
    }
}

// ---------------------------------------------------------------- aws/aws-ofi-nccl PR #804

/// A zero-byte message through a registration that does not cover its pointer
/// (aws/aws-ofi-nccl PR #804 "Fix 0 byte sends/receives with user buffer registration": with
/// NCCL 2.24 and earlier, a 0-byte send / recv from a user-registered buffer came with a memory
/// handle that was valid but did not cover the buffer's pointer, and the provider refused the
/// transfer; the fix sends 0-byte messages from a buffer of the plugin's own). Here the
/// registration of a view is its parent's byte range: a send or recv of zero elements whose
/// view starts at or past the parent's end (an empty tail slice, `t[n:]`) fails at issue with
/// the provider's error, on the rank that passed it.
#[derive(Default)]
pub struct ZeroByteP2pUncoveredMr;

impl ZeroByteP2pUncoveredMr {
    fn check(s: &Shm, b: &Buf, call: &str) -> Result<()> {
        let Some((parent, _)) = s.view_of(b).filter(|_| s.numel(b) == 0) else { return Ok(()) };
        let (p, a) = (s.inner.buffer_addr(&parent), s.inner.buffer_addr(b));
        let len = s.numel(&parent) * s.inner.buffer_dtype(&parent).size();
        if (p..p + len).contains(&a) {
            return Ok(());
        }
        Err(CollectiveError::Backend(format!(
            "NET/OFI {call} failed: Invalid argument (memory region [{p:#x}, +{len} bytes) does not cover the 0-byte buffer at {a:#x})"
        )))
    }
}

impl Bug for ZeroByteP2pUncoveredMr {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        Self::check(s, x, "fi_send")?;
        s.inner.send(x, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::check(s, out, "fi_recv")?;
        s.inner.recv(out, src)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<ZeroCountAliasRefused>(
            "wild_zero_count_alias_refused",
            "placement.empty_no_alias",
            "pmodels/mpich #2124 (also #264, open-mpi/ompi #4135): reduce_scatter_tensor_out refuses an empty output at the input's address as aliased (pointer check without count > 0)",
            &["wild_layout::empty_out_at_input_address::reduce_scatter_tensor::ws2"],
        ),
        spec::<RegCacheContainingBase>(
            "wild_regcache_containing_base",
            "views",
            "uiuc-hpc/lci #168: a send / recv of a view inside a range registered earlier moves its bytes at that range's base",
            &["send_recv::outbuf::i32::ws2"],
        ),
        spec::<LibnbcRsOffsetWraps>(
            "wild_libnbc_rs_offset_wraps",
            "values.sizes",
            "open-mpi/ompi PR #9606: reduce_scatter block offset r*n*esize in a (scaled) int wraps: that rank gets bytes from outside the reduced vector",
            &["reduce_scatter_tensor::outbuf::f32::avg::ws2::large"],
        ),
        spec::<LibnbcAllgatherOwnBlockWraps>(
            "wild_libnbc_allgather_own_block_wraps",
            "values.sizes",
            "open-mpi/ompi PR #10378: all_gather's own-block offset rank*count in a (scaled) int wraps: the own block is never written",
            &["sizes::all_gather_into_tensor::bf16::n1048577::ws2"],
        ),
        spec::<LibnbcRingOffsetWraps>(
            "wild_libnbc_ring_offset_wraps",
            "values.sizes",
            "open-mpi/ompi PR #10093: ring all_reduce segment offsets in a (scaled) int wrap: those segments are never written",
            &["sizes::all_reduce::f32::n1048575::ws2", "async::lag_read_right_after_wait::ws2"],
        ),
        spec::<BcastGetCountUndefined>(
            "wild_bcast_get_count_undefined",
            "values.sizes",
            "pmodels/mpich #2257: a broadcast past (scaled) INT_MAX bytes fails on every non-root (MPI_Get_count answers MPI_UNDEFINED)",
            &["broadcast::inplace::f32::ws2::large_root0"],
        ),
        spec::<OfiBcastEvenShares>(
            "wild_ofi_bcast_even_shares",
            "values.move",
            "ofiwg/libfabric #5881: scatter + allgather broadcast of floor(n/ws) per rank: the last n mod ws elements never reach the non-roots",
            &["broadcast::out::i8::ws2"],
        ),
        spec::<AcclShortAllreduceFreezes>(
            "wild_accl_short_allreduce_freezes",
            "values.sizes",
            "Xilinx/ACCL #73: an all_reduce of 1..ws-1 elements never completes",
            &["all_reduce::out::i8::sum::ws2"],
        ),
        spec::<GlooEmptyReduceEnforce>(
            "wild_gloo_empty_reduce_enforce",
            "values.sizes",
            "pytorch/gloo #179: all_reduce and reduce of an empty input fail (Gloo enforces non-empty inputs)",
            &["all_reduce::out::i8::sum::ws1"],
        ),
        spec::<DmabufRegAtAllocBase>(
            "wild_dmabuf_reg_at_alloc_base",
            "views",
            "kvcache-ai/Mooncake PR #2035: send / recv of a view register at the allocation's base: the message is read / written at the parent's start",
            &["send_recv::outbuf::i8::ws2"],
        ),
        spec::<CeAllreduceWindowBaseSlots>(
            "wild_ce_allreduce_window_base_slots",
            "views",
            "ROCm/rocm-systems PR #10887: in-place all_reduce of a 4-256 MiB view at a non-zero offset writes the peers' shards at the parent's start (the window base), leaving them out of the view",
            &["wild_layout::inplace_all_reduce_view_in_window::ws2"],
        ),
        spec::<RmaWindowOffsetOnMemoryHandle>(
            "wild_rma_window_offset_on_memory_handle",
            "views",
            "NVIDIA/nccl #2198: permute_tensor of a view sends the bytes at its parent's start (a window offset used with the memory's handle)",
            &["views::permute_tensor::out::f32::ws2"],
        ),
        spec::<ZeroByteP2pUncoveredMr>(
            "wild_zero_byte_p2p_uncovered_mr",
            "views",
            "aws/aws-ofi-nccl PR #804: a zero-element send / recv of a view at its parent's end fails (the registration does not cover the pointer)",
            &["wild_layout::empty_p2p_at_parent_end::ws2"],
        ),
    ]
}
