#!/usr/bin/env bash
# Device call 3 for helper gpulat4 (a fresh machine): base vs new alternating at 2 and 1 ranks;
# the table's probe on new with batching on and off (batch=0); the order check once more.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat4-out}; mkdir -p "$O/t"
B=dist/base; N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|order check\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -5 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
run order-new 120 $N/run-gpu.sh bench --ranks 2 --order-check
for i in 1 2 3 4 5 6; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  [ $i -le 3 ] && run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  [ $i -le 3 ] && run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
done
run probe-ws2-new-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
run probe-ws2-nobatch-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts batch=0
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
