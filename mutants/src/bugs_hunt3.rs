//! The third outside hunt: data placement and structure. Rooted ops at a middle root of a
//! subgroup whose members are neither contiguous nor sorted, state shared between communicators
//! (the world and a group, two groups over the same ranks), rounding
//! and ordering slips of the half-precision and min / max kernels off the paths the matrix runs,
//! kernel blocks and message sizes past the thresholds a backend switches at, and the split
//! lists of all_to_all. Each is a bug a backend author could ship, over the correct shm backend.

use crate::bugs_hunt2::{int_at, set_int};
use crate::campaign::Spec;
use crate::{edit, Buf, Bug, Group, Shm, BUG_WAIT};
use concord_core::{Backend, DType, ReduceOp, Result, Tensor, Work};
use concord_shm::ShmBackend;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The extra collectives a bug's emulation issues (gathers of every rank's input, issued alike on
/// every rank before the op itself, so they read the inputs before an in-place op overwrites
/// them), left out of `outstanding()`: they are the emulation's, not the bug's. One per
/// communicator (a field of the bug).
#[derive(Default)]
pub struct Hidden(Arc<AtomicUsize>);

/// Held until the extra collective has been waited (or dropped with the work that waits it).
pub struct HiddenGuard(Arc<AtomicUsize>);

impl Drop for HiddenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Hidden {
    fn guard(&self) -> HiddenGuard {
        self.0.fetch_add(1, Ordering::SeqCst);
        HiddenGuard(self.0.clone())
    }
    /// Every rank's `x`, gathered.
    pub(crate) fn gather(&self, s: &Shm, x: &Buf) -> Result<(Work<Buf>, HiddenGuard)> {
        let g = self.guard();
        Ok((s.inner.all_gather_into_tensor(x)?, g))
    }
    /// Every rank's `xs`, gathered.
    pub(crate) fn gather_all(&self, s: &Shm, xs: &[Buf]) -> Result<(Work<Vec<Buf>>, HiddenGuard)> {
        let g = self.guard();
        Ok((s.inner.all_gather_into_tensor_coalesced(xs)?, g))
    }
    /// `outstanding()` without the extra collectives in flight.
    pub(crate) fn outstanding(&self, s: &Shm) -> usize {
        (s.inner.outstanding() + s.own.get()).saturating_sub(self.0.load(Ordering::SeqCst))
    }
}

/// Rank `r`'s element `i` of a gathered tensor of `ws` equal parts.
fn part_f64(g: &Tensor, ws: usize, r: usize, i: usize) -> f64 {
    g.get_f64(r * (g.numel() / ws) + i)
}

/// The bits of `v` rounded toward zero in half-precision `d` (f16 / bf16).
fn toward_zero(d: DType, v: f64) -> u16 {
    let t = Tensor::from_f64(d, &[1], &[v]);
    let bits = u16::from_le_bytes([t.bytes()[0], t.bytes()[1]]);
    let r = t.get_f64(0);
    if r.is_finite() && r != 0.0 && r.abs() > v.abs() {
        bits - 1
    } else {
        bits
    }
}

