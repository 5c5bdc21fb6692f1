//! The benchmark under an external launcher (torchrun, mpirun, srun): this process is one rank.
//! Every rank runs [`crate::rank::rank_main`] with its message lines relayed through the TCP
//! store (`bench/lines/<rank>/<n>`, then `bench/lines/<rank>/end` = its exit code) instead of
//! stdout; rank 0 also runs the parent's table ([`crate::run::run_parent_with`]) over those
//! lines. The whole run is one [`concord_harness::external::Rank::step`], so a rank that dies
//! or hangs is named on rank 0 and every rank exits non-zero.

use crate::rank::{rank_main, RELAY};
use crate::run::{run_parent_with, Ranks};
use crate::{Args, Hooks};
use concord_core::{Backend, WorldInfo, LOCAL_RANK_OPTION};
use concord_harness::config::{Config, Launch};
use concord_harness::external::Rank;
use concord_harness::outcome::Outcome;
use concord_store::{Store, StoreAddr, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub(crate) fn main<B: Backend>(name: &str, hooks: &Hooks<B>, args: &Args, argv: Vec<String>, launch: &Launch) -> i32 {
    let cfg = Config::global();
    let rank = match Rank::join(launch, cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("concord-bench: {e}");
            return 1;
        }
    };
    let (me, ws) = (rank.rank(), rank.world_size());
    let mut args = args.clone();
    args.ranks = ws;
    let lines = rank.base_addr().with_prefix("bench/lines");
    let relay = match Store::open_addr(&lines, ws, cfg.setup_timeout) {
        Ok(s) => Arc::new(s),
        Err(e) => rank.fail(&format!("the relay store: {e}")),
    };
    {
        let relay = relay.clone();
        let seq = AtomicU64::new(0);
        let _ = RELAY.set(Box::new(move |line: &str| {
            let i = seq.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = relay.set(&format!("{me}/{i}"), line.as_bytes()) {
                eprintln!("concord-bench rank {me}: cannot relay a message line: {e}");
            }
        }));
    }
    let end = |code: i32| {
        let _ = relay.set(&format!("{me}/end"), code.to_string().as_bytes());
    };
    let mut options = match concord_harness::worker::parse_options(&args.opts) {
        Ok(o) => o,
        Err(e) => rank.fail(&e),
    };
    options.push((LOCAL_RANK_OPTION.to_string(), launch.local_rank.to_string()));
    let world_id: String = format!("b{}-{}", launch.run_id, launch.store_port)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    let world = WorldInfo {
        rank: me,
        world_size: ws,
        store_path: rank.base_addr().with_prefix("bench/world").to_path_buf(),
        world_id: world_id.clone(),
        op_timeout: cfg.op_timeout(),
        options,
    };
    let deadline = Duration::from_secs(args.deadline_s);
    let mut code = 0;
    let mut rank = rank;
    let step = rank.step("the benchmark", deadline, || {
        let c = if me == 0 {
            std::thread::scope(|s| {
                let own = s.spawn(|| {
                    let c = rank_main::<B>(&world, &args, hooks);
                    end(c);
                    c
                });
                let out = run_parent_with::<B>(name, hooks, &args, argv, &mut |a, _| {
                    relay_ranks(&lines, a.ranks, cfg.setup_timeout, cfg.op_timeout())
                });
                let own = own.join().unwrap_or(101);
                out.code.max(own)
            })
        } else {
            let c = rank_main::<B>(&world, &args, hooks);
            end(c);
            c
        };
        code = c;
        if c == 0 {
            Outcome::Passed
        } else {
            Outcome::Failed(format!("rank {me}: the benchmark ended with exit code {c}"))
        }
    });
    if launch.local_rank == 0 {
        concord_harness::platform::sweep_shm(&world_id);
    }
    match step {
        Ok(r) => {
            if me == 0 && r.verdict.is_failed() {
                eprintln!("FAILED:\n{}", r.message);
            }
            let common = i32::from(r.verdict.is_failed());
            rank.finish(if me == 0 { code.max(common) } else { common })
        }
        Err(e) => rank.fail(&e),
    }
}

/// Rank 0's view of every rank's relayed lines, as [`Ranks`].
fn relay_ranks(addr: &StoreAddr, n: usize, setup: Duration, op_timeout: Duration) -> Result<Ranks, String> {
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let stop = Arc::new(AtomicBool::new(false));
    for r in 0..n {
        let s = Store::open_addr(addr, n, setup).map_err(|e| e.to_string())?;
        let tx = tx.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let end = format!("{r}/end");
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("{r}/{i}");
                match s.wait(&[&key], Duration::from_millis(250)) {
                    Ok(()) => match s.get(&key) {
                        Ok(v) => {
                            if tx.send((r, Some(String::from_utf8_lossy(&v).into_owned()))).is_err() {
                                return;
                            }
                            i += 1;
                        }
                        Err(_) => break,
                    },
                    // The rank ended (and every line before its end was read): EOF.
                    Err(StoreError::Timeout { .. }) => {
                        if s.check(&[&end]).unwrap_or(true) && !s.check(&[&key]).unwrap_or(false) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send((r, None));
        });
    }
    drop(tx);
    let a = addr.clone();
    let finish = Box::new(move |within: Duration, phase: &[String]| {
        let ends: Vec<String> = (0..n).map(|r| format!("{r}/end")).collect();
        let refs: Vec<&str> = ends.iter().map(String::as_str).collect();
        let s = match Store::open_addr(&a, n, setup) {
            Ok(s) => s,
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                return (Vec::new(), Err(e.to_string()));
            }
        };
        let _ = s.wait(&refs, within);
        stop.store(true, Ordering::SeqCst);
        let mut hangs = Vec::new();
        let mut bad = Vec::new();
        for r in 0..n {
            if !s.check(&[&ends[r]]).unwrap_or(false) {
                hangs.push(format!(
                    "HANG: rank {r} was still in {} at the deadline (its launcher started it: see rank 0's verdict)",
                    phase[r]
                ));
            } else if let Ok(v) = s.get(&ends[r]) {
                if v != b"0" {
                    bad.push(format!("rank {r} exited with code {}", String::from_utf8_lossy(&v)));
                }
            }
        }
        (hangs, if bad.is_empty() { Ok(()) } else { Err(bad.join("; ")) })
    });
    Ok(Ranks { rx, op_timeout, finish })
}
