#!/usr/bin/env python3
"""The scale model (bench/sim/scalesim.py) on toy inputs: its epoch times equal the ones
computed by hand here, step by step, for every mode."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "sim"))
import scalesim  # noqa: E402


def job(**kw):
    base = {"mode": "async", "workers": 1, "steps_per_epoch": 1, "compute_s": 0.1, "up_bytes": 0, "down_bytes": 0,
            "bandwidth": math.inf, "latency": 0.0}
    base.update(kw)
    return base


class AsyncTest(unittest.TestCase):
    def test_one_worker_pays_compute_two_transfers_and_the_apply_each_step(self):
        # Per step: compute 0.1; push of 1 MB at 10 MB/s over two pipelined hops with
        # latency 0.01: 0.1 + 0.01; apply 0.02; reply likewise 0.1 + 0.01.
        # 0.1 + 0.11 + 0.02 + 0.11 = 0.34 per step, 10 steps.
        r = scalesim.simulate(job(steps_per_epoch=10, up_bytes=1e6, down_bytes=1e6, bandwidth=1e7, latency=0.01,
                                  ps_apply_s=0.02))
        self.assertAlmostEqual(r["epoch_seconds"][0], 3.4, places=9)

    def test_two_workers_queue_on_the_shard_link(self):
        # Both finish compute at 0.10. w0's push reaches the shard's link at 0.11 and
        # holds it until 0.21; w1's waits and holds it 0.21-0.31. Applies 0.21-0.23 and
        # 0.31-0.33. Replies leave the shard 0.23-0.33 and 0.33-0.43 and arrive 0.01
        # later: w0 at 0.34, w1 at 0.44.
        r = scalesim.simulate(job(workers=2, up_bytes=1e6, down_bytes=1e6, bandwidth=1e7, latency=0.01,
                                  ps_apply_s=0.02))
        self.assertAlmostEqual(r["finish"][0], 0.34, places=9)
        self.assertAlmostEqual(r["finish"][1], 0.44, places=9)
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.44, places=9)

    def test_a_saturated_shard_serialises_every_push(self):
        # Compute 0.01 and apply 0.1: the shard is busy from 0.01 on, 4 workers x 3
        # steps = 12 applies back to back: the last ends at 0.01 + 12 * 0.1.
        r = scalesim.simulate(job(workers=4, steps_per_epoch=3, compute_s=0.01, ps_apply_s=0.1))
        self.assertAlmostEqual(r["epoch_seconds"][0], 1.21, places=9)

    def test_an_unsaturated_shard_staggers_the_workers_by_one_apply(self):
        # Infinite bandwidth, latency 0.01, apply 0.02, compute 0.1, 4 workers: step one
        # applies at 0.11 + (i+1)·0.02, after which worker i never queues again, so it
        # ends step K at K·(0.1 + 0.02 + 0.02) + i·0.02; K = 5: the last at 0.76.
        r = scalesim.simulate(job(workers=4, steps_per_epoch=5, latency=0.01, ps_apply_s=0.02))
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.76, places=9)
        for i in range(4):
            self.assertAlmostEqual(r["finish"][i], 0.70 + 0.02 * i, places=9)

    def test_shards_split_bytes_and_apply(self):
        # Two shards: 0.5 MB each way per shard. The worker's uplink sends them one
        # after the other: 0-0.05 and 0.05-0.10 (after compute 0.1: 0.10-0.15, 0.15-0.20),
        # each shard's link ends 0 latency later; apply 0.01 each (0.02 / 2); replies
        # leave at 0.16 and 0.21, take 0.05 on the shard link and on the worker's
        # downlink, which serves them in turn: 0.16-0.21 and 0.21-0.26.
        r = scalesim.simulate(job(ps_shards=2, up_bytes=1e6, down_bytes=1e6, bandwidth=1e7, ps_apply_s=0.02))
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.26, places=9)

    def test_shared_cores_slow_compute(self):
        # 4 workers on 2 cores: compute 0.1 takes 0.2; nothing else costs: 3 steps, 0.6.
        r = scalesim.simulate(job(workers=4, steps_per_epoch=3, cores=2))
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.6, places=9)

    def test_epochs_are_reported_one_by_one(self):
        r = scalesim.simulate(job(steps_per_epoch=4, epochs=3, compute_s=0.25))
        self.assertEqual(len(r["epoch_seconds"]), 3)
        for e in r["epoch_seconds"]:
            self.assertAlmostEqual(e, 1.0, places=9)


class SyncTest(unittest.TestCase):
    def test_bsp_answers_after_every_push_of_the_step(self):
        # As the two-worker async case, but the replies wait for the second apply
        # (0.33): they leave 0.33-0.43 and 0.43-0.53 and arrive 0.34-0.44 and 0.44-0.54
        # (the worker's downlink starts at first byte + 0.01 and ends 0.1 later).
        r = scalesim.simulate(job(mode="bsp", workers=2, up_bytes=1e6, down_bytes=1e6, bandwidth=1e7,
                                  latency=0.01, ps_apply_s=0.02))
        self.assertAlmostEqual(r["finish"][0], 0.44, places=9)
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.54, places=9)

    def test_bsp_step_is_compute_two_latencies_and_n_applies(self):
        # Infinite bandwidth: every push arrives at 0.11, the 4 applies take 0.08, the
        # replies arrive 0.01 later: 0.2 per step, 5 steps.
        r = scalesim.simulate(job(mode="bsp", workers=4, steps_per_epoch=5, latency=0.01, ps_apply_s=0.02))
        self.assertAlmostEqual(r["epoch_seconds"][0], 1.0, places=9)

    def test_ssp_bounds_how_far_the_fast_worker_runs_ahead(self):
        # Worker 0 computes 0.1 per step, worker 1 0.3; no other cost; 3 steps.
        # async: w0 ends at 0.3. ssp s=1: w0 runs steps 1-2 (0.2), waits for w1's first
        # (0.3), ends at 0.4. ssp s=0: each step waits for w1's: ends 0.3+0.1 ... 0.7.
        # Worker 1 ends at 0.9 in all of them, and so does the epoch.
        base = job(workers=2, steps_per_epoch=3, compute_s=[0.1, 0.3])
        expect = {("async", 0): 0.3, ("ssp", 1): 0.4, ("ssp", 0): 0.7, ("bsp", 0): 0.9}
        for (mode, bound), w0 in expect.items():
            r = scalesim.simulate(dict(base, mode=mode, ssp_bound=bound))
            self.assertAlmostEqual(r["finish"][0], w0, places=9, msg=f"{mode} s={bound}")
            self.assertAlmostEqual(r["finish"][1], 0.9, places=9, msg=f"{mode} s={bound}")
            self.assertAlmostEqual(r["epoch_seconds"][0], 0.9, places=9, msg=f"{mode} s={bound}")

    def test_ddp_ring_all_reduce(self):
        # 4 workers, 1 MB gradient at 10 MB/s, latency 0.001: 2·3·(0.001 + 1e6/(4·1e7))
        # = 0.156 per all-reduce, plus compute 0.1: 0.256 per step, 10 steps.
        r = scalesim.simulate({"mode": "ddp", "workers": 4, "steps_per_epoch": 10, "compute_s": 0.1,
                               "grad_bytes": 1e6, "bandwidth": 1e7, "latency": 0.001})
        self.assertAlmostEqual(r["epoch_seconds"][0], 2.56, places=9)
        self.assertAlmostEqual(r["bytes_sent_per_worker_step"], 1.5e6, places=6)  # 2(N-1)/N·G
        self.assertAlmostEqual(scalesim.ring_allreduce_seconds(4, 1e6, 1e7, 0.001), 0.156, places=12)

    def test_ddp_waits_for_the_slowest_compute(self):
        r = scalesim.simulate({"mode": "ddp", "workers": 2, "steps_per_epoch": 3, "compute_s": [0.1, 0.3],
                               "grad_bytes": 0, "bandwidth": math.inf, "latency": 0.0})
        self.assertAlmostEqual(r["epoch_seconds"][0], 0.9, places=9)
        self.assertAlmostEqual(r["finish"][0], 0.9, places=9)


class InputsTest(unittest.TestCase):
    def test_wire_bytes(self):
        # Dense: 4 bytes a float plus a 48-byte header per frame. Sparse: k = ⌈0.01·n⌉
        # indices and values, 8 bytes each, plus the header: n = 1000 → k = 10 → 128;
        # n = 50 → k = 1 → 56.
        self.assertEqual(scalesim.dense_bytes(1000, 2), 4096)
        self.assertEqual(scalesim.sparse_bytes([1000, 50], 0.01), 128 + 56)

    def test_bad_input_names_the_field(self):
        with self.assertRaisesRegex(ValueError, "mode"):
            scalesim.simulate(job(mode="gossip"))
        with self.assertRaisesRegex(ValueError, "workers"):
            scalesim.simulate(job(workers=0))
        with self.assertRaisesRegex(ValueError, "up_bytes"):
            scalesim.simulate({"mode": "async", "workers": 1, "steps_per_epoch": 1, "compute_s": 0.1})
        with self.assertRaisesRegex(ValueError, "compute_s"):
            scalesim.simulate(job(workers=2, compute_s=[0.1]))


if __name__ == "__main__":
    unittest.main()
