//! The tuner on real shm worlds (ranks as threads of this process, one store file).

use concord_autotune::{
    cache, Autotuner, Choice, ChoiceCtx, Config, Env, OpInstance, Outcome, Phase, Policy, Request, RowStatus, TuneError, Tuner,
};
use concord_core::{Backend, DType, ReduceOp, WorldInfo};
use concord_shm::ShmBackend;
use concord_store::Store;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static WORLDS: AtomicUsize = AtomicUsize::new(0);

/// Runs `f(rank, backend, store)` on `n` rank threads; results by rank.
fn world<R: Send>(n: usize, f: impl Fn(usize, &ShmBackend, &Store) -> R + Sync) -> Vec<R> {
    let dir = tempfile::tempdir().unwrap();
    let wid = format!("at{}-{}", std::process::id(), WORLDS.fetch_add(1, Ordering::SeqCst));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, dir, wid) = (&f, dir.path(), wid.as_str());
                s.spawn(move || {
                    let info = WorldInfo {
                        rank: r,
                        world_size: n,
                        store_path: dir.join("store"),
                        world_id: wid.to_string(),
                        op_timeout: Duration::from_secs(10),
                        options: vec![("shm_arena_gib".into(), "0.25".into())],
                    };
                    let store = Store::open(&info.store_path, n, Duration::from_secs(20)).unwrap();
                    let b = ShmBackend::init(&info).unwrap_or_else(|e| panic!("rank {r} init: {e}"));
                    f(r, &b, &store)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

fn tuner(timeout_ms: u64) -> Tuner {
    <Tuner as Autotuner<ShmBackend>>::new(Config { timeout: Duration::from_millis(timeout_ms), runs: 3, ..Config::default() })
}

fn tune(t: &Tuner, b: &ShmBackend, store: &Store, tag: &str, reqs: &[Request<ShmBackend>]) -> Result<Outcome, TuneError> {
    t.tune(&Env::new(b, Some(store), tag, Duration::from_secs(10)), reqs)
}

fn native(c: &ChoiceCtx<'_, ShmBackend>, x: &<ShmBackend as Backend>::Buffer) -> concord_core::Result<<ShmBackend as Backend>::Buffer> {
    c.wait(c.b.all_reduce(x, ReduceOp::Sum)?)
}

fn ar(n: usize) -> OpInstance {
    OpInstance::all_reduce(DType::F32, &[n], ReduceOp::Sum)
}

#[test]
fn builtin_sets_agree_on_every_rank_with_one_presync() {
    for ws in [3, 4] {
        let d0 = 8 * ws;
        let out = world(ws, |_, b, s| {
            let reqs = vec![
                Request::builtin(OpInstance::all_reduce(DType::F32, &[d0, 4], ReduceOp::Sum)),
                Request::builtin(OpInstance::all_gather(DType::I32, &[d0])),
                Request::builtin(OpInstance::reduce_scatter(DType::F32, &[d0, 2], ReduceOp::Max)),
                Request::builtin(OpInstance::all_to_all(DType::F64, &[d0])),
            ];
            tune(&tuner(20_000), b, s, "t", &reqs).unwrap()
        });
        for o in &out {
            assert_eq!(o.presyncs, 1);
            for t in &o.tables {
                assert!(t.rows.iter().all(|r| matches!(r.status, RowStatus::Ok | RowStatus::Skipped(_))), "{t}");
            }
            let w: Vec<&str> = o.tables.iter().map(|t| t.winner.as_str()).collect();
            let w0: Vec<&str> = out[0].tables.iter().map(|t| t.winner.as_str()).collect();
            assert_eq!(w, w0);
        }
        // Power-of-two only: recursive doubling is skipped by name at 3 ranks.
        let rd = out[0].tables[0].row("recursive_doubling").unwrap();
        assert_eq!(matches!(rd.status, RowStatus::Skipped(_)), ws == 3, "{}", out[0]);
    }
}

#[test]
fn different_candidate_lists_are_a_named_error_on_every_rank() {
    let out = world(2, |r, b, s| {
        let mut c = vec![Choice::new("native", native)];
        if r == 0 {
            c.push(Choice::new("extra", native));
        }
        tune(&tuner(3000), b, s, "m", &[Request::new(ar(64), c, "native")]).unwrap_err()
    });
    for e in out {
        assert_eq!(e.name(), "candidate_mismatch", "{e}");
        assert!(e.to_string().contains("extra") && e.to_string().contains("rank 1"), "{e}");
    }
}

#[test]
fn a_panic_on_one_rank_is_inf_on_all_and_the_next_choice_still_runs() {
    let out = world(2, |_, b, s| {
        let boom = Choice::new("boom", |c: &ChoiceCtx<'_, ShmBackend>, x| {
            let o = native(c, x)?;
            if c.b.rank() == 1 {
                panic!("boom on rank 1");
            }
            Ok(o)
        });
        let reqs = [Request::new(ar(256), vec![boom, Choice::new("native", native)], "native")];
        tune(&tuner(5000), b, s, "p", &reqs).unwrap()
    });
    for o in &out {
        let t = &o.tables[0];
        assert!(matches!(&t.row("boom").unwrap().status, RowStatus::Failed(c) if c[0].0 == 1 && c[0].1.contains("boom on rank 1")), "{t}");
        assert_eq!(t.winner, "native");
        assert!(t.warnings.iter().any(|w| w.contains("`boom`") && w.contains("rank 1")), "{t}");
    }
}

#[test]
fn a_hung_rank_does_not_hold_the_others_past_the_deadline() {
    let timeout = Duration::from_millis(600);
    let out = world(3, |_, b, s| {
        let hang = Choice::new("hang_on_1", |c: &ChoiceCtx<'_, ShmBackend>, x| {
            if c.b.rank() == 1 && c.phase == Phase::Screen {
                std::thread::sleep(Duration::from_secs(2));
            }
            native(c, x)
        });
        let reqs = [Request::new(ar(256), vec![Choice::new("native", native), hang, Choice::new("later", native)], "native")];
        let t0 = Instant::now();
        let t = <Tuner as Autotuner<ShmBackend>>::new(Config { timeout, runs: 2, ..Config::default() });
        let o = tune(&t, b, s, "h", &reqs).unwrap();
        (o, t0.elapsed())
    });
    for (r, (o, el)) in out.iter().enumerate() {
        let t = &o.tables[0];
        assert_eq!(t.winner, "native", "{t}");
        assert!(matches!(t.row("later").unwrap().status, RowStatus::NotRun(_)), "{t}");
        assert!(matches!(&t.row("hang_on_1").unwrap().status, RowStatus::Failed(c) if c.iter().any(|(q, _)| *q == 1)), "{t}");
        if r != 1 {
            assert!(*el < timeout + Duration::from_millis(300), "rank {r} took {el:?}");
        }
    }
}

