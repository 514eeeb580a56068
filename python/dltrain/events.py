"""The events of a job as the client receives them (`dltrain follow --json` prints the same
objects, one per line): one class per kind, all `Event`s.

An event is a read-only mapping of its JSON fields, which are also attributes:
`ev.loss`, `ev["loss"]`, `ev.get("loss")`; a field the event does not carry reads as None
through an attribute. `kind` is its "event" field (`progress`, `epoch_end`, `summary`, ...),
`job` and `task` say whose it is. The fields of each kind, with their units, are listed in
docs/protocol.md ("Events to followers") and defined once in lib/wire/task_events.h
(the leader's: lib/wire/leader_events.h).

    for ev in job.events():
        if isinstance(ev, dltrain.events.EpochEnd) and ev.test_accuracy is not None:
            print(ev.epoch, ev.test_accuracy)
"""
from collections.abc import Mapping


class Event(Mapping):
    """One event. `kind`: its kind; `data`: the JSON object as a dict."""

    kind = None

    def __init__(self, data):
        self.data = dict(data)

    def __getitem__(self, key):
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.data.get(name)

    def __repr__(self):
        shown = ", ".join("%s=%r" % (k, v) for k, v in self.data.items() if k not in ("event", "counters"))
        return "%s(%s)" % (type(self).__name__, shown)


# kind -> class name. The kinds a follower receives (lib/wire/task_events.h, leader_events.h and the
# leader's events, docs/protocol.md); a kind not listed here arrives as a plain Event.
KINDS = {
    "waiting": "Waiting",
    "state": "StateChanged",
    "plan": "PlanDecided",
    "ps_shards": "PsShards",
    "data_placed": "DataPlaced",
    "started": "Started",
    "data": "DataInfo",
    "progress": "Progress",
    "epoch_end": "EpochEnd",
    "done": "Done",
    "error": "TaskError",
    "skipped_image": "SkippedImage",
    "skipped_step": "SkippedStep",
    "stopped": "Stopped",
    "replica_loaded": "ReplicaLoaded",
    "ps_resync": "PsResync",
    "restarting": "Restarting",
    "ps_recovered": "PsRecovered",
    "recovering": "Recovering",
    "waiting_for_agent": "WaitingForAgent",
    "reassigned": "Reassigned",
    "leader_restarted": "LeaderRestarted",
    "resized": "Resized",
    "left": "Left",
    "listening": "Listening",
    "profile": "Profile",
    "log": "LogLine",
    "summary": "Summary",
    # the client's own: a follower connected again after losing its leader (Job.events)
    "reconnected": "Reconnected",
}

_CLASSES = {}
for _kind, _name in KINDS.items():
    _CLASSES[_kind] = type(_name, (Event,), {"kind": _kind, "__doc__": "A `%s` event." % _kind})
    globals()[_name] = _CLASSES[_kind]


def from_json(data):
    """The typed event for a JSON object (a dict with an "event" field)."""
    cls = _CLASSES.get(data.get("event"), Event)
    ev = cls(data)
    if cls is Event:
        ev.kind = data.get("event")
    return ev
