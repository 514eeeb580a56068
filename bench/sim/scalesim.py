"""A discrete-event scale model of one dltrain (or DDP) training job.

What it models (docs/benchmarks/scale.md, "Scale model", says where it is right and wrong):
  - N workers, each with its own full-duplex link to one switch (bandwidth B/s and
    one-way latency s per direction); S PS shards, each with its own link (its own
    bandwidth and latency). The switch never drops and has unbounded buffers.
  - A worker step: local compute (forward, backward, encoding; `compute_s`, one value or
    one per worker, optionally with a gamma-distributed jitter of coefficient of
    variation `compute_cv`), then the exchange.
  - PS modes (one flat model cut evenly over the S shards): the worker sends
    `up_bytes / S` to every shard (its uplink serialises them, shard by shard), each shard
    queues arrivals on its ingress link, applies them one at a time on its CPU
    (`ps_apply_s / S` per push, plus `ps_pull_s / S` per pull: the sparse downlink's
    x − x_seen and its top-k; the pull request travels right behind the push on the same
    connection, so outside bsp both are one service), and answers `down_bytes / S` over its egress link to the
    worker's downlink. A transfer is pipelined across its two hops (cut-through): the
    receiving link starts when the first byte arrives (sender start + latency) and ends
    no earlier than the sender's end + latency; each link direction serves messages
    first come, first served.
      async  asynchronous SGD (dltrain's dense ASGD and DGC): every push is applied and
             answered as it arrives.
      bsp    bulk-synchronous: a shard answers the pulls of step t only once it has
             applied the pushes of every worker for step t (a barrier per step).
      ssp    stale-synchronous parallel with bound s (Ho et al. 2013, "More Effective
             Distributed ML via a Stale Synchronous Parallel Parameter Server", §2): a
             worker that has completed c steps starts step c + 1 only when the slowest
             worker has completed at least c − s; pushes and pulls as in async.
  - ddp    synchronous data parallelism with a ring all-reduce of the gradient (PyTorch
           DDP with gloo): after every worker's compute, 2(N − 1) phases in each of which
           every worker sends G/N bytes to its ring neighbour, so one step's exchange
           takes 2(N − 1)·(latency + G/(N·B)) and each worker sends 2(N − 1)/N·G bytes
           (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters
           of workstations", JPDC 69(2)). No overlap of the all-reduce with the backward
           pass is modelled.
  - Shared cores (`cores`): when the N workers share C cores (the calibration runs on this
    machine), every worker's compute takes max(1, N·threads/C) times longer
    (processor sharing). None = every worker has its own cores.

Units: seconds, bytes, bytes per second. Everything is deterministic for a given `seed`.
"""
import heapq
import math
import random

MODES = ("async", "bsp", "ssp", "ddp")


class Link:
    """One direction of one link: a first-come-first-served server of messages."""

    def __init__(self, bandwidth, latency):
        if not (bandwidth > 0):
            raise ValueError(f"link bandwidth must be > 0 bytes/s, got {bandwidth}")
        if latency < 0:
            raise ValueError(f"link latency must be >= 0 s, got {latency}")
        self.bandwidth, self.latency, self.free_at = bandwidth, latency, 0.0

    def serve(self, now, nbytes, min_end=0.0):
        start = max(now, self.free_at)
        end = max(start + (nbytes / self.bandwidth if math.isfinite(self.bandwidth) else 0.0), min_end)
        self.free_at = end
        return start, end


class Cpu:
    """A shard's apply thread: first come, first served."""

    def __init__(self):
        self.free_at = 0.0

    def serve(self, now, seconds):
        start = max(now, self.free_at)
        self.free_at = start + seconds
        return start, self.free_at


def _field(cfg, name, default=None, required=False):
    if name in cfg:
        return cfg[name]
    if required:
        raise ValueError(f"scale model: missing field \"{name}\"")
    return default


