#!/usr/bin/python3
"""Metrics overhead benchmark: images/s of one job while its cluster's metrics endpoints
are scraped hard, against the same job while nobody scrapes them.

A standalone cluster (`dltrain-agent --standalone`, a leader and 3 agents of 1 core on
loopback, progress every second) trains the same job (CNN, 2 workers, 1 PS shard,
Fashion-MNIST) --reps times in each mode, alternating (scraped, quiet, scraped, ...) so
that a drift of the machine's load affects both alike:

  scraped   every agent's and the leader's /metrics read every --interval seconds
            (default 0.2 s, five times Prometheus's fastest usual 1 s) by this script
  quiet     nobody reads them

Per-step collection (six clock reads per step for the phase times, the counters in the
progress events) is always on: dltrain has no switch to turn it off, so this measures
what serving and scraping cost; docs/benchmarks.md says what the collection costs by
count. Throughput is the job summary's images_per_sec (sum of the workers' latest
epoch throughputs). Reports the median per mode and the relative difference.

Usage (after scripts/setup and a build; DLTRAIN_BUILD_DIR picks the build directory):
  bench/observe/overhead.py [--reps 3] [--interval 0.2] [--out bench/results/observe-overhead.json]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import standalone  # noqa: E402  (bench/standalone.py)

ROOT = standalone.ROOT

JOB = """name = "overhead"
data_dir = "/usr/share/datasets/fashion-mnist"
model = "cnn"
workers = 2
ps_shards = 1
batch_size = 32
epochs = 2
train_samples = 8000
test_samples = 2000
[optimizer]
lr = 0.05
"""


def start_cluster(state):
    proc, client, settings = standalone.start_cluster(state, 3, ["--progress-interval", "1"])
    agents = json.loads(subprocess.check_output(client + ["agents", "--json"]))["agents"]
    endpoints = [settings["metrics_endpoint"]] + [a["metrics_endpoint"] for a in agents]
    return proc, client, endpoints


def scrape_loop(endpoints, interval, stop, count):
    while not stop.is_set():
        for ep in endpoints:
            with urllib.request.urlopen("http://%s/metrics" % ep, timeout=10) as r:
                r.read()
            count[0] += 1
        stop.wait(interval)


def run_job(client, job_file, endpoints, scraped, interval):
    stop, count = threading.Event(), [0]
    t = threading.Thread(target=scrape_loop, args=(endpoints, interval, stop, count)) if scraped else None
    if t:
        t.start()
    out = subprocess.run(client + ["submit", job_file, "--follow", "--json"], capture_output=True, text=True,
                         timeout=1800)
    stop.set()
    if t:
        t.join()
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    if summary.get("state") != "succeeded":
        sys.exit("job failed: " + out.stdout[-2000:])
    return {"mode": "scraped" if scraped else "quiet", "images_per_sec": summary["images_per_sec"],
            "wall_seconds": summary["wall_seconds"], "test_accuracy": summary["test_accuracy"],
            "scrapes": count[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="jobs per mode (default 3)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between two scrapes of every endpoint")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "observe-overhead.json"))
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="dltrain-overhead-")
    proc, client, endpoints = start_cluster(state)
    runs = []
    try:
        job_file = os.path.join(state, "job.toml")
        with open(job_file, "w") as f:
            f.write(JOB)
        for rep in range(a.reps):
            for scraped in (True, False):
                r = run_job(client, job_file, endpoints, scraped, a.interval)
                runs.append(r)
                print(json.dumps(r), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    med = {m: statistics.median(r["images_per_sec"] for r in runs if r["mode"] == m) for m in ("scraped", "quiet")}
    result = {"reps": a.reps, "interval_s": a.interval, "load_average": os.getloadavg(),
              "median_images_per_sec": med, "relative_cost": 1 - med["scraped"] / med["quiet"], "runs": runs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print("median images/s: scraped %.0f, quiet %.0f; cost %.2f %% (load average %.1f)" %
          (med["scraped"], med["quiet"], 100 * result["relative_cost"], result["load_average"][0]))


if __name__ == "__main__":
    main()
