//! Random programs: seeded sequences of calls that no hand-written case lines up — any op,
//! variant, dtype and reduce op the backend declares, random shapes (empty, odd, multi-dim,
//! across chunk sizes), random roots and permutations, inputs and outputs as views, arbitrary bit
//! patterns through the data-moving ops, one to three calls in flight at once (on the world and on
//! subgroups whose members are listed in a random order) waited in a random order. Every call is
//! checked like the matrix's ([`values::Prepared::check`]: values against the oracle, identity,
//! inputs untouched, guard bytes).
//!
//! * `programs::p{k}::ws{n}` — program `k` at world size `n`. A program is a pure function of
//!   its case name (the same on every rank: [`generate`]); calls the backend declares unsupported
//!   are drawn again, so every backend runs a program of the same length. Every failure names the
//!   program, the batch and the call (with what else was in flight and the wait order) besides
//!   the matrix's fields, and the case id reruns it.

use crate::case::{Case, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Pending, PAIRS};
use crate::values::{self, Extra, Layout, Prepared, ValueSpec};
use concord_core::{Backend, Capabilities, DType, OpKind, ReduceOp, Variant};
use concord_fixtures::InputKind;
use std::fmt::Write as _;

/// World sizes of the programs and how many at each: most at 2 ranks, what a 2-GPU machine
/// runs (and the cheapest on a CPU); 3 and 5 and 7, not powers of two.
pub const PROGRAMS: [(usize, usize); 6] = [(1, 2), (2, 8), (3, 4), (4, 4), (5, 3), (7, 3)];
/// Batches (one to three calls in flight) per program.
pub const BATCHES: usize = 24;

/// Base shapes (adjusted per op: divisible first dims for reduce_scatter / scatter, a first dim
/// for all_to_all's splits): empty and zero-sized, odd, multi-dimensional, and past 16 K / 64 K
/// elements (a backend's chunk or staging boundaries).
const SHAPES: &[&[usize]] = &[
    &[],
    &[0],
    &[1],
    &[2],
    &[3],
    &[7],
    &[8],
    &[13],
    &[64],
    &[100],
    &[257],
    &[1000],
    &[4096],
    &[4097],
    &[3, 5],
    &[2, 3, 4],
    &[5, 0],
    &[16_385],
    &[65_537],
    &[300_001],
];

/// Elements above which a tensor is drawn only on communicators of at most [`LARGE_MAX_RANKS`]
/// ranks (each rank generates every input its answer reads).
const LARGE: usize = 100_000;
const LARGE_MAX_RANKS: usize = 3;

/// SplitMix64: the program's generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(concord_fixtures::GOLDEN);
        concord_fixtures::mix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }
}

/// One call of a program.
#[derive(Clone, Debug)]
pub struct Call {
    /// The communicator: 0 the world, `g` the program's group `g - 1`.
    pub comm: usize,
    pub spec: ValueSpec,
    /// One shape per tensor (several for the coalesced variants).
    pub shapes: Vec<Vec<usize>>,
    pub layout: Layout,
    /// Root, permutation, bit-pattern inputs.
    pub extra: Extra,
    pub seed: u64,
}

/// Calls issued together, then waited in `wait_order`.
#[derive(Clone, Debug)]
pub struct Batch {
    pub calls: Vec<Call>,
    pub wait_order: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct Program {
    /// Subgroups (world ranks, in the order given to `new_group`: the group's rank order).
    pub groups: Vec<Vec<usize>>,
    pub batches: Vec<Batch>,
}

impl Program {
    fn comm_size(&self, ws: usize, comm: usize) -> usize {
        if comm == 0 {
            ws
        } else {
            self.groups[comm - 1].len()
        }
    }

