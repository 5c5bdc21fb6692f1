//! Small helpers the hand-written suites share.

use crate::case::{CaseEnd, Ctx};
use concord_core::{Backend, DType, Element, Tensor};
use concord_oracle::{compare, Tolerance};

/// `b.new_group(ranks)` (world ranks): `Some` on a member, `None` on a non-member (a case
/// then has nothing to do there); FAIL when a member gets no communicator or a non-member gets
/// one (a backend that hands a member `None` would otherwise pass the case vacuously).
pub fn member_group<B: Backend>(b: &B, ranks: &[usize]) -> Result<Option<B>, CaseEnd> {
    let head = format!(
        "backend={} op=new_group variant=- dtype=- world_size={} rank={}: new_group({ranks:?})",
        crate::case::backend_label(b),
        b.world_size(),
        b.rank()
    );
    let g = b.new_group(ranks).map_err(|e| CaseEnd::Fail(format!("{head} failed: {e} [{}]", e.name())))?;
    let member = ranks.contains(&b.rank());
    if g.is_some() != member {
        let (got, want) = if member { ("None", "a communicator") } else { ("a communicator", "None") };
        return Err(CaseEnd::Fail(format!(
            "{head} gave {got} on world rank {r}, {} of the group: members get {want}",
            if member { "a member" } else { "not a member" },
            r = b.rank()
        )));
    }
    Ok(g)
}

/// The gate of every case whose ranks issue ops on two communicators in different orders:
/// UNSUPPORTED where the backend declares `concurrent_communicators = false` (it orders them, or
/// its library documents same-order submission across communicators, as NCCL does;
/// `core/src/caps.rs`). One rule in one place: every such case calls this first.
pub fn communicators_in_any_order<B: Backend>(b: &B) -> Result<(), CaseEnd> {
    if b.capabilities().concurrent_communicators {
        Ok(())
    } else {
        Err(CaseEnd::Unsupported(
            "backend declares concurrent_communicators = false: ops on different communicators must be issued in \
             the same order on every rank (the backend orders them, or its library requires it, as NCCL does), and \
             this case crosses them"
                .into(),
        ))
    }
}

/// `backend= op= variant= dtype= world_size= rank=` for messages of hand-written cases, on the
/// communicator `b` ([`crate::case::axes`]: on a subgroup, the world rank and size follow).
pub fn here<B: Backend>(b: &B, op: &str, variant: &str, dtype: DType) -> String {
    crate::case::axes(&crate::case::backend_label(b), op, variant, dtype.name(), b.world_size(), b.rank())
}

/// A tensor of `shape` filled with `v`.
pub fn full<T: Element + Copy>(shape: &[usize], v: T) -> Tensor {
    Tensor::from_vec(shape, vec![v; shape.iter().product()])
}

/// Downloads `buf` and compares it bit-exactly with `expected`, failing with `where_`.
/// For a backend that moves no data (`Capabilities::moves_data == false`, the fake backend)
/// only the dtype and shape are compared: values are not part of its contract, and the skipped
/// check is noted ([`crate::case::note_values_unchecked`]: the case cannot pass).
pub fn expect_eq<B: Backend>(b: &B, buf: &B::Buffer, expected: &Tensor, where_: &str) -> Result<(), CaseEnd> {
    if !b.capabilities().moves_data {
        crate::case::note_values_unchecked();
        let (dt, shape) = (b.buffer_dtype(buf), b.buffer_shape(buf));
        if dt != expected.dtype() || shape != expected.shape() {
            return Err(CaseEnd::Fail(format!("{where_}: result is {dt}{shape:?}, expected {}{:?}", expected.dtype(), expected.shape())));
        }
        return Ok(());
    }
    let got = b.download(buf).map_err(|e| CaseEnd::Fail(format!("{where_}: download: {e}")))?;
    compare(&got, expected, Tolerance::Exact).map_err(|m| CaseEnd::Fail(format!("{where_}: {m}")))
}

/// How a rank may refuse a call that is a declared gap: a refusal before the call is described
/// (`unsupported`), or the rule table's support rules (6 / 7). `caps::gaps_refused` demands one of
/// them; the bad-input grid accepts them on its rows that are declared gaps.
pub const GAP_REFUSALS: [&str; 3] = ["unsupported", "bad_input:unsupported_op", "bad_input:unsupported_dtype"];

