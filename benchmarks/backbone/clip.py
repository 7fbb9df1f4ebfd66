"""``CLIPBackbone``: a frozen open_clip CLIP with named LoRA adapters (``lora.LoRAAdapters``), its
two encoders run in the backbone's precision, features always returned in fp32."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.backbone.budgets import (
    efficient_images_per_forward,
    efficient_prompts_per_backward,
    use_compact_text,
)
from benchmarks.backbone.lora import BASE_ADAPTER, LoRAAdapters, Tower
from benchmarks.backbone.mlp_adapters import MLPAdapters
from benchmarks.backbone.text import (
    PreparedPrompts,
    TextContext,
    _prefix_sharing_applies,
    encode_prompts,
    prepare_prompts,
)
from benchmarks.backbone.visual_prefix import VisualPrefix
from benchmarks.core import precision as amp
from benchmarks.core.errors import UserError

if TYPE_CHECKING:  # open_clip is imported where a model is built (loading): resolving runs needs none
    import open_clip


def _fp32_features(features: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Tower outputs in fp32, L2-normalised in fp32 (unit norm to fp32 rounding under any autocast).
    A float64 model's stay float64 (the official loop tests compare in float64 on any CPU)."""
    features = features if features.dtype == torch.float64 else features.float()
    return F.normalize(features, dim=-1) if normalize else features


class CLIPBackbone(LoRAAdapters, MLPAdapters, VisualPrefix, nn.Module):
    """A frozen open_clip CLIP plus named LoRA adapters on the k/v projections of either tower,
    optionally parallel MLP adapters on the blocks of either tower (``mlp_adapters``), prefix
    keys and values at chosen visual blocks, per forward (``visual_prefix``), and learnable token
    embeddings in the prompts, per forward (``text_context``).

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
        self.mlp_adapter_modules = nn.ModuleDict()  # add_mlp_adapters: tower -> one adapter per block
        self._text_context: TextContext | None = None  # text_context: learnable prompt embeddings

    def __deepcopy__(self, memo: dict) -> CLIPBackbone:
        """A copy of the model and its adapters that shares the tokenizer (a copy of the backbone
        of a plugin or another framework's network): its vocabulary holds no state a run changes,
        and copying it took 0.12 s of the tiny backbone's 0.13."""
        memo[id(self.tokenizer)] = self.tokenizer
        copied = self.__class__.__new__(self.__class__)
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # Avalanche's plugins that call strategy.model(x) (LwF's previous model) expect a classifier.
        raise UserError(
            "a CLIP strategy's model is its backbone, not a classifier, so a plugin that calls "
            "strategy.model(x) (e.g. LwFPlugin) cannot use it; run avalanche:LwF instead, whose model "
            "gives logits over the class ids"
        )

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
        """fp32 text features under the active text adapter and text context (``encode_prompts``),
        from token ids ``[N, context]`` or from ``prepare_prompts``."""
        prompts = tokens if isinstance(tokens, PreparedPrompts) else self.prepare_prompts(tokens)
        with self.autocast():
            features = encode_prompts(self.model, prompts, normalize=False, context=self._text_context)
        return _fp32_features(features, normalize)

    @contextlib.contextmanager
    def text_context(self, embeddings: torch.Tensor, start: int = 1) -> Iterator[None]:
        """Within the block, ``encode_text`` puts ``embeddings`` in place of the token embeddings at
        positions ``start`` to ``start + M - 1`` of every prompt (``TextContext``: ``[M, width]``
        shared, or ``[N, M, width]`` one per prompt). Gradients reach ``embeddings``: a strategy that
        holds them as an ``nn.Parameter`` trains them (CoOp). Contexts do not nest."""
        width = self.model.token_embedding.embedding_dim
        if embeddings.dim() not in (2, 3) or embeddings.shape[-1] != width:
            raise ValueError(
                f"a text context must be [M, {width}] or [N, M, {width}], not {tuple(embeddings.shape)}"
            )
        if self._text_context is not None:
            raise RuntimeError("text_context blocks do not nest")
        self._text_context = TextContext(embeddings, start)
        try:
            yield
        finally:
            self._text_context = None

    @property
    def active_text_context(self) -> TextContext | None:
        """The ``text_context`` in force, or None."""
        return self._text_context

    def word_embeddings(self, words: str) -> torch.Tensor:
        """The token embeddings ``[M, width]`` (fp32, a copy) of ``words`` as the tokenizer splits
        them, without the start and end tokens: a text context that starts as these words gives
        the same features as the prompt that spells them."""
        tokens = self.tokenize([words])[0]
        end = int(tokens.argmax())  # the end-of-text token has the largest id
        ids = tokens[1:end].to(self.device)
        if len(ids) == 0:
            raise ValueError(f"{words!r} has no tokens")
        return self.model.token_embedding.weight[ids].detach().float().clone()

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
        return efficient_prompts_per_backward(
            tokens_per_prompt, self.model.transformer.width, self.device.type
        )

    def efficient_images_per_forward(self) -> int:
        """Images per branch-batched inference forward on this device (``efficient_images_per_forward``)."""
        visual = self.model.visual  # a VisionTransformer: _check_model_config admits ViT models only
        tokens = math.prod(visual.grid_size) + 1  # patches and the class token
        return efficient_images_per_forward(tokens, visual.transformer.width, self.device.type)
