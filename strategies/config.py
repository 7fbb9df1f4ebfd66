"""Strategy configs: plain dataclasses whose fields are the options a suite may set.

``StrategyConfig`` holds what every strategy shares; a strategy's ``Config`` subclasses it. A field
with a fixed set of values is typed ``Literal[...]`` (or a union with one): a suite value outside
it is refused in one line that lists the choices, with no hand-written check.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from benchmarks.core.errors import UserError
from benchmarks.data.prompts import PromptEnsemble
from benchmarks.data.transforms import TrainAugmentation
from strategies.optim import Optimizer, Schedule


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a suite value fits a config field's annotation (an int fits a float; a bool is no number)."""
    if hint is Any:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_has_type(value, option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return value in typing.get_args(hint)
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(repr(value) for value in typing.get_args(hint))
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false"}.get(hint, str(hint))


def _did_you_mean(key: str, valid) -> str:
    """`` (did you mean 'epochs'?)`` for a near miss of a valid option, else ""."""
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def _choice_fields(cls: type) -> dict[str, Any]:
    """The fields of config class ``cls`` whose annotation holds a ``Literal``."""

    def has_literal(hint: Any) -> bool:
        if typing.get_origin(hint) is typing.Literal:
            return True
        return typing.get_origin(hint) in (typing.Union, types.UnionType) and any(
            map(has_literal, typing.get_args(hint))
        )

    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if has_literal(hints[f.name])}


