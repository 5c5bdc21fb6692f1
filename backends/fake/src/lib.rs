//! # concord-fake
//!
//! **One job:** PyTorch's fake process group as a [`Backend`]: no communication at all, every
//! collective completes at once ([`Work::done`]) with outputs of the right shapes, so
//! single-process code paths can run with any world size.
//!
//! ## Contract
//! * Every op MUST complete at once and MUST return outputs of the shapes the real op has.
//! * Values are local stand-ins, not results (`moves_data: false`):
//!   all_reduce / reduce / broadcast / permute_tensor return the local input unchanged (a copy
//!   for out-of-place ops, the very buffer for in-place ones); all_gather / gather copy the local
//!   input into every chunk; reduce_scatter / scatter return the local input's chunk `rank`;
//!   all_to_all_single copies the local input's piece for this rank into the rows from this
//!   rank and zero-fills the rows from other ranks; recv leaves its buffer unchanged.
//! * Only local bad input is caught (at issue time), by the core rule table's
//!   [`concord_core::validate_local`] over the rank's [`CallDesc`] (`validates_across_ranks:
//!   false`).
//! * Option `fail_all=1` ([`WorldInfo::option`]): every collective fails at issue time with
//!   [`CollectiveError::Injected`].
#![forbid(unsafe_code)]

use concord_core::{
    validate_local, Backend, CallDesc, CallOp, Capabilities, CollectiveError, DType, OutstandingCounter, ReduceOp, Result, Tensor,
    TensorDesc, Variant, Work, WorkMeta, WorldInfo,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Host storage shared by a buffer and its views.
struct Storage {
    bytes: Mutex<Box<[u8]>>,
    /// Address of the first byte (stable: the box is never reallocated).
    addr: usize,
}

/// A fake "device" buffer: host memory, shared by clones and views.
#[derive(Clone)]
pub struct FakeBuffer {
    storage: Arc<Storage>,
    byte_off: usize,
    dtype: DType,
    shape: Vec<usize>,
}

impl FakeBuffer {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    fn read(&self) -> Vec<u8> {
        self.storage.bytes.lock().unwrap_or_else(|e| e.into_inner())[self.byte_off..self.byte_off + self.nbytes()].to_vec()
    }
    fn write_at(&self, at: usize, src: &[u8]) {
        let mut g = self.storage.bytes.lock().unwrap_or_else(|e| e.into_inner());
        g[self.byte_off + at..self.byte_off + at + src.len()].copy_from_slice(src);
    }
    fn range(&self) -> (usize, usize) {
        (self.storage.addr + self.byte_off, self.nbytes())
    }
}

/// The fake backend of one rank.
pub struct FakeBackend {
    rank: usize,
    world_size: usize,
    fail_all: bool,
    seq: AtomicU64,
    counter: OutstandingCounter,
}

impl FakeBackend {
    fn meta(&self, op: &str, seq: u64) -> WorkMeta {
        WorkMeta { backend: "fake".into(), op: op.into(), seq, rank: self.rank }
    }
    /// Next sequence number, or the injected failure.
    fn start(&self, op: &str) -> Result<u64> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_all {
            return Err(CollectiveError::Injected { op: op.into(), seq });
        }
        Ok(seq)
    }
    fn done<T>(&self, op: &str, seq: u64, v: T) -> Result<Work<T>> {
        Ok(Work::done(v, self.meta(op, seq), &self.counter))
    }
    /// The rank's call of `op` over `xs` (fill in the arguments that apply).
    fn desc(&self, op: CallOp, variant: Variant, xs: &[FakeBuffer]) -> CallDesc {
        let mut d = CallDesc::new(op, variant, self.rank);
        d.inputs = xs.iter().map(|x| TensorDesc::new(x.dtype, &x.shape)).collect();
        d
    }
    /// The rank's call with a caller's output buffer (aliasing from the addresses).
    fn desc_out(&self, op: CallOp, x: &FakeBuffer, out: &FakeBuffer) -> CallDesc {
        let mut d = self.desc(op, Variant::OutBuf, std::slice::from_ref(x));
        d.outputs.push(TensorDesc::new(out.dtype, &out.shape));
        let ((a, la), (b, lb)) = (x.range(), out.range());
        d.aliased = la > 0 && lb > 0 && a < b + lb && b < a + la;
        d
    }
    /// The local rules of the core rule table.
    fn check(&self, name: &str, seq: u64, d: &CallDesc) -> Result<()> {
        validate_local(d, self.world_size, &self.capabilities()).map_err(|e| e.into_error(name, seq, self.rank))
    }
    fn reduce_desc(&self, op: CallOp, variant: Variant, xs: &[FakeBuffer], r: ReduceOp) -> CallDesc {
        let mut d = self.desc(op, variant, xs);
        d.reduce = Some(r);
        d
    }
    fn rooted(&self, op: CallOp, x: &FakeBuffer, root: usize) -> CallDesc {
        let mut d = self.desc(op, Variant::Out, std::slice::from_ref(x));
        d.root = Some(root);
        d
    }
    fn new_buf(&self, dtype: DType, shape: &[usize]) -> FakeBuffer {
        let n = shape.iter().product::<usize>() * dtype.size();
        let bytes = vec![0u8; n.max(1)].into_boxed_slice();
        let addr = bytes.as_ptr() as usize;
        FakeBuffer { storage: Arc::new(Storage { bytes: Mutex::new(bytes), addr }), byte_off: 0, dtype, shape: shape.to_vec() }
    }
    fn copy_of(&self, x: &FakeBuffer) -> FakeBuffer {
        let b = self.new_buf(x.dtype, &x.shape);
        b.write_at(0, &x.read());
        b
    }
    fn gathered_shape(&self, x: &FakeBuffer) -> Vec<usize> {
        match x.shape.split_first() {
            None => vec![self.world_size],
            Some((d0, rest)) => std::iter::once(d0 * self.world_size).chain(rest.iter().copied()).collect(),
        }
    }
    fn fill_gather(&self, x: &FakeBuffer, out: &FakeBuffer) {
        let data = x.read();
        for r in 0..self.world_size {
            out.write_at(r * data.len(), &data);
        }
    }
    /// Chunk `rank` of dim 0 (after validation: at least one dim, divisible).
    fn my_chunk(&self, x: &FakeBuffer) -> (Vec<usize>, Vec<u8>) {
        let mut shape = x.shape.clone();
        shape[0] /= self.world_size;
        let nb = x.nbytes() / self.world_size;
        (shape, x.read()[self.rank * nb..(self.rank + 1) * nb].to_vec())
    }
}

