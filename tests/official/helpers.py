"""What the official-code tests share: a named closeness check and a dropout with a given mask."""

import torch
from torch import nn


def close(name: str, ours, theirs: torch.Tensor, atol: float) -> None:
    """``ours`` equals the official ``theirs`` to ``atol`` (max absolute difference), same shape."""
    ours = torch.as_tensor(ours).detach().float()
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    diff = (ours - theirs).abs().max().item()
    assert diff <= atol, f"{name}: max |suite - official| = {diff:.3g} > {atol:g}"


class GivenMask(nn.Module):
    """A dropout that applies the fixture's keep mask (the official side ran with the same)."""

    def __init__(self, mask: torch.Tensor, p: float) -> None:
        super().__init__()
        self.mask, self.p = mask, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask / (1 - self.p) if self.training else x
