"""Sequential fine-tuning: the forgetting lower bound.

One shared visual LoRA and one text LoRA are trained task after task with cross-entropy over the
current task's classes only (logits ``logit_scale * <v, t_c>``), with no mechanism against
forgetting. At test time it scores all seen classes with the latest adapters.
"""

from __future__ import annotations

import torch

from strategies.base import CLIPStrategy
from strategies.config import StrategyConfig
from strategies.registry import register


@register("finetune")
class Finetune(CLIPStrategy[StrategyConfig]):
    def setup_task(self, task: int, classes: list[int]) -> None:
        if task == 0:
            self.add_adapter("visual", tower="visual")
            self.add_adapter("text", tower="text")
        self.backbone.set_adapters(visual="visual", text="text")
        self.backbone.set_trainable(["visual", "text"])

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return self.backbone.logit_scale * image @ self.text_features(self.current_classes).T

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return image @ self.text_features(self.seen_classes).T
