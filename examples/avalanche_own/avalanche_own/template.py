"""A SupervisedTemplate subclass, written for Avalanche alone: it knows nothing of the suite.

``python -m benchmarks.run --strategies avalanche:avalanche_own.template:SeenClassesOnly`` runs it
on a head over CLIP image features; its ``smoothing`` is an option of the suite's
``[strategy."avalanche:avalanche_own.template:SeenClassesOnly"]`` table.
"""

import torch
import torch.nn.functional as F
from avalanche.training.templates import SupervisedTemplate


class SeenClassesOnly(SupervisedTemplate):
    """Cross-entropy over the classes seen so far only (a masked head), with label smoothing."""

    def __init__(self, *, smoothing: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.smoothing = smoothing
        self.seen: set[int] = set()

    def _before_training_exp(self, **kwargs):
        self.seen |= {int(c) for c in self.experience.classes_in_this_experience}
        super()._before_training_exp(**kwargs)

    def criterion(self):
        if not self.is_training:
            return super().criterion()
        seen = sorted(self.seen)
        position = torch.full((self.mb_output.shape[1],), -1, dtype=torch.long, device=self.mb_y.device)
        position[seen] = torch.arange(len(seen), device=self.mb_y.device)
        logits = self.mb_output[:, seen]
        return F.cross_entropy(logits, position[self.mb_y], label_smoothing=self.smoothing)