#[test]
fn policies_reduce_per_rank_times() {
    assert_eq!(Policy::Max.reduce(&[1, 9, 5]), 9);
    assert_eq!(Policy::Avg.reduce(&[1, 9, 5]), 5);
    assert_eq!(Policy::Median.reduce(&[1, 9, 5, 7]), 6);
    assert_eq!(concord_autotune::names_hash(&["a".into(), "bc".into()]), concord_autotune::names_hash(&["a".into(), "bc".into()]));
    assert_ne!(concord_autotune::names_hash(&["ab".into(), "c".into()]), concord_autotune::names_hash(&["a".into(), "bc".into()]));
}

#[test]
fn the_cache_is_reused_by_a_new_tuner_only_when_every_rank_hits() {
    let dir = tempfile::tempdir().unwrap();
    let p = |r: usize| dir.path().join(format!("c{r}.json"));
    let cfg = |r: usize| Config { timeout: Duration::from_secs(10), runs: 2, cache: Some(p(r)), ..Config::default() };
    let first = world(2, |r, b, s| tune(&<Tuner as Autotuner<ShmBackend>>::new(cfg(r)), b, s, "c1", &[Request::builtin(ar(512))]).unwrap());
    let second =
        world(2, |r, b, s| tune(&<Tuner as Autotuner<ShmBackend>>::new(cfg(r)), b, s, "c2", &[Request::builtin(ar(512))]).unwrap());
    for (a, b) in first.iter().zip(&second) {
        assert!(b.tables[0].from_cache && b.tables[0].ran() == 0, "{b}");
        assert_eq!(a.winner(0), b.winner(0));
    }
    // Rank 1 loses its file: nobody uses the hit.
    std::fs::remove_file(p(1)).unwrap();
    let third = world(2, |r, b, s| tune(&<Tuner as Autotuner<ShmBackend>>::new(cfg(r)), b, s, "c3", &[Request::builtin(ar(512))]).unwrap());
    for o in &third {
        assert!(!o.tables[0].from_cache, "{o}");
        assert!(o.warnings.iter().any(|w| w.contains("partial")), "{o}");
    }
    assert!(cache::Cache::load(&p(1)).entries.len() == 1, "re-tuning writes the file again");
}

