//! The value check: run one (op, variant, dtype, reduce op) on every shape of the catalogue and
//! compare every rank's result with the oracle's, bit-exactly for exact-by-construction inputs.
//! Also checks, on the way, what every functional op promises about buffers: in-place identity,
//! out-of-place non-aliasing, inputs left untouched, and no write outside an `_out` buffer.

use crate::case::{CaseEnd, CaseResult};
use crate::exec::{self, Params};
use concord_core::{Backend, DType, OpKind, ReduceOp, Rounding, Tensor, Variant};
use concord_fixtures::InputKind;
use concord_oracle::{compare, tolerance_for, Collective, Semantics, Tolerance};
use std::fmt::Write as _;
use std::time::Duration;

/// Elements of guard on each side of every `_out` buffer.
pub const GUARD_ELEMS: usize = 8;
/// The guard byte of rank 0's guarded parents; [`guard_byte`] gives every rank its own.
pub const GUARD_BYTE: u8 = 0xA5;

/// The byte rank `rank` fills its guarded parents with: [`GUARD_BYTE`] on rank 0, another byte
/// on every other rank (0x25 apart: distinct for any 256 consecutive ranks). Were the guards the
/// same on every rank, a write past a buffer's end that copies a peer's bytes from the same
/// place (a last segment or chunk moved at its full length, from a peer whose bytes there are
/// guards too: HAN's segmented all_reduce, open-mpi/ompi #11441) would leave every guard as it
/// was.
pub fn guard_byte(rank: usize) -> u8 {
    GUARD_BYTE.wrapping_add(((rank % 256) as u8).wrapping_mul(0x25))
}

#[derive(Clone, Debug)]
pub struct ValueSpec {
    pub op: OpKind,
    pub variant: Variant,
    pub dtype: DType,
    pub reduce: Option<ReduceOp>,
    pub kind: InputKind,
    /// Run only the first N catalogue shapes (None: all).
    pub max_shapes: Option<usize>,
}

impl ValueSpec {
    pub fn input_name(&self) -> &'static str {
        match self.kind {
            InputKind::Exact => "exact",
            InputKind::Random => "random",
            InputKind::Special => "special",
        }
    }
}

/// Where a check happened: everything a reader needs to find and rerun the failing case.
pub(crate) fn where_str<B: Backend>(b: &B, spec: &ValueSpec, label: &str, shapes: &[Vec<usize>]) -> String {
    let mut s =
        crate::case::axes(&crate::case::backend_label(b), spec.op.name(), spec.variant.name(), spec.dtype.name(), b.world_size(), b.rank());
    let _ = write!(s, " reduce={}", spec.reduce.map(|r| r.name()).unwrap_or("-"));
    if !label.is_empty() {
        let _ = write!(s, " {label}");
    }
    let _ = write!(s, " shape={}", if shapes.len() == 1 { format!("{:?}", shapes[0]) } else { format!("{shapes:?}") });
    let _ = write!(s, " input={}", spec.input_name());
    s
}

/// Rank `r`'s send/recv partner: pairs (0,1), (2,3), ...; the last rank of an odd world sits out.
pub fn partner(r: usize, ws: usize) -> Option<usize> {
    let p = r ^ 1;
    (p < ws).then_some(p)
}

/// The shape lists one case runs: one entry per run; an entry has one shape per tensor
/// (several for coalesced variants). Shapes are adjusted so that ops needing `d0 % ws == 0` get it.
pub fn shape_runs(spec: &ValueSpec, ws: usize) -> Vec<Vec<Vec<usize>>> {
    let catalogue = concord_fixtures::shapes();
    let take = spec.max_shapes.unwrap_or(catalogue.len());
    let needs_div = matches!(spec.op, OpKind::ReduceScatterTensor | OpKind::Scatter);
    let needs_dim = matches!(spec.op, OpKind::ReduceScatterTensor | OpKind::Scatter | OpKind::AllToAllSingle);
    let adjust = |s: &Vec<usize>| -> Option<Vec<usize>> {
        if needs_div {
            Some(concord_fixtures::divisible_by(s, ws))
        } else if needs_dim && s.is_empty() {
            None
        } else {
            Some(s.clone())
        }
    };
    let shapes: Vec<Vec<usize>> = catalogue.iter().filter_map(|(_, s)| adjust(s)).collect();
    match spec.variant {
        Variant::Coalesced | Variant::CoalescedInPlace => {
            // One call with every shape of the catalogue (the seed uses (i, i) for i in 0..10,
            // so empty tensors are part of the list), then a call with a single tensor.
            vec![shapes.clone(), vec![shapes[shapes.len() / 2].clone()]]
        }
        _ if spec.op == OpKind::Barrier => vec![vec![]],
        _ => shapes.into_iter().take(take.max(1)).map(|s| vec![s]).collect(),
    }
}

