"""Seqlock reader of the clockmesh offsets file (docs/offsets-format.md)."""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

DEFAULT_PATH = "/run/clockmesh/offsets"
MAGIC = struct.unpack("<Q", b"CLKMOFS1")[0]
VERSION = 1
FILE_LEN = 4096
SEQ_OFFSET = 64
PAYLOAD_OFFSET = 72
RECORD_END = 1216
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
CLOCK_HOLDOVER = 2  # carried forward: the reference was unreachable
CLOCK_STALE = 3  # past its validity or flagged stale: free-running
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class Now:
    """Global time now as an interval holding the true global time."""

    earliest_ns: int
    latest_ns: int
    status: int  # CLOCK_*
    epoch: int


def clock_status(flags: int, now_ns: int, valid_until_ns: int) -> int:
    """The state of a record with ``flags`` valid until ``valid_until_ns``."""
    if not flags & F_VALID:
        return CLOCK_UNKNOWN
    if flags & F_STALE or now_ns > valid_until_ns:
        return CLOCK_STALE
    if flags & F_HOLDOVER:
        return CLOCK_HOLDOVER
    return CLOCK_SYNCHRONISED

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

    def check_fresh(self, now_ns: Optional[int] = None) -> None:
        """Raises NoData/Stale unless the data is usable at ``now_ns``."""
        now = time.time_ns() if now_ns is None else now_ns
        if not self.flags & F_VALID:
            raise NoData("no estimate published yet")
        if self.flags & F_STALE or now > self.valid_until_ns:
            raise Stale(f"offsets stale (valid until {self.valid_until_ns}, now {now}, flags {self.flags:#x})")

    def apply(self, local_ns: int) -> Tuple[int, int]:
        """(global_ns, bound_ns) for a local CLOCK_REALTIME stamp (exact ints)."""
        age = local_ns - self.anchor_local_ns
        drift = _trunc_div(self.drift_ps_per_s * age, _PS_PER_S)
        growth = -(-self.bound_growth_ps_per_s * abs(age) // _PS_PER_S)
        return local_ns + self.offset_ns + drift, self.bound_ns + growth


def _trunc_div(a: int, b: int) -> int:
    """Integer division rounding toward zero, like C and Rust."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _i64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


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
    )


class OffsetsReader:
    """A read-only mapping of the offsets file."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or os.environ.get("CLOCKMESH_OFFSETS_PATH", DEFAULT_PATH)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise Missing(f"{self.path}: no offsets file (is the clockmesh agent running?)") from None
        try:
            if os.fstat(fd).st_size < FILE_LEN:
                raise BadFormat(f"{self.path}: too short for an offsets file")
            self._mm = mmap.mmap(fd, FILE_LEN, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, version_word = struct.unpack_from("<QQ", self._mm, 0)
        if magic != MAGIC:
            self.close()
            raise BadFormat(f"{self.path}: not a clockmesh offsets file")
        if version_word & 0xFFFFFFFF != VERSION:
            self.close()
            raise BadVersion(f"{self.path}: layout version {version_word & 0xFFFFFFFF}, expected {VERSION}")

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            mm.close()
            self._mm = None

    def __enter__(self) -> "OffsetsReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read_snapshot(self) -> Snapshot:
        """The whole record (not checked for freshness), via the seqlock.

        CPython copies the payload with one memcpy between two 8-byte loads
        of the sequence word; on x86-64 (TSO) loads are not reordered, so an
        unchanged even sequence proves the copy is one record.
        """
        unpack_seq = struct.Struct("<Q").unpack_from
        attempt, deadline = 0, None
        while True:
            (s1,) = unpack_seq(self._mm, SEQ_OFFSET)
            if not s1 & 1:
                payload = self._mm[PAYLOAD_OFFSET:RECORD_END]
                (s2,) = unpack_seq(self._mm, SEQ_OFFSET)
                if s1 == s2:
                    return _decode(struct.unpack(f"<{_WORDS}Q", payload))
            attempt += 1
            if attempt >= SPIN_ATTEMPTS:
                now = time.monotonic_ns()
                deadline = deadline or now + BUSY_TIMEOUT_NS
                if now > deadline:
                    raise Busy("offsets record kept changing during the read")
                time.sleep(20e-6)

    def now(self) -> Now:
        """Global time now: [global - bound, global + bound] at this
        instant (the bound grown over the record's age) and the clock's
        state. Holdover and stale records still give their widening
        interval; only a file that cannot be read raises."""
        snap = self.read_snapshot()
        now = time.time_ns()
        status = clock_status(snap.flags, now, snap.valid_until_ns)
        if status == CLOCK_UNKNOWN:
            return Now(_I64_MIN, _I64_MAX, status, snap.epoch)
        global_ns, bound_ns = snap.apply(now)
        return Now(global_ns - bound_ns, global_ns + bound_ns, status, snap.epoch)

    def to_global(self, local_ns: int) -> Tuple[int, int]:
        """(global_ns, bound_ns) for a local CLOCK_REALTIME stamp; fails closed."""
        snap = self.read_snapshot()
        snap.check_fresh()
        return snap.apply(local_ns)
