#!/usr/bin/python3
"""dltrain side by side with the tools users would pick instead, in one run.

Systems, on the same model, Fashion-MNIST data, seed, per-worker batch size,
learning-rate schedule, epochs and threads per process (1):
  plain          the plain single-process LibTorch loop (bench/e2e/plain_loop.cpp)
  torch          PyTorch (Debian's python3-torch), one process (bench/e2e/torch_ref.py)
  ddp            PyTorch DistributedDataParallel, gloo backend, N processes
  dltrain-1w     dltrain, 1 worker + 1 PS shard (through the PS: the framework overhead)
  dltrain-dense  dltrain dense ASGD, N workers + 1 PS shard
  dltrain-dgc-10%, -1%, -0.1%   dltrain with Deep Gradient Compression at those ratios
Links: `loopback` (every process on 127.0.0.1) and emulated `1gbit` / `100mbit` links:
each worker, DDP rank and PS shard on its own network namespace joined to a bridge by
a veth pair rate-limited with tc tbf in both directions. The namespaces are created here
and removed afterwards, also on error or Ctrl-C. Plus a PS data-plane goodput probe
(bench/e2e/ps_goodput.cpp) against a raw TCP stream between the same two endpoints.

Usage (as root, after scripts/setup; Debian packages python3-torch, python3-matplotlib):
  bench/e2e/run.py              default size (one seed; see --help for what it covers)
  bench/e2e/run.py --full       every system on every link, 3 seeds, full training set
Writes bench/results/e2e.json (every figure), bench/results/e2e.md (the tables),
docs/images/e2e_accuracy.png (test accuracy against wall time), and replaces the
end-to-end section of docs/benchmarks/e2e.md (between its e2e markers) with the tables.
"""
import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from compression_bench import BIN, Cluster, Links, free_port  # noqa: E402  (same cluster and links)

sys.path.insert(0, HERE)
from systems import (BSP, DDP, DEFAULT_SYSTEMS, DGC, FP16, MODELS, POWERSGD, PYTHON, RATES, SINGLE,  # noqa: E402,F401
                     SYSTEMS, default_cap, in_default)
from report import mean_sd, mib, plot, ratios, tables, write_outputs  # noqa: E402,F401



def job_toml(path, model, system, seed, size, workers, dgc_warmup=None, min_compress_bytes=0,
             warmup_schedule="per_epoch", lr=None, downlink_ratio=0.01, ps_shards=1, partition_size=None,
             overlap=False):
    """The job file every system of a run reads. `lr`: the job's learning rate (default the
    model's); `downlink_ratio`: the compressed dltrain systems' PS → worker density;
    `ps_shards`: dltrain's PS shards (None: left out, "auto"); `partition_size`: dltrain's
    [ps] partition_size (None: left out, "auto"); `overlap`: dltrain's `overlap = true`
    (pushes during backward)."""
    m = MODELS[model]
    lines = [f'name = "e2e-{model}-{system}-s{seed}"', f'model = "{model}"', 'dataset = "fashion-mnist"',
             f"epochs = {size['epochs'][model]}", f"workers = {workers}", *([f"ps_shards = {ps_shards}"] if ps_shards else []), "batch_size = 64",
             "threads_per_task = 1", f"train_samples = {size['train_samples'][model]}",
             f"test_samples = {size['test_samples']}", f"seed = {seed}",
             *(['sync = "sync"'] if system in BSP else []),
             *(["overlap = true"] if overlap and system.startswith("dltrain") else []), "",
             "[optimizer]", f"lr = {lr if lr is not None else m['lr']}", "momentum = 0.9", "weight_decay = 5e-4", 'lr_schedule = "cosine"',
             "warmup_epochs = 0.3", ""]
    if system in DGC or system in POWERSGD:
        warmup = min(1.0, size["epochs"][model] / 2) if dgc_warmup is None else dgc_warmup
        method = [f'method = "dgc"', f"ratio = {DGC[system]}"] if system in DGC else \
            ['method = "powersgd"', f"rank = {POWERSGD[system]}"]
        # powersgd: its own low-rank downlink ("auto"); DGC: the given top-k density.
        down = '"auto"' if system in POWERSGD else downlink_ratio
        lines += ["[compression]", *method, f"downlink_ratio = {down}",
                  f"warmup_epochs = {warmup}", f'warmup_schedule = "{warmup_schedule}"']
        # Always written: left out, method = "dgc" would take its default (16 KiB).
        lines.append(f"min_compress_bytes = {min_compress_bytes}")
    if system in FP16:
        lines += ["[compression]", 'method = "fp16"']
    if partition_size and system.startswith("dltrain"):
        lines += ["", "[ps]", f"partition_size = {partition_size}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


class ProcWatch:
    """Peak resident memory and CPU seconds of dltrain's task processes (dltrain-worker,
    dltrain-ps), sampled from /proc every 0.2 s while a job runs. CPU seconds can miss
    the last 0.2 s of a process; peak RSS is the kernel's high-water mark (VmHWM)."""

    def __init__(self):
        self.seen = {}
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self):
        # Only task processes of this build that start during the run are counted.
        self.before = {p for p in os.listdir("/proc") if p.isdigit()}
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def run(self):
        while not self.stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid in self.before:
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                    exe = argv[0].decode()
                    kind = os.path.basename(exe)
                    if os.path.dirname(exe) != BIN or kind not in ("dltrain-worker", "dltrain-ps"):
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    cpu = (int(fields[11]) + int(fields[12])) / self.tick
                    rec = self.seen.setdefault(pid, {"process": kind, "peak_rss_bytes": 0, "cpu_seconds": 0.0})
                    rec["peak_rss_bytes"] = max(rec["peak_rss_bytes"], hwm)
                    rec["cpu_seconds"] = max(rec["cpu_seconds"], cpu)
                except (OSError, StopIteration, ValueError, IndexError):
                    continue
            self.stop.wait(0.2)

    def processes(self):
        return sorted(self.seen.values(), key=lambda r: r["process"])