fn set_bits16(t: &mut Tensor, i: usize, bits: u16) {
    t.bytes_mut()[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
}

/// Element range `[a, b)` of the `j`-th of `n` work chunks of `el` elements (shm's split).
pub(crate) fn chunk(el: usize, j: usize, n: usize) -> (usize, usize) {
    (el * j / n, el * (j + 1) / n)
}

// ---------------------------------------------------------------- subgroups: roots in the middle

/// Whether group rank `g` is one the world-rank "upper" test of a chain takes for a root `root`
/// strictly inside the group: `members[g] > members[root]` (world ranks), where the lower chain
/// runs over group ranks `0..root`.
fn upper_by_world(members: &[usize], g: usize, root: usize) -> bool {
    g != root && members[g] > members[root]
}

/// `reduce` `sum` as two chains into the root: group ranks `0..root` up from the bottom, and an
/// upper chain (run when the root is not the last rank) over the ranks whose WORLD rank is above
/// the root's. In the world and in sorted groups that is every rank above the root; in a group
/// whose members are not sorted, a rank lands in both chains (counted twice) or in neither
/// (left out).
#[derive(Default)]
pub struct GroupReduceUpperByWorldRank;

impl Bug for GroupReduceUpperByWorldRank {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let (me, n) = (s.rank(), s.ws());
        if op != ReduceOp::Sum || root + 1 >= n || root >= n || s.members.len() != n {
            return s.inner.reduce(x, op, root);
        }
        let times = usize::from(me <= root) + usize::from(upper_by_world(&s.members, me, root));
        if times == 1 {
            return s.inner.reduce(x, op, root);
        }
        let mut t = s.inner.download(x)?;
        for i in 0..t.numel() {
            if t.dtype().is_float() {
                let v = t.get_f64(i) * times as f64;
                crate::set_f64(&mut t, i, v);
            } else {
                let v = int_at(&t, i);
                set_int(&mut t, i, v.wrapping_mul(times as i128));
            }
        }
        s.inner.reduce(&s.inner.upload(&t)?, op, root)
    }
}

/// `gather` as the same two chains: at a root strictly inside a group whose members are not
/// sorted, the chunks of the group ranks above the root whose world rank is below the root's
/// are in neither chain and never arrive (their slots stay zero).
#[derive(Default)]
pub struct GroupGatherUpperByWorldRank;

impl Bug for GroupGatherUpperByWorldRank {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (me, n) = (s.rank(), s.ws());
        let w = s.inner.gather(x, root)?;
        if me != root || root + 1 >= n || s.members.len() != n {
            return Ok(w);
        }
        let lost: Vec<usize> = (root + 1..n).filter(|&g| !upper_by_world(&s.members, g, root)).collect();
        if lost.is_empty() {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let part = t.len_bytes() / n;
                for &g in &lost {
                    t.bytes_mut()[g * part..(g + 1) * part].fill(0);
                }
            })
        }))
    }
}

/// `scatter` in a subgroup hands each member the chunk of its WORLD rank (modulo the group
/// size) instead of its group rank.
#[derive(Default)]
pub struct GroupScatterChunkByWorldRank {
    hidden: Hidden,
}

impl Bug for GroupScatterChunkByWorldRank {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (me, n) = (s.rank(), s.ws());
        // Decided alike on every member (the extra gather below is a collective).
        if s.members.iter().enumerate().all(|(g, &m)| m % n.max(1) == g) {
            return s.inner.scatter(x, root);
        }
        let wrong = s.members[me] % n;
        // Every rank gathers the root's input (an all_gather, sliced), then takes the wrong chunk.
        let (all, hid) = self.hidden.gather(s, x)?;
        let w = s.inner.scatter(x, root)?;
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(all.wait(BUG_WAIT)?)?;
            let root_part = g.len_bytes() / n;
            let chunk = root_part / n;
            let from = root * root_part + wrong * chunk;
            edit(be, out, |t| t.bytes_mut().copy_from_slice(&g.bytes()[from..from + chunk]))
        }))
    }
}

// ---------------------------------------------------------------- state shared by communicators

/// Communicators are cached by their SORTED member list: `new_group` over ranks some earlier
/// group already holds, in another order, returns that earlier communicator (its rank order).
#[derive(Default)]
pub struct GroupCacheByMemberSet {
    cache: Mutex<HashMap<Vec<usize>, Group>>,
}

impl Bug for GroupCacheByMemberSet {
    fn new_group(&self, _s: &Shm, made: Option<Group>) -> Option<Group> {
        let (g, members) = made?;
        let mut key = members.clone();
        key.sort_unstable();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        Some(cache.entry(key).or_insert((g, members)).clone())
    }
}

