#!/usr/bin/python3
"""How many training images dltrain's re-estimation of BatchNorm's statistics needs.

Before every evaluation dltrain's worker 0 resets the BatchNorm running statistics and
re-estimates them for the evaluated parameters over the first training images of its
shard (lib/train/worker_end.cpp, recalibrate_batchnorm: Izmailov et al. 2018, "SWA",
§3.2, bn_update). Each of those forward passes costs what evaluating a test image does,
and in sync mode the other workers wait for rank 0's evaluation, so the sample size is
time-to-accuracy.

This trains `resnet20` (python/dltrain/networks.py, dltrain's module) on Fashion-MNIST in
one process with the summed step of 4 workers of batch 64 (batch 256, lr 0.1, momentum
0.9, weight decay 5e-4, linear warm-up over 0.3 epoch) and, at four points of its first
epoch, measures the test accuracy with the running statistics training kept (PyTorch's
default, momentum 0.1) and with the statistics re-estimated over 500, 1,000, 2,000 and
5,000 training images (batches of 250, as dltrain). Writes bn-recalibration.json with
the commit, date, CPU model and command.

Usage: bench/bn_recalibration.py [--out DIR] [--threads N]   (Debian's python3-torch)
"""
import argparse
import copy
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(HERE, "e2e"))
sys.path.insert(0, HERE)
from standalone import commit, machine  # noqa: E402

SAMPLES = (500, 1000, 2000, 5000)
DATA = "/usr/share/datasets/fashion-mnist"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ModuleNotFoundError as e:
        sys.exit(f"bn_recalibration.py: {e}: install Debian's python3-torch (scripts/setup --bench)")
    from dltrain import networks as dltrain_models
    from torch_ref import read_idx

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def load(prefix, n):
        x = read_idx(os.path.join(DATA, f"{prefix}-images-idx3-ubyte.gz"), n)
        y = read_idx(os.path.join(DATA, f"{prefix}-labels-idx1-ubyte.gz"), n)
        return (((x.float() / 255) - 0.2860) / 0.3530).unsqueeze(1).contiguous(), y.long()

    xt, yt = load("train", 30000)
    xv, yv = load("t10k", 5000)
    model = dltrain_models.build({"model": "resnet20", "channels": 1, "classes": 10, "image_size": 28})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def accuracy(net):
        net.eval()
        correct = 0
        with torch.no_grad():
            for lo in range(0, len(xv), 128):
                correct += (net(xv[lo:lo + 128]).argmax(1) == yv[lo:lo + 128]).sum().item()
        net.train()
        return correct / len(xv)

    def recalibrated(images):
        net = copy.deepcopy(model)
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None
        with torch.no_grad():
            for lo in range(0, images, 250):
                net(xt[lo:lo + 250])
        return accuracy(net)

    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
            "command": "bench/bn_recalibration.py" + "".join(f" {a}" for a in sys.argv[1:]),
            "torch": torch.__version__, "model": "resnet20", "train_images": len(xt), "test_images": len(xv),
            "batch": 256, "lr": 0.1, "seed": args.seed}
    gen = torch.Generator().manual_seed(args.seed + 1)
    perm = torch.randperm(len(xt), generator=gen)
    bs = 256
    steps = len(xt) // bs
    rows = []
    for s in range(steps):
        idx = perm[s * bs:(s + 1) * bs]
        for g in sgd.param_groups:
            g["lr"] = 0.1 * min(1.0, 0.1 + 0.9 * s / (0.3 * steps))
        sgd.zero_grad()
        F.cross_entropy(model(xt[idx]), yt[idx]).backward()
        sgd.step()
        if s + 1 in (steps // 4, steps // 2, 3 * steps // 4, steps):
            row = {"step": s + 1, "running": accuracy(model), **{str(n): recalibrated(n) for n in SAMPLES}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bn-recalibration.json"), "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
