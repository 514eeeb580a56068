#!/usr/bin/env python3
"""Sharded data sets against the same files on local disk (docs/benchmarks/data.md,
"Sharded data sets"; docs/data.md).

The data: Fashion-MNIST written as photo-like 3×128×128 JPEG files
(bench/data/photo_fmnist.py: each garment enlarged, tinted and placed on a noisy colour
scene, the training set twice; 130,000 files, 1.28 GB), an ImageFolder, and the same files
packed (`dltrain dataset pack`, 32 MB shards: 43 training shards, so that each of 4 workers
reads ten or eleven). The
cluster: a leader in this namespace and AGENTS agents, each in a network namespace of its
own on one bridge, every link 1 Gbit/s each way (tc tbf); the store — nginx serving the
shards — on a host of its own on the same bridge. Two jobs with
the same settings (an MLP on the images decoded and resized to 32×32 — a small model, so
that neither the PS's traffic nor the model's arithmetic hides the data path; AGENTS workers, 2 epochs, seed 1):

  local  dataset = "imagefolder", data_dir = the JPEG files (every agent reads them from
         this machine's disk: the "local copy on every machine")
  shards data = "http://STORE/fmphoto128", the agents' caches empty at the start: epoch 1 is
         the cold epoch (every shard fetched while training), epoch 2 the warm one (each
         worker reads the same shards again, from its agent's cache)

Measured: time from submit to the first training progress of any worker, the images/s of
each epoch (all workers), the bytes each agent fetched against the bytes of the shards its
workers read, and nginx's count of GETs per shard and machine. Then the loader alone:
decode + augment images/s on one core at 128×128 and at 224×224 (a 224 px set of the
first 5,000 training garments, written the same way), dltrain's streaming loader (build/bin/loader_bench,
--threads 1 --augment: random crop with 4 px padding, horizontal flip, normalise) beside
torchvision's ImageFolder with the same transform (RandomCrop(padding=4),
RandomHorizontalFlip, ToTensor, Normalize; PIL decoding; one thread, no worker
processes) on the same files.

Needs root (network namespaces), nginx, python3-torchvision (numpy and PIL for the data). Writes
bench/results/data-shards.json with its provenance.

Usage: bench/data/shards.py [--agents N] [--skip-jobs] [--skip-loader]
Environment: DLTRAIN_BUILD_DIR (default: build), DATA_ROOT (default: /var/tmp/dltrain).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import provenance  # noqa: E402
from data_servers import Nginx  # noqa: E402
from dltrain_cluster import Daemon, wait_for, write_tokens  # noqa: E402
from netns_host import Lan  # noqa: E402

BUILD = os.path.abspath(os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build")))
DATA_ROOT = os.environ.get("DATA_ROOT", "/var/tmp/dltrain")
IDX = "/usr/share/datasets/fashion-mnist"
DLTRAIN = os.path.join(BUILD, "bin", "dltrain")

JOB = """name = "%(name)s"
model = "mlp"
%(data)s
image_size = 32
channels = 3
mean = %(mean)s
std = %(std)s
epochs = 2
workers = %(workers)d
ps_shards = 1
batch_size = 64
threads_per_task = 1
seed = 1

[optimizer]
lr = 0.01
momentum = 0.9
"""


def sh(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def du(path):
    return int(sh(["du", "-sb", path]).stdout.split()[0])


def prepare():
    photos = os.path.join(ROOT, "bench", "data", "photo_fmnist.py")
    folder = os.path.join(DATA_ROOT, "fm-photo128")
    if not os.path.isdir(os.path.join(folder, "train")):
        sh(["/usr/bin/python3", photos, IDX, folder], timeout=3600)
    folder224 = os.path.join(DATA_ROOT, "fm-photo224-5k")
    if not os.path.isdir(os.path.join(folder224, "train")):
        sh(["/usr/bin/python3", photos, IDX, folder224, "--size", "224", "--copies", "1", "--limit", "5000"],
           timeout=3600)
    return folder, folder224


class Cluster:
    def __init__(self, root, agents, shards_dir, stats):
        self.root = root
        self.stats = stats
        self.lan = Lan(agents + 1, rate="1gbit")
        self.store_host = agents
        try:
            os.chmod(root, 0o755)
            www = os.path.dirname(shards_dir)
            self.nginx = Nginx(os.path.join(root, "nginx"), www, self.lan.address(self.store_host),
                               wrap=self.lan.wrap(self.store_host))
            tokens = write_tokens(root, ("agent", "client"))
            state = os.path.join(root, "leader", "state")
            self.leader = Daemon(BUILD, root, "leader", """leader = true
