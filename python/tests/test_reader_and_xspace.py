"""Pure-Python reader and XSpace editing, without JAX."""

import os
import pathlib
import struct
import sys
import tempfile
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import clockmesh  # noqa: E402
from clockmesh import OffsetsReader, jax_profiler, xspace  # noqa: E402
from offsets_fixture import edit_offsets, set_bound_growth, write_offsets  # noqa: E402
from xplane_proto import xspace_class  # noqa: E402


class Installed(unittest.TestCase):
    def test_package_comes_from_the_install_not_the_source_tree(self):
        source_tree = HERE.parent / "clockmesh"
        installed = pathlib.Path(clockmesh.__file__).resolve().parent
        self.assertNotEqual(installed, source_tree.resolve())
        self.assertIn("site-packages", installed.parts)


class Reader(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "offsets")

    def test_fail_closed(self):
        with self.assertRaises(clockmesh.Missing):
            clockmesh.OffsetsReader(self.path)
        now = time.time_ns()
        write_offsets(self.path, 5, now, now - 1)
        with self.assertRaises(clockmesh.Stale):
            clockmesh.OffsetsReader(self.path).to_global(now)
        write_offsets(self.path, 5, now, now + 10**12, flags=1 | 2)
        with self.assertRaises(clockmesh.Stale):
            clockmesh.OffsetsReader(self.path).to_global(now)
        write_offsets(self.path, 5, now, now + 10**12, flags=0)
        with self.assertRaises(clockmesh.NoData):
            clockmesh.OffsetsReader(self.path).to_global(now)
        data = bytearray(pathlib.Path(self.path).read_bytes())
        data[8] = 7
        pathlib.Path(self.path).write_bytes(data)
        with self.assertRaises(clockmesh.BadVersion):
            clockmesh.OffsetsReader(self.path)
        # A layout v1 file (one 4096-byte page) is refused: fail closed.
        data[8] = 1
        pathlib.Path(self.path).write_bytes(data[:4096])
        with self.assertRaises(clockmesh.BadVersion):
            clockmesh.OffsetsReader(self.path)

    def test_map_matches_the_spec_arithmetic(self):
        now = time.time_ns()
        write_offsets(self.path, -1000, now, now + 10**12, drift_ps_per_s=-1_500_000, bound_ns=40)
        with clockmesh.OffsetsReader(self.path) as r:
            # 1.0000003 s after the anchor: drift -1500.00045 ns truncates to -1500.
            g, b = r.to_global(now + 1_000_000_300)
            self.assertEqual(g, now + 1_000_000_300 - 1000 - 1500)
            self.assertEqual(b, 40)
            # Before the only record's anchor: older than the ring keeps.
            with self.assertRaises(clockmesh.reader.TooOld):
                r.to_global(now - 1_000_000_300)
            self.assertEqual(r.read_snapshot().apply(now - 1_000_000_300)[0], now - 1_000_000_300 - 1000 + 1500)


class XSpaceEdit(unittest.TestCase):
    def test_stats_added_replaced_and_rest_kept(self):
        XSpace = xspace_class()
        s = XSpace()
        s.hostnames.append("h")
        cpu = s.planes.add(id=1, name="/host:CPU")
        cpu.lines.add(id=1, timestamp_ns=5).events.add(metadata_id=1, offset_ps=7)
        env = s.planes.add(id=2, name="Task Environment")
        env.stat_metadata[1].id = 1
        env.stat_metadata[1].name = "profile_start_time"
        env.stats.add(metadata_id=1, uint64_value=1795335288621242594)
        raw = s.SerializeToString()
        unknown = b"\xf8\x06\x2a"  # field 111 = 42, unknown to every schema
        raw += unknown
        now = time.time_ns()
        d = tempfile.mkdtemp()
        write_offsets(os.path.join(d, "o"), 123, now, now + 10**12)
        out = jax_profiler.annotate_xspace(raw, os.path.join(d, "o"))
        out = jax_profiler.annotate_xspace(out, os.path.join(d, "o"))  # idempotent
        self.assertIn(unknown, out)
        self.assertIn(cpu.SerializeToString(), out)
        stats = xspace.task_env_stats(out)
        self.assertEqual(stats["clock_offset_ns"], 123)
        self.assertEqual(stats["clock_status"], "ok")
        self.assertEqual(stats["profile_start_time"], 1795335288621242594)
        parsed = XSpace.FromString(out)
        names = [m.name for m in parsed.planes[1].stat_metadata.values()]
        self.assertEqual(names.count("clock_offset_ns"), 1)
        # Missing offsets: status only, no offset.
        out = jax_profiler.annotate_xspace(raw, os.path.join(d, "missing"))
        self.assertNotIn("clock_offset_ns", xspace.task_env_stats(out))
        self.assertTrue(xspace.task_env_stats(out)["clock_status"].startswith("Missing"))


