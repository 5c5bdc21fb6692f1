//! The thirty-fifth hunt: bugs from the wild in what a backend accepts. Each ports a bug that
//! shipped in a collective library or its framework layer (UCC, PyTorch's c10d, torchcomms,
//! Intel's torch-xpu-ops), found in the project's issue or pull-request thread named on its type:
//! zero-size collectives skipped on each rank alone, a same-size check by element count that
//! every zero-element tensor passes, all_to_all split sums allowed to fall short of the tensor,
//! a coalesced all_reduce that reduces one flat bucket, an average emulated as a sum and a local
//! division. Each validates too little, or on one rank only; the trigger is kept as far as a
//! wrapper over shm can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{copy_bytes, edit, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Tensor, Work};

// ---------------------------------------------------------------- openucx/ucc PR #787

/// Zero-size collectives skipped (openucx/ucc PR #787 "CORE: skip zero size collectives": a
/// collective whose size is zero completes at `ucc_collective_post` without entering the team's
/// algorithm). Each rank decides from its own count: a rank with an empty tensor returns at once
/// with an empty result, so a peer whose tensor is not empty waits for it forever (and a shape
/// mismatch between empty tensors is never seen). Here all_reduce, all_gather_into_tensor and
/// broadcast, the ops whose result shape a rank knows alone.
#[derive(Default)]
pub struct ZeroSizeSkipped;

impl ZeroSizeSkipped {
    fn skip(s: &Shm, x: &Buf, shape: Vec<usize>, op: &str) -> Result<Option<Work<Buf>>> {
        if s.numel(x) != 0 || s.inner.buffer_shape(x).is_empty() {
            return Ok(None);
        }
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &shape)?;
        Ok(Some(s.done(out, op)))
    }
}

impl Bug for ZeroSizeSkipped {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match Self::skip(s, x, s.inner.buffer_shape(x), "all_reduce")? {
            Some(w) => Ok(w),
            None => s.inner.all_reduce(x, op),
        }
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        if let Some(d0) = shape.first_mut() {
            *d0 *= s.ws();
        }
        match Self::skip(s, x, shape, "all_gather_into_tensor")? {
            Some(w) => Ok(w),
            None => s.inner.all_gather_into_tensor(x),
        }
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        if src >= s.ws() {
            return s.inner.broadcast(x, src);
        }
        match Self::skip(s, x, s.inner.buffer_shape(x), "broadcast")? {
            Some(w) => Ok(w),
            None => s.inner.broadcast(x, src),
        }
    }
}

// ---------------------------------------------------------------- pytorch/pytorch PR #84099

/// The same-size check by element count (pytorch/pytorch PR #84099 "Use size to check same tensor
/// sizes in reduce_scatter and allgather": "if the user input tensor is zero in the last dimension
/// (e.g., [648632,0]), then numel() returns zero and check_same_numel is always true"). Here
/// all_gather_into_tensor and reduce_scatter_tensor compare the ranks' tensors by element count:
/// a rank's empty tensor goes out flat (`[0]`) and the result takes its shape from the rank's own
/// tensor, so empty tensors of different shapes on different ranks (`[1, 0]` against `[2, 0]`)
/// pass, each rank with a result shaped by its own input, no error anywhere. The local rules
/// (an indivisible dim 0) still run on the real shape first.
#[derive(Default)]
pub struct SameSizeByNumel;

impl SameSizeByNumel {
    /// The flat view of `x` when it is an empty tensor of rank >= 2 (the case the check misses).
    fn flat(s: &Shm, x: &Buf) -> Result<Option<Buf>> {
        let shape = s.inner.buffer_shape(x);
        if shape.len() < 2 || s.numel(x) != 0 {
            return Ok(None);
        }
        Ok(Some(s.inner.view(x, 0, &[0])?))
    }
    fn shaped(s: &Shm, x: &Buf, w: Work<Buf>, d0: usize) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        shape[0] = d0;
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &shape)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
}

