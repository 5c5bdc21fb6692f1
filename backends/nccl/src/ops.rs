//! The collective entry points of the [`concord_core::Backend`] impl: per op, the local input
//! checks (returned at issue), the header for the cross-rank check, the output buffer and the
//! NCCL launch, handed to `NcclBackend::submit` (`issue`). Runs on the caller's thread; NCCL itself is
//! only called by the progress thread (see `worker`).

use crate::dtype::{move_type, nccl_dtype, red_check, Red};
use crate::header::{hash_words, Header};
use crate::issue::Op;
use crate::launch::{keep, p2p_launch};
use crate::worker::{check, Check, Launch};
use crate::{comm::red_fns, NcclBackend, NcclBuffer};
use concord_core::{BadInputKind, DType, ReduceOp, Result, Work};
use cudarc::nccl::sys as nccl;
use std::ffi::c_void;

pub(crate) type Local = std::result::Result<(), (BadInputKind, String)>;

/// Shape of an all-gather / gather result: `[ws * d0, rest..]`, `[ws]` for a 0-dim input.
pub(crate) fn gathered_shape(shape: &[usize], ws: usize) -> Vec<usize> {
    match shape.split_first() {
        None => vec![ws],
        Some((d0, rest)) => std::iter::once(d0 * ws)
            .chain(rest.iter().copied())
            .collect(),
    }
}

impl NcclBackend {
    /// The shared part of `send` / `recv` (`name`): the peer check, the header paired with the
    /// peer's, and one ncclSend / ncclRecv of the whole buffer (none when it is empty).
    pub(crate) fn point_to_point(
        &self,
        name: &'static str,
        buf: &NcclBuffer,
        peer: usize,
    ) -> Result<(Op, Check, Option<Launch>)> {
        let o = self.begin(name, false)?;
        if peer >= self.ws || peer == self.rank {
            let dir = if name == "send" { "to" } else { "from" };
            let detail = format!(
                "{name} {dir} rank {peer} on rank {} in a world of {}",
                self.rank, self.ws
            );
            return Err(self.bad(&o, BadInputKind::BadPeer, detail));
        }
        let mine = Header::new(self.ws, name, 0)
            .tensor(buf.dtype, &buf.shape)
            .peer(peer);
        let is_send = name == "send";
        let launch = (buf.numel() > 0).then(|| {
            p2p_launch(
                vec![(is_send, buf.ptr(), buf.numel(), peer)],
                buf.dtype,
                keep(&[buf]),
            )
        });
        Ok((o, Check::Pair(mine, peer), launch))
    }

