"""What the parts of ``CLIPStrategy`` share: one host Protocol, as Avalanche's mixins declare theirs
(``avalanche.training.templates.strategy_mixin_protocol``).

Every mixin of ``strategies.training`` subclasses ``StrategyHost``, so the names it reads from the
strategy are declared here and nowhere else; each part initialises its own state in an ``__init__``
chained with ``super()``. The Protocol holds annotations only, never a method: it sits before
Avalanche's ``SupervisedTemplate`` in the strategy's MRO, where a method stub would hide Avalanche's
own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch
from avalanche.training.templates.strategy_mixin_protocol import SupervisedStrategyProtocol

from benchmarks.backbone import CLIPBackbone
from strategies.config import StrategyConfig
from strategies.settings import RunSettings


class StrategyHost(SupervisedStrategyProtocol, Protocol):
    """The strategy as its parts and its two plugins see it, beside Avalanche's own names
    (``model``, ``device``, ``dataloader``, ``optimizer``, ``loss``, ``mbatch``, ...)."""

    # set by the base (strategies.base.CLIPStrategy)
    name: ClassVar[str]
    cfg: StrategyConfig
    backbone: CLIPBackbone
    # how it runs (device, precision, progress bars, seed, a fast dev run's train_batches, augment_on),
    # read whole: self.settings.precision
    settings: RunSettings
    templates: tuple[str, ...]
    seen_classes: list[int]
    task_classes: list[list[int]]
    current_classes: list[int]
    adapters: dict[str, dict[str, Any]]
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    epoch_loss: float  # the mean loss of the epoch just ended (the progress bar's)
    adapted_dataset: Any
    train_epochs: int
    train_mb_size: int
    eval_mb_size: int
    scores: Callable[[torch.Tensor], torch.Tensor]
    score_dataset: Callable[[Any, str], torch.Tensor]
    by_class_id: Callable[[torch.Tensor, list[int]], torch.Tensor]
    local_targets: Callable[[torch.Tensor], torch.Tensor]

    # set by one part, read by another
    optimized_tensors: list[torch.Tensor]  # the step's: what the current task's optimiser holds
    optimized_parameters: dict[str, int]  # TrainableParameters': name -> size, over the stream
    trainable_parameters: Callable[[], dict[str, torch.Tensor]]  # TrainableParameters
    data_loader: Callable[..., Any]  # SeededLoaders
    keeping_inputs: Callable[[Any, str], contextlib.AbstractContextManager[None]]  # SeededLoaders
    fixed_text: Callable[[], contextlib.AbstractContextManager[None]]  # TextFeatures
