//! The eighth outside hunt: what the corruption sweep could not see. Subgroups (the sweep's first
//! grid never corrupted a group's call): a fast path for a one-rank group, a large-message path
//! written for the world (peers in world rank order), a root or a block found by assuming the
//! members contiguous. And all_to_all with uneven splits (the sweep's last holes): a receive
//! layout taken from the send splits or from equal splits, a zero-length split that still moves
//! an element. Each is a bug a backend author could ship, over the correct shm backend.

use crate::campaign::Spec;
use crate::{edit, Buf, Bug, Shm};
use concord_core::{Backend, ReduceOp, Result, Tensor, Work};

/// Bytes of one row of `b` (dim 0's unit).
fn row_bytes(s: &Shm, b: &Buf) -> usize {
    let shape = s.inner.buffer_shape(b);
    shape.iter().skip(1).product::<usize>() * s.inner.buffer_dtype(b).size()
}

/// A subgroup smaller than the world whose members are not `0..n` in order.
fn proper_group(s: &Shm) -> bool {
    s.in_subgroup() || s.members.iter().enumerate().any(|(g, &m)| g != m)
}

// ---------------------------------------------------------------- one-rank groups

/// A one-rank group has nothing to exchange: the `_out` all_gather / reduce_scatter return the
/// caller's output as it was (the fast path returns early, before the local copy into `out`).
#[derive(Default)]
pub struct SingletonOutSkipsCopy;

impl Bug for SingletonOutSkipsCopy {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        if s.ws() == 1 && s.world_size > 1 && s.numel(x) == s.numel(out) {
            return Ok(s.done(out.clone(), "all_gather_into_tensor_out"));
        }
        s.inner.all_gather_into_tensor_out(x, out)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if s.ws() == 1 && s.world_size > 1 && s.numel(x) == s.numel(out) && s.inner.buffer_dtype(x) == s.inner.buffer_dtype(out) {
            return Ok(s.done(out.clone(), "reduce_scatter_tensor_out"));
        }
        s.inner.reduce_scatter_tensor_out(x, op, out)
    }
}

/// A one-rank group's coalesced all_reduce returns the inputs' buffers themselves (the in-place
/// variant's fast path shared with the out-of-place one): the result aliases the input.
#[derive(Default)]
pub struct SingletonCoalescedAliases;

impl Bug for SingletonCoalescedAliases {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if s.ws() == 1 && s.world_size > 1 {
            return Ok(s.done(xs.to_vec(), "all_reduce_coalesced"));
        }
        s.inner.all_reduce_coalesced(xs, op)
    }
}

// ---------------------------------------------------------------- world paths in groups

/// Output elements from which all_gather takes the pipelined path.
const PIPELINED_ELEMS: usize = 4096;

/// all_gather's pipelined path (outputs of 4 Ki elements and more) was written for the world:
/// in a group whose order is not the world's, it lays the members' blocks out in ascending
/// WORLD rank order (the small-message path places them by group rank).
#[derive(Default)]
pub struct GroupLargeGatherWorldOrder;

impl GroupLargeGatherWorldOrder {
    fn reorder(members: Vec<usize>) -> impl FnOnce(&concord_shm::ShmBackend, &Buf) -> Result<()> {
        move |be, out| {
            edit(be, out, |t| {
                let n = members.len();
                let chunk = t.len_bytes() / n;
                let src = t.clone();
                let mut by_world: Vec<usize> = (0..n).collect();
                by_world.sort_by_key(|&g| members[g]);
                for (slot, &g) in by_world.iter().enumerate() {
                    crate::copy_bytes(t, slot * chunk, &src, g * chunk, chunk);
                }
            })
        }
    }
}

impl Bug for GroupLargeGatherWorldOrder {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        if !proper_group(s) || s.numel(x) * s.ws() < PIPELINED_ELEMS {
            return Ok(w);
        }
        Ok(s.then(w, Self::reorder(s.members.clone())))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        if !proper_group(s) || s.numel(x) * s.ws() < PIPELINED_ELEMS {
            return Ok(w);
        }
        Ok(s.then(w, Self::reorder(s.members.clone())))
    }
}

/// Elements from which reduce_scatter takes the ring path.
const RING_ELEMS: usize = 4096;

/// reduce_scatter's ring path (inputs of 4 Ki elements and more) hands each member the block of
/// its WORLD rank modulo the group size (the ring was indexed by world rank); the small path is
/// right, and so is the world (and any group whose members are `0..n`).
#[derive(Default)]
pub struct GroupLargeRsBlockByWorldRank;

impl Bug for GroupLargeRsBlockByWorldRank {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = s.ws();
        let mut shape = s.inner.buffer_shape(x);
        // Every member takes the same path (the group's facts only), or the call would not match.
        if !proper_group(s) || s.numel(x) < RING_ELEMS || shape.is_empty() || !shape[0].is_multiple_of(n) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let wrong = s.members.get(s.rank()).map_or(s.rank(), |&m| m % n);
        // The whole reduction, then the block of the world rank.
        let full = s.inner.all_reduce(x, op)?;
        shape[0] /= n;
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &shape)?;
        let o = out.clone();
        Ok(s.then_as(full, out, move |be, full| {
            let t = be.download(full)?;
            let chunk = t.len_bytes() / n;
            let mut part = be.download(&o)?;
            crate::copy_bytes(&mut part, 0, &t, wrong * chunk, chunk);
            be.write(&o, &part)
        }))
    }
}

