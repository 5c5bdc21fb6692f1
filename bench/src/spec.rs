//! What is measured: sizes (nccl-tests' `-b/-e/-f` with K/M/G suffixes), the ops with their
//! nccl-tests bus-bandwidth factors, dtype and reduce-op names, and the plan of steps.

use concord_core::{DType, ReduceOp};
use concord_oracle::Collective;

/// `8`, `1K`, `64M`, `1G` (binary multiples, as nccl-tests), optionally with a trailing `B`
/// or `iB` (`64MiB`). Case-insensitive.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    let n: usize = digits.trim().parse().map_err(|_| format!("`{s}` is not a size (examples: 8, 1K, 64M, 1G)"))?;
    n.checked_mul(1usize << shift).ok_or_else(|| format!("`{s}` is too large"))
}

/// `64 MiB`, `1 KiB`, `8 B`: for messages.
pub fn human(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// The requested sizes: `min`, `min·f`, ... up to `max` inclusive.
pub fn sizes(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    if factor < 2 {
        return Err(format!("-f {factor}: the step factor must be at least 2"));
    }
    if min == 0 || min > max {
        return Err(format!("-b {min} -e {max}: need 0 < min <= max"));
    }
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    Ok(v)
}

/// The benchmarked collectives, in nccl-tests' order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BenchOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    SendRecv,
}

impl BenchOp {
    pub const ALL: [BenchOp; 7] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::AllToAll,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::SendRecv,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::SendRecv => "sendrecv",
        }
    }

    /// The name, or nccl-tests' spelling (`alltoall`, `send_recv`).
    pub fn from_name(s: &str) -> Option<BenchOp> {
        let s = s.replace('-', "_");
        let alias = match s.as_str() {
            "alltoall" => "all_to_all",
            "send_recv" | "send/recv" => "sendrecv",
            "allreduce" => "all_reduce",
            "allgather" => "all_gather",
            "reducescatter" => "reduce_scatter",
            other => other,
        };
        BenchOp::ALL.into_iter().find(|o| o.name() == alias)
    }

    /// `all` or a comma-separated list of names.
    pub fn parse_list(s: &str) -> Result<Vec<BenchOp>, String> {
        if s == "all" {
            return Ok(BenchOp::ALL.to_vec());
        }
        s.split(',')
            .map(|n| {
                BenchOp::from_name(n.trim())
                    .ok_or_else(|| format!("unknown op `{n}` (one of: all, {})", BenchOp::ALL.map(|o| o.name()).join(", ")))
            })
            .collect()
    }

    /// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw × factor.
    pub fn busbw_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::SendRecv => 1.0,
        }
    }

    /// Whether the trait has an in-place form (`all_reduce_`, `broadcast_`); the others print
    /// `N/A` in the in-place columns.
    pub const fn has_in_place(self) -> bool {
        matches!(self, BenchOp::AllReduce | BenchOp::Broadcast)
    }

    pub const fn is_reduction(self) -> bool {
        matches!(self, BenchOp::AllReduce | BenchOp::ReduceScatter | BenchOp::Reduce)
    }

    pub const fn has_root(self) -> bool {
        matches!(self, BenchOp::Broadcast | BenchOp::Reduce)
    }

    /// Ops whose per-rank chunk is `count / ranks` (nccl-tests' `paramcount`).
    pub const fn chunked(self) -> bool {
        matches!(self, BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll)
    }

    /// Elements of one rank's input and output for chunk length `l`.
    pub const fn numels(self, l: usize, ranks: usize) -> (usize, usize) {
        match self {
            BenchOp::AllGather => (l, l * ranks),
            BenchOp::ReduceScatter => (l * ranks, l),
            BenchOp::AllToAll => (l * ranks, l * ranks),
            _ => (l, l),
        }
    }

    /// The oracle's description of this op.
    pub fn collective(self, redop: ReduceOp, ranks: usize, root: usize) -> Collective {
        match self {
            BenchOp::AllReduce => Collective::AllReduce { op: redop },
            BenchOp::AllGather => Collective::AllGather,
            BenchOp::ReduceScatter => Collective::ReduceScatter { op: redop },
            BenchOp::AllToAll => Collective::AllToAll { input_splits: vec![None; ranks], output_splits: vec![None; ranks] },
            BenchOp::Broadcast => Collective::Broadcast { src: root },
            BenchOp::Reduce => Collective::Reduce { op: redop, root },
            BenchOp::SendRecv => Collective::SendRecv { src_dst: (0..ranks).map(|r| Some((r + 1) % ranks)).collect() },
        }
    }
}