/// Where the buffers of one run live. The default (the matrix's): inputs are buffers of their
/// own, `_out` / recv outputs are views [`GUARD_ELEMS`] elements into a guarded parent.
/// With offsets set, every input (and the `_out` / recv output) is a `Backend::view` that many
/// elements into a larger parent filled with the rank's [`guard_byte`]s, with [`GUARD_ELEMS`] guard
/// elements after it too; the bytes of each parent outside its view are checked untouched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Element offset of each input view in its parent (0: inputs are plain buffers).
    pub in_offset: usize,
    /// Element offset of the `_out` / recv view in its parent (0: [`GUARD_ELEMS`]).
    pub out_offset: usize,
}

impl Layout {
    /// Where the `_out` / recv view starts in its guarded parent.
    fn out_at(&self) -> usize {
        if self.out_offset == 0 {
            GUARD_ELEMS
        } else {
            self.out_offset
        }
    }
}

/// Runs the value check for `spec` on backend `b` (a world or a subgroup).
pub fn run<B: Backend>(b: &B, spec: &ValueSpec, seed: u64, timeout: Duration, label: &str) -> CaseResult {
    run_in(b, spec, seed, timeout, label, |_| Layout::default(), &Extra::default())
}

/// What a hand-made value case changes from the matrix's runs.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    /// The shape lists to run (default: the catalogue's, as [`shape_runs`] makes them).
    pub runs: Option<Vec<Vec<Vec<usize>>>>,
    /// permute_tensor's permutation (default: the matrix's rotation `r -> r + 1`).
    pub src_dst: Option<Vec<usize>>,
    /// Inputs are arbitrary bit patterns of the dtype's width (NaN payloads, subnormals, values
    /// outside a narrower format's range): for data-moving ops, whose result is the inputs' bytes.
    pub bits: bool,
    /// The root of broadcast / reduce / gather / scatter (default: the last rank).
    pub root: Option<usize>,
    /// send / recv: each rank's partner (index = rank; symmetric; `None` sits out). Default:
    /// [`partner`]'s pairs.
    pub pairs: Option<Vec<Option<usize>>>,
}

/// [`run`] with what `extra` changes; `label` goes into every failure message.
pub fn run_extra<B: Backend>(b: &B, spec: &ValueSpec, seed: u64, timeout: Duration, label: &str, extra: &Extra) -> CaseResult {
    run_in(b, spec, seed, timeout, label, |_| Layout::default(), extra)
}

