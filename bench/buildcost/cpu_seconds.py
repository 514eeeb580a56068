#!/usr/bin/env python3
"""Where a build spends its CPU time: every Ninja step's seconds from a build directory's
.ninja_log (each compile is one single-threaded process, so with a cold cache the sum of
the steps is the build's CPU time, which `time` confirms to within its system time),
summed by directory (a unity build's unit counts for the directory of its sources) and
listed for the costliest steps.

Usage: cpu_seconds.py BUILD_DIR [--top N] [--json OUT] [--command "what was built"]

The quick start's build, measured cold (the numbers of docs/benchmarks/build.md):

    rm -rf /tmp/qs && CCACHE_DISABLE=1 cmake -S . -B /tmp/qs -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DDLTRAIN_BUILD_TESTS=OFF -DDLTRAIN_BUILD_BENCH=OFF
    CCACHE_DISABLE=1 cmake --build /tmp/qs -j 2 --target dltrain dltrain-agent dltrain-ps dltrain-worker
    bench/buildcost/cpu_seconds.py /tmp/qs --json bench/results/build-quickstart.json

Only the steps of the last build of each output count (.ninja_log keeps one line per
output per build; the last wins), so measure in a fresh directory.
"""
import argparse
import collections
import datetime
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from standalone import build_commit  # noqa: E402


def steps(build_dir):
    """{output: seconds} of the last build of each output in BUILD_DIR/.ninja_log."""
    out = {}
    with open(os.path.join(build_dir, ".ninja_log")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, _mtime, target, _hash = line.rstrip("\n").split("\t")
            out[target] = (int(end) - int(start)) / 1000.0
    return out


def group(target):
    """The source directory of an object (lib/train, lib/control, daemon, client), else
    what the step makes (a precompiled header, a link)."""
    if ".dir/" in target and target.endswith(".o"):
        lib, rest = target.split("/CMakeFiles/", 1) if "/CMakeFiles/" in target else ("", target)
        src = rest.split(".dir/", 1)[1].rsplit("/", 1)
        if len(src) == 2 and src[0] == "Unity":
            # A unity unit (cmake/build_cost.cmake): unity_<group>_cxx.cxx.o, the group
            # being the directory its sources share, or the target's name for a program's.
            name = src[1][len("unity_"):].split("_cxx.", 1)[0]
            return (lib + "/" + name) if lib == "lib" else lib
        return (lib + "/" + src[0]) if len(src) == 2 else lib
    return "link and other steps"


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--command", default="the quick start's four programs, cold (see --help)")
    a = ap.parse_args()
    s = steps(a.build_dir)
    by = collections.Counter()
    for t, sec in s.items():
        by[group(t)] += sec
    total = sum(s.values())
    print("%d steps, %.0f CPU-s" % (len(s), total))
    for g, sec in by.most_common():
        print("  %-36s %7.1f" % (g, sec))
    print("costliest steps:")
    for t, sec in sorted(s.items(), key=lambda kv: -kv[1])[:a.top]:
        print("  %7.1f  %s" % (sec, t))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"commit": build_commit(os.path.join(a.build_dir, "bin")), "date": datetime.datetime.fromtimestamp(os.path.getmtime(
                os.path.join(a.build_dir, ".ninja_log")), datetime.timezone.utc).date().isoformat(), "cpu": cpu_model(),
                       "cores": os.cpu_count(), "command": a.command, "steps": len(s),
                       "cpu_seconds": round(total, 1), "by_directory": {g: round(v, 1) for g, v in by.most_common()},
                       "costliest": [{"step": t, "seconds": round(v, 1)} for t, v in
                                     sorted(s.items(), key=lambda kv: -kv[1])[:a.top]]}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
