#!/usr/bin/env bash
# Device call 2 for helper gpulat5: does the raw loop slow down when its launches are made by a
# second thread while the first spins (raw_thread=1, the backend's two-thread shape without
# its per-op work)? base vs new alternating; 1 rank: wide vs byte copy kernel once more.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat5-out}; mkdir -p "$O/t"
B=dist/base; N=dist; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|did not load\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -5 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4 5 6; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-thr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=1
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-thr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts raw_thread=1
  run ws1-bytes-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts one_rank_copy=bytes
  [ $(( $(date +%s) - t0 )) -gt 420 ] && break
done
run pairs-thr-ws2-1 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --interleave --opts raw_thread=1
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
