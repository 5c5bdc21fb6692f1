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

use crate::campaign::{run_cases_in, side_by_side, verdict_pool, Spec};
use crate::{bump, edit, Buf, Bug, Mutant, Shm};
use concord_core::fused::Gathered;
use concord_core::{Backend, ReduceOp, Result, Scaling, Work};
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

/// Size classes of the corrupted output, by element count: `[lo, hi)`.
pub const CLASSES: &[(&str, usize, usize)] = &[("tiny", 1, 16), ("small", 16, 4096), ("medium", 4096, 65536), ("large", 65536, usize::MAX)];

/// World sizes of the grid (the catalogue's).
pub const WORLD_SIZES: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 16];

/// The rank of `pos` in a world of `ws`; `None` where it is the same rank as another position
/// (one rank has only `first`; two have `first` and `last`; `middle` is `ws / 2` from 3 up).
pub fn rank_of(pos: &str, ws: usize) -> Option<usize> {
    match pos {
        "first" => Some(0),
        "last" => (ws > 1).then(|| ws - 1),
        "middle" => (ws > 2).then_some(ws / 2),
        _ => None,
    }
}

/// Whether no call can put `target` at world size `ws`: all_gather / gather (and the fused
/// all_gather_matmul's) outputs are `ws` times their input (so at least `ws` elements), and a recv needs a peer other than itself.
pub fn impossible(target: &Target, ws: usize) -> bool {
    let times_ws = matches!(
        target.hook,
        "all_gather_into_tensor" | "all_gather_into_tensor_out" | "all_gather_into_tensor_coalesced" | "gather" | "fused_all_gather_matmul"
    );
    (times_ws && ws >= target.class.2) || (target.hook == "recv" && ws == 1)
}

/// One sweep target: `hook:position:class`, the value of the backend option `sweep`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub hook: &'static str,
    pub pos: &'static str,
    pub class: (&'static str, usize, usize),
    /// One of [`SHAPES`]; `world` unless the target names another (`HOOK:POSITION:CLASS:SHAPE`).
    pub shape: &'static str,
}

impl Target {
    pub fn parse(s: &str) -> Option<Target> {
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
            pos: POSITIONS.iter().copied().find(|x| *x == p)?,
            class: CLASSES.iter().copied().find(|x| x.0 == c)?,
            shape,
        })
    }
    pub fn label(&self) -> String {
        if self.shape == "world" {
            format!("{}:{}:{}", self.hook, self.pos, self.class.0)
        } else {
            format!("{}:{}:{}:{}", self.hook, self.pos, self.class.0, self.shape)
        }
    }
    /// A subgroup cell: one per target, over every world size (its `ws` is 0).
    pub fn in_groups(&self) -> bool {
        self.shape != "world"
    }
}

/// The target of this worker process (a worker hosts one world, of one mutant).
static TARGET: OnceLock<Target> = OnceLock::new();

/// Called by [`Mutant`]'s init with the `sweep` option.
pub fn set_target(option: Option<&str>) -> std::result::Result<(), String> {
    let s = option.ok_or("the sweep mutant needs the option `sweep=<hook>:<position>:<class>`")?;
    let t = Target::parse(s).ok_or_else(|| format!("bad sweep target `{s}` (hooks {HOOKS:?}, positions {POSITIONS:?})"))?;
    let _ = TARGET.set(t);
    Ok(())
}

/// The sweep's maker (the catalogue's `MakeBug` for the name `sweep`).
pub fn make() -> Box<dyn Bug> {
    Box::new(Corrupt { t: TARGET.get().cloned() })
}

/// The bug: the last element of `hook`'s output is wrong on the rank at `pos`, for outputs of
/// the size class. Every other call is the correct shm call.
pub struct Corrupt {
    t: Option<Target>,
}

