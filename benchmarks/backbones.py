"""CLIP backbones: open_clip models with split q/k/v attention and per-tower LoRA adapters.

``create_clip`` builds an open_clip model (never downloading weights), replaces every fused
``nn.MultiheadAttention`` by ``SplitAttention`` (separate q/k/v/out linear layers, numerically
the same forward) and wraps it in ``CLIPBackbone``, which owns the LoRA adapters (peft) on the
key and value projections of one tower each, which adapter is active per tower, and which
adapter parameters are trainable.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import os
import re
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import open_clip
import torch
import torch.nn.functional as F
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from torch import nn

from benchmarks import precision as amp
from benchmarks.errors import UserError, WeightsNotFoundError

DEFAULT_MODEL = "ViT-B-16-quickgelu"
TINY_MODEL = "tiny-clip-32"
BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch
# Activation elements (images x visual tokens x width) that one branch-batched inference forward
# should hold. On a CPU, forwards past cache size cost more per image (2 cores: 640 tiny images
# 1.08-1.47x the time of ten 64-image forwards; ViT-B-16, 16 or 80 images 1.05x per image of 8);
# a GPU wants big batches (256 ViT-B/16 images is 2^25.2; the CUDA value is not measured here).
ACTIVATION_BUDGET = {"cpu": 2**19, "cuda": 2**26}
# Activation elements (prompts x text tokens x width) that one text forward with a graph may hold
# before a training step backpropagates through the text tower in chunks (an extra forward without
# a graph). On a GPU it is sized so that ImageNet-1K's 1000 prompts never chunk with ViT-B/16
# (1000 x 20 x 512 = 2^23.3; about 4 GB of saved fp16 activations); on a CPU memory is plentiful
# but slow, and this keeps the former 256 prompts of ViT-B/16 at 16 tokens.
TEXT_BACKWARD_BUDGET = {"cpu": 2**21, "cuda": 2**25}
# When a device encodes prompts compactly: in length buckets, with the prefix every prompt shares run
# once (both exact). Each bucket and the prefix path add kernel launches and dispatch; they pay only
# when the padded text work, prompts x longest prompt x width^2 (the layers' multiply-adds), is
# large. Measured on 2 CPU cores (benchmarks.speed): a tiny-CLIP stage-1 step with 100 prompts
# (2^23) took 0.09-0.12 s compact against 0.057 s as one batch; forward and backward, 1000 prompts
# take 0.51x (tiny, 2^26.5) and 100 prompts 0.93x (ViT-B/16, 2^29) of one batch, and a ViT-B/16
# step with 100 prompts took 0.98x of a bare step compact against 1.23x as one batch. An H100 is
# bound by launches at every size seen: 1000 ViT-B/16 prompts take 35-50 ms as one batch against
# 555-781 ms compact (and 110 ms for open_clip's 77 positions). None: never compact.
COMPACT_TEXT_MIN_WORK = {"cpu": 2**25, "cuda": None}

Tower = Literal["visual", "text"]

_MODEL_CONFIG_DIR = Path(__file__).parent / "model_configs"
# pretrained="synthetic" for the tiny model: the shipped checkpoint of `python -m benchmarks.miniature.pretrain`.
SYNTHETIC_TAG = "synthetic"
SYNTHETIC_WEIGHTS = Path(__file__).parent / "assets" / "tiny-clip-32-synthetic.safetensors"
# Module paths (relative to the open_clip model) of the projections that get LoRA, per tower.
# peft matches a string target with re.fullmatch, so the text pattern cannot match visual.*.
_LORA_TARGETS: dict[str, str] = {
    "visual": r"visual\.transformer\.resblocks\.\d+\.attn\.(k_proj|v_proj)",
    "text": r"transformer\.resblocks\.\d+\.attn\.(k_proj|v_proj)",
}
# Extra entries in the state dict of the original OpenAI TorchScript checkpoints.
_OPENAI_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size")


def _register_model_configs() -> None:
    """Make the configs shipped in ``model_configs/`` (the tiny model) known to open_clip."""
    if TINY_MODEL not in open_clip.list_models():
        open_clip.add_model_config(_MODEL_CONFIG_DIR)


_register_model_configs()


@dataclass(frozen=True)
class BackboneSpec:
    """Which CLIP to build and where its weights come from."""

    model: str = DEFAULT_MODEL
    pretrained: str | None = "openai"  # open_clip tag, path to a weight file, or None (random init)
    cache_dir: str | None = None  # open_clip / Hugging Face cache to look in (default: theirs)


# --------------------------------------------------------------------------- attention surgery


class SplitAttention(nn.Module):
    """``nn.MultiheadAttention`` with separate q/k/v projections, computed with SDPA.

    Takes over the weights of a fused module and its call convention as open_clip uses it:
    ``attn(q_x, k_x, v_x, need_weights=False, attn_mask=mask)[0]``.
    """

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        if mha.in_proj_weight is None or mha.in_proj_bias is None or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("SplitAttention needs a MultiheadAttention with fused, biased q/k/v projections")
        dim = mha.embed_dim
        self.num_heads = mha.num_heads
        self.head_dim = mha.head_dim
        self.batch_first = mha.batch_first
        self.dropout = mha.dropout
        weight, bias = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
        self.q_proj = _linear_from(weight[:dim], bias[:dim])
        self.k_proj = _linear_from(weight[dim : 2 * dim], bias[dim : 2 * dim])
        self.v_proj = _linear_from(weight[2 * dim :], bias[2 * dim :])
        self.out_proj = _linear_from(mha.out_proj.weight.detach(), mha.out_proj.bias.detach())

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if need_weights or key_padding_mask is not None:
            raise NotImplementedError("SplitAttention supports need_weights=False without key_padding_mask only")
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, length, dim = query.shape
        q, k, v = (
            proj(x).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
            for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        )
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=self._sdpa_mask(attn_mask, batch, q.dtype),
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal and attn_mask is None,
        )
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))
        return (out if self.batch_first else out.transpose(0, 1)), None

    def forward_after_prefix(
        self, rest: torch.Tensor, prefix: torch.Tensor, attn_mask: torch.Tensor, query_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Self-attention of ``rest`` ``[N, S, D]`` (batch first) over ``prefix`` ``[1, P, D]``, which
        precedes every row, then over itself. The prefix's keys and values are projected once and
        shared by all rows; ``attn_mask`` is additive, ``[S, P + S]``.

        With ``query_index`` ``[N]``, only that position of each row queries (the others still give
        keys and values), and the result is ``[N, D]``.
        """
        rows, length, dim = rest.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(t.shape[0], -1, self.num_heads, self.head_dim).transpose(1, 2)

        if query_index is None:
            queries = rest
        else:
            queries = rest[torch.arange(rows, device=rest.device), query_index].unsqueeze(1)
            attn_mask = attn_mask[query_index].view(rows, 1, 1, -1)  # each row's mask row, for every head
        q = heads(self.q_proj(queries))
        k = torch.cat([heads(self.k_proj(prefix)).expand(rows, -1, -1, -1), heads(self.k_proj(rest))], dim=2)
        v = torch.cat([heads(self.v_proj(prefix)).expand(rows, -1, -1, -1), heads(self.v_proj(rest))], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask.to(q.dtype),
                                             dropout_p=self.dropout if self.training else 0.0)
        out = self.out_proj(out.transpose(1, 2).reshape(rows, -1, dim))
        return out if query_index is None else out[:, 0]

    def _sdpa_mask(self, mask: torch.Tensor | None, batch: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Translate a MultiheadAttention mask ((L, S) or (N*H, L, S)) to SDPA's convention."""
        if mask is None:
            return None
        if mask.dim() == 3:
            mask = mask.view(batch, self.num_heads, *mask.shape[-2:])
        if mask.dtype == torch.bool:
            return ~mask  # MultiheadAttention: True = blocked; SDPA: True = may attend
        return mask.to(dtype)  # SDPA wants an additive mask in the query dtype (fp16 under autocast)


def _linear_from(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


def split_attention_(model: open_clip.CLIP) -> None:
    """Replace, in place, the attention of every residual block of both towers by ``SplitAttention``."""
    for transformer in (model.visual.transformer, model.transformer):
        for block in transformer.resblocks:
            if not isinstance(block.attn, nn.MultiheadAttention):
                raise UserError(f"unsupported attention block {type(block).__name__}; use a standard CLIP ViT config")
            block.attn = SplitAttention(block.attn)
    if any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        raise UserError("models with attention outside the residual blocks (attentional pooler) are not supported")


# --------------------------------------------------------------------------- model + weights


def _check_model_config(name: str) -> None:
    """Fail early (before any network-capable open_clip code runs) on names we cannot build offline."""
    if ":" in name:
        raise UserError(
            f"model {name!r}: hf-hub:/local-dir: names are not supported; "
            "use a built-in open_clip name and give the weights as a file"
        )
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        close = difflib.get_close_matches(name, open_clip.list_models(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(
            f"unknown model {name!r}{hint}; list valid names with: "
            "python -c 'import open_clip; print(open_clip.list_models())'"
        )
    text_cfg, vision_cfg = cfg.get("text_cfg", {}), cfg.get("vision_cfg", {})
    # HF text towers, HF tokenizers and timm image towers would fetch files from the hub.
    if (
        cfg.get("custom_text")
        or "multimodal_cfg" in cfg
        or "hf_model_name" in text_cfg
        or "hf_tokenizer_name" in text_cfg
        or "timm_model_name" in vision_cfg
    ):
        raise UserError(f"model {name!r} is not supported: only open_clip CLIP ViT models with the built-in text tower")


def _cached_checkpoint(cfg: dict[str, Any], cache_dir: str | None) -> tuple[Path | None, list[str]]:
    """Find the file of a pretrained tag in the local caches; return it (or None) and the places looked at."""
    looked: list[str] = []
    if cfg.get("file"):
        if Path(cfg["file"]).is_file():
            return Path(cfg["file"]), looked
        looked.append(str(cfg["file"]))
    if cfg.get("hf_hub"):
        repo_id, filename = os.path.split(cfg["hf_hub"])
        filename = filename or HF_WEIGHTS_NAME
        # open_clip prefers a safetensors twin of the listed file; accept either.
        names = [filename]
        if filename == HF_WEIGHTS_NAME:
            names.insert(0, HF_SAFE_WEIGHTS_NAME)
        elif filename.endswith((".bin", ".pth")):
            names.insert(0, filename[:-4] + ".safetensors")
        for name in names:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir)
            if isinstance(hit, str):
                return Path(hit), looked
        looked.append(f"HF cache {cache_dir or hf_constants.HF_HUB_CACHE} ({repo_id}: {' or '.join(names)})")
    if cfg.get("url"):
        target = Path(cache_dir or "~/.cache/clip").expanduser() / os.path.basename(cfg["url"])
        if target.is_file():
            return target, looked
        looked.append(str(target))
    return None, looked


def _resolve_weights(spec: BackboneSpec) -> tuple[Path | None, dict[str, Any]]:
    """Return the checkpoint file to load (None = random init) and the tag's preprocessing config."""
    if spec.pretrained is None:
        return None, {}
    path = Path(spec.pretrained).expanduser()
    if path.is_file():
        return path, {}
    if spec.model == TINY_MODEL and spec.pretrained == SYNTHETIC_TAG:
        if not SYNTHETIC_WEIGHTS.is_file():
            raise WeightsNotFoundError(
                f"{SYNTHETIC_WEIGHTS} is missing; recreate it with: python -m benchmarks.miniature.pretrain"
            )
        return SYNTHETIC_WEIGHTS, {}
    cfg = open_clip.get_pretrained_cfg(spec.model, spec.pretrained)
    if not cfg:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(spec.model)) or "none"
        raise WeightsNotFoundError(
            f"pretrained={spec.pretrained!r} for {spec.model} is neither a file nor a known open_clip tag "
            f"(tags: {tags}); pass a path to a weight file, or None for random init"
        )
    # open_clip warns about this only when it resolves the tag itself, which it never does here.
    model_quick_gelu = bool(open_clip.get_model_config(spec.model).get("quick_gelu", False))
    if bool(cfg.get("quick_gelu", False)) != model_quick_gelu:
        warnings.warn(
            f"{spec.model} uses quick_gelu={model_quick_gelu} but the {spec.pretrained!r} weights were trained with "
            f"quick_gelu={not model_quick_gelu}; features will be off (e.g. use ViT-B-16-quickgelu for openai)",
            UserWarning,
            stacklevel=3,
        )
    found, looked = _cached_checkpoint(cfg, spec.cache_dir)
    if found is None:
        example = os.path.basename(cfg.get("url", "")) or HF_SAFE_WEIGHTS_NAME
        raise WeightsNotFoundError(
            f"weights {spec.model}/{spec.pretrained} not found locally (looked in: {'; '.join(looked)}); "
            f"nothing is downloaded: pass --weights /path/to/{example}, or a cache_dir holding an open_clip cache"
        )
    return found, cfg


@contextlib.contextmanager
def _quiet_root_logger():
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_weights(spec: BackboneSpec) -> Path | None:
    """Fail fast with a one-line error if the model name or its weights cannot be found offline."""
    _check_model_config(spec.model)
    return _resolve_weights(spec)[0]


def _is_torchscript_archive(path: Path) -> bool:
    # The original OpenAI checkpoints (~/.cache/clip/ViT-B-16.pt) are TorchScript archives, which
    # torch.load(weights_only=True) refuses; like torch, recognise them by their constants.pkl record.
    if path.suffix == ".safetensors" or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[-1] == "constants.pkl" for name in archive.namelist())


def _build_model(spec: BackboneSpec, device: torch.device) -> open_clip.CLIP:
    checkpoint, pretrained_cfg = _resolve_weights(spec)
    # open_clip loads plain files itself (weights_only=True); TorchScript archives are loaded below.
    scripted = checkpoint is not None and _is_torchscript_archive(checkpoint)
    file_for_open_clip = str(checkpoint) if checkpoint is not None and not scripted else None
    try:
        # open_clip logs a warning for a deliberate random init (pretrained=None); we asked for it
        quiet = _quiet_root_logger() if checkpoint is None else contextlib.nullcontext()
        with quiet:
            model = open_clip.create_model(
                spec.model,
                pretrained=file_for_open_clip,
                device=device,
                force_preprocess_cfg=pretrained_cfg,  # open_clip keeps only the preprocessing keys (mean, std, ...)
                pretrained_text=False,
                weights_only=True,
            )
        if scripted:
            with warnings.catch_warnings():  # torch deprecates TorchScript, but OpenAI's files are in it
                warnings.simplefilter("ignore", FutureWarning)
                state = torch.jit.load(str(checkpoint), map_location="cpu").state_dict()
            # Scripted state dicts also hold non-persistent buffers (the causal mask) and, for OpenAI's
            # files, a few hyper-parameters; everything else must match exactly.
            persistent = model.state_dict().keys()
            ignored = {name for name, _ in model.named_buffers()} - persistent
            model.load_state_dict({k: v for k, v in state.items() if k not in ignored and k not in _OPENAI_EXTRA_KEYS})
    except Exception as err:  # anything that goes wrong while reading a user's file is the file's fault
        if checkpoint is None:
            raise
        reason = " ".join(str(err).split())[:300] or type(err).__name__  # one line for the CLI
        raise UserError(f"cannot load {spec.model} weights from {checkpoint}: {reason}") from err
    if not isinstance(model, open_clip.CLIP) or not isinstance(model.visual, VisionTransformer):
        raise UserError(f"model {spec.model!r} is not supported: only open_clip CLIP ViT models")
    if model.text_pool_type != "argmax" or model.attn_mask is None:
        raise UserError(f"model {spec.model!r} is not supported: the text tower must be causal with EOT pooling")
    return model


def create_clip(spec: BackboneSpec, device: str | torch.device = "cpu") -> CLIPBackbone:
    """Build the CLIP of ``spec`` on ``device``, attention split, base weights frozen, no adapters."""
    _check_model_config(spec.model)
    model = _build_model(spec, torch.device(device))
    split_attention_(model)
    return CLIPBackbone(model, open_clip.get_tokenizer(spec.model))


# --------------------------------------------------------------------------- backbone


def shared_prefix_length(tokens: torch.Tensor, eot: torch.Tensor) -> int:
    """Leading positions on which every row of ``tokens`` agrees, stopping before the first EOT.

    0 for a single row (nothing to share). The EOT of every row stays after the prefix, so
    pooling still finds it.
    """
    if len(tokens) < 2:
        return 0
    agree = (tokens == tokens[:1]).all(dim=0)
    disagree = (~agree).nonzero()
    common = int(disagree[0]) if len(disagree) else tokens.shape[1]
    return min(common, int(eot.min()))


def _prefix_sharing_applies(transformer: nn.Module) -> bool:
    """Whether the text transformer is the plain batch-first stack the shared-prefix path rebuilds."""
    return transformer.batch_first and all(
        type(block) is ResidualAttentionBlock and isinstance(block.attn, SplitAttention) and not hasattr(block, "ln_1_kv")
        for block in transformer.resblocks
    )


def _text_transformer_with_shared_prefix(
    transformer: nn.Module, x: torch.Tensor, causal_mask: torch.Tensor, prefix: int, pooled: torch.Tensor
) -> torch.Tensor:
    """open_clip's causal text transformer on ``x`` ``[N, L, D]`` whose first ``prefix`` positions
    are the same in every row: the prefix runs once, the rest attends to it. Returns the output at
    each row's ``pooled`` position (its EOT, counted from the end of the prefix), ``[N, D]``.

    Only that position is read after the last block, so there the other positions give keys and
    values but no queries or MLP, and the prefix skips the block altogether.
    Follows ``ResidualAttentionBlock.forward``: ``x + ls_1(attn(ln_1 x))`` then ``x + ls_2(mlp(ln_2 x))``.
    """
    shared, rest = x[:1, :prefix], x[:, prefix:]
    suffix_mask = causal_mask[prefix:].to(x.dtype)  # rows of the suffix, columns of every position
    prefix_mask = causal_mask[:prefix, :prefix].to(x.dtype)
    *blocks, last = transformer.resblocks
    for block in blocks:
        attended = block.attn.forward_after_prefix(block.ln_1(rest), block.ln_1(shared), suffix_mask)
        rest = rest + block.ls_1(attended)
        rest = rest + block.ls_2(block.mlp(block.ln_2(rest)))
        shared = block(shared, attn_mask=prefix_mask)
    attended = last.attn.forward_after_prefix(last.ln_1(rest), last.ln_1(shared), suffix_mask, query_index=pooled)
    out = rest[torch.arange(len(rest), device=rest.device), pooled] + last.ls_1(attended)
    return out + last.ls_2(last.mlp(last.ln_2(out)))


@dataclass(frozen=True)
class PromptBucket:
    """Prompts whose EOT sits at the same position, trimmed to that length, on the model's device."""

    tokens: torch.Tensor  # [n, length]
    pooled: torch.Tensor  # [n]: each row's EOT position, counted from the end of the shared prefix
    prefix: int  # leading positions all rows share (run once); 0 for the plain path


@dataclass(frozen=True)
class PreparedPrompts:
    """Token ids in length buckets, ready for ``encode_prompts``.

    Everything that depends on token values (EOT positions, lengths, shared prefixes) is read on
    the CPU, once, so encoding prepared prompts on a GPU never waits for the device.
    """

    buckets: tuple[PromptBucket, ...]
    order: torch.Tensor | None  # rows of the concatenated bucket outputs in input order; None: already in order


def prepare_prompts(
    tokens: torch.Tensor, device: torch.device, share_prefix: bool = True, length_buckets: bool = True
) -> PreparedPrompts:
    """Group ``tokens`` ``[N, context]`` by EOT position and trim each group after its EOT.

    Positions after a prompt's EOT are never attended to under the causal mask, so a bucket's
    features equal those of the padded batch (tested); buckets only drop the padding work. With
    ``length_buckets=False`` all prompts form one bucket trimmed to the longest.
    """
    tokens = tokens.cpu()
    if len(tokens) == 0:
        raise ValueError("no prompts to encode")
    eot = tokens.argmax(dim=-1)  # EOT has the largest token id (open_clip's argmax pooling)
    if length_buckets:
        groups = [(eot == position).nonzero().flatten() for position in eot.unique().tolist()]
    else:
        groups = [torch.arange(len(tokens))]
    buckets = []
    for rows in groups:
        rows_eot = eot[rows]
        bucket = tokens[rows, : int(rows_eot.max()) + 1]
        prefix = shared_prefix_length(bucket, rows_eot) if share_prefix else 0
        buckets.append(PromptBucket(bucket.to(device), (rows_eot - prefix).to(device), prefix))
    order = None if len(groups) == 1 else torch.argsort(torch.cat(groups)).to(device)
    return PreparedPrompts(tuple(buckets), order)


def encode_prompts(model: open_clip.CLIP, prompts: PreparedPrompts, normalize: bool = True) -> torch.Tensor:
    """open_clip's text features of prepared prompts, with four exact savings from the causal mask.

    Each length bucket runs only up to its own EOT. With split attention, the token prefix shared
    by every prompt of a bucket ("<sot> a photo of a") runs through the transformer once instead
    of once per prompt, since no prefix position attends to anything after it; and the last block
    computes queries and its MLP only at the EOT, the one position pooled. Fused-attention models
    (the tiny CLIP while it is pretrained) take the plain path.
    """
    cast_dtype = model.transformer.get_cast_dtype()
    pooled = []
    for bucket in prompts.buckets:
        length = bucket.tokens.shape[1]
        x = model.token_embedding(bucket.tokens).to(cast_dtype) + model.positional_embedding[:length].to(cast_dtype)
        mask = model.attn_mask[:length, :length]
        if bucket.prefix:
            x = _text_transformer_with_shared_prefix(model.transformer, x, mask, bucket.prefix, bucket.pooled)
        else:
            x = model.transformer(x, attn_mask=mask)
            x = x[torch.arange(len(x), device=x.device), bucket.pooled]
        pooled.append(x)
    x = torch.cat(pooled) if len(pooled) > 1 else pooled[0]
    if prompts.order is not None:
        x = x[prompts.order]
    x = model.ln_final(x)  # per position, so pooling first is the same and cheaper
    x = model.text_projection(x) if isinstance(model.text_projection, nn.Linear) else x @ model.text_projection
    return F.normalize(x, dim=-1) if normalize else x


def encode_clip_text(
    model: open_clip.CLIP, tokens: torch.Tensor, normalize: bool = True, length_buckets: bool = True
) -> torch.Tensor:
    """open_clip's ``model.encode_text(tokens)``, computed as ``encode_prompts`` does."""
    share_prefix = model.text_pool_type == "argmax" and _prefix_sharing_applies(model.transformer)
    prompts = prepare_prompts(tokens, model.positional_embedding.device, share_prefix, length_buckets)
    return encode_prompts(model, prompts, normalize)


def efficient_images_per_forward(tokens_per_image: int, width: int, device_type: str) -> int:
    """How many images fit one inference forward within the device's ``ACTIVATION_BUDGET`` (at least 1)."""
    budget = ACTIVATION_BUDGET.get(device_type, ACTIVATION_BUDGET["cuda"])
    return max(1, budget // (tokens_per_image * width))


def use_compact_text(prompts: int, longest: int, width: int, device_type: str) -> bool:
    """Whether encoding ``prompts`` prompts compactly pays on ``device_type`` (``COMPACT_TEXT_MIN_WORK``)."""
    threshold = COMPACT_TEXT_MIN_WORK.get(device_type)
    return threshold is not None and prompts * longest * width**2 >= threshold


def _fp32_features(features: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Tower outputs in fp32, L2-normalised in fp32 (unit norm to fp32 rounding under any autocast)."""
    features = features.float()
    return F.normalize(features, dim=-1) if normalize else features


def efficient_prompts_per_backward(tokens_per_prompt: int, width: int, device_type: str) -> int:
    """How many prompts one text forward with a graph may hold within ``TEXT_BACKWARD_BUDGET`` (at least 1)."""
    budget = TEXT_BACKWARD_BUDGET.get(device_type, TEXT_BACKWARD_BUDGET["cuda"])
    return max(1, budget // (tokens_per_prompt * width))


class CLIPBackbone(nn.Module):
    """A frozen open_clip CLIP plus named LoRA adapters on the k/v projections of either tower.

    Adapter bookkeeping is explicit: ``set_adapters`` picks the active adapter of each tower,
    ``set_trainable`` picks which adapters get gradients. peft flips ``requires_grad`` whenever
    an adapter is added or activated, so both states are re-applied after every peft call.
    """

    def __init__(self, model: open_clip.CLIP, tokenizer: Any) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        preprocess = model.visual.preprocess_cfg
        size = preprocess["size"]
        self.image_size: int = int(size if isinstance(size, int) else size[0])
        self.mean: tuple[float, ...] = tuple(preprocess["mean"])
        self.std: tuple[float, ...] = tuple(preprocess["std"])
        self.logit_scale: float = float(model.logit_scale.detach().exp())
        self.embed_dim: int = int(model.visual.output_dim)
        model.requires_grad_(False)
        model.eval()
        self.precision = "fp32"  # set_precision: the towers' autocast; features always come out fp32
        self._towers: dict[str, Tower] = {}  # adapter name -> tower, in creation order
        self._active: dict[Tower, str | None] = {"visual": None, "text": None}
        self._trainable: set[str] = set()

    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    # ---- encoders

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids (LongTensor [N, context_length]) with open_clip's tokenizer."""
        return self.tokenizer(list(texts))

    def set_precision(self, precision: str) -> None:
        """Run both towers under autocast to ``precision`` (fp32, fp16 or bf16); features stay fp32."""
        if precision not in amp.PRECISIONS:
            raise ValueError(f"precision must be one of {amp.PRECISIONS}, not {precision!r}")
        self.precision = precision

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to the backbone's precision on its device (nothing for fp32)."""
        return amp.autocast(self.precision, self.device)

    def prepare_prompts(self, tokens: torch.Tensor, compact: bool | None = None) -> PreparedPrompts:
        """``prepare_prompts`` for this model on its device: reuse the result for repeated encodes.

        ``compact`` (length buckets and the shared prompt prefix run once) defaults to what pays on
        this device for this many prompts (``use_compact_text``); otherwise the prompts form one
        batch trimmed after the longest.
        """
        if compact is None:
            longest = int(tokens.argmax(dim=-1).max()) + 1 if len(tokens) else 0
            compact = use_compact_text(len(tokens), longest, self.model.transformer.width, self.device.type)
        share_prefix = compact and _prefix_sharing_applies(self.model.transformer)
        return prepare_prompts(tokens, self.device, share_prefix, length_buckets=compact)

    def encode_text(self, tokens: torch.Tensor | PreparedPrompts, normalize: bool = True) -> torch.Tensor:
        """fp32 text features under the active text adapter (``encode_prompts``), from token ids
        ``[N, context]`` or from ``prepare_prompts``."""
        prompts = tokens if isinstance(tokens, PreparedPrompts) else self.prepare_prompts(tokens)
        with self.autocast():
            features = encode_prompts(self.model, prompts, normalize=False)
        return _fp32_features(features, normalize)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """fp32 image features under the active visual adapter."""
        with self.autocast():
            features = self.model.encode_image(images.to(self.device, non_blocking=True))
        return _fp32_features(features, normalize)

    def encode_image_multi(
        self,
        images: torch.Tensor,
        adapters: Sequence[str | None],
        normalize: bool = True,
        max_images_per_forward: int | None = None,
    ) -> torch.Tensor:
        """Features [len(adapters), B, D] of one image batch under each visual adapter (None = base).

        The batch is repeated once per adapter and every visual LoRA layer gets peft's per-sample
        ``adapter_names`` (mixed-adapter batch). All adapters go through one forward, or, with
        ``max_images_per_forward``, as many adapters per forward as fit in that many images (at
        least one): past a device's efficient batch size, bigger forwards only cost more per image.
        An adapter alone in its forward runs as a plain forward under it. The active adapters are
        the same afterwards.
        """
        if not adapters:
            raise ValueError("encode_image_multi needs at least one adapter (None = base weights)")
        for name in adapters:
            if name is not None:
                self._check_adapter(name, "visual")
        batch = images.shape[0]
        images = images.to(self.device, non_blocking=True)
        per_forward = len(adapters) if not max_images_per_forward else max(1, max_images_per_forward // batch)
        features = []
        for start in range(0, len(adapters), per_forward):
            group = adapters[start : start + per_forward]
            if len(group) == 1:  # alone in its forward: peft's per-sample routing would only cost time
                with self._only_visual_adapter(group[0]), self.autocast():
                    features.append(self.model.encode_image(images))
                continue
            repeated = images.repeat(len(group), *([1] * (images.dim() - 1)))
            per_sample = [name or BASE_ADAPTER for name in group for _ in range(batch)]
            with self._mixed_adapter_batch(per_sample), self.autocast():
                features.append(self.model.encode_image(repeated))
        return _fp32_features(torch.cat(features), normalize).view(len(adapters), batch, -1)

    def efficient_prompts_per_backward(self, tokens_per_prompt: int) -> int:
        """Prompts per text forward with a graph on this device (``efficient_prompts_per_backward``)."""
        return efficient_prompts_per_backward(tokens_per_prompt, self.model.transformer.width, self.device.type)

    def efficient_images_per_forward(self) -> int:
        """Images per branch-batched inference forward on this device (``efficient_images_per_forward``)."""
        visual = self.model.visual  # a VisionTransformer: _check_model_config admits ViT models only
        tokens = math.prod(visual.grid_size) + 1  # patches and the class token
        return efficient_images_per_forward(tokens, visual.transformer.width, self.device.type)

    @contextlib.contextmanager
    def _only_visual_adapter(self, name: str | None) -> Iterator[None]:
        """A plain forward under one visual adapter (no mixed-batch bookkeeping), then restore."""
        active = self.active_adapters
        self.set_adapters(visual=name, text=active["text"])
        try:
            yield
        finally:
            self.set_adapters(**active)

    @contextlib.contextmanager
    def _mixed_adapter_batch(self, per_sample: list[str]) -> Iterator[None]:
        # What peft's LoraModel._enable_peft_forward_hooks does, restricted to the visual tower and
        # without its training-mode guard: a pre-hook hands `adapter_names` to LoraLayer.forward,
        # which then runs LoraLayer._mixed_batch_forward.
        def inject(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return args, {**kwargs, "adapter_names": per_sample}

        handles = [layer.register_forward_pre_hook(inject, with_kwargs=True) for layer in self._lora_layers("visual")]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    # ---- adapters

    def add_lora(self, name: str, tower: Tower, rank: int = 24, alpha: float = 1.0) -> None:
        """Add a LoRA (B = 0, so initially the identity) on k/v of every block of ``tower``; not activated."""
        if tower not in _LORA_TARGETS:
            raise ValueError(f"tower must be 'visual' or 'text', got {tower!r}")
        if name in self._towers or name == BASE_ADAPTER:
            raise ValueError(f"adapter name {name!r} is taken")
        config = LoraConfig(
            r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=_LORA_TARGETS[tower], bias="none"
        )
        with warnings.catch_warnings():
            # Several adapters on one model is the point here, not an accident peft should warn about.
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            inject_adapter_in_model(config, self.model, adapter_name=name)
        self._towers[name] = tower
        self._sync_adapter_state()

    def adapter_names(self, tower: Tower) -> list[str]:
        """Adapters of ``tower`` in creation order."""
        return [name for name, t in self._towers.items() if t == tower]

    def set_adapters(self, visual: str | None, text: str | None) -> None:
        """Choose the active adapter of each tower (None = base weights); trainability is unchanged."""
        for name, tower in ((visual, "visual"), (text, "text")):
            if name is not None:
                self._check_adapter(name, tower)
        self._active = {"visual": visual, "text": text}
        self._sync_adapter_state()

    @property
    def active_adapters(self) -> dict[Tower, str | None]:
        return dict(self._active)

    def set_trainable(self, names: Iterable[str]) -> None:
        """Make exactly the LoRA parameters of ``names`` trainable; everything else is frozen."""
        names = set(names)
        for name in names:
            self._check_adapter(name)
        self._trainable = names
        self._sync_adapter_state()

    def lora_parameters(self, name: str) -> list[nn.Parameter]:
        """The LoRA A and B weights of adapter ``name``, in module order."""
        tower = self._check_adapter(name)
        return [
            param
            for _, layer in self._named_lora_layers(tower)
            for param in (layer.lora_A[name].weight, layer.lora_B[name].weight)
        ]

    def copy_lora(self, src: str, dst: str) -> None:
        """Overwrite the weights of adapter ``dst`` with those of ``src`` (same tower, rank and alpha)."""
        tower = self._check_adapter(src)
        self._check_adapter(dst, tower)
        with torch.no_grad():
            for path, layer in self._named_lora_layers(tower):
                if layer.r[src] != layer.r[dst] or layer.scaling[src] != layer.scaling[dst]:
                    raise ValueError(f"cannot copy LoRA {src!r} to {dst!r}: rank or alpha differ at {path}")
                layer.lora_A[dst].weight.copy_(layer.lora_A[src].weight)
                layer.lora_B[dst].weight.copy_(layer.lora_B[src].weight)

    def lora_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter weights as CPU tensors keyed ``<module path>.lora_A`` / ``.lora_B`` (no adapter name in keys)."""
        tower = self._check_adapter(name)
        state: dict[str, torch.Tensor] = {}
        for path, layer in self._named_lora_layers(tower):
            state[f"{path}.lora_A"] = layer.lora_A[name].weight.detach().cpu().clone()
            state[f"{path}.lora_B"] = layer.lora_B[name].weight.detach().cpu().clone()
        return state

    def load_lora_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Load weights saved by ``lora_state_dict`` into the existing adapter ``name``."""
        tower = self._check_adapter(name)
        targets = {
            f"{path}.{kind}": getattr(layer, kind)[name].weight
            for path, layer in self._named_lora_layers(tower)
            for kind in ("lora_A", "lora_B")
        }
        missing, unexpected = targets.keys() - state.keys(), state.keys() - targets.keys()
        if missing or unexpected:
            raise UserError(
                f"LoRA state for {name!r} does not match the model: {len(missing)} missing keys "
                f"(e.g. {sorted(missing)[:1]}), {len(unexpected)} unexpected (e.g. {sorted(unexpected)[:1]})"
            )
        with torch.no_grad():
            for key, param in targets.items():
                if state[key].shape != param.shape:
                    raise UserError(f"LoRA state {key}: shape {tuple(state[key].shape)} != {tuple(param.shape)}")
                param.copy_(state[key])

    # ---- internals

    def _check_adapter(self, name: str, tower: Tower | None = None) -> Tower:
        if name not in self._towers:
            raise KeyError(f"unknown adapter {name!r}; known: {sorted(self._towers)}")
        if tower is not None and self._towers[name] != tower:
            raise ValueError(f"adapter {name!r} belongs to the {self._towers[name]} tower, not {tower}")
        return self._towers[name]

    def _named_lora_layers(self, tower: Tower) -> list[tuple[str, LoraLayer]]:
        pattern = _LORA_TARGETS[tower]
        return [
            (path, module)
            for path, module in self.model.named_modules()
            if isinstance(module, LoraLayer) and re.fullmatch(pattern, path)
        ]

    def _lora_layers(self, tower: Tower) -> list[LoraLayer]:
        return [layer for _, layer in self._named_lora_layers(tower)]

    def _sync_adapter_state(self) -> None:
        """Re-apply the active adapter of each tower and the trainable set to every LoRA layer."""
        for tower in ("visual", "text"):
            active = self._active[tower]
            for layer in self._lora_layers(tower):
                layer.set_adapter([active] if active is not None else [])
                for adapter, module in (*layer.lora_A.items(), *layer.lora_B.items()):
                    module.requires_grad_(adapter in self._trainable)

