#!/usr/bin/python3
"""Fault benchmark: what each failure the production agent recovers from costs a job.

For every fault and seed, a fresh cluster (a leader that hosts no tasks and N agents of
1 core each, every one a separate dltrain-agent process with its own configuration and
state directory, on loopback) trains the same job; once worker 0 has reported its first
epoch (plus --delay seconds), the fault is injected with SIGKILL, the way a crashed
process or machine goes:

  none          undisturbed (the reference)
  worker        a worker task (worker-1); its agent restarts it, it resumes from the PS
  ps            the PS shard task; its agent restarts it from its latest checkpoint
  agent-ps      the agent holding the PS shard, with its tasks; the job is re-assigned
                and the shard rebuilt on the spare agent from the freshest worker replica
  agent-worker  the agent holding worker-1, with it; the worker moves to the spare agent
  leader        the leader; it is started again after --leader-down seconds, with the
                same configuration, and adopts the running job

Per fault: final test accuracy mean and sample standard deviation over the seeds, its
difference to the undisturbed runs (goal: within 1 point), and the extra wall time
(mean wall time of the fault's runs minus that of the undisturbed runs).

Usage (after scripts/setup and a build; DLTRAIN_BUILD_DIR picks the build directory):
  bench/faults/run.py                      every fault, 3 seeds
  bench/faults/run.py --faults none,leader --seeds 1
  bench/faults/run.py --report             rebuild the tables from the JSON
  bench/faults/run.py --faults none,ps --seeds 15 --sync sync --out bench/results/faults-ps-15-bsp.json
Writes bench/results/faults.json (every run) and bench/results/faults.md (the table), and
replaces the fault section of docs/benchmarks/faults.md (between its faults markers); with
another --out, OUT.json and OUT.md only.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from compression_bench import BIN, free_port, write_tokens  # noqa: E402
from provenance import record  # noqa: E402

FAULTS = ["none", "worker", "ps", "agent-ps", "agent-worker", "leader"]
RESULTS = os.path.join(ROOT, "bench", "results")
DEFAULT_OUT = os.path.join(RESULTS, "faults.json")
BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"


class Cluster:
    """A leader and `agents` agents on loopback, each its own process group, so that any
    one of them can be killed (with the tasks it runs) and the leader started again."""

    def __init__(self, agents, keep=None, extra="", prefix="dltrain-faults-"):
        self.agents = agents
        self.keep = keep  # copy the logs here when the cluster ends
        self.extra = extra  # more configuration lines for every daemon
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.procs = {}

    def __enter__(self):
        d = self.dir
        self.token = write_tokens(d)
        port = free_port("127.0.0.1")
        self.url = f"ws://127.0.0.1:{port}"
        # Quick failure detection, as the failover tests use: heartbeats every 0.5 s, an
        # agent lost after 3 s of silence (or at once when its connection closes).
        common = ('heartbeat_interval = "500ms"\nheartbeat_timeout = "3s"\ntask_stop_grace = "5s"\n'
                  f'ps_checkpoint_interval = "2s"\nagent_token_file = "{d}/agent.token"\nlog_level = "info"\n'
                  + self.extra)
        with open(os.path.join(d, "leader.toml"), "w") as f:
            f.write(f'name = "leader"\nleader = true\nhost_tasks = false\nlisten_address = "127.0.0.1"\n'
                    f'listen_port = {port}\nclient_token_file = "{d}/client.token"\nstate_dir = "{d}/leader"\n'
                    + common)
        self.start("leader")
        for i in range(self.agents):
            with open(os.path.join(d, f"agent-{i}.toml"), "w") as f:
                f.write(f'name = "agent-{i}"\nleader_url = "{self.url}"\nadvertise_address = "127.0.0.1"\n'
                        f'task_bind_address = "127.0.0.1"\ncores = 1\nstate_dir = "{d}/agent-{i}"\n' + common)
            self.start(f"agent-{i}")
        deadline = time.time() + 60
        while time.time() < deadline:
            r = self.client("agents", "--json", check=False)
            if r.returncode == 0 and sum(a["state"] == "ready" for a in json.loads(r.stdout)["agents"]) == self.agents:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"agents did not register; logs in {d}")

    def start(self, name):
        log = open(os.path.join(self.dir, f"{name}.log"), "a")
        self.procs[name] = subprocess.Popen([f"{BIN}/dltrain-agent", "--config", f"{self.dir}/{name}.toml"],
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if name == "leader":
            deadline = time.time() + 30
            while self.client("list", "--json", check=False).returncode != 0:
                if time.time() > deadline:
                    raise RuntimeError(f"the leader did not come up; see {self.dir}/leader.log")
                time.sleep(0.2)

    def kill(self, name):
        p = self.procs.pop(name)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def client(self, *args, check=True, timeout=60):
        return subprocess.run([f"{BIN}/dltrain", "--leader", self.url, "--token", self.token, *args],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def status(self, job):
        r = self.client("status", job, "--json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def task_pid(self, job, agent, task):
        """The pid of a task process: its working directory is its task directory."""
        want = os.path.join(self.dir, agent, "tasks", job, task)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd") == want:
                    return int(pid)
            except OSError:
                pass
        raise RuntimeError(f"no process runs {task} of {job} on {agent}")

    def __exit__(self, *exc):
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        if self.keep:
            # Daemon logs, job files and task logs (not the checkpoints, replicas or store).
            def skip(d, names):
                return [n for n in names
                        if not os.path.isdir(os.path.join(d, n)) and not n.endswith((".log", ".toml"))]
            shutil.copytree(self.dir, self.keep, ignore=skip, dirs_exist_ok=True)
        subprocess.run(["rm", "-rf", self.dir])


def job_toml(args, seed):
    return "\n".join([
        f'name = "faults-s{seed}"', 'model = "cnn"', 'data_dir = "/usr/share/datasets/fashion-mnist"',
        f"epochs = {args.epochs}", "workers = 2", "ps_shards = 1", "batch_size = 32",
        f"train_samples = {args.train_samples}", f"test_samples = {args.test_samples}", f"seed = {seed}",
        f'sync = "{args.sync}"', "",
        "[optimizer]", "lr = 0.05", "momentum = 0.9", 'lr_schedule = "cosine"', "warmup_epochs = 0.2", ""])


def task_of(st, name):
    return next(t for t in st["tasks"] if t["task"] == name)


def run_one(args, fault, seed):
    keep = os.path.join(args.keep_logs, f"{fault}-s{seed}") if args.keep_logs else None
    with Cluster(args.agents, keep) as c:
        path = os.path.join(c.dir, "job.toml")
        with open(path, "w") as f:
            f.write(job_toml(args, seed))
        submitted = time.time()
        job = json.loads(c.client("submit", path, "--json").stdout.strip().splitlines()[-1])["job"]
        # Every event of the job (worker 0's per-epoch test accuracy among them), for the
        # record; a follower of the leader fault loses its connection with the leader.
        follow_path = os.path.join(c.dir, "follow.log")
        follower = subprocess.Popen([f"{BIN}/dltrain", "--leader", c.url, "--token", c.token, "follow", job, "--json"],
                                    stdout=open(follow_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + args.timeout
        st = {}
        while time.time() < deadline:  # worker 0's first epoch, then the delay
            st = c.status(job)
            if st.get("epochs", 0) >= 1 or st.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.25)
        if st.get("state") != "running":
            raise RuntimeError(f"{fault} seed {seed}: the job was {st.get('state')} before the fault")
        time.sleep(args.delay)
        st = c.status(job)
        injected = time.time()
        if fault == "worker":
            w = task_of(st, "worker-1")
            os.kill(c.task_pid(job, w["agent"], f"worker-1-g{st['generation']}"), signal.SIGKILL)
        elif fault == "ps":
            p = task_of(st, "ps-0")
            os.kill(c.task_pid(job, p["agent"], f"ps-0-g{st['generation']}"), signal.SIGKILL)
        elif fault == "agent-ps":
            c.kill(task_of(st, "ps-0")["agent"])
        elif fault == "agent-worker":
            c.kill(task_of(st, "worker-1")["agent"])
        elif fault == "leader":
            c.kill("leader")
            time.sleep(args.leader_down)
            c.start("leader")
        while time.time() < deadline:
            st = c.status(job)
            if st.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        try:
            follower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            follower.kill()
            follower.wait()
        epoch_accuracy = []
        for line in open(follow_path):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "epoch_end" and "test_accuracy" in e:
                epoch_accuracy.append(e["test_accuracy"])
        row = {"fault": fault, "seed": seed, "state": st.get("state"), "test_accuracy": st.get("test_accuracy"),
               "epoch_accuracy": epoch_accuracy,
               "wall_seconds": st.get("wall_seconds"), "generation": st.get("generation"),
               "reassignments": st.get("reassignments"), "error": st.get("error"),
               "injected_after_seconds": injected - submitted,
               "tasks": [{k: t.get(k) for k in ("task", "agent", "restarts", "resyncs", "recovery") if k in t}
                         for t in st.get("tasks", [])]}
        print(f"  {fault:13s} seed {seed}: {row['state']}, accuracy {row['test_accuracy']}, "
              f"wall {row['wall_seconds']:.1f} s, generation {row['generation']}", flush=True)
        return row


def summarise(runs):
    base = [r for r in runs if r["fault"] == "none" and r["state"] == "succeeded"]
    base_acc = statistics.mean(r["test_accuracy"] for r in base) if base else None
    base_wall = statistics.mean(r["wall_seconds"] for r in base) if base else None
    out = []
    for fault in FAULTS:
        rs = [r for r in runs if r["fault"] == fault]
        if not rs:
            continue
        ok = [r for r in rs if r["state"] == "succeeded"]
        acc = [r["test_accuracy"] for r in ok]
        wall = [r["wall_seconds"] for r in ok]
        s = {"fault": fault, "runs": len(rs), "succeeded": len(ok),
             "accuracy_mean": statistics.mean(acc) if acc else None,
             "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else None,
             "wall_mean": statistics.mean(wall) if wall else None}
        if base_acc is not None and acc:
            s["accuracy_delta_points"] = 100 * (s["accuracy_mean"] - base_acc)
            s["within_1_point"] = abs(s["accuracy_delta_points"]) <= 1.0
        if base_wall is not None and wall:
            s["extra_wall_seconds"] = s["wall_mean"] - base_wall
        out.append(s)
    return out


def table(doc):
    a = doc["settings"]
    lines = [f"Measured {doc['date']} on {doc['machine']}: `{doc['command']}`. "
             f"CNN, 2 workers + 1 PS shard (1 core each) on {a['agents']} agents of 1 core, "
             f"{a.get('sync', 'async')} training, "
             f"{a['train_samples']} training images, {a['epochs']} epochs, batch 32; fault injected "
             f"{a['delay']} s after worker 0's first epoch; {len(doc['seeds'])} seeds ({', '.join(map(str, doc['seeds']))}).",
             "",
             "| fault | succeeded | test accuracy (mean ± sd) | vs undisturbed | within 1 point | wall time (mean) | extra wall time |",
             "|---|---|---|---|---|---|---|"]
    for s in doc["summary"]:
        acc = "n/a" if s["accuracy_mean"] is None else f"{s['accuracy_mean']:.4f}" + (
            f" ± {s['accuracy_sd']:.4f}" if s["accuracy_sd"] is not None else "")
        delta = "" if s["fault"] == "none" or "accuracy_delta_points" not in s else f"{s['accuracy_delta_points']:+.2f} points"
        within = "" if s["fault"] == "none" or "within_1_point" not in s else ("yes" if s["within_1_point"] else "**no**")
        wall = "n/a" if s["wall_mean"] is None else f"{s['wall_mean']:.1f} s"
        extra = "" if s["fault"] == "none" or "extra_wall_seconds" not in s else f"{s['extra_wall_seconds']:+.1f} s"
        lines.append(f"| {s['fault']} | {s['succeeded']}/{s['runs']} | {acc} | {delta} | {within} | {wall} | {extra} |")
    return "\n".join(lines) + "\n"


def write_reports(doc, out):
    """Writes the table beside `out` (OUT.md); only the default run (faults.json) also
    replaces the fault section of docs/benchmarks/faults.md."""
    md = table(doc)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write("# Fault benchmark\n\n" + md)
    if os.path.abspath(out) == os.path.abspath(DEFAULT_OUT):
        replace_section(md, BEGIN, END)
    print(md)


def replace_section(md, begin, end):
    """Replaces what stands between the markers `begin` and `end` in docs/benchmarks/faults.md
    by `md`; changes nothing when either marker is missing."""
    path = os.path.join(ROOT, "docs", "benchmarks", "faults.md")
    text = open(path).read()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + md + end + rest.split(end, 1)[1]
        with open(path, "w") as f:
            f.write(text)


def machine():
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:")), 0)
    system = next((l.split("=", 1)[1].strip().strip('"') for l in open("/etc/os-release")
                   if l.startswith("PRETTY_NAME=")), platform.system())
    return f"{os.cpu_count()} cores, {mem / 2**20:.0f} GiB, {platform.machine()}, {system}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset of " + ",".join(FAULTS))
    ap.add_argument("--seeds", type=int, default=3, help="seeds per fault (1, 2, ...)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--train-samples", type=int, default=12000)
    ap.add_argument("--test-samples", type=int, default=5000)
    ap.add_argument("--agents", type=int, default=4, help="agents of 1 core (the job takes 3; one is spare)")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds after worker 0's first epoch")
    ap.add_argument("--leader-down", type=float, default=5.0, help="seconds the leader stays dead")
    ap.add_argument("--timeout", type=float, default=900, help="bound on one run, seconds")
    ap.add_argument("--sync", choices=["async", "ssp", "sync"], default="async",
                    help="the job's consistency model (sync: BSP, whose runs of one seed repeat exactly with 2 workers)")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help="the JSON of every run; its table goes to OUT.md, and into docs/benchmarks/faults.md for the default")
    ap.add_argument("--report", action="store_true", help="only rebuild the tables from --out")
    ap.add_argument("--keep-logs", metavar="DIR",
                    help="keep each run's daemon and task logs in DIR/FAULT-sSEED (e.g. bench/results/faults-logs)")
    args = ap.parse_args()
    if args.report:
        write_reports(json.load(open(args.out)), args.out)
        return
    faults = args.faults.split(",")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {unknown}; known: {FAULTS}")
    if not os.path.exists(f"{BIN}/dltrain-agent"):
        ap.error(f"{BIN}/dltrain-agent not found: build first (scripts/test builds) or set DLTRAIN_BUILD_DIR")
    seeds = list(range(1, args.seeds + 1))
    runs = []
    t0 = time.time()
    prov = record(["bench/faults/run.py", *sys.argv[1:]])  # commit, date, CPU, command

    def document(complete):
        return {"date": datetime.date.today().isoformat(),
                "machine": machine(),
                "command": " ".join(["bench/faults/run.py", *sys.argv[1:]]),
                "provenance": prov,
                "settings": {k: getattr(args, k) for k in ("epochs", "train_samples", "test_samples", "agents",
                                                            "delay", "leader_down", "sync")},
                "seeds": seeds, "complete": complete, "total_seconds": time.time() - t0, "runs": runs,
                "summary": summarise(runs)}

    for seed in seeds:
        for fault in faults:
            runs.append(run_one(args, fault, seed))
            # Written after every run, so that an interrupted benchmark keeps what it measured.
            with open(args.out + ".partial", "w") as f:
                json.dump(document(False), f, indent=1)
    doc = document(True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    if os.path.exists(args.out + ".partial"):
        os.remove(args.out + ".partial")
    write_reports(doc, args.out)


if __name__ == "__main__":
    main()
