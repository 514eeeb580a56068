"""Users of a shared cluster (docs/operations.md, "Users"): a real leader configured with
[users.NAME] tables and one real agent on loopback, driven by the `dltrain` client with
each user's token.

In order (the cases share the cluster):
 1. Owners and roles: alice's running job cannot be cancelled, nor its logs read, by bob (exit code 4, the message names the owner); an admin user cancels it; the
    client token is the admin "admin"; `status` names the owner.
 2. Quotas under concurrent submits: alice may run one job at once (max_running_jobs = 1)
    and hold 3 cores; three of her jobs submitted at the same moment all succeed, never
    two running at once (the leader's list polled throughout), and the ones held back say
    it is her quota; a job needing more cores than max_cores is refused at submit, naming
    it; bob's job is not held back by alice's; bob can neither download her trained model
    nor start a job from it.
 3. The audit log: one line per request that changed something or tried to, with the
    user and the result (bob's refused cancel, the admin's cancel, the submits).
 4. Priorities: with the cluster full, vip's job (priority 10) queues ahead of bob's that
    came first (priority 0), and starts first when the cores come free.

Usage: users_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped) without the
Fashion-MNIST data set.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dltrain_cluster import Daemon, run_cleanups, test_main, wait_for, write_tokens  # noqa: E402
from job_files import mlp_job_toml  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"
USERS = ("alice", "bob", "ops", "vip")


def missing_prerequisites():
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        return "no Fashion-MNIST at " + DATA
    return None


class Users(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dltrain-users-")
        cls.cleanups = []
        try:
            cls._set_up()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _set_up(cls):
        cls.tokens = write_tokens(cls.root, ("agent", "client") + USERS)
        cls.state = os.path.join(cls.root, "leader", "state")
        cls.leader = Daemon(BUILD, cls.root, "leader", """leader = true
host_tasks = false
listen_address = "127.0.0.1"
listen_port = 0
state_dir = "%(state)s"
agent_token_file = "%(root)s/agent.token"
client_token_file = "%(root)s/client.token"
log_level = "info"

[users.alice]
token_file = "%(root)s/alice.token"
max_running_jobs = 1
max_cores = 3

[users.bob]
token_file = "%(root)s/bob.token"
role = "user"

[users.ops]
token_file = "%(root)s/ops.token"
role = "admin"

[users.vip]
token_file = "%(root)s/vip.token"
priority = 10
""" % {"state": cls.state, "root": cls.root})
        cls.leader.start()
        cls.cleanups.append(cls.leader.stop)
        info = os.path.join(cls.state, "leader.json")
        wait_for(lambda: os.path.exists(info), 30, "the leader's leader.json")
        with open(info) as f:
            cls.url = json.load(f)["url"]
        cls.agent = Daemon(BUILD, cls.root, "agent", """name = "host-0"
