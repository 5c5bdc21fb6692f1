//! # concord-example-p2pcoll
//!
//! **One job:** a collective backend written *outside* Concord, shaped like Gloo and most
//! custom CPU libraries: every collective is an algorithm over point-to-point messages, with
//! its own index arithmetic, run against the whole conformance catalogue.
//!
//! * **Transport:** the shm backend's buffers and its send / recv only. User send / recv go to
//!   the communicator's shm instance; the collectives' own messages go to a second shm
//!   communicator over the same ranks (`new_group(all)` at init, and inside every subgroup), so
//!   user traffic and internal traffic never share a channel.
//! * **Algorithms** (`algo.rs`): all_reduce = ring reduce-scatter + ring all-gather (chunks of
//!   `count / ws`, the first `count % ws` one element longer); reduce_scatter = the ring
//!   reduce-scatter shifted so rank r owns chunk r; all_gather = ring; all_to_all = pairwise
//!   (step s: to `me + s`, from `me - s`); broadcast = binomial tree over virtual ranks
//!   `(rank - root) mod ws`, pipelined in segments of 8192 elements; reduce = binomial tree to
//!   the root; gather / scatter = linear; permute = one exchange; coalesced = one op per tensor;
//!   barrier = the call-description exchange every op starts with (a direct all-to-all: no rank
//!   leaves it before every rank entered).
//! * **Validation:** every op starts by exchanging its [`CallDesc`] with every peer and checks
//!   all of them with the core rule table ([`validate_all`]): bad input is the same named error
//!   on every rank, and the communicator stays usable.
//! * **Reductions** (`reduce.rs`) on host tensors: partials travel as f64 (floats) or i64 bits
//!   (integers) and are narrowed once at the end, so f16 / bf16 round once (declared
//!   `ExactThenRound`) and integer avg divides the sum wrapped to the dtype.
//! * **Asynchrony:** issue queues the op on the communicator's worker thread (ops run in issue
//!   order) and returns a [`Work`] that completes through a [`Flag`]. A failure other than bad
//!   input poisons the communicator (later ops fail with `aborted`): its internal messages may
//!   be out of step.
//! * **Not provided (declared):** fault-injection hooks (the fault suites are UNSUPPORTED); the
//!   fused ops are the trait's decompositions over these collectives.
//!
//! Bugs: option `p2pcoll_bug=<name>` ([`bugs::Bug`]) builds the backend with one realistic bug.
#![forbid(unsafe_code)]

mod algo;
pub mod bugs;
mod reduce;

use algo::Exec;
use bugs::Bug;
use concord_core::{
    progress, validate_all, Backend, CallDesc, CallOp, Capabilities, CollectiveError, Flag, OutstandingCounter, ReduceOp, Result,
    TensorDesc, Variant, Work, WorkMeta, WorldInfo,
};
use concord_shm::ShmBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Buf = <ShmBackend as Backend>::Buffer;

/// The option that selects a bug.
pub const BUG_OPTION: &str = "p2pcoll_bug";

/// What the backend declares (and validates calls against).
fn caps() -> Capabilities {
    Capabilities::full(concord_shm::MAX_WORLD_SIZE)
}

enum Kind {
    AllReduce {
        xs: Vec<Buf>,
        outs: Vec<Buf>,
        op: ReduceOp,
    },
    AllGather {
        xs: Vec<Buf>,
        outs: Vec<Buf>,
    },
    ReduceScatter {
        xs: Vec<Buf>,
        outs: Vec<Buf>,
        op: ReduceOp,
    },
    AllToAll {
        x: Buf,
        out: Buf,
    },
    Broadcast {
        x: Buf,
        out: Buf,
        root: usize,
    },
    Permute {
        x: Buf,
        out: Buf,
        perm: Vec<usize>,
    },
    Reduce {
        x: Buf,
        out: Buf,
        op: ReduceOp,
        root: usize,
    },
    Gather {
        x: Buf,
        out: Buf,
        root: usize,
    },
    Scatter {
        x: Buf,
        out: Buf,
        root: usize,
    },
    Barrier,
    /// Only the call's validation: the group itself is made on the user's communicator after.
    NewGroup,
}

struct Job {
    name: String,
    seq: u64,
    desc: CallDesc,
    kind: Kind,
    flag: Arc<Flag>,
}