impl Corrupt {
    fn on(&self, hook: &str) -> bool {
        self.t.as_ref().is_some_and(|t| t.hook == hook)
    }
    /// Whether this rank's output is corrupted (`root`: the rooted ops corrupt only the root).
    /// Positions are the communicator's. A `world` target never corrupts a subgroup's calls (its
    /// rank 1 of 2 is not the world's last rank; a cell is labelled with the world size); a
    /// subgroup target corrupts only calls on a group of its shape.
    fn here(&self, s: &Shm, root: Option<usize>) -> bool {
        let Some(t) = &self.t else { return false };
        let me = s.rank();
        let shape_ok = if t.in_groups() { has_shape(t.shape, &s.members, s.world_size) } else { !s.in_subgroup() };
        shape_ok && rank_of(t.pos, s.ws()) == Some(me) && root.is_none_or(|r| r == me)
    }
    fn class(&self) -> (usize, usize) {
        self.t.as_ref().map_or((0, 0), |t| (t.class.1, t.class.2))
    }
    /// `w` with the last element of its output made wrong, when it is in the class.
    fn one(&self, s: &Shm, hook: &str, root: Option<usize>, w: Work<Buf>) -> Work<Buf> {
        if !self.on(hook) || !self.here(s, root) {
            return w;
        }
        let (lo, hi) = self.class();
        s.then(w, move |be, out| corrupt(be, out, lo, hi))
    }
    /// The last buffer of a coalesced call's outputs.
    fn many(&self, s: &Shm, hook: &str, w: Work<Vec<Buf>>) -> Work<Vec<Buf>> {
        if !self.on(hook) || !self.here(s, None) {
            return w;
        }
        let (lo, hi) = self.class();
        s.then(w, move |be, outs| outs.last().map_or(Ok(()), |out| corrupt(be, out, lo, hi)))
    }
}

fn corrupt(be: &ShmBackend, out: &Buf, lo: usize, hi: usize) -> Result<()> {
    let n: usize = be.buffer_shape(out).iter().product();
    if n < lo || n >= hi {
        return Ok(());
    }
    edit(be, out, |t| bump(t, n - 1))
}

impl Bug for Corrupt {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.one(s, "all_reduce", None, s.inner.all_reduce(x, op)?))
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        Ok(self.one(s, "all_reduce_", None, s.inner.all_reduce_(x, op)?))
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        Ok(self.many(s, "all_reduce_coalesced", s.inner.all_reduce_coalesced(xs, op)?))
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
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
        let (lo, hi) = self.class();
        Ok(m.s.then(w, move |be, (_, outs)| outs.last().map_or(Ok(()), |out| corrupt(be, out, lo, hi))))
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

/// One cell's result.
#[derive(Clone, Debug)]
pub struct Cell {
    pub target: Target,
    /// The world size; 0 for a subgroup cell (every world size).
    pub ws: usize,
    /// `None`: not applicable (a position that is an earlier one's rank at this world size, or a
    /// cell no call can reach: [`impossible`]).
    pub candidates: Option<usize>,
    pub cases_run: usize,
    /// The first failing case (without the `sweep::` prefix); `None` with candidates: a hole.
    pub caught: Option<String>,
    pub elapsed: Duration,
}

/// The spec of `target` (one entry per target: its option keys the worlds apart).
pub fn spec(target: &Target) -> Spec {
    let entry = BackendEntry::new::<Mutant>("sweep", 0, concord_suites::catalogue::<Mutant>)
        .with_option("mutant", "sweep")
        .with_option("sweep", &target.label())
        .with_rerun(format!("cargo xtask mutants --sweep {} --case", target.label()));
    Spec {
        name: "sweep",
        clause: "values.sizes",
        what: "one wrong element, by hook × position × size × world size",
        catchers: &[],
        entry,
        make,
    }
}

/// The entry a worker process of any sweep target is served by (the target comes with the
/// world's options): add it to the entries of `dispatch_child`.
pub fn worker_entry() -> BackendEntry {
    spec(&all_targets()[0]).entry
}

/// The cases a cell runs: the world size's cases that use the hook (a subgroup cell: the cases of
/// every world size that may make groups, [`makes_groups`], the group grid's first), in catalogue
/// order, except that for the medium and large classes the cases made of larger buffers (the size ladder,
/// `::large` cases, random programs, fused ops) come first (a cell ends at its first failure;
/// the matrix's small shapes cannot catch those classes).
pub fn cell_cases(cases: &[CaseInfo], target: &Target, ws: usize) -> Vec<CaseInfo> {
    let mut v: Vec<&CaseInfo> = cases
        .iter()
        .filter(|c| {
            let here = if target.in_groups() { c.world_size > 1 && makes_groups(c) } else { c.world_size == ws };
            here && uses(c, target.hook)
        })
        .collect();
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
    let mut cases = spec(&targets[0]).entry.cases();
    cases.retain(|c| !skip.iter().any(|k| c.id.contains(k.as_str())));
    let work: Vec<(Target, usize)> = targets
        .iter()
        .flat_map(|t| if t.in_groups() { vec![(t.clone(), 0)] } else { sizes.iter().map(|&ws| (t.clone(), ws)).collect() })
        .collect();
    let pool = verdict_pool();
    let cells = side_by_side(
        work,
        jobs,
        |(t, ws)| {
            let started = Instant::now();
            let unreachable = if t.in_groups() { impossible_in_groups(&t) } else { rank_of(t.pos, ws).is_none() || impossible(&t, ws) };
            let (candidates, cases_run, caught) = if unreachable {
                (None, 0, None)
            } else {
                match cell_cases(&cases, &t, ws) {
                    // No case of this world size calls the op: a hole, nothing to run.
                    run if run.is_empty() => (Some(0), 0, None),
                    run => {
                        let n = run.len();
                        let f = run_cases_in(&pool, &spec(&t), run);
                        (Some(n), f.cases_run, f.caught.map(|c| c.case))
                    }
                }
            };
            Cell { target: t, ws, candidates, cases_run, caught, elapsed: started.elapsed() }
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
                v.push(Target { hook: h, pos: p, class: *c, shape });
            }
        }
    }
    v
}

