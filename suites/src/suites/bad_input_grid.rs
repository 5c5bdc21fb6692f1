//! The bad-input grid: one case per (op, variant) and world size (1, 2, 3 and 16 ranks) that
//! gives the call every bad-input kind the rule table can give it, the bad argument carried by
//! every rank, by rank 0 alone, by a middle rank alone and by the last rank alone (the rooted ops:
//! with the root first and last), and requires, for each: THE named `bad_input:<kind>` on every
//! rank that calls the op, then a valid call of the SAME (op, variant) computing the right value
//! (a refused call leaves nothing behind in the op's state). The bad-input table
//! (`bad_input.rs`) grew case by case at 2 and 3 ranks; the mutants' bad-input grid
//! (`cargo xtask mutants --bad-input all`) found the cells it left open.

use super::util::{fail, GAP_REFUSALS};
use crate::case::{backend_label, Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use concord_core::{AliasPolicy, Backend, BadInputKind as K, CollectiveError, DType, ReduceOp, Tensor};

/// The (op, variant)s of the grid: the trait's calls, by name (the hooks of
/// `concord_mutants::sweep_bad`).
pub const HOOKS: &[&str] = &[
    "all_reduce",
    "all_reduce_",
    "all_reduce_coalesced",
    "all_reduce_coalesced_",
    "all_gather_into_tensor",
    "all_gather_into_tensor_out",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_out",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
    "broadcast_",
    "permute_tensor",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
];

/// The world sizes of the grid: one rank, two, an odd number, sixteen.
pub const WORLD_SIZES: [usize; 4] = [1, 2, 3, 16];

/// One way to break a call, on the ranks that carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// Another shape of the same element count (`[ws, 2]` against `[2 ws, 1]`: a header that
    /// ships counts, not shapes, passes it).
    Shape,
    /// Another input dtype: the declared dtype of f32's width ([`other_dtype`]: a header that
    /// ships widths, not dtypes, passes it).
    DTypeIn,
    /// An `_out` buffer of another dtype (f64).
    DTypeOut,
    /// An `_out` buffer of another dtype of the input's width ([`other_dtype`]), of the right
    /// element count: a backend that checks the count only casts into it.
    DTypeOutWidth,
    /// Another reduce op (max).
    ReduceOp,
    /// A reduce op not defined for the dtype (band on f32).
    Unsupported,
    /// A coalesced list one longer.
    Count,
    /// A 0-dim input.
    ZeroDim,
    /// Dim 0 one past a multiple of the world size.
    Indivisible,
    /// An `_out` buffer one element larger / smaller.
    OutLarger,
    OutSmaller,
    /// The `_out` buffer overlaps the input.
    Alias,
    /// all_to_all input splits with one entry too many.
    SplitsLength,
    /// all_to_all output splits that disagree with the peers' input splits.
    SplitsDisagree,
    /// A root out of range / another root than the others'.
    RootRange,
    RootDiffers,
    /// A src_dst that is not a permutation / another permutation than the others'.
    PermBad,
    PermDiffers,
    /// Another collective (a barrier; for a barrier, an all_reduce).
    OtherOp,
    /// send / recv: the peer is the caller itself.
    PeerSelf,
    /// send / recv: the receive buffer of another dtype / larger / smaller than the message.
    P2pDType,
    P2pLarger,
    P2pSmaller,
}

