//! Identical results on every rank, as a grid (clause `values.identical_on_every_rank`): an
//! all_reduce leaves the same bits on every rank, whatever order the backend adds in. Value
//! checks cannot see a backend whose ranks add in different orders: on exact-by-construction
//! inputs every order gives the exact result, and on random inputs each rank's result is within
//! the oracle's bound on its own. Shipped both ways: each rank adding its peers round-robin from
//! itself (pytorch/pytorch PR #129501), each rank adding its own input first in an
//! allgather-then-reduce (open-mpi/ompi#12258).
//!
//! * `identical::all_reduce::ws{3,4,5,6,7,8,16}` — every all_reduce variant (out of place, in
//!   place, coalesced, coalesced in place) × an output in every size class of the sweep (7,
//!   1,031, 4,099 and 65,537 elements): f32 `sum`, and below the largest a second call, f64
//!   `avg`, f16 `sum` and bf16 `premul_sum(0.5)` in turn. Inputs are random signs, mantissas and
//!   exponents (2^-20..2^20; f16 2^-10..2^10, so 16 ranks' sums stay finite), so a sum's bits
//!   depend on the order of its additions. Every rank posts a digest of each result to the
//!   world's store (not through the backend under test) and compares them with every peer's;
//!   on a difference every rank posts the first differing call's result and the failure names
//!   its first differing index with both ranks' values
//!   (`util::expect_same_on_every_rank`).
//!
//! * `identical::subgroup::ws5` — the same check on a subgroup `[3, 1, 4]` of a 5-rank world
//!   (review10 finding 2: a sub-communicator's fallback that gathers and folds from each member's
//!   own input, open-mpi/ompi#12258): every all_reduce variant × f32 `sum` of 1,031 and 65,537
//!   elements, f64 `avg` and bf16 `premul_sum(0.5)` of 1,031; digests compared among the members
//!   through the store; the failure names the group, the member's world rank and the first
//!   differing index.
//!
//! The order grid (`cargo xtask mutants --order`) checks that this grid catches an all_reduce
//! reduced in another order on one rank, for every hook × rank position × size class × world
//! size from 3 ranks (two operands add alike in either order).

use super::util::{expect_same_among, expect_same_on_every_rank, fail, here};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};

/// World sizes of the grid (from 3: two operands add alike in either order).
pub const WORLD_SIZES: [usize; 7] = [3, 4, 5, 6, 7, 8, 16];

/// Element counts: one in each of the sweep's size classes (tiny, small, medium, large).
pub const LENGTHS: [usize; 4] = [7, 1031, 4099, 65537];

/// The second call at each length but the largest (the first is f32 `sum`).
pub const SECOND: [(DType, ReduceOp); 3] =
    [(DType::F64, ReduceOp::Avg), (DType::F16, ReduceOp::Sum), (DType::BF16, ReduceOp::PremulSum(0.5))];

/// The all_reduce variants.
pub const VARIANTS: [Variant; 4] = [Variant::Out, Variant::InPlace, Variant::Coalesced, Variant::CoalescedInPlace];

/// The subgroup of the subgroup case (world ranks, unsorted: the group's ranks are not the
/// world's) and the world it lives in.
pub const SUBGROUP: [usize; 3] = [3, 1, 4];
const SUBGROUP_WS: usize = 5;

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let sub = Case::<B>::new(
        format!("identical::subgroup::ws{SUBGROUP_WS}"),
        CaseMeta {
            suite: "identical".into(),
            op: "all_reduce".into(),
            variant: "out/inplace/coalesced/coalesced_inplace".into(),
            dtype: "f32/f64/bf16".into(),
            reduce: "sum/avg/premul_sum".into(),
        },
        SUBGROUP_WS,
        subgroup_grid,
    );
    WORLD_SIZES
        .iter()
        .map(|&ws| {
            let meta = CaseMeta {
                suite: "identical".into(),
                op: "all_reduce".into(),
                variant: "out/inplace/coalesced/coalesced_inplace".into(),
                dtype: "f32/f64/f16/bf16".into(),
                reduce: "sum/avg/premul_sum".into(),
            };
            Case::<B>::new(format!("identical::all_reduce::ws{ws}"), meta, ws, grid)
        })
        .chain(std::iter::once(sub))
        .collect()
}

