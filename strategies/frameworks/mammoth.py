"""Models in Mammoth's shape under the suite's protocol.

The model is built as ``cls(backbone=net, loss=nn.CrossEntropyLoss(), args=SimpleNamespace(...),
transform=None)``: ``net`` is a ``CLIPClassifier`` on the run's backbone with logits over every
class id of the dataset, and ``args`` holds the Config's fields with ``n_epochs`` (= ``epochs``),
``seed`` and ``device``. Labels are the dataset's class ids (not renumbered by task), so a model
that masks logits uses ``TaskInfo``'s class lists, not ranges. ``transform`` is None: batches
arrive augmented, and ``not_aug_inputs`` are the same images under the eval transform.

Per task: ``begin_task(TaskInfo)`` if the model has it, ``epochs`` passes of
``observe(inputs, labels, not_aug_inputs, epoch)`` (one call per batch, shuffled from the run seed
and the task), then ``end_task(TaskInfo)``. Unless the model builds its own ``opt``, the adapter
gives it a fresh one each task from the config (``strategies.optim.build_optimizer``), so a
resumed run needs no optimiser state.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.core.errors import UserError
from strategies.frameworks.common import CLIPClassifier, FrameworkAdapter, declared_config, task_classes
from strategies.optim import build_optimizer

_MODEL = "model."  # checkpoint names of the model's own attributes


@dataclass
class TaskInfo:
    """What ``begin_task`` and ``end_task`` receive: the fields of Mammoth's dataset object that
    mean something here, and the class lists that replace its contiguous label ranges."""

    c_task: int  # the task's index
    N_TASKS: int
    N_CLASSES_PER_TASK: int
    N_CLASSES: int  # class ids of the dataset (the net's outputs)
    i: int  # classes seen once this task is learned (Mammoth's counter)
    classes: list[int]  # this task's class ids
    past_classes: list[int]  # class ids of earlier tasks
    seen_classes: list[int]  # past_classes + classes
    train_loader: DataLoader  # batches of (inputs, labels, not_aug_inputs)


class TwoViews(Dataset):
    """``(augmented image, class id, eval-transform image)`` of the same item of an experience."""

    def __init__(self, dataset) -> None:
        self.train_view, self.eval_view = dataset.train(), dataset.eval()

    def __len__(self) -> int:
        return len(self.train_view)

    def __getitem__(self, index: int):
        image, label = self.train_view[index][:2]
        return image, int(label), self.eval_view[index][0]


class MammothAdapter(FrameworkAdapter):
    """A Mammoth-shaped model (``wrapped``) run on the stream; see the module's docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        cfg = self.cfg
        self.net = CLIPClassifier(self.backbone, self.class_names, cfg.head, cfg.encoder, cfg).to(self.device)
        options = {**cfg.to_dict(), "n_epochs": cfg.epochs, "seed": self.seed, "device": self.device}
        self.model = self.wrapped(
            backbone=self.net, loss=nn.CrossEntropyLoss(), args=SimpleNamespace(**options), transform=None
        )
        if isinstance(self.model, nn.Module):
            self.model.to(self.device)
        if getattr(self.model, "device", None) is None:
            self.model.device = self.device
        self.builds_optimizer = getattr(self.model, "opt", None) is None
        self.observe_takes_epoch = "epoch" in inspect.signature(self.model.observe).parameters
        self.task_sizes: list[int] = []

    def learn(self, experience) -> None:
        classes = task_classes(experience, len(self.class_names), self.seen_classes, self.name)
        task = len(self.task_sizes)
        self.task_sizes.append(len(classes))
        shuffle = torch.Generator().manual_seed(self.seed * 1_000_003 + task)
        loader = DataLoader(
            TwoViews(experience.dataset),
            batch_size=self.cfg.batch_size,
            shuffle=True,
            generator=shuffle,
            num_workers=self.cfg.num_workers,
        )
        stream = getattr(experience, "origin_stream", None)
        info = TaskInfo(
            c_task=task,
            N_TASKS=len(stream) if stream is not None else task + 1,
            N_CLASSES_PER_TASK=len(classes),
            N_CLASSES=len(self.class_names),
            i=len(self.seen_classes) + len(classes),
            classes=classes,
            past_classes=list(self.seen_classes),
            seen_classes=self.seen_classes + classes,
            train_loader=loader,
        )
        if self.builds_optimizer:
            self.model.opt = build_optimizer(self._trainable(), self.cfg)
        self._train_mode(True)
        if hasattr(self.model, "begin_task"):
            self.model.begin_task(info)
        for epoch in range(self.cfg.epochs):
            for step, (inputs, labels, not_aug_inputs) in enumerate(loader):
                if self.max_train_batches is not None and step >= self.max_train_batches:
                    break
                batch = (inputs.to(self.device), labels.to(self.device), not_aug_inputs.to(self.device))
                loss = self.model.observe(*batch, **({"epoch": epoch} if self.observe_takes_epoch else {}))
                if not math.isfinite(float(loss)):
                    raise FloatingPointError(f"{self.name}.observe gave a loss of {float(loss)}")
                self.train_iterations += 1
        if hasattr(self.model, "end_task"):
            self.model.end_task(info)
        self.seen_classes = self.seen_classes + classes

    def _trainable(self) -> list[nn.Parameter]:
        owner = self.model if isinstance(self.model, nn.Module) else self.net
        trainable = [p for p in owner.parameters() if p.requires_grad]
        if not trainable:
            raise UserError(f"{self.name}: the model has no trainable parameters for its optimiser")
        return trainable

    def _train_mode(self, training: bool) -> None:
        (self.model if isinstance(self.model, nn.Module) else self.net).train(training)

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        self._train_mode(False)
        return self.model.forward(images.to(self.device))[:, self.seen_classes].float()

    def _state_value(self, attr: str):
        if attr.startswith(_MODEL):
            return getattr(self.model, attr[len(_MODEL) :])
        return super()._state_value(attr)

    def _restore_value(self, attr: str, value) -> None:
        if not attr.startswith(_MODEL):
            return super()._restore_value(attr, value)
        name = attr[len(_MODEL) :]
        current = getattr(self.model, name, None)
        if isinstance(current, nn.Module):  # unpack_state loaded it in place
            return
        if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
            value = value.to(current.device)  # where the model keeps it
        setattr(self.model, name, value)


def adapt(cls: type, name: str) -> type:
    """The suite's strategy around the Mammoth-shaped model ``cls`` (``mammoth:module:Class``)."""
    if not callable(getattr(cls, "observe", None)):
        raise UserError(
            f"{name}: {getattr(cls, '__name__', cls)} has no observe(inputs, labels, not_aug_inputs); a "
            "mammoth: strategy is a model in Mammoth's shape (docs/adding-a-strategy.md)"
        )
    own = tuple(f"{_MODEL}{attr}" for attr in getattr(cls, "checkpoint_attributes", ()))
    return type(
        cls.__name__,
        (MammothAdapter,),
        {
            "wrapped": cls,
            "name": name,
            "Config": declared_config(cls),
            "checkpoint_attributes": ("seen_classes", "task_sizes", "net", *own),
            "__module__": __name__,
        },
    )
