"""Image transforms of the shared protocol (docs/decisions.md P1).

Both pipelines take a PIL image and return a normalised ``float32`` tensor of shape
``(3, image_size, image_size)``.
"""

from __future__ import annotations

import typing
import zlib
from collections.abc import Sequence
from typing import Literal

import numpy as np
from PIL import Image
from torchvision import transforms as T

CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert grayscale, palette or RGBA images to RGB (a module-level function pickles for workers)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def eval_transform(
    image_size: int,
    mean: Sequence[float] = CLIP_MEAN,
    std: Sequence[float] = CLIP_STD,
) -> T.Compose:
    """Bicubic resize of the shorter side, centre crop, tensor, normalise (no augmentation)."""
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(image_size),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )


# "paper": the paper's pipeline, whose crop pads 4 pixels of a 224 px input.
# "paper-scaled": the same pipeline with the padding scaled to the input (4 * size / 224, at least
#   1 pixel): 4 px of padding is 12% of a 32 px miniature image but under 2% of a 224 px one.
# "none": the evaluation transform (no augmentation).
# "rrc90": RandomResizedCrop(scale (0.9, 1.0), bicubic), open_clip's default train preprocessing
#   (MOE4CL, MagMax).
# "rrc_flip": RandomResizedCrop (torchvision's default scale (0.08, 1.0)) and a horizontal flip, the
#   CODA-Prompt codebase's train transform (L2P++, DualPrompt, CODA-Prompt).
# "flip": the eval transform plus a horizontal flip (CLAP's train transform).
# "rrc05_flip": RandomResizedCrop (scale (0.05, 1.0), ratio (3/4, 4/3)) and a flip, the RevisitingCIL
#   ViT augmentation (an option of APER-Adapter).
TrainAugmentation = Literal["paper", "paper-scaled", "none", "rrc90", "rrc_flip", "flip", "rrc05_flip"]
TRAIN_AUGMENTATIONS = typing.get_args(TrainAugmentation)
#: the train augmentations that begin as the eval transform does, with the bicubic resize of the
#: shorter side and a centre crop: a resized cache can serve them (``resized_cache``), and the device
#: can finish them (``device_augment``); the random-resized crops start from the original image
RESIZE_FIRST = ("paper", "paper-scaled", "flip", "none")
PAPER_CROP_PADDING = 4
PAPER_INPUT_SIZE = 224


def crop_padding(image_size: int, augmentation: str) -> int:
    """Pixels of padding of the random crop: 4 for "paper", 4 scaled to ``image_size`` for "paper-scaled"."""
    if augmentation == "paper-scaled":
        return max(1, round(PAPER_CROP_PADDING * image_size / PAPER_INPUT_SIZE))
    return PAPER_CROP_PADDING


def train_transform(
    image_size: int,
    mean: Sequence[float] = CLIP_MEAN,
    std: Sequence[float] = CLIP_STD,
    augmentation: str = "paper",
) -> T.Compose:
    """The paper's train augmentation: bicubic resize, random crop with padding, horizontal flip,
    rotation in [0, 10] degrees (``TRAIN_AUGMENTATIONS`` names the variants).

    The offline miniature uses "paper-scaled": at 32 px the paper's 4 px of black border is a
    large part of the image and lowers every adapted method (measured; docs/miniature.md). 224 px
    inputs get the paper's pipeline exactly under either name.
    """
    if augmentation not in TRAIN_AUGMENTATIONS:
        raise ValueError(f"augmentation must be one of {TRAIN_AUGMENTATIONS}, not {augmentation!r}")
    if augmentation == "none":
        return eval_transform(image_size, mean, std)
    if augmentation == "flip":
        return T.Compose(
            [
                T.Lambda(_to_rgb),
                T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
                T.CenterCrop(image_size),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
    if augmentation in ("rrc_flip", "rrc05_flip"):
        scale = (0.05, 1.0) if augmentation == "rrc05_flip" else (0.08, 1.0)
        return T.Compose(
            [
                T.Lambda(_to_rgb),
                T.RandomResizedCrop(image_size, scale=scale, ratio=(3 / 4, 4 / 3)),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
    if augmentation == "rrc90":
        return T.Compose(
            [
                T.Lambda(_to_rgb),
                T.RandomResizedCrop(image_size, scale=(0.9, 1.0), interpolation=T.InterpolationMode.BICUBIC),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomCrop(image_size, padding=crop_padding(image_size, augmentation)),
            T.RandomHorizontalFlip(),
            T.RandomRotation((0, 10)),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )


class PatchShuffle:
    """Cut a square PIL image into a ``grid`` x ``grid`` array of patches and reassemble them in a
    permuted order (AdapterVLM's pseudo-OOD images: 28 px patches of a 224 px image, an 8 x 8 grid).

    The permutation is seeded by the image's pixels, so an image always gets the same one, in any
    worker and after a resume. The pixels themselves only move.
    """

    def __init__(self, grid: int = 8) -> None:
        self.grid = grid

    def __call__(self, image: Image.Image) -> Image.Image:
        pixels = np.asarray(image)
        size = pixels.shape[0]
        if pixels.shape[1] != size or size % self.grid:
            raise ValueError(
                f"PatchShuffle needs a square image divisible by {self.grid}, got {pixels.shape[:2]}"
            )
        step = size // self.grid
        patches = (
            pixels.reshape(self.grid, step, self.grid, step, -1)
            .swapaxes(1, 2)
            .reshape(self.grid**2, step, step, -1)
        )
        order = np.random.default_rng(zlib.crc32(pixels.tobytes())).permutation(self.grid**2)
        shuffled = (
            patches[order].reshape(self.grid, self.grid, step, step, -1).swapaxes(1, 2).reshape(pixels.shape)
        )
        return Image.fromarray(shuffled.squeeze(-1) if pixels.ndim == 2 else shuffled)

    def __repr__(self) -> str:
        return f"PatchShuffle(grid={self.grid})"


def patch_shuffled_train_transform(
    image_size: int,
    mean: Sequence[float] = CLIP_MEAN,
    std: Sequence[float] = CLIP_STD,
    augmentation: str = "paper",
    grid: int = 8,
) -> T.Compose:
    """Resize and centre-crop to ``image_size``, shuffle ``grid`` x ``grid`` patches, then the
    train augmentation ``augmentation`` (its resize is then the identity)."""
    augment = train_transform(image_size, mean, std, augmentation).transforms
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(image_size),
            PatchShuffle(grid),
            *augment[1:],
        ]
    )
