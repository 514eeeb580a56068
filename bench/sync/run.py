#!/usr/bin/python3
"""The consistency models and overlap, side by side, on real clusters.

For each model, link, consistency model (async, ssp with staleness 2, sync = BSP),
compression (dense, DGC 0.1 %) and overlap (off, on) and seed, one dltrain job on a
cluster of real processes: a leader and one agent per task (workers + 1 PS shard, one
core each), on loopback or on emulated links (each agent in its own network namespace
behind a veth pair rate-limited with tc tbf, bench/compression_bench.py's Links). Reports
final test accuracy, wall time, time to the target accuracy and the shard's barrier
record (waits, max lead) per run, and the effect of overlap per configuration.

Usage (as root, after scripts/setup):
  bench/sync/run.py                      the default matrix (see --help)
  bench/sync/run.py --models cnn --links 100mbit --modes async,sync --codecs dense
Writes bench/results/sync.json and replaces the section between the sync markers of
docs/benchmarks/consistency.md (unless --no-docs).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from compression_bench import BIN, Cluster, Links  # noqa: E402
from standalone import build_commit, machine  # noqa: E402  (a result file's record)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "sim"))
import svgplot  # noqa: E402  (bench/sim/svgplot.py)

MODES = {
    "async": 'sync = "async"\n',
    "ssp2": 'sync = "ssp"\nstaleness = 2\n',
    "sync": 'sync = "sync"\n',
}
CODECS = {"dense": 1.0, "dgc-1%": 0.01, "dgc-0.1%": 0.001}  # uplink density
SYNC_LINE = re.compile(r"sync \w+: (\d+) steps applied, (\d+) late pushes dropped, (\d+) pulls waited \(([\d.]+) s "
                       r"in all\), (\d+) workers dropped by the barrier timeout, (\d+) connections closed mid-step, "
                       r"(\d+) rejoins, max lead (\d+) steps")


def job_toml(args, model, mode, codec, overlap, seed):
    return (f'name = "sync-bench-{model}-{mode}-{codec}-{"overlap" if overlap else "plain"}-s{seed}"\n'
            f'model = "{model}"\ndataset = "fashion-mnist"\nepochs = {args.epochs}\nworkers = {args.workers}\n'
            f"ps_shards = 1\nbatch_size = {args.batch_size}\ntrain_samples = {args.train_samples}\n"
            f"test_samples = {args.test_samples}\nseed = {seed}\noverlap = {'true' if overlap else 'false'}\n"
            + MODES[mode] +
            f'[optimizer]\nlr = {args.lr}\nmomentum = {args.momentum}\nlr_schedule = "cosine"\n'
            f"warmup_epochs = {args.lr_warmup}\n"
            f"weight_decay = {args.weight_decay}\n"
            + ("" if codec == "dense" else
               f'[compression]\nmethod = "dgc"\nratio = {CODECS[codec]}\ndownlink_ratio = {args.downlink_ratio}\n'
               f"warmup_epochs = {args.dgc_warmup}\n"
               f'warmup_schedule = "{args.dgc_warmup_schedule}"\n'
               + f"min_compress_bytes = {args.min_compress_bytes}\n")
            + (f"[ps]\npartition_size = {args.partition_size}\n" if args.partition_size else ""))


def run_job(cluster, args, model, mode, codec, overlap, seed):
    path = os.path.join(cluster.dir, f"{model}-{mode}-{codec}-{overlap}-{seed}.toml")
    with open(path, "w") as f:
        f.write(job_toml(args, model, mode, codec, overlap, seed))
    t0 = time.time()
    p = subprocess.Popen([f"{BIN}/dltrain", "--leader", cluster.url, "--token", cluster.token, "submit", path,
                          "--follow", "--json"], stdout=subprocess.PIPE, text=True)
    curve, summary, job = [], None, None
    for line in p.stdout:
        ev = json.loads(line)
        job = job or ev.get("job")
        if ev.get("event") == "epoch_end" and "test_accuracy" in ev:
            curve.append({"epoch": ev["epoch"], "seconds": time.time() - t0, "test_accuracy": ev["test_accuracy"]})
        if ev.get("event") == "summary":
            summary = ev
    p.wait(timeout=args.job_timeout)
    if summary is None or summary["state"] != "succeeded":
        raise RuntimeError(f"{model} {mode} {codec} overlap={overlap} seed {seed}: {summary}")
    record = None
    if mode != "async" and job:
        # The shard writes its record when it stops, which may be just after the summary.
        m = None
        for _ in range(50):
            m = SYNC_LINE.search(cluster.client("logs", job, "--task", "ps-0", check=False).stdout)
            if m:
                break
            time.sleep(0.2)
        if m:
            keys = ["steps", "late_pushes", "waits", "wait_seconds", "dropped", "departures", "rejoins", "max_lead"]
            record = {k: float(v) if k == "wait_seconds" else int(v) for k, v in zip(keys, m.groups())}
    hit = next((c["seconds"] for c in curve if c["test_accuracy"] >= args.target[model]), None)
    return {"model": model, "mode": mode, "codec": codec, "overlap": overlap, "seed": seed,
            "final_accuracy": summary["test_accuracy"], "wall_seconds": summary["wall_seconds"],
            "bytes_pushed": summary.get("bytes_pushed"), "bytes_pulled": summary.get("bytes_pulled"),
            "compression_ratio_up_after_warmup": summary.get("compression_ratio_up_after_warmup"),
            "seconds_to_target": hit, "curve": curve, "barrier": record}


def mean_sd(xs, fmt="{:.4g}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return fmt.format(statistics.mean(xs)) + " ± " + "{:.2g}".format(statistics.stdev(xs))


def to_target(rs):
    """Mean time to the target over the runs that reached it, and how many did."""
    hit = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
    text = mean_sd(hit, "{:.1f}")
    return text if len(hit) == len(rs) or not hit else f"{text} ({len(hit)} of {len(rs)})"


def first(n):
    return f"the first {n}" if n else "all"


def report(datas):
    """The tables for one or more runs of this script (their JSON), one row per
    configuration (model, link, workers, partition size, sync, codec, overlap)."""
    md = []
    results = []
    for data in datas:
        args = data["args"]
        part = args.get("partition_size") or "default (262,144)"
        built = f", commit {data['commit']}" if data.get("commit") else ""
        md.append(f"- `{data['command']}` ({data['date']}{built}{', stopped early' if data.get('partial') else ''}): "
                  f"{args['workers']} workers + 1 PS shard, each on its own agent with one core; machine: "
                  f"{data['machine']}; batch {args['batch_size']} per worker, {args['epochs']} epochs on "
                  f"{first(args['train_samples'])} training images, test accuracy on {first(args['test_samples'])}; "
                  f"lr {args['lr']}, momentum {args.get('momentum', 0.9)}, partition size {part}; targets "
                  f"{args['target']}.")
        for r in data["results"]:
            codec = r["codec"] if r["codec"] == "dense" else \
                f"{r['codec']}, down {args.get('downlink_ratio', 0.01):g}, warm-up {args.get('dgc_warmup', 1.0):g}" + \
                (f" ({args['dgc_warmup_schedule']})" if args.get("dgc_warmup_schedule", "per_epoch") != "per_epoch" else "") + \
                (f", dense < {args['min_compress_bytes']} B" if args.get("min_compress_bytes") else "")
            results.append(dict(r, codec=codec, workers=args["workers"],
                                partition=args.get("partition_size") or 262144))

    def key(r):
        return (r["model"], r["link"], r["workers"], r["partition"], r["mode"], r["codec"], r["overlap"])

    md += ["", "| model | link | workers | partition | sync | codec | overlap | seeds | final accuracy | wall s | "
           "s to target | MB pushed | barrier waits | max lead |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys(key(r) for r in results))
    for k in keys:
        rs = [r for r in results if key(r) == k]
        b = [r["barrier"] for r in rs if r["barrier"]]
        md.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[5]} | {'on' if k[6] else 'off'} | {len(rs)} | "
                  f"{mean_sd([r['final_accuracy'] for r in rs])} | {mean_sd([r['wall_seconds'] for r in rs], '{:.1f}')} | "
                  f"{to_target(rs)} | "
                  f"{mean_sd([r['bytes_pushed'] / 1e6 for r in rs if r.get('bytes_pushed')], '{:.1f}')} | "
                  f"{mean_sd([x['waits'] for x in b], '{:.0f}') if b else '—'} | "
                  f"{max(x['max_lead'] for x in b) if b else '—'} |")
    md += ["", "Overlap's effect (same configuration otherwise; mean wall time and time to target):", "",
           "| model | link | workers | partition | sync | codec | wall s off → on | change | s to target off → on | "
           "change |", "|---|---|---|---|---|---|---|---|---|---|"]

    def mean(rs, f):
        xs = [r[f] for r in rs if r[f] is not None]
        return statistics.mean(xs) if len(xs) == len(rs) else None

    for k in keys:
        if k[6]:
            continue
        off = [r for r in results if key(r) == k]
        on = [r for r in results if key(r) == k[:6] + (True,)]
        if not on:
            continue
        row = [str(x) for x in k[:6]]
        for f in ("wall_seconds", "seconds_to_target"):
            a, b2 = mean(off, f), mean(on, f)
            if a is None or b2 is None:
                row += ["n/a (target not reached in every run)" if f == "seconds_to_target" else "n/a", ""]
            else:
                row += [f"{a:.1f} → {b2:.1f}", f"{100 * (b2 - a) / a:+.1f} %"]
        md.append("| " + " | ".join(row) + " |")
    return "\n".join(md) + "\n"


def plot(datas, path):
    """Test accuracy at each epoch's end, the mean over seeds, one line per configuration
    (the report's rows), as an SVG chart."""
    groups = {}
    for data in datas:
        args = data["args"]
        for r in data["results"]:
            codec = r["codec"] if r["codec"] == "dense" else \
                f"{r['codec']}, warm-up {args.get('dgc_warmup', 1.0):g}" + \
                (f", dense < {args['min_compress_bytes']} B" if args.get("min_compress_bytes") else "") + \
                (", dense pulls" if args.get("downlink_ratio", 0.01) >= 1 else "")
            label = f"{r['model']} {r['mode']} {args['workers']}w {codec}{' overlap' if r['overlap'] else ''}"
            for c in r["curve"]:
                groups.setdefault(label, {}).setdefault(c["epoch"], []).append(c["test_accuracy"])
    series = [(label, j, j // 9, sorted((e, statistics.mean(v)) for e, v in pts.items()))
              for j, (label, pts) in enumerate(groups.items())]
    w, h = 560, 360
    el = svgplot.panel(0, 0, w, h, "Test accuracy at the end of each epoch (mean over seeds)", series, "epoch",
                       "test accuracy", xlog2=False)
    el += svgplot.legend(w + 10, 40, [(label, j, di) for label, j, di, _ in series])
    with open(path, "w") as f:
        f.write(svgplot.document(w + 420, max(h, 60 + 16 * len(series)), el, "bench/sync/run.py"))


def rewrite_docs(md):
    path = os.path.join(ROOT, "docs", "benchmarks", "consistency.md")
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- sync:begin -->", "<!-- sync:end -->"
    if begin not in text:
        text += ("\n## Consistency models and overlap\n\nThe consistency models and overlap of docs/training.md on "
                 "real clusters (`bench/sync/run.py`).\n\n" + begin + "\n" + end + "\n")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + md + end + tail)


def save(args, results, partial):
    """Writes what has been measured so far (after every run, so a stopped matrix keeps its runs)."""
    # Paths inside the checkout are kept relative to it: the results name no machine's directories.
    stored = {k: (os.path.relpath(v, ROOT) if isinstance(v, str) and v.startswith(ROOT + os.sep) else v)
              for k, v in vars(args).items()}
    data = {"args": stored, "results": results, "date": datetime.date.today().isoformat(),
            "machine": machine(), "commit": build_commit(BIN),
            "command": "bench/sync/run.py " + " ".join(sys.argv[1:]), "partial": partial}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"sync-{args.tag}.json" if args.tag else "sync.json"), "w") as f:
        json.dump(data, f, indent=2)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn", help="comma list of cnn,mlp-large (default cnn)")
    ap.add_argument("--links", default="100mbit", help="comma list of loopback,1gbit,100mbit (default 100mbit)")
    ap.add_argument("--modes", default="async,ssp2,sync", help="comma list of " + ",".join(MODES))
    ap.add_argument("--codecs", default="dense", help="comma list of " + ",".join(CODECS).replace("%", "%%"))
    ap.add_argument("--overlap", default="off,on", help="comma list of off,on")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-samples", type=int, default=12000)
    ap.add_argument("--test-samples", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9, help="optimizer.momentum, the shard's (default 0.9)")
    ap.add_argument("--lr-warmup", type=float, default=0.3, help="optimizer.warmup_epochs (default 0.3)")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="optimizer.weight_decay (default 0)")
    ap.add_argument("--downlink-ratio", type=float, default=0.01,
                    help="DGC codecs: compression.downlink_ratio (default 0.01; 1 = dense pulls)")
    ap.add_argument("--dgc-warmup", type=float, default=1.0,
                    help="DGC codecs: compression.warmup_epochs, the sparsity warm-up (default 1)")
    ap.add_argument("--dgc-warmup-schedule", choices=["per_epoch", "stages"], default="per_epoch",
                    help="DGC codecs: compression.warmup_schedule (default per_epoch)")
    ap.add_argument("--min-compress-bytes", type=int, default=0,
                    help="DGC codecs: compression.min_compress_bytes (default 0: every tensor sparsified)")
    ap.add_argument("--partition-size", type=int,
                    help="[ps] partition_size in floats (default: the job default, 262144: the CNN is one "
                         "partition, so overlap has nothing to push before backward ends)")
    ap.add_argument("--tag", help="write sync-TAG.json instead of sync.json (and, unless --no-docs, still the docs)")
    ap.add_argument("--target-cnn", type=float, default=0.80)
    ap.add_argument("--target-mlp-large", type=float, default=0.78)
    ap.add_argument("--job-timeout", type=int, default=1800)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--plot", metavar="SVG", help="with --report: also draw the accuracy curves into this file")
    ap.add_argument("--report", metavar="JSON[,JSON...]",
                    help="run nothing: write the tables of these runs' JSON files (each one run of this script, or "
                         "{\"runs\": [...]} of several) and, unless --no-docs, the docs")
    args = ap.parse_args()
    if args.report:
        datas = []
        for path in args.report.split(","):
            with open(path) as f:
                d = json.load(f)
            datas += d["runs"] if "runs" in d else [d]  # a collection of runs, or one run
        md = report(datas)
        print(md)
        if args.plot:
            plot(datas, args.plot)
        if not args.no_docs:
            rewrite_docs(md)
        return
    args.target = {"cnn": args.target_cnn, "mlp-large": args.target_mlp_large}
    if os.geteuid() != 0 and args.links != "loopback":
        sys.exit("bench/sync/run.py: emulated links need root (ip netns, tc)")
    results = []
    hosts = args.workers + 1
    for link in args.links.split(","):
        links = Links(hosts, link) if link != "loopback" else None
        try:
            if links:
                links.__enter__()
            with Cluster(hosts, links, agent_log_level="info") as cluster:
                for model in args.models.split(","):
                    for codec in args.codecs.split(","):
                        for mode in args.modes.split(","):
                            for ov in args.overlap.split(","):
                                for seed in [int(s) for s in args.seeds.split(",")]:
                                    r = run_job(cluster, args, model, mode, codec, ov == "on", seed)
                                    r["link"] = link
                                    results.append(r)
                                    save(args, results, partial=True)
                                    print(f"[{link}] {model} {mode} {codec} overlap {ov} seed {seed}: accuracy "
                                          f"{r['final_accuracy']:.4f}, {r['wall_seconds']:.1f} s, to target "
                                          f"{r['seconds_to_target']}, barrier {r['barrier']}", flush=True)
        finally:
            if links:
                links.__exit__(None, None, None)
    data = save(args, results, partial=False)
    md = report([data])
    print(md)
    if not args.no_docs:
        rewrite_docs(md)


if __name__ == "__main__":
    main()
