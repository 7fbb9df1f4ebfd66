"""What the runner calls on a strategy: the contract, written once.

Any class that has the required members runs under the suite's protocol, whatever it is built
on: ``CLIPStrategy`` (the suite's own base), or an adapter around another framework's strategy
(``strategies.frameworks``: Avalanche templates, PyCIL/PILOT/C3Box learners, Mammoth models).

The runner builds a strategy with the keyword arguments of ``CONSTRUCTOR_ARGUMENTS``, then for
every task calls ``learn(experience)`` and scores the test set over ``seen_classes``; after
every task it saves ``checkpoint_state()`` and, on a resume, gives it back to
``load_checkpoint_state``. Everything else it reads, through ``OptionalMembers`` (one typed member
each), has a default here, so a strategy from elsewhere needs only ``REQUIRED``.
``docs/adding-a-strategy.md`` holds the same tables (``tests/strategies/test_contract.py`` checks
them equal; ``optional_table`` writes the optional one).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, overload, runtime_checkable

import torch

from benchmarks.core.errors import UserError
from strategies.config import StrategyConfig
from strategies.training.evaluation import cat_on_host

#: name -> what it is; a strategy must have every one
REQUIRED: dict[str, str] = {
    "learn": "learn(experience): train on one experience of the stream (an Avalanche experience; "
    "its dataset yields (image, class id, task label 0), images as finished float tensors)",
    "scores": "scores(images) -> [B, len(seen_classes)]: scores over every class seen so far, "
    "columns in the order of seen_classes, no task id",
    "seen_classes": "list of the class ids learned so far, in the order they were learned",
    "checkpoint_state": "checkpoint_state() -> (dict of tensors, JSON dict): the learned state after a task",
    "load_checkpoint_state": "load_checkpoint_state(tensors, meta): restore what checkpoint_state gave",
}


MemberT = TypeVar("MemberT")


class Member(Generic[MemberT]):
    """One optional member: what it is, what the runner does without it, and the default read in
    its place. On ``OptionalMembers`` it reads as the strategy's own member, typed ``MemberT``, or as
    that default; on the class, as itself (``OPTIONAL`` and the docs' table are made of these)."""

    def __init__(self, default: MemberT, what: str, without: str) -> None:
        self.default, self.what, self.without = default, what, without
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, members: None, owner: type) -> Member[MemberT]: ...

    @overload
    def __get__(self, members: OptionalMembers, owner: type) -> MemberT: ...

    def __get__(self, members: OptionalMembers | None, owner: type) -> Member[MemberT] | MemberT:
        if members is None:
            return self
        return getattr(members.strategy, self.name, self.default)


def refuses_no_checkpoint(meta: dict[str, Any]) -> str | None:
    """resume_refusal's default: every checkpoint of the run's config is loaded."""
    return None


def no_stage_diagnostics(scores: Any, targets: Any, task_of_class: dict[int, int]) -> dict[str, Any]:
    return {}


def no_run_diagnostics() -> dict[str, Any]:
    return {}


def not_counted() -> int | None:
    """trainable_parameter_count's default: no count (null in the result)."""
    return None


class SaveModel(Protocol):
    """``save_model``'s signature (the runner passes ``extra`` by name)."""

    def __call__(self, path: Path, extra: dict[str, Any]) -> None: ...


