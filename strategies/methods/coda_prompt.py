"""CODA-Prompt (Smith et al., CVPR 2023): prompts composed from a growing set of components, weighted
by attention on the query. Paper row "CODA" (docs/baselines.md §11; facts from the paper and the
CODA-Prompt code, no code reused), on the shared prompt protocol (``strategies.prompting``,
docs/decisions.md D6).

At each prompt block l, component m has a prompt P_m ``[L, width]``, a key K_m and an attention
vector A_m ``[d]``; the prompt of an image is ``sum_m alpha_m P_m`` with alpha_m = cos(q * A_m, K_m)
(a plain cosine, no softmax), its first half joining the keys and its second half the values.
Task t owns the slice [s, f) = [t pt, (t + 1) pt), pt = components / number of tasks: at its
start the slice is drawn from a normal distribution and Gram-Schmidt-orthogonalised against the
earlier ones (``gram_schmidt``), layer by layer, in the official code's order of draws: prompts, keys,
attention vectors at the first task (its ``__init__``), keys, attention vectors, prompts at later ones
(``process_task_count``); the draws come from a generator seeded by (run seed, task). During it [0, s) is used but detached, [s, f) learns, and later
slices are left out. Loss: CE over the current classes; the orthogonality penalty has weight 0 in
the official runs and is left out. Inference: alpha over the components of every seen task, head
logits over the seen classes.

Official behaviour by default (D4): the official Gram-Schmidt subtracts each draw's projections
onto the earlier rows as they are (classical Gram-Schmidt, float32). That is exact only against
orthogonal earlier rows; trained ones are not, so a new slice keeps a component along the old ones
(``gram_schmidt = "exact"``: orthogonal to their span, to rounding). The train loader drops the last
partial batch (``drop_last``).

The number of tasks is the stream's (``stream_task_sizes``), read at the first task and kept with
the checkpoint: pt = components // tasks whatever the tasks' sizes, so a half-base split
(B50-Inc10: 6 tasks) gives each task, its base included, one slice of 100 // 6 = 16 components, as
the official code sizes its slices by the number of tasks of its split (docs/decisions.md). A
model saved before the count was kept falls back to all classes / the first task's classes.

RECIPE (CIFAR-100 10 tasks):

| hyper-parameter | value | source |
|---|---|---|
| components / length / blocks | 100 / 8 (4 key + 4 value vectors) / 0-4 | code: experiments/*.sh `--prompt_param 100 8 0.0` |
| per task, alpha, init | 100 / tasks; cos(q * A, K), no softmax; classical Gram-Schmidt, a new slice per task | code: models/zoo.py |
| orthogonality weight | 0 | code: `--prompt_param ... 0.0` |
| query, head | frozen 512-d embedding; Linear(512, C) with bias | D6 (C3Box key dimension) |
| optimiser | Adam, lr 1e-3, wd 0, batch 128, CODA cosine per epoch | code: configs, utils/schedulers.py; D6 |
| epochs | 20 (CIFAR-100), 50 (ImageNet-R), 10 (ImageNet-100, ImageNet-1K) | code: configs; fallback |
| train augmentation | rrc_flip | code: dataloaders/utils.py |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.core.errors import UserError
from benchmarks.data.loaders import derive_seed
from strategies.contract import stream_task_sizes
from strategies.prompting import PromptConfig, PromptStrategy
from strategies.registry import register

GramSchmidt = Literal["official", "exact"]


def gram_schmidt(
    rows: torch.Tensor,
    start: int,
    stop: int,
    generator: torch.Generator | None = None,
    mode: GramSchmidt = "official",
) -> torch.Tensor:
    """``rows`` ``[M, n]`` with rows [start, stop) redrawn from a standard normal (one float32 draw of
    ``n`` per row, in order) and orthogonalised against every earlier row; the rest kept as they are.

    ``official`` (the CODA-Prompt code): classical Gram-Schmidt in float32, each draw minus its
    projections onto the earlier rows as they are, the new rows scaled to unit length at the end;
    exact only where the earlier rows are orthogonal. ``exact``: each new row orthogonal to the span
    of every earlier row (an orthonormal basis by QR, projected out twice, in float64)."""
    draws = [torch.randn(rows.shape[1], generator=generator, dtype=torch.float32) for _ in range(start, stop)]
    if mode == "official":
        out = rows.detach().to(torch.float32).clone()
        for i, v in zip(range(start, stop), draws):
            v = v.to(out.device)
            earlier = out[:i]
            norms = (earlier * earlier).sum(1)
            used = norms >= 1e-8  # a zero row has no direction to project on
            out[i] = v - ((earlier[used] @ v) / norms[used]) @ earlier[used]
        out[start:stop] /= out[start:stop].norm(dim=1, keepdim=True)
        return out.to(rows.dtype)
    out = rows.detach().to(torch.float64).clone()
    for i, v in zip(range(start, stop), draws):
        v = v.to(device=out.device, dtype=torch.float64)
        for _ in range(2):  # twice: orthogonal to rounding, also against non-orthonormal old rows
            if i:
                basis = torch.linalg.qr(out[:i].T).Q  # an orthonormal basis of the earlier rows
                v = v - basis @ (basis.T @ v)
        out[i] = v / v.norm()
    return out.to(rows.dtype)


def component_weights(query: torch.Tensor, keys: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """alpha ``[B, M]``: cos(q * A_m, K_m) for each image and component (eq. of CODA-Prompt)."""
    attended = query.unsqueeze(1) * attention.unsqueeze(0)  # [B, M, d]
    return (F.normalize(attended, dim=-1) * F.normalize(keys, dim=-1).unsqueeze(0)).sum(-1)


@dataclass
class CodaConfig(PromptConfig):
    components: int = 100
    prompt_length: int = 8  # 4 key + 4 value vectors
    prompt_layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    gram_schmidt: GramSchmidt = "official"  # "exact": orthogonal to the old rows' span

    def __post_init__(self):
        super().__post_init__()
        if self.prompt_length < 2 or self.prompt_length % 2:
            raise UserError(
                f"coda_prompt option prompt_length={self.prompt_length} must be even (keys + values)"
            )
        if not self.prompt_layers or len(set(self.prompt_layers)) != len(self.prompt_layers):
            raise UserError("coda_prompt option prompt_layers must list distinct blocks")


class CodaComponents(nn.Module):
    """Per prompt block: prompts ``[M, L, width]``, keys and attention vectors ``[M, d]``; zero until
    their task's slice is initialised."""

    def __init__(self, layers: int, components: int, length: int, width: int, key_dim: int) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.zeros(layers, components, length, width))
        self.keys = nn.Parameter(torch.zeros(layers, components, key_dim))
        self.attention = nn.Parameter(torch.zeros(layers, components, key_dim))


