"""Layout v2 in the pure-Python reader: torn copies are never returned,
and records hold over past their validity up to their ceiling.

Python has no memory fences: on aarch64 the bytes copied between two reads
of the same even sequence word can still mix two records. These tests
inject exactly that (a fake mapping whose copies are half the old file and
half the new one, with the sequence word unchanged) and check that the
reader notices it by the record checksum, copies again, and fails closed
(Busy) rather than return a mixed record. The ring semantics and the
agreement with the C and Rust readers are tested against the real writer in
offsets/tests/publish_ring.rs.
"""

import os
import pathlib
import struct
import sys
import tempfile
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from clockmesh import reader  # noqa: E402
from offsets_fixture import write_offsets  # noqa: E402

SLOT0 = reader.RING_OFFSET  # ring record 1 lives in slot 0


class TornMapping:
    """Slices of ``new``, except that the next ``torn`` copies longer than
    the sequence word take the bytes before ``tear_at`` from ``old``. Both
    images carry the same even sequence word: the seqlock check passes."""

    def __init__(self, old: bytes, new: bytes, tear_at: int, torn: int):
        assert old[64:72] == new[64:72]
        self.old, self.new, self.tear_at, self.torn = old, new, tear_at, torn
        self.copies = 0

    def __getitem__(self, sl):
        start, stop = sl.start or 0, sl.stop
        if stop - start <= 8:
            return self.new[start:stop]
        self.copies += 1
        if self.torn > 0 and start < self.tear_at < stop:
            self.torn -= 1
            return self.old[start : self.tear_at] + self.new[self.tear_at : stop]
        return self.new[start:stop]


def image(offset_ns, anchor_ns, bound_ns, drift_ps_per_s=0, valid_until_ns=None, **kw):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "o")
        valid_until_ns = anchor_ns + 10**12 if valid_until_ns is None else valid_until_ns
        write_offsets(p, offset_ns, anchor_ns, valid_until_ns, bound_ns=bound_ns, drift_ps_per_s=drift_ps_per_s, **kw)
        return pathlib.Path(p).read_bytes()


class TornReads(unittest.TestCase):
    def setUp(self):
        self.t = time.time_ns()
        # Same anchor, different offset, drift and bound: a mixed record
        # would give an answer that neither record gives.
        self.old = image(-1_000, self.t, 40, drift_ps_per_s=0)
        self.new = image(+7_000, self.t, 90, drift_ps_per_s=5_000_000)

    def test_the_injected_copy_really_mixes_two_records(self):
        tear = reader.PAYLOAD_OFFSET + 8 * 8  # offset (word 7) old, drift (word 8) on new
        mixed = self.old[reader.PAYLOAD_OFFSET : tear] + self.new[tear : reader.RECORD_CHECKSUM_OFFSET]
        words = struct.unpack(f"<{len(mixed) // 8}Q", mixed)
        self.assertEqual((reader._i64(words[7]), words[8], words[9]), (-1_000, 5_000_000, 90))
        self.assertNotEqual(reader.checksum(mixed), struct.unpack_from("<Q", self.new, reader.RECORD_CHECKSUM_OFFSET)[0])

    def test_a_torn_current_record_is_read_again(self):
        mm = TornMapping(self.old, self.new, reader.PAYLOAD_OFFSET + 8 * 8, torn=3)
        r = reader.OffsetsReader._from_buffer(mm)
        mm.copies = 0  # the header check's copy
        snap = r.read_snapshot()
        self.assertEqual((snap.offset_ns, snap.drift_ps_per_s, snap.bound_ns), (7_000, 5_000_000, 90))
        self.assertEqual(mm.copies, 4)  # three torn copies refused, the fourth whole
        n = r.now()  # now() reads through the same check
        self.assertGreaterEqual(n.latest_ns - n.earliest_ns, 180)

    def test_a_torn_ring_record_is_read_again(self):
        tear = SLOT0 + 8 * 9  # slot word 8 (offset) old, word 9 (drift) on new
        mm = TornMapping(self.old, self.new, tear, torn=5)
        r = reader.OffsetsReader._from_buffer(mm)
        mm.copies = 0  # the header check's copy
        at = self.t + 2_000_000_000
        self.assertEqual(r.to_global(at), (at + 7_000 + 10_000, 90))
        self.assertEqual(mm.copies, 6)

    def test_a_record_torn_on_every_copy_fails_closed(self):
        for tear, read in [
            (reader.PAYLOAD_OFFSET + 8 * 8, lambda r: r.read_snapshot()),
            (reader.PAYLOAD_OFFSET + 8 * 8, lambda r: r.now()),
            (SLOT0 + 8 * 9, lambda r: r.to_global(self.t + 1)),
        ]:
            mm = TornMapping(self.old, self.new, tear, torn=10**9)
            r = reader.OffsetsReader._from_buffer(mm)
            with self.assertRaises(reader.Busy):
                read(r)
            self.assertGreater(mm.copies, reader.SPIN_ATTEMPTS)

    def test_a_torn_ring_head_is_not_taken_for_an_empty_ring(self):
        # Head word from a later state (record 2) but the ring still shows
        # record 1 in slot 1's place: the newest slot must hold `head`.
        new = bytearray(self.new)
        struct.pack_into("<Q", new, reader.RING_HEAD_OFFSET, 2)
        mm = TornMapping(bytes(new), bytes(new), 0, torn=0)
        r = reader.OffsetsReader._from_buffer(mm)
        with self.assertRaises(reader.Busy):
            r.to_global(self.t + 1)