/// [`run`] over every shape list (`extra.runs`, else the catalogue's) with what `extra` changes,
/// the buffers of run `i` laid out as `layout(i)` says.
pub fn run_in<B: Backend>(
    b: &B,
    spec: &ValueSpec,
    seed: u64,
    timeout: Duration,
    label: &str,
    layout: impl Fn(usize) -> Layout,
    extra: &Extra,
) -> CaseResult {
    let ws = b.world_size();
    if let Err(reason) = b.capabilities().check(spec.op, Some(spec.variant), Some(spec.dtype), spec.reduce, ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let runs = extra.runs.clone().unwrap_or_else(|| shape_runs(spec, ws));
    for (run_idx, shapes) in runs.into_iter().enumerate() {
        run_shapes(b, spec, seed.wrapping_add(run_idx as u64 * 0x9E37_79B9), &shapes, timeout, label, layout(run_idx), extra)?;
    }
    Ok(())
}

/// Rank `r`'s input of arbitrary bit patterns (see [`Extra::bits`]).
fn bits_input(seed: u64, r: usize, ws: usize, dtype: DType, shape: &[usize]) -> Tensor {
    let carrier = match dtype.size() {
        1 => DType::U8,
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    };
    let t = concord_fixtures::input(seed, r, ws, carrier, shape, None, InputKind::Random);
    let mut t = Tensor::from_bytes(dtype, shape, t.bytes());
    // Planted at every rank's own indices: a signalling NaN, a negative signalling NaN with
    // another payload, a negative quiet NaN with a payload (a move through a wider float type
    // quiets the first two; a canonicalising one rewrites all three).
    let planted: [u64; 3] = match dtype {
        DType::F16 => [0x7c01, 0xfd55, 0xfe01],
        DType::BF16 => [0x7f81, 0xff95, 0xffc1],
        DType::F32 => [0x7f80_0001, 0xffa0_0005, 0xffc0_0003],
        DType::F64 => [0x7ff0_0000_0000_0001, 0xfff4_0000_0000_0005, 0xfff8_0000_0000_0003],
        _ => return t,
    };
    let (es, n) = (dtype.size(), t.numel());
    for (j, bits) in planted.into_iter().enumerate() {
        let i = 3 * r + j;
        if i < n {
            t.bytes_mut()[i * es..(i + 1) * es].copy_from_slice(&bits.to_le_bytes()[..es]);
        }
    }
    t
}

/// The first element whose bytes differ (a NaN for another NaN: `Exact` takes any NaN for any
/// other), as a failure's detail; `None` when every byte is equal.
fn byte_mismatch(got: &Tensor, exp: &Tensor) -> Option<String> {
    if got.bytes() == exp.bytes() {
        return None;
    }
    let es = exp.dtype().size();
    let i = (0..exp.numel()).find(|&i| got.bytes()[i * es..(i + 1) * es] != exp.bytes()[i * es..(i + 1) * es])?;
    let hex = |t: &Tensor| t.bytes()[i * es..(i + 1) * es].iter().rev().map(|b| format!("{b:02x}")).collect::<String>();
    Some(format!(
        "first bad index {i}: got bits 0x{} ({}), expected bits 0x{} ({}): data movement MUST deliver every byte as sent (a NaN's sign and payload, a signalling NaN unquieted)",
        hex(got),
        got.fmt_element(i),
        hex(exp),
        exp.fmt_element(i)
    ))
}

/// Checks that every byte of `parent` outside elements `[off, off + numel)` is still this rank's
/// [`guard_byte`].
pub(crate) fn check_frame<B: Backend>(b: &B, parent: &B::Buffer, off: usize, numel: usize, what: &str) -> Result<(), String> {
    let all = b.download(parent).map_err(|e| format!("download {what} parent: {e}"))?;
    let es = all.dtype().size();
    let bytes = all.bytes();
    let (start, end) = (off * es, (off + numel) * es);
    let g = guard_byte(b.rank());
    if let Some(i) = bytes[..start].iter().rposition(|&x| x != g) {
        return Err(format!(
            "wrote before its {what} buffer (a view {off} elements into its parent): guard byte {} before the start is 0x{:02x}, expected this rank's guard 0x{g:02x}",
            start - i,
            bytes[i]
        ));
    }
    if let Some(i) = bytes[end..].iter().position(|&x| x != g) {
        return Err(format!(
            "wrote past the end of its {what} buffer (a view {off} elements into its parent): guard byte {i} after the end is 0x{:02x}, expected this rank's guard 0x{g:02x}",
            bytes[end + i]
        ));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_shapes<B: Backend>(
    b: &B,
    spec: &ValueSpec,
    seed: u64,
    shapes: &[Vec<usize>],
    timeout: Duration,
    label: &str,
    layout: Layout,
    extra: &Extra,
) -> CaseResult {
    let call = prepare(b, spec, seed, shapes, label, layout, extra)?;
    let outs = exec::call(b, spec.op, spec.variant, &call.ins, call.out(), &call.params, timeout)
        .map_err(|e| call.fail(b, format_args!("{e} [{}]", e.name())))?;
    call.check(b, &outs)
}

/// One call of the value check, prepared on one rank: its inputs uploaded (plain buffers, or
/// views laid out as the run's [`Layout`] says), the `_out` / recv output framed by guards, the
/// call's parameters, and the oracle's answer for this rank. [`prepare`], then issue it with
/// [`Prepared::ins`], [`Prepared::out`] and [`Prepared::params`] ([`exec::call`], or
/// [`exec::issue`] with other calls in flight), then [`Prepared::check`] its results.
pub struct Prepared<B: Backend> {
    spec: ValueSpec,
    label: String,
    shapes: Vec<Vec<usize>>,
    layout: Layout,
    pub params: Params,
    my_inputs: Vec<Tensor>,
    /// Per tensor: the oracle's answer and whether its values are defined.
    expected: Vec<(Tensor, bool)>,
    /// Per tensor, where the backend declares `Rounding::Accumulate` and the result is a rounded
    /// f16 / bf16 sum: the magnitude of each result element's terms ([`magnitude_of`]).
    magnitudes: Vec<Option<Tensor>>,
    in_parents: Vec<B::Buffer>,
    pub ins: Vec<B::Buffer>,
    /// `(parent, view)` of the `_out` / recv output.
    guarded: Option<(B::Buffer, B::Buffer)>,
}

impl<B: Backend> Prepared<B> {
    /// The `_out` / recv output buffer, if the variant takes one.
    pub fn out(&self) -> Option<&B::Buffer> {
        self.guarded.as_ref().map(|g| &g.1)
    }

    /// A failure of this call: `what` after every field a reader needs to find and rerun it.
    pub fn fail(&self, b: &B, what: impl std::fmt::Display) -> CaseEnd {
        CaseEnd::Fail(format!("{}: {what}", where_str(b, &self.spec, &self.label, &self.shapes)))
    }

    /// Checks the call's results `outs` (one per input; `[]` for the barrier): identity and
    /// aliasing, dtype, shape and values against the oracle, inputs untouched by out-of-place
    /// ops, and no byte written outside the output or the input views.
    pub fn check(&self, b: &B, outs: &[B::Buffer]) -> CaseResult {
        let (spec, p, layout) = (&self.spec, &self.params, self.layout);
        let (ins, my_inputs, expected, guarded) = (&self.ins, &self.my_inputs, &self.expected, &self.guarded);
        let ws = b.world_size();
        let caps = b.capabilities();
        let fail = |what: String| self.fail(b, what);
        if outs.len() != ins.len() {
            return Err(fail(format!("returned {} results for {} inputs", outs.len(), ins.len())));
        }
        for (t, out) in outs.iter().enumerate() {
            let tag = if outs.len() > 1 { format!("tensor {t} of {}: ", outs.len()) } else { String::new() };
            let (exp, defined) = &expected[t];
            // Identity and aliasing.
            let (a_out, a_in) = (b.buffer_addr(out), b.buffer_addr(&ins[t]));
            let in_numel = my_inputs[t].numel();
            if exec::is_in_place(spec.variant) {
                if a_out != a_in {
                    return Err(fail(format!("{tag}in-place op returned a different buffer (0x{a_out:x}, input 0x{a_in:x})")));
                }
            } else if let Some((_, view)) = guarded {
                if a_out != b.buffer_addr(view) {
                    return Err(fail(format!("{tag}_out op returned a buffer other than the output it was given")));
                }
            } else if a_out == a_in && in_numel > 0 && exp.numel() > 0 && spec.op != OpKind::SendRecv {
                // An empty result overlaps nothing, whatever its address ([clause:
                // placement.empty_no_alias]): an all_to_all receiving nothing may return it at
                // its input's address, as PyTorch's empty tensors share one.
                return Err(fail(format!("{tag}out-of-place op returned its input buffer (0x{a_in:x})")));
            }
            // Shape and values.
            if b.buffer_dtype(out) != exp.dtype() {
                return Err(fail(format!("{tag}result dtype {} , expected {}", b.buffer_dtype(out), exp.dtype())));
            }
            if b.buffer_shape(out) != exp.shape() {
                return Err(fail(format!("{tag}result shape {:?}, expected {:?}", b.buffer_shape(out), exp.shape())));
            }
            let valued = *defined && !(spec.op == OpKind::SendRecv && p.peer.is_none());
            if valued && !caps.moves_data {
                crate::case::note_values_unchecked();
            }
            if valued && caps.moves_data {
                let got = b.download(out).map_err(|e| fail(format!("download: {e}")))?;
                let signed = zero_sum_sign(spec.reduce, &got, exp);
                let exp = signed.as_ref().unwrap_or(exp);
                let tol = value_tolerance(spec, ws, caps.rounding);
                // A declared `Accumulate { ulps }` beyond what a reduction of `ws` terms can
                // need is refused, not read: it would loosen the check to nothing.
                if matches!(tol, Tolerance::Ulps(_)) {
                    caps.rounding.check_bound(ws).map_err(|m| fail(format!("{tag}{m}")))?;
                }
                let checked = match (&self.magnitudes[t], tol) {
                    (Some(mag), Tolerance::Ulps(ulps)) => within_ulps_of_terms(&got, exp, mag, ulps),
                    _ => compare(&got, exp, tol),
                };
                if let Err(m) = checked {
                    return Err(fail(format!("{tag}{m}")));
                }
                if spec.reduce.is_none() {
                    if let Some(m) = byte_mismatch(&got, exp) {
                        return Err(fail(format!("{tag}{m}")));
                    }
                }
            }
            // Out-of-place ops leave their input untouched.
            if !exec::is_in_place(spec.variant) && !caps.moves_data {
                crate::case::note_values_unchecked();
            }
            if !exec::is_in_place(spec.variant) && caps.moves_data {
                let after = b.download(&ins[t]).map_err(|e| fail(format!("download input: {e}")))?;
                if let Err(m) = compare(&after, &my_inputs[t], Tolerance::Exact) {
                    return Err(fail(format!("{tag}the op modified its input: {m}")));
                }
            }
        }
        for (parent, t) in self.in_parents.iter().zip(my_inputs) {
            if caps.moves_data {
                check_frame(b, parent, layout.in_offset, t.numel(), "input").map_err(fail)?;
            } else {
                crate::case::note_values_unchecked();
            }
        }
        if let Some((parent, _)) = guarded {
            // The default frame (`out_offset` 0: the view [`GUARD_ELEMS`] into its parent) is
            // checked on every backend; a moved frame only where the backend moves data.
            if caps.moves_data || layout.out_offset == 0 {
                check_frame(b, parent, layout.out_at(), expected[0].0.numel(), "output").map_err(fail)?;
            } else {
                crate::case::note_values_unchecked();
            }
        }
        Ok(())
    }
}

/// Prepares one call of `spec` on `shapes` (one per tensor) on backend `b`: this rank's inputs
/// (drawn from `seed`), their buffers laid out as `layout` says, the output frame, the call's
/// parameters (root: `extra.root`, else the last rank; permutation: `extra.src_dst`, else the
/// rotation; send / recv between `extra.pairs`, else [`partner`]s) and the oracle's answer. `label` goes into every
/// failure message.
pub fn prepare<B: Backend>(
    b: &B,
    spec: &ValueSpec,
    seed: u64,
    shapes: &[Vec<usize>],
    label: &str,
    layout: Layout,
    extra: &Extra,
) -> Result<Prepared<B>, CaseEnd> {
    let ws = b.world_size();
    let rank = b.rank();
    let caps = b.capabilities();
    let sem = Semantics::of(&caps);
    let here = || where_str(b, spec, label, shapes);
    let fail = |what: String| CaseEnd::Fail(format!("{}: {what}", here()));

    let mut p = Params { reduce: spec.reduce, root: extra.root.unwrap_or(ws - 1), ..Default::default() };
    p.src_dst = extra.src_dst.clone().unwrap_or_else(|| (0..ws).map(|r| (r + 1) % ws).collect());
    p.peer = extra.pairs.as_ref().map_or(partner(rank, ws), |v| v[rank]);
    let split_m = (spec.op == OpKind::AllToAllSingle).then(|| concord_fixtures::split_matrix(seed, ws, 5));
    if let Some(m) = &split_m {
        p.in_splits = Some(m[rank].clone());
        p.out_splits = Some((0..ws).map(|i| m[i][rank]).collect());
    }

    // This rank's input and the oracle's answer for this rank, tensor by tensor: the inputs of
    // the ranks that answer is made of (`concord_oracle::reads`) are generated, every other
    // rank's is a placeholder of its shape (the oracle validates every rank's call from shapes).
    let coll = match &extra.pairs {
        Some(pairs) if spec.op == OpKind::SendRecv => Collective::SendRecv { src_dst: pairs.clone() },
        _ => collective_for(spec, &p, ws, split_m.as_ref()),
    };
    let read = concord_oracle::reads(&coll, ws, rank);
    let mut my_inputs = Vec::new();
    let mut expected = Vec::new();
    let mut magnitudes = Vec::new();
    let ulps_of_terms = matches!(caps.rounding, Rounding::Accumulate { .. })
        && matches!(value_tolerance(spec, ws, caps.rounding), Tolerance::Ulps(_))
        && spec.kind != InputKind::Exact;
    for (t, shape) in shapes.iter().enumerate() {
        let tseed = seed.wrapping_add(t as u64 * 7919);
        let mut inputs: Vec<Tensor> = (0..ws)
            .map(|r| {
                let s = match &split_m {
                    Some(m) => {
                        let mut s = shape.clone();
                        s[0] = m[r].iter().sum();
                        s
                    }
                    None => shape.clone(),
                };
                if (read[r] || r == rank) && extra.bits {
                    bits_input(tseed, r, ws, spec.dtype, &s)
                } else if r == rank {
                    concord_fixtures::input(tseed, r, ws, spec.dtype, &s, spec.reduce, spec.kind)
                } else if read[r] {
                    // A peer's input is made up to the last element this rank's answer reads
                    // (a reduce_scatter reads chunk `rank` of every input, a scatter the root's,
                    // an all_to_all split `rank` of every input; the rest is zeros).
                    concord_fixtures::input_prefix(tseed, r, ws, spec.dtype, &s, spec.reduce, spec.kind, read_upto(&coll, &s, ws, rank, r))
                } else {
                    Tensor::zeros(spec.dtype, &s)
                }
            })
            .collect();
        let exp = concord_oracle::expected_for(&coll, &inputs, &sem, rank)
            .map_err(|e| fail(format!("suite bug: the oracle rejected the case's own input: {e}")))?;
        magnitudes.push(if ulps_of_terms { magnitude_of(&coll, &inputs, &sem, rank) } else { None });
        my_inputs.push(inputs.swap_remove(rank));
        expected.push(exp);
    }

    // Inputs: plain buffers, or views `in_offset` elements into guarded parents.
    let mut in_parents = Vec::new();
    let mut ins: Vec<B::Buffer> = Vec::new();
    for t in &my_inputs {
        if layout.in_offset == 0 {
            ins.push(b.upload(t).map_err(|e| fail(format!("upload: {e}")))?);
            continue;
        }
        let parent_shape = [layout.in_offset + t.numel() + GUARD_ELEMS];
        let parent = b
            .upload(&Tensor::filled_bytes(spec.dtype, &parent_shape, guard_byte(b.rank())))
            .map_err(|e| fail(format!("alloc input parent: {e}")))?;
        let view = b.view(&parent, layout.in_offset, t.shape()).map_err(|e| fail(format!("view: {e}")))?;
        b.write(&view, t).map_err(|e| fail(format!("write input view: {e}")))?;
        ins.push(view);
        in_parents.push(parent);
    }

    // `_out` variants and recv write into a view framed by guard elements.
    let mut guarded = None;
    if spec.variant == Variant::OutBuf {
        let out_shape = expected[0].0.shape().to_vec();
        let n: usize = out_shape.iter().product();
        let off = layout.out_at();
        let parent_shape = [off + n + GUARD_ELEMS];
        let parent = b
            .upload(&Tensor::filled_bytes(spec.dtype, &parent_shape, guard_byte(b.rank())))
            .map_err(|e| fail(format!("alloc guarded output: {e}")))?;
        let view = b.view(&parent, off, &out_shape).map_err(|e| fail(format!("view: {e}")))?;
        guarded = Some((parent, view));
    }
    Ok(Prepared {
        spec: spec.clone(),
        label: label.to_string(),
        shapes: shapes.to_vec(),
        layout,
        params: p,
        my_inputs,
        expected,
        magnitudes,
        in_parents,
        ins,
        guarded,
    })
}

/// The magnitude of each result element's terms under `Rounding::Accumulate`: the same
/// collective summing `|x_r|` (times `|s|` for `premul_sum(s)`, over the ranks for `avg`) in f64,
/// as an f64 tensor; `None` for a collective that reduces nothing.
fn magnitude_of(coll: &Collective, inputs: &[Tensor], sem: &concord_oracle::Semantics, rank: usize) -> Option<Tensor> {
    let op = match coll {
        Collective::AllReduce { op } | Collective::ReduceScatter { op } | Collective::Reduce { op, .. } => *op,
        _ => return None,
    };
    let (scale, divide) = match op {
        ReduceOp::PremulSum(s) => (s.abs(), 1.0),
        ReduceOp::Avg => (1.0, inputs.len() as f64),
        _ => (1.0, 1.0),
    };
    let sum = ReduceOp::Sum;
    let summed = match coll {
        Collective::AllReduce { .. } => Collective::AllReduce { op: sum },
        Collective::ReduceScatter { .. } => Collective::ReduceScatter { op: sum },
        Collective::Reduce { root, .. } => Collective::Reduce { op: sum, root: *root },
        _ => return None,
    };
    let abs: Vec<Tensor> = inputs
        .iter()
        .map(|t| Tensor::from_f64(DType::F64, t.shape(), &(0..t.numel()).map(|i| t.get_f64(i).abs() * scale / divide).collect::<Vec<_>>()))
        .collect();
    concord_oracle::expected_for(&summed, &abs, sem, rank).ok().map(|(m, _)| m)
}

/// `Rounding::Accumulate { ulps }`'s check: every element within `ulps` units in the last place
/// of the magnitude of its terms (`mag`, [`magnitude_of`]) of the exact result, in the result's
/// dtype (with terms of one sign, `ulps` ulp of the result itself). A sum rounded at every step
/// is off by up to half an ulp of its largest partial sum per step, whatever cancels after.
fn within_ulps_of_terms(got: &Tensor, exp: &Tensor, mag: &Tensor, ulps: u32) -> Result<(), concord_oracle::Mismatch> {
    let eps = exp.dtype().epsilon();
    // The ulp of `m` in the dtype: 2^floor(log2 m) * eps (0 for 0: then the result is exact).
    let ulp = |m: f64| if m > 0.0 && m.is_finite() { 2f64.powi(m.log2().floor() as i32) * eps } else { 0.0 };
    let mut bounded = Vec::with_capacity(exp.numel());
    for i in 0..exp.numel() {
        let (g, e) = (got.get_f64(i), exp.get_f64(i));
        let bound = ulps as f64 * ulp(mag.get_f64(i).max(e.abs()));
        bounded.push(if (g - e).abs() <= bound || (g.is_nan() && e.is_nan()) || g == e { e } else { g });
    }
    // Elements within their bound compare as equal; the rest go through the exact comparison,
    // which names the first one with its got / expected.
    let masked = Tensor::from_f64(exp.dtype(), exp.shape(), &bounded);
    compare(&masked, exp, Tolerance::Exact).map_err(|mut m| {
        m.detail = format!("{} (Rounding::Accumulate: within {ulps} ulp of the terms' magnitude)", m.detail);
        m
    })
}

/// `exp` with each `-0` that `got` holds as `+0` made `+0`, for a float `sum` / `avg` /
/// `premul_sum` (`None`: nothing to change): the sign of such a zero is the backend's (contract,
/// [clause: values.reduce]: a fold from the first term gives IEEE 754's `-0` for a sum of `-0`
/// terms, a fold from a `+0` identity, as a BLAS dot or PyTorch's `sum`, gives `+0`). An expected
/// `+0` stays `+0` (`x + -x` is `+0` in either fold), and every other element is compared as it is.
pub fn zero_sum_sign(reduce: Option<ReduceOp>, got: &Tensor, exp: &Tensor) -> Option<Tensor> {
    let dtype = exp.dtype();
    if !dtype.is_float() || !matches!(reduce, Some(ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_))) {
        return None;
    }
    // Equal bytes hold no `+0` where `-0` is expected (one memcmp instead of a walk).
    if got.dtype() != dtype || got.numel() != exp.numel() || got.bytes() == exp.bytes() {
        return None;
    }
    let es = dtype.size();
    let neg_zero = |b: &[u8]| b[..es - 1].iter().all(|&x| x == 0) && b[es - 1] == 0x80;
    let plus_zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    let flips: Vec<usize> = (0..exp.numel())
        .filter(|&i| neg_zero(&exp.bytes()[i * es..(i + 1) * es]) && plus_zero(&got.bytes()[i * es..(i + 1) * es]))
        .collect();
    if flips.is_empty() {
        return None;
    }
    let mut e = exp.clone();
    for i in flips {
        e.bytes_mut()[i * es..(i + 1) * es].fill(0);
    }
    Some(e)
}

/// The tolerance of `spec`'s results at world size `ws`: the oracle's ([`tolerance_for`]),
/// except f16 / bf16 `sum`, `avg` and `premul_sum` wherever that is not already exact, which
/// follow the backend's declared [`Rounding`]: `ExactThenRound` is the exact result rounded
/// once (`Exact`), `Accumulate { ulps }` within `ulps` ulp of its terms' magnitude
/// ([`within_ulps_of_terms`]; `Ulps(ulps)` here); only `Unspecified` keeps the oracle's
/// worst-case bound for any summation order.
pub fn value_tolerance(spec: &ValueSpec, ws: usize, rounding: Rounding) -> Tolerance {
    if spec.kind == InputKind::Special {
        return Tolerance::Exact;
    }
    let tol = tolerance_for(spec.dtype, spec.reduce, ws, spec.kind == InputKind::Exact);
    let sum_like = matches!(spec.reduce, Some(ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_)));
    if tol == Tolerance::Exact || !sum_like || !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return tol;
    }
    match rounding {
        Rounding::ExactThenRound => Tolerance::Exact,
        Rounding::Accumulate { ulps } => Tolerance::Ulps(ulps),
        Rounding::Unspecified => tol,
    }
}

