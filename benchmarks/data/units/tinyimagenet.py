"""TinyImageNet-200: 100,000 training and 10,000 validation 64x64 images of 200 ImageNet classes.

Read from the official ``tiny-imagenet-200.zip`` (cs231n) as the CLIP-CIL code that reports on it
reads it: MoE-Adapters (JiazuoYu/MoE-Adapters4CL@4572d97, ``cil/continual_clip/datasets.py``) takes
continuum's ``TinyImageNet200`` (Continvvm/continuum@43ba009, ``continuum/datasets/imagenet.py``).
That class labels a wnid by its line in the archive's ``wnids.txt`` (not sorted), lists each class's
training images from ``train/<wnid>/<wnid>_boxes.txt`` (files in ``train/<wnid>/images/``), and tests
on the validation images, labelled by ``val/val_annotations.txt`` (the official test images have no
labels). ``assets/tinyimagenet_wnids.json`` is that ``wnids.txt`` order, as MoE-Adapters'
``cil/dataset_reqs/tinyimagenet_classes.txt`` numbers it; the loader checks the archive's file against it.

Class names: that file's names, which are CLIP's ImageNet names for the 200 wnids (checked equal,
all 200), so they are read by wnid as the ImageNet units read them. MoE-Adapters' fixed class order
(``cil/class_orders/tinyimagenet.yaml``) is ``moe_adapters_tinyimagenet``; its configs
(``cil/configs/class/tinyimagenet_100-{5,10,20}.yaml``) start with 100 classes, then tasks of 5,
10 or 20, prompting "a bad photo of a {}.".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError
from benchmarks.data.datasets import (
    ClassificationData,
    folder_data,
    require,
    require_root,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    asset_json,
    count_dirs,
    missing_or,
    random_jpeg,
    register_dataset,
)

# The official archive; its page publishes no checksum, so this is the MD5 that avalanche's TinyImagenet
# dataset verifies for the same file.
TINY_IMAGENET = Archive(
    "http://cs231n.stanford.edu/tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"
)

# MoE-Adapters' fixed order (JiazuoYu/MoE-Adapters4CL@4572d97, cil/class_orders/tinyimagenet.yaml):
# labels in wnids.txt order, as continuum numbers them and this unit does.
MOE_ADAPTERS_TINYIMAGENET_ORDER: tuple[int, ...] = (
    131, 181, 22, 172, 144, 92, 97, 187, 58, 93, 6, 70, 106, 68, 153, 168, 179, 199, 29, 46,
    9, 142, 134, 88, 193, 110, 26, 32, 117, 112, 17, 39, 166, 13, 94, 138, 109, 147, 51, 101,
    59, 188, 116, 5, 170, 99, 100, 167, 180, 146, 65, 1, 104, 43, 38, 184, 123, 171, 137, 162,
    71, 44, 95, 174, 12, 7, 54, 152, 21, 47, 28, 176, 34, 2, 132, 118, 42, 189, 150, 14,
    165, 41, 192, 45, 82, 128, 63, 57, 197, 160, 53, 75, 108, 135, 121, 159, 183, 67, 169, 50,
    87, 69, 89, 196, 115, 19, 148, 96, 86, 11, 8, 60, 33, 173, 78, 4, 119, 105, 182, 127,
    177, 30, 186, 40, 49, 178, 76, 157, 161, 73, 164, 151, 31, 74, 191, 27, 125, 198, 81, 20,
    155, 114, 139, 36, 61, 56, 145, 48, 16, 83, 62, 85, 126, 0, 102, 23, 3, 140, 15, 195,
    133, 113, 190, 141, 52, 163, 156, 80, 111, 90, 175, 143, 120, 84, 18, 25, 79, 37, 154, 136,
    64, 158, 24, 185, 72, 35, 129, 55, 149, 91, 122, 77, 103, 124, 130, 66, 10, 107, 194, 98,
)  # fmt: skip


def tinyimagenet_wnids() -> list[str]:
    """The 200 wnids in the official ``wnids.txt`` order (``assets/tinyimagenet_wnids.json``)."""
    return asset_json("tinyimagenet_wnids.json")


@register_dataset("tinyimagenet")
class TinyImageNet(DatasetUnit):
    title = "TinyImageNet"
    folder = "tiny-imagenet-200"
    list_position = 15
    n_classes = 200
    class_orders = {"moe_adapters_tinyimagenet": MOE_ADAPTERS_TINYIMAGENET_ORDER}
    #: MoE-Adapters' run_experiment_tiny10step.sh runs configs/class/tinyimagenet_100-10.yaml
    #: (initial_increment 100, increment 10); it also publishes 100-5 and 100-20
    published_splits = {"moe_adapters": "B100-Inc10"}

    def load(self, data_root: Path | None) -> ClassificationData:
        """TinyImageNet from ``{data_root}/tiny-imagenet-200``: train, and val as the test split."""
        root = require_root(data_root, self.name)
        base = root / self.folder
        how = with_prepare_hint(self.files_name, root, f"or extract tiny-imagenet-200.zip into {root}")
        wnids = tinyimagenet_wnids()
        require(base / "wnids.txt", self.title, how)
        found = (base / "wnids.txt").read_text(encoding="utf-8").split()
        if found != wnids:
            raise DataNotFoundError(
                f"{base / 'wnids.txt'} does not list the 200 official wnids in their official order "
                f"({wnids[0]}, {wnids[1]}, ...); {how}"
            )
        label = {wnid: i for i, wnid in enumerate(wnids)}
        train = []
        for wnid in wnids:
            boxes = base / "train" / wnid / f"{wnid}_boxes.txt"
            require(boxes, f"{self.title} train", how)
            files = [line.split("\t")[0] for line in boxes.read_text(encoding="utf-8").splitlines() if line]
            train += [(str(base / "train" / wnid / "images" / file), label[wnid]) for file in files]
        annotations = base / "val" / "val_annotations.txt"
        require(annotations, f"{self.title} val", how)
        test = []
        for line in filter(None, annotations.read_text(encoding="utf-8").splitlines()):
            file, wnid = (line.split("\t") + [""])[:2]
            if wnid not in label:
                raise DataNotFoundError(f"{annotations} names {wnid!r}, not one of the 200 wnids; {how}")
            test.append((str(base / "val" / "images" / file), label[wnid]))
        return folder_data(self.name, wnids, train, test)

    def archives(self) -> list[Archive]:
        return [TINY_IMAGENET]

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        return missing_or(
            [
                ((base / "wnids.txt").is_file(), "wnids.txt is missing"),
                (count_dirs(base / "train") == 200, "train/ does not hold 200 wnid folders"),
                ((base / "val" / "val_annotations.txt").is_file(), "val/val_annotations.txt is missing"),
            ],
            base,
        )

    def image_counts(self, **options: Any) -> tuple[int, int]:
        return 100_000, 10_000  # 500 training and 50 validation images a class

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``tiny-imagenet-200/``: ``wnids.txt``, ``train/<wnid>/{images/, <wnid>_boxes.txt}``,
        ``val/{images/, val_annotations.txt}``, named as the official files are."""
        base = root / self.folder
        wnids = tinyimagenet_wnids()
        (base / "val" / "images").mkdir(parents=True, exist_ok=True)
        (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
        annotations: list[str] = []
        for wnid in wnids:
            (base / "train" / wnid / "images").mkdir(parents=True, exist_ok=True)
            boxes = []
            for i in range(n_train):
                random_jpeg(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", rng)
                boxes.append(f"{wnid}_{i}.JPEG\t0\t0\t63\t63")
            (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("\n".join(boxes) + "\n")
            for _ in range(n_test):
                name = f"val_{len(annotations)}.JPEG"
                random_jpeg(base / "val" / "images" / name, rng)
                annotations.append(f"{name}\t{wnid}\t0\t0\t63\t63")
        (base / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
        return base