impl Backend for FakeBackend {
    type Buffer = FakeBuffer;

    fn init(world: &WorldInfo) -> Result<Self> {
        if world.world_size == 0 || world.rank >= world.world_size {
            return Err(CollectiveError::Backend(format!("rank {} of a world of {}", world.rank, world.world_size)));
        }
        Ok(FakeBackend {
            rank: world.rank,
            world_size: world.world_size,
            fail_all: world.flag("fail_all", false).map_err(CollectiveError::Backend)?,
            seq: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
        })
    }
    fn name(&self) -> &str {
        "fake"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::full(1 << 16);
        c.moves_data = false;
        c.validates_across_ranks = false;
        c
    }
    fn outstanding(&self) -> usize {
        self.counter.get()
    }
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        let seq = self.start("new_group")?;
        let mut d = self.desc(CallOp::NewGroup, Variant::Out, &[]);
        d.group = Some(ranks.to_vec());
        self.check("new_group", seq, &d)?;
        Ok(ranks.iter().position(|&r| r == self.rank).map(|pos| FakeBackend {
            rank: pos,
            world_size: ranks.len(),
            fail_all: self.fail_all,
            seq: AtomicU64::new(0),
            counter: OutstandingCounter::default(),
        }))
    }

    fn upload(&self, t: &Tensor) -> Result<FakeBuffer> {
        let b = self.new_buf(t.dtype(), t.shape());
        b.write_at(0, t.bytes());
        Ok(b)
    }
    fn download(&self, b: &FakeBuffer) -> Result<Tensor> {
        Ok(Tensor::from_bytes(b.dtype, &b.shape, &b.read()))
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<FakeBuffer> {
        if shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d)).is_none() {
            return Err(CollectiveError::Backend(format!("a {dtype}{shape:?} buffer does not fit in the address space")));
        }
        Ok(self.new_buf(dtype, shape))
    }
    fn write(&self, b: &FakeBuffer, t: &Tensor) -> Result<()> {
        if t.dtype() != b.dtype || t.numel() != b.numel() {
            return Err(CollectiveError::Backend(format!("write of {}{:?} into {}{:?}", t.dtype(), t.shape(), b.dtype, b.shape)));
        }
        b.write_at(0, t.bytes());
        Ok(())
    }
    fn view(&self, b: &FakeBuffer, offset: usize, shape: &[usize]) -> Result<FakeBuffer> {
        let end = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_add(offset));
        if end.is_none_or(|end| end > b.numel()) {
            return Err(CollectiveError::Backend(format!("view {shape:?} at element {offset} exceeds {} elements", b.numel())));
        }
        Ok(FakeBuffer { storage: b.storage.clone(), byte_off: b.byte_off + offset * b.dtype.size(), dtype: b.dtype, shape: shape.to_vec() })
    }
    fn buffer_addr(&self, b: &FakeBuffer) -> usize {
        b.storage.addr + b.byte_off
    }
    fn buffer_dtype(&self, b: &FakeBuffer) -> DType {
        b.dtype
    }
    fn buffer_shape(&self, b: &FakeBuffer) -> Vec<usize> {
        b.shape.clone()
    }

    fn all_reduce(&self, x: &FakeBuffer, op: ReduceOp) -> Result<Work<FakeBuffer>> {
        let seq = self.start("all_reduce")?;
        self.check("all_reduce", seq, &self.reduce_desc(CallOp::AllReduce, Variant::Out, std::slice::from_ref(x), op))?;
        self.done("all_reduce", seq, self.copy_of(x))
    }
    fn all_reduce_(&self, x: &FakeBuffer, op: ReduceOp) -> Result<Work<FakeBuffer>> {
        let seq = self.start("all_reduce_")?;
        self.check("all_reduce_", seq, &self.reduce_desc(CallOp::AllReduce, Variant::InPlace, std::slice::from_ref(x), op))?;
        self.done("all_reduce_", seq, x.clone())
    }
    fn all_reduce_coalesced(&self, xs: &[FakeBuffer], op: ReduceOp) -> Result<Work<Vec<FakeBuffer>>> {
        let seq = self.start("all_reduce_coalesced")?;
        self.check("all_reduce_coalesced", seq, &self.reduce_desc(CallOp::AllReduce, Variant::Coalesced, xs, op))?;
        self.done("all_reduce_coalesced", seq, xs.iter().map(|x| self.copy_of(x)).collect())
    }
    fn all_reduce_coalesced_(&self, xs: &[FakeBuffer], op: ReduceOp) -> Result<Work<Vec<FakeBuffer>>> {
        let seq = self.start("all_reduce_coalesced_")?;
        self.check("all_reduce_coalesced_", seq, &self.reduce_desc(CallOp::AllReduce, Variant::CoalescedInPlace, xs, op))?;
        self.done("all_reduce_coalesced_", seq, xs.to_vec())
    }
    fn all_gather_into_tensor(&self, x: &FakeBuffer) -> Result<Work<FakeBuffer>> {
        let seq = self.start("all_gather_into_tensor")?;
        self.check("all_gather_into_tensor", seq, &self.desc(CallOp::AllGather, Variant::Out, std::slice::from_ref(x)))?;
        let out = self.new_buf(x.dtype, &self.gathered_shape(x));
        self.fill_gather(x, &out);
        self.done("all_gather_into_tensor", seq, out)
    }
    fn all_gather_into_tensor_out(&self, x: &FakeBuffer, out: &FakeBuffer) -> Result<Work<FakeBuffer>> {
        let op = "all_gather_into_tensor_out";
        let seq = self.start(op)?;
        self.check(op, seq, &self.desc_out(CallOp::AllGather, x, out))?;
        self.fill_gather(x, out);
        self.done(op, seq, out.clone())
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[FakeBuffer]) -> Result<Work<Vec<FakeBuffer>>> {
        let seq = self.start("all_gather_into_tensor_coalesced")?;
        self.check("all_gather_into_tensor_coalesced", seq, &self.desc(CallOp::AllGather, Variant::Coalesced, xs))?;
        let outs = xs
            .iter()
            .map(|x| {
                let o = self.new_buf(x.dtype, &self.gathered_shape(x));
                self.fill_gather(x, &o);
                o
            })
            .collect();
        self.done("all_gather_into_tensor_coalesced", seq, outs)
    }
    fn reduce_scatter_tensor(&self, x: &FakeBuffer, op: ReduceOp) -> Result<Work<FakeBuffer>> {
        let name = "reduce_scatter_tensor";
        let seq = self.start(name)?;
        self.check(name, seq, &self.reduce_desc(CallOp::ReduceScatter, Variant::Out, std::slice::from_ref(x), op))?;
        let (shape, bytes) = self.my_chunk(x);
        let out = self.new_buf(x.dtype, &shape);
        out.write_at(0, &bytes);
        self.done(name, seq, out)
    }
    fn reduce_scatter_tensor_out(&self, x: &FakeBuffer, op: ReduceOp, out: &FakeBuffer) -> Result<Work<FakeBuffer>> {
        let name = "reduce_scatter_tensor_out";
        let seq = self.start(name)?;
        let mut d = self.desc_out(CallOp::ReduceScatter, x, out);
        d.reduce = Some(op);
        self.check(name, seq, &d)?;
        out.write_at(0, &self.my_chunk(x).1);
        self.done(name, seq, out.clone())
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[FakeBuffer], op: ReduceOp) -> Result<Work<Vec<FakeBuffer>>> {
        let name = "reduce_scatter_tensor_coalesced";
        let seq = self.start(name)?;
        self.check(name, seq, &self.reduce_desc(CallOp::ReduceScatter, Variant::Coalesced, xs, op))?;
        let mut outs = Vec::new();
        for x in xs {
            let (shape, bytes) = self.my_chunk(x);
            let o = self.new_buf(x.dtype, &shape);
            o.write_at(0, &bytes);
            outs.push(o);
        }
        self.done(name, seq, outs)
    }
    fn all_to_all_single(
        &self,
        x: &FakeBuffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<Work<FakeBuffer>> {
        let name = "all_to_all_single";
        let seq = self.start(name)?;
        let mut d = self.desc(CallOp::AllToAll, Variant::Out, std::slice::from_ref(x));
        d.in_splits = input_splits.map(<[usize]>::to_vec);
        d.out_splits = output_splits.map(<[usize]>::to_vec);
        self.check(name, seq, &d)?;
        let (ins, outs) = (d.input_splits(self.world_size), d.output_splits(self.world_size));
        let row = x.shape[1..].iter().product::<usize>() * x.dtype.size();
        let mut shape = x.shape.clone();
        shape[0] = outs.iter().sum();
        let out = self.new_buf(x.dtype, &shape);
        let from: usize = ins[..self.rank].iter().sum();
        let to: usize = outs[..self.rank].iter().sum();
        // What this rank sends itself, as far as its output has room (only peers can tell a
        // mismatch, and this backend has none).
        let rows = ins[self.rank].min(outs[self.rank]);
        out.write_at(to * row, &x.read()[from * row..(from + rows) * row]);
        self.done(name, seq, out)
    }
    fn broadcast(&self, x: &FakeBuffer, src: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("broadcast")?;
        self.check("broadcast", seq, &self.rooted(CallOp::Broadcast, x, src))?;
        self.done("broadcast", seq, self.copy_of(x))
    }
    fn broadcast_(&self, x: &FakeBuffer, src: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("broadcast_")?;
        let mut d = self.rooted(CallOp::Broadcast, x, src);
        d.variant = Variant::InPlace;
        self.check("broadcast_", seq, &d)?;
        self.done("broadcast_", seq, x.clone())
    }
    fn permute_tensor(&self, x: &FakeBuffer, src_dst: &[usize]) -> Result<Work<FakeBuffer>> {
        let seq = self.start("permute_tensor")?;
        let mut d = self.desc(CallOp::Permute, Variant::Out, std::slice::from_ref(x));
        d.perm = Some(src_dst.to_vec());
        self.check("permute_tensor", seq, &d)?;
        self.done("permute_tensor", seq, self.copy_of(x))
    }
    fn reduce(&self, x: &FakeBuffer, op: ReduceOp, root: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("reduce")?;
        let mut d = self.rooted(CallOp::Reduce, x, root);
        d.reduce = Some(op);
        self.check("reduce", seq, &d)?;
        self.done("reduce", seq, self.copy_of(x))
    }
    fn gather(&self, x: &FakeBuffer, root: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("gather")?;
        self.check("gather", seq, &self.rooted(CallOp::Gather, x, root))?;
        let out = self.new_buf(x.dtype, &self.gathered_shape(x));
        self.fill_gather(x, &out);
        self.done("gather", seq, out)
    }
    fn scatter(&self, x: &FakeBuffer, root: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("scatter")?;
        self.check("scatter", seq, &self.rooted(CallOp::Scatter, x, root))?;
        let (shape, bytes) = self.my_chunk(x);
        let out = self.new_buf(x.dtype, &shape);
        out.write_at(0, &bytes);
        self.done("scatter", seq, out)
    }
    fn send(&self, x: &FakeBuffer, dst: usize) -> Result<Work<()>> {
        let seq = self.start("send")?;
        self.check("send", seq, &CallDesc::p2p(CallOp::Send, self.rank, TensorDesc::new(x.dtype, &x.shape), dst))?;
        self.done("send", seq, ())
    }
    fn recv(&self, out: &FakeBuffer, src: usize) -> Result<Work<FakeBuffer>> {
        let seq = self.start("recv")?;
        self.check("recv", seq, &CallDesc::p2p(CallOp::Recv, self.rank, TensorDesc::new(out.dtype, &out.shape), src))?;
        self.done("recv", seq, out.clone())
    }
    fn barrier(&self) -> Result<Work<()>> {
        let seq = self.start("barrier")?;
        self.done("barrier", seq, ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::BadInputKind;
    use std::time::Duration;

    fn fake(rank: usize, ws: usize, opts: &[(&str, &str)]) -> FakeBackend {
        FakeBackend::init(&WorldInfo {
            rank,
            world_size: ws,
            store_path: "/nonexistent".into(),
            world_id: "fake".into(),
            op_timeout: Duration::from_secs(1),
            options: opts.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
        .unwrap()
    }
    const T: Duration = Duration::from_millis(10);

    #[test]
    fn ops_complete_at_once_with_the_right_shapes() {
        let b = fake(1, 4, &[]);
        let t = Tensor::from_vec(&[4, 2], (0..8).map(|i| i as f32).collect());
        let x = b.upload(&t).unwrap();
        let w = b.all_reduce(&x, ReduceOp::Sum).unwrap();
        assert!(w.is_completed());
        let y = w.into_value(T).unwrap();
        assert_ne!(b.buffer_addr(&y), b.buffer_addr(&x));
        assert_eq!(b.download(&y).unwrap(), t, "all_reduce returns the input unchanged");
        assert_eq!(b.buffer_addr(b.all_reduce_(&x, ReduceOp::Sum).unwrap().peek()), b.buffer_addr(&x));
        let g = b.all_gather_into_tensor(&x).unwrap().into_value(T).unwrap();
        assert_eq!(b.download(&g).unwrap(), Tensor::cat_rows(DType::F32, &[2], &[t.clone(), t.clone(), t.clone(), t.clone()]));
        let z = b.upload(&Tensor::from_vec(&[], vec![5i8])).unwrap();
        let gz = b.all_gather_into_tensor(&z).unwrap().into_value(T).unwrap();
        assert_eq!(b.download(&gz).unwrap(), Tensor::from_vec(&[4], vec![5i8; 4]));
        let rs = b.reduce_scatter_tensor(&x, ReduceOp::Max).unwrap().into_value(T).unwrap();
        assert_eq!(b.download(&rs).unwrap(), t.slice_rows(1, 1));
        let a2a = b.all_to_all_single(&x, Some(&[0, 1, 3, 0]), Some(&[1, 1, 1, 1])).unwrap().into_value(T).unwrap();
        assert_eq!(b.buffer_shape(&a2a), vec![4, 2]);
        assert_eq!(b.download(&a2a).unwrap().slice_rows(0, 1), t.slice_rows(1, 1));
        assert_eq!(b.buffer_shape(&b.gather(&x, 0).unwrap().into_value(T).unwrap()), vec![16, 2]);
        assert_eq!(b.buffer_shape(&b.scatter(&x, 0).unwrap().into_value(T).unwrap()), vec![1, 2]);
        b.send(&x, 0).unwrap().wait(T).unwrap();
        b.barrier().unwrap().wait(T).unwrap();
        assert_eq!(b.outstanding(), 0);
        let g = b.new_group(&[3, 1]).unwrap().unwrap();
        assert_eq!((g.rank(), g.world_size()), (1, 2));
        assert!(b.new_group(&[0]).unwrap().is_none());
        assert!(!b.capabilities().moves_data && !b.capabilities().validates_across_ranks);
    }

    #[test]
    fn local_bad_input_is_named() {
        let b = fake(0, 2, &[]);
        let x = b.upload(&Tensor::zeros(DType::F32, &[3])).unwrap();
        let kind = |r: Result<Work<FakeBuffer>>| r.err().and_then(|e| e.bad_input_kind());
        assert_eq!(kind(b.reduce_scatter_tensor(&x, ReduceOp::Sum)), Some(BadInputKind::Indivisible));
        assert_eq!(kind(b.all_reduce(&x, ReduceOp::BXor)), Some(BadInputKind::UnsupportedDType));
        assert_eq!(kind(b.broadcast(&x, 2)), Some(BadInputKind::BadRoot));
        assert_eq!(kind(b.permute_tensor(&x, &[1, 1])), Some(BadInputKind::BadPermutation));
        assert_eq!(kind(b.all_to_all_single(&x, None, Some(&[1, 1]))), Some(BadInputKind::Indivisible));
        let o = b.alloc(DType::F32, &[5]).unwrap();
        assert_eq!(kind(b.all_gather_into_tensor_out(&x, &o)), Some(BadInputKind::OutBufferSize));
        // The rule table's precedence: output dtype before size, size before aliasing.
        let o64 = b.alloc(DType::F64, &[5]).unwrap();
        assert_eq!(kind(b.all_gather_into_tensor_out(&x, &o64)), Some(BadInputKind::DTypeMismatch));
        let big = b.alloc(DType::F32, &[6]).unwrap();
        let view = b.view(&big, 0, &[3]).unwrap();
        assert_eq!(kind(b.all_gather_into_tensor_out(&view, &big)), Some(BadInputKind::Aliasing));
        let z = b.upload(&Tensor::zeros(DType::F32, &[])).unwrap();
        assert_eq!(kind(b.scatter(&z, 0)), Some(BadInputKind::ZeroDim));
        assert_eq!(kind(b.scatter(&z, 5)), Some(BadInputKind::BadRoot));
        assert_eq!(kind(b.recv(&x, 0)), Some(BadInputKind::BadPeer));
        assert_eq!(b.new_group(&[1, 1]).err().and_then(|e| e.bad_input_kind()), Some(BadInputKind::BadGroup));
        assert!(b.alloc(DType::F64, &[usize::MAX / 4, 2]).is_err(), "size overflow is an error, not a panic");
        assert!(b.view(&x, usize::MAX, &[2]).is_err(), "offset overflow is an error, not a panic");
    }

    #[test]
    fn fail_all_makes_every_collective_fail_with_injected() {
        let b = fake(0, 2, &[("fail_all", "1")]);
        let x = b.upload(&Tensor::zeros(DType::F32, &[2])).unwrap();
        let e = b.all_reduce(&x, ReduceOp::Sum).err().unwrap();
        assert_eq!(e.name(), "injected");
        assert_eq!(b.barrier().err().unwrap().name(), "injected");
        assert_eq!(b.recv(&x, 1).err().unwrap().name(), "injected");
        assert_eq!(b.download(&x).unwrap(), Tensor::zeros(DType::F32, &[2]), "buffers still work");
    }
}