impl Bug for SameSizeByNumel {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        match Self::flat(s, x)? {
            Some(v) => {
                let w = s.inner.all_gather_into_tensor(&v)?;
                Self::shaped(s, x, w, s.inner.buffer_shape(x)[0] * s.ws())
            }
            None => s.inner.all_gather_into_tensor(x),
        }
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d0 = s.inner.buffer_shape(x).first().copied().unwrap_or(0);
        match Self::flat(s, x)? {
            Some(v) if d0.is_multiple_of(s.ws()) => {
                let w = s.inner.reduce_scatter_tensor(&v, op)?;
                Self::shaped(s, x, w, d0 / s.ws())
            }
            _ => s.inner.reduce_scatter_tensor(x, op),
        }
    }
}

// ---------------------------------------------------------------- meta-pytorch/torchcomms PR #291

/// Split sums checked as an upper bound (meta-pytorch/torchcomms PR #291 "Add bounds checking for
/// split sizes in all_to_all_v_single": "validation that the sum of input/output split sizes does
/// not exceed the corresponding tensor dimensions ... Tensors are allowed to be larger than the
/// split sizes sum"). Here all_to_all_single's input splits must not sum past dim 0, and the rows
/// past their sum are left out: an input whose splits fall short of its dim 0 is sent in part,
/// silently, instead of refused as `BadSplits`.
#[derive(Default)]
pub struct SplitSumUpperBoundOnly;

impl Bug for SplitSumUpperBoundOnly {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        if let (Some(splits), Some(d0)) = (i, shape.first().copied()) {
            let sum: usize = splits.iter().sum();
            if splits.len() == s.ws() && sum < d0 {
                shape[0] = sum;
                let head = s.inner.view(x, 0, &shape)?;
                return s.inner.all_to_all_single(&head, o, i);
            }
        }
        s.inner.all_to_all_single(x, o, i)
    }
}

// ---------------------------------------------------------------- pytorch/pytorch #25417

/// The coalesced all_reduce as one flat bucket (pytorch/pytorch #25417 "Add a mode to check input
/// tensor sizes in allreduce_coalesced": the CPU `allreduce_coalesced` "flattens all input
/// tensors into one, and then allreduce that tensor. It works, even if, say, process 0 provides a
/// tensor of size 4 and process 1 provides two tensors of size 2 each"). Here a list of one dtype
/// is copied into one flat tensor, reduced as one all_reduce, and cut back into the rank's own
/// shapes: lists of different lengths or shapes but the same total pass, unchecked.
#[derive(Default)]
pub struct CoalescedFlatBucket;

