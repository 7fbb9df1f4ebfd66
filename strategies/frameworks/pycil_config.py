"""What a LAMDA-family learner (``strategies.frameworks.pycil``) is given: its options
(``PyCILConfig``: its own ``args``, and the StrategyConfig recipe it never reads, refused) and its
``args`` as a dict that records every key the learner looks up (``ReadArgs``), so that a key the
suite sets and the learner never reads is named."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from benchmarks.core.errors import UserError
from strategies.config import StrategyConfig
from strategies.frameworks.upstream import scaled_epochs

RUN_FACTS = ("device", "seed", "backbone", "class_names")
#: StrategyConfig's training recipe, which a learner of the family never reads (its own is in args
#: and its module's constants); the runner reads eval_batch_size, train_augmentation, amp (the
#: backbone's precision) and num_workers (its module's loader workers)
NOT_READ = (
    "epochs",
    "batch_size",
    "lr",
    "weight_decay",
    "lora_rank",
    "lora_alpha",
    "optimizer",
    "momentum",
    "schedule",
    "warmup_steps",
    "warmup_fraction",
    "min_lr_ratio",
    "grad_clip",
)


@dataclass
class PyCILConfig(StrategyConfig):
    """A LAMDA-family learner's options. ``args``: the learner's own options, passed through as it
    reads them. Its recipe (epochs, learning rates, batch sizes) is its own, in ``args`` or in its
    module's constants, so StrategyConfig's training recipe (``NOT_READ``) is refused when given; the
    runner reads ``eval_batch_size``, ``train_augmentation``, ``amp`` and ``num_workers`` (its
    module's loader-worker constants). ``epoch_scale`` and ``epoch_cap`` are the
    runner's (the suite's ``epoch_scale``, ``--fast-dev-run``), applied to the epoch options in
    ``args`` here and to the module's epoch constants while the learner runs."""

    args: dict[str, Any] = field(default_factory=dict)
    epoch_scale: float = 1.0
    epoch_cap: int | None = None
    #: none: the learner's batch sizes are its own, which a fast dev run's cap cannot reach
    training_batch_sizes: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        super().__post_init__()
        reserved = sorted(set(self.args) & set(RUN_FACTS))
        if reserved:
            raise UserError(
                f"args {reserved} are the run's (--device, the seed, the backbone, the classes), "
                "not options a suite sets",
                options=("args",),
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any], strategy: str = "") -> Self:
        runners = sorted({"epoch_scale", "epoch_cap"} & set(values))
        if runners:
            raise UserError(
                f"{', '.join(runners)} of {strategy or cls.__name__} come from the suite's epoch_scale "
                "and --fast-dev-run, not from a strategy table",
                options=tuple(runners),
            )
        refuse_unread_recipe(values, strategy or cls.__name__)
        return super().from_dict(values, strategy)

    @classmethod
    def ignored_fields(cls) -> frozenset[str]:
        return frozenset(NOT_READ)

    def with_epoch_scale(self, scale: float) -> tuple[PyCILConfig, list[str]]:
        changes = scaled_epochs(self.args, scale, None)
        args = {**self.args, **{k: new for k, (_, new) in changes.items()}}
        return dataclasses.replace(self, args=args, epoch_scale=scale), ["args"] * bool(changes) + [
            "epoch_scale"
        ]

    def with_epoch_cap(self, cap: int) -> tuple[PyCILConfig, list[str]]:
        changes = scaled_epochs(self.args, 1.0, cap)
        args = {**self.args, **{k: new for k, (_, new) in changes.items()}}
        return dataclasses.replace(self, args=args, epoch_cap=cap), ["args"] * bool(changes) + ["epoch_cap"]


def refuse_unread_recipe(values: dict[str, Any], strategy: str) -> None:
    """One line for recipe fields given (other than their defaults) that the learner never reads:
    they would be hashed into the run's config and change nothing."""
    defaults = {f.name: f.default for f in dataclasses.fields(StrategyConfig)}
    given = [k for k in NOT_READ if k in values and values[k] != defaults[k]]
    if given:
        raise UserError(
            f"{', '.join(given)} of {strategy} would change nothing: the learner reads its options from "
            f"args (args = {{ {given[0]} = ... }} where its code reads that key) and its module's constants",
            options=tuple(given),
        )


class ReadArgs(dict):
    """The learner's ``args``: a dict in every way upstream code can tell (``isinstance``, JSON,
    ``copy``), which records in ``looked_up`` every key looked up (``[]``, ``get``, ``in``,
    ``setdefault``, ``pop``), found or not. Copies share the record, so a learner that copies its
    ``args`` still counts as reading them. A read through ``dict(args)`` or ``**args`` is not seen."""

    def __init__(self, values=(), looked_up: set | None = None) -> None:
        super().__init__(values)
        self.looked_up = set() if looked_up is None else looked_up

    def __getitem__(self, key):
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.looked_up.add(key)
        return super().__contains__(key)

    def get(self, key, default=None):
        self.looked_up.add(key)
        return super().get(key, default)

    def setdefault(self, key, default=None):
        self.looked_up.add(key)
        return super().setdefault(key, default)

    def pop(self, key, *default):
        self.looked_up.add(key)
        return super().pop(key, *default)

    def copy(self) -> ReadArgs:
        return ReadArgs(self, self.looked_up)

    __copy__ = copy

    def __deepcopy__(self, memo) -> ReadArgs:
        return ReadArgs(copy.deepcopy(dict(self), memo), self.looked_up)

    def __reduce__(self):  # a pickle (a loader worker's copy) is a plain dict: the record stays here
        return dict, (dict(self),)
