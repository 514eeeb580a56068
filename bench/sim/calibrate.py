#!/usr/bin/python3
"""Measured epoch times of real dltrain and PyTorch DDP runs, the scale model's truth.

Runs, for each link (loopback; emulated 1 Gbit/s and 100 Mbit/s links: every process on
its own network namespace joined to a bridge by a veth pair rate-limited with tc tbf in
both directions, as bench/e2e/run.py does), each worker count N (default 1, 2, 4) and
each system:
  dltrain-dense   dltrain, dense ASGD, N workers + 1 PS shard
  dltrain-dgc-1%  dltrain, DGC at 1 % up and 1 % down (sparse bidirectional)
  dltrain-dense-bsp, dltrain-dense-ssp2   dense, sync = "sync" (BSP) and sync = "ssp" with
                  staleness 2 (only when --systems names them)
  ddp             PyTorch DistributedDataParallel (gloo ring all-reduce), N ranks
a short job (the mlp-large model on Fashion-MNIST, batch 64 per worker, one thread per
process, 2 epochs of a training subset) and records every worker's epoch times (the
trainers' own `epoch_seconds`, which exclude the test evaluation), the dltrain workers'
step counters (compute, compress and exchange seconds) and the bytes per step.

The namespaces (sim-h0.., bridge simbr0, 10.78.0.0/24) are created here and removed
afterwards, also on error or Ctrl-C.

Usage (as root, after `scripts/setup --bench`, which adds Debian's python3-torch):
  bench/sim/calibrate.py [--links loopback,1gbit,100mbit] [--workers 1,2,4]
                         [--systems dltrain-dense,dltrain-dgc-1%,ddp] [--train-samples N]
Writes bench/results/sim-calibration.json.
"""
import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
from compression_bench import BIN, Cluster as BenchCluster, Links as BenchLinks, free_port  # noqa: E402
from run import PYTHON, run_local  # noqa: E402  (bench/e2e/run.py)

SUBNET = "10.78.0"
BRIDGE = "simbr0"
PREFIX = "sim"
RATES = {"1gbit": "1gbit", "100mbit": "100mbit"}
DGC = {"dltrain-dgc-1%": 0.01}
# The consistency models other than ASGD (docs/training.md), dense: run when --systems
# names them.
SYNC = {"dltrain-dense-bsp": 'sync = "sync"', "dltrain-dense-ssp2": 'sync = "ssp"\nstaleness = 2'}
SYSTEMS = ["dltrain-dense", *DGC, "ddp"]
ALL_SYSTEMS = SYSTEMS + list(SYNC)


def Links(hosts, rate):
    """bench/compression_bench.py's links under other names (sim-h0.., bridge simbr0), so
    that both benchmarks can run on one machine."""
    return BenchLinks(hosts, rate, prefix=PREFIX, subnet=SUBNET, bridge=BRIDGE)


def Cluster(hosts, links=None):
    """bench/compression_bench.py's cluster: a leader and one agent (cores = 1) per host."""
    return BenchCluster(hosts, links, prefix="dltrain-sim-")


