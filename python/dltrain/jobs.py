"""Job files and jobs: `JobSpec` (a job file as a dict) and `Job` (a job on the leader)."""
import json
import logging
import os
import sys
import time
import tomllib
import urllib.parse
from collections.abc import MutableMapping

from . import events as events_mod
from . import models as models_mod
from .errors import ConfigError, DltrainError, JobFailed, NoLeader, Unavailable, WaitTimeout

log = logging.getLogger("dltrain")

TERMINAL_STATES = ("succeeded", "failed", "cancelled")


class JobSpec(MutableMapping):
    """A job file's settings as a dict of its TOML keys and tables (docs/training.md lists
    them): `{"model": "cnn", "epochs": 3, "optimizer": {"lr": 0.05}}`. `base_dir` is the
    directory the job's relative paths (data_dir, model_file, init_from) start from: the
    job file's directory, or the current directory for a spec built in code.

    A spec read from a file is sent as the file's own text until it is changed; any other
    is written as TOML (tomli-w). The leader validates it and names a bad field."""

    def __init__(self, fields=None, base_dir=None, **more):
        self._fields = dict(fields or {})
        self._fields.update(more)
        self.base_dir = os.path.abspath(base_dir or os.getcwd())
        self._text = None
        self.source = "a job spec"

    @classmethod
    def from_file(cls, path):
        """The job file at `path` (TOML). Raises ConfigError when it does not exist, cannot be
        read or is not TOML (naming the file and, for TOML, the line)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ConfigError("job file %r %s" % (path, "is not a regular file" if os.path.exists(path) else
                                                   "does not exist"))
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError("cannot read job file %r: %s" % (path, e)) from None
        spec = cls.from_toml(text, os.path.dirname(os.path.abspath(path)))
        spec.source = "job file %r" % path
        return spec

    @classmethod
    def from_toml(cls, text, base_dir=None):
        """A spec from a job file's text. Raises ConfigError when it is not TOML."""
        try:
            fields = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError("the job is not valid TOML: %s" % e) from None
        spec = cls(fields, base_dir)
        spec._text = text
        return spec

    @classmethod
    def of(cls, job):
        """`job` as a JobSpec: a JobSpec (copied), a dict, or a path to a job file."""
        if isinstance(job, JobSpec):
            spec = cls(job._fields, job.base_dir)
            spec._text, spec.source = job._text, job.source
            return spec
        if isinstance(job, dict):
            return cls(job)
        if isinstance(job, (str, os.PathLike)):
            return cls.from_file(job)
        raise ConfigError("job must be a dict, a JobSpec or the path of a job file, not %s" % type(job).__name__)

    def __getitem__(self, key):
        return self._fields[key]

    def __setitem__(self, key, value):
        self._fields[key] = value
        self._text = None

    def __delitem__(self, key):
        del self._fields[key]
        self._text = None

    def __iter__(self):
        return iter(self._fields)

    def __len__(self):
        return len(self._fields)

    def __repr__(self):
        return "JobSpec(%r, base_dir=%r)" % (self._fields, self.base_dir)

    def to_toml(self):
        """The job file's text: the file's own while unchanged, else the fields written with
        tomli-w. Raises ConfigError when tomli-w is missing or a value has no TOML form."""
        if self._text is not None:
            return self._text
        try:
            import tomli_w
        except ImportError:
            raise ConfigError("writing a job as TOML needs tomli-w: apt install python3-tomli-w "
                              "(or pip install tomli-w)") from None
        return tomli_w.dumps(_toml_values(self._fields, ""))

    def local_path(self, value):
        """A path of the job as this machine sees it: relative ones from base_dir."""
        return os.path.normpath(os.path.join(self.base_dir, os.fspath(value)))


