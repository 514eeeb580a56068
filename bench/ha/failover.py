#!/usr/bin/env python3
"""Leader failover under running jobs (docs/ha.md, docs/benchmarks.md "HA").

A real HA cluster on this machine (tests/integration/ha_cluster.py): a one-member etcd
(Debian's etcd-server), three dltrain-agent leader candidates without tasks of their own,
two agents. First `--baseline` jobs run undisturbed; then, `--kills` times, a job is
submitted, and once a worker has reported progress the serving candidate is killed
(SIGKILL) and restarted 1 s later, as systemd would. Measured: the failover time (the
kill to the first "serving as the leader" line of another candidate, polled every 50 ms),
whether each job was adopted (generation 1, no re-assignment) and succeeded, jobs lost
(submitted but not listed by the final leader), and the final test accuracy against the
undisturbed runs'.

Usage: bench/ha/failover.py [--kills 20] [--baseline 3] [--ttl 5] [--out FILE]
(DLTRAIN_BUILD_DIR: the build, default build/). Results: JSON on stdout and in --out.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from ha_cluster import HaCluster  # noqa: E402

BUILD = os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
ENDED = ("succeeded", "failed", "cancelled")


def percentile(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def submit(c, name):
    out = c.client("submit", c.job_file(name, epochs=6, train_samples=24000)).stdout
    return re.search(r"(job-\d+) submitted", out).group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--baseline", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=5, help="the candidates' lease TTL, s")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ha_failover.json"))
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="dltrain-bench-ha-")
    c = HaCluster(BUILD, root, etcd_members=1, candidates=3, agents=2, ttl=a.ttl)
    submitted, baseline, runs = {}, [], []
    try:
        c.start()
        for i in range(a.baseline):
            job = submit(c, "base-%d" % i)
            submitted[job] = "base-%d" % i
            st = c.wait_state(job, ENDED, 600)
            baseline.append(st.get("test_accuracy"))
            print("undisturbed %s: %s, accuracy %s" % (job, st["state"], st.get("test_accuracy")), file=sys.stderr)
        for i in range(a.kills):
            job = submit(c, "kill-%d" % i)
            submitted[job] = "kill-%d" % i
            c.wait_progress(job, 120)
            leader, term = c.current_leader()
            since = {d.name: d.log_size() for d in c.candidates}
            leader.proc.kill()
            killed = time.monotonic()
            leader.proc.wait()
            new, new_term = c.serving(a.ttl + 30, exclude=(leader,), since=since)
            failover = time.monotonic() - killed
            time.sleep(1)
            leader.start()  # systemd's Restart=
            st = c.wait_state(job, ENDED, 600)
            runs.append({"job": job, "killed": leader.name, "term": term, "new_leader": new.name, "new_term": new_term,
                         "failover_seconds": round(failover, 3), "state": st["state"],
                         "generation": st["generation"], "reassignments": st["reassignments"],
                         "test_accuracy": st.get("test_accuracy")})
            print("kill %d: %s (term %d) -> %s (term %d) in %.2f s; %s %s, accuracy %s" %
                  (i + 1, leader.name, term, new.name, new_term, failover, job, st["state"], st.get("test_accuracy")),
                  file=sys.stderr)
        listed = {j["job"]: j["name"] for j in c.jobs()}
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
    times = [r["failover_seconds"] for r in runs]
    acc = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
    result = {
        "kills": len(runs), "ttl_seconds": a.ttl,
        "failover_seconds": {"p50": round(percentile(times, 50), 3), "p99": round(percentile(times, 99), 3),
                             "max": max(times), "min": min(times)} if times else None,
        "jobs_submitted": len(submitted),
        "jobs_lost": sorted(set(submitted) - set(listed)),
        "jobs_listed_twice": len(listed) != len(set(listed)),
        "killed_jobs_succeeded": sum(r["state"] == "succeeded" for r in runs),
        "killed_jobs_adopted": sum(r["generation"] == 1 and r["reassignments"] == 0 for r in runs),
        "accuracy_undisturbed_mean": round(statistics.mean(baseline), 4) if baseline else None,
        "accuracy_after_failover_mean": round(statistics.mean(acc), 4) if acc else None,
        "accuracy_after_failover_min": min(acc) if acc else None,
        "runs": runs, "undisturbed": baseline,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if not result["jobs_lost"] and result["killed_jobs_succeeded"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
