"""The shared part of the gpulat9 / gpulat10 / gpulat11 table stats (imported by
`gpulatN-stats.py`, which run from this folder): each run's bench table (`concord-bench --backend
nccl ... --raw`, one TAG.log per run, TAG = KIND-ROUND) reduced to medians over its sizes, the
per-kind markdown table, and the pairs of a kind against a base kind of the same round."""
import glob, os, re, statistics as st


def parse(path):
    rows = []
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 17 and f[0].isdigit() and f[2] == "float":
            out, inn, rout, rin = float(f[5]), float(f[9]), float(f[13]), float(f[16])
            rows.append((int(f[0]), out, inn, rout, rin))
    return rows


def med(x):
    return st.median(x) if x else float("nan")


def fmt(xs, d=2):
    if not xs:
        return "-"
    return f"{med(xs):.{d}f} ({min(xs):.{d}f}-{max(xs):.{d}f})"


def load(folder, kind_chars="a-z"):
    """`{kind: {round: medians}}` over the folder's logs whose tag is `ws<N>-<kind_chars>+-<round>`."""
    runs = {}
    for p in sorted(glob.glob(os.path.join(folder, "*.log"))):
        tag = os.path.basename(p)[:-4]
        m = re.match(rf"(ws\d-[{kind_chars}]+)-(\d+)$", tag)
        if not m:
            continue
        rows = parse(p)
        if len(rows) < 14:
            print(f"# {tag}: {len(rows)} rows, skipped")
            continue
        kind, rnd = m.group(1), int(m.group(2))
        r = {
            "c_out": med([x[1] for x in rows]), "c_in": med([x[2] for x in rows]),
            "r_out": med([x[3] for x in rows]), "r_in": med([x[4] for x in rows]),
            "q_out": med([x[1] / x[3] for x in rows]), "q_in": med([x[2] / x[4] for x in rows]),
            "w_out": max(x[1] / x[3] for x in rows), "w_in": max(x[2] / x[4] for x in rows),
            "fast": sum(1 for x in rows for v in (x[3], x[4]) if v < 8.5),
        }
        r["met_out"] = r["w_out"] <= 1.2
        r["met_in"] = r["w_in"] <= 1.2
        runs.setdefault(kind, {})[rnd] = r
    return runs


COLS = [("c_out", "Concord us, out"), ("c_in", "Concord us, in"), ("r_out", "raw us, out"), ("r_in", "raw us, in"),
        ("q_out", "median ratio, out"), ("w_out", "worst size, out"), ("q_in", "median ratio, in"), ("w_in", "worst size, in")]


def table(runs):
    """The per-kind markdown table; returns the kinds in order."""
    kinds = sorted(runs)
    print("| | " + " | ".join(f"{k} ({len(runs[k])})" for k in kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for c, name in COLS:
        print(f"| {name} | " + " | ".join(fmt([r[c] for r in runs[k].values()]) for k in kinds) + " |")
    print("| met out / in | " + " | ".join(f"{sum(r['met_out'] for r in runs[k].values())} / {sum(r['met_in'] for r in runs[k].values())}" for k in kinds) + " |")
    print("| raw cells < 8.5 us | " + " | ".join(f"{sum(r['fast'] for r in runs[k].values())} / {28 * len(runs[k])}" for k in kinds) + " |")
    print()
    return kinds


def pairs(runs, kinds, base_name, cols, unit):
    """Each kind but the base against `ws<N>-<base_name>` of the same round: kind - base per column."""
    for k in kinds:
        ws = k.split("-")[0]
        base = runs.get(f"{ws}-{base_name}", {})
        if k.endswith(f"-{base_name}"):
            continue
        for c in cols:
            d = [runs[k][i][c] - base[i][c] for i in runs[k] if i in base]
            if d:
                print(f"  {k} {c}: median {med(d):+.2f}{unit}, lower in {sum(1 for x in d if x < 0)} of {len(d)}")
    print()
