"""L2P++ (Smith et al., CODA-Prompt, CVPR 2023): Learning to Prompt (Wang et al., CVPR 2022) as
prefix tuning. Paper row "L2P++" (docs/baselines.md §9; facts from the papers and the
CODA-Prompt code, no code reused), on the shared prompt protocol (``strategies.prompting``,
docs/decisions.md D6).

Per image: q = the frozen query; the ``top_k`` keys of the pool most similar to q (cosine) pick
their prompts; at block ``prompt_layer`` the selected prompts' first halves join the keys and
their second halves the values; logits = head(prompted embedding). Loss: CE over the current
classes + ``key_loss_weight`` * sum of (1 - cos(q, k_j)) (the query
detached; only the keys learn from it), each query paired with every key selected anywhere in the
batch, as the CODA-Prompt code computes it (``key_loss = "own_topk"``: each image's own top-k, as
the L2P paper writes it). The whole pool, its keys and the head train at every task;
nothing is frozen or masked. Inference: the same forward, per-image top-k, head logits over the
seen classes.

Official behaviour by default (D4): the key loss pairs every query with every key selected
anywhere in the batch (about B times the pull of each image's own top-k) and the train loader drops
the last partial batch (``drop_last``).

RECIPE (CIFAR-100 10 tasks):

| hyper-parameter | value | source |
|---|---|---|
| pool / length / top-k | 30 / 20 (10 key + 10 value vectors) / 5 | code: experiments/cifar-100.sh `--prompt_param 30 20 -1` |
| prompt layers / init | block 0 / uniform [0, 1) | code: models/zoo.py |
| key loss | sum of (1 - cos), weight 1, every (query, key selected in the batch) pair | code: models/zoo.py; D4 |
| query, head | frozen 512-d embedding; Linear(512, C) with bias | D6 |
| loss | CE over the current classes | code: learners/prompt.py |
| optimiser | Adam, lr 1e-3, wd 0, batch 128, CODA cosine per epoch | code: configs/cifar-100_prompt.yaml, utils/schedulers.py |
| epochs | 20 (CIFAR-100), 50 (ImageNet-R), 10 (ImageNet-100, ImageNet-1K) | code: configs; fallback |
| train augmentation | rrc_flip | code: dataloaders/utils.py |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.core.errors import UserError
from strategies.prompting import (
    KeyLoss,
    PromptConfig,
    PromptPool,
    PromptStrategy,
    cosine_matrix,
    key_loss,
    prefix_from_prompts,
    select_prompts,
)
from strategies.registry import register


@dataclass
class L2PConfig(PromptConfig):
    pool_size: int = 30
    prompt_length: int = 20  # 10 key + 10 value prefix vectors
    top_k: int = 5
    prompt_layer: int = 0
    key_loss: KeyLoss = "all_pairs"  # the CODA-Prompt code; "own_topk": each image's own top-k
    key_loss_weight: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.top_k <= self.pool_size:
            raise UserError(
                f"l2p_pp option top_k={self.top_k} must be between 1 and pool_size={self.pool_size}"
            )
        if self.prompt_length < 2 or self.prompt_length % 2:
            raise UserError(f"l2p_pp option prompt_length={self.prompt_length} must be even (keys + values)")


@register("l2p_pp")
class L2PPlusPlus(PromptStrategy[L2PConfig]):
    Config = L2PConfig
    checkpoint_attributes = ("head", "pool")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cfg = self.cfg
        self.check_layers("prompt_layer", [cfg.prompt_layer])
        self.pool = PromptPool(
            cfg.pool_size, cfg.prompt_length, self.visual_width, self.backbone.embed_dim
        ).to(self.device)
        self.last_selection: torch.Tensor | None = None  # the latest batch's top-k, for tests

    def prefixes(self, query: torch.Tensor, train: bool) -> tuple[dict, torch.Tensor]:
        cosines = cosine_matrix(query.detach(), self.pool.keys)
        selected = select_prompts(cosines, self.cfg.top_k)
        self.last_selection = selected
        keys, values = prefix_from_prompts(self.pool.prompts[selected])
        extra = (
            self.cfg.key_loss_weight * key_loss(cosines, selected, self.cfg.key_loss)
            if train
            else cosines.new_zeros(())
        )
        return {self.cfg.prompt_layer: (keys, values)}, extra

    def extra_trainable_parameters(self) -> list:
        return [*self.pool.parameters(), *super().extra_trainable_parameters()]
