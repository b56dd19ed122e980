"""One rank of the end-to-end test's PyTorch run (tests/tests/end_to_end.rs).

A real torch.distributed program (gloo over the test hosts' network)
profiled for DURATION seconds with torch.profiler and
clockmesh.torch_profiler.record, run under the skew shim like jax_host.py.
Each step is a record_function ("cm_marker_<i>") after a barrier,
bracketed by the true CLOCK_REALTIME read with a raw syscall.

usage: torch_host.py RANK WORLD MASTER_ADDR PORT DURATION_S OFFSETS HOST OUT_DIR
writes OUT_DIR/<HOST>.pt.trace.json and OUT_DIR/markers.json
"""

import datetime
import json
import os
import sys
import time

from jax_host import true_realtime_ns


def main():
    rank, world, addr, port, duration, offsets, host, out = sys.argv[1:9]
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import clockmesh.torch_profiler as cmt

    # The host name is the node's name, which resolves nowhere: gloo must
    # be told the interface (GLOO_SOCKET_IFNAME, set by the test).
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=int(rank),
        world_size=int(world),
        timeout=datetime.timedelta(seconds=120),
    )
    x = torch.ones(64, 64)
    markers = []
    with profile(activities=[ProfilerActivity.CPU]) as prof, cmt.record(prof, offsets, host):
        end = time.monotonic() + float(duration)
        i = 0
        while True:
            # Every rank runs the same number of steps: rank 0 decides.
            go = torch.tensor([1 if time.monotonic() < end else 0])
            dist.broadcast(go, 0)
            if not go.item():
                break
            name = f"cm_marker_{i}"
            before = true_realtime_ns()
            with torch.profiler.record_function(name):
                (x @ x).sum()
            after = true_realtime_ns()
            markers.append({"name": name, "true_before_ns": before, "true_after_ns": after})
            i += 1
            time.sleep(0.05)
    prof.export_chrome_trace(os.path.join(out, f"{host}.pt.trace.json"))
    with open(os.path.join(out, "markers.json"), "w") as f:
        json.dump(markers, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
