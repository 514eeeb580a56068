#!/usr/bin/env python3
"""The scale model against real runs, then at scale.

1. Calibration (from bench/results/sim-calibration.json, written by calibrate.py, and
   bench/results/psload.json, written by bench/psload/run.py):
     - worker compute per step: each run's own measured compute, compress and data
       seconds per step (the workers' counters), so that the model is judged on what it
       adds: the exchange, the queueing at the shard, the synchronisation; plus the
       per-step remainder of the 1-worker loopback run (step bookkeeping);
       DDP: its 1-rank epoch per step on the same link, scaled by the slow-down the
       dltrain dense workers measured at the same N and link (the shared cores);
     - PS apply per step: psload's apply time per float (dense) or per frame (sparse),
       one worker; the sparse downlink's pull cost: the shard's service time per step
       at psload's peak sparse rate (1 ÷ steps/s, one I/O thread) less the apply;
     - links: one-way latency from psload's 1-float round trip (loopback; the veth
       links add nothing measurable) and per link the bandwidth that makes the 1-worker
       dense run's exchange time come out (fitted on N = 1 only);
     - bytes per step: the dense runs' measured bytes; DGC after warm-up from the wire
       format (scalesim.sparse_bytes) at the 1 % ratio.
   Every other run (N = 2, 4; DGC; DDP) is predicted, not fitted.
2. Scale: 8..256 workers at 1, 10 and 100 Gbit/s (goodput 0.968 of the nominal rate,
   as measured at 100 Mbit/s; one-way latency --scale-latency-us, an assumption), each
   worker on its own core with this machine's 1-worker loopback compute per step and a
   gamma jitter of CV 0.1 (an assumption: it is what makes BSP and SSP differ),
   Fashion-MNIST's 60,000 images per epoch at batch 64 per worker, for dense ASGD and
   DGC at 1 % both ways (1 shard and N/16 shards), BSP, SSP (s = 3) and DDP.

Writes bench/results/sim.json, bench/results/sim.md (the tables) and
docs/images/sim_scaling.svg.
Usage: bench/sim/run.py [--calibration FILE] [--psload FILE]
"""
import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import scalesim  # noqa: E402
import svgplot  # noqa: E402

MODEL_FLOATS = 702602  # mlp-large
# mlp-large's partitions at partition_size 262144 (ps::make_layout): l1's weights cut in
# three, the rest packed in one.
PARTITIONS = [200704, 200704, 200704, 100490]
DGC_RATIO = 0.01
EFFICIENCY_AT_SCALE = 0.968  # PS goodput ÷ nominal rate measured at 100 Mbit/s (bench/results/e2e.json)


def last_epoch(run):
    """Mean over ranks of the last epoch's trainer-measured seconds (eval excluded)."""
    e = str(run["epochs"])
    vals = [v[e] for v in run["epoch_seconds"].values() if e in v]
    return statistics.fmean(vals)


def per_step(run, rank, key):
    d = run["done"][rank]
    return d["counters"][key] / d["steps"]


def calibrate(cal, psl):
    runs = {(r["system"], r["link"], r["workers"]): r for r in cal["runs"]}
    dense1 = [r for r in psl["throughput"] if r["mode"] == "dense" and r["workers"] == 1][0]
    sparse1 = [r for r in psl["throughput"] if r["mode"] == "sparse" and r["workers"] == 1][0]
    psl_floats, psl_parts = dense1["floats"], dense1["partitions"]
    apply_dense = dense1["apply_us_per_frame"][0] * 1e-6 * psl_parts / psl_floats * MODEL_FLOATS
    apply_sparse = sparse1["apply_us_per_frame"][0] * 1e-6 * len(PARTITIONS)
    lat = psl.get("rtt_ms", {}).get("p50", 0.1) / 2 * 1e-3
    # The shard's service time per sparse step at saturation (its peak closed-loop rate
    # over 1..64 workers; one I/O thread) less the apply: the pull's x − x_seen and top-k.
    peak = max(r["worker_steps_per_s_total"] for r in psl["throughput"] if r["mode"] == "sparse")
    pull_sparse = max(0.0, 1.0 / peak - sparse1["apply_us_per_frame"][0] * 1e-6 * sparse1["partitions"]) * \
        MODEL_FLOATS / sparse1["floats"]
    base = runs[("dltrain-dense", "loopback", 1)]
    steps0 = base["done"]["0"]["steps"]
    c = base["done"]["0"]["counters"]
    other = last_epoch(base) / (steps0 / base["epochs"]) - (c["compute_seconds"] + c["data_seconds"] +
                                                            c["exchange_seconds"]) / steps0
    links = {}
    for link in sorted({r["link"] for r in cal["runs"]}):
        r = runs.get(("dltrain-dense", link, 1))
        if not r:
            continue
        b = (r["done"]["0"]["bytes_pushed"] + r["done"]["0"]["bytes_pulled"]) / r["done"]["0"]["steps"]
        ex = per_step(r, "0", "exchange_seconds")
        wire = ex - apply_dense - 2 * lat
        links[link] = {"bandwidth": b / wire, "latency": lat, "fit_exchange_s": ex, "bytes_per_step": b}
    return {"apply_dense_s": apply_dense, "apply_sparse_s": apply_sparse, "pull_sparse_s": pull_sparse,
            "latency_s": lat, "other_s": max(0.0, other), "links": links}


