//! Device buffers: [`NcclBuffer`] (a typed view of Arc-shared device memory) and the buffer
//! entry points of the [`concord_core::Backend`] impl — upload, download, alloc, write, view —
//! with the host↔device copies ordered on the rank's one stream.

use crate::cuda::{self, DevMem};
use crate::issue::Op;
use crate::NcclBackend;
use concord_core::fault::{point, Action};
use concord_core::{BadInputKind, CollectiveError, DType, Result, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// A buffer in one rank's GPU memory: a view (byte offset, dtype, shape) of an Arc-shared
/// allocation. Cloning clones the handle.
#[derive(Clone)]
pub struct NcclBuffer {
    pub(crate) mem: Arc<DevMem>,
    pub(crate) offset: usize,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

impl NcclBuffer {
    pub(crate) fn ptr(&self) -> u64 {
        self.mem.ptr + self.offset as u64
    }
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub(crate) fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// Rows of dim 0 and elements per row (a 0-dim buffer is one row of one element).
    pub(crate) fn rows(&self) -> (usize, usize) {
        match self.shape.split_first() {
            None => (1, 1),
            Some((d0, rest)) => (*d0, rest.iter().product()),
        }
    }
    pub(crate) fn overlaps(&self, other: &NcclBuffer) -> bool {
        let (a0, a1) = (self.ptr(), self.ptr() + self.nbytes() as u64);
        let (b0, b1) = (other.ptr(), other.ptr() + other.nbytes() as u64);
        a0 < b1 && b0 < a1 && self.nbytes() > 0 && other.nbytes() > 0
    }
}

impl std::fmt::Debug for NcclBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclBuffer<{}>{:?}@{:#x} (GPU {})", self.dtype, self.shape, self.ptr(), self.mem.dev.ordinal)
    }
}

impl NcclBackend {
    pub(crate) fn alloc_buf(&self, op: &Op, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        if self.faults.fires(point::AFTER_BEGIN, Action::Fail, op.nth) {
            return Err(self.backend_err(op.name, op.seq, "injected fault after_begin:fail (a simulated out-of-memory)"));
        }
        let bytes = shape.iter().product::<usize>() * dtype.size();
        // The fault `alloc_output:fail` (on the op already numbered, so its dropped `Op` still
        // sends its header marked failed): this one allocation asks for twice the device's
        // memory, through the allocator's own path (block cache, pool, the one retry after
        // emptying the cache), which fails as a real out-of-memory does, with the driver's
        // `CUDA_ERROR_OUT_OF_MEMORY`.
        if self.faults.fires(point::ALLOC_OUTPUT, Action::Fail, op.nth) {
            let err = |e: String| self.backend_err(op.name, op.seq, e);
            let huge = self.dev.beyond_capacity().map_err(err)?;
            return Err(match self.dev.alloc(huge) {
                Err(e) => err(format!("{e} (the fault alloc_output:fail asked for twice the GPU's memory)")),
                Ok(mem) => {
                    drop(mem);
                    err(format!("the fault alloc_output:fail asked for {huge} bytes, twice the GPU's memory, and got them: no out-of-memory to inject"))
                }
            });
        }
        let mem = self.dev.alloc(bytes).map_err(|e| self.backend_err(op.name, op.seq, e))?;
        Ok(NcclBuffer { mem: Arc::new(mem), offset: 0, dtype, shape: shape.to_vec() })
    }

    pub(crate) fn write_checks(&self, o: &Op, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        if t.dtype() != b.dtype {
            return Err(self.bad(o, BadInputKind::DTypeMismatch, format!("writing a {} tensor into a {} buffer", t.dtype(), b.dtype)));
        }
        if t.numel() != b.numel() {
            return Err(self.bad(o, BadInputKind::OutBufferSize, format!("writing {} elements into a buffer of {}", t.numel(), b.numel())));
        }
        Ok(())
    }

    /// The error of a host copy still pending at its deadline (nothing aborted: a copy does
    /// not involve NCCL; its memory is kept for the pending copy).
    fn copy_timeout(&self, o: &Op, what: &str) -> CollectiveError {
        CollectiveError::Timeout {
            op: o.name.to_string(),
            seq: o.seq,
            rank: self.rank,
            waited_ms: o.issued.elapsed().as_millis() as u64,
            detail: format!(
                "the {what} did not finish within the op deadline of {} ms (the GPU is stalled?); \
                 the communicator was left alone",
                self.op_timeout.as_millis()
            ),
        }
    }

    /// Copies `t` into `b` on the copy stream, after `after` (an event on the collectives'
    /// stream) when given; bounded by the op timeout from now (a `write` may have waited for
    /// earlier ops to launch first).
    pub(crate) fn copy_in(&self, o: &Op, b: &NcclBuffer, t: &Tensor, after: Option<&cuda::Event>) -> Result<()> {
        self.write_checks(o, b, t)?;
        let done = self
            .dev
            .copy_htod(b.ptr(), t.bytes(), after, Instant::now() + self.op_timeout)
            .map_err(|e| self.backend_err(o.name, o.seq, e))?;
        if !done {
            std::mem::forget(b.mem.clone()); // the pending copy still writes it
            return Err(self.copy_timeout(o, "host-to-device copy"));
        }
        Ok(())
    }

    /// Upload: a new buffer, allocated and filled on the copy stream (pinned staging, polled
    /// with the op deadline): it waits for no collective, and a stalled GPU is a named timeout.
    pub(crate) fn upload_impl(&self, t: &Tensor) -> Result<NcclBuffer> {
        let o = self.begin("upload", false)?;
        let mem = self.dev.alloc_for_copy(t.bytes().len()).map_err(|e| self.backend_err(o.name, o.seq, e))?;
        let b = NcclBuffer { mem: Arc::new(mem), offset: 0, dtype: t.dtype(), shape: t.shape().to_vec() };
        self.copy_in(&o, &b, t, None)?;
        Ok(b)
    }

    /// Download: the buffer's current contents, copied on the copy stream (it synchronises
    /// with the device, not with the collectives queued on the NCCL stream), bounded by the op
    /// deadline; a stalled GPU is a named timeout and the communicator is left alone.
    pub(crate) fn download_impl(&self, b: &NcclBuffer) -> Result<Tensor> {
        let o = self.begin("download", false)?;
        let mut t = Tensor::zeros(b.dtype, &b.shape);
        let done =
            self.dev.copy_dtoh(t.bytes_mut(), b.ptr(), o.issued + self.op_timeout).map_err(|e| self.backend_err(o.name, o.seq, e))?;
        if !done {
            std::mem::forget(b.mem.clone()); // the pending copy still reads it
            return Err(self.copy_timeout(&o, "device-to-host copy"));
        }
        Ok(t)
    }

    /// A caller's buffer: allocated on the copy stream and waited for (bounded), so that it is
    /// valid on every stream at once (a `download` right away, a collective) even while the
    /// collectives' stream is busy.
    pub(crate) fn alloc_impl(&self, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        let o = self.begin("alloc", false)?;
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let mem = self.dev.alloc_for_copy(bytes).map_err(|e| self.backend_err(o.name, o.seq, e))?;
        let b = NcclBuffer { mem: Arc::new(mem), offset: 0, dtype, shape: shape.to_vec() };
        let done = self.dev.copy_htod(b.ptr(), &[], None, o.issued + self.op_timeout).map_err(|e| self.backend_err(o.name, o.seq, e))?;
        if !done {
            std::mem::forget(b.mem.clone());
            return Err(self.copy_timeout(&o, "allocation"));
        }
        Ok(b)
    }

    pub(crate) fn write_impl(&self, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        let o = self.begin("write", false)?;
        self.write_checks(&o, b, t)?;
        // Ordered after every collective issued before it, as on a single stream: each is
        // launched (flush), then the copy stream waits for an event recorded after them.
        self.flush(&o)?;
        let after = self.dev.record().map_err(|e| self.backend_err(o.name, o.seq, e))?;
        self.copy_in(&o, b, t, Some(&after))
    }

    pub(crate) fn view_impl(&self, b: &NcclBuffer, offset: usize, shape: &[usize]) -> Result<NcclBuffer> {
        let numel: usize = shape.iter().product();
        if offset.checked_add(numel).is_none_or(|end| end > b.numel()) {
            return Err(CollectiveError::bad_input(
                BadInputKind::OutBufferSize,
                "view",
                0,
                self.rank,
                format!("a view of {numel} elements at offset {offset} does not fit in a buffer of {}", b.numel()),
            ));
        }
        Ok(NcclBuffer { mem: b.mem.clone(), offset: b.offset + offset * b.dtype.size(), dtype: b.dtype, shape: shape.to_vec() })
    }
}
