"""The physical reference of the speed tools: a bare open_clip CLIP built with no code of this suite.

A strategy's images per second say little alone; set against what the same hardware does with the
same model in plain open_clip and torch, in the same process, on the same device, at the same
precision and batch size, they say how far the suite is from the machine. So this module imports
open_clip and torch only (``tests/tools/test_reference.py`` checks it): nothing from
``benchmarks.backbone`` (split attention, peft's LoRA, the parallel adapters) or ``strategies``,
whose costs the reference is there to expose. Its numbers (``measure_steps``, ``forward_pass``):

* ``forward``: ``model.encode_image`` under ``no_grad`` (at the eval batch size, by its caller);
* ``step``: one training step with the strategy's trainable set built plainly (``TrainableSet``):

  - ``lora_kv``: LoRA of the same rank on k and v of every block of the towers it trains, on
    open_clip's own fused ``nn.MultiheadAttention``, as a parametrization of ``in_proj_weight``
    (``W + scaling * cat([0, B_k A_k, B_v A_v])``: two small matmuls a block, ``KVLoRA``);
  - ``mlp_adapter``: a bottleneck adapter beside each block's MLP, a plain forward hook on
    ``block.mlp`` adding ``up(relu(down(x)))`` of its input (``BottleneckAdapter``); a mixture of E
    such experts adds a router on token 0 (``MixtureAdapter``: noisy top-k gates, each expert's
    output weighted by its gate), the same trainable set as the suite's;
  - ``full_visual``: every weight of the visual tower trains (MagMax);
  - ``forward``: nothing in the backbone trains (prompts, heads, modules of its own): a forward and
    the loss, no backward;

  then image features (and the prompts' text features when the text tower trains; once, without
  grad, when it does not), normalised, cosine logits x 100, cross-entropy, backward and an AdamW
  step (``foreach``) through a ``GradScaler`` at fp16 (autocast at fp16 and bf16);
* ``full_step``: full fine-tuning of the visual tower, the same loss and optimiser;
* ``frozen_backward``: a backward through every visual block that computes no weight gradient.
  The cheapest plain way: only ``visual.class_embedding`` (one vector) needs grad. It is token 0's
  input to the first block, and attention mixes every token, so the activations' gradients flow
  through every block, while no Linear or the patch convolution computes a weight (or pixel)
  gradient. No optimiser step.

``count_aten_ops`` counts the aten operators a function dispatches (a host-side count: what a GPU
pays a launch for, whatever the device), and ``step_ops`` counts one reference step's forward and
backward, to set beside the same count of a strategy's step.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import open_clip
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:  # open_clip's own classes, which it ships untyped: Any to the checker, where
    # nn.Module's annotation would make every read of a submodule Tensor | Module
    from open_clip import CLIP
    from open_clip.transformer import ResidualAttentionBlock

StepKind = Literal["lora_kv", "mlp_adapter", "full_visual", "forward"]
STEP_KINDS: tuple[str, ...] = ("lora_kv", "mlp_adapter", "full_visual", "forward")
TOWERS = ("visual", "text")
LOGIT_SCALE = 100.0  # CLIP's trained logit scale (exp(4.6052)), fixed
_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class TrainableSet:
    """What a strategy trains inside the backbone, described plainly: ``kind`` (module docstring),
    the ``towers`` it is in, a LoRA's ``rank`` and ``scaling`` (alpha / rank), an adapter's
    ``bottleneck``, and for a mixture its ``experts`` and the router's ``top_k`` (0: no router)."""

    kind: StepKind = "forward"
    towers: tuple[str, ...] = ()
    rank: int = 0
    scaling: float = 1.0
    bottleneck: int = 0
    experts: int = 1
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"kind must be one of {STEP_KINDS}, not {self.kind!r}")
        if not set(self.towers) <= set(TOWERS):
            raise ValueError(f"towers must be among {TOWERS}, not {self.towers!r}")
        if self.kind == "lora_kv" and self.rank < 1 or self.kind == "mlp_adapter" and self.bottleneck < 1:
            raise ValueError(f"a {self.kind} set needs a rank or bottleneck of at least 1: {self}")

    @property
    def text_trains(self) -> bool:
        return self.kind in ("lora_kv", "mlp_adapter") and "text" in self.towers


