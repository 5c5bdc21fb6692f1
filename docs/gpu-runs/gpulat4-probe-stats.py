# Summarises the table's `# probe` lines (CONCORD_BENCH_PROBE=1; helper gpulat4): per log and
# placement, medians over the sizes of: the GPU time per op, each rank's launched rate, the
# slower rank's launched rate, GPU minus the slower rank's rate, each rank's NCCL section, and
# Concord's own work per job (job minus NCCL) -- the part that is the backend's.
import sys, re, statistics as st, collections
R = re.compile(r"^# probe rank (\d+) all_reduce (\S+) (\d+) B: gpu ([\d.]+) launched ([\d.]+) issue ([\d.]+) .*backend per job: job ([\d.]+), nccl ([\d.]+), event ([\d.]+), track ([\d.]+)(?:, batched ([\d.]+))?$")
for f in sys.argv[1:]:
    d = collections.defaultdict(dict)
    for line in open(f, errors="replace"):
        m = R.match(line.strip())
        if not m:
            continue
        r, pl, size = int(m[1]), m[2], int(m[3])
        gpu, la, iss, job, nc, ev, tr = map(float, m.group(4, 5, 6, 7, 8, 9, 10))
        d[(pl, size)][r] = dict(gpu=gpu, la=la, iss=iss, job=job, nccl=nc, own=job - nc, evtr=ev + tr, b=float(m[11] or 0))
    for pl in ("out-of-place", "in-place"):
        rows = [v for (p, s), v in sorted(d.items()) if p == pl and len(v) >= 1]
        if not rows:
            continue
        both = [v for v in rows if 0 in v and 1 in v]
        med = lambda xs: st.median(xs) if xs else float("nan")
        gpu = med([v[0]["gpu"] if 0 in v else v[1]["gpu"] for v in rows])
        own = med([x["own"] for v in rows for x in v.values()])
        evtr = med([x["evtr"] for v in rows for x in v.values()])
        nccl = [x["nccl"] for v in rows for x in v.values()]
        slow = med([max(v[0]["la"], v[1]["la"]) for v in both])
        gap = med([v[0]["gpu"] - max(v[0]["la"], v[1]["la"]) for v in both])
        fast_gap = med([abs(v[0]["la"] - v[1]["la"]) for v in both])
        b = med([x["b"] for v in rows for x in v.values()])
        print(f"{f.split('/')[-1]:52s} {pl:13s} sizes {len(rows):2d} (both ranks {len(both):2d}): gpu {gpu:5.2f} slower rank launched {slow:5.2f} "
              f"gpu-slower {gap:+5.2f} |rank0-rank1| {fast_gap:4.2f} | nccl med {med(nccl):5.2f} ({min(nccl):.2f}-{max(nccl):.2f}) "
              f"own (job-nccl) {own:4.2f} event+track {evtr:4.2f} batched {b:.2f}")
