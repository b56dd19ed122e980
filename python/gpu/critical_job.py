"""One rank of the critical-path validation job (issue 35): a training-like
step whose ops the analysis must rank, with one op made slow on one rank in
some steps — the rank, op and steps known only to the driver
(critical_validate.py), which re-runs the same job without the delay.

Each step, inside `torch.profiler.record_function` regions as a model
would have them: `forward`, `all_reduce` of its gradient bucket;
`backward`, `all_reduce`; `optimizer`, `all_reduce` of a scalar (the
loss), as data-parallel training does.

The ops' work is of fixed duration, not of fixed count, so that a re-run
repeats a step to well under the 3 % the what-if is judged at: a step lasts
its work plus its collectives. (Matmuls of fixed count made the re-run's
unplanted steps differ from the run's by 14-18 % at the median on CPU: the
CPU's speed and gloo's all-reduces vary from run to run.)

- `cpu` (gloo, CI): each op spins on its thread for its duration.
- `cuda` (NCCL, the GPU machine): each op queues one `torch.cuda._sleep`
  kernel of its duration (clock cycles, calibrated once per batch:
  `--cycles-per-ms`, else measured here) on the compute stream; the CPU runs
  ahead of the GPU, as in training, and waits for it once per step (the
  loss, read back). With `--gpu-wait` each op's region also waits for its
  kernels (a stream synchronise at its end), so that the region on the CPU
  lasts as long as the op's GPU work.

With `--nccl-stream` (cuda) each all-reduce is issued with `async_op=True`
and waited for at once (`work.wait()`), as DDP's bucket all-reduces are:
ProcessGroupNCCL then runs the NCCL kernel on a stream of its own, which
waits for the compute stream through a CUDA event, and the compute stream
waits for it in turn (without it, PyTorch 2.11 runs a synchronous
collective on the current stream). The analysis must then find the work
before a collective on another stream than the collective's.

The planted delay makes the op itself longer, inside its region, with no
events of its own: a longer spin (cpu), a second `_sleep` kernel of the
planted duration on the op's stream (cuda).

usage: critical_job.py --rank R --world W --init tcp://ADDR:PORT --out FILE
       [--device cpu|cuda] [--steps N] [--cycles-per-ms C] [--gpu-wait] [--nccl-stream]
       [--plant-rank R --plant-op OP --plant-ms MS --plant-steps 3,5,7]
       critical_job.py --calibrate   (prints the GPU's _sleep cycles per ms)
"""

import argparse
import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OPS = ("forward", "backward", "optimizer")
# Each op's duration, ms: forward and backward carry most of a step, as in
# training.
OP_MS = {"forward": 8.0, "backward": 16.0, "optimizer": 4.0}


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--init")
    ap.add_argument("--out")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--cycles-per-ms", type=float, default=0.0)
    ap.add_argument("--gpu-wait", action="store_true")
    ap.add_argument("--nccl-stream", action="store_true")
    ap.add_argument("--plant-rank", type=int, default=-1)
    ap.add_argument("--plant-op", choices=OPS, default="forward")
    ap.add_argument("--plant-ms", type=float, default=0.0)
    ap.add_argument("--plant-steps", default="")
    a = ap.parse_args()
    if not a.calibrate and (a.rank is None or a.world is None or not a.init or not a.out):
        ap.error("--rank, --world, --init and --out are required")
    return a


def planted_ms(a, step, op):
    steps = {int(s) for s in a.plant_steps.split(",") if s}
    hit = a.rank == a.plant_rank and op == a.plant_op and step in steps
    return a.plant_ms if hit else 0.0


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def calibrate():
    """`torch.cuda._sleep` clock cycles per ms on this GPU: the median of
    a few 20 M-cycle kernels, after a warm-up (clocks up)."""
    torch.cuda.set_device(0)
    cycles = 20_000_000
    for _ in range(3):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    per_ms = []
    for _ in range(7):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        torch.cuda.synchronize()
        per_ms.append(cycles / start.elapsed_time(stop))
    return statistics.median(per_ms)


class Ops:
    def __init__(self, a, cuda):
        self.a = a
        self.cuda = cuda
        self.cycles_per_ms = (a.cycles_per_ms or calibrate()) if cuda else 0.0

    def busy(self, ms):
        if ms <= 0:
            return
        if self.cuda:
            torch.cuda._sleep(int(round(ms * self.cycles_per_ms)))
        else:
            spin(ms)

    def op(self, name, step, x, bucket):
        """One op: its work, the planted delay if any, then its gradient
        bucket filled (inside the op, so that the op is what precedes the
        collective)."""
        with record_function(name):
            self.busy(OP_MS[name])
            self.busy(planted_ms(self.a, step, name))
            bucket.copy_(x[: bucket.shape[0]])
            if self.cuda and self.a.gpu_wait:
                torch.cuda.current_stream().synchronize()


def main():
    a = parse()
    if a.calibrate:
        print(f"{calibrate():.1f}")
        return
    cuda = a.device == "cuda"
    # Nothing collected mid-step; one compute thread on CPU.
    gc.disable()
    if cuda:
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method=a.init, rank=a.rank, world_size=a.world, device_id=dev)
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)
    ops = Ops(a, cuda)
    torch.manual_seed(1)
    x = torch.randn(256, 256, device=dev)
    # Gradient buckets of 64 KB: the collectives' own time stays small
    # beside the ops', as on a fast network.
    bucket = torch.zeros(64, 256, device=dev)
    loss = torch.zeros(1, 256, device=dev)
    dist.all_reduce(x.clone())  # connections up before the profiled steps
    if cuda:
        torch.cuda.synchronize()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sched = schedule(skip_first=1, wait=0, warmup=1, active=a.steps - 2, repeat=1)
    prof = profile(activities=activities, schedule=sched,
                   on_trace_ready=lambda p: p.export_chrome_trace(a.out))
    def all_reduce(t):
        if a.nccl_stream:
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)

    with prof:
        for step in range(a.steps):
            ops.op("forward", step, x, bucket)
            all_reduce(bucket)
            ops.op("backward", step, x, bucket)
            all_reduce(bucket)
            ops.op("optimizer", step, x, loss)
            all_reduce(loss)
            loss[0, 0].item()
            prof.step()
    # Both ranks done before either tears gloo down: a rank that destroys
    # its group while the other's gloo threads still talk to it can abort
    # the other ("terminate called without an active exception", seen once
    # in 40-odd runs here).
    dist.barrier()
    dist.destroy_process_group()
    exit_without_finalizers()


def exit_without_finalizers():
    """Leaves at once, the trace written and the group destroyed: gloo's
    worker threads can still hold tensors that the interpreter's own
    finalisation then frees without the GIL, and the process aborts
    ("terminate called without an active exception", pytorch#190489 and
    #179291; CI saw it once more after the barrier above)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
