#!/usr/bin/env python3
"""The planner chooses the compression (docs/planner.md, "Choosing the compression"): one
job file with `[compression] method = "auto"`, submitted to two clusters of real
dltrain-agent daemons with fresh histories.

- Slow: a leader in the test's namespace and two agents, each in a network namespace of its
  own on one bridge, every link limited to 100 Mbit/s each way by tc tbf (tests create
  them: netns_host.Lan). The agents' probes must measure their link (40-110 Mbit/s); the job
  explores, and the plan must choose DGC; the job trains with it and succeeds.
- Fast: a standalone cluster on loopback. The probes measure far more than 100 Mbit/s; the
  plan must choose a dense method (none or fp16), and the job succeeds with it.

Both: `dltrain plan` of the same file after the job prints the link and the best
configuration of every method; the job's status names the method it ran.

Usage: planner_compression_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped)
without root, ip/tc/nsenter or the data set.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dltrain_cluster import Daemon, StandaloneCluster, test_main, wait_for  # noqa: E402
from netns_host import Lan, missing as netns_missing  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"
ENDED = ("succeeded", "failed", "cancelled")

# mlp-large (703 k parameters: 5.6 MB a dense step, push and pull), 2 workers: on
# 100 Mbit/s a dense step's bytes take ~0.2 s, ten times its computation; on loopback a
# millisecond.
JOB = """name = "auto-compression"
model = "mlp-large"
dataset = "fashion-mnist"
data_dir = "%s"
epochs = 1
workers = 2
batch_size = 64
threads_per_task = 1
train_samples = 2048
test_samples = 1000
seed = 3

[optimizer]
lr = 0.05
momentum = 0.9

[compression]
method = "auto"
""" % DATA


def missing_prerequisites():
    why = netns_missing()
    if why:
        return why
    if not os.path.isdir(DATA):
        return "needs the Fashion-MNIST data set in " + DATA
    return None


class Client:
    def __init__(self, argv):
        self.argv = argv

    def run(self, *args, check=True, timeout=120):
        r = subprocess.run(self.argv + list(args), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("dltrain %s exited %d: %s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    def json(self, *args):
        return json.loads(self.run(*args, "--json").stdout)


class PlannerChoosesCompression(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-plan-comp-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.job = os.path.join(self.root, "job.toml")
        with open(self.job, "w") as f:
            f.write(JOB)

    def links(self, client, agents, low, high):
        """Waits for `agents` agents whose probes measured their link, and checks each
        measurement (Mbit/s) lies in [low, high]; returns them."""
        def measured():
            rows = client.json("agents")["agents"]
            got = [a.get("link_bytes_per_sec", 0) for a in rows if a.get("state") == "ready"]
            return got if len(got) == agents and all(g > 0 for g in got) else None
        mbits = [b * 8 / 1e6 for b in wait_for(measured, 60, "every agent's link measured", interval=0.2)]
        for m in mbits:
            self.assertGreaterEqual(m, low, mbits)
            self.assertLessEqual(m, high, mbits)
        return mbits

    def train(self, client):
        """Submits the job and follows it to its end (`submit --follow --json`, bounded);
        returns its id, its status and its `plan` events (each plan: one per round)."""
        out = client.run("submit", self.job, "--follow", "--json", check=False, timeout=600)
        events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        job = next(e["job"] for e in events if e.get("event") == "submitted")
        status = client.json("status", job)
        plans = [e["plan"] for e in events if e.get("event") == "plan"]
        self.assertTrue(plans, "no plan event: %s" % out.stdout[-3000:])
        return job, status, plans

    def check_plan_output(self, client):
        """`dltrain plan` of the job file now: the link and every method's best row. (Its
        choice may differ from the job's: the job's own rows are history now.)"""
        text = client.run("plan", self.job).stdout
        self.assertIn("link: ", text)
        self.assertIn("best of each method:", text)
        for label in ("none", "fp16", "dgc 1%", "dgc 0.1%"):
            self.assertIn("  " + label, text)
        plan = client.json("plan", self.job)
        self.assertTrue(plan["chooses_method"])
        self.assertGreater(plan["link_bytes_per_sec"], 0)
        self.assertEqual(len(plan["methods"]), 4, plan["methods"])
        return plan

    def test_a_slow_link_chooses_dgc(self):
        lan = Lan(2, rate="100mbit")
        self.addCleanup(lan.delete)
        state = os.path.join(self.root, "leader", "state")
        tokens = {}
        for name in ("agent", "client"):
            path = os.path.join(self.root, name + ".token")
            tokens[name] = os.urandom(24).hex()
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(tokens[name] + "\n")
        leader = Daemon(BUILD, self.root, "leader", """leader = true
host_tasks = false
listen_address = "%s"
listen_port = 0
state_dir = "%s"
agent_token_file = "%s/agent.token"
client_token_file = "%s/client.token"
log_level = "info"
""" % (lan.leader_address, state, self.root, self.root))
        leader.start()
        self.addCleanup(leader.stop)
        info = os.path.join(state, "leader.json")
        wait_for(lambda: os.path.exists(info), 30, "the leader's leader.json")
        with open(info) as f:
            url = json.load(f)["url"]
        for i in range(2):
            agent = Daemon(BUILD, self.root, "agent-%d" % i, """name = "host-%d"
leader_url = "%s"
agent_token_file = "%s/agent.token"
advertise_address = "%s"
task_bind_address = "%s"
cores = 2
state_dir = "%s"
log_level = "info"
""" % (i, url, self.root, lan.address(i), lan.address(i), os.path.join(self.root, "agent-%d" % i, "state")),
                           wrap=lan.wrap(i))
            agent.start()
            self.addCleanup(agent.stop)
        client = Client([os.path.join(BUILD, "bin", "dltrain"), "--leader", url, "--token", tokens["client"]])
        self.links(client, 2, 40, 110)
        job, status, plans = self.train(client)
        self.assertEqual(status["state"], "succeeded", json.dumps(status)[:2000] + leader.log()[-3000:])
        final = plans[-1]
        self.assertEqual(final["choice"]["method"], "dgc", final["explanation"])
        self.assertEqual(status["compression_settings"]["method"], "dgc")
        self.assertIn("Mbit/s", final["explanation"])
        self.check_plan_output(client)

    def test_loopback_chooses_a_dense_method(self):
        cluster = StandaloneCluster(os.path.join(BUILD, "bin"), os.path.join(self.root, "standalone"), agents=2,
                                    extra_args=["--cores-per-agent", "2"])
        cluster.start()
        self.addCleanup(cluster.stop)
        client = Client(cluster.client)
        self.links(client, 2, 500, 1e6)
        job, status, plans = self.train(client)
        self.assertEqual(status["state"], "succeeded", json.dumps(status)[:2000])
        final = plans[-1]
        self.assertIn(final["choice"]["method"], ("none", "fp16"), final["explanation"])
        self.assertEqual(status["compression_settings"]["method"], final["choice"]["method"])
        self.check_plan_output(client)


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
