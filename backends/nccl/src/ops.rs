//! The collective entry points of the [`concord_core::Backend`] impl: per op, this rank's
//! [`CallDesc`] (`call` / `call_out`), its local rules from the core rule table and its encoded
//! header for the cross-rank check (`admit`; a local error is returned at issue), the output
//! buffer and the NCCL launch, handed to `NcclBackend::submit` (`issue`). Runs on the caller's
//! thread; NCCL itself is only called by the progress thread (see `worker`).

use crate::dtype::{move_type, nccl_dtype, red_of, Red};
use crate::header::Header;
use crate::issue::Op;
use crate::launch::{keep, p2p_launch};
use crate::worker::{check, Check, Launch, P2pData};
use crate::{comm::red_fns, NcclBackend, NcclBuffer};
use concord_core::{validate_local, BadInputKind, CallDesc, CallOp, DType, ReduceOp, Result, TensorDesc, Variant, Work};
use cudarc::nccl::sys as nccl;
use std::ffi::c_void;

pub(crate) type Local = std::result::Result<(), (BadInputKind, String)>;

/// Shape of an all-gather / gather result: `[ws * d0, rest..]`, `[ws]` for a 0-dim input.
pub(crate) fn gathered_shape(shape: &[usize], ws: usize) -> Vec<usize> {
    match shape.split_first() {
        None => vec![ws],
        Some((d0, rest)) => std::iter::once(d0 * ws).chain(rest.iter().copied()).collect(),
    }
}

impl NcclBackend {
    /// This rank's call of `op` over `xs`, as the rule table sees it (fill in the arguments).
    pub(crate) fn call(&self, o: &Op, op: CallOp, variant: Variant, xs: &[&NcclBuffer]) -> CallDesc {
        let mut d = CallDesc::new(op, variant, self.rank);
        d.seq = o.cseq;
        d.inputs = xs.iter().map(|x| TensorDesc::new(x.dtype, &x.shape)).collect();
        d
    }

    /// An `_out` call: the caller's output buffer, and whether it overlaps the input.
    pub(crate) fn call_out(&self, o: &Op, op: CallOp, x: &NcclBuffer, out: &NcclBuffer) -> CallDesc {
        let mut d = self.call(o, op, Variant::OutBuf, &[x]);
        d.outputs.push(TensorDesc::new(out.dtype, &out.shape));
        d.aliased = out.overlaps(x);
        d
    }

    /// The local rules of the core rule table for `d`: its validation header, or
    /// [`Self::reject`]'s error.
    pub(crate) fn admit(&self, o: &Op, d: &CallDesc) -> Result<Header> {
        let local = validate_local(d, self.ws, &self.issue_caps());
        match (local, Header::new(self.ws, d)) {
            (Ok(()), Ok(h)) => {
                self.arm(o, &h, None);
                Ok(h)
            }
            (Err(e), Ok(h)) => Err(self.reject(o, &h, e)),
            (Err(e), Err(_)) | (Ok(()), Err(e)) => Err(self.reject(o, &Header::summary(self.ws, d), e)),
        }
    }

    /// The shared part of `send` / `recv` (`name`): the peer check, the header paired with the
    /// peer's on their direction (see `p2p`), and the whole buffer to move (none when empty).
    pub(crate) fn point_to_point(&self, name: &'static str, buf: &NcclBuffer, peer: usize) -> Result<(Op, Header, Option<P2pData>)> {
        let o = self.begin(name, false)?;
        let is_send = name == "send";
        let op = if is_send { CallOp::Send } else { CallOp::Recv };
        let d = CallDesc::p2p(op, self.rank, TensorDesc::new(buf.dtype, &buf.shape), peer);
        // No exchange for a local error: the pair's peer may not even be a rank.
        let local = validate_local(&d, self.ws, &self.issue_caps()).and_then(|()| Header::new(self.ws, &d));
        let mine = local.map_err(|e| self.bad(&o, e.kind, e.detail))?;
        self.arm(&o, &mine, Some((peer, is_send)));
        let data = (buf.numel() > 0).then(|| P2pData { ptr: buf.ptr(), n: buf.numel(), dtype: buf.dtype, keep: keep(&[buf]) });
        Ok((o, mine, data))
    }