/// The communicator's worker: runs its ops in issue order.
struct Worker {
    internal: Arc<ShmBackend>,
    map: Arc<Vec<usize>>,
    n: usize,
    me: usize,
    op_timeout: Duration,
    abort: Arc<AtomicBool>,
    bug: Bug,
    label: String,
    poisoned: Option<String>,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let outcome = match &self.poisoned {
                Some(why) => Err(CollectiveError::Aborted(format!("{} #{} on rank {}: {why}", job.name, job.seq, self.me))),
                None => {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(&job))).unwrap_or_else(|p| {
                        Err(CollectiveError::Backend(format!("p2pcoll worker panicked in {} #{}: {}", job.name, job.seq, panic_text(&p))))
                    });
                    if let Err(e) = &r {
                        if !matches!(e, CollectiveError::BadInput { .. }) {
                            self.poisoned = Some(format!("an earlier op ({} #{}) failed: {e}", job.name, job.seq));
                        }
                    }
                    r
                }
            };
            job.flag.set(outcome);
            progress::end(&self.label, job.seq);
        }
    }

    fn execute(&self, job: &Job) -> Result<()> {
        let started = Instant::now();
        let ex = Exec {
            c: self.internal.clone(),
            map: self.map.clone(),
            n: self.n,
            me: self.me,
            started,
            deadline: started + self.op_timeout,
            abort: self.abort.clone(),
            bug: self.bug,
            name: job.name.clone(),
            seq: job.seq,
        };
        let all = ex.exchange_descs(&job.desc)?;
        validate_all(&all, &caps()).map_err(|e| e.into_error(&job.name, job.seq, self.me))?;
        let c = &self.internal;
        let shape = |b: &Buf| c.buffer_shape(b);
        match &job.kind {
            Kind::AllReduce { xs, outs, op } => {
                for (x, o) in xs.iter().zip(outs) {
                    let r = ex.all_reduce(&c.download(x)?, *op)?;
                    c.write(o, &r)?;
                }
            }
            Kind::AllGather { xs, outs } => {
                for (x, o) in xs.iter().zip(outs) {
                    let r = ex.all_gather(&c.download(x)?, &shape(o))?;
                    c.write(o, &r)?;
                }
            }
            Kind::ReduceScatter { xs, outs, op } => {
                for (x, o) in xs.iter().zip(outs) {
                    let r = ex.reduce_scatter(&c.download(x)?, *op, &shape(o))?;
                    c.write(o, &r)?;
                }
            }
            Kind::AllToAll { x, out } => {
                let d = &all[self.me];
                let r = ex.all_to_all(&c.download(x)?, &d.input_splits(self.n), &d.output_splits(self.n), &shape(out))?;
                c.write(out, &r)?;
            }
            Kind::Broadcast { x, out, root } => {
                let r = ex.broadcast(&c.download(x)?, *root)?;
                c.write(out, &r)?;
            }
            Kind::Permute { x, out, perm } => {
                let r = ex.permute(&c.download(x)?, perm)?;
                c.write(out, &r)?;
            }
            Kind::Reduce { x, out, op, root } => {
                if let Some(r) = ex.reduce(&c.download(x)?, *op, *root)? {
                    c.write(out, &r)?;
                }
            }
            Kind::Gather { x, out, root } => {
                if let Some(r) = ex.gather(&c.download(x)?, *root, &shape(out))? {
                    c.write(out, &r)?;
                }
            }
            Kind::Scatter { x, out, root } => {
                let r = ex.scatter(&c.download(x)?, *root, &shape(out))?;
                c.write(out, &r)?;
            }
            Kind::Barrier | Kind::NewGroup => {}
        }
        Ok(())
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "?".into())
}

/// The backend (one instance per rank and per subgroup).
pub struct P2pColl {
    /// Buffers and the user's send / recv.
    user: Arc<ShmBackend>,
    /// The internal channel and this communicator's ranks in it (identity but under the bug
    /// `groups_share_world_channel`, where a subgroup uses the world's).
    internal: Arc<ShmBackend>,
    map: Arc<Vec<usize>>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    seq: Mutex<u64>,
    counter: OutstandingCounter,
    abort: Arc<AtomicBool>,
    bug: Bug,
    label: String,
    op_timeout: Duration,
}

