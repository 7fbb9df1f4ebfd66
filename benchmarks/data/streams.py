"""Class-incremental streams built with Avalanche from an explicit class order.

The class order is always passed in explicitly (never drawn from a global seed), so that the
stream of a run is a pure function of its config and is stored with its result.

The streams are task-aware the way Avalanche's own generators build them: every dataset carries
``targets_task_labels`` (all 0: one task, no task id at test time), its items are
``(image, class id, 0)``, and every experience has ``task_label`` 0, so Avalanche's plugins that
read task labels (LwF, EWC, replay) run on them. Class ids are the dataset's own, never remapped;
each training experience also carries ``classes_in_order``, its classes in the class order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from avalanche.benchmarks.scenarios.supervised import class_incremental_benchmark
from avalanche.benchmarks.scenarios.task_aware import with_task_labels
from avalanche.benchmarks.utils import DataAttribute
from avalanche.benchmarks.utils.classification_dataset import TaskAwareSupervisedClassificationDataset

from benchmarks.core.errors import UserError
from benchmarks.data.splits import Tasks, split_classes


@dataclass
class CILStream:
    """A class-incremental stream and everything needed to evaluate it.

    ``train_stream[t]`` holds the training images of ``tasks[t]``; ``test_set`` holds the test
    images of every class (future classes are the OOD set of the AUROC metric), in eval mode.
    """

    benchmark: object  # avalanche CLScenario
    class_order: list[int]
    tasks: list[list[int]]
    class_names: list[str]
    test_set: Any  # avalanche TaskAwareSupervisedClassificationDataset, eval transform
    test_targets: list[int]
    # images held out of the training split (``validation_split``), eval transform; None: no split.
    # A tuning run's stream has no test split: its ``test_set`` is this very object.
    validation_set: Any = None
    validation_targets: list[int] | None = None

    @property
    def train_stream(self):
        return self.benchmark.train_stream

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    @property
    def task_of_class(self) -> dict[int, int]:
        return {c: t for t, classes in enumerate(self.tasks) for c in classes}


def build_stream(
    data,
    tasks: Tasks,
    class_order: list[int],
    train_transform: Callable,
    eval_transform: Callable,
    validation: tuple[object, list[int]] | None = None,
    test_is_validation: bool = False,
) -> CILStream:
    """Build an Avalanche class-incremental benchmark from a ``ClassificationData``.

    Args:
        data: a ``benchmarks.data.datasets.ClassificationData`` (raw PIL images, integer targets).
        tasks: a number of equal tasks, a half-base split ``"B50-Inc10"``, or the task sizes.
        class_order: a permutation of the dataset's class ids.
        train_transform, eval_transform: image transforms for the two Avalanche groups.
        validation: held-out training images and their targets (``validation_split``), scored
            beside the test set; with ``test_is_validation`` they also stand in for ``data.test``,
            which is then never touched (a tuning run).
    """
    n_classes = len(data.class_names)
    if sorted(class_order) != list(range(n_classes)):
        raise UserError(f"class order for {data.name} is not a permutation of its {n_classes} classes")
    task_classes = split_classes(class_order, tasks, data.name)
    groups = {"train": (train_transform, None), "eval": (eval_transform, None)}
    if not test_is_validation:
        test_images, test_targets = data.test, data.test_targets
    elif validation is not None:
        test_images, test_targets = validation
    else:
        raise ValueError("a stream without its test split needs a validation split in its place")
    train, test = (
        _task_aware(images, targets, groups)
        for images, targets in ((data.train, data.train_targets), (test_images, test_targets))
    )
    validation_set = None
    if validation is not None:
        validation_set = test if test_is_validation else _task_aware(*validation, groups)
    benchmark = with_task_labels(
        class_incremental_benchmark(
            {"train": train, "test": test},
            class_order=list(class_order),
            num_classes_per_exp=[len(t) for t in task_classes],
        )
    )
    for experience, classes in zip(benchmark.train_stream, task_classes, strict=True):
        experience.classes_in_order = list(classes)  # a set in Avalanche; a learner's positions follow it
    return CILStream(
        benchmark=benchmark,
        class_order=list(class_order),
        tasks=task_classes,
        class_names=list(data.class_names),
        test_set=test.eval(),
        test_targets=list(test_targets),
        validation_set=None if validation_set is None else validation_set.eval(),
        validation_targets=None if validation is None else list(validation[1]),
    )


def _task_aware(images, targets: list[int], groups: dict) -> TaskAwareSupervisedClassificationDataset:
    return TaskAwareSupervisedClassificationDataset(
        [images],
        transform_groups=groups,
        data_attributes=[
            DataAttribute(list(targets), "targets"),
            DataAttribute([0] * len(targets), "targets_task_labels", use_in_getitem=True),
        ],
    )


def validation_split(targets: list[int], fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """(train, validation) indices of a training split: per class, ``round(fraction * n)`` of its
    ``n`` images (at least one, and one left to train on, where ``n >= 2``) drawn by
    ``RandomState([seed, class])``, so each class's draw depends on its own images only. Both lists
    are in dataset order; a class of one image keeps it for training."""
    by_class: dict[int, list[int]] = {}
    for index, cls in enumerate(targets):
        by_class.setdefault(int(cls), []).append(index)
    held: list[int] = []
    for cls, indices in by_class.items():
        if len(indices) < 2:
            continue
        n_held = min(max(int(np.floor(fraction * len(indices) + 0.5)), 1), len(indices) - 1)
        order = np.random.RandomState([seed, cls]).permutation(len(indices))
        held += [indices[i] for i in order[:n_held]]
    held_set = set(held)
    return [i for i in range(len(targets)) if i not in held_set], sorted(held)


def spread_indices(
    targets: list[int], task_of_class: dict[int, int], per_class: int | None = None, limit: int | None = None
) -> list[int]:
    """A small subset of a dataset that reaches every task, then every class, before a second
    image of any class: images ranked by (their rank within their class, their class's position
    within its task, the task), at most ``per_class`` a class and ``limit`` in all; returned in
    dataset order. A fast dev run trains and evaluates on these (``benchmarks.runner``)."""
    tasks: dict[int, list[int]] = {}
    for cls, task in sorted(task_of_class.items(), key=lambda item: item[1]):
        tasks.setdefault(task, []).append(cls)
    position = {cls: i for classes in tasks.values() for i, cls in enumerate(classes)}
    seen: dict[int, int] = {}
    ranked = []
    for index, cls in enumerate(targets):
        if cls not in task_of_class:
            continue
        rank = seen[cls] = seen.get(cls, -1) + 1
        if per_class is None or rank < per_class:
            ranked.append(((rank, position[cls], task_of_class[cls]), index))
    return sorted(index for _, index in sorted(ranked)[:limit])