@register("coda_prompt")
class CodaPrompt(PromptStrategy[CodaConfig]):
    Config = CodaConfig
    checkpoint_attributes = ("head", "components", "stream_tasks")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cfg = self.cfg
        self.check_layers("prompt_layers", cfg.prompt_layers)
        if (
            cfg.components > self.backbone.embed_dim
        ):  # keys and attention vectors are orthonormal rows of that size
            raise UserError(
                f"coda_prompt option components={cfg.components} exceeds the query dimension "
                f"{self.backbone.embed_dim}; at most that many components can be orthonormal"
            )
        self.components = CodaComponents(
            len(cfg.prompt_layers),
            cfg.components,
            cfg.prompt_length,
            self.visual_width,
            self.backbone.embed_dim,
        ).to(self.device)
        self.slice = (0, 0)  # [s, f) of the task in training
        self.stream_tasks: int | None = None  # the stream's number of tasks, read at the first task

    def components_per_task(self, first_task_classes: int) -> int:
        n_tasks = self.stream_tasks or len(self.class_names) // first_task_classes
        per_task = self.cfg.components // n_tasks
        if per_task < 1:
            raise UserError(
                f"coda_prompt has {self.cfg.components} components for {n_tasks} tasks; "
                "give at least one per task"
            )
        return per_task

    @property
    def per_task(self) -> int:
        """Components per task (0 before the first task)."""
        return self.components_per_task(len(self.task_classes[0])) if self.task_classes else 0

    def setup_task(self, task: int, classes: list[int]) -> None:
        super().setup_task(task, classes)
        if task == 0 or self.stream_tasks is None:
            sizes = stream_task_sizes(getattr(self, "experience", None))
            self.stream_tasks = len(sizes) if sizes else None
        per_task = self.per_task or self.components_per_task(len(classes))  # the first task sets the split
        start, stop = task * per_task, (task + 1) * per_task
        self.slice = (start, stop)
        generator = torch.Generator().manual_seed(
            derive_seed(self.settings.seed, task, "coda_prompt.gram_schmidt")
        )
        parts = self.components
        with torch.no_grad():
            # the official order: __init__ draws P, K, A; process_task_count K, A, P (issue 52)
            order = (
                (parts.prompts, parts.keys, parts.attention)
                if task == 0
                else (parts.keys, parts.attention, parts.prompts)
            )
            for layer in range(len(self.cfg.prompt_layers)):
                for parameter in order:
                    flat = parameter[layer].view(parameter.shape[1], -1)
                    flat.copy_(gram_schmidt(flat, start, stop, generator, self.cfg.gram_schmidt))

    def used(self, parameter: torch.Tensor, train: bool) -> torch.Tensor:
        """The components in use: [0, f) of the seen tasks at test; at training [0, s) detached and
        the task's own [s, f) learning."""
        start, stop = self.slice if train else (0, len(self.task_classes) * self.per_task)
        return torch.cat([parameter[:, :start].detach(), parameter[:, start:stop]], dim=1)

    def prefixes(self, query: torch.Tensor, train: bool) -> tuple[dict, torch.Tensor]:
        prompts = self.used(self.components.prompts, train)
        keys, attention = self.used(self.components.keys, train), self.used(self.components.attention, train)
        half = self.cfg.prompt_length // 2
        out = {}
        for i, layer in enumerate(self.cfg.prompt_layers):
            alpha = component_weights(query, keys[i], attention[i])  # [B, M]
            prompt = torch.einsum("bm,mld->bld", alpha, prompts[i])
            out[layer] = (prompt[:, :half], prompt[:, half:])
        return out, query.new_zeros(())

    def extra_trainable_parameters(self) -> list:
        return [*self.components.parameters(), *super().extra_trainable_parameters()]
