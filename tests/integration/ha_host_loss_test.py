#!/usr/bin/env python3
"""The serving leader candidate's whole machine lost (docs/ha.md "Artifacts"): its
candidate runs in a network namespace of its own (its "host", reached over a veth pair),
the standby candidate, a one-member etcd and two agents in the test's namespace, all
real dltrain-agent daemons and the real `dltrain` client given both candidates' URLs.
After one job succeeded, another started from its model (uploaded by the client) and
a third was cancelled (its latest epoch checkpoint kept), while a fourth trains with
checkpoints and a `dltrain follow` of it runs, the host is
taken down: its link first (its peers' packets are dropped, no connection is reset),
then every process in it is killed and the namespace deleted. The standby serves, and
everything the lost leader kept is served by it: `model get` of the succeeded job gives
the same files, the uploaded file is not uploaded again, `resume` of the cancelled one
trains from its checkpoint, and the follow prints every event once (the agents send
again what the lost leader never answered) and ends with the summary.

Usage: ha_host_loss_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped) without
root, ip netns and nsenter, /usr/bin/etcd or the data set.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_cluster import missing_prerequisites  # noqa: E402
from dltrain_cluster import wait_for  # noqa: E402
from ha_cluster import DATA, HaCluster  # noqa: E402
from netns_host import Host, missing as netns_missing  # noqa: E402

BUILD = None
SKIP = 77
TTL = 3
ENDED = ("succeeded", "failed", "cancelled")


def files_sha256(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


class HostLoss(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-ha-host-loss-")
        self.host = Host()
        self.cluster = None

    def tearDown(self):
        if self.cluster:
            self.cluster.stop()
        self.host.delete()
        if os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            print("kept for inspection: " + self.root, file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def job(self, name, epochs, train_samples, checkpoint_every=0, init_from=None, uploads=None):
        """Submits an MLP job; `init_from`: a model directory (its state_dict.pt uploaded);
        `uploads`: True/False, whether the client must say it uploads a file."""
        path = self.cluster.job_file(name, epochs=epochs, train_samples=train_samples)
        with open(path) as f:
            text = f.read()
        if init_from:  # a top-level key: before the first table
            text = text.replace("[optimizer]", 'init_from = "%s"\n\n[optimizer]' % init_from, 1)
        if checkpoint_every:
            text += "\n[checkpoint]\nevery_epochs = %d\n" % checkpoint_every
        with open(path, "w") as f:
            f.write(text)
        r = self.cluster.client("submit", path)
        m = re.search(r"(job-\d+) submitted", r.stdout)
        self.assertTrue(m, r.stdout)
        if uploads is not None:
            self.assertEqual("uploading" in r.stderr, uploads, r.stderr)
        return m.group(1)

    def test_the_lost_leaders_models_checkpoints_and_followers_go_on_with_the_standby(self):
        h = self.host
        # cand-a on the host that is lost, cand-b beside etcd and the agents.
        c = self.cluster = HaCluster(BUILD, self.root, ttl=TTL, etcd_host=h.outside,
                                     candidate_hosts=[h.inside, h.outside], candidate_wraps=[h.wrap, ()],
                                     ha_extra='replication_timeout = "30s"')
        a, b = c.candidates
        a.start()
        a.wait_log(c.SERVING, 60)
        for d in [b] + c.agents:
            d.start()
        b.wait_log(r"standby: copying the models and uploads of the leader at %s" % re.escape(h.inside), 60)
        wait_for(lambda: sum(x["state"] == "ready" for x in json.loads(c.client("agents", "--json").stdout)["agents"])
                 == len(c.agents), 60, "the agents' registration")

        # A job that succeeds: reported succeeded only once the standby holds its model.
        kept = self.job("kept", epochs=2, train_samples=12000)
        st = c.wait_state(kept, ENDED, 300)
        self.assertEqual(st["state"], "succeeded", st)
        self.assertEqual(st.get("model_replicas"), ["cand-b"], st)
        before = os.path.join(self.root, "kept-from-a")
        c.client("model", "get", kept, "-o", before)
        self.assertIn("state_dict.pt", os.listdir(before))

        # A job that starts from that model directory: its state_dict is uploaded, and the
        # job ends only once the standby holds the upload too.
        warm = self.job("warm", epochs=1, train_samples=6000, init_from=before, uploads=True)
        st = c.wait_state(warm, ENDED, 300)
        self.assertEqual(st["state"], "succeeded", st)
        self.assertEqual(st.get("model_replicas"), ["cand-b"], st)

        # A job cancelled after an epoch: its latest epoch checkpoint is kept, and copied.
        stopped = self.job("stopped", epochs=8, train_samples=36000, checkpoint_every=1)
        wait_for(lambda: c.status(stopped).get("epochs", 0) >= 1, 180, "an epoch of " + stopped)
        c.client("cancel", stopped)
        st = c.wait_state(stopped, ENDED, 300)
        self.assertEqual(st["state"], "cancelled", st)
        self.assertTrue(any(m["checkpoint"].startswith("epoch-") for m in st.get("models", [])), st)
        self.assertEqual(st.get("model_replicas"), ["cand-b"], st)

        # A job that trains with checkpoints through the loss, followed from before it.
        running = self.job("running", epochs=8, train_samples=36000, checkpoint_every=2)
        c.wait_progress(running, 180)
        follower = subprocess.Popen([os.path.join(BUILD, "bin", "dltrain"), "follow", running, "--json"], env=c.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(follower.stdout))
        reader.start()
        wait_for(lambda: lines or follower.poll() is not None, 60, "the follower's first event")
        self.assertIsNone(follower.poll(), "the follower ended before the loss: %s" % lines)

        # The premise: cand-a serves from the host, the job has epochs left.
        self.assertTrue(a.running())
        self.assertEqual(c.current_leader()[0], a)
        self.assertLess(c.status(running).get("epochs", 0), 8)
        since = {d.name: d.log_size() for d in c.candidates}
        h.take_down()
        # Nothing of the lost machine's disk is read from here on.
        shutil.rmtree(os.path.join(self.root, "cand-a", "state"))
        new, _ = c.serving(TTL + 10, exclude=(a,), since=since)
        self.assertIs(new, b)

        # What the lost leader kept, served by the new one.
        after = os.path.join(self.root, "kept-from-b")
        r = wait_for(lambda: c.client("model", "get", kept, "-o", after, check=False, timeout=60).returncode == 0, 60,
                     "model get " + kept + " on the new leader")
        self.assertTrue(r)
        self.assertEqual(files_sha256(after), files_sha256(before))
        # The upload is there too: the same directory is not uploaded again.
        again = self.job("warm-again", epochs=1, train_samples=6000, init_from=before, uploads=False)
        out = c.client("resume", stopped).stdout
        m = re.search(r"(job-\d+) submitted", out)
        self.assertTrue(m, out)
        resumed = c.wait_state(m.group(1), ENDED, 400)
        self.assertEqual(resumed["state"], "succeeded", resumed)
        self.assertEqual((resumed["resumed_from"], resumed["epochs"]), (stopped, resumed["epochs_total"]), resumed)
        self.assertGreaterEqual(resumed["resume_epoch"], 1, resumed)

        self.assertEqual(c.wait_state(again, ENDED, 300)["state"], "succeeded")

        # The job that trained through the loss, and its follower.
        st = c.wait_state(running, ENDED, 400)
        self.assertEqual(st["state"], "succeeded", st)
        c.client("model", "get", running, "--checkpoint", "epoch-2", "-o", os.path.join(self.root, "running-2"))
        rc = follower.wait(180)
        err = follower.stderr.read()
        self.assertEqual(rc, 0, err)
        self.assertIn("following on with the leader at", err)
        reader.join(30)
        events = [json.loads(line) for line in lines]
        self.assertEqual(events[-1]["event"], "summary", events[-1])
        self.assertEqual(events[-1]["state"], "succeeded")
        epochs = [e["epoch"] for e in events if e["event"] == "epoch_end" and e.get("task") == "worker-0"]
        self.assertTrue(epochs, lines)
        self.assertEqual(epochs, list(range(epochs[0], 9)), lines)
        keys = [json.dumps({k: v for k, v in e.items() if k not in ("time", "job")}, sort_keys=True) for e in events]
        self.assertEqual(len(keys), len(set(keys)), "an event printed twice")


def main():
    global BUILD
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    BUILD = os.path.abspath(sys.argv.pop(1))
    why = missing_prerequisites() or (None if os.path.isdir(DATA) else DATA + " is missing (dataset-fashion-mnist)")
    why = why or netns_missing()
    if why:
        print("skipped: " + why, file=sys.stderr)
        return SKIP
    result = unittest.main(argv=sys.argv, exit=False, verbosity=2).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
