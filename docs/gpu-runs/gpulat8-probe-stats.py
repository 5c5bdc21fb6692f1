# gpulat8: medians over the sizes of the `# probe` lines' sections (CONCORD_BENCH_PROBE=1), per
# rank and placement, and the rest of `job` (job - every other section: the job's own drop and
# dispatch). Usage: python3 gpulat8-probe-stats.py LOG...
import sys, re, statistics as st
for f in sys.argv[1:]:
    rows = {}
    for l in open(f):
        m = re.search(r"# probe rank (\d) all_reduce (\S+) (\d+) B: gpu ([\d.]+) launched ([\d.]+) issue ([\d.]+).*\): (.*)$", l)
        if not m:
            continue
        secs = dict((k, float(v)) for k, v in (p.rsplit(" ", 1) for p in m[7].split(", ")))
        secs.update(gpu=float(m[4]), launched=float(m[5]), issue=float(m[6]))
        secs["rest"] = secs["job"] - sum(secs.get(k, 0) for k in ("nccl", "event", "track", "take", "pre", "defer", "after"))
        secs["own"] = secs["job"] - secs["nccl"]
        rows.setdefault((m[1], m[2]), []).append(secs)
    print("==", f)
    keys = ["gpu", "launched", "issue", "job", "nccl", "own", "take", "pre", "defer", "after", "event", "track", "rest", "batched_share"]
    for k, v in sorted(rows.items()):
        print(f"  rank {k[0]} {k[1]:12s} n {len(v)} " + " ".join(f"{x} {st.median(r.get(x, float('nan')) for r in v):.2f}" for x in keys))
