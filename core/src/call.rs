//! One rank's call, described purely ([`CallDesc`]), and THE rule table for call validity:
//! [`validate_local`] (what a rank alone can tell) and [`validate_all`] / [`validate_pair`]
//! (what only every rank's description together can tell). The oracle and every backend call
//! these functions instead of checking on their own, so a broken call gets the same
//! [`BadInputKind`] everywhere. Backends only encode their rank's description
//! ([`CallDesc::encode`]), ship it to their peers and decode theirs ([`CallDesc::decode`]).
//!
//! # Precedence
//! A call is checked rule by rule in this order; the first broken rule names the error.
//!
//! **Local rules** ([`validate_local`]), one rank's description alone:
//! 1. [`BadGroup`](BadInputKind::BadGroup): a `new_group` member list that is empty, repeats a
//!    rank or names one outside `0..world_size`.
//! 2. [`BadPeer`](BadInputKind::BadPeer): a send / recv peer outside `0..world_size` or equal
//!    to the caller.
//! 3. [`BadRoot`](BadInputKind::BadRoot): a broadcast src or reduce / gather / scatter root
//!    outside `0..world_size`.
//! 4. [`BadPermutation`](BadInputKind::BadPermutation): a `src_dst` that is not a permutation
//!    of `0..world_size`.
//! 5. [`BadSplits`](BadInputKind::BadSplits): an all_to_all split list whose length is not
//!    the world size.
//! 6. [`UnsupportedDType`](BadInputKind::UnsupportedDType): a dtype the backend does not move (a
//!    scaled fused op's output dtype too),
//!    or a reduce op not defined for the dtype (bitwise on floats, premul_sum on integers).
//! 7. [`UnsupportedOp`](BadInputKind::UnsupportedOp): a combination the backend declares as a
//!    gap in its [`Capabilities`].
//! 8. [`ZeroDim`](BadInputKind::ZeroDim): a 0-dim input where the op splits dim 0
//!    (reduce_scatter, scatter, all_to_all).
//! 9. [`Indivisible`](BadInputKind::Indivisible): dim 0 not divisible by the world size
//!    (reduce_scatter, scatter, an all_to_all split left to be equal).
//! 10. [`BadSplits`](BadInputKind::BadSplits): all_to_all input splits that do not sum to
//!     dim 0.
//! 11. [`DTypeMismatch`](BadInputKind::DTypeMismatch): an `_out` buffer whose dtype is not the
//!     input's.
//! 12. [`OutBufferSize`](BadInputKind::OutBufferSize): an `_out` buffer of the wrong element
//!     count.
//! 13. [`Aliasing`](BadInputKind::Aliasing): an output that overlaps an input where the op
//!     forbids it ([`CallDesc::aliased`], computed by the backend from addresses).
//!
//! **Fused ops** ([`CallOp::is_fused`], module [`crate::fused`]), checked before rule 6, in the
//! seed's order and with its wording:
//! F1. [`NotAMatrix`](BadInputKind::NotAMatrix) "A_shard must be a matrix" (fewer than 2 dims;
//!     also a wrong number of `b`s: [`CountMismatch`](BadInputKind::CountMismatch));
//! F2. [`NotAMatrix`](BadInputKind::NotAMatrix) "B must be a matrix" (not exactly 2 dims);
//! F3. [`BadDim`](BadInputKind::BadDim) "Invalid gather_dim" (the dim is not a dim of `a`; for
//!     the reduce-scatter before F2, as the seed);
//! F4. [`BadReduceOp`](BadInputKind::BadReduceOp) "reduce_op must be sum or avg";
//! F5. [`ZeroDim`](BadInputKind::ZeroDim): a 0-dim input of a low-contention op;
//! F6. [`UnsupportedDType`](BadInputKind::UnsupportedDType) (a non-float operand or output dtype)
//!     / [`DTypeMismatch`](BadInputKind::DTypeMismatch) (`b` not of `a`'s dtype);
//! F7. [`ShapeMismatch`](BadInputKind::ShapeMismatch): `b`'s rows are not the contraction length;
//! F8. [`BadScale`](BadInputKind::BadScale): a scale list of the wrong length;
//! F9. [`Indivisible`](BadInputKind::Indivisible): the scattered dim of the result (dim 0 for the
//!     low-contention reduce-scatter) not divisible by the world size.
//! Across ranks, after rule 16: [`BadDim`](BadInputKind::BadDim) (dims differ), then
//! [`BadScale`](BadInputKind::BadScale) (scale kinds or output dtypes differ).
//!
//! **Cross-rank rules** ([`validate_all`]), after the local rules of rank 0, 1, ... (so a rank
//! that rejected its own call at issue and its peers name the same rule):
//! 14. [`OpMismatch`](BadInputKind::OpMismatch): ranks issued different ops (or sequence
//!     numbers).
//! 15. [`CountMismatch`](BadInputKind::CountMismatch): coalesced lists of different lengths.
//! 16. [`ReduceOpMismatch`](BadInputKind::ReduceOpMismatch): reduce ops (or premul_sum
//!     factors) that differ.
//! 17. [`BadRoot`](BadInputKind::BadRoot): roots / srcs that differ.
//! 18. [`BadPermutation`](BadInputKind::BadPermutation) / [`BadGroup`](BadInputKind::BadGroup):
//!     permutations / member lists that differ.
//! 19. [`DTypeMismatch`](BadInputKind::DTypeMismatch): input dtypes that differ.
//! 20. [`ShapeMismatch`](BadInputKind::ShapeMismatch): input shapes that differ (all_to_all:
//!     all dims but the first).
//! 21. [`SplitMismatch`](BadInputKind::SplitMismatch): rank i's output split for rank j is not
//!     rank j's input split for rank i.
//!
//! **Send / recv pairs** ([`validate_pair`]), after the local rules of the lower rank, then
//! of the higher: 14. `OpMismatch` (not a send facing a recv), then `BadPeer` (the peer named
//! another rank), then 19. `DTypeMismatch`, then `OutBufferSize` (element counts differ).