    pub(crate) fn all_reduce_impl(&self, name: &'static str, x: &NcclBuffer, op: ReduceOp, in_place: bool) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let variant = [Variant::Out, Variant::InPlace][in_place as usize];
        let mut d = self.call(&o, CallOp::AllReduce, variant, &[x]);
        d.reduce = Some(op);
        let hdr = self.admit(&o, &d)?;
        let red = red_of(op);
        let out = if in_place { x.clone() } else { self.alloc_buf(&o, x.dtype, &x.shape)? };
        let jobs = vec![(x.ptr(), out.ptr(), x.numel(), x.dtype, red)];
        let launch = self.reduction_launch(&o, jobs, &[x, &out], |f| f.all_reduce, "ncclAllReduce")?;
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn all_reduce_coalesced_impl(
        &self,
        name: &'static str,
        xs: &[NcclBuffer],
        op: ReduceOp,
        in_place: bool,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin(name, true)?;
        let variant = [Variant::Coalesced, Variant::CoalescedInPlace][in_place as usize];
        let mut d = self.call(&o, CallOp::AllReduce, variant, &xs.iter().collect::<Vec<_>>());
        d.reduce = Some(op);
        let hdr = self.admit(&o, &d)?;
        let reds: Vec<(Red, DType)> = xs.iter().map(|x| (red_of(op), x.dtype)).collect();
        let outs: Vec<NcclBuffer> =
            if in_place { xs.to_vec() } else { xs.iter().map(|x| self.alloc_buf(&o, x.dtype, &x.shape)).collect::<Result<_>>()? };
        let jobs: Vec<(u64, u64, usize, DType, Red)> =
            xs.iter().zip(&outs).zip(&reds).map(|((x, y), (r, d))| (x.ptr(), y.ptr(), x.numel(), *d, *r)).collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(&o, jobs, &bufs, |f| f.all_reduce, "ncclAllReduce (coalesced)")?;
        self.submit(o, outs, Check::All(hdr), launch)
    }

    pub(crate) fn scattered_shape(&self, x: &NcclBuffer) -> Vec<usize> {
        let mut s = x.shape.clone();
        if let Some(d0) = s.first_mut() {
            *d0 /= self.ws;
        }
        s
    }

    pub(crate) fn gather_all(&self, o: Op, hdr: Header, x: &NcclBuffer, out: NcclBuffer) -> Result<Work<NcclBuffer>> {
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (src, dst) = (x.ptr(), out.ptr());
            Launch::calls_only(
                keep(&[x, &out]),
                Box::new(move |c, s, _| unsafe {
                    check(nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s), "ncclAllGather")
                }),
            )
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn scatter_reduce(&self, o: Op, hdr: Header, x: &NcclBuffer, out: NcclBuffer, red: Red) -> Result<Work<NcclBuffer>> {
        let jobs = vec![(x.ptr(), out.ptr(), out.numel(), x.dtype, red)];
        let launch = self.reduction_launch(&o, jobs, &[x, &out], |f| f.reduce_scatter, "ncclReduceScatter")?;
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn broadcast_impl(&self, name: &'static str, x: &NcclBuffer, src: usize, in_place: bool) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let variant = [Variant::Out, Variant::InPlace][in_place as usize];
        let mut d = self.call(&o, CallOp::Broadcast, variant, &[x]);
        d.root = Some(src);
        let hdr = self.admit(&o, &d)?;
        let out = if in_place { x.clone() } else { self.alloc_buf(&o, x.dtype, &x.shape)? };
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (sp, dp) = (x.ptr(), out.ptr());
            Launch::calls_only(
                keep(&[x, &out]),
                Box::new(move |c, s, _| unsafe {
                    check(nccl::ncclBroadcast(sp as *const c_void, dp as *mut c_void, n, t, src as i32, c, s), "ncclBroadcast")
                }),
            )
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn all_gather_into_tensor_impl(&self, x: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor", true)?;
        let hdr = self.admit(&o, &self.call(&o, CallOp::AllGather, Variant::Out, &[x]))?;
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        self.gather_all(o, hdr, x, out)
    }

    pub(crate) fn all_gather_into_tensor_out_impl(&self, x: &NcclBuffer, out: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor_out", true)?;
        let hdr = self.admit(&o, &self.call_out(&o, CallOp::AllGather, x, out))?;
        self.gather_all(o, hdr, x, out.clone())
    }

    pub(crate) fn all_gather_into_tensor_coalesced_impl(&self, xs: &[NcclBuffer]) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("all_gather_into_tensor_coalesced", true)?;
        let xr: Vec<&NcclBuffer> = xs.iter().collect();
        let hdr = self.admit(&o, &self.call(&o, CallOp::AllGather, Variant::Coalesced, &xr))?;
        let outs: Vec<NcclBuffer> =
            xs.iter().map(|x| self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))).collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType)> =
            xs.iter().zip(&outs).filter(|(x, _)| x.numel() > 0).map(|(x, y)| (x.ptr(), y.ptr(), x.numel(), x.dtype)).collect();
        let launch = (!jobs.is_empty()).then(|| {
            Launch::calls_only(
                keep(&xs.iter().chain(&outs).collect::<Vec<_>>()),
                Box::new(move |c, s, _| {
                    for (src, dst, n, d) in jobs {
                        let (t, n) = move_type(d, n);
                        check(
                            unsafe { nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s) },
                            "ncclAllGather (coalesced)",
                        )?;
                    }
                    Ok(())
                }),
            )
        });
        self.submit(o, outs, Check::All(hdr), launch)
    }

    pub(crate) fn reduce_scatter_tensor_impl(&self, x: &NcclBuffer, op: ReduceOp) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor", true)?;
        let mut d = self.call(&o, CallOp::ReduceScatter, Variant::Out, &[x]);
        d.reduce = Some(op);
        let hdr = self.admit(&o, &d)?;
        let red = red_of(op);
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        self.scatter_reduce(o, hdr, x, out, red)
    }

    pub(crate) fn reduce_scatter_tensor_out_impl(&self, x: &NcclBuffer, op: ReduceOp, out: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor_out", true)?;
        let mut d = self.call_out(&o, CallOp::ReduceScatter, x, out);
        d.reduce = Some(op);
        let hdr = self.admit(&o, &d)?;
        let red = red_of(op);
        self.scatter_reduce(o, hdr, x, out.clone(), red)
    }

    pub(crate) fn reduce_scatter_tensor_coalesced_impl(&self, xs: &[NcclBuffer], op: ReduceOp) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("reduce_scatter_tensor_coalesced", true)?;
        let xr: Vec<&NcclBuffer> = xs.iter().collect();
        let mut d = self.call(&o, CallOp::ReduceScatter, Variant::Coalesced, &xr);
        d.reduce = Some(op);
        let hdr = self.admit(&o, &d)?;
        let reds: Vec<(Red, DType)> = xs.iter().map(|x| (red_of(op), x.dtype)).collect();
        let outs: Vec<NcclBuffer> = xs.iter().map(|x| self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))).collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType, Red)> =
            xs.iter().zip(&outs).zip(&reds).map(|((x, y), (r, d))| (x.ptr(), y.ptr(), y.numel(), *d, *r)).collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(&o, jobs, &bufs, |f| f.reduce_scatter, "ncclReduceScatter (coalesced)")?;
        self.submit(o, outs, Check::All(hdr), launch)
    }

    pub(crate) fn all_to_all_single_impl(
        &self,
        x: &NcclBuffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_to_all_single", true)?;
        let ws = self.ws;
        let mut d = self.call(&o, CallOp::AllToAll, Variant::Out, &[x]);
        d.in_splits = input_splits.map(<[usize]>::to_vec);
        d.out_splits = output_splits.map(<[usize]>::to_vec);
        let hdr = self.admit(&o, &d)?;
        let (ins, outs) = (d.input_splits(ws), d.output_splits(ws));
        let (_, row) = x.rows();
        let mut out_shape = x.shape.clone();
        out_shape[0] = outs.iter().sum();
        let out = self.alloc_buf(&o, x.dtype, &out_shape)?;
        let esz = x.dtype.size();
        let (src, dst, d) = (x.ptr(), out.ptr(), x.dtype);
        let mut jobs: Vec<(bool, u64, usize, usize)> = Vec::new(); // (is_send, ptr, elements, peer)
        let (mut ioff, mut ooff) = (0usize, 0usize);
        for j in 0..ws {
            if ins[j] > 0 {
                jobs.push((true, src + (ioff * row * esz) as u64, ins[j] * row, j));
            }
            if outs[j] > 0 {
                jobs.push((false, dst + (ooff * row * esz) as u64, outs[j] * row, j));
            }
            ioff += ins[j];
            ooff += outs[j];
        }
        let launch = (!jobs.iter().all(|j| j.2 == 0)).then(|| p2p_launch(jobs, d, keep(&[x, &out])));
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn permute_tensor_impl(&self, x: &NcclBuffer, src_dst: &[usize]) -> Result<Work<NcclBuffer>> {
        let o = self.begin("permute_tensor", true)?;
        let mut d = self.call(&o, CallOp::Permute, Variant::Out, &[x]);
        d.perm = Some(src_dst.to_vec());
        let hdr = self.admit(&o, &d)?;
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = (x.numel() > 0).then(|| {
            let dst_rank = src_dst[self.rank];
            let src_rank = src_dst.iter().position(|&d| d == self.rank).expect("a permutation");
            let jobs = vec![(true, x.ptr(), x.numel(), dst_rank), (false, out.ptr(), x.numel(), src_rank)];
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn reduce_impl(&self, x: &NcclBuffer, op: ReduceOp, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce", true)?;
        let mut d = self.call(&o, CallOp::Reduce, Variant::Out, &[x]);
        (d.reduce, d.root) = (Some(op), Some(root));
        let hdr = self.admit(&o, &d)?;
        let red = red_of(op);
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = if x.numel() == 0 {
            None
        } else {
            let premul = Self::premul_list(&[(red, x.dtype)]);
            let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
            // One rank: NCCL's one-rank kernel may drop the tail (`one_rank`).
            let jobs = self.one_rank_jobs(vec![(x.ptr(), out.ptr(), x.numel(), x.dtype, red)]);
            let p2 = premul.clone();
            Some(Launch {
                premul,
                then: vec![],
                local: None,
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, ops| {
                    for (src, dst, n, d, red) in jobs {
                        let t = nccl_dtype(d).expect("checked");
                        // SAFETY: src/dst are live device buffers of at least n elements of d
                        // (kept alive by `keep`), and c/s are this communicator's handle and stream.
                        check(
                            unsafe {
                                (f.reduce)(
                                    src as *const c_void,
                                    dst as *mut c_void,
                                    n,
                                    t,
                                    Self::op_code(red, d, &p2, ops),
                                    root as i32,
                                    c,
                                    s,
                                )
                            },
                            "ncclReduce",
                        )?;
                    }
                    Ok(())
                }),
            })
        };
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn gather_impl(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("gather", true)?;
        let mut d = self.call(&o, CallOp::Gather, Variant::Out, &[x]);
        d.root = Some(root);
        let hdr = self.admit(&o, &d)?;
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        let n = x.numel();
        let launch = (n > 0).then(|| {
            let esz = x.dtype.size();
            let mut jobs = vec![(true, x.ptr(), n, root)];
            if self.rank == root {
                for j in 0..self.ws {
                    jobs.push((false, out.ptr() + (j * n * esz) as u64, n, j));
                }
            }
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn scatter_impl(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("scatter", true)?;
        let mut d = self.call(&o, CallOp::Scatter, Variant::Out, &[x]);
        d.root = Some(root);
        let hdr = self.admit(&o, &d)?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        let n = out.numel();
        let launch = (n > 0).then(|| {
            let esz = x.dtype.size();
            let mut jobs = Vec::new();
            if self.rank == root {
                for j in 0..self.ws {
                    jobs.push((true, x.ptr() + (j * n * esz) as u64, n, j));
                }
            }
            jobs.push((false, out.ptr(), n, root));
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn send_impl(&self, x: &NcclBuffer, dst: usize) -> Result<Work<()>> {
        let (o, hdr, data) = self.point_to_point("send", x, dst)?;
        self.submit_p2p(o, (), hdr, dst, true, data)
    }

    pub(crate) fn recv_impl(&self, out: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        let (o, hdr, data) = self.point_to_point("recv", out, src)?;
        self.submit_p2p(o, out.clone(), hdr, src, false, data)
    }

    pub(crate) fn barrier_impl(&self) -> Result<Work<()>> {
        let o = self.begin("barrier", true)?;
        let hdr = self.admit(&o, &self.call(&o, CallOp::Barrier, Variant::Out, &[]))?;
        let p = self.barrier_buf.ptr();
        let launch = Launch::calls_only(
            keep(&[&self.barrier_buf]),
            Box::new(move |c, s, _| unsafe {
                check(
                    nccl::ncclAllReduce(
                        p as *const c_void,
                        p as *mut c_void,
                        1,
                        nccl::ncclDataType_t::ncclInt32,
                        nccl::ncclRedOp_t::ncclSum,
                        c,
                        s,
                    ),
                    "ncclAllReduce (barrier)",
                )
            }),
        );
        self.submit(o, (), Check::All(hdr), Some(launch))
    }
}
