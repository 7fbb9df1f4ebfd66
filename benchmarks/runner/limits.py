"""What a run may use at most (``RunLimits``), and ``--fast-dev-run``'s limits.

Importing nothing heavy: the command line's help states the fast dev run's limits from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.core.errors import UserError

FAST_DEV_RUN_BATCHES = 2  # --fast-dev-run's training batches an epoch, unless it names another count


@dataclass(frozen=True)
class RunLimits:
    """What a run may use at most; None: no limit (a real run has none). The runner applies each
    where it builds the thing it limits (``benchmarks.runner.building``). ``fast_dev_run`` gives a
    ``--fast-dev-run``'s: a run that walks every code path of the real one (every stage, second
    stage, checkpoint, metric, zero-shot target) in minutes, on a few images."""

    epochs: int | None = None  # a task's epochs (the recipe's Config.epochs)
    train_batches: int | None = None  # the batches of every training epoch or pass (FirstBatches)
    batch_size: int | None = None  # every training batch size (Config.training_batch_sizes)
    train_images_per_class: int | None = None
    test_images_per_task: int | None = None  # scored at every stage, spread over the task's classes
    zero_shot_images: int | None = None  # of each zero-shot target, spread over its classes
    # each zero-shot target's first classes, its candidate label set: a fast dev run encodes 10 class
    # prompts, not ImageNet-1K's 1,000 (5 minutes of a ViT-B/16's text tower on 2 CPU cores)
    zero_shot_classes: int | None = None

    @classmethod
    def fast_dev_run(cls, train_batches: int = FAST_DEV_RUN_BATCHES) -> RunLimits:
        """``--fast-dev-run``'s limits: one epoch of ``train_batches`` batches of at most 2 images (ViT-B/16
        on a CPU), one training image a class (every class keeps one), one test image a task, 10
        images of each zero-shot target, one of each of its first 10 classes."""
        if isinstance(train_batches, bool) or not isinstance(train_batches, int) or train_batches < 1:
            raise UserError(f"--fast-dev-run takes a whole number of batches >= 1, not {train_batches}")
        return cls(
            epochs=1,
            train_batches=train_batches,
            batch_size=2,
            train_images_per_class=1,
            test_images_per_task=1,
            zero_shot_images=10,
            zero_shot_classes=10,
        )

    @property
    def limited(self) -> bool:
        """Whether any limit is set (a fast dev run), not a real run."""
        return self != RunLimits()

    def record(self) -> dict[str, int | None] | None:
        """The limits as a result's config records them (``config.fast_dev_run``, hashed, so that a
        limited run is never taken for a real one); None for a real run, whose config has no entry.
        The names are those results have always stored (the epoch cap is implied: one)."""
        if not self.limited:
            return None
        return {
            "train_batches": self.train_batches,
            "max_batch_size": self.batch_size,
            "train_per_class": self.train_images_per_class,
            "test_per_task": self.test_images_per_task,
            "zero_shot_images": self.zero_shot_images,
            "zero_shot_classes": self.zero_shot_classes,
        }
