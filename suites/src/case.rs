//! The case model: a named body every rank of a world runs, and what it may end in.

use concord_core::{Backend, CollectiveError, WorldInfo};
use concord_harness::outcome::Outcome;
use concord_store::Store;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What the report's matrix needs to know about a case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CaseMeta {
    /// `matrix`, `seed`, `async`, `reuse`, `bad_input`, `subgroup`.
    pub suite: String,
    pub op: String,
    pub variant: String,
    pub dtype: String,
    pub reduce: String,
}

/// How a case body ends early.
#[derive(Debug)]
pub enum CaseEnd {
    Fail(String),
    Unsupported(String),
    Skip(String),
}

impl From<CollectiveError> for CaseEnd {
    fn from(e: CollectiveError) -> Self {
        CaseEnd::Fail(format!("collective failed: {e} [{}]", e.name()))
    }
}

pub type CaseResult = Result<(), CaseEnd>;

pub type Body<B> = Arc<dyn Fn(&mut Ctx<'_, B>) -> CaseResult + Send + Sync>;

/// What a case spends its time on, for scheduling only (conformance mode and nextest groups run
/// the same cases either way): stall-bound cases start first, on lanes of their own beside the
/// CPU-bound ones (a lane that sleeps costs no core); heavy cases start first on the CPU lanes,
/// so the run does not end on one long case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Load {
    /// Mostly waiting: a deliberate sleep, a stall, a deadline that must pass (seconds of wall
    /// time, little CPU).
    Stall,
    /// Long and CPU- or memory-bound (a 64 MiB buffer, a large fused op at 8 ranks).
    Heavy,
    /// Everything else (milliseconds).
    #[default]
    Light,
}

