//! A size ladder per op: element counts sampled sparsely up to 64 MiB — powers of two and one
//! element either side of them, across the chunk and protocol boundaries real backends have
//! (KiB to MiB; pipelined CPU backends chunk at 64 K elements) — with every element of every
//! result checked, bit-exactly.
//!
//! * **Ops**: every data-moving op of the trait: all_reduce, all_gather_into_tensor,
//!   reduce_scatter_tensor, all_to_all_single (equal split), broadcast (in-place), reduce, gather,
//!   scatter, permute_tensor, send/recv. Reducing ops use `sum`; rooted ops root at rank ws-1.
//! * **`n`** in a case name (`sizes::all_reduce::f32::n65537::ws2`) is the element count per rank
//!   and per peer: the input of all_reduce / broadcast / reduce / permute / send-recv and of
//!   all_gather / gather (whose output is `ws·n`), the output of reduce_scatter / scatter /
//!   all_to_all (whose input is `ws·n`).
//! * **Ladder**: f32 at 1023, 1025, 4097, 65535, 65536, 65537, 262145 (world sizes 2 and 3), and
//!   at world size 2 only 1024, 4096 and 16384 (4, 16 and 64 KiB exactly: a protocol switch such
//!   as an eager limit sits at a power of two, and a limit that keeps a header inside it fails
//!   just below, never at ±1 of the rung: mutant `wild_rxm_eager_limit_minus_header`), 1048575
//!   (4 MiB, or 8 MiB for the ops whose larger buffer is `ws·n`)
//!   and the 64 MiB step: the largest buffer of the op is 64 MiB + one element per rank (`n` =
//!   16777217, or 8388609 for the ops whose larger buffer is `ws·n`), for every op: the
//!   contract's "up to at least 64 MiB" (clause `values.sizes`) is per op, and a backend's size
//!   switches are its own (a fixed 32 MiB staging buffer without a chunk loop passes every rung
//!   up to 8 MiB: mutant `sizes_all_gather_bounce_32mib`), not shm's (whose largest is 1 MiB).
//!   bf16 and i32 at 1025, 65535, 65537 (2 and 3) and 1048577 (2). That is ~300 cases and a few
//!   seconds of CPU on the shm backend, the 64 MiB ones most of it (much of it the kernel
//!   zeroing fresh pages).
//! * **Grid** ([`grid_calls`]): f32 at every world size (1–8, 16), one case per (op, variant) of
//!   [`GRID_PAIRS`] (the ladder's, in-place, `_out`, coalesced, out-of-place broadcast) and world
//!   size, calling the op with its output just past 4 Ki and just past 64 Ki elements; the rooted
//!   ops also at 7 and 1025, each rooted at the last, first and middle rank, and broadcast at 8
//!   ranks and more also just past 512 KiB, rooted at the last rank ([`LONG_BROADCAST`]): 162 cases.
//! * **Group grid** ([`group_grid_case`]): the grid's (op, variant)s on the groups of
//!   [`GROUP_LAYOUTS`] at world size 7 (every other rank, an order not the world's, every rank
//!   alone, two overlapping groups used alternately), outputs of 7, 1025, 4099 and 65537
//!   elements, roots at the group's last, first and middle rank: 18 cases.
//! * **Uneven all_to_all** ([`uneven_all_to_all_case`]): uneven and zero-length splits at every
//!   grid world size, outputs below 16 elements at 16 ranks included, a rank that moves nothing,
//!   a rank that receives nothing but sends, empty blocks to self ([`uneven_splits`]): 9 cases.
//! * **Placement** ([`call`]): outputs and in-place buffers up to [`GUARDED_OUT_MAX`] elements are
//!   views into a parent of guard bytes, checked after the call; from [`MISALIGNED_FROM`] bytes
//!   (64 KiB) they, and out-of-place inputs, sit one element past the guard: not 16-byte aligned.
//! * **Inputs** are exact by construction and cheap to make at 64 MiB: rank `r`'s element `i` is a
//!   small integer from a hash of `(seed, i)` plus `97·r` (so ranks differ at every index and no
//!   shift of the data by any number of elements goes unnoticed), in `[-63, 63]` for bf16 and
//!   `[-500001, 500001]` for f32 (a sum of up to 16 ranks is exact), any bit pattern for i32
//!   (wrapping sums). The expected result is computed in closed form from the same function
//!   ([`expected`]), which a unit test checks against the oracle at small sizes.

use super::util::{here, step_failed};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::exec::{self, Params};
use crate::values::{guard_byte, partner, GUARD_ELEMS};
use concord_core::{Backend, DType, OpKind, ReduceOp, Tensor, Variant};
use concord_fixtures::ladder::{self, Closed};
use concord_oracle::{compare, Tolerance};
use std::time::Duration;

/// The (op, variant)s of the ladder.
pub const OPS: [(OpKind, Variant); 10] = [
    (OpKind::AllReduce, Variant::Out),
    (OpKind::AllGatherIntoTensor, Variant::Out),
    (OpKind::ReduceScatterTensor, Variant::Out),
    (OpKind::AllToAllSingle, Variant::Out),
    (OpKind::Broadcast, Variant::InPlace),
    (OpKind::Reduce, Variant::Out),
    (OpKind::Gather, Variant::Out),
    (OpKind::Scatter, Variant::Out),
    (OpKind::PermuteTensor, Variant::Out),
    (OpKind::SendRecv, Variant::OutBuf),
];

/// The largest `_out` / recv output (elements) [`call`] puts in a guarded parent
/// (every size of the size grid; the ladder's rungs up to 1 Mi elements).
pub const GUARDED_OUT_MAX: usize = 1 << 20;

/// The size (bytes) from which [`call`]'s guarded buffers sit one element past [`GUARD_ELEMS`]
/// into their parent ([`frame_offset`]), and its out-of-place inputs up to [`GUARDED_OUT_MAX`]
/// elements are such views too: 36 bytes into the parent for f32 / i32, 18 for bf16, so never
/// 16-byte aligned where the parent is. A large-message path (vector loads, a copy engine) that
/// assumes the allocator's alignment reads or writes such a view from the aligned-down address
/// (review13's finding 5: the catalogue's misaligned views were all small, or in-place
/// all_reduce). Smaller buffers stay at [`GUARD_ELEMS`] (aligned, as are the 64 MiB step's plain
/// buffers), so both alignments are called at large and at small sizes.
pub const MISALIGNED_FROM: usize = 64 << 10;

/// The element offset into its guarded parent of a [`call`] buffer of `numel` elements of
/// `dtype` (see [`MISALIGNED_FROM`]).
pub fn frame_offset(dtype: DType, numel: usize) -> usize {
    if numel * dtype.size() >= MISALIGNED_FROM {
        GUARD_ELEMS + 1
    } else {
        GUARD_ELEMS
    }
}

