//! What a rank posts for one collective, and the cross-rank validation every rank runs on
//! *all* ranks' posts. Validation is a pure function of the posts, so every rank reaches the
//! same verdict (the same [`BadInputKind`]) and either all ranks run the op or none does.

use concord_core::{BadInputKind, DType, ReduceOp};

/// The collective a post belongs to (variants of one op are compatible with each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum OpCode {
    AllReduce = 1,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Permute,
    Reduce,
    Gather,
    Scatter,
    Barrier,
    NewGroup,
}

impl OpCode {
    const ALL: [OpCode; 11] = [
        OpCode::AllReduce,
        OpCode::AllGather,
        OpCode::ReduceScatter,
        OpCode::AllToAll,
        OpCode::Broadcast,
        OpCode::Permute,
        OpCode::Reduce,
        OpCode::Gather,
        OpCode::Scatter,
        OpCode::Barrier,
        OpCode::NewGroup,
    ];
    pub fn name(self) -> &'static str {
        match self {
            OpCode::AllReduce => "all_reduce",
            OpCode::AllGather => "all_gather_into_tensor",
            OpCode::ReduceScatter => "reduce_scatter_tensor",
            OpCode::AllToAll => "all_to_all_single",
            OpCode::Broadcast => "broadcast",
            OpCode::Permute => "permute_tensor",
            OpCode::Reduce => "reduce",
            OpCode::Gather => "gather",
            OpCode::Scatter => "scatter",
            OpCode::Barrier => "barrier",
            OpCode::NewGroup => "new_group",
        }
    }
    fn from_u64(v: u64) -> Option<OpCode> {
        OpCode::ALL.into_iter().find(|o| *o as u64 == v)
    }
}

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
fn reduce_code(r: Option<ReduceOp>) -> (u64, u64) {
    match r {
        None => (0, 0),
        Some(op) => {
            let i = ReduceOp::ALL.iter().position(|x| x.name() == op.name()).expect("listed") as u64 + 1;
            let f = if let ReduceOp::PremulSum(f) = op { f.to_bits() } else { 0 };
            (i, f)
        }
    }
}
fn reduce_from(code: u64, f: u64) -> Option<ReduceOp> {
    match code {
        0 => None,
        c => ReduceOp::ALL.get(c as usize - 1).map(|op| if let ReduceOp::PremulSum(_) = op { ReduceOp::PremulSum(f64::from_bits(f)) } else { *op }),
    }
}

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
}

#[derive(Clone, Debug, PartialEq)]
pub struct Post {
    pub op: OpCode,
    pub seq: u64,
    pub reduce: Option<ReduceOp>,
    pub root: Option<usize>,
    pub inputs: Vec<Desc>,
    pub outputs: Vec<Desc>,
    pub in_splits: Option<Vec<usize>>,
    pub out_splits: Option<Vec<usize>>,
    /// Permutation (permute_tensor) or member list (new_group).
    pub list: Option<Vec<usize>>,
    /// An error this rank found alone (reported on every rank).
    pub local_error: Option<(BadInputKind, String)>,
}

