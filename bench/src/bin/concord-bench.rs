//! `concord-bench --backend shm|nccl [--op all] -b 8 -e 64M -f 2 -n 20 -w 5 [--ranks N] [--mpi]`:
//! the built-in backends' benchmark (what `cargo xtask bench` runs); also `--plot` and
//! `--compare`. See the concord-bench crate docs and the README's Benchmark section.

use clap::Parser;
use concord_bench::{main_with, Args, Hooks};
use concord_nccl::NcclBackend;
use concord_shm::ShmBackend;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = Args::parse();
    if let Some(code) = (concord_harness::launch::rank_world().is_none()).then(|| concord_bench::run::tools(&args)).flatten() {
        std::process::exit(code);
    }
    let code = match args.backend.as_deref() {
        Some("shm") if args.fused => concord_bench::fused::fused_main::<ShmBackend>("shm", &args),
        Some("nccl") if args.fused => concord_bench::fused::fused_main::<NcclBackend>("nccl", &args),
        Some("shm") => main_with::<ShmBackend>("shm", &Hooks::default(), &args, argv),
        Some("nccl") => main_with::<NcclBackend>("nccl", &concord_bench::nccl::hooks(), &args, argv),
        Some(other) => {
            eprintln!(
                "concord-bench: unknown backend `{other}` (built-in: shm, nccl; a downstream backend calls concord_bench::bench_main)"
            );
            2
        }
        None => {
            eprintln!("concord-bench: give --backend shm|nccl (or --plot / --compare)");
            2
        }
    };
    std::process::exit(code);
}
