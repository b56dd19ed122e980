"""One process of a real multi-process JAX job on GPUs (one process per
GPU, as under SLURM), profiled with jax.profiler from a step that may differ
per process. Each step is a jitted `shard_map` with a `psum` and an
`all_gather` over every process's GPU (NCCL), marked with
`StepTraceAnnotation`; a planted straggler sleeps before the steps given.

usage: jax_gpu_job.py --process P --processes N --coordinator ADDR:PORT
       --logdir DIR [--steps N] [--profile-from S] [--profile-steps K]
       [--straggler P --delay-ms MS --delay-steps 3,5]
       [--offsets PATH]  (trace with clockmesh.jax_profiler: the agent's
                          offsets recorded in the xplane)
       [--truth FILE]    (JSON: per step the delay and the true
                          CLOCK_REALTIME just before the step was called)
"""

import argparse
import contextlib
import ctypes
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--process", type=int, required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--profile-from", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--straggler", type=int, default=-1)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--delay-steps", default="")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--offsets", default="")
    ap.add_argument("--truth", default="")
    return ap.parse_args()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_SYS_CLOCK_GETTIME = 228  # x86-64


def raw_realtime_ns():
    """CLOCK_REALTIME as the kernel keeps it (the skew shim wraps libc's)."""
    ts = _Timespec()
    if _LIBC.syscall(_SYS_CLOCK_GETTIME, 0, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime")
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def profiler(a):
    """The profiling session: clockmesh.jax_profiler.trace when the agent's
    offsets are given, else jax.profiler.trace."""
    if a.offsets:
        import clockmesh.jax_profiler as cm_jax

        return cm_jax.trace(a.logdir, offsets_path=a.offsets)
    return jax.profiler.trace(a.logdir)


def main():
    a = parse()
    jax.distributed.initialize(
        a.coordinator, a.processes, a.process, local_device_ids=[a.process]
    )
    mesh = jax.make_mesh((a.processes,), ("d",))
    spec = NamedSharding(mesh, P("d"))

    def body(block):
        local = jnp.tanh(block @ block.T)
        total = jax.lax.psum(local, "d")
        return jax.lax.all_gather(total[0], "d")

    step_fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P(), check_vma=False))
    local = np.ones((a.size, a.size), np.float32) * (a.process + 1)
    x = jax.make_array_from_process_local_data(spec, local)
    step_fn(x).block_until_ready()  # compile outside the trace

    delay_steps = {int(s) for s in a.delay_steps.split(",") if s}
    steps = []
    with contextlib.ExitStack() as session:
        for step in range(a.steps):
            if step == a.profile_from:
                session.enter_context(profiler(a))
            if step == a.profile_from + a.profile_steps:
                session.close()
            delay = a.delay_ms / 1000.0 if a.process == a.straggler and step in delay_steps else 0.0
            if delay:
                time.sleep(delay)
            steps.append({"step": step, "delay_ns": round(delay * 1e9), "true_call_ns": raw_realtime_ns()})
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                step_fn(x).block_until_ready()
    if a.truth:
        with open(a.truth, "w") as f:
            json.dump({"process": a.process, "steps": steps}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