class OptionalMembers:
    """What the runner reads of a strategy (an instance, or its class) beyond ``REQUIRED``, one typed
    member each: the strategy's own where it has one (an attribute, or a zero-argument property),
    else the contract's default. ``OptionalMembers(strategy).save_model``."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    Config = Member[type](
        StrategyConfig,
        "the options: a dataclass subclassing StrategyConfig, filled from the suite's tables",
        "StrategyConfig: the options every strategy shares",
    )
    evaluate_dataset = Member[Callable[..., torch.Tensor] | None](
        None,
        "evaluate_dataset(dataset, cache_key) -> [N, len(seen_classes)] fp32 on the CPU",
        "scores batch by batch, eval_batch_size at a time, without gradients",
    )
    finishes_pending_images = Member[bool](
        False,
        "class attribute, True when the strategy's own loaders finish DevicePending items "
        "(benchmarks.data.device_augment) on the device",
        "False: the stream's items are finished float tensors (augment_on = pil)",
    )
    avalanche_plugins = Member[bool](
        False,
        "class attribute, True when the strategy runs Avalanche's loop, so a suite's plugins and the "
        "live log's training iterations attach to it",
        "False: a suite that gives it plugins is refused in one line; its live log holds the stages "
        "only, and the run warns so",
    )
    check_plugins = Member[Callable[[list[Any]], None] | None](
        None,  # no check: the runner builds no plugin to check
        "check_plugins(plugins), a classmethod: raise a UserError for a plugin the strategy cannot take",
        "every plugin is taken",
    )
    resumable = Member[bool](
        True,
        "class or instance attribute, False when a checkpoint cannot hold all the learned state",
        "True; when False, an interrupted run starts again from task 1",
    )
    resume_refusal = Member[Callable[[dict[str, Any]], str | None]](
        refuses_no_checkpoint,
        "resume_refusal(meta): why a checkpoint's metadata cannot restore the strategy (a str), or None",
        "None: every checkpoint of the run's config is loaded",
    )
    stage_diagnostics = Member[Callable[[Any, Any, dict[int, int]], dict[str, Any]]](
        no_stage_diagnostics,
        "stage_diagnostics(scores, targets, task_of_class) -> dict, stored per stage",
        "{}",
    )
    run_diagnostics = Member[Callable[[], dict[str, Any]]](
        no_run_diagnostics, "run_diagnostics() -> dict, stored once per run", "{}"
    )
    trainable_parameter_count = Member[Callable[[], int | None]](
        not_counted,
        "trainable_parameter_count() -> int, every optimised tensor counted once over the stream",
        "null in cost.trainable_params",
    )
    train_iterations = Member[int | None](
        None, "training steps taken so far (property or attribute)", "null in cost.train_steps"
    )
    skipped_steps = Member[int](0, "fp16 steps the loss scaler skipped", "0")
    save_model = Member[SaveModel | None](
        None,
        "save_model(path, extra): the learned state as two files (--save-models)",
        "--save-models refused",
    )
    zero_shot_predictions = Member[Callable[..., dict[str, torch.Tensor]] | None](
        None,
        "zero_shot_text(tokens) and zero_shot_predictions(images, text), with tokens and images "
        "from the run's backbone: zero-shot targets (ZeroShotStrategy)",
        "a suite with zero_shot_targets refused",
    )


#: name -> the optional member (what it is, what the runner does without it, its default), in the
#: order of ``OptionalMembers``: the docs' table (``optional_table``)
OPTIONAL: dict[str, Member[Any]] = {
    name: member for name, member in vars(OptionalMembers).items() if isinstance(member, Member)
}


def shown_default(default: Any) -> str:
    """A default as docs/adding-a-strategy.md's table shows it: a function or class by its name."""
    return default.__name__ if callable(default) else repr(default)


def optional_table() -> str:
    """docs/adding-a-strategy.md's table of the optional members, written from ``OPTIONAL``."""
    rows = ["| member | what it is | without it | default |", "|---|---|---|---|"]
    rows += [
        f"| `{name}` | {member.what} | {member.without} | {shown_default(member.default)} |"
        for name, member in OPTIONAL.items()
    ]
    return "\n".join(rows)


#: the keyword arguments the runner builds every strategy with
CONSTRUCTOR_ARGUMENTS: dict[str, str] = {
    "backbone": "the run's CLIPBackbone (benchmarks.backbone), on the run's device",
    "class_names": "the dataset's class names, indexed by class id",
    "config": "an instance of the strategy's Config, resolved from the suite",
    "settings": "how it runs (strategies.settings.RunSettings): device, precision (auto already resolved "
    "with Config.amp), show_progress, seed, train_batches (a fast dev run's cap) and augment_on",
    "plugins": "None, or Avalanche plugins to attach (the live training log)",
}


@runtime_checkable
class Strategy(Protocol):
    """The required core (``REQUIRED``); ``OPTIONAL`` members are read through ``OptionalMembers``."""

    seen_classes: list[int]

    def learn(self, experience: Any) -> None: ...

    def scores(self, images: torch.Tensor) -> torch.Tensor: ...

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None: ...


