"""Oxford-IIIT Pets: 37 cat and dog breeds, a zero-shot target (its test split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.data.datasets import ClassificationData, require_root, torchvision_target
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    missing_or,
    random_jpeg,
    register_dataset,
)

#: the 37 breeds as the official annotation files name them (cats are capitalised)
PETS_BREEDS = (
    "Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay boxer "
    "British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired "
    "great_pyrenees havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland "
    "Persian pomeranian pug Ragdoll Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese "
    "Sphynx staffordshire_bull_terrier wheaten_terrier yorkshire_terrier"
).split()


#: torchvision's ``OxfordIIITPet._RESOURCES`` (0.29; a test holds them equal), as data: the command
#: line lists every unit's files without importing torchvision
PETS_URL = "https://www.robots.ox.ac.uk/~vgg/data/pets/data"
PETS_ARCHIVES = (
    Archive(f"{PETS_URL}/images.tar.gz", "5c4f3ee8e5d25df40f4fd59a7f44e54c"),
    Archive(f"{PETS_URL}/annotations.tar.gz", "95a8c909bbe2e81eed6a22bccdf3f68f"),
)


@register_dataset("pets")
class Pets(DatasetUnit):
    title = "Pets"
    folder = "oxford-iiit-pet"
    archives_hold_contents = True  # images.tar.gz and annotations.tar.gz hold its two subfolders
    list_position = 5
    n_classes = 37

    def load(self, data_root: Path | None, include_train: bool = False) -> ClassificationData:
        """Oxford-IIIT Pets test split (37 breeds); ``include_train`` adds the trainval split."""
        from torchvision.datasets import OxfordIIITPet

        root = require_root(data_root, self.name)
        base = root / self.folder
        return torchvision_target(
            self.name,
            "Oxford-IIIT Pets",
            root,
            base,
            "annotations/test.txt",
            f"the official images.tar.gz and annotations.tar.gz into {base}",
            lambda split: OxfordIIITPet(str(root), split=split, target_types="category", download=False),
            train_split="trainval",
            include_train=include_train,
        )

    def archives(self) -> list[Archive]:
        return list(PETS_ARCHIVES)

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        return missing_or(
            [
                ((base / "annotations" / "test.txt").is_file(), "annotations/test.txt is missing"),
                ((base / "images").is_dir(), "images/ is missing"),
            ],
            base,
        )

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``oxford-iiit-pet/{images,annotations}``: ``<Breed>_<n>.jpg`` and the split lists."""
        base = root / self.folder
        (base / "images").mkdir(parents=True, exist_ok=True)
        (base / "annotations").mkdir(parents=True, exist_ok=True)
        for split, count, offset in (("trainval", n_train, 0), ("test", n_test, n_train)):
            lines = []
            for label, breed in enumerate(PETS_BREEDS, start=1):
                species = 1 if breed[0].isupper() else 2  # the official convention: cats are capitalised
                for i in range(offset + 1, offset + count + 1):
                    random_jpeg(base / "images" / f"{breed}_{i}.jpg", rng)
                    lines.append(f"{breed}_{i} {label} {species} {label}")
            (base / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
        return base
