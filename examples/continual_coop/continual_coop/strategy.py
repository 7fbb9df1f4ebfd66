"""Continual CoOp: one learnable text context, shared by every class, trained task after task.

CoOp (Zhou et al., "Learning to Prompt for Vision-Language Models", IJCV 2022) replaces the words
of CLIP's prompt template by M learnable token embeddings. Here the context is the template's own
words ("a photo of a", M = 4) at first, so before training the strategy is zero-shot CLIP; it goes
through the suite's text path (``CLIPBackbone.text_context``), so precision and the compact text
encoding apply.

- Every task: the context learns by cross-entropy over the current task's classes, at CLIP's logit
  scale. Both towers stay frozen. The context carries over to the next task (no replay, no
  regularisation: a plain continual baseline, which forgets).
- Scores: cosine similarity of an image to every seen class's prompt under the context. No task id.

RECIPE (an example, not a published continual method, and not a paper row):

| hyper-parameter | value | source |
|---|---|---|
| context | 4 vectors, initialised from "a photo of a", shared by every class | CoOp's initialisation option |
| optimiser / lr | SGD, momentum 0.9 / 0.002 | CoOp's configs/trainers/CoOp/vit_b16.yaml (KaiyangZhou/CoOp@6979355); momentum: Dassl's default |
| weight decay | 5e-4 | Dassl's default, which CoOp's configs keep |
| batch / schedule | 32 / cosine | CoOp's vit_b16.yaml |
| warm-up | none (CoOp: one epoch at a constant 1e-5) | this example: the suite's schedules warm up linearly |
| train augmentation | random resized crop and flip ("rrc_flip") | CoOp's vit_b16.yaml |
| epochs a task | 10 (CoOp: 200 on 16 images a class) | this example |

Run it beside GR4CIL, from the suite's checkout::

    PYTHONPATH=examples/continual_coop python -m benchmarks.run --suite smoke \\
        --strategies continual_coop.strategy:ContinualCoOp,gr4cil --seeds 0,1
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.core.errors import UserError
from benchmarks.data.transforms import TrainAugmentation
from strategies.base import CLIPStrategy, StrategyConfig
from strategies.optim import Optimizer


@dataclass
class ContinualCoOpConfig(StrategyConfig):
    context_init: str = "a photo of a"  # the context's first value: these words' token embeddings
    prompt_template: str = "a photo of a {}."  # must start with context_init: its words are the placeholders
    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.002
    optimizer: Optimizer = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    train_augmentation: TrainAugmentation = "rrc_flip"


class ContinualCoOp(CLIPStrategy[ContinualCoOpConfig]):
    Config = ContinualCoOpConfig
    checkpoint_attributes = ("context",)  # saved after every task; restored in place on a resume

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        init = self.cfg.context_init
        if len(self.templates) != 1 or not self.templates[0].startswith(init + " "):
            raise UserError(
                f"continual CoOp puts its context in place of the template's first words: "
                f"prompt_template {self.templates[0]!r} must start with context_init {init!r}"
            )
        # An nn.Parameter with requires_grad that the strategy holds: the base optimises it.
        self.context = nn.Parameter(self.backbone.word_embeddings(init))

    def setup_task(self, task: int, classes: list[int]) -> None:
        self.backbone.set_adapters(visual=None, text=None)
        self.backbone.set_trainable([])  # both towers frozen: only the context learns

    def class_features(self, class_ids: list[int]) -> torch.Tensor:
        """Normalised text features of the classes' prompts with the learned context."""
        with self.backbone.text_context(self.context, start=1):  # position 0 is the start token
            return self.text_features(class_ids)

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images)
        return self.backbone.logit_scale * image @ self.class_features(self.current_classes).T

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_image(images) @ self.class_features(self.seen_classes).T
