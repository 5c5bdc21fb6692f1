#!/usr/bin/env bash
# Device run 2 for helper gpulat2: base vs new (one-rank copy kernel), memcpy and NCCL modes of the same binary, alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat2-out}; mkdir -p "$O/t"
B=dist/base; N=dist/new
S=$O/summary.txt
t0=$(date +%s)
{ date -u; nvidia-smi -L; lscpu | head -20; nproc; uptime; cat $B/COMMIT $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { # tag limit cmd...
  local tag=$1 lim=$2; shift 2
  timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|windows per size\|passed\|failed\|warning" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -8 >> "$S"
}
T="--op all_reduce -b 8 -e 64K -n 100 --no-plot"
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
C="concord-bench --backend nccl --ranks 1"
for i in 1 2 3; do
  run ws1-base-$i 60 $B/run-gpu.sh $C $T
  run ws1-kernel-$i 60 $N/run-gpu.sh $C $T
  run ws1-memcpy-$i 60 $N/run-gpu.sh $C $T --opts one_rank_copy=memcpy
  run ws1-nccl-$i 60 $N/run-gpu.sh $C $T --opts one_rank_copy=0
done
for i in 1 2; do
  run ws1W-kernel-$i 90 $N/run-gpu.sh $C $W
  run ws1W-memcpy-$i 90 $N/run-gpu.sh $C $W --opts one_rank_copy=memcpy
  run ws1W-nccl-$i 90 $N/run-gpu.sh $C $W --opts one_rank_copy=0
done
run ws1-kernel-rawwindow 60 $N/run-gpu.sh $C $T --opts raw_buffers=window
run ws1-nccl-rawwindow 60 $N/run-gpu.sh $C $T --opts raw_buffers=window,one_rank_copy=0
for i in 1 2 3; do
  run ws2-base-$i 60 $B/run-gpu.sh table $T
  run ws2-new-$i 60 $N/run-gpu.sh table $T
done
for i in 1 2; do
  run ws2W-new-$i 90 $N/run-gpu.sh table $W
done
for by in 8 4096; do
  run phases-ws1-kernel-$by 60 $N/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1 --phase-bytes $by
  run phases-ws1-memcpy-$by 60 $N/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1 --phase-bytes $by --opts one_rank_copy=memcpy
  run phases-ws1-nccl-$by 60 $N/run-gpu.sh bench --ranks 1 --phases --iters 500 --sizes-mib 1 --phase-bytes $by --opts one_rank_copy=0
done
run nccl-full-new 300 env REPORT=$O/t/full CONCORD_CASE_TIMEOUT_MS=8000 $N/run-gpu.sh nccl
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
cd "$O/t" && tar czf "$O/all.tgz" . && cd / && rm -rf "$O/t"
cat "$S"
