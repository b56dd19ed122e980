#!/usr/bin/env python3
"""Run every scenario TOML in SCEN_DIR through BIN (`simulate FILE --json`), niced,
at most P at a time, in member-index order; one JSON per member in OUT_DIR
(skips those already there). Usage: drive.py BIN SCEN_DIR OUT_DIR P"""
import os, re, subprocess, sys, time, json
bin_, scen, out, p = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.makedirs(out, exist_ok=True)
files = sorted(os.listdir(scen), key=lambda f: int(re.match(r"family-\d+-(\d+)-", f).group(1)))
todo = [f for f in files if not os.path.exists(os.path.join(out, f[:-5] + ".json"))]
running = []
def reap(block):
    global running
    while running:
        still = []
        for f, proc, t0 in running:
            rc = proc.poll()
            if rc is None: still.append((f, proc, t0)); continue
            wall = time.time() - t0
            ru = os.wait4(proc.pid, 0)[1] if False else None
            tmp = os.path.join(out, f[:-5] + ".tmp")
            if rc == 0:
                os.rename(tmp, os.path.join(out, f[:-5] + ".json"))
            else:
                os.rename(tmp, os.path.join(out, f[:-5] + ".err"))
            with open(os.path.join(out, "times.tsv"), "a") as t:
                t.write(f"{f}\t{rc}\t{wall:.2f}\n")
        running = still
        if not block or len(running) < p: return
        time.sleep(0.5)
for f in todo:
    reap(True)
    tmp = open(os.path.join(out, f[:-5] + ".tmp"), "w")
    proc = subprocess.Popen(["nice", "-n", "19", bin_, os.path.join(scen, f), "--json"], stdout=tmp, stderr=subprocess.STDOUT)
    running.append((f, proc, time.time()))
    while len(running) >= p:
        reap(False); time.sleep(0.5)
while running:
    reap(False); time.sleep(0.5)
