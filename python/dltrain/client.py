"""`Client`: the requests of the `dltrain` command, from Python."""
import collections
import logging
import os
import threading

from . import models as models_mod
from .config import find_leader
from .connection import IDLE_REUSE_SECONDS, ReplyTimeout, connect_first, tls_context
from .errors import ConfigError, NoLeader, Unauthorized
from .jobs import Job, JobSpec

log = logging.getLogger("dltrain")

# Requests that must not be sent twice: when the connection is lost before the reply,
# the leader may have acted on them (a second submit would be a second job).
NOT_RETRIED = frozenset({"submit", "resume", "cancel"})


class Client:
    """A connection to a dltrain cluster's leader.

    `leader`, `token` and `ca_file` are found as the `dltrain` command finds them when not
    given (dltrain.config: the arguments, DLTRAIN_LEADER / DLTRAIN_TOKEN / DLTRAIN_CA_FILE,
    the client configuration files, a local standalone cluster's file). `leader` is one
    ws:// or wss:// URL or, with HA, the candidates' URLs separated by commas (the one that
    serves answers). `timeout` (s) bounds each request and each connection, as the CLI's
    --timeout; `failover_timeout` (s) how long a follower looks for a new leader after
    losing one (also a single leader's restart). Both in (0, 3600].

    The client connects on its first request, and again (to the first candidate that
    serves) when the connection was lost or idle for over 10 s (the leader closes a silent
    session after 30 s); a request whose connection is lost before its reply is sent again
    once, except one the leader may have acted on (submit, resume, cancel), which raises
    NoLeader, as does a reply that does not come within `timeout`. Methods may be called from
    several threads (requests are serialised). Raises ConfigError (no leader or token
    configured, a bad client configuration); requests raise the exceptions of
    dltrain.errors. Use as a context manager, or call close()."""

    def __init__(self, leader=None, token=None, ca_file=None, timeout=30.0, failover_timeout=60.0):
        for name, value in (("timeout", timeout), ("failover_timeout", failover_timeout)):
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ConfigError("%s must be a number of seconds in (0, 3600], not %r" % (name, value), field=name)
        self.target = find_leader(leader, token, ca_file)
        self.urls = self.target.urls
        self.timeout = float(timeout)
        self.failover_timeout = float(failover_timeout)
        self._tls = tls_context(self.target.ca_file) if any(u.startswith("wss://") for u in self.urls) else None
        self.leader = None  # the URL of the leader the client last spoke to
        self._session = None
        self._sent = collections.Counter()
        self._lock = threading.RLock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the client's session (a later request opens a new one)."""
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None

    def __repr__(self):
        return "Client(%r, source=%r)" % (self.target.leader, self.target.source)

    # --- sessions ---------------------------------------------------------------------

    def _open_session(self, total=None, follow_restart=False):
        try:
            session, i = connect_first(self.urls, self.target.token, total or self.timeout, self._tls,
                                       say=lambda m: log.warning("dltrain: %s", m), rounds_for_one=follow_restart)
        except Unauthorized as e:
            raise Unauthorized("%s: check the token (from %s)" % (e.message, self.target.token_source),
                               code=e.code) from None
        self.leader = self.urls[i]
        return session

    def _drop_session(self):
        if self._session is not None:
            self._session.close()
            self._session = None

    def _call(self, type_, body, timeout=None, retry=True):
        """The reply body of request `type_`; errors as the class docstring says."""
        with self._lock:
            if self._session is not None and self._session.idle_seconds() > IDLE_REUSE_SECONDS:
                self._drop_session()
            if self._session is None:
                self._session = self._open_session()
            try:
                self._sent[type_] += 1
                return self._session.request(type_, body, timeout or self.timeout)
            except ReplyTimeout:
                self._drop_session()
                raise
            except NoLeader:
                self._drop_session()
                if not retry or type_ in NOT_RETRIED:
                    raise
            self._session = self._open_session(self.failover_timeout, follow_restart=True)
            try:
                return self._session.request(type_, body, timeout or self.timeout)
            except NoLeader:
                self._drop_session()
                raise

    def _follow(self, session, job_id):
        return session.request("follow", {"job": job_id}, self.timeout)

    @property
    def sent(self):
        """The message types this client's sessions sent, counted (events() sessions apart)."""
        return self._sent

    # --- jobs -------------------------------------------------------------------------

    def _job_request(self, job, model, example_input, follow=False):
        """The body of a submit or plan request for `job` and `model`, uploading what the
        leader needs first (docs/protocol.md, "Models")."""
        spec = JobSpec.of(job)
        body = {}
        export = None
        upload = lambda what, content, field: models_mod.upload(lambda t, b: self._call(t, b), content, what, field)  # noqa: E731
        if model is not None:
            named = spec.get("model")
            if named not in (None, "torchscript"):
                raise ConfigError('%s says model = "%s"; a model passed with it needs model = "torchscript" or none'
                                  % (spec.source, named), field="model")
            if "model_file" in spec:
                raise ConfigError("%s names model_file %r and a model is passed too: give one of them"
                                  % (spec.source, spec["model_file"]), field="model_file")
            if isinstance(model, (str, os.PathLike)):
                path = os.fspath(model)
                content = models_mod.read_model_file(path, "model")
                name, export = os.path.basename(path), "file"
            else:
                content, export = models_mod.export_module(model, example_input)
                name = type(model).__name__ + ".pt"
            spec["model"] = "torchscript"
            spec["model_file"] = name
            body["model_sha256"] = upload("model %s" % name, content, "model")
        elif spec.get("model") == "torchscript" and isinstance(spec.get("model_file"), str):
            # As `dltrain submit`: a model file here is uploaded; one that is not here is for
            # the leader to read at its path (a shared file system).
            path = spec.local_path(spec["model_file"])
            if os.path.isfile(path):
                body["model_sha256"] = upload(path, models_mod.read_model_file(path, "model_file"), "model_file")
        init_from = spec.get("init_from")
        if isinstance(init_from, str) and os.path.isdir(spec.local_path(init_from)):
            sd = os.path.join(spec.local_path(init_from), "state_dict.pt")
            if not os.path.isfile(sd):
                raise ConfigError("%r has no state_dict.pt (a model directory is what Job.model() or "
                                  "`dltrain model get` writes)" % spec.local_path(init_from), field="init_from")
            body["init_sha256"] = upload(sd, models_mod.read_model_file(sd, "init_from"), "init_from")
        body.update({"job_toml": spec.to_toml(), "base_dir": spec.base_dir, "follow": follow})
        return body, export

    def submit(self, job, model=None, example_input=None):
        """Submits `job` — a dict of the job file's keys, a JobSpec, or a job file's path —
        and returns its `Job` (queued or starting; `warning` holds the leader's warning).

        `model`, when given, is the network to train: a `torch.nn.Module` (made TorchScript
        with torch.jit.script, or, when that fails and `example_input` is given, with
        torch.jit.trace, with a warning; `Job.model_export` says which), a
        `torch.jit.ScriptModule`, or the path of a TorchScript file. It is uploaded to the
        leader (once per content) and the job gets model = "torchscript". Without it, a
        torchscript job's model_file and an init_from model directory that are on this
        machine are uploaded as `dltrain submit` does.

        Raises InvalidJob naming the field the leader refused, ConfigError for what is wrong
        here (a file, a model that can be neither scripted nor traced), Infeasible, NoLeader
        and Unavailable."""
        body, export = self._job_request(job, model, example_input)
        r = self._call("submit", body, retry=False)
        j = Job(self, r["job"], {"job": r["job"], "state": r.get("state")})
        j.warning = r.get("warning")
        j.model_export = export
        return j

    def plan(self, job, model=None, example_input=None):
        """The planner's decision for `job` (as submit takes it) without running anything:
        the reply of `dltrain plan --json`, {feasible, explanation, choice: {workers,
        batch_size}, table (every configuration with its predictions), explore,
        kept_previous} (docs/protocol.md, docs/planner.md)."""
        body, _ = self._job_request(job, model, example_input)
        del body["follow"]
        return self._call("plan", body)

    def job(self, job_id):
        """The `Job` with id `job_id` ("job-3"), its `info` fresh. Raises NotFound."""
        j = Job(self, job_id)
        j.status()
        return j

    def jobs(self, limit=100):
        """The latest `limit` jobs (1–10,000), in submission order, as `Job`s whose `info` is
        what `dltrain list --json` prints for each."""
        r = self._call("list", {"limit": int(limit)})
        return [Job(self, j["job"], j) for j in r.get("jobs", [])]

    def leader_info(self):
        """The leader line of `dltrain list`: {name, ha, since_unix, term, candidates}."""
        return self._call("agents", {}).get("leader", {})

    def agents(self):
        """The registered agents (`dltrain agents --json`): name, state, cores, memory,
        GPUs, tasks, metrics endpoint, ..."""
        return self._call("agents", {}).get("agents", [])

    def history(self, model=None, dataset=None):
        """The planner's performance observations (`dltrain history --json`), filtered by
        model and data set when given."""
        body = {}
        if model:
            body["model"] = model
        if dataset:
            body["dataset"] = dataset
        return self._call("history", body).get("observations", [])

    def models(self, job=None):
        """The trained models the leader keeps (of `job` when given), newest first: their
        manifests (job, checkpoint, model, dataset, test_accuracy, epochs, created_unix,
        files with bytes and SHA-256). Job.model() downloads one."""
        return self._call("models", {"job": job} if job else {}).get("models", [])