impl How {
    fn kind(self) -> K {
        match self {
            How::Shape => K::ShapeMismatch,
            How::DTypeIn | How::DTypeOut | How::DTypeOutWidth | How::P2pDType => K::DTypeMismatch,
            How::ReduceOp => K::ReduceOpMismatch,
            How::Unsupported => K::UnsupportedDType,
            How::Count => K::CountMismatch,
            How::ZeroDim => K::ZeroDim,
            How::Indivisible => K::Indivisible,
            How::OutLarger | How::OutSmaller | How::P2pLarger | How::P2pSmaller => K::OutBufferSize,
            How::Alias => K::Aliasing,
            How::SplitsLength => K::BadSplits,
            How::SplitsDisagree => K::SplitMismatch,
            How::RootRange | How::RootDiffers => K::BadRoot,
            How::PermBad | How::PermDiffers => K::BadPermutation,
            How::OtherOp => K::OpMismatch,
            How::PeerSelf => K::BadPeer,
        }
    }
    /// Whether only a disagreement between ranks makes it bad (never carried by every rank, and
    /// impossible on one rank).
    fn across(self) -> bool {
        matches!(self, How::Shape | How::DTypeIn | How::ReduceOp | How::Count | How::RootDiffers | How::PermDiffers | How::OtherOp)
    }
    fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

fn rooted(hook: &str) -> bool {
    matches!(hook, "broadcast" | "broadcast_" | "reduce" | "gather" | "scatter")
}

/// The ways to break `hook` at `ws` ranks.
fn hows(hook: &str, ws: usize) -> Vec<How> {
    use How::*;
    let mut v = match hook {
        "barrier" => vec![OtherOp],
        "send" | "recv" => vec![PeerSelf, P2pDType, P2pLarger, P2pSmaller],
        _ => vec![Shape, DTypeIn, OtherOp],
    };
    let reduces = hook.starts_with("all_reduce") || hook.starts_with("reduce_scatter") || hook == "reduce";
    if reduces {
        v.extend([ReduceOp, Unsupported]);
    }
    if hook.contains("_coalesced") {
        v.push(Count);
    }
    if hook.starts_with("reduce_scatter") || hook == "scatter" || hook == "all_to_all_single" {
        v.extend([ZeroDim, Indivisible]);
    }
    if hook.ends_with("_out") {
        v.extend([DTypeOut, DTypeOutWidth, OutLarger, OutSmaller, Alias]);
    }
    if hook == "all_to_all_single" {
        v.extend([SplitsLength, SplitsDisagree]);
    }
    if rooted(hook) {
        v.extend([RootRange, RootDiffers]);
    }
    if hook == "permute_tensor" {
        v.extend([PermBad, PermDiffers]);
    }
    let p2p = matches!(hook, "send" | "recv");
    v.retain(|h| ws > 1 || !(h.across() || *h == Indivisible || (p2p && *h != PeerSelf)));
    v
}

/// Who carries the bad argument: every rank, or one rank alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carrier {
    Every,
    One(usize),
}

/// The carriers of `how` at `ws` ranks: every rank (a rank's own rule), rank 0, a middle rank
/// and the last rank alone.
fn carriers(how: How, ws: usize) -> Vec<Carrier> {
    let mut v = Vec::new();
    if !how.across() && ws > 1 && !matches!(how, How::P2pDType | How::P2pLarger | How::P2pSmaller) {
        v.push(Carrier::Every);
    }
    // A send learns a refusal from its receiver (whose verdict names the receiver): one more
    // sender, the last but one, so that the last rank receives.
    let p2p = matches!(how, How::P2pDType | How::P2pLarger | How::P2pSmaller);
    let before_last = if p2p && ws > 2 { ws - 2 } else { 0 };
    for r in [0, ws / 2, ws - 1, before_last] {
        if !v.contains(&Carrier::One(r)) {
            v.push(Carrier::One(r));
        }
    }
    v
}

/// One rank's arguments.
#[derive(Clone, Debug)]
struct Args {
    dtype: DType,
    rows: usize,
    cols: usize,
    zero_dim: bool,
    reduce: ReduceOp,
    root: usize,
    out_delta: isize,
    out_dtype: Option<DType>,
    alias: bool,
    count: usize,
    in_splits: Option<Vec<usize>>,
    out_splits: Option<Vec<usize>>,
    perm: Vec<usize>,
    other_op: bool,
    /// The other dtype of `DTypeIn` / `DTypeOutWidth` ([`other_dtype`]).
    alt: DType,
}

