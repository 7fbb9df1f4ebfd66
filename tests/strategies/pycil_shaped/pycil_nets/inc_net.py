"""A network factory keyed by ``args["convnet_type"]`` and a growing classifier, in PyCIL's shape."""

import copy

import torch
from torch import nn


def get_convnet(args, pretrained=False):
    name = args["convnet_type"].lower()
    if name == "tinyconv":
        return TinyConv()
    raise NotImplementedError(f"Unknown type {name}")


class TinyConv(nn.Module):
    """A small convnet trained from scratch: ``out_dim`` and a dict with ``features``."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.out_dim = 8

    def forward(self, x):
        return {"fmaps": [], "features": self.body(x)}


class IncrementalNet(nn.Module):
    def __init__(self, args, pretrained):
        super().__init__()
        self.convnet = get_convnet(args, pretrained)
        self.fc = None

    @property
    def feature_dim(self):
        return self.convnet.out_dim

    def extract_vector(self, x):
        return self.convnet(x)["features"]

    def forward(self, x):
        out = self.convnet(x)
        return {"logits": self.fc(out["features"]), **out}

    def update_fc(self, nb_classes):
        fc = nn.Linear(self.feature_dim, nb_classes)
        if self.fc is not None:
            with torch.no_grad():
                fc.weight[: self.fc.out_features] = self.fc.weight
                fc.bias[: self.fc.out_features] = self.fc.bias
        self.fc = fc

    def copy(self):
        return copy.deepcopy(self)

    def freeze(self):
        for p in self.parameters():
            p.requires_grad = False
        self.eval()
        return self


class ProjectedNet(IncrementalNet):
    """IncrementalNet with a projection added each task by ``extend_task`` and prototypes kept as a
    plain tensor, as C3Box's ``Proof_Net`` keeps them: ``update_fc`` alone does not rebuild it."""

    def __init__(self, args, pretrained):
        super().__init__(args, pretrained)
        self.projs = nn.ModuleList()
        self.prototypes = None

    def extend_task(self, nb_classes):
        self.projs.append(nn.Linear(self.feature_dim, self.feature_dim))
        self.prototypes = torch.zeros(nb_classes, self.feature_dim)

    def forward(self, x):
        features = self.convnet(x)["features"]
        for proj in self.projs:
            features = features + proj(features)
        return {"logits": self.fc(features), "features": features}