/// One all_reduce in flight on some communicator of this process: its staged input is
/// overwritten (`clobbered`) when another communicator issues an all_reduce before it completes.
struct Staged {
    comm: usize,
    clobbered: Arc<Mutex<Option<Tensor>>>,
}

/// The process's one staging buffer (see [`SharedStaging`]).
static STAGING: Mutex<Vec<Staged>> = Mutex::new(Vec::new());

/// Out-of-place `all_reduce` stages its input in one buffer per PROCESS (a communicator's ops
/// run one at a time, so one buffer looked enough): with all_reduces of two communicators (the
/// world and a group) in flight together, the later one's input overwrites the earlier one's
/// staged input, and the earlier one returns the bytes staged last.
#[derive(Default)]
pub struct SharedStaging;

impl Bug for SharedStaging {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let comm = Arc::as_ptr(&s.inner) as usize;
        let mine = s.inner.download(x)?;
        let clobbered = Arc::new(Mutex::new(None));
        {
            let mut st = STAGING.lock().unwrap_or_else(|e| e.into_inner());
            // Entries whose work is gone (waited or dropped) no longer count.
            st.retain(|e| Arc::strong_count(&e.clobbered) > 1);
            for e in st.iter().filter(|e| e.comm != comm) {
                e.clobbered.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| mine.clone());
            }
            st.push(Staged { comm, clobbered: clobbered.clone() });
        }
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| {
            let Some(staged) = clobbered.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
            edit(be, out, |t| {
                let n = t.len_bytes().min(staged.len_bytes());
                t.bytes_mut()[..n].copy_from_slice(&staged.bytes()[..n]);
            })
        }))
    }
}

// ---------------------------------------------------------------- half precision off the matrix's path

/// The exact sums of the f16 / bf16 tensors of `xs` (every rank's, from `g`), rounded toward
/// zero (the fusion-buffer kernel narrows its f32 accumulator by dropping the low bits) into
/// `outs`.
fn truncated_sums(be: &ShmBackend, g: &[Buf], outs: &[Buf], ws: usize) -> Result<()> {
    for (gi, o) in g.iter().zip(outs) {
        let d = be.buffer_dtype(o);
        if !matches!(d, DType::F16 | DType::BF16) {
            continue;
        }
        let g = be.download(gi)?;
        let n = g.numel() / ws.max(1);
        edit(be, o, |t| {
            for i in 0..n {
                let v: f64 = (0..ws).map(|r| part_f64(&g, ws, r, i)).sum();
                set_bits16(t, i, toward_zero(d, v));
            }
        })?;
    }
    Ok(())
}

/// `all_reduce_coalesced` (and `_`) packs the list into an f32 fusion buffer and narrows f16 /
/// bf16 `sum` results back by truncation (dropping the low mantissa bits, the classic bf16
/// conversion) instead of rounding to nearest even.
#[derive(Default)]
pub struct CoalescedHalfTruncates {
    hidden: Hidden,
}

impl CoalescedHalfTruncates {
    fn applies(s: &Shm, xs: &[Buf], op: ReduceOp) -> bool {
        op == ReduceOp::Sum && xs.iter().any(|x| matches!(s.inner.buffer_dtype(x), DType::F16 | DType::BF16))
    }
    fn run(&self, s: &Shm, xs: &[Buf], issue: impl FnOnce() -> Result<Work<Vec<Buf>>>) -> Result<Work<Vec<Buf>>> {
        let (g, hid) = self.hidden.gather_all(s, xs)?;
        let w = issue()?;
        let ws = s.ws();
        Ok(s.then(w, move |be, outs| {
            let _hid = hid;
            truncated_sums(be, g.wait(BUG_WAIT)?, outs, ws)
        }))
    }
}

impl Bug for CoalescedHalfTruncates {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if !Self::applies(s, xs, op) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        self.run(s, xs, || s.inner.all_reduce_coalesced(xs, op))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if !Self::applies(s, xs, op) {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        self.run(s, xs, || s.inner.all_reduce_coalesced_(xs, op))
    }
}

