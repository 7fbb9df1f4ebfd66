"""Folder datasets decoded and resized once, kept as one memory-mapped uint8 file.

Every pipeline that begins with the bicubic resize of the shorter side (the eval transform, and the
"paper", "paper-scaled" and "flip" train augmentations) spends most of its per-sample time decoding a
JPEG and resizing it, the same work every epoch. ``build_resized_cache`` does that work once, with
PIL's own resize, and stores the pixels under the data root:

    <data_root>/.resized/<dataset>-<size>px-<key>/paths.txt    the image files, one a line
    <data_root>/.resized/<dataset>-<size>px-<key>/pixels.u8    their HWC pixels, back to back
    <data_root>/.resized/<dataset>-<size>px-<key>/index.npy    [N, 3] int64: offset, height, width

A cache holds every image of the dataset (train and test), so any split of it reads from the same
cache. ``key`` hashes the image size, the PIL version and every file's path, size and modification
time: a changed file or another size is another cache. ``CachedImages`` yields
those pixels as PIL images; the pipeline's resize then finds the size it asks for and returns the
image as it is (torchvision's ``resize``), so the pixels are those of the files, bit for bit.

The cache is built only by ``python -m benchmarks.tools.resized_cache`` (never during a run); a run
uses it where it finds one with the right key (``with_resized_cache``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets.folder import default_loader
from tqdm.auto import tqdm

from benchmarks.core.errors import UserError
from benchmarks.data.image_lists import FileListDataset
from benchmarks.data.transforms import RESIZE_FIRST

CACHE_FOLDER = ".resized"


def cache_key(paths: Sequence[str], image_size: int) -> str:
    """A hash of what the cached pixels depend on: the size, PIL's version and each file's path,
    byte size and modification time."""
    digest = hashlib.sha256(f"{image_size} bicubic PIL {PIL.__version__}".encode())
    for path in paths:
        stat = os.stat(path)
        digest.update(f"\n{path}\t{stat.st_size}\t{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def dataset_paths(*splits: Sequence[tuple[str, int]] | None) -> list[str]:
    """Every file of the splits, sorted, each once: what a dataset's cache holds."""
    return sorted({path for split in splits if split is not None for path, _ in split})


def cache_folder(data_root: str | Path, dataset: str, paths: Sequence[str], image_size: int) -> Path:
    """Where the cache of ``paths`` at ``image_size`` is (or would be) under ``data_root``."""
    return Path(data_root) / CACHE_FOLDER / f"{dataset}-{image_size}px-{cache_key(paths, image_size)}"


def _decode(path: str) -> Image.Image:
    """The RGB pixels of ``path``. A file PIL cannot decode (empty, truncated, not an image) is a
    one-line ``UserError`` that names it: the file is the problem, not the cache being written."""
    try:
        return default_loader(path)  # converts to RGB, so a truncated file fails here, not later
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        if isinstance(err, OSError) and err.errno is not None:  # cannot open it: no such file, no permission
            reason = err.strerror
        elif os.path.getsize(path) == 0:
            reason = "the file is empty (0 bytes)"
        elif isinstance(err, UnidentifiedImageError):
            reason = "not an image PIL can decode"
        else:
            reason = f"the image is truncated or damaged (PIL: {err})"  # e.g. "Truncated File Read"
        raise UserError(
            f"cannot read image {path}: {reason}; replace the file (or prepare the dataset again) and rerun"
        ) from None


def build_resized_cache(paths: Sequence[str], image_size: int, folder: Path, progress: bool = True) -> Path:
    """Decode and resize every image of ``paths`` (RGB, bicubic, shorter side ``image_size``) into
    ``folder``, written beside it and renamed into place when complete: a build that dies leaves
    nothing half written. An existing complete ``folder`` is kept (same key, same pixels)."""
    if (folder / "index.npy").is_file():
        return folder
    building = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    resize = T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC)
    index = np.zeros((len(paths), 3), dtype=np.int64)
    offset = 0
    try:
        with open(building / "pixels.u8", "wb") as pixels:
            for i, path in enumerate(tqdm(paths, desc=f"{folder.name}: resizing", disable=not progress)):
                image = np.asarray(resize(_decode(path)), dtype=np.uint8)
                pixels.write(image.tobytes())
                index[i] = (offset, image.shape[0], image.shape[1])
                offset += image.size
        (building / "paths.txt").write_text("".join(f"{path}\n" for path in paths), encoding="utf-8")
        np.save(building / "index.npy", index)  # written last: its presence marks a complete cache
        os.replace(building, folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return folder


class CachedImages(Dataset):
    """The images of a ``FileListDataset`` from its resized cache, as RGB PIL images, with the same
    ``samples`` and ``targets``. The pixel file is mapped, not read, and opened in each process on
    first use, so the dataset pickles small for workers."""

    def __init__(self, samples: Sequence[tuple[str, int]], folder: Path) -> None:
        self.samples = list(samples)
        self.targets = [label for _, label in self.samples]
        self.folder = Path(folder)
        rows = {
            path: row for row, path in enumerate((self.folder / "paths.txt").read_text("utf-8").splitlines())
        }
        missing = [path for path, _ in self.samples if path not in rows]
        if missing:
            raise ValueError(f"{self.folder} does not hold {missing[0]} ({len(missing)} images missing)")
        self.index = np.load(self.folder / "index.npy")[[rows[path] for path, _ in self.samples]]
        self._pixels: np.memmap | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        if self._pixels is None:
            self._pixels = np.memmap(self.folder / "pixels.u8", dtype=np.uint8, mode="r")
        offset, height, width = (int(v) for v in self.index[index])
        pixels = self._pixels[offset : offset + height * width * 3].reshape(height, width, 3)
        return Image.fromarray(np.array(pixels)), self.targets[index]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None}


def with_resized_cache(data, data_root: str | Path, image_size: int, train_augmentation: str):
    """``data`` (a ``ClassificationData``) reading its folder images from their resized cache, where
    one with the right key exists under ``data_root``: the test split always (the eval transform
    resizes first), the train split where ``train_augmentation`` does too. Otherwise ``data`` as is."""
    if not isinstance(data.test, FileListDataset):
        return data
    train = data.train if isinstance(data.train, FileListDataset) else None
    paths = dataset_paths(data.test.samples, train.samples if train is not None else None)
    folder = cache_folder(data_root, data.name, paths, image_size)
    if not (folder / "index.npy").is_file():
        return data
    cached = dataclasses.replace(data, test=CachedImages(data.test.samples, folder))
    if train is not None and train_augmentation in RESIZE_FIRST:
        cached.train = CachedImages(train.samples, folder)
    return cached
