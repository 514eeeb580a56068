"""A standalone dltrain cluster for the benchmarks (`dltrain-agent --standalone`).

start_cluster(state, agents, extra_args) starts one with its state and logs under the
directory `state` and waits until it has written its client settings; it returns the
process, the `dltrain` command line that reaches its leader (a list), and those settings
(client.json: leader, client_token, metrics_endpoint). It exits the benchmark with the
log's name when the cluster ends early or is not ready within 60 s.
"""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build")), "bin")


def start_cluster(state, agents=3, extra_args=()):
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(state, "xdg"))
    log = open(os.path.join(state, "standalone.log"), "w")
    proc = subprocess.Popen([os.path.join(BIN, "dltrain-agent"), "--standalone", "--agents", str(agents),
                             "--state-dir", os.path.join(state, "s")] + list(extra_args),
                            stdout=log, stderr=log, env=env)
    client_json = os.path.join(state, "s", "client.json")
    for _ in range(600):  # 60 s
        if os.path.exists(client_json):
            break
        if proc.poll() is not None:
            sys.exit("the standalone cluster exited; see " + log.name)
        time.sleep(0.1)
    else:
        proc.kill()
        sys.exit("the standalone cluster did not start within 60 s; see " + log.name)
    with open(client_json) as f:
        settings = json.load(f)
    client = [os.path.join(BIN, "dltrain"), "--leader", settings["leader"], "--token", settings["client_token"]]
    return proc, client, settings
