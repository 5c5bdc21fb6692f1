//! The corruption sweep: does the catalogue check every op's output at every world size, on
//! every rank position and in every size class? Hand-written mutants answer for the bugs someone
//! imagined; the sweep answers for the grid. One parameterised bug, [`Corrupt`], makes ONE
//! element wrong (the last) in the output of ONE hook of the trait, on ONE rank position of the
//! communicator (first, middle, last; for the rooted reduce / gather: the root, when it sits
//! there), only when that output's element count falls in ONE size class. Each cell of the grid
//! (hook × position × size class × world size) runs the catalogue's cases of that world size that
//! use the op, until the first failure: a cell no case fails is a hole, a place where a backend
//! could be wrong and pass. `cargo xtask mutants --sweep` prints the grid.
//!
//! Realistic? Backends choose their code path by exactly these things: NCCL switches protocol and
//! algorithm by message size and rank count, a root or the last rank often takes a special
//! branch, and a tail element is where chunking arithmetic goes wrong.

use crate::campaign::{side_by_side, verdict_pool, Spec};
use crate::{bump, edit, Buf, Bug, Mutant, Shm};
use concord_core::fused::Gathered;
use concord_core::{Backend, DType, ReduceOp, Result, Scaling, Tensor, Work};
use concord_harness::runner::Pool;
use concord_shm::ShmBackend;
use concord_suites::run::{BackendEntry, CaseInfo};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The hooks whose output the sweep corrupts (the trait's data-moving calls; `send` and
/// `barrier` have none). Names as in case metadata where one exists.
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
    "recv",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
];

/// What a target does to the calls it hits. `value`: the last element of the output is wrong
/// (the corruption sweep). `order`: a float all_reduce (sum, avg, premul_sum, product) on the
/// target's rank is reduced in another rank order, from every rank's input (gathered beside the
/// call): each result is within every rounding bound the oracle allows, but not the same bits
/// as the other ranks' (clause `values.identical_on_every_rank`; shipped as pytorch/pytorch PR
/// #129501 and open-mpi/ompi#12258). A target names its effect after a `+` (`+order`); none is
/// `value`.
pub const EFFECTS: &[&str] = &["value", "order"];

/// The hooks an `order` target can hit: the all_reduce family (every rank returns the result).
pub const ORDER_HOOKS: &[&str] = &["all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_"];

/// Rank positions in the communicator.
pub const POSITIONS: &[&str] = &["first", "middle", "last"];

/// Communicator shapes: `world` (the world's communicator, or a group as large as the world: the
/// first sweep's cells) and the subgroup shapes, by the group's members (world ranks in group
/// rank order): `strided` (ascending, every other world rank), `no_zero` (at least two members,
/// world rank 0 not one of them), `singleton` (one member), `unsorted` (group rank order is not
/// world rank order). The subgroup shapes may overlap (`[1, 3, 5]` is strided and no_zero); a
/// subgroup cell corrupts calls on every group of its shape, at its position IN THE GROUP, at
/// any world size.
pub const SHAPES: &[&str] = &["world", "strided", "no_zero", "singleton", "unsorted"];

/// Whether a communicator of `members` (world ranks by communicator rank) in a world of
/// `world_size` ranks has `shape`.
pub fn has_shape(shape: &str, members: &[usize], world_size: usize) -> bool {
    let n = members.len();
    let proper = n < world_size;
    let ascending = members.windows(2).all(|w| w[0] < w[1]);
    match shape {
        "world" => !proper,
        "strided" => proper && n >= 2 && members.windows(2).all(|w| w[1] == w[0] + 2),
        "no_zero" => proper && n >= 2 && !members.contains(&0),
        "singleton" => n == 1 && world_size > 1,
        "unsorted" => n >= 2 && !ascending,
        _ => false,
    }
}

/// The position of the dtype grid's cells: every rank of the communicator (the rooted reduce /
/// gather: the root).
pub const EVERY: &str = "every";

/// The size class of the dtype grid's cells: every output size.
pub const ANY_SIZE: (&str, usize, usize) = ("any", 1, usize::MAX);

/// Size classes of the corrupted output, by element count: `[lo, hi)`.
pub const CLASSES: &[(&str, usize, usize)] = &[("tiny", 1, 16), ("small", 16, 4096), ("medium", 4096, 65536), ("large", 65536, usize::MAX)];

/// World sizes of the grid (the catalogue's).
pub const WORLD_SIZES: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 16];

/// The rank of `pos` in a world of `ws`; `None` where it is the same rank as another position
/// (one rank has only `first`; two have `first` and `last`; `middle` is `ws / 2` from 3 up).
pub fn rank_of(pos: &str, ws: usize) -> Option<usize> {
    match pos {
        // Every rank; named by the first.
        EVERY => Some(0),
        "first" => Some(0),
        "last" => (ws > 1).then(|| ws - 1),
        "middle" => (ws > 2).then_some(ws / 2),
        _ => None,
    }
}

