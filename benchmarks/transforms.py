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


def train_transform(
    image_size: int,
    mean: Sequence[float] = CLIP_MEAN,
    std: Sequence[float] = CLIP_STD,
) -> T.Compose:
    """Bicubic resize, random crop with padding 4, horizontal flip, rotation in [0, 10] degrees."""
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
