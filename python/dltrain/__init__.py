"""dltrain from Python: submit jobs, watch them train and get the trained model back.

    import dltrain
    client = dltrain.Client()                       # finds the leader as `dltrain` does
    job = client.submit({"dataset": "fashion-mnist", "data_dir": "/usr/share/datasets/fashion-mnist",
                         "epochs": 2, "workers": 2}, model=net)   # net: a torch.nn.Module
    summary = job.wait()                            # a progress bar with tqdm; JobFailed if it fails
    trained = job.model()                           # downloaded, SHA-256 checked, loaded
    trained.module(trained.normalize(images))

The client speaks the leader's documented control protocol (docs/protocol.md) over
WebSocket (python3-websocket); PyTorch is needed only where a model is passed or returned.
See docs/python.md.
"""
from . import errors, events
from .client import Client
from .config import find_leader
from .errors import (BadInput, ConfigError, Conflict, DltrainError, Forbidden, Infeasible, InvalidJob, JobFailed,
                     LeaderError, NoLeader, NotFound, Unauthorized, Unavailable, WaitTimeout)
from .jobs import Job, JobSpec
from .models import TrainedModel

__version__ = "0.1.0"

__all__ = ["Client", "Job", "JobSpec", "TrainedModel", "find_leader", "errors", "events", "DltrainError",
           "BadInput", "ConfigError", "InvalidJob", "Unauthorized", "NotFound", "Conflict", "Infeasible",
           "Forbidden", "LeaderError", "Unavailable", "NoLeader", "JobFailed", "WaitTimeout"]
