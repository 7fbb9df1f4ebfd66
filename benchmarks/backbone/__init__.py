"""CLIP backbones: open_clip models with split q/k/v attention and per-tower LoRA adapters.

``create_clip(BackboneSpec(model, pretrained))`` is the one entry point: it builds an open_clip
model (never downloading weights), replaces every fused ``nn.MultiheadAttention`` by
``SplitAttention`` and wraps it in ``CLIPBackbone``. One module per job:

* ``loading``: names to configs, weight files to models, ``create_clip``;
* ``tags``: open_clip's registry of pretrained tags, read offline (activation, checksum, file place);
* ``attention``: the attention surgery;
* ``text``: prompt preparation and encoding (length buckets, shared prefix, learnable context);
* ``lora``: named LoRA adapters on k/v of either tower, mixed-adapter batches;
* ``mlp_adapters``: parallel MLP adapters (experts, routers) on the blocks of either tower;
* ``full_tuning``: the visual tower trained in full, its weights as state and their arithmetic;
* ``clip``: ``CLIPBackbone``, the encoders in the run's precision, fp32 features out;
* ``budgets``: how much batched work a device takes at once.
"""

from benchmarks.backbone.attention import SplitAttention, split_attention_
from benchmarks.backbone.budgets import (
    ACTIVATION_BUDGET,
    COMPACT_TEXT_MIN_WORK,
    TEXT_BACKWARD_BUDGET,
    efficient_images_per_forward,
    efficient_prompts_per_backward,
    use_compact_text,
)
from benchmarks.backbone.clip import CLIPBackbone
from benchmarks.backbone.loading import (
    DEFAULT_MODEL,
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
from benchmarks.backbone.lora import BASE_ADAPTER, Tower
from benchmarks.backbone.text import (
    PreparedPrompts,
    PromptBucket,
    TextContext,
    encode_clip_text,
    encode_prompts,
    prepare_prompts,
    shared_prefix_length,
)

__all__ = [
    "ACTIVATION_BUDGET",
    "BASE_ADAPTER",
    "COMPACT_TEXT_MIN_WORK",
    "DEFAULT_MODEL",
    "SYNTHETIC_TAG",
    "SYNTHETIC_WEIGHTS",
    "TEXT_BACKWARD_BUDGET",
    "TINY_MODEL",
    "BackboneSpec",
    "CLIPBackbone",
    "PreparedPrompts",
    "PromptBucket",
    "SplitAttention",
    "TextContext",
    "Tower",
    "check_names",
    "check_weights",
    "create_clip",
    "efficient_images_per_forward",
    "efficient_prompts_per_backward",
    "encode_clip_text",
    "encode_prompts",
    "prepare_prompts",
    "shared_prefix_length",
    "split_attention_",
    "use_compact_text",
    "recorded_backbone",
    "weights_digest",
    "weights_file",
    "weights_target_name",
]
