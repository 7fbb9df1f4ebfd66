"""The suite's side of a loop golden: a strategy's real training loop (``CLIPStrategy.learn``, Avalanche's
``SupervisedTemplate`` with the suite's optimiser, scheduler, loss and mixed-precision step) fed the
fixture's batches in the fixture's order, with a plugin that records after every step the loss, the
learning rate of every parameter group and every trainable tensor, and after every task the scores
of fixed test images. Only the loader is replaced (``make_train_dataloader`` of the instance): the
batches are the fixture's instead of a seeded shuffle of the experience's dataset.

No component is registered here; the generators and the tests in ``tests/official`` share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from avalanche.core import SupervisedPlugin

# A batch is (images, labels); a task's batches are a list of epochs, each a list of batches.
Epochs = Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in float32, or in float64 where the loop runs in float64."""
    return tensor.detach().to(torch.promote_types(tensor.dtype, torch.float32)).clone()


class EpochBatches:
    """A train loader that yields epoch e's batches on its e-th pass (Avalanche's ``[x, y, t]``)."""

    def __init__(self, epochs: Epochs) -> None:
        self.epochs, self.passes = epochs, 0

    def __len__(self) -> int:
        return len(self.epochs[0])

    def __iter__(self):
        batches = self.epochs[self.passes]
        self.passes += 1
        for images, labels in batches:
            yield [images, labels, torch.zeros_like(labels)]


class StepRecord(SupervisedPlugin):
    """After every optimisation step: the loss, the learning rate each group used, every tensor in
    ``named`` (a callable: name -> tensor, read after the step)."""

    def __init__(self, named: Callable[[], dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.named = named
        self.steps: list[dict] = []
        self._lrs: list[float] = []

    def before_update(self, strategy, **kwargs):
        self._lrs = [group["lr"] for group in strategy.optimizer.param_groups]  # the step's own

    def after_training_iteration(self, strategy, **kwargs):
        self.steps.append(
            {
                "loss": _kept(strategy.loss),
                "lr": torch.tensor(self._lrs, dtype=torch.float64),
                "tensors": {n: _kept(t) for n, t in self.named().items()},
            }
        )


def two_task_stream(n_classes: int, tasks: list[list[int]]):
    """A synthetic stream whose experiences hold ``tasks``' classes (its images are never loaded)."""
    from benchmarks.data.datasets import load_dataset
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import eval_transform

    data = load_dataset("synthetic", n_classes=n_classes, n_train_per_class=2, n_test_per_class=1)
    stream = build_stream(
        data, len(tasks), [c for task in tasks for c in task], eval_transform(32), eval_transform(32)
    )
    for experience, classes in zip(stream.train_stream, tasks):
        assert sorted(int(c) for c in experience.classes_in_this_experience) == sorted(classes)
    return stream


def run_suite_loop(
    strategy,
    record: StepRecord,
    tasks: list[list[int]],
    batches: list[Epochs],
    test_images: torch.Tensor,
    scores: Callable | None = None,
) -> list[torch.Tensor]:
    """Train ``strategy`` (built with ``record`` among its plugins) on ``tasks`` with ``batches[t]``
    through its own ``learn``; return the scores of ``test_images`` after each task."""
    stream = two_task_stream(len(strategy.class_names), tasks)
    out = []
    for task, experience in enumerate(stream.train_stream):
        loader = EpochBatches(batches[task])

        def make_train_dataloader(*args, _loader=loader, **kwargs):
            strategy.dataloader = _loader

        strategy.make_train_dataloader = make_train_dataloader
        strategy.learn(experience)
        assert loader.passes == len(batches[task]), "the loop ran another number of epochs"
        with torch.no_grad():
            out.append(_kept((scores or strategy.scores)(test_images)))
    return out
