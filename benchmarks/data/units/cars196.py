"""Stanford Cars: 196 car models, 8,144 training and 8,041 test images; a CIL stream of the LAMDA
family (PROOF, C3Box) on 100 of its classes.

Its files: the four official files, which Stanford no longer serves (torchvision's ``StanfordCars``
cannot download them any more), so the user puts them in the archives folder and ``prepare``
checks their MD5 and builds ``cars196/stanford_cars/`` (the layout torchvision reads); or the LAMDA
family's ImageFolder archive put at ``cars196/{train,test}/`` (100 classes, its own split).

Classes. ``classes="all"``: the 196, numbered as torchvision does (``cars_meta.mat``'s order).
``classes="c3box"``: the 100 of the LAMDA archive, numbered as its sorted folders are. C3Box's
``labels.json`` (cars) lists the 196 names sorted as folder names with underscores for spaces
(``Audi_TTS_Coupe_2012`` before ``Audi_TT_Hatchback_2011``), cut after 102 of which its code reads
the first 100, so the archive holds the first 100 classes of that order (inferred: its names are
right only then), and the suite's ``seed1993`` is C3Box's order over them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.io

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
    asset_json,
    missing_or,
    random_jpeg,
    register_dataset,
)
from benchmarks.data.units._lamda import (
    check_layout,
    install_user_files,
    lamda_complete,
    load_lamda,
    missing_user_files,
)

# The official files and the MD5s torchvision checked before Stanford stopped serving them
# (pytorch/vision v0.13.0 torchvision/datasets/stanford_cars.py, StanfordCars.download).
CARS_FILES = [
    Archive("https://ai.stanford.edu/~jkrause/cars/car_devkit.tgz", "c3b158d763b6e2245038c8ad08e45376"),
    Archive("https://ai.stanford.edu/~jkrause/car196/cars_train.tgz", "065e5b463ae28d29e77c1b4b166cfe61"),
    Archive("https://ai.stanford.edu/~jkrause/car196/cars_test.tgz", "4ce7ebf6a94d07f1952d94dd34c4d501"),
    Archive(
        "https://ai.stanford.edu/~jkrause/car196/cars_test_annos_withlabels.mat",
        "b0a2b23655a3edd16d84508592a98d10",
    ),
]
OFFICIAL = "stanford_cars"  # the folder torchvision's StanfordCars reads under its root
CLASS_SETS = ("all", "c3box")
C3BOX_CLASSES = 100


def stanford_cars_classes() -> list[str]:
    """The 196 class names in ``cars_meta.mat``'s order (``assets/stanford_cars_classes.json``)."""
    return asset_json("stanford_cars_classes.json")["names"]


def c3box_subset() -> list[int]:
    """The official class ids (0-based) of the LAMDA archive's 100 classes, by its label."""
    names = stanford_cars_classes()
    ranked = sorted(range(len(names)), key=lambda i: names[i].replace(" ", "_"))
    return ranked[:C3BOX_CLASSES]


