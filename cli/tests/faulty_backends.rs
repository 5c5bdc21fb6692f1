//! Self-test: deliberately broken backends (the shared-memory backend with one bug each) must
//! FAIL the suites, with a message that names backend, op, variant, dtype, world size, rank and,
//! for wrong values, the first bad index with got / expected. The correct backend must pass the
//! very same cases (control: the same wrapper with no bug, every call passed to shm). Also the contract map's self-test (`contract::*`).

use concord_core::{Backend, Capabilities, DType, ReduceOp, Result, Tensor, Work, WorkMeta, WorldInfo};
use concord_harness::config::LAUNCHER_VARS;
use concord_harness::verdict::Verdict;
use concord_shm::ShmBackend;
use concord_suites::run::{run_case, BackendEntry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Buf = <ShmBackend as Backend>::Buffer;

const WRONG_REDUCTION: u8 = 1;
const OFF_BY_ONE_SPLIT: u8 = 2;
const EARLY_COMPLETION: u8 = 3;
const WRITES_PAST_OUTPUT: u8 = 4;
const MUTATES_INPUT: u8 = 5;
const WRONG_RANK_ORDER: u8 = 6;
const IGNORES_ROOT: u8 = 7;
const TRUNCATES_SILENTLY: u8 = 8;
const INPLACE_RETURNS_COPY: u8 = 9;
/// Declares `NanPolicy::Ignore` for min / max while the shm backend underneath propagates NaN:
/// a declaration the backend does not live up to (what the caps probes exist for).
const CLAIMS_NAN_IGNORED: u8 = 10;
/// Right everywhere but at world size 6 (sum reduces with max there).
const WRONG_AT_WS6: u8 = 11;
/// all_reduce of more than 64 K elements leaves everything past the first 64 K chunk unreduced.
const UNREDUCED_PAST_64K: u8 = 12;
/// avg in a subgroup divides by the WORLD size instead of the group's.
const SUBGROUP_AVG_BY_WORLD_SIZE: u8 = 13;
/// all_reduce of a view at a non-zero offset reads from its parent's start.
const IGNORES_VIEW_OFFSET: u8 = 14;
/// all_reduce_ caches the element count it registered for an address and reuses it when the
/// address comes back (freed and re-allocated with another size).
const CACHES_SIZE_BY_ADDRESS: u8 = 15;
/// Equal-split all_to_all of a multi-dimensional tensor cuts dim 0's count in ELEMENTS, not rows.
const A2A_EQUAL_SPLIT_IN_ELEMENTS: u8 = 16;
/// `reduce`'s work says `is_completed()` at once, before the peers arrive (its `wait` and its
/// values are right): only the every-op async cases look at `is_completed` of a reduce.
const REDUCE_COMPLETED_AT_ONCE: u8 = 17;
/// `barrier` returns a completed work at once, without synchronising.
const BARRIER_AT_ONCE: u8 = 18;
/// Swaps each pair of consecutive sends to one peer (the 2nd is sent before the 1st).
const SWAPPED_P2P_ORDER: u8 = 19;
/// Each barrier leaks one work: `outstanding()` never goes back to 0.
const LEAKS_WORK: u8 = 20;
/// f16 / bf16 sums accumulated in f32 and rounded twice (shm issue 15 item 11, reintroduced).
const DOUBLE_ROUNDING: u8 = 21;
/// premul_sum uses the factor 2.0 whatever the factor asked (the matrix only uses 2.0).
const PREMUL_FACTOR_TWO: u8 = 22;

/// fused_all_gather_matmul reads each peer's shard before its receive has completed (the
/// pipelining race the seed's barrier prevents).
const FUSED_EARLY_CONSUME: u8 = 23;
/// fused_all_gather_matmul puts peer shards at the wrong rank's place (rank + step where it
/// received from rank - step).
const FUSED_RANK_ORDER: u8 = 24;
/// Rank 2's out-of-place all_reduce result has one bit of its last element flipped; every other
/// rank is right (review14 finding 5: a failure only a surviving non-zero rank sees, run under an
/// external launcher, where rank 0 decides each case from the ranks' records).
const WRONG_ON_RANK_2: u8 = 25;

/// A completion that claims to be done at once; `wait` still waits for the real work.
struct ClaimsDone(Mutex<Work<Buf>>);
impl concord_core::Completion for ClaimsDone {
    fn is_completed(&self) -> bool {
        true
    }
    fn wait_for(&self, timeout: Duration) -> Result<bool> {
        match self.0.lock().unwrap().wait(timeout) {
            Ok(_) => Ok(true),
            Err(e) if e.name() == "timeout" => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The shm backend with bug `BUG`.
struct Faulty {
    /// Which bug (one of the constants above), from the `bug` backend option: one type, so the
    /// catalogue is compiled once, not once per bug.
    bug: u8,
    inner: Arc<ShmBackend>,
    /// view address -> (parent, element offset), so a bug can write just past a view.
    views: Mutex<HashMap<usize, (Buf, usize)>>,
    counter: concord_core::OutstandingCounter,
    /// Size of the whole world (a subgroup's own world size is its group's).
    world_ws: usize,
    /// address -> element count registered there (CACHES_SIZE_BY_ADDRESS).
    regs: Mutex<HashMap<usize, usize>>,
    /// SWAPPED_P2P_ORDER: per destination, a held send (its buffer and the flag of its work).
    held: Mutex<HashMap<usize, (Buf, Arc<concord_core::Flag>)>>,
    /// LEAKS_WORK: works never uncounted.
    leaked: std::sync::atomic::AtomicUsize,
}

impl Faulty {
    fn wrap(inner: ShmBackend, world_ws: usize, bug: u8) -> Self {
        Faulty {
            bug,
            inner: Arc::new(inner),
            views: Mutex::new(HashMap::new()),
            counter: Default::default(),
            world_ws,
            regs: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            leaked: Default::default(),
        }
    }
    /// DOUBLE_ROUNDING: every rank's input gathered, summed in f32 in rank order, rounded to the
    /// dtype (an f32 accumulator rounds once per add, then once more at the end).
    fn f32_sum(&self, x: &Buf) -> Result<Work<Buf>> {
        let ws = self.world_size();
        let dtype = self.inner.buffer_dtype(x);
        let shape = self.inner.buffer_shape(x);
        let flat = self.inner.view(x, 0, &[shape.iter().product()])?;
        let all = self.inner.download(&self.inner.all_gather_into_tensor(&flat)?.into_value(Self::T)?)?;
        let n = all.numel() / ws;
        let mut out = Tensor::zeros(dtype, &shape);
        for i in 0..n {
            let mut acc = 0f32;
            for r in 0..ws {
                acc += all.get_f64(r * n + i) as f32;
            }
            let bits = if dtype == DType::F16 {
                concord_core::half::f16::from_f32(acc).to_bits()
            } else {
                concord_core::half::bf16::from_f32(acc).to_bits()
            };
            out.bytes_mut()[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
        }
        Ok(Work::done(self.inner.upload(&out)?, self.meta("all_reduce"), &self.counter))
    }
    const T: Duration = Duration::from_secs(15);

    fn meta(&self, op: &str) -> WorkMeta {
        WorkMeta { backend: self.name().to_string(), op: op.into(), seq: 0, rank: self.rank() }
    }
    /// Waits for the real result, applies `tamper`, returns it as completed work.
    fn tampered(&self, op: &str, w: Work<Buf>, tamper: impl FnOnce(&Buf) -> Result<()>) -> Result<Work<Buf>> {
        let out = w.into_value(Self::T)?;
        tamper(&out)?;
        Ok(Work::done(out, self.meta(op), &self.counter))
    }
    fn edit(&self, b: &Buf, f: impl FnOnce(&mut Tensor)) -> Result<()> {
        let mut t = self.inner.download(b)?;
        f(&mut t);
        self.inner.write(b, &t)
    }
}

impl Backend for Faulty {
    type Buffer = Buf;
    fn init(world: &WorldInfo) -> Result<Self> {
        let bug = world.option("bug").and_then(|b| b.parse().ok()).unwrap_or(0);
        Ok(Faulty::wrap(ShmBackend::init(world)?, world.world_size, bug))
    }
    fn name(&self) -> &str {
        "faulty"
    }
    concord_core::forward!(inner =>
        rank, world_size, fault_hooks, upload, download, alloc, write, buffer_addr, buffer_dtype,
        buffer_shape, all_reduce_coalesced, all_reduce_coalesced_, all_gather_into_tensor_coalesced,
        reduce_scatter_tensor_out, reduce_scatter_tensor_coalesced, permute_tensor, gather, scatter, recv,
        fused_matmul_reduce_scatter, low_contention_all_gather, low_contention_reduce_scatter
    );
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.bug == CLAIMS_NAN_IGNORED {
            caps.nan_minmax = concord_core::NanPolicy::Ignore;
        }
        caps
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.counter.get() + self.leaked.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        Ok(self.inner.new_group(ranks)?.map(|g| Faulty::wrap(g, self.world_ws, self.bug)))
    }
    fn view(&self, b: &Buf, offset: usize, shape: &[usize]) -> Result<Buf> {
        let v = self.inner.view(b, offset, shape)?;
        // Only the bugs that look a view's parent up remember it (it keeps the parent alive).
        if matches!(self.bug, WRITES_PAST_OUTPUT | IGNORES_VIEW_OFFSET) {
            self.views.lock().unwrap().insert(self.inner.buffer_addr(&v), (b.clone(), offset));
        }
        Ok(v)
    }

    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let numel: usize = self.inner.buffer_shape(x).iter().product();
        match self.bug {
            WRONG_REDUCTION if op == ReduceOp::Sum => self.inner.all_reduce(x, ReduceOp::Max),
            WRONG_AT_WS6 if op == ReduceOp::Sum && self.world_size() == 6 => self.inner.all_reduce(x, ReduceOp::Max),
            SUBGROUP_AVG_BY_WORLD_SIZE if op == ReduceOp::Avg && self.world_ws != self.world_size() && self.buffer_dtype(x).is_float() => {
                self.inner.all_reduce(x, ReduceOp::PremulSum(1.0 / self.world_ws as f64))
            }
            IGNORES_VIEW_OFFSET => match self.views.lock().unwrap().get(&self.inner.buffer_addr(x)).cloned() {
                Some((parent, off)) if off > 0 => self.inner.all_reduce(&self.inner.view(&parent, 0, &self.inner.buffer_shape(x))?, op),
                _ => self.inner.all_reduce(x, op),
            },
            UNREDUCED_PAST_64K if numel > 65536 => {
                let w = self.inner.all_reduce(x, op)?;
                let mine = self.inner.download(x)?;
                self.tampered("all_reduce", w, |out| {
                    self.edit(out, |t| {
                        t.bytes_mut()[65536 * mine.dtype().size()..].copy_from_slice(&mine.bytes()[65536 * mine.dtype().size()..])
                    })
                })
            }
            MUTATES_INPUT => {
                let w = self.inner.all_reduce(x, op)?;
                self.tampered("all_reduce", w, |_| self.edit(x, |t| t.bytes_mut().iter_mut().take(1).for_each(|b| *b ^= 0x40)))
            }
            EARLY_COMPLETION => {
                // Reports completion at once; the data lands 50 ms later.
                let w = self.inner.all_reduce(x, op)?;
                let early = self.inner.upload(&Tensor::zeros(self.inner.buffer_dtype(x), &self.inner.buffer_shape(x)))?;
                let (late, inner) = (early.clone(), Arc::clone(&self.inner));
                std::thread::spawn(move || {
                    if let Ok(v) = w.into_value(Self::T) {
                        std::thread::sleep(Duration::from_millis(50));
                        if let Ok(t) = inner.download(&v) {
                            let _ = inner.write(&late, &t);
                        }
                    }
                });
                Ok(Work::done(early, self.meta("all_reduce"), &self.counter))
            }
            DOUBLE_ROUNDING if op == ReduceOp::Sum && matches!(self.inner.buffer_dtype(x), DType::F16 | DType::BF16) => self.f32_sum(x),
            PREMUL_FACTOR_TWO if matches!(op, ReduceOp::PremulSum(_)) => self.inner.all_reduce(x, ReduceOp::PremulSum(2.0)),
            WRONG_ON_RANK_2 if self.rank() == 2 && numel > 0 => {
                let w = self.inner.all_reduce(x, op)?;
                self.tampered("all_reduce", w, |out| {
                    self.edit(out, |t| {
                        let n = t.len_bytes();
                        t.bytes_mut()[n - 1] ^= 0x40;
                    })
                })
            }
            _ => self.inner.all_reduce(x, op),
        }
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if self.bug == INPLACE_RETURNS_COPY {
            return self.inner.all_reduce(x, op);
        }
        if self.bug == CACHES_SIZE_BY_ADDRESS {
            let numel: usize = self.inner.buffer_shape(x).iter().product();
            let reg = *self.regs.lock().unwrap().entry(self.inner.buffer_addr(x)).or_insert(numel);
            self.inner.all_reduce_(&self.inner.view(x, 0, &[reg.min(numel)])?, op)?.wait(Self::T)?;
            return Ok(Work::done(x.clone(), self.meta("all_reduce_"), &self.counter));
        }
        self.inner.all_reduce_(x, op)
    }
    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        let w = self.inner.all_gather_into_tensor(x)?;
        if self.bug != WRONG_RANK_ORDER {
            return Ok(w);
        }
        let ws = self.world_size();
        self.tampered("all_gather_into_tensor", w, |out| {
            self.edit(out, |t| {
                let chunk = t.len_bytes() / ws;
                let bytes = t.bytes().to_vec();
                for r in 0..ws {
                    let src = &bytes[(ws - 1 - r) * chunk..(ws - r) * chunk];
                    t.bytes_mut()[r * chunk..(r + 1) * chunk].copy_from_slice(src);
                }
            })
        })
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let w = self.inner.all_gather_into_tensor_out(x, out)?;
        if self.bug != WRITES_PAST_OUTPUT {
            return Ok(w);
        }
        self.tampered("all_gather_into_tensor_out", w, |o| {
            let numel: usize = self.inner.buffer_shape(o).iter().product();
            let parent = self.views.lock().unwrap().get(&self.inner.buffer_addr(o)).cloned();
            if let Some((parent, off)) = parent {
                let past = self.inner.view(&parent, off + numel, &[1])?;
                let dtype = self.inner.buffer_dtype(o);
                self.inner.write(&past, &Tensor::filled_bytes(dtype, &[1], 0x11))?;
            }
            Ok(())
        })
    }
    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let ws = self.world_size();
        let shape = self.inner.buffer_shape(x);
        if self.bug == TRUNCATES_SILENTLY && !shape.is_empty() && !shape[0].is_multiple_of(ws) {
            let mut keep = shape.clone();
            keep[0] -= shape[0] % ws;
            let head = self.inner.view(x, 0, &keep)?;
            return self.inner.reduce_scatter_tensor(&head, op);
        }
        self.inner.reduce_scatter_tensor(x, op)
    }
    fn all_to_all_single(&self, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        let shape = self.inner.buffer_shape(x);
        if self.bug == A2A_EQUAL_SPLIT_IN_ELEMENTS && o.is_none() && shape.len() > 1 {
            let got = self.inner.all_to_all_single(&self.inner.view(x, 0, &[shape[0]])?, None, None)?.into_value(Self::T)?;
            let out = self.inner.upload(&Tensor::zeros(self.inner.buffer_dtype(x), &shape))?;
            self.inner.write(&self.inner.view(&out, 0, &[shape[0]])?, &self.inner.download(&got)?)?;
            return Ok(Work::done(out, self.meta("all_to_all_single"), &self.counter));
        }
        let w = self.inner.all_to_all_single(x, o, i)?;
        if self.bug != OFF_BY_ONE_SPLIT {
            return Ok(w);
        }
        let first = o.map(|s| s[0]).unwrap_or(0);
        self.tampered("all_to_all_single", w, |out| {
            // The boundary after the first source's rows is off by one element.
            self.edit(out, |t| {
                let row = t.row_numel() * t.dtype().size();
                let at = first * row;
                let es = t.dtype().size();
                if at >= es && at + es <= t.len_bytes() {
                    let prev = t.bytes()[at - es..at].to_vec();
                    t.bytes_mut()[at..at + es].copy_from_slice(&prev);
                }
            })
        })
    }
    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.inner.broadcast(x, if self.bug == IGNORES_ROOT && src < self.world_size() { 0 } else { src })
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        self.inner.broadcast_(x, if self.bug == IGNORES_ROOT && src < self.world_size() { 0 } else { src })
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let w = self.inner.reduce(x, op, root)?;
        if self.bug != REDUCE_COMPLETED_AT_ONCE {
            return Ok(w);
        }
        let value = w.peek().clone();
        Ok(Work::new(value, Arc::new(ClaimsDone(Mutex::new(w))), self.meta("reduce"), &self.counter))
    }
    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        if self.bug != SWAPPED_P2P_ORDER {
            return self.inner.send(x, dst);
        }
        let held = self.held.lock().unwrap().remove(&dst);
        match held {
            None => {
                // Hold this one (a copy: the caller may reuse x) until the next send to dst.
                let copy = self.inner.upload(&self.inner.download(x)?)?;
                let flag = concord_core::Flag::new();
                self.held.lock().unwrap().insert(dst, (copy, flag.clone()));
                Ok(Work::new((), flag, self.meta("send"), &self.counter))
            }
            Some((first, flag)) => {
                let second = self.inner.send(x, dst)?;
                let w = self.inner.send(&first, dst)?;
                std::thread::spawn(move || flag.set(w.wait(Self::T).map(|_| ())));
                Ok(second)
            }
        }
    }
    fn fused_all_gather_scaled_matmul(
        &self,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: &concord_core::fused::Scaling,
    ) -> Result<Work<concord_core::fused::Gathered<Buf>>> {
        self.inner.fused_all_gather_scaled_matmul(a, bs, dim, scaling)
    }
    fn fused_scaled_matmul_reduce_scatter(
        &self,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        scaling: &concord_core::fused::Scaling,
    ) -> Result<Work<Buf>> {
        self.inner.fused_scaled_matmul_reduce_scatter(a, b, op, dim, scaling)
    }
    fn fused_all_gather_matmul(&self, a: &Buf, bs: &[Buf], dim: usize) -> Result<Work<concord_core::fused::Gathered<Buf>>> {
        if self.bug != FUSED_EARLY_CONSUME && self.bug != FUSED_RANK_ORDER {
            return self.inner.fused_all_gather_matmul(a, bs, dim);
        }
        // A pipelined all-gather-matmul over the inner p2p, with one bug.
        use concord_core::fused::{describe, exchange_and_validate, input_descs, AgMatmulPlan};
        let (ws, me) = (self.world_size(), self.rank());
        let ins = input_descs(&*self.inner, a, bs);
        exchange_and_validate(&*self.inner, &describe(concord_core::CallOp::FusedAllGatherMatmul, me, ins.clone(), None, dim, None))?;
        let plan = AgMatmulPlan::new(ws, &ins[0], &ins[1..], dim, None);
        let mut recvs = Vec::new();
        for step in 1..ws {
            let src = (me + step) % ws;
            let buf = self.inner.alloc(plan.dtype, &plan.shard_shape)?;
            self.inner.write(&buf, &concord_core::Tensor::zeros(plan.dtype, &plan.shard_shape))?;
            let w = self.inner.recv(&buf, src)?;
            let early = (self.bug == FUSED_EARLY_CONSUME).then(|| self.inner.download(&buf)).transpose()?;
            recvs.push((src, buf, w, early));
        }
        let sends = (1..ws).map(|step| self.inner.send(a, (me + ws - step) % ws)).collect::<Result<Vec<_>>>()?;
        let bt = bs.iter().map(|x| self.inner.download(x)).collect::<Result<Vec<_>>>()?;
        let mut parts = plan.start();
        plan.consume(&mut parts, me, &self.inner.download(a)?, &bt, None, None);
        for (src, buf, w, early) in recvs {
            let shard = match early {
                Some(t) => t,
                None => {
                    w.wait(Self::T)?;
                    self.inner.download(&buf)?
                }
            };
            let at = if self.bug == FUSED_RANK_ORDER { (2 * me + ws - src) % ws } else { src };
            plan.consume(&mut parts, at, &shard, &bt, None, None);
            w.wait(Self::T)?;
        }
        for s in &sends {
            s.wait(Self::T)?;
        }
        let (ag, outs) = plan.finish(parts);
        let ag = self.inner.upload(&ag)?;
        let outs = outs.iter().map(|t| self.inner.upload(t)).collect::<Result<Vec<_>>>()?;
        Ok(Work::done((ag, outs), self.meta("fused_all_gather_matmul"), &self.counter))
    }
    fn barrier(&self) -> Result<Work<()>> {
        match self.bug {
            BARRIER_AT_ONCE => Ok(Work::done((), self.meta("barrier"), &self.counter)),
            LEAKS_WORK => {
                self.leaked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.inner.barrier()
            }
            _ => self.inner.barrier(),
        }
    }
}

