#!/usr/bin/env bash
# Device call for helper gpulat13 (issue 12): the one-rank in-place identity all_reduce without a
# job (backends/nccl/src/noop.rs). One H200. Bundles (ci profile = release without debug info,
# the binaries stripped; carried as .gpulat13/ from /work/main, git-excluded there):
#   base = main 55305e2 (concord-bench, the GPU test one_rank_noop built against base's library)
#   new  = branch gpulat13 (concord-bench, one_rank_noop, conformance)
#   bug  = new with Tracker::last_pending returning None (the no-op never waits: one_rank_noop only)
# 1. base / new alternated, 1 rank, `--op all_reduce -b 8 -e 64K -n 1000 --window 100`
#    (in and out of place, every output checked), >= 7 pairs.
# 2. one_rank_noop on new (must pass), base (the "no job" test must fail: base queues a job),
#    bug (the stream-order test must fail).
# 3. The NCCL conformance suite's world-size-1 groups (filter ws1) on new.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat13-out}; mkdir -p "$O/t"
G=${G:-.gpulat13}; S=$O/summary.txt; t0=$(date +%s)
( cd "$G" && tar xJf bundle.tar.xz ) || { echo "untar failed" > "$S"; exit 1; }
for d in base new bug; do cp scripts/gpu/run-gpu.sh "$G/$d/run-gpu.sh"; chmod +x "$G/$d/run-gpu.sh" "$G/$d"/bin/*; done
{ date -u; nvidia-smi -L; nproc; uptime; echo "base $(cat $G/base/COMMIT) new $(cat $G/new/COMMIT)"; lscpu | grep -i "model name"; } > "$O/t/machine.txt" 2>&1
run() { local tag=$1 lim=$2; shift 2; timeout "$lim" "$@" > "$O/t/$tag.log" 2>&1; local rc=$?
  echo "== $tag rc=$rc (t+$(( $(date +%s) - t0 )) s)" >> "$S"
  grep -h "latency worst\|Wrong results\|wrong\|panick\|FAIL\|failed\|passed\|test result" "$O/t/$tag.log" | grep -v "^#  *[0-9]" | tail -4 >> "$S"; }
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for i in 1 2 3 4 5 6 7 8 9 10; do
  run ws1-base-$i 30 "$G/base/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
  run ws1-new-$i 30 "$G/new/run-gpu.sh" concord-bench --backend nccl --ranks 1 $W
  [ $i -ge 7 ] && [ $(( $(date +%s) - t0 )) -gt 70 ] && break
done
for d in new base bug; do run test-$d 60 "$G/$d/run-gpu.sh" one_rank_noop --test-threads=1; done
REPORT=$O/t/suite CONCORD_CASE_TIMEOUT_MS=8000 run suite-ws1 130 "$G/new/run-gpu.sh" nccl ws1
ls /dev/shm > "$O/t/devshm-after.txt" 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> "$S"
( cd "$O/t" && tar czf "$O/all.tgz" . ) ; rm -rf "$O/t"
cat "$S"
