"""Avalanche's strategies under the suite's protocol: ``avalanche:LwF``, ``avalanche:EWC``, ...,
or a user's own ``SupervisedTemplate`` subclass as ``avalanche:module.path:ClassName``.

The template trains a ``CLIPClassifier`` (``strategies.frameworks.common``: a linear or cosine head
on the CLIP image tower, frozen or tuned through a LoRA) with its own loop, criterion
(cross-entropy over every class id) and plugins, exactly as it would on an Avalanche benchmark.
The runner's stream is one: its datasets are task-aware (task label 0) and its items finished
tensors, so every plugin that reads task labels (LwF, EWC, replay) works. Its scores are its
logits at the seen classes.

Options: ``FrameworkConfig``'s (head, encoder, and StrategyConfig's recipe) plus every keyword
argument of the template's constructor that is a number, string or flag (LwF's ``alpha`` and
``temperature``, EWC's ``ewc_lambda``, Replay's ``mem_size``, ...). One rule gives their defaults
(docs/decisions.md D4): Avalanche's own default where its signature has one; a parameter Avalanche
requires must be set in the suite (``[strategy."avalanche:LwF"]``), and a run without it stops in
one line.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
import warnings
from typing import Any, ClassVar

import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from tqdm.auto import tqdm

from benchmarks.core.errors import UserError
from benchmarks.data.loaders import FirstBatches
from strategies.contract import plugins_survive_resume
from strategies.frameworks.common import CLIPClassifier, FrameworkAdapter, FrameworkConfig, task_classes
from strategies.optim import build_optimizer

#: constructor parameters the adapter fills itself
_SUPPLIED = frozenset(
    {"self", "model", "optimizer", "criterion", "train_mb_size", "train_epochs", "eval_mb_size", "device"}
    | {"plugins", "evaluator", "eval_every", "peval_mode"}
)
_SIMPLE = (bool, int, float, str)


def adapt(template: type, name: str) -> type:
    """An adapter class (the runner's contract) around the ``SupervisedTemplate`` subclass ``template``."""
    if not (isinstance(template, type) and issubclass(template, SupervisedTemplate)):
        raise UserError(f"{name}: {template!r} is not an Avalanche SupervisedTemplate subclass")
    return type(
        f"Avalanche{template.__name__}",
        (AvalancheStrategy,),
        {"wrapped": template, "name": name, "Config": template_config(template), "__module__": __name__},
    )


def template_config(template: type[Any]) -> type[FrameworkConfig]:
    """``FrameworkConfig`` plus a field per simple keyword argument of ``template``'s constructor."""
    fields: list[tuple[str, Any, Any]] = []  # dataclasses.make_dataclass's (name, type, field)
    required: list[str] = []
    hints = _constructor_hints(template)
    for p in inspect.signature(template.__init__).parameters.values():
        if p.name in _SUPPLIED or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        hint = _simple_type(hints.get(p.name, Any))
        if hint is None:
            continue  # a module, a callable, a list of plugins: not a suite option
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
            fields.append((p.name, hint | None, dataclasses.field(default=None)))
        elif p.default is None or isinstance(p.default, _SIMPLE):
            fields.append(
                (p.name, hint | None if p.default is None else hint, dataclasses.field(default=p.default))
            )

    def __post_init__(self):  # the dataclass hook
        FrameworkConfig.__post_init__(self)
        unset = [field for field in required if getattr(self, field) is None]
        if unset:
            raise UserError(
                f"avalanche:{template.__name__} needs option(s) {', '.join(unset)} (Avalanche has no "
                f'default); set them in the suite\'s [strategy."avalanche:{template.__name__}"] table',
                options=tuple(unset),
            )

    return dataclasses.make_dataclass(
        f"{template.__name__}Config",
        fields,
        bases=(FrameworkConfig,),
        namespace={"__post_init__": __post_init__, "__module__": __name__},
    )


def _constructor_hints(template: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(template.__init__)
    except Exception:  # an annotation that does not resolve: such a parameter is left out
        return {}


def _simple_type(hint: Any) -> type | None:
    """bool, int, float or str for an annotation that allows one (a union picks its first simple
    member: ``Union[float, Sequence[float]]`` is float), else None."""
    if hint in _SIMPLE:
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option in _SIMPLE:
                return option
    return None


class AvalancheStrategy(FrameworkAdapter[FrameworkConfig]):
    """The runner's contract around an Avalanche template (``adapt`` sets ``wrapped``)."""

    wrapped: ClassVar[type[SupervisedTemplate]]
    checkpoint_attributes = ("seen_classes", "model")
    avalanche_plugins = True

    def __init__(self, **runner_arguments) -> None:
        super().__init__(**runner_arguments)
        cfg = self.cfg
        self.model = CLIPClassifier(self.backbone, self.class_names, cfg.head, cfg.encoder, cfg).to(
            self.device
        )
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # the cap first: the progress bar counts the capped epochs
        own = ([_CappedEpochs(self.settings.train_batches)] if self.settings.train_batches else []) + [
            _Progress(self)
        ]
        with warnings.catch_warnings():  # metrics come from the runner, not from Avalanche's loggers
            warnings.filterwarnings("ignore", message="No loggers specified")
            evaluator = EvaluationPlugin(loggers=[])
        self.template = self.wrapped(
            model=self.model,
            optimizer=build_optimizer(trainable, cfg),
            criterion=torch.nn.CrossEntropyLoss(),
            train_mb_size=cfg.batch_size,
            train_epochs=cfg.epochs,
            eval_mb_size=cfg.eval_batch_size,
            device=self.device,
            plugins=own + self.plugins,
            evaluator=evaluator,
            **self.framework_options(),
        )
        # A run with a plugin that keeps state across tasks starts again instead of resuming.
        self.resumable = plugins_survive_resume(self.template.plugins)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The base's state, plus the optimiser's: Avalanche keeps it across experiences (its moments
        carry into the next task), so a resumed run needs it to train as an uninterrupted one."""
        tensors, meta = super().checkpoint_state()
        optimizer = self.template.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
        return tensors, {**meta, "optimizer_groups": optimizer["param_groups"]}

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        super().load_checkpoint_state(tensors, meta)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith("optimizer/"):
                _, index, key = name.split("/", 2)
                state.setdefault(int(index), {})[key] = value
        if self.template.optimized_param_id is None:  # Avalanche's first make_optimizer sets the group
            self.template.make_optimizer()
        self.template.optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer_groups"]})

    def learn(self, experience) -> None:
        new = task_classes(experience, len(self.class_names), self.seen_classes, self.name)  # checked first
        self.template.train(experience, eval_streams=[], num_workers=self.cfg.num_workers)
        self.model.eval()
        self.seen_classes = self.seen_classes + new
        self.train_iterations = self.template.clock.train_iterations

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        return self.model(images.to(self.device))[:, self.seen_classes].float()

    def trainable_parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.learned_state().values())


class _Progress(SupervisedPlugin):
    """A progress bar per task, over its training iterations."""

    survives_resume = True

    def __init__(self, adapter: AvalancheStrategy) -> None:
        super().__init__()
        self.adapter, self.bar = adapter, None

    def before_training_exp(self, strategy, *args, **kwargs):
        self.bar = tqdm(
            total=strategy.train_epochs * len(strategy.dataloader),
            desc=f"{self.adapter.name} task {strategy.experience.current_experience + 1}",
            leave=False,
            disable=not self.adapter.settings.show_progress,
        )

    def after_training_iteration(self, strategy, *args, **kwargs):
        self.bar.update()

    def after_training_exp(self, strategy, *args, **kwargs):
        self.bar.close()


class _CappedEpochs(SupervisedPlugin):
    """A fast dev run: every training epoch ends after ``train_batches`` batches, and the next epoch
    trains (``benchmarks.data.loaders.FirstBatches`` on the template's train loader). Put on the loader
    once it is made, and again before each epoch, over a loader a later plugin put in its place
    (replay's)."""

    survives_resume = True

    def __init__(self, train_batches: int) -> None:
        super().__init__()
        self.train_batches = train_batches

    def before_training_exp(self, strategy, *args, **kwargs):
        self._cap(strategy)

    def before_training_epoch(self, strategy, *args, **kwargs):
        self._cap(strategy)

    def _cap(self, strategy) -> None:
        if not isinstance(strategy.dataloader, FirstBatches):
            strategy.dataloader = FirstBatches(strategy.dataloader, self.train_batches)