use crate::caps::Capabilities;
use crate::dtype::DType;
use crate::error::{BadInputKind, CollectiveError};
use crate::op::{OpKind, ReduceOp, Variant};
use serde::{Deserialize, Serialize};

/// What was called (the trait method without its variant, plus send / recv / new_group).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CallOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Permute,
    Reduce,
    Gather,
    Scatter,
    Send,
    Recv,
    Barrier,
    NewGroup,
    /// `fused_all_gather_matmul` and its scaled variant (inputs: `a_shard`, then every `b`).
    FusedAllGatherMatmul,
    /// `fused_matmul_reduce_scatter` and its scaled variant (inputs: `a`, `b`).
    FusedMatmulReduceScatter,
    LowContentionAllGather,
    LowContentionReduceScatter,
}

impl CallOp {
    pub const ALL: [CallOp; 17] = [
        CallOp::AllReduce,
        CallOp::AllGather,
        CallOp::ReduceScatter,
        CallOp::AllToAll,
        CallOp::Broadcast,
        CallOp::Permute,
        CallOp::Reduce,
        CallOp::Gather,
        CallOp::Scatter,
        CallOp::Send,
        CallOp::Recv,
        CallOp::Barrier,
        CallOp::NewGroup,
        CallOp::FusedAllGatherMatmul,
        CallOp::FusedMatmulReduceScatter,
        CallOp::LowContentionAllGather,
        CallOp::LowContentionReduceScatter,
    ];

    /// The fused communication + compute ops (module [`crate::fused`]).
    pub const fn is_fused(self) -> bool {
        matches!(
            self,
            CallOp::FusedAllGatherMatmul
                | CallOp::FusedMatmulReduceScatter
                | CallOp::LowContentionAllGather
                | CallOp::LowContentionReduceScatter
        )
    }

    /// The [`OpKind`] (send and recv are both [`OpKind::SendRecv`]); `None` for new_group.
    pub const fn kind(self) -> Option<OpKind> {
        Some(match self {
            CallOp::AllReduce => OpKind::AllReduce,
            CallOp::AllGather => OpKind::AllGatherIntoTensor,
            CallOp::ReduceScatter => OpKind::ReduceScatterTensor,
            CallOp::AllToAll => OpKind::AllToAllSingle,
            CallOp::Broadcast => OpKind::Broadcast,
            CallOp::Permute => OpKind::PermuteTensor,
            CallOp::Reduce => OpKind::Reduce,
            CallOp::Gather => OpKind::Gather,
            CallOp::Scatter => OpKind::Scatter,
            CallOp::Send | CallOp::Recv => OpKind::SendRecv,
            CallOp::Barrier => OpKind::Barrier,
            CallOp::NewGroup
            | CallOp::FusedAllGatherMatmul
            | CallOp::FusedMatmulReduceScatter
            | CallOp::LowContentionAllGather
            | CallOp::LowContentionReduceScatter => return None,
        })
    }

    pub const fn name(self) -> &'static str {
        match self {
            CallOp::Send => "send",
            CallOp::Recv => "recv",
            CallOp::NewGroup => "new_group",
            CallOp::FusedAllGatherMatmul => "fused_all_gather_matmul",
            CallOp::FusedMatmulReduceScatter => "fused_matmul_reduce_scatter",
            CallOp::LowContentionAllGather => "low_contention_all_gather",
            CallOp::LowContentionReduceScatter => "low_contention_reduce_scatter",
            op => match op.kind() {
                Some(k) => k.name(),
                None => "?",
            },
        }
    }

    fn code(self) -> u64 {
        CallOp::ALL.iter().position(|o| *o == self).expect("listed") as u64
    }
}

