"""CLIP backbones: open_clip models with split q/k/v attention and per-tower LoRA adapters.

``create_clip(BackboneSpec(model, pretrained))`` is the one entry point: it builds an open_clip
model (never downloading weights), replaces every fused ``nn.MultiheadAttention`` by
``SplitAttention`` and wraps it in ``CLIPBackbone``. One module per job:

* ``loading``: weight files to models, ``create_clip``;
* ``weights``: model names and tags checked, weight files found in the caches, what results record;
* ``tags``: open_clip's pretrained tags, read offline (activation, checksum, file place);
* ``registry``: open_clip's registry of names and tags, read without importing open_clip;
* ``attention``: the attention surgery;
* ``text``: prompt preparation and encoding (length buckets, shared prefix, learnable context);
* ``lora``: named LoRA adapters on k/v of either tower, mixed-adapter batches;
* ``mlp_adapters``: parallel MLP adapters (experts, routers) on the blocks of either tower;
* ``full_tuning``: the visual tower trained in full, its weights as state and their arithmetic;
* ``clip``: ``CLIPBackbone``, the encoders in the run's precision, fp32 features out;
* ``budgets``: how much batched work a device takes at once.

The package imports a module when one of its names is first read: ``prepare`` and a suite's checks
use ``weights`` alone, without the seconds torch and open_clip take. The names of ``weights`` are
read through ``loading``, which makes the tiny model known to open_clip, as an eager import did.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.backbone.attention import (
        SplitAttention,
        fuse_attention_,
        split_attention_,
    )
    from benchmarks.backbone.budgets import (
        ACTIVATION_BUDGET,
        COMPACT_TEXT_MIN_WORK,
        TEXT_BACKWARD_BUDGET,
        efficient_images_per_forward,
        efficient_prompts_per_backward,
        use_compact_text,
    )
    from benchmarks.backbone.clip import (
        CLIPBackbone,
    )
    from benchmarks.backbone.loading import (
        DEFAULT_MODEL,
        SYNTHETIC_CHECKPOINTS,
        SYNTHETIC_TAG,
        SYNTHETIC_WEIGHTS,
        TINY_MODEL,
        BackboneSpec,
        check_names,
        check_weights,
        create_clip,
        recorded_backbone,
        weights_digest,
        weights_file,
        weights_target_name,
    )
    from benchmarks.backbone.lora import (
        BASE_ADAPTER,
        Tower,
    )
    from benchmarks.backbone.text import (
        PreparedPrompts,
        PromptBucket,
        TextContext,
        encode_clip_text,
        encode_prompts,
        prepare_prompts,
        shared_prefix_length,
    )

_MODULE_OF = {
    "SplitAttention": "attention",
    "split_attention_": "attention",
    "fuse_attention_": "attention",
    "ACTIVATION_BUDGET": "budgets",
    "COMPACT_TEXT_MIN_WORK": "budgets",
    "TEXT_BACKWARD_BUDGET": "budgets",
    "efficient_images_per_forward": "budgets",
    "efficient_prompts_per_backward": "budgets",
    "use_compact_text": "budgets",
    "CLIPBackbone": "clip",
    "DEFAULT_MODEL": "loading",
    "SYNTHETIC_CHECKPOINTS": "loading",
    "SYNTHETIC_TAG": "loading",
    "SYNTHETIC_WEIGHTS": "loading",
    "TINY_MODEL": "loading",
    "BackboneSpec": "loading",
    "check_names": "loading",
    "check_weights": "loading",
    "create_clip": "loading",
    "recorded_backbone": "loading",
    "weights_digest": "loading",
    "weights_file": "loading",
    "weights_target_name": "loading",
    "BASE_ADAPTER": "lora",
    "Tower": "lora",
    "PreparedPrompts": "text",
    "PromptBucket": "text",
    "TextContext": "text",
    "encode_clip_text": "text",
    "encode_prompts": "text",
    "prepare_prompts": "text",
    "shared_prefix_length": "text",
}
__all__ = [
    "ACTIVATION_BUDGET",
    "BASE_ADAPTER",
    "BackboneSpec",
    "CLIPBackbone",
    "COMPACT_TEXT_MIN_WORK",
    "DEFAULT_MODEL",
    "PreparedPrompts",
    "PromptBucket",
    "SYNTHETIC_CHECKPOINTS",
    "SYNTHETIC_TAG",
    "SYNTHETIC_WEIGHTS",
    "SplitAttention",
    "TEXT_BACKWARD_BUDGET",
    "TINY_MODEL",
    "TextContext",
    "Tower",
    "check_names",
    "check_weights",
    "create_clip",
    "efficient_images_per_forward",
    "efficient_prompts_per_backward",
    "encode_clip_text",
    "encode_prompts",
    "fuse_attention_",
    "prepare_prompts",
    "recorded_backbone",
    "shared_prefix_length",
    "split_attention_",
    "use_compact_text",
    "weights_digest",
    "weights_file",
    "weights_target_name",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # read once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
