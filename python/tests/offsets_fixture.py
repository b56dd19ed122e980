"""Writes offsets files straight from docs/offsets-format.md, for tests that
run without the Rust agent (agent/tests/publish_python_reader.rs checks the
Python reader against the real Rust writer)."""

import struct


def write_offsets(path, offset_ns, anchor_ns, valid_until_ns, flags=1, drift_ps_per_s=0, bound_ns=100, window=1):
    words = [0] * 512
    words[0] = struct.unpack("<Q", b"CLKMOFS1")[0]
    words[1] = 1 | (64 << 32)
    words[2] = 4096 | (16 << 32)
    words[3] = 64 | (64 << 32)
    words[8] = 2  # seqlock sequence: even, one completed write
    p = 9
    words[p + 0] = flags
    words[p + 1] = 1  # epoch
    words[p + 2] = window
    words[p + 5] = valid_until_ns
    words[p + 6] = anchor_ns
    words[p + 7] = offset_ns & (2**64 - 1)
    words[p + 8] = drift_ps_per_s & (2**64 - 1)
    words[p + 9] = bound_ns
    with open(path, "wb") as f:
        f.write(struct.pack("<512Q", *words))