/// The first of `reduces` for which an f32 all_reduce in every one of `variants` is no declared
/// gap of `b`; `Err` lists each refused one with its reason. Cases that only carry a check on an
/// all_reduce (a fault's vehicle, a usability check) take it, so a declared gap excuses that one
/// call, not the case.
pub fn supported_all_reduce<B: Backend>(
    b: &B,
    variants: &[concord_core::Variant],
    reduces: &[concord_core::ReduceOp],
) -> Result<concord_core::ReduceOp, Vec<String>> {
    let caps = b.capabilities();
    let mut why = Vec::new();
    for &op in reduces {
        match variants.iter().find_map(|v| caps.check_call(concord_core::OpKind::AllReduce, Some(*v), Some(DType::F32), Some(op)).err()) {
            None => return Ok(op),
            Some(e) => why.push(format!("{} ({e})", op.name())),
        }
    }
    Err(why)
}

/// The per-call gate: `Err(Unsupported)`, naming the call and the declaration, when `b` declares
/// `op` (`variant`, `dtype`, `reduce`) a gap; `Ok` otherwise. For a case that needs exactly this
/// call but does not name it as its subject (its meta names another, or several): every rank
/// reads the same declaration before calling, so every rank ends UNSUPPORTED alike and no rank
/// is left waiting in a collective its peers refused. A call the backend does NOT declare a gap
/// is made as before, and its refusal stays a failure. Where any call will do (a usability check,
/// a pending collective to send behind), take a supported one instead ([`ArVehicle`]).
pub fn require_call<B: Backend>(
    b: &B,
    op: concord_core::OpKind,
    variant: concord_core::Variant,
    dtype: DType,
    reduce: Option<concord_core::ReduceOp>,
) -> Result<(), CaseEnd> {
    b.capabilities().check_call(op, Some(variant), Some(dtype), reduce).map_err(|why| {
        CaseEnd::Unsupported(format!(
            "declared gap: the case needs {op} variant={variant} dtype={dtype}{}, which the backend's capabilities declare \
             unsupported ({why})",
            reduce.map_or(String::new(), |r| format!(" reduce={}", r.name()))
        ))
    })
}

/// An f32 all_reduce that only carries a check (the world is usable, a collective is pending):
/// the first of `sum`, `max`, `min` that is no declared gap of the backend in every variant the
/// case uses. Every rank picks the same (the declaration is the same everywhere); exact on
/// integer-valued inputs whatever the order of reduction.
#[derive(Clone, Copy, Debug)]
pub struct ArVehicle {
    pub op: concord_core::ReduceOp,
    /// The backend's declared semantics, for the oracle's expected values.
    sem: concord_oracle::Semantics,
}

impl ArVehicle {
    /// The vehicle for `variants`; UNSUPPORTED, naming each declaration, when all three are gaps.
    pub fn pick<B: Backend>(b: &B, variants: &[concord_core::Variant]) -> Result<ArVehicle, CaseEnd> {
        use concord_core::ReduceOp;
        let sem = concord_oracle::Semantics::of(&b.capabilities());
        supported_all_reduce(b, variants, &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]).map(|op| ArVehicle { op, sem }).map_err(|why| {
            CaseEnd::Unsupported(format!(
                "declared gap: the case carries a check on an f32 all_reduce ({}), and every one it may use is declared \
                 unsupported: {}",
                variants.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "),
                why.join("; ")
            ))
        })
    }
    /// `op` as the vehicle on `b`, whether or not it is a gap (a case gated on it runs only where
    /// it is not).
    pub fn with_op<B: Backend>(b: &B, op: concord_core::ReduceOp) -> ArVehicle {
        ArVehicle { op, sem: concord_oracle::Semantics::of(&b.capabilities()) }
    }
    /// The vehicle's result over the ranks' values `vals`, rank order (the oracle's reduction).
    pub fn fold(&self, vals: impl IntoIterator<Item = f32>) -> f32 {
        let vals: Vec<f32> = vals.into_iter().collect();
        self.expected(vals.len(), |r| vec![vals[r]]).get_f64(0) as f32
    }
    /// The vehicle's result (the oracle's reduction) over every rank's `of(rank)` (`ws` ranks).
    pub fn expected(&self, ws: usize, of: impl Fn(usize) -> Vec<f32>) -> Tensor {
        let all: Vec<Tensor> = (0..ws).map(&of).map(|v| Tensor::from_vec(&[v.len()], v)).collect();
        concord_oracle::reduce_tensors(self.op, &all.iter().collect::<Vec<_>>(), &self.sem)
    }
}

