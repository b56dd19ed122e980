"""What the GPU jobs (torch_nccl_job.py, jax_gpu_job.py) share: the
profiler window and straggler options, the truth clock and the truth file."""

import ctypes
import json
import time


def add_job_arguments(ap, profile_from):
    """Steps, each rank's profiler window, the planted straggler, the truth file."""
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--profile-from", type=int, default=profile_from)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--straggler", type=int, default=-1)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--delay-steps", default="")
    ap.add_argument("--truth", default="")


def delay_s(a, rank, step):
    """The straggler's sleep before step `step`'s collectives (0 elsewhere)."""
    steps = {int(s) for s in a.delay_steps.split(",") if s}
    return a.delay_ms / 1000.0 if rank == a.straggler and step in steps else 0.0


def hold(seconds):
    """Waits `seconds`: sleeps, then spins the last 200 µs, so the straggler's
    CPU is awake when it calls (a thread just woken from a ms sleep took
    ~100 µs longer to reach its kernel launch than the other rank, which the
    comparison with the call instants would count as error)."""
    if seconds <= 0:
        return
    end = time.monotonic() + seconds
    if seconds > 0.0002:
        time.sleep(seconds - 0.0002)
    while time.monotonic() < end:
        pass


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


def write_truth(path, steps, **who):
    """Per step the delay and the true instant just before the step's first
    collective call, as gpu-e2e reads them."""
    if path:
        with open(path, "w") as f:
            json.dump({**who, "steps": steps}, f)
