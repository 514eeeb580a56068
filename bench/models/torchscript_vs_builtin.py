#!/usr/bin/env python3
"""The main job's CNN as a user's TorchScript model against the built-in C++ CNN.

The same network (python/dltrain/networks.py's SmallCnn, the C++ SmallCnn's twin), scripted
with Debian's python3-torch, trains the main job (configs/jobs/fashion-mnist.toml: 2
workers, 1 PS shard, 8 epochs of 60,000 images, asynchronous) beside the built-in model,
on one standalone cluster (3 agents of 1 core, as the quick start), one job at a time,
for each seed. Reported per run: the final test accuracy, the training throughput (the
workers' images/s summed, averaged over the epochs) and the wall time; per seed the
images/s ratio TorchScript / built-in and the accuracy difference. Goals (issue "Bring
your own model"): ratio >= 0.95, accuracy within 0.5 point.

Usage: bench/models/torchscript_vs_builtin.py [--seeds 1 2 3] [--epochs 8]
           [--out bench/results/torchscript-vs-builtin.json]
Needs the build (scripts/setup) and /usr/bin/python3 with torch (scripts/setup --bench).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from standalone import ROOT, run_job, start_cluster  # noqa: E402

MAKE = r'''
import sys, torch
sys.path.insert(0, sys.argv[3])
from dltrain import networks as dltrain_models
torch.manual_seed(int(sys.argv[2]))
torch.jit.save(torch.jit.script(dltrain_models.SmallCnn(1, 10, 28)), sys.argv[1])
'''


def job_file(directory, seed, epochs, model_file):
    with open(os.path.join(ROOT, "configs", "jobs", "fashion-mnist.toml")) as f:
        text = f.read()
    text = text.replace("seed = 1", "seed = %d" % seed).replace("epochs = 8", "epochs = %d" % epochs)
    name = "builtin" if model_file is None else "torchscript"
    if model_file is not None:
        text = text.replace('model = "cnn"', 'model = "torchscript"\nmodel_file = "%s"' % model_file)
    path = os.path.join(directory, "%s-%d.toml" % (name, seed))
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "torchscript-vs-builtin.json"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dltrain-torchscript-bench-")
    proc, client, _ = start_cluster(work, 3, ["--cores-per-agent", "1"])
    rows = []
    try:
        for seed in a.seeds:
            model = os.path.join(work, "cnn-%d.pt" % seed)
            subprocess.run(["/usr/bin/python3", "-c", MAKE, model, str(seed), os.path.join(ROOT, "python")], check=True)
            builtin = run_job(client, job_file(work, seed, a.epochs, None))
            scripted = run_job(client, job_file(work, seed, a.epochs, model))
            row = {"seed": seed, "builtin": builtin, "torchscript": scripted,
                   "images_per_sec_ratio": scripted["images_per_sec"] / builtin["images_per_sec"],
                   "accuracy_difference": scripted["test_accuracy"] - builtin["test_accuracy"]}
            rows.append(row)
            print("seed %d: built-in %.4f at %.0f img/s, TorchScript %.4f at %.0f img/s: ratio %.3f, %+.2f points"
                  % (seed, builtin["test_accuracy"], builtin["images_per_sec"], scripted["test_accuracy"],
                     scripted["images_per_sec"], row["images_per_sec_ratio"], 100 * row["accuracy_difference"]),
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result = {"job": "configs/jobs/fashion-mnist.toml", "epochs": a.epochs, "runs": rows,
              "mean_images_per_sec_ratio": statistics.mean(r["images_per_sec_ratio"] for r in rows),
              "mean_builtin_accuracy": statistics.mean(r["builtin"]["test_accuracy"] for r in rows),
              "mean_torchscript_accuracy": statistics.mean(r["torchscript"]["test_accuracy"] for r in rows)}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("mean: ratio %.3f; accuracy built-in %.4f, TorchScript %.4f -> %s"
          % (result["mean_images_per_sec_ratio"], result["mean_builtin_accuracy"],
             result["mean_torchscript_accuracy"], os.path.relpath(a.out, ROOT)))


if __name__ == "__main__":
    main()
