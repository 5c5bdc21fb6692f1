//! `concord-nccl-smoke`: a standalone 2-GPU smoke and conformance run of the NCCL backend.
//!
//! Run it with no arguments on a machine with ≥ 2 GPUs. It re-executes itself as the ranks of
//! several worlds (rendezvous through a `FileStore` in a temporary folder) and checks, against
//! values computed on the host:
//! * every op × variant × dtype × reduce op (declared gaps must fail with the named error),
//! * NaN handling of min/max and integer avg rounding (observed, then compared with what the
//!   backend declares),
//! * bad inputs (mismatched across ranks) → the same named error on both ranks, no hang,
//! * subgroups (a group of one, a reversed group), async bookkeeping,
//! * a peer that exits mid-run → the survivor's wait ends with a named error within the deadline,
//! * a world larger than the GPU count → "needs N GPUs, found M".
//!
//! It also times NCCL init and all_reduce at 1 KiB and 1 GiB (busbw as nccl-tests computes it).
//! Output: one `PASS name` / `FAIL name: why` line per check, `TIME` / `OBSERVE` lines, and a
//! final `N passed, M failed` line. Exit status: 0 all passed, 1 some failed, 2 cannot run here.

use concord_core::{Backend, CollectiveError, DType, ReduceOp, Tensor, WorldInfo};
use concord_nccl::{probe, NcclBackend, NcclBuffer};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
const ROLE: &str = "CONCORD_SMOKE_ROLE";

fn main() {
    match std::env::var(ROLE) {
        Ok(role) => std::process::exit(worker(&role)),
        Err(_) => std::process::exit(parent()),
    }
}

// ============================================================================================
// Parent: spawns worlds, merges their reports.
// ============================================================================================

struct Phase {
    role: &'static str,
    ranks: usize,
    world_size: usize,
    options: &'static str,
    op_timeout_ms: u64,
    deadline: Duration,
}

fn parent() -> i32 {
    let started = Instant::now();
    let info = match probe() {
        Ok(i) => i,
        Err(e) => {
            println!("CANNOT RUN: {e}");
            println!("0 passed, 0 failed (nothing ran: {e})");
            return 2;
        }
    };
    println!(
        "NCCL {} with {} visible GPU(s)",
        info.nccl_version, info.gpus
    );
    if info.gpus < 2 {
        println!("CANNOT RUN: needs 2 GPUs, found {}", info.gpus);
        println!(
            "0 passed, 0 failed (nothing ran: needs 2 GPUs, found {})",
            info.gpus
        );
        return 2;
    }
    let only: Option<String> = std::env::args().nth(1);
    let phases = [
        Phase {
            role: "main",
            ranks: 2,
            world_size: 2,
            options: "",
            op_timeout_ms: 20_000,
            deadline: Duration::from_secs(300),
        },
        Phase {
            role: "dead",
            ranks: 2,
            world_size: 2,
            options: "",
            op_timeout_ms: 3_000,
            deadline: Duration::from_secs(60),
        },
        Phase {
            role: "dead",
            ranks: 2,
            world_size: 2,
            options: "validate=0",
            op_timeout_ms: 3_000,
            deadline: Duration::from_secs(60),
        },
        Phase {
            role: "gating",
            ranks: 1,
            world_size: info.gpus + 1,
            options: "",
            op_timeout_ms: 3_000,
            deadline: Duration::from_secs(30),
        },
        Phase {
            role: "main",
            ranks: 2,
            world_size: 2,
            options: "blocking=1",
            op_timeout_ms: 20_000,
            deadline: Duration::from_secs(300),
        },
    ];
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new(); // check -> failures ("" = pass)
    for p in phases
        .iter()
        .filter(|p| only.as_deref().is_none_or(|o| o == p.role))
    {
        let tag = if p.options.is_empty() {
            p.role.to_string()
        } else {
            format!("{}[{}]", p.role, p.options)
        };
        println!(
            "== phase {tag}: {} rank(s) of a world of {}",
            p.ranks, p.world_size
        );
        let t = Instant::now();
        let lines = run_phase(p);
        for (rank, line) in &lines {
            if let Some(rest) = line.strip_prefix("CHECK ") {
                let (name, verdict) = rest.split_once(' ').unwrap_or((rest, "FAIL (no verdict)"));
                let entry = results.entry(format!("{tag}/{name}")).or_default();
                if verdict != "PASS" {
                    entry.push(format!(
                        "rank {rank}: {}",
                        verdict.trim_start_matches("FAIL ")
                    ));
                }
            } else if line.starts_with("TIME ")
                || line.starts_with("OBSERVE ")
                || line.starts_with("INFO ")
            {
                println!("[{tag} r{rank}] {line}");
            }
        }
        println!("== phase {tag} took {:.2} s", t.elapsed().as_secs_f64());
    }
    let (mut passed, mut failed) = (0, 0);
    for (name, fails) in &results {
        if fails.is_empty() {
            passed += 1;
            println!("PASS {name}");
        } else {
            failed += 1;
            println!("FAIL {name}: {}", fails.join("; "));
        }
    }
    println!("total wall time {:.2} s", started.elapsed().as_secs_f64());
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        1
    } else {
        0
    }
}

/// Runs one world; returns (rank, stdout line) for every line the ranks printed.
fn run_phase(p: &Phase) -> Vec<(usize, String)> {
    let dir = tempfile::Builder::new()
        .prefix("concord-nccl-smoke-")
        .tempdir()
        .expect("a temporary folder");
    let store = dir.path().join("store");
    let exe = std::env::current_exe().expect("own path");
    let lines: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let mut children = Vec::new();
    let mut readers = Vec::new();
    let world_id = format!("smoke-{}-{}", p.role, std::process::id());
    for rank in 0..p.ranks {
        let mut cmd = Command::new(&exe);
        cmd.env(ROLE, p.role)
            .env("CONCORD_SMOKE_RANK", rank.to_string())
            .env("CONCORD_SMOKE_WS", p.world_size.to_string())
            .env("CONCORD_SMOKE_STORE", &store)
            .env("CONCORD_SMOKE_WORLD", &world_id)
            .env("CONCORD_SMOKE_OPTS", p.options)
            .env("CONCORD_SMOKE_TIMEOUT_MS", p.op_timeout_ms.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                lines.lock().unwrap().push((
                    rank,
                    format!("CHECK spawn FAIL could not spawn rank {rank}: {e}"),
                ));
                continue;
            }
        };
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let l = lines.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                l.lock().unwrap().push((rank, line));
            }
        }));
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                eprintln!("[r{rank} stderr] {line}");
            }
        }));
        children.push((rank, child));
    }
    let deadline = Instant::now() + p.deadline;
    for (rank, child) in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let expected_exit = p.role == "dead" && *rank == 1;
                    if !status.success() && !expected_exit {
                        lines.lock().unwrap().push((
                            *rank,
                            format!("CHECK exit FAIL rank {rank} ended with {status}"),
                        ));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    lines.lock().unwrap().push((
                        *rank,
                        format!(
                            "CHECK deadline FAIL rank {rank} killed after {:?}",
                            p.deadline
                        ),
                    ));
                    break;
                }
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
    drop(dir);
    let v = lines.lock().unwrap().clone();
    v
}

