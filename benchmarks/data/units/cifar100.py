"""CIFAR-100: the official python version, 50k train and 10k test images of 100 classes."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import UserError
from benchmarks.data.datasets import (
    ClassificationData,
    check_choice,
    clean_class_name,
    is_fake_data_root,
    require,
    require_root,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    CONTINUAL_CLIP,
    MG_CLIP,
    Archive,
    DataProtocol,
    DatasetUnit,
    PrepareContext,
    missing_or,
    register_dataset,
)

#: the 100 fine labels as the official ``meta`` file lists them (what the fake writer writes)
CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly "
    "camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup "
    "dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower "
    "leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid "
    "otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road "
    "rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower "
    "sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale "
    "willow_tree wolf woman worm"
).split()

# The fixed CIFAR-100 order of iCaRL/PODNet, reused by DyTox, Continual-CLIP and MoE-Adapters
# (their `class_orders/cifar100.yaml`). Public list, verified to be a permutation of 0..99.
DYTOX_CIFAR100_ORDER: tuple[int, ...] = (
    87, 0, 52, 58, 44, 91, 68, 97, 51, 15,
    94, 92, 10, 72, 49, 78, 61, 14, 8, 86,
    84, 96, 18, 24, 32, 45, 88, 11, 4, 67,
    69, 66, 77, 47, 79, 93, 29, 50, 57, 83,
    17, 81, 41, 12, 37, 59, 25, 20, 80, 73,
    1, 28, 6, 46, 62, 82, 53, 9, 31, 75,
    38, 63, 33, 74, 27, 22, 36, 3, 16, 21,
    60, 19, 70, 90, 89, 43, 5, 42, 65, 76,
    40, 30, 23, 85, 2, 95, 56, 48, 71, 64,
    98, 13, 99, 7, 34, 55, 54, 26, 35, 39,
)  # fmt: skip


#: torchvision's ``CIFAR100.url`` and ``tgz_md5`` (0.29; a test holds them equal), as data: the command
#: line lists every unit's files without importing torchvision
CIFAR100_ARCHIVE = Archive(
    "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"
)


@functools.cache
def _unchecked_cifar100() -> type:
    """torchvision's CIFAR100 that only checks the files exist (``check_integrity`` skips md5=None);
    made on first use, so that importing the unit does not import torchvision."""
    from torchvision.datasets import CIFAR100

    return type(
        "_UncheckedCIFAR100",
        (CIFAR100,),
        {
            "__module__": __name__,
            "train_list": [[name, None] for name, _ in CIFAR100.train_list],
            "test_list": [[name, None] for name, _ in CIFAR100.test_list],
            "meta": {**CIFAR100.meta, "md5": None},
        },
    )


def __getattr__(name: str) -> Any:
    # pickle finds the class by its module's attribute (DataLoader workers under spawn)
    if name == "_UncheckedCIFAR100":
        return _unchecked_cifar100()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@register_dataset("cifar100")
class Cifar100(DatasetUnit):
    title = "CIFAR-100"
    folder = "cifar-100-python"  # torchvision's CIFAR100.base_folder: its class reads it there
    list_position = 1
    n_classes = 100
    class_orders = {"dytox": DYTOX_CIFAR100_ORDER}
    published = {
        "continual_clip": DataProtocol(
            "dytox",
            {"class_names": "torchvision"},
            "a bad photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/cifar100.yaml; datasets.py uses torchvision's CIFAR100 "
            "classes as they are; configs/class/cifar100_10-10.yaml prompt_template",
        ),
        "mg_clip": DataProtocol(
            "dytox",
            {"class_names": "torchvision"},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/cifar100.yaml; datasets.py uses torchvision's CIFAR100 classes "
            "as they are; configs/class/cifar100_10-10.yaml prompt_template",
        ),
    }

    def load(
        self, data_root: Path | None, verify_checksum: bool = True, class_names: str = "clean"
    ) -> ClassificationData:
        """CIFAR-100, official 50k/10k split, from ``{data_root}/cifar-100-python``.

        ``verify_checksum=False`` skips torchvision's MD5 check (for re-packed copies and fixtures).
        ``class_names``: ``"clean"`` (underscores become spaces) or ``"torchvision"`` (torchvision's
        names as they are, ``aquarium_fish``: what Continual-CLIP and MG-CLIP put in their prompts).
        """
        check_choice(self.name, "class_names", class_names, ("clean", "torchvision"))
        root = require_root(data_root, self.name)
        how = with_prepare_hint(
            self.files_name, root, f"or extract the official cifar-100-python.tar.gz into {root}"
        )
        for name in ("train", "test", "meta"):
            require(root / self.folder / name, self.title, how)
        from torchvision.datasets import CIFAR100

        cls = CIFAR100 if verify_checksum and not is_fake_data_root(root) else _unchecked_cifar100()
        try:
            train = cls(str(root), train=True, download=False)
            test = cls(str(root), train=False, download=False)
        except RuntimeError:
            raise UserError(
                f"CIFAR-100 files in {root / self.folder} fail torchvision's MD5 check; prepare them "
                f"again with python -m benchmarks.prepare cifar100 --force --data-root {root} "
                "(or pass verify_checksum=False for a re-packed copy)"
            ) from None
        return ClassificationData(
            name=self.name,
            train=train,
            test=test,
            class_names=[c if class_names == "torchvision" else clean_class_name(c) for c in train.classes],
            train_targets=[int(t) for t in train.targets],
            test_targets=[int(t) for t in test.targets],
        )

    def archives(self) -> list[Archive]:
        return [CIFAR100_ARCHIVE]

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        if not base.exists():
            return "missing"  # said without the seconds torchvision takes to import
        from torchvision.datasets import CIFAR100
        from torchvision.datasets.utils import check_integrity

        files = [*CIFAR100.train_list, *CIFAR100.test_list, [CIFAR100.meta["filename"], CIFAR100.meta["md5"]]]
        return missing_or(
            [(check_integrity(str(base / f), md5), f"{f} fails its MD5 check") for f, md5 in files], base
        )

    def image_counts(self, **options: Any) -> tuple[int, int]:
        return 50_000, 10_000  # the official split, 500 and 100 a class

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``cifar-100-python/{train,test,meta}``: the official pickles' keys, 32x32 random images."""
        base = root / self.folder
        base.mkdir(parents=True, exist_ok=True)
        with open(base / "meta", "wb") as handle:
            coarse = [f"superclass_{i}" for i in range(20)]
            pickle.dump({"fine_label_names": CIFAR100_CLASSES, "coarse_label_names": coarse}, handle)
        for split, per_class in (("train", n_train), ("test", n_test)):
            fine = [label for label in range(100) for _ in range(per_class)]
            entry = {
                "batch_label": f"{split}ing batch 1 of 1",
                "filenames": [f"fake_{split}_{i}.png" for i in range(len(fine))],
                "fine_labels": fine,
                "coarse_labels": [label // 5 for label in fine],
                "data": rng.randint(0, 256, (len(fine), 3 * 32 * 32), dtype=np.uint8),
            }
            with open(base / split, "wb") as handle:
                pickle.dump(entry, handle)
        return base
