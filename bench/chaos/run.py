#!/usr/bin/python3
"""Chaos run: a long job on a standalone cluster under a seeded schedule of faults.

Three phases, each on a fresh cluster on loopback (a leader that hosts no tasks and 1-core
agents, every one a separate dltrain-agent process, as bench/faults/run.py starts them):

  reference  the job undisturbed (the README's main job, --epochs epochs: about 7 minutes
             on a 2-core machine with the default 36 since 2026-12-07's code; 20 before)
  chaos      the same job while a schedule drawn from --seed acts every 20-60 s: SIGKILL
             of a worker or the PS shard task (its agent restarts it), SIGSTOP of one for
             2-10 s then SIGCONT, SIGKILL of an agent holding a task (started again 3-15 s
             later; the job is re-assigned meanwhile) or of the leader (started again
             2-8 s later). Goal: the job succeeds within 1 point of the reference's test
             accuracy, and nothing of it is left running afterwards.
  storm      --storm-jobs short jobs one after another on the same agents, each with its
             worker-1 and its PS shard SIGKILLed once while it runs (two task restarts per
             job, three task starts): the agents' open file descriptors and resident
             memory after every job. Goal: no growth over 50 task restarts (Horovod #3109
             leaked handles per restart until it ran out of memory).
  rejoin     task_max_restarts = 2: the agent holding worker-1 is SIGKILLed and started
             again at once, three times. Goal: the third loss fails the job ("already
             re-assigned 2 times"): a fast leave and rejoin does not reset the restart
             limit (torch #147064).

Usage (after scripts/setup and a build; DLTRAIN_BUILD_DIR picks the build directory):
  bench/chaos/run.py                         every phase
  bench/chaos/run.py --phases storm,rejoin   a subset
  bench/chaos/run.py --report                rebuild the table from the JSON
Writes bench/results/chaos.json and bench/results/chaos.md, and replaces the chaos
section of docs/benchmarks/faults.md (between its chaos markers).
"""
import argparse
import datetime
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("faults_run", os.path.join(ROOT, "bench", "faults", "run.py"))
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)
BIN = faults.BIN
RESULTS = os.path.join(ROOT, "bench", "results")
BEGIN, END = "<!-- chaos:begin -->", "<!-- chaos:end -->"
PHASES = ["reference", "chaos", "storm", "rejoin"]
# Enough restarts for a long schedule; a lost agent's job waits up to 2 min for cores.
EXTRA = 'task_max_restarts = 100\nreassign_timeout = "120s"\n'
TERMINAL = ("succeeded", "failed", "cancelled")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def job_toml(name, epochs, seed, train_samples=None, test_samples=None, batch=64):
    lines = [f'name = "{name}"', 'model = "cnn"', 'dataset = "fashion-mnist"',
             'data_dir = "/usr/share/datasets/fashion-mnist"', f"epochs = {epochs}", "workers = 2", "ps_shards = 1",
             f"batch_size = {batch}", "threads_per_task = 1", 'sync = "async"', f"seed = {seed}"]
    if train_samples:
        lines.append(f"train_samples = {train_samples}")
    if test_samples:
        lines.append(f"test_samples = {test_samples}")
    lines += ["", "[optimizer]", "lr = 0.05", "momentum = 0.9", "weight_decay = 5e-4", 'lr_schedule = "cosine"',
              "warmup_epochs = 0.5", ""]
    return "\n".join(lines)


def submit(c, name, toml):
    path = os.path.join(c.dir, f"{name}.toml")
    with open(path, "w") as f:
        f.write(toml)
    return json.loads(c.client("submit", path, "--json").stdout.strip().splitlines()[-1])["job"]


def task_processes(c):
    """(pid, task directory) of every task process of the cluster: its cwd is a task
    directory under one of the cluster's agents."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(c.dir + os.sep) and f"{os.sep}tasks{os.sep}" in cwd:
            out.append((int(pid), os.path.relpath(cwd, c.dir)))
    return out


def agent_usage(c):
    """{agent: (open fds, VmRSS kB)} of every agent process running now."""
    out = {}
    for name, p in c.procs.items():
        if name == "leader":
            continue
        try:
            fds = len(os.listdir(f"/proc/{p.pid}/fd"))
            rss = next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS:"))
            out[name] = (fds, rss)
        except (OSError, StopIteration):
            pass
    return out


def wait_terminal(c, job, timeout, on_tick=None):
    deadline = time.time() + timeout
    st = {}
    while time.time() < deadline:
        got = c.status(job)
        if got:
            st = got
            if st.get("state") in TERMINAL:
                return st
        if on_tick:
            on_tick(st)
        time.sleep(1.0)
    return st


def none_left(c, timeout=60):
    """Waits up to `timeout` for the cluster's task processes to end; returns those left."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = task_processes(c)
        if not left:
            return []
        time.sleep(0.5)
    return task_processes(c)