/// How many leading elements (row-major) of peer `peer`'s input of `shape` rank `rank`'s answer
/// to `coll` reads, of the peers [`concord_oracle::reads`] names: a reduce_scatter's chunk
/// `rank` (rows `rank·d0/ws ..(rank + 1)·d0/ws`) ends at element `(rank + 1)·numel/ws`, and so
/// does the root's chunk `rank` of a scatter; an all_to_all reads the peer's split `rank`, which
/// ends after its splits `0..=rank`; every other op reads a whole input.
fn read_upto(coll: &Collective, shape: &[usize], ws: usize, rank: usize, peer: usize) -> usize {
    let numel: usize = shape.iter().product();
    let divisible = shape.first().is_some_and(|d0| d0 % ws == 0);
    match coll {
        Collective::ReduceScatter { .. } | Collective::Scatter { .. } if divisible => (rank + 1) * (numel / ws),
        Collective::AllToAll { input_splits, .. } => match input_splits.get(peer) {
            Some(Some(splits)) if splits.len() == ws && splits.iter().sum::<usize>() == shape.first().copied().unwrap_or(1) => {
                splits[..=rank].iter().sum::<usize>() * shape.iter().skip(1).product::<usize>()
            }
            Some(None) if divisible => (rank + 1) * (numel / ws),
            _ => numel,
        },
        _ => numel,
    }
}