def simulate(cfg):
    """Runs one job. `cfg` (a dict) fields:
      mode            "async" | "bsp" | "ssp" | "ddp"
      workers         N >= 1
      steps_per_epoch steps each worker runs per epoch (>= 1)
      epochs          epochs to run (default 1)
      compute_s       seconds of local work per step (a number, or a list of N numbers)
      compute_cv      coefficient of variation of a gamma jitter of compute (default 0)
      cores, threads  shared cores (None: dedicated) and threads per worker (default 1)
      up_bytes        bytes a worker sends per step, all shards together (PS modes)
      down_bytes      bytes a worker receives per step (PS modes)
      grad_bytes      the gradient a DDP step all-reduces (ddp)
      ps_shards       S (PS modes, default 1)
      ps_apply_s      shard CPU per push, whole model (divided by S; default 0)
      ps_pull_s       shard CPU per pull, whole model (divided by S; default 0)
      bandwidth       worker link bytes/s per direction (math.inf: no serialisation)
      latency         worker link one-way latency, s
      ps_bandwidth, ps_latency   the shards' links (default: the workers')
      ssp_bound       s for mode ssp (>= 0)
      seed            jitter seed (default 1)
    Returns {"epoch_seconds": [makespan of each epoch: the last worker's end of epoch e
    minus that of epoch e − 1], "worker_epoch_seconds": [mean over workers of their own
    epoch durations], "finish": [each worker's end time], "total_seconds": last end,
    "bytes_sent_per_worker_step": ..., "steps": N·epochs·steps_per_epoch}.
    Raises ValueError naming the field for a missing or out-of-range value."""
    mode = _field(cfg, "mode", required=True)
    if mode not in MODES:
        raise ValueError(f"scale model: mode must be one of {', '.join(MODES)}, got \"{mode}\"")
    n = int(_field(cfg, "workers", required=True))
    if n < 1:
        raise ValueError(f"scale model: workers must be >= 1, got {n}")
    k = int(_field(cfg, "steps_per_epoch", required=True))
    epochs = int(_field(cfg, "epochs", 1))
    if k < 1 or epochs < 1:
        raise ValueError("scale model: steps_per_epoch and epochs must be >= 1")
    compute = _field(cfg, "compute_s", required=True)
    compute = list(compute) if isinstance(compute, (list, tuple)) else [float(compute)] * n
    if len(compute) != n or any(c < 0 for c in compute):
        raise ValueError(f"scale model: compute_s must be >= 0, one number or {n} of them")
    cv = float(_field(cfg, "compute_cv", 0.0))
    cores = _field(cfg, "cores")
    threads = int(_field(cfg, "threads", 1))
    slow = max(1.0, n * threads / cores) if cores else 1.0
    rng = random.Random(_field(cfg, "seed", 1))

    def compute_time(w):
        c = compute[w] * slow
        if cv > 0 and c > 0:
            shape = 1.0 / (cv * cv)
            return rng.gammavariate(shape, c / shape)
        return c

    bw = float(_field(cfg, "bandwidth", math.inf))
    lat = float(_field(cfg, "latency", 0.0))
    total_steps = k * epochs
    ends = [[0.0] * total_steps for _ in range(n)]  # ends[w][t]: worker w's step t done

    if mode == "ddp":
        g = float(_field(cfg, "grad_bytes", required=True))
        ring = 2 * (n - 1) * (lat + (g / (n * bw) if math.isfinite(bw) else 0.0)) if n > 1 else 0.0
        t = 0.0
        for step in range(total_steps):
            t = max(t + compute_time(w) for w in range(n)) + ring
            for w in range(n):
                ends[w][step] = t
        sent = 2 * (n - 1) / n * g
        return _result(ends, n, k, epochs, sent)

    s_count = int(_field(cfg, "ps_shards", 1))
    if s_count < 1:
        raise ValueError(f"scale model: ps_shards must be >= 1, got {s_count}")
    up = float(_field(cfg, "up_bytes", required=True)) / s_count
    down = float(_field(cfg, "down_bytes", required=True)) / s_count
    apply_s = float(_field(cfg, "ps_apply_s", 0.0)) / s_count
    pull_s = float(_field(cfg, "ps_pull_s", 0.0)) / s_count
    ps_bw = float(_field(cfg, "ps_bandwidth", bw))
    ps_lat = float(_field(cfg, "ps_latency", lat))
    bound = int(_field(cfg, "ssp_bound", 0))
    if mode == "ssp" and bound < 0:
        raise ValueError(f"scale model: ssp_bound must be >= 0, got {bound}")

    w_up = [Link(bw, lat) for _ in range(n)]
    w_down = [Link(bw, lat) for _ in range(n)]
    s_in = [Link(ps_bw, ps_lat) for _ in range(s_count)]
    s_out = [Link(ps_bw, ps_lat) for _ in range(s_count)]
    cpu = [Cpu() for _ in range(s_count)]

    heap, seq = [], [0]

    def at(t, fn, *args):
        heapq.heappush(heap, (t, seq[0], fn, args))
        seq[0] += 1

    done = [0] * n           # steps completed per worker
    replies = [0] * n        # shard replies of the step in progress
    parked = set()           # ssp: workers waiting for the slowest
    # bsp: per shard and step, the workers whose push is applied
    applied = [dict() for _ in range(s_count)]

    def start_step(w, now):
        at(now + compute_time(w), pushed, w)

    def pushed(w, now):
        # The worker's uplink sends to every shard in turn; each message is pipelined
        # into the shard's ingress link.
        for s in range(s_count):
            st, en = w_up[w].serve(now, up)
            at(st + lat, ingress, w, s, en + lat)

    def ingress(w, s, min_end, now):
        _, en = s_in[s].serve(now, up, min_end)
        at(en, arrived, w, s)

    def arrived(w, s, now):
        # The pull request travels right behind the push on the same connection: outside
        # bsp the shard applies the push and answers the pull in one go.
        if mode != "bsp":
            _, en = cpu[s].serve(now, apply_s + pull_s)
            return at(en, egress, w, s)
        _, en = cpu[s].serve(now, apply_s)
        at(en, applied_push, w, s)

    def applied_push(w, s, now):
        step = done[w]
        group = applied[s].setdefault(step, [])
        group.append(w)
        if len(group) == n:
            del applied[s][step]
            for v in sorted(group):
                answer(v, s, now)

    def answer(w, s, now):  # bsp: the pulls held at the barrier, one after the other
        _, en = cpu[s].serve(now, pull_s)
        at(en, egress, w, s)

    def egress(w, s, now):
        st, en = s_out[s].serve(now, down)
        at(st + ps_lat, downlink, w, en + ps_lat)

    def downlink(w, min_end, now):
        _, en = w_down[w].serve(now, down, min_end)
        at(en, reply, w)

    def reply(w, now):
        replies[w] += 1
        if replies[w] < s_count:
            return
        replies[w] = 0
        ends[w][done[w]] = now
        done[w] += 1
        if mode == "ssp":
            for v in sorted(parked):
                if may_start(v):
                    parked.discard(v)
                    start_step(v, now)
        if done[w] < total_steps:
            if mode == "ssp" and not may_start(w):
                parked.add(w)
            else:
                start_step(w, now)

    def may_start(w):
        return min(done) >= done[w] - bound

    for w in range(n):
        start_step(w, 0.0)
    while heap:
        t, _, fn, args = heapq.heappop(heap)
        fn(*args, t)
    if any(d != total_steps for d in done):
        raise RuntimeError(f"scale model: the run stalled with steps done {done}")
    return _result(ends, n, k, epochs, up * s_count)


