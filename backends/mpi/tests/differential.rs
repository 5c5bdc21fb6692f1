//! Differential test: the shm backend, the MPI backend and the oracle must agree on random inputs.
//!
//! `cargo test --profile ci -p concord-mpi --features mpi --test differential -- [--ranks 4]
//! [--seed 1] [--trials 300]` starts itself under `mpirun -np <ranks> --oversubscribe`; each rank
//! process joins *both* backends (shm rendezvouses through a FileStore whose path the launcher
//! passes in `CONCORD_DIFF_STORE`), runs the same op on both with inputs drawn from
//! `(seed, trial, rank)`, and compares both outputs with each other and with the oracle's (every
//! rank draws every rank's input again to compute it): bitwise where both must be exact (integers,
//! data movement, min / max, f16 / bf16 sums and averages: both round the f64 result once),
//! within a relative bound otherwise (f32 / f64 sums, which shm accumulates in the dtype; products;
//! premul_sum by a non-power-of-two). Every
//! mismatch names op, dtype, shape, world size, rank, first bad index, both values and the rerun
//! command; any mismatch or error makes the run fail.
//!
//! `--hosts` (the two-namespace test, `scripts/netns/two-hosts.sh`): the ranks sit on different
//! hosts, so shm init MUST fail on every rank with the named "spans hosts" error, and MPI is
//! checked against the oracle alone.
use concord_core::{Backend, DType, ReduceOp, Tensor, WorldInfo};
use concord_mpi::MpiBackend;
use concord_shm::ShmBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Command;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if std::env::var("OMPI_COMM_WORLD_SIZE").is_err() {
        std::process::exit(launch());
    }
    std::process::exit(rank_main());
}

/// Outside mpirun: start this binary under mpirun with a fresh store, clean up, return its status.
fn launch() -> i32 {
    let ranks = arg("--ranks", 4);
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = dir.path().join("store");
    let exe = std::env::current_exe().expect("own path");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let started = Instant::now();
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string()])
        .args(["-x", "CONCORD_DIFF_STORE", "-x", "CONCORD_DIFF_WORLD"])
        .env("CONCORD_DIFF_STORE", &store)
        .env("CONCORD_DIFF_WORLD", format!("diff{}", std::process::id()))
        .arg(exe)
        .args(&args);
    let status = match c.status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("differential: cannot start mpirun ({e}); install Open MPI (`apt-get install openmpi-bin libopenmpi-dev`)");
            return 2;
        }
    };
    eprintln!("differential: mpirun -np {ranks} finished in {:.1} s: {status}", started.elapsed().as_secs_f64());
    if status.success() {
        0
    } else {
        1
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    AllReduce,
    AllReduceInPlace,
    ReduceScatter,
    AllGather,
    AllToAll,
    AllToAllSplits,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    Permute,
    SendRecvRing,
}
const OPS: [Op; 12] = [
    Op::AllReduce,
    Op::AllReduceInPlace,
    Op::ReduceScatter,
    Op::AllGather,
    Op::AllToAll,
    Op::AllToAllSplits,
    Op::Broadcast,
    Op::Reduce,
    Op::Gather,
    Op::Scatter,
    Op::Permute,
    Op::SendRecvRing,
];

/// One trial, the same on every rank.
#[derive(Debug)]
struct Spec {
    op: Op,
    dtype: DType,
    reduce: ReduceOp,
    shape: Vec<usize>,
    root: usize,
    perm: Vec<usize>,
    /// all_to_all: splits[i][j] rows from rank i to rank j.
    splits: Vec<Vec<usize>>,
}

fn spec(seed: u64, trial: u64, n: usize) -> Spec {
    let mut r = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(trial));
    let op = OPS[r.gen_range(0..OPS.len())];
    let dtype = DType::ALL[r.gen_range(0..DType::ALL.len())];
    let reduces: Vec<ReduceOp> =
        [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor]
            .into_iter()
            .chain([ReduceOp::PremulSum(if r.gen_bool(0.5) { 2.0 } else { 0.3 })])
            .filter(|o| o.defined_for(dtype))
            .collect();
    let reduce = reduces[r.gen_range(0..reduces.len())];
    let max_rows = if r.gen_bool(0.1) { 4096 } else { 24 };
    let rows = n * r.gen_range(0..=max_rows);
    let cols = r.gen_range(1..=5);
    let shape = vec![rows, cols];
    let root = r.gen_range(0..n);
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, r.gen_range(0..=i));
    }
    let splits = (0..n).map(|_| (0..n).map(|_| r.gen_range(0..6)).collect()).collect();
    Spec { op, dtype, reduce, shape, root, perm, splits }
}