/// f16 / bf16 `avg` of `all_reduce` rounds the sum to the dtype, then divides and rounds again
/// (the avg is the sum kernel followed by a divide kernel), instead of rounding the exact
/// average once.
#[derive(Default)]
pub struct HalfAvgRoundsSumFirst {
    hidden: Hidden,
}

impl Bug for HalfAvgRoundsSumFirst {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let d = s.inner.buffer_dtype(x);
        if op != ReduceOp::Avg || !matches!(d, DType::F16 | DType::BF16) {
            return s.inner.all_reduce(x, op);
        }
        let (g, hid) = self.hidden.gather(s, x)?;
        let w = s.inner.all_reduce(x, op)?;
        let ws = s.ws();
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(g.wait(BUG_WAIT)?)?;
            edit(be, out, |t| {
                let round = |v: f64| Tensor::from_f64(d, &[1], &[v]).get_f64(0);
                let vals: Vec<f64> =
                    (0..t.numel()).map(|i| round(round((0..ws).map(|r| part_f64(&g, ws, r, i)).sum::<f64>()) / ws as f64)).collect();
                *t = Tensor::from_f64(d, t.shape(), &vals);
            })
        }))
    }
}

/// f16 `all_reduce` converts each block of 2048 elements through a stack buffer and stores
/// every block of a rank's work chunk at the START of the chunk (the block's offset is dropped
/// from the store): with more than 2048 elements per rank, the later blocks overwrite the first
/// and the rest of the chunk is never written (zeros out of place, the input in place).
#[derive(Default)]
pub struct F16BlocksAtChunkStart;

const BLOCK: usize = 2048;

impl F16BlocksAtChunkStart {
    fn misplace(t: &mut Tensor, unwritten: &Tensor, n: usize) {
        let el = t.numel();
        let right = t.clone();
        for j in 0..n {
            let (a, b) = chunk(el, j, n);
            if b - a <= BLOCK {
                continue;
            }
            let mut k = 0;
            while k < b - a {
                let m = BLOCK.min(b - a - k);
                t.bytes_mut()[2 * a..2 * (a + m)].copy_from_slice(&right.bytes()[2 * (a + k)..2 * (a + k + m)]);
                k += BLOCK;
            }
            // Past the first block: never written.
            t.bytes_mut()[2 * (a + BLOCK)..2 * b].copy_from_slice(&unwritten.bytes()[2 * (a + BLOCK)..2 * b]);
        }
    }
}

impl Bug for F16BlocksAtChunkStart {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, n) = (s.inner.buffer_dtype(x), s.ws());
        if d != DType::F16 || s.numel(x) <= BLOCK {
            return s.inner.all_reduce(x, op);
        }
        let w = s.inner.all_reduce(x, op)?;
        let zeros = Tensor::zeros(d, &s.inner.buffer_shape(x));
        Ok(s.then(w, move |be, out| edit(be, out, |t| Self::misplace(t, &zeros, n))))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, n) = (s.inner.buffer_dtype(x), s.ws());
        if d != DType::F16 || s.numel(x) <= BLOCK {
            return s.inner.all_reduce_(x, op);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| edit(be, out, |t| Self::misplace(t, &mine, n))))
    }
}

// ---------------------------------------------------------------- min / max and premul_sum off all_reduce

/// The float min / max kernel of `reduce_scatter_tensor` (all variants), `reduce` and in-place
/// `all_reduce_` compares with IEEE `<` / `>` (NaN still propagated): `-0.0` and `+0.0` compare
/// equal, so the first rank's zero wins (`max(-0, +0) = -0`), against the declared `-0 < +0`.
#[derive(Default)]
pub struct MinMaxSignedZeroFirstRank {
    hidden: Hidden,
}