/// A tensor as the rules see it: dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorDesc {
    pub fn new(dtype: DType, shape: &[usize]) -> TensorDesc {
        TensorDesc { dtype, shape: shape.to_vec() }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl std::fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)
    }
}

/// The extra arguments of a fused op ([`CallOp::is_fused`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusedArgs {
    /// `gather_dim` / `scatter_dim` (0 for the low-contention ops).
    pub dim: usize,
    /// Scaled variants: the number of `a` scale values and of each `b`'s (0 = per-tensor);
    /// `None` for the unscaled ops.
    pub scales: Option<(usize, Vec<usize>)>,
    /// Scaled variants: the output dtype.
    pub out_dtype: Option<DType>,
}

/// One rank's call, with everything the rules need and nothing else (no addresses).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallDesc {
    pub op: CallOp,
    pub variant: Variant,
    /// The caller's rank in the communicator.
    pub rank: usize,
    /// The backend's sequence number of the op (ranks must agree; 0 where unused).
    pub seq: u64,
    /// The input tensors (a list for coalesced ops; the sent tensor for send).
    pub inputs: Vec<TensorDesc>,
    /// Output buffers the caller passed (`_out` ops, recv); empty when the backend allocates.
    pub outputs: Vec<TensorDesc>,
    pub reduce: Option<ReduceOp>,
    /// broadcast src, reduce / gather / scatter root.
    pub root: Option<usize>,
    /// send destination / recv source.
    pub peer: Option<usize>,
    pub in_splits: Option<Vec<usize>>,
    pub out_splits: Option<Vec<usize>>,
    /// permute_tensor's `src_dst`.
    pub perm: Option<Vec<usize>>,
    /// new_group's member list.
    pub group: Option<Vec<usize>>,
    /// An output overlaps an input (or another output) where the op forbids it.
    pub aliased: bool,
    /// The fused ops' dim, scales and output dtype.
    pub fused: Option<FusedArgs>,
}

/// A broken rule: its kind and what, where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {detail}")]
pub struct BadInput {
    pub kind: BadInputKind,
    pub detail: String,
}

impl BadInput {
    pub fn new(kind: BadInputKind, detail: impl Into<String>) -> BadInput {
        BadInput { kind, detail: detail.into() }
    }
    /// The [`CollectiveError::BadInput`] a backend returns for it.
    pub fn into_error(self, op: &str, seq: u64, rank: usize) -> CollectiveError {
        CollectiveError::bad_input(self.kind, op, seq, rank, self.detail)
    }
}

type V = Result<(), BadInput>;

fn bad(kind: BadInputKind, detail: impl Into<String>) -> V {
    Err(BadInput::new(kind, detail))
}

/// A cross-rank rule: `key` of every rank's call must equal rank 0's. Keys borrow from the
/// calls (every op of a backend is validated on every rank: no key allocates).
fn agree<'a, T: PartialEq + std::fmt::Debug>(all: &'a [CallDesc], kind: BadInputKind, what: &str, key: impl Fn(&'a CallDesc) -> T) -> V {
    let k0 = key(&all[0]);
    match all.iter().position(|d| key(d) != k0) {
        Some(r) => bad(kind, format!("{what} differ across ranks: rank 0 has {k0:?} but rank {r} has {:?}", key(&all[r]))),
        None => Ok(()),
    }
}

/// A reduce op as a key of [`agree`]: equal, and printed, as its `Debug` text (a string) would
/// be — so `premul_sum` factors are told apart by value and sign (`0.0` and `-0.0` differ, any
/// NaN equals any NaN) — without making the text.
#[derive(Clone, Copy)]
struct OpText(ReduceOp);

impl PartialEq for OpText {
    fn eq(&self, other: &OpText) -> bool {
        match (self.0, other.0) {
            (ReduceOp::PremulSum(a), ReduceOp::PremulSum(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            (a, b) => a == b,
        }
    }
}

impl std::fmt::Debug for OpText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", format!("{:?}", self.0))
    }
}

/// One field of every tensor of a list as a key of [`agree`]: equal, and printed, as the `Vec`
/// of those fields would be, without making it.
struct Each<'a, T>(&'a [TensorDesc], fn(&'a TensorDesc) -> T);

impl<T: PartialEq> PartialEq for Each<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(other.0).all(|(a, b)| (self.1)(a) == (other.1)(b))
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Each<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(self.1)).finish()
    }
}

