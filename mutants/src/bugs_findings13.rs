//! review13's two findings left open by impl13 (helper findings13, 2026-11-28): a large-message
//! path that assumes 16-byte aligned buffers (finding 5) and an in-place op on a view that
//! stages whole pages and writes its neighbours back as they were at issue (finding 7). Each was
//! written here first and run against the whole catalogue before any case was added.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, ReduceOp, Result, Tensor, Work};

// ---------------------------------------------------------------- finding 5: aligned large path

/// The size (bytes) from which [`LargePathAssumesAligned`]'s vector copy kernel is used.
const VECTOR_FROM: usize = 1 << 20;

/// The alignment [`LargePathAssumesAligned`]'s kernel assumes (16-byte vector loads and stores).
const VECTOR_ALIGN: usize = 16;

/// `b` as the aligned kernel sees it: where `b` is a buffer of [`VECTOR_FROM`] bytes or more
/// whose first element is not [`VECTOR_ALIGN`]-byte aligned (only a view can be: the allocator's
/// blocks are), a view of as many elements from the aligned-down address (the vector load of
/// `addr & !15`); `None` where the kernel sees `b` as it is.
fn aligned_down(s: &Shm, b: &Buf) -> Result<Option<Buf>> {
    let (be, n) = (&s.inner, s.numel(b));
    let es = be.buffer_dtype(b).size();
    let mis = be.buffer_addr(b) % VECTOR_ALIGN;
    let Some((parent, off)) = s.view_of(b).filter(|_| n * es >= VECTOR_FROM && mis != 0 && mis.is_multiple_of(es)) else { return Ok(None) };
    let back = mis / es;
    if back > off {
        return Ok(None);
    }
    be.view(&parent, off - back, &be.buffer_shape(b)).map(Some)
}

/// `b`, or what the aligned kernel reads / writes instead of it.
fn seen(s: &Shm, b: &Buf) -> Result<Buf> {
    Ok(aligned_down(s, b)?.unwrap_or_else(|| b.clone()))
}

/// Finding 5. From 1 MiB a buffer, the data paths of the out-of-place ops, broadcast and
/// send / recv move data with a vector kernel (16-byte loads and stores, a DMA or copy engine)
/// that assumes every buffer comes from the backend's own aligned allocator: a view at an
/// address not 16-byte aligned is read, or written, from the aligned-down address, i.e. shifted
/// by its misalignment (on x86 an unaligned `_mm_load_ps` would fault; a kernel that masks the
/// low bits reads the wrong elements instead). The in-place all_reduce (a reduction where the
/// data lies, no copy) and the small paths are right. The catalogue's misaligned views were
/// small (views, matrix, programs) or in-place all_reduce (`wild_layout`); the size ladder's
/// guarded buffers sat at 8 elements (32 bytes) into their parent. Clauses `views`,
/// `values.sizes`.
#[derive(Default)]
pub struct LargePathAssumesAligned;

impl LargePathAssumesAligned {
    /// `w` (issued on the kernel's view of the output) reported as the caller's `out`.
    fn as_out(s: &Shm, w: Work<Buf>, out: &Buf) -> Work<Buf> {
        s.then_as(w, out.clone(), |_, _| Ok(()))
    }
}

