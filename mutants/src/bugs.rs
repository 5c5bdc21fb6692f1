//! The mutants: one bug each, by contract clause. Each is a [`Bug`] overriding one hook of the
//! correct shm backend; [`catalogue`] lists them with their clause and the cases most likely to
//! catch them (run first).

use crate::campaign::Spec;
use crate::Mutant;
use crate::{bump, copy_bytes, edit, set_f64, Buf, Bug, Shm, Twist, BUG_WAIT};
use concord_core::fused::{
    describe, exchange_and_validate, gather_row_scales, input_descs, move_from_front, move_to_front, moved_shape, round_into, to_f32,
    AgMatmulParts, AgMatmulPlan, Gathered, MatmulRsPlan,
};
use concord_core::{Backend, CallOp, CollectiveError, Completion, DType, ReduceOp, Result, Scale, Scaling, Tensor, Work};
use concord_shm::ShmBackend;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A stateless bug: `bug!(Name { hooks })`.
macro_rules! bug {
    ($(#[$m:meta])* $name:ident { $($hooks:tt)* }) => {
        $(#[$m])*
        #[derive(Default)]
        pub struct $name;
        impl Bug for $name {
            $($hooks)*
        }
    };
}

/// `all_reduce` (out-of-place) with `op` replaced where `swap` says so.
fn swapped_op(s: &Shm, x: &Buf, op: ReduceOp, swap: impl Fn(DType, ReduceOp) -> Option<ReduceOp>) -> Result<Work<Buf>> {
    s.inner.all_reduce(x, swap(s.inner.buffer_dtype(x), op).unwrap_or(op))
}

/// `w` with element `at(numel)` of its result made wrong when `when(numel, bytes)` holds.
fn corrupt_if(s: &Shm, w: Work<Buf>, when: bool, at: fn(usize) -> usize) -> Work<Buf> {
    if !when {
        return w;
    }
    s.then(w, move |be, out| {
        edit(be, out, |t| {
            let n = t.numel();
            if n > 0 {
                bump(t, at(n).min(n - 1))
            }
        })
    })
}

/// `w` with elements `from..n` of its output replaced by this rank's input `x` (never reduced).
fn input_kept_from(s: &Shm, w: Work<Buf>, x: &Buf, from: usize, n: usize) -> Work<Buf> {
    let x = x.clone();
    s.then(w, move |be, out| {
        let input = be.download(&x)?;
        edit(be, out, |t| {
            let es = t.dtype().size();
            copy_bytes(t, from * es, &input, from * es, (n - from) * es)
        })
    })
}

/// `b` itself, or the same shape at offset 0 of its parent if it is a view at an offset.
fn at_offset_zero(s: &Shm, b: &Buf) -> Result<Buf> {
    match s.view_of(b) {
        Some((parent, off)) if off > 0 => s.inner.view(&parent, 0, &s.inner.buffer_shape(b)),
        _ => Ok(b.clone()),
    }
}

/// Writes one element of junk just past `out` when `out` is a view (where the guard bytes are).
pub(crate) fn write_past(s: &Shm, w: Work<Buf>) -> Work<Buf> {
    let (Some((parent, off)), numel) = (s.view_of(w.peek()), s.numel(w.peek())) else { return w };
    s.then(w, move |be, out| {
        let past = be.view(&parent, off + numel, &[1])?;
        be.write(&past, &Tensor::filled_bytes(be.buffer_dtype(out), &[1], 0x11))
    })
}

// ---------------------------------------------------------------- values

bug!(SumIsMaxF32 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        swapped_op(s, x, op, |d, op| (d == DType::F32 && op == ReduceOp::Sum).then_some(ReduceOp::Max))
    }
});

bug!(MaxIsMinBf16 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        swapped_op(s, x, op, |d, op| (d == DType::BF16 && op == ReduceOp::Max).then_some(ReduceOp::Min))
    }
});

bug!(ProductIsSum {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        swapped_op(s, x, op, |_, op| (op == ReduceOp::Product).then_some(ReduceOp::Sum))
    }
});

bug!(BxorIsBor {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        swapped_op(s, x, op, |_, op| (op == ReduceOp::BXor).then_some(ReduceOp::BOr))
    }
});

bug!(LastElementNotReduced {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let x = x.clone();
        Ok(s.then(w, move |be, out| {
            let input = be.download(&x)?;
            edit(be, out, |t| {
                let (n, es) = (t.numel(), t.dtype().size());
                if n > 0 {
                    copy_bytes(t, (n - 1) * es, &input, (n - 1) * es, es)
                }
            })
        }))
    }
});

bug!(U64SumWrapsAt32Bits {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        if op != ReduceOp::Sum || s.inner.buffer_dtype(x) != DType::U64 {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().chunks_mut(8).for_each(|e| e[4..].fill(0)))))
    }
});

bug!(IntAvgFloors {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if op != ReduceOp::Avg || !s.inner.buffer_dtype(x).is_signed_int() {
            return s.inner.all_reduce(x, op);
        }
        // The sum says whether the quotient was negative and inexact; then round it down.
        let sum = s.inner.all_reduce(x, ReduceOp::Sum)?;
        let w = s.inner.all_reduce(x, op)?;
        let ws = s.ws() as f64;
        Ok(s.then(w, move |be, out| {
            let sum = be.download(sum.wait(BUG_WAIT)?)?;
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = sum.get_f64(i);
                    if v < 0.0 && v % ws != 0.0 {
                        let r = t.get_f64(i);
                        set_f64(t, i, r - 1.0);
                    }
                }
            })
        }))
    }
});

// ---------------------------------------------------------------- sizes

bug!(WrongAbove64KElements {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(corrupt_if(s, w, s.numel(x) > 64 * 1024, |n| n / 2))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce_(x, op)?;
        Ok(corrupt_if(s, w, s.numel(x) > 64 * 1024, |n| n / 2))
    }
});

bug!(WrongAbove1MiB {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let bytes = s.numel(w.peek()) * s.inner.buffer_dtype(x).size();
        Ok(corrupt_if(s, w, bytes > 1 << 20, |n| n - 1))
    }
});

bug!(TruncatesLastChunk {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        const CHUNK: usize = 1024;
        let w = s.inner.all_reduce(x, op)?;
        let n = s.numel(x);
        if n <= CHUNK || n.is_multiple_of(CHUNK) {
            return Ok(w);
        }
        // The last, partial chunk is never reduced: it keeps this rank's input.
        Ok(input_kept_from(s, w, x, n - n % CHUNK, n))
    }
});

// ---------------------------------------------------------------- world sizes

bug!(WrongAtWs6Or7 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(corrupt_if(s, w, matches!(s.ws(), 6 | 7), |_| 0))
    }
});

bug!(WrongAboveWs8 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(corrupt_if(s, w, s.ws() > 8, |_| 0))
    }
});

bug!(WrongAtWs1 {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        Ok(corrupt_if(s, w, s.ws() == 1, |_| 0))
    }
});

// ---------------------------------------------------------------- subgroups

bug!(AvgDividesByWorldSize {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if op != ReduceOp::Avg || !s.in_subgroup() {
            return s.inner.all_reduce(x, op);
        }
        let world = s.world_size as f64;
        if s.inner.buffer_dtype(x).is_float() {
            return s.inner.all_reduce(x, ReduceOp::PremulSum(1.0 / world));
        }
        let w = s.inner.all_reduce(x, ReduceOp::Sum)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = t.get_f64(i);
                    set_f64(t, i, (v / world).trunc());
                }
            })
        }))
    }
});

bug!(GroupRankIsWorldRank {
    fn rank(&self, s: &Shm) -> usize {
        s.world_rank
    }
});

bug!(GroupRootIsWorldRank {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, world_root(s, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast_(x, world_root(s, src))
    }
});

/// The root's world rank, read as a group rank (what a backend that forgot to translate does).
fn world_root(s: &Shm, src: usize) -> usize {
    match s.members.get(src) {
        Some(&w) if s.in_subgroup() => w % s.ws(),
        _ => src,
    }
}

// ---------------------------------------------------------------- async

bug!(CompletesEarlyBroadcast {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        let v = w.peek().clone();
        Ok(s.twisted(w, v, Twist { completed_at_once: true, ..Twist::default() }, |_, _| Ok(())))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(x, src)?;
        let v = w.peek().clone();
        Ok(s.twisted(w, v, Twist { completed_at_once: true, ..Twist::default() }, |_, _| Ok(())))
    }
});

bug!(IssueBlocksAllToAll {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let v = s.inner.all_to_all_single(x, o, i)?.into_value(BUG_WAIT)?;
        Ok(s.done(v, "all_to_all_single"))
    }
});

bug!(IssueBlocksAllReduce {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let v = s.inner.all_reduce(x, op)?.into_value(BUG_WAIT)?;
        Ok(s.done(v, "all_reduce"))
    }
});

bug!(WaitIgnoresDeadline {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let v = w.peek().clone();
        let twist = Twist { wait_instead: Some(|t| t.max(Duration::from_secs(3600))), ..Twist::default() };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
});

// ---------------------------------------------------------------- deadlines

bug!(TimeoutNotNamed {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let v = w.peek().clone();
        let twist = Twist {
            map_err: Some(|e| match e {
                CollectiveError::Timeout { .. } => CollectiveError::Backend("still waiting".into()),
                e => e,
            }),
            ..Twist::default()
        };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
});

bug!(WaitOvershootsDeadline {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let v = w.peek().clone();
        let twist = Twist { wait_instead: Some(|t| t * 2 + Duration::from_millis(500)), ..Twist::default() };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
});

bug!(PeerDeathUnnamed {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let v = w.peek().clone();
        let twist = Twist {
            map_err: Some(|e| match e {
                CollectiveError::PeerDied { .. } => CollectiveError::Backend("lost contact".into()),
                e => e,
            }),
            ..Twist::default()
        };
        Ok(s.twisted(w, v, twist, |_, _| Ok(())))
    }
});

// ---------------------------------------------------------------- roots

/// Root 0 for any root in range (out of range still goes through, for the named error).
fn root_zero(s: &Shm, root: usize) -> usize {
    if root < s.ws() {
        0
    } else {
        root
    }
}

bug!(ReduceIgnoresRoot {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        s.inner.reduce(x, op, root_zero(s, root))
    }
});

bug!(GatherIgnoresRoot {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.gather(x, root_zero(s, root))
    }
});

bug!(ScatterIgnoresRoot {
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        s.inner.scatter(x, root_zero(s, root))
    }
});

bug!(ReduceAcceptsMismatchedRoots {
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        // Right on the root (every rank gets the result), but no rank checks the others' root.
        if root < s.ws() {
            s.inner.all_reduce(x, op)
        } else {
            s.inner.reduce(x, op, root)
        }
    }
});

