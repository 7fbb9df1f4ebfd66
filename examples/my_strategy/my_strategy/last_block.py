"""Sequential fine-tuning of the image tower's last block: a strategy that trains part of the
backbone itself, not an adapter beside it.

- Every task: the last residual block of the image tower trains with CLIP's text classifier over
  the task's classes (cross-entropy at CLIP's logit scale); every other weight stays frozen.
- Scores: CLIP's text classifier over every seen class, through the tuned tower. No task id, and
  nothing against forgetting: a lower bound, as sequential fine-tuning is.
- The block's weights are saved with every checkpoint (``last_block``) and loaded back on resume.

RECIPE (an example, not a published method: every value is this file's own choice; the rest is
``StrategyConfig``'s default):

| hyper-parameter | value | source |
|---|---|---|
| trained | the image tower's last residual block, every task; nothing else | this example |
| loss | cross-entropy on CLIP's text classifier over the task's classes, CLIP's logit scale | this example |
| optimiser / lr / wd | AdamW / 1e-5 / 0.1 | this example (lr); StrategyConfig (optimiser, wd) |
| batch / epochs / schedule | 64 / 5 / cosine per iteration | StrategyConfig (batch, schedule); this example (epochs) |
| train augmentation | "paper": the dataset's (resolved by the suite) | StrategyConfig |
| scoring | CLIP's text classifier over every seen class, tuned tower | this example |

    PYTHONPATH=examples/my_strategy python -m benchmarks.run --suite smoke \\
        --strategies my_strategy.last_block:LastBlock,gr4cil --seeds 0,1
"""  # noqa: E501 (Markdown table rows must stay on one line)

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.base import CLIPStrategy, StrategyConfig


@dataclass
class LastBlockConfig(StrategyConfig):
    epochs: int = 5
    lr: float = 1e-5  # a pretrained block's weights move little, as full fine-tuning of CLIP does


class LastBlock(CLIPStrategy[LastBlockConfig]):
    Config = LastBlockConfig
    checkpoint_attributes = ("last_block",)

    @property
    def block(self) -> torch.nn.Module:
        """The image tower's last residual block (open_clip's ``VisionTransformer``)."""
        return self.backbone.model.visual.transformer.resblocks[-1]

    @property
    def last_block(self) -> dict[str, torch.Tensor]:
        """The block's weights, as every checkpoint saves them."""
        return {name: value.detach().cpu() for name, value in self.block.state_dict().items()}

    @last_block.setter
    def last_block(self, state: dict[str, torch.Tensor]) -> None:  # a resumed run's weights
        self.block.load_state_dict(state)

    def setup_task(self, task: int, classes: list[int]) -> None:
        self.block.requires_grad_(True)  # the base's optimiser takes every parameter that needs grad

    def finish_task(self, task: int, classes: list[int]) -> None:
        self.block.requires_grad_(False)

    def compute_logits(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return self.backbone.logit_scale * image @ self.text_features(self.current_classes).T

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        image = self.backbone.encode_image(images, normalize=True)
        return image @ self.text_features(self.seen_classes).T
