#!/usr/bin/env bash
# Device call 1 for helper gpulat9: NCCL small-op latency, a ninth pass (issues 12, 16): why the
# same NCCL call is slower from the progress thread. Base (main d3b999f, the table binary only)
# and new (the whole bundle) in the same call, per round: 2 ranks base, new, new with
# mark_wait=block (the end mark recorded by the progress thread while the caller blocks), then
# new with the raw reference made from a second thread in four shapes (raw_thread=1: a fresh
# launcher per window, the caller spinning on the launcher's counter; keep: one launcher for the
# whole step; block: the launcher records the end event, the caller blocks; keepblock: both) and
# with each raw launch in its own NCCL group (raw_group=1); then 1 rank base / new / new
# mark_wait=block. Then one CONCORD_BENCH_PROBE=1 run of new and of new mark_wait=block at 2
# ranks, then the NCCL conformance suite on new.
# Ran as N=.gpulat9/dist B=.gpulat9/base (the device tool sends /work/main: the bundles were
# copied into its git-excluded .gpulat9/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat9-out}; mkdir -p "$O/t"
N=${N:-dist}; B=${B:-dist/base}; S=$O/summary.txt; t0=$(date +%s)
LIMIT=${LIMIT:-250}  # call 1 ran with LIMIT=290
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT $B/COMMIT; lscpu; lscpu -e; nvidia-smi topo -m; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|passed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
# Where the threads run: sampled during the first round's new run at 2 ranks.
( sleep 3; for s in 1 2 3; do echo "-- sample $s"; ps -eLo pid,tid,psr,pcpu,stat,comm | grep -E "concord|nccl|cuda" ; sleep 0.7; done ) > "$O/t/threads.txt" 2>&1 &
for i in 1 2 3 4 5 6 7 8; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-mblock-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts mark_wait=block
  run ws2-rthr-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=1
  run ws2-rkeep-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=keep
  run ws2-rblock-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=block
  run ws2-rkb-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_thread=keepblock
  run ws2-rgrp-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts raw_group=1
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-mblock-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W --opts mark_wait=block
  [ $(( $(date +%s) - t0 )) -gt $LIMIT ] && break
done
CONCORD_BENCH_PROBE=1 run probe-ws2-new 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
CONCORD_BENCH_PROBE=1 run probe-ws2-mblock 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W --opts mark_wait=block
ls /dev/shm > "$O/t/devshm-mid.txt" 2>&1
# The suite only where the bundle has the conformance binary (call 1 ran the table binary alone:
# the release conformance build was still going on the 2-core machine; the suite ran in call 2).
if [ -x $N/bin/conformance ]; then
  REPORT=$O/full CONCORD_CASE_TIMEOUT_MS=8000 timeout 230 $N/run-gpu.sh nccl > "$O/t/full.log" 2>&1
  echo "== full rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"; tail -15 "$O/t/full.log" >> "$S"
fi
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
rm -rf "$O/full" 2>/dev/null
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
