#!/usr/bin/env python3
"""The planner's compression choice against every fixed method, per link, in one run
(docs/benchmarks/planner.md, "Choosing the compression").

For each link (`100mbit`, `1gbit`: 4 agents in network namespaces on a bridge, every link
limited by tc tbf both ways, the leader on the bridge; `loopback`: the same 4 agents on
127.0.0.1) a fresh cluster (leader and agents as real processes, an empty history) runs
one job file with `[compression] method = "auto"` first — exploration included, the clock
from its submit — and then the same file with each method the planner chooses among named
(`none`, `fp16`, `dgc` at 1 % and 0.1 %, each with its recipe's defaults: what the
auto job runs when it chooses it). Then the auto job again, on the history the runs left
(warm). Each job: time from submit to the first evaluation at or above the target, final
accuracy, what the auto job chose and its exploration time. A job still short of the
target after --cap seconds is cancelled and counted as not reaching it.

The job: mlp-large on Fashion-MNIST as in the comparison (docs/benchmarks/comparison.md):
4 workers, batch 64 each, 30,000 training and 5,000 test images, 4 epochs, lr 0.025 (an
effective step of 0.1: at the comparison's 0.05 for DGC dense ASGD diverged), momentum 0.9, weight decay 5e-4, cosine with
a 0.3-epoch warm-up, ps_shards "auto" (a shard beside each worker), target 0.85.

Usage (as root, after scripts/setup): bench/planner_compression.py [--links ...] [--cap S]
Writes bench/results/planner-compression.json (with its provenance).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compression_bench import BIN, Cluster, Links  # noqa: E402
import provenance  # noqa: E402

ROOT = os.path.dirname(HERE)
DATA = "/usr/share/datasets/fashion-mnist"
FIXED = {"none": ['method = "none"'], "fp16": ['method = "fp16"'],
         "dgc 1%": ['method = "dgc"', "ratio = 0.01"], "dgc 0.1%": ['method = "dgc"', "ratio = 0.001"]}
RATES = {"100mbit": "100mbit", "1gbit": "1gbit", "loopback": None}


def job_file(path, name, compression, args):
    lines = [f'name = "{name}"', 'model = "mlp-large"', 'dataset = "fashion-mnist"', f'data_dir = "{DATA}"',
             f"epochs = {args.epochs}", "workers = 4", "batch_size = 64", "threads_per_task = 1",
             f"train_samples = {args.train_samples}", "test_samples = 5000", f"seed = {args.seed}", "",
             "[optimizer]", f"lr = {args.lr}", "momentum = 0.9", "weight_decay = 5e-4", 'lr_schedule = "cosine"',
             "warmup_epochs = 0.3", "", "[compression]", *compression]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run_job(cluster, path, args):
    """Submits `path`, follows it; seconds to the target, final accuracy, plan events."""
    t0 = time.time()
    p = subprocess.Popen([os.path.join(BIN, "dltrain"), "--leader", cluster.url, "--token", cluster.token, "submit",
                          path, "--follow", "--json"], stdout=subprocess.PIPE, text=True)
    job, reached, curve, plans, summary, explored = None, None, [], [], None, 0.0
    deadline = t0 + args.cap
    try:
        for line in p.stdout:
            ev = json.loads(line)
            t = time.time() - t0
            kind = ev.get("event")
            if kind == "submitted":
                job = ev["job"]
            elif kind == "plan":
                plans.append({"seconds": t, "choice": ev["plan"].get("choice"), "explanation": ev["plan"].get("explanation"),
                              "explore": ev["plan"].get("explore"), "link_bytes_per_sec": ev["plan"].get("link_bytes_per_sec")})
            elif kind == "state" and ev.get("state") == "queued" and plans:
                explored = t
            elif kind == "epoch_end" and "test_accuracy" in ev:
                curve.append({"epoch": ev["epoch"], "seconds": t, "test_accuracy": ev["test_accuracy"]})
                if reached is None and ev["test_accuracy"] >= args.target:
                    reached = t
            elif kind == "summary":
                summary = ev
            if time.time() > deadline and reached is None and job:
                cluster.client("cancel", job, check=False)
                deadline = float("inf")
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            if job:
                cluster.client("cancel", job, check=False)
            p.kill()
    return {"job": job, "seconds_to_target": reached, "wall_seconds": time.time() - t0, "curve": curve,
            "final_accuracy": summary.get("test_accuracy") if summary else None,
            "state": summary.get("state") if summary else None, "plans": plans,
            "seconds_until_queued": explored or None}


def one_link(link, args, workdir):
    rate = RATES[link]
    links = Links(4, rate) if rate else None
    out = {"link": link, "runs": {}}
    ctx = links if links else None
    try:
        if ctx:
            ctx.__enter__()
        with Cluster(4, links, cores=2) as cluster:
            # The plan counts on the agents' measured links: wait for every probe (bounded).
            deadline = time.time() + 60
            while True:
                agents = json.loads(cluster.client("agents", "--json").stdout)["agents"]
                if all(a.get("link_bytes_per_sec", 0) > 0 for a in agents) or time.time() > deadline:
                    break
                time.sleep(0.3)
            out["agents_link_mbit"] = [round(a.get("link_bytes_per_sec", 0) * 8 / 1e6) for a in agents]
            order = ["auto"] + list(FIXED) + ["auto (warm)"]
            for name in order:
                compression = ['method = "auto"'] if name.startswith("auto") else FIXED[name]
                path = job_file(os.path.join(workdir, f"{link}-{name.replace(' ', '-')}.toml"), f"pc-{link}-{name}",
                                compression, args)
                r = run_job(cluster, path, args)
                out["runs"][name] = r
                chosen = r["plans"][-1]["choice"]["compression"] if r["plans"] and r["plans"][-1].get("choice") else "-"
                print(f"{link:9s} {name:12s} to {args.target}: {r['seconds_to_target']}  final {r['final_accuracy']}  "
                      f"{'chose ' + chosen if name.startswith('auto') else ''}", flush=True)
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    fixed = {k: v["seconds_to_target"] for k, v in out["runs"].items() if k in FIXED and v["seconds_to_target"]}
    if fixed:
        best = min(fixed, key=fixed.get)
        out["best_fixed"] = {"method": best, "seconds_to_target": fixed[best]}
        for k in ("auto", "auto (warm)"):
            s = out["runs"][k]["seconds_to_target"]
            out[k + " / best fixed"] = s / fixed[best] if s else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--links", default="100mbit,1gbit,loopback")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--train-samples", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=0.025,
                    help="every job's lr (default 0.025: an effective step of 0.1 at 4 workers, where dense "
                         "ASGD trains; at 0.05 it diverged here)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--cap", type=float, default=120, help="seconds before a job short of the target is cancelled")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "planner-compression.json"))
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="dltrain-plan-comp-")
    # The output path as the repository names it: a result file names no machine's paths.
    settings = dict(vars(args), out=os.path.relpath(args.out, ROOT))
    results = {"provenance": provenance.record(sys.argv), "settings": settings, "links": []}
    for link in args.links.split(","):
        results["links"].append(one_link(link, args, workdir))
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    for r in results["links"]:
        print(r["link"], "best fixed", r.get("best_fixed"), "auto/best", r.get("auto / best fixed"),
              "warm/best", r.get("auto (warm) / best fixed"))


if __name__ == "__main__":
    main()
