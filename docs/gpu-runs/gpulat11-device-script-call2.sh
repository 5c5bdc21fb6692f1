#!/usr/bin/env bash
# Device call 2 for helper gpulat11: the NCCL conformance suite on the final code (86310af: main +
# the progress_pin option), then, while the call's time allows, two checks of why call 1's pinned
# runs were 5-8 x slower (the progress thread pinned to CPU N + rank, and the bench's main thread,
# which issues Concord's ops, pinned to the same CPU during the raw loop's step by raw_pin):
#   ws2-ponly  progress_pin=6 alone (the main thread never pinned);
#   ws2-pkb    progress_pin=6, raw_pin=6, raw_thread=keepblock (the raw loop's launches made by a
#              second thread pinned to CPU 6 + rank, the main thread never pinned).
# Ran with B1=.gpulat11/new (the device tool sends /work/main: the bundle was copied into its
# git-excluded .gpulat11/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat11-out}; mkdir -p "$O/t"
B1=${B1:-.gpulat11/new}; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; echo "new $(cat $B1/COMMIT)"; ls /dev/shm; } > "$O/t/machine.txt" 2>&1
REPORT=/tmp/gpulat11-report timeout 340 $B1/run-gpu.sh nccl > "$O/t/suite.log" 2>&1
echo "== suite rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"
tail -25 "$O/t/suite.log" >> "$S"
ls /dev/shm > "$O/t/devshm-after-suite.txt" 2>&1
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
new="$B1/run-gpu.sh concord-bench --backend nccl"
run() { local tag=$1; shift; timeout 20 "$@" > "$O/t/$tag.log" 2>&1; echo "== $tag rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results" "$O/t/$tag.log" >> "$S"; }
for i in 1 2; do
  [ $(( $(date +%s) - t0 )) -gt 290 ] && break
  run ws2-ponly-$i $new --ranks 2 $W --opts progress_pin=6
  run ws2-pkb-$i $new --ranks 2 $W --opts progress_pin=6,raw_pin=6,raw_thread=keepblock
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t" /tmp/gpulat11-report
cat "$S"
