"""Models of Mammoth (aimagelab/mammoth), unchanged, and models in its shape, under the suite's
protocol: ``mammoth:models.er:Er`` with the Mammoth checkout on the Python path.

**A Mammoth model** (one with ``ContinualModel``'s ``meta_observe``) is driven as Mammoth's own
``utils/training.py`` drives it: per task ``meta_begin_task(dataset)`` (which resets the optimiser
and sets the task counters that LwF and others read), Mammoth's ``get_scheduler``, ``n_epochs``
passes of ``meta_begin_epoch``, ``meta_observe(inputs, labels, not_aug_inputs, epoch=..., **extra)``
per batch and ``meta_end_epoch``, then ``meta_end_task(dataset)``. It is built as
``cls(net, nn.CrossEntropyLoss(), args, None, dataset)`` when the first task arrives:

* ``net``: the run's ``CLIPClassifier`` (``head``, ``encoder``) in ``MammothBackbone``'s shape, its
  logits by class position (``strategies.frameworks.mammoth_parts``);
* ``dataset``: an object with what ``ContinualModel`` reads (``N_TASKS``, ``N_CLASSES_PER_TASK``,
  ``get_offsets``, the task's ``train_loader``, ...);
* ``args``: Mammoth's own parser (its experiment and management groups and the model's
  ``get_parser``) with the suite's ``lr``, ``epochs``, ``batch_size``, ``optimizer``,
  ``weight_decay``, ``momentum`` and ``num_workers`` in Mammoth's names, and the suite table's
  ``args`` (``args = { buffer_size = 200, minibatch_size = 32 }``) for everything else. Every
  other argument keeps Mammoth's default; one Mammoth requires must be in ``args``.

Importing it leaves the working directory and ``sys.path`` as they were, and a module that
downloads at import is refused (``strategies.frameworks.guarded_import``). Its exceptions are one
line naming its file and line, and ``--quiet`` silences its logging and progress bars
(``strategies.frameworks.upstream``). A checkpoint holds the model's whole state (its modules'
learned tensors, its buffer, optimiser, counters); where the model keeps something else, a
resumed run starts again from task 1 and says why (``resume_refusal``). The RNGs need no saving:
the runner seeds them at the start of every task.

**A model in Mammoth's shape** (no ``meta_observe``: ``examples/mammoth_er``) is built as
``cls(backbone=net, loss=..., args=SimpleNamespace(config), transform=None)`` on the plain
``CLIPClassifier`` (labels are class ids), gets ``begin_task(TaskInfo)``, ``epochs`` passes of
``observe`` and ``end_task(TaskInfo)``, a fresh optimiser from the config each task unless it
builds its own ``opt``, and checkpoints its ``checkpoint_attributes``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import math
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.core.errors import UserError
from benchmarks.data.loaders import first_batches
from benchmarks.data.splits import equal_split
from strategies.contract import stream_task_sizes
from strategies.frameworks.common import (
    CLIPClassifier,
    FrameworkAdapter,
    FrameworkConfig,
    declared_config,
    refuse_plugins,
    task_classes,
)
from strategies.frameworks.guarded_import import importing
from strategies.frameworks.mammoth_parts import (
    FROM_FIELDS,
    RUN_FACTS,
    MammothNet,
    TaskData,
    TaskItems,
    mammoth_args,
    pack_attribute,
    plain_attributes,
    restore_attribute,
)
from strategies.frameworks.upstream import (
    modules_under,
    root_of,
    running_upstream,
)
from strategies.optim import build_optimizer

__all__ = ["importing", "adapt", "MammothConfig"]
_MODEL = "model."  # checkpoint names of the model's own attributes
_STATE = "mammoth/"  # checkpoint names of a Mammoth model's state


@dataclass
class MammothConfig(FrameworkConfig):
    """A Mammoth model's options: ``head``, ``encoder``, the recipe fields Mammoth's args take
    (module docstring) and ``args``, the model's own arguments by Mammoth's names."""

    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        fields = {k: FROM_FIELDS[k] for k in self.args if k in FROM_FIELDS}
        if fields:
            named = ", ".join(f"{k} (the suite's {v})" for k, v in fields.items())
            raise UserError(
                f"args {named} are set by the strategy's own fields, not in args", options=("args",)
            )
        facts = sorted(set(self.args) & set(RUN_FACTS))
        if facts:
            raise UserError(
                f"args {facts} are the run's (--seeds, --device), not options a suite sets", options=("args",)
            )
        model = getattr(type(self), "model_class", None)
        if model is not None:  # the whole parse, before any run computes
            mammoth_args(model, self.args, _recipe(self), type(self).strategy_name)


def _recipe(cfg) -> dict[str, Any]:
    return {mammoth: getattr(cfg, ours) for mammoth, ours in FROM_FIELDS.items()}


@dataclass
class TaskInfo:
    """What a model in Mammoth's shape gets in ``begin_task`` and ``end_task``."""

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


