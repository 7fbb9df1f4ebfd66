"""CLAP4CLIP (Jha et al., NeurIPS 2024): probabilistic fine-tuning of CLIP's class text features
with a visual-guided attention (VGA) and one distribution encoder per task, replay-free
(docs/decisions.md D5).
Paper row "CLAP" (docs/baselines.md §13; facts from the paper and its code, no code reused).

* Frozen towers. t_c: the renormalised mean of class c's template features (the dataset's ensemble).
* VGA: one ``nn.TransformerDecoderLayer``; queries are the text features of the seen classes, each
  class attending only to the classes of its own task; the memory is the image's normalised
  feature (``vga_context = "image"``) or the whole batch's (``"batch"``, the official quirk, D4) at
  evaluation; in training the whole batch's, as the official code (``train_vga_context = "batch"``:
  D4's reason, a score that depends on the evaluation batch, concerns evaluation only).
  adapted_c = t_c + VGA_c.
* Task i's encoder: mu_i = Linear(d, d), sigma_i = softplus(Linear(d, d)) * 0.999 + 0.001, on
  adapted_c of its classes; its weights start language-aware, W_mu = E^T E / d and W_sigma =
  V^T V / d over every class seen so far, the task's included (E: each class's mean of its
  normalised template features, not renormalised; V: their unbiased per-class variance over the
  templates; d the embedding width; ``language_aware_init``). After its task an encoder never
  changes.
* logit_c = s <v, t_c + VGA_c + z_c>, z_c ~ N(mu_c, sigma_c), R samples; v the normalised frozen
  image feature, the sum not renormalised. ``scores``: the mean over the R samples.
* Loss at task t, on the R x B logits over all seen classes, global targets: CE + ``kl_weight`` *
  KL(q_t || N(0, I)) (the current encoder; mean over images and classes, sum over dimensions) +
  ``lasp_weight`` * LASP: S = the mean over samples and templates of F_k z^T, a C x C matrix of raw
  dot products between the current classes' template features and their sampled z (no logit
  scale, no normalisation); LASP = CE(S, 0..C-1), once per step (``lasp_loss``).

Deviations: evaluation draws the R noise vectors once per stage (seeded by the stage), shared by
every image, so a score does not depend on the evaluation batch or order (the official code draws
per batch, one draw shared by the batch's images: ``eval_noise = "batch"``, D4); trainable parameters stay fp32 under autocast (official: cast to CLIP's fp16). Left
out, as in the published command: distillation, the NP prior, expandable tokens, the
orthogonality loss; and replay (D5).

RECIPE (CIFAR-100 10 tasks):

| hyper-parameter | value | source |
|---|---|---|
| text features | template ensemble: CIFAR 18; ImageNet-R, ImageNet 80 | code: dataset/*.py templates |
| VGA | decoder layer, d 512, 1 head, FF 2048, GELU, post-norm, dropout 0.1; context the batch in training, per image at evaluation | code: continual_clip_variational.py; D4 |
| encoders | per task, mu and sigma Linear(512, 512), sigma = softplus * 0.999 + 0.001; language-aware init | code: continual_clip_variational.py |
| samples R | 20 | code: `--forward-times 20` |
| loss | CE over the seen classes + 0.001 KL + 15 LASP | code: README command |
| optimiser | SGD, momentum 0, wd 0, lr = 1e-3 x batch / 20 (1.6e-3 at batch 32; `lr = 0` applies the rule) | code: main_incremental_submit.py |
| schedule | linear warm-up over 30 % of the steps, cosine to lr x 1e-3, per iteration | code: classifier/utils.py |
| batch / epochs | 32 / 5 | code: README, defaults |
| train augmentation | flip | code: dataset/incremental_dataloader.py |
| precision | trainables fp32 under autocast (official: cast to CLIP's fp16) | decision |
| replay | none | D5 |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.core.errors import UserError
from benchmarks.data.prompts import PromptEnsemble
from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.optim import Optimizer, Schedule
from strategies.registry import register
from strategies.training.evaluation import cat_on_host


@dataclass
class CLAPConfig(StrategyConfig):
    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.0  # 0: the official rule, 1e-3 x batch_size / 20 (1.6e-3 at batch 32)
    weight_decay: float = 0.0
    optimizer: Optimizer = "sgd"
    momentum: float = 0.0
    schedule: Schedule = "cosine_iter"
    warmup_fraction: float = 0.3
    min_lr_ratio: float = 1e-3
    train_augmentation: TrainAugmentation = "flip"
    prompt_ensemble: PromptEnsemble = "cifar"
    samples: int = 20
    kl_weight: float = 0.001
    lasp_weight: float = 15.0
    vga_context: Literal["image", "batch"] = "image"  # at evaluation; or "batch" (the official quirk)
    train_vga_context: Literal["image", "batch"] = "batch"  # the official context in training (D4)
    eval_noise: Literal["stage", "batch"] = "stage"  # or "batch": fresh draws per batch (official)
    vga_heads: int = 1
    vga_feedforward: int = 2048
    vga_dropout: float = 0.1

    def __post_init__(self):
        if self.lr == 0.0:
            self.lr = 1e-3 * self.batch_size / 20
        super().__post_init__()
        if self.samples < 1:
            raise UserError(f"clap option samples={self.samples} must be at least 1")


class DistributionEncoder(nn.Module):
    """mu = Linear(d, d)(x), sigma = softplus(Linear(d, d)(x)) * 0.999 + 0.001."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mu = nn.Linear(dim, dim)
        self.sigma = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu(x), F.softplus(self.sigma(x)) * 0.999 + 0.001


