//! Helper left20's mutants: review18's finding 8 written as a bug first. A backend whose
//! declaration is read per rank (from the local device, library or kernel) and differs between
//! ranks, while each rank does what it itself declares: every rank's own checks accept, and only
//! a comparison of the ranks' declarations sees it ([clause: init.same_capabilities]).
use crate::campaign::{spec, Spec};
use crate::{set_f64, Buf, Bug, Group, Shm, BUG_WAIT};
use concord_core::{Backend, CollectiveError, DType, NanPolicy, ReduceOp, Result, Tensor, Work, WorldInfo};
use concord_store::Store;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The float min / max of `vals` under `policy`, `-0 < +0` (NaN, any payload, when every value
/// is NaN or, under `Propagate`, when one is).
fn min_max(policy: NanPolicy, op: ReduceOp, vals: impl Iterator<Item = f64>) -> f64 {
    let mut acc: Option<f64> = None;
    let mut nan = false;
    for v in vals {
        if v.is_nan() {
            nan = true;
            continue;
        }
        acc = Some(match acc {
            None => v,
            Some(a) => {
                let (lo, hi) = if a < v || (a == v && a.is_sign_negative()) { (a, v) } else { (v, a) };
                if op == ReduceOp::Max {
                    hi
                } else {
                    lo
                }
            }
        });
    }
    match (policy, acc) {
        (NanPolicy::Propagate, _) if nan => f64::NAN,
        (_, Some(a)) => a,
        (_, None) => f64::NAN,
    }
}

/// Rewrites `t` (this rank's result) as the min / max of the gathered inputs `all` (rank `q`'s
/// element `i` at `q * n + i`) under `policy`, element by element; a NaN already there for a
/// NaN result is kept as it is.
fn reduce_locally(policy: NanPolicy, op: ReduceOp, ws: usize, all: &Tensor, t: &mut Tensor) {
    let n = t.numel();
    for i in 0..n {
        let want = min_max(policy, op, (0..ws).map(|q| all.get_f64(q * n + i)));
        let got = t.get_f64(i);
        let same = (got.is_nan() && want.is_nan()) || (got == want && got.is_sign_negative() == want.is_sign_negative());
        if !same {
            set_f64(t, i, want);
        }
    }
}

fn float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// A backend with no min / max kernel in its transport: a float min / max all_reduce (every
/// variant) and reduce ship every rank's input to every rank through the job's store and reduce
/// on each rank with its local kernel (reduce_scatter already reduces each rank's own output on
/// that rank). The kernel's NaN rule is detected per device at `init` and declared per rank:
/// rank 1's device (another architecture, or another version of the math library in its
/// container) has IEEE `maxNum` semantics, NaN ignored, and declares `nan_minmax = Ignore`; the
/// others propagate NaN and declare `Propagate`. Each rank returns what it declares, so every
/// rank's `caps::nan_minmax` and value checks accept, and the ranks of one job hold different
/// results for the same min / max of a NaN. (shm's option `nan_minmax=ignore` on world rank 1
/// gives its communicators the declaration and the rank-local reduce_scatter; the exchange and
/// the local reduction are the wrapper's: shm validates and runs the call as usual, each rank
/// posts its input under the call's sequence number on its communicator, and once the call
/// completed each rank reads every rank's and reduces locally.)
#[derive(Default)]
pub struct NanPolicyPerRank {
    /// The world's store and id (set at `init`, shared with the groups made from it).
    store: Arc<OnceLock<(Store, String)>>,
    /// This communicator's place among the groups made from the world (`w`, `w/0`, `w/0/2`...).
    path: String,
    /// Groups made from this communicator so far (every rank of it calls `new_group`).
    made: AtomicUsize,
}

impl NanPolicyPerRank {
    fn key(&self, seq: u64, rank: usize, i: usize) -> Option<String> {
        let (_, id) = self.store.get()?;
        Some(format!("left20/{id}/w{}/{seq}/{rank}/{i}", self.path))
    }

    /// `issue`d (the call's own work, whose outputs `outs` lists); when the call is a float min /
    /// max one on this rank (the same on every rank of a valid call, and an invalid one never
    /// runs the hook), this rank's inputs as they were at issue are posted under the call's
    /// sequence number, and once the call completed each output is reduced again on this rank
    /// from every rank's input, when `mine` (it holds a result: every rank, or the root).
    fn local<T: Clone + Send + Sync + 'static>(
        &self,
        s: &Shm,
        xs: &[Buf],
        op: ReduceOp,
        mine: bool,
        issue: impl FnOnce() -> Result<Work<T>>,
        outs: fn(&T) -> Vec<Buf>,
    ) -> Result<Work<T>> {
        let fires = s.ws() >= 2
            && matches!(op, ReduceOp::Min | ReduceOp::Max)
            && xs.iter().all(|x| float(s.inner.buffer_dtype(x)))
            && self.store.get().is_some();
        if !fires {
            return issue();
        }
        let inputs = xs.iter().map(|x| s.inner.download(x)).collect::<Result<Vec<_>>>()?;
        let w = issue()?;
        let seq = w.meta().seq;
        let (me, ws) = (s.rank(), s.ws());
        let Some((store, _)) = self.store.get() else { return Ok(w) };
        for (i, t) in inputs.iter().enumerate() {
            let key = self.key(seq, me, i).expect("store set");
            store.set(&key, t.bytes()).map_err(|e| CollectiveError::Backend(format!("post {key}: {e}")))?;
        }
        let keys: Vec<Vec<String>> =
            (0..inputs.len()).map(|i| (0..ws).map(|q| self.key(seq, q, i).expect("store set")).collect()).collect();
        let shared = self.store.clone();
        let policy = s.inner.capabilities().nan_minmax;
        Ok(s.then(w, move |be, value| {
            if !mine {
                return Ok(());
            }
            let (store, _) = shared.get().expect("store set");
            for ((keys, mine_in), out) in keys.iter().zip(&inputs).zip(outs(value)) {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                store.wait(&refs, BUG_WAIT).map_err(|e| CollectiveError::Backend(format!("wait {}: {e}", keys[0])))?;
                let n = mine_in.numel();
                let mut all = Tensor::zeros(mine_in.dtype(), &[ws * n]);
                let es = mine_in.dtype().size();
                for (q, k) in keys.iter().enumerate() {
                    let b = store.get(k).map_err(|e| CollectiveError::Backend(format!("get {k}: {e}")))?;
                    all.bytes_mut()[q * n * es..(q + 1) * n * es].copy_from_slice(&b);
                }
                crate::edit(be, &out, |t| reduce_locally(policy, op, ws, &all, t))?;
            }
            Ok(())
        }))
    }
}

