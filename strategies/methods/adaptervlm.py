"""AdapterVLM (Zhang et al., IEEE TMM 2025): task-specific visual LoRA, a shared text LoRA with a
sliding text anchor, pseudo-OOD training of an auxiliary head, and prototype + text scores.

Paper row "AdapterVLM" (docs/baselines.md §4; facts from its paper and code, no code reused).

Per task t:

* ``visual_t`` starts as a copy of ``visual_{t-1}``; earlier copies are frozen for ever. The text
  LoRA is one adapter trained on every task.
* Every step takes B training images and B pseudo-OOD images (``PatchShuffle``: the image cut into
  an 8 x 8 grid of patches, reassembled in a permuted order) from an independently shuffled loader
  of the same task, and minimises ``L = L_clip + L_dist + L_anchor + L_ce`` (``loss_terms``):
  ``L_clip`` CE over the current classes of ``s <v, t_c>``; ``L_dist`` the text separation hinge
  (``distance_loss``); ``L_anchor`` ``1 - cos(t_c, z_c)`` over old classes, ``z_c`` re-cached after
  every task (sliding, a method choice; ``anchor="frozen"`` freezes it when c's task ends, as
  GR4CIL); ``L_ce`` CE of an auxiliary MLP on the un-normalised embeddings of both halves, the
  pseudo-OOD ones labelled as an extra class. The MLP is new every task and never used at test.
* Prototypes ``p_c = normalise(sum of un-normalised embeddings of c)`` under ``visual_t``, eval
  transform.

Inference, no task id: ``q_c = lam <v^tau, p_c> + beta <v^tau, t_c>`` for c in C^tau under every
branch tau, raw cosines; the prediction is the flat argmax (equal to argmax over tasks of each
task's max, then the class). ``scores`` returns q.

Deviation: the official code writes the shuffled images to disk once, from the 224 px resize
before the train augmentation; here they are made on the fly (the permutation is seeded by the
image's pixels), also before the augmentation: equivalent in distribution, no files.

RECIPE (CIFAR-100; per-dataset values in the suites):

| hyper-parameter | value | source |
|---|---|---|
| LoRA | k, v of both towers; rank 24, alpha 1, no dropout | code: config_clip_two.py |
| visual adapter t | copy of t-1; earlier ones frozen | code: model_two.py, clip_two.py |
| aux MLP | Linear(d, d), ReLU, Linear(d, n_t + 1) | code: model_two.py |
| loss weights | 1, 1, 1 | code: options/clip_two/*.yaml |
| tau | 0.8 CIFAR-100; 0.6 ImageNet-R; 0.7 ImageNet-100/1K | code: options; fallback (GR4CIL's tau) |
| anchor | sliding | code: _cal_text_feature |
| prompt | "A photo of a {}." | code: datasets/cifar100_one_prompt.json |
| optimiser | AdamW, lr 5e-3, wd 0.1, over LoRA and aux MLP, new each task | code: clip_two.py |
| schedule | cosine per iteration, no warm-up | code: finetune_il.py |
| epochs | 50 CIFAR-100; 70 ImageNet-R; 10 ImageNet-100/1K | code: options; fallback |
| batch | 100 CIFAR-100; 64 elsewhere | code: options; fallback |
| train augmentation | paper | code: datasets/cifar100_i2t.py |
| pseudo-OOD | 8 x 8 patch shuffle of the resized image | code: OOD_contrust.ipynb |
| prototype | normalise(sum of raw embeddings), eval transform | code: _cal_image_prototype |
| lam, beta | 1, 1 | code: eval_task |
| precision | AMP fp16 with a loss scaler (here: the run's --precision, fp16 on CUDA by default) | code: clip_two.py |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.data.device_augment import patch_shuffled_transform
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.methods.gr4cil import anchor_loss, separation_loss
from strategies.registry import register


# ============================================================================ the equations
def distance_loss(
    new_text: torch.Tensor, seen_text: torch.Tensor, new_index: torch.Tensor, tau: float
) -> torch.Tensor:
    """``L_dist``: the sum over new classes c and other seen classes c' of ``max(0, cos(t_c, t_c') - tau)``
    divided by ``n_new (n_seen - 1)``. Every new class has the same number of others, so it is
    GR4CIL's ``separation_loss`` (a mean of per-class means)."""
    return separation_loss(new_text, seen_text, new_index, tau)


