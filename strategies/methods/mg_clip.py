"""MG-CLIP, "Mind the Gap" (Huang et al., ICCV 2025): one shared LoRA on both towers trained with
an epoch budget that preserves the modality gap, and a visual cosine classifier that compensates
for it, fused with the text classifier.

Paper row "MG-CLIP" (docs/baselines.md §5; facts from its paper and code, no code reused).

* One LoRA pair on k and v of every block of both towers (A xavier-uniform, B 0), trained on every
  task with CE over the current classes on ``s <v, t_c>``.
* Epoch budget (``epochs = "auto"``): a probe trains on task 1 only, for at most ``probe_epochs``,
  and after each epoch measures the mean non-target logit ``s <v, t_c>`` (c != y) on task 1's
  training images; the budget is the number of epochs that stayed within ``probe_threshold`` of
  the untrained value (at least 1; ``probe_epochs`` if none crossed it). The probe's LoRA is
  thrown away and every task trains that many epochs (``gap_epoch_budget``).
* After each task, the class means of the normalised image features are appended as rows of a
  bias-free cosine classifier W, and only the new rows train (``visual_epochs``, CE over the
  current classes on raw cosines). Old rows never move.

Inference: ``score = (softmax(p_text) + 4 p_vis) / 5`` with ``p_text = softmax(s <v, t_c>)`` and
``p_vis = softmax(<v, w_c / |w_c|>)`` over the seen classes (``fused_scores``; the official eval
loop softmaxes the text probabilities a second time, a method choice kept here). ``scores``
returns the fused probabilities.

RECIPE (CIFAR-100; per-dataset values in the suites):

| hyper-parameter | value | source |
|---|---|---|
| LoRA | k, v of every block, both towers; rank 8, alpha 1, no dropout | code: configs/class/*.yaml |
| LoRA init | A xavier_uniform_, B 0 | code: layers.py _reset_parameters |
| prompt | "a good photo of a {}." | code: configs |
| loss | CE over the current classes | code: main.py intra_cls |
| optimiser / schedule | Adam, wd 0; cosine per epoch, eta_min 0.01 lr | code: main.py |
| lr | 1e-3 CIFAR-100, ImageNet-R; 5e-4 ImageNet-100/1K | code: configs; fallback (1K) |
| batch | 128 CIFAR-100, ImageNet-100/1K; 64 ImageNet-R | code: configs; fallback (1K) |
| epochs | 1 / 2 / 2 / "auto" | code: configs; docs/decisions.md D7 |
| probe | at most 10 epochs, threshold 0.10, cosine T_max 10 | code: epoch.py |
| visual stage | 3 epochs, Adam, cosine per iteration, eta_min 0.01 lr | code: main.py |
| visual lr / batch | 5e-4 / 64 CIFAR; 5e-4 / 32 ImageNet-R; 1e-3 / 128 ImageNet-100/1K | code: configs; fallback |
| fusion | (softmax(p_text) + 4 p_vis) / 5 | code: main.py |
| train augmentation | none (CLIP preprocessing) | code: continual_clip/datasets.py |
| precision | fp32 (`amp = False`; an explicit --precision wins) | code: main.py |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.optim import Optimizer, Schedule, warmup_cosine_factor
from strategies.registry import register

ADAPTERS = ("mg_visual", "mg_text")


# ============================================================================ the equations
def fused_scores(
    image: torch.Tensor,
    text: torch.Tensor,
    classifier: torch.Tensor,
    logit_scale: float,
    text_weight: float = 1.0,
    vision_weight: float = 4.0,
) -> torch.Tensor:
    """``(text_weight softmax(p_text) + vision_weight p_vis) / (text_weight + vision_weight)`` with
    ``p_text = softmax(s <v, t_c>)`` and ``p_vis = softmax(<v, normalise(w_c)>)``."""
    p_text = (logit_scale * image @ text.T).softmax(dim=-1)
    p_vis = (image @ F.normalize(classifier, dim=-1).T).softmax(dim=-1)
    return (text_weight * p_text.softmax(dim=-1) + vision_weight * p_vis) / (text_weight + vision_weight)


def gap_epoch_budget(negatives: list[float], untrained: float, threshold: float, fallback: int) -> int:
    """Epochs to train: the epochs before the first whose mean non-target logit moved more than
    ``threshold`` (relative) from ``untrained``, at least 1; ``fallback`` if none moved that far. The
    move is divided by the signed ``untrained``, as the official probe does: a negative one never
    stops it (docs/baselines.md §5)."""
    for epoch, negative in enumerate(negatives):
        if gap_moved(negative, untrained, threshold):
            return max(1, epoch)
    return fallback


def gap_moved(negative: float, untrained: float, threshold: float) -> bool:
    """The probe's stop rule: the move relative to the signed untrained mean exceeds ``threshold``."""
    return abs(negative - untrained) / untrained > threshold


