"""A reservoir of examples, labels and logits; which slot an example takes, and which examples a
draw returns, come from numpy's global RNG."""

import numpy as np
import torch


class Buffer:
    def __init__(self, buffer_size: int, device="cpu") -> None:
        self.buffer_size = buffer_size
        self.device = device
        self.num_seen_examples = 0
        self.attributes = ["examples", "labels", "logits"]

    def __len__(self) -> int:
        return min(self.num_seen_examples, self.buffer_size)

    def is_empty(self) -> bool:
        return self.num_seen_examples == 0

    def add_data(self, examples, labels, logits=None) -> None:
        if not hasattr(self, "examples"):
            self.examples = torch.zeros((self.buffer_size, *examples.shape[1:]), device=self.device)
            self.labels = torch.zeros(self.buffer_size, dtype=torch.long, device=self.device)
            if logits is not None:
                self.logits = torch.zeros((self.buffer_size, *logits.shape[1:]), device=self.device)
        for i in range(len(examples)):
            if self.num_seen_examples < self.buffer_size:
                slot = self.num_seen_examples
            else:
                slot = int(np.random.randint(0, self.num_seen_examples + 1))
            self.num_seen_examples += 1
            if slot < self.buffer_size:
                self.examples[slot] = examples[i].to(self.device)
                self.labels[slot] = labels[i].to(self.device)
                if logits is not None:
                    self.logits[slot] = logits[i].to(self.device)

    def get_data(self, size: int, device=None):
        pick = np.random.choice(len(self), size=min(size, len(self)), replace=False)
        out = [self.examples[pick], self.labels[pick]] + (
            [self.logits[pick]] if hasattr(self, "logits") else []
        )
        return tuple(t.to(device or self.device) for t in out)
