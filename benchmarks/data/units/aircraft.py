"""FGVC-Aircraft: its 100 variants, 10,000 images; a CIL stream of the LAMDA family (PROOF, C3Box).

Its files: the official ``fgvc-aircraft-2013b.tar.gz``, extracted into ``aircraft/`` and read by
torchvision's ``FGVCAircraft`` (variant level), or the LAMDA family's ImageFolder archive put at
``aircraft/{train,test}/`` (its own split; ``_lamda``). Labels: the line of ``variants.txt``, whose
order is also the sorted folders' order that C3Box's ``labels.json`` lists (the two lists are equal,
checked against openai/CLIP@d05afc4 data/prompts.md, FGVCAircraft), so the suite's ``seed1993``
order is the order C3Box's and PROOF's ``utils/data_manager.py`` draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.data.datasets import (
    ClassificationData,
    check_choice,
    require,
    require_root,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    missing_or,
    random_jpeg,
    register_dataset,
)
from benchmarks.data.units._lamda import c3box_names, check_layout, lamda_complete, load_lamda

#: torchvision's URL (``FGVCAircraft._URL``, 0.29; a test holds them equal; it checks no checksum) and the
#: MD5 that mlverse/torchvision (R), fgvc_aircraft_dataset, checks for the same file; as data: the
#: command line lists every unit's files without importing torchvision
AIRCRAFT_ARCHIVE = Archive(
    "https://www.robots.ox.ac.uk/~vgg/data/fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz",
    "d4acdd33327262359767eeaa97a4f732",
)
OFFICIAL = "fgvc-aircraft-2013b"
#: the official splits a stream may train on; the test split is always ``test``
TRAIN_SPLITS = ("trainval", "train")
#: images of each official split (the dataset's README: 3,334 train, 3,333 val, 3,333 test)
SPLIT_IMAGES = {"train": 3_334, "trainval": 6_667, "test": 3_333}


@register_dataset("aircraft")
class Aircraft(DatasetUnit):
    title = "Aircraft"
    folder = "aircraft"
    archives_hold_contents = True  # the archive holds fgvc-aircraft-2013b/: extracted into aircraft/
    list_position = 10
    n_classes = 100
    # LAMDA-CL/C3Box@1378ab2 exps/proof.json (aircraft, init_cls 10, increment 10); zhoudw-zdw/PROOF@0bb2052
    # exps/air.json (10, 10; exps/airb50.json: 50, 10)
    published_splits = {"c3box": "B0-Inc10", "proof": "B0-Inc10"}

    def load(
        self, data_root: Path | None, layout: str = "official", train_split: str = "trainval"
    ) -> ClassificationData:
        """FGVC-Aircraft's 100 variants: ``layout="official"``, torchvision's reading of the archive,
        trained on ``train_split`` (``trainval``, 6,667 images, or ``train``, 3,334) and tested on
        ``test`` (3,333); ``"lamda"``, the LAMDA family's folders. Names: C3Box's (= variants.txt)."""
        check_layout(self, layout)
        check_choice(self.name, "train_split", train_split, TRAIN_SPLITS)
        if layout == "lamda":
            return load_lamda(self, data_root, "aircraft", 100)
        root = require_root(data_root, self.name)
        base = root / self.folder
        how = with_prepare_hint(self.files_name, root, f"or extract {AIRCRAFT_ARCHIVE.filename} into {base}")
        for name in ("variants.txt", f"images_variant_{train_split}.txt", "images_variant_test.txt"):
            require(base / OFFICIAL / "data" / name, self.title, how)
        from torchvision.datasets import FGVCAircraft

        train = FGVCAircraft(str(base), split=train_split, annotation_level="variant")
        test = FGVCAircraft(str(base), split="test", annotation_level="variant")
        return ClassificationData(
            self.name, train, test, c3box_names("aircraft"), list(train._labels), list(test._labels)
        )

    def image_counts(
        self, layout: str = "official", train_split: str = "trainval", **options: Any
    ) -> tuple[int, int] | None:
        if layout != "official" or train_split not in SPLIT_IMAGES:
            return None  # the LAMDA archive's split is not published
        return SPLIT_IMAGES[train_split], SPLIT_IMAGES["test"]

    def archives(self) -> list[Archive]:
        return [AIRCRAFT_ARCHIVE]

    def describe_files(self) -> str:
        return f"{self.folder}/{OFFICIAL}/ from {AIRCRAFT_ARCHIVE.filename} (or the LAMDA archive's folders)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        if lamda_complete(base, 100):
            return "present"
        data = base / OFFICIAL / "data"
        names = ("variants.txt", "images_variant_trainval.txt", "images_variant_test.txt")
        checks = [((data / name).is_file(), f"{OFFICIAL}/data/{name} is missing") for name in names]
        checks.append(((data / "images").is_dir(), f"{OFFICIAL}/data/images/ is missing"))
        return missing_or(checks, base)

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``aircraft/fgvc-aircraft-2013b/data/``: ``images/<7 digits>.jpg``, ``variants.txt`` and
        the variant lists of the train, val, trainval and test splits (val: none here)."""
        data = root / self.folder / OFFICIAL / "data"
        (data / "images").mkdir(parents=True, exist_ok=True)
        variants = c3box_names("aircraft")
        lists: dict[str, list[str]] = {"train": [], "val": [], "trainval": [], "test": []}
        number = 1_000_000
        for variant in variants:
            for i in range(n_train + n_test):
                number += 1
                random_jpeg(data / "images" / f"{number}.jpg", rng)
                for split in ("train", "trainval") if i < n_train else ("test",):
                    lists[split].append(f"{number} {variant}")
        (data / "variants.txt").write_text("\n".join(variants) + "\n")
        for split, lines in lists.items():
            (data / f"images_variant_{split}.txt").write_text("".join(f"{line}\n" for line in lines))
        return root / self.folder
