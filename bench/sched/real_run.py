#!/usr/bin/env python3
"""The shared plan against FIFO on a real cluster here: 6 small elastic jobs from 2 users
arriving over time (docs/benchmarks/sched.md).

One leader (with [users] alice and bob) and 2 agents of 3 cores each, all on loopback;
three passes, each on a fresh cluster:
  alone    each job by itself, one after the other: its accuracy alone;
  fifo     the 6 jobs submitted at their arrival times to a leader with shared_plan off:
           each runs at the size its file asks for, the others wait in the queue;
  shared   the same submissions with shared_plan on (docs/operations.md, "The shared plan").
A job's completion time (JCT) is from its submission to the moment the client sees it
succeeded (polled every 0.2 s). The jobs: Fashion-MNIST MLPs of 12,000 to 60,000 training
images and 3 to 4 epochs, arriving 1 s apart, each asking for 3 workers with [elastic]
bounds [1, 3]: a job of
3 workers and its PS shard takes 4 of the 6 cores, so FIFO runs one at a time.

Usage: bench/sched/real_run.py BUILD_DIR [--runs 3] [--out bench/results/sched-real.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from dltrain_cluster import Daemon, wait_for, write_tokens  # noqa: E402
import provenance  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
# (name, user, arrival s, training images, epochs)
JOBS = [("j1-long", "alice", 0, 60000, 4), ("j2-short", "bob", 1, 12000, 3), ("j3-mid", "alice", 2, 30000, 3),
        ("j4-short", "bob", 3, 12000, 3), ("j5-long", "bob", 4, 48000, 4), ("j6-short", "alice", 5, 12000, 3)]


def job_toml(name, train, epochs):
    return """name = "%s"
model = "mlp"
dataset = "fashion-mnist"
data_dir = "%s"
epochs = %d
workers = 3
ps_shards = 1
batch_size = 32
train_samples = %d
test_samples = 10000
seed = 7

[optimizer]
lr = 0.01
momentum = 0.9
lr_schedule = "cosine"
warmup_epochs = 0.2

[elastic]
min_workers = 1
max_workers = 3
""" % (name, DATA, epochs, train)


class Cluster:
    def __init__(self, build, shared):
        self.build = build
        self.root = tempfile.mkdtemp(prefix="dltrain-sched-")
        self.tokens = write_tokens(self.root, ("agent", "client", "alice", "bob"))
        state = os.path.join(self.root, "leader", "state")
        self.leader = Daemon(build, self.root, "leader", """leader = true
host_tasks = false
listen_address = "127.0.0.1"
listen_port = 0
state_dir = "%(state)s"
agent_token_file = "%(root)s/agent.token"
client_token_file = "%(root)s/client.token"
progress_interval = "500ms"
shared_plan = %(shared)s

[users.alice]
token_file = "%(root)s/alice.token"

[users.bob]
token_file = "%(root)s/bob.token"
""" % {"state": state, "root": self.root, "shared": "true" if shared else "false"}).start()
        info = os.path.join(state, "leader.json")
        wait_for(lambda: os.path.exists(info), 30, "leader.json")
        with open(info) as f:
            self.url = json.load(f)["url"]
        self.agents = [Daemon(build, self.root, "agent-%d" % i, """name = "host-%d"
