"""Seqlock reader of the clockmesh offsets file, layout version 2
(docs/offsets-format.md).

Python has no memory fences, so on a weakly ordered CPU (aarch64) an
unchanged even sequence word does not prove that a copy is one record. The
writer stores a BLAKE2b-64 checksum with every record (the current record
and each ring slot); this reader copies the bytes it needs with one slice of
the mapping, checks the sequence word around the copy, and checks every
record it uses against its checksum: a torn copy (a record half old, half
new) fails the checksum whatever the ordering, and is read again (then
``Busy``), never returned.

A record answers (synchronised, or holdover) within its validity and, past
it, while its bound grown at the published rate stays within the record's
holdover ceiling (``Snapshot.status``, the rule the C and Rust readers use).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

DEFAULT_PATH = "/run/clockmesh/offsets"
MAGIC = struct.unpack("<Q", b"CLKMOFS1")[0]
VERSION = 2
HEADER_LEN = 64
SEQ_OFFSET = 64
PAYLOAD_OFFSET = 72
RECORD_END = 1216
RECORD_CHECKSUM_OFFSET = 1216  # BLAKE2b-64 of bytes 72..1216
RING_HEAD_OFFSET = 1224  # records ever appended to the ring
RING_OFFSET = 4096
RING_SLOTS = 256  # 256 x the 1 s default window: 4.3 minutes
SLOT_LEN = 128  # number, 11 core words, BLAKE2b-64 of bytes 0..96, ceiling, BLAKE2b-64 of bytes 0..112
HOLDOVER_WORD = 14  # payload word of holdover_max_bound_ns (byte 184)
FILE_LEN = RING_OFFSET + RING_SLOTS * SLOT_LEN  # 36864
MAX_DEVICES = 16
SPIN_ATTEMPTS = 64
BUSY_TIMEOUT_NS = 50_000_000

F_VALID = 0x1
F_STALE = 0x2
F_HOLDOVER = 0x4
F_REFERENCE = 0x8
DEV_F_VALID = 0x1

# The clock's state (now()), the same values as the C and Rust readers'.
CLOCK_UNKNOWN = 0  # nothing published yet: no interval
CLOCK_SYNCHRONISED = 1  # a current solve
CLOCK_HOLDOVER = 2  # carried forward without a current solve: the bound grows, up to the ceiling
CLOCK_STALE = 3  # flagged stale, or past its validity and the holdover ceiling: no answer
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class Now:
    """Global time now as an interval holding the true global time."""

    earliest_ns: int
    latest_ns: int
    status: int  # CLOCK_*
    epoch: int


def clock_status(
    flags: int, t: int, valid_until_ns: int, bound_at_t: int = 0, growth_ps_per_s: int = 0, holdover_max_bound_ns: int = 0
) -> int:
    """The state of a record at local time ``t``, the one rule of every
    reader (docs/offsets-format.md, "The state of a record"): unknown
    without VALID; stale when flagged STALE; up to ``valid_until_ns``
    holdover if flagged HOLDOVER, else synchronised; past it holdover while
    ``bound_at_t`` (the bound grown to ``t``) is at most
    ``holdover_max_bound_ns``, which must be set, with a bound that grows
    (``growth_ps_per_s``); then stale."""
    if not flags & F_VALID:
        return CLOCK_UNKNOWN
    if flags & F_STALE:
        return CLOCK_STALE
    if t <= valid_until_ns:
        return CLOCK_HOLDOVER if flags & F_HOLDOVER else CLOCK_SYNCHRONISED
    if holdover_max_bound_ns and growth_ps_per_s and bound_at_t <= holdover_max_bound_ns:
        return CLOCK_HOLDOVER
    return CLOCK_STALE

_PS_PER_S = 1_000_000_000_000


class ClockmeshError(Exception):
    """Base class; every error means: do not use an offset."""

    code = -100


class Missing(ClockmeshError):
    code = -1


class BadFormat(ClockmeshError):
    code = -2


class BadVersion(ClockmeshError):
    code = -3


class NoData(ClockmeshError):
    code = -4


class Stale(ClockmeshError):
    code = -5


class Busy(ClockmeshError):
    code = -6


class NoDevice(ClockmeshError):
    """No map for that device in the record (C: CLOCKMESH_E_NOT_FOUND)."""

    code = -8


class TooOld(ClockmeshError):
    """The stamp is older than the oldest record the file keeps."""

    code = -10


class _Torn(Exception):
    """A copy that fails its checksum: read again."""


def checksum(data: bytes) -> int:
    """The writer's per-record checksum: BLAKE2b-64, little-endian."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class DeviceMap:
    device_id: int
    kind: int  # 0 unknown, 1 CUDA, 2 ROCm, 3 synthetic
    flags: int
    device_anchor_ns: int
    offset_ns: int
    drift_ps_per_s: int
    bound_ns: int
    valid_until_ns: int


