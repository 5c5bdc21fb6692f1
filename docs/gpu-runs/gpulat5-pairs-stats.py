# Per-window pairs from `# pairs` lines (--interleave with CONCORD_BENCH_PROBE=1): for each run,
# placement and rank, over the sizes: the correlation between the backend's and the reference's
# window times (windows of one size, in the order they ran), each side's spread, and the
# per-window ratio's spread. Usage: python3 pairs-stats.py LOG...
import sys, re, statistics as st
def corr(a, b):
    ma, mb = st.mean(a), st.mean(b)
    va = sum((x - ma) ** 2 for x in a); vb = sum((y - mb) ** 2 for y in b)
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (va * vb) ** 0.5 if va > 0 and vb > 0 else float('nan')
pat = re.compile(r"# pairs rank (\d+) (\S+) (\S+) (\d+) B: backend ([\d. ]+)\| reference ([\d. ]+)")
for f in sys.argv[1:]:
    groups = {}
    for line in open(f):
        m = pat.search(line)
        if not m: continue
        rank, op, pl, size = int(m[1]), m[2], m[3], int(m[4])
        own = [float(x) for x in m[5].split()]; ref = [float(x) for x in m[6].split()]
        groups.setdefault((pl, rank), []).append((size, own, ref))
    print(f"## {f}")
    for (pl, rank), rows in sorted(groups.items()):
        cs = [corr(o, r) for _, o, r in rows]
        spread = lambda v: (max(v) - min(v)) / st.median(v)
        so = [spread(o) for _, o, _ in rows]; sr = [spread(r) for _, _, r in rows]
        ratios = [[x / y for x, y in zip(o, r)] for _, o, r in rows]
        rs = [spread(q) for q in ratios]
        # the median-of-medians ratio vs the median of per-window ratios, per size
        mm = [st.median(o) / st.median(r) for _, o, r in rows]; pw = [st.median(q) for q in ratios]
        print(f"{pl:13s} rank {rank}: corr(backend, ref) over windows median {st.median(cs):+.2f} (range {min(cs):+.2f}..{max(cs):+.2f}); "
              f"spread backend {st.median(so)*100:.0f} %, ref {st.median(sr)*100:.0f} %, per-window ratio {st.median(rs)*100:.0f} %; "
              f"ratio of medians: median {st.median(mm):.2f} worst {max(mm):.2f}; median of per-window ratios: median {st.median(pw):.2f} worst {max(pw):.2f}")