def mean_non_target_logit(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
    """Sum and count of the logits of non-target classes (for a mean over a dataset)."""
    mask = torch.ones_like(logits, dtype=torch.bool).scatter_(1, targets[:, None], False)
    return float(logits[mask].sum()), int(mask.sum())


# ============================================================================ the strategy
@dataclass
class MGCLIPConfig(StrategyConfig):
    # "auto": the modality-gap probe on task 1 decides. A widened field: the shared code that reads
    # epochs checks it is a number first (with_epoch_scale, with_epoch_cap, gpu_hours)
    epochs: int | Literal["auto"] = 1  # type: ignore[assignment]
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: Optimizer = "adam"
    schedule: Schedule = "cosine_epoch"
    min_lr_ratio: float = 0.01
    lora_rank: int = 8
    lora_alpha: float = 1.0
    prompt_template: str = "a good photo of a {}."
    train_augmentation: TrainAugmentation = "none"
    probe_epochs: int = 10
    probe_threshold: float = 0.10
    visual_epochs: int = 3
    visual_lr: float = 5e-4
    visual_batch_size: int = 64
    training_batch_sizes: ClassVar[tuple[str, ...]] = ("batch_size", "visual_batch_size")
    training_epochs: ClassVar[tuple[str, ...]] = ("epochs", "probe_epochs", "visual_epochs")
    text_weight: float = 1.0
    vision_weight: float = 4.0
    amp: bool = False  # fp32, as the official code


@register("mg_clip")
class MGCLIP(CLIPStrategy[MGCLIPConfig]):
    Config = MGCLIPConfig

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.cfg.epochs == "auto":  # Avalanche wants a number; the probe sets it before task 1 trains
            self.train_epochs = self.cfg.probe_epochs
        self.classifier = torch.empty(0, self.backbone.embed_dim)  # W, rows follow seen_classes
        self.auto_epochs: int | None = None

    # ---------------------------------------------------------------- training
    def setup_task(self, task: int, classes: list[int]) -> None:
        if task == 0:
            self.add_adapter("mg_visual", tower="visual", init_a="xavier")
            self.add_adapter("mg_text", tower="text", init_a="xavier")
        self.backbone.set_adapters(visual="mg_visual", text="mg_text")
        self.backbone.set_trainable(ADAPTERS)
        if self.cfg.epochs == "auto":
            if self.auto_epochs is None:
                self.auto_epochs = self._probe_epoch_budget()
            self.train_epochs = self.auto_epochs

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return self.backbone.logit_scale * image @ self.text_features(self.current_classes).T

    def _probe_epoch_budget(self) -> int:
        """Train a throw-away copy of the LoRA on task 1 and return ``gap_epoch_budget``."""
        initial = {name: self.backbone.lora_state_dict(name) for name in ADAPTERS}
        params = [p for name in ADAPTERS for p in self.backbone.lora_parameters(name)]
        optimizer = torch.optim.Adam(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        total = self.cfg.probe_epochs
        untrained, negatives = self._mean_non_target_logit(), []
        loader = self.data_loader(
            self.adapted_dataset.train(),
            batch_size=self.cfg.batch_size,
            shuffle=True,
            passes=total,
            purpose="probe",
            training=True,
        )
        for epoch in range(total):
            for group in optimizer.param_groups:
                group["lr"] = self.cfg.lr * warmup_cosine_factor(epoch, total, 0, self.cfg.min_lr_ratio)
            for images, targets, *_ in loader:
                logits = self.compute_logits(images.to(self.device, non_blocking=True))
                loss = F.cross_entropy(logits, self.local_targets(targets))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            negatives.append(self._mean_non_target_logit())
            if gap_moved(negatives[-1], untrained, self.cfg.probe_threshold):
                break
        for name, state in initial.items():
            self.backbone.load_lora_state_dict(name, state)
        self.probe_negatives = [untrained, *negatives]
        return gap_epoch_budget(negatives, untrained, self.cfg.probe_threshold, total)

    @torch.no_grad()
    def _mean_non_target_logit(self) -> float:
        total, count = 0.0, 0
        text = self.text_features(self.current_classes)
        for images, targets, *_ in self.data_loader(self.adapted_dataset.eval()):
            image = self.backbone.encode_image(images.to(self.device, non_blocking=True))
            s, n = mean_non_target_logit(
                self.backbone.logit_scale * image @ text.T, self.local_targets(targets)
            )
            total, count = total + s, count + n
        return total / count

    # ---------------------------------------------------------------- the visual classifier
    def finish_task(self, task: int, classes: list[int]) -> None:
        features, labels = self.encode_dataset(self.adapted_dataset.eval(), "mg_visual")
        means = torch.stack([features[labels == c].mean(dim=0) for c in classes])
        self.classifier = torch.cat([self.classifier, self._train_new_rows(means)])

    def _train_new_rows(self, init: torch.Tensor) -> torch.Tensor:
        """The visual stage: only the new rows train, CE over the current classes on raw cosines,
        Adam with a cosine per iteration."""
        rows = torch.nn.Parameter(init.to(self.device))
        self.train_on_frozen_features(
            [rows],
            lambda image, targets: F.cross_entropy(image @ F.normalize(rows, dim=-1).T, targets),
            epochs=self.cfg.visual_epochs,
            lr=self.cfg.visual_lr,
            batch_size=self.cfg.visual_batch_size,
            purpose="visual-classifier",
            lr_factor=lambda step, total: warmup_cosine_factor(step, total, 0, self.cfg.min_lr_ratio),
        )
        return rows.detach().cpu()

    # ---------------------------------------------------------------- inference
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return fused_scores(
            image,
            self.text_features(self.seen_classes),
            self.classifier.to(image),
            self.backbone.logit_scale,
            self.cfg.text_weight,
            self.cfg.vision_weight,
        )

    def run_diagnostics(self) -> dict:
        return {"auto_epochs": self.auto_epochs}

    # ---------------------------------------------------------------- counts and checkpoints
    def trainable_parameter_count(self) -> int:
        """The shared LoRA of both towers and the visual classifier's rows."""
        return self.lora_parameter_count() + self.classifier.numel()

    checkpoint_attributes = ("classifier",)  # W, rows in seen_classes order: ``state/classifier``

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = super().checkpoint_state()
        meta["mg_clip"] = {"auto_epochs": self.auto_epochs}
        return tensors, meta

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        self.auto_epochs = meta["mg_clip"]["auto_epochs"]
        if self.adapters:
            self.backbone.set_adapters(visual="mg_visual", text="mg_text")
