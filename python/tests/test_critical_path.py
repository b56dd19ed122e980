"""`clockmesh trace critical-path` against jobs whose answer is known: two
real PyTorch ranks (gloo, this host) in which one op is made 25 ms slower on
one rank in three steps — the rank, op and steps drawn by a seeded RNG that
the analysis never sees (python/gpu/critical_validate.py). The planted rank
and op must top every planted step's path, and the what-if with that op at
its median must take the planted time back out of those steps.

Needs torch (python/test.sh installs it); CLOCKMESH_BIN = the clockmesh
binary. The what-if's accuracy against a re-run is a benchmark figure (run
critical_validate.py --runs 20 on a quiet machine), not asserted here."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

VALIDATE = pathlib.Path(__file__).resolve().parents[1] / "gpu" / "critical_validate.py"
PLANT_NS = 25_000_000


class PlantedSlowOp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="critical-test-")
        figures = pathlib.Path(cls.tmp.name) / "figures.json"
        subprocess.run(
            [sys.executable, str(VALIDATE), "--clockmesh", os.environ["CLOCKMESH_BIN"],
             "--runs", "2", "--seed", "7", "--out", cls.tmp.name, "--json", str(figures)],
            check=True,
        )
        cls.result = json.loads(figures.read_text())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def planted_steps(self):
        return [(run["plant"], s) for run in self.result["runs"] for s in run["steps"]]

    def test_the_planted_rank_and_op_top_every_planted_step(self):
        rows = self.planted_steps()
        self.assertEqual(len(rows), 6)
        for plant, s in rows:
            self.assertEqual(s["top"], [plant["rank"], "work", plant["op"]], (plant, s))

    def test_the_what_if_takes_the_planted_time_out(self):
        for plant, s in self.planted_steps():
            removed = s["measured_ns"] - s["predicted_ns"]
            # The plant less the op's own spread between steps (a few ms at
            # most on a loaded 2-core machine): a subtraction of nothing, or
            # of the whole step, fails.
            self.assertLess(abs(removed - PLANT_NS), PLANT_NS // 3, (plant, s))


if __name__ == "__main__":
    unittest.main()