/// (bug, entry name, case ids that must fail, words the failure message must contain)
fn expectations() -> Vec<(BackendEntry, &'static [&'static str], &'static [&'static str])> {
    fn e(bug: u8, name: &str) -> BackendEntry {
        BackendEntry::new::<Faulty>(name, 0, concord_suites::catalogue::<Faulty>)
            .with_option("bug", &bug.to_string())
            .with_rerun(format!("cargo test -p concord-cli --test faulty_backends -- --exact faulty::{name}_is_caught # case"))
    }
    const VALUE: &[&str] = &["first bad index", "got", "expected", "rank=", "world_size=", "dtype=", "variant=", "op="];
    vec![
        (e(WRONG_REDUCTION, "wrong_reduction"), &["all_reduce::out::f32::sum::ws2", "all_reduce::out::i64::sum::ws3"], VALUE),
        (e(OFF_BY_ONE_SPLIT, "off_by_one_split"), &["all_to_all_single::out::f32::ws2"], VALUE),
        (
            e(EARLY_COMPLETION, "early_completion"),
            &["async::lag_read_right_after_wait::ws2", "all_reduce::out::f32::sum::ws2"],
            &["first bad index", "got", "expected", "rank="],
        ),
        (
            e(WRITES_PAST_OUTPUT, "writes_past_output"),
            &["all_gather_into_tensor::outbuf::f32::ws2", "all_gather_into_tensor::outbuf::u8::ws3"],
            &["past the end", "op=all_gather_into_tensor", "variant=outbuf", "rank=", "world_size="],
        ),
        (
            e(MUTATES_INPUT, "mutates_input"),
            &["all_reduce::out::f32::sum::ws2"],
            &["modified its input", "first bad index", "got", "expected", "op=all_reduce", "variant=out", "dtype=f32", "rank="],
        ),
        (
            e(WRONG_RANK_ORDER, "wrong_rank_order"),
            &["all_gather_into_tensor::out::f32::ws2", "all_gather_into_tensor::out::i32::ws4"],
            VALUE,
        ),
        (
            e(IGNORES_ROOT, "ignores_root"),
            &["broadcast::out::f32::ws2", "broadcast::inplace::i32::ws3", "seed::c10d::test_broadcast"],
            &["first bad index", "got", "expected", "op=broadcast", "rank="],
        ),
        (
            e(TRUNCATES_SILENTLY, "truncates_silently"),
            &["bad_input::reduce_scatter_indivisible_ws2::ws2", "bad_input::reduce_scatter_indivisible_ws3::ws3"],
            &["accepted", "bad_input=reduce_scatter_indivisible", "rank=", "world_size="],
        ),
        (
            e(INPLACE_RETURNS_COPY, "inplace_returns_copy"),
            &["all_reduce::inplace::f32::sum::ws2"],
            &["in-place op returned a different buffer", "op=all_reduce", "variant=inplace", "rank="],
        ),
        (
            e(CLAIMS_NAN_IGNORED, "claims_nan_ignored"),
            &["caps::nan_minmax::f32::ws2", "caps::nan_minmax::bf16::ws3"],
            &[
                "declared nan_minmax=Ignore",
                "observed Propagate",
                "backend=claims_nan_ignored",
                "op=all_reduce",
                "reduce=min",
                "dtype=",
                "world_size=",
                "rank=",
            ],
        ),
        (e(WRONG_AT_WS6, "wrong_at_ws6"), &["all_reduce::out::f32::sum::ws6", "all_reduce::out::bf16::sum::ws6"], VALUE),
        (
            e(UNREDUCED_PAST_64K, "unreduced_past_64k"),
            &["sizes::all_reduce::f32::n65537::ws2", "sizes::all_reduce::i32::n65537::ws3", "sizes::all_reduce::f32::n16777217::ws2"],
            &["first bad index 65536", "got", "expected", "op=all_reduce", "dtype=", "world_size=", "rank=", "n="],
        ),
        (
            e(SUBGROUP_AVG_BY_WORLD_SIZE, "subgroup_avg_by_world_size"),
            &["subgroup::halves::all_reduce::out::f32::avg::ws4", "subgroup::partial::all_reduce::out::f32::avg::ws5"],
            &["first bad index", "got", "expected", "reduce=avg", "(group ", "world_rank=", "rank=", "world_size="],
        ),
        (
            e(IGNORES_VIEW_OFFSET, "ignores_view_offset"),
            &["views::all_reduce::out::f32::sum::ws2", "views::all_reduce::out::bf16::sum::ws3"],
            VALUE,
        ),
        (
            e(CACHES_SIZE_BY_ADDRESS, "caches_size_by_address"),
            &["realloc::all_reduce::inplace::ws2", "realloc::all_reduce::inplace::ws3"],
            &["first bad index", "got", "expected", "op=all_reduce", "variant=inplace", "step=", "reused from step", "rank="],
        ),
        (
            e(A2A_EQUAL_SPLIT_IN_ELEMENTS, "a2a_equal_split_in_elements"),
            &["all_to_all_equal::f32::ws2", "all_to_all_equal::i64::ws3"],
            VALUE,
        ),
        (
            e(REDUCE_COMPLETED_AT_ONCE, "reduce_completed_at_once"),
            &["async::pending_until_peers_arrive::reduce::out::ws2", "async::pending_until_peers_arrive::reduce::out::ws3"],
            &["is_completed() was true before rank", "op=reduce", "variant=out", "dtype=f32", "world_size=", "rank=", "late_rank="],
        ),
        (
            e(BARRIER_AT_ONCE, "barrier_at_once"),
            &[
                "async::barrier_synchronises::ws2",
                "async::barrier_synchronises::ws3",
                "async::pending_until_peers_arrive::barrier::out::ws2",
            ],
            &["op=barrier", "world_size=", "rank=", "late_rank="],
        ),
        (
            e(SWAPPED_P2P_ORDER, "swapped_p2p_order"),
            &[
                "p2p::in_flight_in_order::same_size::n4::ws2",
                "p2p::in_flight_in_order::same_size::n4::ws4",
                "p2p::in_flight_in_order::sizes::n4::ws2",
            ],
            &["op=send_recv", "receive #", "world_size=", "rank="],
        ),
        (
            e(LEAKS_WORK, "leaks_work"),
            &["barrier::out::u8::ws2", "async::barrier_synchronises::ws3"],
            &["quiescence", "outstanding() > 0", "leaked works", "backend=leaks_work", "world_size=", "rank="],
        ),
        (
            e(DOUBLE_ROUNDING, "double_rounding"),
            &["numerics::round_once::f16::ws3", "numerics::round_once::bf16::ws3"],
            &["first bad index", "got", "expected", "op=all_reduce", "dtype=", "reduce=sum", "world_size=3", "rank="],
        ),
        (
            e(FUSED_EARLY_CONSUME, "fused_early_consume"),
            &["fused::all_gather_matmul::dim0::f32::exact::ws2", "fused::all_gather_matmul::dim1::bf16::exact::ws3"],
            &["first bad index", "got", "expected", "op=fused_all_gather_matmul", "dim=", "rank=", "world_size="],
        ),
        (
            e(FUSED_RANK_ORDER, "fused_rank_order"),
            &["fused::all_gather_matmul::dim1::f32::exact::ws3", "fused::all_gather_matmul::dim2::f16::exact::ws4"],
            &["first bad index", "got", "expected", "op=fused_all_gather_matmul", "dim=", "rank=", "world_size="],
        ),
        (
            e(PREMUL_FACTOR_TWO, "premul_factor_two"),
            &["numerics::premul_sum::f32::ws3", "numerics::premul_sum::f16::ws3", "numerics::premul_sum::f64::ws3"],
            &["first bad index", "got", "expected", "op=all_reduce", "reduce=premul_sum", "factor=", "rank="],
        ),
    ]
}

