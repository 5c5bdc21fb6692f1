#!/usr/bin/env bash
# Device run 4 for helper gpulat3: the final code (929fccc) at 2 and 1 ranks, the raw loop on one
# buffer pair (nccl-tests' loop, the default) against raw_buffers=window (every launch of a window
# its own buffers, as the backend's side), alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat3-out}; mkdir -p "$O/t"
N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; uptime; cat $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results" "$O/t/$tag.log" | tail -3 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2; do
  run ws2-new-$i 40 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-rawwin-$i 40 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_buffers=window
done
run ws1-new-1 40 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
run ws1-rawwin-1 40 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts raw_buffers=window
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
