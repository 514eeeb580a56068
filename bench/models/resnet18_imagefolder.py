#!/usr/bin/env python3
"""torchvision's resnet18, scripted, trains on an ImageFolder beside the built-in resnet18.

torchvision.models.resnet18(num_classes=10) with a 1-channel first convolution, scripted
with Debian's python3-torch and torchvision (the versions of Debian's LibTorch), trains
as model = "torchscript" on Fashion-MNIST written as an ImageFolder of 32×32 PNG files
(`dltrain dataset from-idx --size 32`, the first --train training and --test test
images), 2 workers and 1 PS shard on a standalone cluster of 3 one-core agents; then the
built-in `resnet18` (torchvision's architecture in C++, lib/train/models.cpp) trains the
same job. Reported per model: the final test accuracy, the workers' images/s (summed,
averaged over the epochs), the wall time; and the images/s ratio scripted / built-in.
The trained TorchScript model is downloaded and loaded back into torchvision's resnet18
(its state_dict.pt, strictly), which must give the job's accuracy on the test images.

Usage: bench/models/resnet18_imagefolder.py [--epochs 3] [--train 6000] [--test 1000]
           [--out bench/results/resnet18-imagefolder.json]
Needs the build (scripts/setup) and /usr/bin/python3 with torch and torchvision.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from standalone import ROOT, run_job, start_cluster  # noqa: E402

PYTHON = "/usr/bin/python3"

MAKE = r'''
import sys, torch, torchvision
torch.manual_seed(1)
net = torchvision.models.resnet18(num_classes=10)
net.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
torch.jit.save(torch.jit.script(net), sys.argv[1])
'''

# The downloaded state_dict.pt in torchvision's resnet18, on the job's test images in the
# loader's order (ImageFolder: classes sorted, files sorted), normalised by the metadata.
CHECK = r'''
import json, os, sys, numpy as np, torch, torchvision
from PIL import Image
d, data = sys.argv[1], sys.argv[2]
meta = json.load(open(os.path.join(d, "metadata.json")))
net = torchvision.models.resnet18(num_classes=10)
net.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
net.load_state_dict(torch.load(os.path.join(d, "state_dict.pt")))
net.eval()
xs, ys = [], []
for label, c in enumerate(sorted(os.listdir(os.path.join(data, "test")))):
    for f in sorted(os.listdir(os.path.join(data, "test", c))):
        img = np.asarray(Image.open(os.path.join(data, "test", c, f)).convert("L"), dtype=np.float32) / 255.0
        xs.append((img - meta["mean"][0]) / meta["std"][0])
        ys.append(label)
x = torch.tensor(np.stack(xs)).unsqueeze(1)
with torch.no_grad():
    pred = torch.cat([net(x[i:i + 256]).argmax(1) for i in range(0, len(xs), 256)])
print(json.dumps({"images": len(ys), "accuracy": (pred == torch.tensor(ys)).float().mean().item()}))
'''


def job_file(directory, data, epochs, model_file):
    name = "builtin" if model_file is None else "torchscript"
    model = 'model = "resnet18"' if model_file is None else 'model = "torchscript"\nmodel_file = "%s"' % model_file
    path = os.path.join(directory, name + ".toml")
    with open(path, "w") as f:
        f.write('''name = "resnet18-imagefolder-%s"
%s
dataset = "imagefolder"
data_dir = "%s"
image_size = 32
channels = 1
epochs = %d
workers = 2
ps_shards = 1
batch_size = 64
threads_per_task = 1
loader_threads = 1
seed = 1

[augment]
crop_padding = 4

[optimizer]
lr = 0.02
momentum = 0.9
weight_decay = 5e-4
lr_schedule = "cosine"
warmup_epochs = 0.3
''' % (name, model, data, epochs))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "resnet18-imagefolder.json"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dltrain-resnet18-bench-")
    data = os.path.join(work, "fashion-mnist-png")
    proc, client, _ = start_cluster(work, 3, ["--cores-per-agent", "1"])
    try:
        subprocess.run(client[:1] + ["dataset", "from-idx", "/usr/share/datasets/fashion-mnist", data, "--size", "32",
                                     "--train", str(a.train), "--test", str(a.test)], check=True, capture_output=True)
        model = os.path.join(work, "resnet18.pt")
        subprocess.run([PYTHON, "-c", MAKE, model], check=True)
        scripted = run_job(client, job_file(work, data, a.epochs, model), timeout=7200)
        print("scripted torchvision resnet18: %.4f at %.1f img/s, %.0f s"
              % (scripted["test_accuracy"], scripted["images_per_sec"], scripted["wall_seconds"]), flush=True)
        got = os.path.join(work, "model")
        subprocess.run(client + ["model", "get", scripted["job"], "-o", got], check=True, capture_output=True)
        r = subprocess.run([PYTHON, "-c", CHECK, got, data], capture_output=True, text=True, check=True)
        loaded = json.loads(r.stdout.strip().splitlines()[-1])
        print("its state_dict.pt in torchvision's resnet18: %.4f on %d test images"
              % (loaded["accuracy"], loaded["images"]), flush=True)
        builtin = run_job(client, job_file(work, data, a.epochs, None), timeout=7200)
        print("built-in resnet18: %.4f at %.1f img/s, %.0f s"
              % (builtin["test_accuracy"], builtin["images_per_sec"], builtin["wall_seconds"]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result = {"data": "Fashion-MNIST as 32x32 PNG, %d train / %d test images" % (a.train, a.test),
              "epochs": a.epochs, "torchscript": scripted, "builtin": builtin, "torchvision_reload": loaded,
              "images_per_sec_ratio": scripted["images_per_sec"] / builtin["images_per_sec"]}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("ratio scripted / built-in images/s: %.3f -> %s" % (result["images_per_sec_ratio"], os.path.relpath(a.out, ROOT)))


if __name__ == "__main__":
    main()
