# gpulat7: medians over the sizes of the `# probe` lines (CONCORD_BENCH_PROBE=1), per rank and placement.
# Usage: python3 gpulat7-probe-stats.py LOG...   (issue = the caller's issue path, us per op;
# job - nccl = the progress thread's own work per job)
import sys, re, statistics as st
for f in sys.argv[1:]:
    rows = {}
    for l in open(f):
        m = re.search(r"rank (\d) all_reduce (\S+) (\d+) B: gpu ([\d.]+) launched ([\d.]+) issue ([\d.]+).*job ([\d.]+), nccl ([\d.]+)", l)
        if m:
            rows.setdefault((m[1], m[2]), []).append(tuple(float(x) for x in m.groups()[3:]))
    print("==", f)
    for k, v in sorted(rows.items()):
        med = [st.median(x[i] for x in v) for i in range(5)] + [st.median(x[3] - x[4] for x in v)]
        print(f"  rank {k[0]} {k[1]:12s} n {len(v)}  gpu %.2f launched %.2f issue %.2f job %.2f nccl %.2f job-nccl %.2f" % tuple(med))
