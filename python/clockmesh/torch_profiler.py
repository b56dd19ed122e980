"""Record clockmesh clock offsets in PyTorch profiler traces.

    import torch.profiler
    import clockmesh.torch_profiler as cmt

    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof, cmt.record(prof):
        train_step()
    prof.export_chrome_trace(f"rank{rank}.pt.trace.json")

``record`` reads the agent's offsets record when the block starts and
again when it ends (before the profiler stops), and adds both to the trace
as the top-level ``"clockmesh"`` object (``prof.add_metadata_json``):
the host, a status, and per record the local time it holds at, the offset
(global - local), bound, drift and bound growth. ``clockmesh trace merge``
places every event of the trace through the map between the two records
(or through ``--history``, the agent's per-window results, when given).
A record that cannot be read (no agent, stale) is left out and the status
says why; the trace is written as usual either way.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Optional

from . import reader


def read_record(offsets_path: Optional[str], when: str) -> dict:
    """The offsets record now, evaluated at this instant (fails closed)."""
    with reader.OffsetsReader(offsets_path) as r:
        snap = r.read_snapshot()
    now = time.time_ns()
    snap.check_fresh(now)
    global_ns, bound_ns = snap.apply(now)
    return {
        "when": when,
        "at_ns": now,
        "offset_ns": global_ns - now,
        "bound_ns": bound_ns,
        "drift_ppb": snap.drift_ps_per_s / 1000.0,
        "bound_growth_ppb": snap.bound_growth_ps_per_s / 1000.0,
        "epoch": snap.epoch,
        "window": snap.window,
        "reference_id": snap.reference_id,
    }


def _try_record(offsets_path: Optional[str], when: str, errors: list) -> Optional[dict]:
    try:
        return read_record(offsets_path, when)
    except reader.ClockmeshError as e:
        errors.append(f"{when}: {type(e).__name__}: {e}")
        return None


@contextlib.contextmanager
def record(prof, offsets_path: Optional[str] = None, host: Optional[str] = None):
    """Adds the clockmesh records to the trace ``prof`` is collecting.

    Enter it inside the profiler's block (so it ends first, while the
    profiler still collects). ``host`` names the node as the agent does
    (default: this host's name)."""
    errors: list = []
    start = _try_record(offsets_path, "start", errors)
    try:
        yield
    finally:
        stop = _try_record(offsets_path, "stop", errors)
        records = [r for r in (start, stop) if r is not None]
        meta = {
            "version": 1,
            "host": host or socket.gethostname(),
            "status": "ok" if records else "; ".join(errors),
            "records": records,
        }
        if records and errors:
            meta["warnings"] = errors
        prof.add_metadata_json("clockmesh", json.dumps(meta))
