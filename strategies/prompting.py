"""What the three prompt methods share (L2P++, DualPrompt, CODA-Prompt; docs/baselines.md §8,
docs/decisions.md D6):
a pool of prefix prompts with keys, key-query selection, prefix assembly, the key loss, a linear
head on the prompted embedding, and the strategy skeleton around them.

* Query: the frozen, unprompted 512-d image embedding (one extra forward, no grad; cached per test
  image in ``score_dataset``, so a stage costs one prompted forward per image).
* A prompt of length L is a prefix: its first L/2 vectors join the keys, the last L/2 the values
  of a visual block (``backbone.visual_prefix``).
* Head: ``Linear(512, n_classes)`` with bias on the prompted, unnormalised embedding; CE over the
  current task's classes; rows of other classes get no gradient.
* ``scores`` returns the head logits over the seen classes.

Not registered: each method subclasses ``PromptStrategy`` and fills in ``prefixes``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.core.errors import UserError
from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.optim import Optimizer, Schedule
from strategies.training.evaluation import cat_on_host

KeyLoss = Literal["own_topk", "all_pairs"]
KEY_LOSSES = typing.get_args(KeyLoss)


def cosine_matrix(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """cos(q_b, k_m) ``[B, M]``."""
    return F.normalize(query, dim=-1) @ F.normalize(keys, dim=-1).T


def select_prompts(cosines: torch.Tensor, top_k: int) -> torch.Tensor:
    """Indices ``[B, top_k]`` of each query's ``top_k`` most similar keys, most similar first."""
    return cosines.topk(top_k, dim=1).indices


def key_loss(cosines: torch.Tensor, selected: torch.Tensor, mode: str = "all_pairs") -> torch.Tensor:
    """Sum of (1 - cos) that pulls the selected keys towards their queries.

    ``own_topk``: sum over b and each j in image b's own top-k. ``all_pairs`` (the CODA-Prompt
    code): ``cosines[:, selected]`` is ``[B, B, k]``, so every query is pulled towards every key
    selected anywhere in the batch."""
    if mode == "own_topk":
        return (1.0 - cosines.gather(1, selected)).sum()
    if mode == "all_pairs":
        return (1.0 - cosines[:, selected]).sum()
    raise ValueError(f"key_loss must be one of {KEY_LOSSES}, not {mode!r}")