def language_aware_init(template_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_mu, W_sigma) = (E^T E / d, V^T V / d) from the normalised template features ``[C, M, d]``
    of every class seen so far: E the mean over templates of each class (not renormalised), V the
    unbiased variance over templates (zero for a single template), d the embedding width."""
    dim = template_features.shape[-1]
    mean = template_features.mean(dim=1)
    variance = (
        template_features.var(dim=1, unbiased=True)
        if template_features.shape[1] > 1
        else torch.zeros_like(mean)
    )
    return mean.T @ mean / dim, variance.T @ variance / dim


def lasp_loss(templates: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """LASP: CE(S, 0..C-1) with S = mean over samples r and templates k of F_k z_r^T, raw dot
    products. ``templates``: ``[C, M, d]``, the current classes' normalised template features;
    ``z``: ``[..., C, d]``, their sampled residuals (the mean runs over every leading dimension:
    the R samples, and the images when the VGA context is per image)."""
    similarity = templates.mean(dim=1) @ z.reshape(-1, *z.shape[-2:]).mean(dim=0).T  # linear in both means
    return F.cross_entropy(similarity, torch.arange(len(templates), device=z.device))


def task_mask(task_sizes: list[int], device) -> torch.Tensor:
    """``[C, C]`` boolean attention mask, True = blocked: a class attends to its own task's classes only."""
    task = torch.repeat_interleave(
        torch.arange(len(task_sizes), device=device), torch.tensor(task_sizes, device=device)
    )
    return task.unsqueeze(1) != task.unsqueeze(0)


