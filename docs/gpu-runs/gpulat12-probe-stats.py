#!/usr/bin/env python3
"""gpulat12's probe stats: from CONCORD_BENCH_PROBE=1 logs (one TAG.log per run, TAG = KIND-ROUND),
per kind, the p25 / median / p75 over every rank x step (14 sizes x out / in) of each `# probe`
field (us per job: the progress thread's sections, see `worker::Profile`; gpu / launched / issue:
per op), then the derived `own` = job - nccl, `run_rest` = run - pre - nccl - event - track - defer
(the job's run besides its sections: drops, dispatch) and `job_rest` = job - take - run - after
(the loop's own work around the run), and `per_op` = job + gap (the progress thread's time per op
in a backlog); and the raw loop's launch call (`# probe-raw`). Placements: out / in separately."""
import glob, os, re, statistics as st, sys


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


kinds = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    m = re.match(r"(ws\d-[a-z0-9]+)-(\d+)$", os.path.basename(p)[:-4])
    if not m:
        continue
    for line in open(p, errors="replace"):
        b = re.match(r"# probe rank (\d) \S+ (\S+) (\d+) B: gpu ([\d.]+) launched ([\d.]+) issue ([\d.]+) .*\| backend per job [^)]*\): (.*)", line)
        if b:
            k = kinds.setdefault((m.group(1), b.group(2)), {})
            f = {"gpu": float(b.group(4)), "launched": float(b.group(5)), "issue": float(b.group(6))}
            for kv in b.group(7).split(", "):
                n, v = kv.rsplit(" ", 1)
                f[n] = float(v)
            if "job" in f and "nccl" in f:
                f["own"] = f["job"] - f["nccl"]
            if "run" in f:
                f["run_rest"] = f["run"] - sum(f.get(s, 0) for s in ("pre", "nccl", "event", "track", "defer"))
                f["job_rest"] = f["job"] - f["take"] - f["run"] - f["after"]
            if "gap" in f:
                f["per_op"] = f["job"] + f["gap"]
            for n, v in f.items():
                k.setdefault(n, []).append(v)
        r = re.match(r"# probe-raw rank \d \S+ (\S+) \d+ B .*: gpu ([\d.]+) launch ([\d.]+)", line)
        if r:
            k = kinds.setdefault((m.group(1), r.group(1)), {})
            k.setdefault("raw_gpu", []).append(float(r.group(2)))
            k.setdefault("raw_launch", []).append(float(r.group(3)))
print("p25 / median / p75 over rank x step, us")
for (kind, pl), v in sorted(kinds.items()):
    print(f"{kind} {pl}:")
    for n, xs in v.items():
        print(f"  {n:14s} {q(xs, .25):6.2f} / {st.median(xs):6.2f} / {q(xs, .75):6.2f}  (n {len(xs)})")
