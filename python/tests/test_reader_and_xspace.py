"""Pure-Python reader and XSpace editing, without JAX."""

import os
import pathlib
import sys
import tempfile
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import clockmesh  # noqa: E402
from clockmesh import OffsetsReader, jax_profiler, xspace  # noqa: E402
from offsets_fixture import write_offsets  # noqa: E402
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

    def test_map_matches_the_spec_arithmetic(self):
        now = time.time_ns()
        write_offsets(self.path, -1000, now, now + 10**12, drift_ps_per_s=-1_500_000, bound_ns=40)
        with clockmesh.OffsetsReader(self.path) as r:
            # 1.0000003 s after the anchor: drift -1500.00045 ns truncates to -1500.
            g, b = r.to_global(now + 1_000_000_300)
            self.assertEqual(g, now + 1_000_000_300 - 1000 - 1500)
            self.assertEqual(b, 40)
            g, _ = r.to_global(now - 1_000_000_300)
            self.assertEqual(g, now - 1_000_000_300 - 1000 + 1500)


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


class StartAndStopRecords(unittest.TestCase):
    """The JAX helper records the offsets at session start and stop."""

    def setUp(self):
        XSpace = xspace_class()
        s = XSpace()
        env = s.planes.add(id=2, name="Task Environment")
        self.start, self.stop = 1795335288621242594, 1795335288621242594 + 11_000_000_000
        for i, (name, v) in enumerate((("profile_start_time", self.start), ("profile_stop_time", self.stop)), 1):
            env.stat_metadata[i].id = i
            env.stat_metadata[i].name = name
            env.stats.add(metadata_id=i, uint64_value=v)
        self.raw = s.SerializeToString()
        self.d = tempfile.mkdtemp()
        now = time.time_ns()
        # Start: offset 1000 at the session start; stop: 1550 (50 ppm over 11 s).
        write_offsets(os.path.join(self.d, "start"), 1000, self.start, now + 10**12, drift_ps_per_s=50_000_000)
        write_offsets(os.path.join(self.d, "stop"), 1550, self.stop, now + 10**12, bound_ns=70)
        with OffsetsReader(os.path.join(self.d, "start")) as r:
            self.start_snap = r.read_snapshot()

    def stats(self, start_snap, stop_path):
        out = jax_profiler.annotate_xspace(self.raw, os.path.join(self.d, stop_path), start_snap)
        return xspace.task_env_stats(out)

    def test_both_records(self):
        st = self.stats(self.start_snap, "stop")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "start+stop"))
        self.assertEqual(st["clock_offset_ns"], 1000)
        self.assertEqual(st["clock_drift_ppb"], 50_000.0)
        self.assertEqual((st["clock_stop_at_ns"], st["clock_stop_offset_ns"]), (self.stop, 1550))
        self.assertEqual(st["clock_stop_offset_bound_ns"], 70)

    def test_a_failed_stop_read_keeps_the_start(self):
        st = self.stats(self.start_snap, "missing")
        self.assertEqual((st["clock_status"], st["clock_anchors"]), ("ok", "start"))
        self.assertEqual(st["clock_offset_ns"], 1000)
        self.assertNotIn("clock_stop_offset_ns", st)

    def test_a_failed_start_read_takes_the_stop_record_at_both_ends(self):
        st = self.stats(None, "stop")
        self.assertEqual(st["clock_anchors"], "stop-only")
        self.assertEqual((st["clock_offset_ns"], st["clock_stop_offset_ns"]), (1550, 1550))

    def test_no_record_at_all_fails_closed(self):
        st = self.stats(None, "missing")
        self.assertTrue(st["clock_status"].startswith("Missing"), st["clock_status"])
        self.assertNotIn("clock_offset_ns", st)
        self.assertNotIn("clock_anchors", st)


if __name__ == "__main__":
    unittest.main(verbosity=2)