/// How many file descriptors this process holds open (`/proc/self/fd`), or `None` where that
/// cannot be read (not Linux): a case that counts them skips its check then.
pub fn open_fds() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count())
}

/// How long [`settled`] waits after what is left last fell before it counts what is still
/// left as kept.
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(1500);

/// The one rule for resources a backend releases after a drop returns (clause
/// `failure.usable_after`: the release MAY run after the drop returns, on a thread of the
/// backend's own, as long as it keeps going; the NCCL backend finalizes and destroys a
/// communicator on its progress thread, about half a second each on H200): `read()` again every
/// 50 ms while `left` gives `Some(count)` (something is still held), for as long as the count
/// keeps falling, for [`SETTLE`] after it last fell, at most `bound`; the last reading is
/// returned, for the caller to judge. A first reading with nothing left returns at once (shm
/// pays nothing). review23 built it for `state::groups_each_without_a_rank`'s descriptor count
/// (a fixed 3 s failed a correct teardown of 600 ms per group); review24 found the `/dev/shm`
/// reads of `faults::` read once.
pub fn settled<T>(bound: std::time::Duration, mut read: impl FnMut() -> T, left: impl Fn(&T) -> Option<usize>) -> T {
    let t0 = std::time::Instant::now();
    let (mut quiet_until, mut low) = (t0 + SETTLE, usize::MAX);
    loop {
        let now = read();
        let Some(n) = left(&now) else { return now };
        let t = std::time::Instant::now();
        if n < low {
            (low, quiet_until) = (n, t + SETTLE);
        }
        if t >= quiet_until || t >= t0 + bound {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub fn fail(where_: &str, what: impl std::fmt::Display) -> CaseEnd {
    CaseEnd::Fail(format!("{where_}: {what}"))
}

/// A step of a case that failed with a backend error, as a [`fail`] naming the step and the
/// error's kind: `x.map_err(step_failed(&w, "upload"))?`.
pub fn step_failed<'a>(where_: &'a str, step: &'a str) -> impl FnOnce(concord_core::CollectiveError) -> CaseEnd + 'a {
    move |e| fail(where_, format!("{step}: {e} [{}]", e.name()))
}

/// The store handshake of a rank that waits for its peers' signal: waits up to `timeout` for
/// every key of `keys` (each set by a peer), reads their values, then deletes them, so that a
/// persistent world's store keeps no key of the case for a later run of it. `never` says in the
/// failure what did not come ("rank 0 never issued"), before the store's error.
pub fn take_keys<C: Backend>(
    ctx: &Ctx<'_, C>,
    keys: &[&str],
    timeout: std::time::Duration,
    where_: &str,
    never: &str,
) -> Result<Vec<Vec<u8>>, CaseEnd> {
    ctx.store.wait(keys, timeout).map_err(|e| fail(where_, format!("{never}: {e}")))?;
    let values = keys.iter().map(|k| ctx.store.get(k).map_err(|e| fail(where_, format!("store get: {e}")))).collect();
    for k in keys {
        let _ = ctx.store.delete_key(k);
    }
    values
}

/// A deliberate delay that orders ranks (a late rank holding off so that its peers are ahead):
/// sleeps `d`, and again while the sleep overshot it by more than a quarter, at most
/// [`HOLD_OFF_ROUNDS`] times. A machine that holds this thread back holds the peers back too,
/// and they need the delay to get ahead: on a loaded machine the delay grows with the load, on a
/// quiet one it is `d`.
pub fn hold_off(d: std::time::Duration) {
    for _ in 0..HOLD_OFF_ROUNDS {
        let t = std::time::Instant::now();
        std::thread::sleep(d);
        if t.elapsed() <= d + d / 4 {
            return;
        }
    }
}

/// At most how many times [`hold_off`] sleeps its delay.
pub const HOLD_OFF_ROUNDS: usize = 10;

/// [`take_keys`] of one key within the case's wait deadline: its value.
pub fn take_key<C: Backend>(ctx: &Ctx<'_, C>, key: &str, where_: &str, never: &str) -> Result<Vec<u8>, CaseEnd> {
    take_keys(ctx, &[key], ctx.timeout, where_, never).map(|mut v| v.remove(0))
}

/// Compares this rank's result `got` with the oracle's answer for `coll` over every rank's
/// `inputs` (index = rank), bit-exactly; nothing to compare where the oracle leaves it undefined.
pub fn expect_oracle<B: Backend>(
    b: &B,
    coll: &concord_oracle::Collective,
    inputs: &[Tensor],
    got: &B::Buffer,
    where_: &str,
) -> Result<(), CaseEnd> {
    let sem = concord_oracle::Semantics::of(&b.capabilities());
    let exp = concord_oracle::expected(coll, inputs, &sem)
        .map_err(|e| fail(where_, format!("suite bug: the oracle rejected the case's own input: {e}")))?;
    let r = b.rank();
    if !exp.defined[r] {
        return Ok(());
    }
    expect_eq(b, got, &exp.outputs[r], where_)
}

/// Every rank's `mine` (this rank's result of one call, `tag` naming it within the case) must be
/// the same bits as every other rank's: each rank posts its bytes to the world's store and
/// compares them with every peer's, element by element (clause
/// `values.identical_on_every_rank`). The store, not the backend under test, carries them, so
/// a backend that moves them wrongly cannot hide the difference. Fails with the first differing
/// index, both values and how many elements differ.
pub fn expect_same_on_every_rank<B: Backend>(ctx: &Ctx<'_, B>, mine: &Tensor, tag: &str, where_: &str) -> Result<(), CaseEnd> {
    expect_same_among(ctx, ctx.b, mine, &format!("same_on_every_rank/{tag}"), ("rank", "every rank"), where_)
}

/// [`expect_same_on_every_rank`] among the ranks of the communicator `b` (the world, or a
/// subgroup this rank is a member of: its ranks are `b`'s), through the world's store. `who`:
/// how a rank of `b` and all of them are named (`("group rank", "every member of the group")`).
pub fn expect_same_among<B: Backend>(
    ctx: &Ctx<'_, B>,
    b: &B,
    mine: &Tensor,
    key: &str,
    who: (&str, &str),
    where_: &str,
) -> Result<(), CaseEnd> {
    let (ws, me) = (b.world_size(), b.rank());
    let (one, all) = who;
    let key = |r: usize| format!("{}/{}/{key}/r{r}", ctx.case, ctx.world.world_id);
    ctx.store.set(&key(me), mine.bytes()).map_err(|e| fail(where_, format!("store set: {e}")))?;
    let (es, n) = (mine.dtype().size(), mine.numel());
    for peer in (0..ws).filter(|&p| p != me) {
        let k = key(peer);
        ctx.store.wait(&[&k], ctx.timeout).map_err(|e| fail(where_, format!("{one} {peer} never posted its result: {e}")))?;
        let theirs = ctx.store.get(&k).map_err(|e| fail(where_, format!("store get: {e}")))?;
        if theirs.len() != mine.bytes().len() {
            return Err(fail(where_, format!("{one} {peer}'s result has {} bytes, this {one}'s {}", theirs.len(), mine.bytes().len())));
        }
        let theirs = Tensor::from_bytes(mine.dtype(), mine.shape(), &theirs);
        let differs = |i: usize| mine.bytes()[i * es..(i + 1) * es] != theirs.bytes()[i * es..(i + 1) * es];
        if let Some(i) = (0..n).find(|&i| differs(i)) {
            let count = (0..n).filter(|&i| differs(i)).count();
            return Err(fail(
                where_,
                format!(
                    "first bad index {i}: got {} on {one} {me}, {one} {peer} got {} ({count} of {n} elements differ): an all_reduce \
                     leaves identical copies of one result on {all}",
                    mine.fmt_element(i),
                    theirs.fmt_element(i)
                ),
            ));
        }
    }
    Ok(())
}