/// A buffer of `shape` framed in a parent of guard bytes, [`frame_offset`] elements in and
/// [`GUARD_ELEMS`] before the parent's end, holding `t` (or guard bytes): `(parent, view, offset)`.
fn framed<B: Backend>(b: &B, dtype: DType, shape: &[usize], t: Option<&Tensor>) -> Result<(B::Buffer, B::Buffer, usize), String> {
    let n: usize = shape.iter().product();
    let (es, at) = (dtype.size(), frame_offset(dtype, n));
    let mut whole = Tensor::filled_bytes(dtype, &[at + n + GUARD_ELEMS], guard_byte(b.rank()));
    if let Some(t) = t {
        whole.bytes_mut()[at * es..(at + n) * es].copy_from_slice(t.bytes());
    }
    let parent = b.upload(&whole).map_err(|e| format!("upload a guarded parent: {e}"))?;
    let view = b.view(&parent, at, shape).map_err(|e| format!("view: {e}"))?;
    Ok((parent, view, at))
}

/// The largest world the bf16 inputs stay exact for (sums of 4 values in `[-63, 63]`).
pub const MAX_WS: usize = 4;

/// The largest world the inputs of `dtype` stay exact for: bf16 [`MAX_WS`]; f32 16 (a sum of 16
/// values in `[-500001, 500001]` stays below 2^24); i32 any (wrapping sums).
pub fn max_ws(dtype: DType) -> usize {
    match dtype {
        DType::BF16 => MAX_WS,
        DType::F32 => 16,
        _ => usize::MAX,
    }
}

/// The all_reduce grid cases that also run [`super::wild_custom::tail_past_16ws`] (a sum of
/// 1,048,736 bytes: past 256 KiB, a multiple of 16 bytes, not of `16 * ws`): at 5 to 8 ranks no
/// other call is (review17 finding 1, a two-shot all_reduce dropping the last rank's remainder).
pub const TAIL_GRID: [(Variant, usize); 2] = [(Variant::Out, 5), (Variant::InPlace, 8)];

/// The world sizes of the grid slice: every world size of the catalogue.
pub const GRID_WORLD_SIZES: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 16];

/// The (op, variant)s of the grid slice: the ladder's, then in-place and coalesced all_reduce,
/// the `_out` and coalesced all_gather / reduce_scatter, out-of-place broadcast. A coalesced
/// call's list is a 7-element tensor, then the `n`-element one.
pub const GRID_PAIRS: [(OpKind, Variant); 18] = [
    OPS[0],
    OPS[1],
    OPS[2],
    OPS[3],
    OPS[4],
    OPS[5],
    OPS[6],
    OPS[7],
    OPS[8],
    OPS[9],
    (OpKind::AllReduce, Variant::InPlace),
    (OpKind::AllReduce, Variant::Coalesced),
    (OpKind::AllReduce, Variant::CoalescedInPlace),
    (OpKind::AllGatherIntoTensor, Variant::OutBuf),
    (OpKind::AllGatherIntoTensor, Variant::Coalesced),
    (OpKind::ReduceScatterTensor, Variant::OutBuf),
    (OpKind::ReduceScatterTensor, Variant::Coalesced),
    (OpKind::Broadcast, Variant::Out),
];

/// Whether the op's OUTPUT is `ws·n` elements.
fn output_folds(op: OpKind) -> bool {
    matches!(op, OpKind::AllGatherIntoTensor | OpKind::Gather | OpKind::AllToAllSingle)
}

fn rooted(op: OpKind) -> bool {
    matches!(op, OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter)
}

/// The calls of a grid case of `op` at world size `ws`, as `(root, n)`: outputs of 7 elements and
/// just past 4 Ki and 64 Ki (`n` = ⌈out / ws⌉ where the output is `ws·n`); the rooted ops also at
/// 1025 elements, each size rooted at the last, the first and the middle rank; send/recv under
/// two pairings, so that at an odd world size the last rank receives too.
///
/// Why: the ladder runs its sizes at world sizes 2 and 3, rooted at the last rank, and the matrix
/// its small shapes rooted at the last rank. A backend picks its path by message size AND rank
/// count (NCCL's protocol and algorithm tables; a ring at 4 ranks and more, a tree below), and a
/// tree or a rotation by the root is where root arithmetic goes wrong. The corruption sweep
/// (`cargo xtask mutants --sweep`, docs/RESULTS.md) found about a third of its cells unchecked:
/// outputs past 4 Ki elements at 4 ranks and more, every variant but the ladder's past 4 Ki at
/// any world size, reduce / gather rooted at the first or middle rank, and the last rank of an
/// odd world never receiving.
pub fn grid_calls(op: OpKind, ws: usize) -> Vec<(usize, usize)> {
    let mut v = calls_at(op, ws, grid_outputs(op));
    if op == OpKind::Broadcast && ws >= LONG_BROADCAST_MIN_WS {
        v.push((ws - 1, LONG_BROADCAST));
    }
    v
}

/// The grid's long broadcast (elements of f32): just past 512 KiB, in the broadcast grid cases
/// (both variants) of [`LONG_BROADCAST_MIN_WS`] ranks and more, rooted at the last rank only (the
/// smaller sizes already turn the root; three roots would cost three times the call's CPU). Why: a
/// library switches its broadcast by message size AND rank count, and its long-message path may
/// start only at a rank count (MPICH: a binomial tree below `MPIR_CVAR_BCAST_MIN_PROCS` = 8 ranks at
/// any size; from 8 ranks, a scatter + ring allgather from `MPIR_CVAR_BCAST_LONG_MSG_SIZE` =
/// 512 KiB). The ladder's MiB steps run at 2 and 3 ranks and the grid's largest broadcast is
/// 256 KiB, so that path ran nowhere: mutant `wild_mpich_ibcast_scatter_block_uncounted`
/// (pmodels/mpich PR #2696, its length check failing every such broadcast) survived the whole
/// catalogue.
pub const LONG_BROADCAST: usize = (512 << 10) / 4 + 1;
const _: () = assert!(LONG_BROADCAST * 4 > 512 << 10, "the long broadcast is past 512 KiB");

/// The smallest world size whose broadcast grid case also calls [`LONG_BROADCAST`].
pub const LONG_BROADCAST_MIN_WS: usize = 8;

/// The calls of a group grid case ([`group_grid_case`]): [`grid_calls`], with every op at 1025
/// elements too (the world's small outputs are the matrix's; a group's are not).
pub fn group_grid_calls(op: OpKind, ws: usize) -> Vec<(usize, usize)> {
    calls_at(op, ws, &[7, 1025, 4099, 65537])
}

fn calls_at(op: OpKind, ws: usize, outputs: &[usize]) -> Vec<(usize, usize)> {
    let mut roots = vec![ws - 1];
    if rooted(op) {
        for r in [0, ws / 2] {
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
    } else if op == OpKind::SendRecv {
        // send/recv's "root" is the pairing's rotation ([`peer_of`]): 0 pairs 0-1, 2-3, ... (at an
        // odd world size the last rank sits out), 1 pairs 1-2, 3-4, ... and the last rank with 0.
        roots = if ws >= 3 { vec![0, 1] } else { vec![0] };
    }
    let mut v = Vec::new();
    for &root in &roots {
        for &out in outputs {
            v.push((root, if output_folds(op) { out.div_ceil(ws) } else { out }));
        }
    }
    v
}

/// The output sizes of a grid case's calls (see [`grid_calls`]).
fn grid_outputs(op: OpKind) -> &'static [usize] {
    if rooted(op) {
        &[7, 1025, 4099, 65537]
    } else {
        &[7, 4099, 65537]
    }
}