/// [`exec::collective`] (`p.reduce` is the spec's), with the split matrix's all_to_all splits.
fn collective_for(spec: &ValueSpec, p: &Params, ws: usize, split_m: Option<&Vec<Vec<usize>>>) -> Collective {
    match spec.op {
        OpKind::AllToAllSingle => {
            let m = split_m.expect("split matrix");
            Collective::AllToAll {
                input_splits: (0..ws).map(|r| Some(m[r].clone())).collect(),
                output_splits: (0..ws).map(|r| Some((0..ws).map(|i| m[i][r]).collect())).collect(),
            }
        }
        // The barrier moves no data; the oracle's all_reduce of nothing stands in.
        op => crate::exec::collective(op, p, ws).unwrap_or(Collective::AllReduce { op: ReduceOp::Sum }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's answer from peers' inputs made only up to [`read_upto`] is its answer from the
    /// whole inputs, for the collectives that read a prefix (reduce_scatter, scatter at every
    /// root, all_to_all with the split matrix's uneven splits and with equal splits), at 1..=5
    /// ranks, in an integer and a float dtype; and one element short of it is not (the prefix is
    /// no longer than it must be).
    #[test]
    fn a_peer_made_up_to_read_upto_gives_the_same_answer() {
        let sem = Semantics::default();
        for dtype in [DType::I32, DType::BF16] {
            for ws in 1..=5usize {
                let m = concord_fixtures::split_matrix(77 + ws as u64, ws, 5);
                let mut colls = vec![
                    (Collective::ReduceScatter { op: ReduceOp::Sum }, None),
                    (
                        Collective::AllToAll {
                            input_splits: (0..ws).map(|r| Some(m[r].clone())).collect(),
                            output_splits: (0..ws).map(|r| Some((0..ws).map(|i| m[i][r]).collect())).collect(),
                        },
                        Some(&m),
                    ),
                    (Collective::AllToAll { input_splits: vec![None; ws], output_splits: vec![None; ws] }, None),
                ];
                colls.extend((0..ws).map(|root| (Collective::Scatter { root }, None)));
                for (coll, splits) in colls {
                    let shape_of = |r: usize| match splits {
                        Some(m) => vec![m[r].iter().sum::<usize>(), 3],
                        None => vec![2 * ws, 3],
                    };
                    let op = matches!(coll, Collective::ReduceScatter { .. }).then_some(ReduceOp::Sum);
                    let seed = 0xABC + ws as u64;
                    let full: Vec<Tensor> =
                        (0..ws).map(|r| concord_fixtures::input(seed, r, ws, dtype, &shape_of(r), op, InputKind::Exact)).collect();
                    for rank in 0..ws {
                        let read = concord_oracle::reads(&coll, ws, rank);
                        let want = concord_oracle::expected_for(&coll, &full, &sem, rank).expect("valid");
                        let cut = |short: usize| -> Vec<Tensor> {
                            (0..ws)
                                .map(|r| {
                                    let keep = if r == rank || !read[r] {
                                        usize::MAX
                                    } else {
                                        read_upto(&coll, &shape_of(r), ws, rank, r) - short
                                    };
                                    concord_fixtures::input_prefix(seed, r, ws, dtype, &shape_of(r), op, InputKind::Exact, keep)
                                })
                                .collect()
                        };
                        let got = concord_oracle::expected_for(&coll, &cut(0), &sem, rank).expect("valid");
                        assert_eq!(got, want, "{dtype} ws{ws} {coll:?} rank {rank}");
                        // One element less changes the answer wherever the last read element is a
                        // peer's (in i32, whose exact inputs are never 0; a float's may be).
                        let last_is_read = (0..ws).any(|r| r != rank && read[r] && read_upto(&coll, &shape_of(r), ws, rank, r) > 0);
                        if dtype == DType::I32 && last_is_read && !matches!(coll, Collective::AllToAll { .. }) {
                            let short = concord_oracle::expected_for(&coll, &cut(1), &sem, rank).expect("valid");
                            assert_ne!(short, want, "{dtype} ws{ws} {coll:?} rank {rank}: read_upto is longer than needed");
                        }
                    }
                }
            }
        }
    }

    /// A float sum's `-0` may come back `+0` (a fold from a `+0` identity); an expected `+0`
    /// may not come back `-0`, a min's `-0` may not come back `+0`, and nonzero values are untouched.
    #[test]
    fn zero_sum_sign_accepts_plus_zero_for_minus_zero_sums_only() {
        let f32s = |v: &[f64]| Tensor::from_f64(DType::F32, &[v.len()], v);
        let exp = f32s(&[-0.0, 0.0, 1.0]);
        let plus = zero_sum_sign(Some(ReduceOp::Sum), &f32s(&[0.0, 0.0, 1.0]), &exp).expect("the -0 made +0");
        assert!(compare(&f32s(&[0.0, 0.0, 1.0]), &plus, Tolerance::Exact).is_ok());
        assert!(zero_sum_sign(Some(ReduceOp::Sum), &f32s(&[-0.0, -0.0, 1.0]), &exp).is_none());
        assert!(zero_sum_sign(Some(ReduceOp::Min), &f32s(&[0.0, 0.0, 1.0]), &exp).is_none());
        let f16 = |v: &[f64]| Tensor::from_f64(DType::F16, &[v.len()], v);
        let e16 = zero_sum_sign(Some(ReduceOp::Avg), &f16(&[0.0, 2.0]), &f16(&[-0.0, 2.0])).expect("f16 -0 made +0");
        assert_eq!(e16.get_f64(0).to_bits(), 0.0f64.to_bits());
    }

    /// `Rounding::Accumulate`'s bound follows the magnitude of the terms: 0.5 + 0.25 - 0.75 in f16
    /// (terms' magnitude 1.5, ulp 2^-10) may be off by up to `ulps` * 2^-10 from the exact 0, even
    /// though that is thousands of ulp of a result near 0; one ulp more fails, naming the element.
    #[test]
    fn accumulate_is_bounded_by_the_terms_magnitude() {
        let f16 = |v: &[f64]| Tensor::from_f64(DType::F16, &[v.len()], v);
        let mag = Tensor::from_f64(DType::F64, &[2], &[1.5, 3.0]);
        let exp = f16(&[0.0, 3.0]);
        let u = 2f64.powi(-10);
        assert!(within_ulps_of_terms(&f16(&[4.0 * u, 3.0]), &exp, &mag, 4).is_ok());
        let m = within_ulps_of_terms(&f16(&[5.0 * u, 3.0]), &exp, &mag, 4).unwrap_err();
        assert_eq!((m.index, m.bad_count), (0, 1), "{m:?}");
        // The second element's magnitude is 3 (ulp 2^-9): 2 ulp of it is within 2, not within 1.
        assert!(within_ulps_of_terms(&f16(&[0.0, 3.0 + 2.0 * 2.0 * u]), &exp, &mag, 2).is_ok());
        assert!(within_ulps_of_terms(&f16(&[0.0, 3.0 + 2.0 * 2.0 * u]), &exp, &mag, 1).is_err());
    }
}
