#!/usr/bin/python3
"""PyTorch references for the end-to-end benchmark: a single process, or one rank of
DistributedDataParallel with the gloo backend.

Reads the same job file as `dltrain submit` and trains the same model on the same data
with the same normalisation, per-worker batch size, learning-rate schedule (linear
warm-up from lr/10, then cosine/step/constant), momentum SGD and weight decay, with
`threads_per_task` intra-op threads. In DDP mode rank r trains on training images
r, r+N, r+2N, ... (dltrain's worker sharding) and gradients are averaged across ranks
every step (synchronous SGD); rank 0 evaluates after every epoch, after re-estimating the
BatchNorm statistics on `--bn-recalibration` of its training images as a dltrain worker
does (torch.optim.swa_utils.update_bn's procedure; 0: the running statistics training
kept, PyTorch's default). `--comm-hook` gives DDP
PyTorch's own gradient compression (torch.distributed.algorithms.ddp_comm_hooks):
`fp16` (fp16_compress_hook: the all-reduce in binary16) or `powersgd` (powerSGD_hook,
Vogels et al. 2019: rank `--powersgd-rank` with error feedback and warm start, after
`--powersgd-start-iter` dense iterations; 2 is the least PyTorch accepts).

Usage:
  torch_ref.py JOB.toml                                  # single process
  torch_ref.py JOB.toml --rank R --world N --master ADDR:PORT   # one DDP rank
  torch_ref.py JOB.toml --rank R --world N --master ADDR:PORT --comm-hook powersgd --powersgd-rank 4
Prints one JSON object per line ("started", "epoch_end", "done"), like bench/e2e/plain_loop.
Needs Debian's python3-torch; it is a benchmark peer, not part of dltrain.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time
import tomllib


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default=None, help="ADDR:PORT of rank 0's rendezvous (DDP)")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--comm-hook", choices=["none", "fp16", "powersgd"], default="none",
                    help="DDP's gradient communication: plain fp32 all-reduce, fp16_compress_hook or powerSGD_hook")
    ap.add_argument("--bn-recalibration", type=int, default=1000, metavar="IMAGES",
                    help="before each evaluation, re-estimate BatchNorm's statistics on this many training images in "
                         "batches of 250, as dltrain's worker 0 does (default 1000; 0: the running statistics)")
    ap.add_argument("--powersgd-rank", type=int, default=4, help="powerSGD_hook's matrix_approximation_rank")
    ap.add_argument("--powersgd-start-iter", type=int, default=2,
                    help="powerSGD_hook's start_powerSGD_iter: dense all-reduces before it (at least 2)")
    return ap.parse_args()


if __name__ == "__main__":
    # Before torch is imported, so that --help works where python3-torch is missing.
    ARGS = parse_args()

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
except ModuleNotFoundError as e:
    sys.exit(f"torch_ref.py: {e}: install Debian's python3-torch (scripts/setup --bench) and run it "
             "with /usr/bin/python3")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
from dltrain import networks as dltrain_models  # noqa: E402  (dltrain's networks in PyTorch)

MEAN_STD = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}


def read_idx(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    t = torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)
    return t[:limit] if limit else t


def load(job, split):
    prefix = "train" if split == "train" else "t10k"
    limit = job.get("train_samples" if split == "train" else "test_samples", 0)
    d = job.get("data_dir", "/usr/share/datasets/fashion-mnist")
    x = read_idx(os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"), limit)
    y = read_idx(os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz"), limit)
    mean, std = MEAN_STD[job.get("dataset", "fashion-mnist")]
    x = ((x.float() / 255.0) - mean) / std
    return x.unsqueeze(1).contiguous(), y.long()


def make_model(name):
    """dltrain's built-in network `name` (cnn, mlp, mlp-large, resnet20) on 28x28 gray
    images, as python/dltrain/networks.py defines it: the same modules dltrain trains."""
    return dltrain_models.build({"model": name, "channels": 1, "classes": 10, "image_size": 28})


def learning_rate(opt, pos, epochs):
    """dltrain::train::learning_rate (lib/train/trainer.h)."""
    lr, warm, sched = opt.get("lr", 0.05), opt.get("warmup_epochs", 0.5), opt.get("lr_schedule", "cosine")
    if warm > 0 and pos < warm:
        return lr * (0.1 + 0.9 * pos / warm)
    if sched == "cosine":
        span = epochs - warm
        t = min(max((pos - warm) / span, 0.0), 1.0) if span > 0 else 1.0
        return lr * 0.5 * (1.0 + math.cos(math.pi * t))
    if sched == "step":
        f = pos / epochs
        return lr * (0.01 if f >= 0.75 else 0.1 if f >= 0.5 else 1.0)
    return lr


def evaluate(model, x, y, batch):
    """Test accuracy in batches of `batch` images: the job's eval_batch_size (dltrain's
    default 128), so that the peer's evaluation is not slower than dltrain's for the batch
    alone (batches of 1,000 made the evaluation on rank 0 7x slower on the CNN and 14x on
    resnet20: bench/e2e/eval_batch.py)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for lo in range(0, len(x), batch):
            correct += (model(x[lo:lo + batch]).argmax(1) == y[lo:lo + batch]).sum().item()
    model.train()
    return correct / len(x)


