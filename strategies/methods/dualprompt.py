"""DualPrompt (Wang et al., ECCV 2022), in the form of the CODA-Prompt codebase: a shared G-prompt at
the first blocks and one E-prompt per task at the next ones, picked by its key. Paper row
"DualPrompt" (docs/baselines.md §10; facts from the papers and code, no code reused), on the
shared prompt protocol (``strategies.prompting``, docs/decisions.md D6).

Task t trains G, E_t, k_t and the head: prefix G at ``g_layers``, E_t at ``e_layers`` (where both
apply, E before G), loss CE over the current classes + ``key_loss_weight`` * sum_b (1 - cos(q_b,
k_t)). Other E-prompts and keys get no gradient; after task t, E_t and k_t never change.
Inference: per E layer, e* = argmax over its keys of cos(q, k_e); prefix G and E_{e*}; head logits
over the seen classes.

Official behaviour by default (D4): as the CODA-Prompt code, one key set per E layer (``keys =
"per_layer"``, each layer picking its own E-prompt at test) and e* over all ``pool_size`` keys,
untrained ones included (``select_over = "pool"``); ``keys = "shared"`` and ``select_over = "seen"``
give the paper's form. The train loader drops the last partial batch (``drop_last``).

RECIPE (CIFAR-100 10 tasks):

| hyper-parameter | value | source |
|---|---|---|
| G | length 6 (3 key + 3 value vectors), blocks 0, 1 | code: `--prompt_param 10 20 6`, models/zoo.py |
| E | pool 10 (= tasks), length 20 (10 k + 10 v), blocks 2, 3, 4, top-1, uniform [0, 1) | code: models/zoo.py |
| keys / key loss | one set per E layer / sum of (1 - cos(q, k_t)), weight 1 | code: models/zoo.py; D4 |
| selection | own task at training; top-1 over the whole pool at test | code: task_id_bootstrap, models/zoo.py; D4 |
| query, head | frozen 512-d embedding; Linear(512, C) with bias | D6 |
| optimiser | Adam, lr 1e-3, wd 0, batch 128, CODA cosine per epoch | code: configs, utils/schedulers.py; D6 |
| epochs | 20 (CIFAR-100), 50 (ImageNet-R), 10 (ImageNet-100, ImageNet-1K) | code: configs; fallback |
| train augmentation | rrc_flip | code: dataloaders/utils.py |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from benchmarks.core.errors import UserError
from strategies.prompting import PromptConfig, PromptStrategy, cosine_matrix
from strategies.registry import register


@dataclass
class DualPromptConfig(PromptConfig):
    g_length: int = 6  # 3 key + 3 value vectors
    g_layers: list[int] = field(default_factory=lambda: [0, 1])
    e_length: int = 20  # 10 key + 10 value vectors
    e_layers: list[int] = field(default_factory=lambda: [2, 3, 4])
    pool_size: int = 10  # E-prompts: at least the number of tasks
    select_over: Literal["seen", "pool"] = "pool"  # the CODA-Prompt code; "seen": the seen tasks' keys
    keys: Literal["shared", "per_layer"] = "per_layer"  # the CODA-Prompt code; "shared": the paper
    key_loss_weight: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("g_length", "e_length"):
            if getattr(self, name) < 2 or getattr(self, name) % 2:
                raise UserError(
                    f"dualprompt option {name}={getattr(self, name)} must be even (keys + values)"
                )
        if (
            not self.e_layers
            or len(set(self.g_layers)) != len(self.g_layers)
            or len(set(self.e_layers)) != len(self.e_layers)
        ):
            raise UserError(
                "dualprompt options g_layers and e_layers must list distinct blocks (e_layers at least one)"
            )


class DualPromptPrompts(nn.Module):
    """G ``[len(g_layers), g_length, width]``, E ``[pool, len(e_layers), e_length, width]`` and the
    keys, ``[pool, d]`` shared or ``[len(e_layers), pool, d]`` per layer; uniform [0, 1)."""

    def __init__(self, cfg: DualPromptConfig, width: int, key_dim: int) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.rand(len(cfg.g_layers), cfg.g_length, width))
        self.e = nn.Parameter(torch.rand(cfg.pool_size, len(cfg.e_layers), cfg.e_length, width))
        shape = (
            (cfg.pool_size, key_dim) if cfg.keys == "shared" else (len(cfg.e_layers), cfg.pool_size, key_dim)
        )
        self.keys = nn.Parameter(torch.rand(*shape))


def halves(prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefix prompt ``[..., L, D]`` as (keys, values): its first and second halves."""
    half = prompt.shape[-2] // 2
    return prompt[..., :half, :], prompt[..., half:, :]


