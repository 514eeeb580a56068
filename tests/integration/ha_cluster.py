"""A dltrain cluster with leader candidates on a real etcd, for the HA failover test and
benchmark (tests/integration/ha_failover_test.py, bench/ha/failover.py): etcd members
(etcd_cluster.py), leader candidates and agents as real dltrain-agent daemons with their
own configuration files and logs, and the real `dltrain` client given every candidate's
URL. Everything listens on loopback; the candidates' control ports are free ports the
kernel picked (a candidate's port must be fixed: agents and clients list it)."""
import json
import os
import re
import subprocess
import time

from dltrain_cluster import Daemon  # noqa: F401  (the candidates and agents)
from etcd_cluster import free_port, start_cluster
from job_files import mlp_job_toml

DATA = "/usr/share/datasets/fashion-mnist"
AGENT_TOKEN = "agent-secret-for-the-ha-test-0123456789"
CLIENT_TOKEN = "client-secret-for-the-ha-test-0123456789"


class HaCluster:
    """etcd, `candidates` leader candidates (no tasks of their own) and `agents` agents."""

    def __init__(self, build, root, etcd_members=1, candidates=2, agents=2, ttl=3, agent_cores=3,
                 etcd_host="127.0.0.1", candidate_hosts=None, candidate_wraps=None, ha_extra=""):
        """`candidate_hosts`: the address each candidate listens on and advertises (default
        loopback); `candidate_wraps`: what each candidate's command runs under (e.g. nsenter
        into its host's network namespace); `ha_extra`: more lines of each [ha] table."""
        self.build, self.root, self.ttl = build, root, ttl
        self.members, self.etcd_urls = start_cluster(root, etcd_members, etcd_host)
        self.ports = [free_port() for _ in range(candidates)]
        hosts = candidate_hosts or ["127.0.0.1"] * candidates
        wraps = candidate_wraps or [()] * candidates
        self.urls = ["ws://%s:%d" % (h, p) for h, p in zip(hosts, self.ports)]
        endpoints = ", ".join('"%s"' % u for u in self.etcd_urls)
        self.candidates = []
        for i, port in enumerate(self.ports):
            self.candidates.append(Daemon(build, root, "cand-%c" % (ord("a") + i), """
name = "cand-%c"
leader = true
host_tasks = false
listen_address = "%s"
listen_port = %d
advertise_address = "%s"
state_dir = "%s"
agent_token = "%s"
client_token = "%s"
heartbeat_interval = "500ms"
heartbeat_timeout = "4s"
log_level = "info"

[ha]
etcd = [%s]
lease_ttl = "%ds"
request_timeout = "700ms"
%s
""" % (ord("a") + i, hosts[i], port, hosts[i], os.path.join(root, "cand-%c" % (ord("a") + i), "state"), AGENT_TOKEN,
                CLIENT_TOKEN, endpoints, ttl, ha_extra), wraps[i]))
        leader_urls = ", ".join('"%s"' % u for u in self.urls)
        self.agents = []
        for i in range(agents):
            name = "agent-%d" % i
            self.agents.append(Daemon(build, root, name, """
name = "%s"
leader = false
leader_url = [%s]
advertise_address = "127.0.0.1"
task_bind_address = "127.0.0.1"
cores = %d
gpus = "none"
state_dir = "%s"
agent_token = "%s"
heartbeat_interval = "500ms"
heartbeat_timeout = "4s"
ps_checkpoint_interval = "2s"
progress_interval = "1s"
log_level = "info"
""" % (name, leader_urls, agent_cores, os.path.join(root, name, "state"), AGENT_TOKEN)))
        self.env = dict(os.environ, DLTRAIN_LEADER=",".join(self.urls), DLTRAIN_TOKEN=CLIENT_TOKEN,
                        DLTRAIN_CLIENT_CONFIG=os.path.join(root, "no-client.toml"))

    def start(self, timeout=60):
        """Starts every daemon; waits for a candidate to serve and every agent to register
        with it. Returns the serving candidate and its term."""
        for d in self.candidates + self.agents:
            d.start()
        leader, term = self.serving(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            agents = self.client("agents", "--json", check=False)
            if agents.returncode == 0 and sum(a["state"] == "ready" for a in json.loads(agents.stdout)["agents"]) == len(self.agents):
                return leader, term
            time.sleep(0.2)
        raise AssertionError("the agents did not register: %s" % [a.log()[-2000:] for a in self.agents])

    SERVING = r"serving as the leader on \S+, term (\d+)"

    def serving(self, timeout, exclude=(), since=None):
        """(the candidate, its term) of the first "serving" line of a candidate not in
        `exclude`, after byte offsets `since` (a dict by name; default 0), within `timeout` s."""
        deadline = time.monotonic() + timeout
        since = since or {}
        while time.monotonic() < deadline:
            for c in self.candidates:
                if c in exclude:
                    continue
                with open(c.log_path, errors="replace") as f:
                    f.seek(since.get(c.name, 0))
                    m = re.search(self.SERVING, f.read())
                if m:
                    return c, int(m.group(1))
            time.sleep(0.05)
        raise AssertionError("no candidate serves within %.0f s: %s" %
                             (timeout, {c.name: c.log()[-2000:] for c in self.candidates}))

    def current_leader(self):
        """(the candidate, its term) that serves, as `dltrain status` says."""
        m = re.search(r"^leader: (\S+) serves, term (\d+)", self.client("status").stdout, re.M)
        if not m:
            raise AssertionError("dltrain status names no leader")
        return next(c for c in self.candidates if c.name == m.group(1)), int(m.group(2))

    def client(self, *args, timeout=120, check=True):
        r = subprocess.run([os.path.join(self.build, "bin", "dltrain")] + list(args), env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("dltrain %s: exit %d\n%s\n%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
        return r

    def job_file(self, name, epochs=3, train_samples=12000, workers=2):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(mlp_job_toml(name, DATA, epochs, train_samples, workers))
        return path

    def status(self, job):
        return json.loads(self.client("status", job, "--json").stdout)

    def jobs(self):
        return json.loads(self.client("list", "--json", "--limit", "1000").stdout)["jobs"]

    def wait_state(self, job, states, timeout):
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            r = self.client("status", job, "--json", check=False, timeout=60)
            if r.returncode == 0:
                st = json.loads(r.stdout)
                if st["state"] in states:
                    return st
            time.sleep(0.5)
        raise AssertionError("%s not in %s within %.0f s: %s" % (job, states, timeout, st))

    def wait_progress(self, job, timeout):
        """Waits until `job` runs and a worker has reported progress, with at least an
        epoch left (the premise of a failover during the job)."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status(job)
            if st["state"] in ("succeeded", "failed", "cancelled"):
                raise AssertionError("%s ended before the failover: %s" % (job, st))
            if st["state"] == "running" and any(t.get("step", 0) > 0 for t in st.get("tasks", [])):
                return st
            time.sleep(0.3)
        raise AssertionError("%s made no progress within %.0f s: %s" % (job, timeout, st))

    def stop(self):
        for d in self.agents + self.candidates:
            d.stop()
        for m in self.members:
            m.kill()