def pid_of(c, st, task):
    t = next((t for t in st.get("tasks", []) if t["task"] == task), None)
    if not t or t.get("state") != "running":
        return None, None
    try:
        return c.task_pid(st["job"], t["agent"], f"{task}-g{st['generation']}"), t["agent"]
    except RuntimeError:
        return None, t["agent"]


def run_reference(args):
    with faults.Cluster(args.agents, extra=EXTRA, prefix="dltrain-chaos-") as c:
        job = submit(c, "chaos-reference", job_toml("chaos-reference", args.epochs, args.seed))
        log(f"reference: {job} submitted")
        st = wait_terminal(c, job, args.timeout)
        left = none_left(c)
        log(f"reference: {st.get('state')}, accuracy {st.get('test_accuracy')}, wall {st.get('wall_seconds')}")
        return {"state": st.get("state"), "test_accuracy": st.get("test_accuracy"),
                "wall_seconds": st.get("wall_seconds"), "left_running": [d for _, d in left]}


class Schedule:
    """The seeded fault schedule of the chaos phase."""
    ACTIONS = [("kill-worker", 3), ("kill-ps", 2), ("stop-worker", 2), ("stop-ps", 1), ("kill-agent", 2),
               ("kill-leader", 1)]

    def __init__(self, c, job, seed, t0):
        self.c, self.job, self.rng = c, job, random.Random(seed)
        self.next_at = t0 + self.rng.uniform(20, 60)
        self.pending = []  # (time, description, fn)
        self.actions = []
        self.t0 = t0

    def record(self, what, target, note=""):
        row = {"t": round(time.time() - self.t0, 1), "action": what, "target": target, "note": note}
        self.actions.append(row)
        log(f"chaos t={row['t']:7.1f}s {what} {target} {note}")

    def later(self, delay, what, fn):
        self.pending.append((time.time() + delay, what, fn))

    def tick(self, st):
        now = time.time()
        for item in [p for p in self.pending if p[0] <= now]:
            self.pending.remove(item)
            try:
                item[2]()
                self.record(item[1], "", "")
            except Exception as e:  # a restart that failed is part of the record
                self.record(item[1], "", f"failed: {e}")
        if now < self.next_at or not st or st.get("state") in TERMINAL:
            return
        # One fault at a time: the next is drawn once everything pending has happened.
        if self.pending:
            return
        names, weights = zip(*self.ACTIONS)
        action = self.rng.choices(names, weights)[0]
        self.next_at = now + self.rng.uniform(20, 60)
        c = self.c
        if action in ("kill-worker", "stop-worker", "kill-ps", "stop-ps"):
            task = "ps-0" if action.endswith("ps") else self.rng.choice(["worker-0", "worker-1"])
            pid, agent = pid_of(c, st, task)
            if pid is None:
                return self.record(action, task, "skipped: not running now")
            if action.startswith("kill"):
                os.kill(pid, signal.SIGKILL)
                return self.record(action, f"{task} (pid {pid} on {agent})")
            os.kill(pid, signal.SIGSTOP)
            pause = self.rng.uniform(2, 10)
            self.record(action, f"{task} (pid {pid} on {agent})", f"for {pause:.1f} s")
            return self.later(pause, f"SIGCONT {task}", lambda: os.kill(pid, signal.SIGCONT))
        if action == "kill-agent":
            holders = sorted({t["agent"] for t in st.get("tasks", []) if t.get("state") == "running"
                              and t.get("agent") in c.procs})
            if not holders:
                return self.record(action, "", "skipped: no agent holds a running task")
            agent = self.rng.choice(holders)
            c.kill(agent)
            down = self.rng.uniform(3, 15)
            self.record(action, agent, f"down for {down:.1f} s")
            return self.later(down, f"restart {agent}", lambda: c.start(agent))
        c.kill("leader")
        down = self.rng.uniform(2, 8)
        self.record(action, "leader", f"down for {down:.1f} s")
        self.later(down, "restart leader", lambda: c.start("leader"))


