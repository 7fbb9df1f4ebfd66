"""Attention surgery: open_clip's fused ``nn.MultiheadAttention`` replaced by ``SplitAttention``
(separate q/k/v/out linear layers, numerically the same forward), so peft can put LoRA on k and v."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.core.errors import UserError

if TYPE_CHECKING:
    import open_clip


class SplitAttention(nn.Module):
    """``nn.MultiheadAttention`` with separate q/k/v projections, computed with SDPA.

    Takes over the weights of a fused module and its call convention as open_clip uses it:
    ``attn(q_x, k_x, v_x, need_weights=False, attn_mask=mask)[0]``.
    """

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        if (
            mha.in_proj_weight is None
            or mha.in_proj_bias is None
            or mha.bias_k is not None
            or mha.add_zero_attn
        ):
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
        # Prefix keys and values [B or 1, P, width], set per forward by ``visual_prefix``: joined
        # after k_proj / v_proj, so neither the projection nor LoRA applies to them.
        self.prefix: tuple[torch.Tensor, torch.Tensor] | None = None

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
            raise NotImplementedError(
                "SplitAttention supports need_weights=False without key_padding_mask only"
            )
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, length, dim = query.shape
        q, k, v = (
            proj(x).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
            for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        )
        mask = self._sdpa_mask(attn_mask, batch, q.dtype)
        if self.prefix is not None:
            if is_causal and attn_mask is None:
                raise NotImplementedError("a key/value prefix with is_causal needs an explicit mask")
            k, v, mask = self._join_prefix(k, v, mask, batch)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal and mask is None,
        )
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))
        return (out if self.batch_first else out.transpose(0, 1)), None

    def forward_after_prefix(
        self,
        rest: torch.Tensor,
        prefix: torch.Tensor,
        attn_mask: torch.Tensor,
        query_index: torch.Tensor | None = None,
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
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask.to(q.dtype), dropout_p=self.dropout if self.training else 0.0
        )
        out = self.out_proj(out.transpose(1, 2).reshape(rows, -1, dim))
        return out if query_index is None else out[:, 0]

    def fused(self) -> nn.MultiheadAttention:
        """The ``nn.MultiheadAttention`` this module was split from: its weights, dropout and layout."""
        if (
            type(self.q_proj) is not nn.Linear
            or type(self.k_proj) is not nn.Linear
            or type(self.v_proj) is not nn.Linear
        ):
            raise ValueError("an attention with adapters on its projections has no fused form")
        dim = self.num_heads * self.head_dim
        q, k, v, out = self.q_proj, self.k_proj, self.v_proj, self.out_proj
        mha = nn.MultiheadAttention(
            dim,
            self.num_heads,
            dropout=self.dropout,
            batch_first=self.batch_first,
            device=q.weight.device,
            dtype=q.weight.dtype,
        )
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            mha.in_proj_bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
            mha.out_proj.weight.copy_(out.weight)
            mha.out_proj.bias.copy_(out.bias)
        mha.train(self.training)
        return mha

    def _join_prefix(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, batch: int):
        """Keys and values [B, H, P + S, d] with the prefix first, and the mask with P columns that
        every query may attend."""
        if self.prefix is None:
            raise ValueError("no prefix to join: set one with visual_prefix")
        prefix_k, prefix_v = self.prefix
        if prefix_k.shape[0] not in (1, batch):
            raise ValueError(
                f"a prefix of {prefix_k.shape[0]} rows for a batch of {batch}: give one row per "
                "sample, or one row for all"
            )

        def heads(t: torch.Tensor) -> torch.Tensor:  # autocast: the prefix joins in the query dtype
            t = t.to(k.dtype).expand(batch, -1, -1)
            return t.reshape(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)

        k = torch.cat([heads(prefix_k), k], dim=2)
        v = torch.cat([heads(prefix_v), v], dim=2)
        if mask is not None:
            allowed = torch.ones if mask.dtype == torch.bool else torch.zeros  # SDPA: True / 0 = may attend
            mask = torch.cat(
                [allowed(*mask.shape[:-1], prefix_k.shape[1], dtype=mask.dtype, device=mask.device), mask],
                dim=-1,
            )
        return k, v, mask

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
                raise UserError(
                    f"unsupported attention block {type(block).__name__}; use a standard CLIP ViT config"
                )
            block.attn = SplitAttention(block.attn)
    if any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        raise UserError(
            "models with attention outside the residual blocks (attentional pooler) are not supported"
        )


def fuse_attention_(model: nn.Module) -> None:
    """Undo ``split_attention_`` in place: every ``SplitAttention`` of ``model`` becomes the fused
    ``nn.MultiheadAttention`` open_clip builds, so the model has open_clip's own modules and state-dict
    keys (``attn.in_proj_weight``), for code written against open_clip's layout."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, SplitAttention):
                setattr(module, name, child.fused())