host_tasks = false
listen_address = "%s"
listen_port = 0
state_dir = "%s"
agent_token_file = "%s/agent.token"
client_token_file = "%s/client.token"
""" % (self.lan.leader_address, state, root, root)).start()
            info = os.path.join(state, "leader.json")
            wait_for(lambda: os.path.exists(info), 30, "the leader's leader.json")
            with open(info) as f:
                url = json.load(f)["url"]
            self.agents = []
            for i in range(agents):
                self.agents.append(Daemon(BUILD, root, "agent-%d" % i, """name = "host-%d"
leader_url = "%s"
agent_token_file = "%s/agent.token"
advertise_address = "%s"
task_bind_address = "%s"
cores = 2
state_dir = "%s"
cache_bytes = 4294967296
""" % (i, url, root, self.lan.address(i), self.lan.address(i), os.path.join(root, "agent-%d" % i, "state")),
                    wrap=self.lan.wrap(i)).start())
            self.client = [DLTRAIN, "--leader", url, "--token", tokens["client"]]
            wait_for(lambda: len([a for a in self.agents_json() if a.get("state") == "ready"]) == agents, 60,
                     "the agents")
        except BaseException:
            self.stop()
            raise

    def agents_json(self):
        r = subprocess.run(self.client + ["agents", "--json"], capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout)["agents"] if r.returncode == 0 else []

    def run(self, name, data_line, workers):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(JOB % dict(self.stats, name=name, data=data_line, workers=workers))
        t0 = time.monotonic()
        p = subprocess.Popen(self.client + ["submit", path, "--follow", "--json"], stdout=subprocess.PIPE, text=True)
        first_progress = None
        epochs = {}
        summary = None
        for line in p.stdout:
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            kind = e.get("event")
            if kind == "progress" and first_progress is None:
                first_progress = time.monotonic() - t0
            if kind == "epoch_end":
                ep = epochs.setdefault(e["epoch"], {"images_per_sec": 0.0, "seconds": 0.0, "data_wait_seconds": 0.0})
                ep["images_per_sec"] += e.get("images_per_sec", 0.0)
                ep["seconds"] = max(ep["seconds"], e.get("epoch_seconds", 0.0))
                ep["data_wait_seconds"] = max(ep["data_wait_seconds"], e.get("data_wait_seconds", 0.0))
            if "state" in e and "test_accuracy" in e:
                summary = e
        p.wait(timeout=60)
        return {"job": name, "first_progress_seconds": first_progress, "epochs": epochs,
                "state": summary.get("state") if summary else None,
                "test_accuracy": summary.get("test_accuracy") if summary else None,
                "wall_seconds": time.monotonic() - t0}

    def stop(self):
        for d in getattr(self, "agents", []):
            d.stop()
        if getattr(self, "leader", None):
            self.leader.stop()
        if getattr(self, "nginx", None):
            self.nginx.stop()
        self.lan.delete()


def manifest_stats(shards_dir):
    """The job file's mean and std: the manifest's, which `dataset pack` computed."""
    with open(os.path.join(shards_dir, "manifest.json")) as f:
        stats = json.load(f)["stats"]
    return {"mean": "[%s]" % ", ".join("%.4f" % v for v in stats["mean"]),
            "std": "[%s]" % ", ".join("%.4f" % v for v in stats["std"])}


def jobs(agents, folder, shards_dir):
    root = tempfile.mkdtemp(prefix="dltrain-bench-data-")
    cluster = Cluster(root, agents, shards_dir, manifest_stats(shards_dir))
    try:
        local = cluster.run("local", 'dataset = "imagefolder"\ndata_dir = "%s"' % folder, agents)
        url = "http://%s:%d/%s" % (cluster.lan.address(cluster.store_host), cluster.nginx.port,
                                   os.path.basename(shards_dir))
        shards = cluster.run("shards", 'data = "%s"' % url, agents)
        caches = {a["agent"]: a.get("shard_cache") for a in cluster.agents_json()}
        gets = cluster.nginx.fetched("/" + os.path.basename(shards_dir) + "/")
        per_machine = {}
        for addr, path, status in gets:
            if path.endswith(".tar") and status in ("200", "206"):
                per_machine.setdefault(addr, []).append(path)
        once = all(len(v) == len(set(v)) for v in per_machine.values())
        return {"local": local, "shards": shards, "caches": caches,
                "shard_gets_per_machine": {k: len(v) for k, v in per_machine.items()},
                "each_shard_at_most_once_per_machine": once}
    finally:
        cluster.stop()
        shutil.rmtree(root, True)


def loader(folder, size, images):
    r = sh([os.path.join(BUILD, "bin", "loader_bench"), folder, "--threads", "1", "--images", str(images), "--size",
            str(size), "--channels", "3", "--augment"], timeout=1200)
    dl = json.loads(r.stdout.strip().splitlines()[-1])
    peer = sh(["/usr/bin/python3", "-c", """
