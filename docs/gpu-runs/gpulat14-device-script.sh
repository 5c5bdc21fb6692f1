#!/usr/bin/env bash
# Device call for helper gpulat14: NCCL small-op latency at 2 ranks (issues 12, 16).
# Ran as `B=.gpulat14/new bash .gpulat14/device-script.sh` (the bundle copied into /work/main/.gpulat14, carried), 20:24 UTC, 418 s of command.
# One bundle B (branch gpulat14 at 92c2931: backend options header_ahead and prefetch, both
# DEFAULT ON in this bundle only, so that the suite at the end runs them; the branch's code has
# them off). Kinds, alternating in each round (the order rotates by one kind per round):
#   base  = --opts header_ahead=0,prefetch=0  (main's path)
#   ahead = --opts header_ahead=1,prefetch=0
#   pre   = --opts header_ahead=0,prefetch=1
#   both  = --opts header_ahead=1,prefetch=1
# every run: 2 ranks, --op all_reduce -b 8 -e 64K -n 1000 --window 100 (in and out of place,
# every output checked), nothing pinned. Then CONCORD_BENCH_PROBE=1 runs of base and both; then
# the NCCL conformance suite (2 GPUs: every ws1 and ws2 case) on the bundle's defaults (both on).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat14-out}; mkdir -p "$O/t/probe"
B=${B:-.gpulat14/new}; S=$O/summary.txt; t0=$(date +%s)
{ date -u; nvidia-smi -L; nproc; uptime; echo "bundle $(cat $B/COMMIT)"; lscpu | grep -i "model name\|thread\|core\|socket\|numa"; ls /dev/shm; } > "$O/t/machine.txt" 2>&1
STOP=0
run() { [ $STOP = 1 ] && return 0; local tag=$1; shift; timeout 40 "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|refused" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -3 >> "$S"
  [ $rc -ne 0 ] && STOP=1; return 0; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
bench="$B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W"
declare -A OPT=([base]="header_ahead=0,prefetch=0" [ahead]="header_ahead=1,prefetch=0" [pre]="header_ahead=0,prefetch=1" [both]="header_ahead=1,prefetch=1")
K=(base ahead pre both)
for i in 1 2 3 4 5 6 7 8 9 10; do
  for j in 0 1 2 3; do k=${K[$(( (i + j) % 4 ))]}; run ws2-$k-$i $bench --opts ${OPT[$k]}; done
  [ $STOP = 1 ] && break
  [ $(( $(date +%s) - t0 )) -gt 215 ] && break
done
for k in base pre both; do
  [ $STOP = 1 ] && break
  CONCORD_BENCH_PROBE=1 run probe/ws2-$k-1 $bench --opts ${OPT[$k]}
done
echo "== A/B done (t+$(( $(date +%s) - t0 )) s)" >> "$S"
REPORT=/tmp/gpulat14-report CONCORD_CASE_TIMEOUT_MS=8000 timeout 310 $B/run-gpu.sh nccl > "$O/t/suite.log" 2>&1
echo "== suite rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"
tail -30 "$O/t/suite.log" >> "$S"
grep -i "failed\b\|FAIL" "$O/t/suite.log" | head -40 > "$O/t/suite-fails.txt"
cp /tmp/gpulat14-report/conformance.md "$O/t/" 2>/dev/null
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t" /tmp/gpulat14-report
cat "$S"
