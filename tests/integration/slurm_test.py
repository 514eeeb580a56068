#!/usr/bin/env python3
"""The Slurm launcher (`dltrain slurm`, docs/slurm.md) under a real Slurm.

Each case starts its own Slurm from Debian's packages: munged with a private key and
socket, slurmctld and three slurmd, each daemon in a network namespace of its own
(ctl = 10.201.0.1, nodes n1..n3 = 10.201.0.2..4) joined by a bridge in a fourth
namespace, so that every node has its own address and ports and nothing outside the
test is ever reached. A case submits the packaged batch template
(packaging/slurm/dltrain.sbatch) with sbatch and watches it with scontrol, and the
dltrain cluster it forms with `dltrain status` through the client settings the launcher
wrote. Everything is torn down after each case.

Usage: slurm_test.py BUILD_DIR [unittest args, e.g. SlurmLauncher.test_batch_job_succeeds]
Exit status 77 (skipped) without root, ip netns, nsenter or Slurm's programs.
"""
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dltrain_cluster import test_main  # noqa: E402
from job_files import mlp_job_toml  # noqa: E402

BUILD = None
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "/usr/share/datasets/fashion-mnist"
NODES = ["n1", "n2", "n3"]
SUBNET = "10.201.0"
CPUS = 2  # per node, as slurm.conf says
SKIP = 77


def missing_prerequisites():
    if os.geteuid() != 0:
        return "needs root (network namespaces, Slurm's daemons)"
    for prog in ("ip", "nsenter", "munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel"):
        if shutil.which(prog) is None:
            return prog + " is not installed (scripts/setup installs slurmctld, slurmd, slurm-client, munge)"
    if not os.path.isdir(DATA):
        return DATA + " is missing (dataset-fashion-mnist)"
    return None


