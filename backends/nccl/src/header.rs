//! Cross-rank validation. NCCL hangs or silently truncates when ranks pass mismatched inputs,
//! so before every collective each rank publishes a fixed-size header holding its call's
//! [`CallDesc`] (encoded with [`CallDesc::encode`]) and any error it found locally, and every
//! rank runs the core rule table over all headers ([`validate`]: the first rank's local error,
//! then [`concord_core::validate_all`]). Because the input is identical everywhere, so is the
//! verdict: every rank returns the same named error, or every rank proceeds.
//!
//! Layout (64-bit words): magic, world size, local error (kind code + 1, or 0), length of the
//! encoded description, the description, zero padding up to [`header_len`]. A [`Header`] holds
//! the words before the padding (a few dozen; the padding, about 4 KiB, was zeroed and freed on
//! every issue, validated or not); what goes to the peers is always the whole padded header
//! ([`Header::to_bytes`], [`Header::padded`], the board's post). A description that
//! does not fit (a coalesced list of more than about 160 tensors: each takes 2 words plus one per
//! dimension) is rejected at issue on every rank ([`Header::new`] →
//! [`BadInputKind::UnsupportedOp`], naming the limit).
//!
//! This module is pure (no CUDA, no NCCL) and unit-tested on any machine.

use concord_core::{validate_all, BadInput, BadInputKind, CallDesc, Capabilities};

const MAGIC: u64 = 0x434f_4e43_4f52_4432; // "CONCORD2"
const W_MAGIC: usize = 0;
const W_WS: usize = 1;
const W_ERR: usize = 2;
const W_LEN: usize = 3;
const FIXED: usize = 4;
/// `W_ERR` of a rank that failed locally after issuing the op ([`Header::failed`]).
const FAILED: u64 = u64::MAX;

/// Number of 64-bit words in a header for a world of `ws` ranks.
pub fn header_len(ws: usize) -> usize {
    // 512 words: a coalesced list of about 160 small tensors (a DDP bucket: the suites'
    // `::list100` cases need ~330 words; 256 refused them as unsupported_op on 4 x H200).
    512 + 4 * ws
}

/// One rank's header: its words up to the end of the description (the zero padding up to
/// [`header_len`] is added where the header leaves the rank).
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub words: Vec<u64>,
}

/// The rules' view of the calls: the local rules were checked at issue against the backend's
/// own capabilities (and any failure shipped as the header's error), so the whole-call check
/// here needs no gap list.
fn caps() -> Capabilities {
    Capabilities::full(usize::MAX)
}