/// Rank `rank`'s input: random values of the dtype (for floats a few NaN / inf / ±0 where the op
/// does no arithmetic on them).
fn input(seed: u64, trial: u64, rank: usize, s: &Spec, shape: &[usize]) -> Tensor {
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ (trial << 20) ^ ((rank as u64) << 52) ^ 0x9e37_79b9);
    let numel: usize = shape.iter().product();
    if !s.dtype.is_float() {
        let mut t = Tensor::zeros(s.dtype, shape);
        r.fill(t.bytes_mut());
        return t;
    }
    let arith = matches!(s.op, Op::AllReduce | Op::AllReduceInPlace | Op::ReduceScatter | Op::Reduce)
        && !matches!(s.reduce, ReduceOp::Min | ReduceOp::Max);
    let vals: Vec<f64> = (0..numel)
        .map(|_| {
            if !arith && r.gen_ratio(1, 16) {
                [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0][r.gen_range(0..5)]
            } else if s.reduce == ReduceOp::Product && arith {
                r.gen_range(0.5..2.0)
            } else {
                r.gen_range(-1.0..1.0) * f64::powi(2.0, r.gen_range(-3..4))
            }
        })
        .collect();
    Tensor::from_f64(s.dtype, shape, &vals)
}

/// The op on backend `b`; `None` where the result is undefined on this rank (reduce / gather
/// off the root).
fn run<B: Backend>(b: &B, s: &Spec, x: &Tensor) -> Result<Option<Tensor>, String> {
    let (me, n) = (b.rank(), b.world_size());
    let e = |e: concord_core::CollectiveError| e.to_string();
    let xb = b.upload(x).map_err(e)?;
    let out = match s.op {
        Op::AllReduce => b.all_reduce(&xb, s.reduce).map_err(e)?.into_value(T).map_err(e)?,
        Op::AllReduceInPlace => b.all_reduce_(&xb, s.reduce).map_err(e)?.into_value(T).map_err(e)?,
        Op::ReduceScatter => b.reduce_scatter_tensor(&xb, s.reduce).map_err(e)?.into_value(T).map_err(e)?,
        Op::AllGather => b.all_gather_into_tensor(&xb).map_err(e)?.into_value(T).map_err(e)?,
        Op::AllToAll => b.all_to_all_single(&xb, None, None).map_err(e)?.into_value(T).map_err(e)?,
        Op::AllToAllSplits => {
            let ins: Vec<usize> = s.splits[me].clone();
            let outs: Vec<usize> = (0..n).map(|i| s.splits[i][me]).collect();
            b.all_to_all_single(&xb, Some(&outs), Some(&ins)).map_err(e)?.into_value(T).map_err(e)?
        }
        Op::Broadcast => b.broadcast(&xb, s.root).map_err(e)?.into_value(T).map_err(e)?,
        Op::Reduce => b.reduce(&xb, s.reduce, s.root).map_err(e)?.into_value(T).map_err(e)?,
        Op::Gather => b.gather(&xb, s.root).map_err(e)?.into_value(T).map_err(e)?,
        Op::Scatter => b.scatter(&xb, s.root).map_err(e)?.into_value(T).map_err(e)?,
        Op::Permute => b.permute_tensor(&xb, &s.perm).map_err(e)?.into_value(T).map_err(e)?,
        Op::SendRecvRing => {
            if n == 1 {
                return Ok(Some(x.clone()));
            }
            let out = b.alloc(x.dtype(), x.shape()).map_err(e)?;
            let rw = b.recv(&out, (me + n - 1) % n).map_err(e)?;
            let sw = b.send(&xb, (me + 1) % n).map_err(e)?;
            sw.wait(T).map_err(e)?;
            rw.into_value(T).map_err(e)?
        }
    };
    if matches!(s.op, Op::Reduce | Op::Gather) && me != s.root {
        return Ok(None);
    }
    b.download(&out).map(Some).map_err(e)
}

/// Whether both backends must agree bit for bit on this spec.
fn exact(s: &Spec) -> bool {
    let arith = matches!(s.op, Op::AllReduce | Op::AllReduceInPlace | Op::ReduceScatter | Op::Reduce);
    if !arith || !s.dtype.is_float() {
        return true;
    }
    match s.reduce {
        ReduceOp::Min | ReduceOp::Max => true,
        // shm accumulates f16 / bf16 in f64 and rounds once, as MPI here does; f32 / f64 in their
        // own type (so within tolerance of MPI's f64 sum rounded once).
        ReduceOp::Sum | ReduceOp::Avg => matches!(s.dtype, DType::F16 | DType::BF16),
        ReduceOp::PremulSum(f) => f == 2.0 && matches!(s.dtype, DType::F16 | DType::BF16),
        _ => false,
    }
}