class MammothAdapter(FrameworkAdapter[MammothConfig]):
    """What both kinds of model share: the run's ``CLIPClassifier``, the task sizes, the upstream
    code's logging, progress bars and errors (``_upstream``)."""

    checkpoint_attributes = ("seen_classes", "task_sizes")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        refuse_plugins(self.name, self.plugins)  # they could never see the model's loop
        cfg = self.cfg
        self.clip = CLIPClassifier(self.backbone, self.class_names, cfg.head, cfg.encoder, cfg).to(
            self.device
        )
        self.task_sizes: list[int] = []
        self.root = root_of(self.wrapped.__module__)
        self._modules = modules_under(self.root)

    def _upstream(self, doing: str):
        """The model's code runs in the block: quiet under ``--quiet``; an exception raised in its
        files is one line naming the file and line, what it was doing and what the suite passed."""
        quiet = None if self.settings.show_progress else self._modules
        return running_upstream(self.root, self.name, doing, self._passed, quiet_modules=quiet)

    def _passed(self) -> str:
        return ", ".join(
            f"{k}={v!r}" for k, v in self.cfg.to_dict().items() if k in ("lr", "epochs", "batch_size")
        )

    def trainable_parameter_count(self) -> int:
        return sum(p.numel() for p in self.clip.learned_state().values())