impl Header {
    /// The header of `call` in a communicator of `ws` ranks; `Err` when it does not fit.
    pub fn new(ws: usize, call: &CallDesc) -> Result<Header, BadInput> {
        let enc = call.encode();
        if FIXED + enc.len() > header_len(ws) {
            return Err(BadInput::new(
                BadInputKind::UnsupportedOp,
                format!(
                    "{}: the call's description ({} words) does not fit the NCCL validation header ({} words); \
                     pass fewer tensors per call",
                    call.op.name(),
                    enc.len(),
                    header_len(ws) - FIXED
                ),
            ));
        }
        let mut words = Vec::with_capacity(FIXED + enc.len());
        words.extend([MAGIC, ws as u64, 0, enc.len() as u64]);
        words.extend_from_slice(&enc);
        debug_assert_eq!((words[W_MAGIC], words[W_WS], words[W_ERR], words[W_LEN]), (MAGIC, ws as u64, 0, enc.len() as u64));
        Ok(Header { words })
    }
    /// A header that carries only `call`'s op and sequence number (for a rank whose description
    /// does not fit); with [`Header::error`] its peers fail with the rank's error.
    pub fn summary(ws: usize, call: &CallDesc) -> Header {
        let mut small = CallDesc::new(call.op, call.variant, call.rank);
        small.seq = call.seq;
        Header::new(ws, &small).expect("an empty call fits")
    }
    /// Marks a local failure after the op was issued (an out-of-memory allocating the output, a
    /// refused reduce op...): not a bad input; every peer fails the op with a named error naming
    /// this rank ([`failed_rank`]) instead of waiting for a launch that never comes.
    pub fn failed(mut self) -> Self {
        self.words[W_ERR] = FAILED;
        self
    }
    /// Records an error this rank found on its own; every rank will report its kind.
    pub fn error(mut self, kind: BadInputKind) -> Self {
        self.words[W_ERR] = kind.code() + 1;
        self
    }
    /// The whole header as it goes to the peers: the words, then zeros up to [`header_len`].
    pub fn padded(self) -> Vec<u64> {
        let mut words = self.words;
        let len = header_len(words[W_WS] as usize);
        words.resize(len.max(words.len()), 0);
        words
    }
    /// [`Header::padded`] as little-endian bytes (the all-gather of `exchange_all`).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.clone().padded().iter().flat_map(|w| w.to_le_bytes()).collect()
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

type Verdict = Result<(), (BadInputKind, String)>;

/// The first rank whose header says it failed locally ([`Header::failed`]), if any.
pub fn failed_rank(all: &[Vec<u64>]) -> Option<usize> {
    all.iter().position(|h| h.get(W_ERR) == Some(&FAILED))
}

/// The local error a header carries, if any.
fn local_error(r: usize, h: &[u64]) -> Verdict {
    match h.get(W_ERR) {
        Some(&FAILED) => Err((BadInputKind::UnsupportedOp, format!("rank {r} failed its side of the call locally"))),
        Some(&e) if e != 0 => {
            let kind = BadInputKind::from_code(e - 1).unwrap_or(BadInputKind::UnsupportedOp);
            Err((kind, format!("rank {r} rejected its own input ({})", kind.name())))
        }
        _ => Ok(()),
    }
}

/// The call a header describes.
fn decode(r: usize, h: &[u64]) -> Result<CallDesc, (BadInputKind, String)> {
    let malformed =
        || (BadInputKind::OpMismatch, format!("rank {r} sent a malformed validation header (a different collective or backend version?)"));
    if h.len() < FIXED || h[W_MAGIC] != MAGIC {
        return Err(malformed());
    }
    let len = usize::try_from(h[W_LEN]).map_err(|_| malformed())?;
    h.get(FIXED..FIXED.saturating_add(len)).and_then(CallDesc::decode).ok_or_else(malformed)
}

/// The verdict over every rank's header (the same on every rank). `Err((kind, detail))`.
pub fn validate(all: &[Vec<u64>]) -> Verdict {
    for (r, h) in all.iter().enumerate() {
        local_error(r, h)?;
    }
    let calls = all.iter().enumerate().map(|(r, h)| decode(r, h)).collect::<Result<Vec<_>, _>>()?;
    validate_all(&calls, &caps()).map_err(|e| (e.kind, e.detail))
}

/// The verdict for a send/recv pair, from this rank's header and the peer's (the same verdict on
/// both sides). `me` and `peer` are ranks.
pub fn validate_pair(mine: &[u64], theirs: &[u64], me: usize, peer: usize) -> Verdict {
    let ((lo, hl), (hi, hh)) = if me < peer { ((me, mine), (peer, theirs)) } else { ((peer, theirs), (me, mine)) };
    local_error(lo, hl)?;
    local_error(hi, hh)?;
    let (a, b) = (decode(me, mine)?, decode(peer, theirs)?);
    let ws = mine.get(W_WS).copied().unwrap_or(0) as usize;
    concord_core::validate_pair(&a, &b, ws, &caps()).map_err(|e| (e.kind, e.detail))
}

/// How a send / recv pair stands once both headers are known (the same on both ranks).
#[derive(Clone, Debug, PartialEq)]
pub enum PairVerdict {
    Agree,
    /// The peer (this rank) failed its side locally after issuing it ([`Header::failed`]).
    PeerFailed(usize),
    /// The pair rule's named error ([`validate_pair`]).
    Bad(BadInputKind, String),
}

/// The one decision for a send / recv pair: a side that failed locally first (the other side
/// names it), then [`validate_pair`]. `me` / `peer` are ranks.
pub fn pair_verdict(mine: &[u64], theirs: &[u64], me: usize, peer: usize) -> PairVerdict {
    if theirs.get(W_ERR) == Some(&FAILED) {
        return PairVerdict::PeerFailed(peer);
    }
    if mine.get(W_ERR) == Some(&FAILED) {
        return PairVerdict::PeerFailed(me);
    }
    match validate_pair(mine, theirs, me, peer) {
        Ok(()) => PairVerdict::Agree,
        Err((k, d)) => PairVerdict::Bad(k, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::{CallOp, DType, ReduceOp, TensorDesc, Variant};

    fn call(op: CallOp, rank: usize, shape: &[usize]) -> CallDesc {
        let mut d = CallDesc::new(op, Variant::Out, rank);
        d.inputs.push(TensorDesc::new(DType::F32, shape));
        d
    }
    fn words(ws: usize, d: &CallDesc) -> Vec<u64> {
        Header::new(ws, d).unwrap().words
    }

    #[test]
    fn headers_round_trip_and_the_rule_table_decides() {
        let mut a = call(CallOp::AllReduce, 0, &[4]);
        a.reduce = Some(ReduceOp::Sum);
        let mut b = a.clone();
        b.rank = 1;
        let mut bytes = Header::new(2, &a).unwrap().to_bytes();
        bytes.extend(Header::new(2, &b).unwrap().to_bytes());
        let all = parse_all(&bytes, 2);
        assert_eq!(decode(1, &all[1]).unwrap(), b);
        assert!(validate(&all).is_ok());
        b.inputs[0].shape = vec![5];
        let (kind, _) = validate(&[words(2, &a), words(2, &b)]).unwrap_err();
        assert_eq!(kind, BadInputKind::ShapeMismatch);
        b.inputs[0].shape = vec![4];
        b.seq = 3;
        assert_eq!(validate(&[words(2, &a), words(2, &b)]).unwrap_err().0, BadInputKind::OpMismatch);
    }

    #[test]
    fn a_header_goes_out_padded_to_its_fixed_length() {
        let mut a = call(CallOp::AllReduce, 0, &[4]);
        a.reduce = Some(ReduceOp::Sum);
        let h = Header::new(3, &a).unwrap();
        assert!(h.words.len() < header_len(3), "kept unpadded: {} words", h.words.len());
        let bytes = h.clone().error(BadInputKind::OutBufferSize).to_bytes();
        assert_eq!(bytes.len(), header_len(3) * 8);
        let wire = h.clone().failed().padded();
        assert_eq!(wire.len(), header_len(3));
        assert_eq!(&wire[..h.words.len()], &h.clone().failed().words[..]);
        assert!(wire[h.words.len()..].iter().all(|&w| w == 0));
        let all = parse_all(&[bytes.clone(), bytes.clone(), bytes].concat(), 3);
        assert_eq!(decode(2, &all[2]).unwrap(), a);
        assert_eq!(validate(&all).unwrap_err().0, BadInputKind::OutBufferSize);
    }

    #[test]
    fn a_local_error_on_one_rank_fails_every_rank_with_its_kind() {
        let a = call(CallOp::AllGather, 0, &[3]);
        let b = call(CallOp::AllGather, 1, &[3]);
        let bad = Header::new(2, &b).unwrap().error(BadInputKind::OutBufferSize).words;
        let (kind, detail) = validate(&[words(2, &a), bad]).unwrap_err();
        assert_eq!(kind, BadInputKind::OutBufferSize);
        assert!(detail.contains("rank 1"), "{detail}");
    }

    #[test]
    fn a_description_too_large_is_rejected_at_issue() {
        let mut d = call(CallOp::AllReduce, 0, &[1]);
        d.inputs = vec![TensorDesc::new(DType::F32, &[1]); 200];
        let e = Header::new(2, &d).unwrap_err();
        assert_eq!(e.kind, BadInputKind::UnsupportedOp);
        let h = Header::summary(2, &d).error(e.kind).words;
        assert_eq!(validate(&[h, words(2, &call(CallOp::AllReduce, 1, &[1]))]).unwrap_err().0, BadInputKind::UnsupportedOp);
    }

    #[test]
    fn a_local_failure_is_found_on_every_rank() {
        let a = words(2, &call(CallOp::AllGather, 0, &[3]));
        let b = Header::new(2, &call(CallOp::AllGather, 1, &[3])).unwrap().failed().words;
        assert_eq!(failed_rank(&[a.clone(), b.clone()]), Some(1));
        assert_eq!(failed_rank(&[a.clone(), a.clone()]), None);
        assert!(validate(&[a, b]).unwrap_err().1.contains("rank 1 failed"));
    }

    #[test]
    fn malformed_headers_are_named_not_a_panic() {
        let ok = words(2, &call(CallOp::Barrier, 0, &[]));
        assert_eq!(validate(&[ok.clone(), vec![0; 3]]).unwrap_err().0, BadInputKind::OpMismatch);
        let mut bad = ok.clone();
        bad[W_LEN] = u64::MAX;
        assert_eq!(validate(&[ok, bad]).unwrap_err().0, BadInputKind::OpMismatch);
    }

    #[test]
    fn send_recv_pairs_check_direction_peer_dtype_and_size() {
        let mut s = call(CallOp::Send, 0, &[4]);
        s.peer = Some(1);
        let mut r = CallDesc::new(CallOp::Recv, Variant::Out, 1);
        r.outputs.push(TensorDesc::new(DType::F32, &[4]));
        r.peer = Some(0);
        let (sw, rw) = (words(2, &s), words(2, &r));
        assert!(validate_pair(&sw, &rw, 0, 1).is_ok());
        assert!(validate_pair(&rw, &sw, 1, 0).is_ok());
        r.outputs[0].shape = vec![5];
        let r5 = words(2, &r);
        assert_eq!(validate_pair(&sw, &r5, 0, 1).unwrap_err().0, BadInputKind::OutBufferSize);
        assert_eq!(validate_pair(&r5, &sw, 1, 0).unwrap_err().0, BadInputKind::OutBufferSize);
        let mut s1 = s.clone();
        s1.rank = 1;
        s1.peer = Some(0);
        assert_eq!(validate_pair(&sw, &words(2, &s1), 0, 1).unwrap_err().0, BadInputKind::OpMismatch);
    }
}
