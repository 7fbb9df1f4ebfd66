"""Full fine-tuning of the visual tower and elementwise arithmetic on its weights (MagMax).

``VisualState`` is a plain ``{name: CPU tensor}`` copy of the visual tower's parameters. The
arithmetic is pure: task vectors (``difference``), ``scaled_sum`` and the max-magnitude merge
(``max_magnitude``), whose ties go to the later task as in MagMax's code (``>=``).
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.backbone.open_clip_types import OpenCLIP

VisualState = dict[str, torch.Tensor]


def visual_parameters(model: OpenCLIP) -> dict[str, nn.Parameter]:
    """The visual tower's parameters by name (LoRA layers excluded: they are adapters, not weights)."""
    return {name: p for name, p in model.visual.named_parameters() if "lora_" not in name}


def visual_state(model: OpenCLIP) -> VisualState:
    """A CPU copy of the visual tower's weights."""
    return {name: p.detach().cpu().clone() for name, p in visual_parameters(model).items()}


def load_visual_state(model: OpenCLIP, state: VisualState) -> None:
    """Copy ``state`` into the visual tower's weights (names and shapes must match)."""
    params = visual_parameters(model)
    if params.keys() != state.keys():
        raise ValueError(
            f"visual state does not match the model: {len(params.keys() ^ state.keys())} names differ"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])


def set_visual_trainable(model: OpenCLIP, trainable: bool) -> None:
    """Make every weight of the visual tower trainable (or frozen again)."""
    for param in visual_parameters(model).values():
        param.requires_grad_(trainable)


def difference(a: VisualState, b: VisualState) -> VisualState:
    """``a - b`` per tensor (a task vector: fine-tuned minus pretrained)."""
    return {name: a[name] - b[name] for name in a}


def scaled_sum(a: VisualState, b: VisualState, scale: float) -> VisualState:
    """``a + scale * b`` per tensor."""
    return {name: a[name] + scale * b[name] for name in a}


def max_magnitude(running: VisualState | None, new: VisualState) -> VisualState:
    """Per entry, the value of larger magnitude; ties go to ``new`` (the later task)."""
    if running is None:
        return {name: t.clone() for name, t in new.items()}
    return {
        name: torch.where(new[name].abs() >= running[name].abs(), new[name], running[name]) for name in new
    }