impl CallDesc {
    /// A call with no tensors and no arguments; fill the fields that apply.
    pub fn new(op: CallOp, variant: Variant, rank: usize) -> CallDesc {
        CallDesc {
            op,
            variant,
            rank,
            seq: 0,
            inputs: vec![],
            outputs: vec![],
            reduce: None,
            root: None,
            peer: None,
            in_splits: None,
            out_splits: None,
            perm: None,
            group: None,
            aliased: false,
            fused: None,
        }
    }

    /// A send (`t` is the tensor sent) or recv (`t` is the receive buffer) with `peer`.
    pub fn p2p(op: CallOp, rank: usize, t: TensorDesc, peer: usize) -> CallDesc {
        let mut d = CallDesc::new(op, Variant::Out, rank);
        if op == CallOp::Recv {
            d.outputs.push(t);
        } else {
            d.inputs.push(t);
        }
        d.peer = Some(peer);
        d
    }

    /// The tensor a send sends / a recv receives into.
    pub fn p2p_tensor(&self) -> Option<&TensorDesc> {
        match self.op {
            CallOp::Send => self.inputs.first(),
            CallOp::Recv => self.outputs.first(),
            _ => None,
        }
    }

    /// Rows of dim 0 of input `i` (a 0-dim tensor counts as one row).
    fn rows(&self, i: usize) -> usize {
        self.inputs[i].shape.first().copied().unwrap_or(1)
    }

    /// all_to_all: the resolved input splits (equal when not given). Valid after validation.
    pub fn input_splits(&self, ws: usize) -> Vec<usize> {
        self.in_splits.clone().unwrap_or_else(|| vec![self.rows(0) / ws; ws])
    }
    /// all_to_all: the resolved output splits (an equal split of the rank's own dim 0 when not
    /// given, as PyTorch allocates the output like the input). Valid after validation.
    pub fn output_splits(&self, ws: usize) -> Vec<usize> {
        self.out_splits.clone().unwrap_or_else(|| vec![self.rows(0) / ws; ws])
    }

    /// The description as 64-bit words (the wire format backends ship to peers).
    pub fn encode(&self) -> Vec<u64> {
        const NONE: u64 = u64::MAX;
        let (rc, rf) = match self.reduce {
            None => (NONE, 0),
            Some(op) => {
                let i = ReduceOp::ALL.iter().position(|x| x.name() == op.name()).expect("listed") as u64;
                (i, if let ReduceOp::PremulSum(f) = op { f.to_bits() } else { 0 })
            }
        };
        let opt = |x: Option<usize>| x.map_or(NONE, |v| v as u64);
        // Room for a call of a few tensors at once (no regrowth on every issue's encoding).
        let mut w = Vec::with_capacity(64);
        w.extend([
            self.op.code(),
            Variant::ALL.iter().position(|v| *v == self.variant).expect("listed") as u64,
            self.rank as u64,
            self.seq,
            rc,
            rf,
            opt(self.root),
            opt(self.peer),
            self.aliased as u64,
        ]);
        for list in [&self.inputs, &self.outputs] {
            w.push(list.len() as u64);
            for t in list {
                w.push(DType::ALL.iter().position(|d| *d == t.dtype).expect("listed") as u64);
                w.push(t.shape.len() as u64);
                w.extend(t.shape.iter().map(|&d| d as u64));
            }
        }
        for v in [&self.in_splits, &self.out_splits, &self.perm, &self.group] {
            match v {
                None => w.push(NONE),
                Some(v) => {
                    w.push(v.len() as u64);
                    w.extend(v.iter().map(|&x| x as u64));
                }
            }
        }
        // Fused arguments last.
        match &self.fused {
            None => w.push(NONE),
            Some(f) => {
                w.push(f.dim as u64);
                w.push(f.out_dtype.map_or(NONE, |d| DType::ALL.iter().position(|x| *x == d).expect("listed") as u64));
                match &f.scales {
                    None => w.push(NONE),
                    Some((a, bs)) => {
                        w.push(*a as u64);
                        w.push(bs.len() as u64);
                        w.extend(bs.iter().map(|&x| x as u64));
                    }
                }
            }
        }
        w
    }

