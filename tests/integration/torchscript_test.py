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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

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


CHECK_ARTIFACT = r'''
import gzip, json, sys, numpy as np, torch, torch.nn as nn
d, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
meta = json.load(open(d + "/metadata.json"))
def idx(path, header):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)
x = torch.tensor(idx(data + "/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:n].astype(np.float32) / 255.0)
x = (x - meta["mean"][0]) / meta["std"][0]
y = torch.tensor(idx(data + "/t10k-labels-idx1-ubyte.gz", 8)[:n].astype(np.int64))

''' + CNN + r'''

with torch.no_grad():
    script = torch.jit.load(d + "/model.pt").eval()
    p_script = script(x).argmax(1)
    net = Cnn()
    net.load_state_dict(torch.load(d + "/state_dict.pt"))
    p_state = net.eval()(x).argmax(1)
print(json.dumps({"script_accuracy": (p_script == y).float().mean().item(),
                  "state_dict_accuracy": (p_state == y).float().mean().item(),
                  "agreement": (p_script == p_state).float().mean().item(),
                  "metadata_accuracy": meta.get("test_accuracy")}))
'''


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
        state = os.path.join(cls.root, "cluster")
        cls.env = dict(os.environ, XDG_STATE_HOME=os.path.join(cls.root, "xdg"))
        cls.log = open(os.path.join(cls.root, "standalone.log"), "w")
        cls.cluster = subprocess.Popen(
            [os.path.join(BUILD, "bin", "dltrain-agent"), "--standalone", "--agents", "3", "--cores-per-agent", "1",
             "--state-dir", state], stdout=cls.log, stderr=subprocess.STDOUT, env=cls.env, start_new_session=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(state, "client.json")):
            if cls.cluster.poll() is not None or time.monotonic() > deadline:
                cls.tearDownClass()
                raise AssertionError("the standalone cluster did not come up: " +
                                     open(os.path.join(cls.root, "standalone.log")).read())
            time.sleep(0.2)

    @classmethod
    def tearDownClass(cls):
        if cls.cluster.poll() is None:
            cls.cluster.send_signal(signal.SIGTERM)
            try:
                cls.cluster.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(cls.cluster.pid, signal.SIGKILL)
                cls.cluster.wait()
        cls.log.close()
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

    def test_scripted_cnn_trains_dense_and_comes_back_loadable_in_pytorch(self):
        summary = self.assert_trains("scripted.pt")
        # Worker 0 left the trained model in model/ of its task directory.
        found = glob.glob(os.path.join(self.root, "cluster", "**", summary["job"], "worker-0-g*", "model",
                                       "metadata.json"), recursive=True)
        self.assertEqual(len(found), 1, found)
        d = os.path.dirname(found[0])
        self.assertEqual(sorted(os.listdir(d)), ["metadata.json", "model.pt", "state_dict.pt"])
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

    def test_traced_cnn_trains_with_dgc(self):
        s = self.assert_trains("traced.pt", '\n[compression]\nmethod = "dgc"\nratio = 0.01\nwarmup_epochs = 0.5\n'
                                            'warmup_schedule = "stages"\n')
        self.assertEqual(s.get("compression"), "dgc")

    def test_a_file_that_is_not_an_archive_is_refused_at_submit(self):
        self.assert_refused("plain-text.pt", "is not a TorchScript archive")

    def test_a_broken_archive_is_refused_when_the_worker_loads_it(self):
        self.assert_refused("not-torchscript.pt", "not a TorchScript archive that this LibTorch 1.13 can load")

    def test_a_model_without_trainable_parameters_is_refused(self):
        self.assert_refused("no-params.pt", "has no trainable parameters")

    def test_a_forward_that_fails_on_the_jobs_shape_is_refused(self):
        self.assert_refused("three-channels.pt", "forward fails on the job's input shape [2, 1, 28, 28]")

    def test_an_output_that_is_not_one_logit_per_class_is_refused(self):
        self.assert_refused("five-classes.pt", "forward returns [2, 5] for input [2, 1, 28, 28]; expected [2, 10]")

    def test_float64_parameters_are_refused(self):
        self.assert_refused("float64.pt", "is Double; dltrain trains float32 parameters")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    BUILD = os.path.abspath(sys.argv.pop(1))
    why = missing_prerequisites()
    if why:
        print("skipped: " + why)
        sys.exit(SKIP)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unittest.main(verbosity=2)
