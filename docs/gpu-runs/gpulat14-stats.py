#!/usr/bin/env python3
"""gpulat14's table stats (table_stats.py's table; pairs against `base` of the same round): per kind
of run (base = header_ahead=0,lean_wait=0; ahead, lean, both = the options on), the median (range)
over the runs of each run's median over the sizes of Concord's and raw's us per op, the median
ratio, the worst size's ratio, runs that met 1.20 x at every size; then kind - base of the same
round; then the worst size's ratio per run, and which size it was.
Usage: gpulat14-stats.py DIR (one TAG.log per run)."""
import glob, os, re, sys

from table_stats import load, pairs, parse, table

runs = load(sys.argv[1], "a-z")
kinds = table(runs)
print("pairs with base of the same round (kind - base; Concord and raw us; ratios):")
pairs(runs, kinds, "base", ("c_out", "c_in", "r_out", "r_in", "q_out", "w_out", "q_in", "w_in"), "")
print("worst size per run (ratio @ bytes), out / in:")
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.log")), key=lambda p: (re.sub(r"-\d+\.log$", "", p), int(re.search(r"-(\d+)\.log$", p).group(1)) if re.search(r"-(\d+)\.log$", p) else 0)):
    rows = parse(p)
    if len(rows) < 14:
        continue
    wo = max(rows, key=lambda x: x[1] / x[3])
    wi = max(rows, key=lambda x: x[2] / x[4])
    print(f"  {os.path.basename(p)[:-4]}: out {wo[1] / wo[3]:.2f} @ {wo[0]} B, in {wi[2] / wi[4]:.2f} @ {wi[0]} B")
