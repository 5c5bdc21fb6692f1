#!/usr/bin/env bash
# Device call 2 for helper gpulat13: as call 1 (gpulat13-device-script.sh), new = abe53d4 (the
# issue spins up to 10 us for the progress thread to go idle). 7 pairs base / new of the 1-rank
# table, one pair with CONCORD_BENCH_PROBE=1 (host issue time per op), one_rank_noop on new, the
# NCCL conformance suite's ws1 groups on new.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat13-out}; mkdir -p "$O/t"
G=${G:-.gpulat13}; S=$O/summary.txt; t0=$(date +%s)
( cd "$G" && tar xJf bundle.tar.xz ) || { echo "untar failed" > "$S"; exit 1; }
for d in base new; do cp scripts/gpu/run-gpu.sh "$G/$d/run-gpu.sh"; chmod +x "$G/$d/run-gpu.sh" "$G/$d"/bin/*; done
{ date -u; nvidia-smi -L; nproc; uptime; echo "base $(cat $G/base/COMMIT) new $(cat $G/new/COMMIT)"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|panick\|FAIL\|failed\|passed\|test result" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4 5 6 7; do
  run ws1-base-$i 30 "$G/base/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 30 "$G/new/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
done
mkdir -p "$O/t/probe"
CONCORD_BENCH_PROBE=1 run probe/ws1-base 30 "$G/base/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
CONCORD_BENCH_PROBE=1 run probe/ws1-new 30 "$G/new/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
run test-new 60 "$G/new/run-gpu.sh" one_rank_noop --test-threads=1
REPORT=$O/t/suite CONCORD_CASE_TIMEOUT_MS=8000 run suite-ws1 50 "$G/new/run-gpu.sh" nccl ws1
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
