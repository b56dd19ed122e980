"""One "host" of the two-host JAX test: profiles a small jitted program with
clockmesh.jax_profiler.trace, starting its session at its own time and
running a `sync_marker` annotation at a common instant T. With --skew-ns the
exported trace reads as if this host's CLOCK_REALTIME were that far ahead
(profile_start_time/stop shifted; relative line times are unaffected by a
constant clock offset)."""

import argparse
import sys
import time

import jax
import jax.numpy as jnp

import clockmesh.jax_profiler as cm_jax
from clockmesh import xspace


def sleep_until(t_ns):
    while True:
        left = t_ns - time.time_ns()
        if left <= 0:
            return
        time.sleep(min(left / 1e9, 0.01) if left > 2_000_000 else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--offsets", required=True)
    ap.add_argument("--session-start-ns", type=int, required=True)
    ap.add_argument("--marker-at-ns", type=int, required=True)
    ap.add_argument("--skew-ns", type=int, default=0)
    a = ap.parse_args()

    f = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((256, 256), jnp.float32)
    f(x).block_until_ready()  # compile outside the trace

    def skew(data):
        def edit(env):
            stats = env.stats()
            for name in ("profile_start_time", "profile_stop_time"):
                env.set(name, stats[name] + a.skew_ns, unsigned=True)

        return xspace.edit_task_env(data, edit)

    late_ms = (time.time_ns() - a.session_start_ns) / 1e6
    if late_ms > 0:
        # The test's timeline (sessions 300 ms apart) would be silently wrong.
        sys.exit(f"host worker ready {late_ms:.0f} ms after its session start: machine too busy")
    sleep_until(a.session_start_ns)
    with cm_jax.trace(a.logdir, offsets_path=a.offsets, transform=skew if a.skew_ns else None):
        sleep_until(a.marker_at_ns)
        with jax.profiler.TraceAnnotation("sync_marker"):
            f(x).block_until_ready()
        for i in range(3):
            with jax.profiler.TraceAnnotation(f"step{i}"):
                f(x).block_until_ready()


if __name__ == "__main__":
    main()
