"""What the distributed jobs of the end-to-end test share: the straggler's
designed delay per step, and the truth each rank records."""

import json
import os
import time

from jax_host import true_realtime_ns


def delay_s(step):
    """The straggler's delay before the step's first collective: 1, 2, 3,
    4 ms in turn (every one far above the alignment bounds, and above the
    scheduling noise of ranks on two shared cores most of the time: at
    0.5-2 ms the JAX job's straggler was truly last at only 85 of 150
    steps on a noisier VM)."""
    return (1.0 + step % 4) / 1000.0


def hold(seconds):
    """Waits `seconds` by the monotonic clock (sleep alone overshoots by
    tens of µs to ms on a loaded 2-core machine; the truth is recorded
    anyway)."""
    end = time.monotonic() + seconds
    if seconds > 0.0002:
        time.sleep(seconds - 0.0002)
    while time.monotonic() < end:
        pass


class Truth:
    """Per step: the designed delay and the true CLOCK_REALTIME (raw
    syscall, past the skew shim) just before the rank entered the step's
    first collective."""

    def __init__(self, out_dir):
        self.path = os.path.join(out_dir, "truth.json")
        self.steps = []

    def entered(self, step, delay):
        self.steps.append({"step": step, "delay_ns": round(delay * 1e9), "true_enter_ns": true_realtime_ns()})

    def write(self, **extra):
        with open(self.path, "w") as f:
            json.dump({"steps": self.steps, **extra}, f)
