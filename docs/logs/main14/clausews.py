import re,sys,collections
# usage: clausews.py contract.txt ids_before ids_after
def clauses(f):
    out={}; cur=None
    for l in open(f):
        m=re.match(r'^([a-z][\w.]+)\s+\d+ cases',l)
        if m: cur=m.group(1); continue
        m=re.match(r'^\s+patterns: (.*)$',l)
        if m and cur: out[cur]=[p for p in m.group(1).split(', ')]
    return out
def ids(f): return [l.strip().split(': ')[0].replace('shm::','',1) for l in open(f) if l.strip()]
def cov(cl,ii):
    s=set()
    for c,ps in cl.items():
        for i in ii:
            if any(p in i for p in ps):
                m=re.search(r'::ws(\d+)',i); s.add((c,int(m.group(1)) if m else None))
    return s
cl=clauses(sys.argv[1]); a=cov(cl,ids(sys.argv[2])); b=cov(cl,ids(sys.argv[3]))
print(len(cl),'clauses;',len(a),'(clause, ws) pairs before,',len(b),'after')
print('lost:',sorted(a-b,key=str)); print('gained:',sorted(b-a,key=str))
