"""What a model of Mammoth (``ContinualModel``) reads besides its batches, in the suite's terms: a
backbone in ``MammothBackbone``'s shape, the dataset object, and ``args`` from Mammoth's own parser.

Labels are class positions in the run's class order, so task ``t``'s classes are the contiguous
range ``get_offsets(t)``, as Mammoth's datasets give them. Images arrive finished (the suite's
augmentation for ``inputs``, its eval transform for ``not_aug_inputs``, both normalised), so the
model's ``transform`` is None and the dataset's normalisation transforms are the identity: a
replayed image is the eval-transform image, as the project's own ER example replays it.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.core.errors import UserError
from strategies.frameworks.common import CLIPClassifier

#: Mammoth's args that the suite's own fields set (a suite gives these as the fields, not in args)
FROM_FIELDS = {
    "lr": "lr",
    "n_epochs": "epochs",
    "batch_size": "batch_size",
    "optimizer": "optimizer",
    "optim_wd": "weight_decay",
    "optim_mom": "momentum",
    "num_workers": "num_workers",
}
#: Mammoth's args that are the run's own facts
RUN_FACTS = ("seed", "device", "dataset", "model", "nowand", "non_verbose", "debug_mode")


class PositionHead(nn.Module):
    """``CLIPClassifier``'s head on features, its columns in class-position order (``order[k]``
    is the class id at position k): Mammoth's ``net.classifier``."""

    order: torch.Tensor  # a buffer

    def __init__(self, clip: CLIPClassifier) -> None:
        super().__init__()
        self.head = clip.head
        self._clip = [clip]  # not a submodule: its backbone is the net's
        self.register_buffer("order", torch.arange(clip.head.out_features))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        clip = self._clip[0]
        if clip.head_kind == "linear":
            logits = self.head(features)
        else:
            logits = clip.backbone.logit_scale * features @ F.normalize(self.head.weight, dim=-1).T
        return logits[:, self.order]


class MammothNet(nn.Module):
    """The run's ``CLIPClassifier`` as a ``MammothBackbone``: ``forward(x, returnt)`` with
    ``"out"`` (logits by class position), ``"features"`` or ``"both"``, ``features(x)``,
    ``classifier`` and the flat ``get_params``/``set_params``/``get_grads``."""

    def __init__(self, clip: CLIPClassifier) -> None:
        super().__init__()
        self.clip = clip
        self.classifier: PositionHead = PositionHead(clip)

    def forward(self, x: torch.Tensor, returnt: str = "out"):
        features = self.clip.features(x)
        if returnt == "features":
            return features
        out = self.classifier(features)
        if returnt == "out":
            return out
        if returnt == "both":
            return out, features
        raise UserError(
            f"net(x, returnt={returnt!r}): the mammoth: adapter's net gives 'out', 'features' or 'both'"
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x, returnt="features")

    @property
    def device(self) -> torch.device:
        return self.clip.head.weight.device

    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def get_params(self) -> torch.Tensor:
        return torch.cat([p.reshape(-1) for p in self._trainable()])

    def set_params(self, new_params: torch.Tensor) -> None:
        start = 0
        with torch.no_grad():
            for p in self._trainable():
                p.copy_(new_params[start : start + p.numel()].view_as(p))
                start += p.numel()

    def get_grads(self) -> torch.Tensor:
        return torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self._trainable()]
        )


class TaskItems(Dataset):
    """A task's training items as Mammoth's ``MammothDatasetWrapper`` gives them: ``(augmented
    image, class position, eval-transform image, *extra)``, where ``extra`` are the attributes
    named in ``extra_return_fields`` (LwF sets ``logits``) at the item. ``data`` holds the items'
    indices (the images are the suite's, made per item) and ``targets`` their positions."""

    def __init__(self, dataset, position: dict[int, int]) -> None:
        self.train_view, self.eval_view = dataset.train(), dataset.eval()
        self.targets = np.array([position[int(c)] for c in dataset.targets], dtype=np.int64)
        self.data = np.arange(len(self.targets))
        self.extra_return_fields: tuple[str, ...] = ()
        self.num_times_iterated = 0

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        image = self.train_view[index][0]
        extra = tuple(getattr(self, name)[index] for name in self.extra_return_fields)
        return (image, int(self.targets[index]), self.eval_view[index][0], *extra)


class MissingAttribute(UserError, AttributeError):
    """What the dataset object does not give (an AttributeError, so ``hasattr`` says False)."""


