#!/usr/bin/env python3
"""The main job (the README's quick start) timed beside a plain LibTorch loop of the same
job on the same machine, in the same run: the ratio of the two holds across machines of
this kind, where the absolute times do not (an AMD EPYC and an Intel Xeon of the same
size differ 1.5x in the main job; docs/benchmarks/main-job.md).

Each round runs configs/jobs/fashion-mnist.toml as scripts/quickstart does (a standalone
cluster of a leader and 3 agents of 1 core each, `dltrain submit --follow`; the time is
the job's submit-to-summary wall time) and then the same job file with
bench/e2e/plain_loop (one process: the same model, data, schedule and optimiser, no PS,
no sockets). Rounds alternate the two so that a slower minute of the machine falls on
both. Writes a result file with each run, the medians, the ratio and its provenance
(commit, date, CPU, command).

Usage: bench/main_job.py [--runs 3] [--out bench/results/main-job-YYYY-MM-DD.json]
Needs the build (scripts/setup builds plain_loop with the benchmarks).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standalone  # noqa: E402
from provenance import record  # noqa: E402

JOB = os.path.join(standalone.ROOT, "configs", "jobs", "fashion-mnist.toml")


def dltrain_run():
    with tempfile.TemporaryDirectory(prefix="dltrain-main-job-") as state:
        cluster = standalone.StandaloneCluster(standalone.BIN, state, 3, ["--cores-per-agent", "1"])
        try:
            cluster.start(timeout=60)
        except AssertionError as e:
            sys.exit(str(e))
        try:
            r = standalone.run_job(cluster.client, JOB)
        finally:
            cluster.stop()
    return {"wall_seconds": r["wall_seconds"], "test_accuracy": r["test_accuracy"]}


def plain_run():
    p = subprocess.run([os.path.join(standalone.BIN, "plain_loop"), JOB], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit("plain_loop failed (%d): %s" % (p.returncode, p.stderr[-2000:]))
    done = next(json.loads(line) for line in p.stdout.splitlines() if '"done"' in line)
    return {"wall_seconds": done["wall_seconds"], "test_accuracy": done["test_accuracy"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="rounds (each: the main job, then the plain loop)")
    ap.add_argument("--out", default=os.path.join(
        standalone.ROOT, "bench", "results", "main-job-%s.json" % datetime.date.today().isoformat()))
    args = ap.parse_args()
    prov = record(sys.argv)
    dl, plain = [], []
    for i in range(args.runs):
        dl.append(dltrain_run())
        print("round %d: dltrain %.1f s to %.4f" % (i + 1, dl[-1]["wall_seconds"], dl[-1]["test_accuracy"]), flush=True)
        plain.append(plain_run())
        print("round %d: plain loop %.1f s to %.4f" % (i + 1, plain[-1]["wall_seconds"], plain[-1]["test_accuracy"]),
              flush=True)
    med_dl = statistics.median(r["wall_seconds"] for r in dl)
    med_plain = statistics.median(r["wall_seconds"] for r in plain)
    out = {
        "what": "the main job (configs/jobs/fashion-mnist.toml on a standalone cluster of 3 one-core agents, submit to "
                "summary) against bench/e2e/plain_loop on the same job file, alternating, on one machine",
        "provenance": prov,
        "dltrain": dl,
        "plain_loop": plain,
        "median_seconds": {"dltrain": med_dl, "plain_loop": med_plain},
        "median_accuracy": {"dltrain": statistics.median(r["test_accuracy"] for r in dl),
                            "plain_loop": statistics.median(r["test_accuracy"] for r in plain)},
        "ratio_dltrain_to_plain_loop": med_dl / med_plain,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("median: dltrain %.1f s, plain loop %.1f s, ratio %.3f; %s" % (med_dl, med_plain, med_dl / med_plain,
                                                                          os.path.relpath(args.out)))


if __name__ == "__main__":
    main()
