"""A warning when a training epoch changed nothing: the silent no-op of a strategy whose parameters
never reach the optimiser, or whose loss does not depend on them."""

from __future__ import annotations

import warnings

import torch
from avalanche.core import SupervisedPlugin


class NothingMovedWatchdog(SupervisedPlugin):
    """Warns once per task when an epoch left every tensor the optimiser holds
    (``strategy.optimized_tensors``) as it was. Copies them before each epoch until it has warned for the
    task; it keeps nothing a resume needs."""

    survives_resume = True

    def __init__(self) -> None:
        super().__init__()
        self.epoch_start: list[torch.Tensor] | None = None
        self.warned_tasks: set[int] = set()

    def before_training_epoch(self, strategy, *args, **kwargs):
        if len(strategy.task_classes) not in self.warned_tasks:
            self.epoch_start = [p.detach().clone() for p in strategy.optimized_tensors]

    def after_training_epoch(self, strategy, *args, **kwargs):
        before, self.epoch_start = self.epoch_start, None
        if before is None or len(strategy.dataloader) == 0:
            return
        if any(
            not torch.equal(old, p.detach())
            for old, p in zip(before, strategy.optimized_tensors, strict=True)
        ):
            return
        task = len(strategy.task_classes)
        self.warned_tasks.add(task)
        held = f"{len(before)} optimised tensor(s)" if before else "no tensor with requires_grad"
        warnings.warn(
            f"{strategy.name or type(strategy).__name__} task {task + 1}: an epoch of training changed "
            f"nothing ({held}); make what should learn an nn.Parameter with requires_grad held by the "
            "strategy, or set train_epochs = 0 for a task that learns nothing",
            RuntimeWarning,
            stacklevel=2,
        )
