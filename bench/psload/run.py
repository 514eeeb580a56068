#!/usr/bin/env python3
"""The PS under load: simulated workers against real PS shards, one process each.

Every simulated worker is a `ps_load worker` process (the real ps::PsClient, no
LibTorch) that pushes and pulls gradient-sized buffers; every shard a `ps_load serve`
process (the real ps::PsServer and ps::ShardState). Measures, per configuration:
  - the shards' pushes/s (push frames applied per second, from the shards' own counters
    over the measured window) and worker steps/s (push+pull round trips),
  - apply time per push frame (PsServer::apply_seconds / pushes),
  - push+pull latency at the workers (p50, p99),
for 1..64 workers, dense (fp32) and sparse (DGC wire form: top-k indices and values up,
sparse pulls down), and several shards side by side. Then the downlink memory: the
shard's resident memory against ShardState's documented formula
4·n·(1 + [momentum > 0] + workers) bytes for n shard floats, as the count of workers
using sparse pulls grows, and the worker count at which a 25M-parameter shard outgrows
16 GiB.

All processes share this machine's cores: with W workers on C cores the shard competes
with W clients for CPU; the report says so next to every figure.

Usage: bench/psload/run.py [--quick] [--workers 1,2,4,...] [--seconds S] [--out FILE]
       bench/psload/run.py --phases rtt,side    (measure some phases again; keep the rest)
       bench/psload/run.py --report             (print the Markdown tables of --out)
Phases: rtt (1-float round trip), throughput (closed loop), paced (--paced-rate steps/s per
worker), side (several shards), memory (downlink memory). Writes bench/results/psload.json
(every figure).
"""
import argparse
import datetime
import json
import math
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.join(os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build")), "bin")
PS_LOAD = os.path.join(BIN, "ps_load")
GIB = 1 << 30


class Shard:
    """One `ps_load serve` process; `stats()` asks it for its counters."""

    def __init__(self, secret_file, momentum):
        self.p = subprocess.Popen(
            [PS_LOAD, "serve", "--secret-file", secret_file, "--momentum", str(momentum)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.port = self._answer()["port"]

    def _answer(self):
        # The shard's log lines (spdlog) share its stdout; answers are the JSON lines.
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("ps_load serve exited")
            if line.startswith("{"):
                return json.loads(line)

    def stats(self):
        self.p.stdin.write("stats\n")
        self.p.stdin.flush()
        return self._answer()

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def run_config(secret_file, workers, shards, floats, ratio, downlink, seconds, warmup, rate, partition_floats,
               momentum):
    """One configuration: starts the shards and workers, returns every figure."""
    ss = [Shard(secret_file, momentum) for _ in range(shards)]
    try:
        shard_list = ",".join(f"127.0.0.1:{s.port}" for s in ss)
        base = [s.stats() for s in ss]
        start_at = time.time() + 1.0 + 0.06 * workers  # time for every worker to connect and pull
        procs = []
        for r in range(workers):
            procs.append(subprocess.Popen(
                [PS_LOAD, "worker", "--secret-file", secret_file, "--shards", shard_list, "--rank", str(r),
                 "--workers", str(workers), "--floats", str(floats), "--partition-floats", str(partition_floats),
                 "--ratio", str(ratio), "--downlink-ratio", str(downlink), "--rate", str(rate),
                 "--seconds", str(seconds), "--warmup", str(warmup), "--start-at", f"{start_at:.3f}"],
                stdout=subprocess.PIPE, text=True))
        t_begin = start_at + warmup
        time.sleep(max(0.0, t_begin - time.time()))
        a = [s.stats() for s in ss]
        ta = time.time()
        time.sleep(max(0.0, t_begin + seconds - time.time()))
        b = [s.stats() for s in ss]
        tb = time.time()
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"ps_load worker exited with {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        after = [s.stats() for s in ss]
    finally:
        for s in ss:
            s.close()
    dt = tb - ta
    pushes = [bb["pushes"] - aa["pushes"] for aa, bb in zip(a, b)]
    apply_s = [bb["apply_seconds"] - aa["apply_seconds"] for aa, bb in zip(a, b)]
    cpu_s = [bb["cpu_seconds"] - aa["cpu_seconds"] for aa, bb in zip(a, b)]
    lat = [o["latency_ms"] for o in outs]
    steps = sum(o["steps"] for o in outs)
    parts = outs[0]["partitions"]
    return {
        "workers": workers, "shards": shards, "floats": floats, "partitions": parts, "ratio": ratio,
        "downlink_ratio": downlink, "rate_per_worker": rate, "momentum": momentum, "seconds": round(dt, 3),
        "push_frames_per_s_per_shard": [round(p / dt, 1) for p in pushes],
        "push_frames_per_s_total": round(sum(pushes) / dt, 1),
        # A worker step pushes one frame to every partition: frames ÷ partitions = steps.
        "worker_steps_per_s_total": round(sum(o["steps_per_s"] for o in outs), 2),
        "worker_steps_per_s_min": round(min(o["steps_per_s"] for o in outs), 2),
        "worker_steps_per_s_max": round(max(o["steps_per_s"] for o in outs), 2),
        "apply_us_per_frame": [round(1e6 * s / p, 2) if p else None for s, p in zip(apply_s, pushes)],
        "apply_busy_fraction": [round(s / dt, 3) for s in apply_s],
        "shard_cpu_fraction": [round(c / dt, 3) for c in cpu_s],
        "latency_ms_p50_median": round(statistics.median(l["p50"] for l in lat), 3),
        "latency_ms_p99_max": round(max(l["p99"] for l in lat), 3),
        "latency_ms_p99_median": round(statistics.median(l["p99"] for l in lat), 3),
        "latency_ms_mean": round(statistics.fmean(l["mean"] for l in lat), 3),
        "bytes_pushed_per_step": round(statistics.fmean(o["bytes_pushed_per_step"] for o in outs)),
        "bytes_pulled_per_step": round(statistics.fmean(o["bytes_pulled_per_step"] for o in outs)),
        "steps_measured": steps,
        "shard_rss_bytes_during": [bb["rss_bytes"] for bb in b],
        "shard_rss_bytes_idle": [x["rss_bytes"] for x in base],
        "shard_hwm_bytes": [x["hwm_bytes"] for x in after],
        "shard_state_bytes": [x["state_bytes"] for x in after],
    }


def state_formula(n, momentum, workers):
    """ShardState::state_bytes(): 4·n·(1 + [momentum > 0] + workers)."""
    return 4 * n * (1 + (1 if momentum > 0 else 0) + workers)


def outgrow_workers(n, momentum, limit):
    """Smallest worker count W with 4·n·(1 + [m > 0] + W) > limit."""
    per = 4 * n
    fixed = 1 + (1 if momentum > 0 else 0)
    return math.floor(limit / per) - fixed + 1


def tables(res):
    """The Markdown tables of docs/benchmarks/load.md, "The PS under load"."""
    md = []

    def mib(b):
        return f"{b / 2**20:.1f}"

    for title, key in (("Closed loop (every worker pushes as fast as the shard answers)", "throughput"),
                       ("Paced: every worker offers {rate} steps/s", "paced")):
        rows = res[key]
        if not rows:
            continue
        md += [f"**{title.format(rate=rows[0]['rate_per_worker'])}**", "",
               "| mode | workers | shard push frames/s | worker steps/s (all) | per worker min-max | apply µs/frame | "
               "apply busy | shard CPU | p50 ms | p99 ms (median / worst worker) | bytes up/down per step |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['mode']} | {r['workers']} | {r['push_frames_per_s_total']:.0f} | "
                      f"{r['worker_steps_per_s_total']:.1f} | {r['worker_steps_per_s_min']:.1f}-"
                      f"{r['worker_steps_per_s_max']:.1f} | {r['apply_us_per_frame'][0]:.1f} | "
                      f"{r['apply_busy_fraction'][0]:.2f} | {r['shard_cpu_fraction'][0]:.2f} | "
                      f"{r['latency_ms_p50_median']:.1f} | {r['latency_ms_p99_median']:.1f} / "
                      f"{r['latency_ms_p99_max']:.1f} | {r['bytes_pushed_per_step']} / {r['bytes_pulled_per_step']} |")
        md.append("")
    if res["side_by_side"]:
        r0 = res["side_by_side"][0]
        md += [f"**Several shards side by side** (closed loop; the {r0['floats']:,}-float model cut into "
               f"{r0['partitions']} partitions spread over the shards)", "",
               "| mode | workers | shards | push frames/s per shard | worker steps/s (all) | apply µs/frame per shard | "
               "p50 ms | p99 ms |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(res["side_by_side"], key=lambda r: (r["mode"], r["workers"], r["shards"])):
            md.append(f"| {r['mode']} | {r['workers']} | {r['shards']} | "
                      f"{', '.join(f'{x:.0f}' for x in r['push_frames_per_s_per_shard'])} | "
                      f"{r['worker_steps_per_s_total']:.1f} | "
                      f"{', '.join('—' if x is None else f'{x:.1f}' for x in r['apply_us_per_frame'])} | "
                      f"{r['latency_ms_p50_median']:.1f} | {r['latency_ms_p99_median']:.1f} |")
        md.append("")
    if res["memory"]:
        n = res["memory"][0]["floats"]
        md += [f"**Downlink memory**: one shard of n = {n:,} floats, momentum 0 (dgc), every worker on sparse pulls",
               "", "| workers | shard RSS MiB | RSS − idle MiB | ShardState::state_bytes MiB | formula 4·n·(1 + W) MiB | "
               "(RSS − idle) ÷ formula | + scratch 4·n + W·2·4·262144 (planner/ps_memory.h) MiB | "
               "(RSS − idle) ÷ that |", "|---|---|---|---|---|---|---|---|"]
        for r in res["memory"]:
            full = r["formula_bytes"] + (4 * n + r["workers"] * 8 * min(262144, n) if r["workers"] else 0)
            ratio = f"{r['rss_minus_idle_bytes'] / full:.3f}" if r["workers"] else "—"
            md.append(f"| {r['workers']} | {mib(r['rss_bytes'])} | {mib(r.get('rss_minus_idle_bytes', 0))} | "
                      f"{mib(r['state_bytes'])} | {mib(r['formula_bytes'])} | "
                      f"{r.get('rss_minus_idle_over_formula', '—')} | {mib(full)} | {ratio} |")
        md.append("")
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,4,8,16,32,64")
    ap.add_argument("--shards", default="1,2,4", help="shard counts of the side-by-side runs")
    ap.add_argument("--side-partition-floats", type=int, default=87826,
                    help="partition size of the side-by-side runs (8 partitions of the default model)")
    ap.add_argument("--phases", default="rtt,throughput,paced,side,memory",
                    help="what to measure; phases not measured keep their figures from --out")
    ap.add_argument("--shard-workers", default="4,16,64", help="worker counts of the side-by-side runs")
    ap.add_argument("--floats", type=int, default=702602, help="model size of the throughput runs (mlp-large)")
    ap.add_argument("--ratio", type=float, default=0.01, help="sparse uplink and downlink density")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=0.0, help="steps/s per worker; 0 = closed loop")
    ap.add_argument("--paced-rate", type=float, default=10.0, help="steps/s per worker of the paced series")
    ap.add_argument("--memory-floats", type=int, default=1 << 20, help="model size of the memory series")
    ap.add_argument("--memory-workers", default="0,1,4,16,32,64")
    ap.add_argument("--quick", action="store_true", help="1,4,16 workers, no side-by-side runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "psload.json"))
    ap.add_argument("--report", action="store_true", help="run nothing: print the tables of --out")
    args = ap.parse_args()
    if args.report:
        with open(args.out) as f:
            print(tables(json.load(f)))
        return
    if not os.access(PS_LOAD, os.X_OK):
        sys.exit(f"run.py: {PS_LOAD} is missing; build it (scripts/setup builds the benchmarks)")
    workers = [int(x) for x in args.workers.split(",")]
    if args.quick:
        workers, args.shards = [1, 4, 16], ""
    tmp = tempfile.mkdtemp(prefix="psload-")
    secret_file = os.path.join(tmp, "secret")
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.close(fd)
    t0 = time.time()
    res = {"meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "cores": os.cpu_count(),
        "machine": platform.machine(), "platform": platform.platform(), "command": " ".join(sys.argv),
        "note": "every worker and shard is its own process on this machine's cores, on loopback"},
        "throughput": [], "side_by_side": [], "paced": [], "memory": []}

    phases = set(args.phases.split(","))
    if os.path.exists(args.out) and phases != {"rtt", "throughput", "paced", "side", "memory"}:
        with open(args.out) as f:
            old = json.load(f)
        for k in ("throughput", "paced", "side_by_side", "memory", "rtt_ms", "resnet50_shard"):
            if k in old:
                res[k] = old[k]
        res["meta"]["earlier"] = old["meta"].get("earlier", []) + [old["meta"]]
    # The data plane's round trip without payload: one worker, a 1-float model.
    if "rtt" in phases:
        rtt = run_config(secret_file, workers=1, shards=1, floats=1, ratio=1.0, downlink=1.0, seconds=3.0,
                         warmup=0.5, rate=0.0, partition_floats=262144, momentum=0.9)
        res["rtt_ms"] = {"p50": rtt["latency_ms_p50_median"], "p99": rtt["latency_ms_p99_median"],
                         "mean": rtt["latency_ms_mean"]}
        print(json.dumps({"rtt_ms": res["rtt_ms"]}), flush=True)

    def run(mode, partition_floats=262144, **kw):
        r = run_config(secret_file, partition_floats=partition_floats, **kw)
        r["mode"] = mode
        print(json.dumps({k: r[k] for k in ("mode", "workers", "shards", "rate_per_worker",
                                            "push_frames_per_s_total", "worker_steps_per_s_total",
                                            "apply_us_per_frame", "latency_ms_p50_median",
                                            "latency_ms_p99_median")}), flush=True)
        return r

    modes = {"dense": (1.0, 1.0, 0.9), "sparse": (args.ratio, args.ratio, 0.0)}
    for key, phase in (("throughput", "throughput"), ("paced", "paced"), ("side_by_side", "side")):
        if phase in phases:
            res[key] = []
    for mode, (ratio, down, mom) in modes.items():
        common = dict(floats=args.floats, ratio=ratio, downlink=down, seconds=args.seconds, warmup=args.warmup,
                      momentum=mom)
        for w in workers if "throughput" in phases else []:
            res["throughput"].append(run(mode, workers=w, shards=1, rate=args.rate, **common))
        for w in workers if "paced" in phases else []:
            res["paced"].append(run(mode, workers=w, shards=1, rate=args.paced_rate, **common))
        for s in [int(x) for x in args.shards.split(",") if x] if "side" in phases else []:
            for w in [int(x) for x in args.shard_workers.split(",")]:
                res["side_by_side"].append(run(mode, workers=w, shards=s, rate=args.rate,
                                               partition_floats=args.side_partition_floats, **common))

    # Downlink memory: W workers with sparse pulls on one shard of n floats, momentum 0
    # (dgc); a few slow steps each (rate 2/s) so that every sparse pull has run.
    n = args.memory_floats
    if "memory" in phases:
        res["memory"] = []
    for w in [int(x) for x in args.memory_workers.split(",")] if "memory" in phases else []:
        if w == 0:
            sh = Shard(secret_file, 0.0)
            idle = sh.stats()
            sh.close()
            res["memory"].append({"workers": 0, "floats": n, "rss_bytes": idle["rss_bytes"],
                                  "state_bytes": idle["state_bytes"], "formula_bytes": 0})
            continue
        r = run_config(secret_file, workers=w, shards=1, floats=n, ratio=args.ratio, downlink=args.ratio,
                       seconds=2.0, warmup=0.5, rate=2.0, partition_floats=262144, momentum=0.0)
        row = {"workers": w, "floats": n, "rss_bytes": r["shard_rss_bytes_during"][0],
               "rss_idle_bytes": r["shard_rss_bytes_idle"][0], "hwm_bytes": r["shard_hwm_bytes"][0],
               "state_bytes": r["shard_state_bytes"][0], "formula_bytes": state_formula(n, 0.0, w)}
        print(json.dumps(row), flush=True)
        res["memory"].append(row)
    idle = res["memory"][0]["rss_bytes"] if res["memory"] and res["memory"][0]["workers"] == 0 else 0
    for row in res["memory"]:
        if row["workers"]:
            row["rss_minus_idle_bytes"] = row["rss_bytes"] - idle
            row["rss_minus_idle_over_formula"] = round((row["rss_bytes"] - idle) / row["formula_bytes"], 4)
    big = 25_000_000
    res["resnet50_shard"] = {
        "floats": big, "limit_bytes": 16 * GIB,
        "outgrows_at_workers_momentum0": outgrow_workers(big, 0.0, 16 * GIB),
        "outgrows_at_workers_momentum": outgrow_workers(big, 0.9, 16 * GIB),
        "bytes_per_worker": 4 * big,
        # planner/ps_memory.h's total: + the pull scratch (4·n) + two 262,144-float
        # connection buffers per worker (the shard RSS measured above has both).
        "outgrows_at_workers_with_scratch_and_buffers": next(
            w for w in range(1, 100000) if 4 * big * (2 + w) + w * 8 * 262144 > 16 * GIB),
    }
    res["meta"]["wall_seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(f"run.py: wrote {args.out} ({res['meta']['wall_seconds']} s)")


if __name__ == "__main__":
    main()
