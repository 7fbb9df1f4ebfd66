"""A progress bar per task, over its training iterations, with each epoch's mean loss."""

from __future__ import annotations

from avalanche.core import SupervisedPlugin
from tqdm.auto import tqdm


class ProgressBar(SupervisedPlugin):
    """Draws while ``strategy.settings.show_progress`` is true; the loss shown is ``strategy.epoch_loss``.
    It keeps nothing a resume needs (``strategies.contract.plugins_survive_resume``)."""

    survives_resume = True

    def __init__(self) -> None:
        super().__init__()
        self.bar: tqdm | None = None

    def before_training_exp(self, strategy, *args, **kwargs):
        total = strategy.train_epochs * len(strategy.dataloader)
        self.bar = tqdm(
            total=total,
            desc=f"{strategy.name} task {len(strategy.task_classes) + 1}",
            leave=False,
            disable=not strategy.settings.show_progress or total == 0,
        )

    def after_training_iteration(self, strategy, *args, **kwargs):
        self.bar.update()

    def after_training_epoch(self, strategy, *args, **kwargs):
        self.bar.set_postfix(loss=f"{strategy.epoch_loss:.3f}")

    def after_training_exp(self, strategy, *args, **kwargs):
        self.bar.close()
