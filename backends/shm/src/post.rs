//! What a rank posts for one collective: its [`CallDesc`] (validated by every rank with the core
//! rule table, [`concord_core::validate_all`], over *all* ranks' posts) and where its buffers lie.
//! Validation is a pure function of the posts, so every rank reaches the same verdict (the same
//! [`BadInputKind`]) and either all ranks run the op or none does.

use concord_core::{BadInputKind, CallDesc, CallOp, DType, TensorDesc, Variant};

pub fn kind_code(k: BadInputKind) -> u64 {
    k.code()
}
pub fn kind_from(c: u64) -> Option<BadInputKind> {
    BadInputKind::from_code(c)
}
pub fn dtype_code(d: DType) -> u64 {
    DType::ALL.iter().position(|x| *x == d).expect("listed") as u64
}
pub fn dtype_from(c: u64) -> Option<DType> {
    DType::ALL.get(c as usize).copied()
}

const MAGIC: u64 = 0xC0C1;

/// A tensor in the posting rank's arena.
#[derive(Clone, Debug, PartialEq)]
pub struct Desc {
    pub off: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
}
impl Desc {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    fn overlaps(&self, o: &Desc) -> bool {
        let (a, la, b, lb) = (self.off as usize, self.nbytes(), o.off as usize, o.nbytes());
        la > 0 && lb > 0 && a < b + lb && b < a + la
    }
    fn tensor(&self) -> TensorDesc {
        TensorDesc::new(self.dtype, &self.shape)
    }
}

/// One rank's post: the call as the rules see it, and its buffers (inputs as in `call.inputs`;
/// every output, the caller's and the backend's).
#[derive(Clone, Debug, PartialEq)]
pub struct Post {
    pub call: CallDesc,
    pub inputs: Vec<Desc>,
    pub outputs: Vec<Desc>,
}

impl Post {
    /// The post of `op` over these buffers; an `OutBuf` variant's outputs are the caller's and
    /// go into the description. Aliasing is computed here from the offsets: an output may
    /// overlap an input only as the very same buffer of an in-place op.
    pub fn new(op: CallOp, variant: Variant, rank: usize, inputs: Vec<Desc>, outputs: Vec<Desc>) -> Post {
        let mut call = CallDesc::new(op, variant, rank);
        call.inputs = inputs.iter().map(Desc::tensor).collect();
        if variant == Variant::OutBuf {
            call.outputs = outputs.iter().map(Desc::tensor).collect();
        }
        let in_place = matches!(variant, Variant::InPlace | Variant::CoalescedInPlace);
        call.aliased = outputs.iter().enumerate().any(|(i, out)| {
            inputs.iter().enumerate().any(|(j, inp)| out.overlaps(inp) && !(in_place && i == j && out == inp))
                || outputs[i + 1..].iter().any(|o2| out.overlaps(o2))
        });
        Post { call, inputs, outputs }
    }

    pub fn encode(&self) -> Vec<u8> {
        let call = self.call.encode();
        let mut w: Vec<u64> = vec![MAGIC, call.len() as u64];
        w.extend(call);
        w.extend(self.inputs.iter().map(|d| d.off));
        w.push(self.outputs.len() as u64);
        for d in &self.outputs {
            w.extend([d.off, dtype_code(d.dtype), d.shape.len() as u64]);
            w.extend(d.shape.iter().map(|&s| s as u64));
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    pub fn decode(bytes: &[u8]) -> Option<Post> {
        let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        if words.first() != Some(&MAGIC) {
            return None;
        }
        let n = usize::try_from(*words.get(1)?).ok()?;
        let call = CallDesc::decode(words.get(2..2usize.checked_add(n)?)?)?;
        let mut it = words[2 + n..].iter().copied();
        let mut next = || it.next();
        let mut inputs = Vec::with_capacity(call.inputs.len());
        for t in &call.inputs {
            inputs.push(Desc { off: next()?, dtype: t.dtype, shape: t.shape.clone() });
        }
        let nout = next()?.min(words.len() as u64);
        let mut outputs = Vec::new();
        for _ in 0..nout {
            let off = next()?;
            let dtype = dtype_from(next()?)?;
            let nd = next()?.min(words.len() as u64);
            let shape = (0..nd).map(|_| next().map(|s| s as usize)).collect::<Option<Vec<_>>>()?;
            outputs.push(Desc { off, dtype, shape });
        }
        Some(Post { call, inputs, outputs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::{validate_all, Capabilities, ReduceOp};

    fn post(op: CallOp, shape: &[usize]) -> Post {
        let mut p = Post::new(op, Variant::Out, 0, vec![Desc { off: 64, dtype: DType::F32, shape: shape.to_vec() }], vec![]);
        p.call.seq = 7;
        p
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut p = post(CallOp::AllToAll, &[5, 2]);
        p.call.reduce = Some(ReduceOp::PremulSum(0.5));
        p.call.root = Some(3);
        p.call.in_splits = Some(vec![2, 3]);
        p.call.perm = Some(vec![]);
        p.outputs.push(Desc { off: 128, dtype: DType::BF16, shape: vec![] });
        assert_eq!(Post::decode(&p.encode()).unwrap(), p);
        assert_eq!(Post::decode(&p.encode()[..40]), None);
    }

    #[test]
    fn aliasing_is_computed_from_offsets() {
        let d = |off, n| Desc { off, dtype: DType::F32, shape: vec![n] };
        assert!(Post::new(CallOp::AllGather, Variant::OutBuf, 0, vec![d(0, 2)], vec![d(0, 4)]).call.aliased);
        assert!(!Post::new(CallOp::AllGather, Variant::OutBuf, 0, vec![d(0, 2)], vec![d(8, 4)]).call.aliased);
        assert!(!Post::new(CallOp::AllReduce, Variant::InPlace, 0, vec![d(0, 2)], vec![d(0, 2)]).call.aliased);
        assert!(Post::new(CallOp::AllReduce, Variant::CoalescedInPlace, 0, vec![d(0, 2), d(4, 2)], vec![d(0, 2), d(4, 2)]).call.aliased);
    }

    #[test]
    fn posts_are_validated_by_the_core_rule_table() {
        let caps = Capabilities::full(8);
        let calls = |ps: &[Post]| ps.iter().enumerate().map(|(r, p)| CallDesc { rank: r, ..p.call.clone() }).collect::<Vec<_>>();
        let a = post(CallOp::AllReduce, &[4]);
        let b = post(CallOp::AllReduce, &[5]);
        assert_eq!(validate_all(&calls(&[a.clone(), b]), &caps).unwrap_err().kind, BadInputKind::ShapeMismatch);
        let c = post(CallOp::Broadcast, &[4]);
        let mut c = c;
        c.call.root = Some(0);
        assert_eq!(validate_all(&calls(&[a, c]), &caps).unwrap_err().kind, BadInputKind::OpMismatch);
    }
}
