#!/usr/bin/env python3
"""Per-case CPU table from a conformance.json written under CONCORD_CASE_CPU=1 (main15).

usage: cpu_table.py REPORT.json [TOTAL_CPU_S]   (TOTAL: /usr/bin/time's user + sys, optional)
"""
import json, sys, collections

rep = json.load(open(sys.argv[1]))
cases = [c for c in rep["cases"] if c.get("cpu")]
total_time = float(sys.argv[2]) if len(sys.argv) > 2 else None
S = lambda k: sum(c["cpu"][k] for c in cases)
body, ranks, spawn, runner = S("body"), S("ranks"), S("spawn"), S("runner")
proc = rep.get("runner_cpu_seconds") or 0.0
print(f"cases measured: {len(cases)} of {len(rep['cases'])}")
print(f"ranks' body {body:.2f} s | ranks between cases {ranks-body:.2f} s | world spawn (to Ready) {spawn:.2f} s | "
      f"runner lane threads {runner:.2f} s | runner process {proc:.2f} s (other runner threads {proc-runner:.2f} s)")
acc = ranks + spawn + proc
print(f"accounted {acc:.2f} s" + (f" of {total_time:.2f} s (unaccounted: ranks' teardown, exited ranks, {total_time-acc:.2f} s)" if total_time else ""))

def tot(c):
    x = c["cpu"]
    return x["ranks"] + x["spawn"] + x["runner"]

byws = collections.defaultdict(list)
for c in cases:
    byws[c["world_size"]].append(c)
edges = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1e9]
names = ["<1ms", "1-2", "2-5", "5-10", "10-20", "20-50", "50-100", "100-200", "200-500", ">500ms"]
print("\n| ws | cases | total CPU s | body | between | spawn | runner | median ms | " + " | ".join(names) + " |")
print("|---" * (9 + len(names)) + "|")
for ws in sorted(byws):
    cs = byws[ws]
    h = [0] * len(edges)
    for c in cs:
        t = tot(c)
        for i, e in enumerate(edges):
            if t < e:
                h[i] += 1
                break
    ts = sorted(tot(c) for c in cs)
    sb = sum(c["cpu"]["body"] for c in cs); sr = sum(c["cpu"]["ranks"] for c in cs)
    sp = sum(c["cpu"]["spawn"] for c in cs); ru = sum(c["cpu"]["runner"] for c in cs)
    print(f"| {ws} | {len(cs)} | {sum(ts):.2f} | {sb:.2f} | {sr-sb:.2f} | {sp:.2f} | {ru:.2f} | {ts[len(ts)//2]*1e3:.2f} | " + " | ".join(map(str, h)) + " |")

# fixed cost: the cheapest case per world size (the floor every case pays), and barrier cases
print("\nfixed cost per case (ms, ranks' since + runner; min and 10th percentile per ws; barrier::out::u8):")
for ws in sorted(byws):
    cs = byws[ws]
    ts = sorted(c["cpu"]["ranks"] + c["cpu"]["runner"] for c in cs)
    bar = [c for c in cs if c["id"].split("::", 1)[-1].startswith("barrier::")]
    bs = ", ".join(f"{c['id']} body {c['cpu']['body']*1e3:.2f} since {c['cpu']['ranks']*1e3:.2f} runner {c['cpu']['runner']*1e3:.2f}" for c in bar[:2])
    print(f"  ws{ws}: min {ts[0]*1e3:.2f}, p10 {ts[len(ts)//10]*1e3:.2f} ms | {bs}")

print("\ntop 30 cases by CPU (s): total = ranks (since previous outcome) + spawn + runner")
print("| case | ws | total | body | between | spawn | runner | wall |")
print("|---|---|---|---|---|---|---|---|")
for c in sorted(cases, key=tot, reverse=True)[:30]:
    x = c["cpu"]
    print(f"| `{c['id']}` | {c['world_size']} | {tot(c):.3f} | {x['body']:.3f} | {x['ranks']-x['body']:.3f} | {x['spawn']:.3f} | {x['runner']:.3f} | {c['seconds']:.3f} |")

bysuite = collections.defaultdict(lambda: [0, 0.0])
for c in cases:
    k = (c["meta"]["suite"], c["world_size"])
    bysuite[k][0] += 1; bysuite[k][1] += tot(c)
print("\ntop 25 suite x ws slices (cases, CPU s):")
for k, v in sorted(bysuite.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"  {k[0]} ws{k[1]}: {v[0]} cases, {v[1]:.2f} s")
