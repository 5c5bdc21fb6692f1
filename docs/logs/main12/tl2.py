import sys, collections
rows=[]
for l in open(sys.argv[1]):
    if not l.startswith('TL '): continue
    _,li,kind,a,b,load,ws,id_=l.split()
    rows.append((int(li),kind,float(a),float(b),load,int(ws),id_))
end=max(r[3] for r in rows)
# per-second busy of cpu lanes, and ws in flight
step=1.0
t=0
while t<end:
    out=[]
    for li in (0,1):
        busy=0; wss=collections.Counter()
        for r in rows:
            if r[0]!=li: continue
            o=min(r[3],t+step)-max(r[2],t)
            if o>0: busy+=o; wss[r[5]]+=o
        out.append(f"L{li} {busy:4.2f} "+",".join(f"ws{w}:{v:.2f}" for w,v in sorted(wss.items(),key=lambda x:-x[1])[:3]))
    nst=sum(1 for r in rows if r[1]=='stall' and r[2]<t+step and r[3]>t)
    print(f"{t:5.1f} stall={nst:2} | "+" | ".join(out))
    t+=step
# gaps
for li in (0,1):
    rs=sorted([r for r in rows if r[0]==li],key=lambda r:r[2])
    gaps=[(rs[i+1][2]-rs[i][3],rs[i][3],rs[i][6],rs[i+1][6]) for i in range(len(rs)-1)]
    print("lane",li,"sum gaps",sum(g[0] for g in gaps))
    for g in sorted(gaps,reverse=True)[:8]: print("   gap %.3f at %.2f after %s before %s"%g)