impl Args {
    fn valid(ws: usize, root: usize, alt: DType) -> Args {
        Args {
            dtype: DType::F32,
            rows: 2 * ws,
            cols: 1,
            zero_dim: false,
            reduce: ReduceOp::Sum,
            root,
            out_delta: 0,
            out_dtype: None,
            alias: false,
            count: 2,
            in_splits: None,
            out_splits: None,
            perm: (0..ws).collect(),
            other_op: false,
            alt,
        }
    }
    fn broken(mut self, how: How, ws: usize) -> Args {
        match how {
            How::Shape => (self.rows, self.cols) = (ws, 2),
            How::DTypeIn => self.dtype = self.alt,
            How::DTypeOut => self.out_dtype = Some(DType::F64),
            How::DTypeOutWidth => self.out_dtype = Some(self.alt),
            How::ReduceOp => self.reduce = ReduceOp::Max,
            How::Unsupported => self.reduce = ReduceOp::BAnd,
            How::Count => self.count = 3,
            How::ZeroDim => self.zero_dim = true,
            // Dim 0 indivisible, the element count divisible: a backend that checks the count
            // (`numel % ws`) instead of dim 0 truncates it.
            How::Indivisible => (self.rows, self.cols) = (2 * ws + 1, ws),
            How::OutLarger => self.out_delta = 1,
            How::OutSmaller => self.out_delta = -1,
            How::Alias => self.alias = true,
            How::SplitsLength => self.in_splits = Some([vec![2; ws], vec![0]].concat()),
            How::SplitsDisagree => {
                // Every rank sends 2 rows to each; this rank expects 3 from rank 0 (and 1 from
                // rank 1, so the sum stays dim 0 where there is a rank 1).
                self.in_splits = Some(vec![2; ws]);
                let mut out = vec![2; ws];
                out[0] = 3;
                if ws > 1 {
                    out[1] = 1;
                }
                self.out_splits = Some(out);
            }
            How::RootRange => self.root = ws,
            How::RootDiffers => self.root = (self.root + 1) % ws,
            How::PermBad => self.perm = vec![0; ws + 1],
            How::PermDiffers => self.perm.rotate_left(1),
            How::OtherOp => self.other_op = true,
            How::PeerSelf | How::P2pDType | How::P2pLarger | How::P2pSmaller => {}
        }
        self
    }
    fn shape(&self) -> Vec<usize> {
        if self.zero_dim {
            vec![]
        } else {
            vec![self.rows, self.cols]
        }
    }
}

/// Rank `rank`'s input for `a`: every element `rank + 1 + 10 i` for the `i`-th tensor of a list.
fn input(a: &Args, rank: usize, i: usize) -> Tensor {
    let shape = a.shape();
    let n: usize = shape.iter().product();
    Tensor::from_f64(a.dtype, &shape, &vec![(rank + 1 + 10 * i) as f64; n])
}