/// Whether no call can put `target` at world size `ws`: all_gather / gather (and the fused
/// all_gather_matmul's) outputs are `ws` times their input (so at least `ws` elements), a recv
/// needs a peer other than itself, and an `order` target needs three ranks (two operands add
/// alike in either order) and an all_reduce hook.
pub fn impossible(target: &Target, ws: usize) -> bool {
    let times_ws = matches!(
        target.hook,
        "all_gather_into_tensor" | "all_gather_into_tensor_out" | "all_gather_into_tensor_coalesced" | "gather" | "fused_all_gather_matmul"
    );
    (times_ws && ws >= target.class.2)
        || (target.hook == "recv" && ws == 1)
        || refused_dtype(target)
        || (target.effect == "order" && (ws < 3 || !ORDER_HOOKS.contains(&target.hook)))
}

/// Whether the contract refuses every call of `target`'s dtype: the fused ops take float
/// tensors only (an integer one is a named bad input, `fused.bad_input`).
pub fn refused_dtype(target: &Target) -> bool {
    target.hook.starts_with("fused_") && target.dtype.is_some_and(|d| !d.is_float())
}

/// One sweep target: `hook:position:class`, the value of the backend option `sweep`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub hook: &'static str,
    pub pos: &'static str,
    pub class: (&'static str, usize, usize),
    /// One of [`SHAPES`]; `world` unless the target names another (`HOOK:POSITION:CLASS:SHAPE`).
    pub shape: &'static str,
    /// Only outputs of this dtype (`HOOK:POSITION:CLASS[:SHAPE]@DTYPE`: the dtype grid,
    /// [`dtype_targets`]); `None`: every dtype.
    pub dtype: Option<DType>,
    /// One of [`EFFECTS`]: `value` unless the target names another (`...+order`).
    pub effect: &'static str,
}

impl Target {
    pub fn parse(s: &str) -> Option<Target> {
        let (s, effect) = match s.split_once('+') {
            None => (s, "value"),
            Some((s, e)) => (s, EFFECTS.iter().copied().find(|x| *x == e)?),
        };
        let (s, dtype) = match s.split_once('@') {
            None => (s, None),
            Some((s, d)) => (s, Some(DType::from_name(d)?)),
        };
        let mut it = s.split(':');
        let (h, p, c) = (it.next()?, it.next()?, it.next()?);
        let shape = match it.next() {
            None => "world",
            Some(g) => SHAPES.iter().copied().find(|x| *x == g)?,
        };
        if it.next().is_some() {
            return None;
        }
        Some(Target {
            hook: HOOKS.iter().copied().find(|x| *x == h)?,
            pos: POSITIONS.iter().chain([&EVERY]).copied().find(|x| *x == p)?,
            class: CLASSES.iter().chain([&ANY_SIZE]).copied().find(|x| x.0 == c)?,
            shape,
            dtype,
            effect,
        })
    }
    pub fn label(&self) -> String {
        let dtype = self.dtype.map_or(String::new(), |d| format!("@{d}"));
        let effect = if self.effect == "value" { String::new() } else { format!("+{}", self.effect) };
        if self.shape == "world" {
            format!("{}:{}:{}{dtype}{effect}", self.hook, self.pos, self.class.0)
        } else {
            format!("{}:{}:{}:{}{dtype}{effect}", self.hook, self.pos, self.class.0, self.shape)
        }
    }
    /// A subgroup cell: one per target, over every world size (its `ws` is 0).
    pub fn in_groups(&self) -> bool {
        self.shape != "world"
    }
}

/// The target of this worker process (a worker hosts one world, of one mutant), and whether the
/// world is a control ([`DRY_OPTION`]).
static TARGET: OnceLock<(Target, bool)> = OnceLock::new();

/// The backend option of a control world: the same target, every call takes the same path (the
/// output downloaded, edited and written back), but the edit leaves the value as it was. A case
/// that fails the target and passes its control failed because of the one wrong element.
pub const DRY_OPTION: &str = "sweep_dry";

/// Called by [`Mutant`]'s init with the `sweep` option and whether [`DRY_OPTION`] is set.
pub fn set_target(option: Option<&str>, dry: bool) -> std::result::Result<(), String> {
    let s = option.ok_or("the sweep mutant needs the option `sweep=<hook>:<position>:<class>`")?;
    let t = Target::parse(s).ok_or_else(|| format!("bad sweep target `{s}` (hooks {HOOKS:?}, positions {POSITIONS:?})"))?;
    let _ = TARGET.set((t, dry));
    Ok(())
}

