#!/usr/bin/env bash
# Device call 2 for helper gpulat10: where the NCCL call's host time goes, every run with
# CONCORD_BENCH_PROBE=1 (the backend's `# probe` lines: the progress thread's job and its NCCL
# section per op; the raw loop's `# probe-raw` lines: its launch call's host time per op).
# Per round at 2 ranks: def (the twin), blk (blocking=1: a blocking communicator of its own, no
# twin, launched by Comm::launch's plain path), rsplit (raw loop on a communicator made as the
# twin), rgrp (raw loop with each launch in its own NCCL group, as the backend's). Then at 1 rank
# def and pre (pre_issue=1: the window's issues queued before the first launch). Then a sweep of
# raw_pin=N at 2 ranks (the raw loop's launching thread on CPU N + rank, twice over 8 values of
# N): whether NCCL's two host-time modes (call 1: ~7 and ~10 us per call) follow the vCPU.
# Ran as N=.gpulat10/dist (the device tool sends /work/main: the bundle was copied into its
# git-excluded .gpulat10/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CONCORD_BENCH_PROBE=1
O=${OUT:-/tmp/gpulat10-out}; mkdir -p "$O/t"
N=${N:-dist}; S=$O/summary.txt; t0=$(date +%s)
LIMIT=${LIMIT:-150}
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|rror\|FAIL\|failed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -3 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
B="$N/run-gpu.sh concord-bench --backend nccl"
for i in 1 2 3 4 5 6 7 8; do
  run ws2-def-$i 60 $B --ranks 2 $W
  run ws2-blk-$i 60 $B --ranks 2 $W --opts blocking=1
  run ws2-rsplit-$i 60 $B --ranks 2 $W --opts raw_comm=split
  run ws2-rgrp-$i 60 $B --ranks 2 $W --opts raw_group=1
  [ $i -ge 6 ] && [ $(( $(date +%s) - t0 )) -gt $LIMIT ] && break
done
for i in 1 2 3; do
  run ws1-def-$i 60 $B --ranks 1 $W
  run ws1-pre-$i 60 $B --ranks 1 $W --opts pre_issue=1
done
for n in 0 4 8 12 16 20 24 28 30 26 22 18 14 10 6 2; do
  run ws2-pin$n-1 60 $B --ranks 2 $W --opts raw_pin=$n
  [ $(( $(date +%s) - t0 )) -gt 330 ] && break
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