def device_entry(path, slot, device_id, offset_ns, valid_until_ns):
    """Adds a valid CUDA device map in slot ``slot`` (the count word too)."""

    def edit(w):
        w[9] = (w[9] & 0xFFFFFFFF) | ((slot + 1) << 32)
        b = 9 + 15 + 8 * slot
        w[b : b + 6] = struct.unpack("<6Q", struct.pack("<Qqqqqq", device_id | (1 << 32) | (1 << 48), 100, offset_ns, 0, 7, valid_until_ns))

    edit_offsets(path, edit)


class OneVariable(unittest.TestCase):
    def test_the_reader_takes_the_agents_variable(self):
        d = tempfile.mkdtemp()
        p = os.path.join(d, "o")
        now = time.time_ns()
        write_offsets(p, 77, now, now + 10**12)
        old = os.environ.get("CLOCKMESH_OFFSETS_PATH")
        os.environ["CLOCKMESH_OFFSETS_PATH"] = p
        try:
            with OffsetsReader() as r:
                self.assertEqual(r.path, p)
                self.assertEqual(r.read_snapshot().offset_ns, 77)
        finally:
            if old is None:
                del os.environ["CLOCKMESH_OFFSETS_PATH"]
            else:
                os.environ["CLOCKMESH_OFFSETS_PATH"] = old


class NowInterval(unittest.TestCase):
    """now(): [earliest, latest] around the global time, and the state."""

    def test_states_and_interval(self):
        d = tempfile.mkdtemp()
        p = os.path.join(d, "o")
        now = time.time_ns()
        cases = [
            (clockmesh.reader.F_VALID, now + 10**12, clockmesh.CLOCK_SYNCHRONISED),
            (clockmesh.reader.F_VALID | clockmesh.reader.F_HOLDOVER, now + 10**12, clockmesh.CLOCK_HOLDOVER),
            (clockmesh.reader.F_VALID | clockmesh.reader.F_STALE, now + 10**12, clockmesh.CLOCK_STALE),
            (clockmesh.reader.F_VALID, now - 1, clockmesh.CLOCK_STALE),
        ]
        for flags, valid_until, status in cases:
            write_offsets(p, 5_000, now, valid_until, flags=flags, bound_ns=40)
            with OffsetsReader(p) as r:
                before = time.time_ns()
                n = r.now()
                after = time.time_ns()
            self.assertEqual((n.status, n.epoch), (status, 1))
            self.assertLessEqual(n.earliest_ns, after + 5_000)
            self.assertGreaterEqual(n.latest_ns, before + 5_000)
            self.assertEqual(n.latest_ns - n.earliest_ns, 80)
        write_offsets(p, 5_000, now, now + 10**12, flags=0)
        with OffsetsReader(p) as r:
            n = r.now()
        self.assertEqual(n.status, clockmesh.CLOCK_UNKNOWN)
        self.assertEqual((n.earliest_ns, n.latest_ns), (-(1 << 63), (1 << 63) - 1))


