#!/usr/bin/env python3
"""Sharded data sets read from where they live (docs/data.md): Fashion-MNIST packed by
`dltrain dataset pack`, served by a real nginx over HTTP and by a real S3 store (a one-node
Ceph with radosgw, SigV4 credentials), trained on by real dltrain-agent daemons: a leader in
the test's network namespace and two agents each in a network namespace of its own on one
bridge (netns_host.Lan), whose workers read nothing from a file system they share with the
data: every shard comes over the network into the agents' shard caches.

In order (the cases share the servers and the cluster):
 1. HTTP, cold caches: the job succeeds; nginx's log shows each shard fetched at most once
    per machine; a second job fetches nothing (every shard a cache hit, seen in
    `dltrain agents`) and its workers are placed where the shards are cached.
 2. An agent restarted keeps its cache: the same shards, and the next job fetches nothing.
 3. S3 (caches emptied first): the job succeeds; the agents fetched the data set from
    radosgw; the accuracies of the HTTP, S3 and local-path jobs agree within 0.5 point
    (sync = "sync": the same data in the same order).
 4. Bad input and faults, each with its message, and the cluster then runs the next job: a
    shard that does not match its manifest; a shard missing (404); an unreachable source
    (the leader's retries, logged); a malformed and an inconsistent manifest; an S3 read
    without credentials names the setting.
 5. An agent without a shard cache (cache_bytes = 0) joins, with the most free cores: a
    sharded job's PS shard goes there, its workers only to the agents with caches; a job
    with more workers than those agents have cores waits, and submit says why.

Usage: data_sources_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped) without
root, ip/nsenter, nginx, Ceph or the data set.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_servers import Ceph, Nginx, missing as servers_missing  # noqa: E402
from dltrain_cluster import Daemon, run_cleanups, test_main, wait_for, write_tokens  # noqa: E402
from netns_host import Lan, missing as netns_missing  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"

JOB = """name = "%(name)s"
model = "mlp"
data = "%(data)s"
epochs = 2
workers = 2
ps_shards = 1
batch_size = 64
threads_per_task = 1
sync = "sync"
seed = 5

[optimizer]
lr = 0.05
momentum = 0.9
"""


def missing_prerequisites():
    why = netns_missing() or servers_missing()
    if why:
        return why
    if not os.path.isdir(DATA):
        return "needs the Fashion-MNIST data set in " + DATA
    return None


class DataSources(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dltrain-data-")
        os.chmod(cls.root, 0o755)  # nginx's workers run as another user
        cls.cleanups = []
        try:
            cls._set_up()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _set_up(cls):
        cls.dltrain = os.path.join(BUILD, "bin", "dltrain")
        cls.packed = os.path.join(cls.root, "www", "fm")
        out = subprocess.run([cls.dltrain, "dataset", "pack", DATA, cls.packed, "--shard-size", "4MB", "--json"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        cls.report = json.loads(out.stdout)
        cls.manifest = cls.report["manifest"]
        cls.lan = Lan(2)
        cls.cleanups.append(cls.lan.delete)
        cls.nginx = Nginx(os.path.join(cls.root, "nginx"), os.path.join(cls.root, "www"), cls.lan.leader_address)
        cls.cleanups.append(cls.nginx.stop)
        cls.ceph = Ceph(os.path.join(cls.root, "ceph"), cls.lan.leader_address)
        cls.cleanups.append(cls.ceph.stop)
        cls.ceph.make_bucket("datasets")
        cls.ceph.put_dir(cls.packed, "datasets/fm")
        creds = cls.ceph.credentials_file(os.path.join(cls.root, "s3-credentials"))
        s3 = 's3_endpoint = "%s"\ns3_credentials_file = "%s"\n' % (cls.ceph.endpoint, creds)
        tokens = write_tokens(cls.root, ("agent", "client"))
        state = os.path.join(cls.root, "leader", "state")
        cls.leader = Daemon(BUILD, cls.root, "leader", """leader = true
