"""The common base of CLIP strategies: Avalanche's ``SupervisedTemplate`` plus a CLIP text classifier.

A strategy is a subclass that overrides a few named hooks (as in Avalanche):

* ``setup_task(task, classes)``: before training on a task (add adapters, choose what trains);
* ``compute_logits(images)``: the training logits over the current task's classes;
* ``compute_loss(logits, local_targets)``: the training loss (cross-entropy by default);
* ``finish_task(task, classes)``: after the task's training (prototypes, caches, second stages);
* ``scores(images)``: scores over **all seen classes** for a batch of test images (no task id).

The runner computes every metric from ``scores``, the same way for every strategy. The base class
owns the optimiser (AdamW with a per-iteration cosine schedule), mixed precision on CUDA, the
progress bar, LoRA bookkeeping, and checkpoint state (safetensors tensors + JSON metadata).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from benchmarks.backbones import CLIPBackbone, autocast_context
from benchmarks.errors import UserError


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
    num_workers: int = 0

    @classmethod
    def from_dict(cls, values: dict[str, Any], strategy: str = "") -> "StrategyConfig":
        """Build a config from suite values; unknown keys are a user error that lists valid ones."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise UserError(f"unknown option(s) {unknown} for strategy {strategy or cls.__name__}; "
                            f"valid options: {sorted(fields)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CLIPStrategy(SupervisedTemplate):
    """Base class of every strategy in the suite. See the module docstring for the hooks."""

    #: registry name, set by ``strategies.registry.register``
    name: ClassVar[str] = ""
    #: the strategy's config dataclass
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig

    def __init__(self, *, backbone: CLIPBackbone, class_names: list[str], config: StrategyConfig,
                 device: str | torch.device = "cpu", show_progress: bool = True):
        self.backbone = backbone.to(device)
        self.cfg = config
        self.class_names = list(class_names)
        self.show_progress = show_progress
        self.prompt_tokens = backbone.tokenize([config.prompt_template.format(n) for n in class_names])
        self.seen_classes: list[int] = []
        self.task_classes: list[list[int]] = []
        self.current_classes: list[int] = []
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> {tower, rank, alpha}
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._progress: tqdm | None = None
        device = torch.device(device)
        self.use_amp = device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.use_amp)
        # Avalanche wants an optimiser up front; the real one is built per task in make_optimizer.
        idle = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        with warnings.catch_warnings():  # metrics come from the runner, not Avalanche's loggers
            warnings.filterwarnings("ignore", message="No loggers specified")
            evaluator = EvaluationPlugin(loggers=[])
        super().__init__(model=self.backbone, optimizer=idle, train_mb_size=config.batch_size,
                         train_epochs=config.epochs, eval_mb_size=config.eval_batch_size,
                         device=device, evaluator=evaluator)

    # ------------------------------------------------------------------ hooks for subclasses
    def setup_task(self, task: int, classes: list[int]) -> None:
        """Prepare the model for training on ``classes`` (task index ``task``, 0-based)."""

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        """Training logits ``[B, len(self.current_classes)]``."""
        raise NotImplementedError

    def compute_loss(self, logits: torch.Tensor, local_targets: torch.Tensor) -> torch.Tensor:
        """Training loss; ``local_targets`` index ``self.current_classes``."""
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
        """Normalised text features of the classes' prompts under the active text adapter."""
        tokens = self.prompt_tokens[class_ids].to(self.device)
        return self.backbone.encode_text(tokens, normalize=True)

    def add_adapter(self, name: str, tower: str) -> None:
        """Add a LoRA adapter with the configured rank and alpha, and remember it for checkpoints."""
        self.backbone.add_lora(name, tower=tower, rank=self.cfg.lora_rank, alpha=self.cfg.lora_alpha)
        self.adapters[name] = {"tower": tower, "rank": self.cfg.lora_rank, "alpha": self.cfg.lora_alpha}

    def trainable_parameter_count(self) -> int:
        """Parameters learned over the whole stream (each adapter counted once)."""
        return sum(p.numel() for name in self.adapters for p in self.backbone.lora_parameters(name))

    # ------------------------------------------------------------------ the runner's interface
    def learn(self, experience) -> None:
        """Train on one experience of a class-incremental stream."""
        self.train(experience, eval_streams=[])

    @torch.no_grad()
    def score_dataset(self, dataset, cache_key: str | None = None) -> torch.Tensor:
        """Scores of every sample of ``dataset`` over the seen classes, ``[N, n_seen]`` on CPU.

        The runner passes the same ``dataset`` with the same ``cache_key`` at every stage, so a
        strategy may keep per-image work that cannot change (e.g. features of frozen branches).
        """
        self.backbone.eval()
        loader = DataLoader(dataset, batch_size=self.cfg.eval_batch_size, shuffle=False,
                            num_workers=self.cfg.num_workers)
        out = []
        for images, *_ in tqdm(loader, desc="eval", leave=False, disable=not self.show_progress):
            with autocast_context(self.device):
                out.append(self.scores(images.to(self.device)).float().cpu())
        return torch.cat(out)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors (for safetensors) and JSON metadata that restore the strategy after a task."""
        tensors = {f"lora/{name}/{key}": value.detach().cpu().contiguous()
                   for name in self.adapters for key, value in self.backbone.lora_state_dict(name).items()}
        meta = {"seen_classes": self.seen_classes, "task_classes": self.task_classes,
                "adapters": self.adapters}
        return tensors, meta

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.seen_classes = list(meta["seen_classes"])
        self.task_classes = [list(c) for c in meta["task_classes"]]
        for name, spec in meta["adapters"].items():
            if name not in self.adapters:
                self.backbone.add_lora(name, tower=spec["tower"], rank=spec["rank"], alpha=spec["alpha"])
                self.adapters[name] = dict(spec)
            prefix = f"lora/{name}/"
            state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            self.backbone.load_lora_state_dict(name, state)

    def save_model(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Write the learned state as ``PATH.safetensors`` plus ``PATH.json`` (metadata); PATH is
        taken as a name stem, so ``run.model`` gives ``run.model.safetensors`` and ``run.model.json``.

        The tensor keys are documented by ``checkpoint_state``; they can be read without this
        suite via ``safetensors.safe_open``. Both files are written atomically.
        """
        from safetensors.torch import save_file

        from benchmarks.results import write_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors, meta = self.checkpoint_state()
        tmp = path.with_name(f".{path.name}.safetensors.tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path.with_name(path.name + ".safetensors"))
        write_json(path.with_name(path.name + ".json"), {"strategy": self.name, "config": self.cfg.to_dict(),
                                               "class_names": self.class_names, "state": meta, **(extra or {})})

    def load_model(self, path: str | Path) -> None:
        """Restore what ``save_model`` wrote (tensors are read with safetensors, never pickle)."""
        from safetensors.torch import load_file

        from benchmarks.results import read_json

        path = Path(path)
        meta = read_json(path.with_name(path.name + ".json"))
        self.load_checkpoint_state(load_file(str(path.with_name(path.name + ".safetensors"))), meta["state"])

    # ------------------------------------------------------------------ Avalanche plumbing
    def model_adaptation(self, model=None):
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

    def make_optimizer(self, **kwargs):
        params = [p for p in self.backbone.parameters() if p.requires_grad]
        params += [p for p in self.extra_trainable_parameters() if p.requires_grad]
        if not params or self.train_epochs == 0:
            self.scheduler = None
            return
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        total = max(1, self.train_epochs * len(self.dataloader))
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=total)

    def extra_trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors outside the backbone (heads, prompts); empty by default."""
        return []

    def forward(self):
        with autocast_context(self.device):
            return self.compute_logits(self.mb_x)

    def criterion(self):
        local_targets = self._local_index[self.mb_y]
        with autocast_context(self.device):
            return self.compute_loss(self.mb_output, local_targets)

    def backward(self):
        self.scaler.scale(self.loss).backward()

    def optimizer_step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        total = self.train_epochs * len(self.dataloader)
        task = len(self.task_classes) + 1
        self._progress = tqdm(total=total, desc=f"{self.name} task {task}", leave=False,
                              disable=not self.show_progress or total == 0)

    def _after_training_iteration(self, **kwargs):
        super()._after_training_iteration(**kwargs)
        loss = float(self.loss.detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"{self.name}: training loss became {loss}")
        self._progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
        self._progress.update()

    def _after_training_exp(self, **kwargs):
        self._progress.close()
        task = len(self.task_classes)
        self.task_classes.append(self.current_classes)
        self.seen_classes = self.seen_classes + self.current_classes
        self.backbone.eval()
        self.finish_task(task, self.current_classes)
        super()._after_training_exp(**kwargs)
