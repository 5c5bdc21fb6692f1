import json,sys,re
ids=[c['id'][5:] for c in json.load(open('/tmp/main11/rep-base1/conformance.json'))['cases']]
hints=json.load(open('/tmp/main11/hints.json'))
removed=set(open(sys.argv[1]).read().split())
names=set(open('/tmp/main11/mutnames.txt').read().split())
aff=[]
for m,hs in sorted(hints.items()):
    hit=set(i for i in ids for h in hs if h in i) if all(hs) else set(ids)
    lost=hit & removed
    if lost:
        aff.append(m); print(m, 'hinted',len(hit),'lost',len(lost), sorted(lost)[:4], '' if m in names else '(legal/other)')
print(len(aff),'affected')
open(sys.argv[2],'w').write('\n'.join(aff))