impl Post {
    pub fn new(op: OpCode, seq: u64) -> Post {
        Post {
            op,
            seq,
            reduce: None,
            root: None,
            inputs: vec![],
            outputs: vec![],
            in_splits: None,
            out_splits: None,
            list: None,
            local_error: None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w: Vec<u64> = vec![OpCode::AllReduce as u64 ^ 0xC0C0, self.op as u64, self.seq];
        let (rc, rf) = reduce_code(self.reduce);
        w.extend([rc, rf, self.root.map_or(u64::MAX, |r| r as u64)]);
        for list in [&self.inputs, &self.outputs] {
            w.push(list.len() as u64);
            for d in list {
                w.extend([d.off, dtype_code(d.dtype), d.shape.len() as u64]);
                w.extend(d.shape.iter().map(|&s| s as u64));
            }
        }
        for v in [&self.in_splits, &self.out_splits, &self.list] {
            match v {
                None => w.push(u64::MAX),
                Some(v) => {
                    w.push(v.len() as u64);
                    w.extend(v.iter().map(|&s| s as u64));
                }
            }
        }
        match &self.local_error {
            None => w.push(u64::MAX),
            Some((k, msg)) => {
                w.extend([kind_code(*k), msg.len() as u64]);
                for ch in msg.as_bytes().chunks(8) {
                    let mut b = [0u8; 8];
                    b[..ch.len()].copy_from_slice(ch);
                    w.push(u64::from_le_bytes(b));
                }
            }
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    pub fn decode(bytes: &[u8]) -> Option<Post> {
        let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let mut it = words.into_iter();
        let mut next = || it.next();
        if next()? != OpCode::AllReduce as u64 ^ 0xC0C0 {
            return None;
        }
        let op = OpCode::from_u64(next()?)?;
        let seq = next()?;
        let (rc, rf) = (next()?, next()?);
        let root = next()?;
        let mut p = Post::new(op, seq);
        p.reduce = reduce_from(rc, rf);
        p.root = (root != u64::MAX).then_some(root as usize);
        for which in 0..2 {
            let n = next()?;
            let mut list = Vec::new();
            for _ in 0..n {
                let off = next()?;
                let dtype = dtype_from(next()?)?;
                let nd = next()?;
                let shape = (0..nd).map(|_| next().map(|s| s as usize)).collect::<Option<Vec<_>>>()?;
                list.push(Desc { off, dtype, shape });
            }
            if which == 0 {
                p.inputs = list
            } else {
                p.outputs = list
            }
        }
        let mut vecs = Vec::new();
        for _ in 0..3 {
            let n = next()?;
            vecs.push(if n == u64::MAX {
                None
            } else {
                Some((0..n).map(|_| next().map(|s| s as usize)).collect::<Option<Vec<_>>>()?)
            });
        }
        p.list = vecs.pop()?;
        p.out_splits = vecs.pop()?;
        p.in_splits = vecs.pop()?;
        let k = next()?;
        if k != u64::MAX {
            let len = next()? as usize;
            let mut b = Vec::new();
            for _ in 0..len.div_ceil(8) {
                b.extend(next()?.to_le_bytes());
            }
            b.truncate(len);
            p.local_error = Some((kind_from(k)?, String::from_utf8_lossy(&b).into_owned()));
        }
        Some(p)
    }
}

type Verdict = Result<(), (BadInputKind, String)>;

fn fail<T>(kind: BadInputKind, msg: impl Into<String>) -> Result<T, (BadInputKind, String)> {
    Err((kind, msg.into()))
}

/// Equal-split or explicit split sizes of rank `r`'s input (None when they do not sum up).
pub fn input_splits(p: &Post, n: usize) -> Vec<usize> {
    let d0 = p.inputs[0].shape.first().copied().unwrap_or(0);
    p.in_splits.clone().unwrap_or_else(|| vec![d0 / n; n])
}
pub fn output_splits(p: &Post, n: usize) -> Vec<usize> {
    let d0 = p.inputs[0].shape.first().copied().unwrap_or(0);
    p.out_splits.clone().unwrap_or_else(|| vec![d0 / n; n])
}

/// The cross-rank verdict on one collective; identical on every rank.
pub fn validate(posts: &[Post]) -> Verdict {
    use BadInputKind::*;
    let n = posts.len();
    if let Some((r, (k, msg))) = posts.iter().enumerate().find_map(|(r, p)| p.local_error.as_ref().map(|e| (r, e))) {
        return fail(*k, format!("rank {r}: {msg}"));
    }
    let p0 = &posts[0];
    for (r, p) in posts.iter().enumerate() {
        if p.op != p0.op {
            return fail(OpMismatch, format!("rank 0 issued {} but rank {r} issued {} at the same sequence number", p0.op.name(), p.op.name()));
        }
    }
    for (r, p) in posts.iter().enumerate() {
        if p.reduce.map(|x| (x.name(), if let ReduceOp::PremulSum(f) = x { f.to_bits() } else { 0 }))
            != p0.reduce.map(|x| (x.name(), if let ReduceOp::PremulSum(f) = x { f.to_bits() } else { 0 }))
        {
            return fail(ReduceOpMismatch, format!("rank 0 reduces with {:?} but rank {r} with {:?}", p0.reduce, p.reduce));
        }
        if p.inputs.len() != p0.inputs.len() {
            return fail(CountMismatch, format!("rank 0 passed {} tensors but rank {r} passed {}", p0.inputs.len(), p.inputs.len()));
        }
        for (i, (a, b)) in p0.inputs.iter().zip(&p.inputs).enumerate() {
            if a.dtype != b.dtype {
                return fail(DTypeMismatch, format!("tensor {i}: rank 0 has {} but rank {r} has {}", a.dtype, b.dtype));
            }
        }
    }
    let same_shapes = || -> Verdict {
        for (r, p) in posts.iter().enumerate() {
            for (i, (a, b)) in p0.inputs.iter().zip(&p.inputs).enumerate() {
                if a.shape != b.shape {
                    return fail(ShapeMismatch, format!("tensor {i}: rank 0 has shape {:?} but rank {r} has {:?}", a.shape, b.shape));
                }
            }
        }
        Ok(())
    };
    let root_ok = || -> Verdict {
        for (r, p) in posts.iter().enumerate() {
            match p.root {
                Some(x) if x < n => {}
                x => return fail(BadRoot, format!("rank {r} passed root {x:?}, outside 0..{n}")),
            }
            if p.root != p0.root {
                return fail(BadRoot, format!("rank 0 passed root {:?} but rank {r} passed {:?}", p0.root, p.root));
            }
        }
        Ok(())
    };
    let reduce_ok = || -> Verdict {
        if let Some(op) = p0.reduce {
            for d in &p0.inputs {
                if !op.defined_for(d.dtype) {
                    return fail(UnsupportedDType, format!("reduce op {} is not defined for {}", op.name(), d.dtype));
                }
            }
        }
        Ok(())
    };
    let outs_ok = |expect: &dyn Fn(&Desc) -> usize| -> Verdict {
        for (r, p) in posts.iter().enumerate() {
            for (i, (inp, out)) in p.inputs.iter().zip(&p.outputs).enumerate() {
                if out.dtype != inp.dtype {
                    return fail(DTypeMismatch, format!("rank {r} tensor {i}: output is {} but input is {}", out.dtype, inp.dtype));
                }
                if out.numel() != expect(inp) {
                    return fail(
                        OutBufferSize,
                        format!("rank {r} tensor {i}: output holds {} elements {:?}, the op needs {}", out.numel(), out.shape, expect(inp)),
                    );
                }
            }
        }
        Ok(())
    };
    let no_alias = || -> Verdict {
        for (r, p) in posts.iter().enumerate() {
            for (i, out) in p.outputs.iter().enumerate() {
                for (j, inp) in p.inputs.iter().enumerate() {
                    let same = out == inp && i == j;
                    if out.overlaps(inp) && !(same && matches!(p0.op, OpCode::AllReduce | OpCode::Broadcast)) {
                        return fail(Aliasing, format!("rank {r}: output {i} overlaps input {j}"));
                    }
                }
                for (j, o2) in p.outputs.iter().enumerate() {
                    if j > i && out.overlaps(o2) {
                        return fail(Aliasing, format!("rank {r}: outputs {i} and {j} overlap"));
                    }
                }
            }
        }
        Ok(())
    };
    let dim0 = |r: usize, d: &Desc, what: &str| -> Result<usize, (BadInputKind, String)> {
        match d.shape.first() {
            Some(&d0) => Ok(d0),
            None => fail(ZeroDim, format!("rank {r}: {what} needs at least one dimension, got a 0-dim tensor")),
        }
    };
    match p0.op {
        OpCode::Barrier => Ok(()),
        OpCode::NewGroup => {
            for (r, p) in posts.iter().enumerate() {
                if p.list != p0.list {
                    return fail(BadGroup, format!("rank 0 passed members {:?} but rank {r} passed {:?}", p0.list, p.list));
                }
            }
            let l = p0.list.as_deref().unwrap_or(&[]);
            let mut seen = vec![false; n];
            if l.is_empty() {
                return fail(BadGroup, "empty member list");
            }
            for &x in l {
                if x >= n || seen[x] {
                    return fail(BadGroup, format!("member list {l:?} has an out-of-range or repeated rank (world of {n})"));
                }
                seen[x] = true;
            }
            Ok(())
        }
        OpCode::AllReduce => {
            same_shapes()?;
            reduce_ok()?;
            no_alias()
        }
        OpCode::AllGather => {
            same_shapes()?;
            outs_ok(&|d| d.numel() * n)?;
            no_alias()
        }
        OpCode::Gather => {
            root_ok()?;
            same_shapes()?;
            no_alias()
        }
        OpCode::ReduceScatter | OpCode::Scatter => {
            if p0.op == OpCode::Scatter {
                root_ok()?;
            }
            same_shapes()?;
            for (r, p) in posts.iter().enumerate() {
                for d in &p.inputs {
                    let d0 = dim0(r, d, p0.op.name())?;
                    if d0 % n != 0 {
                        return fail(Indivisible, format!("rank {r}: dim 0 of {:?} is not divisible by the world size {n}", d.shape));
                    }
                }
            }
            reduce_ok()?;
            outs_ok(&|d| d.numel() / n)?;
            no_alias()
        }
        OpCode::Broadcast | OpCode::Reduce => {
            root_ok()?;
            same_shapes()?;
            reduce_ok()?;
            no_alias()
        }
        OpCode::Permute => {
            for (r, p) in posts.iter().enumerate() {
                let l = p.list.as_deref().unwrap_or(&[]);
                let mut seen = vec![false; n];
                if l.len() != n || l.iter().any(|&x| x >= n || std::mem::replace(&mut seen[x], true)) {
                    return fail(BadPermutation, format!("rank {r}: {l:?} is not a permutation of 0..{n}"));
                }
                if p.list != p0.list {
                    return fail(BadPermutation, format!("rank 0 passed {:?} but rank {r} passed {l:?}", p0.list));
                }
            }
            same_shapes()?;
            no_alias()
        }
        OpCode::AllToAll => {
            let mut ins = Vec::new();
            let mut outs = Vec::new();
            for (r, p) in posts.iter().enumerate() {
                let d = &p.inputs[0];
                let d0 = dim0(r, d, "all_to_all_single")?;
                if d.shape[1..] != p0.inputs[0].shape[1..] {
                    return fail(ShapeMismatch, format!("rank 0 rows are {:?} but rank {r} rows are {:?}", &p0.inputs[0].shape[1..], &d.shape[1..]));
                }
                for (what, s) in [("input", &p.in_splits), ("output", &p.out_splits)] {
                    match s {
                        Some(s) if s.len() != n => {
                            return fail(BadSplits, format!("rank {r}: {what} splits {s:?} have {} entries, world size is {n}", s.len()))
                        }
                        None if d0 % n != 0 => {
                            return fail(Indivisible, format!("rank {r}: equal {what} split of dim 0 = {d0} over {n} ranks"))
                        }
                        _ => {}
                    }
                }
                let is = input_splits(p, n);
                if is.iter().sum::<usize>() != d0 {
                    return fail(BadSplits, format!("rank {r}: input splits {is:?} sum to {}, dim 0 is {d0}", is.iter().sum::<usize>()));
                }
                ins.push(is);
                outs.push(output_splits(p, n));
            }
            for (r, o) in outs.iter().enumerate() {
                for (j, i) in ins.iter().enumerate() {
                    if o[j] != i[r] {
                        return fail(
                            SplitMismatch,
                            format!("rank {r} expects {} rows from rank {j}, which sends it {}", o[j], i[r]),
                        );
                    }
                }
            }
            no_alias()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(op: OpCode, shape: &[usize]) -> Post {
        let mut p = Post::new(op, 7);
        p.inputs.push(Desc { off: 64, dtype: DType::F32, shape: shape.to_vec() });
        p
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut p = post(OpCode::AllToAll, &[5, 2]);
        p.reduce = Some(ReduceOp::PremulSum(0.5));
        p.root = Some(3);
        p.in_splits = Some(vec![2, 3]);
        p.list = Some(vec![]);
        p.outputs.push(Desc { off: 128, dtype: DType::BF16, shape: vec![] });
        p.local_error = Some((BadInputKind::BadPeer, "héllo wörld, longer than eight".into()));
        assert_eq!(Post::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn mismatches_are_named_identically_whoever_validates() {
        let a = post(OpCode::AllReduce, &[4]);
        let b = post(OpCode::AllReduce, &[5]);
        let (k, _) = validate(&[a.clone(), b]).unwrap_err();
        assert_eq!(k, BadInputKind::ShapeMismatch);
        let (k, _) = validate(&[a.clone(), post(OpCode::Broadcast, &[4])]).unwrap_err();
        assert_eq!(k, BadInputKind::OpMismatch);
        let (k, _) = validate(&[post(OpCode::ReduceScatter, &[5]), post(OpCode::ReduceScatter, &[5])]).unwrap_err();
        assert_eq!(k, BadInputKind::Indivisible);
        let mut x = post(OpCode::AllToAll, &[3]);
        x.in_splits = Some(vec![1, 1]);
        x.out_splits = Some(vec![1, 1]);
        assert_eq!(validate(&[x, post(OpCode::AllToAll, &[2])]).unwrap_err().0, BadInputKind::BadSplits);
    }
}
