"""Golden outputs of APER's official code (``zhoudw-zdw/RevisitingCIL``, the suite's ``aper_adapter``).

Components:

* ``aper_adapter.adapter``: the AdaptFormer adapter of ``convs/vision_transformer_adapter.py``
  (``Adapter``, built by that file's ``Block`` with the tuning config of ``utils/inc_net.py`` for
  ``aper_adapter``: parallel, no layer norm, "lora" init, scale "0.1", bottleneck ``ffn_num`` = 64,
  dropout 0.1) alone on seeded tokens, and inside the official ``Block`` (the parallel placement:
  the adapter reads the residual stream after attention and adds to the MLP's output), train (given
  dropout mask) and eval, with gradients. The Block is timm-ViT-shaped; it is built at the tiny
  CLIP's width with the tiny CLIP's activation (QuickGELU) and LayerNorm eps (1e-5) instead of
  ViT-B's GELU and 1e-6, so that the suite's open_clip block can be compared with it: the backbone
  is the suite's, the adapter and its placement are the official ones.
* ``aper_adapter.head``: the cosine head ``convs/linears.py`` ``CosineLinear`` (its seeded initial
  values, its logits with a trained-looking sigma, cross-entropy gradients as in
  ``models/aper_adapter.py`` ``_init_train``), then the prototype classifier: the official
  ``MultiBranchCosineIncrementalNet`` (``utils/inc_net.py``) built over two given branches
  (pretrained, adapted), ``construct_dual_branch_network``, ``Learner.replace_fc``
  (``models/aper_adapter.py``: class means written into the head's rows) for task 1,
  ``update_fc`` and ``replace_fc`` for task 2, and the logits of test features.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from open_clip.transformer import QuickGELU
from torch import nn

from strategies.methods.aper_adapter import AperConfig, CosineHead
from tests.official.goldens import component
from tests.official.goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)
from tests.official.goldens.moe_adapters_repo import (
    HEADS,
    TOKENS,
    WIDTH,
    SuiteBlock,
    _Draws,
    _Override,
)

OFFICIAL = Official(
    repository="zhoudw-zdw/RevisitingCIL",
    commit="a2e6b71f6a2fed4421609a0917eea861fa387c76",
    folder="RevisitingCIL",
)
EMBED = 256  # the tiny CLIP's embedding (benchmarks/model_configs/tiny-clip-32.json)
BATCH = 4
TASK_CLASSES = ((0, 1, 2), (3, 4, 5))  # two tasks, labels in class order as the official data manager
PER_CLASS, LOADER_BATCH, TEST = 4, 5, 6
SEED = 42


def suite_adapter_block(seed: int = SEED) -> SuiteBlock:
    """The suite's block with APER's adapter (AperAdapter.__init__'s arguments), seeded, looks_trained."""
    cfg = AperConfig()
    torch.manual_seed(seed)
    host = SuiteBlock(
        WIDTH,
        HEADS,
        experts=1,
        bottleneck=cfg.bottleneck,
        dropout=cfg.adapter_dropout,
        scale=cfg.adapter_scale,
    )
    looks_trained(host, torch.Generator().manual_seed(seed + 1))
    return host


def suite_head(seed: int = SEED) -> CosineHead:
    """The suite's task-1 head as ``AperAdapter.setup_task(0)`` builds it, after ``torch.manual_seed``."""
    torch.manual_seed(seed)
    return CosineHead(EMBED, len(TASK_CLASSES[0]))


# ---------------------------------------------------------------------------------- the official side
def _timm_stubs() -> dict[str, object]:
    """timm is imported by the official files only for the ViT (DropPath, PatchEmbed, the model
    registry), none of which the components run."""
    unused = type("UnusedTimmClass", (nn.Module,), {})
    return {
        "timm": stub_module("timm"),
        "timm.models": stub_module("timm.models"),
        "timm.models.layers": stub_module("timm.models.layers", DropPath=unused),
        "timm.models.vision_transformer": stub_module("timm.models.vision_transformer", PatchEmbed=unused),
        "timm.models.registry": stub_module("timm.models.registry", register_model=lambda f: f),
    }


@contextlib.contextmanager
def _official(checkout: Path) -> Iterator:
    packages = {
        name: stub_module(name, __path__=[str(checkout / name)]) for name in ("convs", "utils", "models")
    }
    with official_import_path(checkout, {**_timm_stubs(), **packages}) as load:
        yield load


@contextlib.contextmanager
def _cuda_is_cpu() -> Iterator[None]:
    """The official update_fc / replace_fc call ``.cuda()``; here it returns the CPU tensor or module."""
    tensor_cuda, module_cuda = torch.Tensor.cuda, nn.Module.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    nn.Module.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda, nn.Module.cuda = tensor_cuda, module_cuda


def _tuning_config() -> SimpleNamespace:
    """utils/inc_net.py's tuning_config for aper_adapter (an EasyDict there), at the tiny CLIP's width."""
    return SimpleNamespace(
        ffn_adapt=True,
        ffn_option="parallel",
        ffn_adapter_layernorm_option="none",
        ffn_adapter_init_option="lora",
        ffn_adapter_scalar="0.1",
        ffn_num=AperConfig().bottleneck,
        d_model=WIDTH,
        vpt_on=False,
        vpt_num=0,
    )


def _official_block(vit, host: SuiteBlock) -> nn.Module:
    block = vit.Block(
        dim=WIDTH,
        num_heads=HEADS,
        qkv_bias=True,  # VisionTransformer's default
        act_layer=QuickGELU,  # the tiny CLIP's (ViT-B: nn.GELU)
        norm_layer=partial(nn.LayerNorm, eps=1e-5),  # the tiny CLIP's (ViT-B: 1e-6)
        config=_tuning_config(),
    )
    ours = host.block.state_dict()
    a = host.adapter.state_dict()
    d = WIDTH
    mapped = {
        "norm1.weight": ours["ln_1.weight"],
        "norm1.bias": ours["ln_1.bias"],
        "norm2.weight": ours["ln_2.weight"],
        "norm2.bias": ours["ln_2.bias"],
        "attn.proj.weight": ours["attn.out_proj.weight"],
        "attn.proj.bias": ours["attn.out_proj.bias"],
        "fc1.weight": ours["mlp.c_fc.weight"],
        "fc1.bias": ours["mlp.c_fc.bias"],
        "fc2.weight": ours["mlp.c_proj.weight"],
        "fc2.bias": ours["mlp.c_proj.bias"],
    }
    for i, name in enumerate(("q", "k", "v")):
        mapped[f"attn.{name}_proj.weight"] = ours["attn.in_proj_weight"][i * d : (i + 1) * d]
        mapped[f"attn.{name}_proj.bias"] = ours["attn.in_proj_bias"][i * d : (i + 1) * d]
    for mine, theirs in (("down", "down_proj"), ("up", "up_proj")):
        for kind in ("weight", "bias"):
            mapped[f"adaptmlp.{theirs}.{kind}"] = a[f"experts.0.{mine}.{kind}"]
    block.load_state_dict(mapped, strict=True)
    return block


def _adapter_grads(adapter: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"experts.0.{mine}.{kind}": getattr(getattr(adapter, theirs), kind).grad.clone()
        for mine, theirs in (("down", "down_proj"), ("up", "up_proj"))
        for kind in ("weight", "bias")
    }


@component("aper_adapter.adapter", OFFICIAL)
def adapter_golden(checkout: Path) -> Golden:
    host = suite_adapter_block()
    g = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {f"param.{k}": v.clone() for k, v in host.tensors().items()}
    tensors["input.x"] = torch.randn(BATCH, TOKENS, WIDTH, generator=g)
    tensors["input.cotangent"] = torch.randn(BATCH, TOKENS, WIDTH, generator=g)
    p = AperConfig().adapter_dropout
    tensors["input.train.mask"] = (
        torch.rand(BATCH, TOKENS, AperConfig().bottleneck, generator=g) >= p
    ).float()
    with _official(checkout) as load:
        vit = load("convs/vision_transformer_adapter.py", "convs.vision_transformer_adapter")
        draws = _Draws()
        vit.nn = _Override(nn, functional=_Override(nn.functional, dropout=draws.dropout))
        block = _official_block(vit, host)
        for mode in ("train", "eval"):
            block.train(mode == "train")
            for unit in ("adapter", "block"):
                if mode == "train":
                    draws.masks.append(tensors["input.train.mask"])
                block.zero_grad(set_to_none=True)
                x = tensors["input.x"].clone().requires_grad_(True)
                if unit == "adapter":
                    out = block.adaptmlp(x, add_residual=False)
                else:
                    out = block(x)
                if draws.masks:
                    raise RuntimeError("the official adapter drew no dropout mask")
                tensors[f"output.{mode}.{unit}"] = out.detach().clone()
                if mode == "train":
                    (out * tensors["input.cotangent"]).sum().backward()
                    tensors[f"grad.train.{unit}.input.x"] = x.grad.clone()
                    for name, grad in _adapter_grads(block.adaptmlp).items():
                        tensors[f"grad.train.{unit}.adapter.{name}"] = grad
        if draws.dropout_p != [p, p]:
            raise RuntimeError(f"official dropout p {draws.dropout_p}")
    return Golden(
        component="aper_adapter.adapter",
        official=OFFICIAL,
        file="convs/vision_transformer_adapter.py",
        function="Adapter.forward(x, add_residual=False) and Block.forward (ffn_option 'parallel')",
        loading=(
            "convs/vision_transformer_adapter.py imported as convs.vision_transformer_adapter; timm, "
            "timm.models, timm.models.layers (DropPath), timm.models.vision_transformer (PatchEmbed) "
            "and timm.models.registry (register_model = identity) stubbed: the ViT parts, unused; the "
            "tuning config is a SimpleNamespace with utils/inc_net.py's aper_adapter values (an "
            "EasyDict there; easydict is not installed); in the module's namespace "
            "`nn.functional.dropout` applies the fixture's input.train.mask (keep mask scaled by "
            "1/(1-p), the official p), everything else of torch.nn unchanged."
        ),
        seed=SEED,
        sizes={"batch": BATCH, "tokens": TOKENS, "width": WIDTH, "heads": HEADS, "bottleneck": 64},
        tensors=tensors,
        notes=(
            "Parameters: the suite's open_clip block (QuickGELU) and one-expert ParallelAdapter, "
            "seeded, looks_trained (scale 0.05), copied into the official Block (norm1/norm2 = "
            "ln_1/ln_2, q/k/v_proj = thirds of in_proj, proj = out_proj, fc1/fc2 = c_fc/c_proj, "
            "adaptmlp.down_proj/up_proj = experts.0.down/up). Official Block built with "
            "act_layer=QuickGELU and LayerNorm eps 1e-5 (the tiny CLIP's; the official ViT-B uses GELU "
            "and 1e-6), qkv_bias=True. output.<mode>.adapter = the adapter alone on input.x; "
            "output.<mode>.block = the Block on input.x. train: module.train() and the given mask; "
            "eval: module.eval(). Gradients of sum(output * input.cotangent), suite names."
        ),
    )


class _Branch(nn.Module):
    """A given feature extractor: branch ``index`` of inputs ``[B, 2, d]`` (0 pretrained, 1 adapted)."""

    def __init__(self, index: int, out_dim: int) -> None:
        super().__init__()
        self.index, self.out_dim = index, out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.index]


