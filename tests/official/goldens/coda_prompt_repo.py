"""Golden outputs of the CODA-Prompt codebase (GT-RIPL/CODA-Prompt): the prefix attention of
``models/vit.py`` and the L2P and DualPrompt modules of ``models/zoo.py``, against the suite's
``benchmarks/backbone/attention.py`` and ``strategies/{l2p_pp,dualprompt}.py``; its CodaPrompt module
is ``coda_prompt_method``'s, and the training loops ``prompt_loops``', both on what is shared here.

Each generator builds the suite's component seeded (the tiny CLIP: width 128, 4 heads, 4 visual
blocks, query dimension 256), copies its tensors into the official module, runs the official
forward (per block, as ``VisionTransformer.forward`` calls it, summing the prompt losses) and
records outputs and the gradients of every trainable tensor. Prompts reach a scalar through fixed
random "probe" tensors (``sum(probe * prefix)``), so the gradient of each prompt is that of a
linear read-out of the prefix it joins; the key loss is added to the same scalar. Intermediates the
official forward does not return (the top-k indices, CODA's alpha, Gram-Schmidt's random draws)
are recorded with a ``TorchFunctionMode`` that watches ``torch.topk`` / ``torch.einsum`` /
``torch.randn_like`` while the official code runs; nothing of the official code is changed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from strategies.settings import RunSettings
from tests.official.goldens import component
from tests.official.goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)

CODA = Official("GT-RIPL/CODA-Prompt", "6417d4f68754be68b697c7ca2323ee61e791e1a3", "CODA-Prompt")

BATCH = 4
LAYERS = 4  # blocks of the tiny CLIP's visual tower; the official modules are called for blocks 0..3
TIMM_STUBS = (
    "timm, timm.models, timm.models.vision_transformer (_cfg, PatchEmbed), timm.models.registry "
    "(register_model), timm.models.layers (trunc_normal_, DropPath), timm.models.helpers (named_apply, "
    "adapt_input_conv): stubs, imported by models/vit.py at the top and unused by the code run here"
)
LOADING = (
    f"models/vit.py as models.vit and models/zoo.py as models.zoo under a stub package 'models' "
    f"(its real __init__ is not run); {TIMM_STUBS}; torchvision and numpy are the real ones"
)


# ---------------------------------------------------------------------- loading the official code
def timm_stubs() -> dict:
    def unused(*args, **kwargs):
        raise RuntimeError("a timm stub of the golden generator was called")

    return {
        "timm": stub_module("timm"),
        "timm.models": stub_module("timm.models"),
        "timm.models.vision_transformer": stub_module(
            "timm.models.vision_transformer", _cfg=unused, PatchEmbed=unused
        ),
        "timm.models.registry": stub_module("timm.models.registry", register_model=lambda fn: fn),
        "timm.models.layers": stub_module("timm.models.layers", trunc_normal_=unused, DropPath=unused),
        "timm.models.helpers": stub_module(
            "timm.models.helpers", named_apply=unused, adapt_input_conv=unused
        ),
    }


def official_modules(checkout: Path):
    """``official_import_path`` with the stubs above and a stub package ``models`` over the
    checkout's folder (``zoo.py`` imports ``.vit``)."""
    stubs = timm_stubs()
    stubs["models"] = stub_module("models", __path__=[str(checkout / "models")])
    return official_import_path(checkout, stubs)


class TorchCallRecorder(TorchFunctionMode):
    """Keeps what ``torch.topk`` (indices), ``torch.einsum`` (operands) and ``torch.randn_like``
    (draws) return or receive while the official code runs."""

    def __init__(self) -> None:
        super().__init__()
        self.topk: list[torch.Tensor] = []
        self.einsum: list[tuple[str, tuple]] = []
        self.draws: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.topk:
            self.topk.append(result.indices.detach().clone())
        elif func is torch.einsum:
            self.einsum.append((args[0], tuple(a.detach().clone() for a in args[1:])))
        elif func is torch.randn_like:
            self.draws.append(result.detach().clone())
        return result


# ---------------------------------------------------------------------- the suite's components
def _tiny_clip(seed: int):
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    torch.manual_seed(seed)
    return create_clip(BackboneSpec(TINY_MODEL, None))


def suite_strategy(cls, n_classes: int, seed: int, **config):
    """The suite's strategy ``cls`` on the randomly initialised tiny CLIP, seeded (the tests build
    theirs with this function too)."""
    backbone = _tiny_clip(seed)
    torch.manual_seed(seed)
    return cls(
        backbone=backbone,
        class_names=[f"class {c}" for c in range(n_classes)],
        config=cls.Config(**config),
        settings=RunSettings(show_progress=False),
    )


