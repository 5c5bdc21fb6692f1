#!/usr/bin/env bash
# Device call 1 for helper gpulat12: NCCL small-op latency, a twelfth pass (issues 12, 16).
# One bundle, B1 = branch gpulat12 (bench option caller_pin=M; raw_pin's restore moves the thread
# off its CPU; the probe's new `run` and `gap` sections; the issue counters read once for the ops
# queued behind, backend option issued_cache=0 for the read per op). Per round, alternating:
#   2 ranks: def (nothing pinned), fair6 (caller_pin=2, progress_pin=6, raw_pin=6: rank r's issuing
#            thread on CPU 2 + r for the whole run, its progress thread and its raw loop's launching
#            thread on CPU 6 + r, no two of them on one vCPU), fair6nc (fair6 with issued_cache=0:
#            the cut's A/B), fair12 (fair6 with N = 12);
#   1 rank:  def, fair6.
# Then CONCORD_BENCH_PROBE=1 runs: 2 ranks fair6, fair6nc, def; 1 rank fair6 (twice if time allows).
# Ran with B1=.gpulat12/new (the device tool sends /work/main: the bundle was copied into its
# git-excluded .gpulat12/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat12-out}; mkdir -p "$O/t/probe"
B1=${B1:-.gpulat12/new}; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; echo "new $(cat $B1/COMMIT)"; lscpu | grep -i "model name\|thread\|core\|socket\|numa"; ls /dev/shm; } > "$O/t/machine.txt" 2>&1
STOP=0
run() { [ $STOP = 1 ] && return 0; local tag=$1; shift; timeout 30 "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|refused\|caller_pin" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"
  [ $rc -ne 0 ] && STOP=1; return 0; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
new="$B1/run-gpu.sh concord-bench --backend nccl"
F6="--opts caller_pin=2,progress_pin=6,raw_pin=6"
F6NC="--opts caller_pin=2,progress_pin=6,raw_pin=6,issued_cache=0"
F12="--opts caller_pin=2,progress_pin=12,raw_pin=12"
for i in 1 2 3 4 5 6 7 8 9 10 11; do
  run ws2-def-$i $new --ranks 2 $W
  run ws2-fair6-$i $new --ranks 2 $W $F6
  run ws2-fair6nc-$i $new --ranks 2 $W $F6NC
  run ws2-fair12-$i $new --ranks 2 $W $F12
  run ws1-def-$i $new --ranks 1 $W
  run ws1-fair6-$i $new --ranks 1 $W $F6
  [ $STOP = 1 ] && break
  [ $i -ge 9 ] && break
  [ $(( $(date +%s) - t0 )) -gt 300 ] && break
done
for i in 1 2; do
  [ $STOP = 1 ] && break
  [ $(( $(date +%s) - t0 )) -gt 330 ] && break
  CONCORD_BENCH_PROBE=1 run probe/ws2-fair6-$i $new --ranks 2 $W $F6
  CONCORD_BENCH_PROBE=1 run probe/ws2-fair6nc-$i $new --ranks 2 $W $F6NC
  CONCORD_BENCH_PROBE=1 run probe/ws2-def-$i $new --ranks 2 $W
  CONCORD_BENCH_PROBE=1 run probe/ws1-fair6-$i $new --ranks 1 $W $F6
done
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