/// Rank `r`'s input of call `call`: random signs, mantissas and exponents (±20 binary orders; f16
/// ±10), so a sum's bits depend on the order of its additions.
pub fn input(dtype: DType, call: usize, r: usize, n: usize) -> Tensor {
    let span: u64 = if dtype == DType::F16 { 10 } else { 20 };
    // 2^exp for every exponent drawn, made once (`powi` per element was a cost of its own).
    let scale: Vec<f64> = (0..=2 * span as i32).map(|e| 2f64.powi(e - span as i32)).collect();
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let h = concord_fixtures::mix64(
                (((r as u64) << 40) ^ ((call as u64) << 28) ^ i as u64 ^ 0x1DE7_1CA1).wrapping_add(concord_fixtures::GOLDEN),
            );
            let mant = 1.0 + (h >> 12) as f64 / (1u64 << 52) as f64;
            let sign = if h & 1 == 0 { 1.0 } else { -1.0 };
            sign * mant * scale[((h >> 4) % (2 * span + 1)) as usize]
        })
        .collect();
    Tensor::from_f64(dtype, &[n], &vals)
}

/// [`expect_same_on_every_rank`] among the ranks of the communicator `b` (the world's: that
/// function itself; a subgroup's: its members, through the world's store).
fn same_on_every_rank_of<B: Backend>(ctx: &Ctx<'_, B>, b: &B, mine: &Tensor, tag: &str, where_: &str) -> CaseResult {
    if b.world_size() == ctx.b.world_size() {
        return expect_same_on_every_rank(ctx, mine, tag, where_);
    }
    expect_same_among(ctx, b, mine, &format!("same_among_members/{tag}"), ("group rank", "every member of the group"), where_)
}

/// FNV-1a over a result's bytes.
fn digest(t: &Tensor) -> u64 {
    t.bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// One call of the grid: what it is, for messages and tags.
struct Call {
    variant: Variant,
    dtype: DType,
    op: ReduceOp,
    n: usize,
}

impl Call {
    fn tag(&self, i: usize) -> String {
        format!("{i}/{}/{}/{}/n{}", self.variant.name(), self.dtype, self.op, self.n)
    }
    /// Where a failure of this call is: backend, op, variant, dtype, world size, rank, the call.
    fn at<B: Backend>(&self, b: &B, scope: &Scope) -> String {
        format!(
            "{}{} reduce={} shape=[{}] input=random (every {}'s result must be the same bits)",
            here(b, "all_reduce", self.variant.name(), self.dtype),
            scope.label,
            self.op,
            self.n,
            scope.who
        )
    }
}

/// Where a grid runs: the world, or a subgroup (its label names the group and the world rank).
struct Scope {
    /// Appended to `here(..)` (empty on the world).
    label: String,
    /// "rank" or "member".
    who: &'static str,
    /// The store keys' prefix part.
    key: &'static str,
}

fn grid<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let mut calls = Vec::new();
    for variant in VARIANTS {
        for (k, &n) in LENGTHS.iter().enumerate() {
            calls.push(Call { variant, dtype: DType::F32, op: ReduceOp::Sum, n });
            if n < LENGTHS[3] {
                let (dtype, op) = SECOND[k];
                calls.push(Call { variant, dtype, op, n });
            }
        }
    }
    let scope = Scope { label: String::new(), who: "rank", key: "identical" };
    run_grid(ctx, ctx.b, &calls, &scope)
}

/// The grid on the subgroup [`SUBGROUP`]: f32 `sum` at 1,031 and 65,537 elements, f64 `avg` and
/// bf16 `premul_sum(0.5)` at 1,031, through every variant.
fn subgroup_grid<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    if !b.capabilities().subgroups {
        return Err(CaseEnd::Unsupported("declared gap: subgroups = false (the case runs on a subgroup)".into()));
    }
    let Some(g) = super::util::member_group(b, &SUBGROUP)? else { return Ok(()) };
    let mut calls = Vec::new();
    for variant in VARIANTS {
        calls.push(Call { variant, dtype: DType::F32, op: ReduceOp::Sum, n: LENGTHS[1] });
        calls.push(Call { variant, dtype: DType::F32, op: ReduceOp::Sum, n: LENGTHS[3] });
        calls.push(Call { variant, dtype: DType::F64, op: ReduceOp::Avg, n: LENGTHS[1] });
        calls.push(Call { variant, dtype: DType::BF16, op: ReduceOp::PremulSum(0.5), n: LENGTHS[1] });
    }
    let scope = Scope { label: format!(" group={SUBGROUP:?}"), who: "member", key: "identical_subgroup" };
    run_grid(ctx, &g, &calls, &scope)
}

