#!/usr/bin/env python3
"""Dense ASGD vs top-k vs DGC on Fashion-MNIST, through a real dltrain cluster.

Every PS shard and worker runs on its own agent. On `loopback` the agents share
127.0.0.1 (a standalone cluster); on `100mbit` each agent runs in its own network
namespace, linked to a bridge in the root namespace (where the leader runs) by a veth
pair rate-limited to 100 Mbit/s in both directions with tc tbf. The namespaces, links
and processes are created here and removed afterwards, also on error or Ctrl-C.

Usage (as root, after scripts/setup):
  bench/compression_bench.py [--links loopback,100mbit] [--seeds 1,2,3] [--methods ...]
                             [--model mlp] [--epochs 3] [--out bench/results]
Writes OUT/compression.json (every figure) and OUT/compression.md (tables).
Needs only the Python standard library; it is a benchmark driver, not part of dltrain.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(os.environ.get("DLTRAIN_BUILD_DIR", os.path.join(ROOT, "build")), "bin")
SUBNET = "10.77.0"
BRIDGE = "dltbr0"

# Every setting the figures were measured with is written out, so that a later change of
# method = "dgc"'s defaults (docs/compression.md, "Defaults") leaves them reproducible:
# per-epoch warm-up, every tensor sparsified.
_DGC = {"downlink_ratio": 0.01, "warmup_epochs": 1, "warmup_schedule": "per_epoch", "min_compress_bytes": 0}
METHODS = {
    "dense": {"method": "none"},
    "topk-1%": {"method": "topk", "ratio": 0.01, "downlink_ratio": 0.01, "warmup_epochs": 0},
    "dgc-10%": {"method": "dgc", "ratio": 0.1, **_DGC},
    "dgc-1%": {"method": "dgc", "ratio": 0.01, **_DGC},
    "dgc-0.1%": {"method": "dgc", "ratio": 0.001, **_DGC},
}


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Links:
    """Hosts PREFIX-h0..PREFIX-hN-1 on a bridge, each link rate-limited by tc tbf in both
    directions. Other benchmarks pass their own prefix, subnet and bridge, so that two of
    them can run on one machine."""

    def __init__(self, hosts, rate, prefix="dlt", subnet=SUBNET, bridge=BRIDGE):
        self.hosts = hosts
        self.rate = rate
        self.prefix, self.subnet, self.bridge = prefix, subnet, bridge
        self.made = []

    def __enter__(self):
        self.teardown(quiet=True)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.hosts):
            ns, outer = self.netns(i), f"{self.prefix}-v{i}"
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.made.append(("link", outer))
            sh("ip", "link", "set", outer, "master", self.bridge)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            for cmd in (["tc", "qdisc", "add", "dev", outer],
                        ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"]):
                sh(*cmd, "root", "tbf", "rate", self.rate, "burst", "256kbit", "latency", "100ms")
        return self

    def address(self, i):
        return f"{self.subnet}.{10 + i}"

    def netns(self, i):
        return f"{self.prefix}-h{i}"

    def leader_address(self):
        return f"{self.subnet}.1"

    def teardown(self, quiet=False):
        for i in range(16):
            sh("ip", "netns", "del", self.netns(i), check=False)
            sh("ip", "link", "del", f"{self.prefix}-v{i}", check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def __exit__(self, *exc):
        self.teardown()


def free_port(host):
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def write_tokens(d):
    """Writes random agent.token and client.token files (0600) into `d`; returns the
    client token."""
    tokens = {}
    for name in ("agent.token", "client.token"):
        tokens[name] = os.urandom(24).hex()
        with open(os.path.join(d, name), "w") as f:
            f.write(tokens[name] + "\n")
        os.chmod(os.path.join(d, name), 0o600)
    return tokens["client.token"]


class Cluster:
    """A leader (root namespace) and one agent per host, as real processes."""

    def __init__(self, hosts, links=None, prefix="dltrain-bench-", agent_log_level="warn", cores=1):
        """`agent_log_level`: the agents' log_level, which their tasks take too (a PS
        shard logs its step barrier's record at info). `cores`: each agent's cores (task
        slots of one thread), 2 for a PS shard beside a worker on every host."""
        self.hosts = hosts
        self.cores = cores
        self.agent_log_level = agent_log_level
        self.links = links
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.procs = []

    def __enter__(self):
        d = self.dir
        self.token = write_tokens(d)
        leader_ip = self.links.leader_address() if self.links else "127.0.0.1"
        port = free_port(leader_ip)
        self.url = f"ws://{leader_ip}:{port}"
        with open(os.path.join(d, "leader.toml"), "w") as f:
            f.write(f'leader = true\nhost_tasks = false\nlisten_address = "{leader_ip}"\nlisten_port = {port}\n'
                    f'agent_token_file = "{d}/agent.token"\nclient_token_file = "{d}/client.token"\n'
                    f'state_dir = "{d}/leader"\nlog_level = "warn"\n')
        self.spawn([f"{BIN}/dltrain-agent", "--config", f"{d}/leader.toml"], "leader.log")
        time.sleep(0.5)
        for i in range(self.hosts):
            addr = self.links.address(i) if self.links else "127.0.0.1"
            cfg = os.path.join(d, f"agent-{i}.toml")
            with open(cfg, "w") as f:
                f.write(f'name = "host-{i}"\nleader_url = "{self.url}"\nagent_token_file = "{d}/agent.token"\n'
                        f'advertise_address = "{addr}"\ntask_bind_address = "{addr}"\ncores = {self.cores}\n'
                        f'state_dir = "{d}/agent-{i}"\nlog_level = "{self.agent_log_level}"\n')
            cmd = [f"{BIN}/dltrain-agent", "--config", cfg]
            if self.links:
                cmd = ["ip", "netns", "exec", self.links.netns(i)] + cmd
            self.spawn(cmd, f"agent-{i}.log")
        deadline = time.time() + 60
        while time.time() < deadline:
            r = self.client("agents", "--json", check=False)
            if r.returncode == 0 and sum(a["state"] == "ready" for a in json.loads(r.stdout)["agents"]) == self.hosts:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"agents did not register; logs in {d}")

    def spawn(self, cmd, log):
        f = open(os.path.join(self.dir, log), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))

    def client(self, *args, check=True, timeout=60):
        return subprocess.run([f"{BIN}/dltrain", "--leader", self.url, "--token", self.token, *args],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", self.dir])


def job_toml(args, method, seed):
    c = METHODS[method]
    lines = [f'name = "bench-{method}-s{seed}"', f'model = "{args.model}"', 'dataset = "fashion-mnist"',
             f"epochs = {args.epochs}", f"workers = {args.workers}", "ps_shards = 1",
             f"batch_size = {args.batch_size}", f"train_samples = {args.train_samples}",
             f"test_samples = {args.test_samples}", f"seed = {seed}", "",
             "[optimizer]", f"lr = {args.lr}", "momentum = 0.9", 'lr_schedule = "cosine"', "warmup_epochs = 0.3", "",
             "[compression]"]
    for k, v in c.items():
        lines.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}")
    return "\n".join(lines) + "\n"


def run_job(cluster, args, method, seed):
    path = os.path.join(cluster.dir, f"{method}-{seed}.toml")
    with open(path, "w") as f:
        f.write(job_toml(args, method, seed))
    t0 = time.time()
    p = subprocess.Popen([f"{BIN}/dltrain", "--leader", cluster.url, "--token", cluster.token, "submit", path,
                          "--follow", "--json"], stdout=subprocess.PIPE, text=True)
    curve, summary, steps = [], None, {}
    for line in p.stdout:
        ev = json.loads(line)
        t = time.time() - t0
        if ev.get("event") == "epoch_end" and "test_accuracy" in ev:
            curve.append({"epoch": ev["epoch"], "seconds": t, "test_accuracy": ev["test_accuracy"]})
        if ev.get("event") == "done":
            steps[ev["task"]] = ev["steps"]
        if ev.get("event") == "summary":
            summary = ev
    p.wait(timeout=args.job_timeout)
    if summary is None or summary["state"] != "succeeded":
        raise RuntimeError(f"{method} seed {seed}: {summary}")
    total_steps = sum(steps.values()) or 1
    hit = next((c["seconds"] for c in curve if c["test_accuracy"] >= args.target), None)
    return {
        "method": method, "seed": seed, "final_accuracy": summary["test_accuracy"],
        "wall_seconds": summary["wall_seconds"], "seconds_to_target": hit, "curve": curve,
        "bytes_up_per_step": summary["bytes_pushed"] / total_steps,
        "bytes_down_per_step": summary["bytes_pulled"] / total_steps,
        "compression_up_after_warmup": summary.get("compression_ratio_up_after_warmup"),
        "compression_down_after_warmup": summary.get("compression_ratio_down_after_warmup"),
        "compression_after_warmup": summary.get("compression_ratio_after_warmup"),
    }


def mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.4g}"
    return f"{statistics.mean(xs):.4g} ± {statistics.stdev(xs):.2g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", default="loopback,100mbit")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--seeds-100mbit", default="1", help="seeds on the rate-limited links (slow for dense)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-samples", type=int, default=12000)
    ap.add_argument("--test-samples", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--target", type=float, default=0.75)
    ap.add_argument("--job-timeout", type=int, default=1800)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    if os.geteuid() != 0 and "100mbit" in args.links:
        sys.exit("compression_bench: the 100mbit links need root (ip netns, tc)")
    os.makedirs(args.out, exist_ok=True)
    methods = args.methods.split(",")
    results = []
    hosts = args.workers + 1
    for link in args.links.split(","):
        seeds = [int(s) for s in (args.seeds if link == "loopback" else args.seeds_100mbit).split(",")]
        links = Links(hosts, "100mbit") if link == "100mbit" else None
        try:
            if links:
                links.__enter__()
            with Cluster(hosts, links) as cluster:
                for method in methods:
                    for seed in seeds:
                        r = run_job(cluster, args, method, seed)
                        r["link"] = link
                        results.append(r)
                        print(f"[{link}] {method} seed {seed}: accuracy {r['final_accuracy']:.4f}, "
                              f"{r['wall_seconds']:.1f} s, to {args.target}: {r['seconds_to_target']}, "
                              f"up {r['bytes_up_per_step']:.0f} B/step, down {r['bytes_down_per_step']:.0f} B/step",
                              flush=True)
        finally:
            if links:
                links.__exit__(None, None, None)
    with open(os.path.join(args.out, "compression.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=2)
    md = [f"Model `{args.model}`, {args.workers} workers + 1 PS shard (each on its own agent), batch "
          f"{args.batch_size} per worker, {args.epochs} epochs on the first {args.train_samples} training images, "
          f"test accuracy on the first {args.test_samples} test images; target accuracy {args.target}.", "",
          "| link | method | seeds | final accuracy | wall s | s to target | up B/step | down B/step | "
          "up ratio (after warm-up) | down ratio (after warm-up) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for link in args.links.split(","):
        for method in methods:
            rs = [r for r in results if r["link"] == link and r["method"] == method]
            if not rs:
                continue
            md.append(f"| {link} | {method} | {len(rs)} | {mean_sd([r['final_accuracy'] for r in rs])} | "
                      f"{mean_sd([r['wall_seconds'] for r in rs])} | {mean_sd([r['seconds_to_target'] for r in rs])} | "
                      f"{mean_sd([r['bytes_up_per_step'] for r in rs])} | {mean_sd([r['bytes_down_per_step'] for r in rs])} | "
                      f"{mean_sd([r['compression_up_after_warmup'] for r in rs])} | "
                      f"{mean_sd([r['compression_down_after_warmup'] for r in rs])} |")
    with open(os.path.join(args.out, "compression.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
