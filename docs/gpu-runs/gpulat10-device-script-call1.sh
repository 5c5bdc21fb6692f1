#!/usr/bin/env bash
# Device call 1 for helper gpulat10: NCCL small-op latency, a tenth pass (issues 12, 16): gpulat9's
# three untested candidates, alternated in every round, one bundle (N, the branch's table binary):
#   def    the defaults;
#   blk    backend option blocking=1: a blocking communicator of its own, no twin (candidate 1);
#   rsplit raw_comm=split: the raw loop's communicator made as the backend's twin (ncclCommSplit,
#          splitShare 0, off a non-blocking parent) (candidate 1, without the backend);
#   rwin   raw_buffers=window: the raw loop on a buffer set per launch, as Concord's fresh outputs
#          (candidate 2);
#   pre    backend option pre_issue=1: the window's issues all queued before the progress thread
#          launches the first (candidate 3).
# Per round: 2 ranks def / blk / rsplit / rwin / pre, then 1 rank def / blk / rwin / pre; then one
# CONCORD_BENCH_PROBE=1 run of def and of pre at 2 ranks.
# Ran as N=.gpulat10/dist (the device tool sends /work/main: the bundle was copied into its
# git-excluded .gpulat10/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat10-out}; mkdir -p "$O/t"
N=${N:-dist}; S=$O/summary.txt; t0=$(date +%s)
LIMIT=${LIMIT:-350}
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT; lscpu | grep -i "model name\|thread\|core\|socket\|numa"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|passed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
B="$N/run-gpu.sh concord-bench --backend nccl"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  run ws2-def-$i 60 $B --ranks 2 $W
  run ws2-blk-$i 60 $B --ranks 2 $W --opts blocking=1
  run ws2-rsplit-$i 60 $B --ranks 2 $W --opts raw_comm=split
  run ws2-rwin-$i 60 $B --ranks 2 $W --opts raw_buffers=window
  run ws2-pre-$i 60 $B --ranks 2 $W --opts pre_issue=1
  run ws1-def-$i 60 $B --ranks 1 $W
  run ws1-blk-$i 60 $B --ranks 1 $W --opts blocking=1
  run ws1-rwin-$i 60 $B --ranks 1 $W --opts raw_buffers=window
  run ws1-pre-$i 60 $B --ranks 1 $W --opts pre_issue=1
  [ $i -ge 9 ] && [ $(( $(date +%s) - t0 )) -gt $LIMIT ] && break
  [ $(( $(date +%s) - t0 )) -gt 470 ] && break
done
CONCORD_BENCH_PROBE=1 run probe-ws2-def 60 $B --ranks 2 $W
CONCORD_BENCH_PROBE=1 run probe-ws2-pre 60 $B --ranks 2 $W --opts pre_issue=1
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