def kl_to_standard_normal(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, sigma^2) || N(0, I)), summed over the last dimension, averaged over the rest."""
    return (0.5 * (sigma.pow(2) + mu.pow(2) - 1.0) - sigma.log()).sum(-1).mean()


@dataclass
class CLAPOutput:
    logits: torch.Tensor  # [R * B, C_seen + C_current]
    kl: torch.Tensor
    lasp: torch.Tensor


@register("clap")
class CLAP(CLIPStrategy[CLAPConfig]):
    Config = CLAPConfig
    checkpoint_attributes = ("vga", "encoders")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cfg, dim = self.cfg, self.backbone.embed_dim
        self.vga = nn.TransformerDecoderLayer(
            dim,
            cfg.vga_heads,
            cfg.vga_feedforward,
            cfg.vga_dropout,
            activation="gelu",
            batch_first=True,
            norm_first=False,
        ).to(self.device)
        self.encoders = nn.ModuleList()
        self._eval_noise: dict[int, torch.Tensor] = {}
        self._templates: dict[int, torch.Tensor] = {}  # class -> [M, d]; the text tower never changes
        # what depends only on a class list (stacked templates, t_c, the VGA mask), made once per
        # list instead of once per step; emptied at every task (``class_list_constant``)
        self._class_list_constants: dict[tuple, torch.Tensor] = {}

    # ---------------------------------------------------------------- the model
    def class_list_constant(
        self, kind: str, values: list[int], make: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """``make()``, computed once per (``kind``, ``values``) until the next task: the text tower
        never changes, so what a class list determines is the same at every step of a task."""
        key = (kind, tuple(values))
        if key not in self._class_list_constants:
            self._class_list_constants[key] = make()
        return self._class_list_constants[key]

    def _stacked_templates(self, classes: list[int]) -> torch.Tensor:
        missing = [c for c in classes if c not in self._templates]
        if missing:
            with torch.no_grad():
                features = self.template_features(missing).float()
            if features.dim() == 2:  # a single template
                features = features.unsqueeze(1)
            self._templates.update(zip(missing, features.to(self.device)))
        return torch.stack([self._templates[c] for c in classes])

    def class_templates(self, classes: list[int]) -> torch.Tensor:
        """Normalised template features ``[C, M, d]`` of frozen CLIP, encoded once per class (and
        stacked once per class list and task)."""
        return self.class_list_constant("templates", classes, lambda: self._stacked_templates(classes))

    def class_text(self, classes: list[int]) -> torch.Tensor:
        """t_c ``[C, d]``: the renormalised mean of each class's template features (once per class
        list and task)."""
        return self.class_list_constant(
            "text", classes, lambda: F.normalize(self._stacked_templates(classes).mean(dim=1), dim=-1)
        )

    def adapted_text(
        self, text: torch.Tensor, image: torch.Tensor, task_sizes: list[int], context: str
    ) -> torch.Tensor:
        """t_c + VGA_c: ``[B, C, d]`` (``context`` "image") or ``[1, C, d]`` (the batch as context)."""
        # built once per task: on a GPU, repeat_interleave would wait for the device at every step
        mask = self.class_list_constant("mask", task_sizes, lambda: task_mask(task_sizes, text.device))
        if context == "image":
            queries, memory = text.unsqueeze(0).expand(len(image), -1, -1), image.unsqueeze(1)
        else:
            queries, memory = text.unsqueeze(0), image.unsqueeze(0)
        return queries + self.vga(queries, memory, tgt_mask=mask)

    def sample_logits(
        self, image: torch.Tensor, tasks: list[list[int]], noise: list[torch.Tensor] | None, context: str
    ):
        """Logits ``[R, B, C]`` over the classes of ``tasks`` (in order), and the (mu, sigma, z) of
        the last task. ``noise``: one ``[R, 1, C_i, d]`` per task (evaluation), else fresh draws, one
        per batch in either VGA ``context`` (the official code draws per batch)."""
        classes = [c for task in tasks for c in task]
        text = self.class_text(classes)
        adapted = self.adapted_text(text, image, [len(t) for t in tasks], context)
        columns, start, last = [], 0, None
        for i, task in enumerate(tasks):
            stop = start + len(task)
            mu, sigma = self.encoders[i](adapted[:, start:stop])
            epsilon = (
                noise[i]
                if noise is not None
                else torch.randn(self.cfg.samples, 1, *mu.shape[1:], device=mu.device, dtype=mu.dtype)
            )
            z = mu.unsqueeze(0) + sigma.unsqueeze(0) * epsilon  # [R, B or 1, C_i, d]
            features = adapted[:, start:stop].unsqueeze(0) + z
            columns.append(
                self.backbone.logit_scale
                * torch.einsum("bd,rbcd->rbc", image, features.expand(-1, len(image), -1, -1))
            )
            last, start = (mu, sigma, z), stop
        return torch.cat(columns, dim=2), last

    # ---------------------------------------------------------------- hooks
    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)
        self._class_list_constants.clear()  # the last task's lists are not used again
        self.encoders.requires_grad_(False)  # earlier tasks' encoders are done
        encoder = DistributionEncoder(self.backbone.embed_dim).to(self.device)
        with torch.no_grad():
            w_mu, w_sigma = language_aware_init(self._stacked_templates(self.seen_classes + classes))
            encoder.mu.weight.copy_(w_mu)
            encoder.sigma.weight.copy_(w_sigma)
        self.encoders.append(encoder)
        self.vga.requires_grad_(True)

    def compute_logits(self, images: torch.Tensor) -> CLAPOutput:
        self.vga.train()
        with torch.no_grad():
            image = self.backbone.encode_image(images, normalize=True)
        tasks = [*self.task_classes, self.current_classes]
        logits, (mu, sigma, z) = self.sample_logits(image, tasks, None, self.cfg.train_vga_context)
        return CLAPOutput(
            logits.reshape(-1, logits.shape[-1]),
            kl_to_standard_normal(mu, sigma),
            lasp_loss(self.class_templates(self.current_classes), z),
        )

    def training_class_logits(self, output: CLAPOutput) -> torch.Tensor:
        """The R samples' logits averaged (as ``scores`` averages them), over the seen classes and
        then the current ones."""
        mean = output.logits.view(self.cfg.samples, -1, output.logits.shape[-1]).mean(dim=0)
        return self.by_class_id(mean, self.seen_classes + self.current_classes)

    def compute_loss(self, output: CLAPOutput, local_targets: torch.Tensor) -> torch.Tensor:
        targets = (local_targets + len(self.seen_classes)).repeat(self.cfg.samples)  # global, per sample
        return (
            F.cross_entropy(output.logits, targets)
            + self.cfg.kl_weight * output.kl
            + self.cfg.lasp_weight * output.lasp
        )

    def evaluation_noise(self) -> list[torch.Tensor]:
        """The R noise vectors of this stage, one ``[R, 1, C_i, d]`` per seen task, drawn once from a
        generator seeded by the stage: every image of the stage shares them."""
        stage = len(self.task_classes)
        if stage not in self._eval_noise:
            generator = torch.Generator().manual_seed(stage)
            dim = self.backbone.embed_dim
            self._eval_noise = {
                stage: torch.randn(self.cfg.samples, 1, len(self.seen_classes), dim, generator=generator).to(
                    self.device
                )
            }
        noise, start = self._eval_noise[stage], 0
        out = []
        for task in self.task_classes:
            out.append(noise[:, :, start : start + len(task)])
            start += len(task)
        return out

    @torch.no_grad()
    def scores_from_features(self, image: torch.Tensor) -> torch.Tensor:
        """Mean logits over the R samples, from normalised image features ``[B, d]``."""
        self.vga.eval()
        noise = self.evaluation_noise() if self.cfg.eval_noise == "stage" else None  # None: fresh draws
        logits, _ = self.sample_logits(image, self.task_classes, noise, self.cfg.vga_context)
        return logits.mean(dim=0)

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        return self.scores_from_features(self.backbone.encode_image(images, normalize=True))

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """The frozen tower's features of a test image are computed once per ``cache_key``; only the
        VGA and the encoders run at each stage."""
        features = self.frozen_features(dataset, cache_key, None)
        size = self.cfg.eval_batch_size
        batches = (features[i : i + size].to(self.device) for i in range(0, len(features), size))
        return cat_on_host([self.scores_from_features(batch) for batch in batches])

    def extra_trainable_parameters(self) -> list[nn.Parameter]:
        return [*self.vga.parameters(), *self.encoders.parameters()]

    def trainable_parameter_count(self) -> int:
        """The VGA and every task's encoder pair."""
        return sum(p.numel() for p in self.extra_trainable_parameters())

    def load_checkpoint_state(self, tensors, meta) -> None:
        while len(self.encoders) < len(meta["task_classes"]):  # re-create the encoders to load into
            self.encoders.append(DistributionEncoder(self.backbone.embed_dim).to(self.device))
        super().load_checkpoint_state(tensors, meta)
        self.encoders.requires_grad_(False)