@runtime_checkable
class ZeroShotStrategy(Strategy, Protocol):
    """A strategy with zero-shot predictors (``OPTIONAL["zero_shot_predictions"]``): all the runner
    reads of it for a zero-shot target (``benchmarks.runner.zero_shot``), which builds the target's
    prompts, images and loader itself, from the run's config and the backbone it built."""

    def zero_shot_text(self, tokens: torch.Tensor) -> Any: ...

    def zero_shot_predictions(self, images: torch.Tensor, text: Any) -> dict[str, torch.Tensor]: ...


#: for each framework whose strategies come in through an adapter: a member that tells them apart
_FRAMEWORK_MARKS = (
    ("incremental_train", "pycil", "a PyCIL/PILOT/C3Box learner"),
    ("observe", "mammoth", "a Mammoth model"),
)


def missing(cls: type) -> list[str]:
    """The required members class ``cls`` lacks (an attribute counts when a class of its MRO
    declares it, ``seen_classes: list[int]``, or its ``__init__``'s code sets it)."""
    absent = []
    for name in REQUIRED:
        if hasattr(cls, name) or any(name in vars(k).get("__annotations__", {}) for k in cls.__mro__):
            continue
        if name == "seen_classes" and _assigns_in_init(cls, name):
            continue
        absent.append(name)
    return absent


