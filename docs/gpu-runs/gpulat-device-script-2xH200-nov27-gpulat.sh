#!/usr/bin/env bash
# Device run for helper gpulat: base (HEAD before the change) vs new, same machine, alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat-out}; mkdir -p "$O"
B=dist/base; N=dist/new
S=$O/summary.txt
t0=$(date +%s)
{ date -u; nvidia-smi -L; nvidia-smi topo -m; lscpu; lscpu -e; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/machine.txt" 2>&1
run() { # tag limit cmd...
  local tag=$1 lim=$2; shift 2
  local s=$(date +%s.%N)
  timeout "$lim" "$@" > "$O/$tag.log" 2>&1; local rc=$?
  local e=$(date +%s.%N)
  echo "== $tag rc=$rc $(awk "BEGIN{printf \"%.1f\", $e - $s}") s (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|bandwidth worst\|#wrong\|WRONG\|passed\|failed" "$O/$tag.log" | grep -v "^#  " | tail -8 >> "$S"
}
T="--op all_reduce -b 8 -e 64K -n 100"
for i in 1 2 3; do
  run ws2-base-$i 90 $B/run-gpu.sh table $T
  run ws2-new-$i 90 $N/run-gpu.sh table $T
done
for i in 1 2; do
  run ws1-base-$i 90 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
  run ws1-new-$i 90 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
done
# Two threads of one rank on two cores, or on the two hyperthreads of one core (guest topology)
map=$(lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#')
D=$(echo "$map" | awk -F, '!seen[$2]++ {print $1}' | head -2 | paste -sd,)
SIB=$(echo "$map" | awk -F, '{c[$2]=(c[$2]=="" ? $1 : c[$2]","$1); n[$2]++} END{for(k in c) if(n[k]>=2){print c[k]; exit}}' | cut -d, -f1,2)
echo "cores: distinct $D siblings ${SIB:-none}" >> "$S"
run ws1-new-2cores 90 taskset -c "$D" $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
[ -n "$SIB" ] && run ws1-new-1core2ht 90 taskset -c "$SIB" $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
run ws1-base-2cores 90 taskset -c "$D" $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
run phases-ws2-base 90 $B/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1
run phases-ws2-new 90 $N/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1
run phases-ws1-new 90 $N/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1
run nccl-full-new 300 env REPORT=$O/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
grep -h "passed\|failed" "$O/nccl-full-new.log" | tail -3 >> "$S"
if [ $(( $(date +%s) - t0 )) -lt 360 ]; then
  run ws2-all-new 120 $N/run-gpu.sh table --op all -b 8 -e 64K -n 100
fi
if [ $(( $(date +%s) - t0 )) -lt 440 ]; then
  run ws2-all-base 120 $B/run-gpu.sh table --op all -b 8 -e 64K -n 100
fi
ls /dev/shm > "$O/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