/// The external-launch trial's ranks (review14 finding 5): set in the environment of the
/// processes the trial starts as torchrun would, so that this binary runs as one rank of them.
const EXTERNAL_RANK_ENV: &str = "FAULTY_BACKENDS_EXTERNAL_RANK";
/// The backend those ranks run: wrong on rank 2 alone.
const EXTERNAL_BACKEND: &str = "rank2_wrong";

fn external_entry() -> BackendEntry {
    BackendEntry::new::<Faulty>(EXTERNAL_BACKEND, 0, concord_suites::catalogue::<Faulty>)
        .with_option("bug", &WRONG_ON_RANK_2.to_string())
        .with_rerun(
            "cargo test -p concord-cli --test faulty_backends -- --exact external::a_surviving_rank_2_failure_is_named_on_rank_0 # case",
        )
}

/// Under an external launcher (here the trial plays torchrun: RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT) only rank 0 decides each case, from the records every rank posts.
/// Rank 2 survives and reports two wrong all_reduces: rank 0 must fail exactly those two cases,
/// each with a `reported` failure of rank 2 first (never a pass, never rank 0's), ranks 0 and 1
/// after it as bystanders (they waited in the next all_reduce for rank 2, which had left the
/// case, until their op timeout: `timed_out`, abandoned, as the runner would list them), pass
/// the broadcast between them (after the re-init a failure triggers), and every rank must exit
/// non-zero. (A short op timeout for the ranks: the bystanders wait it out in every failed case.)
fn a_surviving_rank_2_failure_is_named_on_rank_0() -> std::result::Result<(), libtest_mimic::Failed> {
    use std::process::{Command, Stdio};
    use std::time::Instant;
    const WS: usize = 3;
    let ids: Vec<String> = ["all_reduce::out::f32::sum::ws3", "broadcast::out::f32::ws3", "all_reduce::out::f32::sum::ws3::random"]
        .iter()
        .map(|c| format!("{EXTERNAL_BACKEND}::{c}"))
        .collect();
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let dir = std::env::temp_dir().join(format!("concord-faulty-external-{}-{port}", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut ranks = Vec::new();
    for r in 0..WS {
        let mut c = Command::new(&exe);
        for k in LAUNCHER_VARS {
            c.env_remove(k);
        }
        c.env(EXTERNAL_RANK_ENV, "1")
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", WS.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", format!("faulty{port}"))
            .env(concord_harness::config::OP_TIMEOUT_MS, "2500")
            .env(concord_harness::config::GRACE_MS, "500")
            .arg("--report")
            .arg(&dir)
            .args(["--exact", &ids[0], "--", &ids[1], &ids[2]])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("start rank {r}: {e}"))?;
        let read = |p: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                if let Some(mut p) = p {
                    let _ = p.read_to_string(&mut s);
                }
                s
            })
        };
        let out = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
        let err = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
        ranks.push((child, out, err));
    }
    // Every rank ends by itself well within a minute (3 small cases); one still running then is
    // killed (and the trial fails), after every rank was reaped.
    let deadline = t0 + Duration::from_secs(60);
    let mut hung = Vec::new();
    for (r, (child, _, _)) in ranks.iter_mut().enumerate() {
        while child.try_wait().map_err(|e| e.to_string())?.is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                hung.push(r);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let res: Vec<(Option<i32>, String, String)> = ranks
        .into_iter()
        .map(|(mut c, o, e)| (c.wait().ok().and_then(|s| s.code()), o.join().unwrap_or_default(), e.join().unwrap_or_default()))
        .collect();
    let json = std::fs::read_to_string(dir.join("conformance.json"));
    let _ = std::fs::remove_dir_all(&dir);
    let all = |r: usize| format!("rank {r} exited {:?}\nstdout:\n{}\nstderr:\n{}", res[r].0, res[r].1, res[r].2);
    if !hung.is_empty() {
        return Err(format!("rank(s) {hung:?} still running after 60 s\n{}", all(0)).into());
    }
    if let Some(r) = res.iter().position(|(code, _, _)| !matches!(code, Some(c) if *c != 0)) {
        return Err(format!("every rank must exit non-zero after a failed case: {}", all(r)).into());
    }
    let json: serde_json::Value =
        serde_json::from_str(&json.map_err(|e| format!("rank 0 wrote no report: {e}\n{}", all(0)))?).map_err(|e| e.to_string())?;
    let cases = json["cases"].as_array().cloned().unwrap_or_default();
    let got: Vec<String> =
        cases.iter().map(|c| format!("{} {} {} {}", c["id"], c["status"], c["failing_ranks"], c["failure_kinds"])).collect();
    let failed = "\"failed\" [2,0,1] [\"reported\",\"timed_out\",\"timed_out\"]";
    let want: Vec<String> =
        vec![format!("\"{}\" {failed}", ids[0]), format!("\"{}\" \"passed\" [] []", ids[1]), format!("\"{}\" {failed}", ids[2])];
    let mut got_sorted = got.clone();
    got_sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    if got_sorted != want_sorted {
        return Err(format!("rank 0's report: {got:#?}\nwant: {want:#?}\n{}", all(0)).into());
    }
    // The failure message is rank 2's own check (first bad index, got / expected), with the rerun line.
    for id in [&ids[0], &ids[2]] {
        let detail =
            cases.iter().find(|c| c["id"] == id.as_str()).map(|c| c["detail"].as_str().unwrap_or("").to_string()).unwrap_or_default();
        for w in ["rank 2", "first bad index", "got", "expected", "rerun:"] {
            if !detail.contains(w) {
                return Err(format!("{id}: the failure does not mention `{w}`:\n{detail}").into());
            }
        }
        if !detail.starts_with("rank 2: ") {
            return Err(format!("{id}: the failure's first line must name the culprit, rank 2:\n{detail}").into());
        }
    }
    if !res[0].1.contains("1 passed, 2 failed, 0 skipped") {
        return Err(format!("rank 0's closing line:\n{}", all(0)).into());
    }
    eprintln!("rank 2's failures named on rank 0; every rank ended in {:?}", t0.elapsed());
    Ok(())
}

