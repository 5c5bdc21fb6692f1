#!/usr/bin/env bash
# Issue 16's runs on a 2-GPU machine in one device call; every log under $OUT (default ./out),
# packed at the end into $OUT/all.tgz (the device tool returns only a few files).
#   dist/ must exist (cargo xtask gpu-bundle); dist/old/ optionally holds a bundle of an older
#   commit whose device_faults cases are run for the before/after proof.
#   PLAN="full seed faults table ..." picks steps (default below); BUDGET_S (default 540) is the
#   wall budget of the whole plan: a step that would not fit is skipped, named in summary.txt.
# The GPU machine has no `bc`: times are bash integer arithmetic on `date +%s%N`.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/logs"
d=${DIST_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/dist}
[ -x "$d/run-gpu.sh" ] || d=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
t0=$(date +%s%N)
budget_ms=$(( ${BUDGET_S:-540} * 1000 ))
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
step() { # step NAME TIMEOUT_S cmd...
    local name=$1 t=$2; shift 2
    local left=$(( budget_ms - $(ms_since "$t0") ))
    if [ "$left" -lt $(( t * 1000 / 2 )) ]; then
        echo "== $name: SKIPPED (budget: ${left} ms left, step allows ${t} s)" | tee -a "$OUT/summary.txt"
        return
    fi
    [ "$(( t * 1000 ))" -gt "$left" ] && t=$(( left / 1000 ))
    local s=$(date +%s%N)
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    timeout -k 5 "$t" "$@" > "$OUT/logs/$name.log" 2>&1; local rc=$?
    local ms=$(ms_since "$s")
    printf '   rc=%s wall=%d.%03ds\n' "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$OUT/summary.txt"
    tail -4 "$OUT/logs/$name.log" | sed 's/^/   | /' | tee -a "$OUT/summary.txt"
}
{ nvidia-smi -L; nvidia-smi topo -m; ls -l /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$OUT/logs/machine.txt" 2>&1
PLAN=${PLAN:-full seed faults old table fused phases tune}
for p in $PLAN; do case $p in
  full)     REPORT=$OUT/full CONCORD_CASE_TIMEOUT_MS=8000 step full 200 "$d/run-gpu.sh" nccl ;;
  seed)     for i in 1 2 3; do REPORT=$OUT/seed$i step seed$i 30 "$d/run-gpu.sh" nccl seed::c10d ; done ;;
  p2p)      REPORT=$OUT/p2p CONCORD_CASE_TIMEOUT_MS=8000 step p2p 90 "$d/run-gpu.sh" nccl -- p2p:: send_recv recv_buffer autotune::builtin ;;
  autotune) REPORT=$OUT/autotune step autotune 90 "$d/run-gpu.sh" nccl autotune ;;
  fusedsuite) REPORT=$OUT/fusedsuite step fusedsuite 90 "$d/run-gpu.sh" nccl ::fused:: ;;
  faults)   REPORT=$OUT/faults CONCORD_CASE_TIMEOUT_MS=8000 step faults 90 "$d/run-gpu.sh" nccl device_faults ;;
  old)      [ -x "$d/old/run-gpu.sh" ] && REPORT=$OUT/old-faults CONCORD_CASE_TIMEOUT_MS=8000 step old-faults 90 "$d/old/run-gpu.sh" nccl device_faults ;;
  table)    step table 200 "$d/run-gpu.sh" table --op all -b 8 -e 1G --json "$OUT/table.jsonl" --svg "$OUT/table.svg" ;;
  latency)  step latency 90 "$d/run-gpu.sh" table --op all_reduce -b 8 -e 64M -n 100 --no-plot
            step latency-blocking 90 "$d/run-gpu.sh" table --op all_reduce -b 8 -e 64M -n 100 --no-plot --opts blocking=1 ;;
  fused)    step fused 90 "$d/run-gpu.sh" table --fused --json "$OUT/fused.jsonl" --no-plot
            step fused-serial 60 "$d/run-gpu.sh" table --fused --no-plot --opts fused_overlap=serial ;;
  phases)   step phases 40 "$d/run-gpu.sh" bench --ranks 2 --phases
            step phases-blocking 40 "$d/run-gpu.sh" bench --ranks 2 --phases --opts blocking=1 ;;
  tune)     step tune 120 "$d/run-gpu.sh" tune --measure --timeout-phase ;;
  torchrun) NPROC=2 step torchrun 60 "$d/run-gpu.sh" torchrun nccl seed:: ;;
  tunequick) step tunequick 90 "$d/run-gpu.sh" tune --sizes-kib 4,1024 --ops all_reduce --timeout-phase ;;
  window)   step latency-pair 60 "$d/run-gpu.sh" table --op all_reduce -b 8 -e 64K -n 100 --no-plot
            step latency-window 60 "$d/run-gpu.sh" table --op all_reduce -b 8 -e 64K -n 100 --no-plot --opts raw_buffers=window ;;
  ws1)      step ws1-pair 60 "$d/run-gpu.sh" concord-bench --backend nccl --ranks 1 --op all_reduce -b 8 -e 64K -n 100 --no-plot
            step ws1-window 60 "$d/run-gpu.sh" concord-bench --backend nccl --ranks 1 --op all_reduce -b 8 -e 64K -n 100 --no-plot --opts raw_buffers=window ;;
  bw64)     step bw64-pair 90 "$d/run-gpu.sh" table --op all -b 64M -e 256M --no-plot --json "$OUT/bw64-pair.jsonl"
            step bw64-window 90 "$d/run-gpu.sh" table --op all -b 64M -e 256M --no-plot --opts raw_buffers=window --json "$OUT/bw64-window.jsonl" ;;
  unwaited) for i in 1 2 3 4 5; do REPORT=$OUT/unwaited$i step unwaited$i 30 "$d/run-gpu.sh" nccl async::unwaited ; done ;;
  board)    step board-bench 60 "$d/run-gpu.sh" bench --ranks 2 --sizes-mib 1
            step board-bench-off 60 "$d/run-gpu.sh" bench --ranks 2 --sizes-mib 1 --opts header_board=0
            CONCORD_BACKEND_OPTS=header_board=0 REPORT=$OUT/device-headers CONCORD_CASE_TIMEOUT_MS=8000 \
              step device-headers 150 "$d/run-gpu.sh" nccl -- device_faults subgroup bad_input seed:: faults:: ;;
  sendrecv) step sendrecv 90 "$d/run-gpu.sh" table --op sendrecv -b 8 -e 1G --no-plot ;;
esac; done
echo "plan done after $(ms_since "$t0") ms" >> "$OUT/summary.txt"
cp "$OUT/summary.txt" "$OUT/logs/"
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz . ) 2>/dev/null
