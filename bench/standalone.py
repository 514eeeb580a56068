"""A standalone dltrain cluster for the benchmarks (`dltrain-agent --standalone`).

run_job(client, path, timeout) submits a job file, follows it to its summary and returns
its figures. start_cluster(state, agents, extra_args) starts one with its state and logs under the
directory `state` and waits until it has written its client settings; it returns the
process, the `dltrain` command line that reaches its leader (a list), and those settings
(client.json: leader, client_token, metrics_endpoint). It exits the benchmark with the
log's name when the cluster ends early or is not ready within 60 s. machine() and
commit() say where and at what commit a result was measured.
"""

import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build")), "bin")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from dltrain_cluster import StandaloneCluster  # noqa: E402  (the one way tests and benchmarks start one)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import commit, machine  # noqa: E402,F401  (what the benchmarks import from here)


def build_commit(bin_dir=BIN):
    """The commit of the checkout the programs in `bin_dir` were built from (CMakeCache.txt's
    CMAKE_HOME_DIRECTORY beside it), as commit() says it; that of this checkout when the
    cache does not say."""
    try:
        with open(os.path.join(os.path.dirname(bin_dir), "CMakeCache.txt")) as f:
            home = next(l.split("=", 1)[1].strip() for l in f if l.startswith("CMAKE_HOME_DIRECTORY:"))
    except (OSError, StopIteration):
        home = ROOT
    return commit(home)


def start_cluster(state, agents=3, extra_args=()):
    cluster = StandaloneCluster(BIN, state, agents, extra_args)
    try:
        cluster.start(timeout=60)
    except AssertionError as e:
        sys.exit(str(e))
    return cluster.proc, cluster.client, cluster.settings


def run_job(client, path, timeout=3600):
    """`dltrain submit PATH --follow --json` on the cluster `client` reaches: the job's id,
    final test accuracy and wall time, and its training images/s (the workers' epoch_end
    figures summed per epoch, averaged over the epochs). Exits the benchmark with the
    output's end when the job does not succeed."""
    r = subprocess.run(client + ["submit", path, "--follow", "--json"], capture_output=True, text=True, timeout=timeout)
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    summary = next((e for e in events if e.get("event") == "summary"), None)
    if r.returncode != 0 or summary is None:
        sys.exit("%s failed (%d): %s" % (path, r.returncode, r.stdout[-2000:] + r.stderr[-2000:]))
    per_epoch = {}
    for e in events:
        if e.get("event") == "epoch_end" and "images_per_sec" in e:
            per_epoch[e["epoch"]] = per_epoch.get(e["epoch"], 0.0) + e["images_per_sec"]
    return {"job": summary["job"], "test_accuracy": summary["test_accuracy"], "wall_seconds": summary["wall_seconds"],
            "images_per_sec": statistics.mean(per_epoch.values())}
