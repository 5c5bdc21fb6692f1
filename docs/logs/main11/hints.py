import re,glob,json,sys
specs={}
unresolved=[]
consts={}
src={f:open(f).read() for f in glob.glob('/work/wt-main11/mutants/src/*.rs')}
strre=re.compile(r'"((?:[^"\\]|\\.)*)"')
for f,t in src.items():
    for m in re.finditer(r'const ([A-Z0-9_]+): &\[&str\] = &\[(.*?)\];',t,re.S):
        consts[m.group(1)]=strre.findall(m.group(2))
for f,t in src.items():
    for m in re.finditer(r'\bspec(?:::<[^(]*?>)?\(',t):
        i=m.end(); depth=1; j=i
        while depth:
            c=t[j]
            if c=='"':
                j+=1
                while t[j]!='"':
                    if t[j]=='\\': j+=1
                    j+=1
            elif c=='(' : depth+=1
            elif c==')': depth-=1
            j+=1
        body=t[i:j-1]
        names=strre.findall(body)
        if not names: continue
        name=names[0]
        # last &[ ... ]
        k=body.rfind('&[')
        if k<0:
            unresolved.append((f,name,body[-80:])); continue
        arr=body[k+2:body.rfind(']')]
        hs=strre.findall(arr)
        if not hs and arr.strip():
            cn=arr.strip()
            hs=consts.get(cn)
            if hs is None: unresolved.append((f,name,arr)); continue
        specs[name]=hs
json.dump(specs,open('/tmp/main11/hints.json','w'),indent=0)
print(len(specs),'specs; unresolved',len(unresolved))
for u in unresolved: print(u)