class KVLoRA(nn.Module):
    """A parametrization of a fused ``in_proj_weight`` ``[3d, d]`` (rows q, k, v): ``W + scaling *
    cat([0, B_k A_k, B_v A_v])``. A starts kaiming-uniform, B at zero, so a new one adds exactly 0."""

    def __init__(self, width: int, rank: int, scaling: float) -> None:
        super().__init__()
        self.width, self.scaling = width, scaling
        self.a_k = nn.Parameter(torch.empty(rank, width))
        self.a_v = nn.Parameter(torch.empty(rank, width))
        self.b_k = nn.Parameter(torch.zeros(width, rank))
        self.b_v = nn.Parameter(torch.zeros(width, rank))
        for a in (self.a_k, self.a_v):
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        zero = weight.new_zeros(self.width, self.width)
        delta = torch.cat([zero, self.b_k @ self.a_k, self.b_v @ self.a_v])
        return weight + self.scaling * delta


class BottleneckAdapter(nn.Module):
    """``up(relu(down(x)))``, up at zero: a new one adds exactly 0."""

    def __init__(self, width: int, bottleneck: int) -> None:
        super().__init__()
        self.down = nn.Linear(width, bottleneck)
        self.up = nn.Linear(bottleneck, width)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(F.relu(self.down(x)))


