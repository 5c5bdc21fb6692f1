#!/usr/bin/env bash
# Lead's end-of-session GPU run: the whole NCCL suite, seeds, order check, all_reduce tables.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
{ date; nvidia-smi -L; nproc; cat dist/COMMIT; } > "$S"
step() { local name=$1; shift; local a=$(date +%s); "$@" > "$O/$name.log" 2>&1; local rc=$?; local b=$(date +%s);
  echo "== $name rc=$rc ($((b-a)) s, t+$((b-t0)) s)" >> "$S"; }
step full env REPORT=$O/full dist/run-gpu.sh nccl
tail -3 "$O/full.log" >> "$S"; grep -E "FAILED|failed:" "$O/full.log" | head -20 >> "$S"
step seeds env REPORT=$O/seeds dist/run-gpu.sh nccl seed::c10d
tail -2 "$O/seeds.log" >> "$S"
step order dist/run-gpu.sh bench --ranks 2 --order-check
grep -i "order" "$O/order.log" | tail -2 >> "$S"
step table-ws2 dist/run-gpu.sh table --op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot
grep -E "latency worst|Wrong" "$O/table-ws2.log" >> "$S"
step table-ws1 dist/run-gpu.sh concord-bench --backend nccl --ranks 1 --op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot
grep -E "latency worst|Wrong" "$O/table-ws1.log" >> "$S"
ls /dev/shm >> "$S"; echo "devshm listed above (empty = clean); total $(( $(date +%s) - t0 )) s" >> "$S"
rm -rf /tmp/concord-p* 2>/dev/null
cat "$S"
