//! Bad input named identically on every rank, deadlines, dead peers, async behaviour, subgroups.

mod common;
use common::{info, leftovers, run, world_id, Gate, OpenOnDrop, T};
use concord_core::{Backend, BadInputKind, DType, ReduceOp, Tensor};
use concord_shm::ShmBackend;
use std::time::{Duration, Instant};

type Bad = fn(&ShmBackend) -> concord_core::Result<()>;

fn f32s(b: &ShmBackend, shape: &[usize]) -> concord_shm::ShmBuffer {
    let n: usize = shape.iter().product();
    b.upload(&Tensor::from_vec(shape, (0..n).map(|i| i as f32).collect())).unwrap()
}

fn wait<T>(w: concord_core::Result<concord_core::Work<T>>) -> concord_core::Result<()> {
    w?.wait(T).map(|_| ())
}

/// Each case: what rank r does, and the kind every rank must report.
fn cases() -> Vec<(&'static str, Bad, BadInputKind)> {
    use BadInputKind::*;
    vec![
        ("shape differs", |b| wait(b.all_reduce(&f32s(b, &[2 + b.rank()]), ReduceOp::Sum)), ShapeMismatch),
        (
            "dtype differs",
            |b| {
                let x = if b.rank() == 0 { f32s(b, &[4]) } else { b.upload(&Tensor::zeros(DType::F64, &[4])).unwrap() };
                wait(b.all_reduce(&x, ReduceOp::Sum))
            },
            DTypeMismatch,
        ),
        (
            "reduce op differs",
            |b| wait(b.all_reduce(&f32s(b, &[4]), if b.rank() == 0 { ReduceOp::Sum } else { ReduceOp::Max })),
            ReduceOpMismatch,
        ),
        (
            "op differs",
            |b| if b.rank() == 0 { wait(b.all_reduce(&f32s(b, &[4]), ReduceOp::Sum)) } else { wait(b.broadcast(&f32s(b, &[4]), 0)) },
            OpMismatch,
        ),
        ("indivisible reduce_scatter", |b| wait(b.reduce_scatter_tensor(&f32s(b, &[5]), ReduceOp::Sum)), Indivisible),
        ("0-dim reduce_scatter", |b| wait(b.reduce_scatter_tensor(&f32s(b, &[]), ReduceOp::Sum)), ZeroDim),
        ("splits do not sum to dim 0", |b| wait(b.all_to_all_single(&f32s(b, &[4]), Some(&[2, 2]), Some(&[1, 2]))), BadSplits),
        ("splits of wrong length", |b| wait(b.all_to_all_single(&f32s(b, &[4]), Some(&[2, 2]), Some(&[4]))), BadSplits),
        ("split mismatch with peer", |b| wait(b.all_to_all_single(&f32s(b, &[4]), Some(&[1, 3]), Some(&[2, 2]))), SplitMismatch),
        ("root out of range", |b| wait(b.broadcast(&f32s(b, &[4]), 9)), BadRoot),
        ("root differs", |b| wait(b.reduce(&f32s(b, &[4]), ReduceOp::Sum, b.rank())), BadRoot),
        ("not a permutation", |b| wait(b.permute_tensor(&f32s(b, &[4]), &[0, 0])), BadPermutation),
        ("permutation differs", |b| wait(b.permute_tensor(&f32s(b, &[4]), if b.rank() == 0 { &[0, 1] } else { &[1, 0] })), BadPermutation),
        (
            "out buffer too small",
            |b| {
                let o = b.alloc(DType::F32, &[7]).unwrap();
                wait(b.all_gather_into_tensor_out(&f32s(b, &[4]), &o))
            },
            OutBufferSize,
        ),
        (
            "out buffer of other dtype",
            |b| {
                let o = b.alloc(DType::I32, &[2]).unwrap();
                wait(b.reduce_scatter_tensor_out(&f32s(b, &[4]), ReduceOp::Sum, &o))
            },
            DTypeMismatch,
        ),
        (
            "out aliases input",
            |b| {
                let big = f32s(b, &[4]);
                let x = b.view(&big, 0, &[2]).unwrap();
                wait(b.all_gather_into_tensor_out(&x, &big.clone()))
            },
            Aliasing,
        ),
        ("bitwise on floats", |b| wait(b.all_reduce(&f32s(b, &[4]), ReduceOp::BAnd)), UnsupportedDType),
        (
            "premul_sum on ints",
            |b| wait(b.all_reduce(&b.upload(&Tensor::zeros(DType::I32, &[4])).unwrap(), ReduceOp::PremulSum(2.0))),
            UnsupportedDType,
        ),
        (
            "coalesced count differs",
            |b| {
                let xs: Vec<_> = (0..=b.rank()).map(|_| f32s(b, &[2])).collect();
                wait(b.all_reduce_coalesced(&xs, ReduceOp::Sum))
            },
            CountMismatch,
        ),
        (
            "recv buffer too small",
            |b| {
                if b.rank() == 0 {
                    wait(b.send(&f32s(b, &[4]), 1))
                } else {
                    wait(b.recv(&b.alloc(DType::F32, &[3]).unwrap(), 0))
                }
            },
            OutBufferSize,
        ),
        ("send to self", |b| wait(b.send(&f32s(b, &[4]), b.rank())), BadPeer),
        ("bad group", |b| b.new_group(&[0, 0]).map(|_| ()), BadGroup),
    ]
}

