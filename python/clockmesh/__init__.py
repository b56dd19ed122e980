"""clockmesh: read the node's published clock offsets (pure Python).

The clockmesh agent publishes this node's map from local CLOCK_REALTIME to
the cluster's global timeline in a memory-mapped file (default
``/run/clockmesh/offsets``; layout in ``docs/offsets-format.md``). This
package reads it without any compiled extension and fails closed: no
offset is returned unless the data is present, of a known version and
fresh.

    from clockmesh import OffsetsReader
    with OffsetsReader() as r:
        global_ns, bound_ns = r.to_global(time.time_ns())   # judged at the stamp's time
        g, b = r.device_to_global(0, gpu_stamp_ns)         # a GPU's stamp
        now = r.now()   # [earliest_ns, latest_ns], status (CLOCK_*), epoch

``clockmesh.jax_profiler.trace`` wraps ``jax.profiler`` tracing and records
the offsets in the exported trace (see that module).
"""

from .reader import (
    CLOCK_HOLDOVER,
    CLOCK_STALE,
    CLOCK_SYNCHRONISED,
    CLOCK_UNKNOWN,
    DEFAULT_PATH,
    BadFormat,
    BadVersion,
    Busy,
    ClockmeshError,
    DeviceMap,
    Missing,
    NoData,
    NoDevice,
    Now,
    OffsetsReader,
    Snapshot,
    Stale,
    TooOld,
)

__all__ = [
    "CLOCK_HOLDOVER",
    "CLOCK_STALE",
    "CLOCK_SYNCHRONISED",
    "CLOCK_UNKNOWN",
    "DEFAULT_PATH",
    "BadFormat",
    "BadVersion",
    "Busy",
    "ClockmeshError",
    "DeviceMap",
    "Missing",
    "NoData",
    "NoDevice",
    "Now",
    "OffsetsReader",
    "Snapshot",
    "Stale",
    "TooOld",
]