/// Issues `hook` with `a` on this rank and waits: the outputs (empty where the op has none here).
///
/// `kept` gets the call's `_out` buffer (filled with a sentinel first) and its in-place inputs,
/// each with its contents before the call: what a refused call MUST leave as it was (clause
/// `bad_input.refused_untouched`).
fn call<B: Backend>(
    ctx: &Ctx<'_, B>,
    hook: &str,
    a: &Args,
    kept: &mut Vec<(B::Buffer, Tensor)>,
) -> Result<Vec<B::Buffer>, CollectiveError> {
    let b = ctx.b;
    let (t, me, ws) = (ctx.timeout, b.rank(), b.world_size());
    if a.other_op {
        if hook == "barrier" {
            return b.all_reduce(&b.upload(&input(a, me, 0))?, ReduceOp::Sum)?.into_value(t).map(|_| vec![]);
        }
        return b.barrier()?.into_value(t).map(|_| vec![]);
    }
    let one = |x: B::Buffer| vec![x];
    let x = || b.upload(&input(a, me, 0));
    let xs = || (0..a.count).map(|i| b.upload(&input(a, me, i))).collect::<Result<Vec<_>, _>>();
    let numel: usize = a.shape().iter().product();
    let mut out_of = |need: usize| -> Result<(B::Buffer, B::Buffer), CollectiveError> {
        let len = (need as isize + a.out_delta).max(0) as usize;
        let dt = a.out_dtype.unwrap_or(a.dtype);
        if a.alias {
            // The input and the output share memory: the output at the front of the input's
            // buffer when it is the smaller, else the input at the front of the output's.
            if len <= numel {
                let x = x()?;
                let out = b.view(&x, 0, &[len])?;
                kept.push((x.clone(), b.download(&x)?));
                return Ok((x, out));
            }
            let out = b.alloc(dt, &[len])?;
            b.write(&out, &Tensor::from_f64(dt, &[len], &vec![(me + 1) as f64; len]))?;
            let x = b.view(&out, 0, &a.shape())?;
            // The valid call's input values: a backend that computes aliased outputs
            // (`AliasPolicy::Correct`) must then give the valid call's result.
            b.write(&x, &input(a, me, 0))?;
            kept.push((out.clone(), b.download(&out)?));
            return Ok((x, out));
        }
        let out = b.alloc(dt, &[len])?;
        let sentinel = Tensor::from_f64(dt, &[len], &vec![-7.0; len]);
        b.write(&out, &sentinel)?;
        kept.push((out.clone(), sentinel));
        Ok((x()?, out))
    };
    match hook {
        "all_reduce" => Ok(one(b.all_reduce(&x()?, a.reduce)?.into_value(t)?)),
        "all_reduce_" => {
            let x = x()?;
            kept.push((x.clone(), input(a, me, 0)));
            Ok(one(b.all_reduce_(&x, a.reduce)?.into_value(t)?))
        }
        "all_reduce_coalesced" => b.all_reduce_coalesced(&xs()?, a.reduce)?.into_value(t),
        "all_reduce_coalesced_" => {
            let xs = xs()?;
            kept.extend(xs.iter().enumerate().map(|(i, x)| (x.clone(), input(a, me, i))));
            b.all_reduce_coalesced_(&xs, a.reduce)?.into_value(t)
        }
        "all_gather_into_tensor" => Ok(one(b.all_gather_into_tensor(&x()?)?.into_value(t)?)),
        "all_gather_into_tensor_out" => {
            let (x, out) = out_of(numel * ws)?;
            Ok(one(b.all_gather_into_tensor_out(&x, &out)?.into_value(t)?))
        }
        "all_gather_into_tensor_coalesced" => b.all_gather_into_tensor_coalesced(&xs()?)?.into_value(t),
        "reduce_scatter_tensor" => Ok(one(b.reduce_scatter_tensor(&x()?, a.reduce)?.into_value(t)?)),
        "reduce_scatter_tensor_out" => {
            let (x, out) = out_of(numel / ws)?;
            Ok(one(b.reduce_scatter_tensor_out(&x, a.reduce, &out)?.into_value(t)?))
        }
        "reduce_scatter_tensor_coalesced" => b.reduce_scatter_tensor_coalesced(&xs()?, a.reduce)?.into_value(t),
        "all_to_all_single" => Ok(one(b.all_to_all_single(&x()?, a.out_splits.as_deref(), a.in_splits.as_deref())?.into_value(t)?)),
        "broadcast" => Ok(one(b.broadcast(&x()?, a.root)?.into_value(t)?)),
        "broadcast_" => {
            let x = x()?;
            kept.push((x.clone(), input(a, me, 0)));
            Ok(one(b.broadcast_(&x, a.root)?.into_value(t)?))
        }
        "permute_tensor" => Ok(one(b.permute_tensor(&x()?, &a.perm)?.into_value(t)?)),
        "reduce" => Ok(one(b.reduce(&x()?, a.reduce, a.root)?.into_value(t)?)),
        "gather" => Ok(one(b.gather(&x()?, a.root)?.into_value(t)?)),
        "scatter" => Ok(one(b.scatter(&x()?, a.root)?.into_value(t)?)),
        "barrier" => b.barrier()?.into_value(t).map(|_| vec![]),
        h => Err(CollectiveError::Backend(format!("bad_input grid: no hook {h}"))),
    }
}