bug!(GatherAcceptsMismatchedRoots {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        if root < s.ws() {
            s.inner.all_gather_into_tensor(x)
        } else {
            s.inner.gather(x, root)
        }
    }
});

// ---------------------------------------------------------------- views

bug!(IgnoresInputViewOffset {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce(&at_offset_zero(s, x)?, op)
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor(&at_offset_zero(s, x)?)
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        s.inner.all_gather_into_tensor_out(&at_offset_zero(s, x)?, out)
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.reduce_scatter_tensor(&at_offset_zero(s, x)?, op)
    }
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(&at_offset_zero(s, x)?, dst)
    }
});

bug!(WritesOutAtOffset0 {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor_out(x, &at_offset_zero(s, out)?)?;
        Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor_out(x, op, &at_offset_zero(s, out)?)?;
        Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(&at_offset_zero(s, out)?, src)?;
        Ok(s.then_as(w, out.clone(), |_, _| Ok(())))
    }
});

// ---------------------------------------------------------------- rounding

/// `v` rounded to `dtype`.
fn round_to(dtype: DType, v: f64) -> f64 {
    Tensor::from_f64(dtype, &[1], &[v]).get_f64(0)
}

bug!(F16SumDoubleRounded {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        sum_rounded_per_add(s, x, op, DType::F16)
    }
});

/// A `sum` of `dtype` at world size >= 3 that gathers every rank's input and sums in rank order,
/// rounding to `dtype` after every add (instead of accumulating wide and rounding once); every
/// other call as shm does.
pub(crate) fn sum_rounded_per_add(s: &Shm, x: &Buf, op: ReduceOp, dtype: DType) -> Result<Work<Buf>> {
    if op != ReduceOp::Sum || s.inner.buffer_dtype(x) != dtype || s.ws() < 3 {
        return s.inner.all_reduce(x, op);
    }
    let n = s.numel(x);
    let out = s.inner.alloc(dtype, &s.inner.buffer_shape(x))?;
    let g = s.inner.all_gather_into_tensor(x)?;
    let ws = s.ws();
    Ok(s.then_as(g, out.clone(), move |be, gathered| {
        let all = be.download(gathered)?;
        edit(be, &out, |t| {
            for i in 0..n {
                // Starts from rank 0's value (not +0.0), so only the rounding differs.
                let acc = (1..ws).fold(all.get_f64(i), |acc, r| round_to(dtype, acc + all.get_f64(r * n + i)));
                set_f64(t, i, acc);
            }
        })
    }))
}

bug!(PremulSumIgnoresFactor {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        swapped_op(s, x, op, |_, op| matches!(op, ReduceOp::PremulSum(_)).then_some(ReduceOp::Sum))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, if matches!(op, ReduceOp::PremulSum(_)) { ReduceOp::Sum } else { op })
    }
});

/// The smallest positive normal value of a float dtype.
fn min_normal(d: DType) -> f64 {
    match d {
        DType::F16 => 6.103515625e-5,
        DType::F64 => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    }
}

bug!(FlushesSubnormals {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        Ok(if s.inner.buffer_dtype(x).is_float() { flushed(s, w) } else { w })
    }
});

/// `w` with the subnormal values of its (float) result flushed to zero.
pub(crate) fn flushed(s: &Shm, w: Work<Buf>) -> Work<Buf> {
    s.then(w, |be, out| {
        edit(be, out, |t| {
            let tiny = min_normal(t.dtype());
            for i in 0..t.numel() {
                let v = t.get_f64(i);
                if v != 0.0 && v.abs() < tiny {
                    set_f64(t, i, 0.0f64.copysign(v));
                }
            }
        })
    })
}

// ---------------------------------------------------------------- ordering

bug!(AllGatherRotated {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        let ws = s.ws();
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let chunk = t.len_bytes() / ws;
                let all = t.clone();
                for r in 0..ws {
                    copy_bytes(t, r * chunk, &all, (r + 1) % ws * chunk, chunk);
                }
            })
        }))
    }
});

bug!(ScatterChunksRotated {
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let ws = s.ws();
        if root != s.rank() || ws < 2 {
            return s.inner.scatter(x, root);
        }
        // The root sends chunk r + 1 to rank r (host-side shuffle at issue; nothing waits).
        let mut t = s.inner.download(x)?;
        let all = t.clone();
        let chunk = t.len_bytes() / ws;
        for r in 0..ws {
            copy_bytes(&mut t, r * chunk, &all, (r + 1) % ws * chunk, chunk);
        }
        s.inner.scatter(&s.inner.upload(&t)?, root)
    }
});

bug!(PermuteInverted {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let n = src_dst.len();
        let mut inv = vec![usize::MAX; n];
        for (r, &d) in src_dst.iter().enumerate() {
            if d < n {
                inv[d] = r;
            }
        }
        if inv.contains(&usize::MAX) {
            return s.inner.permute_tensor(x, src_dst);
        }
        s.inner.permute_tensor(x, &inv)
    }
});

/// Two receives from one source in flight at once (the second issued before the first is
/// waited, same dtype and shape) get each other's message.
#[derive(Default)]
pub struct P2pSwappedInFlight {
    last: Mutex<HashMap<usize, Weak<RecvSlot>>>,
}

struct RecvSlot {
    temp: Buf,
    work: Work<Buf>,
    waited: AtomicBool,
    partner: Mutex<Weak<RecvSlot>>,
}

struct SwappedRecv {
    me: Arc<RecvSlot>,
    out: Buf,
    be: Arc<ShmBackend>,
    copied: Mutex<bool>,
}

impl Completion for SwappedRecv {
    fn is_completed(&self) -> bool {
        self.me.work.is_completed()
    }
    fn wait_for(&self, t: Duration) -> Result<bool> {
        self.me.waited.store(true, Ordering::SeqCst);
        let mut copied = self.copied.lock().unwrap_or_else(|e| e.into_inner());
        if *copied {
            return Ok(true);
        }
        let from = self.me.partner.lock().unwrap_or_else(|e| e.into_inner()).upgrade().unwrap_or_else(|| self.me.clone());
        for slot in [&self.me, &from] {
            match slot.work.wait(t) {
                Ok(_) => {}
                Err(CollectiveError::Timeout { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.be.write(&self.out, &self.be.download(&from.temp)?)?;
        *copied = true;
        Ok(true)
    }
}

impl Bug for P2pSwappedInFlight {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(out);
        let temp = s.inner.alloc(s.inner.buffer_dtype(out), &shape)?;
        let work = s.inner.recv(&temp, src)?;
        let meta = work.meta().clone();
        let me = Arc::new(RecvSlot { temp, work, waited: AtomicBool::new(false), partner: Mutex::new(Weak::new()) });
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match last.get(&src).and_then(Weak::upgrade) {
            Some(prev)
                if !prev.waited.load(Ordering::SeqCst)
                    && s.inner.buffer_shape(&prev.temp) == shape
                    && s.inner.buffer_dtype(&prev.temp) == s.inner.buffer_dtype(out) =>
            {
                *prev.partner.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&me);
                *me.partner.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&prev);
                last.remove(&src);
            }
            _ => {
                last.insert(src, Arc::downgrade(&me));
            }
        }
        let done = SwappedRecv { me, out: out.clone(), be: s.inner.clone(), copied: Mutex::new(false) };
        Ok(Work::new(out.clone(), Arc::new(done), meta, &s.shadow))
    }
}

// ---------------------------------------------------------------- barrier

bug!(BarrierReturnsAtOnce {
    fn barrier(&self, s: &Shm) -> Result<Work<()>> {
        Ok(s.done((), "barrier"))
    }
});

// ---------------------------------------------------------------- leaks

bug!(LeaksOneCountPerAllGather {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        std::mem::forget(s.done((), "all_gather_into_tensor"));
        s.inner.all_gather_into_tensor(x)
    }
});

bug!(LeakedSubgroupBarrier {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if s.in_subgroup() {
            // An internal barrier issued and never waited: it stays outstanding forever.
            std::mem::forget(s.inner.barrier()?);
        }
        s.inner.all_reduce(x, op)
    }
});

// ---------------------------------------------------------------- bad input

bug!(TruncatesIndivisibleReduceScatter {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (ws, shape) = (s.ws(), s.inner.buffer_shape(x));
        if shape.is_empty() || shape[0].is_multiple_of(ws) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let mut keep = shape.clone();
        keep[0] -= shape[0] % ws;
        s.inner.reduce_scatter_tensor(&s.inner.view(x, 0, &keep)?, op)
    }
});

bug!(AcceptsWrongOutSize {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let mut shape = s.inner.buffer_shape(x);
        match shape.first_mut() {
            Some(d0) => *d0 *= s.ws(),
            None => shape = vec![s.ws()],
        }
        let (want, have) = (shape.iter().product::<usize>(), s.numel(out));
        if want == have || s.inner.buffer_dtype(x) != s.inner.buffer_dtype(out) {
            return s.inner.all_gather_into_tensor_out(x, out);
        }
        if have > want {
            // Fills a prefix of the larger buffer.
            let w = s.inner.all_gather_into_tensor_out(x, &s.inner.view(out, 0, &shape)?)?;
            return Ok(s.then_as(w, out.clone(), |_, _| Ok(())));
        }
        // Gathers into a temporary and keeps what fits.
        let w = s.inner.all_gather_into_tensor(x)?;
        let o = out.clone();
        Ok(s.then_as(w, out.clone(), move |be, full| {
            let full = be.download(full)?;
            edit(be, &o, |t| {
                let n = t.len_bytes();
                copy_bytes(t, 0, &full, 0, n)
            })
        }))
    }
});

// ---------------------------------------------------------------- aliasing / in-place

bug!(InplaceBroadcastReturnsCopy {
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.broadcast(x, src)
    }
});

bug!(CoalescedInplaceReturnsCopies {
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        s.inner.all_reduce_coalesced(xs, op)
    }
});

bug!(OutOfPlaceReturnsInput {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        s.inner.all_reduce_(x, op)
    }
});

bug!(ReduceScatterMutatesInput {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.reduce_scatter_tensor(x, op)?;
        let x = x.clone();
        Ok(s.then(w, move |be, _| edit(be, &x, |t| t.bytes_mut().iter_mut().take(1).for_each(|b| *b ^= 0x40))))
    }
});

// ---------------------------------------------------------------- guard bytes

bug!(WritesPastReduceScatterOut {
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(write_past(s, s.inner.reduce_scatter_tensor_out(x, op, out)?))
    }
});

// ---------------------------------------------------------------- coalesced

