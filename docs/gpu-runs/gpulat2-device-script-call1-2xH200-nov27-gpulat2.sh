#!/usr/bin/env bash
# Device run for helper gpulat2: base (main at the session's start) vs new, same machine, alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat2-out}; mkdir -p "$O/t"
B=dist/base; N=dist/new
S=$O/summary.txt
t0=$(date +%s)
{ date -u; nvidia-smi -L; lscpu | head -20; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { # tag limit cmd...
  local tag=$1 lim=$2; shift 2
  timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|windows per size\|passed\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -8 >> "$S"
}
T="--op all_reduce -b 8 -e 64K -n 100"
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100"
for i in 1 2 3 4; do
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $T --no-plot
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T --no-plot
  run ws2-base-$i 60 $B/run-gpu.sh table $T --no-plot
  run ws2-new-$i 60 $N/run-gpu.sh table $T --no-plot
done
for i in 1 2; do
  run ws1-newW-$i 90 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --no-plot
  run ws1-newW-nocopy-$i 90 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --no-plot --opts one_rank_copy=0
  run ws2-newW-$i 90 $N/run-gpu.sh table $W --no-plot
done
run phases-ws1-new 60 $N/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1
run phases-ws1-base 60 $B/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1
run phases-ws2-new 60 $N/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1
run phases-ws2-base 60 $B/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1
run nccl-full-new 300 env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
rm -rf "$O/t/full"/*.jsonl.tmp 2>/dev/null
cd "$O/t" && tar czf "$O/all.tgz" . && cd / && rm -rf "$O/t"
cat "$S"
