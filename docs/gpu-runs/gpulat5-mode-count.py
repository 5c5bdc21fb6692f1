# Per kind of run (file name without its run number): how many (size, placement) cells of the
# raw loop ran in its fast mode (< 8.5 us per op), and how many runs met <= 1.20 x at every
# size. Usage: python3 mode-count.py DIR (files ws*-N.log)
import glob, re, os, sys
def parse(f):
    rows = []
    for line in open(f):
        p = line.split()
        if len(p) >= 18 and p[0].isdigit() and int(p[0]) <= 65536 and p[2] == 'float':
            rows.append((int(p[0]), float(p[5]), float(p[9]), float(p[13]), float(p[16])))
    return rows
kinds = {}
for f in sorted(glob.glob(sys.argv[1] + '/ws*.log')):
    k = re.sub(r'-\d+$', '', os.path.basename(f)[:-4]); r = parse(f)
    if len(r) != 14: continue
    fast = sum(1 for x in r if x[3] < 8.5) + sum(1 for x in r if x[4] < 8.5)
    wo = max(x[1] / x[3] for x in r); wi = max(x[2] / x[4] for x in r)
    d = kinds.setdefault(k, [0, 0, 0, 0, 0]); d[0] += 1; d[1] += fast; d[2] += (wo <= 1.2); d[3] += (wi <= 1.2); d[4] += (wo <= 1.2 and wi <= 1.2)
for k, d in kinds.items():
    print(f"{k:12s} runs {d[0]:2d}: raw cells < 8.5 us {d[1]}/{d[0]*28}; worst <= 1.20: out {d[2]}, in {d[3]}, both {d[4]}")