impl P2pColl {
    /// `parent`: the parent communicator's internal channel and this group's ranks in it (a
    /// subgroup; used only under the bug `groups_share_world_channel`).
    fn start(
        user: ShmBackend,
        bug: Bug,
        op_timeout: Duration,
        label: String,
        parent: Option<(Arc<ShmBackend>, Vec<usize>)>,
    ) -> Result<P2pColl> {
        let user = Arc::new(user);
        let n = user.world_size();
        let all: Vec<usize> = (0..n).collect();
        let (internal, map) = match parent {
            Some((world, map)) if bug == Bug::GroupsShareWorldChannel => (world, map),
            _ if bug == Bug::SharedP2pChannel => (user.clone(), all),
            _ => (
                Arc::new(
                    user.new_group(&all)?
                        .ok_or_else(|| CollectiveError::Backend("p2pcoll: the internal group left this rank out".into()))?,
                ),
                all,
            ),
        };
        let map = Arc::new(map);
        let abort = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            internal: internal.clone(),
            map: map.clone(),
            n,
            me: user.rank(),
            op_timeout,
            abort: abort.clone(),
            bug,
            label: label.clone(),
            poisoned: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("p2pcoll-{label}"))
            .spawn(move || worker.run(rx))
            .map_err(|e| CollectiveError::Backend(format!("p2pcoll: cannot start the worker thread: {e}")))?;
        Ok(P2pColl {
            user,
            internal,
            map,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            seq: Mutex::new(0),
            counter: OutstandingCounter::default(),
            abort,
            bug,
            label,
            op_timeout,
        })
    }

    /// The call's description: tensors, and whether an output overlaps an input (or another
    /// output) other than as the very buffer of an in-place op.
    fn desc(&self, op: CallOp, variant: Variant, ins: &[&Buf], outs: &[&Buf]) -> CallDesc {
        let u = &self.user;
        let td = |b: &Buf| TensorDesc::new(u.buffer_dtype(b), &u.buffer_shape(b));
        let span = |b: &Buf| {
            let a = u.buffer_addr(b);
            let len = u.buffer_shape(b).iter().product::<usize>() * u.buffer_dtype(b).size();
            (a, a + len)
        };
        let overlaps = |a: &Buf, b: &Buf| {
            let ((a0, a1), (b0, b1)) = (span(a), span(b));
            a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
        };
        let mut d = CallDesc::new(op, variant, self.user.rank());
        d.inputs = ins.iter().map(|b| td(b)).collect();
        if variant == Variant::OutBuf {
            d.outputs = outs.iter().map(|b| td(b)).collect();
        }
        let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
        d.aliased = outs.iter().enumerate().any(|(i, o)| {
            ins.iter().enumerate().any(|(j, x)| overlaps(o, x) && !(in_place && i == j && span(o) == span(x)))
                || outs[i + 1..].iter().any(|o2| overlaps(o, o2))
        });
        d
    }

    fn issue<T>(&self, name: &str, mut desc: CallDesc, kind: Kind, value: T) -> Result<Work<T>> {
        let flag = Flag::new();
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        desc.seq = *seq;
        progress::begin(&self.label, name, *seq);
        let job = Job { name: name.to_string(), seq: *seq, desc, kind, flag: flag.clone() };
        let sent = self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|tx| tx.send(job).is_ok()).unwrap_or(false);
        if !sent {
            progress::end(&self.label, *seq);
            return Err(CollectiveError::Aborted(format!("p2pcoll {name} #{}: the worker thread is gone", *seq)));
        }
        let meta = WorkMeta { backend: "p2pcoll".into(), op: name.to_string(), seq: *seq, rank: self.user.rank() };
        Ok(Work::new(value, flag, meta, &self.counter))
    }

    fn gathered_shape(&self, x: &Buf) -> Vec<usize> {
        let n = self.world_size();
        let s = self.user.buffer_shape(x);
        match s.split_first() {
            None => vec![n],
            Some((d0, rest)) => std::iter::once(d0 * n).chain(rest.iter().copied()).collect(),
        }
    }
    fn scattered_shape(&self, x: &Buf) -> Vec<usize> {
        let s = self.user.buffer_shape(x);
        match s.split_first() {
            None => vec![],
            Some((d0, rest)) => std::iter::once(d0 / self.world_size()).chain(rest.iter().copied()).collect(),
        }
    }
    fn alloc_like(&self, x: &Buf, shape: &[usize]) -> Result<Buf> {
        self.user.alloc(self.user.buffer_dtype(x), shape)
    }

    fn all_reduce_any(&self, name: &str, xs: &[Buf], op: ReduceOp, variant: Variant) -> Result<(CallDesc, Kind, Vec<Buf>)> {
        let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
        let outs: Vec<Buf> = if in_place {
            xs.to_vec()
        } else {
            xs.iter().map(|x| self.alloc_like(x, &self.user.buffer_shape(x))).collect::<Result<_>>()?
        };
        let _ = name;
        let mut d = self.desc(CallOp::AllReduce, variant, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
        d.reduce = Some(op);
        Ok((d, Kind::AllReduce { xs: xs.to_vec(), outs: outs.clone(), op }, outs))
    }
}