def predict_run(r, cal_p, runs):
    n, link = r["workers"], r["link"]
    lk = cal_p["links"][link]
    steps = (r["done"]["0"]["steps"] // r["epochs"]) if "done" in r else r["steps_per_epoch"]
    cfg = {"workers": n, "steps_per_epoch": steps, "epochs": r["epochs"], "bandwidth": lk["bandwidth"],
           "latency": lk["latency"]}
    if r["system"] == "ddp":
        d1 = runs[("ddp", link, 1)]
        c1 = last_epoch(d1) / d1["steps_per_epoch"]
        dn, dd1 = runs.get(("dltrain-dense", link, n)), runs[("dltrain-dense", link, 1)]
        slow = 1.0
        if dn:
            slow = statistics.fmean(per_step(dn, k, "compute_seconds") for k in dn["done"]) / \
                per_step(dd1, "0", "compute_seconds")
        cfg.update(mode="ddp", compute_s=c1 * slow, grad_bytes=4 * d1.get("parameters", MODEL_FLOATS))
    else:
        comp = []
        for k in sorted(r["done"], key=int):
            cs = r["done"][k]["counters"]
            comp.append((cs["compute_seconds"] + cs["compress_seconds"] + cs["data_seconds"]) / cs["steps"] +
                        cal_p["other_s"])
        mode = {"dltrain-dense-bsp": "bsp", "dltrain-dense-ssp2": "ssp"}.get(r["system"], "async")
        cfg.update(mode=mode, compute_s=comp)
        if mode == "ssp":
            cfg.update(ssp_bound=2)
        if r["system"].startswith("dltrain-dense"):
            b = lk["bytes_per_step"] / 2
            cfg.update(up_bytes=b, down_bytes=b, ps_apply_s=cal_p["apply_dense_s"])
        else:
            b = scalesim.sparse_bytes(PARTITIONS, DGC_RATIO)
            cfg.update(up_bytes=b, down_bytes=b, ps_apply_s=cal_p["apply_sparse_s"], ps_pull_s=cal_p["pull_sparse_s"])
    res = scalesim.simulate(cfg)
    return res["worker_epoch_seconds"][-1], cfg


def scale_predictions(cal_p, runs, workers, gbits, latency):
    dense1 = runs[("dltrain-dense", "loopback", 1)]
    dgc1 = runs[("dltrain-dgc-1%", "loopback", 1)]
    ddp1 = runs[("ddp", "loopback", 1)]

    def local(r):
        cs = r["done"]["0"]["counters"]
        return (cs["compute_seconds"] + cs["compress_seconds"] + cs["data_seconds"]) / cs["steps"] + cal_p["other_s"]

    c_dense, c_dgc = local(dense1), local(dgc1)
    c_ddp = last_epoch(ddp1) / ddp1["steps_per_epoch"]
    dense_b = scalesim.dense_bytes(MODEL_FLOATS, len(PARTITIONS))
    sparse_b = scalesim.sparse_bytes(PARTITIONS, DGC_RATIO)
    systems = {
        "dense ASGD, 1 shard": lambda n: dict(mode="async", compute_s=c_dense, up_bytes=dense_b, down_bytes=dense_b,
                                              ps_apply_s=cal_p["apply_dense_s"]),
        "dense ASGD, N/16 shards": lambda n: dict(mode="async", compute_s=c_dense, up_bytes=dense_b,
                                                  down_bytes=dense_b, ps_apply_s=cal_p["apply_dense_s"],
                                                  ps_shards=max(1, n // 16)),
        "DGC 1 % both ways, 1 shard": lambda n: dict(mode="async", compute_s=c_dgc, up_bytes=sparse_b,
                                                     down_bytes=sparse_b, ps_apply_s=cal_p["apply_sparse_s"],
                                                     ps_pull_s=cal_p["pull_sparse_s"]),
        "DGC 1 % both ways, N/16 shards": lambda n: dict(mode="async", compute_s=c_dgc, up_bytes=sparse_b,
                                                         down_bytes=sparse_b, ps_apply_s=cal_p["apply_sparse_s"],
                                                         ps_pull_s=cal_p["pull_sparse_s"], ps_shards=max(1, n // 16)),
        "BSP dense, 1 shard": lambda n: dict(mode="bsp", compute_s=c_dense, up_bytes=dense_b, down_bytes=dense_b,
                                             ps_apply_s=cal_p["apply_dense_s"]),
        "SSP s=3 dense, 1 shard": lambda n: dict(mode="ssp", ssp_bound=3, compute_s=c_dense, up_bytes=dense_b,
                                                 down_bytes=dense_b, ps_apply_s=cal_p["apply_dense_s"]),
        "DDP ring all-reduce": lambda n: dict(mode="ddp", compute_s=c_ddp, grad_bytes=4 * MODEL_FLOATS),
    }
    out = []
    for g in gbits:
        bw = g * 1e9 / 8 * EFFICIENCY_AT_SCALE
        for name, make in systems.items():
            base = None
            for n in [1] + workers:
                steps = math.ceil(60000 / (64 * n))
                cfg = dict(make(n), workers=n, steps_per_epoch=steps, bandwidth=bw, latency=latency,
                           compute_cv=0.1, seed=1)
                t = scalesim.simulate(cfg)["epoch_seconds"][0]
                if n == 1:
                    base = t
                    continue
                out.append({"gbit": g, "system": name, "workers": n, "epoch_seconds": round(t, 4),
                            "efficiency": round(base / (n * t), 4), "one_worker_epoch_seconds": round(base, 4),
                            "steps_per_worker": steps})
    return out, {"compute_dense_s": c_dense, "compute_dgc_s": c_dgc, "compute_ddp_s": c_ddp,
                 "dense_bytes": dense_b, "sparse_bytes": sparse_b}


def plot(scale, path):
    systems = list(dict.fromkeys(r["system"] for r in scale))
    gbits = sorted({r["gbit"] for r in scale})
    w, h = 330, 260
    el = []
    for i, g in enumerate(gbits):
        rows = [r for r in scale if r["gbit"] == g]
        ser_t = [(s, j, j % 2, [(r["workers"], r["epoch_seconds"]) for r in rows if r["system"] == s])
                 for j, s in enumerate(systems)]
        ser_e = [(s, j, j % 2, [(r["workers"], r["efficiency"]) for r in rows if r["system"] == s])
                 for j, s in enumerate(systems)]
        el += svgplot.panel(i * w, 0, w, h, f"{g:g} Gbit/s: epoch time", ser_t, "workers", "seconds", ylog=True)
        el += svgplot.panel(i * w, h, w, h, f"{g:g} Gbit/s: scaling efficiency", ser_e, "workers",
                            "T(1) / (N · T(N))", ylim=(0.0, 1.0))
    el += svgplot.legend(3 * w + 10, 40, [(s, j, j % 2) for j, s in enumerate(systems)])
    with open(path, "w") as f:
        f.write(svgplot.document(3 * w + 200, 2 * h, el, "Scale model: mlp-large, Fashion-MNIST epoch, batch 64"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", default=",".join(os.path.join(ROOT, "bench", "results", f) for f in
                                                      ("sim-calibration.json", "sim-calibration-long.json")),
                    help="comma-separated calibration files (calibrate.py); the first one's parameters go into "
                         "the scale predictions")
    ap.add_argument("--scale-latency-us", type=float, default=25.0,
                    help="one-way link latency of the scale predictions (an assumption: a switched LAN hop)")
    ap.add_argument("--psload", default=os.path.join(ROOT, "bench", "results", "psload.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "images", "sim_scaling.svg"))
    args = ap.parse_args()
    with open(args.psload) as f:
        psl = json.load(f)
    md, tables = [], []
    for path in args.calibration.split(","):
        with open(path) as f:
            cal = json.load(f)
        params = calibrate(cal, psl)
        runs = {(r["system"], r["link"], r["workers"]): r for r in cal["runs"]}
        rows = []
        for r in sorted(cal["runs"], key=lambda r: (["loopback", "1gbit", "100mbit"].index(r["link"]), r["system"],
                                                     r["workers"])):
            if r["link"] not in params["links"]:
                continue
            meas = last_epoch(r)
            pred, cfg = predict_run(r, params, runs)
            # The 1-worker dense run fixes the link's bandwidth; the 1-rank DDP run is DDP's compute.
            fitted = r["workers"] == 1 and r["system"] in ("dltrain-dense", "ddp")
            rows.append({"link": r["link"], "system": r["system"], "workers": r["workers"],
                         "measured_s": round(meas, 3), "predicted_s": round(pred, 3),
                         "error": round((pred - meas) / meas, 4), "fitted": fitted,
                         "steps_per_epoch": cfg["steps_per_epoch"]})
        tables.append({"file": os.path.relpath(path, ROOT), "meta": cal["meta"], "parameters": params, "rows": rows})
        md += [f"**{os.path.relpath(path, ROOT)}** ({cal['meta']['train_samples']} training images, "
               f"{cal['meta']['epochs']} epochs; the last epoch compared)", "",
               "| link | system | N | steps/epoch per worker | measured s | predicted s | error |",
               "|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['link']} | {r['system']} | {r['workers']} | {r['steps_per_epoch']} | "
                      f"{r['measured_s']:.3f} | {r['predicted_s']:.3f} | {100 * r['error']:+.1f} %"
                      f"{' (fitted)' if r['fitted'] else ''} |")
        within = [abs(r["error"]) <= 0.15 for r in rows if not r["fitted"]]
        md += ["", f"Predicted (not fitted) runs within 15 %: {sum(within)} of {len(within)}; "
               f"median |error| {100 * statistics.median(abs(r['error']) for r in rows if not r['fitted']):.1f} %.", ""]
    # The scale predictions use the first calibration's parameters.
    params = tables[0]["parameters"]
    with open(args.calibration.split(",")[0]) as f:
        runs = {(r["system"], r["link"], r["workers"]): r for r in json.load(f)["runs"]}
    scale, scale_inputs = scale_predictions(params, runs, [8, 16, 32, 64, 128, 256], [1, 10, 100],
                                            args.scale_latency_us * 1e-6)
    scale_inputs["latency_s"] = args.scale_latency_us * 1e-6
    plot(scale, args.plot)
    out = {"meta": {"psload": psl["meta"]}, "calibrations": tables, "scale_inputs": scale_inputs, "scale": scale}
    with open(os.path.join(args.out, "sim.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    gb = sorted({r["gbit"] for r in scale})
    systems = list(dict.fromkeys(r["system"] for r in scale))
    for g in gb:
        md.append(f"**{g:g} Gbit/s** — epoch seconds (scaling efficiency)")
        md.append("")
        ns = sorted({r["workers"] for r in scale})
        md.append("| system | " + " | ".join(f"N={n}" for n in ns) + " |")
        md.append("|---|" + "---|" * len(ns))
        for s in systems:
            cells = []
            for n in ns:
                r = next(x for x in scale if x["gbit"] == g and x["system"] == s and x["workers"] == n)
                cells.append(f"{r['epoch_seconds']:.3g} ({r['efficiency']:.2f})")
            md.append(f"| {s} | " + " | ".join(cells) + " |")
        md.append("")
    with open(os.path.join(args.out, "sim.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(json.dumps([t["parameters"] for t in tables], indent=1))


if __name__ == "__main__":
    main()
