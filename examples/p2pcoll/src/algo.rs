//! The collectives as point-to-point algorithms, run on a communicator's worker thread over
//! the internal group's send / recv. Every rank runs the same schedule for the same op, so the
//! k-th internal message of a pair always meets the k-th receive.

use crate::bugs::Bug;
use crate::reduce::{combine, narrow, widen};
use concord_core::{Backend, CallDesc, CollectiveError, DType, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Buf = <ShmBackend as Backend>::Buffer;

/// Broadcast segment length (elements): large broadcasts are pipelined down the tree.
pub const SEGMENT: usize = 8192;

/// What one op's schedule needs.
pub struct Exec {
    /// The internal communicator (its own send / recv channels).
    pub c: Arc<ShmBackend>,
    /// This communicator's rank `r` is rank `map[r]` of `c`.
    pub map: Arc<Vec<usize>>,
    pub n: usize,
    pub me: usize,
    pub started: Instant,
    pub deadline: Instant,
    pub abort: Arc<AtomicBool>,
    pub bug: Bug,
    pub name: String,
    pub seq: u64,
}

/// The chunk `c` of `total` elements split `n` ways: `(offset, len)`, the first `total % n`
/// chunks one element longer.
pub fn chunk(total: usize, n: usize, c: usize, bug: Bug) -> (usize, usize) {
    let (base, rem) = (total / n, total % n);
    if bug == Bug::RingDropsRemainder {
        return (c * base, base);
    }
    (c * base + c.min(rem), base + usize::from(c < rem))
}

impl Exec {
    fn timeout(&self) -> CollectiveError {
        CollectiveError::Timeout {
            op: self.name.clone(),
            seq: self.seq,
            rank: self.me,
            waited_ms: self.started.elapsed().as_millis() as u64,
            detail: format!("p2pcoll backend: a peer's internal message did not come ({})", concord_core::progress::describe()),
        }
    }

    /// Waits `w` until the op's deadline, looking at the abort flag every 20 ms.
    fn wait<T>(&self, w: Work<T>) -> Result<T> {
        loop {
            if self.abort.load(Ordering::SeqCst) {
                return Err(CollectiveError::Aborted(format!("{} #{} on rank {}: the backend was dropped", self.name, self.seq, self.me)));
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.timeout());
            }
            let slice = (self.deadline - now).min(Duration::from_millis(20));
            match w.wait(slice) {
                Ok(_) => return w.into_value(Duration::ZERO),
                Err(CollectiveError::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends every `(dst, tensor)` and receives every `(src, dtype, numel)` (all issued before
    /// any wait), returning the received tensors in order, shape `[numel]`.
    pub fn exchange(&self, sends: Vec<(usize, Tensor)>, recvs: &[(usize, DType, usize)]) -> Result<Vec<Tensor>> {
        let mut sw = Vec::with_capacity(sends.len());
        for (dst, t) in &sends {
            let b = self.c.upload(t)?;
            sw.push(self.c.send(&b, self.map[*dst])?);
        }
        let mut rw = Vec::with_capacity(recvs.len());
        for &(src, d, numel) in recvs {
            let b = self.c.alloc(d, &[numel])?;
            rw.push(self.c.recv(&b, self.map[src])?);
        }
        for w in sw {
            self.wait(w)?;
        }
        let mut out = Vec::with_capacity(rw.len());
        for w in rw {
            let b: Buf = self.wait(w)?;
            out.push(self.c.download(&b)?);
        }
        Ok(out)
    }

    fn sendrecv(&self, t: Tensor, dst: usize, src: usize, d: DType, numel: usize) -> Result<Tensor> {
        Ok(self.exchange(vec![(dst, t)], &[(src, d, numel)])?.remove(0))
    }

    fn right(&self) -> usize {
        (self.me + 1) % self.n
    }
    fn left(&self) -> usize {
        (self.me + self.n - 1) % self.n
    }

    /// Every rank's call description (a direct all-to-all: a fixed 256-word header, the rest in
    /// a second message when longer), rank order.
    pub fn exchange_descs(&self, mine: &CallDesc) -> Result<Vec<CallDesc>> {
        const HEAD: usize = 256;
        let words = mine.encode();
        let mut head = vec![0u64; HEAD];
        head[0] = words.len() as u64;
        let k = words.len().min(HEAD - 1);
        head[1..1 + k].copy_from_slice(&words[..k]);
        let tail: Vec<u64> = words[k..].to_vec();
        let peers: Vec<usize> = (0..self.n).filter(|&r| r != self.me).collect();
        let sends = peers.iter().map(|&p| (p, Tensor::from_vec(&[HEAD], head.clone()))).collect();
        let recvs: Vec<_> = peers.iter().map(|&p| (p, DType::U64, HEAD)).collect();
        let heads = self.exchange(sends, &recvs)?;
        // Second round only between pairs where a description is longer than the header.
        let their_len = |h: &Tensor| h.as_slice::<u64>()[0] as usize;
        let cut = self.bug == Bug::DescCutAtHeader;
        let tail_sends = if tail.is_empty() || cut {
            vec![]
        } else {
            peers.iter().map(|&p| (p, Tensor::from_vec(&[tail.len()], tail.clone()))).collect()
        };
        let tail_recvs: Vec<_> = peers
            .iter()
            .zip(&heads)
            .filter(|(_, h)| !cut && their_len(h) > HEAD - 1)
            .map(|(&p, h)| (p, DType::U64, their_len(h) - (HEAD - 1)))
            .collect();
        let tails = if tail_sends.is_empty() && tail_recvs.is_empty() { vec![] } else { self.exchange(tail_sends, &tail_recvs)? };
        let mut tails = tails.into_iter();
        let mut all = Vec::with_capacity(self.n);
        let mut hi = heads.iter();
        for r in 0..self.n {
            if r == self.me {
                all.push(mine.clone());
                continue;
            }
            let h = hi.next().expect("one header per peer");
            let len = their_len(h);
            let mut w: Vec<u64> = h.as_slice::<u64>()[1..1 + len.min(HEAD - 1)].to_vec();
            if len > HEAD - 1 && !cut {
                w.extend_from_slice(tails.next().expect("a tail per long header").as_slice::<u64>());
            }
            let d = CallDesc::decode(&w).ok_or_else(|| {
                CollectiveError::Backend(format!("{} #{} on rank {}: rank {r}'s call description is corrupt", self.name, self.seq, self.me))
            })?;
            all.push(d);
        }
        Ok(all)
    }

    /// Ring reduce-scatter of `acc` (wide values) in place: afterwards the chunk this rank owns
    /// is fully reduced. Returns the owned chunk index. `owner_shift`: end owning chunk `me`
    /// (reduce_scatter) instead of `me + 1` (all_reduce's schedule).
    fn ring_reduce_scatter(&self, acc: &mut Tensor, op: ReduceOp, dtype: DType, owner_shift: bool) -> Result<usize> {
        let (n, me, total) = (self.n, self.me, acc.numel());
        let wd = acc.dtype();
        let shift = usize::from(owner_shift);
        for s in 0..n.saturating_sub(1) {
            let send_c = (me + 2 * n - s - shift) % n;
            let recv_c = (me + 2 * n - s - 1 - shift) % n;
            let (so, sl) = chunk(total, n, send_c, self.bug);
            let (ro, rl) = chunk(total, n, recv_c, self.bug);
            let out = slice(acc, so, sl);
            let got = self.sendrecv(out, self.right(), self.left(), wd, rl)?;
            let mut part = slice(acc, ro, rl);
            combine(&mut part, &got, op, dtype, self.bug);
            put(acc, ro, &part);
        }
        Ok((me + 2 * n - (n - 1) - shift) % n)
    }

    /// all_reduce of one tensor: ring reduce-scatter, then ring all-gather of the reduced chunks.
    pub fn all_reduce(&self, x: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (n, me) = (self.n, self.me);
        let dtype = x.dtype();
        let mut acc = widen(x, op, n, self.bug);
        let total = acc.numel();
        let wd = acc.dtype();
        let owned = self.ring_reduce_scatter(&mut acc, op, dtype, false)?;
        // Ring all-gather: at step s send chunk owned - s, receive owned - s - 1.
        for s in 0..n.saturating_sub(1) {
            let send_c = (owned + n - s) % n;
            let recv_c = (owned + 2 * n - s - 1) % n;
            let (so, sl) = chunk(total, n, send_c, self.bug);
            let (ro, rl) = chunk(total, n, recv_c, self.bug);
            let got = self.sendrecv(slice(&acc, so, sl), self.right(), self.left(), wd, rl)?;
            put(&mut acc, ro, &got);
        }
        let _ = me;
        Ok(narrow(&acc, dtype, op, n, self.bug).reshaped(x.shape()))
    }

    /// reduce_scatter of one tensor (dim 0 divisible by ws, validated): this rank's rows.
    pub fn reduce_scatter(&self, x: &Tensor, op: ReduceOp, out_shape: &[usize]) -> Result<Tensor> {
        let n = self.n;
        let dtype = x.dtype();
        let mut acc = widen(x, op, n, self.bug);
        let total = acc.numel();
        // The bug runs all_reduce's schedule (rank r ends owning chunk r + 1) but takes chunk r.
        let bug = self.bug == Bug::ReduceScatterOwnerShift;
        let owned = self.ring_reduce_scatter(&mut acc, op, dtype, !bug)?;
        let take = if bug { self.me } else { owned };
        // Equal chunks (total divisible by n): the owned chunk is the result.
        let m = total / n;
        let mine = slice(&acc, take * m, m);
        Ok(narrow(&mine, dtype, op, n, self.bug).reshaped(out_shape))
    }

    /// Ring all-gather of `x`'s bytes: rank r's part at slot r.
    pub fn all_gather(&self, x: &Tensor, out_shape: &[usize]) -> Result<Tensor> {
        let (n, me) = (self.n, self.me);
        let d = x.dtype();
        let m = x.numel();
        let mut out = Tensor::zeros(d, &[n * m]);
        put(&mut out, me * m, &x.clone().reshaped(&[m]));
        for s in 0..n.saturating_sub(1) {
            let send_slot = (me + n - s) % n;
            let recv_slot = (me + 2 * n - s - 1) % n;
            let got = self.sendrecv(slice(&out, send_slot * m, m), self.right(), self.left(), d, m)?;
            put(&mut out, recv_slot * m, &got);
        }
        Ok(out.reshaped(out_shape))
    }

    /// Pairwise all_to_all: at step s send to me + s, receive from me - s.
    pub fn all_to_all(&self, x: &Tensor, in_splits: &[usize], out_splits: &[usize], out_shape: &[usize]) -> Result<Tensor> {
        let (n, me) = (self.n, self.me);
        let d = x.dtype();
        let row = if x.shape().is_empty() { 1 } else { x.shape()[1..].iter().product() };
        let in_off: Vec<usize> = prefix(in_splits);
        let out_off: Vec<usize> = if self.bug == Bug::AllToAllOutOffsetsFromInput { prefix(in_splits) } else { prefix(out_splits) };
        let out_rows: usize = out_splits.iter().sum();
        let flat = x.clone().reshaped(&[x.numel()]);
        let mut out = Tensor::zeros(d, &[out_rows * row]);
        let own = slice(&flat, in_off[me] * row, in_splits[me] * row);
        put(&mut out, out_off[me] * row, &own);
        for s in 1..n {
            let dst = (me + s) % n;
            let src = (me + n - s) % n;
            let t = slice(&flat, in_off[dst] * row, in_splits[dst] * row);
            let got = self.sendrecv(t, dst, src, d, out_splits[src] * row)?;
            put(&mut out, out_off[src] * row, &got);
        }
        Ok(out.reshaped(out_shape))
    }

    /// This rank's virtual rank in a tree rooted at `root`.
    fn vrank(&self, root: usize) -> usize {
        if self.bug == Bug::TreeVrankUnsigned {
            self.me.wrapping_sub(root) % self.n
        } else {
            (self.me + self.n - root) % self.n
        }
    }
    fn real(&self, v: usize, root: usize) -> usize {
        (v + root) % self.n
    }

    /// Binomial-tree broadcast from `root`, pipelined in segments of [`SEGMENT`] elements.
    pub fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        let n = self.n;
        let d = x.dtype();
        let total = x.numel();
        let v = self.vrank(root);
        let mut data = x.clone().reshaped(&[total]);
        let nseg = if self.bug == Bug::BcastSegmentsDropTail { (total / SEGMENT).max(1) } else { total.div_ceil(SEGMENT).max(1) };
        let seg = |k: usize| {
            let o = k * SEGMENT;
            (o, SEGMENT.min(total.saturating_sub(o)))
        };
        // The parent: v minus its lowest set bit; children: v + mask for masks below it.
        let low = if v == 0 { n.next_power_of_two() } else { v & v.wrapping_neg() };
        let mut children = Vec::new();
        let mut mask = 1;
        while mask < low && mask < n {
            if v + mask < n {
                children.push(self.real(v + mask, root));
            }
            mask <<= 1;
        }
        // Largest subtree first, as MPICH.
        children.reverse();
        for k in 0..nseg {
            let (o, l) = seg(k);
            if v != 0 {
                let parent = self.real(v - low, root);
                let got = self.exchange(vec![], &[(parent, d, l)])?.remove(0);
                put(&mut data, o, &got);
            }
            if !children.is_empty() {
                let part = slice(&data, o, l);
                self.exchange(children.iter().map(|&c| (c, part.clone())).collect(), &[])?;
            }
        }
        Ok(data.reshaped(x.shape()))
    }

    /// Binomial-tree reduce to `root`: the result on the root, `None` elsewhere.
    pub fn reduce(&self, x: &Tensor, op: ReduceOp, root: usize) -> Result<Option<Tensor>> {
        let n = self.n;
        let dtype = x.dtype();
        let v = self.vrank(root);
        let mut acc = widen(x, op, n, self.bug);
        let wd = acc.dtype();
        let mut mask = 1;
        while mask < n {
            if v & mask != 0 {
                let parent = self.real(v - mask, root);
                if self.bug == Bug::ReduceTreePartialsInDtype {
                    // The partial narrowed to the dtype (no avg division yet) and widened back.
                    let sum_like = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
                    acc = widen(&narrow(&acc, dtype, sum_like, n, Bug::None), ReduceOp::Sum, n, Bug::None);
                }
                self.exchange(vec![(parent, acc)], &[])?;
                return Ok(None);
            }
            if v + mask < n {
                let child = self.real(v + mask, root);
                let got = self.exchange(vec![], &[(child, wd, acc.numel())])?.remove(0);
                combine(&mut acc, &got, op, dtype, self.bug);
            }
            mask <<= 1;
        }
        Ok(Some(narrow(&acc, dtype, op, n, self.bug).reshaped(x.shape())))
    }

    /// Linear gather to `root`: rank r's part at slot r of the root's output.
    pub fn gather(&self, x: &Tensor, root: usize, out_shape: &[usize]) -> Result<Option<Tensor>> {
        let (n, me) = (self.n, self.me);
        let d = x.dtype();
        let m = x.numel();
        if me != root {
            self.exchange(vec![(root, x.clone().reshaped(&[m]))], &[])?;
            return Ok(None);
        }
        let srcs: Vec<usize> = (0..n).filter(|&r| r != me).collect();
        let got = self.exchange(vec![], &srcs.iter().map(|&r| (r, d, m)).collect::<Vec<_>>())?;
        let mut out = Tensor::zeros(d, &[n * m]);
        let slot = |r: usize| if self.bug == Bug::GatherSlotByVrank { (r + n - root) % n } else { r };
        put(&mut out, slot(me) * m, &x.clone().reshaped(&[m]));
        for (r, t) in srcs.iter().zip(got) {
            put(&mut out, slot(*r) * m, &t);
        }
        Ok(Some(out.reshaped(out_shape)))
    }

    /// Linear scatter from `root`: rank r gets rows chunk r of the root's input.
    pub fn scatter(&self, x: &Tensor, root: usize, out_shape: &[usize]) -> Result<Tensor> {
        let (n, me) = (self.n, self.me);
        let d = x.dtype();
        let m = x.numel() / n;
        if me != root {
            return Ok(self.exchange(vec![], &[(root, d, m)])?.remove(0).reshaped(out_shape));
        }
        let flat = x.clone().reshaped(&[x.numel()]);
        let part = |dst: usize| {
            let c = if self.bug == Bug::ScatterChunkByVrank { (dst + n - root) % n } else { dst };
            slice(&flat, c * m, m)
        };
        let sends = (0..n).filter(|&r| r != me).map(|r| (r, part(r))).collect();
        self.exchange(sends, &[])?;
        Ok(part(me).reshaped(out_shape))
    }

    /// permute_tensor: this rank's data goes to `src_dst[me]`; it receives from the rank that
    /// names it.
    pub fn permute(&self, x: &Tensor, src_dst: &[usize]) -> Result<Tensor> {
        let me = self.me;
        let (dst, src) = if self.bug == Bug::PermuteInverse {
            (src_dst.iter().position(|&d| d == me).expect("validated permutation"), src_dst[me])
        } else {
            (src_dst[me], src_dst.iter().position(|&d| d == me).expect("validated permutation"))
        };
        if dst == me {
            return Ok(x.clone());
        }
        let t = x.clone().reshaped(&[x.numel()]);
        Ok(self.sendrecv(t, dst, src, x.dtype(), x.numel())?.reshaped(x.shape()))
    }
}

/// Elements `[off, off + len)` of a flat tensor.
pub fn slice(t: &Tensor, off: usize, len: usize) -> Tensor {
    let s = t.dtype().size();
    Tensor::from_bytes(t.dtype(), &[len], &t.bytes()[off * s..(off + len) * s])
}

/// Writes flat `part` into `t` from element `off`.
pub fn put(t: &mut Tensor, off: usize, part: &Tensor) {
    let s = t.dtype().size();
    let b = part.bytes();
    t.bytes_mut()[off * s..off * s + b.len()].copy_from_slice(b);
}

fn prefix(splits: &[usize]) -> Vec<usize> {
    let mut acc = 0;
    splits
        .iter()
        .map(|&x| {
            let o = acc;
            acc += x;
            o
        })
        .collect()
}