def run_chaos(args):
    with faults.Cluster(args.agents, extra=EXTRA, prefix="dltrain-chaos-") as c:
        job = submit(c, "chaos", job_toml("chaos", args.epochs, args.seed))
        t0 = time.time()
        log(f"chaos: {job} submitted")
        usage_before = agent_usage(c)
        sched = Schedule(c, job, args.seed, t0)
        st = wait_terminal(c, job, args.timeout, on_tick=sched.tick)
        while sched.pending:  # restart whatever is still down
            time.sleep(0.5)
            sched.tick({})
        left = none_left(c)
        usage_after = agent_usage(c)
        log(f"chaos: {st.get('state')}, accuracy {st.get('test_accuracy')}, wall {st.get('wall_seconds')}, "
            f"{len(sched.actions)} actions, left running: {left}")
        restarts = sum(t.get("restarts", 0) for t in st.get("tasks", []))
        return {"state": st.get("state"), "test_accuracy": st.get("test_accuracy"),
                "wall_seconds": st.get("wall_seconds"), "generation": st.get("generation"),
                "reassignments": st.get("reassignments"), "error": st.get("error"),
                "task_restarts_last_generation": restarts, "actions": sched.actions,
                "left_running": [d for _, d in left],
                "agents_before": usage_before, "agents_after": usage_after}


def run_storm(args):
    rows = []
    with faults.Cluster(3, extra=EXTRA, prefix="dltrain-chaos-") as c:
        rows.append({"jobs": 0, "restarts": 0, "usage": agent_usage(c)})
        restarts = 0
        for i in range(args.storm_jobs):
            job = submit(c, f"storm-{i}", job_toml(f"storm-{i}", 2, i + 1, train_samples=6000, test_samples=1000,
                                                   batch=32))
            killed = []
            deadline = time.time() + 300
            st = {}
            for task in ("worker-1", "ps-0"):
                while time.time() < deadline:  # running, and its previous victim back
                    st = c.status(job)
                    if st.get("state") in TERMINAL:
                        break
                    pid, _ = pid_of(c, st, task)
                    others_back = all(t.get("state") == "running" for t in st.get("tasks", []))
                    if pid and others_back and st.get("state") == "running":
                        time.sleep(1.0)
                        os.kill(pid, signal.SIGKILL)
                        killed.append(task)
                        break
                    time.sleep(0.2)
            st = wait_terminal(c, job, 300)
            restarts += sum(t.get("restarts", 0) for t in st.get("tasks", []))
            left = none_left(c, 30)
            time.sleep(1.0)  # let the agents close what the ended tasks held
            usage = agent_usage(c)
            rows.append({"jobs": i + 1, "job": job, "state": st.get("state"), "killed": killed,
                         "restarts": restarts, "left_running": [d for _, d in left], "usage": usage})
            log(f"storm: {job} {st.get('state')}, killed {killed}, {restarts} task restarts so far, agents {usage}")
    return {"rows": rows}


def run_rejoin(args):
    extra = 'task_max_restarts = 2\nreassign_timeout = "60s"\n'
    with faults.Cluster(4, extra=extra, prefix="dltrain-chaos-") as c:
        job = submit(c, "rejoin", job_toml("rejoin", 20, 1, train_samples=12000, test_samples=1000, batch=32))
        losses = []
        st = {}
        for n in range(3):
            deadline = time.time() + 180
            while time.time() < deadline:
                st = c.status(job)
                if st.get("state") in TERMINAL:
                    break
                if st.get("state") == "running" and all(t.get("state") == "running" for t in st.get("tasks", [])):
                    break
                time.sleep(0.3)
            if st.get("state") in TERMINAL:
                break
            agent = next(t["agent"] for t in st["tasks"] if t["task"] == "worker-1")
            c.kill(agent)
            c.start(agent)  # back at once: a fast leave and rejoin
            losses.append({"loss": n + 1, "agent": agent, "generation_before": st.get("generation"),
                           "reassignments_before": st.get("reassignments")})
            log(f"rejoin: killed and restarted {agent} (loss {n + 1}), reassignments so far {st.get('reassignments')}")
            time.sleep(2.0)
        st = wait_terminal(c, job, 300)
        left = none_left(c)
        log(f"rejoin: {st.get('state')}: {st.get('error')}")
        return {"state": st.get("state"), "error": st.get("error"), "reassignments": st.get("reassignments"),
                "losses": losses, "left_running": [d for _, d in left],
                "limit_held": st.get("state") == "failed" and "already re-assigned 2 times" in (st.get("error") or "")}


