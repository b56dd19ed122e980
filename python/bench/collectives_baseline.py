"""Python peer for the collectives benchmark (trace/benches/collectives.rs):
what TraceLens-style tools do with PyTorch (Kineto) traces, stdlib only —
`json.load` each rank's whole file, pick its collective events, group them
into instances across ranks and find each instance's last arriver.

The same choices as `clockmesh trace collectives` (trace/src/collectives/
kineto.rs): the best tier a trace has is its calls (NCCL/RCCL kernels, else
the backend's `gloo:`/`nccl:` spans, else the `c10d::` ops;
`record_param_comms` is never a call); an instance is keyed by
(`Process Group Name`, collective name, `Seq`) where the event carries
them, else by (the job's one process group, event name, occurrence); its
last arriver is the latest enter (ties: the later rank in input order) and
its lateness that enter minus the second-latest. Prints `key=value` lines.

usage: collectives_baseline.py RANK_TRACE.json ..."""

import json
import math
import os
import resource
import sys
import time
from collections import defaultdict

BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:", "hccl:")
KERNEL, BACKEND, DISPATCHER = 0, 1, 2


def tier(ev):
    """The event's tier when it is a collective call, else None."""
    name = ev.get("name") or ""
    if name == "record_param_comms":
        return None
    if name.startswith(("ncclDevKernel", "ncclKernel")):
        return KERNEL
    if name.startswith(BACKENDS):
        return BACKEND
    if name.startswith("c10d::"):
        return DISPATCHER
    return None


def epoch_ns(base_ns, us):
    """µs as written → epoch ns (whole µs and fraction apart, as clockmesh)."""
    whole = math.trunc(us)
    return base_ns + int(whole) * 1000 + int(math.floor((us - whole) * 1000 + 0.5))


def rank_calls(path):
    """One rank's job rank (`distributedInfo.rank`) and calls:
    [(key, enter_ns, exit_ns)]."""
    with open(path, "rb") as f:
        doc = json.load(f)
    base = doc.get("baseTimeNanoseconds") or 0
    dist = doc.get("distributedInfo") or {}
    job_rank = dist.get("rank")
    pgs = dist.get("pg_config") or []
    group = (pgs[0].get("pg_desc") or pgs[0].get("pg_name")) if len(pgs) == 1 else "default_pg"
    found = []
    for ev in doc.get("traceEvents", ()):
        if ev.get("ph") != "X" or "ts" not in ev:
            continue
        t = tier(ev)
        if t is not None:
            found.append((t, ev))
    del doc
    if not found:
        return job_rank, []
    best = min(t for t, _ in found)
    calls = []
    occurrences = defaultdict(int)
    evs = sorted((ev for t, ev in found if t == best), key=lambda e: e["ts"])
    for ev in evs:
        enter = epoch_ns(base, ev["ts"])
        exit_ = enter + epoch_ns(0, ev.get("dur", 0.0))
        args = ev.get("args") or {}
        seq, pg = args.get("Seq"), args.get("Process Group Name")
        if seq is not None and pg is not None:
            key = (pg, args.get("Collective name") or ev["name"], int(seq))
        else:
            key = (group, ev["name"], occurrences[ev["name"]])
            occurrences[ev["name"]] += 1
        calls.append((key, enter, exit_))
    return job_rank, calls


def main():
    files = sys.argv[1:]
    t0 = time.perf_counter()
    instances = defaultdict(list)
    total = 0
    ncalls = 0
    job_ranks = []
    for rank, path in enumerate(files):
        total += os.path.getsize(path)
        job_rank, calls = rank_calls(path)
        job_ranks.append(job_rank)
        for key, enter, exit_ in calls:
            instances[key].append((enter, rank, exit_))
            ncalls += 1
    matched = unmatched = late_sum = 0
    last_counts = defaultdict(int)
    for calls in instances.values():
        ranks = {r for _, r, _ in calls}
        if len(calls) != len(files) or len(ranks) != len(files):
            unmatched += 1
            continue
        matched += 1
        calls.sort()
        (last_enter, last, _), (second_enter, _, _) = calls[-1], calls[-2]
        last_counts[last] += 1
        late_sum += last_enter - second_enter
    # The bench's straggler is job rank 2.
    straggler_last = sum(n for i, n in last_counts.items() if job_ranks[i] == 2)
    secs = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"seconds={secs:.3f}")
    print(f"cpu_seconds={usage.ru_utime + usage.ru_stime:.2f}")
    print(f"bytes={total}")
    print(f"peak_rss_kib={usage.ru_maxrss}")
    print(f"calls={ncalls}")
    print(f"matched={matched}")
    print(f"unmatched={unmatched}")
    print(f"straggler_last={straggler_last}")
    print(f"late_sum_ns={late_sum}")


if __name__ == "__main__":
    main()
