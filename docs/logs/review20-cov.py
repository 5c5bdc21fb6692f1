import re, collections, sys
ids=[l.strip()[5:] for l in open('/tmp/review20-ids.txt') if l.startswith('shm::')]
DT=['i8','u8','i16','u16','i32','u32','i64','u64','f16','bf16','f32','f64']
RED=['sum','avg','product','min','max','premul_sum','band','bor','bxor']
OPS=['all_reduce','reduce_scatter_tensor','reduce','all_gather_into_tensor','broadcast','gather','scatter','all_to_all_single','permute_tensor','send_recv','barrier']
WS=[1,2,3,4,5,6,7,8,16]
# matrix-style ids: [prefix::]op::variant::dtype[::reduce]::wsN[::suffix...]
cov=collections.defaultdict(set)   # (op,dtype,reduce) -> set(ws)
big=collections.defaultdict(set)   # (op,dtype,reduce) -> set(ws) with >4Ki elements
pat=re.compile(r'(?:^|::)('+'|'.join(OPS)+r')::([a-z_]+)::('+'|'.join(DT)+r')(?:::([a-z_0-9().]+))?::ws(\d+)(.*)$')
for i in ids:
    m=pat.search(i)
    if not m: continue
    op,var,dt,red,ws,suf=m.groups()
    if red and red.startswith('ws'): continue
    red=red or '-'
    red=red.split('(')[0]
    ws=int(ws)
    cov[(op,dt,red)].add(ws)
    if 'long' in suf or 'large' in suf: big[(op,dt,red)].add(ws)
# sizes:: ids
for i in ids:
    m=re.match(r'sizes::([a-z_]+)::('+'|'.join(DT)+r')::n(\d+)::ws(\d+)',i)
    if m:
        op,dt,n,ws=m.groups()
        if int(n)>4096: big[(op,dt,'sum' if op in('all_reduce','reduce_scatter_tensor','reduce') else '-')].add(int(ws))
def row(d,op,red):
    out=[]
    for dt in DT:
        s=d.get((op,dt,red),set())
        out.append(dt+':'+(''.join(str(w) if w<10 else 'G' for w in sorted(s)) or '.'))
    return ' '.join(out)
print("== reduce op x dtype: world sizes visited by value cases named by (op,variant,dtype,reduce) (G=16) ==")
for op in ['all_reduce','reduce_scatter_tensor','reduce']:
  for red in RED:
    print(f"{op:22s} {red:10s} {row(cov,op,red)}")
print("== move ops ==")
for op in ['all_gather_into_tensor','broadcast','gather','scatter','all_to_all_single','permute_tensor','send_recv']:
    print(f"{op:22s} {'-':10s} {row(cov,op,'-')}")
print("== >4Ki elements (long/large/sizes ids) ==")
for op in ['all_reduce','reduce_scatter_tensor','reduce']:
  for red in RED:
    r=row(big,op,red)
    if any(not x.endswith(':.') for x in r.split()): print(f"{op:22s} {red:10s} {r}")
for op in ['all_gather_into_tensor','broadcast','gather','scatter','all_to_all_single','permute_tensor','send_recv']:
    print(f"{op:22s} {'-':10s} {row(big,op,'-')}")