def job_toml(path, system, workers, args):
    lines = [f'name = "sim-{system}-{workers}"', f'model = "{args.model}"', 'dataset = "fashion-mnist"',
             f"epochs = {args.epochs}", f"workers = {workers}", "ps_shards = 1", f"batch_size = {args.batch}",
             "threads_per_task = 1", f"train_samples = {args.train_samples}", f"test_samples = {args.test_samples}",
             "seed = 1", *([SYNC[system]] if system in SYNC else []), "",
             "[optimizer]", "lr = 0.05", "momentum = 0.9", "weight_decay = 5e-4",
             'lr_schedule = "cosine"', "warmup_epochs = 0.3", ""]
    if system in DGC:
        # The density warm-up ends with the first epoch: the last epoch runs at the ratio.
        lines += ["[compression]", 'method = "dgc"', f"ratio = {DGC[system]}", f"downlink_ratio = {DGC[system]}",
                  "warmup_epochs = 1.0"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run_dltrain(cluster, system, job, workers, cap):
    p = subprocess.Popen([os.path.join(BIN, "dltrain"), "--leader", cluster.url, "--token", cluster.token, "submit",
                          job, "--follow", "--json"], stdout=subprocess.PIPE, text=True)
    epochs, done, summary, job_id = {}, {}, None, None
    timer = threading.Timer(cap, lambda: job_id and cluster.client("cancel", job_id, check=False))
    timer.daemon = True
    timer.start()
    try:
        for line in p.stdout:
            ev = json.loads(line)
            kind = ev.get("event")
            if kind == "submitted":
                job_id = ev["job"]
            elif kind == "epoch_end":
                epochs.setdefault(ev.get("rank", 0), {})[str(ev["epoch"])] = ev["epoch_seconds"]
            elif kind == "done":
                done[ev.get("rank", 0)] = {k: ev.get(k) for k in ("steps", "wall_seconds", "bytes_pushed",
                                                                   "bytes_pulled", "counters")}
            elif kind == "summary":
                summary = ev
        p.wait(timeout=120)
    finally:
        timer.cancel()
        if p.poll() is None:
            if job_id:
                cluster.client("cancel", job_id, check=False)
            p.kill()
    if summary is None or summary.get("state") != "succeeded":
        raise RuntimeError(f"{system} with {workers} workers: {summary}")
    return {"epoch_seconds": {str(r): v for r, v in sorted(epochs.items())},
            "done": {str(r): v for r, v in sorted(done.items())}}


def run_ddp(system, job, workers, links, workdir, cap):
    master = f"{links.address(0)}:29517" if links else f"127.0.0.1:{free_port('127.0.0.1')}"
    cmds = [[PYTHON, os.path.join(ROOT, "bench", "e2e", "torch_ref.py"), job, "--rank", str(r), "--world",
             str(workers), "--master", master] for r in range(workers)]
    hosts = [links.netns(r) for r in range(workers)] if links else None
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0" if hosts else "lo")
    _, events, usage, capped, _ = run_local(cmds, hosts, cap, os.path.join(workdir, f"ddp-{workers}"), env)
    if capped or any(u["exit_status"] != 0 for u in usage):
        raise RuntimeError(f"ddp with {workers} ranks: exit {[u['exit_status'] for u in usage]}, capped {capped}")
    out = {"epoch_seconds": {}, "steps_per_epoch": None, "parameters": None}
    for r, evs in enumerate(events):
        out["epoch_seconds"][str(r)] = {str(e["epoch"]): e["epoch_seconds"] for e in evs if e.get("event") == "epoch_end"}
        st = next((e for e in evs if e.get("event") == "started"), {})
        if r == 0:
            out["steps_per_epoch"], out["parameters"] = st.get("steps_per_epoch"), st.get("parameters")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", default="loopback,1gbit,100mbit")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=("comma list of " + ",".join(ALL_SYSTEMS) + " (default: " + ",".join(SYSTEMS) + ")").replace("%", "%%"))
    ap.add_argument("--model", default="mlp-large")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--train-samples", type=int, default=3840)
    ap.add_argument("--test-samples", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cap-seconds", type=int, default=300, help="stop any run after this long")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sim-calibration.json"))
    ap.add_argument("--merge", action="store_true", help="keep the runs of --out this run does not repeat")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        sys.exit("calibrate: needs root for the emulated links (ip netns, tc)")
    for exe in ("dltrain", "dltrain-agent", "dltrain-worker", "dltrain-ps"):
        if not os.access(os.path.join(BIN, exe), os.X_OK):
            sys.exit(f"calibrate: {BIN}/{exe} is missing; run scripts/setup first")
    systems = args.systems.split(",")
    for system in systems:
        if system not in ALL_SYSTEMS:
            sys.exit(f"calibrate: --systems: unknown system \"{system}\" (expected {', '.join(ALL_SYSTEMS)})")
    if "ddp" in systems and subprocess.run([PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                                           capture_output=True).returncode != 0:
        sys.exit("calibrate: PyTorch with gloo is missing; scripts/setup --bench installs python3-torch")
    workers = [int(x) for x in args.workers.split(",")]
    runs = []
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)["runs"]
    workdir = tempfile.mkdtemp(prefix="dltrain-sim-logs-")
    started = time.time()
    hosts = max(workers) + 1
    for link in args.links.split(","):
        if link != "loopback" and link not in RATES:
            sys.exit(f"calibrate: --links: unknown link \"{link}\" (expected loopback, 1gbit or 100mbit)")
        links = Links(hosts, RATES[link]) if link in RATES else None
        try:
            if links:
                links.__enter__()
            with Cluster(hosts, links) as cluster:
                for n in workers:
                    for system in systems:
                        job = job_toml(os.path.join(workdir, f"{system}-{link}-{n}.toml"), system, n, args)
                        t0 = time.time()
                        if system == "ddp":
                            r = run_ddp(system, job, n, links, workdir, args.cap_seconds)
                        else:
                            r = run_dltrain(cluster, system, job, n, args.cap_seconds)
                        r.update(system=system, link=link, workers=n, model=args.model, batch=args.batch,
                                 train_samples=args.train_samples, epochs=args.epochs,
                                 run_seconds=round(time.time() - t0, 1))
                        runs = [x for x in runs if (x["system"], x["link"], x["workers"]) != (system, link, n)]
                        runs.append(r)
                        last = {k: v.get(str(args.epochs)) if isinstance(v, dict) else v
                                for k, v in r["epoch_seconds"].items()}
                        print(f"[{link}] {system} N={n}: last-epoch seconds per rank {last} "
                              f"[{time.time() - started:.0f} s elapsed]", flush=True)
                        with open(args.out, "w") as f:
                            json.dump({"meta": meta(args), "runs": runs}, f, indent=1)
        finally:
            if links:
                links.__exit__(None, None, None)
    print(f"calibrate: wrote {args.out} ({time.time() - started:.0f} s)")


def meta(args):
    return {"date": datetime.date.today().isoformat(), "command": " ".join(["bench/sim/calibrate.py"] + sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
            "model": args.model, "batch": args.batch, "train_samples": args.train_samples,
            "test_samples": args.test_samples, "epochs": args.epochs}


if __name__ == "__main__":
    main()