def prototype(features: torch.Tensor) -> torch.Tensor:
    """``p_c = normalise(sum of the un-normalised embeddings of class c)``."""
    return F.normalize(features.sum(dim=0), dim=-1)


def task_scores(
    image: torch.Tensor, prototypes: torch.Tensor, text: torch.Tensor, lam: float, beta: float
) -> torch.Tensor:
    """``q_c = lam <v, p_c> + beta <v, t_c>`` for one task's classes (raw cosines)."""
    return lam * image @ prototypes.T + beta * image @ text.T


def aux_head(dim: int, n_classes: int) -> nn.Sequential:
    """The auxiliary MLP: ``n_classes`` current classes plus one pseudo-OOD class."""
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, n_classes + 1))


@dataclass
class StepOutput:
    """What ``compute_logits`` hands to ``compute_loss``."""

    clip_logits: torch.Tensor  # s <v_ID, t_c> over the current classes
    aux_logits: torch.Tensor  # [2B, n_t + 1]: the ID half, then the pseudo-OOD half
    text: torch.Tensor  # features of the seen classes, then the current ones


# ============================================================================ the strategy
@dataclass
class AdapterVLMConfig(StrategyConfig):
    epochs: int = 50
    batch_size: int = 100
    lr: float = 5e-3
    lora_rank: int = 24
    lora_alpha: float = 1.0
    prompt_template: str = "A photo of a {}."
    tau: float = 0.8
    anchor: Literal["sliding", "frozen"] = "sliding"  # "sliding" (official) | "frozen" (GR4CIL's rule)
    lam: float = 1.0  # prototype weight of q
    beta: float = 1.0  # text weight of q
    patch_grid: int = 8  # pseudo-OOD: grid x grid patches


