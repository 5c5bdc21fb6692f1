//! Cross-rank validation. NCCL hangs or silently truncates when ranks pass mismatched inputs,
//! so before every collective each rank publishes a small fixed-size header (op, sequence
//! number, dtype, shape, reduce op, root, splits, and any error it found locally) and every rank
//! runs the same pure [`validate`] over all headers. Because the input is identical everywhere,
//! so is the verdict: every rank returns the same named error, or every rank proceeds.
//!
//! This module is pure (no CUDA, no NCCL) and unit-tested on any machine.

use concord_core::{BadInputKind, DType, ReduceOp};

/// Header words before the split tables.
pub const FIXED: usize = 20;
const MAGIC: u64 = 0x434f_4e43_4f52_4431; // "CONCORD1"

const W_MAGIC: usize = 0;
const W_OP: usize = 1;
const W_SEQ: usize = 2;
const W_DTYPE: usize = 3;
const W_SHAPE: usize = 4;
const W_NUMEL: usize = 5;
const W_NDIM: usize = 6;
const W_DIMS: usize = 7; // 6 dims, for messages
const N_DIMS: usize = 6;
const W_REDUCE: usize = 13;
const W_ROOT: usize = 14;
const W_COUNT: usize = 15;
const W_AUX: usize = 16;
const W_ERR: usize = 17;
const W_PEER: usize = 18;

/// Ops that exchange a header, by the trait method's name.
pub const OPS: &[&str] = &[
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
    "new_group",
];

fn op_code(op: &str) -> u64 {
    OPS.iter()
        .position(|o| *o == op)
        .map(|i| i as u64 + 1)
        .unwrap_or(0)
}
fn op_name(code: u64) -> &'static str {
    OPS.get((code as usize).wrapping_sub(1))
        .copied()
        .unwrap_or("?")
}
fn dtype_code(d: DType) -> u64 {
    DType::ALL
        .iter()
        .position(|x| *x == d)
        .map(|i| i as u64 + 1)
        .unwrap_or(0)
}
fn dtype_name(code: u64) -> String {
    DType::ALL
        .get((code as usize).wrapping_sub(1))
        .map(|d| d.name().to_string())
        .unwrap_or_else(|| format!("#{code:x}"))
}
/// 0 means "no error" in the header word, so kinds are stored as code + 1.
fn kind_code(k: BadInputKind) -> u64 {
    k.code() + 1
}
fn reduce_code(op: ReduceOp) -> u64 {
    ReduceOp::ALL
        .iter()
        .position(|x| x.name() == op.name())
        .map(|i| i as u64 + 1)
        .unwrap_or(0)
}

/// FNV-1a over 64-bit words: a stable hash for lists (shapes, permutations, group members).
pub fn hash_words(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn shape_hash(shape: &[usize]) -> u64 {
    hash_words(std::iter::once(shape.len() as u64).chain(shape.iter().map(|&d| d as u64)))
}

/// Number of 64-bit words in a header for a world of `ws` ranks.
pub fn header_len(ws: usize) -> usize {
    FIXED + 2 * ws
}

/// One rank's header.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub words: Vec<u64>,
    ws: usize,
}