// ============================================================================================
// Worker side.
// ============================================================================================

fn env_usize(k: &str) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn world_from_env() -> WorldInfo {
    let options = std::env::var("CONCORD_SMOKE_OPTS")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    WorldInfo {
        rank: env_usize("CONCORD_SMOKE_RANK"),
        world_size: env_usize("CONCORD_SMOKE_WS"),
        store_path: PathBuf::from(std::env::var("CONCORD_SMOKE_STORE").unwrap_or_default()),
        world_id: std::env::var("CONCORD_SMOKE_WORLD").unwrap_or_default(),
        op_timeout: Duration::from_millis(env_usize("CONCORD_SMOKE_TIMEOUT_MS") as u64),
        options,
    }
}

fn say(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

fn worker(role: &str) -> i32 {
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let world = world_from_env();
    let t = Instant::now();
    let b = match NcclBackend::init(&world) {
        Ok(b) => b,
        Err(e) => {
            if role == "gating" {
                let want = format!(
                    "needs {} GPUs, found {}",
                    world.world_size,
                    world.world_size - 1
                );
                let ok = e.name() == "unsupported" && e.to_string().contains(&want);
                say(format!(
                    "CHECK init-refuses-too-large-world {}",
                    verdict(ok, &format!("got {e}"))
                ));
                say(format!("INFO init error: {e}"));
                return 0;
            }
            say(format!("CHECK init FAIL {e}"));
            return 1;
        }
    };
    if role == "gating" {
        say("CHECK init-refuses-too-large-world FAIL init succeeded".into());
        return 0;
    }
    let init_ms = t.elapsed().as_secs_f64() * 1e3;
    say(format!(
        "TIME init_ms {init_ms:.1} (backend-reported {:.1} ms)",
        b.init_time().as_secs_f64() * 1e3
    ));
    if world.rank == 0 {
        say(format!(
            "INFO nccl {} on GPU {}, validation {}",
            b.nccl_version(),
            b.device_ordinal(),
            b.validating()
        ));
    }
    let s = Smoke {
        b,
        blocking: world.option("blocking") == Some("1"),
        rank: world.rank,
        ws: world.world_size,
    };
    match role {
        "main" => s.main_checks(),
        "dead" => s.dead_peer(&world),
        other => say(format!("CHECK role FAIL unknown role {other}")),
    }
    let t = Instant::now();
    drop(s);
    say(format!(
        "TIME teardown_ms {:.1}",
        t.elapsed().as_secs_f64() * 1e3
    ));
    0
}

fn verdict(ok: bool, why: &str) -> String {
    if ok {
        "PASS".into()
    } else {
        format!("FAIL {why}")
    }
}

struct Smoke {
    b: NcclBackend,
    blocking: bool,
    rank: usize,
    ws: usize,
}

type R = Result<(), String>;

fn e2s(e: CollectiveError) -> String {
    e.to_string()
}

/// Small exact values: rank- and index-dependent integers (negative ones for signed types).
fn val(d: DType, r: usize, i: usize) -> f64 {
    let k = (i % 5) as f64;
    if d.is_signed_int() || d.is_float() {
        k - 2.0 + 3.0 * r as f64
    } else {
        k + 1.0 + 3.0 * r as f64
    }
}

fn input(d: DType, shape: &[usize], r: usize) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f64(d, shape, &(0..n).map(|i| val(d, r, i)).collect::<Vec<_>>())
}

/// Elementwise reduction of every rank's `input`, computed on the host.
fn reduced(d: DType, shape: &[usize], ws: usize, op: ReduceOp) -> Tensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let xs: Vec<f64> = (0..ws).map(|r| val(d, r, i)).collect();
            let sum: f64 = xs.iter().sum();
            match op {
                ReduceOp::Sum => sum,
                ReduceOp::Product => xs.iter().product(),
                ReduceOp::Min => xs.iter().cloned().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Avg if d.is_float() => sum / ws as f64,
                ReduceOp::Avg => ((sum as i64) / ws as i64) as f64, // truncation, as declared
                ReduceOp::PremulSum(s) => xs.iter().map(|x| s * x).sum(),
                _ => f64::NAN,
            }
        })
        .collect();
    Tensor::from_f64(d, shape, &vals)
}

fn same(got: &Tensor, want: &Tensor) -> R {
    if got == want {
        return Ok(());
    }
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "got {}{:?}, want {}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    let n = got.numel();
    let sz = got.dtype().size();
    let i = (0..n)
        .find(|&i| got.bytes()[i * sz..(i + 1) * sz] != want.bytes()[i * sz..(i + 1) * sz])
        .unwrap_or(0);
    Err(format!(
        "first bad index {i}: got {} want {} (got {got:?}, want {want:?})",
        got.fmt_element(i),
        want.fmt_element(i)
    ))
}

/// The dtypes NCCL moves: every Concord dtype but the 16-bit integers.
fn nccl_dtypes() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|d| !matches!(d, DType::I16 | DType::U16))
}
const REDUCE_OPS: [ReduceOp; 6] = [
    ReduceOp::Sum,
    ReduceOp::Product,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
    ReduceOp::PremulSum(2.0),
];

