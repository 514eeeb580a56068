#!/usr/bin/env python3
"""User models as TorchScript (model = "torchscript", docs/training.md "Your model").

The models are defined here in Python only and made with Debian's python3-torch (the same
version as Debian's LibTorch): a CNN scripted with torch.jit.script and one traced with
torch.jit.trace, and models that must be refused. A standalone cluster (a leader and 3
agents on loopback) trains the good ones with 2 workers, dense and DGC, on Fashion-MNIST;
each bad one fails its job with a message naming the file and the problem, and the
cluster then runs the next job.

Usage: torchscript_test.py BUILD_DIR [unittest args]
Exit status 77 (skipped) without /usr/bin/python3's torch or the data set.
"""
import glob
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dltrain_cluster import StandaloneCluster, test_main  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch
SKIP = 77

# The CNN both scripts below use: the models are made from it, and the exported
# state_dict is loaded back into it.
CNN = r'''
class Cnn(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.b2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, classes)
    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.b1(self.c1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))
'''

MAKE_MODELS = r'''
import sys, torch, torch.nn as nn
out = sys.argv[1]
''' + CNN + r'''

torch.manual_seed(1)
torch.jit.save(torch.jit.script(Cnn()), out + "/scripted.pt")
torch.manual_seed(2)
torch.jit.save(torch.jit.trace(Cnn().eval(), torch.zeros(4, 1, 28, 28)).train(), out + "/traced.pt")
torch.manual_seed(3)
torch.jit.save(torch.jit.script(Cnn()), out + "/uploaded.pt")

class NoParams(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10]
torch.jit.save(torch.jit.script(NoParams()), out + "/no-params.pt")
torch.jit.save(torch.jit.script(Cnn(classes=5)), out + "/five-classes.pt")

class ThreeChannels(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 10)
    def forward(self, x):
        return self.fc(torch.relu(self.c(x)).mean(dim=(2, 3)))
torch.jit.save(torch.jit.script(ThreeChannels()), out + "/three-channels.pt")
torch.jit.save(torch.jit.script(Cnn().double()), out + "/float64.pt")
with open(out + "/not-torchscript.pt", "wb") as f:
    f.write(b"PK\x03\x04" + bytes(range(256)) * 8)  # a zip's first bytes, then nonsense
with open(out + "/plain-text.pt", "w") as f:
    f.write("this is not a model\n")
'''


# The two checks' start: the model directory's metadata (argv[1]) and the first n
# (argv[3]) test images of the IDX data (argv[2]), standardised as the model was.
LOAD_TEST_SET = r'''
d, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
meta = json.load(open(d + "/metadata.json"))
def idx(path, header):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)
x = torch.tensor(idx(data + "/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:n].astype(np.float32) / 255.0)
x = (x - meta["mean"][0]) / meta["std"][0]
y = torch.tensor(idx(data + "/t10k-labels-idx1-ubyte.gz", 8)[:n].astype(np.int64))
'''

CHECK_ARTIFACT = r'''
import gzip, json, sys, numpy as np, torch, torch.nn as nn
''' + LOAD_TEST_SET + "\n" + CNN + r'''

with torch.no_grad():
    script = torch.jit.load(d + "/model.pt").eval()
    p_script = script(x).argmax(1)
    net = Cnn()
    net.load_state_dict(torch.load(d + "/state_dict.pt"))
    p_state = net.eval()(x).argmax(1)
print(json.dumps({"predictions": p_script.tolist(),
                  "script_accuracy": (p_script == y).float().mean().item(),
                  "state_dict_accuracy": (p_state == y).float().mean().item(),
                  "agreement": (p_script == p_state).float().mean().item(),
                  "metadata_accuracy": meta.get("test_accuracy")}))
'''


# A built-in network's state_dict.pt in PyTorch, through python/dltrain/networks.py: the
# accuracy on the first n test images.
CHECK_BUILTIN = r'''
import gzip, json, sys, numpy as np, torch
sys.path.insert(0, sys.argv[4])
from dltrain import networks as dltrain_models
''' + LOAD_TEST_SET + r'''
net = dltrain_models.load(d)  # load_state_dict is strict: every name and shape must match
with torch.no_grad():
    print(json.dumps({"accuracy": (net(x).argmax(1) == y).float().mean().item(), "type": type(net).__module__}))
'''
PYTHON_MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def missing_prerequisites():
    if subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        return "Debian's python3-torch is not installed (scripts/setup installs it for the tests)"
    if not os.path.isdir(DATA):
        return DATA + " is missing (dataset-fashion-mnist)"
    return None