/// The value element `i` of output `j` of a valid call of `hook` must have on rank `me` (with
/// [`Args::valid`]: rows `2 ws`, one column, rank `r`'s tensor `t` all `r + 1 + 10 t`); `None`:
/// not checked (a non-root's reduce / gather output).
fn expected(hook: &str, ws: usize, me: usize, root: usize, j: usize, i: usize) -> Option<f64> {
    let sum = (ws * (ws + 1) / 2 + 10 * j * ws) as f64;
    let n = 2 * ws;
    Some(match hook {
        h if h.starts_with("all_reduce") || h.starts_with("reduce_scatter") => sum,
        h if h.starts_with("all_gather") => (i / n + 1 + 10 * j) as f64,
        "all_to_all_single" => (i / 2 + 1) as f64,
        "broadcast" | "broadcast_" | "scatter" => (root + 1) as f64,
        "permute_tensor" => (me + 1) as f64,
        "reduce" if me == root => sum,
        "gather" if me == root => (i / n + 1) as f64,
        _ => return None,
    })
}

/// Checks a valid call's outputs.
fn check<B: Backend>(b: &B, hook: &str, root: usize, outs: &[B::Buffer], w: &str) -> CaseResult {
    let (ws, me) = (b.world_size(), b.rank());
    for (j, out) in outs.iter().enumerate() {
        let got = b.download(out)?;
        for i in 0..got.numel() {
            if let Some(want) = expected(hook, ws, me, root, j, i) {
                let g = got.get_f64(i);
                if g != want {
                    return Err(fail(w, format!("output {j}: first bad index {i}: got {g}, expected {want}")));
                }
            }
        }
    }
    Ok(())
}

/// The grid's cases: one per hook and world size.
pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for &hook in HOOKS {
        for ws in WORLD_SIZES {
            if ws == 1 && hows(hook, 1).is_empty() {
                continue;
            }
            let variant = op_variant(hook).1;
            let meta = CaseMeta {
                suite: "bad_input".into(),
                op: hook.into(),
                variant: variant.into(),
                dtype: "f32".into(),
                reduce: String::new(),
            };
            v.push(Case::<B>::new(format!("bad_input::grid::{hook}::ws{ws}"), meta, ws, move |ctx| run(ctx, hook)));
        }
    }
    v
}

/// The op and variant names of a hook, for messages.
fn op_variant(hook: &str) -> (&'static str, &'static str) {
    let variant = if hook.ends_with("_coalesced_") {
        "coalesced_inplace"
    } else if hook.ends_with("_coalesced") {
        "coalesced"
    } else if hook.ends_with("_out") || hook == "recv" {
        "outbuf"
    } else if hook.ends_with('_') {
        "inplace"
    } else {
        "out"
    };
    let op = match hook {
        h if h.starts_with("all_reduce") => "all_reduce",
        h if h.starts_with("all_gather") => "all_gather_into_tensor",
        h if h.starts_with("reduce_scatter") => "reduce_scatter_tensor",
        "broadcast_" => "broadcast",
        "send" | "recv" => "send_recv",
        "all_to_all_single" => "all_to_all_single",
        "permute_tensor" => "permute_tensor",
        "reduce" => "reduce",
        "gather" => "gather",
        "scatter" => "scatter",
        _ => "barrier",
    };
    (op, variant)
}

