#!/usr/bin/env python3
"""gpulat11's table stats (gpulat10's, with `base` as the base of the pairs and digits allowed in kinds: pin6): per kind of run (the log's tag without its round number), the median
(range) over the runs of each run's median over the sizes of Concord's and raw's us per op, the
median ratio (Concord / raw), the worst size's ratio, and how many runs met 1.20 x at every size;
then pairs of the same round against `base` of the same world size (new - base, Concord us).
Usage: gpulat11-stats.py DIR (the call's untarred logs: one TAG.log per run)."""
import glob, os, re, statistics as st, sys

def parse(path):
    rows = []
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 17 and f[0].isdigit() and f[2] == "float":
            out, inn, rout, rin = float(f[5]), float(f[9]), float(f[13]), float(f[16])
            rows.append((int(f[0]), out, inn, rout, rin))
    return rows

def med(x):
    return st.median(x) if x else float("nan")

def fmt(xs, d=2):
    if not xs:
        return "-"
    return f"{med(xs):.{d}f} ({min(xs):.{d}f}-{max(xs):.{d}f})"

runs = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    tag = os.path.basename(p)[:-4]
    m = re.match(r"(ws\d-[a-z0-9]+)-(\d+)$", tag)
    if not m:
        continue
    rows = parse(p)
    if len(rows) < 14:
        print(f"# {tag}: {len(rows)} rows, skipped")
        continue
    kind, rnd = m.group(1), int(m.group(2))
    r = {
        "c_out": med([x[1] for x in rows]), "c_in": med([x[2] for x in rows]),
        "r_out": med([x[3] for x in rows]), "r_in": med([x[4] for x in rows]),
        "q_out": med([x[1] / x[3] for x in rows]), "q_in": med([x[2] / x[4] for x in rows]),
        "w_out": max(x[1] / x[3] for x in rows), "w_in": max(x[2] / x[4] for x in rows),
        "fast": sum(1 for x in rows for v in (x[3], x[4]) if v < 8.5),
    }
    r["met_out"] = r["w_out"] <= 1.2
    r["met_in"] = r["w_in"] <= 1.2
    runs.setdefault(kind, {})[rnd] = r

cols = [("c_out", "Concord us, out"), ("c_in", "Concord us, in"), ("r_out", "raw us, out"), ("r_in", "raw us, in"),
        ("q_out", "median ratio, out"), ("w_out", "worst size, out"), ("q_in", "median ratio, in"), ("w_in", "worst size, in")]
kinds = sorted(runs)
print("| | " + " | ".join(f"{k} ({len(runs[k])})" for k in kinds) + " |")
print("|---" * (len(kinds) + 1) + "|")
for c, name in cols:
    print(f"| {name} | " + " | ".join(fmt([r[c] for r in runs[k].values()]) for k in kinds) + " |")
print("| met out / in | " + " | ".join(f"{sum(r['met_out'] for r in runs[k].values())} / {sum(r['met_in'] for r in runs[k].values())}" for k in kinds) + " |")
print("| raw cells < 8.5 us | " + " | ".join(f"{sum(r['fast'] for r in runs[k].values())} / {28 * len(runs[k])}" for k in kinds) + " |")
print()
print("pairs with base of the same round (kind - base; Concord and raw us; ratio: the run's median ratio):")
for k in kinds:
    ws = k.split("-")[0]
    base = runs.get(f"{ws}-base", {})
    if k.endswith("-base"):
        continue
    for c in ("c_out", "c_in", "r_out", "r_in", "q_out", "w_out"):
        d = [runs[k][i][c] - base[i][c] for i in runs[k] if i in base]
        if d:
            print(f"  {k} {c}: median {med(d):+.2f}, lower in {sum(1 for x in d if x < 0)} of {len(d)}")
print()
# A pinned kind (pinN: progress_pin=N and raw_pin=N) has no base of its own: its rows above are
# its runs' own ratios (Concord and raw launching from the same vCPUs).