    /// Decodes [`CallDesc::encode`]'s words (trailing words are ignored); `None` if malformed.
    pub fn decode(words: &[u64]) -> Option<CallDesc> {
        const NONE: u64 = u64::MAX;
        let mut it = words.iter().copied();
        let mut next = move || it.next();
        let us = |x: u64| usize::try_from(x).ok();
        let op = *CallOp::ALL.get(us(next()?)?)?;
        let variant = *Variant::ALL.get(us(next()?)?)?;
        let rank = us(next()?)?;
        let seq = next()?;
        let (rc, rf) = (next()?, next()?);
        let reduce = match rc {
            NONE => None,
            c => Some(match *ReduceOp::ALL.get(us(c)?)? {
                ReduceOp::PremulSum(_) => ReduceOp::PremulSum(f64::from_bits(rf)),
                op => op,
            }),
        };
        let opt = |x: u64| if x == NONE { Some(None) } else { us(x).map(Some) };
        let root = opt(next()?)?;
        let peer = opt(next()?)?;
        let aliased = next()? != 0;
        let mut d = CallDesc::new(op, variant, rank);
        (d.seq, d.reduce, d.root, d.peer, d.aliased) = (seq, reduce, root, peer, aliased);
        for which in 0..2 {
            let n = us(next()?)?.min(words.len());
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                let dtype = *DType::ALL.get(us(next()?)?)?;
                let nd = us(next()?)?.min(words.len());
                let shape = (0..nd).map(|_| next().and_then(us)).collect::<Option<Vec<_>>>()?;
                list.push(TensorDesc { dtype, shape });
            }
            if which == 0 {
                d.inputs = list;
            } else {
                d.outputs = list;
            }
        }
        let mut lists = Vec::with_capacity(4);
        for _ in 0..4 {
            let n = next()?;
            lists.push(if n == NONE {
                None
            } else {
                let n = us(n)?.min(words.len());
                Some((0..n).map(|_| next().and_then(us)).collect::<Option<Vec<_>>>()?)
            });
        }
        d.group = lists.pop()?;
        d.perm = lists.pop()?;
        d.out_splits = lists.pop()?;
        d.in_splits = lists.pop()?;
        d.fused = match next()? {
            NONE => None,
            dim => {
                let out_dtype = match next()? {
                    NONE => None,
                    c => Some(*DType::ALL.get(us(c)?)?),
                };
                let scales = match next()? {
                    NONE => None,
                    a => {
                        let n = us(next()?)?.min(words.len());
                        Some((us(a)?, (0..n).map(|_| next().and_then(us)).collect::<Option<Vec<_>>>()?))
                    }
                };
                Some(FusedArgs { dim: us(dim)?, scales, out_dtype })
            }
        };
        Some(d)
    }
}

fn show(x: Option<usize>) -> String {
    x.map_or_else(|| "(none)".into(), |x| x.to_string())
}

/// Is `l` a set of distinct ranks of `0..ws` (and, with `all`, every one of them)?
fn distinct_ranks(l: &[usize], ws: usize) -> bool {
    let mut seen = vec![false; ws];
    l.iter().all(|&x| x < ws && !std::mem::replace(&mut seen[x], true))
}