def prefix_from_prompts(prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix keys and values ``[B, k L/2, D]`` from selected prompts ``[B, k, L, D]``: the first half
    of every prompt joins the keys, the second half the values, prompt after prompt."""
    batch, k, length, width = prompts.shape
    half = length // 2
    return (
        prompts[:, :, :half].reshape(batch, k * half, width),
        prompts[:, :, half:].reshape(batch, k * (length - half), width),
    )


class PromptPool(nn.Module):
    """``size`` prompts ``[L, width]`` and their keys ``[key_dim]``, initialised uniform on [0, 1)
    (CODA-Prompt codebase)."""

    def __init__(self, size: int, length: int, width: int, key_dim: int) -> None:
        super().__init__()
        if length < 2 or length % 2:
            raise ValueError(f"a prefix prompt needs an even length (keys + values), not {length}")
        self.prompts = nn.Parameter(torch.rand(size, length, width))
        self.keys = nn.Parameter(torch.rand(size, key_dim))


@dataclass
class PromptOutput:
    """``compute_logits`` -> ``compute_loss``: current-class logits and the method's extra loss."""

    logits: torch.Tensor
    extra_loss: torch.Tensor


@dataclass
class PromptConfig(StrategyConfig):
    """D6: Adam, lr 1e-3, wd 0, batch 128, the CODA cosine per epoch, 20 epochs (CIFAR-100), rrc_flip."""

    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: Optimizer = "adam"
    schedule: Schedule = "coda_cosine"
    train_augmentation: TrainAugmentation = "rrc_flip"
    # The codebase's train loader drops the last partial batch (trainer.py, docs/decisions.md D4).
    drop_last: bool = True


#: a prompt method's config class
PromptConfigT = TypeVar("PromptConfigT", bound=PromptConfig)


class PromptStrategy(CLIPStrategy[PromptConfigT]):
    """The skeleton of a prompt method: a head, a cached frozen query, ``prefixes`` per batch."""

    checkpoint_attributes: ClassVar[tuple[str, ...]] = ("head",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head = nn.Linear(self.backbone.embed_dim, len(self.class_names)).to(self.device)
        self._trained_rows = torch.zeros(len(self.class_names), 1, device=self.device)
        # Rows of classes outside the current task get no gradient, explicitly.
        self.head.weight.register_hook(lambda grad: grad * self._trained_rows)
        self.head.bias.register_hook(lambda grad: grad * self._trained_rows[:, 0])

    @property
    def _visual_transformer(self) -> Any:
        """open_clip's visual transformer (its attributes, read through ``nn.Module``, are untyped)."""
        visual: Any = self.backbone.model.visual
        return visual.transformer

    @property
    def visual_width(self) -> int:
        return self._visual_transformer.width

    def check_layers(self, option: str, layers: list[int]) -> None:
        """Prompt blocks must exist in this model's visual tower (a suite mistake: one line)."""
        depth = len(self._visual_transformer.resblocks)
        if any(not 0 <= layer < depth for layer in layers):
            raise UserError(
                f"{self.name} option {option}={layers} names blocks the visual tower does not have "
                f"({depth} blocks: 0 to {depth - 1}); set it for this model"
            )

    def make_train_dataloader(self, shuffle: bool = True, drop_last: bool = False, **kwargs):
        # The official loader drops the last partial batch; a task smaller than one batch keeps it,
        # where the official code would train nothing at all.
        full_batch = len(self.adapted_dataset) >= self.train_mb_size
        super().make_train_dataloader(shuffle, drop_last or (self.cfg.drop_last and full_batch), **kwargs)

    # ---------------------------------------------------------------- what a method fills in
    def prefixes(self, query: torch.Tensor, train: bool) -> tuple[dict, torch.Tensor]:
        """``({block: (keys, values)}, extra loss)`` for a batch of frozen queries ``[B, 512]``."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the hooks
    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)
        self._trained_rows.zero_()
        self._trained_rows[classes] = 1.0

    @torch.no_grad()
    def query(self, images: torch.Tensor) -> torch.Tensor:
        """The frozen, unprompted image embedding."""
        return self.backbone.encode_image(images, normalize=False)

    def prompted_logits(
        self, images: torch.Tensor, query: torch.Tensor, train: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        prefixes, extra = self.prefixes(query, train)
        with self.backbone.visual_prefix(prefixes):
            features = self.backbone.encode_image(images, normalize=False)
        return self.head(features), extra

    def compute_logits(self, images: torch.Tensor) -> PromptOutput:
        logits, extra = self.prompted_logits(images, self.query(images), train=True)
        return PromptOutput(logits[:, self.current_classes], extra)

    def compute_loss(self, output: PromptOutput, local_targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits, local_targets) + output.extra_loss

    @torch.no_grad()
    def scores(self, images: torch.Tensor, query: torch.Tensor | None = None) -> torch.Tensor:
        query = self.query(images) if query is None else query
        return self.prompted_logits(images, query, train=False)[0][:, self.seen_classes]

    def score_dataset(self, dataset, cache_key: str) -> torch.Tensor:
        """The frozen queries are computed once per ``cache_key``; each stage makes one prompted
        forward per image."""
        queries = self.frozen_features(dataset, cache_key, None)  # cosine-only use: normalised is fine
        out, start = [], 0
        for images, *_ in self.data_loader(dataset):
            batch = queries[start : start + len(images)].to(self.device)
            out.append(self.scores(images.to(self.device, non_blocking=True), batch).float())
            start += len(images)
        return cat_on_host(out)

    def extra_trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def trainable_parameter_count(self) -> int:
        """Everything the method learns outside the frozen backbone (pool or prompts, keys, head)."""
        return sum(p.numel() for p in self.extra_trainable_parameters())