leader_url = "%s"
agent_token_file = "%s/agent.token"
cores = 4
state_dir = "%s"
log_level = "info"
""" % (cls.url, cls.root, os.path.join(cls.root, "agent", "state")))
        cls.agent.start()
        cls.cleanups.append(cls.agent.stop)
        wait_for(lambda: any(a.get("state") == "ready" for a in cls.as_user("client", "agents", "--json",
                                                                            json_out=True).get("agents", [])),
                 60, "the agent ready")

    @classmethod
    def tearDownClass(cls):
        run_cleanups(cls.cleanups)
        shutil.rmtree(cls.root, True)

    # ------------------------------------------------------------ helpers
    @classmethod
    def as_user(cls, user, *args, json_out=False, timeout=120):
        """`dltrain ARGS` with `user`'s token ("client": the client token); the completed
        process, or its JSON output when json_out (a failed command then raises)."""
        r = subprocess.run([os.path.join(BUILD, "bin", "dltrain"), "--leader", cls.url, "--token", cls.tokens[user]]
                           + list(args), capture_output=True, text=True, timeout=timeout)
        if json_out:
            if r.returncode != 0:
                raise AssertionError("dltrain %s as %s exited %d: %s" % (" ".join(args), user, r.returncode, r.stderr))
            return json.loads(r.stdout)
        return r

    def job_file(self, name, epochs=1, train_samples=2000, workers=1):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(mlp_job_toml(name, DATA, epochs, train_samples, workers=workers))
        return path

    def submit(self, user, name, **job):
        r = self.as_user(user, "submit", self.job_file(name, **job), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])["job"]

    def status(self, job):
        return self.as_user("client", "status", job, "--json", json_out=True)

    def audit(self):
        with open(os.path.join(self.state, "audit.log")) as f:
            return [json.loads(line) for line in f if line.strip()]

    # ------------------------------------------------------------ cases
    def test_1_owners_and_roles(self):
        job = self.submit("alice", "alice-long", epochs=200)
        wait_for(lambda: self.status(job)["state"] == "running", 60, "alice's job running")
        st = self.status(job)
        self.assertEqual(st["owner"], "alice")
        listed = [l for l in self.as_user("bob", "list").stdout.splitlines() if l.startswith(job + " ")]
        self.assertEqual(len(listed), 1)
        self.assertTrue(listed[0].endswith("  alice"), listed)  # the owner, for every user to see
        self.assertLess(st.get("epochs", 0), 200, "premise: the job has work left")

        r = self.as_user("bob", "cancel", job)
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("it belongs to alice", r.stderr)
        self.assertIn("[forbidden]", r.stderr)
        r = self.as_user("bob", "logs", job)
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("may not read the logs of " + job, r.stderr)
        self.assertEqual(self.status(job)["state"], "running", "bob's refused cancel changed the job")
        # Its owner reads its logs; an admin user cancels it.
        self.assertEqual(self.as_user("alice", "logs", job).returncode, 0)
        r = self.as_user("ops", "cancel", job)
        self.assertEqual(r.returncode, 0, r.stderr)
        wait_for(lambda: self.status(job)["state"] == "cancelled", 60, "alice's job cancelled")
        # The client token is the admin user "admin".
        mine = self.submit("client", "admin-job", epochs=200)
        self.assertEqual(self.status(mine)["owner"], "admin")
        self.assertEqual(self.as_user("bob", "cancel", mine).returncode, 4)
        self.assertEqual(self.as_user("client", "cancel", mine).returncode, 0)
        wait_for(lambda: self.status(mine)["state"] == "cancelled", 60, "the admin's job cancelled")

    def test_2_quotas_under_concurrent_submits(self):
        # More cores than max_cores = 3: 3 workers + 1 PS shard = 4.
        r = self.as_user("alice", "submit", self.job_file("alice-wide", workers=3))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("max_cores = 3", r.stderr)

        names = ["alice-q%d" % i for i in range(3)]
        for n in names:
            self.job_file(n, epochs=2, train_samples=3000)
        outputs = {}

        def follow(name):
            outputs[name] = self.as_user("alice", "submit", os.path.join(self.root, name + ".toml"), "--follow",
                                         "--json", timeout=600)
        threads = [threading.Thread(target=follow, args=(n,)) for n in names]
        barrier_start = time.monotonic()
        for t in threads:
            t.start()
        # Meanwhile: never two of alice's jobs holding cores at once.
        running_states = {"starting", "running", "finishing", "failing", "cancelling", "recovering"}
        most = 0
        seen = set()
        bob_job = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            alive = [t for t in threads if t.is_alive()]
            if not alive:
                break
            jobs = self.as_user("client", "list", "--json", json_out=True)["jobs"]
            mine = [j for j in jobs if j.get("name") in names]
            seen.update(j["job"] for j in mine)
            live = [j for j in mine if j["state"] in running_states]
            most = max(most, len(live))
            if bob_job is None and live and len(mine) == 3:
                # bob's job is not held back by alice's quota.
                bob_job = self.submit("bob", "bob-short")
            alive[0].join(timeout=0.1)  # the next look: when a follower ends, or after 0.1 s
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(len(seen), 3, "premise: the three submits reached the leader")
        self.assertLessEqual(most, 1, "two of alice's jobs ran at once")
        waited_for_quota = 0
        for n in names:
            out = outputs[n]
            events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
            if any("alice's running jobs hold its quota" in e.get("quota", "") for e in events
                   if e.get("event") == "waiting"):
                waited_for_quota += 1
        self.assertGreaterEqual(waited_for_quota, 2, "premise: the quota held the later jobs back")
        # Her trained model is hers to read (and an admin's), not bob's.
        first = [json.loads(line) for line in outputs[names[0]].stdout.splitlines() if line.startswith("{")][0]["job"]
        r = self.as_user("bob", "model", "get", first, "-o", os.path.join(self.root, "bob-model"))
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("may not read the model of " + first, r.stderr)
        r = self.as_user("alice", "model", "get", first, "-o", os.path.join(self.root, "alice-model"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Nor may bob start a job from it (init_from reads it).
        path = self.job_file("bob-from-alice")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace('model = "mlp"\n', 'model = "mlp"\ninit_from = "%s"\n' % first, 1))
        r = self.as_user("bob", "submit", path)
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("may not start from the model of " + first, r.stderr)
        self.assertIsNotNone(bob_job)
        wait_for(lambda: self.status(bob_job)["state"] == "succeeded", 300, "bob's job")
        self.assertLess(time.monotonic() - barrier_start, 600)

    def test_3_audit_log(self):
        lines = self.audit()
        refused = [l for l in lines if l.get("user") == "bob" and l.get("request") == "cancel"]
        self.assertTrue(refused, lines[-10:])
        self.assertTrue(all(l["result"] == "refused" and l["code"] == "forbidden" for l in refused), refused)
        by_ops = [l for l in lines if l.get("user") == "ops" and l.get("request") == "cancel"]
        self.assertEqual([l["result"] for l in by_ops], ["ok"], by_ops)
        submits = [l for l in lines if l.get("user") == "alice" and l.get("request") == "submit"]
        self.assertEqual(sum(1 for l in submits if l["result"] == "ok"), 4, submits)  # long + 3 quota jobs
        wide = [l for l in submits if l.get("name") == "alice-wide"]
        self.assertEqual([l["result"] for l in wide], ["refused"], wide)
        self.assertTrue(all(isinstance(l.get("time"), float) and l.get("peer") for l in lines), lines[:3])
        # Reads are not audited.
        self.assertFalse([l for l in lines if l.get("request") in ("status", "list", "logs")])
        mode = os.stat(os.path.join(self.state, "audit.log")).st_mode & 0o777
        self.assertEqual(mode, 0o600)

    def test_4_priority_orders_the_queue(self):
        full = self.submit("bob", "bob-full", epochs=200, workers=3)  # 4 cores: the whole agent
        wait_for(lambda: self.status(full)["state"] == "running", 60, "bob's job filling the cluster")
        first = self.submit("bob", "bob-next")
        wait_for(lambda: self.status(first).get("queue_position") == 1, 30, "bob's next job first in the queue")
        vip = self.submit("vip", "vip-job")
        self.assertEqual(self.status(vip).get("queue_position"), 1)
        self.assertEqual(self.status(first).get("queue_position"), 2)
        self.assertEqual(self.as_user("client", "cancel", full).returncode, 0)
        wait_for(lambda: self.status(vip)["state"] in ("running", "finishing", "succeeded"), 120, "vip's job started")
        wait_for(lambda: self.status(vip)["state"] == "succeeded", 300, "vip's job")
        wait_for(lambda: self.status(first)["state"] == "succeeded", 300, "bob's next job")


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