/// The first disagreement: index, shm's value, MPI's value.
fn compare(s: &Spec, a: &Tensor, b: &Tensor) -> Option<(usize, String, String)> {
    if a.shape() != b.shape() {
        return Some((0, format!("shape {:?}", a.shape()), format!("shape {:?}", b.shape())));
    }
    let sz = a.dtype().size();
    let rel = match s.dtype {
        DType::F16 => 2f64.powi(-9),
        DType::BF16 => 2f64.powi(-6),
        DType::F32 => 2f64.powi(-21),
        _ => 2f64.powi(-48),
    };
    let exact = exact(s);
    // Sums may cancel: bound the error by the inputs' magnitude (below 8) times the rank count.
    let abs = if matches!(s.reduce, ReduceOp::Product | ReduceOp::Min | ReduceOp::Max) { 0.0 } else { rel * 8.0 * 64.0 };
    (0..a.numel()).find_map(|i| {
        let (ab, bb) = (&a.bytes()[i * sz..(i + 1) * sz], &b.bytes()[i * sz..(i + 1) * sz]);
        let same = if s.dtype.is_float() {
            let (x, y) = (a.get_f64(i), b.get_f64(i));
            (x.is_nan() && y.is_nan()) || ab == bb || (!exact && (x == y || (x - y).abs() <= rel * x.abs().max(y.abs()) + abs))
        } else {
            ab == bb
        };
        (!same).then(|| (i, a.fmt_element(i), b.fmt_element(i)))
    })
}

/// Rank `me`'s expected output, from every rank's input drawn again here (the oracle's reduction
/// for reduce ops; the inputs' rows for data movement); `None` where undefined on this rank.
fn expected(seed: u64, trial: u64, n: usize, me: usize, s: &Spec) -> Option<Tensor> {
    let shape_of = |r: usize| match s.op {
        Op::AllToAllSplits => vec![s.splits[r].iter().sum(), s.shape[1]],
        _ => s.shape.clone(),
    };
    let xs: Vec<Tensor> = (0..n).map(|r| input(seed, trial, r, s, &shape_of(r))).collect();
    let rows = s.shape[0];
    let row = &s.shape[1..];
    let sem = concord_oracle::Semantics::of(&concord_core::Capabilities::full(64));
    let reduced = || concord_oracle::reduce_tensors(s.reduce, &xs.iter().collect::<Vec<_>>(), &sem);
    Some(match s.op {
        Op::AllReduce | Op::AllReduceInPlace => reduced(),
        Op::Reduce if me == s.root => reduced(),
        Op::Gather if me == s.root => Tensor::cat_rows(s.dtype, row, &xs),
        Op::Reduce | Op::Gather => return None,
        Op::ReduceScatter => reduced().slice_rows(me * rows / n, rows / n),
        Op::AllGather => Tensor::cat_rows(s.dtype, row, &xs),
        Op::AllToAll => Tensor::cat_rows(s.dtype, row, &xs.iter().map(|x| x.slice_rows(me * rows / n, rows / n)).collect::<Vec<_>>()),
        Op::AllToAllSplits => Tensor::cat_rows(
            s.dtype,
            row,
            &(0..n).map(|i| xs[i].slice_rows(s.splits[i][..me].iter().sum(), s.splits[i][me])).collect::<Vec<_>>(),
        ),
        Op::Broadcast => xs[s.root].clone(),
        Op::Scatter => xs[s.root].slice_rows(me * rows / n, rows / n),
        Op::Permute => xs[s.perm.iter().position(|&d| d == me).expect("a permutation")].clone(),
        Op::SendRecvRing => xs[(me + n - 1) % n].clone(),
    })
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
}

