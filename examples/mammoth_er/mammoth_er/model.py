"""Experience replay in Mammoth's shape: each training batch is joined by a batch drawn from a
small reservoir buffer of earlier (not augmented) images, and trained with cross-entropy over
every class id. The buffer is checkpointed, so a resumed run replays the same images.

Run it with the suite as ``--strategies mammoth:mammoth_er.model:ER``."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from strategies.frameworks.common import FrameworkConfig, Head


@dataclass
class ERConfig(FrameworkConfig):
    head: Head = "cosine"  # starts at zero-shot CLIP
    buffer_size: int = 200  # images kept over the stream
    minibatch_size: int = 32  # replayed images a step
    training_batch_sizes: ClassVar[tuple[str, ...]] = ("batch_size", "minibatch_size")
    lr: float = 1e-3
    weight_decay: float = 0.0


class ER(nn.Module):
    """Reservoir-sampling replay around ``net`` (the adapter's CLIP classifier)."""

    Config = ERConfig
    checkpoint_attributes = ("buffer_images", "buffer_labels", "examples_seen")

    def __init__(self, backbone: nn.Module, loss: nn.Module, args, transform=None) -> None:
        super().__init__()
        self.net, self.loss, self.args, self.transform = backbone, loss, args, transform
        self.opt = None  # the adapter builds it from the config
        self.buffer_images = torch.empty(0)  # on the CPU, filled at the first batch
        self.buffer_labels = torch.empty(0, dtype=torch.long)
        self.examples_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def observe(self, inputs, labels, not_aug_inputs, epoch=None) -> float:
        self.opt.zero_grad()
        if len(self.buffer_labels):
            pick = torch.randint(len(self.buffer_labels), (self.args.minibatch_size,))
            inputs = torch.cat([inputs, self.buffer_images[pick].to(inputs.device)])
            labels_all = torch.cat([labels, self.buffer_labels[pick].to(labels.device)])
        else:
            labels_all = labels
        loss = self.loss(self.net(inputs), labels_all)
        loss.backward()
        self.opt.step()
        self.add_to_buffer(not_aug_inputs.cpu(), labels.cpu())
        return loss.item()

    def add_to_buffer(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Reservoir sampling: every image seen so far is in the buffer with the same chance."""
        if not len(self.buffer_labels):
            self.buffer_images = images.new_empty((0, *images.shape[1:]))
        for image, label in zip(images, labels):
            if len(self.buffer_labels) < self.args.buffer_size:
                self.buffer_images = torch.cat([self.buffer_images, image[None]])
                self.buffer_labels = torch.cat([self.buffer_labels, label[None]])
            else:
                slot = int(torch.randint(self.examples_seen + 1, ()))
                if slot < self.args.buffer_size:
                    self.buffer_images[slot], self.buffer_labels[slot] = image, label
            self.examples_seen += 1
