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
* ``on_epoch_end(epoch, loss)``: return True to stop the task's training after this epoch;
* ``stage_diagnostics``, ``run_diagnostics``: strategy-specific numbers stored with the result.

Two class attributes complete them: ``Config`` (the options) and ``checkpoint_attributes`` (learned
state besides LoRA adapters). Every ``nn.Parameter`` a strategy holds with ``requires_grad`` (as an
attribute, in a module, list or dict) is optimised, and counted in ``trainable_parameter_count``;
``docs/adding-a-strategy.md`` has the table, which ``tests/strategies/test_strategy_interface.py``
checks against this class.

The runner computes every metric from ``scores``, the same way for every strategy. Avalanche's
own ``strategy.eval`` sees the same scores, one column per class id (``scores_by_class_id``), so
its accuracy metrics equal the runner's. The base class owns the precision (the backbone's towers
run under autocast and return fp32 features, so scores and losses are fp32; fp16 scales the
loss), the data loaders (workers, pinned memory, draws seeded per sample, pixels a ``DeviceTransform``
left pending finished on the device), the progress bar and
LoRA bookkeeping. Next to it: the options (``strategies.config``), the optimiser and its schedule
(``strategies.optim``; AdamW with a per-iteration cosine by default) and the state on disk
(``strategies.checkpointing``: safetensors tensors and JSON metadata, the loss scaler included).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from avalanche.training.plugins import EvaluationPlugin, LwFPlugin, ReplayPlugin
from avalanche.training.templates import SupervisedTemplate
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from benchmarks.backbone import CLIPBackbone, PreparedPrompts
from benchmarks.core.errors import UserError
from benchmarks.core.precision import loss_scaler, resolve_precision
from benchmarks.data.device_augment import DevicePending, finish_batch
from benchmarks.data.loaders import DeviceBatches, seeded_loader
from benchmarks.data.prompts import templates
from strategies.checkpointing import (
    load_model,
    load_strategy_state,
    save_model,
    strategy_state,
)
from strategies.config import StrategyConfig
from strategies.contract import plugins_survive_resume
from strategies.optim import build_optimizer, build_scheduler

LOADER_KWARGS = ("num_workers", "persistent_workers", "pin_memory", "collate_fn", "multiprocessing_context")