/// The ops of `ops` that run with `ranks` ranks: sendrecv needs a peer, so not at 1 rank (the
/// parent and the ranks both plan with this).
pub fn runnable(ops: Vec<BenchOp>, ranks: usize) -> Vec<BenchOp> {
    ops.into_iter().filter(|o| *o != BenchOp::SendRecv || ranks > 1).collect()
}

/// `Out` (out-of-place) or `In` (in-place) columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    OutOfPlace,
    InPlace,
}

impl Placement {
    pub const fn name(self) -> &'static str {
        match self {
            Placement::OutOfPlace => "out-of-place",
            Placement::InPlace => "in-place",
        }
    }
}

/// nccl-tests' type names (`float`, `half`, ...), or Concord's (`f32`, `f16`, ...).
pub fn parse_dtype(s: &str) -> Result<DType, String> {
    let d = match s {
        "float" | "float32" => Some(DType::F32),
        "half" | "float16" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        "double" | "float64" => Some(DType::F64),
        "int8" => Some(DType::I8),
        "uint8" => Some(DType::U8),
        "int16" => Some(DType::I16),
        "uint16" => Some(DType::U16),
        "int32" | "int" => Some(DType::I32),
        "uint32" => Some(DType::U32),
        "int64" => Some(DType::I64),
        "uint64" => Some(DType::U64),
        other => DType::from_name(other),
    };
    d.ok_or_else(|| format!("unknown dtype `{s}` (float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, or f32, ...)"))
}

/// The name nccl-tests prints in its `type` column.
pub const fn nccl_type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::F64 => "double",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
    }
}

/// nccl-tests' reduce-op names (`sum`, `prod`, `min`, `max`, `avg`, `premulsum`) or Concord's.
pub fn parse_redop(s: &str) -> Result<ReduceOp, String> {
    let r = match s {
        "prod" => Some(ReduceOp::Product),
        "premulsum" => Some(ReduceOp::PremulSum(2.0)),
        other => ReduceOp::from_name(other),
    };
    r.ok_or_else(|| format!("unknown reduce op `{s}` (sum, prod, min, max, avg, premulsum, band, bor, bxor)"))
}

/// One (op, size) row of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: BenchOp,
    /// The row's size in bytes (nccl-tests: the larger of send and receive buffer).
    pub size: usize,
    /// nccl-tests' `count` column: elements per rank chunk (`count / ranks` for the chunked ops).
    pub count: usize,
}

/// Every step of a run, op by op, sizes ascending. Sizes too small for one element per chunk are
/// left out (`skipped` lists them). A size is rounded down to a whole number of elements (and of
/// `ranks` chunks for the chunked ops).
pub fn plan(ops: &[BenchOp], sizes: &[usize], elt: usize, ranks: usize) -> (Vec<Step>, Vec<(BenchOp, usize)>) {
    let mut steps = Vec::new();
    let mut skipped = Vec::new();
    for &op in ops {
        let mut last = None;
        for &bytes in sizes {
            let per = if op.chunked() { elt * ranks } else { elt };
            let count = bytes / per;
            if count == 0 {
                skipped.push((op, bytes));
                continue;
            }
            let size = count * per;
            if last == Some(size) {
                continue;
            }
            last = Some(size);
            steps.push(Step { op, size, count });
        }
    }
    (steps, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("128B").unwrap(), 128);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(sizes(8, 64, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 4).unwrap(), vec![8, 32]);
        assert!(sizes(8, 64, 1).is_err());
        assert!(sizes(64, 8, 2).is_err());
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1000), "1000 B");
    }

    #[test]
    fn busbw_factors_are_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.busbw_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.busbw_factor(4), 0.75);
        assert_eq!(BenchOp::AllToAll.busbw_factor(2), 0.5);
        assert_eq!(BenchOp::Broadcast.busbw_factor(8), 1.0);
        assert_eq!(BenchOp::SendRecv.busbw_factor(2), 1.0);
        assert_eq!(BenchOp::parse_list("all").unwrap().len(), 7);
        assert_eq!(BenchOp::parse_list("alltoall,send_recv").unwrap(), vec![BenchOp::AllToAll, BenchOp::SendRecv]);
        assert!(BenchOp::parse_list("allreduce2").is_err());
    }

    #[test]
    fn plan_rounds_to_chunks_and_skips_empty_ones() {
        let (steps, skipped) = plan(&[BenchOp::AllReduce, BenchOp::AllGather], &[8, 16, 64], 4, 4);
        assert_eq!(steps[0], Step { op: BenchOp::AllReduce, size: 8, count: 2 });
        assert_eq!(skipped, vec![(BenchOp::AllGather, 8)]);
        assert!(steps.contains(&Step { op: BenchOp::AllGather, size: 16, count: 1 }));
        assert!(steps.contains(&Step { op: BenchOp::AllGather, size: 64, count: 4 }));
    }
}