def link_bytes(links):
    """Bytes through each host's link (both directions), from the veth counters."""
    if not links:
        return None
    out = []
    for i in range(links.hosts):
        tot = 0
        for d in ("rx_bytes", "tx_bytes"):
            with open(f"/sys/class/net/dlt-v{i}/statistics/{d}") as f:
                tot += int(f.read())
        out.append(tot)
    return out


def summarize_curve(rec, targets):
    for name, t in targets.items():
        rec[f"seconds_to_{name}"] = next((c["seconds"] for c in rec["curve"] if c["test_accuracy"] >= t), None)


def run_local(cmds, hosts, cap, log_prefix, env=None):
    """Starts one process per command (in its network namespace when `hosts` names
    one), reads their JSON lines, stops them at `cap` seconds. Returns (t0, per-rank
    events with arrival times, rusage per process)."""
    t0 = time.time()
    procs = []
    for i, cmd in enumerate(cmds):
        if hosts:
            cmd = ["ip", "netns", "exec", hosts[i]] + cmd
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{log_prefix}-{i}.log", "w"),
                                      text=True, start_new_session=True, env=env))
    events = [[] for _ in procs]

    def reader(i, p):
        for line in p.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            ev["arrival"] = time.time() - t0
            events[i].append(ev)

    threads = [threading.Thread(target=reader, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    usage, capped, stopped_at = [None] * len(procs), False, None
    deadline = t0 + cap
    pending = set(range(len(procs)))
    try:
        while pending:
            for i in list(pending):
                pid, status, ru = os.wait4(procs[i].pid, os.WNOHANG)
                if pid:
                    usage[i] = {"peak_rss_bytes": ru.ru_maxrss * 1024, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                                "exit_status": os.waitstatus_to_exitcode(status), "before_cap": not capped}
                    procs[i].returncode = usage[i]["exit_status"]
                    pending.discard(i)
            if pending and time.time() > deadline and not capped:
                capped, stopped_at = True, time.time() - t0
                for i in pending:
                    os.killpg(procs[i].pid, signal.SIGTERM)
            time.sleep(0.05)
    finally:
        # On an error or a signal here, no process of the run outlives it.
        for i in pending:
            try:
                os.killpg(procs[i].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for t in threads:
        t.join(timeout=5)
    return t0, events, usage, capped, stopped_at


def run_reference(system, job, model, seed, link, links, args, workdir, cap=None):
    ddp = system in DDP
    n = args.workers if ddp else 1
    if system == "plain":
        cmds = [[os.path.join(BIN, "plain_loop"), job]]
    elif system == "torch":
        cmds = [[PYTHON, os.path.join(HERE, "torch_ref.py"), job]]
    else:
        master = f"{links.address(0)}:29517" if links else f"127.0.0.1:{free_port('127.0.0.1')}"
        cmds = [[PYTHON, os.path.join(HERE, "torch_ref.py"), job, "--rank", str(r), "--world", str(n),
                 "--master", master, *DDP[system]] for r in range(n)]
    hosts = [f"dlt-h{r}" for r in range(n)] if (links and ddp) else None
    b0 = link_bytes(links) if ddp else None
    # gloo finds its interface from the host name, which is 127.0.0.1 inside a namespace.
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0" if hosts else "lo")
    cap = cap or args.cap_seconds
    t0, events, usage, capped, stopped_at = run_local(cmds, hosts, cap, os.path.join(workdir, f"{system}-{model}"),
                                          env)
    b1 = link_bytes(links) if ddp else None
    if any(u["exit_status"] != 0 and u["before_cap"] for u in usage):
        raise RuntimeError(f"{system} {model} on {link}: exit {[u['exit_status'] for u in usage]}; logs in {workdir}")
    rank0 = events[0]
    curve = [{"epoch": e["epoch"], "seconds": e["arrival"], "test_accuracy": e["test_accuracy"]}
             for e in rank0 if e.get("event") == "epoch_end"]
    ips = [statistics.mean([e["images_per_sec"] for e in evs if e.get("event") == "epoch_end"] or [0])
           for evs in events]
    started = next((e for e in rank0 if e.get("event") == "started"), {})
    # Launch to rank 0's first step (its process group up and its data loaded).
    rec = {"system": system, "model": model, "link": link, "seed": seed, "workers": n, "capped": capped,
           "cap_seconds": cap, "curve": curve, "final_accuracy": curve[-1]["test_accuracy"] if curve else None,
           "wall_seconds": max([e["arrival"] for evs in events for e in evs] + ([stopped_at] if stopped_at else []),
                               default=None),
           "images_per_sec_per_worker": statistics.mean(ips), "images_per_sec_total": sum(ips),
           "first_step": {"seconds": started["arrival"], "load_seconds": started.get("load_seconds")} if started else None,
           "processes": [{"process": "ddp-rank" if ddp else system, **u} for u in usage]}
    if ddp:
        params = started.get("parameters", 0)
        steps_per_epoch = started.get("steps_per_epoch", 0)
        epochs_run = len(curve)
        worker_steps = n * steps_per_epoch * epochs_run
        # Ring all-reduce (gloo): each rank sends and receives 2(N-1)/N of the gradient, fp32
        # or (fp16_compress_hook) binary16; PowerSGD's factors depend on its layers: measured only.
        if system in ("ddp", "ddp-fp16"):
            rec["bytes_per_step_analytic"] = 2 * 2 * (n - 1) / n * (4 if system == "ddp" else 2) * params
        if b0 and worker_steps:
            rec["link_bytes_per_step"] = sum(b1[i] - b0[i] for i in range(n)) / worker_steps
            rec["busiest_link_bytes_per_round"] = max(b1[i] - b0[i] for i in range(n)) / (worker_steps / n)
    else:
        rec["bytes_per_step"] = 0
    return rec


def run_dltrain(cluster, system, job, model, seed, link, links, args, cap_seconds=None):
    n = 1 if system == "dltrain-1w" else args.workers
    b0 = link_bytes(links)
    t0 = time.time()
    p = subprocess.Popen([os.path.join(BIN, "dltrain"), "--leader", cluster.url, "--token", cluster.token, "submit",
                          job, "--follow", "--json"], stdout=subprocess.PIPE, text=True)
    curve, summary, ips, steps, job_id, first_step = [], None, {}, {}, None, None
    capped = False

    def cap():
        nonlocal capped
        capped = True
        if job_id:
            cluster.client("cancel", job_id, check=False)

    cap_seconds = cap_seconds or args.cap_seconds
    timer = threading.Timer(cap_seconds, cap)
    timer.daemon = True
    timer.start()
    try:
        with ProcWatch() as watch:
            for line in p.stdout:
                ev = json.loads(line)
                t = time.time() - t0
                kind = ev.get("event")
                if kind == "submitted":
                    job_id = ev["job"]
                elif kind == "started" and first_step is None:
                    # The first worker holds the PS's parameters and starts its first step.
                    first_step = {"seconds": t, "load_seconds": ev.get("load_seconds")}
                elif kind == "epoch_end":
                    ips.setdefault(ev.get("rank", 0), []).append(ev["images_per_sec"])
                    if "test_accuracy" in ev:
                        curve.append({"epoch": ev["epoch"], "seconds": t, "test_accuracy": ev["test_accuracy"]})
                elif kind == "done":
                    steps[ev.get("task", ev.get("rank"))] = ev.get("steps", 0)
                elif kind == "summary":
                    summary = ev
            p.wait(timeout=120)
    finally:
        timer.cancel()
        if p.poll() is None:
            # An error or a signal: cancel the job so that no task outlives the run.
            if job_id:
                cluster.client("cancel", job_id, check=False)
            p.kill()
    b1 = link_bytes(links)
    if summary is None or (summary["state"] != "succeeded" and not capped):
        raise RuntimeError(f"{system} {model} on {link}: {summary}")
    # A stopped job's workers send no final step counts: its bytes per step are unknown.
    total_steps = (sum(steps.values()) or None) if not capped else None
    per = [statistics.mean(v) for v in ips.values()]
    rec = {"system": system, "model": model, "link": link, "seed": seed, "workers": n, "capped": capped,
           "cap_seconds": cap_seconds,
           "curve": curve, "final_accuracy": summary.get("test_accuracy"), "wall_seconds": time.time() - t0,
           "images_per_sec_per_worker": statistics.mean(per) if per else None,
           "images_per_sec_total": sum(per) if per else None,
           "bytes_per_step": (summary["bytes_pushed"] + summary["bytes_pulled"]) / total_steps if total_steps else None,
           "compression_after_warmup": summary.get("compression_ratio_after_warmup"),
           "first_step": first_step,
           "processes": watch.processes()}
    if links and total_steps:
        # Worker hosts are the ones without the PS: the leader places tasks, so with a
        # host for the PS count every host but the busiest (the PS's); with a shard beside
        # each worker (as many hosts as workers) count them all. Divide by worker steps.
        d = sorted(b1[i] - b0[i] for i in range(cluster.hosts))
        rec["link_bytes_per_step"] = sum(d if cluster.hosts == n else d[:-1]) / total_steps
        # The busiest link's bytes per round (one step of every worker): the PS's link when
        # one host holds the PS, which every worker's traffic crosses.
        rec["busiest_link_bytes_per_round"] = d[-1] / (total_steps / n)
    return rec


def goodput(link, links, args, workdir):
    secret = os.path.join(workdir, "goodput.secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    serve = [os.path.join(BIN, "ps_goodput"), "serve", "--secret-file", secret,
             "--bind", links.address(0) if links else "127.0.0.1"]
    if links:
        serve = ["ip", "netns", "exec", "dlt-h0"] + serve
    srv = subprocess.Popen(serve, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ports = json.loads(srv.stdout.readline())
        meas = [os.path.join(BIN, "ps_goodput"), "measure", "--secret-file", secret, "--host", links.address(0) if links else "127.0.0.1",
                "--raw-port", str(ports["raw_port"]), "--ps-port", str(ports["ps_port"]),
                "--floats", "702602", "--rounds", str(args.goodput_rounds), "--seconds", "2"]
        if links:
            meas = ["ip", "netns", "exec", "dlt-h1"] + meas
        r = subprocess.run(meas, capture_output=True, text=True, timeout=600, check=True)
        out = json.loads(r.stdout)
        out["link"] = link
        return out
    finally:
        srv.stdin.close()
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true",
                    help="every system on every link for both models, 3 seeds, the full training set")
    ap.add_argument("--links", help="comma list of loopback,1gbit,100mbit (default: loopback,100mbit; --full: all)")
    ap.add_argument("--models", help="comma list of cnn,mlp-large (default: both)")
    # argparse %-formats help strings, so the systems' own '%' signs are doubled.
    ap.add_argument("--systems", help="comma list, each run on every link and model given (default: the default "
                    "size's subset of all but the -bsp ones): " +
                    ",".join(SYSTEMS).replace("%", "%%"))
    ap.add_argument("--seeds", help="comma list (default 1; --full 1,2,3)")
    ap.add_argument("--workers", type=int, default=2, help="N: dltrain workers and DDP ranks (default 2)")
    ap.add_argument("--cap-seconds", type=int, default=900, help="stop any run after this long (default 900)")
    ap.add_argument("--peer-cap-seconds", type=int, default=150,
                    help="default size only: stop DDP and dense ASGD on emulated links after this long when no DGC "
                         "run has reached 0.85 before them (default 150; otherwise 3.2x the slowest DGC run's time)")
    ap.add_argument("--peers-to-the-end", action="store_true",
                    help="run DDP and dense ASGD to their last epoch (no cap but --cap-seconds), for the final-accuracy "
                         "comparison with DGC")
    ap.add_argument("--train-samples", type=int, help="override the size's training images (0 = all)")
    ap.add_argument("--epochs", type=int, help="override the size's epochs (both models)")
    ap.add_argument("--goodput-rounds", type=int, default=5)
    ap.add_argument("--dgc-warmup", type=float,
                    help="the DGC systems' compression.warmup_epochs (default: 1, or half the epochs if fewer)")
    ap.add_argument("--dgc-warmup-schedule", choices=["per_epoch", "stages"], default="per_epoch",
                    help="the DGC systems' compression.warmup_schedule (default per_epoch)")
    ap.add_argument("--dgc-min-compress-bytes", type=int, default=0,
                    help="the DGC systems' compression.min_compress_bytes (default 0)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks/e2e.md and the plot")
    ap.add_argument("--report", metavar="JSON", help="run nothing: rewrite the tables, goals and plot from an e2e.json")
    ap.add_argument("--merge", metavar="JSON",
                    help="an earlier run's e2e.json: its results for (model, link, system, seed) and its goodput "
                         "for links this run does not measure are kept in the tables, goals and plot")
    args = ap.parse_args()
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) unwind like Ctrl-C,
    # so the clusters, processes and namespaces are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        return write_outputs(args, data["meta"], data["results"], data["goodput"], data["meta"]["size"])
    if os.geteuid() != 0:
        sys.exit("e2e: needs root for the emulated links (ip netns, tc) and /proc of the task processes")
    for exe in ("plain_loop", "ps_goodput", "dltrain", "dltrain-agent", "dltrain-worker", "dltrain-ps"):
        if not os.access(os.path.join(BIN, exe), os.X_OK):
            sys.exit(f"e2e: {BIN}/{exe} is missing; run scripts/setup first")
    if subprocess.run([PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                      capture_output=True).returncode != 0:
        sys.exit("e2e: PyTorch with gloo is missing; apt-get install python3-torch")
    size = {
        "links": (args.links or ("loopback,1gbit,100mbit" if args.full else "loopback,100mbit")).split(","),
        "models": (args.models or "cnn,mlp-large").split(","),
        "seeds": [int(s) for s in (args.seeds or ("1,2,3" if args.full else "1")).split(",")],
        # Default: a subset of the training set and few epochs, to finish within ~20 min
        # on 2 cores; --full: the whole training set and enough epochs for the targets.
        "train_samples": 0 if args.full else {"cnn": 20000, "mlp-large": 30000},
        "test_samples": 0 if args.full else 5000,
        "epochs": {"cnn": 6, "mlp-large": 4} if args.full else {"cnn": 3, "mlp-large": 4},
    }
    for link in size["links"]:
        if link != "loopback" and link not in RATES:
            sys.exit(f"e2e: --links: unknown link \"{link}\" (expected loopback, 1gbit or 100mbit)")
    for model in size["models"]:
        if model not in MODELS:
            sys.exit(f"e2e: --models: unknown model \"{model}\" (expected {', '.join(MODELS)})")
    if args.train_samples is not None:
        size["train_samples"] = args.train_samples
    if not isinstance(size["train_samples"], dict):
        size["train_samples"] = {m: size["train_samples"] for m in MODELS}
    if args.epochs:
        size["epochs"] = {m: args.epochs for m in size["epochs"]}
    size["cap"] = args.cap_seconds
    systems = (args.systems or ",".join(DEFAULT_SYSTEMS)).split(",")
    for system in systems:
        if system not in SYSTEMS:
            sys.exit(f"e2e: --systems: unknown system \"{system}\" (expected {', '.join(SYSTEMS)})")
    targets_by_model = {m: MODELS[m]["target"] for m in MODELS}
    os.makedirs(args.out, exist_ok=True)
    workdir = os.path.join(args.out, "e2e-logs")
    os.makedirs(workdir, exist_ok=True)
    results, goodputs = [], []
    started = time.time()

    def record(r):
        summarize_curve(r, {"target": targets_by_model[r["model"]], "0.85": 0.85})
        results.append(r)
        ips = r["images_per_sec_per_worker"]
        print(f"[{r['link']}] {r['model']} {r['system']} seed {r['seed']}: final {r['final_accuracy']}, "
              f"to target {r['seconds_to_target']}, to 0.85 {r['seconds_to_0.85']}, wall {r['wall_seconds']:.1f} s, "
              + (f"{ips:.0f} img/s/worker" if ips is not None else "no epoch finished")
              + (" (capped)" if r["capped"] else "") +
              f"  [{time.time() - started:.0f} s elapsed]", flush=True)

    for model in size["models"]:
        for seed in size["seeds"]:
            for system in [s for s in systems if s in SINGLE]:
                if not args.full and not args.systems and not in_default(model, "none", system):
                    continue
                job = job_toml(os.path.join(workdir, f"{model}-{system}-{seed}.toml"), model, system, seed, size, 1)
                record(run_reference(system, job, model, seed, "none", None, args, workdir))
    for link in size["links"]:
        links = Links(args.workers + 1, RATES[link]) if link in RATES else None
        try:
            if links:
                links.__enter__()
            goodputs.append(goodput(link, links, args, workdir))
            g = goodputs[-1]
            print(f"[{link}] goodput: stream {g['stream_median_mb_per_s']:.1f} MB/s, push+pull "
                  f"{g['ps_median_mb_per_s']:.1f} MB/s ({g['ps_over_stream']:.3f})", flush=True)
            with Cluster(args.workers + 1, links) as cluster:
                for model in size["models"]:
                    for seed in size["seeds"]:
                        order = sorted(systems, key=lambda x: 0 if x in DGC else 1) if links else systems
                        for system in order:
                            if system in SINGLE:
                                continue
                            if not args.full and not args.systems and not in_default(model, link, system):
                                continue
                            n = 1 if system == "dltrain-1w" else args.workers
                            job = job_toml(os.path.join(workdir, f"{model}-{system}-{link}-{seed}.toml"), model,
                                           system, seed, size, n, args.dgc_warmup, args.dgc_min_compress_bytes,
                                           args.dgc_warmup_schedule)
                            cap = args.cap_seconds if args.full or args.peers_to_the_end or not links else \
                                default_cap(results, model, link, system, args.peer_cap_seconds, args.cap_seconds)
                            if system in DDP:
                                r = run_reference(system, job, model, seed, link, links, args, workdir, cap)
                            else:
                                r = run_dltrain(cluster, system, job, model, seed, link, links, args, cap)
                            record(r)
        finally:
            if links:
                links.__exit__(None, None, None)
    elapsed = time.time() - started
    command = " ".join(["bench/e2e/run.py"] + sys.argv[1:])
    earlier = []
    if args.merge:
        with open(args.merge) as f:
            old = json.load(f)
        key = lambda r: (r["model"], r["link"], r["system"], r["seed"])  # noqa: E731
        new_keys = {key(r) for r in results}
        results += [r for r in old["results"] if key(r) not in new_keys]
        goodputs += [g for g in old["goodput"] if g["link"] not in {x["link"] for x in goodputs}]
        earlier = old["meta"].get("runs", [old["meta"]])
        size["links"] = sorted({r["link"] for r in results if r["link"] != "none"}, key=["loopback", "1gbit", "100mbit"].index)
        size["models"] = [m for m in MODELS if any(r["model"] == m for r in results)]
    meta = {"date": datetime.date.today().isoformat(), "command": command,
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
            "elapsed_seconds": elapsed, "size": size, "workers": args.workers, "cap_seconds": args.cap_seconds,
            "goodput_rounds": args.goodput_rounds}
    meta["runs"] = earlier + [{k: meta[k] for k in ("date", "command", "elapsed_seconds", "cap_seconds")}]
    write_outputs(args, meta, results, goodputs, size)



if __name__ == "__main__":
    main()
