"""How far the PyTorch profiler's GPU stamps are from the GPU clock mapped
by clockmesh: the profiler's GPU->host conversion error (docs/gpu-clocks.md,
"The profiler's GPU->host conversion").

A Triton kernel writes `%globaltimer` as its first instruction, every
PERIOD ms for DURATION s, under torch.profiler (CUDA activity). Beside it,
`clockmesh gpu-clock --pairs-csv` samples the same GPU's `%globaltimer`
against CLOCK_REALTIME (ping-pong, ~2 us brackets). Per kernel: the
profiler's start stamp (Kineto, host ns) minus the kernel's own globaltimer
reading mapped to CLOCK_REALTIME by a line through the tightest pairs
around it. The difference is the conversion error plus the few hundred ns
between the kernel's start and its first read.

usage: cupti_conversion.py --clockmesh BIN --out DIR [--duration 30] [--period-ms 50] [--device 0]
prints one JSON object (figures); writes DIR/kineto.json and DIR/pairs.csv
"""

import argparse
import bisect
import json
import os
import statistics
import subprocess
import time

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile


@triton.jit
def read_globaltimer(out_ptr):
    t = tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )
    tl.store(out_ptr, t)


def pairs(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            _, host, dev, bracket = line.strip().split(",")
            rows.append((int(dev), int(host), int(bracket)))
    rows.sort()
    return rows


def map_to_host(rows, dev_ns, span_ns=2_000_000_000):
    """CLOCK_REALTIME of globaltimer `dev_ns`: least squares through the
    tightest half of the pairs within +-span of it."""
    i = bisect.bisect_left(rows, (dev_ns - span_ns,))
    j = bisect.bisect_right(rows, (dev_ns + span_ns,))
    near = rows[i:j]
    if len(near) < 8:
        return None
    cut = sorted(r[2] for r in near)[len(near) // 2]
    near = [r for r in near if r[2] <= cut]
    d0, h0 = near[0][0], near[0][1]
    xs = [r[0] - d0 for r in near]
    ys = [r[1] - h0 - (r[0] - d0) for r in near]  # host - device, detrended
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    x = dev_ns - d0
    return h0 + x + my + slope * (x - mx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clockmesh", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--period-ms", type=float, default=50.0)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    csv = os.path.join(a.out, "pairs.csv")
    sampler = subprocess.Popen(
        [a.clockmesh, "gpu-clock", "--device", str(a.device), "--duration", str(a.duration + 10),
         "--period-ms", "20", "--pairs-csv", csv, "--json"],
        stdout=subprocess.DEVNULL,
    )
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    out = torch.zeros(1, dtype=torch.int64, device=dev)
    read_globaltimer[(1,)](out)  # compile outside the trace
    torch.cuda.synchronize()
    time.sleep(4)  # the sampler's first pairs
    readings = []
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        end = time.monotonic() + a.duration
        while time.monotonic() < end:
            read_globaltimer[(1,)](out)
            readings.append(int(out.item()))
            time.sleep(a.period_ms / 1000.0)
    trace = os.path.join(a.out, "kineto.json")
    prof.export_chrome_trace(trace)
    sampler.wait()
    with open(trace) as f:
        doc = json.load(f)
    base = int(doc.get("baseTimeNanoseconds", 0))
    kernels = sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "read_globaltimer" in e.get("name", "")),
        key=lambda e: e["ts"],
    )
    rows = pairs(csv)
    diffs = []
    for e, g in zip(kernels, readings):
        host = map_to_host(rows, g)
        if host is None:
            continue
        kineto_ns = base + round(e["ts"] * 1000)
        diffs.append(kineto_ns - host)
    diffs_sorted = sorted(diffs)
    q = lambda p: diffs_sorted[min(len(diffs_sorted) - 1, int(p * len(diffs_sorted)))] if diffs_sorted else None
    half = len(diffs) // 2
    print(json.dumps({
        "kernels": len(kernels), "readings": len(readings), "scored": len(diffs),
        "pairs": len(rows),
        "kineto_minus_mapped_ns": {"min": q(0), "p01": q(0.01), "p50": q(0.5), "p99": q(0.99), "max": q(1.0)},
        "spread_p99_minus_p01_ns": (q(0.99) - q(0.01)) if diffs else None,
        "median_first_half_ns": statistics.median(diffs[:half]) if half else None,
        "median_second_half_ns": statistics.median(diffs[half:]) if half else None,
        "pairs_bracket_p50_ns": statistics.median(r[2] for r in rows) if rows else None,
    }))


if __name__ == "__main__":
    main()