fn case_info(entry: &BackendEntry, id: &str) -> concord_suites::run::CaseInfo {
    let full = format!("{}::{id}", entry.name);
    entry.cases().into_iter().find(|c| c.id == full).unwrap_or_else(|| panic!("no case {full}"))
}

fn main() {
    // One rank of the external-launch trial's world (`a_surviving_rank_2_failure_is_named_on_rank_0`).
    if std::env::var_os(EXTERNAL_RANK_ENV).is_some() {
        concord_suites::main_with(vec![external_entry()]);
    }
    // The control is the same wrapper with no bug (every trait method passes through to shm; only
    // its name, "faulty", differs): the cases that catch a bug pass on it, so the failures are the
    // bugs', not the wrapper's. One backend type for all: the catalogue is compiled once in this
    // binary, not a second time for shm.
    let control = BackendEntry::new::<Faulty>("control_shm", 0, concord_suites::catalogue::<Faulty>);
    let mut entries: Vec<BackendEntry> = expectations().into_iter().map(|(e, _, _)| e).collect();
    entries.push(control.clone());
    entries.push(BackendEntry::new::<concord_fake::FakeBackend>(
        "fake_fail_all",
        0,
        concord_suites::shape_catalogue::<concord_fake::FakeBackend>,
    ));
    concord_suites::run::dispatch_child(&entries);

    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (entry, ids, words) in expectations() {
        let name = format!("faulty::{}_is_caught", entry.name);
        trials.push(libtest_mimic::Trial::test(name, move || {
            for id in ids {
                let case = case_info(&entry, id);
                let (verdict, msg, _) = run_case(&entry, &case);
                let Verdict::Failed(failures) = &verdict else {
                    return Err(format!("{}: the broken backend was not caught by {id}: verdict {verdict:?}", entry.name).into());
                };
                // A wrong backend is caught by a rank's own check (a typed `reported` failure
                // naming its rank), never by a crash or a hang of the harness.
                // (Ranks abandoned after the culprit failed are bystanders and may time out.)
                if failures.is_empty() || failures.iter().filter(|f| !f.is_bystander()).any(|f| f.kind() != "reported") {
                    return Err(format!("{}: {id} failed, but not by a reported check: {failures:?}", entry.name).into());
                }
                for w in words {
                    if !msg.contains(w) {
                        return Err(format!("{}: the failure of {id} does not mention `{w}`:\n{msg}", entry.name).into());
                    }
                }
                if !msg.contains(&format!("rerun: {} {}::{id}", entry.rerun, entry.name)) {
                    return Err(format!("{}: no rerun hint in:\n{msg}", entry.name).into());
                }
            }
            Ok(())
        }));
    }
    // The fake backend's fail_all option: every collective fails with a named error.
    let fake_fail =
        BackendEntry::new::<concord_fake::FakeBackend>("fake_fail_all", 0, concord_suites::shape_catalogue::<concord_fake::FakeBackend>)
            .with_option("fail_all", "1");
    let ff = fake_fail.clone();
    trials.push(libtest_mimic::Trial::test("faulty::fake_fail_all_fails_every_collective", move || {
        for id in ["all_reduce::out::f32::sum::ws2", "broadcast::inplace::i32::ws3", "barrier::out::f32::ws4"] {
            let (verdict, msg, _) = run_case(&ff, &case_info(&ff, id));
            if !verdict.is_failed() || !msg.contains("injected") {
                return Err(format!("fake fail_all: {id} gave {verdict:?}, expected a failure naming the injected error:\n{msg}").into());
            }
        }
        Ok(())
    }));
    // Control: the correct backend passes every case used above.
    let all_ids: Vec<&'static str> = expectations().into_iter().flat_map(|(_, ids, _)| ids.iter().copied()).collect();
    trials.push(libtest_mimic::Trial::test("faulty::control_backend_passes_the_same_cases", move || {
        for id in &all_ids {
            let case = case_info(&control, id);
            let (verdict, msg, _) = run_case(&control, &case);
            if verdict != Verdict::Passed {
                return Err(format!("the correct backend did not pass {id}: {verdict:?}\n{msg}").into());
            }
        }
        Ok(())
    }));
    // The contract map's self-test (here rather than in a test binary of its own, which would
    // compile the shm catalogue a second time).
    trials.push(libtest_mimic::Trial::test("contract::every_clause_has_a_case", || {
        // Every clause of the contract has at least one case of the catalogue for each of its
        // patterns (on the embedded backend, which runs the whole catalogue).
        let ids: Vec<String> = concord_suites::catalogue::<Faulty>().into_iter().map(|c| c.name).collect();
        let holes: Vec<String> = concord_suites::contract::coverage(&ids)
            .into_iter()
            .filter(|(_, _, holes)| !holes.is_empty())
            .map(|(c, _, holes)| format!("{}: no case matches {}", c.id, holes.join(", ")))
            .collect();
        if !holes.is_empty() {
            return Err(format!("clauses without a case:\n{}", holes.join("\n")).into());
        }
        Ok(())
    }));
    trials.push(libtest_mimic::Trial::test("contract::the_contract_text_and_the_map_name_the_same_clauses", || {
        // Every `[clause: id]` tag of `core/src/backend.rs` is a clause of the map, and every
        // clause the map sources from that file is tagged there.
        let tagged = concord_suites::contract::contract_clause_ids();
        let map = concord_suites::contract::CLAUSES;
        let unknown: Vec<&&str> = tagged.iter().filter(|t| !map.iter().any(|c| c.id == **t)).collect();
        if !unknown.is_empty() {
            return Err(format!("tags in core/src/backend.rs with no clause in the map: {unknown:?}").into());
        }
        let untagged: Vec<&str> =
            map.iter().filter(|c| c.source == "core/src/backend.rs" && !tagged.contains(&c.id)).map(|c| c.id).collect();
        if !untagged.is_empty() {
            return Err(format!("clauses sourced from core/src/backend.rs but not tagged there: {untagged:?}").into());
        }
        Ok(())
    }));
    trials.push(libtest_mimic::Trial::test(
        "external::a_surviving_rank_2_failure_is_named_on_rank_0",
        a_surviving_rank_2_failure_is_named_on_rank_0,
    ));
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    concord_harness::runner::Pool::global().shutdown();
    std::process::exit(code);
}
