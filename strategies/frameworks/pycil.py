"""Learners in the LAMDA family's shape (PyCIL, PILOT, C3Box) under the suite's protocol.

Such a learner is built as ``cls(args)`` from a dict of options and keeps its model in
``learner._network`` (a module whose output holds ``"logits"``, one column per class position). For
each task the runner's experience becomes a ``DataManager`` with the family's conventions, then
``incremental_train(data_manager)`` and ``after_task()`` run. Class ids are positions in the order
the classes were learned: position ``k`` is ``seen_classes[k]``. A stream's experience gives its
classes as a set, so within a task positions follow class ids, as ``CLIPStrategy`` orders them.

``args``: the Config's fields, ``"device"`` (a one-element list, the family's multi-GPU
convention), ``"seed"``, ``"backbone"`` (the run's ``CLIPBackbone``), ``"class_names"`` (by
position; the list grows in place as tasks arrive) and ``"max_train_batches"`` (None, or the
batches a pass may take in a fast dev run).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.core.errors import UserError
from strategies.checkpointing import pack_state, unpack_state
from strategies.frameworks.common import FrameworkAdapter, declared_config, task_classes


class TaskImages(Dataset):
    """Items ``(index, image, position)`` of a subset of an experience's dataset, as the family's
    datasets give them; ``flip`` mirrors every image (the family's "flip" mode)."""

    def __init__(self, images: Dataset, items: list[int], positions: list[int], flip: bool) -> None:
        self.images, self.items, self.positions, self.flip = images, items, positions, flip

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        image = self.images[self.items[index]][0]
        return index, torch.flip(image, dims=[-1]) if self.flip else image, self.positions[index]


class DataManager:
    """The family's DataManager over the stream, one task at a time: class ids are positions in
    the order learned, and only the current task's training data can be asked for."""

    def __init__(self, n_classes: int, class_names: list[str], name: str) -> None:
        self.name = name
        self.n_classes = n_classes
        self.all_class_names = class_names
        self.class_order: list[int] = []  # position -> class id
        self.class_names: list[str] = []  # position -> name; the learner's args share this list
        self.task_sizes: list[int] = []
        self.nb_tasks = 0
        self.experience = None

    def restore(self, class_order: list[int], task_sizes: list[int], nb_tasks: int) -> None:
        """The positions and task sizes of the tasks a checkpoint had learned."""
        self.class_order[:] = class_order
        self.class_names[:] = [self.all_class_names[c] for c in class_order]
        self.task_sizes = list(task_sizes)
        self.nb_tasks = nb_tasks

    def begin_task(self, experience, classes: list[int]) -> None:
        """Make ``experience`` the current task, its ``classes`` the next positions."""
        self.experience = experience
        self.class_order.extend(classes)
        self.class_names.extend(self.all_class_names[c] for c in classes)
        self.task_sizes.append(len(classes))
        stream = getattr(experience, "origin_stream", None)
        self.nb_tasks = len(stream) if stream is not None else len(self.task_sizes)

    def get_task_size(self, task: int) -> int:
        # tasks are equal in this suite, so a later task has the current one's size
        return self.task_sizes[task] if task < len(self.task_sizes) else self.task_sizes[-1]

    def get_total_classnum(self) -> int:
        return self.n_classes

    def get_dataset(self, indices, source: str, mode: str, appendent=None, ret_data: bool = False) -> Dataset:
        """The current task's training images of the class positions ``indices``: items
        ``(index, image, position)``, under the train augmentation (``mode="train"``) or the eval
        transform (``"test"``; ``"flip"``: mirrored)."""
        if source != "train":
            raise UserError(
                f"{self.name}: get_dataset(source={source!r}) is refused: the runner scores the test "
                "set itself; drop the learner's own test loader"
            )
        if appendent is not None or ret_data:
            raise UserError(
                f"{self.name}: get_dataset(appendent=..., ret_data=True) (exemplar memory) is not "
                "supported by the pycil: adapter; keep exemplars as tensors in checkpoint_attributes"
            )
        if mode not in ("train", "test", "flip"):
            raise UserError(f"{self.name}: get_dataset(mode={mode!r}); give 'train', 'test' or 'flip'")
        wanted = {int(i) for i in np.asarray(indices).reshape(-1)}
        first = len(self.class_order) - self.task_sizes[-1]
        current = set(range(first, len(self.class_order)))
        if not wanted <= current:
            raise UserError(
                f"{self.name}: get_dataset asks for class positions {sorted(wanted - current)[:5]} outside "
                f"the current task ({first}..{len(self.class_order) - 1}): a class-incremental learner "
                "sees only the current task's training data"
            )
        position = {c: k for k, c in enumerate(self.class_order)}
        data = self.experience.dataset
        labels = [position[int(c)] for c in data.targets]
        items = [i for i, label in enumerate(labels) if label in wanted]
        images = data.train() if mode == "train" else data.eval()
        return TaskImages(images, items, [labels[i] for i in items], flip=mode == "flip")


class PyCILAdapter(FrameworkAdapter):
    """A LAMDA-family learner (``wrapped``) run on the stream; see the module's docstring."""

    checkpoint_attributes = ("seen_classes",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_manager = DataManager(len(self.class_names), self.class_names, self.name)
        args = {
            **self.cfg.to_dict(),
            "device": [self.device],
            "seed": self.seed,
            "backbone": self.backbone,
            "class_names": self.data_manager.class_names,
            "max_train_batches": self.max_train_batches,
        }
        self.learner = self.wrapped(args)
        # the backbone's pretrained tensors as built: a checkpoint leaves out those still untouched
        self._pristine = {id(t): (t, t._version) for t in self.backbone.state_dict(keep_vars=True).values()}

    @property
    def network(self) -> nn.Module:
        return self.learner._network

    def learn(self, experience) -> None:
        classes = task_classes(experience, len(self.class_names), self.seen_classes, self.name)
        self.data_manager.begin_task(experience, classes)
        counter = self.network.register_forward_hook(self._count_step)
        try:
            self.learner.incremental_train(self.data_manager)
            self.learner.after_task()
        finally:
            counter.remove()
        self.seen_classes = self.seen_classes + classes

    def _count_step(self, module: nn.Module, inputs, output) -> None:
        # a forward pass that trains (train mode, with a graph) is one training step
        if module.training and torch.is_grad_enabled():
            self.train_iterations += 1

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        self.network.eval()
        logits = self.network(images.to(self.device))["logits"]
        n_seen = len(self.seen_classes)
        if logits.shape[1] < n_seen:
            raise UserError(
                f"{self.name}: the network gives {logits.shape[1]} logits for {n_seen} seen classes; "
                "grow it in incremental_train (update_fc)"
            )
        return logits[:, :n_seen].float()

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = super().checkpoint_state()
        untouched = []
        for key, value in self.network.state_dict(keep_vars=True).items():
            if self._is_pristine(value):
                untouched.append(key)
            else:
                tensors[f"network/{key}"] = value.detach().cpu().contiguous()
        kinds, arrays = {}, []
        for attr in getattr(self.learner, "checkpoint_attributes", ()):
            value = getattr(self.learner, attr)
            if isinstance(value, np.ndarray):  # the family keeps class means as numpy arrays
                arrays.append(attr)
                value = torch.from_numpy(np.ascontiguousarray(value))
            kinds[attr], packed = pack_state(value)
            tensors.update({f"learner/{attr}{suffix}": t for suffix, t in packed.items()})
        meta["learner"] = {
            "cur_task": self.learner._cur_task,
            "known_classes": self.learner._known_classes,
            "total_classes": self.learner._total_classes,
            "attributes": kinds,
            "numpy": arrays,
        }
        meta["network_untouched"] = untouched
        manager = self.data_manager
        meta["data_manager"] = {"task_sizes": manager.task_sizes, "nb_tasks": manager.nb_tasks}
        return tensors, meta

    def _is_pristine(self, tensor: torch.Tensor) -> bool:
        built = self._pristine.get(id(tensor))
        return built is not None and built[0] is tensor and tensor._version == built[1]

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        saved = meta["learner"]
        if hasattr(self.network, "update_fc"):  # a growing network takes the saved size first
            self.network.update_fc(saved["total_classes"])
        state = {k[len("network/") :]: t for k, t in tensors.items() if k.startswith("network/")}
        loaded = self.network.load_state_dict(state, strict=False)
        lost = sorted(set(loaded.missing_keys) - set(meta["network_untouched"]))
        if lost or loaded.unexpected_keys:
            raise ValueError(
                f"{self.name}: the checkpoint does not fit the learner's network (missing {lost[:3]}, "
                f"unexpected {loaded.unexpected_keys[:3]}); rebuild the network's modules in __init__"
            )
        self.learner._cur_task = saved["cur_task"]
        self.learner._known_classes = saved["known_classes"]
        self.learner._total_classes = saved["total_classes"]
        for attr, kind in saved["attributes"].items():
            value = unpack_state(kind, _packed(tensors, f"learner/{attr}"), getattr(self.learner, attr, None))
            setattr(self.learner, attr, value.numpy() if attr in saved["numpy"] else value)
        self.data_manager.restore(self.seen_classes, **meta["data_manager"])


def _packed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors ``pack_state`` saved under ``prefix``, keyed by their suffix."""
    return {k[len(prefix) :]: t for k, t in tensors.items() if k == prefix or k.startswith(prefix + "/")}


def adapt(cls: type, name: str) -> type:
    """The suite's strategy around the LAMDA-family learner ``cls`` (``pycil:module:Class``)."""
    if not callable(getattr(cls, "incremental_train", None)):
        raise UserError(
            f"{name}: {getattr(cls, '__name__', cls)} has no incremental_train(data_manager); a pycil: "
            "strategy is a learner in PyCIL's shape (docs/adding-a-strategy.md)"
        )
    return type(
        cls.__name__,
        (PyCILAdapter,),
        {"wrapped": cls, "name": name, "Config": declared_config(cls), "__module__": __name__},
    )
