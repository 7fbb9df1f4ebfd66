"""Continual-CLIP: zero-shot CLIP over the classes seen so far, with no training.

Score of class c for image x: ``<f_v(x), f_t(p(c))>`` with frozen pretrained towers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch

from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.registry import register


@dataclass
class ContinualCLIPConfig(StrategyConfig):
    epochs: int = 0
    train_augmentation: TrainAugmentation = "none"  # it never trains
    min_epochs: ClassVar[int] = 0

    def __post_init__(self):
        super().__post_init__()
        if self.epochs:  # e.g. a suite's [defaults] epochs, meant for the strategies that train
            warnings.warn(
                f"continual_clip trains nothing: it ignores epochs = {self.epochs} and records 0",
                UserWarning,
                stacklevel=3,
            )
            self.epochs = 0


@register("continual_clip")
class ContinualCLIP(CLIPStrategy[ContinualCLIPConfig]):
    Config = ContinualCLIPConfig

    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return image @ self.text_features(self.seen_classes).T

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """The frozen visual tower sees each image of a ``cache_key`` once over the whole stream."""
        return self.frozen_features(dataset, cache_key, None) @ self.text_features(self.seen_classes).cpu().T
