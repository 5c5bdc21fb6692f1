# gpulat6: per-round pairs (base vs each variant, same round, alternating) and "met" counts.
# Usage: python3 gpulat6-pair-stats.py DIR  (DIR holds ws{1,2}-{kind}-{i}.log tables)
import sys, glob, os, re, statistics as st
def parse(f):
    rows = []
    for line in open(f):
        p = line.split()
        if len(p) >= 18 and p[0].isdigit() and int(p[0]) <= 65536 and p[2] == 'float':
            rows.append((int(p[0]), float(p[5]), float(p[9]), float(p[13]), float(p[16])))
    return rows
d = sys.argv[1]
runs = {}
for f in glob.glob(d + '/ws*.log'):
    m = re.match(r'(ws\d)-(\w+)-(\d+)\.log', os.path.basename(f))
    if not m: continue
    rows = parse(f)
    if len(rows) != 14: continue
    runs[(m[1], m[2], int(m[3]))] = rows
for ws in ('ws2', 'ws1'):
    kinds = sorted({k for (w, k, _) in runs if w == ws})
    for k in kinds:
        rs = [runs[x] for x in sorted(runs) if x[0] == ws and x[1] == k]
        met_o = sum(all(r[1] / r[3] <= 1.2 for r in rows) for rows in rs)
        met_i = sum(all(r[2] / r[4] <= 1.2 for r in rows) for rows in rs)
        fast = sum(r[3] < 8.5 for rows in rs for r in rows)
        print(f"{ws} {k:7s} runs {len(rs)} met out/in {met_o}/{met_i}  raw out cells < 8.5 us: {fast}/{14*len(rs)}")
    for k in kinds:
        if k == 'base': continue
        dc_o, dc_i, dr_o = [], [], []
        for (w, kk, i), rows in runs.items():
            if w != ws or kk != k or (ws, 'base', i) not in runs: continue
            b = runs[(ws, 'base', i)]
            dc_o.append(st.median(r[1] for r in rows) - st.median(r[1] for r in b))
            dc_i.append(st.median(r[2] for r in rows) - st.median(r[2] for r in b))
            dr_o.append(st.median(r[1] / r[3] for r in rows) - st.median(r[1] / r[3] for r in b))
        if dc_o:
            print(f"{ws} {k} - base, {len(dc_o)} pairs: Concord us out {st.median(dc_o):+.2f} (lower in {sum(x < 0 for x in dc_o)}), "
                  f"in {st.median(dc_i):+.2f} (lower in {sum(x < 0 for x in dc_i)}); median ratio out {st.median(dr_o):+.2f}")