@register_dataset("cars196")
class Cars196(DatasetUnit):
    title = "Cars"
    folder = "cars196"
    list_position = 9
    n_classes = 196
    # zhoudw-zdw/PROOF@0bb2052 exps/car.json (init_cls 10, increment 10; carb100.json: 50, 10) and
    # LAMDA-CL/C3Box@1378ab2 report on the 100 classes of classes="c3box" (or layout="lamda") only:
    # with this default of 196 classes no published split applies.
    published_splits: ClassVar[dict[str, str]] = {}

    def class_count(self, layout: str = "official", classes: str = "all", **options: Any) -> int:
        """196, or the LAMDA archive's 100 (``classes = "c3box"`` or ``layout = "lamda"``)."""
        return 196 if layout == "official" and classes == "all" else 100

    def load(
        self, data_root: Path | None, layout: str = "official", classes: str = "all"
    ) -> ClassificationData:
        """Stanford Cars: ``layout="official"``, its official split read by torchvision, all 196
        classes or (``classes="c3box"``) the LAMDA archive's 100; ``"lamda"``, the LAMDA family's
        folders (100 classes). Names: the official ones, which C3Box's list repeats."""
        from torchvision.datasets import StanfordCars

        from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

        check_layout(self, layout)
        check_choice(self.name, "classes", classes, CLASS_SETS)
        if layout == "lamda":
            return load_lamda(self, data_root, "cars", C3BOX_CLASSES)
        root = require_root(data_root, self.name)
        base = root / self.folder
        files = ", ".join(a.filename for a in CARS_FILES)
        how = with_prepare_hint(self.files_name, root, f"from the official {files}")
        for name in ("devkit/cars_meta.mat", "devkit/cars_train_annos.mat", "cars_test_annos_withlabels.mat"):
            require(base / OFFICIAL / name, self.title, how)
        train, test = (StanfordCars(str(base), split=split) for split in ("train", "test"))
        if classes == "all":
            return ClassificationData(
                self.name,
                train,
                test,
                list(train.classes),
                [label for _, label in train._samples],
                [label for _, label in test._samples],
            )
        subset = c3box_subset()
        label_of = {official: label for label, official in enumerate(subset)}
        kept = [
            FileListDataset([(path, label_of[c]) for path, c in split._samples if c in label_of])
            for split in (train, test)
        ]
        names = [train.classes[i] for i in subset]
        return ClassificationData(self.name, kept[0], kept[1], names, kept[0].targets, kept[1].targets)

    def image_counts(
        self, layout: str = "official", classes: str = "all", **options: Any
    ) -> tuple[int, int] | None:
        if layout == "official" and classes == "all":
            return 8_144, 8_041
        return None  # the 100-class subset's and the LAMDA archive's sizes are not published

    def archives(self) -> list[Archive]:
        return list(CARS_FILES)

    def describe_files(self) -> str:
        return f"{self.folder}/{OFFICIAL}/ from your official Stanford Cars files (--archives)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        if lamda_complete(base, C3BOX_CLASSES):
            return "present"
        cars = base / OFFICIAL
        names = ("devkit/cars_meta.mat", "devkit/cars_train_annos.mat", "cars_test_annos_withlabels.mat")
        checks = [((cars / name).is_file(), f"{OFFICIAL}/{name} is missing") for name in names]
        checks += [((cars / d).is_dir(), f"{OFFICIAL}/{d}/ is missing") for d in ("cars_train", "cars_test")]
        return missing_or(checks, base)

    def unavailable(self, ctx: PrepareContext) -> str | None:
        missing = missing_user_files(ctx, CARS_FILES)
        return (
            f"its official files are not in {ctx.archives} (Stanford no longer serves them)"
            if missing
            else None
        )

    def prepare(self, ctx: PrepareContext) -> None:
        install_user_files(ctx, self, CARS_FILES, OFFICIAL, "Stanford stopped serving Stanford Cars")

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``cars196/stanford_cars/``: ``devkit/{cars_meta,cars_train_annos}.mat``,
        ``cars_test_annos_withlabels.mat`` and the images of ``cars_train/`` and ``cars_test/``."""
        base = root / self.folder / OFFICIAL
        (base / "devkit").mkdir(parents=True, exist_ok=True)
        names = stanford_cars_classes()
        scipy.io.savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array(names, dtype=object)})
        for split, count, listing in (
            ("train", n_train, base / "devkit" / "cars_train_annos.mat"),
            ("test", n_test, base / "cars_test_annos_withlabels.mat"),
        ):
            (base / f"cars_{split}").mkdir(exist_ok=True)
            rows: list[tuple[int, str]] = []
            for label in range(1, len(names) + 1):
                for i in range(count):
                    fname = f"{len(rows) + 1:05d}.jpg"
                    random_jpeg(base / f"cars_{split}" / fname, rng)
                    rows.append((label, fname))
            table = np.array(rows, dtype=[("class", object), ("fname", object)])
            scipy.io.savemat(listing, {"annotations": table})
        return root / self.folder
