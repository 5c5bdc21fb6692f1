#!/usr/bin/env python3
"""gpulat13's table stats (gpulat11's, through table_stats.py): per kind (ws1-base, ws1-new) the
median (range) over the runs of each run's median over the sizes, then the pairs of a round
(new - base), in place first (the no-op's column). Usage: gpulat13-stats.py DIR."""
import sys

from table_stats import load, pairs, table

runs = load(sys.argv[1])
kinds = table(runs)
print("pairs with base of the same round (new - base; Concord and raw us; ratios):")
pairs(runs, kinds, "base", ("c_in", "r_in", "q_in", "w_in", "c_out", "q_out"), "")