#[test]
fn bad_input_is_named_identically_on_every_rank_and_the_world_stays_usable() {
    run(2, T, |b| {
        for (what, f, kind) in cases() {
            let t0 = Instant::now();
            let err = f(&b).expect_err(what);
            assert_eq!(err.bad_input_kind(), Some(kind), "{what} on rank {}: {err}", b.rank());
            assert!(t0.elapsed() < Duration::from_secs(2), "{what} took {:?}", t0.elapsed());
            let x = b.all_reduce(&f32s(&b, &[3]), ReduceOp::Sum).unwrap().into_value(T).unwrap();
            assert_eq!(b.download(&x).unwrap(), Tensor::from_vec(&[3], vec![0.0f32, 2.0, 4.0]), "usable after {what}");
        }
        assert_eq!(b.outstanding(), 0);
    });
}

#[test]
fn a_bad_option_value_is_a_named_init_error_before_any_segment_or_store() {
    for (key, value, says) in [
        ("shm_canary", "maybe", "shm_canary=maybe"),
        ("shm_arena_gib", "nan", "shm_arena_gib=nan"),
        ("shm_arena_gib", "-1", "shm_arena_gib=-1"),
        ("shm_arena_gib", "inf", "shm_arena_gib=inf"),
        ("shm_arena_gib", "lots", "shm_arena_gib=lots"),
        ("fused_pipeline", "sometimes", "fused_pipeline=sometimes"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let wid = world_id();
        let mut w = info(0, 2, dir.path(), &wid, T);
        w.options = vec![(key.into(), value.into())];
        let t0 = Instant::now();
        let err = ShmBackend::init(&w).err().unwrap_or_else(|| panic!("{key}={value} accepted"));
        assert_eq!(err.name(), "backend", "{key}={value}: {err}");
        assert!(err.to_string().contains(says), "{key}={value}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(1), "{key}={value}: refused only after {:?} (a rendezvous?)", t0.elapsed());
        assert!(leftovers(&wid).is_empty() && !dir.path().join("store").exists(), "{key}={value} left files");
    }
}

#[test]
fn a_peer_that_never_joins_init_times_out_by_name_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let t0 = Instant::now();
    let err = ShmBackend::init(&info(0, 2, dir.path(), &wid, Duration::from_millis(300))).err().expect("init must fail");
    assert_eq!(err.name(), "timeout", "{err}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
}

#[test]
fn a_peer_that_never_issues_gives_a_timeout_then_the_communicator_is_poisoned() {
    let gate = Gate::default();
    let res = run(2, Duration::from_millis(300), |b| {
        if b.rank() == 0 {
            let _open = OpenOnDrop(&gate);
            let t0 = Instant::now();
            let w = b.all_reduce(&f32s(&b, &[4]), ReduceOp::Sum).unwrap();
            let err = w.wait(Duration::from_secs(5)).expect_err("must time out");
            assert_eq!(err.name(), "timeout", "{err}");
            assert!(err.to_string().contains("all_reduce #1"), "{err}");
            assert!(t0.elapsed() < Duration::from_secs(2));
            let again = b.barrier().unwrap().wait(Duration::from_secs(1)).expect_err("poisoned");
            assert_eq!(again.name(), "aborted", "{again}");
        }
        // rank 1 joined the world but issues nothing until rank 0 gave up; then its next
        // collective fails fast because rank 0 poisoned the communicator.
        if b.rank() == 1 {
            gate.wait(T);
        }
        let t0 = Instant::now();
        let failed = b.barrier().map(|w| w.wait(Duration::from_secs(2)).is_err()).unwrap_or(true);
        failed && t0.elapsed() < Duration::from_millis(250)
    });
    assert_eq!(res, vec![true, true]);
}

#[test]
fn collectives_are_asynchronous_and_complete_only_when_every_peer_arrives() {
    let gate = Gate::default();
    run(2, T, |b| {
        let x = f32s(&b, &[1 << 16]);
        if b.rank() == 0 {
            let open = OpenOnDrop(&gate);
            let w = b.all_reduce(&x, ReduceOp::Sum).unwrap();
            assert!(!w.is_completed());
            assert_eq!(b.outstanding(), 1);
            std::thread::sleep(Duration::from_millis(100));
            assert!(!w.is_completed(), "completed before the peer issued");
            assert_eq!(w.wait(Duration::from_millis(10)).err().unwrap().name(), "timeout");
            drop(open);
            let out = w.into_value(T).unwrap();
            assert_eq!(b.download(&out).unwrap().get_f64(5), 10.0);
            // many outstanding, waited out of order and from another thread
            let ws: Vec<_> = (0..5).map(|_| b.all_reduce(&x, ReduceOp::Max).unwrap()).collect();
            std::thread::scope(|s| {
                for w in ws.into_iter().rev() {
                    s.spawn(move || w.wait(T).map(|_| ()).unwrap());
                }
            });
        } else {
            gate.wait(T);
            b.all_reduce(&x, ReduceOp::Sum).unwrap().wait(T).unwrap();
            for _ in 0..5 {
                b.all_reduce(&x, ReduceOp::Max).unwrap().wait(T).unwrap();
            }
        }
        assert_eq!(b.outstanding(), 0);
    });
}

#[test]
fn dropping_a_backend_with_unwaited_work_is_quick() {
    run(2, T, |b| {
        if b.rank() == 0 {
            let w = b.all_reduce(&f32s(&b, &[4]), ReduceOp::Sum).unwrap();
            let t0 = Instant::now();
            drop(b);
            assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
            assert!(w.wait(T).is_err());
        } else {
            let e = b.barrier().unwrap().wait(T).err();
            assert!(e.is_some(), "rank 0 left: the barrier cannot succeed");
        }
    });
}

#[test]
fn subgroups_run_collectives_among_their_members_only() {
    run(4, T, |b| {
        let r = b.rank();
        // reversed odd ranks: global 3 is group rank 0, global 1 is group rank 1
        let g = b.new_group(&[3, 1]).unwrap();
        let h = b.new_group(&[0, 1, 2, 3]).unwrap().expect("everyone is a member");
        assert_eq!(h.rank(), r);
        match g {
            None => assert!(r % 2 == 0),
            Some(g) => {
                assert_eq!(g.world_size(), 2);
                assert_eq!(g.rank(), if r == 3 { 0 } else { 1 });
                let x = g.upload(&Tensor::from_vec(&[2], vec![r as i64, 1])).unwrap();
                let y = g.all_gather_into_tensor(&x).unwrap().into_value(T).unwrap();
                assert_eq!(g.download(&y).unwrap(), Tensor::from_vec(&[4], vec![3i64, 1, 1, 1]));
                // a buffer of the parent works in the group, and a nested group
                let p = b.upload(&Tensor::from_vec(&[1], vec![r as i64])).unwrap();
                let s = g.all_reduce(&p, ReduceOp::Sum).unwrap().into_value(T).unwrap();
                assert_eq!(g.download(&s).unwrap(), Tensor::from_vec(&[1], vec![4i64]));
                let single = g.new_group(&[1]).unwrap();
                assert_eq!(single.is_some(), r == 1);
                if let Some(s1) = single {
                    let z = s1.all_reduce(&p, ReduceOp::Avg).unwrap().into_value(T).unwrap();
                    assert_eq!(s1.download(&z).unwrap(), Tensor::from_vec(&[1], vec![1i64]));
                }
            }
        }
        // the world and the full group still work, interleaved
        let x = b.upload(&Tensor::from_vec(&[1], vec![1u8])).unwrap();
        let w1 = b.all_reduce(&x, ReduceOp::Sum).unwrap();
        let w2 = h.all_reduce(&x, ReduceOp::Sum).unwrap();
        assert_eq!(b.download(&w2.into_value(T).unwrap()).unwrap().get_f64(0), 4.0);
        assert_eq!(b.download(&w1.into_value(T).unwrap()).unwrap().get_f64(0), 4.0);
    });
}

#[test]
fn sixty_four_ranks_reduce_correctly() {
    run(64, Duration::from_secs(30), |b| {
        let x = b.upload(&Tensor::from_vec(&[3], vec![b.rank() as u32, 1, 2])).unwrap();
        let y = b.all_reduce(&x, ReduceOp::Sum).unwrap().into_value(Duration::from_secs(30)).unwrap();
        assert_eq!(b.download(&y).unwrap(), Tensor::from_vec(&[3], vec![2016u32, 64, 128]));
    });
}

#[test]
fn a_rank_that_cannot_post_fails_the_op_everywhere_and_stays_in_step() {
    // A local failure (clause `faults.local_failure_named_everywhere`): rank 0 cannot allocate
    // its post. Every rank's op fails with a named error (rank 1's names rank 0, claims no
    // timeout or dead peer, and comes at once), and the world stays usable: the next op pairs
    // with the next op (no silent pairing of rank 0's next op with rank 1's first one).
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let gates = [Gate::default(), Gate::default()];
    let res: Vec<(String, Duration, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (dir, wid, gates) = (dir.path(), wid.as_str(), &gates);
                s.spawn(move || {
                    // Each rank opens its own gate at the meeting point, or when it panics.
                    let mine = OpenOnDrop(&gates[r]);
                    let mut w = info(r, 2, dir, wid, T);
                    w.options = vec![("shm_arena_gib".into(), "0".into())]; // the 1 MiB minimum
                    let b = ShmBackend::init(&w).unwrap();
                    // Rank 0 fills its arena, so the barrier's post cannot be allocated. No
                    // assertion before the gate: a panic there would leave the other rank waiting.
                    let fill = (r == 0).then(|| b.alloc(DType::U8, &[(1 << 20) - 8]).ok()).flatten();
                    let t0 = Instant::now();
                    let first = wait(b.barrier()).err().map_or("ok".into(), |e| e.to_string());
                    let took = t0.elapsed();
                    drop(fill);
                    drop(mine);
                    gates[1 - r].wait(T);
                    // Room again on rank 0: the next op runs on both ranks, paired with each other.
                    let x = b.upload(&Tensor::from_vec(&[2], vec![r as f32 + 1.0, 10.0])).unwrap();
                    let second = match b.all_reduce(&x, ReduceOp::Sum).and_then(|w| w.into_value(T)) {
                        Ok(y) => format!("{:?}", b.download(&y).unwrap().as_slice::<f32>()),
                        Err(e) => format!("{e} [{}]", e.name()),
                    };
                    (first, took, second)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(res[0].0.contains("arena of rank 0 is full"), "{}", res[0].0);
    let peer = &res[1].0;
    assert!(
        peer.contains("rank 0's side of the op failed locally") && !peer.contains("timeout") && !peer.contains("poisoned"),
        "rank 1: {peer}"
    );
    assert!(res[1].1 < Duration::from_secs(2), "rank 1's op failed only after {:?}: {peer}", res[1].1);
    assert_eq!((res[0].2.as_str(), res[1].2.as_str()), ("[3.0, 20.0]", "[3.0, 20.0]"), "the all_reduce after the failed op");
    assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
}

#[test]
fn a_local_failure_at_any_point_fails_the_op_everywhere_and_the_world_stays_usable() {
    // Clause `faults.local_failure_named_everywhere`: rank 1's op #1 fails locally at each point
    // of the collective path; every rank's op #1 ends in a named error at once (the peers' names
    // rank 1 and claims no timeout), and op #2 works on every rank with the right values.
    for point in ["after_post", "between_barriers", "progress_thread"] {
        for n in [2usize, 3] {
            let dir = tempfile::tempdir().unwrap();
            let wid = world_id();
            let res: Vec<(String, Duration, Vec<f32>)> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let (dir, wid) = (dir.path(), wid.as_str());
                        s.spawn(move || {
                            let mut w = info(r, n, dir, wid, T);
                            w.options.push(("fault".into(), format!("{point}:fail@1#1")));
                            let b = ShmBackend::init(&w).unwrap();
                            let x = b.upload(&Tensor::from_vec(&[64], vec![r as f32 + 1.0; 64])).unwrap();
                            b.all_reduce(&x, ReduceOp::Sum).unwrap().wait(T).unwrap();
                            let t0 = Instant::now();
                            let first = wait(b.all_reduce_(&x, ReduceOp::Sum)).err().map_or("ok".into(), |e| format!("{e} [{}]", e.name()));
                            let took = t0.elapsed();
                            let z = b.upload(&Tensor::from_vec(&[64], vec![r as f32 + 1.0; 64])).unwrap();
                            let y = b
                                .all_reduce(&z, ReduceOp::Sum)
                                .unwrap()
                                .into_value(T)
                                .unwrap_or_else(|e| panic!("{point} ws{n} rank {r}: op #2: {e}"));
                            (first, took, b.download(&y).unwrap().as_slice::<f32>().to_vec())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, (first, took, second)) in res.iter().enumerate() {
                let at = format!("{point} ws{n} rank {r}");
                if r == 1 {
                    assert!(first.contains("injected fault") && first.contains(point), "{at}: {first}");
                } else {
                    assert!(first.contains("rank 1's side of the op failed locally") && first.contains("[aborted]"), "{at}: {first}");
                    assert!(!first.contains("timeout") && !first.contains("poisoned"), "{at}: {first}");
                }
                assert!(*took < Duration::from_secs(2), "{at}: op #1 failed only after {took:?}: {first}");
                let want = (n * (n + 1) / 2) as f32;
                assert!(second.len() == 64 && second.iter().all(|&v| v == want), "{at}: op #2 gave {second:?}, expected {want} everywhere");
            }
            assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
        }
    }
}

#[test]
fn a_pipelined_fused_op_that_fails_leaves_no_send_reading_its_input() {
    // review15 finding 6 (clause `failure.no_touch_after_failed_wait`): the pipelined
    // fused_all_gather_matmul sends the caller's `a` itself. Three ranks, op deadline 1 s; op #0
    // is the fused op's exchange, #1 and #2 its receives. Rank 0's first receive (from rank 1)
    // fails locally, so rank 0's op returns its error while its sends of `a` are still posted;
    // rank 0 then writes a canary into `a`. Rank 2's receive from rank 0 stalls 400 ms before it
    // copies. Rank 2 MUST NOT get the canary: either its op fails, or its gathered `a` holds rank
    // 0's values as they were while rank 0's op ran.
    const CANARY: f32 = -7777.25;
    let n = 3;
    let dir = tempfile::tempdir().unwrap();
    let wid = world_id();
    let res: Vec<(String, Option<Vec<f32>>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (dir, wid) = (dir.path(), wid.as_str());
                s.spawn(move || {
                    let mut w = info(r, n, dir, wid, Duration::from_secs(1));
                    w.options.push(("fused_pipeline".into(), "always".into()));
                    w.options.push(("fault".into(), "progress_thread:fail@0#1;progress_thread:stall@2#1~400".into()));
                    let b = ShmBackend::init(&w).unwrap();
                    let a = b.upload(&Tensor::from_vec(&[2, 4], vec![r as f32 + 1.0; 8])).unwrap();
                    let m = b.upload(&Tensor::from_vec(&[4, 3], vec![1.0f32; 12])).unwrap();
                    let got = b.fused_all_gather_matmul(&a, std::slice::from_ref(&m), 0).and_then(|w| w.into_value(T));
                    match got {
                        Ok((ag, _)) => ("ok".into(), Some(b.download(&ag).unwrap().as_slice::<f32>().to_vec())),
                        Err(e) => {
                            // The op failed: `a` is the caller's again.
                            b.write(&a, &Tensor::from_vec(&[2, 4], vec![CANARY; 8])).unwrap();
                            // Let the peers end their ops before this rank's backend goes.
                            std::thread::sleep(Duration::from_millis(700));
                            (format!("{e} [{}]", e.name()), None)
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(res[0].1.is_none() && res[0].0.contains("injected fault"), "rank 0 (its receive fails): {}", res[0].0);
    if let Some(ag) = &res[2].1 {
        let want: Vec<f32> = (0..n).flat_map(|r| vec![r as f32 + 1.0; 8]).collect();
        assert_eq!(
            ag, &want,
            "rank 2's fused op returned Ok with a gathered `a` (got) that is not every rank's input (expected): rank 0's shard read \
             after rank 0's op had returned its failure ({}) and rank 0 had written {CANARY} into it",
            res[0].0
        );
    }
    assert!(leftovers(&wid).is_empty(), "{:?}", leftovers(&wid));
}
