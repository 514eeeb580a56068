#!/usr/bin/python3
"""The fair comparison: dltrain against PyTorch DDP with PyTorch's own compression, each
system at its best learning rate, in one invocation on one machine.

Systems (bench/e2e/run.py runs each): DDP (gloo) dense, with fp16_compress_hook, with
powerSGD_hook at ranks 1 and 4; dltrain dense, DGC at 1 % and 0.1 %, and its low-rank
method (PowerSGD's power iteration through the PS), asynchronous or BSP (`-bsp`). Every
system's learning rate is tuned on one grid of *effective* steps: the step a whole
round of N workers' gradients takes. DDP averages the ranks' gradients, so its lr is the
effective step; dltrain's PS applies every worker's push (BSP sums them, ASGD applies
each), so its lr is the effective step / N. Every job has the same linear warm-up
(0.3 epoch) and cosine schedule, batch 64 per worker, momentum 0.9, weight decay 5e-4.

Per model and link the table gives each system at its best grid point (least time to the
target in every seed, else the best final accuracy), with its time to the target, final
accuracy, wall time, images/s per worker and bytes per worker step (socket: dltrain's
own count; link: what crossed the workers' emulated links), the time from launch to the
first training step (dltrain: task start, data load, PS init; DDP: process group and
data), and names the winner. Times
run from launch (`dltrain submit`, or the DDP processes' start) to the end of the first
epoch whose test accuracy reached the target: the same clock origin for both.

Usage (as root, after `scripts/setup --bench`):
  bench/e2e/compare.py                                   # mlp-large at 100 Mbit/s (the issue's headline)
  bench/e2e/compare.py --models mlp-large,cnn --links 100mbit,1gbit,loopback --seeds 1,2,3
Writes bench/results/compare/compare.json (every run, with commit, date, CPU model and
command) and compare.md, and replaces the section of docs/benchmarks/comparison.md
between its compare markers (--no-docs: not).
"""
import argparse
import datetime
import itertools
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import run as e2e  # noqa: E402  (the runs themselves: same jobs, clusters, links, figures)
from compression_bench import Cluster, Links  # noqa: E402
from standalone import commit, machine  # noqa: E402

PEERS = [s for s in e2e.DDP]
DLTRAIN = ["dltrain-dense", "dltrain-dense-bsp", "dltrain-dgc-1%", "dltrain-dgc-0.1%", "dltrain-dgc-1%-bsp",
           "dltrain-dgc-0.1%-bsp", "dltrain-powersgd-r4", "dltrain-powersgd-r4-bsp", "dltrain-powersgd-r1"]
SIZES = {"train_samples": {"cnn": 20000, "mlp-large": 30000, "resnet20": 30000}, "test_samples": 5000,
         "epochs": {"cnn": 3, "mlp-large": 4, "resnet20": 3}}


def variant(name, warmup):
    """A --systems entry: a system of run.py, optionally with `:wX` (its compression
    warm-up X epochs instead of --compression-warmup) and `:spread` (a dltrain system's
    PS shards as ps_shards = "auto" places them on agents of 2 cores, one beside each
    worker, instead of one shard on a host of its own) and `:overlap` (a dltrain system's
    job with `overlap = true`: pushes during backward). Returns (system, warm-up epochs,
    spread, overlap). PowerSGD's own warm-up is
    two dense steps (start_powerSGD_iter), so dltrain's low-rank systems start compressed
    unless a `:w` says otherwise. Raises ValueError on an unknown suffix."""
    system, *suffixes = name.split(":")
    w, spread, overlap = (0.0 if system in e2e.POWERSGD else warmup), False, False
    for s in suffixes:
        if s == "spread" and system.startswith("dltrain"):
            spread = True
        elif s == "overlap" and system.startswith("dltrain"):
            overlap = True
        elif s.startswith("w"):
            w = float(s[1:])
        else:
            raise ValueError(s)
    return system, w, spread, overlap


def downlink(text):
    """--downlink-ratio: "auto" (written as the job file's "auto") or a density in (0, 1]."""
    if text == "auto":
        return '"auto"'
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected auto or a density in (0, 1], got {text}")
    return value


def job_lr(system, effective, workers):
    """The job's lr for an effective step: DDP averages (lr = step), dltrain sums (step / N)."""
    return effective if system in e2e.DDP else effective / workers


