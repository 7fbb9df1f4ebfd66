"""Golden outputs of MoE-Adapters' official CIL code (``JiazuoYu/MoE-Adapters4CL``, the suite's ``moe4cl``).

The official mixture of adapters lives inside ``cil/clip/model.py``'s ``ResidualAttentionBlock``
(router, noisy top-k gating, sparse dispatch to the experts of ``cil/clip/adapter.py``), so the
smallest official unit is that block. It is built at the tiny CLIP's visual width, its parameters
copied from the suite's own block (an open_clip ``ResidualAttentionBlock`` with the suite's
``ParallelAdapter`` hooked on, ``SuiteBlock`` below), and run on seeded tokens. The gate noise and
the experts' dropout masks are inputs of the fixture: the official module's ``torch.randn_like``
and ``nn.functional.dropout`` are replaced, for that module only, by functions returning the given
noise and applying the given masks, so the suite's side can be fed the same draws.

Components:

* ``moe4cl.block``: gates, expert outputs and block output in three modes: ``train`` (noise and
  dropout on; gradients of every trainable tensor and of the input), ``eval`` (noise and dropout
  off: the suite's default evaluation) and ``eval_noisy`` (dropout off, noise on: what the
  official evaluation does, since the block reads its training flag once, at construction).
* ``moe4cl.gates``: ``noisy_top_k_gating`` alone over a batch, with and without noise, at the
  official k = 2 and at k = 1 (the suite's router takes any k), with the official ``load`` and
  ``importance`` and their ``cv_squared``; the official forward computes importance and load and
  never uses them (no balance loss).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import torch
from open_clip.transformer import QuickGELU, Transformer
from torch import nn

from benchmarks.backbone.mlp_adapters import MLPAdapters, ParallelAdapter, Router
from tests.official.goldens import component
from tests.official.goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)

OFFICIAL = Official(
    repository="JiazuoYu/MoE-Adapters4CL",
    commit="4572d97d28d3a7b45e8808bee1d3c64263f425f2",
    folder="MoE-Adapters4CL",
)
# The tiny CLIP's visual tower (benchmarks/model_configs/tiny-clip-32.json: width 128, head width 32;
# 32-pixel images in 8-pixel patches: 16 patches + [CLS]).
WIDTH, HEADS, TOKENS = 128, 4, 17
# MOE4CLConfig's defaults, which are the official values (cil/clip/model.py:289-291, 310-314).
EXPERTS, BOTTLENECK, DROPOUT, SCALE, TOP_K = 2, 64, 0.1, 0.1, 2
BATCH, GATE_BATCH = 4, 16
SEED = 41
MODES = ("train", "eval", "eval_noisy")
_PACKAGE = "moe_adapters_official_clip"  # cil/clip, imported under a name nothing else uses


class SuiteBlock(nn.Module, MLPAdapters):
    """The suite's side: one open_clip residual block (batch first, QuickGELU, as the tiny CLIP's
    visual tower) with the suite's parallel adapters added by ``MLPAdapters.add_mlp_adapters``, the
    same hooks as in ``CLIPBackbone``. ``forward`` runs the block on ``[B, L, d]`` tokens."""

    def __init__(self, width: int, heads: int, **adapters) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.visual = nn.Module()
        self.model.visual.transformer = Transformer(width, 1, heads, act_layer=QuickGELU, batch_first=True)
        self.model.logit_scale = nn.Parameter(torch.zeros(()))
        self.mlp_adapter_modules = nn.ModuleDict()
        self.add_mlp_adapters("visual", **adapters)

    @property
    def block(self) -> nn.Module:
        return self.model.visual.transformer.resblocks[0]

    @property
    def adapter(self) -> ParallelAdapter:
        return self.mlp_adapter_modules["visual"][0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def tensors(self) -> dict[str, torch.Tensor]:
        """``block.*`` (open_clip's names) and ``adapter.*`` (the suite's names)."""
        out = {f"block.{k}": v for k, v in self.block.state_dict().items()}
        out.update({f"adapter.{k}": v for k, v in self.adapter.state_dict().items()})
        return out

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.block.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("block.")})
        self.adapter.load_state_dict({k[8:]: v for k, v in tensors.items() if k.startswith("adapter.")})


def suite_block(seed: int = SEED) -> SuiteBlock:
    """The suite's block with MOE4CL's adapters, seeded; routers, up-projections and the block's own
    weights moved off their trivial initial values by ``looks_trained``."""
    torch.manual_seed(seed)
    host = SuiteBlock(
        WIDTH,
        HEADS,
        experts=EXPERTS,
        bottleneck=BOTTLENECK,
        dropout=DROPOUT,
        scale=SCALE,
        router=True,
        top_k=TOP_K,
    )
    looks_trained(host, torch.Generator().manual_seed(seed + 1))
    return host


def suite_router(seed: int = SEED, top_k: int = TOP_K) -> Router:
    torch.manual_seed(seed)
    router = Router(WIDTH, EXPERTS, top_k)
    looks_trained(router, torch.Generator().manual_seed(seed + 1), scale=0.1)
    return router


# ---------------------------------------------------------------------------------- the official side
class _Override:
    """A module stand-in: the attributes given, the rest from ``base``."""

    def __init__(self, base, **attributes) -> None:
        self._base = base
        self.__dict__.update(attributes)

    def __getattr__(self, name: str):
        return getattr(self._base, name)


class _Draws:
    """The gate noise and dropout masks the official code would draw, given instead."""

    def __init__(self) -> None:
        self.noise: list[torch.Tensor] = []
        self.masks: list[torch.Tensor] = []
        self.dropout_p: list[float] = []

    def randn_like(self, like: torch.Tensor) -> torch.Tensor:
        noise = self.noise.pop(0)
        assert noise.shape == like.shape, (noise.shape, like.shape)
        return noise.to(like)

    def dropout(self, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        if not training:
            return x
        mask = self.masks.pop(0)
        assert mask.shape == x.shape, (mask.shape, x.shape)
        self.dropout_p.append(float(p))
        return x * mask.to(x) / (1 - p)


@contextlib.contextmanager
def _official_modules(checkout: Path) -> Iterator[tuple[object, _Draws]]:
    package = stub_module(_PACKAGE, __path__=[str(checkout / "cil" / "clip")])
    with official_import_path(checkout, {_PACKAGE: package}) as load:
        adapter = load("cil/clip/adapter.py", f"{_PACKAGE}.adapter")
        model = load("cil/clip/model.py", f"{_PACKAGE}.model")
        draws = _Draws()
        model.torch = _Override(torch, randn_like=draws.randn_like)
        adapter.nn = _Override(nn, functional=_Override(nn.functional, dropout=draws.dropout))
        yield model, draws


LOADING = (
    "cil/clip/adapter.py and cil/clip/model.py imported as submodules of a stub package (cil/clip's "
    "__init__.py, which loads clip.py and its downloads, is not run); in model.py's namespace `torch` "
    "is torch with randn_like returning the fixture's input.*noise (the gate noise), in adapter.py's "
    "`nn.functional.dropout` applies the fixture's input.*mask (keep mask, scaled by 1/(1-p) with the "
    "official p); nothing else changed. The block's print is silenced."
)


def _official_block(model, host: SuiteBlock) -> nn.Module:
    with contextlib.redirect_stdout(io.StringIO()):
        block = model.ResidualAttentionBlock(WIDTH, HEADS, None, "image")
    state = block.state_dict()
    mapped = {k: v for k, v in host.block.state_dict().items()}
    a = host.adapter.state_dict()
    mapped["router_list.0"] = a["router.w_gate"]
    mapped["w_noise_list.0"] = a["router.w_noise"]
    for e in range(EXPERTS):
        for ours, theirs in (("down", "down_proj"), ("up", "up_proj")):
            for kind in ("weight", "bias"):
                mapped[f"adaptmlp_list.{e}.{theirs}.{kind}"] = a[f"experts.{e}.{ours}.{kind}"]
                if e == EXPERTS - 1:  # the loop's attribute `adaptmlp` is the last expert, registered twice
                    mapped[f"adaptmlp.{theirs}.{kind}"] = a[f"experts.{e}.{ours}.{kind}"]
    missing = set(state) - set(mapped) - {"mean", "std"}
    extra = set(mapped) - set(state)
    if missing or extra:
        raise RuntimeError(f"parameter mapping: missing {missing}, extra {extra}")
    state.update(mapped)
    block.load_state_dict(state)
    return block


def _official_grads(block: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients under the suite's names."""
    grads = {
        "adapter.router.w_gate": block.router_list[0].grad,
        "adapter.router.w_noise": block.w_noise_list[0].grad,
    }
    for e in range(EXPERTS):
        for ours, theirs in (("down", "down_proj"), ("up", "up_proj")):
            for kind in ("weight", "bias"):
                linear = getattr(block.adaptmlp_list[e], theirs)
                grads[f"adapter.experts.{e}.{ours}.{kind}"] = getattr(linear, kind).grad
    return grads


