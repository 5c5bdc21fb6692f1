#!/usr/bin/env bash
# Device call 4 for helper gpulat5: the raw loop's fast mode, main thread or CPU placement?
# 2 ranks, alternating: raw on the main thread unpinned / pinned to CPU 4 + rank (raw_pin=4);
# raw from a second thread unpinned / its launcher pinned to CPU 4 + rank.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat5-out}; mkdir -p "$O/t"
N=dist; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT; lscpu | grep -i "thread\|core\|socket\|numa\|model name"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -5 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4; do
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-pin-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_pin=4
  run ws2-thr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=1
  run ws2-thrpin-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=1,raw_pin=4
  [ $(( $(date +%s) - t0 )) -gt 130 ] && break
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
