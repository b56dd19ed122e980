"""Writes offsets files (layout version 2) straight from
docs/offsets-format.md, for tests that run without the Rust agent
(offsets/tests/publish_python_reader.rs checks the Python reader against the
real Rust writer)."""

import hashlib
import struct

FILE_WORDS = 36864 // 8
RING_HEAD_WORD = 1224 // 8
RING_WORD = 4096 // 8


def _sum(words):
    data = struct.pack(f"<{len(words)}Q", *words)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def seal(words):
    """Record checksum (byte 1216) and ring record 1 (slot 0) from the
    current record: call after changing payload words."""
    payload = words[9:152]
    words[152] = _sum(payload)
    slot = [1] + payload[:11]
    slot += [_sum(slot), payload[14]]  # checksum of +0..+96, the holdover ceiling
    words[RING_WORD : RING_WORD + 16] = slot + [_sum(slot)] + [0]  # checksum of +0..+112
    words[RING_HEAD_WORD] = 1


def write_offsets(
    path,
    offset_ns,
    anchor_ns,
    valid_until_ns,
    flags=1,
    drift_ps_per_s=0,
    bound_ns=100,
    window=1,
    bound_growth_ps_per_s=0,
    holdover_max_bound_ns=0,
):
    words = [0] * FILE_WORDS
    words[0] = struct.unpack("<Q", b"CLKMOFS1")[0]
    words[1] = 2 | (64 << 32)
    words[2] = 36864 | (16 << 32)
    words[3] = 64 | (64 << 32)
    words[5] = 4096 | (256 << 32)
    words[6] = 128
    words[8] = 2  # seqlock sequence: even, one completed write
    p = 9
    words[p + 0] = flags
    words[p + 1] = 1  # epoch
    words[p + 2] = window
    words[p + 5] = valid_until_ns & (2**64 - 1)
    words[p + 6] = anchor_ns & (2**64 - 1)
    words[p + 7] = offset_ns & (2**64 - 1)
    words[p + 8] = drift_ps_per_s & (2**64 - 1)
    words[p + 9] = bound_ns
    words[p + 10] = bound_growth_ps_per_s
    words[p + 14] = holdover_max_bound_ns
    seal(words)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{FILE_WORDS}Q", *words))


def edit_offsets(path, edit):
    """Applies ``edit(words)`` to the file's words, then reseals it."""
    with open(path, "rb") as f:
        data = f.read()
    words = list(struct.unpack(f"<{len(data) // 8}Q", data))
    edit(words)
    seal(words)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(words)}Q", *words))


def set_bound_growth(path, growth_ps_per_s):
    """Sets the record's bound_growth_ps_per_s (payload word 10,
    docs/offsets-format.md) and reseals the file."""

    def edit(w):
        w[9 + 10] = growth_ps_per_s

    edit_offsets(path, edit)