@register("dualprompt")
class DualPrompt(PromptStrategy[DualPromptConfig]):
    Config = DualPromptConfig
    checkpoint_attributes = ("head", "prompts")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.check_layers("g_layers", self.cfg.g_layers)
        self.check_layers("e_layers", self.cfg.e_layers)
        self.prompts = DualPromptPrompts(self.cfg, self.visual_width, self.backbone.embed_dim).to(self.device)
        self.task_id = 0
        pool = self.cfg.pool_size
        self._task_row = torch.zeros(pool, device=self.device)  # 1 at the training task's E-prompt
        self.prompts.e.register_hook(lambda grad: grad * self._task_row.view(pool, 1, 1, 1))
        key_mask = (
            (lambda g: g * self._task_row.view(pool, 1))
            if self.cfg.keys == "shared"
            else (lambda g: g * self._task_row.view(1, pool, 1))
        )
        self.prompts.keys.register_hook(key_mask)
        self.last_selection: torch.Tensor | None = None  # [B, n keys] of the latest evaluation batch

    def setup_task(self, task: int, classes: list[int]) -> None:
        super().setup_task(task, classes)
        if task >= self.cfg.pool_size:
            raise UserError(
                f"dualprompt has {self.cfg.pool_size} E-prompts (pool_size) and cannot learn task "
                f"{task + 1}; set pool_size to the number of tasks"
            )
        self.task_id = task
        self._task_row.zero_()
        self._task_row[task] = 1.0

    def key_sets(self) -> torch.Tensor:
        """Keys ``[n sets, pool, d]``: one set shared by the E layers, or one per E layer."""
        keys = self.prompts.keys
        return keys.unsqueeze(0) if keys.dim() == 2 else keys

    def select(self, query: torch.Tensor) -> torch.Tensor:
        """The E-prompt of each image, per key set ``[B, n sets]``: the top-1 key over the seen tasks
        (``select_over = "seen"``) or the whole pool."""
        candidates = len(self.task_classes) if self.cfg.select_over == "seen" else self.cfg.pool_size
        return torch.stack(
            [cosine_matrix(query, keys[:candidates]).argmax(dim=1) for keys in self.key_sets()], dim=1
        )

    def prefixes(self, query: torch.Tensor, train: bool) -> tuple[dict, torch.Tensor]:
        cfg, batch = self.cfg, len(query)
        if train:  # the task's own prompt (task_id_bootstrap)
            chosen = torch.full((batch, len(self.key_sets())), self.task_id, device=query.device)
            cosines = torch.stack([cosine_matrix(query, keys)[:, self.task_id] for keys in self.key_sets()])
            extra = cfg.key_loss_weight * (1.0 - cosines).sum()
        else:
            chosen = self.select(query)
            self.last_selection = chosen
            extra = query.new_zeros(())
        out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, layer in enumerate(cfg.e_layers):
            rows = chosen[:, 0 if chosen.shape[1] == 1 else i]
            out[layer] = halves(self.prompts.e[rows, i])
        for i, layer in enumerate(cfg.g_layers):
            g_keys, g_values = (t.unsqueeze(0).expand(batch, -1, -1) for t in halves(self.prompts.g[i]))
            if layer in out:  # E before G
                e_keys, e_values = out[layer]
                g_keys, g_values = torch.cat([e_keys, g_keys], dim=1), torch.cat([e_values, g_values], dim=1)
            out[layer] = (g_keys, g_values)
        return out, extra

    def extra_trainable_parameters(self) -> list:
        return [*self.prompts.parameters(), *super().extra_trainable_parameters()]