/// Local rules 1–13 (see the module docs) for one rank's call in a communicator of `ws` ranks,
/// for a backend that declares `caps`.
pub fn validate_local(d: &CallDesc, ws: usize, caps: &Capabilities) -> V {
    use BadInputKind::*;
    let op = d.op;
    let name = op.name();
    // 1. Group.
    if op == CallOp::NewGroup {
        let l = d.group.as_deref().unwrap_or(&[]);
        if l.is_empty() {
            return bad(BadGroup, "a subgroup needs at least one rank");
        }
        if !distinct_ranks(l, ws) {
            return bad(BadGroup, format!("member list {l:?} has an out-of-range or repeated rank (world of {ws})"));
        }
    }
    // 2. Peer.
    if matches!(op, CallOp::Send | CallOp::Recv) {
        match d.peer {
            Some(p) if p < ws && p != d.rank => {}
            p => {
                return bad(BadPeer, format!("{name} peer {} of rank {} is not another rank of 0..{ws}", show(p), d.rank));
            }
        }
    }
    // 3. Root.
    if matches!(op, CallOp::Broadcast | CallOp::Reduce | CallOp::Gather | CallOp::Scatter) {
        match d.root {
            Some(r) if r < ws => {}
            r => {
                let what = if op == CallOp::Broadcast { "src" } else { "root" };
                return bad(BadRoot, format!("{name} {what} {} out of range for world size {ws}", show(r)));
            }
        }
    }
    // 4. Permutation.
    if op == CallOp::Permute {
        let l = d.perm.as_deref().unwrap_or(&[]);
        if l.len() != ws || !distinct_ranks(l, ws) {
            return bad(BadPermutation, format!("src_dst {l:?} is not a permutation of 0..{ws}"));
        }
    }
    // 5. Split lengths.
    if op == CallOp::AllToAll {
        for (what, s) in [("input", &d.in_splits), ("output", &d.out_splits)] {
            if let Some(s) = s {
                if s.len() != ws {
                    return bad(BadSplits, format!("{what} splits {s:?} have {} entries, world size is {ws}", s.len()));
                }
            }
        }
    }
    // F1–F9. The fused ops' own rules (module docs), before the generic ones.
    if op.is_fused() {
        validate_fused_local(d, ws)?;
    }
    // 6. Dtypes the backend moves (a scaled fused op's output dtype too: its result is
    // reduced or gathered in it); reduce op defined for the dtype.
    if let Some(o) = d.fused.as_ref().and_then(|f| f.out_dtype) {
        if !caps.dtypes.contains(&o) {
            return bad(UnsupportedDType, format!("the backend does not support dtype {o} (the output dtype)"));
        }
    }
    for t in d.inputs.iter().chain(&d.outputs) {
        if !caps.dtypes.contains(&t.dtype) {
            return bad(UnsupportedDType, format!("the backend does not support dtype {}", t.dtype));
        }
        if let Some(r) = d.reduce {
            if !r.defined_for(t.dtype) {
                let why = if r.is_bitwise() { "bitwise ops need an integer dtype" } else { "premul_sum needs a floating-point dtype" };
                return bad(UnsupportedDType, format!("reduce op {r} is not defined for {}: {why}", t.dtype));
            }
        }
    }
    // 7. Declared gaps.
    if let Some(kind) = op.kind() {
        let dtypes: Vec<Option<DType>> = if d.inputs.is_empty() && d.outputs.is_empty() {
            vec![None]
        } else {
            d.inputs.iter().chain(&d.outputs).map(|t| Some(t.dtype)).collect()
        };
        for dt in dtypes {
            if let Err(why) = caps.check(kind, Some(d.variant), dt, d.reduce, ws) {
                return bad(UnsupportedOp, format!("{name}: {why}"));
            }
        }
    }
    // 8. Zero-dim; 9. divisibility; 10. split sums.
    let splits_dim0 = matches!(op, CallOp::ReduceScatter | CallOp::Scatter | CallOp::AllToAll);
    for (i, t) in d.inputs.iter().enumerate() {
        if splits_dim0 && t.shape.is_empty() {
            return bad(ZeroDim, format!("{name} splits dim 0, but input {i} of rank {} is 0-dim", d.rank));
        }
    }
    for (i, t) in d.inputs.iter().enumerate() {
        let d0 = t.shape.first().copied().unwrap_or(1);
        let indivisible = d0 % ws != 0;
        if matches!(op, CallOp::ReduceScatter | CallOp::Scatter) && indivisible {
            return bad(Indivisible, format!("{name}: dim 0 ({d0}) of input {i} is not divisible by the world size ({ws})"));
        }
        if op == CallOp::AllToAll {
            for (what, s) in [("input", &d.in_splits), ("output", &d.out_splits)] {
                if s.is_none() && indivisible {
                    return bad(Indivisible, format!("equal {what} split of dim 0 ({d0}) needs it divisible by the world size ({ws})"));
                }
            }
            // Checked sums: a sum that overflows is bad input, not a wrapped number that may
            // match dim 0 in a release build (issue 15 item 10).
            for (what, s) in [("input", &d.in_splits), ("output", &d.out_splits)] {
                if let Some(s) = s {
                    if s.iter().try_fold(0usize, |a, &r| a.checked_add(r)).is_none() {
                        return bad(BadSplits, format!("{what} splits {s:?} sum to more than usize::MAX"));
                    }
                }
            }
            if let Some(s) = &d.in_splits {
                let sum: usize = s.iter().sum();
                if sum != d0 {
                    return bad(BadSplits, format!("input splits {s:?} sum to {sum}, dim 0 is {d0}"));
                }
            }
        }
    }
    // 11. Output dtype; 12. output size.
    if op != CallOp::Recv {
        for (i, (x, out)) in d.inputs.iter().zip(&d.outputs).enumerate() {
            if out.dtype != x.dtype {
                return bad(DTypeMismatch, format!("output {i} is {} but its input is {}", out.dtype, x.dtype));
            }
            let need = match op {
                CallOp::AllGather | CallOp::Gather => x.numel() * ws,
                CallOp::ReduceScatter | CallOp::Scatter => x.numel() / ws,
                _ => x.numel(),
            };
            if out.numel() != need {
                return bad(OutBufferSize, format!("output {i} holds {} elements {:?}, the op needs {need}", out.numel(), out.shape));
            }
        }
    }
    // 13. Aliasing.
    if d.aliased {
        return bad(Aliasing, format!("{name}: an output of rank {} overlaps an input", d.rank));
    }
    Ok(())
}