fn run<B: Backend>(ctx: &mut Ctx<'_, B>, hook: &'static str) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    // A backend that declares no cross-rank validation still refuses what a rank can tell
    // alone: the local rows every rank carries (one rank's alone would leave its peers waiting
    // for it; a disagreement between ranks it need not see).
    let validates = b.capabilities().validates_across_ranks;
    let local = |how: How| !how.across() && !matches!(how, How::SplitsDisagree | How::P2pDType | How::P2pLarger | How::P2pSmaller);
    let mut checked = 0;
    let (op, variant) = op_variant(hook);
    let roots: Vec<usize> = if rooted(hook) && ws > 1 { vec![0, ws - 1] } else { vec![0] };
    // A way to break the call that makes it one the backend declares unsupported (band where
    // band is a declared gap, f64 where f64 is not declared) is still run where every rank
    // carries it: each rank's call is then the declared gap, which it must refuse by name
    // (`GAP_REFUSALS`, as `caps::gaps_refused` demands) or — where the row breaks a rule the
    // table checks before support (rules 1–5) — with the row's own kind; never complete it.
    // Where one rank alone carries it, its peers' calls are valid and the contract does not
    // say what a peer of a refused gap gets, so those carriers are skipped (every one-rank
    // carrier, where the valid call is the gap: the peers' calls are then refused gaps), as is
    // the valid call after a row when it is a declared gap. UNSUPPORTED when
    // every row is a declared gap (after their refusals were checked).
    let (mut declared, mut ran) = (Vec::new(), 0);
    let alt = other_dtype(&b.capabilities());
    let valid_gap = row_gap(&b.capabilities(), op, variant, &Args::valid(ws, 0, alt));
    for how in hows(hook, ws) {
        let gap = match (hook, how) {
            // A barrier's `OtherOp` carrier issues an f32 sum all_reduce instead.
            ("barrier", How::OtherOp) => row_gap(&b.capabilities(), "all_reduce", "out", &Args::valid(ws, 0, alt)),
            _ => row_gap(&b.capabilities(), op, variant, &Args::valid(ws, 0, alt).broken(how, ws)),
        };
        match &gap {
            Some(why) => declared.push(format!("{} ({why})", how.name())),
            None => ran += 1,
        }
        for carrier in carriers(how, ws) {
            let checkable = validates || (local(how) && carrier == Carrier::Every);
            if !checkable {
                continue;
            }
            let every_rank = carrier == Carrier::Every || ws == 1;
            // Where the valid call is itself a declared gap, the non-carriers' calls are too.
            if (gap.is_some() || valid_gap.is_some()) && (!every_rank || matches!(hook, "send" | "recv")) {
                continue;
            }
            checked += 1;
            for &root in &roots {
                let carried = match carrier {
                    Carrier::Every => "every rank".to_string(),
                    Carrier::One(r) => format!("rank {r} alone"),
                };
                let w = format!(
                    "backend={} op={op} variant={variant} dtype=f32 bad_input={} ({}) carried by {carried}{} world_size={ws} rank={me}",
                    backend_label(b),
                    how.kind().name(),
                    how.name(),
                    if rooted(hook) { format!(", root {root}") } else { String::new() },
                );
                if matches!(hook, "send" | "recv") {
                    p2p(ctx, hook, how, carrier, &w)?;
                    continue;
                }
                let mine = Carrier::Every == carrier || Carrier::One(me) == carrier;
                let valid = Args::valid(ws, root, alt);
                let a = if mine { valid.clone().broken(how, ws) } else { valid.clone() };
                let want = how.kind();
                // An overlap the op forbids is bad input only to a backend that declares it
                // refuses one (`AliasPolicy::Reject`): one that declares it computes aliased
                // outputs correctly must give the valid call's result, on every rank.
                let computes_aliased = how == How::Alias && b.capabilities().aliasing == AliasPolicy::Correct;
                // Every rank calls the op (the carrier of `OtherOp` another one): every rank must
                // get THE kind.
                if let Some(why) = &gap {
                    let table_first = precedes_support(want);
                    match call(ctx, hook, &a, &mut Vec::new()) {
                        Ok(_) => {
                            return Err(fail(
                                &w,
                                format!(
                                    "the call is a declared gap ({why}), and the backend completed it; expected a named refusal ({}){}",
                                    GAP_REFUSALS.join(" | "),
                                    if table_first { format!(" or bad_input:{}", want.name()) } else { String::new() }
                                ),
                            ))
                        }
                        Err(e) if GAP_REFUSALS.contains(&e.name().as_str()) => {}
                        Err(e) if table_first && e.bad_input_kind() == Some(want) => {}
                        Err(e) => {
                            return Err(fail(
                                &w,
                                format!(
                                    "the call is a declared gap ({why}); expected a named refusal ({}){}, got {e} [{}]",
                                    GAP_REFUSALS.join(" | "),
                                    if table_first { format!(" or bad_input:{}", want.name()) } else { String::new() },
                                    e.name()
                                ),
                            ))
                        }
                    }
                    if valid_gap.is_none() {
                        let w = format!("{w} (a valid {hook} after the refused declared gap)");
                        let outs = call(ctx, hook, &valid, &mut Vec::new()).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                        check(b, hook, root, &outs, &w)?;
                    }
                    continue;
                }
                let mut kept = Vec::new();
                match call(ctx, hook, &a, &mut kept) {
                    Ok(outs) if computes_aliased => {
                        check(
                            b,
                            hook,
                            root,
                            &outs,
                            &format!(
                                "{w}: the backend declares AliasPolicy::Correct, so the aliased call must compute the valid call's result"
                            ),
                        )?;
                    }
                    Err(e) if computes_aliased => {
                        return Err(fail(
                            &w,
                            format!(
                            "the backend declares AliasPolicy::Correct (aliased outputs computed), but the aliased call ended in {e} [{}]",
                            e.name()
                        ),
                        ))
                    }
                    Ok(_) => {
                        return Err(fail(
                            &w,
                            format!("the bad input was accepted and the op completed; expected bad_input:{}", want.name()),
                        ))
                    }
                    Err(e) if e.bad_input_kind() == Some(want) => untouched(b, &kept, &w)?,
                    Err(e) => return Err(fail(&w, format!("expected bad_input:{}, got {e} [{}]", want.name(), e.name()))),
                }
                // Then the same (op, variant), valid, computes the right value (unless it is a
                // declared gap itself).
                if valid_gap.is_some() {
                    continue;
                }
                let w = format!("{w} (a valid {hook} after the refused one)");
                let outs = call(ctx, hook, &valid, &mut Vec::new()).map_err(|e| fail(&w, format!("{e} [{}]", e.name())))?;
                check(b, hook, root, &outs, &w)?;
            }
        }
    }
    if !validates && checked == 0 {
        return Err(CaseEnd::Unsupported(format!(
            "backend declares no cross-rank input validation, and every row of {op} variant={variant} left needs it{}",
            if declared.is_empty() { String::new() } else { format!(" (the others are declared gaps: {})", declared.join("; ")) }
        )));
    }
    if ran == 0 && !declared.is_empty() {
        return Err(CaseEnd::Unsupported(format!(
            "declared gap: every row of {op} variant={variant} is a call the backend declares unsupported: {}",
            declared.join("; ")
        )));
    }
    Ok(())
}

