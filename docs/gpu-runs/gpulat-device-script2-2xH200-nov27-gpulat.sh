#!/usr/bin/env bash
# Device run 2 for helper gpulat: does the waiting caller's spin in `mark` slow the progress thread?
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat-out}; mkdir -p "$O"
R=target/gpulat/dist; B=$R/base; N=$R/new2
S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; lscpu | head -20; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/machine.txt" 2>&1
run() { local tag=$1; shift; timeout 90 "$@" > "$O/$tag.log" 2>&1; echo "== $tag rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"; grep -h "latency worst\|Wrong results" "$O/$tag.log" >> "$S"; }
T="--op all_reduce -b 8 -e 64K -n 100"
for i in 1 2 3 4; do
  run ws2-base-$i $B/run-gpu.sh table $T
  run ws2-spin-$i env CONCORD_NCCL_MARK_SPIN=1 $N/run-gpu.sh table $T
  run ws2-nap-$i $N/run-gpu.sh table $T
done
for i in 1 2 3 4; do
  run ws1-base-$i $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
  run ws1-spin-$i env CONCORD_NCCL_MARK_SPIN=1 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
  run ws1-nap-$i $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $T
done
ls /dev/shm > "$O/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
cd $O && tar czf /tmp/all2.tgz . && rm -rf ./* && mv /tmp/all2.tgz . && tar xzf all2.tgz -O ./summary.txt | grep -c "Wrong results: 0 OK"