impl Drop for P2pColl {
    /// Stops the worker (a wait in progress gives up within 20 ms) and joins it.
    fn drop(&mut self) {
        self.abort.store(true, Ordering::SeqCst);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Backend for P2pColl {
    type Buffer = Buf;

    /// Joins the world over the shm backend (its options pass through, but for `fault`: this
    /// backend declares no fault hooks). Option `p2pcoll_bug=<name>` builds it with that bug.
    fn init(world: &WorldInfo) -> Result<Self> {
        let bug = Bug::parse(world.option(BUG_OPTION)).map_err(CollectiveError::Backend)?;
        let mut w = world.clone();
        w.options.retain(|(k, _)| k != BUG_OPTION && k != "fault");
        let user = ShmBackend::init(&w)?;
        P2pColl::start(user, bug, world.op_timeout, format!("p2pcoll r{}", world.rank), None)
    }
    fn name(&self) -> &str {
        "p2pcoll"
    }
    concord_core::forward!(user => rank, world_size, buffers);
    fn capabilities(&self) -> Capabilities {
        caps()
    }
    /// This communicator's collectives plus the user's sends and receives (counted by the
    /// shm instance that carries them).
    fn outstanding(&self) -> usize {
        self.counter.get() + self.user.outstanding()
    }
    /// A collective of this communicator like the others (so a new_group facing another op,
    /// or other member lists, is the same named bad input on every rank); once validated, the
    /// group is made on the user's shm communicator, with its own internal group inside.
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        let mut d = CallDesc::new(CallOp::NewGroup, Variant::Out, self.rank());
        d.group = Some(ranks.to_vec());
        self.issue("new_group", d, Kind::NewGroup, ())?.wait(self.op_timeout + Duration::from_secs(1))?;
        let Some(sub) = self.user.new_group(ranks)? else { return Ok(None) };
        let label = format!("{}[{}]", self.label, ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","));
        let in_parent = ranks.iter().map(|&r| self.map[r]).collect();
        P2pColl::start(sub, self.bug, self.op_timeout, label, Some((self.internal.clone(), in_parent))).map(Some)
    }

