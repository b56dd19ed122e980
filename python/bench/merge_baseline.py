"""Python baseline for the trace-merge benchmark (agent/benches/trace_merge.rs):
the same merge done the obvious way with the `protobuf` package — parse
each XSpace, shift every XLine.timestamp_ns, set profile_start_time, and
serialize. Prints seconds and peak RSS as `key=value` lines.

usage: merge_baseline.py OUTDIR HOST=OFFSET_NS:FILE ..."""

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


def main():
    XSpace = xspace_class()
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for arg in sys.argv[2:]:
        host_off, path = arg.split(":", 1)
        host, off = host_off.split("=")
        jobs.append((host, int(off), path))
    t0 = time.perf_counter()
    spaces = []
    total = 0
    for host, off, path in jobs:
        data = pathlib.Path(path).read_bytes()
        total += len(data)
        space = XSpace.FromString(data)
        env = next(p for p in space.planes if p.name == "Task Environment")
        start = stat_ref(env, "profile_start_time").uint64_value
        spaces.append((host, off, space, env, start))
        del data
    origin = min(start + off for _, off, _, _, start in spaces)
    for host, off, space, env, start in spaces:
        shift = start + off - origin
        for plane in space.planes:
            for line in plane.lines:
                t = line.timestamp_ns
                line.timestamp_ns = t + off - origin if abs(t) >= ABSOLUTE else t + shift
        stat_ref(env, "profile_start_time").uint64_value = origin
        (out_dir / f"{host}.xplane.pb").write_bytes(space.SerializeToString())
    secs = time.perf_counter() - t0
    print(f"seconds={secs:.3f}")
    print(f"bytes={total}")
    print(f"peak_rss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")


if __name__ == "__main__":
    main()