/// The sweep's maker (the catalogue's `MakeBug` for the name `sweep`).
pub fn make() -> Box<dyn Bug> {
    let (t, dry) = TARGET.get().cloned().map_or((None, false), |(t, d)| (Some(t), d));
    Box::new(Corrupt { t, dry })
}

/// The bug: the last element of `hook`'s output is wrong on the rank at `pos`, for outputs of
/// the size class. Every other call is the correct shm call. `dry`: the control, the same path
/// with the value left right.
pub struct Corrupt {
    t: Option<Target>,
    dry: bool,
}

impl Corrupt {
    fn on(&self, hook: &str) -> bool {
        self.t.as_ref().is_some_and(|t| t.hook == hook && t.effect == "value")
    }
    /// Whether this rank's output is corrupted (`root`: the rooted ops corrupt only the root).
    /// Positions are the communicator's. A `world` target never corrupts a subgroup's calls (its
    /// rank 1 of 2 is not the world's last rank; a cell is labelled with the world size); a
    /// subgroup target corrupts only calls on a group of its shape.
    fn here(&self, s: &Shm, root: Option<usize>) -> bool {
        let Some(t) = &self.t else { return false };
        let me = s.rank();
        let shape_ok = if t.in_groups() { has_shape(t.shape, &s.members, s.world_size) } else { !s.in_subgroup() };
        let at = t.pos == EVERY || rank_of(t.pos, s.ws()) == Some(me);
        shape_ok && at && root.is_none_or(|r| r == me)
    }
    /// What [`corrupt`] edits: the class's bounds, the dtype, and whether this is the control.
    fn class(&self) -> Edit {
        let (lo, hi, dtype) = self.t.as_ref().map_or((0, 0, None), |t| (t.class.1, t.class.2, t.dtype));
        Edit { lo, hi, dtype, dry: self.dry }
    }
    /// `w` with the last element of its output made wrong, when it is in the class.
    fn one(&self, s: &Shm, hook: &str, root: Option<usize>, w: Work<Buf>) -> Work<Buf> {
        if !self.on(hook) || !self.here(s, root) {
            return w;
        }
        let e = self.class();
        s.then(w, move |be, out| corrupt(be, out, e))
    }
    /// Whether an `order` target gathers the input `x` of a `hook` call with `op` beside it (see
    /// [`EFFECTS`]): on the world (not a subgroup) of 3 or more ranks, a float input of the
    /// target's class (and dtype) and an op whose float result depends on the order. Every rank
    /// of a valid call agrees on each, so every rank gathers or none does.
    fn gathers(&self, s: &Shm, hook: &str, x: &Buf, op: ReduceOp) -> bool {
        let Some(t) = self.t.as_ref().filter(|t| t.effect == "order" && t.hook == hook) else { return false };
        let d = s.inner.buffer_dtype(x);
        let n = s.numel(x);
        let order_matters = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Product | ReduceOp::PremulSum(_));
        !s.in_subgroup()
            && s.ws() >= 3
            && d.is_float()
            && order_matters
            && t.dtype.is_none_or(|w| w == d)
            && (t.class.1..t.class.2).contains(&n)
            && !s.inner.buffer_shape(x).is_empty()
    }
    /// An `order` target's call: `x` gathered from every rank before `issue` (the call itself),
    /// then, on the target's rank, the output `pick` names recomputed from the gathered inputs
    /// in descending rank order ([`reorder`]). The control takes the same path and leaves it.
    fn reordered<T: Clone + Send + Sync + 'static>(
        &self,
        s: &Shm,
        x: &Buf,
        op: ReduceOp,
        issue: impl FnOnce() -> Result<Work<T>>,
        pick: fn(&T) -> Option<&Buf>,
    ) -> Result<Work<T>> {
        let (ws, dry, here) = (s.ws(), self.dry, self.here(s, None));
        crate::then_gathered(
            s,
            s.inner.all_gather_into_tensor(x)?,
            |g| g,
            issue,
            pick,
            move |all, t| {
                if here && !dry {
                    reorder(all, t, ws, op)
                }
            },
        )
    }
    /// The last buffer of a coalesced call's outputs.
    fn many(&self, s: &Shm, hook: &str, w: Work<Vec<Buf>>) -> Work<Vec<Buf>> {
        if !self.on(hook) || !self.here(s, None) {
            return w;
        }
        let e = self.class();
        s.then(w, move |be, outs| outs.last().map_or(Ok(()), |out| corrupt(be, out, e)))
    }
}

/// Which outputs [`corrupt`] edits: element counts in `[lo, hi)`, of `dtype` if given; `dry`:
/// the control (the same download and write-back, the value left right).
#[derive(Clone, Copy)]
struct Edit {
    lo: usize,
    hi: usize,
    dtype: Option<DType>,
    dry: bool,
}

