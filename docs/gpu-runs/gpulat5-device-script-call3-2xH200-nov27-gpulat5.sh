#!/usr/bin/env bash
# Device call 3 for helper gpulat5: where the two-thread shape's ~1.2 us goes. The raw loop on
# the main thread (default), on a second thread with the first spinning (raw_thread=1) or
# napping until the last 8 launches (raw_thread=nap); the backend with its bench mark napping
# the same way (mark_wait=nap). Alternating; base for more base/new pairs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat5-out}; mkdir -p "$O/t"
B=dist/base; N=dist; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -5 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4 5; do
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-thr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=1
  run ws2-thrnap-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=nap
  run ws2-marknap-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts mark_wait=nap
  [ $i -le 3 ] && run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  [ $i -le 3 ] && run ws1-thr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts raw_thread=1
  [ $i -le 3 ] && run ws1-thrnap-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts raw_thread=nap
  [ $(( $(date +%s) - t0 )) -gt 280 ] && break
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