thread_local! {
    /// [`building_for_world_size`]'s hint on this thread: `None`, every world size is wanted.
    static ONLY_WORLD_SIZE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `build` (a catalogue function) with the hint that only the cases of `ws` ranks will be
/// kept: the generators that ask [`wanted_world_size`] skip the other sizes before naming them.
/// Every case of `ws` ranks is still built, and the caller still filters by `world_size` (a
/// generator that does not ask builds everything, as without the hint). A worker builds its
/// catalogue at every world's spawn and keeps only its own size's cases: the whole catalogue was
/// about half of a rank's CPU up to `Ready` (helper main15).
pub fn building_for_world_size<T>(ws: usize, build: impl FnOnce() -> T) -> T {
    struct Reset(Option<usize>);
    impl Drop for Reset {
        fn drop(&mut self) {
            ONLY_WORLD_SIZE.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(ONLY_WORLD_SIZE.with(|c| c.replace(Some(ws))));
    build()
}

/// Whether a catalogue being built on this thread keeps cases of `ws` ranks (always, unless
/// inside [`building_for_world_size`] for another size).
pub fn wanted_world_size(ws: usize) -> bool {
    ONLY_WORLD_SIZE.with(|c| c.get().is_none_or(|only| only == ws))
}

/// One conformance case, generic over the backend.
pub struct Case<B: Backend> {
    /// Name without the backend prefix, e.g. `all_reduce::out::f32::sum::ws4`.
    pub name: String,
    pub meta: CaseMeta,
    pub world_size: usize,
    pub deadline: Duration,
    /// A fresh world for this case alone.
    pub isolated: bool,
    /// Backend options of this case's world, after the backend entry's own (e.g. a fault hook,
    /// [`concord_core::fault`]): a case with options runs in a world of its own.
    pub options: Vec<(String, String)>,
    /// What the case spends its time on (scheduling only, see [`Load`]).
    pub load: Load,
    pub body: Body<B>,
}

impl<B: Backend> Clone for Case<B> {
    fn clone(&self) -> Self {
        Case {
            name: self.name.clone(),
            meta: self.meta.clone(),
            world_size: self.world_size,
            deadline: self.deadline,
            isolated: self.isolated,
            options: self.options.clone(),
            load: self.load,
            body: self.body.clone(),
        }
    }
}

impl<B: Backend> Case<B> {
    pub fn new(
        name: impl Into<String>,
        meta: CaseMeta,
        world_size: usize,
        body: impl Fn(&mut Ctx<'_, B>) -> CaseResult + Send + Sync + 'static,
    ) -> Self {
        Case {
            name: name.into(),
            meta,
            world_size,
            deadline: default_deadline(),
            isolated: false,
            options: Vec::new(),
            load: Load::Light,
            body: Arc::new(body),
        }
    }
    pub fn isolated(mut self) -> Self {
        self.isolated = true;
        self
    }
    /// Marks the case as mostly waiting (see [`Load::Stall`]).
    pub fn stall_bound(mut self) -> Self {
        self.load = Load::Stall;
        self
    }
    /// Marks the case as long and CPU- or memory-bound (see [`Load::Heavy`]).
    pub fn heavy(mut self) -> Self {
        self.load = Load::Heavy;
        self
    }
    /// Adds a backend option to this case's world (see [`Case::options`]).
    pub fn with_option(mut self, key: &str, value: &str) -> Self {
        self.options.push((key.to_string(), value.to_string()));
        self
    }
}

/// Per-case deadline: `CONCORD_CASE_TIMEOUT_MS`, else 20 s (a conformance case that needs longer
/// is itself a finding). See [`concord_harness::config`] for the deadline rule.
pub fn default_deadline() -> Duration {
    concord_harness::config::Config::global().case_deadline
}

static REGISTERED_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Called once by the worker: the name the backend is registered under (the case-id prefix).
pub(crate) fn set_registered_name(name: &str) {
    let _ = REGISTERED_NAME.set(name.to_string());
}

static WORLD: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

/// Called once per worker by `run::init_state`: this process's rank and world size in its world,
/// for [`axes`] to tell a subgroup communicator's rank and size from the world's.
pub(crate) fn set_world(rank: usize, world_size: usize) {
    let _ = WORLD.set((rank, world_size));
}

/// The op as a failure's `op=` writes it: the [`concord_core::OpKind`] name, never the `Backend`
/// method that issued it (`all_reduce_`, `all_reduce_coalesced_`, `reduce_scatter_tensor_out`: the
/// `variant=` says in place, coalesced or into a given buffer), so one grep finds every failure of
/// an op. A name that is no method of an op is written as it is.
pub fn op_label(op: &str) -> &str {
    let base = op.trim_end_matches('_');
    let base = base.strip_suffix("_coalesced").or_else(|| base.strip_suffix("_out")).unwrap_or(base);
    if concord_core::OpKind::from_name(base).is_some() {
        base
    } else {
        op
    }
}

/// The where-line that opens every failure message: `backend= op= variant= dtype= world_size=
/// rank=` (the brief's rule: a failure names them all; `-` for an axis the call does not have).
/// The one builder of it: hand-written checks through [`crate::suites::util::here`], the value
/// check through `values::where_str`, the quiescence check and the runner's verdicts (a timeout, a
/// crash) through `run::case_axes`. `op` is written as [`op_label`] writes it. When `rank` and
/// `world_size` are not this process's in its world (a check on a subgroup communicator, whose
/// `rank` and `world_size` are the group's), the world's follow, so a reader never takes a group
/// rank for a world rank.
pub fn axes(backend: &str, op: &str, variant: &str, dtype: &str, world_size: usize, rank: usize) -> String {
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    let mut s = format!(
        "backend={backend} op={} variant={} dtype={} world_size={world_size} rank={rank}",
        dash(op_label(op)),
        dash(variant),
        dash(dtype)
    );
    if let Some(&(wr, wws)) = WORLD.get().filter(|&&w| w != (rank, world_size)) {
        s.push_str(&format!(" (on a group: world_size and rank are the group's; world_rank={wr} world_world_size={wws})"));
    }
    s
}

/// The where-line's fault axis, beside [`axes`]: `fault=<the option's value>` (as
/// `CONCORD_BACKEND_OPTS` would carry it: `alloc_output:fail@1#1~3000`), or `fault=none` for a
/// case run without one. One place, so no where-line prints a Rust `Some("...")` (review24).
pub fn fault_axis(f: Option<&concord_core::fault::Fault>) -> String {
    match f {
        Some(f) => format!("fault={}", f.option().1),
        None => "fault=none".to_string(),
    }
}

/// [`axes`] of a case from its meta alone (a verdict the runner reached, the quiescence check: no
/// check wrote a where-line): its op, variant and dtype; a bad-input row, whose meta names the row
/// (the report's line), by the call it makes (`bad_input::call_of`).
pub fn case_axes(backend: &str, meta: &CaseMeta, world_size: usize, rank: usize) -> String {
    if meta.suite == "bad_input" && concord_core::OpKind::from_name(op_label(&meta.op)).is_none() {
        let (op, variant, dtype) = crate::suites::bad_input::call_of(&meta.op);
        if op != "-" {
            return axes(backend, op, variant, dtype, world_size, rank);
        }
    }
    axes(backend, &meta.op, &meta.variant, &meta.dtype, world_size, rank)
}

/// The backend's name as failure messages write it (`backend=<name>`): the name it is registered
/// under — the prefix of every case id and the name in the report — so messages, ids and report
/// agree even when `Backend::name()` says something else (a wrapper reporting its inner
/// backend's name); outside a worker, `Backend::name()`.
pub fn backend_label<B: Backend>(b: &B) -> String {
    REGISTERED_NAME.get().cloned().unwrap_or_else(|| b.name().to_string())
}

/// What a case body sees on one rank.
pub struct Ctx<'a, B: Backend> {
    pub b: &'a B,
    pub world: &'a WorldInfo,
    /// Full case name with backend prefix (for rerun hints).
    pub case: &'a str,
    /// Deadline for one wait inside the case.
    pub timeout: Duration,
    pub groups: &'a mut HashMap<Vec<usize>, Option<B>>,
    pub store: &'a Store,
}

impl<'a, B: Backend> Ctx<'a, B> {
    pub fn rank(&self) -> usize {
        self.b.rank()
    }
    pub fn world_size(&self) -> usize {
        self.b.world_size()
    }
    /// The communicator over `ranks` (created once per world, cached). `None` on non-members.
    pub fn group(&mut self, ranks: &[usize]) -> Result<Option<&B>, CaseEnd> {
        if !self.groups.contains_key(ranks) {
            // A backend that declares no subgroups may refuse every new_group: a case that needs
            // one is UNSUPPORTED (whatever it checks besides), on every rank alike.
            if !self.b.capabilities().subgroups {
                return Err(CaseEnd::Unsupported(format!(
                    "declared gap: the case needs the subgroup {ranks:?}, and the backend declares subgroups = false"
                )));
            }
            let g = self.b.new_group(ranks)?;
            self.groups.insert(ranks.to_vec(), g);
        }
        Ok(self.groups.get(ranks).and_then(|g| g.as_ref()))
    }

    /// Every group of `groups` made (`new_group` is collective: every rank makes every group, in
    /// the same order), then this rank's groups with their communicators, each checked to give
    /// this rank its position in the group and the group's size (a named failure otherwise).
    pub fn layout<'g>(&mut self, groups: &[&'g [usize]]) -> Result<Vec<(&'g [usize], &B)>, CaseEnd> {
        for g in groups {
            self.group(g)?;
        }
        let (me, ws, b) = (self.rank(), self.world_size(), self.b);
        let mine: Vec<(&'g [usize], &B)> =
            groups.iter().filter_map(|g| self.groups.get(*g).and_then(|x| x.as_ref()).map(|sub| (*g, sub))).collect();
        for (g, sub) in &mine {
            let want = g.iter().position(|&r| r == me);
            if want != Some(sub.rank()) || sub.world_size() != g.len() {
                return Err(CaseEnd::Fail(format!(
                    "backend={} op=new_group world_size={ws} rank={me}: group {g:?} gave rank {} of {}, expected {want:?} of {}",
                    backend_label(b),
                    sub.rank(),
                    sub.world_size(),
                    g.len()
                )));
            }
        }
        Ok(mine)
    }
}

/// Value checks this rank skipped during the running case because the backend declares
/// `Capabilities::moves_data = false` (a worker runs one case at a time; [`run::run_body`] resets
/// it before each body).
///
/// [`run::run_body`]: crate::run::run_body
static VALUES_UNCHECKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Notes that a value, untouched-input or guard check was skipped because the backend declares
/// it moves no data: the case then ends UNSUPPORTED, never PASSED (a check that did not run
/// proved nothing).
pub fn note_values_unchecked() {
    VALUES_UNCHECKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The number of skipped value checks noted since the last call (and resets it).
pub(crate) fn take_values_unchecked() -> usize {
    VALUES_UNCHECKED.swap(0, std::sync::atomic::Ordering::Relaxed)
}

/// A case body's `Ok` when `skipped` value checks were left out for `moves_data = false`:
/// UNSUPPORTED with the reason.
pub(crate) fn unchecked_is_unsupported(r: CaseResult, skipped: usize) -> CaseResult {
    match r {
        Ok(()) if skipped > 0 => Err(CaseEnd::Unsupported(format!(
            "the backend declares it moves no data (Capabilities::moves_data = false): {skipped} value check(s) of this case \
             were skipped on this rank, so it cannot pass"
        ))),
        r => r,
    }
}

/// The declaration that makes a case's call unsupported, as its UNSUPPORTED message says it:
/// `Some` when `meta` names one call (an op, and a variant, dtype and reduce op where it names
/// one each) that `caps` declares unsupported. A meta that names several dtypes or reduce ops (a
/// case mixing calls: it skips its declared gaps itself), or an op that is no [`concord_core::OpKind`], names
/// no call. The suite `caps` is never gated: its cases read the declarations themselves (and
/// check that the declared gaps are refused).
///
/// A declared gap excuses the call it names only, never a different clause's check: a case that
/// merely carries its check on a call (the fault cases' all_reduce, async's) names every call it
/// may carry it on (`sum,max,min,product`) and picks one the backend supports, so a narrow gap on
/// one vehicle does not skip the case; it is gated only when every one of them is a gap. (A
/// variant or dtype list, `inplace,out`, names no one call: such a case gates itself.)
pub fn declared_gap(caps: &concord_core::Capabilities, meta: &CaseMeta) -> Option<String> {
    use concord_core::{DType, OpKind, ReduceOp, Variant};
    if meta.suite == "caps" {
        return None;
    }
    let op = OpKind::from_name(&meta.op)?;
    let variant = Variant::from_name(&meta.variant);
    let dtype = match meta.dtype.as_str() {
        "" | "-" => None,
        d => Some(DType::from_name(d)?),
    };
    // A list of reduce ops (`sum,max,min`: a case that carries its check on any one of them,
    // picking one the backend supports) is gated only when every one is a declared gap.
    if meta.reduce.contains(',') {
        let ops = meta.reduce.split(',').map(ReduceOp::from_name).collect::<Option<Vec<_>>>()?;
        let whys = ops
            .iter()
            .map(|&r| caps.check_call(op, variant, dtype, Some(r)).err().map(|w| format!("{r} ({w})")))
            .collect::<Option<Vec<_>>>()?;
        return Some(format!(
            "declared gap: the backend's capabilities declare {op}{}{} unsupported for every reduce op the case may use: {}",
            variant.map_or(String::new(), |v| format!(" variant={v}")),
            dtype.map_or(String::new(), |d| format!(" dtype={d}")),
            whys.join("; ")
        ));
    }
    let reduce = match meta.reduce.as_str() {
        "" | "-" => None,
        r => Some(ReduceOp::from_name(r)?),
    };
    let why = caps.check_call(op, variant, dtype, reduce).err()?;
    Some(format!(
        "declared gap: the backend's capabilities declare {op}{}{}{} unsupported ({why})",
        variant.map_or(String::new(), |v| format!(" variant={v}")),
        dtype.map_or(String::new(), |d| format!(" dtype={d}")),
        reduce.map_or(String::new(), |r| format!(" reduce={r}")),
    ))
}

/// A rank's verdict. The rerun line is added once, by the parent (`run::run_case`), not per rank.
pub(crate) fn to_outcome(r: CaseResult) -> Outcome {
    match r {
        Ok(()) => Outcome::Passed,
        Err(CaseEnd::Fail(m)) => Outcome::Failed(m),
        Err(CaseEnd::Unsupported(m)) => Outcome::Unsupported(m),
        Err(CaseEnd::Skip(m)) => Outcome::Skipped(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_label_writes_the_op_kind_not_the_method() {
        for (method, op) in [
            ("all_reduce_", "all_reduce"),
            ("all_reduce_coalesced", "all_reduce"),
            ("all_reduce_coalesced_", "all_reduce"),
            ("reduce_scatter_tensor_out", "reduce_scatter_tensor"),
            ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor"),
            ("all_gather_into_tensor_out", "all_gather_into_tensor"),
            ("broadcast_", "broadcast"),
            ("send_recv", "send_recv"),
            ("new_group", "new_group"),
            ("fused_all_gather_matmul", "fused_all_gather_matmul"),
        ] {
            assert_eq!(op_label(method), op, "{method}");
        }
    }

    /// The where-line of a verdict the runner reached (a timeout, a crash) or of the quiescence
    /// check, from a case's meta: a bad-input row's meta names the row (the report's line); the
    /// line names the call it makes. (The parent process has no world: no group note.)
    #[test]
    fn case_axes_name_a_bad_input_rows_call() {
        let row =
            CaseMeta { suite: "bad_input".into(), op: "all_reduce_shape_mismatch".into(), variant: "-".into(), ..CaseMeta::default() };
        assert_eq!(case_axes("shm", &row, 2, 1), "backend=shm op=all_reduce variant=out dtype=f32 world_size=2 rank=1");
        let p2p = CaseMeta { suite: "bad_input".into(), op: "send_recv_dtype_mismatch".into(), variant: "-".into(), ..CaseMeta::default() };
        assert_eq!(case_axes("shm", &p2p, 2, 0), "backend=shm op=send_recv variant=outbuf dtype=f32 (recv i32) world_size=2 rank=0");
        let faults = CaseMeta { suite: "faults".into(), op: "all_reduce_".into(), variant: "inplace".into(), ..CaseMeta::default() };
        assert_eq!(case_axes("shm", &faults, 4, 3), "backend=shm op=all_reduce variant=inplace dtype=- world_size=4 rank=3");
    }
}
