# Pools the table runs of several calls (helper gpulat4): per kind (ws1/ws2 x base/new), the
# median and range over runs of the per-run median ratio and worst size, Concord's and raw's us
# per op; and base-new pairs (run i of each, same call, back to back): the median change.
import sys, glob, os, re, statistics as st
sys.path.insert(0, os.path.dirname(__file__))
def parse(f):
    rows = []
    for line in open(f):
        p = line.split()
        if len(p) >= 18 and p[0].isdigit() and int(p[0]) <= 65536 and p[2] == 'float':
            rows.append((int(p[0]), float(p[5]), float(p[9]), float(p[13]), float(p[16]), int(p[8]), int(p[12])))
    return rows
def stats(rows):
    ro = [r[1] / r[3] for r in rows]; ri = [r[2] / r[4] for r in rows]
    return dict(co=st.median(r[1] for r in rows), ci=st.median(r[2] for r in rows), ro=st.median(r[3] for r in rows),
                ri=st.median(r[4] for r in rows), mo=st.median(ro), wo=max(ro), mi=st.median(ri), wi=max(ri),
                wrong=sum(r[5] + r[6] for r in rows), met_o=max(ro) <= 1.2, met_i=max(ri) <= 1.2)
runs = {}
for d in sys.argv[1:]:
    for f in sorted(glob.glob(d + '/ws*.log')):
        tag = os.path.basename(f)[:-4]
        m = re.match(r'(ws\d-\w+)-(\d+)$', tag)
        rows = parse(f)
        if not m or len(rows) != 14:
            continue
        runs[(d, m[1], int(m[2]))] = stats(rows)
kinds = sorted({k[1] for k in runs})
for kind in kinds:
    v = [s for k, s in runs.items() if k[1] == kind]
    f = lambda key: f"{st.median(x[key] for x in v):.2f} ({min(x[key] for x in v):.2f}-{max(x[key] for x in v):.2f})"
    print(f"{kind:12s} n={len(v):2d} C out {f('co')} in {f('ci')} | raw out {f('ro')} in {f('ri')} | out med {f('mo')} worst {f('wo')} "
          f"| in med {f('mi')} worst {f('wi')} | every size <= 1.2: out {sum(x['met_o'] for x in v)}, in {sum(x['met_i'] for x in v)} | wrong {sum(x['wrong'] for x in v)}")
for ws in ('ws1', 'ws2'):
    pairs = [(runs[k], runs[(k[0], ws + '-new', k[2])]) for k in runs if k[1] == ws + '-base' and (k[0], ws + '-new', k[2]) in runs]
    if not pairs:
        continue
    for key, name in (('co', 'Concord us out'), ('ci', 'Concord us in'), ('ro', 'raw us out'), ('mo', 'median ratio out'), ('mi', 'median ratio in'), ('wo', 'worst out'), ('wi', 'worst in')):
        dd = [n[key] - b[key] for b, n in pairs]
        print(f"{ws} pairs n={len(pairs)} new - base {name:18s}: median {st.median(dd):+.2f} (range {min(dd):+.2f} .. {max(dd):+.2f}), new lower in {sum(x < 0 for x in dd)} of {len(dd)}")
