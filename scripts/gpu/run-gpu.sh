#!/usr/bin/env bash
# Entry point on the GPU machine (no Rust there), copied into dist/ by scripts/gpu/bundle.sh.
#   dist/run-gpu.sh nccl [args...]       the NCCL conformance suites (the bundled `conformance`
#                                        binary, conformance mode; case-name filters and --jobs N
#                                        pass through), report in $REPORT (default dist/report)
#   dist/run-gpu.sh bench [args...]      NCCL timings: init, 1 KiB latency, busbw (concord-nccl-bench;
#                                        --phases: where a small all_reduce's time goes)
#   dist/run-gpu.sh table [args...]      nccl-tests' table, every output checked (concord-bench
#                                        --backend nccl --ranks <GPUs>; e.g. --op all_reduce -e 1G;
#                                        CUDA-event times, raw NCCL alongside with the ratio)
#   dist/run-gpu.sh tune [args...]       the autotuner on NCCL, one rank per GPU (winners per size,
#                                        overhead; --measure, --timeout-phase)
#   dist/run-gpu.sh tcpstore             the Rust TCP store against torch.distributed.TCPStore, both
#                                        directions, both sides as server (python3 + torch)
#   dist/run-gpu.sh torchrun BACKEND [args...]
#                                        the conformance binary under torchrun --standalone, one rank
#                                        per GPU (NPROC overrides), rendezvous on torchrun's own store
#   dist/run-gpu.sh <binary> [args...]   any other bundled binary in dist/bin
# NVLink multicast stays off: it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# cudarc loads "libnccl.so" (or a few versioned names, not ".so.2"): when only libnccl.so.2 is
# installed (e.g. PyTorch's nvidia-nccl wheel), point a private folder's libnccl.so at it.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
    lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
    if [ -z "$lib" ]; then
        lib=$(python3 -c 'import nvidia.nccl, os; d = os.path.join(list(nvidia.nccl.__path__)[0], "lib"); print(os.path.join(d, "libnccl.so.2"))' 2>/dev/null || true)
    fi
    if [ -n "$lib" ] && [ -e "$lib" ]; then
        # Inside dist/ (reused by every run; `exec` below leaves no shell to clean a temp dir).
        libdir="$here/nccl-lib"
        mkdir -p "$libdir" 2>/dev/null || libdir=$(mktemp -d /tmp/concord-nccl-lib.XXXXXX)
        ln -sfn "$lib" "$libdir/libnccl.so"
        export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "run-gpu.sh: using $lib" >&2
    fi
fi

cmd=${1:-nccl}
[ $# -gt 0 ] && shift
case "$cmd" in
    nccl) exec "$here/bin/conformance" --backend nccl --report "${REPORT:-$here/report}" "$@" ;;
    bench) exec "$here/bin/concord-nccl-bench" "$@" ;;
    tcpstore) exec python3 "$here/scripts/tcpstore_interop.py" --store-bin "$here/bin/concord-store" "$@" ;;
    torchrun)
        backend=${1:-nccl}
        [ $# -gt 0 ] && shift
        exec torchrun --standalone --nproc-per-node "${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}" --no-python \
            "$here/bin/conformance" --backend "$backend" "$@" ;;
    tune) exec "$here/bin/tune" --backend nccl --ranks "$(nvidia-smi -L 2>/dev/null | wc -l)" "$@" ;;
    table) exec "$here/bin/concord-bench" --backend nccl --ranks "$(nvidia-smi -L 2>/dev/null | wc -l)" "$@" ;;
    *) exec "$here/bin/$cmd" "$@" ;;
esac
