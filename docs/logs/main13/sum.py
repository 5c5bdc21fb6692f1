import glob,ast
t=[0]*8
for f in glob.glob('/tmp/main13/cpu/*'):
    v=ast.literal_eval(open(f).read())
    t=[a+b for a,b in zip(t,v)]
n=['prepare','call','check+drop','peer-gen','oracle','-','proc-cpu','calls']
print(' '.join(f"{a}={b/1e9:.3f}" for a,b in zip(n,t) if a!='-' and a!='calls'), 'calls(rank-calls)=', t[7])
