"""The train augmentation applied on batched uint8 tensors on the run's device, pixel for pixel as
torchvision's PIL pipeline applies it (``benchmarks.data.transforms``).

A sample's transform runs where it always ran (the loader's process or worker, under its own seed,
``benchmarks.data.loaders``) and does only what is cheap there:

* the deterministic start of the pipeline, with PIL as before (RGB conversion, the bicubic resize of
  the shorter side, a centre crop), so those pixels are PIL's own;
* every random draw, with the same torchvision ``get_params`` calls in the same order as the PIL
  pipeline (crop offsets, flip, rotation angle), so each sample gets the same augmentation under
  either path and any worker count;
* the padded random crop, a slice into a zero canvas.

It returns ``DevicePending`` (uint8 pixels and the drawn flip and rotation). ``finish_batch`` then
applies, on a whole batch on the device, the flip and the rotation as one index gather, and the
``ToTensor`` and ``Normalize`` arithmetic. The rotation reproduces Pillow's nearest-neighbour affine
transform exactly: Pillow's rotation matrix (``Image.rotate``: centre (w/2, h/2), coefficients rounded
to 15 digits) in its 16.16 fixed-point arithmetic (``libImaging/Geometry.c``, ``affine_fixed``: a
source pixel is ``(a2 + y*a1 + x*a0) >> 16``, the offsets including the half-pixel centre; outside
pixels are the zero fill). The whole path is therefore bit-identical to the PIL pipeline
(``tests/data/test_device_augment.py`` checks every augmentation it covers against torchvision's).

Covered: "paper", "paper-scaled", "flip", "none" and the eval transform. The random-resized-crop
augmentations (whose crop box is drawn on the original, unresized image) stay on PIL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms as T

from benchmarks.core.choices import AUGMENT_ON as AUGMENT_ON
from benchmarks.core.choices import AugmentOn as AugmentOn
from benchmarks.data.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    RESIZE_FIRST,
    PatchShuffle,
    _to_rgb,
    crop_padding,
    eval_transform,
    patch_shuffled_train_transform,
    train_transform,
)

_ROTATION_DEGREES = (0.0, 10.0)  # the paper's RandomRotation((0, 10)), as torchvision stores it
_FIXED_ONE = 65536  # Pillow's 16.16 fixed point


class DevicePending(NamedTuple):
    """One sample (or, collated, a batch) waiting for ``finish_batch``: uint8 pixels ``[3, S, S]``
    already resized and cropped, whether to flip, Pillow's fixed-point rotation coefficients
    (``[6]`` int64; the identity for no rotation) and the normalisation's mean and std (``[6]``)."""

    pixels: torch.Tensor
    flip: torch.Tensor
    rotation: torch.Tensor
    mean_std: torch.Tensor


def pil_rotation_coefficients(angle: float, width: int, height: int) -> tuple[int, int, int, int, int, int]:
    """The six 16.16 fixed-point coefficients with which Pillow rotates a ``width`` x ``height`` image
    by ``angle`` degrees (nearest, no expand, centre (w/2, h/2)): output pixel (x, y) reads source
    column ``(a2 + y*a1 + x*a0) >> 16`` and row ``(a5 + y*a4 + x*a3) >> 16``. Angle 0 gives the
    identity (Pillow copies the image)."""
    angle = angle % 360.0
    radians = -math.radians(angle)
    a, b, d, e = (
        round(math.cos(radians), 15),
        round(math.sin(radians), 15),
        round(-math.sin(radians), 15),
        round(math.cos(radians), 15),
    )
    cx, cy = width / 2, height / 2
    c = a * -cx + b * -cy + 0.0 + cx  # Image.rotate's translation, in its order of operations
    f = d * -cx + e * -cy + 0.0 + cy
    if max(abs(c), abs(f)) + width + height >= 32768:
        raise ValueError(f"image of {width} x {height} too large for Pillow's fixed-point rotation")

    def fixed(v: float) -> int:
        return math.floor(v * _FIXED_ONE + 0.5)

    return (
        fixed(a),
        fixed(b),
        fixed(c + a * 0.5 + b * 0.5),
        fixed(d),
        fixed(e),
        fixed(f + d * 0.5 + e * 0.5),
    )


