#!/usr/bin/env python3
"""The trace-driven scheduling simulation (bench/sched/sched_sim.cpp) on a two-job workload
whose every policy's times are worked out by hand here. Usage: sched_sim_test.py SCHED_SIM"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SIM = None

# 4 slots, resizes pause a job 10 s. A: at 0 s, asks for 2 workers of [1, 4], 4,000
# worker-seconds, speedup 1, 2, 2.5, 2.6. B: at 100 s, asks for 2 of [1, 2], 400
# worker-seconds, linear, 300 s to its deadline; another user.
WORKLOAD = {"slots": 4, "resize_pause_s": 10, "jobs": [
    {"id": "A", "user": "u1", "arrival": 0, "requested": 2, "min": 1, "max": 4, "work": 4000,
     "speedup": [1, 2, 2.5, 2.6]},
    {"id": "B", "user": "u2", "arrival": 100, "requested": 2, "min": 1, "max": 2, "work": 400,
     "speedup": [1, 2], "deadline": 300}]}


def run(workload, policy):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(workload, f)
    try:
        out = subprocess.run([SIM, "--workload", f.name, "--policy", policy], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return out


class SchedSimTest(unittest.TestCase):
    def result(self, policy):
        out = run(WORKLOAD, policy)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def test_fifo_runs_each_job_at_its_requested_size(self):
        # A at 2 workers: 4,000 / 2 = 2,000 s. B finds 2 free slots at 100 s: 400 / 2 = 200 s.
        # JCT 2,000 and 200: average 1,100; utilisation (2 × 2,000 + 2 × 200) / (4 × 2,000).
        for policy in ("fifo", "fifo-backfill"):
            r = self.result(policy)
            self.assertAlmostEqual(r["avg_jct_s"], 1100, places=6)
            self.assertAlmostEqual(r["p99_jct_s"], 2000, places=6)
            self.assertAlmostEqual(r["median_jct_s"], 200, places=6)
            self.assertAlmostEqual(r["makespan_s"], 2000, places=6)
            self.assertEqual((r["deadlines_met"], r["deadline_jobs"], r["resizes"]), (1, 1, 0))
            self.assertAlmostEqual(r["utilisation"], 0.55, places=9)

    def test_the_planner_takes_the_cheapest_size_that_meets_the_deadline(self):
        # A's (w + 1) × time: 8,000, 6,000, 6,400, 7,692: 2 workers. B: 1 worker misses its
        # deadline (400 s > 300 s), 2 meet it: 2. The same schedule as FIFO.
        r = self.result("planner")
        self.assertAlmostEqual(r["avg_jct_s"], 1100, places=6)
        self.assertEqual(r["deadlines_met"], 1)

    def test_the_shared_plan_grows_shrinks_and_grows_again(self):
        # 0 s: A alone, admitted at 1, spare slots: 1 → 2 saves 2,000 s, 2 → 3 400 s,
        # 3 → 4 61.5 s (all > 10 s): 4 workers. 100 s: A has 4,000 − 100 × 2.6 = 3,740 left;
        # B is admitted at 1 (A gives 1), its deadline needs 2 (A gives another): A 2,
        # paused to 110 s; B 100 → 300 s. 300 s: A has 3,740 − 190 × 2 = 3,360 left and
        # grows back to 4 (2 → 3 saves 336 s, 3 → 4 51.7 s), paused to 310 s, and ends at
        # 310 + 3,360 / 2.6 = 1,602.3077 s. Average (1,602.3077 + 200) / 2; two resizes;
        # every slot busy from 0 to the end.
        r = self.result("shared")
        end_a = 310 + 3360 / 2.6
        self.assertAlmostEqual(r["avg_jct_s"], (end_a + 200) / 2, places=6)
        self.assertAlmostEqual(r["makespan_s"], end_a, places=6)
        self.assertEqual((r["deadlines_met"], r["resizes"]), (1, 2))
        self.assertAlmostEqual(r["utilisation"], 1.0, places=9)

    def test_capped_at_the_request_the_plan_never_grows_a_job_past_it(self):
        # A at most 2: 0 → 2,000 s; B as in FIFO. No resize.
        r = self.result("shared-capped")
        self.assertAlmostEqual(r["avg_jct_s"], 1100, places=6)
        self.assertEqual(r["resizes"], 0)

    def test_a_bad_workload_is_refused_naming_the_job(self):
        bad = json.loads(json.dumps(WORKLOAD))
        bad["jobs"][1]["speedup"] = [1]  # shorter than max = 2
        out = run(bad, "fifo")
        self.assertEqual(out.returncode, 1)
        self.assertIn("job 1 (B)", out.stderr)
        self.assertIn("speedup", out.stderr)


if __name__ == "__main__":
    SIM = sys.argv.pop(1)
    unittest.main()