def _features(g: torch.Generator, centres: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[N, 2, d]``: a pretrained and an adapted feature per sample around its class's centres."""
    return centres[labels] + 0.5 * torch.randn(len(labels), 2, EMBED, generator=g)


@component("aper_adapter.head", OFFICIAL)
def head_golden(checkout: Path) -> Golden:
    g = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    head = suite_head()
    looks_trained(head, torch.Generator().manual_seed(SEED + 1), scale=0.2)  # sigma away from 1
    tensors.update({f"param.head.{k}": v.detach().clone() for k, v in head.state_dict().items()})
    tensors["input.head.features"] = torch.randn(2 * LOADER_BATCH, EMBED, generator=g)
    tensors["input.head.labels"] = torch.randint(0, len(TASK_CLASSES[0]), (2 * LOADER_BATCH,), generator=g)
    centres = torch.randn(sum(map(len, TASK_CLASSES)), 2, EMBED, generator=g)
    for t, classes in enumerate(TASK_CLASSES):
        labels = torch.tensor(classes).repeat_interleave(PER_CLASS)
        labels = labels[torch.randperm(len(labels), generator=g)]  # the official loader shuffles
        tensors[f"input.task{t}.labels"] = labels
        tensors[f"input.task{t}.phi"] = _features(g, centres, labels)
    tensors["input.test.phi"] = _features(g, centres, torch.randint(0, len(centres), (TEST,), generator=g))

    with _official(checkout) as load, _cuda_is_cpu(), contextlib.redirect_stdout(io.StringIO()):
        linears = load("convs/linears.py", "convs.linears")
        inc_net = load("utils/inc_net.py", "utils.inc_net")
        learner = load("models/aper_adapter.py", "models.aper_adapter")

        # The task-1 head: initial values under the same seed as the suite's, then the suite's values.
        torch.manual_seed(SEED)
        fc = linears.CosineLinear(EMBED, len(TASK_CLASSES[0]))
        tensors["output.init.weight"] = fc.weight.detach().clone()
        tensors["output.init.sigma"] = fc.sigma.detach().clone()
        with torch.no_grad():
            fc.weight.copy_(tensors["param.head.weight"])
            fc.sigma.copy_(tensors["param.head.sigma"].reshape(1))
        logits = fc(tensors["input.head.features"])["logits"]
        loss = F.cross_entropy(logits, tensors["input.head.labels"])  # _init_train's loss
        loss.backward()
        tensors["output.head.logits"] = logits.detach().clone()
        tensors["output.head.loss"] = loss.detach().clone()
        tensors["grad.head.weight"] = fc.weight.grad.clone()
        tensors["grad.head.sigma"] = fc.sigma.grad.clone().reshape(())

        # The prototype classifier over the two branches.
        inc_net.get_convnet = lambda args, pretrained=False: _Branch(0, EMBED)  # the pretrained branch
        args = {"convnet_type": "pretrained_vit_b16_224_in21k_adapter", "init_cls": len(TASK_CLASSES[0])}
        net = inc_net.MultiBranchCosineIncrementalNet(args, True)
        net.construct_dual_branch_network(SimpleNamespace(convnet=_Branch(1, EMBED)))
        total = 0
        for t, classes in enumerate(TASK_CLASSES):
            total += len(classes)
            if t > 0:
                net.update_fc(total)
            phi, labels = tensors[f"input.task{t}.phi"], tensors[f"input.task{t}.labels"]
            loader = [
                (None, phi[i : i + LOADER_BATCH], labels[i : i + LOADER_BATCH])
                for i in range(0, len(labels), LOADER_BATCH)
            ]
            me = SimpleNamespace(train_dataset=SimpleNamespace(labels=labels.numpy()), _network=net)
            learner.Learner.replace_fc(me, loader, net, None)
            tensors[f"output.task{t}.prototypes"] = net.fc.weight.detach().clone()
            tensors[f"output.task{t}.sigma"] = net.fc.sigma.detach().clone().reshape(())
            with torch.no_grad():
                out = net(tensors["input.test.phi"])
            tensors[f"output.task{t}.logits"] = out["logits"].clone()
            tensors[f"output.task{t}.features"] = out["features"].clone()
    assert np.array_equal(np.unique(tensors["input.task1.labels"].numpy()), TASK_CLASSES[1])
    return Golden(
        component="aper_adapter.head",
        official=OFFICIAL,
        file="convs/linears.py; utils/inc_net.py; models/aper_adapter.py",
        function=(
            "CosineLinear (linears.py:35; the second definition at :116 is inside a string); "
            "MultiBranchCosineIncrementalNet.__init__/construct_dual_branch_network/update_fc/forward; "
            "Learner.replace_fc"
        ),
        loading=(
            "convs/linears.py, utils/inc_net.py and models/aper_adapter.py imported as convs.linears, "
            "utils.inc_net and models.aper_adapter (stub packages convs, utils, models pointing at the "
            "checkout; timm stubbed, unused); utils.inc_net.get_convnet replaced by a function returning "
            "the given pretrained branch (the ViT is not built: the branches are given features "
            "[B, 2, d], 0 pretrained, 1 adapted); Learner.replace_fc called on a namespace holding "
            "train_dataset.labels and _network, over a list of (index, features, labels) batches; "
            "Tensor.cuda and Module.cuda return their CPU object while the official code runs; prints "
            "silenced."
        ),
        seed=SEED,
        sizes={"embed": EMBED, "classes_per_task": 3, "tasks": 2, "per_class": PER_CLASS, "test": TEST},
        tensors=tensors,
        notes=(
            "output.init.*: a fresh official CosineLinear(256, 3) after torch.manual_seed(42) (the "
            "suite's CosineHead draws the same values after the same seed). param.head.*: the suite's "
            "head, looks_trained (scale 0.2, so sigma != 1), copied into the official CosineLinear; "
            "output.head.logits/loss and grad.head.* from F.cross_entropy on input.head.* as "
            "_init_train. Prototypes: MultiBranchCosineIncrementalNet with init_cls 3, "
            "construct_dual_branch_network (a fresh CosineLinear(512, 3)), replace_fc on task 0's "
            "features, update_fc(6) (rows of zeros, sigma copied), replace_fc on task 1's; after each "
            "task the head's weight (output.task<t>.prototypes, row = class), sigma, and on "
            "input.test.phi the concatenated features and the logits."
        ),
    )
