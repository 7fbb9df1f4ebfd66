"""MOE4CL = MoE-Adapters (Yu et al., CVPR 2024): a mixture of two AdaptFormer experts with a
noisy router, parallel to the MLP of every block of both CLIP towers, trained continually.

Paper row "MOE4CL" (docs/baselines.md §6; facts from its paper and code, no code reused).

* Every block of both towers gets ``x = h + mlp(ln_2 h) + sum_e g_e(h_0) Adapter_e(h)``, h the
  residual stream after attention (``benchmarks.backbone.mlp_adapters``). The router reads token 0:
  [CLS] in the visual tower, SOT in the text tower, where the causal mask makes the gates the same
  for every prompt.
* The same 4.03M parameters (ViT-B/16) train on every task with CE over the current classes on
  ``s cos(v, t_c)``, the text re-encoded through its adapters each step; nothing is added, frozen
  or merged between tasks. ``scores`` returns ``s cos(v, t_c)`` over the seen classes (the runner's
  softmax of them is the official model output).
* Left out, as in the official CIL code: DDAS (MTIL only), activate-freeze, a balance loss.
* Deviations (docs/decisions.md D4): gate noise is off at evaluation (``eval_gate_noise = True`` restores the
  official noisy evaluation; then the text features of one evaluation pass share one noise draw),
  and the test transform is the shared eval transform, not the train transform. One epoch is one
  pass, not the official ``num_batches + 1`` iterations.

RECIPE (CIFAR-100 10 tasks; the same on every dataset):

| hyper-parameter | value | source |
|---|---|---|
| adapters | parallel to the MLP, every block of both towers, input = residual after attention | code: cil/clip/model.py |
| experts | 2 per block, bottleneck 64, ReLU, dropout 0.1, scale 0.1, up-projection 0 | code: cil/clip/adapter.py |
| router | 1 per block, token 0, noisy top-2, zero init, no balance loss; test noise off | code: cil/clip/model.py; D4 |
| loss / prompt | CE over current classes; "a bad photo of a {}." | code: continual_clip/models.py, configs |
| optimiser | AdamW, lr 1e-3, wd 0, new each task | code: configs |
| schedule | 30 linear warm-up steps, cosine to 0, per iteration | code: utils.cosine_lr |
| epochs / batch | 1 / 128 | code: configs (CIFAR 10-10) |
| precision | fp32 (`amp = False`; an explicit --precision wins) | code: build_model |
| train / test transform | rrc90 / shared eval transform | code: main.py; D4 |
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.registry import register


@dataclass
class MOE4CLConfig(StrategyConfig):
    epochs: int = 1
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 30
    prompt_template: str = "a bad photo of a {}."
    train_augmentation: TrainAugmentation = "rrc90"
    amp: bool = False  # fp32, as the official code
    experts: int = 2
    bottleneck: int = 64
    adapter_dropout: float = 0.1
    adapter_scale: float = 0.1
    top_k: int = 2
    eval_gate_noise: bool = False  # True: the official stochastic evaluation


@register("moe4cl")
class MOE4CL(CLIPStrategy[MOE4CLConfig]):
    Config = MOE4CLConfig
    # The experts and routers of both towers (``state/moe_adapters/<tower>.<block>...``).
    checkpoint_attributes = ("moe_adapters",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Added once, here rather than in setup_task(0), so a checkpoint finds them to load into;
        # with zero up-projections they leave CLIP unchanged until the first step.
        cfg = self.cfg
        for tower in ("visual", "text"):
            self.backbone.add_mlp_adapters(
                tower,
                experts=cfg.experts,
                bottleneck=cfg.bottleneck,
                dropout=cfg.adapter_dropout,
                scale=cfg.adapter_scale,
                router=cfg.experts > 1,
                top_k=cfg.top_k if cfg.experts > 1 else None,
            )
        self.backbone.set_gate_noise_at_eval(cfg.eval_gate_noise)

    @property
    def moe_adapters(self) -> nn.ModuleDict:
        return self.backbone.mlp_adapter_modules

    # ---------------------------------------------------------------- training and inference
    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)  # no LoRA: the experts are the adapters

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return self.backbone.logit_scale * image @ self.text_features(self.current_classes).T

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return self.backbone.logit_scale * image @ self.text_features(self.seen_classes).T

    # ---------------------------------------------------------------- counts and checkpoints
    def trainable_parameter_count(self) -> int:
        """Experts and routers of both towers, shared by every task (counted once)."""
        return sum(p.numel() for p in self.backbone.mlp_adapter_parameters())
