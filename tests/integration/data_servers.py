"""Real servers a sharded data set is read from, started by the tests and benchmarks in a
directory of their own (docs/data.md, "Sources"):

- Nginx: Debian's nginx serving a directory over HTTP (range requests included), with an
  access log the tests read to count what each client fetched.
- Ceph: a one-node Ceph cluster (a monitor, one OSD on memstore, radosgw) started by hand
  without systemd: a real S3 API with SigV4 credentials. put() uploads a file with curl's
  own SigV4 signing (an implementation independent of dltrain's).

Neither can bind port 0 and report it, so each takes a port the kernel just handed out
(free_port). Every wait is bounded; stop() kills the processes (SIGKILL: nothing of theirs
outlives the test, their data is scratch).
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid


def free_port(address="127.0.0.1"):
    """A TCP port on `address` the kernel just gave out and took back."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_http(url, timeout, what, wrap=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(list(wrap) + ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url], capture_output=True,
                           text=True)
        if r.stdout.strip() not in ("", "000"):
            return
        time.sleep(0.05)
    raise AssertionError("%s did not answer within %.0f s" % (what, timeout))


def missing():
    """What these servers need and this machine lacks, or None."""
    for tool in ("nginx", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph", "curl"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool) and not os.path.exists("/usr/bin/" + tool):
            return "needs %s (scripts/setup installs nginx-light, ceph-mon, ceph-osd, radosgw, ceph-common)" % tool
    return None


class Nginx:
    """nginx serving `root` at http://ADDRESS:PORT/."""

    def __init__(self, workdir, root, address="127.0.0.1", wrap=()):
        """`wrap`: what nginx runs under (nsenter into a network namespace: a store on a
        host of its own)."""
        self.dir = workdir
        os.makedirs(self.dir, exist_ok=True)
        self.address = address
        self.port = free_port("127.0.0.1") if wrap else free_port(address)
        self.url = "http://%s:%d" % (address, self.port)
        self.access_log = os.path.join(self.dir, "access.log")
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""daemon off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log info;
events { worker_connections 256; }
http {
  access_log %(d)s/access.log;
  client_body_temp_path %(d)s/body;
  proxy_temp_path %(d)s/proxy;
  fastcgi_temp_path %(d)s/fastcgi;
  uwsgi_temp_path %(d)s/uwsgi;
  scgi_temp_path %(d)s/scgi;
  sendfile on;
  server {
    listen %(a)s:%(p)d;
    root %(r)s;
    location / { autoindex on; }
  }
}
""" % {"d": self.dir, "a": address, "p": self.port, "r": root})
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(list(wrap) + [nginx, "-c", conf, "-p", self.dir], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.dir, "stderr.log"), "w"), start_new_session=True)
        wait_http(self.url + "/", 20, "nginx", list(wrap))

    def fetched(self, path_part):
        """Requests in the access log whose line names `path_part`, as (client address,
        path, status) tuples."""
        out = []
        if not os.path.exists(self.access_log):
            return out
        with open(self.access_log) as f:
            for line in f:
                parts = line.split('"')
                if len(parts) < 3 or path_part not in parts[1]:
                    continue
                status = parts[2].split()[0]
                out.append((line.split()[0], parts[1].split()[1], status))
        return out

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Ceph:
    """A one-node Ceph: monitor, memstore OSD and radosgw on `address`; an S3 user with
    `access_key`/`secret_key`; `endpoint` is radosgw's URL. Settings from what makes Ceph 16
    start by hand in a second: `ms mon client mode = crc secure` (radosgw cannot talk to an
    auth-none monitor otherwise), a short paxos interval, logs and run dir under `workdir`,
    no admin sockets (their paths outgrow 107 bytes), pools of size one, a client mount
    timeout (a dead monitor otherwise hangs the tools for 300 s)."""

    access_key = "DLTRAINTESTKEY"
    secret_key = "dltrain-test-secret-key-0123456789"

    def __init__(self, workdir, address="127.0.0.1", memory_bytes=2 << 30):
        self.dir = workdir
        os.makedirs(os.path.join(self.dir, "run"), exist_ok=True)
        os.makedirs(os.path.join(self.dir, "osd0"), exist_ok=True)
        os.makedirs(os.path.join(self.dir, "rgw"), exist_ok=True)
        self.procs = []
        fsid = str(uuid.uuid4())
        mon_port, rgw_port = free_port("127.0.0.1"), free_port(address)
        self.endpoint = "http://%s:%d" % (address, rgw_port)
        self.conf = os.path.join(self.dir, "ceph.conf")
        with open(self.conf, "w") as f:
            f.write("""[global]
fsid = %(fsid)s
mon host = v1:127.0.0.1:%(mon)d
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
mon allow pool size one = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
paxos propose interval = 0.05
mon cluster log to file = false
log file = %(d)s/$name.log
run dir = %(d)s/run
admin socket =
client mount timeout = 30
osd objectstore = memstore
memstore device bytes = %(mem)d
osd data = %(d)s/osd$id
mon data = %(d)s/mon-$id
osd crush chooseleaf type = 0
[client.rgw]
rgw frontends = beast endpoint=%(addr)s:%(rgw)d
rgw data = %(d)s/rgw
""" % {"fsid": fsid, "mon": mon_port, "d": self.dir, "mem": memory_bytes, "addr": address, "rgw": rgw_port})
        try:
            self._run(["monmaptool", "--create", "--add", "a", "v1:127.0.0.1:%d" % mon_port, "--fsid", fsid,
                       os.path.join(self.dir, "monmap")])
            self._run(["ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", os.path.join(self.dir, "monmap")])
            self._start(["ceph-mon", "-c", self.conf, "-i", "a", "-f"], "mon")
            osd_uuid = str(uuid.uuid4())  # the same in the map and on the OSD, or it is refused
            self._run(["ceph", "-c", self.conf, "osd", "create", osd_uuid, "0"], timeout=60)
            self._run(["ceph-osd", "-c", self.conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
            self._start_osd()
            self._start(["radosgw", "-c", self.conf, "-n", "client.rgw", "-f"], "rgw")
            wait_http(self.endpoint + "/", 60, "radosgw")
            self._run(["radosgw-admin", "-c", self.conf, "-n", "client.rgw", "user", "create", "--uid", "dltrain",
                       "--display-name", "dltrain tests", "--access-key", self.access_key, "--secret-key",
                       self.secret_key], timeout=60)
        except BaseException as e:
            self.stop()
            logs = ""
            for name in ("mon.out", "osd-0.out", "osd-1.out", "osd-2.out", "rgw.out", "client.rgw.log", "mon.a.log"):
                path = os.path.join(self.dir, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        logs += "\n--- %s:\n%s" % (name, f.read()[-1500:])
            raise AssertionError("the one-node Ceph did not start: %s%s" % (e, logs)) from e

    def _osd_up(self):
        r = subprocess.run(["ceph", "-c", self.conf, "osd", "stat", "-f", "json"], capture_output=True, text=True,
                           timeout=30)
        try:
            return json.loads(r.stdout).get("num_up_osds", 0) >= 1
        except ValueError:
            return False

    def _start_osd(self):
        """Starts the OSD and waits for it to be up. A first boot sometimes fails its own
        registration with the monitor ("mon_cmd_maybe_osd_create fail: 'wrong fsid'") and
        stays down; it is started again then, at most three times."""
        for attempt in range(3):
            self._start(["ceph-osd", "-c", self.conf, "-i", "0", "-f"], "osd-%d" % attempt)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if self._osd_up():
                    return
                time.sleep(0.1)
            p = self.procs.pop()
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        raise AssertionError("the OSD did not come up in three starts")

    def _run(self, argv, timeout=30):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError("%s exited %d: %s%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
        return r

    def _start(self, argv, name):
        log = open(os.path.join(self.dir, name + ".out"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def _curl(self, *args):
        return ["curl", "-s", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user",
                "%s:%s" % (self.access_key, self.secret_key)] + list(args)

    def make_bucket(self, bucket):
        empty = hashlib.sha256(b"").hexdigest()
        subprocess.run(self._curl("-X", "PUT", "-H", "x-amz-content-sha256: " + empty, "%s/%s" % (self.endpoint, bucket)),
                       check=True, capture_output=True, timeout=30)

    def put(self, path, key):
        """Uploads file `path` as `key` ("bucket/prefix/name")."""
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        subprocess.run(self._curl("-H", "x-amz-content-sha256: " + digest, "-T", path, "%s/%s" % (self.endpoint, key)),
                       check=True, capture_output=True, timeout=60)

    def put_dir(self, directory, prefix):
        for name in sorted(os.listdir(directory)):
            self.put(os.path.join(directory, name), prefix + "/" + name)

    def credentials_file(self, path):
        """Writes an AWS shared-credentials file for the test user; returns its path."""
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (self.access_key, self.secret_key))
        return path

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []
