"""The map-style datasets that hold images: ``FileListDataset`` (files on disk) and
``TransformedDataset`` (a transform over another). They are torch ``Dataset`` s, so this module
imports torch; a loader imports it where it builds images, never at its own import, so that
reading a suite, reading results and ``prepare`` start without torch (``benchmarks.data.datasets``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from PIL import Image
from torch.utils.data import Dataset


def default_loader(path: str) -> Any:
    """torchvision's image loader (an RGB PIL image, or accimage where torchvision is set to it)."""
    from torchvision.datasets.folder import default_loader as torchvision_loader

    return torchvision_loader(path)


class SizedDataset(Protocol):
    """What a map-style dataset offers that torch's ``Dataset`` type leaves out: its length."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class FileListDataset(Dataset):
    """Images listed as ``(path, label)`` pairs, opened lazily as RGB PIL images."""

    def __init__(self, samples: list[tuple[str, int]], loader: Callable[[str], Any] = default_loader) -> None:
        self.samples = samples
        self.targets = [label for _, label in samples]
        self.loader = loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.samples[index]
        return self.loader(path), label


class TransformedDataset(Dataset):
    """``(transform(image), label)`` pairs of a dataset of ``(image, label)``; picklable, so the
    transform runs in DataLoader workers under every start method (fork, forkserver, spawn)."""

    def __init__(self, dataset: SizedDataset, transform: Callable[[Any], Any]) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.dataset[index]
        return self.transform(image), int(label)
