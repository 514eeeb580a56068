"""The exceptions the client raises, in the classes of the `dltrain` command's exit codes.

Every exception is a `DltrainError` with

- `message`: what went wrong, the leader's own words when it refused a request;
- `code`: the leader's error code (`invalid_job`, `not_found`, `conflict`, `infeasible`,
  `unauthorized`, `forbidden`, `unavailable`, `bad_request`, `internal`; docs/protocol.md), or None when
  the client itself found the problem;
- `field`: the job field or request field the leader named (`batch_size`,
  `optimizer.lr`, `job`), or None;
- `exit_code`: what `dltrain` exits with for the same error: 1 (`JobFailed`), 2
  (`BadInput`: the request, the job or the client's settings are wrong), 3
  (`Unavailable`: the leader cannot be reached or cannot take the request now) or 4
  (`Forbidden`: the job is another user's).

    try:
        job = client.submit(spec)
    except dltrain.InvalidJob as e:
        print(e.field, e.message)
"""


class DltrainError(Exception):
    """Base class. `str(e)` is the message, with the field and code when there are."""

    exit_code = 2

    def __init__(self, message, code=None, field=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field or None

    def __str__(self):
        s = self.message
        if self.field and self.field not in s:
            s = "%s: %s" % (self.field, s)
        if self.code:
            s += " [%s]" % self.code
        return s


class BadInput(DltrainError):
    """Exit class 2: the request, the job, a file or the client's settings are wrong."""

    exit_code = 2


class ConfigError(BadInput):
    """The client's settings or a local file: no leader configured, a client configuration
    that is not TOML, a job file or model file that cannot be read, a model that can be
    neither scripted nor traced."""


class InvalidJob(BadInput):
    """The leader refused the job (`invalid_job`) or the request's body (`bad_request`);
    `field` names the field."""


class Unauthorized(BadInput):
    """The leader refused the client token (HTTP 401, or `unauthorized`)."""


class NotFound(BadInput):
    """No such job, task or model (`not_found`)."""


class Conflict(BadInput):
    """The request does not fit the job's state, e.g. cancelling a finished job or resuming
    one that succeeded (`conflict`)."""


class Infeasible(BadInput):
    """The planner or the cluster cannot run the job as asked (`infeasible`)."""


class Forbidden(DltrainError):
    """Exit class 4: the job is another user's, and this token's user is no admin
    (`forbidden`; the message names the owner)."""

    exit_code = 4


class LeaderError(BadInput):
    """Another error reply (`internal`, `unsupported_version`, a code this client does not
    know)."""


class Unavailable(DltrainError):
    """Exit class 3: the leader answered `unavailable` (it cannot take the request now,
    e.g. its state database's disk is full, or it is no longer sure it leads)."""

    exit_code = 3


class NoLeader(Unavailable):
    """No leader could be reached (refused, timed out, TLS failed) within the timeout, or
    the connection was lost and no candidate answered again."""


class JobFailed(DltrainError):
    """Exit class 1: the job ended failed or cancelled. `job` is its id, `state` the state
    it ended in, `summary` its summary event (`dltrain.events.Summary`), `failure` the
    failed task's account (task, agent, cause, exit code or signal, message, last log
    lines) when a task failed it."""

    exit_code = 1

    def __init__(self, job, state, summary=None):
        self.job, self.state, self.summary = job, state, summary
        self.failure = summary.get("failure") if summary is not None else None
        why = ""
        if summary is not None and summary.get("error"):
            why = ": " + summary.get("error")
        elif self.failure:
            why = ": %s: %s" % (self.failure.get("task", "?"), self.failure.get("message", ""))
        super().__init__("%s %s%s" % (job, state, why), code=None, field=None)


class WaitTimeout(DltrainError, TimeoutError):
    """`Job.wait(timeout=...)` or `Job.events(timeout=...)` ran out of time before the job
    ended; the job goes on. Exit class 1 (the job did not succeed in the time given)."""

    exit_code = 1


_BY_CODE = {
    "invalid_job": InvalidJob,
    "bad_request": InvalidJob,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "conflict": Conflict,
    "infeasible": Infeasible,
    "forbidden": Forbidden,
    "unavailable": Unavailable,
}


def from_reply(error):
    """The exception for an error reply's `error` object ({code, message, field})."""
    code = error.get("code") or "internal"
    cls = _BY_CODE.get(code, LeaderError)
    return cls(error.get("message", "(no message)"), code=code, field=error.get("field"))