/// all_gather_into_tensor_out in a group writes each member's block at the offset of its WORLD
/// rank modulo the group size (the `_out` path's offsets copied from the world's code); the
/// out-of-place path is right. Several members may land on one slot (the later one wins).
#[derive(Default)]
pub struct GroupAgOutWorldOffsets;

impl Bug for GroupAgOutWorldOffsets {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        if !proper_group(s) || s.members.iter().enumerate().all(|(g, &m)| m % s.ws() == g) {
            return Ok(w);
        }
        let members = s.members.clone();
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let n = members.len();
                let chunk = t.len_bytes() / n;
                let src = t.clone();
                for (g, &m) in members.iter().enumerate() {
                    crate::copy_bytes(t, (m % n) * chunk, &src, g * chunk, chunk);
                }
            })
        }))
    }
}

/// broadcast in a group finds the source's world rank as `members[0] + src` (members assumed
/// contiguous and sorted), then the group rank of that world rank (the group's first rank when
/// it is not a member): every member agrees, so the call completes, from the wrong source.
#[derive(Default)]
pub struct GroupBroadcastSrcContiguous;

impl GroupBroadcastSrcContiguous {
    fn src(s: &Shm, src: usize) -> usize {
        let Some(&first) = s.members.first() else { return src };
        s.members.iter().position(|&m| m == first + src).unwrap_or(0)
    }
}

impl Bug for GroupBroadcastSrcContiguous {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let src = if src < s.ws() { Self::src(s, src) } else { src };
        s.inner.broadcast(x, src)
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let src = if src < s.ws() { Self::src(s, src) } else { src };
        s.inner.broadcast_(x, src)
    }
}

// ---------------------------------------------------------------- all_to_all splits

/// `(in, out)` splits when both are given, of the right length, and not equal to each other.
fn uneven<'a>(s: &Shm, o: Option<&'a [usize]>, i: Option<&'a [usize]>) -> Option<(&'a [usize], &'a [usize])> {
    let (o, i) = (o?, i?);
    (o.len() == s.ws() && i.len() == s.ws() && o != i).then_some((i, o))
}

/// all_to_all_single lays its output out by its INPUT splits (the receive displacements are the
/// send ones, as in a symmetric exchange): the block from rank `r` lands at `Σ_{q<r} in[q]`,
/// cut to the output. Right whenever the splits are equal or symmetric.
#[derive(Default)]
pub struct A2aRecvOffsetsFromSendSplits;

impl Bug for A2aRecvOffsetsFromSendSplits {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let Some((ins, outs)) = uneven(s, o, i) else { return Ok(w) };
        let (ins, outs) = (ins.to_vec(), outs.to_vec());
        Ok(s.then(w, move |be, out| {
            let row = {
                let sh = be.buffer_shape(out);
                sh.iter().skip(1).product::<usize>() * be.buffer_dtype(out).size()
            };
            edit(be, out, |t| relay(t, row, &outs, |r| ins[..r].iter().sum()))
        }))
    }
}

/// Rewrites `t` (blocks of `sizes[r]` rows, in order) with block `r` at row `at(r)`, cut to `t`;
/// rows nothing lands on are zero.
fn relay(t: &mut Tensor, row: usize, sizes: &[usize], at: impl Fn(usize) -> usize) {
    let src = t.clone();
    t.bytes_mut().fill(0);
    let total = t.len_bytes();
    let mut from = 0;
    for (r, &n) in sizes.iter().enumerate() {
        let to = at(r) * row;
        let len = (n * row).min(total.saturating_sub(to));
        if len > 0 {
            crate::copy_bytes(t, to, &src, from, len);
        }
        from += n * row;
    }
}

/// all_to_all_single computes its receive offsets from equal splits (`r · total / ws`, the
/// equal-split path's formula kept for explicit splits): uneven output splits land at the wrong
/// rows.
#[derive(Default)]
pub struct A2aRecvOffsetsEqualSplit;

impl Bug for A2aRecvOffsetsEqualSplit {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let Some(outs) = o.filter(|o| o.len() == s.ws() && o.iter().any(|&n| n != o[0])) else { return Ok(w) };
        let outs = outs.to_vec();
        let ws = s.ws();
        Ok(s.then(w, move |be, out| {
            let sh = be.buffer_shape(out);
            let row = sh.iter().skip(1).product::<usize>() * be.buffer_dtype(out).size();
            let total = sh.first().copied().unwrap_or(0);
            edit(be, out, |t| relay(t, row, &outs, |r| r * total / ws))
        }))
    }
}

