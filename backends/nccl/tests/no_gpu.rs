//! What must hold on every machine, GPUs or not: the backend never panics or aborts when CUDA or
//! NCCL is missing, and says why in a named error.

use concord_core::{Backend, WorldInfo};
use concord_nccl::{probe, NcclBackend};
use std::time::{Duration, Instant};

fn world(rank: usize, world_size: usize, store: &std::path::Path) -> WorldInfo {
    WorldInfo {
        rank,
        world_size,
        store_path: store.to_path_buf(),
        world_id: "no-gpu-test".into(),
        op_timeout: Duration::from_secs(2),
        options: vec![],
    }
}

#[test]
fn probe_names_what_is_missing_or_reports_the_gpus() {
    match probe() {
        Err(why) => assert!(why.contains("libcuda") || why.contains("libnccl"), "{why}"),
        Ok(info) => assert!(info.nccl_version.starts_with("2."), "{info:?}"),
    }
}

#[test]
fn init_without_enough_gpus_is_a_named_unsupported_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let gpus = probe().map(|i| i.gpus).unwrap_or(0);
    // One more rank than there are GPUs: must be refused before any rendezvous (no hang).
    let t = Instant::now();
    let err = match NcclBackend::init(&world(0, gpus + 1, &store)) {
        Err(e) => e,
        Ok(_) => panic!("init of a world of {} succeeded with {gpus} GPUs", gpus + 1),
    };
    assert!(t.elapsed() < Duration::from_secs(5), "refusal took {:?}", t.elapsed());
    assert_eq!(err.name(), "unsupported", "{err}");
    let msg = err.to_string();
    match probe() {
        Ok(_) => assert!(msg.contains(&format!("needs {} GPUs, found {gpus}", gpus + 1)), "{msg}"),
        Err(_) => assert!(msg.contains("libcuda") || msg.contains("libnccl"), "{msg}"),
    }
    assert!(!store.exists(), "a refused init must not create the store");
}

#[test]
fn a_rank_outside_its_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = NcclBackend::init(&world(3, 2, &dir.path().join("s"))).err().expect("refused");
    assert_eq!(err.name(), "backend", "{err}");
    assert!(err.to_string().contains("rank 3 is not in a world of 2"), "{err}");
}

/// `init` of a one-rank world with option `key=value`: refused, with a `backend` error.
fn refused_with_option(key: &str, value: &str) -> concord_core::CollectiveError {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(0, 1, &dir.path().join("s"));
    w.options = vec![(key.into(), value.into())];
    let err = NcclBackend::init(&w).err().expect("refused");
    assert_eq!(err.name(), "backend", "{err}");
    err
}

#[test]
fn a_bad_fault_option_is_named_before_any_gpu_is_touched() {
    let err = refused_with_option("fault", "stream:wobble");
    assert!(err.to_string().contains("option `fault`") && err.to_string().contains("stream:wobble"), "{err}");
}

#[test]
fn a_bad_fused_overlap_option_is_named_before_any_gpu_is_touched() {
    let err = refused_with_option("fused_overlap", "sometimes");
    assert!(err.to_string().contains("fused_overlap=sometimes") && err.to_string().contains("serial"), "{err}");
}

#[test]
fn a_bad_one_rank_copy_option_is_named_before_any_gpu_is_touched() {
    let err = refused_with_option("one_rank_copy", "dma");
    assert!(err.to_string().contains("one_rank_copy=dma") && err.to_string().contains("kernel, memcpy or 0"), "{err}");
}

#[test]
fn a_yes_no_option_with_another_value_is_named_before_any_gpu_is_touched() {
    for key in ["validate", "blocking", "fast_launch", "header_board", "alloc_cache", "batch"] {
        let err = refused_with_option(key, "flase");
        assert!(err.to_string().contains(&format!("{key}=flase")) && err.to_string().contains("true/false"), "{err}");
    }
    let err = refused_with_option("init_timeout_ms", "5s");
    assert!(err.to_string().contains("init_timeout_ms=5s") && err.to_string().contains("milliseconds"), "{err}");
    let err = refused_with_option(concord_core::LOCAL_RANK_OPTION, "first");
    assert!(err.to_string().contains("=first") && err.to_string().contains("GPU index"), "{err}");
    let err = refused_with_option("progress_pin", "six");
    assert!(err.to_string().contains("progress_pin=six") && err.to_string().contains("CPU number"), "{err}");
}
