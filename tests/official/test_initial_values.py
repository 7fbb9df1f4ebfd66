"""Each method's trained tensors start by its official rule (issue 63, item 4), checked on the suite's
own draw: the loop and component tests load the suite's starting values into the official code, so
a wrong initialisation would pass them unseen. MG-CLIP's LoRA is checked beside its loop
(``test_mg_clip_loop.py``); APER's head and CLAP's language-aware encoders are drawn by the official
code in their fixtures (docs/baselines.md §16).

The rules, with where each is written:
- MoE-Adapters (JiazuoYu/MoE-Adapters4CL@4572d97 ``cil/clip/adapter.py``, ``init_option="lora"``,
  and ``cil/clip/model.py``; docs/baselines.md §6): each expert's down weight kaiming-uniform
  (a = sqrt 5), its up weight and both biases 0; the routers' W_g and W_noise 0.
- APER-Adapter (docs/baselines.md §12): the adapter's down weight kaiming-uniform, up weight and both
  biases 0.
- AdapterVLM (docs/baselines.md §4): LoRA A kaiming-uniform, B 0.
- L2P++ and DualPrompt (CODA-Prompt's ``models/zoo.py``; docs/baselines.md §9, §10): prompts and
  keys uniform on [0, 1).
"""

import math

import pytest
import torch

from strategies.methods.adaptervlm import AdapterVLM
from strategies.methods.aper_adapter import AperAdapter
from strategies.methods.dualprompt import DualPrompt
from strategies.methods.l2p_pp import L2PPlusPlus
from strategies.methods.moe4cl import MOE4CL
from tests.official.goldens import loop as shared


def _started(cls, **options) -> dict[str, torch.Tensor]:
    """The trainable tensors of ``cls`` on the tiny CLIP once its first task is set up, by name."""
    strategy = shared.tiny_clip_strategy(cls, cls.Config(**options))
    strategy.setup_task(0, list(shared.TASKS[0]))
    return {name: p.detach() for name, p in strategy.trainable_parameters().items()}, strategy


def _uniform(tensors: list[torch.Tensor], low: float, high: float) -> None:
    """Entries pooled over ``tensors`` look uniform on [low, high): within it, reaching near both
    ends, with the uniform's standard deviation."""
    pooled = torch.cat([t.flatten() for t in tensors]).double()
    width = high - low
    assert low <= pooled.min() and pooled.max() <= high, (pooled.min(), pooled.max(), low, high)
    assert pooled.min() < low + 0.05 * width and pooled.max() > high - 0.05 * width
    assert pooled.std().item() == pytest.approx(width / math.sqrt(12), rel=0.05)


def _kaiming(tensors: list[torch.Tensor]) -> None:
    """``kaiming_uniform_(a=sqrt(5))``, nn.Linear's and peft's default: uniform(-b, b), b = 1/sqrt(fan_in)."""
    for fan_in in {t.shape[1] for t in tensors}:
        bound = 1 / math.sqrt(fan_in)
        _uniform([t for t in tensors if t.shape[1] == fan_in], -bound, bound)


def _by(named: dict[str, torch.Tensor], *parts: str) -> list[torch.Tensor]:
    found = [t for name, t in named.items() if all(part in name for part in parts)]
    assert found, parts
    return found


def test_moe_adapters_experts_and_routers_start_as_the_official_code():
    named, _ = _started(MOE4CL)
    _kaiming(_by(named, "experts", "down.weight"))
    for zero in (("experts", "up.weight"), ("experts", "down.bias"), ("experts", "up.bias"), ("router",)):
        assert all(not t.any() for t in _by(named, *zero)), zero
    assert len(_by(named, "router.w_gate")) == len(_by(named, "router.w_noise")) > 0


def test_aper_adapters_start_kaiming_down_and_zero_up():
    named, _ = _started(AperAdapter)
    _kaiming(_by(named, "down.weight"))
    for zero in (("up.weight",), ("down.bias",), ("up.bias",)):
        assert all(not t.any() for t in _by(named, *zero)), zero


def test_adaptervlm_lora_starts_kaiming_a_and_zero_b():
    named, _ = _started(AdapterVLM)
    _kaiming(_by(named, "lora_A"))
    assert all(not t.any() for t in _by(named, "lora_B"))


def test_prompt_pools_and_keys_start_uniform_on_0_1():
    _, l2p = _started(L2PPlusPlus)
    _uniform([l2p.pool.prompts.detach(), l2p.pool.keys.detach()], 0.0, 1.0)
    _, dual = _started(DualPrompt, e_layers=[2, 3])
    _uniform([dual.prompts.g.detach(), dual.prompts.e.detach(), dual.prompts.keys.detach()], 0.0, 1.0)
