"""Nearest class mean on a LoRA-tuned image encoder: a strategy from outside the suite.

- Task 1: a LoRA on the image tower learns with CLIP's text classifier over the task's classes
  (cross-entropy at CLIP's logit scale). It is frozen afterwards.
- After every task: each new class's prototype is the normalised mean of its training images'
  features (eval transform), through the adapted tower.
- Scores: the cosine similarity of an image to the prototypes of every seen class. No task id.

RECIPE (an example, not a published method: every value is this file's own choice; the rest is
``StrategyConfig``'s default):

| hyper-parameter | value | source |
|---|---|---|
| adapter | LoRA on the image tower, rank 8, alpha 16 (scale 2) | this example |
| tuned on | task 1 only, then frozen | this example |
| loss | cross-entropy on CLIP's text classifier over the task's classes, CLIP's logit scale | this example |
| optimiser / lr / wd | AdamW / 5e-3 / 0.1 | this example (lr); StrategyConfig (optimiser, wd) |
| batch / epochs / schedule | 64 / 5 / cosine per iteration | StrategyConfig (batch, schedule); this example (epochs) |
| train augmentation | "paper": the dataset's (resolved by the suite) | StrategyConfig |
| prototypes | normalised class mean of adapted features, eval transform | this example |
| scoring | cosine to every seen prototype | this example |

Run it beside GR4CIL, from the suite's checkout::

    PYTHONPATH=examples/my_strategy python -m benchmarks.run --suite smoke \\
        --strategies my_strategy.strategy:MyStrategy,gr4cil --seeds 0,1
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strategies.base import CLIPStrategy, StrategyConfig


@dataclass
class MyStrategyConfig(StrategyConfig):
    epochs: int = 5  # of task 1; later tasks only add prototypes
    lr: float = 5e-3
    lora_rank: int = 8
    lora_alpha: float = 16.0  # a LoRA update scaled by alpha / rank = 2, as peft users often do


class MyStrategy(CLIPStrategy[MyStrategyConfig]):
    Config = MyStrategyConfig
    checkpoint_attributes = ("prototypes",)  # saved and restored with every checkpoint

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.prototypes = torch.zeros(0, self.backbone.embed_dim)  # one row per seen class

    def setup_task(self, task: int, classes: list[int]) -> None:
        if task == 0:
            self.add_adapter("visual", tower="visual")
            self.backbone.set_adapters(visual="visual", text=None)
            self.backbone.set_trainable(["visual"])
        else:
            self.train_epochs = 0  # the adapter stays as task 1 left it
            self.backbone.set_trainable([])

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images)
        return self.backbone.logit_scale * image @ self.text_features(self.current_classes).T

    def finish_task(self, task: int, classes: list[int]) -> None:
        features, labels = self.encode_dataset(self.adapted_dataset.eval(), adapter="visual")
        means = torch.stack([features[labels == c].mean(dim=0) for c in classes])
        self.prototypes = torch.cat([self.prototypes, F.normalize(means, dim=-1)])

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_image(images) @ self.prototypes.to(images.device).T
