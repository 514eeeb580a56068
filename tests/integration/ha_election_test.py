#!/usr/bin/env python3
"""Leader election on a real etcd (lib/ha/election.h, docs/ha.md).

Each case starts its own etcd from Debian's etcd-server package on loopback — one member,
or a three-member cluster — and leader candidates (bin/ha_candidate, which campaigns with
ha::LeaderElection and, while it serves, writes "orders" fenced by its term). The
assertions are on etcd's own records: an order is a key /dltrain-test/orders/<term>/<seq>
whose create_revision etcd assigned, and a leader's term is the revision at which it
created the election key, so "no order of the old term after the new term began" is a
comparison of etcd revisions, not of anybody's clock.

Usage: ha_election_test.py BUILD_DIR [unittest args]. Exit status 77 (skipped) without
/usr/bin/etcd.
"""
import json
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
from dltrain_cluster import test_main, wait_for  # noqa: E402
from etcd_cluster import free_port, is_raft_leader, kv_range, missing_prerequisites, start_cluster  # noqa: E402

BUILD = None
ETCDCTL = "/usr/bin/etcdctl"
SKIP = 77
TTL = 3


class Candidate:
    """bin/ha_candidate with its JSON lines read on a thread."""

    def __init__(self, name, endpoints, *extra):
        self.name = name
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "bin", "ha_candidate"), "--etcd", ",".join(endpoints), "--name", name,
             "--ttl", str(TTL), "--margin-ms", "500", "--order-ms", "100", "--request-ms", "700"] + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"event": "text", "text": line}
            ev["at"] = time.monotonic()
            self.lines.put(ev)

    def wait(self, pred, timeout, what, since=None):
        """The first event `pred` accepts: among those already read (from `since`, a
        monotonic time, on; None: only new ones), else the next within `timeout` s."""
        if since is not None:
            for ev in self.seen:
                if ev["at"] >= since and pred(ev):
                    return ev
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ev = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(ev)
            if pred(ev):
                return ev
        raise AssertionError("%s: no %s within %.0f s; saw %s" % (self.name, what, timeout, self.seen[-20:]))

    def drain(self):
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return self.seen

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class Election(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dltrain-ha-test-")
        self.members = []
        self.candidates = []

    def tearDown(self):
        for c in self.candidates:
            c.stop()
        for m in self.members:
            m.kill()
        if not os.environ.get("DLTRAIN_KEEP_TEST_DIR"):
            shutil.rmtree(self.root, ignore_errors=True)

    def etcd(self, n):
        """n members (a cluster of their own); their client URLs."""
        self.members, urls = start_cluster(self.root, n)
        return urls

    def candidate(self, name, endpoints, *extra):
        c = Candidate(name, endpoints, *extra)
        self.candidates.append(c)
        return c

    def first_serving(self, candidates, timeout):
        """(the candidate, its term) of the first "serving" any of `candidates` prints
        within `timeout` s (the others' lines meanwhile are kept in their `seen`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for c in candidates:
                try:
                    ev = c.lines.get(timeout=0.05)
                except queue.Empty:
                    continue
                c.seen.append(ev)
                if ev["event"] == "serving":
                    return c, ev["term"]
        self.fail("nobody serves within %d s: %s" % (timeout, [c.seen[-10:] for c in candidates]))

    def two_candidates(self, endpoints):
        """Two candidates; (the serving one, its term, the standby)."""
        a, b = self.candidate("a", endpoints), self.candidate("b", endpoints)
        leader, term = self.first_serving((a, b), 30)
        standby = b if leader is a else a
        ev = standby.wait(lambda e: e["event"] == "standing_by", 15, "standing_by", since=0)
        self.assertEqual((ev["leader"], ev["term"]), (leader.name, term))
        # The premise of what follows: the leader serves and issues orders.
        leader.wait(lambda e: e["event"] == "order" and e["term"] == term, 10, "order")
        return leader, term, standby

    def test_sigkill_of_the_leader_a_standby_serves_within_the_ttl_plus_5_s(self):
        urls = self.etcd(1)
        leader, term, standby = self.two_candidates(urls)
        self.assertIsNone(leader.proc.poll())
        killed_at = time.monotonic()
        leader.proc.kill()
        ev = standby.wait(lambda e: e["event"] == "serving", TTL + 5, "serving after the leader's SIGKILL")
        self.assertLessEqual(ev["at"] - killed_at, TTL + 5)
        self.assertGreater(ev["term"], term)
        standby.wait(lambda e: e["event"] == "order" and e["term"] == ev["term"], 5, "order of the new term")
        # Every order of the old term was made before the new term began.
        old = kv_range(urls[0], "/dltrain-test/orders/%d/" % term)
        self.assertTrue(old)
        self.assertTrue(all(rev < ev["term"] for _, rev in old), (old, ev["term"]))

    def test_a_paused_leader_is_replaced_and_after_sigcont_changes_nothing(self):
        urls = self.etcd(1)
        leader, term, standby = self.two_candidates(urls)
        os.kill(leader.proc.pid, signal.SIGSTOP)
        ev = standby.wait(lambda e: e["event"] == "serving", TTL + 5, "serving while the leader is stopped")
        new_term = ev["term"]
        self.assertGreater(new_term, term)
        standby.wait(lambda e: e["event"] == "order" and e["term"] == new_term, 5, "order of the new term")
        time.sleep(1)  # stopped for longer than its lease: TTL + 1 s at least
        os.kill(leader.proc.pid, signal.SIGCONT)
        leader.wait(lambda e: e["event"] == "deposed", 10, "deposed after SIGCONT")
        # The new leader sends ~10 orders a second: once it has sent 10 more, the old one
        # would have sent some too had it not stepped down.
        after_deposed = len(kv_range(urls[0], "/dltrain-test/orders/%d/" % new_term))
        wait_for(lambda: len(kv_range(urls[0], "/dltrain-test/orders/%d/" % new_term)) >= after_deposed + 10, 10,
                 "10 more orders of the new term")
        # An order it had sent just before it was stopped may be answered after SIGCONT;
        # etcd made it before the new term began.
        woke = [e for e in leader.drain() if e.get("at", 0) > ev["at"]]
        self.assertFalse([e for e in woke if e["event"] == "order" and e["revision"] >= new_term], woke)
        # etcd's record: no order of the old term after the new one began, and the new
        # leader's orders go on.
        old = kv_range(urls[0], "/dltrain-test/orders/%d/" % term)
        self.assertTrue(all(rev < new_term for _, rev in old), (old, new_term))
        before = len(kv_range(urls[0], "/dltrain-test/orders/%d/" % new_term))
        wait_for(lambda: len(kv_range(urls[0], "/dltrain-test/orders/%d/" % new_term)) > before, 10,
                 "the new leader's orders going on")
        # The old leader stands by behind the new one.
        ev = leader.wait(lambda e: e["event"] == "standing_by", 10, "standing_by", since=0)
        self.assertEqual(ev["term"], new_term)

    def test_one_etcd_member_killed_changes_nothing(self):
        urls = self.etcd(3)
        # A member that is not etcd's raft leader (killing that one would pause the whole
        # cluster for its own re-election, which is etcd's matter, not this test's), put
        # first so that both candidates are using it when it goes.
        victim = next(i for i, m in enumerate(self.members) if not is_raft_leader(m.url))
        order = [victim] + [i for i in range(3) if i != victim]
        leader, term, standby = self.two_candidates([urls[i] for i in order])
        killed_at = time.monotonic()
        self.members[victim].kill()
        alive = urls[order[1]]
        before = len(kv_range(alive, "/dltrain-test/orders/%d/" % term))
        time.sleep(2 * TTL)
        changes = [e for e in leader.drain() + standby.drain()
                   if e["at"] >= killed_at and e["event"] in ("serving", "deposed", "standing_by")]
        self.assertFalse(changes, leader.seen[-10:] + standby.seen[-10:])
        self.assertGreater(len(kv_range(alive, "/dltrain-test/orders/%d/" % term)), before + 5)

    def test_quorum_lost_the_leader_stops_ordering_and_the_cluster_resumes_when_it_returns(self):
        urls = self.etcd(3)
        leader, term, standby = self.two_candidates(urls)
        last_orders = kv_range(urls[2], "/dltrain-test/orders/%d/" % term)
        self.members[0].kill()
        self.members[1].kill()
        lost_at = time.monotonic()
        ev = leader.wait(lambda e: e["event"] == "deposed", TTL + 5, "deposed without quorum")
        self.assertLessEqual(ev["at"] - lost_at, TTL + 5)
        # Without a quorum etcd takes no writes: nothing was ordered since, and the
        # leader holds its orders back.
        leader.wait(lambda e: e["event"] == "held_back", 5, "held_back", since=lost_at)
        self.members[0].start("existing")
        self.members[1].start("existing")
        # Quorum back: someone serves again, with a new term, and nothing was lost.
        serving = self.first_serving((leader, standby), 60)
        self.assertGreater(serving[1], term)
        kept = kv_range(urls[2], "/dltrain-test/orders/%d/" % term)
        self.assertTrue(set(last_orders) <= set(kept))
        serving[0].wait(lambda e: e["event"] == "order" and e["term"] == serving[1], 10, "order after quorum returned")

    def test_a_wrong_endpoint_or_wrong_credentials_are_clear_errors_at_start(self):
        closed = "http://127.0.0.1:%d" % free_port()
        c = self.candidate("x", [closed])
        self.assertEqual(c.proc.wait(timeout=30), 2)
        ev = c.wait(lambda e: e["event"] == "error", 5, "error")
        self.assertIn(closed, ev["message"])
        self.assertIn("Connection refused", ev["message"])
        c = self.candidate("y", ["ftp://127.0.0.1:2379"])
        self.assertEqual(c.proc.wait(timeout=30), 2)
        ev = c.wait(lambda e: e["event"] == "error", 5, "error")
        self.assertIn('endpoint "ftp://127.0.0.1:2379": expected http://HOST:PORT or https://HOST:PORT', ev["message"])
        urls = self.etcd(1)
        for args in (["user", "add", "root:right-password"], ["auth", "enable"]):
            r = subprocess.run([ETCDCTL, "--endpoints", urls[0]] + args, capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, ETCDCTL_API="3"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        c = self.candidate("z", urls, "--user", "root", "--password", "wrong")
        self.assertEqual(c.proc.wait(timeout=30), 2)
        ev = c.wait(lambda e: e["event"] == "error", 5, "error")
        self.assertIn("authentication failed", ev["message"])
        self.assertIn(urls[0], ev["message"])
        c = self.candidate("w", urls, "--user", "root", "--password", "right-password")
        c.wait(lambda e: e["event"] == "serving", 15, "serving with the right credentials")
        c.wait(lambda e: e["event"] == "order", 5, "order with the right credentials")


if __name__ == "__main__":
    test_main(sys.modules[__name__], missing_prerequisites)
