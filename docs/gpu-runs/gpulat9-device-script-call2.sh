#!/usr/bin/env bash
# Device call 2 for helper gpulat9: NCCL small-op latency, a ninth pass (issues 12, 16). Call 1
# found that an explicit group of one around each raw launch (raw_group=1) costs ~0.5 us per op,
# and the backend wraps every launch in one. New = 46015af: a launch of exactly one NCCL call is
# made bare on the blocking twin (Comm::launch_single). Base (main d3b999f, the table binary
# only) and new alternating per round: 2 ranks base / new, 1 rank base / new; then the NCCL
# conformance suite on new.
# Ran as N=.gpulat9/dist B=.gpulat9/base LIMIT=150 (the device tool sends /work/main: the
# bundles were copied into its git-excluded .gpulat9/ and carried).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat9-out}; mkdir -p "$O/t"
N=${N:-dist}; B=${B:-dist/base}; S=$O/summary.txt; t0=$(date +%s)
LIMIT=${LIMIT:-150}
{ date -u; nvidia-smi -L; nproc; uptime; cat $N/COMMIT $B/COMMIT; lscpu | grep -i "model name\|thread\|core\|socket\|numa"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|rror\|FAIL\|failed\|passed" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  run ws2-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws2-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 2 $W
  run ws1-base-$i 60 $B/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 60 $N/run-gpu.sh concord-bench --backend nccl --ranks 1 $W
  [ $(( $(date +%s) - t0 )) -gt $LIMIT ] && break
done
ls /dev/shm > "$O/t/devshm-mid.txt" 2>&1
REPORT=$O/full CONCORD_CASE_TIMEOUT_MS=8000 timeout 230 $N/run-gpu.sh nccl > "$O/t/full.log" 2>&1
echo "== full rc=$? (t+$(( $(date +%s) - t0 )) s)" >> "$S"; tail -15 "$O/t/full.log" >> "$S"
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
rm -rf "$O/full" 2>/dev/null
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
