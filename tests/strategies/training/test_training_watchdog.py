"""``strategies.training.watchdog``: an epoch that changed no optimised tensor warns once per task,
naming the strategy and the task; an epoch that moved one, or had no batch, is silent."""

import types
import warnings

import pytest
import torch

from strategies.training.watchdog import NothingMovedWatchdog


def _strategy(*tensors, batches=3):
    return types.SimpleNamespace(
        name="probe", optimized_tensors=list(tensors), task_classes=[[0, 1]], dataloader=[None] * batches
    )


def _epoch(watchdog, strategy, step=None):
    watchdog.before_training_epoch(strategy)
    if step is not None:
        step()
    watchdog.after_training_epoch(strategy)


def _changed_nothing(caught):
    return [
        w for w in caught if issubclass(w.category, RuntimeWarning) and "changed nothing" in str(w.message)
    ]


def test_a_still_epoch_warns_once_per_task_naming_strategy_task_and_tensors():
    watchdog, strategy = NothingMovedWatchdog(), _strategy(torch.nn.Parameter(torch.zeros(3)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _epoch(watchdog, strategy)
    (warning,) = _changed_nothing(caught)
    assert "probe task 2:" in str(warning.message) and "1 optimised tensor(s)" in str(warning.message)
    assert watchdog.epoch_start is None  # no more copies for a task it warned about
    strategy.task_classes.append([2, 3])  # the next task is watched again
    with pytest.warns(RuntimeWarning, match="probe task 3:"):
        _epoch(watchdog, strategy)


def test_nothing_to_optimise_is_named_as_such():
    with pytest.warns(RuntimeWarning, match="no tensor with requires_grad"):
        _epoch(NothingMovedWatchdog(), _strategy())


def test_an_epoch_that_moves_a_tensor_or_has_no_batch_is_silent():
    moving, still = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _epoch(NothingMovedWatchdog(), _strategy(still, moving), step=lambda: moving.data.add_(1.0))
        _epoch(NothingMovedWatchdog(), _strategy(still, batches=0))
