#!/usr/bin/env python3
"""Per-class table of the family run on both commits (members done on both).
Usage: analyze.py OUT_NOW OUT_577 CONVERT_LOG MD JSON [MAX_INDEX] [TITLE]
(MAX_INDEX: only members with index < it, e.g. 240 for the family --count 240)"""
import os, re, sys, json
now_d, old_d, convlog, md_p, js_p = sys.argv[1:6]
MAXI = int(sys.argv[6]) if len(sys.argv) > 6 else 10**9
TITLE = sys.argv[7] if len(sys.argv) > 7 else "Family seed 1"
idx = lambda n: int(re.match(r"family-\d+-(\d+)-", n).group(1))
CLASSES = [f"{s}/{t}/{l}" for s in ("nic", "software") for t in ("heavy", "light") for l in ("short", "medium", "long")]
GOAL = {"nic": 20.0, "software": 300.0}
def q(vals, p):  # nearest rank, as clockmesh_sim::report::quantiles
    v = sorted(vals); return v[round((len(v) - 1) * p)] if v else float("nan")
def load(d):
    r = {}
    for f in os.listdir(d):
        if f.endswith(".json"):
            j = json.load(open(os.path.join(d, f)))
            r[f[:-5]] = {"p99_ns": j["abs_error_ns"]["p99"], "aged_p99_ns": j["aged_abs_error_ns"]["p99"],
                         "p50_ns": j["abs_error_ns"]["p50"], "coverage": j["coverage"],
                         "aged_coverage": j["aged_coverage"], "median_bound_ns": j.get("median_bound_ns"),
                         "results": j["results"], "windows": j["windows"],
                         "nodes_without_result": j.get("nodes_without_result"), "wall_ms": j.get("wall_ms")}
    return r
now, old = load(now_d), load(old_d)
conv = json.load(open(convlog))
errs = {side: sorted(f[:-4] for f in os.listdir(d) if f.endswith(".err")) for side, d in (("now", now_d), ("577a555", old_d))}
both = sorted((n for n in set(now) & set(old) if idx(n) < MAXI), key=idx)
kept = [n for n in conv["kept"] if idx(n) < MAXI]; excl = [n for n in conv["excluded_isolation"] if idx(n) < MAXI]
cls = lambda n: "/".join(re.match(r"family-\d+-\d+-(\w+)-(\w+)-(\w+)$", n).groups())
def summ(rows, stamps):
    p = [r["p99_ns"] for r in rows]; a = [r["aged_p99_ns"] for r in rows]
    return {"n": len(rows), "p99": [q(p, .5), q(p, .9), max(p)], "aged": [q(a, .5), q(a, .9), max(a)],
            "min_cov": min(r["coverage"] for r in rows), "min_aged_cov": min(r["aged_coverage"] for r in rows),
            "within_goal": sum(r["p99_ns"] <= GOAL[stamps] for r in rows),
            "aged_within_1_5x": sum(r["aged_p99_ns"] <= 1.5 * r["p99_ns"] for r in rows)}
table, worse, worse_aged = {}, [], []
for c in CLASSES:
    ms = [n for n in both if cls(n) == c]
    if not ms: continue
    s = c.split("/")[0]
    t = {"members": ms, "now": summ([now[m] for m in ms], s), "577a555": summ([old[m] for m in ms], s),
         "paired_now_worse_p99": sum(now[m]["p99_ns"] > 1.1 * old[m]["p99_ns"] for m in ms),
         "paired_now_better_p99": sum(now[m]["p99_ns"] < old[m]["p99_ns"] / 1.1 for m in ms)}
    table[c] = t
    if t["now"]["p99"][0] > 1.1 * t["577a555"]["p99"][0]: worse.append(c)
    if t["now"]["aged"][0] > 1.1 * t["577a555"]["aged"][0]: worse_aged.append(c)
f1 = lambda x: f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"
L = []
L.append(f"{TITLE}: {len(kept)} members kept ({len(excl)} with an isolation excluded), "
         f"{len(both)} run on both commits (now: {len(now)}, 577a555: {len(old)}; errors now {len(errs['now'])}, 577a555 {len(errs['577a555'])}).\n")
L.append("p99 |error| at result and aged p99 in ns as p50 / p90 / max over the class's members; cov = min coverage at result / aged; "
         "goal = members with p99 at result <= goal (NIC 20 ns, software 300 ns); 1.5x = aged p99 <= 1.5 x own p99 at result; "
         "paired = members where now's p99 is >10 % worse / >10 % better than 577a555's.\n")
L.append("| class | n | commit | p99 at result p50 / p90 / max | aged p99 p50 / p90 / max | min cov (result / aged) | within goal | aged <= 1.5x | median p99 now/577 | paired worse / better |")
L.append("|---|---|---|---|---|---|---|---|---|---|")
for c, t in table.items():
    for side in ("577a555", "now"):
        s = t[side]
        ratio = t["now"]["p99"][0] / t["577a555"]["p99"][0] if t["577a555"]["p99"][0] else float("nan")
        extra = (f"{ratio:.2f}" + (" **worse**" if c in worse else ""), f"{t['paired_now_worse_p99']} / {t['paired_now_better_p99']}") if side == "now" else ("", "")
        L.append(f"| {c if side == '577a555' else ''} | {s['n']} | {side} | {' / '.join(f1(x) for x in s['p99'])} | "
                 f"{' / '.join(f1(x) for x in s['aged'])} | {s['min_cov']:.4f} / {s['min_aged_cov']:.4f} | "
                 f"{s['within_goal']}/{s['n']} | {s['aged_within_1_5x']}/{s['n']} | {extra[0]} | {extra[1]} |")
L.append("")
L.append(f"Classes where now's median p99 at result is > 10 % worse than 577a555's: {', '.join(worse) or 'none'}.")
L.append(f"Classes where now's median aged p99 is > 10 % worse: {', '.join(worse_aged) or 'none'}.")
open(md_p, "w").write("\n".join(L) + "\n")
json.dump({"classes": table, "worse_p99_median": worse, "worse_aged_median": worse_aged,
           "members": {m: {"class": cls(m), "now": now[m], "577a555": old[m]} for m in both},
           "only_now": sorted(set(now) - set(old)), "only_577a555": sorted(set(old) - set(now)),
           "errors": errs, "conversion": conv}, open(js_p, "w"), indent=1)
print("\n".join(L))
