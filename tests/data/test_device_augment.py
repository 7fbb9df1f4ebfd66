"""The device path gives the PIL pipeline's pixels, bit for bit (``benchmarks.data.device_augment``)."""

import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from benchmarks.data.device_augment import (
    DevicePending,
    DeviceTransform,
    finish_batch,
    flip_and_rotate,
    patch_shuffled_transform,
    pil_rotation_coefficients,
    stream_transforms,
)
from benchmarks.data.loaders import DeviceBatches, seeded_loader
from benchmarks.data.streams import build_stream
from benchmarks.data.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    RESIZE_FIRST,
    eval_transform,
    patch_shuffled_train_transform,
    train_transform,
)


def _images(n: int, height: int, width: int, mode: str = "RGB", seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(n)]
    return [im.convert(mode) for im in images]


def _through(pil, device, images) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image through the PIL pipeline ``pil`` and through the device path ``device``, sample k
    under seed k in both."""
    reference, pending = [], []
    for k, image in enumerate(images):
        torch.manual_seed(k)
        reference.append(pil(image))
        torch.manual_seed(k)
        pending.append(device(image))
    return torch.stack(reference), finish_batch(default_collate(pending), "cpu")


def _both_paths(images, size: int, augmentation: str) -> tuple[torch.Tensor, torch.Tensor]:
    pil = eval_transform(size) if augmentation == "eval" else train_transform(size, augmentation=augmentation)
    return _through(
        pil, DeviceTransform(size, augmentation="none" if augmentation == "eval" else augmentation), images
    )


@pytest.mark.parametrize("augmentation", [*RESIZE_FIRST, "eval"])
@pytest.mark.parametrize(
    "size, height, width",
    [
        (32, 32, 32),  # the offline world: the resize is the identity
        (224, 32, 32),  # CIFAR-100 under ViT-B/16: an upsampling resize
        (48, 61, 90),  # a wide photo: the crop's offsets range over the resized width
        (40, 97, 45),  # a tall one
    ],
)
def test_the_device_path_gives_the_pil_pipelines_pixels_bit_for_bit(augmentation, size, height, width):
    reference, device = _both_paths(_images(48, height, width), size, augmentation)
    assert device.dtype == reference.dtype == torch.float32
    assert device.shape == reference.shape == (48, 3, size, size)
    assert torch.equal(device, reference)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA"])
def test_grey_palette_and_alpha_images_are_converted_to_rgb_as_the_pil_pipeline_does(mode):
    reference, device = _both_paths(_images(16, 36, 36, mode), 32, "paper")
    assert torch.equal(device, reference)


def test_a_sample_consumes_the_generator_exactly_as_the_pil_pipeline_does():
    """Same draws, same order: the generator ends in the same state, so later draws are unchanged."""
    (image,) = _images(1, 32, 32)
    for augmentation in RESIZE_FIRST:
        torch.manual_seed(7)
        train_transform(32, augmentation=augmentation)(image)
        after_pil = torch.get_rng_state()
        torch.manual_seed(7)
        DeviceTransform(32, augmentation=augmentation)(image)
        assert torch.equal(torch.get_rng_state(), after_pil), augmentation


def test_rotation_coefficients_by_hand():
    # Angle 0 is the identity: a0 = a4 = 1.0 and the half-pixel centre in a2, a5 (0.5 * 65536).
    assert pil_rotation_coefficients(0.0, 32, 32) == (65536, 0, 32768, 0, 65536, 32768)
    # 90 degrees on a 4 x 4 image: cos = 0, sin(-pi/2) = -1, so a0 = 0, a1 = -1, a3 = 1, a4 = 0;
    # c = 0*-2 + -1*-2 + 2 = 4, f = 1*-2 + 0*-2 + 2 = 0; a2 = (4 - 0.5) * 65536, a5 = 0.5 * 65536.
    assert pil_rotation_coefficients(90.0, 4, 4) == (0, -65536, 229376, 65536, 0, 32768)
    # ... which reads output (x, y) from source column 3 - y, row x: numpy's rot90 (counter-clockwise).
    pixels = torch.arange(3 * 16, dtype=torch.uint8).view(1, 3, 4, 4)
    rotated = flip_and_rotate(
        pixels, torch.tensor([False]), torch.tensor([pil_rotation_coefficients(90.0, 4, 4)])
    )
    assert torch.equal(rotated, torch.rot90(pixels, 1, dims=(2, 3)))


def test_rotation_keeps_pixels_or_fills_zero_and_matches_pillow_at_many_angles():
    (image,) = _images(1, 50, 50)
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1).unsqueeze(0)
    for angle in np.linspace(0.05, 359.9, 97):
        coefficients = torch.tensor([pil_rotation_coefficients(float(angle), 50, 50)])
        ours = flip_and_rotate(pixels, torch.tensor([False]), coefficients)
        pillows = torch.from_numpy(np.array(image.rotate(float(angle), Image.NEAREST))).permute(2, 0, 1)
        assert torch.equal(ours[0], pillows), angle


def test_flip_then_rotate_is_pillows_flip_then_rotate():
    (image,) = _images(1, 24, 24)
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1).unsqueeze(0)
    coefficients = torch.tensor([pil_rotation_coefficients(7.3, 24, 24)])
    ours = flip_and_rotate(pixels, torch.tensor([True]), coefficients)
    pillows = image.transpose(Image.FLIP_LEFT_RIGHT).rotate(7.3, Image.NEAREST)
    assert torch.equal(ours[0], torch.from_numpy(np.array(pillows)).permute(2, 0, 1))


def test_normalisation_is_torchvisions_arithmetic():
    pixels = torch.arange(256, dtype=torch.uint8).repeat(3, 1).view(1, 3, 16, 16)
    mean_std = torch.tensor([[0.1, 0.2, 0.3, 0.5, 0.25, 0.125]], dtype=torch.float64)
    pending = DevicePending(
        pixels, torch.tensor([False]), torch.tensor([pil_rotation_coefficients(0.0, 16, 16)]), mean_std
    )
    out = finish_batch(pending, "cpu")
    by_hand = (pixels.float() / 255 - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)) / torch.tensor(
        [0.5, 0.25, 0.125]
    ).view(1, 3, 1, 1)
    assert torch.equal(out, by_hand)
    assert math.isclose(float(out[0, 0, 0, 0]), -0.2, rel_tol=1e-6) and math.isclose(
        float(out[0, 2, -1, -1]), (1 - 0.3) / 0.125, rel_tol=1e-6
    )


def test_stream_transforms_choose_the_device_where_it_covers_the_augmentation():
    train, evaluate = stream_transforms(32, (0.5,) * 3, (0.5,) * 3, "paper")
    assert isinstance(train, DeviceTransform) and isinstance(evaluate, DeviceTransform)
    train, evaluate = stream_transforms(32, (0.5,) * 3, (0.5,) * 3, "rrc_flip")  # drawn on the original image
    assert not isinstance(train, DeviceTransform) and isinstance(evaluate, DeviceTransform)
    train, evaluate = stream_transforms(32, (0.5,) * 3, (0.5,) * 3, "paper", "pil")
    assert not isinstance(train, DeviceTransform) and not isinstance(evaluate, DeviceTransform)


def test_augment_on_is_checked_in_one_line():
    from benchmarks.core.choices import check_augment_on
    from benchmarks.core.errors import UserError

    assert [check_augment_on(v) for v in ("device", "pil")] == ["device", "pil"]
    with pytest.raises(UserError, match="augment_on must be one of device, pil, not 'gpu'"):
        check_augment_on("gpu")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_seeded_loader_on_the_device_path_yields_the_pil_loaders_batches(workers):
    from benchmarks.data.datasets import load_dataset

    data = load_dataset("synthetic", n_classes=10, n_train_per_class=6, n_test_per_class=1, domain="faded")

    def loader(augment_on: str, device):
        stream = build_stream(
            data, 1, list(range(10)), *stream_transforms(32, (0.4,) * 3, (0.3,) * 3, "paper", augment_on)
        )
        dataset = stream.train_stream[0].dataset.train()
        return seeded_loader(dataset, (0, 0, "train"), 16, shuffle=True, num_workers=workers, device=device)

    device_loader, pil_loader = loader("device", "cpu"), loader("pil", None)
    assert isinstance(device_loader, DeviceBatches) and len(device_loader) == 4
    assert device_loader.num_workers == workers  # the wrapped loader's attributes
    passes = [(list(device_loader), list(pil_loader)) for _ in range(2)]
    for device_batches, pil_batches in passes:
        for (images, targets, *_), (reference, reference_targets, *_) in zip(
            device_batches, pil_batches, strict=True
        ):
            assert images.dtype == torch.float32 and torch.equal(images, reference)
            assert torch.equal(targets, reference_targets)
    assert not torch.equal(passes[0][0][0][0], passes[1][0][0][0])  # each pass draws anew


@pytest.mark.parametrize("augmentation", ["paper-scaled", "flip", "none"])
def test_adaptervlms_patch_shuffled_images_are_the_pil_pipelines_on_the_device(augmentation):
    pil = patch_shuffled_train_transform(32, augmentation=augmentation, grid=4)
    device = patch_shuffled_transform(32, CLIP_MEAN, CLIP_STD, augmentation, 4, "device")
    assert isinstance(device, DeviceTransform) and "patch_grid=4" in repr(device)
    assert not isinstance(
        patch_shuffled_transform(32, CLIP_MEAN, CLIP_STD, augmentation, 4, "pil"), DeviceTransform
    )
    reference, on_device = _through(pil, device, _images(24, 40, 36))
    assert torch.equal(on_device, reference)