/// Rank `me`'s send/recv peer under the pairing rotated by `rot`: [`partner`] of `me + rot`,
/// rotated back (symmetric: the peer's peer is `me`).
pub fn peer_of(me: usize, ws: usize, rot: usize) -> Option<usize> {
    partner((me + rot) % ws, ws).map(|p| (p + ws - rot % ws) % ws)
}

const BIG: usize = 1 << 24;

/// Whether the op's larger buffer is `ws·n` elements (its input or its output).
fn folds(op: OpKind) -> bool {
    matches!(op, OpKind::AllGatherIntoTensor | OpKind::Gather | OpKind::ReduceScatterTensor | OpKind::Scatter | OpKind::AllToAllSingle)
}

/// The `(n, world size)`s of `op` in `dtype`.
pub fn ladder(op: OpKind, dtype: DType) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let (both, two): (&[usize], &[usize]) = match dtype {
        DType::F32 => (&[1023, 1025, 4097, 65535, 65536, 65537, 262145], &[1024, 4096, 16384, 1048575]),
        _ => (&[1025, 65535, 65537], &[1048577]),
    };
    for &n in both {
        v.push((n, 2));
        v.push((n, 3));
    }
    for &n in two {
        v.push((n, 2));
    }
    if dtype == DType::F32 {
        v.push((if folds(op) { BIG / 2 } else { BIG } + 1, 2));
    }
    v
}

/// The shape of every rank's input.
pub fn input_shape(op: OpKind, n: usize, ws: usize) -> Vec<usize> {
    if matches!(op, OpKind::ReduceScatterTensor | OpKind::Scatter | OpKind::AllToAllSingle) {
        vec![ws * n]
    } else {
        vec![n]
    }
}

/// Rank `r`'s input.
pub fn input(op: OpKind, dtype: DType, seed: u64, n: usize, ws: usize, r: usize) -> Tensor {
    ladder::tensor(dtype, seed, &input_shape(op, n, ws), Closed::From { src: r, off: 0 })
}

/// The root of rooted ops (as in the matrix) and the permutation.
fn root(ws: usize) -> usize {
    ws - 1
}

/// The ladder's `root` argument of `op`: [`root`], or send/recv's pairing rotation 0.
fn ladder_root(op: OpKind, ws: usize) -> usize {
    if op == OpKind::SendRecv {
        0
    } else {
        root(ws)
    }
}

/// Rank `me`'s expected result in closed form, or `None` where it is undefined (non-root ranks
/// of reduce and gather, a send/recv rank without partner).
pub fn expected(op: OpKind, dtype: DType, seed: u64, n: usize, ws: usize, me: usize) -> Option<Tensor> {
    let (shape, what) = expected_form(op, n, ws, me, ladder_root(op, ws))?;
    Some(ladder::tensor(dtype, seed, &shape, what))
}

/// [`expected`] as a shape and the closed form of its element `k` (generated and checked by
/// `concord_fixtures::ladder`, which keeps the loops over 16 M elements optimised).
fn expected_form(op: OpKind, n: usize, ws: usize, me: usize, src: usize) -> Option<(Vec<usize>, Closed)> {
    Some(match op {
        OpKind::AllReduce => (vec![n], Closed::Sum { ws, off: 0 }),
        OpKind::Reduce if me == src => (vec![n], Closed::Sum { ws, off: 0 }),
        OpKind::AllGatherIntoTensor => (vec![ws * n], Closed::Blocks { n, off: 0 }),
        OpKind::Gather if me == src => (vec![ws * n], Closed::Blocks { n, off: 0 }),
        OpKind::ReduceScatterTensor => (vec![n], Closed::Sum { ws, off: me * n }),
        OpKind::AllToAllSingle => (vec![ws * n], Closed::Blocks { n, off: me * n }),
        OpKind::Broadcast => (vec![n], Closed::From { src, off: 0 }),
        OpKind::Scatter => (vec![n], Closed::From { src, off: me * n }),
        // permute, send/recv: the source's input
        OpKind::PermuteTensor => (vec![n], Closed::From { src: (me + ws - 1) % ws, off: 0 }),
        // `src` is send/recv's pairing rotation (0 in the ladder).
        OpKind::SendRecv => (vec![n], Closed::From { src: peer_of(me, ws, src)?, off: 0 }),
        _ => return None,
    })
}

/// Name of a ladder case (without backend prefix).
pub fn case_name(op: OpKind, dtype: DType, n: usize, ws: usize) -> String {
    format!("sizes::{op}::{dtype}::n{n}::ws{ws}")
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut out = Vec::new();
    for (op, variant) in OPS {
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            for (n, ws) in ladder(op, dtype).into_iter().filter(|&(_, ws)| crate::case::wanted_world_size(ws)) {
                let name = case_name(op, dtype, n, ws);
                let meta = case_meta(op, variant, dtype);
                let seed = concord_fixtures::seed_for(&name);
                let c = Case::new(name, meta, ws, move |ctx| run(ctx, op, variant, dtype, n, seed));
                // The MiB steps take most of the suite's time: started first.
                out.push(if n >= 1 << 20 { c.heavy() } else { c });
            }
        }
    }
    for (op, variant) in GRID_PAIRS {
        let dtype = DType::F32;
        for ws in GRID_WORLD_SIZES.into_iter().filter(|&ws| crate::case::wanted_world_size(ws)) {
            let name = format!("sizes::{op}::{}::{dtype}::grid::ws{ws}", variant.name());
            let meta = case_meta(op, variant, dtype);
            let seed = concord_fixtures::seed_for(&name);
            out.push(Case::new(name, meta, ws, move |ctx: &mut Ctx<'_, B>| {
                for (k, (root, n)) in grid_calls(op, ctx.b.world_size()).into_iter().enumerate() {
                    call(ctx.b, ctx.timeout, op, variant, dtype, n, root, seed.wrapping_add(k as u64))?;
                }
                if op == OpKind::AllReduce && TAIL_GRID.contains(&(variant, ws)) {
                    super::wild_custom::tail_past_16ws(ctx, variant)?;
                }
                Ok(())
            }));
        }
        out.push(group_grid_case(op, variant));
    }
    for ws in GRID_WORLD_SIZES {
        out.push(uneven_all_to_all_case(ws));
    }
    for ws in [2, 3] {
        out.push(matrix_all_gather_case(ws));
    }
    out.push(matrix_reduce_scatter_case());
    out.push(wide_case());
    out
}

/// The world size of [`wide_case`]: one past 32 (a mask or slot table 32 wide gives rank 32
/// rank 0's bit).
pub const WIDE_WS: usize = 33;

