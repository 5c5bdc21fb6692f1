#!/usr/bin/env bash
# Device call 2 for helper gpulat12: the NCCL conformance suite on the final code (branch gpulat12
# after the backed-out issue cache: caller_pin, raw_pin's restore, the probe's run / gap sections),
# then, at the fair placement (caller_pin=2, progress_pin=6, raw_pin=6), alternating per round:
#   ws2-fair6    as call 1;
#   ws2-fair6kb  the raw loop's launches made by a kept second thread pinned to CPU 6 + rank and
#                the caller blocked meanwhile (raw_thread=keepblock): Concord's two-thread shape
#                with none of its work per op, every thread placed as Concord's;
# and, once 9 rounds are done and time allows, ws2-fair6m20 (the caller on CPU 20 + rank).
# Ran with B1=.gpulat12/new (the device tool sends /work/main: the bundle was copied into its
# git-excluded .gpulat12/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat12-out}; mkdir -p "$O/t/probe"
B1=${B1:-.gpulat12/new}; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; echo "new $(cat $B1/COMMIT)"; ls /dev/shm; } > "$O/t/machine.txt" 2>&1
REPORT=/tmp/gpulat12-report timeout 330 $B1/run-gpu.sh nccl > "$O/t/suite.log" 2>&1
echo "== suite rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"
tail -25 "$O/t/suite.log" >> "$S"
ls /dev/shm > "$O/t/devshm-after-suite.txt" 2>&1
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
new="$B1/run-gpu.sh concord-bench --backend nccl"
F6="--opts caller_pin=2,progress_pin=6,raw_pin=6"
F6KB="--opts caller_pin=2,progress_pin=6,raw_pin=6,raw_thread=keepblock"
F6M20="--opts caller_pin=20,progress_pin=6,raw_pin=6"
run() { local tag=$1; shift; timeout 20 "$@" > "$O/t/$tag.log" 2>&1; echo "== $tag rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results" "$O/t/$tag.log" >> "$S"; }
for i in 1 2 3 4 5 6 7 8 9; do
  [ $(( $(date +%s) - t0 )) -gt 370 ] && break
  run ws2-fair6-$i $new --ranks 2 $W $F6
  run ws2-fair6kb-$i $new --ranks 2 $W $F6KB
done
for i in 1 2 3 4 5 6 7 8 9; do
  [ $(( $(date +%s) - t0 )) -gt 360 ] && break
  run ws2-fair6m20-$i $new --ranks 2 $W $F6M20
done
[ $(( $(date +%s) - t0 )) -lt 372 ] && CONCORD_BENCH_PROBE=1 run probe/ws2-fair6kb-1 $new --ranks 2 $W $F6KB
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t" /tmp/gpulat12-report
cat "$S"