@component("moe4cl.block", OFFICIAL)
def block_golden(checkout: Path) -> Golden:
    host = suite_block()
    g = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {f"param.{k}": v.clone() for k, v in host.tensors().items()}
    x = torch.randn(BATCH, TOKENS, WIDTH, generator=g)
    tensors["input.x"] = x
    tensors["input.cotangent"] = torch.randn(BATCH, TOKENS, WIDTH, generator=g)
    tensors["input.train.noise"] = torch.randn(BATCH, EXPERTS, generator=g)
    tensors["input.eval_noisy.noise"] = torch.randn(BATCH, EXPERTS, generator=g)
    for e in range(EXPERTS):
        keep = torch.rand(BATCH, TOKENS, BOTTLENECK, generator=g) >= DROPOUT
        tensors[f"input.train.mask.{e}"] = keep.float()

    with _official_modules(checkout) as (model, draws):
        block = _official_block(model, host)
        gates: list[torch.Tensor] = []
        gating = block.noisy_top_k_gating

        def recorded_gating(*args, **kwargs):
            out = gating(*args, **kwargs)
            gates.append(out[0].detach().clone())
            return out

        block.noisy_top_k_gating = recorded_gating
        expert_out: dict[int, torch.Tensor] = {}
        for e, expert in enumerate(block.adaptmlp_list):
            expert.register_forward_hook(lambda _m, _a, out, e=e: expert_out.__setitem__(e, out.detach()))
        for mode in MODES:
            block.train(mode == "train")
            block.is_train = mode != "eval"  # the official flag; the quirk keeps it True at evaluation
            if mode != "eval":
                draws.noise.append(tensors[f"input.{mode}.noise"])
            if mode == "train":
                draws.masks.extend(tensors[f"input.train.mask.{e}"] for e in range(EXPERTS))
            block.zero_grad(set_to_none=True)
            xin = x.clone().requires_grad_(mode == "train")
            with torch.set_grad_enabled(mode == "train"):
                out = block(xin.permute(1, 0, 2)).permute(1, 0, 2)  # the official block is length-first
            if draws.noise or draws.masks:
                raise RuntimeError(f"{mode}: the official code drew fewer samples than given")
            tensors[f"output.{mode}.gates"] = gates.pop()
            tensors[f"output.{mode}.block"] = out.detach().clone()
            for e in range(EXPERTS):
                tensors[f"output.{mode}.expert.{e}"] = expert_out.pop(e).clone()
            if mode == "train":
                (out * tensors["input.cotangent"]).sum().backward()
                tensors["grad.train.input.x"] = xin.grad.clone()
                for name, grad in _official_grads(block).items():
                    tensors[f"grad.train.{name}"] = grad.clone()
        if draws.dropout_p != [DROPOUT] * EXPERTS:
            raise RuntimeError(f"official dropout p {draws.dropout_p}")
    return Golden(
        component="moe4cl.block",
        official=OFFICIAL,
        file="cil/clip/model.py",
        function="ResidualAttentionBlock.forward (with noisy_top_k_gating, SparseDispatcher, "
        "cil/clip/adapter.py Adapter)",
        loading=LOADING,
        seed=SEED,
        sizes={"batch": BATCH, "tokens": TOKENS, "width": WIDTH, "heads": HEADS, "experts": EXPERTS},
        tensors=tensors,
        notes=(
            "Visual block (no attention mask) at the tiny CLIP's width, tokens batch first in the "
            "fixture (the official block runs length-first; permuted). Parameters: the suite's block "
            "(open_clip ResidualAttentionBlock, QuickGELU) and ParallelAdapter, seeded, looks_trained "
            "(scale 0.05) on all, copied into the official block (router_list.0 = w_gate, "
            "w_noise_list.0 = w_noise, adaptmlp_list.e.{down,up}_proj = experts.e.{down,up}). Modes: "
            "train = module.train(), is_train True, noise input.train.noise, masks input.train.mask.e; "
            "eval = module.eval(), is_train False (no noise); eval_noisy = module.eval(), is_train "
            "True (the official evaluation: is_train is read from global_is_train at construction, "
            "model.py:15,288, so forward's is_train=False never reaches it), noise "
            "input.eval_noisy.noise. Gradients of the loss sum(block output * input.cotangent) in "
            "train mode, under the suite's parameter names."
        ),
    )