    fn all_reduce(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, k, mut outs) = self.all_reduce_any("all_reduce", std::slice::from_ref(x), op, Variant::Out)?;
        self.issue("all_reduce", d, k, outs.remove(0))
    }
    fn all_reduce_(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let (d, k, mut outs) = self.all_reduce_any("all_reduce_", std::slice::from_ref(x), op, Variant::InPlace)?;
        self.issue("all_reduce_", d, k, outs.remove(0))
    }
    fn all_reduce_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let (d, k, outs) = self.all_reduce_any("all_reduce_coalesced", xs, op, Variant::Coalesced)?;
        self.issue("all_reduce_coalesced", d, k, outs)
    }
    fn all_reduce_coalesced_(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let (d, k, outs) = self.all_reduce_any("all_reduce_coalesced_", xs, op, Variant::CoalescedInPlace)?;
        self.issue("all_reduce_coalesced_", d, k, outs)
    }

    fn all_gather_into_tensor(&self, x: &Buf) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.gathered_shape(x))?;
        let d = self.desc(CallOp::AllGather, Variant::Out, &[x], &[&out]);
        self.issue("all_gather_into_tensor", d, Kind::AllGather { xs: vec![x.clone()], outs: vec![out.clone()] }, out)
    }
    fn all_gather_into_tensor_out(&self, x: &Buf, out: &Buf) -> Result<Work<Buf>> {
        let d = self.desc(CallOp::AllGather, Variant::OutBuf, &[x], &[out]);
        self.issue("all_gather_into_tensor_out", d, Kind::AllGather { xs: vec![x.clone()], outs: vec![out.clone()] }, out.clone())
    }
    fn all_gather_into_tensor_coalesced(&self, xs: &[Buf]) -> Result<Work<Vec<Buf>>> {
        let outs: Vec<Buf> = xs.iter().map(|x| self.alloc_like(x, &self.gathered_shape(x))).collect::<Result<_>>()?;
        let d = self.desc(CallOp::AllGather, Variant::Coalesced, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
        self.issue("all_gather_into_tensor_coalesced", d, Kind::AllGather { xs: xs.to_vec(), outs: outs.clone() }, outs)
    }

    fn reduce_scatter_tensor(&self, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.scattered_shape(x))?;
        let mut d = self.desc(CallOp::ReduceScatter, Variant::Out, &[x], &[&out]);
        d.reduce = Some(op);
        self.issue("reduce_scatter_tensor", d, Kind::ReduceScatter { xs: vec![x.clone()], outs: vec![out.clone()], op }, out)
    }
    fn reduce_scatter_tensor_out(&self, x: &Buf, op: ReduceOp, out: &Buf) -> Result<Work<Buf>> {
        let mut d = self.desc(CallOp::ReduceScatter, Variant::OutBuf, &[x], &[out]);
        d.reduce = Some(op);
        self.issue("reduce_scatter_tensor_out", d, Kind::ReduceScatter { xs: vec![x.clone()], outs: vec![out.clone()], op }, out.clone())
    }
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        let outs: Vec<Buf> = xs.iter().map(|x| self.alloc_like(x, &self.scattered_shape(x))).collect::<Result<_>>()?;
        let mut d = self.desc(CallOp::ReduceScatter, Variant::Coalesced, &xs.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>());
        d.reduce = Some(op);
        self.issue("reduce_scatter_tensor_coalesced", d, Kind::ReduceScatter { xs: xs.to_vec(), outs: outs.clone(), op }, outs)
    }

    fn all_to_all_single(&self, x: &Buf, output_splits: Option<&[usize]>, input_splits: Option<&[usize]>) -> Result<Work<Buf>> {
        let n = self.world_size();
        let s = self.user.buffer_shape(x);
        let rows = match (output_splits, s.first()) {
            // An overflowing sum is bad input, named by validation on every rank.
            (Some(sp), _) => sp.iter().try_fold(0usize, |a, &r| a.checked_add(r)).unwrap_or(0),
            (None, Some(&d0)) => d0 / n * n,
            (None, None) => 0,
        };
        let shape: Vec<usize> = if s.is_empty() { vec![] } else { std::iter::once(rows).chain(s[1..].iter().copied()).collect() };
        let out = self.alloc_like(x, &shape)?;
        let mut d = self.desc(CallOp::AllToAll, Variant::Out, &[x], &[&out]);
        d.in_splits = input_splits.map(|v| v.to_vec());
        d.out_splits = output_splits.map(|v| v.to_vec());
        self.issue("all_to_all_single", d, Kind::AllToAll { x: x.clone(), out: out.clone() }, out)
    }

    fn broadcast(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.user.buffer_shape(x))?;
        let mut d = self.desc(CallOp::Broadcast, Variant::Out, &[x], &[&out]);
        d.root = Some(src);
        self.issue("broadcast", d, Kind::Broadcast { x: x.clone(), out: out.clone(), root: src }, out)
    }
    fn broadcast_(&self, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let mut d = self.desc(CallOp::Broadcast, Variant::InPlace, &[x], &[x]);
        d.root = Some(src);
        self.issue("broadcast_", d, Kind::Broadcast { x: x.clone(), out: x.clone(), root: src }, x.clone())
    }
    fn permute_tensor(&self, x: &Buf, src_dst: &[usize]) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.user.buffer_shape(x))?;
        let mut d = self.desc(CallOp::Permute, Variant::Out, &[x], &[&out]);
        d.perm = Some(src_dst.to_vec());
        self.issue("permute_tensor", d, Kind::Permute { x: x.clone(), out: out.clone(), perm: src_dst.to_vec() }, out)
    }
    fn reduce(&self, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.user.buffer_shape(x))?;
        let mut d = self.desc(CallOp::Reduce, Variant::Out, &[x], &[&out]);
        d.reduce = Some(op);
        d.root = Some(root);
        self.issue("reduce", d, Kind::Reduce { x: x.clone(), out: out.clone(), op, root }, out)
    }
    fn gather(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.gathered_shape(x))?;
        let mut d = self.desc(CallOp::Gather, Variant::Out, &[x], &[&out]);
        d.root = Some(root);
        self.issue("gather", d, Kind::Gather { x: x.clone(), out: out.clone(), root }, out)
    }
    fn scatter(&self, x: &Buf, root: usize) -> Result<Work<Buf>> {
        let out = self.alloc_like(x, &self.scattered_shape(x))?;
        let mut d = self.desc(CallOp::Scatter, Variant::Out, &[x], &[&out]);
        d.root = Some(root);
        self.issue("scatter", d, Kind::Scatter { x: x.clone(), out: out.clone(), root }, out)
    }

    fn send(&self, x: &Buf, dst: usize) -> Result<Work<()>> {
        Ok(self.user.send(x, dst)?.with_backend_name("p2pcoll"))
    }
    fn recv(&self, out: &Buf, src: usize) -> Result<Work<Buf>> {
        Ok(self.user.recv(out, src)?.with_backend_name("p2pcoll"))
    }
    fn barrier(&self) -> Result<Work<()>> {
        let d = CallDesc::new(CallOp::Barrier, Variant::Out, self.rank());
        self.issue("barrier", d, Kind::Barrier, ())
    }
}