/// Runs `calls` on the communicator `b` (the world's or a subgroup's) and compares every
/// result's digest with every other rank of `b`, through the world's store.
fn run_grid<B: Backend>(ctx: &Ctx<'_, B>, b: &B, calls: &[Call], scope: &Scope) -> CaseResult {
    let (ws, me) = (b.world_size(), b.rank());
    let caps = b.capabilities();
    let mut unsupported = Vec::new();
    let mut results: Vec<(usize, Tensor)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if let Err(why) = caps.check(OpKind::AllReduce, Some(c.variant), Some(c.dtype), Some(c.op), ws) {
            unsupported.push(why);
            continue;
        }
        let w = c.at(b, scope);
        let x = b.upload(&input(c.dtype, i, me, c.n)).map_err(|e| fail(&w, format!("upload: {e}")))?;
        let out = match c.variant {
            Variant::Out => b.all_reduce(&x, c.op).and_then(|wk| wk.into_value(ctx.timeout)),
            Variant::InPlace => b.all_reduce_(&x, c.op).and_then(|wk| wk.into_value(ctx.timeout)),
            // Coalesced: the call's tensor after a short one, so it is not the first of its group.
            coalesced => {
                let lead = b.upload(&input(c.dtype, i + 1000, me, 3)).map_err(|e| fail(&w, format!("upload: {e}")))?;
                let xs = [lead, x];
                let work =
                    if coalesced == Variant::Coalesced { b.all_reduce_coalesced(&xs, c.op) } else { b.all_reduce_coalesced_(&xs, c.op) };
                work.and_then(|wk| wk.into_value(ctx.timeout)).and_then(|mut outs| {
                    outs.pop().ok_or_else(|| concord_core::CollectiveError::Backend("returned no result for two inputs".into()))
                })
            }
        }
        .map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
        if !caps.moves_data {
            // Values are not part of a data-less backend's contract (the fake's): the case
            // cannot pass.
            crate::case::note_values_unchecked();
            continue;
        }
        results.push((i, b.download(&out).map_err(|e| fail(&w, format!("download: {e}")))?));
    }
    if results.is_empty() && !unsupported.is_empty() {
        unsupported.sort();
        unsupported.dedup();
        return Err(CaseEnd::Unsupported(unsupported.join("; ")));
    }
    // Every rank's digests through the store; every rank sees the same lists, so all agree on
    // the first call that differs and compare its bytes for the message.
    let key = |r: usize| format!("{}/{}/{}/digests/r{r}", ctx.case, ctx.world.world_id, scope.key);
    let mine: Vec<u8> = results.iter().flat_map(|(_, t)| digest(t).to_le_bytes()).collect();
    let w0 = format!("{}{}", here(b, "all_reduce", "all", DType::F32), scope.label);
    ctx.store.set(&key(me), &mine).map_err(|e| fail(&w0, format!("store set: {e}")))?;
    let mut first_bad: Option<usize> = None;
    for peer in 0..ws {
        let theirs = if peer == me {
            mine.clone()
        } else {
            ctx.store.wait(&[&key(peer)], ctx.timeout).map_err(|e| fail(&w0, format!("rank {peer} never posted its digests: {e}")))?;
            ctx.store.get(&key(peer)).map_err(|e| fail(&w0, format!("store get: {e}")))?
        };
        if theirs.len() != mine.len() {
            return Err(fail(&w0, format!("rank {peer} posted {} digests, this rank {}", theirs.len() / 8, mine.len() / 8)));
        }
        if let Some(j) = (0..results.len()).find(|&j| theirs[j * 8..j * 8 + 8] != mine[j * 8..j * 8 + 8]) {
            first_bad = Some(first_bad.map_or(j, |f| f.min(j)));
        }
    }
    // The first call where some rank differs from this one is, on every rank, the first call
    // where the ranks do not all agree (before it all are equal; at it, every rank has a peer
    // that differs from it): every rank compares the same call's bytes below.
    let Some(j) = first_bad else { return Ok(()) };
    let (i, t) = &results[j];
    let (c, w) = (&calls[*i], calls[*i].at(b, scope));
    same_on_every_rank_of(ctx, b, t, &format!("{}/{}", scope.key, c.tag(*i)), &w)?;
    // Unreachable: a peer's digest of this call differs from this rank's, so its bytes do.
    Err(fail(&w, "results differ between ranks (their digests differ)".to_string()))
}