/// `t` (this rank's all_reduce result, `n` elements) recomputed from `all` (every rank's input,
/// rank by rank) in descending rank order (shm adds in ascending order, so from 3 ranks the
/// last operand differs: `(x2 + x1) + x0` against `(x0 + x1) + x2`): f64 accumulates in f64, the
/// other floats in f32 (what a GPU kernel does), the result rounded once to the dtype. Within
/// every bound the oracle allows on random inputs; exact inputs give the exact result in any
/// order.
fn reorder(all: &Tensor, t: &mut Tensor, ws: usize, op: ReduceOp) {
    let n = t.numel();
    let order: Vec<usize> = (0..ws).rev().collect();
    let wide = t.dtype() == DType::F64;
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let term = |q: usize| {
                let v = all.get_f64(q * n + i);
                match op {
                    ReduceOp::PremulSum(f) if wide => f * v,
                    ReduceOp::PremulSum(f) => ((f as f32) * (v as f32)) as f64,
                    _ => v,
                }
            };
            if wide {
                let acc = order[1..].iter().fold(term(order[0]), |a, &q| if op == ReduceOp::Product { a * term(q) } else { a + term(q) });
                if op == ReduceOp::Avg {
                    acc / ws as f64
                } else {
                    acc
                }
            } else {
                let acc = order[1..].iter().fold(term(order[0]) as f32, |a, &q| {
                    if op == ReduceOp::Product {
                        a * term(q) as f32
                    } else {
                        a + term(q) as f32
                    }
                });
                (if op == ReduceOp::Avg { acc / ws as f32 } else { acc }) as f64
            }
        })
        .collect();
    let mine = Tensor::from_f64(t.dtype(), t.shape(), &vals);
    t.bytes_mut().copy_from_slice(mine.bytes());
}

fn corrupt(be: &ShmBackend, out: &Buf, e: Edit) -> Result<()> {
    let n: usize = be.buffer_shape(out).iter().product();
    if n < e.lo || n >= e.hi || e.dtype.is_some_and(|d| be.buffer_dtype(out) != d) {
        return Ok(());
    }
    edit(be, out, |t| {
        if !e.dry {
            bump(t, n - 1)
        }
    })
}

impl Bug for Corrupt {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if self.gathers(s, "all_reduce", x, op) {
            return self.reordered(s, x, op, || s.inner.all_reduce(x, op), |b: &Buf| Some(b));
        }
        Ok(self.one(s, "all_reduce", None, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if self.gathers(s, "all_reduce_", x, op) {
            return self.reordered(s, x, op, || s.inner.all_reduce_(x, op), |b: &Buf| Some(b));
        }
        Ok(self.one(s, "all_reduce_", None, s.inner.all_reduce_(x, op)?))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if let Some(x) = xs.last().filter(|x| self.gathers(s, "all_reduce_coalesced", x, op)) {
            return self.reordered(s, x, op, || s.inner.all_reduce_coalesced(xs, op), |v: &Vec<Buf>| v.last());
        }
        Ok(self.many(s, "all_reduce_coalesced", s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        if let Some(x) = xs.last().filter(|x| self.gathers(s, "all_reduce_coalesced_", x, op)) {
            return self.reordered(s, x, op, || s.inner.all_reduce_coalesced_(xs, op), |v: &Vec<Buf>| v.last());
        }
        Ok(self.many(s, "all_reduce_coalesced_", s.inner.all_reduce_coalesced_(xs, op)?))
    }
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        Ok(self.one(s, "all_gather_into_tensor", None, s.inner.all_gather_into_tensor(x)?))
    }
    fn all_gather_into_tensor_out(&self, s: &Shm, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        Ok(self.one(s, "all_gather_into_tensor_out", None, s.inner.all_gather_into_tensor_out(x, out)?))
    }
    fn all_gather_into_tensor_coalesced(&self, s: &Shm, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        Ok(self.many(s, "all_gather_into_tensor_coalesced", s.inner.all_gather_into_tensor_coalesced(xs)?))
    }
    fn reduce_scatter_tensor(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.one(s, "reduce_scatter_tensor", None, s.inner.reduce_scatter_tensor(x, op)?))
    }
    fn reduce_scatter_tensor_out(&self, s: &Shm, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        Ok(self.one(s, "reduce_scatter_tensor_out", None, s.inner.reduce_scatter_tensor_out(x, op, out)?))
    }
    fn reduce_scatter_tensor_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(self.many(s, "reduce_scatter_tensor_coalesced", s.inner.reduce_scatter_tensor_coalesced(xs, op)?))
    }
    fn all_to_all_single(&self, s: &Shm, x: &Buf, o: Option<&[usize]>, i: Option<&[usize]>) -> Result<Work<Buf>> {
        Ok(self.one(s, "all_to_all_single", None, s.inner.all_to_all_single(x, o, i)?))
    }
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "broadcast", None, s.inner.broadcast(x, src)?))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "broadcast_", None, s.inner.broadcast_(x, src)?))
    }
    fn permute_tensor(&self, s: &Shm, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        Ok(self.one(s, "permute_tensor", None, s.inner.permute_tensor(x, src_dst)?))
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "reduce", Some(root), s.inner.reduce(x, op, root)?))
    }
    fn gather(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "gather", Some(root), s.inner.gather(x, root)?))
    }
    fn scatter(&self, s: &Shm, x: &Buf, root: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "scatter", None, s.inner.scatter(x, root)?))
    }
    fn recv(&self, s: &Shm, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.one(s, "recv", None, s.inner.recv(out, src)?))
    }
    fn fused_all_gather_matmul(
        &self,
        m: &Mutant,
        a: &Buf,
        bs: &[Buf],
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Gathered<Buf>>> {
        let w = concord_core::fused::decomposed_all_gather_matmul(m, a, bs, dim, scaling)?;
        if !self.on("fused_all_gather_matmul") || !self.here(&m.s, None) {
            return Ok(w);
        }
        let e = self.class();
        Ok(m.s.then(w, move |be, (_, outs)| outs.last().map_or(Ok(()), |out| corrupt(be, out, e))))
    }
    fn fused_matmul_reduce_scatter(
        &self,
        m: &Mutant,
        a: &Buf,
        b: &Buf,
        op: ReduceOp,
        dim: usize,
        scaling: Option<&Scaling>,
    ) -> Result<Work<Buf>> {
        let w = concord_core::fused::decomposed_matmul_reduce_scatter(m, a, b, op, dim, scaling)?;
        Ok(self.one(&m.s, "fused_matmul_reduce_scatter", None, w))
    }
}

