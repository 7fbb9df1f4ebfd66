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
* ``on_epoch_end(epoch, loss)``: return True to stop the task's training after this epoch.

The runner computes every metric from ``scores``, the same way for every strategy. Avalanche's
own ``strategy.eval`` sees the same scores, one column per class id (``scores_by_class_id``), so
its accuracy metrics equal the runner's. The base class
owns the optimiser (AdamW with a per-iteration cosine schedule), the precision (the backbone's
towers run under autocast and return fp32 features, so scores and losses are fp32; fp16 scales
the loss), the data loaders (workers, pinned memory, draws seeded per sample), the progress bar, LoRA bookkeeping, and
checkpoint state (safetensors tensors + JSON metadata, the loss scaler included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from benchmarks.backbone import CLIPBackbone, PreparedPrompts
from benchmarks.core.errors import UserError
from benchmarks.data.loaders import seeded_loader
from benchmarks.core.precision import loss_scaler, resolve_precision
from benchmarks.data.prompts import PROMPT_ENSEMBLES, templates
from benchmarks.data.transforms import TRAIN_AUGMENTATIONS


OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("cosine_iter", "cosine_epoch", "coda_cosine")


def coda_cosine_factor(epoch: int, epochs: int) -> float:
    """The CODA-Prompt codebase's per-epoch factor: cos(99 pi e / (200 (K - 1))), e = 0..K-1, from 1
    down to about 0.016 at the last epoch (1 throughout for K = 1)."""
    return 1.0 if epochs <= 1 else math.cos(99 * math.pi * epoch / (200 * (epochs - 1)))


def warmup_cosine_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Learning-rate factor at ``step`` (0-based) of ``total``: linear warm-up over ``warmup`` steps
    ((step + 1) / warmup), then a cosine from 1 down to ``min_ratio`` at step ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


StateValue = torch.Tensor | list | dict | torch.nn.Module | None

LOADER_KWARGS = ("num_workers", "persistent_workers", "pin_memory", "collate_fn", "multiprocessing_context")


def _loader_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The loader options among the keyword arguments of ``strategy.train`` / ``eval`` (Avalanche
    passes every one of them on; ``pin_memory=None`` means its default, off)."""
    return {k: v for k, v in kwargs.items() if k in LOADER_KWARGS and v is not None}


def pack_state(value: StateValue) -> tuple[str, dict[str, torch.Tensor]]:
    """A strategy attribute as ``(kind, {key suffix: CPU tensor})`` for a checkpoint.

    A tensor is saved under "" (key ``state/<name>``), a list under "/<i>", a dict of tensors
    under "/<key>", a module under "/<state_dict key>"; None saves nothing. ``unpack_state``
    inverts it.
    """
    if value is None:
        return "none", {}
    if isinstance(value, torch.Tensor):
        return "tensor", {"": value.detach().cpu().contiguous()}
    if isinstance(value, torch.nn.Module):
        return "module", {f"/{k}": v.detach().cpu().contiguous() for k, v in value.state_dict().items()}
    if isinstance(value, (list, tuple)):
        return "list", {f"/{i}": v.detach().cpu().contiguous() for i, v in enumerate(value)}
    if isinstance(value, dict):
        return "dict", {f"/{k}": v.detach().cpu().contiguous() for k, v in value.items()}
    raise TypeError(f"cannot checkpoint a {type(value).__name__}; use tensors, lists or dicts of them, or a module")


def unpack_state(kind: str, packed: dict[str, torch.Tensor], current: StateValue = None) -> StateValue:
    """The value ``pack_state`` saved. A module is loaded into ``current`` (the strategy re-creates
    its modules before loading, e.g. in ``__init__``) and returned."""
    if kind == "none":
        return None
    if kind == "tensor":
        return packed[""]
    items = {k[1:]: v for k, v in packed.items()}
    if kind == "list":
        return [items[str(i)] for i in range(len(items))]
    if kind == "dict":
        return items
    if kind == "module":
        if not isinstance(current, torch.nn.Module):
            raise ValueError("a checkpointed module needs the strategy to re-create it before loading")
        current.load_state_dict(items)
        return current
    raise ValueError(f"unknown checkpoint state kind {kind!r}")


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
    prompt_ensemble: str = ""  # "" (prompt_template alone), "cifar" (18) or "imagenet" (80 templates)
    num_workers: int = 0
    # The method's own train augmentation (benchmarks.data.transforms.TRAIN_AUGMENTATIONS); a suite's
    # tables override it, the most specific first (benchmarks.runner.suites).
    train_augmentation: str = "paper"
    # Optimiser and schedule (read by the base ``make_optimizer``; BASELINES.md section 2.3).
    optimizer: str = "adamw"  # "adamw" | "adam" | "sgd"
    momentum: float = 0.0  # SGD only
    schedule: str = "cosine_iter"  # cosine stepped per "iteration" or per "epoch"
    warmup_steps: int = 0  # linear warm-up, in the schedule's unit (iterations or epochs)
    warmup_fraction: float = 0.0  # or as a fraction of all scheduled steps of the task
    min_lr_ratio: float = 0.0  # the cosine ends at min_lr_ratio * lr
    grad_clip: float = 0.0  # max gradient norm (0: off)
    # Mixed precision under --precision auto: False keeps the method fp32 on CUDA too (its official
    # precision); an explicit --precision fp16 or bf16 still wins.
    amp: bool = True
    #: the fewest epochs a task may train (0 only for a strategy that never trains)
    min_epochs: ClassVar[int] = 1

    def __post_init__(self):
        choices = {"optimizer": OPTIMIZERS, "schedule": SCHEDULES, "train_augmentation": TRAIN_AUGMENTATIONS,
                   "prompt_ensemble": PROMPT_ENSEMBLES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise UserError(f"option {name}={getattr(self, name)!r} is not one of {list(valid)}")
        if self.warmup_steps < 0 or not 0.0 <= self.warmup_fraction < 1.0 or (self.warmup_steps and self.warmup_fraction):
            raise UserError("give warmup_steps >= 0 or warmup_fraction in [0, 1), not both")
        if not 0.0 <= self.min_lr_ratio <= 1.0 or self.grad_clip < 0:
            raise UserError("min_lr_ratio must be in [0, 1] and grad_clip >= 0")
        # Numbers that torch would reject mid-run, or that would quietly train nothing.
        at_least = {"batch_size": 1, "eval_batch_size": 1, "lora_rank": 1, "num_workers": 0,
                    "weight_decay": 0, "momentum": 0, "epochs": self.min_epochs}
        for name, low in at_least.items():
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < low:
                hint = " (a strategy that trains nothing is continual_clip)" if name == "epochs" else ""
                raise UserError(f"option {name} = {value!r} must be at least {low}{hint}")
        if not self.lr > 0:
            raise UserError(f"option lr = {self.lr!r} must be positive")

    @classmethod
    def from_dict(cls, values: dict[str, Any], strategy: str = "") -> "StrategyConfig":
        """Build a config from suite values; unknown keys are a user error that lists valid ones."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise UserError(f"unknown option(s) {unknown} for strategy {strategy or cls.__name__}; "
                            f"valid options: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            if not _has_type(value, hints[name]):
                raise UserError(f"option {name} = {value!r} of strategy {strategy or cls.__name__} must be "
                                f"{_type_name(hints[name])}, not {type(value).__name__}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CLIPStrategy(SupervisedTemplate):
    """Base class of every strategy in the suite. See the module docstring for the hooks."""

    #: registry name, set by ``strategies.registry.register``
    name: ClassVar[str] = ""
    #: the strategy's config dataclass
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig
    #: attributes holding learned state besides LoRA adapters, saved in every checkpoint
    #: (``pack_state``): tensors, lists or dicts of tensors, modules, or None
    checkpoint_attributes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, backbone: CLIPBackbone, class_names: list[str], config: StrategyConfig,
                 device: str | torch.device = "cpu", precision: str = "auto", show_progress: bool = True,
                 seed: int | None = None, **avalanche_kwargs):
        """``precision``: fp32, fp16 (autocast and a loss scaler) or bf16; "auto" is fp16 on CUDA and
        fp32 elsewhere, or fp32 everywhere for a config with ``amp = False``. ``seed``: the run seed
        that every loader's shuffle and augmentation draws derive from (``benchmarks.data.loaders``); by
        default torch's initial seed, so ``torch.manual_seed(s)`` before building the strategy sets
        it. ``avalanche_kwargs`` (``plugins``, ``evaluator``, ...) go to ``SupervisedTemplate``."""
        device = torch.device(device)
        self.seed = int(torch.initial_seed() if seed is None else seed)
        self.backbone = backbone.to(device)
        self.precision = resolve_precision(precision, device, config.amp)
        self.backbone.set_precision(self.precision)
        self.cfg = config
        self.class_names = list(class_names)
        self.show_progress = show_progress
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
        self._frozen_features: dict[tuple[str, str | None], torch.Tensor] = {}  # (cache_key, adapter) -> features
        self.eval_branch_forwards = 0  # images that frozen_features pushed through a visual branch
        # Avalanche wants an optimiser up front; the real one is built per task in make_optimizer.
        idle = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        if "evaluator" not in avalanche_kwargs:
            with warnings.catch_warnings():  # metrics come from the runner, not Avalanche's loggers
                warnings.filterwarnings("ignore", message="No loggers specified")
                avalanche_kwargs["evaluator"] = EvaluationPlugin(loggers=[])
        super().__init__(model=self.backbone, optimizer=idle, train_mb_size=config.batch_size,
                         train_epochs=config.epochs, eval_mb_size=config.eval_batch_size,
                         device=device, **avalanche_kwargs)

    # ------------------------------------------------------------------ hooks for subclasses
    def setup_task(self, task: int, classes: list[int]) -> None:
        """Prepare the model for training on ``classes`` (task index ``task``, 0-based)."""

    def compute_logits(self, images: torch.Tensor) -> Any:
        """Training output, by default logits ``[B, len(self.current_classes)]`` (any object: it only
        goes to ``compute_loss``)."""
        raise NotImplementedError

    def compute_loss(self, logits: Any, local_targets: torch.Tensor) -> torch.Tensor:
        """Training loss from ``compute_logits``'s output; ``local_targets`` index ``self.current_classes``."""
        return F.cross_entropy(logits, local_targets)

    def finish_task(self, task: int, classes: list[int]) -> None:
        """Work after a task's training (second stages, caches)."""

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, len(self.seen_classes)]`` over all seen classes, columns in that order."""
        raise NotImplementedError

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
        so a training step that re-encodes them never reads token values on the device. Inside ``fixed_text`` the features
        themselves are computed once per class list and text adapter.
        """
        key = tuple(class_ids)
        memo_key = (key, self.backbone.active_adapters["text"])
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
    def _encode_dataset(self, dataset, adapter: str | None, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Image features (CPU, L2-normalised unless ``normalize=False``) and labels of every item of
        ``dataset``, under visual adapter ``adapter``, which stays active; the text adapter is kept."""
        self.backbone.set_adapters(visual=adapter, text=self.backbone.active_adapters["text"])
        features, labels = [], []
        for images, targets, *_ in self.data_loader(dataset):
            features.append(self.backbone.encode_image(images, normalize=normalize).cpu())
            labels.append(targets)
        return torch.cat(features), torch.cat(labels)

    def frozen_features(self, dataset, cache_key: str, adapter: str | None) -> torch.Tensor:
        """Image features (CPU, normalised) of ``dataset`` under a visual branch that never changes
        again (``adapter``; None: the frozen tower), encoded once per ``cache_key`` (``score_dataset``)."""
        key = (cache_key, adapter)
        if key not in self._frozen_features:
            self._frozen_features[key] = self._encode_dataset(dataset, adapter)[0]
            self.eval_branch_forwards += len(dataset)
        return self._frozen_features[key]

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
        self.backbone.add_lora(name, tower=tower, rank=self.cfg.lora_rank, alpha=self.cfg.lora_alpha, init_a=init_a)
        self.adapters[name] = {"tower": tower, "rank": self.cfg.lora_rank, "alpha": self.cfg.lora_alpha}

    def trainable_parameter_count(self) -> int:
        """Parameters learned over the whole stream (each adapter counted once)."""
        return sum(p.numel() for name in self.adapters for p in self.backbone.lora_parameters(name))

    # ------------------------------------------------------------------ the runner's interface
    def learn(self, experience) -> None:
        """Train on one experience of a class-incremental stream."""
        self.train(experience, eval_streams=[])

    def loader_options(self) -> dict[str, Any]:
        """DataLoader options from the config: workers (kept alive across epochs), pinned memory on CUDA."""
        workers = self.cfg.num_workers
        return {"num_workers": workers, "persistent_workers": workers > 0, "pin_memory": self.device.type == "cuda"}

    def loader_key(self, purpose: str) -> tuple[int, int, str]:
        """What a loader's draws derive from: (run seed, task index, purpose)."""
        return self.seed, len(self.task_classes), purpose

    def data_loader(self, dataset, batch_size: int | None = None, shuffle: bool = False,
                    passes: int = 1, purpose: str = "eval") -> DataLoader:
        """A loader over ``dataset`` with ``loader_options``, for the strategy's own passes
        (evaluation, prototypes, second stages); with several ``passes`` its workers stay alive.

        Its shuffle and every augmentation draw depend only on (run seed, task, ``purpose``, pass,
        sample index), never on the worker count (``benchmarks.data.loaders``): give each loader that
        augments or shuffles a purpose of its own, so its draws differ from other loaders'.
        """
        options = self.loader_options()
        options["persistent_workers"] = options["persistent_workers"] and passes > 1
        return seeded_loader(dataset, self.loader_key(purpose), batch_size or self.cfg.eval_batch_size,
                             shuffle=shuffle, **options)

    @torch.no_grad()
    def score_dataset(self, dataset, cache_key: str | None = None) -> torch.Tensor:
        """Scores of every sample of ``dataset`` over the seen classes, ``[N, n_seen]`` fp32 on CPU.

        The runner passes the same ``dataset`` with the same ``cache_key`` at every stage, so a
        strategy may keep per-image work that cannot change (e.g. features of frozen branches).
        Text features are computed once for the whole pass (``fixed_text``).
        """
        self.backbone.eval()
        out = []
        with self.fixed_text():
            batches = tqdm(self.data_loader(dataset), desc="eval", leave=False, disable=not self.show_progress)
            for images, *_ in batches:
                out.append(self.scores(images.to(self.device, non_blocking=True)).float().cpu())
        return torch.cat(out)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors (for safetensors) and JSON metadata that restore the strategy after a task.

        Keys: ``lora/<adapter>/<key>`` for every LoRA adapter, and ``state/<name>...`` for each
        attribute in ``checkpoint_attributes`` (``pack_state``).
        """
        tensors = {f"lora/{name}/{key}": value.detach().cpu().contiguous()
                   for name in self.adapters for key, value in self.backbone.lora_state_dict(name).items()}
        kinds = {}
        for name in self.checkpoint_attributes:
            kinds[name], packed = pack_state(getattr(self, name))
            tensors.update({f"state/{name}{key}": value for key, value in packed.items()})
        meta = {"seen_classes": self.seen_classes, "task_classes": self.task_classes,
                "adapters": self.adapters, "loss_scaler": self.scaler.state_dict(),
                "skipped_steps": self.skipped_steps, "state_kinds": kinds}
        return tensors, meta

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.seen_classes = list(meta["seen_classes"])
        self.task_classes = [list(c) for c in meta["task_classes"]]
        if meta.get("loss_scaler") and self.scaler.is_enabled():  # {} when saved without fp16
            self.scaler.load_state_dict(meta["loss_scaler"])
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        for name, spec in meta["adapters"].items():
            if name not in self.adapters:
                self.backbone.add_lora(name, tower=spec["tower"], rank=spec["rank"], alpha=spec["alpha"])
                self.adapters[name] = dict(spec)
            prefix = f"lora/{name}/"
            state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            self.backbone.load_lora_state_dict(name, state)
        for name, kind in meta.get("state_kinds", {}).items():
            prefix = f"state/{name}"
            packed = {k[len(prefix):]: v for k, v in tensors.items() if k == prefix or k.startswith(prefix + "/")}
            current = getattr(self, name, None)
            restored = unpack_state(kind, packed, current)
            if restored is not current:  # a module is loaded in place
                setattr(self, name, restored)

    def save_model(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Write the learned state as ``PATH.safetensors`` plus ``PATH.json`` (metadata); PATH is
        taken as a name stem, so ``run.model`` gives ``run.model.safetensors`` and ``run.model.json``.

        The tensor keys are documented by ``checkpoint_state``; they can be read without this
        suite via ``safetensors.safe_open``. Both files are written atomically.
        """
        from benchmarks.core.atomic_io import write_json, write_tensors

        path = Path(path)
        tensors, meta = self.checkpoint_state()
        write_tensors(path.with_name(path.name + ".safetensors"), tensors)
        write_json(path.with_name(path.name + ".json"), {"strategy": self.name, "config": self.cfg.to_dict(),
                                               "class_names": self.class_names, "state": meta, **(extra or {})})

    def load_model(self, path: str | Path) -> None:
        """Restore what ``save_model`` wrote (tensors are read with safetensors, never pickle)."""
        from safetensors.torch import load_file

        from benchmarks.core.atomic_io import read_json

        path = Path(path)
        meta = read_json(path.with_name(path.name + ".json"))
        self.load_checkpoint_state(load_file(str(path.with_name(path.name + ".safetensors"))), meta["state"])

    # ------------------------------------------------------------------ Avalanche plumbing
    def model_adaptation(self, model=None):
        if not self.is_training:  # ``strategy.eval``: evaluate what was learned, change nothing
            return self.backbone.to(self.device)
        classes = sorted(int(c) for c in self.experience.classes_in_this_experience)
        self.current_classes = classes
        local = torch.full((len(self.class_names),), -1, dtype=torch.long)
        local[classes] = torch.arange(len(classes))
        self._local_index = local.to(self.device)
        self.setup_task(len(self.task_classes), classes)
        return self.backbone.to(self.device)

    def check_model_and_optimizer(self, **kwargs):
        # Always adapt the model first, then build a fresh optimiser over what is trainable now.
        self.model = self.model_adaptation()
        self.make_optimizer()

    # Avalanche's defaults are 0 workers; the config's workers apply unless the caller says otherwise.
    # Both loaders are seeded ones (``data_loader``), so Avalanche's own ``train`` and ``eval`` give
    # the same numbers whatever the worker count.
    def make_train_dataloader(self, shuffle: bool = True, drop_last: bool = False, **kwargs):
        options = {**self.loader_options(), **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(self.adapted_dataset, self.loader_key("train"), self.train_mb_size,
                                        shuffle=shuffle, drop_last=drop_last, **options)

    def make_eval_dataloader(self, shuffle: bool = False, **kwargs):
        options = {**self.loader_options(), "persistent_workers": False, **_loader_kwargs(kwargs)}
        self.dataloader = seeded_loader(self.adapted_dataset, self.loader_key("avalanche-eval"), self.eval_mb_size,
                                        shuffle=shuffle, **options)

    def make_optimizer(self, **kwargs):
        params = [p for p in self.backbone.parameters() if p.requires_grad]
        params += [p for p in self.extra_trainable_parameters() if p.requires_grad]
        if not params or self.train_epochs == 0:
            self.scheduler = None
            return
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        else:
            kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
            self.optimizer = kind(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        total = max(1, self.train_epochs * (len(self.dataloader) if cfg.schedule == "cosine_iter" else 1))
        warmup = cfg.warmup_steps or round(cfg.warmup_fraction * total)
        if cfg.schedule == "coda_cosine":  # per epoch, no warm-up, its own end point
            epochs = self.train_epochs
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                               lambda epoch: coda_cosine_factor(epoch, epochs))
        elif not warmup:  # the closed form below agrees; this keeps earlier runs' numbers to the last bit
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=total,
                                                                        eta_min=cfg.min_lr_ratio * cfg.lr)
        else:
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: warmup_cosine_factor(step, total, warmup, cfg.min_lr_ratio))
        self._optimized = params

    def extra_trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors outside the backbone (heads, prompts); empty by default."""
        return []

    # The backbone's towers autocast themselves and return fp32 features, so logits and losses
    # are computed in fp32 here, outside autocast.
    def forward(self):
        if self.is_training:
            return self.compute_logits(self.mb_x)
        return self.scores_by_class_id(self.mb_x)

    def criterion(self):
        if self.is_training:
            return self.compute_loss(self.mb_output, self._local_index[self.mb_y])
        return F.cross_entropy(self.mb_output, self.mb_y)  # over the seen classes (the rest are -inf)

    def scores_by_class_id(self, images: torch.Tensor) -> torch.Tensor:
        """``scores`` laid out for Avalanche's evaluation: ``[B, n_classes]``, column ``c`` is class
        ``c`` and classes not seen yet are ``-inf``, so ``argmax`` is the predicted class id and
        Avalanche's accuracy equals the runner's (top-1 over all seen classes, no task id)."""
        seen = self.scores(images).float()
        out = torch.full((seen.shape[0], len(self.class_names)), float("-inf"), device=seen.device)
        out[:, self.seen_classes] = seen
        return out

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
            scale = self.scaler.get_scale()  # scaler.step already waited for the gradients
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale
            self.skipped_steps += not stepped
        if stepped and self.scheduler is not None and self.cfg.schedule == "cosine_iter":
            self.scheduler.step()  # the schedule follows the steps taken

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        total = self.train_epochs * len(self.dataloader)
        task = len(self.task_classes) + 1
        self._progress = tqdm(total=total, desc=f"{self.name} task {task}", leave=False,
                              disable=not self.show_progress or total == 0)

    def _before_training_epoch(self, **kwargs):
        super()._before_training_epoch(**kwargs)
        self._epoch_loss = torch.zeros((), device=self.device)

    def _after_training_iteration(self, **kwargs):
        super()._after_training_iteration(**kwargs)
        self._epoch_loss += self.loss.detach().sum()  # read once per epoch: no host sync per step
        self._progress.update()

    def _after_training_epoch(self, **kwargs):
        loss = float(self._epoch_loss) / max(1, len(self.dataloader))
        if not math.isfinite(loss):
            raise FloatingPointError(f"{self.name}: training loss became {loss} in epoch {self.clock.train_exp_epochs + 1}")
        self._progress.set_postfix(loss=f"{loss:.3f}")
        if self.scheduler is not None and self.cfg.schedule in ("cosine_epoch", "coda_cosine"):
            self.scheduler.step()
        if self.on_epoch_end(self.clock.train_exp_epochs, loss):
            self.stop_training()  # Avalanche ends training before the next epoch
        super()._after_training_epoch(**kwargs)

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
