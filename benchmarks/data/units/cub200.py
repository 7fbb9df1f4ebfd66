"""CUB-200-2011: 200 bird species, 11,788 images; a CIL stream of the LAMDA family (PROOF, C3Box, APER).

Its files: the official ``CUB_200_2011.tgz`` (extracted into ``cub200/``, it leaves
``cub200/CUB_200_2011/``), split by the archive's ``train_test_split.txt`` (5,994 training and 5,794
test images), or the LAMDA family's ImageFolder archive put at ``cub200/{train,test}/`` (its own
split; ``_lamda``). Labels: the class ids of ``classes.txt`` less one, which are also the sorted
class folders' indices (``001.Black_footed_Albatross`` ...), so the suite's ``seed1993`` order is the
order PROOF's and C3Box's ``utils/data_manager.py`` draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError
from benchmarks.data.datasets import (
    ClassificationData,
    require,
    require_root,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    count_dirs,
    missing_or,
    random_jpeg,
    register_dataset,
)
from benchmarks.data.units._lamda import c3box_names, check_layout, lamda_complete, load_lamda

# The official archive (data.caltech.edu record 65de6-vp158); its MD5 is the one avalanche's CUB200
# dataset (avalanche/benchmarks/datasets/cub200/cub200.py, ``tgz_md5``) checks for the same file.
CUB_ARCHIVE = Archive(
    "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz", "97eceeb196236b17998738112f37df78"
)
OFFICIAL = "CUB_200_2011"
#: the metadata files of the official archive that the split is built from
METADATA = ("classes.txt", "images.txt", "image_class_labels.txt", "train_test_split.txt")


def cub_class_folders() -> list[str]:
    """The 200 official class folders (``classes.txt``): C3Box's names are these without their
    number, underscores as spaces (checked against the archive's list), so they are rebuilt here."""
    return [f"{i:03d}.{name.replace(' ', '_')}" for i, name in enumerate(c3box_names("cub200"), start=1)]


def _table(path: Path) -> dict[int, str]:
    """``<id> <value>`` lines of one of the archive's metadata files."""
    rows = (line.split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {int(key): value.strip() for key, value in rows}


@register_dataset("cub200")
class Cub200(DatasetUnit):
    title = "CUB-200"
    folder = "cub200"
    archives_hold_contents = True  # the archive holds CUB_200_2011/ (and attributes.txt)
    list_position = 8
    n_classes = 200
    # zhoudw-zdw/PROOF@0bb2052 exps/cub.json (init_cls 20, increment 20; exps/cubb100.json: 100, 20);
    # zhoudw-zdw/RevisitingCIL@a2e6b71 exps/simplecil/cub_10_10_vit-b_simplecil.json (10, 10).
    # LAMDA-CL/C3Box@1378ab2's exps/ hold no CUB config.
    published_splits = {"proof": "B0-Inc20", "aper": "B0-Inc10"}

    def load(self, data_root: Path | None, layout: str = "official") -> ClassificationData:
        """CUB-200-2011: ``layout="official"``, the archive's own split (5,994 / 5,794); ``"lamda"``,
        the LAMDA family's ``train/`` and ``test/`` folders. Names: C3Box's (``labels.json``)."""
        from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

        check_layout(self, layout)
        if layout == "lamda":
            return load_lamda(self, data_root, "cub200", 200)
        root = require_root(data_root, self.name)
        base = root / self.folder / OFFICIAL
        how = with_prepare_hint(
            self.files_name, root, f"or extract CUB_200_2011.tgz into {root / self.folder}"
        )
        for name in METADATA:
            require(base / name, self.title, how)
        classes = _table(base / "classes.txt")
        if len(classes) != 200:
            raise DataNotFoundError(f"{base / 'classes.txt'} lists {len(classes)} classes, not 200; {how}")
        images, labels = _table(base / "images.txt"), _table(base / "image_class_labels.txt")
        is_train = _table(base / "train_test_split.txt")
        parts: dict[str, list[tuple[str, int]]] = {"1": [], "0": []}
        for image_id, path in sorted(images.items()):
            parts[is_train[image_id]].append((str(base / "images" / path), int(labels[image_id]) - 1))
        missing = [p for p, _ in parts["1"][:1] + parts["0"][:1] if not Path(p).is_file()]
        if missing:
            raise DataNotFoundError(f"{self.title} image not found: looked for {missing[0]}; {how}")
        train, test = FileListDataset(parts["1"]), FileListDataset(parts["0"])
        return ClassificationData(
            self.name, train, test, c3box_names("cub200"), list(train.targets), list(test.targets)
        )

    def image_counts(self, layout: str = "official", **options: Any) -> tuple[int, int] | None:
        return (5_994, 5_794) if layout == "official" else None  # the LAMDA archive's split: unknown

    def archives(self) -> list[Archive]:
        return [CUB_ARCHIVE]

    def describe_files(self) -> str:
        return f"{self.folder}/{OFFICIAL}/ from CUB_200_2011.tgz (or the LAMDA archive's train/ and test/)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        if lamda_complete(base, 200):
            return "present"
        official = base / OFFICIAL
        checks = [((official / name).is_file(), f"{OFFICIAL}/{name} is missing") for name in METADATA]
        checks.append(
            (count_dirs(official / "images") == 200, f"{OFFICIAL}/images/ does not hold 200 class folders")
        )
        return missing_or(checks, base)

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``cub200/CUB_200_2011/``: ``images/<class>/*.jpg`` and the four metadata files."""
        base = root / self.folder / OFFICIAL
        rows: dict[str, list[str]] = {name: [] for name in METADATA}
        image_id = 0
        for label, folder in enumerate(cub_class_folders(), start=1):
            (base / "images" / folder).mkdir(parents=True, exist_ok=True)
            rows["classes.txt"].append(f"{label} {folder}")
            for i in range(n_train + n_test):
                image_id += 1
                path = f"{folder}/{folder[4:]}_{i + 1:04d}_{image_id}.jpg"
                random_jpeg(base / "images" / path, rng)
                rows["images.txt"].append(f"{image_id} {path}")
                rows["image_class_labels.txt"].append(f"{image_id} {label}")
                rows["train_test_split.txt"].append(f"{image_id} {int(i < n_train)}")
        for name, lines in rows.items():
            (base / name).write_text("\n".join(lines) + "\n")
        return root / self.folder
