"""The common base of CLIP strategies: Avalanche's ``SupervisedTemplate`` plus a CLIP text classifier.

A strategy is a subclass that overrides a few named hooks (as in Avalanche):

* ``setup_task(task, classes)``: before training on a task (add adapters, choose what trains);
* ``compute_logits(images)``: the training output, by default logits over the current task's
  classes. It may be any object (e.g. a small dataclass with auxiliary logits, features or a key
  loss, or logits over seen + current classes): the base hands it unchanged to ``compute_loss``
  and nothing else reads it;
* ``compute_loss(output, local_targets)``: the training loss (cross-entropy by default);
* ``finish_task(task, classes)``: after the task's training (prototypes, caches, second stages).
  There, and already in ``setup_task``, ``self.adapted_dataset.eval()`` is the task's training
  data under the eval transform and ``.train()`` under the train augmentation;
* ``scores(images)``: scores over **all seen classes** for a batch of test images (no task id);
* ``score_dataset(dataset, cache_key)``: scores of a whole test set that reuse per-image work kept
  under ``cache_key`` across stages (``frozen_features``); by default batch by batch through
  ``scores``. The base opens every evaluation (``evaluate_dataset``: eval mode, no grad, text fixed);
* ``select_training_data(dataset)``: the part of the task's data that trains (by default all);
* ``finish_backward()``: after each step's backward pass (e.g. a chunked backward's second half);
* ``on_epoch_end(epoch, loss)``: after each epoch; return True to stop the task's training;
* ``stage_diagnostics``, ``run_diagnostics``: strategy-specific numbers stored with the result.

Two class attributes complete them: ``Config`` (the options) and ``checkpoint_attributes`` (learned
state besides LoRA adapters). ``docs/adding-a-strategy.md`` has the tables, which
``tests/strategies/test_strategy_interface.py`` checks against this class.

The runner computes every metric from ``scores``, the same way for every strategy. Avalanche's
own ``strategy.eval`` sees the same scores, one column per class id (``scores_by_class_id``), so
its accuracy metrics equal the runner's. The base owns the training loop and the precision (the
backbone's towers run under autocast and return fp32 features, so scores and losses are fp32).
It is composed of small parts (``strategies.training``): mixins for the text classifier, the
feature caches, the seeded loaders, second stages, parameter discovery (every ``nn.Parameter`` a
strategy holds with ``requires_grad`` is optimised) and the fp16 step with its loss scaler, which
declare what they read from the strategy in one Protocol (``strategies.training.host``) and each
initialise their own state; and two Avalanche plugins it attaches itself, the progress bar and the
"nothing moved" watchdog. Next to it: the options (``strategies.config``), the optimiser and its
schedule (``strategies.optim``) and the state on disk (``strategies.checkpointing``, the loss
scaler included).
"""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path
from typing import Any, ClassVar, Generic

import torch
import torch.nn.functional as F
from avalanche.training.plugins import EvaluationPlugin, LwFPlugin, ReplayPlugin
from avalanche.training.templates import SupervisedTemplate

from benchmarks.backbone import CLIPBackbone, Tower
from benchmarks.core.errors import UserError
from benchmarks.core.precision import matmul_precision
from benchmarks.data.prompts import templates
from strategies.checkpointing import (
    load_model,
    load_strategy_state,
    save_model,
    strategy_state,
)
from strategies.config import ConfigT, StrategyConfig
from strategies.contract import plugins_survive_resume
from strategies.optim import build_optimizer, build_scheduler
from strategies.settings import RunSettings, refuse_settings_as_keywords, take_settings
from strategies.training.evaluation import Evaluation
from strategies.training.features import FeatureCaches
from strategies.training.loaders import SeededLoaders
from strategies.training.mixed_precision import MixedPrecisionStep
from strategies.training.parameters import TrainableParameters
from strategies.training.progress import ProgressBar
from strategies.training.second_stage import SecondStage
from strategies.training.text import TextFeatures
from strategies.training.watchdog import NothingMovedWatchdog