class StartAndStopRecords(unittest.TestCase):
    """The JAX helper records the offsets at session start and stop."""

    SESSION = 11_000_000_000  # 11 s

    def setUp(self):
        self.start, self.stop = 1795335288621242594, 1795335288621242594 + self.SESSION
        self.raw = self.space(uint=True)
        self.d = tempfile.mkdtemp()
        now = time.time_ns()
        far = now + 10**12
        # Start record: offset 1000 at the session start, 50 ppm drift, bound
        # 40 growing 2 µs/s, device 0. Stop record: offset 1550 at the stop
        # (the agent's newer estimate), bound 70 growing 3 µs/s, device 5,
        # another window.
        start_path, stop_path = os.path.join(self.d, "start"), os.path.join(self.d, "stop")
        write_offsets(start_path, 1000, self.start, far, drift_ps_per_s=50_000_000, bound_ns=40, window=1)
        set_bound_growth(start_path, 2_000_000)
        device_entry(start_path, 0, 0, 42, far)
        write_offsets(stop_path, 1550, self.stop, far, bound_ns=70, window=2)
        set_bound_growth(stop_path, 3_000_000)
        device_entry(stop_path, 0, 5, -8, far)
        with OffsetsReader(start_path) as r:
            self.start_snap = r.read_snapshot()

    def space(self, uint=True, stop=True):
        XSpace = xspace_class()
        s = XSpace()
        env = s.planes.add(id=2, name="Task Environment")
        times = [("profile_start_time", self.start)] + ([("profile_stop_time", self.stop)] if stop else [])
        for i, (name, v) in enumerate(times, 1):
            env.stat_metadata[i].id = i
            env.stat_metadata[i].name = name
            env.stats.add(metadata_id=i, **({"uint64_value": v} if uint else {"int64_value": v}))
        return s.SerializeToString()

    def stats(self, start_snap, stop_path, raw=None):
        out = jax_profiler.annotate_xspace(raw or self.raw, os.path.join(self.d, stop_path), start_snap)
        return xspace.task_env_stats(out)

    def test_both_records(self):
        st = self.stats(self.start_snap, "stop")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "start+stop"))
        # Start anchor: the start record at profile_start_time.
        self.assertEqual(st["clock_offset_ns"], 1000)
        self.assertEqual(st["clock_offset_bound_ns"], 40)
        self.assertEqual(st["clock_drift_ppb"], 50_000.0)
        self.assertEqual(st["clock_bound_growth_ppb"], 2_000.0)
        # Stop anchor: the stop record at profile_stop_time.
        self.assertEqual((st["clock_stop_at_ns"], st["clock_stop_offset_ns"]), (self.stop, 1550))
        self.assertEqual(st["clock_stop_offset_bound_ns"], 70)
        self.assertEqual(st["clock_stop_drift_ppb"], 0.0)
        self.assertEqual(st["clock_stop_bound_growth_ppb"], 3_000.0)
        # Identity and devices: the stop record's only.
        self.assertEqual((st["clock_anchor_ns"], st["clock_window"]), (self.stop, 2))
        self.assertEqual(st["clock_device_5_offset_ns"], -8)
        self.assertNotIn("clock_device_0_offset_ns", st)

    def test_stat_types_the_merge_tool_reads(self):
        out = jax_profiler.annotate_xspace(self.raw, os.path.join(self.d, "stop"), self.start_snap)
        env = next(p for p in xspace_class().FromString(out).planes if p.name == "Task Environment")
        kinds = {env.stat_metadata[s.metadata_id].name: s.WhichOneof("value") for s in env.stats}
        expected = {
            "clock_offset_ns": "int64_value", "clock_offset_bound_ns": "uint64_value",
            "clock_drift_ppb": "double_value", "clock_bound_growth_ppb": "double_value",
            "clock_stop_at_ns": "int64_value", "clock_stop_offset_ns": "int64_value",
            "clock_stop_offset_bound_ns": "uint64_value", "clock_stop_drift_ppb": "double_value",
            "clock_stop_bound_growth_ppb": "double_value", "clock_anchors": "str_value",
        }
        self.assertEqual({k: kinds.get(k) for k in expected}, expected)

    def test_start_record_expired_by_the_stop_is_still_the_start_anchor(self):
        # Fresh when read at the start (trace() checks that), expired now.
        path = os.path.join(self.d, "short")
        write_offsets(path, 333, self.start, time.time_ns() - 1)
        with OffsetsReader(path) as r:
            snap = r.read_snapshot()
        with self.assertRaises(clockmesh.Stale):
            snap.check_fresh()
        st = self.stats(snap, "stop")
        self.assertEqual((st["clock_anchors"], st["clock_offset_ns"], st["clock_stop_offset_ns"]), ("start+stop", 333, 1550))

    def test_a_failed_stop_read_keeps_the_start(self):
        st = self.stats(self.start_snap, "missing")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "start"))
        self.assertEqual((st["clock_offset_ns"], st["clock_offset_bound_ns"]), (1000, 40))
        self.assertEqual((st["clock_anchor_ns"], st["clock_window"]), (self.start, 1))
        self.assertEqual(st["clock_device_0_offset_ns"], 42)
        self.assertEqual([k for k in st if k.startswith("clock_stop")], [])

    def test_a_failed_start_read_takes_the_stop_record_at_both_ends(self):
        st = self.stats(None, "stop")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "stop-only"))
        self.assertEqual((st["clock_offset_ns"], st["clock_stop_offset_ns"]), (1550, 1550))
        # 11 s before the stop record's anchor: bound 70 + 3 µs/s x 11 s.
        self.assertEqual((st["clock_offset_bound_ns"], st["clock_stop_offset_bound_ns"]), (70 + 33_000, 70))
        self.assertEqual(st["clock_bound_growth_ppb"], 3_000.0)

    def test_stop_time_int64_or_absent(self):
        st = self.stats(self.start_snap, "stop", raw=self.space(uint=False))
        self.assertEqual((st["clock_stop_at_ns"], st["clock_offset_ns"]), (self.stop, 1000))
        before = time.time_ns()
        st = self.stats(self.start_snap, "stop", raw=self.space(stop=False))
        after = time.time_ns()
        # No profile_stop_time: the stop anchor holds at the time of the read,
        # long after the stop record's anchor (drift 0: offset unchanged).
        self.assertTrue(before <= st["clock_stop_at_ns"] <= after, st["clock_stop_at_ns"])
        self.assertEqual(st["clock_stop_offset_ns"], 1550)
        growth = -(-3_000_000 * abs(st["clock_stop_at_ns"] - self.stop) // 10**12)
        self.assertEqual(st["clock_stop_offset_bound_ns"], 70 + growth)

    def test_reannotating_replaces_every_clock_stat(self):
        both = jax_profiler.annotate_xspace(self.raw, os.path.join(self.d, "stop"), self.start_snap)
        st = xspace.task_env_stats(jax_profiler.annotate_xspace(both, os.path.join(self.d, "missing"), self.start_snap))
        self.assertEqual(st["clock_anchors"], "start")
        self.assertEqual([k for k in st if k.startswith(("clock_stop", "clock_device_5"))], [])
        st = xspace.task_env_stats(jax_profiler.annotate_xspace(both, os.path.join(self.d, "missing")))
        self.assertEqual([k for k in st if k.startswith("clock_")], ["clock_status"])
        self.assertEqual(st["profile_stop_time"], self.stop)

    def test_no_record_at_all_fails_closed(self):
        st = self.stats(None, "missing")
        self.assertTrue(st["clock_status"].startswith("Missing"), st["clock_status"])
        self.assertNotIn("clock_offset_ns", st)
        self.assertNotIn("clock_anchors", st)

    def test_an_os_error_fails_closed_too(self):
        # A file where a directory of the path should be: NotADirectoryError.
        st = self.stats(None, "stop/offsets")
        self.assertTrue(st["clock_status"].startswith("NotADirectoryError"), st["clock_status"])
        self.assertNotIn("clock_offset_ns", st)
        st = self.stats(self.start_snap, "stop/offsets")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "start"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
