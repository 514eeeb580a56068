"""The one way the Python tests and benchmarks start dltrain daemons.

Daemon: one dltrain-agent process with its own configuration file and log (the HA cluster's
candidates and agents, ha_cluster.py). StandaloneCluster: `dltrain-agent --standalone`, a
leader and its agents in one process tree, ready once it has written its client settings
(client.json); the torchscript test and the benchmarks (bench/standalone.py) use it. Every
wait is bounded and says what it waited for; stop() ends the whole process group.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests (tests/CMakeLists.txt)


def test_main(module, missing_prerequisites):
    """The main of a Python integration test run as `TEST.py BUILD_DIR`: BUILD_DIR into the
    test module's global BUILD, a skip (exit SKIP, saying why) when missing_prerequisites()
    names something, SIGTERM (CTest stopping a run) ending the case as an error so that its
    cleanups stop the daemons, then unittest's verbose run of `module`'s cases."""
    if len(sys.argv) < 2:
        sys.exit(module.__doc__)
    module.BUILD = os.path.abspath(sys.argv.pop(1))
    why = missing_prerequisites()
    if why:
        print("skipped: " + why)
        sys.exit(SKIP)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unittest.main(module=module, verbosity=2)


def wait_for(predicate, timeout, what, interval=0.05):
    """Polls `predicate` every `interval` s until it returns a true value, which it returns;
    raises AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("%s: not within %.0f s" % (what, timeout))
        time.sleep(interval)


def write_tokens(root, names):
    """A fresh random token for each of `names`, written to root/NAME.token (mode 0600, as
    the daemons demand); returns {name: token}."""
    tokens = {}
    for name in names:
        tokens[name] = os.urandom(24).hex()
        with open(os.open(os.path.join(root, name + ".token"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(tokens[name] + "\n")
    return tokens


def run_cleanups(cleanups):
    """Calls every function of `cleanups`, last first; one that raises is reported and the
    rest still run."""
    for f in reversed(cleanups):
        try:
            f()
        except Exception as e:  # noqa: BLE001 - every cleanup runs
            print("cleanup: %s" % e)


def stop_process(proc, grace=30):
    """SIGCONT (a stopped process cannot exit) and SIGTERM to `proc`, SIGKILL to its process
    group after `grace` s."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Daemon:
    """One dltrain-agent with its configuration and its log file."""

    def __init__(self, build, root, name, config, wrap=()):
        """`wrap`: what the daemon's command line is run under (e.g. nsenter into a network
        namespace)."""
        self.build, self.name, self.wrap = build, name, list(wrap)
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.config_path = os.path.join(self.dir, "agent.toml")
        with open(self.config_path, "w") as f:
            f.write(config)
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.proc = None

    def start(self):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.wrap + [os.path.join(self.build, "bin", "dltrain-agent"), "-c", self.config_path],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def wait_log(self, pattern, timeout, since=0):
        """The first match of regex `pattern` in the log after byte `since`, within
        `timeout` s (polled every 50 ms); (the match, the monotonic time it was seen)."""
        rx = re.compile(pattern)

        def search():
            with open(self.log_path, errors="replace") as f:
                f.seek(since)
                return rx.search(f.read())
        try:
            m = wait_for(search, timeout, "%s: /%s/" % (self.name, pattern))
        except AssertionError as e:
            raise AssertionError("%s; its log ends:\n%s" % (e, self.log()[-4000:])) from None
        return m, time.monotonic()

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self):
        stop_process(self.proc)


class StandaloneCluster:
    """`dltrain-agent --standalone --agents N` with its state (`state_dir`, default
    root/s), log and client settings under `root`; `env` (XDG_STATE_HOME inside `root`) makes a plain `dltrain` find it,
    `client` is a `dltrain` command line that names its leader and token."""

    def __init__(self, build_bin, root, agents=3, extra_args=(), state_dir=None):
        self.bin, self.root = build_bin, root
        self.state = state_dir or os.path.join(root, "s")
        self.env = dict(os.environ, XDG_STATE_HOME=os.path.join(root, "xdg"))
        self.log_path = os.path.join(root, "standalone.log")
        self.argv = [os.path.join(build_bin, "dltrain-agent"), "--standalone", "--agents", str(agents),
                     "--state-dir", self.state] + list(extra_args)
        self.proc = None
        self.settings = None
        self.client = None

    def start(self, timeout=60):
        """Starts it and waits until it is ready; AssertionError with its log when it ends
        or is not ready within `timeout` s (the cluster is stopped then)."""
        os.makedirs(self.root, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        client_json = os.path.join(self.state, "client.json")
        try:
            wait_for(lambda: os.path.exists(client_json) or self.proc.poll() is not None, timeout,
                     "the standalone cluster's client settings (%s)" % client_json, interval=0.1)
            if self.proc.poll() is not None:
                raise AssertionError("the standalone cluster exited with %d" % self.proc.returncode)
        except AssertionError as e:
            self.stop()
            raise AssertionError("%s; see %s:\n%s" % (e, self.log_path, self.log()[-4000:])) from None
        with open(client_json) as f:
            self.settings = json.load(f)
        self.client = [os.path.join(self.bin, "dltrain"), "--leader", self.settings["leader"], "--token",
                       self.settings["client_token"]]
        return self

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, grace=60):
        stop_process(self.proc, grace)