    fn comm_name(&self, comm: usize) -> String {
        if comm == 0 {
            "the world".into()
        } else {
            format!("group {:?}", self.groups[comm - 1])
        }
    }
}

/// Draws one call on a communicator of `n` ranks among what `caps` declares (`None` after many
/// refusals: the backend declares almost nothing).
fn draw_call(rng: &mut Rng, comm: usize, n: usize, caps: &Capabilities) -> Option<Call> {
    for _ in 0..64 {
        let (op, variant) = rng.pick(PAIRS);
        if (op == OpKind::Barrier && !rng.chance(20)) || (op == OpKind::SendRecv && n < 2) {
            continue;
        }
        let dtype = rng.pick(&DType::ALL);
        let reduce = if op.reduces() {
            let defined: Vec<ReduceOp> = ReduceOp::ALL.into_iter().filter(|r| r.defined_for(dtype)).collect();
            Some(match rng.pick(&defined) {
                ReduceOp::PremulSum(_) => ReduceOp::PremulSum(rng.pick(&[2.0, 0.5, 4.0])),
                r => r,
            })
        } else {
            None
        };
        if caps.check(op, Some(variant), Some(dtype), reduce, n).is_err() {
            continue;
        }
        let moves_only = !op.reduces() && op != OpKind::Barrier;
        let bits = moves_only && rng.chance(25);
        // NaN, ±inf and ±0 where the answer is still exact: data movement and sum / product /
        // min / max.
        let special_ok = dtype.is_float()
            && !bits
            && reduce.is_none_or(|r| matches!(r, ReduceOp::Sum | ReduceOp::Product | ReduceOp::Min | ReduceOp::Max));
        let kind = match rng.below(100) {
            0..=19 if dtype.is_float() && !bits => InputKind::Random,
            20..=34 if special_ok => InputKind::Special,
            _ => InputKind::Exact,
        };
        let coalesced = matches!(variant, Variant::Coalesced | Variant::CoalescedInPlace);
        let adjust = |s: &[usize]| -> Vec<usize> {
            match op {
                OpKind::ReduceScatterTensor | OpKind::Scatter => concord_fixtures::divisible_by(s, n),
                OpKind::AllToAllSingle if s.is_empty() => vec![3],
                _ => s.to_vec(),
            }
        };
        let shape = |rng: &mut Rng| loop {
            let s = adjust(rng.pick(SHAPES));
            if n <= LARGE_MAX_RANKS || s.iter().product::<usize>() <= LARGE {
                break s;
            }
        };
        let shapes: Vec<Vec<usize>> = if op == OpKind::Barrier {
            vec![]
        } else if coalesced {
            (0..1 + rng.below(4)).map(|_| shape(rng)).collect()
        } else {
            vec![shape(rng)]
        };
        let layout = if !coalesced && op != OpKind::Barrier && rng.chance(15) {
            Layout { in_offset: 1 + rng.below(5), out_offset: if variant == Variant::OutBuf { 1 + rng.below(9) } else { 0 } }
        } else {
            Layout::default()
        };
        // send / recv: a random matching (the odd one out sits out).
        let order = rng.permutation(n);
        let mut pairs = vec![None; n];
        for two in order.chunks_exact(2) {
            pairs[two[0]] = Some(two[1]);
            pairs[two[1]] = Some(two[0]);
        }
        let extra = Extra { root: Some(rng.below(n)), src_dst: Some(rng.permutation(n)), bits, pairs: Some(pairs), ..Extra::default() };
        let spec = ValueSpec { op, variant, dtype, reduce, kind, max_shapes: None };
        return Some(Call { comm, spec, shapes, layout, extra, seed: rng.next() });
    }
    None
}

/// Program `k` at world size `ws` for a backend declaring `caps`: a pure function of its
/// arguments, so every rank draws the same program.
pub fn generate(k: usize, ws: usize, caps: &Capabilities) -> Program {
    let mut rng = Rng(concord_fixtures::seed_for(&format!("programs::p{k}::ws{ws}")));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for _ in 0..1 + rng.below(2) {
        let mut members = rng.permutation(ws);
        members.truncate(1 + rng.below(ws));
        if !groups.contains(&members) {
            groups.push(members);
        }
    }
    let mut p = Program { groups, batches: Vec::new() };
    for _ in 0..BATCHES {
        let in_flight = match rng.below(20) {
            0..=11 => 1,
            12..=16 => 2,
            _ => 3,
        };
        let mut calls: Vec<Call> = Vec::new();
        // Some batches repeat their first call (new inputs, root and peers): same-shaped calls in
        // flight together, which a backend keying its staging by shape or address mixes up.
        let repeat = in_flight > 1 && rng.chance(35);
        for _ in 0..in_flight {
            let comm = if rng.chance(65) { 0 } else { 1 + rng.below(p.groups.len()) };
            // A backend that declares no subgroups gets every call on the world (the same draws
            // otherwise: the programs of a backend with subgroups are unchanged).
            let comm = if caps.subgroups { comm } else { 0 };
            let n = p.comm_size(ws, comm);
            let drawn = match calls.first() {
                Some(first) if repeat => {
                    let n = p.comm_size(ws, first.comm);
                    draw_call(&mut rng, first.comm, n, caps).map(|c| Call {
                        spec: first.spec.clone(),
                        shapes: first.shapes.clone(),
                        layout: first.layout,
                        extra: Extra { bits: first.extra.bits, ..c.extra },
                        ..c
                    })
                }
                _ => draw_call(&mut rng, comm, n, caps),
            };
            calls.extend(drawn);
        }
        let wait_order = rng.permutation(calls.len());
        p.batches.push(Batch { calls, wait_order });
    }
    if !caps.subgroups {
        p.groups.clear();
    }
    p
}

/// What a call's failure message adds to the matrix's fields: the program, the batch, what was
/// in flight with it and the order of the waits.
fn label(k: usize, prog: &Program, bi: usize, ci: usize, c: &Call) -> String {
    let batch = &prog.batches[bi];
    let mut s = format!("program p{k} batch {bi} call {ci} on {}", prog.comm_name(c.comm));
    if batch.calls.len() > 1 {
        let others: Vec<String> = batch
            .calls
            .iter()
            .map(|o| format!("{}/{}/{} on {}", o.spec.op, o.spec.variant, o.spec.dtype, prog.comm_name(o.comm)))
            .collect();
        let _ = write!(s, " (in flight together: [{}], waited in order {:?})", others.join(", "), batch.wait_order);
    }
    if matches!(c.spec.op, OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter) {
        let _ = write!(s, " root={}", c.extra.root.unwrap_or(0));
    }
    if c.spec.op == OpKind::PermuteTensor {
        let _ = write!(s, " src_dst={:?}", c.extra.src_dst.as_deref().unwrap_or(&[]));
    }
    if c.spec.op == OpKind::SendRecv {
        let _ = write!(s, " partners={:?}", c.extra.pairs.as_deref().unwrap_or(&[]));
    }
    if c.layout != Layout::default() {
        let _ = write!(s, " views: input at {}, output at {}", c.layout.in_offset, c.layout.out_offset);
    }
    if c.extra.bits {
        s.push_str(" input=bits");
    }
    s
}

/// Runs program `k` on this rank: creates its groups (every rank, in order), then each batch:
/// prepares and issues the calls of the communicators this rank belongs to, waits for them in
/// the batch's order, then checks every result.
fn run<B: Backend>(ctx: &mut Ctx<'_, B>, k: usize) -> CaseResult {
    let ws = ctx.world_size();
    let prog = generate(k, ws, &ctx.b.capabilities());
    for g in &prog.groups {
        ctx.group(g)?;
    }
    let timeout = ctx.timeout;
    let comm_of = |c: usize| -> Option<&B> {
        if c == 0 {
            Some(ctx.b)
        } else {
            ctx.groups.get(&prog.groups[c - 1]).and_then(|g| g.as_ref())
        }
    };
    for (bi, batch) in prog.batches.iter().enumerate() {
        // The calls of the communicators this rank belongs to, prepared and issued in order.
        let mut calls: Vec<Option<(&B, Prepared<B>)>> = Vec::new();
        // Per call: `Some(None)` a send / recv on a rank without partner (its output comes back
        // as it was), `Some(Some(pending))` issued, `None` not this rank's.
        let mut issued: Vec<Option<Option<Pending<B>>>> = Vec::new();
        for (ci, c) in batch.calls.iter().enumerate() {
            let Some(be) = comm_of(c.comm) else {
                calls.push(None);
                issued.push(None);
                continue;
            };
            let call = values::prepare(be, &c.spec, c.seed, &c.shapes, &label(k, &prog, bi, ci, c), c.layout, &c.extra)?;
            let how = if c.spec.op == OpKind::SendRecv && call.params.peer.is_none() {
                None
            } else {
                let p = exec::issue(be, c.spec.op, c.spec.variant, &call.ins, call.out(), &call.params)
                    .map_err(|e| call.fail(be, format_args!("issue: {e} [{}]", e.name())))?;
                Some(p)
            };
            calls.push(Some((be, call)));
            issued.push(Some(how));
        }
        let mut outs: Vec<Option<Vec<B::Buffer>>> = (0..calls.len()).map(|_| None).collect();
        for &i in &batch.wait_order {
            let (Some((be, call)), Some(how)) = (&calls[i], issued[i].take()) else { continue };
            outs[i] = Some(match how {
                None => call.out().into_iter().cloned().collect(),
                Some(p) => p.into_values(timeout).map_err(|e| call.fail(*be, format_args!("wait: {e} [{}]", e.name())))?,
            });
        }
        for (slot, got) in calls.iter().zip(&outs) {
            if let (Some((be, call)), Some(got)) = (slot, got) {
                call.check(*be, got)?;
            }
        }
    }
    Ok(())
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for (ws, count) in PROGRAMS {
        for k in 0..count {
            let meta = CaseMeta {
                suite: "programs".into(),
                op: "mixed".into(),
                variant: "mixed".into(),
                dtype: "mixed".into(),
                reduce: "mixed".into(),
            };
            v.push(Case::new(format!("programs::p{k}::ws{ws}"), meta, ws, move |ctx| run(ctx, k)));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_programs(caps: &Capabilities) -> Vec<(usize, Program)> {
        PROGRAMS.iter().flat_map(|&(ws, count)| (0..count).map(move |k| (ws, generate(k, ws, caps)))).collect()
    }

    #[test]
    fn a_program_is_a_pure_function_of_its_name() {
        let caps = Capabilities::full(64);
        let a = format!("{:?}", generate(1, 4, &caps));
        assert_eq!(a, format!("{:?}", generate(1, 4, &caps)));
        assert_ne!(a, format!("{:?}", generate(2, 4, &caps)));
    }

    #[test]
    fn the_programs_cover_what_they_claim() {
        let caps = Capabilities::full(64);
        let progs = all_programs(&caps);
        let calls: Vec<(usize, &Program, &Batch, &Call)> =
            progs.iter().flat_map(|(ws, p)| p.batches.iter().flat_map(move |b| b.calls.iter().map(move |c| (*ws, p, b, c)))).collect();
        let n = |ws: usize, p: &Program, c: &Call| p.comm_size(ws, c.comm);
        for (op, variant) in PAIRS {
            assert!(calls.iter().any(|(_, _, _, c)| c.spec.op == *op && c.spec.variant == *variant), "{op} {variant} never drawn");
        }
        for d in DType::ALL {
            assert!(calls.iter().any(|(_, _, _, c)| c.spec.dtype == d), "{d} never drawn");
        }
        for r in ReduceOp::ALL {
            assert!(calls.iter().any(|(_, _, _, c)| c.spec.reduce.map(|x| x.name()) == Some(r.name())), "{} never drawn", r.name());
        }
        for kind in InputKind::ALL {
            assert!(calls.iter().any(|(_, _, _, c)| c.spec.kind == kind), "{kind:?} inputs never drawn");
        }
        let rooted = |c: &Call| matches!(c.spec.op, OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter);
        // A root strictly inside a communicator of 3+ ranks, on the world and on a group.
        for on_group in [false, true] {
            assert!(calls
                .iter()
                .any(|(ws, p, _, c)| rooted(c) && (c.comm > 0) == on_group && c.extra.root.is_some_and(|r| r > 0 && r + 1 < n(*ws, p, c))));
        }
        // Groups in an order other than the world's, 2 and 3 calls in flight, a repeated call
        // in flight, views, bit patterns, large tensors, a rank receiving from another peer
        // than its matrix partner.
        assert!(progs.iter().any(|(_, p)| p.groups.iter().any(|g| g.windows(2).any(|w| w[0] > w[1]))));
        assert!(calls.iter().any(|(_, _, b, _)| b.calls.len() == 3));
        assert!(calls.iter().any(|(_, _, b, _)| b.calls.len() == 2 && b.calls[0].comm != b.calls[1].comm));
        assert!(calls
            .iter()
            .any(|(_, _, b, _)| b.calls.len() > 1 && b.calls[0].shapes == b.calls[1].shapes && b.calls[0].spec.op == b.calls[1].spec.op));
        assert!(calls.iter().any(|(_, _, _, c)| c.layout.in_offset > 0));
        assert!(calls.iter().any(|(_, _, _, c)| c.layout.out_offset > 0));
        assert!(calls.iter().any(|(_, _, _, c)| c.extra.bits));
        assert!(calls.iter().any(|(_, _, _, c)| c.shapes.iter().any(|s| s.iter().product::<usize>() > LARGE)));
        assert!(calls.iter().any(|(ws, p, _, c)| c.spec.op == OpKind::SendRecv
            && c.extra
                .pairs
                .as_ref()
                .is_some_and(|v| (0..n(*ws, p, c)).any(|r| v[r].is_some() && v[r] != crate::values::partner(r, n(*ws, p, c))))));
        // Never a large tensor on a communicator of more than LARGE_MAX_RANKS ranks.
        assert!(!calls
            .iter()
            .any(|(ws, p, _, c)| n(*ws, p, c) > LARGE_MAX_RANKS && c.shapes.iter().any(|s| s.iter().product::<usize>() > LARGE)));
    }

    #[test]
    fn a_backend_declaring_gaps_gets_programs_of_the_same_length_without_them() {
        let mut caps = Capabilities::full(64);
        caps.gaps.push(concord_core::Gap::op(OpKind::AllToAllSingle, "no all_to_all"));
        caps.gaps.push(concord_core::Gap::reduce("product", "no product"));
        for (_, p) in all_programs(&caps) {
            assert_eq!(p.batches.len(), BATCHES);
            for c in p.batches.iter().flat_map(|b| &b.calls) {
                assert_ne!(c.spec.op, OpKind::AllToAllSingle);
                assert_ne!(c.spec.reduce, Some(ReduceOp::Product));
            }
        }
    }
}