impl MinMaxSignedZeroFirstRank {
    fn applies(s: &Shm, x: &Buf, op: ReduceOp) -> bool {
        s.inner.buffer_dtype(x).is_float() && matches!(op, ReduceOp::Min | ReduceOp::Max)
    }
    /// Where the right result is a zero, the zero of the first rank whose value is a zero.
    /// `at(i)` maps the result's element `i` to the input element it reduces.
    fn first_zero(t: &mut Tensor, g: &Tensor, ws: usize, at: impl Fn(usize) -> usize) {
        for i in 0..t.numel() {
            if t.get_f64(i) == 0.0 {
                if let Some(z) = (0..ws).map(|r| part_f64(g, ws, r, at(i))).find(|v| *v == 0.0) {
                    crate::set_f64(t, i, z);
                }
            }
        }
    }
    fn rs(s: &Shm, (g, hid): (Work<Buf>, HiddenGuard), w: Work<Buf>) -> Result<Work<Buf>> {
        let (ws, me) = (s.ws(), s.rank());
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(g.wait(BUG_WAIT)?)?;
            edit(be, out, |t| {
                let k = t.numel();
                Self::first_zero(t, &g, ws, |i| me * k + i)
            })
        }))
    }
    fn whole(s: &Shm, (g, hid): (Work<Buf>, HiddenGuard), w: Work<Buf>) -> Result<Work<Buf>> {
        let ws = s.ws();
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(g.wait(BUG_WAIT)?)?;
            edit(be, out, |t| Self::first_zero(t, &g, ws, |i| i))
        }))
    }
}

impl Bug for MinMaxSignedZeroFirstRank {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let g = self.hidden.gather(s, x)?;
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        Self::rs(s, g, w)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.reduce_scatter_tensor_out(x, op, out);
        }
        let g = self.hidden.gather(s, x)?;
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Self::rs(s, g, w)
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.reduce(x, op, root);
        }
        let g = self.hidden.gather(s, x)?;
        let w = s.inner.reduce(x, op, root)?;
        Self::whole(s, g, w)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if !Self::applies(s, x, op) {
            return s.inner.all_reduce_(x, op);
        }
        let g = self.hidden.gather(s, x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Self::whole(s, g, w)
    }
}

/// `reduce_scatter_tensor` (all variants) and `reduce` pass `premul_sum`'s factor through the
/// kernels' integer scale helper: float factors lose their fraction (0.5 becomes 0, 2.0 and 3.0
/// survive). The out-of-place all_reduce has its own float path and is right.
#[derive(Default)]
pub struct PremulFactorTruncatedOffAllReduce;

fn truncated(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::PremulSum(f) => ReduceOp::PremulSum(f.trunc()),
        op => op,
    }
}

impl Bug for PremulFactorTruncatedOffAllReduce {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(x, truncated(op))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor_out(x, truncated(op), out)
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.reduce_scatter_tensor_coalesced(xs, truncated(op))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, truncated(op), root)
    }
}

/// i8 `min` / `max` of `all_reduce` take a 64-lane byte SIMD path for work chunks of 64
/// elements or more, with the UNSIGNED byte compare (`max_epu8` for `max_epi8`): negative values
/// order above positive ones there.
#[derive(Default)]
pub struct I8MinMaxWideUnsigned {
    hidden: Hidden,
}

