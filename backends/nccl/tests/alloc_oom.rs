//! The fault `alloc_output:fail` on a GPU: the op's output allocation fails as a real
//! out-of-memory does (the driver's `CUDA_ERROR_OUT_OF_MEMORY`, through the backend's own
//! allocator: block cache, pool, the retry after emptying the cache), the error is the rank's
//! `backend` error naming it, and the allocator is not left poisoned: the next out-of-place op
//! (its output a fresh allocation of the same size) gives the right answer. One rank, one GPU.
//! Without a GPU (or without libcuda / libnccl) it prints SKIPPED and passes: the conformance
//! cases `faults::alloc_fails_at_issue::*` check the peers' side on a multi-GPU machine.

use concord_core::{Backend, DType, ReduceOp, Tensor, WorldInfo};
use concord_nccl::{probe, NcclBackend};
use std::time::{Duration, Instant};

#[test]
fn an_injected_output_allocation_failure_is_the_drivers_out_of_memory_and_the_cache_recovers() {
    match probe() {
        Ok(info) if info.gpus >= 1 => {}
        other => {
            eprintln!("SKIPPED: no GPU ({:?})", other.map(|i| i.gpus));
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let w = WorldInfo {
        rank: 0,
        world_size: 1,
        store_path: dir.path().join("store"),
        world_id: "alloc-oom-test".into(),
        op_timeout: Duration::from_secs(5),
        options: vec![("fault".into(), "alloc_output:fail#2".into())],
    };
    let b = NcclBackend::init(&w).unwrap_or_else(|e| panic!("init: {e}"));
    let n = 1 << 16;
    let x = b.upload(&Tensor::from_vec(&[n], vec![3.0f32; n])).unwrap();
    let want = vec![3.0f32; n];
    let value = |what: &str| -> Vec<f32> {
        let y = b.all_reduce(&x, ReduceOp::Sum).and_then(|w| w.into_value(Duration::from_secs(5)));
        let y = y.unwrap_or_else(|e| panic!("{what}: {e}"));
        concord_core::fused::to_f32(&b.download(&y).unwrap())
    };
    // Ops #0 and #1: outputs of the same size, freed into the block cache and reused.
    assert_eq!(value("op #0"), want, "op #0");
    assert_eq!(value("op #1"), want, "op #1");
    let before = b.alloc_cache_stats();
    // Op #2: its output allocation fails at issue.
    let t = Instant::now();
    let e = match b.all_reduce(&x, ReduceOp::Sum).and_then(|w| w.wait(Duration::from_secs(5)).map(drop)) {
        Ok(()) => panic!("op #2 with alloc_output:fail#2 returned Ok"),
        Err(e) => e,
    };
    let after = b.alloc_cache_stats();
    eprintln!("op #2 failed in {:?}: {e} [{}]; block cache (hits, misses) {before:?} -> {after:?}", t.elapsed(), e.name());
    assert_eq!(e.name(), "backend", "{e}");
    let msg = e.to_string();
    assert!(msg.contains("CUDA_ERROR_OUT_OF_MEMORY"), "not the driver's out-of-memory: {msg}");
    assert!(msg.contains("alloc_output:fail") && msg.contains("all_reduce"), "{msg}");
    // Op #3: the same out-of-place all_reduce, right; the world is usable.
    assert_eq!(value("op #3, after the out-of-memory"), want, "op #3");
    let last = b.alloc_cache_stats();
    eprintln!("op #3 right after the out-of-memory; block cache (hits, misses) -> {last:?}");
    // And a fresh buffer is usable too.
    let z = b.alloc(DType::F32, &[n]).unwrap();
    b.write(&z, &Tensor::from_vec(&[n], vec![1.0f32; n])).unwrap();
    assert_eq!(concord_core::fused::to_f32(&b.download(&z).unwrap()), vec![1.0f32; n]);
}