/// Rules F1–F9 of a fused op (module docs), in the seed's order and wording.
fn validate_fused_local(d: &CallDesc, ws: usize) -> V {
    use BadInputKind::*;
    let op = d.op;
    let name = op.name();
    let f = d.fused.clone().unwrap_or(FusedArgs { dim: 0, scales: None, out_dtype: None });
    let Some(a) = d.inputs.first() else {
        return bad(CountMismatch, format!("{name} needs an input tensor"));
    };
    let matmul = matches!(op, CallOp::FusedAllGatherMatmul | CallOp::FusedMatmulReduceScatter);
    if matmul {
        // F1. A is a matrix (at least 2 dims).
        if a.shape.len() < 2 {
            return bad(NotAMatrix, format!("A_shard must be a matrix: {name} got a {}-dim A {a}", a.shape.len()));
        }
        let bs = &d.inputs[1..];
        if bs.is_empty() || (op == CallOp::FusedMatmulReduceScatter && bs.len() != 1) {
            let want = if op == CallOp::FusedMatmulReduceScatter { "exactly one B" } else { "at least one B" };
            return bad(CountMismatch, format!("{name} needs {want}, got {}", bs.len()));
        }
        // F2 (all-gather) / F3. The seed checks gather_dim before B for the reduce-scatter.
        let dim_ok = f.dim < a.shape.len();
        if op == CallOp::FusedMatmulReduceScatter && !dim_ok {
            return bad(BadDim, format!("Invalid gather_dim: scatter_dim {} of a {}-dim A", f.dim, a.shape.len()));
        }
        // F2. Every B is a matrix (exactly 2 dims).
        if let Some((i, b)) = bs.iter().enumerate().find(|(_, b)| b.shape.len() != 2) {
            return bad(NotAMatrix, format!("B must be a matrix: B[{i}] is {b} ({} dims)", b.shape.len()));
        }
        if !dim_ok {
            return bad(BadDim, format!("Invalid gather_dim: gather_dim {} of a {}-dim A_shard", f.dim, a.shape.len()));
        }
    }
    // F4. The reduce op.
    if matches!(op, CallOp::FusedMatmulReduceScatter | CallOp::LowContentionReduceScatter)
        && !matches!(d.reduce, Some(ReduceOp::Sum | ReduceOp::Avg))
    {
        return bad(BadReduceOp, format!("reduce_op must be sum or avg, got {}", d.reduce.map_or("(none)", |r| r.name())));
    }
    // F5. A 0-dim input to a low-contention op (its dim 0 is gathered / split).
    if !matmul && a.shape.is_empty() {
        return bad(ZeroDim, format!("{name} gathers or splits dim 0, but the input of rank {} is 0-dim", d.rank));
    }
    if matmul {
        // F6. Floating-point operands of one dtype; a float output dtype.
        for t in &d.inputs {
            if !t.dtype.is_float() {
                return bad(UnsupportedDType, format!("{name} multiplies matrices: {t} is not a floating-point dtype"));
            }
            if t.dtype != a.dtype {
                return bad(DTypeMismatch, format!("{name}: B is {} but A is {}", t.dtype, a.dtype));
            }
        }
        if let Some(o) = f.out_dtype {
            if !o.is_float() {
                return bad(UnsupportedDType, format!("{name}: output dtype {o} is not a floating-point dtype"));
            }
        }
        // F7. B's rows match the contraction length.
        let k = if op == CallOp::FusedAllGatherMatmul {
            *crate::fused::moved_shape(&a.shape, f.dim).last().expect("2+ dims")
        } else {
            *a.shape.last().expect("2+ dims")
        };
        if let Some((i, b)) = d.inputs[1..].iter().enumerate().find(|(_, b)| b.shape[0] != k) {
            return bad(ShapeMismatch, format!("{name}: B[{i}] is {b} but A's contraction dim has {k} elements (A {a}, dim {})", f.dim));
        }
        // F8. Scales: one per A row (or per tensor), one per B column (or per tensor).
        if let Some((sa, sbs)) = &f.scales {
            let rows = a.numel().checked_div(k).unwrap_or(0);
            if *sa != 0 && *sa != rows {
                return bad(BadScale, format!("{name}: A has {rows} rows but {sa} row scales (or give one per-tensor scale)"));
            }
            if sbs.len() != d.inputs.len() - 1 {
                return bad(BadScale, format!("{name}: {} B scales for {} B tensors", sbs.len(), d.inputs.len() - 1));
            }
            if let Some((i, (s, b))) = sbs.iter().zip(&d.inputs[1..]).enumerate().find(|(_, (s, b))| **s != 0 && **s != b.shape[1]) {
                return bad(BadScale, format!("{name}: B[{i}] has {} columns but {s} column scales", b.shape[1]));
            }
        }
    }
    // F9. The scattered dim divides by the world size.
    let split = match op {
        CallOp::FusedMatmulReduceScatter => Some((f.dim, if f.dim + 1 == a.shape.len() { d.inputs[1].shape[1] } else { a.shape[f.dim] })),
        CallOp::LowContentionReduceScatter => Some((0, a.shape[0])),
        _ => None,
    };
    if let Some((dim, len)) = split {
        if len % ws != 0 {
            return bad(Indivisible, format!("{name}: dim {dim} of the result ({len}) is not divisible by the world size ({ws})"));
        }
    }
    Ok(())
}