class TaskData:
    """Mammoth's dataset object (``ContinualDataset``) for the run: the counts ``ContinualModel``
    reads, ``get_offsets``, the current task's ``train_loader`` and the identity normalisation."""

    NAME = "clip-cil-bench"
    SETTING = "class-il"

    def __init__(
        self, n_tasks: int, classes_per_task: int | list[int], n_classes: int, args, image_size: int
    ) -> None:
        self.N_TASKS, self.N_CLASSES_PER_TASK, self.N_CLASSES = n_tasks, classes_per_task, n_classes
        self.SIZE = (image_size, image_size)
        self.args = args
        self.c_task, self.i = -1, 0
        self.train_loader: DataLoader | None = None
        self.test_loaders: list = []

    def get_offsets(self, task: int | None = None) -> tuple[int, int]:
        """Task ``task``'s class positions [start, end): of equal tasks (``N_CLASSES_PER_TASK`` an
        int) or of each task's size (a list, a half-base split), as Mammoth's ``ContinualDataset``
        reads either (aimagelab/mammoth ``datasets/utils/continual_dataset.py``, ``get_offsets``)."""
        task = self.c_task if task is None else task
        per_task = self.N_CLASSES_PER_TASK
        if isinstance(per_task, int):
            return task * per_task, (task + 1) * per_task
        return sum(per_task[:task]), sum(per_task[: task + 1])

    def task_size(self, task: int) -> int | None:
        """The size the model was built for task ``task`` to have (None past the stream it knew)."""
        per_task = self.N_CLASSES_PER_TASK
        return per_task if isinstance(per_task, int) else (per_task[task] if task < len(per_task) else None)

    def get_normalization_transform(self):
        return nn.Identity()

    def get_denormalization_transform(self):
        return nn.Identity()

    def get_transform(self):
        return None

    def get_loss(self):
        return F.cross_entropy

    def get_epochs(self) -> int:
        return self.args.n_epochs

    def get_batch_size(self) -> int:
        return self.args.batch_size

    def get_minibatch_size(self) -> int:
        return getattr(self.args, "minibatch_size", self.args.batch_size)

    def __getattr__(self, name: str):
        raise MissingAttribute(
            f"the model reads dataset.{name}, which the mammoth: adapter's dataset object does not "
            "give (it gives N_TASKS, N_CLASSES_PER_TASK, N_CLASSES, SETTING, train_loader, "
            "get_offsets and the normalisation transforms)"
        )


