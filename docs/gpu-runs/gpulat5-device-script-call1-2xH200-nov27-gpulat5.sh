#!/usr/bin/env bash
# Device call 1 for helper gpulat5: base (main at the session's start) vs new, alternating.
# 2 ranks: base (reference after the backend's windows), new (the same), new --interleave
# (a reference window after each backend window). 1 rank: base (byte copy kernel), new (wide
# copy kernel), new with one_rank_copy=bytes (the byte kernel in the same binary), new
# --interleave. Then per-window pairs (CONCORD_BENCH_PROBE=1), then the NCCL conformance suite.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat5-out}; mkdir -p "$O/t"
B=dist/base; N=dist; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|did not load\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -5 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-newi-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --interleave
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-bytes-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts one_rank_copy=bytes
  run ws1-newi-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --interleave
done
for i in 1 2; do
  run pairs-ws2-$i 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --interleave
done
run pairs-ws1-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --interleave
left=$(( 585 - ($(date +%s) - t0) ))
[ $left -gt 150 ] && run nccl-full-new $(( left - 10 )) env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
tail -30 "$O/t/nccl-full-new.log" > "$O/t/nccl-full-new.tail.log" 2>/dev/null
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" --exclude=./full --exclude=./nccl-full-new.log . ) ; rm -rf "$O/t"
cat "$S"
