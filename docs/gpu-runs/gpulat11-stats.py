#!/usr/bin/env python3
"""gpulat11's table stats (gpulat10's, with `base` as the base of the pairs and digits allowed in kinds: pin6): per kind of run (the log's tag without its round number), the median
(range) over the runs of each run's median over the sizes of Concord's and raw's us per op, the
median ratio (Concord / raw), the worst size's ratio, and how many runs met 1.20 x at every size;
then pairs of the same round against `base` of the same world size (new - base, Concord us).
Usage: gpulat11-stats.py DIR (the call's untarred logs: one TAG.log per run)."""
import sys

from table_stats import load, pairs, table

runs = load(sys.argv[1], "a-z0-9")
kinds = table(runs)
print("pairs with base of the same round (kind - base; Concord and raw us; ratio: the run's median ratio):")
pairs(runs, kinds, "base", ("c_out", "c_in", "r_out", "r_in", "q_out", "w_out"), "")
# A pinned kind (pinN: progress_pin=N and raw_pin=N) has no base of its own: its rows above are
# its runs' own ratios (Concord and raw launching from the same vCPUs).
