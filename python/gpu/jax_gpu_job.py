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

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from job_common import add_job_arguments, delay_s, hold, raw_realtime_ns, write_truth


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--process", type=int, required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--offsets", default="")
    add_job_arguments(ap, profile_from=2)
    return ap.parse_args()


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

    steps = []
    with contextlib.ExitStack() as session:
        for step in range(a.steps):
            if step == a.profile_from:
                session.enter_context(profiler(a))
            if step == a.profile_from + a.profile_steps:
                session.close()
            delay = delay_s(a, a.process, step)
            hold(delay)
            steps.append({"step": step, "delay_ns": round(delay * 1e9), "true_call_ns": raw_realtime_ns()})
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                step_fn(x).block_until_ready()
    write_truth(a.truth, steps, process=a.process)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