def _assigns_in_init(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        try:
            if f"self.{name}" in inspect.getsource(init):
                return True
        except (OSError, TypeError):  # built in, or no source: trust nothing
            continue
    return False


def check_strategy(cls: Any, name: str) -> type:
    """``cls`` if it is a class with the contract's required members; else one line that names
    what it lacks and how to bring it in."""
    if not isinstance(cls, type):
        raise UserError(f"{name} is a {type(cls).__name__}, not a class; name a strategy class")
    absent = missing(cls)
    if not absent:
        _check_constructor(cls, name)
        return cls
    lacks = ", ".join(absent[:-1]) + (" and " if len(absent) > 1 else "") + absent[-1]
    module, _, attr = name.rpartition(":")
    return_hint = _wrap_hint(cls, module, attr)
    raise UserError(
        f"{name} is not a strategy of this suite: it lacks {lacks}; {return_hint} (docs/adding-a-strategy.md)"
    )


def _wrap_hint(cls: type, module: str, attr: str) -> str:
    try:
        from avalanche.training.templates import SupervisedTemplate
    except ImportError:  # pragma: no cover - Avalanche is a dependency
        SupervisedTemplate = ()
    builtin = module in ("avalanche.training", "avalanche.training.supervised")
    if isinstance(SupervisedTemplate, type) and issubclass(cls, SupervisedTemplate):
        name = f"avalanche:{attr}" if builtin else f"avalanche:{module}:{attr}"
        return f"wrap it as {name} (an Avalanche strategy on a head over CLIP features)"
    for member, prefix, what in _FRAMEWORK_MARKS:
        if hasattr(cls, member):
            return f"wrap it as {prefix}:{module}:{attr} ({what})"
    return (
        "subclass strategies.base.CLIPStrategy, or wrap it as avalanche:MODULE:CLASS, "
        "pycil:MODULE:CLASS or mammoth:MODULE:CLASS"
    )


def _check_constructor(cls: type, name: str) -> None:
    """The runner's keyword arguments must all be accepted (by name, or by ``**kwargs``)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    accepted = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    refused = [arg for arg in CONSTRUCTOR_ARGUMENTS if arg not in accepted]
    if refused:
        raise UserError(
            f"{name}'s constructor does not take the runner's keyword argument(s) {', '.join(refused)}; "
            "accept them (or **kwargs): the table 'What the runner passes' in docs/adding-a-strategy.md"
        )


#: Avalanche's own plugins that keep nothing across tasks
_STATELESS_PLUGINS = ("EvaluationPlugin", "PeriodicEval", "Clock")


def plugins_survive_resume(plugins) -> bool:
    """Whether a checkpoint of the model is all a resume needs from these Avalanche plugins: each is
    one of Avalanche's stateless ones, or says so itself (``survives_resume = True``: the suite's
    progress bar, its live log). LwF's previous model, EWC's importances and a replay buffer live in
    their plugins, which Avalanche keeps only by pickling the whole strategy."""
    return all(
        type(p).__name__ in _STATELESS_PLUGINS or getattr(p, "survives_resume", False) for p in plugins
    )


def stream_task_sizes(experience) -> list[int] | None:
    """The class count of every task of the stream ``experience`` comes from, first to last (its
    ``origin_stream``; each experience's ``classes_in_order``): equal tasks, or a half-base split's
    base then its increments. None where the experience does not carry its stream. A structure
    sized per task reads the sizes here, not all classes / the first task's."""
    stream = getattr(experience, "origin_stream", None)
    if stream is None:
        return None
    return [len(getattr(e, "classes_in_order", None) or e.classes_in_this_experience) for e in stream]


def config_class(cls: type) -> type[StrategyConfig]:
    """The strategy's ``Config``, or ``StrategyConfig`` for a strategy that declares none."""
    config = OptionalMembers(cls).Config
    if not (isinstance(config, type) and issubclass(config, StrategyConfig)):
        raise UserError(
            f"{getattr(cls, '__name__', cls)}.Config must subclass strategies.config.StrategyConfig "
            "(a dataclass of options)"
        )
    return config


@torch.no_grad()
def evaluate(
    strategy: Strategy, dataset, batch_size: int, device: torch.device | str, cache_key: str | None
) -> torch.Tensor:
    """The scores of ``dataset`` over ``strategy.seen_classes``, ``[N, n_seen]`` fp32 on the CPU:
    the strategy's ``evaluate_dataset`` if it has one, else ``scores`` batch by batch; checked
    against the contract (``check_scores``) before any metric reads them."""
    own = OptionalMembers(strategy).evaluate_dataset
    if own is not None:
        return check_scores(strategy, own(dataset, cache_key=cache_key), len(dataset), "evaluate_dataset")
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    scores = [torch.as_tensor(strategy.scores(batch[0].to(device))) for batch in loader]
    widths = {tuple(batch.shape[1:]) for batch in scores}
    if len(widths) > 1 or any(batch.dim() != 2 for batch in scores):  # no one matrix to check
        shapes = sorted({_shape(batch) for batch in scores})
        raise UserError(
            f"{type(strategy).__name__}.scores gave batches of shapes {', '.join(shapes)} for "
            f"{len(strategy.seen_classes)} seen classes; give [batch size, len(seen_classes)] for every batch"
        )
    return check_scores(strategy, cat_on_host([batch.float() for batch in scores]), len(dataset), "scores")


def _shape(scores: torch.Tensor) -> str:
    return f"[{', '.join(map(str, scores.shape))}]"


def check_scores(strategy: Strategy, scores, n_images: int, member: str = "scores") -> torch.Tensor:
    """``scores`` as fp32 on the CPU if they keep the contract: ``[n_images, len(seen_classes)]``
    and finite. Otherwise a ``UserError`` naming the strategy's ``member`` and the shape (or the
    first non-finite value): a score matrix of the wrong shape gives plausible, wrong metrics (a
    missing column is a class never predicted), and NaN fails deep inside the metrics."""
    name, n_seen = f"{type(strategy).__name__}.{member}", len(strategy.seen_classes)
    try:
        scores = torch.as_tensor(scores).detach().float().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise UserError(f"{name} gave a {type(scores).__name__}, not a tensor of scores") from None
    if scores.shape != (n_images, n_seen):
        raise UserError(
            f"{name} gave scores of shape {_shape(scores)} for {n_images} test images and {n_seen} seen "
            f"classes; expected [{n_images}, {n_seen}]: a row per image, a column per seen class in "
            "seen_classes order"
        )
    finite = torch.isfinite(scores)
    if not bool(finite.all()):
        row, column = (int(i) for i in (~finite).nonzero()[0])
        value = scores[row, column].item()
        what = "NaN" if value != value else str(value)  # NaN is the one value unequal to itself
        raise UserError(
            f"{name} gave {what} at test image {row}, column {column} (class "
            f"{strategy.seen_classes[column]}), {int((~finite).sum())} non-finite score(s) in all; "
            "a score must be a finite number"
        )
    return scores