#[test]
fn outside_a_world_it_benchmarks_locally_with_a_warning() {
    let out = world(1, |_, b, _| {
        <Tuner as Autotuner<ShmBackend>>::new(Config { runs: 2, ..Config::default() })
            .tune(&Env::new(b, None, "local", Duration::from_secs(5)), &[Request::builtin(ar(64))])
            .unwrap()
    });
    assert_eq!(out[0].presyncs, 0);
    assert!(out[0].warnings.iter().any(|w| w.contains("no store")), "{}", out[0]);
}

/// The names of `op`'s built-in choices for `inst` on `ws` ranks that `caps` makes gaps.
fn gapped(caps: &concord_core::Capabilities, inst: &OpInstance, ws: usize) -> Vec<String> {
    concord_autotune::choices::builtin::<ShmBackend>(inst.op)
        .iter()
        .filter(|c| c.declared_gap(caps, inst, ws).is_some())
        .map(|c| c.name.clone())
        .collect()
}

/// (A unit test of `choices.rs` until ci9; the lib has `test = false`, so it never ran.)
#[test]
fn a_choice_is_a_gap_exactly_where_one_of_its_calls_is() {
    use concord_core::caps::Gap;
    use concord_core::{Capabilities, OpKind, Variant};
    let mut caps = Capabilities::full(8);
    let ar = OpInstance::all_reduce(DType::F32, &[16, 8], ReduceOp::Sum);
    let rs = OpInstance::reduce_scatter(DType::F32, &[16, 8], ReduceOp::Sum);
    assert!(gapped(&caps, &ar, 2).is_empty(), "no gap declared");
    caps.gaps.push(Gap {
        op: Some(OpKind::AllReduce),
        variant: Some(Variant::Out),
        dtype: Some(DType::F32),
        reduce: Some("sum".into()),
        reason: "narrow".into(),
    });
    assert_eq!(gapped(&caps, &ar, 2), ["native"]);
    assert_eq!(gapped(&caps, &rs, 2), ["ar_slice"]);
    assert!(gapped(&caps, &OpInstance::all_reduce(DType::F32, &[16, 8], ReduceOp::Max), 2).is_empty(), "max is no gap");
    let why = concord_autotune::choices::builtin::<ShmBackend>(OpKind::AllReduce)[0].declared_gap(&caps, &ar, 2).expect("native is a gap");
    assert!(why.contains("all_reduce") && why.contains("narrow"), "{why}");
    // Point-to-point: every ring choice on 2+ ranks, none on one rank (it sends nothing).
    caps.gaps = vec![Gap::op(OpKind::SendRecv, "no p2p")];
    assert_eq!(gapped(&caps, &ar, 2), ["ring", "recursive_doubling"]);
    assert!(gapped(&caps, &ar, 1).is_empty());
    let ag = OpInstance::all_gather(DType::I32, &[16, 4]);
    assert_eq!(gapped(&caps, &ag, 2), ["ring"]);
    caps.gaps = vec![Gap::op(OpKind::Broadcast, "no broadcast")];
    assert_eq!(gapped(&caps, &ag, 2), ["gather_bcast"]);
}
