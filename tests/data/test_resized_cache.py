"""Folder images decoded and resized once give the pipeline the files' pixels, bit for bit
(``benchmarks.data.resized_cache``, ``python -m benchmarks.tools.resized_cache``)."""

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from benchmarks.data.datasets import (
    FAKE_DATA_MARKER,
    ClassificationData,
    load_dataset,
)
from benchmarks.data.device_augment import finish_batch, stream_transforms
from benchmarks.data.image_lists import FileListDataset
from benchmarks.data.resized_cache import (
    CachedImages,
    build_resized_cache,
    cache_folder,
    dataset_paths,
    with_resized_cache,
)
from benchmarks.data.unit import dataset_unit
from benchmarks.data.units.imagenet_r import rapf_split_list
from benchmarks.tools import resized_cache


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Twelve JPEGs and PNGs of varied sizes and modes (grey, palette), as a folder dataset's splits."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    samples = []
    for i, (h, w, mode) in enumerate([(40, 70, "RGB"), (90, 33, "L"), (32, 32, "P"), (57, 57, "RGB")] * 3):
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)
        path = root / f"img{i}.{'png' if mode == 'P' else 'jpg'}"
        image.save(path)
        samples.append((str(path), i % 3))
    return ClassificationData(
        "photos",
        FileListDataset(samples[:8]),
        FileListDataset(samples[8:]),
        ["a", "b", "c"],
        [s[1] for s in samples[:8]],
        [s[1] for s in samples[8:]],
    )


def _through(dataset, transform, device_path: bool) -> torch.Tensor:
    out = []
    for k in range(len(dataset)):
        torch.manual_seed(k)
        out.append(transform(dataset[k][0]))
    return finish_batch(default_collate(out), "cpu") if device_path else torch.stack(out)


@pytest.mark.parametrize("augment_on", ["device", "pil"])
@pytest.mark.parametrize("augmentation", ["paper", "flip", "none"])
def test_cached_images_give_the_files_pixels_through_every_resize_first_pipeline(
    photos, tmp_path, augmentation, augment_on
):
    paths = dataset_paths(photos.train.samples, photos.test.samples)
    folder = build_resized_cache(paths, 24, cache_folder(tmp_path, "photos", paths, 24), progress=False)
    cached = with_resized_cache(photos, tmp_path, 24, augmentation)
    assert isinstance(cached.train, CachedImages) and isinstance(cached.test, CachedImages)
    assert cached.train.targets == photos.train.targets and cached.test.samples == photos.test.samples
    train, evaluate = stream_transforms(24, (0.5,) * 3, (0.25,) * 3, augmentation, augment_on)
    for files, from_cache, transform in (
        (photos.train, cached.train, train),
        (photos.test, cached.test, evaluate),
    ):
        on_device = augment_on == "device"
        assert torch.equal(_through(from_cache, transform, on_device), _through(files, transform, on_device))
    # the shorter side is the size asked for; the longer keeps the aspect ratio, as PIL's resize gives it
    index = np.load(folder / "index.npy")
    assert sorted(index[:, 1:].min(axis=1).tolist()) == [24] * 12
    assert (folder / "pixels.u8").stat().st_size == int((index[:, 1] * index[:, 2] * 3).sum())


def test_a_random_resized_crop_keeps_the_original_train_images(photos, tmp_path):
    paths = dataset_paths(photos.train.samples, photos.test.samples)
    build_resized_cache(paths, 24, cache_folder(tmp_path, "photos", paths, 24), progress=False)
    cached = with_resized_cache(photos, tmp_path, 24, "rrc_flip")
    assert cached.train is photos.train and isinstance(cached.test, CachedImages)
    assert with_resized_cache(photos, tmp_path, 32, "paper") is photos  # another size: no cache yet


def test_a_changed_file_is_another_cache_and_a_cache_pickles_without_its_pixels(photos, tmp_path):
    paths = dataset_paths(photos.train.samples, photos.test.samples)
    first = cache_folder(tmp_path, "photos", paths, 24)
    build_resized_cache(paths, 24, first, progress=False)
    images = CachedImages(photos.test.samples, first)
    images[0]  # maps the pixel file
    assert len(pickle.dumps(images)) < 4000 and pickle.loads(pickle.dumps(images))[1][1] == images[1][1]
    os.utime(paths[0], ns=(0, 0))
    assert cache_folder(tmp_path, "photos", paths, 24) != first


def test_a_build_that_dies_leaves_nothing(photos, tmp_path, monkeypatch):
    paths = dataset_paths(photos.train.samples, photos.test.samples)
    folder = cache_folder(tmp_path, "photos", paths, 24)
    monkeypatch.setattr(np, "save", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build_resized_cache(paths, 24, folder, progress=False)
    assert not folder.exists() and list(folder.parent.iterdir()) == []


@pytest.mark.slow
def test_the_command_builds_the_cache_a_run_then_reads(tmp_path, capsys):
    dataset_unit("imagenet_r").write_fake(tmp_path, 1, 1, np.random.RandomState(0))
    (tmp_path / "FAKE_DATA.json").write_text("{}")
    assert resized_cache.main(["imagenet_r", "--data-root", str(tmp_path), "--image-size", "32"]) == 0
    assert "imagenet_r: 400 images at 32 px" in capsys.readouterr().err
    data = with_resized_cache(load_dataset("imagenet_r", tmp_path), tmp_path, 32, "paper")
    assert isinstance(data.train, CachedImages) and min(data.train[0][0].size) == 32


def test_the_command_names_what_it_cannot_cache(tmp_path, capsys):
    assert resized_cache.main(["synthetic", "--data-root", str(tmp_path)]) == 2
    assert "held in memory" in capsys.readouterr().err
    assert resized_cache.main(["imagenet_s", "--data-root", str(tmp_path)]) == 2
    assert "unknown dataset 'imagenet_s'" in capsys.readouterr().err


def _tiny_imagenet_r(root) -> list:
    """A fake-data root holding the first RAPF-listed train and test image of two classes."""
    lists = rapf_split_list()
    wnids = sorted({path.split("/")[0] for path in lists["train"]})[:2]
    paths = [
        next(p for p in lists[part] if p.startswith(w + "/")) for w in wnids for part in ("train", "test")
    ]
    for i, relative in enumerate(paths):
        (root / "imagenet-r" / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((40, 50, 3), 20 * i, dtype=np.uint8)).save(root / "imagenet-r" / relative)
    (root / FAKE_DATA_MARKER).write_text("{}")
    return [root / "imagenet-r" / p for p in paths]


@pytest.mark.parametrize(
    "damage, cause",
    [
        (lambda data: b"", "the file is empty (0 bytes)"),
        (lambda data: data[: len(data) // 2], "the image is truncated or damaged"),
        (lambda data: data[:-30], "the image is truncated or damaged"),
        (lambda data: b"not a picture at all", "not an image PIL can decode"),
    ],
    ids=["empty", "half", "end-cut", "not-an-image"],
)
def test_a_file_that_will_not_decode_is_named_with_its_cause(tmp_path, capsys, damage, cause):
    files = _tiny_imagenet_r(tmp_path)
    files[1].write_bytes(damage(files[1].read_bytes()))
    assert resized_cache.main(["imagenet_r", "--data-root", str(tmp_path), "--image-size", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the progress bar's lines, then the error
    assert err[-1].startswith(f"error: cannot read image {files[1]}: {cause}"), err
    assert [line for line in err if "error" in line] == err[-1:] and "cannot write the cache" not in err[-1]
    assert list((tmp_path / ".resized").iterdir()) == []  # nothing half-built left behind