impl Bug for NanPolicyPerRank {
    fn init_world(&self, world: &WorldInfo) -> Result<WorldInfo> {
        if world.world_size >= 2 {
            let store = Store::open(&world.store_path, world.world_size, world.op_timeout)
                .map_err(|e| CollectiveError::Backend(format!("open the world's store: {e}")))?;
            let _ = self.store.set((store, world.world_id.clone()));
        }
        let mut w = world.clone();
        if world.rank == 1 {
            w.options.retain(|(k, _)| k != "nan_minmax");
            w.options.push(("nan_minmax".into(), "ignore".into()));
        }
        Ok(w)
    }
    fn new_group(&self, _s: &Shm, made: Option<Group>) -> Option<Group> {
        self.made.fetch_add(1, Ordering::SeqCst);
        made
    }
    fn child(&self) -> Option<Box<dyn Bug>> {
        let n = self.made.load(Ordering::SeqCst).saturating_sub(1);
        Some(Box::new(NanPolicyPerRank { store: self.store.clone(), path: format!("{}/{n}", self.path), made: AtomicUsize::new(0) }))
    }
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.local(s, std::slice::from_ref(x), op, true, || s.inner.all_reduce(x, op), |b| vec![b.clone()])
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        self.local(s, std::slice::from_ref(x), op, true, || s.inner.all_reduce_(x, op), |b| vec![b.clone()])
    }
    fn all_reduce_coalesced(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.local(s, xs, op, true, || s.inner.all_reduce_coalesced(xs, op), |v| v.clone())
    }
    fn all_reduce_coalesced_(&self, s: &Shm, xs: &[Buf], op: ReduceOp) -> Result<Work<Vec<Buf>>> {
        self.local(s, xs, op, true, || s.inner.all_reduce_coalesced_(xs, op), |v| v.clone())
    }
    fn reduce(&self, s: &Shm, x: &Buf, op: ReduceOp, root: usize) -> Result<Work<Buf>> {
        let mine = s.rank() == root;
        self.local(s, std::slice::from_ref(x), op, mine, || s.inner.reduce(x, op, root), |b| vec![b.clone()])
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![spec::<NanPolicyPerRank>(
        "left20_nan_policy_per_rank",
        "init.same_capabilities",
        "the NaN rule of float min / max is the local device's, declared per rank: rank 1 ignores NaN and declares Ignore, the \
         others propagate it and declare Propagate; min / max all_reduce and reduce gather and reduce locally, so each rank's \
         results match its own declaration and differ from its peers'",
        &["barrier::out::u8::ws2"],
    )]
}