fn rank_main() -> i32 {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run through the launcher (no OMPI env)"));
    let rank: usize = env("OMPI_COMM_WORLD_RANK").parse().expect("rank");
    let n: usize = env("OMPI_COMM_WORLD_SIZE").parse().expect("size");
    let (seed, trials) = (arg("--seed", 1), arg("--trials", 300));
    let world = |id: &str| WorldInfo {
        rank,
        world_size: n,
        store_path: env("CONCORD_DIFF_STORE").into(),
        world_id: format!("{}{id}", env("CONCORD_DIFF_WORLD")),
        op_timeout: T,
        options: vec![],
    };
    let started = Instant::now();
    let mpi = match MpiBackend::init(&world("m")) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rank {rank}: mpi init failed: {e}");
            return 1;
        }
    };
    let shm = ShmBackend::init(&world("s"));
    // `--hosts`: ranks on different hosts: shm MUST refuse the world (on every rank, named), and
    // MPI is checked against the oracle alone.
    let hosts = std::env::args().any(|a| a == "--hosts");
    let mut bad = 0u64;
    let shm = match (shm, hosts) {
        (Ok(b), false) => Some(b),
        (Err(e), true) if e.to_string().contains("spans hosts") => {
            println!("rank {rank} on {}: shm refused the world as expected: {e}", host());
            None
        }
        (Ok(_), true) => {
            eprintln!("rank {rank}: shm init succeeded although the ranks sit on different hosts");
            return 1;
        }
        (Err(e), _) => {
            eprintln!("rank {rank}: shm init failed: {e}");
            return 1;
        }
    };
    let (mut exact_n, mut tol_n, mut elems) = (0u64, 0u64, 0u64);
    for trial in 0..trials {
        let s = spec(seed, trial, n);
        let shape = match s.op {
            Op::AllToAllSplits => vec![s.splits[rank].iter().sum(), s.shape[1]],
            _ => s.shape.clone(),
        };
        let x = input(seed, trial, rank, &s, &shape);
        let rerun = format!("rerun: cargo xtask mpi-diff --ranks {n} --seed {seed} --trials {}", trial + 1);
        let want = expected(seed, trial, n, rank, &s);
        let mut legs: Vec<(&str, Result<Option<Tensor>, String>)> = vec![("mpi", run(&mpi, &s, &x))];
        if let Some(shm) = &shm {
            legs.push(("shm", run(shm, &s, &x)));
        }
        if let [(_, Ok(Some(m))), (_, Ok(Some(sh)))] = &legs[..] {
            if let Some((i, gs, gm)) = compare(&s, sh, m) {
                bad += 1;
                eprintln!(
                    "DIFF trial {trial}: op={:?} reduce={} dtype={} shape={:?} world_size={n} rank={rank}: shm and mpi disagree at index {i}: shm={gs} mpi={gm}\n  {rerun}",
                    s.op, s.reduce, s.dtype, s.shape
                );
            }
        }
        for (name, got) in legs {
            let what = format!(
                "op={:?} reduce={} dtype={} shape={:?} root={} world_size={n} rank={rank}",
                s.op, s.reduce, s.dtype, s.shape, s.root
            );
            match (got, &want) {
                (Ok(Some(got)), Some(want)) => {
                    elems += got.numel() as u64;
                    if exact(&s) {
                        exact_n += 1
                    } else {
                        tol_n += 1
                    }
                    if let Some((i, ge, gw)) = compare(&s, want, &got) {
                        bad += 1;
                        let how = if exact(&s) { "bitwise" } else { "within tolerance" };
                        eprintln!(
                            "DIFF trial {trial}: {what}: {name} vs oracle ({how}): first bad index {i}: got {gw}, expected {ge}\n  {rerun}"
                        );
                    }
                }
                (Ok(None), None) => {}
                (Ok(_), _) => {
                    bad += 1;
                    eprintln!("DIFF trial {trial}: {what}: {name} returned a result where the oracle has none, or none where it has one\n  {rerun}");
                }
                (Err(e), _) => {
                    bad += 1;
                    eprintln!("DIFF trial {trial}: {what}: {name} failed: {e}\n  {rerun}");
                }
            }
        }
    }
    // Every rank's mismatch count, summed through the MPI backend itself.
    let total = (|| {
        let t = mpi.upload(&Tensor::from_vec(&[4], vec![bad as i64, exact_n as i64, tol_n as i64, elems as i64])).ok()?;
        let w = mpi.all_reduce(&t, ReduceOp::Sum).ok()?.into_value(T).ok()?;
        Some(mpi.download(&w).ok()?.as_slice::<i64>().to_vec())
    })();
    drop(shm);
    let Some(total) = total else {
        eprintln!("rank {rank}: could not sum the verdicts");
        return 1;
    };
    if rank == 0 {
        println!(
            "differential {}: {trials} trials x {n} ranks (seed {seed}): {} comparisons bitwise, {} within tolerance, {} elements compared, {} mismatches, {:.1} s",
            if hosts { "mpi vs oracle across hosts (shm refused)" } else { "shm vs mpi vs oracle" },
            total[1],
            total[2],
            total[3],
            total[0],
            started.elapsed().as_secs_f64()
        );
    }
    if total[0] == 0 {
        0
    } else {
        1
    }
}
