"""Reads this process's CLOCK_REALTIME (through Python, as a profiler does)
between two raw syscalls (the kernel's truth, which the shim does not see),
and checks that sleeps and waits still return. Prints JSON lines."""
import ctypes
import json
import threading
import time

SYS_CLOCK_GETTIME = 228  # x86_64
CLOCK_REALTIME = 0


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


libc = ctypes.CDLL(None, use_errno=True)


def raw_realtime_ns():
    ts = Timespec()
    if libc.syscall(SYS_CLOCK_GETTIME, CLOCK_REALTIME, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime")
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


for _ in range(20):
    before = raw_realtime_ns()
    seen = time.time_ns()
    after = raw_realtime_ns()
    print(json.dumps({"before": before, "seen": seen, "after": after}))
    time.sleep(0.01)

started = time.monotonic()
threading.Event().wait(0.2)
time.sleep(0.2)
print(json.dumps({"waited_s": time.monotonic() - started}))
