"""Elastic jobs (docs/training.md, "Elastic jobs") and the shared plan (docs/operations.md,
"The shared plan"): a real standalone cluster (2 agents
x 2 cores) resizes running jobs with `dltrain scale`, without restarting them.

For each consistency model (async, ssp, sync), in order:
 1. The same Fashion-MNIST MLP job at a fixed size of 1 worker, for its accuracy.
 2. The job with [elastic] bounds [1, 3], started with 1 worker: grown to 3 in the middle
    of its first epoch, and shrunk back to 1 in the middle of a later epoch once the new
    workers have trained (premise checked: they run and have taken steps, and the job
    has epochs left). It must succeed with a test accuracy within 1 point of the fixed
    run's. The new workers' and the leavers' "left" events are seen; the PS shard counts
    2 joins and 2 leaves, never drops a worker from its barrier (so a BSP step never
    waited for a worker that had left: a wait would have ended by the barrier timeout,
    60 s, dropping it), and its data dispatch handed out every chunk of every epoch
    exactly once fresh, and every chunk a leaver gave back again.
Then: a grown worker killed mid-job is restarted by its agent, and its new process gives
back the chunks the dead one held (every chunk still handed out fresh once, every
given-back one again); `scale` out of the bounds is refused naming them (exit 2), and a
job without [elastic] is refused (naming the section).

Usage: elastic_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped) without the
Fashion-MNIST data set.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dltrain_cluster import StandaloneCluster, run_cleanups, test_main, wait_for  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"
TRAIN, BATCH, EPOCHS = 24000, 32, 4
CHUNKS = math.ceil(TRAIN / BATCH)  # per epoch (ps/dispatch.h)


def missing_prerequisites():
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        return "no Fashion-MNIST at " + DATA
    return None


def job_toml(name, sync, elastic):
    text = """name = "%s"
model = "mlp"
dataset = "fashion-mnist"
data_dir = "%s"
epochs = %d
workers = 1
ps_shards = 1
batch_size = %d
train_samples = %d
test_samples = 10000
seed = 7
sync = "%s"
%s
[optimizer]
lr = 0.02
momentum = 0.9
lr_schedule = "cosine"
warmup_epochs = 0.2

