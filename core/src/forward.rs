//! [`forward!`](macro@crate::forward): the methods of a wrapper backend that only pass a call on to
//! the backend it wraps, written once for every wrapper (the test wrappers with a bug in one
//! method, a downstream backend over a built-in one).

/// Writes [`Backend`](crate::Backend) methods that pass the call on, unchanged, to a field of
/// `self` holding another backend with the same `Buffer` type. Inside `impl Backend for W`:
///
/// ```ignore
/// concord_core::forward!(inner => rank, world_size, capabilities, outstanding, buffers, collectives, p2p);
/// ```
///
/// The field is a name or a tuple index (`0`); the rest are the trait's method names, or groups:
/// `buffers` (`upload` … `buffer_shape`), `collectives` (every collective but `send` / `recv`:
/// `all_reduce` … `barrier`), `p2p` (`send`, `recv`), `fused` (the four fused ops and the two
/// low-contention ones; without it the trait's unfused defaults run over the wrapper's own
/// collectives). `init`, `name` and `new_group` build or name the wrapper itself and are always
/// written by hand. A method named here and written by hand too is a compile error ("duplicate
/// definitions"): leave the overridden one out of the list.
#[macro_export]
macro_rules! forward {
    (@ $f:tt buffers) => {
        $crate::forward!($f => upload, download, alloc, write, view, buffer_addr, buffer_dtype, buffer_shape);
    };
    (@ $f:tt collectives) => {
        $crate::forward!($f => all_reduce, all_reduce_, all_reduce_coalesced, all_reduce_coalesced_,
            all_gather_into_tensor, all_gather_into_tensor_out, all_gather_into_tensor_coalesced,
            reduce_scatter_tensor, reduce_scatter_tensor_out, reduce_scatter_tensor_coalesced,
            all_to_all_single, broadcast, broadcast_, permute_tensor, reduce, gather, scatter, barrier);
    };
    (@ $f:tt p2p) => {
        $crate::forward!($f => send, recv);
    };
    (@ $f:tt fused) => {
        $crate::forward!($f => fused_all_gather_matmul, fused_all_gather_scaled_matmul, fused_matmul_reduce_scatter,
            fused_scaled_matmul_reduce_scatter, low_contention_all_gather, low_contention_reduce_scatter);
    };
    (@ $f:tt rank) => { fn rank(&self) -> usize { self.$f.rank() } };
    (@ $f:tt world_size) => { fn world_size(&self) -> usize { self.$f.world_size() } };
    (@ $f:tt capabilities) => { fn capabilities(&self) -> $crate::Capabilities { self.$f.capabilities() } };
    (@ $f:tt outstanding) => { fn outstanding(&self) -> usize { self.$f.outstanding() } };
    (@ $f:tt fault_hooks) => {
        fn fault_hooks(&self) -> Vec<(String, $crate::fault::Action)> { self.$f.fault_hooks() }
    };
    (@ $f:tt upload) => {
        fn upload(&self, t: &$crate::Tensor) -> $crate::Result<Self::Buffer> { self.$f.upload(t) }
    };
    (@ $f:tt download) => {
        fn download(&self, b: &Self::Buffer) -> $crate::Result<$crate::Tensor> { self.$f.download(b) }
    };
    (@ $f:tt alloc) => {
        fn alloc(&self, dtype: $crate::DType, shape: &[usize]) -> $crate::Result<Self::Buffer> { self.$f.alloc(dtype, shape) }
    };
    (@ $f:tt write) => {
        fn write(&self, b: &Self::Buffer, t: &$crate::Tensor) -> $crate::Result<()> { self.$f.write(b, t) }
    };
    (@ $f:tt view) => {
        fn view(&self, b: &Self::Buffer, offset: usize, shape: &[usize]) -> $crate::Result<Self::Buffer> {
            self.$f.view(b, offset, shape)
        }
    };
    (@ $f:tt buffer_addr) => { fn buffer_addr(&self, b: &Self::Buffer) -> usize { self.$f.buffer_addr(b) } };
    (@ $f:tt buffer_dtype) => { fn buffer_dtype(&self, b: &Self::Buffer) -> $crate::DType { self.$f.buffer_dtype(b) } };
    (@ $f:tt buffer_shape) => { fn buffer_shape(&self, b: &Self::Buffer) -> Vec<usize> { self.$f.buffer_shape(b) } };
    (@ $f:tt all_reduce) => {
        fn all_reduce(&self, x: &Self::Buffer, op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.all_reduce(x, op)
        }
    };
    (@ $f:tt all_reduce_) => {
        fn all_reduce_(&self, x: &Self::Buffer, op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.all_reduce_(x, op)
        }
    };
    (@ $f:tt all_reduce_coalesced) => {
        fn all_reduce_coalesced(&self, xs: &[Self::Buffer], op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Vec<Self::Buffer>>> {
            self.$f.all_reduce_coalesced(xs, op)
        }
    };
    (@ $f:tt all_reduce_coalesced_) => {
        fn all_reduce_coalesced_(&self, xs: &[Self::Buffer], op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Vec<Self::Buffer>>> {
            self.$f.all_reduce_coalesced_(xs, op)
        }
    };
    (@ $f:tt all_gather_into_tensor) => {
        fn all_gather_into_tensor(&self, x: &Self::Buffer) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.all_gather_into_tensor(x)
        }
    };
    (@ $f:tt all_gather_into_tensor_out) => {
        fn all_gather_into_tensor_out(&self, x: &Self::Buffer, out: &Self::Buffer) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.all_gather_into_tensor_out(x, out)
        }
    };
    (@ $f:tt all_gather_into_tensor_coalesced) => {
        fn all_gather_into_tensor_coalesced(&self, xs: &[Self::Buffer]) -> $crate::Result<$crate::Work<Vec<Self::Buffer>>> {
            self.$f.all_gather_into_tensor_coalesced(xs)
        }
    };
    (@ $f:tt reduce_scatter_tensor) => {
        fn reduce_scatter_tensor(&self, x: &Self::Buffer, op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.reduce_scatter_tensor(x, op)
        }
    };
    (@ $f:tt reduce_scatter_tensor_out) => {
        fn reduce_scatter_tensor_out(
            &self,
            x: &Self::Buffer,
            op: $crate::ReduceOp,
            out: &Self::Buffer,
        ) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.reduce_scatter_tensor_out(x, op, out)
        }
    };
    (@ $f:tt reduce_scatter_tensor_coalesced) => {
        fn reduce_scatter_tensor_coalesced(
            &self,
            xs: &[Self::Buffer],
            op: $crate::ReduceOp,
        ) -> $crate::Result<$crate::Work<Vec<Self::Buffer>>> {
            self.$f.reduce_scatter_tensor_coalesced(xs, op)
        }
    };
    (@ $f:tt all_to_all_single) => {
        fn all_to_all_single(
            &self,
            x: &Self::Buffer,
            output_splits: Option<&[usize]>,
            input_splits: Option<&[usize]>,
        ) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.all_to_all_single(x, output_splits, input_splits)
        }
    };
    (@ $f:tt broadcast) => {
        fn broadcast(&self, x: &Self::Buffer, src: usize) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.broadcast(x, src)
        }
    };
    (@ $f:tt broadcast_) => {
        fn broadcast_(&self, x: &Self::Buffer, src: usize) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.broadcast_(x, src)
        }
    };
    (@ $f:tt permute_tensor) => {
        fn permute_tensor(&self, x: &Self::Buffer, src_dst: &[usize]) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.permute_tensor(x, src_dst)
        }
    };
    (@ $f:tt reduce) => {
        fn reduce(&self, x: &Self::Buffer, op: $crate::ReduceOp, root: usize) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.reduce(x, op, root)
        }
    };
    (@ $f:tt gather) => {
        fn gather(&self, x: &Self::Buffer, root: usize) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.gather(x, root)
        }
    };
    (@ $f:tt scatter) => {
        fn scatter(&self, x: &Self::Buffer, root: usize) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.scatter(x, root)
        }
    };
    (@ $f:tt send) => {
        fn send(&self, x: &Self::Buffer, dst: usize) -> $crate::Result<$crate::Work<()>> { self.$f.send(x, dst) }
    };
    (@ $f:tt recv) => {
        fn recv(&self, out: &Self::Buffer, src: usize) -> $crate::Result<$crate::Work<Self::Buffer>> { self.$f.recv(out, src) }
    };
    (@ $f:tt barrier) => { fn barrier(&self) -> $crate::Result<$crate::Work<()>> { self.$f.barrier() } };
    (@ $f:tt fused_all_gather_matmul) => {
        fn fused_all_gather_matmul(
            &self,
            a_shard: &Self::Buffer,
            bs: &[Self::Buffer],
            gather_dim: usize,
        ) -> $crate::Result<$crate::Work<$crate::fused::Gathered<Self::Buffer>>> {
            self.$f.fused_all_gather_matmul(a_shard, bs, gather_dim)
        }
    };
    (@ $f:tt fused_all_gather_scaled_matmul) => {
        fn fused_all_gather_scaled_matmul(
            &self,
            a_shard: &Self::Buffer,
            bs: &[Self::Buffer],
            gather_dim: usize,
            scaling: &$crate::Scaling,
        ) -> $crate::Result<$crate::Work<$crate::fused::Gathered<Self::Buffer>>> {
            self.$f.fused_all_gather_scaled_matmul(a_shard, bs, gather_dim, scaling)
        }
    };
    (@ $f:tt fused_matmul_reduce_scatter) => {
        fn fused_matmul_reduce_scatter(
            &self,
            a: &Self::Buffer,
            b: &Self::Buffer,
            op: $crate::ReduceOp,
            scatter_dim: usize,
        ) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.fused_matmul_reduce_scatter(a, b, op, scatter_dim)
        }
    };
    (@ $f:tt fused_scaled_matmul_reduce_scatter) => {
        fn fused_scaled_matmul_reduce_scatter(
            &self,
            a: &Self::Buffer,
            b: &Self::Buffer,
            op: $crate::ReduceOp,
            scatter_dim: usize,
            scaling: &$crate::Scaling,
        ) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.fused_scaled_matmul_reduce_scatter(a, b, op, scatter_dim, scaling)
        }
    };
    (@ $f:tt low_contention_all_gather) => {
        fn low_contention_all_gather(&self, x: &Self::Buffer) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.low_contention_all_gather(x)
        }
    };
    (@ $f:tt low_contention_reduce_scatter) => {
        fn low_contention_reduce_scatter(&self, x: &Self::Buffer, op: $crate::ReduceOp) -> $crate::Result<$crate::Work<Self::Buffer>> {
            self.$f.low_contention_reduce_scatter(x, op)
        }
    };
    ($f:tt => $($m:ident),+ $(,)?) => { $( $crate::forward!(@ $f $m); )+ };
}
