"""APER with adapters (Zhou et al., IJCV 2025, "Revisiting Class-Incremental Learning with Pre-Trained
Models"): adapt on the first task only, then classify every task by prototypes of the pretrained
and the adapted features side by side. Paper row "Aper-Adapter" (docs/baselines.md §12; facts
from the paper and its code, no code reused).

* Task 1: an AdaptFormer adapter parallel to the MLP of every visual block
  (``benchmarks.backbone.mlp_adapters``, one expert, no router) and a cosine head with learnable
  sigma train with CE on the task-1 classes; then the adapters freeze for good and the head is
  dropped.
* After every task: each new class's prototype is the mean of phi(x) = [f_pretrained(x),
  f_adapted(x)] (unnormalised, 2 x 512-d) over its training images under the eval transform.
* ``scores``: ``proto_scale * cos(phi(x), prototype_c)`` over the seen classes, sigma = 1 as the
  official fresh cosine classifier (argmax does not depend on it; MSP and AUROC do).
* Both branches are frozen after task 1, so a test image's phi is computed once per stream.

RECIPE (CIFAR-100; the official code, RevisitingCIL@a2e6b71; other datasets in main.toml):

| hyper-parameter | value | source |
|---|---|---|
| adapter | parallel to the MLP, every visual block, bottleneck 64, scale 0.1, dropout 0.1; down kaiming, up and biases 0 | code: convs/vision_transformer_adapter.py |
| tuned on / head | task 1 only / cosine head, learnable sigma from 1 | code: models/aper_adapter.py, convs/linears.py |
| optimiser | SGD, momentum 0.9, lr 0.01, wd 5e-4 (ImageNet-R: 0.05, 5e-3) | code: exps/aper_adapter/cifar224_5_5_vit-b_adapter.json, imagenetr_5_5_vit-b_adapter.json |
| batch / epochs / schedule | 48 (ImageNet-R 24) / 20 / cosine per epoch down to 0 | code: the same files |
| train augmentation | rrc05_flip: random resized crop, scale 0.05-1, and a flip | code: utils/data.py |

C3Box's CLIP port (LAMDA-CL/C3Box@1378ab2, exps/aper_adapter.json: 10 epochs, no augmentation, a
CIFAR config only, LAION weights) came out after the numbers GR4CIL's row reports; its values are
options of this strategy (docs/baselines.md §12).
| feature / prototypes | [base, adapted], 1024-d / class mean of phi, eval transform | code: utils/inc_net.py, models/aper_adapter.py |
| scoring | sigma cos, sigma = 1 | code: MultiBranchCosineIncrementalNet |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.optim import Optimizer, Schedule
from strategies.registry import register
from strategies.training.evaluation import cat_on_host


@dataclass
class AperConfig(StrategyConfig):
    epochs: int = 20
    batch_size: int = 48
    lr: float = 0.01
    weight_decay: float = 5e-4
    optimizer: Optimizer = "sgd"
    momentum: float = 0.9
    schedule: Schedule = "cosine_epoch"
    train_augmentation: TrainAugmentation = "rrc05_flip"  # RevisitingCIL; "none": C3Box's CLIP port
    bottleneck: int = 64
    adapter_dropout: float = 0.1
    adapter_scale: float = 0.1
    proto_scale: float = 1.0  # sigma of the prototype classifier


class CosineHead(nn.Module):
    """sigma * cos(f, w_c), sigma learnable from 1; weights uniform in +-1/sqrt(d)."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(dim)
        self.weight = nn.Parameter(torch.empty(classes, dim).uniform_(-bound, bound))
        self.sigma = nn.Parameter(torch.ones(()))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.sigma * F.normalize(features, dim=-1) @ F.normalize(self.weight, dim=-1).T


def prototype_scores(phi: torch.Tensor, prototypes: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * cos(phi(x), prototype_c)`` ``[B, C]``."""
    return scale * F.normalize(phi, dim=-1) @ F.normalize(prototypes, dim=-1).T


@register("aper_adapter")
class AperAdapter(CLIPStrategy[AperConfig]):
    Config = AperConfig
    # the visual adapters (``state/visual_adapters/visual.<block>...``) and phi's class means, rows in
    # seen_classes order
    checkpoint_attributes = ("visual_adapters", "prototypes")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cfg = self.cfg
        # Added here, not in setup_task(0), so a checkpoint finds them; with zero up-projections the
        # adapted tower equals the pretrained one until the first step.
        self.backbone.add_mlp_adapters(
            "visual",
            experts=1,
            bottleneck=cfg.bottleneck,
            dropout=cfg.adapter_dropout,
            scale=cfg.adapter_scale,
        )
        self.prototypes = torch.zeros(0, 2 * self.backbone.embed_dim)
        self.head: CosineHead | None = None
        self._phi_cache: dict[str, torch.Tensor] = {}

    @property
    def visual_adapters(self) -> nn.ModuleDict:
        return self.backbone.mlp_adapter_modules

    # ---------------------------------------------------------------- training
    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)
        if task == 0:
            self.head = CosineHead(self.backbone.embed_dim, len(classes)).to(self.device)
        else:  # first-stage adaptation only: later tasks add prototypes
            self.train_epochs = 0
            self.backbone.mlp_adapter_modules.requires_grad_(False)

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        if self.head is None:  # built for task 1's adaptation, dropped after it
            raise RuntimeError("AperAdapter.compute_logits outside task 1's training")
        return self.head(self.backbone.encode_image(images, normalize=False))

    def extra_trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters()) if self.head is not None and self.train_epochs else []

    def finish_task(self, task: int, classes: list[int]) -> None:
        if task == 0:  # the adapters freeze for good; the head is dropped
            self.backbone.mlp_adapter_modules.requires_grad_(False)
            self.head = None
        phi, labels = self.phi_dataset(self.adapted_dataset.eval())
        new = torch.stack([phi[labels == c].mean(dim=0) for c in classes])
        self.prototypes = torch.cat([self.prototypes, new])

    # ---------------------------------------------------------------- inference
    @torch.no_grad()
    def phi(self, images: torch.Tensor) -> torch.Tensor:
        """[f_pretrained(x), f_adapted(x)], unnormalised, ``[B, 2 d]``."""
        with self.backbone.mlp_adapters(enabled=False):
            base = self.backbone.encode_image(images, normalize=False)
        return torch.cat([base, self.backbone.encode_image(images, normalize=False)], dim=1)

    @torch.no_grad()
    def phi_dataset(self, dataset) -> tuple[torch.Tensor, torch.Tensor]:
        self.backbone.eval()
        features, labels = [], []
        for images, targets, *_ in self.data_loader(dataset):
            features.append(self.phi(images.to(self.device, non_blocking=True)))
            labels.append(targets)
        return cat_on_host(features), torch.cat(labels)

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        phi = self.phi(images)
        return prototype_scores(phi, self.prototypes.to(phi), self.cfg.proto_scale)

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """phi of a test image is computed once per ``cache_key``: both branches are frozen after task 1."""
        if cache_key not in self._phi_cache:
            self._phi_cache[cache_key] = self.phi_dataset(dataset)[0]
            self.eval_branch_forwards += 2 * len(dataset)  # the pretrained and the adapted branch
        return prototype_scores(self._phi_cache[cache_key], self.prototypes, self.cfg.proto_scale)

    # ---------------------------------------------------------------- counts
    def trainable_parameter_count(self) -> int:
        """The adapters (trained on task 1) and the prototypes kept for inference; the task-1 head is
        discarded."""
        return sum(p.numel() for p in self.backbone.mlp_adapter_parameters()) + self.prototypes.numel()