/// `sizes::wide::ws33`: the only world above 16 ranks (clause `values.world_sizes`: every world
/// size up to the declared maximum). An all_reduce (sum) and an all_gather of 7 elements, a
/// broadcast and a gather rooted at rank 32, each checked in closed form where it is no declared
/// gap (all four declared gaps: UNSUPPORTED, never a pass with nothing checked). A backend that declares
/// fewer ranks refuses the world at init: UNSUPPORTED.
fn wide_case<B: Backend>() -> Case<B> {
    let meta = CaseMeta { reduce: "sum".into(), ..case_meta(OpKind::AllReduce, Variant::Out, DType::F32) };
    Case::new(format!("sizes::wide::ws{WIDE_WS}"), meta, WIDE_WS, |ctx: &mut Ctx<'_, B>| {
        let b = ctx.b;
        let (ws, me) = (b.world_size(), b.rank());
        let caps = b.capabilities();
        let n = 7;
        let of = |r: usize| Tensor::from_vec(&[n], (0..n).map(|i| (8 * r + i) as f32).collect());
        let x = b.upload(&of(me))?;
        // The four calls, each checked where the backend does not declare it a gap; a backend
        // that declares all four leaves nothing to check: UNSUPPORTED, naming them.
        let gap = |op: OpKind, reduce: Option<ReduceOp>| caps.check(op, Some(Variant::Out), Some(DType::F32), reduce, ws).err();
        let gaps = [
            gap(OpKind::AllReduce, Some(ReduceOp::Sum)),
            gap(OpKind::AllGatherIntoTensor, None),
            gap(OpKind::Broadcast, None),
            gap(OpKind::Gather, None),
        ];
        if let [Some(ar), Some(ag), Some(bc), Some(ga)] = &gaps {
            return Err(CaseEnd::Unsupported(format!(
                "declared gap: the case checks all_reduce (sum), all_gather_into_tensor, broadcast and gather (out, f32) at {ws} \
                 ranks, and the backend's capabilities declare all four unsupported: all_reduce ({ar}); all_gather_into_tensor \
                 ({ag}); broadcast ({bc}); gather ({ga})"
            )));
        }
        if gaps[0].is_none() {
            let w = format!("{} reduce=sum n={n}", here(b, "all_reduce", "out", DType::F32));
            let out = b.all_reduce(&x, ReduceOp::Sum).and_then(|wk| wk.into_value(ctx.timeout)).map_err(step_failed(&w, "all_reduce"))?;
            let sum = (0..n).map(|i| (0..ws).map(|r| (8 * r + i) as f32).sum::<f32>()).collect();
            super::util::expect_eq(b, &out, &Tensor::from_vec(&[n], sum), &w)?;
        }
        if gaps[1].is_none() {
            let w = format!("{} n={n}", here(b, "all_gather_into_tensor", "out", DType::F32));
            let out = b
                .all_gather_into_tensor(&x)
                .and_then(|wk| wk.into_value(ctx.timeout))
                .map_err(step_failed(&w, "all_gather_into_tensor"))?;
            let parts: Vec<Tensor> = (0..ws).map(of).collect();
            super::util::expect_eq(b, &out, &Tensor::cat_rows(DType::F32, &[], &parts), &w)?;
        }
        if gaps[2].is_none() {
            let root = ws - 1;
            let w = format!("{} root={root} n={n}", here(b, "broadcast", "out", DType::F32));
            let out = b.broadcast(&x, root).and_then(|wk| wk.into_value(ctx.timeout)).map_err(step_failed(&w, "broadcast"))?;
            super::util::expect_eq(b, &out, &of(root), &w)?;
        }
        if gaps[3].is_none() {
            let root = ws - 1;
            // A gather rooted at rank 32 (review20: above 16 ranks only all_reduce, all_gather and
            // broadcast ran, so a 32-bit ready mask that reads rank 32 from rank 0's slot passed).
            let w = format!("{} root={root} n={n}", here(b, "gather", "out", DType::F32));
            let out = b.gather(&x, root).and_then(|wk| wk.into_value(ctx.timeout)).map_err(step_failed(&w, "gather"))?;
            if me == root {
                let parts: Vec<Tensor> = (0..ws).map(of).collect();
                super::util::expect_eq(b, &out, &Tensor::cat_rows(DType::F32, &[], &parts), &w)?;
            }
        }
        Ok(())
    })
}

/// reduce_scatter_tensor of a `[2 * 1024, 257]` matrix (2 MiB of f32 per rank) at world size 2
/// (`sizes::reduce_scatter_tensor::out::f32::matrix::ws2`): the result MUST be `[1024, 257]`,
/// this rank's rows of the sum. The other 2-D reduce_scatters are small; a bulk path that
/// returns its flat `[numel / ws]` staging buffer from 1 MiB passed them (review13's finding 9).
/// Exact: element `i` of rank `r` is `7 r + i mod 2^16`.
fn matrix_reduce_scatter_case<B: Backend>() -> Case<B> {
    let meta = case_meta(OpKind::ReduceScatterTensor, Variant::Out, DType::F32);
    Case::new("sizes::reduce_scatter_tensor::out::f32::matrix::ws2", meta, 2, |ctx: &mut Ctx<'_, B>| {
        let b = ctx.b;
        let (ws, me) = (b.world_size(), b.rank());
        let input = [ws * 1024, MATRIX[1]];
        let w = format!("{} reduce=sum shape={input:?}", here(b, "reduce_scatter_tensor", "out", DType::F32));
        let n: usize = input.iter().product();
        let of = |r: usize, i: usize| (7 * r + i % (1 << 16)) as f32;
        let x = b.upload(&Tensor::from_vec(&input, (0..n).map(|i| of(me, i)).collect()))?;
        let out = b.reduce_scatter_tensor(&x, ReduceOp::Sum)?.into_value(ctx.timeout).map_err(step_failed(&w, "wait"))?;
        let want = [1024, MATRIX[1]];
        let shape = b.buffer_shape(&out);
        if shape != want {
            return Err(super::util::fail(&w, format!("result shape {shape:?}, expected {want:?}")));
        }
        let chunk = n / ws;
        let sum = (0..chunk).map(|i| (0..ws).map(|r| of(r, me * chunk + i)).sum::<f32>()).collect();
        super::util::expect_eq(b, &out, &Tensor::from_vec(&want, sum), &w)
    })
}

/// Rows of [`matrix_all_gather_case`]'s input, and their length: 514 KiB per rank (f32).
const MATRIX: [usize; 2] = [512, 257];