/// A call refused with a bad-input error MUST leave its `_out` buffer and its in-place inputs as
/// they were (clause `bad_input.refused_untouched`): `kept` is each with its contents before the
/// call.
fn untouched<B: Backend>(b: &B, kept: &[(B::Buffer, Tensor)], w: &str) -> CaseResult {
    for (j, (buf, before)) in kept.iter().enumerate() {
        let got = b.download(buf)?;
        if let Some(i) = (0..before.numel()).find(|&i| got.get_f64(i).to_bits() != before.get_f64(i).to_bits()) {
            return Err(fail(
                w,
                format!(
                    "the refused call wrote its buffers (an _out / in-place buffer, #{j}): first bad index {i}: got {}, expected {} (its value before the call)",
                    got.get_f64(i),
                    before.get_f64(i)
                ),
            ));
        }
    }
    Ok(())
}

/// The dtype a `DTypeIn` / `DTypeOutWidth` row gives against f32, from the declaration (so that
/// a declared gap of one fixed dtype does not switch every dtype row off): i32, else u32, else
/// another declared dtype of f32's width, else any other declared dtype, else f64.
fn other_dtype(caps: &concord_core::Capabilities) -> DType {
    let d = &caps.dtypes;
    [DType::I32, DType::U32]
        .into_iter()
        .find(|x| d.contains(x))
        .or_else(|| d.iter().copied().find(|x| *x != DType::F32 && x.size() == 4))
        .or_else(|| d.iter().copied().find(|x| *x != DType::F32))
        .unwrap_or(DType::F64)
}

/// Whether the rule table ([`concord_core::call`]) checks `kind` before support (rules 1–5: a
/// bad group, peer, root, permutation or split count): a declared gap broken that way may name
/// the broken rule instead of refusing the gap.
fn precedes_support(kind: K) -> bool {
    matches!(kind, K::BadGroup | K::BadPeer | K::BadRoot | K::BadPermutation | K::BadSplits)
}

