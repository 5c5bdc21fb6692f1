#!/usr/bin/env bash
# Device call 4 for helper gpulat4: is NCCL's call slower on the backend's blocking twin (an
# ncclCommSplit child of the non-blocking communicator) than on a plain blocking communicator?
# The table's probe and --phases on new, default launch vs `blocking=1`, alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat4-out}; mkdir -p "$O/t"
N=dist/new; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|FAIL\|failed\|progress thread per job\|raw NCCL" "$O/t/$tag.log" | grep -v "^#  *[0-9]\| nb:" | tail -7 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3; do
  run probe-twin-$i 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run probe-blocking-$i 60 env CONCORD_BENCH_PROBE=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts blocking=1
done
for i in 1 2; do
  run phases-twin-$i 40 $N/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1
  run phases-blocking-$i 40 $N/run-gpu.sh bench --ranks 2 --phases --iters 500 --sizes-mib 1 --opts blocking=1
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
