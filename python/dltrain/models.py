"""Models in and out: a PyTorch module made TorchScript and uploaded with a job, and a
job's trained model downloaded, checked and loaded (docs/training.md, "Your model";
the transfer is docs/protocol.md's "Models").

PyTorch is imported only here and only when a module is passed or a model is loaded.
"""
import base64
import hashlib
import io
import json
import os
import warnings

from .errors import ConfigError, DltrainError, NotFound

# The leader's limits (lib/wire/control_bodies.h): file bytes per window, and the largest
# model file it takes.
WINDOW_BYTES = 1 << 20
MAX_FILE_BYTES = 2 << 30
MODEL_FILES = ("metadata.json", "state_dict.pt", "model.pt")


def _torch():
    try:
        import torch
    except ImportError:
        raise ConfigError("this needs PyTorch (python3-torch, or pip install torch)") from None
    return torch


def export_module(module, example_input=None):
    """The TorchScript archive of `module` as bytes, and how it was made: "scriptmodule"
    (it was TorchScript already), "scripted" (torch.jit.script) or "traced"
    (torch.jit.trace with `example_input`, a tensor or tuple of tensors, when scripting
    failed: a warning says so, since a trace records the one path the example took).
    Raises ConfigError (field "model") when it can be neither."""
    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        how, script = "scriptmodule", module
    elif isinstance(module, torch.nn.Module):
        try:
            script, how = torch.jit.script(module), "scripted"
        except Exception as e:  # noqa: BLE001 (TorchScript's errors have no common class)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if "Can't redefine method" in first:
                # TorchScript keeps a class whose compilation failed; a second try says only this.
                first += " (an earlier torch.jit.script of this class in this process failed; a fresh " \
                         "process shows why)"
            if example_input is None:
                raise ConfigError("torch.jit.script failed on %s (%s); pass example_input=<a batch of inputs> to "
                                  "trace it instead" % (type(module).__name__, first), field="model") from None
            try:
                script, how = torch.jit.trace(module, example_input), "traced"
            except Exception as e2:  # noqa: BLE001
                raise ConfigError("%s can be neither scripted (%s) nor traced (%s)" %
                                  (type(module).__name__, first, str(e2).strip().splitlines()[0]), field="model") from None
            warnings.warn("dltrain: torch.jit.script failed on %s (%s); traced it with the example input instead, "
                          "which records only the path that input took" % (type(module).__name__, first), stacklevel=4)
    else:
        raise ConfigError("model must be a torch.nn.Module, a torch.jit.ScriptModule or a path, not %s" %
                          type(module).__name__, field="model")
    buf = io.BytesIO()
    torch.jit.save(script, buf)
    return buf.getvalue(), how


