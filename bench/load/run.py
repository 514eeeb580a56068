#!/usr/bin/python3
"""Control-plane load benchmark: one real leader under simulated agents and clients.

For every cell (agents x clients) a fresh leader is started: a real dltrain-agent with
leader = true, host_tasks = false, listen_port = 0 on 127.0.0.1, its own state directory
(RocksDB store included) and the production heartbeat settings (every 1 s, lost after
10 s). Then build/bin/control_load runs against it: every simulated agent and client is a
real WebSocket session speaking the real protocol (see control_load --help). A cell
measures for --duration seconds once every session is up, then waits for the submitted
jobs to end. Per cell: latency p50/p99 per request kind, heartbeat round trips, agents
the leader declared lost (its own `agents` view, and "lost:" lines in its log), errors,
jobs, the leader's RSS and CPU (from /proc/PID), the tool's CPU.

The load tool shares the machine with the leader: on a small machine its CPU is
reported beside the leader's, and its own timer lateness says when it fell behind.

Usage (after a build; DLTRAIN_BUILD_DIR picks the build directory):
  bench/load/run.py                           the grid: 100, 500, 1000 agents x 100, 1000 clients
  bench/load/run.py --agents 1000 --clients 100 --duration 30
  bench/load/run.py --stress                  the grid, then the sweeps that look for the limits
  bench/load/run.py --only-stress             only the sweeps
  bench/load/run.py --report                  rebuild the tables from bench/results/load.json
  bench/load/run.py --smoke                   5 agents, 3 clients, a few seconds; exit 1 unless clean
Extra control_load flags go after --, e.g. `bench/load/run.py -- --client-interval 0.5`.
Writes bench/results/load.json and load.md and replaces the section between the load
markers of docs/benchmarks/load.md (not with --smoke or a custom grid and --out elsewhere).
Standard library only.
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from compression_bench import BIN, write_tokens  # noqa: E402
from provenance import record  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

RESULTS = os.path.join(ROOT, "bench", "results")
DOC = os.path.join(ROOT, "docs", "benchmarks", "load.md")
BEGIN, END = "<!-- load:begin -->", "<!-- load:end -->"


def machine():
    """The machine line of the other benchmarks (bench/faults/run.py)."""
    spec = importlib.util.spec_from_file_location("faults_run", os.path.join(ROOT, "bench", "faults", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.machine()


def raise_fd_limit():
    """Every session is a descriptor in the tool and one in the leader: soft limit = hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def leader_config(d, heartbeat_interval, heartbeat_timeout, etcd_url=None, port=0):
    """The leader's configuration; with `etcd_url`, a leader candidate ([ha]) on that
    etcd, its state there instead of RocksDB (a candidate needs a fixed `port`)."""
    text = (f'name = "leader"\nleader = true\nhost_tasks = false\nlisten_address = "127.0.0.1"\nlisten_port = {port}\n'
            f'state_dir = "{d}/state"\nagent_token_file = "{d}/agent.token"\n'
            f'client_token_file = "{d}/client.token"\nheartbeat_interval = "{heartbeat_interval}"\n'
            f'heartbeat_timeout = "{heartbeat_timeout}"\nlog_level = "info"\n')
    if etcd_url:
        text += f'\n[ha]\netcd = ["{etcd_url}"]\nlease_ttl = "10s"\n'
    return text


def machine_busy(seconds=3.0):
    """CPU % of all cores together (200 = both cores of a 2-core machine) over `seconds`."""
    def read():
        v = [float(x) for x in open("/proc/stat").readline().split()[1:9]]
        return sum(v) - v[3] - v[4], time.time()
    (b0, t0), _ = read(), time.sleep(seconds)
    b1, t1 = read()
    return 100.0 * (b1 - b0) / os.sysconf("SC_CLK_TCK") / (t1 - t0)


def wait_for_quiet(args):
    """Waits (up to --quiet-wait seconds) until other processes use less than
    --quiet-below % of a core; returns the last reading."""
    deadline = time.time() + args.quiet_wait
    busy = machine_busy()
    while busy > args.quiet_below and time.time() < deadline:
        print(f"   machine busy {busy:.0f} % (other processes); waiting for it to calm down", flush=True)
        time.sleep(10)
        busy = machine_busy()
    return busy


