"""One rank of the critical-path validation job (issue 35): a training-like
step whose ops the analysis must rank, with one op made slow on one rank in
some steps — the rank, op and steps known only to the driver
(critical_validate.py), which re-runs the same job without the delay.

Each step, inside `torch.profiler.record_function` regions as a model
would have them: `forward` (matmuls), `all_reduce`; `backward` (more
matmuls), `all_reduce`; `optimizer` (fewer), `all_reduce` of a scalar (the
loss), as data-parallel training does. The work is a fixed count of
matmuls, so a re-run does the same work. The planted delay spins inside the
op's region (no events of its own): the op itself is slower.

Devices: `cpu` with gloo (CI), `cuda` with NCCL (the GPU machine; the ops'
kernels run on the GPU stream, the delay is a longer kernel: extra matmuls
on a sliced input, timed to the planted ms).

usage: critical_job.py --rank R --world W --init tcp://ADDR:PORT --out FILE
       [--device cpu|cuda] [--steps N] [--plant-rank R --plant-op OP
       --plant-ms MS --plant-steps 3,5,7]
"""

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OPS = ("forward", "backward", "optimizer")
# Matmuls per op: forward and backward carry most of a step, as in training.
MATMULS = {"forward": 12, "backward": 20, "optimizer": 6}


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--plant-rank", type=int, default=-1)
    ap.add_argument("--plant-op", choices=OPS, default="forward")
    ap.add_argument("--plant-ms", type=float, default=0.0)
    ap.add_argument("--plant-steps", default="")
    return ap.parse_args()


def planted_s(a, step, op):
    steps = {int(s) for s in a.plant_steps.split(",") if s}
    hit = a.rank == a.plant_rank and op == a.plant_op and step in steps
    return a.plant_ms / 1000.0 if hit else 0.0


def slow_down(x, seconds, cuda):
    """Makes the running op `seconds` longer: spins on the CPU, or (CUDA)
    queues extra matmuls worth that much GPU time, measured once."""
    if seconds <= 0:
        return
    if not cuda:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return
    per = _matmul_s(x)
    for _ in range(max(1, round(seconds / per))):
        x = x @ x / x.shape[0]


_MATMUL_S = {}


def _matmul_s(x):
    """One matmul's GPU time, measured once (outside any profiled step)."""
    if "s" not in _MATMUL_S:
        for _ in range(10):  # cuBLAS set up, clocks up
            x = x @ x / x.shape[0]
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            x = x @ x / x.shape[0]
        stop.record()
        torch.cuda.synchronize()
        _MATMUL_S["s"] = start.elapsed_time(stop) / 1000.0 / 50
    return _MATMUL_S["s"]


def op(a, name, step, x, bucket, cuda):
    """One op: its matmuls, then its gradient bucket filled (inside the
    op, so that the op is what precedes the collective)."""
    with record_function(name):
        for _ in range(MATMULS[name]):
            x = torch.tanh(x @ x / x.shape[0])
        slow_down(x, planted_s(a, step, name), cuda)
        bucket.copy_(x[: bucket.shape[0]])
    return x


def main():
    a = parse()
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method=a.init, rank=a.rank, world_size=a.world, device_id=dev)
    else:
        # One compute thread, nothing collected mid-step: a re-run then
        # repeats its steps as closely as this job can (pinning each rank
        # to a CPU of its own made it worse on a 32-core machine).
        torch.set_num_threads(1)
        gc.disable()
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)
    torch.manual_seed(1)
    x = torch.randn(a.size, a.size, device=dev)
    # Gradient buckets of 64 KB: the collectives' own time stays small
    # beside the ops', as on a fast network.
    bucket = torch.zeros(64, a.size, device=dev)
    loss = torch.zeros(1, a.size, device=dev)
    dist.all_reduce(x.clone())  # connections up before the profiled steps
    if cuda:
        _matmul_s(x)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sched = schedule(skip_first=1, wait=0, warmup=1, active=a.steps - 2, repeat=1)
    prof = profile(activities=activities, schedule=sched,
                   on_trace_ready=lambda p: p.export_chrome_trace(a.out))
    with prof:
        for step in range(a.steps):
            y = op(a, "forward", step, x, bucket, cuda)
            dist.all_reduce(bucket)
            y = op(a, "backward", step, y, bucket, cuda)
            dist.all_reduce(bucket)
            op(a, "optimizer", step, y, loss, cuda)
            dist.all_reduce(loss)
            loss[0, 0].item()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
