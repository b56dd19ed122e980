"""Minimal protobuf wire-format editing of XSpace bytes (pure Python).

jaxlib ships no ``xplane_pb2``, so this edits the serialized XSpace
directly: only the "Task Environment" plane is decoded (it is small) and
re-encoded; every other plane is copied byte for byte, and unknown fields
of the Task Environment plane are kept.
"""

from __future__ import annotations

import struct
from typing import Dict, Iterator, List, Optional, Tuple, Union

TASK_ENV_PLANE = "Task Environment"
Value = Union[int, float, str]

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed XSpace."""


def _read_varint(b: bytes, i: int) -> Tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise WireError(f"bad varint at byte {i}")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def fields(b: bytes) -> Iterator[Tuple[int, int, Union[int, bytes], bytes]]:
    """Yields (field, wire type, value, raw bytes of the whole field)."""
    i = 0
    while i < len(b):
        start = i
        key, i = _read_varint(b, i)
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            value, i = _read_varint(b, i)
        elif wire == I64:
            value, i = b[i : i + 8], i + 8
        elif wire == I32:
            value, i = b[i : i + 4], i + 4
        elif wire == LEN:
            n, i = _read_varint(b, i)
            value, i = b[i : i + n], i + n
        else:
            raise WireError(f"unsupported wire type {wire} at byte {start}")
        if i > len(b):
            raise WireError(f"field at byte {start} runs past the end")
        yield field, wire, value, b[start:i]


def _len_field(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | LEN) + _varint(len(body)) + body


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _stat_value(stat: bytes) -> Tuple[int, Optional[Value]]:
    mid, value = 0, None
    for f, w, v, _ in fields(stat):
        if f == 1 and w == VARINT:
            mid = v
        elif f == 2 and w == I64:
            value = struct.unpack("<d", v)[0]
        elif f == 3 and w == VARINT:
            value = v
        elif f == 4 and w == VARINT:
            value = _signed(v)
        elif f == 5 and w == LEN:
            value = v.decode("utf-8", "replace")
    return mid, value


def _encode_stat(mid: int, value: Value, unsigned: bool = False) -> bytes:
    body = _varint(1 << 3 | VARINT) + _varint(mid)
    if isinstance(value, bool) or isinstance(value, int):
        body += _varint((3 if unsigned else 4) << 3 | VARINT) + _varint(int(value))
    elif isinstance(value, float):
        body += _varint(2 << 3 | I64) + struct.pack("<d", value)
    else:
        body += _len_field(5, str(value).encode())
    return body


class TaskEnv:
    """The decoded Task Environment plane: raw fields plus a stat view."""

    def __init__(self, body: bytes):
        self.raw: List[Tuple[int, int, Union[int, bytes], bytes]] = list(fields(body))
        self.names: Dict[int, str] = {}
        for f, w, v, _ in self.raw:
            if f == 5 and w == LEN:  # map<int64, XStatMetadata> entry
                key, name = None, None
                for ef, ew, ev, _ in fields(v):
                    if ef == 1 and ew == VARINT:
                        key = ev
                    elif ef == 2 and ew == LEN:
                        for mf, mw, mv, _ in fields(ev):
                            if mf == 2 and mw == LEN:
                                name = mv.decode("utf-8", "replace")
                if key is not None and name is not None:
                    self.names[key] = name

    def stats(self) -> Dict[str, Value]:
        out = {}
        for f, w, v, _ in self.raw:
            if f == 6 and w == LEN:
                mid, value = _stat_value(v)
                out[self.names.get(mid, f"#{mid}")] = value
        return out

    def _id_for(self, name: str) -> int:
        for k, n in self.names.items():
            if n == name:
                return k
        new = max(self.names, default=0) + 1
        meta = _varint(1 << 3 | VARINT) + _varint(new) + _len_field(2, name.encode())
        entry = _varint(1 << 3 | VARINT) + _varint(new) + _len_field(2, meta)
        self.raw.append((5, LEN, entry, _len_field(5, entry)))
        self.names[new] = name
        return new

    def set(self, name: str, value: Value, unsigned: bool = False) -> None:
        """Sets a stat, replacing any previous value of that name."""
        mid = self._id_for(name)
        self.raw = [r for r in self.raw if not (r[0] == 6 and r[1] == LEN and _stat_value(r[2])[0] == mid)]
        stat = _encode_stat(mid, value, unsigned)
        self.raw.append((6, LEN, stat, _len_field(6, stat)))

    def encode(self) -> bytes:
        return b"".join(r[3] for r in self.raw)


def _plane_name(plane: bytes) -> str:
    for f, w, v, _ in fields(plane):
        if f == 2 and w == LEN:
            return v.decode("utf-8", "replace")
    return ""


def edit_task_env(xspace: bytes, edit) -> bytes:
    """Applies ``edit(TaskEnv)`` to the Task Environment plane (added if
    missing) and returns the new XSpace bytes; other planes are untouched."""
    out, done, max_id = [], False, 0
    for f, w, v, raw in fields(xspace):
        if f == 1 and w == LEN:
            for pf, pw, pv, _ in fields(v):
                if pf == 1 and pw == VARINT:
                    max_id = max(max_id, pv)
            if not done and _plane_name(v) == TASK_ENV_PLANE:
                env = TaskEnv(v)
                edit(env)
                out.append(_len_field(1, env.encode()))
                done = True
                continue
        out.append(raw)
    if not done:
        body = _varint(1 << 3 | VARINT) + _varint(max_id + 1) + _len_field(2, TASK_ENV_PLANE.encode())
        env = TaskEnv(body)
        edit(env)
        out.append(_len_field(1, env.encode()))
    return b"".join(out)


def task_env_stats(xspace: bytes) -> Dict[str, Value]:
    """Stats of the Task Environment plane by name ({} if there is none)."""
    for f, w, v, _ in fields(xspace):
        if f == 1 and w == LEN and _plane_name(v) == TASK_ENV_PLANE:
            return TaskEnv(v).stats()
    return {}