import sys, time, torch, torchvision
from torchvision import transforms as T
torch.set_num_threads(1)
size, images = int(sys.argv[2]), int(sys.argv[3])
tf = T.Compose([T.RandomCrop(size, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.5] * 3, [0.25] * 3)])
ds = torchvision.datasets.ImageFolder(sys.argv[1] + "/train", transform=tf)
g = torch.Generator().manual_seed(1)
idx = torch.randperm(len(ds), generator=g)[:images].tolist()
dl = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, idx), batch_size=64, num_workers=0)
t0 = time.perf_counter(); n = 0
for x, y in dl: n += x.shape[0]
print(n / (time.perf_counter() - t0))
""", folder, str(size), str(images)], timeout=1200)
    return {"size": size, "images": images, "dltrain_images_per_sec": dl["images_per_sec"],
            "torchvision_images_per_sec": float(peer.stdout.strip().splitlines()[-1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--skip-jobs", action="store_true")
    ap.add_argument("--skip-loader", action="store_true")
    a = ap.parse_args()
    folder, folder224 = prepare()
    shards_dir = os.path.join(DATA_ROOT, "www", "fmphoto128")
    if not os.path.exists(os.path.join(shards_dir, "manifest.json")):
        sh([DLTRAIN, "dataset", "pack", folder, shards_dir, "--shard-size", "32MB"], timeout=3600)
    images = sum(len(files) for _, _, files in os.walk(folder))
    out = {"provenance": provenance.record(sys.argv),
           "data": {"files": os.path.basename(folder),
                    "file_bytes": du(os.path.join(folder, "train")) + du(os.path.join(folder, "test")),
                    "shards_bytes": du(shards_dir), "images": images,
                    "image": "3x128x128 JPEG (quality 95), photo-like: each garment enlarged, tinted and placed on a "
                             "noisy colour scene, the training set twice (bench/data/photo_fmnist.py)"},
           "settings": {"agents": a.agents, "link": "1 Gbit/s each way (tc tbf), the store on its own host",
                        "job": JOB % dict(manifest_stats(shards_dir), name="NAME", data="DATA",
                                          workers=a.agents)}}
    if not a.skip_jobs:
        out["jobs"] = jobs(a.agents, folder, shards_dir)
        j = out["jobs"]
        loc, sh_ = j["local"]["epochs"], j["shards"]["epochs"]
        if loc.get(1) and sh_.get(1) and sh_.get(2):
            out["ratios"] = {"cold_vs_local": sh_[1]["images_per_sec"] / loc[1]["images_per_sec"],
                             "warm_vs_local": sh_[2]["images_per_sec"] / loc[2]["images_per_sec"]}
    if not a.skip_loader:
        out["loader"] = [loader(folder, 128, 5000), loader(folder224, 224, 3000)]
    path = os.path.join(ROOT, "bench", "results", "data-shards.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