@dataclass(frozen=True)
class Snapshot:
    flags: int
    epoch: int
    window: int
    reference_id: int
    updated_at_ns: int
    valid_until_ns: int
    anchor_local_ns: int
    offset_ns: int
    drift_ps_per_s: int
    bound_ns: int
    bound_growth_ps_per_s: int
    realtime_minus_monotonic_ns: int
    realtime_minus_boottime_ns: int
    kernel_clocks_sampled_at_ns: int
    devices: List[DeviceMap] = field(default_factory=list)
    # Past valid_until_ns: holdover while the grown bound is at most this (0: never).
    holdover_max_bound_ns: int = 0

    def status(self, t: Optional[int] = None) -> int:
        """The record's state (CLOCK_*) at local time ``t`` (default now)."""
        t = time.time_ns() if t is None else t
        return clock_status(
            self.flags,
            t,
            self.valid_until_ns,
            self.apply(t)[1],
            self.bound_growth_ps_per_s,
            self.holdover_max_bound_ns,
        )

    def check_fresh(self, now_ns: Optional[int] = None) -> None:
        """Raises NoData/Stale unless the record answers at ``now_ns``
        (synchronised, or holdover within its ceiling)."""
        now = time.time_ns() if now_ns is None else now_ns
        _raise_unless_answer(self.status(now), now, self.valid_until_ns, self.flags)

    def apply(self, local_ns: int) -> Tuple[int, int]:
        """(global_ns, bound_ns) for a local CLOCK_REALTIME stamp (exact ints)."""
        return _apply(
            local_ns, self.anchor_local_ns, self.offset_ns, self.drift_ps_per_s, self.bound_ns, self.bound_growth_ps_per_s
        )


