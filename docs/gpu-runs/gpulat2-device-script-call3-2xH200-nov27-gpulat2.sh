#!/usr/bin/env bash
# Device run 3 for helper gpulat2: the final code's NCCL conformance suite, then the 1-rank table once more.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat2-out}; mkdir -p "$O/t"
N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; uptime; cat $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|passed\|failed\|warning" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -8 >> "$S"; }
run nccl-full-final 165 env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
if [ $(( $(date +%s) - t0 )) -lt 160 ]; then
  run ws1-kernel-final 20 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 --op all_reduce -b 8 -e 64K -n 100 --no-plot
fi
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
cd "$O/t" && tar czf "$O/all.tgz" . && cd / && rm -rf "$O/t"
cat "$S"
