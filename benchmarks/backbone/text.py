"""Text encoding: prompts prepared once on the CPU (trimmed after the longest, optionally in length
buckets with the shared prompt prefix run once), then encoded exactly as open_clip would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.backbone.attention import SplitAttention
from benchmarks.backbone.open_clip_types import OpenCLIPTransformer

if TYPE_CHECKING:
    import open_clip


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


def _prefix_sharing_applies(transformer: OpenCLIPTransformer) -> bool:
    """Whether the text transformer is the plain batch-first stack the shared-prefix path rebuilds
    (not while parallel MLP adapters are on: they route on token 0, which the path runs apart)."""
    from open_clip.transformer import ResidualAttentionBlock

    return (
        transformer.batch_first
        and not getattr(transformer, "parallel_adapters_active", False)
        and all(
            type(block) is ResidualAttentionBlock
            and isinstance(block.attn, SplitAttention)
            and not hasattr(block, "ln_1_kv")
            for block in transformer.resblocks
        )
    )


def _text_transformer_with_shared_prefix(
    transformer: OpenCLIPTransformer,
    x: torch.Tensor,
    causal_mask: torch.Tensor,
    prefix: int,
    pooled: torch.Tensor,
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
    attended = last.attn.forward_after_prefix(
        last.ln_1(rest), last.ln_1(shared), suffix_mask, query_index=pooled
    )
    out = rest[torch.arange(len(rest), device=rest.device), pooled] + last.ls_1(attended)
    return out + last.ls_2(last.mlp(last.ln_2(out)))


@dataclass(frozen=True)
class PromptBucket:
    """Prompts whose EOT sits at the same position, trimmed to that length, on the model's device."""

    tokens: torch.Tensor  # [n, length]
    pooled: torch.Tensor  # [n]: each row's EOT position, counted from the end of the shared prefix
    prefix: int  # leading positions all rows share (run once); 0 for the plain path
    rows: torch.Tensor | None = None  # the bucket's rows of the input, on the device (None: all, in order)
    first_eot: int = 0  # the earliest EOT position of the bucket's rows, counted from the start (CPU)


@dataclass(frozen=True)
class TextContext:
    """Learnable text context (CoOp): ``embeddings`` take the place of the token embeddings at
    positions ``start`` to ``start + M - 1`` of every prompt.

    ``embeddings`` is ``[M, width]``, one context shared by every prompt, or ``[N, M, width]``, one
    per prompt (in the order of the prompts given to ``prepare_prompts``). The prompts' own tokens at
    those positions are placeholders (CoOp's "X X X X", or the words the context starts from).
    """

    embeddings: torch.Tensor
    start: int = 1  # position 0 is the start-of-text token

    @property
    def length(self) -> int:
        return self.embeddings.shape[-2]

    @property
    def shared(self) -> bool:
        return self.embeddings.dim() == 2


@dataclass(frozen=True)
class PreparedPrompts:
    """Token ids in length buckets, ready for ``encode_prompts``.

    Everything that depends on token values (EOT positions, lengths, shared prefixes) is read on
    the CPU, once, so encoding prepared prompts on a GPU never waits for the device.
    """

    buckets: tuple[PromptBucket, ...]
    order: (
        torch.Tensor | None
    )  # rows of the concatenated bucket outputs in input order; None: already in order


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
        buckets.append(
            PromptBucket(
                bucket.to(device),
                (rows_eot - prefix).to(device),
                prefix,
                None if len(groups) == 1 else rows.to(device),
                int(rows_eot.min()),
            )
        )
    order = None if len(groups) == 1 else torch.argsort(torch.cat(groups)).to(device)
    return PreparedPrompts(tuple(buckets), order)


def _with_context(x: torch.Tensor, context: TextContext, bucket: PromptBucket) -> torch.Tensor:
    """Token embeddings ``x`` ``[n, L, D]`` of a bucket with ``context`` in place of its positions."""
    start, end = context.start, context.start + context.length
    if start < 1 or end > bucket.first_eot:
        raise ValueError(
            f"a text context at positions {start} to {end - 1} must lie between the start-of-text token "
            "and each prompt's end-of-text token: give prompts with that many placeholder words"
        )
    if context.shared:
        ctx = context.embeddings.expand(len(x), -1, -1)
    else:
        ctx = context.embeddings if bucket.rows is None else context.embeddings[bucket.rows]
        if len(ctx) != len(x):
            raise ValueError(f"{len(context.embeddings)} per-prompt contexts for {len(x)} prompts")
    return torch.cat([x[:, :start], ctx.to(x.dtype), x[:, end:]], dim=1)


def encode_prompts(
    model: open_clip.CLIP,
    prompts: PreparedPrompts,
    normalize: bool = True,
    context: TextContext | None = None,
) -> torch.Tensor:
    """open_clip's text features of prepared prompts, with four exact savings from the causal mask.

    Each length bucket runs only up to its own EOT. With split attention, the token prefix shared
    by every prompt of a bucket ("<sot> a photo of a") runs through the transformer once instead
    of once per prompt, since no prefix position attends to anything after it; and the last block
    computes queries and its MLP only at the EOT, the one position pooled. Fused-attention models
    (the tiny CLIP while it is pretrained) take the plain path.

    With a ``context`` (``TextContext``), its embeddings replace the token embeddings at its
    positions. A context shared by every prompt keeps the shared prefix; one per prompt ends it
    at the context's start, so such prompts run whole.
    """
    cast_dtype = model.transformer.get_cast_dtype()
    pooled = []
    for bucket in prompts.buckets:
        length = bucket.tokens.shape[1]
        x = model.token_embedding(bucket.tokens)
        if context is not None:
            x = _with_context(x, context, bucket)
        x = x.to(cast_dtype) + model.positional_embedding[:length].to(cast_dtype)
        mask = model.attn_mask[:length, :length]
        shares_prefix = context is None or context.shared or bucket.prefix <= context.start
        if bucket.prefix and shares_prefix and _prefix_sharing_applies(model.transformer):
            x = _text_transformer_with_shared_prefix(model.transformer, x, mask, bucket.prefix, bucket.pooled)
        else:  # prompts prepared for sharing while it applied still hold every token: run them whole
            x = model.transformer(x, attn_mask=mask)
            x = x[torch.arange(len(x), device=x.device), bucket.pooled + bucket.prefix]
        pooled.append(x)
    x = torch.cat(pooled) if len(pooled) > 1 else pooled[0]
    if prompts.order is not None:
        x = x[prompts.order]
    x = model.ln_final(x)  # per position, so pooling first is the same and cheaper
    x = (
        model.text_projection(x)
        if isinstance(model.text_projection, nn.Linear)
        else x @ model.text_projection
    )
    return F.normalize(x, dim=-1) if normalize else x


def encode_clip_text(
    model: open_clip.CLIP, tokens: torch.Tensor, normalize: bool = True, length_buckets: bool = True
) -> torch.Tensor:
    """open_clip's ``model.encode_text(tokens)``, computed as ``encode_prompts`` does."""
    share_prefix = model.text_pool_type == "argmax" and _prefix_sharing_applies(model.transformer)
    prompts = prepare_prompts(tokens, model.positional_embedding.device, share_prefix, length_buckets)
    return encode_prompts(model, prompts, normalize)
