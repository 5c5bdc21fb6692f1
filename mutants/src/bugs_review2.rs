//! The second review's weak checks: each mutant is a bug that a check looked able to catch but
//! did not (equal-size subgroups fed identical inputs, a declared rounding bound never read,
//! avg compared within 2 ulp where it is exact, NaN payloads compared as "any NaN", a recv
//! checked through the buffer it returns, 8-byte dtypes never past 48 KiB, a declared gap never
//! probed). Most survived the catalogue before its check was strengthened (docs/RESULTS.md, "Review fixes: weak checks").

use crate::campaign::{spec, Spec};
use crate::{edit, lock, set_f64, Buf, Bug, Shm};
use concord_core::{Backend, Capabilities, DType, ReduceOp, Result, Rounding, Tensor, Work};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------- equal-size groups, one channel

/// Every group this process made from the world, in creation order (world ranks), and the index
/// of the one made last (read by the bug state of the communicator made right after).
static MADE: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());

/// A subgroup all_reduce answered from a channel keyed by (group size, op sequence): the
/// result of the equal-size group that holds world rank 0 (made in the same run of disjoint
/// groups of one size, e.g. `halves`' `[0, 1]` for `[2, 3]`) replaces the group's own, as a
/// backend that caches a collective's plan and buffers by (size, sequence number) across its
/// communicators would. Its group rank 0 posts its result in a file of the world; a member of
/// another such group takes it (same dtype and size, posted within the last second) once its
/// own all_reduce completed, waiting at most 200 ms for it.
#[derive(Default)]
pub struct EqualGroupsShareChannel {
    /// Set on a subgroup: (this group's creation index, the index of its anchor group).
    made: Option<(usize, usize)>,
    seq: AtomicU64,
}

impl EqualGroupsShareChannel {
    fn new_state() -> EqualGroupsShareChannel {
        let made = lock(&MADE);
        let Some(me) = made.len().checked_sub(1) else { return EqualGroupsShareChannel::default() };
        let size = made[me].len();
        // Walk back over a run of disjoint groups of this size to the one holding world rank 0.
        let mut seen: Vec<usize> = Vec::new();
        let mut anchor = None;
        for i in (0..=me).rev() {
            let g = &made[i];
            if g.len() != size || g.iter().any(|r| seen.contains(r)) {
                break;
            }
            seen.extend(g);
            if g.contains(&0) {
                anchor = Some(i);
                break;
            }
        }
        EqualGroupsShareChannel { made: anchor.map(|a| (me, a)), seq: AtomicU64::new(0) }
    }

