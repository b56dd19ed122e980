"""One process of the critical-path validation job in JAX (issue 35): the
training-like step of critical_job.py, one process per GPU
(`jax.distributed`, NCCL), traced with `jax.profiler` (xplane), each step
marked with `StepTraceAnnotation`; one op made slow on one process in some
steps, which critical_validate.py (`--framework jax`) knows and the
analysis does not.

Each step, as data-parallel training runs it: three regions, `forward`,
`backward`, `optimizer`, each ONE matmul (M x K) @ (K x N) on this process's
GPU (a jitted function of the region's name, so the kernel's XLA op name is
`jit(forward)/dot_general`), whose output is the region's gradient bucket,
then all-reduced (a jitted `shard_map` `psum`, NCCL). Each region's matmul
takes the previous all-reduce's result through an `optimization_barrier`
(no kernel of its own), so the GPU runs forward, all-reduce, backward,
all-reduce, optimizer, all-reduce, in that order; the host queues them and
waits for the step's last all-reduce (the loss read back).

The ops' work is of fixed size: K is set from a duration in ms with the
GPU's time per unit of K (`--ms-per-k`, calibrated once per batch, else
measured here), so a re-run repeats the job; cuBLAS without autotuning (the
driver's XLA_FLAGS), so that every compile picks the same kernel. The
planted delay makes the op's own matmul longer (K grown by the planted
duration), inside its region, with no kernel of its own: the same op, one
kernel. The matmuls are process-local (only the all-reduce is SPMD); every
process compiles and runs both variants before the profiled steps (the
same programs in the same order on every process: XLA's program ids, part
of a GPU collective's key, then agree), and only the planted process runs
the planted variant in the planted steps.

usage: critical_job_jax.py --process P --processes N --coordinator ADDR:PORT
       --out FILE [--steps N] [--ms-per-k X]
       [--plant-rank R --plant-op OP --plant-ms MS --plant-steps 3,5,7]
       critical_job_jax.py --calibrate   (prints the GPU's ms per 1 of K)
"""

import argparse
import gc
import glob
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

OPS = ("forward", "backward", "optimizer")
OP_MS = {"forward": 8.0, "backward": 16.0, "optimizer": 4.0}
# Each matmul's output (the gradient bucket) is M x N f32: 64 MiB, whose
# all-reduce stays small beside the ops on NVLink; M = N = 4096 keeps
# cuBLAS from splitting K (a reduction kernel of its own).
M = N = 4096
K_STEP = 256
PREC = jax.lax.Precision.HIGHEST


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--process", type=int)
    ap.add_argument("--processes", type=int)
    ap.add_argument("--coordinator")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ms-per-k", type=float, default=0.0)
    ap.add_argument("--plant-rank", type=int, default=-1)
    ap.add_argument("--plant-op", choices=OPS, default="forward")
    ap.add_argument("--plant-ms", type=float, default=0.0)
    ap.add_argument("--plant-steps", default="")
    a = ap.parse_args()
    if not a.calibrate and (a.process is None or a.processes is None or not a.coordinator or not a.out):
        ap.error("--process, --processes, --coordinator and --out are required")
    return a


def k_of(ms, ms_per_k):
    return max(K_STEP, int(round(ms / ms_per_k / K_STEP)) * K_STEP)


def calibrate():
    """The GPU's ms per 1 of K: the median of a few matmuls of K = 16384
    and 4096, after a warm-up (the difference: no launch cost)."""
    times = {}
    for k in (4096, 16384):
        a = jnp.ones((M, k), jnp.float32)
        b = jnp.ones((k, N), jnp.float32)
        f = jax.jit(lambda a, b: jnp.dot(a, b, precision=PREC))
        for _ in range(5):
            f(a, b).block_until_ready()
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            f(a, b).block_until_ready()
            ts.append((time.perf_counter() - t0) * 1e3)
        times[k] = statistics.median(ts)
    return (times[16384] - times[4096]) / (16384 - 4096)


def main():
    a = parse()
    if a.calibrate:
        print(f"{calibrate():.9f}")
        return
    gc.disable()
    jax.distributed.initialize(a.coordinator, a.processes, a.process, local_device_ids=[a.process])
    ms_per_k = a.ms_per_k or calibrate()
    plant_steps = {int(s) for s in a.plant_steps.split(",") if s}
    dev = jax.local_devices()[0]
    mesh = jax.make_mesh((a.processes,), ("d",))
    spec = NamedSharding(mesh, P("d"))
    gshape = (a.processes, M, N)

    def region(name):
        def op(lhs, rhs, prev):
            # After the previous all-reduce (prev), without a kernel.
            lhs, rhs, _ = jax.lax.optimization_barrier((lhs, rhs, prev))
            return jnp.dot(lhs, rhs, precision=PREC)[None]
        op.__name__ = op.__qualname__ = name
        return jax.jit(op)

    ops = {name: region(name) for name in OPS}

    def reduce_body(g):
        return jax.lax.psum(g, "d")

    # The bucket donated: the all-reduce runs in place, no copy kernel
    # between the op and its collective.
    all_reduce = jax.jit(jax.shard_map(reduce_body, mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                       check_vma=False), donate_argnums=0)

    def weights(name, extra_ms):
        k = k_of(OP_MS[name] + extra_ms, ms_per_k)
        key = jax.random.key(1000 * a.process + OPS.index(name))
        k1, k2 = jax.random.split(key)
        lhs = jax.device_put(jax.random.normal(k1, (M, k), jnp.float32), dev)
        rhs = jax.device_put(jax.random.normal(k2, (k, N), jnp.float32) / np.sqrt(k), dev)
        return lhs, rhs

    # Every process builds and runs the planted variant too (its own
    # weights, unused in the profiled steps but on the planted process):
    # the processes then compile the same programs in the same order, and
    # XLA's program ids, which key the collectives across processes,
    # agree.
    plant = a.plant_ms > 0 and bool(plant_steps)
    planted = plant and a.process == a.plant_rank
    base = {name: weights(name, 0.0) for name in OPS}
    slow = dict(base)
    if plant:
        slow[a.plant_op] = weights(a.plant_op, a.plant_ms)
    first = jax.device_put(jnp.zeros((1, M, N), jnp.float32), dev)

    def one_step(w):
        prev = first
        for name in OPS:
            g = ops[name](*w[name], prev)
            out = all_reduce(jax.make_array_from_single_device_arrays(gshape, spec, [g]))
            prev = out.addressable_shards[0].data
        return prev

    # Compile and warm both variants outside the profiled steps; every
    # process runs the same number of steps (the all-reduces pair).
    for _ in range(3):
        one_step(base).block_until_ready()
        one_step(slow).block_until_ready()

    tmp = tempfile.mkdtemp(prefix="cpjax-")
    for n in range(a.steps):
        if n == 2:
            jax.profiler.start_trace(tmp)
        w = slow if planted and n in plant_steps else base
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            one_step(w).block_until_ready()
    jax.profiler.stop_trace()
    found = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "*.xplane.pb"))
    if len(found) != 1:
        raise SystemExit(f"expected one xplane under {tmp}, found {found}")
    shutil.move(found[0], a.out)
    shutil.rmtree(tmp, ignore_errors=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
