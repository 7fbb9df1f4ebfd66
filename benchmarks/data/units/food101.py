"""Food-101: 101 dishes, a zero-shot target (its test split)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.data.datasets import ClassificationData, require_root, torchvision_target
from benchmarks.data.unit import (
    Archive,
    DatasetUnit,
    PrepareContext,
    count_dirs,
    missing_or,
    random_jpeg,
    register_dataset,
)

#: the 101 dishes as the official ``meta/classes.txt`` lists them
FOOD101_CLASSES = (
    "apple_pie baby_back_ribs baklava beef_carpaccio beef_tartare beet_salad beignets bibimbap "
    "bread_pudding breakfast_burrito bruschetta caesar_salad cannoli caprese_salad carrot_cake ceviche "
    "cheese_plate cheesecake chicken_curry chicken_quesadilla chicken_wings chocolate_cake "
    "chocolate_mousse churros clam_chowder club_sandwich crab_cakes creme_brulee croque_madame cup_cakes "
    "deviled_eggs donuts dumplings edamame eggs_benedict escargots falafel filet_mignon fish_and_chips "
    "foie_gras french_fries french_onion_soup french_toast fried_calamari fried_rice frozen_yogurt "
    "garlic_bread gnocchi greek_salad grilled_cheese_sandwich grilled_salmon guacamole gyoza hamburger "
    "hot_and_sour_soup hot_dog huevos_rancheros hummus ice_cream lasagna lobster_bisque "
    "lobster_roll_sandwich macaroni_and_cheese macarons miso_soup mussels nachos omelette onion_rings "
    "oysters pad_thai paella pancakes panna_cotta peking_duck pho pizza pork_chop poutine prime_rib "
    "pulled_pork_sandwich ramen ravioli red_velvet_cake risotto samosa sashimi scallops seaweed_salad "
    "shrimp_and_grits spaghetti_bolognese spaghetti_carbonara spring_rolls steak strawberry_shortcake "
    "sushi tacos takoyaki tiramisu tuna_tartare waffles"
).split()


#: torchvision's ``Food101._URL`` and ``_MD5`` (0.29; a test holds them equal), as data: the command
#: line lists every unit's files without importing torchvision
FOOD101_ARCHIVE = Archive(
    "http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz", "85eeb15f3717b99a5da872d97d918f87"
)


@register_dataset("food101")
class Food101Unit(DatasetUnit):
    title = "Food-101"
    folder = "food-101"  # where torchvision's Food101 reads it
    list_position = 6
    n_classes = 101

    def load(self, data_root: Path | None, include_train: bool = False) -> ClassificationData:
        """Food-101 test split (101 dishes); ``include_train`` adds the train split."""
        from torchvision.datasets import Food101

        root = require_root(data_root, self.name)
        return torchvision_target(
            self.name,
            self.title,
            root,
            root / self.folder,
            "meta/test.json",
            f"the official food-101.tar.gz into {root}",
            lambda split: Food101(str(root), split=split, download=False),
            train_split="train",
            include_train=include_train,
        )

    def archives(self) -> list[Archive]:
        return [FOOD101_ARCHIVE]

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        return missing_or(
            [
                ((base / "meta" / "test.json").is_file(), "meta/test.json is missing"),
                (count_dirs(base / "images") == 101, "images/ does not hold 101 class folders"),
            ],
            base,
        )

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``food-101/{images/<dish>/*.jpg, meta/{train,test}.json}``."""
        base = root / self.folder
        (base / "meta").mkdir(parents=True, exist_ok=True)
        splits: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
        for dish in FOOD101_CLASSES:
            (base / "images" / dish).mkdir(parents=True, exist_ok=True)
            for split, count, offset in (("train", n_train, 0), ("test", n_test, n_train)):
                names = [f"{dish}/{100000 + i}" for i in range(offset, offset + count)]
                for name in names:
                    random_jpeg(base / "images" / f"{name}.jpg", rng)
                splits[split][dish] = names
        for split, listing in splits.items():
            (base / "meta" / f"{split}.json").write_text(json.dumps(listing))
        (base / "meta" / "classes.txt").write_text("\n".join(FOOD101_CLASSES) + "\n")
        return base
