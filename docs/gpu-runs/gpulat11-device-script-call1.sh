#!/usr/bin/env bash
# Device call 1 for helper gpulat11: NCCL small-op latency, an eleventh pass (issues 12, 16).
# Two bundles: B0 = base (main's dist at 4c895f5: the backend as on main), B1 = new (branch
# gpulat11: the progress thread holds the jobs queued behind the one it takes, one queue lock per
# batch; backend option progress_pin=N). Per round, alternating:
#   2 ranks: base, new (both unpinned), pin6 / pin12 (new with progress_pin=N and raw_pin=N: the
#            progress thread and the raw loop's launching thread of rank r both on CPU N + r, so
#            Concord and raw launch from the same vCPU; gpulat10 found CPUs 6-7 fast and 12-13
#            slow for NCCL's host time on its machine);
#   1 rank:  base, new.
# Then CONCORD_BENCH_PROBE=1 runs alternating base / new / pin6 at 2 ranks (the progress thread's
# own time per job: job - NCCL section).
# Ran with B0=.gpulat11/base B1=.gpulat11/new (the device tool sends /work/main: the bundles were
# copied into its git-excluded .gpulat11/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat11-out}; mkdir -p "$O/t"
B0=${B0:-.gpulat11/base}; B1=${B1:-.gpulat11/new}; S=$O/summary.txt; t0=$(date +%s)
LIMIT=${LIMIT:-230}
{ date -u; nvidia-smi -L; nproc; uptime; echo "base $(cat $B0/COMMIT) new $(cat $B1/COMMIT)"; lscpu | grep -i "model name\|thread\|core\|socket\|numa"; } > "$O/t/machine.txt" 2>&1
run() { [ $STOP = 1 ] && return 0; local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|passed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"
  # A run that failed or hung stops the call (the device time is better kept for a fix).
  [ $rc -ne 0 ] && STOP=1; return 0; }
STOP=0
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
base="$B0/run-gpu.sh concord-bench --backend nccl"
new="$B1/run-gpu.sh concord-bench --backend nccl"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  run ws2-base-$i 30 $base --ranks 2 $W
  run ws2-new-$i 30 $new --ranks 2 $W
  run ws2-pin6-$i 30 $new --ranks 2 $W --opts progress_pin=6,raw_pin=6
  run ws2-pin12-$i 30 $new --ranks 2 $W --opts progress_pin=12,raw_pin=12
  run ws1-base-$i 30 $base --ranks 1 $W
  run ws1-new-$i 30 $new --ranks 1 $W
  [ $STOP = 1 ] && break
  [ $i -ge 9 ] && [ $(( $(date +%s) - t0 )) -gt $LIMIT ] && break
  [ $(( $(date +%s) - t0 )) -gt 280 ] && break
done
mkdir -p "$O/t/probe"
for i in 1 2; do
  [ $STOP = 1 ] && break
  CONCORD_BENCH_PROBE=1 run probe/ws2-base-$i 30 $base --ranks 2 $W
  CONCORD_BENCH_PROBE=1 run probe/ws2-new-$i 30 $new --ranks 2 $W
  CONCORD_BENCH_PROBE=1 run probe/ws2-pin6-$i 30 $new --ranks 2 $W --opts progress_pin=6,raw_pin=6
  [ $(( $(date +%s) - t0 )) -gt 320 ] && break
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
