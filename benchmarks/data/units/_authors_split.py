"""What the units of datasets split by their papers' authors share (ObjectNet, ImageNet-A, SUN397).

The LAMDA family's code (APER, PILOT, C3Box) reads such a dataset as two torchvision ImageFolder
trees, ``train/<class>/`` and ``test/<class>/`` (RevisitingCIL's ``utils/data.py``) or ``val/<class>/``
(C3Box's ``utils/data.py``), from archives its authors share by link; labels are the sorted class
folders' indices. This module reads that layout with its class list checked, reports its state,
writes it as fake data, and checks the options of the per-class split these units offer on the
official archives instead. Its name starts with ``_``: unit discovery skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import check_type, class_folders, scan_folder
from benchmarks.data.unit import random_jpeg

#: the folder names the authors' archives give their test split: RevisitingCIL reads ``test/``,
#: C3Box ``val/``; whichever is there is the test split
TEST_FOLDERS = ("test", "val")


def held_out_folder(base: Path) -> Path:
    """``base/test`` or, without it, ``base/val`` (the test split under either name)."""
    for name in TEST_FOLDERS:
        if (base / name).is_dir():
            return base / name
    return base / TEST_FOLDERS[0]


def check_split_options(name: str, split_seed: Any, train_fraction: Any) -> None:
    """The options of a per-class split of an official archive (``stratified_split``), in one line."""
    check_type(name, "split_seed", split_seed, (int,), "an integer")
    check_type(name, "train_fraction", train_fraction, (int, float), "a number")
    if not 0.0 < train_fraction < 1.0:
        raise UserError(f"{name} option train_fraction must be between 0 and 1, got {train_fraction}")
    if not 0 <= split_seed < 2**32:  # numpy's RandomState takes no other seed
        raise UserError(f"{name} option split_seed must be between 0 and {2**32 - 1}, got {split_seed}")


def read_split_folders(
    base: Path, classes: list[str], title: str, how: str
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Train and test samples of ``base/train/<class>/`` and ``base/{test,val}/<class>/``, labelled
    by the index of their folder in ``classes`` (sorted, as ImageFolder labels them). Both splits
    must hold exactly those class folders: a partial or foreign copy never passes for the dataset."""
    parts = {"train": base / "train", "test": held_out_folder(base)}
    samples = {}
    for part, folder in parts.items():
        found = class_folders(folder, f"{title} {part}", how)
        if found != classes:
            extra, missing = sorted(set(found) - set(classes)), sorted(set(classes) - set(found))
            what = f"lacks {len(missing)}, e.g. {missing[0]}" if missing else f"has others, e.g. {extra[0]}"
            raise DataNotFoundError(
                f"{title} needs the {len(classes)} class folders {classes[0]}..{classes[-1]} in {folder}, "
                f"but it {what}; {how}"
            )
        samples[part] = scan_folder(folder, {c: i for i, c in enumerate(classes)}, f"{title} {part}", how)
    return samples["train"], samples["test"]


def split_folders_complete(base: Path, classes: list[str]) -> bool:
    """Both split folders hold exactly ``classes``."""
    found = [
        sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        for folder in (base / "train", held_out_folder(base))
    ]
    return all(names == classes for names in found)


def write_split_folders(
    base: Path,
    classes: list[str],
    n_train: int,
    n_test: int,
    rng: np.random.RandomState,
    test_name: str = "test",
) -> None:
    """``base/train/<class>/`` and ``base/<test_name>/<class>/`` with random JPEGs, named apart."""
    for split, count in (("train", n_train), (test_name, n_test)):
        for name in classes:
            (base / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                random_jpeg(base / split / name / f"{split}_{i}.jpg", rng)