bug!(AllReduceCoalescedDropsLast {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        let Some(last) = xs.last().cloned() else { return Ok(w) };
        Ok(s.then(w, move |be, outs| match outs.last() {
            Some(out) => be.write(out, &be.download(&last)?),
            None => Ok(()),
        }))
    }
});

// ---------------------------------------------------------------- second campaign (fresh eyes)
// Bugs as a downstream author writes them, each aimed at a corner the first 48 did not reach.

/// True when `src_dst` is a permutation of `0..n` (anything else goes through unchanged, for the
/// named bad-input error).
fn is_permutation(src_dst: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    src_dst.len() == n && src_dst.iter().all(|&d| d < n && !std::mem::replace(&mut seen[d], true))
}

bug!(
    /// A SWAR kernel for 8-bit sums: from 64 elements on, four bytes are added as one 32-bit
    /// word, so a carry out of one byte lane spills into the next (the trailing `n % 4` bytes
    /// take the scalar path and are right).
    U8SumSwarCarries {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (dtype, n) = (s.inner.buffer_dtype(x), s.numel(x));
        if op != ReduceOp::Sum || !matches!(dtype, DType::U8 | DType::I8) || n < 64 || s.ws() < 2 {
            return s.inner.all_reduce(x, op);
        }
        let out = s.inner.alloc(dtype, &s.inner.buffer_shape(x))?;
        let g = s.inner.all_gather_into_tensor(x)?;
        let ws = s.ws();
        Ok(s.then_as(g, out.clone(), move |be, gathered| {
            let all = be.download(gathered)?;
            edit(be, &out, |t| {
                let b = all.bytes();
                let words = n / 4;
                for w in 0..words {
                    let sum = (0..ws).fold(0u32, |acc, r| {
                        let at = r * n + 4 * w;
                        acc.wrapping_add(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
                    });
                    t.bytes_mut()[4 * w..4 * w + 4].copy_from_slice(&sum.to_le_bytes());
                }
                for i in 4 * words..n {
                    t.bytes_mut()[i] = (0..ws).fold(0u8, |acc, r| acc.wrapping_add(b[r * n + i]));
                }
            })
        }))
    }
});

/// `wait(0)` read as "no timeout" (c10d's `kNoTimeout` is 0 ms): a zero-timeout poll blocks
/// until the op completes.
fn zero_means_forever<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let v = w.peek().clone();
    let twist = Twist { wait_instead: Some(|t| if t.is_zero() { Duration::from_secs(3600) } else { t }), ..Twist::default() };
    s.twisted(w, v, twist, |_, _| Ok(()))
}

bug!(ZeroTimeoutWaitsForever {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(zero_means_forever(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(zero_means_forever(s, s.inner.all_reduce_(x, op)?))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(zero_means_forever(s, s.inner.all_gather_into_tensor(x)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(zero_means_forever(s, s.inner.broadcast(x, src)?))
    }
});

bug!(
    /// permute_tensor lowered to a cyclic shift by `src_dst[0]` (a "collective permute is a
    /// rotation" fast path taken for every permutation).
    PermuteAsCyclicShift {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let n = s.ws();
        if !is_permutation(src_dst, n) {
            return s.inner.permute_tensor(x, src_dst);
        }
        let shift = src_dst[0];
        let shifted: Vec<usize> = (0..n).map(|r| (r + shift) % n).collect();
        s.inner.permute_tensor(x, &shifted)
    }
});

bug!(
    /// A rank the permutation maps to itself skips its "send to self": its output stays as
    /// allocated (zeros here). World size 1 takes an early `clone()` path and is right.
    PermuteSkipsSelf {
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let w = s.inner.permute_tensor(x, src_dst)?;
        let me = s.rank();
        if s.ws() < 2 || !is_permutation(src_dst, s.ws()) || src_dst[me] != me {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0))))
    }
});

/// Out-of-place all_reduce into one persistent output per (dtype, shape) (a CUDA-graph style
/// static output, or an allocator that recycles it without tracking the caller's use): the next
/// same-shaped all_reduce overwrites a result the caller still holds.
#[derive(Default)]
pub struct StaticOutputPerShape {
    outputs: Mutex<HashMap<(DType, Vec<usize>), Buf>>,
}

impl Bug for StaticOutputPerShape {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let key = (s.inner.buffer_dtype(x), s.inner.buffer_shape(x));
        let w = s.inner.all_reduce(x, op)?;
        if s.numel(x) == 0 {
            return Ok(w);
        }
        let out = {
            let mut outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
            match outputs.get(&key) {
                Some(o) => o.clone(),
                None => {
                    let o = s.inner.alloc(key.0, &key.1)?;
                    outputs.insert(key, o.clone());
                    o
                }
            }
        };
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, res| be.write(&o, &be.download(res)?)))
    }
}

bug!(
    /// Subgroup gather puts the members' chunks in ascending WORLD-rank order (as a world-level
    /// gather filtered to the members would), not in group-rank order.
    SubgroupGatherWorldOrder {
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let w = s.inner.gather(x, root)?;
        let members = s.members.clone();
        // The world itself (members in order) gathers right; any other communicator does not.
        if members.iter().enumerate().all(|(g, &m)| g == m) || s.rank() != root {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let chunk = t.len_bytes() / members.len();
                let all = t.clone();
                let mut by_world: Vec<usize> = (0..members.len()).collect();
                by_world.sort_by_key(|&g| members[g]);
                for (k, &g) in by_world.iter().enumerate() {
                    copy_bytes(t, k * chunk, &all, g * chunk, chunk);
                }
            })
        }))
    }
});

/// Round-trips every element of a bf16 result through f16 (a "16-bit float" compression path
/// written for fp16): exact for small integers, wrong outside f16's range.
fn bf16_through_f16(s: &Shm, w: Work<Buf>, dtype: DType) -> Work<Buf> {
    if dtype != DType::BF16 {
        return w;
    }
    s.then(w, |be, out| {
        edit(be, out, |t| {
            for i in 0..t.numel() {
                let v = t.get_f64(i);
                set_f64(t, i, concord_core::half::f16::from_f64(v).to_f64());
            }
        })
    })
}

bug!(
    /// Data-moving ops send bf16 as fp16 (a compression hook written for fp16 applied to every
    /// 16-bit float): broadcast and all_gather lose bf16 values outside fp16's range.
    Bf16MovedAsF16 {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(bf16_through_f16(s, s.inner.broadcast(x, src)?, s.inner.buffer_dtype(x)))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(bf16_through_f16(s, s.inner.broadcast_(x, src)?, s.inner.buffer_dtype(x)))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(bf16_through_f16(s, s.inner.all_gather_into_tensor(x)?, s.inner.buffer_dtype(x)))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Ok(bf16_through_f16(s, s.inner.all_gather_into_tensor_out(x, out)?, s.inner.buffer_dtype(x)))
    }
});

/// Progress only inside `wait` (no progress thread): `is_completed()` stays false until the
/// work has been waited, however long ago the op finished.
struct CompletedOnlyOnceWaited<T> {
    inner: Work<T>,
    waited: AtomicBool,
}

impl<T: Send + Sync> Completion for CompletedOnlyOnceWaited<T> {
    fn is_completed(&self) -> bool {
        self.waited.load(Ordering::SeqCst) && self.inner.is_completed()
    }
    fn wait_for(&self, t: Duration) -> Result<bool> {
        match self.inner.wait(t) {
            Ok(_) => {
                self.waited.store(true, Ordering::SeqCst);
                Ok(true)
            }
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// `w` with its completion reported only once waited (shared with `bugs_review3`).
pub(crate) fn only_once_waited<T: Clone + Send + Sync + 'static>(s: &Shm, w: Work<T>) -> Work<T> {
    let (value, meta) = (w.peek().clone(), w.meta().clone());
    Work::new(value, Arc::new(CompletedOnlyOnceWaited { inner: w, waited: AtomicBool::new(false) }), meta, &s.shadow)
}

bug!(CompletesOnlyInWait {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.all_reduce_(x, op)?))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(only_once_waited(s, s.inner.all_gather_into_tensor(x)?))
    }
});

bug!(
    /// Unsigned min / max run the signed kernel (u32 / u64 mapped to the library's int32 /
    /// int64): values with the top bit set compare as negative.
    UnsignedMinMaxAsSigned {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        unsigned_min_max_as_signed(s, x, op, ShmBackend::all_reduce)
    }
});

/// `run` (a reduction of shm) with u32 / u64 min / max compared as signed (the library's int32
/// / int64 kernel); every other dtype and op as `run` does.
pub(crate) fn unsigned_min_max_as_signed(
    s: &Shm,
    x: &Buf,
    op: ReduceOp,
    run: fn(&ShmBackend, &Buf, ReduceOp) -> Result<Work<Buf>>,
) -> Result<Work<Buf>> {
    let dtype = s.inner.buffer_dtype(x);
    if !matches!(op, ReduceOp::Min | ReduceOp::Max) || !matches!(dtype, DType::U32 | DType::U64) {
        return run(&s.inner, x, op);
    }
    // Flipping the top bit turns the signed order into the unsigned one (and back).
    let es = dtype.size();
    let flip = move |t: &mut Tensor| t.bytes_mut().chunks_mut(es).for_each(|e| e[es - 1] ^= 0x80);
    let mut t = s.inner.download(x)?;
    flip(&mut t);
    let w = run(&s.inner, &s.inner.upload(&t)?, op)?;
    Ok(s.then(w, move |be, out| edit(be, out, flip)))
}

bug!(
    /// all_to_all_single on a rank with nothing to send returns at once with an empty-handed
    /// (zero) output, although its peers send it rows (it still takes part, so none hangs).
    AllToAllEmptyInputReturnsZeros {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let w = s.inner.all_to_all_single(x, o, i)?;
        if s.numel(x) != 0 || s.ws() < 2 {
            return Ok(w);
        }
        Ok(s.then(w, |be, out| edit(be, out, |t| t.bytes_mut().fill(0))))
    }
});

bug!(
    /// all_reduce_coalesced hands results back through a map keyed by (dtype, shape): of two
    /// inputs of the same shape, both get the later one's result.
    CoalescedSameShapeCollide {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let w = s.inner.all_reduce_coalesced(xs, op)?;
        let keys: Vec<(DType, Vec<usize>)> = xs.iter().map(|x| (s.inner.buffer_dtype(x), s.inner.buffer_shape(x))).collect();
        let mut by_key: HashMap<&(DType, Vec<usize>), usize> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_key.insert(k, i);
        }
        let outs = w.peek().clone();
        let mapped: Vec<Buf> = keys.iter().map(|k| outs[by_key[k]].clone()).collect();
        Ok(s.then_as(w, mapped, |_, _| Ok(())))
    }
});

