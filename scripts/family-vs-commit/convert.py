#!/usr/bin/env python3
"""Convert the family's scenario TOMLs (written by today's
`bench_accuracy --seed 1 --count 240 --write-scenarios DIR`) for 577a555's
`simulate`.  Usage: convert.py SRC_DIR DST_DIR_577 DST_DIR_NOW LOG.json

* members with an [isolation] table are excluded from BOTH sides (577a555 has
  no isolation; it is the member's essential fault);
* [agent]: only `degree` is the member's own (family.rs: "every member runs
  the agent's shipped settings except the degree"); the other keys are
  today's shipped values written out, so they are dropped for 577a555, which
  then runs at ITS shipped defaults (probe_window_s 4, cadence 100 ms,
  spacing 100 us); `holdover_max_bound_ns` does not exist at 577a555;
* length: today's window is 1 s, 577a555's is 4 s; the member's scored length
  in seconds is kept: windows_577 = round(windows / 4) (>= 1), and a leader
  change's `after_window` = floor(after_window / 4) (the change happens at the
  577a555 window boundary at or before the same second); warm-up is 8 s on
  both (2 x 4 s / 8 x 1 s);
* the file for today's side is the source file unchanged (non-isolation members).
"""
import os, re, sys, json, tomllib, shutil
src, d577, dnow, logp = sys.argv[1:5]
for d in (d577, dnow):
    os.makedirs(d, exist_ok=True)
OLD_WINDOW_S, NEW_WINDOW_S = 4, 1
log = {"excluded_isolation": [], "kept": [], "dropped_agent_keys": {}, "rescaled": {}}
for f in sorted(os.listdir(src), key=lambda f: int(re.match(r"family-\d+-(\d+)-", f).group(1))):
    text = open(os.path.join(src, f)).read()
    doc = tomllib.loads(text)
    name = f[:-5]
    if "isolation" in doc:
        log["excluded_isolation"].append(name); continue
    assert doc["agent"]["probe_window_s"] == NEW_WINDOW_S
    log["kept"].append(name)
    shutil.copy(os.path.join(src, f), os.path.join(dnow, f))
    out, section = [], None
    dropped = []
    w_new = doc["windows"]; w_old = max(1, round(w_new * NEW_WINDOW_S / OLD_WINDOW_S))
    for line in text.splitlines():
        m = re.match(r"\[(\w+)\]", line)
        if m: section = m.group(1)
        km = re.match(r"(\w+) = ", line)
        if section == "agent" and km and km.group(1) != "degree":
            dropped.append(line); continue
        if section is None and km and km.group(1) == "windows":
            line = f"windows = {w_old}"
        if section == "leader_change" and km and km.group(1) == "after_window":
            a = doc["leader_change"]["after_window"]
            line = f"after_window = {min(a * NEW_WINDOW_S // OLD_WINDOW_S, w_old - 1)}"
        out.append(line)
    log["dropped_agent_keys"][name] = dropped
    log["rescaled"][name] = {"windows": [w_new, w_old],
        "leader_change_after_window": None if "leader_change" not in doc else
            [doc["leader_change"]["after_window"], min(doc["leader_change"]["after_window"] // 4, w_old - 1)]}
    open(os.path.join(d577, f), "w").write("\n".join(out) + "\n")
json.dump(log, open(logp, "w"), indent=1)
print(len(log["kept"]), "kept,", len(log["excluded_isolation"]), "excluded (isolation)")
