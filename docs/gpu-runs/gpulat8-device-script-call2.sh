#!/usr/bin/env bash
# Device call 2 for helper gpulat8: where the progress thread's own ~1.4 us per job goes (the
# probe's finer sections: take, pre, defer, after; 2fb7878+), and whether this host's clock
# reads are cheap (every section boundary and several steps of a job read the clock).
# Ran as P=.gpulat8/probe (the table binary of the final code, carried like call 1's bundles).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
O=${OUT:-/tmp/gpulat8-out}; mkdir -p "$O"; P=${P:-dist}; t0=$(date +%s)
{ date -u; nvidia-smi -L; cat $P/COMMIT; uname -r
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
  grep -o -w "constant_tsc\|nonstop_tsc\|tsc_known_freq" /proc/cpuinfo | sort | uniq -c
  command -v perf || echo "no perf"
  python3 -c '
import time
n = 1000000
for f in (time.perf_counter_ns, time.monotonic_ns):
    t = time.perf_counter_ns()
    for _ in range(n): f()
    e = time.perf_counter_ns() - t
    t = time.perf_counter_ns()
    for _ in range(n): pass
    b = time.perf_counter_ns() - t
    print(f.__name__, "ns per call, loop subtracted:", round((e - b) / n, 1))
'
} > "$O/machine.txt" 2>&1
W="--op all_reduce -b 8 -e 64K -n 1000 --window 100 --no-plot"
for k in 1 2 3; do
  CONCORD_BENCH_PROBE=1 timeout 60 $P/run-gpu.sh concord-bench --backend nccl --ranks 2 $W > "$O/probe$k-ws2.log" 2>&1; echo "ws2 $k rc=$? t+$(( $(date +%s) - t0 ))"
done
for k in 1 2; do
  CONCORD_BENCH_PROBE=1 timeout 60 $P/run-gpu.sh concord-bench --backend nccl --ranks 1 $W > "$O/probe$k-ws1.log" 2>&1; echo "ws1 $k rc=$? t+$(( $(date +%s) - t0 ))"
done
ls /dev/shm
cat "$O/machine.txt"; grep -h "Wrong results" "$O"/probe*.log
