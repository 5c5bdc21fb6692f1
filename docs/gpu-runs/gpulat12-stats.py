#!/usr/bin/env python3
"""gpulat12's table stats (table_stats.py's table; pairs against `def`, the unpinned run of the same
round): per kind of run (the log's tag without its round number: def, fairN = caller_pin=2,
progress_pin=N, raw_pin=N), the median (range) over the runs of each run's median over the sizes
of Concord's and raw's us per op, the median ratio, the worst size's ratio, runs that met 1.20 x at
every size; then kind - def of the same round.
Usage: gpulat12-stats.py DIR (one TAG.log per run)."""
import sys

from table_stats import load, pairs, table

runs = load(sys.argv[1], "a-z0-9")
kinds = table(runs)
print("pairs with def of the same round (kind - def; Concord and raw us; ratios):")
pairs(runs, kinds, "def", ("c_out", "c_in", "r_out", "r_in", "q_out", "w_out", "q_in", "w_in"), "")
