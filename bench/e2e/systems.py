"""The systems, models and links of the end-to-end comparison (bench/e2e/run.py, compare.py):
which run by default, and how long a run may take."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PYTHON = "/usr/bin/python3"  # Debian's interpreter, which has python3-torch
DGC = {"dltrain-dgc-10%": 0.1, "dltrain-dgc-1%": 0.01, "dltrain-dgc-0.1%": 0.001,
       "dltrain-dgc-1%-bsp": 0.01, "dltrain-dgc-0.1%-bsp": 0.001}
# Run only when named in --systems: DGC under `sync = "sync"` (BSP through the PS,
# docs/training.md), the consistency model that trains best with a sparse uplink.
BSP = {"dltrain-dgc-1%-bsp", "dltrain-dgc-0.1%-bsp", "dltrain-dense-bsp", "dltrain-powersgd-r4-bsp", "dltrain-fp16-bsp"}
# dltrain's binary16 pushes (method = "fp16"; pulls dense fp32): run only when named.
FP16 = {"dltrain-fp16", "dltrain-fp16-bsp"}
# DDP with PyTorch's own gradient compression (torch_ref.py --comm-hook), and dltrain's
# low-rank method (compress/lowrank.h) at rank r: run only when named in --systems
# (bench/e2e/compare.py runs them with each system's learning rate tuned).
DDP = {"ddp": [], "ddp-fp16": ["--comm-hook", "fp16"],
       "ddp-powersgd-r1": ["--comm-hook", "powersgd", "--powersgd-rank", "1"],
       "ddp-powersgd-r4": ["--comm-hook", "powersgd", "--powersgd-rank", "4"]}
POWERSGD = {"dltrain-powersgd-r1": 1, "dltrain-powersgd-r4": 4, "dltrain-powersgd-r4-bsp": 4}
SYSTEMS = ["plain", "torch", *DDP, "dltrain-1w", "dltrain-dense", "dltrain-dense-bsp", *DGC, *POWERSGD, *FP16]
DEFAULT_SYSTEMS = ["plain", "torch", "ddp", "dltrain-1w", "dltrain-dense", *(s for s in DGC if s not in BSP)]
SINGLE = {"plain", "torch"}  # one process, no network: run once per model and seed
RATES = {"1gbit": "1gbit", "100mbit": "100mbit"}

# Per model: job settings and the target test accuracy the issue sets.
MODELS = {
    "cnn": {"target": 0.90, "lr": 0.05},
    "mlp-large": {"target": 0.87, "lr": 0.05},
    "resnet20": {"target": 0.87, "lr": 0.05},
}


def in_default(model, link, system):
    """The default size's subset (about 20 min on 2 cores), chosen for the figures the
    goals are judged by: the CNN on loopback in every system but dense ASGD and the
    10 %/1 % DGC ratios (with the 1-worker run: the framework overhead); the MLP in the
    plain loop (the accuracy reference) and, on the emulated 100 Mbit/s links, DDP, dense
    ASGD and DGC at 1 % and 0.1 %. The BSP systems run wherever --systems names them."""
    if system in BSP:
        return True
    if model == "cnn":
        return link in ("none", "loopback") and system not in ("dltrain-dense", "dltrain-dgc-10%", "dltrain-dgc-1%")
    if link in ("none", "loopback"):
        return system == "plain"
    return system in ("ddp", "dltrain-dense", "dltrain-dgc-1%", "dltrain-dgc-0.1%")


def default_cap(results, model, link, system, peer_cap, cap):
    """In the default size, DDP and dense ASGD on an emulated link stop once they have run
    3.2× as long as the slowest DGC run of this model and link so far took to the highest
    threshold those runs reached (the model's target, else 0.85; at least 60 s, at most
    `cap`). Whether they reach the threshold by then or not, the run decides the "≥ 3×
    sooner" goals there: a measured ratio, or a lower bound past 3 (the margin above 3
    covers DGC seeds that run after it and are up to 6 % slower). A capped peer has no
    final accuracy to compare: `--peers-to-the-end` runs them to their last epoch for that.
    `peer_cap` is used only when no DGC run reached 0.85 (or none ran before them). Every
    other run stops at `cap`."""
    factor = {"ddp": 3.2, "dltrain-dense": 3.2}.get(system)
    if factor is None:
        return cap
    ran = [r for r in results if r["model"] == model and r["link"] == link and r["system"] in DGC]
    for key in ("seconds_to_target", "seconds_to_0.85"):
        t = [r[key] for r in ran if r.get(key)]
        if t:
            return int(min(cap, max(60, factor * max(t))))
    return peer_cap