class CLIPStrategy(
    TextFeatures,
    Evaluation,
    FeatureCaches,
    SeededLoaders,
    SecondStage,
    TrainableParameters,
    MixedPrecisionStep,
    SupervisedTemplate,
    Generic[ConfigT],
):
    """Base class of every strategy in the suite. See the module docstring for the hooks; the
    mixins (``strategies.training``) are the text classifier, evaluation, feature caches, loaders,
    second stages, parameter discovery and the optimisation step."""

    #: registry name, set by ``strategies.registry.register``
    name: ClassVar[str] = ""
    #: the strategy's config dataclass (the class's type argument, which a class variable cannot
    #: name: tests/strategies/test_registry.py checks the two equal)
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig
    #: the options this run was built with (``config``), an instance of ``Config``
    cfg: ConfigT
    #: attributes holding learned state besides LoRA adapters, saved in every checkpoint
    #: (``pack_state``): tensors, lists or dicts of tensors, modules, lists of dataclasses, JSON
    #: values, or None
    checkpoint_attributes: ClassVar[tuple[str, ...]] = ()
    #: the class ids learned so far, in the order learned (set per instance)
    seen_classes: list[int]
    #: its loaders finish ``DevicePending`` items on the device (``strategies.contract``)
    finishes_pending_images: ClassVar[bool] = True
    #: a suite's Avalanche plugins attach to it (``strategies.plugins``)
    avalanche_plugins: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        """Avalanche wraps every subclass's ``__init__`` to refuse keywords no ``__init__`` names,
        with a message that cannot know ``RunSettings``; this wrapper, outermost, first says where a
        run setting given as a keyword (``seed=0``, ``show_progress=False``) belongs."""
        super().__init_subclass__(**kwargs)
        checked = cls.__init__

        @functools.wraps(checked)
        def __init__(self, *args, **keywords):
            refuse_settings_as_keywords(cls.__name__, keywords)
            checked(self, *args, **keywords)

        cls.__init__ = __init__

    def __init__(
        self,
        *,
        backbone: CLIPBackbone,
        class_names: list[str],
        config: StrategyConfig,
        settings: RunSettings | None = None,
        **avalanche_kwargs,
    ):
        """``settings``: how it runs (device, precision, progress bars, seed, a fast dev run's
        ``train_batches``, ``augment_on``: ``strategies.settings.RunSettings``); by default
        ``RunSettings.resolved(config)``, on the CPU. ``avalanche_kwargs`` (``plugins``, ``evaluator``,
        ...) go to ``SupervisedTemplate``."""
        refuse_settings_as_keywords(type(self).__name__, avalanche_kwargs)
        take_settings(self, backbone, config, settings)
        self.templates = templates(config.prompt_ensemble, config.prompt_template)
        self.seen_classes: list[int] = []
        self.task_classes: list[list[int]] = []
        self.current_classes: list[int] = []
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> {tower, rank, alpha}
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.epoch_loss = math.nan  # the mean loss of the last epoch, set after each
        self._warned_output_layout = False
        self._column_index: dict[tuple, torch.Tensor] = {}  # by_class_id: (columns, device) -> index
        # Avalanche wants an optimiser up front; the real one is built per task in make_optimizer.
        idle = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        if "evaluator" not in avalanche_kwargs:
            with warnings.catch_warnings():  # metrics come from the runner, not Avalanche's loggers
                warnings.filterwarnings("ignore", message="No loggers specified")
                avalanche_kwargs["evaluator"] = EvaluationPlugin(loggers=[])
        # The suite's own plugins follow the user's, as the base's code followed theirs, and come
        # before Avalanche's evaluator and clock.
        own = [ProgressBar(), NothingMovedWatchdog()]
        avalanche_kwargs["plugins"] = [*(avalanche_kwargs.get("plugins") or []), *own]
        super().__init__(  # the parts (strategies.training) initialise their state on the way
            class_names=class_names,
            model=self.backbone,
            optimizer=idle,
            train_mb_size=config.batch_size,
            train_epochs=config.epochs,
            eval_mb_size=config.eval_batch_size,
            device=self.device,
            **avalanche_kwargs,
        )
        self.check_plugins(self.plugins)

    @classmethod
    def check_plugins(cls, plugins) -> None:
        """Refuse, in one line, the Avalanche plugins this strategy cannot take. LwF distils
        ``strategy.model(x)``, a classifier's logits; replay trains on earlier tasks' classes. A CLIP
        strategy's model is its backbone and its training logits cover the current task, so both
        would fail at task 2: the runner asks before task 1 (``strategies.contract``)."""
        for plugin in plugins:
            if isinstance(plugin, (LwFPlugin, ReplayPlugin)):
                kind = "LwF" if isinstance(plugin, LwFPlugin) else "Replay"
                raise UserError(
                    f"{cls.name or cls.__name__} cannot take {type(plugin).__name__}: its model is the CLIP "
                    "backbone, not a classifier over class ids, and its training logits cover the current "
                    f"task only; run avalanche:{kind} (the plugin on a classifier over CLIP features)"
                )

    # ------------------------------------------------------------------ hooks for subclasses
    def setup_task(self, task: int, classes: list[int]) -> None:
        """Prepare the model for training on ``classes`` (task index ``task``, 0-based)."""

    def select_training_data(self, dataset):
        """The part of the task's training data ``dataset`` (under the train augmentation) that
        trains, chosen before the task's loader and ``setup_task`` (e.g. images held out to set a
        threshold); ``self.adapted_dataset`` is what it returns. By default all of ``dataset``."""
        return dataset

    def compute_logits(self, images: torch.Tensor) -> Any:
        """Training output, by default logits ``[B, len(self.current_classes)]`` (any object: it only
        goes to ``compute_loss``)."""
        raise NotImplementedError

    def compute_loss(self, output: Any, local_targets: torch.Tensor) -> torch.Tensor:
        """Training loss from ``compute_logits``'s output; ``local_targets`` index
        ``self.current_classes``."""
        return F.cross_entropy(output, local_targets)

    def finish_task(self, task: int, classes: list[int]) -> None:
        """Work after a task's training (second stages, caches)."""

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, len(self.seen_classes)]`` over all seen classes, columns in that order."""
        raise NotImplementedError

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """Hook: the scores of ``dataset`` (``[N, n_seen]``, fp32 on CPU), for ``evaluate_dataset``,
        which opens the pass and always gives a ``cache_key``. Override it to keep per-image work of
        frozen branches under that key (``frozen_features``); by default, ``score_batches``."""
        return self.score_batches(dataset)

    def training_class_logits(self, output: Any) -> torch.Tensor:
        """What Avalanche's plugins and metrics see as a training step's ``mb_output``: logits
        ``[B, n_classes]`` over global class ids, from ``compute_logits``'s ``output``. By default
        ``output`` (or ``output.logits``) is over ``self.current_classes``; the other columns are
        ``-inf``, so the argmax is the predicted class id. Override it for another layout; an output
        it cannot read is passed on as it is, with one warning (training is not affected)."""
        logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
        if logits is None and isinstance(output, dict):
            logits = output.get("logits")
        if isinstance(logits, torch.Tensor) and logits.shape[-1] == len(self.current_classes):
            return self.by_class_id(logits, self.current_classes)
        if not self._warned_output_layout:
            self._warned_output_layout = True
            warnings.warn(
                f"{self.name or type(self).__name__}: compute_logits's output is not logits over the "
                "current classes, so Avalanche's training metrics and plugins get it as it is; override "
                "training_class_logits to lay it out by class id",
                RuntimeWarning,
                stacklevel=2,
            )
        return output

    def by_class_id(self, logits: torch.Tensor, columns: list[int]) -> torch.Tensor:
        """``logits`` whose columns are the classes ``columns``, as ``[B, n_classes]`` with ``-inf``
        for every other class id (no graph: what plugins and metrics read)."""
        key = (tuple(columns), logits.device)
        if key not in self._column_index:  # once per class list, not a host-to-device copy per step
            self._column_index[key] = torch.tensor(columns, dtype=torch.long, device=logits.device)
        out = torch.full(
            (logits.shape[0], len(self.class_names)), float("-inf"), dtype=torch.float32, device=logits.device
        )
        out[:, self._column_index[key]] = logits.detach().float()
        return out

    def stage_diagnostics(self, scores, targets, task_of_class) -> dict:
        """Strategy-specific numbers stored with each stage (``stages[i].diagnostics``)."""
        return {}

    def run_diagnostics(self) -> dict:
        """Strategy-specific numbers stored once per run (``diagnostics``)."""
        return {}

    # ------------------------------------------------------------------ CLIP helpers
    def local_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Class ids ``targets`` as indices into ``self.current_classes`` (-1 for other classes), on
        the strategy's device: the targets of ``compute_loss``, for a training pass of one's own."""
        return self._local_index[targets.to(self.device, non_blocking=True)]

    def add_adapter(self, name: str, tower: Tower, init_a: str = "kaiming") -> None:
        """Add a LoRA adapter with the configured rank and alpha (``init_a``: see ``add_lora``), and
        remember it for checkpoints (which restore its weights, so the init is not stored)."""
        self.backbone.add_lora(
            name, tower=tower, rank=self.cfg.lora_rank, alpha=self.cfg.lora_alpha, init_a=init_a
        )
        self.adapters[name] = {"tower": tower, "rank": self.cfg.lora_rank, "alpha": self.cfg.lora_alpha}

    # ------------------------------------------------------------------ the runner's interface
    @property
    def resumable(self) -> bool:
        """Whether its checkpoint holds all it learned: not with a plugin that keeps state of its own
        across tasks (``strategies.contract.plugins_survive_resume``)."""
        return plugins_survive_resume(self.plugins)

    def learn(self, experience) -> None:
        """Train on one experience of a class-incremental stream."""
        self.train(experience, eval_streams=[])

    # tf32 is a setting of torch's, not an autocast: it must hold through the backward passes and
    # second stages too, so it spans Avalanche's whole ``train`` and ``eval`` (evaluate_dataset too).
    def train(self, *args, **kwargs):
        with matmul_precision(self.settings.precision, self.device):
            return super().train(*args, **kwargs)

    def eval(self, *args, **kwargs):
        with matmul_precision(self.settings.precision, self.device):
            return super().eval(*args, **kwargs)

    @property
    def train_iterations(self) -> int:
        """Training steps taken over the stream so far (the runner's ``cost.train_steps``)."""
        return self.clock.train_iterations

    # ----------------------------------------------------------- state on disk (strategies.checkpointing)
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors (for safetensors) and JSON metadata that restore the strategy after a task
        (keys: ``strategies.checkpointing.strategy_state``)."""
        return strategy_state(self)

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        load_strategy_state(self, tensors, meta)

    def save_model(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Write the learned state as ``PATH.safetensors`` plus ``PATH.json``
        (``strategies.checkpointing.save_model``)."""
        save_model(self, path, extra)

    def load_model(self, path: str | Path) -> None:
        """Restore what ``save_model`` wrote (tensors are read with safetensors, never pickle)."""
        load_model(self, path)

    # ------------------------------------------------------------------ Avalanche plumbing
    def model_adaptation(self, model=None):
        if not self.is_training:  # ``strategy.eval``: evaluate what was learned, change nothing
            return self.backbone.to(self.device)
        if not self.task_classes:
            self._read_class_mapping(self.experience)
        classes = sorted(int(c) for c in self.experience.classes_in_this_experience)
        if classes and not 0 <= min(classes) <= max(classes) < len(self.class_names):
            raise UserError(
                f"{self.name or type(self).__name__}: the experience has class ids {classes[:5]}..., "
                f"but class_names has {len(self.class_names)} names; give one name per class id"
            )
        self.current_classes = classes
        local = torch.full((len(self.class_names),), -1, dtype=torch.long)
        local[classes] = torch.arange(len(classes))
        self._local_index = local.to(self.device)
        self.setup_task(len(self.task_classes), classes)
        return self.backbone.to(self.device)

    def train_dataset_adaptation(self, **kwargs):
        super().train_dataset_adaptation(**kwargs)
        self.adapted_dataset = self.select_training_data(self.adapted_dataset)

    def check_model_and_optimizer(self, **kwargs):
        # Always adapt the model first, then build a fresh optimiser over what is trainable now.
        self.model = self.model_adaptation()
        self.make_optimizer()

    def make_optimizer(self, **kwargs):
        named = self.trainable_parameters()
        params = list(named.values())
        self.optimized_tensors = params if self.train_epochs else []
        if not params or self.train_epochs == 0:
            self.scheduler = None
            return
        self.optimizer = build_optimizer(params, self.cfg)
        self.scheduler = build_scheduler(self.optimizer, self.cfg, self.train_epochs, len(self.dataloader))
        self.optimized_parameters.update({name: p.numel() for name, p in named.items()})

    # The backbone's towers autocast themselves and return fp32 features, so logits and losses
    # are computed in fp32 here, outside autocast.
    def forward(self):
        """In training, ``compute_logits``'s output is kept for ``compute_loss`` (``train_output``),
        and Avalanche's plugins and metrics see it by class id (``training_class_logits``)."""
        if self.is_training:
            self.train_output = self.compute_logits(self.mb_x)
            return self.training_class_logits(self.train_output)
        return self.scores_by_class_id(self.mb_x)

    def criterion(self):
        if self.is_training:
            return self.compute_loss(self.train_output, self._local_index[self.mb_y])
        return F.cross_entropy(self.mb_output, self.mb_y)  # over the seen classes (the rest are -inf)

    def _before_training_epoch(self, **kwargs):
        super()._before_training_epoch(**kwargs)
        self._loss_sum = torch.zeros((), device=self.device)

    def _after_training_iteration(self, **kwargs):
        super()._after_training_iteration(**kwargs)
        self._loss_sum += self.loss.detach().sum()  # read once per epoch: no host sync per step
        self.train_output = None  # the step's graph is not kept until the next step

    def _after_training_epoch(self, **kwargs):
        loss = self.epoch_loss = float(self._loss_sum) / max(1, len(self.dataloader))  # the bar's too
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"{self.name}: training loss became {loss} in epoch {self.clock.train_exp_epochs + 1}"
            )
        if self.scheduler is not None and self.cfg.schedule in ("cosine_epoch", "coda_cosine"):
            self.scheduler.step()
        if self.on_epoch_end(self.clock.train_exp_epochs, loss):
            self.stop_training()  # Avalanche ends training before the next epoch
        super()._after_training_epoch(**kwargs)  # plugins: the progress bar, the watchdog

    def on_epoch_end(self, epoch: int, loss: float) -> bool:
        """Called after every training epoch (``epoch`` 0-based, ``loss`` its mean), before the
        plugins' ``after_training_epoch``: per-epoch work of one's own (statistics of the epoch), and
        return True to stop training the current task now (e.g. a probe that decides the epoch count)."""
        return False

    def _after_training_exp(self, **kwargs):
        task = len(self.task_classes)
        self.task_classes.append(self.current_classes)
        self.seen_classes = self.seen_classes + self.current_classes
        self.backbone.eval()
        self.finish_task(task, self.current_classes)
        super()._after_training_exp(**kwargs)