host_tasks = false
listen_address = "%s"
listen_port = 0
state_dir = "%s"
agent_token_file = "%s/agent.token"
client_token_file = "%s/client.token"
log_level = "info"
""" % (cls.lan.leader_address, state, cls.root, cls.root) + s3)
        cls.leader.start()
        cls.cleanups.append(cls.leader.stop)
        info = os.path.join(state, "leader.json")
        wait_for(lambda: os.path.exists(info), 30, "the leader's leader.json")
        with open(info) as f:
            url = json.load(f)["url"]
        cls.agents = []
        for i in range(2):
            agent = Daemon(BUILD, cls.root, "agent-%d" % i, """name = "host-%d"
leader_url = "%s"
agent_token_file = "%s/agent.token"
advertise_address = "%s"
task_bind_address = "%s"
cores = 2
state_dir = "%s"
cache_bytes = 1073741824
log_level = "info"
""" % (i, url, cls.root, cls.lan.address(i), cls.lan.address(i), os.path.join(cls.root, "agent-%d" % i, "state")) + s3,
                           wrap=cls.lan.wrap(i))
            agent.start()
            cls.cleanups.append(agent.stop)
            cls.agents.append(agent)
        cls.leader_url = url
        cls.client = [cls.dltrain, "--leader", url, "--token", tokens["client"]]
        cls.wait_agents(2)
        cls.accuracy = {}

    @classmethod
    def tearDownClass(cls):
        run_cleanups(cls.cleanups)
        shutil.rmtree(cls.root, True)

    # ------------------------------------------------------------ helpers
    @classmethod
    def run_client(cls, *args, check=True, timeout=120):
        r = subprocess.run(cls.client + list(args), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("dltrain %s exited %d: %s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    @classmethod
    def agents_json(cls):
        return json.loads(cls.run_client("agents", "--json").stdout)["agents"]

    @classmethod
    def wait_agents(cls, n):
        def ready():
            rows = [a for a in cls.agents_json() if a.get("state") == "ready" and a.get("shard_cache")]
            return rows if len(rows) == n else None
        return wait_for(ready, 60, "%d agents ready with their shard caches" % n, interval=0.2)

    def empty_caches(self):
        """Stops the agents, removes their shard caches, starts them again. (Shards are
        content-addressed: the same data from another URL would be a hit.)"""
        for i, agent in enumerate(self.agents):
            agent.stop()
            shutil.rmtree(os.path.join(self.root, "agent-%d" % i, "state", "shard-cache"), True)
            agent.start()
        self.wait_agents(2)
        self.assertEqual(sum(c["shards"] for c in self.cache().values()), 0, "premise: the caches are empty")

    def cache(self):
        """Each agent's shard cache figures, by agent name."""
        return {a["agent"]: a["shard_cache"] for a in self.agents_json() if a.get("shard_cache")}

    def job_file(self, name, data, workers=2, epochs=2):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write((JOB % {"name": name, "data": data}).replace("workers = 2", "workers = %d" % workers)
                    .replace("epochs = 2", "epochs = %d" % epochs))
        return path

    def train(self, name, data, expect="succeeded", **job):
        """Submits a job reading `data`, follows it to its end; returns (status, events)."""
        out = self.run_client("submit", self.job_file(name, data, **job), "--follow", "--json", check=False,
                              timeout=600)
        events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        submitted = [e for e in events if e.get("event") == "submitted"]
        self.assertTrue(submitted, "not submitted: %s %s" % (out.stdout[-2000:], out.stderr[-2000:]))
        status = json.loads(self.run_client("status", submitted[0]["job"], "--json").stdout)
        self.assertEqual(status["state"], expect, json.dumps(status)[:3000] + self.leader.log()[-3000:])
        return status, events

    def shard_gets(self):
        """(client address, shard path) of every successful shard GET nginx served."""
        return [(a, p) for a, p, s in self.nginx.fetched("/fm/") if p.endswith(".tar") and s in ("200", "206")]

    # ------------------------------------------------------------ cases
    def test_1_http_cold_then_cached(self):
        url = self.nginx.url + "/fm"
        status, events = self.train("http-cold", url)
        self.accuracy["http"] = status["test_accuracy"]
        gets = self.shard_gets()
        self.assertTrue(gets, "no shard came over HTTP")
        # Each shard at most once per machine, however many workers read it.
        self.assertEqual(len(gets), len(set(gets)), sorted(gets))
        self.assertEqual({a for a, _ in gets} <= {self.lan.address(0), self.lan.address(1)}, True, gets)
        figures = self.cache()
        fetched = sum(c["bytes_fetched"] for c in figures.values())
        self.assertGreater(fetched, 0)
        placed = [e for e in events if e.get("event") == "data_placed"]
        self.assertEqual(len(placed), 1, events)

        status, events = self.train("http-warm", url)
        self.assertEqual(self.shard_gets(), gets, "the second job fetched shards again")
        after = self.cache()
        self.assertEqual(sum(c["bytes_fetched"] for c in after.values()), fetched)
        self.assertGreater(sum(c["hits"] for c in after.values()), sum(c["hits"] for c in figures.values()))
        # Placed where the shards are: each worker's agent holds some of the data set.
        placed = [e for e in events if e.get("event") == "data_placed"][0]
        self.assertTrue(all(f > 0 for f in placed["cached_fraction"]), placed)

    def test_2_restarted_agent_keeps_its_cache(self):
        before = self.cache()["host-0"]
        self.assertGreater(before["shards"], 0, "premise: agent host-0 holds shards")
        agent = self.agents[0]
        agent.stop()
        agent.start()
        self.assertGreater(before["hits"] + before["fetches"], 0, "premise: host-0's counters are not zero")

        def back():  # the new process (its counters start at zero) with the old shards
            c = self.cache().get("host-0", {})
            return c.get("shards") == before["shards"] and c.get("hits") == 0 and c.get("fetches") == 0
        wait_for(back, 60, "host-0 back with its %d shards" % before["shards"], interval=0.2)
        gets = self.shard_gets()
        _, events = self.train("http-after-restart", self.nginx.url + "/fm")
        placed = [e for e in events if e.get("event") == "data_placed"]
        self.assertEqual(self.shard_gets(), gets, "shards fetched again after the restart: %s %s %s" % (
            placed, self.cache(), [l for l in self.leader.log().splitlines() if "shard" in l or "cached" in l][-12:]))

    def test_3_s3_matches_http_and_local(self):
        self.empty_caches()
        status, _ = self.train("s3", "s3://datasets/fm")
        figures = self.cache()
        self.assertGreater(sum(c["bytes_fetched"] for c in figures.values()), self.manifest["splits"]["train"]["bytes"] // 2)
        self.accuracy["s3"] = status["test_accuracy"]
        status, _ = self.train("local-path", self.packed)
        self.accuracy["local"] = status["test_accuracy"]
        self.assertGreater(self.accuracy["local"], 0.80, self.accuracy)
        for source in ("http", "s3"):
            if source in self.accuracy:
                self.assertLessEqual(abs(self.accuracy[source] - self.accuracy["local"]), 0.005, self.accuracy)

    def test_4_bad_input_and_faults(self):
        self.empty_caches()  # so that the bad shards are fetched, not found cached
        www = os.path.join(self.root, "www")
        train = [s["name"] for s in self.manifest["splits"]["train"]["shards"]]

        def variant(name, edit):
            d = os.path.join(www, name)
            shutil.copytree(self.packed, d)
            edit(d)
            return self.nginx.url + "/" + name

        # A shard whose bytes do not match its manifest (same size, one byte flipped).
        def corrupt(d):
            with open(os.path.join(d, train[0]), "r+b") as f:
                f.seek(2048)
                b = f.read(1)
                f.seek(2048)
                f.write(bytes([b[0] ^ 0xFF]))
        status, _ = self.train("corrupt", variant("corrupt", corrupt), expect="failed")
        text = json.dumps(status)
        self.assertIn("does not match its manifest twice", text)
        self.assertIn(train[0], text)

        # A shard missing on the server (the caches emptied again: the corrupt job's other
        # shards are this one's too).
        self.empty_caches()
        status, _ = self.train("missing", variant("missing", lambda d: os.remove(os.path.join(d, train[1]))),
                               expect="failed")
        text = json.dumps(status)
        self.assertIn("404", text)
        self.assertIn(train[1], text)

        # An unreachable source: the leader retries reading the manifest, logs each retry,
        # then refuses the job with the cause.
        dead = "http://%s:%d/fm" % (self.lan.leader_address, 9)
        r = self.run_client("submit", self.job_file("unreachable", dead), check=False, timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("manifest cannot be read", r.stderr)
        self.assertIn("gave up after 3 tries", r.stderr)
        self.assertIn("retry 2 of 3", self.leader.log())

        # A malformed manifest, and one whose totals contradict its shards.
        def truncate(d):
            with open(os.path.join(d, "manifest.json"), "r+") as f:
                f.truncate(100)
        r = self.run_client("submit", self.job_file("malformed", variant("malformed", truncate)), check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("not JSON", r.stderr)

        def contradict(d):
            path = os.path.join(d, "manifest.json")
            with open(path) as f:
                m = json.load(f)
            m["splits"]["train"]["samples"] += 1
            with open(path, "w") as f:
                json.dump(m, f)
        r = self.run_client("submit", self.job_file("inconsistent", variant("inconsistent", contradict)), check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("splits.train.samples", r.stderr)

        # S3 without credentials names where they go.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["AWS_ENDPOINT_URL"] = self.ceph.endpoint
        r = subprocess.run([self.dltrain, "dataset", "inspect", "s3://datasets/fm"], capture_output=True, text=True,
                           env=env, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("AWS_ACCESS_KEY_ID", r.stderr)
        self.assertIn("s3_credentials_file", r.stderr)

        # The cluster carries on.
        self.train("after-faults", self.nginx.url + "/fm")

    def test_5_workers_only_on_agents_with_a_cache(self):
        agent = Daemon(BUILD, self.root, "agent-nocache", """name = "host-nocache"
leader_url = "%s"
agent_token_file = "%s/agent.token"
advertise_address = "%s"
task_bind_address = "%s"
cores = 4
state_dir = "%s"
cache_bytes = 0
log_level = "info"
""" % (self.leader_url, self.root, self.lan.leader_address, self.lan.leader_address,
       os.path.join(self.root, "agent-nocache", "state")))
        agent.start()
        self.addCleanup(agent.stop)
        wait_for(lambda: any(a["agent"] == "host-nocache" and a.get("state") == "ready" for a in self.agents_json()),
                 60, "host-nocache ready")
        rows = {a["agent"]: a for a in self.agents_json()}
        self.assertFalse(rows["host-nocache"].get("shard_cache"), "premise: host-nocache has no cache")
        # 4 workers + 1 PS shard, one core each: the PS shard goes to the most free cores
        # (host-nocache, 4), the workers to host-0 and host-1 (2 cores each), not to the
        # agent with 4 free cores.
        status, events = self.train("cache-agents-only", self.nginx.url + "/fm", workers=4, epochs=1)
        where = {t["task"]: t["agent"] for t in status["tasks"]}
        self.assertEqual(where["ps-0"], "host-nocache", where)
        workers = {a for t, a in where.items() if t.startswith("worker")}
        self.assertEqual(workers, {"host-0", "host-1"}, where)
        placed = [e for e in events if e.get("event") == "data_placed"][0]
        self.assertNotIn("host-nocache", placed["agents"])
        # 5 workers do not fit the 4 cores of the agents with caches: it waits, and says why.
        r = self.run_client("submit", self.job_file("too-wide", self.nginx.url + "/fm", workers=5), "--json")
        reply = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(reply["state"], "queued", reply)
        self.assertIn("2 of the 3 agents have one", reply.get("warning", ""), reply)
        self.run_client("cancel", reply["job"])


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