class MixtureAdapter(nn.Module):
    """E ``BottleneckAdapter`` experts and a router on token 0: ``sum_e g_e(x_0) expert_e(x)``, the
    gates a softmax over the ``top_k`` largest of ``x_0 W_g + noise * (softplus(x_0 W_n) + 0.01)``
    (Shazeer et al.'s noisy top-k; noise in training only), 0 for the other experts."""

    def __init__(self, width: int, experts: int, bottleneck: int, top_k: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(BottleneckAdapter(width, bottleneck) for _ in range(experts))
        self.w_gate = nn.Parameter(torch.zeros(width, experts))
        self.w_noise = nn.Parameter(torch.zeros(width, experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = x[:, 0]  # open_clip's transformers are batch-first: [B, L, d]
        logits = x0 @ self.w_gate.to(x0.dtype)
        if self.training:
            logits = logits + torch.randn_like(logits) * (F.softplus(x0 @ self.w_noise.to(x0.dtype)) + 0.01)
        top, index = logits.topk(self.top_k, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, index, top.softmax(dim=-1))[:, None, :]
        return sum(gates[..., e : e + 1] * expert(x) for e, expert in enumerate(self.experts))


def load_model(name: str, weights: str | Path | None = None, device: str | torch.device = "cpu") -> CLIP:
    """``open_clip.create_model(name, pretrained=None)``, with the state dict of ``weights`` (a
    safetensors file in open_clip's own layout) if given; frozen, in eval mode (CLIP has no dropout,
    so the mode changes no number), on ``device``. ``name`` must be known to open_clip (the suite's
    tiny model is, once ``benchmarks.backbone`` has been imported)."""
    if name not in open_clip.list_models():
        raise ValueError(f"open_clip does not know the model {name!r}")
    root = logging.getLogger()  # open_clip warns through it about the random init asked for here
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        model = open_clip.create_model(name, pretrained=None)
    finally:
        root.setLevel(level)
    if weights is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(weights)))
    return model.requires_grad_(False).eval().to(device)


def tokenize(name: str, prompts: list[str], device: str | torch.device = "cpu") -> torch.Tensor:
    """open_clip's tokens of ``prompts`` for model ``name``."""
    return open_clip.get_tokenizer(name)(prompts).to(device)


def _blocks(model: CLIP, tower: str) -> list[ResidualAttentionBlock]:
    transformer = model.visual.transformer if tower == "visual" else model.transformer
    return list(transformer.resblocks)


def add_kv_lora(model: CLIP, towers: tuple[str, ...], rank: int, scaling: float = 1.0) -> list[nn.Parameter]:
    """Register a ``KVLoRA`` on ``in_proj_weight`` of every block of ``towers``; returns its
    parameters (4 a block: A_k, A_v, B_k, B_v)."""
    params = []
    for tower in towers:
        for block in _blocks(model, tower):
            attn = block.attn
            if not isinstance(attn, nn.MultiheadAttention):
                raise ValueError(f"{tower} blocks use {type(attn).__name__}, not nn.MultiheadAttention")
            lora = KVLoRA(attn.embed_dim, rank, scaling).to(attn.in_proj_weight.device)
            parametrize.register_parametrization(attn, "in_proj_weight", lora)
            params += list(lora.parameters())
    return params


def add_mlp_adapters(
    model: CLIP, towers: tuple[str, ...], bottleneck: int, experts: int = 1, top_k: int = 0
) -> list[nn.Parameter]:
    """A ``BottleneckAdapter`` (a ``MixtureAdapter`` of ``experts`` when ``top_k`` names a router) on
    every block of ``towers``: a forward hook on ``block.mlp`` that adds the adapter of the MLP's
    input to its output. Returns the adapters' parameters."""
    params = []
    for tower in towers:
        for block in _blocks(model, tower):
            width = block.mlp.c_fc.in_features
            adapter = (
                MixtureAdapter(width, experts, bottleneck, top_k)
                if top_k
                else BottleneckAdapter(width, bottleneck * experts)  # experts without a router: one sum
            ).to(block.mlp.c_fc.weight.device)
            # a child of the block (whose forward names its children), never of the MLP: an
            # nn.Sequential runs every child it holds
            block.mlp_adapter = adapter

            def add(_module: nn.Module, args: tuple, output: torch.Tensor, adapter=adapter) -> torch.Tensor:
                return output + adapter(args[0]).to(output.dtype)

            block.mlp.register_forward_hook(add)
            params += list(adapter.parameters())
    return params


def prepare(model: CLIP, kind: str, trainable: TrainableSet | None = None) -> tuple[CLIP, list]:
    """A copy of the frozen ``model`` made ready for one of the reference's steps, and what its
    optimiser holds: ``kind`` is ``step`` (``trainable``'s set), ``full_step`` or
    ``frozen_backward`` (module docstring)."""
    model = copy.deepcopy(model)
    if kind == "full_step":
        model.visual.requires_grad_(True)
        return model, list(model.visual.parameters())
    if kind == "frozen_backward":
        model.visual.class_embedding.requires_grad_(True)
        return model, []
    if kind != "step" or trainable is None:
        raise ValueError(f"kind must be step (with a trainable set), full_step or frozen_backward: {kind!r}")
    if trainable.kind == "lora_kv":
        return model, add_kv_lora(model, trainable.towers, trainable.rank, trainable.scaling)
    if trainable.kind == "mlp_adapter":
        return model, add_mlp_adapters(
            model, trainable.towers, trainable.bottleneck, trainable.experts, trainable.top_k
        )
    if trainable.kind == "full_visual":
        model.visual.requires_grad_(True)
        return model, list(model.visual.parameters())
    return model, []


def _autocast(precision: str, device: torch.device):
    """Autocast at a half precision; none otherwise (fp32, and tf32, whose matmul setting is the
    process's, so the reference computes as the strategy beside it does)."""
    if precision not in _AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_AUTOCAST[precision])


def _device_of(model: CLIP) -> torch.device:
    return model.visual.class_embedding.device


def _features(encode: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, precision: str):
    with _autocast(precision, inputs.device):
        features = encode(inputs)
    return F.normalize(features.float(), dim=-1)


