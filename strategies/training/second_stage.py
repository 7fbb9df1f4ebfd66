"""A second stage after a task: a head or a classifier trained alone on frozen image features."""

from __future__ import annotations

from collections.abc import Callable

import torch

from strategies.training.host import StrategyHost


class SecondStage(StrategyHost):
    """Mixin of ``CLIPStrategy``. Reads ``adapted_dataset``, ``backbone``, ``data_loader`` and
    ``local_targets``."""

    def train_on_frozen_features(
        self,
        parameters: list[torch.nn.Parameter],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        purpose: str,
        lr_factor: Callable[[int, int], float] | None = None,
    ) -> None:
        """A second stage after a task (a head, a classifier): Adam trains ``parameters`` alone for
        ``epochs`` passes over the task's training data (train augmentation, loader ``purpose``) on
        ``loss(image features, local targets)``, the features those of the active visual branch,
        computed without a graph. ``lr_factor(step, total steps)``, if given, scales ``lr`` per step."""
        optimizer = torch.optim.Adam(parameters, lr=lr)
        loader = self.data_loader(
            self.adapted_dataset.train(),
            batch_size=batch_size,
            shuffle=True,
            passes=epochs,
            purpose=purpose,
            training=True,
        )
        total, step = epochs * len(loader), 0
        for _ in range(epochs):
            for images, targets, *_ in loader:
                if lr_factor is not None:
                    for group in optimizer.param_groups:
                        group["lr"] = lr * lr_factor(step, total)
                with torch.no_grad():
                    image = self.backbone.encode_image(images)
                value = loss(image, self.local_targets(targets))
                optimizer.zero_grad()
                value.backward()
                optimizer.step()
                step += 1