def summary_md(doc):
    r, ch, storm, rj = (doc.get(k) for k in ("reference", "chaos", "storm", "rejoin"))
    lines = [f"Measured {doc['date']} on {doc['machine']}: `{doc['command']}`.", ""]
    if ch:
        ref_acc = r.get("test_accuracy") if r else None
        delta = (100 * (ch["test_accuracy"] - ref_acc)) if (ref_acc is not None and ch.get("test_accuracy")) else None
        kinds = {}
        for a in ch["actions"]:
            if not a["action"].startswith(("restart", "SIGCONT")):
                key = a["action"] + (" (skipped)" if a["note"].startswith("skipped") else "")
                kinds[key] = kinds.get(key, 0) + 1
        lines += ["| run | state | test accuracy | wall time | generation | faults injected | left running |",
                  "|---|---|---|---|---|---|---|"]
        if r:
            lines.append(f"| reference | {r['state']} | {r['test_accuracy']} | {r['wall_seconds']:.0f} s | | | "
                         f"{len(r['left_running'])} |")
        lines.append(f"| chaos (seed {doc['seed']}) | {ch['state']} | {ch['test_accuracy']} | "
                     f"{(ch['wall_seconds'] or 0):.0f} s | {ch['generation']} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))} | {len(ch['left_running'])} |")
        lines.append("")
        if delta is not None:
            lines.append(f"Chaos against reference: {delta:+.2f} points "
                         f"({'within' if abs(delta) <= 1 else '**not** within'} the goal of 1 point).")
            lines.append("")
    if storm:
        rows = storm["rows"]
        first, last = rows[0]["usage"], rows[-1]["usage"]
        lines += [f"Restart storm: {len(rows) - 1} jobs, {rows[-1]['restarts']} task restarts; every agent's open "
                  "file descriptors and resident memory after the first job and after the last:", "",
                  "| agent | fds at start | fds after job 1 | fds at end | max | RSS after job 1 | RSS at end |",
                  "|---|---|---|---|---|---|---|"]
        for a in sorted(last):
            fds = [row["usage"][a][0] for row in rows if a in row["usage"]]
            j1 = rows[1]["usage"].get(a, (None, None)) if len(rows) > 1 else (None, None)
            lines.append(f"| {a} | {first.get(a, ('-',))[0]} | {j1[0]} | {last[a][0]} | {max(fds)} | "
                         f"{(j1[1] or 0) / 1024:.1f} MiB | {last[a][1] / 1024:.1f} MiB |")
        states = [row.get("state") for row in rows[1:]]
        lines += ["", f"Jobs: {states.count('succeeded')} of {len(states)} succeeded; task processes left running "
                  f"after a job: {sum(len(row.get('left_running', [])) for row in rows[1:])}.", ""]
    if rj:
        lines += [f"Fast leave and rejoin (task_max_restarts = 2, the agent holding worker-1 killed and started again "
                  f"at once, {len(rj['losses'])} times): job {rj['state']}, `{rj['error']}`; the limit held: "
                  f"{'yes' if rj['limit_held'] else '**no**'}.", ""]
    return "\n".join(lines)


def write_reports(doc):
    md = summary_md(doc)
    with open(os.path.join(RESULTS, "chaos.md"), "w") as f:
        f.write(md)
    faults.replace_section(md, BEGIN, END)
    print(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    ap.add_argument("--seed", type=int, default=1, help="seed of the job and of the fault schedule")
    ap.add_argument("--epochs", type=int, default=36, help="epochs of the long job (36: about 7 min on 2 cores)")
    ap.add_argument("--agents", type=int, default=4, help="agents of 1 core for the long job (it takes 3)")
    ap.add_argument("--storm-jobs", type=int, default=25, help="short jobs of the storm, 2 task restarts each")
    ap.add_argument("--timeout", type=float, default=3600, help="bound on the long job, seconds")
    ap.add_argument("--out", default=os.path.join(RESULTS, "chaos.json"))
    ap.add_argument("--report", action="store_true", help="only rebuild the tables from --out")
    args = ap.parse_args()
    if args.report:
        return write_reports(json.load(open(args.out)))
    phases = args.phases.split(",")
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {unknown}; known: {PHASES}")
    if not os.path.exists(f"{BIN}/dltrain-agent"):
        ap.error(f"{BIN}/dltrain-agent not found: build first (scripts/test builds) or set DLTRAIN_BUILD_DIR")
    doc = {"date": datetime.date.today().isoformat(), "machine": faults.machine(),
           "command": " ".join(["bench/chaos/run.py", *sys.argv[1:]]), "seed": args.seed, "epochs": args.epochs,
           "provenance": faults.record(["bench/chaos/run.py", *sys.argv[1:]])}  # commit, date, CPU, command
    if os.path.exists(args.out):  # phases run separately add up
        old = json.load(open(args.out))
        doc.update({k: old[k] for k in PHASES if k in old and k not in phases})
    t0 = time.time()
    for p in phases:
        doc[p] = {"reference": run_reference, "chaos": run_chaos, "storm": run_storm, "rejoin": run_rejoin}[p](args)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    doc["total_seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    write_reports(doc)


if __name__ == "__main__":
    main()
