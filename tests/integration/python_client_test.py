#!/usr/bin/env python3
"""The Python client (python/dltrain, docs/python.md) against real dltrain daemons.

- Offline: leader discovery in the CLI's order, job specs as TOML, every message type the
  library sends listed in docs/protocol.md, the event kinds those of lib/wire, module
  export (scripted; traced when scripting fails), `pip install` of the package.
- StandaloneCluster: `dltrain-agent --standalone` (a leader and 3 agents on loopback): a
  network defined here submitted as an nn.Module, followed to success, its trained model
  fetched and its test accuracy reproduced in PyTorch; every error class with the
  leader's message (a bad job field, no leader, a wrong token, a failed job, no such job,
  a conflict).
- Tls: a leader that serves only wss://, verified with the test's CA.
- Failover: two leader candidates on a real etcd; the serving one is killed while the
  client follows a job, which the client follows on to its summary on the new leader.

Usage: python_client_test.py BUILD_DIR [unittest args, e.g. Offline]
Exit status 77 (skipped) without python3-websocket, python3-tomli-w, python3-torch or
the data set; the Failover case skips itself without etcd.
"""
import ast
import contextlib
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from dltrain_cluster import StandaloneCluster, test_main, wait_for  # noqa: E402

BUILD = None
DATA = "/usr/share/datasets/fashion-mnist"
PYTHON = "/usr/bin/python3"


def missing_prerequisites():
    for module, package in (("websocket", "python3-websocket"), ("tomli_w", "python3-tomli-w"),
                            ("torch", "python3-torch"), ("tqdm", "python3-tqdm")):
        try:
            __import__(module)
        except ImportError:
            return "%s is not installed (scripts/setup installs it for the tests)" % package
    if not os.path.isdir(DATA):
        return DATA + " is missing (dataset-fashion-mnist)"
    return None


def job_fields(name, **more):
    """A Fashion-MNIST job of about a second here: 2 workers, 1 PS shard, 6,000 training
    and 2,000 test images, one epoch."""
    fields = {"name": name, "dataset": "fashion-mnist", "data_dir": DATA, "epochs": 1, "workers": 2, "ps_shards": 1,
              "batch_size": 32, "train_samples": 6000, "test_samples": 2000, "seed": 7,
              "optimizer": {"lr": 0.05, "momentum": 0.9}}
    fields.update(more)
    return fields


def make_net(classes=10):
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Linear(28 * 28, 64)
            self.out = nn.Linear(64, classes)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x.flatten(1))))

    torch.manual_seed(3)
    return Net()


def test_images(n):
    """The first `n` Fashion-MNIST test images as a float tensor [n, 1, 28, 28] in [0, 1]
    and their labels: what a job with test_samples = n evaluates on."""
    import numpy as np
    import torch
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:n]
    return torch.tensor(x.astype(np.float32) / 255.0), torch.tensor(y.astype(np.int64))


def documented_client_requests():
    """The request types docs/protocol.md lists for clients: each `name {` or `name →` of
    its "Client → leader" paragraphs."""
    with open(os.path.join(ROOT, "docs", "protocol.md"), encoding="utf-8") as f:
        text = f.read()
    names = set()
    for para in re.findall(r"Client → leader:(.*?)(?:\n\n|\n- )", text, re.S):
        names.update(re.findall(r"`([a-z_]+) \{[^`]*\}`", para))  # a request with its body
        names.update(re.findall(r"`([a-z_]+)`\s*→", para))  # one without
    return names


def sent_by_the_library():
    """Every request type the package's source sends: the string literal given as the
    first argument of each call of `_call`, `request` or `call`."""
    names = set()
    pkg = os.path.join(ROOT, "python", "dltrain")
    for file in sorted(os.listdir(pkg)):
        if not file.endswith(".py"):
            continue
        with open(os.path.join(pkg, file), encoding="utf-8") as f:
            tree = ast.parse(f.read(), file)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("_call", "request", "call") and isinstance(node.args[0].value, str):
                    names.add(node.args[0].value)
    return names


