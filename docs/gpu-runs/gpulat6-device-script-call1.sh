#!/usr/bin/env bash
# Device call 1 for helper gpulat6: NCCL small-op latency, a sixth pass (issues 12, 16).
# The inline path's correctness first (order check, a multi-op table, every output checked), then
# the table alternating per round: 2 ranks base (main ef5eed9) / inline=1 / progress_cpu=4 /
# inline=1,progress_cpu=4; 1 rank base / inline=1; then the NCCL conformance suite.
# Ran as N=.gpulat6/dist B=.gpulat6/dist/base (the device tool sends the session's checkout, /work/main:
# the bundles were copied into its git-excluded .gpulat6/ and carried); dist = 3c6a7d6, dist/base = ef5eed9.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat6-out}; mkdir -p "$O/t"
N=${N:-dist}; B=${B:-dist/base}; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT $B/COMMIT; lscpu | grep -i "thread\|core\|socket\|numa\|model name"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|passed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -6 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
run order-inl 40 $N/run-gpu.sh bench --ranks 2 --order-check --opts inline=1
run chk-inl-ws2 90 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 --op all_reduce,all_gather,reduce_scatter,broadcast,reduce -b 8 -e 1M -n 50 --window 10 --no-plot --opts inline=1
run chk-inl-ws1 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 --op all_reduce,all_gather,broadcast -b 8 -e 1M -n 50 --window 10 --no-plot --opts inline=1
for i in 1 2 3 4 5 6 7 8; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-inl-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts inline=1
  run ws2-pin-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts progress_cpu=4
  run ws2-inlpin-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts inline=1,progress_cpu=4
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-inl-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts inline=1
  [ $(( $(date +%s) - t0 )) -gt 290 ] && break
done
ls /dev/shm > "$O/t/devshm-mid.txt" 2>&1
REPORT=$O/full CONCORD_CASE_TIMEOUT_MS=8000 timeout 230 $N/run-gpu.sh nccl > "$O/t/full.log" 2>&1
echo "== full rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"; tail -15 "$O/t/full.log" >> "$S"
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
rm -rf "$O/full" 2>/dev/null
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
