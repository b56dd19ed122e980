"""Python baseline for the trace-merge benchmark (agent/benches/trace_merge.rs):
the same merge done the obvious way with the `protobuf` package — parse
each XSpace, shift every XLine.timestamp_ns (or, with a drift, place every
event start and end at its own time: offset + drift x (t - anchor)), set
profile_start_time, and serialize. Prints seconds and peak RSS as
`key=value` lines.

usage: merge_baseline.py OUTDIR HOST=OFFSET_NS[,DRIFT_PPB,ANCHOR_NS]:FILE ..."""

import pathlib
import resource
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from xplane_proto import xspace_class  # noqa: E402

ABSOLUTE = 10**18


def stat_ref(plane, name):
    ids = [k for k, m in plane.stat_metadata.items() if m.name == name]
    return next(s for s in plane.stats if s.metadata_id in ids)


def offset_at(off_ns, drift, t_ps):
    """global - local (ps) at local t_ps: offset + drift_ppb x (t - anchor)."""
    drift_ppb, anchor_ns = drift
    return off_ns * 1000 + (t_ps - anchor_ns * 1000) * drift_ppb // 10**9


def off0(jobs, host):
    return next(off for h, off, _, _ in jobs if h == host)


def place_events(line, start, off, drift, origin):
    """Every event start and end through the map at its own time; the line
    starts at its earliest placed event (as clockmesh writes it)."""
    t = line.timestamp_ns
    base = (t if abs(t) >= ABSOLUTE else t + start) * 1000
    placed = []
    for ev in line.events:
        s = base + ev.offset_ps
        e = s + ev.duration_ps
        placed.append((s + offset_at(off, drift, s), e + offset_at(off, drift, e)))
    if not placed:
        g = base + offset_at(off, drift, base)
        line.timestamp_ns = g // 1000 - origin
        return
    line_start = min(min(p[0] for p in placed), base + offset_at(off, drift, base))
    new_ts = line_start // 1000 - origin
    for ev, (s, e) in zip(line.events, placed):
        ev.offset_ps = s - (new_ts + origin) * 1000
        ev.duration_ps = e - s
    line.timestamp_ns = new_ts


def main():
    XSpace = xspace_class()
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for arg in sys.argv[2:]:
        host_off, path = arg.split(":", 1)
        host, spec = host_off.split("=")
        off, *drift = spec.split(",")
        jobs.append((host, int(off), path, (int(drift[0]), int(drift[1])) if drift else None))
    t0 = time.perf_counter()
    spaces = []
    total = 0
    for host, off, path, drift in jobs:
        data = pathlib.Path(path).read_bytes()
        total += len(data)
        space = XSpace.FromString(data)
        env = next(p for p in space.planes if p.name == "Task Environment")
        start = stat_ref(env, "profile_start_time").uint64_value
        if drift:
            off = offset_at(off, drift, start * 1000) // 1000
        spaces.append((host, off, space, env, start, drift))
        del data
    origin = min(start + off for _, off, _, _, start, _ in spaces)
    for host, off, space, env, start, drift in spaces:
        shift = start + off - origin
        for plane in space.planes:
            for line in plane.lines:
                t = line.timestamp_ns
                if drift:
                    place_events(line, start, off0(jobs, host), drift, origin)
                else:
                    line.timestamp_ns = t + off - origin if abs(t) >= ABSOLUTE else t + shift
        stat_ref(env, "profile_start_time").uint64_value = origin
        (out_dir / f"{host}.xplane.pb").write_bytes(space.SerializeToString())
    secs = time.perf_counter() - t0
    print(f"seconds={secs:.3f}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"cpu_seconds={usage.ru_utime + usage.ru_stime:.2f}")
    print(f"bytes={total}")
    print(f"peak_rss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")


if __name__ == "__main__":
    main()
