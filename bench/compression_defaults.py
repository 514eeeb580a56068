#!/usr/bin/python3
"""What `method = "dgc"` alone costs in accuracy: DGC's recipe as the defaults, against
dense training and against DGC's bare mechanism (the defaults before: no warm-up, every
tensor sparsified, dense pulls), on the main job's CNN and on a small network of a
user's own (TorchScript: depthwise convolutions and GroupNorm, a few thousand
parameters), on one standalone cluster, one after the other.

Usage (as root or not, after `scripts/setup --bench`: Debian's python3-torch scripts the
small network):
  bench/compression_defaults.py [--seeds 1] [--out bench/results]
Writes OUT/compression-defaults.json (every run, with commit, date, CPU model and
command) and prints the table docs/compression.md's "Defaults" quotes.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from standalone import commit, machine, run_job, start_cluster  # noqa: E402

SMALL_NET = r'''
import sys, torch, torch.nn as nn
class Small(nn.Module):
    """A user's small net: depthwise-separable convolutions with GroupNorm."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.g1 = nn.GroupNorm(4, 16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.pw = nn.Conv2d(16, 32, 1, bias=False)
        self.g2 = nn.GroupNorm(4, 32)
        self.dw2 = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
        self.pw2 = nn.Conv2d(32, 64, 1, bias=False)
        self.g3 = nn.GroupNorm(8, 64)
        self.fc = nn.Linear(64, 10)
    def forward(self, x):
        x = torch.relu(self.g1(self.stem(x)))
        x = nn.functional.max_pool2d(torch.relu(self.g2(self.pw(self.dw(x)))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.g3(self.pw2(self.dw2(x)))), 2)
        return self.fc(x.mean((2, 3)))
torch.manual_seed(1)
m = Small()
torch.jit.save(torch.jit.script(m), sys.argv[1])
print(sum(p.numel() for p in m.parameters()))
'''

VARIANTS = {
    "dense": "",
    "dgc (defaults)": '[compression]\nmethod = "dgc"\n',
    "dgc (bare: no warm-up, every tensor sparse, dense pulls)":
        '[compression]\nmethod = "dgc"\nwarmup_epochs = 0\nmin_compress_bytes = 0\ndownlink_ratio = 1\n',
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dltrain-defaults-")
    net = os.path.join(work, "small.pt")
    # torch.jit.script reads the class's source: the script is a file, not `-c`.
    script = os.path.join(work, "small_net.py")
    with open(script, "w") as f:
        f.write(SMALL_NET)
    made = subprocess.run(["/usr/bin/python3", script, net], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit("scripting the small network needs Debian's python3-torch: " + made.stderr[-500:])
    small_params = int(made.stdout.split()[-1])
    # The main job as the quick start runs it (2 workers, ASGD, 8 epochs, all the data),
    # and the small net as a user tried it (2 workers, BSP, 3 epochs).
    models = {
        "cnn (the main job)": 'model = "cnn"\nepochs = 8\nworkers = 2\nsync = "async"\n'
                              '[optimizer]\nlr = 0.05\nwarmup_epochs = 0.5\n',
        f"small user net ({small_params} parameters)": f'model = "torchscript"\nmodel_file = "{net}"\nepochs = 3\n'
                                                       'workers = 2\nsync = "sync"\n[optimizer]\nlr = 0.05\n'
                                                       'warmup_epochs = 0.3\n',
    }
    proc, client, _ = start_cluster(work, agents=3, extra_args=["--cores-per-agent", "1"])
    results = []
    try:
        for model, text in models.items():
            head, opt = text.split("[optimizer]\n")
            for seed in [int(s) for s in args.seeds.split(",")]:
                for variant, comp in VARIANTS.items():
                    path = os.path.join(work, f"job-{len(results)}.toml")
                    with open(path, "w") as f:
                        f.write(f'name = "defaults"\ndataset = "fashion-mnist"\nbatch_size = 64\nseed = {seed}\n{head}'
                                f"[optimizer]\n{opt}{comp}")
                    r = run_job(client, path)
                    results.append({"model": model, "variant": variant, "seed": seed, **r})
                    print(f"{model} | {variant} | seed {seed}: {r['test_accuracy']:.4f} in {r['wall_seconds']:.1f} s",
                          flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
            "command": " ".join(["bench/compression_defaults.py"] + sys.argv[1:])}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compression-defaults.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"\nMeasured {meta['date']} at `{meta['commit']}` on {meta['machine']}: `{meta['command']}`\n")
    print("| model | compression | final test accuracy | against dense (points) | wall s |\n|---|---|---|---|---|")
    for model in models:
        dense = statistics.mean(r["test_accuracy"] for r in results if r["model"] == model and r["variant"] == "dense")
        for variant in VARIANTS:
            rs = [r for r in results if r["model"] == model and r["variant"] == variant]
            acc = statistics.mean(r["test_accuracy"] for r in rs)
            print(f"| {model} | {variant} | {acc:.4f} | {100 * (acc - dense):+.2f} | "
                  f"{statistics.mean(r['wall_seconds'] for r in rs):.1f} |")


if __name__ == "__main__":
    main()