/// Whether a case calls `hook`, by its metadata op (a superset: a case that does not call it
/// only costs time). Random programs (`mixed`) call everything; the fused ops' decompositions
/// call all_gather / reduce_scatter; tuned cases name every op they tune.
pub fn uses(case: &CaseInfo, hook: &str) -> bool {
    let op = case.meta.op.as_str();
    let contains: &[&str] = match hook {
        "all_reduce" | "all_reduce_" | "all_reduce_coalesced" | "all_reduce_coalesced_" => &["all_reduce"],
        "all_gather_into_tensor" | "all_gather_into_tensor_out" | "all_gather_into_tensor_coalesced" => &["all_gather"],
        "reduce_scatter_tensor" | "reduce_scatter_tensor_out" | "reduce_scatter_tensor_coalesced" => &["reduce_scatter"],
        "all_to_all_single" => &["all_to_all"],
        "broadcast" | "broadcast_" => &["broadcast"],
        "permute_tensor" => &["permute"],
        "recv" => &["recv", "send"],
        "fused_all_gather_matmul" => &["fused_all_gather"],
        "fused_matmul_reduce_scatter" => &["matmul_reduce_scatter"],
        _ => &[],
    };
    op == "mixed" || op == hook || contains.iter().any(|c| op.contains(c)) || (hook == "recv" && case.meta.suite == "p2p")
}

/// Whether a case may call ops on a subgroup (a superset, by id: the subgroup suite and the
/// cases named after groups, the random programs, the size grid's group slice).
pub fn makes_groups(case: &CaseInfo) -> bool {
    case.meta.op == "mixed" || case.id.contains("group")
}

/// Whether a subgroup cell can never be reached: a singleton group has only its first rank and
/// no peer to receive from.
pub fn impossible_in_groups(target: &Target) -> bool {
    target.shape == "singleton" && (target.pos != "first" || target.hook == "recv")
}

/// One cell's result, of either grid: this sweep's ([`Cell`]) and the bad-input grid's
/// ([`crate::sweep_bad::Cell`]), `T` being the grid's target.
#[derive(Clone, Debug)]
pub struct GridCell<T> {
    pub target: T,
    /// The world size; 0 for a subgroup cell (every world size).
    pub ws: usize,
    /// `None`: not applicable (a position that is an earlier one's rank at this world size, or a
    /// cell no call can reach: [`impossible`], [`crate::sweep_bad::impossible`]).
    pub candidates: Option<usize>,
    /// Cases run against the target (controls and reruns alone not counted).
    pub cases_run: usize,
    /// The first case (without the `sweep::` prefix) that fails the target alone, in a fresh
    /// world, and passes its control ([`attribute`]); `None` with candidates: a hole.
    pub caught: Option<String>,
    /// Failing cases that did not count as the catch, each with the reason.
    pub set_aside: Vec<(String, SetAside)>,
    pub elapsed: Duration,
}

/// One cell of the corruption sweep.
pub type Cell = GridCell<Target>;

pub use crate::campaign::SetAside;