def mammoth_args(cls: type, values: dict[str, Any], facts: dict[str, Any], name: str) -> argparse.Namespace:
    """``args`` as Mammoth's ``main.parse_args`` builds them for ``cls``: its experiment and
    management arguments and the model's ``get_parser``, with ``values`` (the suite's) and
    ``facts`` (the run's) in place of the command line, then ``extend_args``' rules that apply."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    utils_args = sys.modules.get("utils.args")
    if utils_args is not None:  # Mammoth's own groups, as its main adds them
        utils_args.add_experiment_args(parser)
        utils_args.add_management_args(parser)
    get_parser = getattr(cls, "get_parser", None)
    if get_parser is not None:
        group = parser.add_argument_group("Model-specific arguments")
        takes_parser = bool(inspect.signature(get_parser).parameters)
        own = get_parser(group) if takes_parser else get_parser()
        if own is not None and own is not group and own is not parser:  # an old-style parser of its own
            if utils_args is not None:
                utils_args.fix_model_parser_backwards_compatibility(parser, own)
            else:
                for action in own._actions:
                    if action.dest != "help" and action.dest not in {a.dest for a in parser._actions}:
                        parser._add_action(action)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    unknown = sorted(set(values) - set(actions))
    if unknown and actions:
        hints = [
            f"{k!r}" + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(k, actions, 1))
            for k in unknown
        ]
        raise UserError(
            f"{name}: args {', '.join(hints)} are not arguments of Mammoth's parser for "
            f"{cls.__name__} (its own: {sorted(_own_args(parser, utils_args))})",
            options=("args",),
        )
    given = {**values, **facts}
    for dest, value in given.items():
        action = actions.get(dest)
        if action is None:
            continue
        if isinstance(value, str) and callable(action.type):
            value = action.type(value)
        if action.choices is not None and value not in action.choices:
            raise UserError(
                f"{name}: args {dest} = {value!r} is not one of {list(action.choices)}", options=("args",)
            )
        action.default, action.required = value, False
    missing = sorted(a.dest for a in actions.values() if a.required)
    if missing:
        raise UserError(
            f"{name}: Mammoth's parser requires {', '.join(missing)} and gives no default; set "
            f'them in the suite\'s [strategy."{name}"] table: args = {{ {missing[0]} = ... }}',
            options=("args",),
        )
    args = parser.parse_args([])
    for dest, value in given.items():  # the run's facts Mammoth's parser does not declare
        setattr(args, dest, value)
    if "minibatch_size" in actions and "minibatch_size" not in values:
        args.minibatch_size = args.batch_size  # extend_args: a given batch_size sets it
    changed = {k: getattr(args, k) for k, v in _PROTOCOL.items() if getattr(args, k, v) != v}
    if changed:  # Mammoth's loop options that would change the suite's protocol
        raise UserError(
            f"{name}: args {changed} change what the runner fixes (fitting by epochs, the whole "
            "training set, labelled, no joint training); the mammoth: adapter keeps Mammoth's defaults",
            options=("args",),
        )
    return args


_PROTOCOL = {
    "fitting_mode": "epochs",
    "joint": 0,
    "validation": None,
    "label_perc": 1,
    "label_perc_by_class": 1,
    "noise_rate": 0,
    "start_from": None,
    "stop_after": None,
    "inference_only": 0,
}


def _own_args(parser: argparse.ArgumentParser, utils_args) -> set[str]:
    if utils_args is None:
        return {a.dest for a in parser._actions}
    base = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    utils_args.add_experiment_args(base)
    utils_args.add_management_args(base)
    return {a.dest for a in parser._actions} - {a.dest for a in base._actions}


# ---------------------------------------------------------------------- a model's plain state
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"args", "dataset"}
_OPAQUE = (type, nn.Module, torch.dtype, SimpleNamespace)


def plain_attributes(obj, prefix: str = "", depth: int = 0):
    """``(path, value)`` of ``obj``'s attributes, inside plain objects (Mammoth's ``Buffer`` and
    its sampler) down to depth 2; a module's submodules, parameters and buffers are its state_dict's."""
    for name, value in vars(obj).items():
        if depth == 0 and name in _MODULE_INTERNALS:
            continue
        path = f"{prefix}{name}"
        if _is_plain_object(value) and depth < 2:
            yield from plain_attributes(value, f"{path}.", depth + 1)
        else:
            yield path, value


def _is_plain_object(value) -> bool:
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, _OPAQUE)
        and not callable(getattr(value, "__get__", None))  # functions and methods
        and not isinstance(value, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, torch.Tensor))
        and type(value).__module__ not in ("builtins", "functools")
        and not inspect.ismodule(value)
    )


def pack_attribute(value, key: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any] | None:
    """``value``'s kind for the metadata, its tensors put in ``tensors``; None for a kind a
    checkpoint cannot hold."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu().contiguous()
        return {"kind": "tensor"}
    if isinstance(value, np.ndarray) and value.dtype != object:
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
        return {"kind": "numpy"}
    if isinstance(value, torch.device):
        return {"kind": "device", "value": str(value)}
    if isinstance(value, torch.optim.Optimizer):
        state = value.state_dict()
        for index, entries in state["state"].items():
            for name, tensor in entries.items():
                tensors[f"{key}/{index}/{name}"] = torch.as_tensor(tensor).detach().cpu().contiguous()
        return {"kind": "optimizer", "groups": _json(state["param_groups"])}
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        state = _json(value.state_dict())
        return None if state is None else {"kind": "scheduler", "value": state}
    plain = _json(value)
    if plain is not None or value is None:
        return {"kind": "tuple" if isinstance(value, tuple) else "json", "value": plain}
    return None


def _json(value):
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return None


def restore_attribute(model, path: str, kind: dict[str, Any], tensors, key: str, device) -> None:
    *parents, name = path.split(".")
    owner = model
    for part in parents:
        owner = getattr(owner, part)
    current: Any = getattr(owner, name, None)
    what = kind["kind"]
    if what == "optimizer":
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, t in tensors.items():
            if k.startswith(key + "/"):
                index, entry = k[len(key) + 1 :].split("/", 1)
                state.setdefault(int(index), {})[entry] = t
        current.load_state_dict({"state": state, "param_groups": kind["groups"]})
        return
    if what == "scheduler":
        current.load_state_dict(kind["value"])
        return
    if what in ("tensor", "numpy"):
        value = tensors[key].clone()  # the model writes into it; the checkpoint keeps its own
        if what == "numpy":
            value = value.numpy()
        else:
            where = current.device if isinstance(current, torch.Tensor) else getattr(owner, "device", device)
            value = value.to(where)
    elif what == "device":
        value = torch.device(kind["value"])
    else:
        value = tuple(kind["value"]) if what == "tuple" else kind["value"]
    setattr(owner, name, value)