@register("adaptervlm")
class AdapterVLM(CLIPStrategy[AdapterVLMConfig]):
    Config = AdapterVLMConfig

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.prototypes: list[torch.Tensor] = []  # per task, [|C^t|, d]
        self.anchors = torch.empty(0, self.backbone.embed_dim)  # z_c, rows follow anchor_ids
        self.aux: nn.Module | None = None
        self._ood_loader = self._ood_batches = None  # the task's pseudo-OOD loader and its iterator

    @property
    def branches(self) -> list[str]:
        """The visual adapter of each learned task."""
        return [f"visual_{task + 1}" for task in range(len(self.task_classes))]

    @property
    def anchor_ids(self) -> list[int]:
        """Classes of the anchor rows: every seen class, under either anchor rule."""
        return self.seen_classes

    # ---------------------------------------------------------------- training
    def setup_task(self, task: int, classes: list[int]) -> None:
        if task == 0:
            self.add_adapter("text", tower="text")
        adapter = f"visual_{task + 1}"
        self.add_adapter(adapter, tower="visual")
        if task > 0:
            self.backbone.copy_lora(self.branches[-1], adapter)
        self.backbone.set_adapters(visual=adapter, text="text")
        self.backbone.set_trainable([adapter, "text"])
        self.aux = aux_head(self.backbone.embed_dim, len(classes)).to(self.device)
        self._ood_batches = None

    def extra_trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.aux.parameters()) if self.aux is not None else []

    def _next_ood_batch(self) -> torch.Tensor:
        """The next batch of the task's pseudo-OOD loader (own shuffle, same batch size), restarted
        when it runs out."""
        if self._ood_batches is None:
            backbone = self.backbone
            ood = self.adapted_dataset.replace_current_transform_group(
                patch_shuffled_transform(
                    backbone.image_size,
                    backbone.mean,
                    backbone.std,
                    self.cfg.train_augmentation,
                    self.cfg.patch_grid,
                    self.settings.augment_on,
                )
            )
            self._ood_loader = self.data_loader(
                ood,
                batch_size=self.cfg.batch_size,
                shuffle=True,
                passes=self.train_epochs,
                purpose="pseudo-ood",
                training=True,  # its images feed every training step's loss
            )
            self._ood_batches = iter(self._ood_loader)
        try:
            images = next(self._ood_batches)[0]
        except StopIteration:
            self._ood_batches = iter(self._ood_loader)
            images = next(self._ood_batches)[0]
        return images.to(self.device, non_blocking=True)

    def compute_logits(self, images: torch.Tensor) -> StepOutput:
        if self.aux is None:  # built by setup_task, dropped after the task
            raise RuntimeError("AdapterVLM.compute_logits outside a task's training")
        ood = self._next_ood_batch()[: len(images)]
        raw = self.backbone.encode_image(torch.cat([images, ood]), normalize=False)
        text = self.text_features(self.seen_classes + self.current_classes)
        image = F.normalize(raw[: len(images)], dim=-1)
        clip_logits = self.backbone.logit_scale * image @ text[len(self.seen_classes) :].T
        return StepOutput(clip_logits, self.aux(raw), text)

    def training_class_logits(self, output: StepOutput) -> torch.Tensor:
        return self.by_class_id(output.clip_logits, self.current_classes)

    def compute_loss(self, output: StepOutput, local_targets: torch.Tensor) -> torch.Tensor:
        terms = loss_terms(
            output,
            local_targets,
            self.device_copy("anchors", self.anchors),
            len(self.seen_classes),
            self.cfg.tau,
        )
        first, *rest = terms.values()
        return sum(rest, first)

    # ---------------------------------------------------------------- after a task
    def finish_task(self, task: int, classes: list[int]) -> None:
        adapter = f"visual_{task + 1}"
        features, labels = self.encode_dataset(self.adapted_dataset.eval(), adapter, normalize=False)
        self.prototypes.append(torch.stack([prototype(features[labels == c]) for c in classes]))
        with torch.no_grad():  # z_c: all seen classes (sliding) or only the new ones (frozen)
            if self.cfg.anchor == "sliding":
                self.anchors = self.text_features(self.anchor_ids).cpu()
            else:
                self.anchors = torch.cat([self.anchors, self.text_features(classes).cpu()])
        self.aux, self._ood_batches, self._ood_loader = None, None, None
        self.backbone.set_adapters(visual=adapter, text="text")

    # ---------------------------------------------------------------- inference
    def _scores_from_features(self, features: list[torch.Tensor], text: torch.Tensor) -> torch.Tensor:
        columns, start = [], 0
        for classes, branch, prototypes in zip(self.task_classes, features, self.prototypes):
            stop = start + len(classes)
            columns.append(
                task_scores(
                    branch, prototypes.to(branch), text[start:stop].to(branch), self.cfg.lam, self.cfg.beta
                )
            )
            start = stop
        return torch.cat(columns, dim=1)

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        branches = self.backbone.encode_image_multi(images, self.branches)
        return self._scores_from_features(list(branches), self.text_features(self.seen_classes))

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """Frozen branches' features of each image are computed once per ``cache_key``; the text
        term is recomputed (the shared text LoRA keeps training)."""
        features = [self.frozen_features(dataset, cache_key, adapter) for adapter in self.branches]
        return self._scores_from_features(features, self.text_features(self.seen_classes).cpu())

    # ---------------------------------------------------------------- counts and checkpoints
    def trainable_parameter_count(self) -> int:
        """Text LoRA once, every visual LoRA, and the prototypes kept for inference (the aux MLP is
        transient)."""
        return self.lora_parameter_count() + sum(p.numel() for p in self.prototypes)

    # per task ``state/prototypes/<i>`` (0-based) and the anchors ``state/anchors`` (rows follow anchor_ids)
    checkpoint_attributes = ("prototypes", "anchors")

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        super().load_checkpoint_state(tensors, meta)
        if self.branches:
            self.backbone.set_adapters(visual=self.branches[-1], text="text")


def loss_terms(
    output: StepOutput, local_targets: torch.Tensor, anchors: torch.Tensor, n_seen: int, tau: float
) -> dict[str, torch.Tensor]:
    """The four terms of AdapterVLM's loss, each weighted 1."""
    n_new = output.clip_logits.shape[1]
    text_old, text_new = output.text[:n_seen], output.text[n_seen:]
    ood_targets = torch.full_like(local_targets, n_new)[: output.aux_logits.shape[0] - len(local_targets)]
    terms = {
        "clip": F.cross_entropy(output.clip_logits, local_targets),
        "ce": F.cross_entropy(output.aux_logits, torch.cat([local_targets, ood_targets])),
    }
    new_index = torch.arange(n_seen, n_seen + n_new, device=text_new.device)
    terms["dist"] = distance_loss(text_new, output.text, new_index, tau)
    if n_seen:
        terms["anchor"] = anchor_loss(text_old, anchors[:n_seen])
    return terms
