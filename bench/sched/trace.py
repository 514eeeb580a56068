#!/usr/bin/env python3
"""The trace-driven scheduling benchmark (docs/benchmarks/sched.md, "At 16 to 256 workers"):
FIFO, the per-job planner and the leader's shared plan on workloads drawn from the
published statistics of Microsoft's Philly trace, at 16 to 256 worker slots.

The workload (per cluster size and seed):
  sizes      the GPUs a job asks for: 1 (70 %), 2 (10 %), 4 (15 %), 8 (5 %);
  durations  its run time at that size: 10^x minutes, x uniform in [1.5, 3] for 80 % of
             the jobs and in [3, 4] for 20 % (31.6 minutes to 6.9 days).
  Both are the Philly-derived distributions of Gavel (Narayanan et al., OSDI '20, §7.1,
  and its trace generator), fitted to the Philly trace (Jeon et al., ATC '19: 117,325 jobs,
  Aug–Dec 2017). Arrivals: a Poisson process whose rate offers `--load` of the cluster's
  worker-seconds on average (rate = load × slots ÷ (mean size × mean duration)), as Gavel
  and Pollux scale arrival rates to the cluster. Users: each job is one of `--users`
  users, uniformly. Deadlines: a `--deadline-share` of the jobs, chosen at random, must end
  within U(1.5, 3) × their run time at the requested size, counted from arrival.
  Elastic bounds: [1, 2 × requested], capped at the cluster.
The scaling curve of each job: one of four classes, uniformly, each the calibrated scale
model's (bench/sim/scalesim.py, inputs from bench/results/sim.json: mlp-large's measured
compute per step, its bytes per step, the PS's measured apply and pull times) speedup
T(1) ÷ T(w) at w = 1..16 workers of batch 64 on 60,000 images:
  dense ASGD over 1 Gbit/s, DGC 1 % over 1 Gbit/s, BSP dense over 10 Gbit/s, and dense
  ASGD over 10 Gbit/s (one PS shard each). A job's work (seconds at one worker) is its
  duration × speedup(requested).
The simulation: build/bin/sched_sim (bench/sched/sched_sim.cpp), the shared plan being
the leader's own code (lib/leader/shared_plan.cpp). A resize pauses its job for
--resize-pause seconds (the plan's default resize cost).

Usage: bench/sched/trace.py BUILD_DIR [--slots 16,64,256] [--seeds 5] [--out FILE]
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "sim"))
import provenance  # noqa: E402
import scalesim  # noqa: E402

SIZES = [(1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05)]
MAX_CURVE = 16
MODEL_FLOATS = 702602  # mlp-large, as bench/sim/run.py
PARTITIONS = [200704, 200704, 200704, 100490]
POLICIES = ["fifo", "fifo-backfill", "planner", "shared", "shared-capped"]


def mean_duration_s():
    """E[60 · 10^x] for the two-part uniform x: E[10^U(a,b)] = (10^b − 10^a) / ((b − a) ln 10)."""
    part = lambda a, b: (10 ** b - 10 ** a) / ((b - a) * math.log(10))  # noqa: E731
    return 60 * (0.8 * part(1.5, 3) + 0.2 * part(3, 4))


def curves():
    """The four classes' speedup at 1..MAX_CURVE workers, from the calibrated scale model."""
    sim = json.load(open(os.path.join(ROOT, "bench", "results", "sim.json")))
    inp = sim["scale_inputs"]
    cal = sim["calibrations"][0]["parameters"]
    dense_b = scalesim.dense_bytes(MODEL_FLOATS, len(PARTITIONS))
    sparse_b = scalesim.sparse_bytes(PARTITIONS, 0.01)
    classes = {
        "dense ASGD, 1 Gbit/s": (1, dict(mode="async", compute_s=inp["compute_dense_s"], up_bytes=dense_b,
                                         down_bytes=dense_b, ps_apply_s=cal["apply_dense_s"])),
        "DGC 1 %, 1 Gbit/s": (1, dict(mode="async", compute_s=inp["compute_dgc_s"], up_bytes=sparse_b,
                                      down_bytes=sparse_b, ps_apply_s=cal["apply_sparse_s"],
                                      ps_pull_s=cal["pull_sparse_s"])),
        "BSP dense, 10 Gbit/s": (10, dict(mode="bsp", compute_s=inp["compute_dense_s"], up_bytes=dense_b,
                                          down_bytes=dense_b, ps_apply_s=cal["apply_dense_s"])),
        "dense ASGD, 10 Gbit/s": (10, dict(mode="async", compute_s=inp["compute_dense_s"], up_bytes=dense_b,
                                           down_bytes=dense_b, ps_apply_s=cal["apply_dense_s"])),
    }
    out = {}
    for name, (gbit, cfg) in classes.items():
        times = []
        for n in range(1, MAX_CURVE + 1):
            c = dict(cfg, workers=n, steps_per_epoch=math.ceil(60000 / (64 * n)), bandwidth=gbit * 1e9 / 8 * 0.968,
                     latency=inp["latency_s"], compute_cv=0.1, seed=1)
            times.append(scalesim.simulate(c)["epoch_seconds"][0])
        out[name] = [round(times[0] / t, 4) for t in times]
    return out


