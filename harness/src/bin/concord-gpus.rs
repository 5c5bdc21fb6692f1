//! `concord-gpus`: what `cargo xtask test` says about GPUs before the tests run — the count and
//! where it came from, and which NCCL cases are gated for it. A binary of its own so that the
//! xtask depends on no workspace crate (it compiles first, before anything else, in seconds).
#![forbid(unsafe_code)]

fn main() {
    let gpus = concord_harness::gpu::count();
    println!("xtask: GPUs: {}", concord_harness::gpu::describe());
    if gpus < 2 {
        println!(
            "xtask: gated: NCCL cases need one GPU per rank; with {gpus} GPU(s) every nccl case of world size > {gpus} is listed as ignored and shows as SKIP"
        );
    }
}