def start_task(strategy, task: int, classes: list[int]) -> None:
    """What ``CLIPStrategy.model_adaptation`` does at a task's start, without Avalanche."""
    strategy.current_classes = classes
    strategy.setup_task(task, classes)


def finish_task(strategy, task: int, classes: list[int]) -> None:
    """What ``CLIPStrategy._after_training_exp`` records at a task's end."""
    strategy.task_classes.append(classes)
    strategy.seen_classes = strategy.seen_classes + classes
    strategy.finish_task(task, classes)


def probe_tensor(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


def prefix_readout(prefix: tuple[torch.Tensor, torch.Tensor], probe_keys, probe_values) -> torch.Tensor:
    return (prefix[0] * probe_keys).sum() + (prefix[1] * probe_values).sum()


def grad_or_zeros(parameter: nn.Parameter) -> torch.Tensor:
    return torch.zeros_like(parameter) if parameter.grad is None else parameter.grad.detach().clone()


# ---------------------------------------------------------------------- prefix attention
@component("prefix_attention", CODA)
def prefix_attention(checkout: Path) -> Golden:
    seed, batch, tokens, prefix = 11, 3, 5, 4
    backbone = _tiny_clip(seed)
    attention = backbone.model.visual.transformer.resblocks[0].attn
    generator = torch.Generator().manual_seed(seed)
    looks_trained(attention, generator)  # zero biases otherwise
    width, heads = attention.q_proj.in_features, attention.num_heads
    params = {
        f"param.{name}": tensor.detach().clone()
        for name, tensor in attention.named_parameters()
        if name.split(".")[0] in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    inputs = {
        "input.tokens": torch.randn(batch, tokens, width, generator=generator),
        "input.prefix_keys": torch.rand(batch, prefix, width, generator=generator),  # prompts: U[0, 1)
        "input.prefix_values": torch.rand(batch, prefix, width, generator=generator),
        "input.grad_output": torch.randn(batch, tokens, width, generator=generator),
    }
    with official_modules(checkout) as load:
        vit = load("models/vit.py", "models.vit")
        official = vit.Attention(width, num_heads=heads, qkv_bias=True)
        with torch.no_grad():
            official.qkv.weight.copy_(
                torch.cat([params[f"param.{p}_proj.weight"] for p in "qkv"])  # [3 width, width]
            )
            official.qkv.bias.copy_(torch.cat([params[f"param.{p}_proj.bias"] for p in "qkv"]))
            official.proj.weight.copy_(params["param.out_proj.weight"])
            official.proj.bias.copy_(params["param.out_proj.bias"])
        official.eval()
        x, pk, pv = (
            inputs[f"input.{n}"].clone().requires_grad_() for n in ("tokens", "prefix_keys", "prefix_values")
        )
        out = official(x, prompt=[pk, pv])
        (out * inputs["input.grad_output"]).sum().backward()
    qkv_w, qkv_b = official.qkv.weight.grad, official.qkv.bias.grad
    grads = {
        "grad.tokens": x.grad,
        "grad.prefix_keys": pk.grad,
        "grad.prefix_values": pv.grad,
        "grad.out_proj.weight": official.proj.weight.grad,
        "grad.out_proj.bias": official.proj.bias.grad,
    }
    for i, p in enumerate("qkv"):
        grads[f"grad.{p}_proj.weight"] = qkv_w[i * width : (i + 1) * width]
        grads[f"grad.{p}_proj.bias"] = qkv_b[i * width : (i + 1) * width]
    return Golden(
        component="prefix_attention",
        official=CODA,
        file="models/vit.py",
        function="Attention.forward(x, prompt=[pk, pv])",
        loading=LOADING,
        seed=seed,
        sizes={"batch": batch, "tokens": tokens, "prefix": prefix, "width": width, "heads": heads},
        tensors={**inputs, **params, "output.attention": out.detach(), **grads},
        notes=(
            "Suite side: visual block 0's SplitAttention of the tiny CLIP (random init, then "
            "looks_trained(seed)), called as open_clip's block calls it (batch first, no mask) inside "
            "backbone.visual_prefix({0: (keys, values)}). Official: Attention(128, num_heads=4, "
            "qkv_bias=True) with qkv = cat(q, k, v) and proj = out_proj. Gradients of the scalar "
            "sum(output * grad_output)."
        ),
    )


# ---------------------------------------------------------------------- L2P++
L2P_CONFIG = dict(pool_size=10, prompt_length=8, top_k=5, prompt_layer=0, key_loss="all_pairs")


@component("l2p_pp.selection", CODA)
def l2p_selection(checkout: Path) -> Golden:
    from strategies.methods.l2p_pp import L2PPlusPlus

    seed = 21
    strategy = suite_strategy(L2PPlusPlus, 6, seed, **L2P_CONFIG)
    pool, width = strategy.pool, strategy.visual_width
    key_dim, top_k, half = pool.keys.shape[1], L2P_CONFIG["top_k"], L2P_CONFIG["prompt_length"] // 2
    generator = torch.Generator().manual_seed(seed)
    inputs = {
        "input.query": torch.randn(BATCH, key_dim, generator=generator),
        "input.probe_keys": probe_tensor(generator, BATCH, top_k * half, width),
        "input.probe_values": probe_tensor(generator, BATCH, top_k * half, width),
    }
    params = {
        "param.pool.prompts": pool.prompts.detach().clone(),
        "param.pool.keys": pool.keys.detach().clone(),
    }
    out: dict[str, torch.Tensor] = {}
    with official_modules(checkout) as load:
        load("models/vit.py", "models.vit")
        zoo = load("models/zoo.py", "models.zoo")
        # prompt_param = (pool, length, -1): one prompt layer, block 0 (experiments/cifar-100.sh: 30 20 -1)
        official = zoo.L2P(width, 1, [L2P_CONFIG["pool_size"], L2P_CONFIG["prompt_length"], -1], key_dim)
        assert official.top_k == top_k and official.e_layers == [0]
        with torch.no_grad():
            official.e_p_0.copy_(params["param.pool.prompts"])
            official.e_k_0.copy_(params["param.pool.keys"])
        for mode, train in (("train", True), ("eval", False)):
            recorder = TorchCallRecorder()
            loss = torch.zeros(())
            prefix = None
            with recorder:
                for layer in range(LAYERS):
                    p_list, layer_loss, _ = official.forward(inputs["input.query"], layer, None, train=train)
                    loss = loss + layer_loss
                    if p_list is not None:
                        assert prefix is None and layer == 0
                        prefix = p_list
            if train:
                (
                    loss + prefix_readout(prefix, inputs["input.probe_keys"], inputs["input.probe_values"])
                ).backward()
            (selection,) = recorder.topk
            out[f"output.{mode}.selection"] = selection
            out[f"output.{mode}.prefix_keys"] = prefix[0].detach()
            out[f"output.{mode}.prefix_values"] = prefix[1].detach()
            out[f"output.{mode}.key_loss"] = torch.as_tensor(loss).detach()
    grads = {
        "grad.pool.prompts": grad_or_zeros(official.e_p_0),
        "grad.pool.keys": grad_or_zeros(official.e_k_0),
    }
    return Golden(
        component="l2p_pp.selection",
        official=CODA,
        file="models/zoo.py",
        function="L2P (DualPrompt.forward with task_id_bootstrap=False, top_k=5)",
        loading=LOADING,
        seed=seed,
        sizes={"batch": BATCH, "pool": 10, "length": 8, "top_k": top_k, "width": width, "key_dim": key_dim},
        tensors={**inputs, **params, **out, **grads},
        notes=(
            f"Suite: L2PPlusPlus on the tiny CLIP, options {L2P_CONFIG}; its pool as built (uniform "
            "[0, 1), as the official tensor_prompt). Official: L2P(emb_d=128, n_tasks=1, "
            "prompt_param=[10, 8, -1], key_dim=256), forward(query, l, None, train) for l = 0..3, losses "
            "summed as VisionTransformer.forward does. Selection = the indices of the official torch.topk. "
            "Gradients of key_loss + sum(probe_keys * prefix_keys) + sum(probe_values * prefix_values) "
            "(train mode)."
        ),
    )


# ---------------------------------------------------------------------- DualPrompt
DUAL_CONFIG = dict(
    g_length=4,
    g_layers=[0, 1],
    e_length=8,
    e_layers=[2, 3],
    pool_size=5,
    select_over="pool",
    keys="per_layer",
)
DUAL_TASK = 2


@component("dualprompt.selection", CODA)
def dualprompt_selection(checkout: Path) -> Golden:
    from strategies.methods.dualprompt import DualPrompt

    seed = 31
    strategy = suite_strategy(DualPrompt, 10, seed, **DUAL_CONFIG)
    prompts, width = strategy.prompts, strategy.visual_width
    key_dim = prompts.keys.shape[-1]
    generator = torch.Generator().manual_seed(seed)
    g_half, e_half = DUAL_CONFIG["g_length"] // 2, DUAL_CONFIG["e_length"] // 2
    inputs = {"input.query": torch.randn(BATCH, key_dim, generator=generator)}
    for layer in range(LAYERS):
        n = (g_half if layer in DUAL_CONFIG["g_layers"] else 0) + (
            e_half if layer in DUAL_CONFIG["e_layers"] else 0
        )
        inputs[f"input.probe_keys.{layer}"] = probe_tensor(generator, BATCH, n, width)
        inputs[f"input.probe_values.{layer}"] = probe_tensor(generator, BATCH, n, width)
    params = {f"param.prompts.{name}": t.detach().clone() for name, t in prompts.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    with official_modules(checkout) as load:
        load("models/vit.py", "models.vit")
        zoo = load("models/zoo.py", "models.zoo")
        # prompt_param = (E pool, E length, G length) (experiments/cifar-100.sh: 10 20 6)
        official = zoo.DualPrompt(
            width, 5, [DUAL_CONFIG["pool_size"], DUAL_CONFIG["e_length"], DUAL_CONFIG["g_length"]], key_dim
        )
        # Official layers: G at [0, 1], E at [2, 3, 4]; the tiny ViT has blocks 0..3, so E acts at 2, 3.
        assert official.g_layers == [0, 1] and official.e_layers[:2] == DUAL_CONFIG["e_layers"]
        with torch.no_grad():
            for i, layer in enumerate(DUAL_CONFIG["g_layers"]):
                getattr(official, f"g_p_{layer}").copy_(params["param.prompts.g"][i])
            for i, layer in enumerate(DUAL_CONFIG["e_layers"]):
                getattr(official, f"e_p_{layer}").copy_(params["param.prompts.e"][:, i])
                getattr(official, f"e_k_{layer}").copy_(params["param.prompts.keys"][i])
        for mode, train in (("train", True), ("eval", False)):
            recorder = TorchCallRecorder()
            loss, readout = torch.zeros(()), torch.zeros(())
            with recorder:
                for layer in range(LAYERS):
                    p_list, layer_loss, _ = official.forward(
                        inputs["input.query"], layer, None, train=train, task_id=DUAL_TASK
                    )
                    loss = loss + layer_loss
                    out[f"output.{mode}.prefix_keys.{layer}"] = p_list[0].detach()
                    out[f"output.{mode}.prefix_values.{layer}"] = p_list[1].detach()
                    readout = readout + prefix_readout(
                        p_list, inputs[f"input.probe_keys.{layer}"], inputs[f"input.probe_values.{layer}"]
                    )
            if train:
                assert not recorder.topk  # training uses the task's own prompt (task_id_bootstrap)
                (loss + readout).backward()
            else:
                out["output.eval.selection"] = torch.cat(recorder.topk, dim=1)  # [B, E layers], top-1 each
            out[f"output.{mode}.key_loss"] = torch.as_tensor(loss).detach()
    e_layers = DUAL_CONFIG["e_layers"]
    grads = {
        "grad.prompts.g": torch.stack(
            [grad_or_zeros(getattr(official, f"g_p_{layer}")) for layer in DUAL_CONFIG["g_layers"]]
        ),
        "grad.prompts.e": torch.stack(
            [grad_or_zeros(getattr(official, f"e_p_{layer}")) for layer in e_layers], dim=1
        ),
        "grad.prompts.keys": torch.stack(
            [grad_or_zeros(getattr(official, f"e_k_{layer}")) for layer in e_layers]
        ),
    }
    return Golden(
        component="dualprompt.selection",
        official=CODA,
        file="models/zoo.py",
        function="DualPrompt.forward (task_id_bootstrap=True, top_k=1)",
        loading=LOADING,
        seed=seed,
        sizes={
            "batch": BATCH,
            "pool": 5,
            "g_length": 4,
            "e_length": 8,
            "task": DUAL_TASK,
            "width": width,
            "key_dim": key_dim,
        },
        tensors={**inputs, **params, **out, **grads},
        notes=(
            f"Suite: DualPrompt on the tiny CLIP, options {DUAL_CONFIG}, at task {DUAL_TASK} "
            "(setup_task); its prompts as built (uniform [0, 1), as the official tensor_prompt). "
            "Official: DualPrompt(emb_d=128, n_tasks=5, prompt_param=[5, 8, 4], key_dim=256), "
            f"forward(query, l, None, train, task_id={DUAL_TASK}) for l = 0..3 (G at 0, 1; E at 2, 3; its "
            "E layer 4 is past the tiny ViT's blocks), losses summed as VisionTransformer.forward does. "
            "Train: the task's own E-prompt; eval: top-1 per E layer over the whole pool (the official "
            "torch.topk indices, [B, E layers]). Gradients of key loss + the probes' read-out (train)."
        ),
    )