/// A zero-length split still moves one row (the copy loop's minimum transfer): the receiver's
/// blocks after an empty one from a peer shift down by a row (the first row of the next block is
/// lost past the end), and its first rows repeat.
#[derive(Default)]
pub struct A2aZeroSplitMovesOneRow;

impl Bug for A2aZeroSplitMovesOneRow {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let Some(outs) = o.filter(|o| o.len() == s.ws()) else { return Ok(w) };
        // A zero split followed by a non-empty block.
        let Some(z) = (0..outs.len()).find(|&r| outs[r] == 0 && outs[r + 1..].iter().any(|&n| n > 0)) else { return Ok(w) };
        let at: usize = outs[..z].iter().sum();
        let row = row_bytes(s, x);
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let src = t.clone();
                let total = t.len_bytes();
                let from = at * row;
                if from + row <= total {
                    crate::copy_bytes(t, from + row, &src, from, total - from - row);
                }
            })
        }))
    }
}

/// all_to_all_single takes a sparse path when more than half of a rank's output splits are zero
/// (mixture-of-experts dispatch at many ranks), which walks the non-empty sources and stops one
/// short: the last non-empty block stays zero.
#[derive(Default)]
pub struct A2aSparsePathDropsLast;

impl Bug for A2aSparsePathDropsLast {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        let Some(outs) = o.filter(|o| o.len() == s.ws()) else { return Ok(w) };
        let zeros = outs.iter().filter(|&&n| n == 0).count();
        let Some(last) = outs.iter().rposition(|&n| n > 0) else { return Ok(w) };
        if 2 * zeros <= outs.len() {
            return Ok(w);
        }
        let at: usize = outs[..last].iter().sum();
        let len = outs[last];
        let row = row_bytes(s, x);
        Ok(s.then(w, move |be, out| edit(be, out, |t| t.bytes_mut()[at * row..(at + len) * row].fill(0))))
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<SingletonOutSkipsCopy>(
            "singleton_out_skips_copy",
            "subgroups",
            "in a one-rank group the `_out` all_gather / reduce_scatter return the caller's output untouched (the fast path returns before the local copy)",
            &["sizes::all_gather_into_tensor::outbuf::f32::group_grid::ws7"],
        ),
        spec::<SingletonCoalescedAliases>(
            "singleton_coalesced_aliases",
            "placement.out_of_place",
            "in a one-rank group the out-of-place coalesced all_reduce returns the input buffers themselves",
            &["sizes::all_reduce::coalesced::f32::group_grid::ws7"],
        ),
        spec::<GroupLargeGatherWorldOrder>(
            "group_large_gather_world_order",
            "subgroups",
            "all_gather's pipelined path (outputs of 4 Ki elements and more) lays a group's blocks out in world rank order",
            &["sizes::all_gather_into_tensor::out::f32::group_grid::ws7"],
        ),
        spec::<GroupLargeRsBlockByWorldRank>(
            "group_large_rs_block_by_world_rank",
            "subgroups",
            "reduce_scatter's ring path (inputs of 4 Ki elements and more) gives a group member the block of its world rank modulo the group size",
            &["sizes::reduce_scatter_tensor::out::f32::group_grid::ws7"],
        ),
        spec::<GroupAgOutWorldOffsets>(
            "group_ag_out_world_offsets",
            "subgroups",
            "all_gather_into_tensor_out in a group writes each member's block at its world rank modulo the group size",
            &["sizes::all_gather_into_tensor::outbuf::f32::group_grid::ws7"],
        ),
        spec::<GroupBroadcastSrcContiguous>(
            "group_broadcast_src_contiguous",
            "subgroups",
            "broadcast in a group takes the source's world rank as members[0] + src (members assumed contiguous and sorted)",
            &["sizes::broadcast::out::f32::group_grid::ws7"],
        ),
        spec::<A2aRecvOffsetsFromSendSplits>(
            "a2a_recv_offsets_from_send_splits",
            "values.move",
            "all_to_all_single places the blocks it receives at the offsets of its INPUT splits (a symmetric exchange assumed)",
            &["sizes::all_to_all_single::uneven::f32::grid::ws3"],
        ),
        spec::<A2aRecvOffsetsEqualSplit>(
            "a2a_recv_offsets_equal_split",
            "values.move",
            "all_to_all_single computes receive offsets as r * total / ws (the equal-split formula) for explicit uneven output splits",
            &["sizes::all_to_all_single::uneven::f32::grid::ws3"],
        ),
        spec::<A2aZeroSplitMovesOneRow>(
            "a2a_zero_split_moves_one_row",
            "values.move",
            "a zero-length split still moves one row: the blocks after an empty one shift down a row",
            &["sizes::all_to_all_single::uneven::f32::grid::ws3"],
        ),
        spec::<A2aSparsePathDropsLast>(
            "a2a_sparse_path_drops_last",
            "values.move",
            "all_to_all_single's sparse path (more than half the output splits zero) drops the last non-empty block",
            &["sizes::all_to_all_single::uneven::f32::grid::ws16"],
        ),
    ]
}
