#!/usr/bin/env python3
"""gpulat11 (gpulat10's, unchanged but for this line): the NCCL call's host time, the backend's against the raw loop's, per kind of run.
From CONCORD_BENCH_PROBE=1 logs: the backend's `# probe` lines (per rank, step: the progress
thread's job and its `nccl` section, us per op) and the raw loop's `# probe-raw` lines (its launch
call's host time on the main thread, us per op). NCCL's host time is bimodal on these hosts (a
fast mode near 7 us and a slow one near 10 at 2 ranks), so each is given as quantiles over every
rank x step of every run of the kind: p10 / p25 / median, and the share of values under 8 us.
Usage: gpulat11-probe-stats.py DIR (one TAG.log per run, TAG = KIND-ROUND)."""
import glob, os, re, statistics as st, sys

def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

def fmt(xs):
    if not xs:
        return "-"
    return f"{q(xs, .10):.2f} / {q(xs, .25):.2f} / {st.median(xs):.2f} (n {len(xs)}, <8: {sum(1 for x in xs if x < 8) / len(xs):.0%})"

kinds = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    m = re.match(r"(ws\d-[a-z0-9]+)-(\d+)$", os.path.basename(p)[:-4])
    if not m:
        continue
    k = kinds.setdefault(m.group(1), {"nccl": [], "job": [], "own": [], "gpu": [], "raw": [], "rawgpu": []})
    for line in open(p, errors="replace"):
        b = re.search(r"# probe rank \d \S+ \S+ \d+ B: gpu ([\d.]+) .*job ([\d.]+), nccl ([\d.]+)", line)
        if b:
            gpu, job, nccl = map(float, b.groups())
            k["gpu"].append(gpu); k["job"].append(job); k["nccl"].append(nccl); k["own"].append(job - nccl)
        r = re.search(r"# probe-raw rank \d .*: gpu ([\d.]+) launch ([\d.]+)", line)
        if r:
            k["rawgpu"].append(float(r.group(1))); k["raw"].append(float(r.group(2)))
print("p10 / p25 / median over rank x step, us per op")
for name, v in sorted(kinds.items()):
    print(f"{name}:")
    for c, what in (("nccl", "backend: progress thread's NCCL section"), ("own", "backend: job - NCCL section"),
                    ("job", "backend: progress thread's job"), ("gpu", "backend: GPU time per op"),
                    ("raw", "raw: launch call on the main thread"), ("rawgpu", "raw: GPU time per op")):
        print(f"  {what:42s} {fmt(v[c])}")

# The two modes' centres: the median of the values under 8.6 us (fast) and of those at or above
# 9.3 us (slow), for the backend's NCCL section and the raw launch call (2 ranks).
def cl(xs):
    f = [x for x in xs if x < 8.6]
    s = [x for x in xs if x >= 9.3]
    g = lambda v: f"{st.median(v):.2f} (n {len(v)})" if v else "-"
    return f"fast {g(f)}, slow {g(s)}"
print()
print("mode centres, us per op (fast: values < 8.6, slow: >= 9.3):")
for name, v in sorted(kinds.items()):
    if name.startswith("ws2-"):
        print(f"  {name:12s} backend NCCL section: {cl(v['nccl']):34s} raw launch call: {cl(v['raw'])}")

# raw_pin=N runs (kind ws2-pinN): the raw launch call per CPU (rank r on CPU N + r).
pins = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "ws2-pin*-*.log"))):
    n = int(re.match(r"ws2-pin(\d+)-", os.path.basename(p)).group(1))
    for line in open(p, errors="replace"):
        r = re.search(r"# probe-raw rank (\d) .*launch ([\d.]+)", line)
        if r:
            pins.setdefault(n + int(r.group(1)), []).append(float(r.group(2)))
if pins:
    print()
    print("raw launch call by CPU (raw_pin): p10 / median / max, us per op, share under 8.6 us")
    for c, xs in sorted(pins.items()):
        print(f"  CPU {c:2d}: {q(xs, .10):.2f} / {st.median(xs):.2f} / {max(xs):.2f}  fast {sum(1 for x in xs if x < 8.6) / len(xs):.0%} (n {len(xs)})")
