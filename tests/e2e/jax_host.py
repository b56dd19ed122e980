"""One host of the end-to-end test (tests/tests/end_to_end.rs).

A real JAX program (CPU) traced with clockmesh.jax_profiler for DURATION
seconds, run under the skew shim: its CLOCK_REALTIME, and so every
timestamp of its trace, runs exactly as the host's agent's clock is skewed.
Each step is a named TraceAnnotation ("cm_marker_<i>") bracketed by the
true CLOCK_REALTIME read with a raw syscall, which the shim does not see.

usage: jax_host.py LOG_DIR DURATION_S OFFSETS_PATH
writes LOG_DIR/plugins/profile/<run>/<host>.xplane.pb and LOG_DIR/markers.json
"""

import ctypes
import json
import os
import platform
import sys
import time

SYS_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}[platform.machine()]
CLOCK_REALTIME = 0


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
_ts = Timespec()


def true_realtime_ns():
    """The kernel's CLOCK_REALTIME, past the shim."""
    if _libc.syscall(SYS_CLOCK_GETTIME, CLOCK_REALTIME, ctypes.byref(_ts)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime")
    return _ts.tv_sec * 1_000_000_000 + _ts.tv_nsec


def main():
    log_dir, duration, offsets = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    import jax
    import jax.numpy as jnp

    import clockmesh.jax_profiler as cmp

    step = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((64, 64))
    step(x).block_until_ready()  # compiled before the session
    markers = []
    with cmp.trace(log_dir, offsets_path=offsets):
        end = time.monotonic() + duration
        i = 0
        while time.monotonic() < end:
            name = f"cm_marker_{i}"
            before = true_realtime_ns()
            with jax.profiler.TraceAnnotation(name):
                step(x).block_until_ready()
            after = true_realtime_ns()
            markers.append({"name": name, "true_before_ns": before, "true_after_ns": after})
            i += 1
            time.sleep(0.05)
    with open(os.path.join(log_dir, "markers.json"), "w") as f:
        json.dump(markers, f)


if __name__ == "__main__":
    main()