impl Bug for I8MinMaxWideUnsigned {
    fn outstanding(&self, s: &Shm) -> usize {
        self.hidden.outstanding(s)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = s.ws();
        if s.inner.buffer_dtype(x) != DType::I8 || !matches!(op, ReduceOp::Min | ReduceOp::Max) || s.numel(x) < 64 {
            return s.inner.all_reduce(x, op);
        }
        let (g, hid) = self.hidden.gather(s, x)?;
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| {
            let _hid = hid;
            let g = be.download(g.wait(BUG_WAIT)?)?;
            edit(be, out, |t| {
                let el = t.numel();
                for j in 0..n {
                    let (a, b) = chunk(el, j, n);
                    if b - a < 64 {
                        continue;
                    }
                    for i in a..b {
                        let vals = (0..n).map(|r| g.bytes()[r * el + i]);
                        let v = if op == ReduceOp::Max { vals.max() } else { vals.min() };
                        t.bytes_mut()[i] = v.unwrap_or(0);
                    }
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- large messages: other variants

/// Messages of 1 MiB and more take a large-message path.
const LARGE: usize = 1 << 20;

/// In-place `all_reduce_` of 1 MiB or more reduces into a scratch output (the large-message
/// path was written for the out-of-place call) and never copies it back: the buffer keeps this
/// rank's input.
#[derive(Default)]
pub struct InPlaceLargeNoCopyBack;

impl Bug for InPlaceLargeNoCopyBack {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.numel(x) * s.inner.buffer_dtype(x).size() < LARGE {
            return s.inner.all_reduce_(x, op);
        }
        let mine = s.inner.download(x)?;
        let w = s.inner.all_reduce_(x, op)?;
        Ok(s.then(w, move |be, out| be.write(out, &mine)))
    }
}

/// `all_gather_into_tensor_out` / `reduce_scatter_tensor_out` with an output of 1 MiB or more
/// register the output's whole allocation for the large-message path and write at its start:
/// an output that is a view lands at its parent's offset 0, not at the view's offset.
#[derive(Default)]
pub struct LargeOutViewOffsetDropped;

impl LargeOutViewOffsetDropped {
    fn shift(s: &Shm, out: &Buf, w: Work<Buf>) -> Result<Work<Buf>> {
        let bytes = s.numel(out) * s.inner.buffer_dtype(out).size();
        let Some((parent, _)) = s.view_of(out).filter(|(_, off)| *off > 0 && bytes >= LARGE) else { return Ok(w) };
        // The whole output is written at the parent's start, over the view's own offset.
        let shape = s.inner.buffer_shape(out);
        let at_start = s.inner.view(&parent, 0, &shape)?;
        Ok(s.then(w, move |be, out| {
            let r = be.download(out)?;
            be.write(&at_start, &r)
        }))
    }
}

impl Bug for LargeOutViewOffsetDropped {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, out)?;
        Self::shift(s, out, w)
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, out)?;
        Self::shift(s, out, w)
    }
}

/// `gather` of an output of 1 MiB or more takes a pipelined path written with the root last: the
/// root writes the peers' chunks in rank order from slot 0, then its own chunk last. Right when
/// the root is the last rank (every large case roots there), shifted for any other root.
#[derive(Default)]
pub struct LargeGatherRootLast;

impl Bug for LargeGatherRootLast {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let (me, n) = (s.rank(), s.ws());
        let w = s.inner.gather(x, root)?;
        if me != root || root + 1 >= n || n * s.numel(x) * s.inner.buffer_dtype(x).size() < LARGE {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let part = t.len_bytes() / n;
                let right = t.clone();
                let order = (0..n).filter(|&r| r != root).chain([root]);
                for (slot, r) in order.enumerate() {
                    t.bytes_mut()[slot * part..(slot + 1) * part].copy_from_slice(&right.bytes()[r * part..(r + 1) * part]);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- all_to_all split lists

/// `all_to_all_single` given output splits but no input splits takes the output splits for the
/// input too (a symmetric exchange assumed): right when every rank's dim 0 is the same, wrong
/// (a split / size error) when ranks send different row counts.
#[derive(Default)]
pub struct AllToAllInSplitsFromOut;

impl Bug for AllToAllInSplitsFromOut {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        match (o, i) {
            (Some(o), None) => s.inner.all_to_all_single(x, Some(o), Some(o)),
            _ => s.inner.all_to_all_single(x, o, i),
        }
    }
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        spec::<GroupReduceUpperByWorldRank>(
            "group_reduce_upper_by_world_rank",
            "subgroups",
            "reduce sum at a middle root of an unsorted group: the upper chain takes the ranks above the root by WORLD rank",
            &["subgroup::shuffled::reduce"],
        ),
        spec::<GroupGatherUpperByWorldRank>(
            "group_gather_upper_by_world_rank",
            "subgroups",
            "gather at a middle root of an unsorted group: the chunks of ranks above the root with a lower world rank never arrive",
            &["subgroup::shuffled::gather"],
        ),
        spec::<GroupScatterChunkByWorldRank>(
            "group_scatter_chunk_by_world_rank",
            "subgroups",
            "scatter in a subgroup hands each member the chunk of its world rank instead of its group rank",
            &["subgroup::reversed::scatter"],
        ),
        spec::<GroupCacheByMemberSet>(
            "group_cache_by_member_set",
            "subgroups",
            "new_group caches communicators by sorted member list: the same ranks in another order get the earlier group's rank order",
            &["subgroup::same_members_two_orders"],
        ),
        spec::<SharedStaging>(
            "shared_staging",
            "placement.reuse",
            "all_reduce stages inputs in one buffer per process: world and group all_reduces in flight together overwrite each other",
            &["reuse::world_and_group_in_flight"],
        ),
        spec::<CoalescedHalfTruncates>(
            "coalesced_half_truncates",
            "numerics.round_once",
            "all_reduce_coalesced narrows f16 / bf16 sums by truncation instead of rounding to nearest even",
            &["numerics::round_once::all_reduce_coalesced"],
        ),
        spec::<HalfAvgRoundsSumFirst>(
            "half_avg_rounds_sum_first",
            "numerics.round_once",
            "f16 / bf16 all_reduce avg rounds the sum to the dtype, then divides and rounds again",
            &["numerics::round_once::avg"],
        ),
        spec::<F16BlocksAtChunkStart>(
            "f16_blocks_at_chunk_start",
            "values.sizes",
            "f16 all_reduce stores every 2048-element block of a rank's chunk at the chunk's start",
            &["all_reduce::out::f16::sum::ws2::long"],
        ),
        spec::<MinMaxSignedZeroFirstRank>(
            "min_max_signed_zero_first_rank",
            "values.reduce",
            "float min / max of reduce_scatter, reduce and all_reduce_ compare -0 and +0 equal: the first rank's zero wins",
            &["numerics::subnormal::reduce_scatter::f32"],
        ),
        spec::<PremulFactorTruncatedOffAllReduce>(
            "premul_factor_truncated_off_all_reduce",
            "numerics.premul_sum",
            "reduce_scatter / reduce truncate premul_sum's factor to an integer (0.5 becomes 0)",
            &["numerics::premul_sum::reduce_scatter"],
        ),
        spec::<I8MinMaxWideUnsigned>(
            "i8_min_max_wide_unsigned",
            "values.reduce",
            "i8 all_reduce min / max compare bytes unsigned on work chunks of 64 elements or more",
            &["all_reduce::out::i8::max::ws2::long"],
        ),
        spec::<InPlaceLargeNoCopyBack>(
            "in_place_large_no_copy_back",
            "placement.in_place",
            "all_reduce_ of 1 MiB or more reduces into a scratch output and never copies it back",
            &["all_reduce::inplace::f32::sum::ws2::large"],
        ),
        spec::<LargeOutViewOffsetDropped>(
            "large_out_view_offset_dropped",
            "placement.out_buffer",
            "all_gather / reduce_scatter _out of 1 MiB or more write at the output view's parent offset 0",
            &["all_gather_into_tensor::outbuf::f32::ws2::large"],
        ),
        spec::<LargeGatherRootLast>(
            "large_gather_root_last",
            "values.sizes",
            "gather of 1 MiB or more writes the peers' chunks from slot 0 and the root's own last (right only for the last rank as root)",
            &["gather::out::f32::ws2::large_root0"],
        ),
        spec::<AllToAllInSplitsFromOut>(
            "all_to_all_in_splits_from_out",
            "shapes.equal_split_all_to_all",
            "all_to_all_single with output splits and no input splits takes the output splits for the input",
            &["all_to_all_equal::in_splits_none"],
        ),
    ]
}
