"""The offline synthetic world (``benchmarks.data.synthetic``): generated in memory, nothing on disk."""

from __future__ import annotations

from pathlib import Path

from benchmarks.data.datasets import ClassificationData
from benchmarks.data.unit import DatasetUnit, dataset_unit, register_dataset


@register_dataset("synthetic")
class Synthetic(DatasetUnit):
    title = "synthetic"  # the stored smoke reports name it so
    list_position = 7
    n_classes = 100

    def load(
        self,
        data_root: Path | None = None,
        n_train_per_class: int = 100,
        n_test_per_class: int = 20,
        seed: int = 0,
        n_classes: int = 100,
        domain: str = "photo",
    ) -> ClassificationData:
        """The offline synthetic dataset (``benchmarks.miniature``) in ``domain`` ("photo", the tiny
        CLIP's pretraining domain, or "faded", the shifted CIL domain); ``data_root`` is ignored."""
        from benchmarks.data.synthetic import world  # torch (its Dataset), where images are built

        train, test, class_names = world.make_splits(
            n_train_per_class, n_test_per_class, seed, n_classes, domain
        )
        return ClassificationData(
            name=self.name,
            train=train,
            test=test,
            class_names=class_names,
            train_targets=list(train.targets),
            test_targets=list(test.targets),
        )

    def image_counts(
        self, n_train_per_class: int = 100, n_test_per_class: int = 20, n_classes: int = 100, **options
    ) -> tuple[int, int]:
        return n_classes * n_train_per_class, n_classes * n_test_per_class


def load_synthetic(**options) -> ClassificationData:
    """The synthetic world without a data root (the miniature's own callers)."""
    return dataset_unit("synthetic").load(**options)
