import sys, glob, re, statistics as st, os
def parse(f):
    rows=[]
    for line in open(f):
        p=line.split()
        if len(p)>=18 and p[0].isdigit() and int(p[0])<=65536 and p[2]=='float':
            rows.append((int(p[0]), float(p[5]), float(p[9]), float(p[13]), float(p[16]), int(p[8]), int(p[12])))
    return rows
def stats(rows):
    ro=[r[1]/r[3] for r in rows]; ri=[r[2]/r[4] for r in rows]
    return dict(co=st.median(r[1] for r in rows), ci=st.median(r[2] for r in rows), ro=st.median(r[3] for r in rows), ri=st.median(r[4] for r in rows),
        mo=st.median(ro), wo=max(ro), mi=st.median(ri), wi=max(ri), wrong=sum(r[5]+r[6] for r in rows))
d=sys.argv[1]
groups={}
for f in sorted(glob.glob(d+'/ws*.log')):
    tag=os.path.basename(f)[:-4]
    if 'sanity' in tag: continue
    kind=re.sub(r'-\d+$','',tag)
    rows=parse(f)
    if len(rows)!=14: print('skip',tag,len(rows)); continue
    s=stats(rows); groups.setdefault(kind,[]).append(s)
    print(f"{tag:16s} C {s['co']:6.2f}/{s['ci']:6.2f} raw {s['ro']:6.2f}/{s['ri']:6.2f} out med {s['mo']:.2f} worst {s['wo']:.2f} | in med {s['mi']:.2f} worst {s['wi']:.2f} wrong {s['wrong']}")
print()
for k,v in groups.items():
    f=lambda key: f"{st.median(x[key] for x in v):.2f} ({min(x[key] for x in v):.2f}-{max(x[key] for x in v):.2f})"
    print(f"{k:12s} n={len(v)} C out {f('co')} in {f('ci')} | raw out {f('ro')} in {f('ri')} | out med {f('mo')} worst {f('wo')} | in med {f('mi')} worst {f('wi')} | wrong {sum(x['wrong'] for x in v)}")