@dataclass
class StrategyConfig:
    """Hyper-parameters every strategy shares. Subclasses add their own fields."""

    epochs: int = 1
    batch_size: int = 64
    eval_batch_size: int = 256
    lr: float = 0.005
    weight_decay: float = 0.1
    lora_rank: int = 24
    lora_alpha: float = 1.0
    prompt_template: str = "a photo of a {}."
    prompt_ensemble: PromptEnsemble = (
        ""  # "" (prompt_template alone), "cifar" (18) or "imagenet" (80 templates)
    )
    num_workers: int = 0
    # The method's own train augmentation (benchmarks.data.transforms.TRAIN_AUGMENTATIONS); a suite's
    # tables override it, the most specific first (benchmarks.runner.suites).
    train_augmentation: TrainAugmentation = "paper"
    # Optimiser and schedule (read by the base ``make_optimizer``; docs/baselines.md §2.3).
    optimizer: Optimizer = "adamw"
    momentum: float = 0.0  # SGD only
    schedule: Schedule = "cosine_iter"  # strategies.optim
    warmup_steps: int = 0  # linear warm-up, in the schedule's unit (iterations or epochs)
    warmup_fraction: float = 0.0  # or as a fraction of all scheduled steps of the task
    min_lr_ratio: float = 0.0  # the cosine ends at min_lr_ratio * lr
    grad_clip: float = 0.0  # max gradient norm (0: off)
    # Mixed precision under --precision auto: False keeps the method fp32 on CUDA too (its official
    # precision); an explicit --precision fp16 or bf16 still wins.
    amp: bool = True
    #: the fewest epochs a task may train (0 only for a strategy that never trains)
    min_epochs: ClassVar[int] = 1
    #: the fields that set a training pass's batch size (a fast dev run caps them, runner.suites.RunLimits)
    training_batch_sizes: ClassVar[tuple[str, ...]] = ("batch_size",)
    #: the fields that count a task's training passes: its epochs and a second stage's or a probe's
    #: (a fast dev run caps them all; a suite's ``epoch_scale`` scales ``epochs`` only)
    training_epochs: ClassVar[tuple[str, ...]] = ("epochs",)

    def __post_init__(self):
        for name, hint in _choice_fields(type(self)).items():  # every Literal field, in every subclass
            value = getattr(self, name)
            if not _has_type(value, hint):
                allowed = (
                    f"is not one of {list(typing.get_args(hint))}"
                    if typing.get_origin(hint) is typing.Literal
                    else f"must be {_type_name(hint)}"
                )
                raise UserError(f"option {name}={value!r} {allowed}", options=(name,))
        both = bool(self.warmup_steps and self.warmup_fraction)
        warmup = {
            "warmup_steps": self.warmup_steps < 0 or both,
            "warmup_fraction": not 0.0 <= self.warmup_fraction < 1.0 or both,
        }
        if any(warmup.values()):
            raise UserError(
                "give warmup_steps >= 0 or warmup_fraction in [0, 1), not both",
                options=tuple(name for name, bad in warmup.items() if bad),
            )
        bounds = {"min_lr_ratio": not 0.0 <= self.min_lr_ratio <= 1.0, "grad_clip": self.grad_clip < 0}
        if any(bounds.values()):
            raise UserError(
                "min_lr_ratio must be in [0, 1] and grad_clip >= 0",
                options=tuple(name for name, bad in bounds.items() if bad),
            )
        # Numbers that torch would reject mid-run, or that would quietly train nothing.
        at_least = {
            "batch_size": 1,
            "eval_batch_size": 1,
            "lora_rank": 1,
            "num_workers": 0,
            "weight_decay": 0,
            "momentum": 0,
            "epochs": self.min_epochs,
        }
        for name, low in at_least.items():
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < low:
                hint = " (a strategy that trains nothing is continual_clip)" if name == "epochs" else ""
                raise UserError(f"option {name} = {value!r} must be at least {low}{hint}", options=(name,))
        if not self.lr > 0:
            raise UserError(f"option lr = {self.lr!r} must be positive", options=("lr",))

    @classmethod
    def from_dict(cls, values: dict[str, Any], strategy: str = "") -> Self:
        """Build a config from suite values; an unknown key is a user error that suggests the
        closest valid option and lists them all."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            named = ", ".join(f"{key!r}{_did_you_mean(key, fields)}" for key in unknown)
            own = (  # a framework's learner: its own options go through whole
                f"; the learner's own options go in args = {{ {unknown[0]} = ... }}"
                if "args" in fields
                else ""
            )
            raise UserError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {named} for strategy "
                f"{strategy or cls.__name__}; valid options: {sorted(fields)}{own}",
                options=tuple(unknown),
            )
        hints = typing.get_type_hints(cls)
        # checked by __post_init__, which names the choices; a class is hashable (mypy reads instances')
        choices = _choice_fields(typing.cast(type, cls))
        for name, value in values.items():
            if name not in choices and not _has_type(value, hints[name]):
                raise UserError(
                    f"option {name} = {value!r} of strategy {strategy or cls.__name__} must be "
                    f"{_type_name(hints[name])}, not {type(value).__name__}",
                    options=(name,),
                )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_epoch_scale(self, scale: float) -> tuple["StrategyConfig", list[str]]:
        """This recipe under a suite's ``epoch_scale``, and the fields that changed: ``epochs``
        times ``scale``, rounded, at least 1 (a framework's learner scales its own epoch options)."""
        if not (isinstance(self.epochs, int) and self.epochs > 0):
            return self, []
        return dataclasses.replace(self, epochs=max(1, round(self.epochs * scale))), ["epochs"]

    def with_epoch_cap(self, cap: int) -> tuple["StrategyConfig", list[str]]:
        """This recipe with at most ``cap`` passes in each field of ``training_epochs`` (a fast dev
        run), and the fields that changed."""
        changes: dict[str, Any] = {}
        for name in self.training_epochs:
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                changes[name] = cap
        return dataclasses.replace(self, **changes), list(changes)

    @classmethod
    def ignored_fields(cls) -> frozenset[str]:
        """StrategyConfig's fields the strategy's code never reads (an outside learner's recipe is
        its own): a suite's ``[common]`` and ``[defaults]`` leave them out for it, so its config keeps
        their defaults. None for the suite's own strategies."""
        return frozenset()

    @classmethod
    def recipe_fields(cls) -> frozenset[str]:
        """The fields this config declares itself, below ``StrategyConfig``: the strategy's own
        (official) recipe. A suite's ``[common]`` table sets the others, the protocol's common
        settings, for every strategy that inherits them (``benchmarks.runner.suites``)."""
        own = set()
        for klass in cls.__mro__:
            if klass is StrategyConfig:
                break
            own |= set(vars(klass).get("__annotations__", {}))
        return frozenset(own & {f.name for f in dataclasses.fields(cls)})


#: a strategy's config class, the argument of a generic base: ``CLIPStrategy[GR4CILConfig]``,
#: ``FrameworkAdapter[PyCILConfig]`` type ``self.cfg``
ConfigT = TypeVar("ConfigT", bound=StrategyConfig)
