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
PROFILE_STOP_TIME = "profile_stop_time"

# What a failed read raises: the reader's own errors, and OS errors such as
# a permission problem on the offsets file (never fatal to the session).
READ_ERRORS = (reader.ClockmeshError, OSError)

_KINDS = {1: "cuda", 2: "rocm", 3: "synthetic"}


def anchor_stats(snap: reader.Snapshot, at_ns: int, prefix: str = "clock_") -> dict:
    """One record's map at local time ``at_ns``: ``<prefix>offset_ns``
    (global - local), ``offset_bound_ns``, ``drift_ppb``, ``bound_growth_ppb``."""
    global_ns, bound_ns = snap.apply(at_ns)
    return {
        prefix + "offset_ns": (global_ns - at_ns, False),
        prefix + "offset_bound_ns": (bound_ns, True),
        prefix + "drift_ppb": (snap.drift_ps_per_s / 1000.0, False),
        prefix + "bound_growth_ppb": (snap.bound_growth_ps_per_s / 1000.0, False),
    }


def identity_stats(snap: reader.Snapshot, now_ns: int) -> dict:
    """Which record the global timeline comes from, and its device maps
    (those valid at ``now_ns``)."""
    stats = {
        "clock_anchor_ns": (snap.anchor_local_ns, False),
        "clock_reference_id": (snap.reference_id, True),
        "clock_agent_epoch": (snap.epoch, True),
        "clock_window": (snap.window, True),
        "clock_flags": (snap.flags, True),
    }
    for d in snap.devices:
        if not d.flags & reader.DEV_F_VALID or d.valid_until_ns < now_ns:
            continue
        p = f"clock_device_{d.device_id}_"
        stats[p + "offset_ns"] = (d.offset_ns, False)
        stats[p + "bound_ns"] = (d.bound_ns, True)
        stats[p + "drift_ppb"] = (d.drift_ps_per_s / 1000.0, False)
        stats[p + "anchor_ns"] = (d.device_anchor_ns, False)
        stats[p + "kind"] = (_KINDS.get(d.kind, "unknown"), False)
    return stats


def clock_stats(snap: reader.Snapshot, session_start_ns: int) -> dict:
    """One record's stats: its start anchor at ``session_start_ns`` and its
    identity (devices valid then)."""
    return {**anchor_stats(snap, session_start_ns), **identity_stats(snap, session_start_ns)}


def stop_stats(snap: reader.Snapshot, stop_ns: int) -> dict:
    """The stop anchor: the record read at the stop, at ``stop_ns``."""
    return {"clock_stop_at_ns": (stop_ns, False), **anchor_stats(snap, stop_ns, "clock_stop_")}


def read_fresh(offsets_path: Optional[str]) -> reader.Snapshot:
    """The agent's record now, or ClockmeshError (missing, stale, ...)."""
    r = reader.OffsetsReader(offsets_path)
    try:
        snap = r.read_snapshot()
    finally:
        r.close()
    snap.check_fresh()
    return snap


def _time_stat(value) -> Optional[int]:
    """A session time stat as XLA writes it (uint64 or int64), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def annotate_xspace(
    data: bytes,
    offsets_path: Optional[str] = None,
    start_snapshot: Optional[reader.Snapshot] = None,
    process: Optional[tuple] = None,
) -> bytes:
    """Adds the clock stats to serialized XSpace bytes (fail closed).

    ``start_snapshot``: the record read when the session started, if that
    read succeeded and was fresh then (None: not read, or it failed); it is
    not checked for freshness again. The stop record is read here.

    Start anchor (``clock_offset_ns`` ...): the start record at
    ``profile_start_time``, else the stop record there ("stop-only", its
    bound grown over the session). Stop anchor (``clock_stop_*``): the stop
    record at ``clock_stop_at_ns`` = ``profile_stop_time``, else the local
    time of the stop read; absent when that read failed. Identity and
    devices: the stop record, else the start record. ``clock_anchors``:
    "start+stop", "start" or "stop-only"; ``clock_status``: "ok" when at
    least one anchor was recorded, else why not (and no other clock stat).
    Every ``clock_*`` stat already on the plane is replaced."""
    env_stats = xspace.task_env_stats(data)
    try:
        stop_snap, error = read_fresh(offsets_path), None
    except READ_ERRORS as e:
        stop_snap, error = None, f"{type(e).__name__}: {e}"
    read_ns = reader.time.time_ns()
    start = _time_stat(env_stats.get(PROFILE_START_TIME))
    start = read_ns if start is None else start
    stop = _time_stat(env_stats.get(PROFILE_STOP_TIME))
    stop = read_ns if stop is None else stop

    stats, anchors = {}, None
    if start_snapshot is not None:
        stats.update(anchor_stats(start_snapshot, start))
        anchors = "start+stop" if stop_snap is not None else "start"
    elif stop_snap is not None:
        # The stop record stands in at the start (its bound grown, apply()).
        stats.update(anchor_stats(stop_snap, start))
        anchors = "stop-only"
    if stop_snap is not None:
        stats.update(identity_stats(stop_snap, start))
        stats.update(stop_stats(stop_snap, stop))
    elif start_snapshot is not None:
        stats.update(identity_stats(start_snapshot, start))
    status = "ok" if anchors else (error or "no offsets record")

    def edit(env: xspace.TaskEnv) -> None:
        _drop_clock_stats(env)
        env.set("clock_status", status)
        if anchors:
            env.set("clock_anchors", anchors)
        for name, (value, unsigned) in stats.items():
            env.set(name, value, unsigned)
        if process is not None:
            # Which process of a multi-process job this host's trace is
            # (jax.process_index(), jax.process_count()): xprof's own
            # process_id stat is the OS pid. `clockmesh trace collectives`
            # names ranks by it.
            env.set(PROCESS_INDEX, process[0], True)
            env.set(PROCESS_COUNT, process[1], True)

    return xspace.edit_task_env(data, edit)


def _drop_clock_stats(env: xspace.TaskEnv) -> None:
    """Removes the clock_* stats an earlier annotation left (a stop anchor
    or device that is gone now must not linger)."""
    clock_ids = {mid for mid, name in env.names.items() if name.startswith("clock_")}
    env.raw = [
        r for r in env.raw if not (r[0] == 6 and r[1] == xspace.LEN and xspace._stat_value(r[2])[0] in clock_ids)
    ]


PROCESS_INDEX = "jax_process_index"
PROCESS_COUNT = "jax_process_count"


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
        # The start record: kept only if fresh now, at the session start.
        start_snapshot = read_fresh(offsets_path)
    except READ_ERRORS:
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
                process = (jax.process_index(), jax.process_count())
                session.export(annotate_xspace(data, offsets_path, start_snapshot, process), str(log_dir))
            finally:
                state.reset()
                jax_profiler.clear_metadata()
