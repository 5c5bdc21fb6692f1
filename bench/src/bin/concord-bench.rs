//! `concord-bench --backend shm|nccl [--op all] -b 8 -e 64M -f 2 -n 20 -w 5 [--ranks N] [--mpi]`:
//! the built-in backends' benchmark (what `cargo xtask bench` runs); also `--plot` and
//! `--compare`. See the concord-bench crate docs and the README's Benchmark section.

use clap::Parser;
use concord_bench::{main_with, Args, Hooks};
use concord_nccl::NcclBackend;
use concord_shm::ShmBackend;

fn main() {
    // A reader that leaves early (`| head`): exit 141 after the ranks are ended, no backtrace.
    std::process::exit(concord_harness::pipe::main_quiet_on_broken_pipe(real_main))
}

fn real_main() -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = Args::parse();
    if let Some(code) = (concord_harness::launch::rank_world().is_none()).then(|| concord_bench::run::tools(&args)).flatten() {
        return code;
    }
    match args.backend.as_deref() {
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
    }
}
