"""Image transforms of the shared protocol (SPEC section 1).

Both pipelines take a PIL image and return a normalised ``float32`` tensor of shape
``(3, image_size, image_size)``.
"""

from __future__ import annotations

from collections.abc import Sequence

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


TRAIN_AUGMENTATIONS = ("paper", "none")


def train_transform(
    image_size: int,
    mean: Sequence[float] = CLIP_MEAN,
    std: Sequence[float] = CLIP_STD,
    augmentation: str = "paper",
) -> T.Compose:
    """The paper's train augmentation: bicubic resize, random crop with padding 4, horizontal flip,
    rotation in [0, 10] degrees. ``augmentation="none"`` gives ``eval_transform`` instead.

    "none" exists for the offline miniature: its tiny CLIP was pretrained on clean 32 px renders,
    never on black crop borders or resampled rotations, and there the paper's augmentation lowers
    every method's accuracy below zero-shot (measured; see README "The offline miniature").
    """
    if augmentation == "none":
        return eval_transform(image_size, mean, std)
    if augmentation != "paper":
        raise ValueError(f"augmentation must be one of {TRAIN_AUGMENTATIONS}, not {augmentation!r}")
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomCrop(image_size, padding=4),
            T.RandomHorizontalFlip(),
            T.RandomRotation((0, 10)),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )
