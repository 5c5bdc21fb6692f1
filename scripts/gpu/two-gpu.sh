#!/usr/bin/env bash
# Issue 16's runs on a 2-GPU machine, one call: every log under $OUT (default ./out).
#   dist/... must exist (cargo xtask gpu-bundle); dist/old/ optionally holds a bundle of an
#   older commit whose device_faults cases are run for the before/after proof.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
d=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/dist
step() { # step NAME TIMEOUT cmd...
    local name=$1 t=$2; shift 2
    local s=$(date +%s.%N)
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
    local e=$(date +%s.%N)
    printf '   rc=%s wall=%.2fs\n' "$rc" "$(echo "$e - $s" | bc)" | tee -a "$OUT/summary.txt"
    tail -3 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$OUT/summary.txt"
}
{ nvidia-smi -L; nvidia-smi topo -m; ls -l /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null; python3 -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'; } > "$OUT/machine.txt" 2>&1
PLAN=${PLAN:-full seed faults old table fused phases}
for p in $PLAN; do case $p in
  full)   REPORT=$OUT/full CONCORD_CASE_TIMEOUT_MS=8000 step full 200 "$d/run-gpu.sh" nccl ;;
  full-default) REPORT=$OUT/full-default step full-default 240 "$d/run-gpu.sh" nccl ;;
  seed)   for i in 1 2 3; do REPORT=$OUT/seed$i step seed$i 40 "$d/run-gpu.sh" nccl seed:: ; done ;;
  autotune) REPORT=$OUT/autotune step autotune 120 "$d/run-gpu.sh" nccl autotune ;;
  fusedsuite) REPORT=$OUT/fusedsuite step fusedsuite 120 "$d/run-gpu.sh" nccl fused ;;
  faults) REPORT=$OUT/faults CONCORD_CASE_TIMEOUT_MS=8000 step faults 120 "$d/run-gpu.sh" nccl --jobs 1 device_faults ;;
  old)    [ -x "$d/old/run-gpu.sh" ] && REPORT=$OUT/old-faults CONCORD_CASE_TIMEOUT_MS=8000 step old-faults 120 "$d/old/run-gpu.sh" nccl --jobs 1 device_faults ;;
  table)  step table 240 "$d/run-gpu.sh" table --op all -b 8 -e 1G --json "$OUT/table.jsonl" --svg "$OUT/table.svg" ;;
  fused)  step fused 90 "$d/run-gpu.sh" table --fused --json "$OUT/fused.jsonl" --no-plot ;;
  phases) step phases 60 "$d/run-gpu.sh" bench --ranks 2 --phases ;;
  tune)   step tune 120 "$d/run-gpu.sh" tune --backend nccl --ranks 2 --measure --timeout-phase ;;
  torchrun) NPROC=2 step torchrun 90 "$d/run-gpu.sh" torchrun nccl seed:: ;;
esac; done
echo "plan done" >> "$OUT/summary.txt"
