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
import ctypes
import json
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--gpu", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--profile-from", type=int, default=1)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--straggler", type=int, default=-1)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--delay-steps", default="")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--truth", default="")
    ap.add_argument("--host", default="")
    return ap.parse_args()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_SYS_CLOCK_GETTIME = 228  # x86-64


def raw_realtime_ns():
    """CLOCK_REALTIME as the kernel keeps it, by the raw system call: the skew
    shim wraps libc's clock_gettime, so `time.time_ns` reads the skewed clock."""
    ts = _Timespec()
    if _LIBC.syscall(_SYS_CLOCK_GETTIME, 0, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime")
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def main():
    a = parse()
    torch.cuda.set_device(a.gpu)
    dev = torch.device("cuda", a.gpu)
    dist.init_process_group(
        "nccl", init_method=a.init, rank=a.rank, world_size=a.world, device_id=dev
    )
    second = dist.new_group(list(range(a.world)))
    delay_steps = {int(s) for s in a.delay_steps.split(",") if s}
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
            delay = a.delay_ms / 1000.0 if a.rank == a.straggler and step in delay_steps else 0.0
            if delay:
                time.sleep(delay)
            steps.append({"step": step, "delay_ns": round(delay * 1e9), "true_call_ns": raw_realtime_ns()})
            dist.all_reduce(y)
            dist.all_gather_into_tensor(gathered, y[0].contiguous(), group=second)
            if step % 3 == 0:
                dist.broadcast(y, src=0)
            y.sum().item()
            prof.step()
    if a.truth:
        with open(a.truth, "w") as f:
            json.dump({"rank": a.rank, "host": a.host, "steps": steps}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
