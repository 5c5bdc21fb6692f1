#!/usr/bin/env python3
"""gpulat9's table stats: per kind of run (the log's tag without its round number), the median
(range) over the runs of each run's median over the sizes of Concord's and raw's us per op, the
median ratio (Concord / raw), the worst size's ratio, and how many runs met 1.20 x at every size;
then pairs of the same round against `base` of the same world size (new - base, Concord us).
Usage: gpulat9-stats.py DIR (the call's untarred logs: one TAG.log per run)."""
import sys

from table_stats import load, med, pairs, table

runs = load(sys.argv[1], "a-z")
kinds = table(runs)
print("pairs with base of the same round (new - base):")
pairs(runs, kinds, "base", ("c_out", "c_in", "r_out", "r_in"), " us")
print("raw variants against the main-thread raw loop of the same round (us, new's own runs: raw_* - new):")
for k in kinds:
    ws = k.split("-")[0]
    ref = runs.get(f"{ws}-new", {})
    if not k.startswith(f"{ws}-r"):
        continue
    for c in ("r_out", "r_in"):
        d = [runs[k][i][c] - ref[i][c] for i in runs[k] if i in ref]
        if d:
            print(f"  {k} {c}: median {med(d):+.2f} us, lower in {sum(1 for x in d if x < 0)} of {len(d)}")
