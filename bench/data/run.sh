#!/usr/bin/env bash
# Data-path benchmark (docs/benchmarks/data.md, "Data loading"): the streaming loader's
# throughput on PNG and JPEG ImageFolder copies of Fashion-MNIST at 1 and 2 threads,
# then the main job on the IDX files and on the PNG copy (same model, optimiser and
# seed) on a local standalone cluster, with and without the ImageFolder decoded cache.
# Writes bench/results/data.json (data-jobs.json with --jobs-only; one JSON object per
# line) and prints it.
#
# Usage: bench/data/run.sh [--loader-only | --jobs-only | --resnet]
#   --resnet: only resnet20 on the 32×32 PNG copy, dense against DGC 0.1 %
#             (bench/data/resnet20-{dense,dgc}.toml; writes bench/results/data-resnet.json)
# Environment: DLTRAIN_BUILD_DIR (default: build), DATA_ROOT (default: /var/tmp/dltrain)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
  exit 0
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${DLTRAIN_BUILD_DIR:-$root/build}/bin"
data="${DATA_ROOT:-/var/tmp/dltrain}"
out="$root/bench/results/data.json"
[[ "${1:-}" == "--jobs-only" ]] && out="$root/bench/results/data-jobs.json"
[[ "${1:-}" == "--resnet" ]] && out="$root/bench/results/data-resnet.json"
idx=/usr/share/datasets/fashion-mnist
: > "$out"

for fmt in png jpeg; do
  for size in 28 32; do
    dir="$data/fashion-mnist-$fmt$size"
    [[ -d "$dir/train" ]] || "$bin/dltrain" dataset from-idx "$idx" "$dir" --format "$fmt" --size "$size" >/dev/null
  done
done
for fmt in png jpeg; do
  [[ "${1:-}" == "--jobs-only" || "${1:-}" == "--resnet" ]] && break
  for threads in 1 2; do
    "$bin/loader_bench" "$data/fashion-mnist-${fmt}32" --threads "$threads" --images 20000 --size 32 --augment \
      | tee -a "$out"
  done
done
[[ "${1:-}" == "--loader-only" ]] && exit 0

# A standalone cluster of its own (3 agents × 1 core), stopped at the end.
home="$(mktemp -d)"
trap 'kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; rm -rf "$home"' EXIT
HOME="$home" "$bin/dltrain-agent" --standalone --agents 3 >"$home/standalone.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do
  [[ -f "$home/.local/state/dltrain/standalone.json" ]] && break
  sleep 0.2
done
run_job() {
  HOME="$home" "$bin/dltrain" submit "$1" --follow --json >"$home/job.jsonl"
  python3 - "$home/job.jsonl" "$2" <<'PY' | tee -a "$out"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
summary = lines[-1]
epochs = [l for l in lines if l.get("event") == "epoch_end"]
waits = [l.get("data_wait_seconds") for l in epochs if l.get("data_wait_seconds") is not None]
secs = [l["epoch_seconds"] for l in epochs if l.get("data_wait_seconds") is not None]
# The job's throughput per epoch: the workers' images/s of that epoch, added up.
per_epoch = {}
for l in epochs:
    per_epoch[l["epoch"]] = per_epoch.get(l["epoch"], 0.0) + l.get("images_per_sec", 0.0)
series = [round(per_epoch[e], 1) for e in sorted(per_epoch)]
later = sorted(series[1:])
print(json.dumps({"run": sys.argv[2], "test_accuracy": summary.get("test_accuracy"),
                  "bytes_pushed": summary.get("bytes_pushed"), "bytes_pulled": summary.get("bytes_pulled"),
                  "wall_seconds": summary.get("wall_seconds"), "images_per_sec": summary.get("images_per_sec"),
                  "epoch_images_per_sec": series,
                  "median_images_per_sec_after_epoch_1": later[len(later) // 2] if later else None,
                  "per_epoch_accuracy": [l["test_accuracy"] for l in epochs if "test_accuracy" in l],
                  "data_wait_fraction": (sum(waits) / sum(secs)) if secs else None}))
PY
}
if [[ "${1:-}" == "--resnet" ]]; then
  run_job "$root/bench/data/resnet20-dense.toml" "resnet20-png32-dense"
  run_job "$root/bench/data/resnet20-dgc.toml" "resnet20-png32-dgc"
  exit 0
fi
run_job "$root/configs/jobs/fashion-mnist.toml" "cnn-idx"
run_job "$root/bench/data/cnn-imagefolder.toml" "cnn-imagefolder-png28"
# The same without the decoded cache: every epoch reads and decodes every file.
sed 's/^seed = 1$/seed = 1\nloader_cache_mb = 0/' "$root/bench/data/cnn-imagefolder.toml" >"$home/nocache.toml"
run_job "$home/nocache.toml" "cnn-imagefolder-png28-nocache"
