#!/usr/bin/env bash
# Device call 1 for helper gpulat4: base (5c9001d) vs new (issue counters let unvalidated small
# ops share a completion event), alternating, at 2 and 1 ranks; the order check (validation off);
# the table's per-window probe (CONCORD_BENCH_PROBE=1); --phases at 100 and 500 ops; the table
# with 500-op windows; the NCCL conformance suite on new.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat4-out}; mkdir -p "$O/t"
B=dist/base; N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|passed\|failed\|panick\|rror\|order check\|progress thread per job\|# probe rank 0 all_reduce out-of-place 8 B\|# probe rank 0 all_reduce in-place 8 B" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -8 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
P="--phases --sizes-mib 1"
run order-new 120 $N/run-gpu.sh bench --ranks 2 --order-check
for i in 1 2 3 4 5; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  [ $i -le 4 ] && run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  [ $i -le 4 ] && run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  [ $i -le 2 ] && run ws2-nobatch-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts batch=0
done
for i in 1 2; do
  run probe-ws2-new-$i 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
done
run probe-ws2-nobatch-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts batch=0
run probe-ws1-new-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
run phases-ws2-new-500 40 $N/run-gpu.sh bench --ranks 2 $P --iters 500
run phases-ws2-new-100 40 $N/run-gpu.sh bench --ranks 2 $P --iters 100
run phases-ws2-base-500 40 $B/run-gpu.sh bench --ranks 2 $P --iters 500
run phases-ws2-base-100 40 $B/run-gpu.sh bench --ranks 2 $P --iters 100
W5="--op all_reduce -b 8 -e 64K -n 1000 --window 500 --no-plot"
run win500-ws2-new-1 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W5
run win500-ws2-base-1 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W5
run win500-ws2-new-2 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W5
left=$(( 585 - ($(date +%s) - t0) ))
[ $left -gt 20 ] && run nccl-full-new $(( left - 10 )) env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
tail -30 "$O/t/nccl-full-new.log" > "$O/t/nccl-full-new.tail.log" 2>/dev/null
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" --exclude=./full --exclude=./nccl-full-new.log . ) ; rm -rf "$O/t"
cat "$S"