def points(results, model, link, key, dltrain):
    """Every grid point of dltrain's systems (`dltrain`) or of the peers that reached the
    target in every seed: dicts of system, effective lr, mean seconds and mean final
    accuracy."""
    groups = {}
    for r in results:
        if r["model"] == model and r["link"] == link and r["system"].startswith("dltrain") == dltrain:
            groups.setdefault((r["system"], r["effective_lr"]), []).append(r)
    return [{"system": s, "eff": eff, "t": statistics.mean(r[key] for r in rs),
             "acc": statistics.mean(r["final_accuracy"] or 0 for r in rs)}
            for (s, eff), rs in groups.items() if all(r.get(key) for r in rs)]


def goal(results, model, link, key):
    """The goal of one model and link (the issue's "Done when"): the best peer is its
    soonest grid point; dltrain's best configuration is its soonest grid point, where the
    goal bounds the accuracy (mlp-large at 100 Mbit/s: within 0.5 point of the peer's final
    accuracy) its soonest within the bound if any is. None when either side never reached
    the target."""
    ours, peers = points(results, model, link, key, True), points(results, model, link, key, False)
    if not ours or not peers:
        return None
    b = min(peers, key=lambda p: p["t"])
    need = 1.5 if (link == "100mbit" and model == "mlp-large") else 1.0 if link == "100mbit" else 0.9
    close = [p for p in ours if p["acc"] - b["acc"] >= -0.005] if need == 1.5 else ours
    a = min(close or ours, key=lambda p: p["t"])
    return {"model": model, "link": link, "dltrain": f"{a['system']} (lr step {a['eff']})",
            "peer": f"{b['system']} (lr step {b['eff']})", "speedup": b["t"] / a["t"], "need": need,
            "met": b["t"] / a["t"] >= need and bool(close), "accuracy_delta": a["acc"] - b["acc"]}


def best_of(runs, key):
    """The grid point of one system whose runs reached the target soonest in every seed,
    else the one with the best mean final accuracy. Returns (effective lr, its runs)."""
    by_lr = {}
    for r in runs:
        by_lr.setdefault(r["effective_lr"], []).append(r)

    def score(item):
        rs = item[1]
        if all(r.get(key) for r in rs):
            return (0, statistics.mean(r[key] for r in rs))
        return (1, -statistics.mean(r["final_accuracy"] or 0 for r in rs))
    return min(by_lr.items(), key=score)