/// Every rule (local rules of each rank in rank order, then cross-rank rules 14–21) over every
/// rank's call (index = rank) of one collective. Send / recv are checked by [`validate_pair`].
pub fn validate_all(all: &[CallDesc], caps: &Capabilities) -> V {
    use BadInputKind::*;
    let n = all.len();
    if n == 0 {
        return bad(BadGroup, "no ranks: a collective needs at least one rank");
    }
    for (r, d) in all.iter().enumerate() {
        validate_local(d, n, caps).map_err(|e| BadInput::new(e.kind, format!("rank {r}: {}", e.detail)))?;
    }
    // 14.–20.: each a field every rank must pass alike.
    agree(all, OpMismatch, "ops (and sequence numbers)", |d| (d.op.name(), d.seq))?;
    agree(all, CountMismatch, "coalesced list lengths", |d| d.inputs.len())?;
    agree(all, ReduceOpMismatch, "reduce ops", |d| d.reduce.map(OpText))?;
    agree(all, BadDim, "gather / scatter dims", |d| d.fused.as_ref().map(|f| f.dim))?;
    agree(all, BadScale, "scale kinds and output dtypes", |d| d.fused.as_ref().map(|f| (&f.scales, f.out_dtype)))?;
    agree(all, BadRoot, "roots", |d| d.root)?;
    agree(all, BadPermutation, "permutations (src_dst)", |d| d.perm.as_ref())?;
    agree(all, BadGroup, "subgroup member lists", |d| d.group.as_ref())?;
    agree(all, DTypeMismatch, "input dtypes", |d| Each(&d.inputs, |t| t.dtype))?;
    let p0 = &all[0];
    if p0.op == CallOp::AllToAll {
        agree(all, ShapeMismatch, "row shapes (all dims but the first)", |d| Each(&d.inputs, |t| t.shape.get(1..)))?;
    } else {
        agree(all, ShapeMismatch, "input shapes", |d| Each(&d.inputs, |t| &t.shape))?;
    }
    // 21. Splits.
    if p0.op == CallOp::AllToAll {
        let ins: Vec<Vec<usize>> = all.iter().map(|d| d.input_splits(n)).collect();
        for (j, d) in all.iter().enumerate() {
            let outs = d.output_splits(n);
            if let Some(i) = (0..n).find(|&i| outs[i] != ins[i][j]) {
                return bad(SplitMismatch, format!("rank {j} expects {} rows from rank {i}, which sends it {}", outs[i], ins[i][j]));
            }
        }
    }
    Ok(())
}

/// The rules for a send / recv pair: `a` and `b` are the two peers' calls (either order; the
/// verdict does not depend on it), `ws` the communicator size.
pub fn validate_pair(a: &CallDesc, b: &CallDesc, ws: usize, caps: &Capabilities) -> V {
    use BadInputKind::*;
    let (lo, hi) = if a.rank <= b.rank { (a, b) } else { (b, a) };
    for d in [lo, hi] {
        validate_local(d, ws, caps).map_err(|e| BadInput::new(e.kind, format!("rank {}: {}", d.rank, e.detail)))?;
    }
    let complementary = matches!((lo.op, hi.op), (CallOp::Send, CallOp::Recv) | (CallOp::Recv, CallOp::Send));
    if !complementary {
        return bad(OpMismatch, format!("rank {} called {} but its peer rank {} called {}", lo.rank, lo.op.name(), hi.rank, hi.op.name()));
    }
    for (x, y) in [(lo, hi), (hi, lo)] {
        if x.peer != Some(y.rank) {
            return bad(BadPeer, format!("rank {} named rank {:?} as its peer, not rank {}", x.rank, x.peer, y.rank));
        }
    }
    let (s, r) = if lo.op == CallOp::Send { (lo, hi) } else { (hi, lo) };
    let (Some(st), Some(rt)) = (s.p2p_tensor(), r.p2p_tensor()) else {
        return bad(OutBufferSize, "a send or recv without a tensor");
    };
    if st.dtype != rt.dtype {
        return bad(DTypeMismatch, format!("rank {} sends {} to rank {}, whose buffer is {}", s.rank, st.dtype, r.rank, rt.dtype));
    }
    if st.numel() != rt.numel() {
        return bad(
            OutBufferSize,
            format!("rank {} sends {} elements to rank {}, whose receive buffer holds {}", s.rank, st.numel(), r.rank, rt.numel()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