def workload(slots, seed, load, users, deadline_share, n_jobs, classes, pause):
    """One workload for sched_sim (its --workload JSON): n_jobs jobs drawn as the module's
    docstring says, for a cluster of `slots`, seeded by (seed, slots)."""
    rng = random.Random(seed * 1000003 + slots)
    mean_size = sum(s * p for s, p in SIZES)
    rate = load * slots / (mean_size * mean_duration_s())
    names = sorted(classes)
    jobs, t = [], 0.0
    for i in range(n_jobs):
        t += rng.expovariate(rate)
        r, size = rng.random(), SIZES[-1][0]
        for s, p in SIZES:
            if r < p:
                size = s
                break
            r -= p
        size = min(size, slots)
        x = rng.uniform(1.5, 3) if rng.random() < 0.8 else rng.uniform(3, 4)
        duration = 60 * 10 ** x
        curve = classes[rng.choice(names)]
        hi = min(2 * size, slots, MAX_CURVE)
        job = {"id": "j%d" % i, "user": "u%d" % rng.randrange(users), "arrival": round(t, 3), "requested": size,
               "min": 1, "max": hi, "work": duration * curve[size - 1], "speedup": curve[:hi]}
        if rng.random() < deadline_share:
            job["deadline"] = rng.uniform(1.5, 3) * duration
        jobs.append(job)
    return {"slots": slots, "resize_pause_s": pause, "jobs": jobs}


def main():
    """Runs every cluster size × seed through sched_sim, prints a line each and the summary,
    and writes the result file (--out) with its provenance."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", help="the build directory (with bin/sched_sim)")
    ap.add_argument("--slots", default="16,64,256", help="cluster sizes, worker slots (GPUs)")
    ap.add_argument("--seeds", type=int, default=5, help="workloads per cluster size")
    ap.add_argument("--jobs-per-slot", type=float, default=8, help="jobs per workload ÷ slots (at least 160 jobs)")
    ap.add_argument("--load", type=float, default=0.9, help="offered load, share of the cluster's worker-seconds")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--deadline-share", type=float, default=0.3)
    ap.add_argument("--resize-pause", type=float, default=30.0, help="seconds a resize pauses its job")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sched-trace.json"))
    a = ap.parse_args()
    sim = os.path.join(a.build, "bin", "sched_sim")
    if not os.access(sim, os.X_OK):
        sys.exit("trace.py: %s not found: build the sched_sim target (ninja -C %s sched_sim)" % (sim, a.build))
    classes = curves()
    for name, c in classes.items():
        print("%-24s speedup at 1..16: %s" % (name, " ".join("%.2f" % x for x in c)), flush=True)
    rows = []
    started = time.time()
    for slots in [int(s) for s in a.slots.split(",")]:
        n_jobs = max(160, int(a.jobs_per_slot * slots))
        for seed in range(1, a.seeds + 1):
            w = workload(slots, seed, a.load, a.users, a.deadline_share, n_jobs, classes, a.resize_pause)
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(w, f)
            try:
                t0 = time.time()
                out = subprocess.run([sim, "--workload", f.name], check=True, capture_output=True, text=True).stdout
            finally:
                os.unlink(f.name)
            res = {r["policy"]: r for r in map(json.loads, out.splitlines())}
            rows.append({"slots": slots, "seed": seed, "jobs": n_jobs, "results": res, "sim_seconds": round(time.time() - t0, 2)})
            f_ = res["fifo"]
            print("slots %4d seed %d (%d jobs, %.1f s): avg JCT h fifo %.1f backfill %.1f planner %.1f shared %.1f "
                  "capped %.1f -> shared/fifo %.3f; deadlines met %d/%d/%d/%d/%d of %d" % (
                      slots, seed, n_jobs, time.time() - t0, f_["avg_jct_s"] / 3600,
                      res["fifo-backfill"]["avg_jct_s"] / 3600, res["planner"]["avg_jct_s"] / 3600,
                      res["shared"]["avg_jct_s"] / 3600, res["shared-capped"]["avg_jct_s"] / 3600,
                      res["shared"]["avg_jct_s"] / f_["avg_jct_s"],
                      *[res[p]["deadlines_met"] for p in POLICIES], f_["deadline_jobs"]), flush=True)
    summary = []
    for slots in sorted({r["slots"] for r in rows}):
        rs = [r for r in rows if r["slots"] == slots]
        entry = {"slots": slots, "seeds": len(rs), "jobs": rs[0]["jobs"]}
        for p in POLICIES:
            for k in ("avg_jct_s", "p99_jct_s", "makespan_s"):
                entry["%s_%s_vs_fifo" % (p, k)] = round(statistics.mean(r["results"][p][k] / r["results"]["fifo"][k] for r in rs), 4)
            entry["%s_deadlines_met" % p] = round(statistics.mean(
                r["results"][p]["deadlines_met"] / max(1, r["results"][p]["deadline_jobs"]) for r in rs), 4)
            entry["%s_utilisation" % p] = round(statistics.mean(r["results"][p]["utilisation"] for r in rs), 4)
        entry["shared_avg_jct_vs_fifo_per_seed"] = [round(r["results"]["shared"]["avg_jct_s"] / r["results"]["fifo"]["avg_jct_s"], 4) for r in rs]
        entry["shared_resizes_per_job"] = round(statistics.mean(r["results"]["shared"]["resizes"] / r["jobs"] for r in rs), 3)
        summary.append(entry)
    result = {"provenance": provenance.record(["bench/sched/trace.py"] + sys.argv[1:]),
              "settings": {k: v for k, v in vars(a).items() if k not in ("build", "out")},
              "mean_duration_s": mean_duration_s(), "curves": classes, "summary": summary, "runs": rows,
              "wall_seconds": round(time.time() - started, 1)}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
