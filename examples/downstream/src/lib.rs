//! # concord-example-downstream
//!
//! **One job:** show a backend crate that is not part of Concord running the whole Concord suite.
//! `MyBackend` is a thin newtype over the CPU backend (a real crate would talk to its own
//! transport here); `tests/conformance.rs` is one line: `concord_suites::harness!(MyBackend, name = "mine");`.
#![forbid(unsafe_code)]

use concord_core::{Backend, Capabilities, DType, ReduceOp, Result, Tensor, Work, WorldInfo};
use concord_shm::ShmBackend;

/// A downstream backend. Every method forwards to the CPU backend.
pub struct MyBackend(ShmBackend);

type Buf = <ShmBackend as Backend>::Buffer;

impl Backend for MyBackend {
    type Buffer = Buf;
    fn init(world: &WorldInfo) -> Result<Self> {
        // An option of this backend's own, set through `harness!(…, options = [...])`: its
        // absence means the options did not reach the ranks.
        if world.option("example_greeting") != Some("hello") {
            return Err(concord_core::CollectiveError::Unsupported(
                "MyBackend needs the option example_greeting=hello (tests/conformance.rs sets it)".into(),
            ));
        }
        ShmBackend::init(world).map(MyBackend)
    }
    fn name(&self) -> &str {
        "mine"
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn outstanding(&self) -> usize {
        self.0.outstanding()
    }
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        Ok(self.0.new_group(ranks)?.map(MyBackend))
    }
    fn upload(&self, t: &Tensor) -> Result<Buf> {
        self.0.upload(t)
    }
    fn download(&self, b: &Buf) -> Result<Tensor> {
        self.0.download(b)
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Buf> {
        self.0.alloc(dtype, shape)
    }
    fn write(&self, b: &Buf, t: &Tensor) -> Result<()> {
        self.0.write(b, t)
    }
    fn view(&self, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        self.0.view(b, offset, shape)
    }
    fn buffer_addr(&self, b: &Buf) -> usize {
        self.0.buffer_addr(b)
    }
    fn buffer_dtype(&self, b: &Buf) -> DType {
        self.0.buffer_dtype(b)
    }
    fn buffer_shape(&self, b: &Buf) -> Vec<usize> {
        self.0.buffer_shape(b)
    }
    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.0.all_reduce(x, op)
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.0.all_reduce_(x, op)
    }
    fn all_reduce_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.0.all_reduce_coalesced(xs, op)
    }
    fn all_reduce_coalesced_(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.0.all_reduce_coalesced_(xs, op)
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        self.0.all_gather_into_tensor(x)
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        self.0.all_gather_into_tensor_out(x, out)
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        self.0.all_gather_into_tensor_coalesced(xs)
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.0.reduce_scatter_tensor(x, op)
    }
    fn reduce_scatter_tensor_out(&self, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        self.0.reduce_scatter_tensor_out(x, op, out)
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.0.reduce_scatter_tensor_coalesced(xs, op)
    }
    fn all_to_all_single(&self, x: &Buf, out_splits: Option<&[usize]>, in_splits: Option<&[usize]>) -> Result<Work<Buf>> {
        self.0.all_to_all_single(x, out_splits, in_splits)
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.0.broadcast(x, src)
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.0.broadcast_(x, src)
    }
    fn permute_tensor(&self, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        self.0.permute_tensor(x, src_dst)
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        self.0.reduce(x, op, root)
    }
    fn gather(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.0.gather(x, root)
    }
    fn scatter(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        self.0.scatter(x, root)
    }
    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        self.0.send(x, dst)
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        self.0.recv(out, src)
    }
    fn barrier(&self) -> Result<Work<()>> {
        self.0.barrier()
    }
}