impl Bug for CoalescedFlatBucket {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let Some(first) = xs.first() else { return s.inner.all_reduce_coalesced(xs, op) };
        let dtype = s.inner.buffer_dtype(first);
        if xs.iter().any(|x| s.inner.buffer_dtype(x) != dtype) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        let parts: Vec<Tensor> = xs.iter().map(|x| s.inner.download(x)).collect::<Result<_>>()?;
        let total: usize = parts.iter().map(Tensor::numel).sum();
        let mut flat = Tensor::zeros(dtype, &[total]);
        let mut at = 0;
        for p in &parts {
            copy_bytes(&mut flat, at, p, 0, p.len_bytes());
            at += p.len_bytes();
        }
        let w = s.inner.all_reduce(&s.inner.upload(&flat)?, op)?;
        let outs: Vec<Buf> = parts.iter().map(|p| s.inner.alloc(dtype, p.shape())).collect::<Result<_>>()?;
        let targets = outs.clone();
        Ok(s.then_as(w, outs, move |be, r| {
            let t = be.download(r)?;
            let mut at = 0;
            for (out, p) in targets.iter().zip(&parts) {
                let mut piece = Tensor::zeros(dtype, p.shape());
                copy_bytes(&mut piece, 0, &t, at, p.len_bytes());
                at += p.len_bytes();
                be.write(out, &piece)?;
            }
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------- intel/torch-xpu-ops PR #2691

/// The average emulated as a sum and a local division (intel/torch-xpu-ops PR #2691 "using
/// sum/world_size to replace avg": "oneccl does not allow avg and throw error while checking, so
/// replace it using sum/world_size"; the same emulation is c10d Gloo's and, in PR #152594, MPI's).
/// Here all_reduce with `avg` issues a `sum` and each rank divides its result by the world size:
/// what the peers are told is `sum`, so a rank that asked for `avg` against a rank that asked for
/// `sum` is never refused; one gets the average, the other the sum.
#[derive(Default)]
pub struct AvgAsSumThenDivide;

impl Bug for AvgAsSumThenDivide {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if op != ReduceOp::Avg || !s.inner.buffer_dtype(x).is_float() {
            return s.inner.all_reduce(x, op);
        }
        let ws = s.ws() as f64;
        let w = s.inner.all_reduce(x, ReduceOp::Sum)?;
        Ok(s.then(w, move |be, r| {
            edit(be, r, |t| {
                for i in 0..t.numel() {
                    let v = t.get_f64(i) / ws;
                    set_f64(t, i, v);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- PaddlePaddle/Paddle PR #48256

/// Empty tensors refused by a static check (PaddlePaddle/Paddle PR #48256 "Add static checks for
/// collective communication on NCCL": `PADDLE_ENFORCE_GT(out_size, 0, ... "Size of output tensor
/// should be greater than 0.")` and the same for the input, kept "so as not to skip the input
/// check" when all_to_all passes 0). Here all_reduce, all_gather_into_tensor,
/// reduce_scatter_tensor and broadcast refuse a tensor of no elements on each rank with an
/// InvalidArgument error: a legal empty collective fails everywhere.
#[derive(Default)]
pub struct EmptyTensorRefused;

impl EmptyTensorRefused {
    fn check(s: &Shm, x: &Buf) -> Result<()> {
        if s.numel(x) == 0 {
            return Err(CollectiveError::Backend("InvalidArgument: Size of input tensor should be greater than 0.".into()));
        }
        Ok(())
    }
}

impl Bug for EmptyTensorRefused {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.all_reduce(x, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.all_gather_into_tensor(x)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.reduce_scatter_tensor(x, op)
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Self::check(s, x)?;
        s.inner.broadcast(x, src)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<ZeroSizeSkipped>(
            "wild_zero_size_skipped",
            "bad_input.named_everywhere",
            "openucx/ucc PR #787: a zero-size collective completes at once on each rank alone: a peer with a non-empty tensor waits forever",
            &["bad_input::all_reduce_shape_mismatch_one_empty::ws2"],
        ),
        spec::<SameSizeByNumel>(
            "wild_same_size_by_numel",
            "bad_input.named_everywhere",
            "pytorch/pytorch PR #84099: all_gather / reduce_scatter compare ranks' tensors by element count: empty tensors of different shapes pass",
            &["bad_input::all_gather_shape_mismatch_both_empty::ws2", "bad_input::reduce_scatter_shape_mismatch_both_empty::ws2"],
        ),
        spec::<SplitSumUpperBoundOnly>(
            "wild_split_sum_upper_bound_only",
            "bad_input.named_everywhere",
            "meta-pytorch/torchcomms PR #291: all_to_all input splits need only not exceed dim 0; the rows past their sum are silently left out",
            &["bad_input::all_to_all_splits_short_of_dim0::ws2"],
        ),
        spec::<CoalescedFlatBucket>(
            "wild_coalesced_flat_bucket",
            "bad_input.named_everywhere",
            "pytorch/pytorch #25417: all_reduce_coalesced reduces one flat bucket: lists of other lengths or shapes with the same total pass",
            &["bad_input::all_reduce_coalesced_one_shape_mismatch::ws2"],
        ),
        spec::<AvgAsSumThenDivide>(
            "wild_avg_as_sum_then_divide",
            "bad_input.named_everywhere",
            "intel/torch-xpu-ops PR #2691: all_reduce avg issued as sum and divided locally: avg on one rank against sum on another is never refused",
            &["bad_input::all_reduce_avg_against_sum::ws2"],
        ),
        spec::<EmptyTensorRefused>(
            "wild_empty_tensor_refused",
            "values.sizes",
            "PaddlePaddle/Paddle PR #48256: a static check refuses tensors of no elements (InvalidArgument): a legal empty collective fails on every rank",
            &["all_reduce::out::f32::sum::ws2"],
        ),
    ]
}
