#!/usr/bin/env python3
"""gpulat10's table stats (gpulat9's, with `def` as the base of the pairs): per kind of run (the log's tag without its round number), the median
(range) over the runs of each run's median over the sizes of Concord's and raw's us per op, the
median ratio (Concord / raw), the worst size's ratio, and how many runs met 1.20 x at every size;
then pairs of the same round against `base` of the same world size (new - base, Concord us).
Usage: gpulat10-stats.py DIR (the call's untarred logs: one TAG.log per run)."""
import sys

from table_stats import load, med, pairs, table

runs = load(sys.argv[1], "a-z")
kinds = table(runs)
print("pairs with def of the same round (kind - def; Concord and raw us; ratio: the run's median ratio):")
pairs(runs, kinds, "def", ("c_out", "c_in", "r_out", "r_in", "q_out", "w_out"), "")
print("Concord against raw's variants of the same round (def's Concord / the kind's raw, median over sizes):")
for k in kinds:
    ws = k.split("-")[0]
    base = runs.get(f"{ws}-def", {})
    if not k.startswith(f"{ws}-r"):
        continue
    for c, rc in (("c_out", "r_out"), ("c_in", "r_in")):
        d = [base[i][c] / runs[k][i][rc] for i in runs[k] if i in base]
        if d:
            print(f"  def Concord {c} / {k} {rc}: median {med(d):.3f} (range {min(d):.3f}-{max(d):.3f})")