/// all_gather_into_tensor of a matrix whose result passes 1 MiB
/// (`sizes::all_gather_into_tensor::out::f32::matrix::ws2`): the result MUST be `[ws * 512, 257]`
/// with every rank's rows in rank order. The ladder above is 1-D (where a flat `[ws * numel]`
/// result is right), and the matrix's 2-D shapes are small: a bulk path that returns its flat
/// staging buffer for large outputs passed both. Exact: element `i` of rank `r` is `r * 2^18 + i`.
fn matrix_all_gather_case<B: Backend>(ws: usize) -> Case<B> {
    let name = format!("sizes::all_gather_into_tensor::out::f32::matrix::ws{ws}");
    let meta = case_meta(OpKind::AllGatherIntoTensor, Variant::Out, DType::F32);
    Case::new(name, meta, ws, |ctx: &mut Ctx<'_, B>| {
        let b = ctx.b;
        let (ws, me) = (b.world_size(), b.rank());
        let w = format!("{} shape={MATRIX:?}", here(b, "all_gather_into_tensor", "out", DType::F32));
        let n: usize = MATRIX.iter().product();
        let of = |r: usize| (0..n).map(move |i| ((r << 18) + i) as f32);
        let x = b.upload(&Tensor::from_vec(&MATRIX, of(me).collect()))?;
        let out = b.all_gather_into_tensor(&x)?.into_value(ctx.timeout).map_err(step_failed(&w, "wait"))?;
        let want = [ws * MATRIX[0], MATRIX[1]];
        let shape = b.buffer_shape(&out);
        if shape != want {
            return Err(super::util::fail(&w, format!("result shape {shape:?}, expected {want:?}")));
        }
        super::util::expect_eq(b, &out, &Tensor::from_vec(&want, (0..ws).flat_map(of).collect()), &w)
    })
}

/// A sizes case's metadata: `op` / `variant` / `dtype`, reduced with sum when the op reduces.
fn case_meta(op: OpKind, variant: Variant, dtype: DType) -> CaseMeta {
    CaseMeta {
        suite: "sizes".into(),
        op: op.name().into(),
        variant: variant.name().into(),
        dtype: dtype.name().into(),
        reduce: if op.reduces() { "sum".into() } else { String::new() },
    }
}

/// The world size of the group grid ([`group_grid_case`]).
pub const GROUP_GRID_WS: usize = 7;

/// The group layouts of the group grid at world size 7, each a list of groups (world ranks in
/// group rank order): every other rank (`[1, 3, 5]` without rank 0), groups in an order that is
/// not the world's (`[6, 1, 4]` without rank 0), every rank alone, and two groups sharing ranks 2
/// and 3, used alternately.
pub const GROUP_LAYOUTS: [(&str, &[&[usize]]); 4] = [
    ("strided", &[&[0, 2, 4, 6], &[1, 3, 5]]),
    ("unsorted", &[&[6, 1, 4], &[3, 5, 0, 2]]),
    ("singletons", &[&[0], &[1], &[2], &[3], &[4], &[5], &[6]]),
    ("overlapping", &[&[0, 1, 2, 3], &[3, 4, 5, 6, 2]]),
];

/// The size grid on subgroups: `op` / `variant` at [`group_grid_calls`]' sizes and roots (the GROUP's
/// last, first and middle rank), on every group of each of [`GROUP_LAYOUTS`] at world size 7,
/// the calls of a layout's groups interleaved (call k on each of a rank's groups, then call
/// k + 1), every result checked in closed form against the GROUP's ranks. The subgroup suite runs
/// the matrix's small shapes only, and the corruption sweep's subgroup cells (`--shape`) found a
/// group's outputs of 16 elements and more unchecked, and many variants not at all.
pub fn group_grid_case<B: Backend>(op: OpKind, variant: Variant) -> Case<B> {
    let dtype = DType::F32;
    let ws = GROUP_GRID_WS;
    let name = format!("sizes::{op}::{}::{dtype}::group_grid::ws{ws}", variant.name());
    let meta = case_meta(op, variant, dtype);
    let seed = concord_fixtures::seed_for(&name);
    Case::new(name, meta, ws, move |ctx: &mut Ctx<'_, B>| {
        if !ctx.b.capabilities().subgroups {
            return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let timeout = ctx.timeout;
        for (li, (lay, groups)) in GROUP_LAYOUTS.iter().enumerate() {
            let mine = ctx.layout(groups)?;
            let calls: Vec<Vec<(usize, usize)>> = mine.iter().map(|(g, _)| group_grid_calls(op, g.len())).collect();
            let most = calls.iter().map(Vec::len).max().unwrap_or(0);
            for k in 0..most {
                for ((g, sub), calls) in mine.iter().zip(&calls) {
                    let Some(&(root, n)) = calls.get(k) else { continue };
                    let sd = crate::suites::subgroup::group_seed(seed.wrapping_add((li * 64 + k) as u64), g);
                    call(*sub, timeout, op, variant, dtype, n, root, sd).map_err(|e| match e {
                        CaseEnd::Fail(m) => CaseEnd::Fail(format!("{m} (layout {lay}, group {g:?}: root is the group's)")),
                        e => e,
                    })?;
                }
            }
        }
        Ok(())
    })
}

/// The splits of the uneven all_to_all's call `scheme` at world size `ws`: `s[r][d]`, the elements
/// rank `r` sends to rank `d`. Scheme 0: 0 or 1 element (every output below 16 elements at every
/// world size, none empty); 1–3: 0, 1 or 2 units, the unit chosen per receiver so that its output
/// is just past 1 Ki, 4 Ki, 64 Ki elements; 4: rank 0 sends and receives nothing (empty input and
/// output), the others 1 or 2 elements; 5: 0 or 1 element again (outputs 1–11 elements) but
/// asymmetric (`s[r][d] != s[d][r]` for some pair from 2 ranks on), so that in the tiny class too a
/// receive layout taken from the send splits, or a transposed split matrix, moves the wrong
/// elements (scheme 0's matrix is symmetric: `r + 2d ≡ r − d mod 3`); 6: every rank's block to
/// itself is empty and the last rank receives nothing while it sends (1 or 2 elements to every
/// other rank): a rank with an empty output but a non-empty input, and a rank whose own block is
/// empty while its others are not, each a shape a backend may cut short on its own (a zero-size
/// receive launched anyway, horovod/horovod #2259; a return when the own block is empty,
/// open-mpi/ompi PR #10066), which scheme 4 (rank 0 moves nothing at all) does not call.
pub fn uneven_splits(scheme: usize, ws: usize) -> Vec<Vec<usize>> {
    let w = |r: usize, d: usize| -> usize {
        match scheme {
            0 => usize::from((r + 2 * d).is_multiple_of(3)),
            4 if r == 0 || d == 0 => 0,
            4 => (r + d) % 2 + 1,
            6 if r == d || d + 1 == ws => 0,
            6 => (r + d) % 2 + 1,
            5 => usize::from((r + 3 * ws - d) % 3 != 2),
            _ => (r + 2 * d + 1) % 3,
        }
    };
    let target: usize = match scheme {
        1 => 1025,
        2 => 4099,
        3 => 65537,
        _ => 0,
    };
    let unit: Vec<usize> = (0..ws)
        .map(|d| {
            let weight: usize = (0..ws).map(|r| w(r, d)).sum();
            if target == 0 || weight == 0 {
                1
            } else {
                target.div_ceil(weight)
            }
        })
        .collect();
    (0..ws).map(|r| (0..ws).map(|d| w(r, d) * unit[d]).collect()).collect()
}

/// The number of calls of the uneven all_to_all case.
pub const UNEVEN_SCHEMES: usize = 7;