impl Bug for LargePathAssumesAligned {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(&seen(s, x)?, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor(&seen(s, x)?)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(&seen(s, x)?, &seen(s, out)?)?;
        Ok(Self::as_out(s, w, out))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(&seen(s, x)?, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(&seen(s, x)?, op, &seen(s, out)?)?;
        Ok(Self::as_out(s, w, out))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(&seen(s, x)?, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(&seen(s, x)?, src)?;
        Ok(Self::as_out(s, w, x))
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(&seen(s, x)?, dst)
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(&seen(s, out)?, src)?;
        Ok(Self::as_out(s, w, out))
    }
}

/// Finding 5, the reduction kernel alone: from 1 MiB, out-of-place `all_reduce` and
/// `reduce_scatter_tensor` (`_out` too) load their input with 16-byte vector loads from the
/// aligned-down address (a custom one-shot / two-shot all-reduce kernel of the vLLM / TRT-LLM
/// kind, written for the framework's 256-byte aligned allocations; the copy paths are right).
/// [`LargePathAssumesAligned`] is caught by the random programs' one large misaligned
/// all_gather output; this part of it was not. Clauses `views`, `values.sizes`.
#[derive(Default)]
pub struct LargeReductionAssumesAligned;

impl Bug for LargeReductionAssumesAligned {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(&seen(s, x)?, op)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(&seen(s, x)?, op)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(&seen(s, x)?, op, out)
    }
}

// ---------------------------------------------------------------- finding 7: page-granular staging

/// The granule of [`PageStagedInPlace`]'s staging (a page).
const PAGE: usize = 4096;

/// Finding 7. The in-place all_reduce of a view stages it rounded out to whole 4 KiB pages
/// (pinned bounce buffers, page-granular RDMA registration), clipped to the view's allocation,
/// and on completion copies the whole page span back: the bytes of the allocation that share a
/// page with the view come back as they were at issue. Every guard check passes (guards do not
/// change); a neighbour changed while the op is in flight — the next bucket of one flat gradient
/// buffer reduced by another in-place op, Megatron's `ParamAndGradBuffer`, DDP's
/// `gradient_as_bucket_view` — gets its old bytes back. Clause `views` (as output, a view's op
/// writes only its elements: during the op, not only by its end).
#[derive(Default)]
pub struct PageStagedInPlace;

impl PageStagedInPlace {
    /// The parts of `x`'s allocation that share a page with `x` (before it, after it), each as a
    /// view of the allocation, and their bytes now.
    fn neighbours(s: &Shm, x: &Buf) -> Result<Vec<(Buf, Tensor)>> {
        let be = &s.inner;
        let n = s.numel(x);
        let Some((parent, off)) = s.view_of(x).filter(|_| n > 0) else { return Ok(Vec::new()) };
        let es = be.buffer_dtype(x).size();
        let base = be.buffer_addr(&parent);
        let (start, end) = (base + off * es, base + (off + n) * es);
        let lo = (start / PAGE * PAGE).max(base);
        let hi = end.next_multiple_of(PAGE).min(base + s.numel(&parent) * es);
        let mut v = Vec::new();
        for (from, to) in [(lo, start), (end, hi)] {
            if to > from {
                let nb = be.view(&parent, (from - base) / es, &[(to - from) / es])?;
                let now = be.download(&nb)?;
                v.push((nb, now));
            }
        }
        Ok(v)
    }
}

impl Bug for PageStagedInPlace {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let staged = Self::neighbours(s, x)?;
        let w = s.inner.all_reduce_(x, op)?;
        if staged.is_empty() {
            return Ok(w);
        }
        Ok(s.then(w, move |be, _| {
            for (nb, then) in &staged {
                be.write(nb, then)?;
            }
            Ok(())
        }))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<LargePathAssumesAligned>(
            "findings13_large_path_assumes_aligned",
            "views",
            "from 1 MiB, out-of-place all_reduce / all_gather / reduce_scatter, broadcast and send / recv read and write a view not 16-byte aligned from the aligned-down address (a vector kernel that assumes the allocator's alignment)",
            &["sizes::all_reduce::f32::n262145::ws2"],
        ),
        spec::<LargeReductionAssumesAligned>(
            "findings13_large_reduction_assumes_aligned",
            "views",
            "from 1 MiB, out-of-place all_reduce and reduce_scatter read an input view not 16-byte aligned from the aligned-down address (a custom all-reduce kernel's vector loads)",
            &["sizes::all_reduce::f32::n262145::ws2"],
        ),
        spec::<PageStagedInPlace>(
            "findings13_page_staged_in_place",
            "views",
            "in-place all_reduce of a view stages the 4 KiB pages around it (within its allocation) and writes them all back at completion: neighbours changed while it was in flight get their bytes of issue time back",
            // Before fixes18 caught only by `autotune::builtin::ws2` (its `chunked` choice),
            // whose message names no op; now by the views' in-place ops in flight together.
            &["state::views_of_one_parent::ws2"],
        ),
    ]
}
