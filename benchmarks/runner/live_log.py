"""Live logs of a run while it trains: ``--log tensorboard,wandb,csv`` (any subset).

Per training iteration, the loss and the learning rate; per stage, the accuracy, the accuracy per
learned task, the routing accuracy and the AUROC. Avalanche's ``TensorboardLogger`` writes
TensorBoard; ``wandb`` itself writes W&B (Avalanche 0.6's ``WandBLogger`` calls functions that
current wandb no longer has); CSV is a plain file. Every value of a run shares one step axis, the
training iterations so far (a stage's values sit at the iteration that ended its task), because
W&B accepts steps only in increasing order.

One log per run, named by its key, under ``<results-dir>/.logs/``: ``tensorboard/<run>/``,
``csv/<run>.csv`` and ``wandb/`` (W&B runs offline unless ``WANDB_MODE`` says otherwise). A resumed
run appends to its TensorBoard folder and CSV file, its steps going on from the checkpoint's.

The losses are kept on the device and read once per epoch, as the base strategy's own epoch loss
is, so a log adds no host synchronisation to a training step.
"""

from __future__ import annotations

import csv
import importlib
import os
import uuid
from pathlib import Path
from typing import Any, cast

from avalanche.core import SupervisedPlugin

from benchmarks.core.errors import UserError

LOGGERS = ("tensorboard", "wandb", "csv")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # what each logger imports


def parse_loggers(text: str | None) -> tuple[str, ...]:
    """``--log a,b``: the logger names, checked, and each one's package importable. A logger that
    cannot start is one line here, before any training."""
    names = tuple(dict.fromkeys(name.strip() for name in (text or "").split(",") if name.strip()))
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        raise UserError(f"unknown logger {unknown[0]!r} in --log; valid: {', '.join(LOGGERS)}")
    for name in names:
        package = _PACKAGES.get(name)
        if package is None:
            continue
        try:
            importlib.import_module(package)
        except ImportError:
            raise UserError(f"--log {name} needs the {package} package: pip install {package}") from None
    return names


class LiveLog:
    """One run's log in each chosen backend."""

    def __init__(self, loggers: tuple[str, ...], root: Path, key, config: dict) -> None:
        run, relpath = str(key), key.relpath  # a RunKey
        self._tensorboard = None
        self._wandb = None
        self._csv = None
        folder = Path(root) / ".logs"
        if "tensorboard" in loggers:
            from avalanche.logging import TensorboardLogger

            self._tensorboard = TensorboardLogger(tb_log_dir=folder / "tensorboard" / relpath)
        if "wandb" in loggers:
            # wandb itself: Avalanche 0.6's WandBLogger calls wandb.util.generate_id and wandb.viz,
            # which wandb no longer has
            import wandb

            folder.mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(
                project=config.get("suite") or "clip-cil-bench",
                name=run,
                id=os.environ.get("WANDB_RUN_ID") or uuid.uuid4().hex[:12],
                dir=str(folder),
                config=config,
                # offline unless the user configures it; wandb checks the value it is given
                mode=cast(Any, os.environ.get("WANDB_MODE", "offline")),
                save_code=False,
            )
        if "csv" in loggers:
            path = folder / "csv" / relpath.with_suffix(".csv")
            path.parent.mkdir(parents=True, exist_ok=True)
            new = not path.exists()
            self._csv = open(path, "a", newline="")
            self._rows = csv.writer(self._csv)
            if new:
                self._rows.writerow(["step", "name", "value"])

    def scalars(self, values: dict[str, float], step: int | None) -> None:
        values = {name: float(value) for name, value in values.items()}
        for name, value in values.items():
            if self._tensorboard is not None:
                self._tensorboard.log_single_metric(name, value, step)
            if self._csv is not None:
                self._rows.writerow([step, name, repr(value)])
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._csv is not None:
            self._csv.flush()

    def stage(self, stage: dict, step: int | None) -> None:
        """A stage's metrics (``benchmarks.core.metrics.stage_metrics``) at training step ``step``."""
        values = {
            "stage/task": stage["task"],
            "stage/acc": stage["acc"],
            "stage/routing_acc": stage["routing_acc"],
        }
        values.update({f"stage/acc_task_{k + 1}": acc for k, acc in enumerate(stage["acc_per_task"])})
        if stage.get("auroc") is not None:
            values["stage/auroc"] = stage["auroc"]
        self.scalars(values, step)

    def __enter__(self) -> LiveLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.writer.close()  # its SummaryWriter
        if self._wandb is not None:
            self._wandb.finish()
        if self._csv is not None:
            self._csv.close()


class TrainingLog(SupervisedPlugin):
    """An Avalanche plugin: each training iteration's loss and learning rate into a ``LiveLog``,
    at step ``first_step`` + the strategy's iterations. The losses stay on the device until the
    epoch ends."""

    survives_resume = True  # its first step comes from the checkpoint (strategies.contract)

    def __init__(self, log: LiveLog, first_step: int = 0) -> None:
        super().__init__()
        self.log, self.first_step = log, first_step
        self._pending: list = []  # (step, loss tensor, learning rate)

    def after_training_iteration(self, strategy, *args, **kwargs):
        lr = strategy.optimizer.param_groups[0]["lr"]
        # Avalanche's clock, the last plugin, counts this iteration after us: 1 for the first one
        step = self.first_step + strategy.clock.train_iterations + 1
        self._pending.append((step, strategy.loss.detach().float().sum(), lr))

    def after_training_epoch(self, strategy, *args, **kwargs):
        self.flush()

    def after_training_exp(self, strategy, *args, **kwargs):
        self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        import torch

        losses = torch.stack([loss for _, loss, _ in self._pending]).cpu().tolist()  # one read
        for (step, _, lr), loss in zip(self._pending, losses, strict=True):
            self.log.scalars({"train/loss": loss, "train/lr": lr}, step)
        self._pending.clear()