/// Rank `me`'s expected output of an uneven all_to_all with splits `s` (every rank's input is
/// the ladder's `From { src: r }`): rank `r`'s elements from `Σ_{d < me} s[r][d]` on, for `s[r][me]`
/// elements, in source rank order.
pub fn uneven_expected(dtype: DType, seed: u64, s: &[Vec<usize>], me: usize) -> Tensor {
    let parts: Vec<Tensor> = (0..s.len())
        .map(|r| {
            let off: usize = s[r][..me].iter().sum();
            ladder::tensor(dtype, seed, &[s[r][me]], Closed::From { src: r, off })
        })
        .collect();
    Tensor::cat_rows(dtype, &[], &parts)
}

/// all_to_all_single with uneven splits, zero-length ones included, at world size `ws`: the
/// calls of [`uneven_splits`], every output checked in closed form. The grid's splits are equal,
/// so at 16 ranks no output was below 16 elements (the corruption sweep's last three holes), and
/// no grid call sent an empty split.
pub fn uneven_all_to_all_case<B: Backend>(ws: usize) -> Case<B> {
    let (op, variant, dtype) = (OpKind::AllToAllSingle, Variant::Out, DType::F32);
    let name = format!("sizes::{op}::uneven::{dtype}::grid::ws{ws}");
    let meta = case_meta(op, variant, dtype);
    let seed = concord_fixtures::seed_for(&name);
    Case::new(name, meta, ws, move |ctx: &mut Ctx<'_, B>| {
        let b = ctx.b;
        let (ws, me) = (b.world_size(), b.rank());
        if let Err(reason) = b.capabilities().check(op, Some(variant), Some(dtype), None, ws) {
            return Err(CaseEnd::Unsupported(reason));
        }
        for scheme in 0..UNEVEN_SCHEMES {
            let s = uneven_splits(scheme, ws);
            let sd = seed.wrapping_add(scheme as u64);
            let in_splits = s[me].clone();
            let out_splits: Vec<usize> = (0..ws).map(|r| s[r][me]).collect();
            let w = format!("{} splits: in={in_splits:?} out={out_splits:?}", here(b, op.name(), "uneven", dtype));
            let fail = |what: String| CaseEnd::Fail(format!("{w}: {what}"));
            let x = b
                .upload(&ladder::tensor(dtype, sd, &[in_splits.iter().sum()], Closed::From { src: me, off: 0 }))
                .map_err(|e| fail(format!("upload: {e}")))?;
            let p = Params { in_splits: Some(in_splits.clone()), out_splits: Some(out_splits.clone()), ..Default::default() };
            let res = exec::call(b, op, variant, &[x], None, &p, ctx.timeout).map_err(|e| fail(format!("{e} [{}]", e.name())))?;
            let [r] = &res[..] else { return Err(fail(format!("returned {} results for one input", res.len()))) };
            if !b.capabilities().moves_data {
                crate::case::note_values_unchecked();
                continue;
            }
            let got = b.download(r).map_err(|e| fail(format!("download: {e}")))?;
            let exp = uneven_expected(dtype, sd, &s, me);
            if got.shape() != exp.shape() {
                return Err(fail(format!("output shape {:?}, expected {:?}", got.shape(), exp.shape())));
            }
            if let Err(m) = compare(&got, &exp, Tolerance::Exact) {
                return Err(fail(m.to_string()));
            }
        }
        Ok(())
    })
}

fn run<B: Backend>(ctx: &mut Ctx<'_, B>, op: OpKind, variant: Variant, dtype: DType, n: usize, seed: u64) -> CaseResult {
    let ws = ctx.b.world_size();
    call(ctx.b, ctx.timeout, op, variant, dtype, n, ladder_root(op, ws), seed)
}