_IDENTITY = pil_rotation_coefficients(0.0, 1, 1)


class DeviceTransform:
    """The per-sample half of a transform whose pixels are finished on the device (module docstring).

    ``augmentation`` is one of ``RESIZE_FIRST``; "none" is the eval transform. Picklable, so
    it runs in DataLoader workers under every start method.
    """

    def __init__(
        self,
        image_size: int,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        augmentation: str = "none",
        patch_grid: int | None = None,
    ) -> None:
        if augmentation not in RESIZE_FIRST:
            raise ValueError(f"augmentation on the device is one of {RESIZE_FIRST}, not {augmentation!r}")
        self.image_size, self.augmentation = image_size, augmentation
        self.mean_std = torch.tensor([*mean, *std], dtype=torch.float64)
        self.padding = crop_padding(image_size, augmentation) if augmentation.startswith("paper") else None
        self.flips = augmentation != "none"
        self.rotates = self.padding is not None
        self._resize = T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC)
        self._centre_crop = T.CenterCrop(image_size)
        self._patch_shuffle = None if patch_grid is None else PatchShuffle(patch_grid)

    def __call__(self, image: Image.Image) -> DevicePending:
        image = self._resize(_to_rgb(image))
        if self._patch_shuffle is not None:  # AdapterVLM's pseudo-OOD images, before the augmentation
            image = self._patch_shuffle(self._centre_crop(image))
        if self.padding is None:  # eval and "flip": the centre crop
            image = self._centre_crop(image)
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)
        if self.padding is not None:  # RandomCrop(size, padding): offsets drawn on the padded size
            _, height, width = pixels.shape
            padded = torch.empty(1, 1, 1).expand(3, height + 2 * self.padding, width + 2 * self.padding)
            top, left, _, _ = T.RandomCrop.get_params(padded, (self.image_size, self.image_size))
            pixels = _padded_crop(pixels, top - self.padding, left - self.padding, self.image_size)
        flip = bool(self.flips and torch.rand(1) < 0.5)  # RandomHorizontalFlip(p=0.5)'s draw
        rotation = _IDENTITY
        if self.rotates:
            angle = T.RandomRotation.get_params(list(_ROTATION_DEGREES))
            rotation = pil_rotation_coefficients(angle, self.image_size, self.image_size)
        return DevicePending(pixels, torch.tensor(flip), torch.tensor(rotation), self.mean_std)

    def __repr__(self) -> str:
        shuffle = "" if self._patch_shuffle is None else f", patch_grid={self._patch_shuffle.grid}"
        return f"DeviceTransform(image_size={self.image_size}, augmentation={self.augmentation!r}{shuffle})"


def _padded_crop(pixels: torch.Tensor, top: int, left: int, size: int) -> torch.Tensor:
    """The ``size`` x ``size`` window at (``top``, ``left``) of ``pixels`` (``[3, H, W]``), zero where
    it leaves the image: torchvision's crop of the zero-padded image, without building it."""
    _, height, width = pixels.shape
    out = pixels.new_zeros(3, size, size)
    y0, y1 = max(top, 0), min(top + size, height)
    x0, x1 = max(left, 0), min(left + size, width)
    if y0 < y1 and x0 < x1:
        out[:, y0 - top : y1 - top, x0 - left : x1 - left] = pixels[:, y0:y1, x0:x1]
    return out


def flipped_coefficients(rotation: tuple[int, ...], size: int) -> tuple[int, ...]:
    """Coefficients that read the horizontally flipped image: column ``size - 1 - (v >> 16)`` is
    ``(size * 65536 - 1 - v) >> 16`` for every integer ``v`` (floor arithmetic), so the flip folds
    into the rotation's x coefficients exactly."""
    a0, a1, a2, a3, a4, a5 = rotation
    return (-a0, -a1, size * _FIXED_ONE - 1 - a2, a3, a4, a5)


