"""SUN397 scenes: the 300-class subset the LAMDA papers use, or the official 397 classes split per class.

Two layouts, one folder (``SUN397/``, where ``torchvision.datasets.SUN397`` reads the official one):

* the official ``SUN397.tar.gz`` (vision.princeton.edu), which ``prepare`` downloads (torchvision's
  URL and MD5): ``SUN397/ClassName.txt`` and ``SUN397/<letter>/<class>[/<subclass>]/sun_*.jpg``,
  108,754 images of 397 classes with no split of its own. ``split = "stratified"`` reads it with
  torchvision and splits each class: ``train_fraction`` to training, drawn with ``split_seed``.
* the C3Box authors' archive (the SUN link of LAMDA-CL/C3Box@1378ab2's README):
  ``SUN397/train/<class>/`` and ``SUN397/val/<class>/`` of 300 classes, read as C3Box's
  ``utils/data.py`` reads it (ImageFolder; RevisitingCIL's ``test/`` is accepted too).
  ``split = "lamda"``, the default, is that subset and split: both are the archive's own (no list of
  the 300 classes' folders nor of the split is published), so they come only from that archive,
  extracted by hand into ``SUN397/``.

Class names of the LAMDA subset: C3Box's ``utils/labels.json`` ``sun`` list, which C3Box's
``DataManager`` gives label by label (``assets/sun300_names_c3box.json``); labels are the sorted class
folders' indices, so its class order ``np.random.seed(1993); np.random.permutation(300)`` is this
suite's ``seed1993``. The list is sorted and each name is one scene (``abbey`` .. ``ski slope``,
without SUN397's ``/indoor``-style subclasses). They are the first 300 distinct scene names of the
official ``ClassName.txt`` in its order, one name for a scene's subclasses (``balcony`` for
``/b/balcony/exterior`` and ``/b/balcony/interior``): checked, they span its first 325 classes,
through ``/s/ski_slope``. Which images of those the archive keeps, and how, is not published. The
fake writer names the class folders after the list, underscores for spaces, as the archive's own
folder names are not published either. C3Box's experiment files set no task split for SUN, so none
is declared. The official classes' names are torchvision's, cleaned (``apartment_building/outdoor``:
"apartment building outdoor").
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError
from benchmarks.data.datasets import (
    ROOT_HINT,
    ClassificationData,
    check_choice,
    class_folders,
    clean_class_name,
    require,
    require_root,
    stratified_split,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    asset_json,
    missing_or,
    register_dataset,
)
from benchmarks.data.units._authors_split import (
    check_split_options,
    read_split_folders,
    split_folders_complete,
    write_split_folders,
)

SUN397_SPLITS = ("lamda", "stratified")
#: torchvision's ``SUN397._DATASET_URL`` and ``_DATASET_MD5`` (0.29; a test holds them equal), as data:
#: the command line lists every unit's files without importing torchvision
SUN397_ARCHIVE = Archive(
    "http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz", "8ca2778205c41d23104230ba66911c7a"
)
SUN397_IMAGES = 108_754  # torchvision's SUN397 docstring


@functools.lru_cache(maxsize=1)
def sun300_names() -> list[str]:
    """C3Box's names of the 300 classes of the LAMDA SUN subset, by label."""
    return asset_json("sun300_names_c3box.json")


def sun300_fake_folders() -> list[str]:
    return [name.replace(" ", "_") for name in sun300_names()]


@register_dataset("sun397")
class Sun397(DatasetUnit):
    title = "SUN397"
    folder = "SUN397"  # torchvision's SUN397 reads the official archive there
    list_position = 16
    n_classes = 300

    def class_count(self, split: str = "lamda", **options: Any) -> int:
        """The C3Box authors' 300 classes, or the official 397 (``split = "stratified"``)."""
        return 397 if split == "stratified" else 300

    def load(
        self, data_root: Path | None, split: str = "lamda", split_seed: int = 0, train_fraction: float = 0.8
    ) -> ClassificationData:
        """SUN397 from ``{data_root}/SUN397``: ``split = "lamda"``, the C3Box authors' 300 classes
        and split (``train/`` and ``val/`` or ``test/``), or ``"stratified"``, the official 397
        classes split per class (``train_fraction``, ``split_seed``)."""
        name = self.name
        check_choice(name, "split", split, SUN397_SPLITS)
        check_split_options(name, split_seed, train_fraction)
        root = require_root(data_root, name)
        base = root / self.folder
        if split == "stratified":
            return self._official(root, split_seed, train_fraction)
        how = (
            "the LAMDA subset comes only from the C3Box authors' archive (C3Box's README, SUN): extract "
            f"it so that {base}/train and {base}/val hold its 300 class folders, or set split = "
            f'"stratified" to split the official archive (python -m benchmarks.prepare sun397); {ROOT_HINT}'
        )
        classes = class_folders(base / "train", f"{self.title} train", how)
        if len(classes) != 300:
            raise DataNotFoundError(
                f"{self.title}'s LAMDA subset has 300 classes, but {base / 'train'} holds {len(classes)} "
                f"class folders; {how}"
            )
        train, test = read_split_folders(base, classes, self.title, how)
        return self._data(sun300_names(), train, test)

    def _official(self, root: Path, split_seed: int, train_fraction: float) -> ClassificationData:
        from torchvision.datasets import SUN397

        how = with_prepare_hint(self.files_name, root, f"or extract SUN397.tar.gz into {root}")
        require(root / self.folder / "ClassName.txt", self.title, how)
        full = SUN397(str(root))
        paths = [str(path) for path in full._image_files]  # torchvision keeps them only here
        if not paths:
            raise DataNotFoundError(f"{self.title}: no sun_*.jpg image under {root / self.folder}; {how}")
        train, test = stratified_split(list(zip(paths, full._labels)), train_fraction, split_seed)
        names = [clean_class_name(c.replace("/", " ")) for c in full.classes]
        return self._data(names, train, test)

    def _data(
        self, names: list[str], train: list[tuple[str, int]], test: list[tuple[str, int]]
    ) -> ClassificationData:
        from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

        train_set, test_set = FileListDataset(train), FileListDataset(test)
        return ClassificationData(
            self.name, train_set, test_set, list(names), list(train_set.targets), list(test_set.targets)
        )

    def archives(self) -> list[Archive]:
        return [SUN397_ARCHIVE]

    def describe_files(self) -> str:
        return f"{self.folder}/ from SUN397.tar.gz (the LAMDA subset: the C3Box authors' archive, by hand)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        official = (base / "ClassName.txt").is_file()
        train = base / "train"
        classes = sorted(p.name for p in train.iterdir() if p.is_dir()) if train.is_dir() else []
        lamda = len(classes) == 300 and split_folders_complete(base, classes)
        why = "it holds neither ClassName.txt nor train/ and val/ with the same 300 class folders"
        return missing_or([(official or lamda, why)], base)

    def image_counts(
        self, split: str = "lamda", train_fraction: float = 0.8, **options: Any
    ) -> tuple[int, int] | None:
        """``stratified``: the 108,754 split by ``train_fraction`` (per class in fact, so within a
        few images of this); the LAMDA archive's split: not published."""
        if split != "stratified":
            return None
        train = round(SUN397_IMAGES * train_fraction)
        return train, SUN397_IMAGES - train

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """The C3Box archive's layout: ``SUN397/{train,val}/<class>/`` for the 300 classes."""
        base = root / self.folder
        write_split_folders(base, sun300_fake_folders(), n_train, n_test, rng, test_name="val")
        return base
