import sys, collections
rows=[]
for l in open(sys.argv[1]):
    if not l.startswith('TL '): continue
    _,li,kind,a,b,load,ws,id_=l.split()
    rows.append((int(li),kind,float(a),float(b),load,int(ws),id_))
end=max(r[3] for r in rows)
print("job end", end)
lanes=collections.defaultdict(list)
for r in rows: lanes[r[0]].append(r)
for li in sorted(lanes):
    rs=lanes[li]
    busy=sum(r[3]-r[2] for r in rs)
    print(f"lane {li:2} {rs[0][1]:5} n={len(rs):5} start={min(r[2] for r in rs):7.2f} end={max(r[3] for r in rs):7.2f} busy={busy:7.2f} loads={collections.Counter(r[4] for r in rs)}", (rs[0][6] if len(rs)<3 else ''))
# stall cases
st=[r for r in rows if r[4]=='Stall']
print("stall cases", len(st), "sum", sum(r[3]-r[2] for r in st))
# longest cases
print("longest 40 cases:")
for r in sorted(rows,key=lambda r:r[2]-r[3])[:40]:
    print(f"  {r[3]-r[2]:6.2f} [{r[2]:6.2f}-{r[3]:6.2f}] lane{r[0]} {r[4]} {r[6]}")
# cpu lane tail: what happened in last 10 s
print("last cases on cpu lanes:")
for li in sorted(lanes):
    rs=lanes[li]
    if rs[0][1]=='cpu':
        for r in rs[-5:]: print(f"  lane{li} {r[2]:6.2f}-{r[3]:6.2f} {r[4]} {r[6]}")