// ---------------------------------------------------------------- third campaign (fresh eyes)
// Bug classes from public reports on NCCL / Gloo / MPI / torch.distributed backends, aimed at the
// clauses the first two campaigns reached least (p2p matching, cross-rank dtype checks, mixed
// coalesced lists, realloc, quiescence on drop, non-power-of-two algorithms).

/// `b`'s bytes as a fresh `u8` buffer (a transport that moves bytes, not typed elements).
fn as_bytes(be: &ShmBackend, b: &Buf) -> Result<Buf> {
    let t = be.download(b)?;
    be.upload(&Tensor::from_bytes(DType::U8, &[t.len_bytes()], t.bytes()))
}

/// Writes the bytes of `u8` buffer `raw` into `out`, read as `out`'s dtype and shape.
fn write_bytes(be: &ShmBackend, raw: &Buf, out: &Buf) -> Result<()> {
    let t = be.download(raw)?;
    be.write(out, &Tensor::from_bytes(be.buffer_dtype(out), &be.buffer_shape(out), t.bytes()))
}

/// Byte size of `b`.
fn nbytes(s: &Shm, b: &Buf) -> usize {
    s.numel(b) * s.inner.buffer_dtype(b).size()
}

bug!(
    /// send / recv move raw bytes (as NCCL's ncclSend / ncclRecv and Gloo's unbound buffers do):
    /// a pair whose dtypes differ but whose byte sizes agree (f32[4] sent into i32[4]) is
    /// accepted and the bytes reinterpreted, instead of `DTypeMismatch` on both ranks. Modelled
    /// on pytorch/pytorch#81545 and NVIDIA/nccl#703 (dist.send / dist.recv of different dtypes
    /// silently give wrong values). Count mismatches of another byte size are still refused.
    P2pMatchesBytesNotDtype {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let raw = as_bytes(&s.inner, x)?;
        let w = s.inner.send(&raw, dst)?;
        Ok(s.then_as(w, (), move |_, _| {
            drop(raw);
            Ok(())
        }))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let raw = s.inner.alloc(DType::U8, &[nbytes(s, out)])?;
        let w = s.inner.recv(&raw, src)?;
        let o = out.clone();
        Ok(s.then_as(w, out.clone(), move |be, raw| write_bytes(be, raw, &o)))
    }
});

bug!(
    /// broadcast moves raw bytes: a non-root whose buffer has another dtype of the same byte size
    /// (f32[4] on the root, i32[4] elsewhere) gets the root's bytes reinterpreted, no error.
    /// Modelled on pytorch/pytorch#91535 ("When dist.broadcast float32 to int64, it will
    /// silently generate wrong results").
    BroadcastMovesBytes {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let raw = as_bytes(&s.inner, x)?;
        let w = s.inner.broadcast(&raw, src)?;
        let out = s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, raw| write_bytes(be, raw, &o)))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let raw = as_bytes(&s.inner, x)?;
        let w = s.inner.broadcast(&raw, src)?;
        let o = x.clone();
        Ok(s.then_as(w, x.clone(), move |be, raw| write_bytes(be, raw, &o)))
    }
});

/// `t` converted (value by value, as `Tensor::from_f64` rounds) to `dtype`.
fn converted(t: &Tensor, dtype: DType) -> Tensor {
    let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i)).collect();
    Tensor::from_f64(dtype, t.shape(), &vals)
}

/// The coalesced list flattened into one buffer of the first tensor's dtype (every tensor
/// converted to it), reduced, and converted back: `in_place` writes the results into `xs`.
fn coalesced_as_first(s: &Shm, xs: &[Buf], op: ReduceOp, in_place: bool) -> Result<Work<Vec<Buf>>> {
    let d0 = s.inner.buffer_dtype(&xs[0]);
    let mut flat = Vec::new();
    for x in xs {
        flat.push(s.inner.upload(&converted(&s.inner.download(x)?, d0))?);
    }
    let w = s.inner.all_reduce_coalesced(&flat, op)?;
    let outs: Vec<Buf> = if in_place {
        xs.to_vec()
    } else {
        xs.iter().map(|x| s.inner.alloc(s.inner.buffer_dtype(x), &s.inner.buffer_shape(x))).collect::<Result<_>>()?
    };
    let o = outs.clone();
    Ok(s.then_as(w, outs, move |be, res| {
        for (r, out) in res.iter().zip(&o) {
            be.write(out, &converted(&be.download(r)?, be.buffer_dtype(out)))?;
        }
        Ok(())
    }))
}

fn mixed_dtypes(s: &Shm, xs: &[Buf]) -> bool {
    xs.iter().any(|x| s.inner.buffer_dtype(x) != s.inner.buffer_dtype(&xs[0]))
}

bug!(
    /// all_reduce_coalesced flattens the list into one buffer of the FIRST tensor's dtype (the
    /// flatten-then-reduce path of torch's `_flatten_dense_tensors`): a list mixing dtypes
    /// comes back converted through that dtype (i64 and f64 values through f32). Modelled on
    /// pytorch/pytorch#1179 ("Tensor flattening on broadcast doesn't handle heterogeneous
    /// types") and #35671 (allgather_coalesced assumes one dtype).
    CoalescedMixedDtypesAsFirst {
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if xs.len() < 2 || !mixed_dtypes(s, xs) {
            return s.inner.all_reduce_coalesced(xs, op);
        }
        coalesced_as_first(s, xs, op, false)
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if xs.len() < 2 || !mixed_dtypes(s, xs) {
            return s.inner.all_reduce_coalesced_(xs, op);
        }
        coalesced_as_first(s, xs, op, true)
    }
});

bug!(
    /// Equal-split all_to_all_single checks `numel % ws` (a flat element count, as a backend
    /// built on ncclAllToAll's per-peer count would) instead of `d0 % ws`: a [3, 2] input at
    /// world size 2 is split as 3 elements per peer (rows cut in half) instead of `Indivisible`.
    AllToAllEqualSplitByElements {
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let shape = s.inner.buffer_shape(x);
        let (n, ws) = (s.numel(x), s.ws());
        if o.is_some() || i.is_some() || shape.len() < 2 || shape[0].is_multiple_of(ws) || !n.is_multiple_of(ws) {
            return s.inner.all_to_all_single(x, o, i);
        }
        let flat = s.inner.view(x, 0, &[n])?;
        let w = s.inner.all_to_all_single(&flat, None, None)?;
        let out = s.inner.view(w.peek(), 0, &shape)?;
        Ok(s.then_as(w, out, |_, _| Ok(())))
    }
});

bug!(
    /// Integer avg through f32 (the float kernel reused for ints, then truncated back): exact
    /// for small values, wrong once the sum needs more than f32's 24 significant bits.
    IntAvgThroughF32 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        if op != ReduceOp::Avg || dtype.is_float() {
            return s.inner.all_reduce(x, op);
        }
        let f = s.inner.upload(&converted(&s.inner.download(x)?, DType::F32))?;
        let w = s.inner.all_reduce(&f, ReduceOp::Avg)?;
        let out = s.inner.alloc(dtype, &s.inner.buffer_shape(x))?;
        let o = out.clone();
        Ok(s.then_as(w, out, move |be, avg| {
            let a = be.download(avg)?;
            let vals: Vec<f64> = (0..a.numel()).map(|i| a.get_f64(i).trunc()).collect();
            be.write(&o, &Tensor::from_f64(dtype, a.shape(), &vals))
        }))
    }
});

bug!(
    /// In-place premul_sum pre-scales the input by the factor (a "pre-divide" step, as FSDP's
    /// gradient pre-divide) and then runs the premul_sum kernel, which scales again: s² Σ x.
    PremulSumTwiceInPlace {
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if let ReduceOp::PremulSum(f) = op {
            let t = s.inner.download(x)?;
            let vals: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i) * f).collect();
            s.inner.write(x, &Tensor::from_f64(t.dtype(), t.shape(), &vals))?;
        }
        s.inner.all_reduce_(x, op)
    }
});

/// Out-of-place all_reduce with a registration cache keyed by address (as NCCL user-buffer
/// registration or an RDMA memory-region cache): the element count registered the first time
/// an address was seen is reused for a later buffer at that address, so a larger buffer
/// re-allocated there is reduced only over its first (stale) count; the rest keeps this rank's
/// input.
#[derive(Default)]
pub struct RegistrationCachedByAddress {
    seen: Mutex<HashMap<usize, usize>>,
}

impl Bug for RegistrationCachedByAddress {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let n = s.numel(x);
        let n0 = *self.seen.lock().unwrap_or_else(|e| e.into_inner()).entry(s.inner.buffer_addr(x)).or_insert(n);
        let w = s.inner.all_reduce(x, op)?;
        if n0 >= n {
            return Ok(w);
        }
        Ok(input_kept_from(s, w, x, n0, n))
    }
}

/// A send / recv peer in a subgroup read as a WORLD rank and mapped to the group rank of that
/// world rank (the torch.distributed `dst` / `group_dst` confusion); the peer given unchanged
/// where that world rank is not a member.
fn peer_as_world_rank(s: &Shm, peer: usize) -> usize {
    s.members.iter().position(|&m| m == peer).unwrap_or(peer)
}

bug!(
    /// In a subgroup, send's dst and recv's src are taken as world ranks and translated to
    /// group ranks (pytorch/pytorch send / recv on a group take a global rank; a backend that
    /// translates twice, or not at all, talks to the wrong peer).
    SubgroupPeerAsWorldRank {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        s.inner.send(x, peer_as_world_rank(s, dst))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        s.inner.recv(out, peer_as_world_rank(s, src))
    }
});

bug!(
    /// Recursive-halving reduce_scatter at a world size that is not a power of two: the ranks
    /// past the largest power of two p are folded onto rank r - p first and then receive their
    /// partner's chunk instead of their own (the classic non-power-of-two fix-up bug of
    /// recursive halving / doubling, as in MPICH's and Gloo's reduce_scatter).
    ReduceScatterNonPow2ExtraRank {
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (ws, shape) = (s.ws(), s.inner.buffer_shape(x));
        if ws.is_power_of_two() || shape.is_empty() || !shape[0].is_multiple_of(ws) {
            return s.inner.reduce_scatter_tensor(x, op);
        }
        let p = 1usize << (usize::BITS - 1 - ws.leading_zeros());
        let me = s.rank();
        let chunk_of = if me >= p { me - p } else { me };
        let mut out_shape = shape.clone();
        out_shape[0] /= ws;
        let dtype = s.inner.buffer_dtype(x);
        let out = s.inner.alloc(dtype, &out_shape)?;
        let w = s.inner.all_reduce(x, op)?;
        let o = out.clone();
        let chunk = out_shape.iter().product::<usize>() * dtype.size();
        Ok(s.then_as(w, out, move |be, full| {
            let all = be.download(full)?;
            edit(be, &o, |t| copy_bytes(t, 0, &all, chunk_of * chunk, chunk))
        }))
    }
});

