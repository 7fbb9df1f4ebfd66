"""The LAMDA family's DataManager over the suite's stream (``strategies.frameworks.pycil``): class
ids are positions in the order learned; a learner's training data is the current task's, its
exemplars come back through ``appendent`` as item ids, and its own test loader never sees the test
set."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks.core.errors import UserError
from strategies.contract import stream_task_sizes

# The learner's own test loader never sees the test set: it gets this many training images of each
# class asked for, under the eval transform (its accuracy there is its own log, not a result).
VALIDATION_PER_CLASS = 10
_TASK_BITS = 32  # an item's id for the family's exemplar memory: task << 32 | index in the task


class ItemImages(Dataset):
    """The family's ``DummyDataset``: items ``(index, image, position)``; ``images`` holds item
    ids (what ``ret_data`` returns and ``appendent`` takes back) and ``labels`` class positions."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray, image_of, mode: str) -> None:
        self.images, self.labels, self.image_of, self.trsf, self.use_path = ids, labels, image_of, mode, False

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.image_of(int(self.images[index]), self.trsf)
        return index, image, int(self.labels[index])


class DataManager:
    """The family's DataManager over the stream, one task at a time: class ids are positions in
    the order learned. ``source="train"`` gives the current task's training images (and the items
    of ``appendent``, the learner's exemplars); ``source="test"`` gives training images too,
    ``VALIDATION_PER_CLASS`` a class, never the test set."""

    def __init__(self, n_classes: int, class_names: list[str], name: str, say) -> None:
        self.name, self.say = name, say
        self.n_classes = n_classes
        self.all_class_names = class_names
        self.class_order: list[int] = []  # position -> class id
        self.class_names: list[str] = []  # position -> name; the learner's args share this list
        self.task_sizes: list[int] = []
        self.stream_sizes: list[int] | None = None  # every task's size, where the stream is known
        self.nb_tasks = 0
        self.experience = None
        self.seen: dict[int, Any] = {}  # task -> experience, in this process
        self.said_validation = False
        self._views: dict[tuple[int, str], Dataset] = {}  # (task, "train" or "eval") -> its images
        self._targets: dict[int, np.ndarray] = {}  # task -> its items' class ids

    def restore(self, class_order: list[int], task_sizes: list[int], nb_tasks: int) -> None:
        """The positions and task sizes of the tasks a checkpoint had learned."""
        self.class_order[:] = class_order
        self.class_names[:] = [self.all_class_names[c] for c in class_order]
        self.task_sizes = list(task_sizes)
        self.nb_tasks = nb_tasks

    def begin_task(self, experience, classes: list[int]) -> None:
        """Make ``experience`` the current task, its ``classes`` the next positions."""
        self.experience = experience
        self.seen[len(self.task_sizes)] = experience
        self.class_order.extend(classes)
        self.class_names.extend(self.all_class_names[c] for c in classes)
        self.task_sizes.append(len(classes))
        self.stream_sizes = stream_task_sizes(experience)
        self.nb_tasks = len(self.stream_sizes) if self.stream_sizes is not None else len(self.task_sizes)
        self._views = {}
        self._targets = {}

    def get_task_size(self, task: int) -> int:
        """The size of task ``task``, a later one's too, as the family's ``_increments[task]`` (a
        half-base split's base, then its increments); without the stream, a later task has the
        current one's size."""
        if self.stream_sizes is not None and task < len(self.stream_sizes):
            return self.stream_sizes[task]
        return self.task_sizes[task] if task < len(self.task_sizes) else self.task_sizes[-1]

    def get_total_classnum(self) -> int:
        return self.n_classes

    def get_dataset(
        self, indices, source: str, mode: str, appendent=None, ret_data: bool = False, m_rate=None
    ):
        """Items ``(index, image, position)`` of the class positions ``indices`` (see the class),
        plus ``appendent``'s; with ``ret_data``, also their ids and positions."""
        if mode not in ("train", "test", "flip"):
            raise UserError(f"{self.name}: get_dataset(mode={mode!r}); give 'train', 'test' or 'flip'")
        if source not in ("train", "test"):
            raise UserError(f"{self.name}: get_dataset(source={source!r}); give 'train' or 'test'")
        if m_rate is not None:
            raise UserError(f"{self.name}: get_dataset(m_rate=...) (RMM's sampling) is not supported")
        wanted = sorted({int(i) for i in np.asarray(indices).reshape(-1)})
        if source == "train":
            ids = self._current_items(wanted)
        else:
            ids = self._validation_items(wanted)
        if appendent is not None and len(appendent) != 0 and len(appendent[0]) != 0:
            ids = np.concatenate([ids, np.asarray(appendent[0], dtype=np.int64)])
        labels = np.asarray([self._position(i) for i in ids], dtype=np.int64)
        dataset = ItemImages(ids, labels, self._image, mode)
        return (ids, labels, dataset) if ret_data else dataset

    def _current_items(self, wanted: list[int]) -> np.ndarray:
        task = len(self.task_sizes) - 1
        first = len(self.class_order) - self.task_sizes[-1]
        outside = [p for p in wanted if not first <= p < len(self.class_order)]
        if outside:
            raise UserError(
                f"{self.name}: get_dataset asks for class positions {outside[:5]} outside the current "
                f"task ({first}..{len(self.class_order) - 1}): a class-incremental learner sees only "
                "the current task's training data (and its own exemplars, through appendent)"
            )
        classes = np.asarray([self.class_order[p] for p in wanted])
        items = np.flatnonzero(np.isin(self.targets(task), classes))
        return (task << _TASK_BITS) + items.astype(np.int64)

    def _validation_items(self, wanted: list[int]) -> np.ndarray:
        unknown = [p for p in wanted if not 0 <= p < len(self.class_order)]
        if unknown:
            raise UserError(
                f"{self.name}: get_dataset(source='test') asks for unseen class positions {unknown[:5]}"
            )
        if not self.said_validation:
            self.said_validation = True
            self.say(
                f"{self.name}: its own test loader (get_dataset(source='test')) gets {VALIDATION_PER_CLASS} "
                "training images of each class under the eval transform, not the test set; the suite's "
                "scores come from its own evaluation"
            )
        tasks = np.cumsum([0, *self.task_sizes])
        ids = []
        for position in wanted:
            task = int(np.searchsorted(tasks, position, side="right") - 1)
            items = np.flatnonzero(self.targets(task) == self.class_order[position])[:VALIDATION_PER_CLASS]
            ids.append((task << _TASK_BITS) + items.astype(np.int64))
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    def task_data(self, task: int):
        """The training dataset of task ``task``: the current one, from the stream, or seen here."""
        if task == len(self.task_sizes) - 1 and self.experience is not None:
            return self.experience.dataset
        stream = getattr(self.experience, "origin_stream", None)
        if stream is not None and task < len(stream):
            return stream[task].dataset
        if task in self.seen:
            return self.seen[task].dataset
        raise UserError(
            f"{self.name}: an exemplar of task {task + 1} cannot be found: give a stream with origin_stream"
        )

    def targets(self, task: int) -> np.ndarray:
        if task not in self._targets:
            self._targets[task] = np.asarray(self.task_data(task).targets, dtype=np.int64)
        return self._targets[task]

    def _position(self, item_id: int) -> int:
        task, item = int(item_id) >> _TASK_BITS, int(item_id) & ((1 << _TASK_BITS) - 1)
        return self.class_order.index(int(self.targets(task)[item]))

    def _image(self, item_id: int, mode: str) -> torch.Tensor:
        task, item = item_id >> _TASK_BITS, item_id & ((1 << _TASK_BITS) - 1)
        view = "train" if mode == "train" else "eval"
        if (task, view) not in self._views:
            data = self.task_data(task)
            self._views[(task, view)] = data.train() if view == "train" else data.eval()
        image = self._views[(task, view)][item][0]
        return torch.flip(image, dims=[-1]) if mode == "flip" else image
