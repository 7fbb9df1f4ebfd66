"""``strategies.training.progress``: one bar per task over its training iterations, with the epoch's
mean loss; silent when the strategy's ``show_progress`` is off or the task has no step. The base
attaches it and the watchdog to every strategy, after the user's plugins and before Avalanche's."""

import types

from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.clock import Clock

from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
from strategies.methods.finetune import Finetune
from strategies.settings import RunSettings
from strategies.training.progress import ProgressBar
from strategies.training.watchdog import NothingMovedWatchdog


def _task(show_progress, epochs=2, batches=3):
    bar = ProgressBar()
    strategy = types.SimpleNamespace(
        name="probe",
        settings=RunSettings(show_progress=show_progress),
        train_epochs=epochs,
        dataloader=[None] * batches,
        task_classes=[[0]],
        epoch_loss=1.2345,
    )
    bar.before_training_exp(strategy)
    for _ in range(epochs):
        for _ in range(batches):
            bar.after_training_iteration(strategy)
        bar.after_training_epoch(strategy)
    bar.after_training_exp(strategy)
    return bar.bar


def test_the_bar_counts_the_tasks_iterations_and_shows_the_loss(capsys):
    bar = _task(show_progress=True)
    assert bar.n == bar.total == 6
    err = capsys.readouterr().err
    assert "probe task 2" in err and "loss=1.234" in err


def test_the_bar_is_silent_when_disabled_or_empty(capsys):
    assert _task(show_progress=False).disable
    assert _task(show_progress=True, epochs=0).disable
    assert capsys.readouterr().err == ""


class UserPlugin(SupervisedPlugin):
    survives_resume = True


def test_the_base_attaches_its_plugins_after_the_users_and_before_avalanches():
    user = UserPlugin()
    strategy = Finetune(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=[f"class {i}" for i in range(4)],
        config=Finetune.Config(),
        settings=RunSettings(show_progress=False),
        plugins=[user],
    )
    kinds = [type(p) for p in strategy.plugins]
    assert kinds[:3] == [UserPlugin, ProgressBar, NothingMovedWatchdog]
    assert EvaluationPlugin in kinds[3:] and kinds[-1] is Clock
    assert strategy.resumable  # neither of its own keeps state a resume needs
