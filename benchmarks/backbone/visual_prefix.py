"""Prefix keys and values at chosen visual blocks, per forward and per sample (prefix tuning, as
L2P++, DualPrompt and CODA-Prompt use it; docs/baselines.md §2.8).

``with backbone.visual_prefix({block: (keys, values)}): backbone.encode_image(x)``: in block
``block`` of the visual tower, ``keys`` and ``values`` ``[B, P, width]`` (or ``[1, P, width]`` for
the whole batch) join the projected keys and values of the tokens, before them. They are not
projected, LoRA does not apply to them, and they are cast to the attention's dtype under autocast.
The text tower and any forward outside the block are unaffected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from benchmarks.backbone.attention import SplitAttention
from benchmarks.backbone.open_clip_types import OpenCLIP
from benchmarks.core.errors import UserError


class VisualPrefix:
    """Mixin of ``CLIPBackbone``: ``visual_prefix``."""

    model: OpenCLIP

    @contextlib.contextmanager
    def visual_prefix(self, prefixes: Mapping[int, tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
        """Within the block, visual block ``l`` attends over ``prefixes[l]`` = (keys, values) first."""
        blocks = self.model.visual.transformer.resblocks
        width = self.model.visual.transformer.width
        attentions = []
        for layer, (keys, values) in prefixes.items():
            if not 0 <= layer < len(blocks):
                raise UserError(
                    f"a visual prefix at block {layer}, but the visual tower has {len(blocks)} blocks "
                    f"(0 to {len(blocks) - 1}); set the method's layers for this model"
                )
            if keys.dim() != 3 or keys.shape != values.shape or keys.shape[-1] != width:
                raise ValueError(
                    f"prefix keys {tuple(keys.shape)} and values {tuple(values.shape)} at block {layer} "
                    f"must both be [B, P, {width}]"
                )
            attention = blocks[layer].attn
            if not isinstance(attention, SplitAttention):
                raise TypeError(
                    f"visual block {layer} has no SplitAttention (create the model with create_clip)"
                )
            if attention.prefix is not None:
                raise RuntimeError(
                    f"visual block {layer} already has a prefix: visual_prefix contexts do not nest"
                )
            attentions.append((attention, (keys, values)))
        try:
            for attention, prefix in attentions:
                attention.prefix = prefix
            yield
        finally:
            for attention, _ in attentions:
                attention.prefix = None