def read_model_file(path, field):
    """The bytes of a model file to upload; ConfigError (naming `field`) when it cannot be
    read, is empty or is larger than a model file may be (checked before reading it)."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise ConfigError("%r has %d bytes, more than the %d a model file may have" % (path, size, MAX_FILE_BYTES),
                              field=field)
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError("cannot read %r: %s" % (path, e.strerror), field=field) from None


def upload(call, content, what, field):
    """Uploads `content` (bytes) to the leader unless it has it already; returns its
    SHA-256 (hex). `call(type, body)` sends one request. The leader says where to go on
    after each window (another client uploading the same content may have moved it on),
    so the windows sent are bounded."""
    if not content:
        raise ConfigError("%s is empty" % what, field=field)
    if len(content) > MAX_FILE_BYTES:
        raise ConfigError("%s has %d bytes, more than the %d a model file may have" % (what, len(content), MAX_FILE_BYTES),
                          field=field)
    sha = hashlib.sha256(content).hexdigest()
    body = {"sha256": sha, "size": len(content), "offset": 0, "data": ""}
    st = call("model_upload", body)
    limit = 4 * (len(content) // WINDOW_BYTES + 1) + 16
    sent = 0
    while not st.get("stored"):
        sent += 1
        if sent > limit:
            raise DltrainError("the leader did not take the upload of %s" % what)
        off = int(st.get("offset", 0))
        body["offset"] = off
        body["data"] = base64.b64encode(content[off:off + WINDOW_BYTES]).decode("ascii")
        st = call("model_upload", body)
    return sha


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(call, job, checkpoint, manifest, directory):
    """Writes the files of `manifest` (a model's entry in the `models` reply) into
    `directory`: each read in windows of at most 1 MiB into FILE.part and renamed only
    once its size and SHA-256 match the manifest; a file already there with the right
    SHA-256 is kept, a model file the manifest does not list is removed (it would be taken
    for this model's). Raises DltrainError for a mismatch (nothing left under the name)."""
    os.makedirs(directory, exist_ok=True)
    listed = {f["name"] for f in manifest.get("files", [])}
    for name in MODEL_FILES:
        if name not in listed and os.path.exists(os.path.join(directory, name)):
            os.unlink(os.path.join(directory, name))
    for f in manifest.get("files", []):
        name, size, sha = f["name"], int(f["bytes"]), f["sha256"]
        if name not in MODEL_FILES:
            raise DltrainError("the leader listed an unexpected file %r" % name)
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.path.getsize(path) == size and _sha256_file(path) == sha:
            continue
        part = path + ".part"
        h = hashlib.sha256()
        with open(part, "wb") as out:
            offset = 0
            while offset < size:
                chunk = call("model_read", {"job": job, "checkpoint": checkpoint, "file": name, "offset": offset,
                                            "max_bytes": WINDOW_BYTES})
                data = base64.b64decode(chunk.get("data", ""))
                if int(chunk.get("offset", -1)) != offset or not data:
                    os.unlink(part)
                    raise DltrainError("the leader sent %s of %s from offset %s, asked for %d" %
                                       (name, job, chunk.get("offset"), offset))
                out.write(data)
                h.update(data)
                offset += len(data)
        if offset != size or h.hexdigest() != sha:
            os.unlink(part)
            raise DltrainError("%s of %s (%s): %d bytes with SHA-256 %s, the leader's manifest says %d bytes, %s" %
                               (name, job, checkpoint, offset, h.hexdigest(), size, sha))
        os.replace(part, path)


class TrainedModel:
    """A job's trained model, downloaded and checked.

    - `module`: the network, in eval mode: the TorchScript module (`torch.jit.ScriptModule`)
      for a model = "torchscript" job, else the built-in network in PyTorch
      (dltrain.networks) with the trained state_dict; None when loaded with load=False;
    - `state_dict`: parameters and buffers by name (an OrderedDict of tensors), or None;
    - `metadata`: metadata.json as a dict (model, dataset, classes, class_names,
      image_size, channels, mean, std, test_accuracy, epochs, ...);
    - `manifest`: the leader's entry for it (job, checkpoint, files with bytes and SHA-256);
    - `dir`: where the files are.
    """

    def __init__(self, directory, manifest, load=True):
        self.dir, self.manifest = directory, manifest
        self.checkpoint = manifest.get("checkpoint")
        with open(os.path.join(directory, "metadata.json"), encoding="utf-8") as f:
            self.metadata = json.load(f)
        self.module = self.state_dict = None
        if load:
            torch = _torch()
            names = {f["name"] for f in manifest.get("files", [])}
            if "state_dict.pt" in names:
                self.state_dict = torch.load(os.path.join(directory, "state_dict.pt"), map_location="cpu")
            if "model.pt" in names:
                self.module = torch.jit.load(os.path.join(directory, "model.pt"), map_location="cpu").eval()
            else:
                from . import networks
                net = networks.build(self.metadata)
                net.load_state_dict(self.state_dict)
                self.module = net.eval()

    def normalize(self, images):
        """`images` (a float tensor [N, C, H, W] with pixels in [0, 1]) standardised as the
        job's loader did: (x - mean[c]) / std[c]."""
        torch = _torch()
        mean = torch.tensor(self.metadata["mean"], dtype=images.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.metadata["std"], dtype=images.dtype).view(1, -1, 1, 1)
        return (images - mean) / std

    def __repr__(self):
        return "TrainedModel(job=%r, checkpoint=%r, model=%r, test_accuracy=%r, dir=%r)" % (
            self.manifest.get("job"), self.checkpoint, self.metadata.get("model"),
            self.metadata.get("test_accuracy"), self.dir)


def choose(models_reply, job, checkpoint):
    """The manifest of `checkpoint` of `job` in a `models` reply; raises NotFound naming the
    models kept, the job's state and the model error when it is not there."""
    kept = []
    for m in models_reply.get("models", []):
        kept.append(m.get("checkpoint", ""))
        if m.get("checkpoint") == checkpoint:
            return m
    why = "no model %r of %s is kept (checkpoints are last, best or N, with [checkpoint] in the job)" % (checkpoint, job)
    if kept:
        why += " (its models: %s)" % ", ".join(kept)
    if models_reply.get("state"):
        why += "; the job is " + models_reply["state"]
    if models_reply.get("model_error"):
        why += "; " + models_reply["model_error"]
    raise NotFound(why, code="not_found", field="checkpoint")
