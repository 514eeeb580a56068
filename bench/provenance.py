#!/usr/bin/env python3
"""Where and when a benchmark result was measured: every result file under
bench/results/ carries the commit, the date, the CPU (model and cores) and the command.

As a module: machine(), commit(), and record(command), the block a benchmark writes
into its result file as "provenance".

As a command:
  bench/provenance.py --check      lists each result file that lacks one of commit, date,
                                   cpu or command; exit status 1 when one does
  bench/provenance.py --backfill   gives each such file what git and the file itself can
                                   say of it, marked as such: the commit that added the
                                   file (the run measured the tree before it), the date
                                   the file names or that commit's date, and "not recorded
                                   by the run" for a CPU or command nobody wrote down. A
                                   JSON object gets a "provenance" key; a file of JSON
                                   lines or an array gets a NAME.provenance.json beside it.
A file passes when its JSON (or its provenance file) has the keys "commit", "date",
"command" and "cpu" (or "machine") anywhere in it.
"""
import datetime
import glob
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
FIELDS = ("commit", "date", "cpu", "command")
NOT_RECORDED = "not recorded by the run"


def machine():
    """The CPU model, core count and platform, for a result file's record."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.platform()}"


def git(*args, root=ROOT):
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True).stdout.strip()


def commit(root=ROOT):
    """The commit of checkout `root` (12 hex digits), marked when tracked files differ from it."""
    head = git("rev-parse", "--short=12", "HEAD", root=root) or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no", root=root)
                   else "")


def record(command):
    """The provenance block of a result measured now by `command` (a string or argv)."""
    if not isinstance(command, str):
        command = " ".join(command)
    return {"commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": machine(), "command": command}


def result_files():
    return sorted(f for f in glob.glob(os.path.join(RESULTS, "*.json")) if not f.endswith(".provenance.json"))


def sidecar(path):
    return path[:-len(".json")] + ".provenance.json"


def missing(path):
    """The fields of FIELDS that `path` (with its provenance file) lacks."""
    text = open(path).read()
    if os.path.exists(sidecar(path)):
        text += open(sidecar(path)).read()
    keys = set(re.findall(r'"([A-Za-z_]+)"\s*:', text))
    out = [f for f in FIELDS if f not in keys]
    if "cpu" in out and "machine" in keys:
        out.remove("cpu")
    return out


def load(path):
    """(the JSON value, whether it is one object) of a result file; JSON lines are a list."""
    text = open(path).read()
    try:
        value = json.loads(text)
    except ValueError:
        value = [json.loads(line) for line in text.splitlines() if line.strip()]
    return value, isinstance(value, dict)


def backfill(path, lacks):
    rel = os.path.relpath(path, ROOT)
    added = git("log", "--diff-filter=A", "--format=%h %ad", "--date=short", "--", rel).splitlines()
    first = added[-1].split() if added else ["uncommitted", datetime.date.today().isoformat()]
    text = open(path).read()
    day = re.search(r"20\d\d-\d\d-\d\d", text)
    block = {}
    if "commit" in lacks:
        block["commit"] = "%s added this file; the run measured the tree before it (it did not record its commit)" % first[0]
    if "date" in lacks:
        block["date"] = (day.group(0) + " (named in the file)") if day else (first[1] + " (the day it was committed; "
                                                                             "the run did not record its date)")
    if "cpu" in lacks:
        block["cpu"] = NOT_RECORDED
    if "command" in lacks:
        block["command"] = NOT_RECORDED + " (the page in docs/benchmarks/ that cites this file names the script)"
    value, is_object = load(path)
    if is_object and "provenance" not in value:
        value["provenance"] = block
        with open(path, "w") as f:
            json.dump(value, f, indent=1)
            f.write("\n")
    else:
        with open(sidecar(path), "w") as f:
            json.dump({"provenance": block, "of": os.path.basename(path)}, f, indent=1)
            f.write("\n")


def main(argv):
    if argv[1:] not in (["--check"], ["--backfill"]):
        print(__doc__, file=sys.stderr)
        return 2
    bad = {p: missing(p) for p in result_files()}
    bad = {p: m for p, m in bad.items() if m}
    if argv[1] == "--backfill":
        for p, m in bad.items():
            backfill(p, m)
            print("%s: added %s" % (os.path.relpath(p, ROOT), ", ".join(m)))
        return 0
    for p, m in bad.items():
        print("%s lacks %s" % (os.path.relpath(p, ROOT), ", ".join(m)))
    print("%d of %d result files lack provenance" % (len(bad), len(result_files())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