/// The declaration that makes a call with arguments `a` (on the ranks that carry them) one the
/// backend declares unsupported: its input or `_out` dtype, or its reduce op.
fn row_gap(caps: &concord_core::Capabilities, op: &str, variant: &str, a: &Args) -> Option<String> {
    let op = concord_core::OpKind::from_name(op)?;
    let variant = concord_core::Variant::from_name(variant);
    let reduce = Some(a.reduce).filter(|_| op.reduces());
    [Some(a.dtype), a.out_dtype].into_iter().flatten().find_map(|d| caps.check_call(op, variant, Some(d), reduce).err())
}

/// A send / recv scenario: the carrier sends to its partner (the next rank, the last to rank 0),
/// which receives; `PeerSelf`: the carrier (every rank) names itself as the peer of `hook`.
fn p2p<B: Backend>(ctx: &mut Ctx<'_, B>, hook: &str, how: How, carrier: Carrier, w: &str) -> CaseResult {
    let b = ctx.b;
    let (ws, me, t) = (b.world_size(), b.rank(), ctx.timeout);
    let want = how.kind();
    let named = |r: Result<(), CollectiveError>| -> CaseResult {
        match r {
            Ok(()) => Err(fail(w, format!("the bad input was accepted and the op completed; expected bad_input:{}", want.name()))),
            Err(e) if e.bad_input_kind() == Some(want) => Ok(()),
            Err(e) => Err(fail(w, format!("expected bad_input:{}, got {e} [{}]", want.name(), e.name()))),
        }
    };
    let msg = |r: usize, n: usize| Tensor::from_f64(DType::F32, &[n], &vec![(r + 1) as f64; n]);
    let (s, p) = match carrier {
        Carrier::Every => (me, me),
        Carrier::One(c) => (c, if ws == 1 { c } else { (c + 1) % ws }),
    };
    if how == How::PeerSelf {
        if carrier == Carrier::Every || me == s {
            let r = if hook == "send" {
                b.send(&b.upload(&msg(me, 4))?, me).and_then(|w| w.into_value(t))
            } else {
                b.recv(&b.alloc(DType::F32, &[4])?, me).and_then(|w| w.into_value(t).map(|_| ()))
            };
            named(r)?;
        }
    } else if me == s {
        named(b.send(&b.upload(&msg(me, 4))?, p).and_then(|w| w.into_value(t)))?;
    } else if me == p {
        let (dt, n) = match how {
            How::P2pDType => (DType::I32, 4),
            How::P2pLarger => (DType::F32, 5),
            _ => (DType::F32, 3),
        };
        named(b.recv(&b.alloc(dt, &[n])?, s).and_then(|w| w.into_value(t).map(|_| ())))?;
    }
    // Then a valid message between the same pair (or, after a refused self-send, to the next
    // rank), the refused call's side first.
    if ws == 1 {
        return Ok(());
    }
    let pairs: Vec<(usize, usize)> = match carrier {
        Carrier::Every => (0..ws).map(|r| (r, (r + 1) % ws)).collect(),
        Carrier::One(c) => vec![(c, (c + 1) % ws)],
    };
    let w = format!("{w} (a valid send / recv after the refused one)");
    let err = |e: CollectiveError| fail(&w, format!("{e} [{}]", e.name()));
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for &(from, to) in &pairs {
        if me == from {
            sends.push(b.send(&b.upload(&msg(me, 4))?, to).map_err(err)?);
        }
        if me == to {
            recvs.push((from, b.recv(&b.alloc(DType::F32, &[4])?, from).map_err(err)?));
        }
    }
    for (from, r) in recvs {
        let got = b.download(&r.into_value(t).map_err(err)?)?;
        if let Some(i) = (0..4).find(|&i| got.get_f64(i) != (from + 1) as f64) {
            return Err(fail(&w, format!("message from rank {from}: first bad index {i}: got {}, expected {}", got.get_f64(i), from + 1)));
        }
    }
    for s in sends {
        s.wait(t).map_err(err)?;
    }
    Ok(())
}