def _result(ends, n, k, epochs, sent):
    epoch_end = [max(ends[w][(e + 1) * k - 1] for w in range(n)) for e in range(epochs)]
    epoch_seconds = [epoch_end[0]] + [epoch_end[e] - epoch_end[e - 1] for e in range(1, epochs)]
    worker_epoch = []
    for e in range(epochs):
        durs = [ends[w][(e + 1) * k - 1] - (ends[w][e * k - 1] if e else 0.0) for w in range(n)]
        worker_epoch.append(sum(durs) / n)
    return {"epoch_seconds": epoch_seconds, "worker_epoch_seconds": worker_epoch,
            "finish": [ends[w][-1] for w in range(n)], "total_seconds": max(ends[w][-1] for w in range(n)),
            "bytes_sent_per_worker_step": sent, "steps": n * k * epochs}


def ring_allreduce_seconds(workers, grad_bytes, bandwidth, latency):
    """Closed form of one ring all-reduce (Patarasuk & Yuan 2009): 2(N−1)·(α + G/(N·B))."""
    if workers == 1:
        return 0.0
    return 2 * (workers - 1) * (latency + grad_bytes / (workers * bandwidth))


def dense_bytes(floats, partitions, header=48):
    """Bytes of a dense fp32 push (or dense pull reply) of `floats` in `partitions`
    frames: 4 per float plus one frame header each (docs/protocol.md)."""
    return 4 * floats + header * partitions


def sparse_bytes(partition_lengths, ratio, header=48):
    """Bytes of a sparse fp32 push or sparse pull reply (codec 3): per partition of n
    floats, k = max(1, ⌈ratio·n⌉) u32 indices and k fp32 values, plus a frame header."""
    return sum(8 * max(1, math.ceil(ratio * p)) + header for p in partition_lengths)