bug!(
    /// i64 sum accumulated in one f64 (a generic "reduce in double" kernel used for every
    /// dtype): exact for small values, wrong above 2^53.
    I64SumThroughF64 {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        if op != ReduceOp::Sum || dtype != DType::I64 || s.ws() < 2 {
            return s.inner.all_reduce(x, op);
        }
        let (n, ws) = (s.numel(x), s.ws());
        let out = s.inner.alloc(dtype, &s.inner.buffer_shape(x))?;
        let g = s.inner.all_gather_into_tensor(x)?;
        let o = out.clone();
        Ok(s.then_as(g, out, move |be, gathered| {
            let all = be.download(gathered)?;
            edit(be, &o, |t| {
                for i in 0..n {
                    let acc: f64 = (0..ws).map(|r| all.get_f64(r * n + i)).sum();
                    // Back to i64 as a C cast would (saturating at the ends).
                    t.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&(acc as i64).to_le_bytes());
                }
            })
        }))
    }
});

/// A work that stays counted in `outstanding()` when dropped without a wait (a registry that
/// unregisters a work only in `wait`).
struct CountedUntilWaited<T> {
    inner: Work<T>,
    waited: AtomicBool,
    leaked: Arc<std::sync::atomic::AtomicUsize>,
}

impl<T: Send + Sync> Completion for CountedUntilWaited<T> {
    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
    fn wait_for(&self, t: Duration) -> Result<bool> {
        match self.inner.wait(t) {
            Ok(_) => {
                self.waited.store(true, Ordering::SeqCst);
                Ok(true)
            }
            Err(CollectiveError::Timeout { .. }) => Ok(false),
            Err(e) => {
                self.waited.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }
}

impl<T> Drop for CountedUntilWaited<T> {
    fn drop(&mut self) {
        if !self.waited.load(Ordering::SeqCst) {
            self.leaked.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A work registry that forgets a work only when it is waited: an all_reduce dropped without
/// its wait stays in `outstanding()` for ever (PyTorch's functional-collective registry keeps
/// un-waited works alive until waited).
#[derive(Default)]
pub struct DroppedWorkStaysCounted {
    leaked: Arc<std::sync::atomic::AtomicUsize>,
}

impl Bug for DroppedWorkStaysCounted {
    fn outstanding(&self, s: &Shm) -> usize {
        s.inner.outstanding() + s.own.get() + self.leaked.load(Ordering::SeqCst)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let (value, meta) = (w.peek().clone(), w.meta().clone());
        let c = CountedUntilWaited { inner: w, waited: AtomicBool::new(false), leaked: self.leaked.clone() };
        Ok(Work::new(value, Arc::new(c), meta, &s.shadow))
    }
}

bug!(
    /// An eager send: the message is staged and the send's work reports `is_completed()` at
    /// once, before the receiver has posted its recv (MPI's eager protocol below a size limit;
    /// the contract's send completes once the peer has received).
    SendCompletesAtIssue {
    fn send(&self, s: &Shm, x: &Buf, dst: usize) -> Result<Work<()>> {
        let w = s.inner.send(x, dst)?;
        Ok(s.twisted(w, (), Twist { completed_at_once: true, ..Twist::default() }, |_, _| Ok(())))
    }
});

// ---------------------------------------------------------------- fused (seed 004)

/// How one shard is consumed into the parts (correct: [`AgMatmulPlan::consume`]).
pub(crate) type Consume = fn(&AgMatmulPlan, &mut AgMatmulParts, usize, &Tensor, &[Tensor], Option<&Scale>, Option<&[Scale]>);

/// The knobs of [`pipelined_ag`]; [`AG_RIGHT`] is shm's own pipeline.
#[derive(Clone, Copy)]
pub(crate) struct AgKnobs {
    /// The rank whose place the shard received from `src` at `step` takes (`me`, `src`, `step`,
    /// `ws`; the local shard is step 0). Correct: `src`.
    pub(crate) slot: fn(usize, usize, usize, usize) -> usize,
    /// Every shard scaled by this rank's own row scales (they are never gathered).
    pub(crate) local_row_scales: bool,
    pub(crate) consume: Consume,
    pub(crate) finish: fn(&AgMatmulPlan, AgMatmulParts) -> (Tensor, Vec<Tensor>),
    /// Only the first peer's receive is waited before its shard is consumed; the later ones
    /// are read where they will land, taken as there already (waited at the end).
    pub(crate) wait_first_only: bool,
    /// Peers' shards are consumed as they land, the `k`-th to land put at the place of the
    /// `k`-th peer in step order (right while they land in step order).
    pub(crate) arrival_slots: bool,
}

pub(crate) const AG_RIGHT: AgKnobs = AgKnobs {
    slot: |_, src, _, _| src,
    local_row_scales: false,
    consume: |p, parts, r, shard, bs, sa, sb| p.consume(parts, r, shard, bs, sa, sb),
    finish: |p, parts| p.finish(parts),
    wait_first_only: false,
    arrival_slots: false,
};

/// A pipelined all-gather-matmul as a backend author writes one over shm's send / recv (the
/// shape of `backends/shm/src/fused.rs`): validate on every rank, post every receive (from
/// `rank + step`) and send (to `rank - step`), consume the local shard, then each peer's as it
/// lands. Completes before returning (the seed's ops are stream-ordered).
pub(crate) fn pipelined_ag(
    m: &Mutant,
    a: &Buf,
    bs: &[Buf],
    dim: usize,
    scaling: Option<&Scaling>,
    k: AgKnobs,
) -> Result<Work<Gathered<Buf>>> {
    let be = &*m.s.inner;
    let (ws, me) = (be.world_size(), be.rank());
    let ins = input_descs(be, a, bs);
    exchange_and_validate(be, &describe(CallOp::FusedAllGatherMatmul, me, ins.clone(), None, dim, scaling))?;
    let a_scales = match scaling {
        Some(s) if k.local_row_scales => Some(vec![s.a.clone(); ws]),
        Some(s) => Some(gather_row_scales(be, &s.a)?),
        None => None,
    };
    let plan = AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, scaling);
    let mut recvs = Vec::new();
    for step in 1..ws {
        let src = (me + step) % ws;
        recvs.push((step, src, be.recv(&be.alloc(plan.dtype, &plan.shard_shape)?, src)?));
    }
    let sends = (1..ws).map(|step| be.send(a, (me + ws - step) % ws)).collect::<Result<Vec<_>>>()?;
    let bts = bs.iter().map(|x| be.download(x)).collect::<Result<Vec<_>>>()?;
    let b_scales = scaling.map(|s| s.b.as_slice());
    let mut parts = plan.start();
    let take = |parts: &mut AgMatmulParts, step: usize, src: usize, shard: &Tensor| {
        (k.consume)(&plan, parts, (k.slot)(me, src, step, ws), shard, &bts, a_scales.as_ref().map(|s| &s[src]), b_scales)
    };
    take(&mut parts, 0, me, &be.download(a)?);
    if k.arrival_slots {
        let mut pending: Vec<usize> = (0..recvs.len()).collect();
        let t0 = std::time::Instant::now();
        for (step, src, _) in &recvs {
            let at = loop {
                if let Some(at) = pending.iter().position(|&j| recvs[j].2.is_completed()) {
                    break at;
                }
                if t0.elapsed() > BUG_WAIT {
                    break 0;
                }
                std::thread::sleep(Duration::from_micros(50));
            };
            let landed = recvs[pending.remove(at)].2.wait(BUG_WAIT)?;
            take(&mut parts, *step, *src, &be.download(landed)?);
        }
    }
    for (i, (step, src, w)) in recvs.iter().enumerate().filter(|_| !k.arrival_slots) {
        let landed = if k.wait_first_only && i > 0 { w.peek() } else { w.wait(BUG_WAIT)? };
        take(&mut parts, *step, *src, &be.download(landed)?);
    }
    for (_, _, w) in &recvs {
        w.wait(BUG_WAIT)?;
    }
    for w in &sends {
        w.wait(BUG_WAIT)?;
    }
    let (ag, outs) = (k.finish)(&plan, parts);
    let value = (be.upload(&ag)?, outs.iter().map(|t| be.upload(t)).collect::<Result<Vec<_>>>()?);
    Ok(m.s.done(value, "fused_all_gather_matmul"))
}

/// A pipelined matmul-reduce-scatter over shm's send / recv: the chunk `produce(me, step, ws)`
/// of this rank's `a @ b` is computed at `step` and sent to `rank - step` (correct: the chunk of
/// that destination), this rank's own chunk last, the received chunks reduced (exact, rounded once).
fn pipelined_mm_rs(
    m: &Mutant,
    a: &Buf,
    b: &Buf,
    rop: ReduceOp,
    dim: usize,
    scaling: Option<&Scaling>,
    produce: fn(usize, usize, usize) -> usize,
) -> Result<Work<Buf>> {
    let be = &*m.s.inner;
    let (ws, me) = (be.world_size(), be.rank());
    let ins = input_descs(be, a, std::slice::from_ref(b));
    exchange_and_validate(be, &describe(CallOp::FusedMatmulReduceScatter, me, ins.clone(), Some(rop), dim, scaling))?;
    let plan = MatmulRsPlan::new(ws, &ins[0], &ins[1], rop, dim, scaling);
    let mut recvs = Vec::new();
    for step in 1..ws {
        let src = (me + step) % ws;
        recvs.push((src, be.recv(&be.alloc(plan.out_dtype, &plan.out_shape())?, src)?));
    }
    let (at, bt) = (be.download(a)?, be.download(b)?);
    let prepared = plan.prepare(&at, scaling);
    let mut sends = Vec::new();
    for step in 1..ws {
        let chunk = plan.chunk(produce(me, step, ws), &at, &bt, scaling, Some(&prepared));
        sends.push(be.send(&be.upload(&chunk)?, (me + ws - step) % ws)?);
    }
    let mut chunks: Vec<Option<Tensor>> = vec![None; ws];
    chunks[me] = Some(plan.chunk(me, &at, &bt, scaling, Some(&prepared)));
    for (src, w) in recvs {
        chunks[src] = Some(be.download(w.wait(BUG_WAIT)?)?);
    }
    for w in &sends {
        w.wait(BUG_WAIT)?;
    }
    let chunks: Vec<Tensor> = chunks.into_iter().map(|c| c.expect("every rank's chunk")).collect();
    Ok(m.s.done(be.upload(&plan.reduce(&chunks))?, "fused_matmul_reduce_scatter"))
}

bug!(
    /// The pipelined all-gather-matmul puts each shard at its arrival index (the local shard
    /// first, then `rank + 1`, ...) instead of at its source rank: right on rank 0 only.
    AgMatmulShardAtArrivalIndex {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { slot: |_, _, step, _| step, ..AG_RIGHT })
    }
});

bug!(
    /// A ring all-gather-matmul that attributes every shard to the neighbour it came from (the
    /// shard of rank `r + step` arrives through `r + 1` in a ring): right at world size 2 only.
    AgMatmulShardFromNeighbour {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { slot: |me, src, step, ws| if step == 0 { src } else { (me + 1) % ws }, ..AG_RIGHT })
    }
});

/// [`AgMatmulPlan::consume`] in two halves of `rows / 2` rows each (finer overlap): with an odd
/// row count the last row of the shard is never multiplied, its output rows stay zero.
fn consume_in_halves(
    p: &AgMatmulPlan,
    parts: &mut AgMatmulParts,
    r: usize,
    shard: &Tensor,
    bs: &[Tensor],
    sa: Option<&Scale>,
    sb: Option<&[Scale]>,
) {
    p.consume(parts, r, shard, bs, sa, sb);
    if p.rows % 2 == 1 {
        for (i, out) in parts.outs.iter_mut().enumerate() {
            let row = p.ns[i] * p.out_dtypes[i].size();
            let at = (r * p.rows + p.rows - 1) * row;
            out[at..at + row].fill(0);
        }
    }
}

bug!(
    /// The pipelined all-gather-matmul multiplies each shard in two halves of `rows / 2` rows:
    /// an odd row count drops the shard's last row from every output (left zero).
    AgMatmulOddRowDropped {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { consume: consume_in_halves, ..AG_RIGHT })
    }
});

/// A bf16 / f16 block product accumulated in the input dtype (each multiply-add rounded to it),
/// as a naive half-precision GEMM does; other dtypes and the scaled variants as the plan does.
fn consume_low_precision(
    p: &AgMatmulPlan,
    parts: &mut AgMatmulParts,
    r: usize,
    shard: &Tensor,
    bs: &[Tensor],
    sa: Option<&Scale>,
    sb: Option<&[Scale]>,
) {
    use concord_core::half::{bf16, f16};
    p.consume(parts, r, shard, bs, sa, sb);
    let lp: fn(f32) -> f32 = match p.dtype {
        DType::BF16 => |x| bf16::from_f32(x).to_f32(),
        DType::F16 => |x| f16::from_f32(x).to_f32(),
        _ => return,
    };
    if sa.is_some() || sb.is_some() {
        return;
    }
    let av = to_f32(&move_to_front(shard, p.dim));
    for (i, b) in bs.iter().enumerate() {
        let (n, bv) = (p.ns[i], to_f32(b));
        let mut v = vec![0.0f64; p.rows * n];
        for row in 0..p.rows {
            for j in 0..n {
                v[row * n + j] = (0..p.k).fold(0.0f32, |acc, kk| lp(acc + av[row * p.k + kk] * bv[kk * n + j])) as f64;
            }
        }
        let t = round_into(p.out_dtypes[i], &[p.rows, n], &v);
        let ob = t.len_bytes();
        parts.outs[i][r * ob..(r + 1) * ob].copy_from_slice(t.bytes());
    }
}

bug!(
    /// bf16 / f16 all-gather-matmul accumulates every dot product in bf16 / f16 (rounded after
    /// each multiply-add) instead of f32 rounded once.
    AgMatmulHalfAccumulation {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { consume: consume_low_precision, ..AG_RIGHT })
    }
});

/// [`AgMatmulPlan::consume`] with `movedim(shard, dim, 0)` written as a reshape to the moved
/// shape (a view: no data moves), and [`finish_reshaped`] its way back.
fn consume_reshaped(
    p: &AgMatmulPlan,
    parts: &mut AgMatmulParts,
    r: usize,
    shard: &Tensor,
    bs: &[Tensor],
    sa: Option<&Scale>,
    sb: Option<&[Scale]>,
) {
    let moved = shard.clone().reshaped(&moved_shape(&p.shard_shape, p.dim));
    // The plan's consume moves a tensor whose gather dim is first already when dim is 0.
    let as_dim0 = AgMatmulPlan { dim: 0, shard_shape: moved.shape().to_vec(), ..p.clone() };
    as_dim0.consume(parts, r, &moved, bs, sa, sb);
}

fn finish_reshaped(p: &AgMatmulPlan, parts: AgMatmulParts) -> (Tensor, Vec<Tensor>) {
    let as_dim0 = AgMatmulPlan { dim: 0, shard_shape: moved_shape(&p.shard_shape, p.dim), ..p.clone() };
    let (ag, outs) = as_dim0.finish(parts);
    (ag.reshaped(&p.ag_shape()), outs.into_iter().enumerate().map(|(i, t)| t.reshaped(&p.out_shape(i))).collect())
}

bug!(
    /// All-gather-matmul moves the gather dim to the front with a reshape (no transpose) and
    /// back the same way: right for gather dim 0 only.
    AgMatmulMovedimAsReshape {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { consume: consume_reshaped, finish: finish_reshaped, ..AG_RIGHT })
    }
});

bug!(
    /// The scaled all-gather-matmul never gathers the per-row `A` scales: every shard is scaled
    /// by this rank's own rows (torch's seed gathers `A_scale` with `A_shard`).
    AgScaledRowScalesNotGathered {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        pipelined_ag(m, a, bs, dim, sc, AgKnobs { local_row_scales: true, ..AG_RIGHT })
    }
});

/// The all-gathered `A` returned in a persistent workspace per (dtype, shape) — a symmetric-
/// memory buffer the next call with that shape gathers into again, overwriting the tensor an
/// earlier call returned.
#[derive(Default)]
pub struct AgMatmulGatheredInWorkspace {
    workspace: Mutex<HashMap<(DType, Vec<usize>), Buf>>,
}

impl Bug for AgMatmulGatheredInWorkspace {
    fn fused_all_gather_matmul(&self, m: &Mutant, a: &Buf, bs: &[Buf], dim: usize, sc: Option<&Scaling>) -> Result<Work<Gathered<Buf>>> {
        let (ag, outs) = pipelined_ag(m, a, bs, dim, sc, AG_RIGHT)?.into_value(BUG_WAIT)?;
        let be = &*m.s.inner;
        let key = (be.buffer_dtype(&ag), be.buffer_shape(&ag));
        let mut spaces = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match spaces.get(&key) {
            Some(b) => b.clone(),
            None => spaces.entry(key.clone()).or_insert(be.alloc(key.0, &key.1)?).clone(),
        };
        be.write(&buf, &be.download(&ag)?)?;
        Ok(m.s.done((buf, outs), "fused_all_gather_matmul"))
    }
}

bug!(
    /// The pipelined matmul-reduce-scatter computes the chunk of `rank + step` but sends it to
    /// `rank - step` (the two directions of the ring mixed up): right at world size 2 only.
    MmRsChunkForOtherDirection {
    fn fused_matmul_reduce_scatter(&self, m: &Mutant, a: &Buf, b: &Buf, op: ReduceOp, dim: usize, sc: Option<&Scaling>) -> Result<Work<Buf>> {
        pipelined_mm_rs(m, a, b, op, dim, sc, |me, step, ws| (me + step) % ws)
    }
});

bug!(
    /// matmul-reduce-scatter hands its reduce op straight to the reduce-scatter it runs (as a
    /// wrapper over NCCL would: max / min / product all exist there), so `max` returns a max-
    /// reduced product instead of the seed's "reduce_op must be sum or avg" on every rank: the
    /// call is validated as if it were a sum.
    MmRsAnyReduceOp {
    fn fused_matmul_reduce_scatter(&self, m: &Mutant, a: &Buf, b: &Buf, op: ReduceOp, dim: usize, sc: Option<&Scaling>) -> Result<Work<Buf>> {
        let be = &*m.s.inner;
        let checked = if matches!(op, ReduceOp::Avg) { op } else { ReduceOp::Sum };
        let ins = input_descs(be, a, std::slice::from_ref(b));
        exchange_and_validate(be, &describe(CallOp::FusedMatmulReduceScatter, be.rank(), ins.clone(), Some(checked), dim, sc))?;
        let plan = MatmulRsPlan::new(be.world_size(), &ins[0], &ins[1], checked, dim, sc);
        let c = plan.product(&be.download(a)?, &be.download(b)?, sc);
        let work = be.reduce_scatter_tensor(&be.upload(&move_to_front(&c, dim))?, op)?;
        let out = be.upload(&move_from_front(&be.download(work.wait(BUG_WAIT)?)?, dim))?;
        Ok(m.s.done(out, "fused_matmul_reduce_scatter"))
    }
});

/// premul_sum as each rank's own pre-multiplication (in f64), then a sum rounded once: right
/// values whenever the factors agree, but they are never compared.
fn premul_locally(s: &Shm, x: &Buf, f: f64, in_place: bool) -> Result<Work<Buf>> {
    let t = s.inner.download(x)?;
    let scaled: Vec<f64> = (0..t.numel()).map(|i| t.get_f64(i) * f).collect();
    let w = s.inner.all_reduce(&s.inner.upload(&Tensor::from_f64(DType::F64, t.shape(), &scaled))?, ReduceOp::Sum)?;
    let out = if in_place { x.clone() } else { s.inner.alloc(t.dtype(), t.shape())? };
    let (o, dtype) = (out.clone(), t.dtype());
    Ok(s.then_as(w, out, move |be, sum| {
        let v = be.download(sum)?;
        be.write(&o, &Tensor::from_f64(dtype, v.shape(), &(0..v.numel()).map(|i| v.get_f64(i)).collect::<Vec<_>>()))
    }))
}

bug!(
    /// premul_sum as NCCL's `ncclRedOpCreatePreMulSum` runs it: each rank pre-multiplies its
    /// own input by its own factor and the ranks sum; the factors are never compared, so ranks
    /// passing different factors get `Σ f_r x_r` instead of `bad_input:reduce_op_mismatch`.
    PremulSumFactorsNotCompared {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match op {
            ReduceOp::PremulSum(f) if s.inner.buffer_dtype(x).is_float() => premul_locally(s, x, f, false),
            _ => s.inner.all_reduce(x, op),
        }
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match op {
            ReduceOp::PremulSum(f) if s.inner.buffer_dtype(x).is_float() => premul_locally(s, x, f, true),
            _ => s.inner.all_reduce_(x, op),
        }
    }
});

/// Every mutant: name, clause, what the bug is, and the case-id substrings to run first.
/// The maker of the mutant named `name`.
pub fn maker(name: &str) -> Option<crate::MakeBug> {
    catalogue().into_iter().find(|s| s.name == name).map(|s| s.make)
}

