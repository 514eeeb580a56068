"""dltrain's built-in networks in PyTorch, for the state_dict.pt of a trained model.

A job with a built-in model (cnn, mlp, mlp-large, resnet20, resnet18) comes back from
`dltrain model get JOB -o DIR` as DIR/state_dict.pt and DIR/metadata.json. The modules
here have the names and shapes of dltrain's C++ networks (lib/train/models.h), so that

    import json, torch
    from dltrain import networks
    meta = json.load(open("DIR/metadata.json"))
    net = networks.build(meta)
    net.load_state_dict(torch.load("DIR/state_dict.pt"))
    net.eval()

gives the network the job trained; feed it images as the job's loader did:
(pixels / 255 - meta["mean"][c]) / meta["std"][c], shape [N, channels, size, size].
resnet18 is torchvision.models.resnet18 itself (dltrain writes its state_dict with
torchvision's names), its first convolution made for 1 channel where the data is gray.
`dltrain.Job.model()` does all of this. Part of the `dltrain` Python package; needs only
PyTorch (and torchvision for resnet18).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCnn(nn.Module):
    """model = "cnn": three 3x3 conv blocks (16, 32, 64; BatchNorm, ReLU, 2x2 max-pool),
    then 64*(s//8)^2 -> 64 -> classes."""

    def __init__(self, channels=1, classes=10, image_size=28):
        super().__init__()
        side = image_size // 2 // 2 // 2
        self.c1 = nn.Conv2d(channels, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.b3 = nn.BatchNorm2d(64)
        self.f1 = nn.Linear(64 * side * side, 64)
        self.f2 = nn.Linear(64, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        x = F.max_pool2d(F.relu(self.b3(self.c3(x))), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


class Mlp(nn.Module):
    """model = "mlp" (h1 = 256) and "mlp-large" (h1 = 768): in -> h1 -> 128 -> classes."""

    def __init__(self, inputs, h1, h2, classes=10):
        super().__init__()
        self.l1 = nn.Linear(inputs, h1)
        self.l2 = nn.Linear(h1, h2)
        self.l3 = nn.Linear(h2, classes)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x.flatten(1))))))


class BasicBlock(nn.Module):
    """He et al. 2016's basic block with the option A shortcut (subsample, zero channels)."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.inputs, self.outputs, self.stride = inputs, outputs, stride
        self.c1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(outputs)
        self.c2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(outputs)

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        shortcut = x
        if self.stride != 1 or self.inputs != self.outputs:
            shortcut = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.outputs - self.inputs))
        return F.relu(y + shortcut)


class CifarResNet(nn.Module):
    """model = "resnet20" (n = 3): He et al. 2016, section 4.2, depth 6n + 2."""

    def __init__(self, n=3, channels=3, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(channels, 16, 3, 1, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(16)
        blocks, inputs = [], 16
        for width in (16, 32, 64):
            for i in range(n):
                blocks.append(BasicBlock(inputs, width, 2 if i == 0 and width != 16 else 1))
                inputs = width
        self.stages = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.stages(F.relu(self.stem_bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet18(channels=3, classes=10):
    """model = "resnet18": torchvision's, with a 1-channel first convolution for gray data."""
    import torchvision
    net = torchvision.models.resnet18(num_classes=classes)
    if channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return net


def build(meta):
    """The network of a model directory's metadata.json (a dict), untrained."""
    model, c, k, s = meta["model"], meta["channels"], meta["classes"], meta["image_size"]
    if model == "cnn":
        return SmallCnn(c, k, s)
    if model in ("mlp", "mlp-large"):
        return Mlp(c * s * s, 256 if model == "mlp" else 768, 128, k)
    if model == "resnet20":
        return CifarResNet(3, c, k)
    if model == "resnet18":
        return resnet18(c, k)
    if model == "torchscript":
        raise ValueError("a torchscript model comes back as model.pt: torch.jit.load it")
    raise ValueError("unknown model %r" % model)


def load(model_dir):
    """The trained network of a model directory, in eval mode."""
    import json
    import os
    meta = json.load(open(os.path.join(model_dir, "metadata.json")))
    if meta["model"] == "torchscript":
        return torch.jit.load(os.path.join(model_dir, "model.pt")).eval()
    net = build(meta)
    net.load_state_dict(torch.load(os.path.join(model_dir, "state_dict.pt")))
    return net.eval()