def run_cell(args, agents, clients, extra, label="", duration=None):
    """One fresh leader and one control_load run against it (`duration`: measured
    seconds, default --duration); returns the tool's report plus what the driver saw
    (the leader's log, the commands)."""
    duration = duration or args.duration
    busy_before = wait_for_quiet(args) if args.quiet_wait > 0 else None
    d = tempfile.mkdtemp(prefix="dltrain-load-")
    write_tokens(d)
    cfg = os.path.join(d, "leader.toml")
    members = []
    if args.store == "etcd":
        # A one-member etcd of its own per cell (Debian's etcd-server), the leader a candidate on it.
        from etcd_cluster import free_port, start_cluster  # noqa: E402
        members, urls = start_cluster(d, 1)
        with open(cfg, "w") as f:
            f.write(leader_config(d, args.heartbeat_interval, args.heartbeat_timeout, urls[0], free_port()))
    else:
        with open(cfg, "w") as f:
            f.write(leader_config(d, args.heartbeat_interval, args.heartbeat_timeout))
    log_path = os.path.join(d, "leader.log")
    log = open(log_path, "w")
    leader = subprocess.Popen([f"{BIN}/dltrain-agent", "-c", cfg], stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    endpoint = os.path.join(d, "state", "leader.json")
    deadline = time.time() + 30
    while not os.path.exists(endpoint) and time.time() < deadline and leader.poll() is None:
        time.sleep(0.05)
    if not os.path.exists(endpoint):
        leader.kill()
        raise SystemExit(f"the leader did not start; its log:\n{open(log_path).read()}")
    tool = [f"{BIN}/control_load", "--leader-file", endpoint, "--agent-token-file", f"{d}/agent.token",
            "--client-token-file", f"{d}/client.token", "--agents", str(agents), "--clients", str(clients),
            "--duration", str(duration), "--leader-pid", str(leader.pid), "--out", f"{d}/report.json",
            *extra]
    shown = " ".join(["control_load", "--agents", str(agents), "--clients", str(clients), "--duration",
                      f"{duration:g}", *extra])
    print(f"== {label or 'cell'}: {shown}", flush=True)
    bound = duration + 400
    t0 = time.time()
    try:
        proc = subprocess.run(tool, capture_output=True, text=True, timeout=bound)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        code, stderr = -1, f"control_load ran past {bound} s"
    wall = time.time() - t0
    leader.send_signal(signal.SIGTERM)
    try:
        leader.wait(30)
    except subprocess.TimeoutExpired:
        leader.kill()
        leader.wait()
    log.close()
    for m in members:
        m.kill()
    text = open(log_path, errors="replace").read()
    try:
        report = json.load(open(f"{d}/report.json"))
    except (OSError, ValueError):
        report = {"passed": False}
    report["cell"] = {"label": label, "agents": agents, "clients": clients, "extra": extra, "duration": duration,
                      "command": shown, "machine_busy_before_percent": busy_before,
                      "tool_exit": code, "tool_stderr": stderr.strip()[-2000:], "wall_s": wall}
    # Independent of the tool: what the leader itself logged (spdlog's "agent X lost: why").
    report["leader_log"] = {"agents_lost": len(re.findall(r"\] agent \S+ lost: ", text)),
                            "errors": len(re.findall(r" error \[leader\]", text)),
                            "warnings": len(re.findall(r" warning \[leader\]", text)),
                            "lines": text.count("\n")}
    sys.stdout.write(stderr)
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
        name = f"{len(os.listdir(args.keep_logs)) // 2:02d}-{label or 'cell'}-a{agents}-c{clients}".replace(" ", "_")
        subprocess.run(["cp", log_path, os.path.join(args.keep_logs, name + ".log")], check=False)
        subprocess.run(["cp", f"{d}/report.json", os.path.join(args.keep_logs, name + ".json")], check=False)
    subprocess.run(["rm", "-rf", d], check=False)
    return report


def stress_cells():
    """The sweeps past the grid: (label, agents, clients, extra control_load flags,
    measured seconds or None for --duration)."""
    cells = []
    # Clients think less and less: with 0.001 s each waits on the leader nearly always.
    for think in ("0.5", "0.1", "0.02", "0.001"):
        cells.append(("client think time", 1000, 1000, ["--client-interval", think], None))
    for agents in (2000, 5000, 9000):
        cells.append(("agents", agents, 100, [], None))
    # Many jobs in the leader: `list` answers with every one of them.
    cells.append(("job history", 1000, 100, ["--submit-rate", "20", "--job-epochs", "1", "--epoch-seconds", "2",
                                             "--progress-interval", "1"], 150))
    return cells


def fmt(v, digits=1):
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def lat(r, kind, p):
    v = r.get("latency_ms", {}).get(kind)
    return None if not v else v[p]


def cell_name(r):
    c = r["cell"]
    extra = " ".join(c["extra"])
    name = (c["label"] or "grid") + (f" `{extra}`" if extra else "")
    return name + (f" ({c['duration']:g} s)" if c["label"] and "duration" in c else "")


def per_second(r, key):
    return r.get("messages", {}).get(key, 0) / max(r.get("phases", {}).get("window_s", 0), 1e-9)


def tables(rows):
    """Two tables: round trips per request kind; health and resources."""
    pair = lambda r, k: f"{fmt(lat(r, k, 'p50'), 2)} / {fmt(lat(r, k, 'p99'), 2)}"  # noqa: E731
    kinds = ["heartbeat", "status", "list", "follow", "submit", "register", "task_event", "event_relay"]
    head = "| cell | agents | clients | " + " | ".join(f"{k} p50 / p99" for k in kinds) + " |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        c = r["cell"]
        out.append(f"| {cell_name(r)} | {c['agents']} | {c['clients']} | " +
                   " | ".join(pair(r, k) for k in kinds) + " |")
    out.append("")
    head = ("| cell | agents | clients | msgs/s to / from leader | client requests/s | leader max silence s | agents lost (log) | errors "
            "| jobs succeeded | leader CPU % | leader RSS MB (max) | leader µs CPU / msg | tool CPU % "
            "| tool timer lateness p99 ms | other processes CPU % |")
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        c = r["cell"]
        l = r.get("leader", {})
        j = r.get("jobs", {})
        out.append("| " + " | ".join([
            cell_name(r), str(c["agents"]), str(c["clients"]),
            f"{fmt(per_second(r, 'to_leader'), 0)} / {fmt(per_second(r, 'from_leader'), 0)}",
            fmt(r.get("messages", {}).get("client_requests_per_second"), 0),
            fmt(r.get("heartbeats", {}).get("leader_max_silence_s"), 2),
            f"{r.get('agents_lost', {}).get('lost', '?')} ({r.get('leader_log', {}).get('agents_lost', '?')})",
            str(r.get("errors", {}).get("total", "?")),
            f"{j.get('succeeded', '?')}/{j.get('submitted', '?')}",
            fmt(l.get("cpu_percent_window")), fmt(l.get("rss_mb_max")), fmt(l.get("cpu_us_per_message")),
            fmt(r.get("tool", {}).get("cpu_percent_window")),
            fmt(r.get("tool_timer_lateness_ms", {}).get("p99"), 2),
            fmt(r.get("machine", {}).get("others_percent_window"))]) + " |")
    return "\n".join(out)


def markdown(doc):
    lines = [f"Measured {doc['date']} on {doc['machine']}: `{doc['command']}`. Each cell: a fresh leader "
             f"(heartbeat every {doc['settings']['heartbeat_interval']}, lost after "
             f"{doc['settings']['heartbeat_timeout']}), {doc['settings']['duration']} s measured after every session "
             "is up; latencies are round trips seen by the load tool (request sent → reply read), in ms.", ""]
    grid = [r for r in doc["runs"] if not r["cell"]["label"]]
    stress = [r for r in doc["runs"] if r["cell"]["label"]]
    if grid:
        lines += [tables(grid), ""]
    if stress:
        lines += ["Past the grid (`--stress`):", "", tables(stress), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_reports(doc, out_md, update_doc):
    md = markdown(doc)
    with open(out_md, "w") as f:
        f.write(md)
    if not update_doc:
        return
    text = open(DOC).read()
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        with open(DOC, "w") as f:
            f.write(pre + BEGIN + "\n" + md + END + post)


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="100,500,1000", help="comma-separated agent counts of the grid")
    ap.add_argument("--clients", default="100,1000", help="comma-separated client counts of the grid")
    ap.add_argument("--duration", type=float, default=60, help="measured seconds per cell")
    ap.add_argument("--heartbeat-interval", default="1s", help="the leader's heartbeat_interval")
    ap.add_argument("--heartbeat-timeout", default="10s", help="the leader's heartbeat_timeout")
    ap.add_argument("--stress", action="store_true", help="after the grid, the sweeps past it")
    ap.add_argument("--only-stress", action="store_true", help="only the sweeps past the grid")
    ap.add_argument("--smoke", action="store_true",
                    help="5 agents, 3 clients, 6 s, short jobs; checks the report and exits 1 unless clean")
    ap.add_argument("--store", choices=["rocksdb", "etcd"], default="rocksdb",
                    help="the leader's state: RocksDB (a single leader, the default) or a one-member etcd (a "
                         "leader candidate with [ha], docs/ha.md); write etcd runs elsewhere with --out")
    ap.add_argument("--out", default=os.path.join(RESULTS, "load.json"))
    ap.add_argument("--out-md", default=os.path.join(RESULTS, "load.md"))
    ap.add_argument("--report", action="store_true", help="only rebuild the tables from --out")
    ap.add_argument("--keep-logs", metavar="DIR", help="keep each cell's leader log and report in DIR")
    ap.add_argument("--quiet-wait", type=float, default=600,
                    help="before each cell, wait up to this many seconds for other processes to calm down (0: no)")
    ap.add_argument("--quiet-below", type=float, default=30,
                    help="'calm': the machine busy below this %% of one core before the cell starts")
    args = ap.parse_args(argv)
    default_out = os.path.abspath(args.out) == os.path.join(RESULTS, "load.json")
    if args.report:
        write_reports(json.load(open(args.out)), args.out_md, default_out)
        return 0
    if not os.path.exists(f"{BIN}/control_load") or not os.path.exists(f"{BIN}/dltrain-agent"):
        ap.error(f"{BIN}/control_load or dltrain-agent not found: build them first (ninja -C build control_load "
                 "dltrain-agent) or set DLTRAIN_BUILD_DIR")
    hard = raise_fd_limit()
    if args.smoke:
        args.duration = 6
        args.quiet_wait = 0  # a test: it runs whatever else the machine does
        r = run_cell(args, 5, 3, ["--epoch-seconds", "1", "--progress-interval", "0.5", "--task-start", "0.2",
                                  "--submit-rate", "1", "--client-interval", "0.5", "--drain-timeout", "15", *extra])
        problems = []
        if r.get("errors", {}).get("total") != 0:
            problems.append(f"errors: {r.get('errors')}")
        if r.get("agents_lost", {}).get("lost") != 0 or r.get("leader_log", {}).get("agents_lost") != 0:
            problems.append(f"agents lost: {r.get('agents_lost')} (leader log: {r.get('leader_log')})")
        jobs = r.get("jobs", {})
        if not jobs.get("submitted") or jobs.get("succeeded") != jobs.get("submitted"):
            problems.append(f"jobs: {jobs}")
        if r.get("heartbeats", {}).get("acked", 0) < 5 * 4:
            problems.append(f"heartbeats: {r.get('heartbeats')}")
        if problems or not r.get("passed"):
            print("smoke: FAILED\n  " + "\n  ".join(problems or [r["cell"]["tool_stderr"]]))
            return 1
        print(f"smoke: ok ({jobs['succeeded']} jobs, {r['heartbeats']['acked']} heartbeats, 0 errors, 0 lost)")
        return 0
    cells = []
    if not args.only_stress:
        cells += [("", int(a), int(c), list(extra), None) for a in args.agents.split(",")
                  for c in args.clients.split(",")]
    if args.stress or args.only_stress:
        cells += [(label, a, c, e + list(extra), d) for label, a, c, e, d in stress_cells()]
    need = max(a + c for _, a, c, _, _ in cells) + 64
    if need > hard:
        ap.error(f"{need} file descriptors are needed per process and the hard limit is {hard}")
    t0 = time.time()
    runs = [run_cell(args, a, c, e, label, d) for label, a, c, e, d in cells]
    doc = {"date": datetime.date.today().isoformat(), "machine": machine(),
           "command": " ".join(["bench/load/run.py", *[shlex.quote(a) for a in sys.argv[1:]]]),
           "provenance": record(["bench/load/run.py", *[shlex.quote(a) for a in sys.argv[1:]]]),
           "settings": {"duration": args.duration, "heartbeat_interval": args.heartbeat_interval,
                        "heartbeat_timeout": args.heartbeat_timeout, "store": args.store},
           "total_seconds": time.time() - t0, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    write_reports(doc, args.out_md, default_out)
    print(markdown(doc))
    return 0 if all(r.get("passed") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
