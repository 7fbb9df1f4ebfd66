"""Image domains of the miniature: the tiny CLIP's pretraining domain and a shifted CIL domain.

On real data the CIL images are a shifted domain for CLIP (CIFAR-100: 32 px photos upsampled;
ImageNet-R: renditions), so zero-shot CLIP is mediocre and adapting it pays. The miniature
mirrors that: the tiny CLIP is pretrained on clean "photo" renders only, and the smoke suites
draw their CIL images from "faded", a washed-out rendition the tiny CLIP never saw.

"faded" pulls every pixel towards mid-grey, like an old print or a hazy exposure. It is a pure
per-pixel function, so an image's class (colour, pattern, shape) stays visible to a model that
adapts, and the domain stays a pure function of the dataset's seed. Lower-resolution and blurred
renditions were measured too (docs/miniature.md): they erase the 3 px patterns that
tell classes apart, so adaptation cannot win back what they cost.
"""

from __future__ import annotations

import numpy as np

from benchmarks.core.errors import UserError

DEFAULT_DOMAIN = "photo"
FADED_CONTRAST = 0.4  # fraction of each pixel's distance from mid-grey that is kept
_MID_GREY = 128.0

DOMAINS: tuple[str, ...] = ("photo", "faded")


def faded(images: np.ndarray, contrast: float = FADED_CONTRAST) -> np.ndarray:
    """``uint8`` images with their contrast around mid-grey scaled by ``contrast``."""
    shifted = _MID_GREY + contrast * (images.astype(np.float32) - _MID_GREY)
    return np.clip(np.rint(shifted), 0, 255).astype(np.uint8)


def apply_domain(images: np.ndarray, domain: str) -> np.ndarray:
    """``images`` (``uint8``, ``(N, H, W, 3)``, rendered as photos) shown in ``domain``."""
    if domain == "photo":
        return images
    if domain == "faded":
        return faded(images, FADED_CONTRAST)
    raise UserError(f"unknown synthetic domain {domain!r}; valid: {', '.join(DOMAINS)}")
