//! Device buffers: [`NcclBuffer`] (a typed view of Arc-shared device memory) and the buffer
//! entry points of the [`concord_core::Backend`] impl — upload, download, alloc, write, view —
//! with the host↔device copies ordered on the rank's one stream.

use crate::cuda::{self, DevMem};
use crate::issue::Op;
use crate::NcclBackend;
use concord_core::fault::{point, Action};
use concord_core::{BadInputKind, CollectiveError, DType, Result, Tensor};
use std::sync::Arc;

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

    pub(crate) fn copy_in(&self, o: &Op, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        self.write_checks(o, b, t)?;
        // A pageable host-to-device copy waits for the stream: drain it first, with a deadline.
        self.drain(o)?;
        self.dev.htod(b.ptr(), t.bytes()).map_err(|e| self.backend_err(o.name, o.seq, e))
    }

    pub(crate) fn upload_impl(&self, t: &Tensor) -> Result<NcclBuffer> {
        let o = self.begin("upload", false)?;
        let b = self.alloc_buf(&o, t.dtype(), t.shape())?;
        // A new buffer: no queued collective can use it, so no flush.
        self.copy_in(&o, &b, t)?;
        Ok(b)
    }

    pub(crate) fn download_impl(&self, b: &NcclBuffer) -> Result<Tensor> {
        let o = self.begin("download", false)?;
        self.drain(&o)?;
        let mut t = Tensor::zeros(b.dtype, &b.shape);
        if b.nbytes() > 0 {
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(t.bytes_mut(), b.ptr()) }
                .map_err(|e| self.backend_err("download", o.seq, cuda::derr("cuMemcpyDtoH", e)))?;
        }
        Ok(t)
    }

    pub(crate) fn alloc_impl(&self, dtype: DType, shape: &[usize]) -> Result<NcclBuffer> {
        let o = self.begin("alloc", false)?;
        self.alloc_buf(&o, dtype, shape)
    }

    pub(crate) fn write_impl(&self, b: &NcclBuffer, t: &Tensor) -> Result<()> {
        let o = self.begin("write", false)?;
        self.write_checks(&o, b, t)?;
        // Ordered after every collective issued before it, as on a single stream.
        self.flush(&o)?;
        self.copy_in(&o, b, t)
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
