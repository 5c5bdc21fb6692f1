import json,collections,re
def load(f):
    d={}
    for l in open(f):
        p=l.split()
        if len(p)==4: d[p[0]]=(float(p[1]),float(p[2])+float(p[3]))
    return d
g=[load('g1.txt'),load('g2.txt')]
r=json.load(open('rep0/conformance.json'))
# case -> group: stall groups. Need which cases are stall: use groups listing: stall groups exist for suite/ws
cases=collections.Counter(); wall=collections.defaultdict(float)
big=lambda i:'n16777217' in i or 'n8388609' in i
for c in r['cases']:
    k=(c['meta']['suite'],c['world_size'])
    if big(c['id']): k=('sizes 64 MiB steps',2)
    cases[k]+=1; wall[k]+=c['seconds']
rows={}
for grp in g[0]:
    m=re.match(r'shm::suite::(\w+)::(stall::)?ws(\d+)$',grp)
    s,st,w=m.group(1),m.group(2),int(m.group(3))
    k=(s,w)
    cpu=[x[grp][1] for x in g if grp in x]
    rows.setdefault(k,[0,0,0]); rows[k][0]+=sum(cpu)/len(cpu); rows[k][1]+=len(cpu)
# 64 MiB: measured separately (two runs, incl. one 2-rank world's spawn)
b64=(1.23+1.73+1.23+1.50)/2
rows[('sizes 64 MiB steps',2)]=[b64,2,0]
rows[('sizes',2)][0]-=b64
tot=sum(v[0] for v in rows.values())
out=sorted(rows.items(), key=lambda kv:-kv[1][0])
print('| suite | ws | cases | CPU (s) | share | case walls (s, loaded) |')
print('|---|---|---|---|---|---|')
acc=0
for (s,w),v in out:
    acc+=v[0]
    print(f'| {s} | {w} | {cases[(s,w)]} | {v[0]:.2f} | {100*v[0]/tot:.1f} % | {wall[(s,w)]:.1f} |')
print('total',round(tot,2), sum(cases.values()))
bw=collections.defaultdict(float); bc=collections.Counter()
for (s,w),v in rows.items(): bw[w]+=v[0]; bc[w]+=cases[(s,w)]
print('by ws:',[(w,bc[w],round(bw[w],2)) for w in sorted(bw)])
