"""One process of the end-to-end test's distributed JAX job
(tests/tests/end_to_end.rs): jax.distributed across the netns hosts with
JAX's CPU cross-process collectives over gloo, one CPU device per process
in one global mesh, and a jitted training-like step (shard_map: a local
compute, a psum of the gradient across processes, an all_gather of a
slice). Process STRAGGLER waits a known delay (straggler.delay_s) before
each step. Traced with clockmesh.jax_profiler under the skew shim; each
step is a StepTraceAnnotation.

usage: jax_job.py PROCESS WORLD COORDINATOR_ADDR PORT STEPS STRAGGLER OFFSETS LOG_DIR
writes LOG_DIR/plugins/profile/<run>/<host>.xplane.pb and LOG_DIR/truth.json
"""

import os
import sys
import time

from straggler import Truth, delay_s, hold


def use_gloo_interface(jax_lib, iface):
    """JAX makes its gloo collectives without an interface, so gloo binds
    to the address the host name resolves to; the test hosts' names
    resolve nowhere. Name the interface, as GLOO_SOCKET_IFNAME does for
    PyTorch."""
    make = jax_lib.make_gloo_tcp_collectives

    def with_interface(distributed_client, hostname=None, interface=None):
        return make(distributed_client=distributed_client, hostname=hostname, interface=interface or iface)

    jax_lib.make_gloo_tcp_collectives = with_interface


def main():
    proc, world, addr, port, steps, straggler, offsets, log_dir = sys.argv[1:9]
    proc, world, steps, straggler = int(proc), int(world), int(steps), int(straggler)
    import jax

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        from jax._src.lib import _jax

        use_gloo_interface(_jax, os.environ["GLOO_SOCKET_IFNAME"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"{addr}:{port}", num_processes=world, process_id=proc, initialization_timeout=120
    )
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import clockmesh.jax_profiler as cmp

    mesh = Mesh(jax.devices(), ("x",))

    def step_fn(w, x):
        grad = jnp.tanh(x @ w).sum(0)
        grad = jax.lax.psum(grad, "x")
        return grad, jax.lax.all_gather(grad[:8], "x")

    step = jax.jit(jax.shard_map(step_fn, mesh=mesh, in_specs=(P(), P("x")), out_specs=(P(), P()), check_vma=False))
    w = jnp.ones((128, 128)) / 128
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), jnp.ones((32, 128)) * (proc + 1))
    jax.block_until_ready(step(w, x))  # compiled, and every process past it, before the session
    truth = Truth(log_dir)
    with cmp.trace(log_dir, offsets_path=offsets):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                delay = delay_s(i) if proc == straggler else 0.0
                hold(delay)
                truth.entered(i, delay)
                jax.block_until_ready(step(w, x))
            time.sleep(0.01)
    truth.write(rank=proc, straggler=straggler)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
