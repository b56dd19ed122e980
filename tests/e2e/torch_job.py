"""One rank of the end-to-end test's distributed PyTorch job
(tests/tests/end_to_end.rs): torch.distributed over gloo across the netns
hosts, as DDP would use it: per step a forward/backward-like compute, an
all_reduce of the gradient, an all_gather of a metric, and a barrier every
fifth step. Rank STRAGGLER waits a known delay (straggler.delay_s) before
each step's all_reduce. Traced with torch.profiler and
clockmesh.torch_profiler.record under the skew shim; each step is a
ProfilerStep#N span (what Holistic Trace Analysis reads as iterations).

usage: torch_job.py RANK WORLD MASTER_ADDR PORT STEPS STRAGGLER OFFSETS HOST OUT_DIR
writes OUT_DIR/<HOST>.pt.trace.json and OUT_DIR/truth.json
"""

import datetime
import os
import sys
import time

from straggler import Truth, delay_s, hold


def main():
    rank, world, addr, port, steps, straggler, offsets, host, out = sys.argv[1:10]
    rank, world, steps, straggler = int(rank), int(world), int(steps), int(straggler)
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    import clockmesh.torch_profiler as cmt

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    # One intra-op thread: three ranks' OpenMP pools spinning on a 2-core
    # machine delayed every rank by tens of ms, hiding the designed delay.
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    w = torch.randn(128, 128)
    x = torch.randn(32, 128)
    truth = Truth(out)
    # Every rank starts its profiler between two barriers, so each trace
    # holds the same collectives (gloo's spans are matched by occurrence).
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof, cmt.record(prof, offsets, host):
        dist.barrier()
        for step in range(steps):
            with record_function(f"ProfilerStep#{step}"):
                grad = torch.tanh(x @ w).sum(0)
                delay = delay_s(step) if rank == straggler else 0.0
                hold(delay)
                truth.entered(step, delay)
                dist.all_reduce(grad)
                gathered = [torch.zeros(8) for _ in range(world)]
                dist.all_gather(gathered, grad[:8].contiguous())
                if step % 5 == 4:
                    dist.barrier()
            time.sleep(0.01)
        dist.barrier()
    prof.export_chrome_trace(os.path.join(out, f"{host}.pt.trace.json"))
    truth.write(rank=rank, host=host, straggler=straggler)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