def sh(argv, timeout=60, check=True, env=None, ns=None):
    """Runs argv (in network namespace `ns` when given) to its end, bounded by `timeout`."""
    if ns is not None:
        argv = ["nsenter", "--net=/run/netns/" + ns] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError("%s exited with %d: %s%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
    return r


def wait_for(what, predicate, timeout, interval=0.5):
    """predicate()'s first truthy value within `timeout` seconds; AssertionError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("%s did not happen within %g s" % (what, timeout))


class SlurmCluster:
    """munged, slurmctld and one slurmd per node, each node in its own network namespace."""

    def __init__(self, root):
        self.root = root
        tag = "%d" % (os.getpid() % 100000)
        self.ns = {name: "dls%s%s" % (tag, name) for name in ["sw", "ctl"] + NODES}
        self.conf = os.path.join(root, "slurm.conf")
        self.daemons = {}  # name -> Popen
        self.logs = os.path.join(root, "log")
        os.makedirs(self.logs)
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in list(self.env):
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]  # a test run inside an allocation must not leak it into these jobs

    def address(self, name):
        return "%s.%d" % (SUBNET, 1 if name == "ctl" else NODES.index(name) + 2)

    @staticmethod
    def remove_leftovers():
        """Namespaces and daemons an earlier run left when it was killed (a CTest timeout
        sends SIGKILL, which no cleanup survives)."""
        for line in sh(["ip", "netns", "list"], check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if re.fullmatch(r"dls\d+(sw|ctl|n\d)", name):
                for pid in sh(["ip", "netns", "pids", name], check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                sh(["ip", "netns", "delete", name], check=False)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if "dltrain-slurm-test-" in cmdline(int(pid)) and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def start(self):
        self.remove_leftovers()
        self._network()
        self._munge()
        self._config()
        self._spawn("slurmctld", "ctl", ["slurmctld", "-D", "-i", "-f", self.conf])
        wait_for("slurmctld answering", lambda: self.scontrol(["ping"], check=False).returncode == 0, 30)
        for n in NODES:
            self._spawn("slurmd-" + n, n, ["slurmd", "-D", "-f", self.conf, "-N", n])
        wait_for("all 3 nodes idle", lambda: self.node_states() == {n: "IDLE" for n in NODES}, 60)

    def _network(self):
        for ns in self.ns.values():
            sh(["ip", "netns", "add", ns])
        sw = self.ns["sw"]
        sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        for i, name in enumerate(["ctl"] + NODES):
            ns = self.ns[name]
            port = "p%d" % i
            sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            sh(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
            sh(["ip", "-n", ns, "addr", "add", self.address(name) + "/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _munge(self):
        d = os.path.join(self.root, "munge")
        os.makedirs(d, mode=0o700)
        key = os.path.join(d, "key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(d, "sock")
        self._spawn("munged", None, ["munged", "-f", "--foreground", "--socket=" + self.munge_socket,
                                     "--key-file=" + key, "--pid-file=" + os.path.join(d, "pid"),
                                     "--log-file=" + os.path.join(self.logs, "munged.log"),
                                     "--seed-file=" + os.path.join(d, "seed")])
        wait_for("munged's socket", lambda: os.path.exists(self.munge_socket), 20)

    def _config(self):
        r = self.root
        lines = [
            "ClusterName=dltraintest",
            "SlurmctldHost=%s(%s)" % (socket.gethostname().split(".")[0], self.address("ctl")),
            "AuthType=auth/munge", "CredType=cred/munge",
            "AuthInfo=socket=" + self.munge_socket,
            "SlurmUser=root", "SlurmdUser=root",
            "StateSaveLocation=%s/ctld-state" % r,
            "SlurmdSpoolDir=%s/spool-%%n" % r,
            "SlurmctldPidFile=%s/slurmctld.pid" % r,
            "SlurmdPidFile=%s/slurmd-%%n.pid" % r,
            "SlurmctldLogFile=%s/log/slurmctld.log" % r,
            "SlurmdLogFile=%s/log/slurmd-%%n.log" % r,
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2", "SlurmdTimeout=10", "MinJobAge=600", "KillWait=15",
            "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
            "NodeName=DEFAULT CPUs=%d State=UNKNOWN" % CPUS,
        ]
        lines += ["NodeName=%s NodeAddr=%s" % (n, self.address(n)) for n in NODES]
        lines.append("PartitionName=main Nodes=%s Default=YES MaxTime=INFINITE State=UP" % ",".join(NODES))
        os.makedirs(os.path.join(r, "ctld-state"))
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, name, ns, argv):
        if ns is not None:
            argv = ["nsenter", "--net=/run/netns/" + self.ns[ns]] + argv
        out = open(os.path.join(self.logs, name + ".out"), "w")
        self.daemons[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                              start_new_session=True)

    def client(self, argv, check=True, timeout=60):
        """A Slurm client command, run where the controller is."""
        return sh(argv, timeout=timeout, check=check, env=self.env, ns=self.ns["ctl"])

    def scontrol(self, args, check=True):
        return self.client(["scontrol"] + args, check=check)

    def node_states(self):
        r = self.scontrol(["show", "node", "-o"], check=False)
        states = {}
        for line in r.stdout.splitlines():
            m = re.search(r"NodeName=(\S+)", line)
            s = re.search(r"State=(\S+)", line)
            if m and s:
                states[m.group(1)] = s.group(1)
        return states

    def job(self, job_id):
        """scontrol's fields of a Slurm job (JobState, ExitCode, NodeList…)."""
        r = self.scontrol(["show", "job", "-o", job_id], check=False)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def ns_pids(self, node):
        r = sh(["ip", "netns", "pids", self.ns[node]], check=False)
        return [int(p) for p in r.stdout.split()]

    def stop(self):
        for node in ["ctl"] + NODES:
            for pid in self.ns_pids(node) if node in self.ns else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.daemons.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for ns in self.ns.values():
            sh(["ip", "netns", "delete", ns], check=False)


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class SlurmLauncher(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-slurm-test-")
        os.chmod(self.root, 0o755)
        self.slurm = SlurmCluster(self.root)
        self.addCleanup(self._cleanup)
        self.slurm.start()
        self.client_dir = os.path.join(self.root, "client")
        self.state_root = os.path.join(self.root, "node-state")
        os.makedirs(self.state_root)

    def _cleanup(self):
        self.slurm.stop()
        if os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            print("kept for inspection: " + self.root, file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------

    def write_job(self, name, epochs, data_dir=DATA, train_samples=12000):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(mlp_job_toml(name, data_dir, epochs, train_samples))
        return path

    def sbatch(self, job_file=None):
        """Submits the packaged template (3 nodes, whole nodes) and returns the Slurm job id."""
        env = dict(self.slurm.env,
                   DLTRAIN=os.path.join(BUILD, "bin", "dltrain"),
                   DLTRAIN_SLURM_OPTIONS="--dir %s --state-root %s --drain-poll 2 --form-timeout 90 "
                                         "--stop-timeout 30" % (self.client_dir, self.state_root))
        argv = ["sbatch", "--parsable", "--nodes=3", "--exclusive", "--chdir=" + self.root,
                "--output=" + os.path.join(self.root, "batch-%j.out"),
                os.path.join(SOURCE, "packaging", "slurm", "dltrain.sbatch")]
        if job_file:
            argv.append(job_file)
        r = sh(argv, env=env, ns=self.slurm.ns["ctl"])
        job_id = r.stdout.strip().split(";")[0]
        self.assertRegex(job_id, r"^\d+$")
        return job_id

    def output(self, job_id):
        try:
            with open(os.path.join(self.root, "batch-%s.out" % job_id)) as f:
                return f.read()
        except OSError:
            return ""

    def wait_end(self, job_id, timeout):
        """The Slurm job's fields once it has ended."""
        ended = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL")

        def done():
            j = self.slurm.job(job_id)
            return j if j.get("JobState") in ended else None
        try:
            return wait_for("Slurm job %s's end" % job_id, done, timeout, interval=1)
        except AssertionError:
            raise AssertionError("Slurm job %s did not end within %d s: %s\n%s" %
                                 (job_id, timeout, self.slurm.job(job_id), self.output(job_id)))

    def dltrain(self, args, check=True):
        """`dltrain ARGS --json` against the Slurm job's cluster, from the controller's namespace."""
        env = dict(self.slurm.env, DLTRAIN_CLIENT_CONFIG=os.path.join(self.client_dir, "client.toml"))
        r = sh([os.path.join(BUILD, "bin", "dltrain")] + args, env=env, ns=self.slurm.ns["ctl"], check=check)
        return r

    def training_job_id(self, job_id):
        m = wait_for("the training job's submission in the batch output",
                     lambda: re.search(r"^(\S+) submitted \(", self.output(job_id), re.M), 150, interval=1)
        return m.group(1)

    def wait_running_on(self, job_id, job, node, min_left=0.5):
        """Waits until `job` runs with a worker on `node` that has at least `min_left` of its steps
        left (the premise of a fault case); returns that worker's task name."""
        def ready():
            r = self.dltrain(["status", job, "--json"], check=False)
            if r.returncode != 0:
                return None
            st = json.loads(r.stdout)
            if st.get("state") != "running":
                return None
            for t in st.get("tasks", []):
                if (t.get("agent") == node and t["task"].startswith("worker") and t.get("state") == "running"
                        and t.get("steps_total", 0) > 0 and t.get("step", 0) > 0
                        and t["step"] <= (1 - min_left) * t["steps_total"]):
                    return t["task"]
            return None
        try:
            return wait_for("%s running with a worker on %s that has work left" % (job, node), ready, 120)
        except AssertionError:
            raise AssertionError("premise not met: %s never ran a worker on %s with half its steps left: %s\n%s" %
                                 (job, node, self.dltrain(["status", job, "--json"], check=False).stdout,
                                  self.output(job_id)))

    def worker_node(self, job):
        """A node other than the leader's that runs one of `job`'s workers."""
        def find():
            r = self.dltrain(["status", job, "--json"], check=False)
            if r.returncode != 0:
                return None
            for t in json.loads(r.stdout).get("tasks", []):
                if t["task"].startswith("worker") and t.get("agent") in ("n2", "n3"):
                    return t["agent"]
            return None
        return wait_for("a worker of %s on n2 or n3" % job, find, 120)

    def assert_nothing_left(self, job_id):
        """No process of the job on any node (only slurmd itself in each node's namespace) and
        no agent state directory, within a bound."""
        daemons = {p.pid for p in self.slurm.daemons.values()}

        def clean():
            left = {}
            for n in NODES:
                others = [p for p in self.slurm.ns_pids(n) if p not in daemons and "slurmd" not in cmdline(p)]
                others = [p for p in others if cmdline(p)]  # gone between listing and reading
                if others:
                    left[n] = [cmdline(p) for p in others]
            return "clean" if not left else None
        try:
            wait_for("every process of Slurm job %s ended" % job_id, clean, 60)
        except AssertionError:
            leftover = {n: [cmdline(p) for p in self.slurm.ns_pids(n)] for n in NODES}
            raise AssertionError("processes left after Slurm job %s: %s" % (job_id, leftover))
        self.assertFalse(os.path.exists(os.path.join(self.state_root, "dltrain-slurm-" + job_id)),
                         os.listdir(self.state_root))
        # Anywhere on the machine (a process that left its node's namespace would be missed
        # above): none of this case's agents or tasks, whose command lines name their
        # configuration or task directory under this case's directory. Other tests' dltrain
        # processes (CTest -j) are not this job's.
        mine = [cmdline(p) for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                if os.path.join(BUILD, "bin") in cmdline(p) and self.root in cmdline(p)]
        self.assertEqual(mine, [], "dltrain processes of this job still running")

    # -- cases -----------------------------------------------------------------------

    def test_batch_job_succeeds(self):
        """3 nodes: the leader on the first, 3 agents with the granted cores, the job succeeds, exit 0."""
        job_id = self.sbatch(self.write_job("slurm-ok", epochs=2))
        end = self.wait_end(job_id, 420)
        out = self.output(job_id)
        self.assertEqual((end["JobState"], end["ExitCode"]), ("COMPLETED", "0:0"), out)
        # The cluster the leader reported: every node's agent with the 2 CPUs Slurm granted it.
        leader = "ws://%s:%d" % (self.slurm.address("n1"), 20000 + int(job_id) % 40000)  # the port follows the job id
        self.assertIn("starting 3 agents on n[1-3] (leader %s on n1)" % leader, out)
        self.assertIn("3 agents, %d cores, 0 GPUs (n1 2 cores, n2 2 cores, n3 2 cores); the leader is "
                      "%s on n1" % (3 * CPUS, leader), out)
        self.assertRegex(out, r"(?m)^\S+ succeeded")
        # The job's final accuracy, from its summary line (the first epoch's evaluation, after
        # half the training, varies with the asynchronous workers' interleaving).
        m = re.search(r"(?m)^\S+ succeeded: test accuracy (0\.\d+)", out)
        self.assertIsNotNone(m, out)
        self.assertGreater(float(m.group(1)), 0.6, out)  # chance is 0.1
        self.assertIn("client settings: export DLTRAIN_CLIENT_CONFIG=%s/client.toml" % self.client_dir, out)
        # The settings (and the token) go with the cluster; the trained model stays.
        self.assertFalse(os.path.exists(os.path.join(self.client_dir, "client.token")))
        self.assertEqual(sorted(os.listdir(os.path.join(self.client_dir, "job-1-model"))),
                         ["metadata.json", "state_dict.pt"])
        self.assertIn("job-1 succeeded; its trained model is in %s/job-1-model" % self.client_dir, out)
        self.assert_nothing_left(job_id)

    def test_failing_training_job_fails_the_batch_job_with_its_reason(self):
        """A job whose training data is corrupt fails; the batch job fails and says why."""
        bad = os.path.join(self.root, "bad-data")
        os.makedirs(bad)
        for name in os.listdir(DATA):
            shutil.copy(os.path.join(DATA, name), bad)
        images = os.path.join(bad, "train-images-idx3-ubyte.gz")
        with open(images, "r+b") as f:
            f.truncate(64 * 1024)  # a few hundred images of the 12,000 the job reads
        with self.assertRaises(Exception):  # the premise: the file really is unreadable
            with gzip.open(images) as f:
                while f.read(1 << 20):
                    pass
        job_id = self.sbatch(self.write_job("slurm-bad-data", epochs=2, data_dir=bad))
        end = self.wait_end(job_id, 300)
        out = self.output(job_id)
        self.assertEqual(end["JobState"], "FAILED", out)
        self.assertEqual(end["ExitCode"], "1:0", out)
        last = [l for l in out.splitlines() if l.strip()][-1]
        self.assertRegex(last, r"^dltrain slurm: \S+ failed: .*train-images-idx3-ubyte", out)
        self.assert_nothing_left(job_id)

    def test_scancel_stops_every_task(self):
        """scancel while the job trains: every agent, PS shard and worker ends, the state is removed."""
        job_id = self.sbatch(self.write_job("slurm-cancelled", epochs=30))
        job = self.training_job_id(job_id)
        node = self.worker_node(job)
        self.wait_running_on(job_id, job, node)
        tasks = [cmdline(p) for n in NODES for p in self.slurm.ns_pids(n) if "dltrain-worker" in cmdline(p)]
        self.assertEqual(len(tasks), 2, tasks)  # the premise: both workers run
        self.slurm.client(["scancel", job_id])
        end = self.wait_end(job_id, 120)
        self.assertEqual(end["JobState"], "CANCELLED", self.output(job_id))
        self.assert_nothing_left(job_id)

    def test_killed_node_is_a_lost_agent_and_the_job_recovers(self):
        """A node that dies mid-job (every process in its namespace SIGKILLed): its agent is lost,
        the leader re-assigns its tasks, the job succeeds and the batch job exits 0."""
        job_id = self.sbatch(self.write_job("slurm-node-killed", epochs=8, train_samples=60000))
        job = self.training_job_id(job_id)
        node = self.worker_node(job)
        worker = self.wait_running_on(job_id, job, node)
        victims = self.slurm.ns_pids(node)
        self.assertTrue(any("dltrain-agent" in cmdline(p) for p in victims), [cmdline(p) for p in victims])
        for p in victims:
            os.kill(p, signal.SIGKILL)
        end = self.wait_end(job_id, 600)
        out = self.output(job_id)
        self.assertEqual((end["JobState"], end["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertIn("agent %s was lost" % node, out)
        self.assertRegex(out, r"(?m)^\S+ succeeded")
        self.assertIn(worker, out)
        self.assertNotEqual(self.slurm.node_states().get(node, "").split("+")[0], "IDLE")

    def test_drained_node_stops_its_agent_and_the_job_recovers(self):
        """`scontrol update state=drain` mid-job: that node's agent stops, its tasks move, the job succeeds."""
        job_id = self.sbatch(self.write_job("slurm-node-drained", epochs=8, train_samples=60000))
        job = self.training_job_id(job_id)
        node = self.worker_node(job)
        self.wait_running_on(job_id, job, node)
        self.slurm.scontrol(["update", "nodename=" + node, "state=drain", "reason=dltrain-test"])
        end = self.wait_end(job_id, 600)
        out = self.output(job_id)
        self.assertEqual((end["JobState"], end["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertIn("dltrain slurm agent on %s: Slurm drains this node" % node, out)
        self.assertIn("stopped with its agent %s, which is shutting down" % node, out)
        self.assertRegex(out, r"(?m)^\S+ succeeded")
        self.assert_nothing_left(job_id)


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