pub fn catalogue() -> Vec<Spec> {
    use crate::campaign::spec;
    vec![
        // values
        spec::<SumIsMaxF32>("sum_is_max_f32", "values.reduce", "f32 sum computes max", &["all_reduce::out::f32::sum::ws2"]),
        spec::<MaxIsMinBf16>("max_is_min_bf16", "values.reduce", "bf16 max computes min", &["all_reduce::out::bf16::max::ws2"]),
        spec::<ProductIsSum>(
            "product_is_sum",
            "values.reduce",
            "product computes sum (every dtype)",
            &["all_reduce::out::f32::product::ws3"],
        ),
        spec::<BxorIsBor>("bxor_is_bor", "values.reduce", "bxor computes bor", &["all_reduce::out::i32::bxor::ws2"]),
        spec::<LastElementNotReduced>(
            "last_element_not_reduced",
            "values.reduce",
            "the last element keeps this rank's input (off by one at the end)",
            &["all_reduce::out::f32::sum::ws2"],
        ),
        spec::<U64SumWrapsAt32Bits>(
            "u64_sum_wraps_at_32_bits",
            "values.reduce",
            "u64 sum keeps the low 32 bits",
            &["all_reduce::out::u64::sum"],
        ),
        spec::<IntAvgFloors>(
            "int_avg_floors",
            "values.reduce",
            "signed-int avg rounds down, declares Truncate",
            &["caps::int_avg", "::avg::"],
        ),
        // sizes
        spec::<WrongAbove64KElements>(
            "wrong_above_64k_elements",
            "values.sizes",
            "all_reduce wrong above 65,536 elements",
            &["async::lag_read_right_after_wait"],
        ),
        spec::<WrongAbove1MiB>(
            "wrong_above_1mib",
            "values.sizes",
            "all_gather result wrong above 1 MiB",
            &["sizes::all_gather_into_tensor::f32::n262145", "all_gather_into_tensor::out"],
        ),
        spec::<TruncatesLastChunk>(
            "truncates_last_chunk",
            "values.sizes",
            "all_reduce leaves the last partial 1024-element chunk unreduced",
            &["all_reduce::out::i32::sum::ws2", "all_reduce::out"],
        ),
        // world sizes
        spec::<WrongAtWs6Or7>("wrong_at_ws6_or_7", "values.world_sizes", "all_reduce wrong at world size 6 or 7", &["::ws6", "::ws7"]),
        spec::<WrongAboveWs8>("wrong_above_ws8", "values.world_sizes", "all_reduce wrong above world size 8", &["::ws12", "::ws16"]),
        spec::<WrongAtWs1>(
            "wrong_at_ws1",
            "values.world_sizes",
            "all_gather wrong at world size 1",
            &["all_gather_into_tensor::out::f32::ws1"],
        ),
        // subgroups
        spec::<AvgDividesByWorldSize>(
            "avg_divides_by_world_size",
            "subgroups.reduce_ops",
            "subgroup avg divides by the world size",
            &["subgroup::halves::all_reduce::out::f32::avg", "subgroup::", "::avg::"],
        ),
        spec::<GroupRankIsWorldRank>("group_rank_is_world_rank", "subgroups", "rank() of a subgroup is the world rank", &["subgroup::"]),
        spec::<GroupRootIsWorldRank>(
            "group_root_is_world_rank",
            "subgroups",
            "subgroup broadcast reads src as a world rank",
            &["subgroup::halves::broadcast", "subgroup::"],
        ),
        // async
        spec::<CompletesEarlyBroadcast>(
            "completes_early_broadcast",
            "async.every_op_every_rank",
            "broadcast's is_completed() is true before the peers arrive",
            &["async::", "broadcast"],
        ),
        spec::<IssueBlocksAllToAll>(
            "issue_blocks_all_to_all",
            "async.every_op_every_rank",
            "all_to_all_single blocks at issue until the peers arrive",
            // Its catcher first: the other async cases wait out deadlines under the bug (37 s).
            &["async::pending_until_peers_arrive::all_to_all_single", "async::", "all_to_all"],
        ),
        spec::<IssueBlocksAllReduce>(
            "issue_blocks_all_reduce",
            "async.issue_returns",
            "all_reduce blocks at issue until the peers arrive",
            &["async::pending_until_peers_arrive", "async::"],
        ),
        spec::<WaitIgnoresDeadline>(
            "wait_ignores_deadline",
            "async.deadline",
            "all_reduce's wait ignores its timeout",
            &["async::peer_never_joins_then_recovers", "async::"],
        ),
        // deadlines
        spec::<TimeoutNotNamed>(
            "timeout_not_named",
            "async.deadline",
            "a timed-out wait is a generic backend error, and final",
            &["async::peer_never_joins_then_recovers"],
        ),
        spec::<WaitOvershootsDeadline>(
            "wait_overshoots_deadline",
            "async.deadline",
            "wait(t) blocks 2t + 0.5 s",
            &["async::peer_never_joins_then_recovers"],
        ),
        spec::<PeerDeathUnnamed>("peer_death_unnamed", "async.deadline", "a dead peer is reported as a generic error", &["async::"]),
        // roots
        spec::<ReduceIgnoresRoot>("reduce_ignores_root", "values.reduce", "reduce always to rank 0", &["reduce::out::f32::sum::ws2"]),
        spec::<GatherIgnoresRoot>("gather_ignores_root", "values.move", "gather always to rank 0", &["gather::out::f32::ws2"]),
        spec::<ScatterIgnoresRoot>("scatter_ignores_root", "values.move", "scatter always from rank 0", &["scatter::out::f32::ws2"]),
        spec::<ReduceAcceptsMismatchedRoots>(
            "reduce_accepts_mismatched_roots",
            "bad_input.root_agreement",
            "reduce runs as all_reduce: mismatched roots accepted",
            &["bad_input::reduce_root_differs_across_ranks"],
        ),
        spec::<GatherAcceptsMismatchedRoots>(
            "gather_accepts_mismatched_roots",
            "bad_input.root_agreement",
            "gather runs as all_gather: mismatched roots accepted",
            &["bad_input::gather_root_differs_across_ranks"],
        ),
        // views
        spec::<IgnoresInputViewOffset>(
            "ignores_input_view_offset",
            "views",
            "inputs that are views at an offset are read from offset 0",
            &["fused::all_gather_matmul::dim0::f32::exact::ws1", "reuse::", "caps::aliasing"],
        ),
        spec::<WritesOutAtOffset0>(
            "writes_out_at_offset_0",
            "views",
            "_out buffers that are views at an offset are written at offset 0",
            &["all_gather_into_tensor::outbuf::f32::ws2"],
        ),
        // rounding
        spec::<F16SumDoubleRounded>(
            "f16_sum_double_rounded",
            "numerics.round_once",
            "f16 sum rounded to f16 after every partial sum",
            &["numerics::round_once::f16", "all_reduce::out::f16::sum"],
        ),
        spec::<PremulSumIgnoresFactor>(
            "premul_sum_ignores_factor",
            "numerics.premul_sum",
            "premul_sum ignores its factor",
            &["all_reduce::out::f32::premul_sum::ws2"],
        ),
        spec::<FlushesSubnormals>(
            "flushes_subnormals",
            "numerics.subnormal",
            "all_reduce flushes subnormal results to zero",
            &["numerics::subnormal::f16::ws2", "all_reduce::out::f"],
        ),
        // ordering
        spec::<P2pSwappedInFlight>(
            "p2p_swapped_in_flight",
            "p2p.order",
            "two in-flight recvs from one peer get each other's message",
            &["p2p::in_flight_in_order::same_size", "send_recv::"],
        ),
        spec::<AllGatherRotated>(
            "all_gather_rotated",
            "values.move",
            "all_gather rank order rotated by one",
            &["all_gather_into_tensor::out::f32::ws3"],
        ),
        spec::<ScatterChunksRotated>(
            "scatter_chunks_rotated",
            "values.move",
            "scatter sends chunk r + 1 to rank r",
            &["scatter::out::f32::ws2"],
        ),
        spec::<PermuteInverted>(
            "permute_inverted",
            "values.move",
            "permute_tensor applies the inverse permutation",
            &["permute_tensor::out::f32::ws3"],
        ),
        // barrier
        spec::<BarrierReturnsAtOnce>("barrier_returns_at_once", "barrier", "barrier completes at once, without the peers", &["barrier::"]),
        // leaks
        spec::<LeaksOneCountPerAllGather>(
            "leaks_one_count_per_all_gather",
            "quiescence",
            "each all_gather leaves one work counted in outstanding()",
            // Caught only once an all_gather ran earlier in the same world (the leak persists).
            &["all_gather_into_tensor::out::f32::ws2", "seed::eager::work_registry_zero_after_wait"],
        ),
        spec::<LeakedSubgroupBarrier>(
            "leaked_subgroup_barrier",
            "quiescence",
            "subgroup all_reduce leaks an internal barrier (outstanding() > 0 forever)",
            &["subgroup::halves::all_reduce::out::f32::sum::ws2", "subgroup::"],
        ),
        // bad input
        spec::<TruncatesIndivisibleReduceScatter>(
            "truncates_indivisible_reduce_scatter",
            "bad_input.named_everywhere",
            "reduce_scatter drops the rows of an indivisible dim 0",
            &["bad_input::reduce_scatter_indivisible_ws2"],
        ),
        spec::<AcceptsWrongOutSize>(
            "accepts_wrong_out_size",
            "bad_input.named_everywhere",
            "all_gather _out of the wrong size is filled as far as it goes",
            &["bad_input::all_gather_out_wrong_size"],
        ),
        // aliasing / in-place
        spec::<InplaceBroadcastReturnsCopy>(
            "inplace_broadcast_returns_copy",
            "placement.in_place",
            "broadcast_ returns a new buffer",
            &["broadcast::inplace::f32::ws2"],
        ),
        spec::<CoalescedInplaceReturnsCopies>(
            "coalesced_inplace_returns_copies",
            "placement.in_place",
            "all_reduce_coalesced_ returns new buffers",
            &["all_reduce::coalesced_inplace::f32::sum::ws2"],
        ),
        spec::<OutOfPlaceReturnsInput>(
            "out_of_place_returns_input",
            "placement.out_of_place",
            "all_reduce (out-of-place) reduces into its input and returns it",
            &["all_reduce::out::f32::sum::ws2"],
        ),
        spec::<ReduceScatterMutatesInput>(
            "reduce_scatter_mutates_input",
            "placement.out_of_place",
            "reduce_scatter flips a bit of its input",
            &["reduce_scatter_tensor::out::f32::sum::ws2"],
        ),
        // guard bytes
        spec::<WritesPastReduceScatterOut>(
            "writes_past_reduce_scatter_out",
            "placement.out_buffer",
            "reduce_scatter _out writes one element past the buffer",
            &["reduce_scatter_tensor::outbuf::f32::sum::ws2"],
        ),
        // coalesced
        spec::<AllReduceCoalescedDropsLast>(
            "all_reduce_coalesced_drops_last",
            "values.coalesced",
            "all_reduce_coalesced leaves the last tensor unreduced",
            &["all_reduce::coalesced::f32::sum::ws2"],
        ),
        // second campaign: clause ids of core/src/backend.rs
        spec::<U8SumSwarCarries>(
            "u8_sum_swar_carries",
            "values.sizes",
            "i8/u8 sum of >= 64 elements adds 4 bytes per 32-bit word: carries cross byte lanes",
            &["all_reduce::out::u8::sum::ws2::long", "::long"],
        ),
        spec::<ZeroTimeoutWaitsForever>(
            "zero_timeout_waits_forever",
            "async.deadline",
            "wait(0) means no timeout (c10d's kNoTimeout): a zero-timeout poll blocks until done",
            &["async::wait_zero_polls"],
        ),
        spec::<PermuteAsCyclicShift>(
            "permute_as_cyclic_shift",
            "values.move",
            "permute_tensor runs every permutation as the cyclic shift by src_dst[0]",
            &["permute_tensor::out::f32::ws3::perm_", "::perm_"],
        ),
        spec::<PermuteSkipsSelf>(
            "permute_skips_self",
            "values.move",
            "permute_tensor: a rank mapped to itself (ws > 1) skips its self-copy, output zeros",
            &["permute_tensor::out::f32::ws3::perm_", "::perm_"],
        ),
        spec::<StaticOutputPerShape>(
            "static_output_per_shape",
            "placement.out_of_place",
            "out-of-place all_reduce returns one persistent output per (dtype, shape): the next call overwrites it",
            &["reuse::outputs_kept"],
        ),
        spec::<SubgroupGatherWorldOrder>(
            "subgroup_gather_world_order",
            "subgroups",
            "subgroup gather orders the chunks by world rank, not group rank",
            &["subgroup::reversed::gather", "subgroup::"],
        ),
        spec::<Bf16MovedAsF16>(
            "bf16_moved_as_f16",
            "values.move",
            "broadcast / all_gather send bf16 through f16 (an fp16 compression path)",
            &["::bf16::ws2::bits", "::bits"],
        ),
        spec::<CompletesOnlyInWait>(
            "completes_only_in_wait",
            "async.result_final_after_wait",
            "progress only inside wait: is_completed() stays false until the work is waited",
            &["async::completes_without_wait"],
        ),
        spec::<UnsignedMinMaxAsSigned>(
            "unsigned_min_max_as_signed",
            "values.reduce",
            "u32 / u64 min and max compare as signed (int32 / int64 kernel)",
            &["all_reduce::out::u32::max::ws2"],
        ),
        spec::<AllToAllEmptyInputReturnsZeros>(
            "all_to_all_empty_input_returns_zeros",
            "values.move",
            "all_to_all_single on a rank with nothing to send returns zeros for what it receives",
            &["all_to_all_single::out"],
        ),
        spec::<CoalescedSameShapeCollide>(
            "coalesced_same_shape_collide",
            "values.coalesced",
            "all_reduce_coalesced maps results back by (dtype, shape): same-shape inputs collide",
            // The matrix's coalesced lists hold distinct shapes; the async round's two tensors share one.
            &["async::pending_until_peers_arrive::all_reduce::coalesced::", "all_reduce::coalesced::"],
        ),
        // third campaign
        spec::<P2pMatchesBytesNotDtype>(
            "p2p_matches_bytes_not_dtype",
            "p2p.matching",
            "send / recv match by byte size: f32[4] sent into i32[4] is accepted and reinterpreted",
            &["bad_input::send_recv_dtype_mismatch", "send_recv::"],
        ),
        spec::<BroadcastMovesBytes>(
            "broadcast_moves_bytes",
            "bad_input.named_everywhere",
            "broadcast moves bytes: a non-root buffer of another dtype of the same size is filled, no error",
            &["bad_input::broadcast_dtype_mismatch", "bad_input::broadcast"],
        ),
        spec::<CoalescedMixedDtypesAsFirst>(
            "coalesced_mixed_dtypes_as_first",
            "values.coalesced",
            "all_reduce_coalesced of mixed dtypes reduces every tensor in the first tensor's dtype",
            &["all_reduce::coalesced::mixed_dtypes", "all_reduce::coalesced"],
        ),
        spec::<AllToAllEqualSplitByElements>(
            "all_to_all_equal_split_by_elements",
            "shapes.equal_split_all_to_all",
            "equal-split all_to_all checks numel % ws, not d0 % ws: [3, 2] at ws 2 is split mid-row",
            &["bad_input::all_to_all_equal_split_indivisible", "all_to_all_equal::"],
        ),
        spec::<IntAvgThroughF32>(
            "int_avg_through_f32",
            "values.reduce",
            "integer avg computed in f32 and truncated back: wrong beyond 24 significant bits",
            &["all_reduce::out::i32::avg::ws2", "::avg::"],
        ),
        spec::<PremulSumTwiceInPlace>(
            "premul_sum_twice_in_place",
            "numerics.premul_sum",
            "in-place premul_sum pre-scales the input and scales again in the kernel",
            &["all_reduce::inplace::f32::premul_sum::ws2", "premul_sum"],
        ),
        spec::<RegistrationCachedByAddress>(
            "registration_cached_by_address",
            "placement.realloc",
            "all_reduce reuses the element count first registered for an address",
            &["realloc::all_reduce", "realloc::"],
        ),
        spec::<SubgroupPeerAsWorldRank>(
            "subgroup_peer_as_world_rank",
            "subgroups",
            "subgroup send / recv read the peer as a world rank",
            // The reversed layout's group has every rank, in another order: no world rank
            // equals its group rank but a middle one's.
            &["subgroup::reversed::send_recv", "subgroup::"],
        ),
        spec::<ReduceScatterNonPow2ExtraRank>(
            "reduce_scatter_non_pow2_extra_rank",
            "values.world_sizes",
            "reduce_scatter at a non-power-of-two ws: ranks past the largest power of two get their partner's chunk",
            &["reduce_scatter_tensor::out::f32::sum::ws3", "reduce_scatter_tensor::out"],
        ),
        spec::<I64SumThroughF64>(
            "i64_sum_through_f64",
            "values.reduce",
            "i64 sum accumulated in f64: wrong above 2^53",
            &["all_reduce::out::i64::sum::ws2"],
        ),
        spec::<DroppedWorkStaysCounted>(
            "dropped_work_stays_counted",
            "quiescence",
            "an all_reduce dropped without wait stays counted in outstanding()",
            &["seed::c10d::test_unwaited", "async::"],
        ),
        spec::<SendCompletesAtIssue>(
            "send_completes_at_issue",
            "async.every_op_every_rank",
            "send's is_completed() is true at issue, before the receiver posted its recv",
            &["p2p::send_buffer_reused_once_completed", "async::pending_until_peers_arrive::send_recv"],
        ),
        // fourth campaign: fused ops (seed 004) and premul_sum factors
        spec::<AgMatmulShardAtArrivalIndex>(
            "ag_matmul_shard_at_arrival_index",
            "fused.pipelined_order",
            "pipelined all-gather-matmul places each shard at its arrival index, not its source rank",
            &["fused::all_gather_matmul::dim0::f32::exact::ws2", "fused::all_gather_matmul"],
        ),
        spec::<AgMatmulShardFromNeighbour>(
            "ag_matmul_shard_from_neighbour",
            "fused.values",
            "ring all-gather-matmul attributes every shard to the neighbour it came from (right at ws 2)",
            &["fused::all_gather_matmul::dim0::f32::exact::ws3", "fused::all_gather_matmul"],
        ),
        spec::<AgMatmulOddRowDropped>(
            "ag_matmul_odd_row_dropped",
            "fused.values",
            "all-gather-matmul multiplies each shard in two halves of rows/2: an odd last row is dropped",
            &["fused::all_gather_matmul::dim0::f32::odd_rows::ws2", "::odd_rows::"],
        ),
        spec::<AgMatmulHalfAccumulation>(
            "ag_matmul_half_accumulation",
            "fused.values",
            "bf16 / f16 all-gather-matmul accumulates in bf16 / f16 instead of f32",
            &["fused::all_gather_matmul::dim1::bf16", "fused::all_gather_matmul"],
        ),
        spec::<AgMatmulMovedimAsReshape>(
            "ag_matmul_movedim_as_reshape",
            "fused.values",
            "all-gather-matmul moves the gather dim with a reshape (no transpose): right for dim 0 only",
            &["fused::all_gather_matmul::dim1::f32::exact::ws1", "fused::all_gather_matmul"],
        ),
        spec::<AgScaledRowScalesNotGathered>(
            "ag_scaled_row_scales_not_gathered",
            "fused.values",
            "scaled all-gather-matmul scales every shard by this rank's own row scales",
            &["fused::all_gather_scaled_matmul::dim0::f32::rows::exact::ws2", "fused::all_gather_scaled_matmul"],
        ),
        spec::<AgMatmulGatheredInWorkspace>(
            "ag_matmul_gathered_in_workspace",
            "fused.buffers",
            "all-gather-matmul returns the gathered A in a per-shape workspace the next call overwrites",
            &["fused::all_gather_matmul::dim0::f32::outputs_kept::ws2", "::outputs_kept::"],
        ),
        spec::<MmRsChunkForOtherDirection>(
            "mm_rs_chunk_for_other_direction",
            "fused.values",
            "pipelined matmul-reduce-scatter sends rank r - step the chunk of r + step (right at ws 2)",
            &["fused::matmul_reduce_scatter::dim0::f32::sum::exact::ws3", "fused::matmul_reduce_scatter"],
        ),
        spec::<MmRsAnyReduceOp>(
            "mm_rs_any_reduce_op",
            "fused.bad_input",
            "matmul-reduce-scatter passes any reduce op to its reduce-scatter (max accepted, not a named error)",
            &["fused::bad_input::reduce_op_not_sum_or_avg", "fused::bad_input::"],
        ),
        spec::<PremulSumFactorsNotCompared>(
            "premul_sum_factors_not_compared",
            "bad_input.named_everywhere",
            "premul_sum pre-multiplies each rank's input by its own factor: differing factors accepted",
            &["bad_input::all_reduce_premul_sum_factor_mismatch", "bad_input::"],
        ),
    ]
}
