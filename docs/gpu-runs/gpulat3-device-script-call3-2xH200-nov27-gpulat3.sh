#!/usr/bin/env bash
# Device run 3 for helper gpulat3: base (a325c48) vs the final code (929fccc), alternating, at 1 and 2 ranks;
# --phases of both;
# the NCCL conformance suite on the final code.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat3-out}; mkdir -p "$O/t"
B=dist/base; N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|passed\|failed\|panick\|rror\|progress thread per job" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -6 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
P="--phases --iters 500 --sizes-mib 1"
for i in 1 2 3; do
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
done
run phases-ws2-new-1 40 $N/run-gpu.sh bench --ranks 2 $P
run phases-ws2-base-1 40 $B/run-gpu.sh bench --ranks 2 $P
run phases-ws1-new-1 40 $N/run-gpu.sh bench --ranks 1 $P
run phases-ws1-base-1 40 $B/run-gpu.sh bench --ranks 1 $P
left=$(( 590 - ($(date +%s) - t0) ))
[ $left -gt 20 ] && run nccl-full-new $(( left - 10 )) env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" --exclude=./full . ) ; rm -rf "$O/t"
cat "$S"