def _apply(t: int, anchor: int, offset: int, drift: int, bound: int, growth: int) -> Tuple[int, int]:
    """The map of docs/offsets-format.md at ``t``, saturated like C and Rust."""
    age = t - anchor
    d = _trunc_div(drift * age, _PS_PER_S)
    g = -(-growth * abs(age) // _PS_PER_S)
    return _sat_i64(t + offset + d), _sat_u64(bound + g)


def _raise_unless_answer(status: int, t: int, valid_until_ns: int, flags: int) -> None:
    """NoData (unknown) or Stale for a state that is no answer."""
    if status == CLOCK_UNKNOWN:
        raise NoData("no estimate published yet")
    if status == CLOCK_STALE:
        raise Stale(
            f"offsets stale at {t} (valid until {valid_until_ns}, past the holdover ceiling, or flags {flags:#x})"
        )


def _trunc_div(a: int, b: int) -> int:
    """Integer division rounding toward zero, like C and Rust."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _i64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _sat_i64(v: int) -> int:
    return max(_I64_MIN, min(_I64_MAX, v))


def _sat_u64(v: int) -> int:
    return max(0, min((1 << 64) - 1, v))


def _check_header(h: bytes, path: str) -> None:
    """Magic, then version (a v1 file is BadVersion), then geometry."""
    if len(h) < HEADER_LEN:
        raise BadFormat(f"{path}: too short for an offsets file")
    w = struct.unpack_from("<8Q", h)
    if w[0] != MAGIC:
        raise BadFormat(f"{path}: not a clockmesh offsets file")
    if w[1] & 0xFFFFFFFF != VERSION:
        raise BadVersion(f"{path}: layout version {w[1] & 0xFFFFFFFF}, expected {VERSION}")
    geometry = (
        VERSION | (HEADER_LEN << 32),
        FILE_LEN | (MAX_DEVICES << 32),
        64 | (SEQ_OFFSET << 32),
        RING_OFFSET | (RING_SLOTS << 32),
        SLOT_LEN,
    )
    if (w[1], w[2], w[3], w[5], w[6]) != geometry:
        raise BadFormat(f"{path}: unexpected offsets file geometry")


def device_to_host(d: DeviceMap, device_ns: int) -> int:
    """Host CLOCK_REALTIME of a device clock reading (Rust DeviceMap::to_host)."""
    age = device_ns - d.device_anchor_ns
    return _sat_i64(device_ns + d.offset_ns + _trunc_div(d.drift_ps_per_s * age, _PS_PER_S))


_WORDS = (RECORD_END - PAYLOAD_OFFSET) // 8


def _decode(words) -> Snapshot:
    flags = words[0] & 0xFFFFFFFF
    count = min(words[0] >> 32, MAX_DEVICES)
    devices = []
    for i in range(count):
        d = words[15 + 8 * i : 23 + 8 * i]
        devices.append(
            DeviceMap(
                device_id=d[0] & 0xFFFFFFFF,
                kind=(d[0] >> 32) & 0xFFFF,
                flags=(d[0] >> 48) & 0xFFFF,
                device_anchor_ns=_i64(d[1]),
                offset_ns=_i64(d[2]),
                drift_ps_per_s=_i64(d[3]),
                bound_ns=d[4],
                valid_until_ns=_i64(d[5]),
            )
        )
    return Snapshot(
        flags=flags,
        epoch=words[1],
        window=words[2],
        reference_id=words[3],
        updated_at_ns=_i64(words[4]),
        valid_until_ns=_i64(words[5]),
        anchor_local_ns=_i64(words[6]),
        offset_ns=_i64(words[7]),
        drift_ps_per_s=_i64(words[8]),
        bound_ns=words[9],
        bound_growth_ps_per_s=words[10],
        realtime_minus_monotonic_ns=_i64(words[11]),
        realtime_minus_boottime_ns=_i64(words[12]),
        kernel_clocks_sampled_at_ns=_i64(words[13]),
        devices=devices,
        holdover_max_bound_ns=words[HOLDOVER_WORD],
    )


class OffsetsReader:
    """A read-only mapping of the offsets file."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or os.environ.get("CLOCKMESH_OFFSETS_PATH", DEFAULT_PATH)
        self._mm = None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise Missing(f"{self.path}: no offsets file (is the clockmesh agent running?)") from None
        try:
            _check_header(os.pread(fd, HEADER_LEN, 0), self.path)
            if os.fstat(fd).st_size < FILE_LEN:
                raise BadFormat(f"{self.path}: too short for an offsets file")
            self._mm = mmap.mmap(fd, FILE_LEN, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)

    @classmethod
    def _from_buffer(cls, buf, path: str = "<buffer>") -> "OffsetsReader":
        """A reader over any object whose slices give bytes (tests inject
        torn copies this way); the header is checked as for a file."""
        r = cls.__new__(cls)
        r.path = path
        _check_header(bytes(buf[0:HEADER_LEN]), path)
        r._mm = buf
        return r

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            if hasattr(mm, "close"):
                mm.close()
            self._mm = None

    def __enter__(self) -> "OffsetsReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _consistent(self, lo: int, hi: int, parse):
        """``parse`` of one copy of bytes lo..hi taken under the seqlock.

        The copy is one slice (one memcpy); the sequence word is read
        before and after it. On x86-64 (TSO) an unchanged even sequence
        proves the copy is one state of the file; on weakly ordered CPUs it
        does not, so ``parse`` checks every record it uses against its
        checksum and raises _Torn on a mismatch: the copy is taken again.
        """
        mm = self._mm
        attempt, deadline = 0, None
        while True:
            s1 = int.from_bytes(mm[SEQ_OFFSET : SEQ_OFFSET + 8], "little")
            if not s1 & 1:
                blob = bytes(mm[lo:hi])
                s2 = int.from_bytes(mm[SEQ_OFFSET : SEQ_OFFSET + 8], "little")
                if s1 == s2:
                    try:
                        return parse(blob)
                    except _Torn:
                        pass
            attempt += 1
            if attempt >= SPIN_ATTEMPTS:
                now = time.monotonic_ns()
                deadline = deadline or now + BUSY_TIMEOUT_NS
                if now > deadline:
                    raise Busy("offsets record kept changing during the read")
                time.sleep(20e-6)

    def read_snapshot(self) -> Snapshot:
        """The whole current record (not checked for freshness)."""

        def parse(blob: bytes) -> Snapshot:
            payload, (stored,) = blob[:-8], struct.unpack_from("<Q", blob, len(blob) - 8)
            # A file never written holds zeros and no checksum yet.
            if stored != checksum(payload) and (stored or any(payload)):
                raise _Torn()
            return _decode(struct.unpack(f"<{_WORDS}Q", payload))

        return self._consistent(PAYLOAD_OFFSET, RECORD_CHECKSUM_OFFSET + 8, parse)

    def now(self) -> Now:
        """Global time now: [global - bound, global + bound] at this
        instant (the bound grown over the record's age) and the clock's
        state. Holdover and stale records still give their widening
        interval; only a file that cannot be read raises."""
        snap = self.read_snapshot()
        now = time.time_ns()
        global_ns, bound_ns = snap.apply(now)
        status = clock_status(
            snap.flags, now, snap.valid_until_ns, bound_ns, snap.bound_growth_ps_per_s, snap.holdover_max_bound_ns
        )
        if status == CLOCK_UNKNOWN:
            return Now(_I64_MIN, _I64_MAX, status, snap.epoch)
        return Now(_sat_i64(global_ns - bound_ns), _sat_i64(global_ns + bound_ns), status, snap.epoch)

    def _pick(self, t: int):
        """("found", (core words, holdover ceiling)) of the newest ring
        record anchored at or before t, ("empty", None) or ("too_old",
        oldest anchor)."""

        def parse(blob: bytes):
            base = SEQ_OFFSET
            (head,) = struct.unpack_from("<Q", blob, RING_HEAD_OFFSET - base)
            oldest = None
            n, k = head, 0
            while n >= 1 and k < RING_SLOTS:
                off = RING_OFFSET + ((n - 1) % RING_SLOTS) * SLOT_LEN - base
                words = struct.unpack_from("<13Q", blob, off)
                intact = words[12] == checksum(blob[off : off + 96])
                if words[0] != n:
                    # The newest slot always holds record `head`; below it a
                    # cleared (zero) or intact other slot ends the ring.
                    if n == head or not (intact or not any(words)):
                        raise _Torn()
                    break
                if not intact:
                    raise _Torn()
                anchor = _i64(words[7])
                if anchor <= t:
                    # The ceiling (word 13) has its own checksum (word 14,
                    # over bytes 0..112); both 0: written before it existed.
                    ceiling, ext = struct.unpack_from("<2Q", blob, off + 104)
                    if (ceiling or ext) and ext != checksum(blob[off : off + 112]):
                        raise _Torn()
                    return "found", (words[1:12], ceiling)
                oldest = anchor
                n, k = n - 1, k + 1
            return ("empty", None) if oldest is None else ("too_old", oldest)

        return self._consistent(SEQ_OFFSET, FILE_LEN, parse)

    def to_global(self, local_ns: int) -> Tuple[int, int]:
        """(global_ns, bound_ns) for a local CLOCK_REALTIME stamp, judged at
        the stamp's own time with the newest ring record anchored at or
        before it, if that record answers at the stamp (synchronised, or
        holdover: past its validity while the grown bound is within its
        ceiling); fails closed: NoData, Stale (record flagged stale, or the
        stamp past its validity and ceiling), TooOld (older than every
        record)."""
        kind, v = self._pick(local_ns)
        if kind == "empty":
            raise NoData("no estimate published yet")
        if kind == "too_old":
            raise TooOld(f"stamp {local_ns} is older than the oldest record the file keeps (anchored at {v})")
        core, ceiling = v
        flags, valid_until = core[0] & 0xFFFFFFFF, _i64(core[5])
        global_ns, bound_ns = _apply(local_ns, _i64(core[6]), _i64(core[7]), _i64(core[8]), core[9], core[10])
        status = clock_status(flags, local_ns, valid_until, bound_ns, core[10], ceiling)
        _raise_unless_answer(status, local_ns, valid_until, flags)
        return global_ns, bound_ns

    def device_to_global(self, device_id: int, device_ns: int) -> Tuple[int, int]:
        """(global_ns, bound_ns) of a GPU clock reading of device
        ``device_id``: the current record's device map gives the host time,
        judged at that time (NoDevice, NoData, Stale), then ``to_global``;
        the bound adds the device map's bound_ns."""
        snap = self.read_snapshot()
        d = next((d for d in snap.devices if d.device_id == device_id), None)
        if d is None:
            raise NoDevice(f"no map for device {device_id}")
        if not d.flags & DEV_F_VALID:
            raise NoData(f"device {device_id} map not valid")
        host_ns = device_to_host(d, device_ns)
        if host_ns > d.valid_until_ns:
            raise Stale(f"device {device_id} map stale at {host_ns} (valid until {d.valid_until_ns})")
        global_ns, bound_ns = self.to_global(host_ns)
        return global_ns, _sat_u64(bound_ns + d.bound_ns)
