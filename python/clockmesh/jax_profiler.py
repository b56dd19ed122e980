"""Record clockmesh clock offsets in JAX profiler traces, no XLA rebuild.

    import clockmesh.jax_profiler as cmp
    with cmp.trace("/tmp/logdir"):
        step()   # jitted work

writes ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (and
``.trace.json.gz``) exactly like ``jax.profiler.trace``, with the same
``clock_*`` stats on the "Task Environment" plane that the C++ XLA hook
adds (hook/xla), so ``clockmesh trace merge`` finds each host's offset in
the file. The offsets record is read when the session starts and again
when it stops: the start record gives the offset at ``profile_start_time``
(``clock_offset_ns`` ...), the stop record the offset at
``profile_stop_time`` (``clock_stop_*``), and the merge places every event
between the two (clocks drift during a session). ``clock_anchors`` says
which were recorded: "start+stop", "start" (the stop read failed) or
"stop-only" (the start read failed; the start offset then comes from the
stop record, its bound grown over the session). If neither can be read
the trace is still written, with ``clock_status`` saying why and no
offset (fail closed).

Uses jaxlib's ``ProfilerSession`` (private API: ``stop()`` returns the
serialized XSpace, ``export(xspace, dir)`` writes it); checked with
jax/jaxlib 0.10.2.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

from . import reader, xspace

PROFILE_START_TIME = "profile_start_time"


def clock_stats(snap: reader.Snapshot, session_start_ns: int) -> dict:
    """The stats of one record, the start anchor at ``session_start_ns``."""
    global_ns, bound_ns = snap.apply(session_start_ns)
    stats = {
        "clock_offset_ns": (global_ns - session_start_ns, False),
        "clock_offset_bound_ns": (bound_ns, True),
        "clock_drift_ppb": (snap.drift_ps_per_s / 1000.0, False),
        "clock_bound_growth_ppb": (snap.bound_growth_ps_per_s / 1000.0, False),
        "clock_anchor_ns": (snap.anchor_local_ns, False),
        "clock_reference_id": (snap.reference_id, True),
        "clock_agent_epoch": (snap.epoch, True),
        "clock_window": (snap.window, True),
        "clock_flags": (snap.flags, True),
    }
    kinds = {1: "cuda", 2: "rocm", 3: "synthetic"}
    for d in snap.devices:
        if not d.flags & reader.DEV_F_VALID or d.valid_until_ns < session_start_ns:
            continue
        p = f"clock_device_{d.device_id}_"
        stats[p + "offset_ns"] = (d.offset_ns, False)
        stats[p + "bound_ns"] = (d.bound_ns, True)
        stats[p + "drift_ppb"] = (d.drift_ps_per_s / 1000.0, False)
        stats[p + "anchor_ns"] = (d.device_anchor_ns, False)
        stats[p + "kind"] = (kinds.get(d.kind, "unknown"), False)
    return stats


def stop_stats(snap: reader.Snapshot, stop_ns: int) -> dict:
    """The stop anchor: the record read at the stop, at ``stop_ns``."""
    global_ns, bound_ns = snap.apply(stop_ns)
    return {
        "clock_stop_at_ns": (stop_ns, False),
        "clock_stop_offset_ns": (global_ns - stop_ns, False),
        "clock_stop_offset_bound_ns": (bound_ns, True),
        "clock_stop_drift_ppb": (snap.drift_ps_per_s / 1000.0, False),
        "clock_stop_bound_growth_ppb": (snap.bound_growth_ps_per_s / 1000.0, False),
    }


def read_fresh(offsets_path: Optional[str]) -> reader.Snapshot:
    """The agent's record now, or ClockmeshError (missing, stale, ...)."""
    r = reader.OffsetsReader(offsets_path)
    try:
        snap = r.read_snapshot()
    finally:
        r.close()
    snap.check_fresh()
    return snap


def annotate_xspace(
    data: bytes,
    offsets_path: Optional[str] = None,
    start_snapshot: Optional[reader.Snapshot] = None,
) -> bytes:
    """Adds the clock stats to serialized XSpace bytes (fail closed).

    ``start_snapshot``: the record read when the session started (None:
    not read, or it failed); the stop record is read here."""
    env_stats = xspace.task_env_stats(data)
    start = env_stats.get(PROFILE_START_TIME)
    start = int(start) if isinstance(start, int) else reader.time.time_ns()
    stop = env_stats.get("profile_stop_time")
    try:
        stop_snap, error = read_fresh(offsets_path), None
    except reader.ClockmeshError as e:
        stop_snap, error = None, f"{type(e).__name__}: {e}"
    stats, anchors = {}, None
    if start_snapshot is not None:
        stats.update(clock_stats(start_snapshot, start))
        anchors = "start"
    if stop_snap is not None:
        stop_at = int(stop) if isinstance(stop, int) and stop >= start else reader.time.time_ns()
        if anchors is None:
            stats.update(clock_stats(stop_snap, start))
            anchors = "stop-only"
        else:
            # Identity and devices from the newer record.
            fresh = clock_stats(stop_snap, start)
            stats.update({k: v for k, v in fresh.items() if not k.startswith(("clock_offset", "clock_drift", "clock_bound"))})
            anchors = "start+stop"
        stats.update(stop_stats(stop_snap, stop_at))
    status = "ok" if anchors else (error or "no offsets record")

    def edit(env: xspace.TaskEnv) -> None:
        env.set("clock_status", status)
        if anchors:
            env.set("clock_anchors", anchors)
        for name, (value, unsigned) in stats.items():
            env.set(name, value, unsigned)

    return xspace.edit_task_env(data, edit)


@contextlib.contextmanager
def trace(
    log_dir: str,
    offsets_path: Optional[str] = None,
    transform: Optional[Callable[[bytes], bytes]] = None,
):
    """Like ``jax.profiler.trace(log_dir)``, plus the clockmesh stats.

    Starts with ``jax.profiler.start_trace`` (backend set-up and metadata as
    usual); at the end, instead of ``stop_trace``, takes the XSpace bytes from
    the session, adds the stats and exports them. ``transform`` (optional)
    edits the XSpace bytes first (the tests use it to skew a host's clock).
    """
    import jax
    from jax._src import profiler as jax_profiler  # private, see module docstring

    jax.profiler.start_trace(log_dir)
    try:
        start_snapshot = read_fresh(offsets_path)
    except reader.ClockmeshError:
        start_snapshot = None  # the stop record stands in (clock_anchors says)
    try:
        yield
    finally:
        state = jax_profiler._profile_state
        with state.lock:
            session = state.profile_session
            try:
                data = session.stop()
                if transform is not None:
                    data = transform(data)
                session.export(annotate_xspace(data, offsets_path, start_snapshot), str(log_dir))
            finally:
                state.reset()
                jax_profiler.clear_metadata()
