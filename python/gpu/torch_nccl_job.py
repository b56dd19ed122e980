"""One rank of a real PyTorch NCCL job, profiled as users profile: a
`torch.profiler.schedule` that may start and stop at different steps on
different ranks, `prof.step()` once per step, CPU and CUDA activities.

Each step: a matmul, then `all_reduce` on the default group, `all_gather`
on a second process group, and a `broadcast` every third step; the loss is
read back (`.item()`), as a training loop does. A planted straggler sleeps
before its collectives in the steps given.

usage: torch_nccl_job.py --rank R --world W --init tcp://ADDR:PORT --gpu G
       --out FILE [--steps N] [--profile-from S] [--profile-steps K]
       [--straggler RANK --delay-ms MS --delay-steps 3,5,7]
       [--host NAME]  (written in the truth file; name the trace file
                       <host>.<anything>.pt.trace.json so the merge knows
                       the host: Kineto records none, and
                       clockmesh.torch_profiler.record cannot run inside a
                       scheduled profiler, whose trace is exported at its
                       last active step; merge with the agents' --history)
       [--truth FILE]  (JSON: per step the delay and the true CLOCK_REALTIME
                        just before the step's first collective call)
"""

import argparse

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from job_common import add_job_arguments, delay_s, hold, raw_realtime_ns, write_truth


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--gpu", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--host", default="")
    add_job_arguments(ap, profile_from=1)
    return ap.parse_args()


def main():
    a = parse()
    torch.cuda.set_device(a.gpu)
    dev = torch.device("cuda", a.gpu)
    dist.init_process_group(
        "nccl", init_method=a.init, rank=a.rank, world_size=a.world, device_id=dev
    )
    second = dist.new_group(list(range(a.world)))
    x = torch.randn(a.size, a.size, device=dev)
    gathered = torch.empty(a.world * a.size, device=dev)

    # Warm NCCL's communicators outside the profiled steps.
    dist.all_reduce(x.clone())
    dist.all_gather_into_tensor(gathered, x[0].contiguous(), group=second)
    torch.cuda.synchronize()

    sched = schedule(skip_first=a.profile_from, wait=0, warmup=1, active=a.profile_steps, repeat=1)
    steps = []
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=sched,
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(a.out),
    )
    with prof:
        for step in range(a.steps):
            y = torch.tanh(x @ x) / a.size
            delay = delay_s(a, a.rank, step)
            hold(delay)
            steps.append({"step": step, "delay_ns": round(delay * 1e9), "true_call_ns": raw_realtime_ns()})
            dist.all_reduce(y)
            dist.all_gather_into_tensor(gathered, y[0].contiguous(), group=second)
            if step % 3 == 0:
                dist.broadcast(y, src=0)
            y.sum().item()
            prof.step()
    write_truth(a.truth, steps, rank=a.rank, host=a.host)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
