"""Image features of whole datasets, and tensors kept so that they are not recomputed or recopied
at every stage or step."""

from __future__ import annotations

import torch

from strategies.training.evaluation import cat_on_host
from strategies.training.host import StrategyHost


class FeatureCaches(StrategyHost):
    """Mixin of ``CLIPStrategy``. Its caches start empty; ``eval_branch_forwards`` counts the images
    ``frozen_features`` pushed through a branch. Reads ``backbone``, ``device`` and ``data_loader``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._device_copies: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (tensor, copy)
        self._frozen_features: dict[tuple[str, str | None], torch.Tensor] = {}  # (key, adapter) -> features
        self.eval_branch_forwards = 0

    @torch.no_grad()
    def encode_dataset(
        self, dataset, adapter: str | None, normalize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image features (CPU, L2-normalised unless ``normalize=False``) and labels of every item of
        ``dataset`` (e.g. ``self.adapted_dataset.eval()``: the task's training images under the eval
        transform), under visual adapter ``adapter`` (None: the frozen tower), which stays active;
        the text adapter is kept."""
        self.backbone.set_adapters(visual=adapter, text=self.backbone.active_adapters["text"])
        features, labels = [], []
        for images, targets, *_ in self.data_loader(dataset):
            features.append(self.backbone.encode_image(images, normalize=normalize))
            labels.append(targets)
        return cat_on_host(features), torch.cat(labels)

    def frozen_features(self, dataset, cache_key: str, adapter: str | None) -> torch.Tensor:
        """Image features (CPU, normalised) of ``dataset`` under a visual branch that never changes
        again (``adapter``; None: the frozen tower), encoded once per ``cache_key`` (``score_dataset``)."""
        key = (cache_key, adapter)
        if key not in self._frozen_features:
            self._frozen_features[key] = self.encode_dataset(dataset, adapter)[0]
            self.eval_branch_forwards += len(dataset)
        return self._frozen_features[key]

    def cached_features(self, cache_key: str, adapter: str | None) -> torch.Tensor | None:
        """What ``frozen_features`` keeps for (``cache_key``, ``adapter``), or None if nothing yet."""
        return self._frozen_features.get((cache_key, adapter))

    def device_copy(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the strategy's device, copied once per new tensor under ``name`` rather than
        once per training step (e.g. anchors that change only between tasks)."""
        cached = self._device_copies.get(name)
        if cached is None or cached[0] is not tensor:
            cached = self._device_copies[name] = (tensor, tensor.to(self.device))
        return cached[1]
