#!/usr/bin/env python3
"""How long each kind of leader fault takes to heal (docs/ha.md, docs/benchmarks/faults.md
"HA timing"): the serving candidate's process killed (SIGKILL), paused (SIGSTOP), or its
whole machine lost, and etcd losing its quorum and getting it back; at each lease TTL
given, on a three-member etcd.

The cluster is real and on this machine: a three-member etcd (Debian's etcd-server) on an
address of this namespace, three dltrain-agent leader candidates each on a "machine" of
its own (a network namespace joined by a veth pair, tests/integration/netns_host.py) and
two agents, with a job training during every fault. Measured from the fault:
  failover      until another candidate logs "serving as the leader"
  reregistered  until both agents have registered with the new leader (their logs)
  submit        until a `dltrain submit` (given every candidate's URL, tried again and
                again from the moment of the fault) is accepted
For the quorum: from killing two etcd members until the serving candidate steps down,
and from starting them again until a candidate serves, the agents re-registered and a
submit is accepted. After each fault the cluster is made whole (the process restarted,
SIGCONT, the machine brought back, the members running) and the job left to finish.

Usage: bench/ha/timing.py [--ttl 10 5] [--trials 3] [--faults sigkill sigstop host]
       [--quorum-trials 2] [--out FILE]      (root; DLTRAIN_BUILD_DIR: the build)
Writes JSON with every trial, the median and the largest of each figure, and provenance.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from ha_cluster import HaCluster  # noqa: E402
from netns_host import Dummy, Host, missing  # noqa: E402
from provenance import record  # noqa: E402

BUILD = os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
ENDED = ("succeeded", "failed", "cancelled")


def log_since(d, offset):
    with open(d.log_path, errors="replace") as f:
        f.seek(offset)
        return f.read()


class Trial:
    def __init__(self, c, hosts):
        self.c, self.hosts = c, hosts
        self.offsets = {}

    def mark(self):
        self.offsets = {d.name: d.log_size() for d in self.c.candidates + self.c.agents}
        self.t0 = time.monotonic()

    def wait_serving(self, exclude, timeout):
        new, term = self.c.serving(timeout, exclude=exclude, since=self.offsets)
        return new, term, time.monotonic() - self.t0

    def wait_reregistered(self, term, timeout):
        deadline = time.monotonic() + timeout
        rx = re.compile(r"registered with the leader \S+ at \S+ as \S+ \(\d+ cores\), term %d" % term)
        while time.monotonic() < deadline:
            if all(rx.search(log_since(a, self.offsets[a.name])) for a in self.c.agents):
                return time.monotonic() - self.t0
            time.sleep(0.05)
        raise AssertionError("the agents did not register under term %d" % term)

    def submit_thread(self, path, out):
        """Submits `path` again and again from the fault on until accepted; out["seconds"],
        out["job"]."""
        def run():
            while time.monotonic() - self.t0 < 300:
                r = self.c.client("submit", path, check=False, timeout=120)
                if r.returncode == 0:
                    out["seconds"] = time.monotonic() - self.t0
                    m = re.search(r"(job-\d+) submitted", r.stdout)
                    out["job"] = m.group(1) if m else None
                    return
                time.sleep(0.1)
        t = threading.Thread(target=run)
        t.start()
        return t


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2),
            "min": round(min(values), 2), "n": len(values)}


def run_ttl(ttl, faults, trials, quorum_trials):
    root = tempfile.mkdtemp(prefix="dltrain-bench-ha-timing-")
    dummy = Dummy()
    hosts = [Host(i) for i in range(3)]
    c = HaCluster(BUILD, root, etcd_members=3, candidates=3, agents=2, ttl=ttl, etcd_host=dummy.address,
                  candidate_hosts=[h.inside for h in hosts], candidate_wraps=[h.wrap for h in hosts])
    host_of = dict(zip((d.name for d in c.candidates), hosts))
    probe = c.job_file("probe", epochs=1, train_samples=2000)
    rows = []
    try:
        c.start(timeout=120)
        for fault in faults:
            for i in range(trials):
                job = c.client("submit", c.job_file("busy-%s-%d" % (fault, i), epochs=30, train_samples=12000)).stdout
                job = re.search(r"(job-\d+) submitted", job).group(1)
                c.wait_progress(job, 180)
                leader, term = c.current_leader()
                t = Trial(c, hosts)
                accepted = {}
                t.mark()
                if fault == "sigkill":
                    leader.proc.kill()
                elif fault == "sigstop":
                    os.kill(leader.proc.pid, signal.SIGSTOP)
                else:
                    host_of[leader.name].take_down()
                sub = t.submit_thread(probe, accepted)
                new, new_term, failover = t.wait_serving((leader,), ttl + 60)
                rereg = t.wait_reregistered(new_term, 120)
                sub.join(320)
                # Made whole again: the process restarted, woken, the machine back.
                if fault == "sigkill":
                    leader.proc.wait()
                    leader.start()
                elif fault == "sigstop":
                    os.kill(leader.proc.pid, signal.SIGCONT)
                else:
                    h = host_of[leader.name]
                    h.delete()
                    h.bring_up()
                    leader.start()
                leader.wait_log(r"standing by: \S+ serves", 120, since=leader.log_size() if fault == "host" else
                                t.offsets[leader.name])
                if accepted.get("job"):
                    c.client("cancel", accepted["job"], check=False)
                st = c.wait_state(job, ENDED, 900)
                row = {"ttl_seconds": ttl, "fault": fault, "trial": i + 1, "old_leader": leader.name,
                       "new_leader": new.name, "failover_seconds": round(failover, 2),
                       "reregistered_seconds": round(rereg, 2),
                       "submit_accepted_seconds": round(accepted["seconds"], 2) if "seconds" in accepted else None,
                       "job": job, "job_state": st["state"], "adopted": st["generation"] == 1 and
                       st["reassignments"] == 0}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        for i in range(quorum_trials):
            job = c.client("submit", c.job_file("busy-quorum-%d" % i, epochs=30, train_samples=12000)).stdout
            job = re.search(r"(job-\d+) submitted", job).group(1)
            c.wait_progress(job, 180)
            leader, term = c.current_leader()
            t = Trial(c, hosts)
            t.mark()
            lost = c.members[1:]
            for m in lost:
                m.kill()
            leader.wait_log(r"stepping down", ttl + 60, since=t.offsets[leader.name])
            stepped = time.monotonic() - t.t0
            time.sleep(2)
            t.mark()
            for m in lost:
                m.start(state="existing")
            accepted = {}
            sub = t.submit_thread(probe, accepted)
            new, new_term, serving = t.wait_serving((), ttl + 120)
            rereg = t.wait_reregistered(new_term, 180)
            sub.join(320)
            if accepted.get("job"):
                c.client("cancel", accepted["job"], check=False)
            st = c.wait_state(job, ENDED, 900)
            row = {"ttl_seconds": ttl, "fault": "quorum", "trial": i + 1, "old_leader": leader.name,
                   "new_leader": new.name, "stepped_down_seconds": round(stepped, 2),
                   "serving_after_return_seconds": round(serving, 2), "reregistered_seconds": round(rereg, 2),
                   "submit_accepted_seconds": round(accepted["seconds"], 2) if "seconds" in accepted else None,
                   "job": job, "job_state": st["state"]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        c.stop()
        for h in hosts:
            h.delete()
        dummy.delete()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ttl", type=int, nargs="+", default=[10, 5], help="lease TTLs, s (10 is the default)")
    ap.add_argument("--trials", type=int, default=3, help="trials of each fault at each TTL")
    ap.add_argument("--faults", nargs="+", default=["sigkill", "sigstop", "host"], choices=["sigkill", "sigstop", "host"])
    ap.add_argument("--quorum-trials", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ha-timing.json"))
    a = ap.parse_args()
    why = missing()
    if why:
        sys.exit("bench/ha/timing.py: " + why)
    prov = record(sys.argv)
    rows = []
    for ttl in a.ttl:
        rows += run_ttl(ttl, a.faults, a.trials, a.quorum_trials)
    table = {}
    for ttl in a.ttl:
        for fault in a.faults + (["quorum"] if a.quorum_trials else []):
            sel = [r for r in rows if r["ttl_seconds"] == ttl and r["fault"] == fault]
            keys = ["failover_seconds", "reregistered_seconds", "submit_accepted_seconds"] if fault != "quorum" else \
                ["stepped_down_seconds", "serving_after_return_seconds", "reregistered_seconds",
                 "submit_accepted_seconds"]
            table["%s ttl=%d" % (fault, ttl)] = {k: summary([r.get(k) for r in sel]) for k in keys}
            table["%s ttl=%d" % (fault, ttl)]["jobs_succeeded"] = "%d of %d" % (
                sum(r["job_state"] == "succeeded" for r in sel), len(sel))
    out = {"what": "leader faults timed on a 3-member etcd, 3 candidates on hosts of their own, 2 agents",
           "provenance": prov, "summary": table, "trials": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
