"""Two processes as two hosts profile real JAX (CPU) programs; hostB's clock
reads SKEW ahead. Each records its offset with clockmesh.jax_profiler; the
merge must put every event at its true global time (within 1 µs), line up
the two hosts' `sync_marker` events, and xprof's own converter must load the
merged run with the shift visible.

Needs: jax, xprof, protobuf (python/test.sh installs them), protoc, root for
`unshare --uts` (host names), CLOCKMESH_BIN = the clockmesh binary."""

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from offsets_fixture import set_bound_growth, write_offsets  # noqa: E402
from xplane_proto import xspace_class  # noqa: E402

SKEW = 250_000_000  # hostB's clock is 250 ms ahead
GLOBAL_MINUS_REAL = 1_000  # the global timeline is 1 µs ahead of the shared real clock
OFFSETS = {"hostA": GLOBAL_MINUS_REAL, "hostB": GLOBAL_MINUS_REAL - SKEW}
SKEWS = {"hostA": 0, "hostB": SKEW}
BOUND_NS, GROWTH_PS_PER_S = 100, 1_000_000  # the records' bound grows 1 µs/s


def bound_at(at_ns, anchor_ns):
    """The records' bound at local time at_ns (reader.Snapshot.apply)."""
    return BOUND_NS + -(-GROWTH_PS_PER_S * abs(at_ns - anchor_ns) // 10**12)


def stat(plane, name):
    ids = [k for k, m in plane.stat_metadata.items() if m.name == name]
    for s in plane.stats:
        if s.metadata_id in ids:
            return getattr(s, s.WhichOneof("value"))
    return None


def plane(space, name):
    return next(p for p in space.planes if p.name == name)


def events_ps(space):
    """[(plane, line index, event index, name, start ps relative to profile_start_time)]"""
    out = []
    for p in space.planes:
        for li, line in enumerate(p.lines):
            for ei, ev in enumerate(line.events):
                if ev.WhichOneof("data") != "offset_ps":
                    continue
                name = p.event_metadata[ev.metadata_id].name if ev.metadata_id in p.event_metadata else ""
                out.append((p.name, li, ei, name, line.timestamp_ns * 1000 + ev.offset_ps))
    return out


class TwoHosts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.XSpace = xspace_class()
        cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="clockmesh-jax-"))
        now = time.time_ns()
        # Time for both processes to import jax and compile, on a busy 2-core
        # machine too (a worker that is not ready by then fails, saying so).
        t0 = now + 12_000_000_000
        marker = t0 + 400_000_000
        starts = {"hostA": t0, "hostB": t0 + 300_000_000}  # hostB starts 300 ms later
        procs = []
        for host in ("hostA", "hostB"):
            offsets = cls.tmp / f"{host}.offsets"
            write_offsets(offsets, OFFSETS[host], anchor_ns=now, valid_until_ns=now + 3_600_000_000_000, bound_ns=BOUND_NS)
            set_bound_growth(offsets, GROWTH_PS_PER_S)
            cmd = (
                f"hostname {host} && exec {sys.executable} {HERE / 'host_worker.py'} "
                f"--logdir {cls.tmp / ('log_' + host)} --offsets {offsets} "
                f"--session-start-ns {starts[host]} --marker-at-ns {marker} --skew-ns {SKEWS[host]}"
            )
            procs.append(subprocess.Popen(["unshare", "--uts", "sh", "-c", cmd]))
        for p in procs:
            assert p.wait(timeout=120) == 0, "host worker failed"
        cls.anchor_ns = now
        cls.inputs = {h: glob.glob(str(cls.tmp / f"log_{h}/plugins/profile/*/{h}.xplane.pb"))[0] for h in starts}
        out = subprocess.run(
            [
                os.environ["CLOCKMESH_BIN"], "trace", "merge",
                str(cls.tmp / "log_hostA"), str(cls.tmp / "log_hostB"),
                "-o", str(cls.tmp / "merged"), "--run", "run", "--perfetto", str(cls.tmp / "merged.json"),
            ],
            capture_output=True, text=True,
        )
        assert out.returncode == 0, out.stderr
        print(out.stdout)
        cls.merged = {h: str(cls.tmp / "merged/plugins/profile/run" / f"{h}.xplane.pb") for h in starts}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def load(self, path):
        return self.XSpace.FromString(pathlib.Path(path).read_bytes())

    def test_hook_stats_recorded(self):
        for host, path in self.inputs.items():
            env = plane(self.load(path), "Task Environment")
            start, stop = stat(env, "profile_start_time"), stat(env, "profile_stop_time")
            self.assertEqual(stat(env, "clock_status"), "ok")
            # Read at the start and again at the stop (drift within a session).
            self.assertEqual(stat(env, "clock_anchors"), "start+stop")
            # Start anchor at profile_start_time, its bound grown since the anchor.
            self.assertEqual(stat(env, "clock_offset_ns"), OFFSETS[host])
            self.assertEqual(stat(env, "clock_offset_bound_ns"), bound_at(start, self.anchor_ns))
            self.assertEqual(stat(env, "clock_drift_ppb"), 0.0)
            self.assertEqual(stat(env, "clock_bound_growth_ppb"), GROWTH_PS_PER_S / 1000)
            # Stop anchor at profile_stop_time (the session ran ~0.1-1 s).
            self.assertIsNotNone(stop)
            self.assertEqual(stat(env, "clock_stop_at_ns"), stop)
            self.assertGreater(stop - start, 50_000_000, host)
            self.assertEqual(stat(env, "clock_stop_offset_ns"), OFFSETS[host])
            self.assertEqual(stat(env, "clock_stop_offset_bound_ns"), bound_at(stop, self.anchor_ns))
            self.assertGreater(stat(env, "clock_stop_offset_bound_ns"), stat(env, "clock_offset_bound_ns"))
            self.assertEqual(stat(env, "clock_stop_drift_ppb"), 0.0)
            self.assertEqual(stat(env, "clock_stop_bound_growth_ppb"), GROWTH_PS_PER_S / 1000)

    def test_every_event_at_its_true_global_time(self):
        for host in self.inputs:
            before, after = self.load(self.inputs[host]), self.load(self.merged[host])
            true_start = stat(plane(before, "Task Environment"), "profile_start_time") - SKEWS[host]
            origin = stat(plane(after, "Task Environment"), "profile_start_time")
            ev_before, ev_after = events_ps(before), events_ps(after)
            self.assertEqual(len(ev_before), len(ev_after))
            self.assertGreater(len(ev_after), 20)
            for b, a in zip(ev_before, ev_after):
                self.assertEqual(b[:4], a[:4])
                truth_ps = (true_start + GLOBAL_MINUS_REAL) * 1000 + b[4]
                merged_ps = origin * 1000 + a[4]
                self.assertLessEqual(abs(merged_ps - truth_ps), 1_000_000, f"{host} {a[:4]}")

    def marker_times_ns(self, paths):
        out = {}
        for host, path in paths.items():
            space = self.load(path)
            start = stat(plane(space, "Task Environment"), "profile_start_time")
            ts = [e[4] for e in events_ps(space) if e[3] == "sync_marker"]
            self.assertEqual(len(ts), 1, host)
            out[host] = (start, ts[0] // 1000)
        return out

    def test_markers_line_up_only_after_merge(self):
        naive = self.marker_times_ns(self.inputs)
        merged = self.marker_times_ns(self.merged)
        # xprof's default view puts both sessions at 0: hostB's marker is ~300 ms off.
        self.assertGreater(abs(naive["hostA"][1] - naive["hostB"][1]), 200_000_000)
        # Trusting the hosts' clocks (absolute times) is off by the skew.
        naive_abs = [s + t for s, t in naive.values()]
        self.assertGreater(abs(naive_abs[0] - naive_abs[1]), 200_000_000)
        # After the merge both markers (started at the same real instant) agree.
        self.assertEqual(merged["hostA"][0], merged["hostB"][0])
        self.assertLess(abs(merged["hostA"][1] - merged["hostB"][1]), 20_000_000)

    def test_perfetto_json(self):
        trace = json.loads((self.tmp / "merged.json").read_text())
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
        self.assertTrue(any(n.startswith("hostA ") for n in names.values()))
        self.assertTrue(any(n.startswith("hostB ") for n in names.values()))
        markers = {names[e["pid"]].split()[0]: e["ts"] for e in trace["traceEvents"] if e.get("name") == "sync_marker"}
        self.assertLess(abs(markers["hostA"] - markers["hostB"]), 20_000)  # µs

    def test_xprof_converter_loads_merged_run_with_shift(self):
        try:
            from xprof.convert import raw_to_tool_data
        except ImportError as e:  # python/test.sh installs xprof; fail loudly otherwise
            self.fail(f"xprof not installed: {e}")

        def markers(paths):
            data, _ = raw_to_tool_data.xspace_to_tool_data(
                [paths["hostA"], paths["hostB"]], "trace_viewer@", {"hosts": ["hostA", "hostB"]}
            )
            trace = json.loads(data)
            events = trace["traceEvents"] if isinstance(trace, dict) else trace
            procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
            self.assertTrue(any("hostA" in n for n in procs.values()), procs)
            self.assertTrue(any("hostB" in n for n in procs.values()), procs)
            found = {}
            for e in events:
                if e.get("name") == "sync_marker" and e.get("ph") == "X":
                    host = "hostA" if "hostA" in procs.get(e["pid"], "") else "hostB"
                    found[host] = float(e["ts"])
            self.assertEqual(set(found), {"hostA", "hostB"})
            return found

        before = markers(self.inputs)
        after = markers(self.merged)
        self.assertGreater(abs(before["hostA"] - before["hostB"]), 200_000)  # µs, unmerged
        self.assertLess(abs(after["hostA"] - after["hostB"]), 20_000)  # µs, merged


class AgentRepublishesMidSession(unittest.TestCase):
    """One real JAX session in this process while the agent publishes a new
    record: the start anchor comes from the record read at the start, the
    stop anchor (and the record's identity) from the one read at the stop."""

    def test_start_and_stop_records_differ(self):
        import jax
        import jax.numpy as jnp

        import clockmesh.jax_profiler as cm_jax

        tmp = pathlib.Path(tempfile.mkdtemp(prefix="clockmesh-jax-republish-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        offsets = tmp / "offsets"
        now = time.time_ns()
        write_offsets(offsets, 1_000, anchor_ns=now, valid_until_ns=now + 3_600_000_000_000, bound_ns=40, window=1)
        f = jax.jit(lambda x: jnp.tanh(x @ x))
        x = jnp.ones((64, 64), jnp.float32)
        f(x).block_until_ready()
        with cm_jax.trace(str(tmp / "log"), offsets_path=str(offsets)):
            f(x).block_until_ready()
            # The agent's next estimate: another offset, 2 µs/s drift, window.
            t = time.time_ns()
            write_offsets(
                offsets, 1_550, anchor_ns=t, valid_until_ns=t + 3_600_000_000_000,
                drift_ps_per_s=2_000_000, bound_ns=60, window=2,
            )
            f(x).block_until_ready()
        paths = glob.glob(str(tmp / "log/plugins/profile/*/*.xplane.pb"))
        self.assertEqual(len(paths), 1, paths)
        env = plane(xspace_class().FromString(pathlib.Path(paths[0]).read_bytes()), "Task Environment")
        start, stop = stat(env, "profile_start_time"), stat(env, "profile_stop_time")
        self.assertTrue(start < t <= stop, (start, t, stop))
        self.assertEqual((stat(env, "clock_status"), stat(env, "clock_anchors")), ("ok", "start+stop"))
        self.assertEqual(stat(env, "clock_offset_ns"), 1_000)
        self.assertEqual(stat(env, "clock_offset_bound_ns"), 40)
        self.assertEqual(stat(env, "clock_drift_ppb"), 0.0)
        self.assertEqual(stat(env, "clock_stop_at_ns"), stop)
        self.assertEqual(stat(env, "clock_stop_offset_ns"), 1_550 + 2_000_000 * (stop - t) // 10**12)
        self.assertEqual(stat(env, "clock_stop_offset_bound_ns"), 60)
        self.assertEqual(stat(env, "clock_stop_drift_ppb"), 2_000.0)
        self.assertEqual((stat(env, "clock_window"), stat(env, "clock_anchor_ns")), (2, t))


if __name__ == "__main__":
    unittest.main(verbosity=2)
