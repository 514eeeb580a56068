"""A real etcd for the HA tests (ha_election_test.py, ha_failover_test.py): Debian's
etcd-server on loopback, one member or a cluster of several, and reads of its keys
through its JSON gateway."""
import base64
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

ETCD = "/usr/bin/etcd"


def free_port():
    """A loopback port the kernel picked (bound to port 0, then released for etcd). etcd
    itself cannot be given port 0: every member must know its peers' addresses before any
    starts, and its JSON gateway dials its own gRPC server at the listen address it was
    given (with port 0 the gateway answers every request "dial tcp 127.0.0.1:0: connect:
    connection refused")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Member:
    """One etcd member on ports of its own at `host` (loopback unless a test's network
    namespaces need another address)."""

    def __init__(self, root, name, peer_port, cluster, host="127.0.0.1"):
        self.name, self.peer_port, self.cluster, self.host = name, peer_port, cluster, host
        self.dir = os.path.join(root, name)
        self.log_path = os.path.join(root, name + ".log")
        self.proc = None
        self.url = "http://%s:%d" % (host, free_port())

    def start(self, state="new"):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [ETCD, "--name", self.name, "--data-dir", self.dir,
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", "http://%s:%d" % (self.host, self.peer_port),
             "--initial-advertise-peer-urls", "http://%s:%d" % (self.host, self.peer_port),
             "--initial-cluster", self.cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", "dltrain-test"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_url(self, deadline):
        while time.monotonic() < deadline:
            try:  # etcd's health endpoint: true once the member has joined a cluster with a leader
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if json.load(r).get("health") in ("true", True):
                        return self.url
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise AssertionError("etcd %s exited: %s" % (self.name, open(self.log_path).read()[-3000:]))
            time.sleep(0.1)
        raise AssertionError("etcd %s did not serve clients: %s" % (self.name, open(self.log_path).read()[-3000:]))

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_cluster(root, n, host="127.0.0.1"):
    """n members at `host`, a cluster of their own, started and serving; (the members,
    their client URLs)."""
    ports = [free_port() for _ in range(n)]
    cluster = ",".join("m%d=http://%s:%d" % (i, host, p) for i, p in enumerate(ports))
    members = [Member(root, "m%d" % i, p, cluster, host) for i, p in enumerate(ports)]
    for m in members:
        m.start()
    deadline = time.monotonic() + 60
    return members, [m.wait_url(deadline) for m in members]


def kv_range(url, prefix):
    """etcd's keys under `prefix` with their create revisions, through its JSON gateway."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode()}).encode()
    for attempt in range(50):  # a member answers 503 while its cluster elects a raft leader
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/v3/kv/range", data=body), timeout=10) as r:
                out = json.load(r)
            break
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == 49:
                raise
            time.sleep(0.2)
    return [(base64.b64decode(kv["key"]).decode(), int(kv["create_revision"])) for kv in out.get("kvs", [])]


def is_raft_leader(url):
    """Whether the member at `url` leads its cluster's raft (/v3/maintenance/status)."""
    req = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}")
    with urllib.request.urlopen(req, timeout=10) as r:
        st = json.load(r)
    return st.get("leader") == st["header"]["member_id"]


def missing_prerequisites():
    if not os.access(ETCD, os.X_OK):
        return ETCD + " is missing (Debian's etcd-server; scripts/setup installs it for the tests)"
    return None