S = 1_000_000_000


class Holdover(unittest.TestCase):
    """Bound 100 ns growing 100 ns/s, valid 12 s, ceiling 10 µs: holdover
    from 12 s to 99 s after the anchor (the bound then equals the ceiling),
    stale after (offsets/tests/publish_ring.rs checks the same instants in
    all three readers against the Rust writer)."""

    def reader(self, mm):
        return reader.OffsetsReader._from_buffer(mm)

    def held(self, anchor, **kw):
        args = dict(valid_until_ns=anchor + 12 * S, bound_growth_ps_per_s=100_000, holdover_max_bound_ns=10_000)
        args.update(kw)
        return image(-5_000, anchor, 100, **args)

    def test_state_and_bound_at_the_edges(self):
        a = time.time_ns() - 30 * S
        r = self.reader(self.held(a))
        snap = r.read_snapshot()
        self.assertEqual(snap.holdover_max_bound_ns, 10_000)
        cases = [
            (a + S, reader.CLOCK_SYNCHRONISED, 200),
            (a + 12 * S, reader.CLOCK_SYNCHRONISED, 1_300),
            (a + 12 * S + 1, reader.CLOCK_HOLDOVER, 1_301),
            (a + 99 * S, reader.CLOCK_HOLDOVER, 10_000),
            (a + 99 * S + 1, reader.CLOCK_STALE, 10_001),
        ]
        for t, state, bound in cases:
            self.assertEqual((snap.status(t), snap.apply(t)[1]), (state, bound), t)
            if state == reader.CLOCK_STALE:
                with self.assertRaises(reader.Stale):
                    snap.check_fresh(t)
                with self.assertRaises(reader.Stale):
                    r.to_global(t)
            else:
                snap.check_fresh(t)
                self.assertEqual(r.to_global(t), snap.apply(t))
        # Now: 30 s after the anchor, in holdover, the bound grown ~3 µs.
        n = r.now()
        self.assertEqual(n.status, reader.CLOCK_HOLDOVER)
        self.assertGreaterEqual(n.latest_ns - n.earliest_ns, 2 * 3_100)

    def test_no_holdover_without_a_ceiling_a_growing_bound_or_when_flagged_stale(self):
        a = time.time_ns() - 30 * S
        for kw in [dict(holdover_max_bound_ns=0), dict(bound_growth_ps_per_s=0), dict(flags=reader.F_VALID | reader.F_STALE)]:
            r = self.reader(self.held(a, **kw))
            self.assertEqual(r.now().status, reader.CLOCK_STALE, kw)
            with self.assertRaises(reader.Stale):
                r.to_global(a + 12 * S + 1)

    def test_a_ring_slot_whose_ceiling_is_torn_is_read_again(self):
        # Same record, ceilings 10 µs (old) and 4 µs (new): a copy with the
        # old ceiling (slot word 13) and the new ceiling's checksum (word
        # 14) must not serve the old ceiling; it is copied again.
        a = time.time_ns() - 60 * S  # bound now ~6.1 µs: within the old ceiling only
        old, new = self.held(a), self.held(a, holdover_max_bound_ns=4_000)
        mm = TornMapping(old, new, SLOT0 + 8 * 14, torn=3)
        r = self.reader(mm)
        mm.copies = 0
        with self.assertRaises(reader.Stale):
            r.to_global(a + 60 * S)
        self.assertEqual(mm.copies, 4)
        mm = TornMapping(old, new, SLOT0 + 8 * 14, torn=10**9)
        with self.assertRaises(reader.Busy):
            self.reader(mm).to_global(a + 60 * S)

    def test_a_slot_written_before_the_ceiling_existed_has_none(self):
        # Bytes +104..+128 of a slot were reserved (0): no ceiling, no
        # second checksum; such a record is stale right past its validity.
        a = time.time_ns() - 30 * S
        data = bytearray(self.held(a))
        data[SLOT0 + 104 : SLOT0 + 120] = bytes(16)
        r = self.reader(bytes(data))
        self.assertEqual(r.to_global(a + S), r.read_snapshot().apply(a + S))
        with self.assertRaises(reader.Stale):
            r.to_global(a + 12 * S + 1)


class Version(unittest.TestCase):
    def test_a_v1_file_is_refused(self):
        d = tempfile.mkdtemp()
        p = os.path.join(d, "o")
        data = bytearray(image(5, time.time_ns(), 40)[:4096])
        struct.pack_into("<Q", data, 8, 1 | (64 << 32))
        struct.pack_into("<Q", data, 16, 4096 | (16 << 32))
        pathlib.Path(p).write_bytes(data)
        with self.assertRaises(reader.BadVersion):
            reader.OffsetsReader(p)


if __name__ == "__main__":
    unittest.main(verbosity=2)
