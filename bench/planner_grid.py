#!/usr/bin/env python3
"""Runs a real grid of Fashion-MNIST jobs through a dltrain standalone-style cluster
(one agent per task, 1 core each, loopback) and saves every measurement as a fixture for
bench/planner_bench: workers 1-4 x batch sizes 16-256, two seeds each.

Usage: bench/planner_grid.py [--out bench/results/planner_grid.json] [--seeds 1,2]
Standard library only; a benchmark driver, not part of dltrain.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compression_bench import BIN, Cluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                   "planner_grid.json"))
    ap.add_argument("--workers", default="1,2,3,4")
    ap.add_argument("--batches", default="16,32,64,128,256")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=12000)
    ap.add_argument("--test-samples", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=0.03)
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    runs = []
    with Cluster(max(workers) + 1) as cluster:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for w in workers:
                for b in [int(x) for x in args.batches.split(",")]:
                    path = os.path.join(cluster.dir, f"g-{w}-{b}-{seed}.toml")
                    # One learning rate for the whole grid: asynchronous SGD with 4 workers
                    # diverges at the larger rates a linear scaling rule would give.
                    lr = args.lr
                    with open(path, "w") as f:
                        f.write(f'name = "grid {w}x{b} s{seed}"\nmodel = "{args.model}"\nepochs = {args.epochs}\n'
                                f"workers = {w}\nps_shards = 1\nbatch_size = {b}\nseed = {seed}\n"
                                f"train_samples = {args.train_samples}\ntest_samples = {args.test_samples}\n"
                                f"[optimizer]\nlr = {lr}\nwarmup_epochs = 0.3\n")
                    r = cluster.client("submit", path, "--follow", "--json", timeout=1800, check=False)
                    events = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
                    summary = events[-1] if events else {}
                    epochs = [e for e in events if e.get("event") == "epoch_end"]
                    run = {"workers": w, "batch_size": b, "seed": seed, "lr": lr,
                           "state": summary.get("state"), "final_accuracy": summary.get("test_accuracy"),
                           "wall_seconds": summary.get("wall_seconds"),
                           "epoch_rows": [{"task": e["task"], "epoch": e["epoch"],
                                           "epoch_seconds": e["epoch_seconds"],
                                           "images_per_sec": e["images_per_sec"]} for e in epochs]}
                    runs.append(run)
                    print(f"{w}x{b} seed {seed}: {run['state']} accuracy {run['final_accuracy']} "
                          f"{run['wall_seconds']:.1f} s", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "dataset": "fashion-mnist", "epochs": args.epochs,
                   "train_samples": args.train_samples, "test_samples": args.test_samples,
                   "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "runs": runs}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
