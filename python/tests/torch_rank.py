"""One rank of test_torch_two_ranks.py: a real torch.distributed (gloo)
program profiled with torch.profiler and clockmesh.torch_profiler.record.
Both ranks mark `cm_sync_<i>` right after a barrier, so the markers of
step i started within the barrier's release skew of each other.

usage: torch_rank.py RANK WORLD PORT OFFSETS_PATH HOST OUT_JSON"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import clockmesh.torch_profiler as cmt


def main():
    rank, world, port, offsets, host, out = sys.argv[1:7]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )
    x = torch.ones(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof, cmt.record(prof, offsets, host):
        for i in range(20):
            dist.barrier()
            with torch.profiler.record_function(f"cm_sync_{i}"):
                (x @ x).sum()
            time.sleep(0.02)
    prof.export_chrome_trace(out)
    dist.barrier()
    dist.destroy_process_group()
    # Out before the interpreter's finalisation, which can free tensors
    # gloo's threads still hold and abort the process (as critical_job.py).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