/// [`crate::campaign::attribute`] with the target's control: `case`, which just failed `real`
/// (`alone`: in a world spawned for it), counts as the catch only if it fails alone in
/// a fresh world and passes `control` ([`control`]: the same path with the value left right).
pub fn attribute(pool: &Pool, real: &Spec, control: &Spec, case: &CaseInfo, alone: bool) -> std::result::Result<(), SetAside> {
    crate::campaign::attribute(pool, real, Some(control), case, alone)
}

/// A cell's cases, in order, against `real` until one is its catch ([`attribute`] with
/// `control`, [`crate::campaign::catch_alone`]): the catch (if any), the cases run against
/// `real` (reruns alone not counted), and the failing cases set aside.
pub fn catch_in(pool: &Pool, real: &Spec, control: &Spec, cases: Vec<CaseInfo>) -> (Option<String>, usize, Vec<(String, SetAside)>) {
    let f = crate::campaign::catch_alone(pool, real, Some(control), cases);
    (f.caught.map(|c| c.case), f.cases_run, f.set_aside)
}

/// A grid cell's candidates (`None`: unreachable), cases run, catch and cases set aside.
pub type CellOutcome = (Option<usize>, usize, Option<String>, Vec<(String, SetAside)>);

/// What a grid cell's candidate cases (`None`: no call can reach the cell) show: how many there
/// are, how many ran, the catch ([`catch_in`] against the target and its control, built only
/// when there is something to run) and the cases set aside. No candidate is a hole.
pub fn cell_outcome(pool: &Pool, run: Option<Vec<CaseInfo>>, specs: impl FnOnce() -> (Spec, Spec)) -> CellOutcome {
    match run {
        None => (None, 0, None, Vec::new()),
        Some(run) if run.is_empty() => (Some(0), 0, None, Vec::new()),
        Some(run) => {
            let n = run.len();
            let (real, control) = specs();
            let (caught, cases_run, set_aside) = catch_in(pool, &real, &control, run);
            (Some(n), cases_run, caught, set_aside)
        }
    }
}

/// The spec of `target` (one entry per target: its option keys the worlds apart).
pub fn spec(target: &Target) -> Spec {
    let entry = BackendEntry::new::<Mutant>("sweep", 0, concord_suites::catalogue::<Mutant>)
        .with_option("mutant", "sweep")
        .with_option("sweep", &target.label())
        .with_rerun(format!("cargo xtask mutants --sweep {} --case", target.label()));
    let order = target.effect == "order";
    Spec {
        name: "sweep",
        clause: if order { "values.identical_on_every_rank" } else { "values.sizes" },
        what: if order {
            "a float all_reduce reduced in another rank order on one rank, by hook × position × size × world size"
        } else {
            "one wrong element, by hook × position × size × world size"
        },
        catchers: &[],
        entry,
        make,
    }
}

/// The control of `target`: its spec with [`DRY_OPTION`] (worlds of their own: options key them).
pub fn control(target: &Target) -> Spec {
    control_of(spec(target), "the control: the same target with the value left right")
}

/// `s` as a control: the same entry with [`DRY_OPTION`] (the grids' wrappers take the same path
/// and leave the value right), described as `what`.
pub fn control_of(mut s: Spec, what: &'static str) -> Spec {
    s.entry = s.entry.with_option(DRY_OPTION, "1");
    s.what = what;
    s
}

/// The entry a worker process of any sweep target is served by (the target comes with the
/// world's options): add it to the entries of `dispatch_child`.
pub fn worker_entry() -> BackendEntry {
    spec(&all_targets()[0]).entry
}

/// The cases a cell runs: the world size's cases that use the hook (a subgroup cell: the cases of
/// every world size of `sizes` that may make groups, [`makes_groups`], the group grid's first), in catalogue
/// order, except that for the medium and large classes the cases made of larger buffers (the size ladder,
/// `::large` cases, random programs, fused ops) come first (a cell ends at its first failure;
/// the matrix's small shapes cannot catch those classes).
pub fn cell_cases(cases: &[CaseInfo], target: &Target, ws: usize, sizes: &[usize]) -> Vec<CaseInfo> {
    let mut v: Vec<&CaseInfo> = cases
        .iter()
        .filter(|c| {
            let here =
                if target.in_groups() { c.world_size > 1 && makes_groups(c) && sizes.contains(&c.world_size) } else { c.world_size == ws };
            here && uses(c, target.hook) && target.dtype.is_none_or(|d| uses_dtype(c, d))
        })
        .collect();
    if let Some(d) = target.dtype {
        // Cases named by the dtype first (a cell ends at its first failure).
        v.sort_by_key(|c| c.meta.dtype != d.name());
    }
    if target.in_groups() {
        // The size grid's group slice first (a cell ends at its first failure).
        v.sort_by_key(|c| !c.id.contains("::group_grid::"));
    } else if target.class.1 >= 4096 {
        let big = |c: &CaseInfo| ["::sizes::", "::large", "::programs::", "::fused::"].iter().any(|p| c.id.contains(p));
        v.sort_by_key(|c| !big(c));
    }
    v.into_iter().cloned().collect()
}