class TorchScriptModels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dltrain-torchscript-test-")
        cls.models = os.path.join(cls.root, "models")
        os.makedirs(cls.models)
        # torch.jit.script reads the classes' source, so the script is a file.
        script = os.path.join(cls.root, "make_models.py")
        with open(script, "w") as f:
            f.write(MAKE_MODELS)
        r = subprocess.run([PYTHON, script, cls.models], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("making the TorchScript inputs failed: " + r.stderr)
        cls.cluster = StandaloneCluster(os.path.join(BUILD, "bin"), cls.root, 3, ["--cores-per-agent", "1"],
                                        state_dir=os.path.join(cls.root, "cluster"))
        cls.env = cls.cluster.env
        try:
            cls.cluster.start(timeout=60)
        except AssertionError:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if not os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            shutil.rmtree(cls.root, ignore_errors=True)

    def job(self, name, model_file, compression=""):
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(f'''name = "{name}"
model = "torchscript"
model_file = "{model_file}"
dataset = "fashion-mnist"
data_dir = "{DATA}"
epochs = 2
workers = 2
ps_shards = 1
batch_size = 32
train_samples = 12000
test_samples = 2000
seed = 7

[optimizer]
lr = 0.01
momentum = 0.9
lr_schedule = "cosine"
warmup_epochs = 0.2
{compression}''')
        return path

    def submit(self, job_file, timeout=300):
        """`dltrain submit --follow --json`: (exit status, the summary event or None, all output)."""
        r = subprocess.run([os.path.join(BUILD, "bin", "dltrain"), "submit", job_file, "--follow", "--json"],
                           capture_output=True, text=True, env=self.env, timeout=timeout)
        summary = None
        for line in r.stdout.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "summary":
                summary = ev
        return r.returncode, summary, r.stdout + r.stderr

    def assert_trains(self, model, compression=""):
        rc, summary, out = self.submit(self.job(os.path.basename(model)[:-3], os.path.join(self.models, model),
                                                compression))
        self.assertEqual(rc, 0, out)
        self.assertEqual(summary["state"], "succeeded", out)
        # Chance is 0.1; 2 epochs of 12,000 images put a small CNN near 0.8.
        self.assertGreater(summary["test_accuracy"], 0.6, out)
        return summary

    def assert_refused(self, model, *needles):
        path = os.path.join(self.models, model)
        rc, summary, out = self.submit(self.job("bad-" + model[:-3], path))
        self.assertNotEqual(rc, 0, out)
        for n in (path,) + needles:
            self.assertIn(n, out)
        # The cluster carries on: a good model trains right after.
        self.assert_trains("scripted.pt")
        return summary

    def dltrain(self, *args, timeout=300):
        return subprocess.run([os.path.join(BUILD, "bin", "dltrain")] + list(args), capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    def model_get(self, job):
        """`dltrain model get JOB -o DIR --json`: the directory and the manifest."""
        d = os.path.join(self.root, "downloaded", job)
        r = self.dltrain("model", "get", job, "-o", d, "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = json.loads(r.stdout)
        self.assertEqual(got["dir"], d)
        return d, got["model"]

    def assert_evaluates_to(self, d, accuracy, n=2000, delta=0.001):
        """`dltrain evaluate` on the job's n test images gives the job's own accuracy."""
        r = self.dltrain("evaluate", d, "--data", DATA, "--limit", str(n), "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = json.loads(r.stdout)
        self.assertEqual(got["images"], n)
        self.assertAlmostEqual(got["accuracy"], accuracy, delta=delta)

    def test_scripted_cnn_trains_dense_and_comes_back_loadable_in_pytorch(self):
        summary = self.assert_trains("scripted.pt")
        job = summary["job"]
        self.assertEqual(summary.get("model_checkpoint"), "last", summary)
        # The leader keeps the model (collected from worker 0's agent before the job
        # succeeded) and lists it.
        r = self.dltrain("models", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        kept = [m for m in json.loads(r.stdout)["models"] if m["job"] == job]
        self.assertEqual(len(kept), 1, r.stdout)
        self.assertEqual(kept[0]["model"], "torchscript")
        self.assertAlmostEqual(kept[0]["test_accuracy"], summary["test_accuracy"], delta=1e-9)
        d, manifest = self.model_get(job)
        self.assertEqual(sorted(os.listdir(d)), ["metadata.json", "model.pt", "state_dict.pt"])
        # Byte for byte what worker 0 wrote in model/ of its task directory.
        found = glob.glob(os.path.join(self.root, "cluster", "**", job, "worker-0-g*", "model"), recursive=True)
        self.assertEqual(len(found), 1, found)
        for name in ("metadata.json", "model.pt", "state_dict.pt"):
            with open(os.path.join(d, name), "rb") as a, open(os.path.join(found[0], name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
        self.assertEqual({f["name"] for f in manifest["files"]}, {"metadata.json", "model.pt", "state_dict.pt"})
        meta = json.load(open(os.path.join(d, "metadata.json")))
        self.assertEqual(meta["class_names"][0], "T-shirt_top")
        script = os.path.join(self.root, "check_artifact.py")
        with open(script, "w") as f:
            f.write(CHECK_ARTIFACT)
        r = subprocess.run([PYTHON, script, d, DATA, "2000"], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        # PyTorch, on the same 2,000 test images, computes the job's own test accuracy.
        self.assertAlmostEqual(got["script_accuracy"], summary["test_accuracy"], delta=0.001)
        self.assertAlmostEqual(got["state_dict_accuracy"], summary["test_accuracy"], delta=0.001)
        self.assertAlmostEqual(got["metadata_accuracy"], summary["test_accuracy"], delta=1e-9)
        self.assertGreaterEqual(got["agreement"], 0.999)
        # dltrain predict on the same images as PNG files agrees with PyTorch.
        pngs = os.path.join(self.root, "fashion-mnist-png")
        if not os.path.isdir(pngs):
            r = self.dltrain("dataset", "from-idx", DATA, pngs, "--train", "10", "--test", "2000")
            self.assertEqual(r.returncode, 0, r.stderr)
        files = sorted(glob.glob(os.path.join(pngs, "test", "*", "*.png")))
        self.assertEqual(len(files), 2000)
        r = self.dltrain("predict", d, "--json", "--top", "2", *files)
        self.assertEqual(r.returncode, 0, r.stderr)
        predicted = {}
        for line in r.stdout.splitlines():
            p = json.loads(line)
            self.assertEqual(len(p["top"]), 2)
            self.assertGreaterEqual(p["top"][0]["probability"], p["top"][1]["probability"])
            self.assertEqual(p["top"][0]["class"], meta["class_names"][p["top"][0]["label"]])
            predicted[int(os.path.basename(p["image"])[:6])] = p["top"][0]["label"]
        self.assertEqual(len(predicted), 2000)
        same = sum(1 for i, label in predicted.items() if got["predictions"][i] == label)
        self.assertGreaterEqual(same / 2000, 0.999, same)
        self.assert_evaluates_to(d, summary["test_accuracy"])

    def builtin_job(self, name, replace=()):
        """The scripted job's settings with the built-in CNN, `replace` (old, new) applied."""
        with open(self.job(name, "unused.pt")) as f:
            text = f.read().replace('model = "torchscript"\nmodel_file = "unused.pt"', 'model = "cnn"')
        for old, new in replace:
            self.assertIn(old, text)
            text = text.replace(old, new)
        path = os.path.join(self.root, name + ".toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def trained_builtin(self):
        """A built-in CNN trained once for the cases that start from it: (summary, model dir)."""
        cls = type(self)
        if not hasattr(cls, "_builtin"):
            rc, summary, out = self.submit(self.builtin_job("builtin-cnn"))
            self.assertEqual(rc, 0, out)
            self.assertGreater(summary["test_accuracy"], 0.6, out)
            cls._builtin = (summary, self.model_get(summary["job"]))
        return cls._builtin

    @staticmethod
    def epoch_accuracies(out):
        return [e["test_accuracy"] for e in map(json.loads, filter(lambda l: l.startswith("{"), out.splitlines()))
                if e.get("event") == "epoch_end" and "test_accuracy" in e]

    @staticmethod
    def tensors_in(state_dict):
        """The number of tensors in a state_dict file, as PyTorch reads it."""
        r = subprocess.run([PYTHON, "-c", "import sys, torch; print(len(torch.load(sys.argv[1])))", state_dict],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return int(r.stdout)

    def worker_log(self, job):
        logs = glob.glob(os.path.join(self.root, "cluster", "**", job, "worker-0-g*", "task.log"), recursive=True)
        self.assertEqual(len(logs), 1, logs)
        return open(logs[0]).read()

    def test_a_built_in_model_comes_back_and_evaluates_to_its_accuracy(self):
        summary, (d, manifest) = self.trained_builtin()
        # A built-in network has no TorchScript file: its state_dict, loaded into the
        # same C++ network by dltrain evaluate, gives the job's accuracy.
        self.assertEqual(sorted(os.listdir(d)), ["metadata.json", "state_dict.pt"])
        self.assertEqual(manifest["model"], "cnn")
        self.assert_evaluates_to(d, summary["test_accuracy"])
        r = self.dltrain("status", summary["job"], "--json")
        self.assertEqual(json.loads(r.stdout)["models"][0]["checkpoint"], "last", r.stdout)

    def assert_pytorch_accuracy(self, d, n, accuracy, delta=0.002):
        """python/dltrain/networks.py loads the built-in network's state_dict; its accuracy on
        the first n test images is the job's."""
        script = os.path.join(self.root, "check_builtin.py")
        with open(script, "w") as f:
            f.write(CHECK_BUILTIN)
        r = subprocess.run([PYTHON, script, d, DATA, str(n), PYTHON_MODELS], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertAlmostEqual(got["accuracy"], accuracy, delta=delta)
        return got

    def test_a_built_in_cnn_loads_into_its_pytorch_definition(self):
        summary, (d, _) = self.trained_builtin()
        self.assert_pytorch_accuracy(d, 2000, summary["test_accuracy"])

    def test_a_resnet18_state_dict_loads_into_torchvisions_resnet18(self):
        path = self.builtin_job("resnet18", [('model = "cnn"', 'model = "resnet18"'), ("epochs = 2", "epochs = 1"),
                                            ("train_samples = 12000", "train_samples = 256"),
                                            ("test_samples = 2000", "test_samples = 500\neval_batch_size = 500"),
                                            ("warmup_epochs = 0.2", "warmup_epochs = 0")])
        rc, summary, out = self.submit(path)
        self.assertEqual(rc, 0, out)
        d, _ = self.model_get(summary["job"])
        # One batch of 500 on both sides (eval_batch_size); a barely trained network's
        # near-ties may still fall the other way for a few images.
        got = self.assert_pytorch_accuracy(d, 500, summary["test_accuracy"], delta=0.01)
        self.assertEqual(got["type"], "torchvision.models.resnet")
        self.assert_evaluates_to(d, summary["test_accuracy"], 500, delta=0.01)

    def test_checkpoints_every_epoch_and_the_best_are_kept(self):
        path = self.builtin_job("checkpoints", [("epochs = 2", "epochs = 3"),
                                               ("[optimizer]", "[checkpoint]\nevery_epochs = 2\nbest = true\n\n[optimizer]")])
        rc, summary, out = self.submit(path, timeout=600)
        self.assertEqual(rc, 0, out)
        accuracies = self.epoch_accuracies(out)
        self.assertEqual(len(accuracies), 3, out)
        r = self.dltrain("models", summary["job"], "--json")
        kept = {m["checkpoint"]: m for m in json.loads(r.stdout)["models"]}
        self.assertEqual(set(kept), {"last", "best", "epoch-2"}, r.stdout)
        # Each is the model of its evaluation: its accuracy is that epoch's, and
        # dltrain evaluate measures the same on the model downloaded.
        self.assertEqual(kept["epoch-2"]["epochs"], 2)
        self.assertAlmostEqual(kept["epoch-2"]["test_accuracy"], accuracies[1], delta=1e-9)
        self.assertAlmostEqual(kept["best"]["test_accuracy"], max(accuracies), delta=1e-9)
        self.assertEqual(kept["best"]["epochs"], accuracies.index(max(accuracies)) + 1)
        self.assertAlmostEqual(kept["last"]["test_accuracy"], accuracies[2], delta=1e-9)
        d = os.path.join(self.root, "downloaded", "checkpoint-2")
        r = self.dltrain("model", "get", summary["job"], "--checkpoint", "2", "-o", d)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(json.load(open(os.path.join(d, "metadata.json")))["epoch"], 2)
        self.assert_evaluates_to(d, accuracies[1])
        r = self.dltrain("model", "get", summary["job"], "--checkpoint", "1", "-o", d)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn('no model "epoch-1" of %s is kept (its models: ' % summary["job"], r.stderr)

    def resumable_job(self, name):
        """8 BSP epochs of the built-in CNN with a checkpoint every 2 epochs."""
        return self.builtin_job(name, [("epochs = 2", "epochs = 8\nsync = \"sync\""),
                                       ("test_samples = 2000", "test_samples = 10000"),
                                       ("[optimizer]", "[checkpoint]\nevery_epochs = 2\n\n[optimizer]")])

    def test_resume_of_a_job_cancelled_at_epoch_4_ends_where_the_straight_run_does(self):
        rc, straight, out = self.submit(self.resumable_job("straight"), timeout=900)
        self.assertEqual(rc, 0, out)
        straight_epochs = [e for e in map(json.loads, filter(lambda l: l.startswith("{"), out.splitlines()))
                           if e.get("event") == "epoch_end" and e.get("rank") == 0]
        self.assertEqual([e["epoch"] for e in straight_epochs], list(range(1, 9)), out)
        # The same job, cancelled once worker 0 has finished epoch 4 of 8.
        r = self.dltrain("submit", self.resumable_job("cancelled"), "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        job = json.loads(r.stdout.splitlines()[-1])["job"]
        follow = subprocess.Popen([os.path.join(BUILD, "bin", "dltrain"), "follow", job, "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in follow.stdout] + [lines.put(None)], daemon=True).start()
        seen = []

        def next_event(deadline, what):
            """The next JSON line of `dltrain follow`, by the monotonic `deadline`."""
            while True:
                try:
                    line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    line = None
                self.assertIsNotNone(line, "no %s: %s" % (what, "".join(seen)))
                seen.append(line)
                if line.startswith("{"):
                    return json.loads(line)

        summary = None
        try:
            deadline = time.monotonic() + 600
            while True:
                ev = next_event(deadline, "end of epoch 4 within 600 s")
                self.assertNotEqual(ev.get("event"), "summary", "the job ended before epoch 4: " + "".join(seen))
                if ev.get("event") == "epoch_end" and ev.get("rank") == 0 and ev["epoch"] == 4:
                    break
            # The premise: the job runs and has epochs left.
            r = self.dltrain("status", job, "--json")
            self.assertEqual(json.loads(r.stdout)["state"], "running", r.stdout)
            r = self.dltrain("cancel", job)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            deadline = time.monotonic() + 120
            while summary is None:
                ev = next_event(deadline, "summary within 120 s of the cancel")
                if ev.get("event") == "summary":
                    summary = ev
        finally:
            follow.kill()
            follow.wait()
            follow.stdout.close()
        self.assertEqual(summary["state"], "cancelled", summary)
        self.assertLess(summary["epochs"], 8, summary)
        # The leader kept its latest epoch checkpoint (its model; nothing "last").
        self.assertEqual(summary.get("model_checkpoint"), "epoch-4", summary)
        r = self.dltrain("models", job, "--json")
        self.assertEqual([m["checkpoint"] for m in json.loads(r.stdout)["models"]], ["epoch-4"], r.stdout)
        # Resume: a new job from epoch 5 on, with the schedule where it was.
        r = self.dltrain("resume", job, "--follow", "--json", timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        events = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        self.assertEqual(events[0]["resumed_from"], job, r.stdout)
        self.assertEqual(events[0]["checkpoint"], "epoch-4", r.stdout)
        self.assertEqual(events[0]["resume_epoch"], 4, r.stdout)
        resumed = [e for e in events if e.get("event") == "epoch_end" and e.get("rank") == 0]
        self.assertEqual([e["epoch"] for e in resumed], [5, 6, 7, 8], r.stdout)
        # It starts from the checkpoint, not from scratch: epoch 5's training loss is the
        # straight run's epoch 5 loss, give or take the momentum it starts without
        # (a fresh network's first epoch loss is several times larger).
        self.assertAlmostEqual(resumed[0]["train_loss"], straight_epochs[4]["train_loss"],
                               delta=0.1 * straight_epochs[4]["train_loss"])
        # The learning rate of every step reported is the cosine schedule's at its place
        # in the 8 epochs (lr 0.01, warm-up 0.2 epochs), none of epochs 1-4.
        progress = [e for e in events if e.get("event") == "progress"]
        self.assertTrue(progress, r.stdout)
        for e in progress:
            self.assertGreaterEqual(e["epoch"], 5, e)
            pos = e["epoch"] - 1 + (e["step"] - 1) / e["steps_per_epoch"]
            expected = 0.01 * 0.5 * (1 + math.cos(math.pi * (pos - 0.2) / (8 - 0.2)))
            self.assertAlmostEqual(e["lr"], expected, delta=1e-6 * 0.01, msg=e)
        summary = events[-1]
        self.assertEqual(summary["event"], "summary", r.stdout)
        self.assertEqual(summary["state"], "succeeded", r.stdout)
        self.assertEqual(summary["epochs"], 8, r.stdout)
        print("\n  straight run %.4f, cancelled at epoch %d and resumed %.4f; epoch 5 training loss %.4f and %.4f"
              % (straight["test_accuracy"], events[0]["resume_epoch"], summary["test_accuracy"],
                 straight_epochs[4]["train_loss"], resumed[0]["train_loss"]), file=sys.stderr)
        self.assertAlmostEqual(summary["test_accuracy"], straight["test_accuracy"], delta=0.005,
                               msg="resumed %s, straight %s" % (summary["test_accuracy"], straight["test_accuracy"]))
        # A job that succeeded has nothing to resume; one never checkpointed cannot be.
        r = self.dltrain("resume", summary["job"])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("succeeded: nothing is left to train", r.stderr)
        r = self.dltrain("resume", "job-999999")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn('no job "job-999999"', r.stderr)

    def test_init_from_a_job_starts_at_its_accuracy(self):
        summary, _ = self.trained_builtin()
        # One more epoch at a small learning rate: the first evaluation is the starting
        # model's accuracy, give or take what one careful epoch changes.
        path = self.builtin_job("init-from-job", [("epochs = 2", 'epochs = 1\ninit_from = "%s"' % summary["job"]),
                                                  ("lr = 0.01", "lr = 0.0005"), ("warmup_epochs = 0.2", "warmup_epochs = 0")])
        rc, tuned, out = self.submit(path)
        self.assertEqual(rc, 0, out)
        first = self.epoch_accuracies(out)[0]
        self.assertAlmostEqual(first, summary["test_accuracy"], delta=0.01, msg=out)
        n = self.tensors_in(os.path.join(self.trained_builtin()[1][0], "state_dict.pt"))
        self.assertIn("init_from: %d of %d tensors from %s" % (n, n, summary["job"]), self.worker_log(tuned["job"]))

    def test_init_from_a_model_directory_replaces_the_classifier_for_another_class_count(self):
        _, (d, _) = self.trained_builtin()
        # Five of Fashion-MNIST's classes as an ImageFolder of 28x28 PNG files.
        five = os.path.join(self.root, "five-classes")
        r = self.dltrain("dataset", "from-idx", DATA, five, "--train", "3000", "--test", "500")
        self.assertEqual(r.returncode, 0, r.stderr)
        for split in ("train", "test"):
            for c in ("Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"):
                shutil.rmtree(os.path.join(five, split, c))
        path = self.builtin_job("init-from-dir", [
            ('dataset = "fashion-mnist"\ndata_dir = "%s"' % DATA,
             'dataset = "imagefolder"\ndata_dir = "%s"\nimage_size = 28\nchannels = 1\ninit_from = "%s"' % (five, d)),
            ("train_samples = 12000", "train_samples = 0"), ("test_samples = 2000", "test_samples = 0"),
            ("epochs = 2", "epochs = 1"), ("warmup_epochs = 0.2", "warmup_epochs = 0")])
        rc, tuned, out = self.submit(path)
        self.assertEqual(rc, 0, out)
        self.assertGreater(tuned["test_accuracy"], 0.4, out)  # chance is 0.2
        # The CNN's last layer (f2: 64 -> classes) is new; every other tensor comes from the file.
        n = self.tensors_in(os.path.join(d, "state_dict.pt"))
        self.assertIn("init_from: %d of %d tensors from %s; new: f2.weight [5, 64] (the file's [10, 64]), f2.bias [5] "
                      "(the file's [10])" % (n - 2, n, d), self.worker_log(tuned["job"]))

    def test_init_from_something_unknown_is_refused(self):
        path = self.builtin_job("init-from-nothing", [("epochs = 2", 'epochs = 2\ninit_from = "job-999"')])
        rc, _, out = self.submit(path)
        self.assertEqual(rc, 2, out)
        self.assertIn('init_from: "job-999" is neither a job whose model the leader keeps', out)

    def test_the_model_file_is_uploaded_once_and_needs_no_shared_file_system(self):
        # A model only the client has while the job runs: removed right after submit.
        own = os.path.join(self.root, "own-copy.pt")
        shutil.copy(os.path.join(self.models, "uploaded.pt"), own)
        path = self.job("uploaded", own)
        r = self.dltrain("submit", path, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("uploading " + own, r.stderr)
        job = json.loads(r.stdout.splitlines()[-1])["job"]
        os.remove(own)
        r = self.dltrain("follow", job, "--json", timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Each worker read the leader's copy from its own directory.
        copies = glob.glob(os.path.join(self.root, "cluster", "**", job, "worker-*-g*", "model_file.pt"), recursive=True)
        self.assertEqual(len(copies), 2, copies)
        with open(os.path.join(self.models, "uploaded.pt"), "rb") as a, open(copies[0], "rb") as b:
            self.assertEqual(a.read(), b.read())
        # The same content again, from another path: the leader has it, nothing is sent.
        path = self.job("uploaded-again", os.path.join(self.models, "uploaded.pt"))
        r = self.dltrain("submit", path, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("uploading", r.stderr)
        again = json.loads(r.stdout.splitlines()[-1])["job"]
        self.assertEqual(self.dltrain("follow", again, "--json", timeout=300).returncode, 0)

    def test_traced_cnn_trains_with_dgc(self):
        s = self.assert_trains("traced.pt", '\n[compression]\nmethod = "dgc"\nratio = 0.01\nwarmup_epochs = 0.5\n'
                                            'warmup_schedule = "stages"\n')
        self.assertEqual(s.get("compression"), "dgc")

    def test_a_file_that_is_not_an_archive_is_refused_at_submit(self):
        self.assert_refused("plain-text.pt", "is not a TorchScript archive")

    def test_a_broken_archive_is_refused_when_the_worker_loads_it(self):
        summary = self.assert_refused("not-torchscript.pt", "not a TorchScript archive that this LibTorch 1.13 can load")
        # A failed job has no model, and model get says so.
        r = self.dltrain("model", "get", summary["job"], "-o", os.path.join(self.root, "none"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn('no model "last" of %s is kept; the job is failed' % summary["job"], r.stderr)

    def test_a_model_without_trainable_parameters_is_refused(self):
        self.assert_refused("no-params.pt", "has no trainable parameters")

    def test_a_forward_that_fails_on_the_jobs_shape_is_refused(self):
        self.assert_refused("three-channels.pt", "forward fails on the job's input shape [2, 1, 28, 28]")

    def test_an_output_that_is_not_one_logit_per_class_is_refused(self):
        self.assert_refused("five-classes.pt", "forward returns [2, 5] for input [2, 1, 28, 28]; expected [2, 10]")

    def test_float64_parameters_are_refused(self):
        self.assert_refused("float64.pt", "is Double; dltrain trains float32 parameters")


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