/// The grid: one table per hook, a row per (position, class), a column per world size (world
/// cells) or per subgroup shape (subgroup cells, every world size); `ok` caught, `HOLE` not, `-`
/// not applicable, `.` not run. Then the holes, and the count.
pub fn render(cells: &[Cell], sizes: &[usize], skip: &[String]) -> String {
    let mut out = String::new();
    let mut holes = Vec::new();
    let shapes: Vec<&str> = SHAPES.iter().copied().filter(|s| *s != "world").collect();
    for h in HOOKS {
        for grouped in [false, true] {
            let mine: Vec<&Cell> = cells.iter().filter(|c| c.target.hook == *h && c.target.in_groups() == grouped).collect();
            if mine.is_empty() {
                continue;
            }
            let columns: Vec<(String, usize, &str)> = if grouped {
                shapes.iter().map(|s| (s.to_string(), 0, *s)).collect()
            } else {
                sizes.iter().map(|&ws| (format!("ws{ws}"), ws, "world")).collect()
            };
            out += &format!("\n{h}{}\n{:<16}", if grouped { " (subgroups, any world size)" } else { "" }, "position:class");
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
                        let mark = match c {
                            None => ".",
                            Some(c) if c.candidates.is_none() => "-",
                            Some(c) if c.caught.is_some() => "ok",
                            Some(c) => {
                                holes.push((*c).clone());
                                "HOLE"
                            }
                        };
                        out += &format!(" {mark:>w$}");
                    }
                    out += "\n";
                }
            }
        }
    }
    let run: Vec<&Cell> = cells.iter().filter(|c| c.candidates.is_some()).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_the_group_layouts() {
        // The world, and a group as large as it in its order, are `world` only.
        assert!(has_shape("world", &[0, 1, 2], 3));
        assert!(!SHAPES[1..].iter().any(|g| has_shape(g, &[0, 1, 2], 3)));
        assert!(has_shape("strided", &[0, 2, 4, 6], 7) && !has_shape("no_zero", &[0, 2, 4, 6], 7));
        assert!(has_shape("strided", &[1, 3, 5], 7) && has_shape("no_zero", &[1, 3, 5], 7));
        assert!(has_shape("unsorted", &[6, 1, 4], 7) && has_shape("no_zero", &[6, 1, 4], 7) && !has_shape("strided", &[6, 1, 4], 7));
        assert!(has_shape("unsorted", &[2, 1, 0], 3), "a reversed world is unsorted");
        assert!(has_shape("singleton", &[3], 7) && !has_shape("singleton", &[0], 1));
        assert!(!has_shape("no_zero", &[4], 7), "a singleton is its own shape");
        assert!(!has_shape("strided", &[0, 1, 2], 7) && !has_shape("unsorted", &[0, 1, 2], 7));
    }

    #[test]
    fn targets_parse_with_and_without_a_shape() {
        let t = Target::parse("all_reduce:middle:small").expect("world target");
        assert_eq!((t.shape, t.label().as_str()), ("world", "all_reduce:middle:small"));
        let g = Target::parse("gather:first:tiny:unsorted").expect("group target");
        assert!(g.in_groups() && g.label() == "gather:first:tiny:unsorted");
        assert!(Target::parse("gather:first:tiny:ring").is_none());
        assert!(Target::parse("gather:first:tiny:unsorted:x").is_none());
        assert_eq!(targets_of("strided").len(), HOOKS.len() * POSITIONS.len() * CLASSES.len());
        assert!(impossible_in_groups(&Target::parse("all_reduce:middle:tiny:singleton").unwrap()));
        assert!(impossible_in_groups(&Target::parse("recv:first:tiny:singleton").unwrap()));
        assert!(!impossible_in_groups(&Target::parse("recv:first:tiny:strided").unwrap()));
    }
}
