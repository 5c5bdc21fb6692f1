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
# The bundle's source commit, for the bench's records (see bundle.sh).
[ -f "$here/COMMIT" ] && export CONCORD_GIT_COMMIT="${CONCORD_GIT_COMMIT:-$(cat "$here/COMMIT")}"

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

# cudarc loads libcublas.so / libcublas.so.13 for the NCCL backend's fused ops (without it they
# fall back to the host decomposition): when the loader does not know it, add the folder of
# PyTorch's pip wheel (nvidia/cu13/lib or nvidia/cublas/lib) or of a system CUDA.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so'; then
    cublas_dir=$(python3 -c '
import os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib"):
        d = os.path.join(r, sub)
        if any(f.startswith("libcublas.so") for f in (os.listdir(d) if os.path.isdir(d) else [])):
            print(d); sys.exit(0)
' 2>/dev/null || true)
    if [ -z "$cublas_dir" ]; then
        for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu; do
            if ls "$d"/libcublas.so* >/dev/null 2>&1; then cublas_dir=$d; break; fi
        done
    fi
    if [ -n "$cublas_dir" ]; then
        export LD_LIBRARY_PATH="$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "run-gpu.sh: libcublas from $cublas_dir" >&2
    else
        echo "run-gpu.sh: no libcublas found: the NCCL fused ops run as the host decomposition" >&2
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