leader_url = "%s"
agent_token_file = "%s/agent.token"
cores = 3
state_dir = "%s"
progress_interval = "500ms"
""" % (i, self.url, self.root, os.path.join(self.root, "agent-%d" % i, "state"))).start() for i in range(2)]
        wait_for(lambda: len([a for a in self.cli("client", "agents", "--json").get("agents", [])
                              if a.get("state") == "ready"]) == 2, 60, "2 agents ready", interval=0.2)

    def cli(self, user, *args):
        argv = [os.path.join(self.build, "bin", "dltrain"), "--leader", self.url, "--token", self.tokens[user], *args]
        r = subprocess.run(argv + ([] if "--json" in args else ["--json"]), capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError("dltrain %s: %s" % (" ".join(args), r.stderr))
        return json.loads(r.stdout.strip().splitlines()[-1])

    def submit(self, user, name, train, epochs):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(job_toml(name, train, epochs))
        return self.cli(user, "submit", path)["job"]

    def close(self):
        for d in self.agents + [self.leader]:
            d.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def run(build, mode):
    """One pass: {name: {jct_s, accuracy, user}} and the pass's makespan."""
    c = Cluster(build, mode == "shared")
    try:
        t0 = time.monotonic()
        out, ids, submitted, pending = {}, {}, {}, list(JOBS)
        while pending or any(n not in out for n in ids):
            now = time.monotonic() - t0
            if mode == "alone":
                if pending and all(n in out for n in ids):
                    name, user, _, train, epochs = pending.pop(0)
                    ids[name] = (c.submit(user, name, train, epochs), user)
                    submitted[name] = time.monotonic()
            else:
                while pending and pending[0][2] <= now:
                    name, user, _, train, epochs = pending.pop(0)
                    ids[name] = (c.submit(user, name, train, epochs), user)
                    submitted[name] = time.monotonic()
            for name, (jid, user) in ids.items():
                if name in out:
                    continue
                st = c.cli("client", "status", jid)
                if st["state"] in ("succeeded", "failed", "cancelled"):
                    if st["state"] != "succeeded":
                        raise RuntimeError("%s %s: %s" % (name, st["state"], st.get("error")))
                    out[name] = {"user": user, "jct_s": round(time.monotonic() - submitted[name], 2),
                                 "accuracy": st["test_accuracy"]}
                    print("%s: %s %s %.1f s, accuracy %.4f" % (mode, name, jid, out[name]["jct_s"],
                                                              st["test_accuracy"]), flush=True)
            time.sleep(0.2)
        return out, round(time.monotonic() - t0, 2)
    finally:
        c.close()


def one_run(build, record):
    """The three passes on fresh clusters, and the run's figures and goals."""
    result = {"provenance": record,
              "jobs": [{"name": n, "user": u, "arrival_s": a, "train_samples": t, "epochs": e} for n, u, a, t, e in JOBS],
              "cluster": "leader + 2 agents x 3 cores (6 cores) on loopback, this machine's CPUs shared by all"}
    for mode in ("alone", "fifo", "shared"):
        jobs, makespan = run(build, mode)
        avg = sum(j["jct_s"] for j in jobs.values()) / len(jobs)
        result[mode] = {"jobs": jobs, "avg_jct_s": round(avg, 2), "makespan_s": makespan}
        print("%s: average JCT %.1f s, makespan %.1f s" % (mode, avg, makespan), flush=True)
    result["shared_over_fifo_avg_jct"] = round(result["shared"]["avg_jct_s"] / result["fifo"]["avg_jct_s"], 3)
    result["accuracy_gap_to_alone_points"] = {
        n: round(100 * (result["shared"]["jobs"][n]["accuracy"] - result["alone"]["jobs"][n]["accuracy"]), 2)
        for n, *_ in JOBS}
    result["goals"] = {"avg_jct_at_most_0.7x_fifo": result["shared_over_fifo_avg_jct"] <= 0.7,
                       "accuracy_within_1_point_of_alone": all(abs(v) <= 1.0 for v in
                                                               result["accuracy_gap_to_alone_points"].values())}
    print(json.dumps({k: result[k] for k in ("shared_over_fifo_avg_jct", "accuracy_gap_to_alone_points", "goals")}),
          flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--runs", type=int, default=3, help="runs, one after the other (each: alone, fifo, shared)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sched-real.json"))
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    record = provenance.record(["bench/sched/real_run.py"] + sys.argv[1:])
    runs = [one_run(build, record) for _ in range(args.runs)]
    ratios = [r["shared_over_fifo_avg_jct"] for r in runs]
    result = {"provenance": record, "runs": runs, "shared_over_fifo_avg_jct": ratios,
              "median_shared_over_fifo_avg_jct": sorted(ratios)[len(ratios) // 2]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
