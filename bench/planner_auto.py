#!/usr/bin/python3
"""The automatic job's predicted time against its run, on a fresh cluster each time.

Each repetition starts a standalone cluster with an empty history (`dltrain-agent
--standalone --agents 3 --cores-per-agent 1`, as scripts/quickstart does), submits
configs/jobs/fashion-mnist-auto.toml (workers and batch size "auto"), and measures:

  predicted   the chosen row's total_seconds in the plan the leader made after its
              exploration runs: epochs x (T + E) + the exploration time already spent
              (docs/planner.md, "Solving")
  run         wall seconds from the submit to the summary line, as the client saw them
  error       run / predicted - 1

and, per epoch, the predicted T + E against the job's own epoch_end events (epoch and
evaluation seconds of worker 0). The planner's goal: |error| <= 15 %.

Usage (after scripts/setup; DLTRAIN_BUILD_DIR picks the build directory):
  bench/planner_auto.py [--reps 3] [--job FILE] [--out bench/results/planner-auto.json]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from standalone import ROOT, start_cluster  # bench/standalone.py


def one_run(job_file):
    state = tempfile.mkdtemp(prefix="dltrain-planner-auto-")
    proc, client, _ = start_cluster(state)
    try:
        t0 = time.monotonic()
        follower = subprocess.Popen(client + ["submit", job_file, "--follow", "--json"], stdout=subprocess.PIPE,
                                    text=True)
        lines = []
        plan = None
        job = None
        for line in follower.stdout:
            lines.append(line)
            try:
                e = json.loads(line)
            except ValueError:
                continue
            job = job or e.get("job")
            # The plan that runs is the one in the status once the job left exploring.
            if plan is None and job and e.get("event") in ("started", "progress"):
                st = json.loads(subprocess.check_output(client + ["status", job, "--json"], timeout=30))
                if st.get("plan", {}).get("choice"):
                    plan = st["plan"]
        follower.wait(timeout=60)
        wall = time.monotonic() - t0
        events = [json.loads(x) for x in lines if x.startswith("{")]
        summary = events[-1]
        if summary.get("state") != "succeeded":
            sys.exit("the job did not succeed: " + "".join(lines[-20:]))
        if plan is None:
            sys.exit("no plan with a choice in the job's status")
        choice = plan["choice"]
        row = next(r for r in plan["table"]
                   if r["workers"] == choice["workers"] and r["batch_size"] == choice["batch_size"])
        epochs = [e for e in events if e.get("event") == "epoch_end" and e.get("rank", 0) == 0]
        measured_epoch = [e.get("epoch_seconds", 0.0) + e.get("eval_seconds", 0.0) for e in epochs]
        return {
            "choice": choice,
            "predicted_seconds": row["total_seconds"],
            "predicted_seconds_per_epoch": row["seconds_per_epoch"],
            "predicted_eval_seconds": row["eval_seconds"],
            "predicted_accuracy": row["accuracy"],
            "run_seconds": round(wall, 1),
            "error": round(wall / row["total_seconds"] - 1, 4),
            "measured_seconds_per_epoch": round(statistics.mean(measured_epoch), 2) if measured_epoch else None,
            "measured_eval_seconds": round(statistics.mean(e.get("eval_seconds", 0.0) for e in epochs), 2)
            if epochs else None,
            "test_accuracy": summary.get("test_accuracy"),
            "summary_wall_seconds": summary.get("wall_seconds"),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["rm", "-rf", state])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="fresh clusters, one job each (default 3)")
    ap.add_argument("--job", default=os.path.join(ROOT, "configs", "jobs", "fashion-mnist-auto.toml"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "planner-auto.json"))
    a = ap.parse_args()
    runs = []
    for _ in range(a.reps):
        r = one_run(a.job)
        runs.append(r)
        print(json.dumps(r), flush=True)
    result = {"job": os.path.relpath(a.job, ROOT), "runs": runs,
              "median_error": statistics.median(r["error"] for r in runs)}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({"median_error": result["median_error"], "out": a.out}))


if __name__ == "__main__":
    main()