def _loader_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The loader options among the keyword arguments of ``strategy.train`` / ``eval`` (Avalanche
    passes every one of them on; ``pin_memory=None`` means its default, off)."""
    return {k: v for k, v in kwargs.items() if k in LOADER_KWARGS and v is not None}


class CLIPStrategy(SupervisedTemplate):
    """Base class of every strategy in the suite. See the module docstring for the hooks."""

    #: registry name, set by ``strategies.registry.register``
    name: ClassVar[str] = ""
    #: the strategy's config dataclass
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig
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

    def __init__(
        self,
        *,
        backbone: CLIPBackbone,
        class_names: list[str],
        config: StrategyConfig,
        device: str | torch.device = "cpu",
        precision: str = "auto",
        show_progress: bool = True,
        seed: int | None = None,
        max_train_batches: int | None = None,
        augment_on: str = "device",
        **avalanche_kwargs,
    ):
        """``precision``: fp32, fp16 (autocast and a loss scaler) or bf16; "auto" is fp16 on CUDA and
        fp32 elsewhere, or fp32 everywhere for a config with ``amp = False``. ``seed``: the run seed
        that every loader's shuffle and augmentation draws derive from (``benchmarks.data.loaders``); by
        default torch's initial seed, so ``torch.manual_seed(s)`` before building the strategy sets
        it. ``max_train_batches``: every training pass (a task's epochs, a second stage's passes) ends
        after that many batches (a fast dev run). ``augment_on``: where the augmentation of images the
        strategy transforms itself runs, "device" or "pil" (``benchmarks.data.device_augment``; the
        stream's own come from the runner). ``avalanche_kwargs`` (``plugins``, ``evaluator``,
        ...) go to ``SupervisedTemplate``."""
        device = torch.device(device)
        self.seed = int(torch.initial_seed() if seed is None else seed)
        self.backbone = backbone.to(device)
        self.precision = resolve_precision(precision, device, config.amp)
        self.backbone.set_precision(self.precision)
        self.cfg = config
        self.class_names = list(class_names)
        self.show_progress = show_progress
        self.max_train_batches = max_train_batches
        self.augment_on = augment_on
        self.templates = templates(config.prompt_ensemble, config.prompt_template)
        # row c * len(templates) + m is class c under template m
        self.prompt_tokens = backbone.tokenize([t.format(n) for n in class_names for t in self.templates])
        self.seen_classes: list[int] = []
        self.task_classes: list[list[int]] = []
        self.current_classes: list[int] = []
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> {tower, rank, alpha}
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.scaler = loss_scaler(self.precision, device)
        self.skipped_steps = 0  # fp16 steps the loss scaler skipped (inf/nan gradients), whole stream
        self._progress: tqdm | None = None
        self._prepared_prompts: dict[tuple[int, ...], PreparedPrompts] = {}
        self._fixed_text: dict[tuple, torch.Tensor] | None = None
        self._device_copies: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (tensor, its copy)
        self._frozen_features: dict[
            tuple[str, str | None], torch.Tensor
        ] = {}  # (cache_key, adapter) -> features
        self.eval_branch_forwards = 0  # images that frozen_features pushed through a visual branch
        self._optimized: list[torch.Tensor] = []  # what the current task's optimiser holds
        # name -> size of every tensor optimised in the stream so far (trainable_parameter_count)
        self.optimized_parameters: dict[str, int] = {}
        self._epoch_start: list[torch.Tensor] | None = None  # copies to tell whether an epoch moved anything
        self._warned_still_tasks: set[int] = set()
        self._warned_output_layout = False
        self._column_index: dict[tuple, torch.Tensor] = {}  # by_class_id: (columns, device) -> index
        # Avalanche wants an optimiser up front; the real one is built per task in make_optimizer.
        idle = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        if "evaluator" not in avalanche_kwargs:
            with warnings.catch_warnings():  # metrics come from the runner, not Avalanche's loggers
                warnings.filterwarnings("ignore", message="No loggers specified")
                avalanche_kwargs["evaluator"] = EvaluationPlugin(loggers=[])
        super().__init__(
            model=self.backbone,
            optimizer=idle,
            train_mb_size=config.batch_size,
            train_epochs=config.epochs,
            eval_mb_size=config.eval_batch_size,
            device=device,
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
        out = torch.full((logits.shape[0], len(self.class_names)), float("-inf"), device=logits.device)
        out[:, self._column_index[key]] = logits.detach().float()
        return out

    def stage_diagnostics(self, scores, targets, task_of_class) -> dict:
        """Strategy-specific numbers stored with each stage (``stages[i].diagnostics``)."""
        return {}

    def run_diagnostics(self) -> dict:
        """Strategy-specific numbers stored once per run (``diagnostics``)."""
        return {}

    # ------------------------------------------------------------------ CLIP helpers
    def text_features(self, class_ids: list[int]) -> torch.Tensor:
        """Normalised fp32 text features of the classes' prompts under the active text adapter.

        The prompts are prepared (trimmed, in length buckets where that pays) once per class list,
        so a training step that re-encodes them never reads token values on the device. Inside
        ``fixed_text`` the features themselves are computed once per class list and text adapter.
        """
        key = tuple(class_ids)
        context = self.backbone.active_text_context
        memo_key = (
            key,
            self.backbone.active_adapters["text"],
            None if context is None else id(context.embeddings),
        )
        if self._fixed_text is not None and memo_key in self._fixed_text:
            return self._fixed_text[memo_key]
        features = self.template_features(class_ids)
        if features.dim() == 3:  # an ensemble: the renormalised mean of the per-template features
            features = F.normalize(features.mean(dim=1), dim=-1)
        if self._fixed_text is not None:
            self._fixed_text[memo_key] = features
        return features

    def template_features(self, class_ids: list[int]) -> torch.Tensor:
        """Normalised fp32 features of every template of the classes: ``[C, M, d]`` for an ensemble
        of M templates, ``[C, d]`` for a single template."""
        key = tuple(class_ids)
        if key not in self._prepared_prompts:
            m = len(self.templates)
            rows = [c * m + t for c in key for t in range(m)]
            self._prepared_prompts[key] = self.backbone.prepare_prompts(self.prompt_tokens[rows])
        features = self.backbone.encode_text(self._prepared_prompts[key], normalize=True)
        return features if len(self.templates) == 1 else features.view(len(key), len(self.templates), -1)

    @contextlib.contextmanager
    def fixed_text(self) -> Iterator[None]:
        """A stretch (evaluation) in which the text tower does not change: ``text_features`` is
        computed once per class list and text adapter, not once per batch. Use it without grad."""
        outer = self._fixed_text
        self._fixed_text = {} if outer is None else outer
        try:
            yield
        finally:
            self._fixed_text = outer

    @torch.no_grad()
    def encode_dataset(
        self, dataset, adapter: str | None, normalize: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image features (CPU, L2-normalised unless ``normalize=False``) and labels of every item of
        ``dataset`` (e.g. ``self.adapted_dataset.eval()``: the task's training images under the eval
        transform), under visual adapter ``adapter`` (None: the frozen tower), which stays active;
        the text adapter is kept."""
        self.backbone.set_adapters(visual=adapter, text=self.backbone.active_adapters["text"])
        features, labels = [], []
        for images, targets, *_ in self.data_loader(dataset):
            features.append(self.backbone.encode_image(images, normalize=normalize).cpu())
            labels.append(targets)
        return torch.cat(features), torch.cat(labels)

    def _encode_dataset(self, dataset, adapter: str | None, normalize: bool = True):
        """Deprecated name of ``encode_dataset`` (kept for one release)."""
        warnings.warn(
            "CLIPStrategy._encode_dataset is deprecated; call encode_dataset",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.encode_dataset(dataset, adapter, normalize)

    def local_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Class ids ``targets`` as indices into ``self.current_classes`` (-1 for other classes), on
        the strategy's device: the targets of ``compute_loss``, for a training pass of one's own."""
        return self._local_index[targets.to(self.device, non_blocking=True)]

    def frozen_features(self, dataset, cache_key: str, adapter: str | None) -> torch.Tensor:
        """Image features (CPU, normalised) of ``dataset`` under a visual branch that never changes
        again (``adapter``; None: the frozen tower), encoded once per ``cache_key`` (``score_dataset``)."""
        key = (cache_key, adapter)
        if key not in self._frozen_features:
            self._frozen_features[key] = self.encode_dataset(dataset, adapter)[0]
            self.eval_branch_forwards += len(dataset)
        return self._frozen_features[key]

    def cached_features(self, cache_key: str, adapter: str | None) -> torch.Tensor | None:
        """What ``frozen_features`` keeps for (``cache_key``, ``adapter``), or None if nothing yet."""
        return self._frozen_features.get((cache_key, adapter))

    def device_copy(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the strategy's device, copied once per new tensor under ``name`` rather than
        once per training step (e.g. anchors that change only between tasks)."""
        cached = self._device_copies.get(name)
        if cached is None or cached[0] is not tensor:
            cached = self._device_copies[name] = (tensor, tensor.to(self.device))
        return cached[1]

    def add_adapter(self, name: str, tower: str, init_a: str = "kaiming") -> None:
        """Add a LoRA adapter with the configured rank and alpha (``init_a``: see ``add_lora``), and
        remember it for checkpoints (which restore its weights, so the init is not stored)."""
        self.backbone.add_lora(
            name, tower=tower, rank=self.cfg.lora_rank, alpha=self.cfg.lora_alpha, init_a=init_a
        )
        self.adapters[name] = {"tower": tower, "rank": self.cfg.lora_rank, "alpha": self.cfg.lora_alpha}

    def lora_parameter_count(self) -> int:
        """The parameters of every LoRA adapter, each counted once (for a strategy that counts its
        learned state its own way in ``trainable_parameter_count``)."""
        return sum(p.numel() for name in self.adapters for p in self.backbone.lora_parameters(name))

    def trainable_parameter_count(self) -> int:
        """Parameters learned over the whole stream: every tensor an optimiser of the base held in
        any task, counted once (``optimized_parameters``), and every LoRA adapter."""
        counted = dict(self.optimized_parameters)
        if self.adapters:  # an adapter restored from a checkpoint was trained before it
            names = {id(p): f"backbone.{path}" for path, p in self.backbone.named_parameters()}
            for adapter in self.adapters:
                for p in self.backbone.lora_parameters(adapter):
                    counted.setdefault(names[id(p)], p.numel())
        return sum(counted.values())

    # ------------------------------------------------------------------ the runner's interface
    @property
    def resumable(self) -> bool:
        """Whether its checkpoint holds all it learned: not with a plugin that keeps state of its own
        across tasks (``strategies.contract.plugins_survive_resume``)."""
        return plugins_survive_resume(self.plugins)

    def learn(self, experience) -> None:
        """Train on one experience of a class-incremental stream."""
        self.train(experience, eval_streams=[])

    @property
    def train_iterations(self) -> int:
        """Training steps taken over the stream so far (the runner's ``cost.train_steps``)."""
        return self.clock.train_iterations

    def _unpack_minibatch(self):
        # A loader that is not the base's (a plugin's, e.g. replay) hands over pending pixels.
        if self.mbatch is not None and isinstance(self.mbatch[0], DevicePending):
            self.mbatch = [finish_batch(self.mbatch[0], self.device), *self.mbatch[1:]]
        super()._unpack_minibatch()

    def loader_options(self) -> dict[str, Any]:
        """DataLoader options from the config: workers (kept alive across epochs), pinned memory on CUDA."""
        workers = self.cfg.num_workers
        return {
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "pin_memory": self.device.type == "cuda",
        }

    def loader_key(self, purpose: str) -> tuple[int, int, str]:
        """What a loader's draws derive from: (run seed, task index, purpose)."""
        return self.seed, len(self.task_classes), purpose

    def data_loader(
        self,
        dataset,
        batch_size: int | None = None,
        shuffle: bool = False,
        passes: int = 1,
        purpose: str = "eval",
    ) -> DataLoader | DeviceBatches:
        """A loader over ``dataset`` with ``loader_options``, for the strategy's own passes
        (evaluation, prototypes, second stages); with several ``passes`` its workers stay alive.

        Its shuffle and every augmentation draw depend only on (run seed, task, ``purpose``, pass,
        sample index), never on the worker count (``benchmarks.data.loaders``): give each loader that
        augments or shuffles a purpose of its own, so its draws differ from other loaders'.
        """
        options = self.loader_options()
        options["persistent_workers"] = options["persistent_workers"] and passes > 1
        return seeded_loader(
            dataset,
            self.loader_key(purpose),
            batch_size or self.cfg.eval_batch_size,
            shuffle=shuffle,
            max_batches=self.max_train_batches if shuffle else None,  # a shuffled pass is a training pass
            device=self.device,
            **options,
        )

    def train_on_frozen_features(
        self,
        parameters: list[torch.nn.Parameter],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        purpose: str,
        lr_factor: Callable[[int, int], float] | None = None,
    ) -> None:
        """A second stage after a task (a head, a classifier): Adam trains ``parameters`` alone for
        ``epochs`` passes over the task's training data (train augmentation, loader ``purpose``) on
        ``loss(image features, local targets)``, the features those of the active visual branch,
        computed without a graph. ``lr_factor(step, total steps)``, if given, scales ``lr`` per step."""
        optimizer = torch.optim.Adam(parameters, lr=lr)
        loader = self.data_loader(
            self.adapted_dataset.train(), batch_size=batch_size, shuffle=True, passes=epochs, purpose=purpose
        )
        total, step = epochs * len(loader), 0
        for _ in range(epochs):
            for images, targets, *_ in loader:
                if lr_factor is not None:
                    for group in optimizer.param_groups:
                        group["lr"] = lr * lr_factor(step, total)
                with torch.no_grad():
                    image = self.backbone.encode_image(images)
                value = loss(image, self.local_targets(targets))
                optimizer.zero_grad()
                value.backward()
                optimizer.step()
                step += 1

    @torch.no_grad()
    def evaluate_dataset(self, dataset, cache_key: str | None = None) -> torch.Tensor:
        """Scores of every sample of ``dataset`` over the seen classes, ``[N, n_seen]`` fp32 on CPU:
        the entry of every evaluation, and the opening every ``score_dataset`` shares.

        The backbone is in eval mode, nothing records gradients, and text features are computed
        once for the whole pass (``fixed_text``). With a ``cache_key`` (the runner passes the same
        ``dataset`` with the same key at every stage) the strategy's ``score_dataset`` may reuse
        per-image work that cannot change; without one, the scores come batch by batch.
        """
        self.backbone.eval()
        with self.fixed_text():
            if cache_key is None:
                return self.score_batches(dataset)
            return self.score_dataset(dataset, cache_key)

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """Hook: the scores of ``dataset`` (``[N, n_seen]``, fp32 on CPU), for ``evaluate_dataset``,
        which opens the pass and always gives a ``cache_key``. Override it to keep per-image work of
        frozen branches under that key (``frozen_features``); by default, ``score_batches``."""
        return self.score_batches(dataset)

    def score_batches(self, dataset) -> torch.Tensor:
        """``scores`` of every batch of ``dataset`` (eval transform), concatenated on the CPU."""
        out = []
        batches = tqdm(self.data_loader(dataset), desc="eval", leave=False, disable=not self.show_progress)
        for images, *_ in batches:
            out.append(self.scores(images.to(self.device, non_blocking=True)).float().cpu())
        return torch.cat(out)

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

    def _read_class_mapping(self, experience) -> None:
        """A benchmark that relabels its classes (``nc_benchmark(...,
        class_ids_from_zero_from_first_exp=True)``) is read through its ``class_mapping``:
        ``class_names`` name the dataset's own ids, so each name moves to its class's new id and every
        prompt still names its class."""
        benchmark = getattr(getattr(experience, "origin_stream", None), "benchmark", None)
        mapping = getattr(benchmark, "class_mapping", None)
        if not mapping or all(new in (-1, old) for old, new in enumerate(mapping)):
            return
        if len(mapping) != len(self.class_names):
            raise UserError(
                f"the benchmark relabels {len(mapping)} classes but class_names has {len(self.class_names)}; "
                "build it without class_ids_from_zero_from_first_exp, or give one name per original class"
            )
        names = list(self.class_names)
        for old, new in enumerate(mapping):
            if new >= 0:
                names[new] = self.class_names[old]
        warnings.warn(
            "the benchmark relabels its classes (class_mapping): class_names are read as the dataset's "
            "own ids and moved to the benchmark's",
            stacklevel=2,
        )
        self.class_names = names
        self.prompt_tokens = self.backbone.tokenize([t.format(n) for n in names for t in self.templates])
        self._prepared_prompts.clear()

    def check_model_and_optimizer(self, **kwargs):
        # Always adapt the model first, then build a fresh optimiser over what is trainable now.
        self.model = self.model_adaptation()
        self.make_optimizer()

    # Avalanche's defaults are 0 workers; the config's workers apply unless the caller says otherwise.
    # Both loaders are seeded ones (``data_loader``), so Avalanche's own ``train`` and ``eval`` give
    # the same numbers whatever the worker count.
    def make_train_dataloader(self, shuffle: bool = True, drop_last: bool = False, **kwargs):
        options = {**self.loader_options(), **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(
            self.adapted_dataset,
            self.loader_key("train"),
            self.train_mb_size,
            shuffle=shuffle,
            drop_last=drop_last,
            max_batches=self.max_train_batches,
            device=self.device,
            **options,
        )

    def make_eval_dataloader(self, shuffle: bool = False, **kwargs):
        options = {**self.loader_options(), "persistent_workers": False, **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(
            self.adapted_dataset,
            self.loader_key("avalanche-eval"),
            self.eval_mb_size,
            shuffle=shuffle,
            device=self.device,
            **options,
        )

    def make_optimizer(self, **kwargs):
        named = self.trainable_parameters()
        params = list(named.values())
        self._optimized = params if self.train_epochs else []
        if not params or self.train_epochs == 0:
            self.scheduler = None
            return
        self.optimizer = build_optimizer(params, self.cfg)
        self.scheduler = build_scheduler(self.optimizer, self.cfg, self.train_epochs, len(self.dataloader))
        self.optimized_parameters.update({name: p.numel() for name, p in named.items()})

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """What the task's optimiser holds, by name: the backbone's parameters with ``requires_grad``,
        ``extra_trainable_parameters``, then every other ``nn.Parameter`` with ``requires_grad`` that
        the strategy holds (an attribute, or in a module, list, tuple or dict attribute)."""
        named: dict[str, torch.Tensor] = {}
        seen: set[int] = set()

        def add(name: str, p: torch.Tensor) -> None:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                named[name] = p

        for name, p in self.backbone.named_parameters():
            add(f"backbone.{name}", p)
        for i, p in enumerate(self.extra_trainable_parameters()):
            add(f"extra_trainable_parameters.{i}", p)
        for name, p in _held_parameters(self):
            add(name, p)
        return named

    def extra_trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors the attribute scan of ``trainable_parameters`` does not find (e.g. held
        by a closure); empty by default. Parameters held as attributes need no entry here."""
        return []

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

    def scores_by_class_id(self, images: torch.Tensor) -> torch.Tensor:
        """``scores`` laid out for Avalanche's evaluation: ``[B, n_classes]``, column ``c`` is class
        ``c`` and classes not seen yet are ``-inf``, so ``argmax`` is the predicted class id and
        Avalanche's accuracy equals the runner's (top-1 over all seen classes, no task id)."""
        return self.by_class_id(self.scores(images), self.seen_classes)

    def _before_eval(self, **kwargs):
        super()._before_eval(**kwargs)
        self._eval_text = self.fixed_text()  # the text tower does not change during ``eval``
        self._eval_text.__enter__()

    def _after_eval(self, **kwargs):
        self._eval_text.__exit__(None, None, None)
        super()._after_eval(**kwargs)

    def backward(self):
        self.scaler.scale(self.loss).backward()

    def optimizer_step(self):
        if self.cfg.grad_clip > 0:  # on the true gradients: unscale fp16 ones first
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self._optimized, self.cfg.grad_clip)
        if not self.scaler.is_enabled():
            self.optimizer.step()
            stepped = True
        else:  # fp16: the scaler skips a step with inf/nan gradients and lowers its scale
            # Whether it stepped, without reading the scale (get_scale waits for the device: once
            # before the step, and once more after it for the optimiser's kernels): the scaler calls
            # optimizer.step() exactly when it takes the step (build_optimizer's are not fused).
            taken: list[bool] = []
            hook = self.optimizer.register_step_post_hook(lambda *_: taken.append(True))
            try:
                self.scaler.step(self.optimizer)  # its inf/nan check: the step's one wait for the device
            finally:
                hook.remove()
            self.scaler.update()
            stepped = bool(taken)
            self.skipped_steps += not stepped
        if stepped and self.scheduler is not None and self.cfg.schedule == "cosine_iter":
            self.scheduler.step()  # the schedule follows the steps taken

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        total = self.train_epochs * len(self.dataloader)
        task = len(self.task_classes) + 1
        self._progress = tqdm(
            total=total,
            desc=f"{self.name} task {task}",
            leave=False,
            disable=not self.show_progress or total == 0,
        )

    def _before_training_epoch(self, **kwargs):
        super()._before_training_epoch(**kwargs)
        self._epoch_loss = torch.zeros((), device=self.device)
        task = len(self.task_classes)
        if task not in self._warned_still_tasks:  # until an epoch is seen that changes nothing
            self._epoch_start = [p.detach().clone() for p in self._optimized]

    def _after_training_iteration(self, **kwargs):
        super()._after_training_iteration(**kwargs)
        self._epoch_loss += self.loss.detach().sum()  # read once per epoch: no host sync per step
        self.train_output = None  # the step's graph is not kept until the next step
        self._progress.update()

    def _after_training_epoch(self, **kwargs):
        loss = float(self._epoch_loss) / max(1, len(self.dataloader))
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"{self.name}: training loss became {loss} in epoch {self.clock.train_exp_epochs + 1}"
            )
        self._progress.set_postfix(loss=f"{loss:.3f}")
        self._warn_if_nothing_moved()
        if self.scheduler is not None and self.cfg.schedule in ("cosine_epoch", "coda_cosine"):
            self.scheduler.step()
        if self.on_epoch_end(self.clock.train_exp_epochs, loss):
            self.stop_training()  # Avalanche ends training before the next epoch
        super()._after_training_epoch(**kwargs)

    def _warn_if_nothing_moved(self) -> None:
        """Warn once per task when an epoch left every optimised tensor as it was (a strategy whose
        parameters never reach the optimiser, or a loss that does not depend on them)."""
        before, self._epoch_start = self._epoch_start, None
        if before is None or len(self.dataloader) == 0:
            return
        if any(not torch.equal(old, p.detach()) for old, p in zip(before, self._optimized, strict=True)):
            return
        task = len(self.task_classes)
        self._warned_still_tasks.add(task)
        held = f"{len(before)} optimised tensor(s)" if before else "no tensor with requires_grad"
        warnings.warn(
            f"{self.name or type(self).__name__} task {task + 1}: an epoch of training changed nothing "
            f"({held}); make what should learn an nn.Parameter with requires_grad held by the strategy, "
            "or set train_epochs = 0 for a task that learns nothing",
            RuntimeWarning,
            stacklevel=2,
        )

    def on_epoch_end(self, epoch: int, loss: float) -> bool:
        """Called after every training epoch (``epoch`` 0-based, ``loss`` its mean); return True to
        stop training the current task now (e.g. a probe that decides the epoch count)."""
        return False

    def _after_training_exp(self, **kwargs):
        self._progress.close()
        task = len(self.task_classes)
        self.task_classes.append(self.current_classes)
        self.seen_classes = self.seen_classes + self.current_classes
        self.backbone.eval()
        self.finish_task(task, self.current_classes)
        super()._after_training_exp(**kwargs)


_BOOKKEEPING = ("_optimized", "_epoch_start")  # the base's own references to what it optimises


def _held_parameters(strategy: CLIPStrategy) -> Iterator[tuple[str, torch.Tensor]]:
    """Every ``nn.Parameter`` the strategy holds outside its backbone, with a name: attributes, the
    parameters of module attributes, and parameters or modules in list, tuple or dict attributes
    (one level). Plain tensors are left out: a tensor with ``requires_grad`` may be a step's own
    leaf (e.g. a chunked backward's), not something to learn."""
    for attr, value in vars(strategy).items():
        if value is strategy.backbone or value is strategy.model or attr in _BOOKKEEPING:
            continue
        items = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, (list, tuple))
            else [(None, value)]
        )
        for key, item in items:
            name = attr if key is None else f"{attr}.{key}"
            if isinstance(item, torch.nn.Parameter):
                yield name, item
            elif isinstance(item, torch.nn.Module) and item is not strategy.backbone:
                for sub, p in item.named_parameters():
                    yield f"{name}.{sub}", p