impl Smoke {
    fn check(&self, name: &str, f: impl FnOnce(&Self) -> R) {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(self))).unwrap_or_else(|p| {
            Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ))
        });
        say(format!(
            "CHECK {name} {}",
            verdict(
                r.is_ok(),
                r.as_ref().err().map(|s| s.as_str()).unwrap_or("")
            )
        ));
    }

    fn up(&self, t: &Tensor) -> Result<NcclBuffer, String> {
        self.b.upload(t).map_err(e2s)
    }
    fn down(&self, x: &NcclBuffer) -> Result<Tensor, String> {
        self.b.download(x).map_err(e2s)
    }

    /// Expects a named error `want` (e.g. `bad_input:shape_mismatch`) from `f`, issued or waited.
    fn expect_err<T>(
        &self,
        want: &str,
        f: impl FnOnce() -> Result<concord_core::Work<T>, CollectiveError>,
    ) -> R {
        let t = Instant::now();
        let got = match f() {
            Err(e) => e,
            Ok(w) => match w.wait(WAIT) {
                Err(e) => e,
                Ok(_) => return Err(format!("expected {want}, but the op succeeded")),
            },
        };
        if got.name() != want {
            return Err(format!("expected {want}, got {}: {got}", got.name()));
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("named error took {:?}", t.elapsed()));
        }
        Ok(())
    }

    fn main_checks(&self) {
        let (r, ws) = (self.rank, self.ws);
        let b = &self.b;
        self.check("barrier", |_| {
            b.barrier()
                .map_err(e2s)?
                .wait(WAIT)
                .map(|_| ())
                .map_err(e2s)
        });

        // ---- reductions: every NCCL dtype × reduce op × variant ----
        for d in nccl_dtypes() {
            for op in REDUCE_OPS {
                let tag = format!("{}/{d}", op.name());
                if !op.defined_for(d) {
                    self.check(&format!("all_reduce/{tag}/refused"), |s| {
                        let x = s.up(&input(d, &[3], r))?;
                        s.expect_err("bad_input:unsupported_dtype", || b.all_reduce(&x, op))
                    });
                    continue;
                }
                let shape = [13usize];
                self.check(&format!("all_reduce/out/{tag}"), |s| {
                    let x = s.up(&input(d, &shape, r))?;
                    let w = b.all_reduce(&x, op).map_err(e2s)?;
                    let y = w.into_value(WAIT).map_err(e2s)?;
                    if b.buffer_addr(&y) == b.buffer_addr(&x) {
                        return Err("out-of-place result aliases its input".into());
                    }
                    same(&s.down(&x)?, &input(d, &shape, r))
                        .map_err(|e| format!("input changed: {e}"))?;
                    same(&s.down(&y)?, &reduced(d, &shape, ws, op))
                });
                self.check(&format!("all_reduce/inplace/{tag}"), |s| {
                    let x = s.up(&input(d, &shape, r))?;
                    let y = b
                        .all_reduce_(&x, op)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    if b.buffer_addr(&y) != b.buffer_addr(&x) {
                        return Err("in-place result is not the buffer given".into());
                    }
                    same(&s.down(&x)?, &reduced(d, &shape, ws, op))
                });
                for inplace in [false, true] {
                    let v = if inplace {
                        "coalesced_inplace"
                    } else {
                        "coalesced"
                    };
                    self.check(&format!("all_reduce/{v}/{tag}"), |s| {
                        let shapes: Vec<Vec<usize>> = (0..4).map(|i| vec![i, i]).collect();
                        let xs: Vec<NcclBuffer> = shapes
                            .iter()
                            .map(|sh| s.up(&input(d, sh, r)))
                            .collect::<Result<_, _>>()?;
                        let w = if inplace {
                            b.all_reduce_coalesced_(&xs, op)
                        } else {
                            b.all_reduce_coalesced(&xs, op)
                        };
                        let ys = w.map_err(e2s)?.into_value(WAIT).map_err(e2s)?;
                        for (i, (y, sh)) in ys.iter().zip(&shapes).enumerate() {
                            same(&s.down(y)?, &reduced(d, sh, ws, op))
                                .map_err(|e| format!("tensor {i}: {e}"))?;
                        }
                        Ok(())
                    });
                }
                let rs_shape = [2 * ws + 2, 3];
                let rows = rs_shape[0] / ws;
                self.check(&format!("reduce_scatter_tensor/out/{tag}"), |s| {
                    let x = s.up(&input(d, &rs_shape, r))?;
                    let y = b
                        .reduce_scatter_tensor(&x, op)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    same(
                        &s.down(&y)?,
                        &reduced(d, &rs_shape, ws, op).slice_rows(r * rows, rows),
                    )
                });
                self.check(&format!("reduce_scatter_tensor/outbuf/{tag}"), |s| {
                    let x = s.up(&input(d, &rs_shape, r))?;
                    let out = b.alloc(d, &[rows, 3]).map_err(e2s)?;
                    let y = b
                        .reduce_scatter_tensor_out(&x, op, &out)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    if b.buffer_addr(&y) != b.buffer_addr(&out) {
                        return Err("_out result is not the caller's buffer".into());
                    }
                    same(
                        &s.down(&out)?,
                        &reduced(d, &rs_shape, ws, op).slice_rows(r * rows, rows),
                    )
                });
                self.check(&format!("reduce_scatter_tensor/coalesced/{tag}"), |s| {
                    let shapes = [vec![2 * ws], vec![0], vec![ws, 2]];
                    let xs: Vec<NcclBuffer> = shapes
                        .iter()
                        .map(|sh| s.up(&input(d, sh, r)))
                        .collect::<Result<_, _>>()?;
                    let ys = b
                        .reduce_scatter_tensor_coalesced(&xs, op)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    for (i, (y, sh)) in ys.iter().zip(&shapes).enumerate() {
                        let k = sh[0] / ws;
                        same(&s.down(y)?, &reduced(d, sh, ws, op).slice_rows(r * k, k))
                            .map_err(|e| format!("tensor {i}: {e}"))?;
                    }
                    Ok(())
                });
                self.check(&format!("reduce/root1/{tag}"), |s| {
                    let x = s.up(&input(d, &shape, r))?;
                    let y = b
                        .reduce(&x, op, 1)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    if r == 1 {
                        same(&s.down(&y)?, &reduced(d, &shape, ws, op))?;
                    }
                    Ok(())
                });
            }
        }
        // Declared gaps fail with their named error, on every rank.
        for d in [DType::I16, DType::U16] {
            self.check(&format!("all_reduce/sum/{d}/refused"), |s| {
                let x = s.up(&input(d, &[4], r))?;
                s.expect_err("bad_input:unsupported_dtype", || {
                    b.all_reduce(&x, ReduceOp::Sum)
                })
            });
        }
        for op in [ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor] {
            self.check(&format!("all_reduce/{}/i32/refused", op.name()), |s| {
                let x = s.up(&input(DType::I32, &[4], r))?;
                s.expect_err("bad_input:unsupported_op", || b.all_reduce(&x, op))
            });
        }

        // ---- data movement: every dtype ----
        for d in concord_core::DType::ALL {
            self.movement_checks(d);
        }
        self.semantics();
        self.bad_inputs();
        self.subgroups();
        self.async_checks();
        self.timings();
        self.check("outstanding-zero-at-end", |_| {
            if b.outstanding() == 0 {
                Ok(())
            } else {
                Err(format!("{} outstanding", b.outstanding()))
            }
        });
    }

    fn movement_checks(&self, d: DType) {
        let (r, ws) = (self.rank, self.ws);
        let b = &self.b;
        let others = |shape: &[usize]| (0..ws).map(|q| input(d, shape, q)).collect::<Vec<_>>();
        self.check(&format!("all_gather_into_tensor/out/{d}"), |s| {
            let x = s.up(&input(d, &[3, 2], r))?;
            let y = b
                .all_gather_into_tensor(&x)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            same(&s.down(&y)?, &Tensor::cat_rows(d, &[2], &others(&[3, 2])))
        });
        self.check(&format!("all_gather_into_tensor/zero_dim/{d}"), |s| {
            let x = s.up(&input(d, &[], r))?;
            let y = b
                .all_gather_into_tensor(&x)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            let want = Tensor::cat_rows(d, &[], &others(&[]));
            same(&s.down(&y)?, &want)
        });
        self.check(&format!("all_gather_into_tensor/outbuf/{d}"), |s| {
            let x = s.up(&input(d, &[5], r))?;
            let out = b.alloc(d, &[5 * ws]).map_err(e2s)?;
            b.all_gather_into_tensor_out(&x, &out)
                .map_err(e2s)?
                .wait(WAIT)
                .map_err(e2s)?;
            same(&s.down(&out)?, &Tensor::cat_rows(d, &[], &others(&[5])))
        });
        self.check(&format!("all_gather_into_tensor/coalesced/{d}"), |s| {
            let shapes = [vec![1], vec![0], vec![2, 2]];
            let xs: Vec<NcclBuffer> = shapes
                .iter()
                .map(|sh| s.up(&input(d, sh, r)))
                .collect::<Result<_, _>>()?;
            let ys = b
                .all_gather_into_tensor_coalesced(&xs)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            for (i, (y, sh)) in ys.iter().zip(&shapes).enumerate() {
                same(&s.down(y)?, &Tensor::cat_rows(d, &sh[1..], &others(sh)))
                    .map_err(|e| format!("tensor {i}: {e}"))?;
            }
            Ok(())
        });
        // Uneven splits with zeros: rank q sends `split(q, j)` rows to rank j.
        let split = |q: usize, j: usize| (q * 3 + j * 2) % 4; // 0..3, zeros included
        self.check(&format!("all_to_all_single/uneven/{d}"), |s| {
            let ins: Vec<usize> = (0..ws).map(|j| split(r, j)).collect();
            let outs: Vec<usize> = (0..ws).map(|q| split(q, r)).collect();
            let rows: usize = ins.iter().sum();
            let x = s.up(&input(d, &[rows, 2], r))?;
            let y = b
                .all_to_all_single(&x, Some(&outs), Some(&ins))
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            let mut parts = Vec::new();
            for q in 0..ws {
                let qin: Vec<usize> = (0..ws).map(|j| split(q, j)).collect();
                let start: usize = qin[..r].iter().sum();
                let full = input(d, &[qin.iter().sum(), 2], q);
                parts.push(full.slice_rows(start, qin[r]));
            }
            same(&s.down(&y)?, &Tensor::cat_rows(d, &[2], &parts))
        });
        self.check(&format!("all_to_all_single/equal/{d}"), |s| {
            let x = s.up(&input(d, &[2 * ws, 3], r))?;
            let y = b
                .all_to_all_single(&x, None, None)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            let parts: Vec<Tensor> = (0..ws)
                .map(|q| input(d, &[2 * ws, 3], q).slice_rows(2 * r, 2))
                .collect();
            same(&s.down(&y)?, &Tensor::cat_rows(d, &[3], &parts))
        });
        self.check(&format!("broadcast/out/{d}"), |s| {
            let x = s.up(&input(d, &[7], r))?;
            let y = b
                .broadcast(&x, 1)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            same(&s.down(&x)?, &input(d, &[7], r)).map_err(|e| format!("input changed: {e}"))?;
            same(&s.down(&y)?, &input(d, &[7], 1))
        });
        self.check(&format!("broadcast/inplace/{d}"), |s| {
            let x = s.up(&input(d, &[2, 3], r))?;
            let y = b
                .broadcast_(&x, 0)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            if b.buffer_addr(&y) != b.buffer_addr(&x) {
                return Err("in-place result is not the buffer given".into());
            }
            same(&s.down(&x)?, &input(d, &[2, 3], 0))
        });
        self.check(&format!("permute_tensor/{d}"), |s| {
            let perm: Vec<usize> = (0..ws).map(|q| (q + 1) % ws).collect();
            let x = s.up(&input(d, &[4], r))?;
            let y = b
                .permute_tensor(&x, &perm)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            let from = perm.iter().position(|&p| p == r).unwrap();
            same(&s.down(&y)?, &input(d, &[4], from))
        });
        self.check(&format!("gather/root0/{d}"), |s| {
            let x = s.up(&input(d, &[3], r))?;
            let y = b
                .gather(&x, 0)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            if r == 0 {
                same(&s.down(&y)?, &Tensor::cat_rows(d, &[], &others(&[3])))?;
            }
            Ok(())
        });
        self.check(&format!("scatter/root1/{d}"), |s| {
            let x = s.up(&input(d, &[2 * ws, 2], r))?;
            let y = b
                .scatter(&x, 1)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            same(
                &s.down(&y)?,
                &input(d, &[2 * ws, 2], 1).slice_rows(2 * r, 2),
            )
        });
        self.check(&format!("send_recv/{d}"), |s| {
            for (src, dst) in [(0usize, 1usize), (1, 0)] {
                if r == src {
                    let x = s.up(&input(d, &[6], r))?;
                    b.send(&x, dst).map_err(e2s)?.wait(WAIT).map_err(e2s)?;
                } else if r == dst {
                    let out = b.alloc(d, &[6]).map_err(e2s)?;
                    b.recv(&out, src).map_err(e2s)?.wait(WAIT).map_err(e2s)?;
                    same(&s.down(&out)?, &input(d, &[6], src))?;
                }
            }
            Ok(())
        });
    }

    /// NaN and signed zeros in min/max, integer avg rounding: observed, then compared with the
    /// declared capabilities.
    fn semantics(&self) {
        let r = self.rank;
        let b = &self.b;
        let caps = b.capabilities();
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            // element: rank0, rank1
            let pairs = [
                (f64::NAN, 1.0),
                (1.0, f64::NAN),
                (f64::NAN, f64::NAN),
                (-0.0, 0.0),
                (0.0, -0.0),
                (f64::INFINITY, 1.0),
            ];
            let mine: Vec<f64> = pairs
                .iter()
                .map(|p| if r == 0 { p.0 } else { p.1 })
                .collect();
            let mut seen = BTreeMap::new();
            self.check(&format!("nan-policy/{d}"), |s| {
                for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum] {
                    let x = s.up(&Tensor::from_f64(d, &[pairs.len()], &mine))?;
                    let y = s.down(
                        &b.all_reduce(&x, op)
                            .map_err(e2s)?
                            .into_value(WAIT)
                            .map_err(e2s)?,
                    )?;
                    let got: Vec<String> = (0..pairs.len())
                        .map(|i| format!("{:?}", y.get_f64(i)))
                        .collect();
                    seen.insert(op.name(), got.clone());
                    if r == 0 {
                        say(format!(
                            "OBSERVE {d} {}(NaN,1) (1,NaN) (NaN,NaN) (-0,+0) (+0,-0) (inf,1) = {}",
                            op.name(),
                            got.join(" ")
                        ));
                    }
                }
                let max = &seen["max"];
                let min = &seen["min"];
                let observed = if max[0] == "1.0"
                    && max[1] == "1.0"
                    && min[0] == "1.0"
                    && min[1] == "1.0"
                {
                    concord_core::NanPolicy::Ignore
                } else if max[0] == "NaN" && max[1] == "NaN" && min[0] == "NaN" && min[1] == "NaN" {
                    concord_core::NanPolicy::Propagate
                } else {
                    return Err(format!("mixed NaN behaviour: min {min:?} max {max:?}"));
                };
                if seen["sum"][0] != "NaN" {
                    return Err(format!(
                        "sum(NaN, 1) = {} (NaN must propagate through sum)",
                        seen["sum"][0]
                    ));
                }
                if observed != caps.nan_minmax {
                    return Err(format!(
                        "observed {observed:?}, declared {:?}",
                        caps.nan_minmax
                    ));
                }
                Ok(())
            });
        }
        for d in [
            DType::I8,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::U32,
            DType::U64,
        ] {
            self.check(&format!("int-avg-rounding/{d}"), |s| {
                let mine: Vec<f64> = if d.is_signed_int() {
                    if r == 0 {
                        vec![3.0, -3.0, 1.0]
                    } else {
                        vec![4.0, -4.0, -2.0]
                    }
                } else if r == 0 {
                    vec![3.0, 5.0, 0.0]
                } else {
                    vec![4.0, 8.0, 1.0]
                };
                let x = s.up(&Tensor::from_f64(d, &[3], &mine))?;
                let y = s.down(
                    &b.all_reduce(&x, ReduceOp::Avg)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?,
                )?;
                let got: Vec<String> = (0..3).map(|i| y.fmt_element(i)).collect();
                if r == 0 {
                    let pairs = if d.is_signed_int() {
                        "(3,4) (-3,-4) (1,-2)"
                    } else {
                        "(3,4) (5,8) (0,1)"
                    };
                    say(format!("OBSERVE {d} avg{pairs} = {}", got.join(" ")));
                }
                let sums: Vec<i64> = if d.is_signed_int() {
                    vec![7, -7, -1]
                } else {
                    vec![7, 13, 1]
                };
                let trunc: Vec<String> = sums.iter().map(|v| (v / 2).to_string()).collect();
                let floor: Vec<String> = sums.iter().map(|v| v.div_euclid(2).to_string()).collect();
                let observed = if got == trunc {
                    concord_core::IntAvg::Truncate
                } else if got == floor {
                    concord_core::IntAvg::Floor
                } else {
                    return Err(format!("neither truncation nor floor: {got:?}"));
                };
                if observed != caps.int_avg && d.is_signed_int() {
                    return Err(format!(
                        "observed {observed:?}, declared {:?}",
                        caps.int_avg
                    ));
                }
                Ok(())
            });
        }
    }

    fn bad_inputs(&self) {
        let r = self.rank;
        let b = &self.b;
        let f32s = |shape: &[usize]| input(DType::F32, shape, r);
        self.check("bad/shape-mismatch", |s| {
            let x = s.up(&f32s(&[4 + r]))?;
            s.expect_err("bad_input:shape_mismatch", || {
                b.all_reduce(&x, ReduceOp::Sum)
            })
        });
        self.check("bad/dtype-mismatch", |s| {
            let x = s.up(&input(
                if r == 0 { DType::F32 } else { DType::F64 },
                &[4],
                r,
            ))?;
            s.expect_err("bad_input:dtype_mismatch", || b.all_gather_into_tensor(&x))
        });
        self.check("bad/reduce-op-mismatch", |s| {
            let x = s.up(&f32s(&[4]))?;
            s.expect_err("bad_input:reduce_op_mismatch", || {
                b.all_reduce(&x, if r == 0 { ReduceOp::Sum } else { ReduceOp::Max })
            })
        });
        self.check("bad/indivisible-reduce-scatter", |s| {
            let x = s.up(&f32s(&[5]))?;
            s.expect_err("bad_input:indivisible", || {
                b.reduce_scatter_tensor(&x, ReduceOp::Sum)
            })
        });
        self.check("bad/split-mismatch", |s| {
            let x = s.up(&f32s(&[4]))?;
            let outs: &[usize] = if r == 0 { &[2, 2] } else { &[2, 1] };
            s.expect_err("bad_input:split_mismatch", || {
                b.all_to_all_single(&x, Some(outs), Some(&[2, 2]))
            })
        });
        self.check("bad/splits-do-not-sum", |s| {
            let x = s.up(&f32s(&[4]))?;
            let ins: &[usize] = if r == 0 { &[2, 2] } else { &[2, 3] };
            s.expect_err("bad_input:bad_splits", || {
                b.all_to_all_single(&x, Some(&[2, 2]), Some(ins))
            })
        });
        self.check("bad/root-mismatch", |s| {
            let x = s.up(&f32s(&[4]))?;
            s.expect_err("bad_input:bad_root", || b.broadcast(&x, r))
        });
        self.check("bad/root-out-of-range", |s| {
            let x = s.up(&f32s(&[4]))?;
            s.expect_err("bad_input:bad_root", || b.reduce(&x, ReduceOp::Sum, 7))
        });
        self.check("bad/out-buffer-size-on-one-rank", |s| {
            let x = s.up(&f32s(&[4]))?;
            let out = b.alloc(DType::F32, &[8 + r]).map_err(e2s)?;
            s.expect_err("bad_input:out_buffer_size", || {
                b.all_gather_into_tensor_out(&x, &out)
            })
        });
        self.check("bad/aliasing-out", |s| {
            let out = b.alloc(DType::F32, &[8]).map_err(e2s)?;
            let x = b.view(&out, 2, &[4]).map_err(e2s)?;
            s.expect_err("bad_input:aliasing", || {
                b.all_gather_into_tensor_out(&x, &out)
            })
        });
        self.check("bad/coalesced-count-mismatch", |s| {
            let xs: Vec<NcclBuffer> = (0..=r)
                .map(|_| s.up(&f32s(&[2])))
                .collect::<Result<_, _>>()?;
            s.expect_err("bad_input:count_mismatch", || {
                b.all_reduce_coalesced(&xs, ReduceOp::Sum)
            })
        });
        self.check("bad/not-a-permutation", |s| {
            let x = s.up(&f32s(&[2]))?;
            s.expect_err("bad_input:bad_permutation", || {
                b.permute_tensor(&x, &[0, 0])
            })
        });
        self.check("bad/op-mismatch", |s| {
            let x = s.up(&f32s(&[2]))?;
            if r == 0 {
                s.expect_err("bad_input:op_mismatch", || b.all_reduce(&x, ReduceOp::Sum))
            } else {
                s.expect_err("bad_input:op_mismatch", || b.all_gather_into_tensor(&x))
            }
        });
        self.check("bad/send-recv-size-mismatch", |s| {
            if r == 0 {
                let x = s.up(&f32s(&[4]))?;
                s.expect_err("bad_input:out_buffer_size", || b.send(&x, 1))
            } else {
                let out = b.alloc(DType::F32, &[5]).map_err(e2s)?;
                s.expect_err("bad_input:out_buffer_size", || b.recv(&out, 0))
            }
        });
        self.check("bad/send-to-self", |s| {
            let x = s.up(&f32s(&[4]))?;
            s.expect_err("bad_input:bad_peer", || b.send(&x, r))
        });
        self.check("bad/zero-dim-scatter", |s| {
            let x = s.up(&f32s(&[]))?;
            s.expect_err("bad_input:zero_dim", || b.scatter(&x, 0))
        });
        self.check("bad/world-still-usable", |s| {
            let x = s.up(&input(DType::I32, &[5], r))?;
            let y = b
                .all_reduce(&x, ReduceOp::Sum)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            same(
                &s.down(&y)?,
                &reduced(DType::I32, &[5], s.ws, ReduceOp::Sum),
            )
        });
    }

    fn subgroups(&self) {
        let r = self.rank;
        let b = &self.b;
        self.check("subgroup/of-one", |s| {
            let g = b.new_group(&[1]).map_err(e2s)?;
            match (r, g) {
                (0, None) => Ok(()),
                (1, Some(g)) => {
                    if g.world_size() != 1 || g.rank() != 0 {
                        return Err(format!("subgroup rank {} of {}", g.rank(), g.world_size()));
                    }
                    let x = g.upload(&input(DType::F32, &[5], r)).map_err(e2s)?;
                    let y = g
                        .all_reduce(&x, ReduceOp::Sum)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    same(&g.download(&y).map_err(e2s)?, &input(DType::F32, &[5], r))?;
                    let z = g
                        .all_gather_into_tensor(&x)
                        .map_err(e2s)?
                        .into_value(WAIT)
                        .map_err(e2s)?;
                    same(&g.download(&z).map_err(e2s)?, &input(DType::F32, &[5], r))?;
                    let _ = s;
                    Ok(())
                }
                (_, g) => Err(format!("rank {r} got membership {}", g.is_some())),
            }
        });
        self.check("subgroup/reversed", |_| {
            let g = b.new_group(&[1, 0]).map_err(e2s)?.ok_or("not a member")?;
            if g.rank() != 1 - r {
                return Err(format!("world rank {r} has subgroup rank {}", g.rank()));
            }
            let x = g.upload(&input(DType::I64, &[3], r)).map_err(e2s)?;
            let y = g
                .all_gather_into_tensor(&x)
                .map_err(e2s)?
                .into_value(WAIT)
                .map_err(e2s)?;
            let want = Tensor::cat_rows(
                DType::I64,
                &[],
                &[input(DType::I64, &[3], 1), input(DType::I64, &[3], 0)],
            );
            same(&g.download(&y).map_err(e2s)?, &want)
        });
        self.check("subgroup/bad-list", |s| {
            s.expect_err("bad_input:bad_group", || {
                b.new_group(&[0, 0]).map(|_| {
                    concord_core::Work::done(
                        (),
                        concord_core::WorkMeta {
                            backend: "nccl".into(),
                            op: "new_group".into(),
                            seq: 0,
                            rank: r,
                        },
                        &Default::default(),
                    )
                })
            })
        });
    }

    fn async_checks(&self) {
        let r = self.rank;
        let b = &self.b;
        self.check("async/lag-then-read", |s| {
            // 256 MiB: the device lags the host; a read right after wait must see final data.
            let n = 64 << 20;
            let x = s.up(&Tensor::from_vec(&[n], vec![(r + 1) as f32; n]))?;
            let w = b.all_reduce_(&x, ReduceOp::Sum).map_err(e2s)?;
            let early = w.is_completed();
            w.wait(WAIT).map_err(e2s)?;
            w.wait(WAIT).map_err(|e| format!("second wait: {e}"))?;
            let t = s.down(&x)?;
            if r == 0 {
                say(format!(
                    "OBSERVE 256MiB all_reduce_ completed right after issue: {early}"
                ));
            }
            let want = (1..=s.ws).sum::<usize>() as f32;
            let bad = t.as_slice::<f32>().iter().position(|v| *v != want);
            match bad {
                None => Ok(()),
                Some(i) => Err(format!("index {i}: {} != {want}", t.as_slice::<f32>()[i])),
            }
        });
        self.check("async/out-of-order-waits", |s| {
            let xs: Vec<NcclBuffer> = (0..8)
                .map(|i| s.up(&Tensor::from_vec(&[4], vec![(i + r) as i32; 4])))
                .collect::<Result<_, _>>()?;
            let ws: Vec<_> = xs
                .iter()
                .map(|x| b.all_reduce(x, ReduceOp::Sum))
                .collect::<Result<_, _>>()
                .map_err(e2s)?;
            if b.outstanding() < 8 {
                return Err(format!("outstanding {} < 8 before waits", b.outstanding()));
            }
            for (i, w) in ws.iter().enumerate().rev() {
                let y = w.wait(WAIT).map_err(e2s)?;
                let want = (0..s.ws).map(|q| (i + q) as i32).sum::<i32>();
                same(&s.down(y)?, &Tensor::from_vec(&[4], vec![want; 4]))?;
            }
            if b.outstanding() != 0 {
                return Err(format!("outstanding {} after waits", b.outstanding()));
            }
            Ok(())
        });
        self.check("async/wait-from-another-thread", |s| {
            let x = s.up(&Tensor::from_vec(&[4], vec![1.0f64; 4]))?;
            let w = b.all_reduce(&x, ReduceOp::Sum).map_err(e2s)?;
            let y = std::thread::scope(|sc| sc.spawn(|| w.into_value(WAIT)).join())
                .map_err(|_| "waiter panicked")?
                .map_err(e2s)?;
            same(&s.down(&y)?, &Tensor::from_vec(&[4], vec![s.ws as f64; 4]))
        });
    }

    fn barrier(&self) {
        if let Ok(w) = self.b.barrier() {
            let _ = w.wait(WAIT);
        }
    }

    /// Mean seconds per op of `iters` issue+wait round trips of `f`.
    fn time_roundtrip(
        &self,
        iters: usize,
        f: &dyn Fn() -> Result<(), CollectiveError>,
    ) -> Result<f64, CollectiveError> {
        for _ in 0..20 {
            f()?;
        }
        self.barrier();
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    }

    fn latency_1k(&self, tag: &str) {
        let b = &self.b;
        let x = match b.upload(&Tensor::from_vec(&[256], vec![1.0f32; 256])) {
            Ok(x) => x,
            Err(e) => return say(format!("CHECK timing/{tag} FAIL {e}")),
        };
        for validate in [true, false] {
            self.barrier();
            b.set_validation(validate);
            let rt = self.time_roundtrip(500, &|| {
                b.all_reduce_(&x, ReduceOp::Sum)?.wait(WAIT).map(|_| ())
            });
            // nccl-tests style: issue many, wait once.
            let piped = (|| -> Result<f64, CollectiveError> {
                self.barrier();
                let t = Instant::now();
                let mut last = None;
                for _ in 0..500 {
                    let w = b.all_reduce_(&x, ReduceOp::Sum)?;
                    if let Some(prev) = last.replace(w) {
                        drop(prev.into_value(WAIT)?);
                    }
                }
                if let Some(w) = last {
                    w.wait(WAIT)?;
                }
                Ok(t.elapsed().as_secs_f64() / 500.0)
            })();
            match (rt, piped) {
                (Ok(rt), Ok(p)) => {
                    if self.rank == 0 {
                        say(format!(
                            "TIME {tag} all_reduce_ 1KiB f32 validate={validate}: issue+wait {:.1} us/op, back-to-back {:.1} us/op",
                            rt * 1e6,
                            p * 1e6
                        ));
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    say(format!("CHECK timing/{tag}/validate={validate} FAIL {e}"))
                }
            }
        }
        b.set_validation(true);
        self.barrier();
    }

    fn timings(&self) {
        let b = &self.b;
        let ws = self.ws as f64;
        self.latency_1k(if self.blocking {
            "blocking-comm"
        } else {
            "nonblocking-comm"
        });
        // 1 GiB, nccl-tests style: mean over 10 ops after 3 warm-ups; busbw factors as nccl-tests.
        const GIB: usize = 1 << 30;
        let n = GIB / 4;
        let x = match b.upload(&Tensor::from_vec(&[n], vec![1.0f32; n])) {
            Ok(x) => x,
            Err(e) => return say(format!("CHECK timing/1GiB FAIL {e}")),
        };
        let half = match b.view(&x, 0, &[n / self.ws]) {
            Ok(v) => v,
            Err(e) => return say(format!("CHECK timing/1GiB FAIL {e}")),
        };
        for validate in [false, true] {
            self.barrier();
            b.set_validation(validate);
            type OpFn<'a> = Box<dyn Fn() -> Result<(), CollectiveError> + 'a>;
            let ops: Vec<(&str, f64, f64, OpFn)> = vec![
                (
                    "all_reduce_ (in place)",
                    GIB as f64,
                    2.0 * (ws - 1.0) / ws,
                    Box::new(|| b.all_reduce_(&x, ReduceOp::Sum)?.wait(WAIT).map(|_| ())),
                ),
                (
                    "all_reduce (out of place)",
                    GIB as f64,
                    2.0 * (ws - 1.0) / ws,
                    Box::new(|| b.all_reduce(&x, ReduceOp::Sum)?.wait(WAIT).map(|_| ())),
                ),
                (
                    "all_gather_into_tensor",
                    GIB as f64,
                    (ws - 1.0) / ws,
                    Box::new(|| b.all_gather_into_tensor(&half)?.wait(WAIT).map(|_| ())),
                ),
                (
                    "reduce_scatter_tensor",
                    GIB as f64,
                    (ws - 1.0) / ws,
                    Box::new(|| {
                        b.reduce_scatter_tensor(&x, ReduceOp::Sum)?
                            .wait(WAIT)
                            .map(|_| ())
                    }),
                ),
                (
                    "all_to_all_single",
                    GIB as f64,
                    (ws - 1.0) / ws,
                    Box::new(|| b.all_to_all_single(&x, None, None)?.wait(WAIT).map(|_| ())),
                ),
                (
                    "broadcast_",
                    GIB as f64,
                    1.0,
                    Box::new(|| b.broadcast_(&x, 0)?.wait(WAIT).map(|_| ())),
                ),
            ];
            type PipedFn<'a> = Box<dyn Fn(usize) -> Result<(), CollectiveError> + 'a>;
            fn many<T>(
                k: usize,
                issue: &dyn Fn() -> Result<concord_core::Work<T>, CollectiveError>,
            ) -> Result<(), CollectiveError> {
                let works: Vec<_> = (0..k).map(|_| issue()).collect::<Result<_, _>>()?;
                for w in &works {
                    w.wait(WAIT)?;
                }
                Ok(())
            }
            let piped_ops: Vec<(&str, PipedFn)> = vec![
                (
                    "all_reduce_ (in place)",
                    Box::new(|k| many(k, &|| b.all_reduce_(&x, ReduceOp::Sum))),
                ),
                (
                    "all_reduce (out of place)",
                    Box::new(|k| many(k, &|| b.all_reduce(&x, ReduceOp::Sum))),
                ),
                (
                    "all_gather_into_tensor",
                    Box::new(|k| many(k, &|| b.all_gather_into_tensor(&half))),
                ),
                (
                    "reduce_scatter_tensor",
                    Box::new(|k| many(k, &|| b.reduce_scatter_tensor(&x, ReduceOp::Sum))),
                ),
                (
                    "all_to_all_single",
                    Box::new(|k| many(k, &|| b.all_to_all_single(&x, None, None))),
                ),
                ("broadcast_", Box::new(|k| many(k, &|| b.broadcast_(&x, 0)))),
            ];
            for (name, bytes, factor, f) in &ops {
                if validate && !name.starts_with("all_reduce_") {
                    continue;
                }
                let r = (|| -> Result<f64, CollectiveError> {
                    for _ in 0..3 {
                        f()?;
                    }
                    self.barrier();
                    let t = Instant::now();
                    for _ in 0..10 {
                        f()?;
                    }
                    Ok(t.elapsed().as_secs_f64() / 10.0)
                })();
                match r {
                    Ok(t) if self.rank == 0 => say(format!(
                        "TIME 1GiB {name} validate={validate} issue+wait: {:.3} ms/op, algbw {:.1} GB/s, busbw {:.1} GB/s",
                        t * 1e3,
                        bytes / t / 1e9,
                        bytes / t / 1e9 * factor
                    )),
                    Ok(_) => {}
                    Err(e) => say(format!("CHECK timing/1GiB/{name} FAIL {e}")),
                }
                if validate {
                    continue;
                }
                // nccl-tests style: issue 10, then wait for all (the stream orders them).
                if let Some((_, g)) = piped_ops.iter().find(|(n, _)| n == name) {
                    let r = (|| -> Result<f64, CollectiveError> {
                        self.barrier();
                        let t = Instant::now();
                        g(10)?;
                        Ok(t.elapsed().as_secs_f64() / 10.0)
                    })();
                    match r {
                        Ok(t) if self.rank == 0 => say(format!(
                            "TIME 1GiB {name} validate=false back-to-back: {:.3} ms/op, algbw {:.1} GB/s, busbw {:.1} GB/s",
                            t * 1e3,
                            bytes / t / 1e9,
                            bytes / t / 1e9 * factor
                        )),
                        Ok(_) => {}
                        Err(e) => say(format!("CHECK timing/1GiB-piped/{name} FAIL {e}")),
                    }
                }
            }
        }
        b.set_validation(true);
        self.barrier();
    }

    /// Rank 1 exits mid-run; rank 0's next collective must end in a named error within the
    /// deadline (op timeout 3 s here), then the communicator reports itself aborted.
    fn dead_peer(&self, world: &WorldInfo) {
        let b = &self.b;
        let r = self.rank;
        self.check("warm-up", |s| {
            let x = s.up(&Tensor::from_vec(&[1 << 18], vec![1.0f32; 1 << 18]))?;
            b.all_reduce_(&x, ReduceOp::Sum)
                .map_err(e2s)?
                .wait(WAIT)
                .map(|_| ())
                .map_err(e2s)
        });
        if r == 1 {
            say("CHECK peer-exits PASS".into());
            std::process::exit(0); // no teardown: a crashed peer
        }
        std::thread::sleep(Duration::from_millis(300));
        let limit = world.op_timeout + Duration::from_secs(5);
        self.check("survivor-gets-named-error-in-time", |s| {
            let x = s.up(&Tensor::from_vec(&[1 << 18], vec![1.0f32; 1 << 18]))?;
            let t = Instant::now();
            let err = match b.all_reduce_(&x, ReduceOp::Sum) {
                Err(e) => e,
                Ok(w) => match w.wait(Duration::from_secs(60)) {
                    Ok(_) => return Err("the collective completed without its peer".into()),
                    Err(e) => e,
                },
            };
            let el = t.elapsed();
            say(format!(
                "INFO survivor error after {:.2} s: {err}",
                el.as_secs_f64()
            ));
            if !["timeout", "aborted", "peer_died"].contains(&err.name().as_str()) {
                return Err(format!("unexpected error kind {}: {err}", err.name()));
            }
            if el > limit {
                return Err(format!("took {el:?}, limit {limit:?}"));
            }
            Ok(())
        });
        self.check("later-ops-fail-fast-after-abort", |s| {
            let x = s
                .up(&Tensor::from_vec(&[4], vec![1.0f32; 4]))
                .map_err(|e| format!("upload after abort: {e}"))?;
            let t = Instant::now();
            let err = match b.all_reduce_(&x, ReduceOp::Sum) {
                Err(e) => e,
                Ok(w) => match w.wait(Duration::from_secs(10)) {
                    Ok(_) => return Err("completed on an aborted communicator".into()),
                    Err(e) => e,
                },
            };
            if t.elapsed() > Duration::from_secs(1) {
                return Err(format!("took {:?}: {err}", t.elapsed()));
            }
            if err.name() != "aborted" {
                return Err(format!("expected aborted, got {}: {err}", err.name()));
            }
            Ok(())
        });
    }
}