@component("moe4cl.gates", OFFICIAL)
def gates_golden(checkout: Path) -> Golden:
    router = suite_router()
    g = torch.Generator().manual_seed(SEED + 2)
    tensors: dict[str, torch.Tensor] = {f"param.{k}": v.clone() for k, v in router.state_dict().items()}
    x = torch.randn(GATE_BATCH, WIDTH, generator=g)
    tensors["input.x"] = x
    tensors["input.cotangent"] = torch.randn(GATE_BATCH, EXPERTS, generator=g)
    cases = {"train_k2": (True, 2), "eval_k2": (False, 2), "train_k1": (True, 1), "eval_k1": (False, 1)}
    with _official_modules(checkout) as (model, draws):
        host = suite_block()
        block = _official_block(model, host)
        w_gate = router.w_gate.detach().clone().requires_grad_(True)
        w_noise = router.w_noise.detach().clone().requires_grad_(True)
        for case, (train, k) in cases.items():
            block.top_k = k
            if train:
                noise = torch.randn(GATE_BATCH, EXPERTS, generator=g)
                tensors[f"input.{case}.noise"] = noise
                draws.noise.append(noise)
            w_gate.grad = w_noise.grad = None
            xin = x.clone().requires_grad_(True)
            gates, load = block.noisy_top_k_gating(xin, train, w_gate, w_noise)
            if draws.noise:
                raise RuntimeError(f"{case}: the official gating drew no noise")
            importance = gates.sum(0)  # as the official forward (model.py:424)
            tensors[f"output.{case}.gates"] = gates.detach().clone()
            tensors[f"output.{case}.load"] = load.detach().clone()
            tensors[f"output.{case}.importance"] = importance.detach().clone()
            tensors[f"output.{case}.cv_squared_importance"] = (
                block.cv_squared(importance).detach().reshape(())
            )
            tensors[f"output.{case}.cv_squared_load"] = block.cv_squared(load).detach().reshape(())
            (gates * tensors["input.cotangent"]).sum().backward()
            for name, tensor in (("w_gate", w_gate), ("w_noise", w_noise), ("x", xin)):
                if tensor.grad is not None:  # w_noise has none without noise
                    tensors[f"grad.{case}.{name}"] = tensor.grad.clone()
    return Golden(
        component="moe4cl.gates",
        official=OFFICIAL,
        file="cil/clip/model.py",
        function="ResidualAttentionBlock.noisy_top_k_gating (and cv_squared)",
        loading=LOADING,
        seed=SEED,
        sizes={"batch": GATE_BATCH, "width": WIDTH, "experts": EXPERTS},
        tensors=tensors,
        notes=(
            "Parameters: the suite's Router (w_gate, w_noise), seeded, looks_trained (scale 0.1), "
            "passed as the official method's w_gate and w_noise. Cases: train_k2 / eval_k2 (the "
            "official k = 2 = experts, model.py:290), train_k1 / eval_k1 (block.top_k = 1, not an "
            "official setting: checks the suite's general top-k; the official load is then "
            "_prob_in_top_k's). importance = gates.sum(0) as the official forward (model.py:424); "
            "neither importance nor load is used by the official code (no balance loss): forward "
            "discards them. Gradients of sum(gates * input.cotangent)."
        ),
    )