class Offline(unittest.TestCase):
    """What needs no cluster."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-python-offline-")
        self.saved = dict(os.environ)
        for k in ("DLTRAIN_LEADER", "DLTRAIN_TOKEN", "DLTRAIN_CA_FILE", "DLTRAIN_CLIENT_CONFIG", "XDG_CONFIG_HOME",
                  "XDG_STATE_HOME"):
            os.environ.pop(k, None)
        os.environ["HOME"] = self.root

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.saved)
        shutil.rmtree(self.root, ignore_errors=True)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_the_leader_is_found_in_the_clis_order(self):
        import dltrain
        with self.assertRaises(dltrain.ConfigError) as e:
            dltrain.find_leader()
        self.assertEqual(e.exception.field, "leader")
        self.assertEqual(e.exception.exit_code, 2)
        # 4. the standalone cluster's file
        self.write(".local/state/dltrain/standalone.json", json.dumps({"leader": "ws://sa:1", "client_token": "sa-t"}))
        t = dltrain.find_leader()
        self.assertEqual((t.leader, t.token), ("ws://sa:1", "sa-t"))
        # 3. the user's client configuration, its token from a token file, ca_file relative to it
        self.write("tok", "file-token\nsecond line\n")
        cfg = self.write(".config/dltrain/client.toml",
                         'leader = "ws://cfg:2"\ntoken_file = "%s"\nca_file = "ca.pem"\n' % os.path.join(self.root, "tok"))
        t = dltrain.find_leader()
        self.assertEqual((t.leader, t.token, t.source), ("ws://cfg:2", "file-token", cfg))
        self.assertEqual(t.ca_file, os.path.join(self.root, ".config", "dltrain", "ca.pem"))
        # DLTRAIN_CLIENT_CONFIG before it
        other = self.write("other.toml", 'leader = "ws://other:3"\ntoken = "other-t"\n')
        os.environ["DLTRAIN_CLIENT_CONFIG"] = other
        self.assertEqual(dltrain.find_leader().leader, "ws://other:3")
        # 2. the environment, each setting on its own: the token still from the config
        os.environ["DLTRAIN_LEADER"] = "ws://env:4"
        t = dltrain.find_leader()
        self.assertEqual((t.leader, t.token, t.source, t.token_source), ("ws://env:4", "other-t", "environment", other))
        # 1. the arguments; the candidates' list split
        t = dltrain.find_leader("ws://a:5, ws://b:6", "arg-t")
        self.assertEqual((t.urls, t.token), (["ws://a:5", "ws://b:6"], "arg-t"))
        for bad in ("http://a:5", "ws://host:abc", "ws://:1", "ws://", "ws://h:1/path", "ws://host", "ws://h:70000",
                    "ws://a:5,"):
            with self.assertRaises(dltrain.ConfigError, msg=bad) as e:
                dltrain.find_leader(bad, "t").urls
            self.assertEqual(e.exception.field, "leader")
        self.assertEqual(dltrain.find_leader("wss://[::1]:7070/", "t").urls, ["wss://[::1]:7070/"])

    def test_client_settings_are_checked_before_connecting(self):
        import dltrain
        with self.assertRaises(dltrain.ConfigError) as e:
            dltrain.Client("wss://127.0.0.1:1", "t", ca_file=os.path.join(self.root, "no-ca.pem"))
        self.assertEqual(e.exception.field, "ca_file")
        self.assertIn("no-ca.pem", e.exception.message)
        for bad in (0, -1, 3601, "30"):
            with self.assertRaises(dltrain.ConfigError, msg=repr(bad)) as e:
                dltrain.Client("ws://127.0.0.1:1", "t", timeout=bad)
            self.assertEqual(e.exception.field, "timeout")

    def test_error_replies_map_to_the_clis_exit_classes(self):
        import dltrain
        from dltrain.errors import from_reply
        cases = [("invalid_job", dltrain.InvalidJob, 2), ("bad_request", dltrain.InvalidJob, 2),
                 ("not_found", dltrain.NotFound, 2), ("conflict", dltrain.Conflict, 2),
                 ("infeasible", dltrain.Infeasible, 2), ("unauthorized", dltrain.Unauthorized, 2),
                 ("internal", dltrain.LeaderError, 2), ("a_future_code", dltrain.LeaderError, 2),
                 ("unavailable", dltrain.Unavailable, 3)]
        for code, cls, exit_code in cases:
            e = from_reply({"code": code, "message": "the leader's words", "field": "batch_size"})
            self.assertIs(type(e), cls, code)
            self.assertEqual((e.exit_code, e.code, e.field, e.message), (exit_code, code, "batch_size", "the leader's words"))
            self.assertEqual(str(e), "batch_size: the leader's words [%s]" % code)
        self.assertEqual((dltrain.NoLeader("x").exit_code, dltrain.JobFailed("job-1", "failed").exit_code), (3, 1))

    def test_a_bad_client_configuration_is_named(self):
        import dltrain
        bad = self.write("bad.toml", "leader = \n")
        os.environ["DLTRAIN_CLIENT_CONFIG"] = bad
        with self.assertRaisesRegex(dltrain.ConfigError, re.escape(bad)):
            dltrain.find_leader()
        self.write("bad.toml", 'leader = "ws://x:1"\ntoken_file = "%s"\n' % os.path.join(self.root, "missing"))
        with self.assertRaises(dltrain.ConfigError) as e:
            dltrain.find_leader()
        self.assertEqual(e.exception.field, "token_file")
        self.assertIn("No such file or directory", e.exception.message)

    def test_a_job_dict_becomes_the_toml_it_says_and_a_files_text_is_sent_as_it_is(self):
        import tomllib
        import dltrain
        fields = job_fields("t", augment={"crop_padding": 2}, mean=[0.5], data_dir='a "quoted" dir\\x')
        spec = dltrain.JobSpec(fields, base_dir=self.root)
        self.assertEqual(tomllib.loads(spec.to_toml()), fields)
        # A notebook's NumPy numbers are numbers; None is no value, named by its key.
        import numpy as np
        spec = dltrain.JobSpec({"epochs": np.int64(3), "optimizer": {"lr": np.float32(0.5)}, "mean": np.array([0.25])})
        self.assertEqual(tomllib.loads(spec.to_toml()), {"epochs": 3, "optimizer": {"lr": 0.5}, "mean": [0.25]})
        with self.assertRaises(dltrain.ConfigError) as e:
            dltrain.JobSpec({"optimizer": {"lr": None}}).to_toml()
        self.assertEqual(e.exception.field, "optimizer.lr")
        text = "# my job\nname = 'x'   # kept as written\nepochs = 2\n"
        path = self.write("j/job.toml", text)
        spec = dltrain.JobSpec.of(path)
        self.assertEqual((spec.to_toml(), spec.base_dir, spec["epochs"]), (text, os.path.dirname(path), 2))
        spec["epochs"] = 3
        self.assertEqual(tomllib.loads(spec.to_toml()), {"name": "x", "epochs": 3})
        with self.assertRaisesRegex(dltrain.ConfigError, "does not exist"):
            dltrain.JobSpec.of(os.path.join(self.root, "nope.toml"))
        with self.assertRaisesRegex(dltrain.ConfigError, "not valid TOML"):
            dltrain.JobSpec.of(self.write("broken.toml", "epochs = = 3\n"))

    def test_every_request_the_library_sends_is_documented(self):
        documented = documented_client_requests()
        # The parse itself: the CLI's requests are all there.
        self.assertTrue({"submit", "status", "list", "cancel", "follow", "agents", "logs", "models", "model_read",
                         "model_upload", "resume", "plan", "history"} <= documented, documented)
        sent = sent_by_the_library()
        self.assertGreaterEqual(len(sent), 12, sent)
        self.assertEqual(sent - documented, set(), "sent by python/dltrain but not in docs/protocol.md")

    def test_the_event_classes_are_the_kinds_a_follower_receives(self):
        from dltrain import events
        kinds = set()
        for header in ("task_events.h", "leader_events.h"):
            with open(os.path.join(ROOT, "lib", "wire", header), encoding="utf-8") as f:
                kinds |= set(re.findall(r'kKind = "([a-z_]+)"', f.read()))
        # ps_stats stays with the PS shard's agent (docs/protocol.md); "stopped" is one kind
        # for a worker and a PS shard.
        self.assertEqual(set(events.KINDS) - {"reconnected"}, kinds - {"ps_stats"})
        ev = events.from_json({"event": "epoch_end", "job": "job-1", "epoch": 2, "test_accuracy": 0.5})
        self.assertIsInstance(ev, events.EpochEnd)
        self.assertEqual((ev.kind, ev.epoch, ev["test_accuracy"], ev.loss), ("epoch_end", 2, 0.5, None))
        self.assertEqual(events.from_json({"event": "future_kind"}).kind, "future_kind")

    def test_a_module_is_scripted_or_traced_when_scripting_fails(self):
        import torch
        import torch.nn as nn
        import dltrain
        from dltrain.models import export_module

        data, how = export_module(make_net())
        self.assertEqual(how, "scripted")
        self.assertEqual(torch.jit.load(_bytes_io(data)).out.weight.shape, (10, 64))

        class VarArgs(nn.Module):  # torch.jit.script refuses *args
            def __init__(self):
                super().__init__()
                self.out = nn.Linear(28 * 28, 10)

            def forward(self, *xs):
                return self.out(xs[0].flatten(1))

        with self.assertRaises(dltrain.ConfigError) as e:
            export_module(VarArgs())
        self.assertEqual(e.exception.field, "model")
        self.assertIn("example_input", e.exception.message)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data, how = export_module(VarArgs(), torch.zeros(2, 1, 28, 28))
        self.assertEqual(how, "traced")
        self.assertTrue(any("traced" in str(w.message) for w in caught), [str(w.message) for w in caught])
        self.assertEqual(torch.jit.load(_bytes_io(data))(torch.zeros(3, 1, 28, 28)).shape, (3, 10))

    def test_pip_installs_the_package(self):
        src = os.path.join(self.root, "src")
        shutil.copytree(os.path.join(ROOT, "python"), src)  # the build writes into the source tree
        target = os.path.join(self.root, "site")
        r = subprocess.run([PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                            "--target", target, src], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run([PYTHON, "-c", "import dltrain, dltrain.networks; print(dltrain.__file__)"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=target), cwd=self.root)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith(target), r.stdout)
        with open(os.path.join(target, "dltrain-0.1.0.dist-info", "METADATA")) as f:
            meta = f.read()
        self.assertIn("Requires-Dist: websocket-client", meta)
        self.assertIn("Requires-Dist: tomli-w", meta)


def _bytes_io(data):
    return io.BytesIO(data)


class StandaloneCluster_(unittest.TestCase):
    """One standalone cluster for the cases (3 agents of one core: one 2-worker job)."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dltrain-python-client-")
        cls.cluster = StandaloneCluster(os.path.join(BUILD, "bin"), cls.root, 3, ["--cores-per-agent", "1"])
        cls.cluster.start(timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if not os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            shutil.rmtree(cls.root, ignore_errors=True)

    def client(self, **kw):
        import dltrain
        s = self.cluster.settings
        return dltrain.Client(kw.pop("leader", s["leader"]), kw.pop("token", s["client_token"]), **kw)

    def test_a_module_defined_here_trains_and_comes_back_with_its_accuracy(self):
        import torch
        import dltrain
        with self.client() as c:
            job = c.submit(job_fields("py-module"), model=make_net())
            self.assertEqual(job.model_export, "scripted")
            self.assertRegex(job.id, r"^job-\d+$")
            seen = []
            for ev in job.events(timeout=600):
                seen.append(ev)
            summary = seen[-1]
            self.assertIsInstance(summary, dltrain.events.Summary)
            self.assertEqual(summary.state, "succeeded", summary)
            epoch_ends = [e for e in seen if isinstance(e, dltrain.events.EpochEnd) and e.task == "worker-0"]
            self.assertEqual(len(epoch_ends), 1, seen)
            self.assertEqual(epoch_ends[0].test_accuracy, summary.test_accuracy)
            # wait() on an ended job: the summary at once.
            self.assertEqual(job.wait(timeout=60, progress=False).test_accuracy, summary.test_accuracy)
            self.assertEqual(job.status()["state"], "succeeded")
            self.assertIn(job.id, [j.id for j in c.jobs()])

            trained = job.model(dir=os.path.join(self.root, "model"))
            self.assertIsInstance(trained.module, torch.jit.ScriptModule)
            self.assertEqual(trained.metadata["test_accuracy"], summary.test_accuracy)
            self.assertEqual(set(trained.state_dict), {"hidden.weight", "hidden.bias", "out.weight", "out.bias"})
            # The job's accuracy, reproduced in PyTorch on the images it evaluated on.
            x, y = test_images(2000)
            with torch.no_grad():
                accuracy = (trained.module(trained.normalize(x)).argmax(1) == y).float().mean().item()
            self.assertAlmostEqual(accuracy, summary.test_accuracy, delta=0.001)
            # The files are the leader's: their SHA-256 as it lists them.
            listed = [m for m in c.models(job.id) if m["checkpoint"] == "last"]
            self.assertEqual(len(listed), 1)
            for f in listed[0]["files"]:
                import hashlib
                with open(os.path.join(trained.dir, f["name"]), "rb") as fh:
                    self.assertEqual(hashlib.sha256(fh.read()).hexdigest(), f["sha256"], f["name"])
            # A second fetch keeps the checked files.
            before = os.stat(os.path.join(trained.dir, "model.pt")).st_mtime_ns
            job.model(dir=trained.dir, load=False)
            self.assertEqual(os.stat(os.path.join(trained.dir, "model.pt")).st_mtime_ns, before)

            self.assertIn("epoch", job.logs("worker-0", tail=200))
            self.assertEqual({a["state"] for a in c.agents()}, {"ready"})
            self.assertEqual(len(c.agents()), 3)
            self.assertEqual(c.leader_info()["name"], "leader")
            # The planner's decision for an automatic job: with no history yet, it explores
            # configurations of up to the 3 single-core agents' cores.
            plan = c.plan(job_fields("py-plan", model="mlp", workers="auto"))
            self.assertIn("explanation", plan)
            self.assertTrue(plan["table"], plan)
            self.assertIn("no epoch-time history for mlp", plan["explanation"])
            self.assertEqual({(r["workers"], r["batch_size"]) for r in plan["explore"]}, {(1, 32), (2, 32)}, plan)
            self.assertIsInstance(c.history(), list)
            # A job file whose model_file is here: uploaded as `dltrain submit` does, sent
            # through a candidate list whose first one is dead.
            d = os.path.join(self.root, "jobdir")
            os.makedirs(d, exist_ok=True)
            torch.jit.save(torch.jit.script(make_net()), os.path.join(d, "net.pt"))
            with open(os.path.join(d, "job.toml"), "w") as f:
                f.write('model = "torchscript"\nmodel_file = "net.pt"\ndataset = "fashion-mnist"\n'
                        'data_dir = "%s"\nepochs = 1\nworkers = 2\ntrain_samples = 6000\ntest_samples = 2000\n' % DATA)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dead = "ws://127.0.0.1:%d" % s.getsockname()[1]
            with self.client(leader=dead + "," + self.cluster.settings["leader"]) as c2:
                from_file = c2.submit(os.path.join(d, "job.toml"))
                self.assertEqual(c2.leader, self.cluster.settings["leader"])
                # Its worker's log, followed from before the worker starts until it ends.
                text = "".join(from_file.follow_logs("worker-0", tail=1000, poll=0.2))
                self.assertIn('"event":"done"', text.replace(" ", ""))
                self.assertGreaterEqual(c2.sent["model_upload"], 1)
                self.assertEqual(from_file.wait(timeout=600, progress=False).state, "succeeded")
            # wait() with its progress bar (tqdm) for a job of a built-in network.
            bar = io.StringIO()
            with contextlib.redirect_stderr(bar):
                done = c.submit(job_fields("py-bar", model="mlp")).wait(timeout=600, progress=True)
            self.assertEqual(done.state, "succeeded")
            self.assertRegex(bar.getvalue(), r"job-\d+: 100%.*acc=" + "%.4f" % done.test_accuracy)
            # The requests it sent are the documented ones.
            self.assertEqual(set(c.sent) - documented_client_requests(), set(), c.sent)

    def test_every_error_class_carries_the_leaders_message(self):
        import torch
        import dltrain
        with self.client() as c:
            # A bad job field: the leader's message and field, exit class 2.
            with self.assertRaises(dltrain.InvalidJob) as e:
                c.submit(job_fields("py-bad", batch_size=0), model=make_net())
            self.assertEqual((e.exception.field, e.exception.code, e.exception.exit_code),
                             ("batch_size", "invalid_job", 2))
            self.assertIn("batch_size", e.exception.message)
            # No such job; a conflict.
            with self.assertRaises(dltrain.NotFound) as e:
                c.job("job-999")
            self.assertIn("job-999", e.exception.message)
            # A failed job: its model, already TorchScript, gives 5 classes where the data has 10.
            job = c.submit(job_fields("py-fails"), model=torch.jit.script(make_net(classes=5)))
            self.assertEqual(job.model_export, "scriptmodule")
            with self.assertRaises(dltrain.JobFailed) as e:
                job.wait(timeout=600, progress=False)
            self.assertEqual((e.exception.job, e.exception.state, e.exception.exit_code), (job.id, "failed", 1))
            # Either worker finds it first.
            self.assertIn(e.exception.failure["task"], ("worker-0", "worker-1"))
            self.assertEqual(e.exception.failure["cause"], "config")
            self.assertIn("forward returns [2, 5] for input [2, 1, 28, 28]; expected [2, 10]", str(e.exception))
            # Once the leader has closed the client's idle session (its 30 s bound; the raw
            # socket read to its end, so that no ping is answered), the client's next
            # request still reaches it, on a new session: a cancel of the ended job, a conflict.
            sock = c._session._ws.sock
            sock.settimeout(60)
            wait_for(lambda: sock.recv(65536) == b"", 60, "the leader closing the idle session", interval=0)
            with self.assertRaises(dltrain.Conflict) as e:
                job.cancel()
            self.assertEqual((e.exception.exit_code, e.exception.code, e.exception.field, e.exception.message),
                             (2, "conflict", "job", "job %s already failed" % job.id))
            # A job that cannot start (5 workers and a PS shard on 3 cores): the leader's
            # warning, a wait that times out, a cancel, and no checkpoint to resume from.
            queued = c.submit(job_fields("py-queued", model="mlp", workers=5))
            self.assertIn("more than the 3 cores", queued.warning)
            with self.assertRaises(dltrain.WaitTimeout) as e:
                queued.wait(timeout=1, progress=False)
            self.assertEqual((e.exception.exit_code, queued.status()["state"]), (1, "queued"))
            self.assertEqual(queued.cancel(), "cancelled")
            # scale of a job without [elastic]: a conflict naming the section.
            with self.assertRaises(dltrain.Conflict) as e:
                queued.scale(2)
            self.assertIn("[elastic]", e.exception.message)
            with self.assertRaises(dltrain.NotFound) as e:
                queued.resume()
            self.assertIn(queued.id, e.exception.message)
        # A wrong token: refused at the handshake, exit class 2, saying where the token came from.
        with self.assertRaises(dltrain.Unauthorized) as e:
            self.client(token="not-the-token").jobs()
        self.assertEqual((e.exception.exit_code, e.exception.code), (2, "unauthorized"))
        self.assertIn("refused the client token", e.exception.message)
        self.assertIn("from arguments", e.exception.message)
        # No leader: a loopback port nothing listens on, exit class 3.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(dltrain.NoLeader) as e:
            self.client(leader="ws://127.0.0.1:%d" % port, timeout=3).jobs()
        self.assertEqual(e.exception.exit_code, 3)
        self.assertIn("127.0.0.1:%d" % port, e.exception.message)


class Tls(unittest.TestCase):
    """A leader that serves only over TLS (a CA and a certificate for 127.0.0.1 made with
    the openssl tool): the client verifies it with ca_file, and refuses it without."""

    TOKEN = "client-token-for-the-tls-case-0123456789"

    def setUp(self):
        from dltrain_cluster import Daemon
        self.root = tempfile.mkdtemp(prefix="dltrain-python-tls-")
        ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
        cmd = ("openssl req -x509 %s -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem && "
               "openssl req %s -subj /CN=leader -keyout leader.key -out leader.csr && "
               "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
               "openssl x509 -req -in leader.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext "
               "-out leader.pem && chmod 600 leader.key ca.key") % (ec, ec)
        r = subprocess.run(cmd, shell=True, cwd=self.root, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.leader = Daemon(BUILD, self.root, "leader", """
name = "leader"
leader = true
host_tasks = false
listen_address = "127.0.0.1"
listen_port = 0
state_dir = "%s"
agent_token = "agent-token-for-the-tls-case-0123456789"
client_token = "%s"
tls_cert_file = "%s"
tls_key_file = "%s"
""" % (os.path.join(self.root, "state"), self.TOKEN, os.path.join(self.root, "leader.pem"),
                os.path.join(self.root, "leader.key"))).start()
        m, _ = self.leader.wait_log(r"leader listening on 127\.0\.0\.1:(\d+)", 30)
        self.url = "wss://127.0.0.1:%s" % m.group(1)

    def tearDown(self):
        self.leader.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def test_the_leader_is_verified_with_the_ca_file(self):
        import dltrain
        ca = os.path.join(self.root, "ca.pem")
        with dltrain.Client(self.url, self.TOKEN, ca_file=ca, timeout=10) as c:
            self.assertEqual((c.agents(), c.jobs()), ([], []))
        with self.assertRaises(dltrain.Unauthorized):
            dltrain.Client(self.url, "wrong-token", ca_file=ca, timeout=10).jobs()
        # The system's trust store does not know the test's CA.
        with self.assertRaises(dltrain.NoLeader) as e:
            dltrain.Client(self.url, self.TOKEN, timeout=10).jobs()
        self.assertIn("CERTIFICATE_VERIFY_FAILED", e.exception.message)
        # Plain WebSocket to a TLS-only leader is not answered.
        with self.assertRaises(dltrain.NoLeader):
            dltrain.Client(self.url.replace("wss://", "ws://"), self.TOKEN, timeout=5).jobs()


class Failover(unittest.TestCase):
    """The client follows a job across the loss of the serving leader candidate."""

    def setUp(self):
        from etcd_cluster import missing_prerequisites as etcd_missing
        why = etcd_missing()
        if why:
            self.skipTest(why)
        self.root = tempfile.mkdtemp(prefix="dltrain-python-failover-")
        self.cluster = None

    def tearDown(self):
        if self.cluster:
            self.cluster.stop()
        if not os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            shutil.rmtree(self.root, ignore_errors=True)

    def test_a_follower_goes_on_with_the_new_leader(self):
        import dltrain
        from ha_cluster import CLIENT_TOKEN, HaCluster
        self.cluster = HaCluster(BUILD, self.root, etcd_members=1, ttl=3)
        self.cluster.start()
        client = dltrain.Client(",".join(self.cluster.urls), CLIENT_TOKEN, failover_timeout=120)
        # 2 workers, 10 epochs of 24,000 images: long enough to lose the leader in it.
        job = client.submit(job_fields("py-failover", epochs=10, train_samples=24000))
        killed = None
        seen = []
        for ev in job.events(timeout=600):
            seen.append(ev)
            if killed is None and isinstance(ev, dltrain.events.Progress) and ev.epoch is not None:
                # The premise: the job runs and has epochs left.
                self.assertLess(ev.epoch, 10, ev)
                serving = [c for c, url in zip(self.cluster.candidates, self.cluster.urls) if url == client.leader]
                self.assertEqual(len(serving), 1, client.leader)
                killed = serving[0]
                self.assertTrue(killed.running())
                killed.signal(signal.SIGKILL)
        self.assertIsNotNone(killed, "no progress event before the job ended: %s" % seen)
        changed = [e for e in seen if isinstance(e, dltrain.events.Reconnected)]
        self.assertEqual(len(changed), 1, seen)
        self.assertNotEqual(changed[0]["to"], changed[0]["from"])
        self.assertEqual(seen[-1].kind, "summary")
        self.assertEqual(seen[-1].state, "succeeded", seen[-1])
        # Every epoch of the evaluating worker from the first seen on, once, in order.
        epochs = [e.epoch for e in seen if isinstance(e, dltrain.events.EpochEnd) and e.task == "worker-0"]
        self.assertTrue(epochs, seen)
        self.assertEqual(epochs, list(range(epochs[0], 11)), seen)
        self.assertGreater(seen[-1].test_accuracy, 0.7)
        # The client's own requests go to the new leader too.
        self.assertEqual(client.job(job.id).state, "succeeded")
        self.assertEqual(client.leader, changed[0]["to"])
        client.close()


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
