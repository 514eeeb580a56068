#!/usr/bin/python3
"""What the evaluation batch costs the DDP peer: seconds to evaluate 5,000 test-sized
images (28x28, one channel) on one core with PyTorch, in batches of 1,000 (what
bench/e2e/torch_ref.py used until comparison run 10) and of 128 (dltrain's
eval_batch_size, what it uses now), for the comparison's models. The peer's rank 0
evaluates after every epoch while the other ranks wait, so this time is in the peer's
time to the target.

Usage (after `scripts/setup --bench`): bench/e2e/eval_batch.py [--out bench/results]
Writes OUT/eval-batch.json (with commit, date, CPU model and command) and prints a table.
"""
import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
from standalone import commit, machine  # noqa: E402

import torch  # noqa: E402

from dltrain import networks as dltrain_models  # noqa: E402


def seconds(net, x, batch, repeats):
    """Least wall seconds of `repeats` passes over x in batches of `batch`."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            for lo in range(0, len(x), batch):
                net(x[lo:lo + batch]).argmax(1)
            best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--images", type=int, default=5000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
            "command": "bench/e2e/eval_batch.py", "torch": torch.__version__, "threads": 1, "images": args.images}
    rows = []
    for model in ("cnn", "mlp-large", "resnet20"):
        net = dltrain_models.build({"model": model, "channels": 1, "classes": 10, "image_size": 28}).eval()
        x = torch.randn(args.images, 1, 28, 28)
        if model == "mlp-large":
            x = x.view(args.images, -1)
        repeats = 1 if model == "resnet20" else 3
        row = {"model": model, "seconds": {str(b): seconds(net, x, b, repeats) for b in (1000, 128)}}
        row["ratio"] = row["seconds"]["1000"] / row["seconds"]["128"]
        rows.append(row)
        print(f"{model}: {row['seconds']['1000']:.2f} s in batches of 1,000, {row['seconds']['128']:.2f} s of 128 "
              f"({row['ratio']:.1f}x)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "eval-batch.json"), "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
