#!/usr/bin/env bash
# CPU benchmark: all_reduce f32 sum on 2 ranks at 1, 16, 64 MiB with the shm backend
# (concord-shm-bench) and with OpenMPI's MPI_Allreduce, side by side, plus the single-core
# memcpy bandwidth measured in the same run and the ratios. A benchmark, not a test.
# Installs openmpi-bin and libopenmpi-dev with apt-get when mpicc is missing (run as root).
# Usage: bench/run-cpu-bench.sh [ranks]   (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS="${1:-2}"
export ITERS="${ITERS:-20}"
if ! command -v mpicc >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
cargo build --release -q -p concord-bench --bin concord-shm-bench
BIN="${CARGO_TARGET_DIR:-target}/release/concord-shm-bench"
"$BIN" --ranks "$RANKS" --iters "$ITERS" | tee "$OUT/shm.txt"
mpirun --allow-run-as-root --oversubscribe -np "$RANKS" "$OUT/mpi_allreduce" | tee "$OUT/mpi.txt"
MEMCPY="$(sed -n 's/^# memcpy (single core, 64 MiB): \([0-9.]*\) GB\/s/\1/p' "$OUT/shm.txt")"
echo
echo "all_reduce f32 sum, $RANKS ranks, busbw in GB/s (factor 2(n-1)/n); memcpy $MEMCPY GB/s (single core, 64 MiB)"
printf "%12s %10s %10s %10s %12s\n" "size(B)" "shm" "mpi" "shm/mpi" "shm/memcpy"
join <(grep -v '^#' "$OUT/shm.txt" | awk '{print $1, $7}' | sort) \
     <(grep -v '^#' "$OUT/mpi.txt" | awk '{print $1, $7}' | sort) | sort -n |
    awk -v m="$MEMCPY" '{printf "%12d %10.2f %10.2f %10.2f %12.2f\n", $1, $2, $3, $2/$3, $2/m}'