def fmt(xs, f="{:.1f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    return f.format(statistics.mean(xs)) + (f" ± {f.format(statistics.stdev(xs))}" if len(xs) > 1 else "")


def report(data):
    meta, results = data["meta"], data["results"]
    tgt = meta["target"]
    key = f"seconds_to_{tgt}"
    md = [f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']}; command "
          f"`{meta['command']}` ({meta['elapsed_seconds'] / 60:.1f} min). {meta['workers']} workers / DDP ranks, "
          f"batch 64 each, training images {meta['size']['train_samples']}, {meta['size']['test_samples']} test "
          f"images, epochs {meta['size']['epochs']}, seeds {meta['seeds']}, effective-lr grid {meta['grid']}, "
          f"runs stopped at {meta['cap_seconds']} s. Target: test accuracy {tgt}.", ""]
    goals = []
    for model in meta["models"]:
        for link in meta["links"]:
            rows = []
            for system in meta["systems"]:
                runs = [r for r in results if r["model"] == model and r["link"] == link and r["system"] == system]
                if not runs:
                    continue
                eff, best = best_of(runs, key)
                reached = all(r.get(key) for r in best)
                rows.append({"system": system, "eff": eff, "runs": best, "reached": reached,
                             "t": statistics.mean(r[key] for r in best) if reached else None,
                             "acc": statistics.mean(r["final_accuracy"] or 0 for r in best)})
            if not rows:
                continue
            done = [r for r in rows if r["reached"]]
            winner = min(done, key=lambda r: r["t"]) if done else None
            md += [f"### `{model}`, {link}", "",
                   f"| system | best effective lr | s to {tgt} | final accuracy | s to first step | wall s | "
                   "images/s per worker | bytes/step (socket) | bytes/step (link) | busiest link, bytes/round |",
                   "|---|---|---|---|---|---|---|---|---|---|"]
            for r in sorted(rows, key=lambda r: (r["t"] is None, r["t"] or 0)):
                rs = r["runs"]
                t = fmt([x.get(key) for x in rs]) if r["reached"] else \
                    f"not reached ({sum(not x.get(key) for x in rs)} of {len(rs)})"
                sock = fmt([x.get("bytes_per_step") or x.get("bytes_per_step_analytic") for x in rs], "{:.0f}")
                name = f"**{r['system']}** (winner)" if r is winner else r["system"]
                first = [(x.get("first_step") or {}).get("seconds") for x in rs]
                md.append(f"| {name} | {r['eff']} | {t} | {fmt([x['final_accuracy'] for x in rs], '{:.4f}')} | "
                          f"{fmt(first)} | {fmt([x['wall_seconds'] for x in rs])} | "
                          f"{fmt([x['images_per_sec_per_worker'] for x in rs], '{:.0f}')} | {sock} | "
                          f"{fmt([x.get('link_bytes_per_step') for x in rs], '{:.0f}')} | "
                          f"{fmt([x.get('busiest_link_bytes_per_round') for x in rs], '{:.0f}')} |")
            md.append("")
            if g := goal(results, model, link, key):
                goals.append(g)
    md += ["### Goals", "", "| model | link | dltrain's best | best peer | speed-up (peer s ÷ dltrain s) | needed | "
           "final accuracy, dltrain − peer | met |", "|---|---|---|---|---|---|---|---|"]
    for g in goals:
        md.append(f"| {g['model']} | {g['link']} | {g['dltrain']} | {g['peer']} | {g['speedup']:.2f} | ≥ {g['need']} | "
                  f"{100 * g['accuracy_delta']:+.2f} points | {'yes' if g['met'] else 'no'} |")
    md += ["", "Every grid point (s to target / final accuracy; `—` = not reached):", ""]
    for model in meta["models"]:
        for link in meta["links"]:
            sub = [r for r in results if r["model"] == model and r["link"] == link]
            if not sub:
                continue
            grid = sorted({r["effective_lr"] for r in sub})
            md += [f"`{model}`, {link}:", "", "| system | " + " | ".join(str(g) for g in grid) + " |",
                   "|---" * (len(grid) + 1) + "|"]
            for system in meta["systems"]:
                cells = []
                for g in grid:
                    rs = [r for r in sub if r["system"] == system and r["effective_lr"] == g]
                    cells.append(f"{fmt([r.get(key) for r in rs])} / {fmt([r['final_accuracy'] for r in rs], '{:.4f}')}"
                                 if rs else "")
                if any(cells):
                    md.append(f"| {system} | " + " | ".join(cells) + " |")
            md.append("")
    data["goals"] = goals
    return "\n".join(md) + "\n"


def run_point(args, cluster, ln, link, model, seed, name, eff, size, workdir):
    """One grid point: system `name` (with its suffixes) at effective step `eff`, on
    `cluster` (dltrain) or the links `ln` (DDP). A learning rate too large for a system
    fails its job (diverged): a grid point without a result, not the end of the run."""
    system, warmup, spread, overlap = variant(name, args.compression_warmup)
    lr = job_lr(system, eff, args.workers)
    job = e2e.job_toml(os.path.join(workdir, f"{model}-{name}-{link}-{seed}-{eff}.toml"), model, system, seed, size,
                       args.workers, warmup, args.min_compress_bytes, "stages", lr, args.downlink_ratio,
                       None if spread else 1, args.partition_size, overlap)
    t0 = time.time()
    try:
        if system in e2e.DDP:
            r = e2e.run_reference(system, job, model, seed, link, ln, args, workdir, args.cap_seconds)
        else:
            r = e2e.run_dltrain(cluster, system, job, model, seed, link, ln, args, args.cap_seconds)
    except RuntimeError as err:
        r = {"system": system, "model": model, "link": link, "seed": seed, "failed": str(err)[:500], "curve": [],
             "final_accuracy": None, "wall_seconds": time.time() - t0, "images_per_sec_per_worker": None}
    r["system"], r["effective_lr"], r["lr"], r["compression_warmup"] = name, eff, lr, warmup
    e2e.summarize_curve(r, {str(args.target): args.target})
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp-large", help="comma list of cnn,mlp-large,resnet20 (default mlp-large)")
    ap.add_argument("--links", default="100mbit", help="comma list of loopback,1gbit,100mbit (default 100mbit)")
    ap.add_argument("--systems", default=",".join(PEERS + ["dltrain-dgc-0.1%-bsp", "dltrain-powersgd-r4-bsp"]),
                    help="comma list of " + ",".join(PEERS + DLTRAIN).replace("%", "%%") +
                    "; a dltrain system may end in :wX, its compression warm-up X epochs (e.g. dltrain-dgc-0.1%%:w0)")
    ap.add_argument("--grid", default="0.0125,0.025,0.05,0.1,0.2,0.4",
                    help="effective learning rates (lr × workers where a system sums the workers' gradients)")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--cap-seconds", type=int, default=300, help="stop any run after this long (default 300)")
    ap.add_argument("--downlink-ratio", type=downlink, default=0.01,
                    help="dltrain's DGC systems' downlink density in (0, 1], or auto (workers x the uplink's "
                    "density plus the share sent in full; the low-rank systems use their low-rank downlink)")
    ap.add_argument("--compression-warmup", type=float, default=0.25,
                    help="dltrain's compressed systems' compression.warmup_epochs (default 0.25, \"stages\")")
    ap.add_argument("--min-compress-bytes", type=int, default=4096)
    ap.add_argument("--partition-size", type=int, help="dltrain's [ps] partition_size in floats (default: left out, "
                    "\"auto\": the leader cuts the model so that the job's shards hold even shares)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compare"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--report", metavar="JSON", help="run nothing: rewrite the tables from a compare.json")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.out, exist_ok=True)
    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        return write(args, data)
    if os.geteuid() != 0:
        sys.exit("compare: needs root for the emulated links (ip netns, tc)")
    systems, models, links = args.systems.split(","), args.models.split(","), args.links.split(",")
    for m in models:
        if m not in SIZES["epochs"]:
            sys.exit(f"compare: --models: unknown model \"{m}\" (cnn, mlp-large, resnet20)")
    for ln in links:
        if ln not in ("loopback", *e2e.RATES):
            sys.exit(f"compare: --links: unknown link \"{ln}\" (loopback, {', '.join(e2e.RATES)})")
    for s in systems:
        base = s.split(":")[0]
        if base not in e2e.SYSTEMS or base in e2e.SINGLE or base == "dltrain-1w":
            sys.exit(f"compare: --systems: unknown system \"{s}\"")
        try:
            variant(s, 0)
        except ValueError:
            sys.exit(f"compare: --systems: \"{s}\": expected SYSTEM[:wEPOCHS][:spread][:overlap], e.g. dltrain-dgc-0.1%:w0:spread")
    grid = [float(x) for x in args.grid.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    size = {**SIZES, "models": models, "links": links, "seeds": seeds, "cap": args.cap_seconds}
    workdir = os.path.join(args.out, "e2e-logs")
    os.makedirs(workdir, exist_ok=True)
    # run.py's runners read these from their argument namespace.
    args.full, args.peers_to_the_end = False, True
    # The checkout as the runs start (what built the binaries and runs them).
    results, started, at_start = [], time.time(), commit()
    for link in links:
        ln = Links(args.workers + 1, e2e.RATES[link]) if link in e2e.RATES else None
        try:
            if ln:
                ln.__enter__()
            # One cluster per PS layout, one after the other: a host for the PS and one per
            # worker (agents of 1 core), or a shard beside each worker (agents of 2 cores).
            for spread in (False, True):
                layout = [s for s in systems if variant(s, 0)[2] == spread]
                if not layout:
                    continue
                with Cluster(args.workers if spread else args.workers + 1, ln, cores=2 if spread else 1) as cluster:
                    for model, seed, name, eff in itertools.product(models, seeds, layout, grid):
                        r = run_point(args, cluster, ln, link, model, seed, name, eff, size, workdir)
                        results.append(r)
                        print(f"[{link}] {model} {name} lr {r['lr']:g} (effective {eff:g}) seed {seed}: "
                              f"to {args.target} {r.get(f'seconds_to_{args.target}')}, final "
                              f"{r['final_accuracy']}, wall {r['wall_seconds']:.1f} s  "
                              f"[{time.time() - started:.0f} s elapsed]", flush=True)
        finally:
            if ln:
                ln.__exit__(None, None, None)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": at_start, "machine": machine(),
            "command": " ".join(["bench/e2e/compare.py"] + sys.argv[1:]), "elapsed_seconds": time.time() - started,
            "workers": args.workers, "size": {k: SIZES[k] for k in SIZES}, "seeds": seeds, "grid": grid,
            "models": models, "links": links, "systems": systems, "target": args.target,
            "cap_seconds": args.cap_seconds, "downlink_ratio": args.downlink_ratio,
            "compression_warmup": args.compression_warmup, "min_compress_bytes": args.min_compress_bytes,
            "partition_size": args.partition_size}
    write(args, {"meta": meta, "results": results})


def write(args, data):
    text = report(data)
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(text)
    print(text)
    if not args.no_docs:
        path = os.path.join(ROOT, "docs", "benchmarks", "comparison.md")
        doc = open(path).read()
        begin, end = "<!-- compare:begin -->", "<!-- compare:end -->"
        if begin in doc and end in doc:
            with open(path, "w") as f:
                f.write(doc[:doc.index(begin) + len(begin)] + "\n" + text + doc[doc.index(end):])


if __name__ == "__main__":
    main()
