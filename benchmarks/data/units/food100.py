"""Food-100: the 100 dishes of Food-101 that the LAMDA family (PROOF, C3Box) streams, read from
Food-101's files (the ``food101`` target: ``prepare food100`` prepares ``food-101/``).

Why a dataset of its own: the ``food101`` unit is a zero-shot target of all 101 dishes (its
``include_train`` already makes a 101-class stream), while PROOF's and C3Box's ``utils/data.py``
(``Food101``: ``class_order = np.arange(100)``) and ``labels.json`` (food101: 100 names) use 100
classes. Those 100 names are Food-101's sorted dishes less the last, ``waffles``; labels are that
order's indices, so the suite's ``seed1993`` is their ``utils/data_manager.py``'s order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.data.datasets import ClassificationData
from benchmarks.data.unit import DatasetUnit, dataset_unit, register_dataset
from benchmarks.data.units._lamda import c3box_names, check_layout, load_lamda

FOOD100_CLASSES = 100
#: images a dish in Food-101's official split (meta/train.json, meta/test.json)
TRAIN_PER_DISH, TEST_PER_DISH = 750, 250


@register_dataset("food100")
class Food100(DatasetUnit):
    title = "Food-100"
    folder = "food-101"
    files_target = "food101"
    list_position = 11
    n_classes = FOOD100_CLASSES
    # zhoudw-zdw/PROOF@0bb2052 exps/food.json (food101, init_cls 10, increment 10; foodb50.json: 50, 10)
    published_splits = {"proof": "B0-Inc10"}

    def load(self, data_root: Path | None, layout: str = "official") -> ClassificationData:
        """``layout="official"``: Food-101's official split (750 and 250 images a dish) of its first
        100 sorted dishes; ``"lamda"``: the LAMDA family's ``food-101/{train,test}/`` folders.
        Names: C3Box's (Food-101's, underscores as spaces)."""
        from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

        check_layout(self, layout)
        if layout == "lamda":
            return load_lamda(self, data_root, "food101", FOOD100_CLASSES)
        full = dataset_unit("food101").load(data_root, include_train=True)
        parts = []
        splits: tuple[Any, Any] = (full.train, full.test)  # torchvision's Food101: its private lists
        for split in splits:
            samples = [(str(p), label) for p, label in zip(split._image_files, split._labels) if label < 100]
            parts.append(FileListDataset(samples))
        train, test = parts
        return ClassificationData(
            self.name, train, test, c3box_names("food101"), list(train.targets), list(test.targets)
        )

    def image_counts(self, layout: str = "official", **options: Any) -> tuple[int, int] | None:
        if layout != "official":
            return None  # the LAMDA archive's split is not published
        return FOOD100_CLASSES * TRAIN_PER_DISH, FOOD100_CLASSES * TEST_PER_DISH

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """Food-101's files (``prepare`` and ``fake_data`` make them as the ``food101`` target's)."""
        return dataset_unit("food101").write_fake(root, n_train, n_test, rng)