[ps]
timeout = "120s"
%s""" % (name, DATA, EPOCHS, BATCH, TRAIN, sync, "staleness = 2\n" if sync == "ssp" else "",
        'barrier_timeout = "60s"\n' if sync != "async" else "")
    if elastic:
        text += "\n[elastic]\nmin_workers = 1\nmax_workers = 3\n"
    return text


class Elastic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dltrain-elastic-")
        cls.cleanups = [lambda: shutil.rmtree(cls.root, ignore_errors=True)]
        cls.cluster = StandaloneCluster(os.path.join(BUILD, "bin"), cls.root, agents=2,
                                        extra_args=["--cores-per-agent", "2", "--progress-interval", "0.2"])
        cls.cluster.start()
        cls.cleanups.insert(0, cls.cluster.stop)

    @classmethod
    def tearDownClass(cls):
        run_cleanups(cls.cleanups)

    def dltrain(self, *args, check=True, timeout=120):
        r = subprocess.run(self.cluster.client + list(args), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            self.fail("dltrain %s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    def status(self, job):
        return json.loads(self.dltrain("status", job, "--json").stdout)

    def submit(self, name, sync, elastic):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(job_toml(name, sync, elastic))
        out = self.dltrain("submit", path, "--json").stdout
        return json.loads(out.strip().splitlines()[-1])["job"]

    def wait_end(self, job, timeout=600):
        wait_for(lambda: self.status(job)["state"] in ("succeeded", "failed", "cancelled"), timeout,
                 job + " to end", interval=0.5)
        st = self.status(job)
        self.assertEqual(st["state"], "succeeded", json.dumps(st)[:3000])
        return st

    def worker(self, st, name):
        return next((t for t in st["tasks"] if t["task"] == name), None)

    def ps_stats(self, job):
        """The PS shard's elastic counters, from the line it logs when it stops."""
        out = self.dltrain("logs", job, "--task", "ps-0", "--tail", "400").stdout
        m = re.search(r"elastic: (\d+) workers joined, (\d+) left, (\d+) dropped by the barrier timeout; data "
                      r"dispatch: (\d+) chunks served, (\d+) given back, (\d+) served again", out)
        self.assertIsNotNone(m, "no elastic counters in ps-0's log:\n" + out[-3000:])
        keys = ("joined", "left", "dropped", "served", "returned", "reissued")
        return dict(zip(keys, map(int, m.groups())))

    def run_mode(self, sync):
        fixed = self.wait_end(self.submit("fixed-" + sync, sync, False))
        job = self.submit("elastic-" + sync, sync, True)
        follow = subprocess.Popen(self.cluster.client + ["follow", job, "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.addCleanup(follow.kill)
        # 1 -> 3 in the middle of the first epoch.
        wait_for(lambda: (self.worker(self.status(job), "worker-0") or {}).get("step", 0) >= CHUNKS // 4, 300,
                 "worker-0 a quarter into its first epoch", interval=0.1)
        st = self.status(job)
        self.assertEqual(self.worker(st, "worker-0").get("epochs", 0), 0, "the premise: still in the first epoch")
        grown = json.loads(self.dltrain("scale", job, "--workers", "3", "--json").stdout)
        self.assertEqual((grown["from"], grown["to"]), (1, 3))
        self.assertEqual(len(grown["started"]), 2, grown)
        # The new workers train (premise of the shrink), and the job has epochs left.
        wait_for(lambda: all((self.worker(self.status(job), w) or {}).get("step", 0) >= 100
                             for w in ("worker-1", "worker-2")), 300, "the new workers to take 100 steps", interval=0.1)
        st = self.status(job)
        self.assertEqual(st["workers"], 3)
        self.assertLess(self.worker(st, "worker-0").get("epochs", 0), EPOCHS - 1, "the premise: epochs left")
        shrunk = json.loads(self.dltrain("scale", job, "--workers", "1", "--json").stdout)
        self.assertEqual(sorted(shrunk["leaving"]), ["worker-1", "worker-2"])
        wait_for(lambda: {t["task"] for t in self.status(job)["tasks"]} == {"ps-0", "worker-0"}, 120,
                 "the leavers to be gone", interval=0.2)
        st = self.status(job)
        self.assertIn(st["state"], ("running", "succeeded"))
        end = self.wait_end(job)
        self.assertAlmostEqual(end["test_accuracy"], fixed["test_accuracy"], delta=0.01,
                               msg="elastic %.4f vs fixed %.4f" % (end["test_accuracy"], fixed["test_accuracy"]))
        ps = self.ps_stats(job)
        self.assertEqual((ps["joined"], ps["left"], ps["dropped"]), (2, 2, 0), ps)
        # Fresh chunks: every chunk of every epoch once; every given-back chunk again.
        self.assertEqual(ps["served"] - ps["reissued"], EPOCHS * CHUNKS, ps)
        self.assertEqual(ps["returned"], ps["reissued"], ps)
        out, _ = follow.communicate(timeout=60)
        events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        left = sorted(e["task"] for e in events if e.get("event") == "left")
        self.assertEqual(left, ["worker-1", "worker-2"], out[-3000:])
        resized = [(e["from"], e["to"]) for e in events if e.get("event") == "resized"]
        self.assertEqual(resized, [(1, 3), (3, 1)], out[-3000:])
        return fixed["test_accuracy"], end["test_accuracy"]

    def test_1_async(self):
        print("async: fixed %.4f, elastic %.4f" % self.run_mode("async"))

    def test_2_ssp(self):
        print("ssp: fixed %.4f, elastic %.4f" % self.run_mode("ssp"))

    def test_3_sync(self):
        print("sync: fixed %.4f, elastic %.4f" % self.run_mode("sync"))

    def task_pid(self, job, task):
        """The pid of `task`'s process: its working directory is its task directory."""
        for agent in os.listdir(self.cluster.state):
            want = os.path.join(self.cluster.state, agent, "tasks", job, task + "-g1")
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if os.readlink("/proc/%s/cwd" % pid) == want:
                        return int(pid)
                except OSError:
                    pass
        return None

    def test_4_a_grown_worker_that_dies_gives_its_chunks_back_through_its_restart(self):
        """A worker killed (SIGKILL) in the middle of the job is restarted by its agent; the new
        process's first claim gives back what the dead one held: every chunk is still handed
        out fresh exactly once, and every given-back chunk again (trained at least once)."""
        job = self.submit("crash", "async", True)
        wait_for(lambda: (self.worker(self.status(job), "worker-0") or {}).get("step", 0) >= 50, 300,
                 "worker-0 to train", interval=0.1)
        self.dltrain("scale", job, "--workers", "2")
        wait_for(lambda: (self.worker(self.status(job), "worker-1") or {}).get("step", 0) >= 100, 300,
                 "worker-1 to take 100 steps", interval=0.1)
        st = self.status(job)
        self.assertLess(self.worker(st, "worker-0").get("epochs", 0), EPOCHS - 1, "the premise: epochs left")
        pid = self.task_pid(job, "worker-1")
        self.assertIsNotNone(pid, "the premise: worker-1 runs")
        os.kill(pid, signal.SIGKILL)
        end = self.wait_end(job)
        self.assertGreater(end["test_accuracy"], 0.8)
        self.assertGreaterEqual(self.worker(end, "worker-1").get("restarts", 0), 1, json.dumps(end)[:2000])
        ps = self.ps_stats(job)
        self.assertEqual(ps["served"] - ps["reissued"], EPOCHS * CHUNKS, ps)
        self.assertEqual(ps["returned"], ps["reissued"], ps)
        self.assertGreaterEqual(ps["returned"], 1, ps)

    def test_5_refusals(self):
        job = self.submit("bounds", "async", True)
        r = self.dltrain("scale", job, "--workers", "5", check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("[1, 3]", r.stderr)
        self.dltrain("cancel", job)
        fixed = self.submit("not-elastic", "async", False)
        r = self.dltrain("scale", fixed, "--workers", "2", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("[elastic]", r.stderr)
        self.dltrain("cancel", fixed)


class SharedPlan(unittest.TestCase):
    """The leader's shared plan (`--shared-plan`, docs/operations.md "The shared plan"): an
    elastic job holding the whole cluster (4 cores: its PS shard and 3 workers) gives 2
    workers up when a second elastic job arrives, which starts at its min_workers while
    the first still runs; both succeed."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-shared-plan-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.cluster = StandaloneCluster(os.path.join(BUILD, "bin"), self.root, agents=2,
                                         extra_args=["--cores-per-agent", "2", "--progress-interval", "0.2",
                                                     "--shared-plan"])
        self.cluster.start()
        self.addCleanup(self.cluster.stop)

    def dltrain(self, *args):
        r = subprocess.run(self.cluster.client + list(args), capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def status(self, job):
        return json.loads(self.dltrain("status", job, "--json"))

    def submit(self, name, workers, max_workers, train, epochs, deadline=None, reply=False):
        text = job_toml(name, "async", False).replace("workers = 1\n", "workers = %d\n" % workers, 1)
        text = text.replace("train_samples = %d" % TRAIN, "train_samples = %d" % train)
        text = text.replace("epochs = %d" % EPOCHS, "epochs = %d" % epochs, 1)
        if deadline:
            text = text.replace("epochs = %d" % epochs, "epochs = %d\ndeadline = \"%s\"" % (epochs, deadline), 1)
        text += "\n[elastic]\nmin_workers = 1\nmax_workers = %d\n" % max_workers
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(text)
        line = json.loads(self.dltrain("submit", path, "--json").strip().splitlines()[-1])
        return line if reply else line["job"]

    def test_a_deadline_the_load_cannot_meet_is_warned_at_submit(self):
        # An empty cluster of 4 cores: the plan starts a job at 1 worker (12,000 × 2 images at
        # the default 1,000 images/s per worker: 24 s; a second worker would save 12 s, less
        # than the 30 s a resize costs before one is measured). A 5 s deadline cannot hold.
        late = self.submit("late", 1, 2, 12000, 2, deadline="5s", reply=True)
        self.assertEqual(late["shared_plan"]["workers"], 1)
        self.assertAlmostEqual(late["shared_plan"]["predicted_seconds"], 24, delta=1)
        self.assertIn("deadline (5 s) cannot be met under the current load", late["warning"])
        self.assertIn("predicts 24 s to its end", late["warning"])
        self.assertIn("misses its deadline", self.status(late["job"])["share"])
        # A deadline of an hour holds: no warning.
        easy = self.submit("easy", 1, 2, 12000, 2, deadline="1h", reply=True)
        self.assertNotIn("warning", easy)
        self.assertIn("workers", easy["shared_plan"])
        # `dltrain plan --cluster` shows both jobs as the plan sees them, and the starts it made.
        wait_for(lambda: len(json.loads(self.dltrain("plan", "--cluster", "--json"))["changes"]) >= 2, 60,
                 "the plan to start both jobs", interval=0.1)
        cp = json.loads(self.dltrain("plan", "--cluster", "--json"))
        self.assertTrue(cp["shared_plan"])
        rows = {r["job"]: r for r in cp["jobs"]}
        for j in (late["job"], easy["job"]):
            if j in rows:  # a job whose workers are still starting is not planned (not movable)
                self.assertEqual(rows[j]["min_workers"], 1)
                self.assertEqual(rows[j]["max_workers"], 2)
        self.assertEqual({c["job"] for c in cp["changes"]}, {late["job"], easy["job"]})
        self.assertTrue(all(c["from"] == 0 and c["to"] >= 1 for c in cp["changes"][:2]))
        text = self.dltrain("plan", "--cluster")
        self.assertIn("latest changes", text)
        self.assertIn(late["job"], text)
        for j in (late["job"], easy["job"]):
            self.dltrain("cancel", j)

    def test_an_arrival_on_a_full_cluster_starts_with_workers_the_running_job_gives_up(self):
        big = self.submit("big", 3, 3, 60000, 4)
        wait_for(lambda: all(t.get("step", 0) >= 20 for t in self.status(big)["tasks"] if t["task"] != "ps-0")
                 and self.status(big)["workers"] == 3, 300, "the big job's 3 workers to train", interval=0.1)
        small = self.submit("small", 2, 2, 12000, 2)
        wait_for(lambda: self.status(small)["state"] in ("running", "succeeded"), 120, "the small job to start",
                 interval=0.1)
        st = self.status(big)
        self.assertEqual(st["state"], "running", "the premise: the big job still runs when the small one starts")
        self.assertEqual(st["workers"], 1)
        wait_for(lambda: self.status(small)["state"] in ("succeeded", "failed"), 300, "the small job to end")
        self.assertEqual(self.status(small)["state"], "succeeded")
        wait_for(lambda: self.status(big)["state"] in ("succeeded", "failed"), 600, "the big job to end")
        end = self.status(big)
        self.assertEqual(end["state"], "succeeded")
        self.assertGreater(end["test_accuracy"], 0.8)


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