    pub(crate) fn all_reduce_impl(
        &self,
        name: &'static str,
        x: &NcclBuffer,
        op: ReduceOp,
        in_place: bool,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, red_check(op, x.dtype))?;
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        let jobs = vec![(x.ptr(), out.ptr(), x.numel(), x.dtype, red)];
        let launch =
            self.reduction_launch(&o, jobs, &[x, &out], |f| f.all_reduce, "ncclAllReduce")?;
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
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        let reds = xs
            .iter()
            .map(|x| red_check(op, x.dtype).map(|r| (r, x.dtype)))
            .collect::<std::result::Result<Vec<(Red, DType)>, _>>();
        let reds = self.local_ok(&o, &hdr, reds)?;
        let outs: Vec<NcclBuffer> = if in_place {
            xs.to_vec()
        } else {
            xs.iter()
                .map(|x| self.alloc_buf(&o, x.dtype, &x.shape))
                .collect::<Result<_>>()?
        };
        let jobs: Vec<(u64, u64, usize, DType, Red)> = xs
            .iter()
            .zip(&outs)
            .zip(&reds)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), x.numel(), *d, *r))
            .collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(
            &o,
            jobs,
            &bufs,
            |f| f.all_reduce,
            "ncclAllReduce (coalesced)",
        )?;
        self.submit(o, outs, Check::All(hdr), launch)
    }

    pub(crate) fn reduce_scatter_local(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
    ) -> std::result::Result<Red, (BadInputKind, String)> {
        if x.shape.is_empty() {
            return Err((
                BadInputKind::ZeroDim,
                "reduce_scatter needs at least one dimension".into(),
            ));
        }
        if x.shape[0] % self.ws != 0 {
            return Err((
                BadInputKind::Indivisible,
                format!(
                    "dim 0 ({}) is not divisible by the world size {}",
                    x.shape[0], self.ws
                ),
            ));
        }
        red_check(op, x.dtype)
    }

    pub(crate) fn scattered_shape(&self, x: &NcclBuffer) -> Vec<usize> {
        let mut s = x.shape.clone();
        if let Some(d0) = s.first_mut() {
            *d0 /= self.ws;
        }
        s
    }

    pub(crate) fn out_checks(
        &self,
        x: &NcclBuffer,
        out: &NcclBuffer,
        numel: usize,
        what: &str,
    ) -> Local {
        if out.dtype != x.dtype {
            return Err((
                BadInputKind::DTypeMismatch,
                format!(
                    "{what} output is {} but the input is {}",
                    out.dtype, x.dtype
                ),
            ));
        }
        if out.numel() != numel {
            return Err((
                BadInputKind::OutBufferSize,
                format!(
                    "{what} output holds {} elements ({:?}), needs {numel}",
                    out.numel(),
                    out.shape
                ),
            ));
        }
        if out.overlaps(x) {
            return Err((
                BadInputKind::Aliasing,
                format!("{what} output overlaps its input"),
            ));
        }
        Ok(())
    }

    pub(crate) fn root_check(&self, root: usize) -> Local {
        if root >= self.ws {
            return Err((
                BadInputKind::BadRoot,
                format!("root {root} is out of range for a world of {}", self.ws),
            ));
        }
        Ok(())
    }

    pub(crate) fn gather_all(
        &self,
        o: Op,
        hdr: Header,
        x: &NcclBuffer,
        out: NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (src, dst) = (x.ptr(), out.ptr());
            Launch {
                premul: vec![],
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, _| unsafe {
                    check(
                        nccl::ncclAllGather(src as *const c_void, dst as *mut c_void, n, t, c, s),
                        "ncclAllGather",
                    )
                }),
            }
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn scatter_reduce(
        &self,
        o: Op,
        hdr: Header,
        x: &NcclBuffer,
        out: NcclBuffer,
        red: Red,
    ) -> Result<Work<NcclBuffer>> {
        let jobs = vec![(x.ptr(), out.ptr(), out.numel(), x.dtype, red)];
        let launch = self.reduction_launch(
            &o,
            jobs,
            &[x, &out],
            |f| f.reduce_scatter,
            "ncclReduceScatter",
        )?;
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn broadcast_impl(
        &self,
        name: &'static str,
        x: &NcclBuffer,
        src: usize,
        in_place: bool,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin(name, true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(src);
        self.local_ok(&o, &hdr, self.root_check(src))?;
        let out = if in_place {
            x.clone()
        } else {
            self.alloc_buf(&o, x.dtype, &x.shape)?
        };
        let launch = (x.numel() > 0).then(|| {
            let (t, n) = move_type(x.dtype, x.numel());
            let (sp, dp) = (x.ptr(), out.ptr());
            Launch {
                premul: vec![],
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, _| unsafe {
                    check(
                        nccl::ncclBroadcast(
                            sp as *const c_void,
                            dp as *mut c_void,
                            n,
                            t,
                            src as i32,
                            c,
                            s,
                        ),
                        "ncclBroadcast",
                    )
                }),
            }
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn all_gather_into_tensor_impl(&self, x: &NcclBuffer) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape);
        let out = self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws))?;
        self.gather_all(o, hdr, x, out)
    }

    pub(crate) fn all_gather_into_tensor_out_impl(
        &self,
        x: &NcclBuffer,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("all_gather_into_tensor_out", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape);
        let local = self.out_checks(x, out, x.numel() * self.ws, "all_gather_into_tensor_out");
        self.local_ok(&o, &hdr, local)?;
        self.gather_all(o, hdr, x, out.clone())
    }

    pub(crate) fn all_gather_into_tensor_coalesced_impl(
        &self,
        xs: &[NcclBuffer],
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("all_gather_into_tensor_coalesced", true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items);
        let outs: Vec<NcclBuffer> = xs
            .iter()
            .map(|x| self.alloc_buf(&o, x.dtype, &gathered_shape(&x.shape, self.ws)))
            .collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType)> = xs
            .iter()
            .zip(&outs)
            .filter(|(x, _)| x.numel() > 0)
            .map(|(x, y)| (x.ptr(), y.ptr(), x.numel(), x.dtype))
            .collect();
        let launch = (!jobs.is_empty()).then(|| Launch {
            premul: vec![],
            keep: keep(&xs.iter().chain(&outs).collect::<Vec<_>>()),
            calls: Box::new(move |c, s, _| {
                for (src, dst, n, d) in jobs {
                    let (t, n) = move_type(d, n);
                    check(
                        unsafe {
                            nccl::ncclAllGather(
                                src as *const c_void,
                                dst as *mut c_void,
                                n,
                                t,
                                c,
                                s,
                            )
                        },
                        "ncclAllGather (coalesced)",
                    )?;
                }
                Ok(())
            }),
        });
        self.submit(o, outs, Check::All(hdr), launch)
    }

    pub(crate) fn reduce_scatter_tensor_impl(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, self.reduce_scatter_local(x, op))?;
        let out = self.alloc_buf(&o, x.dtype, &self.scattered_shape(x))?;
        self.scatter_reduce(o, hdr, x, out, red)
    }

    pub(crate) fn reduce_scatter_tensor_out_impl(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
        out: &NcclBuffer,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce_scatter_tensor_out", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).reduce(op);
        let red = self.local_ok(&o, &hdr, self.reduce_scatter_local(x, op))?;
        let local = self.out_checks(x, out, x.numel() / self.ws, "reduce_scatter_tensor_out");
        self.local_ok(&o, &hdr, local)?;
        self.scatter_reduce(o, hdr, x, out.clone(), red)
    }

    pub(crate) fn reduce_scatter_tensor_coalesced_impl(
        &self,
        xs: &[NcclBuffer],
        op: ReduceOp,
    ) -> Result<Work<Vec<NcclBuffer>>> {
        let o = self.begin("reduce_scatter_tensor_coalesced", true)?;
        let items: Vec<_> = xs.iter().map(|x| (x.dtype, x.shape.clone())).collect();
        let hdr = self.new_header(&o).list(&items).reduce(op);
        let reds = xs
            .iter()
            .map(|x| self.reduce_scatter_local(x, op).map(|r| (r, x.dtype)))
            .collect::<std::result::Result<Vec<(Red, DType)>, _>>();
        let reds = self.local_ok(&o, &hdr, reds)?;
        let outs: Vec<NcclBuffer> = xs
            .iter()
            .map(|x| self.alloc_buf(&o, x.dtype, &self.scattered_shape(x)))
            .collect::<Result<_>>()?;
        let jobs: Vec<(u64, u64, usize, DType, Red)> = xs
            .iter()
            .zip(&outs)
            .zip(&reds)
            .map(|((x, y), (r, d))| (x.ptr(), y.ptr(), y.numel(), *d, *r))
            .collect();
        let bufs: Vec<&NcclBuffer> = xs.iter().chain(&outs).collect();
        let launch = self.reduction_launch(
            &o,
            jobs,
            &bufs,
            |f| f.reduce_scatter,
            "ncclReduceScatter (coalesced)",
        )?;
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
        let d0 = x.shape.first().copied().unwrap_or(0);
        let equal = |what: &str| -> std::result::Result<Vec<usize>, (BadInputKind, String)> {
            if d0 % ws != 0 {
                return Err((
                    BadInputKind::Indivisible,
                    format!(
                        "{what} splits default to equal, but dim 0 ({d0}) is not divisible by {ws}"
                    ),
                ));
            }
            Ok(vec![d0 / ws; ws])
        };
        let splits = if x.shape.is_empty() {
            Err((
                BadInputKind::ZeroDim,
                "all_to_all_single needs at least one dimension".into(),
            ))
        } else {
            let input = match input_splits {
                Some(s) if s.len() != ws => Err((
                    BadInputKind::BadSplits,
                    format!("{} input splits for a world of {ws}", s.len()),
                )),
                Some(s) if s.iter().sum::<usize>() != d0 => Err((
                    BadInputKind::BadSplits,
                    format!(
                        "input splits {s:?} sum to {}, dim 0 is {d0}",
                        s.iter().sum::<usize>()
                    ),
                )),
                Some(s) => Ok(s.to_vec()),
                None => equal("input"),
            };
            let output = match output_splits {
                Some(s) if s.len() != ws => Err((
                    BadInputKind::BadSplits,
                    format!("{} output splits for a world of {ws}", s.len()),
                )),
                Some(s) => Ok(s.to_vec()),
                None => equal("output"),
            };
            match (input, output) {
                (Ok(i), Ok(out)) => Ok((i, out)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        let (_, row) = x.rows();
        let row_shape: Vec<u64> = x.shape.iter().skip(1).map(|&d| d as u64).collect();
        let hdr_of = |ins: &[usize], outs: &[usize]| {
            self.new_header(&o)
                .tensor(x.dtype, &x.shape)
                .aux(hash_words(
                    std::iter::once(row_shape.len() as u64).chain(row_shape.iter().copied()),
                ))
                .splits(ins, outs)
        };
        let (ins, outs) = match splits {
            Ok(s) => s,
            Err(e) => {
                let zeros = vec![0usize; ws];
                let hdr = hdr_of(&zeros, &zeros);
                return Err(self.reject(&o, &hdr, e));
            }
        };
        let hdr = hdr_of(&ins, &outs);
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
        let launch =
            (!jobs.iter().all(|j| j.2 == 0)).then(|| p2p_launch(jobs, d, keep(&[x, &out])));
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn permute_tensor_impl(
        &self,
        x: &NcclBuffer,
        src_dst: &[usize],
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("permute_tensor", true)?;
        let ws = self.ws;
        let mut seen = vec![false; ws];
        let valid = src_dst.len() == ws
            && src_dst
                .iter()
                .all(|&d| d < ws && !std::mem::replace(&mut seen[d], true));
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .aux(hash_words(src_dst.iter().map(|&d| d as u64)));
        if !valid {
            return Err(self.reject(
                &o,
                &hdr,
                (
                    BadInputKind::BadPermutation,
                    format!("{src_dst:?} is not a permutation of 0..{ws}"),
                ),
            ));
        }
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = (x.numel() > 0).then(|| {
            let dst_rank = src_dst[self.rank];
            let src_rank = src_dst
                .iter()
                .position(|&d| d == self.rank)
                .expect("a permutation");
            let jobs = vec![
                (true, x.ptr(), x.numel(), dst_rank),
                (false, out.ptr(), x.numel(), src_rank),
            ];
            p2p_launch(jobs, x.dtype, keep(&[x, &out]))
        });
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn reduce_impl(
        &self,
        x: &NcclBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<NcclBuffer>> {
        let o = self.begin("reduce", true)?;
        let hdr = self
            .new_header(&o)
            .tensor(x.dtype, &x.shape)
            .reduce(op)
            .root(root);
        self.local_ok(&o, &hdr, self.root_check(root))?;
        let red = self.local_ok(&o, &hdr, red_check(op, x.dtype))?;
        let out = self.alloc_buf(&o, x.dtype, &x.shape)?;
        let launch = if x.numel() == 0 {
            None
        } else {
            let premul = Self::premul_list(&[(red, x.dtype)]);
            let f = red_fns().map_err(|e| self.backend_err(o.name, o.seq, e))?;
            let (src, dst, n, d) = (x.ptr(), out.ptr(), x.numel(), x.dtype);
            let p2 = premul.clone();
            Some(Launch {
                premul,
                keep: keep(&[x, &out]),
                calls: Box::new(move |c, s, ops| unsafe {
                    let t = nccl_dtype(d).expect("checked");
                    check(
                        (f.reduce)(
                            src as *const c_void,
                            dst as *mut c_void,
                            n,
                            t,
                            Self::op_code(red, d, &p2, ops),
                            root as i32,
                            c,
                            s,
                        ),
                        "ncclReduce",
                    )
                }),
            })
        };
        self.submit(o, out, Check::All(hdr), launch)
    }

    pub(crate) fn gather_impl(&self, x: &NcclBuffer, root: usize) -> Result<Work<NcclBuffer>> {
        let o = self.begin("gather", true)?;
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(root);
        self.local_ok(&o, &hdr, self.root_check(root))?;
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
        let local = if x.shape.is_empty() {
            Err((
                BadInputKind::ZeroDim,
                "scatter needs at least one dimension".into(),
            ))
        } else if x.shape[0] % self.ws != 0 {
            Err((
                BadInputKind::Indivisible,
                format!(
                    "dim 0 ({}) is not divisible by the world size {}",
                    x.shape[0], self.ws
                ),
            ))
        } else {
            self.root_check(root)
        };
        let hdr = self.new_header(&o).tensor(x.dtype, &x.shape).root(root);
        self.local_ok(&o, &hdr, local)?;
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
        let (o, check, launch) = self.point_to_point("send", x, dst)?;
        self.submit(o, (), check, launch)
    }

    pub(crate) fn recv_impl(&self, out: &NcclBuffer, src: usize) -> Result<Work<NcclBuffer>> {
        let (o, check, launch) = self.point_to_point("recv", out, src)?;
        self.submit(o, out.clone(), check, launch)
    }

    pub(crate) fn barrier_impl(&self) -> Result<Work<()>> {
        let o = self.begin("barrier", true)?;
        let hdr = self.new_header(&o);
        let p = self.barrier_buf.ptr();
        let launch = Launch {
            premul: vec![],
            keep: keep(&[&self.barrier_buf]),
            calls: Box::new(move |c, s, _| unsafe {
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
        };
        self.submit(o, (), Check::All(hdr), Some(launch))
    }
}