def recalibrate_batchnorm(model, x, images):
    """dltrain's re-estimation of BatchNorm's statistics before an evaluation
    (lib/train/worker_end.cpp, recalibrate_batchnorm; Izmailov et al. 2018, §3.2):
    reset, then a cumulative average over the first `images` of `x` in batches of 250 in
    train mode. Runs on the bare module, never through DDP (whose forward would start a
    collective on rank 0 alone)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns or images <= 0:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    with torch.no_grad():
        for lo in range(0, min(images, len(x)), 250):
            model(x[lo:min(lo + 250, images)])
    for m in bns:
        m.momentum = 0.1


def emit(**ev):
    print(json.dumps(ev), flush=True)


def main(args):
    with open(args.job, "rb") as f:
        job = tomllib.load(f)
    opt = job.get("optimizer", {})
    epochs, bs, seed = job.get("epochs", 6), job.get("batch_size", 64), job.get("seed", 1)
    torch.set_num_threads(job.get("threads_per_task", 1))
    t0 = time.time()
    ddp = args.master is not None
    if ddp:
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                                world_size=args.world, timeout=__import__("datetime").timedelta(seconds=300))
    x, y = load(job, "train")
    idx = torch.arange(args.rank, len(x), args.world)
    x, y = x[idx].contiguous(), y[idx].contiguous()
    if args.rank == 0:
        tx, ty = load(job, "test")
    torch.manual_seed(seed)
    model = make_model(job.get("model", "cnn"))
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    if ddp and args.comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif ddp and args.comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=args.powersgd_start_iter, random_seed=seed)
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    sgd = torch.optim.SGD(net.parameters(), lr=opt.get("lr", 0.05), momentum=opt.get("momentum", 0.9),
                          weight_decay=opt.get("weight_decay", 5e-4))
    n = len(x)
    steps = (n + bs - 1) // bs
    emit(event="started", rank=args.rank, train_examples=n, steps_per_epoch=steps,
         parameters=sum(p.numel() for p in model.parameters()), load_seconds=time.time() - t0)
    gen = torch.Generator().manual_seed(seed * 1000003 + args.rank)
    acc, total_steps, stop = -1.0, 0, False
    for epoch in range(epochs):
        te = time.time()
        perm = torch.randperm(n, generator=gen)
        loss_sum = 0.0
        for step in range(steps):
            b = perm[step * bs:(step + 1) * bs]
            for g in sgd.param_groups:
                g["lr"] = learning_rate(opt, epoch + step / steps, epochs)
            sgd.zero_grad()
            loss = F.cross_entropy(net(x[b]), y[b])
            loss.backward()
            sgd.step()
            loss_sum += loss.item()
            total_steps += 1
        epoch_seconds = time.time() - te
        ev = dict(event="epoch_end", rank=args.rank, epoch=epoch + 1, seconds=time.time() - t0,
                  epoch_seconds=epoch_seconds, images_per_sec=n / epoch_seconds, train_loss=loss_sum / steps)
        if args.rank == 0:
            recalibrate_batchnorm(model, x, args.bn_recalibration)
            acc = evaluate(model, tx, ty, job.get("eval_batch_size", 128))
            ev["test_accuracy"] = acc
        if args.max_seconds and time.time() - t0 > args.max_seconds:
            stop = True
        if ddp:
            # Every rank stops at the same epoch: rank 0's decision is broadcast.
            flag = torch.tensor([1 if stop else 0])
            dist.broadcast(flag, 0)
            stop = bool(flag.item())
        emit(**ev)
        if stop:
            break
    emit(event="done", rank=args.rank, test_accuracy=acc if args.rank == 0 else None, steps=total_steps,
         wall_seconds=time.time() - t0)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(ARGS))