def forward_pass(model: CLIP, precision: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``encode_image`` of a batch under ``no_grad`` at ``precision``: the forward reference."""

    @torch.no_grad()
    def forward(images: torch.Tensor) -> torch.Tensor:
        with _autocast(precision, images.device):
            return model.encode_image(images)

    return forward


def loss_pass(
    model: CLIP,
    images: torch.Tensor,
    targets: torch.Tensor,
    tokens: torch.Tensor,
    precision: str,
    text_trains: bool,
) -> Callable[[], torch.Tensor]:
    """The loss of one step: image features (and text features of ``tokens`` when the text tower
    trains; else once, here, without grad), normalised, cosine logits x 100, cross-entropy."""
    fixed_text = None
    if not text_trains:
        with torch.no_grad():
            fixed_text = _features(model.encode_text, tokens, precision)

    def loss() -> torch.Tensor:
        # one computation of each parametrized weight per forward, however often attention reads it
        with parametrize.cached():
            image = _features(model.encode_image, images, precision)
            text = fixed_text if fixed_text is not None else _features(model.encode_text, tokens, precision)
        return F.cross_entropy(LOGIT_SCALE * image @ text.T, targets)

    return loss


def training_step(
    model: CLIP,
    params: list[nn.Parameter],
    images: torch.Tensor,
    targets: torch.Tensor,
    tokens: torch.Tensor,
    precision: str,
    text_trains: bool = False,
    lr: float = 1e-5,
) -> Callable[[], None]:
    """One step as a closure: the loss (``loss_pass``), its backward where anything needs grad, and
    an AdamW step (``foreach``) over ``params`` through a ``GradScaler`` (enabled at fp16)."""
    device = images.device
    loss_of = loss_pass(model, images, targets, tokens, precision, text_trains)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.1, foreach=True) if params else None

    def step() -> None:
        loss = loss_of()
        if not loss.requires_grad:  # nothing in the backbone trains: a forward alone
            return
        scaler.scale(loss).backward()
        if optimizer is None:  # frozen_backward: no weight to step
            model.visual.class_embedding.grad = None
            return
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


def _wait_for(device: torch.device) -> None:
    """GPU kernels run asynchronously: a timestamp on CUDA waits for them to end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(function: Callable[[], object], images: int, warmup: int, steps: int, device) -> float:
    """``images`` x ``steps`` over the wall seconds of ``steps`` calls of ``function``, after
    ``warmup`` untimed ones."""
    device = torch.device(device)
    for _ in range(warmup):
        function()
    _wait_for(device)
    start = time.perf_counter()
    for _ in range(steps):
        function()
    _wait_for(device)
    return images * steps / (time.perf_counter() - start)


def measure_steps(
    model: CLIP,
    trainable: TrainableSet,
    images: torch.Tensor,
    targets: torch.Tensor,
    tokens: torch.Tensor,
    precision: str,
    warmup: int,
    steps: int,
) -> dict:
    """Images/s of the reference's three steps on one batch (module docstring): ``step`` with
    ``trainable``'s set, ``full_step`` and ``frozen_backward``; each on its own copy of ``model``."""
    out: dict = {"step_kind": trainable.kind}
    for name, kind in (("step", "step"), ("full_step", "full_step"), ("frozen_backward", "frozen_backward")):
        copy_, params = prepare(model, kind, trainable)
        text_trains = trainable.text_trains if kind == "step" else False
        step = training_step(copy_, params, images, targets, tokens, precision, text_trains)
        out[f"{name}_images_per_second"] = images_per_second(
            step, len(images), max(1, warmup), steps, images.device
        )
        del copy_, params, step
    return out


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_aten_ops(function: Callable[[], object]) -> collections.Counter:
    """The aten operators ``function`` dispatches, by name (``func.overloadpacket``: ``aten.mm``
    whatever its overload), autograd's backward included when it runs inside ``function``."""
    with _CountOps() as mode:
        function()
    return mode.counts


def step_ops(
    model: CLIP,
    trainable: TrainableSet,
    images: torch.Tensor,
    targets: torch.Tensor,
    tokens: torch.Tensor,
    precision: str,
) -> collections.Counter:
    """The aten ops of one reference step's forward and backward (no optimiser) with ``trainable``'s
    set, after one warm-up call (lazy initialisations are not counted); a ``forward`` set counts the
    loss alone."""
    copy_, params = prepare(model, "step", trainable)
    loss_of = loss_pass(copy_, images, targets, tokens, precision, trainable.text_trains)

    def forward_backward() -> None:
        loss = loss_of()
        if loss.requires_grad:
            loss.backward()
        for param in params:
            param.grad = None

    forward_backward()
    return count_aten_ops(forward_backward)


__all__ = [
    "STEP_KINDS",
    "BottleneckAdapter",
    "KVLoRA",
    "TrainableSet",
    "add_kv_lora",
    "add_mlp_adapters",
    "count_aten_ops",
    "forward_pass",
    "images_per_second",
    "load_model",
    "loss_pass",
    "measure_steps",
    "prepare",
    "step_ops",
    "tokenize",
    "training_step",
]