/// Every cell of `targets` × `sizes`, up to `jobs` side by side, without the cases whose id
/// contains one of `skip` (the grid as it was before a hunt's cases).
pub fn run(targets: &[Target], sizes: &[usize], jobs: usize, skip: &[String], report: impl Fn(&Cell) + Sync) -> Vec<Cell> {
    if targets.is_empty() {
        return Vec::new();
    }
    // One listing serves every target (same backend type; the ids differ only by prefix, which
    // is `sweep::` for all).
    let cases = listed_without(&spec(&targets[0]).entry, skip);
    let work: Vec<(Target, usize)> = targets
        .iter()
        .flat_map(|t| if t.in_groups() { vec![(t.clone(), 0)] } else { sizes.iter().map(|&ws| (t.clone(), ws)).collect() })
        .collect();
    let cell_run = |t: &Target, ws: usize| {
        let unreachable =
            if t.in_groups() { impossible_in_groups(t) || refused_dtype(t) } else { rank_of(t.pos, ws).is_none() || impossible(t, ws) };
        (!unreachable).then(|| cell_cases(&cases, t, ws, sizes))
    };
    run_cells(work, jobs, cell_run, |t| (spec(t), control(t)), report)
}

/// The listing of `entry` (one listing serves every target of a grid) without the cases whose
/// id contains one of `skip` (the grid as it was before a hunt's cases).
pub fn listed_without(entry: &BackendEntry, skip: &[String]) -> Vec<CaseInfo> {
    let mut cases = entry.cases();
    cases.retain(|c| !skip.iter().any(|k| c.id.contains(k.as_str())));
    cases
}

/// Every cell of `work` (a target and its world size), up to `jobs` side by side, in one verdict
/// pool, for either grid: `cell_run` gives a cell's cases (`None`: no call can reach the cell),
/// `specs` its target and control, and [`cell_outcome`] the result; `report` is called as each
/// cell ends.
pub fn run_cells<T: Send>(
    work: Vec<(T, usize)>,
    jobs: usize,
    cell_run: impl Fn(&T, usize) -> Option<Vec<CaseInfo>> + Sync,
    specs: impl Fn(&T) -> (Spec, Spec) + Sync,
    report: impl Fn(&GridCell<T>) + Sync,
) -> Vec<GridCell<T>> {
    let pool = verdict_pool();
    let cells = side_by_side(
        work,
        jobs,
        |(t, ws)| {
            let started = Instant::now();
            let run = cell_run(&t, ws);
            let (candidates, cases_run, caught, set_aside) = cell_outcome(&pool, run, || specs(&t));
            GridCell { target: t, ws, candidates, cases_run, caught, set_aside, elapsed: started.elapsed() }
        },
        report,
    );
    pool.shutdown();
    cells
}

/// Every target of the grid (the `world` shape).
pub fn all_targets() -> Vec<Target> {
    targets_of("world")
}

/// Every target of one shape.
pub fn targets_of(shape: &'static str) -> Vec<Target> {
    let mut v = Vec::new();
    for h in HOOKS {
        for p in POSITIONS {
            for c in CLASSES {
                v.push(Target { hook: h, pos: p, class: *c, shape, dtype: None, effect: "value" });
            }
        }
    }
    v
}

/// The order grid's targets: the all_reduce hooks × positions × size classes, each reducing in
/// another order on its rank ([`EFFECTS`]). Its cells answer: does some case of this world size
/// compare the ranks' results of this call, bit for bit, on inputs whose sum depends on the order?
pub fn order_targets() -> Vec<Target> {
    all_targets().into_iter().filter(|t| ORDER_HOOKS.contains(&t.hook)).map(|t| Target { effect: "order", ..t }).collect()
}

/// The dtype grid's targets: every hook × `dtypes`, on every rank, at every size (one wrong
/// element in every output of that dtype). Its cells answer: does some case of this world size
/// check this op's output in this dtype?
pub fn dtype_targets(dtypes: &[DType]) -> Vec<Target> {
    HOOKS
        .iter()
        .flat_map(|h| {
            dtypes.iter().map(|d| Target { hook: h, pos: EVERY, class: ANY_SIZE, shape: "world", dtype: Some(*d), effect: "value" })
        })
        .collect()
}

/// Whether a case may make calls in `dtype`, by its metadata (a superset: a case whose dtype is
/// not one dtype's name, e.g. mixed dtypes or random programs, may use any).
pub fn uses_dtype(case: &CaseInfo, dtype: DType) -> bool {
    let d = case.meta.dtype.as_str();
    d == dtype.name() || !DType::ALL.iter().any(|x| x.name() == d)
}