class ShapedAdapter(MammothAdapter):
    """A model in Mammoth's shape (module docstring, last paragraph)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = self.clip
        options = {
            **self.cfg.to_dict(),
            "n_epochs": self.cfg.epochs,
            "seed": self.settings.seed,
            "device": self.device,
        }
        with self._upstream("building the model"):
            self.model = self.wrapped(
                backbone=self.net, loss=nn.CrossEntropyLoss(), args=SimpleNamespace(**options), transform=None
            )
            if isinstance(self.model, nn.Module):
                self.model.to(self.device)
        if getattr(self.model, "device", None) is None:
            self.model.device = self.device
        self.builds_optimizer = getattr(self.model, "opt", None) is None
        self.observe_takes_epoch = "epoch" in inspect.signature(self.model.observe).parameters

    def learn(self, experience) -> None:
        classes = task_classes(experience, len(self.class_names), self.seen_classes, self.name)
        task = len(self.task_sizes)
        self.task_sizes.append(len(classes))
        loader = _loader(
            TwoViews(experience.dataset), self.cfg.batch_size, self.cfg.num_workers, self.settings.seed, task
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
        with self._upstream(f"training task {task + 1}"):
            if hasattr(self.model, "begin_task"):
                self.model.begin_task(info)
            for epoch in range(self.cfg.epochs):
                for inputs, labels, not_aug_inputs in first_batches(loader, self.settings.train_batches):
                    batch = (inputs.to(self.device), labels.to(self.device), not_aug_inputs.to(self.device))
                    loss = self.model.observe(
                        *batch, **({"epoch": epoch} if self.observe_takes_epoch else {})
                    )
                    _finite(loss, self.name)
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
        with self._upstream("scoring"):
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


def _loader(
    dataset: Dataset, batch_size: int, workers: int, seed: int, task: int, drop_last=False
) -> DataLoader:
    """Shuffled from the run seed and the task, so a resumed run draws the same batches."""
    shuffle = torch.Generator().manual_seed(seed * 1_000_003 + task)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=shuffle,
        num_workers=workers,
        drop_last=drop_last,
    )


def _finite(loss, name: str) -> None:
    if not math.isfinite(float(loss)):
        raise FloatingPointError(f"{name}: the model's observe gave a loss of {float(loss)}")


class UpstreamAdapter(MammothAdapter):
    """A Mammoth ``ContinualModel``, driven through its ``meta_*`` wrappers (module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = MammothNet(self.clip).to(self.device)
        facts = {
            "seed": self.settings.seed,
            "device": str(self.device),
            "dataset": TaskData.NAME,
            "model": getattr(self.wrapped, "NAME", self.wrapped.__name__),
            "nowand": 1,  # Mammoth logs to wandb only when asked
            "non_verbose": int(not self.settings.show_progress),
            "debug_mode": 0,
        }
        with self._upstream("reading its arguments"):
            self.args = mammoth_args(self.wrapped, self.cfg.args, {**_recipe(self.cfg), **facts}, self.name)
        # the upstream ContinualModel and its dataset object, built at task 1 or on a resume; the
        # model's members are Mammoth's (meta_observe, net, ...), which nothing here types
        self.model: Any = None
        self.data: TaskData | None = None
        # the backbone's pretrained tensors as built: a checkpoint leaves out those still untouched
        self._pristine = {id(t): (t, t._version) for t in self.net.state_dict(keep_vars=True).values()}

    def _passed(self) -> str:
        given = {**_recipe(self.cfg), **self.cfg.args}
        return "args " + ", ".join(f"{k}={v!r}" for k, v in given.items())

    def _build(self, n_tasks: int, per_task: int | list[int]) -> None:
        """The model on the run's net and dataset object (the stream's shape is known at task 1)."""
        self.data = TaskData(n_tasks, per_task, len(self.class_names), self.args, self.backbone.image_size)
        with self._upstream("building the model"):
            self.model = self.wrapped(self.net, nn.CrossEntropyLoss(), self.args, None, self.data)
            self.model.to(self.device)
        self._built = {path: id(value) for path, value in plain_attributes(self.model)}
        self._children = {name for name, _ in self.model.named_children()}

    def learn(self, experience) -> None:
        classes = task_classes(experience, len(self.class_names), self.seen_classes, self.name)
        task = len(self.task_sizes)
        stream = getattr(experience, "origin_stream", None)
        if self.model is None:  # Mammoth's N_CLASSES_PER_TASK: an int, or each task's size (half-base)
            sizes = stream_task_sizes(experience) or [len(classes)]
            per_task = sizes[0] if equal_split(sizes) else sizes
            self._build(len(sizes) if stream is not None else task + 1, per_task)
        data = self._task_data
        expected = data.task_size(task)
        if len(classes) != expected:
            raise UserError(
                f"{self.name}: task {task + 1} has {len(classes)} classes where the stream's shape at "
                f"task 1 gave {expected}; a Mammoth model keeps the task sizes it was built with"
            )
        self._place_classes(stream, classes)
        position = {c: k for k, c in enumerate(self.seen_classes + classes)}
        items = TaskItems(experience.dataset, position)
        loader = _loader(
            items,
            self.args.batch_size,
            self.cfg.num_workers,
            self.settings.seed,
            task,
            drop_last=bool(getattr(self.args, "drop_last", False)),
        )
        data.train_loader, data.c_task = loader, task
        data.i = len(self.seen_classes) + len(classes)
        self._modules = modules_under(self.root)  # with those it imported since
        with self._upstream(f"training task {task + 1}"):
            self._train(loader, items)
        self.task_sizes.append(len(classes))
        self.seen_classes = self.seen_classes + classes

    @property
    def _task_data(self) -> TaskData:
        if self.data is None:
            raise RuntimeError(f"{self.name}: its model is built at task 1 or on a resume, not yet")
        return self.data

    def _place_classes(self, stream, classes: list[int]) -> None:
        """The net's class positions: the stream's class order (earlier tasks first, then these)."""
        learned = self.seen_classes + classes
        order = [int(c) for e in (stream or []) for c in (getattr(e, "classes_in_order", None) or [])]
        if sorted(order) != list(range(len(self.class_names))) or order[: len(learned)] != learned:
            order = learned + [c for c in range(len(self.class_names)) if c not in set(learned)]
        current = self.net.classifier.order
        if current.tolist() != order:
            current.copy_(torch.tensor(order))

    def _train(self, loader: DataLoader, items: TaskItems) -> None:
        """One task as Mammoth's ``utils/training.py`` trains it, on ``loader`` over ``items``."""
        model, args, data = self.model, self.args, self._task_data
        model.net.train()
        model.meta_begin_task(data)
        schedulers = sys.modules.get("utils.schedulers")  # Mammoth's, imported by adapt
        if hasattr(model, "scheduler"):
            scheduler = model.custom_scheduler
        else:
            scheduler = schedulers.get_scheduler(model, args, reload_optim=True) if schedulers else None
        for epoch in range(args.n_epochs):
            if hasattr(model, "meta_begin_epoch"):
                model.meta_begin_epoch(epoch, data)
            # the model's train_loader is whole
            for batch in first_batches(loader, self.settings.train_batches):
                inputs, labels, not_aug_inputs = (t.to(self.device) for t in batch[:3])
                # the model may name extra fields at its task's start (LwF: logits)
                extra = {
                    name: batch[3 + k].to(self.device) for k, name in enumerate(items.extra_return_fields)
                }
                loss = model.meta_observe(inputs, labels.long(), not_aug_inputs, epoch=epoch, **extra)
                _finite(loss, self.name)
                if scheduler is not None and args.scheduler_mode == "iter":
                    scheduler.step()
                self.train_iterations += 1
            if scheduler is not None and args.scheduler_mode == "epoch":
                scheduler.step()
            if hasattr(model, "meta_end_epoch"):
                model.meta_end_epoch(epoch, data)
        model.meta_end_task(data)

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        with self._upstream("scoring"):
            self.model.net.eval()  # as Mammoth's evaluate
            out = self.model(images.to(self.device))
        return out[:, : len(self.seen_classes)].float()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = super().checkpoint_state()
        if self.model is None:
            return tensors, meta
        meta["shape"] = [self._task_data.N_TASKS, self._task_data.N_CLASSES_PER_TASK]
        untouched: list[str] = []
        first: dict[int, str] = {}  # a tensor under two names (the net's head) is saved once
        for key, value in self.model.state_dict(keep_vars=True).items():
            built = self._pristine.get(id(value))
            if built is not None and built[0] is value and value._version == built[1]:
                untouched.append(key)
            elif first.setdefault(id(value), key) == key:
                tensors[f"{_STATE}module/{key}"] = value.detach().cpu().contiguous()
            else:
                untouched.append(key)
        unsaved: list[str] = []
        copies: list[str] = []
        for name, child in self.model.named_children():
            if name not in self._children:  # made while it trained: a copy of the net (an old net)
                (copies if type(child) is type(self.model.net) else unsaved).append(name)
        saved: dict[str, Any] = {}
        for path, value in plain_attributes(self.model):
            kind = pack_attribute(value, f"{_STATE}attr/{path}", tensors)
            if kind is not None:
                saved[path] = kind
            elif self._built.get(path) != id(value):  # not as built, and not a kind a checkpoint holds
                unsaved.append(f"{path} ({type(value).__name__})")
        meta["mammoth"] = {"untouched": untouched, "copies": copies, "attributes": saved, "unsaved": unsaved}
        return tensors, meta

    def resume_refusal(self, meta: dict[str, Any]) -> str | None:
        unsaved = meta.get("mammoth", {}).get("unsaved")
        if unsaved:
            return f"its model keeps {', '.join(unsaved[:3])}, which a checkpoint cannot hold"
        return None

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        if "mammoth" not in meta:
            return
        self._build(*meta["shape"])
        state = meta["mammoth"]
        for name in state["copies"]:
            setattr(self.model, name, copy.deepcopy(self.model.net))
        prefix = f"{_STATE}module/"
        loaded = self.model.load_state_dict(
            {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}, strict=False
        )
        lost = sorted(set(loaded.missing_keys) - set(state["untouched"]))
        if lost or loaded.unexpected_keys:
            raise ValueError(
                f"{self.name}: the checkpoint does not fit the model (missing {lost[:3]}, unexpected "
                f"{loaded.unexpected_keys[:3]})"
            )
        for path, kind in state["attributes"].items():
            restore_attribute(self.model, path, kind, tensors, f"{_STATE}attr/{path}", self.device)


def adapt(cls: type, name: str) -> type:
    """The suite's strategy around the Mammoth model (or model in its shape) ``cls``."""
    if not callable(getattr(cls, "observe", None)):
        raise UserError(
            f"{name}: {getattr(cls, '__name__', cls)} has no observe(inputs, labels, not_aug_inputs); a "
            "mammoth: strategy is a model in Mammoth's shape (docs/adding-a-strategy.md)"
        )
    if not callable(getattr(cls, "meta_observe", None)):
        own = tuple(f"{_MODEL}{attr}" for attr in getattr(cls, "checkpoint_attributes", ()))
        attributes = {"checkpoint_attributes": ("seen_classes", "task_sizes", "net", *own)}
        return _adapter(cls, name, ShapedAdapter, declared_config(cls), attributes)
    settings = set(getattr(cls, "COMPATIBILITY", None) or ["class-il"])
    if not settings & {"class-il", "general-continual"}:
        raise UserError(
            f"{name}: the model's COMPATIBILITY is {sorted(settings)}; the suite is class-incremental"
        )
    with importing("utils.args:", name):  # what the adapter calls of Mammoth's own, where it has it
        for helper in ("utils.args", "utils.schedulers"):
            with contextlib.suppress(ImportError):
                importlib.import_module(helper)
    config = type(
        f"{cls.__name__}Config",
        (MammothConfig,),
        {"model_class": cls, "strategy_name": name, "__module__": __name__},
    )
    return _adapter(cls, name, UpstreamAdapter, config, {})


def _adapter(cls: type, name: str, base: type, config: type, extra: dict[str, Any]) -> type:
    namespace = {"wrapped": cls, "name": name, "Config": config, "__module__": __name__, **extra}
    return type(cls.__name__, (base,), namespace)