/// One call of `op` on communicator `b` with `n` (the ladder's meaning) rooted at `root`, every
/// result checked.
#[allow(clippy::too_many_arguments)]
fn call<B: Backend>(b: &B, timeout: Duration, op: OpKind, variant: Variant, dtype: DType, n: usize, root: usize, seed: u64) -> CaseResult {
    let (ws, me) = (b.world_size(), b.rank());
    let reduce = op.reduces().then_some(ReduceOp::Sum);
    let rooted_at = match op {
        _ if rooted(op) => format!(" root={root}"),
        OpKind::SendRecv => format!(" peer={}", peer_of(me, ws, root).map_or("none".to_string(), |p| p.to_string())),
        _ => String::new(),
    };
    let w = format!("{} reduce={}{rooted_at} n={n}", here(b, op.name(), variant.name(), dtype), if reduce.is_some() { "sum" } else { "-" });
    let fail = |what: String| CaseEnd::Fail(format!("{w}: {what}"));
    if ws > max_ws(dtype) {
        return Err(CaseEnd::Skip(format!("the size ladder's {dtype} inputs are exact up to world size {}", max_ws(dtype))));
    }
    if let Err(reason) = b.capabilities().check(op, Some(variant), Some(dtype), reduce, ws) {
        return Err(CaseEnd::Unsupported(reason));
    }
    let mut p = Params { reduce, root, ..Default::default() };
    p.src_dst = (0..ws).map(|r| (r + 1) % ws).collect();
    p.peer = if op == OpKind::SendRecv { peer_of(me, ws, root) } else { partner(me, ws) };
    // A coalesced call's list: a 7-element tensor (its own seed), then the n-element one.
    let coalesced = matches!(variant, Variant::Coalesced | Variant::CoalescedInPlace);
    let tensors: Vec<(u64, usize)> = if coalesced { vec![(seed ^ 0x7, 7), (seed, n)] } else { vec![(seed, n)] };
    let (mut ins, mut sent, mut in_frames, mut in_parents) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Where the call's buffers sit in their parents, when not at [`GUARD_ELEMS`] (named in a
    // failure: a path that assumes aligned buffers fails only there).
    let mut placed = Vec::new();
    for (i, &(sd, k)) in tensors.iter().enumerate() {
        let t = input(op, dtype, sd, k, ws, me);
        // An in-place op's buffer is its output too: up to [`GUARDED_OUT_MAX`] elements it is a
        // view into a parent of guard bytes, like an `_out` output below (a rounded-up last chunk
        // of an in-place large-message path writes past it). An out-of-place input of
        // [`MISALIGNED_FROM`] bytes or more is a view too (not aligned as the allocator's blocks).
        let in_place = exec::is_in_place(variant);
        if t.numel() <= GUARDED_OUT_MAX && (in_place || frame_offset(dtype, t.numel()) != GUARD_ELEMS) {
            let (parent, view, at) = framed(b, dtype, t.shape(), Some(&t)).map_err(&fail)?;
            if at != GUARD_ELEMS {
                placed.push(format!("input {i} at element {at}"));
            }
            ins.push(view);
            if in_place {
                in_frames.push((parent, at, t.numel()));
            } else {
                in_parents.push(parent);
            }
        } else {
            ins.push(b.upload(&t).map_err(|e| fail(format!("upload: {e}")))?);
        }
        sent.push(t);
    }
    let out_shape = match (op, variant) {
        (OpKind::SendRecv, _) => Some(vec![n]),
        (_, Variant::OutBuf) => Some(expected_form(op, n, ws, me, root).map_or_else(|| vec![n], |(s, _)| s)),
        _ => None,
    };
    // Outputs up to [`GUARDED_OUT_MAX`] elements are views into a parent of guard bytes, checked
    // after the call (the matrix guards small outputs only; a write past `_out` or a recv's
    // output on a large-message path shows only here). The ladder's larger rungs take a plain
    // buffer.
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let (out, frame) = match out_shape {
        Some(shape) if numel(&shape) <= GUARDED_OUT_MAX => {
            let (parent, view, at) = framed(b, dtype, &shape, None).map_err(&fail)?;
            if at != GUARD_ELEMS {
                placed.push(format!("output at element {at}"));
            }
            (Some(view), Some((parent, at, numel(&shape))))
        }
        Some(shape) => (Some(b.alloc(dtype, &shape).map_err(|e| fail(format!("alloc: {e}")))?), None),
        None => (None, None),
    };
    let w = if placed.is_empty() { w } else { format!("{w} (views into guarded parents: {})", placed.join(", ")) };
    let fail = |what: String| CaseEnd::Fail(format!("{w}: {what}"));
    let res = exec::call(b, op, variant, &ins, out.as_ref(), &p, timeout).map_err(|e| fail(format!("{e} [{}]", e.name())))?;
    if res.len() != tensors.len() {
        return Err(fail(format!("returned {} result(s) for {} input(s)", res.len(), tensors.len())));
    }
    for (t, (r, x)) in res.iter().zip(&ins).enumerate() {
        if exec::is_in_place(variant) && b.buffer_addr(r) != b.buffer_addr(x) {
            return Err(fail(format!("in-place op returned a different buffer (tensor {t})")));
        }
        // An empty result (or input) overlaps nothing, whatever its address
        // ([clause: placement.empty_no_alias]).
        let filled = |x: &B::Buffer| b.buffer_shape(x).iter().product::<usize>() > 0;
        if !exec::is_in_place(variant) && filled(r) && ins.iter().any(|i| filled(i) && b.buffer_addr(r) == b.buffer_addr(i)) {
            return Err(fail(format!("out-of-place op returned an input buffer (tensor {t})")));
        }
    }
    // A recv's result too: `recv` MUST return `out`, and `out` is what is checked below.
    if variant == Variant::OutBuf {
        if let (Some(o), Some(r)) = (&out, res.first()) {
            if b.buffer_addr(r) != b.buffer_addr(o) {
                return Err(fail("the `_out` call (or recv) returned a buffer other than its output".into()));
            }
        }
    }
    if let Some((parent, at, numel)) = &frame {
        crate::values::check_frame(b, parent, *at, *numel, "output").map_err(fail)?;
    }
    for (t, (parent, at, numel)) in in_frames.iter().enumerate() {
        crate::values::check_frame(b, parent, *at, *numel, &format!("in-place (tensor {t})")).map_err(fail)?;
    }
    if !b.capabilities().moves_data {
        crate::case::note_values_unchecked();
        return Ok(());
    }
    for (t, (r, &(sd, k))) in res.iter().zip(&tensors).enumerate() {
        let Some((shape, what)) = expected_form(op, k, ws, me, root) else { continue };
        let got = b.download(r).map_err(|e| fail(format!("download: {e}")))?;
        // Element by element against the closed form (fast at 64 MiB, no expected tensor made);
        // on a difference, the oracle's comparison with the expected tensor names the first bad
        // element.
        if !ladder::holds(&got, dtype, sd, &shape, what) {
            let exp = ladder::tensor(dtype, sd, &shape, what);
            let which = if coalesced { format!("tensor {t} of the list (n={k}): ") } else { String::new() };
            return Err(match compare(&got, &exp, Tolerance::Exact) {
                Err(m) => fail(format!("{which}{m}")),
                Ok(()) => fail(format!("{which}result differs from the expected one in its bytes, though not in value")),
            });
        }
    }
    // Out-of-place ops leave their inputs untouched at every size (the matrix checks it at small
    // sizes only; a backend that receives into its input above some size passes it).
    if !exec::is_in_place(variant) {
        for (t, (x, kept)) in ins.iter().zip(&sent).enumerate() {
            let after = b.download(x).map_err(|e| fail(format!("download input: {e}")))?;
            if after.bytes() != kept.bytes() {
                return Err(match compare(&after, kept, Tolerance::Exact) {
                    Err(m) => fail(format!("the out-of-place op modified its input (tensor {t}): {m}")),
                    Ok(()) => fail(format!("the out-of-place op modified its input's bytes (tensor {t}), though not its values")),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_oracle::{Collective, Semantics};

    fn collective(op: OpKind, ws: usize, root: usize) -> Collective {
        let p = crate::exec::Params { root, src_dst: (0..ws).map(|r| (r + 1) % ws).collect(), ..Default::default() };
        crate::exec::collective(op, &p, ws).expect("the ladder's ops move data")
    }

    #[test]
    fn closed_form_matches_the_oracle() {
        for (op, _) in OPS {
            for dtype in [DType::F32, DType::BF16, DType::I32] {
                // send/recv's `root` is its pairing rotation: the oracle pairs as rotation 0.
                let srcs = move |ws: usize| if op == OpKind::SendRecv { vec![0] } else { vec![ws - 1, 0, ws / 2] };
                for (ws, n, src) in (1..=max_ws(dtype).min(16))
                    .flat_map(|ws| [1, 37, 130].into_iter().flat_map(move |n| srcs(ws).into_iter().map(move |r| (ws, n, r))))
                {
                    {
                        let seed = 0x5EED ^ n as u64;
                        let ins: Vec<Tensor> = (0..ws).map(|r| input(op, dtype, seed, n, ws, r)).collect();
                        let exp = concord_oracle::expected(&collective(op, ws, src), &ins, &Semantics::default()).unwrap();
                        for me in 0..ws {
                            let form = expected_form(op, n, ws, me, src);
                            match form.map(|(shape, what)| ladder::tensor(dtype, seed, &shape, what)) {
                                Some(t) => {
                                    assert!(exp.defined[me], "{op} {dtype} ws{ws} rank {me}: defined");
                                    assert_eq!(t, exp.outputs[me], "{op} {dtype} n{n} ws{ws} root {src} rank {me}");
                                    // The in-place check accepts exactly that tensor.
                                    let (shape, what) = expected_form(op, n, ws, me, src).unwrap();
                                    let holds = |t: &Tensor, shape: &[usize]| ladder::holds(t, dtype, seed, shape, what);
                                    assert!(holds(&t, &shape), "{op} {dtype} n{n} ws{ws} rank {me}: holds");
                                    let mut bad = t.clone();
                                    let last = bad.len_bytes() - 1;
                                    bad.bytes_mut()[last] ^= 0x40;
                                    assert!(!holds(&bad, &shape), "{op} {dtype} n{n} ws{ws} rank {me}: a changed element holds");
                                    assert!(!holds(&t.clone().reshaped(&[1, t.numel()]), &shape), "{op} {dtype}: another shape holds");
                                }
                                None => assert!(!exp.defined[me] || op == OpKind::SendRecv, "{op} {dtype} ws{ws} rank {me}"),
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every call of the grid lands in the size class it is there for (the corruption sweep's:
    /// tiny < 16 <= small < 4 Ki <= medium < 64 Ki <= large), at every world size; the tiny
    /// call of an op whose output is `ws·n` cannot be tiny at 16 ranks. At every world size from
    /// 2, every rank receives under one of send/recv's pairings.
    #[test]
    fn grid_calls_land_in_their_size_classes() {
        let class = |k: usize| [16, 4096, 65536].iter().filter(|&&b| k >= b).count();
        for (op, _) in GRID_PAIRS {
            for ws in GRID_WORLD_SIZES {
                let mut calls = grid_calls(op, ws);
                // The long broadcast at 8 ranks and more comes last, past 512 KiB of f32.
                if op == OpKind::Broadcast && ws >= LONG_BROADCAST_MIN_WS {
                    assert_eq!(calls.pop(), Some((ws - 1, LONG_BROADCAST)), "broadcast ws{ws}: the long call last");
                }
                let outs = grid_outputs(op);
                assert_eq!(calls.len() % outs.len(), 0);
                for (i, &(root, n)) in calls.iter().enumerate() {
                    assert!(root < ws);
                    let got = if output_folds(op) { ws * n } else { n };
                    let want = class(outs[i % outs.len()]);
                    if output_folds(op) && ws >= 16 && want == 0 {
                        assert_eq!(class(got), 1, "{op} ws{ws}: the tiny call is small");
                    } else {
                        assert_eq!(class(got), want, "{op} ws{ws} n{n}: output {got} in the wrong class");
                    }
                }
                if rooted(op) {
                    let roots: std::collections::BTreeSet<usize> = calls.iter().map(|c| c.0).collect();
                    assert_eq!(roots.len(), [ws - 1, 0, ws / 2].iter().collect::<std::collections::BTreeSet<_>>().len());
                }
                if op == OpKind::SendRecv {
                    // Every rank receives under one of the pairings, and each pairing is symmetric.
                    for me in 0..ws {
                        let peers: Vec<usize> = calls.iter().filter_map(|c| peer_of(me, ws, c.0)).collect();
                        assert!(ws == 1 || !peers.is_empty(), "ws{ws} rank {me} never receives");
                        for c in &calls {
                            if let Some(p) = peer_of(me, ws, c.0) {
                                assert_ne!(p, me);
                                assert_eq!(peer_of(p, ws, c.0), Some(me), "ws{ws} rot {}", c.0);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_differ_at_every_index_and_sums_stay_exact() {
        for dtype in [DType::F32, DType::BF16] {
            let ws = max_ws(dtype);
            for i in 0..5000 {
                let vs: Vec<i64> = (0..ws).map(|r| ladder::value(dtype, 7, r, i)).collect();
                for a in 0..ws {
                    for c in a + 1..ws {
                        assert_ne!(vs[a], vs[c]);
                    }
                }
                let bound = if dtype == DType::BF16 { 256 } else { 1 << 24 };
                assert!(vs.iter().map(|v| v.abs()).sum::<i64>() <= bound);
            }
        }
    }

    /// The uneven all_to_all's closed form is the oracle's, every output lands in its scheme's
    /// size class (scheme 0 below 16 elements at every world size, none empty), and zero-length
    /// splits occur from 2 ranks on.
    #[test]
    fn uneven_all_to_all_matches_the_oracle_and_its_classes() {
        let class = |k: usize| [16, 4096, 65536].iter().filter(|&&b| k >= b).count();
        for ws in GRID_WORLD_SIZES {
            for scheme in 0..UNEVEN_SCHEMES {
                let sp = uneven_splits(scheme, ws);
                let outs: Vec<usize> = (0..ws).map(|d| (0..ws).map(|r| sp[r][d]).sum()).collect();
                match scheme {
                    0 | 5 => assert!(outs.iter().all(|&o| (1..16).contains(&o)), "scheme {scheme} ws{ws}: {outs:?}"),
                    4 => assert!(outs[0] == 0 && sp[0].iter().all(|&n| n == 0), "ws{ws}: rank 0 moves nothing"),
                    6 => {
                        assert!(outs[ws - 1] == 0 && (0..ws).all(|r| sp[r][r] == 0), "ws{ws}: {sp:?}");
                        if ws >= 2 {
                            assert!(sp[ws - 1].iter().any(|&n| n > 0), "ws{ws}: the last rank sends nothing: {sp:?}");
                        }
                    }
                    k => {
                        let want = class([1025, 4099, 65537][k - 1]);
                        assert!(outs.iter().all(|&o| class(o) == want), "scheme {k} ws{ws}: {outs:?}");
                    }
                }
                if ws >= 2 && scheme != 4 {
                    assert!(sp.iter().flatten().any(|&n| n == 0), "scheme {scheme} ws{ws}: no empty split");
                }
                // Send and receive layouts differ (a transposed matrix moves the wrong elements),
                // tiny outputs included (scheme 5); scheme 0 is symmetric by construction.
                if ws >= 2 && scheme != 0 && scheme != 4 {
                    assert!((0..ws).any(|r| (0..ws).any(|d| sp[r][d] != sp[d][r])), "scheme {scheme} ws{ws}: symmetric splits");
                }
                if scheme == 3 && ws > 4 {
                    continue; // the oracle at 64 Ki elements per rank: covered by scheme 2's arithmetic
                }
                let seed = 0x5EED ^ (scheme * 31 + ws) as u64;
                let ins: Vec<Tensor> =
                    (0..ws).map(|r| ladder::tensor(DType::F32, seed, &[sp[r].iter().sum()], Closed::From { src: r, off: 0 })).collect();
                let c = concord_oracle::Collective::AllToAll {
                    input_splits: (0..ws).map(|r| Some(sp[r].clone())).collect(),
                    output_splits: (0..ws).map(|d| Some((0..ws).map(|r| sp[r][d]).collect())).collect(),
                };
                let exp = concord_oracle::expected(&c, &ins, &Semantics::default()).unwrap();
                for me in 0..ws {
                    assert_eq!(uneven_expected(DType::F32, seed, &sp, me), exp.outputs[me], "scheme {scheme} ws{ws} rank {me}");
                }
            }
        }
    }

    /// The group grid's calls land in their size classes on groups of 1 to 5 ranks, and its
    /// layouts are groups of distinct world ranks below its world size.
    #[test]
    fn group_grid_calls_land_in_their_size_classes() {
        let class = |k: usize| [16, 4096, 65536].iter().filter(|&&b| k >= b).count();
        for (op, _) in GRID_PAIRS {
            for n in 1..=5 {
                for (i, &(root, k)) in group_grid_calls(op, n).iter().enumerate() {
                    assert!(root < n);
                    let got = if output_folds(op) { n * k } else { k };
                    assert_eq!(class(got), i % 4, "{op} group of {n}: output {got}");
                }
            }
        }
        for (lay, groups) in GROUP_LAYOUTS {
            for g in groups {
                let mut m = g.to_vec();
                m.sort();
                m.dedup();
                assert!(m.len() == g.len() && m.iter().all(|&r| r < GROUP_GRID_WS), "{lay} {g:?}");
            }
        }
    }
}