/// A cell's mark in the grid (`.` not run, `-` not applicable, `ok`, `HOLE`).
fn mark(c: Option<&Cell>) -> &'static str {
    match c {
        None => ".",
        Some(c) if c.candidates.is_none() => "-",
        Some(c) if c.caught.is_some() => "ok",
        Some(_) => "HOLE",
    }
}

/// The grid: one table per hook, a row per (position, class), a column per world size (world
/// cells) or per subgroup shape (subgroup cells, every world size); `ok` caught, `HOLE` not, `-`
/// not applicable, `.` not run. Then the holes, and the count.
pub fn render(cells: &[Cell], sizes: &[usize], skip: &[String]) -> String {
    let mut out = String::new();
    let shapes: Vec<&str> = SHAPES.iter().copied().filter(|s| *s != "world").collect();
    for (h, effect) in HOOKS.iter().flat_map(|h| EFFECTS.iter().map(move |e| (h, *e))) {
        for grouped in [false, true] {
            let mine: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.target.hook == *h && c.target.in_groups() == grouped && c.target.dtype.is_none() && c.target.effect == effect)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let columns: Vec<(String, usize, &str)> = if grouped {
                shapes.iter().map(|s| (s.to_string(), 0, *s)).collect()
            } else {
                sizes.iter().map(|&ws| (format!("ws{ws}"), ws, "world")).collect()
            };
            let what = if effect == "order" { " (reduced in another order on one rank: not the same bits as the others')" } else { "" };
            out += &format!("\n{h}{what}{}\n{:<16}", if grouped { " (subgroups, any world size)" } else { "" }, "position:class");
            let w = if grouped { 9 } else { 5 };
            for (name, ..) in &columns {
                out += &format!(" {name:>w$}");
            }
            out += "\n";
            for p in POSITIONS {
                for cl in CLASSES {
                    out += &format!("{:<16}", format!("{p}:{}", cl.0));
                    for (_, ws, shape) in &columns {
                        let c =
                            mine.iter().find(|c| c.target.pos == *p && c.target.class.0 == cl.0 && c.ws == *ws && c.target.shape == *shape);
                        out += &format!(" {:>w$}", mark(c.copied()));
                    }
                    out += "\n";
                }
            }
        }
    }
    // The dtype grid: a row per dtype, a column per world size.
    for h in HOOKS {
        let mine: Vec<&Cell> = cells.iter().filter(|c| c.target.hook == *h && c.target.dtype.is_some()).collect();
        if mine.is_empty() {
            continue;
        }
        out += &format!("\n{h} (one wrong element in every output of the dtype)\n{:<16}", "dtype");
        for ws in sizes {
            out += &format!(" {:>5}", format!("ws{ws}"));
        }
        out += "\n";
        for d in DType::ALL {
            let row: Vec<&&Cell> = mine.iter().filter(|c| c.target.dtype == Some(d)).collect();
            if row.is_empty() {
                continue;
            }
            out += &format!("{:<16}", d.name());
            for ws in sizes {
                out += &format!(" {:>5}", mark(row.iter().find(|c| c.ws == *ws).map(|c| **c)));
            }
            out += "\n";
        }
    }
    // Every hole, drawn or not (a cell outside the tables' rows still counts).
    let holes: Vec<&Cell> = cells.iter().filter(|c| c.candidates.is_some() && c.caught.is_none()).collect();
    let run: Vec<&Cell> = cells.iter().filter(|c| c.candidates.is_some()).collect();
    let aside: Vec<(&Cell, &String, SetAside)> = run.iter().flat_map(|c| c.set_aside.iter().map(move |(k, w)| (*c, k, *w))).collect();
    if !aside.is_empty() {
        out += &format!("\nfailures not counted as catches ({}):\n", aside.len());
        for (c, case, why) in aside {
            let ws = if c.ws == 0 { String::new() } else { format!(" ws{}", c.ws) };
            out += &format!("  {}{ws}: {case} {}\n", c.target.label(), why.says());
        }
    }
    out += &format!("\nholes ({}):\n", holes.len());
    for c in &holes {
        let ws = if c.ws == 0 { String::new() } else { format!(" --ws {}", c.ws) };
        // A hole found with cases skipped is rerun with the same cases skipped.
        let ws: String = ws + &skip.iter().map(|k| format!(" --skip {k}")).collect::<String>();
        out += &format!(
            "  {}{} ({} cases use the op; rerun: cargo xtask mutants --sweep {}{ws})\n",
            c.target.label(),
            if c.ws == 0 { String::new() } else { format!(" ws{}", c.ws) },
            c.candidates.unwrap_or(0),
            c.target.label(),
        );
    }
    out += &format!("cells caught: {}/{}\n", run.len() - holes.len(), run.len());
    out
}