    fn path(anchor: usize, seq: u64) -> std::path::PathBuf {
        let wid = std::env::var("CONCORD_WORLD_ID").unwrap_or_else(|_| format!("pid{}", std::process::id()));
        std::path::PathBuf::from(format!("/dev/shm/{}review2-channel-{anchor}-{seq}", concord_core::world_prefix(&wid)))
    }
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

impl Bug for EqualGroupsShareChannel {
    fn group_ranks(&self, s: &Shm, ranks: &[usize]) -> Vec<usize> {
        if !s.in_subgroup() {
            lock(&MADE).push(ranks.to_vec());
        }
        ranks.to_vec()
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let w = s.inner.all_reduce(x, op)?;
        let Some((me, anchor)) = self.made.filter(|_| s.in_subgroup()) else { return Ok(w) };
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let (rank, path) = (s.rank(), Self::path(anchor, seq));
        Ok(s.then(w, move |be, out| {
            let mine = be.download(out)?;
            if me == anchor {
                if rank == 0 {
                    let mut body = now_ms().to_le_bytes().to_vec();
                    body.extend_from_slice(mine.bytes());
                    let tmp = path.with_extension("tmp");
                    if std::fs::write(&tmp, &body).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                }
                return Ok(());
            }
            let deadline = Instant::now() + Duration::from_millis(200);
            loop {
                if let Ok(body) = std::fs::read(&path) {
                    let at = u128::from_le_bytes(body[..16].try_into().expect("16 bytes"));
                    if body.len() == 16 + mine.bytes().len() && now_ms().saturating_sub(at) < 1000 {
                        let t = Tensor::from_bytes(mine.dtype(), mine.shape(), &body[16..]);
                        return be.write(out, &t);
                    }
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }))
    }
}

/// `make` of [`EqualGroupsShareChannel`]: the state of the communicator just made.
pub struct EqualGroupsShareChannelMade(EqualGroupsShareChannel);

impl Default for EqualGroupsShareChannelMade {
    fn default() -> Self {
        EqualGroupsShareChannelMade(EqualGroupsShareChannel::new_state())
    }
}

impl Bug for EqualGroupsShareChannelMade {
    fn group_ranks(&self, s: &Shm, ranks: &[usize]) -> Vec<usize> {
        self.0.group_ranks(s, ranks)
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.0.all_reduce(s, x, op)
    }
}

// ---------------------------------------------------------------- Accumulate { ulps: 1 } broken

/// Declares `Rounding::Accumulate { ulps: 1 }` but sums f16 / bf16 like a ring that rounds its
/// partial sum to the dtype at every step (rank order, world size >= 3): half an ulp of a partial
/// sum per step, more than the declared 1 ulp of the terms' magnitude from 4 ranks on.
#[derive(Default)]
pub struct AccumulateBoundBroken;

impl Bug for AccumulateBoundBroken {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        Capabilities { rounding: Rounding::Accumulate { ulps: 1 }, ..s.inner.capabilities() }
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        match s.inner.buffer_dtype(x) {
            d @ (DType::F16 | DType::BF16) => crate::bugs::sum_rounded_per_add(s, x, op, d),
            _ => s.inner.all_reduce(x, op),
        }
    }
}

// ---------------------------------------------------------------- avg by an approximate reciprocal

/// f32 / f64 `avg` computed as the sum times an approximate reciprocal of the world size (one
/// ulp under `1 / ws`), at world sizes that are not powers of two: results 1 ulp off where the
/// average is exact.
#[derive(Default)]
pub struct AvgApproxReciprocal;

impl Bug for AvgApproxReciprocal {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let ws = s.ws();
        if op != ReduceOp::Avg || !matches!(dtype, DType::F32 | DType::F64) || ws.is_power_of_two() {
            return s.inner.all_reduce(x, op);
        }
        let w = s.inner.all_reduce(x, ReduceOp::Sum)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let sum = t.get_f64(i);
                    let v = match dtype {
                        DType::F32 => {
                            let r = f32::from_bits((1.0f32 / ws as f32).to_bits() - 1);
                            (sum as f32 * r) as f64
                        }
                        _ => sum * f64::from_bits((1.0f64 / ws as f64).to_bits() - 1),
                    };
                    set_f64(t, i, v);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- large _out overrun

/// The `_out` all_gather / reduce_scatter and recv write one element past their output when it
/// holds 4 Ki elements or more at 3 ranks or more (a large-message path whose last chunk is
/// rounded up: a write past `_out` that only shows in a guarded parent).
#[derive(Default)]
pub struct LargeOutOverrun;

impl LargeOutOverrun {
    fn over(s: &Shm, out: &Buf, w: Work<Buf>) -> Work<Buf> {
        if s.ws() >= 3 && s.numel(out) >= 4096 {
            crate::bugs::write_past(s, w)
        } else {
            w
        }
    }
}

impl Bug for LargeOutOverrun {
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Ok(Self::over(s, out, s.inner.all_gather_into_tensor_out(x, out)?))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(Self::over(s, out, s.inner.reduce_scatter_tensor_out(x, op, out)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(Self::over(s, out, s.inner.recv(out, src)?))
    }
}

// ---------------------------------------------------------------- avg / premul_sum saturate

/// f16 / bf16 `avg` and `premul_sum` (the scaled reductions) convert their result with a
/// saturating conversion (`satfinite`, as some GPU kernels round their scaled output): ±inf come
/// back as the dtype's largest finite value. `sum` / `min` / `max` take the plain conversion.
#[derive(Default)]
pub struct ScaledReduceSaturates;

impl Bug for ScaledReduceSaturates {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let w = s.inner.all_reduce(x, op)?;
        if !matches!(op, ReduceOp::Avg | ReduceOp::PremulSum(_)) || !matches!(dtype, DType::F16 | DType::BF16) {
            return Ok(w);
        }
        let max = if dtype == DType::F16 { 65504.0 } else { f64::from(f32::from_bits(0x7F7F_0000)) };
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                for i in 0..t.numel() {
                    let v = t.get_f64(i);
                    if v.is_infinite() {
                        set_f64(t, i, max.copysign(v));
                    }
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- 16-bit floats through f32

/// Quiets a 16-bit NaN (sets its quiet bit), as a conversion to f32 and back does: f16 / bf16
/// data moved through f32 registers.
fn quiet_16(t: &mut Tensor) {
    let q: u16 = match t.dtype() {
        DType::F16 => 0x0200,
        DType::BF16 => 0x0040,
        _ => return,
    };
    let n = t.numel();
    for i in 0..n {
        if t.get_f64(i).is_nan() {
            let b = &mut t.bytes_mut()[2 * i..2 * i + 2];
            let v = u16::from_le_bytes([b[0], b[1]]) | q;
            b.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// f16 / bf16 moved through f32 by all_gather, broadcast and send / recv: a signalling NaN
/// arrives quieted (its payload's top bit set); every other value arrives as sent.
#[derive(Default)]
pub struct HalfMovedThroughF32;

impl HalfMovedThroughF32 {
    fn half(s: &Shm, b: &Buf) -> bool {
        matches!(s.inner.buffer_dtype(b), DType::F16 | DType::BF16)
    }
}

impl Bug for HalfMovedThroughF32 {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let w = s.inner.all_gather_into_tensor(x)?;
        Ok(if Self::half(s, x) { s.then(w, |be, out| edit(be, out, quiet_16)) } else { w })
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        Ok(if Self::half(s, x) { s.then(w, |be, out| edit(be, out, quiet_16)) } else { w })
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.recv(out, src)?;
        Ok(if Self::half(s, out) { s.then(w, |be, out| edit(be, out, quiet_16)) } else { w })
    }
}

// ---------------------------------------------------------------- large recv into staging

/// A recv of more than 64 KiB lands in the backend's own staging buffer and returns that
/// buffer; the caller's `out` is never written.
#[derive(Default)]
pub struct LargeRecvReturnsStaging;

impl Bug for LargeRecvReturnsStaging {
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        let (dtype, shape) = (s.inner.buffer_dtype(out), s.inner.buffer_shape(out));
        if s.numel(out) * dtype.size() <= 64 << 10 || src >= s.ws() || src == s.rank() {
            return s.inner.recv(out, src);
        }
        let staging = s.inner.alloc(dtype, &shape)?;
        s.inner.recv(&staging, src)
    }
}

// ---------------------------------------------------------------- 8-byte chunks counted as 4-byte

/// The large all_reduce path counts a 64 KiB chunk's elements as for 4-byte types: above
/// 256 KiB, an 8-byte dtype's chunk of 16384 elements reduces only its first 8192, the rest
/// keeping the rank's own input.
#[derive(Default)]
pub struct EightByteChunkHalved;

impl EightByteChunkHalved {
    const CHUNK: usize = 64 << 10;
}

impl Bug for EightByteChunkHalved {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let dtype = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        if dtype.size() != 8 || n * 8 <= 256 << 10 || s.ws() < 2 {
            return s.inner.all_reduce(x, op);
        }
        let input = s.inner.download(x)?;
        let w = s.inner.all_reduce(x, op)?;
        Ok(s.then(w, move |be, out| {
            edit(be, out, |t| {
                let (per, moved) = (Self::CHUNK / 4, Self::CHUNK / 8);
                for i in (0..n).filter(|i| i % per >= moved) {
                    t.bytes_mut()[8 * i..8 * i + 8].copy_from_slice(&input.bytes()[8 * i..8 * i + 8]);
                }
            })
        }))
    }
}

// ---------------------------------------------------------------- a declared gap not refused

/// Declares bf16 all_gather_into_tensor unsupported (a gap naming a data-moving op) and runs it
/// anyway: a declared gap that is not a named error.
#[derive(Default)]
pub struct GatherGapNotRefused;

impl Bug for GatherGapNotRefused {
    fn capabilities(&self, s: &Shm) -> Capabilities {
        let mut c = s.inner.capabilities();
        c.gaps.push(concord_core::Gap {
            op: Some(concord_core::OpKind::AllGatherIntoTensor),
            variant: None,
            dtype: Some(DType::BF16),
            reduce: None,
            reason: "bf16 all_gather not supported".into(),
        });
        c
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<EqualGroupsShareChannelMade>(
            "review_equal_groups_share_channel",
            "subgroups",
            "a subgroup all_reduce answered from a channel keyed by (group size, op sequence): the result of the equal-size group holding world rank 0",
            &["subgroup::halves::all_reduce::out::f32::sum::ws4"],
        ),
        spec::<AccumulateBoundBroken>(
            "review_accumulate_bound_broken",
            "numerics.round_once",
            "declares Rounding::Accumulate { ulps: 1 } but rounds f16 / bf16 partial sums at every step: from 4 ranks on, \
             more than 1 ulp of the terms' magnitude off",
            &["all_reduce::out::bf16::sum::ws5::random"],
        ),
        spec::<AvgApproxReciprocal>(
            "review_avg_approx_reciprocal",
            "values.reduce",
            "f32 / f64 avg as the sum times an approximate 1/ws (1 ulp under), world sizes not powers of two: 1 ulp off exact averages",
            &["all_reduce::out::f32::avg::ws3"],
        ),
        spec::<LargeOutOverrun>(
            "review_large_out_overrun",
            "placement.out_buffer",
            "the _out all_gather / reduce_scatter and recv write one element past an output of 4 Ki elements or more, at 3 ranks or more",
            &["sizes::all_gather_into_tensor::outbuf::f32::grid::ws3"],
        ),
        spec::<ScaledReduceSaturates>(
            "review_scaled_reduce_saturates",
            "values.reduce",
            "f16 / bf16 avg and premul_sum results converted with saturation: ±inf come back as the largest finite value",
            &["all_reduce::out::f16::avg::ws2::special"],
        ),
        spec::<HalfMovedThroughF32>(
            "review_half_moved_through_f32",
            "values.move",
            "f16 / bf16 all_gather, broadcast and recv moved through f32: signalling NaNs arrive quieted",
            &["all_gather_into_tensor::out::f16::ws2::bits"],
        ),
        spec::<LargeRecvReturnsStaging>(
            "review_large_recv_returns_staging",
            "values.move",
            "a recv above 64 KiB returns the backend's staging buffer; the caller's out is never written",
            &["sizes::send_recv::f32::n65537::ws2"],
        ),
        spec::<EightByteChunkHalved>(
            "review_eight_byte_chunk_halved",
            "values.sizes",
            "the large all_reduce path counts chunk elements for 4-byte types: above 256 KiB an f64 / i64 chunk reduces only its first half",
            &["programs::p2::ws3"],
        ),
        spec::<GatherGapNotRefused>(
            "review_gather_gap_not_refused",
            "bad_input.named_everywhere",
            "declares bf16 all_gather_into_tensor unsupported (a gap on a data-moving op) and completes it anyway",
            &["caps::gaps_refused::bf16::ws2"],
        ),
    ]
}