def flip_and_rotate(pixels: torch.Tensor, flip: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``pixels`` (``[B, 3, S, S]`` uint8) flipped where ``flip`` (``[B]``), then rotated by Pillow's
    fixed-point coefficients ``rotation`` (``[B, 6]``), nearest neighbour, zero fill: one gather from
    the images framed by a zero border, which every source position outside the image reads."""
    batch, channels, size, _ = pixels.shape
    rotations, flips = rotation.tolist(), flip.tolist()
    coefficients = [flipped_coefficients(r, size) if f else r for r, f in zip(rotations, flips, strict=True)]
    a0, a1, a2, a3, a4, a5 = (
        torch.tensor(coefficients, dtype=torch.int32, device=pixels.device).view(batch, 6, 1, 1).unbind(1)
    )
    coords = torch.arange(size, dtype=torch.int32, device=pixels.device)
    y, x = coords.view(1, size, 1), coords.view(1, 1, size)
    # int32 holds every value: Pillow's own check keeps |a2 + y*a1 + x*a0| below 2**31
    column = ((a2 + y * a1 + x * a0) >> 16).clamp_(-1, size) + 1
    row = ((a5 + y * a4 + x * a3) >> 16).clamp_(-1, size) + 1
    framed = F.pad(pixels, (1, 1, 1, 1))
    source = (row * (size + 2) + column).view(batch, 1, -1).expand(batch, channels, -1)
    return framed.view(batch, channels, -1).gather(2, source.long()).view_as(pixels)


def finish_batch(pending: DevicePending, device: torch.device | str) -> torch.Tensor:
    """The float32 images ``[B, 3, S, S]`` on ``device`` of a collated ``DevicePending``: flip and
    rotation (skipped when no sample has either), then ``ToTensor``'s ``/ 255`` and ``Normalize``'s
    ``(x - mean) / std``, the same float32 operations as torchvision's per image."""
    pixels = pending.pixels.to(device, non_blocking=True)
    identity = torch.tensor(_IDENTITY)
    if bool(pending.flip.any()) or not bool((pending.rotation == identity).all()):
        pixels = flip_and_rotate(pixels, pending.flip, pending.rotation)
    mean_std = pending.mean_std[0].to(torch.float32)  # every sample of a batch shares them
    mean, std = (v.view(1, 3, 1, 1).to(device) for v in (mean_std[:3], mean_std[3:]))
    return pixels.to(torch.float32).div(255).sub_(mean).div_(std)


def stream_transforms(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    augmentation: str,
    augment_on: AugmentOn = "device",
) -> tuple[Callable, Callable]:
    """The train and eval transforms of a stream: ``DeviceTransform`` s where ``augment_on`` is
    "device" and the augmentation is covered (``RESIZE_FIRST``), torchvision's PIL pipeline
    otherwise. A loader built with the run's ``device`` finishes the first kind
    (``benchmarks.data.loaders.DeviceBatches``)."""
    if augment_on == "pil":
        return train_transform(image_size, mean, std, augmentation), eval_transform(image_size, mean, std)
    train = (
        DeviceTransform(image_size, mean, std, augmentation)
        if augmentation in RESIZE_FIRST
        else train_transform(image_size, mean, std, augmentation)
    )
    return train, DeviceTransform(image_size, mean, std, "none")


def patch_shuffled_transform(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    augmentation: str,
    grid: int,
    augment_on: AugmentOn = "device",
) -> Callable:
    """``transforms.patch_shuffled_train_transform`` (AdapterVLM's pseudo-OOD images: resize, centre
    crop, ``grid`` x ``grid`` patch shuffle, then the train augmentation), on the device where
    ``stream_transforms`` would put the train augmentation."""
    if augment_on == "device" and augmentation in RESIZE_FIRST:
        return DeviceTransform(image_size, mean, std, augmentation, patch_grid=grid)
    return patch_shuffled_train_transform(image_size, mean, std, augmentation, grid)
