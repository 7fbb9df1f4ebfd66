"""Parallel MLP adapters, optionally a mixture of experts with a router, on every block of either
tower (AdaptFormer-style; MOE4CL on both towers, APER on the visual one).

In each residual block the MLP sub-step becomes ``x = h + mlp(ln_2(h)) + branch(h)``, where h is
the residual stream after attention and ``branch(h) = sum_e g_e(h_0) * scale * up_e(drop(relu(down_e(h))))``
with gates ``g`` from the router (token 0 of h) or ``g = 1`` for a single expert without one.
Two hooks per block do it, leaving open_clip's modules untouched: a pre-hook on ``block.ln_2``
keeps h, a hook on ``block.mlp`` adds the branch to the MLP's output (``ls_2`` must be the
identity, as in every CLIP of the suite). The adapters live in the backbone (``mlp_adapter_modules``),
outside ``model``, so the CLIP weights and the MagMax arithmetic never see them.

While a tower's adapters are enabled, text prompts take open_clip's plain block-by-block path:
the shared-prefix shortcut skips ``block.forward`` for the prefix and would route on the wrong
token (``text._prefix_sharing_applies`` checks ``parallel_adapters_active``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.backbone.lora import Tower
from benchmarks.backbone.open_clip_types import OpenCLIP, OpenCLIPBlock, OpenCLIPTransformer


class Expert(nn.Module):
    """Linear(d, b) -> ReLU -> dropout -> Linear(b, d), times ``scale``. The down weight keeps
    nn.Linear's kaiming-uniform (a = sqrt 5); the up weight and both biases start at zero, so a new
    expert adds exactly 0."""

    def __init__(self, width: int, bottleneck: int, dropout: float, scale: float) -> None:
        super().__init__()
        self.down = nn.Linear(width, bottleneck)
        self.up = nn.Linear(bottleneck, width)
        self.dropout = nn.Dropout(dropout)
        self.scale = scale
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.up(self.dropout(F.relu(self.down(h)))) * self.scale


def noisy_top_k_gates(
    x0: torch.Tensor, w_gate: torch.Tensor, w_noise: torch.Tensor, k: int, noise: torch.Tensor | None
) -> torch.Tensor:
    """Gates ``[B, E]`` of the noisy top-k router (Shazeer et al. 2017) from token 0 ``x0`` ``[B, d]``:
    ``logits = x0 W_g + noise * (softplus(x0 W_noise) + 0.01)`` (no noise term if ``noise`` is None),
    softmax over the k largest logits, 0 elsewhere. With k = E every expert is active."""
    logits = x0 @ w_gate
    if noise is not None:
        logits = logits + noise * (F.softplus(x0 @ w_noise) + 0.01)
    top, index = logits.topk(k, dim=-1)
    weights = top.softmax(dim=-1)  # float32 under CUDA autocast, whatever the logits' type
    return torch.zeros_like(logits, dtype=weights.dtype).scatter(-1, index, weights)


class Router(nn.Module):
    """One router per block: ``W_g`` and ``W_noise`` (``[d, E]``, zero-initialised: equal gates)."""

    def __init__(self, width: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.w_gate = nn.Parameter(torch.zeros(width, experts))
        self.w_noise = nn.Parameter(torch.zeros(width, experts))
        self.top_k = top_k

    def forward(self, x0: torch.Tensor, noisy: bool) -> torch.Tensor:
        noise = (
            torch.randn(x0.shape[0], self.w_gate.shape[1], device=x0.device, dtype=x0.dtype)
            if noisy
            else None
        )
        return noisy_top_k_gates(x0, self.w_gate.to(x0.dtype), self.w_noise.to(x0.dtype), self.top_k, noise)


class ParallelAdapter(nn.Module):
    """The branch of one block: its experts and, with more than one, its router."""

    def __init__(
        self,
        width: int,
        experts: int,
        bottleneck: int,
        dropout: float,
        scale: float,
        router: bool,
        top_k: int | None,
    ) -> None:
        super().__init__()
        self.experts = nn.ModuleList(Expert(width, bottleneck, dropout, scale) for _ in range(experts))
        self.router = Router(width, experts, top_k or experts) if router else None
        self.eval_noise = False  # gate noise at evaluation (MOE4CL's official quirk); always on in training
        self.last_gates: torch.Tensor | None = None  # of the latest forward, for tests and diagnostics

    def forward(self, h: torch.Tensor, batch_first: bool) -> torch.Tensor:
        if self.router is None:
            return sum(expert(h) for expert in self.experts)
        x0 = h[:, 0] if batch_first else h[0]
        gates = self.router(x0, noisy=self.training or self.eval_noise)
        self.last_gates = gates.detach()
        shape = (-1, 1, len(self.experts)) if batch_first else (1, -1, len(self.experts))
        gates = gates.view(shape)
        return sum(gates[..., e : e + 1].to(h.dtype) * expert(h) for e, expert in enumerate(self.experts))


def _transformer(model: OpenCLIP, tower: Tower) -> OpenCLIPTransformer:
    return model.visual.transformer if tower == "visual" else model.transformer


class MLPAdapters:
    """The parallel-adapter part of ``CLIPBackbone`` (a mixin; the backbone is an nn.Module)."""

    model: OpenCLIP
    mlp_adapter_modules: nn.ModuleDict  # tower -> one ParallelAdapter per block

    def add_mlp_adapters(
        self,
        tower: Tower,
        experts: int = 1,
        bottleneck: int = 64,
        dropout: float = 0.1,
        scale: float = 0.1,
        router: bool = False,
        top_k: int | None = None,
    ) -> nn.ModuleList:
        """Add one ``ParallelAdapter`` to every block of ``tower``, enabled and trainable; returns
        them (one per block). Weights draw from torch's global generator."""
        if tower not in ("visual", "text"):
            raise ValueError(f"tower must be 'visual' or 'text', got {tower!r}")
        if router and experts < 2 or top_k is not None and not 1 <= top_k <= experts:
            raise ValueError("a router needs at least 2 experts and 1 <= top_k <= experts")
        modules = self.mlp_adapter_modules
        if tower in modules:
            raise ValueError(f"the {tower} tower already has MLP adapters")
        transformer = _transformer(self.model, tower)
        adapters = nn.ModuleList()
        for block in transformer.resblocks:
            if not isinstance(block.ls_2, nn.Identity):
                raise ValueError("parallel MLP adapters need ls_2 = identity (no layer scale)")
            adapter = ParallelAdapter(transformer.width, experts, bottleneck, dropout, scale, router, top_k)
            adapters.append(
                adapter.to(self.model.logit_scale.device).train(self.model.training)
            )  # CLIP's mode
            self._hook_block(block, adapter, transformer)
        modules[tower] = adapters
        transformer.parallel_adapters_active = True
        return adapters

    def _hook_block(
        self, block: OpenCLIPBlock, adapter: ParallelAdapter, transformer: OpenCLIPTransformer
    ) -> None:
        captured: list[torch.Tensor] = []

        def keep_residual(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            if transformer.parallel_adapters_active:
                captured[:] = [args[0]]

        def add_branch(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor | None:
            if not transformer.parallel_adapters_active:
                return None
            h = captured.pop()
            return output + adapter(h, transformer.batch_first).to(output.dtype)

        block.ln_2.register_forward_pre_hook(keep_residual)
        block.mlp.register_forward_hook(add_branch)

    def mlp_adapter_parameters(self, tower: Tower | None = None) -> list[nn.Parameter]:
        """Parameters of the MLP adapters of ``tower`` (None: both)."""
        return [
            p
            for name, adapters in self.mlp_adapter_modules.items()
            if tower in (None, name)
            for p in adapters.parameters()
        ]

    @contextlib.contextmanager
    def mlp_adapters(self, enabled: bool) -> Iterator[None]:
        """Within the block, every tower's MLP adapters are on (``enabled``) or off (plain CLIP)."""
        transformers = [_transformer(self.model, cast(Tower, tower)) for tower in self.mlp_adapter_modules]
        before = [t.parallel_adapters_active for t in transformers]
        for transformer in transformers:
            transformer.parallel_adapters_active = enabled
        try:
            yield
        finally:
            for transformer, state in zip(transformers, before, strict=True):
                transformer.parallel_adapters_active = state

    def set_gate_noise_at_eval(self, noisy: bool) -> None:
        """Whether routers add gate noise outside training (MOE4CL's official evaluation does)."""
        for adapter in self.mlp_adapter_modules.modules():
            if isinstance(adapter, ParallelAdapter):
                adapter.eval_noise = noisy


def mlp_adapter_parameter_count(width: int, blocks: int, experts: int, bottleneck: int, router: bool) -> int:
    """Closed form of one tower's count: per expert 2 b d + b + d, per router 2 d E."""
    per_expert = 2 * bottleneck * width + bottleneck + width
    return blocks * (experts * per_expert + (2 * width * experts if router else 0))


__all__ = [
    "Expert",
    "MLPAdapters",
    "ParallelAdapter",
    "Router",
    "mlp_adapter_parameter_count",
    "noisy_top_k_gates",
]