impl Header {
    pub fn new(ws: usize, op: &str, seq: u64) -> Header {
        let mut words = vec![0u64; header_len(ws)];
        words[W_MAGIC] = MAGIC;
        words[W_OP] = op_code(op);
        words[W_SEQ] = seq;
        words[W_ROOT] = u64::MAX;
        words[W_PEER] = u64::MAX;
        Header { words, ws }
    }
    pub fn tensor(mut self, dtype: DType, shape: &[usize]) -> Self {
        self.words[W_DTYPE] = dtype_code(dtype);
        self.words[W_SHAPE] = shape_hash(shape);
        self.words[W_NUMEL] = shape.iter().product::<usize>() as u64;
        self.words[W_NDIM] = shape.len() as u64;
        for (i, d) in shape.iter().take(N_DIMS).enumerate() {
            self.words[W_DIMS + i] = *d as u64;
        }
        self
    }
    /// A list of tensors (coalesced ops): count, and hashes of the dtypes and of the shapes.
    pub fn list(mut self, items: &[(DType, Vec<usize>)]) -> Self {
        self.words[W_COUNT] = items.len() as u64;
        self.words[W_DTYPE] = hash_words(items.iter().map(|(d, _)| dtype_code(*d)));
        self.words[W_SHAPE] = hash_words(items.iter().map(|(_, s)| shape_hash(s)));
        self.words[W_NUMEL] = items
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum();
        self
    }
    pub fn reduce(mut self, op: ReduceOp) -> Self {
        self.words[W_REDUCE] = reduce_code(op);
        self
    }
    pub fn root(mut self, root: usize) -> Self {
        self.words[W_ROOT] = root as u64;
        self
    }
    pub fn peer(mut self, peer: usize) -> Self {
        self.words[W_PEER] = peer as u64;
        self
    }
    pub fn aux(mut self, hash: u64) -> Self {
        self.words[W_AUX] = hash;
        self
    }
    pub fn splits(mut self, input: &[usize], output: &[usize]) -> Self {
        for (i, v) in input.iter().take(self.ws).enumerate() {
            self.words[FIXED + i] = *v as u64;
        }
        for (i, v) in output.iter().take(self.ws).enumerate() {
            self.words[FIXED + self.ws + i] = *v as u64;
        }
        self
    }
    /// Records an error this rank found on its own; every rank will report its kind.
    pub fn error(mut self, kind: BadInputKind) -> Self {
        self.words[W_ERR] = kind_code(kind);
        self
    }
    pub fn to_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// Splits a gathered byte buffer into `ws` headers.
pub fn parse_all(bytes: &[u8], ws: usize) -> Vec<Vec<u64>> {
    let n = header_len(ws);
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect::<Vec<_>>()
        .chunks(n)
        .take(ws)
        .map(|c| c.to_vec())
        .collect()
}

fn shape_str(h: &[u64]) -> String {
    let nd = h[W_NDIM] as usize;
    let dims: Vec<String> = h[W_DIMS..W_DIMS + nd.min(N_DIMS)]
        .iter()
        .map(|d| d.to_string())
        .collect();
    let more = if nd > N_DIMS { ", …" } else { "" };
    format!("{}[{}{more}]", dtype_name(h[W_DTYPE]), dims.join(", "))
}

fn per_rank(all: &[Vec<u64>], f: impl Fn(&[u64]) -> String) -> String {
    all.iter()
        .enumerate()
        .map(|(r, h)| format!("rank {r}: {}", f(h)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn differs(all: &[Vec<u64>], w: usize) -> bool {
    all.iter().any(|h| h[w] != all[0][w])
}

/// What must agree across ranks for an op.
struct Rules {
    dtype: bool,
    shape: bool,
    list: bool,
    reduce: bool,
    root: bool,
    aux: Option<BadInputKind>,
    splits: bool,
}

fn rules(op: &str) -> Rules {
    let r = Rules {
        dtype: false,
        shape: false,
        list: false,
        reduce: false,
        root: false,
        aux: None,
        splits: false,
    };
    match op {
        "all_reduce" | "all_reduce_" | "reduce_scatter_tensor" | "reduce_scatter_tensor_out" => {
            Rules {
                dtype: true,
                shape: true,
                reduce: true,
                ..r
            }
        }
        "all_reduce_coalesced" | "all_reduce_coalesced_" | "reduce_scatter_tensor_coalesced" => {
            Rules {
                list: true,
                reduce: true,
                ..r
            }
        }
        "all_gather_into_tensor" | "all_gather_into_tensor_out" => Rules {
            dtype: true,
            shape: true,
            ..r
        },
        "all_gather_into_tensor_coalesced" => Rules { list: true, ..r },
        "all_to_all_single" => Rules {
            dtype: true,
            aux: Some(BadInputKind::ShapeMismatch),
            splits: true,
            ..r
        },
        "broadcast" | "broadcast_" | "gather" | "scatter" => Rules {
            dtype: true,
            shape: true,
            root: true,
            ..r
        },
        "reduce" => Rules {
            dtype: true,
            shape: true,
            reduce: true,
            root: true,
            ..r
        },
        "permute_tensor" => Rules {
            dtype: true,
            shape: true,
            aux: Some(BadInputKind::BadPermutation),
            ..r
        },
        "new_group" => Rules {
            aux: Some(BadInputKind::BadGroup),
            ..r
        },
        _ => r,
    }
}

/// The verdict over every rank's header (the same on every rank). `Err((kind, detail))`.
pub fn validate(all: &[Vec<u64>]) -> Result<(), (BadInputKind, String)> {
    use BadInputKind::*;
    if all.is_empty() {
        return Ok(());
    }
    if all.iter().any(|h| h[W_MAGIC] != MAGIC) {
        return Err((OpMismatch, "a rank sent a malformed validation header (a different collective or backend version?)".into()));
    }
    if differs(all, W_OP) || differs(all, W_SEQ) {
        return Err((
            OpMismatch,
            format!(
                "ranks issued different collectives: {}",
                per_rank(all, |h| format!("{} #{}", op_name(h[W_OP]), h[W_SEQ]))
            ),
        ));
    }
    if let Some((r, h)) = all.iter().enumerate().find(|(_, h)| h[W_ERR] != 0) {
        let kind = BadInputKind::from_code(h[W_ERR] - 1).unwrap_or(UnsupportedOp);
        return Err((
            kind,
            format!("rank {r} rejected its own input ({})", kind.name()),
        ));
    }
    let op = op_name(all[0][W_OP]);
    let ru = rules(op);
    if ru.list {
        if differs(all, W_COUNT) {
            return Err((
                CountMismatch,
                format!(
                    "coalesced list lengths differ: {}",
                    per_rank(all, |h| h[W_COUNT].to_string())
                ),
            ));
        }
        if differs(all, W_DTYPE) {
            return Err((
                DTypeMismatch,
                "the dtypes of the coalesced tensors differ across ranks".into(),
            ));
        }
        if differs(all, W_SHAPE) {
            return Err((
                ShapeMismatch,
                "the shapes of the coalesced tensors differ across ranks".into(),
            ));
        }
    }
    if ru.dtype && differs(all, W_DTYPE) {
        return Err((
            DTypeMismatch,
            format!(
                "dtypes differ across ranks: {}",
                per_rank(all, |h| dtype_name(h[W_DTYPE]))
            ),
        ));
    }
    if ru.shape && differs(all, W_SHAPE) {
        return Err((
            ShapeMismatch,
            format!("shapes differ across ranks: {}", per_rank(all, shape_str)),
        ));
    }
    if ru.reduce && differs(all, W_REDUCE) {
        let name = |h: &[u64]| {
            ReduceOp::ALL
                .get((h[W_REDUCE] as usize).wrapping_sub(1))
                .map(|o| o.name())
                .unwrap_or("?")
                .to_string()
        };
        return Err((
            ReduceOpMismatch,
            format!("reduce ops differ across ranks: {}", per_rank(all, name)),
        ));
    }
    if ru.root && differs(all, W_ROOT) {
        return Err((
            BadRoot,
            format!(
                "roots differ across ranks: {}",
                per_rank(all, |h| h[W_ROOT].to_string())
            ),
        ));
    }
    if let Some(kind) = ru.aux {
        if differs(all, W_AUX) {
            let what = match kind {
                BadPermutation => "permutations (src_dst) differ across ranks",
                BadGroup => "subgroup rank lists differ across ranks",
                _ => "row shapes (all dims but the first) differ across ranks",
            };
            return Err((kind, what.into()));
        }
    }
    if ru.splits {
        let ws = all.len();
        for i in 0..ws {
            for j in 0..ws {
                let out_i_from_j = all[i][FIXED + ws + j];
                let in_j_to_i = all[j][FIXED + i];
                if out_i_from_j != in_j_to_i {
                    return Err((
                        SplitMismatch,
                        format!("rank {i} expects {out_i_from_j} rows from rank {j}, which sends it {in_j_to_i}"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The verdict for a send/recv pair, from this rank's header and the peer's (the same verdict on
/// both sides). `me` and `peer` are ranks.
pub fn validate_pair(
    mine: &[u64],
    theirs: &[u64],
    me: usize,
    peer: usize,
) -> Result<(), (BadInputKind, String)> {
    use BadInputKind::*;
    if mine[W_MAGIC] != MAGIC || theirs[W_MAGIC] != MAGIC {
        return Err((OpMismatch, "malformed send/recv validation header".into()));
    }
    if mine[W_ERR] != 0 || theirs[W_ERR] != 0 {
        let (r, h) = if mine[W_ERR] != 0 {
            (me, mine)
        } else {
            (peer, theirs)
        };
        let kind = BadInputKind::from_code(h[W_ERR] - 1).unwrap_or(UnsupportedOp);
        return Err((
            kind,
            format!("rank {r} rejected its own input ({})", kind.name()),
        ));
    }
    let (a, b) = (op_name(mine[W_OP]), op_name(theirs[W_OP]));
    let complementary = (a == "send" && b == "recv") || (a == "recv" && b == "send");
    if !complementary {
        return Err((
            OpMismatch,
            format!("rank {me} called {a} but its peer rank {peer} called {b}"),
        ));
    }
    if theirs[W_PEER] != me as u64 {
        return Err((
            BadPeer,
            format!(
                "rank {peer} named rank {} as its peer, not rank {me}",
                theirs[W_PEER]
            ),
        ));
    }
    if mine[W_DTYPE] != theirs[W_DTYPE] {
        return Err((
            DTypeMismatch,
            format!(
                "send/recv dtypes differ: {} vs {}",
                dtype_name(mine[W_DTYPE]),
                dtype_name(theirs[W_DTYPE])
            ),
        ));
    }
    if mine[W_NUMEL] != theirs[W_NUMEL] {
        return Err((
            OutBufferSize,
            format!(
                "send/recv sizes differ: rank {me} has {} elements, rank {peer} has {}",
                mine[W_NUMEL], theirs[W_NUMEL]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(ws: usize, shape: &[usize], dt: DType, op: ReduceOp) -> Vec<u64> {
        Header::new(ws, "all_reduce", 7)
            .tensor(dt, shape)
            .reduce(op)
            .words
    }

    #[test]
    fn equal_headers_pass_and_every_mismatch_is_named() {
        let ok = ar(2, &[4], DType::F32, ReduceOp::Sum);
        assert!(validate(&[ok.clone(), ok.clone()]).is_ok());
        let shape = ar(2, &[5], DType::F32, ReduceOp::Sum);
        assert_eq!(
            validate(&[ok.clone(), shape]).unwrap_err().0,
            BadInputKind::ShapeMismatch
        );
        let dt = ar(2, &[4], DType::F64, ReduceOp::Sum);
        assert_eq!(
            validate(&[ok.clone(), dt]).unwrap_err().0,
            BadInputKind::DTypeMismatch
        );
        let red = ar(2, &[4], DType::F32, ReduceOp::Max);
        assert_eq!(
            validate(&[ok.clone(), red]).unwrap_err().0,
            BadInputKind::ReduceOpMismatch
        );
        let other = Header::new(2, "broadcast", 7)
            .tensor(DType::F32, &[4])
            .words;
        assert_eq!(
            validate(&[ok.clone(), other]).unwrap_err().0,
            BadInputKind::OpMismatch
        );
        let seq = Header::new(2, "all_reduce", 8)
            .tensor(DType::F32, &[4])
            .reduce(ReduceOp::Sum)
            .words;
        assert_eq!(
            validate(&[ok.clone(), seq]).unwrap_err().0,
            BadInputKind::OpMismatch
        );
    }

    #[test]
    fn verdict_is_identical_whichever_rank_computes_it() {
        let a = ar(3, &[4, 2], DType::I32, ReduceOp::Sum);
        let b = ar(3, &[4, 3], DType::I32, ReduceOp::Sum);
        let all = vec![a.clone(), a, b];
        // Every rank runs validate over the same gathered list: the result is a pure function of it.
        assert_eq!(validate(&all), validate(&all.clone()));
        let (kind, detail) = validate(&all).unwrap_err();
        assert_eq!(kind, BadInputKind::ShapeMismatch);
        assert!(detail.contains("rank 2: i32[4, 3]"), "{detail}");
    }

    #[test]
    fn a_local_error_on_one_rank_fails_every_rank_with_its_kind() {
        let ok = Header::new(2, "all_gather_into_tensor_out", 1)
            .tensor(DType::U8, &[3])
            .words;
        let bad = Header::new(2, "all_gather_into_tensor_out", 1)
            .tensor(DType::U8, &[3])
            .error(BadInputKind::OutBufferSize)
            .words;
        let (kind, detail) = validate(&[ok, bad]).unwrap_err();
        assert_eq!(kind, BadInputKind::OutBufferSize);
        assert!(detail.contains("rank 1"), "{detail}");
    }

    #[test]
    fn all_to_all_splits_must_match_pairwise() {
        let h = |i: &[usize], o: &[usize]| {
            Header::new(2, "all_to_all_single", 3)
                .tensor(DType::F32, &[3])
                .aux(1)
                .splits(i, o)
                .words
        };
        // rank 0 sends [1 to 0, 2 to 1]; rank 1 sends [4 to 0, 0 to 1]
        assert!(validate(&[h(&[1, 2], &[1, 4]), h(&[4, 0], &[2, 0])]).is_ok());
        let err = validate(&[h(&[1, 2], &[1, 3]), h(&[4, 0], &[2, 0])]).unwrap_err();
        assert_eq!(err.0, BadInputKind::SplitMismatch);
        assert!(
            err.1.contains("rank 0 expects 3 rows from rank 1"),
            "{}",
            err.1
        );
    }

    #[test]
    fn coalesced_lists_check_count_then_dtypes_then_shapes() {
        let l = |items: &[(DType, Vec<usize>)]| {
            Header::new(2, "all_reduce_coalesced", 0)
                .list(items)
                .reduce(ReduceOp::Sum)
                .words
        };
        let a = l(&[(DType::F32, vec![2]), (DType::F32, vec![3])]);
        assert!(validate(&[a.clone(), a.clone()]).is_ok());
        let fewer = l(&[(DType::F32, vec![2])]);
        assert_eq!(
            validate(&[a.clone(), fewer]).unwrap_err().0,
            BadInputKind::CountMismatch
        );
        let dt = l(&[(DType::F32, vec![2]), (DType::F64, vec![3])]);
        assert_eq!(
            validate(&[a.clone(), dt]).unwrap_err().0,
            BadInputKind::DTypeMismatch
        );
        let sh = l(&[(DType::F32, vec![2]), (DType::F32, vec![4])]);
        assert_eq!(
            validate(&[a, sh]).unwrap_err().0,
            BadInputKind::ShapeMismatch
        );
    }

    #[test]
    fn roots_permutations_and_groups_must_agree() {
        let b = |root| {
            Header::new(2, "broadcast", 0)
                .tensor(DType::F32, &[1])
                .root(root)
                .words
        };
        assert_eq!(
            validate(&[b(0), b(1)]).unwrap_err().0,
            BadInputKind::BadRoot
        );
        let p = |h| {
            Header::new(2, "permute_tensor", 0)
                .tensor(DType::F32, &[1])
                .aux(h)
                .words
        };
        assert_eq!(
            validate(&[p(1), p(2)]).unwrap_err().0,
            BadInputKind::BadPermutation
        );
        let g = |h| Header::new(2, "new_group", 0).aux(h).words;
        assert_eq!(
            validate(&[g(1), g(2)]).unwrap_err().0,
            BadInputKind::BadGroup
        );
    }

    #[test]
    fn send_recv_pairs_check_direction_peer_dtype_and_size() {
        let s = Header::new(2, "send", 0)
            .tensor(DType::F32, &[4])
            .peer(1)
            .words;
        let r = Header::new(2, "recv", 0)
            .tensor(DType::F32, &[4])
            .peer(0)
            .words;
        assert!(validate_pair(&s, &r, 0, 1).is_ok());
        assert!(validate_pair(&r, &s, 1, 0).is_ok());
        let r5 = Header::new(2, "recv", 0)
            .tensor(DType::F32, &[5])
            .peer(0)
            .words;
        assert_eq!(
            validate_pair(&s, &r5, 0, 1).unwrap_err().0,
            BadInputKind::OutBufferSize
        );
        assert_eq!(
            validate_pair(&r5, &s, 1, 0).unwrap_err().0,
            BadInputKind::OutBufferSize
        );
        assert_eq!(
            validate_pair(&s, &s, 0, 1).unwrap_err().0,
            BadInputKind::OpMismatch
        );
    }

    #[test]
    fn a_header_without_a_reduce_op_is_named_not_a_panic() {
        // A peer's malformed header (reduce word 0) must give ReduceOpMismatch, not an underflow.
        let ok = ar(2, &[4], DType::F32, ReduceOp::Sum);
        let none = Header::new(2, "all_reduce", 7)
            .tensor(DType::F32, &[4])
            .words;
        let (kind, detail) = validate(&[ok, none]).unwrap_err();
        assert_eq!(kind, BadInputKind::ReduceOpMismatch);
        assert!(detail.contains("rank 1: ?"), "{detail}");
    }

    #[test]
    fn headers_round_trip_through_bytes() {
        let a = Header::new(2, "gather", 9)
            .tensor(DType::BF16, &[2, 3])
            .root(1);
        let b = Header::new(2, "gather", 9)
            .tensor(DType::BF16, &[2, 3])
            .root(1);
        let mut bytes = a.to_bytes();
        bytes.extend(b.to_bytes());
        let all = parse_all(&bytes, 2);
        assert_eq!(all, vec![a.words.clone(), b.words]);
        assert!(validate(&all).is_ok());
    }
}