def _toml_values(value, key):
    """`value` with NumPy scalars and arrays (a notebook's usual numbers) as Python's, and
    tuples as lists; ConfigError naming the key (e.g. "optimizer.lr") for a value TOML
    cannot hold (None, an object)."""
    if isinstance(value, dict):
        return {k: _toml_values(v, "%s.%s" % (key, k) if key else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_toml_values(v, "%s[%d]" % (key, i)) for i, v in enumerate(value)]
    if isinstance(value, (str, bool, int, float)):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _toml_values(value.tolist(), key)
    raise ConfigError("%s = %r: TOML has no such value (%s); leave the key out for its default" %
                      (key, value, type(value).__name__), field=key)


def checkpoint_name(checkpoint):
    """"last", "best", "epoch-N"; an int or a string of digits N means "epoch-N"."""
    c = str(checkpoint)
    return "epoch-" + c if c.isdigit() else c


class Job:
    """A job on the leader, by id ("job-3"). `info` is the job as the leader last returned
    it (settings, state, progress, test accuracy, tasks; `dltrain status JOB --json`).
    From `Client.submit`, also `warning` (the leader's, or None) and `model_export` (what
    was done with a model passed to submit: "scripted", "traced", "scriptmodule" (it was
    TorchScript already), "file" (a path), or None).

    Thread-safety: as the Client's (every method may be called from any thread);
    `events()` uses a session of its own."""

    def __init__(self, client, job_id, info=None):
        self.client, self.id = client, job_id
        self.info = info or {}
        self.warning = None
        self.model_export = None

    def __repr__(self):
        return "Job(%r, state=%r)" % (self.id, self.info.get("state"))

    @property
    def state(self):
        """The state as last seen (call status() to refresh)."""
        return self.info.get("state")

    def status(self):
        """The job now, as a dict (`dltrain status JOB --json`); also kept as `info`."""
        self.info = self.client._call("status", {"job": self.id})
        return self.info

    def cancel(self):
        """Cancels the job; returns its new state ("cancelling" or "cancelled"). Raises
        Conflict for a job that has ended."""
        r = self.client._call("cancel", {"job": self.id}, retry=False)
        self.info["state"] = r.get("state")
        return r.get("state")

    def scale(self, workers):
        """Resizes a running elastic job (its job file's [elastic] bounds) to `workers`
        without restarting it (docs/training.md, "Elastic jobs"); returns the leader's
        answer: {"job", "from", "to", "started", "leaving"}. Raises InvalidJob outside the
        bounds (the message names them), Conflict for a job that is not elastic, not
        running, still resizing or that cannot grow now, Forbidden for another user's job."""
        r = self.client._call("scale", {"job": self.id, "workers": int(workers)}, retry=False)
        self.info["workers"] = r.get("to")
        return r

    def events(self, timeout=None):
        """An iterator of the job's events (dltrain.events) from now until its summary, which
        is the last one (at once for a job that has ended). `timeout` (s, None = no
        limit) bounds the whole iteration: WaitTimeout when it runs out, the job goes on.

        When the connection to the leader is lost (with HA, a failover; else the leader's
        restart), the iterator connects to the first candidate that serves within
        `Client.failover_timeout` and follows the job there, yielding a client-side
        `reconnected` event {from, to, seconds} (`to` is another candidate's URL after a
        failover), then the events the leader stored (state changes, epoch ends, the
        summary, ...) since this iteration began that it had not yielded, in order; none is
        yielded twice (an event is the same when it is equal but for its "time" and "job"),
        as `dltrain follow` does. Progress events sent while no leader served are not
        stored, and not repeated. Raises NoLeader when no leader serves in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        session = self.client._open_session()
        seen = set()

        def key(body):
            return json.dumps({k: v for k, v in body.items() if k not in ("time", "job")}, sort_keys=True)

        try:
            # Subscribe first, then note how far the stored log went: an event stored in
            # between comes live and is yielded then.
            self.client._follow(session, self.id)
            since = self._stored(session, 1)
            since = since[-1].get("time", 0.0) if since else 0.0
            pending = []
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout("%s has not ended within %g s" % (self.id, timeout))
                wait = 1.0 if deadline is None else max(0.01, min(1.0, deadline - time.monotonic()))
                try:
                    body = pending.pop(0) if pending else session.next_event(wait)
                except NoLeader as e:
                    session.close()
                    lost_at, old = time.monotonic(), session.url
                    log.warning("dltrain: %s; looking for the leader among %s", e.message, ", ".join(self.client.urls))
                    session = self.client._open_session(self.client.failover_timeout, follow_restart=True)
                    self.client._follow(session, self.id)
                    pending = [dict(s, job=self.id) for s in self._stored(session, 1000) if s.get("time", 0.0) > since]
                    yield events_mod.from_json({"event": "reconnected", "job": self.id, "from": old,
                                                "to": session.url, "seconds": time.monotonic() - lost_at})
                    continue
                if body is None or body.get("job") != self.id:
                    continue
                if len(seen) < 200000:
                    k = key(body)
                    if k in seen:
                        continue
                    seen.add(k)
                ev = events_mod.from_json(body)
                if isinstance(ev, events_mod.StateChanged):
                    self.info["state"] = ev.state
                yield ev
                if isinstance(ev, events_mod.Summary):
                    self.info["state"] = ev.state
                    return
        finally:
            session.close()

    def _stored(self, session, limit):
        """The last `limit` (1-1000) events the leader stores for this job, oldest first."""
        return session.request("events", {"job": self.id, "limit": limit}, self.client.timeout).get("events", [])

    def wait(self, timeout=None, progress=None):
        """Follows the job until it ends and returns its summary (`events.Summary`: state,
        test_accuracy, epochs, wall_seconds, bytes_pushed, bytes_pulled, images_per_sec,
        ...). Raises JobFailed when it failed or was cancelled, WaitTimeout after `timeout`
        s (the job goes on). `progress`: a progress bar (tqdm, on stderr or in a notebook);
        None = when tqdm is installed and stderr is a terminal or this runs in a notebook."""
        bar = _progress_bar(self.id, progress)
        shown = 0.0
        last_status = 0.0
        summary = None
        said_waiting = False
        try:
            for ev in self.events(timeout):
                if ev.kind == "summary":
                    summary = ev
                if isinstance(ev, events_mod.Waiting) and ev.fits_cluster is False and not said_waiting:
                    said_waiting = True  # as `dltrain follow` says it: the job cannot start as the cluster is
                    log.warning("dltrain: %s waits: it needs %s cores, the agents registered have %s in all; it "
                                "starts when agents join (or cancel it)", self.id, ev.cores_needed, ev.cores_total)
                if bar is None:
                    continue
                post = {}
                if isinstance(ev, (events_mod.Progress, events_mod.EpochEnd)):
                    if ev.epoch is not None:
                        post["epoch"] = ev.epoch
                    if ev.loss is not None:
                        post["loss"] = "%.4f" % ev.loss
                    if ev.test_accuracy is not None:
                        post["acc"] = "%.4f" % ev.test_accuracy
                    if time.monotonic() - last_status >= 2.0 or isinstance(ev, events_mod.EpochEnd):
                        last_status = time.monotonic()
                        try:  # the bar's figure only: a failed look leaves it as it was
                            p = self.status().get("progress")
                        except DltrainError:
                            p = None
                        if p is not None and p * 100 > shown:
                            bar.update(p * 100 - shown)
                            shown = p * 100
                elif isinstance(ev, events_mod.Summary) and ev.state == "succeeded":
                    bar.update(100 - shown)
                    shown = 100
                    if ev.test_accuracy is not None:
                        post["acc"] = "%.4f" % ev.test_accuracy
                if post:
                    bar.set_postfix(post, refresh=False)
        finally:
            if bar is not None:
                bar.close()
        if summary.state != "succeeded":
            raise JobFailed(self.id, summary.state, summary)
        return summary

    def logs(self, task="worker-0", tail=50):
        """The last `tail` lines (0–10,000) of `task`'s log (its stderr and its events), read
        from its agent through the leader. Raises NotFound (no such task) and Unavailable
        (its agent is not connected)."""
        r = self.client._call("logs", {"job": self.id, "task": task, "tail": int(tail)})
        return r.get("text", "")

    def follow_logs(self, task="worker-0", tail=50, poll=1.0):
        """An iterator of `task`'s log text: the last `tail` lines, then what it appends,
        read every `poll` s, until the task has ended and everything was read (a task that
        has not started yet is waited for while the job has not ended)."""
        body = {"job": self.id, "task": task, "tail": int(tail)}
        while True:
            r = self.client._call("logs", body)
            if r.get("text"):
                yield r["text"]
            drained = r.get("next_offset", 0) >= r.get("size", 0)
            if not r.get("exists") and not r.get("running"):
                # No log yet: the task has not started (or never will, once the job ended).
                if self.status().get("state") in TERMINAL_STATES:
                    return
                time.sleep(poll)
                continue
            if not r.get("running") and drained:
                return
            body = {"job": self.id, "task": task, "offset": r.get("next_offset", 0), "max_bytes": 1 << 20}
            if drained:
                time.sleep(poll)

    def model(self, checkpoint="last", dir=None, load=True, timeout=None):
        """The job's trained model (`models.TrainedModel`): downloaded into `dir` (default
        $XDG_CACHE_HOME/dltrain/models/<leader host>_<port>/<job>-<checkpoint>; a file
        already there with the right SHA-256 is kept, a model file the model does not have
        is removed), each file checked against the SHA-256 the leader keeps, then
        loaded with PyTorch unless `load` is False. `checkpoint`: "last", "best", or N / "N"
        (after epoch N; [checkpoint] in the job). Waits up to `timeout` s (default: the
        client's) while the leader still collects it. Raises NotFound (no such model: the
        message lists the models kept and the job's state) and Unavailable."""
        checkpoint = checkpoint_name(checkpoint)
        limit = self.client.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            r = self.client._call("models", {"job": self.id})
            listed = [m for m in r.get("models", []) if m.get("checkpoint") == checkpoint]
            if listed or not r.get("collecting"):
                break
            if time.monotonic() >= deadline:
                raise Unavailable("the leader was still collecting the model of %s after %g s" % (self.id, limit),
                                  code="unavailable", field="job")
            time.sleep(0.5)
        manifest = models_mod.choose(r, self.id, checkpoint)
        if dir is None:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME") or "/root", ".cache")
            leader = urllib.parse.urlsplit(self.client.leader or self.client.urls[0])
            dir = os.path.join(cache, "dltrain", "models", "%s_%s" % (leader.hostname, leader.port),
                               "%s-%s" % (self.id, checkpoint))
        models_mod.download(lambda t, b: self.client._call(t, b), self.id, checkpoint, manifest, dir)
        return models_mod.TrainedModel(dir, manifest, load)

    def resume(self):
        """A new job that continues this failed or cancelled one from its latest epoch
        checkpoint ([checkpoint] every_epochs), at the epoch it reached. Its `info` has
        `resumed_from`, `checkpoint` and `resume_epoch`. Raises Conflict for a job that runs
        or succeeded, NotFound when no checkpoint of it is kept."""
        r = self.client._call("resume", {"job": self.id, "follow": False}, retry=False)
        job = Job(self.client, r["job"], dict(r))
        job.warning = r.get("warning")
        return job


def _progress_bar(job_id, progress):
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            log.warning("dltrain: no progress bar: tqdm is not installed (apt install python3-tqdm)")
        return None
    notebook = "ipykernel" in sys.modules
    if progress is None and not (notebook or sys.stderr.isatty()):
        return None
    return tqdm(total=100, desc=job_id, unit="%", bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}")
